#!/bin/bash
# Session 5, second H200 block, call 2 (~4 min): issue 3's "same with the compute_70 build" — the CUDA test files on
# tools/build_sm70.sh's library (sm_70 SASS + compute_70 PTX, clang 19 over CUDA 12.9; the H200's driver
# JIT-compiles the PTX), from the same snapshot as s5b.sh (run that first: it unpacks /tmp/c5b). Logs into $OUT.
R=$(cd "$(dirname "$0")/../.." && pwd); K=$R/.carry/s5b; T=/tmp/c5b; L=/tmp/s5b70; mkdir -p $L /tmp/sm70
[ -d $T ] || { echo "run s5b.sh first"; exit 1; }
tar xzf $K/sm70.tgz -C /tmp/sm70
cd $T
export PYTHONPATH=$R/.carry/site:$T PYTHONUNBUFFERED=1 LLAMACMP_CACHE=/tmp/vocab
export LLAMACMP_LIB=/tmp/sm70/libcmpkern.so CUDA_CACHE_PATH=/tmp/cuda-jit CUDA_CACHE_MAXSIZE=4294967296
T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $L/progress.log; }
st start $(cat $K/COMMIT) sm70
python3 -c "from llamacmp.lib import _native; print(_native.library_path() if hasattr(_native, 'library_path') else '')" \
    > $L/which.log 2>&1
timeout 500 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_kernels_cuda.py tests/test_model_cuda.py \
    tests/test_decode_cuda.py tests/test_attention_cuda.py tests/test_device_sampling.py > $L/tests_sm70.log 2>&1
echo rc=$? >> $L/tests_sm70.log; st tests-sm70
tar czf $OUT/s5b70.tgz -C /tmp s5b70; cat $L/progress.log; tail -n 3 $L/tests_sm70.log
