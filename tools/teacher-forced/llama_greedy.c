// llama_greedy MODEL THREADS N_TOKENS PROMPT_ID...: llama.cpp's greedy continuation of the prompt ids on the CPU
// (the prompt in one batch, then one token a decode), printed as JSON with the smallest gap between the top two
// logits on the way, and its speed as `llm -m MODEL -p TEXT -n N --temp 0` reports ours ("prompt N tokens,
// X tok/s; generated M tokens, Y tok/s", on stderr). Built as llama_tf.c is (see README.md): the references of
// random models whose keys llm reads anew come so (one thread), and the speed figures beside ours.
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "llama_cpu.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    if (argc < 5) return 2;
    struct llama_model *m = load_cpu_model(argv[1]);
    if (!m) return 1;
    int threads = atoi(argv[2]), n_gen = atoi(argv[3]), n = argc - 4, ids[4096];
    if (n + n_gen > 4096) return 2;
    for (int i = 0; i < n; i++) ids[i] = atoi(argv[4 + i]);
    struct llama_context_params cp = llama_context_default_params();
    /* N_CTX: the context (4096 unless set): llama.cpp picks Phi-3.5's long or short RoPE factors by it */
    cp.n_ctx = getenv("N_CTX") ? (uint32_t)atoi(getenv("N_CTX")) : 4096;
    cp.n_batch = 4096; cp.n_threads = cp.n_threads_batch = threads;
    struct llama_context *c = llama_init_from_model(m, cp);
    int V = llama_vocab_n_tokens(llama_model_get_vocab(m));
    double gap = INFINITY, t0 = now(), t1 = t0;
    printf("{\"completion_token_ids\": [");
    for (int step = 0, pos = 0, todo = n; step < n_gen; step++) {
        struct llama_batch b = one_sequence(ids, pos, todo, 0);
        if (llama_decode(c, b)) { fprintf(stderr, "decode failed\n"); return 1; }
        if (step == 0) t1 = now();
        pos += todo;
        const float *z = llama_get_logits_ith(c, todo - 1);
        int best = 0, second = -1;
        for (int v = 1; v < V; v++)
            if (z[v] > z[best]) { second = best; best = v; }
            else if (second < 0 || z[v] > z[second]) second = v;
        if (z[best] - z[second] < gap) gap = z[best] - z[second];
        printf("%s%d", step ? ", " : "", best);
        ids[pos] = best; todo = 1;
        llama_batch_free(b);
    }
    double t2 = now();
    printf("], \"min_top2_logit_gap\": %.5f}\n", gap);
    /* the first decode is the prompt's (and gives the first token); the rest are the generated ones' */
    fprintf(stderr, "llama.cpp: prompt %d tokens, %.1f tok/s; generated %d tokens, %.1f tok/s\n", n, n / (t1 - t0),
            n_gen - 1, (n_gen - 1) / (t2 - t1));
    return 0;
}
