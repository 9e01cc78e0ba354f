#!/bin/bash
# Session 4's last H200 block (~11 min + start; two calls: `setsid nohup bash s4.sh > /dev/null 2>&1 &` then
# `bash collect_s4.sh SECONDS` in each). Runs the snapshot that snapshot.sh packed here (unpack.sh there). Carry
# .carry/gz, .carry/site, .whl/server, .carry/llama.cpp-src.tar.gz. The no-TC stand-in's static llama-bench (built on
# the GPU-less machine by `side_by_side.py --standin --build-only`: an hour on 2 cores there, none of the device's
# time; 37 MB as xz, too big to travel with the rest) comes in a call of its own just before:
#   run(carry=[".carry/standin"], command="bash benchmarks/device/standin_in.sh")
# which unpacks it to /tmp/lcpp/standin-notc/bin (kept while the machine stays warm). Logs in /tmp/s4.
#   CPU: llama.cpp b8462 native (llama-bench, llama-server) built here while the GPU runs 1-4;
#   GPU: 1. CUDA tests of what changed (PDL of the small kernels, tq3 decode, the v4 GEMV default);
#        2. pp512 / tg128 per kernel path, a decode token kernel by kernel (torch.profiler); 3. decode attention per layer at 32K / 128K keys; 4. issue 7 part c;
#        5. side by side vs llama.cpp native and the stand-in; 6. 16 streams vs llama-server on one GPU.
R=$(cd "$(dirname "$0")/../.." && pwd); C=/tmp/s4; T=/tmp/clean; mkdir -p $C $T
bash $R/benchmarks/device/unpack.sh $T > $C/unpack.log 2>&1 || exit 1
mkdir -p $R/.carry/vocab && gunzip -c $R/.carry/gz/vocab.pkl.gz > $R/.carry/vocab/qwen35_vocab_v1_8dde380a6405e935.pkl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $R/.whl/server/*.whl > $C/pip.log 2>&1
# the stand-in built on the other machine runs here (system libraries), or side by side goes on with native only
SI=--standin; /tmp/lcpp/standin-notc/bin/llama-bench --help > $C/standin_help.log 2>&1 || SI=
cd $T
export PYTHONPATH=/tmp/site:$R/.carry/site:$T PYTHONUNBUFFERED=1 LLAMACMP_CACHE=$R/.carry/vocab
T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $C/progress.log; }
st start $(cat $R/.carry/gz/COMMIT) standin=${SI:-failed}
( timeout 600 python3 benchmarks/side_by_side.py --llamacpp-src $R/.carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp \
    --build-only --native-targets llama-bench,llama-server > $C/lcpp_build.log 2>&1; echo rc=$? >> $C/lcpp_build.log
  st lcpp-built; touch $C/lcpp.done ) &
( python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; make_9b('/tmp/m9bv.gguf', '$R/.carry/vocab')" \
    > $C/m9b.log 2>&1; st m9b-written; touch $C/m9b.done ) &
timeout 200 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_decode_cuda.py tests/test_attention_cuda.py \
    tests/test_model_cuda.py tests/test_device_sampling.py tests/test_kernels_cuda.py \
    > $C/tests.log 2>&1; echo rc=$? >> $C/tests.log; st tests
while [ ! -e $C/m9b.done ]; do sleep 1; done
timeout 120 python3 benchmarks/bench_model.py /tmp/m9bv.gguf --compare-kernels -r 1 > $C/tg.log 2>&1; st tg
timeout 60 python3 benchmarks/profile_decode.py /tmp/m9bv.gguf -n 64 --top 40 > $C/profile.log 2>&1; st profile
timeout 45 python3 benchmarks/bench_attention.py --decode-only --n-kv 32768,131072 > $C/attn.log 2>&1; st attn
timeout 60 python3 benchmarks/long_context.py --parts c --m9b /tmp/m9bv.gguf > $C/partc.log 2>&1; st partc
while [ ! -e $C/lcpp.done ]; do sleep 1; done
timeout 300 python3 benchmarks/side_by_side.py --model /tmp/m9bv.gguf --build-dir /tmp/lcpp --prebuilt $SI \
    -p 512,4096,16384 -n 128 -d 32768 -r 2 --out $C/side.md > $C/side.log 2>&1; st side
timeout 120 python3 benchmarks/server_vs_llamacpp.py --model /tmp/m9bv.gguf --llama-server /tmp/lcpp/native/bin/llama-server \
    --np 16 --n-predict 128 --out $C/server_vs.json > $C/server_vs.log 2>&1; st server-vs
st all-done; touch $C/all.done
