/* llm.h - a small LLM serving engine in one header: GGUF loader, tokenizer, paged KV cache, continuous-batching
 * scheduler, sampler and a plain-C reference forward pass.
 *
 * stb style: include it anywhere for the declarations; in exactly one C file write
 *     #define LLM_IMPLEMENTATION
 *     #include "llm.h"
 * The implementation uses stb_ds.h (Debian: libstb-dev); it defines STB_DS_IMPLEMENTATION there too unless you
 * define LLM_NO_STB_DS_IMPLEMENTATION because your program already has it.
 *
 * The data's path, and the order of the sections below:
 *   1. GGUF file        -> llm_gguf      (memory-mapped, every offset bounds-checked)
 *   2. model            -> llm_model     (config from metadata, weight pointers into the map)
 *   3. text             -> token ids     (llm_tokenizer: SentencePiece BPE or GPT-2 byte-level BPE)
 *   4. requests         -> a batch       (scheduler, block manager with prefix cache)
 *   5. batch            -> logits        (forward pass over the paged KV cache)
 *   6. logits           -> next token    (sampler)
 *   7. token ids        -> text          (streaming detokenizer, stop strings)
 * Errors are returned (0 ok, -1 failed, with a message in a caller's buffer), never exit()ed.
 */
#ifndef LLM_H
#define LLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LLM_ERR_LEN 256

/* ---------------------------------------------------------------------------------------------------------------
 * GGUF
 * ------------------------------------------------------------------------------------------------------------- */
enum llm_gguf_type { /* metadata value types, as numbered in the file */
    LLM_GGUF_U8, LLM_GGUF_I8, LLM_GGUF_U16, LLM_GGUF_I16, LLM_GGUF_U32, LLM_GGUF_I32, LLM_GGUF_F32, LLM_GGUF_BOOL,
    LLM_GGUF_STRING, LLM_GGUF_ARRAY, LLM_GGUF_U64, LLM_GGUF_I64, LLM_GGUF_F64, LLM_GGUF_NTYPES
};

enum llm_dtype { /* tensor element types, numbered as ggml numbers them */
    LLM_F32 = 0, LLM_F16 = 1, LLM_Q4_0 = 2, LLM_Q4_1 = 3, LLM_Q8_0 = 8, LLM_Q4_K = 12, LLM_Q6_K = 14, LLM_BF16 = 30
};

typedef struct { const char *ptr; uint64_t len; } llm_str; /* points into the file: not NUL-terminated */

typedef struct {
    llm_str key;
    uint32_t type;          /* enum llm_gguf_type */
    uint32_t arr_type;      /* element type when type == LLM_GGUF_ARRAY */
    uint64_t arr_len;
    const uint8_t *data;    /* the value (or the first array element) in the file */
    llm_str *strs;          /* arrays of strings: each element, indexed once at load */
} llm_gguf_kv;

typedef struct {
    llm_str name;
    uint32_t n_dims;
    uint64_t ne[4];         /* innermost first: ne[0] values per row */
    uint32_t type;          /* enum llm_dtype */
    uint64_t offset, nbytes;
    const void *data;
} llm_gguf_tensor;

typedef struct {
    const uint8_t *base; uint64_t size; int mapped;
    uint32_t version;
    uint64_t alignment;
    int64_t n_kv, n_tensors;
    llm_gguf_kv *kv;
    llm_gguf_tensor *tensors;
} llm_gguf;

int  llm_gguf_open(llm_gguf *g, const char *path, char *err);                       /* mmap a file and parse it */
int  llm_gguf_parse(llm_gguf *g, const void *data, uint64_t size, char *err);       /* parse bytes in memory */
void llm_gguf_close(llm_gguf *g);
const llm_gguf_kv *llm_gguf_find(const llm_gguf *g, const char *key);
const llm_gguf_tensor *llm_gguf_tensor_find(const llm_gguf *g, const char *name);
int64_t llm_gguf_int(const llm_gguf *g, const char *key, int64_t fallback);          /* any integer or bool type */
double  llm_gguf_float(const llm_gguf *g, const char *key, double fallback);         /* any numeric type */
llm_str llm_gguf_string(const llm_gguf *g, const char *key);                        /* {NULL,0} when absent */
int64_t llm_gguf_arr_int(const llm_gguf_kv *kv, uint64_t i);
double  llm_gguf_arr_float(const llm_gguf_kv *kv, uint64_t i);
const char *llm_dtype_name(uint32_t type);

/* ---------------------------------------------------------------------------------------------------------------
 * Tokenizer (built from the GGUF vocabulary; keeps pointers into the llm_gguf, which must outlive it)
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct llm_tokenizer llm_tokenizer;

llm_tokenizer *llm_tokenizer_load(const llm_gguf *g, char *err);   /* NULL and a message on error */
void llm_tokenizer_free(llm_tokenizer *t);
/* Text to ids. Returns the number of ids (which may exceed cap: then only cap were written; call again with
 * more room), or -1 on error. parse_special: text like "<|im_end|>" becomes that control token. */
int  llm_tokenize(const llm_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special, int32_t *out, int cap);
int  llm_vocab_size(const llm_tokenizer *t);
int  llm_token_bos(const llm_tokenizer *t);            /* -1 when the vocabulary has none */
int  llm_token_eos(const llm_tokenizer *t);
int  llm_tokenizer_adds_bos(const llm_tokenizer *t);   /* tokenizer.ggml.add_bos_token, or the model type's default */
int  llm_token_is_eog(const llm_tokenizer *t, int32_t id);   /* end of generation: eos, eot, <|im_end|>, ... */
/* The raw bytes a token stands for (may be part of a UTF-8 character); control tokens give "" unless special.
 * Returns the byte count (which may exceed cap), -1 for an id outside the vocabulary. */
int  llm_token_to_piece(const llm_tokenizer *t, int32_t id, int special, char *buf, int cap);

/* Streaming detokenizer: feed ids one at a time; it writes only whole UTF-8 characters, holding back the bytes
 * of a character that is not complete yet. Bytes that can never form a valid character come out as U+FFFD.
 * Start from a zeroed llm_detok. A push writes at most 3 x (piece length + 3) bytes; given less room than its
 * output needs, it writes nothing, keeps its state and returns the room needed (> cap). */
typedef struct { unsigned char pending[8]; int n_pending; } llm_detok;
int  llm_detok_push(const llm_tokenizer *t, llm_detok *d, int32_t id, char *out, int cap); /* bytes written */
int  llm_detok_flush(llm_detok *d, char *out, int cap);  /* end of stream: what is held back, as U+FFFD */

/* ---------------------------------------------------------------------------------------------------------------
 * Model
 * ------------------------------------------------------------------------------------------------------------- */
enum llm_arch { LLM_ARCH_LLAMA, LLM_ARCH_QWEN2, LLM_ARCH_QWEN3 };

typedef struct {
    int arch;                 /* enum llm_arch */
    int dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, context_length;
    int rope_dim;             /* leading dims of each head that RoPE rotates (usually head_dim) */
    int rope_neox;            /* 1: rotate x[i] with x[i + rope_dim/2] (qwen); 0: adjacent pairs (llama) */
    float rope_base, rms_eps;
} llm_config;

typedef struct { const void *data; uint32_t type; int64_t rows, cols; } llm_weight; /* rows of cols values */

typedef struct {
    llm_weight attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm;   /* b*, *_norm: data NULL when absent */
    llm_weight ffn_norm, w_gate, w_up, w_down;
} llm_layer;

typedef struct llm_model {
    llm_config cfg;
    char name[128];
    llm_gguf gguf;            /* the mapped file (zeroed for a dummy model) */
    llm_tokenizer *tok;       /* NULL for a dummy model: it takes token ids only */
    llm_weight tok_embd, output_norm, output;
    llm_layer *layers;
    void *owned;              /* weights we allocated (dummy models) */
} llm_model;

int  llm_model_load(llm_model *m, const char *path, char *err);
/* A model of a real architecture's shape with random weights and no file, like vLLM's dummy load format.
 * Presets: see llm_dummy_presets in the implementation ("tiny", "tinyllama-1.1b", "llama-3.2-1b", "qwen2.5-0.5b"). */
int  llm_model_dummy(llm_model *m, const char *preset, uint64_t seed, char *err);
const char *llm_dummy_preset_names(void);
void llm_model_free(llm_model *m);

/* ---------------------------------------------------------------------------------------------------------------
 * Paged KV cache and the forward pass over a batch
 * The cache is a pool of blocks of block_size token slots (per layer, K and V). A sequence owns a list of blocks,
 * its block table: the token at position p lives in block block_table[p / block_size], slot p % block_size.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct {
    int num_blocks, block_size;
    int n_layers, n_kv_heads, head_dim;
    float *k, *v;             /* [layer][block][slot][kv_head][head_dim] */
} llm_kv_cache;

int  llm_kv_cache_init(llm_kv_cache *kv, const llm_config *cfg, int num_blocks, int block_size, char *err);
void llm_kv_cache_free(llm_kv_cache *kv);
size_t llm_kv_bytes_per_block(const llm_config *cfg, int block_size);

/* One forward call: the new tokens of several sequences, flattened. Sequence s owns tokens
 * [seq_start[s], seq_start[s+1]), at consecutive positions; each token attends to its sequence's positions
 * 0..its own, read from the cache through the sequence's block table (earlier positions must be there already:
 * computed in an earlier step, or shared from the prefix cache). Logits come out for the rows listed in
 * logit_rows, in that order. */
typedef struct {
    int n_tokens;
    const int32_t *tokens, *positions;
    int n_seqs;
    const int32_t *seq_start;               /* n_seqs + 1 entries */
    const int32_t *const *block_tables;     /* per sequence */
    int n_logits;
    const int32_t *logit_rows;
} llm_batch;

int llm_forward_cpu(const llm_model *m, llm_kv_cache *kv, const llm_batch *b, float *logits, char *err);

/* ---------------------------------------------------------------------------------------------------------------
 * Sampling
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct {
    int n;                          /* parallel samples of one prompt (they share the prompt's KV blocks) */
    float temperature;              /* 0: greedy */
    int top_k;                      /* 0: off */
    float top_p;                    /* 1: off */
    float min_p;                    /* 0: off; keep tokens with p >= min_p * p_max */
    float repetition_penalty;       /* 1: off; prompt and output tokens (vLLM's definition) */
    float presence_penalty, frequency_penalty;  /* 0: off; output tokens only */
    int64_t seed;                   /* -1: a random seed; sample i of a request uses seed + i */
    int max_tokens;                 /* 0: until the context is full */
    int ignore_eos;
    int logprobs;                   /* -1: none; 0: the sampled token's; K: also the top K alternatives */
    const char *const *stop;        /* stop strings (copied by add_request); not included in the output */
    int n_stop;
    const int32_t *stop_token_ids;  /* copied */
    int n_stop_token_ids;
} llm_sampling_params;

llm_sampling_params llm_sampling_defaults(void);
/* The tokens sampling may pick after temperature, top-k, top-p and min-p, most likely first, with their
 * renormalised probabilities; returns how many. ids and probs need room for n_vocab entries. */
int llm_sampler_candidates(const llm_sampling_params *p, const float *logits, int n_vocab, int32_t *ids, float *probs);
/* Picks the next token. logits are modified (penalties). history: the prompt then the output so far. */
int32_t llm_sample(const llm_sampling_params *p, float *logits, int n_vocab, const int32_t *history, int n_prompt,
                   int n_history, uint64_t *rng_state);

/* ---------------------------------------------------------------------------------------------------------------
 * Block manager: the KV pool's bookkeeping (the memory itself is in the backend)
 * Free blocks sit in one list in least-recently-freed order. A full block of prompt or output is named by a hash
 * of (its predecessor's hash, its token ids); when freed it keeps its contents and its name, so a later request
 * with the same prefix takes it back (automatic prefix caching) until allocation needs it and evicts it.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct {
    int ref_count;
    int prev_free, next_free;       /* links in the free list; -1 at the ends */
    int in_free_list;
    uint64_t hash;                  /* valid when hashed */
    int hashed;
} llm_block;

typedef struct { uint64_t key; int value; } llm_block_hash_entry;

typedef struct {
    int num_blocks, block_size;
    llm_block *blocks;
    int free_head, free_tail, num_free_blocks;
    llm_block_hash_entry *cached;   /* stb_ds hash map: block hash -> block id */
    int enable_prefix_caching;
    int64_t evictions;
} llm_block_manager;

int  llm_block_manager_init(llm_block_manager *bm, int num_blocks, int block_size, int enable_prefix_caching, char *err);
void llm_block_manager_free(llm_block_manager *bm);
int  llm_block_alloc(llm_block_manager *bm);          /* a block with ref_count 1, or -1 when none is free */
void llm_block_release(llm_block_manager *bm, int id); /* ref_count - 1; at 0 it joins the free list */
uint64_t llm_block_hash(uint64_t prev_hash, const int32_t *tokens, int n);
int  llm_block_lookup(llm_block_manager *bm, uint64_t hash);  /* cached block id (ref taken) or -1 */
void llm_block_set_hash(llm_block_manager *bm, int id, uint64_t hash);

/* ---------------------------------------------------------------------------------------------------------------
 * Backend: where the forward pass runs and the KV memory lives. The CPU one is below; llm.cu adds CUDA.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct llm_backend {
    const char *name;
    void *ctx;
    int num_blocks, block_size;
    int (*forward)(struct llm_backend *be, const llm_model *m, const llm_batch *b, float *logits, char *err);
    int (*copy_block)(struct llm_backend *be, int src, int dst, char *err);   /* copy-on-write of a shared block */
    void (*destroy)(struct llm_backend *be);
} llm_backend;

llm_backend *llm_cpu_backend_create(const llm_model *m, int num_blocks, int block_size, char *err);
#ifdef LLM_CUDA
/* llm.cu: NULL with a message when no GPU is usable; kv_bytes 0: a fraction of free device memory */
llm_backend *llm_cuda_backend_create(const llm_model *m, int num_blocks, size_t kv_bytes, int block_size, char *err);
#endif

/* ---------------------------------------------------------------------------------------------------------------
 * Engine: requests in, tokens and text out, one step at a time
 *
 * Threads: llm_engine_add_request and llm_engine_abort may be called from any thread at any time (they take the
 * engine's lock and leave the request in an inbox); everything else, llm_engine_step above all, belongs to the
 * one thread that drives the engine. The server runs llm_engine_step in a loop on its own thread and hands
 * requests in from its connection threads; the outputs of a step stay valid until the next step.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct {
    const char *model_path;         /* a GGUF file, or: */
    const char *dummy;              /* a dummy preset name (random weights, token ids only) */
    uint64_t dummy_seed;
    int block_size;                 /* 16 */
    int num_blocks;                 /* KV pool size in blocks; 0: from kv_bytes */
    size_t kv_bytes;                /* KV pool size in bytes; 0: the backend's default (CPU: 4 GiB at most) */
    int max_num_seqs;               /* 256 */
    int max_num_batched_tokens;     /* per-step token budget: 2048 */
    int max_model_len;              /* 0: the model's context length */
    int disable_prefix_caching;
    int static_batching;            /* no one joins until the whole batch has finished (for comparison) */
    int cpu;                        /* force the CPU backend */
} llm_engine_config;

enum llm_finish { LLM_FINISH_NONE, LLM_FINISH_STOP, LLM_FINISH_LENGTH, LLM_FINISH_ABORT };
const char *llm_finish_reason_name(int reason);   /* "stop", "length", "abort" */

typedef struct {
    uint64_t request_id;
    int index;                      /* which of the request's n samples */
    const int32_t *token_ids;       /* new tokens this step */
    int n_tokens;
    const char *text;               /* new text this step (text that may begin a stop string is held back) */
    int text_len;
    const float *logprobs;          /* when asked: per new token, its log-probability */
    const int32_t *top_ids;         /* when logprobs = K > 0: per new token K alternatives ... */
    const float *top_logprobs;      /* ... and their log-probabilities */
    int n_top;
    int finish_reason;              /* LLM_FINISH_NONE while it runs */
    int n_prompt_tokens, n_cached_tokens, n_generated;
} llm_output;

typedef struct {
    int running, waiting;
    int num_blocks, num_free_blocks, num_cached_blocks;
    int64_t prefix_cache_queries, prefix_cache_hits;  /* in tokens */
    int64_t kv_tokens;              /* tokens whose K/V the running sequences hold */
    int64_t preemptions, prompt_tokens_computed, generation_tokens, steps, requests_finished;
} llm_engine_stats;

typedef struct llm_engine llm_engine;

llm_engine *llm_engine_create(const llm_engine_config *cfg, char *err);
void llm_engine_destroy(llm_engine *e);
const llm_model *llm_engine_model(const llm_engine *e);
const char *llm_engine_backend_name(const llm_engine *e);
/* Returns the request id (> 0), or 0 with a message when the request can never run (prompt longer than the
 * context or the KV pool, bad parameters). Give text, or token ids (prompt_ids non-NULL). */
uint64_t llm_engine_add_request(llm_engine *e, const char *prompt, const int32_t *prompt_ids, int n_prompt_ids,
                                const llm_sampling_params *p, char *err);
void llm_engine_abort(llm_engine *e, uint64_t request_id);
/* One scheduler step and one forward call. Returns the number of outputs (one per sample that produced
 * something or finished), -1 on a backend error. */
int  llm_engine_step(llm_engine *e, const llm_output **outputs, char *err);
int  llm_engine_has_work(llm_engine *e);
llm_engine_stats llm_engine_get_stats(llm_engine *e);

#ifdef __cplusplus
}
#endif
#endif /* LLM_H */

/* =============================================================================================================
 * Implementation
 * =========================================================================================================== */
#ifdef LLM_IMPLEMENTATION
#ifndef LLM_IMPLEMENTATION_DONE
#define LLM_IMPLEMENTATION_DONE

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifndef LLM_NO_STB_DS_IMPLEMENTATION
#define STB_DS_IMPLEMENTATION
#endif
#include <stb/stb_ds.h>

static int llm_fail(char *err, const char *fmt, ...) {
    if (err) { va_list ap; va_start(ap, fmt); vsnprintf(err, LLM_ERR_LEN, fmt, ap); va_end(ap); }
    return -1;
}

static int llm_str_eq(llm_str s, const char *c) { size_t n = strlen(c); return s.len == n && memcmp(s.ptr, c, n) == 0; }

static float llm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) bits = sign;
        else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000 | (mant << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    float f; memcpy(&f, &bits, 4); return f;
}

static float llm_bf16_to_f32(uint16_t h) { uint32_t bits = (uint32_t)h << 16; float f; memcpy(&f, &bits, 4); return f; }

/* =============================================================================================================
 * 1. GGUF reader
 * A GGUF file is a header, key/value metadata, a table of tensor infos, then the aligned tensor data. We map the
 * file and keep pointers into it; every read goes through llm_rd, which refuses to step past the end.
 * =========================================================================================================== */
typedef struct { const uint8_t *p, *end; char *err; int failed; } llm_rd;

static const uint8_t *llm_rd_take(llm_rd *r, uint64_t n, const char *what) {
    if (r->failed) return NULL;
    if (n > (uint64_t)(r->end - r->p)) {
        llm_fail(r->err, "GGUF file truncated: %s runs past the end of the file", what);
        r->failed = 1; return NULL;
    }
    const uint8_t *p = r->p; r->p += n; return p;
}
static uint32_t llm_rd_u32(llm_rd *r, const char *what) { const uint8_t *p = llm_rd_take(r, 4, what); uint32_t v = 0; if (p) memcpy(&v, p, 4); return v; }
static uint64_t llm_rd_u64(llm_rd *r, const char *what) { const uint8_t *p = llm_rd_take(r, 8, what); uint64_t v = 0; if (p) memcpy(&v, p, 8); return v; }
static llm_str llm_rd_str(llm_rd *r, const char *what) {
    llm_str s = {0, 0}; uint64_t n = llm_rd_u64(r, what);
    const uint8_t *p = llm_rd_take(r, n, what);
    if (p) { s.ptr = (const char *)p; s.len = n; }
    return s;
}

static const uint64_t llm_gguf_type_size[LLM_GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* Bytes per block and values per block of each tensor type; 0 for a type we cannot compute with. */
static int llm_dtype_info(uint32_t type, uint64_t *block_bytes, uint64_t *block_values) {
    switch (type) {
    case LLM_F32:  *block_bytes = 4;   *block_values = 1;   return 1;
    case LLM_F16:  *block_bytes = 2;   *block_values = 1;   return 1;
    case LLM_BF16: *block_bytes = 2;   *block_values = 1;   return 1;
    case LLM_Q8_0: *block_bytes = 34;  *block_values = 32;  return 1;
    case LLM_Q4_0: *block_bytes = 18;  *block_values = 32;  return 1;
    case LLM_Q4_1: *block_bytes = 20;  *block_values = 32;  return 1;
    case LLM_Q4_K: *block_bytes = 144; *block_values = 256; return 1;
    case LLM_Q6_K: *block_bytes = 210; *block_values = 256; return 1;
    default: return 0;
    }
}

const char *llm_dtype_name(uint32_t type) {
    switch (type) {
    case LLM_F32: return "f32"; case LLM_F16: return "f16"; case LLM_BF16: return "bf16"; case LLM_Q8_0: return "q8_0";
    case LLM_Q4_0: return "q4_0"; case LLM_Q4_1: return "q4_1"; case LLM_Q4_K: return "q4_K"; case LLM_Q6_K: return "q6_K";
    default: return "unknown";
    }
}

int llm_gguf_parse(llm_gguf *g, const void *data, uint64_t size, char *err) {
    memset(g, 0, sizeof *g);
    g->base = (const uint8_t *)data; g->size = size; g->alignment = 32;
    llm_rd r = {g->base, g->base + size, err, 0};
    const uint8_t *magic = llm_rd_take(&r, 4, "header");
    if (!magic) return -1;
    if (memcmp(magic, "GGUF", 4) != 0) return llm_fail(err, "not a GGUF file: bad magic (expected \"GGUF\")");
    g->version = llm_rd_u32(&r, "header");
    if (!r.failed && g->version != 2 && g->version != 3)
        return llm_fail(err, "unsupported GGUF version %u (supported: 2, 3)", g->version);
    uint64_t n_tensors = llm_rd_u64(&r, "header"), n_kv = llm_rd_u64(&r, "header");
    if (r.failed) return -1;
    /* each kv takes at least 12 bytes and each tensor info at least 24: a count beyond that is corrupt */
    if (n_kv > size / 12 || n_tensors > size / 24)
        return llm_fail(err, "corrupt GGUF header: %llu tensors, %llu metadata keys in a %llu-byte file",
                        (unsigned long long)n_tensors, (unsigned long long)n_kv, (unsigned long long)size);
    g->n_kv = (int64_t)n_kv; g->n_tensors = (int64_t)n_tensors;
    g->kv = (llm_gguf_kv *)calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = (llm_gguf_tensor *)calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) { llm_gguf_close(g); return llm_fail(err, "out of memory reading GGUF header"); }

    for (uint64_t i = 0; i < n_kv; i++) {
        llm_gguf_kv *kv = &g->kv[i];
        kv->key = llm_rd_str(&r, "metadata key");
        kv->type = llm_rd_u32(&r, "metadata type");
        if (r.failed) goto fail;
        if (kv->type >= LLM_GGUF_NTYPES) {
            llm_fail(err, "corrupt GGUF metadata: key '%.*s' has unknown value type %u", (int)kv->key.len, kv->key.ptr, kv->type);
            goto fail;
        }
        kv->data = r.p;
        if (kv->type == LLM_GGUF_STRING) { llm_rd_str(&r, "metadata string"); continue; }
        if (kv->type != LLM_GGUF_ARRAY) { llm_rd_take(&r, llm_gguf_type_size[kv->type], "metadata value"); continue; }
        kv->arr_type = llm_rd_u32(&r, "metadata array");
        kv->arr_len = llm_rd_u64(&r, "metadata array");
        if (r.failed) goto fail;
        if (kv->arr_type >= LLM_GGUF_NTYPES || kv->arr_type == LLM_GGUF_ARRAY) {
            llm_fail(err, "corrupt GGUF metadata: array '%.*s' has unsupported element type %u", (int)kv->key.len, kv->key.ptr, kv->arr_type);
            goto fail;
        }
        kv->data = r.p;
        if (kv->arr_type == LLM_GGUF_STRING) {
            if (kv->arr_len > (uint64_t)(r.end - r.p) / 8) { llm_fail(err, "GGUF file truncated: array '%.*s' runs past the end of the file", (int)kv->key.len, kv->key.ptr); goto fail; }
            kv->strs = (llm_str *)malloc((kv->arr_len ? kv->arr_len : 1) * sizeof(llm_str));
            if (!kv->strs) { llm_fail(err, "out of memory indexing '%.*s'", (int)kv->key.len, kv->key.ptr); goto fail; }
            for (uint64_t j = 0; j < kv->arr_len && !r.failed; j++) kv->strs[j] = llm_rd_str(&r, "metadata string array");
        } else {
            uint64_t esz = llm_gguf_type_size[kv->arr_type];
            if (kv->arr_len > (uint64_t)(r.end - r.p) / esz) { llm_fail(err, "GGUF file truncated: array '%.*s' runs past the end of the file", (int)kv->key.len, kv->key.ptr); goto fail; }
            llm_rd_take(&r, kv->arr_len * esz, "metadata array");
        }
        if (r.failed) goto fail;
    }
    const llm_gguf_kv *align = llm_gguf_find(g, "general.alignment");
    if (align) {
        int64_t a = llm_gguf_int(g, "general.alignment", 32);
        if (a <= 0 || (a & (a - 1))) { llm_fail(err, "corrupt GGUF metadata: general.alignment %lld is not a power of two", (long long)a); goto fail; }
        g->alignment = (uint64_t)a;
    }

    for (uint64_t i = 0; i < n_tensors; i++) {
        llm_gguf_tensor *t = &g->tensors[i];
        t->name = llm_rd_str(&r, "tensor info");
        t->n_dims = llm_rd_u32(&r, "tensor info");
        if (r.failed) goto fail;
        if (t->n_dims == 0 || t->n_dims > 4) { llm_fail(err, "corrupt tensor '%.*s': %u dimensions", (int)t->name.len, t->name.ptr, t->n_dims); goto fail; }
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) t->ne[d] = llm_rd_u64(&r, "tensor info");
        t->type = llm_rd_u32(&r, "tensor info");
        t->offset = llm_rd_u64(&r, "tensor info");
        if (r.failed) goto fail;
        uint64_t bb, bv;
        if (!llm_dtype_info(t->type, &bb, &bv)) {
            llm_fail(err, "tensor '%.*s' has unknown or unsupported tensor type %u", (int)t->name.len, t->name.ptr, t->type);
            goto fail;
        }
        uint64_t n = 1;
        for (int d = 0; d < 4; d++) {
            if (t->ne[d] == 0 || t->ne[d] > ((uint64_t)1 << 40) || n > ((uint64_t)1 << 50) / t->ne[d]) {
                llm_fail(err, "corrupt tensor '%.*s': bad dimensions", (int)t->name.len, t->name.ptr); goto fail;
            }
            n *= t->ne[d];
        }
        if (t->ne[0] % bv) { llm_fail(err, "corrupt tensor '%.*s': row of %llu values is not a whole number of %s blocks", (int)t->name.len, t->name.ptr, (unsigned long long)t->ne[0], llm_dtype_name(t->type)); goto fail; }
        t->nbytes = n / bv * bb;
    }
    uint64_t data_start = (uint64_t)(r.p - g->base);
    data_start = (data_start + g->alignment - 1) / g->alignment * g->alignment;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        llm_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment || t->offset > size || data_start > size - t->offset || t->nbytes > size - data_start - t->offset) {
            llm_fail(err, "tensor '%.*s' points past the end of the file (offset %llu, %llu bytes, file %llu bytes)",
                     (int)t->name.len, t->name.ptr, (unsigned long long)t->offset, (unsigned long long)t->nbytes, (unsigned long long)size);
            goto fail;
        }
        t->data = g->base + data_start + t->offset;
    }
    return 0;
fail:
    llm_gguf_close(g);
    return -1;
}

int llm_gguf_open(llm_gguf *g, const char *path, char *err) {
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return llm_fail(err, "cannot open model file '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) { close(fd); return llm_fail(err, "'%s' is not a regular file", path); }
    if (st.st_size < 4) { close(fd); return llm_fail(err, "GGUF file truncated: '%s' has %lld bytes", path, (long long)st.st_size); }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return llm_fail(err, "cannot map '%s': %s", path, strerror(errno));
    if (llm_gguf_parse(g, map, (uint64_t)st.st_size, err) != 0) { munmap(map, (size_t)st.st_size); return -1; }
    g->mapped = 1;
    return 0;
}

void llm_gguf_close(llm_gguf *g) {
    if (g->kv) for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].strs);
    free(g->kv); free(g->tensors);
    if (g->mapped) munmap((void *)g->base, g->size);
    memset(g, 0, sizeof *g);
}

const llm_gguf_kv *llm_gguf_find(const llm_gguf *g, const char *key) {
    for (int64_t i = 0; i < g->n_kv; i++) if (llm_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const llm_gguf_tensor *llm_gguf_tensor_find(const llm_gguf *g, const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++) if (llm_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static int llm_gguf_scalar(uint32_t type, const uint8_t *p, int64_t *iv, double *fv) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f32; uint64_t u64; int64_t i64; double f64; } v;
    *iv = 0; *fv = 0;
    if (type >= LLM_GGUF_NTYPES || !llm_gguf_type_size[type]) return 0;
    memcpy(&v, p, llm_gguf_type_size[type]);
    switch (type) {
    case LLM_GGUF_U8: case LLM_GGUF_BOOL: *iv = v.u8; break;
    case LLM_GGUF_I8: *iv = v.i8; break;
    case LLM_GGUF_U16: *iv = v.u16; break;
    case LLM_GGUF_I16: *iv = v.i16; break;
    case LLM_GGUF_U32: *iv = v.u32; break;
    case LLM_GGUF_I32: *iv = v.i32; break;
    case LLM_GGUF_U64: *iv = (int64_t)v.u64; break;
    case LLM_GGUF_I64: *iv = v.i64; break;
    case LLM_GGUF_F32: *fv = v.f32; *iv = (int64_t)v.f32; return 1;
    case LLM_GGUF_F64: *fv = v.f64; *iv = (int64_t)v.f64; return 1;
    }
    *fv = (double)*iv;
    return 1;
}

int64_t llm_gguf_int(const llm_gguf *g, const char *key, int64_t fallback) {
    const llm_gguf_kv *kv = llm_gguf_find(g, key); int64_t iv; double fv;
    return kv && llm_gguf_scalar(kv->type, kv->data, &iv, &fv) ? iv : fallback;
}
double llm_gguf_float(const llm_gguf *g, const char *key, double fallback) {
    const llm_gguf_kv *kv = llm_gguf_find(g, key); int64_t iv; double fv;
    return kv && llm_gguf_scalar(kv->type, kv->data, &iv, &fv) ? fv : fallback;
}
llm_str llm_gguf_string(const llm_gguf *g, const char *key) {
    const llm_gguf_kv *kv = llm_gguf_find(g, key); llm_str s = {NULL, 0};
    if (kv && kv->type == LLM_GGUF_STRING) { uint64_t n; memcpy(&n, kv->data, 8); s.ptr = (const char *)kv->data + 8; s.len = n; }
    return s;
}
int64_t llm_gguf_arr_int(const llm_gguf_kv *kv, uint64_t i) {
    int64_t iv = 0; double fv;
    if (i < kv->arr_len) llm_gguf_scalar(kv->arr_type, kv->data + i * llm_gguf_type_size[kv->arr_type], &iv, &fv);
    return iv;
}
double llm_gguf_arr_float(const llm_gguf_kv *kv, uint64_t i) {
    int64_t iv = 0; double fv = 0;
    if (i < kv->arr_len) llm_gguf_scalar(kv->arr_type, kv->data + i * llm_gguf_type_size[kv->arr_type], &iv, &fv);
    return fv;
}

/* =============================================================================================================
 * 2. Model: configuration from the metadata, weights as typed pointers into the mapped file
 * =========================================================================================================== */
static const char *llm_arch_names[] = {"llama", "qwen2", "qwen3"};

/* Weights stay in the file's type; the forward pass converts one row at a time (llm_dequant_row). */
static int llm_model_weight(llm_model *m, llm_weight *w, const char *name, int64_t cols, int64_t rows, int required, char *err) {
    const llm_gguf_tensor *t = llm_gguf_tensor_find(&m->gguf, name);
    memset(w, 0, sizeof *w);
    if (!t) return required ? llm_fail(err, "model file is missing tensor '%s'", name) : 0;
    int64_t want_rows = rows ? rows : 1;
    if ((int64_t)t->ne[0] != cols || (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]) != want_rows)
        return llm_fail(err, "tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name,
                        (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)cols, (long long)want_rows);
    if (t->type == LLM_Q4_K || t->type == LLM_Q6_K)
        return llm_fail(err, "tensor '%s' has type %s, which this engine cannot compute with yet", name, llm_dtype_name(t->type));
    if (rows == 0 && t->type != LLM_F32) /* norms and biases are small: we read them as f32 directly */
        return llm_fail(err, "tensor '%s' has type %s; norm and bias tensors must be f32", name, llm_dtype_name(t->type));
    w->data = t->data; w->type = t->type; w->rows = want_rows; w->cols = cols;
    return 0;
}

static int llm_model_read_config(llm_model *m, char *err) {
    llm_gguf *g = &m->gguf;
    llm_config *c = &m->cfg;
    llm_str arch = llm_gguf_string(g, "general.architecture");
    if (!arch.ptr) return llm_fail(err, "model file has no general.architecture key");
    c->arch = -1;
    for (int i = 0; i < 3; i++) if (llm_str_eq(arch, llm_arch_names[i])) c->arch = i;
    if (c->arch < 0) return llm_fail(err, "unsupported architecture '%.*s' (supported: llama, qwen2, qwen3)", (int)arch.len, arch.ptr);
    char key[128];
#define LLM_KEY(suffix) (snprintf(key, sizeof key, "%s.%s", llm_arch_names[c->arch], suffix), key)
    c->dim = (int)llm_gguf_int(g, LLM_KEY("embedding_length"), 0);
    c->n_layers = (int)llm_gguf_int(g, LLM_KEY("block_count"), 0);
    c->ffn_dim = (int)llm_gguf_int(g, LLM_KEY("feed_forward_length"), 0);
    c->n_heads = (int)llm_gguf_int(g, LLM_KEY("attention.head_count"), 0);
    c->n_kv_heads = (int)llm_gguf_int(g, LLM_KEY("attention.head_count_kv"), c->n_heads);
    c->context_length = (int)llm_gguf_int(g, LLM_KEY("context_length"), 2048);
    c->rms_eps = (float)llm_gguf_float(g, LLM_KEY("attention.layer_norm_rms_epsilon"), 1e-5);
    c->rope_base = (float)llm_gguf_float(g, LLM_KEY("rope.freq_base"), 10000.0);
    if (c->dim <= 0 || c->n_layers <= 0 || c->ffn_dim <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->n_heads % c->n_kv_heads || c->context_length <= 0)
        return llm_fail(err, "model metadata is incomplete or inconsistent: %s.embedding_length=%d block_count=%d "
                        "feed_forward_length=%d attention.head_count=%d head_count_kv=%d", llm_arch_names[c->arch],
                        c->dim, c->n_layers, c->ffn_dim, c->n_heads, c->n_kv_heads);
    c->head_dim = (int)llm_gguf_int(g, LLM_KEY("attention.key_length"), c->dim / c->n_heads);
    c->rope_dim = (int)llm_gguf_int(g, LLM_KEY("rope.dimension_count"), c->head_dim);
#undef LLM_KEY
    if (c->head_dim <= 0 || c->rope_dim <= 0 || c->rope_dim > c->head_dim || c->rope_dim % 2)
        return llm_fail(err, "model metadata is inconsistent: head dim %d, rope dims %d", c->head_dim, c->rope_dim);
    c->rope_neox = c->arch != LLM_ARCH_LLAMA;
    const llm_gguf_tensor *emb = llm_gguf_tensor_find(g, "token_embd.weight");
    if (!emb) return llm_fail(err, "model file is missing tensor 'token_embd.weight'");
    c->vocab_size = (int)emb->ne[1];
    return 0;
}

static int llm_model_bind_weights(llm_model *m, char *err) {
    llm_config *c = &m->cfg;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    if (llm_model_weight(m, &m->tok_embd, "token_embd.weight", c->dim, c->vocab_size, 1, err) ||
        llm_model_weight(m, &m->output_norm, "output_norm.weight", c->dim, 0, 1, err) ||
        llm_model_weight(m, &m->output, "output.weight", c->dim, c->vocab_size, 0, err)) return -1;
    if (!m->output.data) m->output = m->tok_embd; /* tied output embedding */
    m->layers = (llm_layer *)calloc((size_t)c->n_layers, sizeof(llm_layer));
    if (!m->layers) return llm_fail(err, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        llm_layer *L = &m->layers[l];
        char name[96];
        int qwen2 = c->arch == LLM_ARCH_QWEN2, qwen3 = c->arch == LLM_ARCH_QWEN3;
#define LLM_W(field, suffix, cols, rows, req) \
        (snprintf(name, sizeof name, "blk.%d.%s", l, suffix), llm_model_weight(m, &L->field, name, cols, rows, req, err))
        if (LLM_W(attn_norm, "attn_norm.weight", c->dim, 0, 1) || LLM_W(wq, "attn_q.weight", c->dim, q_dim, 1) ||
            LLM_W(wk, "attn_k.weight", c->dim, kv_dim, 1) || LLM_W(wv, "attn_v.weight", c->dim, kv_dim, 1) ||
            LLM_W(wo, "attn_output.weight", q_dim, c->dim, 1) ||
            LLM_W(bq, "attn_q.bias", q_dim, 0, qwen2) || LLM_W(bk, "attn_k.bias", kv_dim, 0, qwen2) ||
            LLM_W(bv, "attn_v.bias", kv_dim, 0, qwen2) ||
            LLM_W(q_norm, "attn_q_norm.weight", c->head_dim, 0, qwen3) || LLM_W(k_norm, "attn_k_norm.weight", c->head_dim, 0, qwen3) ||
            LLM_W(ffn_norm, "ffn_norm.weight", c->dim, 0, 1) || LLM_W(w_gate, "ffn_gate.weight", c->dim, c->ffn_dim, 1) ||
            LLM_W(w_up, "ffn_up.weight", c->dim, c->ffn_dim, 1) || LLM_W(w_down, "ffn_down.weight", c->ffn_dim, c->dim, 1))
            return -1;
#undef LLM_W
    }
    return 0;
}

int llm_model_load(llm_model *m, const char *path, char *err) {
    memset(m, 0, sizeof *m);
    if (llm_gguf_open(&m->gguf, path, err) != 0) return -1;
    if (llm_model_read_config(m, err) != 0 || llm_model_bind_weights(m, err) != 0) { llm_model_free(m); return -1; }
    m->tok = llm_tokenizer_load(&m->gguf, err);
    if (!m->tok) { llm_model_free(m); return -1; }
    if (llm_vocab_size(m->tok) > m->cfg.vocab_size) {
        llm_fail(err, "tokenizer has %d tokens but the embedding only %d rows", llm_vocab_size(m->tok), m->cfg.vocab_size);
        llm_model_free(m); return -1;
    }
    llm_str name = llm_gguf_string(&m->gguf, "general.name");
    snprintf(m->name, sizeof m->name, "%.*s", name.ptr ? (int)name.len : 0, name.ptr ? name.ptr : "");
    return 0;
}

/* Dummy models: the shapes of real checkpoints (from their config.json), random weights: f16, or f32 for the
 * small CPU one ("tiny", a model the size of stories260K's big brothers, quick enough to benchmark on a laptop). */
typedef struct { const char *name; int arch, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, ctx; float rope_base; } llm_dummy_preset;
static const llm_dummy_preset llm_dummy_presets[] = {
    {"tiny",           LLM_ARCH_LLAMA, 128,   2,  4, 2,  32,  256,  2048,   2048, 10000.0f},
    {"tinyllama-1.1b", LLM_ARCH_LLAMA, 2048, 22, 32, 4,  64,  5632, 32000,  2048, 10000.0f},
    {"llama-3.2-1b",   LLM_ARCH_LLAMA, 2048, 16, 32, 8,  64,  8192, 128256, 8192, 500000.0f},
    {"qwen2.5-0.5b",   LLM_ARCH_QWEN2, 896,  24, 14, 2,  64,  4864, 151936, 4096, 1000000.0f},
};

const char *llm_dummy_preset_names(void) { return "tiny, tinyllama-1.1b, llama-3.2-1b, qwen2.5-0.5b"; }

static uint64_t llm_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float llm_rand_uniform(uint64_t *state) { return (float)(llm_splitmix64(state) >> 40) * (1.0f / 16777216.0f); }

static uint16_t llm_f32_to_f16(float f) {
    uint32_t x; memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, mant = x & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) { /* subnormal or zero */
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e), half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* round to nearest even; may carry into exp */
    return (uint16_t)half;
}

int llm_model_dummy(llm_model *m, const char *preset, uint64_t seed, char *err) {
    memset(m, 0, sizeof *m);
    const llm_dummy_preset *p = NULL;
    for (size_t i = 0; i < sizeof llm_dummy_presets / sizeof *llm_dummy_presets; i++)
        if (!strcmp(llm_dummy_presets[i].name, preset)) p = &llm_dummy_presets[i];
    if (!p) return llm_fail(err, "unknown dummy model '%s' (presets: %s)", preset, llm_dummy_preset_names());
    llm_config *c = &m->cfg;
    c->arch = p->arch; c->dim = p->dim; c->n_layers = p->n_layers; c->n_heads = p->n_heads; c->n_kv_heads = p->n_kv_heads;
    c->head_dim = p->head_dim; c->rope_dim = p->head_dim; c->ffn_dim = p->ffn_dim; c->vocab_size = p->vocab;
    c->context_length = p->ctx; c->rope_base = p->rope_base; c->rms_eps = 1e-6f; c->rope_neox = p->arch != LLM_ARCH_LLAMA;
    snprintf(m->name, sizeof m->name, "dummy:%s", p->name);
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    /* one allocation: the matrices, then the f32 norm weights and biases */
    int64_t per_layer_mat = q_dim * c->dim * 2 + kv_dim * c->dim * 2 + (int64_t)c->ffn_dim * c->dim * 3;
    int64_t n_mat = (int64_t)c->vocab_size * c->dim + per_layer_mat * c->n_layers;
    int64_t per_layer_vec = 2 * c->dim + q_dim + 2 * kv_dim + 2 * c->head_dim;
    int64_t n_vec = c->dim + per_layer_vec * c->n_layers;
    uint32_t mat_type = n_mat < ((int64_t)64 << 20) ? LLM_F32 : LLM_F16;
    size_t esize = mat_type == LLM_F32 ? 4 : 2;
    uint8_t *mat = (uint8_t *)malloc((size_t)n_mat * esize + (size_t)n_vec * 4);
    m->layers = (llm_layer *)calloc((size_t)c->n_layers, sizeof(llm_layer));
    if (!mat || !m->layers) { free(mat); free(m->layers); m->layers = NULL; return llm_fail(err, "out of memory for dummy model %s", p->name); }
    m->owned = mat;
    float *vec = (float *)(mat + (size_t)n_mat * esize);
    uint64_t rng = seed;
    /* a small table of random f16 values, tiled: filling billions of weights one by one would take longer than
     * the benchmark; the scale keeps activations bounded like a trained model's */
    float table[4096];
    uint16_t table16[4096];
    for (int i = 0; i < 4096; i++) { table[i] = (llm_rand_uniform(&rng) * 2 - 1) * 0.05f; table16[i] = llm_f32_to_f16(table[i]); }
    for (int64_t i = 0; i < n_mat; i += 4096) {
        int64_t n = n_mat - i < 4096 ? n_mat - i : 4096, shift = (int64_t)(llm_splitmix64(&rng) % 4096);
        for (int64_t j = 0; j < n; j++) {
            if (mat_type == LLM_F32) ((float *)mat)[i + j] = table[(j + shift) % 4096];
            else ((uint16_t *)mat)[i + j] = table16[(j + shift) % 4096];
        }
    }
    for (int64_t i = 0; i < n_vec; i++) vec[i] = 1.0f;
#define LLM_TAKE_MAT(w, r, cl) (w.data = mat, w.type = mat_type, w.rows = (r), w.cols = (cl), mat += (size_t)(r) * (cl) * esize)
#define LLM_TAKE_VEC(w, n) (w.data = vec, w.type = LLM_F32, w.rows = 1, w.cols = (n), vec += (n))
    LLM_TAKE_MAT(m->tok_embd, c->vocab_size, c->dim); m->output = m->tok_embd;
    LLM_TAKE_VEC(m->output_norm, c->dim);
    for (int l = 0; l < c->n_layers; l++) {
        llm_layer *L = &m->layers[l];
        LLM_TAKE_MAT(L->wq, q_dim, c->dim); LLM_TAKE_MAT(L->wk, kv_dim, c->dim); LLM_TAKE_MAT(L->wv, kv_dim, c->dim);
        LLM_TAKE_MAT(L->wo, c->dim, q_dim); LLM_TAKE_MAT(L->w_gate, c->ffn_dim, c->dim);
        LLM_TAKE_MAT(L->w_up, c->ffn_dim, c->dim); LLM_TAKE_MAT(L->w_down, c->dim, c->ffn_dim);
        LLM_TAKE_VEC(L->attn_norm, c->dim); LLM_TAKE_VEC(L->ffn_norm, c->dim);
        if (c->arch == LLM_ARCH_QWEN2) {
            LLM_TAKE_VEC(L->bq, q_dim); LLM_TAKE_VEC(L->bk, kv_dim); LLM_TAKE_VEC(L->bv, kv_dim);
            for (int64_t i = 0; i < q_dim + 2 * kv_dim; i++) vec[i - q_dim - 2 * kv_dim] = 0.0f;
        }
    }
#undef LLM_TAKE_MAT
#undef LLM_TAKE_VEC
    return 0;
}

void llm_model_free(llm_model *m) {
    if (m->tok) llm_tokenizer_free(m->tok);
    free(m->layers); free(m->owned);
    if (m->gguf.base) llm_gguf_close(&m->gguf);
    memset(m, 0, sizeof *m);
}

/* =============================================================================================================
 * 3. Tokenizer
 * =========================================================================================================== */
#include "tokenizer.inc.h" /* @@TOKENIZER@@ (being written; folded in here when done) */

/* =============================================================================================================
 * 4. Block manager: KV blocks handed out from a free list, named by hash for prefix caching
 * =========================================================================================================== */
int llm_block_manager_init(llm_block_manager *bm, int num_blocks, int block_size, int enable_prefix_caching, char *err) {
    memset(bm, 0, sizeof *bm);
    if (num_blocks <= 0 || block_size <= 0) return llm_fail(err, "the KV pool needs at least one block");
    bm->blocks = (llm_block *)calloc((size_t)num_blocks, sizeof(llm_block));
    if (!bm->blocks) return llm_fail(err, "out of memory for %d block records", num_blocks);
    bm->num_blocks = num_blocks; bm->block_size = block_size; bm->enable_prefix_caching = enable_prefix_caching;
    for (int i = 0; i < num_blocks; i++) {
        bm->blocks[i].prev_free = i - 1; bm->blocks[i].next_free = i + 1 < num_blocks ? i + 1 : -1;
        bm->blocks[i].in_free_list = 1;
    }
    bm->free_head = 0; bm->free_tail = num_blocks - 1; bm->num_free_blocks = num_blocks;
    return 0;
}

void llm_block_manager_free(llm_block_manager *bm) { free(bm->blocks); hmfree(bm->cached); memset(bm, 0, sizeof *bm); }

static void llm_free_list_remove(llm_block_manager *bm, int id) {
    llm_block *b = &bm->blocks[id];
    if (b->prev_free >= 0) bm->blocks[b->prev_free].next_free = b->next_free; else bm->free_head = b->next_free;
    if (b->next_free >= 0) bm->blocks[b->next_free].prev_free = b->prev_free; else bm->free_tail = b->prev_free;
    b->prev_free = b->next_free = -1; b->in_free_list = 0;
    bm->num_free_blocks--;
}

/* Take the least recently freed block. If it still holds a cached prefix, that cache entry dies now. */
int llm_block_alloc(llm_block_manager *bm) {
    int id = bm->free_head;
    if (id < 0) return -1;
    llm_free_list_remove(bm, id);
    llm_block *b = &bm->blocks[id];
    if (b->hashed) {
        (void)hmdel(bm->cached, b->hash);
        b->hashed = 0; bm->evictions++;
    }
    b->ref_count = 1;
    return id;
}

void llm_block_release(llm_block_manager *bm, int id) {
    llm_block *b = &bm->blocks[id];
    if (--b->ref_count > 0) return;
    b->ref_count = 0;
    b->prev_free = bm->free_tail; b->next_free = -1; b->in_free_list = 1;  /* to the tail: evicted last */
    if (bm->free_tail >= 0) bm->blocks[bm->free_tail].next_free = id; else bm->free_head = id;
    bm->free_tail = id;
    bm->num_free_blocks++;
}

uint64_t llm_block_hash(uint64_t prev_hash, const int32_t *tokens, int n) {
    uint64_t h = prev_hash ^ 0x243f6a8885a308d3ull;
    for (int i = 0; i < n; i++) { uint64_t s = h ^ (uint32_t)tokens[i]; h = llm_splitmix64(&s); }
    return h ? h : 1;
}

int llm_block_lookup(llm_block_manager *bm, uint64_t hash) {
    if (!bm->enable_prefix_caching) return -1;
    ptrdiff_t i = hmgeti(bm->cached, hash);
    if (i < 0) return -1;
    int id = bm->cached[i].value;
    if (bm->blocks[id].in_free_list) llm_free_list_remove(bm, id);
    bm->blocks[id].ref_count++;
    return id;
}

void llm_block_set_hash(llm_block_manager *bm, int id, uint64_t hash) {
    if (!bm->enable_prefix_caching || bm->blocks[id].hashed) return;
    if (hmgeti(bm->cached, hash) >= 0) return; /* the same content is cached in another block already */
    bm->blocks[id].hash = hash; bm->blocks[id].hashed = 1;
    hmput(bm->cached, hash, id);
}

/* =============================================================================================================
 * 5. Forward pass on the CPU (the reference: the CUDA kernels are checked against it)
 * =========================================================================================================== */
size_t llm_kv_bytes_per_block(const llm_config *cfg, int block_size) {
    return (size_t)2 * cfg->n_layers * block_size * cfg->n_kv_heads * cfg->head_dim * sizeof(float);
}

int llm_kv_cache_init(llm_kv_cache *kv, const llm_config *cfg, int num_blocks, int block_size, char *err) {
    memset(kv, 0, sizeof *kv);
    if (num_blocks <= 0 || block_size <= 0) return llm_fail(err, "KV cache needs at least one block of one slot");
    kv->num_blocks = num_blocks; kv->block_size = block_size;
    kv->n_layers = cfg->n_layers; kv->n_kv_heads = cfg->n_kv_heads; kv->head_dim = cfg->head_dim;
    size_t n = llm_kv_bytes_per_block(cfg, block_size) / 2 / sizeof(float) * (size_t)num_blocks;
    kv->k = (float *)calloc(n, sizeof(float));
    kv->v = (float *)calloc(n, sizeof(float));
    if (!kv->k || !kv->v) { llm_kv_cache_free(kv); return llm_fail(err, "out of memory for %d KV blocks", num_blocks); }
    return 0;
}

void llm_kv_cache_free(llm_kv_cache *kv) { free(kv->k); free(kv->v); memset(kv, 0, sizeof *kv); }

/* One row of a weight matrix as f32. Block formats: see the GGUF notes (value = q * d, or q * d + m). */
static void llm_dequant_row(uint32_t type, const void *row, float *out, int64_t n) {
    const uint8_t *p = (const uint8_t *)row;
    switch (type) {
    case LLM_F32: memcpy(out, row, (size_t)n * sizeof(float)); break;
    case LLM_F16: for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = llm_f16_to_f32(h); } break;
    case LLM_BF16: for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = llm_bf16_to_f32(h); } break;
    case LLM_Q8_0:
        for (int64_t b = 0; b < n / 32; b++, p += 34) {
            uint16_t h; memcpy(&h, p, 2); float d = llm_f16_to_f32(h);
            for (int j = 0; j < 32; j++) out[b * 32 + j] = (float)(int8_t)p[2 + j] * d;
        }
        break;
    case LLM_Q4_0: case LLM_Q4_1: {
        int has_min = type == LLM_Q4_1, bytes = has_min ? 20 : 18;
        for (int64_t b = 0; b < n / 32; b++, p += bytes) {
            uint16_t h; memcpy(&h, p, 2); float d = llm_f16_to_f32(h), mn = 0;
            if (has_min) { memcpy(&h, p + 2, 2); mn = llm_f16_to_f32(h); }
            const uint8_t *q = p + (has_min ? 4 : 2);
            for (int j = 0; j < 16; j++) {
                int lo = q[j] & 15, hi = q[j] >> 4;
                out[b * 32 + j]      = has_min ? lo * d + mn : (lo - 8) * d;
                out[b * 32 + j + 16] = has_min ? hi * d + mn : (hi - 8) * d;
            }
        }
        break;
    }
    }
}

static size_t llm_row_bytes(uint32_t type, int64_t n) { uint64_t bb = 4, bv = 1; llm_dtype_info(type, &bb, &bv); return (size_t)(n / bv * bb); }

static float llm_dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0}; /* eight running sums: the compiler keeps them in one vector register */
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; i++) s += a[i] * b[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* out[t][r] = sum_c W[r][c] * x[t][c] for the T rows of x. Each weight row is converted once and used for all
 * T inputs, so a prefill of many tokens reads the weights once: that is what batching buys on any hardware. */
static void llm_matmul(float *out, const float *x, const llm_weight *w, int T) {
    int64_t rows = w->rows, cols = w->cols;
    size_t row_bytes = llm_row_bytes(w->type, cols);
    #pragma omp parallel
    {
        float *tmp = w->type == LLM_F32 ? NULL : (float *)malloc((size_t)cols * sizeof(float));
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const void *row = (const uint8_t *)w->data + (size_t)r * row_bytes;
            const float *wr = (const float *)row;
            if (tmp) { llm_dequant_row(w->type, row, tmp, cols); wr = tmp; }
            for (int t = 0; t < T; t++) out[(size_t)t * rows + r] = llm_dot(wr, x + (size_t)t * cols, cols);
        }
        free(tmp);
    }
}

static void llm_rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
    double ss = 0; /* in double, as llama.cpp does: the mean of squares of thousands of values */
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * weight[i];
}

/* Rotate the first rope_dim values of one head by position pos. The angle of pair i is pos * base^(-2i/rope_dim),
 * built by repeated multiplication as llama.cpp does, so that greedy outputs match it bit for bit more often. */
static void llm_rope(float *x, int pos, const llm_config *c) {
    float theta_scale = powf(c->rope_base, -2.0f / (float)c->rope_dim), theta = (float)pos;
    int half = c->rope_dim / 2;
    for (int i = 0; i < half; i++, theta *= theta_scale) {
        float cs = cosf(theta), sn = sinf(theta);
        int a = c->rope_neox ? i : 2 * i, b = c->rope_neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * cs - x1 * sn;
        x[b] = x0 * sn + x1 * cs;
    }
}

static float *llm_kv_slot(const llm_kv_cache *kv, float *base, int layer, const int32_t *block_table, int pos) {
    size_t slot = (size_t)block_table[pos / kv->block_size] * kv->block_size + (size_t)(pos % kv->block_size);
    size_t per_slot = (size_t)kv->n_kv_heads * kv->head_dim;
    return base + ((size_t)layer * kv->num_blocks * kv->block_size + slot) * per_slot;
}

int llm_forward_cpu(const llm_model *m, llm_kv_cache *kv, const llm_batch *b, float *logits, char *err) {
    const llm_config *c = &m->cfg;
    int T = b->n_tokens, D = c->dim, hd = c->head_dim;
    int q_dim = c->n_heads * hd, kv_dim = c->n_kv_heads * hd, group = c->n_heads / c->n_kv_heads;
    if (T <= 0) return 0;
    if (kv->n_kv_heads != c->n_kv_heads || kv->head_dim != hd || kv->n_layers != c->n_layers)
        return llm_fail(err, "KV cache shape does not match the model");
    int max_ctx = 0;
    int32_t *tok_seq = (int32_t *)malloc((size_t)T * sizeof(int32_t)); /* which sequence each token belongs to */
    for (int s = 0; s < b->n_seqs; s++)
        for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i++) {
            tok_seq[i] = s;
            if (b->positions[i] + 1 > max_ctx) max_ctx = b->positions[i] + 1;
        }
    for (int i = 0; i < T; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size) { free(tok_seq); return llm_fail(err, "token id %d outside the vocabulary", b->tokens[i]); }
    int H = c->ffn_dim > q_dim ? c->ffn_dim : q_dim;
    float *x = (float *)malloc((size_t)T * D * sizeof(float)), *xn = (float *)malloc((size_t)T * (D > q_dim ? D : q_dim) * sizeof(float));
    float *q = (float *)malloc((size_t)T * q_dim * sizeof(float)), *k = (float *)malloc((size_t)T * kv_dim * sizeof(float));
    float *v = (float *)malloc((size_t)T * kv_dim * sizeof(float)), *att = (float *)malloc((size_t)T * q_dim * sizeof(float));
    float *h1 = (float *)malloc((size_t)T * H * sizeof(float)), *h2 = (float *)malloc((size_t)T * H * sizeof(float));
    float *xo = (float *)malloc((size_t)T * D * sizeof(float));
    if (!x || !xn || !q || !k || !v || !att || !h1 || !h2 || !xo) {
        free(tok_seq); free(x); free(xn); free(q); free(k); free(v); free(att); free(h1); free(h2); free(xo);
        return llm_fail(err, "out of memory in the forward pass (%d tokens)", T);
    }
    for (int t = 0; t < T; t++)
        llm_dequant_row(m->tok_embd.type, (const uint8_t *)m->tok_embd.data + llm_row_bytes(m->tok_embd.type, D) * (size_t)b->tokens[t], x + (size_t)t * D, D);

    for (int l = 0; l < c->n_layers; l++) {
        const llm_layer *L = &m->layers[l];
        for (int t = 0; t < T; t++) llm_rmsnorm(xn + (size_t)t * D, x + (size_t)t * D, (const float *)L->attn_norm.data, D, c->rms_eps);
        llm_matmul(q, xn, &L->wq, T); llm_matmul(k, xn, &L->wk, T); llm_matmul(v, xn, &L->wv, T);
        for (int t = 0; t < T; t++) {
            float *qt = q + (size_t)t * q_dim, *kt = k + (size_t)t * kv_dim, *vt = v + (size_t)t * kv_dim;
            if (L->bq.data) {
                for (int i = 0; i < q_dim; i++) qt[i] += ((const float *)L->bq.data)[i];
                for (int i = 0; i < kv_dim; i++) kt[i] += ((const float *)L->bk.data)[i];
                for (int i = 0; i < kv_dim; i++) vt[i] += ((const float *)L->bv.data)[i];
            }
            for (int h = 0; h < c->n_heads; h++) {
                if (L->q_norm.data) llm_rmsnorm(qt + h * hd, qt + h * hd, (const float *)L->q_norm.data, hd, c->rms_eps);
                llm_rope(qt + h * hd, b->positions[t], c);
            }
            for (int h = 0; h < c->n_kv_heads; h++) {
                if (L->k_norm.data) llm_rmsnorm(kt + h * hd, kt + h * hd, (const float *)L->k_norm.data, hd, c->rms_eps);
                llm_rope(kt + h * hd, b->positions[t], c);
            }
            const int32_t *bt = b->block_tables[tok_seq[t]];
            memcpy(llm_kv_slot(kv, kv->k, l, bt, b->positions[t]), kt, (size_t)kv_dim * sizeof(float));
            memcpy(llm_kv_slot(kv, kv->v, l, bt, b->positions[t]), vt, (size_t)kv_dim * sizeof(float));
        }
        /* attention: every (token, head) pair is independent once this step's K/V are in the cache */
        float scale = 1.0f / sqrtf((float)hd);
        #pragma omp parallel
        {
            float *scores = (float *)malloc((size_t)max_ctx * sizeof(float));
            #pragma omp for schedule(dynamic, 4)
            for (int th = 0; th < T * c->n_heads; th++) {
                int t = th / c->n_heads, h = th % c->n_heads, kvh = h / group, n_ctx = b->positions[t] + 1;
                const int32_t *bt = b->block_tables[tok_seq[t]];
                const float *qh = q + (size_t)t * q_dim + h * hd;
                float mx = -INFINITY;
                for (int p = 0; p < n_ctx; p++) {
                    scores[p] = llm_dot(qh, llm_kv_slot(kv, kv->k, l, bt, p) + kvh * hd, hd) * scale;
                    if (scores[p] > mx) mx = scores[p];
                }
                float sum = 0;
                for (int p = 0; p < n_ctx; p++) { scores[p] = expf(scores[p] - mx); sum += scores[p]; }
                float *out = att + (size_t)t * q_dim + h * hd;
                memset(out, 0, (size_t)hd * sizeof(float));
                for (int p = 0; p < n_ctx; p++) {
                    const float *vp = llm_kv_slot(kv, kv->v, l, bt, p) + kvh * hd;
                    float w = scores[p] / sum;
                    for (int i = 0; i < hd; i++) out[i] += w * vp[i];
                }
            }
            free(scores);
        }
        llm_matmul(xo, att, &L->wo, T);
        for (size_t i = 0; i < (size_t)T * D; i++) x[i] += xo[i];

        for (int t = 0; t < T; t++) llm_rmsnorm(xn + (size_t)t * D, x + (size_t)t * D, (const float *)L->ffn_norm.data, D, c->rms_eps);
        llm_matmul(h1, xn, &L->w_gate, T); llm_matmul(h2, xn, &L->w_up, T);
        for (size_t i = 0; i < (size_t)T * c->ffn_dim; i++) h1[i] = h1[i] / (1.0f + expf(-h1[i])) * h2[i];
        llm_matmul(xo, h1, &L->w_down, T);
        for (size_t i = 0; i < (size_t)T * D; i++) x[i] += xo[i];
    }
    /* logits only for the rows that need them: a prefill of 500 tokens samples once */
    for (int i = 0; i < b->n_logits; i++)
        llm_rmsnorm(xn + (size_t)i * D, x + (size_t)b->logit_rows[i] * D, (const float *)m->output_norm.data, D, c->rms_eps);
    llm_matmul(logits, xn, &m->output, b->n_logits);
    free(tok_seq); free(x); free(xn); free(q); free(k); free(v); free(att); free(h1); free(h2); free(xo);
    return 0;
}

/* =============================================================================================================
 * 6. Sampler
 * =========================================================================================================== */
llm_sampling_params llm_sampling_defaults(void) {
    llm_sampling_params p;
    memset(&p, 0, sizeof p);
    p.n = 1; p.temperature = 1.0f; p.top_p = 1.0f; p.repetition_penalty = 1.0f; p.seed = -1; p.logprobs = -1;
    return p;
}

static int llm_argmax(const float *x, int n) { int best = 0; for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i; return best; }

typedef struct { float p; int32_t id; } llm_prob_id;
static int llm_prob_desc(const void *a, const void *b) {
    const llm_prob_id *x = (const llm_prob_id *)a, *y = (const llm_prob_id *)b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;  /* ties in id order, so that a seed always gives the same choice */
}

int llm_sampler_candidates(const llm_sampling_params *p, const float *logits, int n_vocab, int32_t *ids, float *probs) {
    if (p->temperature <= 0.0f || p->top_k == 1) { ids[0] = llm_argmax(logits, n_vocab); probs[0] = 1.0f; return 1; }
    llm_prob_id *c = (llm_prob_id *)malloc((size_t)n_vocab * sizeof *c);
    if (!c) { ids[0] = llm_argmax(logits, n_vocab); probs[0] = 1.0f; return 1; }
    float mx = logits[llm_argmax(logits, n_vocab)], inv_t = 1.0f / p->temperature;
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) { c[i].id = i; c[i].p = expf((logits[i] - mx) * inv_t); sum += c[i].p; }
    int n = n_vocab;
    int need_order = (p->top_k > 0 && p->top_k < n_vocab) || p->top_p < 1.0f;
    if (need_order) qsort(c, (size_t)n, sizeof *c, llm_prob_desc);
    if (p->top_k > 0 && p->top_k < n) {
        n = p->top_k; sum = 0;
        for (int i = 0; i < n; i++) sum += c[i].p;
    }
    if (p->top_p < 1.0f) { /* the smallest head of the distribution whose mass reaches top_p */
        double cum = 0; int keep = n;
        for (int i = 0; i < n; i++) { cum += c[i].p / sum; if (cum >= p->top_p) { keep = i + 1; break; } }
        n = keep; sum = 0;
        for (int i = 0; i < n; i++) sum += c[i].p;
    }
    if (p->min_p > 0.0f) { /* relative to the most likely token, whose weight exp(0) is 1 */
        int keep = 0; double s = 0;
        for (int i = 0; i < n; i++) if (c[i].p >= p->min_p) { c[keep++] = c[i]; s += c[i].p; }
        n = keep; sum = s;
    }
    for (int i = 0; i < n; i++) { ids[i] = c[i].id; probs[i] = (float)(c[i].p / sum); }
    free(c);
    return n;
}

static void llm_apply_penalties(const llm_sampling_params *p, float *logits, int n_vocab, const int32_t *history, int n_prompt, int n_history) {
    if (p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    int *count = (int *)calloc((size_t)n_vocab, sizeof(int));  /* occurrences in the output */
    unsigned char *seen = (unsigned char *)calloc((size_t)n_vocab, 1); /* in prompt or output */
    if (!count || !seen) { free(count); free(seen); return; }
    for (int i = 0; i < n_history; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= n_vocab) continue;
        seen[t] = 1;
        if (i >= n_prompt) count[t]++;
    }
    for (int t = 0; t < n_vocab; t++) {
        if (seen[t] && p->repetition_penalty != 1.0f)
            logits[t] = logits[t] > 0 ? logits[t] / p->repetition_penalty : logits[t] * p->repetition_penalty;
        if (count[t]) logits[t] -= p->presence_penalty + p->frequency_penalty * (float)count[t];
    }
    free(count); free(seen);
}

int32_t llm_sample(const llm_sampling_params *p, float *logits, int n_vocab, const int32_t *history, int n_prompt,
                   int n_history, uint64_t *rng_state) {
    llm_apply_penalties(p, logits, n_vocab, history, n_prompt, n_history);
    if (p->temperature <= 0.0f || p->top_k == 1) return llm_argmax(logits, n_vocab);
    int32_t *ids = (int32_t *)malloc((size_t)n_vocab * sizeof(int32_t));
    float *probs = (float *)malloc((size_t)n_vocab * sizeof(float));
    if (!ids || !probs) { free(ids); free(probs); return llm_argmax(logits, n_vocab); }
    int n = llm_sampler_candidates(p, logits, n_vocab, ids, probs);
    float u = llm_rand_uniform(rng_state), cum = 0;
    int32_t pick = ids[n - 1];
    for (int i = 0; i < n; i++) { cum += probs[i]; if (u < cum) { pick = ids[i]; break; } }
    free(ids); free(probs);
    return pick;
}

/* =============================================================================================================
 * 7. Engine: requests, the scheduler, stop conditions, outputs
 * A request of n samples starts as one sequence; when its prompt is computed it forks into n sequences that
 * share the prompt's blocks. Every sequence goes the same way: its tokens [0, n_computed) have K/V in the cache;
 * each step computes the next chunk of the rest (a prompt chunk, or the one newest token), and when a step
 * reaches the end of its tokens, samples one more. Prefill, chunked prefill, decode and recompute after
 * preemption are all this one loop.
 * =========================================================================================================== */
#include <pthread.h>
#include <time.h>

typedef struct llm_request {
    uint64_t id;
    llm_sampling_params params;     /* stop strings and stop ids point at the copies below */
    char **stop_copies;
    int32_t *stop_ids_copy;
    int max_stop_len;
    int n_prompt;
    int refs;                       /* sequences still pointing here */
} llm_request;

enum { LLM_SEQ_WAITING, LLM_SEQ_RUNNING, LLM_SEQ_FINISHED };

typedef struct llm_seq {
    llm_request *req;
    int index;
    int32_t *tokens;                /* stb_ds array: prompt, then generated tokens */
    int n_computed;
    int32_t *block_table;           /* stb_ds array */
    int n_hashed_blocks;            /* leading full blocks that carry their prefix hash */
    uint64_t last_hash;
    uint64_t rng;
    int fork_pending;               /* n > 1 and the prompt is not computed yet */
    int n_cached_tokens;
    int finish_reason;
    int status;
    llm_detok detok;
    char *held_text;                /* stb_ds array: decoded text not yet emitted (could begin a stop string) */
    int32_t *out_tokens; char *out_text; float *out_logprobs; int32_t *out_top_ids; float *out_top_logprobs;
} llm_seq;

struct llm_engine {
    llm_engine_config cfg;
    llm_model model;
    llm_backend *backend;
    llm_block_manager bm;
    int max_model_len;
    llm_seq **waiting, **running;   /* stb_ds arrays; waiting is served from the front */
    llm_seq **finished;             /* finished last step: freed at the start of the next */
    int static_batch_open;
    pthread_mutex_t lock;           /* guards the inbox and next_id */
    llm_seq **inbox;
    uint64_t *inbox_abort;
    uint64_t next_id;
    llm_engine_stats stats;
    /* per-step scratch */
    int32_t *b_tokens, *b_positions, *b_seq_start, *b_logit_rows;
    const int32_t **b_tables;
    llm_seq **sched; int *sched_new;
    float *logits, *logits_copy;
    int logits_rows;
    llm_output *outputs;
};

const char *llm_finish_reason_name(int reason) {
    switch (reason) { case LLM_FINISH_STOP: return "stop"; case LLM_FINISH_LENGTH: return "length"; case LLM_FINISH_ABORT: return "abort"; }
    return NULL;
}

/* ---- the CPU backend: the KV cache in host memory and llm_forward_cpu ---- */
static int llm_cpu_forward(llm_backend *be, const llm_model *m, const llm_batch *b, float *logits, char *err) {
    return llm_forward_cpu(m, (llm_kv_cache *)be->ctx, b, logits, err);
}
static int llm_cpu_copy_block(llm_backend *be, int src, int dst, char *err) {
    (void)err;
    llm_kv_cache *kv = (llm_kv_cache *)be->ctx;
    size_t per_block = (size_t)kv->block_size * kv->n_kv_heads * kv->head_dim;
    for (int l = 0; l < kv->n_layers; l++) {
        size_t layer = (size_t)l * kv->num_blocks * per_block;
        memcpy(kv->k + layer + (size_t)dst * per_block, kv->k + layer + (size_t)src * per_block, per_block * sizeof(float));
        memcpy(kv->v + layer + (size_t)dst * per_block, kv->v + layer + (size_t)src * per_block, per_block * sizeof(float));
    }
    return 0;
}
static void llm_cpu_destroy(llm_backend *be) { llm_kv_cache_free((llm_kv_cache *)be->ctx); free(be->ctx); free(be); }

llm_backend *llm_cpu_backend_create(const llm_model *m, int num_blocks, int block_size, char *err) {
    llm_backend *be = (llm_backend *)calloc(1, sizeof *be);
    llm_kv_cache *kv = (llm_kv_cache *)calloc(1, sizeof *kv);
    if (!be || !kv || llm_kv_cache_init(kv, &m->cfg, num_blocks, block_size, err) != 0) {
        if (!be || !kv) llm_fail(err, "out of memory");
        free(be); free(kv); return NULL;
    }
    be->name = "cpu"; be->ctx = kv; be->num_blocks = num_blocks; be->block_size = block_size;
    be->forward = llm_cpu_forward; be->copy_block = llm_cpu_copy_block; be->destroy = llm_cpu_destroy;
    return be;
}

/* ---- creation ---- */
llm_engine *llm_engine_create(const llm_engine_config *cfg_in, char *err) {
    llm_engine *e = (llm_engine *)calloc(1, sizeof *e);
    if (!e) { llm_fail(err, "out of memory"); return NULL; }
    e->cfg = *cfg_in;
    llm_engine_config *cfg = &e->cfg;
    if (cfg->block_size <= 0) cfg->block_size = 16;
    if (cfg->max_num_seqs <= 0) cfg->max_num_seqs = 256;
    if (cfg->max_num_batched_tokens <= 0) cfg->max_num_batched_tokens = 2048;
    pthread_mutex_init(&e->lock, NULL);
    e->next_id = 1;
    int rc = cfg->dummy ? llm_model_dummy(&e->model, cfg->dummy, cfg->dummy_seed, err)
           : cfg->model_path ? llm_model_load(&e->model, cfg->model_path, err)
           : llm_fail(err, "no model given");
    if (rc != 0) { pthread_mutex_destroy(&e->lock); free(e); return NULL; }
    e->max_model_len = e->model.cfg.context_length;
    if (cfg->max_model_len > 0 && cfg->max_model_len < e->max_model_len) e->max_model_len = cfg->max_model_len;
    size_t per_block = llm_kv_bytes_per_block(&e->model.cfg, cfg->block_size);
#ifdef LLM_CUDA
    if (!cfg->cpu) {
        char cuda_err[LLM_ERR_LEN];
        e->backend = llm_cuda_backend_create(&e->model, cfg->num_blocks, cfg->kv_bytes, cfg->block_size, cuda_err);
        if (!e->backend) fprintf(stderr, "llm: %s; running on the CPU\n", cuda_err);
    }
#endif
    if (!e->backend) {
        int num_blocks = cfg->num_blocks;
        if (num_blocks <= 0) {
            /* enough for max_num_seqs full contexts, at most kv_bytes (default 4 GiB, as vLLM's CPU backend) */
            size_t budget = cfg->kv_bytes ? cfg->kv_bytes : ((size_t)4 << 30);
            size_t want = (size_t)cfg->max_num_seqs * ((e->max_model_len + cfg->block_size - 1) / cfg->block_size);
            num_blocks = (int)(budget / per_block < want ? budget / per_block : want);
        }
        e->backend = llm_cpu_backend_create(&e->model, num_blocks, cfg->block_size, err);
        if (!e->backend) { llm_model_free(&e->model); pthread_mutex_destroy(&e->lock); free(e); return NULL; }
    }
    if (llm_block_manager_init(&e->bm, e->backend->num_blocks, cfg->block_size, !cfg->disable_prefix_caching, err) != 0) {
        llm_engine_destroy(e); return NULL;
    }
    e->static_batch_open = 1;
    return e;
}

const llm_model *llm_engine_model(const llm_engine *e) { return &e->model; }
const char *llm_engine_backend_name(const llm_engine *e) { return e->backend->name; }

static void llm_request_unref(llm_request *r) {
    if (--r->refs > 0) return;
    for (int i = 0; i < r->params.n_stop; i++) free(r->stop_copies[i]);
    free(r->stop_copies); free(r->stop_ids_copy); free(r);
}

static void llm_seq_free(llm_seq *s) {
    arrfree(s->tokens); arrfree(s->block_table); arrfree(s->held_text);
    arrfree(s->out_tokens); arrfree(s->out_text); arrfree(s->out_logprobs); arrfree(s->out_top_ids); arrfree(s->out_top_logprobs);
    llm_request_unref(s->req);
    free(s);
}

static void llm_seq_release_blocks(llm_engine *e, llm_seq *s) {
    for (int i = 0; i < arrlen(s->block_table); i++) llm_block_release(&e->bm, s->block_table[i]);
    arrsetlen(s->block_table, 0);
    s->n_computed = 0; s->n_hashed_blocks = 0; s->last_hash = 0;
}

void llm_engine_destroy(llm_engine *e) {
    if (!e) return;
    llm_seq **all[4] = {e->waiting, e->running, e->finished, e->inbox};
    for (int k = 0; k < 4; k++) for (int i = 0; i < arrlen(all[k]); i++) llm_seq_free(all[k][i]);
    arrfree(e->waiting); arrfree(e->running); arrfree(e->finished); arrfree(e->inbox); arrfree(e->inbox_abort);
    arrfree(e->b_tokens); arrfree(e->b_positions); arrfree(e->b_seq_start); arrfree(e->b_logit_rows); arrfree(e->b_tables);
    arrfree(e->sched); arrfree(e->sched_new); arrfree(e->outputs);
    free(e->logits); free(e->logits_copy);
    if (e->backend) e->backend->destroy(e->backend);
    llm_block_manager_free(&e->bm);
    llm_model_free(&e->model);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

/* ---- admission ---- */
static uint64_t llm_seed_mix(int64_t seed, int index) {
    uint64_t s = seed >= 0 ? (uint64_t)seed : ((uint64_t)time(NULL) ^ ((uint64_t)clock() << 20) ^ (uint64_t)(uintptr_t)&seed);
    s += 0x632be59bd9b4e019ull * (uint64_t)(index + 1);
    return llm_splitmix64(&s);
}

uint64_t llm_engine_add_request(llm_engine *e, const char *prompt, const int32_t *prompt_ids, int n_prompt_ids,
                                const llm_sampling_params *p, char *err) {
    const llm_config *c = &e->model.cfg;
    if (p->n < 1 || p->n > 128) { llm_fail(err, "n must be between 1 and 128, got %d", p->n); return 0; }
    if (!(p->temperature >= 0.0f)) { llm_fail(err, "temperature must be >= 0"); return 0; }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) { llm_fail(err, "top_p must be in (0, 1]"); return 0; }
    if (p->top_k < 0) { llm_fail(err, "top_k must be >= 0 (0 disables it)"); return 0; }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) { llm_fail(err, "min_p must be in [0, 1]"); return 0; }
    if (!(p->repetition_penalty > 0.0f)) { llm_fail(err, "repetition_penalty must be > 0"); return 0; }
    if (!(fabsf(p->presence_penalty) <= 2.0f && fabsf(p->frequency_penalty) <= 2.0f)) { llm_fail(err, "presence_penalty and frequency_penalty must be in [-2, 2]"); return 0; }
    if (p->max_tokens < 0) { llm_fail(err, "max_tokens must be >= 0"); return 0; }
    if (p->logprobs > 20) { llm_fail(err, "logprobs must be at most 20"); return 0; }
    if (p->n_stop < 0 || p->n_stop > 16 || p->n_stop_token_ids < 0) { llm_fail(err, "at most 16 stop strings"); return 0; }
    int32_t *ids = NULL;
    if (prompt_ids) {
        for (int i = 0; i < n_prompt_ids; i++)
            if (prompt_ids[i] < 0 || prompt_ids[i] >= c->vocab_size) { llm_fail(err, "prompt token id %d is outside the vocabulary (0..%d)", prompt_ids[i], c->vocab_size - 1); return 0; }
        arrsetlen(ids, n_prompt_ids);
        if (n_prompt_ids) memcpy(ids, prompt_ids, (size_t)n_prompt_ids * sizeof(int32_t));
    } else {
        if (!e->model.tok) { llm_fail(err, "this model has no tokenizer: give prompt token ids"); return 0; }
        const char *text = prompt ? prompt : "";
        size_t len = strlen(text);
        int cap = (int)len + 8, bos = llm_tokenizer_adds_bos(e->model.tok);
        arrsetlen(ids, cap);
        int n = llm_tokenize(e->model.tok, text, len, bos, 1, ids, cap);
        if (n > cap) { arrsetlen(ids, n); n = llm_tokenize(e->model.tok, text, len, bos, 1, ids, n); }
        if (n < 0) { arrfree(ids); llm_fail(err, "could not tokenize the prompt"); return 0; }
        arrsetlen(ids, n);
    }
    int n_prompt = (int)arrlen(ids);
    int blocks_needed = (n_prompt + 1 + e->cfg.block_size - 1) / e->cfg.block_size;
    if (n_prompt == 0) { arrfree(ids); llm_fail(err, "the prompt is empty"); return 0; }
    if (n_prompt >= e->max_model_len) {
        arrfree(ids);
        llm_fail(err, "the prompt has %d tokens, but this model's context is %d tokens (the prompt and at least one new token must fit)", n_prompt, e->max_model_len);
        return 0;
    }
    if (blocks_needed > e->bm.num_blocks) {
        arrfree(ids);
        llm_fail(err, "the prompt needs %d KV blocks but the whole pool has %d", blocks_needed, e->bm.num_blocks);
        return 0;
    }
    llm_request *r = (llm_request *)calloc(1, sizeof *r);
    llm_seq *s = (llm_seq *)calloc(1, sizeof *s);
    if (!r || !s) { free(r); free(s); arrfree(ids); llm_fail(err, "out of memory"); return 0; }
    r->params = *p; r->n_prompt = n_prompt; r->refs = 1;
    r->params.stop = NULL; r->params.stop_token_ids = NULL;
    if (p->n_stop) {
        r->stop_copies = (char **)calloc((size_t)p->n_stop, sizeof(char *));
        for (int i = 0; i < p->n_stop; i++) {
            r->stop_copies[i] = strdup(p->stop[i] ? p->stop[i] : "");
            int len = (int)strlen(r->stop_copies[i]);
            if (len > r->max_stop_len) r->max_stop_len = len;
        }
        r->params.stop = (const char *const *)r->stop_copies;
    }
    if (p->n_stop_token_ids) {
        r->stop_ids_copy = (int32_t *)malloc((size_t)p->n_stop_token_ids * sizeof(int32_t));
        memcpy(r->stop_ids_copy, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof(int32_t));
        r->params.stop_token_ids = r->stop_ids_copy;
    }
    s->req = r; s->tokens = ids; s->rng = llm_seed_mix(p->seed, 0); s->fork_pending = p->n > 1;
    s->status = LLM_SEQ_WAITING;
    pthread_mutex_lock(&e->lock);
    r->id = e->next_id++;
    arrput(e->inbox, s);
    pthread_mutex_unlock(&e->lock);
    return r->id;
}

void llm_engine_abort(llm_engine *e, uint64_t request_id) {
    pthread_mutex_lock(&e->lock);
    arrput(e->inbox_abort, request_id);
    pthread_mutex_unlock(&e->lock);
}

int llm_engine_has_work(llm_engine *e) {
    pthread_mutex_lock(&e->lock);
    int n = (int)(arrlen(e->inbox) + arrlen(e->inbox_abort));
    pthread_mutex_unlock(&e->lock);
    return n > 0 || arrlen(e->waiting) > 0 || arrlen(e->running) > 0;
}

llm_engine_stats llm_engine_get_stats(llm_engine *e) {
    llm_engine_stats s = e->stats;
    s.running = (int)arrlen(e->running); s.waiting = (int)arrlen(e->waiting);
    s.num_blocks = e->bm.num_blocks; s.num_free_blocks = e->bm.num_free_blocks;
    s.num_cached_blocks = (int)hmlen(e->bm.cached);
    for (int i = 0; i < arrlen(e->running); i++) s.kv_tokens += e->running[i]->n_computed;
    return s;
}

/* ---- stop conditions and text ---- */
static void llm_seq_finish(llm_engine *e, llm_seq *s, int reason) {
    s->finish_reason = reason; s->status = LLM_SEQ_FINISHED;
    llm_seq_release_blocks(e, s);
    e->stats.requests_finished++;
}

/* The longest tail of text that is the beginning of a stop string: it must wait for the next token. */
static int llm_stop_holdback(const llm_request *r, const char *text, int len) {
    int hold = 0;
    for (int i = 0; i < r->params.n_stop; i++) {
        const char *stop = r->params.stop[i];
        int sl = (int)strlen(stop);
        for (int k = sl - 1 < len ? sl - 1 : len; k > hold; k--)
            if (memcmp(text + len - k, stop, (size_t)k) == 0) { hold = k; break; }
    }
    return hold;
}

/* Append a token's text to what is held; emit what can no longer be part of a stop string. */
static void llm_seq_add_text(llm_seq *s, int32_t token, const llm_tokenizer *tok, int finishing) {
    if (tok) { /* a detok step writes at most 3 bytes (U+FFFD) per byte of the piece and of what it held */
        int piece = llm_token_to_piece(tok, token, 0, NULL, 0);
        if (piece < 0) piece = 0;
        int cap = 3 * (piece + 8) + 16;
        char *buf = (char *)malloc((size_t)cap);
        int n = token >= 0 ? llm_detok_push(tok, &s->detok, token, buf, cap) : 0;
        if (finishing) n += llm_detok_flush(&s->detok, buf + n, cap - n);
        memcpy(arraddnptr(s->held_text, n), buf, (size_t)n);
        free(buf);
    }
    llm_request *r = s->req;
    int len = (int)arrlen(s->held_text);
    for (int i = 0; i < r->params.n_stop; i++) {
        const char *stop = r->params.stop[i];
        int sl = (int)strlen(stop);
        if (sl == 0) continue;
        for (int at = 0; at + sl <= len; at++)
            if (memcmp(s->held_text + at, stop, (size_t)sl) == 0) { len = at; s->finish_reason = LLM_FINISH_STOP; break; }
    }
    int emit = s->finish_reason || finishing ? len : len - llm_stop_holdback(r, s->held_text, len);
    memcpy(arraddnptr(s->out_text, emit), s->held_text, (size_t)emit);
    if (s->finish_reason) arrsetlen(s->held_text, 0);
    else { memmove(s->held_text, s->held_text + emit, (size_t)(arrlen(s->held_text) - emit)); arrsetlen(s->held_text, arrlen(s->held_text) - emit); }
}

/* One sampled token: logprobs, stop conditions, text. Returns 1 when the sequence finished. */
static int llm_seq_accept(llm_engine *e, llm_seq *s, float *logits) {
    const llm_sampling_params *p = &s->req->params;
    int V = e->model.cfg.vocab_size;
    float lse = 0;
    if (p->logprobs >= 0) { /* from the model's own distribution, before penalties and temperature (as vLLM) */
        float mx = logits[llm_argmax(logits, V)]; double sum = 0;
        for (int i = 0; i < V; i++) sum += exp((double)(logits[i] - mx));
        lse = mx + (float)log(sum);
        int K = p->logprobs < V ? p->logprobs : V;
        int32_t *top = arraddnptr(s->out_top_ids, K);
        float *top_lp = arraddnptr(s->out_top_logprobs, K);
        int have = 0;
        for (int i = 0; i < V && K > 0; i++) { /* insertion into a sorted list of K: K is small */
            if (have == K && logits[i] <= logits[top[K - 1]]) continue;
            int j = have < K ? have++ : K - 1;
            while (j > 0 && logits[top[j - 1]] < logits[i]) { top[j] = top[j - 1]; j--; }
            top[j] = i;
        }
        for (int k = 0; k < K; k++) top_lp[k] = logits[top[k]] - lse;
        if (!e->logits_copy) e->logits_copy = (float *)malloc((size_t)V * sizeof(float));
        memcpy(e->logits_copy, logits, (size_t)V * sizeof(float));
    }
    int32_t token = llm_sample(p, logits, V, s->tokens, s->req->n_prompt, (int)arrlen(s->tokens), &s->rng);
    if (p->logprobs >= 0) arrput(s->out_logprobs, e->logits_copy[token] - lse);
    arrput(s->tokens, token); arrput(s->out_tokens, token);
    e->stats.generation_tokens++;
    int n_generated = (int)arrlen(s->tokens) - s->req->n_prompt;
    int reason = LLM_FINISH_NONE;
    const llm_tokenizer *tok = e->model.tok;
    if ((!p->ignore_eos && tok && llm_token_is_eog(tok, token))) reason = LLM_FINISH_STOP;
    for (int i = 0; i < p->n_stop_token_ids; i++) if (p->stop_token_ids[i] == token) reason = LLM_FINISH_STOP;
    if (!reason && ((p->max_tokens > 0 && n_generated >= p->max_tokens) || arrlen(s->tokens) >= e->max_model_len))
        reason = LLM_FINISH_LENGTH;
    /* the stop token's own text is not output */
    llm_seq_add_text(s, reason == LLM_FINISH_STOP ? -1 : token, tok, reason != LLM_FINISH_NONE);
    if (s->finish_reason) reason = s->finish_reason;  /* a stop string */
    if (reason) { llm_seq_finish(e, s, reason); return 1; }
    return 0;
}

/* ---- scheduling ---- */
/* Blocks for positions [0, n_total), a private copy of any shared block about to be written. */
static int llm_seq_reserve(llm_engine *e, llm_seq *s, int n_total, char *err) {
    int bs = e->cfg.block_size;
    for (int b = s->n_computed / bs; b < arrlen(s->block_table) && b * bs < n_total; b++) {
        int old = s->block_table[b];
        if (e->bm.blocks[old].ref_count <= 1) continue;
        int fresh = llm_block_alloc(&e->bm);
        if (fresh < 0) return 0;
        if (e->backend->copy_block(e->backend, old, fresh, err) != 0) { llm_block_release(&e->bm, fresh); return -1; }
        llm_block_release(&e->bm, old);
        s->block_table[b] = fresh;
    }
    while (arrlen(s->block_table) * bs < n_total) {
        int id = llm_block_alloc(&e->bm);
        if (id < 0) return 0;
        arrput(s->block_table, id);
    }
    return 1;
}

/* The longest run of whole cached blocks at the start of the tokens, leaving at least one token to compute. */
static void llm_seq_take_cached_prefix(llm_engine *e, llm_seq *s) {
    int bs = e->cfg.block_size, n = (int)arrlen(s->tokens);
    e->stats.prefix_cache_queries += n;
    if (!e->bm.enable_prefix_caching) return;
    uint64_t h = 0;
    for (int b = 0; (b + 1) * bs <= n - 1; b++) {
        uint64_t hb = llm_block_hash(h, s->tokens + b * bs, bs);
        int id = llm_block_lookup(&e->bm, hb);
        if (id < 0) break;
        arrput(s->block_table, id);
        h = hb; s->n_hashed_blocks = b + 1; s->last_hash = hb; s->n_computed = (b + 1) * bs;
    }
    e->stats.prefix_cache_hits += s->n_computed;
    if (s->n_cached_tokens == 0) s->n_cached_tokens = s->n_computed;
}

static void llm_preempt(llm_engine *e, llm_seq *s) {
    llm_seq_release_blocks(e, s);
    s->status = LLM_SEQ_WAITING;
    arrins(e->waiting, 0, s);
    e->stats.preemptions++;
}

static void llm_schedule(llm_engine *e, char *err) {
    int budget = e->cfg.max_num_batched_tokens, preempted = 0;
    arrsetlen(e->sched, 0); arrsetlen(e->sched_new, 0);
    for (int i = 0; i < arrlen(e->running) && budget > 0; i++) {
        llm_seq *s = e->running[i];
        int n_new = (int)arrlen(s->tokens) - s->n_computed;
        if (n_new > budget) n_new = budget;
        int ok;
        while ((ok = llm_seq_reserve(e, s, s->n_computed + n_new, err)) == 0) {
            /* out of blocks: the youngest running sequence gives its blocks back and waits to be recomputed */
            llm_seq *victim = arrpop(e->running);
            llm_preempt(e, victim);
            preempted = 1;
            if (victim == s) break;
        }
        if (ok != 1) { if (ok < 0) return; break; }
        arrput(e->sched, s); arrput(e->sched_new, n_new);
        budget -= n_new;
    }
    if (preempted) return;
    if (e->cfg.static_batching) {
        if (arrlen(e->running) == 0) e->static_batch_open = 1;
        if (!e->static_batch_open) return;
    }
    while (arrlen(e->waiting) > 0 && budget > 0) {
        llm_seq *s = e->waiting[0];
        int width = s->fork_pending ? s->req->params.n : 1;
        if (arrlen(e->running) > 0 && arrlen(e->running) + width > e->cfg.max_num_seqs) break;
        if (s->n_computed == 0 && arrlen(s->block_table) == 0) llm_seq_take_cached_prefix(e, s);
        int n_new = (int)arrlen(s->tokens) - s->n_computed;
        if (n_new > budget) n_new = budget;
        int ok = llm_seq_reserve(e, s, s->n_computed + n_new, err);
        if (ok != 1) { llm_seq_release_blocks(e, s); if (ok < 0) return; break; } /* first come, first served: wait */
        arrdel(e->waiting, 0);
        s->status = LLM_SEQ_RUNNING;
        arrput(e->running, s);
        arrput(e->sched, s); arrput(e->sched_new, n_new);
        budget -= n_new;
    }
    if (e->cfg.static_batching && (arrlen(e->waiting) == 0 || arrlen(e->running) >= e->cfg.max_num_seqs || budget > 0))
        e->static_batch_open = 0; /* full, or stopped by something other than this step's token budget */
}

/* Name each newly completed block by its prefix, so later requests can share it. */
static void llm_seq_hash_blocks(llm_engine *e, llm_seq *s) {
    int bs = e->cfg.block_size;
    while ((s->n_hashed_blocks + 1) * bs <= s->n_computed) {
        int b = s->n_hashed_blocks;
        s->last_hash = llm_block_hash(s->last_hash, s->tokens + b * bs, bs);
        llm_block_set_hash(&e->bm, s->block_table[b], s->last_hash);
        s->n_hashed_blocks++;
    }
}

/* n > 1: the other samples start from the computed prompt, sharing all its blocks. */
static void llm_seq_fork(llm_engine *e, llm_seq *s) { /* the children go to the end of the running list */
    s->fork_pending = 0;
    for (int i = 1; i < s->req->params.n; i++) {
        llm_seq *c = (llm_seq *)calloc(1, sizeof *c);
        *c = *s;
        c->index = i; c->rng = llm_seed_mix(s->req->params.seed, i);
        c->tokens = NULL; c->block_table = NULL; c->held_text = NULL;
        c->out_tokens = NULL; c->out_text = NULL; c->out_logprobs = NULL; c->out_top_ids = NULL; c->out_top_logprobs = NULL;
        memcpy(arraddnptr(c->tokens, arrlen(s->tokens)), s->tokens, (size_t)arrlen(s->tokens) * sizeof(int32_t));
        memcpy(arraddnptr(c->block_table, arrlen(s->block_table)), s->block_table, (size_t)arrlen(s->block_table) * sizeof(int32_t));
        for (int b = 0; b < arrlen(c->block_table); b++) e->bm.blocks[c->block_table[b]].ref_count++;
        s->req->refs++;
        arrput(e->running, c);
    }
}

static void llm_emit(llm_engine *e, llm_seq *s) {
    llm_output o;
    memset(&o, 0, sizeof o);
    o.request_id = s->req->id; o.index = s->index;
    o.token_ids = s->out_tokens; o.n_tokens = (int)arrlen(s->out_tokens);
    o.text = s->out_text; o.text_len = (int)arrlen(s->out_text);
    if (s->req->params.logprobs >= 0) {
        o.logprobs = s->out_logprobs; o.n_top = s->req->params.logprobs;
        o.top_ids = s->out_top_ids; o.top_logprobs = s->out_top_logprobs;
    }
    o.finish_reason = s->finish_reason;
    o.n_prompt_tokens = s->req->n_prompt; o.n_cached_tokens = s->n_cached_tokens;
    o.n_generated = (int)arrlen(s->tokens) - s->req->n_prompt;
    arrput(e->outputs, o);
}

static void llm_take_inbox(llm_engine *e) {
    pthread_mutex_lock(&e->lock);
    for (int i = 0; i < arrlen(e->inbox); i++) arrput(e->waiting, e->inbox[i]);
    arrsetlen(e->inbox, 0);
    uint64_t *aborts = e->inbox_abort; e->inbox_abort = NULL;
    pthread_mutex_unlock(&e->lock);
    for (int a = 0; a < arrlen(aborts); a++) {
        llm_seq **lists[2] = {e->waiting, e->running};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < arrlen(lists[k]); i++) {
                llm_seq *s = lists[k][i];
                if (s->req->id != aborts[a]) continue;
                llm_seq_finish(e, s, LLM_FINISH_ABORT);
                llm_emit(e, s);
                arrput(e->finished, s);
                arrdel(lists[k], i); i--;
            }
        e->waiting = lists[0]; e->running = lists[1];
    }
    arrfree(aborts);
}

int llm_engine_step(llm_engine *e, const llm_output **outputs, char *err) {
    for (int i = 0; i < arrlen(e->finished); i++) llm_seq_free(e->finished[i]);
    arrsetlen(e->finished, 0); arrsetlen(e->outputs, 0);
    for (int i = 0; i < arrlen(e->running); i++) {
        llm_seq *s = e->running[i];
        arrsetlen(s->out_tokens, 0); arrsetlen(s->out_text, 0); arrsetlen(s->out_logprobs, 0);
        arrsetlen(s->out_top_ids, 0); arrsetlen(s->out_top_logprobs, 0);
    }
    llm_take_inbox(e);
    llm_schedule(e, err);
    int n_sched = (int)arrlen(e->sched);
    if (n_sched > 0) {
        /* flatten the scheduled chunks into one batch */
        arrsetlen(e->b_tokens, 0); arrsetlen(e->b_positions, 0); arrsetlen(e->b_logit_rows, 0);
        arrsetlen(e->b_seq_start, 0); arrsetlen(e->b_tables, 0);
        for (int i = 0; i < n_sched; i++) {
            llm_seq *s = e->sched[i];
            arrput(e->b_seq_start, (int32_t)arrlen(e->b_tokens));
            arrput(e->b_tables, s->block_table);
            for (int j = 0; j < e->sched_new[i]; j++) {
                arrput(e->b_tokens, s->tokens[s->n_computed + j]);
                arrput(e->b_positions, s->n_computed + j);
            }
            if (s->n_computed + e->sched_new[i] == arrlen(s->tokens)) arrput(e->b_logit_rows, (int32_t)arrlen(e->b_tokens) - 1);
        }
        arrput(e->b_seq_start, (int32_t)arrlen(e->b_tokens));
        llm_batch b = {(int)arrlen(e->b_tokens), e->b_tokens, e->b_positions, n_sched, e->b_seq_start,
                       e->b_tables, (int)arrlen(e->b_logit_rows), e->b_logit_rows};
        int V = e->model.cfg.vocab_size;
        if (b.n_logits > e->logits_rows) {
            free(e->logits);
            e->logits_rows = b.n_logits;
            e->logits = (float *)malloc((size_t)b.n_logits * (size_t)V * sizeof(float));
            if (!e->logits) { e->logits_rows = 0; return llm_fail(err, "out of memory for logits"); }
        }
        if (e->backend->forward(e->backend, &e->model, &b, e->logits, err) != 0) return -1;
        e->stats.steps++;
        int row = 0;
        for (int i = 0; i < n_sched; i++) {
            llm_seq *s = e->sched[i];
            int start = s->n_computed, end = start + e->sched_new[i];
            if (start < s->req->n_prompt) e->stats.prompt_tokens_computed += (end < s->req->n_prompt ? end : s->req->n_prompt) - start;
            s->n_computed = end;
            llm_seq_hash_blocks(e, s);
            if (end < arrlen(s->tokens)) continue;  /* a prompt chunk: nothing to sample yet */
            float *logits = e->logits + (size_t)row++ * V;
            if (s->fork_pending) {
                int first_child = (int)arrlen(e->running);
                llm_seq_fork(e, s);
                float *copy = (float *)malloc((size_t)V * sizeof(float)); /* each sample draws from the prompt's logits */
                for (int k = first_child; k < arrlen(e->running); k++) {
                    memcpy(copy, logits, (size_t)V * sizeof(float));
                    llm_seq_accept(e, e->running[k], copy);
                }
                free(copy);
            }
            llm_seq_accept(e, s, logits);
        }
    }
    /* outputs, and finished sequences leave the running list at once */
    for (int i = 0; i < arrlen(e->running); i++) {
        llm_seq *s = e->running[i];
        if (arrlen(s->out_tokens) || arrlen(s->out_text) || s->status == LLM_SEQ_FINISHED) llm_emit(e, s);
        if (s->status == LLM_SEQ_FINISHED) { arrput(e->finished, s); arrdel(e->running, i); i--; }
    }
    *outputs = e->outputs;
    return (int)arrlen(e->outputs);
}

#endif /* LLM_IMPLEMENTATION_DONE */
#endif /* LLM_IMPLEMENTATION */
