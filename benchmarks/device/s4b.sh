#!/bin/bash
# Session 4's last call (~3 min + start, one H200, from the snapshot): issue 7 part c with no compile running beside
# it (s4.sh's ran during the llama.cpp build: host-timed tokens under CPU contention), the decode attention per layer
# (the tq3 word kernel reverted), and a decode token kernel by kernel. Logs straight into $OUT.
R=$(cd "$(dirname "$0")/../.." && pwd); T=/tmp/clean4b
bash $R/benchmarks/device/unpack.sh $T > $OUT/unpack.log 2>&1 || exit 1
mkdir -p $R/.carry/vocab && gunzip -c $R/.carry/gz/vocab.pkl.gz > $R/.carry/vocab/qwen35_vocab_v1_8dde380a6405e935.pkl
cd $T
export PYTHONPATH=$R/.carry/site:$T PYTHONUNBUFFERED=1 LLAMACMP_CACHE=$R/.carry/vocab
T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $OUT/progress.log; }
st start $(cat $R/.carry/gz/COMMIT)
( [ -e /tmp/m9bv.gguf ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; \
make_9b('/tmp/m9bv.gguf', '$R/.carry/vocab')" > $OUT/m9b.log 2>&1; touch /tmp/m9b4b.done ) &
timeout 30 python3 benchmarks/bench_attention.py --decode-only --n-kv 32768,131072 > $OUT/attn.log 2>&1; st attn
while [ ! -e /tmp/m9b4b.done ]; do sleep 1; done; st m9b
timeout 60 python3 benchmarks/long_context.py --parts c --m9b /tmp/m9bv.gguf --n-gen 256 > $OUT/partc.log 2>&1; st partc
timeout 40 python3 benchmarks/profile_decode.py /tmp/m9bv.gguf -n 64 --top 40 > $OUT/profile.log 2>&1; st profile
