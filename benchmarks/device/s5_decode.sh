#!/bin/bash
# Branch next/decode-kernels on one H200 (~3 min + start, from a snapshot of the branch: run
# `bash benchmarks/device/snapshot.sh` HERE on the branch first, carry .carry/gz): the CUDA tests of the reworked
# argmax_kernel (float4 body, 8 loads in flight) and the GDN decode step (rows split over 4 warps), the tests that
# pin the step's batch invariance (gdn_rows vs one launch per sequence, bit for bit), then the old-vs-new table of
# benchmarks/bench_decode_kernels.py (old = today's profile: argmax 93.6 us, GDN 7.37 us per layer). Logs into $OUT.
R=$(cd "$(dirname "$0")/../.." && pwd); T=/tmp/clean5d
bash $R/benchmarks/device/unpack.sh $T > $OUT/unpack.log 2>&1 || exit 1
cd $T
export PYTHONPATH=$R/.carry/site:$T PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -m cuda tests/test_kernels_cuda.py -k "argmax or gdn" > $OUT/test_kernels.log 2>&1
echo "test_kernels rc=$?" >> $OUT/progress.log
timeout 240 python3 -m pytest -q -m cuda tests/test_decode_cuda.py tests/test_device_sampling.py > $OUT/test_decode.log 2>&1
echo "test_decode rc=$?" >> $OUT/progress.log
timeout 120 python3 benchmarks/bench_decode_kernels.py --json $OUT/bench_decode.json > $OUT/bench_decode.log 2>&1
echo "bench rc=$?" >> $OUT/progress.log
timeout 60 python3 benchmarks/bench_decode_kernels.py --pdl > $OUT/bench_decode_pdl.log 2>&1
echo "bench pdl rc=$?" >> $OUT/progress.log
tail -n 3 $OUT/test_kernels.log $OUT/test_decode.log; cat $OUT/bench_decode.log
