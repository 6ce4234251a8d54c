/* tools/decode_bandwidth.c - how close a decode step's matrix products come to the memory's speed. A decode
 * step multiplies one token by every weight matrix, so it reads each weight once from memory, and a plain
 * loop reading the same bytes is its ceiling. For each weight type in a model file, this times llm_matmul
 * with one token (the default path: 16-bit activations) over all the file's matrices (q4_0's, q4_1's, q5_0's,
 * q5_1's, q8_0's, mxfp4's and q2_K's to q6_K's in decode tiles, as the CPU backend holds them; a mixture's
 * experts too, each stacked matrix whole), in file order as
 * a step meets them, then a plain loop (64-bit sums) over the same bytes, without and with the products'
 * prefetches, and prints all three in GB/s and the products' against the faster loop, per type and in all.
 * Threads: OMP_NUM_THREADS, for all. Built for a CPU with AVX2 at least (the tiles are section 14's, in one
 * block of 2 MB pages as the backend's).
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

/* the plain loop: every 8 bytes added, four sums apart so that the adds overlap; with prefetch, each line
 * asked for as the products ask for theirs (into L1 and L2, llm_prefetch_ahead's quantized distances): what
 * the loop gains by them, the products could too, so the faster loop is the ceiling */
static uint64_t read_all(const void *data, uint64_t bytes, int prefetch) {
    const uint64_t *w = (const uint64_t *)data;
    int64_t n = (int64_t)(bytes / 64);
    int ahead[2];
    llm_prefetch_load(0, ahead);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp parallel for reduction(+ : s0, s1, s2, s3) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const uint64_t *line = w + 8 * i;
        if (prefetch) llm_prefetch(line, ahead);
        s0 += line[0] + line[4]; s1 += line[1] + line[5]; s2 += line[2] + line[6]; s3 += line[3] + line[7];
    }
    return s0 + s1 + s2 + s3;
}

/* a table row: the products' speed, each loop's, and the products' against the faster loop */
static void print_row(const char *name, double bytes, double products_s, double loop_s, double prefetched_s,
                      int reps) {
    printf("| %s | %.1f | %.1f | %.1f | %.1f | %.0f%% |\n", name, bytes / reps / 1e6,
           bytes / products_s / 1e9, bytes / loop_s / 1e9, bytes / prefetched_s / 1e9,
           100 * fmin(loop_s, prefetched_s) / products_s);
}

enum { N_TYPES = 64 };
/* the weights a decode step multiplies: matrices, and a mixture's experts stacked (3-D: ne[2] matrices of
 * ne[1] rows, here taken whole, as one tall matrix, though a step reads only its chosen experts' rows) */
static int is_matrix(const llm_gguf_tensor *t) {
    return (t->n_dims == 2 || t->n_dims == 3) && t->type < N_TYPES && t->type != LLM_F32;
}
static int64_t rows_of(const llm_gguf_tensor *t) {
    return (int64_t)t->ne[1] * (t->n_dims == 3 ? (int64_t)t->ne[2] : 1);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: decode_bandwidth MODEL.gguf REPS\n"); return 2; }
    llm_gguf g;
    char err[LLM_ERR_LEN];
    if (llm_gguf_open(&g, argv[1], err) != 0) { fprintf(stderr, "decode_bandwidth: %s\n", err); return 1; }
    int reps = atoi(argv[2]);
    if (reps < 1) { fprintf(stderr, "decode_bandwidth: REPS is a count of passes, 1 or more\n"); return 2; }
    llm_cpu_choose_for_vendor(); /* as a CPU backend does */
    int64_t widest = 0, longest = 0;
    for (int64_t i = 0; i < g.n_tensors; i++) {
        const llm_gguf_tensor *t = &g.tensors[i];
        if (!is_matrix(t)) continue;
        widest = rows_of(t) > widest ? rows_of(t) : widest;
        longest = (int64_t)t->ne[0] > longest ? (int64_t)t->ne[0] : longest;
    }
    /* the matrices of the types kept in decode tiles, as the CPU backend reads them (llm_cpu_make_tiles) */
    uint8_t **tiles = (uint8_t **)calloc((size_t)g.n_tensors, sizeof *tiles), *all_tiles = NULL;
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) /* the bytes, then the tiles: in one block, as the backend's */
        for (int64_t i = 0; tiles && i < g.n_tensors; i++) {
            const llm_gguf_tensor *t = &g.tensors[i];
            if (!is_matrix(t) || !llm_tiles_type(t->type) || t->ne[1] % LLM_TILE_ROWS) continue;
            if (!pass) { total += (t->nbytes + 63) / 64 * 64; continue; }
            if (!all_tiles && !(all_tiles = (uint8_t *)llm_alloc_huge(total))) {
                fprintf(stderr, "decode_bandwidth: no memory\n");
                return 1;
            }
            tiles[i] = all_tiles + (total -= (t->nbytes + 63) / 64 * 64);
            llm_tiles_copy(t->type, (uint8_t *)t->data, tiles[i], rows_of(t), (int64_t)t->ne[0], 1);
        }
    float *x = (float *)malloc((size_t)longest * sizeof(float));
    float *out = (float *)malloc((size_t)widest * sizeof(float));
    if (!x || !out || !widest) { fprintf(stderr, "decode_bandwidth: no matrices, or no memory\n"); return 1; }
    for (int64_t i = 0; i < longest; i++) x[i] = sinf(0.37f * (float)i);
    /* per type: bytes read per pass, seconds in the products, in the plain loop, in it with prefetch */
    double bytes[N_TYPES] = {0}, seconds[3][N_TYPES] = {{0}};
    uint64_t sink = 0;
    for (int r = 0; r <= reps; r++) /* pass 0 warms up (pages mapped, threads started): not counted */
        for (int loop = 0; loop < 3; loop++) /* the products over all matrices, then the loops */
            for (int64_t i = 0; i < g.n_tensors; i++) {
                const llm_gguf_tensor *t = &g.tensors[i];
                if (!is_matrix(t)) continue;
                llm_weight w = {t->data, t->type, rows_of(t), (int64_t)t->ne[0], tiles[i]};
                double t0 = now_s();
                if (loop) sink += read_all(tiles[i] ? tiles[i] : t->data, t->nbytes, loop == 2);
                else if (llm_matmul(out, x, &w, 1, LLM_PATH_ACT16) != 0) {
                    fprintf(stderr, "decode_bandwidth: no memory\n");
                    return 1;
                }
                double t1 = now_s();
                if (r == 0) continue;
                seconds[loop][t->type] += t1 - t0;
                if (!loop) bytes[t->type] += (double)t->nbytes;
            }
    printf("%s, %d thread(s), %d passes (sink %llu)\n", argv[1], omp_get_max_threads(), reps,
           (unsigned long long)(sink & 1));
    printf("| type | MB a pass | products GB/s | plain loop GB/s | loop with prefetch GB/s | products / "
           "faster loop |\n");
    printf("|---|---|---|---|---|---|\n");
    double all_bytes = 0, all_seconds[3] = {0};
    for (int k = 0; k < N_TYPES; k++) {
        if (!bytes[k]) continue;
        print_row(llm_dtype_name((uint32_t)k), bytes[k], seconds[0][k], seconds[1][k], seconds[2][k], reps);
        all_bytes += bytes[k];
        for (int j = 0; j < 3; j++) all_seconds[j] += seconds[j][k];
    }
    print_row("all", all_bytes, all_seconds[0], all_seconds[1], all_seconds[2], reps);
    free(all_tiles); free(tiles); free(x); free(out);
    llm_gguf_close(&g);
    return 0;
}
