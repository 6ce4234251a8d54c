/* main.c - the llm command: one-shot generation, a REPL, tokenize, and the offline throughput benchmark.
 * Everything it does goes through the engine API of llm.h, the same one the server uses. */
#define LLM_IMPLEMENTATION
#include "llm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *usage =
    "usage:\n"
    "  llm -m MODEL.gguf -p PROMPT [-n N] [options]   write the prompt and its continuation to stdout\n"
    "  llm -m MODEL.gguf [options]                    REPL: each line you type is continued\n"
    "  llm tokenize -m MODEL.gguf [--no-bos] TEXT     print TEXT's token ids on one line\n"
    "  llm bench (-m MODEL.gguf | --dummy NAME) [options]  offline throughput, as vLLM's bench throughput\n"
    "\n"
    "generation options:\n"
    "  -m, --model PATH       GGUF model file\n"
    "  -p, --prompt TEXT      prompt (BOS is added when the vocabulary asks for it)\n"
    "  -n, --max-tokens N     tokens to generate (default 128; 0: until the context is full)\n"
    "  --temp T               temperature (default 0.8; 0 is greedy)\n"
    "  --top-k K              keep the K most likely tokens (default 40; 0 off)\n"
    "  --top-p P              keep the smallest set of tokens with probability mass P (default 0.95; 1 off)\n"
    "  --min-p P              keep tokens of probability >= P * the most likely one's (default 0.05; 0 off)\n"
    "  --repeat-penalty R     repetition penalty on prompt and output tokens (default 1 = off)\n"
    "  --presence-penalty X   (default 0)\n"
    "  --frequency-penalty X  (default 0)\n"
    "  --seed S               random seed (default: random); the same seed gives the same output\n"
    "  --ignore-eos           keep going past end-of-sequence tokens\n"
    "  --stop TEXT            stop before TEXT (may be given up to 16 times)\n"
    "  --ids                  print only the generated token ids, space-separated, on one line\n"
    "\n"
    "engine options (all modes):\n"
    "  --block-size N         KV cache block size in tokens (default 16)\n"
    "  --num-blocks N         KV pool size in blocks (default: from --kv-gib)\n"
    "  --kv-gib G             KV pool size in GiB\n"
    "  --kv-fraction F        KV pool as a fraction of the memory free after loading the weights\n"
    "                         (GPU default 0.9; CPU default: --max-num-seqs full contexts, 4 GiB at most)\n"
    "  --max-num-seqs N       sequences per step (default 256)\n"
    "  --max-num-batched-tokens N   token budget per step (default 2048)\n"
    "  --max-model-len N      context length (default: the model's)\n"
    "  --no-prefix-caching    turn automatic prefix caching off\n"
    "  --cpu                  run on the CPU even when a GPU is there\n"
    "\n"
    "bench options:\n"
    "  --dummy NAME           random weights of a real shape, no file (presets: %s)\n"
    "  --num-prompts N        requests (default 256)\n"
    "  --input-len MIN:MAX    prompt lengths, drawn uniformly (default 100:1024)\n"
    "  --output-len MIN:MAX   output lengths, drawn uniformly, EOS ignored (default 100:1024)\n"
    "  --seed S               workload seed (default 0)\n"
    "  --static               static batching: a batch is filled and no one joins until all in it finish\n";

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
    llm_engine_config engine;
    llm_sampling_params sampling;
    const char *prompt;
    int ids_only, no_bos;
    const char *stops[16];
    /* bench */
    int num_prompts, in_min, in_max, out_min, out_max;
    uint64_t bench_seed;
} args_t;

static int parse_range(const char *s, int *lo, int *hi) {
    char *end;
    long a = strtol(s, &end, 10), b;
    if (*end == ':') b = strtol(end + 1, &end, 10); else b = a;
    if (*end || a < 1 || b < a) return -1;
    *lo = (int)a; *hi = (int)b;
    return 0;
}

/* Returns the index of the first positional argument, or -1 after printing what is wrong. */
static int parse_args(int argc, char **argv, int start, args_t *a) {
    for (int i = start; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
        const char *v = has ? argv[i + 1] : NULL;
#define FLAG(name) (!strcmp(f, name))
#define NEED() do { if (!has) { fprintf(stderr, "llm: %s needs a value\n", f); return -1; } i++; } while (0)
        if (FLAG("-h") || FLAG("--help")) { printf(usage, llm_model_dummy_names()); exit(0); }
        else if (FLAG("-m") || FLAG("--model")) { NEED(); a->engine.model_path = v; }
        else if (FLAG("-p") || FLAG("--prompt")) { NEED(); a->prompt = v; }
        else if (FLAG("-n") || FLAG("--max-tokens")) { NEED(); a->sampling.max_tokens = atoi(v); }
        else if (FLAG("--temp")) { NEED(); a->sampling.temperature = (float)atof(v); }
        else if (FLAG("--top-k")) { NEED(); a->sampling.top_k = atoi(v); }
        else if (FLAG("--top-p")) { NEED(); a->sampling.top_p = (float)atof(v); }
        else if (FLAG("--min-p")) { NEED(); a->sampling.min_p = (float)atof(v); }
        else if (FLAG("--repeat-penalty")) { NEED(); a->sampling.repetition_penalty = (float)atof(v); }
        else if (FLAG("--presence-penalty")) { NEED(); a->sampling.presence_penalty = (float)atof(v); }
        else if (FLAG("--frequency-penalty")) { NEED(); a->sampling.frequency_penalty = (float)atof(v); }
        else if (FLAG("--seed")) {
            NEED();
            a->sampling.seed = strtoll(v, NULL, 10);
            a->bench_seed = strtoull(v, NULL, 10);
        }
        else if (FLAG("--ignore-eos")) a->sampling.ignore_eos = 1;
        else if (FLAG("--stop")) {
            NEED();
            if (a->sampling.n_stop == 16) { fprintf(stderr, "llm: at most 16 --stop strings\n"); return -1; }
            a->stops[a->sampling.n_stop++] = v;
        }
        else if (FLAG("--ids")) a->ids_only = 1;
        else if (FLAG("--no-bos")) a->no_bos = 1;
        else if (FLAG("--block-size")) { NEED(); a->engine.block_size = atoi(v); }
        else if (FLAG("--num-blocks")) { NEED(); a->engine.num_blocks = atoi(v); }
        else if (FLAG("--kv-gib")) { NEED(); a->engine.kv_bytes = (size_t)(atof(v) * (1 << 30)); }
        else if (FLAG("--kv-fraction")) { NEED(); a->engine.kv_fraction = atof(v); }
        else if (FLAG("--max-num-seqs")) { NEED(); a->engine.max_num_seqs = atoi(v); }
        else if (FLAG("--max-num-batched-tokens")) { NEED(); a->engine.max_num_batched_tokens = atoi(v); }
        else if (FLAG("--max-model-len")) { NEED(); a->engine.max_model_len = atoi(v); }
        else if (FLAG("--no-prefix-caching")) a->engine.enable_prefix_caching = 0;
        else if (FLAG("--cpu")) a->engine.create_backend = llm_cpu_backend_create;
        else if (FLAG("--dummy")) { NEED(); a->engine.dummy = v; }
        else if (FLAG("--num-prompts")) { NEED(); a->num_prompts = atoi(v); }
        else if (FLAG("--input-len") || FLAG("--output-len")) {
            NEED();
            int in = FLAG("--input-len");
            if (parse_range(v, in ? &a->in_min : &a->out_min, in ? &a->in_max : &a->out_max)) {
                fprintf(stderr, "llm: %s wants MIN:MAX\n", f);
                return -1;
            }
        }
        else if (FLAG("--static")) a->engine.static_batching = 1;
        else if (f[0] == '-' && f[1]) {
            fprintf(stderr, "llm: unknown option %s (see llm --help)\n", f);
            return -1;
        }
        else return i;
#undef FLAG
#undef NEED
    }
    a->sampling.stop = a->stops;
    return argc;
}

/* ---- one-shot generation and the REPL ---- */
static int generate(llm_engine *e, args_t *a, const char *prompt, int echo_prompt) {
    char err[LLM_ERR_LEN];
    double t0 = now_s();
    if (!llm_engine_add_request(e, prompt, NULL, 0, &a->sampling, NULL, err)) {
        fprintf(stderr, "llm: %s\n", err);
        return 1;
    }
    if (echo_prompt && !a->ids_only) { fputs(prompt, stdout); fflush(stdout); }
    double t_first = 0;
    int n_prompt = 0, n_gen = 0, first_id = 1, rc = 0;
    while (llm_engine_has_work(e)) {
        const llm_output *out;
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) {
            if (out[i].n_tokens && !t_first) t_first = now_s();
            n_prompt = out[i].n_prompt_tokens; n_gen = out[i].n_generated;
            for (int j = 0; a->ids_only && j < out[i].n_tokens; j++, first_id = 0)
                printf(first_id ? "%d" : " %d", out[i].token_ids[j]);
            if (!a->ids_only) fwrite(out[i].text, 1, (size_t)out[i].text_len, stdout);
            fflush(stdout);
            if (out[i].finish_reason == LLM_FINISH_ERROR) {
                fprintf(stderr, "\nllm: %s\n", out[i].error);
                rc = 1;
            }
        }
    }
    if (a->ids_only) printf("\n");
    double t1 = now_s();
    if (!t_first) t_first = t1;
    fprintf(stderr, "\nllm: prompt %d tokens, %.1f tok/s; generated %d tokens, %.1f tok/s\n", n_prompt,
            n_prompt / (t_first - t0 + 1e-9), n_gen, n_gen > 1 ? (n_gen - 1) / (t1 - t_first + 1e-9) : 0.0);
    return rc;
}

static int repl(llm_engine *e, args_t *a) {
    char line[8192];
    fprintf(stderr, "llm: type a prompt and press enter to continue it; an empty line or Ctrl-D quits\n");
    for (;;) {
        fprintf(stderr, "> ");
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\n")] = 0;
        if (!line[0]) break;
        generate(e, a, line, 0);  /* the line is on the screen already: print only its continuation */
        printf("\n");
    }
    return 0;
}

static int tokenize_cmd(args_t *a, const char *text) {
    char err[LLM_ERR_LEN];
    llm_gguf g;
    if (!a->engine.model_path) { fprintf(stderr, "llm tokenize: give -m MODEL.gguf\n"); return 1; }
    if (llm_gguf_open(&g, a->engine.model_path, err) != 0) { fprintf(stderr, "llm: %s\n", err); return 1; }
    llm_tokenizer *t = llm_tokenizer_load(&g, err);
    if (!t) { fprintf(stderr, "llm: %s\n", err); llm_gguf_close(&g); return 1; }
    size_t len = strlen(text);
    int cap = (int)len + 8;
    int32_t *ids = (int32_t *)malloc((size_t)cap * sizeof(int32_t));
    int n = llm_tokenize(t, text, len, a->no_bos ? 0 : llm_tokenizer_adds_bos(t), 1, ids, cap);
    for (int i = 0; i < n && i < cap; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids); llm_tokenizer_free(t); llm_gguf_close(&g);
    return n < 0;
}

/* ---- bench: offline throughput ---- */
static int bench(args_t *a) {
    char err[LLM_ERR_LEN];
    if (!a->engine.model_path && !a->engine.dummy) {
        fprintf(stderr, "llm bench: give -m MODEL.gguf or --dummy NAME\n");
        return 1;
    }
    double t_load = now_s();
    llm_engine *e = llm_engine_create(&a->engine, err);
    if (!e) { fprintf(stderr, "llm: %s\n", err); return 1; }
    const llm_model *m = llm_engine_model(e);
    llm_engine_stats st = llm_engine_get_stats(e);
    int bs = st.block_size, max_model_len = st.max_model_len;
    double kv_token_bytes = (double)st.kv_bytes_per_block / bs, mib = kv_token_bytes / (1 << 20);
    fprintf(stderr, "llm bench: %s on %s, loaded in %.2f s; KV pool %d blocks of %d tokens (%.1f MiB), %s "
            "batching\n", m->name, st.backend, now_s() - t_load, st.num_blocks, bs, st.num_blocks * bs * mib,
            a->engine.static_batching ? "static" : "continuous");

    /* the workload: uniform lengths from a fixed seed, so --static runs exactly the same requests */
    uint64_t rng = a->bench_seed * 0x9e3779b97f4a7c15ull + 12345;
    int64_t total_in = 0;
    int rejected = 0;
    double t0 = now_s();
    for (int r = 0; r < a->num_prompts; r++) {
        int in_len = a->in_min + (int)(llm_splitmix64(&rng) % (uint64_t)(a->in_max - a->in_min + 1));
        int out_len = a->out_min + (int)(llm_splitmix64(&rng) % (uint64_t)(a->out_max - a->out_min + 1));
        if (in_len >= max_model_len) in_len = max_model_len - 1;
        int32_t *ids = (int32_t *)malloc((size_t)in_len * sizeof(int32_t));
        if (!ids) { fprintf(stderr, "llm bench: out of memory\n"); llm_engine_destroy(e); return 1; }
        for (int i = 0; i < in_len; i++)
            ids[i] = (int32_t)(llm_splitmix64(&rng) % (uint64_t)m->cfg.vocab_size);
        llm_sampling_params p = llm_sampling_defaults();
        p.temperature = 0; p.ignore_eos = 1; p.max_tokens = out_len;
        if (llm_engine_add_request(e, NULL, ids, in_len, &p, NULL, err)) total_in += in_len;
        else { fprintf(stderr, "llm bench: request rejected: %s\n", err); rejected++; }
        free(ids);
    }
    int64_t total_out = 0, done = 0, failed = 0, samples = 0;
    double sum_usage = 0, sum_running = 0, sum_kv_tokens = 0, sum_blocks_used = 0, last_progress = 0;
    int peak_running = 0;
    while (llm_engine_has_work(e)) {
        const llm_output *out;
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) {
            total_out += out[i].n_tokens;
            done += out[i].finish_reason != LLM_FINISH_NONE;
            if (out[i].finish_reason == LLM_FINISH_ERROR && failed++ == 0)
                fprintf(stderr, "llm bench: %s\n", out[i].error);
        }
        st = llm_engine_get_stats(e);
        if (st.running > 0) { /* the memory picture, sampled at every step that has work */
            int used = st.num_blocks - st.num_free_blocks;
            sum_usage += (double)used / st.num_blocks; sum_blocks_used += used;
            sum_running += st.running; sum_kv_tokens += (double)st.kv_tokens; samples++;
            if (st.running > peak_running) peak_running = st.running;
        }
        double t = now_s();
        if (t - last_progress > 0.5) {
            fprintf(stderr, "\r[bench] %lld/%d done, %d running, %d waiting, KV %.0f%% used, %.0f tok/s   ",
                    (long long)done, a->num_prompts - rejected, st.running, st.waiting,
                    100.0 * (st.num_blocks - st.num_free_blocks) / st.num_blocks, total_out / (t - t0));
            last_progress = t;
        }
    }
    double elapsed = now_s() - t0;
    st = llm_engine_get_stats(e);
    fprintf(stderr, "\r%100s\r", "");
    printf("requests: %lld in %.2f s, %.2f requests/s\n", (long long)done, elapsed, done / elapsed);
    if (failed) printf("failed: %lld requests (the first error is above)\n", (long long)failed);
    printf("output throughput: %.1f tok/s\n", total_out / elapsed);
    printf("total throughput: %.1f tok/s (prompt %lld + output %lld tokens)\n",
           (total_in + total_out) / elapsed, (long long)total_in, (long long)total_out);
    printf("mean KV usage: %.1f%%, peak running: %d, steps: %lld, preemptions: %lld, prompt tokens computed: "
           "%lld\n", samples ? 100.0 * sum_usage / samples : 0.0, peak_running, (long long)st.steps,
           (long long)st.preemptions, (long long)st.prompt_tokens_computed);

    /* The waste table of the vLLM paper: reserving max_model_len contiguous slots per request against
     * paging. */
    double R = samples ? sum_running / samples : 0, T = samples ? sum_kv_tokens / samples : 0;
    double reserve_tokens = R * max_model_len, paged_tokens = (samples ? sum_blocks_used / samples : 0) * bs;
    double mean_len = done ? (double)(total_in + total_out) / done : 1;
    double pool_tokens = (double)st.num_blocks * bs;
    printf("\nKV cache memory, mean over steps (%.1f running requests holding %.0f tokens of K/V, %.3f MiB "
           "per 1k tokens):\n", R, T, kv_token_bytes * 1000 / (1 << 20));
    printf("  %-38s %12s %10s\n", "scheme", "memory MiB", "wasted");
    printf("  %-38s %12.1f %9.1f%%\n", "contiguous, max_model_len per request", reserve_tokens * mib,
           reserve_tokens > 0 ? 100.0 * (1 - T / reserve_tokens) : 0.0);
    char paged[64];
    snprintf(paged, sizeof paged, "paged, blocks of %d tokens", bs);
    printf("  %-38s %12.1f %9.1f%%\n", paged, paged_tokens * mib,
           paged_tokens > 0 ? 100.0 * (1 - T / paged_tokens) : 0.0);
    printf("requests that fit in this pool (%d blocks, %.1f MiB): contiguous %d (max_model_len %d each), "
           "paged about %d (mean final length %.0f tokens)\n", st.num_blocks, pool_tokens * mib,
           (int)(pool_tokens / max_model_len), max_model_len, (int)(pool_tokens / mean_len), mean_len);
    llm_engine_destroy(e);
    return failed ? 1 : 0;
}

int main(int argc, char **argv) {
    args_t a;
    memset(&a, 0, sizeof a);
    a.engine = llm_engine_defaults();
    a.sampling = llm_sampling_defaults();
    a.sampling.temperature = 0.8f; a.sampling.top_k = 40; a.sampling.top_p = 0.95f; a.sampling.min_p = 0.05f;
    a.sampling.max_tokens = 128;
    a.num_prompts = 256; a.in_min = 100; a.in_max = 1024; a.out_min = 100; a.out_max = 1024;
    int cmd = 0; /* 0 generate/REPL, 1 tokenize, 2 bench */
    int start = 1;
    if (argc > 1 && !strcmp(argv[1], "tokenize")) { cmd = 1; start = 2; }
    else if (argc > 1 && !strcmp(argv[1], "bench")) { cmd = 2; start = 2; }
    int pos = parse_args(argc, argv, start, &a);
    if (pos < 0) return 1;
    if (cmd == 1) {
        if (pos >= argc) { fprintf(stderr, "llm tokenize: give the TEXT\n"); return 1; }
        return tokenize_cmd(&a, argv[pos]);
    }
    if (pos < argc) {
        fprintf(stderr, "llm: unexpected argument '%s' (see llm --help)\n", argv[pos]);
        return 1;
    }
    if (cmd == 2) return bench(&a);
    if (!a.engine.model_path) {
        fprintf(stderr, "llm: give a model with -m MODEL.gguf (see llm --help)\n");
        return 1;
    }
    char err[LLM_ERR_LEN];
    double t0 = now_s();
    llm_engine *e = llm_engine_create(&a.engine, err);
    if (!e) { fprintf(stderr, "llm: %s\n", err); return 1; }
    llm_engine_stats st = llm_engine_get_stats(e);
    int note = st.backend_note[0] != 0; /* why a backend before this one did not start */
    fprintf(stderr, "llm: loaded %s (%s) in %.3f s on the %s%s%s%s\n", a.engine.model_path,
            llm_engine_model(e)->name, now_s() - t0, st.backend, note ? " (" : "", st.backend_note,
            note ? ")" : "");
    int rc = a.prompt ? generate(e, &a, a.prompt, 1) : repl(e, &a);
    llm_engine_destroy(e);
    return rc;
}
