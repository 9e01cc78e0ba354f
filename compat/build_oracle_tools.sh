#!/usr/bin/env bash
# Build compat/ggml_quants.cpp, compat/llama_logits.cpp, compat/llama_chat.cpp and compat/llama_mtmd.cpp against the llama.cpp tree that
# compat/build_llamacpp.sh built (run that first). They land beside llama.cpp's own tools in build-cpu/bin.
#
# Usage: compat/build_oracle_tools.sh [--oracle b8462|0c1e570]   (b8462: the default oracle; 0c1e570: current
# llama.cpp, built by `compat/build_llamacpp.sh --version 0.3.36`)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${LLAMACMP_CACHE:-$HOME/.cache/llamacmp}"
ORACLE=b8462
while [[ $# -gt 0 ]]; do
    case "$1" in
        --oracle) ORACLE="$2"; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
case "$ORACLE" in
    b8462) SRC="$CACHE/llama.cpp-49bfddeca"; COMMON_LIBS=(common/libcommon.a) ;;
    # current llama.cpp split its common library in two
    0c1e570) SRC="$CACHE/llama.cpp-0c1e570"; COMMON_LIBS=(common/libllama-common.a common/libllama-common-base.a) ;;
    *) echo "unknown --oracle $ORACLE (known: b8462, 0c1e570)" >&2; exit 2 ;;
esac
B="$SRC/build-cpu"
GGML_LIBS=("$B/ggml/src/libggml-cpu.a" "$B/ggml/src/libggml-base.a")
# stale TOOL: its binary is missing or older than its source or than oracle_common.h (llama_logits' and
# llama_mtmd's shared helpers)
stale() { [[ ! -x "$B/bin/$1" || "$HERE/$1.cpp" -nt "$B/bin/$1" || "$HERE/oracle_common.h" -nt "$B/bin/$1" ]]; }
# ggml_quants (quantization goldens) needs only ggml's CPU library: `cmake --build $B --target ggml-cpu` is enough.
[[ -f "${GGML_LIBS[0]}" ]] || { echo "run compat/build_llamacpp.sh first" >&2; exit 1; }
if stale ggml_quants; then
    echo "building ggml_quants"
    mkdir -p "$B/bin"
    g++ -O2 -std=c++17 -I"$SRC/ggml/include" "$HERE/ggml_quants.cpp" "${GGML_LIBS[@]}" -fopenmp -lpthread \
        -o "$B/bin/ggml_quants"
fi
[[ -f "$B/src/libllama.a" && -f "$B/${COMMON_LIBS[0]}" ]] || { echo "run compat/build_llamacpp.sh first" >&2; exit 1; }
INC=(-I"$SRC/include" -I"$SRC/ggml/include" -I"$SRC/common" -I"$SRC/vendor")
LIBS=("${COMMON_LIBS[@]/#/$B/}" "$B/src/libllama.a" "$B/ggml/src/libggml.a" "${GGML_LIBS[@]}")
for tool in llama_logits llama_chat; do
    if stale "$tool"; then
        echo "building $tool"
        g++ -O2 -std=c++17 "${INC[@]}" "$HERE/$tool.cpp" "${LIBS[@]}" -fopenmp -lpthread -o "$B/bin/$tool"
    fi
done
# llama_mtmd (vision goldens) also links llama.cpp's multimodal library (tools/mtmd, built with the tools).
if stale llama_mtmd; then
    [[ -f "$B/tools/mtmd/libmtmd.a" ]] || { echo "libmtmd.a missing: cmake --build $B --target mtmd" >&2; exit 1; }
    echo "building llama_mtmd"
    g++ -O2 -std=c++17 "${INC[@]}" -I"$SRC/tools/mtmd" "$HERE/llama_mtmd.cpp" "$B/tools/mtmd/libmtmd.a" "${LIBS[@]}" \
        -fopenmp -lpthread -o "$B/bin/llama_mtmd"
fi
