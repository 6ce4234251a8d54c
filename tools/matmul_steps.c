/* tools/matmul_steps.c - what a step of T tokens costs the CPU backend's matrix products, against one token's:
 * each layer's wq, w_gate and w_up (the default path: 16-bit activations), T = 1 to 64 tokens, the best
 * of REPS runs each. Speculative decoding and small batches live on these ratios.
 *
 *   cc -O3 -march=native -ffp-contract=off -fno-math-errno -fopenmp -I/usr/include -I. \
 *      -o matmul_steps tools/matmul_steps.c -lm -lpthread
 *   OMP_NUM_THREADS=1 ./matmul_steps models/SmolLM2-135M-Instruct.Q4_1.gguf 15 */
#define LLM_IMPLEMENTATION
#include "llm.h"
#include <stdio.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: matmul_steps MODEL.gguf REPS\n"); return 2; }
    llm_model m;
    char err[LLM_ERR_LEN];
    if (llm_model_load(&m, argv[1], err) != 0) { fprintf(stderr, "matmul_steps: %s\n", err); return 1; }
    int reps = atoi(argv[2]), steps[] = {1, 2, 3, 4, 5, 8, 12, 16, 17, 32, 64};
    int64_t widest = 0;
    for (int l = 0; l < m.cfg.n_layers; l++) {
        const llm_layer *L = &m.layers[l];
        int64_t w[3] = {L->wq.rows, L->w_gate.rows, L->w_up.rows};
        for (int k = 0; k < 3; k++) widest = w[k] > widest ? w[k] : widest;
    }
    float *x = (float *)malloc(64 * (size_t)m.cfg.dim * sizeof(float));
    float *out = (float *)malloc(64 * (size_t)widest * sizeof(float));
    if (!x || !out) return 1;
    for (int i = 0; i < 64 * m.cfg.dim; i++) x[i] = sinf(0.37f * (float)i);
    double one = 0;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = now_s();
            for (int l = 0; l < m.cfg.n_layers; l++) {
                const llm_layer *L = &m.layers[l];
                if (llm_matmul(out, x, &L->wq, steps[i], LLM_PATH_ACT16) != 0 ||
                    llm_matmul(out, x, &L->w_gate, steps[i], LLM_PATH_ACT16) != 0 ||
                    llm_matmul(out, x, &L->w_up, steps[i], LLM_PATH_ACT16) != 0) return 1;
            }
            double dt = now_s() - t0;
            best = dt < best ? dt : best;
        }
        if (steps[i] == 1) one = best;
        printf("T = %2d: %6.2f ms, %.2f times one token's\n", steps[i], 1e3 * best, best / one);
    }
    free(x); free(out);
    llm_model_free(&m);
    return 0;
}
