#!/bin/bash
# Session 5, third H200 block (~7 min + start). Carry .carry/s5c (snapshot.sh of branch next/kv-stage-tried: src.tgz,
# libcmpkern.so.gz, COMMIT; libbefore.so.gz = main's library with the tq3 pair table (26d86e9); vocab.pkl.gz;
# sm70.tgz = tools/build_sm70.sh's libcmpkern.so + libcudart.so.12 of the same commit) and .carry/site. Logs to $OUT.
#   1. the CUDA test files on the new library (quantized K/V tiles staged in shared memory by cp.async);
#   2. decode attention per layer at 32768 / 131072 keys, before vs after (bench_attention.py: caches hold encoded
#      Gaussian rows), interleaved before/after/before/after;
#   3. issue 7 part c (whole token at 131072, f16 vs tq3), before and after, nothing else running.
#   4. ncu of one tq3 decode-attention launch at 131072 keys; 5. the suite on the compute_70 PTX build (no staging).
R=$(cd "$(dirname "$0")/../.." && pwd); K=$R/.carry/s5c; T=/tmp/c5c; L=/tmp/s5c; mkdir -p $L
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
make_9b('/tmp/m9bv.gguf', '/tmp/vocab')" > $L/m9b.log 2>&1; touch /tmp/m9b5c.done ) &
timeout 200 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_attention_cuda.py tests/test_kernels_cuda.py \
    tests/test_decode_cuda.py tests/test_device_sampling.py tests/test_model_cuda.py > $L/tests.log 2>&1
echo rc=$? >> $L/tests.log; st tests
for i in 1 2; do for lib in /tmp/libbefore.so $NEW; do
  LLAMACMP_LIB=$lib timeout 60 python3 benchmarks/bench_attention.py --decode-only --n-kv 32768,131072 \
      > $L/attn_$(basename $lib .so)_$i.log 2>&1
done; done; st attn
while [ ! -e /tmp/m9b5c.done ]; do sleep 1; done; st m9b
for lib in /tmp/libbefore.so $NEW; do
  LLAMACMP_LIB=$lib timeout 80 python3 benchmarks/long_context.py --parts c --m9b /tmp/m9bv.gguf --n-gen 256 \
      > $L/partc_$(basename $lib .so).log 2>&1
done; st partc
cat > /tmp/ncu_tq3.py <<'PY'
import sys; sys.path.insert(0, "benchmarks")
import bench_attention as ba
from llamacmp.backends.cuda import CudaBackend
print(ba.bench_case(CudaBackend(), 131072, 1, "tq3", "tq3", True, 1))
PY
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 90 $NCU --clock-control none -k regex:attn_decode_kernel -s 2 -c 1 --set full -o $L/tq3 python3 /tmp/ncu_tq3.py \
    > $L/ncu.log 2>&1; timeout 40 $NCU -i $L/tq3.ncu-rep --page details > $L/ncu_details.txt 2>&1; rm -f $L/tq3.ncu-rep
st ncu
mkdir -p /tmp/sm70 && tar xzf $K/sm70.tgz -C /tmp/sm70
LLAMACMP_LIB=/tmp/sm70/libcmpkern.so CUDA_CACHE_PATH=/tmp/cuda-jit CUDA_CACHE_MAXSIZE=4294967296 timeout 200 \
    python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_kernels_cuda.py tests/test_model_cuda.py \
    tests/test_decode_cuda.py tests/test_attention_cuda.py tests/test_device_sampling.py > $L/tests_sm70.log 2>&1
echo rc=$? >> $L/tests_sm70.log; st tests-sm70
tar czf $OUT/s5c.tgz -C /tmp s5c; cat $L/progress.log; tail -n 2 $L/tests.log $L/tests_sm70.log; grep -h "time vs f16" $L/attn_*.log
grep -h "^| " $L/partc_*.log
