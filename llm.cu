/* llm.cu - the CUDA backend: the forward pass of llm.h on one NVIDIA GPU, with hand-written kernels.
 *
 * What lives on the device:
 *   - the weights, converted once at load to bf16 (any file type: f32, f16, bf16, q8_0, q4_0, q4_1), with each
 *     matrix's rows padded to a multiple of 8 values so that every row starts 16-byte aligned (cp.async, uint4);
 *     Q, K and V are one matrix [q_dim + 2 kv_dim, dim] and gate/up one matrix [2 ffn, dim]: fewer launches;
 *   - the paged KV cache in bf16, laid out [layer][block][kv_head][slot][head_dim]: a block of one head is one
 *     contiguous run of block_size * head_dim values, which is what attention reads;
 *   - scratch activations for the largest batch seen so far (grown on demand).
 * The residual stream stays f32; everything a matrix product reads is bf16; products accumulate in f32.
 *
 * One step (llm_batch) on one stream:
 *   embed -> per layer [rmsnorm -> QKV GEMM -> bias/qk-norm/RoPE + write K,V to the cache -> paged attention
 *   (-> log-sum-exp reduce of partitions) -> O GEMM (+= residual) -> rmsnorm -> gate/up GEMM -> SwiGLU -> down
 *   GEMM (+= residual)] -> final norm of the logit rows only -> logits GEMM -> copy to the host.
 * Pure-decode steps of the same shape are captured once as a CUDA graph and replayed (launch overhead).
 *
 * Every CUDA call is checked: a failure becomes a message in the caller's err buffer and a -1 / NULL return. */
#include "llm.h"
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef __nv_bfloat16 bf16;

/* ---------------------------------------------------------------------------------------------------------------
 * Errors: CK() turns a failed CUDA call into a message in `err` and makes the enclosing function return -1.
 * ------------------------------------------------------------------------------------------------------------- */
static int cuda_fail(char *err, cudaError_t e, const char *what, int line) {
    if (err) snprintf(err, LLM_ERR_LEN, "CUDA error at llm.cu:%d (%s): %s", line, what, cudaGetErrorString(e));
    return -1;
}
#define CK(call) do { cudaError_t ck_e_ = (call); if (ck_e_ != cudaSuccess) return cuda_fail(err, ck_e_, #call, __LINE__); } while (0)
/* after a kernel launch: launch errors (bad configuration) show up here, execution errors at the next sync */
#define CK_LAUNCH() CK(cudaGetLastError())

static int fail(char *err, const char *msg) { if (err) snprintf(err, LLM_ERR_LEN, "%s", msg); return -1; }

__host__ __device__ static inline int round_up(int x, int m) { return (x + m - 1) / m * m; }
__host__ __device__ static inline int cdiv(int a, int b) { return (a + b - 1) / b; }

/* ---------------------------------------------------------------------------------------------------------------
 * Host-side conversion of weights to bf16 (once, at load; llm.h's llm_dequant_row reads the file's formats)
 * ------------------------------------------------------------------------------------------------------------- */
static uint16_t host_f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t x; memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Small kernels: embedding, RMSnorm, QKV preparation (bias, q/k norm, RoPE, cache write), SwiGLU
 * ------------------------------------------------------------------------------------------------------------- */
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* sum over a block of up to 1024 threads; every thread gets the result */
__device__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();              /* part[] may still be read by a previous call */
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float s = lane < nw ? part[lane] : 0.0f;
    return warp_sum(s);
}

/* x[t][:] = embedding row tokens[t] (bf16, row stride ld) as f32 */
__global__ void embed_kernel(float *x, const bf16 *emb, int ld, const int *tokens, int D) {
    int t = blockIdx.x;
    const bf16 *row = emb + (size_t)tokens[t] * ld;
    for (int i = threadIdx.x; i < D; i += blockDim.x) x[(size_t)t * D + i] = __bfloat162float(row[i]);
}

/* out[r][:] = rmsnorm(x[rows ? rows[r] : r][:]) * w, as bf16 with row stride ldo; the padding columns
 * [D, ldo) are written as zeros because the next GEMM reads them (against zero weights, but NaN * 0 = NaN). */
__global__ void rmsnorm_kernel(bf16 *out, int ldo, const float *x, const int *rows, const float *w, int D, float eps) {
    int r = blockIdx.x, src = rows ? rows[r] : r;
    const float *xr = x + (size_t)src * D;
    float ss = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    float scale = rsqrtf(ss / D + eps);
    for (int i = threadIdx.x; i < ldo; i += blockDim.x)
        out[(size_t)r * ldo + i] = __float2bfloat16(i < D ? xr[i] * scale * w[i] : 0.0f);
}

/* act[t][i] = silu(gu[t][i]) * gu[t][F + i] (gate and up came out of one GEMM side by side), bf16, stride lda */
__global__ void swiglu_kernel(bf16 *act, int lda, const float *gu, int F) {
    int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < lda; i += gridDim.x * blockDim.x) {
        float v = 0.0f;
        if (i < F) { float g = gu[(size_t)t * 2 * F + i], u = gu[(size_t)t * 2 * F + F + i]; v = g / (1.0f + __expf(-g)) * u; }
        act[(size_t)t * lda + i] = __float2bfloat16(v);
    }
}

/* Per token (one block of 4 warps): add the QKV bias, RMS-normalise each q and k head (qwen3), rotate the first
 * rope_dim values of each q and k head by the token's position, write q (f32) for attention, and write k and v
 * (bf16) into the paged cache at the token's slot. One warp per head; the head goes through shared memory
 * because RoPE pairs a value with a partner that another lane holds. */
#define PREP_WARPS 4
#define MAX_HEAD_DIM 256
struct prep_args {
    const float *qkv; float *q; bf16 *kc, *vc;        /* kc, vc: this layer's part of the cache */
    const float *bias, *q_norm, *k_norm, *inv_freq;   /* bias: [q_dim + 2 kv_dim] or NULL; norms NULL when absent */
    const int *positions, *slots;                     /* slot = block * block_size + offset */
    int n_heads, n_kv_heads, hd, rope_dim, neox, block_size;
    float eps;
};
__global__ void qkv_prep_kernel(prep_args a) {
    __shared__ float buf[PREP_WARPS][MAX_HEAD_DIM];
    int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = a.hd;
    int q_dim = a.n_heads * hd, kv_dim = a.n_kv_heads * hd, width = q_dim + 2 * kv_dim;
    const float *in = a.qkv + (size_t)t * width;
    int pos = a.positions[t], slot = a.slots[t], blk = slot / a.block_size, off = slot % a.block_size;
    float *hb = buf[warp];
    /* heads 0..n_heads-1 are q, then n_kv_heads k heads, then n_kv_heads v heads */
    for (int h = warp; h < a.n_heads + 2 * a.n_kv_heads; h += PREP_WARPS) {
        int base = h * hd;
        int is_q = h < a.n_heads, is_k = !is_q && h < a.n_heads + a.n_kv_heads;
        float ss = 0;
        for (int d = lane; d < hd; d += 32) {
            float v = in[base + d] + (a.bias ? a.bias[base + d] : 0.0f);
            hb[d] = v; ss += v * v;
        }
        ss = warp_sum(ss);
        const float *nw = is_q ? a.q_norm : is_k ? a.k_norm : NULL;
        float scale = nw ? rsqrtf(ss / hd + a.eps) : 1.0f;
        __syncwarp();
        for (int d = lane; d < hd; d += 32) {
            float v = hb[d] * scale * (nw ? nw[d] : 1.0f);
            if (!is_q && !is_k) { /* v head: straight to the cache */
                int kvh = h - a.n_heads - a.n_kv_heads;
                a.vc[(((size_t)blk * a.n_kv_heads + kvh) * a.block_size + off) * hd + d] = __float2bfloat16(v);
                continue;
            }
            if (d < a.rope_dim) {
                int half = a.rope_dim / 2, i, partner; float sign;
                if (a.neox) { i = d < half ? d : d - half; partner = d < half ? d + half : d - half; sign = d < half ? -1.0f : 1.0f; }
                else { i = d / 2; partner = d ^ 1; sign = (d & 1) ? 1.0f : -1.0f; }
                float pv = hb[partner] * scale * (nw ? nw[partner] : 1.0f), sn, cs;
                sincosf((float)pos * a.inv_freq[i], &sn, &cs);
                /* x0' = x0 cos - x1 sin (first of the pair), x1' = x0 sin + x1 cos (second) */
                v = v * cs + sign * pv * sn;
            }
            if (is_q) a.q[(size_t)t * q_dim + base + d] = v;
            else {
                int kvh = h - a.n_heads;
                a.kc[(((size_t)blk * a.n_kv_heads + kvh) * a.block_size + off) * hd + d] = __float2bfloat16(v);
            }
        }
        __syncwarp(); /* hb is reused by this warp's next head */
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * GEMM on the tensor cores: C[M][N] (=|+=) A[M][K] * B[N][K]^T, A and B bf16 (K contiguous, rows 16-byte
 * aligned: lda, ldb multiples of 8, K a multiple of 8 with zero padding beyond the real K), C f32.
 * Tiles BM x BN x 32 go global -> shared memory with cp.async in a STAGES-deep pipeline, shared -> registers with
 * ldmatrix, and through mma.sync m16n8k16 (bf16 in, f32 accumulate). Rows of shared memory are 40 values (80
 * bytes) apart, so the 8 rows an ldmatrix phase reads fall in 8 different bank groups.
 * Split-K (gridDim.z > 1) adds partial products with atomicAdd when the tiles alone would leave SMs idle (decode:
 * M is tiny, the work is reading the weights, and every SM should be reading).
 * ------------------------------------------------------------------------------------------------------------- */
#define GEMM_BK 32
#define GEMM_SROW 40 /* GEMM_BK + 8 values of padding */
#define GEMM_STAGES 4

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0; /* 0 source bytes: the 16 bytes are zero-filled */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const void *smem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct gemm_args {
    const bf16 *A; const bf16 *B; float *C;
    int lda, ldb, ldc, M, N, K;
    int accumulate;     /* C += A B^T instead of C = A B^T */
    int k_tiles_split;  /* BK-tiles of K per gridDim.z slice */
    int atomic;         /* split-K: add with atomicAdd (C zeroed first unless accumulating) */
};

template <int BM, int BN, int WARPS_M, int WARPS_N>
__global__ void __launch_bounds__(WARPS_M *WARPS_N * 32) gemm_kernel(gemm_args g) {
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N; /* one warp's tile */
    constexpr int MT = WTM / 16, NT = WTN / 8;            /* mma tiles per warp */
    static_assert(MT >= 1 && NT >= 2 && NT % 2 == 0, "warp tile must be 16 x 16 at least");
    extern __shared__ __align__(16) unsigned char gemm_smem[];
    bf16 *As = (bf16 *)gemm_smem;                          /* [STAGES][BM][SROW] */
    bf16 *Bs = As + GEMM_STAGES * BM * GEMM_SROW;          /* [STAGES][BN][SROW] */

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = warp / WARPS_N, wn = warp % WARPS_N;
    int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    int k_tiles = cdiv(g.K, GEMM_BK);
    int kt_begin = blockIdx.z * g.k_tiles_split;
    int kt_end = min(k_tiles, kt_begin + g.k_tiles_split);
    int n_kt = kt_end - kt_begin;
    if (n_kt <= 0) return;

    /* each tile row is 4 chunks of 16 bytes; out-of-range rows and K chunks are zero-filled */
    auto load_stage = [&](int stage, int kt) {
        int k0 = kt * GEMM_BK;
        bf16 *as = As + stage * BM * GEMM_SROW, *bs = Bs + stage * BN * GEMM_SROW;
        for (int c = tid; c < BM * 4; c += THREADS) {
            int r = c >> 2, kc = (c & 3) * 8, gr = m0 + r, gk = k0 + kc;
            bool ok = gr < g.M && gk < g.K;
            cp_async16(as + r * GEMM_SROW + kc, g.A + (ok ? (size_t)gr * g.lda + gk : 0), ok);
        }
        for (int c = tid; c < BN * 4; c += THREADS) {
            int r = c >> 2, kc = (c & 3) * 8, gr = n0 + r, gk = k0 + kc;
            bool ok = gr < g.N && gk < g.K;
            cp_async16(bs + r * GEMM_SROW + kc, g.B + (ok ? (size_t)gr * g.ldb + gk : 0), ok);
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; s++) {
        if (s < n_kt) load_stage(s, kt_begin + s);
        cp_async_commit(); /* an empty group keeps the wait counts uniform */
    }
    for (int i = 0; i < n_kt; i++) {
        cp_async_wait<GEMM_STAGES - 2>(); /* tile i has landed (for this thread's copies) ... */
        __syncthreads();                  /* ... and everyone's; and everyone is done with tile i-1's stage */
        int next = i + GEMM_STAGES - 1;
        if (next < n_kt) load_stage(next % GEMM_STAGES, kt_begin + next);
        cp_async_commit();

        const bf16 *as = As + (i % GEMM_STAGES) * BM * GEMM_SROW, *bs = Bs + (i % GEMM_STAGES) * BN * GEMM_SROW;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            unsigned af[MT][4], bfr[NT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) /* lanes 0-15: rows 0-15 at k, lanes 16-31: rows 0-15 at k+8 */
                ldmatrix_x4(af[mt], as + (wm * WTM + mt * 16 + (lane & 15)) * GEMM_SROW + kk + (lane >> 4) * 8);
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) { /* two n8 tiles: matrices (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7) (n8-15,k8-15) */
                unsigned r[4];
                ldmatrix_x4(r, bs + (wn * WTN + nt * 8 + (lane & 7) + (lane >> 4) * 8) * GEMM_SROW + kk + ((lane >> 3) & 1) * 8);
                bfr[nt][0] = r[0]; bfr[nt][1] = r[1]; bfr[nt + 1][0] = r[2]; bfr[nt + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma_bf16(acc[mt][nt], af[mt], bfr[nt][0], bfr[nt][1]);
        }
    }
    cp_async_wait<0>();

    /* accumulator layout: c0,c1 at (row lane/4, cols 2*(lane%4)+0,1), c2,c3 eight rows further down */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int row = m0 + wm * WTM + mt * 16 + (lane >> 2) + (e >> 1) * 8;
                int col = n0 + wn * WTN + nt * 8 + (lane & 3) * 2 + (e & 1);
                if (row >= g.M || col >= g.N) continue;
                float *c = g.C + (size_t)row * g.ldc + col;
                if (g.atomic) atomicAdd(c, acc[mt][nt][e]);
                else if (g.accumulate) *c += acc[mt][nt][e];
                else *c = acc[mt][nt][e];
            }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Paged attention. One block (4 warps) takes one kv head and a tile of consecutive query tokens of one sequence
 * (all the query heads of that kv head: the GQA group, so K/V are read once for the group), over one partition
 * of the context. K and V come 32 positions at a time from the paged cache into shared memory (as f32);
 * each warp owns up to 8 query rows and keeps their online-softmax state (max, sum, output) in registers:
 * lane j scores position j of the tile, then every lane adds the tile's values into its output dims.
 * A context longer than the partition size is split over several blocks (vLLM's PagedAttention v2); each writes
 * its unnormalised output with its max and sum, and attn_reduce combines them by log-sum-exp. A short context
 * is one partition and writes the final output directly (v1). Prefill and decode are the same kernel: a decode
 * tile is one token.
 * Scores are kept in base 2 (q is pre-scaled by log2(e) / sqrt(head_dim)) so the exponentials are exp2f.
 * ------------------------------------------------------------------------------------------------------------- */
#define ATT_WARPS 4
#define ATT_MAX_ROWS 32            /* query rows per block: 4 warps of up to 8 */
#define ATT_KT 32                  /* positions per shared-memory tile */

struct attn_work { int seq, tok0, ntok, part; };
struct attn_args {
    const float *q; const bf16 *kc, *vc;          /* this layer's cache */
    const int *block_tables; int bt_stride;       /* [n_seqs][bt_stride] */
    const int *positions;
    const attn_work *work;
    const int *tok_nparts, *tok_partbase;         /* per token: its partitions and its first partial row */
    bf16 *out; int ldo;                           /* [T][ldo], heads side by side */
    float *part_acc, *part_ml;                    /* partials: [row][n_heads][hd], [row][n_heads][2] */
    int n_heads, n_kv_heads, hd, block_size, part_size;
    float scale_log2;
};

/* ROWS: query rows per warp, a compile-time constant so that the per-row state stays in registers and no row
 * loop carries a run-time guard; the host picks the smallest that covers the step (decode: the GQA group / 4). */
template <int ROWS>
__global__ void __launch_bounds__(ATT_WARPS * 32) attn_kernel(attn_args a) {
    extern __shared__ __align__(16) float att_smem[];
    int hd = a.hd, G = a.n_heads / a.n_kv_heads, kv_stride = hd + 8;
    float *qs = att_smem;                          /* [ATT_MAX_ROWS][hd] */
    /* K and V tiles as they are in the cache (bf16), two of each: the next tile is in flight (cp.async) while
     * this one is used. Rows are padded by 16 bytes so that lanes reading 16 bytes of consecutive rows hit
     * different banks. */
    bf16 *kvs = (bf16 *)(qs + ATT_MAX_ROWS * hd);  /* [2][K, V][ATT_KT][hd + 8] */
    __shared__ int qpos[ATT_MAX_ROWS];

    attn_work w = a.work[blockIdx.x];
    int kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n_rows = w.ntok * G;                       /* row r: token tok0 + r / G, head kvh * G + r % G */
    const int *bt = a.block_tables + (size_t)w.seq * a.bt_stride;
    int last_pos = 0;
    for (int t = 0; t < w.ntok; t++) last_pos = max(last_pos, a.positions[w.tok0 + t]);
    int kv_begin = w.part * a.part_size, kv_end = min(kv_begin + a.part_size, last_pos + 1);
    int chunks = hd / 8; /* 16-byte pieces of one cached row */

    auto load_tile = [&](int buf, int k0) {
        bf16 *kt = kvs + (size_t)buf * 2 * ATT_KT * kv_stride, *vt = kt + ATT_KT * kv_stride;
        for (int i = tid; i < ATT_KT * chunks; i += blockDim.x) {
            int j = i / chunks, c = i % chunks, p = k0 + j;
            bool ok = p < kv_end; /* beyond: zero-filled, so a masked score never meets a NaN */
            size_t off = ok ? (((size_t)bt[p / a.block_size] * a.n_kv_heads + kvh) * a.block_size + p % a.block_size) * hd + c * 8 : 0;
            cp_async16(kt + j * kv_stride + c * 8, a.kc + off, ok);
            cp_async16(vt + j * kv_stride + c * 8, a.vc + off, ok);
        }
        cp_async_commit();
    };
    load_tile(0, kv_begin); /* starts while q is staged */

    for (int i = tid; i < n_rows * hd; i += blockDim.x) {
        int r = i / hd, d = i % hd, t = w.tok0 + r / G, h = kvh * G + r % G;
        qs[i] = a.q[(size_t)t * a.n_heads * hd + h * hd + d] * a.scale_log2;
    }
    for (int r = tid; r < n_rows; r += blockDim.x) qpos[r] = a.positions[w.tok0 + r / G];

    float m[ROWS], l[ROWS], acc[ROWS][MAX_HEAD_DIM / 32];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -INFINITY; l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX_HEAD_DIM / 32; i++) acc[r][i] = 0.0f;
    }
    for (int k0 = kv_begin, it = 0; k0 < kv_end; k0 += ATT_KT, it++) {
        if (k0 + ATT_KT < kv_end) load_tile((it + 1) & 1, k0 + ATT_KT);
        else cp_async_commit(); /* an empty group keeps the wait count uniform */
        cp_async_wait<1>();     /* this tile has landed (this thread's copies) ... */
        __syncthreads();        /* ... everyone's; and q is in place */
        const bf16 *kt = kvs + (size_t)(it & 1) * 2 * ATT_KT * kv_stride, *vt = kt + ATT_KT * kv_stride;

        /* scores: lane j against position k0 + j, for each of this warp's rows */
        float s[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) s[r] = 0.0f;
        for (int d = 0; d < hd; d += 8) {
            uint4 kr = *(const uint4 *)&kt[lane * kv_stride + d];
            const __nv_bfloat162 *k2 = (const __nv_bfloat162 *)&kr;
            float2 k01 = __bfloat1622float2(k2[0]), k23 = __bfloat1622float2(k2[1]), k45 = __bfloat1622float2(k2[2]), k67 = __bfloat1622float2(k2[3]);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                int row = warp + r * ATT_WARPS;
                if (row < n_rows) {
                    float4 qa = *(const float4 *)&qs[row * hd + d], qb = *(const float4 *)&qs[row * hd + d + 4];
                    s[r] += qa.x * k01.x + qa.y * k01.y + qa.z * k23.x + qa.w * k23.y + qb.x * k45.x + qb.y * k45.y + qb.z * k67.x + qb.w * k67.y;
                }
            }
        }
        float p[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            int row = warp + r * ATT_WARPS;
            p[r] = 0.0f;
            if (row >= n_rows) continue;
            int key = k0 + lane;
            float sc = (key < kv_end && key <= qpos[row]) ? s[r] : -INFINITY; /* causal, and inside the partition */
            float m_new = fmaxf(m[r], warp_max(sc));
            if (m_new == -INFINITY) continue; /* nothing visible yet for this row */
            float corr = exp2f(m[r] - m_new); /* exp2(-inf) = 0 on the first visible tile */
            p[r] = exp2f(sc - m_new);
            l[r] = l[r] * corr + warp_sum(p[r]);
            m[r] = m_new;
#pragma unroll
            for (int i = 0; i < MAX_HEAD_DIM / 32; i++) acc[r][i] *= corr;
        }
        /* out += p V: each V value read once from shared memory for all the warp's rows */
        for (int j = 0; j < ATT_KT; j++) {
            float pj[ROWS]; /* shuffled before the per-lane bounds check: every lane must take part */
#pragma unroll
            for (int r = 0; r < ROWS; r++) pj[r] = __shfl_sync(0xffffffffu, p[r], j);
#pragma unroll
            for (int i = 0; i < MAX_HEAD_DIM / 32; i++) {
                int d = lane + 32 * i;
                if (d < hd) {
                    float v = __bfloat162float(vt[j * kv_stride + d]);
#pragma unroll
                    for (int r = 0; r < ROWS; r++) acc[r][i] += pj[r] * v; /* rows past the end have p = 0 */
                }
            }
        }
        __syncthreads(); /* everyone is done with this buffer before the next iteration refills it */
    }
    cp_async_wait<0>();

#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        int row = warp + r * ATT_WARPS;
        if (row >= n_rows) continue;
        int t = w.tok0 + row / G, h = kvh * G + row % G;
        if (a.tok_nparts[t] == 1) {
            float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
#pragma unroll
            for (int i = 0; i < MAX_HEAD_DIM / 32; i++) {
                int d = lane + 32 * i;
                if (d < hd) a.out[(size_t)t * a.ldo + h * hd + d] = __float2bfloat16(acc[r][i] * inv);
            }
        } else {
            size_t prow = (size_t)(a.tok_partbase[t] + w.part) * a.n_heads + h;
#pragma unroll
            for (int i = 0; i < MAX_HEAD_DIM / 32; i++) {
                int d = lane + 32 * i;
                if (d < hd) a.part_acc[prow * hd + d] = acc[r][i];
            }
            if (lane == 0) { a.part_ml[prow * 2] = m[r]; a.part_ml[prow * 2 + 1] = l[r]; }
        }
    }
}

/* Combine the partitions of tokens whose context was split: out = sum_p 2^(m_p - M) acc_p / sum_p 2^(m_p - M) l_p */
__global__ void attn_reduce_kernel(bf16 *out, int ldo, const float *part_acc, const float *part_ml,
                                   const int *tok_nparts, const int *tok_partbase, int n_heads, int hd) {
    int t = blockIdx.x, h = blockIdx.y, np = tok_nparts[t];
    if (np <= 1) return;
    size_t base = (size_t)tok_partbase[t];
    float M = -INFINITY;
    for (int p = 0; p < np; p++) M = fmaxf(M, part_ml[((base + p) * n_heads + h) * 2]);
    float L = 0;
    for (int p = 0; p < np; p++) {
        float mp = part_ml[((base + p) * n_heads + h) * 2];
        if (mp > -INFINITY) L += exp2f(mp - M) * part_ml[((base + p) * n_heads + h) * 2 + 1];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0;
        for (int p = 0; p < np; p++) {
            size_t row = (base + p) * n_heads + h;
            float mp = part_ml[row * 2];
            if (mp > -INFINITY) o += exp2f(mp - M) * part_acc[row * hd + d];
        }
        out[(size_t)t * ldo + h * hd + d] = __float2bfloat16(L > 0 ? o / L : 0.0f);
    }
}

/* zero the attention output's padding columns (read by the O GEMM) */
__global__ void zero_cols_kernel(bf16 *x, int ld, int from) {
    int t = blockIdx.x;
    for (int i = from + threadIdx.x; i < ld; i += blockDim.x) x[(size_t)t * ld + i] = __float2bfloat16(0.0f);
}

/* ---------------------------------------------------------------------------------------------------------------
 * The backend's state
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct { bf16 *w; int rows, cols, ld; } dmat; /* ld: cols rounded up to 8 (zero padding) */

typedef struct {
    dmat wqkv, wo, wgu, wdown;
    float *attn_norm, *ffn_norm, *bqkv, *q_norm, *k_norm; /* bqkv, q_norm, k_norm NULL when absent */
} dlayer;

typedef struct {
    llm_config cfg;
    int sm_count;
    cudaStream_t stream;
    dmat tok_embd, output;
    float *output_norm, *inv_freq;
    dlayer *layers;
    void **allocs; int n_allocs, cap_allocs;   /* every weight allocation, freed at destroy */
    /* KV cache */
    bf16 *kc, *vc;
    size_t layer_stride;                       /* values per layer: num_blocks * n_kv_heads * block_size * head_dim */
    int num_blocks, block_size, part_size;
    /* scratch, for cap_tokens tokens */
    int cap_tokens, cap_logits, cap_parts, cap_work, cap_ints;
    int ld_dim, ld_q, ld_ffn;                  /* padded row strides of the bf16 GEMM inputs */
    float *x, *qkv, *q, *gu, *logits, *part_acc, *part_ml;
    bf16 *xn, *att, *act;
    int *ints_d; int *ints_h;                  /* per-step integer inputs: pinned host staging, device copy */
    size_t attn_smem;
    /* CUDA graph of the last pure-decode step shape */
    cudaGraphExec_t graph; int graph_tokens, graph_logits, graph_bt_stride, use_graphs;
    int last_tokens, last_logits, last_bt_stride; /* the previous step's decode shape */
} cuda_ctx;

static int ctx_alloc(cuda_ctx *c, void **p, size_t bytes, char *err) {
    CK(cudaMalloc(p, bytes ? bytes : 16));
    if (c->n_allocs == c->cap_allocs) {
        c->cap_allocs = c->cap_allocs ? 2 * c->cap_allocs : 64;
        c->allocs = (void **)realloc(c->allocs, (size_t)c->cap_allocs * sizeof(void *));
        if (!c->allocs) return fail(err, "out of host memory");
    }
    c->allocs[c->n_allocs++] = *p;
    return 0;
}

/* Upload matrices (all of the same cols) stacked on top of each other as one bf16 matrix with padded rows. */
static int upload_stacked(cuda_ctx *c, dmat *out, const llm_weight *const *ws, int n, char *err) {
    int cols = (int)ws[0]->cols, rows = 0, ld = round_up(cols, 8);
    for (int i = 0; i < n; i++) {
        uint32_t t = ws[i]->type;
        if (ws[i]->cols != cols) return fail(err, "stacked weights differ in width");
        if (!llm_row_bytes(t, cols) || t == LLM_Q4_K || t == LLM_Q6_K) { snprintf(err, LLM_ERR_LEN, "the CUDA backend cannot use weights of type %s", llm_dtype_name(t)); return -1; }
        rows += (int)ws[i]->rows;
    }
    out->rows = rows; out->cols = cols; out->ld = ld;
    if (ctx_alloc(c, (void **)&out->w, (size_t)rows * ld * sizeof(bf16), err)) return -1;
    /* convert in slabs of rows so the host buffer stays small */
    const int slab = 4096;
    uint16_t *hbuf = (uint16_t *)malloc((size_t)slab * ld * sizeof(uint16_t));
    if (!hbuf) return fail(err, "out of host memory converting weights");
    int row0 = 0, rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const llm_weight *w = ws[i];
        size_t rb = llm_row_bytes(w->type, cols);
        for (int r0 = 0; r0 < w->rows && !rc; r0 += slab) {
            int nr = (int)(w->rows - r0 < slab ? w->rows - r0 : slab);
            #pragma omp parallel
            {
                float *tmp = (float *)malloc((size_t)cols * sizeof(float));
                #pragma omp for schedule(static)
                for (int r = 0; r < nr; r++) {
                    if (tmp) llm_dequant_row(w->type, (const uint8_t *)w->data + (size_t)(r0 + r) * rb, tmp, cols);
                    for (int k = 0; k < ld; k++) hbuf[(size_t)r * ld + k] = k < cols && tmp ? host_f32_to_bf16(tmp[k]) : 0;
                }
                free(tmp);
            }
            cudaError_t e = cudaMemcpy(out->w + (size_t)(row0 + r0) * ld, hbuf, (size_t)nr * ld * sizeof(bf16), cudaMemcpyHostToDevice);
            if (e != cudaSuccess) rc = cuda_fail(err, e, "cudaMemcpy (weights)", __LINE__);
        }
        row0 += (int)w->rows;
    }
    free(hbuf);
    return rc;
}

static int upload_f32(cuda_ctx *c, float **out, const float *const *parts, const int *lens, int n, char *err) {
    int total = 0;
    for (int i = 0; i < n; i++) total += lens[i];
    if (ctx_alloc(c, (void **)out, (size_t)total * sizeof(float), err)) return -1;
    int off = 0;
    for (int i = 0; i < n; i++) { CK(cudaMemcpy(*out + off, parts[i], (size_t)lens[i] * sizeof(float), cudaMemcpyHostToDevice)); off += lens[i]; }
    return 0;
}
static int upload_vec(cuda_ctx *c, float **out, const llm_weight *w, char *err) {
    *out = NULL;
    if (!w->data) return 0;
    if (w->type != LLM_F32) return fail(err, "norm and bias weights must be f32");
    const float *p = (const float *)w->data; int len = (int)w->cols;
    return upload_f32(c, out, &p, &len, 1, err);
}

static void free_scratch(cuda_ctx *c) {
    cudaFree(c->x); cudaFree(c->qkv); cudaFree(c->q); cudaFree(c->gu); cudaFree(c->xn); cudaFree(c->att); cudaFree(c->act);
    c->x = c->qkv = c->q = c->gu = NULL; c->xn = c->att = c->act = NULL;
    c->cap_tokens = 0;
}

/* Grow the scratch buffers to hold a batch of T tokens, n_logits logit rows, n_part partial rows, n_work tiles
 * and n_ints per-step integers. Growing drops the decode graph: it points at the old buffers. */
static int ensure_scratch(cuda_ctx *c, int T, int n_logits, int n_part, int n_work, int n_ints, char *err) {
    const llm_config *cf = &c->cfg;
    int q_dim = cf->n_heads * cf->head_dim, kv_dim = cf->n_kv_heads * cf->head_dim;
    int grew = 0;
    if (T > c->cap_tokens) {
        free_scratch(c);
        int cap = round_up(T > 64 ? T : 64, 64);
        CK(cudaMalloc((void **)&c->x, (size_t)cap * cf->dim * sizeof(float)));
        CK(cudaMalloc((void **)&c->qkv, (size_t)cap * (q_dim + 2 * kv_dim) * sizeof(float)));
        CK(cudaMalloc((void **)&c->q, (size_t)cap * q_dim * sizeof(float)));
        CK(cudaMalloc((void **)&c->gu, (size_t)cap * 2 * cf->ffn_dim * sizeof(float)));
        CK(cudaMalloc((void **)&c->xn, (size_t)cap * c->ld_dim * sizeof(bf16)));
        CK(cudaMalloc((void **)&c->att, (size_t)cap * c->ld_q * sizeof(bf16)));
        CK(cudaMalloc((void **)&c->act, (size_t)cap * c->ld_ffn * sizeof(bf16)));
        c->cap_tokens = cap; grew = 1;
    }
    if (n_logits > c->cap_logits) {
        cudaFree(c->logits); c->logits = NULL;
        int cap = round_up(n_logits, 64);
        CK(cudaMalloc((void **)&c->logits, (size_t)cap * cf->vocab_size * sizeof(float)));
        c->cap_logits = cap; grew = 1;
    }
    if (n_part > c->cap_parts) {
        cudaFree(c->part_acc); cudaFree(c->part_ml); c->part_acc = c->part_ml = NULL;
        int cap = round_up(n_part, 256);
        CK(cudaMalloc((void **)&c->part_acc, (size_t)cap * cf->n_heads * cf->head_dim * sizeof(float)));
        CK(cudaMalloc((void **)&c->part_ml, (size_t)cap * cf->n_heads * 2 * sizeof(float)));
        c->cap_parts = cap; grew = 1;
    }
    if (n_ints > c->cap_ints) {
        cudaFree(c->ints_d); cudaFreeHost(c->ints_h); c->ints_d = NULL; c->ints_h = NULL;
        int cap = round_up(n_ints, 4096);
        CK(cudaMalloc((void **)&c->ints_d, (size_t)cap * sizeof(int)));
        CK(cudaMallocHost((void **)&c->ints_h, (size_t)cap * sizeof(int)));
        c->cap_ints = cap; grew = 1;
    }
    (void)n_work;
    if (grew && c->graph) { cudaGraphExecDestroy(c->graph); c->graph = NULL; }
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Launchers
 * ------------------------------------------------------------------------------------------------------------- */
template <int BM, int BN, int WM, int WN>
static int launch_gemm_cfg(cuda_ctx *c, gemm_args g, char *err) {
    constexpr int threads = WM * WN * 32;
    size_t smem = (size_t)GEMM_STAGES * (BM + BN) * GEMM_SROW * sizeof(bf16);
    int tiles_m = cdiv(g.M, BM), tiles_n = cdiv(g.N, BN), tiles = tiles_m * tiles_n, k_tiles = cdiv(g.K, GEMM_BK);
    /* split K when the tiles cannot fill the GPU twice over; keep >= 4 BK-tiles per slice for the pipeline */
    int split = 1;
    if (tiles < 2 * c->sm_count) {
        split = cdiv(2 * c->sm_count, tiles);
        int max_split = k_tiles / 4 > 1 ? k_tiles / 4 : 1;
        if (split > max_split) split = max_split;
        if (split > 16) split = 16;
    }
    g.k_tiles_split = cdiv(k_tiles, split);
    split = cdiv(k_tiles, g.k_tiles_split);
    g.atomic = split > 1;
    if (g.atomic && !g.accumulate) CK(cudaMemsetAsync(g.C, 0, (size_t)g.M * g.ldc * sizeof(float), c->stream));
    dim3 grid(tiles_n, tiles_m, split);
    gemm_kernel<BM, BN, WM, WN><<<grid, threads, smem, c->stream>>>(g);
    CK_LAUNCH();
    return 0;
}

static int launch_attn(cuda_ctx *c, const attn_args &aa, int n_work, int max_rows, char *err) {
    dim3 grid(n_work, c->cfg.n_kv_heads);
    int rows = cdiv(max_rows, ATT_WARPS);
    if (rows <= 1) attn_kernel<1><<<grid, ATT_WARPS * 32, c->attn_smem, c->stream>>>(aa);
    else if (rows <= 2) attn_kernel<2><<<grid, ATT_WARPS * 32, c->attn_smem, c->stream>>>(aa);
    else if (rows <= 4) attn_kernel<4><<<grid, ATT_WARPS * 32, c->attn_smem, c->stream>>>(aa);
    else attn_kernel<8><<<grid, ATT_WARPS * 32, c->attn_smem, c->stream>>>(aa);
    CK_LAUNCH();
    return 0;
}

static int set_gemm_smem(char *err) {
    CK(cudaFuncSetAttribute(gemm_kernel<128, 128, 2, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_STAGES * 256 * GEMM_SROW * 2));
    CK(cudaFuncSetAttribute(gemm_kernel<64, 128, 2, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_STAGES * 192 * GEMM_SROW * 2));
    CK(cudaFuncSetAttribute(gemm_kernel<32, 64, 1, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, GEMM_STAGES * 96 * GEMM_SROW * 2));
    return 0;
}

/* C[M][N] (+)= A[M][K] W^T; the tile shape follows M: decode (tiny M) wants many narrow tiles, prefill big ones */
static int gemm(cuda_ctx *c, float *C, int ldc, const bf16 *A, int lda, const dmat *W, int M, int accumulate, char *err) {
    gemm_args g = {A, W->w, C, lda, W->ld, ldc, M, W->rows, W->ld, accumulate, 0, 0};
    if (M <= 32) return launch_gemm_cfg<32, 64, 1, 4>(c, g, err);
    if (M <= 96) return launch_gemm_cfg<64, 128, 2, 4>(c, g, err);
    return launch_gemm_cfg<128, 128, 2, 4>(c, g, err);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Per-step integer inputs, laid out in one buffer and sent with one copy
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct {
    int T, n_seqs, n_logits, n_work, n_part, bt_stride, max_rows; /* max_rows: query rows of the largest attention tile */
    int off_tokens, off_pos, off_slots, off_rows, off_nparts, off_partbase, off_bt, off_work, total;
} step_layout;

/* Plan the step: attention tiles and partitions, block-table stride, integer buffer layout. Fills ints_h. */
static int plan_step(cuda_ctx *c, const llm_batch *b, step_layout *L, char *err) {
    const llm_config *cf = &c->cfg;
    int G = cf->n_heads / cf->n_kv_heads, QT = ATT_MAX_ROWS / G, bs = c->block_size;
    memset(L, 0, sizeof *L);
    L->T = b->n_tokens; L->n_seqs = b->n_seqs; L->n_logits = b->n_logits;
    int max_blocks = 1;
    for (int s = 0; s < b->n_seqs; s++) {
        int mx = 0;
        for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i++) {
            if (b->positions[i] < 0) return fail(err, "negative position in the batch");
            if (b->positions[i] > mx) mx = b->positions[i];
        }
        if (mx / bs + 1 > max_blocks) max_blocks = mx / bs + 1;
        for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i += QT) {
            int n = b->seq_start[s + 1] - i < QT ? b->seq_start[s + 1] - i : QT, last = 0;
            for (int k = 0; k < n; k++) if (b->positions[i + k] > last) last = b->positions[i + k];
            int np = cdiv(last + 1, c->part_size);
            L->n_work += np;
            if (n * G > L->max_rows) L->max_rows = n * G;
            if (np > 1) L->n_part += n * np;
        }
    }
    /* rounded up so that a decode graph, which bakes the stride in, stays valid for 32 blocks of growth */
    max_blocks = round_up(max_blocks, 32);
    L->bt_stride = max_blocks;
    int o = 0;
    L->off_tokens = o; o += L->T; L->off_pos = o; o += L->T; L->off_slots = o; o += L->T;
    L->off_rows = o; o += L->n_logits; L->off_nparts = o; o += L->T; L->off_partbase = o; o += L->T;
    L->off_bt = o; o += L->n_seqs * max_blocks; o = round_up(o, 4);
    L->off_work = o; o += 4 * L->n_work;
    L->total = o;
    if (ensure_scratch(c, L->T, L->n_logits, L->n_part, L->n_work, L->total, err)) return -1;

    int *h = c->ints_h;
    memcpy(h + L->off_tokens, b->tokens, (size_t)L->T * sizeof(int));
    memcpy(h + L->off_pos, b->positions, (size_t)L->T * sizeof(int));
    memcpy(h + L->off_rows, b->logit_rows, (size_t)L->n_logits * sizeof(int));
    attn_work *work = (attn_work *)(h + L->off_work);
    int nw = 0, part_row = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const int32_t *tab = b->block_tables[s];
        int mx = 0;
        for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i++) {
            int p = b->positions[i];
            if (p > mx) mx = p;
            int blk = tab[p / bs];
            if (blk < 0 || blk >= c->num_blocks) return fail(err, "block table entry outside the KV pool");
            h[L->off_slots + i] = blk * bs + p % bs;
        }
        int *row = h + L->off_bt + s * max_blocks;
        for (int k = 0; k < max_blocks; k++) row[k] = k <= mx / bs ? tab[k] : 0;
        for (int k = 0; k <= mx / bs; k++)
            if (row[k] < 0 || row[k] >= c->num_blocks) return fail(err, "block table entry outside the KV pool");
        for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i += QT) {
            int n = b->seq_start[s + 1] - i < QT ? b->seq_start[s + 1] - i : QT, last = 0;
            for (int k = 0; k < n; k++) if (b->positions[i + k] > last) last = b->positions[i + k];
            int np = cdiv(last + 1, c->part_size);
            for (int k = 0; k < n; k++) { h[L->off_nparts + i + k] = np; h[L->off_partbase + i + k] = np > 1 ? part_row + k * np : 0; }
            if (np > 1) part_row += n * np;
            for (int p = 0; p < np; p++) work[nw++] = attn_work{s, i, n, p};
        }
    }
    return 0;
}

/* All the kernels of one step, in stream order (also what a decode graph captures). */
static int enqueue_step(cuda_ctx *c, const step_layout *L, char *err) {
    const llm_config *cf = &c->cfg;
    int T = L->T, hd = cf->head_dim, q_dim = cf->n_heads * hd;
    const int *di = c->ints_d;
    cudaStream_t st = c->stream;
    CK(cudaMemcpyAsync(c->ints_d, c->ints_h, (size_t)L->total * sizeof(int), cudaMemcpyHostToDevice, st));
    embed_kernel<<<T, 256, 0, st>>>(c->x, c->tok_embd.w, c->tok_embd.ld, di + L->off_tokens, cf->dim);
    CK_LAUNCH();
    for (int l = 0; l < cf->n_layers; l++) {
        const dlayer *ly = &c->layers[l];
        bf16 *kc = c->kc + (size_t)l * c->layer_stride, *vc = c->vc + (size_t)l * c->layer_stride;
        rmsnorm_kernel<<<T, 256, 0, st>>>(c->xn, c->ld_dim, c->x, NULL, ly->attn_norm, cf->dim, cf->rms_eps);
        CK_LAUNCH();
        if (gemm(c, c->qkv, ly->wqkv.rows, c->xn, c->ld_dim, &ly->wqkv, T, 0, err)) return -1;
        prep_args pa = {c->qkv, c->q, kc, vc, ly->bqkv, ly->q_norm, ly->k_norm, c->inv_freq, di + L->off_pos, di + L->off_slots,
                        cf->n_heads, cf->n_kv_heads, hd, cf->rope_dim, cf->rope_neox, c->block_size, cf->rms_eps};
        qkv_prep_kernel<<<T, PREP_WARPS * 32, 0, st>>>(pa);
        CK_LAUNCH();
        attn_args aa = {c->q, kc, vc, di + L->off_bt, L->bt_stride, di + L->off_pos, (const attn_work *)(di + L->off_work),
                        di + L->off_nparts, di + L->off_partbase, c->att, c->ld_q, c->part_acc, c->part_ml,
                        cf->n_heads, cf->n_kv_heads, hd, c->block_size, c->part_size, 1.4426950408889634f / sqrtf((float)hd)};
        if (launch_attn(c, aa, L->n_work, L->max_rows, err)) return -1;
        if (L->n_part) {
            attn_reduce_kernel<<<dim3(T, cf->n_heads), hd < 128 ? hd : 128, 0, st>>>(c->att, c->ld_q, c->part_acc, c->part_ml,
                                                                                   di + L->off_nparts, di + L->off_partbase, cf->n_heads, hd);
            CK_LAUNCH();
        }
        if (c->ld_q > q_dim) { zero_cols_kernel<<<T, 32, 0, st>>>(c->att, c->ld_q, q_dim); CK_LAUNCH(); }
        if (gemm(c, c->x, cf->dim, c->att, c->ld_q, &ly->wo, T, 1, err)) return -1;
        rmsnorm_kernel<<<T, 256, 0, st>>>(c->xn, c->ld_dim, c->x, NULL, ly->ffn_norm, cf->dim, cf->rms_eps);
        CK_LAUNCH();
        if (gemm(c, c->gu, 2 * cf->ffn_dim, c->xn, c->ld_dim, &ly->wgu, T, 0, err)) return -1;
        swiglu_kernel<<<dim3(cdiv(c->ld_ffn, 256), T), 256, 0, st>>>(c->act, c->ld_ffn, c->gu, cf->ffn_dim);
        CK_LAUNCH();
        if (gemm(c, c->x, cf->dim, c->act, c->ld_ffn, &ly->wdown, T, 1, err)) return -1;
    }
    if (L->n_logits) {
        rmsnorm_kernel<<<L->n_logits, 256, 0, st>>>(c->xn, c->ld_dim, c->x, di + L->off_rows, c->output_norm, cf->dim, cf->rms_eps);
        CK_LAUNCH();
        if (gemm(c, c->logits, cf->vocab_size, c->xn, c->ld_dim, &c->output, L->n_logits, 0, err)) return -1;
    }
    return 0;
}

static int cuda_forward(llm_backend *be, const llm_model *m, const llm_batch *b, float *logits, char *err) {
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    const llm_config *cf = &c->cfg;
    (void)m;
    if (b->n_tokens <= 0) return 0;
    for (int i = 0; i < b->n_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= cf->vocab_size) { snprintf(err, LLM_ERR_LEN, "token id %d outside the vocabulary", b->tokens[i]); return -1; }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens) return fail(err, "logit row outside the batch");
    step_layout L;
    if (plan_step(c, b, &L, err)) return -1;
    /* A pure-decode step (one token per sequence, short contexts) has the same kernels every time for the same
     * batch size: replay a captured graph instead of launching ~10 kernels per layer. The graph reads its
     * inputs from ints_d, which the copy at its start refills from ints_h. */
    int decode = b->n_tokens == b->n_seqs && L.n_part == 0 && L.n_work == b->n_seqs;
    int same_as_graph = c->graph && c->graph_tokens == L.T && c->graph_logits == L.n_logits && c->graph_bt_stride == L.bt_stride;
    /* capture only a shape seen in the step before too: a batch whose size changes every step would pay the
     * capture each time and never replay */
    int repeated = decode && c->last_tokens == L.T && c->last_logits == L.n_logits && c->last_bt_stride == L.bt_stride;
    c->last_tokens = decode ? L.T : -1; c->last_logits = L.n_logits; c->last_bt_stride = L.bt_stride;
    if (c->use_graphs && decode && (same_as_graph || repeated)) {
        if (!same_as_graph) {
            if (c->graph) { CK(cudaGraphExecDestroy(c->graph)); c->graph = NULL; }
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
            int rc = enqueue_step(c, &L, err);
            cudaError_t e = cudaStreamEndCapture(c->stream, &g);
            if (rc) return -1;
            if (e != cudaSuccess) return cuda_fail(err, e, "cudaStreamEndCapture", __LINE__);
            e = cudaGraphInstantiate(&c->graph, g, 0);
            cudaGraphDestroy(g);
            if (e != cudaSuccess) { c->graph = NULL; return cuda_fail(err, e, "cudaGraphInstantiate", __LINE__); }
            c->graph_tokens = L.T; c->graph_logits = L.n_logits; c->graph_bt_stride = L.bt_stride;
        }
        CK(cudaGraphLaunch(c->graph, c->stream));
    } else if (enqueue_step(c, &L, err)) return -1;
    if (b->n_logits)
        CK(cudaMemcpyAsync(logits, c->logits, (size_t)b->n_logits * cf->vocab_size * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    CK(cudaStreamSynchronize(c->stream));
    return 0;
}

static int cuda_copy_block(llm_backend *be, int src, int dst, char *err) {
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    if (src < 0 || dst < 0 || src >= c->num_blocks || dst >= c->num_blocks) return fail(err, "copy_block: block outside the pool");
    size_t blk = (size_t)c->cfg.n_kv_heads * c->block_size * c->cfg.head_dim * sizeof(bf16);
    /* one strided copy per cache: a block's bytes in each of the n_layers layers */
    CK(cudaMemcpy2DAsync((char *)c->kc + dst * blk, c->layer_stride * sizeof(bf16), (char *)c->kc + src * blk, c->layer_stride * sizeof(bf16),
                         blk, c->cfg.n_layers, cudaMemcpyDeviceToDevice, c->stream));
    CK(cudaMemcpy2DAsync((char *)c->vc + dst * blk, c->layer_stride * sizeof(bf16), (char *)c->vc + src * blk, c->layer_stride * sizeof(bf16),
                         blk, c->cfg.n_layers, cudaMemcpyDeviceToDevice, c->stream));
    CK(cudaStreamSynchronize(c->stream));
    return 0;
}

static void ctx_free(cuda_ctx *c) {
    if (!c) return;
    if (c->graph) cudaGraphExecDestroy(c->graph);
    free_scratch(c);
    cudaFree(c->logits); cudaFree(c->part_acc); cudaFree(c->part_ml); cudaFree(c->ints_d); cudaFreeHost(c->ints_h);
    cudaFree(c->kc); cudaFree(c->vc);
    for (int i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i]);
    free(c->allocs); free(c->layers);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}
static void cuda_destroy(llm_backend *be) { ctx_free((cuda_ctx *)be->ctx); free(be); }

/* ---------------------------------------------------------------------------------------------------------------
 * Creation
 * ------------------------------------------------------------------------------------------------------------- */
static int ctx_init_device(cuda_ctx *c, const llm_config *cf, char *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) { snprintf(err, LLM_ERR_LEN, "no usable CUDA GPU (%s)", cudaGetErrorString(e)); return -1; }
    if (n == 0) return fail(err, "no CUDA GPU found");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 8) { snprintf(err, LLM_ERR_LEN, "GPU %.64s (sm_%d%d) is too old: the kernels need sm_80 or newer", prop.name, prop.major, prop.minor); return -1; }
    c->sm_count = prop.multiProcessorCount;
    c->cfg = *cf;
    if (cf->head_dim % 8 || cf->head_dim > MAX_HEAD_DIM || cf->n_heads % cf->n_kv_heads || cf->n_heads / cf->n_kv_heads > ATT_MAX_ROWS) {
        snprintf(err, LLM_ERR_LEN, "the CUDA backend needs head_dim a multiple of 8 up to %d and at most %d query heads per kv head",
                 MAX_HEAD_DIM, ATT_MAX_ROWS);
        return -1;
    }
    CK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (set_gemm_smem(err)) return -1;
    c->attn_smem = (size_t)ATT_MAX_ROWS * cf->head_dim * sizeof(float) + (size_t)4 * ATT_KT * (cf->head_dim + 8) * sizeof(bf16);
    CK(cudaFuncSetAttribute(attn_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c->attn_smem));
    CK(cudaFuncSetAttribute(attn_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c->attn_smem));
    CK(cudaFuncSetAttribute(attn_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c->attn_smem));
    CK(cudaFuncSetAttribute(attn_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c->attn_smem));
    c->part_size = 512;
    c->ld_dim = round_up(cf->dim, 8);
    c->ld_q = round_up(cf->n_heads * cf->head_dim, 8);
    c->ld_ffn = round_up(cf->ffn_dim, 8);
    /* RoPE frequencies base^(-2i/rope_dim), in double, then f32 */
    float inv[MAX_HEAD_DIM / 2];
    for (int i = 0; i < cf->rope_dim / 2; i++) inv[i] = (float)pow((double)cf->rope_base, -2.0 * i / cf->rope_dim);
    const float *p = inv; int len = cf->rope_dim / 2 > 0 ? cf->rope_dim / 2 : 1;
    if (upload_f32(c, &c->inv_freq, &p, &len, 1, err)) return -1;
    c->use_graphs = getenv("LLM_CUDA_NO_GRAPHS") == NULL;
    return 0;
}

static int ctx_alloc_kv(cuda_ctx *c, int num_blocks, int block_size, char *err) {
    const llm_config *cf = &c->cfg;
    c->num_blocks = num_blocks; c->block_size = block_size;
    c->layer_stride = (size_t)num_blocks * cf->n_kv_heads * block_size * cf->head_dim;
    CK(cudaMalloc((void **)&c->kc, c->layer_stride * cf->n_layers * sizeof(bf16)));
    CK(cudaMalloc((void **)&c->vc, c->layer_stride * cf->n_layers * sizeof(bf16)));
    /* zeros, not garbage: a NaN bit pattern in an unwritten slot would poison a masked-out score (0 * NaN) */
    CK(cudaMemset(c->kc, 0, c->layer_stride * cf->n_layers * sizeof(bf16)));
    CK(cudaMemset(c->vc, 0, c->layer_stride * cf->n_layers * sizeof(bf16)));
    return 0;
}

static int upload_model(cuda_ctx *c, const llm_model *m, char *err) {
    const llm_config *cf = &c->cfg;
    const llm_weight *emb[1] = {&m->tok_embd};
    if (upload_stacked(c, &c->tok_embd, emb, 1, err)) return -1;
    if (m->output.data == m->tok_embd.data) c->output = c->tok_embd; /* tied */
    else { const llm_weight *o[1] = {&m->output}; if (upload_stacked(c, &c->output, o, 1, err)) return -1; }
    if (upload_vec(c, &c->output_norm, &m->output_norm, err)) return -1;
    c->layers = (dlayer *)calloc((size_t)cf->n_layers, sizeof(dlayer));
    if (!c->layers) return fail(err, "out of host memory");
    int q_dim = cf->n_heads * cf->head_dim, kv_dim = cf->n_kv_heads * cf->head_dim;
    for (int l = 0; l < cf->n_layers; l++) {
        const llm_layer *L = &m->layers[l];
        dlayer *d = &c->layers[l];
        const llm_weight *qkv[3] = {&L->wq, &L->wk, &L->wv}, *wo[1] = {&L->wo}, *gu[2] = {&L->w_gate, &L->w_up}, *dn[1] = {&L->w_down};
        if (upload_stacked(c, &d->wqkv, qkv, 3, err) || upload_stacked(c, &d->wo, wo, 1, err) ||
            upload_stacked(c, &d->wgu, gu, 2, err) || upload_stacked(c, &d->wdown, dn, 1, err)) return -1;
        if (upload_vec(c, &d->attn_norm, &L->attn_norm, err) || upload_vec(c, &d->ffn_norm, &L->ffn_norm, err) ||
            upload_vec(c, &d->q_norm, &L->q_norm, err) || upload_vec(c, &d->k_norm, &L->k_norm, err)) return -1;
        if (L->bq.data) {
            if (L->bq.type != LLM_F32 || L->bk.type != LLM_F32 || L->bv.type != LLM_F32 || !L->bk.data || !L->bv.data)
                return fail(err, "QKV biases must be f32 and all present");
            const float *parts[3] = {(const float *)L->bq.data, (const float *)L->bk.data, (const float *)L->bv.data};
            int lens[3] = {q_dim, kv_dim, kv_dim};
            if (upload_f32(c, &d->bqkv, parts, lens, 3, err)) return -1;
        }
    }
    return 0;
}

extern "C" llm_backend *llm_cuda_backend_create(const llm_model *m, int num_blocks, size_t kv_bytes, double kv_fraction, int block_size, char *err) {
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    llm_backend *be = (llm_backend *)calloc(1, sizeof *be);
    if (!c || !be) { free(c); free(be); fail(err, "out of host memory"); return NULL; }
    if (block_size <= 0) block_size = 16;
    if (ctx_init_device(c, &m->cfg, err) || upload_model(c, m, err)) goto bad;
    {
        const llm_config *cf = &m->cfg;
        size_t per_block = (size_t)2 * cf->n_layers * cf->n_kv_heads * block_size * cf->head_dim * sizeof(bf16);
        if (num_blocks <= 0) {
            size_t budget = kv_bytes;
            if (!budget) {
                /* like vLLM's gpu_memory_utilization: kv_fraction (default 90%) of what the weights left free,
                 * minus room for the activations of a large batch (2048 tokens) and the logits of 256 rows */
                size_t free_b = 0, total_b = 0;
                cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
                if (e != cudaSuccess) { cuda_fail(err, e, "cudaMemGetInfo", __LINE__); goto bad; }
                size_t act = (size_t)2048 * ((size_t)cf->dim * 4 * 2 + (size_t)(cf->n_heads + 2 * cf->n_kv_heads) * cf->head_dim * 4 * 2 +
                                             (size_t)cf->ffn_dim * 4 * 3) + (size_t)256 * cf->vocab_size * 4 + ((size_t)256 << 20);
                budget = (size_t)(free_b * (kv_fraction > 0 && kv_fraction <= 1 ? kv_fraction : 0.9));
                budget = budget > act ? budget - act : 0;
            }
            size_t nb = budget / per_block;
            if (nb > (1u << 30)) nb = 1u << 30; /* block ids are int; the block manager keeps a record per block */
            num_blocks = (int)nb;
            if (num_blocks <= 0) { fail(err, "no GPU memory left for the KV cache"); goto bad; }
        }
        if (ctx_alloc_kv(c, num_blocks, block_size, err)) goto bad;
        /* the uploads and memsets ran on the default stream, which our non-blocking stream does not wait for */
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) { cuda_fail(err, e, "cudaDeviceSynchronize", __LINE__); goto bad; }
    }
    be->name = "cuda"; be->ctx = c; be->num_blocks = num_blocks; be->block_size = block_size;
    be->kv_bytes_per_block = (size_t)2 * m->cfg.n_layers * m->cfg.n_kv_heads * block_size * m->cfg.head_dim * sizeof(bf16);
    be->forward = cuda_forward; be->copy_block = cuda_copy_block; be->destroy = cuda_destroy;
    return be;
bad:
    ctx_free(c); free(be);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Entry points for the GPU tests (llm-test --gpu, in test.c) and the kernel benchmarks: each kernel alone, on inputs the
 * caller gives in plain f32 host arrays.
 * ------------------------------------------------------------------------------------------------------------- */
static cuda_ctx *test_ctx(const llm_config *cf, char *err) {
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!c) { fail(err, "out of host memory"); return NULL; }
    if (ctx_init_device(c, cf, err)) { ctx_free(c); return NULL; }
    return c;
}

/* C[M][N] (+)= bf16(A[M][K]) bf16(W[N][K])^T through the GEMM kernel, with the tile choice of the forward pass */
extern "C" int llm_cuda_test_gemm(int M, int N, int K, const float *A, const float *W, float *C, int accumulate, char *err) {
    llm_config cf; memset(&cf, 0, sizeof cf);
    cf.n_heads = cf.n_kv_heads = 1; cf.head_dim = 8; cf.rope_dim = 8; cf.rope_base = 10000;
    cuda_ctx *c = test_ctx(&cf, err);
    if (!c) return -1;
    int ld = round_up(K, 8), rc = -1;
    llm_weight wa = {A, LLM_F32, M, K}, ww = {W, LLM_F32, N, K};
    const llm_weight *pa[1] = {&wa}, *pw[1] = {&ww};
    dmat da, dw;
    float *dc = NULL;
    if (upload_stacked(c, &da, pa, 1, err) || upload_stacked(c, &dw, pw, 1, err)) goto done;
    if (ctx_alloc(c, (void **)&dc, (size_t)M * N * sizeof(float), err)) goto done;
    if (cudaMemcpy(dc, C, (size_t)M * N * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) { fail(err, "copy C"); goto done; }
    if (cudaDeviceSynchronize() != cudaSuccess) { fail(err, "upload"); goto done; }
    if (gemm(c, dc, N, da.w, ld, &dw, M, accumulate, err)) goto done;
    {
        cudaError_t e = cudaStreamSynchronize(c->stream); /* our stream does not wait for, nor is waited by, cudaMemcpy */
        if (e == cudaSuccess) e = cudaMemcpy(C, dc, (size_t)M * N * sizeof(float), cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) { cuda_fail(err, e, "cudaMemcpy C", __LINE__); goto done; }
    }
    rc = 0;
done:
    ctx_free(c);
    return rc;
}

/* The QKV preparation (bias, q/k norm, RoPE) and paged attention of one layer, as the forward pass runs them.
 * qkv: [T][q_dim + 2 kv_dim] f32 straight out of the projections; bias, q_norm, k_norm may be NULL.
 * The cache is the batch's: block_tables index num_blocks blocks of block_size slots; positions before each
 * sequence's first new token must already be in it: k_cache, v_cache give them in llm.h's CPU layout
 * [block][slot][kv_head][head_dim] (f32; rounded to bf16 here), and the new tokens' K/V are written over them.
 * Outputs: q_out [T][q_dim] after norm+RoPE, att_out [T][q_dim], and k_cache/v_cache read back (bf16 values).
 * part_size: the attention partition length (a multiple of 32; 512 in the engine) */
extern "C" int llm_cuda_test_attention(const llm_config *cf, const llm_batch *b, int num_blocks, int block_size, int part_size,
                                       const float *qkv, const float *bias, const float *q_norm, const float *k_norm,
                                       float *k_cache, float *v_cache, float *q_out, float *att_out, char *err) {
    cuda_ctx *c = test_ctx(cf, err);
    if (!c) return -1;
    int rc = -1, hd = cf->head_dim, nkv = cf->n_kv_heads, q_dim = cf->n_heads * hd, kv_dim = nkv * hd, T = b->n_tokens;
    size_t n_cache = (size_t)num_blocks * block_size * kv_dim;
    uint16_t *hk = (uint16_t *)malloc(n_cache * 2), *hv = (uint16_t *)malloc(n_cache * 2), *hatt = (uint16_t *)malloc((size_t)T * c->ld_q * 2);
    float *dbias = NULL, *dqn = NULL, *dkn = NULL, *dqkv = NULL;
    step_layout L;
    if (!hk || !hv || !hatt) { fail(err, "out of host memory"); goto done; }
    c->part_size = part_size;
    if (ctx_alloc_kv(c, num_blocks, block_size, err)) goto done;
    /* CPU layout [block][slot][kvh][d] -> ours [block][kvh][slot][d] */
    for (int blk = 0; blk < num_blocks; blk++)
        for (int s = 0; s < block_size; s++)
            for (int h = 0; h < nkv; h++)
                for (int d = 0; d < hd; d++) {
                    size_t src = (((size_t)blk * block_size + s) * nkv + h) * hd + d, dst = (((size_t)blk * nkv + h) * block_size + s) * hd + d;
                    hk[dst] = host_f32_to_bf16(k_cache[src]); hv[dst] = host_f32_to_bf16(v_cache[src]);
                }
    if (cudaMemcpy(c->kc, hk, n_cache * 2, cudaMemcpyHostToDevice) != cudaSuccess || cudaMemcpy(c->vc, hv, n_cache * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
        fail(err, "copy cache"); goto done;
    }
    if (bias) { const float *p = bias; int n = q_dim + 2 * kv_dim; if (upload_f32(c, &dbias, &p, &n, 1, err)) goto done; }
    if (q_norm) { const float *p = q_norm; int n = hd; if (upload_f32(c, &dqn, &p, &n, 1, err)) goto done; }
    if (k_norm) { const float *p = k_norm; int n = hd; if (upload_f32(c, &dkn, &p, &n, 1, err)) goto done; }
    { const float *p = qkv; int n = T * (q_dim + 2 * kv_dim); if (upload_f32(c, &dqkv, &p, &n, 1, err)) goto done; }
    if (plan_step(c, b, &L, err)) goto done;
    if (cudaDeviceSynchronize() != cudaSuccess) { fail(err, "upload"); goto done; } /* the copies above ran on the default stream */
    {
        const int *di = c->ints_d;
        cudaStream_t st = c->stream;
        if (cudaMemcpyAsync(c->ints_d, c->ints_h, (size_t)L.total * sizeof(int), cudaMemcpyHostToDevice, st) != cudaSuccess) { fail(err, "copy ints"); goto done; }
        prep_args pa = {dqkv, c->q, c->kc, c->vc, dbias, dqn, dkn, c->inv_freq, di + L.off_pos, di + L.off_slots,
                        cf->n_heads, nkv, hd, cf->rope_dim, cf->rope_neox, block_size, cf->rms_eps};
        qkv_prep_kernel<<<T, PREP_WARPS * 32, 0, st>>>(pa);
        attn_args aa = {c->q, c->kc, c->vc, di + L.off_bt, L.bt_stride, di + L.off_pos, (const attn_work *)(di + L.off_work),
                        di + L.off_nparts, di + L.off_partbase, c->att, c->ld_q, c->part_acc, c->part_ml,
                        cf->n_heads, nkv, hd, block_size, c->part_size, 1.4426950408889634f / sqrtf((float)hd)};
        if (launch_attn(c, aa, L.n_work, L.max_rows, err)) goto done;
        if (L.n_part)
            attn_reduce_kernel<<<dim3(T, cf->n_heads), hd < 128 ? hd : 128, 0, st>>>(c->att, c->ld_q, c->part_acc, c->part_ml,
                                                                                   di + L.off_nparts, di + L.off_partbase, cf->n_heads, hd);
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
        if (e != cudaSuccess) { cuda_fail(err, e, "attention kernels", __LINE__); goto done; }
    }
    if (cudaMemcpy(q_out, c->q, (size_t)T * q_dim * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(hatt, c->att, (size_t)T * c->ld_q * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(hk, c->kc, n_cache * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(hv, c->vc, n_cache * 2, cudaMemcpyDeviceToHost) != cudaSuccess) { fail(err, "copy back"); goto done; }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < q_dim; i++) { uint32_t bits = (uint32_t)hatt[(size_t)t * c->ld_q + i] << 16; memcpy(&att_out[(size_t)t * q_dim + i], &bits, 4); }
    for (int blk = 0; blk < num_blocks; blk++)
        for (int s = 0; s < block_size; s++)
            for (int h = 0; h < nkv; h++)
                for (int d = 0; d < hd; d++) {
                    size_t dst = (((size_t)blk * block_size + s) * nkv + h) * hd + d, src = (((size_t)blk * nkv + h) * block_size + s) * hd + d;
                    uint32_t kb = (uint32_t)hk[src] << 16, vb = (uint32_t)hv[src] << 16;
                    memcpy(&k_cache[dst], &kb, 4); memcpy(&v_cache[dst], &vb, 4);
                }
    rc = 0;
done:
    free(hk); free(hv); free(hatt);
    ctx_free(c);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Kernel benchmarks: GEMM TFLOP/s on a 1B model's shapes, attention decode and prefill times. Prints a table.
 * ------------------------------------------------------------------------------------------------------------- */
extern "C" int llm_cuda_bench_kernels(char *err) {
    llm_config cf; memset(&cf, 0, sizeof cf);
    /* llama-3.2-1b's attention shape */
    cf.dim = 2048; cf.n_heads = 32; cf.n_kv_heads = 8; cf.head_dim = 64; cf.rope_dim = 64; cf.rope_base = 500000; cf.rms_eps = 1e-5f;
    cf.ffn_dim = 8192; cf.n_layers = 1; cf.vocab_size = 128256;
    cuda_ctx *c = test_ctx(&cf, err);
    if (!c) return -1;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) { ctx_free(c); return fail(err, "cudaGetDeviceProperties"); }
    printf("\n== kernel benchmarks on %s (%d SMs) ==\n", prop.name, c->sm_count);
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) { ctx_free(c); return fail(err, "cudaEventCreate"); }
    int rc = -1;
    /* GEMM: weights of the largest shape, activations of the largest M, all with random-ish bf16 contents */
    {
        const int Ms[] = {1, 16, 256, 4096};
        struct { const char *name; int N, K; } shapes[] = {
            {"qkv  3072x2048", 3072, 2048}, {"o    2048x2048", 2048, 2048}, {"gate/up 16384x2048", 16384, 2048},
            {"down 2048x8192", 2048, 8192}, {"logits 128256x2048", 128256, 2048}};
        size_t maxw = (size_t)128256 * 2048, maxa = (size_t)4096 * 8192, maxc = (size_t)4096 * 128256;
        bf16 *dw = NULL, *da = NULL; float *dc = NULL;
        if (ctx_alloc(c, (void **)&dw, maxw * 2, err) || ctx_alloc(c, (void **)&da, maxa * 2, err) || ctx_alloc(c, (void **)&dc, maxc * 4, err)) goto done;
        /* a pattern of small values: the bits matter little for timing, but keep them finite */
        if (cudaMemset(dw, 0x3c, maxw * 2) != cudaSuccess || cudaMemset(da, 0x3c, maxa * 2) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) { fail(err, "memset"); goto done; }
        printf("%-22s %8s %10s %10s %10s\n", "GEMM (N x K)", "M", "time us", "TFLOP/s", "GB/s");
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int mi = 0; mi < 4; mi++) {
                int M = Ms[mi];
                dmat W = {dw, shapes[s].N, shapes[s].K, shapes[s].K};
                int reps = M >= 4096 ? 5 : 20;
                if (gemm(c, dc, W.rows, da, W.cols, &W, M, 0, err)) goto done; /* warm-up */
                cudaEventRecord(e0, c->stream);
                for (int r = 0; r < reps; r++) if (gemm(c, dc, W.rows, da, W.cols, &W, M, 0, err)) goto done;
                cudaEventRecord(e1, c->stream);
                if (cudaEventSynchronize(e1) != cudaSuccess) { fail(err, "gemm bench failed"); goto done; }
                float ms = 0; cudaEventElapsedTime(&ms, e0, e1);
                double t = ms / 1e3 / reps, flops = 2.0 * M * W.rows * W.cols, bytes = 2.0 * W.rows * W.cols + 2.0 * M * W.cols + 4.0 * M * W.rows;
                printf("%-22s %8d %10.1f %10.1f %10.0f\n", shapes[s].name, M, t * 1e6, flops / t / 1e12, bytes / t / 1e9);
            }
    }
    /* attention: decode 256 sequences x context, prefill chunks; random block tables over a big pool */
    {
        int bs = 16;
        const int ctxs[] = {256, 1024, 4096};
        int max_blocks_needed = 256 * (4096 / bs) + 64;
        if (ctx_alloc_kv(c, max_blocks_needed, bs, err) || cudaDeviceSynchronize() != cudaSuccess) goto done;
        printf("%-34s %10s %12s\n", "attention (32 q heads, 8 kv, hd 64)", "time us", "KV GB/s");
        for (int mode = 0; mode < 2; mode++)
            for (int ci = 0; ci < 3; ci++) {
                int ctx = ctxs[ci];
                int n_seqs = mode == 0 ? 256 : 4096 / ctx > 0 ? 4096 / ctx : 1;
                if (mode == 1 && ctx < 1024) continue;
                int T = mode == 0 ? n_seqs : n_seqs * ctx; /* prefill: whole contexts of new tokens */
                int32_t *tokens = (int32_t *)calloc((size_t)T, 4), *pos = (int32_t *)malloc((size_t)T * 4), *start = (int32_t *)malloc((size_t)(n_seqs + 1) * 4);
                int32_t *tables = (int32_t *)malloc((size_t)n_seqs * (ctx / bs + 1) * 4);
                const int32_t **bt = (const int32_t **)malloc((size_t)n_seqs * sizeof(int32_t *));
                int t = 0;
                for (int s = 0; s < n_seqs; s++) {
                    start[s] = t;
                    for (int k = 0; k < ctx / bs + 1; k++) tables[(size_t)s * (ctx / bs + 1) + k] = (int)(((size_t)s * 7919 + k * 104729) % (size_t)max_blocks_needed);
                    bt[s] = tables + (size_t)s * (ctx / bs + 1);
                    if (mode == 0) pos[t++] = ctx - 1;
                    else for (int p = 0; p < ctx; p++) pos[t++] = p;
                }
                start[n_seqs] = t;
                llm_batch b = {T, tokens, pos, n_seqs, start, bt, 0, NULL};
                step_layout L;
                int prc = plan_step(c, &b, &L, err);
                if (!prc) prc = cudaMemcpy(c->ints_d, c->ints_h, (size_t)L.total * 4, cudaMemcpyHostToDevice) != cudaSuccess;
                float ms = 0;
                if (!prc) {
                    const int *di = c->ints_d;
                    attn_args aa = {c->q, c->kc, c->vc, di + L.off_bt, L.bt_stride, di + L.off_pos, (const attn_work *)(di + L.off_work),
                                    di + L.off_nparts, di + L.off_partbase, c->att, c->ld_q, c->part_acc, c->part_ml,
                                    cf.n_heads, cf.n_kv_heads, 64, bs, c->part_size, 0.18f};
                    cudaMemsetAsync(c->q, 0, (size_t)T * cf.n_heads * 64 * 4, c->stream);
                    for (int r = 0; r < 6; r++) {
                        if (r == 1) cudaEventRecord(e0, c->stream);
                        if (launch_attn(c, aa, L.n_work, L.max_rows, err)) { prc = -1; break; }
                        if (L.n_part)
                            attn_reduce_kernel<<<dim3(T, cf.n_heads), 64, 0, c->stream>>>(c->att, c->ld_q, c->part_acc, c->part_ml,
                                                                                        di + L.off_nparts, di + L.off_partbase, cf.n_heads, 64);
                    }
                    cudaEventRecord(e1, c->stream);
                    if (cudaEventSynchronize(e1) != cudaSuccess || cudaGetLastError() != cudaSuccess) prc = fail(err, "attention bench failed");
                    cudaEventElapsedTime(&ms, e0, e1);
                    ms /= 5;
                }
                free(tokens); free(pos); free(start); free(tables); free(bt);
                if (prc) goto done;
                double kv_bytes = mode == 0 ? (double)n_seqs * ctx * 8 * 64 * 2 * 2 : (double)n_seqs * ctx * 8 * 64 * 2 * 2;
                char name[64];
                snprintf(name, sizeof name, "%s %d seqs x ctx %d", mode == 0 ? "decode " : "prefill", n_seqs, ctx);
                printf("%-34s %10.1f %12.0f\n", name, ms * 1e3, kv_bytes / (ms / 1e3) / 1e9);
            }
    }
    rc = 0;
done:
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    ctx_free(c);
    return rc;
}
