/* llm.cu - the CUDA backend: the forward pass of llm.h on one NVIDIA GPU, with hand-written kernels.
 *
 * It is an llm_backend (llm.h, section 7): llm_cuda_backend_create uploads the weights and reports the device
 * memory they left; the engine sizes the KV pool from that and calls alloc_kv once; each step is one forward.
 *
 * What lives on the device:
 *   - the weights in the file's format where it is quantized (q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K,
 *     q5_K, q6_K: the blocks copied as they are, rows contiguous as in the file, so a quantized model takes
 *     on the device what its file takes), and converted once at load to bf16 where the file has f32, f16 or
 *     bf16 (rows padded to a multiple of 8 values so that every row starts 16-byte aligned: cp.async, uint4);
 *     Q, K and V are one matrix [q_dim + 2 kv_dim, dim] and gate/up one matrix [2 ffn, dim] (fewer
 *     launches), kept as separate parts when their pieces differ in type (Q4_K_M files do that);
 *     llm_cuda_weight_bytes says how much the matrices take;
 *   - the paged KV cache in bf16 (as many blocks as alloc_kv is given), laid out
 *     [layer][block][kv_head][slot][head_dim]: a block of one head is one contiguous run of
 *     block_size * head_dim values, which is what attention reads. A block holds the layers of one group
 *     (llm_kv_place; [layer] is the place in the group): a model with windows (Gemma 3) has groups of local
 *     layers with block tables of their own, whose blocks go back to the pool as they slide out of the
 *     window, as on the CPU;
 *   - scratch activations for the largest batch seen so far (grown on demand).
 * The residual stream stays f32; activations a matrix product reads are bf16; products accumulate in f32.
 * Quantized weights are read by one function, dequant8 (exact f32, bit for bit llm_dtype_dequant_row's): a
 * product of up to 8 tokens (decode) runs gemv_q_kernel, which dots the exact weights in registers with the
 * activations, reading each block once for all the tokens; more tokens (prefill) run the tensor-core GEMM
 * with a tile loader that dequantizes into its shared-memory bf16 tile (weights rounded to bf16 there, as
 * the bf16 path rounds them at load).
 *
 * One step (llm_batch) on one stream:
 *   the batch's block copies (copy-on-write) -> embed -> per layer [rmsnorm -> QKV GEMM ->
 *   bias/qk-norm/RoPE + write K,V to the cache -> paged attention, over a local layer's window only (->
 *   log-sum-exp reduce of partitions) -> O GEMM (+= residual; Gemma 3: normalised first) -> rmsnorm ->
 *   gate/up GEMM -> SwiGLU (Gemma: GeGLU) -> down GEMM (+= residual, as O)] -> final norm of the logit rows
 *   only -> logits GEMM -> copy to the host. RoPE's frequencies are the file's, scaled as it says
 *   (llm_rope_freqs), local layers' with their own base; SmolLM3's layers without RoPE skip it.
 * Pure-decode steps of the same shape are captured once as a CUDA graph and replayed (launch overhead); the
 * block copies are enqueued before the graph, not captured in it.
 *
 * At the end, llm_cuda_run_gemm and llm_cuda_run_attention run the GEMM and one layer's attention alone, on
 * host arrays, for test.c's GPU checks and kernel benchmarks.
 *
 * Every CUDA call is checked: a failure becomes a message in the caller's err buffer and a -1 / NULL
 * return. */
#include "llm.h"
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

/* -----------------------------------------------------------------------------------------------------------
 * Errors: CK() turns a failed CUDA call into a message in `err` and makes the enclosing function return -1.
 * -------------------------------------------------------------------------------------------------------- */
static int cuda_fail(char *err, cudaError_t e, const char *what, int line) {
    if (err)
        snprintf(err, LLM_ERR_LEN, "CUDA error at llm.cu:%d (%s): %s", line, what, cudaGetErrorString(e));
    return -1;
}
#define CK(call) do { cudaError_t ck_e_ = (call); \
    if (ck_e_ != cudaSuccess) return cuda_fail(err, ck_e_, #call, __LINE__); } while (0)
/* after a kernel launch: launch errors (bad configuration) show up here, execution errors at the next sync */
#define CK_LAUNCH() CK(cudaGetLastError())

static int fail(char *err, const char *msg) { if (err) snprintf(err, LLM_ERR_LEN, "%s", msg); return -1; }

__host__ __device__ static inline int round_up(int x, int m) { return (x + m - 1) / m * m; }
__host__ __device__ static inline int cdiv(int a, int b) { return (a + b - 1) / b; }

/* -----------------------------------------------------------------------------------------------------------
 * Host-side conversion to and from bf16 (weights once, at load: llm_dtype_dequant_row reads the file's types)
 * -------------------------------------------------------------------------------------------------------- */
static uint16_t host_f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t x; memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}
static float host_bf16_to_f32(uint16_t h) { /* exact */
    uint32_t x = (uint32_t)h << 16;
    float f; memcpy(&f, &x, 4);
    return f;
}

/* -----------------------------------------------------------------------------------------------------------
 * Small kernels: embedding, RMSnorm, QKV preparation (bias, q/k norm, RoPE, cache write), SwiGLU
 * -------------------------------------------------------------------------------------------------------- */
/* sum and max over a warp by butterfly shuffles; every lane gets the result */
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

/* 1 / sqrt(mean(xr[0..D)^2) + eps), over the block (every thread gets it): an RMS norm's scale */
__device__ float block_rms_scale(const float *xr, int D, float eps) {
    float ss = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    return rsqrtf(block_sum(ss) / D + eps);
}

/* x[t][:] = embedding row tokens[t] (bf16, row stride ld) as f32, times scale (Gemma: sqrt(dim); else 1) */
__global__ void embed_kernel(float *x, const bf16 *emb, int ld, const int *tokens, int D, float scale) {
    int t = blockIdx.x;
    const bf16 *row = emb + (size_t)tokens[t] * ld;
    for (int i = threadIdx.x; i < D; i += blockDim.x) x[(size_t)t * D + i] = __bfloat162float(row[i]) * scale;
}

/* out[r][:] = rmsnorm(x[rows ? rows[r] : r][:]) * w, as bf16 with row stride ldo; the padding columns
 * [D, ldo) are written as zeros because the next GEMM reads them (against zero weights, but NaN * 0 =
 * NaN). */
__global__ void rmsnorm_kernel(bf16 *out, int ldo, const float *x, const int *rows, const float *w, int D,
                               float eps) {
    int r = blockIdx.x, src = rows ? rows[r] : r;
    const float *xr = x + (size_t)src * D;
    float scale = block_rms_scale(xr, D, eps);
    for (int i = threadIdx.x; i < ldo; i += blockDim.x)
        out[(size_t)r * ldo + i] = __float2bfloat16(i < D ? xr[i] * scale * w[i] : 0.0f);
}

/* x[r][:] += rmsnorm(delta[r][:]) * w: Gemma 3 normalises each block's output before the residual add */
__global__ void rmsnorm_add_kernel(float *x, const float *delta, const float *w, int D, float eps) {
    int r = blockIdx.x;
    const float *dr = delta + (size_t)r * D;
    float scale = block_rms_scale(dr, D, eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) x[(size_t)r * D + i] += dr[i] * scale * w[i];
}

/* The greedy pick of each row of logits, made where the logits are, so that 4 bytes a row cross to the host
 * and not the vocabulary's row (the sample step's rows that want their argmax alone). One block a row: each
 * thread keeps the best value of its stride and its first index, then the block merges them, the lower index
 * winning a tie, as llm_argmax does. A value that is not finite makes the row's pick -1, as
 * llm_argmax_finite. */
__device__ void argmax_merge(float &best, int &at, float b, int a) {
    if (b > best || (b == best && a < at)) { best = b; at = a; }
}
__global__ void argmax_kernel(int *out, const float *logits, int V) {
    const float *row = logits + (size_t)blockIdx.x * V;
    float best = -INFINITY;
    int at = V, bad = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = row[i];
        if (!isfinite(v)) bad = 1;
        else if (v > best || at == V) { best = v; at = i; }
    }
    for (int o = 16; o > 0; o >>= 1)
        argmax_merge(best, at, __shfl_down_sync(0xffffffffu, best, o), __shfl_down_sync(0xffffffffu, at, o));
    bad = __syncthreads_or(bad);
    __shared__ float wbest[32];
    __shared__ int wat[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) { wbest[warp] = best; wat[warp] = at; }
    __syncthreads();
    if (warp) return;
    best = lane < nw ? wbest[lane] : -INFINITY; at = lane < nw ? wat[lane] : V;
    for (int o = 16; o > 0; o >>= 1)
        argmax_merge(best, at, __shfl_down_sync(0xffffffffu, best, o), __shfl_down_sync(0xffffffffu, at, o));
    if (lane == 0) out[blockIdx.x] = bad ? -1 : at;
}

/* act[t][i] = silu(gu[t][i]) * gu[t][F + i] (gate and up came out of one GEMM side by side), bf16, row stride
 * lda; the padding columns [F, lda) get zeros, as in rmsnorm_kernel. gelu: GELU's tanh form instead of SiLU
 * (Gemma's GeGLU), as llm_gelu computes it: 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)) */
__global__ void swiglu_kernel(bf16 *act, int lda, const float *gu, int F, int gelu, int T) {
    for (int t = blockIdx.y; t < T; t += gridDim.y) /* rows past the grid's 65535 (a step's expert rows) */
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < lda; i += gridDim.x * blockDim.x) {
            float v = 0.0f;
            if (i < F) {
                float g = gu[(size_t)t * 2 * F + i], u = gu[(size_t)t * 2 * F + F + i];
                v = gelu ? g / (1.0f + __expf(-2.0f * (0.7978845608f * (g + 0.044715f * g * g * g)))) * u
                         : g / (1.0f + __expf(-g)) * u;
            }
            act[(size_t)t * lda + i] = __float2bfloat16(v);
        }
}

/* Mixture of experts: the normalised rows of the step's tokens gathered by expert (dst row r is src row
 * rows[r]: bf16, row stride ld, padding included), and the experts' outputs added back to each token's
 * residual row, weighted, in the order its router chose them: x[t] += sum_k weight[t][k] y[row_of[t][k]] */
__global__ void gather_rows_kernel(bf16 *dst, const bf16 *src, int ld, const int *rows) {
    int r = blockIdx.x;
    for (int i = threadIdx.x; i < ld; i += blockDim.x)
        dst[(size_t)r * ld + i] = src[(size_t)rows[r] * ld + i];
}
__global__ void moe_combine_kernel(float *x, const float *y, const int *row_of, const float *weight, int K,
                                   int D) {
    int t = blockIdx.x;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float s = 0;
        for (int k = 0; k < K; k++) s += weight[t * K + k] * y[(size_t)row_of[t * K + k] * D + d];
        x[(size_t)t * D + d] += s;
    }
}

/* qwen2moe's shared expert, added to each token's residual row: x[t] += sigmoid(gate_inp . xn[t]) y[t] (one
 * block per token: the gate's dot product, reduced over the block, then the row) */
__global__ void shared_expert_add_kernel(float *x, const float *y, const bf16 *xn, int ld,
                                         const float *gate_inp, int D) {
    int t = blockIdx.x;
    float s = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        s += gate_inp[d] * __bfloat162float(xn[(size_t)t * ld + d]);
    float gate = 1.0f / (1.0f + expf(-block_sum(s)));
    for (int d = threadIdx.x; d < D; d += blockDim.x) x[(size_t)t * D + d] += gate * y[(size_t)t * D + d];
}

/* gpt-oss's experts: act = min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7, 7) + 1) on gate and up with the
 * biases of each row's expert (row_expert[t]; gu in swiglu_kernel's layout), all the step's rows at once */
__global__ void oss_act_kernel(bf16 *act, int lda, const float *gu, int F, const float *bg, const float *bu,
                               const int *row_expert, int rows) {
    for (int t = blockIdx.y; t < rows; t += gridDim.y)
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < lda; i += gridDim.x * blockDim.x) {
            float v = 0.0f;
            if (i < F) {
                size_t e = (size_t)row_expert[t] * F;
                float g = fminf(gu[(size_t)t * 2 * F + i] + bg[e + i], 7.0f);
                float u = fminf(fmaxf(gu[(size_t)t * 2 * F + F + i] + bu[e + i], -7.0f), 7.0f);
                v = g / (1.0f + __expf(-1.702f * g)) * (u + 1.0f);
            }
            act[(size_t)t * lda + i] = __float2bfloat16(v);
        }
}
/* x[r][:] += b, a bias on each of a matrix's output rows (gpt-oss's attention output), or with which the
 * bias row which[r] of b (gpt-oss's experts: each row its expert's) */
__global__ void add_bias_kernel(float *x, const float *b, const int *which, int D) {
    const float *br = b + (which ? (size_t)which[blockIdx.x] * D : 0);
    for (int i = threadIdx.x; i < D; i += blockDim.x) x[(size_t)blockIdx.x * D + i] += br[i];
}

/* Per token (one block of 4 warps): add the QKV bias, RMS-normalise each q and k head (qwen3), rotate the
 * first rope_dim values of each q and k head by the token's position (pair i by position * inv_freq[i], cos
 * and sin times mscale: llm_rope_freqs; rope_dim 0: a layer without RoPE), write q (f32) for attention, and
 * write k and v (bf16) into the paged cache at the token's slot. One warp per head; the head goes through
 * shared memory because RoPE pairs a value with a partner that another lane holds. */
#define PREP_WARPS 4
#define MAX_HEAD_DIM 256
struct prep_args {
    const float *qkv; float *q; bf16 *kc, *vc;        /* kc, vc: this layer's part of the cache */
    const float *bias, *q_norm, *k_norm, *inv_freq;   /* bias [q_dim + 2 kv_dim]; bias, norms NULL: absent */
    const int *positions, *slots;                     /* slot = block * block_size + offset */
    int n_heads, n_kv_heads, hd, rope_dim, neox, block_size;
    float eps, mscale;
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
                a.vc[(((size_t)blk * a.n_kv_heads + kvh) * a.block_size + off) * hd + d] =
                    __float2bfloat16(v);
                continue;
            }
            if (d < a.rope_dim) {
                int half = a.rope_dim / 2, i, partner; float sign;
                if (a.neox) {
                    i = d < half ? d : d - half; partner = d < half ? d + half : d - half;
                    sign = d < half ? -1.0f : 1.0f;
                }
                else { i = d / 2; partner = d ^ 1; sign = (d & 1) ? 1.0f : -1.0f; }
                float pv = hb[partner] * scale * (nw ? nw[partner] : 1.0f), sn, cs;
                sincosf((float)pos * a.inv_freq[i], &sn, &cs);
                sn *= a.mscale; cs *= a.mscale;
                /* x0' = x0 cos - x1 sin (first of the pair), x1' = x0 sin + x1 cos (second) */
                v = v * cs + sign * pv * sn;
            }
            if (is_q) a.q[(size_t)t * q_dim + base + d] = v;
            else {
                int kvh = h - a.n_heads;
                a.kc[(((size_t)blk * a.n_kv_heads + kvh) * a.block_size + off) * hd + d] =
                    __float2bfloat16(v);
            }
        }
        __syncwarp(); /* hb is reused by this warp's next head */
    }
}

/* -----------------------------------------------------------------------------------------------------------
 * GEMM on the tensor cores: C[M][N] (=|+=) A[M][K] * B[N][K]^T, A and B bf16 (K contiguous, rows 16-byte
 * aligned: lda, ldb multiples of 8, K a multiple of 8 with zero padding beyond the real K), C f32.
 * Tiles BM x BN x BK go global -> shared memory with cp.async in a STAGES-deep pipeline, shared -> registers
 * with ldmatrix, and through mma.sync m16n8k16 (bf16 in, f32 accumulate). Rows of shared memory are BK + 8
 * values apart (80 or 144 bytes), so the 8 rows an ldmatrix phase reads fall in 8 different bank groups.
 * Split-K (gridDim.z > 1) adds partial products with atomicAdd when the tiles alone would leave SMs idle
 * (decode: M is tiny, the work is reading the weights, and every SM should be reading).
 * -------------------------------------------------------------------------------------------------------- */

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0; /* 0 source bytes: the 16 bytes are zero-filled */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const void *smem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* -----------------------------------------------------------------------------------------------------------
 * Quantized weights on the device: the file's blocks as they are (llm.h section 1 documents every layout).
 * dequant8<T> is the one place that reads them: values i0 .. i0+7 of a block as f32. The decode GEMV, the
 * GEMM's tile loader, the embedding lookup and the tests' dequantization all call it, so the check of one
 * checks the reading of all.
 * -------------------------------------------------------------------------------------------------------- */
/* every quantized type, for the switches that pick a kernel's instantiation */
#define QUANT_TYPES(X) X(LLM_Q4_0) X(LLM_Q4_1) X(LLM_Q5_0) X(LLM_Q5_1) X(LLM_Q8_0) \
                       X(LLM_Q2_K) X(LLM_Q3_K) X(LLM_Q4_K) X(LLM_Q5_K) X(LLM_Q6_K)

__host__ __device__ constexpr int is_quant(int t) {
    return t == LLM_Q4_0 || t == LLM_Q4_1 || t == LLM_Q5_0 || t == LLM_Q5_1 || t == LLM_Q8_0 ||
           (t >= LLM_Q2_K && t <= LLM_Q6_K);
}
__host__ __device__ constexpr int q_block_values(int t) { return t >= LLM_Q2_K && t <= LLM_Q6_K ? 256 : 32; }
__host__ __device__ constexpr int q_block_bytes(int t) {
    return t == LLM_Q4_0 ? 18 : t == LLM_Q4_1 ? 20 : t == LLM_Q5_0 ? 22 : t == LLM_Q5_1 ? 24 :
           t == LLM_Q8_0 ? 34 : t == LLM_Q2_K ? 84 : t == LLM_Q3_K ? 110 : t == LLM_Q4_K ? 144 :
           t == LLM_Q5_K ? 176 : t == LLM_Q6_K ? 210 : 0;
}

/* a little-endian f16 at any byte address (blocks are 18, 22, 110, ... bytes: nothing is aligned) */
__device__ __forceinline__ float f16_at(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | p[1] << 8)));
}

/* Values i0 .. i0+7 (i0 a multiple of 8) of the block at p, exactly as llm_dtype_dequant_row computes them:
 * (d * scale) * q - dmin * min with every product and the difference rounded on its own (__fmul_rn and
 * __fsub_rn: nvcc would otherwise fuse them into an FMA), so the values are the CPU reference's bit for bit.
 * Eight consecutive values always lie in one sub-block (16 or 32 values), so they share one scale and one
 * min. The bytes are read one at a time: no block layout is aligned beyond a byte. */
template <int T> __device__ __forceinline__ void dequant8(const uint8_t *p, int i0, float v[8]) {
    static_assert(is_quant(T), "dequant8: not a quantized type");
    float d, dmin = 0.0f;
    int scale = 1, mn = 0, offset = 0, u[8];
    const int half = i0 / 128, k0 = i0 % 128; /* k-quants: the half of 128 values, and the place in it */
    if constexpr (T == LLM_Q8_0) {
        d = f16_at(p);
#pragma unroll
        for (int j = 0; j < 8; j++) u[j] = (int8_t)p[2 + i0 + j];
    } else if constexpr (T == LLM_Q4_0 || T == LLM_Q4_1) {
        const uint8_t *q = p + (T == LLM_Q4_0 ? 2 : 4);
        d = f16_at(p);
        if constexpr (T == LLM_Q4_1) { dmin = f16_at(p + 2); mn = -1; } else offset = 8; /* q * d + m */
#pragma unroll
        for (int j = 0; j < 8; j++) { int i = i0 + j; u[j] = q[i % 16] >> (4 * (i / 16)) & 15; }
    } else if constexpr (T == LLM_Q5_0 || T == LLM_Q5_1) {
        const uint8_t *q = p + (T == LLM_Q5_0 ? 2 : 4); /* the 32 fifth bits, then the nibbles */
        d = f16_at(p);
        if constexpr (T == LLM_Q5_1) { dmin = f16_at(p + 2); mn = -1; } else offset = 16;
        uint32_t qh = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int i = i0 + j;
            u[j] = (q[4 + i % 16] >> (4 * (i / 16)) & 15) | (int)(qh >> i & 1) << 4;
        }
    } else if constexpr (T == LLM_Q2_K) {
        int s = i0 / 16;
        d = f16_at(p + 80); dmin = f16_at(p + 82); scale = p[s] & 15; mn = p[s] >> 4;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int k = k0 + j;
            u[j] = p[16 + half * 32 + k % 32] >> (2 * (k / 32)) & 3;
        }
    } else if constexpr (T == LLM_Q3_K) {
        /* 16 6-bit scales: low 4 bits in bytes 96-103 (two each), high 2 bits in bytes 104-107 */
        int s = i0 / 16;
        const uint8_t *sc = p + 96;
        d = f16_at(p + 108); offset = 4;
        int low = (s < 8 ? sc[s] : sc[s - 8] >> 4) & 15, high = sc[8 + s % 4] >> (2 * (s / 4)) & 3;
        scale = (low | high << 4) - 32;
#pragma unroll
        for (int j = 0; j < 8; j++) { /* 2 low bits, and a high bit in bit i / 32 of byte i % 32 */
            int i = i0 + j, k = k0 + j;
            u[j] = (p[32 + half * 32 + k % 32] >> (2 * (k / 32)) & 3) | (p[i % 32] >> (i / 32) & 1) << 2;
        }
    } else if constexpr (T == LLM_Q4_K || T == LLM_Q5_K) {
        /* 8 6-bit scales and mins in bytes 4-15: the last four split over the first eight's spare bits */
        int s = i0 / 32;
        const uint8_t *sc = p + 4, *qs = p + (T == LLM_Q4_K ? 16 : 48);
        d = f16_at(p); dmin = f16_at(p + 2);
        if (s < 4) { scale = sc[s] & 63; mn = sc[s + 4] & 63; }
        else {
            scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
            mn = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int i = i0 + j;
            u[j] = qs[i / 64 * 32 + i % 32] >> (4 * (i / 32 % 2)) & 15;
            if constexpr (T == LLM_Q5_K) u[j] |= (p[16 + i % 32] >> (i / 32) & 1) << 4;
        }
    } else { /* LLM_Q6_K: low nibbles across 64 bytes per half, 2-bit high parts across 32, int8 scales */
        int s = i0 / 16;
        d = f16_at(p + 208); scale = (int8_t)p[192 + s]; offset = 32;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int k = k0 + j;
            u[j] = (p[half * 64 + k % 64] >> (4 * (k / 64)) & 15) |
                   (p[128 + half * 32 + k % 32] >> (2 * (k / 32)) & 3) << 4;
        }
    }
    float ds = __fmul_rn(d, (float)scale), dm = __fmul_rn(dmin, (float)mn);
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = __fsub_rn(__fmul_rn(ds, (float)(u[j] - offset)), dm);
}

/* values k .. k+7 (k a multiple of 8) of a row of blocks */
template <int T> __device__ __forceinline__ void dequant8_row(const uint8_t *row, int k, float v[8]) {
    dequant8<T>(row + (size_t)(k / q_block_values(T)) * q_block_bytes(T), k % q_block_values(T), v);
}

/* Decode GEMV on quantized weights: C[m][n] (=|+=) sum_k A[m][k] W[n][k] for the few tokens of a decode step
 * (M <= GEMV_MAX_M). The cost is reading W, so W is read once for all M tokens: each warp owns one row of W
 * and walks it in units of 8 values, lane l taking units l, l + 32, ... (neighbouring lanes read neighbouring
 * bytes, so a warp's loads stay within a few cache lines; lanes that share a byte, as q4's low and high
 * nibbles, meet in L1, not DRAM). A lane dequantizes its unit into registers (dequant8: exact f32) and dots
 * it with the same 8 activations of every token (bf16, one 16-byte load each), accumulating in f32; a
 * shuffle reduction over the warp gives the row's M outputs, which lane 0 writes. No shared memory, no
 * conversion of W anywhere. */
#define GEMV_MAX_M 8
#define GEMV_WARPS 4
struct gemv_args {
    const bf16 *A; int lda;                 /* [M][lda] bf16, lda a multiple of 8 (16-byte rows) */
    const uint8_t *W; size_t row_bytes;     /* N rows of K values in blocks */
    float *C; int ldc;
    int M, N, K, accumulate;
};
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_q_kernel(gemv_args g) {
    int lane = threadIdx.x & 31, n = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (n >= g.N) return; /* the whole warp: n is the same for its 32 lanes */
    const uint8_t *row = g.W + (size_t)n * g.row_bytes;
    float acc[GEMV_MAX_M];
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++) acc[m] = 0.0f;
    for (int k = lane * 8; k < g.K; k += 32 * 8) {
        float w[8];
        dequant8_row<T>(row, k, w);
#pragma unroll
        for (int m = 0; m < GEMV_MAX_M; m++) {
            if (m >= g.M) break;
            uint4 raw = *(const uint4 *)(g.A + (size_t)m * g.lda + k);
            const __nv_bfloat162 *a2 = (const __nv_bfloat162 *)&raw;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 a = __bfloat1622float2(a2[j]);
                s += a.x * w[2 * j] + a.y * w[2 * j + 1];
            }
            acc[m] += s;
        }
    }
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; m++) {
        if (m >= g.M) break; /* g.M is the same for every lane: the shuffles below see all 32 */
        float s = warp_sum(acc[m]);
        if (lane == 0) {
            float *c = g.C + (size_t)m * g.ldc + n;
            *c = g.accumulate ? *c + s : s;
        }
    }
}

/* x[t][:] = embedding row tokens[t] of a quantized matrix, as f32 (exact, as the CPU's lookup), times
 * scale */
template <int T>
__global__ void embed_q_kernel(float *x, const uint8_t *emb, size_t row_bytes, const int *tokens, int D,
                               float scale) {
    int t = blockIdx.x;
    const uint8_t *row = emb + (size_t)tokens[t] * row_bytes;
    for (int k = threadIdx.x * 8; k < D; k += blockDim.x * 8) {
        float v[8];
        dequant8_row<T>(row, k, v);
#pragma unroll
        for (int j = 0; j < 8; j++) x[(size_t)t * D + k + j] = v[j] * scale;
    }
}

/* out[n][:] = row n of a quantized matrix as f32: for the tests, which compare it bit for bit with the CPU */
template <int T>
__global__ void dequant_rows_kernel(float *out, const uint8_t *w, size_t row_bytes, int K) {
    int n = blockIdx.x;
    for (int k = threadIdx.x * 8; k < K; k += blockDim.x * 8) {
        float v[8];
        dequant8_row<T>(w + (size_t)n * row_bytes, k, v);
#pragma unroll
        for (int j = 0; j < 8; j++) out[(size_t)n * K + k + j] = v[j];
    }
}

struct gemm_args {
    const bf16 *A; const bf16 *B; float *C;
    const uint8_t *Bq; size_t ldb_bytes; /* QT quantized: B as the file's blocks, ldb_bytes per row */
    int lda, ldb, ldc, M, N, K;
    int accumulate;     /* C += A B^T instead of C = A B^T */
    int k_tiles_split;  /* BK-tiles of K per gridDim.z slice */
    int atomic;         /* split-K: add with atomicAdd (C zeroed first unless accumulating) */
};

/* QT: LLM_BF16 for a bf16 B, or a quantized type: B stays in its blocks in global memory and the tile loader
 * dequantizes each 8-value piece (dequant8, exact f32) and rounds it to bf16 into the shared-memory tile,
 * the same tile the bf16 path fills with cp.async. Those stores are plain synchronous ones; the pipeline
 * keeps them right because a stage is only refilled after the __syncthreads that ends its last reading, and
 * only read after the __syncthreads of the iteration that consumes it. */
template <int BM, int BN, int WARPS_M, int WARPS_N, int BK, int STAGES, int QT>
__global__ void __launch_bounds__(WARPS_M *WARPS_N * 32) gemm_kernel(gemm_args g) {
    static_assert(QT == LLM_BF16 || is_quant(QT), "gemm_kernel: B is bf16 or quantized");
    static_assert(BK % 16 == 0 && STAGES >= 2, "gemm_kernel: BK a multiple of 16, two stages at least");
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int SROW = BK + 8, CPR = BK / 8;            /* a shared row's values; its 16-byte chunks */
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N; /* one warp's tile */
    constexpr int MT = WTM / 16, NT = WTN / 8;            /* mma tiles per warp */
    static_assert(MT >= 1 && NT >= 2 && NT % 2 == 0, "warp tile must be 16 x 16 at least");
    extern __shared__ __align__(16) unsigned char gemm_smem[];
    bf16 *As = (bf16 *)gemm_smem;                          /* [STAGES][BM][SROW] */
    bf16 *Bs = As + STAGES * BM * SROW;                    /* [STAGES][BN][SROW] */

    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int wm = warp / WARPS_N, wn = warp % WARPS_N;
    int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    int k_tiles = cdiv(g.K, BK);
    int kt_begin = blockIdx.z * g.k_tiles_split;
    int kt_end = min(k_tiles, kt_begin + g.k_tiles_split);
    int n_kt = kt_end - kt_begin;
    if (n_kt <= 0) return;

    /* each tile row is CPR chunks of 16 bytes; out-of-range rows and K chunks are zero-filled */
    auto load_stage = [&](int stage, int kt) {
        int k0 = kt * BK;
        bf16 *as = As + stage * BM * SROW, *bs = Bs + stage * BN * SROW;
        for (int c = tid; c < BM * CPR; c += THREADS) {
            int r = c / CPR, kc = (c % CPR) * 8, gr = m0 + r, gk = k0 + kc;
            bool ok = gr < g.M && gk < g.K;
            cp_async16(as + r * SROW + kc, g.A + (ok ? (size_t)gr * g.lda + gk : 0), ok);
        }
        for (int c = tid; c < BN * CPR; c += THREADS) {
            int r = c / CPR, kc = (c % CPR) * 8, gr = n0 + r, gk = k0 + kc;
            bool ok = gr < g.N && gk < g.K;
            if constexpr (QT == LLM_BF16) {
                cp_async16(bs + r * SROW + kc, g.B + (ok ? (size_t)gr * g.ldb + gk : 0), ok);
            } else {
                uint4 packed = make_uint4(0, 0, 0, 0); /* zeros beyond N and K, as cp.async's fill */
                if (ok) {
                    float v[8];
                    dequant8_row<QT>(g.Bq + (size_t)gr * g.ldb_bytes, gk, v);
                    __nv_bfloat162 *h = (__nv_bfloat162 *)&packed;
#pragma unroll
                    for (int j = 0; j < 4; j++) h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
                }
                *(uint4 *)(bs + r * SROW + kc) = packed;
            }
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
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < n_kt) load_stage(s, kt_begin + s);
        cp_async_commit(); /* an empty group keeps the wait counts uniform */
    }
    for (int i = 0; i < n_kt; i++) {
        cp_async_wait<STAGES - 2>(); /* tile i has landed (for this thread's copies) ... */
        __syncthreads();                  /* ... and everyone's; and everyone is done with tile i-1's stage */
        int next = i + STAGES - 1;
        if (next < n_kt) load_stage(next % STAGES, kt_begin + next);
        cp_async_commit();

        const bf16 *as = As + (i % STAGES) * BM * SROW, *bs = Bs + (i % STAGES) * BN * SROW;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned af[MT][4], bfr[NT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) /* lanes 0-15: rows 0-15 at k, lanes 16-31: rows 0-15 at k+8 */
                ldmatrix_x4(af[mt],
                            as + (wm * WTM + mt * 16 + (lane & 15)) * SROW + kk + (lane >> 4) * 8);
            /* two n8 tiles at a time: matrices (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7) (n8-15,k8-15) */
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
                unsigned r[4];
                ldmatrix_x4(r, bs + (wn * WTN + nt * 8 + (lane & 7) + (lane >> 4) * 8) * SROW + kk +
                                   ((lane >> 3) & 1) * 8);
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

/* -----------------------------------------------------------------------------------------------------------
 * Paged attention. One block (4 warps) takes one kv head and a tile of consecutive query tokens of one
 * sequence (all the query heads of that kv head: the GQA group, so K/V are read once for the group), over one
 * partition of the context. K and V come 32 positions at a time from the paged cache into shared memory (as
 * bf16); each warp owns up to 8 query rows and keeps their online-softmax state (max, sum, output) in
 * registers: lane j scores position j of the tile, then every lane adds the tile's values into its output
 * dims.
 * A context longer than the partition size is split over several blocks (vLLM's PagedAttention v2); each
 * writes its unnormalised output with its max and sum, and attn_reduce combines them by log-sum-exp. A short
 * context is one partition and writes the final output directly (v1). Prefill and decode are the same kernel:
 * a decode tile is one token.
 * Scores are kept in base 2 (q is pre-scaled by log2(e) / sqrt(head_dim)) so the exponentials are exp2f.
 * -------------------------------------------------------------------------------------------------------- */
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
    int window;                                   /* a local layer's: the last window positions (0: all) */
    const float *sinks;                           /* gpt-oss: a logit per head in the softmax's sum (else
                                                   * NULL) */
    float scale_log2;
};

/* ROWS: query rows per warp, a compile-time constant so that the per-row state stays in registers and no row
 * loop carries a run-time guard; the host picks the smallest that covers the step (decode: the GQA group /
 * 4). HD: the head dimension when compiled for it (64, 128: the loops over a row unrolled, each lane's
 * output dims exactly its own), or 0 for any head_dim up to MAX_HEAD_DIM (a lane loops over MAX_HEAD_DIM / 32
 * dims, guarded: for head_dim 64 three quarters of that work is masked off). */
template <int ROWS, int HD>
__global__ void __launch_bounds__(ATT_WARPS * 32) attn_kernel(attn_args a) {
    extern __shared__ __align__(16) float att_smem[];
    constexpr int DMAX = HD ? HD : MAX_HEAD_DIM;   /* a lane's output dims: DMAX / 32 of them */
    const int hd = HD ? HD : a.hd, G = a.n_heads / a.n_kv_heads, kv_stride = hd + 8;
    float *qs = att_smem;                          /* [ROWS * ATT_WARPS][hd]: this block's query rows */
    /* K and V tiles as they are in the cache (bf16), two of each: the next tile is in flight (cp.async) while
     * this one is used. Rows are padded by 16 bytes so that lanes reading 16 bytes of consecutive rows hit
     * different banks. */
    bf16 *kvs = (bf16 *)(qs + ROWS * ATT_WARPS * hd); /* [2][K, V][ATT_KT][hd + 8] */
    __shared__ int qpos[ATT_MAX_ROWS];

    attn_work w = a.work[blockIdx.x];
    int kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n_rows = w.ntok * G;                       /* row r: token tok0 + r / G, head kvh * G + r % G */
    const int *bt = a.block_tables + (size_t)w.seq * a.bt_stride;
    int last_pos = 0, first_pos = INT_MAX;
    for (int t = 0; t < w.ntok; t++) {
        last_pos = max(last_pos, a.positions[w.tok0 + t]);
        first_pos = min(first_pos, a.positions[w.tok0 + t]);
    }
    int kv_begin = w.part * a.part_size, kv_end = min(kv_begin + a.part_size, last_pos + 1);
    /* a local layer starts at the window of the tile's first token: the blocks before it may be gone (-1 in
     * the block table, read as block 0 by plan_step) and are never read */
    if (a.window > 0) kv_begin = max(kv_begin, first_pos - a.window + 1);
    int chunks = hd / 8; /* 16-byte pieces of one cached row */

    auto load_tile = [&](int buf, int k0) {
        bf16 *kt = kvs + (size_t)buf * 2 * ATT_KT * kv_stride, *vt = kt + ATT_KT * kv_stride;
        for (int i = tid; i < ATT_KT * chunks; i += blockDim.x) {
            int j = i / chunks, c = i % chunks, p = k0 + j;
            bool ok = p < kv_end; /* beyond: zero-filled, so a masked score never meets a NaN */
            size_t off = ok ? (((size_t)bt[p / a.block_size] * a.n_kv_heads + kvh) * a.block_size +
                               p % a.block_size) * hd + c * 8
                            : 0;
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

    float m[ROWS], l[ROWS], acc[ROWS][DMAX / 32];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -INFINITY; l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < DMAX / 32; i++) acc[r][i] = 0.0f;
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
            float2 k01 = __bfloat1622float2(k2[0]), k23 = __bfloat1622float2(k2[1]),
                   k45 = __bfloat1622float2(k2[2]), k67 = __bfloat1622float2(k2[3]);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                int row = warp + r * ATT_WARPS;
                if (row < n_rows) {
                    float4 qa = *(const float4 *)&qs[row * hd + d],
                           qb = *(const float4 *)&qs[row * hd + d + 4];
                    s[r] += qa.x * k01.x + qa.y * k01.y + qa.z * k23.x + qa.w * k23.y +
                            qb.x * k45.x + qb.y * k45.y + qb.z * k67.x + qb.w * k67.y;
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
            /* causal, inside the partition, and inside a local layer's window */
            bool seen = key < kv_end && key <= qpos[row] && (a.window == 0 || key > qpos[row] - a.window);
            float sc = seen ? s[r] : -INFINITY;
            float m_new = fmaxf(m[r], warp_max(sc));
            if (m_new == -INFINITY) continue; /* nothing visible yet for this row */
            float corr = exp2f(m[r] - m_new); /* exp2(-inf) = 0 on the first visible tile */
            p[r] = exp2f(sc - m_new);
            l[r] = l[r] * corr + warp_sum(p[r]);
            m[r] = m_new;
#pragma unroll
            for (int i = 0; i < DMAX / 32; i++) acc[r][i] *= corr;
        }
        /* out += p V: each V value read once from shared memory for all the warp's rows */
        for (int j = 0; j < ATT_KT; j++) {
            float pj[ROWS]; /* shuffled before the per-lane bounds check: every lane must take part */
#pragma unroll
            for (int r = 0; r < ROWS; r++) pj[r] = __shfl_sync(0xffffffffu, p[r], j);
#pragma unroll
            for (int i = 0; i < DMAX / 32; i++) {
                int d = lane + 32 * i;
                if (HD || d < hd) {
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
            /* a sink (natural log units, as the scores before their log2(e) scaling) adds to the sum only */
            float lt = l[r] + (a.sinks ? exp2f(a.sinks[h] * 1.4426950408889634f - m[r]) : 0.0f);
            float inv = lt > 0 ? 1.0f / lt : 0.0f;
#pragma unroll
            for (int i = 0; i < DMAX / 32; i++) {
                int d = lane + 32 * i;
                if (HD || d < hd) a.out[(size_t)t * a.ldo + h * hd + d] = __float2bfloat16(acc[r][i] * inv);
            }
        } else {
            size_t prow = (size_t)(a.tok_partbase[t] + w.part) * a.n_heads + h;
#pragma unroll
            for (int i = 0; i < DMAX / 32; i++) {
                int d = lane + 32 * i;
                if (HD || d < hd) a.part_acc[prow * hd + d] = acc[r][i];
            }
            if (lane == 0) { a.part_ml[prow * 2] = m[r]; a.part_ml[prow * 2 + 1] = l[r]; }
        }
    }
}

/* Combine the partitions of tokens whose context was split:
 * out = sum_p 2^(m_p - M) acc_p / sum_p 2^(m_p - M) l_p, with M the largest m_p */
__global__ void attn_reduce_kernel(bf16 *out, int ldo, const float *part_acc, const float *part_ml,
                                   const int *tok_nparts, const int *tok_partbase, int n_heads, int hd,
                                   const float *sinks) {
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
    if (sinks) L += exp2f(sinks[h] * 1.4426950408889634f - M); /* as attn_kernel's */
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

/* -----------------------------------------------------------------------------------------------------------
 * The backend's state
 * -------------------------------------------------------------------------------------------------------- */
/* A weight matrix [rows][cols] on the device, in one or more parts of consecutive rows. A part is either bf16
 * (converted at load from f32, f16 or bf16 files; rows padded to ld values, zeros beyond cols) or a
 * quantized type kept as the file's blocks (row r at data + r * row_bytes). A stacked matrix (QKV, gate/up)
 * is one part when its pieces share a type, and one part per run of equal types when they do not (Q4_K_M
 * files give attn_v another type than attn_q): a product launches once per part, each writing its own
 * columns of C. */
typedef struct {
    uint32_t type;          /* LLM_BF16 or a quantized type */
    int row0, rows;         /* its rows of the matrix */
    const void *data;
    size_t row_bytes;       /* bf16: ld * 2 */
} dpart;
#define DMAT_MAX_PARTS 3
typedef struct {
    int rows, cols, ld;     /* ld: cols rounded up to 8, the row stride of bf16 parts */
    int n_parts;
    dpart part[DMAT_MAX_PARTS];
} dmat;

typedef struct {
    dmat wqkv, wo, wgu, wdown;
    float *attn_norm, *ffn_norm, *bqkv, *q_norm, *k_norm; /* bqkv, q_norm, k_norm NULL when absent */
    float *post_attn_norm, *post_ffn_norm;                /* Gemma 3's (else NULL) */
    int window;                /* llm_layer_window: 0, or a local layer's window (its own RoPE, rope[1]) */
    int rope;                  /* 0: a layer without RoPE (SmolLM3's) */
    int kv_group, kv_index;    /* llm_kv_place: its block tables, and its place among a block's layers */
    /* a mixture of experts (wgu, wdown unused): the router [n_experts][dim] and the experts' matrices stacked
     * as the file has them, expert e's rows at e * expert_ffn_dim (gate, up) and e * dim (down) */
    dmat router, gate_exps, up_exps, down_exps;
    /* gpt-oss: attention sinks [n_heads], the output projection's bias [dim], the router's bias (the host's:
     * it routes), the experts' biases [n_experts][expert_ffn_dim] (gate, up) and [n_experts][dim] (down) */
    float *sinks, *bo, *gate_exps_b, *up_exps_b, *down_exps_b;
    float *router_b;           /* a host copy (the host routes): the backend keeps no pointer into the
                                * model */
    /* qwen2moe's shared expert: gate and up stacked as wgu's, down, its gate's vector [dim] (else NULL) */
    dmat shexp_gu, shexp_down;
    float *shexp_gate_inp;
} dlayer;

typedef struct {
    llm_config cfg;
    int sm_count;
    cudaStream_t stream;
    dmat tok_embd, output;
    float *output_norm;
    float *inv_freq[2], mscale[2];             /* RoPE (llm_rope_freqs): global layers' [0], local ones'
                                                * [1] */
    float embed_scale;                         /* Gemma: sqrt(dim); else 1 */
    int kv_layers, kv_groups;                  /* llm_kv_group_layers, llm_kv_groups */
    int *group_window;                         /* [kv_groups]: the window of a group's layers (0: global) */
    dlayer *layers;
    void **allocs; int n_allocs, cap_allocs;   /* every weight allocation, freed at destroy */
    size_t weight_bytes, weight_bytes_bf16;    /* device bytes of the matrices; of those, the bf16 parts */
    /* KV cache (alloc_kv); num_blocks 0 until there is one */
    bf16 *kc, *vc;
    size_t layer_stride;              /* values per layer: num_blocks * n_kv_heads * block_size * head_dim; a
                                       * block holds kv_layers layers, those of its group */
    int num_blocks, block_size, part_size;
    /* scratch, for cap_tokens tokens */
    int cap_tokens, cap_logits, cap_parts, cap_ints;
    int ld_dim, ld_q, ld_ffn;                  /* padded row strides of the bf16 GEMM inputs */
    int ffn_width;                             /* the widest dense FFN: ffn_dim or qwen2moe's shared expert */
    float *x, *qkv, *q, *gu, *delta, *logits, *part_acc, *part_ml; /* delta: a block's output (Gemma 3) */
    /* a mixture of experts' step, for cap_tokens tokens: router logits [T][n_experts] (and their pinned host
     * copy), the rows gathered by expert [T K] (bf16 in, gate/up out, SwiGLU, down out), and the routing the
     * host sends back: each row's token, each (token, k)'s row, and its weight (pinned, then on the
     * device) */
    float *moe_logits, *moe_logits_h, *moe_gu, *moe_y;
    bf16 *moe_x, *moe_act;
    int *moe_route_d, *moe_route_h;
    int *moe_chosen; float *moe_weight;        /* host: llm_moe_route's output */
    int *argmax_d, *argmax_h;                  /* [cap_logits]: the sample step's greedy picks; pinned */
    int logits_rows;                           /* the rows of logits the last forward call left */
    llm_sampler *sampler;                      /* the sample step's on the host, made by its first call */
    uint8_t *rows_to_host;                     /* [cap_logits]: the rows the sample step copies ... */
    llm_sample_row *host_draws;                /* ... and its draws from them, on the host's threads */
    int cap_host_draws;
    bf16 *xn, *att, *act;
    int *ints_d; int *ints_h;                  /* per-step integer inputs: pinned host staging, device copy */
    size_t attn_smem;
    /* CUDA graph of the last pure-decode step shape */
    cudaGraphExec_t graph; int graph_tokens, graph_logits, graph_bt_stride, use_graphs;
    int last_tokens, last_logits, last_bt_stride; /* the previous step's decode shape */
    cudaEvent_t timer[2];                      /* llm_cuda_run_*: made by the first timed run */
    int gemm_config, gemm_no_split;            /* llm_cuda_run_gemm's tile shape, no split-K */
    int attn_generic;                          /* llm_cuda_run_attention's: the kernel for any head_dim */
} cuda_ctx;

static int ctx_alloc(cuda_ctx *c, void **p, size_t bytes, char *err) {
    CK(cudaMalloc(p, bytes ? bytes : 16));
    if (c->n_allocs == c->cap_allocs) {
        int cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        void **a = (void **)realloc(c->allocs, (size_t)cap * sizeof(void *));
        if (!a) { cudaFree(*p); *p = NULL; return fail(err, "out of host memory"); }
        c->allocs = a; c->cap_allocs = cap;
    }
    c->allocs[c->n_allocs++] = *p;
    return 0;
}

/* The weights ws[0..n) (same cols) converted to one bf16 part of out, rows padded to out->ld. */
static int upload_bf16_part(cuda_ctx *c, dpart *part, const llm_weight *const *ws, int n, int ld, char *err) {
    int cols = (int)ws[0]->cols, rows = 0;
    for (int i = 0; i < n; i++) rows += (int)ws[i]->rows;
    bf16 *dev;
    size_t bytes = (size_t)rows * ld * sizeof(bf16);
    if (ctx_alloc(c, (void **)&dev, bytes, err)) return -1;
    c->weight_bytes += bytes; c->weight_bytes_bf16 += bytes;
    part->type = LLM_BF16; part->rows = rows; part->data = dev; part->row_bytes = (size_t)ld * sizeof(bf16);
    /* convert in slabs of rows so the host buffer stays small */
    const int slab = 4096;
    uint16_t *hbuf = (uint16_t *)malloc((size_t)slab * ld * sizeof(uint16_t));
    if (!hbuf) return fail(err, "out of host memory converting weights");
    int row0 = 0, rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const llm_weight *w = ws[i];
        size_t rb = llm_dtype_row_bytes(w->type, cols);
        for (int r0 = 0; r0 < w->rows && !rc; r0 += slab) {
            int nr = (int)(w->rows - r0 < slab ? w->rows - r0 : slab), oom = 0;
            #pragma omp parallel
            {
                float *tmp = (float *)malloc((size_t)cols * sizeof(float));
                if (!tmp) {
                    #pragma omp atomic write
                    oom = 1;
                }
                #pragma omp for schedule(static)
                for (int r = 0; r < nr; r++) {
                    if (!tmp) continue; /* every thread takes part in the loop; this one has no row buffer */
                    const uint8_t *src = (const uint8_t *)w->data + (size_t)(r0 + r) * rb;
                    llm_dtype_dequant_row(w->type, src, tmp, cols);
                    for (int k = 0; k < ld; k++)
                        hbuf[(size_t)r * ld + k] = k < cols ? host_f32_to_bf16(tmp[k]) : 0;
                }
                free(tmp);
            }
            if (oom) { rc = fail(err, "out of host memory converting weights"); break; }
            cudaError_t e = cudaMemcpy(dev + (size_t)(row0 + r0) * ld, hbuf, (size_t)nr * ld * sizeof(bf16),
                                       cudaMemcpyHostToDevice);
            if (e != cudaSuccess) rc = cuda_fail(err, e, "cudaMemcpy (weights)", __LINE__);
        }
        row0 += (int)w->rows;
    }
    free(hbuf);
    return rc;
}

/* The weights ws[0..n) (same cols, same quantized type) as one part: their blocks copied as they are. */
static int upload_quant_part(cuda_ctx *c, dpart *part, const llm_weight *const *ws, int n, char *err) {
    uint32_t type = ws[0]->type;
    size_t rb = llm_dtype_row_bytes(type, ws[0]->cols), at = 0;
    int rows = 0;
    for (int i = 0; i < n; i++) rows += (int)ws[i]->rows;
    uint8_t *dev;
    if (ctx_alloc(c, (void **)&dev, (size_t)rows * rb, err)) return -1;
    c->weight_bytes += (size_t)rows * rb;
    for (int i = 0; i < n; i++) {
        CK(cudaMemcpy(dev + at, ws[i]->data, (size_t)ws[i]->rows * rb, cudaMemcpyHostToDevice));
        at += (size_t)ws[i]->rows * rb;
    }
    part->type = type; part->rows = rows; part->data = dev; part->row_bytes = rb;
    return 0;
}

/* Matrices of the same cols stacked on top of each other as one dmat: quantized ones stay in their blocks,
 * the others become bf16; consecutive pieces of one device type share a part. */
static int upload_stacked(cuda_ctx *c, dmat *out, const llm_weight *const *ws, int n, char *err) {
    int cols = (int)ws[0]->cols, rows = 0;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < n; i++) {
        uint32_t t = ws[i]->type;
        if (ws[i]->cols != cols) return fail(err, "stacked weights differ in width");
        if (!llm_dtype_row_bytes(t, cols)) {
            snprintf(err, LLM_ERR_LEN, "the CUDA backend cannot use weights of type %s with %d columns",
                     llm_dtype_name(t), cols);
            return -1;
        }
        /* quantized rows are whole blocks (row_bytes checked it), so K is a multiple of 32: the kernels'
         * 8-value units never straddle a row's end */
        rows += (int)ws[i]->rows;
    }
    out->rows = rows; out->cols = cols; out->ld = round_up(cols, 8);
    for (int i = 0; i < n;) {
        uint32_t dev_type = is_quant((int)ws[i]->type) ? ws[i]->type : LLM_BF16;
        int j = i + 1;
        while (j < n && (is_quant((int)ws[j]->type) ? ws[j]->type : (uint32_t)LLM_BF16) == dev_type) j++;
        if (out->n_parts == DMAT_MAX_PARTS) return fail(err, "too many parts in a stacked matrix");
        dpart *part = &out->part[out->n_parts];
        int row0 = out->n_parts ? out->part[out->n_parts - 1].row0 + out->part[out->n_parts - 1].rows : 0;
        if (dev_type == LLM_BF16 ? upload_bf16_part(c, part, ws + i, j - i, out->ld, err)
                                 : upload_quant_part(c, part, ws + i, j - i, err)) return -1;
        part->row0 = row0;
        out->n_parts++;
        i = j;
    }
    return 0;
}

/* n host arrays of lens[i] values, one after the other in one device allocation */
static int upload_f32(cuda_ctx *c, float **out, const float *const *parts, const int *lens, int n,
                      char *err) {
    int total = 0;
    for (int i = 0; i < n; i++) total += lens[i];
    if (ctx_alloc(c, (void **)out, (size_t)total * sizeof(float), err)) return -1;
    int off = 0;
    for (int i = 0; i < n; i++) {
        CK(cudaMemcpy(*out + off, parts[i], (size_t)lens[i] * sizeof(float), cudaMemcpyHostToDevice));
        off += lens[i];
    }
    return 0;
}
/* n values from the host; NULL stays NULL (an absent bias or norm) */
static int upload_opt(cuda_ctx *c, float **out, const float *v, int n, char *err) {
    *out = NULL;
    return v ? upload_f32(c, out, &v, &n, 1, err) : 0;
}
static int upload_vec(cuda_ctx *c, float **out, const llm_weight *w, char *err) {
    if (w->data && w->type != LLM_F32) return fail(err, "norm and bias weights must be f32");
    return upload_opt(c, out, (const float *)w->data, (int)w->cols, err);
}

/* Frees the per-batch activations; returns the first failure (destroy has no one to tell, a step has). */
static cudaError_t free_scratch(cuda_ctx *c) {
    void *bufs[] = {c->x, c->qkv, c->q, c->gu, c->delta, c->xn, c->att, c->act, c->moe_logits, c->moe_gu,
                    c->moe_y, c->moe_x, c->moe_act, c->moe_route_d};
    cudaError_t first = cudaSuccess;
    for (void *p : bufs) {
        cudaError_t e = cudaFree(p);
        if (first == cudaSuccess) first = e;
    }
    c->x = c->qkv = c->q = c->gu = c->delta = NULL; c->xn = c->att = c->act = NULL;
    c->moe_logits = c->moe_gu = c->moe_y = NULL; c->moe_x = c->moe_act = NULL; c->moe_route_d = NULL;
    cudaError_t e = cudaFreeHost(c->moe_logits_h);
    if (first == cudaSuccess) first = e;
    e = cudaFreeHost(c->moe_route_h);
    if (first == cudaSuccess) first = e;
    c->moe_logits_h = NULL; c->moe_route_h = NULL;
    free(c->moe_chosen); free(c->moe_weight); c->moe_chosen = NULL; c->moe_weight = NULL;
    c->cap_tokens = 0;
    return first;
}

/* Grow the scratch buffers to hold a batch of T tokens, n_logits logit rows, n_part partial rows and n_ints
 * per-step integers. Growing drops the decode graph: it points at the old buffers. */
static int ensure_scratch(cuda_ctx *c, int T, int n_logits, int n_part, int n_ints, char *err) {
    const llm_config *cf = &c->cfg;
    int q_dim = cf->n_heads * cf->head_dim, kv_dim = cf->n_kv_heads * cf->head_dim;
    int grew = 0;
    if (T > c->cap_tokens) {
        CK(free_scratch(c));
        int cap = round_up(T > 64 ? T : 64, 64);
        CK(cudaMalloc((void **)&c->x, (size_t)cap * cf->dim * sizeof(float)));
        CK(cudaMalloc((void **)&c->qkv, (size_t)cap * (q_dim + 2 * kv_dim) * sizeof(float)));
        CK(cudaMalloc((void **)&c->q, (size_t)cap * q_dim * sizeof(float)));
        CK(cudaMalloc((void **)&c->gu, (size_t)cap * 2 * c->ffn_width * sizeof(float)));
        CK(cudaMalloc((void **)&c->delta, (size_t)cap * cf->dim * sizeof(float)));
        CK(cudaMalloc((void **)&c->xn, (size_t)cap * c->ld_dim * sizeof(bf16)));
        CK(cudaMalloc((void **)&c->att, (size_t)cap * c->ld_q * sizeof(bf16)));
        CK(cudaMalloc((void **)&c->act, (size_t)cap * c->ld_ffn * sizeof(bf16)));
        if (cf->n_experts) {
            size_t E = cf->n_experts, rows = (size_t)cap * cf->n_experts_used, Fe = cf->expert_ffn_dim;
            CK(cudaMalloc((void **)&c->moe_logits, (size_t)cap * E * sizeof(float)));
            CK(cudaMallocHost((void **)&c->moe_logits_h, (size_t)cap * E * sizeof(float)));
            CK(cudaMalloc((void **)&c->moe_x, rows * c->ld_dim * sizeof(bf16)));
            CK(cudaMalloc((void **)&c->moe_gu, rows * 2 * Fe * sizeof(float)));
            CK(cudaMalloc((void **)&c->moe_act, rows * round_up((int)Fe, 8) * sizeof(bf16)));
            CK(cudaMalloc((void **)&c->moe_y, rows * cf->dim * sizeof(float)));
            CK(cudaMalloc((void **)&c->moe_route_d, 4 * rows * sizeof(int)));
            CK(cudaMallocHost((void **)&c->moe_route_h, 4 * rows * sizeof(int)));
            c->moe_chosen = (int *)malloc(rows * sizeof(int));
            c->moe_weight = (float *)malloc(rows * sizeof(float));
            if (!c->moe_chosen || !c->moe_weight) return fail(err, "out of host memory");
        }
        c->cap_tokens = cap; grew = 1;
    }
    if (n_logits > c->cap_logits) {
        CK(cudaFree(c->logits)); CK(cudaFree(c->argmax_d)); CK(cudaFreeHost(c->argmax_h));
        c->logits = NULL; c->argmax_d = c->argmax_h = NULL;
        int cap = round_up(n_logits, 64);
        CK(cudaMalloc((void **)&c->logits, (size_t)cap * cf->vocab_size * sizeof(float)));
        CK(cudaMalloc((void **)&c->argmax_d, (size_t)cap * sizeof(int)));
        CK(cudaMallocHost((void **)&c->argmax_h, (size_t)cap * sizeof(int)));
        free(c->rows_to_host);
        if (!(c->rows_to_host = (uint8_t *)malloc((size_t)cap))) return fail(err, "out of host memory");
        c->cap_logits = cap; grew = 1;
    }
    if (n_part > c->cap_parts) {
        CK(cudaFree(c->part_acc)); CK(cudaFree(c->part_ml)); c->part_acc = c->part_ml = NULL;
        int cap = round_up(n_part, 256);
        CK(cudaMalloc((void **)&c->part_acc, (size_t)cap * cf->n_heads * cf->head_dim * sizeof(float)));
        CK(cudaMalloc((void **)&c->part_ml, (size_t)cap * cf->n_heads * 2 * sizeof(float)));
        c->cap_parts = cap; grew = 1;
    }
    if (n_ints > c->cap_ints) {
        CK(cudaFree(c->ints_d)); CK(cudaFreeHost(c->ints_h)); c->ints_d = NULL; c->ints_h = NULL;
        int cap = round_up(n_ints, 4096);
        CK(cudaMalloc((void **)&c->ints_d, (size_t)cap * sizeof(int)));
        CK(cudaMallocHost((void **)&c->ints_h, (size_t)cap * sizeof(int)));
        c->cap_ints = cap; grew = 1;
    }
    if (grew && c->graph) { CK(cudaGraphExecDestroy(c->graph)); c->graph = NULL; }
    return 0;
}

/* -----------------------------------------------------------------------------------------------------------
 * Launchers
 * -------------------------------------------------------------------------------------------------------- */
/* The GEMM's tile shapes: BM x BN, warps along M and N, BK, pipeline stages. GEMM_CONFIGS_ALL are compiled
 * for every weight type (launch_gemm picks the 3rd to 6th; the first two, BK 32, were its choice for M > 32
 * before, kept as the tuning table's baseline); GEMM_CONFIGS_BF16 for bf16 weights only, for tuning:
 * llm_cuda_gemm_run.config times any of them, numbered in this order from 1. */
#define GEMM_CONFIGS_ALL(X) \
    X(128, 128, 2, 4, 32, 4) X(64, 128, 2, 4, 32, 4) X(32, 64, 1, 4, 32, 4) X(128, 128, 2, 4, 64, 3) \
    X(64, 128, 2, 4, 64, 4) X(64, 64, 2, 2, 64, 4)
#define GEMM_CONFIGS_BF16(X) \
    X(128, 256, 2, 4, 32, 4) X(128, 256, 2, 4, 64, 3) X(256, 128, 4, 2, 64, 3) X(128, 64, 2, 2, 64, 4) \
    X(64, 256, 1, 8, 64, 3) X(32, 128, 1, 4, 64, 4)
#define GEMM_SMEM(BM, BN, BK, ST) ((size_t)(ST) * ((BM) + (BN)) * ((BK) + 8) * sizeof(bf16))

template <int BM, int BN, int WM, int WN, int BK, int ST, int QT>
static int launch_gemm_cfg(cuda_ctx *c, gemm_args g, char *err) {
    constexpr int threads = WM * WN * 32;
    size_t smem = GEMM_SMEM(BM, BN, BK, ST);
    int tiles_m = cdiv(g.M, BM), tiles_n = cdiv(g.N, BN), tiles = tiles_m * tiles_n;
    int k_tiles = cdiv(g.K, BK);
    /* split K when the tiles leave SMs idle: decode-sized M (the work is reading the weights) under two tiles
     * per SM, larger M under three quarters of one (on an H100 a second wave of slices cost more than it gave
     * there); keep >= 4 BK-tiles per slice for the pipeline */
    int split = 1, fill = g.M <= 32 ? 2 * c->sm_count : 3 * c->sm_count / 4;
    if (tiles < fill && !c->gemm_no_split) {
        split = cdiv(2 * c->sm_count, tiles);
        int max_split = k_tiles / 4 > 1 ? k_tiles / 4 : 1;
        if (split > max_split) split = max_split;
        if (split > 16) split = 16;
    }
    g.k_tiles_split = cdiv(k_tiles, split);
    split = cdiv(k_tiles, g.k_tiles_split);
    g.atomic = split > 1;
    /* only this product's N columns of each row: C may be one part's columns of a wider output */
    if (g.atomic && !g.accumulate)
        CK(cudaMemset2DAsync(g.C, (size_t)g.ldc * sizeof(float), 0, (size_t)g.N * sizeof(float), g.M,
                             c->stream));
    dim3 grid(tiles_n, tiles_m, split);
    gemm_kernel<BM, BN, WM, WN, BK, ST, QT><<<grid, threads, smem, c->stream>>>(g);
    CK_LAUNCH();
    return 0;
}

template <int HD> static int set_attn_smem(cuda_ctx *c, char *err) {
    const cudaFuncAttribute smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
    CK(cudaFuncSetAttribute(attn_kernel<1, HD>, smem, (int)c->attn_smem));
    CK(cudaFuncSetAttribute(attn_kernel<2, HD>, smem, (int)c->attn_smem));
    CK(cudaFuncSetAttribute(attn_kernel<4, HD>, smem, (int)c->attn_smem));
    CK(cudaFuncSetAttribute(attn_kernel<8, HD>, smem, (int)c->attn_smem));
    return 0;
}
/* shared memory for ROWS rows a warp: the block's query rows (f32) and two K and V tiles (bf16); the fewer
 * rows (decode), the more blocks an SM holds */
static size_t attn_smem_bytes(int rows, int hd) {
    return (size_t)rows * ATT_WARPS * hd * sizeof(float) + (size_t)4 * ATT_KT * (hd + 8) * sizeof(bf16);
}
template <int HD> static void launch_attn_hd(cuda_ctx *c, const attn_args &aa, dim3 grid, int rows) {
    const int T = ATT_WARPS * 32, hd = c->cfg.head_dim;
    if (rows <= 1) attn_kernel<1, HD><<<grid, T, attn_smem_bytes(1, hd), c->stream>>>(aa);
    else if (rows <= 2) attn_kernel<2, HD><<<grid, T, attn_smem_bytes(2, hd), c->stream>>>(aa);
    else if (rows <= 4) attn_kernel<4, HD><<<grid, T, attn_smem_bytes(4, hd), c->stream>>>(aa);
    else attn_kernel<8, HD><<<grid, T, attn_smem_bytes(8, hd), c->stream>>>(aa);
}
static int launch_attn(cuda_ctx *c, const attn_args &aa, int n_work, int max_rows, char *err) {
    dim3 grid(n_work, c->cfg.n_kv_heads);
    int rows = cdiv(max_rows, ATT_WARPS), hd = c->attn_generic ? 0 : c->cfg.head_dim;
    if (hd == 64) launch_attn_hd<64>(c, aa, grid, rows);
    else if (hd == 128) launch_attn_hd<128>(c, aa, grid, rows);
    else launch_attn_hd<0>(c, aa, grid, rows);
    CK_LAUNCH();
    return 0;
}

template <int BM, int BN, int WM, int WN, int BK, int ST, int QT> static int set_gemm_smem_cfg(char *err) {
    CK(cudaFuncSetAttribute(gemm_kernel<BM, BN, WM, WN, BK, ST, QT>,
                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GEMM_SMEM(BM, BN, BK, ST)));
    return 0;
}
template <int QT> static int set_gemm_smem_type(char *err) {
#define SET_SMEM(BM, BN, WM, WN, BK, ST) if (set_gemm_smem_cfg<BM, BN, WM, WN, BK, ST, QT>(err)) return -1;
    GEMM_CONFIGS_ALL(SET_SMEM)
    if constexpr (QT == LLM_BF16) { GEMM_CONFIGS_BF16(SET_SMEM) }
#undef SET_SMEM
    return 0;
}
#define GEMM_CONFIG_NAME(BM, BN, WM, WN, BK, ST) #BM "x" #BN " warps " #WM "x" #WN " k" #BK " stages " #ST,
static const char *const gemm_config_names[] = {GEMM_CONFIGS_ALL(GEMM_CONFIG_NAME)
                                                GEMM_CONFIGS_BF16(GEMM_CONFIG_NAME)};
static int set_gemm_smem(char *err) {
    if (set_gemm_smem_type<LLM_BF16>(err)) return -1;
#define SET_SMEM_TYPE(T) if (set_gemm_smem_type<T>(err)) return -1;
    QUANT_TYPES(SET_SMEM_TYPE)
#undef SET_SMEM_TYPE
    return 0;
}

extern "C" const char *llm_cuda_gemm_config_name(int config) {
    int n = (int)(sizeof gemm_config_names / sizeof gemm_config_names[0]);
    return config >= 1 && config <= n ? gemm_config_names[config - 1] : NULL;
}

/* The tile shape by M and the product's shape, as timed on an H100 over llama-3.2-1b's matrices at M = 64 to
 * 8192, bf16 and q4_K / q8_0 weights (results/2026-11-27-h100-80gb-hbm3-gemm-tiles.log): decode (M <= 32)
 * many narrow tiles; M <= 96 64 x 128; larger M 128 x 128, or for bf16 64 x 64 when 128 x 128 tiles would
 * leave a quarter of the SMs idle and K is too short for split-K to pay (the QKV and output projections up
 * to M = 512). Not for quantized weights: the tile loader dequantizes B once per tile, which 64-row tiles
 * do twice as often per product (2x slower there). From M = 64 on, BK 64 was faster than 32 at every shape,
 * by 1.2 to 1.5x. c->gemm_config > 0: that entry of the GEMM_CONFIGS lists instead (tuning). */
template <int QT> static int launch_gemm(cuda_ctx *c, gemm_args g, char *err) {
    if (c->gemm_config > 0) {
        int k = 0;
#define TRY_CONFIG(BM, BN, WM, WN, BK, ST) \
        if (++k == c->gemm_config) return launch_gemm_cfg<BM, BN, WM, WN, BK, ST, QT>(c, g, err);
        GEMM_CONFIGS_ALL(TRY_CONFIG)
        if constexpr (QT == LLM_BF16) { GEMM_CONFIGS_BF16(TRY_CONFIG) }
#undef TRY_CONFIG
        return fail(err, "gemm: that tile shape is compiled for bf16 weights only");
    }
    if (g.M <= 32) return launch_gemm_cfg<32, 64, 1, 4, 32, 4, QT>(c, g, err);
    if (g.M <= 96) return launch_gemm_cfg<64, 128, 2, 4, 64, 4, QT>(c, g, err);
    if (QT == LLM_BF16 && cdiv(g.M, 128) * cdiv(g.N, 128) < 3 * c->sm_count / 4 && g.K < 4096)
        return launch_gemm_cfg<64, 64, 2, 2, 64, 4, QT>(c, g, err);
    return launch_gemm_cfg<128, 128, 2, 4, 64, 3, QT>(c, g, err);
}

template <int T> static int launch_gemv(cuda_ctx *c, const gemv_args &g, char *err) {
    gemv_q_kernel<T><<<cdiv(g.N, GEMV_WARPS), GEMV_WARPS * 32, 0, c->stream>>>(g);
    CK_LAUNCH();
    return 0;
}

/* Whether a product of M tokens by a quantized part runs the GEMV (decode) rather than the GEMM (prefill) */
static int use_gemv(const dpart *p, int M) { return p->type != LLM_BF16 && M <= GEMV_MAX_M; }

/* C[M][N] (+)= A[M][K] W^T, part by part: each part's rows of W give its own columns of C. bf16 parts take
 * the tensor-core GEMM; quantized parts the GEMV for a few tokens and the dequantizing GEMM for more. */
static int gemm(cuda_ctx *c, float *C, int ldc, const bf16 *A, int lda, const dmat *W, int M, int accumulate,
                char *err) {
    for (int p = 0; p < W->n_parts; p++) {
        const dpart *P = &W->part[p];
        float *Cp = C + P->row0;
        if (use_gemv(P, M)) {
            gemv_args v = {};
            v.A = A; v.lda = lda; v.W = (const uint8_t *)P->data; v.row_bytes = P->row_bytes;
            v.C = Cp; v.ldc = ldc; v.M = M; v.N = P->rows; v.K = W->cols; v.accumulate = accumulate;
            int rc;
            switch (P->type) {
#define GEMV_CASE(T) case T: rc = launch_gemv<T>(c, v, err); break;
            QUANT_TYPES(GEMV_CASE)
#undef GEMV_CASE
            default: return fail(err, "gemv: not a quantized type");
            }
            if (rc) return -1;
            continue;
        }
        gemm_args g = {}; /* k_tiles_split and atomic: launch_gemm_cfg's */
        g.A = A; g.C = Cp;
        g.lda = lda; g.ldc = ldc;
        g.M = M; g.N = P->rows;
        g.accumulate = accumulate;
        int rc;
        if (P->type == LLM_BF16) {
            g.B = (const bf16 *)P->data; g.ldb = W->ld; g.K = W->ld;
            rc = launch_gemm<LLM_BF16>(c, g, err);
        } else {
            g.Bq = (const uint8_t *)P->data; g.ldb_bytes = P->row_bytes; g.K = W->cols;
            switch (P->type) {
#define GEMM_CASE(T) case T: rc = launch_gemm<T>(c, g, err); break;
            QUANT_TYPES(GEMM_CASE)
#undef GEMM_CASE
            default: return fail(err, "gemm: unknown weight type on the device");
            }
        }
        if (rc) return -1;
    }
    return 0;
}

/* x[t][:] = the embedding rows of the step's tokens, as f32, from a bf16 or a quantized matrix */
template <int T> static int launch_embed_q(cuda_ctx *c, const dpart *P, const int *tokens, int T_, int D,
                                           char *err) {
    embed_q_kernel<T><<<T_, 128, 0, c->stream>>>(c->x, (const uint8_t *)P->data, P->row_bytes, tokens, D,
                                                 c->embed_scale);
    CK_LAUNCH();
    return 0;
}
static int embed(cuda_ctx *c, const int *tokens, int T, char *err) {
    const dpart *P = &c->tok_embd.part[0];
    int D = c->cfg.dim;
    if (P->type == LLM_BF16) {
        embed_kernel<<<T, 256, 0, c->stream>>>(c->x, (const bf16 *)P->data, c->tok_embd.ld, tokens, D,
                                               c->embed_scale);
        CK_LAUNCH();
        return 0;
    }
    switch (P->type) {
#define EMBED_CASE(Q) case Q: return launch_embed_q<Q>(c, P, tokens, T, D, err);
    QUANT_TYPES(EMBED_CASE)
#undef EMBED_CASE
    }
    return fail(err, "embedding: unknown weight type on the device");
}

/* -----------------------------------------------------------------------------------------------------------
 * Per-step integer inputs, laid out in one buffer and sent with one copy
 * -------------------------------------------------------------------------------------------------------- */
typedef struct {
    int T, n_seqs, n_logits, n_work, n_part, bt_stride;
    int max_rows;                                           /* query rows of the largest attention tile */
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
    /* slots and block tables: one set per group of layers (group g's at off_slots + g T, off_bt + g n_seqs
     * max_blocks) */
    L->off_tokens = o; o += L->T; L->off_pos = o; o += L->T; L->off_slots = o; o += c->kv_groups * L->T;
    L->off_rows = o; o += L->n_logits; L->off_nparts = o; o += L->T; L->off_partbase = o; o += L->T;
    L->off_bt = o; o += c->kv_groups * L->n_seqs * max_blocks; o = round_up(o, 4);
    L->off_work = o; o += 4 * L->n_work;
    L->total = o;
    if (ensure_scratch(c, L->T, L->n_logits, L->n_part, L->total, err)) return -1;

    int *h = c->ints_h;
    /* an attention run's batch may have no tokens: only the embedding reads them */
    if (b->tokens) memcpy(h + L->off_tokens, b->tokens, (size_t)L->T * sizeof(int));
    memcpy(h + L->off_pos, b->positions, (size_t)L->T * sizeof(int));
    memcpy(h + L->off_rows, b->logit_rows, (size_t)L->n_logits * sizeof(int));
    attn_work *work = (attn_work *)(h + L->off_work);
    int nw = 0, part_row = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int mx = 0;
        for (int g = 0; g < c->kv_groups; g++) {
            const int32_t *tab = b->block_tables[(size_t)g * b->n_seqs + s];
            for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i++) {
                int p = b->positions[i];
                if (p > mx) mx = p;
                int blk = tab[p / bs];
                if (blk < 0 || blk >= c->num_blocks)
                    return fail(err, "block table entry outside the KV pool");
                h[L->off_slots + g * L->T + i] = blk * bs + p % bs;
            }
            /* a local group's blocks that slid out of the window are -1: never read (attn_kernel starts at
             * the window), written as block 0 */
            int *row = h + L->off_bt + ((size_t)g * b->n_seqs + s) * max_blocks;
            for (int k = 0; k < max_blocks; k++)
                row[k] = k > mx / bs ? 0 : tab[k] < 0 && c->group_window[g] > 0 ? 0 : tab[k];
            for (int k = 0; k <= mx / bs; k++)
                if (row[k] < 0 || row[k] >= c->num_blocks)
                    return fail(err, "block table entry outside the KV pool");
        }
        for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i += QT) {
            int n = b->seq_start[s + 1] - i < QT ? b->seq_start[s + 1] - i : QT, last = 0;
            for (int k = 0; k < n; k++) if (b->positions[i + k] > last) last = b->positions[i + k];
            int np = cdiv(last + 1, c->part_size);
            for (int k = 0; k < n; k++) {
                h[L->off_nparts + i + k] = np;
                h[L->off_partbase + i + k] = np > 1 ? part_row + k * np : 0;
            }
            if (np > 1) part_row += n * np;
            for (int p = 0; p < np; p++) work[nw++] = attn_work{s, i, n, p};
        }
    }
    return 0;
}

/* One layer's attention as a step runs it, on the step's integer inputs (ints_d): the QKV preparation
 * (bias, q/k norm, RoPE; K and V into the layer's cache), paged attention, the reduction of split contexts,
 * and zeros in the output's padding columns (the O GEMM reads them). qkv: [T][q_dim + 2 kv_dim], f32. The
 * forward pass and llm_cuda_run_attention both run it, so the tests check what the forward pass launches. */
static int enqueue_attention(cuda_ctx *c, const step_layout *L, const dlayer *ly, const float *qkv,
                             char *err) {
    const llm_config *cf = &c->cfg;
    int T = L->T, hd = cf->head_dim, q_dim = cf->n_heads * hd, local = ly->window > 0;
    const int *di = c->ints_d;
    cudaStream_t st = c->stream;
    size_t at = (size_t)ly->kv_index * c->layer_stride; /* the layer's place in its group's blocks */
    bf16 *kc = c->kc + at, *vc = c->vc + at;
    prep_args pa = {};
    pa.qkv = qkv; pa.q = c->q; pa.kc = kc; pa.vc = vc;
    pa.bias = ly->bqkv; pa.q_norm = ly->q_norm; pa.k_norm = ly->k_norm;
    pa.inv_freq = c->inv_freq[local]; pa.mscale = c->mscale[local];
    pa.positions = di + L->off_pos; pa.slots = di + L->off_slots + ly->kv_group * L->T;
    pa.n_heads = cf->n_heads; pa.n_kv_heads = cf->n_kv_heads; pa.hd = hd;
    pa.rope_dim = ly->rope ? cf->rope_dim : 0; pa.neox = cf->rope_neox; pa.block_size = c->block_size;
    pa.eps = cf->rms_eps;
    qkv_prep_kernel<<<T, PREP_WARPS * 32, 0, st>>>(pa);
    CK_LAUNCH();
    attn_args aa = {};
    aa.q = c->q; aa.kc = kc; aa.vc = vc;
    aa.block_tables = di + L->off_bt + (size_t)ly->kv_group * L->n_seqs * L->bt_stride;
    aa.bt_stride = L->bt_stride; aa.positions = di + L->off_pos; aa.window = ly->window; aa.sinks = ly->sinks;
    aa.work = (const attn_work *)(di + L->off_work);
    aa.tok_nparts = di + L->off_nparts; aa.tok_partbase = di + L->off_partbase;
    aa.out = c->att; aa.ldo = c->ld_q; aa.part_acc = c->part_acc; aa.part_ml = c->part_ml;
    aa.n_heads = cf->n_heads; aa.n_kv_heads = cf->n_kv_heads; aa.hd = hd;
    aa.block_size = c->block_size; aa.part_size = c->part_size;
    aa.scale_log2 = 1.4426950408889634f / sqrtf((float)hd);
    if (launch_attn(c, aa, L->n_work, L->max_rows, err)) return -1;
    if (L->n_part) {
        attn_reduce_kernel<<<dim3(T, cf->n_heads), hd < 128 ? hd : 128, 0, st>>>(
            c->att, c->ld_q, c->part_acc, c->part_ml, di + L->off_nparts, di + L->off_partbase, cf->n_heads,
            hd, ly->sinks);
        CK_LAUNCH();
    }
    if (c->ld_q > q_dim) { zero_cols_kernel<<<T, 32, 0, st>>>(c->att, c->ld_q, q_dim); CK_LAUNCH(); }
    return 0;
}

#define MOE_MAX_EXPERTS 512 /* Qwen3's and Mixtral's have 8 to 128 */

/* Rows [r0, r0 + n) of a one-part matrix as a part of their own: an expert's share of a stacked tensor */
static dpart part_rows(const dmat *M, int r0, int n, int row0) {
    dpart p = M->part[0];
    p.data = (const uint8_t *)p.data + (size_t)r0 * p.row_bytes;
    p.rows = n; p.row0 = row0;
    return p;
}

/* A mixture of experts' FFN on the normalised rows xn, added to the residual stream. The router's logits go
 * to the host, which picks each token's experts as the CPU does (llm_moe_route) and groups the rows by
 * expert; each expert with rows then runs its gate/up product, SwiGLU and down product once for all of them
 * (its weights read once per step, as on the CPU), and the outputs come back to their tokens, weighted. The
 * host's pick stops the stream once per layer, so a step with experts is not captured as a graph. */
static int moe_ffn(cuda_ctx *c, const dlayer *ly, int T, char *err) {
    const llm_config *cf = &c->cfg;
    int E = cf->n_experts, K = cf->n_experts_used, Fe = cf->expert_ffn_dim, D = cf->dim;
    int ld_fe = round_up(Fe, 8);
    cudaStream_t st = c->stream;
    if (gemm(c, c->moe_logits, E, c->xn, c->ld_dim, &ly->router, T, 0, err)) return -1;
    CK(cudaMemcpyAsync(c->moe_logits_h, c->moe_logits, (size_t)T * E * sizeof(float), cudaMemcpyDeviceToHost,
                       st));
    CK(cudaStreamSynchronize(st));
    llm_moe_route(cf, ly->router_b, c->moe_logits_h, T, c->moe_chosen, c->moe_weight);
    /* the route sent back: row_token [T K], row_of [T K], weight [T K] (as floats), row_expert [T K]. The
     * rows grouped by expert, each expert's in token order: a counting sort (expert e's rows from
     * start[e]) */
    int *row_token = c->moe_route_h, *row_of = row_token + T * K, *row_expert = row_of + 2 * T * K;
    float *weight = (float *)(row_of + T * K);
    int start[MOE_MAX_EXPERTS + 1] = {0}, next[MOE_MAX_EXPERTS];
    for (int i = 0; i < T * K; i++) start[c->moe_chosen[i] + 1]++;
    for (int e = 0; e < E; e++) { start[e + 1] += start[e]; next[e] = start[e]; }
    for (int i = 0; i < T * K; i++) {
        int e = c->moe_chosen[i], row = next[e]++;
        row_token[row] = i / K; row_of[i] = row; row_expert[row] = e;
    }
    int n = start[E];
    const int *row_expert_d = c->moe_route_d + 3 * T * K;
    memcpy(weight, c->moe_weight, (size_t)T * K * sizeof(float));
    CK(cudaMemcpyAsync(c->moe_route_d, c->moe_route_h, (size_t)4 * T * K * sizeof(int),
                       cudaMemcpyHostToDevice, st));
    gather_rows_kernel<<<n, 128, 0, st>>>(c->moe_x, c->xn, c->ld_dim, c->moe_route_d);
    CK_LAUNCH();
    for (int e = 0; e < E; e++) {
        int rows = start[e + 1] - start[e];
        if (!rows) continue;
        dmat gu = {}; /* the expert's gate and up rows, side by side in the output as wgu's */
        gu.rows = 2 * Fe; gu.cols = D; gu.ld = ly->gate_exps.ld; gu.n_parts = 2;
        gu.part[0] = part_rows(&ly->gate_exps, e * Fe, Fe, 0);
        gu.part[1] = part_rows(&ly->up_exps, e * Fe, Fe, Fe);
        if (gemm(c, c->moe_gu + (size_t)start[e] * 2 * Fe, 2 * Fe, c->moe_x + (size_t)start[e] * c->ld_dim,
                 c->ld_dim, &gu, rows, 0, err)) return -1;
    }
    if (ly->gate_exps_b) /* gpt-oss: each row's expert's biases, and its clamped SwiGLU */
        oss_act_kernel<<<dim3(cdiv(ld_fe, 256), n < 65535 ? n : 65535), 256, 0, st>>>(
            c->moe_act, ld_fe, c->moe_gu, Fe, ly->gate_exps_b, ly->up_exps_b, row_expert_d, n);
    else
        swiglu_kernel<<<dim3(cdiv(ld_fe, 256), n < 65535 ? n : 65535), 256, 0, st>>>(c->moe_act, ld_fe,
                                                                                    c->moe_gu, Fe, 0, n);
    CK_LAUNCH();
    for (int e = 0; e < E; e++) {
        int rows = start[e + 1] - start[e];
        if (!rows) continue;
        dmat down = {};
        down.rows = D; down.cols = Fe; down.ld = ly->down_exps.ld; down.n_parts = 1;
        down.part[0] = part_rows(&ly->down_exps, e * D, D, 0);
        if (gemm(c, c->moe_y + (size_t)start[e] * D, D, c->moe_act + (size_t)start[e] * ld_fe, ld_fe, &down,
                 rows, 0, err)) return -1;
    }
    if (ly->down_exps_b) { /* gpt-oss: each row's expert's down bias */
        add_bias_kernel<<<n, 256, 0, st>>>(c->moe_y, ly->down_exps_b, row_expert_d, D);
        CK_LAUNCH();
    }
    moe_combine_kernel<<<T, 256, 0, st>>>(c->x, c->moe_y, c->moe_route_d + T * K,
                                          (const float *)(c->moe_route_d + 2 * T * K), K, D);
    CK_LAUNCH();
    if (!ly->shexp_gate_inp) return 0;
    /* qwen2moe's shared expert: every token through one more SwiGLU FFN, as the dense layers' (gu, act), its
     * output (in delta) added gated */
    int Fs = cf->shared_ffn_dim;
    if (gemm(c, c->gu, 2 * Fs, c->xn, c->ld_dim, &ly->shexp_gu, T, 0, err)) return -1;
    swiglu_kernel<<<dim3(cdiv(c->ld_ffn, 256), T < 65535 ? T : 65535), 256, 0, st>>>(c->act, c->ld_ffn, c->gu,
                                                                                   Fs, 0, T);
    CK_LAUNCH();
    if (gemm(c, c->delta, D, c->act, c->ld_ffn, &ly->shexp_down, T, 0, err)) return -1;
    shared_expert_add_kernel<<<T, 256, 0, st>>>(c->x, c->delta, c->xn, c->ld_dim, ly->shexp_gate_inp, D);
    CK_LAUNCH();
    return 0;
}

/* A block's output projection added to the residual stream: straight into it by the GEMM, or (Gemma 3)
 * through delta and its RMS norm */
static int add_block_output(cuda_ctx *c, int T, const bf16 *A, int lda, const dmat *W, const float *post_norm,
                            char *err) {
    const llm_config *cf = &c->cfg;
    if (!post_norm) return gemm(c, c->x, cf->dim, A, lda, W, T, 1, err);
    if (gemm(c, c->delta, cf->dim, A, lda, W, T, 0, err)) return -1;
    rmsnorm_add_kernel<<<T, 256, 0, c->stream>>>(c->x, c->delta, post_norm, cf->dim, cf->rms_eps);
    CK_LAUNCH();
    return 0;
}

/* All the kernels of one step, in stream order (also what a decode graph captures). */
static int enqueue_step(cuda_ctx *c, const step_layout *L, char *err) {
    const llm_config *cf = &c->cfg;
    int T = L->T;
    const int *di = c->ints_d;
    cudaStream_t st = c->stream;
    CK(cudaMemcpyAsync(c->ints_d, c->ints_h, (size_t)L->total * sizeof(int), cudaMemcpyHostToDevice, st));
    if (embed(c, di + L->off_tokens, T, err)) return -1;
    for (int l = 0; l < cf->n_layers; l++) {
        const dlayer *ly = &c->layers[l];
        rmsnorm_kernel<<<T, 256, 0, st>>>(c->xn, c->ld_dim, c->x, NULL, ly->attn_norm, cf->dim, cf->rms_eps);
        CK_LAUNCH();
        if (gemm(c, c->qkv, ly->wqkv.rows, c->xn, c->ld_dim, &ly->wqkv, T, 0, err)) return -1;
        if (enqueue_attention(c, L, ly, c->qkv, err)) return -1;
        if (add_block_output(c, T, c->att, c->ld_q, &ly->wo, ly->post_attn_norm, err)) return -1;
        if (ly->bo) { add_bias_kernel<<<T, 256, 0, st>>>(c->x, ly->bo, NULL, cf->dim); CK_LAUNCH(); }
        rmsnorm_kernel<<<T, 256, 0, st>>>(c->xn, c->ld_dim, c->x, NULL, ly->ffn_norm, cf->dim, cf->rms_eps);
        CK_LAUNCH();
        if (cf->n_experts) {
            if (moe_ffn(c, ly, T, err)) return -1;
            continue;
        }
        if (gemm(c, c->gu, 2 * cf->ffn_dim, c->xn, c->ld_dim, &ly->wgu, T, 0, err)) return -1;
        swiglu_kernel<<<dim3(cdiv(c->ld_ffn, 256), T < 65535 ? T : 65535), 256, 0, st>>>(
            c->act, c->ld_ffn, c->gu, cf->ffn_dim, cf->arch == LLM_ARCH_GEMMA3, T);
        CK_LAUNCH();
        if (add_block_output(c, T, c->act, c->ld_ffn, &ly->wdown, ly->post_ffn_norm, err)) return -1;
    }
    if (L->n_logits) {
        rmsnorm_kernel<<<L->n_logits, 256, 0, st>>>(c->xn, c->ld_dim, c->x, di + L->off_rows, c->output_norm,
                                                     cf->dim, cf->rms_eps);
        CK_LAUNCH();
        if (gemm(c, c->logits, cf->vocab_size, c->xn, c->ld_dim, &c->output, L->n_logits, 0, err)) return -1;
    }
    return 0;
}

/* -----------------------------------------------------------------------------------------------------------
 * The backend's functions
 * -------------------------------------------------------------------------------------------------------- */
/* What the kernels would index with, checked on the host first: token ids, logit rows, block copies.
 * (plan_step checks the block tables as it reads them.) */
static int check_batch(const cuda_ctx *c, const llm_batch *b, char *err) {
    for (int i = 0; i < b->n_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= c->cfg.vocab_size) {
            snprintf(err, LLM_ERR_LEN, "token id %d outside the vocabulary", b->tokens[i]);
            return -1;
        }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return fail(err, "logit row outside the batch");
    for (int i = 0; i < b->n_copies; i++) {
        int src = b->copy_src[i], dst = b->copy_dst[i];
        if (src < 0 || dst < 0 || src >= c->num_blocks || dst >= c->num_blocks)
            return fail(err, "block copy outside the KV pool");
    }
    return 0;
}

/* The batch's copy-on-write copies, on the stream ahead of the step's kernels: block src to block dst, K and
 * V, in each of the kv_layers layers a block holds (those of whichever group it serves). A block of one layer
 * is contiguous, so each cache takes one strided copy over the layers. */
static int enqueue_copies(cuda_ctx *c, const llm_batch *b, char *err) {
    size_t blk = (size_t)c->cfg.n_kv_heads * c->block_size * c->cfg.head_dim * sizeof(bf16);
    size_t pitch = c->layer_stride * sizeof(bf16);
    for (int i = 0; i < b->n_copies; i++) {
        size_t src = (size_t)b->copy_src[i] * blk, dst = (size_t)b->copy_dst[i] * blk;
        CK(cudaMemcpy2DAsync((char *)c->kc + dst, pitch, (char *)c->kc + src, pitch, blk, c->kv_layers,
                             cudaMemcpyDeviceToDevice, c->stream));
        CK(cudaMemcpy2DAsync((char *)c->vc + dst, pitch, (char *)c->vc + src, pitch, blk, c->kv_layers,
                             cudaMemcpyDeviceToDevice, c->stream));
    }
    return 0;
}

/* Rows of the logits to the host (want[i]: row i; NULL: all), in runs of consecutive rows, on the stream */
static int copy_rows_to_host(cuda_ctx *c, float *logits, int n_rows, const uint8_t *want, char *err) {
    size_t V = (size_t)c->cfg.vocab_size;
    for (int i = 0; i < n_rows;) {
        int j = i;
        while (j < n_rows && (!want || want[j])) j++;
        if (j > i)
            CK(cudaMemcpyAsync(logits + i * V, c->logits + i * V, (size_t)(j - i) * V * sizeof(float),
                               cudaMemcpyDeviceToHost, c->stream));
        i = j + 1;
    }
    return 0;
}

/* The step's kernels, replayed from the decode graph or enqueued one by one, then the rows of logits the
 * host reads to the host (llm_batch.host_rows). */
static int launch_step(cuda_ctx *c, const llm_batch *b, const step_layout *L, float *logits, char *err) {
    /* A pure-decode step (one token per sequence, short contexts) has the same kernels every time for the
     * same batch size: replay a captured graph instead of launching ~10 kernels per layer. The graph reads
     * its inputs from ints_d, which the copy at its start refills from ints_h. */
    int decode = b->n_tokens == b->n_seqs && L->n_part == 0 && L->n_work == b->n_seqs;
    int same_as_graph = c->graph && c->graph_tokens == L->T && c->graph_logits == L->n_logits &&
                        c->graph_bt_stride == L->bt_stride;
    /* capture only a shape seen in the step before too: a batch whose size changes every step would pay the
     * capture each time and never replay */
    int repeated = decode && c->last_tokens == L->T && c->last_logits == L->n_logits &&
                   c->last_bt_stride == L->bt_stride;
    c->last_tokens = decode ? L->T : -1; c->last_logits = L->n_logits; c->last_bt_stride = L->bt_stride;
    if (c->use_graphs && decode && (same_as_graph || repeated)) {
        if (!same_as_graph) {
            if (c->graph) { CK(cudaGraphExecDestroy(c->graph)); c->graph = NULL; }
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
            int rc = enqueue_step(c, L, err);
            cudaError_t e = cudaStreamEndCapture(c->stream, &g);
            if (rc || e != cudaSuccess) {
                if (e == cudaSuccess) cudaGraphDestroy(g); /* a partial capture: the enqueue's error wins */
                return rc ? -1 : cuda_fail(err, e, "cudaStreamEndCapture", __LINE__);
            }
            e = cudaGraphInstantiate(&c->graph, g, 0);
            if (e != cudaSuccess) {
                c->graph = NULL; cudaGraphDestroy(g);
                return cuda_fail(err, e, "cudaGraphInstantiate", __LINE__);
            }
            CK(cudaGraphDestroy(g));
            c->graph_tokens = L->T; c->graph_logits = L->n_logits; c->graph_bt_stride = L->bt_stride;
        }
        CK(cudaGraphLaunch(c->graph, c->stream));
    } else if (enqueue_step(c, L, err)) return -1;
    return copy_rows_to_host(c, logits, b->n_logits, b->host_rows, err);
}

static int cuda_forward(llm_backend *be, const llm_batch *b, float *logits, char *err) {
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    if (!c->num_blocks) return fail(err, "the CUDA backend has no KV cache yet (alloc_kv)");
    if (check_batch(c, b, err)) return -1;
    step_layout L = {};
    if (b->n_tokens > 0 && plan_step(c, b, &L, err)) return -1;
    if (enqueue_copies(c, b, err)) return -1;
    c->logits_rows = 0;
    if (b->n_tokens > 0 && launch_step(c, b, &L, logits, err)) return -1;
    CK(cudaStreamSynchronize(c->stream));
    c->logits_rows = b->n_tokens > 0 ? b->n_logits : 0;
    return 0;
}

/* The sample step. A row whose draw is its argmax alone (greedy, nothing adjusting it, no logprobs) is
 * picked where the logits are (argmax_kernel): 4 bytes come back, not the vocabulary's row. Any other row
 * comes to the host, into the engine's buffer, and the host's sampler draws from it on the host's threads
 * (sampling on the device is not written yet). */
static int cuda_sample(llm_backend *be, llm_sample_row *rows, int n_rows, float *logits, char *err) {
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    int V = c->cfg.vocab_size, n_argmax = 0;
    if (n_rows == 0) return 0;
    if (!c->sampler && !(c->sampler = llm_sampler_create(V, err))) return -1;
    if (c->logits_rows) memset(c->rows_to_host, 0, (size_t)c->logits_rows);
    for (int i = 0; i < n_rows; i++) {
        if (rows[i].row < 0 || rows[i].row >= c->logits_rows)
            return fail(err, "sample: a row the last forward call did not compute");
        if (llm_sample_row_is_argmax(&rows[i])) n_argmax++;
        else c->rows_to_host[rows[i].row] = 1;
    }
    if (n_argmax) {
        argmax_kernel<<<c->logits_rows, 1024, 0, c->stream>>>(c->argmax_d, c->logits, V);
        CK_LAUNCH();
        CK(cudaMemcpyAsync(c->argmax_h, c->argmax_d, (size_t)c->logits_rows * sizeof(int),
                           cudaMemcpyDeviceToHost, c->stream));
    }
    if (n_argmax < n_rows && copy_rows_to_host(c, logits, c->logits_rows, c->rows_to_host, err)) return -1;
    if (n_rows - n_argmax > c->cap_host_draws) {
        free(c->host_draws);
        c->cap_host_draws = 0;
        if (!(c->host_draws = (llm_sample_row *)malloc((size_t)n_rows * sizeof *c->host_draws)))
            return fail(err, "out of host memory");
        c->cap_host_draws = n_rows;
    }
    int n_host = 0;
    for (int i = 0; i < n_rows; i++)
        if (!llm_sample_row_is_argmax(&rows[i])) c->host_draws[n_host++] = rows[i];
    CK(cudaStreamSynchronize(c->stream));
    llm_sampler_sample_rows(c->sampler, c->host_draws, n_host, logits);
    for (int i = 0, k = 0; i < n_rows; i++) {
        if (llm_sample_row_is_argmax(&rows[i])) { rows[i].token = c->argmax_h[rows[i].row]; continue; }
        rows[i].token = c->host_draws[k].token; /* its top logprobs went where the row points */
        rows[i].logprob = c->host_draws[k++].logprob;
    }
    return 0;
}

/* The paged KV cache of num_blocks blocks, zeroed: a NaN bit pattern in an unwritten slot would poison a
 * masked-out score (0 * NaN). A second call replaces the first pool, and drops the decode graph that points
 * into it. */
static int ctx_alloc_kv(cuda_ctx *c, int num_blocks, int block_size, char *err) {
    const llm_config *cf = &c->cfg;
    if (num_blocks <= 0 || block_size <= 0)
        return fail(err, "alloc_kv: num_blocks and block_size must be > 0");
    /* a token's slot, block * block_size + offset, is an int on the device */
    if ((int64_t)num_blocks * block_size > INT_MAX)
        return fail(err, "alloc_kv: more token slots than an int holds");
    if (c->graph) { CK(cudaGraphExecDestroy(c->graph)); c->graph = NULL; }
    bf16 *old_k = c->kc, *old_v = c->vc;
    c->kc = c->vc = NULL; c->num_blocks = 0;
    CK(cudaFree(old_k));
    CK(cudaFree(old_v));
    c->layer_stride = (size_t)num_blocks * cf->n_kv_heads * block_size * cf->head_dim;
    size_t bytes = c->layer_stride * c->kv_layers * sizeof(bf16);
    CK(cudaMalloc((void **)&c->kc, bytes));
    CK(cudaMalloc((void **)&c->vc, bytes));
    CK(cudaMemset(c->kc, 0, bytes));
    CK(cudaMemset(c->vc, 0, bytes));
    /* the uploads and memsets ran on the default stream, which our non-blocking stream does not wait for */
    CK(cudaDeviceSynchronize());
    c->num_blocks = num_blocks; c->block_size = block_size;
    return 0;
}
static int cuda_alloc_kv(llm_backend *be, int num_blocks, int block_size, char *err) {
    return ctx_alloc_kv((cuda_ctx *)be->ctx, num_blocks, block_size, err);
}

static void ctx_free(cuda_ctx *c) {
    if (!c) return;
    /* destroy reports nothing: these calls' errors have no one to go to */
    if (c->graph) cudaGraphExecDestroy(c->graph);
    free_scratch(c);
    cudaFree(c->logits); cudaFree(c->argmax_d); cudaFreeHost(c->argmax_h);
    llm_sampler_free(c->sampler); free(c->rows_to_host); free(c->host_draws);
    cudaFree(c->part_acc); cudaFree(c->part_ml);
    cudaFree(c->ints_d); cudaFreeHost(c->ints_h);
    cudaFree(c->kc); cudaFree(c->vc);
    for (int i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i]);
    for (int i = 0; i < 2; i++) if (c->timer[i]) cudaEventDestroy(c->timer[i]);
    for (int l = 0; c->layers && l < c->cfg.n_layers; l++) free(c->layers[l].router_b);
    free(c->allocs); free(c->layers); free(c->group_window);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}
static void cuda_destroy(llm_backend *be) { ctx_free((cuda_ctx *)be->ctx); free(be); }

/* -----------------------------------------------------------------------------------------------------------
 * Creation
 * -------------------------------------------------------------------------------------------------------- */
static int ctx_init_device(cuda_ctx *c, const llm_config *cf, char *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(err, LLM_ERR_LEN, "no usable CUDA GPU (%s)", cudaGetErrorString(e));
        return -1;
    }
    if (n == 0) return fail(err, "no CUDA GPU found");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 8) {
        snprintf(err, LLM_ERR_LEN, "GPU %.64s (sm_%d%d) is too old: the kernels need sm_80 or newer",
                 prop.name, prop.major, prop.minor);
        return -1;
    }
    c->sm_count = prop.multiProcessorCount;
    c->cfg = *cf;
    if (cf->head_dim % 8 || cf->head_dim > MAX_HEAD_DIM || cf->n_heads % cf->n_kv_heads ||
        cf->n_heads / cf->n_kv_heads > ATT_MAX_ROWS) {
        snprintf(err, LLM_ERR_LEN, "the CUDA backend needs head_dim a multiple of 8 up to %d and at most %d "
                 "query heads per kv head", MAX_HEAD_DIM, ATT_MAX_ROWS);
        return -1;
    }
    CK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (set_gemm_smem(err)) return -1;
    c->attn_smem = attn_smem_bytes(ATT_MAX_ROWS / ATT_WARPS, cf->head_dim); /* the most a launch asks for */
    if (set_attn_smem<0>(c, err) || set_attn_smem<64>(c, err) || set_attn_smem<128>(c, err)) return -1;
    c->part_size = 512;
    c->ld_dim = round_up(cf->dim, 8);
    c->ld_q = round_up(cf->n_heads * cf->head_dim, 8);
    c->ffn_width = cf->shared_ffn_dim > cf->ffn_dim ? cf->shared_ffn_dim : cf->ffn_dim;
    c->ld_ffn = round_up(c->ffn_width, 8);
    /* RoPE's frequencies as the file scales them: the global layers' and the local layers' (their own base
     * and scale) */
    float inv[MAX_HEAD_DIM / 2] = {0};
    for (int local = 0; local < 2; local++) {
        llm_rope_freqs(cf, local && cf->sliding_window > 0 ? cf->rope_base_swa : cf->rope_base,
                       local ? cf->rope_freq_scale_swa : cf->rope_freq_scale, inv, &c->mscale[local]);
        const float *p = inv; int len = cf->rope_dim / 2 > 0 ? cf->rope_dim / 2 : 1;
        if (upload_f32(c, &c->inv_freq[local], &p, &len, 1, err)) return -1;
    }
    c->embed_scale = cf->arch == LLM_ARCH_GEMMA3 ? sqrtf((float)cf->dim) : 1.0f; /* as the CPU's forward */
    /* the KV cache's groups of layers (Gemma 3: its global layers, then its local ones, in groups) */
    c->kv_layers = llm_kv_group_layers(cf); c->kv_groups = llm_kv_groups(cf);
    c->group_window = (int *)calloc((size_t)c->kv_groups, sizeof(int));
    if (!c->group_window) return fail(err, "out of host memory");
    for (int l = 0; l < cf->n_layers; l++) {
        int g, index;
        llm_kv_place(cf, l, &g, &index);
        c->group_window[g] = llm_layer_window(cf, l);
    }
    /* a step with experts waits for the host's routing in each layer: no graph */
    c->use_graphs = getenv("LLM_CUDA_NO_GRAPHS") == NULL && !cf->n_experts;
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
        const llm_weight *qkv[3] = {&L->wq, &L->wk, &L->wv}, *wo[1] = {&L->wo};
        const llm_weight *gu[2] = {&L->w_gate, &L->w_up}, *dn[1] = {&L->w_down};
        if (upload_stacked(c, &d->wqkv, qkv, 3, err) || upload_stacked(c, &d->wo, wo, 1, err)) return -1;
        if (cf->n_experts) {
            const llm_weight *r[1] = {&L->router}, *g[1] = {&L->gate_exps}, *u[1] = {&L->up_exps},
                             *o[1] = {&L->down_exps};
            if (upload_stacked(c, &d->router, r, 1, err) || upload_stacked(c, &d->gate_exps, g, 1, err) ||
                upload_stacked(c, &d->up_exps, u, 1, err) || upload_stacked(c, &d->down_exps, o, 1, err))
                return -1;
            if (L->router_b.data) {
                size_t bytes = (size_t)cf->n_experts * sizeof(float);
                if (!(d->router_b = (float *)malloc(bytes))) return fail(err, "out of host memory");
                memcpy(d->router_b, L->router_b.data, bytes);
            }
            const llm_weight *bs[3] = {&L->gate_exps_b, &L->up_exps_b, &L->down_exps_b};
            float **to[3] = {&d->gate_exps_b, &d->up_exps_b, &d->down_exps_b};
            for (int k = 0; k < 3; k++) { /* a row per expert */
                int len = (int)(bs[k]->rows * bs[k]->cols);
                const float *v = (const float *)bs[k]->data;
                if (v && upload_f32(c, to[k], &v, &len, 1, err)) return -1;
            }
            if (L->shared_gate.data) { /* qwen2moe */
                const llm_weight *sgu[2] = {&L->shared_gate, &L->shared_up}, *sd[1] = {&L->shared_down};
                if (upload_stacked(c, &d->shexp_gu, sgu, 2, err) ||
                    upload_stacked(c, &d->shexp_down, sd, 1, err) ||
                    upload_vec(c, &d->shexp_gate_inp, &L->shared_gate_inp, err))
                    return -1;
            }
        } else if (upload_stacked(c, &d->wgu, gu, 2, err) || upload_stacked(c, &d->wdown, dn, 1, err))
            return -1;
        if (upload_vec(c, &d->attn_norm, &L->attn_norm, err) || upload_vec(c, &d->ffn_norm, &L->ffn_norm, err)
            || upload_vec(c, &d->q_norm, &L->q_norm, err) || upload_vec(c, &d->k_norm, &L->k_norm, err) ||
            upload_vec(c, &d->post_attn_norm, &L->post_attn_norm, err) ||
            upload_vec(c, &d->post_ffn_norm, &L->post_ffn_norm, err) ||
            upload_vec(c, &d->sinks, &L->sinks, err) || upload_vec(c, &d->bo, &L->bo, err))
            return -1;
        d->window = llm_layer_window(cf, l);
        d->rope = !cf->nope_every || (l + 1) % cf->nope_every != 0; /* as the CPU's forward */
        llm_kv_place(cf, l, &d->kv_group, &d->kv_index);
        if (L->bq.data) {
            if (L->bq.type != LLM_F32 || L->bk.type != LLM_F32 || L->bv.type != LLM_F32 || !L->bk.data ||
                !L->bv.data)
                return fail(err, "QKV biases must be f32 and all present");
            const float *parts[3] = {(const float *)L->bq.data, (const float *)L->bk.data,
                                     (const float *)L->bv.data};
            int lens[3] = {q_dim, kv_dim, kv_dim};
            if (upload_f32(c, &d->bqkv, parts, lens, 3, err)) return -1;
        }
    }
    return 0;
}

/* The step's token budget when the engine's config gives none: long prompts in few, large steps (the GEMM
 * runs 3x faster per token at 4096 rows than at 256), as vLLM's 8192 */
#define CUDA_BATCHED_TOKENS 8192

/* The memory the KV pool may take: what the weights left free on the device, minus room for the activations
 * of a step of the default budget and the logits of 256 rows, which the scratch grows into later (*act). */
static int kv_free_memory(const cuda_ctx *c, size_t *out, size_t *act_out, char *err) {
    const llm_config *cf = &c->cfg;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    size_t act = (size_t)CUDA_BATCHED_TOKENS * ((size_t)cf->dim * 4 * 2 +
                                 (size_t)(cf->n_heads + 2 * cf->n_kv_heads) * cf->head_dim * 4 * 2 +
                                 (size_t)c->ffn_width * 4 * 3) +
                 (size_t)256 * cf->vocab_size * 4 + ((size_t)256 << 20);
    if (cf->n_experts) /* each token's rows for its experts: in, gate/up, SwiGLU, out */
        act += (size_t)CUDA_BATCHED_TOKENS * cf->n_experts_used *
               ((size_t)cf->dim * 2 + (size_t)cf->expert_ffn_dim * 10 + (size_t)cf->dim * 4);
    *out = free_b > act ? free_b - act : 0;
    *act_out = act;
    return 0;
}

extern "C" llm_backend *llm_cuda_backend_create(const llm_model *m, char *err) {
    /* the experts of qwen3moe, Mixtral, qwen2moe (with its shared expert) and gpt-oss (with its biases and
     * clamped SwiGLU; its mxfp4 experts as bf16) */
    if (m->cfg.n_experts > MOE_MAX_EXPERTS) {
        fail(err, "the CUDA backend runs at most 512 experts: use --cpu");
        return NULL;
    }
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    llm_backend *be = (llm_backend *)calloc(1, sizeof *be);
    if (!c || !be) { free(c); free(be); fail(err, "out of host memory"); return NULL; }
    if (ctx_init_device(c, &m->cfg, err) || upload_model(c, m, err) ||
        kv_free_memory(c, &be->free_memory, &be->activation_memory, err)) {
        ctx_free(c); free(be);
        return NULL;
    }
    be->name = "cuda";
    be->kv_head_bytes = m->cfg.head_dim * (int)sizeof(bf16);
    be->default_kv_fraction = 0.9; /* like vLLM's gpu_memory_utilization */
    be->default_batched_tokens = CUDA_BATCHED_TOKENS;
    be->alloc_kv = cuda_alloc_kv; be->forward = cuda_forward; be->sample = cuda_sample;
    be->destroy = cuda_destroy;
    be->ctx = c;
    return be;
}

extern "C" size_t llm_cuda_weight_bytes(const llm_backend *be) {
    return be && be->ctx ? ((const cuda_ctx *)be->ctx)->weight_bytes : 0;
}

/* -----------------------------------------------------------------------------------------------------------
 * One kernel at a time, for test.c's GPU checks and kernel benchmarks (llm.h: llm_cuda_run_gemm,
 * llm_cuda_run_attention): the forward pass's own launches, on inputs from plain f32 host arrays or, when
 * those are NULL, filled on the device.
 * -------------------------------------------------------------------------------------------------------- */
/* A context with the device set up for a config and no weights; ctx_free frees what a run allocates. */
static cuda_ctx *test_ctx(const llm_config *cf, char *err) {
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!c) { fail(err, "out of host memory"); return NULL; }
    if (ctx_init_device(c, cf, err)) { ctx_free(c); return NULL; }
    return c;
}

/* Runs `run` reps times between two events on the stream: the mean time of one run in *seconds. */
template <typename F> static int time_reps(cuda_ctx *c, int reps, double *seconds, F run, char *err) {
    *seconds = 0;
    if (reps <= 0) return 0;
    for (int i = 0; i < 2; i++) if (!c->timer[i]) CK(cudaEventCreate(&c->timer[i]));
    CK(cudaEventRecord(c->timer[0], c->stream));
    for (int i = 0; i < reps; i++) if (run()) return -1;
    CK(cudaEventRecord(c->timer[1], c->stream));
    CK(cudaEventSynchronize(c->timer[1]));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, c->timer[0], c->timer[1]));
    *seconds = ms / 1e3 / reps;
    return 0;
}

/* n f32 values from the host, or zeros when src is NULL */
static int upload_or_zero(cuda_ctx *c, float **out, const float *src, size_t n, char *err) {
    if (ctx_alloc(c, (void **)out, n * sizeof(float), err)) return -1;
    if (src) CK(cudaMemcpy(*out, src, n * sizeof(float), cudaMemcpyHostToDevice));
    else CK(cudaMemset(*out, 0, n * sizeof(float)));
    return 0;
}

/* A GEMM operand [rows][cols]: from the host, rounded to bf16 as weights are; or, when src is NULL, a pattern
 * of small finite values (bf16 0x3c3c, about 0.0115), which is all a timing needs. */
static int gemm_operand(cuda_ctx *c, dmat *out, const float *src, int rows, int cols, char *err) {
    if (src) {
        llm_weight w = {};
        w.data = src; w.type = LLM_F32; w.rows = rows; w.cols = cols;
        const llm_weight *pw = &w;
        return upload_stacked(c, out, &pw, 1, err);
    }
    memset(out, 0, sizeof *out);
    out->rows = rows; out->cols = cols; out->ld = round_up(cols, 8);
    size_t bytes = (size_t)rows * out->ld * sizeof(bf16);
    void *dev;
    if (ctx_alloc(c, &dev, bytes, err)) return -1;
    CK(cudaMemset(dev, 0x3c, bytes));
    out->n_parts = 1;
    out->part[0].type = LLM_BF16; out->part[0].rows = rows; out->part[0].data = dev;
    out->part[0].row_bytes = (size_t)out->ld * sizeof(bf16);
    return 0;
}

/* The device's dequantization of a quantized matrix, [N][K] f32 to the host (dequant8: what every kernel
 * multiplies by) */
template <int T> static int dequant_to_host(cuda_ctx *c, const dpart *P, int K, float *out, char *err) {
    float *dev;
    if (ctx_alloc(c, (void **)&dev, (size_t)P->rows * K * sizeof(float), err)) return -1;
    dequant_rows_kernel<T><<<P->rows, 128, 0, c->stream>>>(dev, (const uint8_t *)P->data, P->row_bytes, K);
    CK_LAUNCH();
    CK(cudaStreamSynchronize(c->stream));
    CK(cudaMemcpy(out, dev, (size_t)P->rows * K * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

static int run_gemm(cuda_ctx *c, llm_cuda_gemm_run *r, char *err) {
    dmat a, w;
    float *dc;
    size_t n_c = (size_t)r->M * r->N;
    if (gemm_operand(c, &a, r->A, r->M, r->K, err) || upload_or_zero(c, &dc, r->C, n_c, err)) return -1;
    if (r->W_raw) { /* the file's blocks, kept as they are, as upload_model keeps them */
        llm_weight lw = {};
        lw.data = r->W_raw; lw.type = r->w_type; lw.rows = r->N; lw.cols = r->K;
        const llm_weight *pw = &lw;
        if (!is_quant((int)r->w_type)) return fail(err, "llm_cuda_run_gemm: W_raw needs a quantized w_type");
        if (upload_stacked(c, &w, &pw, 1, err)) return -1;
    } else if (gemm_operand(c, &w, r->W, r->N, r->K, err)) return -1;
    CK(cudaDeviceSynchronize()); /* the uploads ran on the default stream, which ours does not wait for */
    if (r->W_out) {
        int rc = -1;
        switch (r->w_type) {
#define DEQUANT_CASE(T) case T: rc = dequant_to_host<T>(c, &w.part[0], r->K, r->W_out, err); break;
        QUANT_TYPES(DEQUANT_CASE)
#undef DEQUANT_CASE
        default: fail(err, "llm_cuda_run_gemm: W_out needs a quantized W_raw");
        }
        if (rc) return -1;
    }
    r->used_gemv = use_gemv(&w.part[0], r->M);
    if (r->config && !llm_cuda_gemm_config_name(r->config))
        return fail(err, "llm_cuda_run_gemm: no such config");
    c->gemm_config = r->config; c->gemm_no_split = r->no_split;
    const bf16 *A = (const bf16 *)a.part[0].data;
    auto run = [&] { return gemm(c, dc, r->N, A, a.ld, &w, r->M, r->accumulate, err); };
    if (run()) return -1;
    CK(cudaStreamSynchronize(c->stream));
    if (r->C) CK(cudaMemcpy(r->C, dc, n_c * sizeof(float), cudaMemcpyDeviceToHost));
    return time_reps(c, r->reps, &r->seconds, run, err);
}

extern "C" int llm_cuda_run_gemm(llm_cuda_gemm_run *r, char *err) {
    if (r->M <= 0 || r->N <= 0 || r->K <= 0) return fail(err, "llm_cuda_run_gemm: M, N and K must be > 0");
    llm_config cf; memset(&cf, 0, sizeof cf); /* what ctx_init_device checks; a GEMM needs no model */
    cf.n_heads = cf.n_kv_heads = 1; cf.head_dim = 8; cf.rope_dim = 8; cf.rope_base = 10000; cf.n_layers = 1;
    cuda_ctx *c = test_ctx(&cf, err);
    int rc = c ? run_gemm(c, r, err) : -1;
    ctx_free(c);
    return rc;
}

/* The test's cache in llm.h's CPU layout [block][slot][kv_head][head_dim] (f32) to or from layer 0 of ours,
 * [block][kv_head][slot][head_dim] (bf16). */
static int cache_transfer(cuda_ctx *c, bf16 *dev, float *host, int to_device, char *err) {
    int nkv = c->cfg.n_kv_heads, hd = c->cfg.head_dim, bs = c->block_size;
    size_t bytes = c->layer_stride * sizeof(uint16_t);
    uint16_t *bits = (uint16_t *)malloc(bytes);
    if (!bits) return fail(err, "out of host memory");
    cudaError_t e = to_device ? cudaSuccess : cudaMemcpy(bits, dev, bytes, cudaMemcpyDeviceToHost);
    for (int blk = 0; e == cudaSuccess && blk < c->num_blocks; blk++)
        for (int s = 0; s < bs; s++)
            for (int h = 0; h < nkv; h++)
                for (int d = 0; d < hd; d++) {
                    size_t cpu = (((size_t)blk * bs + s) * nkv + h) * hd + d;
                    size_t ours = (((size_t)blk * nkv + h) * bs + s) * hd + d;
                    if (to_device) bits[ours] = host_f32_to_bf16(host[cpu]);
                    else host[cpu] = host_bf16_to_f32(bits[ours]);
                }
    if (e == cudaSuccess && to_device) e = cudaMemcpy(dev, bits, bytes, cudaMemcpyHostToDevice);
    free(bits);
    return e == cudaSuccess ? 0 : cuda_fail(err, e, "cudaMemcpy (KV cache)", __LINE__);
}

/* rows x cols bf16 values at row stride ld on the device, to f32 [rows][cols] on the host */
static int download_bf16(float *out, const bf16 *dev, int rows, int cols, int ld, char *err) {
    size_t bytes = (size_t)rows * ld * sizeof(uint16_t);
    uint16_t *bits = (uint16_t *)malloc(bytes);
    if (!bits) return fail(err, "out of host memory");
    cudaError_t e = cudaMemcpy(bits, dev, bytes, cudaMemcpyDeviceToHost);
    for (int t = 0; e == cudaSuccess && t < rows; t++)
        for (int i = 0; i < cols; i++) out[(size_t)t * cols + i] = host_bf16_to_f32(bits[(size_t)t * ld + i]);
    free(bits);
    return e == cudaSuccess ? 0 : cuda_fail(err, e, "cudaMemcpy (bf16 rows)", __LINE__);
}

static int run_attention(cuda_ctx *c, llm_cuda_attention_run *r, char *err) {
    const llm_config *cf = r->cfg;
    int T = r->batch->n_tokens, hd = cf->head_dim, q_dim = cf->n_heads * hd;
    int width = q_dim + 2 * cf->n_kv_heads * hd;
    c->part_size = r->part_size; c->attn_generic = r->generic_kernel;
    if (ctx_alloc_kv(c, r->num_blocks, r->block_size, err)) return -1;
    if ((r->k_cache && cache_transfer(c, c->kc, r->k_cache, 1, err)) ||
        (r->v_cache && cache_transfer(c, c->vc, r->v_cache, 1, err))) return -1;
    float *qkv, *bias, *q_norm, *k_norm;
    if (upload_or_zero(c, &qkv, r->qkv, (size_t)T * width, err) || upload_opt(c, &bias, r->bias, width, err)
        || upload_opt(c, &q_norm, r->q_norm, hd, err) || upload_opt(c, &k_norm, r->k_norm, hd, err))
        return -1;
    step_layout L;
    if (plan_step(c, r->batch, &L, err)) return -1;
    CK(cudaDeviceSynchronize()); /* the uploads ran on the default stream, which ours does not wait for */
    CK(cudaMemcpyAsync(c->ints_d, c->ints_h, (size_t)L.total * sizeof(int), cudaMemcpyHostToDevice,
                       c->stream));
    dlayer ly = {}; /* the config's first layer (local when it has a window), with RoPE, in the one group */
    ly.bqkv = bias; ly.q_norm = q_norm; ly.k_norm = k_norm; ly.rope = 1; ly.window = llm_layer_window(cf, 0);
    auto run = [&] { return enqueue_attention(c, &L, &ly, qkv, err); };
    if (run()) return -1;
    CK(cudaStreamSynchronize(c->stream));
    if (r->q_out) CK(cudaMemcpy(r->q_out, c->q, (size_t)T * q_dim * sizeof(float), cudaMemcpyDeviceToHost));
    if (r->att_out && download_bf16(r->att_out, c->att, T, q_dim, c->ld_q, err)) return -1;
    if ((r->k_cache && cache_transfer(c, c->kc, r->k_cache, 0, err)) ||
        (r->v_cache && cache_transfer(c, c->vc, r->v_cache, 0, err))) return -1;
    return time_reps(c, r->reps, &r->seconds, run, err);
}

extern "C" int llm_cuda_run_attention(llm_cuda_attention_run *r, char *err) {
    if (r->batch->n_tokens <= 0) return fail(err, "llm_cuda_run_attention: the batch has no tokens");
    if (r->part_size <= 0 || r->part_size % ATT_KT)
        return fail(err, "llm_cuda_run_attention: part_size must be a positive multiple of 32");
    cuda_ctx *c = test_ctx(r->cfg, err);
    int rc = c ? run_attention(c, r, err) : -1;
    ctx_free(c);
    return rc;
}
