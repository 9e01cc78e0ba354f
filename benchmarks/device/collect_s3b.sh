#!/bin/bash
# Waits up to $1 seconds (or until s3b.sh is done), then packs /tmp/s3b into $OUT.
end=$(( $(date +%s) + $1 ))
while [ $(date +%s) -lt $end ] && [ ! -e /tmp/s3b/all.done ]; do sleep 3; done
tar czf $OUT/s3b.tgz -C /tmp s3b 2>/dev/null
cat /tmp/s3b/progress.log
for f in tests gemv compare side server_vs multi27 lcpp_build; do
  [ -e /tmp/s3b/$f.log ] && { echo "== $f"; tail -6 /tmp/s3b/$f.log; }; done
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv
