#!/bin/bash
# c5 (one H200, ~7 min + start): re-measure after the 2026-11-30 fixes: 9B file with the REAL vocabulary (llama.cpp
# loads it), server_vs with exact token counts, and the rebuilt no-tensor-core stand-in (SASS-checked at build).
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD PYTHONUNBUFFERED=1 LLAMACMP_CACHE=$PWD/.carry/vocab
C=$OUT; T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $C/progress.log; }
( timeout 420 python3 benchmarks/side_by_side.py --llamacpp-src .carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp --standin \
    --build-only --native-targets llama-bench,llama-server > $C/build.log 2>&1; echo rc=$? >> $C/build.log; st built; touch /tmp/c5.built ) &
[ -e /tmp/m9bv.gguf ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; make_9b('/tmp/m9bv.gguf', '.carry/vocab')" > $C/write.log 2>&1
st written; while [ ! -e /tmp/c5.built ]; do sleep 2; done
export CUDA_VISIBLE_DEVICES=0
timeout 200 python3 benchmarks/server_vs_llamacpp.py --model /tmp/m9bv.gguf --llama-server /tmp/lcpp/native/bin/llama-server \
    --np 16 --n-predict 128 --out $C/server_vs.json > $C/server_vs.log 2>&1; st server_vs
timeout 100 python3 benchmarks/server_vs_llamacpp.py --model /tmp/m9bv.gguf --only llamacmp --utf8-bias both --np 16 \
    --n-predict 128 > $C/server_vs_llamacmp_biased.log 2>&1; st server_vs-biased
timeout 300 python3 benchmarks/side_by_side.py --model /tmp/m9bv.gguf --llamacpp-src .carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp \
    --standin --native-targets llama-bench,llama-server -p 512,4096,16384 -n 128 -d 32768 -r 2 --out $C/side.md > $C/side.log 2>&1; st side
if command -v nsys > /dev/null; then   # runtime proof of the kernels the stand-in launches at prefill (best effort)
  timeout 90 nsys profile -t cuda -o /tmp/c5sp --force-overwrite true /tmp/lcpp/standin-notc/bin/llama-bench -m /tmp/m9bv.gguf \
      -p 4096 -n 0 -r 1 -ngl 99 -fa 1 > /dev/null 2>&1 && nsys stats -q -r cuda_gpu_kern_sum /tmp/c5sp.nsys-rep 2>/dev/null | head -25 > $C/standin_kernels.txt
  st nsys
fi
cat $C/progress.log; grep -h "no-TC\|rc=\|Error\|error" $C/build.log | tail -4; cat $C/side.md; tail -9 $C/server_vs.log
tail -3 $C/server_vs_llamacmp_biased.log; head -25 $C/standin_kernels.txt 2>/dev/null
