#!/usr/bin/env bash
# Which compiler (route) and CUDA architectures `make` builds with, printed as one line "ROUTE ARCH ...": ROUTE is
# the path of an nvcc, or `clang` (tools/build_clang_cuda.sh); ARCHs are compute capabilities (61 70 75 ...).
# Nothing printed: nothing to build.
#
#   tools/cuda_archs.sh native      the GPUs present (nvidia-smi, else the driver through libcuda), each mapped to an
#                                   architecture the route can target; nothing when there is no GPU
#   tools/cuda_archs.sh all         every architecture NVCC supports (CI, packagers; NVCC only)
#   tools/cuda_archs.sh 61 [70 ..]  exactly these (make CUDA_ARCH=N, make ptx61 / ptx70)
#
# Routes, first that can target every architecture needed:
#   1. NVCC (default: nvcc on PATH). CUDA 13 dropped sm_50..sm_72, so the Pascal and Volta cards this project is for
#      (P40 sm_61, V100 / CMP 100-210 sm_70) need a CUDA 12.x nvcc;
#   2. a CUDA 12.x nvcc among CUDA12_NVCC (default: /usr/local/cuda-12*/bin/nvcc newest first, then the one
#      tools/get_cuda12.sh puts in build/cuda12);
#   3. clang 19 (CLANG, default clang++-19 on PATH) over PyPI's CUDA 12.9 pieces: tools/build_clang_cuda.sh.
# CUDA_ROUTE=nvcc skips 3, CUDA_ROUTE=clang takes 3 only. LIBCUDA (default libcuda.so.1) is the driver library asked
# when nvidia-smi is missing. Messages go to stderr; a GPU no route can build for is an error (exit 1) that says what
# to install.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-native}
NVCC=${NVCC:-$(command -v nvcc || true)}
CUDA12_NVCC=${CUDA12_NVCC-$(ls -d /usr/local/cuda-12*/bin/nvcc 2>/dev/null | sort -rV || true) build/cuda12/bin/nvcc}
CLANG=${CLANG-$(command -v clang++-19 || true)}
CUDA_ROUTE=${CUDA_ROUTE:-auto}
CUDA12_ARCHS="61 70 75 80 86 89 90"
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

# CUDA major release of an nvcc ("" when it does not run).
nvcc_major() { "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p'; }

# The architectures a route can target, oldest first; nothing for an nvcc older than 12.
route_archs() {
    [ "$1" = clang ] && { echo "$CUDA12_ARCHS"; return; }
    local major
    major=$(nvcc_major "$1")
    if [ -z "$major" ]; then say "cannot read the release of $1 (nvcc --version)"
    elif [ "$major" -ge 13 ]; then echo "75 80 86 89 90"
    elif [ "$major" -eq 12 ]; then echo "$CUDA12_ARCHS"
    else say "$1 is CUDA $major: llamacmp needs CUDA 12.x or newer"
    fi
}

# One GPU's architecture: the newest the route has at or below its capability (same major: SASS runs as is; an
# older major: the driver JIT-compiles the PTX that is built for the newest architecture of the list). Empty: none.
pick_arch() {
    local cc=$1 best="" a
    for a in $2; do [ "$a" -le "$cc" ] && best=$a; done
    echo "$best"
}

# The routes to try, in order (see the header).
candidates() {
    if [ "$CUDA_ROUTE" != clang ]; then
        [ -n "$NVCC" ] && echo "$NVCC"
        for c in $CUDA12_NVCC; do [ -x "$c" ] && [ "$(nvcc_major "$c")" = 12 ] && echo "$c"; done
    fi
    [ "$CUDA_ROUTE" != nvcc ] && [ -n "$CLANG" ] && command -v "$CLANG" >/dev/null && echo clang
    return 0
}

# "ROUTE ARCH..." for capabilities $1 (exact=1: each must be an architecture of the route), or an error that says
# what to install.
choose() {
    local caps=$1 exact=$2 route supported cc a archs first=""
    for route in $(candidates); do
        supported=$(route_archs "$route")
        archs=""
        for cc in $caps; do
            if [ "$exact" = 1 ]; then a=$(echo " $supported " | grep -o " $cc " | tr -d ' ' || true)
            else a=$(pick_arch "$cc" "$supported"); fi
            [ -n "$a" ] || { archs=""; break; }
            archs="$archs $a"
        done
        if [ -n "$archs" ]; then
            [ -n "$first" ] && say "$first cannot target sm_${caps// /, sm_}; using $route"
            echo "$route $(echo $archs | tr ' ' '\n' | sort -un | tr '\n' ' ')"
            return 0
        fi
        first=${first:-$route}
    done
    if [ -z "$(candidates)" ]; then
        say "no nvcc and no clang 19 for sm_${caps// /, sm_}: install a CUDA toolkit (12.x for sm_61 / sm_70)"
    else
        say "sm_${caps// /, sm_} needs a CUDA 12.x nvcc or clang 19: ${NVCC:-no nvcc} cannot target it (CUDA 13"\
            "dropped sm_61 and sm_70) and neither route was found. Any one of:"
    fi
    say "  a CUDA 12.x toolkit: make NVCC=/usr/local/cuda-12/bin/nvcc (found there by make)"
    say "  tools/get_cuda12.sh: Debian's nvcc 12.4 + PyPI's CUDA 12 headers into build/cuda12 (found by make)"
    say "  clang 19 (apt-get install clang-19): make uses it with PyPI's CUDA 12.9 pieces (tools/build_clang_cuda.sh)"
    say "until then llamacmp runs on the numpy backend"
    exit 1
}

case $mode in
all)
    [ -n "$NVCC" ] || { say "nvcc not found: make all-archs needs a CUDA toolkit"; exit 1; }
    archs=$(route_archs "$NVCC"); [ -n "$archs" ] || exit 1
    echo "$NVCC $archs" ;;
native)
    caps=$(gpu_caps | tr -d ' .' | grep -E '^[0-9]+$' | sort -un | tr '\n' ' ' || true)
    caps=${caps% }
    if [ -z "$caps" ]; then
        say "no NVIDIA GPU found: nothing to build; llamacmp will run on the numpy backend"
        say "(make all-archs builds the kernels for every architecture, e.g. for packaging)"
        exit 0
    fi
    for cc in $caps; do
        [ "$cc" -ge "$MIN_CC" ] || { say "GPU sm_$cc has no DP4A: llamacmp's kernels need compute capability 6.1"\
            "or newer"; exit 1; }
    done
    line=$(choose "$caps" 0)
    set -- $line
    route=$1; shift
    say "GPUs present: sm_${caps// /, sm_}; building for sm_$(echo $* | sed 's/ /, sm_/g') with $route"
    echo "$line" ;;
[0-9]*)
    for cc in "$@"; do
        [[ $cc =~ ^[0-9]+$ ]] && [ "$cc" -ge "$MIN_CC" ] \
            || { say "bad architecture '$cc': compute capability without the dot, 61 or newer"; exit 1; }
    done
    choose "$*" 1 ;;
*)
    say "usage: $0 native|all|ARCH..."; exit 2 ;;
esac
