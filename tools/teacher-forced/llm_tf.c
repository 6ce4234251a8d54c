// llm_tf MODEL IDS_FILE OUT_F32 exact|default|int8 CHUNK: our teacher-forced logits at every position, written as
// [n][vocab] f32, CHUNK tokens a forward call (0: all at once)
#define LLM_IMPLEMENTATION
#include "llm.h"
int main(int argc, char **argv) {
    if (argc < 6) return 2;
    char err[LLM_ERR_LEN] = "";
    llm_model m;
    if (llm_model_load(&m, argv[1], err)) { fprintf(stderr, "%s\n", err); return 1; }
    int32_t ids[8192]; int n = 0;
    FILE *f = fopen(argv[2], "r");
    while (n < 8192 && fscanf(f, "%d", &ids[n]) == 1) n++;
    fclose(f);
    int chunk = atoi(argv[5]);
    if (chunk <= 0) chunk = n;
    llm_backend *be = !strcmp(argv[4], "exact") ? llm_cpu_exact_backend_create(&m, err) :
                      !strcmp(argv[4], "int8") ? llm_cpu_int8_backend_create(&m, err) :
                      llm_cpu_backend_create(&m, err);
    int bs = 16, nb = (n + bs - 1) / bs;
    if (!be || be->alloc_kv(be, nb, bs, err)) { fprintf(stderr, "%s\n", err); return 1; }
    int32_t *table = malloc(nb * 4), *pos = malloc(n * 4), *rows = malloc(n * 4);
    for (int i = 0; i < nb; i++) table[i] = i;
    for (int i = 0; i < n; i++) pos[i] = i;
    int V = m.cfg.vocab_size;
    float *logits = malloc((size_t)chunk * V * 4);
    FILE *o = fopen(argv[3], "wb");
    const int32_t *const tables[1] = {table};
    for (int s = 0; s < n; s += chunk) {
        int c = n - s < chunk ? n - s : chunk;
        for (int i = 0; i < c; i++) rows[i] = i;
        int32_t start[2] = {0, c};
        llm_batch b = {0};
        b.n_tokens = c; b.tokens = ids + s; b.positions = pos + s; b.n_seqs = 1; b.seq_start = start;
        b.block_tables = tables; b.n_logits = c; b.logit_rows = rows;
        if (be->forward(be, &b, logits, err)) { fprintf(stderr, "%s\n", err); return 1; }
        fwrite(logits, 4, (size_t)c * V, o);
    }
    fclose(o);
    fprintf(stderr, "llm_tf: %s, %d positions, vocab %d\n", be->name, n, V);
    return 0;
}
