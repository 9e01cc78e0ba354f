#!/bin/bash
# On the device: unpacks snapshot.sh's source + library into $1 (the bundled model linked from the copy sent).
R=$(cd "$(dirname "$0")/../.." && pwd); T=$1
mkdir -p $T && tar xzf $R/.carry/gz/src.tgz -C $T && gunzip -c $R/.carry/gz/libcmpkern.so.gz > $T/llamacmp/lib/libcmpkern.so \
  && ln -sf $R/llamacmp/data/default.gguf $T/llamacmp/data/default.gguf && echo "snapshot $(cat $R/.carry/gz/COMMIT) in $T"
