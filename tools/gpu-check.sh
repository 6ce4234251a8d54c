#!/bin/bash
# tools/gpu-check.sh - the CUDA backend on a machine with an NVIDIA GPU: build, check every kernel and the
# whole forward pass against the CPU, then benchmark (kernels, the backend's forward pass, and `llm bench`).
#
#   tools/gpu-check.sh            (from anywhere; STB_INC: where stb/stb_ds.h is, .deps when it exists, as on
#                                  the device machine; TESTDATA: the test data, testdata/ (carry
#                                  testdata/models there: its generated models are not in git, and the device
#                                  machine has no pip)
#   BASELINE=DIR tools/gpu-check.sh   also builds the version in DIR (its llm.h, llm.cu, main.c, Makefile) and
#                                  runs its `llm bench` beside ours, alternating, on the same GPU in the same
#                                  call
# With torch and transformers there (the device machine has both), transformers' generate() on the same shapes
# is the yardstick. Prints everything to stdout and saves the same in $LOG_DIR/DATE-GPU-gpu-check.log
# (LOG_DIR: $OUT when set, as on the device machine, else results/). Exit status: the checks' (0: all passed).
set -u -o pipefail
cd "$(dirname "$0")/.."
DEPS=.deps
STB_INC=${STB_INC:-$([ -d $DEPS/stb ] && echo $DEPS || echo /usr/include)}
TESTDATA=${TESTDATA:-testdata}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z ' 'a-z-' |
      sed 's/[^a-z0-9-]//g; s/^nvidia-//')
LOG_DIR=${LOG_DIR:-${OUT:-results}}
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/$(date +%Y-%m-%d)-${GPU:-gpu}-gpu-check.log"
exec > >(tee "$LOG") 2>&1

echo "== $(date -u '+%Y-%m-%d %H:%M UTC') $(git rev-parse --short HEAD 2>/dev/null) + working tree; log: $LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm --format=csv 2>&1
nvcc --version | tail -1

echo "== build"
make CUDA=1 STB_INC="$STB_INC" llm llm_cuda.o 2>&1 || { echo "BUILD FAILED"; exit 1; }

echo "== GPU checks and kernel / forward benchmarks (test-gpu)"
# among them, per quantized type (q4_0 ... q6_K): the device's dequantization bit for bit against the CPU's,
# the decode GEMV (M 1-8) and the dequantizing GEMM (M 37, 128) against double loops ("quant TYPE ..." lines);
# per random-quant-*.gguf: logits against the CPU's exact path, and greedy ids against float64's
# ("forward random-quant-...", "quant greedy ..." lines)
LLM_GPU_BENCH=1 timeout 420 make CUDA=1 STB_INC="$STB_INC" TESTDATA="$TESTDATA" test-gpu |
    tee /tmp/gpu-check-tests.$$
status=$?
echo "test-gpu exit status: $status"
echo "-- the quantized checks again, in one place:"
grep -E '^(quant |forward random-quant|FAIL .*quant)' /tmp/gpu-check-tests.$$; rm -f /tmp/gpu-check-tests.$$

if [ -n "${BASELINE:-}" ]; then
    echo "== baseline build: $BASELINE"
    make -C "$BASELINE" CUDA=1 STB_INC="$(realpath "$STB_INC")" llm >/dev/null 2>&1 ||
        { echo "BASELINE BUILD FAILED"; BASELINE=; }
fi
# the progress line is rewritten in place with \r: keep only the report
bench() { timeout ${BENCH_TIMEOUT:-150} "$1" bench --dummy "$2" --num-prompts ${NUM_PROMPTS:-256} 2>&1 |
          tr '\r' '\n' | grep -v '^\[bench\]' || echo "$1 bench --dummy $2: exit $?"; }
# decode on quantized files, the GPU (weights kept in their blocks) beside the CPU: one sequence (each step a
# GEMV per matrix) and 32 at once (the dequantizing GEMM)
qbench() { timeout ${BENCH_TIMEOUT:-150} ./llm bench -m "$@" 2>&1 | tr '\r' '\n' | grep -v '^\[bench\]' ||
           echo "./llm bench -m $*: exit $?"; }
smol=models/SmolLM2-135M-Instruct.Q4_1.gguf
echo "== llm bench on quantized files (decode; GPU, then --cpu)"
for model in "$TESTDATA/models/random-quant-q4_k_m.gguf" "$smol"; do
    [ -f "$model" ] || { echo "-- $model: not there, skipped"; continue; }
    for n in 1 32; do
        for dev in gpu cpu; do
            flag=; [ $dev = cpu ] && flag=--cpu
            echo "-- ./llm bench -m $model --num-prompts $n --input-len 32:32 --output-len 256:256 $flag"
            qbench "$model" --num-prompts $n --input-len 32:32 --output-len 256:256 $flag
        done
    done
done
echo "== llm bench (engine end to end, GPU)"
for model in tinyllama-1.1b llama-3.2-1b; do
    echo "-- ./llm bench --dummy $model"
    bench ./llm $model
    if [ -n "${BASELINE:-}" ]; then
        echo "-- baseline $BASELINE/llm bench --dummy $model"; bench "$BASELINE/llm" $model
    fi
done
if python3 -c 'import torch, transformers' 2>/dev/null; then
    echo "== the yardstick: transformers' generate() on the same shapes (tools/torch_generate.py)"
    for model in tinyllama-1.1b llama-3.2-1b; do
        timeout 150 python3 tools/torch_generate.py $model 2>&1 | grep '^torch generate' ||
            echo "tools/torch_generate.py $model: exit $?"
    done
    echo "== the GEMM's yardstick: torch.matmul on llama-3.2-1b's shapes (tools/torch_matmul.py; ours: the" \
         "gemm-best"
    echo "   lines of test-gpu above)"
    timeout 150 python3 tools/torch_matmul.py 2>&1 | grep '^torch' || echo "tools/torch_matmul.py: exit $?"
fi
exit $status
