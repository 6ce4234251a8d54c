# make            builds llm and llm-test (llm.cu too, with nvcc, when nvcc is on the PATH; make CUDA=0 skips it)
# make test       builds and runs the tests (CPU backend; SANITIZE=1 under AddressSanitizer + UBSan)
# make test-gpu   builds the tests with the CUDA backend and runs the GPU kernel checks (needs a GPU)
CC       ?= cc
NVCC     ?= nvcc
STB_INC  ?= /usr/include
CFLAGS   ?= -O3 -g
CFLAGS   += -Wall -Wextra -std=gnu11 -fopenmp -I$(STB_INC) -I.
LDLIBS   += -lm -lpthread
SHARED   ?= ../shared

HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)
ifeq ($(SANITIZE),1)
  CUDA     = 0
  # shift checks off: stb_ds.h hashes 8-byte keys with (byte << 24) on int, which UBSan flags inside stb_ds
  SAN      = -fsanitize=address,undefined -fno-sanitize=shift -fno-sanitize-recover=undefined
  CFLAGS  += -O1 -fno-omit-frame-pointer $(SAN)
  LDFLAGS += $(SAN)
endif
CUDA ?= $(if $(HAVE_NVCC),1,0)

# Hopper (sm_90a: wgmma, TMA) plus portable PTX so other GPUs can JIT it
CUDA_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=compute_80
ifeq ($(CUDA),1)
  CUDA_HOME  ?= $(patsubst %/bin/,%,$(dir $(HAVE_NVCC)))
  CUDA_DEFS   = -DLLM_CUDA
  CUDA_OBJ    = llm_cuda.o
  CUDA_LIBS   = -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
endif

all: llm llm-test llm-example

llm: main.c llm.h $(CUDA_OBJ)
	$(CC) $(CFLAGS) $(CUDA_DEFS) -o $@ main.c $(CUDA_OBJ) $(LDFLAGS) $(LDLIBS) $(CUDA_LIBS)

llm-test: test.c llm.h
	$(CC) $(CFLAGS) -o $@ test.c $(LDFLAGS) $(LDLIBS)

# the example of llm.h's docs block, compiled as it stands there (the tests run it)
llm-example: llm.h
	sed -n '/^#if 0 \/\* LLM_EXAMPLE/,/^#endif \/\* LLM_EXAMPLE/p' llm.h | sed '1d;$$d' | \
	    $(CC) $(CFLAGS) -x c -o $@ - $(LDFLAGS) $(LDLIBS)

test: llm llm-test llm-example
	./llm-test $(SHARED)

llm_cuda.o: llm.cu llm.h
	$(NVCC) -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -fopenmp -I$(STB_INC) -I. -DLLM_CUDA -c -o $@ llm.cu

test-gpu: test.c llm.h llm_cuda.o
	$(CC) $(CFLAGS) -DLLM_CUDA -o $@ test.c llm_cuda.o $(LDFLAGS) $(LDLIBS) $(CUDA_LIBS)
	./test-gpu --gpu $(SHARED)

.PHONY: all test test-gpu clean

clean:
	rm -f llm llm-test llm-example test-gpu llm_cuda.o
