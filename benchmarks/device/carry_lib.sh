#!/bin/bash
# The kernel library travels to the lent GPU machine instead of being built there (~4 min of device time: the
# matmul_quant_* units are the long pole, on 16 cores as on 2).
#   bash benchmarks/device/carry_lib.sh pack      HERE: `make device-lib` (sm_90 SASS, no line info: ~16 MB, 49 MB
#                                                 with -lineinfo and PTX), xz'd into .carry/libcmpkern.so.xz with the
#                                                 digest of the cuda_src it was built from in .carry/lib.sha
#   bash benchmarks/device/carry_lib.sh install   THERE: the carried library if it was built from this tree's
#                                                 cuda_src, else `make CUDA_ARCH=90` (says which)
#   bash benchmarks/device/carry_lib.sh digest    the cuda_src digest alone (session.sh's progress line, the plans'
#                                                 checks of other carried libraries)
set -eu
cd "$(dirname "$0")/../.."
# the files in C collation: a glob's order follows the locale (gdn_chunk.cuh sorts before gdn.cu under en_US, after
# it under C), and the lent machine's is not this one's (2026-12-04: a carried library refused, rebuilt there)
digest() { (export LC_ALL=C; cat cuda_src/* | sha256sum | cut -c1-16); }
case ${1:?pack | install | digest} in
  digest)
    digest;;
  pack)
    # objects in a folder of this cuda_src's own: make goes by times, and objects copied or left from other sources
    # can be newer than these (2026-12-04: a worktree given another's objects packed main's library under its
    # branch's digest)
    obj=build/obj-90-lean-$(digest)
    find build -maxdepth 1 -name 'obj-90-lean*' ! -path "$obj" -exec rm -rf {} + 2>/dev/null || true
    make device-lib LEAN_OBJ="$obj"
    mkdir -p .carry
    xz -T0 -9 -c build/lean90/libcmpkern.so > .carry/libcmpkern.so.xz
    digest > .carry/lib.sha
    ls -l .carry/libcmpkern.so.xz | awk '{printf "%s: %.1f MB (cuda_src %s)\n", $NF, $5 / 1048576, "'"$(digest)"'"}';;
  install)
    if [ -f .carry/libcmpkern.so.xz ] && [ "$(digest)" = "$(cat .carry/lib.sha 2>/dev/null)" ]; then
      mkdir -p llamacmp/lib && xz -dc .carry/libcmpkern.so.xz > llamacmp/lib/libcmpkern.so
      echo "carried library, cuda_src $(digest)"
    else
      echo "no carried library for cuda_src $(digest): building"; make CUDA_ARCH=90 -j"$(nproc)" 2>&1 | tail -1
    fi;;
  *) echo "pack | install | digest" >&2; exit 2;;
esac
