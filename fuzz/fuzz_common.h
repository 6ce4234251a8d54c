/* fuzz_common.h - what the libFuzzer targets in fuzz/ share: a reader that takes values from the input's
 * bytes (as LLVM's FuzzedDataProvider does), a strict UTF-8 validator, and a check that aborts with a
 * message.
 * Each target includes llm.h's implementation itself (or server.c's, through the same llm.h) before this. */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A property that must hold: when it does not, say which and abort (libFuzzer saves the input as a crash). */
#define FUZZ_CHECK(cond, ...) do { \
        if (!(cond)) { \
            fprintf(stderr, "\n%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__); \
            fprintf(stderr, "\n"); \
            abort(); \
        } \
    } while (0)

/* Values out of the input, front to back; past the end every read gives zeros (any input means something). */
typedef struct { const uint8_t *p; size_t n; } fz_in;

static inline uint8_t fz_u8(fz_in *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}
/* (each read its own statement: the order of two calls in one expression is unspecified) */
static inline uint16_t fz_u16(fz_in *in) { uint16_t lo = fz_u8(in); return (uint16_t)(lo | fz_u8(in) << 8); }
static inline uint32_t fz_u32(fz_in *in) { uint32_t lo = fz_u16(in); return lo | (uint32_t)fz_u16(in) << 16; }
static inline uint64_t fz_u64(fz_in *in) { uint64_t lo = fz_u32(in); return lo | (uint64_t)fz_u32(in) << 32; }
static inline int fz_range(fz_in *in, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(fz_u32(in) % (uint32_t)(hi - lo + 1));
}
/* A float from its raw bits: NaN, infinities, denormals and negative zero all occur. */
static inline float fz_raw_float(fz_in *in) {
    uint32_t u = fz_u32(in);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* Mostly a sensible value in [lo, hi] (so that requests run), sometimes the raw bits of any float. */
static inline float fz_float(fz_in *in, float lo, float hi) {
    uint8_t how = fz_u8(in);
    if (how < 16) return fz_raw_float(in);
    if (how < 24) { static const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 1e-45f, 1e30f, 2.0f, 0.5f};
                    return edge[how - 16]; }
    return lo + (hi - lo) * (float)fz_u16(in) / 65535.0f;
}
/* Up to max bytes (a length byte, then the bytes), NUL-terminated in out[max + 1]. */
static inline size_t fz_str(fz_in *in, char *out, size_t max) {
    size_t n = fz_u8(in) % (max + 1);
    if (n > in->n) n = in->n;
    memcpy(out, in->p, n);
    out[n] = 0;
    in->p += n; in->n -= n;
    return n;
}

/* Strict UTF-8 (RFC 3629: shortest forms, no surrogates, at most U+10FFFF). Returns the offset of the first
 * bad byte, or n when all of it is valid. */
static inline size_t fz_utf8_bad_at(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) { i++; continue; }
        int len; unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return i;
        if (n - i < (size_t)len) return i;
        for (int k = 1; k < len; k++) {
            if (p[i + k] < lo || p[i + k] > hi) return i;
            lo = 0x80; hi = 0xBF;
        }
        i += (size_t)len;
    }
    return n;
}
static inline int fz_utf8_valid(const char *s, size_t n) { return fz_utf8_bad_at(s, n) == n; }

/* A few bytes around offset at, in hex, for a message. */
static inline const char *fz_hex_around(const char *s, size_t n, size_t at) {
    static char buf[128];
    size_t from = at > 8 ? at - 8 : 0, to = at + 8 < n ? at + 8 : n, k = 0;
    for (size_t i = from; i < to && k + 4 < sizeof buf; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, i == at ? "[%02x]" : "%02x ", (unsigned char)s[i]);
    buf[k] = 0;
    return buf;
}

/* ids -> text with llm_detokenize, as callers use it (ask the length, then write): the same length both
 * times, NUL-terminated, valid UTF-8. Returns the text (malloc'd) and its length in *len. */
static inline char *fz_detokenize_checked(const llm_tokenizer *t, const int32_t *ids, int n, int special,
                                          int *len) {
    int need = llm_detokenize(t, ids, n, special, NULL, 0);
    FUZZ_CHECK(need >= 0, "llm_detokenize failed (%d ids)", n);
    char *text = (char *)malloc((size_t)need + 1);
    FUZZ_CHECK(text, "out of memory");
    int got = llm_detokenize(t, ids, n, special, text, need + 1);
    FUZZ_CHECK(got == need, "llm_detokenize: %d bytes with no room, %d with room", need, got);
    FUZZ_CHECK(text[got] == 0, "llm_detokenize: the text is not NUL-terminated");
    size_t bad = fz_utf8_bad_at(text, (size_t)got);
    FUZZ_CHECK(bad == (size_t)got, "llm_detokenize: not UTF-8 at byte %zu of %d: %s", bad, got,
               fz_hex_around(text, (size_t)got, bad));
    *len = got;
    return text;
}

/* The test data: $LLM_TESTDATA (the Makefile passes its TESTDATA), else testdata (run from the root). */
static inline const char *fz_testdata_dir(void) {
    const char *d = getenv("LLM_TESTDATA");
    return d && *d ? d : "testdata";
}

#endif /* FUZZ_COMMON_H */
