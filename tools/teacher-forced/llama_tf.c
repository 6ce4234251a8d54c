// llama_tf MODEL IDS_FILE OUT_F32 THREADS: llama.cpp's teacher-forced logits at every position of the ids
// (one batch, logits for all), written as [n][vocab] f32.
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include "llama_cpu.h"
int main(int argc, char **argv) {
    if (argc < 5) return 2;
    struct llama_model *m = load_cpu_model(argv[1]);
    if (!m) return 1;
    int ids[8192], n = 0;
    FILE *f = fopen(argv[2], "r");
    while (n < 8192 && fscanf(f, "%d", &ids[n]) == 1) n++;
    fclose(f);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048; cp.n_batch = 2048; cp.n_ubatch = 512; cp.n_threads = atoi(argv[4]);
    cp.n_threads_batch = cp.n_threads;
    struct llama_context *c = llama_init_from_model(m, cp);
    const struct llama_vocab *v = llama_model_get_vocab(m);
    int V = llama_vocab_n_tokens(v);
    struct llama_batch b = one_sequence(ids, 0, n, 1);
    if (llama_decode(c, b)) { fprintf(stderr, "decode failed\n"); return 1; }
    FILE *o = fopen(argv[3], "wb");
    for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(c, i), sizeof(float), V, o);
    fclose(o);
    fprintf(stderr, "llama_tf: %d positions, vocab %d\n", n, V);
    return 0;
}
