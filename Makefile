# Builds llamacmp/lib/libcmpkern.so from cuda_src/ with nvcc.
#   make                 native build for the arches this nvcc supports (CUDA 13: sm_75..sm_90; CUDA 12: sm_70..sm_90)
#   make CUDA_ARCH=70    one arch (e.g. a CUDA 12 nvcc on a CMP 100-210 rig)
#   make ptx70           compute_70 PTX only (JIT-compiled by the driver), via clang 19: see tools/build_sm70.sh
#   make test            the test suite (GPU tests run only where a GPU is present)
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
SRC       := $(wildcard cuda_src/*.cu)
HDR       := $(wildcard cuda_src/*.h cuda_src/*.cuh)
LIB       := llamacmp/lib/libcmpkern.so

ifeq ($(NVCC),)
all:
	@echo "nvcc not found: skipping libcmpkern.so (llamacmp will use the numpy backend)"
else
NVCC_MAJOR := $(shell $(NVCC) --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
ifeq ($(CUDA_ARCH),)
  ifeq ($(shell test $(NVCC_MAJOR) -ge 13 && echo new),new)
    ARCHS := 75 80 86 89 90
  else
    ARCHS := 70 75 80 86 89 90
  endif
else
  ARCHS := $(CUDA_ARCH)
endif
# SASS for every arch plus PTX for the newest, so newer GPUs JIT from it.
LAST     := $(lastword $(ARCHS))
GENCODE  := $(foreach a,$(ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) -gencode arch=compute_$(LAST),code=compute_$(LAST)
NVFLAGS  := -O3 -std=c++17 -Xcompiler -fPIC -lineinfo --use_fast_math -Xptxas -O3 $(GENCODE)
# One object per kernel file (so `make -jN` compiles them in parallel), in a folder per arch set so that
# `make` and `make CUDA_ARCH=90` never mix objects.
OBJDIR   := build/obj-$(subst $(eval) ,-,$(ARCHS))
OBJ      := $(patsubst cuda_src/%.cu,$(OBJDIR)/%.o,$(SRC))

all: $(LIB)

$(OBJDIR)/%.o: cuda_src/%.cu $(HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

$(LIB): $(OBJ)
	@mkdir -p $(dir $@)
	$(NVCC) -shared -Xcompiler -fPIC -o $@ $(OBJ)
endif

ptx70:
	bash tools/build_sm70.sh

test:
	python3 -m pytest -q

clean:
	rm -rf $(LIB) build/obj-*

.PHONY: all test clean ptx70
