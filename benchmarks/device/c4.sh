#!/bin/bash
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD PYTHONUNBUFFERED=1 LLAMACMP_CACHE=$PWD/.carry/vocab
C=$OUT;  T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $C/progress.log; }
python3 -c "
import llamacmp.fixtures.qwen_vocab as q
q.qwen_tiktoken_path = lambda: None; q._source_digest = lambda s: '8dde380a6405e935'
from llamacmp.fixtures import writer
writer.main(['/tmp/m9bv.gguf', '--shape', '9b', '--type', 'q8_0', '--vocab', 'qwen35'])" > $C/write.log 2>&1 || { tail -5 $C/write.log; exit 1; }
st written; export CUDA_VISIBLE_DEVICES=0; B="-ngl 99 -fa 1"
python3 -m llamacmp.cli.bench -m /tmp/m9bv.gguf -p 512,4096,16384 -n 128 -r 2 $B > $C/ours.md 2>&1; st ours
python3 -m llamacmp.cli.bench -m /tmp/m9bv.gguf -p 0 -n 128 -d 32768 -r 1 $B >> $C/ours.md 2>&1; st ours-d
for b in native standin; do /tmp/lcpp/$b/bin/llama-bench -m /tmp/m9bv.gguf -p 512,4096,16384 -n 128 -r 2 $B > $C/$b.md 2>&1; st $b
/tmp/lcpp/$b/bin/llama-bench -m /tmp/m9bv.gguf -p 0 -n 128 -d 32768 -r 1 $B >> $C/$b.md 2>&1; st $b-d; done
timeout 150 python3 benchmarks/server_vs_llamacpp.py --model /tmp/m9bv.gguf --llama-server /tmp/lcpp/native/bin/llama-server --np 16 --n-predict 128 --out $C/server_vs.json > $C/server_vs.log 2>&1; st server_vs
cat $C/progress.log; grep -h "^| \|error\|Error" $C/ours.md $C/native.md $C/standin.md | grep -v -- "---" | head -30; tail -8 $C/server_vs.log
