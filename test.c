/* test.c - the test suite. Plain C, no framework: each test_* function checks real values with CHECK and the
 * run ends with the line "N passed, N failed". Test data is read from testdata/ (see its README).
 *
 *   ./llm-test [TESTDATA_DIR]         everything that runs on the CPU (make test)
 *   ./llm-test --gpu [TESTDATA_DIR]   the CUDA kernels against the CPU reference (make test-gpu, built
 *                                     with CUDA)
 *   LLM_TEST=server,chat              only the tests whose names hold one of these words
 *   LLM_TEST_JOBS=N                   the tests in N processes at once, 1 to 64 (make test under the
 *                                     sanitizers: nproc) */
#define _GNU_SOURCE  /* memmem */
#define LLM_IMPLEMENTATION
static void (*test_after_add)(void);  /* the hardening tests' hook in llm_engine_add_request */
#define LLM_TEST_AFTER_ADD() do { if (test_after_add) test_after_add(); } while (0)
#include <stdint.h>
static void test_grammar_job(uint64_t request_id); /* the grammar thread's tests hold it, and see its turns */
#define LLM_TEST_GRAMMAR_JOB(id) test_grammar_job(id)
#include "llm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <math.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <dirent.h>
#include <glob.h>

static int n_passed, n_failed;
#define CHECK(cond, ...) do { if (cond) n_passed++; else { n_failed++; \
    printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static const char *testdata_dir = "testdata";

/* Under AddressSanitizer (make test SANITIZE=1) the slowest numeric tests check a part of their cases (fewer
 * runs, positions or tokens): the memory checks need the same paths, not the same count, and all of them take
 * over half an hour there. The plain make test checks every case. */
#ifdef LLM_ASAN /* llm.h's test for AddressSanitizer (GCC's and Clang's) */
#define UNDER_ASAN 1
#else
#define UNDER_ASAN 0
#endif
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); fclose(f); return NULL; }
    buf[n] = 0; fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

/* ===========================================================================================================
 * Tokenizer: llama.cpp's fixtures in testdata/tokenizer (texts and the ids llama.cpp gives them), the
 * streaming detokenizer, vocabularies made up on the spot
 * ======================================================================================================== */

/* Is s[0..n) valid UTF-8? Written apart from the tokenizer's own checker, from the definition: shortest form,
 * no surrogates, nothing past U+10FFFF. */
static int tok_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        uint32_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 :
                     (c & 0xF8) == 0xF0 ? 4 : 0;
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
static size_t tok_detok_all(const llm_tokenizer *t, const int32_t *ids, int n, char *out, size_t cap,
                            int *bad_chunks) {
    llm_detok d = {{0}, 0, 0};
    char chunk[1024];
    size_t len = 0;
    for (int i = 0; i <= n; i++) {
        int m = i < n ? llm_detok_push(t, &d, ids[i], chunk, (int)sizeof chunk)
                      : llm_detok_flush(&d, chunk, (int)sizeof chunk);
        if (m < 0 || m > (int)sizeof chunk) { (*bad_chunks)++; continue; }
        if (!tok_utf8_valid(chunk, (size_t)m)) (*bad_chunks)++;
        if (len + (size_t)m <= cap) memcpy(out + len, chunk, (size_t)m);
        len += (size_t)m;
    }
    return len;
}

/* Loads testdata/tokenizer/<name>; NULL (and a failed check) when it cannot. */
static llm_tokenizer *tok_load(llm_gguf *g, const char *name, double *ms) {
    char path[1024], err[LLM_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/tokenizer/%s", testdata_dir, name);
    int ok = llm_gguf_open(g, path, err) == 0;
    CHECK(ok, "open %s: %s", path, err);
    if (!ok) return NULL;
    double t0 = llm_now();
    llm_tokenizer *t = llm_tokenizer_load(g, err);
    if (ms) *ms = (llm_now() - t0) * 1e3;
    CHECK(t != NULL, "load tokenizer %s: %s", name, err);
    if (!t) llm_gguf_close(g);
    return t;
}

static void test_tokenizer_fixtures(void) {
    static const char *const names[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf",
                                        "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf"};
    static const char sep[] = "\n__ggml_vocab_test__\n";
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        char path[1024];
        llm_gguf g;
        double ms = 0;
        llm_tokenizer *t = tok_load(&g, names[f], &ms);
        if (!t) continue;
        snprintf(path, sizeof path, "%s/tokenizer/%s.inp", testdata_dir, names[f]);
        char *inp = read_file(path, NULL);
        CHECK(inp != NULL, "read %s", path);
        snprintf(path, sizeof path, "%s/tokenizer/%s.out", testdata_dir, names[f]);
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
            if (len >= sizeof expect) {
                CHECK(0, "%s case %d: a text longer than this test expects", names[f], cases);
                len = 0;
            }
            if (t->kind == LLM_VOCAB_SPM && t->add_space_prefix && len > 0) expect[n_expect++] = ' ';
            memcpy(expect + n_expect, text, len);
            n_expect += len;
            size_t n_back = tok_detok_all(t, want, n_want, back, sizeof back, &bad_chunks);
            int back_same = n_back == n_expect && memcmp(back, expect, n_back) == 0;
            detok_ok += back_same;
            CHECK(back_same, "%s case %d: detokenized text differs", names[f], cases);
            if (!back_same) {
                printf("    want: \""); tok_print_escaped(expect, n_expect); printf("\"\n");
                printf("    got:  \"");
                tok_print_escaped(back, n_back < sizeof back ? n_back : sizeof back);
                printf("\"\n");
            }
            cases++;
        }
        CHECK(cases == 46, "%s: %d texts, expected 46", names[f], cases);
        CHECK(line == NULL || *line == 0, "%s: more lines of ids than texts", names[f]);
        CHECK(bad_chunks == 0, "%s: the streaming detokenizer wrote %d chunks that are not valid UTF-8",
              names[f], bad_chunks);
        printf("tokenizer %-28s %d tokens, loaded in %.0f ms: %d/%d cases give llama.cpp's ids, "
               "%d/%d detokenize back\n",
               names[f], llm_tokenizer_n_vocab(t), ms, tok_ok, cases, detok_ok, cases);
        free(inp); free(outp);
        llm_tokenizer_free(t);
        llm_gguf_close(&g);
    }
}

/* Pushes one id and checks the bytes written are exactly want[0..n_want). */
static void tok_push_expect(const llm_tokenizer *t, llm_detok *d, int32_t id, const char *want, int n_want,
                            const char *what) {
    char out[256];
    memset(out, 'x', sizeof out);
    int n = llm_detok_push(t, d, id, out, (int)sizeof out);
    CHECK(n == n_want && memcmp(out, want, (size_t)n_want) == 0, "%s: push %d wrote %d bytes, expected %d",
          what, id, n, n_want);
    CHECK(tok_utf8_valid(out, n > 0 ? (size_t)n : 0), "%s: push %d wrote broken UTF-8", what, id);
}

/* Checks that id's piece is exactly the bytes want[0..n). */
static void tok_piece_expect(const llm_tokenizer *t, int32_t id, const char *want, int n) {
    char buf[64];
    int k = llm_tokenizer_piece(t, id, 0, buf, (int)sizeof buf);
    CHECK(k == n && memcmp(buf, want, (size_t)n) == 0, "token %d: piece of %d bytes, expected %d", id, k, n);
}

static void test_detokenizer_streaming(void) {
    llm_gguf g;
    llm_tokenizer *t = tok_load(&g, "ggml-vocab-llama-spm.gguf", NULL);
    if (t) {
        llm_detok d = {{0}, 0, 0};
        char out[64];
        /* SentencePiece byte tokens: <0xNN> is id 3 + NN in this vocabulary */
        tok_piece_expect(t, 229, "\xE2", 1);
        tok_piece_expect(t, 133, "\x82", 1);
        tok_piece_expect(t, 175, "\xAC", 1);
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
        CHECK(llm_detok_flush(&d, out, 2) == 3 && d.n_pending == 2,
              "flush with too little room must write nothing and say 3");
        CHECK(llm_detok_flush(&d, out, (int)sizeof out) == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0,
              "flush of an unfinished character");
        CHECK(llm_detok_flush(&d, out, (int)sizeof out) == 0, "second flush must write nothing");
        /* too little room: nothing written, nothing consumed, the room needed returned */
        memset(out, 'x', sizeof out);
        int need = llm_detok_push(t, &d, 15043, out, 3);
        CHECK(need == 6 && out[0] == 'x' && d.n_pending == 0,
              "push with too little room: returned %d, expected 6 and nothing written", need);
        tok_push_expect(t, &d, 15043, " Hello", 6, "push again with room");
        /* control tokens show nothing in the stream, and their text only when asked;
         * ids out of range nothing */
        tok_push_expect(t, &d, 2, "", 0, "</s>");
        CHECK(llm_tokenizer_piece(t, 2, 1, out, (int)sizeof out) == 4 && memcmp(out, "</s>", 4) == 0,
              "</s> as special");
        CHECK(llm_tokenizer_piece(t, 2, 0, out, (int)sizeof out) == 0, "</s> not special");
        tok_push_expect(t, &d, 32000, "", 0, "id past the vocabulary");
        tok_push_expect(t, &d, -1, "", 0, "id -1");
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }

    t = tok_load(&g, "ggml-vocab-gpt-2.gguf", NULL);
    if (t) {
        /* GPT-2 splits "😀" into a token for its first three bytes and one for the last */
        llm_detok d = {{0}, 0, 0};
        int32_t ids[8];
        int n = llm_tokenize(t, "\xF0\x9F\x98\x80", 4, 0, 0, ids, 8);
        CHECK(n == 2 && ids[0] == 47249 && ids[1] == 222, "GPT-2 tokens of U+1F600: %d ids, %d %d",
              n, ids[0], ids[1]);
        tok_piece_expect(t, 47249, "\xF0\x9F\x98", 3);
        tok_push_expect(t, &d, 47249, "", 0, "half an emoji");
        tok_push_expect(t, &d, 222, "\xF0\x9F\x98\x80", 4, "the other half");
        tok_push_expect(t, &d, 15496, "Hello", 5, "Hello");
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }
}

/* Tokenizes text and checks the ids are exactly want[0..n_want). */
static void tok_expect(const llm_tokenizer *t, const char *text, int add_bos, int parse_special,
                       const int32_t *want, int n_want) {
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
        CHECK(llm_tokenizer_bos(t) == 1 && llm_tokenizer_eos(t) == 2 && llm_tokenizer_adds_bos(t) == 1,
              "llama-spm bos/eos/add_bos");
        CHECK(llm_tokenizer_is_eog(t, 2) && !llm_tokenizer_is_eog(t, 1) && !llm_tokenizer_is_eog(t, 15043),
              "llama-spm end of generation");
        CHECK(llm_tokenizer_n_vocab(t) == 32000, "llama-spm vocab size %d", llm_tokenizer_n_vocab(t));
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
        CHECK(llm_tokenizer_piece(t, -1, 0, buf, 8) == -1 && llm_tokenizer_piece(t, 32000, 0, buf, 8) == -1,
              "piece of a bad id");
        CHECK(llm_tokenizer_piece(t, 15043, 0, buf, 3) == 6 && memcmp(buf, " He", 3) == 0 && buf[3] == 'x',
              "piece into a small buffer");
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }

    t = tok_load(&g, "ggml-vocab-llama-bpe.gguf", NULL);
    if (t) {
        /* llama.cpp adds BOS for llama-bpe vocabularies that do not say */
        CHECK(llm_tokenizer_bos(t) == 128000 && llm_tokenizer_eos(t) == 128001 &&
              llm_tokenizer_adds_bos(t) == 1, "llama-bpe bos/eos/add_bos");
        CHECK(llm_tokenizer_is_eog(t, 128001) && llm_tokenizer_is_eog(t, 128009) &&
              !llm_tokenizer_is_eog(t, 128000) && !llm_tokenizer_is_eog(t, 9906),
              "llama-bpe end of generation");
        const int32_t special[] = {128000, 9906, 1917, 128009};
        tok_expect(t, "<|begin_of_text|>Hello world<|eot_id|>", 0, 1, special, 4);
        int32_t ids[64];
        int n = llm_tokenize(t, "<|begin_of_text|>Hello world<|eot_id|>", 38, 0, 0, ids, 64), high = 0;
        for (int i = 0; i < n && i < 64; i++) high += ids[i] >= 128000;
        CHECK(n > 4 && high == 0, "special tokens must not come from plain text: %d ids, %d special",
              n, high);
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }

    t = tok_load(&g, "ggml-vocab-qwen2.gguf", NULL);
    if (t) {
        CHECK(llm_tokenizer_bos(t) == 151643 && llm_tokenizer_eos(t) == 151645 &&
              llm_tokenizer_adds_bos(t) == 0, "qwen2 bos/eos/add_bos");
        CHECK(llm_tokenizer_is_eog(t, 151645) && llm_tokenizer_is_eog(t, 151643) &&
              !llm_tokenizer_is_eog(t, 151644), "qwen2 end of generation");
        const int32_t chat[] = {151644, 872, 198, 13048, 151645};
        tok_expect(t, "<|im_start|>user\nHi<|im_end|>", 0, 1, chat, 5);
        /* user-defined tokens (<think>, <tool_call>, ...) are taken whole even from plain text, as llama.cpp
         * takes them; control tokens are not */
        int32_t x;
        CHECK(llm_tokenize(t, "x", 1, 0, 0, &x, 1) == 1, "qwen2: \"x\" is one token");
        const int32_t think[] = {151667, x, 151668};
        tok_expect(t, "<think>x</think>", 0, 0, think, 3);
        tok_expect(t, "<think>x</think>", 0, 1, think, 3);
        int32_t ids[16];
        CHECK(llm_tokenize(t, "<|im_end|>", 10, 0, 0, ids, 16) > 1, "qwen2: <|im_end|> as plain text");
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }

    /* random bytes, valid UTF-8 or not: no crash, and the pieces give the bytes back (SentencePiece: after
     * its space prefix, and with every space and U+2581 read as a space) */
    static const char *const names[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf",
                                        "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf"};
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
                if (ids[i] < 0 || ids[i] >= llm_tokenizer_n_vocab(t)) { bad_ids++; break; }
                int room = n_back < sizeof back ? (int)(sizeof back - n_back) : 0;
                n_back += (size_t)llm_tokenizer_piece(t, ids[i], 0, room ? back + n_back : NULL, room);
            }
            if (t->kind == LLM_VOCAB_SPM && len > 0) expect[n_expect++] = ' ';
            for (size_t i = 0; i < len; i++) {
                if (t->kind == LLM_VOCAB_SPM && i + 3 <= len && memcmp(text + i, "\xE2\x96\x81", 3) == 0) {
                    expect[n_expect++] = ' ';
                    i += 2;
                } else expect[n_expect++] = text[i];
            }
            bad_text += n_back != n_expect || n_back > sizeof back || memcmp(back, expect, n_back) != 0;
            tok_detok_all(t, ids, n, stream, sizeof stream, &bad_chunks);
        }
        CHECK(bad_ids == 0 && bad_text == 0 && bad_chunks == 0,
              "%s on random bytes: %d bad ids, %d texts not given back, %d broken chunks",
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
static void tok_gguf_str(tok_gguf_buf *b, const char *s) {
    tok_gguf_u64(b, strlen(s)); tok_gguf_bytes(b, s, strlen(s));
}
static void tok_gguf_start(tok_gguf_buf *b, int n_kv) {
    b->n = 0; b->n_kv = n_kv;
    tok_gguf_bytes(b, "GGUF", 4); tok_gguf_u32(b, 3); tok_gguf_u64(b, 0); tok_gguf_u64(b, (uint64_t)n_kv);
}
static void tok_gguf_kv_str(tok_gguf_buf *b, const char *key, const char *v) {
    tok_gguf_str(b, key); tok_gguf_u32(b, LLM_GGUF_STRING); tok_gguf_str(b, v);
}
static void tok_gguf_kv_strs(tok_gguf_buf *b, const char *key, const char *const *v, int n) {
    tok_gguf_str(b, key); tok_gguf_u32(b, LLM_GGUF_ARRAY); tok_gguf_u32(b, LLM_GGUF_STRING);
    tok_gguf_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) tok_gguf_str(b, v[i]);
}

static void tok_gguf_kv_i32s(tok_gguf_buf *b, const char *key, const int32_t *v, int n) {
    tok_gguf_str(b, key); tok_gguf_u32(b, LLM_GGUF_ARRAY); tok_gguf_u32(b, LLM_GGUF_I32);
    tok_gguf_u64(b, (uint64_t)n); tok_gguf_bytes(b, v, (size_t)n * 4);
}

/* Loads the vocabulary in b; checks it fails with a message containing want_err, when that is given. */
static llm_tokenizer *tok_load_mem(llm_gguf *g, const tok_gguf_buf *b, const char *want_err) {
    char err[LLM_ERR_LEN] = "";
    int ok = llm_gguf_parse(g, b->data, b->n, err) == 0;
    CHECK(ok, "made-up GGUF does not parse: %s", err);
    if (!ok) return NULL;
    llm_tokenizer *t = llm_tokenizer_load(g, err);
    if (want_err) CHECK(!t && strstr(err, want_err),
                        "made-up vocabulary: expected an error with \"%s\", got \"%s\"",
                        want_err, t ? "none" : err);
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
    static const char *const spm_tokens[] = {"<unk>", "<s>", "</s>", ("\xE2\x96\x81" "a")};

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
    /* a pre-tokenizer it does not know: split as llama.cpp's 'default', with a warning */
    if ((t = tok_load_mem(&g, &b, NULL))) {
        const int32_t ab[] = {2, 2};
        CHECK(strstr(llm_tokenizer_warning(t), "unknown pre-tokenizer 'no-such-pre'") != NULL,
              "unknown pre-tokenizer: warning \"%s\"", llm_tokenizer_warning(t));
        CHECK(t->pre == LLM_PRE_DEFAULT, "unknown pre-tokenizer: split as 'default'");
        tok_expect(t, "abab", 0, 0, ab, 2); /* ([0-9]{3} and the rest have nothing to cut here) */
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }

    /* a BPE vocabulary without most bytes, without token types and without special ids */
    tok_gguf_start(&b, 3);
    tok_gguf_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    tok_gguf_kv_strs(&b, "tokenizer.ggml.tokens", bpe_tokens, 4);
    tok_gguf_kv_strs(&b, "tokenizer.ggml.merges", bpe_merges, 2);
    if ((t = tok_load_mem(&g, &b, NULL))) {
        CHECK(strstr(llm_tokenizer_warning(t), "no pre-tokenizer") != NULL,
              "no tokenizer.ggml.pre: warning \"%s\"", llm_tokenizer_warning(t));
        const int32_t ab[] = {2}, ba[] = {1, 0};
        tok_expect(t, "ab", 0, 0, ab, 1);
        tok_expect(t, "ba", 0, 0, ba, 2);
        tok_expect(t, "ab", 1, 1, ab, 1); /* no BOS to add; "<|end|>" is no special token without types */
        tok_expect(t, "c d\xFF", 0, 0, NULL, 0); /* bytes with no token and no <unk>: nothing */
        CHECK(llm_tokenizer_bos(t) == -1 && llm_tokenizer_eos(t) == -1 && !llm_tokenizer_adds_bos(t) &&
              !llm_tokenizer_is_eog(t, 3), "made-up BPE vocabulary: no special ids");
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

/* Splits text into words with pre-tokenizer pattern pre and joins them with '|' into out. */
static void tok_split(int pre, const char *text, char *out, size_t cap) {
    size_t len = strlen(text), n = 0;
    uint32_t cp[256];
    char cls[256];
    uint8_t cut[257];
    int off[257];
    int nc = llm_decode_text(text, len < 256 ? len : 255, cp, cls, off);
    llm_pretokenize(pre, cp, cls, nc, cut);
    for (int i = 0; i < nc; i++) {
        if (i > 0 && cut[i] && n + 1 < cap) out[n++] = '|';
        for (int k = off[i]; k < off[i + 1] && n + 1 < cap; k++) out[n++] = text[k];
    }
    out[n] = 0;
}

/* The hand-written pre-tokenizers against what their regexes give (worked out with Python's regex module,
 * which also agreed on 80,000 random strings; smollm is not among the fixtures). */
static void test_pretokenizers(void) {
    /* gpt2, llama-bpe, qwen2, smollm */
    static const struct { const char *text; const char *want[4]; } cases[] = {
        {"Hello  world's 12345 x\n\n y!!\r\nZ'LL",
         {"Hello| | world|'s| 12345| x|\n\n| y|!!|\r|\n|Z|'|LL",
          "Hello| | world|'s| |123|45| x|\n\n| y|!!\r\n|Z|'LL",
          "Hello| | world|'s| |1|2|3|4|5| x|\n\n| y|!!\r\n|Z|'LL",
          "Hello| | world|'s| |1|2|3|4|5| x|\n\n| y|!!|\r|\n|Z|'|LL"}},
        {" 3.14\t\xCF\x80\xE2\x89\x88 \xC2\xBD\xC2\xB2  \xC2\xA0" "end  ", /* π ≈ ½ ² U+00A0 */
         {" 3|.|14|\t|\xCF\x80|\xE2\x89\x88| \xC2\xBD\xC2\xB2|  |\xC2\xA0|end|  ",
          " |3|.|14|\t\xCF\x80|\xE2\x89\x88| |\xC2\xBD\xC2\xB2|  |\xC2\xA0" "end|  ",
          " |3|.|1|4|\t\xCF\x80|\xE2\x89\x88| |\xC2\xBD|\xC2\xB2|  |\xC2\xA0" "end|  ",
          " |3|.|1|4|\t|\xCF\x80|\xE2\x89\x88| |\xC2\xBD|\xC2\xB2|  |\xC2\xA0|end|  "}},
    };
    static const int pres[4] = {LLM_PRE_GPT2, LLM_PRE_LLAMA3, LLM_PRE_QWEN2, LLM_PRE_STARCODER};
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

/* The CPU seconds this thread spends splitting n copies of unit, then tail, with pattern pre. */
static double tok_split_seconds(int pre, const char *unit, int n, const char *tail) {
    size_t unit_len = strlen(unit), tail_len = strlen(tail), len = unit_len * (size_t)n + tail_len;
    char *text = (char *)malloc(len);
    uint32_t *cp = (uint32_t *)malloc(len * sizeof *cp);
    char *cls = (char *)malloc(len);
    uint8_t *cut = (uint8_t *)malloc(len + 1);
    int *off = (int *)malloc((len + 1) * sizeof *off);
    struct timespec a, b;
    for (int i = 0; i < n; i++) memcpy(text + (size_t)i * unit_len, unit, unit_len);
    memcpy(text + unit_len * (size_t)n, tail, tail_len);
    int nc = llm_decode_text(text, len, cp, cls, off);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    llm_pretokenize(pre, cp, cls, nc, cut);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    free(text); free(cp); free(cls); free(cut); free(off);
    return (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
}

/* Request bytes drive the pre-tokenizer's work: the runs that its kinds cut in parts or fail inside (digits
 * cut in threes from the end, superbpe's empty matches, jais2's spaces 512 at a time, deepseek-llm's \s+$
 * before a digit) cost linear time, as letters do: each within 20x the same length of letters, plus 50 ms
 * (CPU time of this thread: a slow shared machine does not count). Scanning the rest of the run at each
 * match made 50,000 digits take seconds (50,000 letters: about a millisecond), 300,000 spaces for jais2
 * about 2 s. */
static void test_pretokenizer_long_runs(void) {
    /* jais2's longer: its quadratic cost was 512 times smaller */
    static const struct { int pre; const char *name, *unit, *tail; int n; } runs[] = {
        {LLM_PRE_TINY_AYA, "tiny_aya", "1", "", 50000}, {LLM_PRE_TINY_AYA, "tiny_aya", "1", "a", 50000},
        {LLM_PRE_AFMOE, "afmoe", "1", "", 50000}, {LLM_PRE_SUPERBPE, "superbpe", "1", "x", 50000},
        {LLM_PRE_JAIS2, "jais-2", " ", "x", 300000}, {LLM_PRE_DEEPSEEK_LLM, "deepseek-llm", "\t", "1", 50000},
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        int n = runs[k].n;
        double letters = tok_split_seconds(runs[k].pre, "a", n, runs[k].tail);
        double run = tok_split_seconds(runs[k].pre, runs[k].unit, n, runs[k].tail);
        CHECK(run <= 20 * letters + 0.05, "%s: %d of \"%s\" then \"%s\" split in %.3f s (letters: %.4f s)",
              runs[k].name, n, runs[k].unit[0] == '\t' ? "\\t" : runs[k].unit, runs[k].tail, run, letters);
    }
}

/* The CPU seconds this thread spends tokenizing n copies of unit with special tokens parsed */
static double tok_seconds(const llm_tokenizer *t, const char *unit, int n) {
    size_t unit_len = strlen(unit), len = unit_len * (size_t)n;
    char *text = (char *)malloc(len);
    int32_t *ids = (int32_t *)malloc((len + 2) * sizeof *ids);
    struct timespec a, b;
    for (int i = 0; i < n; i++) memcpy(text + (size_t)i * unit_len, unit, unit_len);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    int got = llm_tokenize(t, text, len, 0, 1, ids, (int)len + 2);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    CHECK(got > 0, "tokenize %d copies of \"%s\"", n, unit);
    free(text); free(ids);
    return (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
}

/* Special tokens are found by a search bounded per position, not a scan of them all: Llama 3's 256 all
 * start with "<|", and 1 MB of "<| " (a position in three to search) tokenizes within 3x the time of 1 MB
 * of "(| " (none), plus 50 ms (this thread's CPU time); the scan took 5x. */
static void test_special_token_search(void) {
    llm_gguf g;
    llm_tokenizer *t = tok_load(&g, "ggml-vocab-llama-bpe.gguf", NULL);
    if (!t) return;
    const int n = (1 << 20) / 3;
    double plain = tok_seconds(t, "(| ", n), starts = tok_seconds(t, "<| ", n);
    CHECK(starts <= 3 * plain + 0.05, "llama-bpe: 1 MB of \"<| \" tokenized in %.3f s, of \"(| \" in %.3f s",
          starts, plain);
    llm_tokenizer_free(t); llm_gguf_close(&g);
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


/* ===========================================================================================================
 * Model, forward pass, sampler, block manager, scheduler, engine, the llm command
 * ======================================================================================================== */
/* -----------------------------------------------------------------------------------------------------------
 * The reference files: llama.cpp's greedy completions, read with the small JSON helpers above
 * -------------------------------------------------------------------------------------------------------- */
typedef struct {
    char model[256], prompt[1024], completion[4096];
    size_t n_prompt, n_completion;
    int32_t ids[512];
    int n_ids, max_tokens;
    int n_ctx;          /* the context llama.cpp ran with where the case names it (the engine's
                         * max_model_len) */
    float gaps[512];    /* top2_logprob_gaps where the case has them: llama.cpp's top-two gap at each step */
    int n_gaps;
} ref_case;

/* Reads testdata/reference/<file> (a list of flat objects) into cases, the ids from the key ids_key; returns
 * how many. */
static int load_ref_cases(const char *file, const char *ids_key, ref_case *cases, int cap) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reference/%s", testdata_dir, file);
    char *json = read_file(path, NULL);
    CHECK(json != NULL, "read %s", path);
    if (!json) return 0;
    int n = 0;
    for (const char *obj = tok_json_find(json, '{'), *end; obj && n < cap; obj = tok_json_find(end, '{')) {
        if (!(end = tok_json_find(obj, '}'))) break;
        ref_case *c = &cases[n];
        memset(c, 0, sizeof *c);
        strcpy(c->model, "stories260K.gguf");
        const char *v = tok_json_value(obj, end, "model"), *vp = tok_json_value(obj, end, "prompt");
        const char *vc = tok_json_value(obj, end, "completion"),
                   *vi = tok_json_value(obj, end, ids_key);
        const char *vm = tok_json_value(obj, end, "max_tokens"), *vn = tok_json_value(obj, end, "n_ctx");
        CHECK(vp && vi && vm && *vp == '"' && (!vc || *vc == '"') && *vi == '[',
              "%s case %d: unexpected layout", file, n);
        if (!vp || !vi || !vm) break;
        if (v) {
            size_t len = tok_json_string(v, c->model, sizeof c->model - 1);
            c->model[len < sizeof c->model ? len : sizeof c->model - 1] = 0;
        }
        c->n_prompt = tok_json_string(vp, c->prompt, sizeof c->prompt - 1);
        c->prompt[c->n_prompt < sizeof c->prompt ? c->n_prompt : sizeof c->prompt - 1] = 0;
        c->n_completion = vc ? tok_json_string(vc, c->completion, sizeof c->completion) : 0; /* ids only */
        c->max_tokens = atoi(vm);
        c->n_ctx = vn ? atoi(vn) : 0;
        for (const char *a = vi + 1; c->n_ids < 512;) {
            char *e;
            long id = strtol(a, &e, 10);
            if (e == a) break;
            c->ids[c->n_ids++] = (int32_t)id;
            a = e + strspn(e, ", \n");
        }
        const char *vg = tok_json_value(obj, end, "top2_logprob_gaps");
        for (const char *a = vg && *vg == '[' ? vg + 1 : NULL; a && c->n_gaps < 512;) {
            char *e;
            float gap = strtof(a, &e);
            if (e == a) break;
            c->gaps[c->n_gaps++] = gap;
            a = e + strspn(e, ", \n");
        }
        n++;
    }
    free(json);
    return n;
}

/* stories260K's cases (stories260K-greedy.json, 4 at most) in an array the caller frees; *n: how many */
static ref_case *stories_cases(int *n) {
    ref_case *cases = (ref_case *)calloc(4, sizeof *cases);
    *n = load_ref_cases("stories260K-greedy.json", "completion_token_ids", cases, 4);
    return cases;
}

static const char *model_path(const char *name) {
    static char paths[8][1024];   /* a few at a time stay valid: engine configs keep the pointer */
    static int next;
    char *path = paths[next++ % 8];
    snprintf(path, 1024, "%s/models/%s", testdata_dir, name);
    return path;
}

/* A copy of a shared model with the value of one key (or element index of an array key) overwritten by n
 * bytes of the same type. Writes the copy's path to path (room for 64); 0 on success. */
static int gguf_patched(const char *model, const char *key, uint64_t index, const void *bytes, size_t n,
                        char *path) {
    size_t size;
    char *file = read_file(model_path(model), &size), err[LLM_ERR_LEN];
    llm_gguf g;
    if (!file || llm_gguf_parse(&g, file, size, err) != 0) { free(file); return -1; }
    const llm_gguf_kv *kv = llm_gguf_find(&g, key);
    int ok = kv != NULL;
    if (ok) memcpy(file + (kv->data - g.base) + index * n, bytes, n);
    llm_gguf_close(&g);
    strcpy(path, "/tmp/llm-test-patched-XXXXXX");
    int fd = ok ? mkstemp(path) : -1;
    if (fd >= 0) { ok = write(fd, file, size) == (ssize_t)size; close(fd); }
    free(file);
    return ok && fd >= 0 ? 0 : -1;
}

/* stories260K never emits its EOS (2): a copy whose EOS is another token, to test stopping there. Writes the
 * copy to path (room for 64); 0 on success. */
static int stories_with_eos(int32_t eos, char *path) {
    uint32_t v = (uint32_t)eos; /* the key is a u32 */
    return gguf_patched("stories260K.gguf", "tokenizer.ggml.eos_token_id", 0, &v, 4, path);
}

/* llama.cpp's greedy completions in testdata/reference, as ids and as text: streaming the ids through the
 * detokenizer must give the text byte for byte (random-weight models emit broken UTF-8 too). The stories260K
 * prompts, with BOS, must also detokenize back to " " + prompt. */
static void test_detokenizer_references(void) {
    static const char *const files[] = {"stories260K-greedy.json", "random-models-greedy.json"};
    ref_case *cases = (ref_case *)calloc(8, sizeof *cases);
    for (size_t f = 0; f < 2; f++) {
        int n = load_ref_cases(files[f], "completion_token_ids", cases, 8);
        CHECK(n == (f == 0 ? 3 : 4), "%s: %d cases", files[f], n);
        for (int i = 0; i < n; i++) {
            const ref_case *c = &cases[i];
            llm_gguf g;
            char err[LLM_ERR_LEN] = "";
            if (llm_gguf_open(&g, model_path(c->model), err) != 0) {
                CHECK(0, "open %s: %s", c->model, err);
                continue;
            }
            llm_tokenizer *t = llm_tokenizer_load(&g, err);
            CHECK(t != NULL, "tokenizer of %s: %s", c->model, err);
            if (t) {
                char text[8192];
                int bad = 0;
                size_t len = tok_detok_all(t, c->ids, c->n_ids, text, sizeof text, &bad);
                CHECK(c->n_ids > 0 && len == c->n_completion && memcmp(text, c->completion, len) == 0 &&
                      bad == 0, "%s: %d completion ids do not detokenize to the reference completion",
                      c->model, c->n_ids);
                if (f == 0) {
                    int32_t pids[256];
                    int np = llm_tokenize(t, c->prompt, c->n_prompt, llm_tokenizer_adds_bos(t), 0, pids, 256);
                    char expect[1100] = " ";
                    memcpy(expect + 1, c->prompt, c->n_prompt);
                    len = tok_detok_all(t, pids, np, text, sizeof text, &bad);
                    CHECK(np >= 1 && pids[0] == 1 && len == (c->n_prompt ? c->n_prompt + 1 : 0) &&
                          memcmp(text, expect, len) == 0,
                          "stories260K prompt \"%s\": BOS and the prompt back", c->prompt);
                }
                llm_tokenizer_free(t);
            }
            llm_gguf_close(&g);
        }
    }
    free(cases);
}

/* -----------------------------------------------------------------------------------------------------------
 * Running an engine to the end: every step's outputs gathered per request, the block bookkeeping audited
 * after every step
 * -------------------------------------------------------------------------------------------------------- */
#define RUN_MAX 64
typedef struct {
    uint64_t id[RUN_MAX];
    int32_t tokens[RUN_MAX][4][600];    /* per request, per sample */
    float logprobs[RUN_MAX][4][600];    /* when the request asked for them */
    int n_tokens[RUN_MAX][4];
    char text[RUN_MAX][4][4096];
    int text_len[RUN_MAX][4];
    int finish[RUN_MAX][4];
    int n_requests, steps, bad_audits, text_chunks_with_stop;
    const char *stop_probe;             /* counts streamed chunks that contain this (a stop string) */
} run_result;

static llm_engine_config engine_config(const char *model) {
    llm_engine_config cfg = llm_engine_defaults();
    cfg.model_path = model_path(model);
    cfg.create_backend = llm_cpu_backend_create;
    return cfg;
}

static llm_engine *engine_new(const llm_engine_config *cfg) {
    char err[LLM_ERR_LEN] = "";
    llm_engine *e = llm_engine_create(cfg, err);
    CHECK(e != NULL, "engine on %s: %s", cfg->model_path ? cfg->model_path : cfg->dummy, err);
    return e;
}

/* An engine on stories260K as engine_config sets it up, for the tests that change nothing of it */
static llm_engine *stories_engine(void) {
    llm_engine_config cfg = engine_config("stories260K.gguf");
    return engine_new(&cfg);
}

static int run_slot(run_result *r, uint64_t id) {
    for (int i = 0; i < r->n_requests; i++) if (r->id[i] == id) return i;
    return -1;
}

/* Steps e until it has no work, or max_steps; outputs go to r (requests must have been registered with
 * run_add). */
static void run_steps(llm_engine *e, run_result *r, int max_steps) {
    char err[LLM_ERR_LEN] = "";
    while (llm_engine_has_work(e) && max_steps-- > 0) {
        const llm_output *out;
        int n = llm_engine_step(e, &out);
        const char *error = NULL;   /* the step failed: its sequences finished with an error */
        for (int i = 0; i < n && !error; i++)
            if (out[i].finish_reason == LLM_FINISH_ERROR) error = out[i].error;
        CHECK(!error, "engine step: %s", error);
        if (error) return;
        r->steps++;
        for (int i = 0; i < n; i++) {
            int slot = run_slot(r, out[i].request_id), k = out[i].index;
            if (slot < 0 || k < 0 || k >= 4) {
                CHECK(0, "output for an unknown request %llu/%d", (unsigned long long)out[i].request_id, k);
                continue;
            }
            for (int t = 0; t < out[i].n_tokens && r->n_tokens[slot][k] < 600; t++) {
                if (out[i].logprobs) r->logprobs[slot][k][r->n_tokens[slot][k]] = out[i].logprobs[t];
                r->tokens[slot][k][r->n_tokens[slot][k]++] = out[i].token_ids[t];
            }
            if (out[i].text_len > 0 && r->text_len[slot][k] + out[i].text_len < 4096)
                memcpy(r->text[slot][k] + r->text_len[slot][k], out[i].text, (size_t)out[i].text_len);
            r->text_len[slot][k] += out[i].text_len;
            if (r->stop_probe && out[i].text_len &&
                memmem(out[i].text, (size_t)out[i].text_len, r->stop_probe, strlen(r->stop_probe)))
                r->text_chunks_with_stop++;
            if (out[i].finish_reason) r->finish[slot][k] = out[i].finish_reason;
        }
        if (llm_engine_check_blocks(e, err) != 0) {
            r->bad_audits++;
            if (r->bad_audits == 1) CHECK(0, "block audit: %s", err);
        }
    }
}

static void run_engine(llm_engine *e, run_result *r) { run_steps(e, r, 1 << 30); }

static int run_add(llm_engine *e, run_result *r, const char *prompt, const int32_t *ids, int n_ids,
                   const llm_sampling_params *p) {
    char err[LLM_ERR_LEN] = "";
    uint64_t id = llm_engine_add_request(e, prompt, ids, n_ids, p, NULL, err);
    CHECK(id > 0, "add_request: %s", err);
    if (!id || r->n_requests >= RUN_MAX) return -1;
    r->id[r->n_requests] = id;
    return r->n_requests++;
}

static llm_sampling_params greedy(int max_tokens) {
    llm_sampling_params p = llm_sampling_defaults();
    p.temperature = 0; p.max_tokens = max_tokens;
    return p;
}

static int all_blocks_free(llm_engine *e) {
    llm_engine_stats st = llm_engine_get_stats(e);
    return st.num_free_blocks == st.num_blocks && st.running == 0 && st.waiting == 0;
}

/* -----------------------------------------------------------------------------------------------------------
 * llama.cpp's greedy outputs, token for token
 * -------------------------------------------------------------------------------------------------------- */
/* Checks request slot of r against reference case c. */
static void check_reference(const run_result *r, int slot, const ref_case *c, const char *how) {
    CHECK(r->n_tokens[slot][0] == c->n_ids &&
          !memcmp(r->tokens[slot][0], c->ids, (size_t)c->n_ids * sizeof(int32_t)),
          "stories260K \"%s\" (%s): %d tokens, not llama.cpp's %d",
          c->prompt, how, r->n_tokens[slot][0], c->n_ids);
    CHECK(r->text_len[slot][0] == (int)c->n_completion &&
          !memcmp(r->text[slot][0], c->completion, c->n_completion),
          "stories260K \"%s\" (%s): text is not llama.cpp's: \"%.*s\"",
          c->prompt, how, r->text_len[slot][0], r->text[slot][0]);
    CHECK(r->finish[slot][0] == LLM_FINISH_LENGTH, "stories260K \"%s\" (%s): finish reason %d",
          c->prompt, how, r->finish[slot][0]);
}

static void test_stories_reference(void) {
    ref_case *cases = (ref_case *)calloc(8, sizeof *cases);
    int n = load_ref_cases("stories260K-greedy.json", "completion_token_ids", cases, 8);
    CHECK(n == 3, "stories260K-greedy.json: %d cases", n);
    llm_engine_config cfg = engine_config("stories260K.gguf");
    cfg.enable_prefix_caching = 0;
    run_result *r = (run_result *)calloc(1, sizeof *r);
    llm_engine *e = engine_new(&cfg);
    if (!e) { free(r); free(cases); return; }
    for (int i = 0; i < n; i++) {   /* each prompt alone */
        memset(r, 0, sizeof *r);
        llm_sampling_params p = greedy(cases[i].max_tokens);
        run_add(e, r, cases[i].prompt, NULL, 0, &p);
        run_engine(e, r);
        check_reference(r, 0, &cases[i], "alone");
    }
    /* all together: the prompts are one batch in the first forward call,
     * then every step is one call for all */
    memset(r, 0, sizeof *r);
    int max_tokens = 0;
    for (int i = 0; i < n; i++) {
        llm_sampling_params p = greedy(cases[i].max_tokens);
        run_add(e, r, cases[i].prompt, NULL, 0, &p);
        if (cases[i].max_tokens > max_tokens) max_tokens = cases[i].max_tokens;
    }
    run_engine(e, r);
    for (int i = 0; i < n; i++) check_reference(r, i, &cases[i], "batched");
    CHECK(r->steps == max_tokens, "batched: %d steps (forward calls) for %d tokens", r->steps, max_tokens);
    CHECK(all_blocks_free(e) && r->bad_audits == 0, "stories260K: blocks back in the pool");
    llm_engine_destroy(e);
    free(r); free(cases);
}

/* A copy of a test model (stories260K, say) with metadata keys added: each key name, a GGUF value type and
 * its bytes (strings as the file writes them: a u64 length, then the bytes). The keys go right after the
 * header, with a padding key that makes what was added a multiple of the alignment (32), so the tensor data,
 * which the file only locates by alignment, moves whole and stays aligned. Writes the copy's path to path
 * (room for 64). */
typedef struct { const char *key; uint32_t type; const void *value; size_t n; } test_kv;
static int gguf_with_keys(const char *model, const test_kv *kvs, int n_kvs, char *path) {
    size_t size, add = 0, room = 64 + 32;
    char *file = read_file(model_path(model), &size);
    if (!file || size < 24) { free(file); return -1; }
    for (int i = 0; i < n_kvs; i++) room += 8 + strlen(kvs[i].key) + 4 + kvs[i].n;
    char *extra = (char *)calloc(1, room);
#define PUT(p, n) (memcpy(extra + add, p, n), add += (n))
    for (int i = 0; i <= n_kvs; i++) {
        const char *key = i < n_kvs ? kvs[i].key : "test.padding";
        uint64_t klen = strlen(key);
        PUT(&klen, 8); PUT(key, klen);
        if (i < n_kvs) { PUT(&kvs[i].type, 4); PUT(kvs[i].value, kvs[i].n); continue; }
        uint32_t t = LLM_GGUF_STRING;
        PUT(&t, 4);
        uint64_t pad = (32 - (add + 8) % 32) % 32;
        PUT(&pad, 8);
        memset(extra + add, 'x', pad); add += pad;
    }
#undef PUT
    uint64_t n_kv;
    memcpy(&n_kv, file + 16, 8); n_kv += (uint64_t)n_kvs + 1; memcpy(file + 16, &n_kv, 8);
    strcpy(path, "/tmp/llm-test-keys-XXXXXX");
    int fd = mkstemp(path), ok = fd >= 0;
    if (ok) ok = write(fd, file, 24) == 24 && write(fd, extra, add) == (ssize_t)add &&
                 write(fd, file + 24, size - 24) == (ssize_t)(size - 24);
    if (fd >= 0) close(fd);
    free(file); free(extra);
    return ok ? 0 : -1;
}

/* Each case of a reference file run greedily on a backend, against the ids under ids_key (whose they are) */
static void check_greedy_references(const char *file, const char *ids_key, int n_cases,
                                    llm_backend *(*backend)(const llm_model *m, char *err),
                                    const char *whose) {
    ref_case *cases = (ref_case *)calloc(16, sizeof *cases);
    int n = load_ref_cases(file, ids_key, cases, 16);
    CHECK(n == n_cases, "%s: %d cases", file, n);
    run_result *r = (run_result *)calloc(1, sizeof *r);
    for (int i = 0; i < n; i++) {
        llm_engine_config cfg = engine_config(cases[i].model);
        cfg.create_backend = backend;
        llm_engine *e = engine_new(&cfg);
        if (!e) continue;
        memset(r, 0, sizeof *r);
        llm_sampling_params p = greedy(cases[i].max_tokens);
        run_add(e, r, cases[i].prompt, NULL, 0, &p);
        run_engine(e, r);
        int same = r->n_tokens[0][0] == cases[i].n_ids &&
                   !memcmp(r->tokens[0][0], cases[i].ids, (size_t)cases[i].n_ids * sizeof(int32_t));
        CHECK(same, "%s \"%s\": greedy ids differ from %s", cases[i].model, cases[i].prompt, whose);
        if (!same) {
            tok_print_ids("ours", r->tokens[0][0], r->n_tokens[0][0]);
            tok_print_ids(whose, cases[i].ids, cases[i].n_ids);
        }
        llm_engine_destroy(e);
    }
    free(r); free(cases);
}

static void test_random_models_reference(void) {
    check_greedy_references("random-models-greedy.json", "completion_token_ids", 4, llm_cpu_backend_create,
                            "llama.cpp's");
}

/* The architectures added since those four (gemma3, phi3, smollm3, qwen3moe, Mixtral-style llama, gpt-oss,
 * qwen2moe), each its random model against llama.cpp's greedy ids: on the exact path and the default one, at
 * block sizes 1, 16 and 64, alone and batched behind another prompt (Gemma 3 and gpt-oss: their 24 tokens run
 * past the local layers' window of 8) */
/* One greedy run of a reference case on the model file at path: on the exact or the default path, at a block
 * size, alone or behind another prompt; 1 when it gives the case's ids (else a failure naming the run, both
 * lists printed) */
static int greedy_case_run(const char *path, const ref_case *c, int exact, int block_size, int batched,
                           run_result *r) {
    llm_engine_config cfg = llm_engine_defaults();
    cfg.model_path = path;
    cfg.create_backend = exact ? llm_cpu_exact_backend_create : llm_cpu_backend_create;
    cfg.block_size = block_size;
    cfg.max_model_len = c->n_ctx;
    llm_engine *e = engine_new(&cfg);
    if (!e) return 0;
    memset(r, 0, sizeof *r);
    llm_sampling_params p = greedy(c->max_tokens);
    if (batched) run_add(e, r, "Once upon a time there was a long prompt before it", NULL, 0, &p);
    run_add(e, r, c->prompt, NULL, 0, &p);
    run_engine(e, r);
    int at = batched ? 1 : 0;
    int same = r->n_tokens[at][0] == c->n_ids &&
        !memcmp(r->tokens[at][0], c->ids, (size_t)c->n_ids * sizeof(int32_t));
    CHECK(same, "%s \"%s\" (%s path, block size %d%s): greedy ids differ from llama.cpp's", c->model,
          c->prompt, exact ? "exact" : "default", block_size, batched ? ", batched" : "");
    if (!same) {
        tok_print_ids("ours", r->tokens[at][0], r->n_tokens[at][0]);
        tok_print_ids("llama.cpp", c->ids, c->n_ids);
    }
    llm_engine_destroy(e);
    return 1;
}

static void test_random_archs_reference(void) {
    ref_case *cases = (ref_case *)calloc(16, sizeof *cases);
    int n = load_ref_cases("random-archs-greedy.json", "completion_token_ids", cases, 16), checked = 0;
    n += load_ref_cases("random-qwen2moe-greedy.json", "completion_token_ids", cases + n, 16 - n);
    run_result *r = (run_result *)calloc(1, sizeof *r);
    static const char *const supported[] = {"random-gemma3.gguf", "random-phi3.gguf", "random-smollm3.gguf",
                                            "random-qwen3moe.gguf", "random-llama-moe.gguf",
                                            "random-gpt-oss.gguf", "random-qwen2moe.gguf"};
    for (int i = 0; i < n; i++) {
        int known = 0;
        for (size_t k = 0; k < sizeof supported / sizeof *supported; k++)
            known |= !strcmp(cases[i].model, supported[k]);
        for (int run = 0; known && run < 8; run++) { /* exact at 1/16/64, alone and batched; default at 16 */
            static const int block_sizes[4] = {1, 16, 64, 16};
            checked += greedy_case_run(model_path(cases[i].model), &cases[i], run < 6, block_sizes[run / 2],
                                       run % 2, r);
        }
    }
    CHECK(checked == 8 * ((int)(sizeof supported / sizeof *supported) + 1),
          "%d runs of the new architectures",
          checked); /* qwen2moe has two prompts */
    free(r); free(cases);
}

/* RoPE scaled as the file says, against llama.cpp's greedy ids on random models with the keys added: YaRN as
 * gpt-oss-20b has it (factor 32 over an original 4096 positions: the fast dimensions kept, the slow ones
 * interpolated, a ramp between, cos and sin times 1 + 0.1 ln 32) on random-gpt-oss, two prompts; linear by 8
 * as Gemma 3 4B and larger have it, on random-gemma3, where it scales the global layer only (llama.cpp's
 * rope_freq_scale_train_swa is 1) while its 24 tokens run past the local layers' window of 8. On the exact
 * and default paths, alone and batched. */
static void test_rope_scaling(void) {
    static const char yarn[] = "\x04\0\0\0\0\0\0\0yarn", linear[] = "\x06\0\0\0\0\0\0\0linear";
    float factor32 = 32, factor8 = 8;
    uint32_t orig = 4096;
    test_kv yarn_kvs[] = {{"gpt-oss.rope.scaling.type", LLM_GGUF_STRING, yarn, 12},
                          {"gpt-oss.rope.scaling.factor", LLM_GGUF_F32, &factor32, 4},
                          {"gpt-oss.rope.scaling.original_context_length", LLM_GGUF_U32, &orig, 4}};
    test_kv linear_kvs[] = {{"gemma3.rope.scaling.type", LLM_GGUF_STRING, linear, 14},
                            {"gemma3.rope.scaling.factor", LLM_GGUF_F32, &factor8, 4}};
    char yarn_path[64], linear_path[64];
    if (gguf_with_keys("random-gpt-oss.gguf", yarn_kvs, 3, yarn_path) != 0 ||
        gguf_with_keys("random-gemma3.gguf", linear_kvs, 2, linear_path) != 0) {
        CHECK(0, "copies of random-gpt-oss and random-gemma3 with RoPE scaling");
        return;
    }
    ref_case *cases = (ref_case *)calloc(16, sizeof *cases);
    int n = load_ref_cases("random-rope-scaling-greedy.json", "completion_token_ids", cases, 16), checked = 0;
    run_result *r = (run_result *)calloc(1, sizeof *r);
    for (int i = 0; i < n; i++)
        for (int run = 0; run < 4; run++) /* exact, default; alone, batched */
            checked += greedy_case_run(strstr(cases[i].model, "gemma3") ? linear_path : yarn_path, &cases[i],
                                       run < 2, 16, run % 2, r);
    CHECK(n == 3 && checked == 12, "%d runs with scaled RoPE", checked);
    free(r); free(cases);
    remove(yarn_path); remove(linear_path);
}

/* RoPE's per-pair factors against llama.cpp's greedy ids (made by testdata/make_random_models.py): Llama
 * 3.1's rope_freqs on random-llama3-gqa; Phi-3.5's LongRoPE on random-phi3, whose long factors serve the
 * model's context of 4096 (past its original 2048: cos and sin times its attention factor too) and the short
 * ones a max_model_len of 2048 (llama.cpp's n_ctx), as llama.cpp picks them. Two prompts each, on the exact
 * and default paths, alone and batched; without the factors every case parts from these ids (checked). */
static void test_rope_factors(void) {
    ref_case *cases = (ref_case *)calloc(16, sizeof *cases);
    int n = load_ref_cases("random-rope-factors-greedy.json", "completion_token_ids", cases, 16), checked = 0;
    run_result *r = (run_result *)calloc(1, sizeof *r);
    for (int i = 0; i < n; i++)
        for (int run = 0; run < 4; run++) /* exact, default; alone, batched */
            checked += greedy_case_run(model_path(cases[i].model), &cases[i], run < 2, 16, run % 2, r);
    CHECK(n == 6 && checked == 24, "%d runs with RoPE factors", checked);
    free(r); free(cases);
}

/* llm_rope_freqs (a frequency per pair, as llm.cu turns pairs by position x frequency) against
 * llm_rope_angles (the CPU's, step by step as llama.cpp): the same cos and sin, to f32 rounding, with each
 * kind of scaling (none, linear, YaRN, per-pair factors, an attention factor) at positions to 300. The angle
 * of a pair differs by f32's rounding of it (relative 1e-7, times the pair's steps: under 1e-4 radians
 * here); a wrong factor or ramp differs by far more. */
static void test_rope_freqs(void) {
    enum { PAIRS = 32 };
    float factors[PAIRS];
    for (int i = 0; i < PAIRS; i++) factors[i] = 1.0f + 7.0f * i / PAIRS;
    for (int kind = 0; kind < 5; kind++) {
        llm_config c; memset(&c, 0, sizeof c);
        c.rope_dim = 2 * PAIRS; c.rope_base = 500000.0f;
        float scale = kind == 1 || kind >= 3 ? 0.125f : 1.0f;
        if (kind >= 2) { c.rope_yarn = 1; c.yarn_dims[0] = 6; c.yarn_dims[1] = 20; }
        if (kind >= 3) c.rope_factors = factors;
        if (kind == 4) c.rope_attn_factor = 1.3f;
        float freq[PAIRS], mscale, cs[PAIRS], sn[PAIRS];
        llm_rope_freqs(&c, c.rope_base, scale, freq, &mscale);
        double worst = 0;
        for (int pos = 0; pos <= 300; pos += 13) {
            llm_rope_angles(cs, sn, pos, &c, c.rope_base, scale);
            for (int i = 0; i < PAIRS; i++) {
                double a = (double)pos * freq[i];
                worst = fmax(worst, fmax(fabs(cos(a) * mscale - cs[i]), fabs(sin(a) * mscale - sn[i])));
            }
        }
        CHECK(worst < 2e-4, "RoPE scaling kind %d: llm_rope_freqs' cos and sin differ from llm_rope_angles' "
              "by %.3g", kind, worst);
    }
}

/* Gemma 3 270M (make model-gemma3: Google's base model, Q4_K_M, a 262k vocabulary) against a float64 forward
 * pass of the same weights (tools/gemma3_f64.py: numpy, the gguf package's dequantization, nothing of llm.h):
 * its greedy continuations of five prompts (32 tokens) and the gap of its top two log-probabilities at each
 * step. The prompts tokenize to the ids of llama.cpp's references.
 *   - the exact path, the five in one batch as a server runs them, gives the oracle's tokens up to its first
 *     step within 0.01 nats, and its top-two gap at every one of those steps within 0.002 of the oracle's
 *     (measured: under 0.0001);
 *   - the default path (16-bit activations), in one batch and one by one, gives the oracle's tokens up to its
 *     first step within 0.01 nats, and its gaps within 0.005 (measured: 0.0019);
 *   - cpu-int8 (llama.cpp's 8-bit activations), in one batch, up to its first step within 0.5 nats: on this
 *     model that rounding moves a step's top-two gap by up to 0.25 (measured), and which of two tokens closer
 *     than that wins can depend on the batch it ran in.
 * llama.cpp's own greedy continuations (in the same file) part from the oracle's on two prompts, at steps
 * where its gaps are 0.08 and 0.10 nats from the oracle's and the oracle's from ours 0.0001: printed, not
 * checked. */
#define GEMMA3_MODEL "models/gemma-3-270m-q4_k_m.gguf"
static void test_gemma3_270m(void) {
    char err[LLM_ERR_LEN], path[1024];
    snprintf(path, sizeof path, "%s/reference/gemma3-270m-f64.json", testdata_dir);
    size_t len;
    char *text = read_file(path, &len);
    llm_json all;
    int have_model = access(GEMMA3_MODEL, R_OK) == 0;
    CHECK(have_model, "%s missing (make model-gemma3 fetches it)", GEMMA3_MODEL);
    if (!text || llm_json_parse(text, len, &all, err) != 0 || all.type != LLM_JSON_ARRAY || all.n != 5 ||
        !have_model) {
        CHECK(text != NULL, "read %s", path);
        free(text);
        return;
    }
    enum { N = 5, MAX = 32 };
    int32_t want[N][MAX], prompt[N][64], n_prompt[N];
    double oracle_gap[N][MAX];
    for (int i = 0; i < N; i++) {
        const llm_json *c = &all.items[i], *ids = llm_json_get(c, "completion_token_ids"),
                       *gaps = llm_json_get(c, "top2_logprob_gap"),
                       *pids = llm_json_get(c, "prompt_token_ids");
        n_prompt[i] = pids ? (pids->n < 64 ? pids->n : 64) : 0;
        for (int k = 0; k < n_prompt[i]; k++) prompt[i][k] = (int32_t)pids->items[k].num;
        for (int k = 0; k < MAX; k++) {
            want[i][k] = ids && k < ids->n ? (int32_t)ids->items[k].num : -1;
            oracle_gap[i][k] = gaps && k < gaps->n ? gaps->items[k].num : 0;
        }
    }
    double worst_exact = 0, worst_default = 0, worst_int8 = 0, worst_f32 = 0;
    /* exact batched, default batched and one by one, cpu-int8 batched, default with an f32 KV cache batched;
     * under AddressSanitizer default batched. The bounds on the gaps, measured (Zen 3): exact 3.2e-5, default
     * (f16 cache) 0.0097, f32 cache 0.0023, cpu-int8 0.25; 1.4e-5, 0.0059, 0.0033 and 0.23 before llm_gelu's
     * exp form, which moved the 16-bit activations' roundings (the default path's worst is the same step both
     * times, prompt 2's 10th, whose gap is 8.13 nats). The figures do not depend on the CPU: the commit that
     * set these bounds gives 1.4e-5, 0.0072, 0.0019 and 0.231 on this Zen 3 as on the Sapphire Rapids */
    for (int run = UNDER_ASAN; run < (UNDER_ASAN ? 2 : 5); run++) {
        int exact = run == 0, int8 = run == 3, batched = run != 2, f32 = run == 4;
        llm_engine_config cfg = llm_engine_defaults();
        cfg.model_path = GEMMA3_MODEL;
        cfg.kv_bytes = 64 << 20;
        if (f32) cfg.kv_cache_dtype = LLM_KV_F32;
        if (exact) cfg.create_backend = llm_cpu_exact_backend_create;
        if (int8) cfg.create_backend = llm_cpu_int8_backend_create;
        llm_engine *e = engine_new(&cfg);
        if (!e) break;
        if (run == UNDER_ASAN)
            for (int i = 0; i < N; i++) {
                const llm_json *p = llm_json_get(&all.items[i], "prompt");
                int32_t got[64];
                int n = p ? llm_tokenize_prompt(llm_engine_model(e)->tok, p->str, p->len, got, 64) : -1;
                CHECK(n == n_prompt[i] && !memcmp(got, prompt[i], (size_t)n * sizeof *got),
                      "Gemma 3 270M: \"%s\" tokenizes as llama.cpp's %d ids", p ? p->str : "?", n_prompt[i]);
            }
        int32_t out[N][MAX];
        float gap[N][MAX];
        int n_out[N] = {0};
        for (int from = 0; from < N; from = batched ? N : from + 1) {
            uint64_t ids[N] = {0};
            for (int i = from; i < (batched ? N : from + 1); i++) {
                llm_sampling_params p = greedy(MAX);
                p.ignore_eos = 1; p.logprobs = 2;
                ids[i] = llm_engine_add_request(e, NULL, prompt[i], n_prompt[i], &p, NULL, err);
                CHECK(ids[i] > 0, "Gemma 3 270M: add_request: %s", err);
            }
            while (llm_engine_has_work(e)) {
                const llm_output *o;
                int n = llm_engine_step(e, &o);
                for (int k = 0; k < n; k++) {
                    int i = 0;
                    while (i < N && ids[i] != o[k].request_id) i++;
                    for (int t = 0; i < N && t < o[k].n_tokens && n_out[i] < MAX; t++, n_out[i]++) {
                        out[i][n_out[i]] = o[k].token_ids[t];
                        gap[i][n_out[i]] = o[k].top_logprobs[2 * t] - o[k].top_logprobs[2 * t + 1];
                    }
                }
            }
        }
        for (int i = 0; i < N; i++) {
            double bound = int8 ? 0.5 : 0.01, worst = 0;
            int until = MAX, parted = MAX;
            for (int k = 0; k < MAX; k++) if (oracle_gap[i][k] < bound) { until = k; break; }
            for (int k = 0; k < until; k++) {
                if (k >= n_out[i] || out[i][k] != want[i][k]) { parted = k; break; }
                worst = fmax(worst, fabs(gap[i][k] - oracle_gap[i][k]));
            }
            CHECK(n_out[i] == MAX && parted == MAX && worst < (exact ? 0.002 : int8 ? 1 : f32 ? 0.005 : 0.01),
                  "Gemma 3 270M, %s path%s%s, prompt %d: the float64 oracle's tokens up to step %d (its "
                  "first gap under %g): %s at step %d; gaps within %.4f of the oracle's",
                  exact ? "exact" : int8 ? "cpu-int8" : "default", f32 ? " with an f32 KV cache" : "",
                  batched ? ", batched" : "", i, until, bound, parted == MAX ? "all" : "parts", parted,
                  worst);
            double *w = exact ? &worst_exact : int8 ? &worst_int8 : f32 ? &worst_f32 : &worst_default;
            *w = fmax(*w, worst);
        }
        llm_engine_destroy(e);
    }
    if (UNDER_ASAN)
        printf("Gemma 3 270M against float64: top-two gaps within %.1e (default path)\n", worst_default);
    else printf("Gemma 3 270M against float64: top-two gaps within %.1e (exact path), %.1e (default path), "
                "%.1e (default, f32 KV cache), %.3f (cpu-int8)\n", worst_exact, worst_default, worst_f32,
                worst_int8);
    for (int i = 0; i < N; i++) { /* llama.cpp against the oracle: where it parts, and its gap there */
        const llm_json *c = &all.items[i], *ids = llm_json_get(c, "llama_cpp_completion_token_ids"),
                       *gaps = llm_json_get(c, "llama_cpp_top2_logprob_gap");
        int k = 0;
        while (ids && k < ids->n && k < MAX && (int32_t)ids->items[k].num == want[i][k]) k++;
        if (k < MAX && gaps && k < gaps->n)
            printf("    llama.cpp parts from it on prompt %d at step %d: its gap %.4f, the oracle's %.4f the "
                   "other way\n", i, k, gaps->items[k].num, oracle_gap[i][k]);
    }
    llm_json_free(&all);
    free(text);
}

/* -----------------------------------------------------------------------------------------------------------
 * The paged forward pass: any block size, scattered blocks, several sequences in one call, prefill in chunks,
 * gives the logits of one sequence run alone in one contiguous block (one for each group of layers). A local
 * group's blocks that have slid out of its window are not read: the test points their entries at another
 * sequence's blocks.
 * -------------------------------------------------------------------------------------------------------- */
/* The CPU backend on model m with a KV pool of num_blocks blocks of block_size: what the engine would make */
static llm_backend *cpu_backend(const llm_model *m, int num_blocks, int block_size) {
    char err[LLM_ERR_LEN] = "";
    llm_backend *be = llm_cpu_backend_create(m, err);
    if (be && be->alloc_kv(be, num_blocks, block_size, err) != 0) { be->destroy(be); be = NULL; }
    CHECK(be != NULL, "cpu backend: %s", err);
    return be;
}

static void test_paged_forward(const char *model) {
    llm_model m;
    char err[LLM_ERR_LEN] = "";
    if (llm_model_load(&m, model_path(model), err) != 0) { CHECK(0, "load %s: %s", model, err); return; }
    enum { S = 3, LEN = 70 };
    int V = m.cfg.vocab_size;
    uint64_t rng = 7;
    int32_t toks[S][LEN];
    for (int s = 0; s < S; s++)
        for (int i = 0; i < LEN; i++) toks[s][i] = (int32_t)(llm_splitmix64(&rng) % (uint64_t)V);
    /* reference: sequence 0 alone, one block of 128, every position's logits in one call */
    float *ref = (float *)malloc((size_t)LEN * V * sizeof(float)),
          *got = (float *)malloc((size_t)S * LEN * V * sizeof(float));
    int G = llm_kv_groups(&m.cfg);
    if (G > 64) { CHECK(0, "%s: %d groups of layers, more than this test holds", model, G); return; }
    int32_t pos[S * LEN], rows[S * LEN], one_block[64], start[S + 1];
    const int32_t *tables1[64];
    for (int i = 0; i < LEN; i++) { pos[i] = i; rows[i] = i; }
    for (int g = 0; g < G; g++) { one_block[g] = g; tables1[g] = one_block + g; }
    int32_t start1[2] = {0, LEN};
    llm_backend *be = cpu_backend(&m, G, 128);
    llm_batch b1 = {.n_tokens = LEN, .tokens = toks[0], .positions = pos, .n_seqs = 1,
                        .seq_start = start1, .block_tables = tables1, .n_logits = LEN, .logit_rows = rows};
    CHECK(be && be->forward(be, &b1, ref, err) == 0, "forward alone: %s", err);
    if (be) be->destroy(be);

    static const int block_sizes[] = {1, 16, 64};
    for (int bi = 0; bi < 3; bi++) {
        int bs = block_sizes[bi], per_seq = (LEN + bs - 1) / bs, nb = G * S * per_seq + 5;
        be = cpu_backend(&m, nb, bs);
        /* the blocks of all sequences and groups interleaved in a shuffled order; table g * S + s: group g's
         * of sequence s, as the batch takes them */
        int32_t *perm = (int32_t *)malloc((size_t)nb * sizeof(int32_t)), *tables[64 * S];
        int32_t *local = (int32_t *)malloc((size_t)G * S * per_seq * sizeof(int32_t));
        for (int i = 0; i < nb; i++) perm[i] = i;
        for (int i = nb - 1; i > 0; i--) {
            int j = (int)(llm_splitmix64(&rng) % (uint64_t)(i + 1));
            int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
        for (int t = 0; t < G * S; t++) tables[t] = perm + t * per_seq;
        /* in three calls: sequences at different stages
         * (chunks of 23, 30, 17 tokens, shifted per sequence) */
        static const int cuts[S][4] = {{0, 23, 53, LEN}, {0, 40, 41, LEN}, {0, 5, 69, LEN}};
        int ok = 1;
        for (int call = 0; call < 3 && ok; call++) {
            int32_t bt_tok[S * LEN], n = 0, nl = 0;
            for (int s = 0; s < S; s++) {
                start[s] = n;
                for (int i = cuts[s][call]; i < cuts[s][call + 1]; i++) {
                    bt_tok[n] = toks[s][i]; pos[n] = i;
                    if (s == 0) rows[nl++] = n;
                    n++;
                }
            }
            start[S] = n;
            /* a local group's blocks wholly before the window of the call's first position: another
             * sequence's (reading them would give other logits) */
            const int32_t *tbl[64 * S];
            for (int g = 0; g < G; g++)
                for (int s = 0; s < S; s++) {
                    int32_t *t = local + (size_t)(g * S + s) * per_seq;
                    int gone = llm_window_first_block(llm_kv_group_window(&m.cfg, g), cuts[s][call], bs);
                    for (int k = 0; k < per_seq; k++) t[k] = tables[g * S + (k < gone ? (s + 1) % S : s)][k];
                    tbl[g * S + s] = t;
                }
            llm_batch b = {.n_tokens = n, .tokens = bt_tok, .positions = pos, .n_seqs = S,
                                .seq_start = start, .block_tables = tbl, .n_logits = nl, .logit_rows = rows};
            ok = be && be->forward(be, &b, got + (size_t)cuts[0][call] * V, err) == 0;
            CHECK(ok, "paged forward, block size %d: %s", bs, err);
        }
        double worst = 0;
        for (int i = 0; i < LEN && ok; i++) {
            double mx = 0, diff = 0;
            for (int v = 0; v < V; v++) {
                double a = fabs(ref[(size_t)i * V + v]); if (a > mx) mx = a;
                double d = fabs(ref[(size_t)i * V + v] - got[(size_t)i * V + v]); if (d > diff) diff = d;
            }
            if (diff / (mx > 0 ? mx : 1) > worst) worst = diff / (mx > 0 ? mx : 1);
        }
        CHECK(ok && worst <= 1e-5, "%s block size %d: logits differ from the sequence alone by %g (relative)",
              model, bs, worst);
        free(perm); free(local);
        if (be) be->destroy(be);
    }
    free(ref); free(got);
    llm_model_free(&m);
}

/* -----------------------------------------------------------------------------------------------------------
 * Weight types: exact values of hand-made rows, then stories260K with its weights stored as f16, bf16, q8_0,
 * q4_0 and q4_1 gives logits close to f32's
 * -------------------------------------------------------------------------------------------------------- */
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* The default path's f16/bf16 product of one row and one token in plain C, in the order llm.h's tile (AVX2,
 * AVX-512, NEON) computes it: two sets of 8 running sums, fused multiply-adds, for the even and the odd runs
 * of 8 along the row; then the two added, lanes i and i + 4 added, those sums 0 + 2 and 1 + 3, then the two;
 * then the rest of the row one value at a time */
#ifdef LLM_HALF_TILES
static float half_dot_ref(uint32_t type, const uint16_t *w, const float *x, int64_t n) {
    float sums[2][8] = {{0}}, s4[4];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            sums[i / 8 % 2][j] = fmaf(llm_half_to_f32(type, w[i + j]), x[i + j], sums[i / 8 % 2][j]);
    for (int j = 0; j < 4; j++) s4[j] = (sums[0][j] + sums[1][j]) + (sums[0][j + 4] + sums[1][j + 4]);
    float s = (s4[0] + s4[2]) + (s4[1] + s4[3]);
    for (; i < n; i++) s += llm_half_to_f32(type, w[i]) * x[i];
    return s;
}
#endif

/* x quantized to type, n values (a multiple of 32), written to out; returns the bytes written. */
static size_t quantize_row(uint32_t type, const float *x, int64_t n, uint8_t *out) {
    size_t o = 0;
    for (int64_t i = 0; i < n && (type == LLM_F16 || type == LLM_BF16); i++, o += 2)
        put16(out + o, type == LLM_F16 ? llm_f32_to_f16(x[i]) :
                       (uint16_t)(((union { float f; uint32_t u; }){x[i]}.u + 0x8000u) >> 16));
    for (int64_t b = 0; b < n / 32 && type == LLM_Q8_0; b++, o += 34) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        uint16_t dh = llm_f32_to_f16(amax / 127);
        float d = llm_f16_to_f32(dh);
        put16(out + o, dh);
        for (int j = 0; j < 32; j++) out[o + 2 + j] = (uint8_t)(int8_t)(d ? lrintf(x[b * 32 + j] / d) : 0);
    }
    for (int64_t b = 0; b < n / 32 && (type == LLM_Q4_0 || type == LLM_Q4_1); b++) {
        const float *xb = x + b * 32;
        float lo = xb[0], hi = xb[0];
        for (int j = 1; j < 32; j++) { lo = fminf(lo, xb[j]); hi = fmaxf(hi, xb[j]); }
        float d, m = 0;
        if (type == LLM_Q4_1) {
            d = (hi - lo) / 15; m = lo;
            put16(out + o, llm_f32_to_f16(d)); put16(out + o + 2, llm_f32_to_f16(m));
        } else { d = fmaxf(fabsf(lo), fabsf(hi)) / 7; put16(out + o, llm_f32_to_f16(d)); }
        d = llm_f16_to_f32(llm_f32_to_f16(d)); m = llm_f16_to_f32(llm_f32_to_f16(m));
        uint8_t *q = out + o + (type == LLM_Q4_1 ? 4 : 2);
        for (int j = 0; j < 16; j++) {
            int a = (int)lrintf(d ? (xb[j] - m) / d : 0) + (type == LLM_Q4_0 ? 8 : 0),
                c = (int)lrintf(d ? (xb[j + 16] - m) / d : 0) + (type == LLM_Q4_0 ? 8 : 0);
            a = a < 0 ? 0 : a > 15 ? 15 : a; c = c < 0 ? 0 : c > 15 ? 15 : c;
            q[j] = (uint8_t)(a | c << 4);
        }
        o += type == LLM_Q4_1 ? 20 : 18;
    }
    return o;
}

/* expf as glibc computes it since 2.27 on a machine with FMA (Arm's optimized routines): the oracle of
 * llm_softmax_exp and llm_swiglu. 2^(j/32) from long double, rounded to double */
static float expf_ref(float x) {
    if (x < -0x1.9fe368p6f) return 0; /* -inf too */
    if (x > 0x1.62e42ep6f) return INFINITY;
    double xd = x, kd = fma(0x1.71547652b82fep+5, xd, 0x1.8p+52);
    uint64_t ki, t;
    memcpy(&ki, &kd, 8);
    kd -= 0x1.8p+52;
    double r = fma(0x1.71547652b82fep+5, xd, -kd), s = (double)exp2l((long double)(ki % 32) / 32);
    memcpy(&t, &s, 8);
    t += (ki - ki % 32) << 47; /* k div 32 added to the exponent */
    memcpy(&s, &t, 8);
    double z = fma(0x1.c6af84b912394p-20, r, 0x1.ebfce50fac4f3p-13);
    double y = fma(z, r * r, fma(r, 0x1.62e42ff0c52d6p-6, 1.0));
    return (float)(y * s);
}

/* Half floats both ways (llm_f16_to_f32 and llm_f32_to_f16: F16C's instructions on x86, fcvt on ARM, the
 * plain C in a build without SIMD) against their definition: each of the 65,536 halves to its value ((-1)^s
 * 2^(e-15) (1 + m / 1024), subnormals 2^-14 m / 1024, infinities, NaNs), each finite half back from its
 * value, each midpoint between neighbours to the even one (65520, between the largest half and 2^16, to
 * infinity), and the floats either side of a midpoint to the nearer half */
static double half_value(uint32_t h) { /* h's magnitude; 0x7c00 (infinity) as 2^16, the next step's value */
    uint32_t e = (h >> 10) & 31, m = h & 1023;
    return e == 31 ? ldexp(1, 16) : e ? ldexp(1 + m / 1024.0, (int)e - 15) : ldexp(m / 1024.0, -14);
}
static void test_half_conversion(void) {
    int bad_value = 0, bad_back = 0, bad_mid = 0;
    uint32_t first = 0x10000;
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint32_t negative = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        float f = llm_f16_to_f32((uint16_t)h);
        double value = negative ? -half_value(h) : half_value(h);
        int ok = (e == 31 ? (m ? isnan(f) : isinf(f)) : (double)f == value) && !signbit(f) == !negative;
        if (!ok) { bad_value++; if (first > h) first = h; }
        if (e == 31) continue;
        if (llm_f32_to_f16(f) != h) { bad_back++; if (first > h) first = h; }
        double lo = half_value(h), hi = half_value(h + 1), sign = negative ? -1 : 1;
        float mid = (float)(sign * (lo + hi) / 2); /* exact: 12 significant bits */
        uint16_t even = (uint16_t)(h & 1 ? h + 1 : h);
        if (llm_f32_to_f16(mid) != even || llm_f32_to_f16(nextafterf(mid, 0)) != h ||
            llm_f32_to_f16(nextafterf(mid, (float)(sign * 1e9))) != h + 1) {
            bad_mid++;
            if (first > h) first = h;
        }
    }
    CHECK(!bad_value && !bad_back && !bad_mid,
          "half floats: %d values, %d round trips, %d midpoints wrong (the first at 0x%04x)", bad_value,
          bad_back, bad_mid, first);
    CHECK(llm_f32_to_f16(1e9f) == 0x7c00 && llm_f32_to_f16(-1e-9f) == 0x8000 &&
          (llm_f32_to_f16(NAN) & 0x7e00) == 0x7e00, "half floats: overflow, underflow, NaN: %04x %04x %04x",
          llm_f32_to_f16(1e9f), llm_f32_to_f16(-1e-9f), llm_f32_to_f16(NAN));
}

static void test_weight_types(void) {
    /* exact values */
    uint8_t row[64];
    float out[32];
    /* 1 -2 65504 2^-24 */
    put16(row, 0x3C00); put16(row + 2, 0xC000); put16(row + 4, 0x7BFF); put16(row + 6, 0x0001);
    llm_dtype_dequant_row(LLM_F16, row, out, 4);
    CHECK(out[0] == 1.0f && out[1] == -2.0f && out[2] == 65504.0f && out[3] == ldexpf(1, -24),
          "f16 values: %g %g %g %g", out[0], out[1], out[2], out[3]);
    put16(row, 0x3F80); put16(row + 2, 0xC0A0);     /* 1 -5 */
    llm_dtype_dequant_row(LLM_BF16, row, out, 2);
    CHECK(out[0] == 1.0f && out[1] == -5.0f, "bf16 values: %g %g", out[0], out[1]);
    put16(row, 0x3800);                             /* d = 0.5 */
    for (int j = 0; j < 32; j++) row[2 + j] = (uint8_t)(int8_t)(j - 16);
    llm_dtype_dequant_row(LLM_Q8_0, row, out, 32);
    CHECK(out[0] == -8.0f && out[16] == 0.0f && out[31] == 7.5f,
          "q8_0 values: %g %g %g", out[0], out[16], out[31]);
    put16(row, 0x4000);                             /* d = 2 */
    for (int j = 0; j < 16; j++) row[2 + j] = (uint8_t)(j | (15 - j) << 4);
    llm_dtype_dequant_row(LLM_Q4_0, row, out, 32);
    CHECK(out[0] == -16.0f && out[15] == 14.0f && out[16] == 14.0f && out[31] == -16.0f,
          "q4_0 values: %g %g %g %g", out[0], out[15], out[16], out[31]);
    put16(row, 0x3C00); put16(row + 2, 0xBC00);     /* d = 1, m = -1 */
    for (int j = 0; j < 16; j++) row[4 + j] = (uint8_t)(j | (15 - j) << 4);
    llm_dtype_dequant_row(LLM_Q4_1, row, out, 32);
    CHECK(out[0] == -1.0f && out[15] == 14.0f && out[16] == 14.0f && out[31] == -1.0f,
          "q4_1 values: %g %g %g %g", out[0], out[15], out[16], out[31]);
    CHECK(llm_dtype_row_bytes(LLM_Q8_0, 64) == 68 && llm_dtype_row_bytes(LLM_Q4_0, 64) == 36 &&
          llm_dtype_row_bytes(LLM_Q4_1, 64) == 40 && llm_dtype_row_bytes(LLM_F16, 64) == 128 &&
          llm_dtype_row_bytes(77, 64) == 0, "row sizes");

    /* f32 dot products of 1 to 12 vectors at once (llm_dot_many: AVX2 where the build has it, from 4 vectors
     * on their lanes added 8 sums at a time where a row has no rest) are the plain-C llm_dot_n's of one at a
     * time, bit for bit: lengths with and without a rest past the runs of 8; one vector all -0, whose sums
     * are zeros of either sign. (It tests the AVX2 kernel in SIMD builds; in a plain-C build it
     * is llm_dot_n.) */
    {
        static float a[108], b[12 * 108];
        uint64_t rng = 9;
        for (int i = 0; i < 108; i++) a[i] = (float)((int)(llm_splitmix64(&rng) % 2001) - 1000) / 300.0f;
        for (int i = 0; i < 12 * 108; i++) b[i] = (float)((int)(llm_splitmix64(&rng) % 2001) - 1000) / 700.0f;
        for (int i = 0; i < 108; i++) b[5 * 108 + i] = -0.0f;
        static const int lengths[] = {5, 8, 64, 108};
        int bad = 0, n = 0;
        for (int li = 0; li < 4; li++)
            for (int nc = 1; nc <= 12; nc++) {
                float many[12], one;
                llm_dot_many(a, b, 108, nc, lengths[li], many);
                for (int c = 0; c < nc; c++, n++) {
                    llm_dot_n(a, b + c * 108, 0, 1, lengths[li], &one);
                    bad += memcmp(&one, &many[c], sizeof one) != 0;
                }
            }
        CHECK(bad == 0, "f32 dot products: %d of %d differ from the plain-C ones", bad, n);
        /* a prompt's attention scores (llm_scores: with AVX2, from 4 queries on, 8 rows' sums added up at
         * once, stored masked where a block has fewer than 8 rows left): (q_j . k_p) * scale, llm_dot_n's sum
         * times the scale, bit for bit, for 1 to 12 queries, 1 to 12 rows, lengths with and without a rest;
         * the row's value just past the rows is left as it was */
        {
            static float out[12 * 16], queries[12 * 108];
            const float scale = 0.125f, fill = 1234.5f;
            int bad_scores = 0, n_scores = 0, overwritten = 0;
            for (int li = 0; li < 4; li++)
                for (int nq = 1; nq <= 12; nq++)
                    for (int ki = 0; ki < 5; ki++) { /* k_p: b's rows, 108 apart; 8 at a time */
                        static const int row_counts[] = {1, 5, 8, 9, 12};
                        int nk = row_counts[ki];
                        for (int i = 0; i < 12 * 16; i++) out[i] = fill;
                        for (int j = 0; j < nq; j++) /* query j: b's row 11 - j (6: the -0 one) */
                            memcpy(queries + j * lengths[li], b + (11 - j) * 108,
                                   (size_t)lengths[li] * sizeof(float));
                        llm_scores(b, 108, nk, queries, nq, lengths[li], scale, out, 16);
                        for (int j = 0; j < nq; j++) {
                            overwritten += out[j * 16 + nk] != fill;
                            for (int p = 0; p < nk; p++, n_scores++) {
                                float one;
                                llm_dot_n(b + p * 108, queries + j * lengths[li], 0, 1, lengths[li], &one);
                                one *= scale;
                                bad_scores += memcmp(&one, &out[j * 16 + p], sizeof one) != 0;
                            }
                        }
                    }
            CHECK(bad_scores == 0 && overwritten == 0 && n_scores == 4 * 78 * 35,
                  "attention scores: %d of %d differ from the plain-C ones, %d values past the rows written",
                  bad_scores, n_scores, overwritten);
        }
#if defined(LLM_CPU_SIMD) && defined(LLM_AVX512F)
        /* AVX-512: a prompt's queries side by side in pairs (llm_dot_pairs), 2 to 6 pairs, the same bits */
        static float side[12 * 104];
        bad = n = 0;
        for (int li = 1; li < 4; li++) {
            int len = li == 3 ? 104 : lengths[li];
            for (int j = 0; j < 12; j++)
                for (int i = 0; i < len; i += 8)
                    for (int k = 0; k < 8; k++)
                        side[(j / 2) * 2 * len + 2 * i + 8 * (j % 2) + k] = b[j * 108 + i + k];
            for (int np = 2; np <= 6; np++) {
                float pairs[12], one;
                llm_dot_pairs(a, side, np, len, pairs);
                for (int c = 0; c < 2 * np; c++, n++) {
                    llm_dot_n(a, b + c * 108, 0, 1, len, &one);
                    bad += memcmp(&one, &pairs[c], sizeof one) != 0;
                }
            }
        }
        CHECK(bad == 0 && n == 3 * 40, "f32 dot products in pairs: %d of %d differ from the plain-C ones",
              bad, n);
#endif
    }

    /* The forward pass's exponentials (attention's softmax, llm_softmax_exp; SwiGLU, llm_swiglu: with SIMD
     * llm_exp_avx2, 8 at a time, the last 8 of a row padded) are expf_ref's, a plain-C copy of their
     * algorithm with fma(), and glibc's expf's, bit for bit: every 61st float of either sign up to infinity
     * (the edges of underflow and overflow, the results below FLT_MIN among them), in rows of 1 to 17
     * values; and SwiGLU's g / (1 + exp(-g)) u and GELU's z / (1 + exp(-2 sqrt(2 / pi) (z + 0.044715 z^3))) u
     * are the plain loop's, bit for bit; and that GELU is the tanh form's 0.5 z (1 + tanh(sqrt(2 / pi) (z +
     * 0.044715 z^3))) u, computed in double, within 5e-6 of its size for |z| from 1e-30 (results of that size
     * and less lose their digits as subnormals) to 5 (further out 1 + tanh in double loses its digits): the
     * float roundings of u, which exp(-2u) scales by 2|u|, up to 9 there (measured: 2.8e-6 at z = -4.98; the
     * form in tanhf that llm_gelu replaced, 0.5 z (1 + tanhf(u)), 0.3 at z = -5, 1 + tanhf(u) cancelling) */
    {
        int bad = 0, bad_libm = 0, bad_swiglu = 0, bad_gelu = 0, n = 0, lengths[] = {1, 7, 8, 9, 16, 17};
        double gelu_off = 0; /* the largest relative difference from the tanh form in double */
        static const uint32_t edges[] = {0xc2cff1b4u /* -0x1.9fe368p6f */, 0x42b17217u /* 0x1.62e42ep6f */};
        float row[17], in[17], gate[17], up[17], gelu[17];
        for (int sign = 0; sign < 2; sign++) {
            uint32_t u = sign ? 0x80000000u : 0, end = u + 0x7f800000u; /* from +-0 to +-inf */
            for (int li = 0; u <= end; li = (li + 1) % 6) {
                int len = lengths[li];
                for (int i = 0; i < len; i++, u += 61) {
                    uint32_t bits = i == 0 && li == 5 ? edges[sign == 0] + (uint32_t)(n % 3) - 1
                                  : u > end ? end : u;
                    memcpy(&in[i], &bits, 4);
                    row[i] = gate[i] = gelu[i] = in[i];
                    up[i] = 1.0f + (float)(n % 7) / 8;
                }
                llm_softmax_exp(row, len, 0); /* x - 0 is x */
                llm_swiglu(gate, up, (size_t)len);
                llm_gelu(gelu, up, (size_t)len);
                for (int i = 0; i < len; i++, n++) {
                    float ref = expf_ref(in[i]), lib = expf(in[i]), g = in[i] / (1.0f + expf(-in[i])) * up[i];
                    float z = in[i], u = 0.7978845608f * (z + 0.044715f * z * z * z);
                    float ge = z / (1.0f + expf(-2.0f * u)) * up[i];
                    bad_gelu += memcmp(&ge, &gelu[i], 4) != 0 && !(isnan(ge) && isnan(gelu[i]));
                    if (fabsf(z) <= 5 && fabsf(z) >= 1e-30f) {
                        double ud = sqrt(2 / M_PI) * ((double)z + 0.044715 * (double)z * z * z);
                        double tanh_form = 0.5 * z * (1 + tanh(ud)) * up[i];
                        double off = fabs(gelu[i] - tanh_form) / fabs(tanh_form);
                        gelu_off = off > gelu_off ? off : gelu_off;
                    }
                    bad += memcmp(&ref, &row[i], 4) != 0;
                    bad_libm += memcmp(&lib, &row[i], 4) != 0;
                    bad_swiglu += memcmp(&g, &gate[i], 4) != 0 && !(isnan(g) && isnan(gate[i]));
                }
            }
        }
        CHECK(bad == 0 && n > 60000000, "exp: %d of %d differ from the plain-C copy", bad, n);
        CHECK(bad_swiglu == 0, "SwiGLU: %d of %d differ from the plain loop's", bad_swiglu, n);
        CHECK(bad_gelu == 0, "GELU: %d of %d differ from the plain loop's", bad_gelu, n);
        CHECK(gelu_off < 5e-6, "GELU: %.3g of a value off the tanh form's in double", gelu_off);
        printf("  GELU against its tanh form in double, 1e-30 <= |z| <= 5: %.2g of a value at most\n",
               gelu_off);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 27)
        CHECK(bad_libm == 0, "exp: %d of %d differ from glibc's expf", bad_libm, n);
#endif
    }

    /* f32, f16 and bf16 rows meet several tokens at once (f32: 4 tokens a row; f16/bf16: tiles of 4 rows and
     * 3 tokens, 16 rows a thread's share; tiles of over 6 pairs run the even runs, then the odd; AVX-512: 4
     * rows and 6 tokens, an even and an odd run in each 512-bit sum; over 6 tokens, the tile's rows first
     * converted to f32, the tile then reading those): 2, 3, 5 and 7 tokens give each
     * token's products bit for bit as one at a time, on the default and the exact paths (21 rows: a share
     * of 16 and one of 5; 124 values a row: 15 runs of 8 and a rest of 4; AVX-512: 3 pairs of runs of 16,
     * the decode's prefetch a pair, then one run of 16, one of 8 and the rest). On the
     * default path with SIMD or NEON each f16/bf16 product is also half_dot_ref's, bit for bit: the kernel's
     * order of operations, written in plain C (the same on x86 and ARM) */
    {
        enum { N = 124, R = 21, TT = 7 };
        static float x[TT * N], wf[R * N], many[TT * R], one[R];
        static uint16_t wh[R * N];
        uint64_t rng = 5;
        for (int i = 0; i < TT * N; i++) x[i] = (float)((int)(llm_splitmix64(&rng) % 2001) - 1000) / 300.0f;
        for (int i = 0; i < R * N; i++) wf[i] = (float)((int)(llm_splitmix64(&rng) % 2001) - 1000) / 700.0f;
        static const uint32_t row_types[] = {LLM_F32, LLM_F16, LLM_BF16};
        for (int ti = 0; ti < 3; ti++)
            for (int path = 0; path < 2; path++) {
                uint32_t type = row_types[ti];
                for (int i = 0; i < R * N; i++) {
                    uint32_t bits;
                    memcpy(&bits, &wf[i], 4);
                    wh[i] = type == LLM_BF16 ? (uint16_t)(bits >> 16) : llm_f32_to_f16(wf[i]);
                }
                llm_weight w = {type == LLM_F32 ? (const void *)wf : (const void *)wh, type, R, N};
                int cpu_path = path ? LLM_PATH_EXACT : LLM_PATH_ACT16, bad = 0, off_ref = 0;
                static const int steps[] = {2, 3, 5, TT};
                for (int si = 0, n; si < 4 && (n = steps[si]); si++) {
                    CHECK(llm_matmul(many, x, &w, n, cpu_path) == 0, "%s: the product failed",
                          llm_dtype_name(type));
                    for (int t = 0; t < n; t++) {
                        CHECK(llm_matmul(one, x + t * N, &w, 1, cpu_path) == 0, "%s: the product failed",
                              llm_dtype_name(type));
                        bad += memcmp(one, many + t * R, sizeof one) != 0;
#ifdef LLM_HALF_TILES
                        for (int r = 0; r < R && type != LLM_F32 && !path; r++) {
                            float ref = half_dot_ref(type, wh + r * N, x + t * N, N);
                            off_ref += memcmp(&ref, &one[r], sizeof ref) != 0;
                        }
#endif
                    }
                }
                CHECK(bad == 0, "%s rows, %s path: %d tokens' products differ in a step of 2, 3, 5 or 7 "
                      "tokens from one at a time", llm_dtype_name(type), path ? "exact" : "default", bad);
                CHECK(off_ref == 0, "%s rows, default path: %d products differ from the plain-C model of the "
                      "SIMD kernel", llm_dtype_name(type), off_ref);
            }
    }

    /* the model with converted weights: logits of a prompt against f32's */
    llm_model m;
    char err[LLM_ERR_LEN];
    if (llm_model_load(&m, model_path("stories260K.gguf"), err) != 0) { CHECK(0, "load: %s", err); return; }
    static const uint32_t types[] = {LLM_F16, LLM_BF16, LLM_Q8_0, LLM_Q4_1, LLM_Q4_0};
    /* of the largest logit's size (measured: 0.0008 0.006 0.017 0.22 0.37) */
    static const double tolerance[] = {0.005, 0.03, 0.05, 0.4, 0.6};
    enum { T = 24 };
    int V = m.cfg.vocab_size;
    int32_t toks[T], pos[T], rows[T], block[1] = {0}, start[2] = {0, T};
    const int32_t *tables[1] = {block};
    for (int i = 0; i < T; i++) { toks[i] = (int32_t)(1 + i * 37 % (V - 1)); pos[i] = i; rows[i] = i; }
    llm_batch b = {.n_tokens = T, .tokens = toks, .positions = pos, .n_seqs = 1,
                        .seq_start = start, .block_tables = tables, .n_logits = T, .logit_rows = rows};
    float *ref = (float *)malloc((size_t)T * V * sizeof(float)),
          *got = (float *)malloc((size_t)T * V * sizeof(float));
    llm_backend *be = cpu_backend(&m, 1, 32);
    CHECK(be && be->forward(be, &b, ref, err) == 0, "f32 forward: %s", err);
    if (be) be->destroy(be);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        llm_model q = m;   /* the same model, its matrices converted (norms stay f32) */
        llm_layer *layers = (llm_layer *)malloc((size_t)m.cfg.n_layers * sizeof(llm_layer));
        memcpy(layers, m.layers, (size_t)m.cfg.n_layers * sizeof(llm_layer));
        q.layers = layers;
        llm_weight *mats[64];
        int n_mats = 0;
        mats[n_mats++] = &q.tok_embd;
        for (int l = 0; l < m.cfg.n_layers; l++) {
            llm_layer *L = &layers[l];
            llm_weight *w[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (int k = 0; k < 7; k++) mats[n_mats++] = w[k];
        }
        int same_output = m.output.data == m.tok_embd.data;
        if (!same_output) mats[n_mats++] = &q.output;
        void *bufs[64];
        for (int k = 0; k < n_mats; k++) {
            llm_weight *w = mats[k];
            bufs[k] = NULL;
            if (w->cols % 32 && types[ti] != LLM_F16 && types[ti] != LLM_BF16)
                continue;  /* stays f32, as llama.cpp keeps it */
            uint8_t *buf = (uint8_t *)malloc(llm_dtype_row_bytes(types[ti], w->cols) * (size_t)w->rows);
            for (int64_t r = 0; r < w->rows; r++)
                quantize_row(types[ti], (const float *)w->data + r * w->cols, w->cols,
                             buf + (size_t)r * llm_dtype_row_bytes(types[ti], w->cols));
            w->data = buf; w->type = types[ti]; bufs[k] = buf;
        }
        if (same_output) q.output = q.tok_embd;
        be = cpu_backend(&q, 1, 32);
        CHECK(be && be->forward(be, &b, got, err) == 0, "%s forward: %s", llm_dtype_name(types[ti]), err);
        if (be) be->destroy(be);
        double worst = 0;
        for (int i = 0; i < T; i++) {
            double mx = 0, d = 0;
            for (int v = 0; v < V; v++) { /* as fmax (which GCC 12 -O3 for ARM crashed vectorizing) */
                double a = fabs(ref[(size_t)i * V + v]);
                double e = fabs(ref[(size_t)i * V + v] - got[(size_t)i * V + v]);
                mx = a > mx ? a : mx;
                d = e > d ? e : d;
            }
            worst = fmax(worst, d / mx);
        }
        CHECK(worst > 0 && worst < tolerance[ti], "stories260K as %s: logits within %g of f32's (got %g)",
              llm_dtype_name(types[ti]), tolerance[ti], worst);
        for (int k = 0; k < n_mats; k++) free(bufs[k]);
        free(layers);
    }
    free(ref); free(got);
    llm_model_free(&m);
}

/* -----------------------------------------------------------------------------------------------------------
 * Quantized files as people download them (random-quant-*.gguf: every k-quant and q5 type): the exact
 * dequantization against Python's gguf package, the plain-C path's greedy ids against float64's, the SIMD
 * dot products against the plain-C ones, the fast path's logits against the exact path's
 * -------------------------------------------------------------------------------------------------------- */
static const char *const quant_models[] = {"random-quant-q2_k.gguf", "random-quant-q3_k_m.gguf",
                                           "random-quant-q4_k_m.gguf", "random-quant-q5_k_m.gguf",
                                           "random-quant-q6_k.gguf", "random-quant-q5_0.gguf",
                                           "random-quant-q5_1.gguf"};
enum { N_QUANT_MODELS = sizeof quant_models / sizeof quant_models[0] };
static const uint32_t quant_types[] = {LLM_Q8_0, LLM_Q4_0, LLM_Q4_1, LLM_Q5_0, LLM_Q5_1,
                                       LLM_Q2_K, LLM_Q3_K, LLM_Q4_K, LLM_Q5_K, LLM_Q6_K, LLM_MXFP4};
enum { N_QUANT_TYPES = sizeof quant_types / sizeof quant_types[0] };

/* tools/gguf_dequant.py writes each quantized tensor as the gguf package dequantizes it: compare bit for
 * bit */
/* Every quantized tensor of a model file, dequantized, against the gguf package's values bit for bit; adds
 * the values compared to values_seen[type] */
static void dequant_against_gguf(const char *model, int64_t values_seen[64]) {
    llm_gguf g;
    char err[LLM_ERR_LEN], cmd[1200];
    if (llm_gguf_open(&g, model_path(model), err) != 0) { CHECK(0, "%s", err); return; }
    snprintf(cmd, sizeof cmd, ".venv/bin/python tools/gguf_dequant.py '%s'", model_path(model));
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL, "run %s", cmd);
    char name[256], type[16];
    long long n;
    int tensors = 0;
    while (p && fscanf(p, "%255s %15s %lld", name, type, &n) == 3 && fgetc(p) == '\n') {
        float *want = (float *)malloc((size_t)n * sizeof(float)), *got = (float *)malloc((size_t)n * 4);
        CHECK(fread(want, sizeof(float), (size_t)n, p) == (size_t)n, "%s: short oracle output", name);
        const llm_gguf_tensor *t = llm_gguf_tensor_find(&g, name);
        CHECK(t && !strcasecmp(llm_dtype_name(t->type), type), "%s: tensor %s of type %s",
              model, name, type);
        if (t && (int64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]) == n) {
            llm_dtype_dequant_row(t->type, t->data, got, n);
            int64_t bad = -1;
            for (int64_t i = 0; i < n && bad < 0; i++) if (memcmp(&got[i], &want[i], 4)) bad = i;
            CHECK(bad < 0, "%s %s (%s): value %lld is %.9g, gguf says %.9g", model, name, type,
                  (long long)bad, bad < 0 ? 0 : got[bad], bad < 0 ? 0 : want[bad]);
            if (t->type < 64) values_seen[t->type] += n;
        }
        tensors++;
        free(want); free(got);
    }
    int st = p ? pclose(p) : -1;
    CHECK(st == 0 && tensors > 0, "%s: the gguf oracle (.venv, made by make test) exited %d after %d "
          "tensors", model, st, tensors);
    llm_gguf_close(&g);
}

static void test_quant_dequant(void) {
    int64_t values_seen[64] = {0};
    for (int f = 0; f < N_QUANT_MODELS; f++) dequant_against_gguf(quant_models[f], values_seen);
    static const uint32_t new_types[] = {LLM_Q5_0, LLM_Q5_1, LLM_Q2_K, LLM_Q3_K, LLM_Q4_K, LLM_Q5_K,
                                         LLM_Q6_K};
    for (size_t i = 0; i < sizeof new_types / sizeof new_types[0]; i++)
        CHECK(values_seen[new_types[i]] > 10000, "%s: %lld values compared", llm_dtype_name(new_types[i]),
              (long long)values_seen[new_types[i]]);
}

/* MXFP4 (gpt-oss's experts): random-gpt-oss with its experts' down projections and its attention output
 * projections in MXFP4 (testdata/make_random_models.py quantizes them with the gguf package): every value
 * dequantized as the gguf package has it, and greedy ids on the exact and default paths (the default through
 * mxfp4's integer kernels) equal to those of a float64 forward pass (tools/gpt_oss_f64.py, which gives
 * llama.cpp's ids on the f32 model it comes from) */
static void test_mxfp4(void) {
    int64_t values_seen[64] = {0};
    dequant_against_gguf("random-gpt-oss-mxfp4.gguf", values_seen);
    CHECK(values_seen[LLM_MXFP4] == 2 * (3072 + 4 * 48 * 32), "mxfp4: %lld values compared",
          (long long)values_seen[LLM_MXFP4]);
    check_greedy_references("random-gpt-oss-mxfp4-f64.json", "completion_token_ids_float64", 2,
                            llm_cpu_exact_backend_create, "float64's");
    check_greedy_references("random-gpt-oss-mxfp4-f64.json", "completion_token_ids_float64", 2,
                            llm_cpu_backend_create, "float64's");
}

/* The exact path reproduces the float64 greedy ids */
static void test_quant_reference(void) {
    check_greedy_references("random-quant-greedy.json", "completion_token_ids_float64", 14,
                            llm_cpu_exact_backend_create, "float64's");
}

/* A block's scale d and, where the type keeps one, its dmin: f16, or mxfp4's E8M0 byte for d (a power of
 * two: the nearest) */
static void quant_set_scales(uint32_t type, uint8_t *block, float d, float dmin) {
    if (type == LLM_MXFP4) { block[0] = (uint8_t)(128 + lrintf(log2f(d))); return; } /* value 2^(e - 128) */
    size_t d_at = type == LLM_Q2_K ? 80 : type == LLM_Q3_K ? 108 : type == LLM_Q6_K ? 208 : 0;
    put16(block + d_at, llm_f32_to_f16(d));
    if (type == LLM_Q2_K || type == LLM_Q4_K || type == LLM_Q5_K || type == LLM_Q4_1 || type == LLM_Q5_1)
        put16(block + d_at + 2, llm_f32_to_f16(dmin));
}

/* A random scale: 1 to 1000 over denominator */
static float quant_random_scale(uint64_t *rng, float denominator) {
    return (float)(llm_splitmix64(rng) % 1000 + 1) / denominator;
}

/* One block of type with random stored bytes, d (and dmin) 1 */
static void quant_random_block(uint32_t type, uint8_t *block, size_t bytes, uint64_t *rng) {
    for (size_t i = 0; i < bytes; i++) block[i] = (uint8_t)(llm_splitmix64(rng) >> 24);
    quant_set_scales(type, block, 1, 1); /* its dot products are integers */
}

/* Activations of scale 1 whose products with blocks of scale 1 are integers, every partial sum exact in float
 * (16 bits: q mostly 0, else +-1, and |r| < 64) */
static void quant_integer_activations(llm_q8 *xq, int n_blocks, int wide, uint64_t *rng) {
    for (int b = 0; b < n_blocks; b++) {
        xq[b].d = 1;
        int sum[2] = {0, 0};
        for (int j = 0; j < 32; j++) {
            int pick = (int)(llm_splitmix64(rng) % 32);
            xq[b].q[j] = (int8_t)(wide ? (pick == 0) - (pick == 1) : (int)(llm_splitmix64(rng) % 255) - 127);
            xq[b].r[j] = wide ? (int8_t)((int)(llm_splitmix64(rng) % 127) - 63) : 0;
            xq[b].a[j] = (int16_t)(wide ? 256 * xq[b].q[j] + xq[b].r[j] : 0);
            sum[j / 16] += wide ? xq[b].a[j] : xq[b].q[j];
        }
        xq[b].sum[0] = sum[0]; xq[b].sum[1] = sum[1];
        xq[b].s = (float)(sum[0] + sum[1]);
        xq[b].ds[0] = (float)sum[0]; xq[b].ds[1] = (float)sum[1];
    }
}

#ifdef LLM_CPU_SIMD
/* The decode tiles (q4_0's, q4_1's, q5_0's, q5_1's, q8_0's, mxfp4's, q2_K's to q6_K's rows 8 side by side,
 * section 14): 16 rows, 4 tokens. With unit scales and integer activations every product is an integer, which
 * the tiles must give exactly as the plain-C dot does; with random scales and activations, within the fast
 * path's bound of the plain C; and 2 to 4 tokens at once give each token the same bits as one at a time */
static void quant_tiles_check(int wide, uint64_t *rng) {
    enum { N = 512, ROWS = 16, TOKENS = 4, ROW_MAX = N / 32 * 34 }; /* q8_0's row, the longest */
    const uint32_t types[] = {LLM_Q4_0, LLM_Q4_1, LLM_Q5_0, LLM_Q5_1, LLM_Q8_0, LLM_Q4_K, LLM_Q5_K, LLM_Q6_K,
                              LLM_Q2_K, LLM_Q3_K, LLM_MXFP4};
    /* mxfp4's tiles convert 8 rows' exponents at once: every exponent byte, denormals (0, 1) and 255
     * included, the float llm_e8m0_half gives */
    int e8m0_differ = 0;
    for (int e = 0; e < 256; e += 8) {
        uint8_t bytes[8];
        float eight[8];
        for (int k = 0; k < 8; k++) bytes[k] = (uint8_t)(e + k);
        _mm256_storeu_ps(eight, llm_avx2_e8m0_half8(bytes));
        for (int k = 0; k < 8; k++) {
            float one = llm_e8m0_half(bytes[k]);
            e8m0_differ += memcmp(&one, &eight[k], 4) != 0;
        }
    }
    CHECK(!e8m0_differ, "mxfp4 tiles: %d of 256 exponents converted 8 at once differ from one at a time",
          e8m0_differ);
    /* Without VNNI the tiles keep pairs of products in 16 bits over several runs before widening them: the
     * largest stored values (nibbles 15, fifth bits set, mxfp4's 6; the k-quants' 6-bit scales 63) against
     * the largest activations (q -127, r -128), every product of one sign, must not overflow them. 8 rows of
     * one block, scales 1, m and dmin 0 */
    const uint32_t sixteen_bit_types[] = {LLM_Q4_0, LLM_Q4_1, LLM_Q5_0, LLM_Q5_1, LLM_MXFP4, LLM_Q4_K,
                                          LLM_Q5_K};
    for (int ti = 0; ti < 7; ti++) {
        uint32_t type = sixteen_bit_types[ti];
        uint64_t bb, bv;
        llm_dtype_info(type, &bb, &bv);
        uint8_t rows[8 * 176], tiles[8 * 176];
        int value_at = type == LLM_MXFP4 ? 1 : type == LLM_Q4_0 || type == LLM_Q5_0 ? 2 : 4;
        for (int r = 0; r < 8; r++) {
            memset(rows + r * bb + value_at, type == LLM_MXFP4 ? 0x77 : 0xff, bb - (size_t)value_at);
            quant_set_scales(type, rows + r * bb, 1, 0);
        }
        llm_q8 xq[8];
        memset(xq, 0, sizeof xq);
        for (uint64_t b = 0; b < bv / 32; b++) {
            xq[b].d = 1;
            for (int j = 0; j < 32; j++) {
                xq[b].q[j] = -127;
                xq[b].r[j] = (int8_t)(wide ? -128 : 0);
                xq[b].a[j] = (int16_t)(wide ? 256 * xq[b].q[j] + xq[b].r[j] : 0);
                xq[b].sum[j / 16] += wide ? xq[b].a[j] : xq[b].q[j];
            }
            xq[b].s = (float)(xq[b].sum[0] + xq[b].sum[1]);
            xq[b].ds[0] = (float)xq[b].sum[0]; xq[b].ds[1] = (float)xq[b].sum[1];
        }
        float out[8];
        llm_tiles_copy(type, rows, tiles, 8, (int64_t)bv, 1);
        llm_tiles_dot(type, wide, tiles, (int64_t)bv, xq, (int64_t)bv / 32, 1, out, 8);
        double worst = 0;
        for (int r = 0; r < 8; r++) {
            double ref = llm_q8_dot_ref(type, rows + r * bb, xq, (int64_t)bv, wide);
            worst = fmax(worst, fabs(out[r] - ref) / fabs(ref));
        }
        CHECK(worst < 1e-6, "%s decode tiles, %s activations, the largest values: %.2g from the plain C",
              llm_dtype_name(type), wide ? "16-bit" : "8-bit", worst);
    }
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t type = types[ti];
        uint64_t bb, bv;
        llm_dtype_info(type, &bb, &bv);
        size_t row_bytes = llm_dtype_row_bytes(type, N);
        uint8_t rows[ROWS * ROW_MAX], tiles[ROWS * ROW_MAX];
        llm_q8 xq[TOKENS][N / 32];
        for (int real = 0; real < 2; real++) {
            for (size_t at = 0; at < ROWS * row_bytes; at += bb) {
                quant_random_block(type, rows + at, bb, rng);
                if (real) quant_set_scales(type, rows + at, quant_random_scale(rng, 3000),
                                           quant_random_scale(rng, 3000));
            }
            for (int c = 0; c < TOKENS; c++) {
                float x[N];
                for (int i = 0; i < N; i++) x[i] = (float)((int)(llm_splitmix64(rng) % 2001) - 1000) / 300.0f;
                if (real) llm_q8_quantize(x, xq[c], N, wide);
                else quant_integer_activations(xq[c], N / 32, wide, rng);
            }
            uint8_t back[ROWS * ROW_MAX];
            llm_tiles_copy(type, rows, tiles, ROWS, N, 1);
            llm_tiles_copy(type, back, tiles, ROWS, N, 0);
            CHECK(!memcmp(back, rows, ROWS * row_bytes), "%s decode tiles: the rows back from them differ",
                  llm_dtype_name(type));
            float alone[TOKENS][ROWS], together[TOKENS][ROWS];
            for (int c = 0; c < TOKENS; c++)
                for (int r = 0; r < ROWS; r += LLM_TILE_ROWS)
                    llm_tiles_dot(type, wide, tiles + r * row_bytes, N, xq[c], N / 32, 1, &alone[c][r],
                                  ROWS);
            int differ = 0;
            for (int nc = 2; nc <= TOKENS; nc++) {
                memset(together, 0, sizeof together);
                for (int r = 0; r < ROWS; r += LLM_TILE_ROWS)
                    llm_tiles_dot(type, wide, tiles + r * row_bytes, N, xq[0], N / 32, nc,
                                  &together[0][r], ROWS);
                differ += memcmp(together, alone, (size_t)nc * sizeof together[0]) != 0;
            }
            int mismatches = 0;
            double worst = 0;
            for (int c = 0; c < TOKENS; c++)
                for (int r = 0; r < ROWS; r++) {
                    const uint8_t *row = rows + r * row_bytes;
                    float ref = llm_q8_dot_ref(type, row, xq[c], N, wide), deq[N];
                    if (!real) { /* integers: exactly */
                        mismatches += ref != alone[c][r];
                        continue;
                    }
                    llm_dtype_dequant_row(type, row, deq, N);
                    double size = 0;
                    for (int i = 0; i < N; i++) {
                        const llm_q8 *xb = &xq[c][i / 32];
                        size += fabs(deq[i] * xb->d * (wide ? 256.0 * xb->q[i % 32] + xb->r[i % 32]
                                                             : xb->q[i % 32]));
                    }
                    worst = fmax(worst, fabs((double)alone[c][r] - ref) / size);
                }
            if (real)
                CHECK(worst < 1e-5 && !differ, "%s decode tiles, %s activations, random scales: %.2g of the "
                      "sum of |terms| from the plain C; %d of 3 counts of tokens at once differ",
                      llm_dtype_name(type), wide ? "16-bit" : "8-bit", worst, differ);
            else
                CHECK(!mismatches && !differ, "%s decode tiles, %s activations, integer parts: %d of %d "
                      "products differ from the plain C; %d of 3 counts of tokens at once differ",
                      llm_dtype_name(type), wide ? "16-bit" : "8-bit", mismatches, TOKENS * ROWS, differ);
        }
        /* a prefill (more tokens than the tiles take) packs its rows straight from the tiles: the same
         * products, bit for bit, as packed from the rows. The tiled weight's own rows are other random bytes,
         * so that reading them would show; 40 rows: two threads' tiles of 16, then one of 8 (half a pack of
         * 16 with AVX-512 VNNI) */
        enum { R = 40, T = LLM_TILES_MAX_TOKENS + 4 };
        uint8_t *from_rows = (uint8_t *)malloc(R * row_bytes), *tiled = (uint8_t *)malloc(R * row_bytes),
                *other = (uint8_t *)malloc(R * row_bytes);
        float *x = (float *)malloc(T * N * sizeof(float)), *packed[2];
        packed[0] = (float *)malloc(T * R * sizeof(float));
        packed[1] = (float *)malloc(T * R * sizeof(float));
        for (size_t at = 0; at < R * row_bytes; at += bb) {
            quant_random_block(type, from_rows + at, bb, rng);
            quant_set_scales(type, from_rows + at, quant_random_scale(rng, 3000),
                             quant_random_scale(rng, 3000));
            quant_random_block(type, other + at, bb, rng);
        }
        for (int i = 0; i < T * N; i++) x[i] = (float)((int)(llm_splitmix64(rng) % 2001) - 1000) / 300.0f;
        llm_tiles_copy(type, from_rows, tiled, R, N, 1);
        llm_weight from_weight = {from_rows, type, R, N, NULL}, tiles_weight = {other, type, R, N, tiled};
        int path = wide ? LLM_PATH_ACT16 : LLM_PATH_ACT8;
        CHECK(llm_matmul(packed[0], x, &from_weight, T, path) == 0 &&
              llm_matmul(packed[1], x, &tiles_weight, T, path) == 0 &&
              !memcmp(packed[0], packed[1], T * R * sizeof(float)),
              "%s, %s activations: %d tokens' products packed from the decode tiles differ from the rows'",
              llm_dtype_name(type), wide ? "16-bit" : "8-bit", T);
        free(from_rows); free(tiled); free(other); free(x); free(packed[0]); free(packed[1]);
    }
}
#endif

/* The quantized dot products with 8-bit activations (wide 0: llama.cpp's) and 16-bit ones (wide 1: q and
 * the residual r, the default) */
static void quant_dots_check(int wide) {
    uint64_t rng = 7;
    enum { N = 512 };
    float x[N];
    llm_q8 xq[N / 32];
    const char *width = wide ? "16-bit" : "8-bit";
    /* activations: quantized blocks hold their values to half a step (16 bits: half of a 256th of the 8-bit
     * step, or a whole one where r is clamped at 127), with the right sums */
    for (int i = 0; i < N; i++) x[i] = (float)((int)(llm_splitmix64(&rng) % 2001) - 1000) / 37.0f;
    llm_q8_quantize(x, xq, N, wide);
    float worst = 0;
    int sums_ok = 1;
    for (int b = 0; b < N / 32; b++) {
        int sum[2] = {0, 0};
        for (int j = 0; j < 32; j++) {
            int v = wide ? 256 * xq[b].q[j] + xq[b].r[j] : xq[b].q[j];
            sums_ok &= wide || xq[b].r[j] == 0;
            worst = fmaxf(worst, fabsf(xq[b].d * (float)v - x[b * 32 + j]) / xq[b].d);
            sum[j / 16] += v;
        }
        sums_ok &= sum[0] == xq[b].sum[0] && sum[1] == xq[b].sum[1] && xq[b].s == xq[b].d * (sum[0] + sum[1]);
        sums_ok &= xq[b].ds[0] == xq[b].d * (float)sum[0] && xq[b].ds[1] == xq[b].d * (float)sum[1];
    }
    CHECK(worst <= (wide ? 1.0001f : 0.5001f) && sums_ok, "%s activations: off by %g of a step, sums %s",
          width, worst, sums_ok ? "right" : "wrong");
#if defined(LLM_CPU_SIMD) || defined(LLM_NEON_DOT)
    { /* the SIMD quantization gives the same bytes, ties and a block of zeros included */
        llm_q8 simd[N / 32];
        for (int i = 0; i < N; i++)
            x[i] = i < 32 ? 0 : i == 32 ? 127 : i < 64 ? (float)(i % 8) + 0.5f /* scale 1: halves tie */
                                                       : (float)((int)(llm_splitmix64(&rng) % 2001) - 1000);
        llm_q8_quantize_ref(x, xq, N, wide);
        llm_q8_quantize(x, simd, N, wide);
        CHECK(!memcmp(xq, simd, sizeof simd), "%s activations: the SIMD quantization differs", width);
    }
#ifdef LLM_CPU_SIMD
    printf("  (SIMD dot products: %s, %s activations)\n", LLM_CPU_SIMD, width);
#else
    printf("  (SIMD dot products: NEON for every quantized type, %s activations)\n", width);
#endif
#else
    printf("  (no SIMD in this build: quantized rows are converted to f32, as the exact path does)\n");
#endif
    /* integer parts: d = dmin = 1 and activation scales 1 make every product an integer, which the plain-C
     * dot, the fast path's dot and the exact dequantized values must all give exactly */
    for (int ti = 0; ti < N_QUANT_TYPES; ti++) {
        uint32_t type = quant_types[ti];
        size_t row_bytes = llm_dtype_row_bytes(type, N);
        uint8_t row[N * 4];
        float deq[N];
        int mismatches = 0;
        for (int trial = 0; trial < 200; trial++) {
            uint64_t bb, bv;
            llm_dtype_info(type, &bb, &bv);
            for (size_t at = 0; at < row_bytes; at += bb) quant_random_block(type, row + at, bb, &rng);
            quant_integer_activations(xq, N / 32, wide, &rng);
            /* rows of 1 to 16 blocks of 32 (kernels that take blocks 2 or 4 at a time end in 1 to 3) */
            const int n = bv == 32 ? 32 * (1 + trial % (N / 32)) : N;
            llm_dtype_dequant_row(type, row, deq, n);
            double exact = 0;
            for (int i = 0; i < n; i++)
                exact += (double)deq[i] * (wide ? 256 * xq[i / 32].q[i % 32] + xq[i / 32].r[i % 32]
                                                : xq[i / 32].q[i % 32]);
            float ref = llm_q8_dot_ref(type, row, xq, n, wide), fast;
            llm_q8_dot(type, wide, row, 0, 1, xq, n, 0, 1, &fast, 1);
            mismatches += ref != fast || (double)ref != exact;
            if (mismatches == 1 && (ref != fast || (double)ref != exact))
                printf("  %s: exact %.1f, plain C %.1f, fast %.1f\n", llm_dtype_name(type), exact, ref, fast);
        }
        CHECK(mismatches == 0, "%s dot products, %s activations, integer parts: %d of 200 rows differ",
              llm_dtype_name(type), width, mismatches);
    }
    /* two, three and four tokens at once (a batch, a prefill) give each token's products exactly as one at a
     * time does */
    enum { COLS = 4 };
    llm_q8 *xs = (llm_q8 *)malloc(COLS * (N / 32) * sizeof(llm_q8));
    for (int c = 0; c < COLS; c++) {
        for (int i = 0; i < N; i++) x[i] = (float)((int)(llm_splitmix64(&rng) % 2001) - 1000) / 300.0f;
        llm_q8_quantize(x, xs + c * (N / 32), N, wide);
    }
    for (int ti = 0; ti < N_QUANT_TYPES; ti++) {
        uint32_t type = quant_types[ti];
        uint64_t bb, bv;
        llm_dtype_info(type, &bb, &bv);
        uint8_t row[N * 4];
        for (size_t at = 0; at < llm_dtype_row_bytes(type, N); at += bb)
            quant_random_block(type, row + at, bb, &rng);
        float together[COLS], alone[COLS];
        const int n = bv == 32 ? N - 3 * 32 : N; /* 13 blocks of 32: 3 times 4, and one */
        for (int c = 0; c < COLS; c++)
            llm_q8_dot(type, wide, row, 0, 1, xs + c * (N / 32), n, 0, 1, &alone[c], 1);
        for (int nc = 2; nc <= COLS; nc++) {
            memset(together, 0, sizeof together);
            llm_q8_dot(type, wide, row, 0, 1, xs, n, N / 32, nc, together, 1);
            CHECK(!memcmp(together, alone, (size_t)nc * sizeof(float)),
                  "%s, %s: %d tokens at once %g %g %g %g, one at a time %g %g %g %g", llm_dtype_name(type),
                  width, nc, together[0], together[1], together[2], together[3], alone[0], alone[1], alone[2],
                  alone[3]);
        }
#if LLM_DOT_ROWS > 1
        /* and LLM_DOT_ROWS rows at once (a decode step's, in builds that take more than one: one after the
         * other in memory) as each by itself, bit for bit */
        enum { ROWS = LLM_DOT_ROWS };
        uint8_t rows[ROWS][N * 4];
        size_t row_bytes = llm_dtype_row_bytes(type, n);
        for (size_t at = 0; at < ROWS * row_bytes; at += bb) { /* each row and block its own d and dmin */
            quant_random_block(type, rows[0] + at, bb, &rng);
            float d = quant_random_scale(&rng, 3000), dmin = quant_random_scale(&rng, 3000);
            quant_set_scales(type, rows[0] + at, d, dmin);
        }
        float at_once[ROWS], each[ROWS];
        llm_q8_dot(type, wide, rows[0], row_bytes, ROWS, xs, n, 0, 1, at_once, 1);
        int differ = 0;
        for (int r = 0; r < ROWS; r++) {
            llm_q8_dot(type, wide, rows[0] + r * row_bytes, 0, 1, xs, n, 0, 1, &each[r], 1);
            differ += memcmp(&at_once[r], &each[r], sizeof(float)) != 0;
        }
        CHECK(!differ, "%s, %s: %d rows at once, %d differ from one at a time (row 1: %g against %g)",
              llm_dtype_name(type), width, ROWS, differ, at_once[1], each[1]);
#endif
    }
    free(xs);
    /* real scales: the fast dot against the plain-C one and the exact row, random blocks and activations */
    for (int ti = 0; ti < N_QUANT_TYPES; ti++) {
        uint32_t type = quant_types[ti];
        uint64_t bb, bv;
        llm_dtype_info(type, &bb, &bv);
        uint8_t row[N * 4];
        float deq[N];
        double worst_fast = 0, worst_q8 = 0;
        for (int trial = 0; trial < 50; trial++) {
            for (size_t at = 0; at < llm_dtype_row_bytes(type, N); at += bb) {
                quant_random_block(type, row + at, bb, &rng);
                quant_set_scales(type, row + at, quant_random_scale(&rng, 30000), 1);
            }
            for (int i = 0; i < N; i++) x[i] = (float)((int)(llm_splitmix64(&rng) % 2001) - 1000) / 700.0f;
            llm_q8_quantize(x, xq, N, wide);
            const int n = bv == 32 ? 32 * (1 + trial % (N / 32)) : N; /* 1 to 16 blocks of 32 */
            llm_dtype_dequant_row(type, row, deq, n);
            double exact = 0, size = 0;
            for (int i = 0; i < n; i++) {
                exact += (double)deq[i] * x[i];
                size += fabs((double)deq[i] * x[i]);
            }
            float ref = llm_q8_dot_ref(type, row, xq, n, wide), fast;
            llm_q8_dot(type, wide, row, 0, 1, xq, n, 0, 1, &fast, 1);
            worst_fast = fmax(worst_fast, fabs((double)fast - ref) / size);
            worst_q8 = fmax(worst_q8, fabs((double)ref - exact) / size);
        }
        /* the rounding of 8-bit activations costs up to a few thousandths of the sum; 16 bits 256
         * times less */
        CHECK(worst_fast < 1e-5 && worst_q8 < (wide ? 4e-5 : 0.01), "%s, %s activations: fast vs plain C "
              "%.2g, plain C vs exact %.2g (of the sum of |terms|)", llm_dtype_name(type), width, worst_fast,
              worst_q8);
    }
#ifdef LLM_CPU_SIMD
    quant_tiles_check(wide, &rng);
#endif
}
#ifdef LLM_CPU_SIMD
/* Under AddressSanitizer the decode tiles' kernel loads unchecked and checks its regions once a call
 * (llm.h's LLM_UNCHECKED_LOADS): a tile one byte short of its 8 rows is still reported, in llm_tiles_dot, as
 * a load past its end would be. In a child process, whose stderr the report goes to. */
static void tiles_asan_check(void) {
    enum { N = 256 };
    size_t tile_bytes = LLM_TILE_ROWS * llm_dtype_row_bytes(LLM_Q4_1, N);
    int fds[2];
    if (pipe(fds) != 0) { CHECK(0, "pipe: %s", strerror(errno)); return; }
    fflush(stdout); fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        uint8_t *short_tile = (uint8_t *)calloc(tile_bytes - 1, 1);
        llm_q8 xq[N / 32];
        float out[LLM_TILE_ROWS];
        memset(xq, 0, sizeof xq);
        llm_tiles_dot(LLM_Q4_1, 0, short_tile, N, xq, N / 32, 1, out, LLM_TILE_ROWS);
        free(short_tile);
        _exit(0);
    }
    close(fds[1]);
    char report[16384];
    size_t got = 0;
    for (ssize_t n; got + 1 < sizeof report && (n = read(fds[0], report + got, sizeof report - 1 - got)) > 0;)
        got += (size_t)n;
    report[got] = 0;
    close(fds[0]);
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    char read_line[64];
    snprintf(read_line, sizeof read_line, "READ of size %zu at", tile_bytes);
    int failed = pid > 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(failed && strstr(report, "ERROR: AddressSanitizer") && strstr(report, read_line) &&
          strstr(report, "in llm_tiles_dot"),
          "a tile 1 byte short of %zu, under AddressSanitizer: reported in llm_tiles_dot (status %d): %.600s",
          tile_bytes, status, report);
}
#endif
static void test_quant_dots(void) {
    quant_dots_check(0);
    quant_dots_check(1);
#ifdef LLM_CPU_SIMD
    if (UNDER_ASAN) tiles_asan_check();
#endif
}

/* A case of the products' tests: rows (bytes of them) and T tokens' activations of n values. Integers
 * (real 0): d = dmin = 1, and every activation block holds a 127 so that its scale is 1; real: random
 * scales. At the extremes (where sums kept in 16 bits would overflow first): every stored value the type's
 * largest, every activation q = +-126 with r = +-127 (126 + 127/256), a token's sign each */
static void quant_products_case(uint32_t type, int real, int extreme, uint8_t *w, size_t bytes, float *x,
                                int T, int n, uint64_t *rng) {
    uint64_t bb, bv;
    llm_dtype_info(type, &bb, &bv);
    for (size_t at = 0; at < bytes; at += bb) {
        quant_random_block(type, w + at, bb, rng);
        if (real) quant_set_scales(type, w + at, quant_random_scale(rng, 30000), 1);
        if (extreme) {
            memset(w + at, type == LLM_Q8_0 ? 0x80 : type == LLM_MXFP4 ? 0x77 : 0xff, bb);
            quant_set_scales(type, w + at, 1, 1);
        }
    }
    for (int i = 0; i < T * n; i++) {
        int v = (int)(llm_splitmix64(rng) % 255) - 127;
        x[i] = real ? (float)v / 70.0f : (float)(i % 32 == 5 ? 127 : v);
        if (extreme) x[i] = (i / n % 2 ? -1.0f : 1.0f) * (i % 32 == 5 ? 127.0f : 126.49609375f);
    }
}

/* A prefill's matrix product (from LLM_PACK_MIN_TOKENS on, weights packed 8 rows at a time, 16 with AVX-512
 * VNNI), and a step of 3 tokens' (a row at a time), against the plain-C dot of every row with every token:
 * integer parts exactly, real scales closely, the extremes included. 21 rows and 11 tokens leave a pack of 5
 * rows after the first 16 (and one of 8 before it where packs are 8 rows) and 3 tokens after the first 8. */
static void test_quant_tiles(void) {
    enum { N = 512, R = 21, T = 11 };
    uint64_t rng = 11;
    float *x = (float *)malloc(T * N * sizeof(float)), *out = (float *)malloc(T * R * sizeof(float));
    float *deq = (float *)malloc(R * N * sizeof(float));
    llm_q8 *xq = (llm_q8 *)malloc(T * (N / 32) * sizeof(llm_q8));
    uint8_t *w = (uint8_t *)malloc(R * N * 2); /* the widest type, q8_0, takes 34 bytes per 32 values */
#ifdef LLM_CPU_SIMD
    CHECK(T >= LLM_PACK_MIN_TOKENS && T - 3 >= LLM_PACK_MIN_TOKENS, "11 tokens, and 8, take the packed path");
#endif
    for (int ti = 0; ti < N_QUANT_TYPES; ti++) {
        uint32_t type = quant_types[ti];
        uint64_t bb, bv;
        llm_dtype_info(type, &bb, &bv);
        size_t row_bytes = llm_dtype_row_bytes(type, N);
        for (int variant = 0; variant < 6; variant++) {
            int extreme = variant >= 4, real = !extreme && variant % 2;
            int path = variant < 2 || variant == 4 ? LLM_PATH_ACT16 : LLM_PATH_ACT8,
                wide = path == LLM_PATH_ACT16;
            const char *width = wide ? "16-bit" : "8-bit";
            quant_products_case(type, real, extreme, w, R * row_bytes, x, T, N, &rng);
            for (int t = 0; t < T; t++) llm_q8_quantize(x + t * N, xq + t * (N / 32), N, wide);
            llm_weight weight = {w, type, R, N};
            for (int r = 0; r < R; r++) llm_dtype_dequant_row(type, w + r * row_bytes, deq + r * N, N);
            /* 11 tokens packed, then 3 (a decode step of a few: a row at a time, the weights unpacked to 16
             * bits for 16-bit activations), then 1 (4 rows at a time, and the last of the 21 alone) */
            for (int steps = T; steps >= 1; steps = steps == T ? 3 : steps == 3 ? 1 : 0) {
                CHECK(llm_matmul(out, x, &weight, steps, path) == 0, "%s: the matrix product failed",
                      llm_dtype_name(type));
                int mismatches = 0;
                double worst = 0;
                for (int t = 0; t < steps; t++)
                    for (int r = 0; r < R; r++) {
                        float ref = llm_q8_dot_ref(type, w + r * row_bytes, xq + t * (N / 32), N, wide);
                        double size = 0;
                        for (int i = 0; i < N; i++) size += fabs((double)deq[r * N + i] * x[t * N + i]);
                        mismatches += out[t * R + r] != ref;
                        worst = fmax(worst, fabs((double)out[t * R + r] - ref) / size);
                    }
                if (steps == T) { /* tokens 3-10 by themselves (8 tokens: packed too) give their products bit
                                   * for bit as within 11 */
                    float last8[8 * R];
                    CHECK(llm_matmul(last8, x + 3 * N, &weight, 8, path) == 0 &&
                          !memcmp(last8, out + 3 * R, sizeof last8),
                          "%s, %s activations: 8 tokens' products differ by themselves and within 11",
                          llm_dtype_name(type), width);
                }
#ifdef LLM_CPU_SIMD
                /* sums past float's 24 bits (the k-quants' largest scales; rows: 16 blocks of the largest
                 * values), rounded in another order: an overflow would be far off */
                if (extreme && (bv == 256 || steps < LLM_PACK_MIN_TOKENS))
                    CHECK(worst < 1e-6, "%s products of 21 rows and %d tokens, %s activations, the largest "
                          "values: %.2g from plain C's (of the sum of |terms|)", llm_dtype_name(type), steps,
                          width, worst);
                else if (!real)
                    CHECK(mismatches == 0, "%s products of 21 rows and %d tokens, %s activations, integer "
                          "parts%s: %d of %d differ", llm_dtype_name(type), steps, width,
                          extreme ? " at the extremes" : "", mismatches, steps * R);
                else CHECK(worst < 1e-5, "%s products of 21 rows and %d tokens, %s activations: %.2g from "
                           "plain C's (of the sum of |terms|)", llm_dtype_name(type), steps, width, worst);
#else           /* without SIMD the rows are converted to f32 and meet x unrounded: exact on whole numbers */
                if (!real && !extreme)
                    CHECK(mismatches == 0, "%s products of 21 rows and %d tokens, %s activations, integer "
                          "parts: %d of %d differ", llm_dtype_name(type), steps, width, mismatches,
                          steps * R);
                else CHECK(worst < 0.01, "%s products of 21 rows and %d tokens, %s activations: %.2g from "
                           "plain C's (of the sum of |terms|)", llm_dtype_name(type), steps, width, worst);
#endif
            }
        }
    }
    free(x); free(out); free(deq); free(xq); free(w);
}

/* A prefill's packed products with AMX (16 tokens at a time, where the CPU has it and Linux grants it): for
 * every type, 16-bit and 8-bit activations, integer parts, random scales and the extremes, the same bits as
 * the vpdpbusd products (llm_amx_state -1: AMX refused), and on integers the plain C's exactly. 40 rows: a
 * tile of 32 and one of 8 (half a pack); 37 tokens: two of 16 with AMX, then 5 without */
static void test_quant_amx(void) {
#if defined(LLM_AMX)
    if (!llm_amx_usable()) {
        printf("    AMX: this CPU does not have it, or Linux does not grant it: its products were not run\n");
        return;
    }
    enum { N = 512, R = 40, T = 37 };
    uint64_t rng = 13;
    float *x = (float *)malloc(T * N * sizeof(float)), *out[2];
    out[0] = (float *)malloc(T * R * sizeof(float));
    out[1] = (float *)malloc(T * R * sizeof(float));
    llm_q8 *xq = (llm_q8 *)malloc(T * (N / 32) * sizeof(llm_q8));
    uint8_t *w = (uint8_t *)malloc(R * N * 2);
    for (int ti = 0; ti < N_QUANT_TYPES; ti++) {
        uint32_t type = quant_types[ti];
        size_t row_bytes = llm_dtype_row_bytes(type, N);
        for (int variant = 0; variant < 6; variant++) { /* as test_quant_tiles' */
            int extreme = variant >= 4, real = !extreme && variant % 2;
            int path = variant < 2 || variant == 4 ? LLM_PATH_ACT16 : LLM_PATH_ACT8;
            quant_products_case(type, real, extreme, w, R * row_bytes, x, T, N, &rng);
            llm_weight weight = {w, type, R, N};
            size_t before = llm_amx_matmuls;
            int failed = llm_matmul(out[0], x, &weight, T, path) != 0;
            int through_amx = llm_amx_matmuls == before + 1; /* and not by the vector kernel alone */
            llm_amx_state = -1;
            failed |= llm_matmul(out[1], x, &weight, T, path) != 0;
            through_amx &= llm_amx_matmuls == before + 1;
            llm_amx_state = 1;
            int mismatches = 0;
            for (int t = 0; t < T && !real && !extreme; t++) {
                llm_q8_quantize(x + t * N, xq + t * (N / 32), N, path == LLM_PATH_ACT16);
                for (int r = 0; r < R; r++)
                    mismatches += out[0][t * R + r] != llm_q8_dot_ref(type, w + r * row_bytes,
                                                                      xq + t * (N / 32), N,
                                                                      path == LLM_PATH_ACT16);
            }
            int differ = 0;
            for (int i = 0; i < T * R; i++) differ += memcmp(&out[0][i], &out[1][i], sizeof(float)) != 0;
            CHECK(!failed && through_amx && !differ && !mismatches, "%s, %s activations%s: %s; %d of %d AMX "
                  "products differ from vpdpbusd's, %d from the plain C's", llm_dtype_name(type),
                  path == LLM_PATH_ACT16 ? "16-bit" : "8-bit",
                  extreme ? ", the extremes" : real ? ", random scales" : "",
                  through_amx ? "through AMX" : "not through AMX once, nor the vector kernel alone once",
                  differ, T * R, mismatches);
        }
    }
    free(x); free(out[0]); free(out[1]); free(xq); free(w);
#else
    printf("    AMX: not in this build (it needs -mamx-tile -mamx-int8 with AVX-512 VNNI, and Linux)\n");
#endif
}

/* n rows of V logits, x against y: the largest difference (of y's largest magnitude); how many rows'
 * argmaxes agree is added to *same */
static double logits_apart(const float *x, const float *y, int n, int V, int *same) {
    double worst = 0;
    for (int i = 0; i < n; i++, x += V, y += V) {
        int best_x = 0, best_y = 0;
        double mx = 0, d = 0;
        for (int v = 0; v < V; v++) {
            mx = fmax(mx, fabs(y[v]));
            d = fmax(d, fabs(x[v] - y[v]));
            best_x = x[v] > x[best_x] ? v : best_x;
            best_y = y[v] > y[best_y] ? v : best_y;
        }
        worst = fmax(worst, d / mx);
        *same += best_x == best_y;
    }
    return worst;
}

/* The fast paths' logits stay close to the exact path's on every quantized model: the default (16-bit
 * activations) and cpu-int8 (llama.cpp's 8 bits) */
static void test_quant_fast_path(void) {
    for (int f = 0; f < N_QUANT_MODELS; f++) {
        llm_model m;
        char err[LLM_ERR_LEN];
        if (llm_model_load(&m, model_path(quant_models[f]), err) != 0) {
            CHECK(0, "load: %s", err);
            continue;
        }
        enum { T = 20 };
        int V = m.cfg.vocab_size;
        int32_t toks[T], pos[T], rows[T], block[2] = {0, 1}, start[2] = {0, T};
        const int32_t *tables[1] = {block};
        for (int i = 0; i < T; i++) { toks[i] = (int32_t)(1 + i * 37 % (V - 1)); pos[i] = i; rows[i] = i; }
        llm_batch b = {.n_tokens = T, .tokens = toks, .positions = pos, .n_seqs = 1, .seq_start = start,
                       .block_tables = tables, .n_logits = T, .logit_rows = rows};
        float *ref = (float *)malloc((size_t)T * V * sizeof(float));
        float *got = (float *)malloc((size_t)T * V * sizeof(float));
        llm_backend *exact = llm_cpu_exact_backend_create(&m, err);
        CHECK(exact && exact->alloc_kv(exact, 2, 16, err) == 0 && exact->forward(exact, &b, ref, err) == 0,
              "%s exact: %s", quant_models[f], err);
        for (int run = 0; run < 3; run++) { /* the default, cpu-int8, the default with an f32 KV cache */
            int wide = run != 1, f32 = run == 2;
            llm_backend *fast = wide ? llm_cpu_backend_create(&m, err) : llm_cpu_int8_backend_create(&m, err);
            CHECK(fast && (!f32 || fast->set_kv_dtype(fast, LLM_KV_F32, err) == 0) &&
                  fast->alloc_kv(fast, 2, 16, err) == 0 && fast->forward(fast, &b, got, err) == 0,
                  "%s %s%s: %s", quant_models[f], wide ? "default" : "cpu-int8", f32 ? ", f32 KV" : "", err);
            int same_top = 0;
            double worst = logits_apart(got, ref, T, V, &same_top);
            /* measured: 8-bit activations, as llama.cpp rounds them, 0.023 to 0.035 of the largest logit and
             * 17 to 20 argmaxes the same, on random weights whose logits lie close together; 16-bit ones
             * 0.0005 to 0.0006 (with an f32 KV cache 0.00009 to 0.00012), all 20 the same. Where no matrix
             * of the model takes the quantized products (no SIMD; on ARM a type without NEON kernels) the
             * products are the exact path's (rows converted to f32): only the f16 KV cache rounds, 0.0005 to
             * 0.0006, and with an f32 one the logits are the exact path's */
            int exact_products = 1;
            for (int64_t k = 0; k < m.gguf.n_tensors; k++)
                exact_products &= llm_matmul_kind(m.gguf.tensors[k].type, LLM_PATH_ACT16) != LLM_ROWS_Q8;
            if (exact_products && f32)
                CHECK(worst == 0, "%s: without SIMD and with an f32 KV cache the fast path is the exact "
                      "path, yet logits differ by %g", quant_models[f], worst);
            else
                CHECK(worst > 0 && worst < (wide || exact_products ? 0.001 : 0.05) &&
                      same_top >= T - (wide || exact_products ? 1 : 5),
                      "%s, %s activations%s: fast logits within %.3g of exact's, %d of %d argmaxes the same",
                      quant_models[f], wide ? "16-bit" : "8-bit", f32 ? ", f32 KV cache" : "", worst,
                      same_top, T);
            printf("  %s, %s activations%s: logits within %.2g of the exact path's, %d of %d argmaxes the "
                   "same\n", quant_models[f], wide ? "16-bit" : "8-bit", f32 ? ", f32 KV cache" : "", worst,
                   same_top, T);
            if (fast) fast->destroy(fast);
        }
        if (exact) exact->destroy(exact);
        free(ref); free(got);
        llm_model_free(&m);
    }
}

#define CHAT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* The default chat model (SmolLM2-135M-Instruct, Q4_1): the exact path gives the greedy ids the engine gave
 * before the fast path (recorded with commit 4913982, whose only path this was); the fast path's logits over
 * a prefill stay close to the exact path's, and pick the same token wherever the exact best two are apart */
static void test_quant_smollm2(void) {
    if (access(CHAT_MODEL, R_OK) != 0) { CHECK(0, "%s missing (make model fetches it)", CHAT_MODEL); return; }
    /* the first 10 of them (the exact path is slow: it converts every weight row at every step) */
    static const int32_t before[] = {7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34};
    int n_before = (int)(sizeof before / sizeof before[0]);
    llm_engine_config cfg = llm_engine_defaults();
    cfg.model_path = CHAT_MODEL;
    cfg.create_backend = llm_cpu_exact_backend_create;
    cfg.num_blocks = 64;
    llm_engine *e = engine_new(&cfg);
    run_result *r = (run_result *)calloc(1, sizeof *r);
    if (e) {
        llm_sampling_params p = greedy(n_before);
        run_add(e, r, "The capital of France is", NULL, 0, &p);
        run_engine(e, r);
        CHECK(r->n_tokens[0][0] == n_before && !memcmp(r->tokens[0][0], before, sizeof before),
              "SmolLM2 exact path: the greedy ids of before the fast path");
        if (r->n_tokens[0][0] != n_before || memcmp(r->tokens[0][0], before, sizeof before))
            tok_print_ids("now", r->tokens[0][0], r->n_tokens[0][0]);
        llm_engine_destroy(e);
    }
    free(r);

    llm_model m;
    char err[LLM_ERR_LEN];
    if (llm_model_load(&m, CHAT_MODEL, err) != 0) { CHECK(0, "load: %s", err); return; }
    const char *text = "Once upon a time, in a small village by the sea, there lived an old fisherman who "
                       "told the children stories about the stars, the tides and the great whales.";
    int32_t toks[96];
    int T = llm_tokenize_prompt(m.tok, text, (int)strlen(text), toks, 96), V = m.cfg.vocab_size;
    int32_t pos[96], rows[96], block[8] = {0, 1, 2, 3, 4, 5, 6, 7}, start[2] = {0, T};
    const int32_t *tables[1] = {block};
    for (int i = 0; i < T; i++) { pos[i] = i; rows[i] = i; }
    llm_batch b = {.n_tokens = T, .tokens = toks, .positions = pos, .n_seqs = 1, .seq_start = start,
                   .block_tables = tables, .n_logits = T, .logit_rows = rows};
    float *ref = (float *)malloc((size_t)T * V * sizeof(float));
    float *got = (float *)malloc((size_t)T * V * sizeof(float));
    llm_backend *exact = llm_cpu_exact_backend_create(&m, err), *fast = cpu_backend(&m, 8, 16);
    CHECK(exact && exact->alloc_kv(exact, 8, 16, err) == 0 && exact->forward(exact, &b, ref, err) == 0,
          "SmolLM2 exact: %s", err);
    CHECK(fast && fast->forward(fast, &b, got, err) == 0, "SmolLM2 fast: %s", err);
    double worst = 0;
    int clear = 0, same = 0;
    for (int i = 0; i < T; i++) {
        const float *a = ref + (size_t)i * V, *c = got + (size_t)i * V;
        int best = 0, second = -1, best_fast = 0;
        double mx = 0, d = 0;
        for (int v = 0; v < V; v++) {
            mx = fmax(mx, fabs(a[v]));
            d = fmax(d, fabs(a[v] - c[v]));
            if (a[v] > a[best]) { second = best; best = v; }
            else if (v != best && (second < 0 || a[v] > a[second])) second = v;
            if (c[v] > c[best_fast]) best_fast = v;
        }
        worst = fmax(worst, d / mx);
        if (a[best] - a[second] > 1.0f) { clear++; same += best_fast == best; }
    }
    /* measured: 0.00027 of the largest logit (16-bit activations; 8-bit ones: 0.059), every clear choice the
     * same */
    printf("  SmolLM2 default path: logits within %.2g of the exact path's (of the largest)\n", worst);
    CHECK(T > 30 && worst < 0.002 && clear > 10 && same == clear, "SmolLM2 fast path: logits within %.3g of "
          "the exact path's, %d of %d clear choices the same", worst, same, clear);
    if (exact) exact->destroy(exact);
    if (fast) fast->destroy(fast);
    free(ref); free(got);
    llm_model_free(&m);
}

/* The decode tiles on a model: the CPU backend gives every layer's matrix of a tiled type its tiles (all 7 a
 * layer where every_matrix, else at least one), a prefill packed from them gives the logits bit for bit that
 * the rows give (a second backend whose matrices have their tiles taken away), and decode steps (1 and 3
 * tokens) through them within a bound of the rows' */
static void decode_tiles_check(const char *path, const char *name, int every_matrix) {
    if (access(path, R_OK) != 0) { CHECK(0, "%s missing (make model fetches it)", path); return; }
    llm_model m;
    char err[LLM_ERR_LEN];
    if (llm_model_load(&m, path, err) != 0) { CHECK(0, "load: %s", err); return; }
    /* 8 blocks of 16 positions for each group of layers (Gemma 3 270M: 6 groups, each its own blocks) */
    int n_groups = llm_kv_groups(&m.cfg);
    if (n_groups > 8) { CHECK(0, "%s: %d groups of layers", name, n_groups); llm_model_free(&m); return; }
    llm_backend *tiled = cpu_backend(&m, 8 * n_groups, 16), *plain = cpu_backend(&m, 8 * n_groups, 16);
    if (!tiled || !plain) { llm_model_free(&m); return; }
#ifdef LLM_CPU_SIMD
    int n_tiled = 0, n_tileable = 0;
    llm_cpu *c = (llm_cpu *)tiled->ctx, *p = (llm_cpu *)plain->ctx;
    int n_matrices = 0, E = m.cfg.n_experts;
    for (int l = 0; l < m.cfg.n_layers; l++) {
        const llm_layer *L = &c->view_layers[l];
        const llm_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                  &L->gate_exps, &L->up_exps, &L->down_exps}; /* an FFN's or experts' */
        for (int k = 0; k < 10; k++) {
            int64_t rows = k < 7 ? ws[k]->rows : E ? ws[k]->rows / E : 0; /* an expert's: slices of tiles */
            n_matrices += ws[k]->data != NULL;
            n_tileable += ws[k]->data && llm_tiles_type(ws[k]->type) && rows % LLM_TILE_ROWS == 0;
            n_tiled += ws[k]->tiles != NULL;
        }
    }
    CHECK(n_matrices == 7 * m.cfg.n_layers && (every_matrix ? n_tileable == n_matrices : n_tileable > 0) &&
          n_tiled == n_tileable, "%s: %d of its %d matrices of tiled types have decode tiles (%d matrices)",
          name, n_tiled, n_tileable, n_matrices);
    /* and the output layer (Gemma 3's 262,144 q8_0 rows, SmolLM2's tied q8_0 embeddings) when its type has
     * tiles: the logits below are its products */
    const llm_weight *out = &c->view.output;
    int out_tileable = out->data && llm_tiles_type(out->type) && out->rows % LLM_TILE_ROWS == 0;
    CHECK(out_tileable == (out->tiles != NULL), "%s: output layer (%s, %lld rows) %s decode tiles", name,
          llm_dtype_name(out->type), (long long)out->rows, out->tiles ? "has" : "has no");
    memcpy(p->view_layers, m.layers, (size_t)m.cfg.n_layers * sizeof(llm_layer)); /* the rows only */
    p->view.output = m.output;
#else
    (void)every_matrix;
#endif
    const char *text = "The lighthouse keeper climbed the stairs every evening, counting the steps as his "
                       "father had, and lit the lamp before the fishing boats came home.";
    int32_t toks[128];
    int T = llm_tokenize_prompt(m.tok, text, (int)strlen(text), toks, 128), V = m.cfg.vocab_size, P = T - 9;
    int32_t pos[128], rows[128], block[8 * 8];
    const int32_t *tables[8];
    for (int i = 0; i < 8 * n_groups; i++) block[i] = i;
    for (int g = 0; g < n_groups; g++) tables[g] = block + 8 * g;
    for (int i = 0; i < T; i++) { pos[i] = i; rows[i] = i; }
    /* every prompt token's logits, so that the output layer too takes the P tokens packed */
    float *a = (float *)malloc((size_t)P * V * sizeof(float));
    float *b = (float *)malloc((size_t)P * V * sizeof(float));
    int32_t start[2] = {0, P};
    llm_batch prefill = {.n_tokens = P, .tokens = toks, .positions = pos, .n_seqs = 1, .seq_start = start,
                         .block_tables = tables, .n_logits = P, .logit_rows = rows};
    CHECK(tiled->forward(tiled, &prefill, a, err) == 0 && plain->forward(plain, &prefill, b, err) == 0,
          "%s prefill: %s", name, err);
    double worst = 0;
    int same = 0, steps = 0;
    if (!m.cfg.n_experts)
        CHECK(P > LLM_TILES_MAX_TOKENS && !memcmp(a, b, (size_t)P * V * sizeof(float)), "%s prefill of %d "
              "tokens: packed from the tiles, other logits than the file's rows give", name, P);
    else { /* a mixture: an expert that up to LLM_TILES_MAX_TOKENS of the prompt's tokens chose reads
            * its tiles as a decode step does (more: packed from them): held to the steps' bound */
        worst = logits_apart(a, b, P, V, &same);
        printf("  %s prefill, tiles against rows: logits within %.2g (of the largest)\n", name, worst);
        CHECK(worst < 1e-3 && same == P, "%s prefill of %d tokens through the tiles: logits within %.2g of "
              "the rows', %d argmaxes the same", name, P, worst, same);
        worst = 0, same = 0;
    }
    for (int at = P; at < T; steps++) { /* a token a step, then three at once (three rows of one sequence) */
        int n = at + 3 < T && steps >= 3 ? 3 : 1;
        int32_t one[2] = {0, n}, logit_rows[3] = {0, 1, 2};
        llm_batch step = {.n_tokens = n, .tokens = toks + at, .positions = pos + at, .n_seqs = 1,
                          .seq_start = one, .block_tables = tables, .n_logits = n, .logit_rows = logit_rows};
        if (tiled->forward(tiled, &step, a, err) != 0 || plain->forward(plain, &step, b, err) != 0) {
            CHECK(0, "%s decode: %s", name, err);
            break;
        }
        worst = fmax(worst, logits_apart(a, b, n, V, &same));
        at += n;
    }
    printf("  %s decode steps, tiles against rows: logits within %.2g (of the largest)\n", name, worst);
    /* measured: SmolLM2 3.1e-4 (7.4e-5 at the first step). The products differ in their last bits (a
     * block's sum in one lane, not 8), and a last bit can move the f16 rounding of a K/V value (a 2048th)
     * or of an activation's r (a 32,768th of the block's largest): the steps after carry that on */
    CHECK(worst < 1e-3 && same == T - P, "%s decode steps through the tiles: logits within %.2g of the "
          "rows', %d of %d argmaxes the same", name, worst, same, T - P);
    free(a); free(b);
    tiled->destroy(tiled); plain->destroy(plain);
    llm_model_free(&m);
}

static void test_decode_tiles_smollm2(void) {
    decode_tiles_check(CHAT_MODEL, "SmolLM2", 1);
}
/* q4_K's and q6_K's tiles: a Q4_K_M file's matrices (q4_K, and q6_K where llama-quantize gives more bits) */
static void test_decode_tiles_q4_k_m(void) {
    decode_tiles_check(model_path("random-quant-q4_k_m.gguf"), "random Q4_K_M", 0);
}
/* q3_K's and q2_K's tiles: a Q3_K_M file's every layer matrix (q3_K, with q4_K and q5_K where llama-quantize
 * gives more bits) and a Q2_K file's (q2_K, and q3_K) */
static void test_decode_tiles_q3_k_m(void) {
    decode_tiles_check(model_path("random-quant-q3_k_m.gguf"), "random Q3_K_M", 1);
}
static void test_decode_tiles_q2_k(void) {
    decode_tiles_check(model_path("random-quant-q2_k.gguf"), "random Q2_K", 1);
}
/* q5_0's tiles: a Q5_0 file's every layer matrix (Gemma 3 270M's Q4_K_M gives most of its matrices q5_0) */
static void test_decode_tiles_q5_0(void) {
    decode_tiles_check(model_path("random-quant-q5_0.gguf"), "random Q5_0", 1);
}
/* q5_1's tiles: a Q5_1 file's every layer matrix (llama-quantize's Q5_K_M gives q5_1 where a width is not a
 * multiple of 256: SmolLM2's, Gemma 3 270M's, Qwen2.5 0.5B's) */
static void test_decode_tiles_q5_1(void) {
    decode_tiles_check(model_path("random-quant-q5_1.gguf"), "random Q5_1", 1);
}
/* q5_K's tiles: a Q5_K_M file's every layer matrix (q5_K; its output layer q6_K) */
static void test_decode_tiles_q5_k_m(void) {
    decode_tiles_check(model_path("random-quant-q5_k_m.gguf"), "random Q5_K_M", 1);
}
/* a mixture's experts in tiles: a Q4_K_M mixture of experts (Mixtral's shape; its experts q4_K and q6_K),
 * each expert's rows a slice of its stacked matrix's tiles */
static void test_decode_tiles_moe(void) {
    decode_tiles_check(model_path("random-quant-moe-q4_k_m.gguf"), "random MoE Q4_K_M", 1);
}
/* mxfp4's tiles: the random gpt-oss whose experts' down projections and attention outputs are mxfp4 (its
 * other matrices f32) */
static void test_decode_tiles_mxfp4(void) {
    decode_tiles_check(model_path("random-gpt-oss-mxfp4.gguf"), "random gpt-oss MXFP4", 0);
}
/* every tiled type in one real file: Gemma 3 270M Q4_K_M (q5_0, q8_0, q4_K, q6_K; its output layer, the
 * embedding of 262,144 rows, q8_0) */
static void test_decode_tiles_gemma3(void) {
    decode_tiles_check(GEMMA3_MODEL, "Gemma 3 270M", 1);
}

/* Fidelity of the default CPU path: a real text teacher-forced through SmolLM2 on the default backend (16-bit
 * activations in the quantized dot products), on llama.cpp's arithmetic (cpu-int8: 8-bit activations) and on
 * the exact one, all through the engine's prompt logprobs
 * with K = 20; at each position, whether the two agree on the most likely token, and KL(exact || default)
 * over the exact path's top 20: sum of p(t) (log p(t) - log q(t)), with q(t) the default path's logprob of t,
 * or its 20th logprob when t is not in its top 20 (a bound on what q gives t). Nothing is renormalized: the
 * sum leaves out the exact path's mass beyond its top 20. tools/fidelity.py computes the same between
 * servers. */
static const llm_chat_message fidelity_chat[] = {
    {"user", "What is the difference between weather and climate?"},
    {"assistant", "Weather is what the atmosphere does over hours and days: rain this afternoon, a cold "
                  "front tomorrow, a heat wave next week. Climate is the pattern of weather over decades, "
                  "such as the average summer temperature of a region or how often it floods. In short, "
                  "climate is what you expect, and weather is what you get."},
    {"user", "Can you give me an example of each, for a city like London?"},
    {"assistant", "Of course. A weather report for London might say that tomorrow will be cloudy with light "
                  "showers in the morning and a high of fourteen degrees. A description of London's "
                  "climate would say that it has mild winters, cool summers and rain spread fairly evenly "
                  "through the year, with about six hundred millimetres falling annually."},
};
static const char fidelity_prose[] =
    "The river rose slowly through the night. By morning the lower fields were under water, and the farmers "
    "who had lived in the valley all their lives walked along the embankment in silence, watching the brown "
    "current carry branches, fence posts and, once, a small wooden boat with nobody in it. The old bridge "
    "held, as it had held for two hundred years, though the water reached within a hand's width of its "
    "arches. In the village school the children were told to stay at home, and most of them spent the day at "
    "their windows, delighted and a little frightened by how the familiar landscape had changed.";

static void fidelity_run(const char *model, llm_backend *(*create)(const llm_model *, char *), int kv_dtype,
                         const int32_t *ids, int P, int32_t (*top_ids)[20], float (*top)[20]) {
    llm_engine_config cfg = llm_engine_defaults();
    cfg.model_path = model;
    cfg.create_backend = create;
    cfg.num_blocks = 64; cfg.kv_cache_dtype = kv_dtype;
    llm_engine *e = engine_new(&cfg);
    if (!e) return;
    llm_sampling_params p = greedy(1);
    p.prompt_logprobs = 20;
    char err[LLM_ERR_LEN];
    CHECK(llm_engine_add_request(e, NULL, ids, P, &p, NULL, err) > 0, "fidelity: add: %s", err);
    int rows = 0;
    while (llm_engine_has_work(e)) {
        const llm_output *out;
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) {
            if (!out[i].prompt_logprobs || out[i].n_prompt_top != 20) continue;
            rows = out[i].n_prompt_logprobs;
            memcpy(top_ids, out[i].prompt_top_ids, (size_t)rows * 20 * sizeof(int32_t));
            memcpy(top, out[i].prompt_top_logprobs, (size_t)rows * 20 * sizeof(float));
        }
    }
    CHECK(rows == P - 1, "fidelity: %d rows of prompt logprobs for %d prompt tokens", rows, P);
    llm_engine_destroy(e);
}

/* Rows [n][20] of a reference's top 20 tokens and logprobs (ids_ref, lp_ref) against another run's: returns
 * the rows whose top-1 agree; *kl the mean KL(reference || it) over the reference's top 20 (a token the
 * other's top 20 lacks taken at its 20th's logprob), *kl_max the worst row's, *margin the widest gap of the
 * reference's top two where the top-1 differ */
static int fidelity_compare(int n, int32_t (*ids_ref)[20], float (*lp_ref)[20], int32_t (*ids)[20],
                            float (*lp)[20], double *kl, double *kl_max, double *margin) {
    int agree = 0;
    *kl = *kl_max = *margin = 0;
    for (int i = 0; i < n; i++) {
        agree += ids_ref[i][0] == ids[i][0];
        if (ids_ref[i][0] != ids[i][0]) *margin = fmax(*margin, lp_ref[i][0] - lp_ref[i][1]);
        double d = 0;
        for (int k = 0; k < 20; k++) {
            float q = lp[i][19];
            for (int j = 0; j < 20; j++) if (ids[i][j] == ids_ref[i][k]) q = lp[i][j];
            d += exp(lp_ref[i][k]) * (lp_ref[i][k] - q);
        }
        *kl += d; *kl_max = fmax(*kl_max, d);
    }
    *kl /= n > 0 ? n : 1;
    return agree;
}

static void test_fidelity_smollm2(void) {
    if (access(CHAT_MODEL, R_OK) != 0) { CHECK(0, "%s missing (make model fetches it)", CHAT_MODEL); return; }
    llm_model m;
    llm_chat_template ct;
    char err[LLM_ERR_LEN], text[8192];
    if (llm_model_load(&m, CHAT_MODEL, err) != 0) { CHECK(0, "load: %s", err); return; }
    llm_str tmpl = llm_gguf_string(&m.gguf, "tokenizer.chat_template");
    int n_chat = (int)(sizeof fidelity_chat / sizeof fidelity_chat[0]), P = 0;
    int len = llm_chat_template_init(&ct, tmpl.ptr, tmpl.len, m.tok, NULL, err) == 0 ?
              llm_chat_render(&ct, fidelity_chat, n_chat, NULL, 0, text, sizeof text) : -1;
    int32_t ids[1024];
    if (len > 0 && len + sizeof fidelity_prose < sizeof text) {
        memcpy(text + len, fidelity_prose, sizeof fidelity_prose);
        P = llm_tokenize_prompt(m.tok, text, strlen(text), ids, 1024);
    }
    llm_model_free(&m);
    CHECK(ct.family == LLM_CHAT_CHATML && P > 300 && P < 1024, "fidelity: %d tokens of chat and prose", P);
    if (!(P > 300 && P < 1024)) return;
    if (UNDER_ASAN) P = 128; /* the first 127 positions */
    int32_t (*ids_exact)[20] = malloc(sizeof(int32_t[20]) * P);
    int32_t (*ids_fast)[20] = malloc(sizeof(int32_t[20]) * P);
    float (*lp_exact)[20] = malloc(sizeof(float[20]) * P), (*lp_fast)[20] = malloc(sizeof(float[20]) * P);
    if (!ids_exact || !ids_fast || !lp_exact || !lp_fast) { CHECK(0, "fidelity: out of memory"); return; }
    fidelity_run(CHAT_MODEL, llm_cpu_exact_backend_create, LLM_KV_AUTO, ids, P, ids_exact, lp_exact);
    /* measured on this text (x86-64, AVX-512), against the exact path:
     * - the default (16-bit activations, f16 KV cache): top-1 agreement 318 of 318, mean KL 0.000010 nats;
     * - cpu-int8 (f16 KV cache): 304 of 318 (95.6%), every one of the 14 differences a near tie of the exact
     *   path (its top two within 0.19 nats); mean KL 0.0015 nats, the worst position 0.033 (with an f32
     *   cache: 309 of 318, 0.00126). llama.cpp (2026, AVX-512/VNNI build, f16 cache), whose arithmetic that
     *   is, on the same file and the same 319 tokens: 97.2%, mean KL over the top 20 0.00226. 15 positions
     *   here are ties within 0.05.
     * - the default with an f32 KV cache (--kv-cache-dtype f32): 318 of 318, mean KL 0.000002 nats.
     * The bounds: the default (either cache) at 99% and a mean KL under 0.0001; cpu-int8 at 94% and under
     * 0.0025; all differ only where the exact path's top two are within 0.5 nats. */
    for (int run = 0; run < (UNDER_ASAN ? 1 : 3); run++) { /* under AddressSanitizer the default path only */
        int wide = run != 1, kv_f32 = run == 2;
        fidelity_run(CHAT_MODEL, wide ? llm_cpu_backend_create : llm_cpu_int8_backend_create,
                     kv_f32 ? LLM_KV_F32 : LLM_KV_AUTO, ids, P, ids_fast, lp_fast);
        double kl, kl_max, margin;
        int agree = fidelity_compare(P - 1, ids_exact, lp_exact, ids_fast, lp_fast, &kl, &kl_max, &margin);
        double agree_bound = wide ? 0.99 : 0.94, kl_bound = wide ? 0.0001 : 0.0025;
        printf("fidelity: SmolLM2 Q4_1, %s against the exact path over %d positions: top-1 agreement %.2f%% "
               "(bound %.0f%%), differing only where exact's top two are within %.3f nats (bound 0.5), mean "
               "KL(exact || it) %.6f nats (bound %g; worst position %.5f)\n",
               kv_f32 ? "the default CPU path with an f32 KV cache" : wide ?
               "the default CPU path (16-bit activations)" : "cpu-int8 (8-bit activations)", P - 1,
               100.0 * agree / (P - 1), 100 * agree_bound, margin, kl, kl_bound, kl_max);
        CHECK(agree >= agree_bound * (P - 1) && margin < 0.5 && kl < kl_bound,
              "fidelity, %s activations%s: top-1 agreement %d of %d, differences within %g nats, mean KL %g",
              wide ? "16-bit" : "8-bit", kv_f32 ? ", f32 KV cache" : "", agree, P - 1, margin, kl);
    }
    /* the caches each path keeps: f16 by default, f32 when asked; the exact path f32 and never f16 */
    for (int k = 0; k < 6; k++) {
        int exact = k >= 3, dtype = k % 3;
        int want = exact ? (dtype == LLM_KV_F16 ? 0 : 4) : dtype == LLM_KV_F32 ? 4 : 2;
        llm_engine_config cfg = llm_engine_defaults();
        char e_err[LLM_ERR_LEN] = "";
        cfg.model_path = CHAT_MODEL; cfg.num_blocks = 4; cfg.kv_cache_dtype = dtype;
        cfg.create_backend = exact ? llm_cpu_exact_backend_create : llm_cpu_backend_create;
        llm_engine *e = llm_engine_create(&cfg, e_err);
        int got = e ? e->backend->kv_head_bytes / e->model.cfg.head_dim : 0;
        CHECK(got == want && (e || strstr(e_err, "exact")), "the %s path's KV cache, asked for %s: %d bytes "
              "a value (want %d) %s", exact ? "exact" : "default", dtype == LLM_KV_F16 ? "f16" :
              dtype == LLM_KV_F32 ? "f32" : "auto", got, want, e_err);
        llm_engine_destroy(e);
    }
    free(ids_exact); free(ids_fast); free(lp_exact); free(lp_fast);
}

/* The quantized KV cache's blocks against plain C: a head of 40 values (a whole block, then 8 padded with
 * zeros) into q8_0 and q4_0 and back. q8_0: d = max |x| / 127 in f16, each value round(x / d) * d, within
 * d / 2 of x; q4_0: d = -(the value of largest magnitude) / 8, each value (min(15, trunc(x / d + 8.5)) - 8)
 * d, within |d| of x (the clamped side), the extreme value exact. The pad's bytes: zeros' codes. */
static void test_kv_quant_blocks(void) {
    float x[40], back[40];
    for (int i = 0; i < 40; i++) x[i] = sinf(0.7f * (float)i) * (i == 13 ? 3.5f : 1.0f) - 0.1f;
    static const uint32_t types[2] = {LLM_Q8_0, LLM_Q4_0};
    for (int t = 0; t < 2; t++) {
        uint32_t type = types[t];
        size_t bb = type == LLM_Q8_0 ? 34 : 18;
        uint8_t q[2 * 34];
        memset(q, 0xAA, sizeof q);
        llm_kv_quantize_row(type, x, q, 40);
        llm_kv_dequant_head(type, q, back, 40);
        int bad = -1;
        for (int b = 0; b < 2 && bad < 0; b++) { /* the reference, block by block */
            int n = b ? 8 : 32;
            float amax = 0, max = 0;
            for (int j = 0; j < n; j++)
                if (fabsf(x[32 * b + j]) > amax) { amax = fabsf(x[32 * b + j]); max = x[32 * b + j]; }
            float d = type == LLM_Q8_0 ? amax / 127 : max / -8, dh = llm_f16_to_f32(llm_f32_to_f16(d));
            uint16_t stored;
            memcpy(&stored, q + b * bb, 2);
            if (stored != llm_f32_to_f16(d)) bad = 32 * b;
            for (int j = 0; j < 32 && bad < 0; j++) {
                float v = j < n ? x[32 * b + j] : 0, want;
                int code = type == LLM_Q8_0 ? (int8_t)q[b * bb + 2 + j]
                                            : (q[b * bb + 2 + j % 16] >> (j < 16 ? 0 : 4) & 15) - 8;
                if (type == LLM_Q8_0) want = roundf(v * (1 / d)) * dh; /* x times 1 / d, as ggml's */
                else {
                    int c = (int)(v * (1 / d) + 8.5f);
                    want = (float)((c < 15 ? c : 15) - 8) * dh;
                }
                float err = fabsf(want - v), tol = type == LLM_Q8_0 ? fabsf(d) / 2 : fabsf(d);
                if ((float)code * dh != want || err > tol + 128 * fabsf(dh - d) ||
                    (j < n && back[32 * b + j] != want) || (v == max && type == LLM_Q4_0 && want != -8 * dh))
                    bad = 32 * b + j;
            }
        }
        CHECK(bad < 0, "%s KV blocks: value %d: %g back as %g", type == LLM_Q8_0 ? "q8_0" : "q4_0", bad,
              bad >= 0 && bad < 40 ? x[bad] : 0, bad >= 0 && bad < 40 ? back[bad] : 0);
    }
    /* the q8_0 store's rounding (no libm call) is roundf's: at and around every half from -130.5 to 130.5 (4
     * floats either side of each), at each integer, and at a million values spread over [-200, 200] */
    float worst = 0;
    int wrong = 0;
    for (int k = -261; k <= 261; k++)
        for (int side = 0; side < 2; side++) {
            float v = (float)k * 0.5f;
            for (int step = 0; step < 5; step++, v = nextafterf(v, side ? 1e9f : -1e9f))
                if (llm_round_away(v) != (int)roundf(v)) { wrong++; worst = v; }
        }
    uint64_t state = 12345;
    for (int i = 0; i < 1000000; i++) {
        float v = (float)(llm_splitmix64(&state) >> 40) / (float)(1 << 24) * 400.0f - 200.0f;
        if (llm_round_away(v) != (int)roundf(v)) { wrong++; worst = v; }
    }
    CHECK(!wrong, "llm_round_away is roundf: %d differ (%.9g)", wrong, worst);
    /* the rotation of a quantized cache's blocks: against the matrix written out (entry i, j of the
     * Walsh-Hadamard matrix is -1 to the number of bits i and j share), its own inverse, and one large value
     * spread evenly over the block */
    float block[32], rotated[32], spike[32] = {[5] = 4.0f};
    double off = 0, back_off = 0, flat_off = 0;
    for (int i = 0; i < 32; i++) block[i] = sinf(1.3f * (float)i) + (i == 7 ? 9.0f : 0.0f);
    memcpy(rotated, block, sizeof block);
    llm_hadamard32(rotated);
    for (int i = 0; i < 32; i++) {
        double want = 0;
        for (int j = 0; j < 32; j++) want += (__builtin_popcount(i & j) % 2 ? -1 : 1) * (double)block[j];
        off = fmax(off, fabs(rotated[i] - want / sqrt(32.0)));
    }
    llm_hadamard32(rotated);
    llm_hadamard32(spike);
    for (int i = 0; i < 32; i++) {
        /* (as two fmax reductions this loop crashed GCC 12's aarch64 vectorizer: an internal error) */
        double back = fabs(rotated[i] - block[i]), flat = fabs(fabs(spike[i]) - 4.0 / sqrt(32.0));
        if (back > back_off) back_off = back;
        if (flat > flat_off) flat_off = flat;
    }
    CHECK(off < 1e-5 && back_off < 1e-5 && flat_off < 1e-6, "the blocks' rotation: %g from the matrix's, %g "
          "from the block after two, a spike's values %g from 4 / sqrt(32)", off, back_off, flat_off);
#ifdef LLM_VRUN
    /* the quantized cache's weighted V sum (llm_weighted_rows: o in registers over a block's converted rows)
     * is the plain loop's, bit for bit: every tile of 1 to 3 heads and 1 to LLM_VRUNS runs, 1 to 16 rows */
    enum { HD = 128, ROWS = 16 };
    static float rows[ROWS * HD], w[3 * ROWS], o_simd[3 * HD], o_plain[3 * HD];
    for (int i = 0; i < ROWS * HD; i++) rows[i] = sinf(0.37f * (float)i) * 1.7f;
    for (int i = 0; i < 3 * ROWS; i++) w[i] = cosf(0.91f * (float)i) * 0.25f + 0.3f;
    int tiles_bad = 0;
    for (int ng = 1; ng <= 3; ng++)
        for (int nv = 1; nv <= LLM_VRUNS; nv++)
            for (int n_rows = 1; n_rows <= ROWS; n_rows += 5) {
                int i0 = HD - LLM_VRUN * nv; /* the runs end at the head's end */
                for (int i = 0; i < 3 * HD; i++) o_simd[i] = o_plain[i] = 0.01f * (float)(i % 17) - 0.05f;
                llm_weighted_rows(ng, nv, rows, HD, n_rows, w, ROWS, i0, o_simd, HD);
                for (int p = 0; p < n_rows; p++)
                    for (int g = 0; g < ng; g++)
                        for (int k = i0; k < i0 + LLM_VRUN * nv; k++)
                            o_plain[g * HD + k] += w[g * ROWS + p] * rows[p * HD + k];
                if (memcmp(o_simd, o_plain, sizeof o_simd)) tiles_bad++;
            }
    CHECK(!tiles_bad, "llm_weighted_rows is the plain loop bit for bit: %d tiles differ", tiles_bad);
#endif
}

/* The pool in the same bytes (--kv-gib 0.0625) by the cache's type, on SmolLM2 (30 layers, 3 K/V heads of
 * 64 values: two blocks of 32 a head): f16 2 bytes a value, q8_0 34 and q4_0 18 per 32, so 128 / 68 = 1.88
 * and 128 / 36 = 3.56 times f16's blocks; the stats' bytes per block say the same. */
static void test_kv_quant_capacity(void) {
    static const int dtypes[3] = {LLM_KV_F16, LLM_KV_Q8_0, LLM_KV_Q4_0};
    static const int head_bytes[3] = {128, 68, 36};
    int blocks[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) {
        llm_engine_config cfg = llm_engine_defaults();
        cfg.model_path = CHAT_MODEL; cfg.kv_bytes = (size_t)64 << 20; cfg.kv_cache_dtype = dtypes[k];
        llm_engine *e = engine_new(&cfg);
        if (!e) return;
        const llm_config *mc = &e->model.cfg;
        size_t per_block = (size_t)2 * mc->n_layers * cfg.block_size * mc->n_kv_heads * head_bytes[k];
        blocks[k] = e->bm.num_blocks;
        CHECK(mc->head_dim == 64 && e->backend->kv_head_bytes == head_bytes[k] &&
              llm_engine_get_stats(e).kv_bytes_per_block == per_block &&
              blocks[k] == (int)(cfg.kv_bytes / per_block),
              "KV pool of 64 MiB, %s: %d blocks of %zu bytes (want %zu bytes, %zu blocks)",
              k == 0 ? "f16" : k == 1 ? "q8_0" : "q4_0", blocks[k],
              (size_t)llm_engine_get_stats(e).kv_bytes_per_block, per_block, cfg.kv_bytes / per_block);
        llm_engine_destroy(e);
    }
    printf("KV pool of 64 MiB on SmolLM2: f16 %d blocks, q8_0 %d (%.3fx), q4_0 %d (%.3fx)\n", blocks[0],
           blocks[1], (double)blocks[1] / blocks[0], blocks[2], (double)blocks[2] / blocks[0]);
    CHECK(blocks[1] >= 1.87 * blocks[0] && blocks[2] >= 3.5 * blocks[0], /* 1.882 and 3.556 less the floor */
          "KV pool of 64 MiB: q8_0 %d and q4_0 %d blocks against f16's %d", blocks[1], blocks[2], blocks[0]);
}

/* The quantized KV cache against the f16 cache, teacher-forced on the tests' texts (each model's prompt
 * logprobs, top 20, up to 256 tokens): SmolLM2 on the fidelity test's prose, stories260K on a story, two
 * random models on the prose. Measured (x86-64, AVX-512; top-1 agreement, mean KL over f16's top 20):
 *   q8_0: SmolLM2 99.2% (1 of 123 differs, a near tie: f16's top two within 0.022 nats), 0.0002 (unrotated
 *         blocks: 98.4%, ~0); stories260K 98.8%, 0.0042; random-llama3-gqa 99.2%, 0.0007;
 *         random-qwen3-qknorm 98.4%, 0.0008.
 *   q4_0: SmolLM2 84.6%, 0.045 (unrotated: 77.2%, 0.126); stories260K 57.7%, 0.652; random-llama3-gqa
 *         72.0%, 0.207; random-qwen3-qknorm 78.2%, 0.127: 16 levels a block of 32 lose much of K's detail
 *         (as llama.cpp's q4_0 K cache does on small models).
 * SmolLM2's heads are whole blocks, rotated before they are rounded (llm_hadamard32); the other three models'
 * (8 and 16 values) are not. The bounds: q8_0 at least 96% (SmolLM2 98%) and a mean KL under 0.01 (2.4
 * times the worst); q4_0 at least 50% and under 1.0 nats (1.5 times the worst), which still fails a cache
 * that mixes up its blocks or heads, and on SmolLM2 80% and 0.08 nats, which fails unrotated blocks.
 * tools/kv_fidelity.c measures against the exact path over 4,088 positions. */
static void story_prompt(char *out, size_t cap, int i, int n_words);
static void test_kv_quant_fidelity(void) {
    char story[2048];
    story_prompt(story, sizeof story, 3, 120);
    static const char *const models[4] = {CHAT_MODEL, "stories260K.gguf", "random-llama3-gqa.gguf",
                                          "random-qwen3-qknorm.gguf"};
    int32_t (*ids_f16)[20] = malloc(sizeof(int32_t[20]) * 512);
    int32_t (*ids_q)[20] = malloc(sizeof(int32_t[20]) * 512);
    float (*lp_f16)[20] = malloc(sizeof(float[20]) * 512), (*lp_q)[20] = malloc(sizeof(float[20]) * 512);
    if (!ids_f16 || !ids_q || !lp_f16 || !lp_q) { CHECK(0, "kv fidelity: out of memory"); return; }
    for (int m = 0; m < (UNDER_ASAN ? 2 : 4); m++) {
        const char *path = m == 0 ? CHAT_MODEL : model_path(models[m]);
        llm_model model;
        char err[LLM_ERR_LEN];
        int32_t ids[512];
        if (llm_model_load(&model, path, err) != 0) { CHECK(0, "load %s: %s", path, err); continue; }
        const char *text = m == 1 ? story : fidelity_prose;
        int P = llm_tokenize_prompt(model.tok, text, strlen(text), ids, 512);
        int hd = model.cfg.head_dim;
        llm_model_free(&model);
        if (P > 256) P = 256;
        CHECK(P > 60, "kv fidelity: %s: %d tokens", models[m], P);
        if (P <= 60) continue;
        fidelity_run(path, llm_cpu_backend_create, LLM_KV_F16, ids, P, ids_f16, lp_f16);
        for (int q = 0; q < 2; q++) {
            fidelity_run(path, llm_cpu_backend_create, q ? LLM_KV_Q4_0 : LLM_KV_Q8_0, ids, P, ids_q, lp_q);
            double kl, kl_max, margin;
            int agree = fidelity_compare(P - 1, ids_f16, lp_f16, ids_q, lp_q, &kl, &kl_max, &margin);
            /* heads of whole blocks (SmolLM2's 64) are rotated before they are rounded (llm_hadamard32):
             * q4_0 there 84.6% and 0.045 nats, 77.2% and 0.126 unrotated */
            double agree_bound = q ? (hd % 32 ? 0.50 : 0.80) : (hd % 32 ? 0.96 : 0.98);
            double kl_bound = q ? (hd % 32 ? 1.0 : 0.08) : 0.01;
            printf("kv fidelity: %s (head_dim %d), %s cache against f16 over %d positions: top-1 agreement "
                   "%.2f%% (bound %.0f%%), mean KL %.6f nats (bound %g; worst %.5f), differing where f16's "
                   "top two are within %.3f\n", models[m], hd, q ? "q4_0" : "q8_0", P - 1,
                   100.0 * agree / (P - 1), 100 * agree_bound, kl, kl_bound, kl_max, margin);
            CHECK(agree >= agree_bound * (P - 1) && kl < kl_bound, "kv fidelity, %s, %s cache: top-1 "
                  "agreement %d of %d, mean KL %g", models[m], q ? "q4_0" : "q8_0", agree, P - 1, kl);
        }
    }
    free(ids_f16); free(ids_q); free(lp_f16); free(lp_q);
}

/* Speculative decoding's cases that preempt, reuse the prefix cache and keep a draft model's K/V, with q8_0
 * and q4_0 caches (spec_cases) */
static void spec_cases(int kv_dtype);
static void test_kv_quant_speculative(void) {
    spec_cases(LLM_KV_Q8_0);
    spec_cases(LLM_KV_Q4_0);
}

/* Mixture of experts, grouped by expert: on the exact path, two sequences' tokens in one call (the experts'
 * rows gathered from both) give each token the logits it gets alone, one token a call, bit for bit. */
static void test_moe_grouped(const char *model) {
    llm_model m;
    char err[LLM_ERR_LEN] = "";
    if (llm_model_load(&m, model_path(model), err) != 0) { CHECK(0, "load %s: %s", model, err); return; }
    enum { S = 2, LEN = 12 };
    int V = m.cfg.vocab_size;
    uint64_t rng = 11;
    int32_t toks[S * LEN], pos[S * LEN], rows[S * LEN], start[S + 1] = {0, LEN, 2 * LEN};
    int G = llm_kv_groups(&m.cfg); /* one block of 64 for each sequence in each group: table g * S + s */
    int32_t ids[4 * S];
    const int32_t *tables[4 * S];
    CHECK(G <= 4, "%s: %d groups of layers, more than this test holds", model, G);
    for (int t = 0; t < G * S && t < 4 * S; t++) { ids[t] = t; tables[t] = ids + t; }
    for (int i = 0; i < S * LEN; i++) {
        toks[i] = (int32_t)(llm_splitmix64(&rng) % (uint64_t)V); pos[i] = i % LEN; rows[i] = i;
    }
    float *grouped = (float *)malloc((size_t)S * LEN * V * sizeof(float)),
        *one = (float *)malloc((size_t)V * 4);
    llm_backend *be = llm_cpu_exact_backend_create(&m, err);
    int ok = G <= 4 && be && be->alloc_kv(be, G * S, 64, err) == 0 && grouped && one;
    llm_batch all = {.n_tokens = S * LEN, .tokens = toks, .positions = pos, .n_seqs = S, .seq_start = start,
                     .block_tables = tables, .n_logits = S * LEN, .logit_rows = rows};
    ok = ok && be->forward(be, &all, grouped, err) == 0;
    int same = ok;
    for (int s = 0; ok && s < S; s++)
        for (int i = 0; i < LEN; i++) { /* token by token: the cache holds the earlier ones already */
            int32_t st[2] = {0, 1}, row = 0;
            const int32_t *alone[4]; /* sequence s's table in each group */
            for (int g = 0; g < G && g < 4; g++) alone[g] = tables[g * S + s];
            llm_batch b1 = {.n_tokens = 1, .tokens = toks + s * LEN + i, .positions = pos + s * LEN + i,
                            .n_seqs = 1, .seq_start = st, .block_tables = alone, .n_logits = 1,
                            .logit_rows = &row};
            ok = be->forward(be, &b1, one, err) == 0;
            same &= ok && !memcmp(one, grouped + (size_t)(s * LEN + i) * V, (size_t)V * sizeof(float));
        }
    CHECK(ok && same, "%s: experts grouped over a batch give each token its logits alone, bit for bit: %s",
          model, err);
    if (be) be->destroy(be);
    free(grouped); free(one); llm_model_free(&m);
}

/* Attention with more than LLM_MAX_GROUP (8) query heads per K/V head (Qwen3-235B has 16, Falcon's MQA 71):
 * the CPU takes a token's query heads 8 at a time. stories260K's weights read as 16 heads of 4 dims, first
 * with one K/V head that all 16 share (two calls of 8 heads), then with two K/V heads that are copies of it
 * (8 each, one call): the same model, so the same logits, bit for bit, for every token of a 40-token prompt
 * (each reading its whole prefix), on the default path and the exact one. */
static void test_attention_wide_groups(void) {
    llm_model m;
    char err[LLM_ERR_LEN] = "";
    if (llm_model_load(&m, model_path("stories260K.gguf"), err) != 0) { CHECK(0, "load: %s", err); return; }
    enum { LEN = 40, HD = 4 };
    llm_config *c = &m.cfg;
    int D = c->dim, V = c->vocab_size, L = c->n_layers;
    CHECK(D == 16 * HD && c->n_kv_heads * c->head_dim >= HD, "stories260K: %d wide, as this test reads it",
          D);
    c->n_heads = 16; c->head_dim = HD; c->rope_dim = HD;
    float *copies = (float *)malloc((size_t)L * 2 * 2 * HD * D * sizeof(float));
    float *logits = (float *)malloc((size_t)2 * 2 * LEN * V * sizeof(float));
    const void **orig = (const void **)malloc((size_t)L * 2 * sizeof(void *));
    int32_t toks[LEN], pos[LEN], rows[LEN], start[2] = {0, LEN}, block = 0;
    const int32_t *table[1] = {&block};
    uint64_t rng = 5;
    for (int i = 0; i < LEN; i++)
        toks[i] = (int32_t)(llm_splitmix64(&rng) % (uint64_t)V), pos[i] = rows[i] = i;
    for (int l = 0; copies && orig && l < L; l++)
        orig[2 * l] = m.layers[l].wk.data, orig[2 * l + 1] = m.layers[l].wv.data;
    int ok = copies && logits && orig;
    for (int v = 0; ok && v < 4; v++) { /* v / 2: the exact path; v % 2: two K/V heads */
        int two = v % 2;
        c->n_kv_heads = 1 + two;
        for (int l = 0; l < L; l++) {
            llm_weight *w[2] = {&m.layers[l].wk, &m.layers[l].wv};
            for (int k = 0; k < 2; k++) {
                float *dup = copies + ((size_t)l * 2 + k) * 2 * HD * D;
                memcpy(dup, orig[2 * l + k], (size_t)HD * D * sizeof(float));
                memcpy(dup + HD * D, orig[2 * l + k], (size_t)HD * D * sizeof(float));
                w[k]->data = two ? (const void *)dup : orig[2 * l + k];
                w[k]->rows = (1 + two) * HD;
            }
        }
        llm_backend *be = v / 2 ? llm_cpu_exact_backend_create(&m, err) : llm_cpu_backend_create(&m, err);
        llm_batch b = {.n_tokens = LEN, .tokens = toks, .positions = pos, .n_seqs = 1, .seq_start = start,
                       .block_tables = table, .n_logits = LEN, .logit_rows = rows};
        ok = be && be->alloc_kv(be, 1, 64, err) == 0 &&
             be->forward(be, &b, logits + (size_t)v * LEN * V, err) == 0;
        if (be) be->destroy(be);
    }
    for (int v = 0; ok && v < 4; v += 2)
        CHECK(!memcmp(logits + (size_t)v * LEN * V, logits + (size_t)(v + 1) * LEN * V, (size_t)LEN * V * 4),
              "attention, 16 query heads per K/V head (in two calls of 8) against 8 per head of a copy (one "
              "call), %s path: the same logits, bit for bit", v ? "exact" : "default");
    CHECK(ok, "attention, 16 query heads per K/V head: %s", err);
    for (int l = 0; orig && l < L; l++)
        m.layers[l].wk.data = orig[2 * l], m.layers[l].wv.data = orig[2 * l + 1];
    free(copies); free(logits); free(orig); llm_model_free(&m);
}

/* An f16 KV cache holds K and V rounded to f16, and attention over it must give what an f32 cache holding
 * those same values gives, bit for bit: K rows are converted exactly before the f32 code's products, V rows
 * in the weighted sums. Heads of 64 (AVX-512: in runs of 16), 40 (a tail after the runs) and 20 (not a
 * multiple of 8: no paired scores), a decode step's 3 queries and a prompt's 4 tokens x 3 (paired with
 * AVX-512), a window; the block table out of order. */
static void test_attention_f16_cache(void) {
    enum { BS = 16, NB = 5, KVH = 2, NQ = 3, MAXT = 4 };
    int32_t table[NB] = {3, 0, 4, 1, 2};
    int hds[3] = {64, 40, 20}, same = 0, cases = 0;
#ifdef LLM_VRUN
    int v_same = 0, v_cases = 0;
#endif
    uint64_t rng = 11;
    for (int h = 0; h < 3; h++) {
        int hd = hds[h];
        llm_model m;
        memset(&m, 0, sizeof m);
        m.cfg.head_dim = hd; m.cfg.n_kv_heads = KVH;
        size_t values = (size_t)NB * BS * KVH * hd;
        llm_cpu c32 = {.model = &m, .num_blocks = NB, .block_size = BS}, c16 = c32;
        c16.kv_half = 1;
        c32.k = malloc(values * 4); c32.v = malloc(values * 4);
        c16.k = malloc(values * 2); c16.v = malloc(values * 2);
        float *q = malloc((size_t)MAXT * NQ * hd * 4), *o32 = malloc((size_t)MAXT * NQ * hd * 4);
        float *o16 = malloc((size_t)MAXT * NQ * hd * 4);
        size_t scratch_floats = (size_t)MAXT * NQ * (NB * BS + MAXT + hd) + (BS + 1) * hd;
        float *scratch = malloc(scratch_floats * 4);
        if (!c32.k || !c32.v || !c16.k || !c16.v || !q || !o32 || !o16 || !scratch) {
            CHECK(0, "f16 cache: out of memory");
            return;
        }
        for (size_t i = 0; i < values; i++) { /* the same values in both caches */
            for (int kv = 0; kv < 2; kv++) {
                float x = (float)((double)(llm_splitmix64(&rng) >> 11) / (double)(1ull << 53) * 4 - 2);
                uint16_t hv = llm_f32_to_f16(x);
                ((uint16_t *)(kv ? c16.v : c16.k))[i] = hv;
                ((float *)(kv ? c32.v : c32.k))[i] = llm_f16_to_f32(hv);
            }
        }
        for (int i = 0; i < MAXT * NQ * hd; i++)
            q[i] = (float)((double)(llm_splitmix64(&rng) >> 11) / (double)(1ull << 53) - 0.5);
        /* (tokens, position of the first, window) */
        int runs[5][3] = {{1, 0, 0}, {1, 37, 0}, {1, 79, 20}, {4, 30, 0}, {4, 60, 9}};
        for (int r = 0; r < 5; r++)
            for (int kvh = 0; kvh < KVH; kvh++) {
                int nt = runs[r][0], pos = runs[r][1], window = runs[r][2];
                memset(o32, 0xff, (size_t)MAXT * NQ * hd * 4); memset(o16, 0, (size_t)MAXT * NQ * hd * 4);
                llm_cpu_attention(&c32, 0, table, pos, nt, kvh, NQ, window, NULL, q, o32, NQ * hd, scratch);
                llm_cpu_attention(&c16, 0, table, pos, nt, kvh, NQ, window, NULL, q, o16, NQ * hd, scratch);
                same += !memcmp(o32, o16, (size_t)nt * NQ * hd * 4);
                cases++;
            }
#ifdef LLM_VRUN
        /* the weighted sums of V (llm_cpu_weighted_v: o in registers over the blocks, from either cache)
         * are the plain loop's, bit for bit: every tile of 1 to 3 heads and 1 to LLM_VRUNS runs, the runs
         * ending at the head's end, positions 5 to 70 of the second K/V head through the table (heads of
         * 64 values) */
        for (int half = 0; half < 2 && hd == 64; half++) {
            const llm_cpu *cc = half ? &c16 : &c32;
            size_t head_bytes = (size_t)hd * (half ? 2 : 4);
            float w[3 * NB * BS], tile[3 * 64], plain[3 * 64];
            for (int i = 0; i < 3 * NB * BS; i++)
                w[i] = (float)((double)(llm_splitmix64(&rng) >> 11) / (double)(1ull << 53));
            for (int ng = 1; ng <= 3; ng++)
                for (int nv = 1; nv <= LLM_VRUNS; nv++, v_cases++) {
                    int i0 = hd - LLM_VRUN * nv;
                    llm_cpu_weighted_v(cc, ng, nv, 0, table, head_bytes, 5, 70, w, NB * BS, i0, tile, hd);
                    for (int g = 0; g < ng; g++)
                        for (int k = i0; k < hd; k++) {
                            float o = 0;
                            for (int p = 5; p <= 70; p++) {
                                const uint8_t *v = llm_cpu_kv_at(cc, cc->v, 0, table, p) + head_bytes;
                                o += w[g * NB * BS + p] * llm_cpu_kv_value(cc, v, k);
                            }
                            plain[g * hd + k] = o;
                        }
                    int differ = 0;
                    for (int g = 0; g < ng; g++)
                        differ |= memcmp(tile + g * hd + i0, plain + g * hd + i0, (size_t)(hd - i0) * 4) != 0;
                    v_same += !differ;
                }
        }
#endif
        free(c32.k); free(c32.v); free(c16.k); free(c16.v); free(q); free(o32); free(o16); free(scratch);
    }
    CHECK(same == cases, "attention over an f16 KV cache against an f32 one holding the same values: %d of "
          "%d runs the same bit for bit", same, cases);
#ifdef LLM_VRUN
    CHECK(v_same == v_cases && v_cases == 2 * 3 * LLM_VRUNS, "attention's weighted V sums against the plain "
          "loop: %d of %d tiles the same bit for bit", v_same, v_cases);
#endif
    /* and the store's rounding (8 at a time with F16C) against llm_f32_to_f16: any bits, ties, subnormals */
    enum { N = 1 << 16 };
    float *x = malloc(N * sizeof(float));
    uint16_t *h = malloc(N * sizeof(float)); /* room for f32 too: GCC 12 checks the store's f32 branch */
    llm_cpu c16 = {.kv_half = 1};
    int differ = 0;
    for (int i = 0; x && h && i < N; i++) {
        uint32_t bits = (uint32_t)llm_splitmix64(&rng);
        if (i % 4 == 1) bits = (bits & 0x807fffffu) | (uint32_t)(103 + i % 40) << 23; /* f16's edges */
        if (i % 4 == 2) bits = (bits & 0x80000000u) | (uint32_t)(112 + i % 17) << 23 | 0x1000u << (i % 3);
        memcpy(&x[i], &bits, 4);
    }
    if (x && h) llm_cpu_kv_store(&c16, h, x, N - 3);
    for (int i = 0; x && h && i < N - 3; i++) differ += h[i] != llm_f32_to_f16(x[i]);
    CHECK(x && h && differ == 0, "f16 KV store: %d of %d values rounded otherwise than llm_f32_to_f16",
          differ, N - 3);
    free(x); free(h);
}

static void test_paged_forward_models(void) {
    test_paged_forward("stories260K.gguf");
    test_paged_forward("random-qwen3-qknorm.gguf");
    test_paged_forward("random-qwen2-bias.gguf");
    test_paged_forward("random-gemma3.gguf"); /* the local layers' window of 8 across blocks and chunks */
    test_paged_forward("random-phi3.gguf");   /* the fused matrices' rows */
    test_paged_forward("random-smollm3.gguf"); /* a layer without RoPE */
    test_paged_forward("random-qwen3moe.gguf");
    test_paged_forward("random-llama-moe.gguf");
    test_paged_forward("random-gpt-oss.gguf");   /* attention sinks, a window of 8 on layer 0, biases */
    test_paged_forward("random-qwen2moe.gguf");  /* a shared expert */
    test_moe_grouped("random-qwen3moe.gguf");
    test_moe_grouped("random-llama-moe.gguf");
    test_moe_grouped("random-gpt-oss.gguf");
    test_moe_grouped("random-qwen2moe.gguf");
    test_attention_wide_groups();
    test_attention_f16_cache();
}

/* -----------------------------------------------------------------------------------------------------------
 * Sampler
 * -------------------------------------------------------------------------------------------------------- */
/* The candidate set of p on the distribution probs (given as logits log p), as a sorted bitmask of ids. */
static unsigned candidate_mask(const llm_sampling_params *p, const float *probs, int n) {
    float logits[16];
    const int32_t *ids; const float *out;
    for (int i = 0; i < n; i++) logits[i] = logf(probs[i]);
    llm_sampler *s = llm_sampler_create(n, NULL);
    int k = s ? llm_sampler_candidates(s, p, logits, n, &ids, &out) : 0;
    unsigned mask = 0;
    float sum = 0;
    for (int i = 0; i < k; i++) { mask |= 1u << ids[i]; sum += out[i]; }
    CHECK(k > 0 && fabsf(sum - 1.0f) < 1e-5f, "candidates renormalised: sum %f", sum);
    llm_sampler_free(s);
    return mask;
}

static void test_sampler(void) {
    /* a hand-made distribution, ids out of order: p = 0.05 0.4 0.1 0.25 0.2 */
    const float probs[5] = {0.05f, 0.4f, 0.1f, 0.25f, 0.2f};
    llm_sampling_params p = llm_sampling_defaults();
    CHECK(candidate_mask(&p, probs, 5) == 0x1F, "no filter keeps all five");
    p.top_p = 0.6f;  CHECK(candidate_mask(&p, probs, 5) == ((1u << 1) | (1u << 3)),
                           "top_p 0.6 keeps {1, 3} (0.4 + 0.25)");
    p.top_p = 0.66f; CHECK(candidate_mask(&p, probs, 5) == ((1u << 1) | (1u << 3) | (1u << 4)),
                           "top_p 0.66 keeps {1, 3, 4}");
    p.top_p = 0.3f;  CHECK(candidate_mask(&p, probs, 5) == (1u << 1), "top_p 0.3 keeps {1}");
    p.top_p = 1.0f; p.min_p = 0.45f;  /* keep p >= 0.45 * 0.4 = 0.18 */
    CHECK(candidate_mask(&p, probs, 5) == ((1u << 1) | (1u << 3) | (1u << 4)), "min_p 0.45 keeps {1, 3, 4}");
    p.min_p = 0.7f;                   /* keep p >= 0.28 */
    CHECK(candidate_mask(&p, probs, 5) == (1u << 1), "min_p 0.7 keeps {1}");
    p.min_p = 0.2f;                   /* keep p >= 0.08 */
    CHECK(candidate_mask(&p, probs, 5) == 0x1E, "min_p 0.2 keeps {1, 2, 3, 4}");
    p.min_p = 0; p.top_k = 2;
    CHECK(candidate_mask(&p, probs, 5) == ((1u << 1) | (1u << 3)), "top_k 2 keeps {1, 3}");
    p.top_k = 3; p.top_p = 0.7f;      /* top 3 = 0.4 0.25 0.2 renormalised: 0.47 0.29 -> 0.76 reaches 0.7 */
    CHECK(candidate_mask(&p, probs, 5) == ((1u << 1) | (1u << 3)), "top_k 3 then top_p 0.7 keeps {1, 3}");
    /* temperature sharpens: at T = 0.5 the weights are p^2: 0.16 0.0625 0.04 ...;
     * min_p 0.3 keeps p^2 >= 0.048 */
    p = llm_sampling_defaults(); p.temperature = 0.5f; p.min_p = 0.3f;
    CHECK(candidate_mask(&p, probs, 5) == ((1u << 1) | (1u << 3)),
          "temperature 0.5 with min_p 0.3 keeps {1, 3}");

    /* top-k chosen without sorting the vocabulary: the same k, in the same order (ties by id), as a full sort
     * of the weights; logits of 13 levels, so that there are ties everywhere */
    {
        enum { NV = 3000 };
        static float lg[NV];
        static llm_prob_id ref[NV];
        uint64_t lr = 5;
        for (int v = 0; v < NV; v++) lg[v] = (float)(llm_splitmix64(&lr) % 13) * 0.5f;
        llm_sampler *big = llm_sampler_create(NV, NULL);
        static const int ks[] = {1, 2, 7, 230, 231, 2999};
        int same = big != NULL;
        for (size_t j = 0; big && j < sizeof ks / sizeof *ks; j++) {
            llm_sampling_params q = llm_sampling_defaults();
            q.top_k = ks[j];
            float mx = 6.0f;
            for (int v = 0; v < NV; v++) { ref[v].id = v; ref[v].p = expf((lg[v] - mx) * 1.0f); }
            qsort(ref, NV, sizeof *ref, llm_prob_desc);
            const int32_t *ids; const float *out;
            int k = llm_sampler_candidates(big, &q, lg, NV, &ids, &out);
            same &= k == ks[j];
            for (int i = 0; same && i < k; i++) same &= ids[i] == ref[i].id;
        }
        CHECK(same, "top_k over 3000 tied weights: the first k of a full sort, in its order");
        llm_sampler_free(big);
    }

    /* The weights exp((x - max) / T) and their sum (llm_sampler_weights: with SIMD 8 at a time, the sum 8
     * partial sums in double either way) and the probabilities (llm_sampler_normalize) are the plain loop's
     * bit for bit: rows of 1 to 17 values and one of 49157, masked tokens (-inf) and NaN weighing 0 */
    {
        enum { NW = 49157 };
        static float x[NW], w[NW], ref[NW];
        int lens[] = {1, 7, 8, 9, 16, 17, NW}, bad = 0, bad_sum = 0, n = 0;
        uint64_t lr = 11;
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            int len = lens[li];
            for (int i = 0; i < len; i++) {
                uint64_t r = llm_splitmix64(&lr);
                x[i] = r % 50 == 0 ? -INFINITY : r % 77 == 0 ? NAN : (float)(r % 20001) / 1000.0f - 10.0f;
            }
            float mx = 10.0f, inv_t = 1.0f / (0.3f + 0.2f * (float)(6 - li)); /* weights of e^-66 to 1 */
            double part[8] = {0};
            for (int i = 0; i < len; i++) {
                float e = expf((x[i] - mx) * inv_t);
                ref[i] = e >= 0.0f ? e : 0.0f;
                part[i % 8] += ref[i];
            }
            double sum = ((part[0] + part[1]) + (part[2] + part[3])) +
                         ((part[4] + part[5]) + (part[6] + part[7]));
            double got = llm_sampler_weights(x, len, mx, inv_t, w);
            bad_sum += memcmp(&got, &sum, sizeof sum) != 0;
            for (int i = 0; i < len; i++) ref[i] = (float)(ref[i] / sum);
            llm_sampler_normalize(w, len, got);
            for (int i = 0; i < len; i++, n++) bad += memcmp(&w[i], &ref[i], 4) != 0;
        }
        CHECK(bad == 0 && bad_sum == 0 && n == 49157 + 58,
              "sampler weights: %d of %d probabilities and %d of 7 sums differ from the plain loop's", bad, n,
              bad_sum);
    }

    /* the top k logprobs (llm_logprobs_top, which passes runs of 16 below the k-th at once): the first k of
     * the values sorted down, ties in id order, on rows of 1 to 300 values of 9 levels (ties everywhere) */
    {
        static float row[300];
        int32_t ids[20];
        float lps[20];
        int same = 0;
        uint64_t lr = 3;
        for (int trial = 0; trial < 500; trial++) {
            int n = 1 + (int)(llm_splitmix64(&lr) % 300), k = 1 + (int)(llm_splitmix64(&lr) % 20);
            for (int i = 0; i < n; i++) row[i] = (float)(llm_splitmix64(&lr) % 9) - 4.0f;
            if (k > n) k = n;
            llm_logprobs_top(row, n, k, ids, lps);
            int ok = 1, prev = -1;
            /* the j-th: the first id of the largest value not taken yet */
            for (int j = 0; j < k && ok; j++) {
                int best = -1;
                for (int i = 0; i < n; i++) {
                    int taken = 0;
                    for (int t = 0; t < j; t++) taken |= ids[t] == i;
                    if (!taken && (best < 0 || row[i] > row[best])) best = i;
                }
                ok = ids[j] == best;
                prev = best;
            }
            same += ok && prev >= 0;
        }
        CHECK(same == 500, "top logprobs: %d of 500 rows give the first k of a sort", same);
    }

    /* random logits over a vocabulary of 1000: top-k 1 is greedy; a seed repeats; different seeds differ */
    enum { V = 1000, N = 200 };
    float *logits = (float *)malloc(V * sizeof(float));
    llm_sampler *smp = llm_sampler_create(V, NULL);
    uint64_t rng = 99;
    int32_t hist[N];
    int greedy_ok = 1, differs = 0, repeats = 1;
    for (int run = 0; run < 3; run++) {
        llm_sampling_params s = llm_sampling_defaults();
        s.temperature = 1.0f; s.top_p = 0.9f;
        uint64_t state = run == 2 ? 43 : 42;
        for (int i = 0; i < N; i++) {
            uint64_t lr = 1000 + (uint64_t)i;  /* the same logits for every run */
            for (int v = 0; v < V; v++) logits[v] = 4.0f * llm_rand_uniform(&lr);
            if (run == 0) {
                llm_sampling_params k1 = s; k1.top_k = 1;
                int best = 0; for (int v = 1; v < V; v++) if (logits[v] > logits[best]) best = v;
                uint64_t st = rng;
                greedy_ok &= llm_sampler_sample(smp, &k1, logits, NULL, 0, 0, &st) == best;
            }
            int32_t t = llm_sampler_sample(smp, &s, logits, NULL, 0, 0, &state);
            if (run == 0) hist[i] = t;
            else if (run == 1) repeats &= t == hist[i];
            else differs += t != hist[i];
        }
    }
    CHECK(greedy_ok, "top_k 1 picks the argmax");
    CHECK(repeats, "the same seed draws the same %d tokens", N);
    CHECK(differs > N / 2, "another seed draws other tokens (%d of %d differ)", differs, N);

    /* penalties, on logits 2 1 0.5 -1: repetition 2 on token 0 (seen in the prompt) halves it below token 1;
     * presence 1.5 and frequency 0.5 subtract from tokens of the output only */
    {
        const float lg[4] = {2.0f, 1.0f, 0.5f, -1.0f};
        int32_t history[4] = {0, 3, 1, 1};   /* prompt {0, 3}, output {1, 1} */
        llm_sampling_params s = llm_sampling_defaults();
        s.temperature = 0; s.repetition_penalty = 2.0f;
        uint64_t st = 1;
        llm_sampler *smp4 = llm_sampler_create(4, NULL);
        const float *w = llm_sampler_penalize(smp4, &s, lg, history, 2, 2);
        int32_t t = llm_sampler_sample(smp4, &s, lg, history, 2, 2, &st);
        CHECK(w[0] == 1.0f && w[1] == 1.0f && w[2] == 0.5f && w[3] == -2.0f,
              "repetition penalty: %g %g %g %g", w[0], w[1], w[2], w[3]);
        CHECK(t == 0, "repetition penalty: a tie goes to the lower id, got %d", t);
        /* with the output in the history too, token 1 is penalised as well */
        w = llm_sampler_penalize(smp4, &s, lg, history, 2, 4);
        t = llm_sampler_sample(smp4, &s, lg, history, 2, 4, &st);
        CHECK(w[0] == 1.0f && w[1] == 0.5f && t == 0, "repetition penalty on output tokens: %g %g",
              w[0], w[1]);
        s.repetition_penalty = 1.0f; s.presence_penalty = 1.5f; s.frequency_penalty = 0.5f;
        w = llm_sampler_penalize(smp4, &s, lg, history, 2, 4);
        t = llm_sampler_sample(smp4, &s, lg, history, 2, 4, &st);
        CHECK(w[1] == 1.0f - 1.5f - 1.0f && w[0] == 2.0f && w[3] == -1.0f && t == 0,
              "presence/frequency penalties: %g %g %g %g", w[0], w[1], w[2], w[3]);
        /* the sampler only reads the logits it is given: the penalised ones are its own copy */
        CHECK(lg[0] == 2.0f && lg[1] == 1.0f && lg[2] == 0.5f && lg[3] == -1.0f && w != lg,
              "penalties leave the caller's logits as they were");
        s.presence_penalty = s.frequency_penalty = 0;
        CHECK(llm_sampler_penalize(smp4, &s, lg, history, 2, 4) == lg,
              "no penalty: the logits themselves, no copy");
        llm_sampler_free(smp4);
    }
    free(logits); llm_sampler_free(smp);
}

/* The CPU backend's sample step against llm_sampler_sample: rows of random logits, each with its own
 * sampling (greedy, temperature, top-k/p, min-p, penalties over a history; allowed ids, logit_bias, bad words
 * and min_tokens, their row adjusted here by hand), in a shuffled order with some rows drawn twice: each
 * token is llm_sampler_sample's from the adjusted row with the same generator, which ends where it does; the
 * logprobs are float64's log-softmax of the row as given, the top ones in order. A row that is not finite
 * gives -1 (greedy or not), a row with nothing left to pick -2. */
static void test_sample_rows(void) {
    /* the argmax in 16 lanes against a plain scan by >, on rows of 1 to 99 values with NaN, infinities,
     * signed zeros and ties sprinkled in */
    uint64_t r64 = 5;
    int argmax_same = 0;
    float x[99];
    for (int trial = 0; trial < 4000; trial++) {
        int n = 1 + (int)(llm_splitmix64(&r64) % 99), best = 0, finite = 1;
        for (int i = 0; i < n; i++) {
            uint64_t k = llm_splitmix64(&r64) % 40;
            static const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 3.0f};
            x[i] = k < 6 && trial % 2 ? special[k] : (float)(int)(llm_splitmix64(&r64) % 7) - 3.0f;
        }
        for (int i = 0; i < n; i++) { if (x[i] > x[best]) best = i; finite &= isfinite(x[i]) != 0; }
        argmax_same += llm_argmax(x, n) == best && llm_argmax_finite(x, n) == (finite ? best : -1);
    }
    CHECK(argmax_same == 4000, "the argmax in lanes: %d of 4000 rows as a plain scan's", argmax_same);
    llm_model m;
    char err[LLM_ERR_LEN] = "";
    if (llm_model_load(&m, model_path("stories260K.gguf"), err) != 0) { CHECK(0, "load: %s", err); return; }
    llm_backend *be = llm_cpu_backend_create(&m, err);
    llm_sampler *ref = llm_sampler_create(m.cfg.vocab_size, err);
    CHECK(be && ref, "backend and sampler: %s", err);
    if (!be || !ref) { if (be) be->destroy(be); llm_sampler_free(ref); llm_model_free(&m); return; }
    enum { ROWS = 24, DRAWS = 32, KINDS = 9, HIST = 12, PROMPT = 5 };
    int V = m.cfg.vocab_size, eog = m.tok->eog[0];
    float *logits = (float *)malloc((size_t)ROWS * V * sizeof(float)), *adj = (float *)malloc(V * 4);
    uint64_t rng = 2026;
    for (int i = 0; i < ROWS * V; i++) /* rows of 4 spreads */
        logits[i] = (llm_rand_uniform(&rng) * 2 - 1) * (float)(1 + i / V % 4) * 3;
    logits[(size_t)3 * V + 17] = NAN;                    /* rows 3 and 4: not finite */
    logits[(size_t)4 * V + 40] = INFINITY;
    logits[(size_t)6 * V + eog] = 9.0f;                  /* row 6: the end of text is its argmax */
    const int32_t allowed[] = {eog == 7 ? 8 : 7, 30, 31, 32, 33, 300, 2, 1};
    static const int32_t bias_ids[] = {30, 31, 200}, bad_ids[] = {11, 12, 13, 14}, bad_lens[] = {3, 1};
    static const float bias[] = {3.0f, -2.0f, 5.0f};
    int32_t history[DRAWS][HIST];
    llm_sampling_params kinds[KINDS];
    for (int k = 0; k < KINDS; k++) kinds[k] = llm_sampling_defaults();
    kinds[0].temperature = 0;                                                   /* greedy */
    kinds[1].temperature = 0; kinds[1].logprobs = 5;                            /* greedy, logprobs */
    kinds[2].temperature = 0.7f; kinds[2].top_k = 0; kinds[2].top_p = 1; kinds[2].min_p = 0;
    kinds[3].temperature = 1.0f; kinds[3].top_k = 20; kinds[3].top_p = 0.8f; kinds[3].logprobs = 0;
    kinds[4].temperature = 1.3f; kinds[4].min_p = 0.1f; kinds[4].top_k = 0;
    kinds[5].temperature = 0.9f; kinds[5].repetition_penalty = 1.3f; kinds[5].presence_penalty = 0.4f;
    kinds[5].frequency_penalty = 0.2f; kinds[5].logprobs = 2;
    kinds[6].temperature = 1.0f; kinds[6].logit_bias_ids = bias_ids; kinds[6].logit_bias = bias;
    kinds[6].n_logit_bias = 3; kinds[6].bad_word_ids = bad_ids; kinds[6].bad_word_lens = bad_lens;
    kinds[6].n_bad_words = 2; kinds[6].logprobs = 4; kinds[6].top_k = 0;
    kinds[7].temperature = 0.8f; kinds[7].allowed_token_ids = allowed; kinds[7].n_allowed_token_ids = 8;
    kinds[7].top_k = 0; kinds[7].repetition_penalty = 1.1f;
    kinds[8].temperature = 0; kinds[8].min_tokens = HIST; kinds[8].stop_token_ids = allowed + 1; /* 30 */
    kinds[8].n_stop_token_ids = 1;
    llm_sample_row rows[DRAWS];
    uint64_t gen[DRAWS];
    int32_t top_ids[DRAWS][8]; float top_lp[DRAWS][8];
    for (int d = 0; d < DRAWS; d++) {
        for (int t = 0; t < HIST; t++) history[d][t] = (int32_t)(llm_splitmix64(&rng) % (uint64_t)V);
        if (d % 3 == 0) { history[d][HIST - 2] = 11; history[d][HIST - 1] = 12; } /* bad word 11 12 13 next */
        memset(&rows[d], 0, sizeof rows[d]);
        rows[d].row = d < ROWS ? (d * 7) % ROWS : (d * 5) % ROWS;   /* shuffled; 8 rows drawn twice */
        if (d % KINDS == 8) rows[d].row = 6; /* min_tokens: the row whose argmax is the end of text */
        if (d == 9 || d == 18) rows[d].row = d / 9 + 2; /* greedy from rows 3, 4 (draws 4, 21 sample them) */
        rows[d].params = &kinds[d % KINDS];
        rows[d].history = history[d]; rows[d].n_prompt = PROMPT; rows[d].n_history = HIST - (d % KINDS == 8);
        rows[d].eog = m.tok->eog; rows[d].n_eog = (int)arrlen(m.tok->eog);
        gen[d] = 1000 + (uint64_t)d; rows[d].rng_state = &gen[d];
        rows[d].top_ids = top_ids[d]; rows[d].top_logprobs = top_lp[d];
        rows[d].token = -7;
    }
    int rc = be->sample(be, rows, DRAWS, logits, err);
    CHECK(rc == 0, "sample step: %s", err);
    int tokens_same = 0, logprobs_same = 0, not_finite = 0, masked_eog = 0, n_logprobs = 0;
    for (int d = 0; rc == 0 && d < DRAWS; d++) {
        const llm_sampling_params *p = rows[d].params;
        const float *row = logits + (size_t)rows[d].row * V;
        int finite = 1;
        for (int v = 0; v < V; v++) finite &= isfinite(row[v]);
        /* the row as the request samples from it, by hand */
        for (int v = 0; v < V; v++) adj[v] = p->n_allowed_token_ids ? -INFINITY : row[v];
        for (int i = 0; i < p->n_allowed_token_ids; i++)
            adj[p->allowed_token_ids[i]] = row[p->allowed_token_ids[i]];
        for (int i = 0; i < p->n_logit_bias; i++) adj[p->logit_bias_ids[i]] += p->logit_bias[i];
        int n_out = rows[d].n_history - PROMPT;
        if (p->n_bad_words && n_out >= 2 && history[d][rows[d].n_history - 2] == 11 &&
            history[d][rows[d].n_history - 1] == 12) adj[13] = -INFINITY;
        if (p->n_bad_words) adj[14] = -INFINITY; /* a bad word of one token: never */
        if (n_out < p->min_tokens) { adj[30] = -INFINITY; adj[eog] = -INFINITY; }
        uint64_t g = 1000 + (uint64_t)d;
        int32_t want = -1;
        if (finite) want = llm_sampler_sample(ref, p, adj, history[d], PROMPT, rows[d].n_history, &g);
        if (finite && want < 0) want = -2;
        int same = rows[d].token == want && (!finite || llm_sample_row_is_argmax(&rows[d]) || gen[d] == g);
        tokens_same += same;
        if (!same) printf("    draw %d (row %d, kind %d): token %d, want %d\n", d, rows[d].row, d % KINDS,
                          rows[d].token, want);
        not_finite += !finite && rows[d].token == -1;
        if (d % KINDS == 8 && rows[d].row == 6) masked_eog += rows[d].token != eog && rows[d].token >= 0;
        if (p->logprobs < 0 || rows[d].token < 0) continue;
        /* float64's log-softmax, and the top ones by a full sort */
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) mx = row[v] > mx ? row[v] : mx; /* not fmax: GCC 12 -O3 for ARM crashed */
        for (int v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        double lse = mx + log(sum);
        int ok = fabs(rows[d].logprob - (row[rows[d].token] - lse)) <= 1e-5;
        int32_t order[8];
        for (int k = 0; k < p->logprobs; k++) {
            int best = -1;
            for (int v = 0; v < V; v++) {
                int taken = 0;
                for (int q = 0; q < k; q++) taken |= order[q] == v;
                if (!taken && (best < 0 || row[v] > row[best])) best = v;
            }
            order[k] = best;
            ok &= top_ids[d][k] == best && fabs(top_lp[d][k] - (row[best] - lse)) <= 1e-5;
        }
        logprobs_same += ok; n_logprobs++;
    }
    CHECK(tokens_same == DRAWS, "sample step: %d of %d draws llm_sampler_sample's token from the row "
          "adjusted by hand, with the same generator", tokens_same, DRAWS);
    CHECK(logprobs_same == n_logprobs && n_logprobs >= 8, "sample step: %d of %d draws' logprobs float64's",
          logprobs_same, n_logprobs);
    CHECK(not_finite == 4, "sample step: rows that are not finite give -1 (%d of 4 draws)", not_finite);
    CHECK(masked_eog == 3, "sample step: min_tokens keeps the end of text from its row's 3 draws (%d)",
          masked_eog);
    /* scoring a given token (prompt logprobs): no draw, the generator untouched; its logprob, rank and the
     * top ones float64's */
    llm_sampling_params scored = kinds[2];
    scored.prompt_logprobs = 3;
    int score_ok = 0;
    for (int q = 0; q < 4; q++) {
        llm_sample_row *r = &rows[q];
        memset(r, 0, sizeof *r);
        r->row = 5 + q; r->params = &scored; r->score = 1; r->history = history[q]; r->n_history = HIST - 1;
        gen[q] = 99; r->rng_state = &gen[q]; r->top_ids = top_ids[q]; r->top_logprobs = top_lp[q];
    }
    rc = be->sample(be, rows, 4, logits, err);
    for (int q = 0; rc == 0 && q < 4; q++) {
        const float *row = logits + (size_t)(5 + q) * V;
        int32_t t = history[q][HIST - 1];
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) mx = row[v] > mx ? row[v] : mx; /* not fmax: GCC 12 -O3 for ARM crashed */
        for (int v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        double lse = mx + log(sum);
        int rank = 1, best = 0, ok = rows[q].token == t && gen[q] == 99;
        for (int v = 0; v < V; v++) { rank += row[v] > row[t]; if (row[v] > row[best]) best = v; }
        ok &= rows[q].rank == rank && fabs(rows[q].logprob - (row[t] - lse)) <= 1e-5;
        ok &= top_ids[q][0] == best && fabs(top_lp[q][0] - (row[best] - lse)) <= 1e-5;
        score_ok += ok;
    }
    CHECK(rc == 0 && score_ok == 4, "sample step: %d of 4 scored tokens with float64's logprob and rank",
          score_ok);
    /* nothing left: the only allowed token biased away */
    llm_sampling_params none = kinds[7];
    static const int32_t one[] = {30};
    static const float minus_inf[] = {-INFINITY};
    none.allowed_token_ids = one; none.n_allowed_token_ids = 1;
    none.logit_bias_ids = one; none.logit_bias = minus_inf; none.n_logit_bias = 1;
    rows[0].params = &none; rows[0].row = 0; rows[0].score = 0;
    rc = be->sample(be, rows, 1, logits, err);
    CHECK(rc == 0 && rows[0].token == -2, "sample step: nothing left to pick gives -2 (%d)", rows[0].token);
    printf("  sample step: %d draws as llm_sampler_sample, %d with logprobs, %d not finite\n", tokens_same,
           n_logprobs, not_finite);
    free(logits); free(adj);
    llm_sampler_free(ref); be->destroy(be); llm_model_free(&m);
}

/* -----------------------------------------------------------------------------------------------------------
 * GGUF: broken files give a message naming the problem, never a crash (run under ASan: make test SANITIZE=1)
 * -------------------------------------------------------------------------------------------------------- */
static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

/* Writes bytes to a temporary file and loads it as a model; returns the error message ("" when it loaded). */
static const char *load_bytes(const void *data, size_t n) {
    static char err[LLM_ERR_LEN];
    char path[] = "/tmp/llm-test-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { snprintf(err, sizeof err, "mkstemp failed"); return err; }
    close(fd);
    write_file(path, data, n);
    llm_model m;
    err[0] = 0;
    if (llm_model_load(&m, path, err) == 0) { llm_model_free(&m); err[0] = 0; }
    unlink(path);
    return err;
}

/* Offset in the file of a tensor's type field. */
static size_t tensor_type_offset(const llm_gguf *g, const char *name) {
    const llm_gguf_tensor *t = llm_gguf_tensor_find(g, name);
    return t ? (size_t)((const uint8_t *)t->name.ptr - g->base) + t->name.len + 4 + 8 * t->n_dims : 0;
}

/* A GGUF file of every metadata value type, two tensors and a 64-byte alignment, written by hand: each value
 * reads back as written, in version 2 and 3 alike. */
static void test_gguf_values(void) {
    static uint8_t buf[1024];
    for (int version = 2; version <= 3; version++) {
        size_t n = 0;
#define PUT(p, len) (memcpy(buf + n, (p), (len)), n += (len))
#define PUT_U32(v) do { uint32_t x_ = (uint32_t)(v); PUT(&x_, 4); } while (0)
#define PUT_U64(v) do { uint64_t x_ = (uint64_t)(v); PUT(&x_, 8); } while (0)
#define PUT_KEY(k, type) do { PUT_U64(strlen(k)); PUT(k, strlen(k)); PUT_U32(type); } while (0)
        PUT("GGUF", 4); PUT_U32(version); PUT_U64(2); PUT_U64(16);
        uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
        uint32_t u32 = 4000000000u; int32_t i32 = -2000000000; float f32 = 1.5f; uint8_t bl = 1;
        uint64_t u64 = 1ull << 40; int64_t i64 = -(1ll << 40); double f64 = -0.25;
        PUT_KEY("a.u8", LLM_GGUF_U8); PUT(&u8, 1);       PUT_KEY("a.i8", LLM_GGUF_I8); PUT(&i8, 1);
        PUT_KEY("a.u16", LLM_GGUF_U16); PUT(&u16, 2);    PUT_KEY("a.i16", LLM_GGUF_I16); PUT(&i16, 2);
        PUT_KEY("a.u32", LLM_GGUF_U32); PUT(&u32, 4);    PUT_KEY("a.i32", LLM_GGUF_I32); PUT(&i32, 4);
        PUT_KEY("a.f32", LLM_GGUF_F32); PUT(&f32, 4);    PUT_KEY("a.bool", LLM_GGUF_BOOL); PUT(&bl, 1);
        PUT_KEY("a.u64", LLM_GGUF_U64); PUT(&u64, 8);    PUT_KEY("a.i64", LLM_GGUF_I64); PUT(&i64, 8);
        PUT_KEY("a.f64", LLM_GGUF_F64); PUT(&f64, 8);
        PUT_KEY("a.str", LLM_GGUF_STRING); PUT_U64(5); PUT("héll", 5);
        PUT_KEY("a.ints", LLM_GGUF_ARRAY); PUT_U32(LLM_GGUF_I16); PUT_U64(3);
        int16_t ints[3] = {-1, 2, -3}; PUT(ints, 6);
        PUT_KEY("a.floats", LLM_GGUF_ARRAY); PUT_U32(LLM_GGUF_F64); PUT_U64(2);
        double fl[2] = {0.5, -8}; PUT(fl, 16);
        PUT_KEY("a.strs", LLM_GGUF_ARRAY); PUT_U32(LLM_GGUF_STRING); PUT_U64(2);
        PUT_U64(1); PUT("x", 1); PUT_U64(0);
        PUT_KEY("general.alignment", LLM_GGUF_U32); PUT_U32(64);
        /* tensors: t0 f32 [4, 2] at 0, t1 f16 [8] at 64 */
        PUT_U64(2); PUT("t0", 2); PUT_U32(2); PUT_U64(4); PUT_U64(2); PUT_U32(LLM_F32); PUT_U64(0);
        PUT_U64(2); PUT("t1", 2); PUT_U32(1); PUT_U64(8); PUT_U32(LLM_F16); PUT_U64(64);
        size_t data = (n + 63) / 64 * 64;
        memset(buf + n, 0, data + 128 - n);
        for (int i = 0; i < 8; i++) { float v = (float)i; memcpy(buf + data + 4 * i, &v, 4); }
        n = data + 64 + 16;
#undef PUT
#undef PUT_U32
#undef PUT_U64
#undef PUT_KEY
        llm_gguf g;
        char err[LLM_ERR_LEN] = "";
        int ok = llm_gguf_parse(&g, buf, n, err) == 0;
        CHECK(ok, "hand-written GGUF v%d parses: %s", version, err);
        if (!ok) continue;
        CHECK(llm_gguf_int(&g, "a.u8", 0) == 200 && llm_gguf_int(&g, "a.i8", 0) == -100 &&
              llm_gguf_int(&g, "a.u16", 0) == 60000 && llm_gguf_int(&g, "a.i16", 0) == -30000 &&
              llm_gguf_int(&g, "a.u32", 0) == 4000000000ll && llm_gguf_int(&g, "a.i32", 0) == -2000000000 &&
              llm_gguf_int(&g, "a.bool", 0) == 1 && llm_gguf_int(&g, "a.u64", 0) == (1ll << 40) &&
              llm_gguf_int(&g, "a.i64", 0) == -(1ll << 40), "v%d integers read back", version);
        CHECK(llm_gguf_float(&g, "a.f32", 0) == 1.5 && llm_gguf_float(&g, "a.f64", 0) == -0.25 &&
              llm_gguf_float(&g, "a.u8", 0) == 200.0 && llm_gguf_float(&g, "missing", 7.0) == 7.0 &&
              llm_gguf_int(&g, "a.str", -5) == -5, "v%d floats and fallbacks", version);
        llm_str s = llm_gguf_string(&g, "a.str");
        CHECK(s.len == 5 && !memcmp(s.ptr, "héll", 5) && !llm_gguf_string(&g, "a.u8").ptr,
              "v%d string", version);
        const llm_gguf_kv *ai = llm_gguf_find(&g, "a.ints"), *af = llm_gguf_find(&g, "a.floats"),
                          *as = llm_gguf_find(&g, "a.strs");
        CHECK(ai && ai->arr_len == 3 && llm_gguf_arr_int(ai, 0) == -1 && llm_gguf_arr_int(ai, 2) == -3 &&
              llm_gguf_arr_int(ai, 3) == 0, "v%d integer array", version);
        CHECK(af && af->arr_len == 2 && llm_gguf_arr_float(af, 0) == 0.5 &&
              llm_gguf_arr_float(af, 1) == -8.0, "v%d float array", version);
        CHECK(as && as->arr_len == 2 && as->strs[0].len == 1 && as->strs[0].ptr[0] == 'x' &&
              as->strs[1].len == 0, "v%d string array", version);
        const llm_gguf_tensor *t0 = llm_gguf_tensor_find(&g, "t0"), *t1 = llm_gguf_tensor_find(&g, "t1");
        CHECK(g.alignment == 64 && t0 && t1 && t0->ne[0] == 4 && t0->ne[1] == 2 && t0->nbytes == 32 &&
              t1->nbytes == 16 && (const uint8_t *)t0->data == buf + data &&
              (const uint8_t *)t1->data == buf + data + 64 && ((const float *)t0->data)[7] == 7.0f,
              "v%d tensors at their aligned offsets", version);
        llm_gguf_close(&g);
        /* a tensor offset that is not a multiple of the alignment */
        uint64_t off = 32;
        size_t at = data - 1;
        while (at > 8 && memcmp(buf + at, "t1", 2)) at--;
        memcpy(buf + at + 2 + 4 + 8 + 4, &off, 8);
        CHECK(llm_gguf_parse(&g, buf, n, err) != 0 && strstr(err, "t1"), "misaligned tensor: \"%s\"", err);
    }
}

static void test_gguf_errors(void) {
    size_t n;
    char *file = read_file(model_path("stories260K.gguf"), &n);
    CHECK(file != NULL, "read stories260K.gguf");
    if (!file) return;
    char *buf = (char *)malloc(n);
    llm_gguf g;
    char err[LLM_ERR_LEN];
    CHECK(llm_gguf_parse(&g, file, n, err) == 0, "stories260K parses: %s", err);
    size_t data_start = (size_t)((const uint8_t *)g.tensors[0].data - g.base) - g.tensors[0].offset;
    size_t k_type = tensor_type_offset(&g, "blk.3.attn_k.weight");
    const llm_gguf_tensor *kt = llm_gguf_tensor_find(&g, "blk.3.attn_k.weight");
    size_t k_name = kt ? (size_t)(kt->name.ptr - (const char *)g.base) : 0;
    llm_str arch = llm_gguf_string(&g, "general.architecture");
    size_t arch_at = arch.ptr ? (size_t)(arch.ptr - (const char *)g.base) : 0;
    llm_gguf_close(&g);
    CHECK(k_type && k_name && arch_at, "stories260K has blk.3.attn_k.weight and an architecture");
    if (!k_type || !k_name || !arch_at) { free(buf); free(file); return; }
    const char *e;

    memcpy(buf, file, n); buf[0] = 'X';
    e = load_bytes(buf, n); CHECK(strstr(e, "bad magic") != NULL, "bad magic: \"%s\"", e);
    e = load_bytes(file, 100); CHECK(strstr(e, "truncated") != NULL, "truncated header: \"%s\"", e);
    e = load_bytes(file, n - 1000); CHECK(strstr(e, "past the end") != NULL, "truncated data: \"%s\"", e);
    memcpy(buf, file, n); uint32_t bad_type = 77; memcpy(buf + k_type, &bad_type, 4);
    e = load_bytes(buf, n); CHECK(strstr(e, "unknown") && strstr(e, "tensor type") &&
                                  strstr(e, "blk.3.attn_k.weight"), "unknown tensor type: \"%s\"", e);
    memcpy(buf, file, n); uint64_t far = (uint64_t)n * 4; memcpy(buf + k_type + 4, &far, 8);
    e = load_bytes(buf, n); CHECK(strstr(e, "past the end") && strstr(e, "blk.3.attn_k.weight"),
                                  "tensor offset past the end: \"%s\"", e);
    /* renamed: now it is missing */
    memcpy(buf, file, n); buf[k_name + strlen("blk.3.attn_k.weight") - 1] = 'X';
    e = load_bytes(buf, n); CHECK(strstr(e, "missing tensor") && strstr(e, "blk.3.attn_k.weight"),
                                  "missing tensor: \"%s\"", e);
    memcpy(buf, file, n); memcpy(buf + arch_at, "gpt9_", 5);
    e = load_bytes(buf, n);
    CHECK(strstr(e, "unsupported architecture") && strstr(e, "gpt9_") && strstr(e, "smollm3, qwen3moe"),
          "unsupported architecture, naming the known ones: \"%s\"", e);
    { /* a RoPE scaling other than linear and YaRN (Phi-3.5's LongRoPE): refused, naming it */
        static const char longrope[] = "\x08\0\0\0\0\0\0\0longrope";
        test_kv kv = {"gpt-oss.rope.scaling.type", LLM_GGUF_STRING, longrope, 16};
        char scaled[64];
        llm_model sm;
        CHECK(gguf_with_keys("random-gpt-oss.gguf", &kv, 1, scaled) == 0 &&
              llm_model_load(&sm, scaled, err) != 0 && strstr(err, "longrope") &&
              strstr(err, "linear and yarn"), "RoPE scaling longrope refused: \"%s\"", err);
        remove(scaled);
    }
    memcpy(buf, file, n); uint32_t v9 = 9; memcpy(buf + 4, &v9, 4);
    e = load_bytes(buf, n); CHECK(strstr(e, "version 9") != NULL, "unsupported version: \"%s\"", e);
    e = load_bytes("", 0); CHECK(strstr(e, "truncated") != NULL, "empty file: \"%s\"", e);
    llm_model m;
    CHECK(llm_model_load(&m, "/nonexistent/model.gguf", err) != 0 && strstr(err, "cannot open"),
          "missing file: \"%s\"", err);

    /* every cut of the header and metadata, and a sweep of single-byte corruptions through it: an error or a
     * successful parse, never a read outside the buffer (ASan watches) */
    int cuts_ok = 1, flips = 0;
    for (size_t cut = 0; cut < data_start; cut += cut < 64 ? 1 : 97) {
        char *part = (char *)malloc(cut ? cut : 1);
        memcpy(part, file, cut);
        if (llm_gguf_parse(&g, part, cut, err) == 0) { cuts_ok = 0; llm_gguf_close(&g); }
        free(part);
    }
    CHECK(cuts_ok, "every truncated header is an error");
    uint64_t rng = 5;
    int silent = 0;
    for (int i = 0; i < 300; i++) {
        memcpy(buf, file, n);
        size_t at = (size_t)(llm_splitmix64(&rng) % data_start);
        buf[at] = (char)(llm_splitmix64(&rng) & 0xFF);
        err[0] = 0;
        if (llm_gguf_parse(&g, buf, n, err) == 0) llm_gguf_close(&g);
        else { flips++; silent += err[0] == 0; }
    }
    CHECK(flips > 0 && silent == 0, "corrupted headers: %d rejected, %d of them without a message",
          flips, silent);
    free(buf); free(file);
}

/* -----------------------------------------------------------------------------------------------------------
 * Block manager
 * -------------------------------------------------------------------------------------------------------- */
static void test_block_manager(void) {
    llm_block_manager bm;
    char err[LLM_ERR_LEN];
    CHECK(llm_block_manager_init(&bm, 4, 16, 1, err) == 0, "block manager: %s", err);
    int a = llm_block_alloc(&bm), b = llm_block_alloc(&bm), c = llm_block_alloc(&bm),
        d = llm_block_alloc(&bm);
    CHECK(a == 0 && b == 1 && c == 2 && d == 3 && llm_block_alloc(&bm) == -1 && bm.num_free_blocks == 0,
          "four blocks, then none");
    int32_t toks[16];
    for (int i = 0; i < 16; i++) toks[i] = i;
    uint64_t h1 = llm_block_hash(0, toks, 16), h2 = llm_block_hash(h1, toks, 16);
    CHECK(h1 != h2 && h1 == llm_block_hash(0, toks, 16), "a block's hash depends on its prefix");
    llm_block_set_hash(&bm, b, h1); llm_block_set_hash(&bm, c, h2);
    llm_block_release(&bm, b); llm_block_release(&bm, a); llm_block_release(&bm, c);   /* free list: b a c */
    CHECK(bm.num_free_blocks == 3, "three free");
    int got = llm_block_lookup(&bm, h1);   /* a cached free block comes back out of the free list */
    CHECK(got == b && bm.blocks[b].ref_count == 1 && bm.num_free_blocks == 2,
          "prefix hit takes block %d back", got);
    got = llm_block_lookup(&bm, h1);       /* and can be shared */
    CHECK(got == b && bm.blocks[b].ref_count == 2, "second hit shares it");
    llm_block_release(&bm, b); llm_block_release(&bm, b);  /* free list: a c b */
    int x = llm_block_alloc(&bm);          /* least recently freed first: a (unhashed) */
    CHECK(x == a, "LRU: block %d allocated, expected %d", x, a);
    x = llm_block_alloc(&bm);              /* c, which evicts h2 */
    CHECK(x == c && llm_block_lookup(&bm, h2) == -1 && bm.evictions == 1, "evicting c drops its hash");
    CHECK(llm_block_lookup(&bm, h1) == b, "b is still cached");
    llm_block_manager_free(&bm);
}

/* -----------------------------------------------------------------------------------------------------------
 * Scheduler: batch invariance, preemption, chunked prefill
 * -------------------------------------------------------------------------------------------------------- */
static const char *const story_words[] = {
    "Once", "upon", "a", "time", "there", "was", "a", "little", "girl", "named", "Lily", "who", "loved", "to",
    "play", "in", "the", "park", "with", "her", "big", "red", "ball", "and", "dog"};

/* A prompt of about n_words words, different for each i. */
static void story_prompt(char *out, size_t cap, int i, int n_words) {
    size_t len = 0;
    out[0] = 0;
    for (int w = 0; w < n_words && len + 16 < cap; w++)
        len += (size_t)snprintf(out + len, cap - len, "%s%s", w ? " " : "",
                                story_words[(i * 7 + w * (i % 5 + 1)) % 25]);
}

enum { N_MIX = 32 };
/* The i-th of the N_MIX requests of the mix: its prompt (room for 1024) and its sampling */
static llm_sampling_params mixed_request(int i, char *prompt) {
    story_prompt(prompt, 1024, i, 1 + (i * 13) % 40);
    llm_sampling_params p = greedy(1 + (i * 17) % 48);
    p.ignore_eos = i % 2;   /* half of them may stop early at EOS */
    return p;
}

static void mixed_requests(llm_engine *e, run_result *r) {
    for (int i = 0; i < N_MIX; i++) {
        char prompt[1024];
        llm_sampling_params p = mixed_request(i, prompt);
        run_add(e, r, prompt, NULL, 0, &p);
    }
}

/* A new engine of cfg that has run the whole mix together into r (cleared first); the caller destroys it */
static llm_engine *run_mixed(const llm_engine_config *cfg, run_result *r) {
    llm_engine *e = engine_new(cfg);
    memset(r, 0, sizeof *r);
    mixed_requests(e, r);
    run_engine(e, r);
    return e;
}

static int same_outputs(const run_result *a, const run_result *b, const char *what) {
    int bad = 0;
    for (int i = 0; i < N_MIX; i++)
        if (a->n_tokens[i][0] != b->n_tokens[i][0] ||
            memcmp(a->tokens[i][0], b->tokens[i][0], (size_t)a->n_tokens[i][0] * 4) ||
            a->finish[i][0] != b->finish[i][0] || a->text_len[i][0] != b->text_len[i][0] ||
            memcmp(a->text[i][0], b->text[i][0], (size_t)a->text_len[i][0])) {
            if (!bad) printf("    %s: request %d: %d tokens vs %d alone\n", what, i, b->n_tokens[i][0],
                             a->n_tokens[i][0]);
            bad++;
        }
    CHECK(bad == 0, "%s: %d of %d requests differ from running alone", what, bad, N_MIX);
    return bad == 0;
}

static void test_batch_invariance(void) {
    char eos_model[64];
    CHECK(stories_with_eos(426, eos_model) == 0, "stories260K with EOS \".\"");  /* so that some stop early */
    run_result *alone = (run_result *)calloc(1, sizeof *alone), *r = (run_result *)calloc(1, sizeof *r);
    llm_engine_config cfg = engine_config("stories260K.gguf");
    cfg.model_path = eos_model;
    cfg.enable_prefix_caching = 0;
    /* alone: each request by itself */
    llm_engine *e = engine_new(&cfg);
    if (!e) { free(alone); free(r); return; }
    run_result *one = (run_result *)calloc(1, sizeof *one);
    mixed_requests(e, one);     /* registers ids; we abort them all and rerun one at a time */
    for (int i = 0; i < N_MIX; i++) llm_engine_abort(e, one->id[i]);
    run_engine(e, one);
    CHECK(all_blocks_free(e), "aborting waiting requests frees everything");
    for (int i = 0; i < N_MIX; i++) {
        char prompt[1024];
        llm_sampling_params p = mixed_request(i, prompt);
        memset(one, 0, sizeof *one);
        run_add(e, one, prompt, NULL, 0, &p);
        run_engine(e, one);
        alone->id[i] = one->id[0];
        memcpy(alone->tokens[i][0], one->tokens[0][0], sizeof one->tokens[0][0]);
        alone->n_tokens[i][0] = one->n_tokens[0][0];
        memcpy(alone->text[i][0], one->text[0][0], sizeof one->text[0][0]);
        alone->text_len[i][0] = one->text_len[0][0]; alone->finish[i][0] = one->finish[0][0];
    }
    alone->n_requests = N_MIX;
    int stopped_early = 0;
    for (int i = 0; i < N_MIX; i++) stopped_early += alone->finish[i][0] == LLM_FINISH_STOP;
    llm_engine_destroy(e);
    free(one);

    /* together, with the default pool and budget */
    e = run_mixed(&cfg, r);
    llm_engine_stats st = llm_engine_get_stats(e);
    same_outputs(alone, r, "32 together");
    CHECK(r->bad_audits == 0 && all_blocks_free(e), "together: blocks consistent and all back");
    CHECK(st.preemptions == 0, "together, big pool: no preemption");
    llm_engine_destroy(e);

    /* a pool of 12 blocks of 16 tokens: requests are preempted and recomputed,
     * and still give the same tokens */
    cfg.num_blocks = 12;
    e = run_mixed(&cfg, r);
    st = llm_engine_get_stats(e);
    same_outputs(alone, r, "small pool");
    CHECK(st.preemptions > 0, "small pool: preemption happened (%lld)", (long long)st.preemptions);
    CHECK(r->bad_audits == 0 && all_blocks_free(e), "small pool: blocks consistent and all back");
    llm_engine_destroy(e);

    /* a token budget of 7: prompts are chunked over steps, mixed with decodes */
    cfg.num_blocks = 0; cfg.max_num_batched_tokens = 7;
    e = run_mixed(&cfg, r);
    st = llm_engine_get_stats(e);
    same_outputs(alone, r, "budget 7");
    int64_t prompt_total = 0;
    for (int i = 0; i < N_MIX; i++) {
        char pr[1024];
        mixed_request(i, pr);
        int32_t ids[512];
        prompt_total += llm_tokenize(llm_engine_model(e)->tok, pr, strlen(pr), 1, 0, ids, 512);
    }
    CHECK(st.prompt_tokens_computed == prompt_total && r->steps >= (int)(prompt_total / 7),
          "budget 7: %lld prompt tokens over %d steps",
          (long long)st.prompt_tokens_computed, r->steps);
    CHECK(r->bad_audits == 0 && all_blocks_free(e), "budget 7: blocks consistent and all back");
    llm_engine_destroy(e);

    /* max_num_seqs 3 and static batching: the same tokens again */
    cfg.max_num_batched_tokens = llm_engine_defaults().max_num_batched_tokens;
    cfg.max_num_seqs = 3; cfg.static_batching = 1;
    e = run_mixed(&cfg, r);
    same_outputs(alone, r, "static batches of 3");
    CHECK(r->bad_audits == 0 && all_blocks_free(e), "static: blocks consistent and all back");
    llm_engine_destroy(e);
    CHECK(stopped_early > 0, "some requests stopped at EOS (%d)", stopped_early);
    unlink(eos_model);
    free(alone); free(r);
}

/* -----------------------------------------------------------------------------------------------------------
 * Prefix cache and parallel sampling
 * -------------------------------------------------------------------------------------------------------- */
static void test_prefix_cache(void) {
    llm_engine *e = stories_engine();
    if (!e) return;
    run_result *r = (run_result *)calloc(2, sizeof *r);
    char prompt[2048];
    story_prompt(prompt, sizeof prompt, 3, 90);
    int32_t ids[1024];
    int P = llm_tokenize(llm_engine_model(e)->tok, prompt, strlen(prompt), 1, 0, ids, 1024);
    int64_t computed[2];
    for (int round = 0; round < 2; round++) {
        int64_t before = llm_engine_get_stats(e).prompt_tokens_computed;
        llm_sampling_params p = greedy(20);
        run_add(e, &r[round], prompt, NULL, 0, &p);
        run_engine(e, &r[round]);
        computed[round] = llm_engine_get_stats(e).prompt_tokens_computed - before;
    }
    int cached = (P - 1) / 16 * 16;
    CHECK(P > 64 && computed[0] == P && computed[1] == P - cached,
          "prefix cache: prompt of %d computed %lld then %lld tokens (expected %d)",
          P, (long long)computed[0], (long long)computed[1], P - cached);
    CHECK(r[0].n_tokens[0][0] == 20 && r[1].n_tokens[0][0] == 20 &&
          !memcmp(r[0].tokens[0][0], r[1].tokens[0][0], 20 * 4), "prefix cache: same output");
    llm_engine_stats st = llm_engine_get_stats(e);
    CHECK(st.prefix_cache_hits == cached, "prefix cache hits %lld tokens", (long long)st.prefix_cache_hits);
    CHECK(all_blocks_free(e) && st.num_cached_blocks > 0, "prefix cache: blocks free (%d cached)",
          st.num_cached_blocks);
    llm_engine_destroy(e);
    free(r);
}

/* Embeddings (llm_sampling_params.pooling) against tools/embed_oracle.py's float64 vectors of the random
 * qwen3 embedding model (testdata/reference/random-qwen3-embed-f64.json: three prompts given as ids, EOS
 * last, pooled mean, cls and last and L2-normalised), normalised here as the server does them:
 * - the pooling type is the file's (qwen3.pooling_type 3: last);
 * - all nine in one batch with a generating request of the first prompt, whose tokens come in the same
 *   steps as the vectors and are those it gives alone; on the exact path with an f32 cache the cosine is
 *   >= 0.99999 and the largest difference <= 1e-5 (measured: 1 - 1e-9, 2e-7); on the default path (16-bit
 *   activations, f16 cache) >= 0.9999 and <= 1e-3 (measured: 1 - 5e-8, 1.1e-4);
 * - mean after the prompt's blocks were cached (by a last pooling, which may take them, and a generation,
 *   which does: 32 of 41 tokens) takes nothing from the cache, and is still the vector. */
static double pool_compare(const float *got, int n, const llm_json *want, double *max_diff) {
    double norm = 0, dot = 0, wn = 0;
    for (int i = 0; i < n; i++) norm += (double)got[i] * got[i];
    norm = sqrt(norm);
    *max_diff = 0;
    if (!want || want->type != LLM_JSON_ARRAY || want->n != n || norm == 0) { *max_diff = 1e9; return 0; }
    for (int i = 0; i < n; i++) {
        double g = got[i] / norm, w = want->items[i].num;
        dot += g * w; wn += w * w;
        if (fabs(g - w) > *max_diff) *max_diff = fabs(g - w);
    }
    return dot / sqrt(wn);
}

/* Runs the engine until it has no work; each output's vector (user: the slot + 1) copied into vec, each
 * generated token into gen; returns the steps in which a vector and a generated token both came out */
static int pool_run(llm_engine *e, float (*vec)[64], int *cached, int32_t *gen, int *n_gen) {
    int both = 0;
    while (llm_engine_has_work(e)) {
        const llm_output *out;
        int k = llm_engine_step(e, &out), vecs = 0, toks = 0;
        for (int i = 0; i < k; i++) {
            int slot = (int)(intptr_t)out[i].user - 1;
            if (out[i].embedding && slot >= 0 && out[i].n_embedding <= 64) {
                memcpy(vec[slot], out[i].embedding, (size_t)out[i].n_embedding * sizeof(float));
                cached[slot] = out[i].n_cached_tokens; vecs++;
            }
            for (int t = 0; t < out[i].n_tokens && *n_gen < 64; t++) gen[(*n_gen)++] = out[i].token_ids[t];
            toks += out[i].n_tokens;
            if (slot < 0) cached[63] = out[i].n_cached_tokens; /* the generation's */
        }
        both += vecs && toks;
    }
    return both;
}

/* The oracle's reference, parsed into *ref: its text (to free after ref), or NULL (a failed CHECK) */
static char *pool_reference(llm_json *ref) {
    char err[LLM_ERR_LEN], path[1024];
    snprintf(path, sizeof path, "%s/reference/random-qwen3-embed-f64.json", testdata_dir);
    size_t len;
    char *text = read_file(path, &len);
    if (text && llm_json_parse(text, len, ref, err) == 0) return text;
    CHECK(0, "read %s", path);
    free(text);
    return NULL;
}

static void test_engine_pooling(void) {
    char err[LLM_ERR_LEN];
    llm_json ref;
    char *text = pool_reference(&ref);
    if (!text) return;
    const llm_json *prompts = llm_json_get(&ref, "prompts");
    static const char *names[4] = {"", "mean", "cls", "last"};
    int32_t alone[64], mixed[64];
    int n_alone = 0, n_mixed = 0;
    for (int run = 0; run < 3; run++) { /* the exact path, the default one, and alone (the generation) */
        llm_engine_config cfg = engine_config("random-qwen3-embed.gguf");
        if (run == 0) { cfg.create_backend = llm_cpu_exact_backend_create; cfg.kv_cache_dtype = LLM_KV_F32; }
        llm_engine *e = engine_new(&cfg);
        if (!e || !prompts || prompts->n != 3) { llm_engine_destroy(e); break; }
        int dim = llm_engine_model(e)->cfg.dim;
        CHECK(llm_engine_model(e)->cfg.pooling == LLM_POOL_LAST && dim == 32, "pooling type %d, dim %d",
              llm_engine_model(e)->cfg.pooling, dim);
        static float vec[64][64];
        int cached[64] = {0}, n_gen = 0;
        int32_t gen[64];
        memset(vec, 0, sizeof vec);
        const llm_json *ids0 = llm_json_get(&prompts->items[0], "ids");
        int32_t ids[3][64], n_ids[3];
        for (int i = 0; i < 3; i++) {
            const llm_json *v = llm_json_get(&prompts->items[i], "ids");
            n_ids[i] = v && v->n <= 64 ? v->n : 0;
            for (int k = 0; k < n_ids[i]; k++) ids[i][k] = (int32_t)v->items[k].num;
        }
        llm_sampling_params g = greedy(8);
        g.ignore_eos = 1;
        CHECK(ids0 && llm_engine_add_request(e, NULL, ids[0], n_ids[0], &g, NULL, err), "generation: %s",
              err);
        if (run == 2) {
            pool_run(e, vec, cached, alone, &n_alone);
            CHECK(n_alone == n_mixed && !memcmp(alone, mixed, sizeof(int32_t) * (size_t)n_alone),
                  "the generation beside the poolings: the tokens it gives alone");
            llm_engine_destroy(e);
            break;
        }
        for (int i = 0; i < 3; i++)
            for (int pool = LLM_POOL_MEAN; pool <= LLM_POOL_LAST; pool++) {
                llm_sampling_params p = llm_sampling_defaults();
                p.pooling = pool;
                CHECK(llm_engine_add_request(e, NULL, ids[i], n_ids[i], &p, (void *)(intptr_t)(i * 3 + pool),
                                             err), "pooling request: %s", err);
            }
        int both = pool_run(e, vec, cached, gen, &n_gen);
        CHECK(both >= 1 && n_gen == 8, "pooling beside a generation: %d steps with both, %d tokens", both,
              n_gen);
        double worst_cos = 1, worst_diff = 0, bound_cos = run == 0 ? 0.99999 : 0.9999;
        double bound_diff = run == 0 ? 1e-5 : 1e-3;
        for (int i = 0; i < 3; i++)
            for (int pool = LLM_POOL_MEAN; pool <= LLM_POOL_LAST; pool++) {
                const llm_json *want = llm_json_get(&prompts->items[i], names[pool]);
                double diff, cos = pool_compare(vec[i * 3 + pool - 1], dim, want, &diff); /* slot: user - 1 */
                CHECK(cos >= bound_cos && diff <= bound_diff, "%s prompt %d %s: cosine %.9f, max diff %.2g",
                      run == 0 ? "exact" : "default", i, names[pool], cos, diff);
                if (cos < worst_cos) worst_cos = cos;
                if (diff > worst_diff) worst_diff = diff;
            }
        printf("  pooling on the %s path: cosine >= %.9f, max |diff| %.2g\n", run == 0 ? "exact" : "default",
               worst_cos, worst_diff);
        /* the long prompt cached by a last pooling and a generation; then mean and cls of it again */
        if (run == 0) {
            llm_sampling_params p = llm_sampling_defaults();
            p.pooling = LLM_POOL_LAST;
            llm_engine_add_request(e, NULL, ids[2], n_ids[2], &p, (void *)(intptr_t)20, err);
            pool_run(e, vec, cached, gen, &n_gen);
            llm_engine_add_request(e, NULL, ids[2], n_ids[2], &g, NULL, err);
            pool_run(e, vec, cached, gen, &n_gen);
            CHECK(cached[63] == 32, "the generation took %d cached tokens of the prompt (32)", cached[63]);
            for (int pool = LLM_POOL_MEAN; pool <= LLM_POOL_CLS; pool++) {
                p.pooling = pool;
                llm_engine_add_request(e, NULL, ids[2], n_ids[2], &p, (void *)(intptr_t)(20 + pool), err);
                pool_run(e, vec, cached, gen, &n_gen);
                const llm_json *want = llm_json_get(&prompts->items[2], names[pool]);
                double diff, cos = pool_compare(vec[19 + pool], dim, want, &diff);
                CHECK(cos >= 0.99999 && diff <= 1e-5 && cached[19 + pool] == 0,
                      "%s after the prompt was cached: cosine %.9f, max diff %.2g, %d cached", names[pool],
                      cos, diff, cached[19 + pool]);
            }
            /* rank (a reranker without cls.output): the last row's dot with the output rows of rank_ids[0]
             * less rank_ids[1], here two of the prompt's tokens (the tied embedding's f32 rows) */
            p.pooling = LLM_POOL_RANK; p.rank_ids[0] = ids[2][1]; p.rank_ids[1] = ids[2][3];
            llm_engine_add_request(e, NULL, ids[2], n_ids[2], &p, (void *)(intptr_t)30, err);
            pool_run(e, vec, cached, gen, &n_gen);
            const llm_weight *emb = &llm_engine_model(e)->tok_embd;
            const float *yes = (const float *)emb->data + (size_t)p.rank_ids[0] * (size_t)dim;
            const float *no = (const float *)emb->data + (size_t)p.rank_ids[1] * (size_t)dim;
            double logit = 0;
            const float *last = vec[2 * 3 + LLM_POOL_LAST - 1];
            for (int k = 0; k < dim; k++) logit += (double)last[k] * (yes[k] - no[k]);
            CHECK(emb->type == LLM_F32 && fabs(vec[29][0] - logit) <= 1e-5 * (1 + fabs(logit)),
                  "rank: logit %.9g, the last row's dot %.9g", vec[29][0], logit);
            p.rank_ids[1] = llm_engine_model(e)->cfg.vocab_size;
            CHECK(!llm_engine_add_request(e, NULL, ids[2], n_ids[2], &p, NULL, err) &&
                  strstr(err, "rank_ids in [0, 151669)"), "rank_ids past the vocabulary: %s", err);
            CHECK(all_blocks_free(e), "pooling: every block back");
        }
        if (run == 1) { memcpy(mixed, gen, sizeof gen); n_mixed = n_gen; }
        llm_engine_destroy(e);
    }
    llm_json_free(&ref);
    free(text);
}

/* The priority policy (vLLM's --scheduling-policy priority): requests wait in order of (priority, arrival);
 * when blocks run out the lowest priority's latest running sequence is preempted, even one the step has
 * planned already (its copy-on-write copies dropped with it).
 * - One sequence at a time: four requests of priorities 3 1 2 1 finish in the order 2nd 4th 3rd 1st (first
 *   come first served: as they came).
 * - Two that cannot both grow in the pool: the first, of priority 5 and running before the second comes,
 *   gives way to the second, of priority 0, which finishes first (first come first served: the second is
 *   preempted and finishes last).
 * - A sequence taken out of a step's plan gives back its tokens to the budget, and the copies into its blocks
 *   go (the others stay).
 * - 16 requests of n = 1 to 3, priorities -1 to 2, coming one every other step, in pools of 9, 12 and 20
 *   blocks: preempted and recomputed, every sample the tokens of its request alone, the blocks consistent
 *   after every step and all back.
 * - A priority under first come first served, or a policy that is neither, is refused. */
static int finish_order(llm_engine *e, const uint64_t *ids, int n, int *order) {
    int done = 0;
    while (llm_engine_has_work(e)) {
        const llm_output *out;
        int k = llm_engine_step(e, &out);
        for (int i = 0; i < k; i++)
            for (int j = 0; j < n; j++)
                if (out[i].request_id == ids[j] && out[i].finish_reason && done < n) order[done++] = j;
    }
    return done;
}

static void test_priority_scheduling(void) {
    llm_engine_config cfg = engine_config("stories260K.gguf");
    for (int policy = 0; policy < 2; policy++) { /* one at a time, four priorities */
        cfg.scheduling_policy = policy ? LLM_SCHED_PRIORITY : LLM_SCHED_FCFS; cfg.max_num_seqs = 1;
        llm_engine *e = engine_new(&cfg);
        if (!e) return;
        static const int prio[4] = {3, 1, 2, 1};
        uint64_t ids[4];
        int order[4] = {-1, -1, -1, -1};
        for (int i = 0; i < 4; i++) {
            llm_sampling_params p = greedy(3);
            p.priority = policy ? prio[i] : 0;
            ids[i] = llm_engine_add_request(e, "Once upon a time", NULL, 0, &p, NULL, NULL);
        }
        int n = finish_order(e, ids, 4, order);
        CHECK(n == 4 && (policy ? order[0] == 1 && order[1] == 3 && order[2] == 2 && order[3] == 0
                                : order[0] == 0 && order[1] == 1 && order[2] == 2 && order[3] == 3),
              "priority policy %d: one at a time, finished in the order %d %d %d %d", policy, order[0],
              order[1], order[2], order[3]);
        llm_engine_destroy(e);
    }
    for (int policy = 0; policy < 2; policy++) { /* two that do not fit: who gives way */
        cfg.scheduling_policy = policy ? LLM_SCHED_PRIORITY : LLM_SCHED_FCFS; cfg.max_num_seqs = 2;
        cfg.num_blocks = 6; cfg.block_size = 16; cfg.enable_prefix_caching = 0;
        llm_engine *e = engine_new(&cfg);
        if (!e) return;
        uint64_t ids[2];
        int order[2] = {-1, -1};
        for (int i = 0; i < 2; i++) { /* the first runs a step before the second comes */
            llm_sampling_params p = greedy(60);
            p.ignore_eos = 1; p.priority = policy ? (i ? 0 : 5) : 0;
            const char *prompt = i ? "Lily had a big red ball" : "Once upon a time";
            ids[i] = llm_engine_add_request(e, prompt, NULL, 0, &p, NULL, NULL);
            const llm_output *out;
            if (!i) llm_engine_step(e, &out);
        }
        int n = finish_order(e, ids, 2, order);
        llm_engine_stats st = llm_engine_get_stats(e);
        CHECK(n == 2 && st.preemptions > 0 && order[0] == (policy ? 1 : 0),
              "priority policy %d: two in a pool of 6: request %d finished first (%lld preemptions)", policy,
              order[0], (long long)st.preemptions);
        CHECK(all_blocks_free(e), "priority policy %d, two in a small pool: every block back", policy);
        llm_engine_destroy(e);
    }
    /* many: each sample as its request alone */
    enum { NP = 16 };
    run_result *alone = (run_result *)calloc(1, sizeof *alone), *r = (run_result *)calloc(1, sizeof *r);
    cfg = engine_config("stories260K.gguf");
    llm_engine *e = engine_new(&cfg);
    char prompts[NP][512];
    for (int i = 0; i < NP; i++) {
        story_prompt(prompts[i], sizeof prompts[i], i, 2 + (i * 11) % 30);
        llm_sampling_params p = greedy(8 + (i * 13) % 40);
        p.ignore_eos = 1;
        run_add(e, alone, prompts[i], NULL, 0, &p);
        run_engine(e, alone);
    }
    llm_engine_destroy(e);
    static const int pools[3] = {9, 12, 20};
    for (int pi = 0; pi < 3; pi++) {
        cfg.scheduling_policy = LLM_SCHED_PRIORITY; cfg.num_blocks = pools[pi]; cfg.block_size = 16;
        e = engine_new(&cfg);
        memset(r, 0, sizeof *r);
        for (int i = 0; i < NP; i++) { /* one every other step: running in an order other than priority's */
            llm_sampling_params p = greedy(8 + (i * 13) % 40);
            p.ignore_eos = 1; p.n = 1 + i % 3; p.priority = (i * 5) % 4 - 1;
            run_add(e, r, prompts[i], NULL, 0, &p);
            run_steps(e, r, 2);
        }
        run_engine(e, r);
        llm_engine_stats st = llm_engine_get_stats(e);
        int bad = 0, samples = 0;
        for (int i = 0; i < NP; i++)
            for (int k = 0; k < 1 + i % 3; k++, samples++)
                bad += r->n_tokens[i][k] != alone->n_tokens[i][0] ||
                       memcmp(r->tokens[i][k], alone->tokens[i][0], (size_t)alone->n_tokens[i][0] * 4) != 0;
        CHECK(bad == 0 && st.preemptions > 0 && r->bad_audits == 0 && all_blocks_free(e),
              "priority policy, pool of %d: %d of %d samples differ from their request alone, %lld "
              "preemptions, %d bad audits, blocks back %d", pools[pi], bad, samples,
              (long long)st.preemptions, r->bad_audits, all_blocks_free(e));
        llm_engine_destroy(e);
    }
    free(alone); free(r);
    /* out of the plan */
    {
        llm_scheduler sch;
        llm_block_manager bm;
        memset(&sch, 0, sizeof sch);
        memset(&bm, 0, sizeof bm);
        llm_seq s, x, y;
        memset(&s, 0, sizeof s); memset(&x, 0, sizeof x); memset(&y, 0, sizeof y);
        int32_t *table = NULL;
        arrput(table, 3); arrput(table, 4);
        s.block_tables = &table; s.n_kv_groups = 1;
        sch.n_kv_groups = 1; sch.bm = &bm;
        llm_seq *plan[3] = {&x, &s, &y};
        for (int i = 0; i < 3; i++) { arrput(sch.scheduled, plan[i]); arrput(sch.n_new, i + 1); }
        arrput(sch.copy_src, 5); arrput(sch.copy_dst, 4);  /* into s's block 4 */
        arrput(sch.copy_src, 6); arrput(sch.copy_dst, 7);  /* into another's */
        arrput(sch.copy_src, 8); arrput(sch.copy_dst, 3);  /* into s's block 3 */
        int budget = 10;
        llm_sched_unplan(&sch, &s, &budget);
        CHECK(budget == 12 && arrlen(sch.scheduled) == 2 && sch.scheduled[0] == &x &&
              sch.scheduled[1] == &y && sch.n_new[0] == 1 && sch.n_new[1] == 3 && arrlen(sch.copy_dst) == 1 &&
              sch.copy_src[0] == 6 && sch.copy_dst[0] == 7, "out of the plan: budget %d, %d planned, %d "
              "copies left", budget, (int)arrlen(sch.scheduled), (int)arrlen(sch.copy_dst));
        arrfree(table); arrfree(sch.scheduled); arrfree(sch.n_new);
        arrfree(sch.copy_src); arrfree(sch.copy_dst);
    }
    /* refused */
    cfg = engine_config("stories260K.gguf");
    e = engine_new(&cfg);
    char err[LLM_ERR_LEN] = "";
    llm_sampling_params p = greedy(2);
    p.priority = 1;
    CHECK(e && llm_engine_add_request(e, "Once", NULL, 0, &p, NULL, err) == 0 && strstr(err, "priority"),
          "a priority under first come first served is refused: %s", err);
    llm_engine_destroy(e);
    cfg.scheduling_policy = 7;
    err[0] = 0;
    e = llm_engine_create(&cfg, err);
    CHECK(!e && strstr(err, "scheduling_policy"), "scheduling_policy 7 is refused: %s", err);
    llm_engine_destroy(e);
}

/* Sliding windows in the KV pool (vLLM's hybrid KV cache): a local group of layers gives back the blocks that
 * slid out of its window. random-gemma3 has 6 groups of one layer: 1 global, 5 local with a window of 8; here
 * blocks of 4 and chunks of at most 16 tokens.
 * - After every step of a sequence of 100 tokens, the pool's used blocks are exactly the global group's
 *   ceil(n / 4) and, in each local group, those from the block the step's first query read on. It runs in a
 *   pool of 68 blocks (the next turn's 130 tokens need 33 + 5 x 7, as add_request works it out), where
 *   keeping every layer's blocks would take 6 x 25 = 150; its local blocks are reused on the way (evicted
 *   from the prefix cache).
 * - The same conversation, one turn on (its 100 tokens and 10 more), takes 96 tokens from the prefix cache:
 *   the global group's 24 blocks and the last two of each local group, whose early blocks are gone.
 * - Two such sequences in a pool of 70 preempt each other.
 * Each gives the tokens that the same prompt gives alone in a pool of 2000 without prefix caching, and every
 * block comes back. */
static void sliding_window_alone(const int32_t *ids, int n, int max_tokens, int32_t *out) {
    llm_engine_config cfg = engine_config("random-gemma3.gguf");
    cfg.block_size = 4; cfg.max_num_batched_tokens = 16; cfg.num_blocks = 2000; cfg.enable_prefix_caching = 0;
    llm_engine *e = engine_new(&cfg);
    run_result *r = (run_result *)calloc(1, sizeof *r);
    llm_sampling_params p = greedy(max_tokens);
    p.ignore_eos = 1;
    if (e && r && run_add(e, r, NULL, ids, n, &p) >= 0) run_engine(e, r);
    if (r) memcpy(out, r->tokens[0][0], (size_t)max_tokens * sizeof(int32_t));
    llm_engine_destroy(e); free(r);
}

static void test_sliding_window_blocks(void) {
    enum { P = 40, GEN = 60, N = P + GEN, P2 = N + 10, GEN2 = 20, BS = 4 };
    int32_t ids[P2], want[GEN], want2[GEN2], want_pre[2][GEN];
    uint64_t rng = 5;
    for (int i = 0; i < P; i++) ids[i] = 10 + (int32_t)(llm_splitmix64(&rng) % 31000);
    sliding_window_alone(ids, P, GEN, want);
    memcpy(ids + P, want, sizeof want);
    for (int i = N; i < P2; i++) ids[i] = 10 + (int32_t)(llm_splitmix64(&rng) % 31000);
    sliding_window_alone(ids, P2, GEN2, want2);

    llm_engine_config cfg = engine_config("random-gemma3.gguf");
    cfg.block_size = BS; cfg.max_num_batched_tokens = 16; cfg.num_blocks = 68;
    llm_engine *e = engine_new(&cfg);
    run_result *r = (run_result *)calloc(3, sizeof *r);
    if (!e || !r) { llm_engine_destroy(e); free(r); return; }
    char err[LLM_ERR_LEN] = "";
    llm_sampling_params p = greedy(GEN);
    p.ignore_eos = 1;
    run_add(e, &r[0], NULL, ids, P, &p);
    int exact = 1, steps = 0, before = 0, most = 0;
    while (llm_engine_has_work(e) && steps++ < 1000) {
        const llm_output *out;
        int n_out = llm_engine_step(e, &out);
        for (int i = 0; i < n_out; i++)
            for (int t = 0; t < out[i].n_tokens && r[0].n_tokens[0][0] < GEN; t++)
                r[0].tokens[0][0][r[0].n_tokens[0][0]++] = out[i].token_ids[t];
        if (arrlen(e->sched.running) != 1) continue; /* finished: checked below */
        int computed = e->sched.running[0]->n_computed, blocks = (computed + BS - 1) / BS;
        int expect = blocks + 5 * (blocks - llm_window_first_block(8, before, BS));
        llm_engine_stats st = llm_engine_get_stats(e);
        int used = st.num_blocks - st.num_free_blocks;
        if (used != expect && exact)
            printf("    at %d tokens: %d blocks used, expected %d\n", computed, used, expect);
        exact &= used == expect;
        if (used > most) most = used;
        before = computed;
        exact &= llm_engine_check_blocks(e, err) == 0;
    }
    llm_engine_stats st = llm_engine_get_stats(e);
    CHECK(exact && before == N - 2,
          "sliding window: used blocks after every step as the windows say (%d tokens): %s", before, err);
    CHECK(r[0].n_tokens[0][0] == GEN && !memcmp(r[0].tokens[0][0], want, sizeof want) && e->bm.evictions > 0,
          "sliding window: %d tokens in a pool of 68 (at most %d used, %lld evictions), the tokens of a pool "
          "of 2000",
          r[0].n_tokens[0][0], most, (long long)e->bm.evictions);
    int64_t hits = st.prefix_cache_hits;
    llm_sampling_params p2 = greedy(GEN2);
    p2.ignore_eos = 1;
    run_add(e, &r[1], NULL, ids, P2, &p2);
    run_engine(e, &r[1]);
    st = llm_engine_get_stats(e);
    CHECK(st.prefix_cache_hits - hits == 96 && r[1].n_tokens[0][0] == GEN2 &&
          !memcmp(r[1].tokens[0][0], want2, sizeof want2),
          "sliding window: the next turn takes %lld tokens from the prefix cache (96), the same tokens",
          (long long)(st.prefix_cache_hits - hits));
    CHECK(all_blocks_free(e), "sliding window: every block back");
    llm_engine_destroy(e);

    /* two sequences that do not fit together: preempted and recomputed */
    int32_t ids2[2][P];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < P; i++) ids2[k][i] = 10 + (int32_t)(llm_splitmix64(&rng) % 31000);
        sliding_window_alone(ids2[k], P, GEN, want_pre[k]);
    }
    cfg.num_blocks = 70;
    e = engine_new(&cfg);
    if (!e) { free(r); return; }
    for (int k = 0; k < 2; k++) run_add(e, &r[2], NULL, ids2[k], P, &p);
    run_engine(e, &r[2]);
    st = llm_engine_get_stats(e);
    CHECK(st.preemptions > 0 && r[2].n_tokens[0][0] == GEN && r[2].n_tokens[1][0] == GEN &&
          !memcmp(r[2].tokens[0][0], want_pre[0], sizeof want) &&
          !memcmp(r[2].tokens[1][0], want_pre[1], sizeof want),
          "sliding window: two sequences preempting each other (%lld preemptions), each its tokens alone",
          (long long)st.preemptions);
    CHECK(all_blocks_free(e), "sliding window, preemption: every block back");
    llm_engine_destroy(e);
    free(r);
}

/* Speculative decoding by n-gram lookup: greedy output with it equals greedy output without, token for token,
 * on models whose text repeats its prompt (the prompt holds a passage twice: the proposals come from it):
 * stories260K alone, several requests batched, in a pool so small that they are preempted, a prompt taken
 * from the prefix cache, n = 2, under a grammar, with a stop string; the random models whose output repeats
 * (random-qwen3, -llama3, -qwen2, the mixture of experts -qwen2moe; the others' random text never does);
 * SmolLM2 on the default
 * path, asked to repeat a text, alone and with a stop string that lands inside an accepted run. Fewer steps
 * each time; every block comes back; the metrics add up: the accepted tokens are those counted at each
 * position, at most those proposed.
 * With a draft model the same, and more: stories260K drafting for itself has every proposed token kept
 * (alone, batched, preempted, from the prefix cache, n = 2): the draft's K/V, in the model's blocks, are
 * right after every one of those; a request with a repetition penalty (which the draft does not see) has some
 * refused; a random draft (random-phi3 for random-llama2) has nearly all refused, and the output is still the
 * same; the model with 64 tokens more, one of them now and then its greedy pick, proposes fewer tokens than
 * the model itself (each proposal ends before such a token, and the blocks past it go back), every one kept;
 * SmolLM2 drafting for itself on the default path. A draft of another vocabulary, with windows, or with no
 * tokens to propose is refused.
 * Sampled (stories260K, temperature 1): each seed gives the same tokens with speculation (n-gram lookup, a
 * draft model) as without, and over other seeds the tokens' frequencies pass a chi-square test of one
 * distribution. And step by step, each proposal's length follows how the last ones fared (the adaptive length
 * and the waits). */
static int spec_kv_dtype; /* the KV cache's type in spec_engine's engines: auto unless spec_cases sets it */
static llm_engine *spec_engine(const char *model, int spec, int num_blocks, const char *draft) {
    llm_engine_config cfg = engine_config(model);
    cfg.spec_tokens = spec; cfg.num_blocks = num_blocks; cfg.kv_cache_dtype = spec_kv_dtype;
    if (draft) cfg.spec_model_path = model_path(draft);
    return engine_new(&cfg);
}

/* Runs the prompts (each with p, prompt k's stop string stops[k] if any) on model, with spec tokens, and
 * returns the results; *st the engine's stats at the end. */
static void spec_run(run_result *r, const char *model, int spec, int num_blocks, const char *const *prompts,
                     int n_prompts, const llm_sampling_params *p, llm_engine_stats *st, int twice,
                     const char *draft) {
    llm_engine *e = spec_engine(model, spec, num_blocks, draft);
    if (!e) return;
    for (int round = 0; round <= twice; round++) {
        for (int k = 0; k < n_prompts; k++) run_add(e, r, prompts[k], NULL, 0, p);
        run_engine(e, r);
    }
    *st = llm_engine_get_stats(e);
    CHECK(all_blocks_free(e), "speculative decoding on %s: every block back", model);
    llm_engine_destroy(e);
}

/* Seeds 0..n-1, a batch at a time, each request sampled at temperature 1 for len tokens, into out[n][len]
 * (the sampled checks of test_speculative) */
static void spec_sample_seeds(llm_engine *e, run_result *r, const char *prompt, int n, int len, int batch,
                              int32_t *out) {
    for (int b0 = 0; e && b0 < n; b0 += batch) {
        memset(r, 0, sizeof *r);
        for (int i = b0; i < b0 + batch; i++) {
            llm_sampling_params p = llm_sampling_defaults();
            p.temperature = 1; p.top_k = 0; p.top_p = 1; p.min_p = 0; p.max_tokens = len; p.seed = i;
            run_add(e, r, prompt, NULL, 0, &p);
        }
        run_engine(e, r);
        for (int i = 0; i < batch; i++)
            memcpy(out + (size_t)(b0 + i) * len, r->tokens[i][0], (size_t)len * sizeof(int32_t));
    }
}

static int spec_same(const run_result *a, const run_result *b, int n_samples) {
    int same = a->n_requests == b->n_requests;
    for (int i = 0; same && i < a->n_requests; i++)
        for (int k = 0; k < n_samples; k++)
            same &= a->n_tokens[i][k] > 0 && a->n_tokens[i][k] == b->n_tokens[i][k] &&
                    !memcmp(a->tokens[i][k], b->tokens[i][k], (size_t)a->n_tokens[i][k] * 4) &&
                    a->text_len[i][k] == b->text_len[i][k] && a->finish[i][k] == b->finish[i][k] &&
                    !memcmp(a->text[i][k], b->text[i][k],
                            (size_t)(a->text_len[i][k] < 4096 ? a->text_len[i][k] : 0));
    return same;
}

enum { DRAFT_NONE, DRAFT_SELF, DRAFT_ANY, DRAFT_PENALIZED, DRAFT_MISSES, DRAFT_CUT };

/* The n-gram proposer by itself: the longest of the last 4..2 tokens found earlier (the latest place)
 * proposes what followed it, at most max; a match that runs up to the end repeats with its period */
static void test_spec_propose(void) {
    llm_scheduler sch;
    memset(&sch, 0, sizeof sch);
    sch.spec_ngram_max = 4, sch.spec_ngram_min = 2;
    static const struct {
        const char *what;
        int tokens[16], n_tokens, max, want[8], n_want;
    } cases[] = {
        {"a passage seen before", {1, 2, 3, 4, 5, 6, 7, 9, 9, 1, 2, 3}, 12, 3, {4, 5, 6}, 3},
        {"what follows runs out", {1, 2, 3, 4, 5, 1, 2, 3}, 8, 8, {4, 5, 1, 2, 3, 4, 5, 1}, 8},
        {"the longest match wins over the latest", {7, 8, 9, 5, 2, 8, 9, 6, 7, 8, 9}, 11, 2, {5, 2}, 2},
        {"a loop of two tokens", {3, 1, 2, 1, 2, 1, 2}, 7, 5, {1, 2, 1, 2, 1}, 5},
        {"one token repeated", {5, 6, 6, 6}, 4, 4, {6, 6, 6, 6}, 4},
        {"no match of 2", {1, 2, 3, 4, 5, 6, 1}, 7, 4, {0}, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        llm_seq s;
        memset(&s, 0, sizeof s);
        for (int i = 0; i < cases[c].n_tokens; i++) arrput(s.tokens, cases[c].tokens[i]);
        int n = llm_seq_propose(&sch, &s, cases[c].max);
        CHECK(n == cases[c].n_want && !memcmp(s.draft, cases[c].want, (size_t)n * sizeof(int32_t)),
              "n-gram proposer, %s: %d tokens proposed (%d %d %d ...), not %d", cases[c].what, n, s.draft[0],
              s.draft[1], s.draft[2], cases[c].n_want);
        arrfree(s.tokens);
    }
}

/* Three prompts that repeat a passage of a story, where n-gram lookup finds its proposals: the story from its
 * 1st, 11th and 21st character, twice, then its first 40, 49 and 58 characters */
static void spec_story_prompts(char repeated[3][1024]) {
    static const char *const story =
        "Once upon a time there was a little girl named Lily. She loved to play in the park with her big red "
        "ball. One day she saw a dog. The dog was sad because it was lost. "
        "Lily helped the dog find its home.";
    for (int k = 0; k < 3; k++)
        snprintf(repeated[k], 1024, "%s %s %.*s", story + k * 10, story + k * 10, 40 + k * 9, story);
}

/* test_speculative's cases, each with speculation and without, the KV cache in kv_dtype; a quantized cache
 * (q8_0, q4_0) runs the cases that preempt, hit the prefix cache or keep a draft's K/V beside the model's
 * (stories260K's heads of 8 values each padded to a block), and q8_0 SmolLM2's (heads of 64: two blocks):
 * the same tokens with and without speculation, every draft token of the model itself accepted, as with
 * f16. SmolLM2 with q4_0 is left out: its output with speculation differed from without (8 proposals) and
 * its own draft had 3 of 45 tokens refused, not yet explained (a K/V value that differs in its last bit
 * between a step of one token and one of six moves a 4-bit code a whole step) */
static void spec_cases(int kv_dtype) {
    char repeated[3][1024];
    spec_story_prompts(repeated);
    const char *prompts[3] = {repeated[0], repeated[1], repeated[2]};
    static const char *const repeat_prompts[1] = {
        "<|im_start|>user\nRepeat this text exactly, word for word: The committee met on Tuesday to review "
        "the budget for the new library. After a long discussion, the members agreed to fund the children's "
        "reading room, the computer lab, and a small garden behind the building. The work will begin in "
        "March.<|im_end|>\n"
        "<|im_start|>assistant\n"};
    run_result *r = (run_result *)calloc(3, sizeof *r);
    if (!r) return;
#define SMOLLM2 "../../models/SmolLM2-135M-Instruct.Q4_1.gguf"
    struct {
        const char *what, *model;
        int n_prompts, num_blocks, n, twice;
        const char *stop, *grammar;
        int skip_under_asan; /* a random model with no path of its own (the others' are QK norm, experts) */
        int draft_kind;      /* a draft model (0: n-gram lookup): the model itself, every token it proposes
                              * kept (DRAFT_SELF) or not always (DRAFT_ANY), or one whose tokens the model
                              * refuses now and then (DRAFT_PENALIZED: the request has a repetition penalty,
                              * the draft not), or nearly always (DRAFT_MISSES: a random model), or the model
                              * with more tokens, whose proposals end before a token the model does not have
                              * (DRAFT_CUT: every token proposed kept, fewer than the model
                              * itself proposes) */
        const char *draft;   /* that model (NULL: the model itself) */
    } cases[] = {
        {"alone", "stories260K.gguf", 1, 0, 1, 0, NULL, NULL},
        {"batched", "stories260K.gguf", 3, 0, 1, 0, NULL, NULL},
        {"preempted", "stories260K.gguf", 3, 40, 1, 0, NULL, NULL},
        {"prefix cached", "stories260K.gguf", 1, 0, 1, 1, NULL, NULL},
        {"n = 2", "stories260K.gguf", 2, 0, 2, 0, NULL, NULL},
        {"a stop string", "stories260K.gguf", 1, 0, 1, 0, "mommy told", NULL},
        {"a grammar", "stories260K.gguf", 2, 0, 1, 0, NULL, "root ::= [A-Za-z .,]+"},
        {"random-qwen3", "random-qwen3-qknorm.gguf", 2, 0, 1, 0, NULL, NULL},
        {"random-llama3", "random-llama3-gqa.gguf", 2, 0, 1, 0, NULL, NULL, 1},
        {"random-qwen2", "random-qwen2-bias.gguf", 2, 0, 1, 0, NULL, NULL, 1},
        {"random-qwen2moe", "random-qwen2moe.gguf", 2, 0, 1, 0, NULL, NULL},
        {"SmolLM2", SMOLLM2, 1, 0, 1, 0, NULL, NULL},
        {"SmolLM2, a stop string", SMOLLM2, 1, 0, 1, 0, "the computer", NULL},
        {"draft model (itself), alone", "stories260K.gguf", 1, 0, 1, 0, NULL, NULL, 0, DRAFT_SELF},
        {"draft model (itself), batched", "stories260K.gguf", 3, 0, 1, 0, NULL, NULL, 0, DRAFT_SELF},
        {"draft model (itself), preempted", "stories260K.gguf", 3, 40, 1, 0, NULL, NULL, 0, DRAFT_SELF},
        {"draft model (itself), prefix cached", "stories260K.gguf", 1, 0, 1, 1, NULL, NULL, 0, DRAFT_SELF},
        {"draft model (itself), n = 2", "stories260K.gguf", 2, 0, 2, 0, NULL, NULL, 0, DRAFT_SELF},
        {"draft model, a stop string", "stories260K.gguf", 1, 0, 1, 0, "mommy told", NULL, 0, DRAFT_ANY},
        {"draft model, a grammar", "stories260K.gguf", 2, 0, 1, 0, NULL, "root ::= [A-Za-z .,]+", 0,
         DRAFT_ANY},
        {"draft model, a repetition penalty", "stories260K.gguf", 3, 40, 1, 0, NULL, NULL, 0,
         DRAFT_PENALIZED},
        {"draft model that misses", "stories260K.gguf", 2, 0, 1, 0, NULL, NULL, 0, DRAFT_MISSES,
         "random-quant-q4_k_m.gguf"},
        {"draft model of another architecture (random-phi3)", "random-llama2-untied.gguf", 2, 0, 1, 0,
         NULL, NULL, 1, DRAFT_MISSES, "random-phi3.gguf"},
        {"draft model of 64 more tokens (random-llama2-wider)", "random-llama2-untied.gguf", 2, 0, 1, 0, NULL,
         NULL, 1, DRAFT_CUT, "random-llama2-wider.gguf"},
        {"draft model, SmolLM2 (itself)", SMOLLM2, 1, 0, 1, 0, NULL, NULL, 0, DRAFT_ANY},
    };
    spec_kv_dtype = kv_dtype;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (UNDER_ASAN && cases[c].skip_under_asan) continue;
        int smollm2 = !strcmp(cases[c].what, "SmolLM2") ||
                      !strcmp(cases[c].what, "draft model, SmolLM2 (itself)");
        if (kv_dtype != LLM_KV_AUTO && !strstr(cases[c].what, "preempted") &&
            !strstr(cases[c].what, "prefix cached") && !(smollm2 && kv_dtype == LLM_KV_Q8_0))
            continue;
        int kind = cases[c].draft_kind;
        const char *draft = cases[c].draft ? cases[c].draft : kind ? cases[c].model : NULL;
        llm_sampling_params p = greedy(120);
        if (kind == DRAFT_PENALIZED) p.repetition_penalty = 1.3f;
        p.n = cases[c].n;
        const char *stops[1] = {cases[c].stop};
        if (cases[c].stop) { p.stop = stops; p.n_stop = 1; }
        p.grammar = cases[c].grammar;
        const char *const *texts = strstr(cases[c].model, "SmolLM2") ? repeat_prompts : prompts;
        llm_engine_stats st[3];
        memset(r, 0, 3 * sizeof *r);
        for (int spec = 0; spec < 2; spec++)
            spec_run(&r[spec], cases[c].model, spec ? 5 : 0, cases[c].num_blocks, texts, cases[c].n_prompts,
                     &p, &st[spec], cases[c].twice, spec ? draft : NULL);
        int cut_ok = 1;
        if (kind == DRAFT_CUT) { /* the model drafting for itself: the same output, longer proposals */
            spec_run(&r[2], cases[c].model, 5, cases[c].num_blocks, texts, cases[c].n_prompts, &p, &st[2],
                     cases[c].twice, cases[c].model);
            printf("  speculative decoding, %s: %lld tokens proposed in %lld steps; by the model itself %lld "
                   "in %lld\n", cases[c].what, (long long)st[1].spec_draft_tokens, (long long)st[1].steps,
                   (long long)st[2].spec_draft_tokens, (long long)st[2].steps);
            cut_ok = spec_same(&r[0], &r[2], cases[c].n) &&
                st[1].spec_draft_tokens < st[2].spec_draft_tokens &&
                     st[1].steps > st[2].steps;
        }
        int64_t at = 0;
        for (int j = 0; j < LLM_SPEC_MAX; j++) at += st[1].spec_accepted_at[j];
        printf("  speculative decoding, %s: %lld of %lld proposed tokens accepted, %lld steps instead of "
               "%lld\n", cases[c].what, (long long)st[1].spec_accepted_tokens,
               (long long)st[1].spec_draft_tokens, (long long)st[1].steps, (long long)st[0].steps);
        int64_t accepted = st[1].spec_accepted_tokens, proposed = st[1].spec_draft_tokens;
        int gains = kind == DRAFT_MISSES ? st[1].spec_drafts > 0 : accepted > 0 && st[1].steps < st[0].steps;
        int draft_ok = kind == DRAFT_SELF || kind == DRAFT_CUT ? accepted == proposed && cut_ok
                     : kind == DRAFT_PENALIZED ? accepted < proposed : 1;
        CHECK(spec_same(&r[0], &r[1], cases[c].n) && gains && draft_ok && st[0].spec_drafts == 0 &&
              at == accepted && accepted <= proposed && (!cases[c].num_blocks || st[1].preemptions > 0) &&
              (!cases[c].twice || st[1].prefix_cache_hits > 0) &&
              (!cases[c].stop || r[1].finish[0][0] == LLM_FINISH_STOP),
              "speculative decoding, %s%s: the same output as without (%lld proposals, %lld of %lld tokens "
              "accepted; %lld steps, not %lld; %lld preemptions)", cases[c].what,
              kv_dtype == LLM_KV_Q8_0 ? " (q8_0 KV cache)" :
              kv_dtype == LLM_KV_Q4_0 ? " (q4_0 KV cache)" : "",
              (long long)st[1].spec_drafts, (long long)st[1].spec_accepted_tokens,
              (long long)st[1].spec_draft_tokens, (long long)st[1].steps, (long long)st[0].steps,
              (long long)st[1].preemptions);
    }
    spec_kv_dtype = LLM_KV_AUTO;
    free(r);
}

static void test_speculative(void) {
    spec_cases(LLM_KV_AUTO);
    char repeated[3][1024];
    spec_story_prompts(repeated);
    const char *prompts[3] = {repeated[0], repeated[1], repeated[2]};
    run_result *r;

    /* sampled: temperature 1, 6 tokens each. Each row is sampled in turn with the sequence's generator, as
     * without speculation, so on this batch-invariant model a seed gives the same tokens with speculation as
     * without (seeds 0..299, both ways). Over other seeds (300..599 with speculation) the sixth token's
     * frequencies pass a chi-square test of one distribution against those without (two samples of 300
     * draws; bins of at least 5 in all, the rest pooled; the bound is chi-square's 0.999 quantile,
     * Wilson-Hilferty). */
    enum { SEEDS = 300, LEN = 6, BATCH = 60 };
    int32_t (*seqs)[2 * SEEDS][LEN] = (int32_t (*)[2 * SEEDS][LEN])calloc(2, sizeof *seqs);
    r = (run_result *)calloc(1, sizeof *r);
    llm_engine_stats st = {0};
    for (int spec = 0; seqs && r && spec < 2; spec++) {
        llm_engine *e = spec_engine("stories260K.gguf", spec ? 5 : 0, 0, NULL);
        spec_sample_seeds(e, r, prompts[0], spec ? 2 * SEEDS : SEEDS, LEN, BATCH, seqs[spec][0]);
        if (e && spec) st = llm_engine_get_stats(e);
        llm_engine_destroy(e);
    }
    int same = 0, count[2][512] = {{0}};
    for (int i = 0; seqs && i < SEEDS; i++) {
        same += !memcmp(seqs[0][i], seqs[1][i], sizeof seqs[0][i]);
        count[0][seqs[0][i][LEN - 1] & 511]++;
        count[1][seqs[1][SEEDS + i][LEN - 1] & 511]++;
    }
    double chi2 = 0, pooled[2] = {0, 0};
    int df = -1;
    for (int v = 0; v <= 512; v++) {
        double a = v < 512 ? count[0][v] : pooled[0], b2 = v < 512 ? count[1][v] : pooled[1];
        if (v < 512 && a + b2 < 5) { pooled[0] += a; pooled[1] += b2; continue; }
        if (a + b2 == 0) continue;
        chi2 += (a - b2) * (a - b2) / (a + b2); /* two samples of equal size */
        df++;
    }
    double z = 3.09, h = 2.0 / (9.0 * (df > 0 ? df : 1));
    double bound = (df > 0 ? df : 1) * pow(1 - h + z * sqrt(h), 3);
    printf("  speculative decoding, sampled: %d of %d seeds the same tokens; over other seeds, chi-square "
           "%.2f on %d degrees of freedom (bound %.2f); %lld of %lld proposed tokens accepted\n", same, SEEDS,
           chi2, df, bound, (long long)st.spec_accepted_tokens, (long long)st.spec_draft_tokens);
    CHECK(seqs && same == SEEDS && df >= 5 && chi2 <= bound && st.spec_accepted_tokens > 0,
          "speculative decoding, sampled: %d of %d seeds the same tokens, chi-square %.2f on %d (bound %.2f)",
          same, SEEDS, chi2, df, bound);
    /* the same seeds with a draft model (stories260K drafting for itself: greedy proposals, which sampling at
     * temperature 1 keeps now and then) */
    llm_engine *draft_e = spec_engine("stories260K.gguf", 5, 0, "stories260K.gguf");
    int same_draft = 0;
    if (seqs && r) /* over the last */
        spec_sample_seeds(draft_e, r, prompts[0], SEEDS, LEN, BATCH, seqs[1][0]);
    for (int i = 0; seqs && r && draft_e && i < SEEDS; i++)
        same_draft += !memcmp(seqs[0][i], seqs[1][i], sizeof seqs[0][i]);
    st = draft_e ? llm_engine_get_stats(draft_e) : st;
    CHECK(draft_e && same_draft == SEEDS && st.spec_accepted_tokens > 0 &&
          st.spec_accepted_tokens < st.spec_draft_tokens && all_blocks_free(draft_e),
          "speculative decoding with a draft model, sampled: %d of %d seeds the same tokens (%lld of %lld "
          "proposed tokens accepted)", same_draft, SEEDS, (long long)st.spec_accepted_tokens,
          (long long)st.spec_draft_tokens);
    llm_engine_destroy(draft_e);

    /* a draft model that cannot serve is refused, with the reason */
    static const struct { const char *model, *draft; int spec; const char *why; } refused[] = {
        {"stories260K.gguf", "random-llama2-untied.gguf", 5, "vocabulary (32000 tokens) is not the model's"},
        {"random-llama2-untied.gguf", "random-gemma3.gguf", 5, "sliding windows"},
        {"stories260K.gguf", "stories260K.gguf", 0, "num_speculative_tokens between 1 and"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        llm_engine_config cfg = engine_config(refused[i].model);
        cfg.spec_tokens = refused[i].spec; cfg.spec_model_path = model_path(refused[i].draft);
        char why[LLM_ERR_LEN] = "";
        llm_engine *bad = llm_engine_create(&cfg, why);
        CHECK(!bad && strstr(why, refused[i].why), "a draft model %s for %s (%d tokens) is refused: %s",
              refused[i].draft, refused[i].model, refused[i].spec, why);
        llm_engine_destroy(bad);
    }
    free(seqs); free(r);

    /* the proposal's length, step by step (one sampled request, K = 8, read off the stats after each step):
     * at most K at first; after all were kept at most twice the last cap (K at most), after some were, at
     * most that many (1 at least); once under 85% of them are kept (each proposal weighing half of the rate),
     * no proposal for 1 step, then 2, 4, ... while it stays under, back to 1 once over */
    llm_engine *e = spec_engine("stories260K.gguf", 8, 0, NULL);
    char err[LLM_ERR_LEN];
    llm_sampling_params p = llm_sampling_defaults();
    p.temperature = 0.7f; p.seed = 7; p.max_tokens = 300; p.ignore_eos = 1;
    int cap = 8, backoff = 1, wait = 0, bad = 0, steps = 0, waited = 0, partial = 0, full = 0;
    float rate = 1;
    CHECK(e && llm_engine_add_request(e, prompts[0], NULL, 0, &p, NULL, err) > 0, "adaptive length: %s", err);
    llm_engine_stats before = e ? llm_engine_get_stats(e) : st;
    while (e && llm_engine_has_work(e)) {
        const llm_output *o;
        llm_engine_step(e, &o);
        llm_engine_stats now = llm_engine_get_stats(e);
        int64_t drafts = now.spec_drafts - before.spec_drafts;
        int64_t n = now.spec_draft_tokens - before.spec_draft_tokens;
        int64_t kept = now.spec_accepted_tokens - before.spec_accepted_tokens;
        before = now;
        if (steps++ == 0) continue; /* the prompt's step */
        int broke = wait > 0 ? drafts != 0 : drafts > 1 || n > cap || kept > n;
        if (broke && !bad)
            printf("    adaptive length, step %d: %lld proposals of %lld tokens (cap %d, %d steps to wait), "
                   "%lld kept\n", steps, (long long)drafts, (long long)n, cap, wait, (long long)kept);
        bad += broke;
        if (wait > 0) { wait--; waited++; continue; }
        if (!drafts) continue;      /* nothing to propose (no match), or the last tokens */
        partial += kept < n; full += kept == n;
        cap = kept < n ? (kept > 1 ? (int)kept : 1) : (2 * cap < 8 ? 2 * cap : 8);
        rate = 0.5f * rate + 0.5f * (float)kept / (float)n;
        if (rate >= 0.85f) backoff = 1;
        else { wait = backoff; backoff = backoff < 64 ? 2 * backoff : 64; }
    }
    printf("  speculative decoding, adaptive length: %d steps, %d proposals all kept, %d partly, %d steps "
           "waited\n", steps, full, partial, waited);
    CHECK(e && bad == 0 && full > 0 && partial > 0 && waited > 0 && all_blocks_free(e),
          "speculative decoding, adaptive length: %d steps break the rule; %d proposals all kept, %d partly, "
          "%d steps waited", bad, full, partial, waited);
    llm_engine_destroy(e);
}

static void test_parallel_sampling(void) {
    llm_engine_config cfg = engine_config("stories260K.gguf");
    llm_engine *e = engine_new(&cfg);
    if (!e) return;
    const llm_model *m = llm_engine_model(e);
    char prompt[1024];
    story_prompt(prompt, sizeof prompt, 1, 60);
    int32_t ids[512];
    int P = llm_tokenize(m->tok, prompt, strlen(prompt), 1, 0, ids, 512);
    if (P > 40) P = 40;     /* 2 full blocks and one of 8 tokens */
    run_result *r = (run_result *)calloc(2, sizeof *r);
    for (int round = 0; round < 2; round++) {
        llm_sampling_params p = llm_sampling_defaults();
        p.n = 3; p.seed = 1234; p.max_tokens = 12; p.ignore_eos = 1; p.logprobs = 0;
        run_add(e, &r[round], NULL, ids, P, &p);
        if (round == 0) {   /* watch the blocks during the first two steps */
            const llm_output *out;
            char err[LLM_ERR_LEN];
            int n = llm_engine_step(e, &out);
            llm_engine_stats st = llm_engine_get_stats(e);
            CHECK(n == 3 && st.running == 3 && st.num_blocks - st.num_free_blocks == 3,
                  "n=3 after the prompt: %d outputs, %d running, %d blocks used "
                  "(expected 3: the prompt's, shared)", n, st.running, st.num_blocks - st.num_free_blocks);
            for (int i = 0; i < n; i++) {
                r[0].tokens[0][out[i].index][0] = out[i].token_ids[0];
                r[0].logprobs[0][out[i].index][0] = out[i].logprobs[0];
                r[0].n_tokens[0][out[i].index] = 1;
            }
            n = llm_engine_step(e, &out);
            st = llm_engine_get_stats(e);
            /* position 40 lands in the shared third block: two samples copy it, the last keeps it */
            CHECK(n == 3 && st.num_blocks - st.num_free_blocks == 5,
                  "n=3 after one decode: %d blocks used (expected 2 shared + 3)",
                  st.num_blocks - st.num_free_blocks);
            for (int i = 0; i < n; i++) {
                int k = out[i].index;
                r[0].logprobs[0][k][r[0].n_tokens[0][k]] = out[i].logprobs[0];
                r[0].tokens[0][k][r[0].n_tokens[0][k]++] = out[i].token_ids[0];
            }
            CHECK(llm_engine_check_blocks(e, err) == 0, "n=3 audit: %s", err);
        }
        run_engine(e, &r[round]);
    }
    int distinct = 0;
    for (int k = 0; k < 3; k++) {
        CHECK(r[0].n_tokens[0][k] == 12 && r[0].finish[0][k] == LLM_FINISH_LENGTH, "sample %d: %d tokens",
              k, r[0].n_tokens[0][k]);
        CHECK(r[1].n_tokens[0][k] == 12 && !memcmp(r[0].tokens[0][k], r[1].tokens[0][k], 12 * 4),
              "sample %d repeats with the seed", k);
        for (int j = 0; j < k; j++) distinct += memcmp(r[0].tokens[0][k], r[0].tokens[0][j], 12 * 4) != 0;
    }
    CHECK(distinct >= 2, "the three samples are not all the same (%d differing pairs)", distinct);
    /* each sample's K/V were its own: the log-probabilities the engine reported equal those of the prompt
     * and that sample run through the forward pass alone (a shared block written without a copy would
     * change them) */
    llm_model alone;
    char err[LLM_ERR_LEN];
    if (llm_model_load(&alone, model_path("stories260K.gguf"), err) == 0) {
        int T = P + 12, V = alone.cfg.vocab_size;
        llm_backend *be = cpu_backend(&alone, 1, 64);
        float *logits = (float *)malloc((size_t)T * V * sizeof(float));
        double worst = 0;
        for (int k = 0; k < 3; k++) {
            int32_t seq[64], pos[64], rows[64], block[1] = {0}, start[2] = {0, T};
            const int32_t *tables[1] = {block};
            memcpy(seq, ids, (size_t)P * 4); memcpy(seq + P, r[0].tokens[0][k], 12 * 4);
            for (int i = 0; i < T; i++) { pos[i] = i; rows[i] = i; }
            llm_batch b = {.n_tokens = T, .tokens = seq, .positions = pos, .n_seqs = 1,
                           .seq_start = start, .block_tables = tables, .n_logits = T, .logit_rows = rows};
            if (!be || be->forward(be, &b, logits, err) != 0) { worst = INFINITY; break; }
            for (int i = 0; i < 12; i++) {
                const float *row = logits + (size_t)(P - 1 + i) * V;
                double mx = row[0], sum = 0;
                for (int v = 1; v < V; v++) if (row[v] > mx) mx = row[v];
                for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
                double lp = row[seq[P + i]] - mx - log(sum), d = fabs(lp - r[0].logprobs[0][k][i]);
                if (d > worst) worst = d;
            }
        }
        CHECK(worst < 1e-4, "n=3: reported logprobs differ from each sample run alone by %g", worst);
        free(logits); llm_model_free(&alone);
        if (be) be->destroy(be);
    } else CHECK(0, "load stories260K: %s", err);
    CHECK(all_blocks_free(e) && r[0].bad_audits == 0 && r[1].bad_audits == 0, "n=3: blocks back");
    llm_engine_destroy(e);
    free(r);
}

/* -----------------------------------------------------------------------------------------------------------
 * Stop conditions, abort, rejection, logprobs
 * -------------------------------------------------------------------------------------------------------- */
/* Whether e refuses a request for "Once" with p, with a reason that holds want (printed when it does not) */
static int add_refused(llm_engine *e, const llm_sampling_params *p, const char *want) {
    char err[LLM_ERR_LEN] = "";
    int refused = llm_engine_add_request(e, "Once", NULL, 0, p, NULL, err) == 0 && strstr(err, want);
    if (!refused) printf("    refused? want \"%s\", got \"%s\"\n", want, err);
    return refused;
}

/* A thinking budget (llm_sampling_params.think_budget), on random-qwen3-qknorm greedily, whose "Think about
 * it." thinks past 24 tokens without a "</think>" (its Qwen3 vocabulary's one id, from
 * llm_chat_think_end_ids):
 * - budget 6: the first 6 tokens as without one, then "</think>", then the model's own greedy answer (the
 *   same tokens as a request whose prompt holds those 7), to max_tokens;
 * - the same with n-gram speculation (no proposal crosses the forced token), in a pool of 3 blocks that
 *   preempts and recomputes four such requests, twice on one engine (the second from the prefix cache), and
 *   sampled (temperature 1, a seed): the forced token at 6, the same tokens with speculation as without;
 * - an end already written among the budget's tokens (the 3rd token named the end): nothing forced;
 * - think_start_ids (a reply that opens its block itself, as Qwen3's does): counted from their end; a reply
 *   that never opens a block, nothing forced;
 * - think_end_ids missing or outside the vocabulary, think_start_ids outside it or too many: refused. */
static void think_budget_run(llm_engine *e, run_result *r, const llm_sampling_params *p, int copies) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < copies; i++) run_add(e, r, "Think about it.", NULL, 0, p);
    run_engine(e, r);
}
static void test_engine_think_budget(void) {
    llm_engine_config cfg = engine_config("random-qwen3-qknorm.gguf");
    llm_engine *e = engine_new(&cfg);
    run_result *a = (run_result *)calloc(1, sizeof *a), *b = (run_result *)calloc(1, sizeof *b);
    run_result *c = (run_result *)calloc(1, sizeof *c);
    llm_chat_template ct;
    char err[LLM_ERR_LEN] = "";
    int32_t end[8], n_end = 0, budget = 6, len = 24;
    if (e && llm_chat_template_init(&ct, NULL, 0, llm_engine_model(e)->tok, "qwen3", err) == 0)
        n_end = llm_chat_think_end_ids(&ct, llm_engine_model(e)->tok, end, 8);
    CHECK(n_end == 1, "think budget: </think> is one id of Qwen3's vocabulary (%d)", n_end);
    if (!e || !a || !b || !c || n_end != 1) { free(a); free(b); free(c); llm_engine_destroy(e); return; }
    /* 1. without a budget: no </think> in 24 tokens */
    llm_sampling_params p = greedy(len);
    think_budget_run(e, a, &p, 1);
    int closed = 0;
    for (int i = 0; i < a->n_tokens[0][0]; i++) closed |= a->tokens[0][0][i] == end[0];
    CHECK(a->n_tokens[0][0] == len && !closed, "think budget: none: 24 tokens of thinking (%d, closed %d)",
          a->n_tokens[0][0], closed);
    /* 2. budget 6: 6 tokens, </think>, the answer as the model goes on from them */
    p.think_budget = budget; p.think_end_ids = end; p.n_think_end_ids = n_end;
    think_budget_run(e, b, &p, 1);
    const int32_t *bt = b->tokens[0][0];
    CHECK(b->n_tokens[0][0] == len && !memcmp(bt, a->tokens[0][0], (size_t)budget * 4) && bt[budget] == end[0]
          && b->finish[0][0] == LLM_FINISH_LENGTH,
          "think budget 6: the thinking cut at 6 tokens, then </think> (%d tokens, [6] = %d)",
          b->n_tokens[0][0], bt[budget]);
    int32_t prompt[256];
    int np = llm_tokenize(llm_engine_model(e)->tok, "Think about it.", 15, 0, 0, prompt, 200);
    memcpy(prompt + np, bt, (size_t)(budget + 1) * 4);
    llm_sampling_params plain = greedy(len - budget - 1);
    memset(c, 0, sizeof *c);
    run_add(e, c, NULL, prompt, np + budget + 1, &plain);
    run_engine(e, c);
    CHECK(c->n_tokens[0][0] == len - budget - 1 && !memcmp(c->tokens[0][0], bt + budget + 1,
                                                           (size_t)(len - budget - 1) * 4),
          "think budget 6: after </think>, the model's own answer");
    /* 3. an end among the budget's tokens already: nothing forced */
    llm_sampling_params own = p;
    own.think_end_ids = &a->tokens[0][0][2];
    think_budget_run(e, c, &own, 1);
    CHECK(c->n_tokens[0][0] == len && !memcmp(c->tokens[0][0], a->tokens[0][0], (size_t)len * 4),
          "think budget: a block closed within the budget is left as it is");
    /* 3b. a reply that opens its own block (think_start_ids: Qwen3's "<think>", one id; none for QwQ's
     *     template, whose prompt opens it): the budget counts from where the start ends (here the model's
     *     own 2nd token stands for it), and a reply that never opens one has nothing forced */
    int32_t start[8];
    llm_chat_template qwq;
    int n_start = llm_chat_think_start_ids(&ct, llm_engine_model(e)->tok, start, 8), n_qwq = -1;
    if (llm_chat_template_init(&qwq, NULL, 0, llm_engine_model(e)->tok, "qwq", err) == 0)
        n_qwq = llm_chat_think_start_ids(&qwq, llm_engine_model(e)->tok, start + 1, 7);
    CHECK(n_start == 1 && n_qwq == 0, "think budget: <think> is one id of Qwen3's vocabulary (%d), none for "
          "QwQ's template (%d)", n_start, n_qwq);
    llm_sampling_params opens = p;
    int at = 0;
    while (a->tokens[0][0][at] != a->tokens[0][0][1]) at++; /* the first place of the token standing in */
    opens.think_start_ids = &a->tokens[0][0][1]; opens.n_think_start_ids = 1;
    think_budget_run(e, c, &opens, 1);
    CHECK(c->n_tokens[0][0] == len && !memcmp(c->tokens[0][0], a->tokens[0][0], (size_t)(at + 1 + budget) * 4)
          && c->tokens[0][0][at + 1 + budget] == end[0],
          "think budget: counted from the start's end: </think> at %d (%d)", at + 1 + budget,
          c->tokens[0][0][at + 1 + budget]);
    opens.think_start_ids = end; /* never in this reply: it opens no block */
    think_budget_run(e, c, &opens, 1);
    CHECK(c->n_tokens[0][0] == len && !memcmp(c->tokens[0][0], a->tokens[0][0], (size_t)len * 4),
          "think budget: a reply that opens no think block has nothing forced");
    /* 4. refused: no ids, or ids outside the vocabulary */
    llm_sampling_params bad = p;
    bad.n_think_end_ids = 0;
    CHECK(add_refused(e, &bad, "think_budget must be >= 0, and with one think_end_ids must hold 1 to 8 ids"),
          "think budget: no think_end_ids refused");
    int32_t outside = 1 << 30;
    bad.think_end_ids = &outside; bad.n_think_end_ids = 1;
    CHECK(add_refused(e, &bad, "think_end_ids token id 1073741824 is outside the vocabulary"),
          "think budget: an id outside the vocabulary refused");
    bad = p;
    bad.think_start_ids = &outside; bad.n_think_start_ids = 1;
    CHECK(add_refused(e, &bad, "think_start_ids token id 1073741824 is outside the vocabulary"),
          "think budget: a start id outside the vocabulary refused");
    bad.n_think_start_ids = 9;
    CHECK(add_refused(e, &bad, "think_start_ids must hold 0 to 8 ids"), "think budget: 9 start ids refused");
    llm_engine_destroy(e);
    /* 5. speculation, preemption and recompute, the prefix cache: the same tokens */
    e = spec_engine("random-qwen3-qknorm.gguf", 4, 3, NULL);
    for (int round = 0; e && round < 2; round++) {
        think_budget_run(e, c, &p, 4);
        int same = 1;
        for (int i = 0; i < 4; i++)
            same &= c->n_tokens[i][0] == len && !memcmp(c->tokens[i][0], bt, (size_t)len * 4);
        llm_engine_stats st = llm_engine_get_stats(e);
        CHECK(same && st.preemptions > 0 && st.spec_drafts > 0 && (round == 0 || st.prefix_cache_hits > 0),
              "think budget: speculative, preempted, cached (round %d): the same tokens (preemptions %lld, "
              "drafts %lld, cache hits %lld)", round, (long long)st.preemptions, (long long)st.spec_drafts,
              (long long)st.prefix_cache_hits);
    }
    llm_engine_destroy(e);
    /* 6. sampled: the forced token takes a draw's number, so a speculative run draws the same tokens */
    p.temperature = 1; p.top_k = 0; p.top_p = 1; p.min_p = 0; p.seed = 7;
    for (int spec = 0; spec <= 4; spec += 4) {
        e = spec_engine("random-qwen3-qknorm.gguf", spec, 0, NULL);
        if (e) think_budget_run(e, spec ? c : a, &p, 1);
        llm_engine_destroy(e);
    }
    CHECK(a->n_tokens[0][0] == len && a->tokens[0][0][budget] == end[0] && c->n_tokens[0][0] == len &&
          !memcmp(a->tokens[0][0], c->tokens[0][0], (size_t)len * 4),
          "think budget, sampled: </think> at 6, the same tokens with speculation");
    /* 7. a tool call's grammar (Qwen3's, tool_choice auto: text, or a call after "<tool_call>"): the forced
     *    "</think>" goes through its check (the text the grammar allows), the grammar moves on over it */
    char *g = llm_chat_tool_grammar(&ct, "[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                                    "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]",
                                    LLM_TOOL_AUTO, NULL, 0, err);
    CHECK(g != NULL, "think budget: a tool grammar: %s", err);
    llm_sampling_params gp = greedy(12);
    gp.grammar = g; gp.think_budget = 4; gp.think_end_ids = end; gp.n_think_end_ids = n_end;
    e = engine_new(&cfg);
    if (e && g) think_budget_run(e, c, &gp, 1);
    CHECK(c->n_tokens[0][0] == 12 && c->tokens[0][0][4] == end[0] && c->text_len[0][0] < 4096 &&
          strstr(c->text[0][0], "</think>"),
          "think budget: under a tool call's grammar, </think> at 4 (%d tokens: %.*s)",
          c->n_tokens[0][0], c->text_len[0][0] < 300 ? c->text_len[0][0] : 300, c->text[0][0]);
    llm_engine_destroy(e);
    free(g); free(a); free(b); free(c);
}

/* OpenAI's logit_bias: -100 keeps a token out, +100 forces it, greedy and sampled; logprobs stay the model's
 * own; the caller's arrays are copied; bad values and ids are refused with the reason. vLLM's
 * allowed_token_ids beside it. */
static void test_logit_bias(void) {
    llm_engine *e = stories_engine();
    if (!e) return;
    run_result *r = (run_result *)calloc(1, sizeof *r);
    llm_sampling_params p = greedy(16);
    run_add(e, r, "Once upon a time", NULL, 0, &p);
    run_engine(e, r);
    int32_t banned = r->tokens[0][0][0], forced = 300;
    int n_plain = r->n_tokens[0][0], banned_count = 0;
    for (int i = 0; i < n_plain; i++) banned_count += r->tokens[0][0][i] == banned;
    /* -100 on the greedy first token (which comes back more than once unbiased); +100 on one never picked */
    int32_t ids[2] = {banned, forced};
    float bias[2] = {-100.0f, 0.0f};
    for (int temp = 0; temp < 2; temp++) {
        for (int seed = 0; seed < (temp ? 4 : 1); seed++) {
            memset(r, 0, sizeof *r);
            p = greedy(16);
            p.temperature = temp ? 1.0f : 0.0f; p.seed = seed;
            p.logit_bias_ids = ids; p.logit_bias = bias; p.n_logit_bias = 1;
            run_add(e, r, "Once upon a time", NULL, 0, &p);
            run_engine(e, r);
            int seen = 0;
            for (int i = 0; i < r->n_tokens[0][0]; i++) seen += r->tokens[0][0][i] == banned;
            CHECK(r->n_tokens[0][0] == 16 && seen == 0, "logit_bias -100 (temp %d, seed %d): token %d %d "
                  "times (%d times in %d unbiased)", temp, seed, banned, seen, banned_count, n_plain);
        }
    }
    CHECK(banned_count >= 1, "logit_bias: the banned token is the greedy first one (%d)", banned_count);
    for (int temp = 0; temp < 2; temp++) {
        memset(r, 0, sizeof *r);
        p = greedy(8);
        p.temperature = temp ? 1.0f : 0.0f; p.seed = 7; p.logprobs = 0;
        bias[0] = 0.0f; bias[1] = 100.0f;
        p.logit_bias_ids = ids; p.logit_bias = bias; p.n_logit_bias = 2;
        run_add(e, r, "Once upon a time", NULL, 0, &p);
        ids[1] = 0; bias[1] = -100.0f; /* scribbled after the call: the request kept its copy */
        run_engine(e, r);
        int all = r->n_tokens[0][0] == 8;
        for (int i = 0; i < r->n_tokens[0][0]; i++) all &= r->tokens[0][0][i] == forced;
        CHECK(all && r->logprobs[0][0][0] < -1.0f, "logit_bias +100 (temp %d): every token %d, logprob "
              "the model's own %g", temp, forced, (double)r->logprobs[0][0][0]);
        ids[1] = forced;
    }
    /* vLLM's allowed_token_ids: only those, greedy and sampled; a bias still moves among them */
    int32_t allowed[3] = {300, 301, banned};
    for (int temp = 0; temp < 2; temp++) {
        memset(r, 0, sizeof *r);
        p = greedy(12);
        p.temperature = temp ? 1.0f : 0.0f; p.seed = 3;
        p.allowed_token_ids = allowed; p.n_allowed_token_ids = 3;
        bias[0] = -100.0f; ids[0] = banned;
        p.logit_bias_ids = ids; p.logit_bias = bias; p.n_logit_bias = 1;
        run_add(e, r, "Once upon a time", NULL, 0, &p);
        run_engine(e, r);
        int only = r->n_tokens[0][0] == 12;
        for (int i = 0; i < r->n_tokens[0][0]; i++)
            only &= r->tokens[0][0][i] == 300 || r->tokens[0][0][i] == 301;
        CHECK(only, "allowed_token_ids {300, 301, %d} with %d at -100 (temp %d): %d tokens, first %d", banned,
              banned, temp, r->n_tokens[0][0], r->tokens[0][0][0]);
    }
    /* vLLM's bad_words, as token sequences: one token never comes; a pair's second never follows its first
     * in the output; a pair whose first token is the prompt's last bans nothing (the output's tokens only) */
    int32_t plain[16];
    memset(r, 0, sizeof *r);
    p = greedy(16);
    run_add(e, r, "Once upon a time", NULL, 0, &p);
    run_engine(e, r);
    memcpy(plain, r->tokens[0][0], sizeof plain);
    int32_t time_id = 378; /* "▁time", the prompt's last token */
    int32_t words[5] = {plain[0], plain[1], plain[2], time_id, plain[0]}, lens[3] = {1, 2, 2};
    for (int w = 0; w < 3; w++) {
        memset(r, 0, sizeof *r);
        p = greedy(16);
        p.bad_word_ids = words + (w == 0 ? 0 : w == 1 ? 1 : 3); p.bad_word_lens = lens + w; p.n_bad_words = 1;
        run_add(e, r, "Once upon a time", NULL, 0, &p);
        run_engine(e, r);
        const int32_t *got = r->tokens[0][0];
        int n = r->n_tokens[0][0], found = 0;
        for (int i = 0; i < n; i++)
            found += w == 0 ? got[i] == plain[0] : i > 0 && got[i - 1] == plain[1] && got[i] == plain[2];
        int part = w == 0 ? 0 : 2; /* where the output must leave the unbiased one */
        if (w < 2)
            CHECK(n == 16 && found == 0 && !memcmp(got, plain, (size_t)part * sizeof(int32_t)) &&
                  got[part] != plain[part], "bad_words %d: %d found, parted at %d", w, found, part);
        else
            CHECK(n == 16 && !memcmp(got, plain, sizeof plain), "bad_words [time ,]: nothing banned");
    }
    /* refused, each with its reason */
    p = greedy(4);
    lens[0] = 0;
    p.bad_word_ids = words; p.bad_word_lens = lens; p.n_bad_words = 1;
    CHECK(add_refused(e, &p, "has 0 tokens"), "a bad word of 0 tokens");
    lens[0] = 1; words[0] = 512;
    CHECK(add_refused(e, &p, "bad_words token id 512"), "a bad word of token 512 of 512");
    p = greedy(4);
    allowed[0] = 512;
    p.allowed_token_ids = allowed; p.n_allowed_token_ids = 1;
    CHECK(add_refused(e, &p, "allowed_token_ids token id 512"), "allowed_token_ids with 512 of 512");
    p = greedy(4);
    bias[0] = 100.5f;
    p.logit_bias_ids = ids; p.logit_bias = bias; p.n_logit_bias = 1;
    CHECK(add_refused(e, &p, "[-100, 100]"), "logit_bias 100.5");
    bias[0] = 1.0f; ids[0] = 512;
    CHECK(add_refused(e, &p, "logit_bias token id 512"), "logit_bias on token 512 of 512");
    p.logit_bias = NULL;
    CHECK(add_refused(e, &p, "n_logit_bias"), "n_logit_bias without the arrays");
    CHECK(all_blocks_free(e), "logit_bias: every block back");
    free(r);
    llm_engine_destroy(e);
}

static void test_stop_conditions(void) {
    int n;
    ref_case *cases = stories_cases(&n);
    llm_engine_config cfg = engine_config("stories260K.gguf");
    llm_engine *e = engine_new(&cfg);
    if (!e || n < 1) { free(cases); llm_engine_destroy(e); return; }
    const ref_case *c = &cases[0];   /* ", there was a little girl named Lily. She loved to play ..." */
    run_result *r = (run_result *)calloc(1, sizeof *r);
    /* "rl nam" spans the tokens " girl" and " named": the text stops before it
     * and none of it is ever streamed */
    const char *stop[2] = {"rl nam", "elephant"};
    llm_sampling_params p = greedy(c->max_tokens);
    p.stop = stop; p.n_stop = 2;
    r->stop_probe = "rl";
    run_add(e, r, c->prompt, NULL, 0, &p);
    run_engine(e, r);
    const char *want = strstr(c->completion, "rl nam");
    int want_len = want ? (int)(want - c->completion) : -1;
    CHECK(want_len > 0 && r->text_len[0][0] == want_len &&
          !memcmp(r->text[0][0], c->completion, (size_t)want_len) && r->finish[0][0] == LLM_FINISH_STOP,
          "stop string: got \"%.*s\" (finish %d)", r->text_len[0][0], r->text[0][0], r->finish[0][0]);
    CHECK(r->text_chunks_with_stop == 0, "no streamed chunk held the start of the stop string");
    /* a stop string that begins to match ("Lily" of "Lily's cat") and then does not:
     * the held text comes out */
    memset(r, 0, sizeof *r);
    const char *stop2[1] = {"Lily's cat"};
    p.stop = stop2; p.n_stop = 1;
    run_add(e, r, c->prompt, NULL, 0, &p);
    run_engine(e, r);
    CHECK(r->text_len[0][0] == (int)c->n_completion &&
          !memcmp(r->text[0][0], c->completion, c->n_completion) && r->finish[0][0] == LLM_FINISH_LENGTH,
          "near-miss stop string: all text out, finish length");
    /* a stop token id: the output ends with it, its text is not included */
    memset(r, 0, sizeof *r);
    p.stop = NULL; p.n_stop = 0;
    p.stop_token_ids = &c->ids[5]; p.n_stop_token_ids = 1;
    run_add(e, r, c->prompt, NULL, 0, &p);
    run_engine(e, r);
    int first = 0;
    while (c->ids[first] != c->ids[5]) first++;
    CHECK(r->n_tokens[0][0] == first + 1 && r->finish[0][0] == LLM_FINISH_STOP,
          "stop token id: %d tokens, expected %d", r->n_tokens[0][0], first + 1);
    /* max_tokens: finish length with exactly that many */
    memset(r, 0, sizeof *r);
    p = greedy(7);
    run_add(e, r, c->prompt, NULL, 0, &p);
    run_engine(e, r);
    CHECK(r->n_tokens[0][0] == 7 && r->finish[0][0] == LLM_FINISH_LENGTH, "max_tokens 7: %d tokens",
          r->n_tokens[0][0]);
    CHECK(all_blocks_free(e), "stop conditions: blocks back");
    llm_engine_destroy(e);

    /* EOS: with "." as EOS, the first sentence ends generation (the token is in the ids, its text is not);
     * with ignore_eos it runs on to max_tokens */
    char eos_model[64];
    CHECK(stories_with_eos(c->ids[10], eos_model) == 0, "stories260K with another EOS");
    cfg.model_path = eos_model;
    e = engine_new(&cfg);
    memset(r, 0, sizeof *r);
    p = greedy(c->max_tokens);
    run_add(e, r, c->prompt, NULL, 0, &p);
    p.ignore_eos = 1;
    run_add(e, r, c->prompt, NULL, 0, &p);
    run_engine(e, r);
    int n0 = r->n_tokens[0][0], upto = 0;
    while (upto < c->n_ids && c->ids[upto] != c->ids[10]) upto++;
    const char *dot = memchr(c->completion, '.', c->n_completion);
    CHECK(r->finish[0][0] == LLM_FINISH_STOP && n0 == upto + 1 && dot &&
          r->text_len[0][0] == (int)(dot - c->completion) &&
          !memcmp(r->text[0][0], c->completion, (size_t)(dot - c->completion)),
          "EOS stops generation (%d tokens, finish %d, \"%.*s\")",
          n0, r->finish[0][0], r->text_len[0][0], r->text[0][0]);
    CHECK(r->n_tokens[1][0] == c->n_ids && r->finish[1][0] == LLM_FINISH_LENGTH &&
          !memcmp(r->tokens[1][0], c->ids, (size_t)c->n_ids * 4),
          "ignore_eos runs on (%d tokens)", r->n_tokens[1][0]);
    llm_engine_destroy(e);
    unlink(eos_model);
    free(r); free(cases);
}

static void test_abort_and_limits(void) {
    llm_engine_config cfg = engine_config("stories260K.gguf");
    llm_engine *e = engine_new(&cfg);
    if (!e) return;
    char err[LLM_ERR_LEN] = "";
    llm_sampling_params p = greedy(200);
    p.ignore_eos = 1;
    uint64_t a = llm_engine_add_request(e, "Once upon a time", NULL, 0, &p, NULL, err);
    uint64_t b = llm_engine_add_request(e, "Lily and Ben were", NULL, 0, &p, NULL, err);
    const llm_output *out;
    for (int i = 0; i < 40; i++) llm_engine_step(e, &out);
    llm_engine_stats st = llm_engine_get_stats(e);
    int used_two = st.num_blocks - st.num_free_blocks;
    CHECK(st.running == 2 && used_two >= 6, "two running, %d blocks held", used_two);
    llm_engine_abort(e, a);
    int n = llm_engine_step(e, &out), saw_abort = 0;
    for (int i = 0; i < n; i++)
        if (out[i].request_id == a) saw_abort = out[i].finish_reason == LLM_FINISH_ABORT;
    st = llm_engine_get_stats(e);
    /* what is still held is exactly the other request's blocks: one per 16 tokens it has computed */
    CHECK(saw_abort && st.running == 1 &&
          st.num_blocks - st.num_free_blocks == (int)((st.kv_tokens + 15) / 16) &&
          st.num_blocks - st.num_free_blocks < used_two,
          "abort: finish reason abort, its blocks freed (%d held now, %d before)",
          st.num_blocks - st.num_free_blocks, used_two);
    CHECK(llm_engine_check_blocks(e, err) == 0, "abort audit: %s", err);
    llm_engine_abort(e, b);
    llm_engine_abort(e, 987654);   /* an unknown id: nothing happens */
    llm_engine_step(e, &out);
    CHECK(all_blocks_free(e) && !llm_engine_has_work(e), "abort: all blocks back");

    /* rejected at admission, with the reason */
    int32_t *ids = (int32_t *)calloc(4096, sizeof(int32_t));
    int ctx = llm_engine_model(e)->cfg.context_length;
    for (int i = 0; i < 4096; i++) ids[i] = 100 + i % 300;
    CHECK(llm_engine_add_request(e, NULL, ids, ctx, &p, NULL, err) == 0 && strstr(err, "context"),
          "prompt of the whole context: \"%s\"", err);
    ids[3] = 99999;
    CHECK(llm_engine_add_request(e, NULL, ids, 10, &p, NULL, err) == 0 &&
          strstr(err, "outside the vocabulary"), "bad token id: \"%s\"", err);
    ids[3] = 5;
    llm_sampling_params bad = p; bad.top_p = 0;
    CHECK(llm_engine_add_request(e, NULL, ids, 10, &bad, NULL, err) == 0 && strstr(err, "top_p"),
          "top_p 0: \"%s\"", err);
    bad = p; bad.temperature = -1;
    CHECK(llm_engine_add_request(e, NULL, ids, 10, &bad, NULL, err) == 0 && strstr(err, "temperature"),
          "temperature -1: \"%s\"", err);
    llm_engine_destroy(e);

    /* a pool of 4 blocks (64 tokens): a longer prompt is rejected;
     * a sequence that outgrows it ends with length */
    cfg.num_blocks = 4;
    e = engine_new(&cfg);
    CHECK(llm_engine_add_request(e, NULL, ids, 100, &p, NULL, err) == 0 && strstr(err, "pool"),
          "prompt bigger than the pool: \"%s\"", err);
    run_result *r = (run_result *)calloc(1, sizeof *r);
    run_add(e, r, NULL, ids, 10, &p);
    run_engine(e, r);
    CHECK(r->finish[0][0] == LLM_FINISH_LENGTH && r->n_tokens[0][0] == 64 - 10 + 1,
          "outgrowing the pool: %d tokens, finish %d", r->n_tokens[0][0], r->finish[0][0]);
    CHECK(all_blocks_free(e), "tiny pool: blocks back");
    llm_engine_destroy(e);

    /* max_model_len caps generation */
    cfg.num_blocks = 0; cfg.max_model_len = 32;
    e = engine_new(&cfg);
    memset(r, 0, sizeof *r);
    run_add(e, r, NULL, ids, 10, &p);
    run_engine(e, r);
    CHECK(r->finish[0][0] == LLM_FINISH_LENGTH && r->n_tokens[0][0] == 22, "max_model_len 32: %d tokens",
          r->n_tokens[0][0]);
    llm_engine_destroy(e);

    /* a model file that is not there */
    cfg = engine_config("no-such-model.gguf");
    CHECK(llm_engine_create(&cfg, err) == NULL && strstr(err, "no-such-model.gguf"),
          "missing model: \"%s\"", err);
    free(ids); free(r);
}

static void test_logprobs(void) {
    llm_engine *e = stories_engine();
    if (!e) return;
    llm_sampling_params p = greedy(10);
    p.logprobs = 3;
    char err[LLM_ERR_LEN];
    llm_engine_add_request(e, "Once upon a time", NULL, 0, &p, NULL, err);
    int ok = 1, steps = 0;
    while (llm_engine_has_work(e)) {
        const llm_output *out;
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) for (int t = 0; t < out[i].n_tokens; t++) {
            const float *top = out[i].top_logprobs + t * 3;
            float mass = expf(top[0]) + expf(top[1]) + expf(top[2]);
            ok &= out[i].n_top == 3 && out[i].top_ids[t * 3] == out[i].token_ids[t] &&
                  out[i].logprobs[t] == top[0] &&
                  top[0] <= 0 && top[0] >= top[1] && top[1] >= top[2] && mass <= 1.0001f;
            steps++;
        }
    }
    CHECK(ok && steps == 10, "logprobs: greedy token is the top one, sorted, mass <= 1 (%d tokens)", steps);
    llm_engine_destroy(e);
}

/* Prompt logprobs: one request run alone, and what its outputs held. */
typedef struct {
    int n_gen, n_plp, n_top, n_outputs_with_plp, n_cached;
    int32_t gen[64], top_ids[1024][5], ranks[1024];
    float gen_lp[64], gen_top[64][5], plp[1024], top[1024][5];
    int32_t gen_top_ids[64][5];
} plp_result;

static void plp_run(llm_engine *e, const int32_t *ids, int n, const llm_sampling_params *p, plp_result *r) {
    char err[LLM_ERR_LEN];
    memset(r, 0, sizeof *r);
    CHECK(llm_engine_add_request(e, NULL, ids, n, p, NULL, err) > 0, "prompt logprobs: add: %s", err);
    while (llm_engine_has_work(e)) {
        const llm_output *out;
        int k = llm_engine_step(e, &out);
        for (int i = 0; i < k; i++) {
            const llm_output *o = &out[i];
            for (int t = 0; t < o->n_tokens && r->n_gen < 64; t++, r->n_gen++) {
                r->gen[r->n_gen] = o->token_ids[t];
                if (!o->logprobs) continue;
                r->gen_lp[r->n_gen] = o->logprobs[t];
                for (int j = 0; j < o->n_top && j < 5; j++) {
                    r->gen_top_ids[r->n_gen][j] = o->top_ids[t * o->n_top + j];
                    r->gen_top[r->n_gen][j] = o->top_logprobs[t * o->n_top + j];
                }
            }
            r->n_cached = o->n_cached_tokens;
            if (!o->prompt_logprobs) continue;
            r->n_outputs_with_plp++;
            r->n_plp = o->n_prompt_logprobs; r->n_top = o->n_prompt_top;
            for (int t = 0; t < o->n_prompt_logprobs && t < 1024; t++) {
                r->plp[t] = o->prompt_logprobs[t]; r->ranks[t] = o->prompt_ranks[t];
                for (int j = 0; j < o->n_prompt_top && j < 5; j++) {
                    r->top_ids[t][j] = o->prompt_top_ids[t * o->n_prompt_top + j];
                    r->top[t][j] = o->prompt_top_logprobs[t * o->n_prompt_top + j];
                }
            }
        }
    }
}

/* Prompt logprobs against teacher forcing: the greedy continuation G of a prompt A, with its logprobs, is
 * what the prompt logprobs of the prompt A + G must say at G's positions, value for value (the same rows of
 * logits scored by the same function): over several steps (chunked prefill), again with the prompt in the
 * prefix cache (which such a request must not take), and with n = 2. */
static void test_prompt_logprobs(void) {
    llm_engine_config cfg = engine_config("stories260K.gguf");
    cfg.max_num_batched_tokens = 7;                 /* the prompt of 40-odd tokens spans several steps */
    llm_engine *e = engine_new(&cfg);
    if (!e) return;
    plp_result *g = (plp_result *)calloc(1, sizeof *g), *r = (plp_result *)calloc(3, sizeof *r);
    int32_t ids[128];
    const char *text = "Once upon a time, there was a little";
    int A = llm_tokenize_prompt(llm_engine_model(e)->tok, text, strlen(text), ids, 64), G = 36;
    llm_sampling_params p = greedy(G);
    p.logprobs = 5;
    plp_run(e, ids, A, &p, g);
    CHECK(g->n_gen == G && g->n_outputs_with_plp == 0, "prompt logprobs: none unless asked (%d tokens)",
          g->n_gen);
    memcpy(ids + A, g->gen, (size_t)(G - 1) * sizeof(int32_t));
    int P = A + G - 1;                              /* the last greedy token is what P's end predicts */
    p = greedy(1);
    p.prompt_logprobs = 5; p.logprobs = 5;
    for (int round = 0; round < 3; round++) {
        int64_t before = llm_engine_get_stats(e).prompt_tokens_computed;
        p.n = round == 2 ? 2 : 1;
        plp_run(e, ids, P, &p, &r[round]);
        int64_t computed = llm_engine_get_stats(e).prompt_tokens_computed - before;
        plp_result *x = &r[round];
        int same = 0, rank1 = 0;
        for (int j = 0; j < G - 1; j++) { /* row A + j - 1 scores prompt token A + j, greedy token j */
            int row = A + j - 1;
            same += x->plp[row] == g->gen_lp[j] && !memcmp(x->top_ids[row], g->gen_top_ids[j], 5 * 4) &&
                    !memcmp(x->top[row], g->gen_top[j], 5 * 4);
            rank1 += x->ranks[row] == 1;
        }
        CHECK(x->n_outputs_with_plp == 1 && x->n_plp == P - 1 && x->n_top == 5 && same == G - 1 &&
              rank1 == G - 1 && computed == P && x->n_cached == 0,
              "prompt logprobs (round %d): %d outputs with them, %d rows of %d, %d of %d equal to "
              "generation's, %d of rank 1, %lld prompt tokens computed of %d, %d cached", round,
              x->n_outputs_with_plp, x->n_plp, P - 1, same, G - 1, rank1, (long long)computed, P,
              x->n_cached);
        CHECK(x->n_gen == p.n && x->gen[0] == g->gen[G - 1] && x->gen_lp[0] == g->gen_lp[G - 1],
              "prompt logprobs (round %d): the sampled token after them is generation's", round);
    }
    /* the rows before A: each the logprob of a prompt token, its rank and the top 5 holding it when it
     * ranks in */
    int consistent = 1;
    for (int row = 0; row < A - 1; row++) {
        int32_t tok = ids[row + 1];
        consistent &= r[0].plp[row] <= 0 && r[0].ranks[row] >= 1 && r[0].top[row][0] >= r[0].top[row][4];
        for (int j = 0; j < 5; j++)
            if (r[0].top_ids[row][j] == tok) consistent &= r[0].ranks[row] == j + 1 && r[0].top[row][j] ==
                                                             r[0].plp[row];
        consistent &= !memcmp(&r[0].plp[row], &r[1].plp[row], 4) && !memcmp(r[0].top[row], r[2].top[row], 20);
    }
    CHECK(consistent, "prompt logprobs: the prompt's own rows are ranked and the same every round");
    /* its blocks were named for others: a request without prompt logprobs takes them */
    p = greedy(1);
    plp_run(e, ids, P, &p, &r[0]);
    CHECK(r[0].n_cached == (P - 1) / 16 * 16 && r[0].n_outputs_with_plp == 0,
          "prompt logprobs: the prompt's blocks cached for others (%d tokens)", r[0].n_cached);
    char err[LLM_ERR_LEN] = "";
    p.prompt_logprobs = 21;
    CHECK(llm_engine_add_request(e, NULL, ids, P, &p, NULL, err) == 0 && strstr(err, "prompt_logprobs"),
          "prompt logprobs: 21 refused: %s", err);
    CHECK(all_blocks_free(e), "prompt logprobs: blocks back in the pool");
    llm_engine_destroy(e);
    free(g); free(r);
}

/* -----------------------------------------------------------------------------------------------------------
 * Requests handed in from another thread while the engine steps (as the server does)
 * -------------------------------------------------------------------------------------------------------- */
#include <pthread.h>
typedef struct {
    llm_engine *e; const ref_case *cases; int n_cases, n_requests; uint64_t ids[16]; int which[16];
} feeder_args;

static void *feeder(void *arg) {
    feeder_args *f = (feeder_args *)arg;
    for (int i = 0; i < f->n_requests; i++) {
        char err[LLM_ERR_LEN];
        f->which[i] = i % f->n_cases;
        llm_sampling_params p = greedy(f->cases[f->which[i]].max_tokens);
        f->ids[i] = llm_engine_add_request(f->e, f->cases[f->which[i]].prompt, NULL, 0, &p, NULL, err);
        struct timespec ts = {0, 2000000};  /* 2 ms apart: they land between and during steps */
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_threads(void) {
    int n;
    ref_case *cases = stories_cases(&n);
    llm_engine_config cfg = engine_config("stories260K.gguf");
    llm_engine *e = engine_new(&cfg);
    if (!e || n < 1) { free(cases); llm_engine_destroy(e); return; }
    feeder_args f = {e, cases, n, 12, {0}, {0}};
    run_result *r = (run_result *)calloc(1, sizeof *r);
    pthread_t th;
    pthread_create(&th, NULL, feeder, &f);
    int finished = 0, steps = 0;
    while (finished < f.n_requests && steps < 100000) {
        const llm_output *out;
        int k = llm_engine_step(e, &out);
        steps++;
        for (int i = 0; i < k; i++) {
            int slot = (int)out[i].request_id - 1;   /* ids count from 1 in the order they were added */
            if (slot < 0 || slot >= 16) continue;
            for (int t = 0; t < out[i].n_tokens && r->n_tokens[slot][0] < 600; t++)
                r->tokens[slot][0][r->n_tokens[slot][0]++] = out[i].token_ids[t];
            if (out[i].finish_reason) { r->finish[slot][0] = out[i].finish_reason; finished++; }
        }
        if (k == 0) { struct timespec ts = {0, 200000}; nanosleep(&ts, NULL); }
    }
    pthread_join(th, NULL);
    int bad = 0;
    for (int i = 0; i < f.n_requests; i++) {
        const ref_case *c = &cases[f.which[i]];
        int slot = (int)f.ids[i] - 1;
        bad += slot < 0 || slot >= 16 || r->n_tokens[slot][0] != c->n_ids ||
               memcmp(r->tokens[slot][0], c->ids, (size_t)c->n_ids * 4) != 0;
    }
    CHECK(finished == f.n_requests && bad == 0,
          "requests from another thread: %d of %d finished, %d differ from llama.cpp's",
          finished, f.n_requests, bad);
    CHECK(all_blocks_free(e), "threads: blocks back");
    llm_engine_destroy(e);
    free(r); free(cases);
}

/* -----------------------------------------------------------------------------------------------------------
 * The engine API a server drives: user pointers, waiting for work, errors of a step
 * -------------------------------------------------------------------------------------------------------- */
/* Every output carries the user pointer its request was added with: finished, aborted, each of n samples. */
static void test_user_pointers(void) {
    llm_engine *e = stories_engine();
    if (!e) return;
    char err[LLM_ERR_LEN] = "", tags[3];
    uint64_t ids[3];
    for (int i = 0; i < 3; i++) {
        llm_sampling_params p = greedy(8 + i);
        p.n = i == 1 ? 3 : 1; p.seed = 5; p.ignore_eos = 1;
        if (i == 1) p.temperature = 1.0f;
        ids[i] = llm_engine_add_request(e, i == 2 ? "Lily and Ben were" : "Once upon a time", NULL, 0, &p,
                                        &tags[i], err);
    }
    int outputs = 0, wrong = 0, finished[3] = {0}, steps = 0;
    while (llm_engine_has_work(e) && steps++ < 1000) {
        if (steps == 3) llm_engine_abort(e, ids[2]);
        const llm_output *out;
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) {
            int k = out[i].request_id == ids[0] ? 0 : out[i].request_id == ids[1] ? 1 : 2;
            outputs++;
            wrong += out[i].user != &tags[k];
            finished[k] += out[i].finish_reason != LLM_FINISH_NONE;
        }
    }
    CHECK(outputs > 10 && wrong == 0, "user pointers: %d of %d outputs carry another request's pointer",
          wrong, outputs);
    CHECK(finished[0] == 1 && finished[1] == 3 && finished[2] == 1,
          "user pointers: finishes %d %d %d (want 1, 3, 1)", finished[0], finished[1], finished[2]);
    llm_engine_destroy(e);
}

typedef struct { llm_engine *e; int timeout_ms, result; } waiter_args;
static void *waiter(void *arg) {
    waiter_args *w = (waiter_args *)arg;
    w->result = llm_engine_wait(w->e, w->timeout_ms);
    return NULL;
}

/* Runs llm_engine_wait(e, -1) on another thread while poke() runs here; 1 when it returned 1 within 10 s. */
static int wait_woken_by(llm_engine *e, void (*poke)(llm_engine *e)) {
    waiter_args w = {e, -1, -1};
    pthread_t th;
    if (pthread_create(&th, NULL, waiter, &w) != 0) return 0;
    struct timespec pause = {0, 100 * 1000000L}, deadline;
    nanosleep(&pause, NULL);                  /* the waiter is asleep by now (if not, wait returns at once) */
    poke(e);
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 10;
    if (pthread_timedjoin_np(th, NULL, &deadline) != 0) {
        /* never woken: a failure (and the engine is lost) */
        pthread_cancel(th);
        return 0;
    }
    return w.result == 1;
}

static void poke_add(llm_engine *e) {
    char err[LLM_ERR_LEN];
    llm_sampling_params p = greedy(4);
    llm_engine_add_request(e, "Once upon a time", NULL, 0, &p, NULL, err);
}
static void poke_abort(llm_engine *e) { llm_engine_abort(e, 424242); }

static void test_wait(void) {
    llm_engine *e = stories_engine();
    if (!e) return;
    CHECK(llm_engine_wait(e, 0) == 0 && llm_engine_wait(e, 30) == 0,
          "wait with no work: 0, at once and after 30 ms");
    int woken = wait_woken_by(e, poke_add);
    CHECK(woken, "wait(-1) wakes up when another thread adds a request");
    if (!woken) return;
    CHECK(llm_engine_wait(e, 0) == 1, "the request is work");
    run_result *r = (run_result *)calloc(1, sizeof *r);
    r->id[0] = 1; r->n_requests = 1;
    run_engine(e, r);
    CHECK(r->n_tokens[0][0] == 4 && llm_engine_wait(e, 0) == 0, "the request ran (%d tokens); no work after",
          r->n_tokens[0][0]);
    woken = wait_woken_by(e, poke_abort);
    CHECK(woken, "wait(-1) wakes up when another thread aborts");
    if (!woken) { free(r); return; }
    const llm_output *out;
    CHECK(llm_engine_step(e, &out) == 0 && llm_engine_wait(e, 0) == 0,
          "an abort of an unknown id: no output, no work");
    free(r);
    llm_engine_destroy(e);
}

/* A backend that fails on demand: the CPU's, with forward call number flaky_fail_at (from 0) failing. */
static int flaky_calls, flaky_fail_at = -1;
static int flaky_alloc_kv(llm_backend *be, int num_blocks, int block_size, char *err) {
    llm_backend *cpu = (llm_backend *)be->ctx;
    return cpu->alloc_kv(cpu, num_blocks, block_size, err);
}
/* flaky_poison: the rows the host does not read (llm_batch.host_rows) are NaN after the forward pass, as a
 * GPU leaves them unwritten: an engine that read them would fail; the sample step reads the backend's own
 * copy (flaky_rows). flaky_bad_pick: the sample step's next token is -1, as for a row that was not finite.
 * flaky_sampled counts the sample steps' rows, flaky_sampled_rows the distinct rows they read. */
static int flaky_poison, flaky_bad_pick, flaky_budget, flaky_most_tokens;
static size_t flaky_device_free; /* > 0: flaky_create takes its weights and its activations out of it */
static int64_t flaky_sampled, flaky_sampled_rows;
static float *flaky_rows;
/* flaky_touched (when set, [num_blocks]): marks every block a forward call reads or writes; flaky_engine's
 * blocks in use at that moment are counted into flaky_peak_used, in use or named into flaky_peak_held */
static uint8_t *flaky_touched;
static llm_engine *flaky_engine;
static int flaky_peak_used, flaky_peak_held;
static int flaky_forward(llm_backend *be, const llm_batch *b, float *logits, char *err) {
    llm_backend *cpu = (llm_backend *)be->ctx;
    if (flaky_calls++ == flaky_fail_at) { snprintf(err, LLM_ERR_LEN, "injected failure"); return -1; }
    int rc = cpu->forward(cpu, b, logits, err), V = ((llm_cpu *)cpu->ctx)->model->cfg.vocab_size;
    if (b->n_tokens > flaky_most_tokens) flaky_most_tokens = b->n_tokens;
    for (int q = 0; flaky_touched && q < b->n_seqs; q++) {
        int last = b->positions[b->seq_start[q + 1] - 1], bs = flaky_engine->bm.block_size;
        for (int k = 0; k <= last / bs; k++) flaky_touched[b->block_tables[q][k]] = 1;
    }
    if (flaky_touched) {
        llm_block_manager *bm = &flaky_engine->bm;
        int used = bm->num_blocks - bm->num_free_blocks, named_free = 0;
        for (int id = bm->free_head; id >= 0; id = bm->blocks[id].next_free)
            named_free += bm->blocks[id].hash != 0;
        if (used > flaky_peak_used) flaky_peak_used = used;
        if (used + named_free > flaky_peak_held) flaky_peak_held = used + named_free;
    }
    if (rc == 0 && flaky_poison && b->n_logits) {
        flaky_rows = realloc(flaky_rows, (size_t)b->n_logits * V * sizeof(float));
        memcpy(flaky_rows, logits, (size_t)b->n_logits * V * sizeof(float));
        for (int i = 0; b->host_rows && i < b->n_logits; i++)
            for (int k = 0; !b->host_rows[i] && k < V; k++) logits[(size_t)i * V + k] = NAN;
    }
    return rc;
}
static int flaky_sample_fail; /* the next sample step fails */
static int flaky_sample(llm_backend *be, llm_sample_row *rows, int n_rows, float *logits, char *err) {
    llm_backend *cpu = (llm_backend *)be->ctx;
    if (flaky_sample_fail) {
        flaky_sample_fail = 0;
        snprintf(err, LLM_ERR_LEN, "injected sample failure");
        return -1;
    }
    int rc = cpu->sample(cpu, rows, n_rows, flaky_poison ? flaky_rows : logits, err);
    flaky_sampled += n_rows;
    for (int i = 0; i < n_rows; i++) flaky_sampled_rows += i == 0 || rows[i].row != rows[i - 1].row;
    if (rc == 0 && n_rows && flaky_bad_pick) { rows[0].token = -1; flaky_bad_pick = 0; }
    return rc;
}
static void flaky_destroy(llm_backend *be) {
    llm_backend *cpu = (llm_backend *)be->ctx;
    cpu->destroy(cpu); free(be);
}
static llm_backend *flaky_create(const llm_model *m, char *err) {
    llm_backend *cpu = llm_cpu_backend_create(m, err), *be = (llm_backend *)malloc(sizeof *be);
    if (!cpu || !be) { if (cpu) cpu->destroy(cpu); free(be); return NULL; }
    *be = *cpu;
    be->name = "flaky"; be->ctx = cpu; be->default_batched_tokens = flaky_budget;
    if (flaky_device_free) { /* one device that each backend's weights take 100 MiB of, its activations 64 */
        flaky_device_free -= (size_t)100 << 20;
        be->activation_memory = (size_t)64 << 20;
        be->free_memory = flaky_device_free - be->activation_memory;
        be->default_kv_fraction = 0.5;
    }
    be->alloc_kv = flaky_alloc_kv; be->forward = flaky_forward; be->sample = flaky_sample;
    be->destroy = flaky_destroy;
    return be;
}

/* The sample step (llm_backend.sample): rows the host does not read are NaN in the engine's buffer here (a
 * GPU leaves them where they are), and every request's tokens, logprobs, top logprobs and prompt logprobs
 * are still byte for byte those of a plain CPU engine: greedy, sampled, penalized, biased under min_tokens,
 * n = 2, prompt_logprobs (scored in the step). A grammar's rows come to the host whole, and the counters say
 * exactly which rows it read. A token of -1 from the step (a row that was not finite) ends that request with
 * the error. */
#define SAMPLE_KINDS 8
typedef struct {
    char *bytes[2 * SAMPLE_KINDS][4];   /* stb_ds: each sample's tokens, logprobs, top logprobs, prompt's */
    int n_tokens[2 * SAMPLE_KINDS][4], n_prompt[2 * SAMPLE_KINDS];
} sample_log;
static void sample_log_add(char **bytes, const void *p, size_t n) {
    if (p && n) memcpy(arraddnptr(*bytes, n), p, n);
}
static void sample_step_run(const llm_engine_config *cfg, const llm_sampling_params *kinds, sample_log *log,
                            llm_engine_stats *st) {
    llm_engine *e = engine_new(cfg);
    if (!e) return;
    const char *prompts[] = {"Once upon a time", "Lily and Ben were"};
    uint64_t ids[2 * SAMPLE_KINDS];
    char err[LLM_ERR_LEN] = "";
    for (int i = 0; i < 2 * SAMPLE_KINDS; i++) {
        ids[i] = llm_engine_add_request(e, prompts[i / SAMPLE_KINDS], NULL, 0, &kinds[i % SAMPLE_KINDS], NULL,
                                        err);
        CHECK(ids[i], "sample step, request %d: %s", i, err);
    }
    const llm_output *out;
    for (int steps = 0; llm_engine_has_work(e) && steps < 500; steps++) {
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) {
            int slot = 0, k = out[i].index;
            while (slot < 2 * SAMPLE_KINDS && ids[slot] != out[i].request_id) slot++;
            CHECK(slot < 2 * SAMPLE_KINDS && k < 4 && out[i].finish_reason != LLM_FINISH_ERROR,
                  "sample step: output of request %d/%d: %s", slot, k, out[i].error ? out[i].error : "");
            if (slot == 2 * SAMPLE_KINDS || k >= 4) continue;
            char **b = &log->bytes[slot][k];
            int nt = out[i].n_tokens, top = out[i].n_top, np = out[i].n_prompt_logprobs;
            sample_log_add(b, out[i].token_ids, (size_t)nt * sizeof(int32_t));
            sample_log_add(b, out[i].logprobs, (size_t)nt * sizeof(float));
            sample_log_add(b, out[i].top_ids, (size_t)nt * top * sizeof(int32_t));
            sample_log_add(b, out[i].top_logprobs, (size_t)nt * top * sizeof(float));
            sample_log_add(b, out[i].prompt_logprobs, (size_t)np * sizeof(float));
            sample_log_add(b, out[i].prompt_ranks, (size_t)np * sizeof(int32_t));
            sample_log_add(b, out[i].prompt_top_ids, (size_t)np * out[i].n_prompt_top * sizeof(int32_t));
            sample_log_add(b, out[i].prompt_top_logprobs, (size_t)np * out[i].n_prompt_top * sizeof(float));
            log->n_tokens[slot][k] += nt;
            log->n_prompt[slot] = out[i].n_prompt_tokens;
        }
    }
    *st = llm_engine_get_stats(e);
    CHECK(all_blocks_free(e), "sample step: every block back");
    llm_engine_destroy(e);
}

static void test_sample_step(void) {
    llm_engine_config cfg = engine_config("stories260K.gguf");
    static const int32_t bias_ids[] = {100, 200, 301};
    static const float bias[] = {4.0f, -100.0f, 2.5f};
    llm_sampling_params kinds[SAMPLE_KINDS];
    for (int k = 0; k < SAMPLE_KINDS; k++) { kinds[k] = greedy(40); kinds[k].ignore_eos = 1; }
    kinds[1].logprobs = 3;                                                      /* greedy, logprobs */
    kinds[2].temperature = 0.8f; kinds[2].seed = 5; kinds[2].logprobs = 2;      /* sampled, logprobs */
    kinds[3].presence_penalty = 0.5f; kinds[3].frequency_penalty = 0.3f;        /* penalized */
    kinds[3].repetition_penalty = 1.2f;
    kinds[4].temperature = 1.0f; kinds[4].seed = 7; kinds[4].top_k = 20;       /* biased, min_tokens */
    kinds[4].top_p = 0.9f; kinds[4].min_p = 0.02f; kinds[4].min_tokens = 30; kinds[4].ignore_eos = 0;
    kinds[4].logit_bias_ids = bias_ids; kinds[4].logit_bias = bias; kinds[4].n_logit_bias = 3;
    kinds[5].temperature = 0.9f; kinds[5].seed = 11; kinds[5].n = 2;           /* two samples */
    kinds[6].grammar = "root ::= (\"yes\" | \"no\") \".\""; kinds[6].ignore_eos = 0; /* host rows */
    kinds[7].prompt_logprobs = 2; kinds[7].max_tokens = 10;                    /* scored, then sampled */
    static sample_log got, want;
    memset(&got, 0, sizeof got); memset(&want, 0, sizeof want);
    llm_engine_stats st, st_want;
    flaky_sampled = flaky_sampled_rows = 0; flaky_calls = 0; flaky_fail_at = -1; flaky_bad_pick = 0;
    flaky_poison = 1; /* off again at the end: the other tests' flaky backends leave the rows as they are */
    cfg.create_backend = flaky_create;
    sample_step_run(&cfg, kinds, &got, &st);
    cfg.create_backend = llm_cpu_backend_create;
    sample_step_run(&cfg, kinds, &want, &st_want);
    int same = 0, n_samples = 0, grammar_tokens = 0, plp_rows = 0, sampled_tokens = 0;
    for (int i = 0; i < 2 * SAMPLE_KINDS; i++)
        for (int k = 0; k < kinds[i % SAMPLE_KINDS].n; k++) {
            char *a = got.bytes[i][k], *b = want.bytes[i][k];
            same += got.n_tokens[i][k] > 0 && arrlen(a) == arrlen(b) && !memcmp(a, b, (size_t)arrlen(a));
            n_samples++;
            if (i % SAMPLE_KINDS == 6) grammar_tokens += got.n_tokens[i][k];
            else sampled_tokens += got.n_tokens[i][k];
            if (i % SAMPLE_KINDS == 7) plp_rows += got.n_prompt[i] - 1;
        }
    CHECK(same == n_samples && n_samples == 2 * (SAMPLE_KINDS + 1),
          "the sample step, rows never on the host: %d of %d samples the same tokens, logprobs and top "
          "logprobs as a plain CPU engine's", same, n_samples);
    /* the host read the grammar's rows, nothing else; the sample step took one row per other token and one
     * per scored prompt token, the two samples of n = 2 drawing their first token from one row */
    CHECK(st.host_rows == grammar_tokens && st.host_rows == st_want.host_rows && plp_rows > 0 &&
          grammar_tokens > 0 && flaky_sampled == sampled_tokens + plp_rows &&
          flaky_sampled_rows == sampled_tokens + plp_rows - 2,
          "rows the host read: %lld (the grammar's %d); the sample step's rows: %lld (%d tokens, %d prompt "
          "tokens scored), %lld distinct (want 2 fewer)", (long long)st.host_rows, grammar_tokens,
          (long long)flaky_sampled, sampled_tokens, plp_rows, (long long)flaky_sampled_rows);
    for (int i = 0; i < 2 * SAMPLE_KINDS; i++)
        for (int k = 0; k < 4; k++) { arrfree(got.bytes[i][k]); arrfree(want.bytes[i][k]); }
    /* with speculative decoding (n-gram lookup): the rows of the proposals go to the sample step too, each
     * drawn after the tokens and the proposal before it, with the generator as the draws before it left it */
    memset(&got, 0, sizeof got); memset(&want, 0, sizeof want);
    cfg.spec_tokens = 4;
    cfg.create_backend = flaky_create;
    flaky_sampled = 0;
    sample_step_run(&cfg, kinds, &got, &st);
    cfg.create_backend = llm_cpu_backend_create;
    sample_step_run(&cfg, kinds, &want, &st_want);
    cfg.spec_tokens = 0;
    same = 0; sampled_tokens = 0;
    for (int i = 0; i < 2 * SAMPLE_KINDS; i++)
        for (int k = 0; k < kinds[i % SAMPLE_KINDS].n; k++) {
            char *a = got.bytes[i][k], *b = want.bytes[i][k];
            same += got.n_tokens[i][k] > 0 && arrlen(a) == arrlen(b) && !memcmp(a, b, (size_t)arrlen(a));
            if (i % SAMPLE_KINDS != 6) sampled_tokens += got.n_tokens[i][k];
        }
    CHECK(same == n_samples && st.spec_draft_tokens > 20 && flaky_sampled > sampled_tokens,
          "the sample step with speculative decoding, rows never on the host: %d of %d samples the same as a "
          "plain CPU engine's; %lld tokens proposed, %lld rows sampled for %d tokens", same, n_samples,
          (long long)st.spec_draft_tokens, (long long)flaky_sampled, sampled_tokens);
    for (int i = 0; i < 2 * SAMPLE_KINDS; i++)
        for (int k = 0; k < 4; k++) { arrfree(got.bytes[i][k]); arrfree(want.bytes[i][k]); }
    const char *prompts[] = {"Once upon a time", "Lily and Ben were"};
    llm_sampling_params plain = greedy(40), with_logprobs = greedy(40);
    plain.ignore_eos = with_logprobs.ignore_eos = 1;
    with_logprobs.logprobs = 1;
    llm_engine *e;

    /* a token of -1 from the sample step: that request ends with the error, the other goes on to its end */
    cfg.create_backend = flaky_create;
    flaky_bad_pick = 0;
    e = engine_new(&cfg);
    if (!e) { flaky_poison = 0; return; }
    char err[LLM_ERR_LEN] = "";
    uint64_t a = llm_engine_add_request(e, prompts[0], NULL, 0, &plain, NULL, err);
    uint64_t b = llm_engine_add_request(e, prompts[1], NULL, 0, &with_logprobs, NULL, err);
    const llm_output *out;
    int a_error = 0, b_tokens = 0, steps = 0;
    while (llm_engine_has_work(e) && steps++ < 200) {
        if (steps == 5) flaky_bad_pick = 1;
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) {
            if (out[i].request_id == a && out[i].finish_reason == LLM_FINISH_ERROR && out[i].error)
                a_error += strstr(out[i].error, "not finite") != NULL;
            if (out[i].request_id == b) b_tokens += out[i].n_tokens;
        }
    }
    CHECK(a_error == 1 && b_tokens == 40 && all_blocks_free(e),
          "a token of -1 from the sample step: the request ends with the error (%d), the other gives its 40 "
          "tokens (%d), every block back", a_error, b_tokens);
    /* a sample step that fails: the requests it drew for end with its error, the one whose row the host
     * read (a grammar's) goes on, every block comes back, and the engine takes new requests */
    llm_sampling_params yes_no = greedy(40);
    yes_no.grammar = "root ::= \"yes\" (\" yes\")* \".\"";
    a = llm_engine_add_request(e, prompts[0], NULL, 0, &plain, NULL, err);
    b = llm_engine_add_request(e, prompts[1], NULL, 0, &with_logprobs, NULL, err);
    uint64_t g = llm_engine_add_request(e, prompts[1], NULL, 0, &yes_no, NULL, err);
    int failed = 0, g_done = 0;
    for (steps = 0; llm_engine_has_work(e) && steps < 200; steps++) {
        if (steps == 3) flaky_sample_fail = 1;
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) {
            if (out[i].finish_reason == LLM_FINISH_ERROR && out[i].error &&
                strstr(out[i].error, "injected sample failure"))
                failed += out[i].request_id == a || out[i].request_id == b ? 1 : 100;
            if (out[i].request_id == g && (out[i].finish_reason == LLM_FINISH_STOP ||
                                           out[i].finish_reason == LLM_FINISH_LENGTH)) g_done = 1;
        }
    }
    uint64_t c = llm_engine_add_request(e, prompts[0], NULL, 0, &plain, NULL, err);
    int c_tokens = 0;
    for (steps = 0; llm_engine_has_work(e) && steps < 200; steps++) {
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) if (out[i].request_id == c) c_tokens += out[i].n_tokens;
    }
    CHECK(failed == 2 && g_done && c_tokens == 40 && all_blocks_free(e), "a sample step that fails: %d of "
          "the 2 requests it drew for end with its error (100s: others), the grammar's request finishes "
          "(%d), a new one gives its 40 tokens (%d), every block back", failed, g_done, c_tokens);
    llm_engine_destroy(e);
    flaky_poison = 0; flaky_sample_fail = 0;
}

/* The step's token budget is the backend's when the config gives none (the CPU's 2048; a GPU's larger), and
 * the config's when it gives one: a long prompt is cut into steps of exactly that many tokens. */
static void test_backend_budget(void) {
    char prompt[4096] = "";
    for (int i = 0; i < 60; i++) strcat(prompt, "Once upon a time, ");
    llm_engine_config cfg = engine_config("stories260K.gguf");
    llm_engine *e = engine_new(&cfg);
    if (!e) return;
    CHECK(e->sched.max_num_batched_tokens == 2048, "the CPU's budget: %d", e->sched.max_num_batched_tokens);
    llm_engine_destroy(e);
    for (int given = 0; given < 2; given++) {
        cfg.create_backend = flaky_create;
        cfg.max_num_batched_tokens = given ? 64 : 0;
        flaky_budget = 100; flaky_most_tokens = 0; flaky_calls = 0; flaky_fail_at = -1;
        e = engine_new(&cfg);
        flaky_budget = 0; /* read by flaky_create only: the other tests' flaky backends take the CPU's */
        if (!e) return;
        static run_result r;
        memset(&r, 0, sizeof r);
        llm_sampling_params p = greedy(4);
        run_add(e, &r, prompt, NULL, 0, &p);
        run_engine(e, &r);
        int want = given ? 64 : 100;
        CHECK(flaky_most_tokens == want && r.n_tokens[0][0] == 4 && all_blocks_free(e),
              "budget %s: the largest step had %d tokens, want %d",
              given ? "given (64)" : "the backend's (100)", flaky_most_tokens, want);
        llm_engine_destroy(e);
    }
}

/* A draft model on the same device as the model: the KV pool's share is of what both models' weights and
 * both models' activations leave (here 1 GiB less 2 x 100 MiB of weights, less 2 x 64 MiB), in blocks that
 * hold the model's K/V and the draft's. */
static void test_draft_pool_memory(void) {
    llm_engine_config cfg = engine_config("stories260K.gguf");
    cfg.create_backend = flaky_create; cfg.spec_tokens = 3;
    cfg.spec_model_path = model_path("stories260K.gguf");
    flaky_device_free = (size_t)1 << 30; /* no step runs: flaky_calls and flaky_fail_at play no part */
    llm_engine *e = engine_new(&cfg);
    flaky_device_free = 0; /* read by flaky_create only */
    if (!e) return;
    size_t block_bytes = 2 * llm_kv_bytes_per_block(&e->model.cfg, cfg.block_size,
                                                    e->backend->kv_head_bytes);
    size_t want = (size_t)(0.5 * (double)(((size_t)1 << 30) - ((size_t)328 << 20))) / block_bytes;
    CHECK(e->bm.num_blocks == (int)want, "a draft on the same device: %d blocks of %zu bytes, want %zu",
          e->bm.num_blocks, block_bytes, want);
    llm_engine_destroy(e);
}

/* The KV pool does not creep: a freed block with nothing cached in it is the next one handed out, so a long
 * run touches only as many blocks as were ever in use at once (plus those that hold cached prefixes), not,
 * block by block, the whole pool (whose pages the OS then keeps resident: a server's memory kept growing). */
static void test_pool_reuse(void) {
    for (int caching = 0; caching < 2; caching++) {
        llm_engine_config cfg = engine_config("stories260K.gguf");
        cfg.create_backend = flaky_create;
        cfg.max_num_seqs = 4; cfg.num_blocks = 512; cfg.enable_prefix_caching = caching;
        flaky_calls = 0; flaky_fail_at = -1; flaky_peak_used = flaky_peak_held = 0;
        llm_engine *e = flaky_engine = engine_new(&cfg);
        if (!e) return;
        uint8_t *touched = flaky_touched = calloc(512, 1);
        static run_result r;
        memset(&r, 0, sizeof r);
        const char *starts[] = {"Once upon a time", "Lily and Ben were", "The cat", "One day, a little girl"};
        for (int i = 0; i < 24; i++) {
            char prompt[512];
            snprintf(prompt, sizeof prompt, "%s", starts[i % 4]);
            for (int k = 0; k < i % 5; k++) strcat(prompt, " and they played in the park");
            llm_sampling_params p = greedy(20 + 7 * (i % 3));
            p.ignore_eos = 1;
            run_add(e, &r, prompt, NULL, 0, &p);
        }
        run_engine(e, &r);
        int n_touched = 0;
        for (int i = 0; i < 512; i++) n_touched += touched[i];
        int bound = caching ? flaky_peak_held : flaky_peak_used;
        CHECK(n_touched > 0 && n_touched <= bound && all_blocks_free(e),
              "prefix caching %s: 24 requests, 4 at a time, touched %d blocks of 512; at most %d were %s at "
              "once", caching ? "on" : "off", n_touched, bound, caching ? "in use or cached" : "in use");
        flaky_touched = NULL; flaky_engine = NULL;
        free(touched);
        llm_engine_destroy(e);
    }
}

/* A build run on a CPU without what it was built for is refused by name, not killed by an illegal
 * instruction: this CPU runs this build (nothing missing), and a CPU lacking any one feature the compiler was
 * told of (its own macros are the oracle) is named; one the build does not use is not asked about */
static const char *cpu_denied;
static int cpu_has_but_denied(const char *feature) {
    return strcmp(feature, cpu_denied) && llm_cpu_supports(feature);
}
/* The CPU backend's kernels by what the compiler was told, which the backend must name (its kernels) */
static const char *cpu_kernels_built(void) {
    const char *kernels = "plain C";
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(LLM_NO_SIMD)
    kernels = "avx2";
#if defined(__AVX512F__)
    kernels = "avx512";
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    kernels = "avx512vnni";
#endif
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD) && !defined(LLM_NO_SIMD)
    kernels = "neon";
#endif
    return kernels;
}

/* A distribution build's choice of CPU variant (llm_cpu_pick_variant, make llm-dist), on made-up CPUs: the
 * best the CPU has, none when it has none (the program's own plain C), one named by LLM_CPU_VARIANT only when
 * the CPU has what it needs, and an unknown name refused; tools/dist_check.sh runs the real build */
static const char *cpu_made_up; /* the features of a made-up CPU, each between spaces */
static int cpu_made_up_has(const char *feature) {
    char word[32];
    snprintf(word, sizeof word, " %s ", feature);
    return strstr(cpu_made_up, word) != NULL;
}
static void cpu_variants_check(void) {
    static const char *const vnni_needs[] = {"avx2", "avx512f", "avx512vnni", NULL};
    static const char *const avx512_needs[] = {"avx2", "avx512f", NULL}, *const avx2_needs[] = {"avx2", NULL};
    const llm_cpu_variant vnni = {"avx512vnni", vnni_needs, NULL}, avx512 = {"avx512", avx512_needs, NULL},
                          avx2 = {"avx2", avx2_needs, NULL};
    const llm_cpu_variant *const variants[] = {&vnni, &avx512, &avx2, NULL};
    static const struct { const char *cpu, *wanted; int pick; const char *error; } cases[] = {
        {" avx2 avx512f avx512vnni ", NULL, 0, NULL},
        {" avx2 avx512f ", NULL, 1, NULL},
        {" avx2 avx512vnni ", "", 2, NULL}, /* "" is no name */
        {" sse4_2 ", NULL, -1, NULL},
        {" avx2 avx512f avx512vnni ", "avx2", 2, NULL},
        {" avx2 ", "avx512vnni", -2, "LLM_CPU_VARIANT=avx512vnni needs a CPU with avx512f, which this one "
                                     "lacks"},
        {" avx2 avx512f ", "avx512vnni", -2, "needs a CPU with avx512vnni"},
        {" avx2 ", "sse9", -2, "LLM_CPU_VARIANT=sse9 is none of this build's CPU variants (avx512vnni, "
                               "avx512, avx2)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[LLM_ERR_LEN] = "";
        cpu_made_up = cases[i].cpu;
        int pick = llm_cpu_pick_variant(variants, cases[i].wanted, cpu_made_up_has, err);
        CHECK(pick == cases[i].pick && (cases[i].error ? strstr(err, cases[i].error) != NULL : !err[0]),
              "a CPU with%s, LLM_CPU_VARIANT %s: picked %d (%s), want %d (%s)", cases[i].cpu,
              cases[i].wanted ? cases[i].wanted : "unset", pick, err, cases[i].pick,
              cases[i].error ? cases[i].error : "no error");
    }
}

static void test_cpu_features(void) {
    const char *missing = llm_cpu_missing_feature(llm_cpu_built_for, llm_cpu_supports);
    CHECK(!missing, "this CPU runs this build: %s missing", missing ? missing : "");
    static const struct { const char *name; int built_for; } features[] = {
        {"avx2", 0
#if defined(__x86_64__) && defined(__AVX2__)
                 + 1
#endif
        },
        {"fma", 0
#if defined(__x86_64__) && defined(__FMA__)
                + 1
#endif
        },
        {"avx512f", 0
#if defined(__x86_64__) && defined(__AVX512F__)
                    + 1
#endif
        },
        {"avx512vnni", 0
#if defined(__x86_64__) && defined(__AVX512VNNI__)
                       + 1
#endif
        },
        {"asimddp", 0
#if defined(__aarch64__) && defined(__linux__) && defined(__ARM_FEATURE_DOTPROD)
                    + 1
#endif
        },
        {"sse4_2", 0}, /* asked about by no build: never named */
    };
    char named[80] = "";
    for (size_t i = 0; i < sizeof features / sizeof features[0]; i++) {
        cpu_denied = features[i].name;
        const char *m = llm_cpu_missing_feature(llm_cpu_built_for, cpu_has_but_denied);
        CHECK(features[i].built_for ? m && !strcmp(m, features[i].name) : !m,
              "a CPU without %s (the build %s it): %s named", features[i].name,
              features[i].built_for ? "uses" : "does not use", m ? m : "nothing");
        if (m) snprintf(named + strlen(named), sizeof named - strlen(named), " %s", m);
    }
    printf("  a CPU without one of these is refused by this build:%s\n", named[0] ? named : " (none)");
    /* a CPU backend sets how far ahead the products prefetch the weights: AMD's CPUs further */
    llm_model m;
    char err[LLM_ERR_LEN];
    if (llm_model_load(&m, model_path("stories260K.gguf"), err) != 0) { CHECK(0, "load: %s", err); return; }
    for (int k = 0; k < 4; k++) __atomic_store_n(&llm_prefetch_ahead[k / 2][k % 2], 0, __ATOMIC_RELAXED);
    int amd = 0;
#if defined(__x86_64__)
    amd = __builtin_cpu_is("amd");
#endif
    /* the wrong count, not 0: where no backend starts, the tests after this one still decode */
    __atomic_store_n(&llm_half_decode_rows, amd ? 2 : 1, __ATOMIC_RELAXED);
    llm_backend *be = llm_cpu_backend_create(&m, err);
    /* [quantized, f16/bf16][to L1, to L2]: Intel's L2 prefetches 4 times as far as its L1 ones */
    int want[2][2] = {{amd ? 8192 : 2048, 8192}, {amd ? 8192 : 4096, amd ? 8192 : 16384}};
#if !defined(__x86_64__)
    memset(want, 0, sizeof want); /* set only on x86-64 (NEON's kernels prefetch 2 kB ahead as written) */
#endif
    CHECK(be && !memcmp(llm_prefetch_ahead, want, sizeof want),
          "prefetch distances %d, %d (quantized rows) and %d, %d bytes (f16) on this %s CPU, want %d, %d and "
          "%d, %d", llm_prefetch_ahead[0][0], llm_prefetch_ahead[0][1], llm_prefetch_ahead[1][0],
          llm_prefetch_ahead[1][1], amd ? "AMD" : "non-AMD", want[0][0], want[0][1], want[1][0], want[1][1]);
    /* and how many f16/bf16 rows a decode step's call reads: AMD's one, the others two */
    int want_rows = amd ? 1 : 2;
    CHECK(be && llm_half_decode_rows == want_rows, "f16 decode rows a call %d on this %s CPU, want %d",
          llm_half_decode_rows, amd ? "AMD" : "non-AMD", want_rows);
    /* the backend names its kernels by what the compiler was told (the load line shows it) */
    const char *kernels = cpu_kernels_built();
    CHECK(be && be->kernels && !strcmp(be->kernels, kernels), "the CPU backend's kernels: %s, want %s",
          be && be->kernels ? be->kernels : "(none)", kernels);
    if (be) be->destroy(be);
    llm_model_free(&m);
    cpu_variants_check();
}

static void test_backend_errors(void) {
    int n_cases;
    ref_case *cases = stories_cases(&n_cases);
    llm_engine_config cfg = engine_config("stories260K.gguf");
    cfg.create_backend = flaky_create;
    flaky_calls = 0; flaky_fail_at = -1;
    llm_engine *e = engine_new(&cfg);
    if (!e || n_cases < 1) { free(cases); llm_engine_destroy(e); return; }
    char err[LLM_ERR_LEN] = "", tag_a, tag_b, tag_c;
    llm_sampling_params p = greedy(200);
    p.ignore_eos = 1;
    uint64_t a = llm_engine_add_request(e, "Once upon a time", NULL, 0, &p, &tag_a, err);
    uint64_t b = llm_engine_add_request(e, "Lily and Ben were", NULL, 0, &p, &tag_b, err);
    const llm_output *out;
    for (int i = 0; i < 5; i++) llm_engine_step(e, &out);
    /* in one step: a is aborted, c (n = 3) arrives and is admitted, and the forward pass fails */
    llm_engine_abort(e, a);
    llm_sampling_params pc = llm_sampling_defaults();
    pc.n = 3; pc.seed = 9; pc.max_tokens = 10;
    uint64_t c = llm_engine_add_request(e, "The cat", NULL, 0, &pc, &tag_c, err);
    flaky_fail_at = flaky_calls;
    int n = llm_engine_step(e, &out), aborted = 0, failed_b = 0, failed_c = 0, samples_c = 0, other = 0;
    for (int i = 0; i < n; i++) {
        int error = out[i].finish_reason == LLM_FINISH_ERROR && out[i].error &&
                    strstr(out[i].error, "injected");
        if (out[i].request_id == a && out[i].user == &tag_a)
            aborted += out[i].finish_reason == LLM_FINISH_ABORT;
        else if (out[i].request_id == b && out[i].user == &tag_b) failed_b += error;
        else if (out[i].request_id == c && out[i].user == &tag_c) {
            failed_c += error;
            samples_c |= 1 << out[i].index;
        } else other++;
    }
    CHECK(n == 5 && aborted == 1 && failed_b == 1 && failed_c == 3 && samples_c == 7 && other == 0,
          "failed step: %d outputs: the abort (%d), b's error (%d), "
          "an error for each of c's 3 samples (%d, mask %d)",
          n, aborted, failed_b, failed_c, samples_c);
    CHECK(all_blocks_free(e) && llm_engine_check_blocks(e, err) == 0 && !llm_engine_has_work(e),
          "failed step: every block back, nothing left to do (%s)", err);
    llm_engine_destroy(e);

    /* a request that was not in the failed step is untouched, and the engine goes on:
     * it gives llama.cpp's tokens */
    cfg.max_num_seqs = 2;
    flaky_calls = 0; flaky_fail_at = -1;
    e = engine_new(&cfg);
    if (!e) { free(cases); return; }
    run_result *r = (run_result *)calloc(1, sizeof *r);
    a = llm_engine_add_request(e, "Once upon a time", NULL, 0, &p, NULL, err);
    b = llm_engine_add_request(e, "Lily and Ben were", NULL, 0, &p, NULL, err);
    llm_sampling_params pd = greedy(cases[0].max_tokens);
    run_add(e, r, cases[0].prompt, NULL, 0, &pd);   /* waits: max_num_seqs is 2 */
    flaky_fail_at = 3;
    int errors = 0, steps = 0;
    while (flaky_calls <= flaky_fail_at && steps++ < 10) {
        n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++)
            errors += out[i].finish_reason == LLM_FINISH_ERROR && out[i].request_id != r->id[0];
    }
    llm_engine_stats st = llm_engine_get_stats(e);
    CHECK(errors == 2 && st.running == 0 && st.waiting == 1,
          "the running two failed (%d), the third still waits (%d)", errors, st.waiting);
    run_engine(e, r);
    check_reference(r, 0, &cases[0], "after a failed step");
    CHECK(all_blocks_free(e), "after a failed step: blocks back");
    llm_engine_destroy(e);
    flaky_fail_at = -1;
    free(r); free(cases);
}

/* -----------------------------------------------------------------------------------------------------------
 * The llm command: exact stdout, errors and exit codes
 * -------------------------------------------------------------------------------------------------------- */
static char *run_command(const char *cmd, int *status) {
    FILE *f = popen(cmd, "r");
    if (!f) { *status = -1; return NULL; }
    /* read to the end, whatever its length: a reader that stops early makes the writer fail (curl's
     * exit 23) */
    size_t cap = 1 << 16, n = 0, got;
    char *buf = (char *)malloc(cap);
    while ((got = fread(buf + n, 1, cap - 1 - n, f)) > 0) {
        n += got;
        if (n + 1 == cap) buf = (char *)realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

/* -----------------------------------------------------------------------------------------------------------
 * Grammars: the GBNF parser and matcher against Python's own matchers (tools/grammar_oracle.py), the token
 * masks against the one-token check, and generation under a grammar (n > 1, preemption, the end)
 * -------------------------------------------------------------------------------------------------------- */
#define JSON_GBNF \
    "root ::= ws value ws\n" \
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n" \
    "object ::= \"{\" ws ( string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)* )? \"}\"\n" \
    "array ::= \"[\" ws ( value ws (\",\" ws value ws)* )? \"]\"\n" \
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* " \
    "\"\\\"\"\n" \
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n" \
    "ws ::= [ \\t\\n\\r]*   # RFC 8259's whitespace, so that json.loads is the oracle\n"
/* JSON objects as a schema's grammar writes them: whitespace bounded, so that a small model cannot run on
 * in spaces */
#define JSON_OBJECT_GBNF \
    "root ::= object\n" \
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n" \
    "object ::= \"{\" ws ( string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)* )? \"}\"\n" \
    "array ::= \"[\" ws ( value ws (\",\" ws value ws)* )? \"]\"\n" \
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* " \
    "\"\\\"\"\n" \
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n" \
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"

typedef struct {
    const char *name, *gbnf;
    const char *oracle, *pattern;   /* the oracle's kind ("regex", "json", "arith") and, for regex, the same
                                     * language as a regular expression; NULL: the lists below only */
    const char *alphabet;           /* what random strings are made of */
    const char *accept[8], *prefix[8], *reject[8];
} grammar_case;

static const grammar_case grammar_cases[] = {
    {"JSON", JSON_GBNF, "json", "", "{}[]\",:0123456789.-eE+ \\u\nabtrulfsn",
     {"{}", " [1, 2.5e-3, \"a\\u00e9\\n\"] ", "{\"k\": {\"x\": [true, false, null]}}", "-0",
      "\"\xc3\xa9\xe2\x82\xac\""},
     {"{", "[1,", "{\"a\":", "\"\\u00", "tr", "-", "1.", ""},
     {"{,}", "[1,]", "01", "\"a\nb\"", "{\"a\" 1}", "1.e", "nul1", "'a'"}},
    {"arithmetic", "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\n"
     "term ::= factor ((\"*\" | \"/\") factor)*\n"
     "factor ::= number | \"(\" expr \")\"\nnumber ::= \"0\"+ | [1-9] [0-9]*\n", "arith", "",
     "0123456789+-*/()",
     {"1", "1+2*3", "(1+2)*3", "((7))/00", "10-(2*(3+4))"},
     {"(", "1+", "((1+2)*", "12*(", "", "(1"},
     {"+1", "1++2", "()", "1)", "01", "1 + 2"}},
    {"list", "root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [a-z]+ | [0-9]{1,3}\n", "regex",
     "\\[(?:(?:[a-z]+|[0-9]{1,3})(?:,(?:[a-z]+|[0-9]{1,3}))*)?\\]", "[],ab0129",
     {"[]", "[a]", "[abc,12,z]", "[999,a,b]"}, {"[", "[ab", "[1,", "[123"}, {"]", "[,]", "[1234]", "[a,]"}},
    {"C-like statements",
     "root ::= stmt+\nstmt ::= ws (decl | assign | ifs | block) ws\n"
     "decl ::= \"int \" id (\"=\" expr)? \";\"\n"
     "assign ::= id \"=\" expr \";\"\nifs ::= \"if(\" expr \")\" stmt (\"else \" stmt)?\n"
     "block ::= \"{\" stmt* \"}\"\nexpr ::= term ((\"+\" | \"-\" | \"<\" | \"==\") term)*\n"
     "term ::= id | [0-9]+ | \"(\" expr \")\"\nid ::= [a-z_] [a-z0-9_]*\nws ::= [ \\n]*\n", NULL, NULL, NULL,
     {"int x=1;", "x=x+1;", "if(x<3){y=2;}else z=1;", "{}", " int a; {b=(a+1)==2;}\n", "{{}{}}"},
     {"int", "if(x<3)", "{x=1;", "x=(1", "x=1"}, {"int 1x;", "x=;", "if x<3 y=1;", "}", "else y=1;"}},
    {"nested repetition", "root ::= (\"a\" [bc]{1,3} \"d\"?){2,4}\n", "regex", "(?:a[bc]{1,3}d?){2,4}",
     "abcd",
     {"abab", "abcdacbd", "abbbdacab", "abac"}, {"a", "ab", "abcd", ""},
     {"abbbbab", "aab", "abababababab", "b", "abdd"}},
    {"classes and escapes", "root ::= [^a-z\\n]+ \"\\xe9\" [\\u03b1-\\u03c9]* (\"\\t\" | [\\]\\[\\-])?\n",
     "regex", "[^a-z\\n]+\u00e9[\u03b1-\u03c9]*(?:\t|[\\]\\[\\-])?", "aZ9 \n"
     "\xc3\xa9\xce\xb1\xcf\x89\t[]-\xe2\x82\xac",
     {"X\xc3\xa9", "9 \xe2\x82\xac\xc3\xa9\xce\xb1\xcf\x89", "Z\xc3\xa9\t", "Z\xc3\xa9]"},
     {"Z", "Z\xc3", "\xc3\xa9", "Z\xc3\xa9\xcf"},
     {"a\xc3\xa9", "Z\n\xc3\xa9", "Z\xc3\xa9\xce\xb1" "a", "Z\xc3\xa9\xce\xb1\n"}},
    {"any character", "root ::= \"<\" .{1,5} \">\" # any character, newlines too\n", "regex", "(?s)<.{1,5}>",
     "<>a\n\xc3\xa9",
     {"<a>", "<\n\n>", "<>>>>>", "<\xc3\xa9\xc3\xa9>"}, {"<", "<abcde", "<>"},
     {"<abcdef>", "a", "<a>bcdef>"}},
    {"empty alternatives and comments",
     "# a comment\nroot ::= (\"x\" | ) \"y\" |  # x is optional\n  \"z\"{0,2}\n", "regex", "x?y|z{0,2}",
     "xyz",
     {"y", "xy", "", "z", "zz"}, {"x"}, {"zzz", "xx", "yx"}},
    /* an empty text reached by 40 ways at each of six places: 40^6 expansions, unless the matcher expands
     * what it reached once (fuzz/fuzz_grammar found a grammar like it) */
    {"many empty alternatives", "root ::= (||||||||||||||||||||||||||||||||||||||||\"a\" [bc]{0,3} \"d\"){1,"
     "6}\n", "regex", "(?:a[bc]{0,3}d){0,6}", "abcd", {"", "ad", "abcdad", "adadadadadad"},
     {"a", "abc", "adab"},
     {"d", "abcbcd", "adadadadadadad", "aa"}},
    /* no GBNF: the regular expression's, from llm_regex_to_grammar. Repetitions of what can be empty, which
     * GBNF writes without left recursion (fuzz/fuzz_grammar found the first one) */
    {"regex: repeated parts that can be empty", NULL, "regex", "(a|)*b(c?d?)+(e?){2,}f(|g|h?)*", "abcdefgh",
     {"bf", "aabcdddeef", "bfghg", "abdcf"}, {"", "a", "ab", "bcd"}, {"f", "ba", "bfa", "bfe"}},
    {"regex: nested ones, and nothing repeated", NULL, "regex", "((x?)*y?)*z|(a{0})*b|(c?){0,3}d*", "xyzabcd",
     {"z", "xxyz", "yyxz", "b", "ccdd"}, {"x", "xy"}, {"zz", "zx", "ab", "cccc", "bd"}},
};

/* What the matcher says of a text from the start: "accept" (whole), "prefix" (it may go on to be) or
 * "reject" */
static const char *grammar_verdict(const llm_grammar *g, const char *text, size_t n) {
    llm_grammar_state *st = llm_grammar_start(g);
    const char *v = !st ? "out of memory" : llm_grammar_accept(st, text, (int)n) != 0 ? "reject" :
                    llm_grammar_can_end(st) ? "accept" : "prefix";
    llm_grammar_state_free(st);
    return v;
}

static void json_line_str(FILE *f, const char *s, size_t n) { /* a JSON string (the text is UTF-8 here) */
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void test_grammar_gbnf(void) {
    char err[LLM_ERR_LEN], path[] = "/tmp/llm-test-grammar-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(f != NULL, "a temporary file for the oracle's cases");
    if (!f) return;
    uint64_t rng = 42;
    int n_oracle = 0;
    for (size_t c = 0; c < sizeof grammar_cases / sizeof *grammar_cases; c++) {
        const grammar_case *gc = &grammar_cases[c];
        char *made = gc->gbnf ? NULL : llm_regex_to_grammar(gc->pattern, err);
        llm_grammar *g = gc->gbnf || made ? llm_grammar_parse(gc->gbnf ? gc->gbnf : made, err) : NULL;
        CHECK(g != NULL, "grammar %s: %s", gc->name, err);
        free(made);
        if (!g) continue;
        const char *const *lists[3] = {gc->accept, gc->prefix, gc->reject};
        const char *want[3] = {"accept", "prefix", "reject"};
        for (int l = 0; l < 3; l++)
            for (int i = 0; i < 8 && lists[l][i]; i++) {
                const char *v = grammar_verdict(g, lists[l][i], strlen(lists[l][i]));
                CHECK(!strcmp(v, want[l]), "grammar %s on \"%s\": %s, not %s", gc->name, lists[l][i], v,
                      want[l]);
            }
        if (!gc->oracle) { llm_grammar_free(g); continue; }
        /* random texts over the alphabet (by characters), and the examples with one character changed */
        const char *alpha = gc->alphabet;
        int n_chars = 0, starts[64];
        for (int i = 0; alpha[i] && n_chars < 64;) {
            int k = llm_utf8_check((const unsigned char *)alpha + i, strlen(alpha + i));
            starts[n_chars++] = i;
            i += k > 0 ? k : 1;
        }
        starts[n_chars] = (int)strlen(alpha);
        for (int t = 0; t < 400; t++) {
            char text[64];
            size_t n = 0;
            const char *base = t % 2 ? gc->accept[llm_splitmix64(&rng) % 4] : NULL;
            if (base) { n = strlen(base); memcpy(text, base, n); }
            int edits = base ? 1 : 1 + (int)(llm_splitmix64(&rng) % 12);
            for (int k = 0; k < edits; k++) {
                int ch = (int)(llm_splitmix64(&rng) % (uint64_t)n_chars), len = starts[ch + 1] - starts[ch];
                size_t at = n ? (size_t)(llm_splitmix64(&rng) % (n + 1)) : 0;
                if (!base) at = n; /* random texts grow at the end */
                if (base && llm_splitmix64(&rng) % 3 == 0 && at < n) {
                    memmove(text + at, text + at + 1, n - at - 1); n--;
                }
                else if (n + (size_t)len < sizeof text) {
                    memmove(text + at + len, text + at, n - at);
                    memcpy(text + at, alpha + starts[ch], (size_t)len);
                    n += (size_t)len;
                }
            }
            int whole = 1; /* an edit may have split a character */
            for (size_t i = 0; i < n && whole;) {
                int k = llm_utf8_check((const unsigned char *)text + i, n - i);
                whole = k > 0; i += k > 0 ? (size_t)k : 0;
            }
            if (!whole) continue;
            fprintf(f, "[\"%s\", ", gc->oracle);
            json_line_str(f, gc->pattern, strlen(gc->pattern));
            fputs(", ", f);
            json_line_str(f, text, n);
            fprintf(f, ", \"%s\"]\n", grammar_verdict(g, text, n));
            n_oracle++;
        }
        llm_grammar_free(g);
    }
    fclose(f);
    char cmd[256];
    snprintf(cmd, sizeof cmd, ".venv/bin/python tools/grammar_oracle.py %s 2>&1", path);
    int status;
    char *out = run_command(cmd, &status);
    CHECK(out && status == 0 && n_oracle > 2000, "the grammars against Python's matchers (%d texts): %s",
          n_oracle, out ? out : "no output");
    free(out);
    unlink(path);
    /* UTF-8 split across tokens: a character begun is taken only when some next bytes can complete it
     * validly (no surrogates, no overlong forms, nothing past U+10FFFF), so no text can strand the grammar */
    llm_grammar *any = llm_grammar_parse("root ::= .*", err);
    static const struct { const char *bytes; int ok; } utf8[] = {
        {"\xed\x9f", 1}, {"\xed\xa0", 0}, {"\xe0\xa0", 1}, {"\xe0\x9f", 0}, {"\xf0\x90", 1}, {"\xf0\x8f", 0},
        {"\xf4\x8f", 1}, {"\xf4\x90", 0}, {"\xc2", 1}, {"\xc1", 0}, {"\x80", 0}, {"\xe2\x82\xac", 1}};
    for (size_t i = 0; any && i < sizeof utf8 / sizeof *utf8; i++) {
        const char *v = grammar_verdict(any, utf8[i].bytes, strlen(utf8[i].bytes));
        CHECK(!strcmp(v, "reject") == !utf8[i].ok, "UTF-8 bytes %zu: %s", i, v);
    }
    llm_grammar_free(any);
    /* grammars that cannot be used, each refused with where and why */
    static const struct { const char *gbnf, *why; } bad[] = {
        {"root ::= a", "rule a is used but not defined"}, {"a ::= \"x\"", "no rule named root"},
        {"root ::= root \"x\" | \"y\"", "rule root is left-recursive"},
        {"root ::= a \"x\"\na ::= \"\" | root", "left-recursive"},
        {"root ::= \"abc", "ends inside a literal"},
        {"root ::= \"\\q\"", "unknown escape"}, {"root ::= []", "empty character class"},
        {"root ::= \"a\"{3,1}", "n < m"}, {"root ::= *", "nothing before it"},
        {"root ::= (\"a\"", "')' is missing"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"}, {"root = \"a\"", "'::=' is expected at line 1"},
        {"root ::= \"a\"{20000}", "over 10000"}, {"root ::= \"a\" )", "unexpected character"},
        {"root ::= [\\x4]", "hex digits"}, {"", "no rule named root"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        llm_grammar *g = llm_grammar_parse(bad[i].gbnf, err);
        CHECK(!g && strstr(err, bad[i].why), "grammar \"%s\": refused with \"%s\", got \"%s\"", bad[i].gbnf,
              bad[i].why, g ? "(parsed)" : err);
        llm_grammar_free(g);
    }
}

/* For states reached by random allowed tokens, the mask (through the trie, or from the cache) and the
 * one-token check agree on every token of the vocabulary, and the ends of generation are allowed exactly
 * where the text is whole. On SmolLM2's vocabulary (49k) and Qwen2's (152k, the random model). */
static void test_grammar_masks(void) {
    static const char *models[2] = {CHAT_MODEL, NULL};
    char err[LLM_ERR_LEN];
    for (int mi = 0; mi < 2; mi++) {
        const char *path = models[mi] ? models[mi] : model_path("random-qwen2-bias.gguf");
        llm_model m;
        if (llm_model_load(&m, path, err) != 0) { CHECK(0, "load %s: %s", path, err); continue; }
        llm_token_trie *tt = llm_token_trie_build(m.tok, err);
        CHECK(tt != NULL, "the trie of %s: %s", path, err);
        int V = llm_tokenizer_n_vocab(m.tok);
        uint8_t *mask = (uint8_t *)malloc((size_t)V / 8 + 1), *again = (uint8_t *)malloc((size_t)V / 8 + 1);
        /* JSON; a C-like language; classes that take every character past ASCII ([^a-z\n]) or tell them apart
         * ([\u03b1-\u03c9], "\xe9"); any character; never two Greek or CJK letters in a row (the walk steps
         * such characters one by one: one for all of them would let the vocabulary's CJK words through) */
        const char *gbnfs[5] = {JSON_GBNF, grammar_cases[3].gbnf, grammar_cases[5].gbnf,
                                grammar_cases[6].gbnf, "root ::= ([\\u03b1-\\u03c9\\u4e00-\\u9fff] "
                                "[^\\u03b1-\\u03c9\\u4e00-\\u9fff] | [^\\u03b1-\\u03c9\\u4e00-\\u9fff])*"};
        uint64_t rng = 7 + (uint64_t)mi;
        for (int gi = 0; tt && gi < 5; gi++) {
            llm_grammar *g = llm_grammar_parse(gbnfs[gi], err);
            llm_grammar_state *st = g ? llm_grammar_start(g) : NULL;
            CHECK(st != NULL, "grammar %d: %s", gi, g ? "no start" : err);
            int steps = mi ? 5 : 12, disagree = 0, checked = 0, eog_wrong = 0, cache_differs = 0, done = 0;
            for (int s = 0; st && s < steps; s++) {
                int n = llm_grammar_mask(st, tt, mask), counted = 0, can_end = llm_grammar_can_end(st);
                int n2 = llm_grammar_mask(st, tt, again); /* the same state again: from the cache */
                cache_differs += n2 != n || memcmp(mask, again, ((size_t)V + 7) / 8) != 0;
                for (int t = 0; t < V; t++) {
                    int bit = mask[t >> 3] >> (t & 7) & 1;
                    counted += bit;
                    disagree += bit != llm_grammar_allows(st, tt, t);
                    if (llm_tokenizer_is_eog(m.tok, t)) eog_wrong += bit != can_end;
                }
                checked++;
                CHECK(counted == n, "mask count %d, bits %d", n, counted);
                /* on: a random allowed token that adds text */
                int32_t pick = -1;
                /* the first allowed from there */
                int32_t from = (int32_t)(llm_splitmix64(&rng) % (uint64_t)V);
                for (int32_t k = 0; k < V && pick < 0; k++) {
                    int32_t t = (from + k) % V;
                    if (mask[t >> 3] >> (t & 7) & 1 && !llm_tokenizer_is_eog(m.tok, t)) pick = t;
                }
                if (pick < 0) { done = llm_grammar_done(st); break; } /* only the end is left */
                char piece[256];
                int len = llm_tokenizer_piece(m.tok, pick, 0, piece, sizeof piece);
                CHECK(len > 0 && len <= (int)sizeof piece && llm_grammar_accept(st, piece, len) == 0,
                      "an allowed token (%d) is accepted", pick);
            }
            CHECK((checked == steps || (done && checked > 1)) && disagree == 0 && eog_wrong == 0 &&
                  cache_differs == 0,
                  "%s, grammar %d: mask and one-token check agree on %d states x %d tokens (%d disagree, %d "
                  "wrong about the end, %d cached masks differ)", path, gi, checked, V, disagree, eog_wrong,
                  cache_differs);
            llm_grammar_state_free(st); llm_grammar_free(g);
        }
        /* past the matcher's limits (nesting 4096 deep): a mask is refused (the engine finishes that sequence
         * with an error), not built wrong */
        llm_grammar *g = llm_grammar_parse("root ::= \"(\" root \")\" | \"x\"", err);
        llm_grammar_state *st = g ? llm_grammar_start(g) : NULL;
        int depth = 0;
        while (st && depth < 5000 && llm_grammar_accept(st, "(", 1) == 0) depth++;
        CHECK(tt && st && depth > 1000 && depth < 5000 && llm_grammar_mask(st, tt, mask) == -1 &&
              llm_grammar_accept(st, "x)", 2) == 0, "nesting past the limit: accepted %d deep, then no mask",
              depth);
        llm_grammar_state_free(st); llm_grammar_free(g);
        free(mask); free(again);
        llm_token_trie_free(tt);
        llm_model_free(&m);
    }
}

/* Generation under the JSON grammar: sampled at temperature 1 with n = 4, on SmolLM2 and on a random-weight
 * model whose free output is noise; with a pool so small that sequences are preempted and recomputed. Every
 * answer that stops is JSON (llm_json_parse, another reader) and a whole sentence of the grammar; one cut by
 * max_tokens is the start of one. A grammar with nothing after its sentence stops the sequence there. */
static void check_grammar_outputs(const char *what, llm_grammar *g, run_result *r, int n_req, int n,
                                  int *stops) {
    for (int i = 0; i < n_req; i++)
        for (int k = 0; k < n; k++) {
            const char *text = r->text[i][k];
            int len = r->text_len[i][k], fin = r->finish[i][k];
            const char *v = grammar_verdict(g, text, (size_t)len);
            llm_json j;
            char err[LLM_ERR_LEN];
            int is_json = fin == LLM_FINISH_STOP && llm_json_parse(text, (size_t)len, &j, err) == 0;
            if (is_json) llm_json_free(&j);
            if (fin == LLM_FINISH_STOP) (*stops)++;
            CHECK(len < 4096 && (fin == LLM_FINISH_STOP ? is_json && !strcmp(v, "accept") :
                                 fin == LLM_FINISH_LENGTH && strcmp(v, "reject") != 0),
                  "%s: request %d sample %d (%s): %s; \"%.*s\"", what, i, k, llm_finish_reason_name(fin), v,
                  len < 300 ? len : 300, text);
        }
}

static void test_grammar_generation(void) {
    char err[LLM_ERR_LEN];
    llm_grammar *g = llm_grammar_parse(JSON_OBJECT_GBNF, err);
    CHECK(g != NULL, "the JSON grammar: %s", err);
    if (!g) return;
    static const char *prompts[4] = {"Describe a cat as a JSON object.", "JSON for a list of three colours:",
                                     "Write a JSON object with a name and an age.", "{\"answer\": "};
    run_result *r = (run_result *)calloc(1, sizeof *r);
    for (int mi = 0; mi < 3; mi++) {
        llm_engine_config cfg = engine_config(mi == 1 ? "random-qwen2-bias.gguf" : "stories260K.gguf");
        if (mi != 1) cfg.model_path = CHAT_MODEL;
        /* 4 x 4 samples cannot all fit: preemption */
        if (mi == 2) { cfg.num_blocks = 14; cfg.block_size = 16; }
        llm_engine *e = engine_new(&cfg);
        if (!e) continue;
        memset(r, 0, sizeof *r);
        int n_req = mi == 0 ? 2 : 4; /* SmolLM2's answers are long: 2 x 4 of them */
        for (int i = 0; i < n_req; i++) {
            llm_sampling_params p = llm_sampling_defaults();
            p.n = 4; p.temperature = 1.0f; p.seed = 100 + i;
            p.max_tokens = mi == 0 ? 300 : mi == 1 ? 100 : 40;
            p.grammar = JSON_OBJECT_GBNF;
            run_add(e, r, prompts[i], NULL, 0, &p);
        }
        run_engine(e, r);
        llm_engine_stats st = llm_engine_get_stats(e);
        int stops = 0;
        const char *what = mi == 0 ? "SmolLM2, JSON grammar, n = 4" :
                           mi == 1 ? "random Qwen2, JSON grammar, n = 4" : "SmolLM2, JSON grammar, preempted";
        check_grammar_outputs(what, g, r, n_req, 4, &stops);
        CHECK(all_blocks_free(e) && st.grammar_tokens > 0, "%s: blocks back, %lld tokens under the grammar",
              what, (long long)st.grammar_tokens);
        if (mi == 0) CHECK(stops >= 4, "%s: most answers end as whole JSON (%d of 8)", what, stops);
        if (mi == 2)
            CHECK(st.preemptions > 0, "%s: preemptions happened (%lld)", what, (long long)st.preemptions);
        llm_engine_destroy(e);
    }
    llm_grammar_free(g);
    /* the end: "yes" or "no", then nothing more may follow: the sequence stops there (not at max_tokens),
     * greedy and sampled; and a grammar the engine cannot parse is refused by add_request */
    llm_engine_config cfg = engine_config("stories260K.gguf");
    llm_engine *e = engine_new(&cfg);
    if (e) {
        for (int temp = 0; temp < 2; temp++) {
            memset(r, 0, sizeof *r);
            llm_sampling_params p = greedy(50);
            p.temperature = (float)temp; p.seed = 5; p.n = temp ? 4 : 1;
            p.grammar = "root ::= (\"yes\" | \"no\") \".\"";
            run_add(e, r, "Once upon a time", NULL, 0, &p);
            run_engine(e, r);
            for (int k = 0; k < p.n; k++)
                CHECK(r->finish[0][k] == LLM_FINISH_STOP &&
                      ((r->text_len[0][k] == 4 && !memcmp(r->text[0][k], "yes.", 4)) ||
                       (r->text_len[0][k] == 3 && !memcmp(r->text[0][k], "no.", 3))),
                      "a choice (temp %d, sample %d): \"%.*s\", %s", temp, k, r->text_len[0][k],
                      r->text[0][k], llm_finish_reason_name(r->finish[0][k]));
        }
        llm_sampling_params p = greedy(5);
        p.grammar = "root ::= [a-";
        CHECK(llm_engine_add_request(e, "x", NULL, 0, &p, NULL, err) == 0 && strstr(err, "grammar:"),
              "a broken grammar is refused by add_request: %s", err);
        CHECK(all_blocks_free(e), "after the grammar tests: blocks back");
        llm_engine_destroy(e);
    }
    free(r);
}

/* JSON Schema: the schemas of testdata/schemas/schemas.json (every feature the converter takes) written as
 * grammars; their valid and invalid examples through the grammar; samples from SmolLM2 and from a random-
 * weight model, temperature 1, n of them per schema (LLM_TEST_SAMPLES, default 20). Python's jsonschema is
 * the oracle (tools/schema_oracle.py): the examples are what their labels say, the grammar accepts exactly
 * the valid ones, and every finished sample validates. An answer cut by max_tokens is a start of one. */
static void json_line(FILE *f, int i, const char *kind, const char *text, size_t n, const char *verdict) {
    fprintf(f, "{\"i\": %d, \"kind\": \"%s\", \"grammar\": \"%s\", \"text\": ", i, kind, verdict);
    json_line_str(f, text, n);
    fputs("}\n", f);
}

/* The grammar thread (llm.h's engine, structured output): a sequence whose token the grammar refuses is
 * parked and its mask built off the step. Held at will here (test_grammar_hold), it shows that the steps go
 * on without it, that an abort or the engine's end while a job is out lose nothing, that requests take turns,
 * and that a seed gives the same tokens whichever thread draws. */
static volatile int test_grammar_hold;
static uint64_t test_grammar_turns[256];
static int test_grammar_n_turns;
static void test_grammar_job(uint64_t request_id) {
    while (__atomic_load_n(&test_grammar_hold, __ATOMIC_ACQUIRE)) usleep(1000);
    int k = __atomic_fetch_add(&test_grammar_n_turns, 1, __ATOMIC_ACQ_REL);
    if (k < 256) test_grammar_turns[k] = request_id;
}
static void test_grammar_hold_set(int hold) { __atomic_store_n(&test_grammar_hold, hold, __ATOMIC_RELEASE); }
static void *test_grammar_release_later(void *arg) {
    (void)arg;
    usleep(100000);
    test_grammar_hold_set(0);
    return NULL;
}

static void test_grammar_thread(void) {
    run_result *r = (run_result *)calloc(1, sizeof *r), *alone = (run_result *)calloc(1, sizeof *alone);
    llm_engine_config cfg = engine_config("stories260K.gguf");
    llm_engine *e = engine_new(&cfg);
    if (!e || !r || !alone) { llm_engine_destroy(e); free(r); free(alone); return; }
    /* greedy "QQQQ": the model's first choice is never "Q", so every token takes a mask: parked every time */
    llm_sampling_params pq = greedy(10), pb = greedy(20);
    pq.grammar = "root ::= \"QQQQ\""; pb.ignore_eos = 1;
    run_add(e, alone, "Lily and Ben", NULL, 0, &pb);
    run_engine(e, alone);
    /* 1. the thread held: the other request runs all its 20 tokens while the grammar's waits */
    test_grammar_hold_set(1);
    __atomic_store_n(&test_grammar_n_turns, 0, __ATOMIC_RELEASE);
    int a = run_add(e, r, "Once upon a time", NULL, 0, &pq), b = run_add(e, r, "Lily and Ben", NULL, 0, &pb);
    run_steps(e, r, 1); /* both prompts computed; "Q" refused: parked */
    for (int i = 0; i < 100 && b >= 0 && !r->finish[b][0]; i++) run_steps(e, r, 1);
    llm_engine_stats st = llm_engine_get_stats(e);
    CHECK(a == 0 && b == 1 && r->finish[b][0] == LLM_FINISH_LENGTH && r->n_tokens[b][0] == 20 &&
          !memcmp(r->tokens[b][0], alone->tokens[0][0], 20 * sizeof(int32_t)) && r->n_tokens[a][0] == 0 &&
          !r->finish[a][0] && st.running == 1,
          "grammar thread held: the other request's 20 tokens (%d, finish %d, as alone: %d) while the "
          "grammar's waits (%d tokens, %d running)", r->n_tokens[b][0], r->finish[b][0],
          r->n_tokens[b][0] == 20 && !memcmp(r->tokens[b][0], alone->tokens[0][0], 20 * sizeof(int32_t)),
          r->n_tokens[a][0], st.running);
    test_grammar_hold_set(0);
    run_engine(e, r);
    CHECK(r->finish[a][0] == LLM_FINISH_STOP && r->text_len[a][0] == 4 && !memcmp(r->text[a][0], "QQQQ", 4) &&
          all_blocks_free(e) && r->bad_audits == 0,
          "grammar thread released: \"%.*s\" (finish %d), blocks back", r->text_len[a][0], r->text[a][0],
          r->finish[a][0]);
    /* 2. aborted while its job is out: the abort's output at once, the sequence freed when the job is back */
    memset(r, 0, sizeof *r);
    test_grammar_hold_set(1);
    char err[LLM_ERR_LEN];
    a = run_add(e, r, "Once upon a time", NULL, 0, &pq);
    run_steps(e, r, 1);
    llm_engine_abort(e, r->id[a]);
    run_steps(e, r, 1);
    int aborted = r->finish[a][0] == LLM_FINISH_ABORT && all_blocks_free(e);
    test_grammar_hold_set(0);
    run_engine(e, r);
    CHECK(aborted && !llm_engine_has_work(e) && all_blocks_free(e) && llm_engine_check_blocks(e, err) == 0,
          "grammar thread: aborted while parked: finish %d at once, then no work and every block free",
          r->finish[a][0]);
    /* 3. turns: four parked samples of one request, then another's: the other goes second, not fifth */
    memset(r, 0, sizeof *r);
    test_grammar_hold_set(1);
    __atomic_store_n(&test_grammar_n_turns, 0, __ATOMIC_RELEASE);
    llm_sampling_params p4 = pq;
    p4.n = 4; p4.temperature = 0.5f; p4.seed = 3;
    int h = run_add(e, r, "Once upon a time", NULL, 0, &p4);
    run_steps(e, r, 1);
    int l = run_add(e, r, "The cat", NULL, 0, &pq);
    run_steps(e, r, 1);
    test_grammar_hold_set(0);
    run_engine(e, r);
    int n_turns = __atomic_load_n(&test_grammar_n_turns, __ATOMIC_ACQUIRE);
    CHECK(h == 0 && l == 1 && n_turns >= 6 && test_grammar_turns[0] == r->id[h] &&
          test_grammar_turns[1] == r->id[l] && test_grammar_turns[2] == r->id[h] && all_blocks_free(e),
          "grammar thread: requests take turns: %d jobs, the first three of requests %llu %llu %llu "
          "(%llu has 4 samples, %llu one)", n_turns, (unsigned long long)test_grammar_turns[0],
          (unsigned long long)test_grammar_turns[1], (unsigned long long)test_grammar_turns[2],
          (unsigned long long)r->id[h], (unsigned long long)r->id[l]);
    /* 4. the engine destroyed while a job is out: it waits for the job, frees everything (ASan: no leak) */
    a = run_add(e, r, "Once upon a time", NULL, 0, &pq);
    test_grammar_hold_set(1);
    run_steps(e, r, 1);
    pthread_t t;
    int started = pthread_create(&t, NULL, test_grammar_release_later, NULL) == 0;
    if (!started) test_grammar_hold_set(0);
    llm_engine_destroy(e);
    if (started) pthread_join(t, NULL);
    CHECK(!test_grammar_hold, "grammar thread: the engine destroyed with a job out");
    /* 5. a seed gives the same tokens whichever thread draws: every draw in the step (but for masks), every
     * draw parked before it is made, and the default budget; JSON from stories260K (a mask most tokens), two
     * requests of n = 4. (On stories260K's f32 path a sequence's logits do not depend on the step's other
     * sequences; on SmolLM2's 8-bit path they can, and a parked sequence changes who shares a step.) */
    static const char *prompts[2] = {"Describe a cat as a JSON object.", "Write a JSON object with a name."};
    static const double shares[3] = {1e9, -1, LLM_GRAMMAR_STEP_SHARE};
    run_result *runs[3];
    int64_t parked[3] = {0};
    for (int k = 0; k < 3; k++) {
        runs[k] = (run_result *)calloc(1, sizeof(run_result));
        cfg = engine_config("stories260K.gguf");
        e = engine_new(&cfg);
        if (!e || !runs[k]) { llm_engine_destroy(e); continue; }
        e->grammar_step_share = shares[k];
        for (int i = 0; i < 2; i++) {
            llm_sampling_params p = llm_sampling_defaults();
            p.n = 4; p.temperature = 1.0f; p.seed = 40 + i; p.max_tokens = 60; p.logprobs = 2;
            p.grammar = JSON_OBJECT_GBNF;
            run_add(e, runs[k], prompts[i], NULL, 0, &p);
        }
        run_engine(e, runs[k]);
        st = llm_engine_get_stats(e);
        parked[k] = st.grammar_tokens;
        CHECK(all_blocks_free(e) && runs[k]->bad_audits == 0 && st.grammar_tokens > 100,
              "grammar thread, step share %g: blocks back, %lld tokens under the grammar, %lld masks",
              shares[k], (long long)st.grammar_tokens, (long long)st.grammar_masks);
        llm_engine_destroy(e);
    }
    int same = 1;
    for (int k = 1; k < 3; k++)
        for (int i = 0; runs[0] && runs[k] && i < 2; i++)
            for (int j = 0; j < 4; j++)
                same &= runs[k]->n_tokens[i][j] == runs[0]->n_tokens[i][j] && runs[0]->n_tokens[i][j] > 0 &&
                        !memcmp(runs[k]->tokens[i][j], runs[0]->tokens[i][j],
                                (size_t)runs[0]->n_tokens[i][j] * sizeof(int32_t)) &&
                        !memcmp(runs[k]->logprobs[i][j], runs[0]->logprobs[i][j],
                                (size_t)runs[0]->n_tokens[i][j] * sizeof(float));
    CHECK(same && parked[0] == parked[1] && parked[1] == parked[2],
          "grammar thread: the same tokens and logprobs drawn in the step, on the thread, and as the budget "
          "falls (%lld, %lld, %lld tokens under the grammar)", (long long)parked[0], (long long)parked[1],
          (long long)parked[2]);
    for (int k = 0; k < 3; k++) free(runs[k]);
    free(r); free(alone);
}

static void test_grammar_schemas(void) {
    char err[LLM_ERR_LEN], path[1024], cases_path[] = "/tmp/llm-test-schemas-XXXXXX";
    snprintf(path, sizeof path, "%s/schemas/schemas.json", testdata_dir);
    size_t len;
    char *text = read_file(path, &len);
    llm_json all;
    if (!text || llm_json_parse(text, len, &all, err) != 0 || all.type != LLM_JSON_ARRAY) {
        CHECK(0, "read %s: %s", path, text ? err : "missing");
        free(text);
        return;
    }
    int fd = mkstemp(cases_path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(f != NULL && all.n >= 30, "%d schemas, and a file for the oracle", all.n);
    char **gbnf = (char **)calloc((size_t)all.n, sizeof *gbnf);
    llm_grammar **g = (llm_grammar **)calloc((size_t)all.n, sizeof *g);
    for (int i = 0; f && i < all.n; i++) {
        const llm_json *e = &all.items[i], *name = llm_json_get(e, "name");
        gbnf[i] = llm_json_schema_to_grammar(llm_json_get(e, "schema"), err);
        g[i] = gbnf[i] ? llm_grammar_parse(gbnf[i], err) : NULL;
        CHECK(g[i] != NULL, "schema %s: %s", name ? name->str : "?", err);
        const char *kinds[2] = {"valid", "invalid"};
        for (int k = 0; g[i] && k < 2; k++) {
            const llm_json *list = llm_json_get(e, kinds[k]);
            for (int j = 0; list && j < list->n; j++)
                json_line(f, i, kinds[k], list->items[j].str, list->items[j].len,
                          grammar_verdict(g[i], list->items[j].str, list->items[j].len));
        }
    }
    const char *env = getenv("LLM_TEST_SAMPLES");
    int samples = env ? atoi(env) : 20, finished[2] = {0, 0}, cut[2] = {0, 0}, broken = 0;
    if (samples < 1 || samples > 128) samples = 20;
    for (int mi = 0; f && mi < 2; mi++) {
        llm_engine_config cfg = engine_config("random-llama2-untied.gguf"); /* a SentencePiece vocabulary */
        if (mi == 0) cfg.model_path = CHAT_MODEL;
        llm_engine *e = engine_new(&cfg);
        if (!e) continue;
        double t_model = llm_now();
        uint64_t *ids = (uint64_t *)calloc((size_t)all.n, sizeof *ids);
        char **out = (char **)calloc((size_t)all.n * (size_t)samples, sizeof *out); /* stb_ds strings */
        for (int i = 0; i < all.n; i++) {
            if (!g[i]) continue;
            char prompt[256];
            const llm_json *name = llm_json_get(&all.items[i], "name");
            snprintf(prompt, sizeof prompt, "Write one JSON value for \"%s\":\n", name ? name->str : "");
            llm_sampling_params p = llm_sampling_defaults();
            p.n = samples; p.temperature = 1.0f; p.seed = 1000 * mi + i; p.max_tokens = mi == 0 ? 128 : 100;
            p.grammar = gbnf[i];
            ids[i] = llm_engine_add_request(e, prompt, NULL, 0, &p, NULL, err);
            CHECK(ids[i] > 0, "schema %d: add_request: %s", i, err);
        }
        while (llm_engine_has_work(e)) {
            const llm_output *o;
            int n = llm_engine_step(e, &o);
            for (int k = 0; k < n; k++) {
                int i = 0;
                while (i < all.n && ids[i] != o[k].request_id) i++;
                if (i == all.n || o[k].index >= samples) continue;
                char **s = &out[(size_t)i * (size_t)samples + (size_t)o[k].index];
                if (o[k].text_len) memcpy(arraddnptr(*s, o[k].text_len), o[k].text, (size_t)o[k].text_len);
                if (!o[k].finish_reason) continue;
                const char *v = grammar_verdict(g[i], *s ? *s : "", (size_t)arrlen(*s));
                if (o[k].finish_reason == LLM_FINISH_STOP) {
                    finished[mi]++;
                    json_line(f, i, "sample", *s ? *s : "", (size_t)arrlen(*s), v);
                } else if (o[k].finish_reason == LLM_FINISH_LENGTH && strcmp(v, "reject") != 0) cut[mi]++;
                else if (broken++ < 5)
                    CHECK(0, "schema %d sample %d: %s, %s: \"%.*s\"", i, o[k].index,
                          llm_finish_reason_name(o[k].finish_reason), o[k].error ? o[k].error : v,
                          (int)arrlen(*s), *s ? *s : "");
            }
        }
        CHECK(all_blocks_free(e), "after the schemas' samples: blocks back");
        llm_engine_stats st = llm_engine_get_stats(e);
        printf("    %s: %lld tokens under grammars, %.2f s in the grammar (%lld masks, %lld from the cache), "
               "%.1f s\n", mi ? "random Llama 2" : "SmolLM2", (long long)st.grammar_tokens,
               st.grammar_seconds, (long long)st.grammar_masks, (long long)st.grammar_masks_cached,
               llm_now() - t_model);
        for (size_t k = 0; k < (size_t)all.n * (size_t)samples; k++) arrfree(out[k]);
        free(out); free(ids);
        llm_engine_destroy(e);
    }
    if (f) fclose(f);
    int total = 0;
    for (int i = 0; i < all.n; i++) total += g[i] != NULL;
    total *= samples;
    CHECK(broken == 0 && finished[0] + cut[0] == total && finished[1] + cut[1] == total,
          "every sample stopped or was cut as a start of a sentence (SmolLM2 %d + %d, random %d + %d of %d)",
          finished[0], cut[0], finished[1], cut[1], total);
    CHECK(finished[0] >= total * 3 / 4, "SmolLM2: most answers are whole (%d of %d)", finished[0], total);
    printf("    JSON Schema samples: SmolLM2 %d whole, %d cut by max_tokens; random Llama 2 %d whole, %d "
           "cut\n", finished[0], cut[0], finished[1], cut[1]);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, ".venv/bin/python tools/schema_oracle.py %s %s 2>&1", path, cases_path);
    int status;
    char *res = run_command(cmd, &status);
    CHECK(res && status == 0, "jsonschema on the examples and the samples: %s", res ? res : "no output");
    free(res);
    unlink(cases_path);
    for (int i = 0; i < all.n; i++) { free(gbnf[i]); llm_grammar_free(g[i]); }
    free(gbnf); free(g);
    llm_json_free(&all);
    free(text);
    /* what cannot be honoured is refused, naming the keyword and where it is */
    static const struct { const char *schema, *says; } refused[] = {
        {"{\"not\": {\"type\": \"string\"}}", "\"not\" is not supported at / (the root)"},
        {"{\"type\": \"array\", \"uniqueItems\": true}", "uniqueItems: a grammar cannot keep array items "
         "distinct (it can for an enum of at most 64 values) at / (the root)"},
        {"{\"type\": \"array\", \"uniqueItems\": true, \"items\": {\"enum\": [1, 2, 1]}}",
         "uniqueItems: a grammar cannot keep array items distinct"},
        {"{\"type\": \"array\", \"uniqueItems\": true, \"items\": {\"enum\": [1, 2]}, \"minItems\": 2}",
         "uniqueItems: a grammar cannot keep array items distinct"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"format\": \"hostname\"}}}",
         "format \"hostname\" is not supported (date, time, date-time, uuid, email are) at /properties/a"},
        {"{\"properties\": {\"x\": {\"patternProperties\": {}}}}", "\"patternProperties\" is not supported "
         "at /properties/x"},
        {"{\"if\": {}, \"then\": {}}", "\"if\" is not supported"},
        {"{\"type\": \"number\", \"minimum\": 0.12345678901234567}",
         "minimum beyond 10^15 or with more than 16 digits after the point at / (the root)"},
        {"{\"type\": \"number\", \"exclusiveMaximum\": 1e16}",
         "exclusiveMaximum beyond 10^15 or with more than 16 digits after the point"},
        {"{\"type\": \"number\", \"minimum\": 2, \"maximum\": 1}", "minimum/maximum: no number is within"},
        {"{\"type\": \"integer\", \"multipleOf\": 2}", "\"multipleOf\" is not supported"},
        {"{\"$ref\": \"https://example.com/s.json\"}", "does not point into this schema"},
        {"{\"type\": \"string\", \"pattern\": \"(?=a)b\"}", "lookaround"},
        {"{\"type\": \"strings\"}", "type \"strings\" is not a JSON Schema type"},
        {"{\"type\": \"object\", \"minProperties\": 1}", "\"minProperties\" is not supported"},
        {"{\"items\": {\"contains\": {}}}", "\"contains\" is not supported at /items"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        llm_json s;
        err[0] = 0;
        char *out = llm_json_parse(refused[i].schema, strlen(refused[i].schema), &s, err) == 0 ?
                    llm_json_schema_to_grammar(&s, err) : NULL;
        CHECK(!out && strstr(err, refused[i].says), "schema %s: refused with \"%s\", got \"%s\"",
              refused[i].schema, refused[i].says, out ? "(a grammar)" : err);
        free(out);
        llm_json_free(&s);
    }
}

/* A number range for test_grammar_number_ranges: lo_kind and hi_kind 0 none, 1 inclusive, 2 exclusive (an
 * integer schema writes no fraction) */
typedef struct { const char *schema; double lo; int lo_kind; double hi; int hi_kind; } number_range;

/* What a bounded number schema's grammar must accept: JSON number text (no exponent: the alphabet has no e;
 * no fraction for an integer), not a negative zero (the grammar writes no "-0"), its value in the range */
static int number_range_wants(const char *s, const number_range *r) {
    const char *p = s + (*s == '-');
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (*p >= '0' && *p <= '9') p++;
    else return 0;
    if (*p == '.') { if (!(p[1] >= '0' && p[1] <= '9')) return 0;
                     for (p++; *p >= '0' && *p <= '9'; p++) {} }
    if (*p || (strchr(s, '.') && strstr(r->schema, "integer"))) return 0;
    double x = strtod(s, NULL);
    if (s[0] == '-' && x == 0) return 0;
    return (r->lo_kind == 0 || (r->lo_kind == 1 ? x >= r->lo : x > r->lo)) &&
           (r->hi_kind == 0 || (r->hi_kind == 1 ? x <= r->hi : x < r->hi));
}

/* Every string of up to 6 characters over [-0-9.] below s (st: the grammar after s; NULL once it refused a
 * byte): the grammar accepts it exactly when number_range_wants. *bad counts disagreements; the first in
 * first_bad. */
static void number_range_walk(const llm_grammar_state *st, char *s, int len, const number_range *r, int *bad,
                              char *first_bad) {
    s[len] = 0;
    int accepted = st && llm_grammar_can_end(st), wanted = len > 0 && number_range_wants(s, r);
    if (accepted != wanted && (*bad)++ == 0)
        snprintf(first_bad, 64, "\"%s\" %s", s, accepted ? "accepted" : "refused");
    if (len == 6) return;
    static const char alphabet[] = "-0123456789.";
    for (const char *c = alphabet; *c; c++) {
        llm_grammar_state *next = st ? llm_grammar_state_copy(st) : NULL;
        if (next && llm_grammar_accept(next, c, 1) != 0) { llm_grammar_state_free(next); next = NULL; }
        s[len] = *c;
        number_range_walk(next, s, len + 1, r, bad, first_bad);
        llm_grammar_state_free(next);
        s[len] = 0;
    }
}

static const char *bound_verdict(int kind, const char *text, const char *input, char *err);

/* Bounds on numbers and integers (Pydantic's Field(ge=0, le=1)): against an oracle, every string of up to 6
 * characters over [-0-9.]; a bound with 16 digits writes a small grammar. uniqueItems over an enum. */
static void test_grammar_number_ranges(void) {
    static const number_range ranges[] = {
        {"{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}", 0, 1, 1, 1},
        {"{\"type\": \"number\", \"exclusiveMinimum\": 0, \"exclusiveMaximum\": 1}", 0, 2, 1, 2},
        {"{\"type\": \"number\", \"minimum\": -2.5, \"maximum\": 3.75}", -2.5, 1, 3.75, 1},
        {"{\"type\": \"number\", \"minimum\": 0.5}", 0.5, 1, 0, 0},
        {"{\"type\": \"number\", \"maximum\": -1}", 0, 0, -1, 1},
        {"{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 250}", 10, 1, 250, 1},
        {"{\"type\": \"number\", \"minimum\": 1e3, \"maximum\": 1e6}", 1e3, 1, 1e6, 1},
        {"{\"type\": \"number\", \"exclusiveMinimum\": 0.049, \"maximum\": 0.05}", 0.049, 2, 0.05, 1},
        {"{\"type\": \"number\", \"exclusiveMinimum\": -1, \"exclusiveMaximum\": 0}", -1, 2, 0, 2},
        {"{\"type\": \"number\", \"minimum\": -0.25, \"exclusiveMinimum\": true, \"maximum\": 0.125, "
         "\"exclusiveMaximum\": true}", -0.25, 2, 0.125, 2}, /* draft 4's form */
        {"{\"type\": \"number\", \"minimum\": 3, \"exclusiveMinimum\": 2.5, \"exclusiveMaximum\": 10.5, "
         "\"maximum\": 7}", 3, 1, 7, 1}, /* the stricter of each */
        {"{\"type\": \"integer\", \"exclusiveMinimum\": 2.5, \"maximum\": 7.5}", 3, 1, 7, 1},
        {"{\"type\": \"integer\", \"minimum\": 10, \"exclusiveMinimum\": true, \"maximum\": 20, "
         "\"exclusiveMaximum\": true}", 10, 2, 20, 2}, /* draft 4's form on integers */
        {"{\"type\": \"number\", \"minimum\": 0, \"maximum\": 0}", 0, 1, 0, 1},
    };
    char err[LLM_ERR_LEN];
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++) {
        llm_json s;
        char *gbnf = llm_json_parse(ranges[i].schema, strlen(ranges[i].schema), &s, err) == 0 ?
                     llm_json_schema_to_grammar(&s, err) : NULL;
        llm_grammar *g = gbnf ? llm_grammar_parse(gbnf, err) : NULL;
        llm_grammar_state *st = g ? llm_grammar_start(g) : NULL;
        char text[8], first_bad[64] = "";
        int bad = 0;
        if (st) number_range_walk(st, text, 0, &ranges[i], &bad, first_bad);
        CHECK(st && bad == 0, "schema %s: %s%d strings of up to 6 characters judged wrong (%s)",
              ranges[i].schema, st ? "" : err, bad, first_bad);
        llm_grammar_state_free(st); llm_grammar_free(g); free(gbnf);
        if (gbnf) llm_json_free(&s);
    }
    /* uniqueItems over an enum: the values in its order, each at most once; false: any array */
    static const char enum3[] = "{\"type\": \"array\", \"uniqueItems\": true, \"items\": {\"enum\": "
                                "[\"a\", 2, null]}}",
                      ref2[] = "{\"type\": \"array\", \"uniqueItems\": true, \"minItems\": 1, \"items\": "
                               "{\"$ref\": \"#/$defs/c\"}, \"$defs\": {\"c\": {\"enum\": [1, 2]}}}";
    static const struct { const char *schema, *input, *verdict; } unique[] = {
        {enum3, "[\"a\", null]", "accept"}, {enum3, "[]", "accept"}, {enum3, "[\"a\", \"a\"]", "reject"},
        {enum3, "[2, \"a\"]", "reject"}, {enum3, "[\"a\", 2, null]", "accept"}, {ref2, "[]", "reject"},
        {ref2, "[1, 2]", "accept"},
        {"{\"type\": \"array\", \"uniqueItems\": false, \"items\": {\"type\": \"integer\"}}", "[1, 1]",
         "accept"},
    };
    for (size_t i = 0; i < sizeof unique / sizeof *unique; i++) {
        const char *v = bound_verdict(1, unique[i].schema, unique[i].input, err);
        CHECK(!strcmp(v, unique[i].verdict), "schema %s on %s: %s, not %s (%s)", unique[i].schema,
              unique[i].input, v, unique[i].verdict, err);
    }
    /* 16 digits on each side of the point: the rule grows with the digits, not with the range */
    static const char *const wide[] = {
        "{\"type\": \"number\", \"exclusiveMinimum\": -999999999999999.9, "
        "\"exclusiveMaximum\": 0.9999999999999999}",
        "{\"type\": \"number\", \"minimum\": 0.1234567890123456, \"maximum\": 0.1234567890123457}",
    };
    const char *checks[][3] = {{"-999999999999999.8", "0.9999999999999998", "-999999999999999.9"},
                               {"0.1234567890123456", "0.12345678901234565", "0.12345678901234571"}};
    for (int i = 0; i < 2; i++) {
        llm_json s;
        char *gbnf = llm_json_parse(wide[i], strlen(wide[i]), &s, err) == 0 ?
                     llm_json_schema_to_grammar(&s, err) : NULL;
        llm_grammar *g = gbnf ? llm_grammar_parse(gbnf, err) : NULL;
        CHECK(g && strlen(gbnf) < 8000 && !strcmp(grammar_verdict(g, checks[i][0], strlen(checks[i][0])),
                                                  "accept") &&
              !strcmp(grammar_verdict(g, checks[i][1], strlen(checks[i][1])), i ? "reject" : "accept") &&
              strcmp(grammar_verdict(g, checks[i][2], strlen(checks[i][2])), "accept"),
              "schema %s: a grammar of %zu bytes (%s), %s in, %s %s, %s out", wide[i],
              gbnf ? strlen(gbnf) : 0, g ? "parsed" : err, checks[i][0], checks[i][1], i ? "out" : "in",
              checks[i][2]);
        llm_grammar_free(g); free(gbnf);
        if (gbnf) llm_json_free(&s);
    }
}

/* What openai.pydantic_function_tool writes for a Person with nested models: $defs, and $ref to them */
#define PYDANTIC_PARAMS \
    "{\"$defs\":{\"Address\":{\"properties\":{\"city\":{\"maxLength\":12,\"title\":\"City\"," \
    "\"type\":\"string\"},\"zip\":{\"maximum\":99999,\"minimum\":10000,\"title\":\"Zip\",\"type\":" \
    "\"integer\"}},\"required\":[\"city\",\"zip\"],\"title\":\"Address\",\"type\":\"object\"," \
    "\"additionalProperties\":false},\"Pet\":{\"properties\":{\"kind\":{\"enum\":[\"cat\",\"dog\"]," \
    "\"title\":\"Kind\",\"type\":\"string\"},\"home\":{\"$ref\":\"#/$defs/Address\"}},\"required\":" \
    "[\"kind\",\"home\"],\"title\":\"Pet\",\"type\":\"object\",\"additionalProperties\":false}}," \
    "\"properties\":{\"name\":{\"maxLength\":10,\"title\":\"Name\",\"type\":\"string\"},\"pets\":{" \
    "\"items\":{\"$ref\":\"#/$defs/Pet\"},\"maxItems\":2,\"title\":\"Pets\",\"type\":\"array\"}}," \
    "\"required\":[\"name\",\"pets\"],\"title\":\"Person\",\"type\":\"object\"," \
    "\"additionalProperties\":false}"

/* Text made of parts repeated: head, unit n times, mid, unit2 n2 times, tail; a unit may hold %d (its index)
 * and a second %d (the index plus one). malloc'd. */
static char *repeat_text(const char *head, const char *unit, int n, const char *mid, const char *unit2,
                         int n2, const char *tail) {
    size_t cap = strlen(head) + strlen(mid) + strlen(tail) + (strlen(unit) + 12) * (size_t)n +
                 (strlen(unit2) + 12) * (size_t)n2 + 1, at = 0;
    char *s = (char *)malloc(cap);
    at += (size_t)snprintf(s + at, cap - at, "%s", head);
    for (int i = 0; i < n; i++) at += (size_t)snprintf(s + at, cap - at, unit, i, i + 1);
    at += (size_t)snprintf(s + at, cap - at, "%s", mid);
    for (int i = 0; i < n2; i++) at += (size_t)snprintf(s + at, cap - at, unit2, i, i + 1);
    snprintf(s + at, cap - at, "%s", tail);
    return s;
}

/* What a text becomes (kind: 0 GBNF, 1 a JSON Schema, 2 a regex, 3 JSON, 4 choices one a line, 5 tools for
 * the Hermes format, a call required): "refused" (why in err), or the grammar's verdict on input
 * ("accept", "prefix", "reject") */
static const char *bound_verdict(int kind, const char *text, const char *input, char *err) {
    char *gbnf = NULL;
    llm_json j;
    err[0] = 0;
    if (kind == 3) {
        if (llm_json_parse(text, strlen(text), &j, err) != 0) return "refused";
        llm_json_free(&j);
        return "accept";
    }
    if (kind == 0) gbnf = strdup(text);
    else if (kind == 1 && llm_json_parse(text, strlen(text), &j, err) == 0) {
        gbnf = llm_json_schema_to_grammar(&j, err);
        llm_json_free(&j);
    } else if (kind == 2) gbnf = llm_regex_to_grammar(text, err);
    else if (kind == 4) {
        const char **choices = NULL; /* stb_ds */
        char *copy = strdup(text);
        for (char *s = copy, *nl; s; s = nl ? nl + 1 : NULL) {
            if ((nl = strchr(s, '\n'))) *nl = 0;
            arrput(choices, s);
        }
        gbnf = llm_choice_to_grammar(choices, (int)arrlen(choices), err);
        arrfree(choices); free(copy);
    } else if (kind == 5) {
        llm_chat_template ct;
        memset(&ct, 0, sizeof ct);
        ct.tool_format = LLM_TOOLS_HERMES;
        gbnf = llm_chat_tool_grammar(&ct, text, LLM_TOOL_REQUIRED, NULL, 0, err);
    }
    llm_grammar *g = gbnf ? llm_grammar_parse(gbnf, err) : NULL;
    free(gbnf);
    const char *v = g ? grammar_verdict(g, input, strlen(input)) : "refused";
    llm_grammar_free(g);
    return v;
}

/* The stacks a grammar state keeps open (the matcher's own; a build without grammars has none) */
static int grammar_open_stacks(const llm_grammar_state *st) {
#ifdef LLM_NO_GRAMMAR
    (void)st;
    return -1;
#else
    return (int)arrlen(st->set.lens);
#endif
}

/* Nothing request bytes can drive in the grammar section recurses or works without a bound checked before
 * it is spent: each deep variant of every recursive path (depths to 200,000) is refused with a message
 * that names the limit, or works where the code walks its own stack, and quickly (seconds under ASan).
 * Before, most took the process down by stack overflow. Choices and enums of 10,000 values work, one stack
 * along a beginning they share; tools' parameters with $defs and $ref (Pydantic's) work. */
static void test_grammar_bounds(void) {
    static const char *const pydantic = "[{\"type\":\"function\",\"function\":{\"name\":\"add_person\","
                                        "\"parameters\":" PYDANTIC_PARAMS ",\"strict\":true}}]";
    static const char *const call = "<tool_call>\n{\"name\": \"add_person\", \"arguments\": {\"name\": "
                                    "\"Ann\", \"pets\": [{\"kind\": \"cat\", \"home\": {\"city\": \"Oslo\", "
                                    "\"zip\": %d}}]}}\n</tool_call>";
    static const char *const chain = "\"a%d\":{\"$ref\":\"#/$defs/a%d\"},", *const rule = "r%d ::= r%d\n";
    char call_ok[256], call_bad[256];
    snprintf(call_ok, sizeof call_ok, call, 12345); snprintf(call_bad, sizeof call_bad, call, 123);
    struct { const char *what; int kind; char *text; const char *input, *says; } cases[] = {
        /* GBNF: groups nest on the parser's own stack; references are expanded from the matcher's list */
        {"GBNF, 10,000 nested parentheses", 0,
         repeat_text("root ::= ", "(", 10000, "\"a\"", ")", 10000, ""), "a", "accept"},
        {"GBNF, 100,000 nested parentheses", 0,
         repeat_text("root ::= ", "(", 100000, "\"a\"", ")", 100000, ""), "a", "accept"},
        {"GBNF, 100,000 nested parentheses each with more after it", 0,
         repeat_text("root ::= ", "(", 100000, "\"a\"", ") \"b\"", 100000, ""), "ab",
         "rules nest more than 4096 deep at its start"},
        {"GBNF, 70,000 rules in a chain", 0,
         repeat_text("root ::= r0\n", rule, 70000, "r70000 ::= \"z\"", "", 0, ""), "z", "accept"},
        {"GBNF, 100,000 rules in a chain to an empty one", 0,
         repeat_text("root ::= r0 \"q\"\n", rule, 100000, "r100000 ::= \"\" | \"z\"", "", 0, ""), "zq",
         "accept"},
        {"GBNF, 200,000 rules in a chain back to root", 0,
         repeat_text("root ::= r0 \"q\"\n", rule, 200000, "r200000 ::= root \"z\"", "", 0, ""), "zq",
         "rule root is left-recursive"},
        {"GBNF, 24 rules that fan out and meet again", 0,
         repeat_text("root ::= r0\n", "r%1$d ::= r%2$d | r%2$d\n", 24, "r24 ::= \"z\"", "", 0, ""), "z",
         "expanding its rules at its start takes more than 16777216 steps"},
        {"GBNF, 30 repetitions of {0,10000}", 0,
         repeat_text("root ::=", " \"a\"{0,10000}", 30, "", "", 0, ""), "a", "more than 262144 rules"},
        /* regular expressions and JSON: recursive, bounded before each level */
        {"regex, 100,000 nested groups", 2, repeat_text("", "(", 100000, "a", ")", 100000, ""), "a",
         "groups nested too deep (more than 64)"},
        {"JSON, 100,000 nested arrays", 3, repeat_text("", "[", 100000, "", "]", 100000, ""), "",
         "nesting too deep (more than 64 arrays and objects)"},
        /* JSON Schema: $refs from a list, schemas nested to a bound, allOf's parts from a list */
        {"JSON Schema, a chain of 1,600 $refs", 1, repeat_text("{\"$ref\":\"#/$defs/a0\",\"$defs\":{", chain,
         1600, "\"a1600\":{\"enum\":[\"ok\"]}}}", "", 0, ""), "\"ok\"", "accept"},
        {"JSON Schema, a chain of 100,000 $refs", 1,
         repeat_text("{\"$ref\":\"#/$defs/a0\",\"$defs\":{", chain, 100000,
                     "\"a100000\":{\"enum\":[\"ok\"]}}}", "", 0, ""), "\"ok\"",
         "the schema needs more than 10000 rules"},
        {"JSON Schema, allOf that $refs the schema around it", 1,
         strdup("{\"properties\":{\"x\":{\"allOf\":[{\"$ref\":\"#\"},{\"type\":\"object\"}]}}}"), "{}",
         "the schema nests more than 128 deep"},
        {"JSON Schema, a recursive property as allOf of one $ref", 1,
         strdup("{\"properties\":{\"x\":{\"allOf\":[{\"$ref\":\"#\"}],\"description\":\"d\"}}}"),
         "{\"x\":{\"x\":{}}}", "accept"},
        {"JSON Schema, a 100,000-byte property name beside additionalProperties", 1,
         repeat_text("{\"properties\":{\"", "k", 100000, "\":{}},\"additionalProperties\":true}", "", 0, ""),
         "{}", "a property name longer than 256 bytes"},
        {"JSON Schema, allOf's three parts on one property", 1,
         strdup("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":3}}},"
                "{\"properties\":{\"a\":{\"maximum\":5}}},{\"properties\":{\"a\":{\"type\":\"integer\"}},"
                "\"required\":[\"a\"]}]}"),
         "{\"a\":6}", "reject"},
        {"JSON Schema, allOf inside allOf", 1,
         strdup("{\"allOf\":[{\"allOf\":[{\"properties\":{\"a\":{\"const\":1}},\"required\":[\"a\"]}]},"
                "{\"type\":\"object\"}]}"), "{\"a\":2}", "reject"},
        {"JSON Schema, allOf merging an object of 20,000 keys", 1,
         repeat_text("{\"$defs\":{\"big\":{", "\"k%d\":0,", 20000, "\"k\":0}},\"properties\":{\"p\":"
                     "{\"allOf\":[{\"$ref\":\"#/$defs/big\"},{}]}}}", "", 0, ""), "{}",
         "the schema is too large to write as a grammar (more than 16777216 keywords and properties"},
        {"JSON Schema, an enum of 10,000 values", 1,
         repeat_text("{\"enum\":[\"v0\"", ",\"v%d\"", 10000, "]}", "", 0, ""), "\"v4711\"", "accept"},
        /* choices: a trie */
        {"choice, 10,000 values", 4, repeat_text("item-0", "\nitem-%d", 10000, "", "", 0, ""), "item-9999",
         "accept"},
        {"choice, 100,000 values", 4, repeat_text("w0", "\nw%d", 100000, "", "", 0, ""), "w31415", "accept"},
        {"choice, 100,000 values, a beginning of them", 4, repeat_text("w0", "\nw%d", 100000, "", "", 0, ""),
         "w", "prefix"},
        {"choice, 100,000 values, none of them", 4, repeat_text("w0", "\nw%d", 100000, "", "", 0, ""),
         "w100001", "reject"},
        /* tools: the parameters' own $refs */
        {"tools, Pydantic's $defs and $ref", 5, strdup(pydantic), call_ok, "accept"},
        {"tools, Pydantic's $defs and $ref, a nested value out of range", 5, strdup(pydantic), call_bad,
         "reject"},
        {"tools, parameters with a chain of 100,000 $refs", 5,
         repeat_text("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"$ref\":"
                     "\"#/$defs/a0\",\"$defs\":{", chain, 100000, "\"a100000\":{}}}}}]", "", 0, ""), "",
         "tools[0].function.parameters: JSON schema: the schema needs more than 10000 rules"},
    };
    char err[LLM_ERR_LEN];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double t0 = llm_now();
        const char *want = cases[i].says;
        const char *v = bound_verdict(cases[i].kind, cases[i].text, cases[i].input, err);
        double t = llm_now() - t0;
        int worked = !strcmp(want, "accept") || !strcmp(want, "reject") || !strcmp(want, "prefix");
        CHECK((worked ? !strcmp(v, want) : !strcmp(v, "refused") && strstr(err, want)) &&
              t < (UNDER_ASAN ? 10 : 2), "%s: %s (%s), in %.2f s; want %s", cases[i].what, v, err, t, want);
        free(cases[i].text);
    }
    /* a 10,000-value choice takes each value whole, and is one stack along what values share: 4,000 values
     * that begin with the same 500 characters are one stack at the 500th (before: one stack a value, which
     * every mask walked) */
    const char **values = (const char **)malloc(10000 * sizeof *values);
    char (*text)[600] = (char (*)[600])malloc(10000 * sizeof *text);
    for (int i = 0; i < 10000; i++) { snprintf(text[i], sizeof text[i], "item-%d", i); values[i] = text[i]; }
    char *gbnf = llm_choice_to_grammar(values, 10000, err);
    llm_grammar *g = gbnf ? llm_grammar_parse(gbnf, err) : NULL;
    int whole = 0;
    for (int i = 0; g && i < 10000; i++)
        whole += !strcmp(grammar_verdict(g, text[i], strlen(text[i])), "accept");
    CHECK(g && whole == 10000, "a choice of 10,000 values takes each whole: %d (%s)", whole, g ? "" : err);
    llm_grammar_free(g); free(gbnf);
    for (int i = 0; i < 4000; i++) {
        memset(text[i], 'x', 500);
        snprintf(text[i] + 500, 100, "-%d", i);
    }
    gbnf = llm_choice_to_grammar(values, 4000, err);
    g = gbnf ? llm_grammar_parse(gbnf, err) : NULL;
    llm_grammar_state *st = g ? llm_grammar_start(g) : NULL;
    int at_start = st ? grammar_open_stacks(st) : -1, ok = st && llm_grammar_accept(st, text[0], 500) == 0;
    int at_500 = st ? grammar_open_stacks(st) : -1;
    CHECK(ok && at_start == 1 && at_500 == 1 && llm_grammar_accept(st, "-3999", 5) == 0 &&
          llm_grammar_can_end(st), "4,000 values sharing 500 characters: %d stack(s) at the start, %d at the "
          "500th character (%s)", at_start, at_500, g ? "" : err);
    llm_grammar_state_free(st); llm_grammar_free(g); free(gbnf);
    /* more next characters than the matcher keeps stacks: refused at parse time, naming the limit */
    for (int i = 0; i < 5000; i++) strcpy(text[i] + llm_utf8_encode(0x4E00 + (uint32_t)i, text[i]), "x");
    gbnf = llm_choice_to_grammar(values, 5000, err);
    g = gbnf ? llm_grammar_parse(gbnf, err) : NULL;
    CHECK(gbnf && !g && strstr(err, "more than 4096 alternatives are open at once at its start"),
          "5,000 values that differ in their first character and go on: refused (%s)", g ? "parsed" : err);
    llm_grammar_free(g); free(gbnf);
    free(values); free(text);
    /* the tools' grammar in each format takes parameters with $defs and $ref, as response_format does */
    for (int f = LLM_TOOLS_GENERIC; f <= LLM_TOOLS_HARMONY; f++) {
        llm_chat_template ct;
        memset(&ct, 0, sizeof ct);
        ct.tool_format = f;
        if (f == LLM_TOOLS_HARMONY) ct.family = LLM_CHAT_GPT_OSS;
        char *tg = llm_chat_tool_grammar(&ct, pydantic, LLM_TOOL_AUTO, NULL, 1, err);
        g = tg ? llm_grammar_parse(tg, err) : NULL;
        CHECK(g != NULL, "tool format %d: parameters with $defs and $ref: %s", f, g ? "a grammar" : err);
        llm_grammar_free(g); free(tg);
    }
}

/* The llm command's --grammar, --json-schema and --regex: the output follows them; what cannot be used is
 * refused before the model loads, saying why */
static void test_grammar_cli(void) {
    char path[] = "/tmp/llm-test-gbnf-XXXXXX", cmd[1024];
    int fd = mkstemp(path), status;
    const char *gbnf = "root ::= \"The answer is \" [0-9]+ \".\"\n";
    CHECK(fd >= 0 && write(fd, gbnf, strlen(gbnf)) == (ssize_t)strlen(gbnf), "a grammar file");
    if (fd >= 0) close(fd);
    snprintf(cmd, sizeof cmd, "./llm -m %s -p 'Q: 2+2? A:' -n 30 --temp 0 --grammar %s 2>/dev/null",
             model_path("stories260K.gguf"), path);
    char *out = run_command(cmd, &status);
    const char *rest = out ? out + strlen("Q: 2+2? A:") : "";
    size_t digits = out && strlen(out) > strlen("Q: 2+2? A:The answer is ") ?
                    strspn(rest + strlen("The answer is "), "0123456789") : 0;
    CHECK(out && status == 0 && !strncmp(rest, "The answer is ", 14) && digits > 0 &&
          !strcmp(rest + 14 + digits, ".") , "llm --grammar: \"%s\"", out ? out : "");
    free(out);
    /* llm grammar: the GBNF a schema becomes, which parses and takes a valid instance */
    out = run_command("./llm grammar --json-schema '{\"type\": \"object\", \"properties\": {\"n\": "
                      "{\"type\": \"integer\", \"minimum\": 1, \"maximum\": 12}}, \"required\": [\"n\"]}' "
                      "2>&1", &status);
    char gerr[LLM_ERR_LEN];
    llm_grammar *g = out && status == 0 ? llm_grammar_parse(out, gerr) : NULL;
    CHECK(g && !strcmp(grammar_verdict(g, "{\"n\": 12}", 9), "accept") &&
          !strcmp(grammar_verdict(g, "{\"n\": 13}", 9), "reject"), "llm grammar --json-schema: %s",
          out ? out : "");
    llm_grammar_free(g);
    free(out);
    static const struct { const char *flags, *says; } bad[] = {
        {"--grammar /nonexistent.gbnf", "--grammar /nonexistent.gbnf: No such file"},
        {"--grammar /dev/null", "no rule named root"},
        {"--grammar %s --regex 'a+'", "give one of --grammar, --json-schema and --regex"},
        {"--json-schema '{\"type\": '", "--json-schema: not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char flags[256];
        snprintf(flags, sizeof flags, bad[i].flags, path);
        snprintf(cmd, sizeof cmd, "./llm -m %s -p hi %s 2>&1", model_path("stories260K.gguf"), flags);
        out = run_command(cmd, &status);
        CHECK(out && status == 1 && strstr(out, bad[i].says), "llm %s: exit %d, \"%s\"", flags, status,
              out ? out : "");
        free(out);
    }
    unlink(path);
}

static void test_cli(void) {
    if (access("./llm", X_OK) != 0) { CHECK(0, "./llm not built (make test builds it)"); return; }
    int n;
    ref_case *cases = stories_cases(&n);
    char cmd[2048];
    int status;
    for (int i = 0; i < n && i < 2; i++) {
        snprintf(cmd, sizeof cmd, "./llm -m %s -p '%s' -n %d --temp 0 2>/dev/null",
                 model_path("stories260K.gguf"), cases[i].prompt, cases[i].max_tokens);
        char *out = run_command(cmd, &status);
        size_t lp = strlen(cases[i].prompt);
        CHECK(out && status == 0 && strlen(out) == lp + cases[i].n_completion &&
              !memcmp(out, cases[i].prompt, lp) &&
              !memcmp(out + lp, cases[i].completion, cases[i].n_completion),
              "llm -p \"%s\": stdout is the prompt and llama.cpp's completion", cases[i].prompt);
        free(out);
        snprintf(cmd, sizeof cmd, "./llm -m %s -p '%s' -n %d --temp 0 --ids 2>/dev/null",
                 model_path("stories260K.gguf"), cases[i].prompt, cases[i].max_tokens);
        out = run_command(cmd, &status);
        char want[4096]; size_t wl = 0;
        for (int k = 0; k < cases[i].n_ids; k++)
            wl += (size_t)snprintf(want + wl, sizeof want - wl, "%s%d", k ? " " : "", cases[i].ids[k]);
        snprintf(want + wl, sizeof want - wl, "\n");
        CHECK(out && status == 0 && !strcmp(out, want), "llm --ids: \"%s\"", out ? out : "");
        free(out);
    }
    snprintf(cmd, sizeof cmd, "./llm tokenize -m %s/tokenizer/ggml-vocab-llama-bpe.gguf 'Hello world' 2>&1",
             testdata_dir);
    char *out = run_command(cmd, &status);
    CHECK(out && status == 0 && !strcmp(out, "128000 9906 1917\n"), "llm tokenize (vocab-only file): \"%s\"",
          out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "./llm tokenize -m %s/tokenizer/ggml-vocab-llama-bpe.gguf --no-bos "
             "'Hello world' 2>&1", testdata_dir);
    out = run_command(cmd, &status);
    CHECK(out && status == 0 && !strcmp(out, "9906 1917\n"), "llm tokenize --no-bos: \"%s\"", out ? out : "");
    free(out);
    out = run_command("./llm -m /nonexistent.gguf -p hi 2>&1", &status);
    CHECK(out && status == 1 && strstr(out, "cannot open"), "missing model: exit %d, \"%s\"",
          status, out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "./llm -m %s/tokenizer/ggml-vocab-gpt-2.gguf -p hi 2>&1", testdata_dir);
    out = run_command(cmd, &status);
    CHECK(out && status == 1 && strstr(out, "llm:"), "vocab-only file as a model: exit %d, \"%s\"",
          status, out ? out : "");
    free(out);
    out = run_command("./llm --help 2>&1", &status);
    const char *flags[] = {"-m", "-p", "-n", "--temp", "--top-p", "--top-k", "--min-p", "--seed", "--ids",
                           "tokenize", "--no-bos", "bench", "--dummy", "--static", "--kv-cache-dtype",
                           "llm embed", "--pooling", "--matryoshka"};
    int missing = 0;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!out || !strstr(out, flags[i])) { missing++; printf("    --help lacks %s\n", flags[i]); }
    CHECK(out && status == 0 && missing == 0, "llm --help documents every flag");
    free(out);
    /* llm bench's report names the block size it ran with (it once said 16 whatever --block-size was) */
    out = run_command("./llm bench --dummy tiny --num-prompts 3 --input-len 20:40 --output-len 5:9 "
                      "--block-size 32 --num-blocks 64 2>/dev/null", &status);
    CHECK(out && status == 0 && strstr(out, "requests: 3 in") && strstr(out, "paged, blocks of 32 tokens") &&
          strstr(out, "(64 blocks,"), "llm bench --block-size 32: \"%s\"", out ? out : "");
    /* its time split: the backend's time is its forward calls' and sample steps'; the steps of each kind add
     * up to the steps; every output token came from one row of logits, none read by the host (the bench's
     * requests are greedy, and ask for no logprobs) */
    long long prompt_steps = -1, decode_steps = -1, rows = -1, host_rows = -1, steps = -2, out_tokens = -3;
    double backend_s = -1, forward_s = -1, sample_s = -1;
    const char *split = out ? strstr(out, "time split:") : NULL, *thr = out ? strstr(out, "total thr") : NULL;
    const char *kv = out ? strstr(out, "peak running") : NULL;
    if (split)
        sscanf(split, "time split: backend %lf s (%*d%%: forward %lf s, sample steps %lf", &backend_s,
               &forward_s, &sample_s);
    if (split && strstr(split, "steps: "))
        sscanf(strstr(split, "steps: "), "steps: %lld with prompt tokens, %lld decode only; logit rows %lld, "
               "%lld", &prompt_steps, &decode_steps, &rows, &host_rows);
    if (kv && strstr(kv, "steps: ")) sscanf(strstr(kv, "steps: "), "steps: %lld", &steps);
    if (thr && strstr(thr, "+ output ")) sscanf(strstr(thr, "+ output "), "+ output %lld", &out_tokens);
    const char *mem = out ? strstr(out, "memory: resident ") : NULL;
    CHECK(mem && atof(mem + strlen("memory: resident ")) > 1, "llm bench reports its resident memory: \"%s\"",
          out ? out : "");
    CHECK(prompt_steps >= 1 && prompt_steps + decode_steps == steps && rows == out_tokens && host_rows == 0 &&
          forward_s >= 0 && sample_s >= 0 && fabs(forward_s + sample_s - backend_s) <= 0.0016,
          "llm bench's time split: %lld + %lld steps of %lld, %lld rows, %lld read by the host, %lld output "
          "tokens; backend %.3f s = forward %.3f + sample %.3f", prompt_steps, decode_steps, steps, rows,
          host_rows, out_tokens, backend_s, forward_s, sample_s);
    /* its warmup request is in none of the figures: with --no-warmup, the same steps, rows, prompt tokens
     * computed (no block of the warmup's served the workload from the prefix cache) and KV usage */
    char *cold = run_command("./llm bench --dummy tiny --num-prompts 3 --input-len 20:40 --output-len 5:9 "
                             "--block-size 32 --num-blocks 64 --no-warmup 2>/dev/null", &status);
    int same = out && cold && status == 0;
    static const char *const counted[] = {"steps: ", "mean KV usage: ", "(prompt "};
    for (int i = 0; same && i < 3; i++) {
        const char *a = strstr(out, counted[i]), *b = strstr(cold, counted[i]); /* to the end of the line */
        same = a && b && strcspn(a, "\n") == strcspn(b, "\n") && !strncmp(a, b, strcspn(a, "\n"));
    }
    CHECK(same, "llm bench: the same figures with and without its warmup:\n%s\n%s", out ? out : "",
          cold ? cold : "");
    /* ... and the warmup ran: the longest prompt --input-len allows, 2 tokens out; not with --no-warmup */
    CHECK(out && strstr(out, "warmup: 1 request, 40 prompt tokens and 2 output tokens") && cold &&
          !strstr(cold, "warmup"), "llm bench's warmup ran (and not with --no-warmup):\n%s\n%s",
          out ? out : "", cold ? cold : "");
    free(cold);
    free(out);
    /* a mixture of experts' shape (qwen3moe's, small): every request finishes */
    out = run_command("./llm bench --dummy tiny-moe --num-prompts 6 --input-len 20:40 --output-len 5:9 "
                      "2>/dev/null", &status);
    CHECK(out && status == 0 && strstr(out, "requests: 6 in"), "llm bench --dummy tiny-moe: \"%s\"",
          out ? out : "");
    free(out);
    out = run_command("./llm bench --dummy tiny --block-size 0 2>&1", &status);
    CHECK(out && status == 1 && strstr(out, "--block-size"), "llm bench --block-size 0: exit %d, \"%s\"",
          status, out ? out : "");
    free(out); free(cases);
}

/* llama.cpp's general.sampling.* keys: read into the sampling parameters (llm_model_sampling_defaults), shown
 * on the load line of llm and llm serve, overridden by flags; out-of-range values and keys with no sampler
 * here are named and left out. */
static void test_sampling_keys(void) {
    float temp = 0.6f, top_p = 0.95f, min_p = 0.1f, rep = 1.05f, bad_top_p = 7;
    int32_t top_k = 20, mirostat = 0;
    test_kv kvs[] = {{"general.sampling.temp", LLM_GGUF_F32, &temp, 4},
                     {"general.sampling.top_k", LLM_GGUF_I32, &top_k, 4},
                     {"general.sampling.top_p", LLM_GGUF_F32, &top_p, 4},
                     {"general.sampling.min_p", LLM_GGUF_F32, &min_p, 4},
                     {"general.sampling.penalty_repeat", LLM_GGUF_F32, &rep, 4},
                     {"general.sampling.mirostat", LLM_GGUF_I32, &mirostat, 4}};
    char path[64], bad[64], err[LLM_ERR_LEN], note[LLM_ERR_LEN], cmd[2048];
    test_kv bad_kvs[] = {{"general.sampling.top_p", LLM_GGUF_F32, &bad_top_p, 4}};
    if (gguf_with_keys("stories260K.gguf", kvs, 6, path) != 0 ||
        gguf_with_keys("stories260K.gguf", bad_kvs, 1, bad) != 0) {
        CHECK(0, "write GGUF copies with general.sampling.* keys");
        return;
    }
    llm_model m;
    llm_sampling_params p = llm_sampling_defaults();
    int bits = -1;
    if (llm_model_load(&m, path, err) == 0) {
        bits = llm_model_sampling_defaults(&m, &p, note);
        llm_model_free(&m);
    } else printf("    %s\n", err);
    CHECK(bits == 31 && p.temperature == temp && p.top_k == 20 && p.top_p == top_p && p.min_p == min_p &&
          p.repetition_penalty == rep && p.n == 1 && p.seed == -1 &&
          !strcmp(note, "not used (no such sampler here): mirostat"),
          "general.sampling.*: bits %d, temp %g top_k %d top_p %g min_p %g penalty %g, note \"%s\"", bits,
          p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, note);
    p = llm_sampling_defaults();
    bits = -1;
    if (llm_model_load(&m, bad, err) == 0) {
        bits = llm_model_sampling_defaults(&m, &p, note);
        llm_model_free(&m);
    }
    CHECK(bits == 0 && p.top_p == 1 &&
          !strcmp(note, "general.sampling.top_p is not a number in [1e-09, 1]: ignored"),
          "general.sampling.top_p 7: left out (bits %d, top_p %g), note \"%s\"", bits, p.top_p, note);
    p = llm_sampling_defaults();
    bits = -1;
    if (llm_model_load(&m, model_path("stories260K.gguf"), err) == 0) {
        bits = llm_model_sampling_defaults(&m, &p, note);
        llm_model_free(&m);
    }
    CHECK(bits == 0 && p.temperature == 1 && p.top_p == 1 && !note[0], "no general.sampling.*: bits %d",
          bits);
    /* the llm command: the file's values, the flags over them, both on the load line */
    int status;
    snprintf(cmd, sizeof cmd, "./llm -m %s -p Once -n 4 2>&1 >/dev/null | grep '^llm: sampling'", path);
    char *out = run_command(cmd, &status);
    CHECK(out && !strcmp(out, "llm: sampling: temp 0.6 top-k 20 top-p 0.95 min-p 0.1 repeat-penalty 1.05 "
                              "(temp, top_k, top_p, min_p, penalty_repeat from the file's "
                              "general.sampling.*; the file's not used (no such sampler here): mirostat)\n"),
          "llm: the file's sampling on the load line: \"%s\"", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "./llm -m %s -p Once -n 4 --temp 0 --top-k 5 2>&1 >/dev/null | "
             "grep '^llm: sampling'", path);
    out = run_command(cmd, &status);
    CHECK(out && !strcmp(out, "llm: sampling: greedy (temp 0) repeat-penalty 1.05 (--temp, --top-k from the "
                              "command line; top_p, min_p, penalty_repeat from the file's "
                              "general.sampling.*; the file's not used (no such sampler here): mirostat)\n"),
          "llm: flags over the file's sampling: \"%s\"", out ? out : "");
    free(out);
    /* greedy with the penalty turned off by flag: the copy gives the original file's text */
    snprintf(cmd, sizeof cmd, "./llm -m %s -p Once -n 24 --temp 0 --repeat-penalty 1 2>/dev/null", path);
    char *copy_text = run_command(cmd, &status);
    snprintf(cmd, sizeof cmd, "./llm -m %s -p Once -n 24 --temp 0 2>/dev/null",
             model_path("stories260K.gguf"));
    char *orig_text = run_command(cmd, &status);
    CHECK(copy_text && orig_text && strlen(orig_text) > 20 && !strcmp(copy_text, orig_text),
          "llm: --repeat-penalty 1 over the file's 1.05: \"%s\" vs \"%s\"", copy_text ? copy_text : "",
          orig_text ? orig_text : "");
    free(copy_text); free(orig_text);
    snprintf(cmd, sizeof cmd, "./llm -m %s -p Once -n 4 2>&1 >/dev/null | grep '^llm: sampling'",
             model_path("stories260K.gguf"));
    out = run_command(cmd, &status);
    CHECK(out && !strcmp(out, "llm: sampling: temp 0.8 top-k 40 top-p 0.95 min-p 0.05 (llama.cpp's defaults, "
                              "the file has no general.sampling.*)\n"),
          "llm: llama.cpp's defaults without keys: \"%s\"", out ? out : "");
    free(out);
    remove(path); remove(bad);
}

/* The sections of llm.h, as its map (the docs block), its declarations and its implementation name them: the
 * first word after the number of each ("4. Requests ..."), in the order they come. */
/* -----------------------------------------------------------------------------------------------------------
 * Hardening: the faults a fuzzing and sanitizer pass found in 0736d1f, each with the input that showed it
 * -------------------------------------------------------------------------------------------------------- */
/* Steps e until it has no work, then once more (which frees what finished); returns the outputs' finishes. */
static int drain_engine(llm_engine *e, uint64_t *last_finished) {
    int finishes = 0;
    const llm_output *out;
    while (llm_engine_has_work(e)) {
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++)
            if (out[i].finish_reason) { finishes++; if (last_finished) *last_finished = out[i].request_id; }
    }
    llm_engine_step(e, &out);
    return finishes;
}

/* 1. llm_engine_add_request read its request's id after letting the lock go, when the engine thread may
 *    already have run the request to its end and freed it. The hook (test_after_add) runs the whole request
 *    right there, between the unlock and the return: under ASan the old code reads freed memory. */
static llm_engine *g_add_engine;
static uint64_t g_add_finished;
static void run_request_to_its_end(void) {
    test_after_add = NULL;
    drain_engine(g_add_engine, &g_add_finished);
}

static void test_fault_add_request_race(void) {
    llm_engine *e = stories_engine();
    if (!e) return;
    char err[LLM_ERR_LEN];
    llm_sampling_params p = llm_sampling_defaults();
    p.temperature = 0; p.max_tokens = 2;
    uint64_t first = llm_engine_add_request(e, "Once", NULL, 0, &p, NULL, err);
    drain_engine(e, NULL);
    g_add_engine = e; g_add_finished = 0;
    test_after_add = run_request_to_its_end;
    uint64_t id = llm_engine_add_request(e, "Once upon", NULL, 0, &p, NULL, err);
    test_after_add = NULL;
    CHECK(first > 0 && id == first + 1 && g_add_finished == id,
          "fault 1: add_request's id once its request ran to the end and was freed: %llu (finished: %llu)",
          (unsigned long long)id, (unsigned long long)g_add_finished);
    llm_engine_destroy(e);
}

/* 2. Sampling read ids[n - 1] with n == 0 when no candidate was left, and emitted token 0 forever from logits
 *    that were not numbers. A temperature whose 1/T overflows is greedy now; a tiny repetition penalty keeps
 *    the logits finite; logits that are not finite end the request with an error (a backend that writes
 *    NaN), and a file whose rms_eps is NaN does not load. */
static int nan_forward(llm_backend *be, const llm_batch *b, float *logits, char *err) {
    llm_backend *cpu = (llm_backend *)be->ctx;
    int rc = cpu->forward(cpu, b, logits, err);
    logits[3] = NAN;
    return rc;
}
static llm_backend *nan_create(const llm_model *m, char *err) {
    llm_backend *be = flaky_create(m, err);
    if (be) be->forward = nan_forward;
    return be;
}

static void test_fault_sampling(void) {
    llm_engine_config cfg = engine_config("stories260K.gguf");
    llm_engine *e = engine_new(&cfg);
    if (!e) return;
    char err[LLM_ERR_LEN];
    llm_sampling_params greedy = llm_sampling_defaults();
    greedy.temperature = 0; greedy.max_tokens = 12;
    run_result *r = (run_result *)calloc(1, sizeof *r);
    run_add(e, r, "Once upon a time", NULL, 0, &greedy);
    llm_sampling_params tiny_t = greedy;
    tiny_t.temperature = 1e-40f; tiny_t.seed = 1;
    run_add(e, r, "Once upon a time", NULL, 0, &tiny_t);
    llm_sampling_params tiny_rp = greedy;
    tiny_rp.temperature = 1.0f; tiny_rp.repetition_penalty = 1e-38f; tiny_rp.seed = 2;
    run_add(e, r, "Once upon a time", NULL, 0, &tiny_rp);
    run_engine(e, r);
    int in_vocab = r->n_tokens[2][0] == 12;
    for (int i = 0; i < r->n_tokens[2][0]; i++)
        in_vocab &= r->tokens[2][0][i] >= 0 && r->tokens[2][0][i] < 512;
    CHECK(r->n_tokens[0][0] == 12 && r->n_tokens[1][0] == 12 &&
          !memcmp(r->tokens[0][0], r->tokens[1][0], 48) && r->finish[1][0] == LLM_FINISH_LENGTH,
          "fault 2: temperature 1e-40 samples as greedy");
    CHECK(in_vocab && r->finish[2][0] == LLM_FINISH_LENGTH,
          "fault 2: repetition_penalty 1e-38 samples 12 real tokens (%d)", r->n_tokens[2][0]);
    free(r);
    llm_sampling_params bad = greedy;
    bad.temperature = INFINITY;
    CHECK(!llm_engine_add_request(e, "x", NULL, 0, &bad, NULL, err) && strstr(err, "temperature"),
          "fault 2: an infinite temperature is refused: %s", err);
    llm_engine_destroy(e);
    /* a model whose logits are not numbers: the request ends with an error, for greedy and sampling alike */
    cfg.create_backend = nan_create;
    flaky_calls = 0; flaky_fail_at = -1;
    e = engine_new(&cfg);
    if (!e) return;
    for (int k = 0; k < 2; k++) {
        llm_sampling_params p = greedy;
        p.temperature = k ? 0.8f : 0.0f;
        llm_engine_add_request(e, "Once", NULL, 0, &p, NULL, err);
        const llm_output *out;
        int got = 0, n_tokens = 0;
        const char *msg = "";
        while (llm_engine_has_work(e)) {
            int n = llm_engine_step(e, &out);
            for (int i = 0; i < n; i++) {
                n_tokens += out[i].n_tokens;
                if (out[i].finish_reason == LLM_FINISH_ERROR) { got = 1; msg = out[i].error; }
            }
            if (got) break;
        }
        CHECK(got && n_tokens == 0 && strstr(msg, "not finite"), "fault 2: NaN logits (temperature %g): %s",
              p.temperature, msg);
    }
    llm_engine_destroy(e);
    /* rms_eps NaN in the file: refused at load, naming the key */
    char path[64];
    float nan_value = NAN;
    const char *eps_key = "llama.attention.layer_norm_rms_epsilon";
    if (gguf_patched("stories260K.gguf", eps_key, 0, &nan_value, 4, path) == 0) {
        llm_model m;
        CHECK(llm_model_load(&m, path, err) != 0 && strstr(err, "llama.attention.layer_norm_rms_epsilon"),
              "fault 2: rms_eps NaN: %s", err);
        remove(path);
    } else CHECK(0, "patch stories260K's rms_eps");
}

/* 3. A negative n_prompt_ids overflowed the heap inside stb_ds. 4. Aborting an n > 1 request before its
 *    prompt was computed finished sample 0 only. */
static void test_fault_requests(void) {
    llm_engine *e = stories_engine();
    if (!e) return;
    char err[LLM_ERR_LEN] = "";
    llm_sampling_params p = llm_sampling_defaults();
    int32_t ids[4] = {1, 403, 407, 261};
    CHECK(!llm_engine_add_request(e, NULL, ids, -1, &p, NULL, err) && strstr(err, "negative"),
          "fault 3: n_prompt_ids -1: %s", err);
    p.n = 3; p.max_tokens = 4;
    uint64_t id = llm_engine_add_request(e, NULL, ids, 4, &p, NULL, err);
    llm_engine_abort(e, id);
    int finished[3] = {0}, others = 0;
    const llm_output *out;
    for (int steps = 0; llm_engine_has_work(e) && steps < 10; steps++) {
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) {
            if (out[i].request_id == id && out[i].index >= 0 && out[i].index < 3 &&
                out[i].finish_reason == LLM_FINISH_ABORT) finished[out[i].index]++;
            else others++;
        }
    }
    llm_engine_stats st = llm_engine_get_stats(e);
    CHECK(finished[0] == 1 && finished[1] == 1 && finished[2] == 1 && others == 0 &&
          st.num_free_blocks == st.num_blocks, "fault 4: every sample of an aborted n=3 request finishes "
          "(%d %d %d, %d others)", finished[0], finished[1], finished[2], others);
    llm_engine_destroy(e);
}

/* 6. Numbers read from a file drive allocations and casts: each is checked, and the error names the key. */
static void test_fault_gguf_numbers(void) {
    static const struct {
        const char *key;
        uint64_t index;
        uint32_t u32;
        float f32;
        int is_float;
    } cases[] = {
        {"llama.block_count", 0, 2147483647u, 0, 0},
        {"llama.block_count", 0, 6, 0, 0},          /* one more than the file has layers */
        {"llama.context_length", 0, 2147483647u, 0, 0},
        {"llama.embedding_length", 0, 0, 0, 0},
        {"llama.attention.head_count_kv", 0, 3, 0, 0}, /* 8 heads are not groups of 3 */
        {"tokenizer.ggml.scores", 7, 0, -INFINITY, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[64], err[LLM_ERR_LEN] = "";
        const void *v = cases[i].is_float ? (const void *)&cases[i].f32 : (const void *)&cases[i].u32;
        if (gguf_patched("stories260K.gguf", cases[i].key, cases[i].index, v, 4, path) != 0) {
            CHECK(0, "patch %s", cases[i].key);
            continue;
        }
        llm_model m;
        int rc = llm_model_load(&m, path, err);
        CHECK(rc != 0 && strstr(err, strchr(cases[i].key, '.') + 1) && !strstr(err, "out of memory"),
              "fault 6: %s patched: %s", cases[i].key, err);
        if (rc == 0) llm_model_free(&m);
        remove(path);
    }
}

/* 5. The REPL cut lines longer than 8191 bytes into several prompts. 7. Numeric flags took nonsense. */
static void test_fault_command_line(void) {
    char cmd[1024];
    int status;
    /* one line of 9000 bytes: one prompt of 1802 tokens (not 1639 tokens and then 163) */
    FILE *f = fopen("llm-test-long-line.txt", "w");
    if (f) { for (int i = 0; i < 1800; i++) fputs("Lily ", f); fputs("\n", f); fclose(f); }
    snprintf(cmd, sizeof cmd, "./llm -m %s -n 4 --temp 0 < llm-test-long-line.txt 2>&1",
             model_path("stories260K.gguf"));
    char *out = run_command(cmd, &status);
    int prompts = 0; /* each prompt gives a line of figures, or the reason it cannot run */
    for (const char *p = out; p && (p = strstr(p, "llm: prompt ")); p++) prompts++;
    for (const char *p = out; p && (p = strstr(p, "the prompt has")); p++) prompts++;
    CHECK(out && prompts == 1 && strstr(out, "llm: prompt 1802 tokens"),
          "fault 5: a 9000-byte line is one prompt: %s", out ? out : "");
    free(out);
    remove("llm-test-long-line.txt");
    static const struct { const char *args, *flag; } bad[] = {
        {"-n abc", "-n"}, {"--seed abc", "--seed"}, {"--block-size 0", "--block-size"},
        {"--block-size -1", "--block-size"}, {"--num-blocks -3", "--num-blocks"},
        {"--max-num-seqs -1", "--max-num-seqs"}, {"--kv-gib -1", "--kv-gib"}, {"--temp 1x", "--temp"},
        {"--top-p nan", "--top-p"}, {"-n 99999999999", "-n"}, {"--kv-fraction 2", "--kv-fraction"},
        {"--kv-cache-dtype f8", "--kv-cache-dtype"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "./llm -m %s -p Once %s 2>&1", model_path("stories260K.gguf"),
                 bad[i].args);
        out = run_command(cmd, &status);
        char want[64];
        snprintf(want, sizeof want, "llm: %s ", bad[i].flag);
        CHECK(status == 1 && out && strstr(out, want), "fault 7: %s: exit %d, %s", bad[i].args, status,
              out ? out : "");
        free(out);
    }
    out = run_command("./llm bench --dummy tiny --num-prompts -1 2>&1", &status);
    CHECK(status == 1 && out && strstr(out, "--num-prompts"), "fault 7: bench --num-prompts -1: %s",
          out ? out : "");
    free(out);
}

/* 8. OpenMP's threads spun while they waited (libgomp's default), so llm slowed down 75 times beside a busy
 *    neighbour: the llm command runs with a short spin (GOMP_SPINCOUNT=2000) unless the environment sets how
 *    OpenMP waits. */
static void test_fault_wait_policy(void) {
    int status;
    char cmd[512];
#ifndef _OPENMP /* built without OpenMP (TSAN=1): one thread, and the load line says so */
    snprintf(cmd, sizeof cmd, "./llm -m %s -p Once -n 2 --temp 0 2>&1 >/dev/null",
             model_path("stories260K.gguf"));
    char *one = run_command(cmd, &status);
    CHECK(status == 0 && one && strstr(one, "one thread (built without OpenMP)"), "fault 8: no OpenMP: %s",
          one ? one : "");
    free(one);
    return;
#endif
    /* the environment llm runs with, read from /proc while its REPL waits for a line (the load line shows
     * only what a user can act on, not this internal setting) */
    snprintf(cmd, sizeof cmd, "sleep 10 | env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT ./llm -m %s >/dev/null "
             "2>&1 & p=$!; for i in $(seq 100); do e=$(tr '\\0' '\\n' < /proc/$p/environ | "
             "grep -E '^(GOMP_SPINCOUNT|OMP_WAIT_POLICY)='); [ -n \"$e\" ] && break; sleep 0.1; done; "
             "echo \"$e\"; kill $p", model_path("stories260K.gguf"));
    char *out = run_command(cmd, &status);
    CHECK(out && !strcmp(out, "GOMP_SPINCOUNT=2000\n"), "fault 8: the short spin: \"%s\"", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive ./llm -m %s -p Once -n 2 "
             "--temp 0 2>&1 >/dev/null", model_path("stories260K.gguf"));
    out = run_command(cmd, &status);
    char cpu_line[96];
    snprintf(cpu_line, sizeof cpu_line, "the CPU (%s kernels), up to ", cpu_kernels_built());
    CHECK(status == 0 && out && strstr(out, cpu_line) &&
          strstr(out, "(fewer while other processes keep cores busy; OMP_NUM_THREADS=N fixes how many), "
                      "waiting as OMP_WAIT_POLICY=passive;"),
          "fault 8: a policy set is kept, and said: %s", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 ./llm -m %s -p Once -n 2 --temp 0 2>&1 >/dev/null",
             model_path("stories260K.gguf"));
    out = run_command(cmd, &status);
    snprintf(cpu_line, sizeof cpu_line, "running on the CPU (%s kernels), 1 thread (OMP_NUM_THREADS);",
             cpu_kernels_built());
    CHECK(status == 0 && out && strstr(out, cpu_line),
          "fault 8: OMP_NUM_THREADS fixes the threads, and the load line says so: %s", out ? out : "");
    free(out);
}

/* 9. Beside a busy process 2 threads decoded 3-4 times slower than 1 (each parallel loop waits for the thread
 *    that shares its core): the CPU backend leaves a core to each other runnable task, from /proc/loadavg's
 *    count smoothed over steps. */
static void test_threads_for_load(void) {
    double others = 0;
    CHECK(llm_cpu_threads_for_load(&others, 2, NULL) == 2 && others == 0, "threads: no /proc/loadavg: all");
    CHECK(llm_cpu_threads_for_load(&others, 2, "garbage\n") == 2 && others == 0, "threads: a bad line: all");
    int n = llm_cpu_threads_for_load(&others, 2, "0.00 0.01 0.05 1/120 999\n");
    CHECK(n == 2 && others == 0, "threads: alone (this thread the only one running): %d, %g", n, others);
    n = llm_cpu_threads_for_load(&others, 2, "1.00 1.00 1.00 3/130 1000\n");
    CHECK(n == 2 && fabs(others - 0.4) < 1e-9, "threads: one step with two others (a blip): %d, %g", n,
          others);
    for (int i = 0; i < 8; i++) n = llm_cpu_threads_for_load(&others, 2, "1.00 1.00 1.00 2/130 1000\n");
    CHECK(n == 1 && others > 0.85 && others < 1.0, "threads: one other busy process: %d, %g", n, others);
    for (int i = 0; i < 8; i++) n = llm_cpu_threads_for_load(&others, 2, "1.00 1.00 1.00 1/130 1000\n");
    CHECK(n == 2 && others < 0.2, "threads: it left again: %d, %g", n, others);
    for (int i = 0; i < 20; i++) n = llm_cpu_threads_for_load(&others, 16, "9.00 9.00 9.00 40/130 1000\n");
    CHECK(n == 1, "threads: never fewer than one: %d (others %g)", n, others);
}

/* -----------------------------------------------------------------------------------------------------------
 * Chat: each template family against its published Jinja template, detection from real template texts, and
 * the chat REPL (piped and on a pseudo-terminal) on the default chat model
 * -------------------------------------------------------------------------------------------------------- */
/* Published chat templates (tokenizer_config.json of each model on Hugging Face), stored for detection. The
 * long ones keep the lines around their markers; llama-bpe's (Llama 3) and qwen2's (Qwen3) come whole from
 * the vocabularies in testdata/tokenizer, SmolLM2's from the default model. */
static const struct { const char *model, *text; int family; } chat_published[] = {
    {"Qwen/Qwen2.5-0.5B-Instruct",
     "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n   "
     "     {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba "
     "Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n{%- else %}\n    {%- if messages[0]['role'] "
     "== 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    "
     "{%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
     "helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n  "
     "  {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
     "(message.role == \"assistant\" and not message.tool_calls) %}\n        {{- '<|im_start|>' + "
     "message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- endif %}\n{%- endfor %}\n{%- "
     "if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n", LLM_CHAT_CHATML},
    {"meta-llama/Llama-3.1-8B-Instruct",
     "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" "
     "%}\n{%- endif %}\n{#- System message + builtin tools #}\n{{- \"<|start_header_id|>system<|end_header_id"
     "|>\\n\\n\" }}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string "
     "+ \"\\n\\n\" }}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n{%- for message in messages %}\n        "
     "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
     "'<|eot_id|>' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<"
     "|end_header_id|>\\n\\n' }}\n{%- endif %}\n", LLM_CHAT_LLAMA3},
    {"meta-llama/Llama-2-7b-chat-hf",
     "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
     "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false "
     "%}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 "
     "== 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% "
     "endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
     "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
     "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
     "content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' "
     "' + eos_token }}{% endif %}{% endfor %}",
     LLM_CHAT_LLAMA2},
    {"mistralai/Mistral-7B-Instruct-v0.1",
     "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    "
     "{%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- "
     "endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message['role'] == "
     "'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' + "
     "system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' "
     "[INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == "
     "'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- endif %}\n{%- endfor %}\n",
     LLM_CHAT_MISTRAL_V1},
    {"mistralai/Mistral-7B-Instruct-v0.3",
     "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n   "
     "     {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- "
     "\"[AVAILABLE_TOOLS] [\" }}\n        {%- endif %}\n        {%- if loop.last and system_message is "
     "defined %}\n            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + "
     "\"[/INST]\" }}\n        {%- else %}\n            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" "
     "}}\n        {%- endif %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + "
     "message[\"content\"]|trim + eos_token}}\n    {%- endif %}\n{%- endfor %}\n", LLM_CHAT_MISTRAL_V3},
    {"mistralai/Mistral-Nemo-Instruct-2407",
     "{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if message[\"role\"] == \"user\" %}\n   "
     "     {%- if tools is not none and (message == user_messages[-1]) %}\n            {{- "
     "\"[AVAILABLE_TOOLS][\" }}\n        {%- endif %}\n        {%- if loop.last and system_message is "
     "defined %}\n            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + "
     "\"[/INST]\" }}\n        {%- else %}\n            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" "
     "}}\n        {%- endif %}\n    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- "
     "message[\"content\"] + eos_token}}\n    {%- endif %}\n{%- endfor %}\n", LLM_CHAT_MISTRAL_V3_TEKKEN},
    {"mistralai/Mistral-Large-Instruct-2411",
     "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
     "message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + "
     "message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
     "message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and assistant roles "
     "are supported!') }}{% endif %}{% endfor %}", LLM_CHAT_MISTRAL_V7},
    {"mistralai/Mistral-Small-24B-Instruct-2501",
     "{{- bos_token }}\n{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}\n\n{%- for message in "
     "loop_messages %}\n    {%- if message['role'] == 'user' %}\n        {{- '[INST]' + message['content'] + "
     "'[/INST]' }}\n    {%- elif message['role'] == 'system' %}\n        {{- '[SYSTEM_PROMPT]' + "
     "message['content'] + '[/SYSTEM_PROMPT]' }}\n    {%- elif message['role'] == 'assistant' %}\n        "
     "{{- message['content'] + eos_token }}\n    {%- endif %}\n{%- endfor %}", LLM_CHAT_MISTRAL_V7_TEKKEN},
    {"TinyLlama/TinyLlama-1.1B-Chat-v1.0",
     "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
     "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + "
     "message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + "
     "message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ "
     "'<|assistant|>' }}\n{% endif %}\n{% endfor %}", LLM_CHAT_ZEPHYR},
    {"microsoft/Phi-3.5-mini-instruct",
     "{% for message in messages %}{% if message['role'] == 'system' and message['content'] "
     "%}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' "
     "%}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' "
     "%}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if "
     "add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}", LLM_CHAT_PHI3},
    {"google/gemma-2-2b-it",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') "
     "}}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) "
     "%}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif "
     "%}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = "
     "message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
     "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
     , LLM_CHAT_GEMMA},
    {"google/gemma-3-1b-it",
     "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- set first_user_prefix = "
     "messages[0]['content'] + '\n\n' -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    "
     "{%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for "
     "message in loop_messages -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = "
     "\"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ "
     "'<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    {{ "
     "message['content'] | trim }}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if "
     "add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n", LLM_CHAT_GEMMA},
};

/* The CPU seconds this thread spends rendering msgs[0..n) with ct (measuring: no text kept); *len the
 * length llm_chat_render returned. */
static double chat_render_seconds(const llm_chat_template *ct, const llm_chat_message *msgs, int n,
                                  const char *tools, int *len) {
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    *len = llm_chat_render(ct, msgs, n, tools, 1, NULL, 0);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    return (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
}

/* Request bytes drive the render's work: gpt-oss keeps a call's thinking unless a final answer follows it,
 * found once for the whole conversation. 50,000 calls, each with its result, render within 20x the time of
 * as many user messages, plus 50 ms (this thread's CPU time); a scan of the later messages at each call
 * took seconds. And the text is bounded as it is written (max_text). */
static void test_chat_render_work(void) {
    llm_gguf g;
    llm_tokenizer *t = tok_load(&g, "ggml-vocab-gpt-2.gguf", NULL);
    size_t text_len = 0;
    char *text = read_file("testdata/templates/openai-gpt-oss-120b.jinja", &text_len), err[LLM_ERR_LEN] = "";
    llm_chat_template ct;
    int ok = t && text && llm_chat_template_init(&ct, text, text_len, t, NULL, err) == 0 &&
             ct.family == LLM_CHAT_GPT_OSS;
    CHECK(ok, "gpt-oss's template: %s", err);
    const int calls = 50000, n = 1 + 2 * calls;
    llm_chat_message *msgs = (llm_chat_message *)calloc((size_t)n, sizeof *msgs),
                     *users = (llm_chat_message *)calloc((size_t)n, sizeof *users);
    static const llm_chat_tool_call call = {.name = "f", .arguments = "{}"};
    msgs[0] = (llm_chat_message){.role = "user", .content = "Hi"};
    for (int i = 0; i < calls; i++) {
        msgs[1 + 2 * i] = (llm_chat_message){.role = "assistant", .reasoning = "hm", .tool_calls = &call,
                                             .n_tool_calls = 1};
        msgs[2 + 2 * i] = (llm_chat_message){.role = "tool", .content = "1"};
    }
    for (int i = 0; i < n; i++) users[i] = (llm_chat_message){.role = "user", .content = "Hi"};
    int len_calls = -1, len_users = -1;
    double t_calls = ok ? chat_render_seconds(&ct, msgs, n, NULL, &len_calls) : 0;
    double t_users = ok ? chat_render_seconds(&ct, users, n, NULL, &len_users) : 0;
    CHECK(!ok || (len_calls > 0 && len_users > 0 && t_calls <= 20 * t_users + 0.05),
          "gpt-oss: %d calls rendered in %.3f s (length %d), %d user messages in %.4f s", calls, t_calls,
          len_calls, n, t_users);
    free(msgs); free(users); free(text);
    if (t) { llm_tokenizer_free(t); llm_gguf_close(&g); }

    /* Mistral v3 and v11 write the tools before each question that repeats the last: 1,000 of them and 100
     * KB of tools are 100 MB; with max_text 1 MB the render stops there, -2, within a second (unbounded,
     * the measure and the write each took the 100 MB's time, and the caller its malloc) */
    static const char *const mistral[] = {"testdata/templates/mistralai-Mistral-Large-Instruct-2407-v3.jinja",
                                          "testdata/templates/Mistral-Small-3.2-24B-Instruct-2506.jinja"};
    const int questions = 1000, desc = 100 << 10;
    char *tools = (char *)malloc((size_t)desc + 128);
    int k = sprintf(tools, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"");
    memset(tools + k, 'a', (size_t)desc);
    sprintf(tools + k + desc, "\"}}]");
    llm_chat_message *turns = (llm_chat_message *)calloc(2 * (size_t)questions, sizeof *turns);
    for (int i = 0; i < 2 * questions - 1; i++)
        turns[i] = (llm_chat_message){.role = i % 2 ? "assistant" : "user", .content = i % 2 ? "y" : "x"};
    for (size_t f = 0; f < sizeof mistral / sizeof mistral[0]; f++) {
        t = tok_load(&g, "ggml-vocab-llama-spm.gguf", NULL);
        text = read_file(mistral[f], &text_len);
        ok = t && text && llm_chat_template_init(&ct, text, text_len, t, NULL, err) == 0;
        CHECK(ok, "%s: %s", mistral[f], err);
        ct.max_text = 1 << 20;
        int len = -1;
        double secs = ok ? chat_render_seconds(&ct, turns, 2 * questions - 1, tools, &len) : 0;
        CHECK(!ok || (len == -2 && secs < 1), "%s: tools before 1,000 questions under a 1 MB bound: %d in "
              "%.3f s", mistral[f], len, secs);
        free(text);
        if (t) { llm_tokenizer_free(t); llm_gguf_close(&g); }
    }
    free(turns); free(tools);
}

static void test_chat_templates(void) {
    /* the fixed conversation; the reply has a space on each side, which some templates trim */
    const llm_chat_message conv[] = {{"system", "You are a helpful assistant."}, {"user", "Hello"},
                                     {"assistant", " Hi there "}, {"user", "Who are you?"}};
    /* What each family's published template renders for it, with the generation prompt. The BOS and EOS
     * texts are each model's own. */
    static const struct { int family; const char *bos, *eos, *want; } cases[] = {
        /* HuggingFaceTB/SmolLM2-135M-Instruct, Qwen/Qwen2.5-0.5B-Instruct (a system message given) */
        {LLM_CHAT_CHATML, "", "<|im_end|>",
         "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
         "<|im_start|>assistant\n Hi there <|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n"
         "<|im_start|>assistant\n"},
        /* Qwen/Qwen3-0.6B with enable_thinking=False: the earlier reply as it is, an empty think block */
        {LLM_CHAT_QWEN3, "", "<|im_end|>",
         "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
         "<|im_start|>assistant\n Hi there <|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n"
         "<|im_start|>assistant\n<think>\n\n</think>\n\n"},
        /* meta-llama/Meta-Llama-3-8B-Instruct: every turn trimmed */
        {LLM_CHAT_LLAMA3, "<|begin_of_text|>", "<|eot_id|>",
         "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
         "assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>a"
         "ssistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are "
         "you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
        /* meta-llama/Llama-2-7b-chat-hf: no generation prompt; BOS before each [INST] */
        {LLM_CHAT_LLAMA2, "<s>", "</s>",
         "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHello [/INST] Hi there </s>"
         "<s>[INST] Who are you? [/INST]"},
        /* mistralai/Mistral-7B-Instruct-v0.1 */
        {LLM_CHAT_MISTRAL_V1, "<s>", "</s>",
         "<s> [INST] You are a helpful assistant.\n\nHello [/INST]  Hi there </s> [INST] Who are you? "
         "[/INST]"},
        /* mistralai/Mistral-7B-Instruct-v0.3: the system prompt goes with the last user turn */
        {LLM_CHAT_MISTRAL_V3, "<s>", "</s>",
         "<s>[INST] Hello[/INST] Hi there</s>[INST] You are a helpful assistant.\n\nWho are you?[/INST]"},
        /* mistralai/Mistral-Nemo-Instruct-2407 */
        {LLM_CHAT_MISTRAL_V3_TEKKEN, "<s>", "</s>",
         "<s>[INST]Hello[/INST] Hi there </s>[INST]You are a helpful assistant.\n\nWho are you?[/INST]"},
        /* mistralai/Mistral-Large-Instruct-2411 */
        {LLM_CHAT_MISTRAL_V7, "<s>", "</s>",
         "<s>[SYSTEM_PROMPT] You are a helpful assistant.[/SYSTEM_PROMPT][INST] Hello[/INST]  Hi there </s>"
         "[INST] Who are you?[/INST]"},
        /* mistralai/Mistral-Small-24B-Instruct-2501 (its default system prompt aside) */
        {LLM_CHAT_MISTRAL_V7_TEKKEN, "<s>", "</s>",
         "<s>[SYSTEM_PROMPT]You are a helpful assistant.[/SYSTEM_PROMPT][INST]Hello[/INST] Hi there </s>"
         "[INST]Who are you?[/INST]"},
        /* TinyLlama/TinyLlama-1.1B-Chat-v1.0 (trim_blocks drops the newlines after its tags) */
        {LLM_CHAT_ZEPHYR, "<s>", "</s>",
         "<|system|>\nYou are a helpful assistant.</s>\n<|user|>\nHello</s>\n<|assistant|>\n Hi there </s>\n"
         "<|user|>\nWho are you?</s>\n<|assistant|>\n"},
        /* microsoft/Phi-3.5-mini-instruct */
        {LLM_CHAT_PHI3, "<s>", "<|endoftext|>",
         "<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n Hi there "
         "<|end|>\n<|user|>\nWho are you?<|end|>\n<|assistant|>\n"},
        /* google/gemma-3-1b-it: the system prompt opens the first user turn */
        {LLM_CHAT_GEMMA, "<bos>", "<eos>",
         "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello<end_of_turn>\n<start_of_turn>model"
         "\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you?<end_of_turn>\n<start_of_turn>model\n"},
    };
    char out[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llm_chat_template ct;
        memset(&ct, 0, sizeof ct);
        ct.family = cases[i].family;
        snprintf(ct.bos, sizeof ct.bos, "%s", cases[i].bos);
        snprintf(ct.eos, sizeof ct.eos, "%s", cases[i].eos);
        int n = llm_chat_render(&ct, conv, 4, NULL, 1, out, sizeof out);
        const char *name = llm_chat_family_name(cases[i].family);
        CHECK(n == (int)strlen(cases[i].want) && !strcmp(out, cases[i].want),
              "chat template %s:\n%s\nwant\n%s", name ? name : "", n >= 0 ? out : "(error)", cases[i].want);
        CHECK(name && llm_chat_family_from_name(name) == cases[i].family, "chat family name %s",
              name ? name : "");
    }
    llm_chat_template ct;
    memset(&ct, 0, sizeof ct);
    /* ChatML without a system message: SmolLM2's template writes its own */
    ct.family = LLM_CHAT_CHATML;
    snprintf(ct.default_system, sizeof ct.default_system,
             "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    llm_chat_render(&ct, conv + 1, 1, NULL, 1, out, sizeof out);
    CHECK(!strcmp(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                  "Face<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"),
          "chatml default system: %s", out);
    /* Qwen3: thinking on writes no think block; a last reply keeps its reasoning, an earlier one loses it */
    ct.family = LLM_CHAT_QWEN3; ct.enable_thinking = 1;
    llm_chat_render(&ct, conv + 1, 1, NULL, 1, out, sizeof out);
    CHECK(!strcmp(out, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"), "qwen3 thinking: %s",
          out);
    const llm_chat_message thought[] = {{"user", "Hi"}, {"assistant", "<think>\nhmm\n</think>\n\nHello!"},
                                        {"user", "Bye"}};
    llm_chat_render(&ct, thought, 2, NULL, 0, out, sizeof out);
    CHECK(!strcmp(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\n"
                  "Hello!<|im_end|>\n"), "qwen3 last reply keeps its reasoning: %s", out);
    llm_chat_render(&ct, thought, 3, NULL, 1, out, sizeof out);
    CHECK(!strcmp(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                  "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
          "qwen3 history drops reasoning: %s", out);
    /* meta-llama/Llama-3.1-8B-Instruct: the system turn always, dated */
    ct.family = LLM_CHAT_LLAMA3; ct.dated_system = 1;
    snprintf(ct.bos, sizeof ct.bos, "<|begin_of_text|>"); snprintf(ct.date, sizeof ct.date, "26 Jul 2024");
    llm_chat_render(&ct, conv + 1, 1, NULL, 1, out, sizeof out);
    CHECK(!strcmp(out, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                  "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n"), "llama 3.1 dated: %s", out);
    /* Llama 3.2's and gpt-oss's templates date the prompt today (strftime_now): renewed for each request, so
     * a server that runs past midnight writes the new day; the month in English whatever the locale (strftime
     * in this program's C locale is the oracle); a template with its own date keeps it */
    {
        const time_t when = 1893580000; /* 2 Jan 2030 in most time zones */
        struct tm tm;
        char want[32] = "";
        localtime_r(&when, &tm);
        strftime(want, sizeof want, "%d %b %Y", &tm);
        ct.dated_today = 1;
        llm_chat_template_set_today(&ct, (int64_t)when);
        CHECK(!strcmp(ct.date, want), "today's date, Llama 3.2's way: %s, want %s", ct.date, want);
        llm_chat_render(&ct, conv + 1, 1, NULL, 1, out, sizeof out);
        char line[64];
        snprintf(line, sizeof line, "\nToday Date: %s\n", want);
        CHECK(strstr(out, line) != NULL, "the prompt carries it: %s", out);
        ct.family = LLM_CHAT_GPT_OSS;
        strftime(want, sizeof want, "%Y-%m-%d", &tm);
        llm_chat_template_set_today(&ct, (int64_t)when);
        CHECK(!strcmp(ct.date, want), "today's date, gpt-oss's way: %s, want %s", ct.date, want);
        ct.family = LLM_CHAT_LLAMA3; ct.dated_today = 0;
        snprintf(ct.date, sizeof ct.date, "26 Jul 2024");
        llm_chat_template_set_today(&ct, (int64_t)when);
        CHECK(!strcmp(ct.date, "26 Jul 2024"), "a template's own date is kept: %s", ct.date);
    }
    /* the length comes back when the room is short, nothing past cap is written; a role it does not know */
    char small[8];
    memset(small, 'x', sizeof small);
    int need = llm_chat_render(&ct, conv, 4, NULL, 1, small, 4);
    CHECK(need > 100 && small[4] == 'x', "chat render into a short buffer: %d", need);
    const llm_chat_message bad[] = {{"robot", "x"}};
    CHECK(llm_chat_render(&ct, bad, 1, NULL, 1, out, sizeof out) == -1, "chat render of an unknown role");
}

/* Tools, calls and results, written by each family with a tool format of its own, against its published
 * Jinja template rendered by jinja2 as Hugging Face's apply_chat_template does (tools/chat_oracle.py; a tool
 * call's arguments, given as JSON text, parsed first, as vLLM does), byte for byte. The conversations: tools
 * with and without a system turn, a whole tool loop, parallel calls and results, text beside a call, calls in
 * the history without tools, thinking (in content, and apart in reasoning_content), and arguments whose JSON
 * tojson writes its own way (floats, escapes, non-ASCII, nesting). */
#define TOOLS_JSON \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"The weather in a " \
    "city, °C or °F.\",\"parameters\":{\"type\":\"object\"," \
    "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\"," \
    "\"fahrenheit\"]}},\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"add\"," \
    "\"parameters\":{\"type\":\"object\",\"properties\":" \
    "{\"a\":{\"type\":\"number\",\"minimum\":-1.5e-7},\"b\":{\"type\":\"number\",\"maximum\":1e22}}}}}]"
/* tools of every kind of parameter gpt-oss's template writes as TypeScript: descriptions, defaults, enums,
 * arrays of each kind, nullable, a list of types, oneOf, a nested object, none at all */
#define TOOLS_RICH \
    "[{\"type\":\"function\",\"function\":{\"name\":\"search\",\"description\":\"Search the web.\"," \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\",\"description\":" \
    "\"What to look for\"}," \
    "\"topn\":{\"type\":\"integer\",\"default\":10},\"lang\":{\"type\":\"string\",\"enum\":[\"en\",\"fr\"]," \
    "\"default\":\"en\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}," \
    "\"scores\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"nullable\":true}," \
    "\"filters\":{\"type\":\"array\",\"items\":{\"type\":\"object\"," \
    "\"properties\":{\"field\":{\"type\":\"string\"},\"value\":{\"type\":[\"string\",\"number\"]}}," \
    "\"required\":[\"field\"]}},\"when\":{\"oneOf\":[{\"type\":\"string\",\"description\":\"a date\"}," \
    "{\"type\":\"integer\",\"default\":0}]},\"strict\":{\"type\":\"boolean\",\"default\":false}," \
    "\"opts\":{\"type\":\"object\",\"properties\":{\"safe\":{\"type\":\"boolean\"}," \
    "\"depth\":{\"type\":\"integer\"}},\"required\":[\"safe\"]},\"raw\":{},\"any\":{\"type\":\"array\"}," \
    "\"note\":{\"type\":\"string\",\"nullable\":true},\"obj\":{\"type\":\"object\"}}," \
    "\"required\":[\"query\"]}}}," \
    "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"description\":\"The time now.\"}}]"
#define CALL(id, name, args) \
    "{\"id\":\"" id "\",\"type\":\"function\",\"function\":{\"name\":\"" name "\"," \
    "\"arguments\":\"" args "\"}}"
static const char *const tool_conversations[] = {
    /* every kind of parameter; then a call with its thinking, its result, an answer, a new question */
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
    "\"Find cats.\"}],\"tools\":" TOOLS_RICH "}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Find cats.\"},{\"role\":\"assistant\",\"content\":\"\","
    "\"reasoning_content\":\"Search it.\","
    "\"tool_calls\":[" CALL("callCats1", "search", "{\\\"query\\\":\\\"cats\\\"}") "]},{\"role\":\"tool\","
    "\"tool_call_id\":\"callCats1\",\"content\":\"3 results\"},{\"role\":\"assistant\","
    "\"content\":\"Three.\"},{\"role\":\"user\",\"content\":\"More?\"}],\"tools\":" TOOLS_RICH "}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Find cats.\"},{\"role\":\"assistant\",\"content\":\"\","
    "\"reasoning_content\":\"Search it.\","
    "\"tool_calls\":[" CALL("callCats2", "search", "{\\\"query\\\":\\\"cats\\\"}") "]},{\"role\":\"tool\","
    "\"tool_call_id\":\"callCats2\",\"content\":\"3 results\"}],\"tools\":" TOOLS_RICH "}",
    /* tools, a system turn */
    "{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},{\"role\":\"user\",\"content\":"
    "\"Weather in Paris?\"}],\"tools\":" TOOLS_JSON "}",
    /* tools, no system turn */
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"tools\":" TOOLS_JSON "}",
    /* a whole loop: the call, its result, the answer asked for */
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":\"assistant\","
    "\"content\":\"\",\"tool_calls\":[" CALL("call0001a", "get_weather", "{\\\"city\\\":\\\"Paris\\\"}") "]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call0001a\",\"content\":\"{\\\"temperature\\\": 18}\"}],"
    "\"tools\":" TOOLS_JSON "}",
    /* parallel calls and their results, an answer, a new question */
    "{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},{\"role\":\"user\",\"content\":"
    "\"Paris and Rome?\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
    CALL("callParis", "get_weather", "{\\\"city\\\": \\\"Paris\\\", \\\"unit\\\": \\\"celsius\\\"}") ","
    CALL("call0Rome", "get_weather", "{\\\"city\\\":\\\"Rome\\\"}") "]},{\"role\":\"tool\","
    "\"tool_call_id\":\"callParis\",\"content\":\"18\"},{\"role\":\"tool\",\"tool_call_id\":\"call0Rome\","
    "\"content\":\"24\"},{\"role\":\"assistant\",\"content\":\"Paris 18, Rome 24.\"},{\"role\":\"user\","
    "\"content\":\"Thanks\"}],\"tools\":" TOOLS_JSON "}",
    /* text beside a call */
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Add 1.5 and 2\"},{\"role\":\"assistant\",\"content\":"
    "\"Let me add them.\",\"tool_calls\":[" CALL("callAdd01", "add", "{\\\"a\\\":1.5,\\\"b\\\":2}") "]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"callAdd01\",\"content\":\"3.5\"}],\"tools\":" TOOLS_JSON "}",
    /* calls and results in the history, no tools given now */
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Add\"},{\"role\":\"assistant\",\"content\":\"\","
    "\"tool_calls\":[" CALL("callAdd02", "add", "{\\\"a\\\":2.0,\\\"b\\\":1e-7}") "]},{\"role\":\"tool\","
    "\"tool_call_id\":\"callAdd02\",\"content\":\"2.0000001\"},{\"role\":\"assistant\",\"content\":\"About "
    "2.\"},{\"role\":\"user\",\"content\":\"ok\"}]}",
    /* arguments JSON that tojson writes its own way: escapes, non-ASCII, nesting, big and small numbers */
    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\","
    "\"tool_calls\":[" CALL("callZurch", "get_weather",
                            "{\\\"city\\\":\\\"Zürich \\\\\\\"old\\\\\\\"\\\\n\\\\ttown\\\","
    "\\\"n\\\":[1,-0,1e300,12345678901234567,0.1,[{}],{\\\"k\\\":null,\\\"t\\\":true}]}") "]},{\"role\":"
    "\"tool\",\"tool_call_id\":\"callZurch\",\"content\":\"ok\"}],\"tools\":" TOOLS_JSON "}",
    /* thinking: a reply after the last question keeps it, with a call */
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":"
    "\"<think>\\nThe user wants weather.\\n</think>\\n\\n\",\"tool_calls\":[" CALL("callOslo0", "get_weather",
    "{\\\"city\\\":\\\"Oslo\\\"}") "]},{\"role\":\"tool\",\"tool_call_id\":\"callOslo0\","
    "\"content\":\"-3\"}],\"tools\":" TOOLS_JSON "}",
    /* thinking given apart, and thinking off */
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello!\","
    "\"reasoning_content\":\"\\nA greeting.\\n\"}],\"add_generation_prompt\":false}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"\","
    "\"tool_calls\":[" CALL("callEmpty", "add", "{}") "]},{\"role\":\"tool\",\"tool_call_id\":\"callEmpty\","
    "\"content\":\"0\"}],\"tools\":" TOOLS_JSON ",\"kwargs\":{\"enable_thinking\":false,\"date_string\":\"26 "
    "Jul 2024\"}}",
    /* an id of another length (Mistral's templates refuse it), and two questions in a row (Mistral's too) */
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"\","
    "\"tool_calls\":[" CALL("call_1", "add", "{}") "]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\","
    "\"content\":\"0\"}],\"tools\":" TOOLS_JSON "}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Hi\"},"
    "{\"role\":\"user\",\"content\":\"Hello?\"}]}",
};
#undef CALL

/* A conversation of the JSON above as llm_chat_messages (pointing into v); the tools as JSON text */
static int tool_conversation(const llm_json *v, llm_chat_message *m, llm_chat_tool_call *calls, int cap,
                             char **tools) {
    const llm_json *msgs = llm_json_get(v, "messages"), *tl = llm_json_get(v, "tools");
    int n_calls = 0;
    *tools = tl ? llm_json_dumps(tl, 0) : NULL;
    for (int i = 0; i < msgs->n && i < cap; i++) {
        const llm_json *x = &msgs->items[i], *c = llm_json_get(x, "content"),
            *tc = llm_json_get(x, "tool_calls");
        const llm_json *rc = llm_json_get(x, "reasoning_content"), *id = llm_json_get(x, "tool_call_id");
        memset(&m[i], 0, sizeof m[i]);
        m[i].role = llm_json_get(x, "role")->str;
        m[i].content = c && c->type == LLM_JSON_STRING ? c->str : NULL;
        m[i].reasoning = rc ? rc->str : NULL;
        m[i].tool_call_id = id ? id->str : NULL;
        m[i].tool_calls = calls + n_calls;
        for (int k = 0; tc && k < tc->n; k++, n_calls++) {
            const llm_json *fn = llm_json_get(&tc->items[k], "function");
            calls[n_calls].id = llm_json_get(&tc->items[k], "id")->str;
            calls[n_calls].name = llm_json_get(fn, "name")->str;
            calls[n_calls].arguments = llm_json_get(fn, "arguments")->str;
            m[i].n_tool_calls++;
        }
    }
    return msgs->n;
}

static void test_chat_tools_jinja(void) {
    static const struct { const char *path, *vocab, *bos, *eos; int format; } templates[] = {
        /* each a family with a tool format of its own, and the vocabulary its tokens come from */
        {"testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja", "ggml-vocab-qwen2.gguf", "", "<|im_end|>",
         LLM_TOOLS_HERMES},
        {"testdata/templates/Qwen-Qwen3-0.6B.jinja", "ggml-vocab-qwen2.gguf", "", "<|im_end|>",
         LLM_TOOLS_HERMES},
        {"gguf:testdata/tokenizer/ggml-vocab-qwen2.gguf", "ggml-vocab-qwen2.gguf", "", "<|im_end|>",
         LLM_TOOLS_HERMES},
        /* Qwen3's thinking-only variant (as Qwen3-*-Thinking-2507's): the generation prompt opens <think> */
        {"llm-test-qwen3-thinking.jinja", "ggml-vocab-qwen2.gguf", "", "<|im_end|>", LLM_TOOLS_HERMES},
        {"testdata/templates/meta-llama-Llama-3.1-8B-Instruct.jinja", "ggml-vocab-llama-bpe.gguf",
         "<|begin_of_text|>", "<|eot_id|>", LLM_TOOLS_LLAMA3},
        {"testdata/templates/meta-llama-Llama-3.2-3B-Instruct.jinja", "ggml-vocab-llama-bpe.gguf",
         "<|begin_of_text|>", "<|eot_id|>", LLM_TOOLS_LLAMA3},
        {"testdata/templates/meta-llama-Llama-3.3-70B-Instruct.jinja", "ggml-vocab-llama-bpe.gguf",
         "<|begin_of_text|>", "<|eot_id|>", LLM_TOOLS_LLAMA3},
        /* Mistral v3 (SentencePiece, "[INST] ") and v3-tekken (Nemo): <s> and </s> as
         * Mistral's vocabularies */
        {"testdata/templates/mistralai-Mistral-Large-Instruct-2407-v3.jinja", "ggml-vocab-llama-spm.gguf",
         "<s>", "</s>", LLM_TOOLS_MISTRAL},
        {"testdata/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja", "ggml-vocab-llama-spm.gguf", "<s>",
         "</s>", LLM_TOOLS_MISTRAL},
        /* QwQ: the thinking of earlier answers cut from them; the generation prompt opens <think> */
        {"testdata/templates/Qwen-QwQ-32B.jinja", "ggml-vocab-qwen2.gguf", "", "<|im_end|>",
         LLM_TOOLS_HERMES},
        /* Mistral Small 3.2 (v11 calls; its own system prompt, dated today, when the conversation
         * has none) */
        {"testdata/templates/Mistral-Small-3.2-24B-Instruct-2506.jinja", "ggml-vocab-llama-spm.gguf", "<s>",
         "</s>", LLM_TOOLS_MISTRAL_ARGS},
        /* gpt-oss (harmony): its thinking is the template's "thinking" (llama.cpp's mapping); dated today */
        {"testdata/templates/openai-gpt-oss-120b.jinja", "ggml-vocab-gpt-2.gguf", "<|endoftext|>",
         "<|endoftext|>", LLM_TOOLS_HARMONY},
    };
    char err[LLM_ERR_LEN];
    size_t qwen3_len;
    char *qwen3 = read_file("testdata/templates/Qwen-Qwen3-0.6B.jinja", &qwen3_len);
    const char *gen_prompt = "    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking";
    char *at = qwen3 ? strstr(qwen3, gen_prompt) : NULL,
        *end = at ? strstr(at, "{%- endif %}\n{%- endif %}") : NULL;
    CHECK(at && end, "Qwen3's generation prompt in its template");
    FILE *thinking = at && end ? fopen("llm-test-qwen3-thinking.jinja", "w") : NULL;
    if (thinking) {
        fprintf(thinking, "%.*s    {{- '<|im_start|>assistant\\n<think>\\n' }}\n%s", (int)(at - qwen3), qwen3,
                end + strlen("{%- endif %}\n"));
        fclose(thinking);
    }
    free(qwen3);
    const char *cases_path = "llm-test-chat-tools.jsonl", *out_path = "llm-test-chat-tools.out";
    FILE *f = fopen(cases_path, "w");
    size_t n_conv = sizeof tool_conversations / sizeof *tool_conversations,
        n_tmpl = sizeof templates / sizeof *templates;
    for (size_t k = 0; f && k < n_tmpl; k++)
        for (size_t i = 0; i < n_conv; i++) {
            /* the case: the conversation, with its template, tokens, date */
            const char *conv = tool_conversations[i], *rc = strstr(conv, "\"reasoning_content\"");
            int harmony = templates[k].format == LLM_TOOLS_HARMONY;
            fprintf(f, "{\"template\":\"%s\",\"bos_token\":\"%s\",\"eos_token\":\"%s\",%s%s",
                    templates[k].path, templates[k].bos, templates[k].eos, strstr(conv, "\"kwargs\"") ? "" :
                    "\"kwargs\":{\"date_string\":\"26 Jul 2024\"},",
                    strstr(conv, "\"add_generation_prompt\"") ? "" : "\"add_generation_prompt\":true,");
            if (harmony && rc) fprintf(f, "%.*s\"thinking\"%s\n", (int)(rc - conv - 1), conv + 1, rc + 19);
            else fprintf(f, "%s\n", conv + 1);
        }
    if (f) fclose(f);
    char cmd[512];
    snprintf(cmd, sizeof cmd, ".venv/bin/python tools/chat_oracle.py < %s > %s 2>&1", cases_path, out_path);
    int rc = system(cmd);
    CHECK(rc == 0, "tools/chat_oracle.py (jinja2 in .venv): exit %d", rc);
    char *out = read_file(out_path, NULL), *line = out;
    for (size_t k = 0; k < n_tmpl && out; k++) {
        llm_gguf g;
        llm_tokenizer *t = tok_load(&g, templates[k].vocab, NULL);
        char *text = NULL;
        size_t text_len = 0;
        if (!strncmp(templates[k].path, "gguf:", 5)) {
            llm_str s = llm_gguf_string(&g, "tokenizer.chat_template");
            text = (char *)malloc(s.len + 1);
            memcpy(text, s.ptr, s.len); text[s.len] = 0; text_len = s.len;
        } else text = read_file(templates[k].path, &text_len);
        llm_chat_template ct;
        CHECK(t && text && llm_chat_template_init(&ct, text, text_len, t, NULL, err) == 0 &&
              ct.tool_format == templates[k].format &&
              ct.opens_think == (strstr(templates[k].path, "thinking") || strstr(templates[k].path, "QwQ")),
              "%s: its tool format, and whether it opens <think>: %s", templates[k].path, err);
        if (ct.family != LLM_CHAT_GPT_OSS) /* its: today's */
            snprintf(ct.date, sizeof ct.date, "26 Jul 2024");
        for (size_t i = 0; i < n_conv && line && *line; i++) {
            char *next = strchr(line, '\n');
            if (next) *next++ = 0;
            llm_json want, conv;
            int ok = llm_json_parse(line, strlen(line), &want, err) == 0;
            const llm_json *w = ok ? llm_json_get(&want, "text") : NULL;
            CHECK(ok && (w || llm_json_get(&want, "error")), "chat oracle, %s, conversation %zu: %s",
                  templates[k].path, i, line);
            ok = ok && llm_json_parse(tool_conversations[i], strlen(tool_conversations[i]), &conv, err) == 0;
            if (ok) {
                llm_chat_message m[16];
                llm_chat_tool_call calls[16];
                char *tools;
                int n = tool_conversation(&conv, m, calls, 16, &tools);
                const llm_json *kw = llm_json_get(llm_json_get(&conv, "kwargs"), "enable_thinking");
                ct.enable_thinking = !kw || kw->type == LLM_JSON_TRUE;
                int gen = !strstr(tool_conversations[i], "\"add_generation_prompt\":false");
                int len = llm_chat_render(&ct, m, n, tools, gen, NULL, 0);
                char *got = len >= 0 ? (char *)malloc((size_t)len + 1) : NULL;
                if (got) llm_chat_render(&ct, m, n, tools, gen, got, len + 1);
                if (w) CHECK(got && (size_t)len == w->len && !memcmp(got, w->str, w->len),
                             "%s, conversation %zu, with tools:\n%s\nwant (jinja2)\n%s", templates[k].path, i,
                             got ? got : "(error)", w->str);
                else CHECK(len == -1, "%s, conversation %zu: the template refuses it (%s), llm_chat_render "
                           "gives %d", templates[k].path, i, line, len); /* Llama 3.1: one call a turn */
                free(got); free(tools);
                llm_json_free(&conv);
            }
            llm_json_free(&want);
            line = next;
        }
        free(text);
        if (t) { llm_tokenizer_free(t); llm_gguf_close(&g); }
    }
    free(out);
    remove(cases_path); remove(out_path); remove("llm-test-qwen3-thinking.jinja");
}

/* Tool calls in each syntax: the grammar takes what the family writes and refuses what it does not (a name
 * not in tools, arguments against their schema, two calls when one is asked for, text where a call must
 * be); the reply read back gives the text, the thinking and the calls; and read as it is being written, each
 * reading begins the next one, so a stream sends only additions. */
static int gbnf_takes(const char *gbnf, const char *text) {
    char err[LLM_ERR_LEN];
    llm_grammar *g = llm_grammar_parse(gbnf, err);
    CHECK(g != NULL, "a tool grammar parses: %s\n%s", err, gbnf);
    if (!g) return 0;
    llm_grammar_state *st = llm_grammar_start(g);
    int ok = st && llm_grammar_accept(st, text, (int)strlen(text)) == 0 && llm_grammar_can_end(st);
    llm_grammar_state_free(st); llm_grammar_free(g);
    return ok;
}

/* A made-up GPT-2-style vocabulary, loaded from b: a token per printable ASCII character, the space, then
 * the control tokens given (their ids from 95 on) */
#define MADE_UP_CONTROLS 95
static llm_tokenizer *made_up_vocab(llm_gguf *g, tok_gguf_buf *b, const char *const *controls,
                                    int n_controls) {
    const char *tokens[128];
    char chars[95][2];
    int32_t types[128];
    int n = 0;
    for (int c = 0x21; c < 0x7f; c++) { chars[n][0] = (char)c; chars[n][1] = 0; tokens[n] = chars[n]; n++; }
    tokens[n++] = "\xc4\xa0"; /* GPT-2's stand-in for the space */
    for (int i = 0; i < n; i++) types[i] = LLM_TOKEN_NORMAL;
    for (int k = 0; k < n_controls && n < 128; k++) {
        tokens[n] = controls[k]; types[n++] = LLM_TOKEN_CONTROL;
    }
    static const char *const merges[] = {"a b"};
    tok_gguf_start(b, 5);
    tok_gguf_kv_str(b, "tokenizer.ggml.model", "gpt2");
    tok_gguf_kv_str(b, "tokenizer.ggml.pre", "default");
    tok_gguf_kv_strs(b, "tokenizer.ggml.tokens", tokens, n);
    tok_gguf_kv_i32s(b, "tokenizer.ggml.token_type", types, n);
    tok_gguf_kv_strs(b, "tokenizer.ggml.merges", merges, 1);
    CHECK(b->n <= sizeof b->data, "the made-up vocabulary fits its buffer (%zu bytes)", b->n);
    return tok_load_mem(g, b, NULL);
}

/* Mistral's [TOOL_CALLS] is a control token: on a made-up vocabulary (a token per printable character, the
 * marker, two control tokens), the marker is text in the output and in the grammar's view, so the grammar
 * lets the model write it as one token and the reply's reader finds the call in the text that comes out;
 * a control token that is no marker stays out of both. */
static void test_tool_marker_token(void) {
    static const char *const controls[] = {"[TOOL_CALLS]", "<|im_end|>", "[ARGS]"};
    int marker = MADE_UP_CONTROLS, im_end = marker + 1, args = marker + 2;
    tok_gguf_buf b;
    llm_gguf g;
    llm_tokenizer *t = made_up_vocab(&g, &b, controls, 3);
    if (!t) return;
    char piece[32], err[LLM_ERR_LEN];
    int len = llm_tokenizer_piece(t, marker, 0, piece, sizeof piece);
    CHECK(len == 12 && !memcmp(piece, "[TOOL_CALLS]", 12) &&
          llm_tokenizer_piece(t, im_end, 0, piece, 32) == 0,
          "[TOOL_CALLS] is text (%d bytes), <|im_end|> is not", len);
    CHECK(llm_tokenizer_piece(t, args, 0, piece, sizeof piece) == 6 && !memcmp(piece, "[ARGS]", 6),
          "[ARGS] is text");
    static const char reply[] = "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}]";
    int32_t ids[128];
    int n_ids = llm_tokenize(t, reply, strlen(reply), 0, 1, ids, 128);
    CHECK(n_ids > 1 && ids[0] == marker, "the reply's text gives the marker token first (%d ids)", n_ids);
    llm_chat_template ct;
    memset(&ct, 0, sizeof ct);
    ct.family = LLM_CHAT_MISTRAL_V3_TEKKEN; ct.tool_format = LLM_TOOLS_MISTRAL;
    static const char tools[] = "[{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    char *gbnf = llm_chat_tool_grammar(&ct, tools, LLM_TOOL_REQUIRED, NULL, 1, err);
    llm_grammar *gr = gbnf ? llm_grammar_parse(gbnf, err) : NULL;
    llm_grammar_state *st = gr ? llm_grammar_start(gr) : NULL;
    llm_token_trie *tt = llm_token_trie_build(t, err);
    CHECK(st && tt, "Mistral's tool grammar and the trie: %s", err);
    int walked = 0;
    for (int i = 0; st && tt && i < n_ids; i++, walked++) { /* each token of the reply allowed in turn */
        if (!llm_grammar_allows(st, tt, ids[i])) break;
        if (i == 0) CHECK(!llm_grammar_allows(st, tt, im_end), "<|im_end|> is not allowed for the marker");
        len = llm_tokenizer_piece(t, ids[i], 0, piece, sizeof piece);
        if (llm_grammar_accept(st, piece, len) != 0) break;
    }
    CHECK(walked == n_ids && st && llm_grammar_done(st), "the grammar takes the reply token by token (%d of "
          "%d)", walked, n_ids);
    char text[256];
    len = llm_detokenize(t, ids, n_ids, 0, text, sizeof text);
    llm_chat_reply r;
    memset(&r, 0, sizeof r);
    CHECK(len == (int)strlen(reply) && llm_chat_parse_reply(&ct, text, (size_t)len, 0, 1, 0, &r) == 0 &&
          r.n_calls == 1 && !strcmp(r.calls[0].name, "now") && !r.content[0],
          "the detokenized reply reads back as the call (%d bytes)", len);
    llm_chat_reply_free(&r);
    llm_token_trie_free(tt); llm_grammar_state_free(st); llm_grammar_free(gr); free(gbnf);
    llm_tokenizer_free(t); llm_gguf_close(&g);
}

/* gpt-oss's harmony tokens, on a made-up vocabulary (a token per printable character, the space, harmony's
 * control tokens): the message markers are text (the reply's reader splits messages by them, the grammar
 * writes them), <|return|> and <|call|> end the turn and <|end|> does not (it closes the analysis message
 * the answer follows); the vocabulary alone names the family; a reply written token by token reads back as
 * its thinking and its call. */
static void test_harmony_tokens(void) {
    static const char *const controls[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>",
                                           "<|call|>", "<|constrain|>", "<|endoftext|>"};
    int first = MADE_UP_CONTROLS;
    tok_gguf_buf b;
    llm_gguf g;
    llm_tokenizer *t = made_up_vocab(&g, &b, controls, 8);
    CHECK(t != NULL, "the made-up harmony vocabulary loads");
    if (!t) return;
    char piece[32], err[LLM_ERR_LEN];
    int text_ok = 1;
    for (int k = 0; k < 8; k++) {
        int len = llm_tokenizer_piece(t, first + k, 0, piece, sizeof piece);
        text_ok &= k < 4 || k == 6 ? len == (int)strlen(controls[k]) &&
            !memcmp(piece, controls[k], len) : len == 0;
    }
    CHECK(text_ok, "harmony's markers are text, <|return|>, <|call|> and <|endoftext|> not");
    CHECK(!llm_tokenizer_is_eog(t, first + 3) && llm_tokenizer_is_eog(t, first + 4) &&
          llm_tokenizer_is_eog(t, first + 5), "<|return|> and <|call|> end the turn, <|end|> does not");
    llm_chat_template ct;
    int32_t stop[8];
    int n_stop = llm_chat_template_init(&ct, NULL, 0, t, NULL, err) == 0 ?
        llm_chat_stop_ids(&ct, t, stop, 8) : 0;
    CHECK(ct.family == LLM_CHAT_GPT_OSS && ct.tool_format == LLM_TOOLS_HARMONY && ct.thinks && n_stop == 2 &&
          stop[0] == first + 4 && stop[1] == first + 5, "the vocabulary names gpt-oss; it stops at "
          "<|return|> and <|call|> (%d stop ids)", n_stop);
    /* the request's reasoning effort goes into the system message */
    llm_chat_message hi = {"user", "Hi", NULL, NULL, 0, NULL};
    snprintf(ct.reasoning_effort, sizeof ct.reasoning_effort, "high");
    char prompt[1024];
    int plen = llm_chat_render(&ct, &hi, 1, NULL, 1, prompt, sizeof prompt);
    CHECK(plen > 0 && plen < (int)sizeof prompt && strstr(prompt, "\n\nReasoning: high\n\n") &&
          !strcmp(prompt + plen - 51, "<|start|>user<|message|>Hi<|end|><|start|>assistant"),
          "gpt-oss's prompt with reasoning effort high: %s", plen > 0 ? prompt : "(none)");
    static const char tools[] = "[{\"type\":\"function\",\"function\":{\"name\":\"now\","
                                "\"description\":\"Time.\"}}]";
    static const char reply[] = "<|channel|>analysis<|message|>Time?<|end|><|start|>assistant"
                                "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}";
    char *gbnf = llm_chat_tool_grammar(&ct, tools, LLM_TOOL_AUTO, NULL, 1, err);
    llm_grammar *gr = gbnf ? llm_grammar_parse(gbnf, err) : NULL;
    llm_grammar_state *st = gr ? llm_grammar_start(gr) : NULL;
    llm_token_trie *tt = llm_token_trie_build(t, err);
    int32_t ids[256];
    int n_ids = llm_tokenize(t, reply, strlen(reply), 0, 1, ids, 256), walked = 0;
    for (int i = 0; st && tt && i < n_ids && llm_grammar_allows(st, tt, ids[i]); i++, walked++) {
        int len = llm_tokenizer_piece(t, ids[i], 0, piece, sizeof piece);
        if (llm_grammar_accept(st, piece, len) != 0) break;
    }
    CHECK(n_ids > 0 && ids[0] == first + 1 && walked == n_ids && st && llm_grammar_can_end(st) &&
          llm_grammar_allows(st, tt, first + 5), "the grammar takes the reply token by token, markers as "
          "single tokens (%d of %d), then <|call|>", walked, n_ids);
    char text[512];
    int len = llm_detokenize(t, ids, n_ids, 0, text, sizeof text);
    llm_chat_reply r;
    memset(&r, 0, sizeof r);
    CHECK(len == (int)strlen(reply) && llm_chat_parse_reply(&ct, text, (size_t)len, 1, 1, 0, &r) == 0 &&
          r.reasoning && !strcmp(r.reasoning, "Time?") && !r.content[0] && r.n_calls == 1 &&
          !strcmp(r.calls[0].name, "now") && !strcmp(r.calls[0].arguments, "{}"),
          "the detokenized reply reads back as its thinking and the call (%d bytes)", len);
    llm_chat_reply_free(&r);
    /* a structured output holds the final channel's message, after the thinking; the schema's own rules
     * (a recursive one here, root named inside) keep their meaning */
    static const char schema[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"kids\":"
                                 "{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}},\"required\":[\"a\"]}";
    llm_json js;
    int parsed = llm_json_parse(schema, strlen(schema), &js, err) == 0;
    char *answer = parsed ? llm_json_schema_to_grammar(&js, err) : NULL;
    char *whole = answer ? llm_chat_answer_grammar(&ct, answer, err) : NULL;
    llm_chat_template chatml;
    memset(&chatml, 0, sizeof chatml);
    char *same = answer ? llm_chat_answer_grammar(&chatml, answer, err) : NULL;
    CHECK(whole && same && !strcmp(same, answer),
          "the answer's grammar for gpt-oss and, unchanged, ChatML: %s", err);
    if (whole) {
        CHECK(gbnf_takes(whole, "<|channel|>analysis<|message|>Kids?<|end|><|start|>assistant<|channel|>final"
                                "<|message|>{\"a\": 1, \"kids\": [{\"a\": 2, \"kids\": []}]}") &&
              gbnf_takes(whole, "<|channel|>final<|message|>{\"a\": 1}") &&
              !gbnf_takes(whole, "<|channel|>final<|message|>{\"kids\": []}") &&
              !gbnf_takes(whole, "<|channel|>final<|message|>Sure: {\"a\": 1}") &&
              !gbnf_takes(whole, "{\"a\": 1}") &&
              !gbnf_takes(whole, "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final"
                                 "<|message|>{\"a\": 1, \"kids\": [{\"b\": 2}]}"),
              "gpt-oss's structured answer: after its thinking, on the final channel, the schema's JSON");
        const char *reply2 = "<|channel|>analysis<|message|>Kids?<|end|><|start|>assistant<|channel|>final"
                             "<|message|>{\"a\": 1}";
        memset(&r, 0, sizeof r);
        CHECK(llm_chat_parse_reply(&ct, reply2, strlen(reply2), 1, 0, 0, &r) == 0 && r.reasoning &&
              !strcmp(r.reasoning, "Kids?") && !strcmp(r.content, "{\"a\": 1}"),
              "the answer read back: \"%s\"", r.content ? r.content : "");
        llm_chat_reply_free(&r);
    }
    if (parsed) llm_json_free(&js);
    free(answer); free(whole); free(same);
    llm_token_trie_free(tt); llm_grammar_state_free(st); llm_grammar_free(gr); free(gbnf);
    llm_tokenizer_free(t); llm_gguf_close(&g);
}

static void test_tool_calls(void) {
    static const char tools[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":10},\"days\":{\"type\":\"integer\","
        "\"minimum\":1,\"maximum\":7}},\"required\":[\"city\"],\"additionalProperties\":false}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    static const struct {
        int format, thinks, choice, parallel;
        const char *text;           /* a reply */
        int takes;                  /* the grammar takes it */
        const char *content, *reasoning, *name0, *args0, *name1; /* read back (NULL: none) */
    } cases[] = {
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_REQUIRED, 1,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 1,
         "", NULL, "get_weather", "{\"city\": \"Paris\"}", NULL},
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_REQUIRED, 1,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
         "</tool_call>\n"
         "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", 1,
         "", NULL, "get_weather", "{\"city\": \"Paris\", \"days\": 2}", "now"},
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_REQUIRED, 0, /* one call asked for */
         "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
         "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", 0, NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_REQUIRED, 1, /* a name not in tools; arguments against the schema */
         "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>", 0, NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_REQUIRED, 1,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 9}}\n"
         "</tool_call>", 0, NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_REQUIRED, 1, "Sure.", 0, NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_AUTO, 1, "It is sunny <tool> and <tool_cal.", 1,
         "It is sunny <tool> and <tool_cal.", NULL, NULL, NULL, NULL},
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_AUTO, 1, /* text, then a call: the marker on, the grammar rules */
         "Let me look.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", 1,
         "Let me look.", NULL, "now", "{}", NULL},
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_AUTO, 1, "Let me look.\n<tool_call>\n{\"name\": \"rm\"", 0,
         NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_HERMES, 1, LLM_TOOL_REQUIRED, 1, /* thinking first, then the call */
         "<think>\nWhich city? <b>Paris</b>.\n</think>\n\n<tool_call>\n"
         "{\"name\": \"now\", \"arguments\": {}}\n"
         "</tool_call>", 1, "", "Which city? <b>Paris</b>.", "now", "{}", NULL},
        {LLM_TOOLS_HERMES, 1, LLM_TOOL_AUTO, 1, "<think>\nhm\n</think>\n\nIt is 9.", 1, "It is 9.", "hm",
         NULL, NULL, NULL},
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_NAMED, 1, /* named: that one only */
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", 0,
         NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_GENERIC, 0, LLM_TOOL_AUTO, 1, "{\"response\": \"It is \\\"9\\\" \\u00b0C.\"}", 1,
         "It is \"9\" \xc2\xb0" "C.", NULL, NULL, NULL, NULL},
        {LLM_TOOLS_GENERIC, 0, LLM_TOOL_AUTO, 1,
         "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, {\"name\": "
         "\"now\", \"arguments\": {}}]}", 1, "", NULL, "get_weather", "{\"city\": \"Rome\"}", "now"},
        {LLM_TOOLS_GENERIC, 0, LLM_TOOL_AUTO, 1, /* surrogates: a pair, a lone high half, a lone low half */
         "{\"response\": \"\\ud83d\\ude00a\\ud8d8\\u8d8db\\udc00c\"}", 1,
         "\xf0\x9f\x98\x80" "a\xef\xbf\xbd\xe8\xb6\x8d" "b\xef\xbf\xbd" "c", NULL, NULL, NULL, NULL},
        {LLM_TOOLS_HERMES, 0, LLM_TOOL_REQUIRED, 1, /* no parameters: no arguments */
         "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"x\": 1}}\n</tool_call>", 0, NULL, NULL, NULL,
         NULL, NULL},
        {LLM_TOOLS_GENERIC, 0, LLM_TOOL_REQUIRED, 0, "{\"response\": \"no\"}", 0, NULL, NULL, NULL, NULL,
         NULL},
        {LLM_TOOLS_GENERIC, 0, LLM_TOOL_REQUIRED, 0,
         "{\"tool_calls\": [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"now\", \"arguments\": {}}]}",
         0, NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_GENERIC, 0, LLM_TOOL_AUTO, 1, "Hello", 0, NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_LLAMA3, 0, LLM_TOOL_AUTO, 1, "{\"name\": \"get_weather\", \"parameters\": {\"city\": "
         "\"Rome\"}}", 1, "", NULL, "get_weather", "{\"city\": \"Rome\"}", NULL},
        {LLM_TOOLS_LLAMA3, 0, LLM_TOOL_AUTO, 1, "It is 9 {degrees}.", 1, "It is 9 {degrees}.", NULL, NULL,
         NULL, NULL},
        {LLM_TOOLS_LLAMA3, 0, LLM_TOOL_REQUIRED, 1, "{\"name\": \"get_weather\", \"arguments\": {\"city\": "
         "\"R\"}}", 0, NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_MISTRAL, 0, LLM_TOOL_REQUIRED, 1, /* Mistral v3: a list after the marker */
         "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"days\": 3}}, "
         "{\"name\": \"now\", \"arguments\": {}}]", 1, "", NULL, "get_weather",
         "{\"city\": \"Rome\", \"days\": 3}", "now"},
        {LLM_TOOLS_MISTRAL, 0, LLM_TOOL_REQUIRED, 0, /* Nemo writes no space; one call asked for */
         "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}]", 1, "", NULL, "now", "{}", NULL},
        {LLM_TOOLS_MISTRAL, 0, LLM_TOOL_REQUIRED, 0,
         "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"now\", \"arguments\": {}}]", 0,
         NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_MISTRAL, 0, LLM_TOOL_REQUIRED, 1, "[TOOL_CALLS][{\"name\": \"get_weather\", "
         "\"arguments\": {\"city\": \"Rome\", \"days\": 0}}]", 0, NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_MISTRAL, 0, LLM_TOOL_AUTO, 1, "It is [TOOL] 9 [TOOL_CALL.", 1,
         "It is [TOOL] 9 [TOOL_CALL.", NULL, NULL, NULL, NULL},
        {LLM_TOOLS_MISTRAL, 0, LLM_TOOL_AUTO, 1, "Looking.[TOOL_CALLS][{\"name\": \"now\", \"arguments\": "
         "{}}]", 1, "Looking.", NULL, "now", "{}", NULL},
        {LLM_TOOLS_MISTRAL, 0, LLM_TOOL_AUTO, 1, "[TOOL_CALLS][{\"name\": \"rm\"", 0, NULL, NULL, NULL, NULL,
         NULL},
        {LLM_TOOLS_MISTRAL_ARGS, 0, LLM_TOOL_REQUIRED, 1, /* Mistral v11: the name outside the JSON */
         "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]now[CALL_ID]a1B2c3D4e[ARGS]{}", 1, "",
         NULL, "get_weather", "{\"city\": \"Rome\"}", "now"},
        {LLM_TOOLS_MISTRAL_ARGS, 0, LLM_TOOL_REQUIRED, 0, "[TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]now[ARGS]{}", 0,
         NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_MISTRAL_ARGS, 0, LLM_TOOL_REQUIRED, 1, "[TOOL_CALLS]now[ARGS]{\"city\": \"Rome\"}", 0,
         NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_MISTRAL_ARGS, 0, LLM_TOOL_REQUIRED, 1, "[TOOL_CALLS]get_weather[CALL_ID]short[ARGS]{}", 0,
         NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_MISTRAL_ARGS, 0, LLM_TOOL_AUTO, 1, "Let me see. [TOOL_CALLS]get_weather[ARGS]{\"city\": "
         "\"Oslo\", \"days\": 7}", 1, "Let me see.", NULL, "get_weather", "{\"city\": \"Oslo\", \"days\": 7}",
         NULL},
        {LLM_TOOLS_MISTRAL_ARGS, 0, LLM_TOOL_NAMED, 1, "[TOOL_CALLS]now[ARGS]{}", 1, "", NULL, "now", "{}",
         NULL},
        {LLM_TOOLS_MISTRAL_ARGS, 0, LLM_TOOL_NAMED, 1, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}", 0,
         NULL, NULL, NULL, NULL, NULL},
        /* gpt-oss (harmony): the thinking on the analysis channel, then a message to=functions.NAME */
        {LLM_TOOLS_HARMONY, 1, LLM_TOOL_REQUIRED, 1, "<|channel|>analysis<|message|>Need the "
         "weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
         "<|constrain|>json<|message|>{\"city\": \"Paris\"}", 1, "", "Need the weather.", "get_weather",
         "{\"city\": \"Paris\"}", NULL},
        {LLM_TOOLS_HARMONY, 1, LLM_TOOL_REQUIRED, 1, "<|channel|>commentary to=functions.now "
         "<|constrain|>json<|message|>{}", 1, "", NULL, "now", "{}", NULL},
        {LLM_TOOLS_HARMONY, 1, LLM_TOOL_REQUIRED, 1, "<|channel|>commentary to=functions.get_weather "
         "<|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": 9}", 0, NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_HARMONY, 1, LLM_TOOL_REQUIRED, 1, "<|channel|>commentary to=functions.rm <|constrain|>json"
         "<|message|>{}", 0, NULL, NULL, NULL, NULL, NULL},
        {LLM_TOOLS_HARMONY, 1, LLM_TOOL_REQUIRED, 1, "<|channel|>final<|message|>It is 9.", 0, NULL, NULL,
         NULL, NULL, NULL},
        {LLM_TOOLS_HARMONY, 1, LLM_TOOL_AUTO, 1,
         "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 9.", 1,
         "It is 9.", "Easy.", NULL, NULL, NULL},
        {LLM_TOOLS_HARMONY, 1, LLM_TOOL_AUTO, 1, /* the header as the template writes it: recipient first */
         "<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.now<|channel|>commentary "
         "json<|message|>{}", 1, "", "hm", "now", "{}", NULL},
        {LLM_TOOLS_HARMONY, 1, LLM_TOOL_AUTO, 1, "<|channel|>analysis<|message|>hm<|end|><|start|>assistant"
         "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{\"x\": 1}", 0, NULL, NULL, NULL,
         NULL, NULL},
        {LLM_TOOLS_HARMONY, 1, LLM_TOOL_NAMED, 1, "<|channel|>commentary to=functions.get_weather "
         "<|constrain|>json<|message|>{\"city\": \"Oslo\"}", 0, NULL, NULL, NULL, NULL, NULL},
    };
    char err[LLM_ERR_LEN];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        llm_chat_template ct;
        memset(&ct, 0, sizeof ct);
        ct.family = cases[i].format == LLM_TOOLS_LLAMA3 ? LLM_CHAT_LLAMA3 : cases[i].thinks ? LLM_CHAT_QWEN3 :
                    cases[i].format == LLM_TOOLS_MISTRAL ? LLM_CHAT_MISTRAL_V3 :
                    cases[i].format == LLM_TOOLS_MISTRAL_ARGS ? LLM_CHAT_MISTRAL_V7_TEKKEN : LLM_CHAT_CHATML;
        if (cases[i].format == LLM_TOOLS_HARMONY) ct.family = LLM_CHAT_GPT_OSS;
        ct.tool_format = cases[i].format; ct.thinks = cases[i].thinks; ct.enable_thinking = 1;
        char *gbnf = llm_chat_tool_grammar(&ct, tools, cases[i].choice, "now", cases[i].parallel, err);
        CHECK(gbnf != NULL, "tool grammar %zu: %s", i, err);
        if (!gbnf) continue;
        CHECK(gbnf_takes(gbnf, cases[i].text) == cases[i].takes, "tool grammar %zu %s: %s", i,
              cases[i].takes ? "takes" : "refuses", cases[i].text);
        free(gbnf);
        if (!cases[i].content) continue;
        llm_chat_reply r;
        size_t n = strlen(cases[i].text);
        CHECK(llm_chat_parse_reply(&ct, cases[i].text, n, 1, 1, 0, &r) == 0 &&
              !strcmp(r.content, cases[i].content) &&
              (cases[i].reasoning ? r.reasoning && !strcmp(r.reasoning, cases[i].reasoning) : !r.reasoning) &&
              r.n_calls == (cases[i].name1 ? 2 : cases[i].name0 ? 1 : 0) && !r.in_call &&
              (!cases[i].name0 || (!strcmp(r.calls[0].name, cases[i].name0) &&
                                   !strcmp(r.calls[0].arguments, cases[i].args0))) &&
              (!cases[i].name1 || !strcmp(r.calls[1].name, cases[i].name1)),
              "tool reply %zu read back: content \"%s\", reasoning \"%s\", %d calls", i, r.content,
              r.reasoning ? r.reasoning : "(none)", r.n_calls);
        /* every prefix, read as a reply still being written: each part a prefix of the whole one's */
        for (size_t k = 0; k <= n; k++) {
            llm_chat_reply p;
            int ok = llm_chat_parse_reply(&ct, cases[i].text, k, 1, 1, 1, &p) == 0;
            ok = ok && !strncmp(r.content, p.content, strlen(p.content)) && p.n_calls <= r.n_calls &&
                 (!p.reasoning || (r.reasoning && !strncmp(r.reasoning, p.reasoning, strlen(p.reasoning))));
            for (int c = 0; ok && c < p.n_calls; c++)
                ok = !strcmp(p.calls[c].name, r.calls[c].name) &&
                     !strncmp(r.calls[c].arguments, p.calls[c].arguments, strlen(p.calls[c].arguments));
            CHECK(ok, "tool reply %zu, its first %zu bytes read as a partial reply: content \"%s\", %d calls",
                  i, k, p.content ? p.content : "", p.n_calls);
            llm_chat_reply_free(&p);
        }
        llm_chat_reply_free(&r);
    }
    /* a prompt that opened <think> itself: the reply starts inside the thinking */
    llm_chat_template th;
    memset(&th, 0, sizeof th);
    th.family = LLM_CHAT_QWEN3; th.thinks = th.opens_think = 1;
    llm_chat_reply r;
    static const char opened[] = "\nabc\n</think>\n\nxyz";
    CHECK(llm_chat_parse_reply(&th, opened, strlen(opened), 1, 0, 0, &r) == 0 && r.reasoning &&
          !strcmp(r.reasoning, "abc") && !strcmp(r.content, "xyz"), "thinking opened by the prompt: \"%s\", "
          "\"%s\"", r.reasoning ? r.reasoning : "(none)", r.content);
    llm_chat_reply_free(&r);
    CHECK(llm_chat_parse_reply(&th, opened, 3, 1, 0, 1, &r) == 0 && r.reasoning &&
          !strcmp(r.reasoning, "ab") && !r.content[0], "thinking opened by the prompt, partial: \"%s\"",
          r.reasoning ? r.reasoning : "(none)");
    llm_chat_reply_free(&r);
    /* tools the grammar cannot take: each refused, naming why */
    llm_chat_template ct;
    memset(&ct, 0, sizeof ct);
    ct.tool_format = LLM_TOOLS_HERMES;
    static const struct { const char *tools, *says; } bad[] = {
        {"[{\"type\":\"function\"}]", "tools[0] must be"},
        {"[{\"type\":\"function\",\"function\":{\"parameters\":{}}}]", "tools[0].function.name"},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]",
         "tools[0].function.parameters"},
        {"[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
         "\"properties\":{\"x\":{\"type\":\"string\",\"format\":\"hostname\"}}}}}]",
         "tools[0].function.parameters: "},
        {"[]", "non-empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *g = llm_chat_tool_grammar(&ct, bad[i].tools, LLM_TOOL_AUTO, NULL, 1, err);
        CHECK(!g && strstr(err, bad[i].says), "bad tools %s: %s", bad[i].tools, g ? "taken" : err);
        free(g);
    }
    char *g = llm_chat_tool_grammar(&ct, tools, LLM_TOOL_NAMED, "rm", 1, err);
    CHECK(!g && strstr(err, "\"rm\""), "a named choice not in tools: %s", g ? "taken" : err);
    free(g);
}

static int llm_chat_template_init_gguf(llm_chat_template *ct, const llm_gguf *g, const llm_tokenizer *t,
                                       const char *name, char *err) {
    llm_str text = llm_gguf_string(g, "tokenizer.chat_template");
    return llm_chat_template_init(ct, text.ptr, text.len, t, name, err);
}

static void test_chat_detect(void) {
    char err[LLM_ERR_LEN];
    for (size_t i = 0; i < sizeof chat_published / sizeof chat_published[0]; i++) {
        int f = llm_chat_detect(chat_published[i].text, strlen(chat_published[i].text), NULL);
        CHECK(f == chat_published[i].family, "detect %s: %s", chat_published[i].model,
              llm_chat_family_name(f) ? llm_chat_family_name(f) : "none");
    }
    /* Qwen2.5's own system prompt, from the template text; Llama 3.1's dated system turn */
    llm_gguf g;
    llm_tokenizer *t = tok_load(&g, "ggml-vocab-llama-bpe.gguf", NULL);
    if (t) {
        llm_chat_template ct;
        CHECK(llm_chat_template_init_gguf(&ct, &g, t, NULL, err) == 0 && ct.family == LLM_CHAT_LLAMA3 &&
              !strcmp(ct.bos, "<|begin_of_text|>") && !ct.dated_system && !ct.note[0],
              "llama-bpe's template: %s, bos %s", llm_chat_family_name(ct.family), ct.bos);
        int32_t ids[8];
        int n = llm_chat_stop_ids(&ct, t, ids, 8);
        /* Llama 3's EOS and <|eot_id|> (its vocabulary has no <|eom_id|>: that came with 3.1) */
        CHECK(n == 2 && ids[0] == 128001 && ids[1] == 128009, "llama3 stop ids: %d", n);
        CHECK(llm_chat_detect(NULL, 0, t) == LLM_CHAT_LLAMA3, "llama3 from its vocabulary");
        CHECK(llm_chat_template_init_gguf(&ct, &g, t, "gemma", err) == 0 && ct.family == LLM_CHAT_GEMMA,
              "--chat-template gemma");
        CHECK(llm_chat_template_init_gguf(&ct, &g, t, "jinja2", err) == 0 && ct.family == LLM_CHAT_CHATML &&
              strstr(ct.note, "unknown chat template 'jinja2'"), "unknown name: %s", ct.note);
        /* a rendered prompt that writes BOS itself gets no second one */
        const char *text = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
        int32_t a[32], b[32];
        int na = llm_tokenize_prompt(t, text, strlen(text), a, 32);
        int nb = llm_tokenize_prompt(t, text + 17, strlen(text + 17), b, 32);
        CHECK(na == nb && na > 3 && a[0] == 128000 && a[1] != 128000 && !memcmp(a, b, (size_t)na * 4),
              "BOS once: %d and %d ids", na, nb);
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }
    if ((t = tok_load(&g, "ggml-vocab-qwen2.gguf", NULL))) {
        llm_chat_template ct;
        CHECK(llm_chat_template_init_gguf(&ct, &g, t, NULL, err) == 0 && ct.family == LLM_CHAT_QWEN3 &&
              ct.enable_thinking == 1 && !ct.default_system[0], "qwen2 vocabulary's (Qwen3's) template: %s",
              llm_chat_family_name(ct.family));
        CHECK(llm_chat_detect(NULL, 0, t) == LLM_CHAT_QWEN3, "qwen3 from its vocabulary");
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }
    if ((t = tok_load(&g, "ggml-vocab-llama-spm.gguf", NULL))) { /* no template, no chat tokens */
        llm_chat_template ct;
        CHECK(llm_chat_detect(NULL, 0, t) == -1, "llama-spm names no family");
        CHECK(llm_chat_template_init_gguf(&ct, &g, t, NULL, err) == 0 && ct.family == LLM_CHAT_CHATML &&
              strstr(ct.note, "no chat template"), "no template: %s", ct.note);
        const char *text = "<s>[INST] Hi [/INST]";
        int32_t a[32], b[32];
        int na = llm_tokenize_prompt(t, text, strlen(text), a, 32);
        int nb = llm_tokenize_prompt(t, "Hi", 2, b, 32);
        CHECK(na > 2 && a[0] == 1 && a[1] != 1 && nb == 2 && b[0] == 1, "spm BOS once: %d, %d", na, nb);
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }
    llm_chat_template ct;
    CHECK(llm_chat_template_init(&ct, NULL, 0, NULL, NULL, err) == -1 && strstr(err, "no vocabulary"),
          "chat without a vocabulary: %s", err);
    const char *qwen25 = chat_published[0].text;
    llm_model m;
    if (llm_model_load(&m, "models/SmolLM2-135M-Instruct.Q4_1.gguf", err) != 0) {
        CHECK(0, "the default chat model (make model fetches it): %s", err);
        return;
    }
    CHECK(llm_chat_template_init_gguf(&ct, &m.gguf, m.tok, NULL, err) == 0 && ct.family == LLM_CHAT_CHATML &&
          !strcmp(ct.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
          "SmolLM2's template: %s, default system \"%s\"", llm_chat_family_name(ct.family),
          ct.default_system);
    int32_t ids[8];
    int n = llm_chat_stop_ids(&ct, m.tok, ids, 8);
    CHECK(n == 1 && ids[0] == 2, "SmolLM2's end of turn is its EOS <|im_end|> (2): %d ids, %d", n, ids[0]);
    llm_model_free(&m);
    /* the default system prompt of a template given as text */
    if ((t = tok_load(&g, "ggml-vocab-qwen2.gguf", NULL))) {
        CHECK(llm_chat_template_init(&ct, qwen25, strlen(qwen25), t, NULL, err) == 0 &&
              ct.family == LLM_CHAT_CHATML &&
              !strcmp(ct.default_system,
                      "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
              "Qwen2.5's default system: \"%s\"", ct.default_system);
        llm_tokenizer_free(t); llm_gguf_close(&g);
    }
}


/* Reads "name: N" style numbers out of /stats: the value after the nth occurrence of key. */
static long stat_after(const char *text, const char *key, int nth) {
    const char *p = text;
    for (int i = 0; p && i <= nth; i++) { p = strstr(p, key); if (p && i < nth) p += strlen(key); }
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* The chat REPL with piped stdin: a turn a line, replies on stdout, /stats on stderr. The first is the
 * README's chat example, as a user runs it (the default path): SmolLM2's greedy reply, whose every token
 * leads the next best by 1.07 nats or more (on "What is the capital of France?" the best two first tokens are
 * 0.3 apart, and the fast path's 8-bit activations turn "The" into "L'Étoile, ...", as llama.cpp's do). */
static void test_chat_piped(void) {
    if (access(CHAT_MODEL, R_OK) != 0) { CHECK(0, "%s missing (make model fetches it)", CHAT_MODEL); return; }
    int status;
    char *out = run_command("printf 'What is the capital of Japan?\\n' | ./llm chat -m " CHAT_MODEL
                            " --temp 0 2>/dev/null", &status);
    /* nothing but the reply and its newline on stdout */
    CHECK(out && status == 0 && !strcmp(out, "The capital of Japan is Tokyo.\n"),
          "chat: the capital of Japan: \"%s\"", out ? out : "");
    free(out);
    /* without flags, a file without general.sampling.* chats at SmolLM2's recommended sampling */
    out = run_command("printf '/stats\\n' | ./llm chat -m " CHAT_MODEL " 2>&1 >/dev/null | grep sampling",
                      &status);
    CHECK(out && !strcmp(out, "llm: sampling: temp 0.2 top-p 0.9 (default for a chat with a file without "
                              "general.sampling.*)\nsampling: temp 0.2 top-p 0.9 (default for a chat with a "
                              "file without general.sampling.*)\n"),
          "chat: the default sampling, on the load line and in /stats: \"%s\"", out ? out : "");
    free(out);
    /* two turns, with /stats after each on stderr; twice over, greedy: the same replies */
    const char *cmd = "printf 'The secret word is banana.\\n/stats\\nWhat is the secret word?\\n/stats\\n' | "
                      "./llm chat -m " CHAT_MODEL " --temp 0 -n 48 2>llm-test-chat.err";
    char *first = run_command(cmd, &status);
    char *err = read_file("llm-test-chat.err", NULL);
    char *again = run_command(cmd, &status);
    CHECK(first && again && status == 0 && !strcmp(first, again), "chat: the same replies twice:\n%s\n%s",
          first ? first : "", again ? again : "");
    char *second_reply = first ? strchr(first, '\n') : NULL;
    CHECK(second_reply && strstr(second_reply, "banana"), "chat: the second reply knows the first turn: %s",
          first ? first : "");
    /* the second turn alone knows no secret */
    char *alone = run_command("printf 'What is the secret word?\\n' | ./llm chat -m " CHAT_MODEL
                              " --temp 0 -n 48 2>/dev/null", &status);
    CHECK(alone && !strstr(alone, "banana") && second_reply && strcmp(alone, second_reply + 1) != 0,
          "chat: the second turn alone gives another reply: %s", alone ? alone : "");
    /* Turn 1's prompt and reply had K/V for P1 + G1 - 1 tokens (the last sampled token never went through
     * the model), in full blocks of 16 but for the last. Turn 2 begins with exactly those tokens, so the
     * prefix cache gives it every full block of them and it computes only the rest. */
    long p1 = err ? stat_after(err, "last reply: prompt ", 0) : -1;
    long g1 = err ? stat_after(err, " ms; ", 0) : -1;
    long p2 = err ? stat_after(err, "last reply: prompt ", 1) : -1;
    long c2 = err ? stat_after(err, "tokens (", 1) : -1;
    CHECK(p1 > 0 && g1 > 0 && p2 > p1 + g1 && c2 == (p1 + g1 - 1) / 16 * 16 && c2 >= 32,
          "chat: turn 2 takes turn 1's blocks from the prefix cache: P1 %ld G1 %ld P2 %ld cached %ld\n%s", p1,
          g1, p2, c2, err ? err : "");
    CHECK(err && stat_after(err, "turns: ", 1) == 2 && strstr(err, "KV blocks: "), "chat /stats: %s",
          err ? err : "");
    free(first); free(again); free(alone); free(err);
    remove("llm-test-chat.err");
    /* the oldest turns go when the conversation outgrows the context */
    out = run_command("printf 'Hello!\\nTell me about cats.\\nAnd dogs?\\n/stats\\n' | "
                      "./llm chat -m " CHAT_MODEL " --temp 0 -n 24 --max-model-len 128 2>&1 >/dev/null",
                      &status);
    CHECK(out && status == 0 && strstr(out, "oldest turn was dropped") && stat_after(out, "turns: ", 0) == 3,
          "chat: a context of 128 tokens drops turns: %s", out ? out : "");
    free(out);
}

/* The REPL on a terminal: Ctrl-C stops a reply (its blocks come back) and the REPL goes on; the up arrow
 * brings back the last line; Ctrl-D at an empty prompt leaves with status 0. */
static int pty_wait_for(int fd, char *buf, size_t cap, size_t *len, size_t from, const char *what,
                        double timeout_s) {
    double t0 = llm_now();
    while (llm_now() - t0 < timeout_s) {
        buf[*len] = 0;
        if (strstr(buf + from, what)) return 1;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t n = read(fd, buf + *len, cap - 1 - *len);
        if (n <= 0) return 0;
        *len += (size_t)n;
        if (*len + 1 >= cap) return 0;
    }
    buf[*len] = 0;
    return strstr(buf + from, what) != NULL;
}

static void test_chat_terminal(void) {
    if (access(CHAT_MODEL, R_OK) != 0) { CHECK(0, "%s missing (make model fetches it)", CHAT_MODEL); return; }
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    if (pid < 0) { CHECK(0, "forkpty: %s", strerror(errno)); return; }
    if (pid == 0) {
        execl("./llm", "llm", "chat", "-m", CHAT_MODEL, "--temp", "0", "-n", "600", (char *)NULL);
        _exit(127);
    }
    size_t cap = 1 << 20, len = 0;
    char *buf = (char *)calloc(cap, 1);
    CHECK(pty_wait_for(fd, buf, cap, &len, 0, "> ", 60), "chat on a terminal: the prompt: %s", buf);
    const char *ask = "Write a very long story about a dragon and a knight.\r";
    CHECK(write(fd, ask, strlen(ask)) == (ssize_t)strlen(ask), "write to the terminal");
    /* the line as it is typed (redrawn at each key), its end, then the reply: stopped after a few words */
    int streaming = pty_wait_for(fd, buf, cap, &len, 0, "knight.", 30);
    size_t mark = len;
    streaming = streaming && pty_wait_for(fd, buf, cap, &len, strstr(buf, "knight.") - buf, "\r\n", 30);
    mark = strstr(strstr(buf, "knight."), "\r\n") - buf + 2;
    for (double t0 = llm_now(); streaming && len < mark + 40 && llm_now() - t0 < 30;)
        pty_wait_for(fd, buf, cap, &len, len, "\x01", 0.1); /* reads what comes, for a tenth of a second */
    CHECK(streaming && len >= mark + 40, "chat on a terminal: the reply streams: %s", buf + mark);
    CHECK(write(fd, "\x03", 1) == 1, "write Ctrl-C");
    mark = len;
    CHECK(pty_wait_for(fd, buf, cap, &len, mark, "[interrupted]", 30) &&
          pty_wait_for(fd, buf, cap, &len, mark, "> ", 30),
          "chat on a terminal: Ctrl-C stops the reply and the prompt comes back: %s", buf + mark);
    CHECK(write(fd, "/stats\r", 7) == 7, "write /stats");
    mark = len;
    pty_wait_for(fd, buf, cap, &len, mark, "cached prefixes)", 30);
    long free_blocks = -1, total = -2;
    const char *kv = strstr(buf + mark, "KV blocks: ");
    if (kv) sscanf(kv, "KV blocks: %ld of %ld", &free_blocks, &total);
    long generated = stat_after(buf + mark, " ms; ", 0);
    CHECK(free_blocks > 0 && free_blocks == total && generated > 0 && generated < 600,
          "chat on a terminal: after Ctrl-C all %ld blocks are free (%ld), %ld tokens generated: %s", total,
          free_blocks, generated, buf + mark);
    /* the up arrow brings /stats back */
    mark = len;
    CHECK(write(fd, "\x1b[A\r", 4) == 4, "write the up arrow");
    CHECK(pty_wait_for(fd, buf, cap, &len, mark, "cached prefixes)", 30),
          "chat on a terminal: the up arrow: %s", buf + mark);
    pty_wait_for(fd, buf, cap, &len, strstr(buf + mark, "cached prefixes)") - buf, "> ", 30);
    CHECK(write(fd, "\x04", 1) == 1, "write Ctrl-D");
    int status = -1;
    double t0 = llm_now();
    while (llm_now() - t0 < 30 && waitpid(pid, &status, WNOHANG) == 0) {
        char sink[4096];
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) > 0 && read(fd, sink, sizeof sink) <= 0) usleep(10000);
    }
    if (!WIFEXITED(status)) { kill(pid, SIGKILL); waitpid(pid, &status, 0); }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "chat on a terminal: Ctrl-D leaves with status 0");
    close(fd);
    free(buf);
}

/* -----------------------------------------------------------------------------------------------------------
 * llm serve: the real server on a free loopback port, driven over real sockets; exact bytes where it matters
 * -------------------------------------------------------------------------------------------------------- */
typedef struct { pid_t pid; int port; char log[64]; } test_server;

/* SIGTERM, then the exit status (0 expected: in-flight requests finish, then it exits). */
static int server_stop(test_server *s) {
    int status = -1;
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    double t0 = llm_now();
    while (waitpid(s->pid, &status, WNOHANG) == 0) {
        if (llm_now() - t0 > 60) { kill(s->pid, SIGKILL); waitpid(s->pid, &status, 0); break; }
        usleep(10000);
    }
    remove(s->log);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Starts ./llm serve on stories260K with extra flags, after shell commands (e.g. "ulimit -n 200; "); reads
 * the port from its "listening on" line. 0 once it listens; else -1 (a failed CHECK), the server stopped. */
static int server_start_in(test_server *s, const char *shell, const char *extra) {
    static int serial;
    snprintf(s->log, sizeof s->log, "llm-test-serve-%d-%d.log", (int)getpid(), serial++);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%sexec ./llm serve -m %s --port 0 %s 2>%s", shell,
             model_path("stories260K.gguf"), extra, s->log);
    s->port = 0;
    s->pid = fork();
    if (s->pid == 0) { execl("/bin/sh", "sh", "-c", cmd, (char *)NULL); _exit(127); }
    for (double t0 = llm_now(); s->pid > 0 && llm_now() - t0 < 60 && !s->port; usleep(20000)) {
        char *log = read_file(s->log, NULL);
        const char *p = log ? strstr(log, "listening on http://127.0.0.1:") : NULL;
        if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        free(log);
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid) break;
    }
    CHECK(s->port > 0, "llm serve %s starts and listens", extra);
    if (s->port > 0) return 0;
    server_stop(s); /* nothing left running or on disk: the caller just returns */
    s->pid = 0;     /* and a server_stop of its own does nothing */
    return -1;
}

static int server_start(test_server *s, const char *extra) { return server_start_in(s, "", extra); }

static char *http_post(int port, const char *path, const char *body, const char *extra_headers);
/* llm serve takes the file's general.sampling.* for what a request omits (as vLLM takes generation_config):
 * a request without sampling fields samples as one that names the file's values, with the same seed. */
static void test_server_sampling_keys(void) {
    float temp = 1.5f, top_p = 0.5f;
    int32_t top_k = 3;
    test_kv kvs[] = {{"general.sampling.temp", LLM_GGUF_F32, &temp, 4},
                     {"general.sampling.top_k", LLM_GGUF_I32, &top_k, 4},
                     {"general.sampling.top_p", LLM_GGUF_F32, &top_p, 4}};
    char path[64], extra[128];
    if (gguf_with_keys("stories260K.gguf", kvs, 3, path) != 0) {
        CHECK(0, "write a GGUF copy with general.sampling.*");
        return;
    }
    test_server s;
    snprintf(extra, sizeof extra, "-m %s", path);
    if (server_start(&s, extra) != 0) { remove(path); return; }
    char *log = read_file(s.log, NULL);
    CHECK(log && strstr(log, "llm serve: sampling, for what a request omits: temperature 1.5, top_p 0.5, "
                             "top_k 3, min_p 0, repetition_penalty 1 (the file's general.sampling.* over "
                             "OpenAI's defaults)\n"),
          "serve: the file's sampling on the load line: %s", log ? log : "");
    free(log);
    char *texts[3];
    const char *bodies[3] = {
        "{\"prompt\": \"Once\", \"max_tokens\": 24, \"seed\": 7}",
        "{\"prompt\": \"Once\", \"max_tokens\": 24, \"seed\": 7, \"temperature\": 1.5, \"top_p\": 0.5, "
        "\"top_k\": 3}",
        "{\"prompt\": \"Once\", \"max_tokens\": 24, \"seed\": 7, \"temperature\": 1, \"top_p\": 1, "
        "\"top_k\": -1}"};
    for (int i = 0; i < 3; i++) {
        char *r = http_post(s.port, "/v1/completions", bodies[i], NULL);
        const char *t = r ? strstr(r, "\"text\":") : NULL;
        texts[i] = strdup(t ? t : "");
        char *end = strstr(texts[i], "\",\""); /* the text ends where the next field begins */
        if (end) *end = 0;
        free(r);
    }
    CHECK(texts[0][0] && !strcmp(texts[0], texts[1]) && strcmp(texts[0], texts[2]) != 0,
          "serve: an omitted field takes the file's value: %s / %s / %s", texts[0], texts[1], texts[2]);
    for (int i = 0; i < 3; i++) free(texts[i]);
    CHECK(server_stop(&s) == 0, "serve: exit status 0");
    remove(path);
}

/* A loopback connection to port. A client that reads nothing (the backpressure tests) asks for a small
 * receive buffer before it connects: else Linux's autotuning lets the kernel hold up to net.ipv4.tcp_rmem's
 * maximum of the stream unread (32 MiB on some machines: a test's whole stream, which then never stalls the
 * server) */
static int tcp_connect_buffered(int port, int receive_buffer) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && receive_buffer > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET; a.sin_port = htons((uint16_t)port); a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); fd = -1; }
    return fd;
}
static int tcp_connect(int port) { return tcp_connect_buffered(port, 0); }

static int send_all(int fd, const char *data, size_t n) {
    while (n) {
        ssize_t k = send(fd, data, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        data += k; n -= (size_t)k;
    }
    return 0;
}

/* Reads until the peer closes or timeout_s passes; returns what came (malloc'd, NUL-terminated). */
static char *recv_all(int fd, double timeout_s, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = (char *)malloc(cap);
    for (double t0 = llm_now(); buf && llm_now() - t0 < timeout_s;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        if (n + 4096 > cap) { char *b = (char *)realloc(buf, cap *= 2); if (!b) break; buf = b; }
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    if (buf) buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* One request on a new connection (Connection: close): the whole response. */
static char *http_request_raw(int port, const char *raw, size_t n) {
    int fd = tcp_connect(port);
    if (fd < 0) return NULL;
    char *out = send_all(fd, raw, n) == 0 ? recv_all(fd, 60, NULL) : NULL;
    close(fd);
    return out;
}

#define JSON_CT "Content-Type: application/json\r\n" /* what a POST to llm serve must say (else 415) */

static char *http_post(int port, const char *path, const char *body, const char *extra_headers) {
    char *req = (char *)malloc(strlen(body) + 1024);
    int n = sprintf(req, "POST %s HTTP/1.1\r\nHost: x\r\n" JSON_CT "Content-Length: %zu\r\n"
                    "Connection: close\r\n%s\r\n%s", path, strlen(body), extra_headers ? extra_headers : "",
                    body);
    char *out = http_request_raw(port, req, (size_t)n);
    free(req);
    return out;
}

static char *http_get(int port, const char *path, const char *extra_headers) {
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n", path,
                     extra_headers ? extra_headers : "");
    return http_request_raw(port, req, (size_t)n);
}

static int http_status(const char *resp) {
    return resp && !strncmp(resp, "HTTP/1.1 ", 9) ? atoi(resp + 9) : -1;
}
static const char *http_body(const char *resp) {
    const char *p = resp ? strstr(resp, "\r\n\r\n") : NULL;
    return p ? p + 4 : "";
}

/* A chunked body's data, joined. */
static char *dechunk(const char *body) {
    size_t n = 0;
    char *out = (char *)calloc(strlen(body) + 1, 1);
    while (out && *body) {
        char *end;
        unsigned long size = strtoul(body, &end, 16);
        if (end == body || strncmp(end, "\r\n", 2)) break;
        if (size == 0) break;
        body = end + 2;
        if (strlen(body) < size + 2) break;
        memcpy(out + n, body, size); n += size;
        body += size + 2;
    }
    return out;
}

/* The "text" (completions) or "content" (chat deltas) of every SSE event for choice `index`, joined; also
 * how many events, their finish reason and whether the stream ended with [DONE]. */
static void sse_collect(const char *events, int index, int chat, char *text, size_t cap, int *n_events,
                        char *finish, int *done) {
    size_t n = 0;
    *n_events = 0; finish[0] = 0; *done = 0;
    for (const char *p = strstr(events, "data: "); p; p = strstr(p + 1, "data: ")) {
        const char *end = strstr(p, "\n\n");
        if (!strncmp(p, "data: [DONE]\n\n", 14)) { *done = 1; continue; }
        char key[32];
        snprintf(key, sizeof key, "\"index\":%d,", index);
        const char *ip = strstr(p, key);
        if (!ip || (end && ip > end)) continue;
        (*n_events)++;
        const char *v = tok_json_value(ip, end, chat ? "content" : "text");
        if (v && *v == '"') n += tok_json_string(v, text + n, cap - 1 - n);
        v = tok_json_value(ip, end, "finish_reason");
        if (v && *v == '"') finish[tok_json_string(v, finish, 15)] = 0;
    }
    text[n < cap ? n : cap - 1] = 0;
}

/* A JSON string value of key in body (the first), or "" */
static const char *json_str(const char *body, const char *key, char *out, size_t cap) {
    const char *v = tok_json_value(body, NULL, key);
    size_t n = v && *v == '"' ? tok_json_string(v, out, cap - 1) : 0;
    out[n < cap ? n : cap - 1] = 0;
    return out;
}

/* A gauge or counter of /metrics */
static double metric(int port, const char *name) {
    char *m = http_get(port, "/metrics", NULL);
    char key[128];
    snprintf(key, sizeof key, "\n%s{", name);
    const char *p = m ? strstr(m, key) : NULL;
    double v = p ? strtod(strchr(p, '}') + 1, NULL) : -1;
    free(m);
    return v;
}

/* llm serve --speculative-config (vLLM's JSON): a greedy completion whose text repeats its prompt gives the
 * bytes a server without it gives, and /metrics has vLLM's spec_decode counters, which add up (the accepted
 * tokens are those counted per position, at most those proposed). A method other than ngram, or a key it
 * does not know, stops the server at its start, naming it. */
static void test_server_speculative(void) {
    test_server plain, spec;
    if (server_start(&plain, "") != 0) return;
    if (server_start(&spec, "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                            "\"prompt_lookup_max\": 3, \"prompt_lookup_min\": 2}'") != 0) {
        server_stop(&plain); return;
    }
    const char *body = "{\"prompt\":\"Lily and Ben went to the park. They saw a big red ball. Lily and Ben "
                       "went to the park. They saw\",\"max_tokens\":60,\"temperature\":0}";
    char *a = http_post(plain.port, "/v1/completions", body, NULL);
    char *b = http_post(spec.port, "/v1/completions", body, NULL);
    const char *ta = a ? strstr(a, "\"text\":") : NULL, *tb = b ? strstr(b, "\"text\":") : NULL;
    const char *ea = ta ? strstr(ta, "\",\"") : NULL, *eb = tb ? strstr(tb, "\",\"") : NULL;
    CHECK(http_status(a) == 200 && http_status(b) == 200 && ea && eb && ea - ta == eb - tb &&
          !memcmp(ta, tb, (size_t)(ea - ta)), "serve --speculative-config: the same text as without: %s / %s",
          a ? a : "", b ? b : "");
    free(a); free(b);
    char *m = http_get(spec.port, "/metrics", NULL);
    double drafts = metric(spec.port, "vllm:spec_decode_num_drafts_total");
    double proposed = metric(spec.port, "vllm:spec_decode_num_draft_tokens_total");
    double accepted = metric(spec.port, "vllm:spec_decode_num_accepted_tokens_total"), per_pos = 0;
    int positions = 0;
    for (const char *p = m; p && (p = strstr(p, "\nvllm:spec_decode_num_accepted_tokens_per_pos_total{"));
         p++) {
        const char *end = strchr(p, '}');
        if (end) { per_pos += strtod(end + 1, NULL); positions++; }
    }
    CHECK(m && strstr(m, "\n# TYPE vllm:spec_decode_num_drafts_total counter\n") && drafts > 0 &&
          accepted > 0 && accepted <= proposed && proposed <= 4 * drafts && positions == 4 &&
          per_pos == accepted, "serve --speculative-config: /metrics drafts %g, proposed %g, accepted %g "
          "(per position %g in %d)", drafts, proposed, accepted, per_pos, positions);
    free(m);
    m = http_get(plain.port, "/metrics", NULL);
    CHECK(m && !strstr(m, "spec_decode"), "serve without speculation: no spec_decode metrics, as vLLM");
    free(m);
    CHECK(server_stop(&spec) == 0, "serve --speculative-config: stops cleanly");
    /* a draft model (the same file: it proposes the model's own greedy tokens), vLLM's JSON */
    char draft_args[1200];
    snprintf(draft_args, sizeof draft_args, "--speculative-config '{\"method\": \"draft_model\", \"model\": "
             "\"%s\", \"num_speculative_tokens\": 3}'", model_path("stories260K.gguf"));
    if (server_start(&spec, draft_args) == 0) {
        a = http_post(plain.port, "/v1/completions", body, NULL);
        b = http_post(spec.port, "/v1/completions", body, NULL);
        ta = a ? strstr(a, "\"text\":") : NULL; tb = b ? strstr(b, "\"text\":") : NULL;
        ea = ta ? strstr(ta, "\",\"") : NULL; eb = tb ? strstr(tb, "\",\"") : NULL;
        CHECK(http_status(a) == 200 && http_status(b) == 200 && ea && eb && ea - ta == eb - tb &&
              !memcmp(ta, tb, (size_t)(ea - ta)), "serve with a draft model: the same text as without: %s / "
              "%s", a ? a : "", b ? b : "");
        free(a); free(b);
        drafts = metric(spec.port, "vllm:spec_decode_num_drafts_total");
        proposed = metric(spec.port, "vllm:spec_decode_num_draft_tokens_total");
        accepted = metric(spec.port, "vllm:spec_decode_num_accepted_tokens_total");
        CHECK(drafts > 0 && accepted > 0 && accepted <= proposed && proposed <= 3 * drafts,
              "serve with a draft model: /metrics drafts %g, proposed %g, accepted %g", drafts, proposed,
              accepted);
    }
    CHECK(server_stop(&plain) == 0 && server_stop(&spec) == 0, "serve with a draft model: both stop cleanly");
    char wrong_vocab[1100], missing[1100];
    snprintf(wrong_vocab, sizeof wrong_vocab, "--speculative-model %s",
             model_path("random-llama2-untied.gguf"));
    snprintf(missing, sizeof missing, "--speculative-model %s", model_path("no-such-draft.gguf"));
    const char *const refused[][2] = {
        {"--speculative-config '{\"method\": \"eagle\"}'", "method must be \"ngram\" or \"draft_model\""},
        {"--spec-ngram 4 --speculative-model x.gguf", "speculative decoding takes one method"},
        {"--speculative-config '{\"method\": \"draft_model\"}'", "the draft_model method needs a \"model\""},
        {wrong_vocab, "the draft model's vocabulary (32000 tokens) is not the model's (512 tokens)"},
        {missing, "the draft model: "},
        {"--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"draft_tp\": 1}'",
         "unknown key \"draft_tp\""},
        {"--speculative-config '{\"num_speculative_tokens\": 40}'", "num_speculative_tokens must be between"},
        {"--spec-ngram 17", "--spec-ngram"}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char cmd[2600];
        int status;
        snprintf(cmd, sizeof cmd, "./llm serve -m %s --port 0 %s 2>&1", model_path("stories260K.gguf"),
                 refused[i][0]);
        char *out = run_command(cmd, &status);
        CHECK(status != 0 && out && strstr(out, refused[i][1]), "llm serve %s: refused (%s): %s",
              refused[i][0], refused[i][1], out ? out : "");
        free(out);
    }
}

/* POST /v1/embeddings (and /v1/rerank, /v1/score), on the random qwen3 embedding model (last-token pooling,
 * EOS appended by its vocabulary) against tools/embed_oracle.py's vectors, and on stories260K (no pooling):
 * - "Hello world" as a string is the reference's prompt 0 (its ids and EOS): the vector within 1e-3 of the
 *   oracle's, the exact body around it; as base64, the same float32 values (little-endian, padded); as ids
 *   the same; a list of two strings: two items in order, their tokens in usage;
 * - dimensions 8 with --matryoshka: the oracle's first 8 values renormalised;
 * - refused, with exact bodies: dimensions without --matryoshka, encoding_format, normalize false, an empty
 *   string, no input, 1025 inputs, /v1/rerank and /v1/score, and a model with no pooling type. */
static int parse_floats(const char *s, float *out, int cap) {
    int n = 0;
    const char *p = s ? strstr(s, "\"embedding\":[") : NULL;
    if (!p) return 0;
    p += strlen("\"embedding\":[");
    while (n < cap && *p && *p != ']') {
        char *end;
        out[n++] = strtof(p, &end);
        if (end == p) return -1;
        p = end + (*end == ',');
    }
    return n;
}

/* Base64 from p up to a '"' or the end, into out (at most cap bytes): the count, or -1 on a foreign
 * character */
static int decode_base64(const char *p, uint8_t *out, int cap) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int nb = 0, bits = 0;
    uint32_t acc = 0;
    for (; *p && *p != '"' && *p != '='; p++) {
        const char *d = strchr(digits, *p);
        if (!d) return -1;
        acc = acc << 6 | (uint32_t)(d - digits);
        bits += 6;
        if (bits >= 8 && nb < cap) { bits -= 8; out[nb++] = (uint8_t)(acc >> bits); }
    }
    return nb;
}

static int decode_base64_floats(const char *s, float *out, int cap) {
    const char *p = s ? strstr(s, "\"embedding\":\"") : NULL;
    if (!p) return 0;
    uint8_t bytes[4096];
    int nb = decode_base64(p + strlen("\"embedding\":\""), bytes, (int)sizeof bytes);
    if (nb < 0) return -1;
    int n = nb / 4 < cap ? nb / 4 : cap;
    for (int i = 0; i < n; i++) {
        uint32_t u = bytes[4 * i] | (uint32_t)bytes[4 * i + 1] << 8 | (uint32_t)bytes[4 * i + 2] << 16 |
                     (uint32_t)bytes[4 * i + 3] << 24;
        memcpy(&out[i], &u, 4);
    }
    return n;
}

static void test_server_embeddings(void) {
    char extra[1200];
    llm_json ref;
    char *text = pool_reference(&ref);
    if (!text) return;
    const llm_json *p0 = llm_json_get(&ref, "prompts");
    const llm_json *want = p0 && p0->n ? llm_json_get(&p0->items[0], "last") : NULL;
    test_server s;
    snprintf(extra, sizeof extra, "-m %s --matryoshka", model_path("random-qwen3-embed.gguf"));
    if (!want || server_start(&s, extra) != 0) { llm_json_free(&ref); free(text); return; }
    float v[64] = {0}, w[64] = {0}, u[64];
    char *r = http_post(s.port, "/v1/embeddings",
                        "{\"input\":\"Hello world\",\"model\":\"random-qwen3-embed\"}", NULL);
    int n = parse_floats(http_body(r), v, 64);
    double diff;
    double cos = pool_compare(v, n, want, &diff);
    CHECK(http_status(r) == 200 && n == 32 && cos >= 0.9999 && diff <= 1e-3 &&
          !strncmp(http_body(r), "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,"
                   "\"embedding\":[", 70) &&
          strstr(r, "]}],\"model\":\"random-qwen3-embed\",\"usage\":{\"prompt_tokens\":3,"
                    "\"total_tokens\":3}}"),
          "embeddings: \"Hello world\" as the oracle's (cosine %.9f, max diff %.2g): %s", cos, diff, r);
    free(r);
    /* llm embed: the same vector, a line of space-separated floats per text */
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "./llm embed -m %s 'Hello world' Hi 2>/dev/null",
             model_path("random-qwen3-embed.gguf"));
    int status, lines = 0, same = 1;
    char *out = run_command(cmd, &status), *at = out;
    for (int i = 0; at && i < 32; i++) {
        char *end;
        float x = strtof(at, &end);
        same &= end != at && x == v[i] && *end == (i < 31 ? ' ' : '\n');
        at = end + 1;
    }
    for (char *c = out; c && *c; c++) lines += *c == '\n';
    CHECK(status == 0 && same && lines == 2, "llm embed: the server's vector: %.300s", out ? out : "");
    free(out);
    /* 128 bytes: 172 digits, the last '=' */
    r = http_post(s.port, "/v1/embeddings", "{\"input\":\"Hello world\",\"encoding_format\":\"base64\"}",
                  NULL);
    int m = decode_base64_floats(http_body(r), w, 64);
    const char *q = r ? strstr(r, "\"embedding\":\"") : NULL;
    CHECK(http_status(r) == 200 && m == 32 && !memcmp(v, w, sizeof(float) * 32) && q &&
          !strcmp(q + 13 + 171, "=\"}],\"model\":\"random-qwen3-embed\",\"usage\":{\"prompt_tokens\":3,"
                  "\"total_tokens\":3}}") &&
          strspn(q + 13, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") == 171,
          "embeddings: base64, the same float32 values: %s", r);
    free(r);
    r = http_post(s.port, "/v1/embeddings", "{\"input\":[[9707,1879,151645]],\"encoding_format\":\"float\"}",
                  NULL);
    m = parse_floats(http_body(r), w, 64);
    CHECK(http_status(r) == 200 && m == 32 && !memcmp(v, w, sizeof(float) * 32), "embeddings: ids: %s", r);
    free(r);
    r = http_post(s.port, "/v1/embeddings", "{\"input\":[\"Hello world\",\"Hi\"],\"user\":\"u\"}", NULL);
    m = parse_floats(http_body(r), w, 64);
    CHECK(http_status(r) == 200 && m == 32 && !memcmp(v, w, sizeof(float) * 32) &&
          strstr(r, "]},{\"object\":\"embedding\",\"index\":1,\"embedding\":[") &&
          strstr(r, "\"usage\":{\"prompt_tokens\":5,\"total_tokens\":5}}"), "embeddings: two strings: %s", r);
    free(r);
    r = http_post(s.port, "/v1/embeddings", "{\"input\":\"Hello world\",\"dimensions\":8}", NULL);
    m = parse_floats(http_body(r), w, 64);
    double norm = 0, worst = 0;
    for (int i = 0; i < 8; i++) norm += want->items[i].num * want->items[i].num;
    for (int i = 0; i < 8 && m == 8; i++)
        if (fabs(w[i] - want->items[i].num / sqrt(norm)) > worst)
            worst = fabs(w[i] - want->items[i].num / sqrt(norm));
    CHECK(http_status(r) == 200 && m == 8 && worst <= 1e-3, "embeddings: dimensions 8 (%.2g): %s", worst, r);
    free(r);
    static const struct { const char *path, *body, *want; } refused[] = {
        {"/v1/embeddings", "{\"input\":\"a\",\"encoding_format\":\"int8\"}", "{\"error\":{\"message\":"
         "\"encoding_format must be \\\"float\\\" or \\\"base64\\\"\",\"type\":\"invalid_request_error\","
         "\"param\":\"encoding_format\",\"code\":400}}"},
        {"/v1/embeddings", "{\"input\":\"a\",\"normalize\":false}", "{\"error\":{\"message\":\"normalize is "
         "not supported by this server (only null or its default value is accepted)\",\"type\":"
         "\"invalid_request_error\",\"param\":\"normalize\",\"code\":400}}"},
        {"/v1/embeddings", "{\"input\":[\"a\",\"\"]}", "{\"error\":{\"message\":\"input has an empty "
         "string\",\"type\":\"invalid_request_error\",\"param\":\"input\",\"code\":400}}"},
        {"/v1/embeddings", "{\"model\":\"random-qwen3-embed\"}", "{\"error\":{\"message\":\"input is "
         "required\",\"type\":\"invalid_request_error\",\"param\":\"input\",\"code\":400}}"},
        {"/v1/embeddings", "{\"input\":\"a\",\"dimensions\":33}", "{\"error\":{\"message\":\"dimensions "
         "must be between 1 and 32, got 33\",\"type\":\"invalid_request_error\",\"param\":\"dimensions\","
         "\"code\":400}}"},
        {"/v1/rerank", "{\"query\":\"a\",\"documents\":[\"b\"]}", "{\"error\":{\"message\":\"this model is "
         "not a reranker: its pooling type is 3 (last), not 4 (rank); llm serve --pooling rank scores with "
         "it anyway\",\"type\":\"invalid_request_error\","
         "\"param\":null,\"code\":400}}"},
        {"/v1/score", "{\"text_1\":\"a\",\"text_2\":\"b\"}", "{\"error\":{\"message\":\"this model is "
         "not a reranker: its pooling type is 3 (last), not 4 (rank); llm serve --pooling rank scores with "
         "it anyway\",\"type\":\"invalid_request_error\","
         "\"param\":null,\"code\":400}}"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        r = http_post(s.port, refused[i].path, refused[i].body, NULL);
        CHECK(http_status(r) == 400 && !strcmp(http_body(r), refused[i].want), "embeddings: %s %s: %s",
              refused[i].path, refused[i].body, r);
        free(r);
    }
    char many[8192] = "{\"input\":[\"a\""; /* 1025 inputs: over the bound, refused before any is read */
    for (int i = 1; i < 1025; i++) strcat(many, ",\"a\"");
    strcat(many, "]}");
    r = http_post(s.port, "/v1/embeddings", many, NULL);
    CHECK(http_status(r) == 400 && strstr(r, "\"message\":\"at most 1024 prompts in one request\","
                                          "\"type\":\"invalid_request_error\",\"param\":\"input\""),
          "embeddings: 1025 inputs: %s", r);
    free(r);
    CHECK(server_stop(&s) == 0, "embeddings: the server exits cleanly");
    /* stories260K: no pooling type; with --pooling mean it embeds, but dimensions needs --matryoshka */
    if (server_start(&s, "") != 0) { llm_json_free(&ref); free(text); return; }
    r = http_post(s.port, "/v1/embeddings", "{\"input\":\"a\"}", NULL);
    CHECK(http_status(r) == 400 && !strcmp(http_body(r), "{\"error\":{\"message\":\"this model makes no "
          "embeddings: it has no pooling type (GGUF key llama.pooling_type) and --pooling was not given\","
          "\"type\":\"invalid_request_error\",\"param\":null,\"code\":400}}"),
          "embeddings: no pooling: %s", r);
    free(r);
    server_stop(&s);
    if (server_start(&s, "--pooling mean") != 0) { llm_json_free(&ref); free(text); return; }
    r = http_post(s.port, "/v1/embeddings", "{\"input\":\"Once upon a time\"}", NULL);
    m = parse_floats(http_body(r), u, 64);
    CHECK(http_status(r) == 200 && m == 64, "embeddings: stories260K with --pooling mean: %s", r);
    free(r);
    r = http_post(s.port, "/v1/embeddings", "{\"input\":\"a\",\"dimensions\":8}", NULL);
    CHECK(http_status(r) == 400 && !strcmp(http_body(r), "{\"error\":{\"message\":\"this model does not "
          "declare Matryoshka embeddings: dimensions must be its size, 64, or absent (llm serve --matryoshka "
          "allows fewer)\",\"type\":\"invalid_request_error\",\"param\":\"dimensions\",\"code\":400}}"),
          "embeddings: dimensions without --matryoshka: %s", r);
    free(r);
    server_stop(&s);
    llm_json_free(&ref);
    free(text);
}

static void test_server_endpoints(void) {
    test_server s;
    if (server_start(&s, "") != 0) return;
    int port = s.port;
    char *r, buf[8192], finish[16];
    /* the references: llama.cpp's greedy texts on stories260K, over /v1/completions */
    int n_ref;
    ref_case *cases = stories_cases(&n_ref);
    for (int i = 0; i < n_ref; i++) {
        char body[2048];
        snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"prompt\":\"%s\",\"max_tokens\":%d,"
                 "\"temperature\":0}", cases[i].prompt, cases[i].max_tokens);
        r = http_post(port, "/v1/completions", body, NULL);
        json_str(http_body(r), "text", buf, sizeof buf);
        CHECK(http_status(r) == 200 && strlen(buf) == cases[i].n_completion &&
              !memcmp(buf, cases[i].completion, cases[i].n_completion),
              "serve: greedy \"%s\" gives llama.cpp's text: %s", cases[i].prompt, r ? r : "");
        free(r);
    }
    /* the exact body of a completion */
    r = http_post(port, "/v1/completions",
                  "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"temperature\":0}", NULL);
    const char *b = http_body(r);
    CHECK(http_status(r) == 200 && !strncmp(b, "{\"id\":\"cmpl-", 12) &&
          strstr(b, "\",\"object\":\"text_completion\",\"created\":") &&
          strstr(b, ",\"model\":\"stories260K\",\"system_fingerprint\":\"fp_llm\",\"choices\":[{\"index\":0,"
                    "\"text\":\", there was\",\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":"
                    "{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8,"
                    "\"prompt_tokens_details\":{\"cached_tokens\":0}}}") &&
          strstr(r, "\r\nContent-Type: application/json\r\n"), "serve: a completion's body: %s", r ? r : "");
    free(r);
    /* streaming: the same text in SSE events, a usage chunk, [DONE]; chunked, so keep-alive goes on */
    r = http_post(port, "/v1/completions",
                  "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"temperature\":0,"
                  "\"stream\":true,\"stream_options\":{\"include_usage\":true}}", NULL);
    char *ev = dechunk(http_body(r));
    int n_events, done;
    sse_collect(ev, 0, 0, buf, sizeof buf, &n_events, finish, &done);
    CHECK(http_status(r) == 200 && strstr(r, "Content-Type: text/event-stream\r\n") &&
          strstr(r, "Transfer-Encoding: chunked\r\n") && !strcmp(buf, ", there was") && n_events == 3 &&
          !strcmp(finish, "length") && done && strstr(ev, "\"choices\":[],\"usage\":{\"prompt_tokens\":5,"
          "\"completion_tokens\":3,\"total_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n"
          "data: [DONE]\n\n"),
          "serve: a streamed completion: %s", ev ? ev : "");
    free(ev); free(r);
    /* chat, not streamed and streamed: the first chunk says the role */
    r = http_post(port, "/v1/chat/completions",
                  "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}]}],\"max_tokens\":6,"
                  "\"temperature\":0}", NULL);
    char chat_text[1024];
    json_str(http_body(r), "content", chat_text, sizeof chat_text);
    CHECK(http_status(r) == 200 && strstr(r, "\"object\":\"chat.completion\"") &&
          strstr(r, "\"message\":{\"role\":\"assistant\",\"content\":") && strlen(chat_text) > 0 &&
          strstr(r, "\"completion_tokens\":6"), "serve: chat: %s", r ? r : "");
    free(r);
    r = http_post(port, "/v1/chat/completions",
                  "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                  "{\"role\":\"user\",\"content\":\"Hi\"}],\"max_completion_tokens\":6,\"temperature\":0,"
                  "\"stream\":true}", NULL);
    ev = dechunk(http_body(r));
    sse_collect(ev, 0, 1, buf, sizeof buf, &n_events, finish, &done);
    CHECK(http_status(r) == 200 && !strcmp(buf, chat_text) && done && !strcmp(finish, "length") &&
          strstr(ev, "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                 "\"logprobs\":null,\"finish_reason\":null}]}") && !strstr(ev, "\"usage\""),
          "serve: streamed chat gives the same text (%s): %s", chat_text, ev ? ev : "");
    free(ev); free(r);
    /* n = 3 with a seed: three choices, the same three again */
    const char *nbody = "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"n\":3,\"seed\":7,"
                        "\"temperature\":1}";
    char *r1 = http_post(port, "/v1/completions", nbody, NULL),
         *r2 = http_post(port, "/v1/completions", nbody, NULL);
    CHECK(http_status(r1) == 200 && r1 && r2 && strstr(r1, "\"index\":2,") && !strstr(r1, "\"index\":3,") &&
          !strcmp(strstr(r1, "\"choices\""), strstr(r2, "\"choices\"")) &&
          strstr(r1, "\"completion_tokens\":24"),
          "serve: n=3 with a seed: %s", r1 ? r1 : "");
    free(r1); free(r2);
    /* several prompts: a choice each, in order; token-id prompts; echo */
    r = http_post(port, "/v1/completions", "{\"prompt\":[\"Once upon a time\",[1,403,407,261,378]],"
                  "\"max_tokens\":3,\"temperature\":0,\"echo\":true}", NULL);
    b = http_body(r);
    CHECK(http_status(r) == 200 && strstr(b, "{\"index\":0,\"text\":\"Once upon a time, there was\"") &&
          strstr(b, "{\"index\":1,\"text\":\"Once upon a time, there was\""),
          "serve: two prompts with echo: %s", r ? r : "");
    free(r);
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,"
                  "\"temperature\":0,\"echo\":true,\"stream\":true}", NULL);
    ev = dechunk(http_body(r));
    sse_collect(ev, 0, 0, buf, sizeof buf, &n_events, finish, &done);
    CHECK(!strcmp(buf, "Once upon a time, there was") && done, "serve: streamed echo: %s", ev ? ev : "");
    free(ev); free(r);
    /* logprobs: the chosen token's and the top 2, as OpenAI's four lists */
    r = http_post(port, "/v1/completions",
                  "{\"prompt\":\"Once upon a time\",\"max_tokens\":2,\"temperature\":0,"
                  "\"logprobs\":2}", NULL);
    b = http_body(r);
    const char *lp = strstr(b, "\"logprobs\":{\"tokens\":[\",\",\" there\"],\"token_logprobs\":[");
    CHECK(http_status(r) == 200 && lp && strstr(lp, "\"top_logprobs\":[{\",\":") &&
          strstr(lp, "\"text_offset\":[0,1]}"), "serve: logprobs: %s", b);
    free(r);
    r = http_post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                  "\"max_tokens\":2,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":3}", NULL);
    CHECK(http_status(r) == 200 && strstr(r, "\"logprobs\":{\"content\":[{\"token\":") &&
          strstr(r, "\"bytes\":[") && strstr(r, "\"top_logprobs\":[{\"token\":"),
          "serve: chat logprobs: %s", r);
    free(r);
    /* a stop string: the text ends before it, finish "stop" */
    r = http_post(port, "/v1/completions",
                  "{\"prompt\":\"Once upon a time\",\"max_tokens\":20,\"temperature\":0,"
                  "\"stop\":[\" little\"]}", NULL);
    json_str(http_body(r), "text", buf, sizeof buf);
    CHECK(http_status(r) == 200 && !strcmp(buf, ", there was a") && strstr(r, "\"finish_reason\":\"stop\""),
          "serve: stop string: %s", r ? r : "");
    free(r);
    /* a stop token id (432 is ",", the first greedy token) ends it at once; min_tokens keeps it going */
    r = http_post(port, "/v1/completions",
                  "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0,"
                  "\"stop_token_ids\":[432]}", NULL);
    CHECK(http_status(r) == 200 && strstr(r, "\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"stop\"") &&
          strstr(r, "\"completion_tokens\":1,"), "serve: a stop token id: %s", r ? r : "");
    free(r);
    r = http_post(port, "/v1/completions",
                  "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0,"
                  "\"stop_token_ids\":[432],\"min_tokens\":4}", NULL);
    CHECK(http_status(r) == 200 && strstr(r, "\"completion_tokens\":") &&
          atoi(strstr(r, "\"completion_tokens\":") + 20) >= 4, "serve: min_tokens: %s", r ? r : "");
    free(r);
    /* the small endpoints */
    r = http_get(port, "/v1/models", NULL);
    CHECK(http_status(r) == 200 &&
          strstr(http_body(r), "{\"object\":\"list\",\"data\":[{\"id\":\"stories260K\","
                               "\"object\":\"model\",\"created\":") &&
          strstr(r, "\"max_model_len\":2048"), "serve: /v1/models: %s", r);
    free(r);
    r = http_get(port, "/health", NULL);
    CHECK(http_status(r) == 200 && strstr(r, "Content-Length: 0\r\n"), "serve: /health: %s", r ? r : "");
    free(r);
    r = http_get(port, "/version", NULL);
    CHECK(http_status(r) == 200 && strstr(http_body(r), "{\"version\":\""), "serve: /version: %s",
          r ? r : "");
    free(r);
    r = http_post(port, "/tokenize", "{\"prompt\":\"Once upon a time\"}", NULL);
    CHECK(http_status(r) == 200 && !strcmp(http_body(r), "{\"count\":5,\"max_model_len\":2048,\"tokens\":"
          "[1,403,407,261,378],\"token_strs\":null}"), "serve: /tokenize: %s", r ? r : "");
    free(r);
    r = http_post(port, "/detokenize", "{\"tokens\":[403,407,261,378]}", NULL);
    CHECK(http_status(r) == 200 && !strcmp(http_body(r), "{\"prompt\":\"Once upon a time\"}"),
          "serve: /detokenize: %s", r ? r : "");
    free(r);
    r = http_get(port, "/metrics", NULL);
    CHECK(http_status(r) == 200 &&
          strstr(r, "\nvllm:num_requests_running{model_name=\"stories260K\",engine=\"0\"} 0\n") &&
          strstr(r, "# TYPE vllm:time_to_first_token_seconds histogram\n") &&
          strstr(r, "vllm:request_success_total{model_name=\"stories260K\",engine=\"0\",finished_reason="
                    "\"length\"} ") &&
          strstr(r, "vllm:e2e_request_latency_seconds_count{model_name=\"stories260K\",engine=\"0\"} ") &&
          strstr(r, "\nvllm:prefix_cache_hits_total{") && strstr(r, "\nvllm:generation_tokens_total{"),
          "serve: /metrics: %s", r ? r : "");
    free(r);
    CHECK(server_stop(&s) == 0, "serve: SIGTERM: exit status 0");
    free(cases);
}

/* vLLM's request fields beyond OpenAI's: include_stop_str_in_output, return_tokens_as_token_ids,
 * truncate_prompt_tokens, cache_salt, add_special_tokens */
static void test_server_vllm_fields(void) {
    test_server s;
    if (server_start(&s, "") != 0) return;
    int port = s.port;
    char *r, buf[4096], finish[16];
    int n_events, done;
    /* include_stop_str_in_output: the text ends with the stop string, whole token or not, streamed or not */
    static const struct { const char *stop, *text; } stops[] = {
        {" little", ", there was a little"}, {" lit", ", there was a lit"}, {"was a", ", there was a"}};
    for (int i = 0; i < 3; i++) {
        for (int stream = 0; stream < 2; stream++) {
            char body[512];
            snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":20,"
                     "\"temperature\":0,\"stop\":[\"%s\"],\"include_stop_str_in_output\":true%s}",
                     stops[i].stop, stream ? ",\"stream\":true" : "");
            r = http_post(port, "/v1/completions", body, NULL);
            char *ev = stream ? dechunk(http_body(r)) : NULL;
            if (stream) sse_collect(ev ? ev : "", 0, 0, buf, sizeof buf, &n_events, finish, &done);
            else {
                json_str(http_body(r), "text", buf, sizeof buf);
                json_str(http_body(r), "finish_reason", finish, sizeof finish);
            }
            CHECK(http_status(r) == 200 && !strcmp(buf, stops[i].text) && !strcmp(finish, "stop"),
                  "serve: include_stop_str_in_output, stop \"%s\"%s: \"%s\" (%s)", stops[i].stop,
                  stream ? ", streamed" : "", buf, r ? r : "");
            free(ev); free(r);
        }
    }
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":20,"
                  "\"temperature\":0,\"stop\":[\" lit\"],\"include_stop_str_in_output\":false}", NULL);
    json_str(http_body(r), "text", buf, sizeof buf);
    CHECK(!strcmp(buf, ", there was a"), "serve: include_stop_str_in_output false: %s", r ? r : "");
    free(r);

    /* return_tokens_as_token_ids: "token_id:N" for each token and top token (432 is ","), and in chat the
     * bytes of that string; the same ids as the tokens' texts name without it */
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":2,"
                  "\"temperature\":0,\"logprobs\":1,\"return_tokens_as_token_ids\":true}", NULL);
    char *plain = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":2,"
                            "\"temperature\":0,\"logprobs\":1}", NULL);
    const char *lp = r ? strstr(r, "\"logprobs\":{\"tokens\":[\"token_id:432\",\"token_id:") : NULL;
    int second = lp ? atoi(lp + strlen("\"logprobs\":{\"tokens\":[\"token_id:432\",\"token_id:")) : -1;
    snprintf(buf, sizeof buf, "{\"tokens\":[432,%d]}", second);
    char *detok = http_post(port, "/detokenize", buf, NULL);
    const char *lp_plain = plain ? strstr(plain, "\"token_logprobs\":[") : NULL;
    CHECK(http_status(r) == 200 && lp && strstr(lp, "\"top_logprobs\":[{\"token_id:432\":") &&
          lp_plain && strstr(lp, "\"token_logprobs\":[") && !strncmp(strstr(lp, "\"token_logprobs\":["),
          lp_plain, 40) && strstr(plain, "\"tokens\":[\",\",\" there\"]") &&
          !strcmp(http_body(detok), "{\"prompt\":\", there\"}"),
          "serve: return_tokens_as_token_ids (completions): %s (%s)", r ? r : "", detok ? detok : "");
    free(r); free(plain); free(detok);
    r = http_post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                  "\"max_tokens\":1,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":1,"
                  "\"return_tokens_as_token_ids\":true}", NULL);
    const char *t = r ? strstr(r, "\"content\":[{\"token\":\"token_id:") : NULL;
    int id = t ? atoi(t + strlen("\"content\":[{\"token\":\"token_id:")) : -1;
    char want[256], name[32];
    snprintf(name, sizeof name, "token_id:%d", id);
    int at = snprintf(want, sizeof want, "\"bytes\":[");
    for (int i = 0; name[i]; i++) at += snprintf(want + at, sizeof want - at, i ? ",%d" : "%d", name[i]);
    snprintf(want + at, sizeof want - at, "],\"top_logprobs\":[{\"token\":\"%s\",", name);
    CHECK(http_status(r) == 200 && id >= 0 && strstr(t, want), "serve: return_tokens_as_token_ids (chat): %s",
          r ? r : "");
    free(r);

    /* truncate_prompt_tokens: the last K of the prompt's ids (BOS 1 and "Once upon a time" 403 407 261 378),
     * as if given alone; echo shows them; K over the context or 0 is refused */
    char *cut = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,"
                          "\"temperature\":0,\"echo\":true,\"truncate_prompt_tokens\":2}", NULL);
    char *ids = http_post(port, "/v1/completions", "{\"prompt\":[261,378],\"max_tokens\":4,\"temperature\":0,"
                          "\"echo\":true}", NULL);
    char cut_text[256], ids_text[256];
    json_str(http_body(cut), "text", cut_text, sizeof cut_text);
    json_str(http_body(ids), "text", ids_text, sizeof ids_text);
    CHECK(http_status(cut) == 200 && !strcmp(cut_text, ids_text) && !strncmp(cut_text, "a time", 6) &&
          strstr(cut, "\"prompt_tokens\":2,"), "serve: truncate_prompt_tokens 2: %s (ids: %s)",
          cut ? cut : "", ids ? ids : "");
    free(cut); free(ids);
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,"
                  "\"temperature\":0,\"truncate_prompt_tokens\":-1}", NULL);
    CHECK(http_status(r) == 200 && strstr(r, "\"text\":\", there was\"") && strstr(r, "\"prompt_tokens\":5,"),
          "serve: truncate_prompt_tokens -1 (the context's length): %s", r ? r : "");
    free(r);
    r = http_post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi "
                  "there\"}],\"max_tokens\":1,\"truncate_prompt_tokens\":3}", NULL);
    CHECK(http_status(r) == 200 && strstr(r, "\"prompt_tokens\":3,"), "serve: chat truncate_prompt_tokens: "
          "%s", r ? r : "");
    free(r);
    static const char *bad_cut[] = {"0", "4096", "1.5", "\"2\""};
    for (int i = 0; i < 4; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":\"Once\",\"truncate_prompt_tokens\":%s}", bad_cut[i]);
        r = http_post(port, "/v1/completions", body, NULL);
        CHECK(http_status(r) == 400 && strstr(r, "\"param\":\"truncate_prompt_tokens\""),
              "serve: truncate_prompt_tokens %s refused: %s", bad_cut[i], r ? r : "");
        free(r);
    }

    /* cache_salt: a prompt's cached blocks serve again only a request of the same salt (none is a
     * salt too) */
    const char *salts[] = {"", ",\"cache_salt\":\"tenant-a\"", ",\"cache_salt\":\"tenant-a\"",
                           ",\"cache_salt\":\"tenant-b\"", ""};
    int cached[5];
    for (int i = 0; i < 5; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\":\"The cat sat on the mat and the dog sat on the log and the "
                 "bird sat on the tree and the fish swam in the sea, and then\",\"max_tokens\":1%s}",
                 salts[i]);
        r = http_post(port, "/v1/completions", body, NULL);
        const char *c = r ? strstr(r, "\"cached_tokens\":") : NULL;
        cached[i] = http_status(r) == 200 && c ? atoi(c + strlen("\"cached_tokens\":")) : -1;
        free(r);
    }
    CHECK(cached[0] == 0 && cached[1] == 0 && cached[2] > 0 && cached[3] == 0 && cached[4] == cached[2],
          "serve: cache_salt: cached tokens %d (none), %d %d (a), %d (b), %d (none)", cached[0], cached[1],
          cached[2], cached[3], cached[4]);
    static const char *bad_salt[] = {"\"\"", "5", "\"a\\u0000b\""};
    for (int i = 0; i < 3; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":\"Once\",\"cache_salt\":%s}", bad_salt[i]);
        r = http_post(port, "/v1/completions", body, NULL);
        CHECK(http_status(r) == 400 && strstr(r, "\"param\":\"cache_salt\""), "serve: cache_salt %s refused: "
              "%s", bad_salt[i], r ? r : "");
        free(r);
    }

    /* add_special_tokens false: a completion's prompt without BOS, as its ids without 1 */
    char *nobos = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,"
                            "\"temperature\":0,\"add_special_tokens\":false}", NULL);
    ids = http_post(port, "/v1/completions", "{\"prompt\":[403,407,261,378],\"max_tokens\":4,"
                    "\"temperature\":0}", NULL);
    json_str(http_body(nobos), "text", cut_text, sizeof cut_text);
    json_str(http_body(ids), "text", ids_text, sizeof ids_text);
    CHECK(http_status(nobos) == 200 && !strcmp(cut_text, ids_text) && strstr(nobos, "\"prompt_tokens\":4,"),
          "serve: add_special_tokens false: %s (ids: %s)", nobos ? nobos : "", ids ? ids : "");
    free(nobos); free(ids);
    /* stream_options.continuous_usage_stats (with include_usage): every chunk says the usage so far (chat's
     * first, the role's: 0 tokens), then the usage chunk; without include_usage none */
    for (int chat = 0; chat < 2; chat++) {
        r = http_post(port, chat ? "/v1/chat/completions" : "/v1/completions", chat ?
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,"
                      "\"stream\":true,\"temperature\":0,\"stream_options\":{\"include_usage\":true,"
                      "\"continuous_usage_stats\":true}}" : "{\"prompt\":\"Once upon a time\","
                      "\"max_tokens\":3,\"temperature\":0,\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true}}", NULL);
        char *ev = dechunk(http_body(r));
        int chunks = 0, in_order = 1, n_prompt = -1;
        for (const char *c = ev ? strstr(ev, "data: {") : NULL; c; c = strstr(c + 1, "data: {")) {
            const char *u = strstr(c, "\"usage\":{\"prompt_tokens\":"), *end = strstr(c, "\n\n");
            if (!u || !end || u > end) { in_order = 0; break; }
            const char *cp = strstr(u, "\"completion_tokens\":"), *tp = strstr(u, "\"total_tokens\":");
            int pt = atoi(u + strlen("\"usage\":{\"prompt_tokens\":")), ct = cp ? atoi(cp + 20) : -1,
                tt = tp ? atoi(tp + 15) : -1;
            const char *empty = strstr(c, "\"choices\":[],");
            int want = empty && empty < end ? 3 : chat ? chunks : chunks + 1;
            if (n_prompt < 0) n_prompt = pt;
            in_order &= pt == n_prompt && ct == want && tt == pt + ct;
            chunks++;
        }
        CHECK(http_status(r) == 200 && in_order && chunks == (chat ? 5 : 4) && n_prompt > 0,
              "serve: %s continuous_usage_stats: %d chunks, in order %d: %s", chat ? "chat" : "completions",
              chunks, in_order, ev ? ev : "");
        free(ev); free(r);
    }
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":2,\"stream\":true,"
                  "\"stream_options\":{\"continuous_usage_stats\":true}}", NULL);
    CHECK(http_status(r) == 200 && !strstr(r, "\"usage\""),
          "serve: continuous_usage_stats without include_usage: %s", r ? r : "");
    free(r);
    /* a chat's echo: the reply's content begins with the last message's text where that message has the
     * reply's role (continuing the assistant's message; without add_generation_prompt, any), streamed too */
    static const struct { const char *msgs; int gen; const char *echo, *extra; } echoes[] = {
        {"{\"role\":\"user\",\"content\":\"Tell a story\"},{\"role\":\"assistant\",\"content\":\"Once upon "
         "a\"}", 0, "Once upon a", ""},
        {"{\"role\":\"user\",\"content\":\"Tell a story\"}", 1, "", ""},
        {"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Lily\"},{\"type\":\"text\","
         "\"text\":\"had\"}]}", 0, "Lily\nhad", ""},
        {"{\"role\":\"user\",\"content\":\"Tell a story\"},{\"role\":\"assistant\",\"content\":\"Once upon "
         "a\"}", 0, /* read for calls */
         "Once upon a", ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"},
    };
    for (int i = 0; i < 4; i++) {
        char replies[3][1024], body[512];
        for (int k = 0; k < 3; k++) { /* without echo, with it, with it streamed */
            snprintf(body, sizeof body, "{\"messages\":[%s],\"max_tokens\":4,\"temperature\":0%s%s%s%s}",
                     echoes[i].msgs, echoes[i].gen ? "" : ",\"add_generation_prompt\":false",
                     k ? ",\"echo\":true" : "", k == 2 ? ",\"stream\":true" : "", echoes[i].extra);
            r = http_post(port, "/v1/chat/completions", body, NULL);
            if (k < 2) json_str(http_body(r), "content", replies[k], sizeof replies[k]);
            else {
                char *ev = dechunk(http_body(r));
                sse_collect(ev ? ev : "", 0, 1, replies[k], sizeof replies[k], &n_events, finish, &done);
                free(ev);
            }
            CHECK(http_status(r) == 200, "serve: chat echo %d/%d: %s", i, k, r ? r : "");
            free(r);
        }
        char want[1100];
        snprintf(want, sizeof want, "%s%s", echoes[i].echo, replies[0]);
        CHECK(!strcmp(replies[1], want) && !strcmp(replies[2], want) && strlen(replies[0]) > 0,
              "serve: chat echo %d: \"%s\" and streamed \"%s\", want \"%s\"", i, replies[1], replies[2],
              want);
    }
    /* priority: under first come first served only 0 */
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":1,\"priority\":0}", NULL);
    char *r2 = http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":1,\"priority\":2}",
                         NULL);
    CHECK(http_status(r) == 200 && http_status(r2) == 400 && strstr(r2, "\"param\":\"priority\"") &&
          strstr(r2, "--scheduling-policy priority"), "serve: priority under fcfs: %s", r2 ? r2 : "");
    free(r); free(r2);
    CHECK(server_stop(&s) == 0, "serve: SIGTERM: exit status 0");

    /* a chat's add_special_tokens true: BOS before the template's own (llama2's writes <s>), as vLLM's
     * tokenizer adds it; false (the default) keeps the template's one */
    if (server_start(&s, "--chat-template llama2 --scheduling-policy priority") != 0) return;
    static const struct { const char *value; int status; } prios[] = {{"-3", 200}, {"7", 200}, {"1.5", 400},
                                                                      {"\"high\"", 400}};
    for (int i = 0; i < 4; i++) { /* under the priority policy: any integer */
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":\"Once\",\"max_tokens\":1,\"priority\":%s}", prios[i].value);
        r = http_post(s.port, "/v1/completions", body, NULL);
        CHECK(http_status(r) == prios[i].status &&
              (prios[i].status == 200 || strstr(r, "\"param\":\"priority\"")),
              "serve: priority %s under the priority policy: %s", prios[i].value, r ? r : "");
        free(r);
    }
    int n_prompt[3];
    for (int i = 0; i < 3; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":1,"
                 "\"prompt_logprobs\":0%s}", i == 1 ? ",\"add_special_tokens\":true" :
                 i == 2 ? ",\"add_special_tokens\":false" : "");
        r = http_post(s.port, "/v1/chat/completions", body, NULL);
        const char *c = r ? strstr(r, "\"prompt_tokens\":") : NULL;
        n_prompt[i] = http_status(r) == 200 && c ? atoi(c + strlen("\"prompt_tokens\":")) : -1;
        if (i == 1) CHECK(r && strstr(r, "\"prompt_logprobs\":[null,{\"1\":{"),
                          "serve: chat add_special_tokens true: BOS twice: %s", r ? r : "");
        free(r);
    }
    CHECK(n_prompt[0] > 1 && n_prompt[1] == n_prompt[0] + 1 && n_prompt[2] == n_prompt[0],
          "serve: chat add_special_tokens: %d tokens, %d with it, %d without", n_prompt[0], n_prompt[1],
          n_prompt[2]);
    CHECK(server_stop(&s) == 0, "serve: SIGTERM: exit status 0");
}

/* echo with logprobs and prompt_logprobs: the values are the engine's own (run here on the same model and
 * backend), written as the server writes floats (%.9g) */
static void test_server_prompt_logprobs(void) {
    llm_engine *e = stories_engine();
    if (!e) return;
    static const int32_t ids[] = {1, 403, 407, 261, 378}; /* "Once upon a time", BOS first */
    plp_result *x = (plp_result *)calloc(1, sizeof *x);
    llm_sampling_params p = greedy(2);
    p.logprobs = 2; p.prompt_logprobs = 2;
    plp_run(e, ids, 5, &p, x);
    llm_engine_destroy(e);
    char want[2048], *w = want, *end = want + sizeof want;
    w += snprintf(w, (size_t)(end - w), "\"token_logprobs\":[null");
    for (int t = 0; t < 4; t++) w += snprintf(w, (size_t)(end - w), ",%.9g", x->plp[t]);
    char scored[2100];
    snprintf(scored, sizeof scored, "%s]", want);          /* the prompt alone */
    for (int t = 0; t < 2; t++) w += snprintf(w, (size_t)(end - w), ",%.9g", x->gen_lp[t]);
    snprintf(w, (size_t)(end - w), "]");
    char top[256], plp[512];
    snprintf(top, sizeof top, "\"top_logprobs\":[null,{\" Once\":%.9g,", x->top[0][0]);
    snprintf(plp, sizeof plp, "\"prompt_logprobs\":[null,{\"403\":{\"logprob\":%.9g,\"rank\":%d,"
             "\"decoded_token\":\" Once\"}},{\"407\":{\"logprob\":%.9g,\"rank\":%d,"
             "\"decoded_token\":\" upon\"}},",
             x->plp[0], x->ranks[0], x->plp[1], x->ranks[1]);
    CHECK(x->n_gen == 2 && x->n_plp == 4 && x->top_ids[0][0] == 403 && x->ranks[0] == 1 && x->ranks[1] == 1,
          "serve: the engine's prompt logprobs of \"Once upon a time\"");
    test_server s;
    if (server_start(&s, "") != 0) { free(x); return; }
    /* echo + logprobs: the prompt's tokens first, the first with nulls; offsets into the echoed text */
    char *r = http_post(s.port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":2,"
                        "\"temperature\":0,\"echo\":true,\"logprobs\":2}", NULL);
    const char *b = http_body(r);
    CHECK(http_status(r) == 200 &&
          strstr(b, "\"text\":\"Once upon a time, there\",\"logprobs\":{\"tokens\":"
                    "[\"<s>\",\" Once\",\" upon\",\" a\",\" time\",\",\",\" there\"],") &&
          strstr(b, want) && strstr(b, top) && strstr(b, "\"text_offset\":[0,0,4,9,11,16,17]}") &&
          !strstr(b, "prompt_logprobs"), "serve: echo with logprobs: %s (want %s)", b, want);
    free(r);
    /* max_tokens 0 with echo: the prompt scored, nothing generated */
    r = http_post(s.port, "/v1/completions", "{\"prompt\":[1,403,407,261,378],\"max_tokens\":0,"
                  "\"echo\":true,\"logprobs\":2}", NULL);
    b = http_body(r);
    CHECK(http_status(r) == 200 && strstr(b, "\"text\":\"Once upon a time\",\"logprobs\":{") &&
          strstr(b, scored) &&
          strstr(b, "\"text_offset\":[0,0,4,9,11]}") && strstr(b, "\"finish_reason\":\"length\"") &&
          strstr(b, "\"completion_tokens\":0,"), "serve: scoring (max_tokens 0): %s", b);
    free(r);
    /* streaming: the prompt's logprobs in the first chunk */
    r = http_post(s.port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":2,"
                  "\"temperature\":0,\"echo\":true,\"logprobs\":2,\"stream\":true}", NULL);
    char *ev = dechunk(http_body(r));
    const char *first = ev ? strstr(ev, "data: ") : NULL;
    const char *second = first ? strstr(first + 1, "data: ") : NULL;
    const char *at = first ? strstr(first, "\"token_logprobs\":[null,") : NULL;
    CHECK(at && second && at < second && !strncmp(at, want, strlen(scored) - 1),
          "serve: streamed echo with logprobs: %s", ev ? ev : "");
    free(ev); free(r);
    /* vLLM's prompt_logprobs, on the choice, on both endpoints */
    r = http_post(s.port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":1,"
                  "\"prompt_logprobs\":0}", NULL);
    b = http_body(r);
    CHECK(http_status(r) == 200 && strstr(b, plp) && strstr(b, "\"logprobs\":null,") &&
          strstr(b, "\"finish_reason\":\"length\",\"prompt_logprobs\":[null,{\"403\":"),
          "serve: prompt_logprobs: %s (want %s)", b, plp);
    free(r);
    r = http_post(s.port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":1,"
                  "\"prompt_logprobs\":2}", NULL);
    snprintf(plp, sizeof plp, "{\"403\":{\"logprob\":%.9g,\"rank\":1,\"decoded_token\":\" Once\"},\"%d\":"
             "{\"logprob\":%.9g,\"rank\":2,", x->plp[0], x->top_ids[0][1], x->top[0][1]);
    CHECK(http_status(r) == 200 && strstr(http_body(r), plp), "serve: prompt_logprobs 2: %s (want %s)", r,
          plp);
    free(r);
    r = http_post(s.port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                  "\"max_tokens\":1,\"prompt_logprobs\":1,\"stream\":true}", NULL);
    CHECK(http_status(r) == 200 && strstr(r, "\"prompt_logprobs\":[null,{\"") && strstr(r, "\"rank\":"),
          "serve: chat prompt_logprobs, streamed: %s", r);
    free(r);
    CHECK(server_stop(&s) == 0, "serve: prompt logprobs: the server exits cleanly");
    free(x);
}

/* Tools and thinking through the server, on a random-weight model with Qwen3's template (Hermes tools, a
 * model that thinks): the thinking split from the answer (a grammar makes the model write
 * <think>...</think>), whole and streamed; the prompt /tokenize gives with thinking off is the chat REPL's;
 * a continued last message; a required call; and each bad shape of tools and messages a 400 naming
 * its field. */
/* A copy of stories260K carrying the chat template of template_file, at path (room for 64) */
static int stories_with_template(const char *template_file, char *path) {
    size_t n;
    char *tmpl = read_file(template_file, &n), *value = tmpl ? (char *)malloc(8 + n) : NULL;
    int rc = -1;
    if (value) { /* a GGUF string: its length, then its bytes */
        uint64_t len = n;
        memcpy(value, &len, 8); memcpy(value + 8, tmpl, n);
        test_kv kv = {"tokenizer.chat_template", LLM_GGUF_STRING, value, 8 + n};
        rc = gguf_with_keys("stories260K.gguf", &kv, 1, path);
    }
    free(value); free(tmpl);
    return rc;
}

/* Mistral's tools through llm serve, on stories260K wearing Mistral Nemo's template: a call under the
 * grammar gets an id of 9 letters and digits, and ids of other lengths sent back in the history (as any
 * client may) are made 9 long, the same for a call and its result, so the template takes them. */
static void test_server_mistral_tools(void) {
    char path[64], extra[128];
    if (stories_with_template("testdata/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja", path) != 0) {
        CHECK(0, "a copy of stories260K with Mistral Nemo's template");
        return;
    }
    snprintf(extra, sizeof extra, "-m %s", path);
    test_server srv;
    if (server_start(&srv, extra) != 0) { remove(path); return; }
    static const char tools[] = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"enum\":[\"Paris\",\"Rome\"]}},"
        "\"required\":[\"city\"],\"additionalProperties\":false}}}]";
    char body[2048];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],%s,"
             "\"tool_choice\":\"required\",\"parallel_tool_calls\":false,\"max_tokens\":200,\"seed\":1}",
             tools);
    char *r = http_post(srv.port, "/v1/chat/completions", body, NULL);
    const char *id = r ? strstr(r, "\"tool_calls\":[{\"id\":\"") : NULL;
    int id_len = 0;
    while (id && isalnum((unsigned char)id[21 + id_len])) id_len++;
    CHECK(http_status(r) == 200 && id && id_len == 9 && id[21 + 9] == '"' &&
          strstr(r, "\"name\":\"get_weather\"") && strstr(r, "\"finish_reason\":\"tool_calls\"") &&
          !strstr(r, "TOOL_CALLS"), "Mistral: a required call, its id 9 letters and digits: %s", r);
    free(r);
    /* a whole loop whose ids are OpenAI's length: made 9 long, so the template takes the conversation */
    static const char loop[] = "{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
        "\"content\":null,\"tool_calls\":[{\"id\":\"call_0123456789abcdefABCDEF\",\"type\":\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Rome\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_0123456789abcdefABCDEF\",\"content\":\"24\"}";
    snprintf(body, sizeof body, "{\"messages\":[%s],%s,\"max_tokens\":4}", loop, tools);
    r = http_post(srv.port, "/v1/chat/completions", body, NULL);
    CHECK(http_status(r) == 200, "Mistral: a call and its result with ids of 29 characters: %s", r);
    free(r);
    /* the prompt it was given (/tokenize reads messages as the chat endpoint does, /detokenize writes them
     * back): the call and its result under one id of 9 letters and digits, the 29-character one gone */
    snprintf(body, sizeof body, "{\"messages\":[%s],%s}", loop, tools);
    r = http_post(srv.port, "/tokenize", body, NULL);
    const char *tokens = r ? strstr(http_body(r), "\"tokens\":[") : NULL;
    const char *tokens_end = tokens ? strchr(tokens, ']') : NULL;
    char *prompt = NULL;
    if (tokens && tokens_end) {
        snprintf(body, sizeof body, "{%.*s}", (int)(tokens_end + 1 - tokens), tokens);
        prompt = http_post(srv.port, "/detokenize", body, NULL);
    }
    static const char call_at[] = "\\\"arguments\\\": {\\\"city\\\": \\\"Rome\\\"}, \\\"id\\\": \\\"";
    const char *call = prompt ? strstr(prompt, call_at) : NULL;
    const char *result = prompt ? strstr(prompt, "\\\"call_id\\\": \\\"") : NULL;
    int call_len = 0, result_len = 0;
    if (call) call += strlen(call_at);
    if (result) result += strlen("\\\"call_id\\\": \\\"");
    while (call && isalnum((unsigned char)call[call_len])) call_len++;
    while (result && isalnum((unsigned char)result[result_len])) result_len++;
    CHECK(http_status(prompt) == 200 && call_len == 9 && result_len == 9 && !memcmp(call, result, 9) &&
          !strstr(prompt, "call_0123456789abcdefABCDEF"),
          "Mistral: the call and its result under one 9-character id: %s", prompt ? http_body(prompt) : r);
    free(prompt); free(r);
    /* questions and answers out of turn: Mistral's templates refuse them, and so does the server */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
             "\"content\":\"b\"}],\"max_tokens\":4}");
    r = http_post(srv.port, "/v1/chat/completions", body, NULL);
    CHECK(http_status(r) == 400 && strstr(http_body(r), "\"param\":\"messages\""),
          "Mistral: two questions in a row are a 400 naming messages: %s", r);
    free(r);
    /* the tools written again before each question that repeats the last: a 1 MB tool and 70 questions
     * render to 70 MB, past the server's bound (8 bodies, 64 MB), which the render checks as it writes */
    const int mb = 1 << 20, questions = 70;
    char *big = (char *)malloc((size_t)mb + 64 * (size_t)questions + 256);
    if (big) {
        int k = sprintf(big, "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                        "\"description\":\"");
        memset(big + k, 'a', (size_t)mb);
        k += mb;
        k += sprintf(big + k, "\"}}],\"max_tokens\":1,\"messages\":[");
        for (int q = 0; q < questions; q++)
            k += sprintf(big + k, "%s{\"role\":\"user\",\"content\":\"x\"}%s", q ? "," : "",
                         q + 1 < questions ? ",{\"role\":\"assistant\",\"content\":\"y\"}" : "");
        sprintf(big + k, "]}");
        r = http_post(srv.port, "/v1/chat/completions", big, NULL);
        CHECK(http_status(r) == 400 && strstr(http_body(r), "{\"error\":{\"message\":\"This model's maximum "
              "context length is 2048 tokens. However, the messages written with the chat template are over "
              "67108864 bytes. Please reduce the length of the messages or tools.\",\"type\":"
              "\"invalid_request_error\",\"param\":\"messages\",\"code\":400}"),
              "Mistral: tools written 70 times, 70 MB, are a 400 naming messages: %.300s", r);
        free(r); free(big);
    }
    CHECK(server_stop(&srv) == 0, "serve (Mistral's template): exit status 0");
    remove(path);
}

static void test_server_tools(void) {
    char extra[1024], err[LLM_ERR_LEN];
    snprintf(extra, sizeof extra, "-m %s", model_path("random-qwen3-qknorm.gguf"));
    test_server srv;
    if (server_start(&srv, extra) != 0) return;
    int port = srv.port;
    const char *think = "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"grammar\":\"root ::= "
                        "\\\"<think>\\\\nabc\\\\n</think>\\\\n\\\\nxyz\\\"\"";
    char body[2048];
    snprintf(body, sizeof body, "{%s}", think);
    char *r = http_post(port, "/v1/chat/completions", body, NULL);
    CHECK(http_status(r) == 200 &&
          strstr(http_body(r), "\"message\":{\"role\":\"assistant\",\"content\":\"xyz\","
                 "\"reasoning_content\":\"abc\",\"reasoning\":\"abc\",\"refusal\":null},\"logprobs\":null,"
          "\"finish_reason\":\"stop\""), "thinking apart from the answer: %s", r);
    free(r);
    snprintf(body, sizeof body, "{%s,\"include_reasoning\":false}", think);
    r = http_post(port, "/v1/chat/completions", body, NULL);
    CHECK(http_status(r) == 200 &&
          strstr(http_body(r), "\"message\":{\"role\":\"assistant\",\"content\":\"xyz\",\"refusal\":null}"),
          "include_reasoning false: %s", r);
    free(r);
    snprintf(body, sizeof body, "{%s,\"stream\":true}", think);
    r = http_post(port, "/v1/chat/completions", body, NULL);
    /* the deltas: each part's pieces, in order, and no tag in any of them */
    char reasoning[256] = "", content[256] = "";
    for (const char *p = r ? strstr(r, "data: {") : NULL; p; p = strstr(p + 1, "data: {")) {
        const char *delta = strstr(p, "\"delta\":{"), *eol = strstr(p, "\n");
        char piece[256];
        if (!delta || (eol && delta > eol)) continue;
        if (!strncmp(delta + 9, "\"reasoning_content\":", 20))
            strncat(reasoning, json_str(delta, "reasoning_content", piece, sizeof piece),
                    sizeof reasoning - strlen(reasoning) - 1);
        if (!strncmp(delta + 9, "\"content\":", 10))
            strncat(content, json_str(delta, "content", piece, sizeof piece),
                    sizeof content - strlen(content) - 1);
    }
    CHECK(!strcmp(reasoning, "abc") && !strcmp(content, "xyz") && r && !strstr(r, "think>") &&
          strstr(r, "\"finish_reason\":\"stop\""), "thinking streamed apart: \"%s\", \"%s\": %s", reasoning,
          content, r);
    free(r);
    /* thinking_token_budget on Qwen3's template, whose reply opens its own <think>: this random model's never
     * does, so the budget cuts nothing (it forced "</think>" into the answer) */
    char *plain = http_post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":"
                            "\"Hi\"}],\"max_tokens\":12,\"temperature\":0}", NULL);
    r = http_post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                  "\"max_tokens\":12,\"temperature\":0,\"thinking_token_budget\":4}", NULL);
    const char *pc = plain ? strstr(http_body(plain), "\"choices\":") : NULL;
    const char *bc = r ? strstr(http_body(r), "\"choices\":") : NULL;
    CHECK(http_status(plain) == 200 && http_status(r) == 200 && pc && bc && !strcmp(pc, bc) &&
          !strstr(pc, "think>"),
          "thinking_token_budget: a reply that opens no <think> is left as it is:\n%s\n%s", pc ? pc : "",
          bc ? bc : "");
    free(plain); free(r);
    /* /tokenize with thinking off: the prompt the chat REPL writes (llm chat, without --think) */
    llm_model m;
    if (llm_model_load(&m, model_path("random-qwen3-qknorm.gguf"), err) == 0) {
        llm_chat_template ct;
        llm_chat_template_init_gguf(&ct, &m.gguf, m.tok, NULL, err);
        ct.enable_thinking = 0;
        const llm_chat_message msgs[] = {{"user", "Hi"}, {"assistant", "Hello the"}};
        char text[512];
        int32_t ids[256];
        static const struct { int n, gen; const char *fields, *cut; } prompts[] = {
            {1, 1, "\"chat_template_kwargs\":{\"enable_thinking\":false}", NULL},
            {1, 1, "\"reasoning_effort\":\"none\"", NULL},
            /* continued: as far as the last message's text, no end of its turn */
            {2, 0, "\"add_generation_prompt\":false,\"continue_final_message\":true", "Hello the"},
        };
        for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++) {
            int len = llm_chat_render(&ct, msgs, prompts[i].n, NULL, prompts[i].gen, text, sizeof text);
            if (prompts[i].cut)
                len = (int)(strstr(text, prompts[i].cut) - text) + (int)strlen(prompts[i].cut);
            int n = llm_tokenize_prompt(m.tok, text, (size_t)len, ids, 256);
            char want[2048] = "";
            for (int k = 0; k < n; k++)
                snprintf(want + strlen(want), sizeof want - strlen(want), k ? ",%d" : "%d", ids[k]);
            snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}%s],%s}",
                     prompts[i].n == 2 ? ",{\"role\":\"assistant\",\"content\":\"Hello the\"}" : "",
                     prompts[i].fields);
            r = http_post(port, "/tokenize", body, NULL);
            CHECK(http_status(r) == 200 && strstr(http_body(r), want) &&
                  (prompts[i].cut || strstr(text, "</think>")), "/tokenize %s: %s\nwant the ids of %s",
                  prompts[i].fields, r, text);
            free(r);
        }
        llm_model_free(&m);
    } else CHECK(0, "load random-qwen3-qknorm: %s", err);
    /* a required call: Hermes' syntax read back into tool_calls */
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\","
                        "\"maxLength\":8}},\"required\":[\"city\"],\"additionalProperties\":false}}}]";
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"}],%s,"
             "\"tool_choice\":\"required\",\"parallel_tool_calls\":false,\"max_tokens\":100,\"seed\":1,"
             "\"temperature\":1}", tools);
    r = http_post(port, "/v1/chat/completions", body, NULL);
    CHECK(http_status(r) == 200 && strstr(http_body(r), "\"content\":null,\"tool_calls\":[{\"id\":\"call_") &&
          strstr(r, "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{") &&
          strstr(r, "\"finish_reason\":\"tool_calls\"") && !strstr(r, "tool_call>"), "a required call: %s",
          r);
    free(r);
    /* bad shapes: a 400 naming the field */
#define U "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}"
#define HI U "],"
    static const struct { const char *fields, *param, *says; } bad[] = {
        {HI "\"tools\":{}", "tools", "must be a list"},
        {HI "\"tools\":[{\"type\":\"function\",\"function\":{}}]", "tools[0]", "name"},
        {HI "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[1]}}]",
         "tools[0]", "parameters"},
        {HI "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
         "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\","
         "\"format\":\"hostname\"}}}}}]", "tools", "format"},
        {HI "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
         "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}", "tool_choice", "\\\"g\\\""},
        {HI "\"tool_choice\":\"required\"", "tool_choice", "tools"},
        {HI "\"tool_choice\":\"always\"", "tool_choice", "must be"},
        {HI "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"response_format\":{\"type\":"
         "\"json_object\"}", "tools", "give one"},
        {HI "\"chat_template_kwargs\":{\"enable_thinking\":1}", "chat_template_kwargs", "true or false"},
        {HI "\"reasoning_effort\":\"max\"", "reasoning_effort", "none, minimal"},
        {HI "\"add_generation_prompt\":true,\"continue_final_message\":true", "continue_final_message",
         "both"},
        /* messages */
        {U ",{\"role\":\"tool\",\"tool_call_id\":\"x\",\"content\":\"1\"}]", "messages[1].tool_call_id",
         "no earlier tool call"},
        {U ",{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\","
         "\"function\":{\"name\":\"f\",\"arguments\":\"{oops\"}}]}]", "messages[1].tool_calls[0]",
         "arguments must be a JSON object"},
        {"\"messages\":[{\"role\":\"user\",\"content\":\"Hi\",\"tool_calls\":[]}]", "messages[0].tool_calls",
         "assistant"},
        {U ",{\"role\":\"tool\",\"content\":\"1\"}]", "messages[1].tool_call_id", "must be the id"},
    };
#undef HI
#undef U
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(body, sizeof body, "{%s}", bad[i].fields);
        r = http_post(port, "/v1/chat/completions", body, NULL);
        char param[80];
        snprintf(param, sizeof param, "\"param\":\"%s\"", bad[i].param);
        CHECK(http_status(r) == 400 && strstr(http_body(r), param) && strstr(http_body(r), bad[i].says),
              "%s: 400 naming %s (%s): %s", bad[i].fields, bad[i].param, bad[i].says, r);
        free(r);
    }
    /* a whole loop's second request: the call and its result, answered */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
             "\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
             "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]},{\"role\":\"tool\","
             "\"tool_call_id\":\"call_1\",\"content\":\"-3\"}],%s,\"max_tokens\":8}", tools);
    r = http_post(port, "/v1/chat/completions", body, NULL);
    CHECK(http_status(r) == 200, "a tool's result answered: %s", r);
    free(r);
    CHECK(server_stop(&srv) == 0, "llm serve exits 0");
}

/* Structured output through the server: every field that asks for it (OpenAI's, vLLM's new and old,
 * llama.cpp's) on both endpoints, the answers checked here with llm_json_parse and by hand; the stream's
 * deltas put together are the answer; what cannot be honoured is a 400 naming the field (and the keyword) */
/* One request's costly grammar slows that request, not the others: a GBNF of 4,000 alternatives sharing a
 * long prefix (every mask walks 4,000 stacks) at n = 16, and beside it a 20-token completion: within 10 times
 * its time alone (before the grammar thread it took ~5,000 times as long: every step waited for 16 masks) */
static double timed_post(int port, const char *body) {
    double t0 = llm_now();
    char *r = http_post(port, "/v1/completions", body, NULL);
    double t = http_status(r) == 200 && strstr(r, "\"completion_tokens\":20") ? llm_now() - t0 : 1e9;
    free(r);
    return t;
}
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static void test_server_grammar_isolation(void) {
    test_server srv;
    if (server_start(&srv, "") != 0) return;
    int port = srv.port;
    const char *light = "{\"prompt\":\"Once upon a time\",\"max_tokens\":20,\"temperature\":0,"
                        "\"ignore_eos\":true}";
    double alone[5], beside[5];
    for (int i = 0; i < 5; i++) alone[i] = timed_post(port, light);
    size_t cap = 4000 * 80 + 4096, len = 0;
    char *heavy = (char *)malloc(cap), *req = (char *)malloc(cap + 256);
    if (!heavy || !req) { free(heavy); free(req); server_stop(&srv); return; }
    len += (size_t)sprintf(heavy, "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"n\":16,"
                           "\"temperature\":1,\"seed\":1,\"stream\":true,\"grammar\":\"root ::= ");
    for (int i = 0; i < 4000; i++)
        len += (size_t)sprintf(heavy + len, "%s\\\"the quick brown fox jumps over the lazy dog again and "
                               "again %04d\\\"", i ? " | " : "", i);
    len += (size_t)sprintf(heavy + len, "\"}");
    int n = sprintf(req, "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                    "Content-Length: %zu\r\n\r\n%s", len, heavy);
    int fd = tcp_connect(port);
    char first[256];
    ssize_t k = fd >= 0 && send_all(fd, req, (size_t)n) == 0 ? recv(fd, first, sizeof first, 0) : -1;
    usleep(300000); /* its prompt computed, its samples forked and masked */
    double blocks = metric(port, "llm:kv_cache_blocks"), running = metric(port, "vllm:num_requests_running");
    for (int i = 0; i < 5; i++) beside[i] = timed_post(port, light);
    double still = metric(port, "vllm:num_requests_running");
    qsort(alone, 5, sizeof *alone, cmp_double); qsort(beside, 5, sizeof *beside, cmp_double);
    CHECK(k > 0 && !strncmp(first, "HTTP/1.1 200", 12) && running == 16 && still == 16 &&
          beside[2] < 10 * alone[2],
          "serve: a 20-token completion beside a costly grammar at n = 16: median %.4f s, alone %.4f s "
          "(%.1fx; the grammar's request running %g then %g)", beside[2], alone[2], beside[2] / alone[2],
          running, still);
    if (fd >= 0) close(fd); /* the costly request is aborted: its blocks come back */
    double free_blocks = -1;
    for (double t0 = llm_now(); llm_now() - t0 < 30 && free_blocks != blocks; usleep(20000))
        free_blocks = metric(port, "llm:kv_cache_free_blocks");
    CHECK(free_blocks == blocks, "serve: the costly grammar's request aborted: %g of %g blocks free",
          free_blocks, blocks);
    free(req); free(heavy);
    CHECK(server_stop(&srv) == 0, "serve: exit status 0");
}

/* A request's reading (JSON, template, tokens, grammar) is a worker's, not the network thread's: while a
 * 2 MB prompt is tokenized (a second or more), /health answers at once and a stream goes on */
static void test_server_request_workers(void) {
    test_server srv;
    if (server_start(&srv, "") != 0) return;
    int port = srv.port;
    static const char *words[] = {"once", "upon", "a", "time", "there", "was", "little", "girl", "lily"};
    size_t cap = (2 << 20) + 256, len = 0;
    char *body = (char *)malloc(cap), *req = (char *)malloc(cap + 256);
    if (!body || !req) { free(body); free(req); server_stop(&srv); return; }
    len += (size_t)sprintf(body, "{\"max_tokens\":1,\"prompt\":\"");
    for (unsigned i = 0; len < (2u << 20); i++) len += (size_t)sprintf(body + len, "%s ", words[i * 7 % 9]);
    len += (size_t)sprintf(body + len, "\"}");
    int n = sprintf(req, "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                    "Connection: close\r\nContent-Length: %zu\r\n\r\n%s", len, body);
    const char *stream = "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"ignore_eos\":true,"
                         "\"stream\":true}";
    char sreq[512];
    int sn = snprintf(sreq, sizeof sreq, "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                      "Connection: close\r\nContent-Length: %zu\r\n\r\n%s", strlen(stream), stream);
    int sfd = tcp_connect(port), bfd = tcp_connect(port);
    double t0 = llm_now();
    send_all(sfd, sreq, (size_t)sn);
    send_all(bfd, req, (size_t)n);
    usleep(100000);
    double worst = 0;
    int healthy = 0;
    for (int i = 0; i < 3; i++) {
        double t = llm_now();
        char *r = http_get(port, "/health", NULL);
        healthy += http_status(r) == 200;
        if (llm_now() - t > worst) worst = llm_now() - t;
        free(r);
        usleep(50000);
    }
    size_t got = 0;
    char *big = recv_all(bfd, 60, &got); /* the server closes after an error: recv_all returns */
    double t_big = llm_now() - t0;
    char *streamed = recv_all(sfd, 60, NULL);
    CHECK(healthy == 3 && http_status(big) == 400 && strstr(big, "context") && t_big > 4 * worst &&
          streamed && strstr(streamed, "data: [DONE]"),
          "serve: /health during a 2 MB prompt's tokenizing: 3 of 3 (%d) in %.3f s at worst, the prompt's "
          "answer (%d) after %.3f s; the stream beside them ended: %d", healthy, worst, http_status(big),
          t_big,
          streamed && strstr(streamed, "data: [DONE]") != NULL);
    free(big); free(streamed); free(body); free(req);
    close(sfd); close(bfd);
    CHECK(server_stop(&srv) == 0, "serve: exit status 0");
}

static void test_server_structured(void) {
    test_server srv;
    if (server_start(&srv, "") != 0) return;
    int port = srv.port;
    const char *auth = NULL;
    static const struct { int chat; const char *fields; const char *kind; } cases[] = {
        {1, "\"response_format\":{\"type\":\"json_object\"}", "object"},
        {0, "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"pet\",\"strict\":true,"
            "\"schema\":{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"cat\",\"dog\"]},\"age\":"
            "{\"type\":\"integer\",\"minimum\":0,\"maximum\":30}},\"required\":[\"kind\",\"age\"],"
            "\"additionalProperties\":false}}}", "pet"},
        {1, "\"structured_outputs\":{\"json\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},"
         "\"maxItems\":3}}",
            "booleans"},
        {0, "\"structured_outputs\":{\"json\":\"{\\\"type\\\": \\\"array\\\", \\\"items\\\": {\\\"type\\\": "
            "\\\"boolean\\\"}, \\\"maxItems\\\": 3}\"}", "booleans"},
        {0, "\"structured_outputs\":{\"regex\":\"[ab]{3}c\"}", "abc"},
        {1, "\"structured_outputs\":{\"choice\":[\"yes\",\"no\"]}", "yes/no"},
        {0, "\"structured_outputs\":{\"grammar\":\"root ::= \\\"x\\\"+ \\\"!\\\"\"}", "x!"},
        {1, "\"structured_outputs\":{\"json_object\":true}", "object"},
        {0, "\"guided_json\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":3}",
         "booleans"},
        {1, "\"guided_regex\":\"[ab]{3}c\"", "abc"},
        {0, "\"guided_choice\":[\"yes\",\"no\"],\"guided_decoding_backend\":\"xgrammar\"", "yes/no"},
        {1, "\"guided_grammar\":\"root ::= \\\"x\\\"+ \\\"!\\\"\"", "x!"},
        {0, "\"grammar\":\"root ::= \\\"x\\\"+ \\\"!\\\"\"", "x!"},
        {1, "\"json_schema\":{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"cat\",\"dog\"]},"
            "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":30}},\"required\":[\"kind\",\"age\"],"
            "\"additionalProperties\":false}", "pet"},
    };
    char err[LLM_ERR_LEN];
    llm_grammar *object = llm_grammar_parse(JSON_OBJECT_GBNF, err);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char whole[2048] = "";
        for (int stream = 0; stream < 2; stream++) {
            char body[1024];
            snprintf(body, sizeof body, "{%s,\"max_tokens\":300,\"temperature\":1,\"seed\":%d,\"stream\":%s,"
                     "%s}", cases[i].chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"Answer.\"}]" :
                     "\"prompt\":\"Once\"", (int)i, stream ? "true" : "false", cases[i].fields);
            char *r = http_post(port, cases[i].chat ? "/v1/chat/completions" : "/v1/completions", body, auth);
            char text[2048] = "", finish[32] = "";
            const char *b = http_body(r);
            if (!stream) {
                json_str(b, cases[i].chat ? "content" : "text", text, sizeof text);
                json_str(b, "finish_reason", finish, sizeof finish);
            } else { /* the deltas, put together */
                size_t at = 0;
                for (const char *ev = b ? strstr(b, "data: {") : NULL; ev; ev = strstr(ev + 1, "data: {")) {
                    char piece[1024] = "", fin[32] = "";
                    const char *field = cases[i].chat ? "\"content\":" : "\"text\":", *x = strstr(ev, field);
                    const char *next = strstr(ev + 1, "data: ");
                    if (x && (!next || x < next))
                        json_str(ev, cases[i].chat ? "content" : "text", piece, sizeof piece);
                    if (at + strlen(piece) < sizeof text) {
                        memcpy(text + at, piece, strlen(piece)); at += strlen(piece);
                    }
                    text[at] = 0;
                    const char *f = strstr(ev, "\"finish_reason\":\"");
                    if (f && (!next || f < next)) {
                        json_str(ev, "finish_reason", fin, sizeof fin); strcpy(finish, fin);
                    }
                }
            }
            const char *k = cases[i].kind;
            /* any object: stories260K writes stories into its strings, which may not end by max_tokens */
            int cut = !strcmp(k, "object") && !strcmp(finish, "length") &&
                      !strcmp(grammar_verdict(object, text, strlen(text)), "prefix");
            int ok = http_status(r) == 200 && (!strcmp(finish, "stop") || cut) &&
                (!stream || !strcmp(text, whole));
            if (!stream) snprintf(whole, sizeof whole, "%s", text);
            llm_json j;
            int is_json = llm_json_parse(text, strlen(text), &j, err) == 0;
            if (cut) { if (is_json) llm_json_free(&j); is_json = 0; }
            else if (!strcmp(k, "object")) ok &= is_json && j.type == LLM_JSON_OBJECT;
            else if (!strcmp(k, "pet")) {
                const llm_json *kind = is_json ? llm_json_get(&j, "kind") : NULL,
                    *age = is_json ? llm_json_get(&j, "age") : NULL;
                ok &= is_json && j.n == 2 && kind && kind->type == LLM_JSON_STRING &&
                      (!strcmp(kind->str, "cat") || !strcmp(kind->str, "dog")) && age &&
                      age->type == LLM_JSON_NUMBER && age->num == floor(age->num) && age->num >= 0 &&
                      age->num <= 30;
            } else if (!strcmp(k, "booleans")) {
                ok &= is_json && j.type == LLM_JSON_ARRAY && j.n <= 3;
                for (int e2 = 0; ok && e2 < j.n; e2++)
                    ok &= j.items[e2].type == LLM_JSON_TRUE || j.items[e2].type == LLM_JSON_FALSE;
            } else if (!strcmp(k, "abc"))
                ok &= strlen(text) == 4 && strspn(text, "ab") == 3 && text[3] == 'c';
            else if (!strcmp(k, "yes/no")) ok &= !strcmp(text, "yes") || !strcmp(text, "no");
            else
                ok &= strlen(text) >= 2 && strspn(text, "x") == strlen(text) - 1 &&
                      text[strlen(text) - 1] == '!';
            if (is_json) llm_json_free(&j);
            CHECK(ok, "serve, structured output (%s): %s -> %s, \"%s\"; %.300s",
                  stream ? "streamed" : "whole", body, finish, text, r ? r : "");
            free(r);
        }
    }
    /* refused: a keyword the converter cannot honour, a bad shape, two constraints, a broken grammar */
    static const struct { int chat; const char *fields, *param, *says; } bad[] = {
        {1, "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
            "\"schema\":{\"type\":\"array\",\"uniqueItems\":true}}}", "response_format.json_schema.schema",
            "uniqueItems: a grammar cannot keep array items distinct"},
        {0, "\"response_format\":{\"type\":\"xml\"}", "response_format.type", "must be text, json_object or "
         "json_schema"},
        {0, "\"response_format\":{\"type\":\"json_schema\"}", "response_format.json_schema",
         "must be an object"},
        {1, "\"response_format\":{\"type\":\"json_object\"},\"guided_regex\":\"a\"", "guided_regex",
            "response_format and guided_regex both ask for structured output"},
        {0, "\"structured_outputs\":{\"regex\":\"(?=a)\"}", "structured_outputs.regex", "lookaround"},
        {0, "\"structured_outputs\":{}", "structured_outputs", "needs one of json, regex, choice, grammar"},
        {0, "\"structured_outputs\":{\"json\":{},\"whitespace_pattern\":\" \"}", "structured_outputs",
            "whitespace_pattern is not supported"},
        {1, "\"guided_choice\":[]", "guided_choice", "non-empty list of strings"},
        {0, "\"guided_json\":\"{not json\"", "guided_json", "is a string that is not JSON"},
        {0, "\"grammar\":\"root ::= [a-\"", "grammar", "ends inside a literal or a class at line 1"},
        {1, "\"json_schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}", "json_schema",
            "\"not\" is not supported at /properties/a"},
        {0, "\"guided_regex\":5", "guided_regex", "must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char body[1024], msg[512] = "", param[96] = "";
        snprintf(body, sizeof body, "{%s,\"max_tokens\":4,%s}", bad[i].chat ?
                 "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]" : "\"prompt\":\"Once\"",
                 bad[i].fields);
        char *r = http_post(port, bad[i].chat ? "/v1/chat/completions" : "/v1/completions", body, auth);
        json_str(http_body(r), "message", msg, sizeof msg);
        json_str(http_body(r), "param", param, sizeof param);
        CHECK(http_status(r) == 400 && !strcmp(param, bad[i].param) && strstr(msg, bad[i].says),
              "serve, structured output refused: %s -> %s", body, r ? r : "");
        free(r);
    }
    llm_grammar_free(object);
    server_stop(&srv);
}

/* POST /v1/responses (OpenAI's Responses API) on stories260K, greedy, over raw sockets: a stream's typed
 * events in their exact order, each `event:` line naming its data's type, sequence_number 0, 1, 2, ..., no
 * [DONE]; one msg_ id in every event; the terminal event's response object byte for byte what GET
 * /v1/responses/{id} returns and what the same request unstreamed gives (but its id, created_at and times);
 * the refused fields' exact errors; the store's bounds (--responses-store, --responses-store-bytes). */
static void test_server_responses(void) {
    test_server s;
    if (server_start(&s, "--responses-store 2") != 0) return;
    int port = s.port;
    char id[64], msg_id[64], path[128], want[512];
    /* 1. a stream: the events and their order */
    char *r = http_post(port, "/v1/responses", "{\"input\":\"Once upon a time\",\"max_output_tokens\":3,"
                        "\"temperature\":0,\"stream\":true}", NULL);
    char *ev = r ? dechunk(http_body(r)) : NULL;
    static const char *const order[] = {"response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.incomplete"};
    int n = 0, ok = ev != NULL;
    const char *last = NULL;
    for (const char *p = ev; ok && p && *p; n++) {
        char name[64], head[256];
        ok = n < 11 && sscanf(p, "event: %63[^\n]\n", name) == 1 && !strcmp(name, order[n]);
        snprintf(head, sizeof head, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d", name, name,
                 n);
        ok = ok && !strncmp(p, head, strlen(head));
        last = strstr(p, "data: ");
        p = strstr(p, "\n\n");
        p = p ? p + 2 : NULL;
    }
    CHECK(http_status(r) == 200 && ok && n == 11 && !strstr(ev, "[DONE]"),
          "responses: a stream's events in order, numbered from 0 (%d events): %s", n, ev ? ev : "");
    json_str(ev ? strstr(ev, "\"item\":") : NULL, "id", msg_id, sizeof msg_id);
    int uses = 0;
    for (const char *p = ev ? strstr(ev, msg_id) : NULL; p && msg_id[0]; p = strstr(p + 1, msg_id)) uses++;
    CHECK(strlen(msg_id) == 36 && !strncmp(msg_id, "msg_", 4) && uses == 9,
          "responses: one message id in added, content_part x2, 3 deltas, done x3, the final object (%d): %s",
          uses, msg_id);
    CHECK(ev && strstr(ev, "\"delta\":\"\\\"\",\"logprobs\":[]}") &&
          strstr(ev, "\"type\":\"response.output_text.done\",\"sequence_number\":7,\"item_id\":") &&
          strstr(ev, "\"output_index\":0,\"content_index\":0,\"text\":\"\\\"He\",\"logprobs\":[]}"),
          "responses: the deltas and the done text: %s", ev ? ev : "");
    /* 2. the terminal event's object is what GET returns, byte for byte */
    json_str(last ? strstr(last, "\"response\":") : NULL, "id", id, sizeof id);
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    char *g = http_get(port, path, NULL);
    const char *object = last ? strstr(last, "\"response\":") : NULL;
    size_t on = object ? strlen(object + 11) - 3 : 0; /* without the event's "}\n\n" */
    CHECK(http_status(g) == 200 && object && strlen(http_body(g)) == on &&
          !strncmp(http_body(g), object + 11, on) && strstr(http_body(g), "\"status\":\"incomplete\"") &&
          strstr(http_body(g), "\"incomplete_details\":{\"reason\":\"max_output_tokens\"}"),
          "responses: GET gives the stream's final object: %s\n---\n%s", g ? g : "", object ? object : "");
    free(g);
    /* 3. unstreamed: the same output, under ids of its own */
    char *w = http_post(port, "/v1/responses", "{\"input\":\"Once upon a time\",\"max_output_tokens\":3,"
                        "\"temperature\":0}", NULL);
    CHECK(http_status(w) == 200 && !strncmp(http_body(w), "{\"id\":\"resp_", 12) &&
          strstr(http_body(w), "\",\"status\":\"incomplete\",\"role\":\"assistant\",\"content\":[{\"type\":"
                 "\"output_text\",\"text\":\"\\\"He\",\"annotations\":[],\"logprobs\":[]}]}],") &&
          strstr(http_body(w), "\"usage\":{\"input_tokens\":46,\"input_tokens_details\":"
                 "{\"cached_tokens\":32,\"cache_write_tokens\":0},\"output_tokens\":3,"
                 "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":49}}") &&
          !strstr(http_body(w), msg_id),
          "responses: unstreamed: %s", w ? w : "");
    free(w); free(ev); free(r);
    /* 3b. include message.output_text.logprobs (greedy): each delta carries its tokens' logprobs, and the
     * done events and the final object carry them all, the same bytes (vLLM PR 56285's defect 4) */
    r = http_post(port, "/v1/responses", "{\"input\":\"Once upon a time\",\"max_output_tokens\":3,"
                  "\"temperature\":0,\"stream\":true,\"top_logprobs\":1,"
                  "\"include\":[\"message.output_text.logprobs\"]}", NULL);
    ev = r ? dechunk(http_body(r)) : NULL;
    static const char lp_want[] = "[{\"token\":\"\\\"\",\"logprob\":-1.06536961,\"bytes\":[34],"
        "\"top_logprobs\":[{\"token\":\"\\\"\",\"logprob\":-1.06536961,\"bytes\":[34]}]},"
        "{\"token\":\"H\",\"logprob\":-1.4087019,\"bytes\":[72],"
        "\"top_logprobs\":[{\"token\":\"H\",\"logprob\":-1.4087019,\"bytes\":[72]}]},"
        "{\"token\":\"e\",\"logprob\":-0.772014618,\"bytes\":[101],"
        "\"top_logprobs\":[{\"token\":\"e\",\"logprob\":-0.772014618,\"bytes\":[101]}]}]";
    char joined[2048] = "[";
    int deltas = 0, alls = 0;
    for (const char *p = ev; p && *p; p = strstr(p, "\n\n") ? strstr(p, "\n\n") + 2 : NULL) {
        const char *lp = strstr(p, "\"logprobs\":["), *end = strstr(p, "\n\n");
        if (!lp || !end || lp > end) continue;
        lp += 11; /* at its "[" */
        if (!strncmp(p, "event: response.output_text.delta\n", 34)) { /* "[...]}" ends the event */
            size_t n = (size_t)(end - lp) - 3, at = strlen(joined);
            if (n && at + n + 2 < sizeof joined) {
                if (at > 1) joined[at++] = ',';
                memcpy(joined + at, lp + 1, n); joined[at + n] = 0;
            }
            deltas++;
        } else for (const char *q = lp - 11; q && q < end; q = strstr(q + 1, "\"logprobs\":[")) {
            alls += !strncmp(q + 11, lp_want, sizeof lp_want - 1) && q[11 + sizeof lp_want - 1] != ',';
        }
    }
    strcat(joined, "]");
    CHECK(http_status(r) == 200 && deltas == 3 && !strcmp(joined, lp_want) && alls == 4 &&
          strstr(ev, "\"top_logprobs\":1,\"top_p\""),
          "responses: logprobs: the deltas' (%d) joined: %s; in the done events and the final object: "
          "%d of 4: %s", deltas, joined, alls, ev ? ev : "");
    free(ev); free(r);
    /* 3c. item_reference: a stored output item by its id, read as if the request held it (same prompt) */
    char ref_id[64], body3[512];
    int in_tokens[3] = {0, 0, 0};
    w = http_post(port, "/v1/responses", "{\"input\":\"Once upon a time\",\"max_output_tokens\":3,"
                  "\"temperature\":0}", NULL);
    json_str(w ? strstr(http_body(w), "\"output\":") : NULL, "id", ref_id, sizeof ref_id);
    free(w);
    for (int k = 2; k >= 0; k--) { /* the reference first: --responses-store 2 keeps two */
        snprintf(body3, sizeof body3, "{\"input\":[{\"role\":\"user\",\"content\":\"Once upon a time\"},%s"
                 "{\"role\":\"user\",\"content\":\"and\"}],\"max_output_tokens\":1}",
                 k == 0 ? "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":"
                 "\"output_text\",\"text\":\"\\\"He\"}]}," : k == 1 ? ""
                 : "{\"type\":\"item_reference\",\"id\":\"%s\"},");
        char body4[512];
        snprintf(body4, sizeof body4, body3, ref_id);
        w = http_post(port, "/v1/responses", body4, NULL);
        const char *it = w && http_status(w) == 200 ? strstr(http_body(w), "\"input_tokens\":") : NULL;
        if (it) in_tokens[k] = atoi(it + 15);
        free(w);
    }
    CHECK(!strncmp(ref_id, "msg_", 4) && in_tokens[2] == in_tokens[0] && in_tokens[0] > in_tokens[1] &&
          in_tokens[1] > 0, "responses: item_reference %s reads as the item (input_tokens %d %d %d)", ref_id,
          in_tokens[0], in_tokens[1], in_tokens[2]);
    /* 3d. references are bounded by what they bring in: 100,000 of one item (7.2 MB of body) would expand to
     * well over SRV_MAX_BODY: refused naming the first reference past it, before it is copied */
    w = http_post(port, "/v1/responses", "{\"input\":\"Once upon a time\",\"max_output_tokens\":3,"
                  "\"temperature\":0}", NULL);
    json_str(w ? strstr(http_body(w), "\"output\":") : NULL, "id", ref_id, sizeof ref_id);
    free(w);
    enum { N_REFS = 100000 };
    size_t cap = (size_t)N_REFS * (strlen(ref_id) + 40) + 64, at = 0;
    char *many_refs = (char *)malloc(cap);
    if (many_refs) at = (size_t)snprintf(many_refs, cap, "{\"input\":[");
    for (int k = 0; many_refs && k < N_REFS; k++)
        at += (size_t)snprintf(many_refs + at, cap - at, "%s{\"type\":\"item_reference\",\"id\":\"%s\"}",
                               k ? "," : "", ref_id);
    if (many_refs) snprintf(many_refs + at, cap - at, "],\"max_output_tokens\":1}");
    w = many_refs ? http_post(port, "/v1/responses", many_refs, NULL) : NULL;
    const char *past = w ? strstr(http_body(w), "\"message\":\"input[") : NULL;
    int past_i = past ? atoi(past + 17) : -1;
    char want_msg[256];
    snprintf(want_msg, sizeof want_msg, "\"message\":\"input[%d].id: the items referenced come to more "
             "than 8388608 bytes (send them instead)\",\"type\":\"invalid_request_error\","
             "\"param\":\"input[%d].id\"", past_i, past_i);
    CHECK(http_status(w) == 400 && past_i > 1000 && past_i < N_REFS && strstr(http_body(w), want_msg),
          "responses: %d references to one item are refused past SRV_MAX_BODY: %.300s", N_REFS, w ? w : "");
    free(w); free(many_refs);
    /* 4. what is refused, in OpenAI's shape, naming the field */
    static const char *const refused[][3] = {
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"},{\"type\":\"web_search\"}]}",
         "tools[1].type", "tools[1].type: web_search is a built-in tool this server does not run (function "
         "and custom tools are)"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"custom\",\"name\":\"p\",\"format\":{\"type\":\"grammar\","
         "\"syntax\":\"lark\"}}]}", "tools[0].format",
         "tools[0].format: grammar formats (lark, regex) are not supported; text is"},
        {"{\"input\":\"x\",\"background\":true}", "background",
         "background is not supported by this server (only null or its default value is accepted)"},
        {"{\"input\":\"x\",\"conversation\":\"c\"}", "conversation",
         "conversation is not supported by this server (only null is accepted)"},
        {"{\"input\":\"x\",\"image\":{}}", "image",
         "image is not supported by this server (only null is accepted)"},
        {"{\"input\":\"x\",\"prompt_cache_options\":{\"mode\":\"explicit\"}}", "prompt_cache_options",
         "prompt_cache_options is not supported by this server (only null is accepted)"},
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_0\"}", "previous_response_id",
         "Previous response with id 'resp_0' not found."},
        {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"o\"}]}",
         "input[0].call_id",
         "input[0].call_id: no function_call before it has the call_id \\\"c\\\""},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"[1]\"}]}",
         "input[0].arguments", "input[0].arguments must be a JSON object, as text"},
        {"{\"input\":[{\"type\":\"web_search_call\"}]}", "input[0].type",
         "input[0].type: web_search_call items are not supported (message, function_call, "
         "function_call_output, reasoning and compaction are)"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}", "input[0].content",
         "input[0].content[0]: input_image parts are not supported (input_text and output_text are)"},
        {"{\"input\":\"x\",\"reasoning\":{\"summary\":\"long\"}}", "reasoning.summary",
         "reasoning.summary must be auto, concise or detailed (the summary is the thinking itself)"},
        {"{\"input\":\"x\",\"include\":[\"file_search_call.results\"]}", "include",
         "include: file_search_call.results is not supported (reasoning.encrypted_content and "
         "message.output_text.logprobs are)"},
        {"{\"input\":\"x\",\"top_logprobs\":21}", "top_logprobs",
         "top_logprobs must be between 0 and 20, got 21"},
        {"{\"input\":[{\"type\":\"reasoning\",\"summary\":[],\"encrypted_content\":\"llm-rs1.@\"}]}",
         "input[0].encrypted_content",
         "input[0].encrypted_content is not this server's (its base64 is broken)"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"grammar\"}}}", "text.format.type",
         "text.format.type must be text, json_object or json_schema"},
        {"{\"input\":[]}", "input", "input must be a non-empty list"},
        {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_0\"}]}", "input[0].id",
         "input[0].id: no stored response has an output item with id 'msg_0'"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        r = http_post(port, "/v1/responses", refused[i][0], NULL);
        snprintf(want, sizeof want, "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\","
                 "\"param\":\"%s\",\"code\":400}}", refused[i][2], refused[i][1]);
        CHECK(http_status(r) == 400 && !strcmp(http_body(r), want), "responses: %s refused: %s",
              refused[i][0], r ? r : "");
        free(r);
    }
    snprintf(want, sizeof want, "PUT /v1/responses/resp_1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    r = http_request_raw(port, want, strlen(want));
    CHECK(http_status(r) == 405 && strstr(r, "\r\nAllow: GET, DELETE\r\n"), "responses: PUT: %s", r ? r : "");
    free(r);
    /* 5. the store: --responses-store 2 keeps the last two; DELETE forgets; an unknown id is a 404 */
    char ids[3][64];
    for (int i = 0; i < 3; i++) {
        r = http_post(port, "/v1/responses", "{\"input\":\"Once\",\"max_output_tokens\":1}", NULL);
        json_str(http_body(r), "id", ids[i], sizeof ids[i]);
        free(r);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "/v1/responses/%s", ids[i]);
        g = http_get(port, path, NULL);
        snprintf(want, sizeof want, "{\"error\":{\"message\":\"Response with id '%s' not found.\",\"type\":"
                 "\"not_found_error\",\"param\":\"response_id\",\"code\":404}}", ids[i]);
        CHECK(i ? http_status(g) == 200 : http_status(g) == 404 && !strcmp(http_body(g), want),
              "responses: the store keeps the newest 2 (%d): %s", i, g ? g : "");
        free(g);
    }
    snprintf(path, sizeof path, "/v1/responses/%s", ids[2]);
    snprintf(want, sizeof want, "DELETE %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    r = http_request_raw(port, want, strlen(want));
    snprintf(want, sizeof want, "{\"id\":\"%s\",\"object\":\"response\",\"deleted\":true}", ids[2]);
    CHECK(http_status(r) == 200 && !strcmp(http_body(r), want), "responses: DELETE: %s", r ? r : "");
    free(r);
    g = http_get(port, path, NULL);
    CHECK(http_status(g) == 404, "responses: GET after DELETE: %s", g ? g : "");
    free(g);
    /* 6. a continuation reads its parent's conversation and the prefix cache holds it */
    snprintf(want, sizeof want, "{\"input\":\"Then\",\"previous_response_id\":\"%s\","
             "\"max_output_tokens\":1}", ids[1]);
    r = http_post(port, "/v1/responses", want, NULL);
    CHECK(http_status(r) == 200 && strstr(http_body(r), "\"input_tokens_details\":{\"cached_tokens\":32,"),
          "responses: a continuation's prompt is cached: %s", r ? r : "");
    free(r);
    CHECK(server_stop(&s) == 0, "responses: exit status 0");
    /* 7. --responses-store-bytes: the oldest go first, and an entry over a quarter of it is not kept */
    if (server_start(&s, "--responses-store-bytes 6000") != 0) return;
    char first[64] = "", big[64] = "", *body = (char *)malloc(8000);
    for (int i = 0; i < 8; i++) {
        r = http_post(s.port, "/v1/responses", "{\"input\":\"Once\",\"max_output_tokens\":1}", NULL);
        json_str(http_body(r), "id", i ? id : first, 64);
        free(r);
    }
    int k = snprintf(body, 8000, "{\"input\":\"Once\",\"max_output_tokens\":1,\"metadata\":{");
    for (int i = 0; i < 4; i++) /* 2,000 bytes of metadata: over a quarter of 6,000 */
        k += snprintf(body + k, 8000 - (size_t)k, "%s\"k%d\":\"%0500d\"", i ? "," : "", i, 0);
    snprintf(body + k, 8000 - (size_t)k, "}}");
    r = http_post(s.port, "/v1/responses", body, NULL);
    json_str(http_body(r), "id", big, sizeof big);
    CHECK(http_status(r) == 200, "responses: a large one is answered: %s", r ? r : "");
    free(r); free(body);
    const char *which[3] = {first, id, big};
    int want_status[3] = {404, 200, 404};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "/v1/responses/%s", which[i]);
        g = http_get(s.port, path, NULL);
        CHECK(http_status(g) == want_status[i], "responses: --responses-store-bytes (%d): %s", i, g ? g : "");
        free(g);
    }
    CHECK(server_stop(&s) == 0, "responses: exit status 0");
    /* 8. thinking: stories260K wearing QwQ's template, whose generation prompt opens <think>, so the whole
     * reply is thinking: a reasoning item, its text and (reasoning.summary) the same text as its summary, in
     * the events' order, and reasoning_tokens counting the reply */
    char tpath[64], extra[128];
    if (stories_with_template("testdata/templates/Qwen-QwQ-32B.jinja", tpath) != 0) {
        CHECK(0, "a copy of stories260K with QwQ's template");
        return;
    }
    snprintf(extra, sizeof extra, "-m %s", tpath);
    if (server_start(&s, extra) != 0) { remove(tpath); return; }
    r = http_post(s.port, "/v1/responses", "{\"input\":\"Once\",\"max_output_tokens\":3,\"temperature\":0,"
                  "\"stream\":true,\"reasoning\":{\"summary\":\"auto\"},"
                  "\"include\":[\"reasoning.encrypted_content\"]}", NULL);
    ev = r ? dechunk(http_body(r)) : NULL;
    char names[2048] = "";
    size_t nn = 0;
    for (const char *p = ev; p && !strncmp(p, "event: ", 7); p = strstr(p, "\n\n"), p = p ? p + 2 : NULL) {
        int e = (int)strcspn(p, "\n") - 16; /* the name without "event: response." */
        if (e > 0 && nn + (size_t)e + 2 < sizeof names)
            nn += (size_t)snprintf(names + nn, sizeof names - nn, "%.*s ", e, p + 16);
    }
    const char *want_names = "created in_progress output_item.added reasoning_summary_part.added "
        "reasoning_text.delta reasoning_summary_text.delta reasoning_text.delta reasoning_summary_text.delta "
        "reasoning_text.delta reasoning_summary_text.delta reasoning_text.done reasoning_summary_text.done "
        "reasoning_summary_part.done output_item.done incomplete ";
    CHECK(!strcmp(names, want_names), "responses: a reasoning item's events: %s", names);
    CHECK(ev && strstr(ev, "\"item\":{\"type\":\"reasoning\",\"id\":\"rs_") &&
          strstr(ev, "\"summary\":[{\"type\":\"summary_text\",\"text\":") &&
          strstr(ev, "\"output_tokens_details\":{\"reasoning_tokens\":3}") &&
          strstr(ev, "\"encrypted_content\":\"llm-rs1."),
          "responses: the reasoning item and its tokens: %s", ev ? ev : "");
    free(ev); free(r);
    CHECK(server_stop(&s) == 0, "responses: exit status 0");
    remove(tpath);
}

/* POST /v1/responses/compact (what Codex calls when its context fills): the output is the conversation's
 * user messages (their content as given), then one compaction item whose summary is exactly what the model
 * answers (greedy, no tool call) to the conversation followed by the compaction prompt, its usage that's;
 * a compaction item in a later input reads as a user message of the summary (same prompt, same reply); a
 * stored conversation is compacted by its previous_response_id; nothing is stored; the refusals' words.
 * --max-model-len 512: stories260K's summary runs to the context's end, and this keeps it short; on a
 * model of a longer context a summary stops at RESP_COMPACT_MAX_TOKENS. */
static void test_server_compact(void) {
    static const char conv[] = "{\"role\":\"user\",\"content\":\"Once upon a time\"},{\"type\":"
        "\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"there "
        "was\"}]},{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a cat\"}]}";
    static const char kept[] = "\"output\":[{\"type\":\"message\",\"role\":\"user\",\"content\":"
        "[{\"type\":\"input_text\",\"text\":\"Once upon a time\"}]},{\"type\":\"message\",\"role\":"
        "\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a cat\"}]},{\"type\":\"compaction\","
        "\"id\":\"cmp_";
    static const char prompt[] = "Summarize the conversation so far for someone who will continue it with no "
        "other record of it: what the user wants (goals, constraints, preferences), what has been done and "
        "found (decisions, names, commands, results), what is still open, and the next step. Be specific and "
        "brief. Write only the summary.";
    enum { CAP = 16384 };
    test_server s;
    if (server_start(&s, "--max-model-len 512") != 0) return;
    char *body = (char *)malloc(CAP), *summary = (char *)calloc(1, CAP), *enc = (char *)malloc(CAP);
    char *said = (char *)malloc(CAP), cid[64], rid[64], path[128];
    if (!body || !summary || !enc || !said) { CHECK(0, "compact: memory"); goto out; }
    /* 1. the compaction, and the same conversation with the prompt asked as a request */
    snprintf(body, CAP, "{\"model\":\"stories260K\",\"input\":[%s]}", conv);
    char *r = http_post(s.port, "/v1/responses/compact", body, NULL);
    json_str(r ? strstr(http_body(r), "\"type\":\"compaction\"") : NULL, "encrypted_content", enc, CAP);
    json_str(r ? strstr(http_body(r), "\"type\":\"compaction\"") : NULL, "id", cid, sizeof cid);
    json_str(http_body(r), "id", rid, sizeof rid);
    int n = !strncmp(enc, "llm-cmp1.", 9) ? decode_base64(enc + 9, (uint8_t *)summary, CAP - 1) : -1;
    if (n >= 0) summary[n] = 0;
    CHECK(http_status(r) == 200 && !strncmp(http_body(r), "{\"id\":\"resp_", 12) &&
          strstr(http_body(r), "\",\"object\":\"response.compaction\",\"created_at\":") &&
          strstr(http_body(r), kept) && strlen(cid) == 36 && n > 0 &&
          strstr(http_body(r), "\"}],\"usage\":{\"input_tokens\":"),
          "compact: the user messages, then a compaction item: %.600s", r ? r : "");
    snprintf(body, CAP, "{\"input\":[%s,{\"role\":\"user\",\"content\":\"%s\"}],\"temperature\":0,"
             "\"store\":false}", conv, prompt);
    char *w = http_post(s.port, "/v1/responses", body, NULL);
    json_str(w ? strstr(http_body(w), "\"output\":") : NULL, "text", said, CAP);
    const char *u1 = r ? strstr(http_body(r), "\"usage\":") : NULL;
    const char *u2 = w ? strstr(http_body(w), "\"usage\":") : NULL;
    CHECK(http_status(w) == 200 && !strcmp(said, summary) && u1 && u2 &&
          atoi(u1 + 24) == atoi(u2 + 24) && atoi(u1 + 24) > 0 && strstr(u1, "\"output_tokens\":") &&
          atoi(strstr(u1, "\"output_tokens\":") + 16) == atoi(strstr(u2, "\"output_tokens\":") + 16),
          "compact: the summary is the model's answer to the prompt:\n%s\n---\n%s\n---%.300s\n%.300s",
          summary, said, u1 ? u1 : "", u2 ? u2 : "");
    free(w);
    /* 2. the compacted conversation continued: the item reads as the summary's user message */
    char *cont[2] = {NULL, NULL}, text[2][256];
    const char *out = r ? strstr(http_body(r), "\"output\":") : NULL, *end = out ? strstr(out, "}],") : NULL;
    for (int k = 0; k < 2 && end; k++) {
        int at = snprintf(body, CAP, "{\"input\":%.*s,", (int)(end - out - 9) + 1, out + 9); /* "[...}," */
        if (k) { /* the compaction item replaced by its reading */
            char *item = strstr(body, ",{\"type\":\"compaction\"");
            at = item ? (int)(item - body) : at;
            at += snprintf(body + at, CAP - (size_t)at, ",{\"role\":\"user\",\"content\":\"A summary of the "
                           "conversation before this point:\\n\\n");
            for (const char *c = summary; *c && at < CAP - 64; c++) /* escaped as JSON */
                at += *c == '"' || *c == '\\' ? snprintf(body + at, CAP - (size_t)at, "\\%c", *c)
                    : *c == '\n' ? snprintf(body + at, CAP - (size_t)at, "\\n")
                    : (unsigned char)*c < 32 ? snprintf(body + at, CAP - (size_t)at, "\\u%04x", *c)
                    : snprintf(body + at, CAP - (size_t)at, "%c", *c);
            at += snprintf(body + at, CAP - (size_t)at, "\"},");
        }
        snprintf(body + at, CAP - (size_t)at, "{\"role\":\"user\",\"content\":\"Then\"}],"
                 "\"max_output_tokens\":4,\"temperature\":0}");
        cont[k] = http_post(s.port, "/v1/responses", body, NULL);
        json_str(cont[k] ? strstr(http_body(cont[k]), "\"output\":") : NULL, "text", text[k], 256);
    }
    const char *t0 = cont[0] ? strstr(http_body(cont[0]), "\"input_tokens\":") : NULL;
    const char *t1 = cont[1] ? strstr(http_body(cont[1]), "\"input_tokens\":") : NULL;
    CHECK(http_status(cont[0]) == 200 && http_status(cont[1]) == 200 && t0 && t1 && atoi(t0 + 15) > 0 &&
          atoi(t0 + 15) == atoi(t1 + 15) && text[0][0] && !strcmp(text[0], text[1]),
          "compact: a compaction item reads as its summary: %.300s\n---\n%.300s", cont[0] ? cont[0] : "",
          cont[1] ? cont[1] : "");
    free(cont[0]); free(cont[1]);
    /* 3. not stored; a stored conversation compacted by its id */
    snprintf(path, sizeof path, "/v1/responses/%s", rid);
    char *g = http_get(s.port, path, NULL);
    CHECK(http_status(g) == 404, "compact: a compaction is not stored: %s", g ? g : "");
    free(g); free(r);
    r = http_post(s.port, "/v1/responses", "{\"input\":\"Once upon a time\",\"max_output_tokens\":3}", NULL);
    json_str(http_body(r), "id", rid, sizeof rid);
    free(r);
    snprintf(body, CAP, "{\"previous_response_id\":\"%s\"}", rid);
    r = http_post(s.port, "/v1/responses/compact", body, NULL);
    CHECK(http_status(r) == 200 && strstr(http_body(r), "\"output\":[{\"type\":\"message\",\"role\":"
          "\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Once upon a time\"}]},"
          "{\"type\":\"compaction\",\"id\":\"cmp_"),
          "compact: by previous_response_id: %.400s", r ? r : "");
    free(r);
    /* 4. refused, naming the field */
    static const char *const refused[][4] = {
        {"/v1/responses/compact", "{\"model\":\"stories260K\"}", "input",
         "input: a compaction needs a conversation (input, previous_response_id or both)"},
        {"/v1/responses/compact", "{\"input\":\"x\",\"stream\":true}", "stream",
         "stream is not supported by this server (only null or its default value is accepted)"},
        {"/v1/responses/compact", "{\"input\":\"x\",\"prompt_cache_options\":{}}", "prompt_cache_options",
         "prompt_cache_options is not supported by this server (only null is accepted)"},
        {"/v1/responses", "{\"input\":[{\"type\":\"compaction\",\"encrypted_content\":\"gAAAAB\"}]}",
         "input[0].encrypted_content",
         "input[0].encrypted_content is not this server's (a compaction made elsewhere cannot be read)"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        r = http_post(s.port, refused[i][0], refused[i][1], NULL);
        snprintf(body, CAP, "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\","
                 "\"param\":\"%s\",\"code\":400}}", refused[i][3], refused[i][2]);
        CHECK(http_status(r) == 400 && !strcmp(http_body(r), body), "compact: %s refused: %s", refused[i][1],
              r ? r : "");
        free(r);
    }
    /* 5. the summary bounded (RESP_COMPACT_MAX_TOKENS): random-qwen3-qknorm's greedy one never ends, and its
     * context (2048) is past the bound */
    test_server q;
    char extra[512];
    snprintf(extra, sizeof extra, "-m %s", model_path("random-qwen3-qknorm.gguf"));
    if (server_start(&q, extra) == 0) {
        r = http_post(q.port, "/v1/responses/compact", "{\"input\":\"Once upon a time\"}", NULL);
        const char *u = r ? strstr(http_body(r), "\"output_tokens\":") : NULL;
        CHECK(http_status(r) == 200 && u && atoi(u + 16) == 1024, "compact: the summary's bound: %.200s",
              u ? u : r ? r : "");
        free(r);
        CHECK(server_stop(&q) == 0, "compact: exit status 0");
    }
out:
    free(body); free(summary); free(enc); free(said);
    CHECK(server_stop(&s) == 0, "compact: exit status 0");
}

/* Issue 50's bombs and deeper ones through llm serve, each field that takes a grammar: a 4xx in under a
 * second whose param and message name the field and the limit, or, where the code walks its own stack now,
 * the answer; the server alive after (before, the first one took it down by stack overflow). A choice of
 * 10,000 values answers one of them exactly; a tool whose parameters use $defs and $ref (Pydantic's) is
 * called with arguments that Python's jsonschema validates (tools/schema_oracle.py; before: a 400). */
static void test_server_grammar_bounds(void) {
    test_server srv;
    if (server_start(&srv, "") != 0) return;
    int port = srv.port;
    static const char *const chain = "\"a%d\":{\"$ref\":\"#/$defs/a%d\"},";
    static const char *const schema = "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
                                      "\"name\":\"x\",\"schema\":{\"$ref\":\"#/$defs/a0\",\"$defs\":{";
    struct { const char *what; char *field; int status; const char *param, *says; } cases[] = {
        {"a chain of 1,600 $refs (the issue's)",
         repeat_text(schema, chain, 1600, "\"a1600\":{\"enum\":[\"ok\"]}}}}}", "", 0, ""), 200, NULL,
         "\"ok\""},
        {"a chain of 12,000 $refs", repeat_text(schema, chain, 12000, "\"a12000\":{}}}}}", "", 0, ""), 400,
         "response_format.json_schema.schema", "the schema needs more than 10000 rules"},
        {"allOf that $refs the schema around it", strdup("\"structured_outputs\":{\"json\":{\"properties\":"
         "{\"x\":{\"allOf\":[{\"$ref\":\"#\"},{\"type\":\"object\"}]}}}}"), 400, "structured_outputs.json",
         "the schema nests more than 128 deep"},
        {"10,000 nested parentheses (the issue's)",
         repeat_text("\"grammar\":\"root ::= ", "(", 10000, "\\\"a\\\"", ")", 10000, "\""), 200, NULL, "a"},
        {"100,000 nested parentheses",
         repeat_text("\"grammar\":\"root ::= ", "(", 100000, "\\\"a\\\"", ")", 100000, "\""), 200, NULL, "a"},
        {"100,000 nested parentheses with more after each",
         repeat_text("\"guided_grammar\":\"root ::= ", "(", 100000, "\\\"a\\\"", ") \\\"b\\\"", 100000, "\""),
         400, "guided_grammar", "rules nest more than 4096 deep at its start"},
        {"a chain of 70,000 rules (the issue's)", repeat_text("\"structured_outputs\":{\"grammar\":"
         "\"root ::= r0\\n", "r%d ::= r%d\\n", 70000, "r70000 ::= \\\"z\\\"\"}", "", 0, ""), 200, NULL, "z"},
        {"300,000 rules from repetitions", repeat_text("\"structured_outputs\":{\"grammar\":\"root ::=",
         " \\\"a\\\"{0,10000}", 30, "\"}", "", 0, ""), 400, "structured_outputs.grammar",
         "more than 262144 rules"},
        {"a regex of 100,000 nested groups",
         repeat_text("\"guided_regex\":\"", "(", 100000, "a", ")", 100000, "\""), 400, "guided_regex",
         "groups nested too deep (more than 64)"},
        {"a body nested 100,000 deep", repeat_text("\"extra\":", "[", 100000, "", "]", 100000, ""), 400, "",
         "nesting too deep (more than 64 arrays and objects)"},
        {"a tool whose parameters chain 12,000 $refs", repeat_text("\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"f\",\"parameters\":{\"$ref\":\"#/$defs/a0\",\"$defs\":{", chain, 12000,
         "\"a12000\":{}}}}}],\"tool_choice\":\"required\"", "", 0, ""), 400, "tools",
         "tools[0].function.parameters: JSON schema: the schema needs more than 10000 rules"},
    };
    /* each is refused before its work is spent: well under a second (ThreadSanitizer runs the server 5 to 15
     * times slower: 1.02 s was seen on a loaded machine) */
    const double bound_s = UNDER_TSAN ? 5.0 : 1.0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int chat = !strncmp(cases[i].field, "\"tools\"", 7);
        char *body = (char *)malloc(strlen(cases[i].field) + 256), msg[512] = "", param[96] = "";
        char text[64] = "";
        sprintf(body, "{%s,\"max_tokens\":8,\"temperature\":0,%s}", chat ? "\"messages\":[{\"role\":\"user\","
                "\"content\":\"Hi\"}]" : "\"prompt\":\"Once\"", cases[i].field);
        double t0 = llm_now();
        char *r = http_post(port, chat ? "/v1/chat/completions" : "/v1/completions", body, NULL);
        double t = llm_now() - t0;
        json_str(http_body(r), "message", msg, sizeof msg);
        json_str(http_body(r), "param", param, sizeof param);
        json_str(http_body(r), "text", text, sizeof text);
        int ok = http_status(r) == cases[i].status && (cases[i].status == 200 ? !strcmp(text, cases[i].says) :
                 !strcmp(param, cases[i].param) && strstr(msg, cases[i].says) && t < bound_s);
        CHECK(ok, "serve, %s (%zu bytes): %d in %.2f s, want %d: %.300s", cases[i].what, strlen(body),
              http_status(r), t, cases[i].status, r ? r : "no response");
        free(r); free(body); free(cases[i].field);
    }
    char *r = http_get(port, "/health", NULL);
    CHECK(http_status(r) == 200, "serve: /health after the bombs: %.200s", r ? r : "no response");
    free(r);
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}", NULL);
    CHECK(http_status(r) == 200 && strstr(http_body(r), "\"completion_tokens\":4"),
          "serve: a completion after the bombs: %.300s", r ? r : "no response");
    free(r);
    /* a choice of 10,000 values: the answer is one of them */
    char *body = repeat_text("{\"prompt\":\"Once\",\"max_tokens\":20,\"temperature\":1,\"seed\":5,"
                             "\"guided_choice\":[\"item-0\"", ",\"item-%d\"", 10000, "]}", "", 0, "");
    r = http_post(port, "/v1/completions", body, NULL);
    char text[64] = "", finish[16] = "";
    json_str(http_body(r), "text", text, sizeof text);
    json_str(http_body(r), "finish_reason", finish, sizeof finish);
    int found = 0;
    for (int i = 0; i <= 10000 && !found; i++) {
        char v[16];
        snprintf(v, sizeof v, "item-%d", i);
        found = !strcmp(text, v);
    }
    CHECK(http_status(r) == 200 && found && !strcmp(finish, "stop"), "serve: a choice of 10,000 values "
          "answers \"%s\" (%s): %.300s", text, finish, r ? r : "no response");
    free(r); free(body);
    CHECK(server_stop(&srv) == 0, "serve: exit status 0 after the bombs");
    /* a tool with $defs and $ref, on Qwen3's template (Hermes' calls): its arguments validate */
    char extra[1024];
    snprintf(extra, sizeof extra, "-m %s", model_path("random-qwen3-qknorm.gguf"));
    if (server_start(&srv, extra) != 0) return;
    r = http_post(srv.port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":"
                  "\"Add Ann.\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"add_person\","
                  "\"parameters\":" PYDANTIC_PARAMS "}}],\"tool_choice\":\"required\","
                  "\"parallel_tool_calls\":false,\"max_tokens\":1000,\"temperature\":1,\"seed\":3}", NULL);
    char name[64] = "", args[4096] = "", cases_path[] = "/tmp/llm-test-args-XXXXXX";
    char schemas_path[] = "/tmp/llm-test-pydantic-XXXXXX", cmd[256], *out = NULL;
    json_str(http_body(r), "name", name, sizeof name);
    json_str(http_body(r), "arguments", args, sizeof args);
    json_str(http_body(r), "finish_reason", finish, sizeof finish);
    int fd1 = mkstemp(schemas_path), fd2 = mkstemp(cases_path), status = -1;
    FILE *fs = fd1 >= 0 ? fdopen(fd1, "w") : NULL, *fc = fd2 >= 0 ? fdopen(fd2, "w") : NULL;
    if (fs) fputs("[{\"name\": \"add_person\", \"schema\": " PYDANTIC_PARAMS "}]\n", fs);
    if (fc) json_line(fc, 0, "sample", args, strlen(args), "accept");
    if (fs) fclose(fs);
    if (fc) fclose(fc);
    snprintf(cmd, sizeof cmd, ".venv/bin/python tools/schema_oracle.py %s %s 2>&1", schemas_path, cases_path);
    if (fs && fc) out = run_command(cmd, &status);
    CHECK(http_status(r) == 200 && !strcmp(name, "add_person") && !strcmp(finish, "tool_calls") &&
          status == 0 && out && strstr(out, "1 agree, 0 disagree"), "serve: a tool with $defs and $ref: "
          "arguments %s (%s): %s; %.400s", args, finish, out ? out : "", r ? r : "no response");
    free(out); free(r);
    unlink(schemas_path); unlink(cases_path);
    CHECK(server_stop(&srv) == 0, "serve (Qwen3): exit status 0");
}

/* The JSON string at p (its opening quote) as it is written, escapes and all, into out: NULL p gives "" */
static void raw_json_str(const char *p, char *out, size_t cap) {
    size_t n = 0;
    if (p && (p = strchr(p, ':')) && p[1] == '"')
        for (p += 2; *p && *p != '"' && n + 2 < cap; p++) {
            if (*p == '\\' && p[1]) out[n++] = *p++;
            out[n++] = *p;
        }
    out[n] = 0;
}

/* Anthropic's Messages API on stories260K: its error shape and statuses (a missing max_tokens, an image
 * block, a wrong x-api-key, the head's 404/405/413), x-api-key beside Authorization: Bearer, a message's
 * exact body, a stream's events in Anthropic's order (every block stopped, one message_delta, its text the
 * message's), stop_sequence naming the stop string, and count_tokens equal to the message's prompt. */
static void test_server_messages(void) {
    test_server s;
    if (server_start(&s, "--api-key k3y") != 0) return;
    int port = s.port;
#define KEY "x-api-key: k3y\r\n"
#define ANTHROPIC_ERROR(type, message) "{\"type\":\"error\",\"error\":{\"type\":\"" type "\",\"message\":\"" \
    message "\"}}"
    const char *key = KEY;
    /* 1. errors in Anthropic's shape, exact */
    static const struct { const char *body, *extra; int status; const char *error; } errs[] = {
        {"{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", KEY, 400,
         ANTHROPIC_ERROR("invalid_request_error", "max_tokens: Field required")},
        {"{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":"
         "{\"type\":\"url\",\"url\":\"http://x/y.png\"}}]}]}", KEY, 400,
         ANTHROPIC_ERROR("invalid_request_error", "messages.0.content.0.type: image blocks are not "
                         "supported by this server (a user message takes text and tool_result)")},
        {"{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "x-api-key: wrong\r\n",
         401, ANTHROPIC_ERROR("authentication_error", "Unauthorized: give the API key as 'x-api-key: KEY' "
                              "(or 'Authorization: Bearer KEY')")},
        {"{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"mcp_servers\":[{}]}",
         KEY, 400, ANTHROPIC_ERROR("invalid_request_error", "mcp_servers: not supported by this server")},
        {"{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"model\":\"claude\"}",
         KEY, 404, ANTHROPIC_ERROR("not_found_error", "The model `claude` does not exist (this server serves "
                                   "`stories260K`)")},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        char *r = http_post(port, "/v1/messages", errs[i].body, errs[i].extra);
        CHECK(http_status(r) == errs[i].status && !strcmp(http_body(r), errs[i].error),
              "messages: error %zu: %s", i, r ? r : "");
        free(r);
    }
    /* the head's answers on Anthropic's routes: 404 and 405 in its shape, a body too large its 413 */
    char *r = http_post(port, "/v1/messages/nope", "{}", key);
    CHECK(http_status(r) == 404 && !strcmp(http_body(r), ANTHROPIC_ERROR("not_found_error", "Not Found: "
          "/v1/messages/nope")), "messages: 404: %s", r ? r : "");
    free(r);
    r = http_get(port, "/v1/messages", key);
    CHECK(http_status(r) == 405 && strstr(r, "\r\nAllow: POST\r\n") && !strcmp(http_body(r),
          ANTHROPIC_ERROR("invalid_request_error", "Method Not Allowed: use POST for /v1/messages")),
          "messages: 405: %s", r ? r : "");
    free(r);
    const char big[] = "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: k3y\r\n" JSON_CT
                       "Content-Length: 9000000\r\n\r\n";
    r = http_request_raw(port, big, sizeof big - 1);
    CHECK(http_status(r) == 413 && !strcmp(http_body(r), ANTHROPIC_ERROR("request_too_large", "the request's "
          "body is too large (9000000 bytes; at most 8388608)")), "messages: 413: %s", r ? r : "");
    free(r);
    /* the OpenAI routes keep their shape, and take x-api-key too; /v1/messages takes Authorization: Bearer */
    r = http_post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                  "\"max_tokens\":1}", key);
    CHECK(http_status(r) == 200, "messages: x-api-key on /v1/chat/completions: %s", r ? r : "");
    free(r);
    r = http_post(port, "/v1/chat/completions", "{}", "x-api-key: wrong\r\n");
    CHECK(http_status(r) == 401 && !strcmp(http_body(r), "{\"error\":{\"message\":\"Unauthorized: give the "
          "API key as 'Authorization: Bearer KEY'\",\"type\":\"authentication_error\",\"param\":null,"
          "\"code\":401}}"), "messages: a wrong key on chat: OpenAI's shape: %s", r ? r : "");
    free(r);
    /* 2. a message, exact but for its id */
    const char *hi = "{\"model\":\"stories260K\",\"max_tokens\":6,\"temperature\":0,\"system\":\"You tell "
                     "stories.\",\"messages\":[{\"role\":\"user\",\"content\":\"A story, please.\"}]";
    char body[1024], text[512], ref[1024];
    snprintf(body, sizeof body, "%s}", hi);
    r = http_post(port, "/v1/messages", body, "Authorization: Bearer k3y\r\n");
    const char *b = http_body(r);
    raw_json_str(strstr(b, "\"text\":\""), text, sizeof text); /* as JSON writes it: the stream's too */
    snprintf(ref, sizeof ref, "\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"stories260K\","
             "\"content\":[{\"type\":\"text\",\"text\":\"%s\"}],\"stop_reason\":\"max_tokens\","
             "\"stop_sequence\":null,\"usage\":{\"input_tokens\":", text);
    CHECK(http_status(r) == 200 && !strncmp(b, "{\"id\":\"msg_", 11) && strlen(b) > 35 &&
          !strncmp(b + 35, ref, strlen(ref)) && text[0] && strstr(b, ",\"cache_creation_input_tokens\":0,"
          "\"cache_read_input_tokens\":0,\"output_tokens\":6}}"), "messages: a message: %s", r ? r : "");
    int input_tokens = atoi(strstr(b, "\"input_tokens\":") ? strstr(b, "\"input_tokens\":") + 15 : "0");
    free(r);
    /* count_tokens: the same prompt's tokens */
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"system\":\"You tell stories.\",\"messages\":"
             "[{\"role\":\"user\",\"content\":\"A story, please.\"}]}");
    r = http_post(port, "/v1/messages/count_tokens", body, key);
    char want[64];
    snprintf(want, sizeof want, "{\"input_tokens\":%d}", input_tokens);
    CHECK(http_status(r) == 200 && input_tokens > 5 && !strcmp(http_body(r), want),
          "messages: count_tokens %s: %s", want, r ? r : "");
    free(r);
    /* 3. the stream: message_start, one text block (start, deltas, stop), message_delta, message_stop; the
     * deltas make the message's text; the prompt again: its tokens read from the cache, not counted as
     * input (input + cache reads = the prompt) */
    snprintf(body, sizeof body, "%s,\"stream\":true}", hi);
    r = http_post(port, "/v1/messages", body, key);
    char events[2048] = "", streamed[512] = "";
    for (const char *p = r ? strstr(r, "event: ") : NULL; p; p = strstr(p + 1, "\nevent: ")) {
        if (*p == '\n') p++;
        const char *e = strchr(p, '\n');
        if (!e) break;
        snprintf(events + strlen(events), sizeof events - strlen(events), "%.*s,", (int)(e - p - 7), p + 7);
        const char *d = strstr(e, "\"text_delta\",\"text\":\"");
        size_t at = strlen(streamed);
        if (!strncmp(p + 7, "content_block_delta", 19) && d)
            raw_json_str(d + 14, streamed + at, sizeof streamed - at);
    }
    const char *cbd = "content_block_delta,";
    char *after = strstr(events, "message_start,content_block_start,") == events ? events + 34 : NULL;
    while (after && !strncmp(after, cbd, strlen(cbd))) after += strlen(cbd);
    CHECK(after && after != events + 34 && !strcmp(after, "content_block_stop,message_delta,message_stop,") &&
          !strcmp(streamed, text), "messages: the stream's events %s, text %s (the message's: %s)", events,
          streamed, text);
    snprintf(want, sizeof want, "\"cache_read_input_tokens\":%d,", (input_tokens - 1) / 16 * 16);
    CHECK(r && strstr(r, "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\","
          "\"stop_sequence\":null},\"usage\":{\"output_tokens\":6}}\n\n") && strstr(r, want) &&
          strstr(r, "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":"
          "\"text\",\"text\":\"\"}}\n\n") && strstr(r, "data: {\"type\":\"message_stop\"}\n\n\r\n0\r\n\r\n"),
          "messages: the stream's blocks and end: %s", r ? r : "");
    free(r);
    /* 4. stop_sequences: two letters inside the text end it, and stop_sequence names them */
    char word[3] = "";
    for (size_t i = 1; !word[0] && text[i] && text[i + 1]; i++)
        if (isalpha((unsigned char)text[i]) && isalpha((unsigned char)text[i + 1])) memcpy(word, text + i, 2);
    snprintf(body, sizeof body, "%s,\"stop_sequences\":[\"zzz\",\"%s\"]}", hi, word);
    r = http_post(port, "/v1/messages", body, key);
    snprintf(ref, sizeof ref, "\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"%s\"", word);
    CHECK(word[0] && http_status(r) == 200 && strstr(http_body(r), ref), "messages: stop_sequences [%s]: %s",
          word, r ? r : "");
    free(r);
    CHECK(server_stop(&s) == 0, "serve: exit status 0");
#undef KEY
#undef ANTHROPIC_ERROR
}

static void test_server_errors(void) {
    test_server s;
    if (server_start(&s, "--api-key sesame --max-queue 2 --request-timeout 1 --max-model-len 64") != 0)
        return;
    int port = s.port;
    const char *auth = "Authorization: Bearer sesame\r\n";
    static const struct { const char *body; int status; const char *param, *message; } bad[] = {
        {"{\"prompt\":\"x\",", 400, NULL,
         "the body is not valid JSON: an object key must be a string at byte 14"},
        {"[1,2]", 400, NULL, "the body must be a JSON object"},
        {"{\"prompt\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", 400, NULL,
         "nesting too deep"},
        {"{\"prompt\":\"x\"} x", 400, NULL, "more text after the value"},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"x\":1}}", 400, "logit_bias",
         "logit_bias keys must be token ids (0..511), got \"x\""},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"512\":1}}", 400, "logit_bias", "got \"512\""},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"-1\":1}}", 400, "logit_bias", "got \"-1\""},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"5\":100.5}}", 400, "logit_bias",
         "logit_bias values must be numbers in [-100, 100]"},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"5\":\"1\"}}", 400, "logit_bias", "numbers in [-100, 100]"},
        {"{\"prompt\":\"x\",\"logit_bias\":[1]}", 400, "logit_bias",
         "logit_bias must be an object of token ids to biases"},
        {"{\"prompt\":\"x\",\"allowed_token_ids\":[]}", 400, "allowed_token_ids",
         "allowed_token_ids must be a non-empty list of token ids (0..511)"},
        {"{\"prompt\":\"x\",\"allowed_token_ids\":[3,512]}", 400, "allowed_token_ids", "non-empty list"},
        {"{\"prompt\":\"x\",\"allowed_token_ids\":{}}", 400, "allowed_token_ids", "non-empty list"},
        {"{\"prompt\":\"x\",\"bad_words\":\"dog\"}", 400, "bad_words", "bad_words must be a list of strings"},
        {"{\"prompt\":\"x\",\"bad_words\":[\"dog\",\"  \"]}", 400, "bad_words",
         "bad_words must be a list of strings with a word in each"},
        {"{\"prompt\":\"x\",\"bad_words\":[3]}", 400, "bad_words", "with a word in each"},
        {"", 400, NULL, "a value is missing at byte 0"},
        {"{\"prompt\":\"\\ud800\"}", 400, NULL, "the body is not valid JSON: a high surrogate without"},
        {"{\"prompt\":\"\xff\"}", 400, NULL, "invalid UTF-8 in a string"},
        {"{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens", "max_tokens must be between 1 and"},
        {"{\"prompt\":\"x\",\"echo\":true,\"max_tokens\":-1}", 400, "max_tokens",
         "max_tokens must be between 0 and"},
        {"{\"prompt\":\"x\",\"prompt_logprobs\":21}", 400, "prompt_logprobs",
         "prompt_logprobs must be between 0 and 20"},
        {"{\"prompt\":\"x\",\"prompt_logprobs\":true}", 400, "prompt_logprobs",
         "prompt_logprobs must be a number"},
        {"{\"prompt\":\"x\",\"max_tokens\":\"5\"}", 400, "max_tokens", "max_tokens must be a number"},
        {"{\"prompt\":\"x\",\"max_tokens\":2.5}", 400, "max_tokens", "max_tokens must be an integer"},
        {"{\"prompt\":\"x\",\"n\":0}", 400, "n", "n must be between 1 and 128"},
        {"{\"prompt\":\"x\",\"top_p\":1.5}", 400, "top_p", "top_p must be between 0 and 1"},
        {"{\"prompt\":\"x\",\"top_p\":0}", 400, "top_p", "top_p must be in (0, 1]"},
        {"{\"prompt\":\"x\",\"temperature\":-1}", 400, "temperature", "temperature must be between 0 and"},
        {"{\"prompt\":\"x\",\"temperature\":1e999}", 400, NULL, "a number out of range"},
        {"{\"prompt\":\"x\",\"seed\":1e300}", 400, "seed", "seed must be between"},
        {"{\"prompt\":\"x\",\"stream\":1}", 400, "stream", "stream must be true or false"},
        {"{\"prompt\":\"x\",\"stop\":[1]}", 400, "stop", "stop must be strings"},
        {"{\"prompt\":[1,2,99999]}", 400, "prompt", "a prompt's token ids must be integers in 0..511"},
        {"{\"max_tokens\":3}", 400, "prompt", "prompt is required"},
        {"{\"prompt\":\"x\",\"model\":\"gpt-4\"}", 404, "model", "The model `gpt-4` does not exist"},
        {"{\"prompt\":\"Once upon a time there was a girl\",\"max_tokens\":60}", 400, "prompt",
         "This model's maximum context length is 64 tokens. However, you requested 71 tokens "
         "(11 in the prompt, 60 in the completion)"},
        {"{\"prompt\":[\"a\",\"b\",\"c\"]}", 503, NULL, "the server is busy"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *r = http_post(port, "/v1/completions", bad[i].body, auth);
        const char *b = http_body(r);
        char param[64], msg[512];
        json_str(b, "message", msg, sizeof msg);
        const char *pv = tok_json_value(b, NULL, "param");
        if (pv && *pv == '"') json_str(b, "param", param, sizeof param);
        else snprintf(param, sizeof param, "null");
        CHECK(http_status(r) == bad[i].status && !strncmp(b, "{\"error\":{\"message\":", 20) &&
              strstr(msg, bad[i].message) && !strcmp(param, bad[i].param ? bad[i].param : "null") &&
              strstr(b, "\"type\":\"") && strstr(b, "\"code\":"),
              "serve: %s -> %d: %s", bad[i].body, bad[i].status, r ? r : "");
        free(r);
    }
    char *r = http_post(port, "/v1/chat/completions",
                        "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", auth);
    CHECK(http_status(r) == 400 && strstr(r, "\"param\":\"messages[0].role\""), "serve: a bad role: %s", r);
    free(r);
    /* fail closed: a field not implemented is refused (its param, its name in the message) unless its value
     * asks for nothing; null is "not given"; a field on the endpoint it applies to */
    static const struct { int chat; const char *field, *value; int status; } fields[] = {
        {1, "functions", "[{\"name\":\"f\"}]", 400},
        {1, "function_call", "{\"name\":\"f\"}", 400},
        {0, "suffix", "\" The end.\"", 400},
        {0, "best_of", "3", 400},
        {1, "best_of", "2,\"n\":1", 400},
        {0, "guided_whitespace_pattern", "\"[ ]?\"", 400},
        {1, "structural_tag", "{}", 400},
        {1, "audio", "{\"voice\":\"alloy\",\"format\":\"wav\"}", 400},
        {1, "modalities", "[\"text\",\"audio\"]", 400},
        {1, "prediction", "{\"type\":\"content\",\"content\":\"x\"}", 400},
        {1, "web_search_options", "{}", 400},
        {0, "use_beam_search", "true", 400},
        {1, "response_format", "{\"type\":\"text\"}", 200},
        {0, "response_format", "{\"type\":\"text\"}", 200},
        {1, "response_format", "null", 200},
        {1, "tools", "[]", 200},
        {1, "tool_choice", "\"none\"", 200},
        {1, "tool_choice", "\"auto\",\"tools\":[]", 200},
        {1, "reasoning_effort", "\"low\"", 200},
        {1, "chat_template_kwargs", "{\"enable_thinking\":false}", 200},
        {0, "logit_bias", "{}", 200},
        {1, "logit_bias", "null", 200},
        {0, "logit_bias", "{\"50\":-100}", 200},
        {0, "allowed_token_ids", "[1,2]", 200},
        {1, "bad_words", "[\"dog\",\" big cat\"]", 200},
        {1, "logit_bias", "{\"50\":-100,\"7\":2.5}", 200},
        {0, "suffix", "null", 200},
        {0, "suffix", "\"\"", 200},
        {0, "best_of", "1", 200},
        {0, "best_of", "2,\"n\":2", 200},
        {1, "modalities", "[\"text\"]", 200},
        {0, "guided_json", "null", 200},
        {0, "guided_decoding_backend", "\"xgrammar\"", 200},
        {0, "user", "\"alice\"", 200},
        {1, "metadata", "{\"k\":\"v\"}", 200},
        {1, "store", "false", 200},
        {1, "service_tier", "\"auto\"", 200},
        {1, "parallel_tool_calls", "true", 200},
        {1, "stream_options", "null", 200},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char body[512], want[2][512];
        snprintf(body, sizeof body, "{%s,\"max_tokens\":2,\"%s\":%s}", fields[i].chat ?
                 "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]" : "\"prompt\":\"Once\"",
                 fields[i].field, fields[i].value);
        for (int k = 0; k < 2; k++)
            snprintf(want[k], sizeof want[k], "{\"error\":{\"message\":\"%s is not supported by this server "
                     "(only null%s is accepted)\",\"type\":\"invalid_request_error\",\"param\":\"%s\","
                     "\"code\":400}}", fields[i].field, k ? " or its default value" : "", fields[i].field);
        char *r = http_post(port, fields[i].chat ? "/v1/chat/completions" : "/v1/completions", body, auth);
        const char *b = http_body(r);
        CHECK(http_status(r) == fields[i].status && (fields[i].status == 200 ?
              strstr(b, "\"finish_reason\":\"length\"") != NULL : !strcmp(b, want[0]) || !strcmp(b, want[1])),
              "serve: %s %s -> %d: %s", fields[i].chat ? "chat" : "completions", body, fields[i].status,
              r ? r : "");
        free(r);
    }
    /* prompt_cache_key (the balancer's routing key, deploy/haproxy.cfg): a string of at most 256 bytes on
     * both endpoints (256 taken, 257 not); anything else is a 400 naming it */
    char keys[7][300] = {"\"conversation-7\"", "null", "\"\"", "", "5", "{\"id\":\"x\"}", ""};
    for (int k = 3; k < 7; k += 3) {
        memset(keys[k], 'k', 256 + k / 6 + 2);
        keys[k][0] = keys[k][256 + k / 6 + 1] = '"';
    }
    const char *refused = "{\"error\":{\"message\":\"prompt_cache_key must be a string of at most 256 "
        "bytes\","
        "\"type\":\"invalid_request_error\",\"param\":\"prompt_cache_key\",\"code\":400}}";
    for (int i = 0; i < 14; i++) {
        int chat = i % 2, k = i / 2, ok = k < 4;
        char body[512];
        snprintf(body, sizeof body, "{%s,\"max_tokens\":2,\"prompt_cache_key\":%s}", chat ?
                 "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]" : "\"prompt\":\"Once\"", keys[k]);
        char *r = http_post(port, chat ? "/v1/chat/completions" : "/v1/completions", body, auth);
        const char *b = http_body(r);
        CHECK(ok ? http_status(r) == 200 && strstr(b, "\"finish_reason\":\"length\"") :
              http_status(r) == 400 && !strcmp(b, refused), "serve: %s prompt_cache_key %.20s (%zu bytes) -> "
              "%d: %s", chat ? "chat" : "completions", keys[k], strlen(keys[k]), ok ? 200 : 400, r ? r : "");
        free(r);
    }
    /* logit_bias +100 forces its token: the greedy text is that token's, four times over (/detokenize's,
     * after the prompt's token "Once", 403, so that SentencePiece's leading space stays) */
    char *forced = http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":4,"
                             "\"temperature\":0,\"logit_bias\":{\"300\":100}}", auth);
    char *four = http_post(port, "/detokenize", "{\"tokens\":[403,300,300,300,300]}", auth);
    char forced_text[256] = "Once", want[256] = "";
    json_str(http_body(forced), "text", forced_text + 4, sizeof forced_text - 4);
    json_str(http_body(four), "prompt", want, sizeof want);
    CHECK(http_status(forced) == 200 && *want && !strcmp(forced_text, want), "serve: logit_bias +100: \"%s\" "
          "(want \"%s\"): %s", forced_text, want, forced ? forced : "");
    free(forced);
    /* bad_words: the greedy text (", there was a little girl named Lily. She loved to play outside ...")
     * without "girl" (one token, " girl") and without "play outside" (two): never written */
    char *plain_r = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,"
                              "\"temperature\":0}", auth);
    char *no_words = http_post(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,"
                               "\"temperature\":0,\"bad_words\":[\"girl\",\"play outside\"]}", auth);
    char plain_text[512] = "", no_words_text[512] = "";
    json_str(http_body(plain_r), "text", plain_text, sizeof plain_text);
    json_str(http_body(no_words), "text", no_words_text, sizeof no_words_text);
    CHECK(strstr(plain_text, ", there was a little girl named") == plain_text &&
          strstr(plain_text, "play outside") && http_status(no_words) == 200 &&
          strstr(no_words_text, ", there was a little ") == no_words_text && !strstr(no_words_text, "girl") &&
          !strstr(no_words_text, "play outside"),
          "serve: bad_words: \"%s\" then \"%s\"", plain_text, no_words_text);
    free(plain_r); free(no_words);
    /* allowed_token_ids [300]: the same text */
    forced = http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":4,\"temperature\":0.7,"
                       "\"seed\":5,\"allowed_token_ids\":[300]}", auth);
    strcpy(forced_text, "Once");
    json_str(http_body(forced), "text", forced_text + 4, sizeof forced_text - 4);
    CHECK(http_status(forced) == 200 && *want && !strcmp(forced_text, want),
          "serve: allowed_token_ids [300]: \"%s\" (want \"%s\"): %s", forced_text, want,
          forced ? forced : "");
    free(forced); free(four);
    /* a field neither OpenAI nor vLLM defines (or one of the other endpoint's) is ignored and said once */
    const char *unknown[] = {"{\"prompt\":\"Once\",\"max_tokens\":2,\"frobnicate\":1,\"a\\nb\":2}",
                             "{\"prompt\":\"Once\",\"max_tokens\":2,\"frobnicate\":{}}",
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":2,"
                             "\"frobnicate\":1,\"suffix\":\"x\"}"};
    for (int i = 0; i < 3; i++) {
        char *r = http_post(port, i == 2 ? "/v1/chat/completions" : "/v1/completions", unknown[i], auth);
        CHECK(http_status(r) == 200, "serve: an unknown field is ignored: %s", r ? r : "");
        free(r);
    }
    char *log = read_file(s.log, NULL);
    const char *line = "llm serve: ignoring unknown request field \"frobnicate\"\n";
    const char *once = log ? strstr(log, line) : NULL;
    CHECK(once && !strstr(once + 1, line) && strstr(log, "unknown request field \"a\\nb\"\n") &&
          strstr(log, "unknown request field \"suffix\"\n"), "serve: unknown fields logged once each: %s",
          log ? log : "");
    free(log);
    /* 401 without the key (or a wrong one); /health and /metrics stay open */
    r = http_post(port, "/v1/completions", "{\"prompt\":\"x\"}", NULL);
    CHECK(http_status(r) == 401 && strstr(r, "\"type\":\"authentication_error\""), "serve: 401: %s", r);
    free(r);
    r = http_post(port, "/v1/completions", "{\"prompt\":\"x\"}", "Authorization: Bearer sesamf\r\n");
    CHECK(http_status(r) == 401, "serve: a wrong key: %s", r);
    free(r);
    r = http_get(port, "/health", NULL);
    CHECK(http_status(r) == 200, "serve: /health without a key: %s", r);
    free(r);
    /* 404, 405, 413, 431 */
    r = http_get(port, "/v2/nothing", auth);
    CHECK(http_status(r) == 404 && strstr(r, "{\"error\":{\"message\":\"Not Found: /v2/nothing\""),
          "404: %s", r);
    free(r);
    r = http_get(port, "/v1/completions", auth);
    CHECK(http_status(r) == 405 && strstr(r, "\r\nAllow: POST\r\n"), "serve: 405: %s", r ? r : "");
    free(r);
    const char *huge = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sesame\r\n"
                       "Content-Length: 900000000\r\n\r\n";
    r = http_request_raw(port, huge, strlen(huge));
    CHECK(http_status(r) == 413 && strstr(r, "Connection: close\r\n"), "serve: 413: %s", r ? r : "");
    free(r);
    char *big = (char *)malloc(40000);
    int n = sprintf(big, "GET /health HTTP/1.1\r\nX-Big: ");
    memset(big + n, 'a', 20000); n += 20000;
    n += sprintf(big + n, "\r\n\r\n");
    r = http_request_raw(port, big, (size_t)n);
    CHECK(http_status(r) == 431, "serve: 431: %s", r ? r : "");
    free(r); free(big);
    /* a malformed request line */
    r = http_request_raw(port, "POST /v1/comp\0letions HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 53);
    CHECK(http_status(r) == 400, "serve: a NUL in the request line: %s", r ? r : "");
    free(r);
    r = http_request_raw(port, "HELLO\r\n\r\n", 9);
    CHECK(http_status(r) == 400 && strstr(r, "a malformed HTTP request"), "serve: garbage: %s", r ? r : "");
    free(r);
    /* slowloris: a request begun and not finished is cut off after --request-timeout */
    int fd = tcp_connect(port);
    double t0 = llm_now();
    const char *slow = "POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer sesame\r\nContent-Type: "
                       "application/json\r\nContent-Length: 100\r\n\r\n{\"pro";
    send_all(fd, slow, strlen(slow));
    r = recv_all(fd, 10, NULL);
    CHECK(http_status(r) == 408 && llm_now() - t0 < 8, "serve: a slow client is cut off: %s", r ? r : "");
    free(r); close(fd);
    /* Expect: 100-continue, as curl sends for large bodies */
    fd = tcp_connect(port);
    const char *head = "POST /tokenize HTTP/1.1\r\nAuthorization: Bearer sesame\r\nExpect: 100-continue\r\n"
                       "Content-Type: application/json\r\n"
                       "Content-Length: 14\r\nConnection: close\r\n\r\n";
    send_all(fd, head, strlen(head));
    size_t got;
    char *cont = recv_all(fd, 0.5, &got);
    send_all(fd, "{\"prompt\":\"a\"}", 14);
    r = recv_all(fd, 10, NULL);
    CHECK(cont && !strcmp(cont, "HTTP/1.1 100 Continue\r\n\r\n") && http_status(r) == 200,
          "serve: 100-continue: %s / %s", cont ? cont : "", r ? r : "");
    free(cont); free(r); close(fd);
    /* the server went on serving through all of it */
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":2}", auth);
    CHECK(http_status(r) == 200, "serve: still serving after the bad requests: %s", r ? r : "");
    free(r);
    CHECK(server_stop(&s) == 0, "serve: SIGTERM after errors: exit status 0");
}

/* Keep-alive with pipelining, a client that disconnects mid-stream, and 64 streaming clients at once. */
static void test_server_connections(void) {
    test_server s;
    if (server_start(&s, "") != 0) return;
    int port = s.port;
    /* three pipelined requests on one connection, sent at once: three responses in order */
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"temperature\":0}";
    char pipe_req[2048];
    int n = 0;
    for (int i = 0; i < 2; i++)
        n += sprintf(pipe_req + n,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" JSON_CT "Content-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    n += sprintf(pipe_req + n, "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    char *r = http_request_raw(port, pipe_req, (size_t)n);
    const char *first = r ? strstr(r, "HTTP/1.1 200 OK") : NULL;
    const char *second = first ? strstr(first + 1, "HTTP/1.1 200 OK") : NULL;
    const char *third = second ? strstr(second + 1, "HTTP/1.1 200 OK") : NULL;
    CHECK(first == r && second && third && strstr(first, "\", there was\"") < second &&
          strstr(second, "\", there was\"") < third && strstr(third, "\"object\":\"list\""),
          "serve: pipelined keep-alive requests: %s", r ? r : "");
    free(r);
    /* a client that leaves mid-stream: its request is aborted and every block comes back */
    double blocks = metric(port, "llm:kv_cache_blocks");
    int fd = tcp_connect(port);
    const char *long_body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":2000,\"ignore_eos\":true,"
                            "\"stream\":true}";
    char req[1024];
    n = sprintf(req, "POST /v1/completions HTTP/1.1\r\n" JSON_CT "Content-Length: %zu\r\n\r\n%s",
                strlen(long_body), long_body);
    send_all(fd, req, (size_t)n);
    char part[4096];
    ssize_t k = recv(fd, part, sizeof part, 0); /* the stream has begun */
    close(fd);
    double free_blocks = -1, aborted = -1;
    for (double t0 = llm_now(); llm_now() - t0 < 10; usleep(20000)) {
        free_blocks = metric(port, "llm:kv_cache_free_blocks");
        aborted = metric(port, "vllm:request_success_total");
        char *m = http_get(port, "/metrics", NULL);
        const char *a = m ? strstr(m, "engine=\"0\",finished_reason=\"abort\"} ") : NULL;
        aborted = a ? atof(strchr(a, '}') + 2) : -1;
        free(m);
        if (aborted == 1 && free_blocks == blocks) break;
    }
    CHECK(k > 0 && aborted == 1 && blocks > 0 && free_blocks == blocks,
          "serve: a client gone mid-stream: aborted %g, %g of %g blocks free", aborted, free_blocks, blocks);
    /* 64 streaming clients at once, each the same greedy text as alone */
    enum { N = 64 };
    static const char *prompts[4] = {"Once upon a time", "The cat", "Lily and Ben", "One day"};
    char alone[4][1024];
    for (int i = 0; i < 4; i++) {
        char b[512];
        snprintf(b, sizeof b, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}", prompts[i],
                 20 + 5 * i);
        r = http_post(port, "/v1/completions", b, NULL);
        json_str(http_body(r), "text", alone[i], sizeof alone[i]);
        free(r);
    }
    int fds[N];
    for (int c = 0; c < N; c++) {
        char b[512], rq[1024];
        snprintf(b, sizeof b, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stream\":true}",
                 prompts[c % 4], 20 + 5 * (c % 4));
        int m = snprintf(rq, sizeof rq, "POST /v1/completions HTTP/1.1\r\n" JSON_CT "Content-Length: %zu\r\n"
                         "Connection: "
                         "close\r\n\r\n%s", strlen(b), b);
        fds[c] = tcp_connect(port);
        if (fds[c] >= 0) send_all(fds[c], rq, (size_t)m);
    }
    int same = 0;
    for (int c = 0; c < N; c++) {
        char *resp = fds[c] >= 0 ? recv_all(fds[c], 60, NULL) : NULL;
        char *ev = resp ? dechunk(http_body(resp)) : NULL, text[1024], fin[16];
        int ne, dn;
        if (ev) sse_collect(ev, 0, 0, text, sizeof text, &ne, fin, &dn);
        if (ev && dn && !strcmp(fin, "length") && !strcmp(text, alone[c % 4])) same++;
        else if (ev) printf("    client %d: \"%s\" vs \"%s\"\n", c, text, alone[c % 4]);
        free(ev); free(resp);
        if (fds[c] >= 0) close(fds[c]);
    }
    CHECK(same == N, "serve: %d of %d concurrent streams give the text of their prompt alone", same, N);
    CHECK(metric(port, "llm:kv_cache_free_blocks") == blocks, "serve: all blocks free after the 64 streams");
    /* llm bench serve against it: every request succeeds, and the table by prompt length has its 4 rows */
    char cmd[512];
    int status;
    snprintf(cmd, sizeof cmd, "./llm bench serve --port %d --num-prompts 24 --max-concurrency 8 "
             "--input-len 8:64 --output-len 4:16 --seed 1 2>/dev/null", port);
    r = run_command(cmd, &status);
    const char *rows = r ? strstr(r, "Prompt len    Requests") : NULL;
    CHECK(status == 0 && r && strstr(r, "Successful requests:                     24\n") &&
          strstr(r, "Failed requests:                         0\n") && strstr(r, "Median TTFT (ms):") &&
          strstr(r, "P99 ITL (ms):") && rows && strstr(rows, "\n8-21 ") && strstr(rows, "\n50-64 "),
          "llm bench serve: %s", r ? r : "");
    free(r);
    /* SIGTERM with a request in flight: it finishes, then the server exits 0 */
    fd = tcp_connect(port);
    const char *slow = "{\"prompt\":\"Once\",\"max_tokens\":400,\"ignore_eos\":true}";
    n = sprintf(req, "POST /v1/completions HTTP/1.1\r\n" JSON_CT "Content-Length: %zu\r\n\r\n%s",
                strlen(slow), slow);
    send_all(fd, req, (size_t)n);
    usleep(20000);
    kill(s.pid, SIGTERM);
    r = recv_all(fd, 30, NULL);
    CHECK(http_status(r) == 200 && strstr(r, "\"completion_tokens\":400"),
          "serve: SIGTERM lets a request finish: %s", r ? r : "");
    free(r); close(fd);
    CHECK(server_stop(&s) == 0, "serve: exit status 0 after SIGTERM");
}

/* -----------------------------------------------------------------------------------------------------------
 * What each replica offers a load balancer: X-Request-Id, cached_tokens, the vLLM metrics routers read, and
 * draining on SIGTERM
 * -------------------------------------------------------------------------------------------------------- */
/* The value of response header name (given with its colon, e.g. "X-Request-Id:"), or "" */
static const char *http_header(const char *resp, const char *name, char *out, size_t cap) {
    const char *end = resp ? strstr(resp, "\r\n\r\n") : NULL, *p = resp ? strstr(resp, name) : NULL;
    size_t n = 0;
    if (p && p < end) {
        p += strlen(name);
        while (*p == ' ') p++;
        while (p[n] && p[n] != '\r' && n + 1 < cap) n++;
        memcpy(out, p, n);
    }
    out[n] = 0;
    return out;
}

static int starts_with(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

static int is_hex_id(const char *s) { /* a minted id: 32 lowercase hex digits */
    size_t n = strspn(s, "0123456789abcdef");
    return n == 32 && !s[n];
}

/* usage.prompt_tokens_details.cached_tokens of a response (the last one: a stream's usage chunk), or -1 */
static int cached_tokens(const char *resp) {
    const char *p = NULL;
    for (const char *q = resp; q && (q = strstr(q, "\"cached_tokens\":")); q++) p = q;
    return p ? atoi(p + strlen("\"cached_tokens\":")) : -1;
}

static void test_server_replica(void) {
    test_server s;
    if (server_start(&s, "--block-size 8") != 0) return;
    int port = s.port;
    char hdr[256], want[512], *r;
    /* X-Request-Id: echoed, and the OpenAI id is cmpl-{it} / chatcmpl-{it}, as vLLM names them */
    const char *once = "{\"prompt\":\"Once\",\"max_tokens\":2}";
    r = http_post(port, "/v1/completions", once, "X-Request-Id: lb-7f/a=1 b\r\n");
    CHECK(http_status(r) == 200 && strstr(r, "\r\nX-Request-Id: lb-7f/a=1 b\r\n") &&
          starts_with(http_body(r), "{\"id\":\"cmpl-lb-7f/a=1 b\",\"object\":\"text_completion\","),
          "serve: X-Request-Id echoed, the id cmpl-{it}: %s", r ? r : "");
    free(r);
    /* none sent: one minted, 32 hex digits, the same in the header and the id */
    r = http_post(port, "/v1/completions", once, NULL);
    http_header(r, "\r\nX-Request-Id:", hdr, sizeof hdr);
    snprintf(want, sizeof want, "{\"id\":\"cmpl-%s\",", hdr);
    CHECK(http_status(r) == 200 && is_hex_id(hdr) && starts_with(http_body(r), want),
          "serve: a minted X-Request-Id (%s): %s", hdr, r ? r : "");
    char first[256];
    snprintf(first, sizeof first, "%s", hdr);
    free(r);
    r = http_get(port, "/health", NULL);
    CHECK(http_status(r) == 200 && is_hex_id(http_header(r, "\r\nX-Request-Id:", hdr, sizeof hdr)) &&
          strcmp(hdr, first), "serve: /health has its own minted id (%s after %s): %s", hdr, first,
          r ? r : "");
    free(r);
    /* a bad one is replaced: too long, not ASCII, empty */
    char long_id[200], extra[300];
    memset(long_id, 'a', 129); long_id[129] = 0;
    const char *bad_ids[3] = {long_id, "caf\xc3\xa9", ""};
    for (int i = 0; i < 3; i++) {
        snprintf(extra, sizeof extra, "X-Request-Id: %s\r\n", bad_ids[i]);
        r = http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":1}", extra);
        http_header(r, "\r\nX-Request-Id:", hdr, sizeof hdr);
        snprintf(want, sizeof want, "{\"id\":\"cmpl-%s\",", hdr);
        CHECK(http_status(r) == 200 && is_hex_id(hdr) && starts_with(http_body(r), want),
              "serve: a bad X-Request-Id (%zu bytes) is replaced: %s", strlen(bad_ids[i]), r ? r : "");
        free(r);
    }
    memset(long_id, 'b', 128); long_id[128] = 0; /* 128 bytes: kept */
    snprintf(extra, sizeof extra, "X-Request-Id: %s\r\n", long_id);
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":1}", extra);
    CHECK(http_status(r) == 200 && !strcmp(http_header(r, "\r\nX-Request-Id:", hdr, sizeof hdr), long_id),
          "serve: a 128-byte X-Request-Id is kept: %s", r ? r : "");
    free(r);
    /* on errors: a 400 and a 404 echo it; a request too broken to read gets a minted one */
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":-1}",
                  "X-Request-Id: e-400\r\n");
    CHECK(http_status(r) == 400 && strstr(r, "\r\nX-Request-Id: e-400\r\n") &&
          strstr(http_body(r), "\"param\":\"max_tokens\""), "serve: a 400 carries the id: %s", r ? r : "");
    free(r);
    r = http_get(port, "/nowhere", "X-Request-Id: e-404\r\n");
    CHECK(http_status(r) == 404 && strstr(r, "\r\nX-Request-Id: e-404\r\n"),
          "serve: a 404 carries the id: %s", r ? r : "");
    free(r);
    r = http_request_raw(port, "GARBAGE\r\nX-Request-Id: e-bad\r\n\r\n", 33);
    CHECK(http_status(r) == 400 && is_hex_id(http_header(r, "\r\nX-Request-Id:", hdr, sizeof hdr)),
          "serve: a malformed request gets a minted id: %s", r ? r : "");
    free(r);
    /* a stream: the header, and every event's id */
    r = http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":3,\"n\":2,\"stream\":true}",
                  "X-Request-Id: s-1\r\n");
    char *ev = r ? dechunk(http_body(r)) : NULL;
    int events = 0, with_id = 0;
    for (const char *p = ev; p && (p = strstr(p, "data: {")); p++, events++)
        with_id += !strncmp(p, "data: {\"id\":\"cmpl-s-1\",", 23);
    CHECK(http_status(r) == 200 && strstr(r, "\r\nX-Request-Id: s-1\r\n") && events == 6 && with_id == 6 &&
          strstr(ev, "data: [DONE]\n\n"), "serve: a stream carries the id (%d of %d events): %s", with_id,
          events, r ? r : "");
    free(ev); free(r);

    /* cached_tokens: 0 the first time; then the prompt's full blocks but the last token's (block size 8) */
    const char *prompt = "Lily and Ben went to the park. They saw a big red ball and a little dog.";
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", prompt);
    r = http_post(port, "/tokenize", body, NULL);
    int n_prompt = r && strstr(r, "\"count\":") ? atoi(strstr(r, "\"count\":") + 8) : 0;
    free(r);
    int expect = (n_prompt - 1) / 8 * 8;
    double q0 = metric(port, "vllm:prefix_cache_queries_total");
    double h0 = metric(port, "vllm:prefix_cache_hits_total");
    double queue0 = metric(port, "vllm:request_queue_time_seconds_count");
    double ptok0 = metric(port, "vllm:request_prompt_tokens_sum");
    double gtok0 = metric(port, "vllm:request_generation_tokens_sum");
    double pre0 = metric(port, "vllm:request_prefill_time_seconds_count");
    double dec0 = metric(port, "vllm:request_decode_time_seconds_count");
    int got[6];
    const char *forms[4] = {"", "", ",\"stream\":true,\"stream_options\":{\"include_usage\":true}",
                            ",\"n\":3"};
    for (int i = 0; i < 4; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":4,\"ignore_eos\":true%s}", prompt,
                 forms[i]);
        r = http_post(port, "/v1/completions", body, NULL);
        got[i] = http_status(r) == 200 ? cached_tokens(r) : -2;
        free(r);
    }
    snprintf(body, sizeof body, "{\"prompt\":[\"%s\",\"%s\"],\"max_tokens\":1}", prompt, prompt);
    r = http_post(port, "/v1/completions", body, NULL);
    got[4] = http_status(r) == 200 ? cached_tokens(r) : -2;
    free(r);
    CHECK(n_prompt > 16 && got[0] == 0 && got[1] == expect && got[2] == expect && got[3] == expect &&
          got[4] == 2 * expect, "serve: completions' cached_tokens of a %d-token prompt: %d, %d, streamed "
          "%d, n=3 %d, two prompts %d (want 0, %d, %d, %d, %d)", n_prompt, got[0], got[1], got[2], got[3],
          got[4], expect, expect, expect, 2 * expect);
    /* the metrics moved with them: 6 engine requests (3 single, 1 with n = 3, 2 prompts of one request) */
    double q1 = metric(port, "vllm:prefix_cache_queries_total");
    double h1 = metric(port, "vllm:prefix_cache_hits_total");
    CHECK(q1 - q0 == 6 * n_prompt && h1 - h0 == 5 * expect,
          "serve: prefix cache counters +%g queries, +%g hits (want %d, %d)", q1 - q0, h1 - h0, 6 * n_prompt,
          5 * expect);
    CHECK(metric(port, "vllm:request_queue_time_seconds_count") - queue0 == 6 &&
          metric(port, "vllm:request_prefill_time_seconds_count") - pre0 == 6 &&
          metric(port, "vllm:request_decode_time_seconds_count") - dec0 == 6 &&
          metric(port, "vllm:request_prompt_tokens_sum") - ptok0 == 6 * n_prompt &&
          metric(port, "vllm:request_generation_tokens_sum") - gtok0 == 4 + 4 + 4 + 12 + 1 + 1,
          "serve: the per-request histograms count 6 engine requests, %d prompt and 26 generated tokens",
          6 * n_prompt);
    /* chat: the same, from the rendered conversation */
    const char *chat = "{\"messages\":[{\"role\":\"system\",\"content\":\"You tell short stories about a "
                       "cat.\"},{\"role\":\"user\",\"content\":\"Tell me one about the cat and the moon.\"}]";
    snprintf(body, sizeof body, "%s}", chat);
    r = http_post(port, "/tokenize", body, NULL);
    n_prompt = r && strstr(r, "\"count\":") ? atoi(strstr(r, "\"count\":") + 8) : 0;
    free(r);
    expect = (n_prompt - 1) / 8 * 8;
    for (int i = 0; i < 4; i++) {
        snprintf(body, sizeof body, "%s,\"max_tokens\":3%s}", chat, forms[i]);
        r = http_post(port, "/v1/chat/completions", body, NULL);
        got[i] = http_status(r) == 200 ? cached_tokens(r) : -2;
        free(r);
    }
    CHECK(n_prompt > 16 && got[0] == 0 && got[1] == expect && got[2] == expect && got[3] == expect,
          "serve: chat's cached_tokens of a %d-token conversation: %d, %d, streamed %d, n=3 %d (want 0, %d)",
          n_prompt, got[0], got[1], got[2], got[3], expect);

    /* chat (after the cache checks: its template's first tokens would be cached), n = 2: one id for both */
    r = http_post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                  "\"max_tokens\":2,\"n\":2}", "x-request-id: \"q\\uote\"\r\n");
    CHECK(http_status(r) == 200 && strstr(r, "\r\nX-Request-Id: \"q\\uote\"\r\n") &&
          starts_with(http_body(r), "{\"id\":\"chatcmpl-\\\"q\\\\uote\\\"\",\"object\":"
                                    "\"chat.completion\",") &&
          strstr(r, "\"index\":1,"), "serve: chat, n=2: chatcmpl-{X-Request-Id}, as JSON: %s", r ? r : "");
    free(r);

    /* /metrics: each name a router reads, with its type, and the cache's config */
    r = http_get(port, "/metrics", NULL);
    static const char *types[][2] = {
        {"vllm:num_requests_running", "gauge"}, {"vllm:num_requests_waiting", "gauge"},
        {"vllm:kv_cache_usage_perc", "gauge"}, {"vllm:prefix_cache_queries_total", "counter"},
        {"vllm:prefix_cache_hits_total", "counter"}, {"vllm:cache_config_info", "gauge"},
        {"vllm:request_queue_time_seconds", "histogram"}, {"vllm:request_prefill_time_seconds", "histogram"},
        {"vllm:request_decode_time_seconds", "histogram"},
        {"vllm:request_inference_time_seconds", "histogram"},
        {"vllm:request_prompt_tokens", "histogram"}, {"vllm:request_generation_tokens", "histogram"}};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        snprintf(want, sizeof want, "\n# TYPE %s %s\n%s", types[i][0], types[i][1], types[i][0]);
        CHECK(r && strstr(r, want), "serve: /metrics has %s, a %s", types[i][0], types[i][1]);
    }
    snprintf(want, sizeof want, "\nvllm:cache_config_info{block_size=\"8\",enable_prefix_caching=\"True\","
             "num_cpu_blocks=\"None\",num_gpu_blocks=\"%.0f\",engine=\"0\"} 1\n",
             metric(port, "llm:kv_cache_blocks"));
    CHECK(r && strstr(r, want) &&
          strstr(r, "\nvllm:request_queue_time_seconds_bucket{model_name=\"stories260K\",engine=\"0\","
                    "le=\"0.3\"} ") &&
          strstr(r, "\nvllm:request_prompt_tokens_bucket{model_name=\"stories260K\",engine=\"0\","
                    "le=\"2000.0\"} ") &&
          !strstr(r, "le=\"5000.0\"") && strstr(r, ",le=\"+Inf\"} "),
          "serve: the cache config and vLLM's buckets: %s", r ? r : "");
    /* the server's resident memory, as Prometheus's process collector names it: what the kernel says of the
     * server's process (read here a moment later: within a factor of 2) */
    const char *rss_key = "\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes ";
    const char *rss_line = r ? strstr(r, rss_key) : NULL;
    double rss = rss_line ? atof(rss_line + strlen(rss_key)) : -1, kernel_kib = -1;
    char status_path[64], line[256];
    snprintf(status_path, sizeof status_path, "/proc/%d/status", (int)s.pid);
    FILE *sf = fopen(status_path, "r");
    while (sf && fgets(line, sizeof line, sf)) if (!strncmp(line, "VmRSS:", 6)) kernel_kib = atof(line + 6);
    if (sf) fclose(sf);
    CHECK(rss > (1 << 20) && kernel_kib > 0 && rss < 2 * kernel_kib * 1024 && rss > 0.5 * kernel_kib * 1024,
          "serve: /metrics's process_resident_memory_bytes %.0f, the kernel's VmRSS %.0f KiB", rss,
          kernel_kib);
    free(r);

    /* llm bench serve --multi-turn 2:2: two conversations of two rounds (the second user joining 50 ms
     * after the first); the hit rate from /metrics, read twice here (as two replicas would be): the sums of
     * two equal deltas give the same rate */
    char cmd[512];
    int status;
    snprintf(cmd, sizeof cmd, "./llm bench serve --port %d --multi-turn 2:2 --request-rate 20 --system-words "
             "60 --turn-words 8:12 --output-len 4:6 --session-header --metrics-url "
             "http://127.0.0.1:%d/metrics --metrics-url http://127.0.0.1:%d 2>/dev/null", port, port, port);
    r = run_command(cmd, &status);
    const char *rate = r ? strstr(r, "\nPrefix cache hit rate:") : NULL;
    const char *hits = r ? strstr(r, "\nPrefix cache hits (tokens):") : NULL;
    double hit_rate = rate ? atof(rate + strlen("\nPrefix cache hit rate:")) : -1;
    CHECK(status == 0 && r && strstr(r, "Successful requests:                     4\n") &&
          strstr(r, "\nRound 1 requests:                        2\nRound 1 TTFT P50 (ms):") &&
          strstr(r, "\nRound 1 TTFT P90 (ms):") &&
          strstr(r, "\nRounds 2+ requests:                      2\n") &&
          strstr(r, "\nRounds 2+ TTFT P50 (ms):") && strstr(r, "\nRounds 2+ TTFT P90 (ms):") &&
          strstr(r, "\nReplicas read (/metrics):                2 of 2\n") && hits &&
          atof(hits + strlen("\nPrefix cache hits (tokens):")) > 0 && hit_rate > 0 && hit_rate <= 1 &&
          strstr(r, "\nCached prompt tokens (usage):"),
          "llm bench serve --multi-turn: hit rate %g: %s", hit_rate, r ? r : "");
    free(r);
    /* a flag that the other kind of workload reads is refused, naming it, before anything is sent */
    static const struct { const char *args, *why; } misfit[] = {
        {"--system-words 10", "--system-words applies only to --multi-turn"},
        {"--turn-words 3:4", "--turn-words applies only to --multi-turn"},
        {"--session-header", "--session-header applies only to --multi-turn"},
        {"--metrics-url http://127.0.0.1:1/metrics", "--metrics-url applies only to --multi-turn"},
        {"--multi-turn 2:2 --num-prompts 5", "--num-prompts does not apply to --multi-turn"},
        {"--input-len 8:9 --multi-turn 2:2", "--input-len does not apply to --multi-turn"},
        {"--multi-turn 2:2 --max-concurrency 4", "--max-concurrency does not apply to --multi-turn"},
        {"--multi-turn 2:2 --max-token-id 9", "--max-token-id does not apply to --multi-turn"},
    };
    for (size_t i = 0; i < sizeof misfit / sizeof *misfit; i++) {
        snprintf(cmd, sizeof cmd, "./llm bench serve --port %d %s 2>&1", port, misfit[i].args);
        r = run_command(cmd, &status);
        CHECK(r && status != 0 && strstr(r, misfit[i].why) && !strstr(r, "Successful requests"),
              "llm bench serve %s: refused with \"%s\": %s", misfit[i].args, misfit[i].why, r ? r : "");
        free(r);
    }
    CHECK(server_stop(&s) == 0, "serve: exit status 0");
}

/* SIGTERM drains: /health and new requests get 503 at once, the streams in flight run to [DONE], exit 0 */
static void test_server_drain(void) {
    test_server s;
    if (server_start(&s, "--drain-timeout 60") != 0) return;
    int fd = tcp_connect(s.port);
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":2000,\"ignore_eos\":true,\"n\":2,"
                       "\"stream\":true}";
    char req[512], part[4096];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\n" JSON_CT "Content-Length: %zu\r\n"
                     "X-Request-Id: "
                     "long-1\r\n\r\n%s", strlen(body), body);
    send_all(fd, req, (size_t)n);
    ssize_t k = recv(fd, part, sizeof part - 1, 0); /* the stream has begun */
    part[k > 0 ? k : 0] = 0;
    kill(s.pid, SIGTERM);
    char *health = http_get(s.port, "/health", NULL);
    char *gen = http_post(s.port, "/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
                          "X-Request-Id: late-1\r\n");
    char *metrics = http_get(s.port, "/metrics", NULL);
    const char *err = "{\"error\":{\"message\":\"the server is shutting down: it finishes the requests it "
                      "has and takes no new ones\",\"type\":\"service_unavailable_error\",\"param\":null,"
                      "\"code\":503}}";
    CHECK(http_status(health) == 503 && !strcmp(http_body(health), err) &&
          strstr(health, "\r\nConnection: close\r\n"),
          "serve, draining: /health is 503: %s", health ? health : "");
    CHECK(http_status(gen) == 503 && !strcmp(http_body(gen), err) &&
          strstr(gen, "\r\nX-Request-Id: late-1\r\n"),
          "serve, draining: a new request is 503: %s", gen ? gen : "");
    CHECK(http_status(metrics) == 200 && strstr(metrics, "\nvllm:num_requests_running{"),
          "serve, draining: /metrics still answers: %s", metrics ? metrics : "");
    free(health); free(gen); free(metrics);
    /* the stream goes on to its end */
    char *rest = recv_all(fd, 60, NULL);
    close(fd);
    size_t n_all = strlen(part) + (rest ? strlen(rest) : 0);
    char *all = (char *)malloc(n_all + 1);
    if (all) snprintf(all, n_all + 1, "%s%s", part, rest ? rest : "");
    char *ev = all ? dechunk(http_body(all)) : NULL;
    static char text[1 << 16]; /* the texts, unread: 2000 tokens */
    char fin0[16], fin1[16];
    int ne0, ne1, done;
    sse_collect(ev, 0, 0, text, sizeof text, &ne0, fin0, &done);
    sse_collect(ev, 1, 0, text, sizeof text, &ne1, fin1, &done);
    CHECK(k > 0 && !strcmp(fin0, "length") && !strcmp(fin1, "length") && done &&
          ev && n_all > 5 && !strcmp(all + n_all - 5, "0\r\n\r\n") &&
          strstr(all, "\r\nX-Request-Id: long-1\r\n"), "serve, draining: the stream runs to its end (%d + %d "
          "events, %s/%s, done %d): %.300s ... %s", ne0, ne1, fin0, fin1, done, all ? all : "",
          all && n_all > 300 ? all + n_all - 300 : "");
    free(ev); free(rest); free(all);
    int status = -1;
    for (double t0 = llm_now(); llm_now() - t0 < 60 && waitpid(s.pid, &status, WNOHANG) == 0;)
        usleep(10000);
    char *log = read_file(s.log, NULL);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0 && log &&
          strstr(log, "llm serve: SIGTERM: draining: /health and new requests get 503; 1 connections with "
                      "requests to finish (60 s at most)\n") &&
          strstr(log, "llm serve: cmpl-long-1 127.0.0.1: prompt 2 tokens (0 cached), output 4000 tokens, "),
          "serve, draining: exit 0 once the stream is done: %s", log ? log : "");
    free(log);
    if (!WIFEXITED(status)) { kill(s.pid, SIGKILL); waitpid(s.pid, NULL, 0); }
    remove(s.log);
}

/* -----------------------------------------------------------------------------------------------------------
 * Hostile clients: framing no proxy in front can read otherwise, bounded memory and CPU, CSRF
 * -------------------------------------------------------------------------------------------------------- */
/* A process's resident memory in KiB (VmRSS) and its CPU time in seconds (utime + stime), from /proc */
static double proc_rss_kib(pid_t pid) {
    char path[64], line[256];
    double kib = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) if (!strncmp(line, "VmRSS:", 6)) kib = atof(line + 6);
    if (f) fclose(f);
    return kib;
}
static double proc_cpu_s(pid_t pid) {
    char path[64], st[1024] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r"); /* (read_file cannot: a /proc file's size is 0) */
    if (f) { if (!fgets(st, sizeof st, f)) st[0] = 0; fclose(f); }
    const char *p = strrchr(st, ')'); /* the fields after the command's name */
    unsigned long long ut = 0, kt = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &kt) != 2)
        return -1;
    return (double)(ut + kt) / (double)sysconf(_SC_CLK_TCK);
}

/* A request sent in two parts, each its own TCP segment with a pause between (so the server reads the
 * first alone), then what comes back until the server closes or timeout_s passes. */
static char *http_split(int port, const char *req, size_t n, size_t cut, double timeout_s) {
    int fd = tcp_connect(port);
    if (fd < 0) return NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    send_all(fd, req, cut);
    usleep(10000);
    send_all(fd, req + cut, n - cut);
    char *out = recv_all(fd, timeout_s, NULL);
    close(fd);
    return out;
}

static int count_responses(const char *r) {
    int n = 0;
    for (const char *p = r; p && (p = strstr(p, "HTTP/1.1 ")); p++) n++;
    return n;
}

static const char *malformed(const char *why, char *out, size_t cap) { /* the 400 a broken head gets */
    snprintf(out, cap, "{\"error\":{\"message\":\"a malformed HTTP request: %s\",\"type\":"
             "\"invalid_request_error\",\"param\":null,\"code\":400}}", why);
    return out;
}

/* HTTP framing is read one way only: a chunked body split anywhere (in the size, an extension, the data,
 * the CRLFs, the trailer) decodes to the same request; a chunk whose data holds a whole request is data
 * (the smuggling of issue 50: one answer, not two); Content-Length with Transfer-Encoding, bare LF, obs-fold,
 * whitespace before a colon and the like get 400 and a close; a client that half-closes after its request
 * still gets the answer; chat's top_logprobs without logprobs is refused, naming it. */
static void test_server_http_framing(void) {
    test_server s;
    if (server_start(&s, "") != 0) return;
    int port = s.port;
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}";
    char *r = http_post(port, "/v1/completions", body, NULL), want[256], text[256], msg[512];
    json_str(http_body(r), "text", want, sizeof want);
    free(r);
    char req[1024];
    int head = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" JSON_CT
                        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    int n = head + snprintf(req + head, sizeof req - (size_t)head, "1A;name=\"a value\"\r\n%.26s\r\n"
                            "%zX\r\n%s\r\n0\r\nX-Trailer: yes\r\n\r\n", body, strlen(body) - 26, body + 26);
    int same = 0;
    char first_bad[600] = "";
    for (int cut = 1; cut < n; cut++) {
        r = http_split(port, req, (size_t)n, (size_t)cut, 30);
        json_str(http_body(r), "text", text, sizeof text);
        if (http_status(r) == 200 && !strcmp(text, want)) same++;
        else if (!first_bad[0]) snprintf(first_bad, sizeof first_bad, "split at %d: %.500s", cut, r ? r : "");
        free(r);
    }
    CHECK(*want && same == n - 1, "serve: a chunked request split at each of its %d positions: %d give "
          "\"%s\"; %s", n - 1, same, want, first_bad);
    int fd = tcp_connect(port), one = 1; /* and a byte at a time */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int i = 0; i < n; i++) { send_all(fd, req + i, 1); usleep(1000); }
    r = recv_all(fd, 30, NULL);
    close(fd);
    json_str(http_body(r), "text", text, sizeof text);
    CHECK(http_status(r) == 200 && !strcmp(text, want), "serve: a chunked request a byte at a time: %s",
          r ? r : "");
    free(r);
    /* smuggling: the first chunk's data is "0", an empty line and a request; sent, then the rest */
    const char *inner = "0\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    n = snprintf(req, sizeof req, "POST /tokenize HTTP/1.1\r\nHost: x\r\n" JSON_CT
                 "Transfer-Encoding: chunked\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n", strlen(inner), inner);
    r = http_split(port, req, (size_t)n, (size_t)n - 5, 2); /* kept alive: whatever comes within 2 s */
    CHECK(count_responses(r) == 1 && http_status(r) == 400 && !strstr(r, "\"object\":\"list\"") &&
          strstr(r, "the body is not valid JSON"),
          "serve: a chunk holding a request is data: one answer: %s", r ? r : "");
    free(r);
    /* broken framing: 400 with what is wrong, then the connection closes */
    static const struct { const char *req, *why; } broken[] = {
        {"POST /tokenize HTTP/1.1\r\nHost: x\r\n" JSON_CT "Content-Length: 5\r\n"
         "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "both Content-Length and Transfer-Encoding"},
        {"GET /health HTTP/1.1\nHost: x\n\n", "a bare LF (lines end in CRLF)"},
        {"GET /health HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n", "a bare LF (lines end in CRLF)"},
        {"GET /health HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n",
         "a header line folded onto the one before it (obs-fold)"},
        {"GET /health HTTP/1.1\r\nHost : x\r\n\r\n", "whitespace between a header's name and its colon"},
        {"GET /health HTTP/1.1\r\nX(A): b\r\n\r\n", "a header's name has a character a token cannot have"},
        {"GET /health HTTP/1.1\r\nX-A: a\x01z\r\n\r\n", "a control character in a header's value"},
        {"GET  /health HTTP/1.1\r\n\r\n", "the request line is not METHOD SP TARGET SP HTTP/1.x"},
        {"GET /health HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         "Transfer-Encoding in an HTTP/1.0 request"},
        {"POST /tokenize HTTP/1.1\r\n" JSON_CT "Transfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n",
         "whitespace after a chunk size"},
        {"POST /tokenize HTTP/1.1\r\n" JSON_CT "Transfer-Encoding: chunked\r\n\r\n5\r\nhello!\r\n0\r\n\r\n",
         "a chunk's data is longer than its size"},
        {"POST /tokenize HTTP/1.1\r\n" JSON_CT "Transfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n",
         "a bare LF (lines end in CRLF)"},
        {"POST /tokenize HTTP/1.1\r\n" JSON_CT "Transfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
         "a chunk size that is not a hex number"},
        {"POST /tokenize HTTP/1.1\r\n" JSON_CT "Transfer-Encoding: chunked\r\n\r\n0\r\nX: a\r\n b\r\n\r\n",
         "a header line folded onto the one before it (obs-fold)"},
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        fd = tcp_connect(port);
        send_all(fd, broken[i].req, strlen(broken[i].req));
        double t0 = llm_now();
        r = recv_all(fd, 10, NULL);
        close(fd);
        CHECK(http_status(r) == 400 && !strcmp(http_body(r), malformed(broken[i].why, msg, sizeof msg)) &&
              strstr(r, "\r\nConnection: close\r\n") && llm_now() - t0 < 5,
              "serve: %s -> 400 and a close: %s", broken[i].why, r ? r : "");
        free(r);
    }
    /* a half-close (nc -N): the answers still come */
    char post[512];
    n = snprintf(post, sizeof post, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" JSON_CT
                 "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
    const char *asks[2] = {"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", post};
    for (int i = 0; i < 2; i++) {
        fd = tcp_connect(port);
        send_all(fd, asks[i], strlen(asks[i]));
        shutdown(fd, SHUT_WR);
        r = recv_all(fd, 30, NULL);
        close(fd);
        json_str(http_body(r), "text", text, sizeof text);
        CHECK(http_status(r) == 200 && (i == 0 || !strcmp(text, want)), "serve: half-closed after %.20s: %s",
              asks[i], r ? r : "");
        free(r);
    }
    /* top_logprobs without logprobs: 400 (OpenAI's and vLLM's), 0 or with logprobs: fine */
    r = http_post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                  "\"max_tokens\":2,\"top_logprobs\":2}", NULL);
    CHECK(http_status(r) == 400 && !strcmp(http_body(r), "{\"error\":{\"message\":\"when using top_logprobs, "
          "logprobs must be set to true\",\"type\":\"invalid_request_error\",\"param\":\"top_logprobs\","
          "\"code\":400}}"), "serve: chat top_logprobs without logprobs: %s", r ? r : "");
    free(r);
    r = http_post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                  "\"max_tokens\":2,\"top_logprobs\":0,\"logprobs\":false}", NULL);
    CHECK(http_status(r) == 200, "serve: chat top_logprobs 0 without logprobs: %s", r ? r : "");
    free(r);
    CHECK(server_stop(&s) == 0, "serve: exit status 0 after the framing tests");
}

/* The finished requests of a reason (vllm:request_success_total{finished_reason=...}) */
static double finished(int port, const char *reason) {
    char *m = http_get(port, "/metrics", NULL), key[96];
    snprintf(key, sizeof key, ",finished_reason=\"%s\"} ", reason);
    const char *p = m ? strstr(m, key) : NULL;
    double v = p ? atof(p + strlen(key)) : -1;
    free(m);
    return v;
}

/* Memory a client can make the server hold is bounded: a client that pipelines GET /metrics and reads
 * nothing (issue 50: 680 KB sent, 403 MiB held), streams whose clients read nothing (each aborted once it
 * is 4 MiB behind, its blocks back), and bodies begun on many connections (past 64 MiB in all: 503). The
 * bounds are 4x what the fix holds (measured: +4, +13, +67 MiB) and under what the same load held before
 * (+170, +64, +150 MiB). */
static void test_server_backpressure(void) {
    test_server s;
    /* under AddressSanitizer freed memory waits in its quarantine (256 MiB) and counts in RSS: a small one */
    const char *shell = UNDER_ASAN ? "ASAN_OPTIONS=\"$ASAN_OPTIONS:quarantine_size_mb=1:"
                                     "allocator_release_to_os_interval_ms=50\" " : "";
    if (server_start_in(&s, shell, "") != 0) return;
    int port = s.port;
    free(http_get(port, "/metrics", NULL));
    free(http_post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":4}", NULL));
    double rss0 = proc_rss_kib(s.pid), blocks = metric(port, "llm:kv_cache_blocks");
    /* 8000 pipelined GET /metrics, never read */
    const char get[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    size_t n_all = 8000 * (sizeof get - 1), sent = 0;
    char *many = (char *)malloc(n_all);
    for (size_t i = 0; i < 8000; i++) memcpy(many + i * (sizeof get - 1), get, sizeof get - 1);
    int fd = tcp_connect(port);
    for (double t0 = llm_now(); sent < n_all && llm_now() - t0 < 5;) {
        ssize_t k = send(fd, many + sent, n_all - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) sent += (size_t)k; else usleep(10000);
    }
    usleep(1500000);
    double rss1 = proc_rss_kib(s.pid);
    char *h = http_get(port, "/health", NULL);
    CHECK(rss1 - rss0 < 32 * 1024 && http_status(h) == 200, "serve: a pipeliner that reads nothing (%zu "
          "bytes of GET /metrics sent): RSS %.0f -> %.0f KiB; /health: %d", sent, rss0, rss1, http_status(h));
    free(h); free(many);
    close(fd);
    /* 4 streams whose clients read nothing: each a burst of prompt logprobs (15 MB) and 200 tokens more */
    usleep(200000);
    rss0 = proc_rss_kib(s.pid);
    double aborted0 = finished(port, "abort"), length0 = finished(port, "length"), peak = rss0;
    char sbody[4096] = "{\"prompt\":\"", rq[8192];
    for (int i = 0; i < 25; i++)
        strcat(sbody, "Once upon a time there was a little girl named Lily. She loved to play outside. ");
    strcat(sbody, "\",\"max_tokens\":200,\"ignore_eos\":true,\"stream\":true,\"n\":16,\"echo\":true,"
                  "\"prompt_logprobs\":20}");
    int m = snprintf(rq, sizeof rq, "POST /v1/completions HTTP/1.1\r\n" JSON_CT "Content-Length: %zu\r\n"
                     "\r\n%s", strlen(sbody), sbody);
    int fds[4];
    for (int i = 0; i < 4; i++) {
        fds[i] = tcp_connect_buffered(port, 8192);
        send_all(fds[i], rq, (size_t)m);
    }
    double aborted = 0, free_blocks = -1;
    for (double t0 = llm_now(); llm_now() - t0 < 120; usleep(100000)) {
        double x = proc_rss_kib(s.pid);
        if (x > peak) peak = x;
        aborted = finished(port, "abort") - aborted0;
        if (aborted == 4 && (free_blocks = metric(port, "llm:kv_cache_free_blocks")) == blocks) break;
        if (finished(port, "length") - length0 == 4) break; /* the same load before the fix: all of it ran */
    }
    char *log = read_file(s.log, NULL);
    int behind = 0;
    for (const char *p = log; p && (p = strstr(p, "the client is more than 4 MiB behind its stream")); p++)
        behind++;
    /* each stream up to its 4 MiB in the server (the clients' small windows keep the rest there); under
     * ThreadSanitizer its shadow memory counts in RSS as much again (measured: 32.8 MiB) */
    double rss_bound = (UNDER_TSAN ? 2 : 1) * 32 * 1024;
    CHECK(peak - rss0 < rss_bound && aborted == 4 && free_blocks == blocks && behind == 4,
          "serve: 4 streams that nobody reads: RSS %.0f -> peak %.0f KiB, %g aborted (%d logged), %g of %g "
          "blocks free", rss0, peak, aborted, behind, free_blocks, blocks);
    free(log);
    for (int i = 0; i < 4; i++) close(fds[i]);
    /* 24 connections, each 6 MB of an 8 MB body: the server holds 64 MiB of them at most, then says 503 */
    usleep(200000);
    rss0 = proc_rss_kib(s.pid);
    enum { NB = 24 };
    int bfd[NB];
    char *chunk = (char *)malloc(6 << 20);
    memset(chunk, 'a', 6 << 20);
    const char *bhead = "POST /v1/completions HTTP/1.1\r\n" JSON_CT "Content-Length: 8000000\r\n\r\n"
                        "{\"prompt\":\"";
    /* ThreadSanitizer's shadow memory grows with the memory the program touches (the same load: +104 MiB) */
    double body_bound = (UNDER_TSAN ? 2 : 1) * 100 * 1024;
    for (int i = 0; i < NB; i++) {
        bfd[i] = tcp_connect(port);
        struct timeval tv = {2, 0};
        setsockopt(bfd[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (send_all(bfd[i], bhead, strlen(bhead)) == 0) send_all(bfd[i], chunk, 6 << 20);
    }
    usleep(500000);
    rss1 = proc_rss_kib(s.pid);
    int busy = 0;
    for (int i = 0; i < NB; i++) {
        char *b = recv_all(bfd[i], 0.05, NULL);
        busy += http_status(b) == 503 && strstr(b, "the server holds too many unfinished requests' bytes");
        free(b);
        close(bfd[i]);
    }
    free(chunk);
    h = http_get(port, "/health", NULL);
    CHECK(rss1 - rss0 < body_bound && busy >= NB - 12 && http_status(h) == 200, "serve: %d bodies of 6 MB "
          "begun: RSS %.0f -> %.0f KiB, %d got 503; /health %d", NB, rss0, rss1, busy, http_status(h));
    free(h);
    CHECK(server_stop(&s) == 0, "serve: exit status 0 after the backpressure tests");
}

/* At the fd limit (ulimit -n 200, 260 idle connections) the server neither spins on accept() nor floods
 * its log (issue 50: 100% of a core, 20 MB/s of one line), and serves again once the connections close. */
static void test_server_fd_limit(void) {
    test_server s;
    if (server_start_in(&s, "ulimit -n 200; ", "") != 0) return;
    enum { N = 260 };
    int fds[N], open_ = 0;
    size_t log0 = 0, log1 = 0;
    free(read_file(s.log, &log0));
    for (int i = 0; i < N; i++) open_ += (fds[i] = tcp_connect(s.port)) >= 0;
    usleep(1000000);
    double c0 = proc_cpu_s(s.pid), t0 = llm_now();
    usleep(3000000);
    double c1 = proc_cpu_s(s.pid), cpu = (c1 - c0) / (llm_now() - t0);
    char *log = read_file(s.log, &log1);
    CHECK(open_ == N && c0 >= 0 && c1 >= 0 && cpu < 0.3 && log1 - log0 < 65536 && log &&
          strstr(log, "llm serve: accept: Too many open files ("), "serve at the fd limit with %d idle "
          "connections: %.0f%% of a core, %zu bytes of log", open_, 100 * cpu, log1 - log0);
    free(log);
    for (int i = 0; i < N; i++) if (fds[i] >= 0) close(fds[i]);
    char *r = NULL;
    for (double t = llm_now(); llm_now() - t < 20 && http_status(r) != 200; usleep(100000)) {
        free(r);
        r = http_get(s.port, "/health", NULL);
    }
    CHECK(http_status(r) == 200, "serve: after the fd limit, /health again: %s", r ? r : "");
    free(r);
    CHECK(server_stop(&s) == 0, "serve: exit status 0 after the fd limit");
}

/* What a web page may make a browser send to a local llm serve: a POST that is not application/json (a
 * "simple" cross-site request) gets 415; no Access-Control-* header unless --allowed-origins lists the
 * page's origin (then a preflight is answered); with --api-key, a wrong key gets 401 from the headers, before
 * any of the body is read; and a stream whose client reads nothing for --request-timeout is aborted. */
static void test_server_cross_origin(void) {
    test_server s, k;
    if (server_start(&s, "") != 0) return;
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":2}";
    const char *e415 = "{\"error\":{\"message\":\"Unsupported Media Type: Only 'application/json' is "
                       "allowed\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":415}}";
    static const struct { const char *type; int status; } types[] = {
        {"text/plain", 415}, {"application/x-www-form-urlencoded", 415},
        {"multipart/form-data; boundary=x", 415},
        {NULL, 415}, {"application/jsonx", 415}, {"application/json; charset=utf-8", 200},
        {"Application/JSON", 200}, {"application/json ;charset=UTF-8", 200},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char req[512], ct[128] = "";
        if (types[i].type) snprintf(ct, sizeof ct, "Content-Type: %s\r\n", types[i].type);
        int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: "
                         "%zu\r\nOrigin: http://evil.example\r\nConnection: close\r\n\r\n%s", ct,
                         strlen(body), body);
        char *r = http_request_raw(s.port, req, (size_t)n);
        CHECK(http_status(r) == types[i].status && (types[i].status == 200 || !strcmp(http_body(r), e415)) &&
              !strstr(r, "Access-Control-"), "serve: a POST of %s -> %d: %s", types[i].type ? types[i].type :
              "no Content-Type", types[i].status, r ? r : "");
        free(r);
    }
    const char *pre = "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: %s\r\n"
                      "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, "
                      "content-type\r\nConnection: close\r\n\r\n";
    char req[1024];
    int n = snprintf(req, sizeof req, pre, "http://good.example");
    char *r = http_request_raw(s.port, req, (size_t)n);
    CHECK(http_status(r) == 405 && !strstr(r, "Access-Control-"), "serve: no preflight without "
          "--allowed-origins: %s", r ? r : "");
    free(r);
    CHECK(server_stop(&s) == 0, "serve: exit status 0 after the content-type tests");
    if (server_start(&k, "--api-key sesame --allowed-origins '[\"http://good.example\"]' "
                         "--request-timeout 1"))
        return;
    /* --allowed-origins: that origin gets the headers (errors and streams too) and its preflight */
    r = http_request_raw(k.port, req, (size_t)n);
    CHECK(http_status(r) == 200 &&
          strstr(r, "\r\nAccess-Control-Allow-Origin: http://good.example\r\nVary: Origin\r\n") &&
          strstr(r, "\r\nAccess-Control-Allow-Methods: POST, OPTIONS\r\n") &&
          strstr(r, "\r\nAccess-Control-Allow-Headers: authorization, content-type\r\n") &&
          strstr(r, "\r\nAccess-Control-Max-Age: 600\r\n"), "serve: a preflight from an allowed origin: %s",
          r ? r : "");
    free(r);
    n = snprintf(req, sizeof req, pre, "http://evil.example");
    r = http_request_raw(k.port, req, (size_t)n);
    CHECK(http_status(r) == 405 && !strstr(r, "Access-Control-"), "serve: a preflight from another origin: "
          "%s", r ? r : "");
    free(r);
    static const struct { const char *origin, *auth, *extra; int status, cors; } calls[] = {
        {"http://good.example", "sesame", "", 200, 1}, {"http://good.example", "nope", "", 401, 1},
        {"http://good.example", "sesame", ",\"stream\":true", 200, 1},
        {"http://evil.example", "sesame", "", 200, 0},
        {"http://good.example.evil", "sesame", "", 200, 0},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        char b[256], h[256];
        snprintf(b, sizeof b, "{\"prompt\":\"Once\",\"max_tokens\":2%s}", calls[i].extra);
        snprintf(h, sizeof h, "Origin: %s\r\nAuthorization: Bearer %s\r\n", calls[i].origin, calls[i].auth);
        r = http_post(k.port, "/v1/completions", b, h);
        const char *vary = r ? strstr(r, "\r\nVary: Origin\r\n") : NULL;
        int cors = vary && vary < strstr(r, "\r\n\r\n") &&
                   strstr(r, "\r\nAccess-Control-Allow-Origin: http://good.example\r\n");
        CHECK(http_status(r) == calls[i].status && cors == calls[i].cors &&
              (cors || !strstr(r, "Access-Control-")), "serve --allowed-origins: %s from %s: %s", b,
              calls[i].origin, r ? r : "");
        free(r);
    }
    /* a wrong key with a huge Content-Length: 401 at once, from the headers, and the connection closes */
    static const char *huge[2] = {"8000000", "900000000"};
    for (int i = 0; i < 2; i++) {
        n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer nope\r\n"
                     JSON_CT "Content-Length: %s\r\n\r\n", huge[i]);
        int fd = tcp_connect(k.port);
        send_all(fd, req, (size_t)n);
        double t0 = llm_now();
        r = recv_all(fd, 10, NULL);
        close(fd);
        CHECK(http_status(r) == 401 && strstr(r, "\r\nConnection: close\r\n") && llm_now() - t0 < 0.9,
              "serve: a wrong key with Content-Length %s: 401 before the body (%.2f s): %s", huge[i],
              llm_now() - t0, r ? r : "");
        free(r);
    }
    /* a stream whose client takes no byte for --request-timeout (1 s) is aborted, its blocks back */
    double blocks = metric(k.port, "llm:kv_cache_blocks");
    char sbody[4096] = "{\"prompt\":\"", sreq[8192];
    for (int i = 0; i < 25; i++)
        strcat(sbody, "Once upon a time there was a little girl named Lily. She loved to play outside. ");
    strcat(sbody, "\",\"max_tokens\":1200,\"ignore_eos\":true,\"stream\":true,\"n\":4,\"prompt_logprobs\":20,"
                  "\"logprobs\":20}");
    n = snprintf(sreq, sizeof sreq, "POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer sesame\r\n"
                 JSON_CT "Content-Length: %zu\r\n\r\n%s", strlen(sbody), sbody);
    int fd = tcp_connect_buffered(k.port, 8192);
    send_all(fd, sreq, (size_t)n);
    double t0 = llm_now(), aborted = -1, free_blocks = -1, length0 = finished(k.port, "length");
    for (; llm_now() - t0 < 60; usleep(100000)) {
        aborted = finished(k.port, "abort");
        if (aborted == 1 && (free_blocks = metric(k.port, "llm:kv_cache_free_blocks")) == blocks) break;
        if (finished(k.port, "length") > length0) break; /* before the fix: it ran to its end */
    }
    double took = llm_now() - t0;
    close(fd);
    char *log = read_file(k.log, NULL);
    CHECK(aborted == 1 && free_blocks == blocks && log && strstr(log, "127.0.0.1: the client took no "
          "response bytes for 1 s: connection closed, request aborted\n"),
          "serve: a stream nobody reads for 1 s: aborted %g after %.1f s, %g of %g blocks free", aborted,
          took, free_blocks, blocks);
    free(log);
    /* the comma-separated form; a list that is not one stops the server at its start */
    test_server c;
    if (server_start(&c, "--allowed-origins 'http://a.example, http://good.example'") == 0) {
        r = http_post(c.port, "/tokenize", "{\"prompt\":\"Once\"}", "Origin: http://good.example\r\n");
        CHECK(http_status(r) == 200 && strstr(r, "\r\nAccess-Control-Allow-Origin: http://good.example\r\n"),
              "serve --allowed-origins 'a, b': %s", r ? r : "");
        free(r);
    }
    server_stop(&c);
    char cmd[512];
    int status;
    snprintf(cmd, sizeof cmd, "./llm serve -m %s --port 0 --allowed-origins '[1]' 2>&1",
             model_path("stories260K.gguf"));
    r = run_command(cmd, &status);
    CHECK(status == 1 && r && strstr(r, "llm serve: --allowed-origins: give a JSON list of strings, or "
          "origins separated by commas\n"), "serve --allowed-origins '[1]': %d: %s", status, r ? r : "");
    free(r);
    CHECK(server_stop(&k) == 0, "serve: exit status 0 after the cross-origin tests");
}

static int doc_page_cmp(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

/* The pages a reader is pointed to: README.md, then the .md files of docs/ in name order (names[0] is
 * README.md). */
static int doc_pages(char names[][64], int max) {
    int n = 0;
    snprintf(names[n++], 64, "README.md");
    DIR *d = opendir("docs");
    for (struct dirent *e; d && (e = readdir(d)) != NULL && n < max;) {
        size_t len = strlen(e->d_name);
        if (len > 3 && len < 58 && !strcmp(e->d_name + len - 3, ".md"))
            snprintf(names[n++], 64, "docs/%s", e->d_name);
    }
    if (d) closedir(d);
    qsort(names + 1, (size_t)(n - 1), sizeof names[0], doc_page_cmp);
    return n;
}

/* The commands of one page's ```sh blocks, run as test_readme says; adds to *found and *ran. The page's own
 * llm serve (if any) serves its later commands and is stopped at the page's end. */
static void readme_run_page(const char *page, int *found, int *ran) {
    char *md = read_file(page, NULL);
    if (!md) { CHECK(0, "read %s", page); return; }
    char *cmds[64], *expect[64];
    int n = 0, in_sh = 0;
    for (char *line = md, *next; line && *line && n < 64; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!strncmp(line, "```", 3)) { in_sh = !in_sh && !strcmp(line, "```sh"); continue; }
        if (!in_sh || !line[0]) continue;
        if (!strncmp(line, "# prints: ", 10)) { if (n) expect[n - 1] = line + 10; continue; }
        if (line[0] == '#') continue;
        /* a command, with its continuation lines (ending in a backslash) */
        size_t cap = 4096, len = 0;
        char *cmd = (char *)calloc(1, cap);
        for (;;) {
            len += (size_t)snprintf(cmd + len, cap - len, "%s\n", line);
            if (len < 2 || cmd[len - 2] != '\\' || !next) break;
            line = next; next = strchr(line, '\n');
            if (next) *next++ = 0;
        }
        cmd[len - 1] = 0;
        char *comment = strstr(cmd, "  #"); /* a comment after the command */
        if (comment) *comment = 0;
        for (len = strlen(cmd); len > 0 && cmd[len - 1] == ' '; len--) cmd[len - 1] = 0;
        expect[n] = NULL;
        cmds[n++] = cmd;
    }
    *found += n;
    test_server srv = {0, 0, ""};
    char port[16] = "";
    for (int i = 0; i < n; i++) {
        char cmd[8192], *c = cmds[i];
        /* MODEL.gguf -> a real file */
        const char *model = strstr(c, "llm chat") ? CHAT_MODEL : "testdata/models/stories260K.gguf";
        char *m = strstr(c, "MODEL.gguf");
        if (m) snprintf(cmd, sizeof cmd, "%.*s%s%s", (int)(m - c), c, model, m + strlen("MODEL.gguf"));
        else snprintf(cmd, sizeof cmd, "%s", c);
        /* port 8000 -> the port the page's llm serve got */
        for (char *p8; port[0] && (p8 = strstr(cmd, "8000")) != NULL;) {
            char rest[8192];
            snprintf(rest, sizeof rest, "%s", p8 + 4);
            snprintf(p8, sizeof cmd - (size_t)(p8 - cmd), "%s%s", port, rest);
        }
        const char *stdin_from = "";
        if (!strcmp(cmd, "make test")) continue;
        if (!strncmp(cmd, "curl ", 5) && system("command -v curl >/dev/null 2>&1") != 0) {
            printf("    %s: no curl on this machine: not run: %s\n", page, cmd);
            continue;
        }
        if (!strncmp(cmd, "./llm serve", 11)) {
            char *p = strstr(cmd, "--port 8000");
            if (!p) { CHECK(0, "%s: llm serve without --port 8000: %s", page, cmd); continue; }
            if (srv.pid > 0) { CHECK(0, "%s: a second llm serve: %s", page, cmd); continue; }
            snprintf(srv.log, sizeof srv.log, "llm-test-readme-serve-%d.log", (int)getpid());
            char run[8192];
            snprintf(run, sizeof run, "exec %.*s--port 0%s 2>%s", (int)(p - cmd), cmd, p + 11, srv.log);
            srv.pid = fork();
            if (srv.pid == 0) { execl("/bin/sh", "sh", "-c", run, (char *)NULL); _exit(127); }
            for (double t0 = llm_now(); srv.pid > 0 && llm_now() - t0 < 60 && !srv.port; usleep(20000)) {
                char *log = read_file(srv.log, NULL);
                const char *at = log ? strstr(log, "listening on http://127.0.0.1:") : NULL;
                if (at) srv.port = atoi(at + strlen("listening on http://127.0.0.1:"));
                free(log);
            }
            CHECK(srv.port > 0, "%s: %s starts and listens", page, cmd);
            snprintf(port, sizeof port, "%d", srv.port);
            (*ran)++;
            continue;
        }
        if (strstr(cmd, "llm bench serve") || strstr(cmd, "--dummy tiny"))
            strncat(cmd, " --num-prompts 8 --output-len 8:16", sizeof cmd - strlen(cmd) - 1);
        if (!strcmp(cmd, "make run") || (strstr(cmd, "llm chat") && !strchr(cmd, '|')))
            stdin_from = " </dev/null";
        char run[8400];
        const char *clean_env = !strncmp(cmd, "make ", 5) ? "env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS " : "";
        snprintf(run, sizeof run, "%s%s%s 2>llm-test-readme.err", clean_env, cmd, stdin_from);
        int status;
        char *out = run_command(run, &status);
        /* what the page shows, with or without the newline that ends it (llm -p writes none) */
        size_t out_len = out ? strlen(out) : 0;
        if (out_len && out[out_len - 1] == '\n') out[--out_len] = 0;
        int shown_ok = !expect[i] || (out && !strcmp(out, expect[i]));
        int quiet_ok = stdin_from[0] ? out && !out[0] : 1;
        char *err = read_file("llm-test-readme.err", NULL);
        CHECK(out && status == 0 && shown_ok && quiet_ok, "%s: %s\n    (run as: %s): exit %d, stdout "
              "\"%.400s\"%s%s\n    stderr: %.600s", page, c, run, status, out ? out : "",
              expect[i] ? ", the page shows: " : "", expect[i] ? expect[i] : "", err ? err : "");
        free(out); free(err);
        (*ran)++;
    }
    if (srv.pid > 0) CHECK(server_stop(&srv) == 0, "%s: llm serve exits 0 after SIGTERM", page);
    for (int i = 0; i < n; i++) free(cmds[i]);
    free(md);
}

/* Every command of the ```sh blocks of README.md and of the pages in docs/, run as a user runs it from a
 * clone, checking its exit status and, where a line "# prints: TEXT" follows it, its stdout exactly: the
 * pages and the program cannot drift apart. Read from the files, so a new example is tested as well. A shell
 * command that a test cannot run (a GPU, root, the network, an hour) goes in a ```console block instead.
 * MODEL.gguf stands for the default chat model in a chat, else for stories260K. Run in a short form, each
 * for a reason:
 *   make test             skipped: it is what runs this test
 *   make run, llm chat    interactive: stdin from /dev/null, so the chat ends at once (stdout must be empty:
 *                         make run leaves stdout to the chat); make runs with a clean environment (no
 *                         MAKEFLAGS from the make that runs the tests), as from a shell
 *   llm serve             on --port 0 (8000 may be taken), in the background, one a page; the page's
 *                         commands after it that name port 8000 get its port; SIGTERM stops it at
 *                         the page's end
 *   llm bench serve, llm bench --dummy tiny   --num-prompts 8 --output-len 8:16 added (the last flag
 *                         wins): minutes else
 *   curl                  skipped when the machine has no curl */
static void test_readme(void) {
    char pages[64][64];
    int n_pages = doc_pages(pages, 64), found = 0, ran = 0;
    for (int i = 0; i < n_pages; i++) {
        int f = 0, r = 0;
        readme_run_page(pages[i], &f, &r);
        if (f) printf("    %s: %d of %d commands run\n", pages[i], r, f);
        found += f; ran += r;
    }
    remove("llm-test-readme.err");
    /* README.md's own: make run, make test, a chat, one prompt, the server with curl and bench serve, ... */
    CHECK(found >= 25, "README.md and docs/: %d commands found in their sh blocks", found);
    printf("    %d of %d commands run\n", ran, found);
}

/* GitHub's anchor of a heading: lower case, spaces to '-', nothing but letters, digits, '-' and '_' kept. */
static void heading_anchor(const char *heading, char *out, size_t cap) {
    size_t n = 0;
    for (const char *p = heading; *p && n + 1 < cap; p++) {
        unsigned char ch = (unsigned char)*p;
        if (isalnum(ch) || ch == '-' || ch == '_' || ch >= 0x80) out[n++] = (char)tolower(ch);
        else if (ch == ' ') out[n++] = '-';
    }
    out[n] = 0;
}

/* Whether the page at path has a heading whose anchor is frag. */
static int page_has_anchor(const char *path, const char *frag) {
    char *md = read_file(path, NULL);
    int found = 0, in_code = 0;
    for (char *line = md, *next; line && *line && !found; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!strncmp(line, "```", 3)) in_code = !in_code;
        if (in_code || line[0] != '#') continue;
        char anchor[256];
        heading_anchor(line + strspn(line, "#") + 1, anchor, sizeof anchor);
        found = !strcmp(anchor, frag);
    }
    free(md);
    return found;
}

/* The README guides and the pages hold the detail: README.md stays under 300 lines and links every page of
 * docs/, each page opens with its summary paragraph, and every link of README.md and docs/ (a file, or a
 * heading of a page) and every results/ log they name is there. */
static void test_readme_pages(void) {
    char pages[64][64];
    int n_pages = doc_pages(pages, 64);
    char *readme = read_file("README.md", NULL);
    if (!readme) { CHECK(0, "read README.md"); return; }
    int lines = 0;
    for (const char *p = readme; *p; p++) lines += *p == '\n';
    CHECK(lines < 300, "README.md: %d lines, fewer than 300 wanted (the details go to docs/)", lines);
    CHECK(n_pages > 1, "docs/: %d pages", n_pages - 1);
    for (int i = 1; i < n_pages; i++) {
        char link[80];
        snprintf(link, sizeof link, "](%s)", pages[i]);
        CHECK(strstr(readme, link) != NULL, "README.md links %s", pages[i]);
    }
    int links = 0, logs = 0;
    for (int i = 0; i < n_pages; i++) {
        char *md = read_file(pages[i], NULL);
        if (!md) { CHECK(0, "read %s", pages[i]); continue; }
        /* a page opens with "# Title", a blank line, then a paragraph */
        const char *nl = strchr(md, '\n');
        if (i > 0)
            CHECK(!strncmp(md, "# ", 2) && nl && nl[1] == '\n' &&
                  (isalpha((unsigned char)nl[2]) || nl[2] == '`'),
                  "%s opens with a title, a blank line and its summary paragraph", pages[i]);
        const char *dir = i == 0 ? "" : "docs/";
        for (const char *p = md; (p = strstr(p, "](")) != NULL;) {
            p += 2;
            size_t len = strcspn(p, ")");
            char target[512], path[600], frag[256] = "";
            snprintf(target, sizeof target, "%.*s", (int)len, p);
            if (!strncmp(target, "http://", 7) || !strncmp(target, "https://", 8)) continue;
            char *hash = strchr(target, '#');
            if (hash) { snprintf(frag, sizeof frag, "%s", hash + 1); *hash = 0; }
            if (target[0]) snprintf(path, sizeof path, "%s%s", dir, target);
            else snprintf(path, sizeof path, "%.63s", pages[i]);
            links++;
            CHECK(access(path, F_OK) == 0, "%s links %s: it is there", pages[i], path);
            if (frag[0])
                CHECK(page_has_anchor(path, frag), "%s links %s#%s: the heading is there", pages[i], path,
                      frag);
        }
        for (const char *p = md; (p = strstr(p, "results/")) != NULL;) {
            size_t len = strspn(p + 8, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-");
            char path[300];
            snprintf(path, sizeof path, "results/%.*s", (int)len, p + 8);
            p += 8;
            if (len < 5 || strcmp(path + strlen(path) - 4, ".log")) continue;
            logs++;
            CHECK(access(path, R_OK) == 0, "%s names %s: it is there", pages[i], path);
        }
        free(md);
    }
    printf("    README.md: %d lines; %d pages in docs/; %d links and %d results/ logs checked\n", lines,
           n_pages - 1, links, logs);
    free(readme);
}

/* The section names ("1. GGUF" .. "Appendix") of the lines that begin with prefix between from and to; with
 * ruled set, only those right under a rule ("/" "* ====" or "/" "* ----": a section's heading), so that a
 * numbered list in a comment is not taken for sections */
static int header_sections(const char *h, const char *from, const char *to, const char *prefix, int ruled,
                           char names[][16]) {
    const char *p = strstr(h, from), *end = p ? strstr(p, to) : NULL, *last = NULL;
    int n = 0;
    for (; p && p < end && n < 16; last = p, p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        size_t k = strlen(prefix);
        if (strncmp(p, prefix, k) != 0) continue;
        if (ruled && !(last && (!strncmp(last, "/* ====", 7) || !strncmp(last, "/* ----", 7)))) continue;
        const char *w = p + k;
        while (*w == ' ') w++;
        const char *digits = w;
        while (*w >= '0' && *w <= '9') w++;
        if (w > digits && w[0] == '.' && w[1] == ' ') w += 2;
        else if (strncmp(w = digits, "Appendix", 8) != 0) continue;
        int len = 0;
        while (len < 15 && (isalpha((unsigned char)w[len]))) len++;
        memcpy(names[n], w, (size_t)len); names[n][len] = 0;
        n++;
    }
    return n;
}

/* The optional layers leave the core whole (make test's core build: LLM_NO_GRAMMAR, LLM_NO_SIMD, no -march,
 * and the core's tests). Without the grammar layer a request with a grammar is refused by name, never run
 * unconstrained; with it, the same request runs and its output follows the grammar. */
static void test_layers(void) {
    llm_engine *e = stories_engine();
    if (!e) return;
    char err[LLM_ERR_LEN] = "";
    llm_sampling_params p = greedy(8);
    p.grammar = "root ::= (\"yes\" | \"no\") \".\"";
    uint64_t id = llm_engine_add_request(e, "Once upon a time", NULL, 0, &p, NULL, err);
#ifdef LLM_NO_GRAMMAR
    CHECK(id == 0 && strstr(err, "LLM_NO_GRAMMAR") && llm_grammar_parse("root ::= \"a\"", err) == NULL,
          "a build without grammars refuses a grammar: id %llu, \"%s\"", (unsigned long long)id, err);
#else
    char text[64] = "";
    for (int steps = 0; id && llm_engine_has_work(e) && steps < 50; steps++) {
        const llm_output *out;
        int n = llm_engine_step(e, &out);
        for (int i = 0; i < n; i++) /* (an output's text is text_len bytes, not a C string) */
            if (out[i].text_len < (int)(sizeof text - strlen(text)))
                strncat(text, out[i].text, (size_t)out[i].text_len);
    }
    CHECK(id && (!strcmp(text, "yes.") || !strcmp(text, "no.")), "a grammar request: %llu, \"%s\" (%s)",
          (unsigned long long)id, text, err);
#endif
    CHECK(all_blocks_free(e), "layers: all blocks back");
    llm_engine_destroy(e);
#if defined(LLM_NO_SIMD) && (defined(LLM_CPU_SIMD) || defined(LLM_AVX2))
    CHECK(0, "LLM_NO_SIMD, yet SIMD kernels were compiled");
#endif
}

/* Whole-line comments in text (lines holding comment text and no code, as the issue counts them): a plain
 * scanner of C's comments and string literals */
static int comment_line_flags(const char *text, int n_lines, char *is_comment) {
    int in_block = 0, line = 0, has = 0, code = 0;
    for (const char *p = text; *p && line < n_lines; p++) {
        if (*p == '\n') { is_comment[line++] = has && !code; has = in_block; code = 0; continue; }
        if (in_block) { has = 1; if (p[0] == '*' && p[1] == '/') { in_block = 0; p++; } continue; }
        if (p[0] == '/' && p[1] == '*') { in_block = has = 1; p++; continue; }
        if (p[0] == '/' && p[1] == '/') { has = 1; while (p[1] && p[1] != '\n') p++; continue; }
        if (*p == '"' || *p == '\'') { /* a literal: code, and no comment inside it */
            char q = *p;
            code = 1;
            while (p[1] && p[1] != q && p[1] != '\n') p += p[1] == '\\' && p[2] ? 2 : 1;
            if (p[1] == q) p++;
            continue;
        }
        if (!isspace((unsigned char)*p)) code = 1;
    }
    return line;
}

/* Lines in [from, to) of text's flagged lines, and how many of them are comments */
static int count_flags(const char *flags, int from, int to, int *n_comments) {
    *n_comments = 0;
    for (int i = from; i < to; i++) *n_comments += flags[i];
    return to - from;
}

/* The sources read as the style says: no line past 110 characters (UTF-8 characters, not bytes) in the code,
 * the tests, the tools and the build. Prints the core's size and comment share (llm.h's sections 1 to 10 of
 * the implementation, the serving engine a reader came for) beside the layers', as issue 51 measures them. */
static void test_source_shape(void) {
    const char *patterns[] = {"llm.h", "llm.cu", "main.c", "server.c", "test.c", "Makefile", ".ci/run",
                              "fuzz/*.[ch]", "tools/*.py", "tools/*.sh", "models/*.sh"};
    int n_files = 0;
    for (size_t k = 0; k < sizeof patterns / sizeof patterns[0]; k++) {
        glob_t g;
        if (glob(patterns[k], 0, NULL, &g) != 0) { CHECK(0, "no file matches %s", patterns[k]); continue; }
        for (size_t f = 0; f < g.gl_pathc; f++, n_files++) {
            char *text = read_file(g.gl_pathv[f], NULL);
            int line = 1, width = 0, worst = 0, worst_line = 0, n_long = 0;
            for (const char *p = text; p && *p; p++) {
                if (*p == '\n') { n_long += width > 110; line++; width = 0; continue; }
                if (((unsigned char)*p & 0xC0) != 0x80) width++; /* a character's first byte */
                if (width > worst) { worst = width; worst_line = line; }
            }
            n_long += width > 110;
            CHECK(text && n_long == 0, "%s: %d lines past 110 characters (the widest: line %d, %d)",
                  g.gl_pathv[f], n_long, worst_line, worst);
            free(text);
        }
        globfree(&g);
    }
    CHECK(n_files >= 20, "%d source files checked for their width", n_files);
    /* the implementation's sections: where each begins */
    char *h = read_file("llm.h", NULL);
    if (!h) { CHECK(0, "read llm.h"); return; }
    int n_lines = 0;
    for (const char *p = h; *p; p++) n_lines += *p == '\n';
    char *flags = (char *)calloc((size_t)n_lines + 1, 1);
    comment_line_flags(h, n_lines, flags);
    int starts[32], n_sections = 0, line = 0, impl = 0, core_end = 0;
    for (const char *p = h; *p && n_sections < 31; p = strchr(p, '\n') + 1, line++) {
        if (!strncmp(p, "#ifdef LLM_IMPLEMENTATION", 25)) impl = 1;
        const char *next = strchr(p, '\n');
        if (!next) break;
        if (impl && !strncmp(p, "/* =====", 8) && !strncmp(next + 1, " * ", 3) &&
            isdigit((unsigned char)next[4])) {
            if (atoi(next + 4) == 11) core_end = n_sections;
            starts[n_sections++] = line;
        }
    }
    starts[n_sections] = n_lines;
    /* the docs block's sizes ("1 GGUF 480, 2 Model 440, ..."): each within a fifth of the section's lines */
    const char *sizes = strstr(h, "Their sizes in the implementation");
    const char *end = sizes ? strstr(sizes, "\n *\n") : NULL;
    int n_sizes = 0, n_wrong = 0;
    for (const char *p = sizes; p && p < end; p++) {
        int k, said, used = 0;
        char name[32];
        if (!isdigit((unsigned char)*p) || isdigit((unsigned char)p[-1]) ||
            sscanf(p, "%d %31[A-Za-z] %d%n", &k, name, &said, &used) != 3 || k < 1 || k > n_sections)
            continue;
        int lines = (k < n_sections ? starts[k] : n_lines) - starts[k - 1];
        n_sizes++;
        if (said < lines * 0.8 || said > lines * 1.2) {
            n_wrong++;
            printf("    %d %s: said %d lines, has %d\n", k, name, said, lines);
        }
        p += used - 1;
    }
    CHECK(n_sizes == n_sections && n_wrong == 0, "llm.h's docs block: %d of %d sections' sizes said, %d of "
          "them off by more than a fifth", n_sizes, n_sections, n_wrong);
    int c_core, c_layers, c_all;
    int core = count_flags(flags, starts[0], starts[core_end], &c_core);
    int layers = count_flags(flags, starts[core_end], starts[n_sections], &c_layers);
    count_flags(flags, 0, n_lines, &c_all);
    CHECK(n_sections >= 13 && core_end == 10, "llm.h: %d numbered sections in the implementation, the core's "
          "ending at %d", n_sections, core_end);
    printf("  llm.h: the core (sections 1-10) %d lines, %.1f%% comments; the layers and the appendix "
           "after it %d lines, %.1f%%; the whole header %d lines, %.1f%%\n", core, 100.0 * c_core / core,
           layers, 100.0 * c_layers / layers, n_lines, 100.0 * c_all / n_lines);
    free(flags); free(h);
}

static void test_header_layout(void) {
    char *h = read_file("llm.h", NULL);
    if (!h) { CHECK(0, "read llm.h"); return; }
    char map[16][16], decl[16][16], impl[16][16];
    int n_map = header_sections(h, "The data's path", "#ifndef LLM_H", " *  ", 0, map);
    int n_decl = header_sections(h, "#ifndef LLM_H", "#endif /* LLM_H", " * ", 1, decl);
    int n_impl = header_sections(h, "#ifdef LLM_IMPLEMENTATION", "#endif /* LLM_IMPLEMENTATION */", " * ", 1,
                                 impl);
    /* the sections of the data's path, the layers after them, then an appendix: the declarations list them
     * all but the appendix, the implementation all */
    int same = n_map >= 13 && n_decl == n_map - 1 && n_impl == n_map && !strcmp(map[n_map - 1], "Appendix");
    for (int i = 0; same && i < n_map; i++)
        same = !strcmp(map[i], impl[i]) && (i == n_map - 1 || !strcmp(map[i], decl[i]));
    CHECK(same, "llm.h: map, declarations and implementation list the same sections in the same order "
          "(%d, %d, %d)", n_map, n_decl, n_impl);
    for (int i = 0; !same && i < 16 && (i < n_map || i < n_impl); i++)
        printf("    %-12s %-12s %s\n", i < n_map ? map[i] : "", i < n_decl ? decl[i] : "",
               i < n_impl ? impl[i] : "");
    free(h);
}

/* The example of llm.h's docs block (make builds it as llm-example):
 * llama.cpp's greedy completion on stdout */
static void test_docs_example(void) {
    if (access("./llm-example", X_OK) != 0) {
        CHECK(0, "./llm-example not built (make test builds it)");
        return;
    }
    int n, status;
    ref_case *cases = stories_cases(&n);
    char cmd[2048];
    for (int i = 0; i < n && i < 2; i++) {
        snprintf(cmd, sizeof cmd, "./llm-example %s '%s' %d 2>/dev/null", model_path("stories260K.gguf"),
                 cases[i].prompt, cases[i].max_tokens);
        char *out = run_command(cmd, &status);
        CHECK(out && status == 0 && strlen(out) == cases[i].n_completion &&
              !memcmp(out, cases[i].completion, cases[i].n_completion),
              "llm.h's example on \"%s\": \"%s\"", cases[i].prompt, out ? out : "");
        free(out);
    }
    char *out = run_command("./llm-example /nonexistent.gguf hi 4 2>&1", &status);
    CHECK(out && status == 1 && strstr(out, "cannot open"),
          "llm.h's example, missing model: exit %d, \"%s\"", status, out ? out : "");
    free(out); free(cases);
}

/* ===========================================================================================================
 * The CUDA backend against the CPU reference (built with CUDA only)
 * ======================================================================================================== */
#ifdef LLM_CUDA
/* test.c has the implementation of llm.h, so llm_rope, llm_rmsnorm and friends are at hand. Every run draws
 * fresh random inputs from a seed taken from the clock (printed, and LLM_GPU_SEED=N repeats a run). In order:
 *   1. GEMM (the tensor-core kernel, every tile shape it picks, split-K, accumulate) against a double loop
 *      over the same bf16-rounded inputs;
 *   2. QKV preparation (bias, q/k RMSnorm, RoPE in both layouts, partial rope_dim) and paged attention over
 *      random block tables, mixed prefill/decode batches, short and partitioned contexts, against naive
 *      loops;
 *   3. the whole forward pass, the CPU backend against the CUDA backend, over several steps of a
 *      multi-sequence batch (prefill, chunked prefill, decode, a copy-on-write fork whose block copy rides in
 *      the next step's batch) on dummy models and the model files found.
 * With LLM_GPU_BENCH=1 it then prints kernel and forward-pass benchmarks (and the GEMM's tile shapes timed
 * against each other); LLM_GPU_BENCH=gemm, tiles, attention or forward (a list) runs only
 * those, no checks. */

static uint64_t gt_rng;
static float gt_uniform(void) { return llm_rand_uniform(&gt_rng) * 2.0f - 1.0f; } /* [-1, 1) */
static int gt_int(int n) { return (int)(llm_splitmix64(&gt_rng) % (uint64_t)n); }
static float gt_bf16(float f) { /* round to bf16 as the GPU does when it uploads */
    uint32_t x; memcpy(&x, &f, 4);
    x = (x + 0x7fff + ((x >> 16) & 1)) & 0xffff0000u;
    memcpy(&f, &x, 4); return f;
}
/* a random permutation of 0..n-1: block ids dealt out in no order */
static void gt_perm(int *perm, int n) {
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) { int j = gt_int(i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
}

/* ---- 1. GEMM ---- */
static void gpu_test_gemm(void) {
    /* M picks the tile shape (<= 32, <= 96, larger); odd N and K test the edges; small tile counts split K */
    static const int shapes[][3] = {{1, 64, 64}, {1, 2048, 2048}, {3, 100, 72}, {16, 3072, 520},
                                    {17, 130, 200}, {32, 257, 172}, {33, 512, 8}, {100, 1000, 96},
                                    {256, 96, 2056}, {257, 129, 264}, {300, 64, 1000}, {1024, 640, 136}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int accumulate = 0; accumulate < 2; accumulate++) {
            float *A = malloc((size_t)M * K * 4), *W = malloc((size_t)N * K * 4);
            float *C = malloc((size_t)M * N * 4), *C0 = malloc((size_t)M * N * 4);
            for (size_t i = 0; i < (size_t)M * K; i++) A[i] = gt_uniform();
            for (size_t i = 0; i < (size_t)N * K; i++) W[i] = gt_uniform() * 0.1f;
            /* NAN: must be overwritten */
            for (size_t i = 0; i < (size_t)M * N; i++) C0[i] = C[i] = accumulate ? gt_uniform() : NAN;
            char err[LLM_ERR_LEN] = "";
            llm_cuda_gemm_run g = {0};
            g.M = M; g.N = N; g.K = K; g.A = A; g.W = W; g.C = C; g.accumulate = accumulate;
            int rc = llm_cuda_run_gemm(&g, err);
            CHECK(rc == 0, "gemm %dx%dx%d: %s", M, N, K, err);
            if (rc == 0) {
                /* error relative to the sum of |products|, which bounds the rounding of the sum */
                double worst = 0;
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
                CHECK(worst < 1e-4, "gemm M=%d N=%d K=%d acc=%d: error %.3g of sum|a*w| (tolerance 1e-4)",
                      M, N, K, accumulate, worst);
                if (accumulate) printf("gemm %5d x %5d x %5d: max error %.2e of sum|a*w|\n", M, N, K, worst);
            }
            free(A); free(W); free(C); free(C0);
        }
    }
}

/* ---- 1b. quantized weights: every type, read by the device as the CPU reads it ---- */
/* A quantized matrix for the checks: N rows of K values of one type, as raw blocks. */
typedef struct { uint32_t type; int N, K; uint8_t *raw; char from[192]; } gt_qmat;

/* The first 2-D tensor of the type in the random-quant files (real blocks, as llama-quantize wrote them);
 * 0 when no file has one (q8_0, q4_0 and q4_1 are in none). */
static int gt_qmat_from_files(uint32_t type, gt_qmat *q) {
    for (int f = 0; f < N_QUANT_MODELS; f++) {
        llm_gguf g;
        char err[LLM_ERR_LEN];
        if (llm_gguf_open(&g, model_path(quant_models[f]), err) != 0) continue;
        int found = 0;
        for (int64_t i = 0; i < g.n_tensors && !found; i++) {
            const llm_gguf_tensor *t = &g.tensors[i];
            if (t->type != type || t->n_dims != 2) continue;
            size_t bytes = llm_dtype_row_bytes(type, (int64_t)t->ne[0]) * t->ne[1];
            q->raw = malloc(bytes);
            if (!q->raw) break;
            memcpy(q->raw, t->data, bytes);
            q->type = type; q->K = (int)t->ne[0]; q->N = (int)t->ne[1];
            snprintf(q->from, sizeof q->from, "%s %.*s", quant_models[f], (int)t->name.len, t->name.ptr);
            found = 1;
        }
        llm_gguf_close(&g);
        if (found) return 1;
    }
    return 0;
}

/* N x K of random blocks: random bytes with sane f16 scales (d about 0.01, dmin about 0.004), so that the
 * values are of the size real weights have and never inf or NaN */
static int gt_qmat_random(uint32_t type, int N, int K, gt_qmat *q) {
    size_t row_bytes = llm_dtype_row_bytes(type, K), bytes = row_bytes * (size_t)N;
    uint64_t bb, bv;
    llm_dtype_info(type, &bb, &bv);
    q->raw = malloc(bytes);
    if (!q->raw || !row_bytes) { free(q->raw); q->raw = NULL; return 0; }
    size_t d_at = type == LLM_Q2_K ? 80 : type == LLM_Q3_K ? 108 : type == LLM_Q6_K ? 208 : 0;
    int has_min = type == LLM_Q2_K || type == LLM_Q4_K || type == LLM_Q5_K || type == LLM_Q4_1 ||
                  type == LLM_Q5_1;
    for (size_t at = 0; at < bytes; at += bb) {
        uint8_t *b = q->raw + at;
        for (size_t i = 0; i < bb; i++) b[i] = (uint8_t)(llm_splitmix64(&gt_rng) >> 24);
        /* f16 0x2000 + a little: 2^-7 to 2^-6; dmin 2^-8 to 2^-7 */
        uint16_t d = (uint16_t)(0x2000 + gt_int(0x400)), dmin = (uint16_t)(0x1c00 + gt_int(0x400));
        memcpy(b + d_at, &d, 2);
        if (has_min) memcpy(b + d_at + 2, &dmin, 2);
    }
    q->type = type; q->N = N; q->K = K;
    snprintf(q->from, sizeof q->from, "random blocks");
    return 1;
}

/* The device's dequantization against llm_dtype_dequant_row (bit for bit), then the products for decode-sized
 * M (the GEMV, exact weights) and prefill-sized M (the GEMM, weights rounded to bf16 in its tiles) against
 * double loops over the same inputs, fresh and accumulating. */
static void gt_check_qmat(const gt_qmat *q) {
    const int N = q->N, K = q->K, Mmax = 128;
    const char *tn = llm_dtype_name(q->type);
    size_t row_bytes = llm_dtype_row_bytes(q->type, K);
    float *W = malloc((size_t)N * K * 4), *Wb = malloc((size_t)N * K * 4), *Wd = malloc((size_t)N * K * 4);
    float *A = malloc((size_t)Mmax * K * 4), *C = malloc((size_t)Mmax * N * 4);
    float *C0 = malloc((size_t)Mmax * N * 4);
    if (!W || !Wb || !Wd || !A || !C || !C0) {
        CHECK(0, "quant %s: out of memory", tn);
        free(W); free(Wb); free(Wd); free(A); free(C); free(C0);
        return;
    }
    for (int n = 0; n < N; n++) llm_dtype_dequant_row(q->type, q->raw + row_bytes * n, W + (size_t)n * K, K);
    for (size_t i = 0; i < (size_t)N * K; i++) Wb[i] = gt_bf16(W[i]);
    for (size_t i = 0; i < (size_t)Mmax * K; i++) A[i] = gt_uniform();
    char err[LLM_ERR_LEN] = "";

    /* 1. dequantization, bit for bit (M = 1: the GEMV runs beside it) */
    llm_cuda_gemm_run g = {0};
    g.M = 1; g.N = N; g.K = K; g.A = A; g.w_type = q->type; g.W_raw = q->raw; g.W_out = Wd; g.C = C;
    int failed_before = n_failed;
    int rc = llm_cuda_run_gemm(&g, err);
    CHECK(rc == 0, "quant %s %dx%d dequantization: %s", tn, N, K, err);
    if (rc) { free(W); free(Wb); free(Wd); free(A); free(C); free(C0); return; }
    long long bad = 0, first = -1;
    for (size_t i = 0; i < (size_t)N * K; i++)
        if (memcmp(&W[i], &Wd[i], 4)) { if (first < 0) first = (long long)i; bad++; }
    CHECK(bad == 0, "quant %s (%s): the device dequantizes %lld of %lld values differently from "
          "llm_dtype_dequant_row (first: value %lld of row %lld, %.9g vs %.9g)", tn, q->from, bad,
          (long long)N * K, first < 0 ? 0 : first % K, first < 0 ? 0 : first / K, first < 0 ? 0 : Wd[first],
          first < 0 ? 0 : W[first]);

    /* 2. products: M <= 8 runs the GEMV on exact weights (f32 products, only the sum's rounding: 1e-5), more
     * the GEMM on bf16-rounded weights (as the bf16 GEMM check: 1e-4 against the bf16-rounded reference) */
    static const int Ms[] = {1, 2, 3, 4, 8, 37, 128};
    double worst_gemv = 0, worst_gemm = 0, gemm_vs_exact = 0;
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
        for (int accumulate = 0; accumulate < 2; accumulate++) {
            int M = Ms[mi];
            for (size_t i = 0; i < (size_t)M * N; i++) C0[i] = C[i] = accumulate ? gt_uniform() : NAN;
            memset(&g, 0, sizeof g);
            g.M = M; g.N = N; g.K = K; g.A = A; g.w_type = q->type; g.W_raw = q->raw; g.C = C;
            g.accumulate = accumulate;
            rc = llm_cuda_run_gemm(&g, err);
            CHECK(rc == 0, "quant %s M=%d N=%d K=%d: %s", tn, M, N, K, err);
            if (rc) continue;
            CHECK(g.used_gemv == (M <= 8), "quant %s M=%d: the %s ran", tn, M, g.used_gemv ? "GEMV" : "GEMM");
            const float *Wref = g.used_gemv ? W : Wb;
            double worst = 0, vs_exact = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double ref = accumulate ? C0[(size_t)i * N + j] : 0, ref_exact = ref, mag = 1e-6;
                    for (int k = 0; k < K; k++) {
                        double a = gt_bf16(A[(size_t)i * K + k]);
                        double p = a * Wref[(size_t)j * K + k];
                        ref += p; mag += fabs(p); ref_exact += a * W[(size_t)j * K + k];
                    }
                    double got = C[(size_t)i * N + j];
                    double e = fabs(got - ref) / mag, ex = fabs(got - ref_exact) / mag;
                    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
                    if (!(ex <= vs_exact)) vs_exact = isnan(ex) ? INFINITY : ex;
                }
            double tol = g.used_gemv ? 1e-5 : 1e-4;
            CHECK(worst < tol, "quant %s (%s) M=%d N=%d K=%d acc=%d (%s): error %.3g of sum|a*w| (tolerance "
                  "%.0e)", tn, q->from, M, N, K, accumulate, g.used_gemv ? "GEMV" : "GEMM", worst, tol);
            if (g.used_gemv) worst_gemv = fmax(worst_gemv, worst);
            else { worst_gemm = fmax(worst_gemm, worst); gemm_vs_exact = fmax(gemm_vs_exact, vs_exact); }
        }
    printf("quant %-5s %4d x %4d (%s): dequant %s; GEMV M=1-8 err %.2e; GEMM M=37,128 err %.2e (%.2e vs "
           "unrounded weights): %s\n", tn, N, K, q->from, bad == 0 ? "bit-exact" : "WRONG", worst_gemv,
           worst_gemm, gemm_vs_exact, n_failed == failed_before ? "ok" : "FAILED");
    free(W); free(Wb); free(Wd); free(A); free(C); free(C0);
}

static void gpu_test_quant_gemm(void) {
    for (int ti = 0; ti < N_QUANT_TYPES; ti++) {
        uint32_t type = quant_types[ti];
        /* the CUDA backend uploads mxfp4 matrices as bf16: no kernel for it */
        if (type == LLM_MXFP4) continue;
        gt_qmat q = {0};
        if (gt_qmat_from_files(type, &q)) { gt_check_qmat(&q); free(q.raw); }
        else if (type != LLM_Q8_0 && type != LLM_Q4_0 && type != LLM_Q4_1)
            CHECK(0, "quant %s: no tensor of this type in %s/models/random-quant-*.gguf",
                  llm_dtype_name(type), testdata_dir);
        /* random blocks: every type, an odd N (partial tiles) and a long K (split-K, many blocks per row) */
        memset(&q, 0, sizeof q);
        if (gt_qmat_random(type, 301, 2048, &q)) { gt_check_qmat(&q); free(q.raw); }
        else CHECK(0, "quant %s: out of memory", llm_dtype_name(type));
    }
}

/* ---- 2. QKV preparation and paged attention ---- */
typedef struct {
    const char *name;
    int n_heads, n_kv_heads, head_dim, rope_dim, neox, bias, qk_norm, part_size;
    int window; /* > 0: a local layer (Gemma 3's) with this window and its own RoPE base */
} gt_attn_case;

static void gpu_test_attention_case(const gt_attn_case *ac) {
    llm_config cf; memset(&cf, 0, sizeof cf);
    cf.n_heads = ac->n_heads; cf.n_kv_heads = ac->n_kv_heads; cf.head_dim = ac->head_dim;
    cf.rope_dim = ac->rope_dim; cf.rope_neox = ac->neox; cf.rope_base = ac->neox ? 1000000.0f : 10000.0f;
    cf.rms_eps = 1e-6f; cf.dim = cf.n_heads * cf.head_dim; cf.n_layers = 1;
    /* a local layer: the layer is the first of a pattern of 2 (global every 2nd); its RoPE base another */
    cf.sliding_window = ac->window; cf.swa_pattern = 2; cf.rope_base_swa = 10000.0f * (1 + ac->neox);
    int window = ac->window;
    float base = window ? cf.rope_base_swa : cf.rope_base;
    int hd = cf.head_dim, nkv = cf.n_kv_heads, q_dim = cf.n_heads * hd, kv_dim = nkv * hd;
    int width = q_dim + 2 * kv_dim, G = cf.n_heads / nkv;
    int bs = 16, n_seqs = 2 + gt_int(4), max_ctx = 1300;
    /* each sequence: some positions already in the cache, then new tokens (1 = decode, more = prefill
     * chunk) */
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
    gt_perm(perm, num_blocks);
    int32_t *tables = malloc((size_t)n_seqs * blocks_per_seq * sizeof(int32_t));
    const int32_t *bt[8];
    for (int s = 0; s < n_seqs; s++) {
        for (int k = 0; k < blocks_per_seq; k++) /* a local layer's blocks wholly before the window: -1 */
            tables[s * blocks_per_seq + k] = window && (k + 1) * bs <= past[s] - window + 1
                                             ? -1 : perm[s * blocks_per_seq + k];
        bt[s] = tables + s * blocks_per_seq;
    }
    int32_t *pos = malloc((size_t)T * sizeof(int32_t)), start[9];
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        start[s] = t;
        for (int i = 0; i < n_new[s]; i++) pos[t++] = past[s] + i;
    }
    start[n_seqs] = T;
    llm_batch b = {0}; /* attention reads no tokens */
    b.n_tokens = T; b.positions = pos; b.n_seqs = n_seqs; b.seq_start = start; b.block_tables = bt;

    size_t n_cache = (size_t)num_blocks * bs * kv_dim;
    float *kc = malloc(n_cache * 4), *vc = malloc(n_cache * 4);
    float *kc_ref = malloc(n_cache * 4), *vc_ref = malloc(n_cache * 4);
    for (size_t i = 0; i < n_cache; i++) {
        kc_ref[i] = kc[i] = gt_bf16(gt_uniform());
        vc_ref[i] = vc[i] = gt_bf16(gt_uniform());
    }
    float *qkv = malloc((size_t)T * width * 4), *bias = malloc((size_t)width * 4);
    float *qn = malloc((size_t)hd * 4), *kn = malloc((size_t)hd * 4);
    for (size_t i = 0; i < (size_t)T * width; i++) qkv[i] = gt_uniform() * 2.0f;
    for (int i = 0; i < width; i++) bias[i] = gt_uniform();
    for (int i = 0; i < hd; i++) {
        qn[i] = 0.5f + gt_uniform() * 0.5f + 0.5f;
        kn[i] = 1.0f + gt_uniform() * 0.5f;
    }
    float *q_gpu = malloc((size_t)T * q_dim * 4), *att_gpu = malloc((size_t)T * q_dim * 4);
    char err[LLM_ERR_LEN] = "";
    llm_cuda_attention_run run = {0};
    run.cfg = &cf; run.batch = &b;
    run.num_blocks = num_blocks; run.block_size = bs; run.part_size = ac->part_size;
    run.qkv = qkv; run.bias = ac->bias ? bias : NULL;
    run.q_norm = ac->qk_norm ? qn : NULL; run.k_norm = ac->qk_norm ? kn : NULL;
    run.k_cache = kc; run.v_cache = vc; run.q_out = q_gpu; run.att_out = att_gpu;
    int rc = llm_cuda_run_attention(&run, err);
    CHECK(rc == 0, "attention %s: %s", ac->name, err);
    if (rc == 0) {
        /* reference: the CPU forward pass's own steps, then the new K/V into the cache (bf16, as the GPU
         * keeps it) */
        float *q_ref = malloc((size_t)T * q_dim * 4), *x = malloc((size_t)width * 4);
        int s = 0;
        for (t = 0; t < T; t++) {
            while (t >= start[s + 1]) s++;
            memcpy(x, qkv + (size_t)t * width, (size_t)width * 4);
            if (ac->bias) for (int i = 0; i < width; i++) x[i] += bias[i];
            float rope_cos[cf.rope_dim / 2 + 1], rope_sin[cf.rope_dim / 2 + 1];
            llm_rope_angles(rope_cos, rope_sin, pos[t], &cf, base, 0);
            for (int h = 0; h < cf.n_heads + nkv; h++) {
                if (ac->qk_norm)
                    llm_rmsnorm(x + h * hd, x + h * hd, h < cf.n_heads ? qn : kn, hd, cf.rms_eps);
                llm_rope(x + h * hd, rope_cos, rope_sin, &cf);
            }
            memcpy(q_ref + (size_t)t * q_dim, x, (size_t)q_dim * 4);
            size_t slot = (size_t)bt[s][pos[t] / bs] * bs + pos[t] % bs;
            for (int i = 0; i < kv_dim; i++) {
                kc_ref[slot * kv_dim + i] = gt_bf16(x[q_dim + i]);
                vc_ref[slot * kv_dim + i] = gt_bf16(x[q_dim + kv_dim + i]);
            }
        }
        double q_err = 0, q_max = 0, kv_err = 0, kv_max = 0, a_err = 0, a_max = 0;
        for (size_t i = 0; i < (size_t)T * q_dim; i++) {
            q_err = fmax(q_err, fabs(q_gpu[i] - q_ref[i])); q_max = fmax(q_max, fabs(q_ref[i]));
        }
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
                int first = window && pos[t] + 1 > window ? pos[t] + 1 - window : 0;
                for (int p = first; p <= pos[t]; p++) {
                    const float *kp = kc_ref + ((size_t)bt[s][p / bs] * bs + p % bs) * kv_dim + (h / G) * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)qh[i] * kp[i];
                    sc[p] = d / sqrt((double)hd);
                    if (sc[p] > mx) mx = sc[p];
                }
                for (int p = first; p <= pos[t]; p++) { sc[p] = exp(sc[p] - mx); sum += sc[p]; }
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int p = first; p <= pos[t]; p++) {
                        size_t slot = (size_t)bt[s][p / bs] * bs + p % bs;
                        o += sc[p] * vc_ref[slot * kv_dim + (h / G) * hd + i];
                    }
                    o /= sum;
                    a_err = fmax(a_err, fabs(att_gpu[(size_t)t * q_dim + h * hd + i] - o));
                    a_max = fmax(a_max, fabs(o));
                }
            }
        }
        /* q in f32 (RoPE angles computed differently: pow vs repeated products); K/V and output rounded to
         * bf16 */
        CHECK(q_err <= 2e-3 * q_max, "%s: q after norm/RoPE differs by %.3g (max |q| %.3g)", ac->name, q_err,
              q_max);
        CHECK(kv_err <= 1e-2 * kv_max, "%s: K/V in the cache differ by %.3g (max %.3g)", ac->name, kv_err,
              kv_max);
        CHECK(a_err <= 1e-2 * a_max, "%s: attention output differs by %.3g (max %.3g)", ac->name, a_err,
              a_max);
        printf("attention %-34s %d seqs, %3d tokens: q err %.1e, kv err %.1e, out err %.1e (rel. to max)\n",
               ac->name, n_seqs, T, q_err / q_max, kv_err / kv_max, a_err / a_max);
        free(sc); free(q_ref); free(x);
    }
    free(perm); free(tables); free(pos); free(kc); free(vc); free(kc_ref); free(vc_ref);
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
        /* Gemma 3's local layers: windows across partitions (some of them empty), blocks gone before them */
        {"window 40 GQA 16/4 qk-norm (part 64)", 16, 4, 64, 64, 1, 0, 1, 64, 40},
        {"window 200 hd256 GQA 8/1 (part 128)", 8, 1, 256, 256, 1, 0, 1, 128, 200},
        {"window 512 llama hd64 (part 512)", 8, 2, 64, 64, 0, 1, 0, 512, 512},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int rep = 0; rep < 2; rep++) gpu_test_attention_case(&cases[i]);
}

/* ---- 3. the whole forward pass ---- */
static int gt_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* The CPU reference runs on a copy of the model whose matrices are rounded to bf16 as the GPU rounds them at
 * upload: the comparison then measures the kernels and the bf16 activations, not the weight format. */
typedef struct { llm_model m; uint16_t *mem; } gt_bf16_model;
static void gt_round_weight(llm_weight *w, uint16_t **mem) {
    if (!w->data) return;
    float *row = malloc((size_t)w->cols * sizeof(float));
    uint16_t *out = *mem;
    size_t row_bytes = llm_dtype_row_bytes(w->type, w->cols);
    for (int64_t r = 0; r < w->rows; r++) {
        llm_dtype_dequant_row(w->type, (const uint8_t *)w->data + row_bytes * (size_t)r, row, w->cols);
        for (int64_t k = 0; k < w->cols; k++) {
            float f = gt_bf16(row[k]); uint32_t b; memcpy(&b, &f, 4);
            out[r * w->cols + k] = (uint16_t)(b >> 16);
        }
    }
    free(row);
    w->data = out; w->type = LLM_BF16;
    *mem += (size_t)w->rows * w->cols;
}
/* A layer's matrices, as the CUDA backend uploads them (absent ones have no data): attention, the dense FFN,
 * the experts and their router, qwen2moe's shared expert */
#define GT_LAYER_MATRICES 14
static void gt_layer_matrices(llm_layer *L, llm_weight **ws) {
    llm_weight *all[GT_LAYER_MATRICES] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                          &L->router, &L->gate_exps, &L->up_exps, &L->down_exps,
                                          &L->shared_gate, &L->shared_up, &L->shared_down};
    memcpy(ws, all, sizeof all);
}

static int gt_model_bf16(const llm_model *src, gt_bf16_model *dst) {
    const llm_config *c = &src->cfg;
    size_t n = (size_t)c->vocab_size * c->dim * 2;
    for (int l = 0; l < c->n_layers; l++) {
        llm_weight *ws[GT_LAYER_MATRICES];
        gt_layer_matrices(&src->layers[l], ws);
        for (int k = 0; k < GT_LAYER_MATRICES; k++) n += ws[k]->data ? (size_t)ws[k]->rows * ws[k]->cols : 0;
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
        llm_weight *ws[GT_LAYER_MATRICES];
        gt_layer_matrices(&dst->m.layers[l], ws);
        for (int k = 0; k < GT_LAYER_MATRICES; k++) gt_round_weight(ws[k], &mem);
    }
    return 0;
}

/* A backend (create: llm_cpu_backend_create or llm_cuda_backend_create) with a KV pool of num_blocks blocks
 * of bs slots; NULL, with a failed CHECK, when either step fails. */
static llm_backend *gt_backend(llm_backend *(*create)(const llm_model *, char *), const llm_model *m,
                               int num_blocks, int bs, const char *name, const char *kind) {
    char err[LLM_ERR_LEN] = "";
    llm_backend *be = create(m, err);
    int rc = be ? be->alloc_kv(be, num_blocks, bs, err) : -1;
    CHECK(rc == 0, "%s: %s backend: %s", name, kind, err);
    if (rc && be) { be->destroy(be); be = NULL; }
    return be;
}

/* What llm_cuda_weight_bytes should say for m: quantized matrices their file bytes, the others bf16 rows
 * padded to 8 values; the tied output once */
static size_t gt_weight_bytes(const llm_model *m) {
    const llm_weight *ws[2 + GT_LAYER_MATRICES * 512];
    int n = 0;
    ws[n++] = &m->tok_embd;
    if (m->output.data != m->tok_embd.data) ws[n++] = &m->output;
    for (int l = 0; l < m->cfg.n_layers && l < 512; l++, n += GT_LAYER_MATRICES)
        gt_layer_matrices(&m->layers[l], (llm_weight **)ws + n);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const llm_weight *w = ws[i];
        int quant = w->type != LLM_F32 && w->type != LLM_F16 && w->type != LLM_BF16;
        total += quant ? llm_dtype_row_bytes(w->type, w->cols) * (size_t)w->rows
                       : (size_t)w->rows * (size_t)((w->cols + 7) / 8 * 8) * 2;
    }
    return total;
}

/* Runs the same steps on the CPU backend (bf16-rounded weights) and the CUDA backend (the model as loaded)
 * and compares the logits. quantized: the model's matrices are quantized, which the GPU keeps as they are
 * (exact in the GEMV, bf16-rounded in the GEMM's tiles): the CPU reference is then the exact path on the
 * model as loaded. */
static void gpu_test_forward_model(const llm_model *m, const char *name, int quantized) {
    /* each group of layers (Gemma 3: windows) gets blocks of its own, from one pool */
    enum { MAX_GROUPS = 8 };
    const int n_groups = llm_kv_groups(&m->cfg);
    const int bs = 16, num_blocks = 96 * n_groups, max_seqs = 4, V = m->cfg.vocab_size;
    if (n_groups > MAX_GROUPS) { CHECK(0, "%s: %d groups of layers", name, n_groups); return; }
    char err[LLM_ERR_LEN] = "";
    gt_bf16_model mr;
    memset(&mr, 0, sizeof mr);
    if (!quantized && gt_model_bf16(m, &mr)) { CHECK(0, "%s: out of memory", name); return; }
    const llm_model *mc = quantized ? m : &mr.m;
    llm_backend *cpu = gt_backend(quantized ? llm_cpu_exact_backend_create : llm_cpu_backend_create, mc,
                                  num_blocks, bs, name, quantized ? "cpu exact" : "cpu");
    llm_backend *gpu = gt_backend(llm_cuda_backend_create, m, num_blocks, bs, name, "cuda");
    if (gpu)
        CHECK(llm_cuda_weight_bytes(gpu) == gt_weight_bytes(m), "%s: the CUDA backend says its weights take "
              "%zu bytes, the model's matrices %zu", name, llm_cuda_weight_bytes(gpu), gt_weight_bytes(m));
    if (!cpu || !gpu) {
        if (cpu) cpu->destroy(cpu);
        if (gpu) gpu->destroy(gpu);
        free(mr.mem); free(mr.m.layers);
        return;
    }
    int perm[96 * MAX_GROUPS];
    gt_perm(perm, num_blocks);
    int next_block = 0;
    int32_t tables[MAX_GROUPS][4][24], n_blocks[4] = {0}, len[4] = {0}, last_tok[4] = {0};
    int32_t prompt_len[4] = {23, 70, 17, 0};    /* seq 1 prefills in two chunks; seq 3 forks from seq 1 */
    double worst_l2 = 0, worst_max = 0;
    int argmax_same = 0, argmax_total = 0, near_ties = 0, failed = 0, argmax_picks = 0;
    double repeat_err = 0;
    /* the same bf16 weights on both sides; the GPU rounds activations to bf16 before every product and keeps
     * K/V in bf16, the CPU keeps them in f32 */
    /* each layer rounds four product inputs to bf16 (relative 2^-9) and the rounding compounds with depth:
     * seen 5e-3 for 4-5 layers, 3e-2 to 3.6e-2 for the 24 of dummy qwen2.5-0.5b. How much a model's logits
     * move under such rounding depends on its weights too: the CPU run again on the unrounded weights
     * measures it (rounding the weights alone moves random-smollm3's and random-gemma3's by 3.6%,
     * random-phi3's by 0.5%), and the GPU, which rounds twice as many things (activations, K/V), may differ
     * by 4 times that. A wrong kernel (a window, a norm, a RoPE table) moves them by far more. */
    double tol_l2 = fmax(3e-2, 2e-3 * m->cfg.n_layers), tol_max = fmax(5e-2, 3e-3 * m->cfg.n_layers);
    double sens_l2 = 0, sens_max = 0;
    llm_backend *cpu32 = quantized ? NULL : gt_backend(llm_cpu_backend_create, m, num_blocks, bs, name,
                                                       "cpu, unrounded weights");
    enum { STEPS = 7 };
    for (int step = 0; step < STEPS && !failed; step++) {
        int32_t tokens[256], pos[256], seq_start[5], rows[4], copy_src[MAX_GROUPS], copy_dst[MAX_GROUPS];
        const int32_t *bt[4 * MAX_GROUPS];
        int T = 0, n_seqs = 0, active[4], n_copies = 0;
        if (step == 3) {
            /* fork: seq 3 shares seq 1's full blocks and gets a copy of its partial last block, which this
             * step's batch carries (the backends copy before they compute; seq 3's logits then show the
             * copy) */
            int full = len[1] / bs;
            for (int g = 0; g < n_groups; g++)
                for (int k = 0; k < full; k++) tables[g][3][k] = tables[g][1][k];
            n_blocks[3] = full;
            CHECK(len[1] % bs != 0, "%s: the fork has a partial block to copy (seq 1 holds %d tokens)", name,
                  len[1]);
            if (len[1] % bs) {
                for (int g = 0; g < n_groups; g++) {
                    int nb = perm[next_block++];
                    copy_src[n_copies] = tables[g][1][full]; copy_dst[n_copies++] = nb;
                    tables[g][3][full] = nb;
                }
                n_blocks[3]++;
            }
            len[3] = len[1]; last_tok[3] = (last_tok[1] + 1) % V; /* a different next token than seq 1 */
        }
        for (int s = 0; s < max_seqs; s++) {
            int n_new;
            if (s == 2 && step < 1) continue;             /* seq 2 joins at step 1 */
            if (s == 3 && step < 3) continue;             /* seq 3 exists from step 3 */
            if (len[s] < prompt_len[s])                   /* chunked prefill */
                n_new = s == 1 && step == 0 ? 40 : prompt_len[s] - len[s];
            else n_new = 1;
            seq_start[n_seqs] = T;
            for (int i = 0; i < n_new; i++) {
                int p = len[s] + i;
                tokens[T] = len[s] < prompt_len[s] ? gt_int(V) : last_tok[s];
                pos[T] = p;
                for (; n_blocks[s] <= p / bs; n_blocks[s]++)
                    for (int g = 0; g < n_groups; g++) tables[g][s][n_blocks[s]] = perm[next_block++];
                T++;
            }
            len[s] += n_new;
            rows[n_seqs] = T - 1;
            active[n_seqs++] = s;
        }
        seq_start[n_seqs] = T;
        for (int g = 0; g < n_groups; g++)
            for (int i = 0; i < n_seqs; i++) bt[g * n_seqs + i] = tables[g][active[i]];
        llm_batch b = {0};
        b.n_tokens = T; b.tokens = tokens; b.positions = pos;
        b.n_seqs = n_seqs; b.seq_start = seq_start; b.block_tables = bt;
        b.n_logits = n_seqs; b.logit_rows = rows;
        b.n_copies = n_copies; b.copy_src = copy_src; b.copy_dst = copy_dst;
        float *lc = malloc((size_t)n_seqs * V * 4), *lg = malloc((size_t)n_seqs * V * 4);
        int rc1 = cpu->forward(cpu, &b, lc, err);
        CHECK(rc1 == 0, "%s step %d cpu forward: %s", name, step, err);
        if (cpu32 && rc1 == 0) {
            float *l32 = malloc((size_t)n_seqs * V * 4);
            int rc = cpu32->forward(cpu32, &b, l32, err);
            CHECK(rc == 0, "%s step %d cpu forward on the unrounded weights: %s", name, step, err);
            for (int r = 0; r < n_seqs && rc == 0; r++) {
                const float *c = lc + (size_t)r * V, *u = l32 + (size_t)r * V;
                double d2 = 0, c2 = 0, dmax = 0, cmax = 0;
                for (int i = 0; i < V; i++) {
                    d2 += ((double)u[i] - c[i]) * ((double)u[i] - c[i]); c2 += (double)c[i] * c[i];
                    dmax = fmax(dmax, fabs((double)u[i] - c[i])); cmax = fmax(cmax, fabs(c[i]));
                }
                sens_l2 = fmax(sens_l2, sqrt(d2 / (c2 > 0 ? c2 : 1)));
                sens_max = fmax(sens_max, dmax / (cmax > 0 ? cmax : 1));
            }
            free(l32);
        }
        int rc2 = gpu->forward(gpu, &b, lg, err);
        CHECK(rc2 == 0, "%s step %d cuda forward: %s", name, step, err);
        if (rc1 || rc2) { failed = 1; free(lc); free(lg); break; }
        /* the same step again, every other row read on the host (llm_batch.host_rows) and the others only
         * sampled (llm_backend.sample): greedy ones picked on the device, sampled ones copied by the step
         * into lg2 and drawn there by the host's sampler. Each pick is the argmax of its row above, each row
         * on the host that row, within what the device's split-K GEMM leaves to chance (its atomic adds come
         * in any order, and the bf16 roundings after them compound: held to the tolerance against the CPU, of
         * max |logit|), and each sampled draw llm_sampler_sample's from the row the step copied */
        uint8_t host[4]; llm_sample_row srows[4]; uint64_t gens[4]; int of_row[4] = {-1, -1, -1, -1};
        llm_sampling_params gp = llm_sampling_defaults(), tp = llm_sampling_defaults();
        gp.temperature = 0; tp.temperature = 0.8f;
        float *lg2 = malloc((size_t)n_seqs * V * 4);
        for (int r = 0; r < n_seqs; r++) host[r] = (uint8_t)((r + step) % 2 == 0);
        for (size_t i = 0; i < (size_t)n_seqs * V; i++) lg2[i] = NAN;
        b.host_rows = host;
        int rc3 = gpu->forward(gpu, &b, lg2, err), n_sampled = 0;
        for (int r = 0; r < n_seqs; r++) {
            if (host[r]) continue;
            memset(&srows[n_sampled], 0, sizeof srows[0]);
            srows[n_sampled].row = r; srows[n_sampled].params = (r + step) % 4 == 1 ? &tp : &gp;
            gens[n_sampled] = 77 + (uint64_t)r; srows[n_sampled].rng_state = &gens[n_sampled];
            of_row[r] = n_sampled++;
        }
        if (rc3 == 0) rc3 = gpu->sample(gpu, srows, n_sampled, lg2, err);
        CHECK(rc3 == 0, "%s step %d cuda forward and sample step: %s", name, step, err);
        llm_sampler *ref = rc3 == 0 ? llm_sampler_create(V, err) : NULL;
        for (int r = 0; r < n_seqs && ref; r++) {
            const float *g = lg + (size_t)r * V, *g2 = lg2 + (size_t)r * V;
            const llm_sample_row *sr = of_row[r] >= 0 ? &srows[of_row[r]] : NULL;
            int on_device = sr && sr->params == &gp, ag = gt_argmax(g, V);
            int pick = on_device ? sr->token : gt_argmax(g2, V);
            double gmax = 0, d = 0;
            for (int i = 0; i < V; i++) gmax = fmax(gmax, fabs(g[i]));
            for (int i = 0; !on_device && i < V; i++)
                d = isnan(g2[i]) ? INFINITY : fmax(d, fabs(g2[i] - g[i]));
            int close = pick >= 0 && pick < V && g[ag] - g[pick] <= tol_max * gmax;
            if (sr && !on_device) { /* the draw is the host sampler's from the row copied */
                uint64_t gen = 77 + (uint64_t)r;
                close = sr->token == llm_sampler_sample(ref, &tp, g2, NULL, 0, 0, &gen);
            }
            CHECK(close && d <= tol_max * gmax, "%s step %d row %d (%s): token %d, the argmax of the row "
                  "above %d; the row differs from it by %.3g of max |logit|", name, step, r,
                  on_device ? "greedy pick on the device" : sr ? "sampled on the host" : "on the host", pick,
                  ag, d / (gmax > 0 ? gmax : 1));
            argmax_picks += on_device;
            repeat_err = fmax(repeat_err, d / (gmax > 0 ? gmax : 1));
        }
        llm_sampler_free(ref);
        free(lg2);
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
            else CHECK(0, "%s step %d seq %d: greedy token %d on the GPU, %d on the CPU (logits %.4f vs "
                       "%.4f)", name, step, active[r], ag, ac, c[ag], c[ac]);
            last_tok[active[r]] = ac;
        }
        free(lc); free(lg);
    }
    tol_l2 = fmax(tol_l2, 4 * sens_l2); tol_max = fmax(tol_max, 4 * sens_max);
    CHECK(worst_l2 < tol_l2, "%s: logits differ from the CPU's by %.3g (relative L2, tolerance %.2g)", name,
          worst_l2, tol_l2);
    CHECK(worst_max < tol_max, "%s: logits differ from the CPU's by %.3g of max |logit| (tolerance %.2g)",
          name, worst_max, tol_max);
    printf("forward %-28s %d steps: logits rel. L2 err %.2e, max-abs err %.2e of max |logit| (bf16 weights "
           "alone: %.1e, %.1e); greedy %d/%d same, %d near ties; %d picks on the device, rows again within "
           "%.1e\n", name, STEPS, worst_l2, worst_max, sens_l2, sens_max, argmax_same, argmax_total,
           near_ties, argmax_picks, repeat_err);
    cpu->destroy(cpu); gpu->destroy(gpu);
    if (cpu32) cpu32->destroy(cpu32);
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
        gpu_test_forward_model(&m, name, 0);
        llm_model_free(&m);
    }
    /* and the architectures since: Gemma 3 (windows, groups of layers in the KV cache, norms after each
     * block, GeGLU, scaled embeddings), SmolLM3 (layers without RoPE), Phi-3 (fused matrices), mixtures of
     * experts (Qwen3-MoE; Mixtral as llama files with experts; gpt-oss: attention sinks, biases, a window on
     * every other layer, its clamped SwiGLU; qwen2moe: weights not renormalised, and its shared expert) */
    static const char *files[] = {"stories260K.gguf", "random-llama2-untied.gguf", "random-llama3-gqa.gguf",
                                  "random-qwen2-bias.gguf", "random-qwen3-qknorm.gguf", "random-gemma3.gguf",
                                  "random-smollm3.gguf", "random-phi3.gguf", "random-qwen3moe.gguf",
                                  "random-llama-moe.gguf", "random-gpt-oss.gguf", "random-qwen2moe.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024], err[LLM_ERR_LEN] = "";
        snprintf(path, sizeof path, "%s/models/%s", testdata_dir, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f) { printf("forward %-28s skipped: %s not found\n", files[i], path); continue; }
        fclose(f);
        llm_model m;
        int rc = llm_model_load(&m, path, err);
        CHECK(rc == 0, "load %s: %s", path, err);
        if (rc) continue;
        gpu_test_forward_model(&m, files[i], 0);
        /* RoPE scaled as files say, the same config on both backends: Gemma 3 4B's linear factor 8 on the
         * global layers; gpt-oss's YaRN (factor 32) with per-pair factors as Llama 3.1's on SmolLM3's */
        char scaled[64];
        if (strstr(files[i], "gemma3")) {
            m.cfg.rope_freq_scale = 0.125f;
            snprintf(scaled, sizeof scaled, "%s linear x8", files[i]);
            gpu_test_forward_model(&m, scaled, 0);
        }
        if (strstr(files[i], "smollm3")) {
            int pairs = m.cfg.rope_dim / 2;
            float *factors = malloc((size_t)pairs * sizeof(float));
            for (int k = 0; k < pairs; k++) factors[k] = 1.0f + 3.0f * k / pairs;
            m.cfg.rope_factors = factors; m.cfg.rope_yarn = 1; m.cfg.rope_freq_scale = 1.0f / 32;
            m.cfg.yarn_dims[0] = (float)(pairs / 4); m.cfg.yarn_dims[1] = (float)(pairs / 2);
            snprintf(scaled, sizeof scaled, "%s yarn+factors", files[i]);
            gpu_test_forward_model(&m, scaled, 0);
            free(factors);
        }
        llm_model_free(&m);
    }
}

/* The engine on the GPU, as a server runs it, on the random models of Gemma 3 (windows: blocks of the local
 * layers go back to the pool as they slide out), SmolLM3, Phi-3, Qwen3-MoE, Mixtral-style llama and gpt-oss,
 * against llama.cpp's greedy ids:
 *   - decoding, alone and behind another prompt, at block sizes 16 and 1: the ids up to the first step where
 *     llama.cpp's own top-two gap is under GT_CLEAR_GAP nats;
 *   - teacher-forced: the prompt plus the first k reference tokens, one request for each step k whose gap is
 *     GT_CLEAR_GAP or more, all at once (they share prefixes: the prefix cache), prefilled in chunks of 8
 *     tokens, each request's one greedy token against llama.cpp's: every clear step of the 24 (Gemma 3: to
 *     position 26, past the window of 8).
 * These random models are touchy: rounding random-gpt-oss's weights to bf16 on the CPU's exact path alone
 * flips a step whose gap is 0.25 nats, and the GPU also rounds activations and K/V (its logits are held to
 * the CPU's in gpu_test_forward: 5-9% of the largest here). On an H100 the GPU parted from llama.cpp at
 * steps with gaps of 0.10 and 0.83 (results/2026-11-26-h100-80gb-hbm3-test-gpu-gpt-oss.log): a clear step is
 * one of 1 nat or more.
 * Every block back in the pool after each run. */
#define GT_CLEAR_GAP 1.0f
static void gpu_test_engine_archs(void) {
    ref_case *cases = calloc(16, sizeof *cases), *prompts = calloc(16, sizeof *prompts);
    run_result *r = calloc(1, sizeof *r);
    int n = load_ref_cases("random-archs-greedy.json", "completion_token_ids", cases, 16);
    int np = load_ref_cases("random-archs-greedy.json", "prompt_token_ids", prompts, 16), runs = 0,
        present = 0;
    CHECK(n == np && n > 0, "random-archs-greedy.json: %d cases, %d prompts", n, np);
    for (int i = 0; i < n && i < np; i++) {
        const ref_case *c = &cases[i];
        FILE *f = fopen(model_path(c->model), "rb");
        if (!f) { printf("engine on the GPU %-20s skipped: not found\n", c->model); continue; }
        fclose(f);
        present++;
        int sure = 0, forced = 0, forced_ok = 0, decoded = 0;
        while (sure < c->n_ids && sure < c->n_gaps && c->gaps[sure] >= GT_CLEAR_GAP) sure++;
        for (int run = 0; run < 4; run++) {
            llm_engine_config cfg = llm_engine_defaults();
            cfg.model_path = model_path(c->model);
            cfg.create_backend = llm_cuda_backend_create;
            cfg.block_size = run == 1 ? 1 : 16;
            cfg.num_blocks = 1024;
            if (run == 3) cfg.max_num_batched_tokens = 8;
            llm_engine *e = engine_new(&cfg);
            if (!e) break;
            memset(r, 0, sizeof *r);
            llm_sampling_params p = greedy(c->max_tokens);
            if (run < 3) { /* decode: alone at 16, behind another prompt at 1 and at 16 */
                if (run > 0) run_add(e, r, "Once upon a time there was a long prompt before it", NULL, 0, &p);
                run_add(e, r, c->prompt, NULL, 0, &p);
                run_engine(e, r);
                int at = run > 0, same = 0;
                while (same < sure && same < r->n_tokens[at][0] && r->tokens[at][0][same] == c->ids[same])
                    same++;
                CHECK(same == sure, "%s \"%s\" on the GPU (block size %d%s): greedy ids part from "
                      "llama.cpp's at step %d, before its first step with a gap under %g (%d)", c->model,
                      c->prompt, cfg.block_size, run ? ", batched" : "", same, GT_CLEAR_GAP, sure);
                decoded += same;
            } else { /* teacher-forced */
                int32_t ids[512], want[64];
                p = greedy(1);
                for (int k = 0; k < c->n_ids && k < c->n_gaps && r->n_requests < 64; k++) {
                    if (c->gaps[k] < GT_CLEAR_GAP) continue;
                    memcpy(ids, prompts[i].ids, (size_t)prompts[i].n_ids * sizeof(int32_t));
                    memcpy(ids + prompts[i].n_ids, c->ids, (size_t)k * sizeof(int32_t));
                    want[r->n_requests] = c->ids[k];
                    run_add(e, r, NULL, ids, prompts[i].n_ids + k, &p);
                }
                run_engine(e, r);
                for (int q = 0; q < r->n_requests; q++, forced++) {
                    int ok = r->n_tokens[q][0] == 1 && r->tokens[q][0][0] == want[q];
                    forced_ok += ok;
                    CHECK(ok, "%s teacher-forced on the GPU, request %d: token %d, llama.cpp's %d", c->model,
                          q, r->n_tokens[q][0] ? r->tokens[q][0][0] : -1, want[q]);
                }
            }
            CHECK(all_blocks_free(e) && r->bad_audits == 0, "%s on the GPU: blocks back in the pool",
                  c->model);
            llm_engine_destroy(e);
            runs++;
        }
        printf("engine on the GPU %-20s decode: %d steps before llama.cpp's first gap under %g matched in 3 "
               "runs (%d of %d); teacher-forced: %d of %d clear steps\n", c->model, decoded / 3, GT_CLEAR_GAP,
               decoded, 3 * sure, forced_ok, forced);
    }
    CHECK(runs == 4 * present && present > 0, "%d engine runs on the GPU (4 for each of %d models)", runs,
          present);
    free(cases); free(prompts); free(r);
}

/* Speculative decoding on the GPU: stories260K, greedy, three prompts that repeat a passage, batched, without
 * speculation, with n-gram lookup (5 tokens) and with itself as the draft model (its own CUDA backend and KV
 * pool beside the model's): the same tokens each time (a verify step's rows go through the GEMM at another M
 * than one token's, so this holds only where stories260K's picks are clear of bf16 rounding: they are on
 * these prompts), tokens proposed and kept, fewer steps, every block back. */
static void gpu_test_speculative(void) {
    char repeated[3][1024];
    spec_story_prompts(repeated);
    run_result *r = calloc(3, sizeof *r);
    llm_engine_stats st[3];
    memset(st, 0, sizeof st);
    static const char *const what[3] = {"without speculation", "n-gram lookup", "draft model (itself)"};
    for (int mode = 0; mode < 3; mode++) {
        llm_engine_config cfg = llm_engine_defaults();
        cfg.model_path = model_path("stories260K.gguf");
        cfg.create_backend = llm_cuda_backend_create;
        cfg.num_blocks = 1024;
        cfg.spec_tokens = mode ? 5 : 0;
        if (mode == 2) cfg.spec_model_path = model_path("stories260K.gguf");
        llm_engine *e = engine_new(&cfg);
        if (!e) break;
        llm_sampling_params p = greedy(120);
        for (int k = 0; k < 3; k++) run_add(e, &r[mode], repeated[k], NULL, 0, &p);
        run_engine(e, &r[mode]);
        st[mode] = llm_engine_get_stats(e);
        CHECK(all_blocks_free(e) && r[mode].bad_audits == 0, "speculative decoding on the GPU, %s: every "
              "block back", what[mode]);
        llm_engine_destroy(e);
        if (mode == 0) continue;
        int same = spec_same(&r[0], &r[mode], 1), first = -1;
        for (int i = 0; i < 3 && first < 0; i++)
            for (int t = 0; t < r[0].n_tokens[i][0] && t < r[mode].n_tokens[i][0]; t++)
                if (r[0].tokens[i][0][t] != r[mode].tokens[i][0][t]) { first = t; break; }
        printf("speculative decoding on the GPU, %s: %lld drafts, %lld tokens proposed, %lld kept; the same "
               "tokens as without: %s (first difference at %d)\n", what[mode],
               (long long)st[mode].spec_drafts, (long long)st[mode].spec_draft_tokens,
               (long long)st[mode].spec_accepted_tokens, same ? "yes" : "NO", first);
        CHECK(same && st[mode].spec_accepted_tokens > 0 && st[mode].steps < st[0].steps,
              "speculative decoding on the GPU, %s: the same tokens as without, some proposed tokens kept",
              what[mode]);
    }
    free(r);
}

/* The logits after each of positions p0-1 .. n-1 of tokens[0..n), from a fresh KV pool: the first n_first
 * tokens in one step, then one token a step (n_first = n: one prefill; n_first = p0: a prefill of the prompt,
 * then decode steps). logits: [n - p0 + 1][V]. */
static int gt_run_positions(llm_backend *be, const int32_t *tokens, int n, int n_first, int p0, int V,
                            float *logits, char *err) {
    int32_t table[64], pos[512], rows[512], seq_start[2];
    for (int k = 0; k < 64; k++) table[k] = k;
    const int32_t *bt[1] = {table};
    int out_row = 0;
    if (n > 512 || n > 64 * 16) return -1;
    for (int at = 0; at < n;) {
        int T = at == 0 ? n_first : 1, n_logits = 0;
        for (int i = 0; i < T; i++) {
            pos[i] = at + i;
            if (at + i >= p0 - 1) rows[n_logits++] = i;
        }
        seq_start[0] = 0; seq_start[1] = T;
        llm_batch b = {0};
        b.n_tokens = T; b.tokens = tokens + at; b.positions = pos;
        b.n_seqs = 1; b.seq_start = seq_start; b.block_tables = bt;
        b.n_logits = n_logits; b.logit_rows = rows;
        if (be->forward(be, &b, logits + (size_t)out_row * V, err)) return -1;
        out_row += n_logits;
        at += T;
    }
    return 0;
}

/* One reference case of random-quant-greedy.json (c: float64's completion ids, p: its prompt's ids), fed
 * token by token along the reference (teacher forcing) to the CPU's exact path and to the CUDA backend, once
 * as one prefill (the dequantizing GEMM) and once as a short prefill and decode steps (the GEMV). Every row
 * of logits must be within GT_QUANT_LOGIT_TOL of max |logit| of the CPU's (the forward check's tolerance);
 * a position is clear when the exact CPU ranks the reference token first by more than twice the measured
 * error, and there the GPU ranks it first too. Then the engine on the CUDA backend generates greedily: it
 * must follow float64 at least up to the first position of the decode run that was not clear. */
#define GT_QUANT_LOGIT_TOL 5e-2
static void gt_quant_greedy_case(const llm_model *m, const ref_case *c, const ref_case *p) {
    int p0 = p->n_ids, n_ref = c->n_ids, n = p0 + n_ref - 1, V = m->cfg.vocab_size;
    char err[LLM_ERR_LEN] = "";
    if (p0 < 1 || n_ref < 1 || n > 512) {
        CHECK(0, "%s: a reference case of unexpected size", c->model);
        return;
    }
    int32_t tokens[512];
    memcpy(tokens, p->ids, (size_t)p0 * sizeof(int32_t));
    memcpy(tokens + p0, c->ids, (size_t)(n_ref - 1) * sizeof(int32_t));
    float *lc = malloc((size_t)n_ref * V * 4), *lg = malloc((size_t)n_ref * V * 4);
    if (!lc || !lg) { CHECK(0, "out of memory"); free(lc); free(lg); return; }
    int first_unclear = n_ref;
    for (int mode = 0; mode < 2; mode++) {
        const char *how = mode == 0 ? "one prefill (GEMM)" : "decode steps (GEMV)";
        llm_backend *cpu = gt_backend(llm_cpu_exact_backend_create, m, 64, 16, c->model, "cpu exact");
        llm_backend *gpu = gt_backend(llm_cuda_backend_create, m, 64, 16, c->model, "cuda");
        int rc = cpu && gpu ? 0 : -1;
        if (!rc) {
            rc = gt_run_positions(cpu, tokens, n, mode == 0 ? n : p0, p0, V, lc, err);
            CHECK(rc == 0, "%s \"%s\" %s: cpu: %s", c->model, c->prompt, how, err);
        }
        if (!rc) {
            rc = gt_run_positions(gpu, tokens, n, mode == 0 ? n : p0, p0, V, lg, err);
            CHECK(rc == 0, "%s \"%s\" %s: cuda: %s", c->model, c->prompt, how, err);
        }
        if (cpu) cpu->destroy(cpu);
        if (gpu) gpu->destroy(gpu);
        if (rc) break;
        int clear = 0, agree = 0;
        double worst = 0;
        for (int j = 0; j < n_ref; j++) {
            const float *cr = lc + (size_t)j * V, *gr = lg + (size_t)j * V;
            int want = c->ids[j];
            double dmax = 0, other = -INFINITY, cmax = 0;
            for (int i = 0; i < V; i++) {
                double d = fabs((double)gr[i] - cr[i]);
                dmax = isnan(d) ? INFINITY : fmax(dmax, d);
                cmax = fmax(cmax, fabs(cr[i]));
                if (i != want) other = fmax(other, cr[i]);
            }
            double tol = GT_QUANT_LOGIT_TOL * cmax;
            CHECK(dmax <= tol, "%s \"%s\" %s, completion token %d: logits differ from the exact CPU's by "
                  "%.3g (tolerance %.3g: %.0e of max |logit|)", c->model, c->prompt, how, j, dmax, tol,
                  GT_QUANT_LOGIT_TOL);
            worst = fmax(worst, cmax > 0 ? dmax / cmax : dmax);
            int ag = gt_argmax(gr, V);
            if (cr[want] - other > 2 * dmax) {
                clear++;
                agree += ag == want;
                CHECK(ag == want, "%s \"%s\" %s, completion token %d: the GPU's greedy token is %d, "
                      "float64's %d (CPU margin %.4f, GPU logit error %.4f)",
                      c->model, c->prompt, how, j, ag, want, cr[want] - other, dmax);
            } else if (mode == 1 && first_unclear == n_ref) first_unclear = j;
        }
        printf("quant greedy %-24s \"%.16s\" %-20s: logits within %.2e of max |logit|; %2d/%d positions "
               "clear of that, %d of them agree\n", c->model, c->prompt, how, worst, clear, n_ref,
               agree);
    }
    free(lc); free(lg);

    llm_engine_config cfg = engine_config(c->model);
    cfg.create_backend = llm_cuda_backend_create;
    cfg.kv_bytes = (size_t)64 << 20; /* not 90% of the GPU for a 2-layer model */
    llm_engine *e = engine_new(&cfg);
    if (!e) return;
    run_result *r = calloc(1, sizeof *r);
    if (!r) { CHECK(0, "out of memory"); llm_engine_destroy(e); return; }
    llm_sampling_params sp = greedy(c->max_tokens);
    run_add(e, r, c->prompt, NULL, 0, &sp);
    run_engine(e, r);
    int same = 0;
    while (same < r->n_tokens[0][0] && same < c->n_ids && r->tokens[0][0][same] == c->ids[same]) same++;
    CHECK(same >= first_unclear, "%s \"%s\": the engine on the CUDA backend follows float64's greedy ids for "
          "%d tokens, the decode check found the first close call at %d", c->model, c->prompt, same,
          first_unclear);
    printf("quant greedy %-24s \"%.16s\" engine on cuda: %d/%d tokens as float64's (first close call: %d)\n",
           c->model, c->prompt, same, c->n_ids, first_unclear);
    free(r);
    llm_engine_destroy(e);
}

/* ---- 3b. quantized models: the CUDA backend on the files' blocks against the CPU's exact path ---- */
static void gpu_test_quant_forward(void) {
    ref_case *cases = calloc(16, sizeof *cases), *prompts = calloc(16, sizeof *prompts);
    if (!cases || !prompts) { CHECK(0, "out of memory"); free(cases); free(prompts); return; }
    int n = load_ref_cases("random-quant-greedy.json", "completion_token_ids_float64", cases, 16);
    int np = load_ref_cases("random-quant-greedy.json", "prompt_token_ids", prompts, 16);
    CHECK(n == 14 && np == n, "random-quant-greedy.json: %d cases, %d prompts", n, np);
    for (int f = 0; f < N_QUANT_MODELS; f++) {
        llm_model m;
        char err[LLM_ERR_LEN] = "";
        int rc = llm_model_load(&m, model_path(quant_models[f]), err);
        CHECK(rc == 0, "load %s: %s", quant_models[f], err);
        if (rc) continue;
        gpu_test_forward_model(&m, quant_models[f], 1);
        for (int i = 0; i < n && i < np; i++)
            if (!strcmp(cases[i].model, quant_models[f])) gt_quant_greedy_case(&m, &cases[i], &prompts[i]);
        llm_model_free(&m);
    }
    free(cases); free(prompts);
}

/* ---- benchmarks (LLM_GPU_BENCH=1) ---- */
/* Every tile shape of llm.cu's GEMM (bf16 weights) on llama-3.2-1b's shapes at the M of decode batches and
 * prefill steps, with the backend's split-K and without: microseconds, the fastest marked, beside what the
 * backend picks. What tools/torch_matmul.py gives on the same shapes is the yardstick. */
/* Times g under each tile shape 1..n_cfg, with the backend's split-K and without, appending " 4s 12.3"
 * (shape, split, microseconds) to line; the fastest into *best, *best_k, *best_split. For quantized weights
 * the walk ends at the first shape compiled for bf16 only; any other failure is returned. */
static int gpu_time_gemm_configs(llm_cuda_gemm_run g, int n_cfg, char *line, size_t cap, double *best,
                                 int *best_k, int *best_split, char *err) {
    size_t len = strlen(line);
    *best = 1e30; *best_k = *best_split = 0;
    for (int k = 1; k <= n_cfg; k++)
        for (int split = 0; split < 2; split++) {
            g.config = k; g.no_split = split;
            if (llm_cuda_run_gemm(&g, err)) return g.W_raw && strstr(err, "bf16 weights only") ? 0 : -1;
            if (g.seconds < *best) { *best = g.seconds; *best_k = k; *best_split = split; }
            len += (size_t)snprintf(line + len, cap - len, " %d%c %.1f", k, split ? 'n' : 's',
                                    g.seconds * 1e6);
        }
    return 0;
}

static int gpu_bench_gemm_configs(char *err) {
    static const int Ms[] = {64, 128, 256, 512, 2048, 8192};
    static const struct { const char *name; int N, K; } shapes[] = {
        {"qkv", 3072, 2048}, {"o", 2048, 2048}, {"gate/up", 16384, 2048}, {"down", 2048, 8192},
        {"logits", 128256, 2048}};
    int n_cfg = 0;
    while (llm_cuda_gemm_config_name(n_cfg + 1)) n_cfg++;
    printf("\n== GEMM tile shapes (bf16 weights), time in us; s: with split-K as the backend splits, n: "
           "none ==\n");
    for (int k = 1; k <= n_cfg; k++) printf("config %2d: %s\n", k, llm_cuda_gemm_config_name(k));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            int M = Ms[mi], N = shapes[s].N, K = shapes[s].K;
            if (N > 100000 && M > 256) continue; /* logits: a step's rows of logits are few */
            llm_cuda_gemm_run g = {0};
            g.M = M; g.N = N; g.K = K; g.reps = M >= 2048 ? 5 : 20;
            if (llm_cuda_run_gemm(&g, err)) return -1;
            double flops = 2.0 * M * N * K, t_default = g.seconds, best;
            int best_k, best_split;
            char line[2048];
            snprintf(line, sizeof line, "gemm-cfg %-7s %6dx%-5d M %5d default %8.1f |", shapes[s].name, N, K,
                     M, t_default * 1e6);
            if (gpu_time_gemm_configs(g, n_cfg, line, sizeof line, &best, &best_k, &best_split, err))
                return -1;
            printf("%s\n", line);
            printf("gemm-best %-7s %6dx%-5d M %5d: config %d%c %.1f us (%.0f TFLOP/s), default %.1f us (%.0f "
                   "TFLOP/s)\n", shapes[s].name, N, K, M, best_k, best_split ? 'n' : 's', best * 1e6,
                   flops / best / 1e12, t_default * 1e6, flops / t_default / 1e12);
        }
    /* quantized weights (the tile loader dequantizes): the shapes compiled for every type, the first ones */
    static const uint32_t qtypes[] = {LLM_Q4_K, LLM_Q8_0};
    static const int qMs[] = {64, 256, 2048};
    for (size_t ti = 0; ti < sizeof qtypes / sizeof qtypes[0]; ti++)
        for (size_t s = 0; s < 4; s++) {
            if (s == 1) continue; /* o: as qkv */
            gt_qmat q = {0};
            if (!gt_qmat_random(qtypes[ti], shapes[s].N, shapes[s].K, &q)) {
                snprintf(err, LLM_ERR_LEN, "out of memory");
                return -1;
            }
            for (size_t mi = 0; mi < sizeof qMs / sizeof qMs[0]; mi++) {
                llm_cuda_gemm_run g = {0};
                g.M = qMs[mi]; g.N = q.N; g.K = q.K; g.w_type = q.type; g.W_raw = q.raw; g.reps = 10;
                char line[2048];
                double best;
                int best_k, best_split;
                if (llm_cuda_run_gemm(&g, err)) { free(q.raw); return -1; }
                double t_default = g.seconds;
                snprintf(line, sizeof line, "gemm-q %-5s %-7s M %5d default %8.1f |", llm_dtype_name(q.type),
                         shapes[s].name, g.M, t_default * 1e6);
                if (gpu_time_gemm_configs(g, n_cfg, line, sizeof line, &best, &best_k, &best_split, err)) {
                    free(q.raw);
                    return -1;
                }
                printf("%s\ngemm-q-best %-5s %-7s M %5d: config %d%c %.1f us, default %.1f us\n", line,
                       llm_dtype_name(q.type), shapes[s].name, g.M, best_k, best_split ? 'n' : 's',
                       best * 1e6, t_default * 1e6);
            }
            free(q.raw);
        }
    return 0;
}

/* The kernels alone on llama-3.2-1b's shapes, their inputs filled on the device (NULL in the run structs):
 * GEMM time, TFLOP/s and GB/s per weight shape and M (gpu_bench_gemm); attention, decode of 256 sequences at
 * a context and prefill of whole contexts, over scattered block tables in a big pool (gpu_bench_attention).
 * The attention times include the QKV preparation kernel: they are what one layer's attention costs in the
 * forward pass. Each prints a table. */
static int gpu_bench_gemm(char *err) {
    printf("\n== kernel benchmarks ==\n");
    static const int Ms[] = {1, 16, 256, 4096};
    static const struct { const char *name; int N, K; } shapes[] = {
        {"qkv  3072x2048", 3072, 2048}, {"o    2048x2048", 2048, 2048}, {"gate/up 16384x2048", 16384, 2048},
        {"down 2048x8192", 2048, 8192}, {"logits 128256x2048", 128256, 2048}};
    printf("%-22s %8s %10s %10s %10s\n", "GEMM (N x K)", "M", "time us", "TFLOP/s", "GB/s");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int mi = 0; mi < 4; mi++) {
            llm_cuda_gemm_run g = {0};
            g.M = Ms[mi]; g.N = shapes[s].N; g.K = shapes[s].K; g.reps = g.M >= 4096 ? 5 : 20;
            if (llm_cuda_run_gemm(&g, err)) return -1;
            double t = g.seconds, flops = 2.0 * g.M * g.N * g.K;
            double bytes = 2.0 * g.N * g.K + 2.0 * g.M * g.K + 4.0 * g.M * g.N;
            printf("%-22s %8d %10.1f %10.1f %10.0f\n", shapes[s].name, g.M, t * 1e6, flops / t / 1e12,
                   bytes / t / 1e9);
        }
    return 0;
}

static int gpu_bench_attention(char *err) {
    llm_config cf; memset(&cf, 0, sizeof cf); /* llama-3.2-1b's attention shape */
    cf.dim = 2048; cf.n_heads = 32; cf.n_kv_heads = 8; cf.head_dim = 64; cf.rope_dim = 64;
    cf.rope_base = 500000; cf.rms_eps = 1e-5f; cf.ffn_dim = 8192; cf.n_layers = 1; cf.vocab_size = 128256;
    const int bs = 16, ctxs[] = {256, 1024, 4096}, pool = 256 * (4096 / bs) + 64;
    printf("%-34s %10s %12s\n", "attention (32 q heads, 8 kv, hd 64)", "time us", "KV GB/s");
    for (int mode = 0; mode < 2; mode++)
        for (int ci = 0; ci < 3; ci++) {
            int ctx = ctxs[ci], per_seq = ctx / bs + 1;
            int n_seqs = mode == 0 ? 256 : 4096 / ctx > 0 ? 4096 / ctx : 1;
            if (mode == 1 && ctx < 1024) continue;
            int T = mode == 0 ? n_seqs : n_seqs * ctx; /* prefill: whole contexts of new tokens */
            int32_t *pos = malloc((size_t)T * 4), *start = malloc((size_t)(n_seqs + 1) * 4);
            int32_t *tables = malloc((size_t)n_seqs * per_seq * 4);
            const int32_t **bt = malloc((size_t)n_seqs * sizeof(int32_t *));
            int rc = -1;
            if (!pos || !start || !tables || !bt) snprintf(err, LLM_ERR_LEN, "out of memory");
            else {
                int t = 0;
                for (int s = 0; s < n_seqs; s++) {
                    start[s] = t;
                    for (int k = 0; k < per_seq; k++) /* scattered over the pool */
                        tables[(size_t)s * per_seq + k] = (int)(((size_t)s * 7919 + k * 104729) % pool);
                    bt[s] = tables + (size_t)s * per_seq;
                    if (mode == 0) pos[t++] = ctx - 1;
                    else for (int p = 0; p < ctx; p++) pos[t++] = p;
                }
                start[n_seqs] = t;
                llm_batch b = {0}; /* attention reads no tokens */
                b.n_tokens = T; b.positions = pos;
                b.n_seqs = n_seqs; b.seq_start = start; b.block_tables = bt;
                llm_cuda_attention_run a = {0};
                a.cfg = &cf; a.batch = &b;
                a.num_blocks = pool; a.block_size = bs; a.part_size = 512; a.reps = 5;
                rc = llm_cuda_run_attention(&a, err);
                /* the kernel compiled for any head_dim, beside the one for 64 */
                llm_cuda_attention_run a2 = a;
                a2.generic_kernel = 1;
                if (!rc) rc = llm_cuda_run_attention(&a2, err);
                if (!rc) printf("attention %s %d seqs x ctx %d, the kernel for any head_dim: %.1f us\n",
                                mode == 0 ? "decode" : "prefill", n_seqs, ctx, a2.seconds * 1e6);
                double kv_bytes = (double)n_seqs * ctx * cf.n_kv_heads * cf.head_dim * 2 * 2; /* K, V: bf16 */
                char name[64];
                snprintf(name, sizeof name, "%s %d seqs x ctx %d", mode == 0 ? "decode " : "prefill", n_seqs,
                         ctx);
                if (!rc) printf("%-34s %10.1f %12.0f\n", name, a.seconds * 1e6, kv_bytes / a.seconds / 1e9);
            }
            free(pos); free(start); free(tables); free(bt);
            if (rc) return -1;
        }
    return 0;
}

/* Forward-pass throughput of the backend alone on a dummy model: prefill 256 sequences of 128 tokens in steps
 * of 2048 tokens, then decode all 256 together. */
static void gpu_bench_forward(const char *preset) {
    llm_model m; char err[LLM_ERR_LEN] = "";
    if (llm_model_dummy(&m, preset, 1, err)) { printf("bench %s: %s\n", preset, err); return; }
    const int n_seqs = 256, prompt = 128, decode_steps = 64, bs = 16;
    const int per_seq = (prompt + decode_steps + 1 + bs - 1) / bs;
    llm_backend *be = gt_backend(llm_cuda_backend_create, &m, n_seqs * per_seq, bs, preset, "cuda");
    if (!be) { llm_model_free(&m); return; }
    int32_t *tables = malloc((size_t)n_seqs * per_seq * 4), *tokens = malloc(2048 * 4);
    int32_t *pos = malloc(2048 * 4), start[257], rows[256];
    const int32_t *bt[256];
    for (int i = 0; i < n_seqs * per_seq; i++) tables[i] = i;
    float *logits = malloc((size_t)n_seqs * m.cfg.vocab_size * 4);
    llm_batch b = {0}; /* n_tokens, n_seqs and n_logits per step */
    b.tokens = tokens; b.positions = pos; b.seq_start = start; b.block_tables = bt; b.logit_rows = rows;
    double t0 = llm_now();
    int ok = 1;
    for (int s0 = 0; s0 < n_seqs && ok; s0 += 2048 / prompt) { /* 16 prompts per step */
        int ns = 2048 / prompt, T = 0;
        for (int s = 0; s < ns; s++) {
            start[s] = T; bt[s] = tables + (size_t)(s0 + s) * per_seq;
            for (int p = 0; p < prompt; p++) { tokens[T] = (s0 + s + p) % m.cfg.vocab_size; pos[T++] = p; }
            rows[s] = T - 1;
        }
        start[ns] = T;
        b.n_tokens = T; b.n_seqs = b.n_logits = ns;
        ok = be->forward(be, &b, logits, err) == 0;
    }
    double t1 = llm_now();
    for (int step = 0; step < decode_steps && ok; step++) {
        for (int s = 0; s < n_seqs; s++) {
            start[s] = s; tokens[s] = (s + step) % m.cfg.vocab_size; pos[s] = prompt + step;
            bt[s] = tables + (size_t)s * per_seq; rows[s] = s;
        }
        start[n_seqs] = n_seqs;
        b.n_tokens = b.n_seqs = b.n_logits = n_seqs;
        ok = be->forward(be, &b, logits, err) == 0;
    }
    double t2 = llm_now();
    CHECK(ok, "bench %s: %s", preset, err);
    if (ok)
        printf("forward %-16s prefill %d x %d tokens: %.0f tok/s | decode %d seqs x %d steps (ctx %d-%d): "
               "%.2f ms/step, %.0f tok/s (logits to host incl.)\n",
               preset, n_seqs, prompt, n_seqs * prompt / (t1 - t0), n_seqs, decode_steps, prompt,
               prompt + decode_steps, (t2 - t1) / decode_steps * 1e3,
               (double)n_seqs * decode_steps / (t2 - t1));
    free(tables); free(tokens); free(pos); free(logits);
    be->destroy(be); llm_model_free(&m);
}

static void run_gpu_tests(void) {
    const char *s = getenv("LLM_GPU_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("gpu tests: seed %llu (LLM_GPU_SEED=%llu repeats this run)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    gt_rng = seed;
    double t0 = llm_now();
    /* LLM_GPU_BENCH=1: the checks, then every benchmark; a list of parts (gemm, tiles, attention, forward):
     * those benchmarks alone (to profile one, say) */
    const char *bench = getenv("LLM_GPU_BENCH");
    int only = bench && strcmp(bench, "1") != 0;
    if (only) { /* every part named must be one of these: a misspelt one would run nothing and pass */
        char list[256], *part, *rest = list;
        int parts = 0;
        snprintf(list, sizeof list, "%s", bench);
        while ((part = strtok_r(rest, ", ", &rest))) {
            parts++;
            if (strcmp(part, "gemm") && strcmp(part, "tiles") && strcmp(part, "attention") &&
                strcmp(part, "forward")) {
                CHECK(0, "LLM_GPU_BENCH: no benchmark named '%s' (1, or a list of gemm, tiles, attention, "
                      "forward)", part);
                return;
            }
        }
        CHECK(parts > 0, "LLM_GPU_BENCH is empty: 1, or a list of gemm, tiles, attention, forward");
        goto benchmarks;
    }
    gpu_test_gemm();
    printf("gemm checks: %.1f s\n", llm_now() - t0);
    gpu_test_quant_gemm();
    printf("quantized GEMV / GEMM checks: %.1f s\n", llm_now() - t0);
    gpu_test_attention();
    printf("attention checks: %.1f s\n", llm_now() - t0);
    gpu_test_forward();
    printf("forward checks: %.1f s\n", llm_now() - t0);
    gpu_test_engine_archs();
    printf("engine checks (new architectures): %.1f s\n", llm_now() - t0);
    gpu_test_speculative();
    printf("speculative decoding checks: %.1f s\n", llm_now() - t0);
    gpu_test_quant_forward();
    printf("quantized model checks: %.1f s\n", llm_now() - t0);
benchmarks:
    if (bench) {
        char err[LLM_ERR_LEN] = "";
        if (!only || strstr(bench, "gemm")) CHECK(gpu_bench_gemm(err) == 0, "GEMM benchmarks: %s", err);
        if (!only || strstr(bench, "tiles")) CHECK(gpu_bench_gemm_configs(err) == 0, "GEMM tiles: %s", err);
        if (!only || strstr(bench, "attention"))
            CHECK(gpu_bench_attention(err) == 0, "attention benchmarks: %s", err);
        if (!only || strstr(bench, "forward")) {
            gpu_bench_forward("tinyllama-1.1b");
            gpu_bench_forward("llama-3.2-1b");
        }
    }
}
#endif /* LLM_CUDA */

/* llm-test --split NAME, for tools/pretok_check.py: loads a made-up vocabulary whose tokenizer.ggml.pre is
 * NAME and prints "warning: " and the loader's warning (empty when it knows the name); then reads texts from
 * stdin, one per line in hex, and prints for each the characters (after the first) where its words start. */
static int split_mode(const char *name) {
    static const char *const tokens[] = {"a"}, *const merges[] = {"a a"};
    char err[LLM_ERR_LEN] = "";
    tok_gguf_buf b;
    llm_gguf g;
    tok_gguf_start(&b, 4);
    tok_gguf_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    tok_gguf_kv_str(&b, "tokenizer.ggml.pre", name);
    tok_gguf_kv_strs(&b, "tokenizer.ggml.tokens", tokens, 1);
    tok_gguf_kv_strs(&b, "tokenizer.ggml.merges", merges, 1);
    llm_tokenizer *t = llm_gguf_parse(&g, b.data, b.n, err) == 0 ? llm_tokenizer_load(&g, err) : NULL;
    if (!t) { fprintf(stderr, "llm-test --split: %s\n", err); return 1; }
    printf("warning: %s\n", llm_tokenizer_warning(t));
    char *line = NULL, *text = NULL;
    size_t line_cap = 0;
    ssize_t len;
    while ((len = getline(&line, &line_cap, stdin)) > 0) {
        size_t n = (size_t)len / 2;
        uint32_t *cp = (uint32_t *)malloc((n + 1) * sizeof *cp);
        char *cls = (char *)malloc(n + 1);
        uint8_t *cut = (uint8_t *)malloc(n + 1);
        int *off = (int *)malloc((n + 1) * sizeof *off);
        text = (char *)realloc(text, n + 1);
        for (size_t i = 0; i < n; i++) { unsigned v; sscanf(line + 2 * i, "%2x", &v); text[i] = (char)v; }
        int nc = llm_decode_text(text, n, cp, cls, off);
        llm_pretokenize(t->pre, cp, cls, nc, cut);
        for (int i = 1, first = 1; i < nc; i++) if (cut[i]) { printf(first ? "%d" : " %d", i); first = 0; }
        printf("\n");
        free(cp); free(cls); free(cut); free(off);
    }
    free(line); free(text);
    llm_tokenizer_free(t); llm_gguf_close(&g);
    return 0;
}

/* Every file the tests read, and how a user gets it when it is missing: the run then fails at once, naming
 * the file, instead of in many places with an open error. */
static void test_testdata_present(void) {
    static const char *const in_git[] = {
        "tokenizer/ggml-vocab-gpt-2.gguf", "tokenizer/ggml-vocab-llama-bpe.gguf",
        "tokenizer/ggml-vocab-llama-spm.gguf", "tokenizer/ggml-vocab-qwen2.gguf", "models/stories260K.gguf",
        "models/random-quant-q2_k.gguf", "models/random-quant-q6_k.gguf", "reference/stories260K-greedy.json",
        "reference/random-models-greedy.json", "reference/random-quant-greedy.json"};
    static const char *const made[] = {
        "models/random-llama3-gqa.gguf", "models/random-qwen2-bias.gguf", "models/random-qwen3-qknorm.gguf",
        "models/random-llama2-untied.gguf", "models/random-qwen2moe.gguf", "models/random-gpt-oss-mxfp4.gguf",
        "models/random-llama3-rope-freqs.gguf", "models/random-phi3-longrope.gguf"};
    char path[1024];
    for (size_t i = 0; i < sizeof in_git / sizeof in_git[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", testdata_dir, in_git[i]);
        CHECK(access(path, R_OK) == 0, "%s is missing: it is in the repository (git checkout testdata/), "
              "or give ./llm-test the folder that holds it", path);
    }
    for (size_t i = 0; i < sizeof made / sizeof made[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", testdata_dir, made[i]);
        CHECK(access(path, R_OK) == 0, "%s is missing: 'make testdata' writes it (testdata/README.md)", path);
    }
    CHECK(access(CHAT_MODEL, R_OK) == 0, "%s is missing: 'make model' fetches it from PyPI", CHAT_MODEL);
}

/* One test, and its line: name, ok or FAILED, seconds. */
struct test_entry { const char *name; void (*fn)(void); };
static void run_test(const struct test_entry *t) {
    int failed_before = n_failed;
    double t0 = llm_now();
    t->fn();
    printf("%-28s %s (%.1f s)\n", t->name, n_failed == failed_before ? "ok" : "FAILED", llm_now() - t0);
}

/* Runs the picked tests (indices into tests, in order) and prints "N passed, N failed". With jobs > 1
 * (LLM_TEST_JOBS=N) that many forked processes share them, each taking the next test nobody has taken: the
 * tests hold nothing across each other (each loads what it reads, servers take --port 0, files are
 * mkstemp's), and a build under AddressSanitizer runs one core of the machine's. A process holds a test's
 * stdout in a file and prints it whole when the test ends, so the lines of two tests never mix; a process
 * that dies (a sanitizer's report, a crash) counts as a failure, named with the test it was running. */
enum { TEST_MAX_JOBS = 64 }; /* the processes' slots in the shared page (main refuses more) */
static int run_tests(const struct test_entry *tests, const int *picked, int n_picked, int jobs) {
    if (jobs <= 1) {
        for (int k = 0; k < n_picked; k++) run_test(&tests[picked[k]]);
        printf("%d passed, %d failed\n", n_passed, n_failed);
        return n_failed ? 1 : 0;
    }
    struct { pthread_mutex_t print; int next, passed, failed, running[TEST_MAX_JOBS]; } *shared =
        mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) { perror("llm-test: mmap"); return 1; }
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&shared->print, &attr);
    fflush(stdout); fflush(stderr);
    pid_t pids[64];
    for (int j = 0; j < jobs; j++) {
        shared->running[j] = -1;
        pids[j] = fork();
        if (pids[j] < 0) { perror("llm-test: fork"); jobs = j; break; }
        if (pids[j] > 0) continue;
        for (;;) {
            int k = __atomic_fetch_add(&shared->next, 1, __ATOMIC_SEQ_CST);
            if (k >= n_picked) break;
            shared->running[j] = picked[k];
            FILE *held = tmpfile();
            int out = held ? dup(1) : -1;
            if (out >= 0) dup2(fileno(held), 1);
            run_test(&tests[picked[k]]);
            fflush(stdout);
            if (out < 0) { if (held) fclose(held); continue; }
            dup2(out, 1); close(out);
            rewind(held);
            pthread_mutex_lock(&shared->print);
            char buf[8192];
            for (size_t got; (got = fread(buf, 1, sizeof buf, held)) > 0;) fwrite(buf, 1, got, stdout);
            fflush(stdout);
            pthread_mutex_unlock(&shared->print);
            fclose(held);
        }
        shared->running[j] = -1;
        __atomic_fetch_add(&shared->passed, n_passed, __ATOMIC_SEQ_CST);
        __atomic_fetch_add(&shared->failed, n_failed, __ATOMIC_SEQ_CST);
        exit(0); /* exit, not _exit: LeakSanitizer's check runs at exit, and a leak makes the status 23 */
    }
    for (int j = 0; j < jobs; j++) {
        int status = 0;
        while (waitpid(pids[j], &status, 0) < 0 && errno == EINTR) {}
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
        int t = shared->running[j];
        shared->failed++;
        printf("FAIL llm-test process %d of %d (pid %d) %s %d%s%s\n", j + 1, jobs, (int)pids[j],
               WIFSIGNALED(status) ? "died of signal" : "exited with", WIFSIGNALED(status) ?
               WTERMSIG(status) : WEXITSTATUS(status), t >= 0 ? " in the test " : " after its tests",
               t >= 0 ? tests[t].name : "");
    }
    printf("%d passed, %d failed\n", shared->passed, shared->failed);
    return shared->failed ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--split")) return split_mode(argv[2]);
    int gpu = argc > 1 && !strcmp(argv[1], "--gpu");
    if (argc > 1 + gpu) testdata_dir = argv[1 + gpu];
#ifdef LLM_CUDA
    if (gpu) {
        run_gpu_tests();
        printf("%d passed, %d failed\n", n_passed, n_failed);
        return n_failed ? 1 : 0;
    }
#endif
    if (gpu) { printf("llm-test --gpu: built without CUDA\n"); return 1; }
    static const struct test_entry tests[] = {
        {"test data", test_testdata_present},
        {"tokenizer fixtures", test_tokenizer_fixtures},
        {"streaming detokenizer", test_detokenizer_streaming},
        {"tokenizer api", test_tokenizer_api}, {"odd vocabularies", test_tokenizer_odd_vocabularies},
        {"pre-tokenizers", test_pretokenizers},
        {"pre-tokenizers on long runs", test_pretokenizer_long_runs},
        {"special token search", test_special_token_search},
        {"detokenizer on references", test_detokenizer_references},
        {"gguf values", test_gguf_values}, {"gguf errors", test_gguf_errors},
        {"stories260K references", test_stories_reference},
        {"random model references", test_random_models_reference},
        {"random models of newer architectures", test_random_archs_reference},
        {"Gemma 3 270M against float64", test_gemma3_270m}, {"RoPE scaling", test_rope_scaling},
        {"RoPE factors (Llama 3.1, Phi-3.5)", test_rope_factors},
        {"RoPE as frequencies (llm.cu's)", test_rope_freqs},
        {"paged forward", test_paged_forward_models},
        {"half floats", test_half_conversion}, {"weight types", test_weight_types},
        {"quant dequantization", test_quant_dequant}, {"quant references", test_quant_reference},
        {"mxfp4", test_mxfp4},
        {"quant dot products", test_quant_dots}, {"quant prefill tiles", test_quant_tiles},
        {"quant prefill AMX", test_quant_amx},
        {"quant fast path", test_quant_fast_path},
        {"quant SmolLM2", test_quant_smollm2}, {"decode tiles SmolLM2", test_decode_tiles_smollm2},
        {"decode tiles Q4_K_M", test_decode_tiles_q4_k_m},
        {"decode tiles Q5_0", test_decode_tiles_q5_0}, {"decode tiles Q5_1", test_decode_tiles_q5_1},
        {"decode tiles Q5_K_M", test_decode_tiles_q5_k_m}, {"decode tiles Q3_K_M", test_decode_tiles_q3_k_m},
        {"decode tiles Q2_K", test_decode_tiles_q2_k},
        {"decode tiles MoE", test_decode_tiles_moe}, {"decode tiles MXFP4", test_decode_tiles_mxfp4},
        {"decode tiles Gemma 3", test_decode_tiles_gemma3},
        {"fidelity of the default path", test_fidelity_smollm2},
        {"kv quant blocks", test_kv_quant_blocks}, {"kv quant capacity", test_kv_quant_capacity},
        {"kv quant fidelity", test_kv_quant_fidelity}, {"kv quant speculative", test_kv_quant_speculative},
        {"sampler", test_sampler}, {"sample step: rows", test_sample_rows},
        {"block manager", test_block_manager},
        {"batch invariance", test_batch_invariance}, {"priority scheduling", test_priority_scheduling},
        {"prefix cache", test_prefix_cache}, {"sliding window blocks", test_sliding_window_blocks},
        {"engine pooling", test_engine_pooling}, {"think budget", test_engine_think_budget},
        {"speculative decoding", test_speculative},
        {"speculative decoding: n-gram proposer", test_spec_propose},
        {"parallel sampling", test_parallel_sampling},
        {"stop conditions", test_stop_conditions}, {"logit bias", test_logit_bias},
        {"grammar: GBNF", test_grammar_gbnf}, {"grammar: masks", test_grammar_masks},
        {"grammar: the grammar thread", test_grammar_thread},
        {"grammar: generation", test_grammar_generation}, {"grammar: JSON Schema", test_grammar_schemas},
        {"grammar: JSON Schema number ranges, uniqueItems", test_grammar_number_ranges},
        {"grammar: command line", test_grammar_cli},
        {"grammar: bounds on what requests drive", test_grammar_bounds},
        {"abort and limits", test_abort_and_limits},
        {"logprobs", test_logprobs}, {"prompt logprobs", test_prompt_logprobs},
        {"requests from a thread", test_threads}, {"user pointers", test_user_pointers},
        {"wait for work", test_wait},
        {"cpu features", test_cpu_features}, {"backend errors", test_backend_errors},
        {"sample step", test_sample_step},
        {"token budget per backend", test_backend_budget}, {"KV pool reuse", test_pool_reuse},
        {"KV pool beside a draft model", test_draft_pool_memory},
        {"llm command", test_cli}, {"llm.h's example", test_docs_example},
        {"sampling from the file", test_sampling_keys},
        {"fault: add_request race", test_fault_add_request_race}, {"fault: sampling", test_fault_sampling},
        {"fault: requests", test_fault_requests}, {"fault: gguf numbers", test_fault_gguf_numbers},
        {"fault: command line", test_fault_command_line}, {"fault: wait policy", test_fault_wait_policy},
        {"threads for the load", test_threads_for_load},
        {"chat templates", test_chat_templates},
        {"chat templates: tools against Jinja", test_chat_tools_jinja},
        {"chat templates: work per message", test_chat_render_work},
        {"tool calls: grammar and reading back", test_tool_calls},
        {"tool calls: Mistral's marker token", test_tool_marker_token},
        {"gpt-oss: harmony tokens, grammar, reply", test_harmony_tokens},
        {"chat template detection", test_chat_detect},
        {"chat, piped", test_chat_piped}, {"chat on a terminal", test_chat_terminal},
        {"server endpoints", test_server_endpoints}, {"server vLLM fields", test_server_vllm_fields},
        {"server prompt logprobs", test_server_prompt_logprobs},
        {"server speculative decoding", test_server_speculative},
        {"server errors", test_server_errors}, {"server messages", test_server_messages},
        {"server responses", test_server_responses}, {"server compact", test_server_compact},
        {"server embeddings", test_server_embeddings},
        {"server structured output", test_server_structured},
        {"server: a costly grammar slows only itself", test_server_grammar_isolation},
        {"server: requests read by workers", test_server_request_workers},
        {"server structured output: bounds, big choices, $defs in tools", test_server_grammar_bounds},
        {"server tools and reasoning", test_server_tools},
        {"server tools, Mistral", test_server_mistral_tools},
        {"server connections", test_server_connections},
        {"server sampling from the file", test_server_sampling_keys},
        {"server replicas: ids, cache, metrics", test_server_replica}, {"server draining", test_server_drain},
        {"server hostile http: framing", test_server_http_framing},
        {"server hostile http: backpressure", test_server_backpressure},
        {"server hostile http: fd limit", test_server_fd_limit},
        {"server hostile http: cross-origin", test_server_cross_origin},
        {"layers left out", test_layers},
        {"llm.h's layout", test_header_layout},
        {"source lines", test_source_shape},
        {"README's size and links", test_readme_pages}, {"README's commands", test_readme},
    };
    /* LLM_TEST=server,chat runs the tests whose names hold "server" or "chat" */
    const char *only = getenv("LLM_TEST");
    int n_tests = (int)(sizeof tests / sizeof tests[0]), picked_tests[sizeof tests / sizeof tests[0]];
    int n_picked = 0;
    for (int i = 0; i < n_tests; i++) {
        int picked = !only;
        for (const char *w = only; w && *w && !picked; w += strcspn(w, ",")) {
            w += *w == ',';
            w += strspn(w, " \t"); /* (a Makefile's continued line leaves a space) */
            size_t n = strcspn(w, ",");
            char word[64];
            snprintf(word, sizeof word, "%.*s", (int)(n < 63 ? n : 63), w);
            picked = n > 0 && strstr(tests[i].name, word) != NULL;
        }
        if (picked) picked_tests[n_picked++] = i;
    }
    const char *jobs_env = getenv("LLM_TEST_JOBS");
    char *jobs_end = NULL;
    long jobs = jobs_env ? strtol(jobs_env, &jobs_end, 10) : 1;
    if (jobs_env && (jobs_end == jobs_env || *jobs_end || jobs < 1 || jobs > TEST_MAX_JOBS)) {
        fprintf(stderr, "llm-test: LLM_TEST_JOBS=%s: want a count of processes, 1 to %d\n", jobs_env,
                TEST_MAX_JOBS);
        return 2;
    }
    if (jobs > 1) {
        /* the slowest first, so that no process is left with one of them at the end while the others wait */
        static const char *slowest[] = {"grammar: generation", "README's commands", "grammar: JSON Schema",
                                        "speculative decoding", "Gemma 3 270M", "kv quant speculative"};
        int order[sizeof tests / sizeof tests[0]], n = 0;
        for (size_t s = 0; s < sizeof slowest / sizeof *slowest; s++)
            for (int k = 0; k < n_picked; k++)
                if (picked_tests[k] >= 0 && strstr(tests[picked_tests[k]].name, slowest[s]))
                    order[n++] = picked_tests[k], picked_tests[k] = -1;
        for (int k = 0; k < n_picked; k++)
            if (picked_tests[k] >= 0) order[n++] = picked_tests[k];
        memcpy(picked_tests, order, sizeof(int) * n_picked);
    }
    return run_tests(tests, picked_tests, n_picked, (int)jobs);
}
