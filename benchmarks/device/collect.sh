#!/bin/bash
# Waits up to $1 seconds (or until all.done), then packs /tmp/chain into $OUT (one tarball + progress).
end=$(( $(date +%s) + $1 ))
while [ $(date +%s) -lt $end ] && [ ! -e /tmp/chain/all.done ]; do sleep 3; done
tar czf $OUT/chain.tgz -C /tmp chain 2>/dev/null
cat /tmp/chain/progress.log; tail -3 /tmp/chain/tests.log /tmp/chain/tests_sm70.log 2>/dev/null
for f in long_context side server_vs load_test multi; do [ -e /tmp/chain/$f.log ] && { echo "== $f"; tail -12 /tmp/chain/$f.log; }; done
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv
