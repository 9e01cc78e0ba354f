#!/bin/bash
# Waits up to $1 seconds (or until s3.sh is done), then packs /tmp/s3 into $OUT and, once trained, the new model.
end=$(( $(date +%s) + $1 ))
while [ $(date +%s) -lt $end ] && [ ! -e /tmp/s3/all.done ]; do sleep 3; done
tar czf $OUT/s3.tgz -C /tmp s3 2>/dev/null
cd "$(dirname "$0")/../.."
if [ -e out/full2/full2-q8_0.gguf ] && [ ! -e /tmp/s3/model.sent ]; then
  split -b 15m -d out/full2/full2-q8_0.gguf $OUT/full2-q8_0.gguf.part && gzip -c out/full2/heldout.txt > $OUT/full2-heldout.txt.gz \
    && touch /tmp/s3/model.sent
fi
cat /tmp/s3/progress.log
for f in fla_test sparse_test train_stdout retrieval side server_vs long_d long_ab multi27; do
  [ -e /tmp/s3/$f.log ] && { echo "== $f"; tail -8 /tmp/s3/$f.log; }; done
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv
