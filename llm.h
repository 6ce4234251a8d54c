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
 * 3. Tokenizer
 * =========================================================================================================== */
#include "tokenizer.inc.h" /* @@TOKENIZER@@ (being written; folded in here when done) */

#endif /* LLM_IMPLEMENTATION_DONE */
#endif /* LLM_IMPLEMENTATION */
