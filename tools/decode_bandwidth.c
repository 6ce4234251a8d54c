/* tools/decode_bandwidth.c - how close a decode step's matrix products come to the memory's speed. A decode
 * step multiplies one token by every weight matrix, so it reads each weight once from memory, and a plain
 * loop reading the same bytes is its ceiling. For each weight type in a model file, this times llm_matmul
 * with one token (the default path: 16-bit activations) over all the file's matrices, in file order as a
 * step meets them, then a plain loop (64-bit sums) over the same bytes, and prints both in GB/s and their
 * ratio, per type and in all. Threads: OMP_NUM_THREADS, for both.
 *
 *   cc -O3 -march=native -ffp-contract=off -fno-math-errno -fopenmp -I/usr/include/stb -I. \
 *      -o decode_bandwidth tools/decode_bandwidth.c -lm -lpthread
 *   OMP_NUM_THREADS=1 ./decode_bandwidth models/SmolLM2-135M-Instruct.Q4_1.gguf 20
 *
 * The file's matrices should be larger than the last-level cache (SmolLM2-135M's 100 to 270 MB, or more),
 * else both figures are the cache's. */
#define LLM_IMPLEMENTATION
#include "llm.h"
#include <stdio.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the plain loop: every 8 bytes added, four sums apart so that the adds overlap */
static uint64_t read_all(const void *data, uint64_t bytes) {
    const uint64_t *w = (const uint64_t *)data;
    int64_t n = (int64_t)(bytes / 32);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp parallel for reduction(+ : s0, s1, s2, s3) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        s0 += w[4 * i]; s1 += w[4 * i + 1]; s2 += w[4 * i + 2]; s3 += w[4 * i + 3];
    }
    return s0 + s1 + s2 + s3;
}

enum { N_TYPES = 64 };
int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: decode_bandwidth MODEL.gguf REPS\n"); return 2; }
    llm_gguf g;
    char err[LLM_ERR_LEN];
    if (llm_gguf_open(&g, argv[1], err) != 0) { fprintf(stderr, "decode_bandwidth: %s\n", err); return 1; }
    int reps = atoi(argv[2]);
    if (reps < 1) { fprintf(stderr, "decode_bandwidth: REPS is a count of passes, 1 or more\n"); return 2; }
    llm_prefetch_choose(); /* as a CPU backend does */
    int64_t widest = 0, longest = 0;
    for (int64_t i = 0; i < g.n_tensors; i++) {
        const llm_gguf_tensor *t = &g.tensors[i];
        if (t->n_dims != 2 || t->type >= N_TYPES || t->type == LLM_F32) continue;
        widest = (int64_t)t->ne[1] > widest ? (int64_t)t->ne[1] : widest;
        longest = (int64_t)t->ne[0] > longest ? (int64_t)t->ne[0] : longest;
    }
    float *x = (float *)malloc((size_t)longest * sizeof(float));
    float *out = (float *)malloc((size_t)widest * sizeof(float));
    if (!x || !out || !widest) { fprintf(stderr, "decode_bandwidth: no matrices, or no memory\n"); return 1; }
    for (int64_t i = 0; i < longest; i++) x[i] = sinf(0.37f * (float)i);
    /* per type: bytes read per pass, seconds in the products, seconds in the plain loop */
    double bytes[N_TYPES] = {0}, product_s[N_TYPES] = {0}, loop_s[N_TYPES] = {0};
    uint64_t sink = 0;
    for (int r = 0; r <= reps; r++) /* pass 0 warms up (pages mapped, threads started): not counted */
        for (int loop = 0; loop < 2; loop++) /* the products over all matrices, then the plain loop */
            for (int64_t i = 0; i < g.n_tensors; i++) {
                const llm_gguf_tensor *t = &g.tensors[i];
                if (t->n_dims != 2 || t->type >= N_TYPES || t->type == LLM_F32) continue;
                llm_weight w = {t->data, t->type, (int64_t)t->ne[1], (int64_t)t->ne[0]};
                double t0 = now_s();
                if (loop) sink += read_all(t->data, t->nbytes);
                else if (llm_matmul(out, x, &w, 1, LLM_PATH_ACT16) != 0) {
                    fprintf(stderr, "decode_bandwidth: no memory\n");
                    return 1;
                }
                double t1 = now_s();
                if (r == 0) continue;
                (loop ? loop_s : product_s)[t->type] += t1 - t0;
                if (!loop) bytes[t->type] += (double)t->nbytes;
            }
    printf("%s, %d thread(s), %d passes (sink %llu)\n", argv[1], omp_get_max_threads(), reps,
           (unsigned long long)(sink & 1));
    printf("| type | MB a pass | products GB/s | plain loop GB/s | products / loop |\n");
    printf("|---|---|---|---|---|\n");
    double all_bytes = 0, all_products = 0, all_loop = 0;
    for (int k = 0; k < N_TYPES; k++) {
        if (!bytes[k]) continue;
        printf("| %s | %.1f | %.1f | %.1f | %.0f%% |\n", llm_dtype_name((uint32_t)k), bytes[k] / reps / 1e6,
               bytes[k] / product_s[k] / 1e9, bytes[k] / loop_s[k] / 1e9, 100 * loop_s[k] / product_s[k]);
        all_bytes += bytes[k]; all_products += product_s[k]; all_loop += loop_s[k];
    }
    printf("| all | %.1f | %.1f | %.1f | %.0f%% |\n", all_bytes / reps / 1e6, all_bytes / all_products / 1e9,
           all_bytes / all_loop / 1e9, 100 * all_loop / all_products);
    free(x); free(out);
    llm_gguf_close(&g);
    return 0;
}
