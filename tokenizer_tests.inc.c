/* tokenizer_tests.inc.c - tokenizer tests, included by test.c (uses its CHECK, shared_dir and read_file).
 * The ground truth is llama.cpp's fixtures in shared/tokenizer: for each vocabulary, texts and the ids
 * llama.cpp gives them. */
#include <time.h>

/* Is s[0..n) valid UTF-8? Written apart from the tokenizer's own checker, from the definition: shortest form,
 * no surrogates, nothing past U+10FFFF. */
static int tok_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        uint32_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || i + len > n) return 0;
        if (len > 1) c &= 0x7F >> len;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            c = c << 6 | (s[i + k] & 0x3F);
        }
        static const uint32_t min_of_len[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (c < min_of_len[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

static double tok_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Prints s with the bytes that would not show escaped, for failure messages. */
static void tok_print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n && i < 200; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') printf("\\n");
        else if (c == '\t') printf("\\t");
        else if (c == '\r') printf("\\r");
        else if (c < 0x20 || c == 0x7F) printf("\\x%02X", c);
        else putchar(c);
    }
    if (n > 200) printf("...");
}

static void tok_print_ids(const char *label, const int32_t *ids, int n) {
    printf("    %s (%d):", label, n);
    for (int i = 0; i < n && i < 64; i++) printf(" %d", ids[i]);
    printf("%s\n", n > 64 ? " ..." : "");
}

/* Detokenizes ids with the streaming detokenizer into out (room for cap bytes); returns the length. Counts
 * every chunk it writes that is not valid UTF-8 in *bad_chunks. */
static size_t tok_detok_all(const llm_tokenizer *t, const int32_t *ids, int n, char *out, size_t cap, int *bad_chunks) {
    llm_detok d = {{0}, 0};
    char chunk[1024];
    size_t len = 0;
    for (int i = 0; i <= n; i++) {
        int m = i < n ? llm_detok_push(t, &d, ids[i], chunk, (int)sizeof chunk) : llm_detok_flush(&d, chunk, (int)sizeof chunk);
        if (m < 0 || m > (int)sizeof chunk) { (*bad_chunks)++; continue; }
        if (!tok_utf8_valid(chunk, (size_t)m)) (*bad_chunks)++;
        if (len + (size_t)m <= cap) memcpy(out + len, chunk, (size_t)m);
        len += (size_t)m;
    }
    return len;
}

/* Loads shared/tokenizer/<name>; NULL (and a failed check) when it cannot. */
static llm_tokenizer *tok_load(llm_gguf *g, const char *name, double *ms) {
    char path[1024], err[LLM_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/tokenizer/%s", shared_dir, name);
    int ok = llm_gguf_open(g, path, err) == 0;
    CHECK(ok, "open %s: %s", path, err);
    if (!ok) return NULL;
    double t0 = tok_now();
    llm_tokenizer *t = llm_tokenizer_load(g, err);
    if (ms) *ms = (tok_now() - t0) * 1e3;
    CHECK(t != NULL, "load tokenizer %s: %s", name, err);
    if (!t) llm_gguf_close(g);
    return t;
}

static void test_tokenizer_fixtures(void) {
    static const char *const names[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-bpe.gguf",
                                        "ggml-vocab-qwen2.gguf"};
    static const char sep[] = "\n__ggml_vocab_test__\n";
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        char path[1024];
        llm_gguf g;
        double ms = 0;
        llm_tokenizer *t = tok_load(&g, names[f], &ms);
        if (!t) continue;
        snprintf(path, sizeof path, "%s/tokenizer/%s.inp", shared_dir, names[f]);
        char *inp = read_file(path, NULL);
        CHECK(inp != NULL, "read %s", path);
        snprintf(path, sizeof path, "%s/tokenizer/%s.out", shared_dir, names[f]);
        char *outp = read_file(path, NULL);
        CHECK(outp != NULL, "read %s", path);
        if (!inp || !outp) { free(inp); free(outp); llm_tokenizer_free(t); llm_gguf_close(&g); continue; }

        /* As llama.cpp's test-tokenizer-0 reads them: the texts are what comes before each separator (what
         * follows the last one is not a text); the expected ids are one line per text. */
        int cases = 0, tok_ok = 0, detok_ok = 0, bad_chunks = 0;
        char *text = inp, *line = outp;
        for (char *next; (next = strstr(text, sep)) != NULL; text = next + strlen(sep)) {
            size_t len = (size_t)(next - text);
            char *eol = line ? strchr(line, '\n') : NULL;
            CHECK(line && *line, "%s: fewer lines of ids than texts (case %d)", names[f], cases);
            if (!line || !*line) break;
            if (eol) *eol = 0;
            int32_t want[1024], got[1024];
            int n_want = 0;
            for (char *p = line, *e; n_want < 1024; p = e) {
                long v = strtol(p, &e, 10);
                if (e == p) break;
                want[n_want++] = (int32_t)v;
            }
            line = eol ? eol + 1 : NULL;

            int n_got = llm_tokenize(t, text, len, 0, 0, got, 1024);
            int same = n_got == n_want && memcmp(got, want, (size_t)n_want * sizeof want[0]) == 0;
            tok_ok += same;
            CHECK(same, "%s case %d: the ids differ from llama.cpp's", names[f], cases);
            if (!same) {
                printf("    text: \""); tok_print_escaped(text, len); printf("\"\n");
                tok_print_ids("want", want, n_want);
                tok_print_ids("got ", got, n_got);
            }

            /* back to text: the input again, but for the space SentencePiece puts in front */
            char back[4096], expect[4096];
            size_t n_expect = 0;
            if (len >= sizeof expect) { CHECK(0, "%s case %d: a text longer than this test expects", names[f], cases); len = 0; }
            if (t->kind == LLM_VOCAB_SPM && t->add_space_prefix && len > 0) expect[n_expect++] = ' ';
            memcpy(expect + n_expect, text, len);
            n_expect += len;
            size_t n_back = tok_detok_all(t, want, n_want, back, sizeof back, &bad_chunks);
            int back_same = n_back == n_expect && memcmp(back, expect, n_back) == 0;
            detok_ok += back_same;
            CHECK(back_same, "%s case %d: detokenized text differs", names[f], cases);
            if (!back_same) {
                printf("    want: \""); tok_print_escaped(expect, n_expect); printf("\"\n");
                printf("    got:  \""); tok_print_escaped(back, n_back < sizeof back ? n_back : sizeof back); printf("\"\n");
            }
            cases++;
        }
        CHECK(cases == 46, "%s: %d texts, expected 46", names[f], cases);
        CHECK(line == NULL || *line == 0, "%s: more lines of ids than texts", names[f]);
        CHECK(bad_chunks == 0, "%s: the streaming detokenizer wrote %d chunks that are not valid UTF-8", names[f], bad_chunks);
        printf("tokenizer %-28s %d tokens, loaded in %.0f ms: %d/%d cases give llama.cpp's ids, %d/%d detokenize back\n",
               names[f], llm_vocab_size(t), ms, tok_ok, cases, detok_ok, cases);
        free(inp); free(outp);
        llm_tokenizer_free(t);
        llm_gguf_close(&g);
    }
}

/* Pushes one id and checks the bytes written are exactly want[0..n_want). */
static void tok_push_expect(const llm_tokenizer *t, llm_detok *d, int32_t id, const char *want, int n_want, const char *what) {
    char out[256];
    memset(out, 'x', sizeof out);
    int n = llm_detok_push(t, d, id, out, (int)sizeof out);
    CHECK(n == n_want && memcmp(out, want, (size_t)n_want) == 0, "%s: push %d wrote %d bytes, expected %d", what, id, n, n_want);
    CHECK(tok_utf8_valid(out, n > 0 ? (size_t)n : 0), "%s: push %d wrote broken UTF-8", what, id);
}

/* Checks that id's piece is exactly the bytes want[0..n). */
static void tok_piece_expect(const llm_tokenizer *t, int32_t id, const char *want, int n) {
    char buf[64];
    int k = llm_token_to_piece(t, id, 0, buf, (int)sizeof buf);
    CHECK(k == n && memcmp(buf, want, (size_t)n) == 0, "token %d: piece of %d bytes, expected %d", id, k, n);
}

static void test_detokenizer_streaming(void) {
    llm_gguf g;
    llm_tokenizer *t = tok_load(&g, "ggml-vocab-llama-spm.gguf", NULL);
    if (t) {
        llm_detok d = {{0}, 0};
        char out[64];
        /* SentencePiece byte tokens: <0xNN> is id 3 + NN in this vocabulary */
        tok_piece_expect(t, 229, "\xE2", 1); tok_piece_expect(t, 133, "\x82", 1); tok_piece_expect(t, 175, "\xAC", 1);
        /* "€" = E2 82 AC, one byte token at a time: nothing until the character is whole */
        tok_push_expect(t, &d, 229, "", 0, "euro 1/3");
        tok_push_expect(t, &d, 133, "", 0, "euro 2/3");
        tok_push_expect(t, &d, 175, "\xE2\x82\xAC", 3, "euro 3/3");
        CHECK(d.n_pending == 0, "euro: %d bytes still held", d.n_pending);
        /* a 4-byte emoji (F0 9F 98 80), after a plain token that must come out at once */
        tok_push_expect(t, &d, 15043, " Hello", 6, "plain token");
        tok_push_expect(t, &d, 243, "", 0, "emoji 1/4");
        tok_push_expect(t, &d, 162, "", 0, "emoji 2/4");
        tok_push_expect(t, &d, 155, "", 0, "emoji 3/4");
        tok_push_expect(t, &d, 131, "\xF0\x9F\x98\x80", 4, "emoji 4/4");
        /* broken sequences: a stray continuation byte; a lead byte followed by a plain byte ("A" = <0x41>);
         * a byte never in UTF-8; a surrogate (ED A0: never valid, so each byte on its own) */
        tok_push_expect(t, &d, 3 + 0x80, "\xEF\xBF\xBD", 3, "stray continuation");
        tok_push_expect(t, &d, 229, "", 0, "lead byte");
        tok_push_expect(t, &d, 3 + 0x41, "\xEF\xBF\xBD" "A", 4, "lead byte then A");
        tok_push_expect(t, &d, 3 + 0xC0, "\xEF\xBF\xBD", 3, "C0");
        tok_push_expect(t, &d, 3 + 0xED, "", 0, "ED");
        tok_push_expect(t, &d, 3 + 0xA0, "\xEF\xBF\xBD\xEF\xBF\xBD", 6, "ED A0");
        /* a character cut short by the end of the stream: flush gives one U+FFFD for it */
        tok_push_expect(t, &d, 229, "", 0, "unfinished 1");
        tok_push_expect(t, &d, 133, "", 0, "unfinished 2");
        CHECK(llm_detok_flush(&d, out, 2) == 3 && d.n_pending == 2, "flush with too little room must write nothing and say 3");
        CHECK(llm_detok_flush(&d, out, (int)sizeof out) == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0, "flush of an unfinished character");
        CHECK(llm_detok_flush(&d, out, (int)sizeof out) == 0, "second flush must write nothing");
        /* too little room: nothing written, nothing consumed, the room needed returned */
        memset(out, 'x', sizeof out);
        int need = llm_detok_push(t, &d, 15043, out, 3);
        CHECK(need == 6 && out[0] == 'x' && d.n_pending == 0, "push with too little room: returned %d, expected 6 and nothing written", need);
        tok_push_expect(t, &d, 15043, " Hello", 6, "push again with room");
        /* control tokens show nothing in the stream, and their text only when asked; ids out of range nothing */
        tok_push_expect(t, &d, 2, "", 0, "</s>");
        CHECK(llm_token_to_piece(t, 2, 1, out, (int)sizeof out) == 4 && memcmp(out, "</s>", 4) == 0, "</s> as special");
        CHECK(llm_token_to_piece(t, 2, 0, out, (int)sizeof out) == 0, "</s> not special");
        tok_push_expect(t, &d, 32000, "", 0, "id past the vocabulary");
        tok_push_expect(t, &d, -1, "", 0, "id -1");
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }

    t = tok_load(&g, "ggml-vocab-gpt-2.gguf", NULL);
    if (t) {
        /* GPT-2 splits "😀" into a token for its first three bytes and one for the last */
        llm_detok d = {{0}, 0};
        int32_t ids[8];
        int n = llm_tokenize(t, "\xF0\x9F\x98\x80", 4, 0, 0, ids, 8);
        CHECK(n == 2 && ids[0] == 47249 && ids[1] == 222, "GPT-2 tokens of U+1F600: %d ids, %d %d", n, ids[0], ids[1]);
        tok_piece_expect(t, 47249, "\xF0\x9F\x98", 3);
        tok_push_expect(t, &d, 47249, "", 0, "half an emoji");
        tok_push_expect(t, &d, 222, "\xF0\x9F\x98\x80", 4, "the other half");
        tok_push_expect(t, &d, 15496, "Hello", 5, "Hello");
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }
}

/* Tokenizes text and checks the ids are exactly want[0..n_want). */
static void tok_expect(const llm_tokenizer *t, const char *text, int add_bos, int parse_special, const int32_t *want, int n_want) {
    int32_t got[64];
    int n = llm_tokenize(t, text, strlen(text), add_bos, parse_special, got, 64);
    int same = n == n_want && (n_want == 0 || memcmp(got, want, (size_t)n_want * sizeof *want) == 0);
    CHECK(same, "tokenize \"%s\" (bos %d, special %d): ids differ", text, add_bos, parse_special);
    if (!same) { tok_print_ids("want", want, n_want); tok_print_ids("got ", got, n); }
}

/* The API around the ids: special ids, BOS, special tokens in text, small buffers, broken input. */
static void test_tokenizer_api(void) {
    llm_gguf g;
    llm_tokenizer *t = tok_load(&g, "ggml-vocab-llama-spm.gguf", NULL);
    if (t) {
        CHECK(llm_token_bos(t) == 1 && llm_token_eos(t) == 2 && llm_tokenizer_adds_bos(t) == 1, "llama-spm bos/eos/add_bos");
        CHECK(llm_token_is_eog(t, 2) && !llm_token_is_eog(t, 1) && !llm_token_is_eog(t, 15043), "llama-spm end of generation");
        CHECK(llm_vocab_size(t) == 32000, "llama-spm vocab size %d", llm_vocab_size(t));
        const int32_t bos_hello[] = {1, 15043, 3186}, bos_only[] = {1};
        tok_expect(t, "Hello world", 1, 0, bos_hello, 3);
        tok_expect(t, "", 1, 0, bos_only, 1);
        tok_expect(t, "", 0, 0, NULL, 0);
        /* "</s>" is EOS only when asked for; the text after a special token gets the space prefix again */
        const int32_t special[] = {15043, 2, 3186}, plain[] = {15043, 829, 29879, 29958, 11526};
        tok_expect(t, "Hello</s>world", 0, 1, special, 3);
        tok_expect(t, "Hello</s>world", 0, 0, plain, 5);
        /* a broken byte is spelled as its byte token: "▁", <0xE2>, then "A" */
        int32_t ids[16];
        int n = llm_tokenize(t, "\xE2" "A", 2, 0, 0, ids, 16);
        CHECK(n == 3 && ids[0] == 29871 && ids[1] == 3 + 0xE2, "broken UTF-8 in SentencePiece: %d ids", n);
        /* the count is the whole count even when the buffer is smaller; only cap ids are written */
        ids[1] = -7;
        n = llm_tokenize(t, "Hello world", 11, 1, 0, ids, 1);
        CHECK(n == 3 && ids[0] == 1 && ids[1] == -7, "tokenize into a 1-id buffer: returned %d", n);
        CHECK(llm_tokenize(t, "Hello", 5, 0, 0, NULL, 0) == 1, "tokenize with no buffer counts");
        /* pieces: -1 out of range; the whole length even when cap is smaller */
        char buf[8] = "xxxxxxx";
        CHECK(llm_token_to_piece(t, -1, 0, buf, 8) == -1 && llm_token_to_piece(t, 32000, 0, buf, 8) == -1, "piece of a bad id");
        CHECK(llm_token_to_piece(t, 15043, 0, buf, 3) == 6 && memcmp(buf, " He", 3) == 0 && buf[3] == 'x', "piece into a small buffer");
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }

    t = tok_load(&g, "ggml-vocab-llama-bpe.gguf", NULL);
    if (t) {
        /* llama.cpp adds BOS for llama-bpe vocabularies that do not say */
        CHECK(llm_token_bos(t) == 128000 && llm_token_eos(t) == 128001 && llm_tokenizer_adds_bos(t) == 1, "llama-bpe bos/eos/add_bos");
        CHECK(llm_token_is_eog(t, 128001) && llm_token_is_eog(t, 128009) && !llm_token_is_eog(t, 128000) && !llm_token_is_eog(t, 9906),
              "llama-bpe end of generation");
        const int32_t special[] = {128000, 9906, 1917, 128009};
        tok_expect(t, "<|begin_of_text|>Hello world<|eot_id|>", 0, 1, special, 4);
        int32_t ids[64];
        int n = llm_tokenize(t, "<|begin_of_text|>Hello world<|eot_id|>", 38, 0, 0, ids, 64), high = 0;
        for (int i = 0; i < n && i < 64; i++) high += ids[i] >= 128000;
        CHECK(n > 4 && high == 0, "special tokens must not come from plain text: %d ids, %d special", n, high);
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }

    t = tok_load(&g, "ggml-vocab-qwen2.gguf", NULL);
    if (t) {
        CHECK(llm_token_bos(t) == 151643 && llm_token_eos(t) == 151645 && llm_tokenizer_adds_bos(t) == 0, "qwen2 bos/eos/add_bos");
        CHECK(llm_token_is_eog(t, 151645) && llm_token_is_eog(t, 151643) && !llm_token_is_eog(t, 151644), "qwen2 end of generation");
        const int32_t chat[] = {151644, 872, 198, 13048, 151645};
        tok_expect(t, "<|im_start|>user\nHi<|im_end|>", 0, 1, chat, 5);
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }

    /* random bytes, valid UTF-8 or not: no crash, and the pieces give the bytes back (SentencePiece: after
     * its space prefix, and with every space and U+2581 read as a space) */
    static const char *const names[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-bpe.gguf",
                                        "ggml-vocab-qwen2.gguf"};
    static const char pool[] = " a\xC3\xA9\n\t1!\xE2\x82\xAC\xE2\x96\x81"; /* é, €, U+2581 */
    uint32_t seed = 12345;
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        t = tok_load(&g, names[f], NULL);
        if (!t) continue;
        int bad_ids = 0, bad_text = 0, bad_chunks = 0;
        for (int c = 0; c < 300; c++) {
            char text[64], back[256], expect[256], stream[1024];
            int32_t ids[256];
            size_t len = (size_t)(c % 40), n_back = 0, n_expect = 0;
            for (size_t i = 0; i < len; i++) {
                seed = seed * 1664525u + 1013904223u;
                /* mostly bytes that make text, some anything */
                text[i] = (seed >> 24) % 4 ? pool[(seed >> 8) % (sizeof pool - 1)] : (char)(seed >> 16);
            }
            int n = llm_tokenize(t, text, len, 0, 0, ids, 256);
            if (n < 0 || n > 256) { bad_ids++; continue; }
            for (int i = 0; i < n; i++) {
                if (ids[i] < 0 || ids[i] >= llm_vocab_size(t)) { bad_ids++; break; }
                int room = n_back < sizeof back ? (int)(sizeof back - n_back) : 0;
                n_back += (size_t)llm_token_to_piece(t, ids[i], 0, room ? back + n_back : NULL, room);
            }
            if (t->kind == LLM_VOCAB_SPM && len > 0) expect[n_expect++] = ' ';
            for (size_t i = 0; i < len; i++) {
                if (t->kind == LLM_VOCAB_SPM && i + 3 <= len && memcmp(text + i, "\xE2\x96\x81", 3) == 0) { expect[n_expect++] = ' '; i += 2; }
                else expect[n_expect++] = text[i];
            }
            bad_text += n_back != n_expect || n_back > sizeof back || memcmp(back, expect, n_back) != 0;
            tok_detok_all(t, ids, n, stream, sizeof stream, &bad_chunks);
        }
        CHECK(bad_ids == 0 && bad_text == 0 && bad_chunks == 0, "%s on random bytes: %d bad ids, %d texts not given back, %d broken chunks",
              names[f], bad_ids, bad_text, bad_chunks);
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }
}

/* A GGUF file in memory, for vocabularies made up on the spot: string keys and string-list keys only. */
typedef struct { unsigned char data[4096]; size_t n; int n_kv; } tok_gguf_buf;

static void tok_gguf_bytes(tok_gguf_buf *b, const void *p, size_t n) {
    if (b->n + n <= sizeof b->data) memcpy(b->data + b->n, p, n);
    b->n += n;
}
static void tok_gguf_u32(tok_gguf_buf *b, uint32_t v) { tok_gguf_bytes(b, &v, 4); }
static void tok_gguf_u64(tok_gguf_buf *b, uint64_t v) { tok_gguf_bytes(b, &v, 8); }
static void tok_gguf_str(tok_gguf_buf *b, const char *s) { tok_gguf_u64(b, strlen(s)); tok_gguf_bytes(b, s, strlen(s)); }
static void tok_gguf_start(tok_gguf_buf *b, int n_kv) {
    b->n = 0; b->n_kv = n_kv;
    tok_gguf_bytes(b, "GGUF", 4); tok_gguf_u32(b, 3); tok_gguf_u64(b, 0); tok_gguf_u64(b, (uint64_t)n_kv);
}
static void tok_gguf_kv_str(tok_gguf_buf *b, const char *key, const char *v) {
    tok_gguf_str(b, key); tok_gguf_u32(b, LLM_GGUF_STRING); tok_gguf_str(b, v);
}
static void tok_gguf_kv_strs(tok_gguf_buf *b, const char *key, const char *const *v, int n) {
    tok_gguf_str(b, key); tok_gguf_u32(b, LLM_GGUF_ARRAY); tok_gguf_u32(b, LLM_GGUF_STRING); tok_gguf_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) tok_gguf_str(b, v[i]);
}

/* Loads the vocabulary in b; checks it fails with a message containing want_err, when that is given. */
static llm_tokenizer *tok_load_mem(llm_gguf *g, const tok_gguf_buf *b, const char *want_err) {
    char err[LLM_ERR_LEN] = "";
    int ok = llm_gguf_parse(g, b->data, b->n, err) == 0;
    CHECK(ok, "made-up GGUF does not parse: %s", err);
    if (!ok) return NULL;
    llm_tokenizer *t = llm_tokenizer_load(g, err);
    if (want_err) CHECK(!t && strstr(err, want_err), "made-up vocabulary: expected an error with \"%s\", got \"%s\"", want_err, t ? "none" : err);
    else CHECK(t != NULL, "made-up vocabulary: %s", err);
    if (!t) llm_gguf_close(g);
    return t;
}

/* Vocabularies that lack things: errors where the tokenizer cannot work, no crash where it can. */
static void test_tokenizer_odd_vocabularies(void) {
    tok_gguf_buf b;
    llm_gguf g;
    llm_tokenizer *t;
    static const char *const bpe_tokens[] = {"a", "b", "ab", "<|end|>"}, *const bpe_merges[] = {"a b", "x y"};
    static const char *const spm_tokens[] = {"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a"};

    tok_gguf_start(&b, 0);
    tok_load_mem(&g, &b, "no tokenizer");
    tok_gguf_start(&b, 1);
    tok_gguf_kv_str(&b, "tokenizer.ggml.model", "bert");
    tok_load_mem(&g, &b, "unsupported tokenizer.ggml.model");
    tok_gguf_start(&b, 1);
    tok_gguf_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    tok_load_mem(&g, &b, "tokenizer.ggml.tokens");
    tok_gguf_start(&b, 2);
    tok_gguf_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    tok_gguf_kv_strs(&b, "tokenizer.ggml.tokens", bpe_tokens, 4);
    tok_load_mem(&g, &b, "merges");
    tok_gguf_start(&b, 4);
    tok_gguf_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    tok_gguf_kv_str(&b, "tokenizer.ggml.pre", "no-such-pre");
    tok_gguf_kv_strs(&b, "tokenizer.ggml.tokens", bpe_tokens, 4);
    tok_gguf_kv_strs(&b, "tokenizer.ggml.merges", bpe_merges, 2);
    tok_load_mem(&g, &b, "tokenizer.ggml.pre");

    /* a BPE vocabulary without most bytes, without token types and without special ids */
    tok_gguf_start(&b, 3);
    tok_gguf_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    tok_gguf_kv_strs(&b, "tokenizer.ggml.tokens", bpe_tokens, 4);
    tok_gguf_kv_strs(&b, "tokenizer.ggml.merges", bpe_merges, 2);
    if ((t = tok_load_mem(&g, &b, NULL))) {
        const int32_t ab[] = {2}, ba[] = {1, 0};
        tok_expect(t, "ab", 0, 0, ab, 1);
        tok_expect(t, "ba", 0, 0, ba, 2);
        tok_expect(t, "ab", 1, 1, ab, 1); /* no BOS to add; "<|end|>" is no special token without types */
        tok_expect(t, "c d\xFF", 0, 0, NULL, 0); /* bytes with no token and no <unk>: nothing */
        CHECK(llm_token_bos(t) == -1 && llm_token_eos(t) == -1 && !llm_tokenizer_adds_bos(t) && !llm_token_is_eog(t, 3),
              "made-up BPE vocabulary: no special ids");
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }
    /* a SentencePiece vocabulary without scores, types or byte tokens: unknown characters become <unk> */
    tok_gguf_start(&b, 2);
    tok_gguf_kv_str(&b, "tokenizer.ggml.model", "llama");
    tok_gguf_kv_strs(&b, "tokenizer.ggml.tokens", spm_tokens, 4);
    if ((t = tok_load_mem(&g, &b, NULL))) {
        const int32_t a[] = {1, 3}, ab[] = {3, 0};
        tok_expect(t, "a", 1, 0, a, 2);
        tok_expect(t, "ab", 0, 0, ab, 2);
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }
}

/* Splits text into words with pre-tokenizer pre and joins them with '|' into out. */
static void tok_split(int pre, const char *text, char *out, size_t cap) {
    size_t len = strlen(text), n = 0;
    uint32_t cp[256];
    char cls[256];
    int off[257], run_end = 0;
    int nc = llm_decode_text(text, len < 256 ? len : 255, cp, cls, off);
    for (int i = 0, end; i < nc; i = end) {
        end = llm_pretok_next(pre, cp, cls, i, nc, &run_end);
        if (i > 0 && n + 1 < cap) out[n++] = '|';
        for (int k = off[i]; k < off[end] && n + 1 < cap; k++) out[n++] = text[k];
    }
    out[n] = 0;
}

/* The hand-written pre-tokenizers against what their regexes give (worked out with Python's regex module, which
 * also agreed on 80,000 random strings; smollm is not among the fixtures). */
static void test_pretokenizers(void) {
    static const struct { const char *text; const char *want[4]; } cases[] = { /* gpt2, llama-bpe, qwen2, smollm */
        {"Hello  world's 12345 x\n\n y!!\r\nZ'LL",
         {"Hello| | world|'s| 12345| x|\n\n| y|!!|\r|\n|Z|'|LL", "Hello| | world|'s| |123|45| x|\n\n| y|!!\r\n|Z|'LL",
          "Hello| | world|'s| |1|2|3|4|5| x|\n\n| y|!!\r\n|Z|'LL", "Hello| | world|'s| |1|2|3|4|5| x|\n\n| y|!!|\r|\n|Z|'|LL"}},
        {" 3.14\t\xCF\x80\xE2\x89\x88 \xC2\xBD\xC2\xB2  \xC2\xA0" "end  ", /* π ≈ ½ ² U+00A0 */
         {" 3|.|14|\t|\xCF\x80|\xE2\x89\x88| \xC2\xBD\xC2\xB2|  |\xC2\xA0|end|  ",
          " |3|.|14|\t\xCF\x80|\xE2\x89\x88| |\xC2\xBD\xC2\xB2|  |\xC2\xA0" "end|  ",
          " |3|.|1|4|\t\xCF\x80|\xE2\x89\x88| |\xC2\xBD|\xC2\xB2|  |\xC2\xA0" "end|  ",
          " |3|.|1|4|\t|\xCF\x80|\xE2\x89\x88| |\xC2\xBD|\xC2\xB2|  |\xC2\xA0|end|  "}},
    };
    static const int pres[4] = {LLM_PRE_GPT2, LLM_PRE_LLAMA3, LLM_PRE_QWEN2, LLM_PRE_SMOLLM};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int k = 0; k < 4; k++) {
            char got[512];
            tok_split(pres[k], cases[c].text, got, sizeof got);
            CHECK(strcmp(got, cases[c].want[k]) == 0, "pre-tokenizer %d on case %d", pres[k], (int)c);
            if (strcmp(got, cases[c].want[k]) != 0) {
                printf("    want: "); tok_print_escaped(cases[c].want[k], strlen(cases[c].want[k]));
                printf("\n    got:  "); tok_print_escaped(got, strlen(got)); printf("\n");
            }
        }
    }
}

/* Decodes the JSON string whose opening quote is at q into out (room for cap bytes); returns its length. */
static size_t tok_json_string(const char *q, char *out, size_t cap) {
    size_t n = 0;
    for (q++; *q && *q != '"'; q++) {
        char enc[4];
        int e = 1;
        enc[0] = *q;
        if (*q == '\\' && q[1]) {
            q++;
            enc[0] = *q == 'n' ? '\n' : *q == 't' ? '\t' : *q == 'r' ? '\r' : *q;
            if (*q == 'u') {
                char hex[5] = {0};
                memcpy(hex, q + 1, 4); q += 4;
                uint32_t c = (uint32_t)strtoul(hex, NULL, 16);
                if (c >= 0xD800 && c < 0xDC00 && q[1] == '\\' && q[2] == 'u') { /* a surrogate pair */
                    memcpy(hex, q + 3, 4); q += 6;
                    c = 0x10000 + ((c - 0xD800) << 10) + ((uint32_t)strtoul(hex, NULL, 16) - 0xDC00);
                }
                e = llm_utf8_encode(c, enc);
            }
        }
        for (int k = 0; k < e; k++, n++) if (n < cap) out[n] = enc[k];
    }
    return n;
}

/* The next c in p that is outside any JSON string, or NULL. */
static const char *tok_json_find(const char *p, char c) {
    for (int in_string = 0; *p; p++) {
        if (in_string && *p == '\\' && p[1]) p++;
        else if (*p == '"') in_string = !in_string;
        else if (!in_string && *p == c) return p;
    }
    return NULL;
}

/* The value of "key" in the object that starts at obj (and ends before end), or NULL. */
static const char *tok_json_value(const char *obj, const char *end, const char *key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *p = strstr(obj, quoted);
    if (!p || (end && p >= end)) return NULL;
    p += strlen(quoted);
    return p + strspn(p, ": \n");
}

/* llama.cpp's greedy completions in shared/reference, as ids and as text: streaming the ids through the
 * detokenizer must give the text byte for byte (random-weight models emit broken UTF-8 too). The stories260K
 * prompts, with BOS, must also detokenize back to " " + prompt. */
static void test_detokenizer_references(void) {
    static const char *const files[] = {"stories260K-greedy.json", "random-models-greedy.json"};
    for (size_t f = 0; f < 2; f++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/reference/%s", shared_dir, files[f]);
        char *json = read_file(path, NULL);
        CHECK(json != NULL, "read %s", path);
        if (!json) continue;
        int cases = 0;
        /* the files are a list of flat objects; each has "prompt", "completion" and "completion_token_ids" */
        for (const char *obj = tok_json_find(json, '{'), *end; obj; obj = tok_json_find(end, '{'), cases++) {
            if (!(end = tok_json_find(obj, '}'))) break;
            char model[256] = "stories260K.gguf", prompt[1024], completion[4096];
            const char *v = tok_json_value(obj, end, "model"), *vp = tok_json_value(obj, end, "prompt");
            const char *vc = tok_json_value(obj, end, "completion"), *vi = tok_json_value(obj, end, "completion_token_ids");
            CHECK(vp && vc && vi && *vp == '"' && *vc == '"' && *vi == '[', "%s case %d: unexpected layout", files[f], cases);
            if (!vp || !vc || !vi) break;
            if (v) {
                size_t n_model = tok_json_string(v, model, sizeof model - 1);
                model[n_model < sizeof model ? n_model : sizeof model - 1] = 0;
            }
            size_t n_prompt = tok_json_string(vp, prompt, sizeof prompt), n_completion = tok_json_string(vc, completion, sizeof completion);
            int32_t ids[512];
            int n_ids = 0;
            for (const char *a = vi + 1; n_ids < 512;) {
                char *e;
                long id = strtol(a, &e, 10);
                if (e == a) break;
                ids[n_ids++] = (int32_t)id;
                a = e + strspn(e, ", \n");
            }

            llm_gguf g;
            char err[LLM_ERR_LEN] = "";
            snprintf(path, sizeof path, "%s/models/%s", shared_dir, model);
            if (llm_gguf_open(&g, path, err) != 0) { CHECK(0, "open %s: %s", path, err); continue; }
            llm_tokenizer *t = llm_tokenizer_load(&g, err);
            CHECK(t != NULL, "tokenizer of %s: %s", model, err);
            if (t) {
                char text[8192];
                int bad = 0;
                size_t n = tok_detok_all(t, ids, n_ids, text, sizeof text, &bad);
                CHECK(n_ids > 0 && n == n_completion && memcmp(text, completion, n) == 0 && bad == 0,
                      "%s: %d completion ids do not detokenize to the reference completion", model, n_ids);
                if (f == 0) {
                    int32_t pids[256];
                    int np = llm_tokenize(t, prompt, n_prompt, llm_tokenizer_adds_bos(t), 0, pids, 256);
                    char expect[1100] = " ";
                    memcpy(expect + 1, prompt, n_prompt);
                    n = tok_detok_all(t, pids, np, text, sizeof text, &bad);
                    CHECK(np >= 1 && pids[0] == 1 && n == (n_prompt ? n_prompt + 1 : 0) && memcmp(text, expect, n) == 0,
                          "stories260K prompt \"%s\": BOS and the prompt back", prompt);
                }
                llm_tokenizer_free(t);
            }
            llm_gguf_close(&g);
        }
        CHECK(cases == (f == 0 ? 3 : 4), "%s: %d cases", files[f], cases);
        free(json);
    }
}
