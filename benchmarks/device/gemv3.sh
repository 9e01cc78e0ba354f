#!/bin/bash
# gemv3 (one H200, ~10 min + start; most of it writing the 9B-shape file when /tmp/m9b.gguf is absent): issue 3's
# v3 GEMV. Needs a `make CUDA_ARCH=90` library of this tree (built here when nvcc is on PATH and none is present).
#   1. CUDA tests of the projections (v3 against numpy_ref and v2 bit for bit, batch invariance, PDL in a graph) and
#      of the model / graph decode paths that now take v3 by default;
#   2. benchmarks/bench_gemv.py: the 9B decode launch sets, v1 / v2 / v3 / v3+PDL at T = 1, 4, 16, in graphs;
#   3. bench_model.py --compare-kernels: pp512 and greedy graph tg128 for old / v2 / v3 / v3+PDL on the 9B file.
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD PYTHONUNBUFFERED=1
C=${OUT:-/tmp/gemv3}; mkdir -p "$C"; T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> "$C/progress.log"; }
if [ ! -e llamacmp/lib/libcmpkern.so ] && command -v nvcc > /dev/null; then
    make -j16 CUDA_ARCH=90 > "$C/make.log" 2>&1; st "make rc=$?"
fi
( [ -e /tmp/m9b.gguf ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; \
make_9b('/tmp/m9b.gguf')" > "$C/write.log" 2>&1; touch /tmp/m9b.done ) &
timeout 420 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_kernels_cuda.py tests/test_model_cuda.py \
    tests/test_decode_cuda.py --durations=8 > "$C/tests.log" 2>&1; st "tests rc=$?"
timeout 300 python3 benchmarks/bench_gemv.py --json "$C/gemv.json" > "$C/gemv.log" 2>&1; st "bench_gemv rc=$?"
while [ ! -e /tmp/m9b.done ]; do sleep 2; done; st written
timeout 300 python3 benchmarks/bench_model.py /tmp/m9b.gguf --compare-kernels -p 512 -n 128 -r 3 > "$C/tg.log" 2>&1
st "tg rc=$?"
cat "$C/progress.log"; grep -E "passed|failed|error" "$C/tests.log" | tail -5; grep -B2 -A12 "^FAILED\|Error" "$C/tests.log" | head -40
cat "$C/gemv.log"; cat "$C/tg.log"
