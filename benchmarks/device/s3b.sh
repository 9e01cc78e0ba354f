#!/bin/bash
# A 2x H200 block (~11 min; prepared in session 3, not yet run): `bash s3b.sh` runs from the snapshot that
# snapshot.sh packed here (one commit's source + the library built from it; the device copy's git may not hold
# recent commits, and its working tree holds others' unfinished edits). Carry .carry/gz, .carry/site, .whl/server,
# .carry/llama.cpp-src.tar.gz. In the background (setsid) across warm calls; logs in /tmp/s3b, packed by collect_s3b.sh.
#   CPU:   llama.cpp b8462 native + no-tensor-core stand-in (llama-bench, llama-server); 9B and 27B files.
#   GPU 1: the CUDA tests of the kernels, model, decode and checkpoints, the GEMV table,
#          then 16 streams vs llama-server.
#   GPU 0: side by side (llamacmp-bench vs both llama.cpp builds) on the 9B file, v1/v2/v3 kernel comparison.
#   both:  the 27B-shape layer split with llama.cpp -sm none / layer.
R=$(cd "$(dirname "$0")/../.." && pwd); C=/tmp/s3b; T=/tmp/clean; mkdir -p $C $T
bash $R/benchmarks/device/unpack.sh $T || exit 1
mkdir -p $R/.carry/vocab && gunzip -c $R/.carry/gz/vocab.pkl.gz > $R/.carry/vocab/qwen35_vocab_v1_8dde380a6405e935.pkl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $R/.whl/server/*.whl > $C/pip.log 2>&1    # fastapi/uvicorn for the servers (the 14:18 run lacked this line)
cd $T
export PYTHONPATH=/tmp/site:$R/.carry/site:$T PYTHONUNBUFFERED=1 LLAMACMP_CACHE=$R/.carry/vocab
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
stage() { echo "$(date +%T) $*" >> $C/progress.log; }
waitfor() { while [ ! -e "$1" ]; do sleep 2; done; }
stage start $(cat $R/.carry/gz/COMMIT); nvidia-smi -L >> $C/progress.log 2>&1; nproc >> $C/progress.log
( timeout 480 python3 benchmarks/side_by_side.py --llamacpp-src $R/.carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp --standin \
    --build-only --native-targets llama-bench,llama-server > $C/lcpp_build.log 2>&1; echo rc=$? >> $C/lcpp_build.log
  stage lcpp-built; touch $C/lcpp.done ) &
( python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; make_9b('/tmp/m9bv.gguf', '$R/.carry/vocab')" \
    > $C/m9b.log 2>&1; stage m9b-written; touch $C/m9b.done
  python3 -c "import sys, time; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; t = time.time(); \
make_9b('/tmp/m27b.gguf', '$R/.carry/vocab', '27b'); print('27b written s', time.time() - t)" > $C/m27b.log 2>&1
  stage m27b-written; touch $C/m27b.done ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_kernels_cuda.py tests/test_model_cuda.py \
      tests/test_decode_cuda.py tests/test_checkpoints_cuda.py > $C/tests.log 2>&1; stage tests
  timeout 150 python3 benchmarks/bench_gemv.py --quick --json $C/gemv.json > $C/gemv.log 2>&1; stage gemv
  waitfor $C/m9b.done; waitfor $C/lcpp.done
  timeout 240 python3 benchmarks/server_vs_llamacpp.py --model /tmp/m9bv.gguf --llama-server /tmp/lcpp/native/bin/llama-server \
      --np 16 --n-predict 128 --out $C/server_vs.json > $C/server_vs.log 2>&1; stage server-vs; touch $C/gpu1.done ) &
( export CUDA_VISIBLE_DEVICES=0; waitfor $C/m9b.done
  timeout 200 python3 benchmarks/bench_model.py /tmp/m9bv.gguf --compare-kernels > $C/compare.log 2>&1; stage compare
  waitfor $C/lcpp.done
  timeout 330 python3 benchmarks/side_by_side.py --model /tmp/m9bv.gguf --llamacpp-src $R/.carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp \
      --standin --native-targets llama-bench,llama-server -p 512,4096,16384 -n 128 -d 32768 -r 2 --out $C/side.md > $C/side.log 2>&1
  stage side; touch $C/gpu0.done ) &
waitfor $C/gpu0.done; waitfor $C/gpu1.done; waitfor $C/m27b.done
stage multi
timeout 420 python3 benchmarks/multi_gpu.py --model /tmp/m27b.gguf --llama-bench /tmp/lcpp/native/bin/llama-bench --devices 0,1 \
    -p 8192 -n 64 -r 1 --out $C/multi27.md > $C/multi27.log 2>&1
stage all-done; touch $C/all.done
