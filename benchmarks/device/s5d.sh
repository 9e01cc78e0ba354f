#!/bin/bash
# Session 5's last H200 block (~7 min + start), on main as sent (its cuda_src is 5bdd304's: carry .carry/s5d with that
# library + vocab.pkl.gz, .carry/site and .carry/llama.cpp-src.tar.gz; the no-TC stand-in comes first in a call of
# its own: `bash benchmarks/device/standin_in.sh` carrying .carry/standin). Logs into $OUT.
#   CPU: llama.cpp b8462 native llama-bench built here while the GPU runs the tests;
#   GPU: 1. the CUDA test files; 2. side by side vs llama.cpp native and the stand-in (pp512/4096/16384, tg128,
#        tg128 at depth 32768), the argmax / GDN decode kernels and the tq3 pair table in.
R=$(cd "$(dirname "$0")/../.." && pwd); K=$R/.carry/s5d; L=/tmp/s5d; mkdir -p $L
gunzip -c $K/libcmpkern.so.gz > $R/llamacmp/lib/libcmpkern.so
mkdir -p /tmp/vocab && gunzip -c $K/vocab.pkl.gz > /tmp/vocab/qwen35_vocab_v1_8dde380a6405e935.pkl
SI=--standin; /tmp/lcpp/standin-notc/bin/llama-bench --help > $L/standin_help.log 2>&1 || SI=
cd $R
export PYTHONPATH=$R/.carry/site:$R PYTHONUNBUFFERED=1 LLAMACMP_CACHE=/tmp/vocab
T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $L/progress.log; }
st start "$(cat $K/COMMIT) tree $(git rev-parse --short HEAD 2>/dev/null)" standin=${SI:-failed}
( timeout 420 python3 benchmarks/side_by_side.py --llamacpp-src $R/.carry/llama.cpp-src.tar.gz --build-dir /tmp/lcpp \
    --build-only --native-targets llama-bench > $L/lcpp_build.log 2>&1; echo rc=$? >> $L/lcpp_build.log
  st lcpp-built; touch $L/lcpp.done ) &
( [ -e /tmp/m9bv.gguf ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; \
make_9b('/tmp/m9bv.gguf', '/tmp/vocab')" > $L/m9b.log 2>&1; st m9b; touch $L/m9b.done ) &
timeout 240 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_attention_cuda.py tests/test_kernels_cuda.py \
    tests/test_decode_cuda.py tests/test_device_sampling.py tests/test_model_cuda.py > $L/tests.log 2>&1
echo rc=$? >> $L/tests.log; st tests
while [ ! -e $L/m9b.done ] || [ ! -e $L/lcpp.done ]; do sleep 1; done
timeout 330 python3 benchmarks/side_by_side.py --model /tmp/m9bv.gguf --build-dir /tmp/lcpp --prebuilt $SI \
    -p 512,4096,16384 -n 128 -d 32768 -r 2 --out $L/side.md > $L/side.log 2>&1; st side
tar czf $OUT/s5d.tgz -C /tmp s5d; cat $L/progress.log; tail -n 2 $L/tests.log; cat $L/side.md 2>/dev/null | tail -12
