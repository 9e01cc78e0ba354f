#!/bin/bash
# Session 5, second H200 block, call 1 (~5 min + start). Carry .carry/s5b (snapshot.sh of branch next/tq3-pairs:
# src.tgz, libcmpkern.so.gz, COMMIT; libbefore.so.gz = the library of main before it (f40b8a5); vocab.pkl.gz;
# sm70.tgz = tools/build_sm70.sh's libcmpkern.so + libcudart.so.12) and .carry/site. Logs into $OUT.
#   1. the CUDA test files on the new library (the tq3 pair table in the decode attention);
#   2. decode attention per layer at 32768 / 131072 keys, before vs after (bench_attention.py: caches hold encoded
#      Gaussian rows), interleaved before/after/before/after;
#   3. issue 7 part c (whole token at 131072, f16 vs tq3), before and after, nothing else running.
# Call 2 of the block: `bash benchmarks/device/s5b_sm70.sh` (the suite on the compute_70 PTX build).
R=$(cd "$(dirname "$0")/../.." && pwd); K=$R/.carry/s5b; T=/tmp/c5b; L=/tmp/s5b; mkdir -p $L
mkdir -p $T && tar xzf $K/src.tgz -C $T && gunzip -c $K/libcmpkern.so.gz > $T/llamacmp/lib/libcmpkern.so
ln -sf $R/llamacmp/data/default.gguf $T/llamacmp/data/default.gguf
gunzip -c $K/libbefore.so.gz > /tmp/libbefore.so
mkdir -p /tmp/vocab && gunzip -c $K/vocab.pkl.gz > /tmp/vocab/qwen35_vocab_v1_8dde380a6405e935.pkl
cd $T
export PYTHONPATH=$R/.carry/site:$T PYTHONUNBUFFERED=1 LLAMACMP_CACHE=/tmp/vocab
NEW=$T/llamacmp/lib/libcmpkern.so
T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $L/progress.log; }
st start $(cat $K/COMMIT)
( [ -e /tmp/m9bv.gguf ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; \
make_9b('/tmp/m9bv.gguf', '/tmp/vocab')" > $L/m9b.log 2>&1; touch /tmp/m9b5b.done ) &
timeout 200 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_attention_cuda.py tests/test_kernels_cuda.py \
    tests/test_decode_cuda.py tests/test_device_sampling.py tests/test_model_cuda.py > $L/tests.log 2>&1
echo rc=$? >> $L/tests.log; st tests
for i in 1 2; do for lib in /tmp/libbefore.so $NEW; do
  LLAMACMP_LIB=$lib timeout 60 python3 benchmarks/bench_attention.py --decode-only --n-kv 32768,131072 \
      > $L/attn_$(basename $lib .so)_$i.log 2>&1
done; done; st attn
while [ ! -e /tmp/m9b5b.done ]; do sleep 1; done; st m9b
for lib in /tmp/libbefore.so $NEW; do
  LLAMACMP_LIB=$lib timeout 80 python3 benchmarks/long_context.py --parts c --m9b /tmp/m9bv.gguf --n-gen 256 \
      > $L/partc_$(basename $lib .so).log 2>&1
done; st partc
tar czf $OUT/s5b.tgz -C /tmp s5b; cat $L/progress.log; tail -n 2 $L/tests.log; grep -h "time vs f16" $L/attn_*.log
grep -h "^| " $L/partc_*.log
