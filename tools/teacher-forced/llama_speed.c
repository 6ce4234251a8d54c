// llama_speed MODEL THREADS N_GEN PROMPT_ID...: llama.cpp's prompt and decode speed on the CPU, as `llm -m MODEL
// -p TEXT -n N_GEN --temp 0` reports its own (the prompt in one batch, then greedy tokens one a decode):
// "prompt N tokens, X tok/s; generated M tokens, Y tok/s". Built as llama_tf.c is (see README.md).
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    if (argc < 5) return 2;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) { fprintf(stderr, "load failed\n"); return 1; }
    int threads = atoi(argv[2]), n_gen = atoi(argv[3]), n = argc - 4, ids[4096];
    for (int i = 0; i < n; i++) ids[i] = atoi(argv[4 + i]);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048; cp.n_batch = 2048; cp.n_threads = cp.n_threads_batch = threads;
    struct llama_context *c = llama_init_from_model(m, cp);
    int V = llama_vocab_n_tokens(llama_model_get_vocab(m));
    double t0 = now(), t1 = 0;
    for (int step = 0, pos = 0, todo = n; step <= n_gen; step++) {
        struct llama_batch b = llama_batch_init(todo, 0, 1);
        for (int i = 0; i < todo; i++) {
            b.token[i] = ids[pos + i]; b.pos[i] = pos + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
            b.logits[i] = i == todo - 1;
        }
        b.n_tokens = todo;
        if (llama_decode(c, b)) { fprintf(stderr, "decode failed\n"); return 1; }
        pos += todo;
        if (step == 0) t1 = now();
        if (step == n_gen) break;
        const float *z = llama_get_logits_ith(c, todo - 1);
        int best = 0;
        for (int v = 1; v < V; v++) if (z[v] > z[best]) best = v;
        ids[pos] = best; todo = 1;
        llama_batch_free(b);
    }
    double t2 = now();
    printf("llama.cpp: prompt %d tokens, %.1f tok/s; generated %d tokens, %.1f tok/s\n", n, n / (t1 - t0), n_gen,
           n_gen / (t2 - t1));
    return 0;
}
