#!/bin/bash
# Session 5, first H200 call (~7 min + start). Carry .carry/s5 (made here by `snapshot.sh` on the merged branch
# next/decode-kernels: src.tgz, libcmpkern.so.gz, COMMIT; plus libmain.so.gz = main's library, vocab.pkl.gz) and
# .carry/site. Logs into $OUT (one tarball).
#   1. the CUDA test files on the merged library (float4 argmax, row-split GDN decode step, everything else);
#   2. bench_decode_kernels.py (the two kernels alone);
#   3. tg128 A/B on the 9B-shape Q8_0 file, main's library vs the merged one, same process order, 3 reps each;
#   4. ncu (hardware counters, clocks left alone) of one f16 and one tq3 decode-attention launch at 131072 keys.
R=$(cd "$(dirname "$0")/../.." && pwd); K=$R/.carry/s5; T=/tmp/c5; L=/tmp/s5a; mkdir -p $L
mkdir -p $T && tar xzf $K/src.tgz -C $T && gunzip -c $K/libcmpkern.so.gz > $T/llamacmp/lib/libcmpkern.so
ln -sf $R/llamacmp/data/default.gguf $T/llamacmp/data/default.gguf
gunzip -c $K/libmain.so.gz > /tmp/libmain.so
mkdir -p /tmp/vocab && gunzip -c $K/vocab.pkl.gz > /tmp/vocab/qwen35_vocab_v1_8dde380a6405e935.pkl
cd $T
export PYTHONPATH=$R/.carry/site:$T PYTHONUNBUFFERED=1 LLAMACMP_CACHE=/tmp/vocab
T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $L/progress.log; }
st start $(cat $K/COMMIT)
( [ -e /tmp/m9bv.gguf ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; \
make_9b('/tmp/m9bv.gguf', '/tmp/vocab')" > $L/m9b.log 2>&1; touch /tmp/m9b5.done ) &
timeout 240 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_kernels_cuda.py tests/test_decode_cuda.py \
    tests/test_device_sampling.py tests/test_attention_cuda.py tests/test_model_cuda.py > $L/tests.log 2>&1
echo rc=$? >> $L/tests.log; st tests
timeout 60 python3 benchmarks/bench_decode_kernels.py --json $L/bench_decode.json > $L/bench_decode.log 2>&1; st bench
while [ ! -e /tmp/m9b5.done ]; do sleep 1; done; st m9b
for i in 1 2; do for lib in /tmp/libmain.so $T/llamacmp/lib/libcmpkern.so; do
  LLAMACMP_LIB=$lib timeout 60 python3 -m llamacmp.cli.bench -m /tmp/m9bv.gguf -p 0 -n 128 -r 3 -o json \
      > $L/tg_$(basename $lib .so)_$i.json 2>> $L/tg.err
done; done; st tg
timeout 40 python3 benchmarks/profile_decode.py /tmp/m9bv.gguf -n 64 --top 40 > $L/profile.log 2>&1; st profile
cat > /tmp/ncu_one.py <<'EOF'
import sys; sys.path.insert(0, "benchmarks")
import bench_attention as ba
from llamacmp.backends.cuda import CudaBackend
be = CudaBackend()
for kt, vt in (("f16", "f16"), ("tq3", "tq3")):
    print(kt, vt, ba.bench_case(be, 131072, 1, kt, vt, True, 1))
EOF
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 150 $NCU --clock-control none -k regex:attn_decode_kernel -s 2 -c 5 --set full --import-source yes \
    -o $L/decode python3 /tmp/ncu_one.py > $L/ncu.log 2>&1; st ncu rc=$?
timeout 60 $NCU -i $L/decode.ncu-rep --page details > $L/ncu_details.txt 2>&1
timeout 60 $NCU -i $L/decode.ncu-rep --page source --print-source sass --csv > $L/ncu_source.csv 2>&1; st ncu-pages
ls -la $L >> $L/progress.log
tar czf $OUT/s5a.tgz -C /tmp s5a; cat $L/progress.log; tail -n 3 $L/tests.log
