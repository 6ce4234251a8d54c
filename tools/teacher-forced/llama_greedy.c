// llama_greedy MODEL N_TOKENS PROMPT_ID...: llama.cpp's greedy continuation of the prompt ids (one token a
// decode, on the CPU, one thread), printed as JSON with the smallest gap between the top two logits on the way.
// Built as llama_tf.c is (see README.md): the references of random models whose keys llm reads anew come so.
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    if (argc < 4) return 2;
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) { fprintf(stderr, "load failed\n"); return 1; }
    int n_gen = atoi(argv[2]), n = argc - 3, ids[4096];
    for (int i = 0; i < n; i++) ids[i] = atoi(argv[3 + i]);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512; cp.n_batch = 512; cp.n_threads = cp.n_threads_batch = 1;
    struct llama_context *c = llama_init_from_model(m, cp);
    int V = llama_vocab_n_tokens(llama_model_get_vocab(m));
    double gap = INFINITY;
    printf("{\"completion_token_ids\": [");
    for (int step = 0, pos = 0, todo = n; step < n_gen; step++) {
        struct llama_batch b = llama_batch_init(todo, 0, 1);
        for (int i = 0; i < todo; i++) {
            b.token[i] = ids[pos + i]; b.pos[i] = pos + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
            b.logits[i] = i == todo - 1;
        }
        b.n_tokens = todo;
        if (llama_decode(c, b)) { fprintf(stderr, "decode failed\n"); return 1; }
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
    printf("], \"min_top2_logit_gap\": %.5f}\n", gap);
    return 0;
}
