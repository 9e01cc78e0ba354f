#!/bin/bash
# Session 3, first single-H200 block (~14 min; no 2-GPU machine was lent): runs in the background (setsid) across
# warm `run` calls; logs and markers in /tmp/s3, packed by collect_s3.sh. One GPU, so the steps run one after another:
# the device sparse-selection test and part d (sparse prefill timing on the 9B file), then the retrain of the demo
# model (fla kernel, retrieval curriculum), its f16 retrieval curve and issue 7's quality parts a/b on it.
cd "$(dirname "$0")/../.."
C=/tmp/s3; mkdir -p $C
export PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD PYTHONUNBUFFERED=1 LLAMACMP_CACHE=$PWD/.carry/vocab
stage() { echo "$(date +%T) $*" >> $C/progress.log; }
stage start; nvidia-smi -L >> $C/progress.log 2>&1; nproc >> $C/progress.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/fla/fla_core-0.6.0-py3-none-any.whl >> $C/progress.log 2>&1
( python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; make_9b('/tmp/m9bv.gguf', '.carry/vocab')" \
    > $C/m9b.log 2>&1; stage m9b-written; touch $C/m9b.done ) &
timeout 120 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_sparse_cuda.py > $C/sparse_test.log 2>&1; stage sparse-test
timeout 240 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_training_export.py -k fla_kernel_trains > $C/fla_test.log 2>&1
echo rc=$? >> $C/fla_test.log; stage fla-test
K=fla; grep -q "rc=0" $C/fla_test.log || K=torch
timeout 660 python3 -m training.train --preset full --run full2 --out out/full2 --max-minutes 6.5 --eval-every 500 \
    --gdn-kernel $K --export > $C/train_stdout.log 2>&1; echo rc=$? >> $C/train_stdout.log
cp training/logs/full2.log $C/ 2>/dev/null; stage trained-$K; touch $C/trained.done
timeout 160 python3 benchmarks/retrieval.py -m out/full2/full2-q8_0.gguf --lengths 4096,8192,16384,32768,65536 --docs 50 \
    --max-seconds 110 -ctk f16 -ctv f16 --json $C/retrieval_f16.json > $C/retrieval.log 2>&1
python3 benchmarks/plot_retrieval.py $C/retrieval_f16.json -o $C/retrieval_f16.png >> $C/retrieval.log 2>&1; stage retrieval
timeout 150 python3 benchmarks/long_context.py --parts d --m9b /tmp/m9bv.gguf --json $C/long_d.json > $C/long_d.log 2>&1; stage long-d
timeout 240 python3 benchmarks/long_context.py --parts a,b --trained out/full2/full2-q8_0.gguf --heldout out/full2/heldout.txt \
    --json $C/long_ab.json > $C/long_ab.log 2>&1; stage long-ab
stage all-done; touch $C/all.done
