#!/bin/bash
# One generic device session: runs a plan's steps one after another in the background (so a block longer than one
# `run` call's 10 minutes spans several warm calls), each step's output in /tmp/<tag>/<step>.log; `collect` packs
# the folder into $OUT. Replaces the per-session one-offs (s3a.sh, s4.sh, collect_s4.sh, ...; in git before 2026-12).
#
#   bash benchmarks/device/session.sh start PLAN [TAG]       start (returns at once); TAG defaults to the plan's name
#   bash benchmarks/device/session.sh collect TAG [SECONDS] [STEP]
#                                                            wait up to SECONDS (default 540) for the end (or for STEP's
#                                                            end: the next call can then carry what a later step waits
#                                                            for), then pack /tmp/TAG into $OUT/TAG.tgz and print
#                                                            progress + log tails
#
# A plan (benchmarks/device/plans/*.plan) is one step a line, `name  command` (the command runs with bash from the
# repository root, PYTHONPATH set to the root, /tmp/site and .carry/site); blank lines and # comments are skipped. A step may
# wait for a background step's marker: `waitfor NAME` (the runner touches /tmp/TAG/NAME.done after each step). The
# environment variables the plan needs (models, carries) are set in the plan itself.
set -u
cd "$(dirname "$0")/../.."
cmd=${1:?start PLAN [TAG] | collect TAG [SECONDS]}
if [ "$cmd" = start ]; then
  plan=${2:?plan file}; tag=${3:-$(basename "$plan" .plan)}; D=/tmp/$tag
  mkdir -p "$D" && cp "$plan" "$D/plan"
  setsid nohup bash "$0" _run "$D" > "$D/runner.log" 2>&1 < /dev/null &
  echo "started $tag (pid $!): bash $0 collect $tag"
elif [ "$cmd" = _run ]; then
  D=$2
  # wheels: installed by a plan step into /tmp/site (outside the tree: a later call's copy of the tree cannot touch it)
  export PYTHONPATH=$PWD:/tmp/site:$PWD/.carry/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
  waitfor() { while [ ! -e "$D/$1.done" ]; do sleep 2; done; }
  export -f waitfor; export D
  stage() { echo "$(date +%T) $*" >> "$D/progress.log"; }
  # the tree by its kernels' digest: the copy's git HEAD is not the tree that was sent (2026-12-04: every call said
  # 49947ad, main's commit, while running next/c20 and a detached scratch commit)
  stage "start cuda_src $(bash benchmarks/device/carry_lib.sh digest)"
  nvidia-smi -L >> "$D/progress.log" 2>&1
  grep -v '^\s*\(#\|$\)' "$D/plan" | while read -r name step; do
    stage "$name"
    bash -c "$step" > "$D/$name.log" 2>&1 < /dev/null
    echo "rc=$?" >> "$D/$name.log"; touch "$D/$name.done"
    stage "$name done $(tail -1 "$D/$name.log")"
  done
  stage all-done; touch "$D/all.done"
elif [ "$cmd" = collect ]; then
  tag=${2:?tag}; D=/tmp/$tag; end=$(( $(date +%s) + ${3:-540} )); last=${4:-all}
  # a call that lands on a fresh machine (the last one was released: warm for only ~30 s) has no session to wait
  # for: say so at once instead of spending the call's device time on waiting
  [ -d "$D" ] || { echo "no session $tag on this machine (a fresh one): start the plan again"; exit 3; }
  # packed every ~30 s too: a call cut short (the session's device budget spent) still brings back the logs so far
  n=0
  while [ "$(date +%s)" -lt $end ] && [ ! -e "$D/$last.done" ]; do
    sleep 3; n=$((n + 1)); [ $((n % 10)) -eq 0 ] && tar czf "${OUT:-/tmp}/$tag.tgz" -C /tmp "$tag" 2>/dev/null
  done
  tar czf "${OUT:-/tmp}/$tag.tgz" -C /tmp "$tag" 2>/dev/null
  cat "$D/progress.log"
  for f in "$D"/*.log; do case $f in */progress.log|*/runner.log) continue;; esac; echo "== $(basename "$f")"; tail -8 "$f"; done
  nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv 2>/dev/null
else
  echo "unknown command $cmd" >&2; exit 2
fi
