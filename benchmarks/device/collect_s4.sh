#!/bin/bash
# Waits up to $1 seconds (or until s4.sh is done), copying /tmp/s4 into $OUT every 10 s (a call cut short by the
# device budget still returns what had finished), then prints the progress.
end=$(( $(date +%s) + $1 ))
while [ $(date +%s) -lt $end ] && [ ! -e /tmp/s4/all.done ]; do cp -r /tmp/s4 $OUT/ 2>/dev/null; sleep 10; done
cp -r /tmp/s4 $OUT/ 2>/dev/null
cat /tmp/s4/progress.log; tail -3 /tmp/s4/tests.log
