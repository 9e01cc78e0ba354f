#!/bin/bash
# Orchestrator for this session's GPU work: runs in the background (setsid) across several warm `run` calls.
# Logs + markers in /tmp/chain; collect.sh tars them into $OUT.
cd "$(dirname "$0")/../.."
C=/tmp/chain; mkdir -p $C
export PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
stage() { echo "$(date +%T) $*" >> $C/progress.log; }
waitfor() { while [ ! -e "$1" ]; do sleep 2; done; }
stage start; nvidia-smi -L >> $C/progress.log 2>&1; nproc >> $C/progress.log
# A: llama.cpp builds (native + stand-in) and the 9B-shape file, in the background
( python3 benchmarks/side_by_side.py --llamacpp-src .carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp --standin \
    --build-only --native-targets llama-bench,llama-server,llama-mtmd-cli > $C/lcpp_build.log 2>&1; echo rc=$? >> $C/lcpp_build.log; touch $C/lcpp.done ) &
( python3 -c "import sys; sys.path.insert(0,'benchmarks'); import time; t=time.time(); from bench_model import make_9b; make_9b('/tmp/m9b.gguf'); print('make_9b s', time.time()-t)" > $C/m9b.log 2>&1; touch $C/m9b.done ) &
# 1: every cuda-marked test (both GPUs visible: split tests use device 1); sm_70 PTX build on GPU 1 at the same time
( CUDA_VISIBLE_DEVICES=1 LLAMACMP_LIB=$PWD/build/sm70/libcmpkern.so timeout 420 python3 -m pytest -q -p no:cacheprovider -m cuda \
    tests/test_kernels_cuda.py tests/test_model_cuda.py tests/test_attention_cuda.py tests/test_decode_cuda.py tests/test_vision_cuda.py \
    > $C/tests_sm70.log 2>&1; touch $C/sm70.done ) &
stage tests; timeout 480 python3 -m pytest -q -p no:cacheprovider -m cuda --durations=12 tests/ > $C/tests.log 2>&1; stage tests-done
# 2: the 5-minute load test on GPU 1 once the 9B file exists and the sm_70 tests are done
waitfor $C/m9b.done; waitfor $C/sm70.done
( CUDA_VISIBLE_DEVICES=1 python3 benchmarks/server_stress.py --model /tmp/m9b.gguf --np 32 --threads 36 --seconds 300 --other 0 \
    > $C/load_test.log 2>&1; echo rc=$? >> $C/load_test.log; cp /tmp/server-stress.log $C/load_server.log 2>/dev/null; touch $C/load.done ) &
export CUDA_VISIBLE_DEVICES=0
stage long_context; python3 benchmarks/long_context.py --trained llamacmp/data/default.gguf --heldout .carry/chain/heldout.txt \
    --m9b /tmp/m9b.gguf --json $C/long_context.json > $C/long_context.log 2>&1
stage side; waitfor $C/lcpp.done
python3 benchmarks/side_by_side.py --model /tmp/m9b.gguf --llamacpp-src .carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp --standin \
    --native-targets llama-bench,llama-server,llama-mtmd-cli -p 512,4096,16384 -n 128 -d 32768 -r 2 --out $C/side.md > $C/side.log 2>&1
stage server_vs; python3 benchmarks/server_vs_llamacpp.py --model /tmp/m9b.gguf --llama-server /tmp/lcpp/native/bin/llama-server \
    --np 16 --n-predict 128 --out $C/server_vs.json > $C/server_vs.log 2>&1
stage vision; python3 benchmarks/bench_vision.py --sizes 448 1024 --reps 5 --full --workdir /tmp/bv --lcpp-bin /tmp/lcpp/native/bin \
    --json $C/vision.json > $C/vision.log 2>&1
stage kernels; python3 benchmarks/bench_kernels.py --quick --matmul-only > $C/kernels.log 2>&1
python3 benchmarks/bench_kernels.py --attention-only --json $C/attention.json >> $C/kernels.log 2>&1
unset CUDA_VISIBLE_DEVICES
stage multi; waitfor $C/load.done
python3 benchmarks/multi_gpu.py --model /tmp/m9b.gguf --llama-bench /tmp/lcpp/native/bin/llama-bench --devices 0,1 -p 8192 -n 64 -r 1 \
    --out $C/multi.md > $C/multi.log 2>&1
stage all-done; touch $C/all.done
