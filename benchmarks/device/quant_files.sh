#!/bin/bash
# The real-shape 9B / 27B benchmark files in Q4_K_M, Q6_K and IQ4_XS (issue 18), made on the GPU machine: the fixture
# writer's random F16 file with the real shapes and the real vocabulary, streamed to disk there, then quantized by
# llama.cpp's own llama-quantize (b8462 tree, 49bfddeca).
#
#   bash benchmarks/device/quant_files.sh SHAPE [TYPE ...]      SHAPE 9b | 27b; TYPEs default Q4_K_M Q6_K IQ4_XS
#
# Writes $QF/m<SHAPE>-<TYPE>.gguf (QF default /tmp/qf), each step's log beside it and a timeline in $QF/progress.log.
# A file already there is kept (delete it to remake it). One call is at most 10 minutes and the 27B source alone
# takes several: start it in the background and poll progress.log across warm calls, e.g.
#   run: setsid nohup bash benchmarks/device/quant_files.sh 9b > /tmp/qf.out 2>&1 & sleep 500; cat /tmp/qf/progress.log
#
# Needs, in the repository copy sent to the device (git-ignored, so prepare them here):
#   llama-quantize: $LLAMA_QUANTIZE, else .carry/llama-quantize.xz (here: compat/build_llamacpp.sh --portable, then
#     xz -c ~/.cache/llamacmp/llama.cpp-49bfddeca/build-portable/bin/llama-quantize > .carry/llama-quantize.xz;
#     1.7 MB; it needs glibc >= 2.36 there and quantizes byte for byte as the native build does), else it is built
#     there from .carry/llama.cpp-src.tar.gz (CPU only, every core; a minute or two)
#   the real vocabulary: .carry/vocab/qwen35_vocab_v1_*.pkl (or $LLAMACMP_CACHE holding one); .carry/site (gguf)
# Space: the F16 source is 17.9 GB (9B) / 53.8 GB (27B); it goes to /dev/shm when that has room, else beside the
# outputs, and is deleted at the end (KEEP_SRC=1 keeps it). Outputs, roughly: 9B 5.6 / 7.4 / 5.0 GB, 27B 16.5 / 22 /
# 14.7 GB (Q4_K_M / Q6_K / IQ4_XS). One H200 has a 64 GiB disk: the 27B source cannot sit on it beside its outputs,
# and all six files do not fit at once: make 27B's types one or two at a time there, or take a larger machine.
set -euo pipefail
R=$(cd "$(dirname "$0")/../.." && pwd)
SHAPE=${1:?usage: quant_files.sh 9b|27b [TYPE ...]}; shift
TYPES=${*:-Q4_K_M Q6_K IQ4_XS}
# (another writer shape, e.g. small, makes a sub-GB file: a quick check of the script itself)
case "$SHAPE" in 9b) SRC_GB=18 ;; 27b) SRC_GB=54 ;; *) SRC_GB=1 ;; esac
QF=${QF:-/tmp/qf}; mkdir -p "$QF"
export PYTHONPATH=$R/.carry/site:$R PYTHONUNBUFFERED=1
T0=$(date +%s); st() { echo "$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s $SHAPE $*" | tee -a "$QF/progress.log"; }
free_gb() { df -BG --output=avail "$1" | tail -1 | tr -dc 0-9; }

runs() { "$1" --help > /dev/null 2>&1; [[ $? -le 1 ]]; }      # its usage text exits 1; a missing library 127

quantize_tool() {
    if [[ -n "${LLAMA_QUANTIZE:-}" ]]; then echo "$LLAMA_QUANTIZE"; return; fi
    local bin=/tmp/lq/llama-quantize
    if [[ ! -x $bin && -f $R/.carry/llama-quantize.xz ]]; then
        mkdir -p /tmp/lq && xz -dc "$R/.carry/llama-quantize.xz" > $bin && chmod +x $bin
        # the portable build needs glibc >= 2.36 (libstdc++'s random_device uses arc4random)
        runs $bin || { echo "the carried llama-quantize does not run here; building one" >&2; rm -f $bin; }
    fi
    if [[ ! -x $bin ]]; then
        [[ -f $R/.carry/llama.cpp-src.tar.gz ]] || { echo "no llama-quantize: set LLAMA_QUANTIZE or carry" \
            ".carry/llama-quantize.xz or .carry/llama.cpp-src.tar.gz" >&2; exit 1; }
        mkdir -p /tmp/lq/src && tar xzf "$R/.carry/llama.cpp-src.tar.gz" -C /tmp/lq/src
        local tree; tree=$(dirname "$(ls /tmp/lq/src/*/CMakeLists.txt | head -1)")
        cmake -S "$tree" -B /tmp/lq/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_COMMIT=49bfddeca -DLLAMA_BUILD_NUMBER=8462 \
            > "$QF/build.log" 2>&1
        cmake --build /tmp/lq/build --target llama-quantize -j "$(nproc)" >> "$QF/build.log" 2>&1
        cp /tmp/lq/build/bin/llama-quantize $bin
    fi
    runs $bin || { echo "$bin does not run here" >&2; exit 1; }
    echo $bin
}

vocab_cache() {
    local p; p=$(ls "$R"/.carry/vocab/qwen35_vocab_v1_*.pkl 2>/dev/null | head -1 || true)
    echo "${p:-${LLAMACMP_CACHE:-$HOME/.cache/llamacmp}}"
}

LQ=$(quantize_tool); st "llama-quantize: $LQ"
todo=""; for t in $TYPES; do [[ -f $QF/m$SHAPE-$t.gguf ]] || todo="$todo $t"; done
[[ -n $todo ]] || { st "all there: $TYPES"; exit 0; }
SRC_DIR=$QF; [[ $(free_gb /dev/shm) -gt $(( SRC_GB + 4 )) ]] && SRC_DIR=/dev/shm
SRC=$SRC_DIR/m$SHAPE-f16.gguf
if [[ ! -f $SRC ]]; then
    [[ $(free_gb "$SRC_DIR") -gt $SRC_GB ]] || { st "no room for the ${SRC_GB} GB source in $SRC_DIR"; exit 1; }
    st "writing $SRC"
    python3 -m llamacmp.fixtures.writer "$SRC.tmp" --shape "$SHAPE" --type f16 --vocab qwen35 \
        --vocab-cache "$(vocab_cache)" > "$QF/m$SHAPE-f16.log" 2>&1
    mv "$SRC.tmp" "$SRC"; st "source $(du -h "$SRC" | cut -f1)"
fi
for t in $todo; do
    out=$QF/m$SHAPE-$t.gguf
    need=$(( SRC_GB * 45 / 100 + 1 ))       # Q6_K, the largest of the three, is ~41% of the F16 source
    [[ $(free_gb "$QF") -ge $need ]] || { st "no room for $t in $QF (needs ~$need GB, $(free_gb "$QF") GB free)"; exit 1; }
    st "quantizing $t (disk free $(free_gb "$QF") GB)"
    "$LQ" "$SRC" "$out.tmp" "$t" "$(nproc)" > "$QF/m$SHAPE-$t.log" 2>&1 || { st "FAILED $t: see $QF/m$SHAPE-$t.log"; exit 1; }
    mv "$out.tmp" "$out"; st "done $t $(du -h "$out" | cut -f1)"
done
[[ "${KEEP_SRC:-0}" == 1 ]] || { rm -f "$SRC"; st "removed the source"; }
st "finished:$todo"
