#!/bin/bash
# Session 3, last H200 block (~4.5 min + start), run from the snapshot: `bash benchmarks/device/unpack.sh /tmp/clean
# && cd /tmp/clean && bash benchmarks/device/s3c.sh $R` (R = the device copy of the working tree: vocabulary, site).
# Writes its logs straight into $OUT so a block cut short still returns what finished.
R=$1; cd "$(dirname "$0")/../.."
mkdir -p $R/.carry/vocab && gunzip -c $R/.carry/gz/vocab.pkl.gz > $R/.carry/vocab/qwen35_vocab_v1_8dde380a6405e935.pkl
export PYTHONPATH=/tmp/site:$R/.carry/site:$PWD PYTHONUNBUFFERED=1 LLAMACMP_CACHE=$R/.carry/vocab
T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $OUT/progress.log; }
st start $(cat $R/.carry/gz/COMMIT)
( python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; make_9b('/tmp/m9bv.gguf', '$R/.carry/vocab')" \
    > /tmp/m9b.log 2>&1; touch /tmp/m9b.done ) &
# 1. first GPU run of this session's kernels and host paths: v3 GEMV (bit-identical to v2, batch invariance, PDL in a
#    graph), batched GDN/conv rows, tq3 decode, device sampling
timeout 110 python3 -m pytest -q -p no:cacheprovider -m cuda ${S3C_TESTS:-tests/test_kernels_cuda.py tests/test_decode_cuda.py \
    tests/test_device_sampling.py tests/test_attention_cuda.py} > $OUT/tests.log 2>&1; echo rc=$? >> $OUT/tests.log; st tests
timeout 40 python3 benchmarks/bench_gemv.py --quick > $OUT/gemv.log 2>&1; st gemv
while [ ! -e /tmp/m9b.done ]; do sleep 1; done; st m9b
# 2. tg128 / pp512 on the real-vocabulary 9B file: old paths, v2, v3, v3 + PDL
timeout 80 python3 benchmarks/bench_model.py /tmp/m9bv.gguf --compare-kernels -r 1 > $OUT/tg.log 2>&1; st tg
# 3. decode at 131072 with f16 vs tq3 KV (issue 7)
timeout 60 python3 benchmarks/long_context.py --parts c --m9b /tmp/m9bv.gguf > $OUT/partc.log 2>&1; st partc
# 4. 16 concurrent greedy streams through llamacmp-server (llama-server's figure: the 10:0x UTC run, same file recipe)
timeout 90 python3 benchmarks/server_vs_llamacpp.py --model /tmp/m9bv.gguf --only llamacmp --np 16 --n-predict 128 \
    > $OUT/server.log 2>&1; st server
# 5. decode attention per layer at 32K / 128K keys for every KV pair (the tq3 rework)
timeout 45 python3 benchmarks/bench_attention.py --decode-only --n-kv 32768,131072 > $OUT/attn.log 2>&1; st attn
