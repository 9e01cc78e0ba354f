#!/usr/bin/env bash
# Build libcmpkern.so for the cards CUDA 13 dropped (Pascal sm_61: P40, GTX 10x0; Volta sm_70: V100, CMP 100-210)
# without a CUDA 12 nvcc: clang 19 is the CUDA compiler, over the CUDA 12.9 headers, ptxas, libdevice and cudart from
# PyPI (nvcc 13 cannot target sm_61 / sm_70). See ../shared/reference/SM70_TOOLCHAIN.md for why each piece is needed.
#
#   tools/build_clang_cuda.sh 61         -> build/sm61/libcmpkern.so (sm_61 SASS + compute_61 PTX); `make ptx61`
#   tools/build_clang_cuda.sh 70         -> build/sm70/libcmpkern.so; `make ptx70`
#   tools/build_clang_cuda.sh 61 90      -> SASS for each, PTX for the last (what `make` runs on such GPUs when
#                                           clang 19 is the only route: CLANG_CUDA_LIB=llamacmp/lib/libcmpkern.so)
#   LLAMACMP_LIB=build/sm61/libcmpkern.so python3 -m pytest -q -m cuda    (the suite on it; on a newer GPU the
#                                                                          driver JIT-compiles the PTX)
# cudart is linked statically: the library is one file that depends on the driver only.
# Environment: CLANG (default clang++-19 on PATH; installed with apt-get when running as root and missing),
# CLANG_CUDA_LIB (default build/sm<ARCHS joined by ->/libcmpkern.so), CLANG_CUDA_TOOLS (default
# build/clang-cuda-toolchain), CUDA_DISASM=1 (also keep an SM61/SM70-capable cuobjdump + nvdisasm in
# $CLANG_CUDA_TOOLS/disasm), FATBINARY (CUDA 13's fatbinary; default: found on PATH or in /usr/local/cuda).
# The PyPI wheels go into $CLANG_CUDA_TOOLS/pypi with ONE `pip install --target` call: a second call into the same
# target silently skips the shared nvidia/ package folder.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build_clang_cuda: $*" >&2; exit 1; }
[ $# -gt 0 ] || die "usage: $0 ARCH [ARCH ...]   (compute capabilities without the dot: 61, 70, ...)"
ARCHS=("$@")
for a in "${ARCHS[@]}"; do
    [[ $a =~ ^[0-9]+$ ]] && [ "$a" -ge 61 ] || die "bad architecture '$a' (61, 70, 75, ...)"
done
LAST=${ARCHS[-1]}
TAG=sm$(IFS=-; echo "${ARCHS[*]}")
LIB=${CLANG_CUDA_LIB:-build/$TAG/libcmpkern.so}
OBJ=build/clang-obj-$TAG
# The toolchain (~150 MB) is shared by every arch and kept apart from the outputs, which stay small to carry.
TOOLS_DIR=${CLANG_CUDA_TOOLS:-build/clang-cuda-toolchain}
PYPI=$TOOLS_DIR/pypi
CUDA_PREFIX=$TOOLS_DIR/cuda      # the layout clang's --cuda-path expects
WHEELS=(nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-cccl-cu12==12.9.27)
mkdir -p "$(dirname "$LIB")" "$TOOLS_DIR"

# ---- clang 19 ----------------------------------------------------------------------------------------------------
# Found on PATH; else installed with apt-get as root; else (or with CLANG_ROOTLESS=1) the Debian packages are
# downloaded with `apt-get download` and unpacked into $TOOLS_DIR/clang with dpkg-deb -x, no root needed.
CLANG=${CLANG:-}
[ "${CLANG_ROOTLESS:-0}" = 1 ] || CLANG=${CLANG:-$(command -v clang++-19 || true)}
if [ -z "$CLANG" ] && [ "${CLANG_ROOTLESS:-0}" != 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q clang-19 >/dev/null || die "apt-get install clang-19 failed"
    CLANG=$(command -v clang++-19 || true)
fi
if [ -z "$CLANG" ] && command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
    root=$(realpath -m "$TOOLS_DIR/clang")
    if [ ! -x "$root/usr/lib/llvm-19/bin/clang++" ]; then
        debs=$(mktemp -d)
        (cd "$debs" && apt-get download -q clang-19 libclang-cpp19 libllvm19 libclang-common-19-dev >/dev/null) \
            || die "apt-get download of clang-19 and its libraries failed"
        mkdir -p "$root"
        for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root"; done
        rm -rf "$debs"
    fi
    export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/llvm-19/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    CLANG=$root/usr/lib/llvm-19/bin/clang++
fi
[ -n "$CLANG" ] && "$CLANG" --version >/dev/null 2>&1 \
    || die "no working clang++ 19 (apt-get install clang-19, or set CLANG=/path/to/clang++ of LLVM 19)"

FATBINARY=${FATBINARY:-$(command -v fatbinary || echo /usr/local/cuda/bin/fatbinary)}
[ -x "$FATBINARY" ] || die "no fatbinary (CUDA 13's works for sm_61 / sm_70 images; set FATBINARY=path)"

# ---- CUDA 12.9 pieces from PyPI ----------------------------------------------------------------------------------
NV=$PYPI/nvidia
if [ ! -x "$NV/cuda_nvcc/bin/ptxas" ] || [ ! -f "$NV/cuda_runtime/lib/libcudart_static.a" ] || \
   [ ! -d "$NV/cuda_cccl/include" ]; then
    rm -rf "$PYPI"
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$PYPI" "${WHEELS[@]}" \
        || die "pip install of ${WHEELS[*]} failed"
fi

rm -rf "$CUDA_PREFIX"
mkdir -p "$CUDA_PREFIX/bin" "$CUDA_PREFIX/nvvm" "$CUDA_PREFIX/include" "$CUDA_PREFIX/lib64"
ln -s "$(realpath "$NV/cuda_nvcc/bin/ptxas")" "$CUDA_PREFIX/bin/ptxas"
ln -s "$(realpath "$NV/cuda_nvcc/nvvm/libdevice")" "$CUDA_PREFIX/nvvm/libdevice"
cp -r "$NV/cuda_runtime/include/." "$NV/cuda_nvcc/include/." "$NV/cuda_cccl/include/." "$CUDA_PREFIX/include/"
rm -f "$CUDA_PREFIX/include/__init__.py"
: > "$CUDA_PREFIX/include/curand_mtgp32_kernel.h"     # clang's CUDA wrapper includes it; no cuRAND in the wheels
cp "$NV/cuda_runtime/lib/libcudart_static.a" "$CUDA_PREFIX/lib64/"
# clang 19 reports its toolkit version from version.json / cuda.h; nothing else of a toolkit is needed.

# clang <= 19 calls `fatbinary --image=profile=sm_70,file=X`; CUDA 13's fatbinary only takes
# `--image3=kind=elf|ptx,sm=70,file=X`. This wrapper translates the image arguments and passes the rest through.
cat > "$CUDA_PREFIX/bin/fatbinary" <<EOF
#!/usr/bin/env bash
args=()
for a in "\$@"; do
    case "\$a" in
        --image=profile=sm_*,file=*)      p=\${a#--image=profile=sm_}; args+=("--image3=kind=elf,sm=\${p%%,*},file=\${a#*,file=}") ;;
        --image=profile=compute_*,file=*) p=\${a#--image=profile=compute_}; args+=("--image3=kind=ptx,sm=\${p%%,*},file=\${a#*,file=}") ;;
        --cuda) ;;                                    # implied by CUDA 13's fatbinary
        *) args+=("\$a") ;;
    esac
done
exec "$(realpath "$FATBINARY")" "\${args[@]}"
EOF
chmod +x "$CUDA_PREFIX/bin/fatbinary"

# ---- compile and link --------------------------------------------------------------------------------------------
# nvcc's -use_fast_math counterparts; __CUDA_ARCH_LIST__ is nvcc-only and our code does not use it, but define it
# as nvcc would so that any later host-side dispatch sees the archs.
CFLAGS=(-x cuda --cuda-path="$CUDA_PREFIX" -O3 -std=c++17 -fPIC -Wno-unknown-cuda-version
        -fgpu-flush-denormals-to-zero -fgpu-approx-transcendentals -ffp-contract=fast
        -D__CUDA_ARCH_LIST__="$(IFS=,; echo "${ARCHS[*]/%/0}")")
for a in "${ARCHS[@]}"; do CFLAGS+=(--cuda-gpu-arch="sm_$a"); done
# PTX of the newest only, as the Makefile's nvcc build (clang's default is PTX for every arch)
CFLAGS+=(--no-cuda-include-ptx=all --cuda-include-ptx="sm_$LAST")
mkdir -p "$OBJ"
export PATH="$CUDA_PREFIX/bin:$PATH"
pids=()
for src in cuda_src/*.cu; do
    "$CLANG" "${CFLAGS[@]}" -c "$src" -o "$OBJ/$(basename "$src" .cu).o" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ "$rc" = 0 ] || die "compile failed"
"$CLANG" -shared -o "$LIB" "$OBJ"/*.o -L"$CUDA_PREFIX/lib64" -lcudart_static -ldl -lrt -lpthread

# ---- optional: a disassembler that still knows SM61 / SM70 -------------------------------------------------------
# CUDA 13.2+'s nvdisasm refuses them; triton 3.3.1 bundles CUDA 12.8's cuobjdump and nvdisasm. CUDA_DISASM=1 keeps
# just those two binaries in $TOOLS_DIR/disasm (tests/sass_tools.py looks there) and drops the rest of the wheel.
if [ "${CUDA_DISASM:-0}" = 1 ] && [ ! -x "$TOOLS_DIR/disasm/nvdisasm" ]; then
    tmp=$(mktemp -d)
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$tmp" triton==3.3.1 \
        || die "pip install triton==3.3.1 (for its SM61/SM70-capable nvdisasm) failed"
    mkdir -p "$TOOLS_DIR/disasm"
    cp "$tmp/triton/backends/nvidia/bin/cuobjdump" "$tmp/triton/backends/nvidia/bin/nvdisasm" "$TOOLS_DIR/disasm/"
    rm -rf "$tmp"
fi
echo "build_clang_cuda: wrote $LIB (SASS for sm_${ARCHS[*]}, PTX for compute_$LAST; run with LLAMACMP_LIB=$LIB)" >&2
