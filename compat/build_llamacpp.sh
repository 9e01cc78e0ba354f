#!/usr/bin/env bash
# Build the llama.cpp reference tools from a llama-cpp-python sdist: by default 0.3.17 (≈ b8462, commit 49bfddeca),
# the oracle of every golden; --version 0.3.36 (commit 0c1e570) is the newer one with Qwen3.5 MTP (draft-mtp).
#
# Usage: compat/build_llamacpp.sh [--version 0.3.17|0.3.36] [--cuda | --portable] [--jobs N]
#   CPU build (default): $CACHE/llama.cpp-49bfddeca/build-cpu/bin/llama-*  (0.3.36: llama.cpp-0c1e570/...)
#   --cuda:              $CACHE/llama.cpp-49bfddeca/build-cuda/bin/llama-*  (sm_90, for the device machine)
#   --portable:          $CACHE/llama.cpp-49bfddeca/build-portable/bin/llama-quantize alone, to run on another x86-64
#                        machine (the GPU machine): GGML_NATIVE=OFF (an AVX2/FMA/F16C baseline instead of this CPU's
#                        -march=native), no OpenMP, libstdc++/libgcc linked in; it needs only glibc there
# CACHE = ${LLAMACMP_CACHE:-$HOME/.cache/llamacmp}. The tree lives outside the repo on purpose: it is ~300 MB
# unpacked and only the goldens it produces are committed. Re-running reuses the download, the tree and the build.
# Offline (e.g. the device machine): point LLAMACPP_SDIST at a copy of llama_cpp_python-0.3.17.tar.gz, or set
# LLAMACMP_CACHE to a folder that already holds llama.cpp-49bfddeca/ (the tree alone is enough).
set -euo pipefail

SDIST_VERSION=0.3.17
# llama-imatrix: IQ2_XXS and the other very-low-bit types cannot be quantized without an importance matrix
TARGETS="llama-cli llama-completion llama-server llama-tokenize llama-perplexity llama-bench llama-embedding llama-quantize llama-imatrix"

MODE=cpu
JOBS=2
while [[ $# -gt 0 ]]; do
    case "$1" in
        --version) SDIST_VERSION="$2"; shift ;;
        --cuda) MODE=cuda ;;
        --portable) MODE=portable; TARGETS=llama-quantize ;;
        --jobs|-j) JOBS="$2"; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done

# the sdist pins the llama.cpp commit; the build number is only what `llama-cli --version` prints (0: the sdist's
# shallow history does not say which b-number 0c1e570 is)
case "$SDIST_VERSION" in
    0.3.17) EXPECTED_COMMIT=49bfddeca18e62fa3d39114a23e9fcbdf8a22388; BUILD_COMMIT=49bfddeca; BUILD_NUMBER=8462 ;;
    # the MTP oracle (issue 19): the serving, CLI, benchmark and measurement tools, not imatrix / embedding
    0.3.36) EXPECTED_COMMIT=0c1e57098bba43ac29e6e3b677cdceebdd22334f; BUILD_COMMIT=0c1e570; BUILD_NUMBER=0
            [[ "$MODE" == portable ]] || \
                TARGETS="llama-server llama-cli llama-completion llama-bench llama-quantize llama-tokenize llama-perplexity" ;;
    *) echo "unknown --version $SDIST_VERSION (known: 0.3.17, 0.3.36)" >&2; exit 2 ;;
esac

CACHE="${LLAMACMP_CACHE:-$HOME/.cache/llamacmp}"
SRC="$CACHE/llama.cpp-$BUILD_COMMIT"
BUILD="$SRC/build-$MODE"
mkdir -p "$CACHE"

# stderr: fetch_sdist returns its path on stdout, so a log line there would become part of the path
log() { echo "[build_llamacpp $(date +%H:%M:%S)] $*" >&2; }

fetch_sdist() {
    local dl="$CACHE/sdist"
    local tarball="${LLAMACPP_SDIST:-$dl/llama_cpp_python-$SDIST_VERSION.tar.gz}"
    if [[ ! -f "$tarball" ]]; then
        mkdir -p "$dl"
        log "downloading llama-cpp-python==$SDIST_VERSION sdist"
        # pip prepares metadata in an isolated env (scikit-build-core); it does not compile anything.
        python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$SDIST_VERSION" -d "$dl" >&2
    fi
    echo "$tarball"
}

# The sdist keeps the submodule's shallow git metadata; its HEAD names the vendored commit.
record_commit() {
    local top="$1"
    local head_file="$top/.git/modules/vendor/llama.cpp/HEAD"
    local commit="unknown"
    [[ -f "$head_file" ]] && commit="$(tr -d '[:space:]' < "$head_file")"
    echo "$commit" > "$SRC/COMMIT"
    log "vendored llama.cpp commit: $commit"
    if [[ "$commit" != "$EXPECTED_COMMIT" ]]; then
        log "WARNING: expected $EXPECTED_COMMIT"
    fi
}

unpack_tree() {
    if [[ -f "$SRC/CMakeLists.txt" ]]; then
        [[ -f "$SRC/COMMIT" ]] || log "WARNING: reusing $SRC without a recorded COMMIT"
        return 0
    fi
    local tarball tmp top
    tarball="$(fetch_sdist)"
    tmp="$(mktemp -d "$CACHE/unpack.XXXXXX")"
    log "unpacking $tarball"
    tar xzf "$tarball" -C "$tmp"
    top="$tmp/llama_cpp_python-$SDIST_VERSION"
    rm -rf "$SRC"
    mv "$top/vendor/llama.cpp" "$SRC"
    # its .git is a gitfile pointing into the sdist's .git/modules; drop it so cmake does not query git
    rm -f "$SRC/.git"
    record_commit "$top"
    rm -rf "$tmp"
}

ensure_cmake() {
    command -v cmake >/dev/null && return 0
    log "cmake not found; installing it with pip"
    python3 -m pip install --quiet cmake
}

# -march=native on a CPU with AMX (Sapphire Rapids and later) also compiles ggml's AMX matmuls (ggml-cpu/amx/), an
# extra buffer type that takes Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS weights: b8462's crashes in the first decode on
# such a machine (llama-completion's warm-up, llama_logits), and the goldens come from the AVX2/AVX-512 vec_dot
# paths anyway. GCC's explicit -mno-* flags win over -march=native whatever their order.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

configure() {
    local extra=(-DGGML_NATIVE=ON "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX")
    case "$MODE" in
        cuda) extra+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
              command -v ninja >/dev/null && extra+=(-G Ninja) ;;
        portable) extra=(-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF
                         "-DCMAKE_EXE_LINKER_FLAGS=-static-libgcc -static-libstdc++") ;;
    esac
    # a build configured before NO_AMX is configured again (cmake keeps the rest of its cache)
    [[ -f "$BUILD/CMakeCache.txt" ]] &&
        { [[ "$MODE" == portable ]] || grep -q -- "-mno-amx-int8" "$BUILD/CMakeCache.txt"; } && return 0
    log "configuring $MODE build in $BUILD"
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_COMMIT="$BUILD_COMMIT" -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER" \
        "${extra[@]}"
}

build() {
    log "building $TARGETS with -j$JOBS"
    # shellcheck disable=SC2086  # TARGETS is a word list on purpose
    cmake --build "$BUILD" --config Release -j "$JOBS" --target $TARGETS
    log "done: $BUILD/bin"
    if [[ "$MODE" == portable ]]; then
        # what the other machine must provide: glibc at least this version, nothing else
        log "needs: $(objdump -p "$BUILD/bin/llama-quantize" | awk '/NEEDED/ {print $2}' | tr '\n' ' ')glibc >=" \
            "$(objdump -T "$BUILD/bin/llama-quantize" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)"
    else
        "$BUILD/bin/llama-cli" --version 2>&1 | head -2 || true
    fi
}

main() {
    ensure_cmake
    unpack_tree
    configure
    build
}

main
