#!/bin/bash
# The block-quantized weight formats on one H200 (issue 18), in two warm calls from one carry folder K
# (default .carry/fin), which holds: src.tgz (`git archive` of the commit under test), COMMIT, vocab.pkl.gz (the real
# vocabulary pickle) and optionally sm70.tgz (tools/build_sm70.sh's build/sm70: libcmpkern.so + libcudart.so.12).
# Also carry .carry/llama.cpp-src.tar.gz (the compat tree, b8462) and .whl (gguf, pyyaml, tqdm wheels).
#   bash benchmarks/device/quant_block.sh prep [K]    unpack + `make CUDA_ARCH=90`; in the background (setsid, so it
#        outlives the call): llama.cpp native llama-bench + llama-quantize (side_by_side.py --build-only), then the 9B
#        files (quant_files.sh: Q4_K_M Q6_K IQ4_XS Q8_0 from the writer's random F16 9B); in the foreground the CUDA
#        test files on sm_90 and the block-quantized tests on the compute_70 PTX build (driver JIT)
#   bash benchmarks/device/quant_block.sh bench [K]   waits for the files, then side_by_side.py (llamacmp-bench vs
#        llama-bench native, same run) on each
# Logs and tables go to $OUT.
R=$(cd "$(dirname "$0")/../.." && pwd); K=$R/${2:-.carry/fin}; W=/tmp/fin; L=/tmp/fin_log; mkdir -p $L
export PYTHONPATH=/tmp/site:$W PYTHONUNBUFFERED=1 LLAMACMP_CACHE=/tmp/vocab QF=/tmp/qf
T0=$(date +%s); st() { echo "$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a $L/progress.log; }
TYPES=${TYPES:-Q4_K_M Q6_K IQ4_XS Q8_0}

prep() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site $R/.whl/*.whl > $L/pip.log 2>&1
  mkdir -p $W /tmp/vocab && tar xzf $K/src.tgz -C $W
  gunzip -c $K/vocab.pkl.gz > /tmp/vocab/qwen35_vocab_v1_8dde380a6405e935.pkl
  (cd $W && make CUDA_ARCH=90 -j16 > $L/make.log 2>&1); st "lib built rc=$? $(cat $K/COMMIT)"
  setsid nohup bash -c "cd $W && python3 benchmarks/side_by_side.py --llamacpp-src $R/.carry/llama.cpp-src.tar.gz \
      --build-dir /tmp/lcpp --build-only --native-targets llama-bench,llama-quantize > $L/lcpp_build.log 2>&1; \
      echo rc=\$? >> $L/lcpp_build.log; touch /tmp/lcpp.done; \
      LLAMA_QUANTIZE=/tmp/lcpp/native/bin/llama-quantize bash benchmarks/device/quant_files.sh 9b $TYPES \
      > $L/files.log 2>&1; touch /tmp/files.done" > /dev/null 2>&1 &
  cd $W
  if [ -e $K/sm70.tgz ]; then
    mkdir -p /tmp/sm70 && tar xzf $K/sm70.tgz -C /tmp/sm70
    LLAMACMP_LIB=/tmp/sm70/libcmpkern.so CUDA_CACHE_PATH=/tmp/cuda-jit CUDA_CACHE_MAXSIZE=4294967296 timeout 400 \
        python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_quant_cuda.py tests/test_quant_fixtures.py \
        > $L/tests_sm70.log 2>&1 &
  fi
  timeout 380 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_quant_cuda.py tests/test_quant_fixtures.py \
      tests/test_no_tensor_cores.py tests/test_kernels_cuda.py tests/test_decode_cuda.py tests/test_model_cuda.py \
      tests/test_attention_cuda.py tests/test_device_sampling.py > $L/tests.log 2>&1
  echo rc=$? >> $L/tests.log; st tests; wait; echo rc=$? >> $L/tests_sm70.log 2>/dev/null; st tests-sm70
  tail -n 3 $L/tests.log $L/tests_sm70.log 2>/dev/null; cat $L/progress.log; cat $QF/progress.log 2>/dev/null
}

bench() {
  cd $W
  while [ ! -e /tmp/files.done ]; do sleep 2; done; st "files: $(ls $QF/*.gguf | xargs -n1 basename | tr '\n' ' ')"
  for t in $TYPES; do
    [ -e $QF/m9b-$t.gguf ] || continue
    timeout 150 python3 benchmarks/side_by_side.py --model $QF/m9b-$t.gguf --build-dir /tmp/lcpp --prebuilt \
        -p 512,4096 -n 128 -r 2 --out $L/side_$t.md > $L/side_$t.log 2>&1; st "side $t rc=$?"
  done
  for t in $TYPES; do echo "== $t"; tail -n 5 $L/side_$t.md 2>/dev/null || tail -n 5 $L/side_$t.log; done
}

case "$1" in
  prep) prep ;;
  bench) bench ;;
  *) echo "usage: quant_block.sh prep|bench [CARRY]" >&2; exit 2 ;;
esac
tar czf $OUT/fin_$1.tgz -C /tmp fin_log qf/progress.log 2>/dev/null
