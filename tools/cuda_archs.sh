#!/usr/bin/env bash
# Which CUDA architectures `make` compiles for, as a space-separated list of compute capabilities (70 75 ...).
#
#   tools/cuda_archs.sh native   the GPUs present (nvidia-smi, else the driver through libcuda), each mapped to an
#                                architecture this nvcc can target; nothing when there is no GPU
#   tools/cuda_archs.sh all      every architecture llamacmp supports with this nvcc (CI, packagers)
#
# NVCC (default: nvcc on PATH) is asked for its release: CUDA 13 dropped sm_50..sm_72, so the Pascal and Volta cards
# this project is for (P40 sm_61, V100 / CMP 100-210 sm_70) need a CUDA 12.x nvcc, or the clang 19 route of
# tools/build_sm70.sh. LIBCUDA (default libcuda.so.1) is the driver library asked when nvidia-smi is missing.
# Messages go to stderr; a GPU that this nvcc cannot build for is an error (exit 1) that says what to install.
set -euo pipefail

mode=${1:-native}
NVCC=${NVCC:-$(command -v nvcc || true)}
# The kernels use DP4A (sm_61+) on every card; sm_60 (P100) has none.
MIN_CC=61

say() { echo "cuda_archs: $*" >&2; }

# Compute capabilities of the GPUs present, one "major.minor" per line.
gpu_caps() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null && return 0
    fi
    python3 - "${LIBCUDA:-libcuda.so.1}" <<'PY' 2>/dev/null || true
import ctypes, sys
cu = ctypes.CDLL(sys.argv[1])
n, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
if cu.cuInit(0) == 0 and cu.cuDeviceGetCount(ctypes.byref(n)) == 0:
    for d in range(n.value):
        # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76
        cu.cuDeviceGetAttribute(ctypes.byref(major), 75, d)
        cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, d)
        print(f"{major.value}.{minor.value}")
PY
}

# The architectures this nvcc can target, oldest first.
nvcc_archs() {
    local major
    major=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    [ -n "$major" ] || { say "cannot read the release of $NVCC (nvcc --version)"; exit 1; }
    if [ "$major" -ge 13 ]; then echo "75 80 86 89 90"
    elif [ "$major" -eq 12 ]; then echo "61 70 75 80 86 89 90"
    else say "$NVCC is CUDA $major: llamacmp needs CUDA 12.x or newer"; exit 1
    fi
}

# One GPU's architecture: the newest this nvcc has at or below its capability (same major: SASS runs as is;
# an older major: the driver JIT-compiles the PTX that is built for the newest architecture of the list).
pick_arch() {
    local cc=$1 supported=$2 best="" a
    for a in $supported; do [ "$a" -le "$cc" ] && best=$a; done
    if [ "$cc" -lt "$MIN_CC" ]; then
        say "GPU sm_$cc has no DP4A: llamacmp's kernels need compute capability 6.1 or newer"; exit 1
    fi
    if [ -z "$best" ]; then
        say "GPU sm_$cc needs a CUDA 12.x nvcc ($NVCC is CUDA 13+, which dropped sm_61 and sm_70):"
        say "  install a CUDA 12.x toolkit and run: make NVCC=/usr/local/cuda-12/bin/nvcc"
        say "  or, for sm_70, build with clang 19 and CUDA 12.9 pieces from PyPI: make ptx70 (tools/build_sm70.sh)"
        exit 1
    fi
    echo "$best"
}

case $mode in
all)
    [ -n "$NVCC" ] || { say "nvcc not found: make all-archs needs a CUDA toolkit"; exit 1; }
    nvcc_archs ;;
native)
    caps=$(gpu_caps | tr -d ' .' | grep -E '^[0-9]+$' | sort -un || true)
    if [ -z "$caps" ]; then
        say "no NVIDIA GPU found: nothing to build; llamacmp will run on the numpy backend"
        say "(make all-archs builds the kernels for every architecture, e.g. for packaging)"
        exit 0
    fi
    [ -n "$NVCC" ] || { say "GPU sm_$(echo $caps | sed 's/ /, sm_/g') found but no nvcc: install a CUDA toolkit"\
        "(12.x for sm_61/sm_70); until then llamacmp runs on the numpy backend"; exit 1; }
    supported=$(nvcc_archs)
    archs=$(for cc in $caps; do pick_arch "$cc" "$supported"; done | sort -un | tr '\n' ' ')
    say "GPUs present: sm_$(echo $caps | sed 's/ /, sm_/g'); building for sm_$(echo $archs | sed 's/ /, sm_/g')"
    echo "${archs% }" ;;
*)
    say "usage: $0 native|all"; exit 2 ;;
esac
