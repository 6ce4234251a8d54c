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
 * of a character that is not complete yet. Bytes that can never form a valid character come out as U+FFFD. */
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
    int64_t iv; double fv = 0;
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

/* Dummy models: the shapes of real checkpoints (from their config.json), random f16 weights. */
typedef struct { const char *name; int arch, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, ctx; float rope_base; } llm_dummy_preset;
static const llm_dummy_preset llm_dummy_presets[] = {
    {"tiny",           LLM_ARCH_LLAMA, 256,   4,  8, 4,  32,  768,  32000,  4096, 10000.0f},
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
    /* one allocation: matrices as f16, then the f32 norm weights and biases */
    int64_t per_layer_mat = q_dim * c->dim * 2 + kv_dim * c->dim * 2 + (int64_t)c->ffn_dim * c->dim * 3;
    int64_t n_mat = (int64_t)c->vocab_size * c->dim + per_layer_mat * c->n_layers;
    int64_t per_layer_vec = 2 * c->dim + q_dim + 2 * kv_dim + 2 * c->head_dim;
    int64_t n_vec = c->dim + per_layer_vec * c->n_layers;
    uint16_t *mat = (uint16_t *)malloc((size_t)n_mat * 2 + (size_t)n_vec * 4);
    m->layers = (llm_layer *)calloc((size_t)c->n_layers, sizeof(llm_layer));
    if (!mat || !m->layers) { free(mat); free(m->layers); m->layers = NULL; return llm_fail(err, "out of memory for dummy model %s", p->name); }
    m->owned = mat;
    float *vec = (float *)(mat + n_mat);
    uint64_t rng = seed;
    /* a small table of random f16 values, tiled: filling billions of weights one by one would take longer than
     * the benchmark; the scale keeps activations bounded like a trained model's */
    uint16_t table[4096];
    for (int i = 0; i < 4096; i++) table[i] = llm_f32_to_f16((llm_rand_uniform(&rng) * 2 - 1) * 0.05f);
    for (int64_t i = 0; i < n_mat; i += 4096) {
        int64_t n = n_mat - i < 4096 ? n_mat - i : 4096, shift = (int64_t)(llm_splitmix64(&rng) % 4096);
        for (int64_t j = 0; j < n; j++) mat[i + j] = table[(j + shift) % 4096];
    }
    for (int64_t i = 0; i < n_vec; i++) vec[i] = 1.0f;
#define LLM_TAKE_MAT(w, r, cl) (w.data = mat, w.type = LLM_F16, w.rows = (r), w.cols = (cl), mat += (r) * (cl))
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

#endif /* LLM_IMPLEMENTATION_DONE */
#endif /* LLM_IMPLEMENTATION */
