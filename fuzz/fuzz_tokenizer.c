/* fuzz_tokenizer.c - libFuzzer target: llm.h's tokenizer and detokenizer on two real vocabularies.
 *
 * Loaded once: $LLM_TESTDATA/tokenizer/ggml-vocab-llama-spm.gguf (SentencePiece) and
 * ggml-vocab-llama-bpe.gguf (byte-level BPE, Llama 3). The input's first byte picks the vocabulary and the
 * flags, the rest is text (or, in one mode, raw token ids). Properties checked (abort() when one fails):
 *   - llm_tokenize gives the same ids with any room; given too little it returns the count and fills cap;
 *     every id is inside the vocabulary; llm_tokenize_prompt is llm_tokenize as it documents;
 *   - llm_detokenize gives the same text with any room, NUL-terminated, and that text is valid UTF-8;
 *   - streaming (llm_detok_push per id, then llm_detok_flush) gives only valid UTF-8, each push on its own
 *     as well as all together; a push with too little room writes nothing and keeps its state; the stream is
 *     llm_detokenize's text (less SentencePiece's leading space);
 *   - byte-level BPE gives back exactly any UTF-8 text it tokenized (no special tokens parsed). */
#define LLM_IMPLEMENTATION
#include "llm.h"
#include "fuzz/fuzz_common.h"

static llm_gguf g_gguf[2];
static llm_tokenizer *g_tok[2];
static const char *const g_files[2] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf"};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    char err[LLM_ERR_LEN], path[4096];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/tokenizer/%s", fz_testdata_dir(), g_files[i]);
        if (llm_gguf_open(&g_gguf[i], path, err) != 0 || !(g_tok[i] = llm_tokenizer_load(&g_gguf[i], err))) {
            fprintf(stderr, "fuzz_tokenizer: %s (LLM_TESTDATA: the test data, testdata/ by default)\n",
                    err);
            exit(1);
        }
    }
    return 0;
}

/* The longest piece of a vocabulary, for the streaming buffer: a push writes at most 3 x piece + 9 bytes. */
static int max_piece(const llm_tokenizer *t) {
    static int cached[2] = {-1, -1};
    int k = t == g_tok[0] ? 0 : 1;
    if (cached[k] < 0) {
        int m = 0;
        for (int id = 0; id < llm_tokenizer_n_vocab(t); id++) {
            int n = llm_tokenizer_piece(t, id, 1, NULL, 0);
            if (n > m) m = n;
        }
        cached[k] = m;
    }
    return cached[k];
}

/* ids -> text, all at once and streamed; checks the properties above. */
static void check_detok(const llm_tokenizer *t, int spm, const int32_t *ids, int n, int special,
                        uint8_t small_room) {
    /* all at once */
    int need;
    char *whole = fz_detokenize_checked(t, ids, n, special, &need);
    int got = need;
    size_t bad;
    if (need > 0) { /* too little room: the length still, and the first cap bytes */
        int cap = small_room % need;
        char *part = (char *)malloc((size_t)cap + 1);
        FUZZ_CHECK(part, "out of memory");
        int again = llm_detokenize(t, ids, n, special, part, cap);
        FUZZ_CHECK(again == need, "llm_detokenize with cap %d: %d, not %d", cap, again, need);
        FUZZ_CHECK(!memcmp(part, whole, (size_t)cap), "llm_detokenize with cap %d wrote other bytes", cap);
        free(part);
    }

    /* streamed */
    int room = 3 * max_piece(t) + 9;
    char *buf = (char *)malloc((size_t)room + 1);
    char *stream = (char *)malloc((size_t)n * (size_t)room + 16);
    FUZZ_CHECK(buf && stream, "out of memory");
    size_t len = 0;
    llm_detok d;
    memset(&d, 0, sizeof d);
    d.special = special;
    for (int i = 0; i < n; i++) {
        /* how much room it needs: no room at all (on a copy: when the output is empty, that is room enough,
         * and the push takes the id in) */
        llm_detok probe = d;
        int m = llm_detok_push(t, &probe, ids[i], NULL, 0);
        FUZZ_CHECK(m >= 0 && m <= room, "llm_detok_push of id %d wants %d bytes (bound %d)", ids[i], m, room);
        if (m > 0) FUZZ_CHECK(!memcmp(&probe, &d, sizeof d), "llm_detok_push with no room changed its state");
        if (m > 0) { /* one byte short: nothing written, the state kept */
            llm_detok before = d;
            memset(buf, 0xAA, (size_t)m);
            int r = llm_detok_push(t, &d, ids[i], buf, m - 1);
            FUZZ_CHECK(r == m, "llm_detok_push with %d bytes of room: %d, not %d", m - 1, r, m);
            FUZZ_CHECK(!memcmp(&before, &d, sizeof d), "llm_detok_push with too little room: state changed");
            for (int k = 0; k < m; k++)
                FUZZ_CHECK((unsigned char)buf[k] == 0xAA, "wrote with too little room");
        }
        int w = llm_detok_push(t, &d, ids[i], buf, room);
        FUZZ_CHECK(w == m, "llm_detok_push: %d bytes, after saying %d", w, m);
        FUZZ_CHECK(d.n_pending >= 0 && d.n_pending <= 3, "n_pending %d", d.n_pending);
        bad = fz_utf8_bad_at(buf, (size_t)w);
        FUZZ_CHECK(bad == (size_t)w, "llm_detok_push of id %d (token %d of %d): not UTF-8 at byte %zu: %s",
                   ids[i], i, n, bad, fz_hex_around(buf, (size_t)w, bad));
        memcpy(stream + len, buf, (size_t)w);
        len += (size_t)w;
    }
    int f = llm_detok_flush(&d, buf, room);
    FUZZ_CHECK(f == 0 || f == 3, "llm_detok_flush gave %d bytes", f);
    FUZZ_CHECK(d.n_pending == 0, "llm_detok_flush left %d bytes pending", d.n_pending);
    memcpy(stream + len, buf, (size_t)f);
    len += (size_t)f;
    bad = fz_utf8_bad_at(stream, len);
    FUZZ_CHECK(bad == len, "the detokenizer's stream is not UTF-8 at byte %zu of %zu: %s", bad, len,
               fz_hex_around(stream, len, bad));
    /* the same text as llm_detokenize, which drops SentencePiece's leading space */
    int skip = spm && len > 0 && stream[0] == ' ' && (size_t)got == len - 1;
    FUZZ_CHECK((size_t)got == len - (size_t)skip && !memcmp(whole, stream + skip, (size_t)got),
               "llm_detokenize (%d bytes) and the stream (%zu bytes) differ", got, len);
    free(buf); free(stream); free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    int which = flags & 1, parse_special = flags >> 1 & 1, add_bos = flags >> 2 & 1, special = flags >> 3 & 1;
    int raw_ids = (flags >> 4 & 3) == 3; /* one input in four: the rest is token ids, not text */
    uint8_t small_room = size > 1 ? data[size - 1] : 0;
    const llm_tokenizer *t = g_tok[which];
    int n_vocab = llm_tokenizer_n_vocab(t);
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    if (raw_ids) { /* detokenize any ids: outside the vocabulary, negative, control tokens */
        int n = (int)(len / 4);
        int32_t *ids = (int32_t *)malloc((size_t)(n ? n : 1) * sizeof(int32_t));
        FUZZ_CHECK(ids, "out of memory");
        for (int i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, text + 4 * i, 4);
            /* mostly inside the vocabulary; a byte of the id's top says when not */
            ids[i] = (u >> 24) == 0xFF ? (int32_t)u : (int32_t)(u % (uint32_t)(n_vocab + 2)) - 1;
        }
        check_detok(t, which == 0, ids, n, special, small_room);
        free(ids);
        return 0;
    }

    /* text -> ids: the count first, then with room, then with too little */
    int n = llm_tokenize(t, text, len, add_bos, parse_special, NULL, 0);
    FUZZ_CHECK(n >= 0, "llm_tokenize failed on %zu bytes", len);
    int32_t *ids = (int32_t *)malloc((size_t)(n + 1) * sizeof(int32_t));
    FUZZ_CHECK(ids, "out of memory");
    int n2 = llm_tokenize(t, text, len, add_bos, parse_special, ids, n);
    FUZZ_CHECK(n2 == n, "llm_tokenize: %d ids counted, %d written", n, n2);
    for (int i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab, "id %d (index %d) outside the vocabulary of %d", ids[i],
                   i, n_vocab);
    if (n > 0) {
        int cap = small_room % n;
        int32_t *part = (int32_t *)malloc((size_t)(cap ? cap : 1) * sizeof(int32_t));
        FUZZ_CHECK(part, "out of memory");
        int n3 = llm_tokenize(t, text, len, add_bos, parse_special, part, cap);
        FUZZ_CHECK(n3 == n, "llm_tokenize with cap %d: %d, not %d", cap, n3, n);
        FUZZ_CHECK(!memcmp(part, ids, (size_t)cap * sizeof(int32_t)), "llm_tokenize with cap %d: other ids",
                   cap);
        free(part);
    }

    /* the engine's way in: special tokens parsed, BOS unless the text begins with it */
    int np = llm_tokenize_prompt(t, text, len, NULL, 0);
    FUZZ_CHECK(np >= 0, "llm_tokenize_prompt failed");
    int32_t *pids = (int32_t *)malloc((size_t)(np + 1) * sizeof(int32_t));
    FUZZ_CHECK(pids, "out of memory");
    FUZZ_CHECK(llm_tokenize_prompt(t, text, len, pids, np) == np, "llm_tokenize_prompt: other counts");
    {   /* = llm_tokenize with special tokens parsed and BOS added unless the text's first token is BOS */
        int n0 = llm_tokenize(t, text, len, 0, 1, NULL, 0);
        int32_t *ref = (int32_t *)malloc((size_t)(n0 + 2) * sizeof(int32_t));
        FUZZ_CHECK(ref, "out of memory");
        llm_tokenize(t, text, len, 0, 1, ref, n0);
        int bos_first = n0 > 0 && ref[0] == llm_tokenizer_bos(t);
        if (llm_tokenizer_adds_bos(t) && !bos_first) {
            n0 = llm_tokenize(t, text, len, 1, 1, NULL, 0);
            free(ref);
            ref = (int32_t *)malloc((size_t)(n0 + 2) * sizeof(int32_t));
            FUZZ_CHECK(ref, "out of memory");
            llm_tokenize(t, text, len, 1, 1, ref, n0);
        }
        FUZZ_CHECK(np == n0 && !memcmp(pids, ref, (size_t)np * sizeof(int32_t)),
                   "llm_tokenize_prompt (%d ids) is not llm_tokenize as documented (%d ids)", np, n0);
        free(ref);
    }
    free(pids);

    check_detok(t, which == 0, ids, n, special, small_room);

    /* byte-level BPE keeps every byte: UTF-8 text comes back exactly */
    if (which == 1 && !parse_special && !add_bos && fz_utf8_valid(text, len)) {
        char *back = (char *)malloc(len + 1);
        FUZZ_CHECK(back, "out of memory");
        int m = llm_detokenize(t, ids, n, 1, back, (int)len + 1);
        FUZZ_CHECK(m == (int)len && !memcmp(back, text, len),
                   "byte-level BPE: %zu bytes of UTF-8 in, %d bytes out, not the same", len, m);
        free(back);
    }
    free(ids);
    return 0;
}
