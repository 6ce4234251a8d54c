/* fuzz_http.c - libFuzzer target: server.c's HTTP/1.1 request parser (http_feed: heads, bodies, chunked
 * bodies, trailers).
 *
 * The input's first byte chooses where reads end (pieces of 1 to that byte + 1 bytes, from a generator it
 * seeds); the rest is what a client sent on one connection. It is fed as conn_process feeds it: each read
 * appended to the bytes not taken yet, http_feed called until it wants more, what it took dropped, each
 * request's head, whole request (method, path, keep-alive, body) or error status folded into a transcript.
 * Checks (abort() when one fails):
 *   - the same bytes in one read give the same transcript: where the reads fall changes nothing (a chunk
 *     size, an extension, a CRLF or a trailer split anywhere; the smuggling of issue 50 was a body decoded
 *     again, differently, after a split);
 *   - http_feed takes no more than it is given, answers HTTP_HEAD, HTTP_OK, HTTP_INCOMPLETE or one of the
 *     error statuses the server sends (with why), leaves method and path NUL-terminated, a body within 8 MiB;
 *   - it reads nothing outside its bytes: each call gets an exact-size copy (nothing after them) for ASan. */
#include "fuzz/fuzz_server.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
    return h;
}

/* Feeds data[0..size) in pieces of 1..max_piece bytes (all at once when max_piece is 0); the transcript. */
static uint64_t feed(const uint8_t *data, size_t size, unsigned max_piece, uint64_t rng) {
    http_parser *p = (http_parser *)calloc(1, sizeof *p);
    FUZZ_CHECK(p, "out of memory");
    char *pending = NULL;
    size_t n_pending = 0, at = 0;
    uint64_t h = 1469598103934665603ULL;
    int failed = 0;
    while (!failed && at < size) {
        size_t k = max_piece ? 1 + (size_t)(llm_splitmix64(&rng) % max_piece) : size;
        if (k > size - at) k = size - at;
        pending = (char *)realloc(pending, n_pending + k);
        FUZZ_CHECK(pending, "out of memory");
        memcpy(pending + n_pending, data + at, k);
        n_pending += k; at += k;
        for (;;) {
            char *exact = (char *)malloc(n_pending ? n_pending : 1); /* nothing after the bytes */
            FUZZ_CHECK(exact, "out of memory");
            memcpy(exact, pending, n_pending);
            size_t used = 0;
            int rc = http_feed(p, exact, n_pending, &used);
            free(exact);
            FUZZ_CHECK(used <= n_pending, "took %zu of %zu bytes", used, n_pending);
            memmove(pending, pending + used, n_pending - used);
            n_pending -= used;
            if (rc == HTTP_INCOMPLETE) break;
            h = fnv(h, &rc, sizeof rc);
            if (rc == HTTP_HEAD || rc == HTTP_OK) {
                http_request *rq = &p->rq;
                FUZZ_CHECK(memchr(rq->method, 0, sizeof rq->method) && memchr(rq->path, 0, sizeof rq->path) &&
                           memchr(rq->auth, 0, sizeof rq->auth) && memchr(rq->origin, 0, sizeof rq->origin),
                           "method, path, auth or origin not NUL-terminated");
                FUZZ_CHECK(rq->method[0] && rq->path[0], "an empty method or path");
                if (rc == HTTP_HEAD) continue;
                FUZZ_CHECK(rq->body.len <= SRV_MAX_BODY, "a body of %zu bytes", rq->body.len);
                h = fnv(h, rq->method, strlen(rq->method));
                h = fnv(h, rq->path, strlen(rq->path) + 1);
                h = fnv(h, &rq->keep_alive, sizeof rq->keep_alive);
                h = fnv(h, &rq->body.len, sizeof rq->body.len);
                if (rq->body.len) h = fnv(h, rq->body.s, rq->body.len);
                http_parser_reset(p);
                continue;
            }
            FUZZ_CHECK(rc == 400 || rc == 413 || rc == 431 || rc == 500 || rc == 501, "http_feed answered %d",
                       rc);
            FUZZ_CHECK(p->why && p->why[0], "status %d without a reason", rc);
            failed = 1; /* the server answers and closes: nothing after is read */
            break;
        }
    }
    http_parser_reset(p);
    free(p);
    free(pending);
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned max_piece = (unsigned)data[0] + 1;
    uint64_t whole = feed(data + 1, size - 1, 0, 0);
    uint64_t split = feed(data + 1, size - 1, max_piece, data[0]);
    FUZZ_CHECK(whole == split, "reads of 1 to %u bytes parse otherwise than one read", max_piece);
    return 0;
}
