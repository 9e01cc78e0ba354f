#!/bin/bash
# gemv4 (one H200, ~5 min + start; + ~3 min to write the 9B-shape file when /tmp/m9b.gguf is absent): the v4 GEMV
# (CMP_MM_GEMV4 = v1's warp-per-row loop with v2's bits; CMP_MM_GEMV4_EAGER = the same with all 4 weight loads per
# lane in flight before the first DP4A). Needs a `make CUDA_ARCH=90` library of this tree (built here when nvcc is
# on PATH and none is present; or run it from a snapshot: snapshot.sh here, unpack.sh there).
#   1. CUDA tests of the projections: v4 / v4 eager against numpy_ref and v2 bit for bit, batch invariance T 1..16,
#      PDL in a graph, the backend switch; with the v2/v3 tests around them;
#   2. benchmarks/bench_gemv.py --quick: the 9B decode launch sets at T = 1, v1 / v2 / v3 / v3+PDL / v4 / v4+PDL /
#      v4e+PDL, in graphs (what decides between v4, v4 eager and v3);
#   3. bench_model.py --compare-kernels: pp512 and greedy graph tg128 for old / v2 / v3 / v3+PDL / v4+PDL /
#      v4 eager+PDL on the 9B file.
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD PYTHONUNBUFFERED=1
C=${OUT:-/tmp/gemv4}; mkdir -p "$C"; T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> "$C/progress.log"; }
if [ ! -e llamacmp/lib/libcmpkern.so ] && command -v nvcc > /dev/null; then
    make -j16 CUDA_ARCH=90 > "$C/make.log" 2>&1; st "make rc=$?"
fi
( [ -e /tmp/m9b.gguf ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; \
make_9b('/tmp/m9b.gguf')" > "$C/write.log" 2>&1; touch /tmp/m9b.done ) &
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_kernels_cuda.py \
    -k "gemv4 or gemv_v4 or gemv3 or gemv2_rows or q8_ex or fused_backend" --durations=5 > "$C/tests.log" 2>&1
st "tests rc=$?"
timeout 120 python3 benchmarks/bench_gemv.py --quick --json "$C/gemv.json" > "$C/gemv.log" 2>&1; st "bench_gemv rc=$?"
while [ ! -e /tmp/m9b.done ]; do sleep 2; done; st written
timeout 200 python3 benchmarks/bench_model.py /tmp/m9b.gguf --compare-kernels -p 512 -n 128 -r 1 > "$C/tg.log" 2>&1
st "tg rc=$?"
cat "$C/progress.log"; grep -E "passed|failed|error" "$C/tests.log" | tail -5; grep -B2 -A12 "^FAILED\|Error" "$C/tests.log" | head -40
cat "$C/gemv.log"; cat "$C/tg.log"
