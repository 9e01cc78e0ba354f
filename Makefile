# Builds llamacmp/lib/libcmpkern.so from cuda_src/ with nvcc.
#   make                 for the GPU(s) present only (tools/cuda_archs.sh), one job per core; no GPU: nothing to
#                        build, llamacmp runs on the numpy backend
#   make all-archs       every architecture this nvcc supports (CUDA 13: sm_75..sm_90; CUDA 12: sm_61..sm_90): CI
#   make CUDA_ARCH=70    one arch (e.g. a CUDA 12 nvcc on a CMP 100-210 rig); NVCC=path picks the compiler
#   make ptx70           sm_70 SASS + compute_70 PTX via clang 19 where only CUDA 13 is installed: tools/build_sm70.sh
#   make test            the test suite (GPU tests run only where a GPU is present)
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
SRC       := $(wildcard cuda_src/*.cu)
HDR       := $(wildcard cuda_src/*.h cuda_src/*.cuh)
LIB       := llamacmp/lib/libcmpkern.so
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
export NVCC

# `make` and `make all-archs` pick the architectures (tools/cuda_archs.sh), then build `lib` in a sub-make with
# one job per core unless the command line gave -j.
define build_for
	+@archs=$$(tools/cuda_archs.sh $(1)) || exit 1; \
	[ -n "$$archs" ] || exit 0; \
	case " $(MAKEFLAGS) " in *" -j"*|*jobserver*) jobs= ;; *) jobs=-j$(JOBS) ;; esac; \
	$(MAKE) --no-print-directory $$jobs lib ARCHS="$$archs"
endef

ifeq ($(CUDA_ARCH),)
all:
	$(call build_for,native)
else
all:
	@$(MAKE) --no-print-directory lib ARCHS="$(CUDA_ARCH)"
endif

all-archs:
	$(call build_for,all)

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
	$(NVCC) -shared -Xcompiler -fPIC -o $(LIB) $(OBJ)

$(OBJDIR)/%.o: cuda_src/%.cu $(HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

ptx70:
	bash tools/build_sm70.sh

test:
	python3 -m pytest -q

clean:
	rm -rf $(LIB) build/obj-*

.PHONY: all all-archs lib test clean ptx70
