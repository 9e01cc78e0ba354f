#!/bin/bash
# Run HERE (not on the device) before a device block: packs `git archive HEAD` (without the bundled model, which
# the device copy of the working tree already holds) and a `make CUDA_ARCH=90` library built from exactly that
# source into .carry/gz/, so the device runs one consistent commit whatever else the working tree holds
# (other engineers' unfinished edits are copied to the device too, and its git may not hold recent commits).
# On the device: `bash benchmarks/device/unpack.sh /tmp/clean` (or by hand: see there).
set -e
cd "$(dirname "$0")/../.."
H=$(git rev-parse --short HEAD); S=/tmp/snap-$H
rm -rf $S && mkdir -p $S && git archive HEAD | tar -x -C $S
rm -f $S/llamacmp/data/default.gguf
make -C $S CUDA_ARCH=90 -j2 > /tmp/snap-$H.make.log 2>&1 || { tail -20 /tmp/snap-$H.make.log; exit 1; }
mkdir -p .carry/gz
tar czf .carry/gz/src.tgz -C $S --exclude=build --exclude=llamacmp/lib/libcmpkern.so .
gzip -c $S/llamacmp/lib/libcmpkern.so > .carry/gz/libcmpkern.so.gz
echo $H > .carry/gz/COMMIT
ls -la .carry/gz
