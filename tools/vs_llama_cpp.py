#!/usr/bin/env python3
"""tools/vs_llama_cpp.py - llm's CPU speed against llama.cpp's, side by side: pp512 and tg128 for each model
file and thread count, in alternating pairs (llm, then llama.cpp, then llm ...), and the median of the pairs'
ratios llm / llama.cpp. Only ratios mean something on a shared, noisy machine: each pair runs back to back.

    python3 tools/vs_llama_cpp.py --llama-bench DIR/llama-bench --pairs 3 --threads 1,2 MODEL.gguf ...

llm:       OMP_NUM_THREADS=T ./llm bench -m F --cpu --num-prompts 1 --input-len 512:512 --output-len 1:1
           (its "prompt processing" line), and --input-len 1:1 --output-len 128:128 (its "decode" line)
llama.cpp: llama-bench -m F -t T -p 512 -n 0 -r 1 -o csv, and -p 0 -n 128
Each runs a warmup first, left out of its figures (llama-bench's warmup run; llm bench's warmup request).

With a quantized KV cache, both with the same type, decoding after a prompt of D tokens:

    python3 tools/vs_llama_cpp.py --llama-bench DIR/llama-bench --cache-type q8_0 --depth 512 MODEL.gguf

llm:       --kv-cache-dtype q8_0, and tg128's prompt D tokens (--input-len D:D; its "decode" line is the steps
           after the prompt's)
llama.cpp: -ctk q8_0 -ctv q8_0 -fa on (its quantized V cache needs flash attention) and -d D (tg128 @ dD)

Building llama.cpp at its best on the machine at hand (the yardstick; never a dependency): its source ships in
PyPI's source package llama-cpp-python (0.3.36: a 2026 llama.cpp in vendor/llama.cpp):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && \\
        tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \\
          -DGGML_BMI2=ON -DLLAMA_CURL=OFF      # AVX2-only CPUs
    # where /proc/cpuinfo shows avx512f, avx512_vnni (and avx_vnni), add:
    #     -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX_VNNI=ON
    # where it shows amx_tile and amx_int8 (Sapphire Rapids on; llm's prompts use AMX there), add
    #     -DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON  and build with clang (CC=clang CXX=clang++ cmake ...): built
    # by GCC 12 its AMX kernels die of SIGILL at their first tile instruction (GCC 12's _tile_loadconfig tells
    # the compiler it reads 8 of the config's 64 bytes, and the stores of the rest are dropped)
    cmake --build build -j --target llama-bench llama-quantize

The model files: llama-quantize --allow-requantize models/SmolLM2-135M-Instruct.Q4_1.gguf OUT.gguf TYPE, for
TYPE in F16, BF16, Q8_0, Q4_K_M (the issue's table).
"""
import argparse, csv, io, os, re, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
LLM = os.path.join(HERE, "..", "llm")


def run(cmd, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return p.stdout + p.stderr


def llm_rate(model, threads, test, cache, depth):
    d = max(depth, 1)
    args = ["--input-len", "512:512", "--output-len", "1:1"] if test == "pp512" else \
           ["--input-len", "%d:%d" % (d, d), "--output-len", "128:128"]
    if cache != "f16":
        args += ["--kv-cache-dtype", cache]
    out = run([LLM, "bench", "-m", model, "--cpu", "--num-prompts", "1"] + args, threads)
    line = "prompt processing" if test == "pp512" else "decode"
    m = re.search(r"^%s: ([0-9.]+) tok/s" % line, out, re.M)
    if not m:
        sys.exit("no '%s' line in llm bench's output:\n%s" % (line, out))
    return float(m.group(1))


def llama_rate(bench, model, threads, test, cache, depth):
    pn = ["-p", "512", "-n", "0"] if test == "pp512" else ["-p", "0", "-n", "128", "-d", str(depth)]
    if cache != "f16":
        pn += ["-ctk", cache, "-ctv", cache, "-fa", "on"]
    out = run([bench, "-m", model, "-t", str(threads), "-r", "1", "-o", "csv"] + pn, threads)
    rows = list(csv.DictReader(io.StringIO(out[out.index("build_commit"):])))
    return float(rows[-1]["avg_ts"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cache-type", default="f16", choices=["f16", "q8_0", "q4_0"])
    ap.add_argument("--depth", type=int, default=0, help="tg128 after a prompt of this many tokens")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    print("KV cache %s, both" % a.cache_type)
    print("| file | threads | test | llm tok/s (pairs) | llama.cpp tok/s (pairs) | ratio, median |")
    print("|---|---|---|---|---|---|")
    for model in a.models:
        for t in threads:
            for test in ("pp512", "tg128" if a.depth == 0 else "tg128@d%d" % a.depth):
                ours, theirs = [], []
                for _ in range(a.pairs):
                    ours.append(llm_rate(model, t, test, a.cache_type, a.depth))
                    theirs.append(llama_rate(a.llama_bench, model, t, test, a.cache_type, a.depth))
                ratio = statistics.median(o / l for o, l in zip(ours, theirs))
                print("| %s | %d | %s | %s | %s | %.2fx |" % (
                    os.path.basename(model), t, test, " ".join("%.1f" % x for x in ours),
                    " ".join("%.1f" % x for x in theirs), ratio), flush=True)


if __name__ == "__main__":
    main()
