/* main.c - the llm command: one-shot generation, a REPL, chat, tokenize, the offline throughput benchmark,
 * and (server.c, included at the end) the OpenAI-compatible server and its load generator.
 * Everything it does goes through the engine API of llm.h, the same one the server uses; the command is one
 * translation unit (llm.h's implementation, this file, server.c), built by make llm.
 *
 * The parts, in order:
 *   usage, flags     the help text; parse_args: argv into args_t (the engine's config, the sampling, each
 *                    command's own flags), --speculative-config and the grammar flags read and checked
 *   one-shot, REPL   llm -p: generate (one request, stepped on this thread to its end, streamed to stdout);
 *                    llm -m without a chat template: repl (each line typed is continued)
 *   chat             llm chat: a conversation rendered with the model's template each turn, whose earlier
 *                    turns the prefix cache still holds; a small line editor for the terminal
 *   tokenize         llm tokenize: the tokenizer alone, no weights loaded
 *   bench            llm bench: offline throughput, as vLLM's bench throughput (random or edit workload)
 *   server.c         llm serve and llm bench serve
 *   main             the command picked from argv[1], the flags read, the model loaded, the command run
 * A first reading: main, then generate (the smallest complete use of the engine: add a request, step until
 * no work is left, print each output), then chat_turn. */
#define _GNU_SOURCE /* accept4, pipe2 (server.c) */
#define LLM_IMPLEMENTATION
#include "llm.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static const char *usage =
    "usage:\n"
    "  llm chat -m MODEL.gguf [options]               chat REPL (what llm -m MODEL.gguf starts when the\n"
    "                                                 model has a chat template); piped: a turn a line\n"
    "  llm -m MODEL.gguf -p PROMPT [-n N] [options]   write the prompt and its continuation to stdout\n"
    "  llm -m MODEL.gguf [options]                    REPL: each line you type is continued (no template)\n"
    "  llm tokenize -m MODEL.gguf [--no-bos] TEXT     print TEXT's token ids on one line\n"
    "  llm grammar (--json-schema S | --regex RE)     print the GBNF grammar they are written as\n"
    "  llm bench (-m MODEL.gguf | --dummy NAME) [options]  offline throughput, as vLLM's bench throughput\n"
    "  llm embed -m MODEL.gguf [--pooling P] TEXT...  print each TEXT's embedding (L2-normalised) on a line\n"
    "  llm serve -m MODEL.gguf [options]              OpenAI-compatible HTTP server (vLLM's API)\n"
    "  llm bench serve [options]                      load a running server, as vLLM's bench serve\n"
    "                                                 (llm bench serve --help lists its options)\n"
    "  llm tune -m MODEL.gguf                         (make llm-dist) time each set of CPU kernels the CPU\n"
    "                                                 runs on the model; the fastest is run from then on\n"
    "\n"
    "generation options:\n"
    "  -m, --model PATH       GGUF model file\n"
    "  -p, --prompt TEXT      prompt (BOS is added when the vocabulary asks for it)\n"
    "  -n, --max-tokens N     tokens to generate (default 128; 0: until the context is full)\n"
    "  sampling defaults: the model file's general.sampling.* keys, else llama.cpp's (temp 0.8, top-k 40,\n"
    "  top-p 0.95, min-p 0.05), and for a chat with a file that has none: temp 0.2, top-p 0.9 (what small\n"
    "  chat models such as SmolLM2 recommend); these flags override them. The load line says which is used.\n"
    "  --temp T               temperature (0 is greedy)\n"
    "  --top-k K              keep the K most likely tokens (0 off)\n"
    "  --top-p P              keep the smallest set of tokens with probability mass P (1 off)\n"
    "  --min-p P              keep tokens of probability >= P * the most likely one's (0 off)\n"
    "  --repeat-penalty R     repetition penalty on prompt and output tokens (default 1 = off)\n"
    "  --presence-penalty X   (default 0)\n"
    "  --frequency-penalty X  (default 0)\n"
    "  --seed S               random seed (default: random); the same seed gives the same output\n"
    "  --ignore-eos           keep going past end-of-sequence tokens\n"
    "  --stop TEXT            stop before TEXT (may be given up to 16 times)\n"
    "  --ids                  print only the generated token ids, space-separated, on one line\n"
    "  --grammar FILE         the output follows this GBNF grammar (llama.cpp's format; start rule root)\n"
    "  --json-schema S        the output is JSON valid under this schema (a file, or the JSON itself)\n"
    "  --regex RE             the output matches this regular expression, whole\n"
    "\n"
    "chat options (-n is the longest reply: default 1024):\n"
    "  -s, --system TEXT      system prompt (default: the template's own, if it has one)\n"
    "  --chat-template NAME   override the template the model's file names: chatml, qwen3, llama3, llama2,\n"
    "                         mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken,\n"
    "                         zephyr, phi3, gemma, qwq, gpt-oss\n"
    "  --think                Qwen3: let the model think before it answers (off by default)\n"
    "\n"
    "engine options (all modes):\n"
    "  --block-size N         KV cache block size in tokens (default 16)\n"
    "  --num-blocks N         KV pool size in blocks (default: from --kv-gib)\n"
    "  --kv-gib G             KV pool size in GiB\n"
    "  --kv-fraction F        KV pool as a fraction of the memory free after loading the weights\n"
    "                         (GPU default 0.9; CPU default: --max-num-seqs full contexts, 4 GiB at most)\n"
    "  --kv-cache-dtype T     auto (the backend's: CPU f16, as llama.cpp's; GPU bf16), f16 or f32 (CPU:\n"
    "                         twice the memory, the logits 3 to 4 times nearer the exact path's), q8_0 or\n"
    "                         q4_0 (CPU: GGUF's blocks of 32 values and a scale, as llama.cpp's -ctk/-ctv:\n"
    "                         1.88x and 3.56x the blocks of f16 in the same memory where head_dim is a\n"
    "                         multiple of 32; a head is padded to whole blocks)\n"
    "  --max-num-seqs N       sequences per step (default 256)\n"
    "  --max-num-batched-tokens N   token budget per step (default: the backend's, CPU 2048, CUDA 8192)\n"
    "  --max-model-len N      context length (default: the model's)\n"
    "  --no-prefix-caching    turn automatic prefix caching off\n"
    "  --scheduling-policy P  fcfs (default): first come first served, the youngest preempted when blocks\n"
    "                         run out; priority: requests wait in order of their priority (lower first,\n"
    "                         then arrival) and the lowest priority's latest is preempted (vLLM's)\n"
    "  --spec-ngram K         speculative decoding by n-gram lookup: up to K tokens proposed from the text\n"
    "                         before (prompt lookup), checked in one step; the same output (default off)\n"
    "  --speculative-model F  speculative decoding with a draft model: the GGUF file F, smaller, with the\n"
    "                         model's vocabulary, proposes K tokens by greedy decoding "
    "(K 5, or the config's)\n"
    "  --speculative-config J the same as vLLM's JSON: {\"method\": \"ngram\", "
    "\"num_speculative_tokens\": K,\n"
    "                         \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}, or "
    "{\"method\": \"draft_model\",\n"
    "                         \"model\": F, \"num_speculative_tokens\": K}\n"
    "  --cpu                  run on the CPU even when a GPU is there\n"
    "  --cpu-exact            the CPU's plain-C reference path: weights converted to f32 row by row, no\n"
    "                         rounding of activations (slower; what the fast path is checked against)\n"
    "  --cpu-int8             the CPU with llama.cpp's 8-bit activations instead of the default 16: faster\n"
    "                         prompts (about 1.2x), answers that part from the exact path's at near ties\n"
    "  environment: OMP_NUM_THREADS=N fixes the CPU's threads (default: the cores other processes leave);\n"
    "  a build by make llm-dist starts the CPU's best kernels by its features, or those llm tune measured\n"
    "  fastest (kept in LLM_TUNE_FILE, else ~/.cache/llm/cpu-kernels), and LLM_CPU_VARIANT=avx512vnni,\n"
    "  avx512 or avx2 names the ones to run (refused on a CPU without them)\n"
    "\n"
    "serve options:\n"
    "  --host H               address to listen on (default 127.0.0.1)\n"
    "  --port P               port (default 8000; 0: any free one, printed)\n"
    "  --api-key KEY          ask for 'Authorization: Bearer KEY' (not on /health, /metrics, /ping),\n"
    "                         checked from the headers: without it, 401 before the body is read\n"
    "  --allowed-origins L    origins whose browser pages may call the API (CORS), a JSON list as vLLM\n"
    "                         takes it ('[\"http://localhost:3000\"]', '[\"*\"]': any) or separated by\n"
    "                         commas; default none: no Access-Control-* headers (vLLM's default is any)\n"
    "  --served-model-name N  the model's name in the API (default: the file's name without .gguf)\n"
    "  --max-queue N          requests waiting at most (default 4096); more get 503\n"
    "  --request-timeout S    seconds a client has to send a request once begun (else 408), and to take\n"
    "                         a response's next bytes (else the connection closes, its request aborted)\n"
    "                         (default 30)\n"

    "  --drain-timeout S      SIGTERM (or SIGINT) drains: /health and new requests get 503 (the listener\n"
    "                         stays open) while the requests in flight finish, then it exits 0; after S\n"
    "                         seconds (default 30) it cuts them short and exits 0; a second signal: at once\n"
    "  --responses-store N    /v1/responses with store (the default) keep at most N responses (default\n"
    "                         1024) for GET /v1/responses/{id} and previous_response_id, oldest out first\n"
    "  --responses-store-bytes B  ... and at most B bytes of them (default 268435456)\n"
    "  limits (not flags): a request's head 16 KiB (431), its body 8 MiB (413); request bytes held past\n"
    "  each connection's first 64 KiB, all together, 64 MiB (503); a connection's unsent output 4 MiB: past\n"
    "  it nothing more of it is read, and its stream is aborted; POST bodies are application/json (415);\n"
    "  out of fds, accept() rests 0.1 s at a time (logged at most every 10 s)\n"
    "  every response has an X-Request-Id header: the client's (printable ASCII, at most 128 bytes), else\n"
    "  32 random hex digits; the response's id is cmpl-{it} or chatcmpl-{it}, as vLLM writes them\n"
    "  --chat-template NAME   as for chat\n"
    "  --pooling P            mean, cls or last: how /v1/embeddings (and llm embed) pool a prompt's hidden\n"
    "                         states (default: the file's {arch}.pooling_type; none: embeddings get 400);\n"
    "                         rank: a reranker for /v1/rerank and /v1/score (the default for a file whose\n"
    "                         pooling_type is rank or whose general.name has \"Reranker\")\n"
    "  --matryoshka           /v1/embeddings' dimensions may keep fewer values than the model's\n"
    "  --reasoning-format F   deepseek (default): a thinking model's <think>...</think> goes to\n"
    "                         reasoning_content and reasoning, apart from content; none: left in content\n"
    "  sampling: what a request omits comes from the file's general.sampling.* keys, else OpenAI's defaults\n"
    "  (temperature 1, top_p 1)\n"
    "\n"
    "bench options:\n"
    "  --dummy NAME           random weights of a real shape, no file (presets: %s)\n"
    "  --num-prompts N        requests (default 256)\n"
    "  --input-len MIN:MAX    prompt lengths, drawn uniformly (default 100:1024)\n"
    "  --output-len MIN:MAX   output lengths, drawn uniformly, EOS ignored (default 100:1024)\n"
    "  --seed S               workload seed (default 0)\n"
    "  --workload W           random: prompts of random token ids, outputs of --output-len (default); edit:\n"
    "                         chat requests to rewrite a text with one name changed, answered in full (the\n"
    "                         answer is mostly the prompt's text: where speculative decoding pays)\n"
    "  --static               static batching: a batch is filled and no one joins until all in it finish\n"
    "  --no-warmup            time from the first request (default: one request of --input-len's longest\n"
    "                         prompt and 2 output tokens runs first, left out of every figure, as\n"
    "                         llama-bench's warmup run)\n";

/* "weights 86.2 MiB (q4_1 x210, q8_0 x1, f32 x61)": what the model takes in memory, tensors kept in the
 * file's types (the CPU reads them where the file is mapped) */
static const char *weights_summary(const llm_model *m, char *out, size_t cap) {
    uint32_t types[16];
    int counts[16], n_types = 0;
    double bytes = 0;
    for (int64_t i = 0; i < m->gguf.n_tensors; i++) {
        const llm_gguf_tensor *t = &m->gguf.tensors[i];
        bytes += (double)t->nbytes;
        int k = 0;
        while (k < n_types && types[k] != t->type) k++;
        if (k == n_types && n_types < 16) { types[n_types] = t->type; counts[n_types++] = 0; }
        if (k < n_types) counts[k]++;
    }
    if (!m->gguf.n_tensors) return snprintf(out, cap, "random weights"), out;
    int at = snprintf(out, cap, "weights %.1f MiB (", bytes / (1 << 20));
    for (int k = 0; k < n_types && at > 0 && (size_t)at < cap; k++)
        at += snprintf(out + at, cap - (size_t)at, "%s%s x%d", k ? ", " : "", llm_dtype_name(types[k]),
                       counts[k]);
    if (at > 0 && (size_t)at < cap) snprintf(out + at, cap - (size_t)at, ")");
    return out;
}

/* "temp 0.2 top-p 0.9": the sampling in use, each filter only when it is on */
static const char *sampling_text(const llm_sampling_params *p, char *out, size_t cap) {
    size_t at = 0;
#define ADD(...) (at < cap ? at += (size_t)snprintf(out + at, cap - at, __VA_ARGS__) : 0)
    if (p->temperature == 0) ADD("greedy (temp 0)");
    else {
        ADD("temp %g", p->temperature);
        if (p->top_k > 0) ADD(" top-k %d", p->top_k);
        if (p->top_p < 1) ADD(" top-p %g", p->top_p);
        if (p->min_p > 0) ADD(" min-p %g", p->min_p);
    }
    if (p->repetition_penalty != 1) ADD(" repeat-penalty %g", p->repetition_penalty);
    if (p->presence_penalty != 0) ADD(" presence-penalty %g", p->presence_penalty);
    if (p->frequency_penalty != 0) ADD(" frequency-penalty %g", p->frequency_penalty);
#undef ADD
    return out;
}

/* server.c's clock (its header names now_s): llm.h's monotonic seconds */
static double now_s(void) { return llm_now(); }

/* The process's memory as the kernel counts it, in bytes: field "VmRSS" (resident now) or "VmHWM" (its peak)
 * of /proc/self/status; -1 where there is none (not Linux). For llm bench and /metrics. */
static double proc_memory_bytes(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kib = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') { kib = atof(line + n + 1); break; }
    if (f) fclose(f);
    return kib < 0 ? -1 : kib * 1024;
}

typedef struct {
    llm_engine_config engine;
    llm_sampling_params sampling;
    const char *prompt;
    int ids_only, no_bos, max_tokens_given;
    int sampling_given;             /* LLM_SAMPLING_* bits: the sampling flags given on the command line */
    const char *system, *chat_template;
    int think;
    /* serve */
    const char *host, *api_key, *served_model_name, *allowed_origins;
    int port, max_queue, reasoning_none;
    double request_timeout, drain_timeout;
    int store_max; size_t store_max_bytes; /* --responses-store, --responses-store-bytes */
    int pooling, matryoshka;        /* llm embed and serve: --pooling (enum llm_pooling), --matryoshka */
    const char *stops[16];
    const char *grammar_file, *json_schema, *regex; /* at most one: made into sampling.grammar */
    int spec_method, spec_tokens_given; /* speculative decoding: 1 n-gram lookup, 2 a draft model (3: both) */
    /* bench */
    int num_prompts, in_min, in_max, out_min, out_max;
    int workload_edit;              /* llm bench --workload edit: prompts that hold most of their answer */
    int no_warmup;                  /* llm bench --no-warmup: the clock starts with the first request */
    uint64_t bench_seed;
} args_t;

/* "MIN:MAX" or "N" (MIN = MAX = N), as --input-len and --output-len take them: 0, or -1 when s is not one */
static int parse_range(const char *s, int *lo, int *hi) {
    char *end;
    errno = 0;
    long a = strtol(s, &end, 10), b;
    if (end == s) return -1;
    if (*end == ':') {
        const char *t = end + 1;
        b = strtol(t, &end, 10);
        if (end == t) return -1;
    } else {
        b = a;
    }
    if (*end || errno || a < 1 || b < a || b > 1 << 24) return -1;
    *lo = (int)a; *hi = (int)b;
    return 0;
}

/* Numbers on the command line are taken whole and in range, or refused naming the flag: "-n abc" is not 0. */
static int flag_number(const char *flag, const char *v, double lo, double hi, int integer, double *out) {
    char *end;
    errno = 0;
    double x = integer ? (double)strtoll(v, &end, 10) : strtod(v, &end);
    if (end == v || *end || errno == ERANGE || !(x >= lo && x <= hi)) {
        fprintf(stderr, "llm: %s wants %s from %g to %g, not '%s'\n", flag,
                integer ? "an integer" : "a number", lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* A whole file, NUL-terminated (malloc'ed); NULL after saying why */
static char *read_text_file(const char *path, const char *flag) {
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    size_t len = 0, cap = 0;
    if (f) {
        for (;;) {
            if (len + 4096 + 1 > cap) {
                char *t = (char *)realloc(text, cap = 2 * cap + 8192);
                if (!t) { free(text); text = NULL; break; }
                text = t;
            }
            size_t n = fread(text + len, 1, cap - len - 1, f);
            len += n;
            if (n == 0) break;
        }
        if (ferror(f)) { free(text); text = NULL; }
        fclose(f);
    }
    if (!text) { fprintf(stderr, "llm: %s %s: %s\n", flag, path, strerror(errno ? errno : ENOMEM));
                 return NULL; }
    text[len] = 0;
    return text;
}

/* --grammar, --json-schema and --regex, as GBNF text for sampling.grammar (malloc'ed; NULL when none is
 * given). -1 after saying what is wrong. */
static int grammar_from_flags(args_t *a, char **gbnf) {
    *gbnf = NULL;
    int given = !!a->grammar_file + !!a->json_schema + !!a->regex;
    if (given > 1) { fprintf(stderr, "llm: give one of --grammar, --json-schema and --regex\n"); return -1; }
    char err[LLM_ERR_LEN];
    if (a->grammar_file) *gbnf = read_text_file(a->grammar_file, "--grammar");
    else if (a->regex && !(*gbnf = llm_regex_to_grammar(a->regex, err)))
        fprintf(stderr, "llm: --regex: %s\n", err);
    else if (a->json_schema) { /* the schema itself when it looks like JSON, else a file that holds it */
        const char *s = a->json_schema;
        while (isspace((unsigned char)*s)) s++;
        char *text = *s == '{' || *s == '[' || *s == '"' || !strcmp(s, "true") ? strdup(s) :
                     read_text_file(a->json_schema, "--json-schema");
        llm_json schema;
        if (text && llm_json_parse(text, strlen(text), &schema, err) != 0)
            fprintf(stderr, "llm: --json-schema: not JSON: %s\n", err);
        else if (text) {
            if (!(*gbnf = llm_json_schema_to_grammar(&schema, err)))
                fprintf(stderr, "llm: --json-schema: %s\n", err);
            llm_json_free(&schema);
        }
        free(text);
    }
    if (given && !*gbnf) return -1;
    a->sampling.grammar = *gbnf;
    return 0;
}

/* --speculative-config, vLLM's JSON: the ngram method and its keys, or a draft model (method draft_model, the
 * default when a model is named); any other method or key is refused */
static int speculative_config(args_t *a, const char *text) {
    llm_engine_config *c = &a->engine;
    char err[LLM_ERR_LEN];
    llm_json j;
    if (llm_json_parse(text, strlen(text), &j, err) != 0) {
        fprintf(stderr, "llm: --speculative-config: %s\n", err);
        return -1;
    }
    int rc = j.type == LLM_JSON_OBJECT ? 0 : -1;
    if (rc) fprintf(stderr, "llm: --speculative-config takes a JSON object\n");
    for (int i = 0; !rc && i < j.n; i++) {
        const llm_json *v = &j.items[i];
        const char *k = j.keys[i];
        int *field = !strcmp(k, "num_speculative_tokens") ? &c->spec_tokens
                   : !strcmp(k, "prompt_lookup_max") ? &c->spec_ngram_max
                   : !strcmp(k, "prompt_lookup_min") ? &c->spec_ngram_min : NULL;
        if (field == &c->spec_tokens) a->spec_tokens_given = 1;
        if (!strcmp(k, "method")) {
            if (v->type == LLM_JSON_STRING && !strcmp(v->str, "ngram")) { a->spec_method = 1; continue; }
            if (v->type == LLM_JSON_STRING && !strcmp(v->str, "draft_model")) { a->spec_method = 2;
                                                                                continue; }
            fprintf(stderr, "llm: --speculative-config: method must be \"ngram\" or \"draft_model\"\n");
            rc = -1;
        } else if (!strcmp(k, "model")) { /* kept for the program's life, as argv's strings are */
            static char model[4096];
            if (v->type == LLM_JSON_STRING && v->str[0] && strlen(v->str) < sizeof model) {
                c->spec_model_path = strcpy(model, v->str);
                continue;
            }
            fprintf(stderr, "llm: --speculative-config: model must be a GGUF file's path\n");
            rc = -1;
        } else if (!field) {
            fprintf(stderr, "llm: --speculative-config: unknown key \"%s\" (it takes method, model, "
                    "num_speculative_tokens, prompt_lookup_max, prompt_lookup_min)\n", k);
            rc = -1;
        } else if (v->type != LLM_JSON_NUMBER || !(v->num >= 0 && v->num <= 64) || v->num != (int)v->num) {
            fprintf(stderr, "llm: --speculative-config: %s must be a whole number from 0 to 64\n", k);
            rc = -1;
        } else *field = (int)v->num;
    }
    llm_json_free(&j);
    return rc;
}

/* Reads the flags of argv[start..] into a (every command's: a flag a command has no use for is ignored by
 * it). Returns the index of the first word that is not a flag (argc: none), or -1 on a bad flag or value,
 * with the message printed.
 * One table for every command keeps a flag's meaning the same everywhere (-n is max_tokens for llm -p, the
 * longest reply for chat). Each value is checked where it is read (flag_number: whole, in range), so a
 * command never starts with a half-understood flag. A sampling flag also sets its LLM_SAMPLING_* bit in
 * sampling_given: the value alone cannot say whether it was given (--temp 0.8 is also the default), and
 * resolve_sampling lays the flags given over the file's keys by those bits. The checks that need all the
 * flags (speculative decoding's one method) come after the loop. */
static int parse_args(int argc, char **argv, int start, args_t *a) {
    for (int i = start; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
        const char *v = has ? argv[i + 1] : NULL;
        double x;
        /* FLAG: f is this flag; NEED: it takes a value (v, and i moves past it); INT and REAL: a number in
         * [lo, hi] into x, or return -1 with flag_number's message */
#define FLAG(name) (!strcmp(f, name))
#define NEED() do { if (!has) { fprintf(stderr, "llm: %s needs a value\n", f); return -1; } i++; } while (0)
#define INT(lo, hi) do { NEED(); if (flag_number(f, v, lo, hi, 1, &x)) return -1; } while (0)
#define REAL(lo, hi) do { NEED(); if (flag_number(f, v, lo, hi, 0, &x)) return -1; } while (0)
        if (FLAG("-h") || FLAG("--help")) { printf(usage, llm_model_dummy_names()); exit(0); }
        else if (FLAG("-m") || FLAG("--model")) { NEED(); a->engine.model_path = v; }
        else if (FLAG("-p") || FLAG("--prompt")) { NEED(); a->prompt = v; }
        else if (FLAG("-n") || FLAG("--max-tokens")) {
            INT(0, 1 << 30);
            a->sampling.max_tokens = (int)x;
            a->max_tokens_given = 1;
        }
        else if (FLAG("-s") || FLAG("--system")) { NEED(); a->system = v; }
        else if (FLAG("--chat-template")) { NEED(); a->chat_template = v; }
        else if (FLAG("--think")) a->think = 1;
        else if (FLAG("--host")) { NEED(); a->host = v; }
        else if (FLAG("--port")) { INT(0, 65535); a->port = (int)x; }
        else if (FLAG("--api-key")) { NEED(); a->api_key = v; }
        else if (FLAG("--allowed-origins")) { NEED(); a->allowed_origins = v; }
        else if (FLAG("--served-model-name")) { NEED(); a->served_model_name = v; }
        else if (FLAG("--reasoning-format")) {
            NEED();
            if (strcmp(v, "none") && strcmp(v, "deepseek") && strcmp(v, "auto")) {
                fprintf(stderr, "llm: --reasoning-format must be deepseek (or auto) or none, not '%s'\n", v);
                return -1;
            }
            a->reasoning_none = !strcmp(v, "none");
        }
        else if (FLAG("--max-queue")) { INT(1, 1 << 30); a->max_queue = (int)x; }
        else if (FLAG("--pooling")) {
            NEED();
            for (a->pooling = LLM_POOL_MEAN; a->pooling <= LLM_POOL_RANK; a->pooling++)
                if (!strcmp(v, (const char *[]){"", "mean", "cls", "last", "rank"}[a->pooling])) break;
            if (a->pooling > LLM_POOL_RANK) {
                fprintf(stderr, "llm: --pooling must be mean, cls, last or rank, not '%s'\n", v);
                return -1;
            }
        }
        else if (FLAG("--matryoshka")) a->matryoshka = 1;
        else if (FLAG("--request-timeout")) { REAL(0.001, 1e6); a->request_timeout = x; }
        else if (FLAG("--drain-timeout")) { REAL(0, 1e6); a->drain_timeout = x; }
        else if (FLAG("--responses-store")) { INT(0, 1 << 30); a->store_max = (int)x; }
        else if (FLAG("--responses-store-bytes")) { REAL(0, 1e15); a->store_max_bytes = (size_t)x; }
        else if (FLAG("--temp")) {
            REAL(0, 1e6); a->sampling.temperature = (float)x; a->sampling_given |= LLM_SAMPLING_TEMP;
        }
        else if (FLAG("--top-k")) {
            INT(0, 1 << 30); a->sampling.top_k = (int)x; a->sampling_given |= LLM_SAMPLING_TOP_K;
        }
        else if (FLAG("--top-p")) {
            REAL(1e-9, 1); a->sampling.top_p = (float)x; a->sampling_given |= LLM_SAMPLING_TOP_P;
        }
        else if (FLAG("--min-p")) {
            REAL(0, 1); a->sampling.min_p = (float)x; a->sampling_given |= LLM_SAMPLING_MIN_P;
        }
        else if (FLAG("--repeat-penalty")) {
            REAL(1e-9, 1e6);
            a->sampling.repetition_penalty = (float)x; a->sampling_given |= LLM_SAMPLING_REPEAT;
        }
        else if (FLAG("--presence-penalty")) { REAL(-2, 2); a->sampling.presence_penalty = (float)x; }
        else if (FLAG("--frequency-penalty")) { REAL(-2, 2); a->sampling.frequency_penalty = (float)x; }
        else if (FLAG("--seed")) {
            INT(0, 9007199254740991.0); /* what a double holds exactly */
            a->sampling.seed = (int64_t)x;
            a->bench_seed = (uint64_t)x;
        }
        else if (FLAG("--ignore-eos")) a->sampling.ignore_eos = 1;
        else if (FLAG("--stop")) {
            NEED();
            if (a->sampling.n_stop == 16) { fprintf(stderr, "llm: at most 16 --stop strings\n"); return -1; }
            a->stops[a->sampling.n_stop++] = v;
        }
        else if (FLAG("--ids")) a->ids_only = 1;
        else if (FLAG("--grammar")) { NEED(); a->grammar_file = v; }
        else if (FLAG("--json-schema")) { NEED(); a->json_schema = v; }
        else if (FLAG("--regex")) { NEED(); a->regex = v; }
        else if (FLAG("--no-bos")) a->no_bos = 1;
        else if (FLAG("--block-size")) { INT(1, 1 << 16); a->engine.block_size = (int)x; }
        else if (FLAG("--num-blocks")) { INT(1, 1 << 30); a->engine.num_blocks = (int)x; }
        else if (FLAG("--kv-gib")) { REAL(1e-6, 1 << 20); a->engine.kv_bytes = (size_t)(x * (1 << 30)); }
        else if (FLAG("--kv-fraction")) { REAL(1e-6, 1); a->engine.kv_fraction = x; }
        else if (FLAG("--kv-cache-dtype")) {
            NEED();
            if (strcmp(v, "auto") && strcmp(v, "f16") && strcmp(v, "f32") && strcmp(v, "q8_0") &&
                strcmp(v, "q4_0")) {
                fprintf(stderr, "llm: --kv-cache-dtype takes auto, f16, f32, q8_0 or q4_0, got '%s'\n", v);
                return -1;
            }
            a->engine.kv_cache_dtype = !strcmp(v, "f16")    ? LLM_KV_F16
                                       : !strcmp(v, "f32")  ? LLM_KV_F32
                                       : !strcmp(v, "q8_0") ? LLM_KV_Q8_0
                                       : !strcmp(v, "q4_0") ? LLM_KV_Q4_0 : LLM_KV_AUTO;
        }
        else if (FLAG("--max-num-seqs")) { INT(1, 1 << 20); a->engine.max_num_seqs = (int)x; }
        else if (FLAG("--max-num-batched-tokens")) {
            INT(1, 1 << 30);
            a->engine.max_num_batched_tokens = (int)x;
        }
        else if (FLAG("--max-model-len")) { INT(1, 1 << 24); a->engine.max_model_len = (int)x; }
        else if (FLAG("--no-prefix-caching")) a->engine.enable_prefix_caching = 0;
        else if (FLAG("--scheduling-policy")) {
            NEED();
            if (strcmp(v, "fcfs") && strcmp(v, "priority")) {
                fprintf(stderr, "llm: --scheduling-policy takes fcfs or priority, got '%s'\n", v);
                return -1;
            }
            a->engine.scheduling_policy = !strcmp(v, "priority") ? LLM_SCHED_PRIORITY : LLM_SCHED_FCFS;
        }
        else if (FLAG("--spec-ngram")) {
            INT(1, LLM_SPEC_MAX);
            a->engine.spec_tokens = (int)x; a->spec_tokens_given = 1; a->spec_method |= 1;
        }
        else if (FLAG("--speculative-model")) { NEED(); a->engine.spec_model_path = v; a->spec_method |= 2; }
        else if (FLAG("--speculative-config")) { NEED(); if (speculative_config(a, v) != 0) return -1; }
        else if (FLAG("--cpu")) a->engine.create_backend = llm_cpu_backend_create;
        else if (FLAG("--cpu-exact")) a->engine.create_backend = llm_cpu_exact_backend_create;
        else if (FLAG("--cpu-int8")) a->engine.create_backend = llm_cpu_int8_backend_create;
        else if (FLAG("--dummy")) { NEED(); a->engine.dummy = v; }
        else if (FLAG("--num-prompts")) { INT(1, 1 << 24); a->num_prompts = (int)x; }
        else if (FLAG("--input-len") || FLAG("--output-len")) {
            NEED();
            int in = FLAG("--input-len");
            if (parse_range(v, in ? &a->in_min : &a->out_min, in ? &a->in_max : &a->out_max)) {
                fprintf(stderr, "llm: %s wants MIN:MAX\n", f);
                return -1;
            }
        }
        else if (FLAG("--static")) a->engine.static_batching = 1;
        else if (FLAG("--no-warmup")) a->no_warmup = 1;
        else if (FLAG("--workload")) {
            NEED();
            if (strcmp(v, "random") && strcmp(v, "edit")) {
                fprintf(stderr, "llm: --workload is random or edit, not %s\n", v);
                return -1;
            }
            a->workload_edit = !strcmp(v, "edit");
        }
        else if (f[0] == '-' && f[1]) {
            fprintf(stderr, "llm: unknown option %s (see llm --help)\n", f);
            return -1;
        }
        else return i; /* a word that is no flag ("-" alone too): tokenize's TEXT, or an error for main */
#undef FLAG
#undef NEED
#undef INT
#undef REAL
    }
    a->sampling.stop = a->stops;
    /* speculative decoding: one method; a draft model proposes 5 tokens unless told (vLLM's example) */
    if (a->engine.spec_model_path) a->spec_method |= 2;
    if (a->spec_method == 3) {
        fprintf(stderr, "llm: speculative decoding takes one method: n-gram lookup "
                        "(--spec-ngram, \"ngram\") or "
                "a draft model (--speculative-model, \"draft_model\" with its \"model\")\n");
        return -1;
    }
    if (a->spec_method == 2 && !a->engine.spec_model_path) {
        fprintf(stderr, "llm: --speculative-config: the draft_model method needs a \"model\"\n");
        return -1;
    }
    if (a->engine.spec_model_path && !a->spec_tokens_given) a->engine.spec_tokens = 5;
    return argc;
}

/* The sampling of llm, llm -p and llm chat: the flags given, over the file's general.sampling.* keys, over a
 * default. The default is llama.cpp's (temp 0.8, top-k 40, top-p 0.95, min-p 0.05), but for a chat with a
 * file that names no key it is what SmolLM2's model card recommends (temp 0.2, top-p 0.9): at 0.8 a small
 * chat model answers the same question differently, and mostly wrongly, each time. origin says where each
 * value came from, for the load line and /stats. */
static void resolve_sampling(args_t *a, const llm_model *m, int chat_mode, char *origin, size_t cap) {
    static const struct { int bit; const char *flag, *key; } fields[] = {
        {LLM_SAMPLING_TEMP, "--temp", "temp"}, {LLM_SAMPLING_TOP_K, "--top-k", "top_k"},
        {LLM_SAMPLING_TOP_P, "--top-p", "top_p"}, {LLM_SAMPLING_MIN_P, "--min-p", "min_p"},
        {LLM_SAMPLING_REPEAT, "--repeat-penalty", "penalty_repeat"}};
    /* the three layers, lowest first: the default, the file's keys (llm_model_sampling_defaults returns
     * the bits of the keys it took), then each flag given (its bit in sampling_given) */
    llm_sampling_params given = a->sampling, *p = &a->sampling;
    int chat_default = 0;
    p->temperature = 0.8f; p->top_k = 40; p->top_p = 0.95f; p->min_p = 0.05f; p->repetition_penalty = 1;
    char note[LLM_ERR_LEN] = "";
    int from_file = m->tok ? llm_model_sampling_defaults(m, p, note) : 0;
    if (!from_file && chat_mode) {
        chat_default = 1;
        p->temperature = 0.2f; p->top_k = 0; p->top_p = 0.9f; p->min_p = 0;
    }
    if (a->sampling_given & LLM_SAMPLING_TEMP) p->temperature = given.temperature;
    if (a->sampling_given & LLM_SAMPLING_TOP_K) p->top_k = given.top_k;
    if (a->sampling_given & LLM_SAMPLING_TOP_P) p->top_p = given.top_p;
    if (a->sampling_given & LLM_SAMPLING_MIN_P) p->min_p = given.min_p;
    if (a->sampling_given & LLM_SAMPLING_REPEAT) p->repetition_penalty = given.repetition_penalty;
    /* where each of the five fields came from, as three disjoint bit sets: flags (the command line), file
     * (the file's keys that no flag overrides) and rest (31: all five LLM_SAMPLING_* bits; those neither
     * set, left at the default). origin names them in that order */
    int flags = a->sampling_given, file = from_file & ~flags, rest = 31 & ~flags & ~file;
    size_t at = 0;
    origin[0] = 0;
#define ADD(...) (at < cap ? at += (size_t)snprintf(origin + at, cap - at, __VA_ARGS__) : 0)
    for (int part = 0; part < 2; part++) {
        int bits = part ? file : flags, n = 0;
        if (!bits) continue;
        if (at) ADD("; ");
        for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
            if (bits & fields[i].bit) ADD("%s%s", n++ ? ", " : "", part ? fields[i].key : fields[i].flag);
        ADD(part ? " from the file's general.sampling.*" : " from the command line");
    }
    if (rest)
        ADD("%s%s", at ? "; the rest " : "",
            chat_default ? "default for a chat with a file without general.sampling.*"
            : from_file ? "llama.cpp's defaults"
            : "llama.cpp's defaults, the file has no general.sampling.*");
    if (note[0]) ADD("; the file's %s", note);
#undef ADD
}

/* ---- one-shot generation and the REPL ---- */
/* Speculative decoding's figures, as vLLM logs them: proposals, tokens proposed and accepted, the mean
 * acceptance length (tokens a step gives a sequence: 1 + the accepted per proposal), and per position */
static void print_spec(FILE *f, const llm_engine_stats *st) {
    if (!st->spec_tokens) return;
    fprintf(f, "speculative decoding: %lld proposals of %lld tokens, %lld accepted (%.1f%%), mean acceptance "
            "length %.2f; accepted at each position:", (long long)st->spec_drafts,
            (long long)st->spec_draft_tokens, (long long)st->spec_accepted_tokens,
            st->spec_draft_tokens ? 100.0 * st->spec_accepted_tokens / st->spec_draft_tokens : 0.0,
            st->spec_drafts ? 1.0 + (double)st->spec_accepted_tokens / st->spec_drafts : 1.0);
    for (int i = 0; i < st->spec_tokens; i++) fprintf(f, " %lld", (long long)st->spec_accepted_at[i]);
    if (st->draft_seconds > 0) fprintf(f, "; the draft model's passes took %.2f s", st->draft_seconds);
    fprintf(f, "\n");
}

/* llm -p: one request, the engine stepped on this thread until it has no work left, each output's text (or,
 * with --ids, its token ids) written as it comes; the prompt's and the generation's speeds on stderr (the
 * prompt's: up to the first token). Returns 1 when the request failed. */
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
    /* the prompt's speed up to the first token (its prefill brings the first token too), the generation's
     * after it: n - 1 tokens over the time from the first to the last */
    fprintf(stderr, "\nllm: prompt %d tokens, %.1f tok/s; generated %d tokens, %.1f tok/s\n", n_prompt,
            n_prompt / (t_first - t0 + 1e-9), n_gen, n_gen > 1 ? (n_gen - 1) / (t1 - t_first + 1e-9) : 0.0);
    llm_engine_stats st = llm_engine_get_stats(e);
    if (st.spec_tokens) { fprintf(stderr, "llm: "); print_spec(stderr, &st); }
    return rc;
}

/* llm -m MODEL with no chat template: each line typed is a prompt of its own, continued (no template, and no
 * memory of the lines before). */
static int repl(llm_engine *e, args_t *a) {
    char *line = NULL;
    size_t cap = 0;
    fprintf(stderr, "llm: type a prompt and press enter to continue it; an empty line or Ctrl-D quits\n");
    for (;;) {
        fprintf(stderr, "> ");
        ssize_t n = getline(&line, &cap, stdin); /* a whole line, however long: the context bounds it */
        if (n < 0) break;
        line[strcspn(line, "\n")] = 0;
        if (!line[0]) break;
        generate(e, a, line, 0);  /* the line is on the screen already: print only its continuation */
        printf("\n");
    }
    free(line);
    return 0;
}

/* ---- chat: the REPL ----
 * The conversation is kept as messages and rendered whole each turn with the model's chat template. Its
 * tokens are not recomputed: the engine's prefix cache still holds the blocks of the turns before, so only
 * what is new (the end of the last reply, the new user turn) is computed. For that the prompt's ids must
 * begin with exactly the ids of the turns before, so they are kept as they were computed (the reply's tokens
 * as sampled, not its text tokenized again) and only the text the template adds after them is tokenized. */
static volatile sig_atomic_t g_interrupted; /* Ctrl-C while a reply is being generated */
static void on_sigint(int sig) { (void)sig; g_interrupted = 1; }

typedef struct {
    llm_engine *e;
    const llm_tokenizer *tok;
    args_t *a;
    llm_chat_template tmpl;
    char *system;                   /* -s or /system (NULL: the template's own default, if any) */
    llm_chat_message *msgs;         /* stb_ds array of the turns, strings owned */
    int32_t stop_ids[8];
    int n_stop_ids;
    char *known_text;               /* the last prompt and its reply, as text ... */
    int32_t *known_ids;             /* ... and as the ids that were computed (stb_ds) */
    int32_t end_id;                 /* the stop token that ended the last reply (not in known_ids), or -1 */
    int tty_in, tty_out;
    FILE *info;                     /* where /stats and notices go: stdout on a terminal, else stderr */
    /* the last reply, for /stats */
    int turns, context_used, last_prompt, last_cached, last_generated;
    double last_ttft, last_prompt_tps, last_gen_tps;
    int64_t cached_total;
    const char *sampling_origin;    /* where the sampling came from (resolve_sampling) */
} chat_t;

/* The ids of the turns before forgotten: the next prompt is tokenized whole. When a turn is dropped (the
 * context is full), a reply failed or was cut short, or the conversation is reset: the text the ids stand
 * for is no longer the beginning of the next prompt. */
static void chat_forget_ids(chat_t *c) {
    free(c->known_text); c->known_text = NULL;
    arrsetlen(c->known_ids, 0);
    c->end_id = -1;
}

static void chat_reset(chat_t *c) {
    for (ptrdiff_t i = 0; i < arrlen(c->msgs); i++) free((char *)c->msgs[i].content);
    arrsetlen(c->msgs, 0);
    chat_forget_ids(c);
}

/* A message appended to the conversation, its text copied (chat_t owns every message's content) */
static int chat_push(chat_t *c, const char *role, const char *text) {
    char *copy = strdup(text);
    if (!copy) return -1;
    llm_chat_message m = {role, copy};
    arrput(c->msgs, m);
    return 0;
}

/* The whole conversation, with the generation prompt, as text (malloc'd), or NULL. */
static char *chat_render(chat_t *c) {
    llm_chat_message *all = NULL;
    if (c->system) { llm_chat_message s = {"system", c->system}; arrput(all, s); }
    for (ptrdiff_t i = 0; i < arrlen(c->msgs); i++) arrput(all, c->msgs[i]);
    int n = llm_chat_render(&c->tmpl, all, (int)arrlen(all), NULL, 1, NULL, 0);
    char *text = n >= 0 ? (char *)malloc((size_t)n + 1) : NULL;
    if (text) llm_chat_render(&c->tmpl, all, (int)arrlen(all), NULL, 1, text, n + 1);
    arrfree(all);
    return text;
}

/* Appends text's ids to *ids (special tokens parsed; BOS as llm_tokenize_prompt puts it, when bos). */
static int chat_tokenize(const llm_tokenizer *t, const char *text, int bos, int32_t **ids) {
    size_t len = strlen(text);
    if (len > (size_t)INT32_MAX / 2) return -1;
    int cap = (int)len + 8;
    ptrdiff_t at = arrlen(*ids);
    arrsetlen(*ids, at + cap);
    int n = bos ? llm_tokenize_prompt(t, text, len, *ids + at, cap)
                : llm_tokenize(t, text, len, 0, 1, *ids + at, cap);
    arrsetlen(*ids, at + (n > 0 ? n : 0));
    return n < 0 ? -1 : 0;
}

/* The prompt's ids: the ids of the turns before as they were computed, then the rest of the text.
 * This works because a template renders a conversation so that its text for the first k turns is a prefix
 * of its text for k + 1 (known_text is checked to be one, else the whole text is tokenized). Between the two
 * sits the reply's end-of-turn token: the engine sampled it (end_id) but it wrote no text, and the template
 * writes its marker after the reply; where the marker is that token's text, the sampled id is reused, so the
 * prompt's ids stay exactly those the engine computed. What follows is tokenized without a BOS. */
static int chat_prompt_ids(chat_t *c, const char *text, int32_t **ids) {
    arrsetlen(*ids, 0);
    size_t known = c->known_text ? strlen(c->known_text) : 0;
    if (!c->known_text || strncmp(text, c->known_text, known) != 0) /* the template wrote history anew */
        return chat_tokenize(c->tok, text, 1, ids);
    const char *rest = text + known;
    for (ptrdiff_t i = 0; i < arrlen(c->known_ids); i++) arrput(*ids, c->known_ids[i]);
    char piece[64];
    int n = c->end_id >= 0 ? llm_tokenizer_piece(c->tok, c->end_id, 1, piece, sizeof piece) : -1;
    if (n > 0 && n < (int)sizeof piece && !strncmp(rest, piece, (size_t)n)) {
        arrput(*ids, c->end_id); /* the reply's own end-of-turn token, where the template writes it */
        rest += n;
    }
    return chat_tokenize(c->tok, rest, 0, ids);
}

/* The reply so far read again (llm_chat_parse_reply): what it adds to the thinking, dimmed (thinking: shown;
 * else left out), and to the answer. final: the reply is whole (nothing held back). */
static void chat_show_reply(chat_t *c, const char *reply, size_t *shown_thinking, size_t *shown_answer,
                            int final, int thinking) {
    llm_chat_reply rep;
    if (llm_chat_parse_reply(&c->tmpl, reply ? reply : "", (size_t)arrlen(reply), 1, 0, !final, &rep) == 0) {
        size_t nr = rep.reasoning && thinking ? strlen(rep.reasoning) : 0, na = strlen(rep.content);
        if (nr > *shown_thinking) {
            printf("\033[2m%s\033[0m", rep.reasoning + *shown_thinking);
            *shown_thinking = nr;
        }
        if (na > *shown_answer) {
            if (!*shown_answer && nr) printf("\n\n");
            fputs(rep.content + *shown_answer, stdout);
            *shown_answer = na;
        }
    }
    llm_chat_reply_free(&rep);
}

/* One turn: the user's text in, the reply streamed out. The invariant the turn keeps: known_text and
 * known_ids describe the same conversation (the last prompt and its reply), so that the next prompt's ids
 * begin with exactly the ids the engine computed and the prefix cache serves them; when that cannot hold
 * (a turn dropped, an error, an interruption), chat_forget_ids drops them and the next prompt is tokenized
 * whole. On a failure before the request starts, the user's message is taken back (drop_user). */
static void chat_turn(chat_t *c, const char *user) {
    char err[LLM_ERR_LEN];
    llm_engine_stats st = llm_engine_get_stats(c->e);
    int max_len = st.max_model_len, max_tokens = c->a->sampling.max_tokens;
    /* room kept for the reply: the whole -n when it fits in half the context */
    int reserve = max_tokens > 0 && max_tokens < max_len / 2 ? max_tokens : max_len / 2;
    if (chat_push(c, "user", user) != 0) { fprintf(stderr, "llm: out of memory\n"); return; }
    int32_t *ids = NULL;
    char *text = NULL;
    /* 1. the prompt: the conversation rendered and tokenized; while it leaves less than reserve tokens for
     * the reply, the oldest turn goes */
    for (;;) {
        free(text);
        text = chat_render(c);
        if (!text || chat_prompt_ids(c, text, &ids) != 0) {
            fprintf(stderr, "llm: could not render or tokenize the conversation\n");
            goto drop_user;
        }
        if ((int)arrlen(ids) + reserve <= max_len) break;
        if (arrlen(c->msgs) == 1) {
            fprintf(stderr, "llm: that message is %d tokens with the template: too long for the context (%d "
                    "tokens, %d kept for the reply)\n", (int)arrlen(ids), max_len, reserve);
            goto drop_user;
        }
        /* the oldest turn goes: its user message and the replies after it */
        int k = 1;
        while (k < arrlen(c->msgs) - 1 && strcmp(c->msgs[k].role, "user") != 0) k++;
        for (int i = 0; i < k; i++) free((char *)c->msgs[i].content);
        arrdeln(c->msgs, 0, k);
        chat_forget_ids(c);
        fprintf(c->info, "[the conversation outgrew the context (%d tokens): the oldest turn was dropped]\n",
                max_len);
    }

    /* 2. the request, stepped on this thread until done; Ctrl-C aborts it (the engine ends it with
     * LLM_FINISH_ABORT, so the loop still ends by itself) */
    llm_sampling_params p = c->a->sampling;
    p.stop_token_ids = c->stop_ids; p.n_stop_token_ids = c->n_stop_ids;
    double t0 = now_s(), t_first = 0;
    uint64_t id = llm_engine_add_request(c->e, NULL, ids, (int)arrlen(ids), &p, NULL, err);
    if (!id) { fprintf(stderr, "llm: %s\n", err); goto drop_user; }
    char *reply = NULL;             /* stb_ds: the reply's text */
    int32_t *reply_ids = NULL;
    int finish = LLM_FINISH_NONE, aborted = 0, n_prompt = 0, n_cached = 0;
    /* on a terminal, a model that thinks shows its thinking dimmed, apart from its answer; gpt-oss's reply is
     * always read by its messages (piped: its answer only) */
    int harmony = c->tmpl.family == LLM_CHAT_GPT_OSS;
    int dim_thinking = c->tty_out && c->tmpl.thinks && (c->tmpl.enable_thinking || harmony);
    size_t shown_thinking = 0, shown_answer = 0;
    g_interrupted = 0;
    while (llm_engine_has_work(c->e)) {
        if (g_interrupted && !aborted) { llm_engine_abort(c->e, id); aborted = 1; }
        const llm_output *out;
        int n = llm_engine_step(c->e, &out);
        for (int i = 0; i < n; i++) {
            if (out[i].n_tokens && !t_first) t_first = now_s();
            n_prompt = out[i].n_prompt_tokens; n_cached = out[i].n_cached_tokens;
            for (int j = 0; j < out[i].n_tokens; j++) arrput(reply_ids, out[i].token_ids[j]);
            if (out[i].text_len)
                memcpy(arraddnptr(reply, out[i].text_len), out[i].text, (size_t)out[i].text_len);
            if (dim_thinking || harmony)
                chat_show_reply(c, reply, &shown_thinking, &shown_answer, 0, dim_thinking);
            else fwrite(out[i].text, 1, (size_t)out[i].text_len, stdout);
            fflush(stdout);
            if (out[i].finish_reason) finish = out[i].finish_reason;
            if (out[i].finish_reason == LLM_FINISH_ERROR) fprintf(stderr, "\nllm: %s\n", out[i].error);
        }
    }
    if (dim_thinking || harmony) chat_show_reply(c, reply, &shown_thinking, &shown_answer, 1, dim_thinking);
    double t1 = now_s();
    if (!t_first) t_first = t1;
    printf("\n");
    if (finish == LLM_FINISH_ABORT) fprintf(c->info, "[interrupted]\n");
    int n_gen = (int)arrlen(reply_ids);
    arrput(reply, 0);

    /* the reply joins the conversation; the ids computed so far are kept for the next turn */
    int ended_by_stop = finish == LLM_FINISH_STOP && n_gen > 0;
    llm_chat_reply answer; /* gpt-oss: the conversation keeps its answer (its template drops the thinking) */
    memset(&answer, 0, sizeof answer);
    if (harmony && llm_chat_parse_reply(&c->tmpl, reply, strlen(reply), 1, 0, 0, &answer) != 0)
        finish = LLM_FINISH_ERROR;
    if (finish == LLM_FINISH_ERROR || chat_push(c, "assistant", harmony ? answer.content : reply) != 0) {
        chat_forget_ids(c);
    } else {
        free(c->known_text);
        size_t a = strlen(text), b = strlen(reply);
        c->known_text = (char *)malloc(a + b + 1);
        if (c->known_text) { memcpy(c->known_text, text, a); memcpy(c->known_text + a, reply, b + 1); }
        arrsetlen(c->known_ids, 0);
        for (ptrdiff_t i = 0; i < arrlen(ids); i++) arrput(c->known_ids, ids[i]);
        for (int i = 0; i < n_gen - ended_by_stop; i++) arrput(c->known_ids, reply_ids[i]);
        c->end_id = ended_by_stop ? reply_ids[n_gen - 1] : -1;
        if (finish == LLM_FINISH_ABORT) chat_forget_ids(c); /* text held back may be missing: start over */
    }
    /* 3. the figures /stats shows, and the speed line under the reply */
    c->turns++;
    c->context_used = n_prompt + n_gen;
    c->last_prompt = n_prompt; c->last_cached = n_cached; c->last_generated = n_gen;
    c->last_ttft = t_first - t0;
    c->last_prompt_tps = (n_prompt - n_cached) / (t_first - t0 + 1e-9);
    c->last_gen_tps = n_gen > 1 ? (n_gen - 1) / (t1 - t_first + 1e-9) : 0;
    c->cached_total += n_cached;
    if (c->tty_out)
        printf("\033[2m[%d tokens, %.1f tok/s, first token in %.0f ms]\033[0m\n", n_gen, c->last_gen_tps,
               c->last_ttft * 1e3);
    arrfree(reply); arrfree(reply_ids); arrfree(ids); free(text); llm_chat_reply_free(&answer);
    return;
drop_user:
    free((char *)arrpop(c->msgs).content);
    arrfree(ids); free(text);
}

/* /stats: the sampling and where it came from, the context used, the last reply's prompt (how much of it the
 * prefix cache served) and speeds, and the KV pool's blocks (free, and holding cached prefixes) */
static void chat_stats(chat_t *c) {
    llm_engine_stats st = llm_engine_get_stats(c->e);
    FILE *f = c->info;
    char text[160];
    fprintf(f, "turns: %d\n", c->turns);
    fprintf(f, "sampling: %s (%s)\n", sampling_text(&c->a->sampling, text, sizeof text), c->sampling_origin);
    fprintf(f, "context: %d of %d tokens\n", c->context_used, st.max_model_len);
    fprintf(f, "last reply: prompt %d tokens (%d from the prefix cache, %d computed) at %.1f tok/s, first "
            "token in %.0f ms; %d tokens generated at %.1f tok/s\n", c->last_prompt, c->last_cached,
            c->last_prompt - c->last_cached, c->last_prompt_tps, c->last_ttft * 1e3, c->last_generated,
            c->last_gen_tps);
    fprintf(f, "prefix cache: %d tokens hit in the last turn, %lld in all\n", c->last_cached,
            (long long)c->cached_total);
    fprintf(f, "KV blocks: %d of %d free (%d hold cached prefixes)\n", st.num_free_blocks, st.num_blocks,
            st.num_cached_blocks);
}

static const char *chat_help =
    "/reset          start a new conversation (the system prompt stays)\n"
    "/system TEXT    set the system prompt (empty: the template's default) and start anew\n"
    "/stats          turns, sampling, context used, speeds, prefix-cache hits, KV blocks\n"
    "/help           this\n"
    "/quit           leave (so do Ctrl-D and Ctrl-C on an empty line)\n"
    "Ctrl-C while a reply streams stops it. Up and down arrows walk through the lines you typed.\n";

/* ---- a line editor for the terminal: raw mode, the line redrawn on each key, a history ---- */
static struct termios g_saved_termios;
static int g_raw;

/* The terminal back as it was (after a line is read, and before anything else is printed) */
static void term_restore(void) {
    if (g_raw) { tcsetattr(STDIN_FILENO, TCSADRAIN, &g_saved_termios); g_raw = 0; }
}

/* The terminal in raw mode for the line editor: each key as it is pressed, no echo, Ctrl-C as a byte */
static int term_raw(void) {
    struct termios raw;
    if (tcgetattr(STDIN_FILENO, &g_saved_termios) != 0) return -1;
    raw = g_saved_termios;
    raw.c_iflag &= ~(tcflag_t)(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
    raw.c_lflag &= ~(tcflag_t)(ECHO | ICANON | IEXTEN | ISIG); /* Ctrl-C arrives as a byte, 3 */
    raw.c_cc[VMIN] = 1; raw.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSADRAIN, &raw) != 0) return -1;
    g_raw = 1;
    return 0;
}

static int utf8_width(const char *s, int n) { /* characters, counting each UTF-8 sequence once */
    int w = 0;
    for (int i = 0; i < n; i++) w += ((unsigned char)s[i] & 0xC0) != 0x80;
    return w;
}

/* The line drawn again: to the line's start, the prompt and the text, the rest of the screen line erased
 * (ESC [K), then the cursor put at pos's column from the start (ESC [nC; a character is one column, which
 * holds for most scripts but not for wide CJK characters or emoji) */
static void edit_refresh(const char *prompt, const char *buf, int len, int pos) {
    char seq[64];
    fputs("\r", stdout); fputs(prompt, stdout); fwrite(buf, 1, (size_t)len, stdout); fputs("\033[K", stdout);
    snprintf(seq, sizeof seq, "\r\033[%dC", (int)strlen(prompt) + utf8_width(buf, pos));
    fputs(seq, stdout);
    fflush(stdout);
}

/* Reads one line into *line (malloc'd). Returns 1 for a line, 0 to quit (Ctrl-D or Ctrl-C on an empty line,
 * or the end of input).
 * A small readline: the terminal in raw mode (term_raw), one byte read at a time, and after each key the
 * whole line redrawn (edit_refresh: carriage return, prompt, text, erase to the end, cursor moved to its
 * column). The invariants: buf[0..len) is the line, pos is a byte offset in it that is always at the start
 * of a UTF-8 character (the moves and deletions step over continuation bytes, 10xxxxxx), so a character is
 * never split. History: hist_at indexes *history, arrlen(*history) being the line being typed, which is kept
 * in saved while older lines are shown. A line is added to the history unless it repeats the last one. The
 * terminal is restored before returning, whatever ends the line. */
static int edit_line(const char *prompt, char ***history, char **line) {
    char *buf = NULL; /* stb_ds, NUL not counted in len */
    int len = 0, pos = 0, hist_at = (int)arrlen(*history), done = -1;
    char *saved = NULL; /* the line being typed, while the history is browsed */
    if (term_raw() != 0) return -1;
    arrsetlen(buf, 1); buf[0] = 0;
    edit_refresh(prompt, buf, len, pos);
    while (done < 0) {
        char ch;
        ssize_t r = read(STDIN_FILENO, &ch, 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { done = len > 0; break; }
        unsigned char k = (unsigned char)ch;
        if (k == '\r' || k == '\n') { done = 1; break; }
        if (k == 3) { /* Ctrl-C: leaves on an empty line, else drops the line */
            if (len == 0) { done = 0; break; }
            fputs("^C\r\n", stdout);
            len = pos = 0;
        } else if (k == 4) { /* Ctrl-D: leaves on an empty line, else deletes under the cursor */
            if (len == 0) { done = 0; break; }
            if (pos < len) {
                int n = 1;
                while (pos + n < len && ((unsigned char)buf[pos + n] & 0xC0) == 0x80) n++;
                memmove(buf + pos, buf + pos + n, (size_t)(len - pos - n)); len -= n;
            }
        } else if (k == 127 || k == 8) { /* backspace: the whole UTF-8 character before the cursor */
            int n = 0;
            while (pos - n > 0 && (n == 0 || ((unsigned char)buf[pos - n] & 0xC0) == 0x80)) n++;
            memmove(buf + pos - n, buf + pos, (size_t)(len - pos)); len -= n; pos -= n;
        } else if (k == 1) pos = 0;               /* Ctrl-A */
        else if (k == 5) pos = len;               /* Ctrl-E */
        else if (k == 21) { memmove(buf, buf + pos, (size_t)(len - pos)); len -= pos; pos = 0; } /* Ctrl-U */
        else if (k == 11) len = pos;              /* Ctrl-K */
        else if (k == 27) { /* escape sequences: arrows, Home, End, Delete */
            /* ESC [ digit ~ (Home 1 or 7, Delete 3, End 4 or 8), ESC [ or ESC O then a letter: A up, B down,
             * C right, D left, H Home, F End (terminals send either form) */
            char s[3] = {0};
            if (read(STDIN_FILENO, &s[0], 1) != 1 || read(STDIN_FILENO, &s[1], 1) != 1) continue;
            if (s[0] == '[' && s[1] >= '0' && s[1] <= '9') {
                if (read(STDIN_FILENO, &s[2], 1) != 1 || s[2] != '~') continue;
                if (s[1] == '3' && pos < len) { /* Delete */
                    int n = 1;
                    while (pos + n < len && ((unsigned char)buf[pos + n] & 0xC0) == 0x80) n++;
                    memmove(buf + pos, buf + pos + n, (size_t)(len - pos - n)); len -= n;
                }
                if (s[1] == '1' || s[1] == '7') pos = 0;
                if (s[1] == '4' || s[1] == '8') pos = len;
            } else if (s[0] == '[' || s[0] == 'O') {
                if (s[1] == 'C') while (pos < len && ((unsigned char)buf[++pos] & 0xC0) == 0x80) {}
                if (s[1] == 'D') while (pos > 0 && ((unsigned char)buf[--pos] & 0xC0) == 0x80) {}
                if (s[1] == 'H') pos = 0;
                if (s[1] == 'F') pos = len;
                if ((s[1] == 'A' && hist_at > 0) || (s[1] == 'B' && hist_at < arrlen(*history))) {
                    if (hist_at == arrlen(*history)) { free(saved); buf[len] = 0; saved = strdup(buf); }
                    hist_at += s[1] == 'A' ? -1 : 1;
                    const char *h = hist_at < arrlen(*history) ? (*history)[hist_at] : (saved ? saved : "");
                    len = pos = (int)strlen(h);
                    arrsetlen(buf, len + 1);
                    memcpy(buf, h, (size_t)len);
                }
            }
        } else if (k >= 32) { /* a byte of text (UTF-8 sequences arrive byte by byte) */
            arrsetlen(buf, len + 2);
            memmove(buf + pos + 1, buf + pos, (size_t)(len - pos));
            buf[pos++] = ch; len++;
        }
        edit_refresh(prompt, buf, len, pos);
    }
    term_restore();
    fputs("\n", stdout);
    fflush(stdout);
    free(saved);
    buf[len] = 0;
    if (done == 1) {
        *line = strdup(buf);
        if (len > 0 && *line && (arrlen(*history) == 0 || strcmp(arrlast(*history), buf) != 0))
            arrput(*history, strdup(buf));
    }
    arrfree(buf);
    return done == 1 && *line ? 1 : 0;
}

/* Piped input: one line, without its newline. */
static int read_plain_line(char **line) {
    size_t cap = 0;
    *line = NULL;
    ssize_t n = getline(line, &cap, stdin); /* a Ctrl-C here (EINTR) ends the chat, as at the prompt */
    if (n < 0) { free(*line); *line = NULL; return 0; }
    while (n > 0 && ((*line)[n - 1] == '\n' || (*line)[n - 1] == '\r')) (*line)[--n] = 0;
    return 1;
}

/* The model's chat template (or --chat-template's) and its end-of-turn tokens, 8 at most: what the chat and
 * llm bench --workload edit make their requests with. -1 with err when the model has none it can use. */
static int chat_template_load(const llm_model *m, const args_t *a, llm_chat_template *tmpl,
                              int32_t stop_ids[8], int *n_stop_ids, char *err) {
    if (!m->tok) { snprintf(err, LLM_ERR_LEN, "the model has no tokenizer"); return -1; }
    llm_str text = llm_gguf_string(&m->gguf, "tokenizer.chat_template");
    if (llm_chat_template_init(tmpl, text.ptr, text.len, m->tok, a->chat_template, err) != 0) return -1;
    *n_stop_ids = llm_chat_stop_ids(tmpl, m->tok, stop_ids, 8);
    if (*n_stop_ids > 8) *n_stop_ids = 8;
    return 0;
}

/* llm chat: the template loaded, then a loop of lines: a /command acts on the conversation (/reset and
 * /system start a new one: chat_reset forgets its ids too), any other line is a user turn (chat_turn). Lines
 * come from the line editor on a terminal, else one per line from the pipe (a script can drive a chat).
 * SIGINT is caught without SA_RESTART: during a reply it sets g_interrupted, which chat_turn checks between
 * steps to abort that reply; at a piped read it ends the chat. */
static int chat(llm_engine *e, args_t *a, const char *sampling_origin) {
    char err[LLM_ERR_LEN];
    chat_t c;
    memset(&c, 0, sizeof c);
    c.e = e; c.a = a; c.end_id = -1; c.sampling_origin = sampling_origin;
    const llm_model *m = llm_engine_model(e);
    c.tok = m->tok;
    if (chat_template_load(m, a, &c.tmpl, c.stop_ids, &c.n_stop_ids, err) != 0) {
        fprintf(stderr, "llm: %s\n", err);
        return 1;
    }
    if (c.tmpl.note[0]) fprintf(stderr, "llm: warning: %s\n", c.tmpl.note);
    c.tmpl.enable_thinking = a->think;
    if (a->system && !(c.system = strdup(a->system))) return 1;
    if (!a->max_tokens_given) a->sampling.max_tokens = 1024;
    c.tty_in = isatty(STDIN_FILENO); c.tty_out = isatty(STDOUT_FILENO);
    c.info = c.tty_out ? stdout : stderr;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint; /* no SA_RESTART: a Ctrl-C at a piped read ends the chat */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    if (c.tty_in)
        fprintf(stderr, "llm: chatting with %s (%s template); /help for commands, Ctrl-D to leave\n", m->name,
                llm_chat_family_name(c.tmpl.family));
    char **history = NULL, *line = NULL;
    for (;;) {
        int got = c.tty_in ? edit_line("> ", &history, &line) : read_plain_line(&line);
        if (got <= 0) break;
        if (!line[0]) { free(line); continue; }
        if (line[0] == '/') {
            char *arg = strchr(line, ' ');
            size_t cmd_len = arg ? (size_t)(arg - line) : strlen(line);
            while (arg && *arg == ' ') arg++;
#define CMD(name) (cmd_len == strlen(name) && !strncmp(line, name, cmd_len))
            if (CMD("/quit") || CMD("/exit")) { free(line); break; }
            else if (CMD("/reset")) { chat_reset(&c); fprintf(c.info, "[a new conversation]\n"); }
            else if (CMD("/system")) {
                free(c.system);
                c.system = arg && *arg ? strdup(arg) : NULL;
                chat_reset(&c);
                fprintf(c.info, "[system prompt %s; a new conversation]\n", c.system ? "set" : "cleared");
            }
            else if (CMD("/stats")) chat_stats(&c);
            else if (CMD("/help")) fputs(chat_help, c.info);
            else fprintf(c.info, "unknown command %.*s (/help lists them)\n", (int)cmd_len, line);
#undef CMD
            free(line);
            continue;
        }
        chat_turn(&c, line);
        free(line);
    }
    term_restore();
    chat_reset(&c);
    arrfree(c.msgs); arrfree(c.known_ids);
    free(c.system);
    for (ptrdiff_t i = 0; i < arrlen(history); i++) free(history[i]);
    arrfree(history);
    return 0;
}

/* llm tokenize: the file's tokenizer alone (no weights loaded, no engine), TEXT's ids on one line */
/* llm embed -m F [--pooling P] TEXT...: each text's embedding on a line of space-separated floats, L2-
 * normalised, computed as /v1/embeddings computes them (a pooling request each, all in the engine at once) */
static int embed_cmd(args_t *a, char **texts, int n) {
    if (!a->engine.model_path || n < 1) {
        fprintf(stderr, "llm embed: give a model with -m MODEL.gguf and at least one TEXT\n");
        return 1;
    }
    char err[LLM_ERR_LEN];
    llm_engine *e = llm_engine_create(&a->engine, err);
    if (!e) { fprintf(stderr, "llm embed: %s\n", err); return 1; }
    const llm_model *m = llm_engine_model(e);
    llm_sampling_params p = llm_sampling_defaults();
    p.pooling = a->pooling ? a->pooling : m->cfg.pooling;
    int dim = m->cfg.dim, rc = 0, done = 0;
    float *vecs = (float *)calloc((size_t)n * (size_t)dim, sizeof(float));
    if (!vecs) { fprintf(stderr, "llm embed: out of memory\n"); llm_engine_destroy(e); return 1; }
    if (a->pooling == LLM_POOL_RANK) {
        fprintf(stderr, "llm embed: --pooling rank scores pairs (llm serve's /v1/rerank), not texts: give "
                "--pooling mean|cls|last\n");
        rc = 1;
    } else if (p.pooling < LLM_POOL_MEAN || p.pooling > LLM_POOL_LAST) {
        fprintf(stderr, "llm embed: the model's pooling type (GGUF key %s.pooling_type) is %d: give "
                "--pooling mean|cls|last\n", llm_arch_names[m->cfg.arch], m->cfg.pooling);
        rc = 1;
    }
    for (int i = 0; !rc && i < n; i++)
        if (!llm_engine_add_request(e, texts[i], NULL, 0, &p, (void *)(intptr_t)i, err)) {
            fprintf(stderr, "llm embed: text %d: %s\n", i + 1, err);
            rc = 1;
        }
    while (!rc && done < n && llm_engine_has_work(e)) {
        const llm_output *out;
        int k = llm_engine_step(e, &out);
        for (int j = 0; j < k; j++) {
            int i = (int)(intptr_t)out[j].user;
            if (out[j].finish_reason && !out[j].embedding) {
                fprintf(stderr, "llm embed: text %d: %s\n", i + 1, out[j].error ? out[j].error : "failed");
                rc = 1;
            }
            if (!out[j].embedding) continue;
            memcpy(vecs + (size_t)i * dim, out[j].embedding, (size_t)dim * sizeof(float));
            done++;
        }
    }
    for (int i = 0; !rc && i < n; i++) { /* in the order given */
        llm_embedding_normalize(vecs + (size_t)i * dim, dim);
        for (int k = 0; k < dim; k++) printf("%s%.9g", k ? " " : "", (double)vecs[(size_t)i * dim + k]);
        printf("\n");
    }
    free(vecs);
    llm_engine_destroy(e);
    return rc;
}

static int tokenize_cmd(args_t *a, const char *text) {
    char err[LLM_ERR_LEN];
    llm_gguf g;
    if (!a->engine.model_path) { fprintf(stderr, "llm tokenize: give -m MODEL.gguf\n"); return 1; }
    if (llm_gguf_open(&g, a->engine.model_path, err) != 0) { fprintf(stderr, "llm: %s\n", err); return 1; }
    llm_tokenizer *t = llm_tokenizer_load(&g, err);
    if (!t) { fprintf(stderr, "llm: %s\n", err); llm_gguf_close(&g); return 1; }
    if (*llm_tokenizer_warning(t)) fprintf(stderr, "llm: warning: %s\n", llm_tokenizer_warning(t));
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
/* llm bench --workload edit: a request to rewrite a text of 4 to 9 sentences with one name changed, rendered
 * by the model's chat template (as a user message); its answer is mostly the text again. Returns the prompt
 * (malloc'ed) or NULL. */
static char *edit_prompt(const llm_chat_template *tmpl, uint64_t *rng) {
    static const char *const sentences[] = {
        "%s opened the shop at seven, as every morning, and swept the steps before the first customers came.",
        "The river had risen overnight, and %s walked along the bank to see how far the water had come.",
        "At the meeting %s asked for the report on last year's budget to be sent to every member.",
        "Nobody in the village knew that %s had once sailed around the world on a small boat.",
        "The train was late again, so %s read the newspaper from the first page to the last.",
        "When the storm cut the power, %s lit the candles and told the children old stories.",
        "The garden behind the library needs new benches, and %s offered to build them in the spring.",
        "In the evening %s wrote three letters: one to the bank, one to the school and one to an old friend.",
        "The bakery on the corner sells the best bread in town, and %s buys a loaf there every Friday.",
        "After the concert %s stayed behind to help the musicians carry their instruments to the van.",
        "The new bridge will open in March, the mayor said, and %s will cut the ribbon.",
        "On Sundays %s takes the dog for a long walk through the forest and up the hill to the old tower.",
    };
    static const char *const names[][2] = {{"Anna", "Maria"}, {"Tom", "Peter"}, {"Mr. Brown", "Mrs. Green"},
                                           {"the captain", "the teacher"}, {"Lucas", "Sophie"}};
    const char *const *name = names[llm_splitmix64(rng) % (sizeof names / sizeof *names)];
    int n = 4 + (int)(llm_splitmix64(rng) % 6);
    char text[4096], request[4608];
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        char sentence[256];
        size_t pick = llm_splitmix64(rng) % (sizeof sentences / sizeof *sentences);
        snprintf(sentence, sizeof sentence, sentences[pick], name[0]);
        if (i == 0 && sentence[0] >= 'a' && sentence[0] <= 'z') sentence[0] = (char)(sentence[0] - 'a' + 'A');
        at += (size_t)snprintf(text + at, sizeof text - at, "%s%s", i ? " " : "", sentence);
    }
    snprintf(request, sizeof request, "Rewrite this text with \"%s\" changed to \"%s\". Change nothing else "
             "and write only the text.\n\n%s", name[0], name[1], text);
    llm_chat_message msg = {"user", request};
    int len = llm_chat_render(tmpl, &msg, 1, NULL, 1, NULL, 0);
    char *out = len >= 0 ? (char *)malloc((size_t)len + 1) : NULL;
    if (out) llm_chat_render(tmpl, &msg, 1, NULL, 1, out, len + 1);
    return out;
}

/* a prompt of n random token ids below vocab_size (malloc'd; NULL: out of memory). Random ids make every
 * prompt its own: two prompts almost never share a first block, so the prefix cache saves nothing and every
 * prompt token is computed */
static int32_t *random_prompt(uint64_t *rng, int n, int vocab_size) {
    int32_t *ids = (int32_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    for (int i = 0; ids && i < n; i++) ids[i] = (int32_t)(llm_splitmix64(rng) % (uint64_t)vocab_size);
    return ids;
}
/* bench's warmup: one greedy request of n_prompt random ids and 2 output tokens, run to its end */
static int bench_warmup(llm_engine *e, int n_prompt, int vocab_size, char *err) {
    uint64_t rng = 0x5eed;
    int32_t *ids = random_prompt(&rng, n_prompt, vocab_size);
    if (!ids) { snprintf(err, LLM_ERR_LEN, "out of memory"); return -1; }
    llm_sampling_params p = llm_sampling_defaults();
    p.temperature = 0; p.ignore_eos = 1; p.max_tokens = 2;
    int ok = llm_engine_add_request(e, NULL, ids, n_prompt, &p, NULL, err) != 0, failed = 0;
    free(ids);
    while (ok && llm_engine_has_work(e)) {
        const llm_output *out;
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++)
            if (out[i].finish_reason == LLM_FINISH_ERROR && !failed++)
                snprintf(err, LLM_ERR_LEN, "%s", out[i].error);
    }
    return ok && !failed ? 0 : -1;
}
/* the counters of s since w (the gauges as s has them) */
static void stats_since(llm_engine_stats *s, const llm_engine_stats *w) {
    s->prefix_cache_queries -= w->prefix_cache_queries; s->prefix_cache_hits -= w->prefix_cache_hits;
    s->preemptions -= w->preemptions; s->prompt_tokens_computed -= w->prompt_tokens_computed;
    s->generation_tokens -= w->generation_tokens; s->steps -= w->steps;
    s->requests_finished -= w->requests_finished;
    s->grammar_tokens -= w->grammar_tokens; s->grammar_masks -= w->grammar_masks;
    s->grammar_masks_cached -= w->grammar_masks_cached; s->grammar_seconds -= w->grammar_seconds;
    s->spec_drafts -= w->spec_drafts; s->spec_draft_tokens -= w->spec_draft_tokens;
    s->spec_accepted_tokens -= w->spec_accepted_tokens;
    for (int i = 0; i < LLM_SPEC_MAX; i++) s->spec_accepted_at[i] -= w->spec_accepted_at[i];
    s->forward_seconds -= w->forward_seconds; s->prompt_steps -= w->prompt_steps;
    s->logit_rows -= w->logit_rows; s->host_rows -= w->host_rows; s->draft_seconds -= w->draft_seconds;
    s->sample_seconds -= w->sample_seconds;
}

/* llm bench: --num-prompts requests of random lengths (or the edit workload's), all added at once, the
 * engine stepped until they finish; then vLLM's throughput figures, the engine's step and KV-cache
 * statistics, and the process's peak memory. Returns the exit status.
 * Like vLLM's bench throughput it measures the engine alone (no HTTP, no tokenizing of random prompts: they
 * are ids), all the requests queued at time 0, so the scheduler always has work and the figure is the
 * most the engine can do. The steps:
 *   1. the engine made, the model loaded; the workload drawn from --seed (the same for --static)
 *   2. a warmup request, then the counters read, so that stats_since subtracts it from every figure
 *   3. every request added; then the engine stepped until it has no work, each step timed and counted as a
 *      prompt step (it computed prompt tokens) or a decode step, and the KV cache's use sampled
 *   4. the figures: throughput over the whole run, prompt and decode speeds (llama-bench's pp and tg), the
 *      time split, and the vLLM paper's table of KV memory wasted by contiguous reservation vs paging */
static int bench(args_t *a) {
    char err[LLM_ERR_LEN];
    if (!a->engine.model_path && !a->engine.dummy) {
        fprintf(stderr, "llm bench: give -m MODEL.gguf or --dummy NAME\n");
        return 1;
    }
    /* 1. the engine, its load timed; the load line says what the weights and the KV pool take */
    double t_load = now_s();
    llm_engine *e = llm_engine_create(&a->engine, err);
    if (!e) { fprintf(stderr, "llm: %s\n", err); return 1; }
    const llm_model *m = llm_engine_model(e);
    llm_engine_stats st = llm_engine_get_stats(e);
    int bs = st.block_size, max_model_len = st.max_model_len;
    /* a token's K and V in every layer: in each group of layers' blocks */
    double kv_token_bytes = (double)st.kv_bytes_per_block * st.kv_groups / bs,
        mib = kv_token_bytes / (1 << 20);
    char weights[160];
    fprintf(stderr, "llm bench: %s on %s, loaded in %.2f s; %s; KV pool %d blocks of %d tokens (%.1f MiB), "
            "%s batching\n", m->name, st.backend, now_s() - t_load,
            weights_summary(m, weights, sizeof weights), st.num_blocks, bs,
            (double)st.num_blocks * st.kv_bytes_per_block / (1 << 20),
            a->engine.static_batching ? "static" : "continuous");

    /* the workload: uniform lengths from a fixed seed, so --static runs exactly the same requests */
    uint64_t rng = a->bench_seed * 0x9e3779b97f4a7c15ull + 12345;
    int64_t total_in = 0;
    int rejected = 0;
    llm_chat_template tmpl;
    int32_t stop_ids[8];
    int n_stop_ids = 0;
    if (a->workload_edit && chat_template_load(m, a, &tmpl, stop_ids, &n_stop_ids, err) != 0) {
        fprintf(stderr, "llm bench: --workload edit needs a model with a chat template: %s\n", err);
        llm_engine_destroy(e);
        return 1;
    }
    /* 2. a warmup request first, left out of every figure (llama-bench runs one too): the weights' pages get
     * mapped, the pool's first blocks touched and the caches warm before the clock starts, as they are for
     * every request but the first of a long run (SmolLM2 pp512, one thread: the first prompt of a process
     * 2-7% slower than one after it). Random ids of its own: no block of it is a prefix of the workload's */
    llm_engine_stats warm = {0}; /* the counters when the clock starts */
    if (!a->no_warmup) {
        double w0 = now_s();
        if (bench_warmup(e, a->in_max < max_model_len - 2 ? a->in_max : max_model_len - 2, m->cfg.vocab_size,
                         err) != 0)
            fprintf(stderr, "llm bench: no warmup (%s)\n", err);
        warm = llm_engine_get_stats(e);
        printf("warmup: 1 request, %lld prompt tokens and %lld output tokens in %.2f s (in none of the "
               "figures)\n", (long long)warm.prompt_tokens_computed, (long long)warm.generation_tokens,
               now_s() - w0);
    }
    /* 3. the clock starts, every request is added (the edit workload's as text: the engine tokenizes it;
     * the random one's as ids, a prompt cut to fit the context), then the steps */
    st = llm_engine_get_stats(e);
    double t0 = now_s();
    for (int r = 0; r < a->num_prompts && a->workload_edit; r++) {
        char *prompt = edit_prompt(&tmpl, &rng);
        llm_sampling_params p = llm_sampling_defaults();
        p.temperature = 0; p.max_tokens = 1024; p.stop_token_ids = stop_ids; p.n_stop_token_ids = n_stop_ids;
        /* its tokens: at the end */
        if (!prompt || !llm_engine_add_request(e, prompt, NULL, 0, &p, NULL, err)) {
            fprintf(stderr, "llm bench: request rejected: %s\n", prompt ? err : "out of memory");
            rejected++;
        }
        free(prompt);
    }
    for (int r = 0; r < a->num_prompts && !a->workload_edit; r++) {
        int in_len = a->in_min + (int)(llm_splitmix64(&rng) % (uint64_t)(a->in_max - a->in_min + 1));
        int out_len = a->out_min + (int)(llm_splitmix64(&rng) % (uint64_t)(a->out_max - a->out_min + 1));
        if (in_len >= max_model_len) in_len = max_model_len - 1;
        int32_t *ids = random_prompt(&rng, in_len, m->cfg.vocab_size);
        if (!ids) { fprintf(stderr, "llm bench: out of memory\n"); llm_engine_destroy(e); return 1; }
        llm_sampling_params p = llm_sampling_defaults();
        p.temperature = 0; p.ignore_eos = 1; p.max_tokens = out_len;
        /* --json-schema, --grammar or --regex: every request follows it (greedy unless --temp is given,
         * with --seed; and the other sampling flags given) */
        p.grammar = a->sampling.grammar;
        if (a->sampling_given & LLM_SAMPLING_TEMP) { p.temperature = a->sampling.temperature;
                                                     p.seed = (int64_t)r; }
        if (a->sampling_given & LLM_SAMPLING_TOP_K) p.top_k = a->sampling.top_k;
        if (a->sampling_given & LLM_SAMPLING_TOP_P) p.top_p = a->sampling.top_p;
        if (a->sampling_given & LLM_SAMPLING_MIN_P) p.min_p = a->sampling.min_p;
        if (a->sampling_given & LLM_SAMPLING_REPEAT) p.repetition_penalty = a->sampling.repetition_penalty;
        if (llm_engine_add_request(e, NULL, ids, in_len, &p, NULL, err)) total_in += in_len;
        else { fprintf(stderr, "llm bench: request rejected: %s\n", err); rejected++; }
        free(ids);
    }
    int64_t total_out = 0, done = 0, failed = 0, samples = 0;
    double sum_usage = 0, sum_running = 0, sum_kv_tokens = 0, sum_blocks_used = 0, last_progress = 0;
    int peak_running = 0;
    /* steps that computed prompt tokens, and steps of decodes only: llama-bench's pp and tg figures */
    double prompt_s = 0, decode_s = 0;
    int64_t prompt_tokens = 0, decode_tokens = 0;
    while (llm_engine_has_work(e)) {
        const llm_output *out;
        int64_t prompt_before = st.prompt_tokens_computed;
        double step_t0 = now_s();
        int n = llm_engine_step(e, &out);
        double step_s = now_s() - step_t0;
        int64_t step_out = 0;
        for (int i = 0; i < n; i++) step_out += out[i].n_tokens;
        st = llm_engine_get_stats(e);
        /* a step that computed any prompt token counts whole as a prompt step, the decodes batched with it
         * too; so "decode" is the speed of steps with decodes alone, and "prompt" is a lower bound */
        if (st.prompt_tokens_computed > prompt_before) {
            prompt_s += step_s; prompt_tokens += st.prompt_tokens_computed - prompt_before;
        } else { decode_s += step_s; decode_tokens += step_out; }
        for (int i = 0; i < n; i++) {
            total_out += out[i].n_tokens;
            done += out[i].finish_reason != LLM_FINISH_NONE;
            if (a->workload_edit && out[i].finish_reason) total_in += out[i].n_prompt_tokens;
            if (out[i].finish_reason == LLM_FINISH_ERROR && failed++ == 0)
                fprintf(stderr, "llm bench: %s\n", out[i].error);
        }
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
    /* 4. the figures: the engine's counters since the warmup, the throughputs over the whole run */
    double elapsed = now_s() - t0;
    st = llm_engine_get_stats(e);
    stats_since(&st, &warm);
    fprintf(stderr, "\r%100s\r", "");
    printf("requests: %lld in %.2f s, %.2f requests/s\n", (long long)done, elapsed, done / elapsed);
    if (failed) printf("failed: %lld requests (the first error is above)\n", (long long)failed);
    printf("output throughput: %.1f tok/s\n", total_out / elapsed);
    printf("total throughput: %.1f tok/s (prompt %lld + output %lld tokens)\n",
           (total_in + total_out) / elapsed, (long long)total_in, (long long)total_out);
    printf("prompt processing: %.1f tok/s (%lld tokens in %.2f s, the steps that computed prompt tokens)\n",
           prompt_s > 0 ? prompt_tokens / prompt_s : 0.0, (long long)prompt_tokens, prompt_s);
    printf("decode: %.1f tok/s (%lld tokens in %.2f s, the steps of decodes only)\n",
           decode_s > 0 ? decode_tokens / decode_s : 0.0, (long long)decode_tokens, decode_s);
    printf("memory: resident %.1f MiB now, %.1f MiB at the peak (weights as mapped, the KV pool's pages in "
           "use, scratch)\n", proc_memory_bytes("VmRSS") / (1 << 20), proc_memory_bytes("VmHWM") / (1 << 20));
    double backend_s = st.forward_seconds + st.sample_seconds;
    printf("time split: backend %.3f s (%.0f%%: forward %.3f s, sample steps %.3f s), host %.3f s "
           "(scheduling, the rows it samples, text; not the draft model's passes); steps: %lld with prompt "
           "tokens, %lld decode only; logit rows %lld, %lld of them read by the host\n",
           backend_s, elapsed > 0 ? 100.0 * backend_s / elapsed : 0.0, st.forward_seconds, st.sample_seconds,
           elapsed - backend_s - st.draft_seconds, (long long)st.prompt_steps,
           (long long)(st.steps - st.prompt_steps), (long long)st.logit_rows, (long long)st.host_rows);
    if (st.grammar_tokens)
        printf("grammar: %.3f ms per token, %.1f%% of a decode step's time per token "
               "(%lld tokens; %lld needed "
               "a full mask, %lld of them from the cache)\n", 1e3 * st.grammar_seconds / st.grammar_tokens,
               decode_tokens && decode_s > 0 ? 100.0 * st.grammar_seconds / st.grammar_tokens /
               (decode_s / decode_tokens) : 0.0, (long long)st.grammar_tokens, (long long)st.grammar_masks,
               (long long)st.grammar_masks_cached);
    printf("mean KV usage: %.1f%%, peak running: %d, steps: %lld, preemptions: %lld, prompt tokens computed: "
           "%lld\n", samples ? 100.0 * sum_usage / samples : 0.0, peak_running, (long long)st.steps,
           (long long)st.preemptions, (long long)st.prompt_tokens_computed);
    print_spec(stdout, &st);

    /* The waste table of the vLLM paper: reserving max_model_len contiguous slots per request against
     * paging. Tokens here are a token's K and V in every layer: with windows (several groups of layers) the
     * pool's blocks hold less than that for the tokens they serve, and paging's waste goes below zero. */
    /* Means over the steps with work: R running requests holding T tokens of K/V (their computed tokens).
     * Contiguous: each running request reserves max_model_len slots, R * max_model_len in all. Paged: the
     * blocks in use, in tokens (bs per block; each of the kv_groups groups of layers holds its own blocks,
     * so a token's K/V in every layer takes a slot in kv_groups blocks). Wasted: 1 - T / what it holds. */
    double R = samples ? sum_running / samples : 0, T = samples ? sum_kv_tokens / samples : 0;
    double reserve_tokens = R * max_model_len;
    double paged_tokens = (samples ? sum_blocks_used / samples : 0) * bs / st.kv_groups;
    double mean_len = done ? (double)(total_in + total_out) / done : 1;
    double pool_tokens = (double)st.num_blocks * bs / st.kv_groups;
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

/* ---- llm tune: which CPU kernels to run, where the build carries several (make llm-dist) --------------- */
/* A distribution build starts the best kernels the CPU has by its features (AVX-512 VNNI, then AVX-512, then
 * AVX2). Where a CPU runs two, which is faster depends on the CPU (how wide its vector units really are, what
 * its 512-bit instructions cost) and is measured, not assumed: llm tune times each variant the CPU can run on
 * the model, a 512-token prompt then 128 tokens of decode (llama-bench's pp512 and tg128, one greedy request
 * of random ids), the variants taking turns for 3 rounds, and writes the one whose medians take the least
 * time for both (a chat turn: a prompt, then its answer) to the tune file, with the CPU it was measured on
 * (cpuid's vendor and signature). Every later start on that CPU without LLM_CPU_VARIANT runs the kernels it
 * names (tune_apply); on another CPU (a home directory shared between machines) the file is not used. */
static const char *g_tune_file; /* the tune file whose kernels this run uses, or NULL */

#ifdef LLM_CPU_DISPATCH
#include <cpuid.h>
#include <sys/stat.h>
static char g_tune_path[4096];
/* LLM_TUNE_FILE, else $XDG_CACHE_HOME/llm/cpu-kernels, else ~/.cache/llm/cpu-kernels; -1 when none is set */
static int tune_file_path(char *out, size_t cap) {
    const char *file = getenv("LLM_TUNE_FILE"), *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = file && file[0] ? snprintf(out, cap, "%s", file)
          : cache && cache[0] ? snprintf(out, cap, "%s/llm/cpu-kernels", cache)
          : home && home[0] ? snprintf(out, cap, "%s/.cache/llm/cpu-kernels", home) : -1;
    return n > 0 && (size_t)n < cap ? 0 : -1;
}
/* the CPU as cpuid names it: vendor and signature (family, model, stepping), "GenuineIntel-000806f8" */
static void tune_cpu_id(char *out, size_t cap) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0, vendor[3] = {0, 0, 0};
    __get_cpuid(0, &eax, &vendor[0], &vendor[2], &vendor[1]);
    char name[13];
    memcpy(name, vendor, 12);
    name[12] = 0;
    __get_cpuid(1, &eax, &ebx, &ecx, &edx);
    snprintf(out, cap, "%s-%08x", name, eax);
}
/* the variant of this build called name that this CPU can run, or NULL */
static const llm_cpu_variant *tune_runnable(const char *name) {
    for (int i = 0; llm_cpu_variants[i]; i++)
        if (!strcmp(llm_cpu_variants[i]->name, name))
            return llm_cpu_missing_feature(llm_cpu_variants[i]->built_for, llm_cpu_supports)
                       ? NULL : llm_cpu_variants[i];
    return NULL;
}
#endif

/* At the start of every command: the tune file's kernels, when LLM_CPU_VARIANT is not set and the file was
 * written on this CPU (it then sets LLM_CPU_VARIANT, which the CPU backend reads when it starts) */
static void tune_apply(void) {
#ifdef LLM_CPU_DISPATCH
    const char *wanted = getenv("LLM_CPU_VARIANT");
    if ((wanted && wanted[0]) || tune_file_path(g_tune_path, sizeof g_tune_path) != 0) return;
    FILE *f = fopen(g_tune_path, "r");
    if (!f) return;
    char line[256], cpu[256] = "", kernels[256] = "", here[64];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!strncmp(line, "cpu ", 4)) snprintf(cpu, sizeof cpu, "%s", line + 4);
        else if (!strncmp(line, "kernels ", 8)) snprintf(kernels, sizeof kernels, "%s", line + 8);
    }
    fclose(f);
    tune_cpu_id(here, sizeof here);
    if (strcmp(cpu, here)) return; /* measured on another CPU */
    if (tune_runnable(kernels) && setenv("LLM_CPU_VARIANT", kernels, 1) == 0) {
        g_tune_file = g_tune_path;
        return;
    }
    fprintf(stderr, "llm: warning: %s names the kernels '%s', none this build has that this CPU runs: the "
            "CPU's best by its features run (llm tune writes the file again)\n", g_tune_path, kernels);
#endif
}

#ifdef LLM_CPU_DISPATCH
/* one round of llm tune on an engine: a prompt of n_prompt random ids from seed (each round its own: the
 * prefix cache would hold a prompt seen before), then n_decode tokens, greedy; the seconds of the steps that
 * computed the prompt and of those that decoded. -1 on an error */
static int tune_round(llm_engine *e, uint64_t seed, int n_prompt, int n_decode, double *prompt_s,
                      double *decode_s, int *decoded, char *err) {
    uint64_t rng = seed;
    int vocab_size = llm_engine_model(e)->cfg.vocab_size;
    int32_t *ids = random_prompt(&rng, n_prompt, vocab_size);
    if (!ids) { snprintf(err, LLM_ERR_LEN, "out of memory"); return -1; }
    llm_sampling_params p = llm_sampling_defaults();
    p.temperature = 0; p.ignore_eos = 1; p.max_tokens = 1 + n_decode;
    int ok = llm_engine_add_request(e, NULL, ids, n_prompt, &p, NULL, err) != 0, failed = 0;
    free(ids);
    *prompt_s = *decode_s = 0; *decoded = 0;
    while (ok && llm_engine_has_work(e)) {
        const llm_output *out;
        llm_engine_stats before = llm_engine_get_stats(e);
        double t0 = now_s();
        int n = llm_engine_step(e, &out);
        double step_s = now_s() - t0;
        llm_engine_stats after = llm_engine_get_stats(e);
        if (after.prompt_tokens_computed > before.prompt_tokens_computed) *prompt_s += step_s;
        else { *decode_s += step_s; for (int i = 0; i < n; i++) *decoded += out[i].n_tokens; }
        for (int i = 0; i < n; i++)
            if (out[i].finish_reason == LLM_FINISH_ERROR && !failed++)
                snprintf(err, LLM_ERR_LEN, "%s", out[i].error);
    }
    return ok && !failed && *prompt_s > 0 && *decode_s > 0 ? 0 : -1;
}
static int tune_compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
#endif

static int tune(args_t *a) {
#ifndef LLM_CPU_DISPATCH
    (void)a;
    printf("llm tune: this build has one set of CPU kernels, chosen when it was compiled (-march): nothing "
           "to choose between (make llm-dist builds one binary with several, which llm tune chooses from)\n");
    return 0;
#else
    enum { ROUNDS = 3, MAX_VARIANTS = 8 };
    char err[LLM_ERR_LEN], cpu[64];
    if (!a->engine.model_path) { fprintf(stderr, "llm tune: give the model with -m MODEL.gguf\n"); return 1; }
    if (tune_file_path(g_tune_path, sizeof g_tune_path) != 0) {
        fprintf(stderr, "llm tune: no place for the tune file: set LLM_TUNE_FILE, XDG_CACHE_HOME or HOME\n");
        return 1;
    }
    if (!a->engine.create_backend) a->engine.create_backend = llm_cpu_backend_create;
    tune_cpu_id(cpu, sizeof cpu);
    /* the variants this CPU runs, each its own engine (LLM_CPU_VARIANT names it as the engine starts) */
    const char *saved = getenv("LLM_CPU_VARIANT");
    char saved_copy[64];
    snprintf(saved_copy, sizeof saved_copy, "%s", saved ? saved : "");
    llm_engine *engines[MAX_VARIANTS] = {0};
    const char *names[MAX_VARIANTS];
    int n = 0, rc = 1;
    for (int i = 0; llm_cpu_variants[i] && n < MAX_VARIANTS; i++) {
        if (!tune_runnable(llm_cpu_variants[i]->name)) continue;
        setenv("LLM_CPU_VARIANT", llm_cpu_variants[i]->name, 1);
        names[n] = llm_cpu_variants[i]->name;
        if (!(engines[n++] = llm_engine_create(&a->engine, err))) {
            fprintf(stderr, "llm tune: %s\n", err);
            goto done;
        }
    }
    if (saved) setenv("LLM_CPU_VARIANT", saved_copy, 1);
    else unsetenv("LLM_CPU_VARIANT");
    if (n == 0) {
        printf("llm tune: this CPU runs none of this build's kernels, only its plain C: nothing to choose\n");
        rc = 0;
        goto done;
    }
    /* the prompt: 512 tokens, or what the context leaves with the decode's 128 */
    int n_decode = 128, max_len = llm_engine_get_stats(engines[0]).max_model_len;
    int n_prompt = max_len - n_decode - 2 < 512 ? max_len - n_decode - 2 : 512;
    if (n_prompt < 1) { fprintf(stderr, "llm tune: the model's context is too short\n"); goto done; }
    printf("llm tune: %s on the CPU %s: %d kernels, each a %d-token prompt then %d tokens of decode, in "
           "turns, %d rounds after a warmup\n", llm_engine_model(engines[0])->name, cpu, n, n_prompt,
           n_decode, ROUNDS);
    double seconds[MAX_VARIANTS][ROUNDS], pp[MAX_VARIANTS][ROUNDS], tg[MAX_VARIANTS][ROUNDS];
    for (int v = 0; v < n; v++) /* the warmup: each engine's pages mapped and touched */
        if (bench_warmup(engines[v], n_prompt, llm_engine_model(engines[v])->cfg.vocab_size, err) != 0) {
            fprintf(stderr, "llm tune: %s\n", err);
            goto done;
        }
    for (int r = 0; r < ROUNDS; r++)
        for (int v = 0; v < n; v++) {
            double prompt_s, decode_s;
            int decoded;
            if (tune_round(engines[v], 0x70e + (uint64_t)r, n_prompt, n_decode, &prompt_s, &decode_s,
                           &decoded, err) != 0) {
                fprintf(stderr, "llm tune: %s kernels: %s\n", names[v], err[0] ? err : "no steps timed");
                goto done;
            }
            /* the time of n_prompt prompt tokens and n_decode decoded ones at the rates measured */
            pp[v][r] = n_prompt / prompt_s; tg[v][r] = decoded / decode_s;
            seconds[v][r] = prompt_s + decode_s / decoded * n_decode;
        }
    printf("| kernels | pp%d tok/s | tg%d tok/s | seconds for both | against the fastest |\n"
           "|---|---|---|---|---|\n", n_prompt, n_decode);
    double median[MAX_VARIANTS];
    int best = 0;
    for (int v = 0; v < n; v++) {
        qsort(seconds[v], ROUNDS, sizeof(double), tune_compare_double);
        qsort(pp[v], ROUNDS, sizeof(double), tune_compare_double);
        qsort(tg[v], ROUNDS, sizeof(double), tune_compare_double);
        median[v] = seconds[v][ROUNDS / 2];
        if (median[v] < median[best]) best = v;
    }
    for (int v = 0; v < n; v++)
        printf("| %s | %.1f | %.1f | %.3f | %.2fx |\n", names[v], pp[v][ROUNDS / 2], tg[v][ROUNDS / 2],
               median[v], median[best] / median[v]);
    /* the file: its directories made, written beside and renamed over, so a reader never sees half of it */
    char tmp[sizeof g_tune_path + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", g_tune_path);
    for (char *slash = strchr(g_tune_path + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = 0;
        mkdir(g_tune_path, 0755); /* one that exists already stays */
        *slash = '/';
    }
    FILE *f = fopen(tmp, "w");
    int wrote = f && fprintf(f, "# written by llm tune on %s: the CPU kernels every llm start on this CPU "
                                "runs, unless LLM_CPU_VARIANT says; delete it for the CPU's best by its "
                                "features\ncpu %s\nkernels %s\n", llm_engine_model(engines[0])->name, cpu,
                             names[best]) > 0;
    if (f && fclose(f) != 0) wrote = 0;
    if (!wrote || rename(tmp, g_tune_path) != 0) {
        fprintf(stderr, "llm tune: cannot write %s: %s\n", g_tune_path, strerror(errno));
        remove(tmp);
        goto done;
    }
    printf("the fastest: %s; written to %s: llm runs it on this CPU unless LLM_CPU_VARIANT says otherwise\n",
           names[best], g_tune_path);
    rc = 0;
done:
    if (saved) setenv("LLM_CPU_VARIANT", saved_copy, 1);
    else unsetenv("LLM_CPU_VARIANT");
    for (int v = 0; v < n; v++) llm_engine_destroy(engines[v]);
    return rc;
#endif
}

/* llm serve, the OpenAI-compatible HTTP server, and llm bench serve, its load generator: in their own file */
#include "server.c"

/* The command is argv[1] (tokenize, bench, bench serve, chat, serve, grammar; none: generate or a REPL);
 * the flags after it are read by parse_args, then the command runs.
 * The order matters: the commands that need no engine (bench serve, tokenize, grammar) return before one
 * is made, and llm bench and llm serve make their own engines (bench times its load; serve runs
 * it on its engine thread); only generate, the REPL and chat share the engine made here, after which the
 * sampling is resolved against the model's file (resolve_sampling) and the load lines say where it runs
 * and why. */
int main(int argc, char **argv) {
#ifdef _OPENMP
    /* OpenMP's threads spin while they wait for work (libgomp: 300,000 turns by default): beside a busy
     * neighbour that costs us 75 times over, and the neighbour its share of the CPU. Not spinning at all
     * (OMP_WAIT_POLICY=passive) costs 2.4 times on an idle machine, where a decode step is hundreds of short
     * parallel loops. A short spin of 2,000 turns (microseconds) keeps the idle speed and gives the CPU back
     * when it is shared. libgomp reads this once, as the program starts: so when neither is set, set the
     * short spin and start again. */
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT") && setenv("GOMP_SPINCOUNT", "2000", 1) == 0)
        execv("/proc/self/exe", argv); /* returns only when it fails: then run as we are */
#endif
    tune_apply(); /* a distribution build: the kernels llm tune chose for this CPU */
    /* 1. the defaults, then the command word, then the flags */
    args_t a;
    memset(&a, 0, sizeof a);
    a.engine = llm_engine_defaults();
    a.sampling = llm_sampling_defaults();
    a.sampling.max_tokens = 128;
    a.num_prompts = 256; a.in_min = 100; a.in_max = 1024; a.out_min = 100; a.out_max = 1024;
    a.host = "127.0.0.1"; a.port = 8000; a.max_queue = 4096; a.request_timeout = 30; a.drain_timeout = 30;
    a.store_max = 1024; a.store_max_bytes = (size_t)256 << 20;
    int cmd = 0; /* 0 generate/REPL, 1 tokenize, 2 bench, 3 chat, 4 serve, 5 grammar, 6 embed, 7 tune */
    int start = 1;
    if (argc > 1 && !strcmp(argv[1], "tokenize")) { cmd = 1; start = 2; }
    else if (argc > 2 && !strcmp(argv[1], "bench") && !strcmp(argv[2], "serve"))
        return bench_serve(argc, argv, 3);
    else if (argc > 1 && !strcmp(argv[1], "bench")) { cmd = 2; start = 2; }
    else if (argc > 1 && !strcmp(argv[1], "chat")) { cmd = 3; start = 2; }
    else if (argc > 1 && !strcmp(argv[1], "serve")) { cmd = 4; start = 2; }
    else if (argc > 1 && !strcmp(argv[1], "grammar")) { cmd = 5; start = 2; }
    else if (argc > 1 && !strcmp(argv[1], "embed")) { cmd = 6; start = 2; }
    else if (argc > 1 && !strcmp(argv[1], "tune")) { cmd = 7; start = 2; }
    int pos = parse_args(argc, argv, start, &a);
    if (pos < 0) return 1;
    /* 2. the commands that need no engine of this function's: tokenize, grammar, bench, serve */
    if (cmd == 1) {
        if (pos >= argc) { fprintf(stderr, "llm tokenize: give the TEXT\n"); return 1; }
        return tokenize_cmd(&a, argv[pos]);
    }
    if (cmd == 6) return embed_cmd(&a, argv + pos, argc - pos);
    if (pos < argc) {
        fprintf(stderr, "llm: unexpected argument '%s' (see llm --help)\n", argv[pos]);
        return 1;
    }
    char *gbnf = NULL;
    if (cmd == 4 && (a.grammar_file || a.json_schema || a.regex)) {
        fprintf(stderr, "llm serve: --grammar, --json-schema and --regex are per request (response_format, "
                "structured_outputs)\n");
        return 1;
    }
    if (grammar_from_flags(&a, &gbnf) != 0) return 1;
    if (cmd == 5) { /* llm grammar: the GBNF that --json-schema or --regex makes, for reading or for
                     * llama.cpp */
        if (!gbnf) { fprintf(stderr, "llm grammar: give --json-schema, --regex or --grammar\n"); return 1; }
        fputs(gbnf, stdout);
        free(gbnf);
        return 0;
    }
    if (cmd == 2) { int rc = bench(&a); free(gbnf); return rc; }
    if (cmd == 7) { free(gbnf); return tune(&a); }
    if (cmd == 4) {
        if (!a.engine.model_path) {
            fprintf(stderr, "llm serve: give a model with -m MODEL.gguf\n");
            return 1;
        }
        if (a.port < 0 || a.port > 65535 || a.max_queue < 1 || !(a.request_timeout > 0)) {
            fprintf(stderr, "llm serve: --port must be 0..65535 (0: any free port), --max-queue >= 1, "
                    "--request-timeout > 0\n");
            return 1;
        }
        serve_config sc = {a.engine, a.host, a.api_key, a.served_model_name, a.chat_template, a.port,
                           a.max_queue, a.request_timeout, a.reasoning_none, a.drain_timeout,
                           a.allowed_origins, a.store_max, a.store_max_bytes,
                           a.pooling, a.matryoshka};
        return serve(&sc);
    }
    if (!a.engine.model_path) {
        fprintf(stderr, "llm: give a model with -m MODEL.gguf (see llm --help)\n");
        return 1;
    }
    /* 3. generate, the REPL or chat: the engine, the load lines, the sampling, then the command */
    char err[LLM_ERR_LEN];
    double t0 = now_s();
    llm_engine *e = llm_engine_create(&a.engine, err);
    if (!e) { fprintf(stderr, "llm: %s\n", err); free(gbnf); return 1; }
    const char *tok_warning = llm_tokenizer_warning(llm_engine_model(e)->tok);
    if (*tok_warning) fprintf(stderr, "llm: warning: %s\n", tok_warning);
    llm_engine_stats st = llm_engine_get_stats(e);
    const llm_model *m = llm_engine_model(e);
    /* without -p: a chat when the model has a chat template (or chat was asked for), else the REPL */
    int chat_mode = !a.prompt &&
        (cmd == 3 || (m->tok && llm_gguf_string(&m->gguf, "tokenizer.chat_template").len > 0));
    char weights[160], where[LLM_ERR_LEN + 200], origin[512], sampling[160];
    fprintf(stderr, "llm: loaded %s (%s) in %.3f s; %s\n", a.engine.model_path, m->name, now_s() - t0,
            weights_summary(m, weights, sizeof weights));
    if (a.engine.spec_model_path)
        fprintf(stderr, "llm: speculative decoding: the draft model %s proposes up to %d tokens a step\n",
                a.engine.spec_model_path, a.engine.spec_tokens);
    /* where it runs, and what a user can change about it: threads, and why not the GPU. On the CPU the line
     * names the thread count, whether it is fixed (OMP_NUM_THREADS) or a ceiling the backend lowers while
     * other processes keep cores busy, and a wait policy the user set (the short spin set above is not
     * named); then why the GPU is not used: --cpu, the CUDA backend's note, or a build without CUDA */
    const char *note = st.backend_note;
    if (!strncmp(note, "cuda: ", 6)) note += 6;
    if (!strcmp(st.backend, "cuda")) snprintf(where, sizeof where, "the GPU (CUDA)");
    else {
#ifdef _OPENMP
        int n_threads = omp_get_max_threads();
        const char *policy = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
        int own_wait = policy || (spin && strcmp(spin, "2000") != 0); /* 2000: the short spin set above */
        /* without OMP_NUM_THREADS the backend leaves a core to each other busy process, step by step */
        int fixed = getenv("OMP_NUM_THREADS") != NULL;
        const char *cpu = !strcmp(st.backend, "cpu") ? "CPU" :
                          !strcmp(st.backend, "cpu-int8") ? "CPU with 8-bit activations (cpu-int8)" :
                          !strcmp(st.backend, "cpu-exact") ? "CPU's exact path (cpu-exact)" : st.backend;
        int at = snprintf(where, sizeof where, "the %s%s%s%s%s, %s%d thread%s (%s)%s%s%s%s",
                          cpu, st.backend_kernels ? " (" : "", st.backend_kernels ? st.backend_kernels : "",
                          st.backend_kernels ? " kernels" : "",
                          !st.backend_kernels ? "" : g_tune_file ? ", chosen by llm tune)" : ")",
                          fixed ? "" : "up to ", n_threads,
                          n_threads == 1 ? "" : "s",
                          fixed ? "OMP_NUM_THREADS" : "fewer while other processes keep cores busy; "
                                                      "OMP_NUM_THREADS=N fixes how many",
                          own_wait ? ", waiting as " : "", policy ? "OMP_WAIT_POLICY=" : "",
                          policy ? policy : "", own_wait && !policy ? "GOMP_SPINCOUNT=" : "");
        if (own_wait && !policy && at > 0 && (size_t)at < sizeof where)
            snprintf(where + at, sizeof where - (size_t)at, "%s", spin);
#else
        snprintf(where, sizeof where, "the %s, one thread (built without OpenMP)",
                 !strcmp(st.backend, "cpu") ? "CPU" : st.backend);
#endif
        size_t end = strlen(where);
#ifdef LLM_CUDA
        const char *why = note[0] ? note : "--cpu was given";
#else
        const char *why = "this llm was built without it (make builds llm.cu when nvcc is on the PATH)";
#endif
        snprintf(where + end, sizeof where - end, "; not the GPU: %s", why);
    }
    fprintf(stderr, "llm: running on %s\n", where);
    resolve_sampling(&a, m, chat_mode, origin, sizeof origin);
    fprintf(stderr, "llm: sampling: %s (%s)\n", sampling_text(&a.sampling, sampling, sizeof sampling),
            origin);
    int rc = a.prompt ? generate(e, &a, a.prompt, 1) : chat_mode ? chat(e, &a, origin) : repl(e, &a);
    llm_engine_destroy(e);
    free(gbnf);
    return rc;
}
