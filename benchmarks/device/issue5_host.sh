#!/bin/bash
# Issue 5 (one H200, ~9 min + start): where a 16-stream decode step's time goes after the host-side fixes of
# 2026-11-30 (argmax for ignore_eos rows, one event-loop wakeup a step, batched sampling uploads, cheap RNG marks),
# and the 16-stream comparison with llama-server. Needs what README.md lists (.carry/site, .carry/vocab, .whl/server,
# .carry/llama.cpp-src.tar.gz); builds the library if it is missing. Copy to .carry/chain/ and run from there.
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD PYTHONUNBUFFERED=1 LLAMACMP_CACHE=$PWD/.carry/vocab
C=${OUT:-/tmp/issue5}; mkdir -p $C; T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $C/progress.log; }
python3 -c "import fastapi, uvicorn" 2>/dev/null || pip install -q --no-index --find-links .whl/server --target /tmp/site \
    fastapi uvicorn pydantic starlette > $C/pip.log 2>&1
( timeout 420 python3 benchmarks/side_by_side.py --llamacpp-src .carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp \
    --build-only --native-targets llama-server > $C/lcpp_build.log 2>&1; echo rc=$? >> $C/lcpp_build.log; touch /tmp/i5.built ) &
# the library must have this tree's symbols (cmp_gdn_rows is new): else _native refuses it and the numpy backend runs
nm -D llamacmp/lib/libcmpkern.so 2>/dev/null | grep -q cmp_gdn_rows || make -B CUDA_ARCH=90 -j16 > $C/make.log 2>&1; st lib
[ -e /tmp/m9bv.gguf ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; make_9b('/tmp/m9bv.gguf', '.carry/vocab')" > $C/write.log 2>&1
st written
export CUDA_VISIBLE_DEVICES=0
# the CUDA tests of what changed (sample_rows' batched uploads, the argmax shortcut, decode graphs, engine streams)
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_decode_cuda.py tests/test_device_sampling.py > $C/tests.log 2>&1
st tests
# the one-launch conv / GDN for decode batches (CudaBackend.gdn_rows, off by default until its tests pass): A/B
timeout 240 python3 benchmarks/engine_load.py --model /tmp/m9bv.gguf --streams 16 --n-predict 128 --gdn-rows > $C/engine_load_rows.log 2>&1
st engine_load_rows
# engine alone: ms/step split (forward = graph launch + device wait, host = draw + emit + between steps), 1 and 16
timeout 240 python3 benchmarks/engine_load.py --model /tmp/m9bv.gguf --streams 16 --n-predict 128 > $C/engine_load.log 2>&1
st engine_load
# the same streams through the HTTP server in-process (the event loop's share shows in the engine's step)
timeout 240 python3 benchmarks/engine_load.py --model /tmp/m9bv.gguf --streams 16 --n-predict 128 --http > $C/engine_http.log 2>&1
st engine_http
while [ ! -e /tmp/i5.built ]; do sleep 2; done
timeout 240 python3 benchmarks/server_vs_llamacpp.py --model /tmp/m9bv.gguf --llama-server /tmp/lcpp/native/bin/llama-server \
    --np 16 --n-predict 128 --out $C/server_vs.json > $C/server_vs.log 2>&1; st server_vs
cp /tmp/server-llamacmp.log $C/ 2>/dev/null
cat $C/progress.log; tail -3 $C/tests.log; grep -v "^stream " $C/engine_load.log | tail -16; tail -12 $C/engine_http.log
grep -v "^stream " $C/engine_load_rows.log | tail -8
tail -12 $C/server_vs.log
touch $C/DONE
