/* fuzz_gguf.c - libFuzzer target: llm.h's GGUF reader on bytes in memory, and all that reads its metadata.
 *
 * The input is a GGUF file. llm_gguf_parse must refuse a corrupt one with a message (never read outside the
 * bytes); when it parses, every metadata value is read back through the accessors (llm_gguf_int, _float,
 * _string, _arr_int, _arr_float), each tensor's first row is dequantised, the tokenizer is built from the
 * metadata (llm_tokenizer_load) and, when it builds, a few texts go through it and back, and the chat
 * template is set up from it. A file that names an architecture is also loaded as a model (llm_model_load
 * takes a path: the bytes go into a memfd, loaded as /proc/self/fd/N), which reads the config and binds the
 * weights. Errors are fine; a crash, undefined behaviour or a leak is a bug. */
#define _GNU_SOURCE /* memfd_create */
#define LLM_IMPLEMENTATION
#include "llm.h"
#include "fuzz/fuzz_common.h"
#include <sys/mman.h>
#include <unistd.h>

/* llm_model_load on the input's bytes, through a memory file. */
static void model_load(const uint8_t *data, size_t size) {
    static int fd = -1;
    if (fd < 0 && (fd = memfd_create("fuzz-gguf", 0)) < 0) { perror("memfd_create"); abort(); }
    FUZZ_CHECK(ftruncate(fd, 0) == 0 && pwrite(fd, data, size, 0) == (ssize_t)size, "writing the memfd");
    char path[64], err[LLM_ERR_LEN];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    llm_model m;
    err[0] = 0;
    if (llm_model_load(&m, path, err) == 0) {
        const llm_config *c = &m.cfg;
        FUZZ_CHECK(c->dim > 0 && c->n_layers > 0 && c->n_heads > 0 && c->n_kv_heads > 0 && c->head_dim > 0 &&
                   c->vocab_size > 0 && c->context_length > 0 && m.tok, "a model loaded with a bad config");
        llm_model_free(&m);
    } else {
        FUZZ_CHECK(err[0], "llm_model_load failed without a message");
    }
}

/* A text through the tokenizer and back: whatever the vocabulary, this must be safe, and what comes out of
 * the detokenizer whole UTF-8. */
static void tokenizer_roundtrip(const llm_tokenizer *t, const char *text) {
    size_t len = strlen(text);
    int32_t ids[512];
    int n = llm_tokenize(t, text, len, 1, 1, ids, 512);
    if (n < 0) return;
    if (n > 512) n = 512;
    for (int special = 0; special <= 1; special++) {
        int got;
        char *out = fz_detokenize_checked(t, ids, n, special, &got);
        free(out);
    }
    int m = llm_tokenize_prompt(t, text, len, ids, 512);
    (void)m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    llm_gguf g;
    char err[LLM_ERR_LEN];
    err[0] = 0;
    if (llm_gguf_parse(&g, data, size, err) != 0) {
        FUZZ_CHECK(err[0], "llm_gguf_parse failed without a message");
        FUZZ_CHECK(memchr(err, 0, sizeof err), "the error message is not terminated");
        return 0;
    }
    FUZZ_CHECK(g.n_kv >= 0 && g.n_tensors >= 0, "negative counts");

    /* every key/value, through the same calls the model and tokenizer loaders use */
    volatile double sink = 0;
    for (int64_t i = 0; i < g.n_kv; i++) {
        const llm_gguf_kv *kv = &g.kv[i];
        FUZZ_CHECK(kv->key.len <= size && (const uint8_t *)kv->key.ptr >= data &&
                   (const uint8_t *)kv->key.ptr + kv->key.len <= data + size, "key %lld outside the input",
                   (long long)i);
        char key[256];
        size_t klen = kv->key.len < sizeof key - 1 ? kv->key.len : sizeof key - 1;
        memcpy(key, kv->key.ptr, klen);
        key[klen] = 0;
        if (klen == kv->key.len && !memchr(key, 0, klen)) /* a key a C string can name */
            FUZZ_CHECK(llm_gguf_find(&g, key), "llm_gguf_find does not find key %lld", (long long)i);
        sink += (double)llm_gguf_int(&g, key, -1);
        sink += llm_gguf_float(&g, key, -1.0);
        llm_str s = llm_gguf_string(&g, key);
        if (s.ptr) {
            FUZZ_CHECK((const uint8_t *)s.ptr >= data && s.len <= size &&
                       (const uint8_t *)s.ptr + s.len <= data + size, "string of key '%s' outside the input",
                       key);
            for (uint64_t k = 0; k < s.len; k++) sink += (unsigned char)s.ptr[k];
        }
        if (kv->type == LLM_GGUF_ARRAY) {
            uint64_t n = kv->arr_len < 4096 ? kv->arr_len : 4096;
            for (uint64_t k = 0; k < n; k++) {
                sink += (double)llm_gguf_arr_int(kv, k);
                sink += llm_gguf_arr_float(kv, k);
                if (kv->arr_type == LLM_GGUF_STRING) {
                    llm_str e = kv->strs[k];
                    FUZZ_CHECK((const uint8_t *)e.ptr >= data && e.len <= size &&
                               (const uint8_t *)e.ptr + e.len <= data + size,
                               "array string outside the input");
                    if (e.len) sink += (unsigned char)e.ptr[e.len - 1];
                }
            }
            sink += (double)llm_gguf_arr_int(kv, kv->arr_len); /* past the end: 0 */
        }
    }
    (void)llm_gguf_find(&g, "no.such.key");

    /* every tensor: it lies inside the input; its first row (when small) dequantises */
    for (int64_t i = 0; i < g.n_tensors; i++) {
        const llm_gguf_tensor *t = &g.tensors[i];
        FUZZ_CHECK(t->nbytes <= size && (const uint8_t *)t->data >= data &&
                   (const uint8_t *)t->data + t->nbytes <= data + size, "tensor %lld outside the input",
                   (long long)i);
        char name[128];
        size_t nlen = t->name.len < sizeof name - 1 ? t->name.len : sizeof name - 1;
        memcpy(name, t->name.ptr, nlen);
        name[nlen] = 0;
        if (nlen == t->name.len && !memchr(name, 0, nlen))
            FUZZ_CHECK(llm_gguf_tensor_find(&g, name), "llm_gguf_tensor_find does not find tensor %lld",
                       (long long)i);
        (void)llm_dtype_name(t->type);
        int64_t cols = (int64_t)t->ne[0];
        size_t row = llm_dtype_row_bytes(t->type, cols);
        if (row && row <= t->nbytes && cols <= 65536) {
            float *out = (float *)malloc((size_t)cols * sizeof(float));
            FUZZ_CHECK(out, "out of memory");
            llm_dtype_dequant_row(t->type, t->data, out, cols);
            for (int64_t k = 0; k < cols; k++) sink += out[k];
            free(out);
        }
    }
    (void)sink;

    /* the tokenizer built from this metadata, and what uses it */
    llm_tokenizer *t = llm_tokenizer_load(&g, err);
    if (t) {
        int n_vocab = llm_tokenizer_n_vocab(t);
        FUZZ_CHECK(n_vocab > 0, "a tokenizer with %d tokens", n_vocab);
        int bos = llm_tokenizer_bos(t), eos = llm_tokenizer_eos(t);
        FUZZ_CHECK(bos >= -1 && bos < n_vocab && eos >= -1 && eos < n_vocab, "bos %d eos %d of %d", bos, eos,
                   n_vocab);
        (void)llm_tokenizer_adds_bos(t);
        for (int32_t id = -1; id <= n_vocab && id < 300; id++) {
            (void)llm_tokenizer_is_eog(t, id);
            char piece[64];
            (void)llm_tokenizer_piece(t, id, id & 1, piece, (int)sizeof piece);
        }
        tokenizer_roundtrip(t, "Hello world! \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 123 <s></s> "
                               "<|begin_of_text|> <|im_start|>user\n  \t\n\xf0\x9f\x98\x80'll 've");
        tokenizer_roundtrip(t, "");
        tokenizer_roundtrip(t, " ");
        llm_chat_template ct;
        llm_str tmpl = llm_gguf_string(&g, "tokenizer.chat_template");
        if (llm_chat_template_init(&ct, tmpl.ptr, tmpl.ptr ? tmpl.len : 0, t, NULL, err) == 0) {
            llm_chat_message msgs[3] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}};
            char out[4096];
            (void)llm_chat_render(&ct, msgs, 3, NULL, 1, out, (int)sizeof out);
            int32_t stop_ids[16];
            (void)llm_chat_stop_ids(&ct, t, stop_ids, 16);
        }
        llm_tokenizer_free(t);
    } else {
        FUZZ_CHECK(err[0], "llm_tokenizer_load failed without a message");
    }
    if (llm_gguf_find(&g, "general.architecture")) model_load(data, size);
    llm_gguf_close(&g);
    return 0;
}
