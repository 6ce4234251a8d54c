/* tools/kv_fidelity.c - each KV cache type against the exact path, over many positions. Text files are
 * tokenized and cut into windows of 512 tokens (at most 4 a file); each window is teacher-forced through the
 * exact path (f32 weights converted, f32 cache) and through the default CPU path with an f16 (the default),
 * q8_0, q4_0 and f32 cache, asking for the top 20 prompt logprobs at every position. Prints, per cache type,
 * the positions whose top-1 token is the exact path's and the mean KL(exact || it) over the exact path's top
 * 20 (a token missing from its top 20 taken at its 20th's logprob), as test.c's "kv quant fidelity" does on
 * its short texts. One thread takes about 5 minutes for 8 windows of SmolLM2-135M.
 *
 *   cc -O3 -march=native -ffp-contract=off -fno-math-errno -fopenmp -I/usr/include/stb -I. \
 *      -o kv_fidelity tools/kv_fidelity.c -lm -lpthread
 *   OMP_NUM_THREADS=1 ./kv_fidelity models/SmolLM2-135M-Instruct.Q4_1.gguf docs/internals.md docs/usage.md
 */
#define LLM_IMPLEMENTATION
#include "llm.h"
#include <stdio.h>

enum { WINDOW = 512, TOP = 20, WINDOWS_PER_FILE = 4, TYPES = 4 };

/* the window's prompt logprobs on a backend and cache type: rows of the top TOP ids and logprobs; the
 * number of rows (WINDOW - 1), or -1 with the reason */
static int run(const char *model, llm_backend *(*create)(const llm_model *, char *), int kv_dtype,
               const int32_t *ids, int32_t (*top)[TOP], float (*logprobs)[TOP]) {
    llm_engine_config cfg = llm_engine_defaults();
    cfg.model_path = model; cfg.create_backend = create; cfg.num_blocks = 64; cfg.kv_cache_dtype = kv_dtype;
    char err[LLM_ERR_LEN];
    llm_engine *e = llm_engine_create(&cfg, err);
    if (!e) { fprintf(stderr, "kv_fidelity: %s\n", err); return -1; }
    llm_sampling_params p = llm_sampling_defaults();
    p.temperature = 0; p.max_tokens = 1; p.prompt_logprobs = TOP;
    int rows = -1;
    if (llm_engine_add_request(e, NULL, ids, WINDOW, &p, NULL, err) <= 0)
        fprintf(stderr, "kv_fidelity: %s\n", err);
    else
        while (llm_engine_has_work(e)) {
            const llm_output *out;
            int n = llm_engine_step(e, &out);
            for (int i = 0; i < n; i++) {
                if (!out[i].prompt_logprobs || out[i].n_prompt_top != TOP) continue;
                rows = out[i].n_prompt_logprobs;
                memcpy(top, out[i].prompt_top_ids, (size_t)rows * TOP * sizeof(int32_t));
                memcpy(logprobs, out[i].prompt_top_logprobs, (size_t)rows * TOP * sizeof(float));
            }
        }
    llm_engine_destroy(e);
    return rows;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: kv_fidelity MODEL.gguf TEXT_FILE...\n"); return 2; }
    const char *model = argv[1];
    llm_model m;
    char err[LLM_ERR_LEN];
    if (llm_model_load(&m, model, err)) { fprintf(stderr, "kv_fidelity: %s\n", err); return 1; }
    static const char *const names[TYPES] = {"f16 (the default)", "q8_0", "q4_0", "f32"};
    static const int dtypes[TYPES] = {LLM_KV_F16, LLM_KV_Q8_0, LLM_KV_Q4_0, LLM_KV_F32};
    static int32_t exact_top[WINDOW][TOP], top[WINDOW][TOP], ids[1 << 18];
    static float exact_lp[WINDOW][TOP], lp[WINDOW][TOP];
    static char text[1 << 20];
    int agree[TYPES] = {0}, total = 0;
    double kl[TYPES] = {0};
    for (int f = 2; f < argc; f++) {
        FILE *fp = fopen(argv[f], "rb");
        if (!fp) { fprintf(stderr, "kv_fidelity: cannot open %s\n", argv[f]); return 1; }
        size_t n = fread(text, 1, sizeof text - 1, fp);
        fclose(fp);
        text[n] = 0;
        int P = llm_tokenize_prompt(m.tok, text, n, ids, 1 << 18);
        for (int at = 0; at + WINDOW <= P && at < WINDOWS_PER_FILE * WINDOW; at += WINDOW) {
            int rows = run(model, llm_cpu_exact_backend_create, LLM_KV_F32, ids + at, exact_top, exact_lp);
            if (rows < 0) return 1;
            for (int c = 0; c < TYPES; c++) {
                if (run(model, llm_cpu_backend_create, dtypes[c], ids + at, top, lp) != rows) return 1;
                for (int i = 0; i < rows; i++) {
                    agree[c] += top[i][0] == exact_top[i][0];
                    for (int k = 0; k < TOP; k++) {
                        float q = lp[i][TOP - 1];
                        for (int j = 0; j < TOP; j++)
                            if (top[i][j] == exact_top[i][k]) q = lp[i][j];
                        kl[c] += exp(exact_lp[i][k]) * (exact_lp[i][k] - q);
                    }
                }
            }
            total += rows;
            fprintf(stderr, "%s, tokens %d to %d: %d positions\n", argv[f], at, at + WINDOW - 1, rows);
        }
    }
    if (!total) { fprintf(stderr, "kv_fidelity: no file holds %d tokens\n", WINDOW); return 1; }
    printf("%s, %d positions, against the exact path:\n", model, total);
    for (int c = 0; c < TYPES; c++)
        printf("  %-18s top-1 %d of %d (%.2f%%), mean KL %.6f nats\n", names[c], agree[c], total,
               100.0 * agree[c] / total, kl[c] / total);
    llm_model_free(&m);
    return 0;
}
