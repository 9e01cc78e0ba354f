# Builds llamacmp/lib/libcmpkern.so from cuda_src/.
#   make                 for the GPU(s) present only, one job per core; no GPU: nothing to build, llamacmp runs on
#                        the numpy backend
#   make all-archs       every architecture this nvcc supports (CUDA 13: sm_75..sm_90; CUDA 12: sm_61..sm_90): CI
#   make CUDA_ARCH=70    one arch (e.g. a CMP 100-210 rig); NVCC=path picks the compiler
#   make ptx61, ptx70    build/sm61 (sm70)/libcmpkern.so: that arch's SASS + PTX, to test the old cards' build (the
#                        suite runs it on a newer GPU through the driver's JIT: LLAMACMP_LIB=build/sm61/libcmpkern.so)
#   make device-lib      build/lean90/libcmpkern.so: sm_90 SASS only, no line info (~16 MB instead of 49), small enough
#                        to carry to the lent H200 (benchmarks/device/README.md) instead of building it there
#   make test            the test suite (GPU tests run only where a GPU is present)
# tools/cuda_archs.sh picks the route: NVCC if it can target the archs; else a CUDA 12.x nvcc (/usr/local/cuda-12*,
# or build/cuda12 from tools/get_cuda12.sh); else clang 19 (tools/build_clang_cuda.sh); else it says what to install.
# CUDA 13 dropped sm_61 and sm_70. CUDA_ROUTE=nvcc|clang forces one.
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
SRC       := $(wildcard cuda_src/*.cu)
HDR       := $(wildcard cuda_src/*.h cuda_src/*.cuh)
LIB       := llamacmp/lib/libcmpkern.so
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
export NVCC

# `make`, `make all-archs`, `make CUDA_ARCH=N` and `make ptxN` ask tools/cuda_archs.sh for the route and the
# architectures ($(1)), then build the library $(2) in a sub-make, nvcc with one job per core unless -j was given.
define build_for
	+@out=$$(tools/cuda_archs.sh $(1)) || exit 1; set -- $$out; \
	[ $$# -gt 0 ] || exit 0; route=$$1; shift; \
	case " $(MAKEFLAGS) " in *" -j"*|*jobserver*) jobs= ;; *) jobs=-j$(JOBS) ;; esac; \
	if [ "$$route" = clang ]; then $(MAKE) --no-print-directory clang-lib ARCHS="$$*" LIB=$(2); \
	else $(MAKE) --no-print-directory $$jobs lib ARCHS="$$*" NVCC="$$route" LIB=$(2); fi
endef

ifeq ($(CUDA_ARCH),)
all:
	$(call build_for,native,$(LIB))
else
all:
	$(call build_for,$(CUDA_ARCH),$(LIB))
endif

all-archs:
	$(call build_for,all,$(LIB))

ptx61 ptx70:
	$(call build_for,$(@:ptx%=%),build/$(@:ptx%=sm%)/libcmpkern.so)

# SASS for every arch plus PTX for the newest, so newer GPUs JIT from it.
LAST     := $(lastword $(ARCHS))
GENCODE  := $(foreach a,$(ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) -gencode arch=compute_$(LAST),code=compute_$(LAST)
NVFLAGS  := -O3 -std=c++17 -Xcompiler -fPIC -lineinfo --use_fast_math -Xptxas -O3 $(GENCODE)
# One object per kernel file (so the jobs compile them in parallel), in a folder per arch set so that
# `make` and `make all-archs` never mix objects.
OBJDIR   := build/obj-$(subst $(eval) ,-,$(strip $(ARCHS)))
OBJ      := $(patsubst cuda_src/%.cu,$(OBJDIR)/%.o,$(SRC))

lib: $(OBJ)
	@[ -n "$(strip $(ARCHS))" ] || { echo "make lib needs ARCHS=...: use make, make all-archs or make CUDA_ARCH=N"; exit 1; }
	@mkdir -p $(dir $(LIB))
	@# -cudadevrt none: no kernel launches kernels, and tools/get_cuda12.sh's toolkit has no libcudadevrt.a;
	@# $(GENCODE): the device-link stub for our archs (else an empty cubin for nvcc's default arch, sm_52 in CUDA 12)
	$(NVCC) -shared -Xcompiler -fPIC -cudadevrt none $(GENCODE) -o $(LIB) $(OBJ)

$(OBJDIR)/%.o: cuda_src/%.cu $(HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

# clang 19 over PyPI's CUDA 12.9 pieces: the route where no nvcc can target $(ARCHS)
clang-lib:
	CLANG_CUDA_LIB=$(LIB) bash tools/build_clang_cuda.sh $(ARCHS)

# LEAN_OBJ: its objects' folder (benchmarks/device/carry_lib.sh names it by the cuda_src digest)
LEAN_OBJ ?= build/obj-90-lean
device-lib:
	$(MAKE) --no-print-directory -j$(JOBS) lib ARCHS=90 OBJDIR=$(LEAN_OBJ) LIB=build/lean90/libcmpkern.so \
	    GENCODE="-gencode arch=compute_90,code=sm_90" \
	    NVFLAGS="-O3 -std=c++17 -Xcompiler -fPIC --use_fast_math -Xptxas -O3 -gencode arch=compute_90,code=sm_90"

test:
	python3 -m pytest -q

clean:
	rm -rf $(LIB) build/obj-* build/clang-obj-* build/sm61 build/sm70 build/lean90

.PHONY: all all-archs lib test clean ptx61 ptx70 clang-lib device-lib
