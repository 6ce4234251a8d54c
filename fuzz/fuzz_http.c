/* fuzz_http.c - libFuzzer target: server.c's HTTP/1.1 request parser (http_parse, with http_dechunk).
 *
 * The input is what a client sent on one connection. It goes into a buffer as the server keeps it (an sbuf:
 * the bytes, then a NUL) and is parsed as conn_process does: while http_parse says HTTP_OK, the request is
 * taken off the front (memmove) and the next pipelined one parsed. Checks (abort() when one fails): a request
 * uses between 1 and all of the bytes there are; its header and body lie inside them; method and path are
 * NUL-terminated; the answer is HTTP_OK, HTTP_INCOMPLETE or one of the error statuses the server answers. The
 * input is also parsed whole in an exact-size copy (no NUL after it), one request, as a second check that
 * nothing is read past the bytes given. */
#include "fuzz/fuzz_server.h"

static void check_request(const char *buf, size_t len, const http_request *rq, int rc, size_t used) {
    FUZZ_CHECK(rc == HTTP_OK || rc == HTTP_INCOMPLETE || rc == 400 || rc == 413 || rc == 431 || rc == 501,
               "http_parse answered %d", rc);
    if (rc != HTTP_OK) return;
    FUZZ_CHECK(used > 0 && used <= len, "a request of %zu bytes out of %zu", used, len);
    FUZZ_CHECK(rq->header_len >= 4 && rq->header_len <= used, "header_len %zu, request %zu bytes",
               rq->header_len, used);
    FUZZ_CHECK(rq->body >= buf && rq->body_len <= len && rq->body + rq->body_len <= buf + len,
               "the body (%zu bytes at %td) lies outside the %zu bytes", rq->body_len, rq->body - buf, len);
    FUZZ_CHECK(memchr(rq->method, 0, sizeof rq->method) && memchr(rq->path, 0, sizeof rq->path) &&
               memchr(rq->auth, 0, sizeof rq->auth), "method, path or auth not NUL-terminated");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* as the server keeps a connection's input: an sbuf (NUL after the bytes) */
    sbuf in = {0};
    sb_put(&in, (const char *)data, size);
    FUZZ_CHECK(!in.failed, "out of memory");
    for (int n = 0; in.len > 0; n++) {
        http_request rq;
        size_t used = 0;
        int rc = http_parse(in.s, in.len, &rq, &used);
        check_request(in.s, in.len, &rq, rc, used);
        if (rc != HTTP_OK) break;
        volatile unsigned sink = 0; /* touch the body: ASan checks it is inside the buffer */
        for (size_t i = 0; i < rq.body_len; i++) sink += (unsigned char)rq.body[i];
        (void)sink;
        memmove(in.s, in.s + used, in.len - used); /* conn_process, after handle_request */
        in.len -= used;
    }
    sb_free(&in);

    /* an exact-size copy, nothing after it */
    if (size > 0) {
        char *buf = (char *)malloc(size);
        FUZZ_CHECK(buf, "out of memory");
        memcpy(buf, data, size);
        http_request rq;
        size_t used = 0;
        int rc = http_parse(buf, size, &rq, &used);
        check_request(buf, size, &rq, rc, used);
        free(buf);
    }
    return 0;
}
