#!/bin/bash
# Session 5, last call (~5 min + start): branch next/device-facts (one cached compute_90+ answer for PDL, cached device
# facts in the decode-attention launcher). Carry .carry/s5e (snapshot.sh: src.tgz, libcmpkern.so.gz, COMMIT, vocab.pkl.gz;
# sm70.tgz of the same commit) and .carry/site. The CUDA test files on the sm_90 library, then the PDL-sensitive files
# (decode steps with and without PDL, the GEMV kernels) on the compute_70 build, where PDL must stay off. Logs to $OUT.
R=$(cd "$(dirname "$0")/../.." && pwd); K=$R/.carry/s5e; T=/tmp/c5e; L=/tmp/s5e; mkdir -p $L /tmp/sm70
mkdir -p $T && tar xzf $K/src.tgz -C $T && gunzip -c $K/libcmpkern.so.gz > $T/llamacmp/lib/libcmpkern.so
ln -sf $R/llamacmp/data/default.gguf $T/llamacmp/data/default.gguf
mkdir -p /tmp/vocab && gunzip -c $K/vocab.pkl.gz > /tmp/vocab/qwen35_vocab_v1_8dde380a6405e935.pkl
tar xzf $K/sm70.tgz -C /tmp/sm70
cd $T
export PYTHONPATH=$R/.carry/site:$T PYTHONUNBUFFERED=1 LLAMACMP_CACHE=/tmp/vocab
T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $L/progress.log; }
st start $(cat $K/COMMIT)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_attention_cuda.py tests/test_kernels_cuda.py \
    tests/test_decode_cuda.py tests/test_device_sampling.py tests/test_model_cuda.py > $L/tests.log 2>&1
echo rc=$? >> $L/tests.log; st tests
PDL='from llamacmp.backends.cuda import CudaBackend; b = CudaBackend(); b.launch_pdl = True; print("pdl in effect:", b.launch_pdl)'
timeout 30 python3 -c "$PDL" > $L/pdl_sm90.log 2>&1
LLAMACMP_LIB=/tmp/sm70/libcmpkern.so CUDA_CACHE_PATH=/tmp/cuda-jit timeout 60 python3 -c "$PDL" > $L/pdl_sm70.log 2>&1
LLAMACMP_LIB=/tmp/sm70/libcmpkern.so CUDA_CACHE_PATH=/tmp/cuda-jit timeout 120 python3 -m pytest -q -p no:cacheprovider \
    -m cuda tests/test_decode_cuda.py > $L/tests_sm70.log 2>&1
echo rc=$? >> $L/tests_sm70.log; st tests-sm70
tar czf $OUT/s5e.tgz -C /tmp s5e; cat $L/progress.log; tail -n 2 $L/tests.log $L/tests_sm70.log; tail -n 1 $L/pdl_sm90.log $L/pdl_sm70.log
