#!/bin/bash
# Session 3 orchestrator (nvidia-h200-x2, ~19 min): runs in the background (setsid) across warm `run` calls;
# logs and markers in /tmp/s3, packed by collect_s3.sh.
#   GPU 0: retrain the demo model (fla kernel, retrieval curriculum), its f16 retrieval curve, then issue 7's
#          quality parts (a: perplexity per KV type, b: retrieval per KV type and sparse) on the new model.
#   GPU 1: llama.cpp b8462 native + corrected no-tensor-core stand-in, side by side on the real-vocabulary 9B
#          file, 16 streams vs llama-server, the device sparse-selection test and part d (sparse prefill timing).
#   both:  the 27B-shape layer split (file written on the CPU meanwhile) with llama.cpp -sm none / layer.
cd "$(dirname "$0")/../.."
C=/tmp/s3; mkdir -p $C
export PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD PYTHONUNBUFFERED=1 LLAMACMP_CACHE=$PWD/.carry/vocab
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
stage() { echo "$(date +%T) $*" >> $C/progress.log; }
waitfor() { while [ ! -e "$1" ]; do sleep 2; done; }
stage start; nvidia-smi -L >> $C/progress.log 2>&1; nproc >> $C/progress.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/fla/fla_core-0.6.0-py3-none-any.whl >> $C/progress.log 2>&1

# CPU, background: llama.cpp builds, the 9B file, then the 27B file
( timeout 480 python3 benchmarks/side_by_side.py --llamacpp-src .carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp --standin \
    --build-only --native-targets llama-bench,llama-server > $C/lcpp_build.log 2>&1; echo rc=$? >> $C/lcpp_build.log
  stage lcpp-built; touch $C/lcpp.done ) &
( python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; make_9b('/tmp/m9bv.gguf', '.carry/vocab')" \
    > $C/m9b.log 2>&1; stage m9b-written; touch $C/m9b.done
  python3 -c "import sys, time; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; t = time.time(); \
make_9b('/tmp/m27b.gguf', '.carry/vocab', '27b'); print('27b written s', time.time() - t)" > $C/m27b.log 2>&1
  stage m27b-written; touch $C/m27b.done ) &

# GPU 0: training track
( export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_training_export.py -k fla_kernel_trains > $C/fla_test.log 2>&1
  echo rc=$? >> $C/fla_test.log; stage fla-test
  K=fla; grep -q "rc=0" $C/fla_test.log || K=torch
  timeout 720 python3 -m training.train --preset full --run full2 --out out/full2 --max-minutes 7 --eval-every 500 \
      --gdn-kernel $K --export > $C/train_stdout.log 2>&1; echo rc=$? >> $C/train_stdout.log
  cp training/logs/full2.log $C/ 2>/dev/null; stage trained-$K
  timeout 200 python3 benchmarks/retrieval.py -m out/full2/full2-q8_0.gguf --lengths 4096,8192,16384,32768,65536 --docs 50 \
      --max-seconds 150 -ctk f16 -ctv f16 --json $C/retrieval_f16.json > $C/retrieval.log 2>&1
  python3 benchmarks/plot_retrieval.py $C/retrieval_f16.json -o $C/retrieval_f16.png >> $C/retrieval.log 2>&1; stage retrieval
  timeout 300 python3 benchmarks/long_context.py --parts a,b --trained out/full2/full2-q8_0.gguf --heldout out/full2/heldout.txt \
      --json $C/long_ab.json > $C/long_ab.log 2>&1; stage long-ab; touch $C/gpu0.done ) &

# GPU 1: llama.cpp comparisons, sparse
( export CUDA_VISIBLE_DEVICES=1
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_sparse_cuda.py > $C/sparse_test.log 2>&1; stage sparse-test
  waitfor $C/m9b.done; waitfor $C/lcpp.done
  timeout 300 python3 benchmarks/side_by_side.py --model /tmp/m9bv.gguf --llamacpp-src .carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp \
      --standin --native-targets llama-bench,llama-server -p 512,4096,16384 -n 128 -d 32768 -r 2 --out $C/side.md > $C/side.log 2>&1
  stage side
  timeout 200 python3 benchmarks/server_vs_llamacpp.py --model /tmp/m9bv.gguf --llama-server /tmp/lcpp/native/bin/llama-server \
      --np 16 --n-predict 128 --out $C/server_vs.json > $C/server_vs.log 2>&1; stage server-vs
  timeout 200 python3 benchmarks/long_context.py --parts d --m9b /tmp/m9bv.gguf --json $C/long_d.json > $C/long_d.log 2>&1
  stage long-d; touch $C/gpu1.done ) &

waitfor $C/gpu0.done; waitfor $C/gpu1.done; waitfor $C/m27b.done
stage multi
timeout 420 python3 benchmarks/multi_gpu.py --model /tmp/m27b.gguf --llama-bench /tmp/lcpp/native/bin/llama-bench --devices 0,1 \
    -p 8192 -n 64 -r 1 --out $C/multi27.md > $C/multi27.log 2>&1
stage all-done; touch $C/all.done
