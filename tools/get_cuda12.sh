#!/usr/bin/env bash
# A real CUDA 12.4 nvcc (targets sm_61 and sm_70, which CUDA 13 dropped) for a machine that has only CUDA 13 or no
# toolkit, without root and without touching the system's apt configuration:
#   - nvcc, cicc, cudafe++, ptxas, fatbinary, nvlink, cuobjdump, nvdisasm: Debian's `nvidia-cuda-toolkit` package
#     (12.4.1, the trixie suite's non-free component, fetched with `apt-get download` through a private apt state
#     that reuses this machine's Debian mirror and archive keyring); its ~900 MB `nvidia-cuda-dev` is not needed:
#   - headers: PyPI's CUDA 12.4 wheels (one `pip install --target` call); libraries (libcudart_static.a and
#     libcudadevrt.a, which nvcc links by default, libcudart.so.12): the 12.9.79 runtime wheel, since 12.4's has
#     only the .so (CUDA 12 minor-version compatibility: a 12.9 runtime runs on every 12.x driver, >= 525).
#
#   tools/get_cuda12.sh                  -> build/cuda12/bin/nvcc     (prints the path last)
#   make NVCC=build/cuda12/bin/nvcc CUDA_ARCH=61
# Environment: CUDA12_DIR (default build/cuda12), DEBIAN_MIRROR (default: the Debian mirror apt already uses here),
# CUDA12_SUITE (default trixie). Host compiler: the g++ on PATH (CUDA 12.4 takes gcc <= 13).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${CUDA12_DIR:-build/cuda12}
WORK=$DIR-download
SUITE=${CUDA12_SUITE:-trixie}
WHEELS=(nvidia-cuda-nvcc-cu12==12.4.131 nvidia-cuda-runtime-cu12==12.4.127 nvidia-cuda-cccl-cu12==12.4.127.post1)
LIB_WHEEL=nvidia-cuda-runtime-cu12==12.9.79
die() { echo "get_cuda12: $*" >&2; exit 1; }

if [ -x "$DIR/bin/nvcc" ] && "$DIR/bin/nvcc" --version 2>/dev/null | grep -q "release 12\."; then
    echo "$DIR/bin/nvcc"; exit 0
fi
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
    || die "needs apt-get and dpkg-deb (a Debian-based system); elsewhere install NVIDIA's CUDA 12.x toolkit"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$KEYRING" ] || die "no $KEYRING (apt-get install debian-archive-keyring)"
MIRROR=${DEBIAN_MIRROR:-$(apt-get indextargets --format '$(ORIGIN) $(LABEL) $(REPO_URI)' 2>/dev/null \
    | awk '$1 == "Debian" && $2 == "Debian" {print $3; exit}')}
[ -n "$MIRROR" ] || die "no Debian mirror in this machine's apt sources: set DEBIAN_MIRROR=URI"

# ---- Debian's nvidia-cuda-toolkit, through a private apt state (the system's sources and lists stay as they are) --
APT=$(realpath -m "$WORK/apt")
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$WORK/debs"
echo "deb [signed-by=$KEYRING] $MIRROR $SUITE non-free" > "$APT/sources.list"
OPTS=(-q -o "Dir::Etc::SourceList=$APT/sources.list" -o Dir::Etc::SourceParts=/nonexistent
      -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o APT::Sandbox::User=root)
apt-get "${OPTS[@]}" update >/dev/null || die "apt-get update of $MIRROR $SUITE non-free failed"
version=$(apt-cache "${OPTS[@]}" policy nvidia-cuda-toolkit | sed -n 's/ *Candidate: //p')
case $version in     # the PyPI headers below are 12.4's: they must match the compiler's front end
    12.4.*) ;;
    *) die "$SUITE non-free has nvidia-cuda-toolkit '$version', not the 12.4 whose headers this script takes" ;;
esac
(cd "$WORK/debs" && rm -f ./*.deb && apt-get "${OPTS[@]}" download nvidia-cuda-toolkit >/dev/null) \
    || die "apt-get download nvidia-cuda-toolkit failed"
rm -rf "$WORK/deb" && mkdir -p "$WORK/deb"
dpkg-deb -x "$WORK"/debs/nvidia-cuda-toolkit_*.deb "$WORK/deb"

# ---- PyPI's CUDA 12.4 headers and runtime (one call: a second into the same target skips the shared nvidia/) -------
rm -rf "$WORK/pypi"
python3 -m pip install -q --disable-pip-version-check --no-deps --target "$WORK/pypi" "${WHEELS[@]}" \
    || die "pip install of ${WHEELS[*]} failed"
python3 -m pip download -q --disable-pip-version-check --no-deps -d "$WORK/libs" "$LIB_WHEEL" \
    || die "pip download of $LIB_WHEEL (for libcudart_static.a) failed"
python3 -m zipfile -e "$WORK"/libs/*.whl "$WORK/libs/x"

# ---- the layout nvcc expects: bin/ (+ nvcc.profile), nvvm/bin/cicc, nvvm/libdevice, include/, lib64/ ----------------
D=$WORK/deb/usr; NV=$WORK/pypi/nvidia
rm -rf "$DIR" && mkdir -p "$DIR/bin/crt" "$DIR/nvvm/bin" "$DIR/nvvm/libdevice" "$DIR/include" "$DIR/lib64"
cp "$D/lib/nvidia-cuda-toolkit/bin/nvcc" "$D/lib/nvidia-cuda-toolkit/bin/cicc" "$DIR/bin/"
mv "$DIR/bin/cicc" "$DIR/nvvm/bin/"
cp "$D/lib/nvidia-cuda-toolkit/bin/crt/"*.stub "$DIR/bin/crt/"
for t in cudafe++ ptxas fatbinary nvlink bin2c cuobjdump nvdisasm nvprune; do cp "$D/bin/$t" "$DIR/bin/"; done
cp "$D/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc" "$DIR/nvvm/libdevice/"
cp -r "$NV/cuda_runtime/include/." "$NV/cuda_nvcc/include/." "$NV/cuda_cccl/include/." "$DIR/include/"
rm -rf "$DIR/include/__init__.py" "$DIR/include/__pycache__"
cp "$WORK"/libs/x/nvidia/cuda_runtime/lib/lib* "$DIR/lib64/"
ln -sf libcudart.so.12 "$DIR/lib64/libcudart.so"
cat > "$DIR/bin/nvcc.profile" <<'EOF'
TOP                = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH              += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES          +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES          =+ $(_SPACE_) "-L$(TOP)/lib64"
EOF
"$DIR/bin/nvcc" --version | grep -q "release 12\." || die "the assembled $DIR/bin/nvcc does not run"
rm -rf "$WORK"
echo "get_cuda12: nvcc $version from Debian $SUITE non-free, headers and cudart from PyPI, in $DIR" >&2
echo "$DIR/bin/nvcc"
