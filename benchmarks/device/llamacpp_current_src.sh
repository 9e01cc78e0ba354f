#!/bin/bash
# Run HERE: llama.cpp 0c1e570 (the tree vendored in the llama-cpp-python 0.3.36 sdist) trimmed to what a CUDA build of
# llama-server / llama-bench / llama-cli needs, as .carry/llama.cpp-0c1e570.tar.gz (top folder llama.cpp-0c1e570).
# Left out: models/ (vocab test files), docs/, media/, tests/ and examples/ + pocs/ (the build turns them off), the
# Python converters, the UI sources (the build embeds no UI: -DLLAMA_USE_PREBUILT_UI=OFF) and the other GPU backends.
#   bash benchmarks/device/llamacpp_current_src.sh [SRC [NAME]]   SRC: the unpacked tree (default below) or the sdist;
#   NAME: the top folder and file name (default llama.cpp-0c1e570; llama.cpp-b8462 for the 0.3.17 sdist's tree)
set -eu
cd "$(dirname "$0")/../.."
SRC=${1:-/work/cache/src/llama_cpp_python-0.3.36/vendor/llama.cpp}
NAME=${2:-llama.cpp-0c1e570}
if [[ $SRC == *.tar.gz ]]; then
  tmp=$(mktemp -d); tar xzf "$SRC" -C "$tmp"; SRC=$(echo "$tmp"/llama_cpp_python-*/vendor/llama.cpp)
fi
[[ -f $SRC/CMakeLists.txt && -f $SRC/common/speculative.cpp ]] || { echo "not a llama.cpp tree: $SRC" >&2; exit 1; }
mkdir -p .carry
out=.carry/$NAME.tar.gz
tar czf "$out" -C "$(dirname "$SRC")" --transform "s|^$(basename "$SRC")|$NAME|" \
  --exclude="$(basename "$SRC")/models" --exclude="$(basename "$SRC")/docs" --exclude="$(basename "$SRC")/media" \
  --exclude="$(basename "$SRC")/tests" --exclude="$(basename "$SRC")/examples" --exclude="$(basename "$SRC")/pocs" \
  --exclude="$(basename "$SRC")/benches" --exclude="$(basename "$SRC")/gguf-py" \
  --exclude="$(basename "$SRC")/conversion" --exclude="$(basename "$SRC")/tools/ui/src" \
  --exclude="$(basename "$SRC")/tools/ui/tests" \
  $(for b in vulkan sycl metal opencl cann hexagon webgpu openvino et virtgpu musa zdnn kompute; do
      echo "--exclude=$(basename "$SRC")/ggml/src/ggml-$b"; done) \
  "$(basename "$SRC")"
ls -l "$out" | awk '{printf "%s: %.1f MB\n", $NF, $5 / 1048576}'
