/* gpu_tests.inc.c - the CUDA backend against the CPU reference, included by test.c under LLM_CUDA (uses its
 * CHECK, shared_dir; test.c has the implementation of llm.h, so llm_rope, llm_rmsnorm and friends are at hand).
 *
 * Every run draws fresh random inputs from a seed taken from the clock (printed, and LLM_GPU_SEED=N repeats a
 * run). In order:
 *   1. GEMM (the tensor-core kernel, every tile shape it picks, split-K, accumulate) against a double loop over
 *      the same bf16-rounded inputs;
 *   2. QKV preparation (bias, q/k RMSnorm, RoPE in both layouts, partial rope_dim) and paged attention over random
 *      block tables, mixed prefill/decode batches, short and partitioned contexts, against naive loops;
 *   3. the whole forward pass, llm_forward_cpu against the CUDA backend, over several steps of a multi-sequence
 *      batch (prefill, chunked prefill, decode, a copy-on-write fork) on dummy models and the model files found.
 * With LLM_GPU_BENCH=1 it then prints kernel and forward-pass benchmarks. */
#include <math.h>
#include <time.h>

int llm_cuda_test_gemm(int M, int N, int K, const float *A, const float *W, float *C, int accumulate, char *err);
int llm_cuda_test_attention(const llm_config *cf, const llm_batch *b, int num_blocks, int block_size, int part_size,
                            const float *qkv, const float *bias, const float *q_norm, const float *k_norm,
                            float *k_cache, float *v_cache, float *q_out, float *att_out, char *err);
int llm_cuda_bench_kernels(char *err);

static uint64_t gt_rng;
static float gt_uniform(void) { return llm_rand_uniform(&gt_rng) * 2.0f - 1.0f; } /* [-1, 1) */
static int gt_int(int n) { return (int)(llm_splitmix64(&gt_rng) % (uint64_t)n); }
static float gt_bf16(float f) { /* round to bf16 as the GPU does when it uploads */
    uint32_t x; memcpy(&x, &f, 4);
    x = (x + 0x7fff + ((x >> 16) & 1)) & 0xffff0000u;
    memcpy(&f, &x, 4); return f;
}
static double gt_now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return (double)ts.tv_sec + ts.tv_nsec * 1e-9; }

/* ---- 1. GEMM ---- */
static void gpu_test_gemm(void) {
    /* M picks the tile shape (<= 32, <= 256, larger); odd N and K test the edges; small tile counts split K */
    static const int shapes[][3] = {{1, 64, 64}, {1, 2048, 2048}, {3, 100, 72}, {16, 3072, 520}, {17, 130, 200}, {32, 257, 172},
                                    {33, 512, 8}, {100, 1000, 96}, {256, 96, 2056}, {257, 129, 264}, {300, 64, 1000}, {1024, 640, 136}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int accumulate = 0; accumulate < 2; accumulate++) {
            float *A = malloc((size_t)M * K * 4), *W = malloc((size_t)N * K * 4), *C = malloc((size_t)M * N * 4), *C0 = malloc((size_t)M * N * 4);
            for (size_t i = 0; i < (size_t)M * K; i++) A[i] = gt_uniform();
            for (size_t i = 0; i < (size_t)N * K; i++) W[i] = gt_uniform() * 0.1f;
            for (size_t i = 0; i < (size_t)M * N; i++) C0[i] = C[i] = accumulate ? gt_uniform() : NAN; /* NAN: must be overwritten */
            char err[LLM_ERR_LEN] = "";
            int rc = llm_cuda_test_gemm(M, N, K, A, W, C, accumulate, err);
            CHECK(rc == 0, "gemm %dx%dx%d: %s", M, N, K, err);
            if (rc == 0) {
                double worst = 0; /* error relative to the sum of |products|, which bounds the rounding of the sum */
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double ref = accumulate ? C0[(size_t)i * N + j] : 0, mag = 1e-6;
                        for (int k = 0; k < K; k++) {
                            double p = (double)gt_bf16(A[(size_t)i * K + k]) * gt_bf16(W[(size_t)j * K + k]);
                            ref += p; mag += fabs(p);
                        }
                        double e = fabs(C[(size_t)i * N + j] - ref) / mag;
                        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
                    }
                CHECK(worst < 1e-4, "gemm M=%d N=%d K=%d acc=%d: error %.3g of sum|a*w| (tolerance 1e-4)", M, N, K, accumulate, worst);
                if (accumulate) printf("gemm %5d x %5d x %5d: max error %.2e of sum|a*w|\n", M, N, K, worst);
            }
            free(A); free(W); free(C); free(C0);
        }
    }
}

/* ---- 2. QKV preparation and paged attention ---- */
typedef struct { const char *name; int n_heads, n_kv_heads, head_dim, rope_dim, neox, bias, qk_norm, part_size; } gt_attn_case;

static void gpu_test_attention_case(const gt_attn_case *ac) {
    llm_config cf; memset(&cf, 0, sizeof cf);
    cf.n_heads = ac->n_heads; cf.n_kv_heads = ac->n_kv_heads; cf.head_dim = ac->head_dim; cf.rope_dim = ac->rope_dim;
    cf.rope_neox = ac->neox; cf.rope_base = ac->neox ? 1000000.0f : 10000.0f; cf.rms_eps = 1e-6f;
    cf.dim = cf.n_heads * cf.head_dim; cf.n_layers = 1;
    int hd = cf.head_dim, nkv = cf.n_kv_heads, q_dim = cf.n_heads * hd, kv_dim = nkv * hd, width = q_dim + 2 * kv_dim, G = cf.n_heads / nkv;
    int bs = 16, n_seqs = 2 + gt_int(4), max_ctx = 1300;
    /* each sequence: some positions already in the cache, then new tokens (1 = decode, more = prefill chunk) */
    int past[8], n_new[8], T = 0;
    for (int s = 0; s < n_seqs; s++) {
        int kind = gt_int(3);
        past[s] = kind == 0 ? 0 : gt_int(max_ctx - 64);
        n_new[s] = kind == 1 ? 1 : 1 + gt_int(48);
        T += n_new[s];
    }
    int blocks_per_seq = (max_ctx + bs - 1) / bs, num_blocks = n_seqs * blocks_per_seq + 7;
    /* random block tables: a shuffled pool dealt out to the sequences */
    int *perm = malloc((size_t)num_blocks * sizeof(int));
    for (int i = 0; i < num_blocks; i++) perm[i] = i;
    for (int i = num_blocks - 1; i > 0; i--) { int j = gt_int(i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    int32_t *tables = malloc((size_t)n_seqs * blocks_per_seq * sizeof(int32_t));
    const int32_t *bt[8];
    for (int s = 0; s < n_seqs; s++) { for (int k = 0; k < blocks_per_seq; k++) tables[s * blocks_per_seq + k] = perm[s * blocks_per_seq + k]; bt[s] = tables + s * blocks_per_seq; }
    int32_t *tokens = calloc((size_t)T, sizeof(int32_t)), *pos = malloc((size_t)T * sizeof(int32_t)), start[9];
    int t = 0;
    for (int s = 0; s < n_seqs; s++) { start[s] = t; for (int i = 0; i < n_new[s]; i++) pos[t++] = past[s] + i; }
    start[n_seqs] = T;
    llm_batch b = {T, tokens, pos, n_seqs, start, bt, 0, NULL};

    size_t n_cache = (size_t)num_blocks * bs * kv_dim;
    float *kc = malloc(n_cache * 4), *vc = malloc(n_cache * 4), *kc_ref = malloc(n_cache * 4), *vc_ref = malloc(n_cache * 4);
    for (size_t i = 0; i < n_cache; i++) { kc_ref[i] = kc[i] = gt_bf16(gt_uniform()); vc_ref[i] = vc[i] = gt_bf16(gt_uniform()); }
    float *qkv = malloc((size_t)T * width * 4), *bias = malloc((size_t)width * 4), *qn = malloc((size_t)hd * 4), *kn = malloc((size_t)hd * 4);
    for (size_t i = 0; i < (size_t)T * width; i++) qkv[i] = gt_uniform() * 2.0f;
    for (int i = 0; i < width; i++) bias[i] = gt_uniform();
    for (int i = 0; i < hd; i++) { qn[i] = 0.5f + gt_uniform() * 0.5f + 0.5f; kn[i] = 1.0f + gt_uniform() * 0.5f; }
    float *q_gpu = malloc((size_t)T * q_dim * 4), *att_gpu = malloc((size_t)T * q_dim * 4);
    char err[LLM_ERR_LEN] = "";
    int rc = llm_cuda_test_attention(&cf, &b, num_blocks, bs, ac->part_size, qkv, ac->bias ? bias : NULL, ac->qk_norm ? qn : NULL,
                                     ac->qk_norm ? kn : NULL, kc, vc, q_gpu, att_gpu, err);
    CHECK(rc == 0, "attention %s: %s", ac->name, err);
    if (rc == 0) {
        /* reference: the CPU forward pass's own steps, then the new K/V into the cache (bf16, as the GPU keeps it) */
        float *q_ref = malloc((size_t)T * q_dim * 4), *x = malloc((size_t)width * 4);
        int s = 0;
        for (t = 0; t < T; t++) {
            while (t >= start[s + 1]) s++;
            memcpy(x, qkv + (size_t)t * width, (size_t)width * 4);
            if (ac->bias) for (int i = 0; i < width; i++) x[i] += bias[i];
            for (int h = 0; h < cf.n_heads + nkv; h++) {
                if (ac->qk_norm) llm_rmsnorm(x + h * hd, x + h * hd, h < cf.n_heads ? qn : kn, hd, cf.rms_eps);
                llm_rope(x + h * hd, pos[t], &cf);
            }
            memcpy(q_ref + (size_t)t * q_dim, x, (size_t)q_dim * 4);
            size_t slot = (size_t)bt[s][pos[t] / bs] * bs + pos[t] % bs;
            for (int i = 0; i < kv_dim; i++) { kc_ref[slot * kv_dim + i] = gt_bf16(x[q_dim + i]); vc_ref[slot * kv_dim + i] = gt_bf16(x[q_dim + kv_dim + i]); }
        }
        double q_err = 0, q_max = 0, kv_err = 0, kv_max = 0, a_err = 0, a_max = 0;
        for (size_t i = 0; i < (size_t)T * q_dim; i++) { q_err = fmax(q_err, fabs(q_gpu[i] - q_ref[i])); q_max = fmax(q_max, fabs(q_ref[i])); }
        for (size_t i = 0; i < n_cache; i++) {
            kv_err = fmax(kv_err, fmax(fabs(kc[i] - kc_ref[i]), fabs(vc[i] - vc_ref[i])));
            kv_max = fmax(kv_max, fmax(fabs(kc_ref[i]), fabs(vc_ref[i])));
        }
        /* naive attention in double over the reference cache */
        double *sc = malloc((size_t)max_ctx * sizeof(double));
        s = 0;
        for (t = 0; t < T; t++) {
            while (t >= start[s + 1]) s++;
            for (int h = 0; h < cf.n_heads; h++) {
                const float *qh = q_ref + (size_t)t * q_dim + h * hd;
                double mx = -INFINITY, sum = 0;
                for (int p = 0; p <= pos[t]; p++) {
                    const float *kp = kc_ref + ((size_t)bt[s][p / bs] * bs + p % bs) * kv_dim + (h / G) * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)qh[i] * kp[i];
                    sc[p] = d / sqrt((double)hd);
                    if (sc[p] > mx) mx = sc[p];
                }
                for (int p = 0; p <= pos[t]; p++) { sc[p] = exp(sc[p] - mx); sum += sc[p]; }
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int p = 0; p <= pos[t]; p++) o += sc[p] * vc_ref[((size_t)bt[s][p / bs] * bs + p % bs) * kv_dim + (h / G) * hd + i];
                    o /= sum;
                    a_err = fmax(a_err, fabs(att_gpu[(size_t)t * q_dim + h * hd + i] - o)); a_max = fmax(a_max, fabs(o));
                }
            }
        }
        /* q in f32 (RoPE angles computed differently: pow vs repeated products); K/V and output rounded to bf16 */
        CHECK(q_err <= 2e-3 * q_max, "%s: q after norm/RoPE differs by %.3g (max |q| %.3g)", ac->name, q_err, q_max);
        CHECK(kv_err <= 1e-2 * kv_max, "%s: K/V in the cache differ by %.3g (max %.3g)", ac->name, kv_err, kv_max);
        CHECK(a_err <= 1e-2 * a_max, "%s: attention output differs by %.3g (max %.3g)", ac->name, a_err, a_max);
        printf("attention %-34s %d seqs, %3d tokens: q err %.1e, kv err %.1e, out err %.1e (rel. to max)\n", ac->name, n_seqs, T,
               q_err / q_max, kv_err / kv_max, a_err / a_max);
        free(sc); free(q_ref); free(x);
    }
    free(perm); free(tables); free(tokens); free(pos); free(kc); free(vc); free(kc_ref); free(vc_ref);
    free(qkv); free(bias); free(qn); free(kn); free(q_gpu); free(att_gpu);
}

static void gpu_test_attention(void) {
    static const gt_attn_case cases[] = {
        {"llama MHA hd64 (part 512)", 8, 8, 64, 64, 0, 0, 0, 512},
        {"llama GQA 32/4 hd64 (part 64)", 32, 4, 64, 64, 0, 0, 0, 64},
        {"llama GQA 32/8 hd64 (part 128)", 32, 8, 64, 64, 0, 0, 0, 128},
        {"qwen2 bias neox 14/2 hd64 (part 96)", 14, 2, 64, 64, 1, 1, 0, 96},
        {"qwen3 qk-norm neox 16/8 hd128", 16, 8, 128, 128, 1, 0, 1, 512},
        {"neox partial rope 64 of hd128 (p 64)", 8, 2, 128, 64, 1, 0, 1, 64},
        {"llama partial rope 16 of hd32", 4, 2, 32, 16, 0, 1, 0, 32},
        {"tiny heads hd8 (stories260K)", 8, 4, 8, 8, 0, 0, 0, 64},
        {"hd256 GQA 8/1", 8, 1, 256, 256, 1, 0, 0, 256},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int rep = 0; rep < 2; rep++) gpu_test_attention_case(&cases[i]);
}

/* ---- 3. the whole forward pass ---- */
static int gt_argmax(const float *x, int n) { int b = 0; for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i; return b; }

/* The CPU reference runs on a copy of the model whose matrices are rounded to bf16 as the GPU rounds them at
 * upload: the comparison then measures the kernels and the bf16 activations, not the weight format. */
typedef struct { llm_model m; uint16_t *mem; } gt_bf16_model;
static void gt_round_weight(llm_weight *w, uint16_t **mem) {
    if (!w->data) return;
    float *row = malloc((size_t)w->cols * sizeof(float));
    uint16_t *out = *mem;
    for (int64_t r = 0; r < w->rows; r++) {
        llm_dequant_row(w->type, (const uint8_t *)w->data + llm_row_bytes(w->type, w->cols) * (size_t)r, row, w->cols);
        for (int64_t k = 0; k < w->cols; k++) { float f = gt_bf16(row[k]); uint32_t b; memcpy(&b, &f, 4); out[r * w->cols + k] = (uint16_t)(b >> 16); }
    }
    free(row);
    w->data = out; w->type = LLM_BF16;
    *mem += (size_t)w->rows * w->cols;
}
static int gt_model_bf16(const llm_model *src, gt_bf16_model *dst) {
    const llm_config *c = &src->cfg;
    size_t n = (size_t)c->vocab_size * c->dim * 2;
    for (int l = 0; l < c->n_layers; l++) {
        const llm_layer *L = &src->layers[l];
        n += (size_t)(L->wq.rows + L->wk.rows + L->wv.rows) * c->dim + (size_t)L->wo.rows * L->wo.cols + (size_t)3 * c->ffn_dim * c->dim;
    }
    dst->m = *src;
    dst->mem = malloc(n * sizeof(uint16_t));
    dst->m.layers = malloc((size_t)c->n_layers * sizeof(llm_layer));
    if (!dst->mem || !dst->m.layers) { free(dst->mem); free(dst->m.layers); return -1; }
    memcpy(dst->m.layers, src->layers, (size_t)c->n_layers * sizeof(llm_layer));
    uint16_t *mem = dst->mem;
    int tied = src->output.data == src->tok_embd.data;
    gt_round_weight(&dst->m.tok_embd, &mem);
    if (tied) dst->m.output = dst->m.tok_embd; else gt_round_weight(&dst->m.output, &mem);
    for (int l = 0; l < c->n_layers; l++) {
        llm_layer *L = &dst->m.layers[l];
        gt_round_weight(&L->wq, &mem); gt_round_weight(&L->wk, &mem); gt_round_weight(&L->wv, &mem); gt_round_weight(&L->wo, &mem);
        gt_round_weight(&L->w_gate, &mem); gt_round_weight(&L->w_up, &mem); gt_round_weight(&L->w_down, &mem);
    }
    return 0;
}

/* Runs the same steps on the CPU backend (bf16-rounded weights) and the CUDA backend (the model as loaded) and
 * compares the logits. */
static void gpu_test_forward_model(const llm_model *m, const char *name) {
    const int bs = 16, num_blocks = 96, max_seqs = 4, V = m->cfg.vocab_size;
    char err[LLM_ERR_LEN] = "";
    gt_bf16_model mr;
    if (gt_model_bf16(m, &mr)) { CHECK(0, "%s: out of memory", name); return; }
    const llm_model *mc = &mr.m;
    llm_backend *cpu = llm_cpu_backend_create(mc, num_blocks, bs, err);
    CHECK(cpu != NULL, "%s: cpu backend: %s", name, err);
    llm_backend *gpu = llm_cuda_backend_create(m, num_blocks, 0, bs, err);
    CHECK(gpu != NULL, "%s: cuda backend: %s", name, err);
    if (!cpu || !gpu) { if (cpu) cpu->destroy(cpu); if (gpu) gpu->destroy(gpu); free(mr.mem); free(mr.m.layers); return; }
    int perm[96];
    for (int i = 0; i < num_blocks; i++) perm[i] = i;
    for (int i = num_blocks - 1; i > 0; i--) { int j = gt_int(i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    int next_block = 0;
    int32_t tables[4][24], n_blocks[4] = {0}, len[4] = {0}, last_tok[4] = {0};
    int32_t prompt_len[4] = {23, 70, 17, 0};    /* seq 1 prefills in two chunks; seq 3 forks from seq 1 */
    double worst_l2 = 0, worst_max = 0;
    int argmax_same = 0, argmax_total = 0, near_ties = 0, failed = 0;
    enum { STEPS = 7 };
    for (int step = 0; step < STEPS && !failed; step++) {
        int32_t tokens[256], pos[256], seq_start[5], rows[4];
        const int32_t *bt[4];
        int T = 0, n_seqs = 0, active[4];
        if (step == 3) { /* fork: seq 3 shares seq 1's full blocks and gets a copy of its partial last block */
            int full = len[1] / bs;
            for (int k = 0; k < full; k++) tables[3][k] = tables[1][k];
            n_blocks[3] = full;
            if (len[1] % bs) {
                int nb = perm[next_block++];
                CHECK(cpu->copy_block(cpu, tables[1][full], nb, err) == 0, "cpu copy_block: %s", err);
                CHECK(gpu->copy_block(gpu, tables[1][full], nb, err) == 0, "%s: cuda copy_block: %s", name, err);
                tables[3][n_blocks[3]++] = nb;
            }
            len[3] = len[1]; last_tok[3] = (last_tok[1] + 1) % V; /* a different next token than seq 1 */
        }
        for (int s = 0; s < max_seqs; s++) {
            int n_new;
            if (s == 2 && step < 1) continue;             /* seq 2 joins at step 1 */
            if (s == 3 && step < 3) continue;             /* seq 3 exists from step 3 */
            if (len[s] < prompt_len[s]) n_new = s == 1 && step == 0 ? 40 : prompt_len[s] - len[s]; /* chunked prefill */
            else n_new = 1;
            seq_start[n_seqs] = T;
            for (int i = 0; i < n_new; i++) {
                int p = len[s] + i;
                tokens[T] = len[s] < prompt_len[s] ? gt_int(V) : last_tok[s];
                pos[T] = p;
                while (n_blocks[s] <= p / bs) tables[s][n_blocks[s]++] = perm[next_block++];
                T++;
            }
            len[s] += n_new;
            bt[n_seqs] = tables[s];
            rows[n_seqs] = T - 1;
            active[n_seqs++] = s;
        }
        seq_start[n_seqs] = T;
        llm_batch b = {T, tokens, pos, n_seqs, seq_start, bt, n_seqs, rows};
        float *lc = malloc((size_t)n_seqs * V * 4), *lg = malloc((size_t)n_seqs * V * 4);
        int rc1 = cpu->forward(cpu, mc, &b, lc, err);
        CHECK(rc1 == 0, "%s step %d cpu forward: %s", name, step, err);
        int rc2 = gpu->forward(gpu, m, &b, lg, err);
        CHECK(rc2 == 0, "%s step %d cuda forward: %s", name, step, err);
        if (rc1 || rc2) { failed = 1; free(lc); free(lg); break; }
        for (int r = 0; r < n_seqs; r++) {
            const float *c = lc + (size_t)r * V, *g = lg + (size_t)r * V;
            double d2 = 0, c2 = 0, dmax = 0, cmax = 0;
            for (int i = 0; i < V; i++) {
                double d = (double)g[i] - c[i];
                d2 += d * d; c2 += (double)c[i] * c[i];
                dmax = fmax(dmax, fabs(d)); cmax = fmax(cmax, fabs(c[i]));
                if (isnan(g[i])) dmax = INFINITY;
            }
            double l2 = sqrt(d2 / (c2 > 0 ? c2 : 1)), mx = dmax / (cmax > 0 ? cmax : 1);
            worst_l2 = fmax(worst_l2, l2); worst_max = fmax(worst_max, mx);
            int ac = gt_argmax(c, V), ag = gt_argmax(g, V);
            argmax_total++;
            if (ac == ag) argmax_same++;
            else if (c[ac] - c[ag] <= 2 * dmax) near_ties++; /* the CPU itself ranks them within the error */
            else CHECK(0, "%s step %d seq %d: greedy token %d on the GPU, %d on the CPU (logits %.4f vs %.4f)", name, step,
                       active[r], ag, ac, c[ag], c[ac]);
            last_tok[active[r]] = ac;
        }
        free(lc); free(lg);
    }
    /* the same bf16 weights on both sides; the GPU rounds activations to bf16 before every product and keeps K/V
     * in bf16, the CPU keeps them in f32 */
    /* each layer rounds four product inputs to bf16 (relative 2^-9) and the rounding compounds with depth: seen
     * 5e-3 for 4-5 layers, 3e-2 to 3.6e-2 for the 24 of dummy qwen2.5-0.5b */
    double tol_l2 = fmax(3e-2, 2e-3 * m->cfg.n_layers), tol_max = fmax(5e-2, 3e-3 * m->cfg.n_layers);
    CHECK(worst_l2 < tol_l2, "%s: logits differ from the CPU's by %.3g (relative L2, tolerance %.2g)", name, worst_l2, tol_l2);
    CHECK(worst_max < tol_max, "%s: logits differ from the CPU's by %.3g of max |logit| (tolerance %.2g)", name, worst_max, tol_max);
    printf("forward %-28s %d steps: logits rel. L2 err %.2e, max-abs err %.2e of max |logit|; greedy %d/%d same, %d near ties\n",
           name, STEPS, worst_l2, worst_max, argmax_same, argmax_total, near_ties);
    cpu->destroy(cpu); gpu->destroy(gpu);
    free(mr.mem); free(mr.m.layers);
}

static void gpu_test_forward(void) {
    static const char *dummies[] = {"tiny", "qwen2.5-0.5b"};
    for (size_t i = 0; i < sizeof dummies / sizeof dummies[0]; i++) {
        llm_model m; char err[LLM_ERR_LEN] = "", name[64];
        int rc = llm_model_dummy(&m, dummies[i], gt_rng, err);
        CHECK(rc == 0, "dummy %s: %s", dummies[i], err);
        if (rc) continue;
        snprintf(name, sizeof name, "dummy:%s", dummies[i]);
        gpu_test_forward_model(&m, name);
        llm_model_free(&m);
    }
    static const char *files[] = {"stories260K.gguf", "random-llama2-untied.gguf", "random-llama3-gqa.gguf", "random-qwen2-bias.gguf",
                                  "random-qwen3-qknorm.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024], err[LLM_ERR_LEN] = "";
        snprintf(path, sizeof path, "%s/models/%s", shared_dir, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f) { printf("forward %-28s skipped: %s not found\n", files[i], path); continue; }
        fclose(f);
        llm_model m;
        int rc = llm_model_load(&m, path, err);
        CHECK(rc == 0, "load %s: %s", path, err);
        if (rc) continue;
        gpu_test_forward_model(&m, files[i]);
        llm_model_free(&m);
    }
}

/* ---- benchmarks (LLM_GPU_BENCH=1) ---- */
/* Forward-pass throughput of the backend alone on a dummy model: prefill 256 sequences of 128 tokens in steps of
 * 2048 tokens, then decode all 256 together. */
static void gpu_bench_forward(const char *preset) {
    llm_model m; char err[LLM_ERR_LEN] = "";
    if (llm_model_dummy(&m, preset, 1, err)) { printf("bench %s: %s\n", preset, err); return; }
    const int n_seqs = 256, prompt = 128, decode_steps = 64, bs = 16, per_seq = (prompt + decode_steps + 1 + bs - 1) / bs;
    llm_backend *be = llm_cuda_backend_create(&m, n_seqs * per_seq, 0, bs, err);
    CHECK(be != NULL, "bench %s: %s", preset, err);
    if (!be) { llm_model_free(&m); return; }
    int32_t *tables = malloc((size_t)n_seqs * per_seq * 4), *tokens = malloc(2048 * 4), *pos = malloc(2048 * 4), start[257], rows[256];
    const int32_t *bt[256];
    for (int i = 0; i < n_seqs * per_seq; i++) tables[i] = i;
    float *logits = malloc((size_t)n_seqs * m.cfg.vocab_size * 4);
    double t0 = gt_now();
    int ok = 1;
    for (int s0 = 0; s0 < n_seqs && ok; s0 += 2048 / prompt) { /* 16 prompts per step */
        int ns = 2048 / prompt, T = 0;
        for (int s = 0; s < ns; s++) {
            start[s] = T; bt[s] = tables + (size_t)(s0 + s) * per_seq;
            for (int p = 0; p < prompt; p++) { tokens[T] = (s0 + s + p) % m.cfg.vocab_size; pos[T++] = p; }
            rows[s] = T - 1;
        }
        start[ns] = T;
        llm_batch b = {T, tokens, pos, ns, start, bt, ns, rows};
        ok = be->forward(be, &m, &b, logits, err) == 0;
    }
    double t1 = gt_now();
    for (int step = 0; step < decode_steps && ok; step++) {
        for (int s = 0; s < n_seqs; s++) { start[s] = s; tokens[s] = (s + step) % m.cfg.vocab_size; pos[s] = prompt + step; bt[s] = tables + (size_t)s * per_seq; rows[s] = s; }
        start[n_seqs] = n_seqs;
        llm_batch b = {n_seqs, tokens, pos, n_seqs, start, bt, n_seqs, rows};
        ok = be->forward(be, &m, &b, logits, err) == 0;
    }
    double t2 = gt_now();
    CHECK(ok, "bench %s: %s", preset, err);
    if (ok)
        printf("forward %-16s prefill %d x %d tokens: %.0f tok/s | decode %d seqs x %d steps (ctx %d-%d): %.2f ms/step, %.0f tok/s (logits to host incl.)\n",
               preset, n_seqs, prompt, n_seqs * prompt / (t1 - t0), n_seqs, decode_steps, prompt, prompt + decode_steps,
               (t2 - t1) / decode_steps * 1e3, (double)n_seqs * decode_steps / (t2 - t1));
    free(tables); free(tokens); free(pos); free(logits);
    be->destroy(be); llm_model_free(&m);
}

static void run_gpu_tests(void) {
    const char *s = getenv("LLM_GPU_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("gpu tests: seed %llu (LLM_GPU_SEED=%llu repeats this run)\n", (unsigned long long)seed, (unsigned long long)seed);
    gt_rng = seed;
    double t0 = gt_now();
    gpu_test_gemm();
    printf("gemm checks: %.1f s\n", gt_now() - t0);
    gpu_test_attention();
    printf("attention checks: %.1f s\n", gt_now() - t0);
    gpu_test_forward();
    printf("forward checks: %.1f s\n", gt_now() - t0);
    if (getenv("LLM_GPU_BENCH")) {
        char err[LLM_ERR_LEN] = "";
        CHECK(llm_cuda_bench_kernels(err) == 0, "kernel benchmarks: %s", err);
        gpu_bench_forward("tinyllama-1.1b");
        gpu_bench_forward("llama-3.2-1b");
    }
}
