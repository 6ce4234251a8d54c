/* server.c - llm serve: an OpenAI-compatible HTTP/1.1 server on bare POSIX sockets, like vLLM's API server.
 *
 * main.c includes this file (the llm command is one translation unit), after llm.h's implementation and a
 * now_s() (a monotonic clock in seconds); it uses the engine API of llm.h and nothing else. It serves one
 * model: /v1/completions and /v1/chat/completions (whole JSON bodies, or streamed as Server-Sent Events),
 * /v1/models, /tokenize, /detokenize, /health, /ping, /version and /metrics, with vLLM's extra fields and
 * its metric names, so that OpenAI's clients, vLLM's benchmarks and Prometheus dashboards work unchanged.
 *
 * Three kinds of thread, and what each one owns:
 *   - the network thread (the one that calls serve) runs one epoll loop over the listening socket, every
 *     connection and a wake-up pipe. It reads and parses HTTP, answers what a request's head alone decides,
 *     adds prepared requests to the engine and writes the engine's outputs back to the clients.
 *   - SRV_WORKERS request workers do what a request's bytes can make expensive: parse its JSON, render its
 *     chat template, tokenize its prompts, write and parse its grammar. A 7 MB prompt takes a second; on the
 *     network thread that second would stall every stream and every health check.
 *   - the engine thread runs llm_engine_wait and llm_engine_step in a loop. Each output becomes an event (a
 *     copy of it) in a queue under a lock, and a byte down the wake-up pipe wakes the network thread.
 * A connection costs no thread; a request belongs to one thread at a time (handed to a worker as a whole
 * job and handed back, through a queue and the pipe); an idle server sleeps in blocking calls.
 *
 * A request's path, and the function that takes each step:
 *   network thread  conn_read -> http_feed (the head) -> route_head (path, method, key, CORS, limits)
 *                   -> http_feed (the body) -> handle_request: /health, /metrics... answered now; else
 *                   job_start hands it to a worker
 *   a worker        job_run: the JSON -> prepare_generation (check_fields, parse_sampling, chat_prompt,
 *                   tokenize_text): an srv_req and its llm_sampling_params, or a 400 naming the field
 *   network thread  jobs_done -> attach_generation: llm_engine_add_request for each prompt
 *   engine thread   srv_engine_loop: llm_engine_step -> each llm_output copied into an srv_event
 *   network thread  drain_events -> apply_event -> stream_event (an SSE chunk) as tokens come, or at the
 *                   end finish_request (the whole body) -> conn_send -> the client
 *
 * The sections below follow that path:
 *   Strings that grow, JSON     sbuf, and values written as JSON text: what every response is built in
 *   HTTP/1.1                    a connection's bytes -> a request (head, then body), strictly; status texts
 *   The server's state          srv_conn, srv_req, srv_job, srv_event, srv_state, and what frees each
 *   Connections, network loop   bytes in and out: accept, read, parse, time-outs, the output's backlog
 *   Responses                   a whole response, an OpenAI error, an SSE chunk; X-Request-Id
 *   Routes                      what the head decides (the route table), then which endpoint answers
 *   Requests in                 parse and validate: OpenAI's and vLLM's fields -> llm_sampling_params
 *   Endpoints                   a generation prepared (on a worker) and attached to the engine; /tokenize
 *   Request workers             the threads that run the two sections above, and the hand-back
 *   The engine thread           the engine steps; its outputs become events
 *   Requests out                stream back: what each output adds to the response, as OpenAI writes it
 *   The engine's events         apply_event: each event through "Requests out", on the network thread
 *   Metrics                     /metrics: vLLM's names and histogram buckets
 *   llm serve                   serve(): set up, the loop, draining on SIGTERM, stopping
 *   llm bench serve             not the server: a client of it, vLLM's load generator (names bs_*)
 * A first reading: serve's loop (at the end of llm serve), conn_process, route_head, handle_request, job_run,
 * prepare_generation, attach_generation, srv_engine_loop, apply_event and stream_event. What each
 * connection and request may cost is bounded by the limits below, each checked before the cost is spent. */
#include <arpa/inet.h>
#include <ctype.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <strings.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>

#define SRV_MAX_HEADER   16384            /* bytes of request line and headers (431 past it) */
#define SRV_MAX_BODY     (8 << 20)        /* bytes of body (413 past it) */
#define SRV_MAX_CHUNK_LINE 4096           /* bytes of a chunk-size line (extensions too) or a trailer line */
#define SRV_CONN_ALLOWANCE (64 << 10)     /* request bytes a connection may hold outside the shared budget */
#define SRV_MAX_BUFFERED (64 << 20)       /* request bytes held past each one's allowance, all connections
                                           * together (503 past it) */
#define SRV_MAX_BACKLOG  (4 << 20)        /* unsent response bytes of a connection: past it no more of its
                                           * requests are read, and a stream is aborted */
#define SRV_LINGER       2.0              /* seconds a closing connection's late input is read and dropped */
#define SRV_ACCEPT_PAUSE 0.1              /* seconds the listener rests when accept() runs out of fds */
#define SRV_IDLE_TIMEOUT 120.0            /* seconds a kept-alive connection may sit idle */
#define SRV_MAX_PROMPTS  1024             /* prompts in one /v1/completions request */
#define SRV_MAX_STOPS    16
#define SRV_MAX_UNKNOWN  256              /* unknown request field names logged, each once */
#define SRV_MAX_REQUEST_ID 128            /* bytes of a client's X-Request-Id (a longer one is replaced) */
#define SRV_MAX_CACHE_KEY 256             /* bytes of a prompt_cache_key (OpenAI's: 64 characters) */
#define SRV_WORKERS      2                /* threads that read requests (JSON, templates, tokens, grammars) */
#define SRV_WORKER_STACK (16 << 20)       /* bytes of stack each one has */

/* ===========================================================================================================
 * Strings that grow: what every response is built in
 *
 * An sbuf is a byte string, always NUL-terminated, whose capacity doubles as it grows. A failed allocation
 * sets failed and makes every later append a no-op, so a function writes a whole response without checking
 * each call and looks at failed once at the end (then answers 500, or closes the connection).
 * ======================================================================================================== */
typedef struct { char *s; size_t len, cap; int failed; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = (char *)realloc(b->s, cap);
        if (!p) { b->failed = 1; return; }
        b->s = p; b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}
static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* printf into b: through a 512-byte buffer on the stack; the heap only for a longer result (then formatted
 * twice) */
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) { b->failed = 1; return; }
    if ((size_t)n < sizeof small) { sb_put(b, small, (size_t)n); return; }
    char *big = (char *)malloc((size_t)n + 1);
    if (!big) { b->failed = 1; return; }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_put(b, big, (size_t)n);
    free(big);
}
static void sb_free(sbuf *b) { free(b->s); memset(b, 0, sizeof *b); }

/* ===========================================================================================================
 * JSON: the reader is llm.h's (llm_json_parse, section 11); the writer, here
 *
 * Responses are written field by field straight into an sbuf, never built as a tree first: a chunk of a
 * stream is a few hundred bytes written once. These three write the values whose text needs care: strings
 * (escaped, always valid UTF-8) and floats (JSON has no NaN or infinities); the rest is sb_printf.
 * ======================================================================================================== */
/* Text as a JSON string; bytes that are not UTF-8 become U+FFFD (the engine's text is always UTF-8). */
static void sb_json_str(sbuf *b, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    sb_put(b, "\"", 1);
    while (p < end) {
        unsigned c = *p;
        if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; sb_put(b, e, 2); p++; continue; }
        if (c < 0x20) {
            const char *named = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
            if (named) sb_puts(b, named); else sb_printf(b, "\\u%04x", c);
            p++; continue;
        }
        int len = llm_utf8_check(p, (size_t)(end - p));
        if (len <= 0) { sb_puts(b, "\xef\xbf\xbd"); p++; continue; }
        sb_put(b, (const char *)p, (size_t)len);
        p += len;
    }
    sb_put(b, "\"", 1);
}
static void sb_json_cstr(sbuf *b, const char *s) { sb_json_str(b, s, strlen(s)); }

/* A JSON value as the request gave it (NULL: null) */
static void sb_json_value(sbuf *b, const llm_json *v) {
    char *t = v && v->type != LLM_JSON_NULL ? llm_json_dumps(v, 0) : NULL;
    sb_puts(b, t ? t : "null");
    if (v && v->type != LLM_JSON_NULL && !t) b->failed = 1;
    free(t);
}

/* A number: %.9g gives 9 significant digits, enough to read every float (the engine's logprobs are floats)
 * back to the same value */
static void sb_json_float(sbuf *b, double x) { /* JSON has no infinities: vLLM writes -9999.0 for -inf */
    if (!isfinite(x)) x = x < 0 ? -9999.0 : 9999.0;
    sb_printf(b, "%.9g", x);
}

/* ===========================================================================================================
 * HTTP/1.1: requests parsed out of a connection's bytes, responses written into its output
 *
 * A request is read in two steps. Its head (request line and header fields) is kept in the connection's
 * input until the blank line that ends it is in, then parsed as a whole, strictly (RFC 9112: lines end in
 * CRLF, field names are tokens with the colon right after them, no obs-fold, no control characters), so
 * that this server and a proxy in front of it can never disagree on where a request ends. Its body is then
 * taken out of the input as it comes, into a buffer of its own: a Content-Length counted down, or a chunked
 * body decoded by a state machine that keeps its place between reads (a chunk size, an extension or a
 * trailer may be split anywhere). No byte is ever parsed twice, and none is decoded in place.
 * The entry point is http_feed, which conn_process calls with each connection's unparsed input; the parser
 * knows nothing of sockets or of the server, so a fuzzer can drive it alone.
 * ======================================================================================================== */
typedef struct {
    char method[16], path[256];
    int keep_alive, expect_continue;
    int json;                       /* Content-Type is application/json (its parameters aside) */
    int preflight;                  /* Access-Control-Request-Method given: with OPTIONS, a CORS preflight */
    int chunked;
    long long content_length;       /* -1: none given */
    char auth[512];
    char api_key[512];              /* x-api-key (Anthropic's way to give the key; "": none) */
    char origin[256];               /* Origin ("": none, or one longer than this) */
    char cors_headers[256];         /* Access-Control-Request-Headers ("": none, or too long) */
    char request_id[SRV_MAX_REQUEST_ID + 1]; /* X-Request-Id when it is printable ASCII and short; else "" */
    sbuf body;                      /* the body, decoded */
} http_request;

/* What http_feed answers: a request's head is in (its body, if any, comes next), a whole request is in,
 * more bytes are needed, or an error status (400, 413, 431, 500, 501) with p->why saying what was wrong. */
enum { HTTP_INCOMPLETE = 0, HTTP_OK = 1, HTTP_HEAD = 2 };

/* Where the parser is: the head; a body of known length; a chunk's size line, its data, the CRLF after the
 * data, the trailer lines; or done (the request is whole). */
enum { HP_HEAD, HP_BODY, HP_CHUNK_SIZE, HP_CHUNK_DATA, HP_CHUNK_END, HP_TRAILER, HP_DONE };

typedef struct {
    int state;
    size_t scanned;                 /* HP_HEAD: bytes of the input already searched for the blank line */
    size_t line_start;              /* HP_HEAD: where the line being searched begins */
    size_t skip;                    /* HP_HEAD: empty lines before the request line (ignored, RFC 9112 2.2) */
    unsigned long long left;        /* HP_BODY, HP_CHUNK_DATA: bytes of data still to come */
    size_t trailer_bytes;           /* HP_TRAILER: bytes of trailer lines so far */
    size_t line_len;                /* the chunk-size, chunk-end or trailer line read so far ... */
    char line[SRV_MAX_CHUNK_LINE];  /* ... and its bytes (a line never spans more than this) */
    const char *why;                /* what an error status was for */
    http_request rq;
} http_parser;

/* A parser for the next request (the body of the last one freed). */
static void http_parser_reset(http_parser *p) {
    sb_free(&p->rq.body);
    memset(p, 0, sizeof *p);
}

/* An error status, and why, for the answer (no byte after it is parsed: the connection closes). */
static int http_fail(http_parser *p, int status, const char *why) { p->why = why; return status; }

/* Whether a[0..n) and b[0..n) are equal but for ASCII case (field names, and some values, ignore case) */
static int ascii_ieq(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++) if (tolower((unsigned char)a[i]) != tolower((unsigned char)b[i])) return 0;
    return 1;
}

/* RFC 9110's tchar, what a method or a field name is made of */
static int http_tchar(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}
/* what a field value (or a chunk extension) may hold: visible ASCII, obs-text, space and tab */
static int http_vchar(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

/* Whether a comma-separated field value (Connection's) lists token t. */
static int http_list_has(const char *v, size_t n, const char *t) {
    size_t tn = strlen(t);
    for (size_t i = 0; i < n;) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
        size_t e = i;
        while (e < n && v[e] != ',' && v[e] != ' ' && v[e] != '\t') e++;
        if (e - i == tn && ascii_ieq(v + i, t, tn)) return 1;
        i = e;
    }
    return 0;
}

/* One field line of a head or of the trailers, p[0..n) without its CRLF: 0 with the name's length and the
 * value (the whitespace around it dropped), or 400. A line that begins with whitespace (obs-fold) has no
 * name; whitespace between the name and the colon is not a token character: both are refused, as RFC 9112
 * section 5 asks of a server, for a proxy in front might have read them otherwise. */
static int http_field(http_parser *p, const char *s, size_t n, size_t *name_len, const char **v,
                      size_t *vlen) {
    size_t i = 0;
    while (i < n && http_tchar((unsigned char)s[i])) i++;
    if (i == 0)
        return http_fail(p, 400, n && (s[0] == ' ' || s[0] == '\t') ? "a header line folded onto the one "
                         "before it (obs-fold)" : "a header line without a name");
    if (i == n || s[i] != ':')
        return http_fail(p, 400, i < n && (s[i] == ' ' || s[i] == '\t') ? "whitespace between a header's "
                         "name and its colon" : "a header's name has a character a token cannot have");
    size_t b = i + 1, e = n;
    for (size_t k = b; k < n; k++)
        if (!http_vchar((unsigned char)s[k]))
            return http_fail(p, 400, "a control character in a header's value");
    while (b < e && (s[b] == ' ' || s[b] == '\t')) b++;
    while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) e--;
    *name_len = i; *v = s + b; *vlen = e - b;
    return 0;
}

/* The head h[0..n) (request line, field lines, blank line; every line ends in CRLF): 0, or an error status.
 * Sets everything of p->rq but the body. http_feed calls it only once it has seen every LF of h preceded
 * by a CR, so the memchr for a line's end below always finds one. Each value is copied only when it fits
 * its field of rq (the head is 16 KiB at most): an Authorization too long is a 431, an Origin, an
 * Access-Control-Request-Headers or an X-Request-Id that is too long is taken as not given. The framing
 * fields are the ones a proxy must read the same way: Content-Length and Transfer-Encoding are checked
 * strictly, alone and together. */
static int http_head(http_parser *p, const char *h, size_t n) {
    http_request *rq = &p->rq;
    /* the request line: METHOD SP TARGET SP HTTP/1.x */
    const char *end = h + n, *eol = (const char *)memchr(h, '\n', n) - 1;
    const char *sp1 = h;
    while (sp1 < eol && http_tchar((unsigned char)*sp1)) sp1++;
    const char *target = sp1 + 1, *sp2 = target;
    while (sp2 < eol && (unsigned char)*sp2 > 0x20 && *sp2 != 0x7f) sp2++;
    if (sp1 == h || sp1 == eol || *sp1 != ' ' || sp2 == target || sp2 == eol || *sp2 != ' ' ||
        eol - sp2 != 9 || memcmp(sp2 + 1, "HTTP/1.", 7) || (sp2[8] != '0' && sp2[8] != '1'))
        return http_fail(p, 400, "the request line is not METHOD SP TARGET SP HTTP/1.x");
    if (sp1 - h >= (long)sizeof rq->method) return http_fail(p, 400, "the method is too long");
    const char *target_end = sp2;
    if (target_end - target > 8 && (ascii_ieq(target, "http://", 7) || ascii_ieq(target, "https://", 8))) {
        /* absolute-form (RFC 9112 3.2.2): the path is what follows the authority */
        const char *slash = memchr(target + 8, '/', (size_t)(target_end - target - 8));
        target = slash ? slash : "/";
        if (!slash) target_end = target + 1;
    }
    if (target[0] != '/' && (target[0] != '*' || target_end - target != 1))
        return http_fail(p, 400, "the request target is not a path");
    if (target_end - target >= (long)sizeof rq->path)
        return http_fail(p, 400, "the request target is too long");
    memcpy(rq->method, h, (size_t)(sp1 - h));
    memcpy(rq->path, target, (size_t)(target_end - target));
    char *query = strchr(rq->path, '?'); /* the routes are paths: a query string means nothing here */
    if (query) *query = 0;
    /* HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 closes it unless told to keep it */
    int http11 = sp2[8] == '1', content_type = 0;
    rq->keep_alive = http11;
    rq->content_length = -1;
    /* the field lines, from after the request line's CRLF to before the blank line's */
    for (const char *s = eol + 2; s < end - 2;) {
        const char *e = (const char *)memchr(s, '\n', (size_t)(end - s)) - 1;
        size_t name_len, vlen;
        const char *v;
        int rc = http_field(p, s, (size_t)(e - s), &name_len, &v, &vlen);
        if (rc) return rc;
#define HDR(name) (name_len == sizeof(name) - 1 && ascii_ieq(s, name, name_len))
        if (HDR("content-length")) { /* digits only (no sign, no list); 16 digits or more: 413, no overflow */
            long long x = 0;
            if (vlen == 0) return http_fail(p, 400, "an empty Content-Length");
            if (vlen > 15) return http_fail(p, 413, "the request's body is too large");
            for (size_t i = 0; i < vlen; i++) {
                if (v[i] < '0' || v[i] > '9')
                    return http_fail(p, 400, "a Content-Length that is not a number");
                x = x * 10 + (v[i] - '0');
            }
            if (rq->content_length >= 0 && rq->content_length != x)
                return http_fail(p, 400, "two different Content-Lengths");
            rq->content_length = x;
        } else if (HDR("transfer-encoding")) {
            if (!http11) return http_fail(p, 400, "Transfer-Encoding in an HTTP/1.0 request");
            if (rq->chunked) return http_fail(p, 400, "Transfer-Encoding given twice");
            if (vlen != 7 || !ascii_ieq(v, "chunked", 7))
                return http_fail(p, 501, "that transfer encoding is not supported (only chunked)");
            rq->chunked = 1;
        } else if (HDR("connection")) {
            if (http_list_has(v, vlen, "close")) rq->keep_alive = 0;
            else if (http_list_has(v, vlen, "keep-alive")) rq->keep_alive = 1;
        } else if (HDR("expect")) {
            if (vlen == 12 && ascii_ieq(v, "100-continue", 12)) rq->expect_continue = 1;
        } else if (HDR("content-type")) { /* the media type; parameters (charset) after a ';' do not matter */
            if (content_type++) return http_fail(p, 400, "Content-Type given twice");
            size_t m = 0;
            while (m < vlen && v[m] != ';') m++;
            while (m > 0 && (v[m - 1] == ' ' || v[m - 1] == '\t')) m--;
            rq->json = m == 16 && ascii_ieq(v, "application/json", 16);
        } else if (HDR("authorization")) {
            if (vlen >= sizeof rq->auth) return http_fail(p, 431, "the Authorization header is too large");
            memcpy(rq->auth, v, vlen); rq->auth[vlen] = 0;
        } else if (HDR("x-api-key")) {
            if (vlen >= sizeof rq->api_key) return http_fail(p, 431, "the x-api-key header is too large");
            memcpy(rq->api_key, v, vlen); rq->api_key[vlen] = 0;
        } else if (HDR("origin")) {
            if (vlen < sizeof rq->origin) { memcpy(rq->origin, v, vlen); rq->origin[vlen] = 0; }
        } else if (HDR("access-control-request-method")) {
            rq->preflight = 1;
        } else if (HDR("access-control-request-headers")) {
            if (vlen < sizeof rq->cors_headers) {
                memcpy(rq->cors_headers, v, vlen);
                rq->cors_headers[vlen] = 0;
            }
        } else if (HDR("x-request-id")) { /* it goes into logs, JSON and a header: printable ASCII only */
            int ok = vlen > 0 && vlen <= SRV_MAX_REQUEST_ID;
            for (size_t i = 0; ok && i < vlen; i++) ok = v[i] >= 0x20 && v[i] < 0x7f; /* signed or not */
            if (ok) memcpy(rq->request_id, v, vlen);
            rq->request_id[ok ? vlen : 0] = 0;
        }
#undef HDR
        s = e + 2;
    }
    if (rq->chunked && rq->content_length >= 0) /* RFC 9112 6.3: the framing is ambiguous, refuse it */
        return http_fail(p, 400, "both Content-Length and Transfer-Encoding");
    return 0;
}

/* A chunk-size line without its CRLF: hex digits, then maybe extensions (";" and visible text, after
 * optional whitespace), which mean nothing here. 0 with the size, or an error status. */
static int http_chunk_size(http_parser *p, const char *s, size_t n, unsigned long long *size) {
    size_t i = 0;
    unsigned long long x = 0;
    for (; i < n && isxdigit((unsigned char)s[i]); i++) {
        int digit = isdigit((unsigned char)s[i]) ? s[i] - '0' : (s[i] | 0x20) - 'a' + 10;
        x = x * 16 + (unsigned long long)digit;
        if (x > SRV_MAX_BODY) return http_fail(p, 413, "the request's body is too large");
    }
    if (i == 0) return http_fail(p, 400, "a chunk size that is not a hex number");
    size_t k = i;
    while (k < n && (s[k] == ' ' || s[k] == '\t')) k++;
    if (k < n && s[k] != ';') return http_fail(p, 400, "a chunk size followed by something not an extension");
    if (k == n && k != i) return http_fail(p, 400, "whitespace after a chunk size");
    for (; k < n; k++)
        if (!http_vchar((unsigned char)s[k]))
            return http_fail(p, 400, "a control character in a chunk extension");
    *size = x;
    return 0;
}

/* Feeds buf[0..len), the bytes of the connection not taken yet, to the parser. *used: how many it took
 * (the caller drops them); they are never looked at again, except a head's, which stay in buf (with *used 0)
 * until the head is whole: the search for its end goes on from where it stopped. Returns HTTP_HEAD once the
 * head is parsed (p->rq is set; call again for the body), HTTP_OK once the whole request is in,
 * HTTP_INCOMPLETE for more bytes, or an error status (the connection cannot be read further). */
static int http_feed(http_parser *p, const char *buf, size_t len, size_t *used) {
    http_request *rq = &p->rq;
    size_t i = 0;
    *used = 0;
    /* 1. the head: search for the blank line that ends it, from where the last call stopped (scanned), so
     * a head that comes a byte at a time costs its length in all, not its square. line_start is where the
     * line being searched begins: a CRLF right at it is an empty line, which ends the head, or, before the
     * request line, is skipped. The 16 KiB bound is checked before each byte is looked at. */
    if (p->state == HP_HEAD) {
        for (size_t k = p->scanned; k < len; k++) {
            if (k >= SRV_MAX_HEADER) return http_fail(p, 431, "the request's head is larger than 16 KiB");
            if (buf[k] != '\n') continue;
            if (k == 0 || buf[k - 1] != '\r') return http_fail(p, 400, "a bare LF (lines end in CRLF)");
            if (k - 1 != p->line_start) { p->line_start = k + 1; continue; }
            if (p->line_start == p->skip) { p->skip = p->line_start = k + 1; continue; } /* before the head */
            int rc = http_head(p, buf + p->skip, k + 1 - p->skip);
            if (rc) return rc;
            *used = k + 1;
            p->left = rq->content_length > 0 ? (unsigned long long)rq->content_length : 0;
            p->state = rq->chunked ? HP_CHUNK_SIZE : p->left ? HP_BODY : HP_DONE;
            return HTTP_HEAD;
        }
        p->scanned = len;
        return HTTP_INCOMPLETE;
    }
    /* 2. the body: each pass of this loop takes one piece (data, or one line) and moves the state on. The
     * bytes taken are consumed (*used), so a line split across reads is kept in p->line, never in buf */
    for (;;) {
        if (p->state == HP_DONE) { *used = i; return HTTP_OK; }
        /* data: the size declared (Content-Length, or the chunk's plus those before it) is checked against
         * SRV_MAX_BODY before a byte of it is stored, so a client cannot make the body grow past it */
        if (p->state == HP_BODY || p->state == HP_CHUNK_DATA) {
            if (p->left > SRV_MAX_BODY || rq->body.len + p->left > SRV_MAX_BODY)
                return http_fail(p, 413, "the request's body is too large");
            size_t n = len - i < p->left ? len - i : (size_t)p->left;
            if (!n) { *used = i; return HTTP_INCOMPLETE; }
            sb_put(&rq->body, buf + i, n);
            if (rq->body.failed) return http_fail(p, 500, "out of memory reading the body");
            i += n; p->left -= n;
            if (!p->left) p->state = p->state == HP_BODY ? HP_DONE : HP_CHUNK_END;
            continue;
        }
        /* a line: a chunk's size, the end of its data, or a trailer */
        while (i < len && buf[i] != '\n') {
            if (p->line_len == sizeof p->line)
                return http_fail(p, p->state == HP_TRAILER ? 431 : 400, "a chunk-size or trailer line longer "
                                 "than 4 KiB");
            p->line[p->line_len++] = buf[i++];
        }
        if (i == len) { *used = i; return HTTP_INCOMPLETE; }
        i++;
        if (!p->line_len || p->line[p->line_len - 1] != '\r')
            return http_fail(p, 400, "a bare LF (lines end in CRLF)");
        size_t n = p->line_len - 1;
        p->line_len = 0;
        if (p->state == HP_CHUNK_END) {
            if (n) return http_fail(p, 400, "a chunk's data is longer than its size");
            p->state = HP_CHUNK_SIZE;
        } else if (p->state == HP_CHUNK_SIZE) {
            int rc = http_chunk_size(p, p->line, n, &p->left);
            if (rc) return rc;
            p->state = p->left ? HP_CHUNK_DATA : HP_TRAILER;
        } else if (!n) { /* HP_TRAILER: the empty line ends the request */
            p->state = HP_DONE;
        } else { /* a trailer field: checked as a header is, and dropped */
            size_t name_len, vlen;
            const char *v;
            p->trailer_bytes += n + 2;
            if (p->trailer_bytes > SRV_MAX_HEADER)
                return http_fail(p, 431, "the trailers are larger than 16 KiB");
            int rc = http_field(p, p->line, n, &name_len, &v, &vlen);
            if (rc) return rc;
        }
    }
}

/* The reason phrase of a status line (RFC 9110 section 15), for every status this server sends. */
static const char *http_reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 529: return "Overloaded";
    default: return "Error";
    }
}

/* ===========================================================================================================
 * The server's state: connections, requests, the engine thread's events
 *
 * What points to what (one srv_state; the network thread owns everything but what is marked):
 *   srv_state   the engine, the listener, epoll, the metrics, the settings of every request
 *     conns[]   srv_conn: a socket, its unparsed input and unsent output, its parser, and at most one of:
 *                 req  srv_req: a request in the engine: prompts[] (each one engine request of n samples),
 *                      choices[] (n per prompt: what the response has so far)
 *                 job  srv_job: a request with a worker (the worker's until it is on jobs_done)
 *     live[]    every srv_req not finished, whether its client is still there or not
 *     events[]  srv_event: an engine output copied, waiting for the network thread (under lock)
 *     jobs_todo[], jobs_done[]   the workers' queues (under job_lock)
 * A request outlives its connection: a client that leaves has its generation aborted and r->conn set to
 * NULL; the engine's last output for it (every sample finishes, aborted or not) frees it. Responses keep
 * their order because a connection reads its next request only once the one in flight is done.
 * ======================================================================================================== */
typedef struct srv_conn srv_conn;
typedef struct srv_req srv_req;
typedef struct srv_job srv_job;
typedef struct srv_resp srv_resp;

typedef struct { /* llm_output's prompt logprobs, copied: rows for prompt tokens 1..n (token 0 has none) */
    int n, n_top;
    float *logprobs; int32_t *ranks, *top_ids; float *top_logprobs;
} srv_prompt_lp;

typedef struct { /* one prompt of a request: one engine request (n samples) */
    srv_req *req;
    int index;                      /* which prompt */
    uint64_t engine_id;
    int n_prompt;
    int32_t *prompt_ids;            /* stb_ds: for echo of id prompts and /tokenize-like logging */
    char *echo_text;                /* what echo puts before the completion (NULL: none) */
    int started;                    /* an output has come (it left the waiting queue) */
    int n_cached;                   /* its prompt tokens the prefix cache had (the engine's count) */
    int n_generated;                /* tokens of its n samples */
    double t_scheduled, t_first, t_last; /* the step that first ran it began; its first and last tokens */
    srv_prompt_lp *lp;              /* its prompt logprobs once the engine gave them (NULL: not yet, none) */
    float *embedding;               /* /v1/embeddings: its pooled vector once the engine gave it (NULL: not
                                     * yet), n_embedding values, not normalised; /v1/rerank and /v1/score:
                                     * its one value, the relevance logit */
    int n_embedding;
    char *document;                 /* /v1/rerank: the document's text, for return_documents */
    size_t document_len;
} srv_prompt;

typedef struct { /* one choice of the response */
    sbuf text;                      /* non-streaming: the text so far */
    int n_tokens, finish, sent_role, echoed, sent_prompt_lp;
    sbuf logprobs;                  /* the logprobs entries so far, as JSON (without the brackets) */
    sbuf lp_tokens, lp_values, lp_top, lp_offsets; /* /v1/completions' four parallel lists */
    size_t text_offset;
    /* a chat reply read for thinking and tool calls: how much of each part a stream has sent */
    size_t sent_reasoning, sent_content, *sent_args; /* sent_args: stb_ds, one per call begun */
    int stop_string;                /* the engine's: finished by stop string stop_string - 1 (0: not) */
    /* Anthropic's stream: the content blocks started, and the kind of the open one (0: none, 1: thinking,
     * 2: text, 3 + k: tool call k) */
    int msg_blocks, msg_open;
} srv_choice;

enum { REQ_COMPLETIONS, REQ_CHAT, REQ_EMBED, REQ_RERANK, REQ_SCORE };
/* The wire format a request is answered in: OpenAI's, or Anthropic's Messages API (a chat underneath) */
enum { API_OPENAI, API_MESSAGES };

struct srv_req {
    srv_conn *conn;                 /* NULL once the client is gone */
    int kind, stream, n, logprobs, top_logprobs, include_usage, echo;
    int continuous_usage;           /* vLLM's stream_options.continuous_usage_stats: usage in every chunk */
    char *chat_echo;                /* chat's echo (vLLM's): the last message's text, which each reply's
                                     * content begins with (NULL: none) */
    int tokens_as_ids;              /* vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N" */
    int truncate_prompt_tokens;     /* vLLM's: keep only the last K prompt tokens (0: all) */
    int add_special;                /* how its prompt text is tokenized: tokenize_text's add_special */
    int prompt_logprobs;            /* vLLM's prompt_logprobs: -1 none, else K */
    int score_only;                 /* echo with max_tokens 0: the prompt and its logprobs, no completion */
    int rank_top_n, rank_documents; /* /v1/rerank: the results it answers with; whether they show the text */
    char id[16 + SRV_MAX_REQUEST_ID]; /* "cmpl-" or "chatcmpl-" and the X-Request-Id, as vLLM names them */
    uint64_t call_id_seed;          /* its tool calls' ids are drawn from this (a client may reuse its id) */
    long long created;
    srv_prompt *prompts;            /* [n_prompts] */
    int n_prompts;
    srv_choice *choices;            /* [n_prompts * n] */
    int n_open;                     /* choices not finished */
    int prompt_tokens, completion_tokens;
    double t_arrival, t_first, t_last;
    int n_stops;
    char *stops[SRV_MAX_STOPS];
    int32_t *stop_ids;              /* stb_ds */
    int32_t *bias_ids;              /* stb_ds: logit_bias's tokens ... */
    float *bias;                    /* ... and their biases */
    int32_t *allowed_ids;           /* stb_ds: vLLM's allowed_token_ids */
    int32_t *bad_ids, *bad_lens;    /* stb_ds: vLLM's bad_words, tokenized */
    int32_t think_end[8];           /* chat with a thinking budget: the template's "</think>" ids */
    int n_think_end;
    int32_t think_start[8];         /* and its "<think>" ids, when the reply opens the block (none: the
                                     * prompt did) */
    int n_think_start;
    char *grammar;                  /* the structured output asked for, as GBNF (malloc'ed); NULL: free
                                     * text */
    llm_grammar *grammar_parsed;    /* ... parsed, by the worker that prepared the request (a reference) */
    llm_chat_template chat;         /* chat: the server's template, with this request's thinking on or off */
    int tool_calls;                 /* chat: the reply is read for tool calls (tools given, tool_choice not
                                     * "none") */
    int reasoning;                  /* chat: the thinking is read apart (a family that thinks, and not
                                     * --reasoning-format none); 2: and sent (include_reasoning) */
    char error[LLM_ERR_LEN];        /* the first error of a choice (finish reason "error") */
    int api;                        /* API_*: API_MESSAGES is a chat answered as Anthropic's message */
    char **msg_stops;               /* stb_ds, API_MESSAGES: copies of its stop strings (stop_sequence names
                                     * the one that ended it; r->stops point into the job's JSON) */
    srv_req *next_done;
    srv_resp *resp;                 /* a Responses API request's own state (NULL: chat or completions; see
                                     * "The Responses API") */
    int base64, dimensions;         /* /v1/embeddings: encoding_format base64; the values kept (0: all) */
};

struct srv_conn {
    int fd;
    char peer[64];
    sbuf in, out;                   /* in: bytes not parsed yet; out: what is unsent from out_sent on */
    size_t out_sent;
    http_parser parser;             /* the request being read */
    srv_req *req;                   /* the request in flight (one at a time: responses keep their order) */
    srv_job *job;                   /* ... or being read by a worker (then no req) */
    int keep_alive;
    int closing;                    /* 1: once the output is sent, 2: now, 3: lingering (output sent, FIN
                                     * sent, late input read and dropped for SRV_LINGER seconds) */
    int eof;                        /* the client sent its FIN: nothing more comes, what it asked is answered
                                     * (a half-close, as nc -N and some proxies do) */
    int answered;                   /* the request being read was answered from its head alone */
    unsigned events;                /* the epoll events asked for */
    size_t held;                    /* its request bytes past SRV_CONN_ALLOWANCE, as counted in S->held */
    char request_id[SRV_MAX_REQUEST_ID + 1]; /* X-Request-Id of the response under way ("": mint one) */
    char cors[320];                 /* the CORS headers of the response under way ("": none) */
    int api;                        /* API_*: the error shape of the response under way (its path's) */
    double t_request_start;         /* when the first byte of the request being read came (0: none yet) */
    double t_last_active;
    double t_out_stuck;             /* since when unsent output waits with no byte taken (0: nothing waits) */
    double t_linger;                /* when lingering began */
};

typedef struct {
    void *user;                     /* the srv_prompt */
    int index;                      /* the sample */
    char *text; int text_len;
    int32_t *ids; float *logprobs; int32_t *top_ids; float *top_logprobs;
    int n_tokens, n_top, finish, stop_string;
    srv_prompt_lp *prompt_lp;       /* the prompt's logprobs, in the one output that has them */
    float *embedding; int n_embedding; /* an embedding's vector, in its finishing output */
    char *error;
    int n_prompt, n_cached;
    double t, t_step;               /* when the step that made it ended, and when it began */
} srv_event;

/* A stored response (The store of responses): its id, the object GET returns, its conversation as a JSON
 * list of items, its output items by id (what an item_reference finds: where each item's JSON text stands
 * in the conversation, so a reference costs its item, not a search of the whole store), and the bytes it
 * holds */
typedef struct { char id[48]; size_t off, len; } resp_item;
typedef struct resp_stored {
    char id[40];
    char *object, *history;
    resp_item *items;               /* stb_ds */
    size_t bytes;
} resp_stored;

/* Histograms with vLLM's buckets, for /metrics */
typedef struct { const double *bounds; int n_bounds; int64_t *counts; double sum; int64_t count; } srv_hist;

typedef struct {
    llm_engine *engine;
    const llm_model *model;
    llm_chat_template chat;
    int chat_ok;
    char model_name[256];
    const char *api_key;
    int max_queue, max_model_len;
    int scheduling_policy;          /* the engine's (a request's priority is refused unless it is priority) */
    double request_timeout;         /* seconds to send a whole request once begun (slowloris) */
    int listen_fd, epoll_fd, wake[2];
    pthread_t engine_thread;
    pthread_mutex_t lock;           /* guards events, stats and stop */
    srv_event *events;              /* stb_ds, from the engine thread */
    llm_engine_stats stats;         /* the engine's, after its last step */
    int stop_engine;
    /* the network thread's own */
    srv_conn **conns;               /* stb_ds */
    srv_req **live;                 /* stb_ds: requests not finished (freed at exit if the engine
                                       stops first) */
    int n_queued;                   /* prompts added that have not produced anything yet */
    int64_t prompt_tokens_total, generation_tokens_total;
    int64_t success[LLM_FINISH_ERROR + 1]; /* requests finished, by finish reason (llm_finish) */
    srv_hist ttft, itl, e2e;
    srv_hist queue, prefill, decode, inference, req_prompt, req_gen; /* per engine request (a prompt) */
    double *token_bounds;           /* the token-count histograms' buckets: 1, 2, 5, 10, ... to the context */
    int enable_prefix_caching;
    uint64_t id_rng;                /* minted request ids (seeded from getrandom: unique across replicas) */
    double drain_timeout;           /* seconds a stop waits for the requests in flight */
    int reasoning_format_none;      /* --reasoning-format none: the thinking stays in content */
    llm_sampling_params defaults;   /* the command line's sampling flags: the defaults of every request */
    char **unknown_fields;          /* stb_ds: the unknown request fields logged already (under job_lock) */
    size_t held;                    /* request bytes held past each connection's allowance, all together */
    char **origins;                 /* stb_ds: --allowed-origins (NULL: no CORS headers at all) */
    int pooling;                    /* /v1/embeddings: --pooling, else the file's pooling_type (llama.cpp's
                                     * enum: 0 none; 4 rank: a reranker, for /v1/rerank and /v1/score) */
    int rank_ids[2];                /* a reranker without cls.output: its "yes" and "no" tokens */
    llm_str rank_template;          /* a reranker's prompt: {query} and {document} in the text */
    int matryoshka;                 /* --matryoshka: dimensions may keep fewer values than the model's */
    double accept_resume;           /* accept() ran out of fds or memory: the listener rests until then */
    double accept_log_t;            /* when that was last logged */
    /* the request workers: jobs in, jobs done (under job_lock) */
    pthread_t workers[SRV_WORKERS];
    int n_workers, jobs_quit;
    pthread_mutex_t job_lock;
    pthread_cond_t job_added;
    srv_job **jobs_todo, **jobs_done;
    /* the stored responses (The store of responses): written by the network thread, read by workers */
    pthread_mutex_t store_lock;
    resp_stored *store;             /* stb_ds, oldest first */
    size_t store_bytes, store_max_bytes;
    int store_max;
} srv_state;

/* A request refused: the HTTP status, the field it names (OpenAI's param; "": none) and the message. The
 * parsers fill one with bad() and return -1; the network thread sends it as an OpenAI error. */
typedef struct { int status; char param[64]; char msg[512]; } srv_error;

/* A request with a worker (see Request workers): the endpoint it is for, and what the worker made of it */
enum { JOB_TOKENIZE, JOB_DETOKENIZE, JOB_COMPLETIONS, JOB_CHAT, JOB_MESSAGES, JOB_COUNT_TOKENS,
       JOB_RESPONSES, JOB_COMPACT, JOB_EMBEDDINGS, JOB_RERANK, JOB_SCORE };

struct srv_job {
    srv_conn *conn;                 /* the network thread's: NULL once the client has gone */
    int route;                      /* JOB_* */
    char *body; size_t body_len;    /* the request's body (NULL: none) */
    size_t held;                    /* its bytes past SRV_CONN_ALLOWANCE: in S->held until it is done */
    char request_id[SRV_MAX_REQUEST_ID + 1];
    double t_arrival;
    /* what the worker made: a generation ready to add (r, p), or an answer */
    int failed;                     /* 1: the error in e */
    srv_error e;
    sbuf answer;                    /* a 200's body (/tokenize, /detokenize) */
    llm_json json;                  /* the body parsed: r's stop strings and cache salt point into it */
    int json_ok;
    llm_json chat_json;             /* JOB_MESSAGES: the chat request the body became (r's strings point into
                                     * it as into json) */
    int chat_json_ok;
    srv_req *r;
    llm_sampling_params p;
};

/* The structures above own their buffers, and these free them: prompt_lp_free and req_free take NULL (a
 * prompt that never had logprobs, a job whose request was never made). */
static void prompt_lp_free(srv_prompt_lp *lp) {
    if (lp) { free(lp->logprobs); free(lp->ranks); free(lp->top_ids); free(lp->top_logprobs); }
    free(lp);
}

static void srv_event_free(srv_event *ev) {
    free(ev->text); free(ev->ids); free(ev->logprobs); free(ev->top_ids); free(ev->top_logprobs);
    free(ev->error); free(ev->embedding);
    prompt_lp_free(ev->prompt_lp);
}

/* A choice's logprob lists emptied: when the request is freed, and after each streamed chunk that sent them
 * (a stream sends each token's logprobs once). */
static void choice_reset_logprobs(srv_choice *ch) {
    sb_free(&ch->lp_tokens); sb_free(&ch->lp_values); sb_free(&ch->lp_top); sb_free(&ch->lp_offsets);
    sb_free(&ch->logprobs);
}

static void resp_free(srv_resp *rs);
static void req_free(srv_req *r) {
    if (!r) return;
    resp_free(r->resp);
    for (int i = 0; i < r->n_prompts; i++) {
        arrfree(r->prompts[i].prompt_ids);
        free(r->prompts[i].echo_text); free(r->prompts[i].embedding); free(r->prompts[i].document);
        prompt_lp_free(r->prompts[i].lp);
    }
    for (int i = 0; r->choices && i < r->n_prompts * r->n; i++) {
        sb_free(&r->choices[i].text);
        arrfree(r->choices[i].sent_args);
        choice_reset_logprobs(&r->choices[i]);
    }
    free(r->prompts); free(r->choices);
    arrfree(r->stop_ids); arrfree(r->bias_ids); arrfree(r->bias); arrfree(r->allowed_ids);
    arrfree(r->bad_ids); arrfree(r->bad_lens); free(r->grammar); free(r->chat_echo);
    llm_grammar_free(r->grammar_parsed);
    for (ptrdiff_t i = 0; i < arrlen(r->msg_stops); i++) free(r->msg_stops[i]);
    arrfree(r->msg_stops);
    free(r);
}

static void job_free(srv_job *j) {
    free(j->body); sb_free(&j->answer);
    if (j->json_ok) llm_json_free(&j->json);
    if (j->chat_json_ok) llm_json_free(&j->chat_json);
    req_free(j->r);
    free(j);
}

/* A histogram as Prometheus keeps one: counts[i] holds the samples in (bounds[i-1], bounds[i]] and counts[n]
 * those above the last bound (+Inf); put_hist writes them cumulated. The bounds are not copied: a static
 * table, or S->token_bounds, which lives as long as the server. */
static int hist_init(srv_hist *h, const double *bounds, int n) {
    h->bounds = bounds; h->n_bounds = n;
    h->counts = (int64_t *)calloc((size_t)n + 1, sizeof(int64_t));
    return h->counts ? 0 : -1;
}

static void hist_add(srv_hist *h, double x) {
    int i = 0;
    while (i < h->n_bounds && x > h->bounds[i]) i++;
    h->counts[i]++; h->sum += x; h->count++;
}

/* SIGTERM or SIGINT: 1 drains (the requests in flight finish, new ones and /health get 503), 2 exits now */
static volatile sig_atomic_t g_srv_stop, g_srv_signal;
static int g_srv_wake_fd = -1;
static void srv_on_signal(int sig) {
    g_srv_signal = sig;
    if (g_srv_stop < 2) g_srv_stop++;
    if (g_srv_wake_fd >= 0) { char c = 's'; ssize_t rc = write(g_srv_wake_fd, &c, 1); (void)rc; }
}

/* The wall clock in seconds, for OpenAI's "created" (now_s is monotonic: for durations). */
static double wall_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The hand-offs down a request's path that come before their definitions: the network loop gives a request
 * to its route (and answers errors), a route to the metrics or to a worker. */
static void send_error(srv_state *S, srv_conn *c, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int route_head(srv_state *S, srv_conn *c, const http_request *rq);
static void handle_request(srv_state *S, srv_conn *c, http_request *rq);
static void handle_metrics(srv_state *S, srv_conn *c);
static void job_start(srv_state *S, srv_conn *c, int route, http_request *rq);
/* and Anthropic's Messages API (its own section, after the engine's events): a worker's job, what each
 * output adds, the end */
static void msgs_job(srv_state *S, srv_job *j);
static void msgs_stream_event(srv_state *S, srv_req *r, srv_choice *ch, const srv_event *ev);
static void msgs_finish(srv_state *S, srv_req *r);
static void handle_stored_response(srv_state *S, srv_conn *c, const http_request *rq);
static int resp_prepare(srv_state *S, srv_job *j);
static void resp_started(srv_state *S, srv_req *r);
static void resp_output(srv_state *S, srv_req *r, srv_choice *ch, const srv_event *ev);
static void resp_finish(srv_state *S, srv_req *r);

/* ===========================================================================================================
 * Connections and the network loop
 *
 * What a connection may cost is bounded. In memory: its unparsed input by a head's 16 KiB and one read
 * (a body is taken out as it comes), its body by 8 MiB, and every connection's request bytes past its
 * first SRV_CONN_ALLOWANCE by SRV_MAX_BUFFERED in all (503 past it); its unsent output by SRV_MAX_BACKLOG:
 * past it nothing more of it is read or parsed (pipelined requests from a client that reads nothing make no
 * more answers), and a stream it runs is aborted. In time: a request must come whole within
 * --request-timeout (408), and output that waits that long with no byte taken ends the connection (its
 * request aborted). The socket is read only while the connection wants input, so none of this can be
 * outrun by a client that sends faster than it is answered.
 *
 * The loop itself is serve's (in llm serve, at the end): each pass it reads the sockets epoll names
 * (conn_read, conn_flush), accepts (accept_all), applies the engine's events (drain_events) and the jobs
 * the workers finished (jobs_done), then moves every connection on (conn_tick). conn_process is where
 * bytes become requests: http_feed parses, route_head judges a head, handle_request answers a whole one.
 * ======================================================================================================== */
/* The bytes of c's output the kernel has not taken yet */
static size_t conn_unsent(const srv_conn *c) { return c->out.len - c->out_sent; }

/* Whether a request of c is in flight: in the engine, or still with a worker */
static int conn_busy(const srv_conn *c) { return c->req || c->job; }

/* Whether c's socket is to be read now: not while a request of it is in flight (the next one waits in the
 * kernel's buffer), nor while its output is backed up, nor after its FIN; closing, only to drop what comes
 * while lingering. */
static int conn_wants_input(const srv_conn *c) {
    if (c->closing) return c->closing == 3;
    return !c->eof && !conn_busy(c) && conn_unsent(c) <= SRV_MAX_BACKLOG;
}

/* Asks epoll for what c waits for now (a call only when that changed; errors and hang-ups always come). */
static void conn_update_events(srv_state *S, srv_conn *c) {
    unsigned ev = (conn_wants_input(c) ? EPOLLIN | EPOLLRDHUP : 0) | (conn_unsent(c) ? EPOLLOUT : 0);
    if (ev == c->events) return;
    struct epoll_event e = {0};
    e.events = ev;
    e.data.ptr = c;
    epoll_ctl(S->epoll_fd, EPOLL_CTL_MOD, c->fd, &e);
    c->events = ev;
}

/* Sends what the kernel takes of c's output. t_out_stuck is when the unsent bytes last moved (0: none). */
static void conn_flush(srv_state *S, srv_conn *c) {
    (void)S;
    size_t before = c->out_sent;
    while (c->out_sent < c->out.len) {
        ssize_t n = send(c->fd, c->out.s + c->out_sent, c->out.len - c->out_sent, MSG_NOSIGNAL);
        if (n > 0) { c->out_sent += (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        c->closing = 2; /* the peer is gone */
        return;
    }
    if (c->out_sent == c->out.len) { /* all out: a large buffer goes back to the allocator */
        if (c->out.cap > SRV_CONN_ALLOWANCE) sb_free(&c->out);
        c->out.len = 0; c->out_sent = 0; c->t_out_stuck = 0;
    } else if (c->out_sent > before || !c->t_out_stuck) c->t_out_stuck = now_s();
}

/* Appends to c's output and sends what can go. The part already sent is dropped before the buffer grows
 * (a client that reads steadily but never quite catches up cannot make it grow). A stream whose client has
 * fallen SRV_MAX_BACKLOG behind is ended: its request is aborted when the connection closes. */
static void conn_send(srv_state *S, srv_conn *c, const char *data, size_t n) {
    if (!c || c->closing == 2) return;
    if (c->out_sent && c->out_sent >= c->out.len / 2) {
        memmove(c->out.s, c->out.s + c->out_sent, c->out.len - c->out_sent);
        c->out.len -= c->out_sent; c->out_sent = 0;
    }
    sb_put(&c->out, data, n);
    if (c->out.failed) { c->closing = 2; return; }
    conn_flush(S, c);
    if (c->closing != 2 && c->req && c->req->stream && conn_unsent(c) > SRV_MAX_BACKLOG) {
        fprintf(stderr, "llm serve: %s %s: the client is more than %d MiB behind its stream: connection "
                "closed, request aborted\n", c->req->id, c->peer, SRV_MAX_BACKLOG >> 20);
        c->closing = 2;
    }
}

/* Counts c's request bytes past its allowance into S->held (after each change to them). */
static void conn_account(srv_state *S, srv_conn *c) {
    size_t have = c->in.len + c->parser.rq.body.len;
    size_t held = have > SRV_CONN_ALLOWANCE ? have - SRV_CONN_ALLOWANCE : 0;
    S->held = S->held - c->held + held;
    c->held = held;
}

/* Ends c now: its request's generation aborted (the engine frees its blocks at its next step, and the request
 * is freed when its last output comes), a worker's job orphaned (what the worker makes is thrown away), the
 * socket closed and its bytes no longer counted in S->held. */
static void conn_close(srv_state *S, srv_conn *c) {
    if (c->req) { /* the client left mid-request: stop its generation, its blocks go back at the next step */
        for (int i = 0; i < c->req->n_prompts; i++) llm_engine_abort(S->engine, c->req->prompts[i].engine_id);
        c->req->conn = NULL;
    }
    if (c->job) c->job->conn = NULL; /* a worker has its request: what it makes is thrown away */
    epoll_ctl(S->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    for (ptrdiff_t i = 0; i < arrlen(S->conns); i++) if (S->conns[i] == c) { arrdelswap(S->conns, i); break; }
    S->held -= c->held;
    http_parser_reset(&c->parser);
    sb_free(&c->in); sb_free(&c->out);
    free(c);
}

/* The head of the request being read is in: answered now when route_head says so; else its body follows
 * (after "100 Continue" to a client that waits for it). An answer given before a body ends the connection:
 * the body is never read (what comes of it is dropped while the connection lingers). */
static void conn_head(srv_state *S, srv_conn *c) {
    const http_request *rq = &c->parser.rq;
    int body = rq->chunked || rq->content_length > 0;
    c->keep_alive = rq->keep_alive && !g_srv_stop && !body; /* as an answer now says it */
    if (route_head(S, c, rq)) {
        c->answered = 1;
        if (!c->keep_alive) c->closing = 1;
        return;
    }
    c->keep_alive = rq->keep_alive && !g_srv_stop;
    if (rq->expect_continue && body) conn_send(S, c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
}

/* Parses and answers the requests waiting in c's input, in order, while none is in flight and its output
 * is not backed up; then drops the bytes parsed (once), counts what is held and starts the clock of a
 * request begun. After the client's FIN, a connection with nothing more to answer closes. */
static void conn_process(srv_state *S, srv_conn *c) {
    size_t off = 0;
    int starved = 0;
    /* 1. parse from offset off of the input: a head (judged at once), a whole request (answered, or given
     * to a worker: then conn_busy stops the loop, and the next pipelined request waits in c->in), or an
     * error (answered, and the connection closes: what follows cannot be framed) */
    while (!conn_busy(c) && !c->closing && conn_unsent(c) <= SRV_MAX_BACKLOG) {
        size_t used = 0;
        int rc = http_feed(&c->parser, c->in.s ? c->in.s + off : "", c->in.len - off, &used);
        off += used;
        if (rc == HTTP_INCOMPLETE) { starved = 1; break; }
        if (rc == HTTP_HEAD) { conn_head(S, c); continue; }
        if (rc == HTTP_OK) {
            if (!c->answered) handle_request(S, c, &c->parser.rq);
            http_parser_reset(&c->parser);
            c->answered = 0;
            if (!conn_busy(c) && !c->keep_alive) c->closing = 1;
            continue;
        }
        /* the stream can no longer be trusted: answer and close */
        c->keep_alive = 0;
        send_error(S, c, rc, NULL, "%s%s", rc == 400 ? "a malformed HTTP request: " : "",
                   c->parser.why ? c->parser.why : "");
        c->closing = 1;
    }
    /* 2. the bytes parsed leave the input in one move (not one per request), and a large empty buffer goes
     * back to the allocator */
    if (off) {
        memmove(c->in.s, c->in.s + off, c->in.len - off);
        c->in.len -= off;
    }
    if (!c->in.len && c->in.cap > SRV_CONN_ALLOWANCE) sb_free(&c->in);
    /* 3. --request-timeout's clock runs from a request's first byte until it is whole; a connection idle
     * between requests is SRV_IDLE_TIMEOUT's (conn_tick). After the client's FIN, input that ends short of
     * a whole request never becomes one: the connection closes */
    int begun = !conn_busy(c) && !c->closing && (c->in.len || c->parser.state != HP_HEAD);
    if (!begun) c->t_request_start = 0;
    else if (!c->t_request_start) c->t_request_start = now_s();
    if (c->eof && starved && !conn_busy(c) && !c->closing) c->closing = 1;
    conn_account(S, c);
}

/* Reads what c's client sends while c wants input, parsing as it goes; a lingering connection's input is
 * dropped. recv() == 0 is the client's FIN, which may be a half-close (shutdown(SHUT_WR), nc -N): what it
 * asked is still answered, then the connection ends. Bytes past a connection's allowance count against
 * the budget all connections share: a read that would pass it gets a 503. */
static void conn_read(srv_state *S, srv_conn *c) {
    while (conn_wants_input(c)) {
        char buf[65536];
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n < 0 || (n == 0 && c->closing == 3)) { c->closing = 2; return; } /* failed, or lingered enough */
        if (n == 0) { c->eof = 1; break; }
        if (c->closing == 3) continue;
        c->t_last_active = now_s();
        size_t have = c->in.len + c->parser.rq.body.len + (size_t)n;
        if (have > SRV_CONN_ALLOWANCE && S->held - c->held + (have - SRV_CONN_ALLOWANCE) > SRV_MAX_BUFFERED) {
            c->keep_alive = 0;
            send_error(S, c, 503, NULL, "the server holds too many unfinished requests' bytes (%d MiB): "
                       "try again", SRV_MAX_BUFFERED >> 20);
            c->closing = 1;
            http_parser_reset(&c->parser); /* what it held of this request goes back at once */
            sb_free(&c->in);
            conn_account(S, c);
            return;
        }
        sb_put(&c->in, buf, (size_t)n);
        if (c->in.failed) { c->closing = 2; return; }
        conn_process(S, c);
    }
    conn_process(S, c);
}

/* The listener in epoll or out of it: out while accept() cannot take a connection (see accept_all). */
static void listener_rest(srv_state *S, int rest) {
    struct epoll_event e = {0};
    e.events = rest ? 0 : EPOLLIN;
    e.data.ptr = &S->listen_fd;
    epoll_ctl(S->epoll_fd, EPOLL_CTL_MOD, S->listen_fd, &e);
    S->accept_resume = rest ? now_s() + SRV_ACCEPT_PAUSE : 0;
}

/* Takes every connection waiting. Out of fds (EMFILE, ENFILE) or memory, accept() fails again at once for
 * as long as connections wait, and the level-triggered listener would spin the loop on it (and the log):
 * the listener rests SRV_ACCEPT_PAUSE seconds instead, the connections waiting in the kernel's backlog
 * until fds free up, and the failure is logged at most once every 10 seconds. */
static void accept_all(srv_state *S) {
    for (;;) {
        struct sockaddr_storage addr;
        socklen_t alen = sizeof addr;
        int fd = accept4(S->listen_fd, (struct sockaddr *)&addr, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            double t = now_s();
            if (!S->accept_log_t || t - S->accept_log_t >= 10) {
                fprintf(stderr, "llm serve: accept: %s (%d connections open): new connections wait until "
                        "some close\n", strerror(errno), (int)arrlen(S->conns));
                S->accept_log_t = t;
            }
            listener_rest(S, 1);
            return;
        }
        srv_conn *c = (srv_conn *)calloc(1, sizeof *c);
        if (!c) { close(fd); continue; }
        c->fd = fd; c->keep_alive = 1; c->t_last_active = now_s();
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* stream tokens as they come */
        char host[INET6_ADDRSTRLEN] = "?";
        if (addr.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&addr)->sin_addr, host, sizeof host);
        else if (addr.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&addr)->sin6_addr, host, sizeof host);
        snprintf(c->peer, sizeof c->peer, "%s", host);
        struct epoll_event e = {0};
        e.events = c->events = EPOLLIN | EPOLLRDHUP;
        e.data.ptr = c;
        if (epoll_ctl(S->epoll_fd, EPOLL_CTL_ADD, fd, &e) != 0) { close(fd); free(c); continue; }
        arrput(S->conns, c);
    }
}

/* After a pass of events, each connection's state moves on: its next pipelined request, time-outs (a
 * request begun and not finished, output not taken, idleness), closing (then lingering: FIN sent, late
 * input dropped for SRV_LINGER seconds, so that an answer given before a body was read is not lost to the
 * reset that closing on unread input sends), and the epoll events it waits for. */
static void conn_tick(srv_state *S, srv_conn *c, double t) {
    /* 1. a request that just finished frees the connection: the next one already read is parsed now */
    if (!conn_busy(c) && !c->closing) conn_process(S, c);
    /* 2. the time-outs: a request too slow to arrive (408), output not taken (closed now, its request
     * aborted by conn_close), a kept-alive connection idle too long (closed quietly) */
    if (!conn_busy(c) && !c->closing && c->t_request_start && t - c->t_request_start > S->request_timeout) {
        c->keep_alive = 0; /* slowloris: the request was begun and not finished in time */
        send_error(S, c, 408, NULL, "the request took more than %g s to arrive", S->request_timeout);
        c->closing = 1;
    }
    if (c->closing != 2 && c->t_out_stuck && t - c->t_out_stuck > S->request_timeout) {
        fprintf(stderr, "llm serve: %s %s: the client took no response bytes for %g s: connection closed%s\n",
                c->req ? c->req->id : "-", c->peer, S->request_timeout, c->req ? ", request aborted" : "");
        c->closing = 2;
    }
    if (!conn_busy(c) && !c->closing && !c->t_request_start && t - c->t_last_active > SRV_IDLE_TIMEOUT)
        c->closing = 1;
    /* 3. closing: 1 -> (output all sent) 3, lingering after our FIN -> 2, closed; a client that sent its
     * FIN already has nothing more to say, so it skips the linger */
    if (c->closing == 1 && !conn_unsent(c)) {
        if (c->eof) c->closing = 2;
        else { shutdown(c->fd, SHUT_WR); c->closing = 3; c->t_linger = t; }
    }
    if (c->closing == 3 && t - c->t_linger > SRV_LINGER) c->closing = 2;
    if (c->closing == 2) conn_close(S, c);
    else conn_update_events(S, c);
}

/* A non-blocking listening socket on the first address of host:port that binds (port 0: any free one);
 * *bound_port is the port it got. -1 with err set. */
static int open_listener(const char *host, int port, int *bound_port, char *err, size_t err_cap) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC; hints.ai_socktype = SOCK_STREAM; hints.ai_flags = AI_PASSIVE;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    int rc = getaddrinfo(host, ports, &hints, &res);
    if (rc != 0) { snprintf(err, err_cap, "cannot resolve %s: %s", host, gai_strerror(rc)); return -1; }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
            snprintf(err, err_cap, "cannot listen on %s:%d: %s", host, port, strerror(errno));
            close(fd); fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return -1;
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    *bound_port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                                : ((struct sockaddr_in6 *)&sa)->sin6_port);
    return fd;
}

/* ===========================================================================================================
 * Responses: the bytes that go back
 *
 * Every answer goes through conn_send into its connection's output: a whole response (status line, headers,
 * body) by send_response, an error in OpenAI's shape by send_error, one Server-Sent Event as a chunk of a
 * chunked body by send_sse (a stream's head is sent by attach_generation, its end by finish_request). Each
 * response carries the X-Request-Id of its request, and the CORS headers route_head chose for it.
 * ======================================================================================================== */
/* The id of a request whose client sent no usable X-Request-Id: 32 random hex digits, the shape of vLLM's
 * random_uuid(), so that logs and a load balancer's traces name every request. */
static void mint_request_id(srv_state *S, char out[SRV_MAX_REQUEST_ID + 1]) {
    uint64_t a = llm_splitmix64(&S->id_rng), b = llm_splitmix64(&S->id_rng);
    snprintf(out, SRV_MAX_REQUEST_ID + 1, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

/* The request's X-Request-Id ("" until conn_process sets it, or for a request too broken to read: minted). */
static const char *conn_request_id(srv_state *S, srv_conn *c) {
    if (!c->request_id[0]) mint_request_id(S, c->request_id);
    return c->request_id;
}

/* A whole response: every one carries the X-Request-Id of its request, errors included. Its framing is
 * always Content-Length (the body is whole: a chunked body is only a stream's); "Connection: close" tells
 * the client when the connection ends after it (keep_alive off: HTTP/1.0 without keep-alive, a client's
 * close, an error the input cannot be read past, draining). The request's id and CORS headers are spent
 * here. */
static void send_response(srv_state *S, srv_conn *c, int status, const char *content_type, const char *body,
                          size_t body_len, const char *extra_headers) {
    sbuf h = {0};
    sb_printf(&h, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
              "X-Request-Id: %s\r\n%s%s%s\r\n", status, http_reason(status), content_type, body_len,
              conn_request_id(S, c), c->cors, extra_headers ? extra_headers : "",
              c->keep_alive ? "" : "Connection: close\r\n");
    conn_send(S, c, h.s, h.len);
    if (body_len) conn_send(S, c, body, body_len);
    sb_free(&h);
    c->request_id[0] = 0; c->cors[0] = 0; /* answered: the next request on the connection has its own */
    c->api = API_OPENAI;
}

/* OpenAI's error type for the statuses that have their own; any other is "server_error" from 500 up and
 * "invalid_request_error" below (send_error) */
static const struct { int status; const char *type; } srv_error_types[] = {
    {401, "authentication_error"}, {404, "not_found_error"}, {503, "service_unavailable_error"},
};
/* Anthropic's (docs.claude.com/en/api/errors): any other is "api_error" from 500 up, "invalid_request_error"
 * below; our busy 503 goes out as its 529 overloaded_error, which the anthropic SDK retries */
static const struct { int status; const char *type; } msgs_error_types[] = {
    {401, "authentication_error"}, {403, "permission_error"}, {404, "not_found_error"},
    {413, "request_too_large"}, {429, "rate_limit_error"}, {503, "overloaded_error"},
};

/* An error in the shape of the API the request's path belongs to (c->api): OpenAI's {"error": {"message",
 * "type", "param", "code"}}, or Anthropic's {"type": "error", "error": {"type", "message"}} (no param: its
 * messages name the field first); extra: more header lines (NULL: none). */
static void send_error_shaped(srv_state *S, srv_conn *c, int status, const char *param, const char *extra,
                              const char *msg) {
    int anthropic = c->api == API_MESSAGES;
    const char *type = status >= 500 ? (anthropic ? "api_error" : "server_error") : "invalid_request_error";
    for (size_t i = 0; !anthropic && i < sizeof srv_error_types / sizeof srv_error_types[0]; i++)
        if (srv_error_types[i].status == status) type = srv_error_types[i].type;
    for (size_t i = 0; anthropic && i < sizeof msgs_error_types / sizeof msgs_error_types[0]; i++)
        if (msgs_error_types[i].status == status) type = msgs_error_types[i].type;
    sbuf b = {0};
    if (anthropic) {
        sb_puts(&b, "{\"type\":\"error\",\"error\":{\"type\":");
        sb_json_cstr(&b, type);
        sb_puts(&b, ",\"message\":");
        sb_json_cstr(&b, msg);
        sb_puts(&b, "}}");
        if (status == 503) status = 529;
    } else {
        sb_puts(&b, "{\"error\":{\"message\":");
        sb_json_cstr(&b, msg);
        sb_puts(&b, ",\"type\":");
        sb_json_cstr(&b, type);
        sb_puts(&b, ",\"param\":");
        if (param) sb_json_cstr(&b, param); else sb_puts(&b, "null");
        sb_printf(&b, ",\"code\":%d}}", status);
    }
    sbuf h = {0};
    if (status == 401) sb_puts(&h, "WWW-Authenticate: Bearer\r\n");
    if (extra) sb_puts(&h, extra);
    send_response(S, c, status, "application/json", b.s ? b.s : "", b.len, h.s);
    sb_free(&b); sb_free(&h);
}

/* An error, its message formatted as printf does, in the shape of the request's API */
static void send_error(srv_state *S, srv_conn *c, int status, const char *param, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    send_error_shaped(S, c, status, param, NULL, msg);
}

/* One SSE event as one chunk of a chunked body. On the wire, for a JSON text of n bytes:
 *   {size in hex}\r\n [event: {name}\n] data: {json}\n\n \r\n
 * the chunk's size counts the event line when there is one (Anthropic's and the Responses API's typed events
 * name themselves; chat completions' do not), "data: " (6 bytes), the JSON and the blank line that ends the
 * event (2); the last CRLF ends the chunk. One event per chunk: a client or proxy that reads chunk by chunk
 * gets each event whole. No copy of the JSON into a buffer of its own. */
static void send_sse(srv_state *S, srv_conn *c, const char *event, const char *json, size_t n) {
    char head[160];
    size_t e = event ? strlen(event) + 8 : 0; /* "event: " name "\n" */
    int h = snprintf(head, sizeof head, "%zx\r\n%s%s%s", n + 8 + e, event ? "event: " : "",
                     event ? event : "", event ? "\n" : "");
    conn_send(S, c, head, (size_t)h);
    conn_send(S, c, "data: ", 6);
    conn_send(S, c, json, n);
    conn_send(S, c, "\n\n\r\n", 4);
}

/* ===========================================================================================================
 * Routes: what a request's head decides, then which endpoint answers
 *
 * route_head runs as soon as a head is parsed, before a byte of the body is read: an unknown path, a wrong
 * method, a missing API key, a body too large or not JSON, a draining server are answered from the head
 * alone, and the body is never read (the connection closes). handle_request runs once the body is in: the
 * cheap endpoints answer at once, the others go to a worker. srv_routes is the table of every path, the one
 * method it takes and whether it is open (no API key: the health checks and the metrics).
 * ======================================================================================================== */
/* Whether the key given is the server's, comparing every byte (no early exit): the time taken does not tell
 * how much of a guess was right. */
static int key_equal(const char *given, const char *key) { /* constant time in the key's length */
    size_t n = strlen(key), m = strlen(given);
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < m ? given[i] : 0);
    return diff == 0;
}

/* The routes: the one method each takes, whether it is open, and the job a worker does for it (-1: none,
 * the network thread answers it in handle_request). The POST ones take a JSON object (Content-Type:
 * application/json, as vLLM asks: a browser cannot send that cross-origin without a CORS preflight). */
static const struct { const char *path, *method; int open, job; } srv_routes[] = {
    {"/v1/completions", "POST", 0, JOB_COMPLETIONS}, {"/v1/chat/completions", "POST", 0, JOB_CHAT},
    {"/v1/responses", "POST", 0, JOB_RESPONSES}, {"/v1/responses/compact", "POST", 0, JOB_COMPACT},
    {"/v1/responses/", "GET, DELETE", 0, -1}, /* a prefix: a stored response */
    {"/tokenize", "POST", 0, JOB_TOKENIZE}, {"/detokenize", "POST", 0, JOB_DETOKENIZE},
    {"/v1/messages", "POST", 0, JOB_MESSAGES}, {"/v1/messages/count_tokens", "POST", 0, JOB_COUNT_TOKENS},
    {"/v1/embeddings", "POST", 0, JOB_EMBEDDINGS}, {"/v1/rerank", "POST", 0, JOB_RERANK},
    {"/v1/score", "POST", 0, JOB_SCORE},
    {"/v1/models", "GET", 0, -1}, {"/version", "GET", 0, -1},
    {"/health", "GET", 1, -1}, {"/ping", "GET", 1, -1}, {"/metrics", "GET", 1, -1},
};

/* path's index in srv_routes, or -1; a row whose path ends with '/' takes the paths under it */
static int find_route(const char *path) {
    for (int i = 0; i < (int)(sizeof srv_routes / sizeof srv_routes[0]); i++) {
        const char *p = srv_routes[i].path;
        size_t n = strlen(p);
        if (!strcmp(path, p) || (p[n - 1] == '/' && !strncmp(path, p, n) && path[n])) return i;
    }
    return -1;
}

/* Whether --allowed-origins lets origin in ("*" lets any) */
static int origin_allowed(const srv_state *S, const char *origin) {
    for (ptrdiff_t i = 0; i < arrlen(S->origins); i++)
        if (!strcmp(S->origins[i], "*") || !strcmp(S->origins[i], origin)) return 1;
    return 0;
}

/* A request's head is in: what the head alone decides is answered now, before a byte of the body is read
 * (an unknown path, a wrong method, a CORS preflight, a missing API key, a body too large or not JSON,
 * draining). Returns 1 when it answered. Sets the response's X-Request-Id and CORS headers.
 * The order of the checks is the answer a client gets when several fail: the path (404), a preflight
 * (answered before the key, as a browser sends none with it), the method (405), the key (401: before
 * anything about the body, so a client without the key learns nothing from 413 or 415), the body's size
 * (413) and type (415), then draining (503). */
static int route_head(srv_state *S, srv_conn *c, const http_request *rq) {
    /* 1. the ids and headers every answer from here on carries, this one's too */
    if (rq->request_id[0]) memcpy(c->request_id, rq->request_id, sizeof c->request_id);
    else mint_request_id(S, c->request_id);
    c->cors[0] = 0;
    c->api = !strncmp(rq->path, "/v1/messages", 12) ? API_MESSAGES : API_OPENAI; /* the shape of errors */
    int cors = rq->origin[0] && origin_allowed(S, rq->origin);
    if (cors) /* as Starlette's CORSMiddleware (vLLM's) answers an allowed origin */
        snprintf(c->cors, sizeof c->cors, "Access-Control-Allow-Origin: %s\r\n%s",
                 origin_allowed(S, "*") ? "*" : rq->origin, origin_allowed(S, "*") ? "" : "Vary: Origin\r\n");
    /* 2. the checks, in the order above */
    int route = find_route(rq->path);
    if (route < 0) { send_error(S, c, 404, NULL, "Not Found: %s", rq->path); return 1; }
    const char *method = srv_routes[route].method;
    if (cors && rq->preflight && !strcmp(rq->method, "OPTIONS")) { /* before the key: a preflight has none */
        char h[512];
        snprintf(h, sizeof h, "Access-Control-Allow-Methods: %s, OPTIONS\r\nAccess-Control-Max-Age: 600\r\n"
                 "%s%s%s", method, rq->cors_headers[0] ? "Access-Control-Allow-Headers: " : "",
                 rq->cors_headers, rq->cors_headers[0] ? "\r\n" : "");
        send_response(S, c, 200, "text/plain; charset=utf-8", "", 0, h);
        return 1;
    }
    if (!http_list_has(method, strlen(method), rq->method) || !strcmp(rq->method, "OPTIONS")) {
        char allow[64], msg[320];
        snprintf(allow, sizeof allow, "Allow: %s\r\n", method);
        snprintf(msg, sizeof msg, "Method Not Allowed: use %s for %s", method, rq->path);
        send_error_shaped(S, c, 405, NULL, allow, msg);
        return 1;
    }
    if (S->api_key && !srv_routes[route].open) { /* OpenAI's header, or Anthropic's x-api-key */
        const char *a = rq->auth;
        if ((strncasecmp(a, "Bearer ", 7) != 0 || !key_equal(a + 7, S->api_key)) &&
            (!rq->api_key[0] || !key_equal(rq->api_key, S->api_key))) {
            send_error(S, c, 401, NULL, "Unauthorized: give the API key as %s", c->api == API_MESSAGES ?
                       "'x-api-key: KEY' (or 'Authorization: Bearer KEY')" : "'Authorization: Bearer KEY'");
            return 1;
        }
    }
    if (rq->content_length > SRV_MAX_BODY) {
        send_error(S, c, 413, NULL, "the request's body is too large (%lld bytes; at most %d)",
                   rq->content_length, SRV_MAX_BODY);
        return 1;
    }
    if (!strcmp(method, "POST") && !rq->json) { /* vLLM's words */
        send_error(S, c, 415, NULL, "Unsupported Media Type: Only 'application/json' is allowed");
        return 1;
    }
    /* draining (SIGTERM): /health fails, so a load balancer sends new work elsewhere, and new work that
     * comes anyway is refused; what is in flight runs to its end */
    const char *path = rq->path;
    int job = srv_routes[route].job;
    int generation = job == JOB_COMPLETIONS || job == JOB_CHAT || job == JOB_MESSAGES ||
                     job == JOB_RESPONSES || job == JOB_COMPACT || job == JOB_EMBEDDINGS ||
                     job == JOB_RERANK || job == JOB_SCORE;
    if (g_srv_stop && (generation || !strcmp(path, "/health") || !strcmp(path, "/ping"))) {
        send_error(S, c, 503, NULL, "the server is shutting down: it finishes the requests it has and takes "
                   "no new ones");
        return 1;
    }
    return 0;
}

/* A whole request, which route_head let through: the endpoint's answer. */
static void handle_request(srv_state *S, srv_conn *c, http_request *rq) {
    const char *path = rq->path;
    int job = srv_routes[find_route(path)].job;
    if (job >= 0) { job_start(S, c, job, rq); return; } /* it takes a JSON object: a worker reads it */
    if (!strcmp(path, "/health") || !strcmp(path, "/ping")) {
        send_response(S, c, 200, "application/json", "", 0, NULL);
        return;
    }
    if (!strcmp(path, "/metrics")) { handle_metrics(S, c); return; }
    if (!strncmp(path, "/v1/responses/", 14)) { handle_stored_response(S, c, rq); return; }
    if (!strcmp(path, "/version")) {
        const char v[] = "{\"version\":\"0.1.0\"}";
        send_response(S, c, 200, "application/json", v, sizeof v - 1, NULL);
        return;
    }
    if (!strcmp(path, "/v1/models")) {
        sbuf b = {0};
        sb_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
        sb_json_cstr(&b, S->model_name);
        sb_printf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"llm\",\"root\":",
                  (long long)wall_s());
        sb_json_cstr(&b, S->model_name);
        sb_printf(&b, ",\"parent\":null,\"max_model_len\":%d,\"permission\":[]}]}", S->max_model_len);
        send_response(S, c, 200, "application/json", b.s, b.len, NULL);
        sb_free(&b);
    }
}

/* ===========================================================================================================
 * Requests in: the OpenAI parameters, checked, as llm_sampling_params
 *
 * Each field is checked before anything is spent on it, and a bad value is a 400 that names the field
 * (srv_error, filled by bad). The order for a generation (prepare_generation, in Endpoints, calls these):
 *   check_fields       every field of the body against req_fields, the table of each OpenAI, vLLM and
 *                      llama.cpp field this server knows: implemented, accepted only at a value that asks
 *                      for nothing, or refused (fail closed: no client gets free text it took for JSON)
 *   parse_sampling     the sampling fields, over the server's defaults, into llm_sampling_params and r
 *   parse_structured   the one structured output field given, into a grammar (GBNF), parsed now
 *   chat_prompt        a chat's messages and tools, through the chat template, into the prompt's text
 * All of it runs on a request worker: a schema, a grammar or a prompt may take seconds to read.
 * ======================================================================================================== */
static int bad(srv_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(srv_error *e, int status, const char *param, const char *fmt, ...) {
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* A number field: absent (or null) leaves *out; else it must be a number in [lo, hi] (integral when
   asked). */
static int get_number(const llm_json *body, const char *key, double lo, double hi, int integral, double *out,
                      srv_error *e) {
    const llm_json *v = llm_json_get(body, key);
    if (!v || v->type == LLM_JSON_NULL) return 0;
    if (v->type != LLM_JSON_NUMBER) return bad(e, 400, key, "%s must be a number", key);
    if (integral && v->num != floor(v->num)) return bad(e, 400, key, "%s must be an integer", key);
    if (!(v->num >= lo && v->num <= hi))
        return bad(e, 400, key, "%s must be between %.17g and %.17g, got %.17g", key, lo, hi, v->num);
    *out = v->num;
    return 0;
}

/* A boolean field: absent (or null) leaves *out; else it must be true or false. */
static int get_bool(const llm_json *body, const char *key, int *out, srv_error *e) {
    const llm_json *v = llm_json_get(body, key);
    if (!v || v->type == LLM_JSON_NULL) return 0;
    if (v->type != LLM_JSON_TRUE && v->type != LLM_JSON_FALSE)
        return bad(e, 400, key, "%s must be true or false", key);
    *out = v->type == LLM_JSON_TRUE;
    return 0;
}

/* A JSON value that is a token id of the model: an integer in [0, vocab_size). */
static int is_token_id(const srv_state *S, const llm_json *v) {
    return v->type == LLM_JSON_NUMBER && v->num == floor(v->num) && v->num >= 0 &&
        v->num < S->model->cfg.vocab_size;
}

/* Fail closed: a field of OpenAI's or vLLM's request (or llama.cpp's structured output) that this server does
 * not implement is refused with a 400 unless its value asks for nothing (null always means "not given"): a
 * client that asks for JSON, a tool call or a biased sampling must not get free text it takes for that. */
static int fv_str(const llm_json *v, const char *s) { return v && v->type == LLM_JSON_STRING &&
                                                      !strcmp(v->str, s); }
static int fv_empty(const llm_json *v) {
    return !v || v->type == LLM_JSON_NULL || ((v->type == LLM_JSON_ARRAY ||
                                               v->type == LLM_JSON_OBJECT) && v->n == 0);
}
/* The values a row takes (null already accepted); body, for those that depend on other fields. */
static int fv_any(const llm_json *v, const llm_json *b) { (void)v; (void)b; return 1; }
static int fv_never(const llm_json *v, const llm_json *b) { (void)v; (void)b; return 0; }
static int fv_true(const llm_json *v, const llm_json *b) { (void)b; return v->type == LLM_JSON_TRUE; }
static int fv_false(const llm_json *v, const llm_json *b) { (void)b; return v->type == LLM_JSON_FALSE; }
static int fv_1(const llm_json *v, const llm_json *b) { (void)b;
                                                        return v->type == LLM_JSON_NUMBER && v->num == 1; }
/* [] {} "" */
static int fv_none(const llm_json *v, const llm_json *b) { (void)b; return fv_empty(v) || fv_str(v, ""); }
static int fv_text_only(const llm_json *v, const llm_json *b) {  /* modalities: ["text"] */
    (void)b;
    return v->type == LLM_JSON_ARRAY && v->n == 1 && fv_str(&v->items[0], "text");
}
static int fv_no_tool(const llm_json *v, const llm_json *b) {  /* "none", or "auto" with no functions */
    return fv_str(v, "none") || (fv_str(v, "auto") && fv_empty(llm_json_get(b, "functions")));
}
static int fv_best_of(const llm_json *v, const llm_json *b) {  /* best of n among n samples: nothing to
                                                                * pick */
    const llm_json *n = llm_json_get(b, "n");
    return v->type == LLM_JSON_NUMBER && (v->num == 1 ||
                                          (n && n->type == LLM_JSON_NUMBER && v->num == n->num));
}

enum { F_CMPL = 1 << REQ_COMPLETIONS, F_CHAT = 1 << REQ_CHAT, F_BOTH = F_CMPL | F_CHAT,
       F_EMBED = 1 << REQ_EMBED, F_RERANK = 1 << REQ_RERANK, F_SCORE = 1 << REQ_SCORE,
       F_RANK = F_RERANK | F_SCORE };
static int fv_float32(const llm_json *v, const llm_json *b) { (void)b; return fv_str(v, "float32"); }
static int fv_0(const llm_json *v, const llm_json *b) {
    (void)b; return v->type == LLM_JSON_NUMBER && !v->num;
}
/* A row of a field table: a field's name, what value it takes (fv_*: fv_any, implemented and checked where
 * it is read; fv_never, refused at any value but null), and the endpoints that define it (req_fields: F_*;
 * resp_fields: RF_*; 0 in msgs_fields, a table of one endpoint) */
typedef struct {
    const char *name;
    int (*takes)(const llm_json *v, const llm_json *b);
    int endpoints;
} srv_field;
static const srv_field req_fields[] = {
    /* implemented: parse_sampling and prepare_generation check their values */
    {"model", fv_any, F_BOTH}, {"stream", fv_any, F_BOTH}, {"stream_options", fv_any, F_BOTH},
    {"temperature", fv_any, F_BOTH}, {"top_p", fv_any, F_BOTH}, {"top_k", fv_any, F_BOTH},
    {"min_p", fv_any, F_BOTH}, {"n", fv_any, F_BOTH}, {"seed", fv_any, F_BOTH}, {"stop", fv_any, F_BOTH},
    {"stop_token_ids", fv_any, F_BOTH}, {"presence_penalty", fv_any, F_BOTH},
    {"frequency_penalty", fv_any, F_BOTH}, {"repetition_penalty", fv_any, F_BOTH},
    {"ignore_eos", fv_any, F_BOTH}, {"min_tokens", fv_any, F_BOTH}, {"skip_special_tokens", fv_any, F_BOTH},
    {"max_tokens", fv_any, F_BOTH}, {"logprobs", fv_any, F_BOTH}, {"prompt_logprobs", fv_any, F_BOTH},
    {"prompt", fv_any, F_CMPL}, {"echo", fv_any, F_BOTH}, {"messages", fv_any, F_CHAT},
    {"max_completion_tokens", fv_any, F_CHAT}, {"top_logprobs", fv_any, F_CHAT},
    {"logit_bias", fv_any, F_BOTH}, {"allowed_token_ids", fv_any, F_BOTH}, {"bad_words", fv_any, F_BOTH},
    {"include_stop_str_in_output", fv_any, F_BOTH}, {"return_tokens_as_token_ids", fv_any, F_BOTH},
    {"truncate_prompt_tokens", fv_any, F_BOTH}, {"cache_salt", fv_any, F_BOTH},
    {"add_special_tokens", fv_any, F_BOTH}, {"priority", fv_any, F_BOTH},
    /* metadata, which changes no output; no tools are ever taken, so none run in parallel */
    {"user", fv_any, F_BOTH}, {"metadata", fv_any, F_BOTH}, {"store", fv_any, F_BOTH},
    {"service_tier", fv_any, F_BOTH}, {"request_id", fv_any, F_BOTH}, {"safety_identifier", fv_any, F_CHAT},
    /* the balancer's routing key (deploy/haproxy.cfg); in one server the prefix cache needs none */
    {"prompt_cache_key", fv_any, F_BOTH},
    /* chat: chat_prompt reads them */
    {"tools", fv_any, F_CHAT}, {"tool_choice", fv_any, F_CHAT}, {"parallel_tool_calls", fv_any, F_CHAT},
    {"chat_template_kwargs", fv_any, F_CHAT}, {"reasoning_effort", fv_any, F_CHAT},
    {"add_generation_prompt", fv_any, F_CHAT}, {"continue_final_message", fv_any, F_CHAT},
    {"include_reasoning", fv_any, F_CHAT}, {"thinking_token_budget", fv_any, F_CHAT},
    /* not implemented: only the values that ask for what this server does anyway */
    {"spaces_between_special_tokens", fv_true, F_BOTH},
    {"use_beam_search", fv_false, F_BOTH}, {"length_penalty", fv_1, F_BOTH},
    {"best_of", fv_best_of, F_BOTH},
    {"suffix", fv_none, F_CMPL},
    {"functions", fv_none, F_CHAT}, {"function_call", fv_no_tool, F_CHAT}, /* the old API: use tools */
    {"modalities", fv_text_only, F_CHAT},
    {"logits_processors", fv_none, F_BOTH}, {"vllm_xargs", fv_none, F_BOTH},
    {"kv_transfer_params", fv_none, F_BOTH}, {"mm_processor_kwargs", fv_none, F_BOTH},
    {"documents", fv_none, F_CHAT},
    /* structured output: parse_structured reads them (the backend is ours, whichever vLLM's names) */
    {"response_format", fv_any, F_BOTH}, {"structured_outputs", fv_any, F_BOTH},
    {"guided_json", fv_any, F_BOTH}, {"guided_regex", fv_any, F_BOTH}, {"guided_choice", fv_any, F_BOTH},
    {"guided_grammar", fv_any, F_BOTH}, {"guided_decoding_backend", fv_any, F_BOTH},
    {"grammar", fv_any, F_BOTH}, {"json_schema", fv_any, F_BOTH},
    /* not implemented, and every value asks for something */
    {"guided_whitespace_pattern", fv_never, F_BOTH}, {"structural_tag", fv_never, F_CHAT},
    {"prompt_embeds", fv_never, F_CMPL}, {"chat_template", fv_never, F_CHAT}, {"audio", fv_never, F_CHAT},
    {"prediction", fv_never, F_CHAT},
    {"web_search_options", fv_never, F_CHAT}, {"verbosity", fv_never, F_CHAT},
    /* /v1/embeddings (OpenAI's, and vLLM's pooling fields): prepare_embeddings reads the first ones */
    {"model", fv_any, F_EMBED}, {"input", fv_any, F_EMBED}, {"encoding_format", fv_any, F_EMBED},
    {"dimensions", fv_any, F_EMBED}, {"user", fv_any, F_EMBED},
    {"truncate_prompt_tokens", fv_any, F_EMBED}, {"add_special_tokens", fv_any, F_EMBED},
    {"request_id", fv_any, F_EMBED}, {"priority", fv_0, F_EMBED},
    {"normalize", fv_true, F_EMBED}, {"embed_dtype", fv_float32, F_EMBED},
    {"messages", fv_never, F_EMBED}, {"chat_template", fv_never, F_EMBED},
    {"mm_processor_kwargs", fv_none, F_EMBED}, {"use_activation", fv_never, F_EMBED},
    {"softmax", fv_never, F_EMBED}, {"activation", fv_never, F_EMBED},
    /* /v1/rerank (query, documents, top_n, return_documents), /v1/score (text_1, text_2): prepare_rerank;
     * each refuses the other's */
    {"model", fv_any, F_RANK}, {"query", fv_any, F_RERANK}, {"documents", fv_any, F_RERANK},
    {"top_n", fv_any, F_RERANK}, {"return_documents", fv_any, F_RERANK}, {"text_1", fv_any, F_SCORE},
    {"text_2", fv_any, F_SCORE}, {"query", fv_never, F_SCORE}, {"documents", fv_never, F_SCORE},
    {"top_n", fv_never, F_SCORE}, {"return_documents", fv_never, F_SCORE}, {"text_1", fv_never, F_RERANK},
    {"text_2", fv_never, F_RERANK}, {"user", fv_any, F_RANK}, {"truncate_prompt_tokens", fv_any, F_RANK},
    {"request_id", fv_any, F_RANK}, {"priority", fv_0, F_RANK},
    {"rank_fields", fv_never, F_RANK}, {"max_chunks_per_doc", fv_never, F_RANK},
    {"max_tokens_per_doc", fv_never, F_RANK}, {"data_1", fv_never, F_RANK}, {"data_2", fv_never, F_RANK},
    {"mm_processor_kwargs", fv_none, F_RANK}, {"use_activation", fv_never, F_RANK},
    {"softmax", fv_never, F_RANK}, {"activation", fv_never, F_RANK}, {"chat_template", fv_never, F_RANK},
};

/* A field name no table knows: ignored, as vLLM does, and said once on stderr (the first SRV_MAX_UNKNOWN
 * names: a client cannot grow the list without end). */
static void log_unknown_field(srv_state *S, const char *key) {
    ptrdiff_t m = 0;
    pthread_mutex_lock(&S->job_lock); /* the workers share the list */
    while (m < arrlen(S->unknown_fields) && strcmp(S->unknown_fields[m], key)) m++;
    int logged = m < arrlen(S->unknown_fields) || m >= SRV_MAX_UNKNOWN;
    char *copy = logged ? NULL : strdup(key);
    if (copy) arrput(S->unknown_fields, copy);
    pthread_mutex_unlock(&S->job_lock);
    if (logged) return;
    sbuf b = {0};
    sb_json_str(&b, key, strnlen(key, 80));  /* quoted and escaped: the log stays one line */
    fprintf(stderr, "llm serve: ignoring unknown request field %s\n", b.s ? b.s : "");
    sb_free(&b);
}

/* The first field of body that table (n rows) refuses: its index in body, its row in *rule; -1 if none. A
 * name no row has (no row of this endpoint's, when mask is not 0) is ignored, as vLLM does, and logged. */
static int refused_field(srv_state *S, const llm_json *body, const srv_field *table, size_t n, int mask,
                         const srv_field **rule) {
    for (int i = 0; i < body->n; i++) {
        size_t k = 0;
        while (k < n && (strcmp(table[k].name, body->keys[i]) || (mask && !(table[k].endpoints & mask)))) k++;
        if (k == n) { log_unknown_field(S, body->keys[i]); continue; }
        if (body->items[i].type != LLM_JSON_NULL && !table[k].takes(&body->items[i], body)) {
            *rule = &table[k];
            return i;
        }
    }
    return -1;
}

/* Each field of the body against a table of OpenAI's shape (req_fields for endpoint mask, resp_fields): a
 * refused one is a 400 naming it */
static int check_fields(srv_state *S, const llm_json *body, const srv_field *table, size_t n, int mask,
                        srv_error *e) {
    const srv_field *rule;
    int i = refused_field(S, body, table, n, mask, &rule);
    if (i < 0) return 0;
    return bad(e, 400, body->keys[i], "%s is not supported by this server (only %s is accepted)",
               body->keys[i], rule->takes == fv_never ? "null" : "null or its default value");
}

static int tokenize_text(srv_state *S, const char *text, size_t len, int add_special, int32_t **ids);

/* The grammar a field asked for (r->grammar, or NULL with why in err), parsed now (on the worker that reads
 * the request) through the engine's cache, and kept for the engine (r->grammar_parsed): what its limits
 * refuse (rules, nesting, the matcher's stacks at the start) is a 400 naming the field, not an engine error
 * naming none */
static int structured_check(srv_state *S, srv_req *r, const char *param, const char *err, srv_error *e) {
    char why[LLM_ERR_LEN];
    if (r->grammar && !(r->grammar_parsed = llm_engine_parse_grammar(S->engine, r->grammar, why))) {
        free(r->grammar); r->grammar = NULL; err = why;
    }
    return r->grammar ? 0 : bad(e, 400, param, "%s: %s", param, err);
}

/* A JSON Schema (an object, true, or the JSON text of one; NULL: any object, json_object's) as r->grammar */
static int structured_schema(srv_state *S, srv_req *r, const llm_json *schema, const char *param,
                             srv_error *e) {
    char err[LLM_ERR_LEN], *key = (char *)"type";
    llm_json parsed, object = {LLM_JSON_STRING, 0, (char *)"object", 6, NULL, NULL, 0};
    llm_json any_object = {LLM_JSON_OBJECT, 0, NULL, 0, &object, &key, 1};
    int own = 0;
    if (!schema) schema = &any_object; /* json_object */
    if (schema->type == LLM_JSON_STRING) { /* vLLM takes the schema as JSON text too */
        if (llm_json_parse(schema->str, schema->len, &parsed, err) != 0)
            return bad(e, 400, param, "%s is a string that is not JSON: %s", param, err);
        schema = &parsed;
        own = 1;
    }
    if (schema->type == LLM_JSON_OBJECT || schema->type == LLM_JSON_TRUE)
        r->grammar = llm_json_schema_to_grammar(schema, err);
    else snprintf(err, sizeof err, "a JSON Schema must be an object");
    if (own) llm_json_free(&parsed);
    return structured_check(S, r, param, err, e);
}

/* A regular expression (a string without NUL) as r->grammar: the whole output must match it */
static int structured_regex(srv_state *S, srv_req *r, const llm_json *v, const char *param,
                            srv_error *e) {
    char err[LLM_ERR_LEN];
    if (v->type != LLM_JSON_STRING || strlen(v->str) != v->len)
        return bad(e, 400, param, "%s must be a string (a regular expression)", param);
    r->grammar = llm_regex_to_grammar(v->str, err);
    return structured_check(S, r, param, err, e);
}

/* A non-empty list of strings as r->grammar: the output is exactly one of them */
static int structured_choice(srv_state *S, srv_req *r, const llm_json *v, const char *param,
                             srv_error *e) {
    char err[LLM_ERR_LEN];
    const char **choices = v->type == LLM_JSON_ARRAY && v->n > 0 ?
                           (const char **)calloc((size_t)v->n, sizeof(char *)) : NULL;
    for (int i = 0; choices && i < v->n; i++) {
        if (v->items[i].type != LLM_JSON_STRING || strlen(v->items[i].str) != v->items[i].len) {
            free(choices);
            return bad(e, 400, param, "%s must be a list of strings", param);
        }
        choices[i] = v->items[i].str;
    }
    if (!choices) return bad(e, 400, param, "%s must be a non-empty list of strings", param);
    r->grammar = llm_choice_to_grammar(choices, v->n, err);
    free(choices);
    return structured_check(S, r, param, err, e);
}

/* A GBNF grammar given as it is, copied into r->grammar (structured_check parses it) */
static int structured_grammar(srv_state *S, srv_req *r, const llm_json *v, const char *param,
                              srv_error *e) {
    if (v->type != LLM_JSON_STRING || strlen(v->str) != v->len)
        return bad(e, 400, param, "%s must be a string (a GBNF grammar)", param);
    if (!(r->grammar = strdup(v->str))) return bad(e, 500, NULL, "out of memory");
    return structured_check(S, r, param, "", e);
}

/* Structured output: the one field that asks for it, as GBNF in r->grammar. OpenAI's response_format
 * (json_object, json_schema), vLLM's structured_outputs {json | regex | choice | grammar | json_object} and
 * its older guided_json, guided_regex, guided_choice and guided_grammar, llama.cpp's grammar and json_schema.
 * A schema the converter cannot honour is a 400 naming the field and the keyword. A second
 * field that asks for a form too is refused (STRUCTURED_ONE), rather than one of them silently ignored.
 * Every form ends in one of four converters (structured_schema, _regex, _choice, _grammar), each of which
 * writes r->grammar and has structured_check parse it here, on the worker: the grammar's limits are met or
 * the request is refused before the engine sees it, and the engine gets r->grammar_parsed, ready. */
static int parse_structured(srv_state *S, const llm_json *body, srv_req *r, srv_error *e) {
    const char *given = NULL; /* the field that asked first: a second one is refused */
    const llm_json *v;
#define STRUCTURED_ONE(name) do { \
        if (given) \
            return bad(e, 400, name, "%s and %s both ask for structured output: give one", given, name); \
        given = name; \
    } while (0)
    /* 1. OpenAI's response_format: text (nothing asked), json_object, or json_schema with its schema */
    if ((v = llm_json_get(body, "response_format")) && v->type != LLM_JSON_NULL) {
        const llm_json *type = llm_json_get(v, "type");
        if (v->type != LLM_JSON_OBJECT || !type || type->type != LLM_JSON_STRING)
            return bad(e, 400, "response_format", "response_format must be an object with a type (text, "
                       "json_object or json_schema)");
        if (!strcmp(type->str, "json_object")) {
            STRUCTURED_ONE("response_format");
            if (structured_schema(S, r, NULL, "response_format", e)) return -1;
        } else if (!strcmp(type->str, "json_schema")) {
            const llm_json *js = llm_json_get(v, "json_schema");
            if (!js || js->type != LLM_JSON_OBJECT)
                return bad(e, 400, "response_format.json_schema",
                           "response_format.json_schema must be an object "
                           "with the schema");
            const llm_json *name = llm_json_get(js, "name"), *strict = llm_json_get(js, "strict");
            if (name && name->type != LLM_JSON_STRING)
                return bad(e, 400, "response_format.json_schema.name",
                           "response_format.json_schema.name must be "
                           "a string");
            if (strict && strict->type != LLM_JSON_TRUE && strict->type != LLM_JSON_FALSE &&
                strict->type != LLM_JSON_NULL)
                return bad(e, 400, "response_format.json_schema.strict",
                           "response_format.json_schema.strict must be "
                           "a boolean");
            STRUCTURED_ONE("response_format");
            const llm_json *schema = llm_json_get(js, "schema");
            if (structured_schema(S, r, schema && schema->type != LLM_JSON_NULL ? schema : NULL,
                                  "response_format.json_schema.schema", e)) return -1;
        } else if (strcmp(type->str, "text"))
            return bad(e, 400, "response_format.type", "response_format.type must be text, json_object or "
                       "json_schema, not \"%.40s\"", type->str);
    }
    /* 2. vLLM's structured_outputs: an object with one kind; its options that change the grammar and that
     * this converter has not are refused, not ignored */
    if ((v = llm_json_get(body, "structured_outputs")) && v->type != LLM_JSON_NULL) {
        if (v->type != LLM_JSON_OBJECT)
            return bad(e, 400, "structured_outputs", "structured_outputs must be an object");
        static const char *const refused[] = {"whitespace_pattern", "structural_tag",
                                              "disable_any_whitespace", "disable_additional_properties"};
        for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
            const llm_json *x = llm_json_get(v, refused[i]);
            if (x && x->type != LLM_JSON_NULL && x->type != LLM_JSON_FALSE)
                return bad(e, 400, "structured_outputs",
                           "structured_outputs.%s is not supported by this server", refused[i]);
        }
        /* each kind by its full name, which outlives the loop: a second one is named as given */
        static const char *const kinds[] = {"json", "regex", "choice", "grammar", "json_object"};
        static const char *const params[] = {"structured_outputs.json", "structured_outputs.regex",
            "structured_outputs.choice", "structured_outputs.grammar", "structured_outputs.json_object"};
        for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
            const llm_json *x = llm_json_get(v, kinds[i]);
            if (!x || x->type == LLM_JSON_NULL || (i == 4 && x->type == LLM_JSON_FALSE)) continue;
            const char *param = params[i];
            STRUCTURED_ONE(param);
            int rc = i == 0 ? structured_schema(S, r, x, param, e) :
                     i == 1 ? structured_regex(S, r, x, param, e) :
                     i == 2 ? structured_choice(S, r, x, param, e) :
                     i == 3 ? structured_grammar(S, r, x, param, e) :
                     x->type == LLM_JSON_TRUE ? structured_schema(S, r, NULL, param, e) :
                     bad(e, 400, param, "%s must be a boolean", param);
            if (rc) return -1;
        }
        if (!r->grammar)
            return bad(e, 400, "structured_outputs", "structured_outputs needs one of json, regex, "
                                    "choice, grammar or json_object");
    }
    /* 3. the top-level fields of vLLM's older API and llama.cpp's, each a kind as in step 2 */
    static const struct { const char *name; int kind; } fields[] = { /* vLLM's older names, llama.cpp's */
        {"guided_json", 0}, {"guided_regex", 1}, {"guided_choice", 2}, {"guided_grammar", 3},
        {"json_schema", 0}, {"grammar", 3}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        if (!(v = llm_json_get(body, fields[i].name)) || v->type == LLM_JSON_NULL) continue;
        STRUCTURED_ONE(fields[i].name);
        int k = fields[i].kind;
        const char *name = fields[i].name;
        int rc = k == 0 ? structured_schema(S, r, v, name, e) : k == 1 ? structured_regex(S, r, v, name, e) :
                 k == 2 ? structured_choice(S, r, v, name, e) : structured_grammar(S, r, v, name, e);
        if (rc) return -1;
    }
    if ((v = llm_json_get(body, "guided_decoding_backend")) && v->type != LLM_JSON_NULL &&
        v->type != LLM_JSON_STRING)
        return bad(e, 400, "guided_decoding_backend", "guided_decoding_backend must be a string");
#undef STRUCTURED_ONE
    return 0;
}

/* The sampling fields both endpoints share (vLLM's extras included), into p and r. p starts as the server's
 * defaults (S->defaults: the model file's general.sampling.* over OpenAI's) and each field given replaces one
 * value, checked first: a number within its range, a list within its bound (SRV_MAX_STOPS), a token id below
 * the vocabulary's size. Strings are not copied: r->stops and p->cache_salt point into the body's JSON, which
 * the job keeps until attach_generation has added the request (llm_engine_add_request copies what it keeps);
 * the id lists go into r's stb_ds arrays, which prepare_generation points p at. Returns 0, or -1 with e
 * naming the field. */
/* vLLM's truncate_prompt_tokens into r: K >= 1, or -1 for the context's length; 0 stays "not given" */
static int parse_truncation(srv_state *S, const llm_json *body, srv_req *r, srv_error *e) {
    double x = 0;
    if (get_number(body, "truncate_prompt_tokens", -1, 1 << 30, 1, &x, e)) return -1;
    const llm_json *tpt = llm_json_get(body, "truncate_prompt_tokens");
    if (x == 0 && tpt && tpt->type != LLM_JSON_NULL)
        return bad(e, 400, "truncate_prompt_tokens", "truncate_prompt_tokens must be -1 or at least 1");
    if (x > S->max_model_len)
        return bad(e, 400, "truncate_prompt_tokens", "truncate_prompt_tokens value (%d) is greater than "
                   "max_model_len (%d). Please, select a smaller truncation size.", (int)x, S->max_model_len);
    r->truncate_prompt_tokens = x < 0 ? S->max_model_len : (int)x;
    return 0;
}

static int parse_sampling(srv_state *S, const llm_json *body, srv_req *r,
                          llm_sampling_params *p, srv_error *e) {
    double x;
    /* 1. every field known, and an unimplemented one asking for nothing (check_fields) */
    if (check_fields(S, body, req_fields, sizeof req_fields / sizeof *req_fields, 1 << r->kind, e)) return -1;
    /* 2. the numbers of sampling, each over its default: x holds the default, get_number replaces it */
    *p = S->defaults;
    x = p->temperature;
    if (get_number(body, "temperature", 0, 100, 0, &x, e)) return -1;
    p->temperature = (float)x;
    x = p->top_p;
    if (get_number(body, "top_p", 0, 1, 0, &x, e)) return -1;
    if (!(x > 0)) return bad(e, 400, "top_p", "top_p must be in (0, 1], got %g", x);
    p->top_p = (float)x;
    x = p->top_k;
    if (get_number(body, "top_k", -1, 1 << 30, 1, &x, e)) return -1;
    p->top_k = x < 0 ? 0 : (int)x; /* vLLM: -1 (or 0) turns it off */
    x = p->min_p;
    if (get_number(body, "min_p", 0, 1, 0, &x, e)) return -1;
    p->min_p = (float)x;
    x = p->presence_penalty;
    if (get_number(body, "presence_penalty", -2, 2, 0, &x, e)) return -1;
    p->presence_penalty = (float)x;
    x = p->frequency_penalty;
    if (get_number(body, "frequency_penalty", -2, 2, 0, &x, e)) return -1;
    p->frequency_penalty = (float)x;
    x = p->repetition_penalty;
    if (get_number(body, "repetition_penalty", 0, 100, 0, &x, e)) return -1;
    if (!(x > 0)) return bad(e, 400, "repetition_penalty", "repetition_penalty must be > 0");
    p->repetition_penalty = (float)x;
    x = 1;
    if (get_number(body, "n", 1, 128, 1, &x, e)) return -1;
    p->n = r->n = (int)x;
    x = -1;
    if (get_number(body, "seed", -9007199254740991.0, 9007199254740991.0, 1, &x, e)) return -1;
    p->seed = x < 0 ? -1 : (int64_t)x;
    x = 0;
    if (get_number(body, "min_tokens", 0, 1 << 30, 1, &x, e)) return -1;
    p->min_tokens = (int)x;
    /* 3. the switches, and vLLM's scheduling and prompt options (priority, special tokens, truncation,
     * the prefix cache's salt) */
    if (get_bool(body, "ignore_eos", &p->ignore_eos, e)) return -1;
    if (get_bool(body, "include_stop_str_in_output", &p->include_stop_str, e)) return -1;
    x = 0; /* vLLM's: lower first, under --scheduling-policy priority; else only 0 */
    if (get_number(body, "priority", -(double)(1 << 30), 1 << 30, 1, &x, e)) return -1;
    if (x != 0 && S->scheduling_policy != LLM_SCHED_PRIORITY)
        return bad(e, 400, "priority", "priority is not supported by this server unless it runs with "
                   "--scheduling-policy priority (only 0 is accepted)");
    p->priority = (int)x;
    if (get_bool(body, "return_tokens_as_token_ids", &r->tokens_as_ids, e)) return -1;
    int special = r->kind == REQ_COMPLETIONS; /* vLLM's defaults: BOS for a completion; none added to a chat's
                                                * template (ours gets it as the vocabulary asks, once) */
    if (get_bool(body, "add_special_tokens", &special, e)) return -1;
    r->add_special = r->kind == REQ_CHAT ? (special ? 2 : 1) : special;
    if (parse_truncation(S, body, r, e)) return -1;
    const llm_json *salt = llm_json_get(body, "cache_salt"); /* hashed by add_request: the body may go */
    if (salt && salt->type != LLM_JSON_NULL) {
        if (salt->type != LLM_JSON_STRING || !salt->len || strlen(salt->str) != salt->len)
            return bad(e, 400, "cache_salt", "cache_salt must be a non-empty string with no NUL character");
        p->cache_salt = salt->str;
    }
    /* OpenAI's cache-routing hint: checked, never used here (the prefix cache finds every shared prefix
     * by itself); deploy/haproxy.cfg hashes on it, so one key's requests meet their prefix on one replica */
    const llm_json *pck = llm_json_get(body, "prompt_cache_key");
    if (pck && pck->type != LLM_JSON_NULL &&
        (pck->type != LLM_JSON_STRING || pck->len > SRV_MAX_CACHE_KEY))
        return bad(e, 400, "prompt_cache_key", "prompt_cache_key must be a string of at most %d bytes",
                   SRV_MAX_CACHE_KEY);
    int skip = 1;
    if (get_bool(body, "skip_special_tokens", &skip, e)) return -1;
    p->special_text = !skip;
    /* 4. where to stop: strings (empty ones dropped: they would match everywhere), then token ids */
    /* stop: a string or a list of strings */
    const llm_json *stop = llm_json_get(body, "stop");
    if (stop && stop->type == LLM_JSON_STRING) { if (stop->len) r->stops[r->n_stops++] = stop->str; }
    else if (stop && stop->type == LLM_JSON_ARRAY) {
        if (stop->n > SRV_MAX_STOPS) return bad(e, 400, "stop", "at most %d stop strings", SRV_MAX_STOPS);
        for (int i = 0; i < stop->n; i++) {
            if (stop->items[i].type != LLM_JSON_STRING) return bad(e, 400, "stop", "stop must be strings");
            if (stop->items[i].len) r->stops[r->n_stops++] = stop->items[i].str;
        }
    } else if (stop && stop->type != LLM_JSON_NULL)
        return bad(e, 400, "stop", "stop must be a string or a list");
    p->stop = (const char *const *)r->stops; p->n_stop = r->n_stops;
    const llm_json *ids = llm_json_get(body, "stop_token_ids");
    if (ids && ids->type == LLM_JSON_ARRAY) {
        for (int i = 0; i < ids->n; i++) {
            const llm_json *v = &ids->items[i];
            if (!is_token_id(S, v))
                return bad(e, 400, "stop_token_ids", "stop_token_ids must be token ids (0..%d)",
                           S->model->cfg.vocab_size - 1);
            arrput(r->stop_ids, (int32_t)v->num);
        }
    } else if (ids && ids->type != LLM_JSON_NULL)
        return bad(e, 400, "stop_token_ids", "stop_token_ids must be a list");
    /* 5. what may be sampled: biases, an allow-list, banned words (each a token sequence) */
    /* OpenAI's logit_bias: {"token id": bias in [-100, 100]}, the ids written as decimal strings */
    const llm_json *lb = llm_json_get(body, "logit_bias");
    if (lb && lb->type == LLM_JSON_OBJECT) {
        for (int i = 0; i < lb->n; i++) {
            const char *key = lb->keys[i];
            char *end;
            long id = strtol(key, &end, 10);
            if (!*key || *end || !isdigit((unsigned char)*key) || id >= S->model->cfg.vocab_size)
                return bad(e, 400, "logit_bias", "logit_bias keys must be token ids (0..%d), got \"%.40s\"",
                           S->model->cfg.vocab_size - 1, key);
            const llm_json *v = &lb->items[i];
            if (v->type != LLM_JSON_NUMBER || !(fabs(v->num) <= 100))
                return bad(e, 400, "logit_bias", "logit_bias values must be numbers in [-100, 100]");
            arrput(r->bias_ids, (int32_t)id); arrput(r->bias, (float)v->num);
        }
    } else if (lb && lb->type != LLM_JSON_NULL)
        return bad(e, 400, "logit_bias", "logit_bias must be an object of token ids to biases");
    const llm_json *allowed = llm_json_get(body, "allowed_token_ids"); /* vLLM's: only these may be sampled */
    if (allowed && allowed->type != LLM_JSON_NULL) {
        for (int i = 0; allowed->type == LLM_JSON_ARRAY && i < allowed->n &&
             is_token_id(S, &allowed->items[i]); i++)
            arrput(r->allowed_ids, (int32_t)allowed->items[i].num);
        if (allowed->type != LLM_JSON_ARRAY || allowed->n == 0 || arrlen(r->allowed_ids) != allowed->n)
            return bad(e, 400, "allowed_token_ids", "allowed_token_ids must be a non-empty list of token ids "
                       "(0..%d)", S->model->cfg.vocab_size - 1);
    }
    /* vLLM's bad_words: each word's tokens, as it starts the text and after a space (as vLLM tokenizes it) */
    const llm_json *words = llm_json_get(body, "bad_words");
    if (words && words->type != LLM_JSON_NULL) {
        if (words->type != LLM_JSON_ARRAY)
            return bad(e, 400, "bad_words", "bad_words must be a list of strings");
        if (!S->model->tok) return bad(e, 400, "bad_words", "bad_words needs a model with a tokenizer");
        for (int i = 0; i < words->n; i++) {
            const llm_json *w = &words->items[i];
            size_t skip = 0;
            while (w->type == LLM_JSON_STRING && skip < w->len && isspace((unsigned char)w->str[skip]))
                skip++;
            if (w->type != LLM_JSON_STRING || skip == w->len)
                return bad(e, 400, "bad_words", "bad_words must be a list of strings with a word in each");
            for (int space = 0; space < 2; space++) {
                sbuf text = {0};
                int32_t *ids = NULL;
                if (space) sb_puts(&text, " ");
                sb_put(&text, w->str + skip, w->len - skip);
                int failed = !text.s || text.failed || tokenize_text(S, text.s, text.len, 0, &ids) != 0 ||
                             arrlen(ids) == 0;
                for (ptrdiff_t k = 0; !failed && k < arrlen(ids); k++) arrput(r->bad_ids, ids[k]);
                if (!failed) arrput(r->bad_lens, (int32_t)arrlen(ids));
                sb_free(&text); arrfree(ids);
                if (failed) return bad(e, 400, "bad_words", "bad_words[%d] could not be tokenized", i);
            }
        }
    }
    /* 6. how the answer comes back: streamed or whole, with usage, with the prompt's logprobs */
    const llm_json *so = llm_json_get(body, "stream_options");
    if (so && so->type == LLM_JSON_OBJECT && get_bool(so, "include_usage", &r->include_usage, e)) return -1;
    if (so && so->type == LLM_JSON_OBJECT && get_bool(so, "continuous_usage_stats", &r->continuous_usage, e))
        return -1;
    r->continuous_usage &= r->include_usage; /* as vLLM: only with include_usage */
    if (so && so->type != LLM_JSON_OBJECT && so->type != LLM_JSON_NULL)
        return bad(e, 400, "stream_options", "stream_options must be an object");
    if (get_bool(body, "stream", &r->stream, e)) return -1;
    x = -1;
    if (get_number(body, "prompt_logprobs", 0, 20, 1, &x, e)) return -1;
    p->prompt_logprobs = r->prompt_logprobs = (int)x;
    /* 7. a structured output, as a grammar parsed now */
    return parse_structured(S, body, r, e);
}

/* "model", when given, must be the one served */
static int check_model(srv_state *S, const llm_json *body, srv_error *e) {
    const llm_json *m = llm_json_get(body, "model");
    if (!m || m->type == LLM_JSON_NULL) return 0;
    if (m->type != LLM_JSON_STRING) return bad(e, 400, "model", "model must be a string");
    if (strcmp(m->str, S->model_name) != 0)
        return bad(e, 404, "model", "The model `%s` does not exist (this server serves `%s`)", m->str,
                   S->model_name);
    return 0;
}

/* Text to a prompt's ids, in *ids (stb_ds). add_special: 0 no BOS; 1 BOS as the vocabulary asks, unless the
 * text begins with it (a chat template's); 2 the vocabulary's BOS in front whatever the text (vLLM's
 * add_special_tokens on a chat, which HF's tokenizer adds before the template's own). */
static int tokenize_text(srv_state *S, const char *text, size_t len, int add_special, int32_t **ids) {
    if (len > (size_t)INT32_MAX / 2) return -1;
    int cap = (int)len + 8;
    arrsetlen(*ids, cap);
    const llm_tokenizer *tok = S->model->tok;
    int bos = add_special == 2 && llm_tokenizer_adds_bos(tok);
    int n = add_special == 1 ? llm_tokenize_prompt(tok, text, len, *ids, cap)
                             : llm_tokenize(tok, text, len, bos, 1, *ids, cap);
    arrsetlen(*ids, n > 0 ? n : 0);
    return n < 0 ? -1 : 0;
}

/* The message text of a chat message: a string, or a list of {"type": "text", "text": ...} parts. */
static int chat_content(const llm_json *m, int i, sbuf *out, srv_error *e) {
    const llm_json *c = llm_json_get(m, "content");
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (!c || c->type == LLM_JSON_NULL) return 0;
    if (c->type == LLM_JSON_STRING) { sb_put(out, c->str, c->len); return 0; }
    if (c->type != LLM_JSON_ARRAY) return bad(e, 400, param, "%s must be a string or a list of parts", param);
    for (int k = 0; k < c->n; k++) {
        const llm_json *part = &c->items[k], *type = llm_json_get(part, "type"),
            *text = llm_json_get(part, "text");
        if (!type || type->type != LLM_JSON_STRING || strcmp(type->str, "text") || !text ||
            text->type != LLM_JSON_STRING)
            return bad(e, 400, param, "%s: only {\"type\": \"text\", \"text\": ...} parts are supported",
                       param);
        if (k) sb_puts(out, "\n");
        sb_put(out, text->str, text->len);
    }
    return 0;
}

/* A tool call of an assistant message: {"id", "type": "function", "function": {"name", "arguments"}}, its
 * arguments a JSON object given as text (OpenAI's way) or as the object */
static int chat_tool_call(const llm_json *tc, int i, int k, llm_chat_tool_call *out,
                          sbuf *args, srv_error *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].tool_calls[%d]", i, k);
    const llm_json *id = llm_json_get(tc, "id"), *type = llm_json_get(tc, "type");
    const llm_json *fn = llm_json_get(tc, "function");
    const llm_json *name = llm_json_get(fn, "name"), *a = llm_json_get(fn, "arguments");
    if (tc->type != LLM_JSON_OBJECT || !fn || fn->type != LLM_JSON_OBJECT ||
        (type && type->type != LLM_JSON_NULL && !fv_str(type, "function")))
        return bad(e, 400, param, "%s must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                   "\"arguments\"}}", param);
    if (id && id->type != LLM_JSON_STRING && id->type != LLM_JSON_NULL)
        return bad(e, 400, param, "%s.id must be a string", param);
    if (!name || name->type != LLM_JSON_STRING)
        return bad(e, 400, param, "%s.function.name must be a string", param);
    llm_json parsed;
    const llm_json *obj = a;
    if (a && a->type == LLM_JSON_STRING) {
        if (llm_json_parse(a->str, a->len, &parsed, NULL) != 0) obj = NULL;
        else { obj = parsed.type == LLM_JSON_OBJECT ? a : NULL; llm_json_free(&parsed); }
        if (obj) sb_put(args, a->str, a->len);
    } else if (a && a->type == LLM_JSON_OBJECT) {
        char *text = llm_json_dumps(a, 0);
        if (text) sb_puts(args, text);
        free(text);
    } else obj = NULL;
    if (!obj) return bad(e, 400, param, "%s.function.arguments must be a JSON object (as text)", param);
    out->id = id && id->type == LLM_JSON_STRING ? id->str : NULL;
    out->name = name->str;
    return 0;
}

/* n letters and digits drawn from the hash h into out (n + 1 bytes) */
static void put_id_chars(char *out, int n, uint64_t h) {
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    for (int i = 0; i < n; i++) { h ^= h >> 29; h *= 0xbf58476d1ce4e5b9ull; out[i] = digits[h % 62]; }
    out[n] = 0;
}

/* A call's id as Mistral's templates take it: 9 letters and digits (the id itself when it is so already) */
static const char *mistral_call_id(const char *id, char out[10]) {
    size_t n = strlen(id);
    int plain = n == 9;
    for (size_t i = 0; plain && i < n; i++) plain = isalnum((unsigned char)id[i]) != 0;
    if (plain) return id;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    put_id_chars(out, 9, h);
    return out;
}

/* A chat request's prompt: the messages (and tools) written with the template, in *text (malloc'ed, *len
 * bytes), with the request's thinking, tool and reasoning settings in r (r->chat, r->grammar for the tool
 * call, r->tool_calls, r->reasoning). /tokenize reads it the same way.
 * The template is rendered twice, as snprintf is called: once with no buffer to learn the length, then into
 * a buffer of that size. The llm_chat_message array points into the body's JSON and into texts (a message's
 * content parts joined, a call's arguments written as JSON text), all freed before return; only *text
 * outlives the call. On an error *text is NULL and e names the field (messages[i].role and the like). */
static int chat_prompt(srv_state *S, const llm_json *body, srv_req *r, char **text, int *len, srv_error *e) {
    /* 1. the template's switches: enable_thinking, reasoning_effort, and how the prompt ends */
    r->chat = S->chat;
    llm_chat_template_set_today(&r->chat, (int64_t)time(NULL)); /* today's, not the start's */
    const llm_json *v = llm_json_get(body, "chat_template_kwargs");
    if (v && v->type != LLM_JSON_NULL && v->type != LLM_JSON_OBJECT)
        return bad(e, 400, "chat_template_kwargs", "chat_template_kwargs must be an object");
    const llm_json *think = llm_json_get(v, "enable_thinking");
    if (think && think->type != LLM_JSON_NULL && think->type != LLM_JSON_TRUE &&
        think->type != LLM_JSON_FALSE)
        return bad(e, 400, "chat_template_kwargs",
                   "chat_template_kwargs.enable_thinking must be true or false");
    if (think && think->type != LLM_JSON_NULL) r->chat.enable_thinking = think->type == LLM_JSON_TRUE;
    if ((v = llm_json_get(body, "reasoning_effort")) && v->type != LLM_JSON_NULL) {
        static const char *const efforts[] = {"none", "minimal", "low", "medium", "high"};
        size_t k = 0;
        while (k < 5 && !fv_str(v, efforts[k])) k++;
        if (k == 5)
            return bad(e, 400, "reasoning_effort",
                       "reasoning_effort must be none, minimal, low, medium or high");
        if (k == 0) r->chat.enable_thinking = 0; /* the others: thinking as the template has it */
        /* gpt-oss's system message says low, medium or high (none and minimal: its least, low) */
        snprintf(r->chat.reasoning_effort, sizeof r->chat.reasoning_effort, "%s", k < 2 ? "low" : efforts[k]);
    }
    int gen = 1, cont = 0, include_reasoning = 1, parallel = 1;
    if (get_bool(body, "add_generation_prompt", &gen, e) ||
        get_bool(body, "continue_final_message", &cont, e) ||
        get_bool(body, "include_reasoning", &include_reasoning, e) ||
        get_bool(body, "parallel_tool_calls", &parallel, e))
        return -1;
    if (gen && cont)
        return bad(e, 400, "continue_final_message",
                   "continue_final_message and add_generation_prompt cannot "
                   "both be true: set add_generation_prompt to false to continue the last message");
    /* 2. the tools, each checked, and which may be called (tool_choice) */
    const llm_json *tools = llm_json_get(body, "tools"), *choice = llm_json_get(body, "tool_choice");
    if (tools && tools->type == LLM_JSON_NULL) tools = NULL;
    if (tools && tools->type != LLM_JSON_ARRAY) return bad(e, 400, "tools", "tools must be a list");
    for (int i = 0; tools && i < tools->n; i++) {
        const llm_json *t = &tools->items[i], *fn = llm_json_get(t, "function");
        const llm_json *name = llm_json_get(fn, "name"), *params = llm_json_get(fn, "parameters");
        char param[48];
        snprintf(param, sizeof param, "tools[%d]", i);
        if (t->type != LLM_JSON_OBJECT || !fv_str(llm_json_get(t, "type"), "function") || !fn ||
            fn->type != LLM_JSON_OBJECT)
            return bad(e, 400, param, "%s must be {\"type\": \"function\", \"function\": {\"name\", "
                       "\"description\", \"parameters\"}}", param);
        if (!name || name->type != LLM_JSON_STRING || !name->len)
            return bad(e, 400, param, "%s.function.name must be a non-empty string", param);
        if (params && params->type != LLM_JSON_NULL && params->type != LLM_JSON_OBJECT)
            return bad(e, 400, param, "%s.function.parameters must be a JSON Schema (an object)", param);
    }
    int n_tools = tools ? tools->n : 0, mode = n_tools ? LLM_TOOL_AUTO : -1;
    const char *named = NULL;
    if (choice && choice->type != LLM_JSON_NULL) {
        const llm_json *fn = llm_json_get(choice, "function"), *nm = llm_json_get(fn, "name");
        if (fv_str(choice, "none")) mode = -1;
        else if (fv_str(choice, "auto")) mode = n_tools ? LLM_TOOL_AUTO : -1;
        else if (fv_str(choice, "required")) mode = LLM_TOOL_REQUIRED;
        else if (choice->type == LLM_JSON_OBJECT && fv_str(llm_json_get(choice, "type"), "function") && nm &&
                 nm->type == LLM_JSON_STRING) { mode = LLM_TOOL_NAMED; named = nm->str; }
        else return bad(e, 400, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (mode >= LLM_TOOL_REQUIRED && !n_tools)
            return bad(e, 400, "tool_choice", "tool_choice asks for a tool call but tools names none");
        int found = mode != LLM_TOOL_NAMED;
        for (int i = 0; !found && i < n_tools; i++)
            found = fv_str(llm_json_get(llm_json_get(&tools->items[i], "function"), "name"), named);
        if (!found)
            return bad(e, 400, "tool_choice", "tool_choice names the function "
                                              "\"%.64s\", which is not in tools",
                       named);
    }
    char *tools_text = n_tools ? llm_json_dumps(tools, 0) : NULL;
    if (n_tools && !tools_text) return bad(e, 500, NULL, "out of memory");
    /* 3. the messages, into llm_chat_message: each role known, its content, its calls and their ids */
    const llm_json *msgs = llm_json_get(body, "messages");
    if (!msgs || msgs->type != LLM_JSON_ARRAY || msgs->n == 0) {
        free(tools_text);
        return bad(e, 400, "messages", "messages must be a non-empty list");
    }
    int n = msgs->n, ok = 1, total_calls = 0;
    for (int i = 0; i < n; i++) {
        const llm_json *tc = llm_json_get(&msgs->items[i], "tool_calls");
        if (tc && tc->type == LLM_JSON_ARRAY) total_calls += tc->n;
    }
    /* every call of every message is counted first, so that one allocation holds them all: the messages
     * point at slices of calls, and texts holds each message's content then each call's arguments */
    size_t n_msgs = (size_t)(unsigned)n, n_calls = (size_t)(unsigned)total_calls;
    llm_chat_message *cm = (llm_chat_message *)calloc(n_msgs, sizeof *cm);
    llm_chat_tool_call *calls = (llm_chat_tool_call *)calloc(n_calls + 1, sizeof *calls);
    sbuf *texts = (sbuf *)calloc(n_msgs + n_calls, sizeof(sbuf)); /* contents, then arguments */
    if (!cm || !calls || !texts) { ok = 0; bad(e, 500, NULL, "out of memory"); }
    for (int i = 0, c = 0; ok && i < n; i++) {
        const llm_json *m = &msgs->items[i], *role = llm_json_get(m, "role");
        char param[64];
        snprintf(param, sizeof param, "messages[%d].role", i);
        enum { ROLE_SYSTEM, ROLE_DEVELOPER, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL, N_ROLES };
        static const char *const roles[N_ROLES] = {
            [ROLE_SYSTEM] = "system", [ROLE_DEVELOPER] = "developer", [ROLE_USER] = "user",
            [ROLE_ASSISTANT] = "assistant", [ROLE_TOOL] = "tool",
        };
        int k = 0;
        while (k < N_ROLES && !fv_str(role, roles[k])) k++;
        if (m->type != LLM_JSON_OBJECT || k == N_ROLES) {
            ok = 0; bad(e, 400, param, "%s must be system, developer, user, assistant or tool", param);
            break;
        }
        if (chat_content(m, i, &texts[i], e)) { ok = 0; break; }
        cm[i].role = role->str; cm[i].content = texts[i].s ? texts[i].s : "";
        const llm_json *tc = llm_json_get(m, "tool_calls"), *rc = llm_json_get(m, "reasoning_content");
        if (!rc || rc->type == LLM_JSON_NULL) rc = llm_json_get(m, "reasoning");
        if (k == ROLE_ASSISTANT && rc && rc->type == LLM_JSON_STRING) cm[i].reasoning = rc->str;
        if (tc && tc->type != LLM_JSON_NULL) {
            snprintf(param, sizeof param, "messages[%d].tool_calls", i);
            if (k != ROLE_ASSISTANT || tc->type != LLM_JSON_ARRAY) {
                ok = 0; bad(e, 400, param, "%s must be a list, in an assistant message", param);
                break;
            }
            cm[i].tool_calls = calls + c; cm[i].n_tool_calls = tc->n;
            for (int j = 0; ok && j < tc->n; j++, c++) {
                sbuf *a = &texts[n + c];
                if (chat_tool_call(&tc->items[j], i, j, &calls[c], a, e)) ok = 0;
                else calls[c].arguments = a->s ? a->s : "{}";
            }
        }
        if (ok && k == ROLE_TOOL) { /* a tool's result answers an earlier call */
            const llm_json *id = llm_json_get(m, "tool_call_id");
            snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
            if (!id || id->type != LLM_JSON_STRING) {
                ok = 0; bad(e, 400, param, "%s must be the id of the tool call this message answers", param);
                break;
            }
            int found = 0;
            for (int j = 0; j < c && !found; j++) found = calls[j].id && !strcmp(calls[j].id, id->str);
            if (!found) {
                ok = 0; bad(e, 400, param, "%s: no earlier tool call has the id \"%.64s\"", param, id->str);
                break;
            }
            cm[i].tool_call_id = id->str;
        }
    }
    /* 4. Mistral's templates take only ids of 9 characters (and the model saw only such): any other id
     * becomes 9 letters and digits made from it, the same for a call and its result (as vLLM shortens
     * them) */
    char (*short_ids)[10] = ok && r->chat.call_id_len == 9 ?
                            (char (*)[10])calloc(n_msgs + n_calls, 10) : NULL;
    for (int i = 0, c = 0; short_ids && i < n; i++) {
        for (int j = 0; j < cm[i].n_tool_calls; j++, c++)
            if (calls[c].id) calls[c].id = mistral_call_id(calls[c].id, short_ids[n + c]);
        if (cm[i].tool_call_id) cm[i].tool_call_id = mistral_call_id(cm[i].tool_call_id, short_ids[i]);
    }
    if (ok && cont && strcmp(cm[n - 1].role, "assistant")) {
        ok = 0;
        bad(e, 400, "continue_final_message", "continue_final_message needs an assistant message last");
    }
    /* 5. the text: the length first, then the text itself into a buffer of that size. The rendered text's
     * bound, checked as it is written (before the malloc below): 8 bodies. Each message and tool written
     * once takes at most about 3x its bytes in the body (json.dumps's \uXXXX escapes); more comes only from
     * Mistral's templates, which write all the tools before each user message that repeats the last one: an
     * 8 MB body could render to gigabytes */
    r->chat.max_text = 8 * (size_t)SRV_MAX_BODY;
    int m = ok ? llm_chat_render(&r->chat, cm, n, tools_text, gen, NULL, 0) : -1;
    if (ok && m == -2) {
        ok = 0;
        bad(e, 400, "messages", "This model's maximum context length is %d tokens. However, the messages "
            "written with the chat template are over %d bytes. Please reduce the length of the messages "
            "or tools.", S->max_model_len, 8 * SRV_MAX_BODY);
    } else if (ok && m < 0) {
        ok = 0;
        bad(e, 400, "messages", "the messages could not be written with the chat template");
    }
    *text = ok ? (char *)malloc((size_t)m + 1) : NULL;
    if (ok && !*text) { ok = 0; bad(e, 500, NULL, "out of memory"); }
    if (ok) {
        llm_chat_render(&r->chat, cm, n, tools_text, gen, *text, m + 1);
        *len = m;
    }
    if (ok && cont) { /* as Hugging Face continues a message: the text up to its (stripped) content's end */
        const char *last = cm[n - 1].content;
        size_t a = 0, b = strlen(last);
        while (a < b && isspace((unsigned char)last[a])) a++;
        while (b > a && isspace((unsigned char)last[b - 1])) b--;
        char *at = NULL;
        for (char *p = *text; b > a && (p = strstr(p, last + a)) != NULL; p++)
            if (!strncmp(p, last + a, b - a)) at = p;
        if (b > a && at) *len = (int)(at - *text) + (int)(b - a);
        else if (b > a) {
            ok = 0;
            bad(e, 400, "continue_final_message", "the last message is not in the prompt");
        }
        if (ok) (*text)[*len] = 0;
    }
    /* the tool call's grammar */
    if (ok && mode >= 0) {
        char err[LLM_ERR_LEN];
        if (r->grammar) {
            ok = 0;
            bad(e, 400, "tools", "tools and a structured output field both ask for the "
                                 "reply's form: give one");
        } else {
            r->grammar = llm_chat_tool_grammar(&r->chat, tools_text, mode, named, parallel, err);
            if (structured_check(S, r, "tools", err, e)) ok = 0;
        }
        r->tool_calls = 1;
    }
    /* a structured output: the answer's form (gpt-oss writes its answer on the final channel, after its
     * thinking: the grammar holds that message, not the whole reply, as vLLM's reasoning-aware structured
     * outputs do) */
    if (ok && mode < 0 && r->grammar) {
        char err[LLM_ERR_LEN], *whole = llm_chat_answer_grammar(&r->chat, r->grammar, err);
        if (!whole) { ok = 0; bad(e, 500, NULL, "%s", err); }
        else { free(r->grammar); r->grammar = whole; }
    }
    r->reasoning = r->chat.thinks && !S->reasoning_format_none ? 1 + include_reasoning : 0;
    for (int i = 0; texts && i < n + total_calls; i++) sb_free(&texts[i]);
    free(texts); free(calls); free(cm); free(tools_text); free(short_ids);
    if (!ok) { free(*text); *text = NULL; }
    return ok ? 0 : -1;
}

/* ===========================================================================================================
 * Endpoints: a generation prepared (on a worker) and attached to the engine; /tokenize and /detokenize
 *
 * /v1/completions and /v1/chat/completions take two steps. prepare_generation, on a worker, does all that a
 * request's bytes can make costly: the fields checked, the prompts tokenized (a completion's: a string, a
 * list of strings, a list of ids, a list of lists; a chat's: the template's text), the context checked as
 * vLLM does, into an srv_req and its llm_sampling_params. attach_generation, on the network thread, adds its
 * prompts to the engine (cheap: ids and a grammar already parsed) and gives the request to its connection;
 * it is there because the queue's count, the connection and the list of live requests are that thread's.
 * ======================================================================================================== */
/* What echo shows of a prompt given as ids, or truncated: the text of its ids */
static int echo_ids_text(srv_state *S, srv_prompt *sp) {
    int n = (int)arrlen(sp->prompt_ids), m = llm_detokenize(S->model->tok, sp->prompt_ids, n, 0, NULL, 0);
    free(sp->echo_text);
    sp->echo_text = NULL;
    if (m < 0 || !(sp->echo_text = (char *)malloc((size_t)m + 1))) return -1;
    llm_detokenize(S->model->tok, sp->prompt_ids, n, 0, sp->echo_text, m + 1);
    return 0;
}

/* vLLM's truncate_prompt_tokens: only the last K tokens of each prompt (echo shows what is left).
 * It runs on the prompt's tokens, not its text, after tokenizing and before check_context, so a long prompt
 * cut to K tokens passes the context check; parse_sampling has made -1 mean max_model_len and 0 means off.
 * The first tokens go (the last ones are what the model continues); an echoed prompt's text is written
 * again from the tokens kept, so echo and logprobs' offsets show what the model was given. */
static int truncate_prompts(srv_state *S, srv_req *r, srv_error *e) {
    for (int i = 0; i < r->n_prompts && r->truncate_prompt_tokens; i++) {
        srv_prompt *sp = &r->prompts[i];
        int cut = (int)arrlen(sp->prompt_ids) - r->truncate_prompt_tokens;
        if (cut <= 0) continue;
        arrdeln(sp->prompt_ids, 0, cut);
        if (sp->echo_text && echo_ids_text(S, sp)) return bad(e, 500, NULL, "out of memory");
    }
    return 0;
}

/* The prompts of /v1/completions: a string, a list of strings, a list of ids, or a list of lists of ids,
 * each into an srv_prompt (its text tokenized, or its ids checked against the vocabulary); at most
 * SRV_MAX_PROMPTS of them, each a separate engine request whose choices share the response.
 * Which of the four shapes a prompt is, is read from its first item: a string or a list there makes it a
 * list of prompts; otherwise the whole value is one prompt (a string, or a list of ids: [] is one empty
 * prompt, refused as empty). Each item is then checked on its own, so a list that mixes shapes fails on
 * the first item that does not fit. The count is checked before the array of prompts is allocated; the
 * ids are bounded by the body's size (SRV_MAX_BODY), and each id must name a token of the vocabulary
 * (is_token_id) because the engine indexes its embedding table with it. */
static int completion_prompts(srv_state *S, const llm_json *prompt, const char *param, srv_req *r,
                              srv_error *e) {
    if (!prompt) return bad(e, 400, param, "%s is required", param);
    const llm_json *list = prompt;
    int n = 1, one = 1;
    if (prompt->type == LLM_JSON_ARRAY && prompt->n > 0 && (prompt->items[0].type == LLM_JSON_STRING ||
                                                     prompt->items[0].type == LLM_JSON_ARRAY)) {
        n = prompt->n; one = 0;
    } else if (prompt->type != LLM_JSON_STRING && prompt->type != LLM_JSON_ARRAY) {
        return bad(e, 400, param, "%s must be a string, a list of strings or a list of token ids", param);
    }
    if (n > SRV_MAX_PROMPTS)
        return bad(e, 400, param, "at most %d prompts in one request", SRV_MAX_PROMPTS);
    r->prompts = (srv_prompt *)calloc((size_t)n, sizeof(srv_prompt));
    if (!r->prompts) return bad(e, 500, NULL, "out of memory");
    r->n_prompts = n;
    for (int i = 0; i < n; i++) {
        const llm_json *p = one ? list : &list->items[i];
        srv_prompt *sp = &r->prompts[i];
        sp->req = r; sp->index = i;
        if (p->type == LLM_JSON_STRING) {
            if (tokenize_text(S, p->str, p->len, r->add_special, &sp->prompt_ids) != 0)
                return bad(e, 400, param, "the prompt could not be tokenized");
            if (r->echo && !(sp->echo_text = strdup(p->str))) return bad(e, 500, NULL, "out of memory");
        } else if (p->type == LLM_JSON_ARRAY) {
            for (int k = 0; k < p->n; k++) {
                const llm_json *t = &p->items[k];
                if (!is_token_id(S, t))
                    return bad(e, 400, param, "a prompt's token ids must be integers in 0..%d",
                               S->model->cfg.vocab_size - 1);
                arrput(sp->prompt_ids, (int32_t)t->num);
            }
            if (r->echo && echo_ids_text(S, sp)) return bad(e, 500, NULL, "out of memory");
        } else {
            return bad(e, 400, param, "%s must be a string, a list of strings or a list of token ids", param);
        }
        if (arrlen(sp->prompt_ids) == 0) return bad(e, 400, param, "the prompt is empty");
    }
    return 0;
}

/* The context check vLLM makes: prompt + max_tokens within max_model_len.
 * Two rules, for each prompt: the prompt alone must leave room for one token (n < max_model_len), and when
 * the request gave max_tokens, prompt + max_tokens must fit. A chat without max_tokens generates until the
 * context is full (max_tokens 0 for the engine), so only the first rule applies to it, and the message counts
 * the one token it needs. The message is vLLM's word for word: clients match on it to shorten a prompt. */
static int check_context(srv_state *S, srv_req *r, int max_tokens, int max_tokens_given, srv_error *e) {
    for (int i = 0; i < r->n_prompts; i++) {
        int n = (int)arrlen(r->prompts[i].prompt_ids);
        if (n >= S->max_model_len || (max_tokens_given && n + max_tokens > S->max_model_len))
            return bad(e, 400, r->kind == REQ_CHAT ? "messages" : "prompt",
                       "This model's maximum context length is %d tokens. However, you requested %d tokens "
                       "(%d in the %s, %d in the completion). Please reduce the length of the %s "
                       "or completion.",
                       S->max_model_len, n + (max_tokens_given ? max_tokens : 1), n,
                       r->kind == REQ_CHAT ? "messages" : "prompt", max_tokens_given ? max_tokens : 1,
                       r->kind == REQ_CHAT ? "messages" : "prompt");
    }
    return 0;
}

/* vLLM's echo on a chat: the reply's content begins with the last message's text when that message has the
 * reply's role (the assistant's; without add_generation_prompt, the last message's own) */
static int chat_echo(const llm_json *body, srv_req *r, srv_error *e) {
    int echo = 0, gen = 1;
    if (get_bool(body, "echo", &echo, e) || get_bool(body, "add_generation_prompt", &gen, e)) return -1;
    const llm_json *msgs = llm_json_get(body, "messages"), *last = &msgs->items[msgs->n - 1];
    if (!echo || (gen && !fv_str(llm_json_get(last, "role"), "assistant"))) return 0;
    sbuf t = {0};
    if (chat_content(last, msgs->n - 1, &t, e)) { sb_free(&t); return -1; }
    int failed = t.failed || !(r->chat_echo = strdup(t.s ? t.s : ""));
    sb_free(&t);
    return failed ? bad(e, 500, NULL, "out of memory") : 0;
}

/* A generation request, on a worker: its fields checked, its prompts rendered and tokenized, its grammar
 * written and parsed; into r and p, ready for the engine (attach_generation). -1 with the error in *e. */
static int prepare_generation(srv_state *S, const llm_json *body, int kind, const char *request_id,
                              srv_req *r, llm_sampling_params *p, srv_error *e) {
    r->kind = kind; r->logprobs = -1; r->created = (long long)wall_s();
    /* vLLM's ids: chatcmpl-{X-Request-Id}, cmpl-{X-Request-Id}; the n choices and the prompts of a list share
     * it, as they share the response (a tool call's id adds the choice's index) */
    snprintf(r->id, sizeof r->id, "%s-%s", kind == REQ_CHAT ? "chatcmpl" : "cmpl", request_id);
    double x;
    if (check_model(S, body, e) || parse_sampling(S, body, r, p, e)) return -1;
    int max_tokens = 16, given = 1;
    if (kind == REQ_COMPLETIONS) {
        if (get_bool(body, "echo", &r->echo, e)) return -1;
        x = 16;
        if (get_number(body, "max_tokens", r->echo ? 0 : 1, 1 << 30, 1, &x, e)) return -1; /* 0: scoring */
        const llm_json *mt = llm_json_get(body, "max_tokens");
        if (mt && mt->type == LLM_JSON_NUMBER) max_tokens = (int)x;
        r->score_only = r->echo && max_tokens == 0;
        x = -1;
        if (get_number(body, "logprobs", 0, 20, 1, &x, e)) return -1;
        r->logprobs = (int)x;
        p->logprobs = r->logprobs;
        if (r->echo && r->logprobs > p->prompt_logprobs) p->prompt_logprobs = r->logprobs; /* echo's prompt */
        if (completion_prompts(S, llm_json_get(body, "prompt"), "prompt", r, e)) return -1;
    } else {
        const llm_json *mt = llm_json_get(body, "max_completion_tokens");
        const char *key = mt && mt->type != LLM_JSON_NULL ? "max_completion_tokens" : "max_tokens";
        x = 0;
        if (get_number(body, key, 1, 1 << 30, 1, &x, e)) return -1;
        given = x > 0; max_tokens = (int)x;
        int want_logprobs = 0;
        if (get_bool(body, "logprobs", &want_logprobs, e)) return -1;
        x = 0;
        if (get_number(body, "top_logprobs", 0, 20, 1, &x, e)) return -1;
        if (x > 0 && !want_logprobs) /* as OpenAI and vLLM: top_logprobs asks for nothing without logprobs */
            return bad(e, 400, "top_logprobs", "when using top_logprobs, logprobs must be set to true");
        r->logprobs = want_logprobs ? 1 : -1; r->top_logprobs = (int)x;
        p->logprobs = want_logprobs ? r->top_logprobs : -1;
        char *text = NULL;
        int n = 0;
        if (chat_prompt(S, body, r, &text, &n, e) || chat_echo(body, r, e)) { free(text); return -1; }
        r->prompts = (srv_prompt *)calloc(1, sizeof(srv_prompt));
        int ok = 1;
        if (r->prompts) {
            r->n_prompts = 1; r->prompts[0].req = r;
            if (tokenize_text(S, text, (size_t)n, r->add_special, &r->prompts[0].prompt_ids) != 0)
                { bad(e, 400, "messages", "the conversation could not be tokenized"); ok = 0; }
        } else { bad(e, 500, NULL, "out of memory"); ok = 0; }
        free(text);
        if (!ok) return -1;
        int32_t stop_ids[8]; /* the template's end of turn */
        int k = llm_chat_stop_ids(&S->chat, S->model->tok, stop_ids, 8);
        for (int i = 0; i < k && i < 8; i++) arrput(r->stop_ids, stop_ids[i]);
        /* vLLM's thinking_token_budget (Anthropic's budget_tokens comes here too): the thinking cut after
         * that many tokens, the template's "</think>" forced (the engine's think_budget); a request that
         * does not think has nothing to cut */
        x = 0;
        if (get_number(body, "thinking_token_budget", 1, 1 << 30, 1, &x, e)) return -1;
        if (x > 0 && r->chat.thinks && r->chat.enable_thinking) {
            r->n_think_end = llm_chat_think_end_ids(&r->chat, S->model->tok, r->think_end, 8);
            if (!r->n_think_end)
                return bad(e, 400, "thinking_token_budget", "thinking_token_budget is not supported for "
                           "this model's chat template (its thinking does not end with </think>)");
            p->think_budget = (int)x;
            r->n_think_start = llm_chat_think_start_ids(&r->chat, S->model->tok, r->think_start, 8);
        }
    }
    if (truncate_prompts(S, r, e) || check_context(S, r, max_tokens, given, e)) return -1;
    p->max_tokens = r->score_only ? 1 : given ? max_tokens : 0; /* scoring: the token it computes anyway */
    p->stop_token_ids = r->stop_ids; p->n_stop_token_ids = (int)arrlen(r->stop_ids);
    p->logit_bias_ids = r->bias_ids; p->logit_bias = r->bias; p->n_logit_bias = (int)arrlen(r->bias_ids);
    p->allowed_token_ids = r->allowed_ids; p->n_allowed_token_ids = (int)arrlen(r->allowed_ids);
    p->bad_word_ids = r->bad_ids; p->bad_word_lens = r->bad_lens; p->n_bad_words = (int)arrlen(r->bad_lens);
    p->think_end_ids = r->think_end; p->n_think_end_ids = r->n_think_end;
    p->think_start_ids = r->think_start; p->n_think_start_ids = r->n_think_start;
    p->grammar_parsed = r->grammar_parsed; /* structured_check's: the network thread adds it cheaply */
    return 0;
}

/* A prepared generation joins the engine, on the network thread: its prompts added (ids and a parsed grammar:
 * cheap), the connection given the request, a stream's headers sent. Frees r and returns -1 with the error in
 * *e when it cannot start (the queue is full, or the engine refuses its first prompt).
 * Once it returns 0 the request belongs to the engine's outputs: each of its n_prompts * n choices finishes
 * exactly once (n_open counts those still open), and the last finish frees it (request_done). */
static int attach_generation(srv_state *S, srv_conn *c, srv_req *r, const llm_sampling_params *p,
                             srv_error *e) {
    /* 1. the seed of its tool calls' ids (put_tool_call_id), so a reply read twice gives the same ids */
    r->call_id_seed = llm_splitmix64(&S->id_rng);
    /* 2. --max-queue counts prompts waiting for their first output (n_queued), as each is one engine request:
     * a list of 1,000 prompts is 1,000 waiting requests */
    if (S->n_queued + r->n_prompts > S->max_queue) {
        bad(e, 503, NULL, "the server is busy: %d requests are waiting (--max-queue %d)", S->n_queued,
            S->max_queue);
        goto fail;
    }
    /* 3. the choices, prompt-major: choice prompt * n + sample, the index OpenAI's response gives it */
    r->choices = (srv_choice *)calloc((size_t)(r->n_prompts * r->n), sizeof(srv_choice));
    if (!r->choices) { bad(e, 500, NULL, "out of memory"); goto fail; }
    r->n_open = r->n_prompts * r->n;
    r->conn = c;
    char err[LLM_ERR_LEN];
    /* 4. each prompt into the engine, with its srv_prompt as the output's user pointer (apply_event finds
     * the request by it). A refusal after the first prompt cannot undo a request that has begun: the prompts
     * added are aborted, and their aborted outputs finish the request with the engine's error in r->error */
    for (int i = 0; i < r->n_prompts; i++) {
        srv_prompt *sp = &r->prompts[i];
        sp->n_prompt = (int)arrlen(sp->prompt_ids);
        sp->engine_id = llm_engine_add_request(S->engine, NULL, sp->prompt_ids, sp->n_prompt, p, sp, err);
        if (!sp->engine_id) {
            /* the requests already added finish as aborted; this one never started */
            for (int k = 0; k < i; k++) llm_engine_abort(S->engine, r->prompts[k].engine_id);
            if (i == 0) { bad(e, 400, NULL, "%s", err); r->conn = NULL; goto fail; }
            snprintf(r->error, sizeof r->error, "%s", err);
            r->n_open -= (r->n_prompts - i) * r->n;
            r->n_prompts = i;
            break;
        }
        S->n_queued++;
        r->prompt_tokens += sp->n_prompt;
    }
    /* 5. the connection's request in flight (it reads no other until this one ends), and the live list that
     * a stop drains; a stream's status line and headers go now, before any token, so that an error later
     * can only be an event inside the stream (finish_request) */
    c->req = r;
    arrput(S->live, r);
    if (r->stream) {
        sbuf h = {0};
        sb_printf(&h, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                  "X-Request-Id: %s\r\n%sTransfer-Encoding: chunked\r\n\r\n", conn_request_id(S, c), c->cors);
        conn_send(S, c, h.s, h.len);
        sb_free(&h);
    }
    return 0;
fail:
    req_free(r);
    return -1;
}

/* A chat's prompt, tools and all, as a generation would run it, tokenized into *ids (stb_ds): /tokenize's
 * count and Anthropic's count_tokens */
static int chat_tokens(srv_state *S, const llm_json *body, int add_special, int32_t **ids, srv_error *e) {
    srv_req tmp;
    memset(&tmp, 0, sizeof tmp);
    char *text = NULL;
    int n = 0, rc = chat_prompt(S, body, &tmp, &text, &n, e);
    free(tmp.grammar); llm_grammar_free(tmp.grammar_parsed);
    if (rc == 0 && tokenize_text(S, text, (size_t)n, add_special, ids))
        rc = bad(e, 400, "messages", "cannot tokenize");
    free(text);
    return rc;
}

/* /tokenize and /detokenize: 0 with the answer's body in out, or -1 with the error in *e */
static int handle_tokenize(srv_state *S, const llm_json *body, sbuf *out, srv_error *e) {
    int32_t *ids = NULL;
    int add_special = 1;
    if (check_model(S, body, e) || get_bool(body, "add_special_tokens", &add_special, e)) goto fail;
    const llm_json *prompt = llm_json_get(body, "prompt"), *msgs = llm_json_get(body, "messages");
    if (prompt && prompt->type == LLM_JSON_STRING) {
        if (tokenize_text(S, prompt->str, prompt->len, add_special, &ids)) {
            bad(e, 400, "prompt", "cannot tokenize");
            goto fail;
        }
    } else if (msgs && msgs->type == LLM_JSON_ARRAY) { /* a chat's prompt, tools and all, as it would run */
        if (chat_tokens(S, body, add_special, &ids, e)) goto fail;
    } else {
        bad(e, 400, "prompt", "give prompt (a string) or messages (a list)");
        goto fail;
    }
    sb_printf(out, "{\"count\":%d,\"max_model_len\":%d,\"tokens\":[", (int)arrlen(ids), S->max_model_len);
    for (ptrdiff_t i = 0; i < arrlen(ids); i++) sb_printf(out, i ? ",%d" : "%d", ids[i]);
    sb_puts(out, "],\"token_strs\":null}");
    arrfree(ids);
    return out->failed ? bad(e, 500, NULL, "out of memory") : 0;
fail:
    arrfree(ids);
    return -1;
}

/* ids -> text; every id checked against the vocabulary first */
static int handle_detokenize(srv_state *S, const llm_json *body, sbuf *out, srv_error *e) {
    const llm_json *tokens = llm_json_get(body, "tokens");
    if (check_model(S, body, e)) return -1;
    if (!tokens || tokens->type != LLM_JSON_ARRAY)
        return bad(e, 400, "tokens", "tokens must be a list of ids");
    int32_t *ids = NULL;
    for (int i = 0; i < tokens->n; i++) {
        const llm_json *v = &tokens->items[i];
        if (!is_token_id(S, v)) {
            arrfree(ids);
            return bad(e, 400, "tokens", "tokens must be integers in 0..%d", S->model->cfg.vocab_size - 1);
        }
        arrput(ids, (int32_t)v->num);
    }
    sbuf t = {0};
    int m = llm_detokenize(S->model->tok, ids, (int)arrlen(ids), 0, NULL, 0);
    if (m > 0 && (t.s = (char *)malloc((size_t)m + 1)))
        t.len = (size_t)llm_detokenize(S->model->tok, ids, (int)arrlen(ids), 0, t.s, m + 1);
    arrfree(ids);
    sb_puts(out, "{\"prompt\":");
    sb_json_str(out, t.s ? t.s : "", t.len);
    sb_puts(out, "}");
    sb_free(&t);
    return out->failed ? bad(e, 500, NULL, "out of memory") : 0;
}

/* ===========================================================================================================
 * Request workers: what a request's bytes cost, off the network thread
 * A request's JSON is parsed, its chat template rendered, its prompts tokenized and its grammar written and
 * parsed by a worker thread: a 7 MB prompt or a 1 MB grammar takes a second or more, and on the network
 * thread that second would stall every stream and every health check. The network thread hands a whole
 * request over (a job: the route and a copy of the body) and goes on; the connection reads no further request
 * until the job comes back, through the wake-up pipe, as an answer to send (an error, /tokenize's) or as a
 * generation ready for the engine, which the network thread adds (ids and a parsed grammar: cheap).
 * ======================================================================================================== */
/* The embeddings' endpoints (their section, after the engine's events) */
static int prepare_embeddings(srv_state *S, const llm_json *body, const char *request_id, srv_req *r,
                              llm_sampling_params *p, srv_error *e);
static int prepare_rerank(srv_state *S, const llm_json *body, int score, const char *request_id, srv_req *r,
                          llm_sampling_params *p, srv_error *e);
static void embed_finish(srv_state *S, srv_req *r);
static void rerank_finish(srv_state *S, srv_req *r);

/* The worker's part of a job: everything a request's bytes can make cost */
static void job_run(srv_state *S, srv_job *j) {
    char jerr[LLM_ERR_LEN];
    /* failed until the end says otherwise: each early return leaves a 400 or 500 in j->e */
    j->failed = 1;
    /* 1. the body as JSON (llm_json_parse bounds its depth), and an object */
    if (llm_json_parse(j->body ? j->body : "", j->body_len, &j->json, jerr) != 0) {
        bad(&j->e, 400, NULL, "the body is not valid JSON: %s", jerr);
        return;
    }
    j->json_ok = 1;
    free(j->body); j->body = NULL; /* (the parse copied what it keeps) */
    if (j->json.type != LLM_JSON_OBJECT) { bad(&j->e, 400, NULL, "the body must be a JSON object"); return; }
    /* 2. /tokenize and /detokenize: the whole answer, made here */
    if (j->route == JOB_TOKENIZE || j->route == JOB_DETOKENIZE) {
        j->failed = (j->route == JOB_TOKENIZE ? handle_tokenize : handle_detokenize)(S, &j->json, &j->answer,
                                                                                    &j->e) != 0;
        return;
    }
    /* 3. Anthropic's Messages API: its body becomes a chat request (its section) */
    if (j->route == JOB_MESSAGES || j->route == JOB_COUNT_TOKENS) { msgs_job(S, j); return; }
    /* 4. OpenAI's Responses API and its compaction: a chat request inside (their section) */
    if (j->route == JOB_RESPONSES || j->route == JOB_COMPACT) {
        j->failed = resp_prepare(S, j) != 0;
        return;
    }
    /* 5. a generation: a request prepared, left for the network thread to attach (jobs_done). Its arrival
     * is when the whole request was read, so the time it waited for a worker is in its latency */
    if (!(j->r = (srv_req *)calloc(1, sizeof *j->r))) { bad(&j->e, 500, NULL, "out of memory"); return; }
    j->r->t_arrival = j->t_arrival;
    if (j->route == JOB_EMBEDDINGS)
        j->failed = prepare_embeddings(S, &j->json, j->request_id, j->r, &j->p, &j->e) != 0;
    else if (j->route == JOB_RERANK || j->route == JOB_SCORE)
        j->failed = prepare_rerank(S, &j->json, j->route == JOB_SCORE, j->request_id, j->r, &j->p,
                                   &j->e) != 0;
    else
        j->failed = prepare_generation(S, &j->json, j->route == JOB_CHAT ? REQ_CHAT : REQ_COMPLETIONS,
                                       j->request_id, j->r, &j->p, &j->e) != 0;
}

/* A worker thread: takes the oldest job, runs it without the lock, puts it on jobs_done and writes a byte
 * down the wake-up pipe; ends when jobs_quit is set (a job left in the queue is freed by serve). */
static void *srv_worker(void *arg) {
    srv_state *S = (srv_state *)arg;
    pthread_mutex_lock(&S->job_lock);
    for (;;) {
        while (!arrlen(S->jobs_todo) && !S->jobs_quit) pthread_cond_wait(&S->job_added, &S->job_lock);
        if (S->jobs_quit) break;
        srv_job *j = S->jobs_todo[0];
        arrdel(S->jobs_todo, 0);
        pthread_mutex_unlock(&S->job_lock);
        job_run(S, j);
        pthread_mutex_lock(&S->job_lock);
        arrput(S->jobs_done, j);
        char c = 'j';
        ssize_t rc = write(S->wake[1], &c, 1);
        (void)rc;
    }
    pthread_mutex_unlock(&S->job_lock);
    return NULL;
}

/* A whole request to a worker; the connection waits for it (job_done) */
static void job_start(srv_state *S, srv_conn *c, int route, http_request *rq) {
    srv_job *j = (srv_job *)calloc(1, sizeof *j);
    if (!j) { send_error(S, c, 500, NULL, "out of memory"); return; }
    j->body = rq->body.s; j->body_len = rq->body.len; /* the job's now; it still counts in what is held */
    memset(&rq->body, 0, sizeof rq->body);
    j->held = j->body_len > SRV_CONN_ALLOWANCE ? j->body_len - SRV_CONN_ALLOWANCE : 0;
    S->held += j->held;
    j->conn = c; j->route = route; j->t_arrival = now_s();
    memcpy(j->request_id, conn_request_id(S, c), sizeof j->request_id);
    c->job = j;
    pthread_mutex_lock(&S->job_lock);
    arrput(S->jobs_todo, j);
    pthread_cond_signal(&S->job_added);
    pthread_mutex_unlock(&S->job_lock);
}

/* The jobs the workers finished, on the network thread: each answered, or its generation added */
static void jobs_done(srv_state *S) {
    pthread_mutex_lock(&S->job_lock);
    srv_job **done = S->jobs_done;
    S->jobs_done = NULL;
    pthread_mutex_unlock(&S->job_lock);
    /* the list taken whole under the lock, then handled without it (a worker never waits on this) */
    for (ptrdiff_t i = 0; i < arrlen(done); i++) {
        srv_job *j = done[i];
        srv_conn *c = j->conn;
        S->held -= j->held;
        /* a job whose client left (conn_close set conn NULL) is only freed: its request never starts */
        if (c) {
            c->job = NULL;
            c->t_last_active = now_s();
            srv_error e = j->e;
            if (!j->failed && j->r) {
                srv_req *r = j->r;
                j->r = NULL; /* attach_generation's now, whatever comes */
                if (attach_generation(S, c, r, &j->p, &e) != 0) j->failed = 1;
                else if (r->resp) resp_started(S, r); /* the Responses stream's first events */
            } else if (!j->failed)
                send_response(S, c, 200, "application/json", j->answer.s, j->answer.len, NULL);
            if (j->failed)
                send_error(S, c, e.status ? e.status : 400, e.param[0] ? e.param : NULL, "%s", e.msg);
            if (!c->req && !c->keep_alive) c->closing = 1;
        }
        job_free(j); /* the body, which the engine copied what it keeps of */
    }
    arrfree(done);
}

/* ===========================================================================================================
 * The engine thread: wait for work, step, hand every output over as an event
 *
 * The one thread that calls llm_engine_step. A step's outputs are valid only until the next step, so each
 * is copied into an srv_event (text, ids, logprobs, prompt logprobs), and the step's events go onto
 * S->events under S->lock with the engine's stats, then one byte down the wake-up pipe. Out of memory
 * while copying aborts that request with an error event: a client never gets text with a hole in it. The
 * network thread never waits for a step; the engine thread never touches a request or a connection.
 * ======================================================================================================== */
/* The engine thread's loop: 1. the stop flag, 2. wait for work (llm_engine_wait sleeps until there is some,
 * a second at most), 3. one step, 4. each output copied into an event, 5. the events and stats handed
 * over under the lock and the network thread woken, 6. every 10 s, while there is work, a log line. */
static void *srv_engine_loop(void *arg) {
    srv_state *S = (srv_state *)arg;
    double last_log = now_s();
    int64_t last_prompt = 0, last_gen = 0;
    for (;;) {
        pthread_mutex_lock(&S->lock);
        int stop = S->stop_engine;
        pthread_mutex_unlock(&S->lock);
        if (stop) break;
        if (!llm_engine_wait(S->engine, 1000)) continue; /* a second at most: then the stop flag again */
        const llm_output *out;
        double t_step = now_s();
        int n = llm_engine_step(S->engine, &out);
        double t = now_s();
        /* each output copied: the engine reuses its buffers at its next step */
        srv_event *batch = NULL;
        for (int i = 0; i < n; i++) {
            const llm_output *o = &out[i];
            srv_event ev;
            memset(&ev, 0, sizeof ev);
            ev.user = o->user; ev.index = o->index; ev.finish = o->finish_reason;
            ev.stop_string = o->stop_string;
            ev.t = t; ev.t_step = t_step;
            ev.n_tokens = o->n_tokens; ev.n_top = o->n_top; ev.n_prompt = o->n_prompt_tokens;
            ev.n_cached = o->n_cached_tokens;
            int ok = 1;
            if (o->text_len && (ev.text = (char *)malloc((size_t)o->text_len)))
                memcpy(ev.text, o->text, (size_t)(ev.text_len = o->text_len));
            else ok = !o->text_len;
            if (o->n_tokens) {
                ok = ok && (ev.ids = (int32_t *)malloc((size_t)o->n_tokens * sizeof(int32_t)));
                if (ok) memcpy(ev.ids, o->token_ids, (size_t)o->n_tokens * sizeof(int32_t));
            }
            if (ok && o->logprobs && o->n_tokens) {
                size_t nt = (size_t)o->n_tokens, nk = nt * (size_t)o->n_top;
                ok = (ev.logprobs = (float *)malloc(nt * sizeof(float))) != NULL;
                if (ok) memcpy(ev.logprobs, o->logprobs, nt * sizeof(float));
                if (ok && nk) {
                    ok = (ev.top_ids = (int32_t *)malloc(nk * sizeof(int32_t))) &&
                         (ev.top_logprobs = (float *)malloc(nk * sizeof(float)));
                    if (ok) {
                        memcpy(ev.top_ids, o->top_ids, nk * sizeof(int32_t));
                        memcpy(ev.top_logprobs, o->top_logprobs, nk * sizeof(float));
                    }
                }
            }
            if (ok && o->prompt_logprobs) {
                size_t nr = (size_t)o->n_prompt_logprobs + 1, nk = nr * (size_t)o->n_prompt_top;
                srv_prompt_lp *lp = ev.prompt_lp = (srv_prompt_lp *)calloc(1, sizeof *lp);
                ok = lp && (lp->logprobs = (float *)malloc(nr * sizeof(float))) &&
                     (lp->ranks = (int32_t *)malloc(nr * sizeof(int32_t))) &&
                     (lp->top_ids = (int32_t *)malloc(nk * sizeof(int32_t) + 4)) && /* + 4: K may be 0 */
                     (lp->top_logprobs = (float *)malloc(nk * sizeof(float) + 4));
                if (ok) {
                    lp->n = o->n_prompt_logprobs; lp->n_top = o->n_prompt_top;
                    memcpy(lp->logprobs, o->prompt_logprobs, (size_t)lp->n * sizeof(float));
                    memcpy(lp->ranks, o->prompt_ranks, (size_t)lp->n * sizeof(int32_t));
                    size_t n_top = (size_t)lp->n * (size_t)lp->n_top;
                    memcpy(lp->top_ids, o->prompt_top_ids, n_top * sizeof(int32_t));
                    memcpy(lp->top_logprobs, o->prompt_top_logprobs, n_top * sizeof(float));
                }
            }
            if (ok && o->embedding) {
                size_t bytes = (size_t)o->n_embedding * sizeof(float);
                ok = (ev.embedding = (float *)malloc(bytes)) != NULL;
                if (ok) { memcpy(ev.embedding, o->embedding, bytes); ev.n_embedding = o->n_embedding; }
            }
            if (o->error) ev.error = strdup(o->error);
            if (!ok) { /* out of memory: the client gets an error rather than a hole in its text */
                llm_engine_abort(S->engine, o->request_id);
                if (!ev.error) ev.error = strdup("out of memory in the server");
                if (!ev.finish) ev.finish = LLM_FINISH_ERROR;
            }
            arrput(batch, ev);
        }
        /* the step's events handed over at once, with the stats /metrics reads; then the network thread
         * woken */
        llm_engine_stats st = llm_engine_get_stats(S->engine);
        pthread_mutex_lock(&S->lock);
        for (ptrdiff_t i = 0; i < arrlen(batch); i++) arrput(S->events, batch[i]);
        S->stats = st;
        pthread_mutex_unlock(&S->lock);
        arrfree(batch);
        if (n > 0) { char c = 'e'; ssize_t rc = write(S->wake[1], &c, 1); (void)rc; }
        if (t - last_log >= 10 && st.running + st.waiting > 0) { /* like vLLM's periodic line */
            fprintf(stderr, "llm serve: running %d, waiting %d, KV cache %.1f%% used, prompt %.1f tok/s, "
                    "generation %.1f tok/s\n", st.running, st.waiting,
                    100.0 * (st.num_blocks - st.num_free_blocks) / st.num_blocks,
                    (st.prompt_tokens_computed - last_prompt) / (t - last_log),
                    (st.generation_tokens - last_gen) / (t - last_log));
            last_log = t; last_prompt = st.prompt_tokens_computed; last_gen = st.generation_tokens;
        }
    }
    return NULL;
}

/* ===========================================================================================================
 * Requests out: what each engine output adds to the response
 *
 * A whole response keeps each choice's text and logprobs in its srv_choice until every choice is done, then
 * finish_request writes the body. A stream sends one SSE chunk per output (stream_event) and, at the end,
 * the usage, [DONE] and the chunked body's end. The JSON is OpenAI's, with vLLM's additions (prompt_logprobs,
 * continuous usage, tokens as ids). A chat reply read for thinking or tool calls is parsed again after each
 * output (llm_chat_parse_reply) and a stream sends only what each part gained since the last chunk.
 * ======================================================================================================== */
/* OpenAI's finish_reason for each of the engine's, and vLLM's finished_reason label in /metrics. llm_finish
 * lists them from the best to the worst, which request_done relies on. */
static const char *const srv_finish_names[LLM_FINISH_ERROR + 1] = {
    [LLM_FINISH_STOP] = "stop", [LLM_FINISH_LENGTH] = "length", [LLM_FINISH_ABORT] = "abort",
    [LLM_FINISH_ERROR] = "error",
};
_Static_assert(LLM_FINISH_STOP < LLM_FINISH_LENGTH && LLM_FINISH_LENGTH < LLM_FINISH_ABORT &&
               LLM_FINISH_ABORT < LLM_FINISH_ERROR, "llm_finish goes from the best reason to the worst");

/* OpenAI's finish_reason for the engine's (a reply that made a tool call says "tool_calls" instead) */
static const char *finish_name(int reason) {
    return reason >= LLM_FINISH_STOP && reason <= LLM_FINISH_ERROR ? srv_finish_names[reason] : "error";
}

/* What every response and chunk opens with: id, object, created, model, system_fingerprint; the object is
 * left open for the caller's fields. */
static void put_header_fields(sbuf *b, srv_state *S, srv_req *r, const char *object) {
    sb_puts(b, "{\"id\":");
    sb_json_cstr(b, r->id);
    sb_printf(b, ",\"object\":\"%s\",\"created\":%lld,\"model\":", object, r->created);
    sb_json_cstr(b, S->model_name);
    sb_puts(b, ",\"system_fingerprint\":\"fp_llm\"");
}

/* usage, with OpenAI's prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache held. vLLM
 * writes it only under --enable-prompt-tokens-details; OpenAI always does, and a router or a bill needs it,
 * so it is always here. Each prompt counts once, as in prompt_tokens and as vLLM counts a request's
 * num_cached_tokens: its n samples share one prefill (the engine forks them after it), so n > 1 does not
 * multiply them; the prompts of a list add theirs up. */
static int req_cached_tokens(const srv_req *r) { /* its prompts' tokens the prefix cache had */
    int cached = 0;
    for (int i = 0; i < r->n_prompts; i++) cached += r->prompts[i].n_cached;
    return cached;
}
static void put_usage(sbuf *b, srv_req *r) {
    int cached = req_cached_tokens(r);
    sb_printf(b, "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
              "\"prompt_tokens_details\":{\"cached_tokens\":%d}}",
              r->prompt_tokens, r->completion_tokens, r->prompt_tokens + r->completion_tokens, cached);
}

/* A token as logprobs name it: its text (a JSON string where its bytes are UTF-8, else "bytes:\\x.."), or
 * with as_id (vLLM's return_tokens_as_token_ids) "token_id:N"; and the bytes of that */
static void put_token_str(sbuf *b, srv_state *S, int32_t id, int as_id) {
    if (as_id) { sb_printf(b, "\"token_id:%d\"", (int)id); return; }
    char piece[256];
    int n = llm_tokenizer_piece(S->model->tok, id, 1, piece, sizeof piece);
    if (n < 0) n = 0;
    if (n > (int)sizeof piece) n = (int)sizeof piece;
    int valid = 1;
    for (int i = 0; i < n;) {
        int l = llm_utf8_check((const unsigned char *)piece + i, (size_t)(n - i));
        if (l <= 0) { valid = 0; break; }
        i += l;
    }
    if (valid) { sb_json_str(b, piece, (size_t)n); return; }
    sbuf t = {0};
    sb_puts(&t, "bytes:");
    for (int i = 0; i < n; i++) sb_printf(&t, "\\x%02x", (unsigned char)piece[i]);
    sb_json_str(b, t.s ? t.s : "", t.len);
    sb_free(&t);
}

/* A token's bytes as a JSON list of numbers (chat logprobs' "bytes") */
static void put_token_bytes(sbuf *b, srv_state *S, int32_t id, int as_id) {
    char piece[256];
    int n = as_id ? snprintf(piece, sizeof piece, "token_id:%d", (int)id)
                  : llm_tokenizer_piece(S->model->tok, id, 1, piece, sizeof piece);
    if (n > (int)sizeof piece) n = (int)sizeof piece;
    sb_puts(b, "[");
    for (int i = 0; i < n; i++) sb_printf(b, i ? ",%d" : "%d", (unsigned char)piece[i]);
    sb_puts(b, "]");
}

/* One token of /v1/completions' four parallel lists: its text, logprob, top alternatives (the first n_top of
 * top_ids/top_lps) and offset in the choice's text; a NULL logprob writes null for both (the first token of
 * an echoed prompt, which nothing predicts). Returns the offset of the next token. */
static size_t add_completion_entry(srv_state *S, const srv_req *r, srv_choice *ch, int32_t id,
                                   const float *logprob, const int32_t *top_ids, const float *top_lps,
                                   int n_top, size_t text_start) {
    if (ch->lp_tokens.len) {
        sb_puts(&ch->lp_tokens, ","); sb_puts(&ch->lp_values, ",");
        sb_puts(&ch->lp_top, ","); sb_puts(&ch->lp_offsets, ",");
    }
    put_token_str(&ch->lp_tokens, S, id, r->tokens_as_ids);
    if (logprob) sb_json_float(&ch->lp_values, *logprob); else sb_puts(&ch->lp_values, "null");
    if (logprob) {
        sb_puts(&ch->lp_top, "{");
        for (int k = 0; k < n_top; k++) {
            if (k) sb_puts(&ch->lp_top, ",");
            put_token_str(&ch->lp_top, S, top_ids[k], r->tokens_as_ids);
            sb_puts(&ch->lp_top, ":");
            sb_json_float(&ch->lp_top, top_lps[k]);
        }
        sb_puts(&ch->lp_top, "}");
    } else sb_puts(&ch->lp_top, "null");
    /* each token's offset: where its text begins in the choice's text (the event's text, spread) */
    char piece[256];
    int n = llm_tokenizer_piece(S->model->tok, id, 0, piece, sizeof piece);
    sb_printf(&ch->lp_offsets, "%zu", text_start);
    return text_start + (n > 0 ? (size_t)n : 0);
}

/* echo with logprobs: the prompt's tokens open the choice's lists, the first with nulls (as OpenAI, vLLM).
 * text_start is where the echoed prompt begins in the choice's text, and each token's text_offset is a byte
 * offset into that text: the sum of the pieces before it. Row t - 1 of sp->lp scores prompt token t (the
 * first token has no row: nothing comes before it to predict it). The engine computes the rows with the
 * larger of logprobs and prompt_logprobs (prepare_generation), so only the first r->logprobs of each row's
 * top list are written here. */
static void add_prompt_logprobs(srv_state *S, srv_req *r, srv_choice *ch, const srv_prompt *sp,
                                size_t text_start) {
    const srv_prompt_lp *lp = sp->lp;
    int n_top = lp && r->logprobs < lp->n_top ? r->logprobs : lp ? lp->n_top : 0;
    /* the offsets: the pieces' lengths added up, less the space SentencePiece put in front of the first
     * word, which the echoed text (the prompt as given, or llm_detokenize's) has not */
    int n = (int)arrlen(sp->prompt_ids), first = 0;
    size_t pieces = 0, skip = 0;
    char piece[256];
    /* skip: the pieces up to the first one with bytes, less what llm_detokenize makes of the same tokens
     * (a BOS has no bytes; "▁Once" is " Once" as a piece and "Once" detokenized: skip 1) */
    for (; first < n && !pieces; first++) {
        int k = llm_tokenizer_piece(S->model->tok, sp->prompt_ids[first], 0, piece, sizeof piece);
        pieces += k > 0 ? (size_t)k : 0;
    }
    int detok = llm_detokenize(S->model->tok, sp->prompt_ids, first, 0, NULL, 0);
    if (detok >= 0 && (size_t)detok < pieces) skip = pieces - (size_t)detok;
    pieces = 0;
    /* each token's offset: the bytes of the pieces before it, less skip, never before text_start */
    for (int t = 0; t < n && lp; t++) {
        int scored = t > 0 && t <= lp->n; /* row t - 1 scores token t */
        size_t row = scored ? (size_t)(t - 1) * (size_t)lp->n_top : 0;
        size_t at = text_start + (pieces > skip ? pieces - skip : 0);
        pieces += add_completion_entry(S, r, ch, sp->prompt_ids[t], scored ? &lp->logprobs[t - 1] : NULL,
                                       lp->top_ids + row, lp->top_logprobs + row, n_top, at) - at;
    }
}

/* vLLM's prompt_logprobs of a choice: null for the first prompt token, then for each a map from token id to
 * its logprob, rank and text: the prompt's own token first, then the top K (each id once).
 * The list has one entry per prompt token, so entry t is row t - 1 of sp->lp (the row that scores token t);
 * a map holds K + 1 entries, or K when the prompt's token is among the top K (then written once, first,
 * with its rank). The own token's rank is the engine's (1 + the tokens more likely than it); the top K's
 * ranks are their places, 1..K. K is the request's prompt_logprobs: the rows may hold more (echo's logprobs
 * asked for more), and the rest of each row is not written. */
static void put_prompt_logprobs(sbuf *b, srv_state *S, srv_req *r, const srv_prompt *sp) {
    const srv_prompt_lp *lp = sp->lp;
    int n_top = lp && r->prompt_logprobs < lp->n_top ? r->prompt_logprobs : lp ? lp->n_top : 0;
    sb_puts(b, ",\"prompt_logprobs\":");
    if (!lp) { sb_puts(b, "null"); return; }
    sb_puts(b, "[null");
    for (int t = 1; t <= lp->n && t < arrlen(sp->prompt_ids); t++) {
        const int32_t *top = lp->top_ids + (size_t)(t - 1) * lp->n_top;
        const float *top_lp = lp->top_logprobs + (size_t)(t - 1) * lp->n_top;
        int32_t id = sp->prompt_ids[t];
        sb_printf(b, ",{\"%d\":{\"logprob\":", (int)id);
        sb_json_float(b, lp->logprobs[t - 1]);
        sb_printf(b, ",\"rank\":%d,\"decoded_token\":", (int)lp->ranks[t - 1]);
        put_token_str(b, S, id, 0);
        sb_puts(b, "}");
        for (int k = 0; k < n_top; k++) {
            if (top[k] == id) continue;
            sb_printf(b, ",\"%d\":{\"logprob\":", (int)top[k]);
            sb_json_float(b, top_lp[k]);
            sb_printf(b, ",\"rank\":%d,\"decoded_token\":", k + 1);
            put_token_str(b, S, top[k], 0);
            sb_puts(b, "}");
        }
        sb_puts(b, "}");
    }
    sb_puts(b, "]");
}

/* The logprobs of an event's tokens, appended to the choice's lists (or written to b for a stream). */
static void add_logprobs(srv_state *S, srv_req *r, srv_choice *ch, const srv_event *ev, sbuf *chat_out,
                         size_t text_start) {
    for (int t = 0; t < ev->n_tokens && ev->logprobs; t++) {
        int32_t id = ev->ids[t];
        if (r->kind == REQ_CHAT) {
            sbuf *b = chat_out;
            if (b->len) sb_puts(b, ",");
            sb_puts(b, "{\"token\":"); put_token_str(b, S, id, r->tokens_as_ids);
            sb_puts(b, ",\"logprob\":"); sb_json_float(b, ev->logprobs[t]);
            sb_puts(b, ",\"bytes\":"); put_token_bytes(b, S, id, r->tokens_as_ids);
            sb_puts(b, ",\"top_logprobs\":[");
            for (int k = 0; k < ev->n_top && k < r->top_logprobs; k++) {
                int32_t tid = ev->top_ids[t * ev->n_top + k];
                sb_puts(b, k ? ",{\"token\":" : "{\"token\":"); put_token_str(b, S, tid, r->tokens_as_ids);
                sb_puts(b, ",\"logprob\":"); sb_json_float(b, ev->top_logprobs[t * ev->n_top + k]);
                sb_puts(b, ",\"bytes\":"); put_token_bytes(b, S, tid, r->tokens_as_ids);
                sb_puts(b, "}");
            }
            sb_puts(b, "]}");
        } else {
            int n_top = ev->n_top < r->logprobs ? ev->n_top : r->logprobs;
            text_start = add_completion_entry(S, r, ch, id, &ev->logprobs[t], ev->top_ids + t * ev->n_top,
                                              ev->top_logprobs + t * ev->n_top, n_top, text_start);
        }
    }
}

/* /v1/completions' logprobs object, from the choice's four lists */
static void put_completion_logprobs(sbuf *b, srv_choice *ch) {
    sb_puts(b, "{\"tokens\":[");
    sb_put(b, ch->lp_tokens.s ? ch->lp_tokens.s : "", ch->lp_tokens.len);
    sb_puts(b, "],\"token_logprobs\":[");
    sb_put(b, ch->lp_values.s ? ch->lp_values.s : "", ch->lp_values.len);
    sb_puts(b, "],\"top_logprobs\":[");
    sb_put(b, ch->lp_top.s ? ch->lp_top.s : "", ch->lp_top.len);
    sb_puts(b, "],\"text_offset\":[");
    sb_put(b, ch->lp_offsets.s ? ch->lp_offsets.s : "", ch->lp_offsets.len);
    sb_puts(b, "]}");
}

/* ---- A chat reply read for its thinking and tool calls ------------------------------------------------- */
/* The id of choice ci's call k: "call_" (Anthropic's "toolu_") and 24 letters and digits, or 9 of them for
 * Mistral's models (their templates take no other); the same every time the reply is read, streamed or not */
static void put_tool_call_id(sbuf *b, const srv_req *r, int ci, int k) {
    uint64_t h = r->call_id_seed;
    h = (h ^ (uint64_t)ci) * 1099511628211ull;
    h = (h ^ (uint64_t)k) * 1099511628211ull;
    char id[32];
    int pre = snprintf(id, sizeof id, "%s", r->api == API_MESSAGES ? "toolu_" : "call_");
    if (r->chat.call_id_len == 9) put_id_chars(id, 9, h);
    else put_id_chars(id + pre, 24, h);
    sb_json_cstr(b, id);
}

/* The message of a non-streamed reply, read for thinking and calls: content (null when it only calls),
 * reasoning_content and reasoning (the same text: llama.cpp's name and vLLM's), tool_calls. Returns whether
 * it calls (finish reason "tool_calls"). */
static int put_read_message(sbuf *b, srv_req *r, int ci, const srv_choice *ch) {
    llm_chat_reply rep;
    const char *text = ch->text.s ? ch->text.s : "";
    if (llm_chat_parse_reply(&r->chat, text, ch->text.len, r->reasoning > 0, r->tool_calls, 0, &rep) != 0) {
        llm_chat_reply_free(&rep);
        b->failed = 1;
        return 0;
    }
    int n_calls = rep.n_calls - rep.in_call; /* a call cut short by max_tokens is not a call */
    sb_puts(b, "\"message\":{\"role\":\"assistant\",\"content\":");
    const char *echo = r->chat_echo ? r->chat_echo : "";
    if (!rep.content[0] && !echo[0] && n_calls) sb_puts(b, "null");
    else {
        sbuf content = {0};
        sb_puts(&content, echo); sb_puts(&content, rep.content);
        sb_json_str(b, content.s ? content.s : "", content.len);
        b->failed |= content.failed;
        sb_free(&content);
    }
    if (rep.reasoning && r->reasoning == 2) {
        sb_puts(b, ",\"reasoning_content\":"); sb_json_cstr(b, rep.reasoning);
        sb_puts(b, ",\"reasoning\":"); sb_json_cstr(b, rep.reasoning);
    }
    if (n_calls) {
        sb_puts(b, ",\"tool_calls\":[");
        for (int k = 0; k < n_calls; k++) {
            sb_puts(b, k ? ",{\"id\":" : "{\"id\":"); put_tool_call_id(b, r, ci, k);
            sb_puts(b, ",\"type\":\"function\",\"function\":{\"name\":"); sb_json_cstr(b, rep.calls[k].name);
            sb_puts(b, ",\"arguments\":"); sb_json_cstr(b, rep.calls[k].arguments);
            sb_puts(b, "}}");
        }
        sb_puts(b, "]");
    }
    sb_puts(b, ",\"refusal\":null}");
    llm_chat_reply_free(&rep);
    return n_calls > 0;
}

/* continuous_usage_stats: a chunk of choice ci says its usage so far (its prompt's tokens, done of its
 * own) */
static void put_chunk_usage(sbuf *b, const srv_req *r, int ci, int done) {
    if (!r->continuous_usage) return;
    int prompt = (int)arrlen(r->prompts[ci / r->n].prompt_ids);
    sb_printf(b, ",\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", prompt,
              done, prompt + done);
}

/* A chat chunk of choice ci: its delta's fields, logprobs and finish reason (NULL: null); done: its tokens so
 * far, for continuous_usage_stats */
static void send_delta(srv_state *S, srv_req *r, int ci, const char *fields, size_t n, const char *finish,
                       const char *logprobs, int done) {
    sbuf b = {0};
    put_header_fields(&b, S, r, "chat.completion.chunk");
    sb_printf(&b, ",\"choices\":[{\"index\":%d,\"delta\":{", ci);
    sb_put(&b, fields, n);
    sb_puts(&b, "},\"logprobs\":"); sb_puts(&b, logprobs ? logprobs : "null");
    sb_puts(&b, ",\"finish_reason\":");
    if (finish) sb_json_cstr(&b, finish); else sb_puts(&b, "null");
    sb_puts(&b, "}]");
    put_chunk_usage(&b, r, ci, done);
    sb_puts(&b, "}");
    send_sse(S, r->conn, NULL, b.s, b.len);
    sb_free(&b);
}

/* A streamed reply read for thinking and calls: the reply so far is read again after each output, and what
 * it adds to each part is sent: thinking as reasoning_content and reasoning, the answer as content, each call
 * first with its index, id, type, name and empty arguments, then its arguments piece by piece, as OpenAI
 * streams them. The marker text of the syntax never reaches content. Returns whether a call was sent.
 * The invariant that makes differences enough: a partial reading holds back what may yet be a marker, so
 * each part of one reading begins the same part of every later one (llm_chat_parse_reply's partial). The
 * choice's sent_reasoning, sent_content and sent_args[k] are byte counts into those parts: what is past
 * them is new. Each output parses the whole reply so far again: simple, and a reply is at most the
 * context's length. */
static int stream_read_reply(srv_state *S, srv_req *r, int ci, srv_choice *ch, int final,
                             const char *logprobs) {
    llm_chat_reply rep;
    const char *text = ch->text.s ? ch->text.s : "";
    int rc = llm_chat_parse_reply(&r->chat, text, ch->text.len, r->reasoning > 0,
                                  r->tool_calls, !final, &rep);
    if (rc != 0) {
        llm_chat_reply_free(&rep);
        return 0;
    }
    /* 1. the calls to send: while the reply is written, the last one too, its arguments as far as they go;
     * at the end, a call that max_tokens cut short is no call */
    int n_calls = rep.n_calls - (final ? rep.in_call : 0);
    sbuf d = {0};
    /* 2. one delta with what the thinking and the answer gained (and this output's logprobs). Thinking read
     * apart but not asked for (reasoning 1) is counted as sent and dropped: it never reaches content */
    size_t nr = rep.reasoning ? strlen(rep.reasoning) : 0, nc = strlen(rep.content);
    if (nr > ch->sent_reasoning && r->reasoning == 2) {
        const char *piece = rep.reasoning + ch->sent_reasoning;
        size_t k = nr - ch->sent_reasoning;
        sb_puts(&d, "\"reasoning_content\":"); sb_json_str(&d, piece, k);
        sb_puts(&d, ",\"reasoning\":"); sb_json_str(&d, piece, k);
    }
    if (nr > ch->sent_reasoning) ch->sent_reasoning = nr;
    if (nc > ch->sent_content) {
        if (d.len) sb_puts(&d, ",");
        sb_puts(&d, "\"content\":"); sb_json_str(&d, rep.content + ch->sent_content, nc - ch->sent_content);
        ch->sent_content = nc;
    }
    if (d.len || logprobs) send_delta(S, r, ci, d.s ? d.s : "", d.len, NULL, logprobs, ch->n_tokens);
    /* 3. each call: a new one's head in a chunk of its own (index, id, name, "" arguments), then in each
     * later chunk what its arguments gained, as OpenAI streams a call (a client joins the pieces by index) */
    for (int k = 0; k < n_calls; k++) {
        d.len = 0;
        size_t na = strlen(rep.calls[k].arguments);
        if (k >= arrlen(ch->sent_args)) { /* a new call: its head */
            sb_printf(&d, "\"tool_calls\":[{\"index\":%d,\"id\":", k); put_tool_call_id(&d, r, ci, k);
            sb_puts(&d, ",\"type\":\"function\",\"function\":{\"name\":");
            sb_json_cstr(&d, rep.calls[k].name);
            sb_puts(&d, ",\"arguments\":\"\"}}]");
            send_delta(S, r, ci, d.s, d.len, NULL, NULL, ch->n_tokens);
            arrput(ch->sent_args, 0);
            d.len = 0;
        }
        if (na > ch->sent_args[k]) {
            sb_printf(&d, "\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", k);
            sb_json_str(&d, rep.calls[k].arguments + ch->sent_args[k], na - ch->sent_args[k]);
            sb_puts(&d, "}}]");
            send_delta(S, r, ci, d.s, d.len, NULL, NULL, ch->n_tokens);
            ch->sent_args[k] = na;
        }
    }
    sb_free(&d);
    llm_chat_reply_free(&rep);
    return arrlen(ch->sent_args) > 0;
}

/* One event of a streaming request: its SSE chunk. A chunk is one `data: {json}` event, written as one chunk
 * of the chunked body by send_sse, with choices[0] the choice ci (the n choices of a request interleave,
 * each with its index). What a chunk holds, in OpenAI's order: a chat's first chunk of each choice is the
 * role alone (and the echo after it); a completion's first one carries the echoed prompt and its logprobs;
 * then each event's text, its tokens' logprobs, and on the last one the finish reason. The events that add
 * nothing (no text, no finish, nothing to echo) send nothing. The stream's end (usage, [DONE]) is
 * finish_request's. */
static void stream_event(srv_state *S, srv_req *r, int ci, srv_choice *ch, const srv_event *ev) {
    if (r->api == API_MESSAGES) { msgs_stream_event(S, r, ch, ev); return; } /* Anthropic's events */
    sbuf b = {0};
    int chat = r->kind == REQ_CHAT;
    /* 1. a chat choice's opening chunks */
    if (chat && !ch->sent_role) { /* the first chunk of each choice says who speaks (before any token) */
        const char role[] = "\"role\":\"assistant\",\"content\":\"\"";
        send_delta(S, r, ci, role, sizeof role - 1, NULL, NULL, 0);
        ch->sent_role = 1;
        if (r->chat_echo && r->chat_echo[0]) { /* then the echo, in a chunk of its own */
            sb_puts(&b, "\"content\":");
            sb_json_cstr(&b, r->chat_echo);
            send_delta(S, r, ci, b.s, b.len, NULL, NULL, 0);
            b.len = 0;
        }
    }
    /* 2. what this event adds; nothing: no chunk */
    const srv_prompt *pr = (const srv_prompt *)ev->user;
    int echo_now = !chat && r->echo && pr->echo_text && !ch->echoed; /* the prompt before the first text */
    int prompt_lp_now = r->prompt_logprobs >= 0 && pr->lp && !ch->sent_prompt_lp; /* in the first chunk */
    ch->echoed |= echo_now;
    if (!ev->text_len && !ev->finish && !echo_now && !prompt_lp_now && !(ev->n_tokens && r->logprobs >= 0)) {
        sb_free(&b);
        return;
    }
    /* 3. a chat read for thinking or calls: stream_read_reply sends what each part gained */
    if (chat && (r->tool_calls || r->reasoning)) { /* the reply read again: what it adds to each part */
        sbuf lp = {0};
        if (r->logprobs > 0 && ev->n_tokens) {
            sbuf entries = {0};
            add_logprobs(S, r, ch, ev, &entries, 0);
            sb_puts(&lp, "{\"content\":[");
            sb_put(&lp, entries.s ? entries.s : "", entries.len);
            sb_puts(&lp, "]}");
            sb_free(&entries);
        }
        if (ev->text_len) sb_put(&ch->text, ev->text, (size_t)ev->text_len);
        int calls = stream_read_reply(S, r, ci, ch, ev->finish != 0, lp.len ? lp.s : NULL);
        if (ev->finish)
            send_delta(S, r, ci, "", 0,
                       calls && ev->finish == LLM_FINISH_STOP ? "tool_calls" : finish_name(ev->finish), NULL,
                       ch->n_tokens);
        sb_free(&lp); sb_free(&b);
        return;
    }
    /* 4. else one chunk: a chat's delta and logprobs, or a completion's text (the echo first) and its four
     * logprobs lists, which are sent and emptied each chunk (choice_reset_logprobs) */
    put_header_fields(&b, S, r, chat ? "chat.completion.chunk" : "text_completion");
    sb_printf(&b, ",\"choices\":[{\"index\":%d,", ci);
    size_t echo_len = echo_now ? strlen(pr->echo_text) : 0;
    if (chat) {
        sb_puts(&b, "\"delta\":{");
        if (ev->text_len) { sb_puts(&b, "\"content\":"); sb_json_str(&b, ev->text, (size_t)ev->text_len); }
        sb_puts(&b, "},\"logprobs\":");
        if (r->logprobs > 0 && ev->n_tokens) {
            sbuf lp = {0};
            add_logprobs(S, r, ch, ev, &lp, 0);
            sb_puts(&b, "{\"content\":["); sb_put(&b, lp.s ? lp.s : "", lp.len); sb_puts(&b, "]}");
            sb_free(&lp);
        } else sb_puts(&b, "null");
    } else {
        sbuf text = {0};
        if (echo_now) sb_puts(&text, pr->echo_text);
        sb_put(&text, ev->text ? ev->text : "", (size_t)ev->text_len);
        sb_puts(&b, "\"text\":");
        sb_json_str(&b, text.s ? text.s : "", text.len);
        sb_free(&text);
        sb_puts(&b, ",\"logprobs\":");
        int echo_lp = echo_now && r->logprobs >= 0 && pr->lp; /* the prompt's tokens first */
        if (r->logprobs >= 0 && (ev->n_tokens || echo_lp)) {
            if (echo_lp) add_prompt_logprobs(S, r, ch, pr, ch->text_offset);
            add_logprobs(S, r, ch, ev, NULL, ch->text_offset + echo_len);
            put_completion_logprobs(&b, ch);
            choice_reset_logprobs(ch);
        } else sb_puts(&b, "null");
    }
    ch->text_offset += echo_len + (size_t)ev->text_len;
    /* 5. the finish reason (null until the last), the prompt's logprobs once, the usage so far */
    if (ev->finish) { sb_puts(&b, ",\"finish_reason\":"); sb_json_cstr(&b, finish_name(ev->finish)); }
    else sb_puts(&b, ",\"finish_reason\":null");
    if (prompt_lp_now) { put_prompt_logprobs(&b, S, r, pr); ch->sent_prompt_lp = 1; }
    sb_puts(&b, "}]");
    put_chunk_usage(&b, r, ci, ch->n_tokens);
    sb_puts(&b, "}");
    send_sse(S, r->conn, NULL, b.s, b.len);
    sb_free(&b);
}

/* The end of a request whose every choice has finished. A stream's status line went out with its first
 * chunk, so an error now is an SSE error event, then (include_usage) a chunk with no choices and the usage,
 * then data: [DONE] and the chunked body's last chunk, as vLLM ends a stream. A whole response is one body:
 * every choice in index order (prompt i / n's samples together) with its text or message, logprobs and
 * finish reason ("tool_calls" when a read reply called), then the usage; or a 500 with the engine's
 * error. */
static void finish_request(srv_state *S, srv_req *r) {
    srv_conn *c = r->conn;
    if (!c) return;
    if (r->api == API_MESSAGES) { msgs_finish(S, r); return; } /* Anthropic's message, or its stream's end */
    if (r->resp) { resp_finish(S, r); return; } /* the Responses API's own shape */
    /* 1. a stream: the tail of the stream */
    if (r->stream) {
        if (r->error[0]) { /* the stream cannot change its status now: an error event, as vLLM sends */
            sbuf b = {0};
            sb_puts(&b, "{\"error\":{\"message\":"); sb_json_cstr(&b, r->error);
            sb_puts(&b, ",\"type\":\"server_error\",\"param\":null,\"code\":500}}");
            send_sse(S, c, NULL, b.s, b.len);
            sb_free(&b);
        }
        if (r->include_usage) {
            sbuf b = {0};
            put_header_fields(&b, S, r, r->kind == REQ_CHAT ? "chat.completion.chunk" : "text_completion");
            sb_puts(&b, ",\"choices\":[],");
            put_usage(&b, r);
            sb_puts(&b, "}");
            send_sse(S, c, NULL, b.s, b.len);
            sb_free(&b);
        }
        const char done[] = "[DONE]";
        send_sse(S, c, NULL, done, sizeof done - 1);
        conn_send(S, c, "0\r\n\r\n", 5); /* the chunked body's end */
        return;
    }
    /* 2. a whole response: the error, or every choice's object (an embedding's: its vectors) */
    if (r->error[0]) { send_error(S, c, 500, NULL, "%s", r->error); return; }
    if (r->kind == REQ_EMBED) { embed_finish(S, r); return; }
    if (r->kind == REQ_RERANK || r->kind == REQ_SCORE) { rerank_finish(S, r); return; }
    sbuf b = {0};
    int chat = r->kind == REQ_CHAT;
    put_header_fields(&b, S, r, chat ? "chat.completion" : "text_completion");
    sb_puts(&b, ",\"choices\":[");
    for (int i = 0; i < r->n_prompts * r->n; i++) {
        srv_choice *ch = &r->choices[i];
        sb_printf(&b, "%s{\"index\":%d,", i ? "," : "", i);
        int calls = 0;
        if (chat) {
            if (r->tool_calls || r->reasoning) calls = put_read_message(&b, r, i, ch);
            else {
                sbuf content = {0};
                sb_puts(&content, r->chat_echo ? r->chat_echo : "");
                sb_put(&content, ch->text.s ? ch->text.s : "", ch->text.len);
                sb_puts(&b, "\"message\":{\"role\":\"assistant\",\"content\":");
                sb_json_str(&b, content.s ? content.s : "", content.len);
                sb_puts(&b, ",\"refusal\":null}");
                b.failed |= content.failed;
                sb_free(&content);
            }
            sb_puts(&b, ",\"logprobs\":");
            if (r->logprobs > 0) {
                sb_puts(&b, "{\"content\":[");
                sb_put(&b, ch->logprobs.s ? ch->logprobs.s : "", ch->logprobs.len);
                sb_puts(&b, "]}");
            } else sb_puts(&b, "null");
        } else {
            sb_puts(&b, "\"text\":");
            sb_json_str(&b, ch->text.s ? ch->text.s : "", ch->text.len);
            sb_puts(&b, ",\"logprobs\":");
            if (r->logprobs >= 0) put_completion_logprobs(&b, ch); else sb_puts(&b, "null");
        }
        sb_puts(&b, ",\"finish_reason\":");
        sb_json_cstr(&b, calls && ch->finish == LLM_FINISH_STOP ? "tool_calls" : finish_name(ch->finish));
        if (r->prompt_logprobs >= 0) put_prompt_logprobs(&b, S, r, &r->prompts[i / r->n]);
        sb_puts(&b, "}");
    }
    sb_puts(&b, "],");
    put_usage(&b, r);
    sb_puts(&b, "}");
    if (b.failed) send_error(S, c, 500, NULL, "out of memory writing the response");
    else send_response(S, c, 200, "application/json", b.s, b.len, NULL);
    sb_free(&b);
}

/* ===========================================================================================================
 * The engine's events, on the network thread: each adds to its request's response
 *
 * apply_event is where an engine output meets its request: the clocks the metrics need (queue, first token,
 * the gaps between tokens), the choice's tokens and finish, then the text sent (stream_event) or kept for
 * finish_request. request_done runs when the request's last choice finishes. A request whose client has
 * gone (r->conn NULL) is counted and freed the same way; nothing is written for it.
 * ======================================================================================================== */
/* Every choice of r has finished: the request's finish reason (the worst of its choices': error, abort,
 * length, stop), the metrics, one log line, the response's end; its connection is free for its next request,
 * and r is freed. */
static void request_done(srv_state *S, srv_req *r) {
    double t = now_s();
    int worst = LLM_FINISH_STOP;
    for (int i = 0; i < r->n_prompts * r->n; i++)
        if (r->choices[i].finish > worst && r->choices[i].finish <= LLM_FINISH_ERROR)
            worst = r->choices[i].finish;
    const char *reason = finish_name(worst);
    S->success[worst]++;
    hist_add(&S->e2e, t - r->t_arrival);
    /* vLLM's per-request phases, for each engine request (a prompt, its n samples together): waiting from
     * arrival until the step that first ran it began, prefill until its first token, decode until its last.
     * A prompt longer than one step's token budget shows its earlier chunks as waiting. */
    int cached = 0;
    for (int i = 0; i < r->n_prompts; i++) {
        srv_prompt *sp = &r->prompts[i];
        cached += sp->n_cached;
        if (!sp->started) continue;
        hist_add(&S->queue, sp->t_scheduled - r->t_arrival);
        hist_add(&S->req_prompt, sp->n_prompt);
        hist_add(&S->req_gen, sp->n_generated);
        if (!sp->t_first) continue;
        hist_add(&S->prefill, sp->t_first - sp->t_scheduled);
        hist_add(&S->decode, sp->t_last - sp->t_first);
        hist_add(&S->inference, sp->t_last - sp->t_scheduled);
    }
    fprintf(stderr, "llm serve: %s %s: prompt %d tokens (%d cached), output %d tokens, TTFT %.3f s, %.3f s, "
            "%s%s%s\n", r->id, r->conn ? r->conn->peer : "(gone)", r->prompt_tokens, cached,
            r->completion_tokens, r->t_first ? r->t_first - r->t_arrival : 0.0, t - r->t_arrival, reason,
            r->error[0] ? ": " : "", r->error);
    srv_conn *c = r->conn;
    if (c) {
        finish_request(S, r);
        c->request_id[0] = 0; c->cors[0] = 0; /* a stream's end: the next request has its own */
        c->api = API_OPENAI;
        c->req = NULL;
        c->t_last_active = t;
        if (!c->keep_alive) c->closing = 1;
    }
    for (ptrdiff_t i = 0; i < arrlen(S->live); i++) if (S->live[i] == r) { arrdelswap(S->live, i); break; }
    req_free(r);
}

/* One event into its request: ev->user is the srv_prompt attach_generation gave the engine, ev->index the
 * sample, and the choice is prompt * n + sample. */
static void apply_event(srv_state *S, srv_event *ev) {
    /* 1. the choice; the prompt's logprobs move from the event to the prompt (the event is freed after
     * this), where every sample of the prompt reads them */
    srv_prompt *sp = (srv_prompt *)ev->user;
    srv_req *r = sp->req;
    int ci = sp->index * r->n + ev->index;
    if (ci < 0 || ci >= r->n_prompts * r->n) return;
    srv_choice *ch = &r->choices[ci];
    if (ev->prompt_lp && !sp->lp) { sp->lp = ev->prompt_lp; ev->prompt_lp = NULL; } /* for each choice */
    if (ev->embedding && !sp->embedding) { /* an embedding's vector, for embed_finish */
        sp->embedding = ev->embedding; sp->n_embedding = ev->n_embedding; ev->embedding = NULL;
    }
    /* 2. scoring (echo and max_tokens 0) asks the engine for 1 token, and that token is dropped here */
    if (r->score_only) { /* the one token computed for nothing: no completion, as if max_tokens ran out */
        ev->n_tokens = 0; ev->text_len = 0;
        if (ev->finish == LLM_FINISH_STOP) ev->finish = LLM_FINISH_LENGTH;
    }
    /* 3. the clocks. A prompt's first output: it has left the waiting queue (n_queued, which --max-queue
     * bounds), and the step that ran it began at t_step. TTFT is the request's first token; an inter-token
     * gap is measured between two outputs of the request that came in different steps, so the n choices
     * of one step add one gap, as vLLM measures per request */
    if (!sp->started) {
        sp->started = 1; S->n_queued--; S->prompt_tokens_total += ev->n_prompt;
        sp->t_scheduled = ev->t_step;
    }
    sp->n_cached = ev->n_cached;
    if (ev->n_tokens) {
        if (!sp->t_first) sp->t_first = ev->t;
        sp->t_last = ev->t;
        sp->n_generated += ev->n_tokens;
        if (!r->t_first) { r->t_first = ev->t; hist_add(&S->ttft, ev->t - r->t_arrival); }
        else if (ev->t > r->t_last) hist_add(&S->itl, ev->t - r->t_last);
        r->t_last = ev->t;
        ch->n_tokens += ev->n_tokens;
        r->completion_tokens += ev->n_tokens;
    }
    /* 4. the choice's finish; the request keeps the first error of its choices */
    if (ev->finish) {
        ch->finish = ev->finish; ch->stop_string = ev->stop_string;
        if (ev->finish == LLM_FINISH_ERROR && !r->error[0])
            snprintf(r->error, sizeof r->error, "%s", ev->error ? ev->error : "the engine failed");
    }
    /* 5. the response: a stream sends a chunk now; a whole response collects the choice's text (the echoed
     * prompt first, and its logprobs) and logprobs, with offsets into that text, for finish_request. A
     * client gone (conn NULL) gets nothing, but its request is counted and freed as any other */
    if (r->conn) {
        if (r->resp) resp_output(S, r, ch, ev);
        else if (r->stream) stream_event(S, r, ci, ch, ev);
        else {
            if (r->echo && sp->echo_text && !ch->echoed) {
                if (r->logprobs >= 0) add_prompt_logprobs(S, r, ch, sp, ch->text.len);
                sb_puts(&ch->text, sp->echo_text);
                ch->echoed = 1;
            }
            if (r->logprobs >= 0 && ev->n_tokens)
                add_logprobs(S, r, ch, ev, &ch->logprobs, ch->text.len);
            if (ev->text_len) sb_put(&ch->text, ev->text, (size_t)ev->text_len);
        }
    }
    /* 6. the last choice to finish ends the request and frees it: r is not used after this line */
    if (ev->finish && --r->n_open == 0) request_done(S, r);
}

/* Events from the engine thread, applied in order. */
static void drain_events(srv_state *S) {
    pthread_mutex_lock(&S->lock);
    srv_event *evs = S->events;
    S->events = NULL;
    pthread_mutex_unlock(&S->lock);
    for (ptrdiff_t i = 0; i < arrlen(evs); i++) { apply_event(S, &evs[i]); srv_event_free(&evs[i]); }
    arrfree(evs);
}

/* ===========================================================================================================
 * Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens
 *
 * Not a second chat path: the body is translated, on the worker (msgs_job), into the chat completions body
 * this server already takes (msgs_to_chat: system and messages with their text, tool_use, tool_result and
 * thinking blocks; tools with input_schema; tool_choice; max_tokens; stop_sequences; thinking), which
 * prepare_generation then reads as any chat: the same template, tool-call grammar, reasoning split and
 * sampling. What comes back is written in Anthropic's shape from the same reading of the reply
 * (llm_chat_parse_reply): content blocks (thinking, text, tool_use) in a message object (msgs_finish), or,
 * streamed, as Anthropic's events (msgs_stream_event): message_start, then for each block
 * content_block_start, its deltas and content_block_stop, then one message_delta (stop_reason, usage) and
 * message_stop. Every field Anthropic defines that this server does not implement (images, documents,
 * server tools, MCP servers, containers...) is a 400 naming it; errors have Anthropic's shape (send_error
 * reads the route's c->api). Sizes: the chat body written is at most a few times the request's (escapes),
 * which SRV_MAX_BODY bounds; its depth is the parsed body's (llm_json's limit); no recursion here.
 * ======================================================================================================== */
/* The top-level fields: those read below, and those at a value that asks for nothing; every other one
 * Anthropic defines asks for what this server has not (fv_never: a 400 naming it). Unknown names are
 * ignored and logged, as the chat endpoints do. */
static int fv_service_tier(const llm_json *v, const llm_json *b) {
    (void)b;
    return fv_str(v, "auto") || fv_str(v, "standard_only");
}
static int fv_speed(const llm_json *v, const llm_json *b) { (void)b; return fv_str(v, "standard"); }
static const srv_field msgs_fields[] = {
    {"model", fv_any}, {"messages", fv_any}, {"max_tokens", fv_any}, {"system", fv_any},
    {"stop_sequences", fv_any}, {"temperature", fv_any}, {"top_p", fv_any}, {"top_k", fv_any},
    {"stream", fv_any}, {"tools", fv_any}, {"tool_choice", fv_any}, {"thinking", fv_any},
    {"metadata", fv_any}, {"service_tier", fv_service_tier}, {"speed", fv_speed},
    /* attribution, and a cache hint that asks for what the prefix cache does anyway */
    {"user_profile_id", fv_any}, {"workspace_id", fv_any}, {"cache_control", fv_any},
    {"container", fv_never}, {"mcp_servers", fv_never}, {"context_management", fv_never},
    {"output_config", fv_never}, {"output_format", fv_never}, {"inference_geo", fv_never},
    {"diagnostics", fv_never},
};

/* The text of a block list's text blocks (a tool_result's content, the system's): a string, or a list of
 * {"type": "text", "text"} blocks (cache_control and citations aside), joined by newlines; any other block
 * is a 400 naming it at path. Appended to out. */
static int msgs_text_blocks(const llm_json *c, const char *path, sbuf *out, srv_error *e) {
    if (c->type == LLM_JSON_STRING) { sb_put(out, c->str, c->len); return 0; }
    if (c->type != LLM_JSON_ARRAY) return bad(e, 400, NULL, "%s: must be a string or a list of blocks", path);
    for (int k = 0; k < c->n; k++) {
        const llm_json *t = llm_json_get(&c->items[k], "type"), *text = llm_json_get(&c->items[k], "text");
        if (!fv_str(t, "text") || !text || text->type != LLM_JSON_STRING)
            return bad(e, 400, NULL, "%s.%d.type: %.40s blocks are not supported by this server here (only "
                       "text)", path, k, t && t->type == LLM_JSON_STRING ? t->str : "untyped");
        if (k) sb_puts(out, "\n");
        sb_put(out, text->str, text->len);
    }
    return 0;
}

/* One chat message {"role", "content": text} appended to the "messages" list being written */
static void msgs_put_chat_message(sbuf *out, int *n_out, const char *role, const char *text, size_t len) {
    sb_printf(out, "%s{\"role\":\"%s\",\"content\":", (*n_out)++ ? "," : "", role);
    sb_json_str(out, text ? text : "", len);
    sb_puts(out, "}");
}

/* Message i of Anthropic's list as chat messages, appended to out. A user's text blocks become one user
 * message and each tool_result a tool message (in their order); an assistant's text, thinking and tool_use
 * blocks one assistant message (content, reasoning_content, tool_calls). Other blocks: a 400 naming them. */
static int msgs_message(const llm_json *m, int i, sbuf *out, int *n_out, srv_error *e) {
    const llm_json *role = llm_json_get(m, "role"), *c = llm_json_get(m, "content");
    int user = fv_str(role, "user");
    if (m->type != LLM_JSON_OBJECT || (!user && !fv_str(role, "assistant")))
        return bad(e, 400, NULL, "messages.%d.role: must be user or assistant", i);
    if (!c || (c->type != LLM_JSON_STRING && c->type != LLM_JSON_ARRAY))
        return bad(e, 400, NULL, "messages.%d.content: must be a string or a list of content blocks", i);
    if (c->type == LLM_JSON_STRING) {
        msgs_put_chat_message(out, n_out, user ? "user" : "assistant", c->str, c->len);
        return 0;
    }
    sbuf text = {0}, thinking = {0}, calls = {0};
    int n_text = 0, rc = 0;
    for (int k = 0; k < c->n && !rc; k++) {
        const llm_json *b = &c->items[k], *type = llm_json_get(b, "type");
        const char *t = type && type->type == LLM_JSON_STRING ? type->str : "";
        char path[64];
        snprintf(path, sizeof path, "messages.%d.content.%d", i, k);
        if (!strcmp(t, "text")) {
            const llm_json *x = llm_json_get(b, "text");
            if (!x || x->type != LLM_JSON_STRING) {
                rc = bad(e, 400, NULL, "%s.text: must be a string", path);
                break;
            }
            if (n_text++) sb_puts(&text, "\n");
            sb_put(&text, x->str, x->len);
        } else if (!strcmp(t, "tool_result") && user) { /* the text before it goes first, as written */
            const llm_json *id = llm_json_get(b, "tool_use_id"), *content = llm_json_get(b, "content");
            const llm_json *is_error = llm_json_get(b, "is_error");
            if (!id || id->type != LLM_JSON_STRING) {
                rc = bad(e, 400, NULL, "%s.tool_use_id: must be a string", path);
                break;
            }
            if (n_text) msgs_put_chat_message(out, n_out, "user", text.s, text.len);
            text.len = 0; n_text = 0;
            sbuf result = {0};
            if (is_error && is_error->type == LLM_JSON_TRUE) sb_puts(&result, "Error: ");
            if (content && content->type != LLM_JSON_NULL) {
                char cpath[80];
                snprintf(cpath, sizeof cpath, "%s.content", path);
                rc = msgs_text_blocks(content, cpath, &result, e);
            }
            sb_printf(out, "%s{\"role\":\"tool\",\"tool_call_id\":", (*n_out)++ ? "," : "");
            sb_json_str(out, id->str, id->len);
            sb_puts(out, ",\"content\":");
            sb_json_str(out, result.s ? result.s : "", result.len);
            sb_puts(out, "}");
            sb_free(&result);
        } else if (!strcmp(t, "tool_use") && !user) {
            const llm_json *id = llm_json_get(b, "id"), *name = llm_json_get(b, "name");
            const llm_json *input = llm_json_get(b, "input");
            if (!id || id->type != LLM_JSON_STRING || !name || name->type != LLM_JSON_STRING || !input ||
                input->type != LLM_JSON_OBJECT) {
                rc = bad(e, 400, NULL, "%s: a tool_use block is {\"id\", \"name\", \"input\": {...}}", path);
                break;
            }
            sb_puts(&calls, calls.len ? ",{\"id\":" : "{\"id\":");
            sb_json_str(&calls, id->str, id->len);
            sb_puts(&calls, ",\"type\":\"function\",\"function\":{\"name\":");
            sb_json_str(&calls, name->str, name->len);
            sb_puts(&calls, ",\"arguments\":");
            sb_json_value(&calls, input);
            sb_puts(&calls, "}}");
        } else if (!strcmp(t, "thinking") && !user) { /* its signature is ours or another's: not checked */
            const llm_json *x = llm_json_get(b, "thinking");
            if (!x || x->type != LLM_JSON_STRING) {
                rc = bad(e, 400, NULL, "%s.thinking: must be a string", path);
                break;
            }
            sb_put(&thinking, x->str, x->len);
        } else if (!strcmp(t, "redacted_thinking") && !user) {
            /* opaque (another server's encrypted thinking): nothing a template can show */
        } else
            rc = bad(e, 400, NULL, "%s.type: %s%.40s%s blocks are not supported by this server (a %s message "
                     "takes %s)", path, t[0] ? "" : "untyped", t, t[0] ? "" : "", user ? "user" : "assistant",
                     user ? "text and tool_result" : "text, thinking, redacted_thinking and tool_use");
    }
    if (!rc && (user ? n_text > 0 : 1)) {
        if (user) msgs_put_chat_message(out, n_out, "user", text.s, text.len);
        else {
            sb_printf(out, "%s{\"role\":\"assistant\",\"content\":", (*n_out)++ ? "," : "");
            sb_json_str(out, text.s ? text.s : "", text.len);
            if (thinking.len) {
                sb_puts(out, ",\"reasoning_content\":");
                sb_json_str(out, thinking.s, thinking.len);
            }
            if (calls.len) {
                sb_puts(out, ",\"tool_calls\":[");
                sb_put(out, calls.s, calls.len);
                sb_puts(out, "]");
            }
            sb_puts(out, "}");
        }
    }
    out->failed |= text.failed | thinking.failed | calls.failed;
    sb_free(&text); sb_free(&thinking); sb_free(&calls);
    return rc;
}

/* Anthropic's body as the chat completions body prepare_generation reads, written into out (JSON text):
 * each field checked and named in Anthropic's terms ("max_tokens: Field required",
 * "messages.1.content.0.type: ..."), e's param left empty. count: count_tokens' body (no max_tokens). */
static int msgs_to_chat(srv_state *S, const llm_json *body, int count, sbuf *out, srv_error *e) {
    /* 1. the fields: known, or refused, or unknown (logged) */
    const srv_field *rule;
    int refused = refused_field(S, body, msgs_fields, sizeof msgs_fields / sizeof *msgs_fields, 0, &rule);
    if (refused >= 0) return bad(e, 400, NULL, "%s: not supported by this server", body->keys[refused]);
    /* 2. the numbers: max_tokens (required, as Anthropic), temperature in Anthropic's range, top_p, top_k
     * (prepare_generation checks these two under the same names) */
    const llm_json *v = llm_json_get(body, "model");
    sb_puts(out, "{");
    if (v && v->type != LLM_JSON_NULL) {
        sb_puts(out, "\"model\":");
        sb_json_value(out, v);
        sb_puts(out, ",");
    }
    v = llm_json_get(body, "max_tokens");
    double max_tokens = 0, x = -1;
    if (!count) {
        if (!v || v->type == LLM_JSON_NULL) return bad(e, 400, NULL, "max_tokens: Field required");
        if (v->type != LLM_JSON_NUMBER || v->num != floor(v->num) || v->num < 1 || v->num > 1 << 30)
            return bad(e, 400, NULL, "max_tokens: must be an integer of at least 1");
        max_tokens = v->num;
        sb_printf(out, "\"max_tokens\":%d,", (int)max_tokens);
    }
    if (get_number(body, "temperature", 0, 1, 0, &x, e)) {
        char why[sizeof e->msg];
        snprintf(why, sizeof why, "%s", e->msg);
        return bad(e, 400, NULL, "temperature: %s", why);
    }
    if (x >= 0) { sb_puts(out, "\"temperature\":"); sb_json_float(out, x); sb_puts(out, ","); }
    static const char *const copied[] = {"top_p", "top_k", "stream"};
    for (size_t k = 0; k < 3; k++)
        if ((v = llm_json_get(body, copied[k])) && v->type != LLM_JSON_NULL && !(count && k == 2)) {
            sb_printf(out, "\"%s\":", copied[k]);
            sb_json_value(out, v);
            sb_puts(out, ",");
        }
    /* 3. stop_sequences: a list of strings, at most SRV_MAX_STOPS */
    if ((v = llm_json_get(body, "stop_sequences")) && v->type != LLM_JSON_NULL) {
        int ok = v->type == LLM_JSON_ARRAY && v->n <= SRV_MAX_STOPS;
        for (int i = 0; ok && i < v->n; i++) ok = v->items[i].type == LLM_JSON_STRING;
        if (!ok)
            return bad(e, 400, NULL, "stop_sequences: must be a list of at most %d strings", SRV_MAX_STOPS);
        sb_puts(out, "\"stop\":");
        sb_json_value(out, v);
        sb_puts(out, ",");
    }
    /* 4. metadata.user_id: a string that changes no output */
    if ((v = llm_json_get(body, "metadata")) && v->type != LLM_JSON_NULL) {
        const llm_json *u = llm_json_get(v, "user_id");
        if (v->type != LLM_JSON_OBJECT || (u && u->type != LLM_JSON_NULL && u->type != LLM_JSON_STRING))
            return bad(e, 400, NULL, "metadata: must be an object {\"user_id\": a string}");
        for (int i = 0; i < v->n; i++)
            if (strcmp(v->keys[i], "user_id"))
                return bad(e, 400, NULL, "metadata.%.40s: Extra inputs are not permitted", v->keys[i]);
    }
    /* 5. thinking: enabled (with a budget, checked as Anthropic checks it) or disabled, as the template's
     * switch; absent is disabled, Anthropic's default. A thinking block the template writes anyway (a
     * family whose prompt opens it) is read apart and dropped unless asked for. The budget is enforced:
     * it goes on as vLLM's thinking_token_budget (the thinking cut there, "</think>" forced) */
    int think = 0, budget_tokens = 0;
    if ((v = llm_json_get(body, "thinking")) && v->type != LLM_JSON_NULL) {
        const llm_json *type = llm_json_get(v, "type"), *budget = llm_json_get(v, "budget_tokens");
        if (v->type != LLM_JSON_OBJECT || (!fv_str(type, "enabled") && !fv_str(type, "disabled")))
            return bad(e, 400, NULL, "thinking.type: must be enabled or disabled");
        think = fv_str(type, "enabled");
        if (think && (!budget || budget->type != LLM_JSON_NUMBER || budget->num != floor(budget->num) ||
                      budget->num < 1024))
            return bad(e, 400, NULL, "thinking.budget_tokens: must be an integer of at least 1024");
        if (think && !count && budget->num >= max_tokens)
            return bad(e, 400, NULL, "thinking.budget_tokens: must be less than max_tokens");
        if (think && !S->chat.thinks)
            return bad(e, 400, NULL, "thinking: this model's chat template does not think");
        if (think && !count) budget_tokens = (int)budget->num; /* < max_tokens */
    }
    sb_printf(out, "\"chat_template_kwargs\":{\"enable_thinking\":%s},\"include_reasoning\":%s,",
              think ? "true" : "false", think ? "true" : "false");
    if (think && !count) sb_printf(out, "\"thinking_token_budget\":%d,", budget_tokens);
    /* 6. tools: custom tools (name, description, input_schema) as functions; server tools refused */
    const llm_json *tools = llm_json_get(body, "tools");
    if (tools && tools->type != LLM_JSON_NULL) {
        if (tools->type != LLM_JSON_ARRAY) return bad(e, 400, NULL, "tools: must be a list");
        sb_puts(out, "\"tools\":[");
        for (int i = 0; i < tools->n; i++) {
            const llm_json *t = &tools->items[i], *type = llm_json_get(t, "type");
            const llm_json *name = llm_json_get(t, "name"), *desc = llm_json_get(t, "description");
            const llm_json *schema = llm_json_get(t, "input_schema");
            if (t->type != LLM_JSON_OBJECT) return bad(e, 400, NULL, "tools.%d: must be an object", i);
            if (type && type->type != LLM_JSON_NULL && !fv_str(type, "custom"))
                return bad(e, 400, NULL, "tools.%d.type: %.60s tools are not supported by this server (only "
                           "custom tools: name, description, input_schema)", i,
                           type->type == LLM_JSON_STRING ? type->str : "such");
            if (!name || name->type != LLM_JSON_STRING || !name->len)
                return bad(e, 400, NULL, "tools.%d.name: must be a non-empty string", i);
            if (!schema || schema->type != LLM_JSON_OBJECT)
                return bad(e, 400, NULL, "tools.%d.input_schema: Field required (a JSON Schema object)", i);
            if (desc && desc->type != LLM_JSON_NULL && desc->type != LLM_JSON_STRING)
                return bad(e, 400, NULL, "tools.%d.description: must be a string", i);
            sb_puts(out, i ? ",{\"type\":\"function\",\"function\":{\"name\":" :
                             "{\"type\":\"function\",\"function\":{\"name\":");
            sb_json_str(out, name->str, name->len);
            if (desc && desc->type == LLM_JSON_STRING) {
                sb_puts(out, ",\"description\":");
                sb_json_str(out, desc->str, desc->len);
            }
            sb_puts(out, ",\"parameters\":");
            sb_json_value(out, schema);
            sb_puts(out, "}}");
        }
        sb_puts(out, "],");
    }
    /* 7. tool_choice: auto, any (a call: required), tool (that one), none; disable_parallel_tool_use */
    if ((v = llm_json_get(body, "tool_choice")) && v->type != LLM_JSON_NULL) {
        const llm_json *type = llm_json_get(v, "type"), *name = llm_json_get(v, "name");
        const llm_json *one = llm_json_get(v, "disable_parallel_tool_use");
        if (v->type != LLM_JSON_OBJECT || !type || type->type != LLM_JSON_STRING)
            return bad(e, 400, NULL, "tool_choice: must be {\"type\": auto, any, tool or none}");
        if (one && one->type != LLM_JSON_NULL && one->type != LLM_JSON_TRUE && one->type != LLM_JSON_FALSE)
            return bad(e, 400, NULL, "tool_choice.disable_parallel_tool_use: must be a boolean");
        if (fv_str(type, "tool")) {
            if (!name || name->type != LLM_JSON_STRING)
                return bad(e, 400, NULL, "tool_choice.name: Field required");
            sb_puts(out, "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":");
            sb_json_str(out, name->str, name->len);
            sb_puts(out, "}},");
        } else if (fv_str(type, "auto") || fv_str(type, "any") || fv_str(type, "none"))
            sb_printf(out, "\"tool_choice\":\"%s\",", fv_str(type, "any") ? "required" : type->str);
        else return bad(e, 400, NULL, "tool_choice.type: must be auto, any, tool or none");
        if (one && one->type == LLM_JSON_TRUE) sb_puts(out, "\"parallel_tool_calls\":false,");
    }
    /* 8. the messages: the system first (a string or text blocks; Claude Code's per-request billing
     * header block dropped: it changes nothing the model should read and would defeat the prefix cache),
     * then each message's blocks; a last assistant message is continued (Anthropic's prefill) */
    const llm_json *msgs = llm_json_get(body, "messages");
    if (!msgs || msgs->type != LLM_JSON_ARRAY || !msgs->n)
        return bad(e, 400, NULL, "messages: must be a non-empty list");
    int n_out = 0;
    sb_puts(out, "\"messages\":[");
    if ((v = llm_json_get(body, "system")) && v->type != LLM_JSON_NULL) {
        sbuf sys = {0};
        llm_json kept = *v;
        llm_json *items = NULL;
        if (v->type == LLM_JSON_ARRAY) { /* the blocks but the billing header's */
            items = (llm_json *)calloc((size_t)v->n + 1, sizeof *items);
            if (!items) return bad(e, 500, NULL, "out of memory");
            kept.n = 0; kept.items = items;
            for (int k = 0; k < v->n; k++) {
                const llm_json *t = llm_json_get(&v->items[k], "text");
                if (!(t && t->type == LLM_JSON_STRING && !strncmp(t->str, "x-anthropic-billing-header", 26)))
                    items[kept.n++] = v->items[k];
            }
        }
        int rc = msgs_text_blocks(&kept, "system", &sys, e);
        if (!rc && sys.len) msgs_put_chat_message(out, &n_out, "system", sys.s, sys.len);
        free(items); sb_free(&sys);
        if (rc) return -1;
    }
    for (int i = 0; i < msgs->n; i++)
        if (msgs_message(&msgs->items[i], i, out, &n_out, e)) return -1;
    sb_puts(out, "]");
    if (fv_str(llm_json_get(&msgs->items[msgs->n - 1], "role"), "assistant"))
        sb_puts(out, ",\"add_generation_prompt\":false,\"continue_final_message\":true");
    sb_puts(out, "}");
    return out->failed ? bad(e, 500, NULL, "out of memory") : 0;
}

/* A worker's job for /v1/messages (a chat request prepared, answered as Anthropic's message) or
 * /v1/messages/count_tokens ({"input_tokens": N}: the prompt's tokens as /v1/messages counts them, tools
 * and all). The chat body stays in the job (chat_json) until the engine has the request: r's stop strings
 * point into it (and msg_stops copies them for the end, which stop_sequence names). */
static void msgs_job(srv_state *S, srv_job *j) {
    char jerr[LLM_ERR_LEN];
    int count = j->route == JOB_COUNT_TOKENS;
    sbuf chat = {0};
    int rc = msgs_to_chat(S, &j->json, count, &chat, &j->e);
    if (!rc && llm_json_parse(chat.s, chat.len, &j->chat_json, jerr) != 0)
        rc = bad(&j->e, 500, NULL, "the request could not be translated: %s", jerr);
    sb_free(&chat);
    if (rc) return;
    j->chat_json_ok = 1;
    if (count) {
        int32_t *ids = NULL;
        j->failed = check_model(S, &j->chat_json, &j->e) || chat_tokens(S, &j->chat_json, 1, &ids, &j->e);
        if (!j->failed) sb_printf(&j->answer, "{\"input_tokens\":%d}", (int)arrlen(ids));
        arrfree(ids);
        return;
    }
    srv_req *r = j->r = (srv_req *)calloc(1, sizeof *j->r);
    if (!r) { bad(&j->e, 500, NULL, "out of memory"); return; }
    r->t_arrival = j->t_arrival; r->api = API_MESSAGES;
    j->failed = prepare_generation(S, &j->chat_json, REQ_CHAT, j->request_id, r, &j->p, &j->e) != 0;
    for (int i = 0; !j->failed && i < r->n_stops; i++) {
        char *copy = strdup(r->stops[i]);
        if (!copy) { j->failed = 1; bad(&j->e, 500, NULL, "out of memory"); }
        else arrput(r->msg_stops, copy);
    }
}

/* ---- Anthropic's message out ------------------------------------------------------------------------- */
/* The message's id: "msg_" and 24 letters and digits drawn from the request's seed (the same in the stream's
 * message_start and anywhere else it is written) */
static void msgs_put_id(sbuf *b, const srv_req *r) {
    char id[32] = "msg_";
    put_id_chars(id + 4, 24, r->call_id_seed ^ 0x6d73675f6d736721ull);
    sb_json_cstr(b, id);
}

/* A thinking block's signature: opaque to the client, which sends it back with the block. Ours is not a
 * secret (nothing is checked on the way in): "llm1." and a hash of the thinking, so it is the same streamed
 * or not. */
static void msgs_put_signature(sbuf *b, const char *thinking) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = thinking; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    sb_printf(b, "\"llm1.%016llx\"", (unsigned long long)h);
}

/* usage as Anthropic counts it: input_tokens are the prompt's tokens the prefix cache did NOT have (the
 * cached ones are cache_read_input_tokens: the three together are the prompt), then output_tokens */
static void msgs_put_usage(sbuf *b, const srv_req *r) {
    int cached = req_cached_tokens(r);
    sb_printf(b, "\"usage\":{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,"
              "\"cache_read_input_tokens\":%d,\"output_tokens\":%d}", r->prompt_tokens - cached, cached,
              r->completion_tokens);
}

/* stop_reason and stop_sequence: tool_use (a call made), max_tokens (the length ran out), stop_sequence (a
 * stop string ended it: named), else end_turn */
static void msgs_put_stop(sbuf *b, const srv_req *r, const srv_choice *ch, int calls) {
    int s = ch->stop_string;
    const char *reason = calls && ch->finish == LLM_FINISH_STOP ? "tool_use" :
                         ch->finish == LLM_FINISH_LENGTH ? "max_tokens" :
                         s > 0 && s <= arrlen(r->msg_stops) ? "stop_sequence" : "end_turn";
    sb_printf(b, "\"stop_reason\":\"%s\",\"stop_sequence\":", reason);
    if (reason[0] == 's') sb_json_cstr(b, r->msg_stops[s - 1]); else sb_puts(b, "null");
}

/* A tool_use block's input: the call's arguments (the model's JSON text) when they are an object, else {} */
static void msgs_put_input(sbuf *b, const char *arguments) {
    llm_json v;
    int ok = llm_json_parse(arguments, strlen(arguments), &v, NULL) == 0;
    sb_puts(b, ok && v.type == LLM_JSON_OBJECT ? arguments : "{}");
    if (ok) llm_json_free(&v);
}

/* One content block's opening: a thinking block (empty), a text block (empty), or call k's tool_use
 * block (its id and name, input {}: the stream's deltas fill it; the whole message's puts its input) */
static void msgs_put_block(sbuf *b, const srv_req *r, const llm_chat_reply *rep, int kind) {
    if (kind == 1) { sb_puts(b, "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}"); return; }
    if (kind == 2) { sb_puts(b, "{\"type\":\"text\",\"text\":\"\"}"); return; }
    sb_puts(b, "{\"type\":\"tool_use\",\"id\":");
    put_tool_call_id(b, r, 0, kind - 3);
    sb_puts(b, ",\"name\":");
    sb_json_cstr(b, rep->calls[kind - 3].name);
    sb_puts(b, ",\"input\":{}}");
}

/* One of Anthropic's events: `event: TYPE` and its JSON, {"type": TYPE, ...the fields} */
static void msgs_send_event(srv_state *S, srv_req *r, const char *type, const char *fields) {
    sbuf b = {0};
    sb_printf(&b, "{\"type\":\"%s\"%s%s}", type, fields[0] ? "," : "", fields);
    send_sse(S, r->conn, type, b.s ? b.s : "{}", b.len);
    sb_free(&b);
}

/* The stream's open block closed (a thinking block gets its signature first); then, when kind is not 0,
 * a block of that kind started, at the next index */
static void msgs_switch_block(srv_state *S, srv_req *r, srv_choice *ch, const llm_chat_reply *rep, int kind) {
    sbuf f = {0};
    if (ch->msg_open == 1) {
        sb_printf(&f, "\"index\":%d,\"delta\":{\"type\":\"signature_delta\",\"signature\":",
                  ch->msg_blocks - 1);
        msgs_put_signature(&f, rep->reasoning ? rep->reasoning : "");
        sb_puts(&f, "}");
        msgs_send_event(S, r, "content_block_delta", f.s);
        f.len = 0;
    }
    if (ch->msg_open) {
        sb_printf(&f, "\"index\":%d", ch->msg_blocks - 1);
        msgs_send_event(S, r, "content_block_stop", f.s);
        f.len = 0;
    }
    ch->msg_open = kind;
    if (kind) {
        sb_printf(&f, "\"index\":%d,\"content_block\":", ch->msg_blocks++);
        msgs_put_block(&f, r, rep, kind);
        msgs_send_event(S, r, "content_block_start", f.s ? f.s : "");
    }
    sb_free(&f);
}

/* A delta of the open block: its type, the field and the piece of text */
static void msgs_send_delta(srv_state *S, srv_req *r, srv_choice *ch, const char *type, const char *field,
                            const char *piece, size_t n) {
    sbuf f = {0};
    sb_printf(&f, "\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":", ch->msg_blocks - 1, type, field);
    sb_json_str(&f, piece, n);
    sb_puts(&f, "}");
    msgs_send_event(S, r, "content_block_delta", f.s ? f.s : "");
    sb_free(&f);
}

/* An output of a streamed /v1/messages: the reply so far read again (as stream_read_reply does, with the
 * same invariant: each part of a partial reading begins the same part of every later one), and what each
 * part gained sent as a delta of its block, a block started whenever the part changes (thinking, text,
 * call k): message_start before the first, every block stopped at the end (then msgs_finish sends
 * message_delta and message_stop). A reply with no block at all gets one empty text block, as the whole
 * message has. */
static void msgs_stream_event(srv_state *S, srv_req *r, srv_choice *ch, const srv_event *ev) {
    if (!ch->sent_role) { /* message_start: the message, empty, with the prompt's usage */
        sbuf f = {0};
        sb_puts(&f, "\"message\":{\"id\":");
        msgs_put_id(&f, r);
        sb_puts(&f, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        sb_json_cstr(&f, S->model_name);
        sb_puts(&f, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,");
        msgs_put_usage(&f, r);
        sb_puts(&f, "}");
        msgs_send_event(S, r, "message_start", f.s ? f.s : "");
        sb_free(&f);
        ch->sent_role = 1;
    }
    if (ev->text_len) sb_put(&ch->text, ev->text, (size_t)ev->text_len);
    int final = ev->finish != 0;
    llm_chat_reply rep;
    const char *text = ch->text.s ? ch->text.s : "";
    if (llm_chat_parse_reply(&r->chat, text, ch->text.len, r->reasoning > 0, r->tool_calls, !final, &rep)) {
        llm_chat_reply_free(&rep);
        return;
    }
    /* the thinking (when asked for: else read apart and dropped), the text, then each call */
    size_t nr = rep.reasoning ? strlen(rep.reasoning) : 0, nc = strlen(rep.content);
    if (nr > ch->sent_reasoning && r->reasoning == 2) {
        if (ch->msg_open != 1) msgs_switch_block(S, r, ch, &rep, 1);
        msgs_send_delta(S, r, ch, "thinking_delta", "thinking", rep.reasoning + ch->sent_reasoning,
                        nr - ch->sent_reasoning);
    }
    if (nr > ch->sent_reasoning) ch->sent_reasoning = nr;
    if (nc > ch->sent_content) {
        if (ch->msg_open != 2) msgs_switch_block(S, r, ch, &rep, 2);
        msgs_send_delta(S, r, ch, "text_delta", "text", rep.content + ch->sent_content,
                        nc - ch->sent_content);
        ch->sent_content = nc;
    }
    int n_calls = rep.n_calls - (final ? rep.in_call : 0);
    for (int k = 0; k < n_calls; k++) {
        if (k >= arrlen(ch->sent_args)) {
            msgs_switch_block(S, r, ch, &rep, 3 + k);
            arrput(ch->sent_args, 0);
        }
        size_t na = strlen(rep.calls[k].arguments);
        if (na > ch->sent_args[k] && ch->msg_open == 3 + k) {
            msgs_send_delta(S, r, ch, "input_json_delta", "partial_json", rep.calls[k].arguments +
                            ch->sent_args[k], na - ch->sent_args[k]);
            ch->sent_args[k] = na;
        }
    }
    if (final) {
        if (!ch->msg_blocks) msgs_switch_block(S, r, ch, &rep, 2);
        msgs_switch_block(S, r, ch, &rep, 0);
    }
    llm_chat_reply_free(&rep);
}

/* The end of a /v1/messages request. Streamed: message_delta (stop_reason, stop_sequence, usage) and
 * message_stop, or after an engine error an error event; then the chunked body's end. Whole: the message
 * object, its content blocks from the reply read once (thinking when asked for, with its signature; text;
 * each tool_use with its input), or a 500 in Anthropic's shape. */
static void msgs_finish(srv_state *S, srv_req *r) {
    srv_conn *c = r->conn;
    srv_choice *ch = &r->choices[0];
    sbuf b = {0};
    if (r->stream) {
        if (r->error[0]) {
            sb_puts(&b, "\"error\":{\"type\":\"api_error\",\"message\":");
            sb_json_cstr(&b, r->error);
            sb_puts(&b, "}");
            msgs_send_event(S, r, "error", b.s ? b.s : "");
        } else {
            sb_puts(&b, "\"delta\":{");
            msgs_put_stop(&b, r, ch, arrlen(ch->sent_args) > 0);
            sb_printf(&b, "},\"usage\":{\"output_tokens\":%d}", r->completion_tokens);
            msgs_send_event(S, r, "message_delta", b.s ? b.s : "");
            msgs_send_event(S, r, "message_stop", "");
        }
        conn_send(S, c, "0\r\n\r\n", 5); /* the chunked body's end */
        sb_free(&b);
        return;
    }
    if (r->error[0]) { send_error(S, c, 500, NULL, "%s", r->error); return; }
    llm_chat_reply rep;
    const char *text = ch->text.s ? ch->text.s : "";
    if (llm_chat_parse_reply(&r->chat, text, ch->text.len, r->reasoning > 0, r->tool_calls, 0, &rep)) {
        llm_chat_reply_free(&rep);
        send_error(S, c, 500, NULL, "out of memory reading the reply");
        return;
    }
    int n_calls = rep.n_calls - rep.in_call, blocks = 0;
    sb_puts(&b, "{\"id\":");
    msgs_put_id(&b, r);
    sb_puts(&b, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    sb_json_cstr(&b, S->model_name);
    sb_puts(&b, ",\"content\":[");
    if (rep.reasoning && rep.reasoning[0] && r->reasoning == 2) {
        sb_puts(&b, "{\"type\":\"thinking\",\"thinking\":");
        sb_json_cstr(&b, rep.reasoning);
        sb_puts(&b, ",\"signature\":");
        msgs_put_signature(&b, rep.reasoning);
        sb_puts(&b, "}");
        blocks++;
    }
    if (rep.content[0] || (!blocks && !n_calls)) {
        sb_puts(&b, blocks++ ? ",{\"type\":\"text\",\"text\":" : "{\"type\":\"text\",\"text\":");
        sb_json_cstr(&b, rep.content);
        sb_puts(&b, "}");
    }
    for (int k = 0; k < n_calls; k++) {
        sb_puts(&b, blocks++ ? ",{\"type\":\"tool_use\",\"id\":" : "{\"type\":\"tool_use\",\"id\":");
        put_tool_call_id(&b, r, 0, k);
        sb_puts(&b, ",\"name\":");
        sb_json_cstr(&b, rep.calls[k].name);
        sb_puts(&b, ",\"input\":");
        msgs_put_input(&b, rep.calls[k].arguments);
        sb_puts(&b, "}");
    }
    sb_puts(&b, "],");
    msgs_put_stop(&b, r, ch, n_calls > 0);
    sb_puts(&b, ",");
    msgs_put_usage(&b, r);
    sb_puts(&b, "}");
    llm_chat_reply_free(&rep);
    if (b.failed) send_error(S, c, 500, NULL, "out of memory writing the response");
    else send_response(S, c, 200, "application/json", b.s, b.len, NULL);
    sb_free(&b);
}

/* ===========================================================================================================
 * The Responses API: POST /v1/responses over the chat path, its typed stream, its store
 *
 * OpenAI's Responses API is a new wire format over what chat completions already do, as llama.cpp and vLLM
 * serve it. In: resp_prepare (on a worker) checks the body against resp_fields, turns its input items,
 * instructions, tools, tool_choice, text.format and reasoning into a chat completions body (JSON text, every
 * string escaped by sb_json_str) and hands that to prepare_generation: one template, tool parser, reasoning
 * parser and grammar for both APIs. Out: the reply is read again after each output (llm_chat_parse_reply,
 * as a streamed chat is) and what it gained opens, extends and closes output items: a reasoning item, a
 * message, one function_call per call, never interleaved. Streamed or not, the same code walks the items
 * (resp_advance); a stream also sends each step as a typed event. Each closed item's JSON is kept as it is
 * sent in output_item.done, and the final object's output is exactly those texts: the stream, the final
 * object and GET /v1/responses/{id} cannot disagree. The ids are pure functions: resp_ + 32 random hex per
 * response, rs_/msg_/fc_ + 32 hex of (response id, output index), a call's call_id put_tool_call_id's.
 * ======================================================================================================== */
enum { RESP_NONE, RESP_REASONING, RESP_MESSAGE, RESP_CALL, RESP_CUSTOM }; /* an output item's kind */
#define RESP_MAX_METADATA 16        /* metadata: keys (each <= 64 bytes; values strings <= 512), as OpenAI */
/* POST /v1/responses/compact: the model asked for a summary after the conversation (greedy, no tool call);
 * the compaction item carries it ("llm-cmp1." and its base64), and reads back as a user message */
#define RESP_COMPACT_MAX_TOKENS 1024 /* the summary's tokens at most (the context's end first, if nearer) */
#define RESP_COMPACT_PROMPT "Summarize the conversation so far for someone who will continue it with no " \
    "other record of it: what the user wants (goals, constraints, preferences), what has been done and " \
    "found (decisions, names, commands, results), what is still open, and the next step. Be specific and " \
    "brief. Write only the summary."
#define RESP_COMPACT_PREFIX "A summary of the conversation before this point:\n\n"

struct srv_resp {
    char id[40];                    /* "resp_" and 32 hex digits */
    char *echo;                     /* the request's fields the response object repeats: JSON members */
    char *history;                  /* the conversation's input items (a stored parent's first): the members
                                     * of a JSON list, kept with the output items when stored */
    int store;
    int seq;                        /* the stream's next sequence_number */
    int n_items;                    /* output items opened so far (the next one's output_index) */
    int open, open_call;            /* the open item's kind (RESP_NONE: none) and, for a call, its index */
    char *call_name;                /* the open call's name */
    sbuf part;                      /* the open item's text so far: thinking, answer or arguments */
    sbuf items;                     /* the closed items' JSON, comma-separated: the object's output */
    size_t *item_ends;              /* stb_ds: where each closed item's JSON ends in items */
    int reasoning_tokens;           /* the reply's tokens when its thinking ended */
    char **customs;                 /* stb_ds: the custom tools' names (their calls are custom_tool_call) */
    int summary;                    /* reasoning.summary: the thinking is its own summary too (no model
                                     * writes another) */
    int encrypted;                  /* include reasoning.encrypted_content: the thinking, encoded, in it */
    sbuf lp_pending;                /* include message.output_text.logprobs: the logprobs of the tokens no
                                     * delta has shown yet (chat's entries, add_logprobs') */
    sbuf part_lp;                   /* the open message's logprobs so far: its deltas' entries joined */
    int compact;                    /* POST /v1/responses/compact: the reply is the conversation's summary */
    sbuf kept;                      /* a compaction's output before its summary: the conversation's user
                                     * messages as given, comma-separated */
};

/* req_free's part for a Responses request (NULL: none) */
static void resp_free(srv_resp *rs) {
    if (!rs) return;
    free(rs->echo); free(rs->history); free(rs->call_name); sb_free(&rs->part); sb_free(&rs->items);
    arrfree(rs->item_ends);
    sb_free(&rs->lp_pending); sb_free(&rs->part_lp); sb_free(&rs->kept);
    for (ptrdiff_t i = 0; i < arrlen(rs->customs); i++) free(rs->customs[i]);
    arrfree(rs->customs);
    free(rs);
}

/* Base64 (RFC 4648, with padding): a reasoning item's encrypted_content carries the thinking so encoded
 * ("llm-rs1." first), for clients that keep no store (Codex sends store false and replays it) */
static const char b64_digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static void sb_base64(sbuf *b, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {b64_digits[v >> 18 & 63], b64_digits[v >> 12 & 63],
                     i + 1 < n ? b64_digits[v >> 6 & 63] : '=', i + 2 < n ? b64_digits[v & 63] : '='};
        sb_put(b, q, 4);
    }
}

/* s[0..n) decoded into b; -1 if it is not base64 (a length not a multiple of 4, a foreign character) */
static int sb_unbase64(sbuf *b, const char *s, size_t n) {
    if (n % 4) return -1;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            const char *d = s[i + k] && s[i + k] != '=' ? strchr(b64_digits, s[i + k]) : NULL;
            if (s[i + k] == '=' && i + 4 == n && k >= 2) pad++;
            else if (!d || pad) return -1;
            v = v << 6 | (d ? (uint32_t)(d - b64_digits) : 0);
        }
        unsigned char o[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
        sb_put(b, (const char *)o, (size_t)(3 - pad));
    }
    return 0;
}

/* An item_reference input item ({"type": "item_reference", "id"}) resolved: the output item of that id in a
 * stored response (the store's index of output items), copied under store_lock and parsed into *doc (the
 * caller frees it); a 400 naming input[i].id when no stored response has it. *budget: the bytes the
 * request's references may still bring in (SRV_MAX_BODY in all, as if the client had sent the items): a
 * body of many references to a large item is refused before it is copied, not expanded. */
static int resp_item_ref(srv_state *S, const llm_json *ref, int i, size_t *budget, llm_json *doc,
                         srv_error *e) {
    const llm_json *id = llm_json_get(ref, "id");
    char param[64];
    snprintf(param, sizeof param, "input[%d].id", i);
    if (!id || id->type != LLM_JSON_STRING || !id->len || id->len > 64)
        return bad(e, 400, param, "%s must be the id of an output item (a string of at most 64 bytes)",
                   param);
    char *item = NULL;
    size_t n = 0;
    int found = 0;
    pthread_mutex_lock(&S->store_lock);
    for (ptrdiff_t k = arrlen(S->store) - 1; k >= 0 && !found; k--) /* the newest first */
        for (ptrdiff_t j = 0; j < arrlen(S->store[k].items) && !found; j++) {
            const resp_item *it = &S->store[k].items[j];
            if (strlen(it->id) != id->len || memcmp(it->id, id->str, id->len)) continue;
            found = 1;
            n = it->len;
            if (n <= *budget && (item = (char *)malloc(n + 1))) {
                memcpy(item, S->store[k].history + it->off, n);
                item[n] = 0;
            }
        }
    pthread_mutex_unlock(&S->store_lock);
    if (found && n > *budget)
        return bad(e, 400, param, "%s: the items referenced come to more than %d bytes (send them instead)",
                   param, SRV_MAX_BODY);
    if (found && !item) return bad(e, 500, NULL, "out of memory");
    if (!found)
        return bad(e, 400, param, "%s: no stored response has an output item with id '%.64s'", param,
                   id->str);
    *budget -= n;
    int rc = llm_json_parse(item, n, doc, NULL) == 0 ? 0 : bad(e, 500, NULL, "out of memory");
    free(item);
    return rc;
}

/* ---- Requests in ------------------------------------------------------------------------------------- */
/* Every field of OpenAI's Responses request: read by resp_prepare (fv_any), accepted at a value that asks
 * for nothing, or refused (fv_never: no value asks for something this server does) */
static int fv_disabled(const llm_json *v, const llm_json *b) { (void)b; return fv_str(v, "disabled"); }
static int fv_tier(const llm_json *v, const llm_json *b) {
    (void)b; return fv_str(v, "auto") || fv_str(v, "default");
}
static int fv_in_memory(const llm_json *v, const llm_json *b) { (void)b; return fv_str(v, "in_memory"); }
enum { RF_CREATE = 1, RF_COMPACT = 2, RF_BOTH = 3 }; /* POST /v1/responses, /v1/responses/compact */
static const srv_field resp_fields[] = {
    {"model", fv_any, RF_BOTH}, {"input", fv_any, RF_BOTH}, {"instructions", fv_any, RF_BOTH},
    {"tools", fv_any, RF_BOTH}, {"parallel_tool_calls", fv_any, RF_BOTH}, {"reasoning", fv_any, RF_BOTH},
    {"previous_response_id", fv_any, RF_BOTH}, {"prompt_cache_key", fv_any, RF_BOTH},
    {"service_tier", fv_tier, RF_BOTH}, {"prompt_cache_retention", fv_in_memory, RF_BOTH},
    {"image", fv_never, RF_BOTH}, {"prompt_cache_options", fv_never, RF_BOTH},
    {"text", fv_any, RF_BOTH}, /* compaction: the later answers' format (the summary is text) */
    {"tool_choice", fv_any, RF_CREATE}, {"max_output_tokens", fv_any, RF_CREATE},
    {"temperature", fv_any, RF_CREATE}, {"top_p", fv_any, RF_CREATE}, {"stream", fv_any, RF_CREATE},
    {"store", fv_any, RF_CREATE}, {"metadata", fv_any, RF_CREATE}, {"user", fv_any, RF_CREATE},
    {"safety_identifier", fv_any, RF_CREATE},
    {"truncation", fv_disabled, RF_CREATE}, {"background", fv_false, RF_CREATE},
    {"top_logprobs", fv_any, RF_CREATE}, {"include", fv_any, RF_CREATE},
    {"max_tool_calls", fv_any, RF_CREATE}, /* it bounds built-in tool calls: this server runs none */
    {"stream_options", fv_none, RF_CREATE}, {"conversation", fv_never, RF_CREATE},
    {"prompt", fv_never, RF_CREATE}, {"context_management", fv_never, RF_CREATE},
    {"moderation", fv_never, RF_CREATE}, {"access_programs", fv_never, RF_CREATE},
    {"background_options", fv_never, RF_CREATE},
    {"stream", fv_false, RF_COMPACT}, {"store", fv_false, RF_COMPACT}, /* a compaction is neither */
};

/* The conversation being turned into chat messages: the system text (instructions, then every system or
 * developer message: the templates take one system turn, first), the messages, and the assistant turn being
 * gathered (its thinking, text and calls come as separate items, and fold into one chat message) */
typedef struct {
    sbuf system, messages;
    sbuf a_content, a_reasoning, a_calls; /* the assistant turn: a_calls is the tool_calls list's members */
    int a_open;
    const char **call_ids;          /* stb_ds: the call_ids of the calls so far (into the JSON) */
} resp_conv;

/* The assistant turn gathered so far, as one chat message */
static void conv_flush(resp_conv *cv) {
    if (!cv->a_open) return;
    sb_puts(&cv->messages, cv->messages.len ? ",{\"role\":\"assistant\",\"content\":"
                                            : "{\"role\":\"assistant\",\"content\":");
    sb_json_str(&cv->messages, cv->a_content.s ? cv->a_content.s : "", cv->a_content.len);
    if (cv->a_reasoning.len) {
        sb_puts(&cv->messages, ",\"reasoning_content\":");
        sb_json_str(&cv->messages, cv->a_reasoning.s, cv->a_reasoning.len);
    }
    if (cv->a_calls.len) {
        sb_puts(&cv->messages, ",\"tool_calls\":[");
        sb_put(&cv->messages, cv->a_calls.s, cv->a_calls.len);
        sb_puts(&cv->messages, "]");
    }
    sb_puts(&cv->messages, "}");
    cv->a_content.len = cv->a_reasoning.len = cv->a_calls.len = 0;
    cv->a_open = 0;
}

/* A message of role with its text */
static void conv_message(resp_conv *cv, const char *role, const sbuf *text) {
    conv_flush(cv);
    sb_printf(&cv->messages, "%s{\"role\":\"%s\",\"content\":", cv->messages.len ? "," : "", role);
    sb_json_str(&cv->messages, text->s ? text->s : "", text->len);
    sb_puts(&cv->messages, "}");
}

/* An item's text: a string, or a list of parts of the types allowed (input_text, output_text, refusal,
 * summary_text, reasoning_text), joined by "\n"; param names the field in errors */
static int resp_text(const llm_json *c, const char *param, sbuf *out, srv_error *e) {
    if (!c || c->type == LLM_JSON_NULL) return 0;
    if (c->type == LLM_JSON_STRING) { sb_put(out, c->str, c->len); return 0; }
    if (c->type != LLM_JSON_ARRAY) return bad(e, 400, param, "%s must be a string or a list of parts", param);
    static const char *const types[] = {"input_text", "output_text", "refusal", "summary_text",
                                        "reasoning_text", "text"};
    for (int k = 0; k < c->n; k++) {
        const llm_json *part = &c->items[k], *type = llm_json_get(part, "type");
        const llm_json *text = llm_json_get(part, fv_str(type, "refusal") ? "refusal" : "text");
        size_t t = 0;
        while (t < sizeof types / sizeof *types && !fv_str(type, types[t])) t++;
        if (t == sizeof types / sizeof *types || !text || text->type != LLM_JSON_STRING)
            return bad(e, 400, param, "%s[%d]: %.40s parts are not supported (input_text and output_text "
                       "are)", param, k, type && type->type == LLM_JSON_STRING ? type->str : "untyped");
        if (k) sb_puts(out, "\n");
        sb_put(out, text->str, text->len);
    }
    return 0;
}

/* One input item into the conversation: a message, a function_call, its function_call_output or a
 * reasoning item. i names it in errors (input[i]) */
static int conv_item(resp_conv *cv, const llm_json *it, int i, srv_error *e) {
    char param[64];
    const llm_json *type = llm_json_get(it, "type"), *role = llm_json_get(it, "role");
    snprintf(param, sizeof param, "input[%d]", i);
    if (it->type != LLM_JSON_OBJECT) return bad(e, 400, param, "%s must be an object (an input item)", param);
    sbuf text = {0};
    int rc = 0;
    if ((!type || fv_str(type, "message")) && role) {
        snprintf(param, sizeof param, "input[%d].content", i);
        if (!fv_str(role, "user") && !fv_str(role, "assistant") && !fv_str(role, "system") &&
            !fv_str(role, "developer")) {
            snprintf(param, sizeof param, "input[%d].role", i);
            rc = bad(e, 400, param, "%s must be user, assistant, system or developer", param);
        } else if (!(rc = resp_text(llm_json_get(it, "content"), param, &text, e))) {
            if (fv_str(role, "user")) conv_message(cv, "user", &text);
            else if (fv_str(role, "assistant")) {
                if (cv->a_content.len && text.len) sb_puts(&cv->a_content, "\n");
                sb_put(&cv->a_content, text.s ? text.s : "", text.len);
                cv->a_open = 1;
            } else { /* system and developer: into the one system turn */
                if (cv->system.len && text.len) sb_puts(&cv->system, "\n\n");
                sb_put(&cv->system, text.s ? text.s : "", text.len);
            }
        }
    } else if (fv_str(type, "function_call") || fv_str(type, "custom_tool_call")) {
        /* a custom tool's call is the function call of its shim (resp_tools): arguments {"input": input} */
        const llm_json *id = llm_json_get(it, "call_id"), *name = llm_json_get(it, "name");
        const llm_json *args = llm_json_get(it, "arguments"), *in = llm_json_get(it, "input");
        llm_json parsed, wrapped = {0};
        int object = 0, custom = fv_str(type, "custom_tool_call");
        if (custom && in && in->type == LLM_JSON_STRING) { /* its input wrapped as the shim's arguments */
            sb_puts(&text, "{\"input\":"); sb_json_str(&text, in->str, in->len); sb_puts(&text, "}");
            wrapped.type = LLM_JSON_STRING; wrapped.str = text.s; wrapped.len = text.len;
            args = text.failed ? NULL : &wrapped;
        }
        if (args && args->type == LLM_JSON_STRING &&
            llm_json_parse(args->str, args->len, &parsed, NULL) == 0) {
            object = parsed.type == LLM_JSON_OBJECT;
            llm_json_free(&parsed);
        }
        if (!id || id->type != LLM_JSON_STRING || !id->len) {
            snprintf(param, sizeof param, "input[%d].call_id", i);
            rc = bad(e, 400, param, "%s must be a non-empty string", param);
        } else if (!name || name->type != LLM_JSON_STRING || !name->len) {
            snprintf(param, sizeof param, "input[%d].name", i);
            rc = bad(e, 400, param, "%s must be a non-empty string", param);
        } else if (!object) {
            snprintf(param, sizeof param, "input[%d].%s", i, custom ? "input" : "arguments");
            rc = bad(e, 400, param, custom ? "%s must be a string" : "%s must be a JSON object, as text",
                     param);
        } else {
            sb_puts(&cv->a_calls, cv->a_calls.len ? ",{\"id\":" : "{\"id\":");
            sb_json_str(&cv->a_calls, id->str, id->len);
            sb_puts(&cv->a_calls, ",\"type\":\"function\",\"function\":{\"name\":");
            sb_json_str(&cv->a_calls, name->str, name->len);
            sb_puts(&cv->a_calls, ",\"arguments\":");
            sb_json_str(&cv->a_calls, args->str, args->len);
            sb_puts(&cv->a_calls, "}}");
            cv->a_open = 1;
            arrput(cv->call_ids, id->str);
        }
    } else if (fv_str(type, "function_call_output") || fv_str(type, "custom_tool_call_output")) {
        const llm_json *id = llm_json_get(it, "call_id");
        int known = 0;
        for (ptrdiff_t k = 0; id && id->type == LLM_JSON_STRING && k < arrlen(cv->call_ids) && !known; k++)
            known = !strcmp(cv->call_ids[k], id->str);
        snprintf(param, sizeof param, "input[%d].call_id", i);
        if (!known)
            rc = bad(e, 400, param, "%s: no function_call before it has the call_id \"%.64s\"", param,
                     id && id->type == LLM_JSON_STRING ? id->str : "");
        else {
            snprintf(param, sizeof param, "input[%d].output", i);
            if (!(rc = resp_text(llm_json_get(it, "output"), param, &text, e))) {
                conv_flush(cv);
                sb_puts(&cv->messages, cv->messages.len ? ",{\"role\":\"tool\",\"tool_call_id\":"
                                                        : "{\"role\":\"tool\",\"tool_call_id\":");
                sb_json_str(&cv->messages, id->str, id->len);
                sb_puts(&cv->messages, ",\"content\":");
                sb_json_str(&cv->messages, text.s ? text.s : "", text.len);
                sb_puts(&cv->messages, "}");
            }
        }
    } else if (fv_str(type, "reasoning")) { /* the assistant turn's thinking: our encrypted_content (the
                                              * whole thinking), else its text, else its summary */
        const llm_json *c = llm_json_get(it, "content"), *enc = llm_json_get(it, "encrypted_content");
        if (!c || c->type == LLM_JSON_NULL) c = NULL;
        snprintf(param, sizeof param, "input[%d].%s", i, c ? "content" : "summary");
        if (enc && enc->type == LLM_JSON_STRING && !strncmp(enc->str, "llm-rs1.", 8)) {
            snprintf(param, sizeof param, "input[%d].encrypted_content", i);
            if (sb_unbase64(&text, enc->str + 8, enc->len - 8))
                rc = bad(e, 400, param, "%s is not this server's (its base64 is broken)", param);
        } else rc = resp_text(c ? c : llm_json_get(it, "summary"), param, &text, e);
        if (!rc) { sb_put(&cv->a_reasoning, text.s ? text.s : "", text.len); cv->a_open = 1; }
    } else if (fv_str(type, "compaction")) { /* a summary from POST /v1/responses/compact: ours only */
        const llm_json *enc = llm_json_get(it, "encrypted_content");
        snprintf(param, sizeof param, "input[%d].encrypted_content", i);
        sb_puts(&text, RESP_COMPACT_PREFIX);
        if (!enc || enc->type != LLM_JSON_STRING || strncmp(enc->str, "llm-cmp1.", 9) ||
            sb_unbase64(&text, enc->str + 9, enc->len - 9))
            rc = bad(e, 400, param, "%s is not this server's (a compaction made elsewhere cannot be read)",
                     param);
        else conv_message(cv, "user", &text);
    } else {
        snprintf(param, sizeof param, "input[%d].type", i);
        rc = bad(e, 400, param, "%s: %.40s items are not supported (message, function_call, "
                 "function_call_output, reasoning and compaction are)", param,
                 type && type->type == LLM_JSON_STRING ? type->str : "untyped");
    }
    sb_free(&text);
    return rc;
}

/* tools: function tools into chat's {"type": "function", "function": {...}}; a custom tool (free text in,
 * Codex's apply_patch) into a function of one string, input, its name kept in customs; OpenAI's built-in
 * tools (web search and the like) run on OpenAI's side, and this server runs none: refused, by name */
static int resp_tools(const llm_json *tools, sbuf *out, const char ***customs, srv_error *e) {
    if (!tools || tools->type == LLM_JSON_NULL) return 0;
    if (tools->type != LLM_JSON_ARRAY) return bad(e, 400, "tools", "tools must be a list");
    for (int i = 0; i < tools->n; i++) {
        const llm_json *t = &tools->items[i], *type = llm_json_get(t, "type");
        const llm_json *name = llm_json_get(t, "name");
        char param[48];
        const llm_json *format = llm_json_get(t, "format");
        int custom = fv_str(type, "custom");
        snprintf(param, sizeof param, "tools[%d].type", i);
        if (!fv_str(type, "function") && !custom)
            return bad(e, 400, param, "%s: %.40s is a built-in tool this server does not run (function and "
                       "custom tools are)", param, type && type->type == LLM_JSON_STRING ? type->str :
                       "an untyped tool");
        snprintf(param, sizeof param, "tools[%d].format", i);
        if (custom && format && format->type != LLM_JSON_NULL &&
            !fv_str(llm_json_get(format, "type"), "text"))
            return bad(e, 400, param, "%s: grammar formats (lark, regex) are not supported; text is", param);
        snprintf(param, sizeof param, "tools[%d].name", i);
        if (!name || name->type != LLM_JSON_STRING || !name->len)
            return bad(e, 400, param, "%s must be a non-empty string", param);
        sb_puts(out, i ? ",{\"type\":\"function\",\"function\":{\"name\":" : "{\"type\":\"function\","
                "\"function\":{\"name\":");
        sb_json_str(out, name->str, name->len);
        sb_puts(out, ",\"description\":"); sb_json_value(out, llm_json_get(t, "description"));
        sb_puts(out, ",\"parameters\":");
        if (custom) { /* free text, as the one string of a function (vLLM's shim): its input */
            sb_puts(out, "{\"type\":\"object\",\"properties\":{\"input\":{\"type\":\"string\"}},"
                    "\"required\":[\"input\"]}");
            arrput(*customs, name->str);
        } else sb_json_value(out, llm_json_get(t, "parameters"));
        sb_puts(out, "}}");
    }
    return 0;
}

/* A string field that the response object echoes: absent, null, or a string of at most max bytes */
static int resp_string(const llm_json *body, const char *key, size_t max, srv_error *e) {
    const llm_json *v = llm_json_get(body, key);
    if (!v || v->type == LLM_JSON_NULL) return 0;
    if (v->type != LLM_JSON_STRING) return bad(e, 400, key, "%s must be a string", key);
    if (v->len > max) return bad(e, 400, key, "%s is longer than %zu bytes", key, max);
    return 0;
}

/* A compaction's output before its summary (rs->kept): the user's messages of the conversation (history:
 * the members of a JSON list of items, a stored parent's first), each a message item of its content as
 * given (a string as an input_text part); an earlier compaction item goes, its summary being in the new
 * one */
static int resp_keep_user(srv_resp *rs, const sbuf *history, srv_error *e) {
    sbuf list = {0};
    llm_json items;
    sb_puts(&list, "[");
    sb_put(&list, history->s ? history->s : "", history->len);
    sb_puts(&list, "]");
    int rc = list.failed || llm_json_parse(list.s, list.len, &items, NULL) ? -1 : 0;
    for (int i = 0; !rc && i < items.n; i++) {
        const llm_json *it = &items.items[i], *type = llm_json_get(it, "type");
        if (!fv_str(llm_json_get(it, "role"), "user") || (type && !fv_str(type, "message"))) continue;
        sb_puts(&rs->kept, rs->kept.len ? ",{\"type\":\"message\",\"role\":\"user\",\"content\":"
                                        : "{\"type\":\"message\",\"role\":\"user\",\"content\":");
        const llm_json *c = llm_json_get(it, "content");
        if (c && c->type == LLM_JSON_STRING) { /* a string as its one part, as OpenAI writes it */
            sb_puts(&rs->kept, "[{\"type\":\"input_text\",\"text\":");
            sb_json_str(&rs->kept, c->str, c->len);
            sb_puts(&rs->kept, "}]}");
        } else { sb_json_value(&rs->kept, c); sb_puts(&rs->kept, "}"); }
    }
    if (!rc) llm_json_free(&items);
    sb_free(&list);
    return rc || rs->kept.failed ? bad(e, 500, NULL, "out of memory") : 0;
}

/* The chat body of a Responses request, its echo and its history into r->resp; chat has the JSON text */
static int resp_to_chat(srv_state *S, const llm_json *body, srv_resp *rs, sbuf *chat, srv_error *e) {
    /* 1. every field known: read, accepted at a value that asks for nothing, or refused */
    if (check_fields(S, body, resp_fields, sizeof resp_fields / sizeof *resp_fields, RF_CREATE, e))
        return -1;
    const llm_json *input = llm_json_get(body, "input"), *text = llm_json_get(body, "text");
    const llm_json *fmt = llm_json_get(text, "format"), *ftype = llm_json_get(fmt, "type");
    const llm_json *reasoning = llm_json_get(body, "reasoning"), *meta = llm_json_get(body, "metadata");
    const llm_json *effort = llm_json_get(reasoning, "effort");
    const llm_json *prev = llm_json_get(body, "previous_response_id");
    const llm_json *choice = llm_json_get(body, "tool_choice");
    double x = 0, top_logprobs = 0;
    rs->store = 1;
    int stream = 0, parallel = 1, logprobs = 0; /* logprobs: include message.output_text.logprobs */
    if (get_bool(body, "store", &rs->store, e) || get_bool(body, "stream", &stream, e) ||
        get_bool(body, "parallel_tool_calls", &parallel, e) ||
        get_number(body, "max_output_tokens", 1, 1 << 30, 1, &x, e) ||
        get_number(body, "top_logprobs", 0, 20, 1, &top_logprobs, e) ||
        get_number(body, "temperature", 0, 2, 0, &x, e) || get_number(body, "top_p", 0, 1, 0, &x, e) ||
        resp_string(body, "instructions", SRV_MAX_BODY, e) || resp_string(body, "user", 256, e) ||
        resp_string(body, "safety_identifier", 256, e) ||
        resp_string(body, "prompt_cache_key", SRV_MAX_CACHE_KEY, e) ||
        resp_string(body, "previous_response_id", 64, e))
        return -1;
    llm_json none = {LLM_JSON_ARRAY, 0, NULL, 0, NULL, NULL, 0, 0};
    if (rs->compact && (!input || input->type == LLM_JSON_NULL) && prev && prev->type == LLM_JSON_STRING)
        input = &none; /* a stored conversation compacted as it is */
    if (!input || (input->type != LLM_JSON_STRING && input->type != LLM_JSON_ARRAY))
        return bad(e, 400, "input", "input must be a string or a list of items");
    if (meta && meta->type != LLM_JSON_NULL) {
        int ok = meta->type == LLM_JSON_OBJECT && meta->n <= RESP_MAX_METADATA;
        for (int i = 0; ok && i < meta->n; i++)
            ok = strlen(meta->keys[i]) <= 64 && meta->items[i].type == LLM_JSON_STRING &&
                 meta->items[i].len <= 512;
        if (!ok)
            return bad(e, 400, "metadata", "metadata must be an object of at most 16 strings (keys of at "
                            "most 64 characters, values of at most 512)");
    }
    if (text && text->type != LLM_JSON_NULL && text->type != LLM_JSON_OBJECT)
        return bad(e, 400, "text", "text must be an object");
    const llm_json *verbosity = llm_json_get(text, "verbosity");
    if (verbosity && verbosity->type != LLM_JSON_NULL && !fv_str(verbosity, "medium"))
        return bad(e, 400, "text.verbosity", "text.verbosity is not supported by this server (only medium)");
    if (fmt && fmt->type != LLM_JSON_NULL && !fv_str(ftype, "text") && !fv_str(ftype, "json_object") &&
        !fv_str(ftype, "json_schema"))
        return bad(e, 400, "text.format.type", "text.format.type must be text, json_object or json_schema");
    if (reasoning && reasoning->type != LLM_JSON_NULL && reasoning->type != LLM_JSON_OBJECT)
        return bad(e, 400, "reasoning", "reasoning must be an object");
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    size_t ek = 0;
    while (effort && effort->type != LLM_JSON_NULL && ek < 6 && !fv_str(effort, efforts[ek])) ek++;
    if (ek == 6)
        return bad(e, 400, "reasoning.effort",
                   "reasoning.effort must be none, minimal, low, medium, high or xhigh");
    const llm_json *summary = llm_json_get(reasoning, "summary");
    if (!summary || summary->type == LLM_JSON_NULL) summary = llm_json_get(reasoning, "generate_summary");
    if (summary && summary->type != LLM_JSON_NULL && !fv_str(summary, "auto") &&
        !fv_str(summary, "concise") && !fv_str(summary, "detailed"))
        return bad(e, 400, "reasoning.summary", "reasoning.summary must be auto, concise or detailed (the "
                   "summary is the thinking itself)");
    rs->summary = summary && summary->type == LLM_JSON_STRING;
    const llm_json *include = llm_json_get(body, "include");
    if (include && include->type != LLM_JSON_NULL && include->type != LLM_JSON_ARRAY)
        return bad(e, 400, "include", "include must be a list");
    for (int i = 0; include && include->type == LLM_JSON_ARRAY && i < include->n; i++) {
        if (fv_str(&include->items[i], "message.output_text.logprobs")) { logprobs = 1; continue; }
        if (!fv_str(&include->items[i], "reasoning.encrypted_content"))
            return bad(e, 400, "include", "include: %.60s is not supported (reasoning.encrypted_content and "
                       "message.output_text.logprobs are)",
                       include->items[i].type == LLM_JSON_STRING ? include->items[i].str : "a non-string");
        rs->encrypted = 1;
    }
    /* 2. the conversation: a stored parent's items first (previous_response_id), then input's */
    resp_conv cv = {0};
    int rc = 0;
    sbuf history = {0};
    if (prev && prev->type == LLM_JSON_STRING) {
        char *h = NULL;
        pthread_mutex_lock(&S->store_lock);
        for (ptrdiff_t i = 0; i < arrlen(S->store); i++)
            if (!strcmp(S->store[i].id, prev->str)) { h = strdup(S->store[i].history); break; }
        pthread_mutex_unlock(&S->store_lock);
        llm_json items;
        if (!h) rc = bad(e, 400, "previous_response_id", "Previous response with id '%.64s' not found.",
                         prev->str);
        else if (llm_json_parse(h, strlen(h), &items, NULL) != 0) rc = bad(e, 500, NULL, "out of memory");
        else {
            for (int i = 0; !rc && i < items.n; i++) rc = conv_item(&cv, &items.items[i], i, e);
            llm_json_free(&items);
            sb_put(&history, h + 1, strlen(h) - 2); /* the list's members */
        }
        free(h);
    }
    if (!rc && input->type == LLM_JSON_STRING) {
        sbuf t = {0};
        sb_put(&t, input->str, input->len);
        conv_message(&cv, "user", &t);
        sb_puts(&history, history.len ? ",{\"type\":\"message\",\"role\":\"user\",\"content\":"
                                      : "{\"type\":\"message\",\"role\":\"user\",\"content\":");
        sb_json_str(&history, input->str, input->len);
        sb_puts(&history, "}");
        sb_free(&t);
    }
    size_t ref_budget = SRV_MAX_BODY; /* the bytes item_references may bring in */
    for (int i = 0; !rc && input->type == LLM_JSON_ARRAY && i < input->n; i++) {
        llm_json stored = {0};
        const llm_json *it = &input->items[i];
        if (fv_str(llm_json_get(it, "type"), "item_reference")) {
            rc = resp_item_ref(S, it, i, &ref_budget, &stored, e);
            it = &stored;
        }
        if (!rc) rc = conv_item(&cv, it, i, e);
        if (history.len) sb_puts(&history, ",");
        sb_json_value(&history, it); /* a reference as the item it names: the history stands alone */
        llm_json_free(&stored);
    }
    if (!rc && rs->compact) { /* the summary asked for after the conversation; its user messages kept */
        sbuf ask = {0};
        sb_puts(&ask, RESP_COMPACT_PROMPT);
        conv_message(&cv, "user", &ask);
        sb_free(&ask);
        rc = resp_keep_user(rs, &history, e);
    }
    conv_flush(&cv);
    const llm_json *instructions = llm_json_get(body, "instructions");
    if (instructions && instructions->type == LLM_JSON_STRING && instructions->len) { /* before the others */
        sbuf s = {0};
        sb_put(&s, instructions->str, instructions->len);
        if (cv.system.len) { sb_puts(&s, "\n\n"); sb_put(&s, cv.system.s, cv.system.len); }
        sb_free(&cv.system); cv.system = s;
    }
    /* 3. the chat body: the messages (the system turn first), tools and the sampling fields */
    sb_puts(chat, "{\"messages\":[");
    if (cv.system.len) {
        sb_puts(chat, "{\"role\":\"system\",\"content\":");
        sb_json_str(chat, cv.system.s, cv.system.len);
        sb_puts(chat, cv.messages.len ? "}," : "}");
    }
    sb_put(chat, cv.messages.s ? cv.messages.s : "", cv.messages.len);
    sb_puts(chat, "]");
    static const char *const copied[][2] = { /* Responses' name, chat's */
        {"model", "model"}, {"tool_choice", "tool_choice"}, {"parallel_tool_calls", "parallel_tool_calls"},
        {"max_output_tokens", "max_completion_tokens"}, {"temperature", "temperature"}, {"top_p", "top_p"},
        {"stream", "stream"},
    };
    for (size_t k = 0; k < sizeof copied / sizeof *copied; k++) {
        const llm_json *v = llm_json_get(body, copied[k][0]);
        if (!v || v->type == LLM_JSON_NULL) continue;
        sb_printf(chat, ",\"%s\":", copied[k][1]);
        if (!strcmp(copied[k][0], "tool_choice") && v->type == LLM_JSON_OBJECT) { /* {type, name} */
            if (!fv_str(llm_json_get(v, "type"), "function") && !fv_str(llm_json_get(v, "type"), "custom")) {
                if (!rc)
                    rc = bad(e, 400, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or "
                             "{\"type\": \"function\", \"name\": ...}");
                continue;
            }
            sb_puts(chat, "{\"type\":\"function\",\"function\":{\"name\":");
            sb_json_value(chat, llm_json_get(v, "name"));
            sb_puts(chat, "}}");
        } else sb_json_value(chat, v);
    }
    const llm_json *tools = llm_json_get(body, "tools");
    if (!rc && tools && tools->type != LLM_JSON_NULL) {
        sb_puts(chat, ",\"tools\":[");
        const char **customs = NULL;
        rc = resp_tools(tools, chat, &customs, e);
        for (ptrdiff_t k = 0; !rc && k < arrlen(customs); k++) {
            char *copy = strdup(customs[k]);
            if (copy) arrput(rs->customs, copy); else rc = bad(e, 500, NULL, "out of memory");
        }
        arrfree(customs);
        sb_puts(chat, "]");
    }
    if (ek < 6) sb_printf(chat, ",\"reasoning_effort\":\"%s\"", ek == 5 ? "high" : efforts[ek]);
    if (logprobs) sb_printf(chat, ",\"logprobs\":true,\"top_logprobs\":%d", (int)top_logprobs);
    if (fv_str(ftype, "json_object")) sb_puts(chat, ",\"response_format\":{\"type\":\"json_object\"}");
    if (fv_str(ftype, "json_schema")) { /* Responses puts name, schema and strict beside type */
        sb_puts(chat, ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":");
        sb_json_value(chat, llm_json_get(fmt, "name"));
        sb_puts(chat, ",\"schema\":"); sb_json_value(chat, llm_json_get(fmt, "schema"));
        sb_puts(chat, ",\"strict\":"); sb_json_value(chat, llm_json_get(fmt, "strict"));
        sb_puts(chat, "}}");
    }
    sb_puts(chat, "}");
    /* 4. what the response object repeats of the request (OpenAI's defaults where none is given) */
    sbuf echo = {0};
    sb_puts(&echo, "\"instructions\":"); sb_json_value(&echo, instructions);
    sb_puts(&echo, ",\"max_output_tokens\":"); sb_json_value(&echo, llm_json_get(body, "max_output_tokens"));
    sb_puts(&echo, ",\"max_tool_calls\":"); sb_json_value(&echo, llm_json_get(body, "max_tool_calls"));
    sb_puts(&echo, ",\"metadata\":");
    if (meta && meta->type == LLM_JSON_OBJECT) sb_json_value(&echo, meta); else sb_puts(&echo, "{}");
    sb_printf(&echo, ",\"parallel_tool_calls\":%s,\"previous_response_id\":", parallel ? "true" : "false");
    sb_json_value(&echo, prev);
    sb_puts(&echo, ",\"prompt_cache_key\":"); sb_json_value(&echo, llm_json_get(body, "prompt_cache_key"));
    sb_puts(&echo, ",\"reasoning\":{\"effort\":"); sb_json_value(&echo, effort);
    sb_puts(&echo, ",\"summary\":"); sb_json_value(&echo, summary);
    sb_puts(&echo, "},\"safety_identifier\":");
    sb_json_value(&echo, llm_json_get(body, "safety_identifier"));
    sb_printf(&echo, ",\"service_tier\":\"default\",\"store\":%s,\"temperature\":",
              rs->store ? "true" : "false");
    const llm_json *v = llm_json_get(body, "temperature");
    if (v && v->type == LLM_JSON_NUMBER) sb_json_value(&echo, v); else sb_puts(&echo, "1.0");
    sb_puts(&echo, ",\"text\":{\"format\":");
    if (fmt && fmt->type == LLM_JSON_OBJECT) sb_json_value(&echo, fmt);
    else sb_puts(&echo, "{\"type\":\"text\"}");
    sb_puts(&echo, ",\"verbosity\":\"medium\"},\"tool_choice\":");
    if (choice && choice->type != LLM_JSON_NULL) sb_json_value(&echo, choice);
    else sb_puts(&echo, "\"auto\"");
    sb_puts(&echo, ",\"tools\":");
    if (tools && tools->type == LLM_JSON_ARRAY) sb_json_value(&echo, tools); else sb_puts(&echo, "[]");
    sb_printf(&echo, ",\"top_logprobs\":%d,\"top_p\":", (int)top_logprobs);
    v = llm_json_get(body, "top_p");
    if (v && v->type == LLM_JSON_NUMBER) sb_json_value(&echo, v); else sb_puts(&echo, "1.0");
    sb_puts(&echo, ",\"truncation\":\"disabled\",\"user\":");
    sb_json_value(&echo, llm_json_get(body, "user"));
    sb_puts(&echo, ",\"background\":false");
    sb_puts(&history, ""); /* "" rather than NULL for none */
    rs->echo = echo.s; rs->history = history.s;
    if (!rc && (echo.failed || history.failed || chat->failed || cv.messages.failed))
        rc = bad(e, 500, NULL, "out of memory");
    sb_free(&cv.system); sb_free(&cv.messages); sb_free(&cv.a_content); sb_free(&cv.a_reasoning);
    sb_free(&cv.a_calls); arrfree(cv.call_ids);
    return rc;
}

/* A compaction's body (POST /v1/responses/compact) as resp_to_chat reads a request's: its own fields
 * checked (resp_fields' RF_COMPACT rows) and kept, the others left out (ignored, as unknown ones), and
 * what a summary is asked with added: greedy, no tool call, neither stored nor streamed. The view's values
 * are the body's: free only its two arrays. */
static int resp_compact_view(srv_state *S, const llm_json *body, llm_json *view, srv_error *e) {
    static const char *const kept[] = {"model", "input", "instructions", "tools", "parallel_tool_calls",
                                       "reasoning", "previous_response_id", "prompt_cache_key"};
    static char *added_keys[] = {"tool_choice", "temperature", "store"};
    static llm_json added[] = {{LLM_JSON_STRING, 0, (char *)"none", 4, NULL, NULL, 0, 0},
                               {LLM_JSON_NUMBER, 0, (char *)"0", 1, NULL, NULL, 0, 0},
                               {LLM_JSON_FALSE, 0, NULL, 0, NULL, NULL, 0, 0}};
    if (check_fields(S, body, resp_fields, sizeof resp_fields / sizeof *resp_fields, RF_COMPACT, e))
        return -1;
    const llm_json *input = llm_json_get(body, "input"), *prev = llm_json_get(body, "previous_response_id");
    if ((!input || input->type == LLM_JSON_NULL) && (!prev || prev->type == LLM_JSON_NULL))
        return bad(e, 400, "input", "input: a compaction needs a conversation (input, previous_response_id "
                   "or both)");
    int n = 0, cap = body->n + 3;
    view->type = LLM_JSON_OBJECT;
    view->keys = (char **)malloc(sizeof *view->keys * (size_t)cap);
    view->items = (llm_json *)malloc(sizeof *view->items * (size_t)cap);
    if (!view->keys || !view->items) return bad(e, 500, NULL, "out of memory");
    for (int i = 0; i < body->n; i++)
        for (size_t k = 0; k < sizeof kept / sizeof *kept; k++)
            if (!strcmp(body->keys[i], kept[k])) {
                view->keys[n] = body->keys[i]; view->items[n++] = body->items[i];
                break;
            }
    for (int k = 0; k < 3; k++) { view->keys[n] = added_keys[k]; view->items[n++] = added[k]; }
    view->n = n;
    return 0;
}

/* The worker's part of POST /v1/responses: the body read into a chat body, which prepare_generation takes
 * as any chat request; an error it finds in a chat field is named as the Responses field it came from. The
 * chat body's JSON replaces the request's (the request's strings point into it). */
static int resp_prepare(srv_state *S, srv_job *j) {
    static const char *const renamed[][2] = { /* chat's field (a prefix), the Responses one */
        {"messages", "input"}, {"max_completion_tokens", "max_output_tokens"},
        {"response_format", "text.format"}, {"reasoning_effort", "reasoning.effort"},
    };
    srv_resp *rs = (srv_resp *)calloc(1, sizeof *rs);
    if (!rs || !(j->r = (srv_req *)calloc(1, sizeof *j->r))) {
        free(rs);
        return bad(&j->e, 500, NULL, "out of memory");
    }
    j->r->resp = rs;
    j->r->t_arrival = j->t_arrival;
    unsigned char rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) /* else the request id's hash and the clock */
        for (int i = 0; i < 16; i++)
            rnd[i] = (unsigned char)(j->request_id[i % 32] ^ (uint64_t)(now_s() * 1e9) >> i);
    char *p = rs->id + sprintf(rs->id, "resp_");
    for (int i = 0; i < 16; i++) p += sprintf(p, "%02x", rnd[i]);
    sbuf chat = {0};
    llm_json cj, view = {0};
    rs->compact = j->route == JOB_COMPACT;
    int rc = rs->compact ? resp_compact_view(S, &j->json, &view, &j->e) : 0;
    if (!rc) rc = resp_to_chat(S, rs->compact ? &view : &j->json, rs, &chat, &j->e);
    free(view.keys); free(view.items); /* (its values are the body's) */
    if (!rc && llm_json_parse(chat.s, chat.len, &cj, NULL) != 0) rc = bad(&j->e, 500, NULL, "out of memory");
    sb_free(&chat);
    if (rc) return -1;
    llm_json_free(&j->json);
    j->json = cj;
    if (prepare_generation(S, &j->json, REQ_CHAT, j->request_id, j->r, &j->p, &j->e) == 0) {
        snprintf(j->r->id, sizeof j->r->id, "%s", rs->id); /* the log line names it so */
        /* a summary is bounded (a small model's greedy one can loop to the context's end: minutes); set
         * here, after the context check, so that a compaction near the context's end is no 400 */
        if (rs->compact) j->p.max_tokens = RESP_COMPACT_MAX_TOKENS;
        return 0;
    }
    for (size_t k = 0; k < sizeof renamed / sizeof *renamed; k++) {
        size_t n = strlen(renamed[k][0]);
        char *m;
        if (strncmp(j->e.param, renamed[k][0], n)) continue;
        char tail[64];
        snprintf(tail, sizeof tail, "%s", j->e.param + n);
        snprintf(j->e.param, sizeof j->e.param, "%s%s", renamed[k][1], tail);
        while ((m = strstr(j->e.msg, renamed[k][0])) != NULL) { /* the message names it too */
            char rest[512];
            snprintf(rest, sizeof rest, "%s", m + n);
            snprintf(m, sizeof j->e.msg - (size_t)(m - j->e.msg), "%s%s", renamed[k][1], rest);
        }
    }
    return -1;
}

/* ---- Responses out ----------------------------------------------------------------------------------- */
/* One typed event of the stream: {"type", "sequence_number", fields...} under `event: TYPE`. sequence_number
 * counts every event from 0; nothing is sent for a whole (non-streamed) response, whose items are walked
 * the same way. */
static void resp_emit(srv_state *S, srv_req *r, const char *type, const char *fields, size_t n) {
    if (!r->stream || !r->conn) return;
    sbuf b = {0};
    sb_printf(&b, "{\"type\":\"%s\",\"sequence_number\":%d", type, r->resp->seq++);
    if (n) { sb_puts(&b, ","); sb_put(&b, fields, n); }
    sb_puts(&b, "}");
    send_sse(S, r->conn, type, b.s, b.len);
    sb_free(&b);
}

/* The id of output item index: its kind's prefix and 32 hex digits of (response id, index) */
static void resp_item_id(sbuf *b, const srv_resp *rs, const char *prefix, int index) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the response id, then the index mixed in */
    for (const char *p = rs->id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h ^= (uint64_t)index * 0x9e3779b97f4a7c15ull;
    uint64_t a = llm_splitmix64(&h), c = llm_splitmix64(&h);
    sb_printf(b, "\"%s%016llx%016llx\"", prefix, (unsigned long long)a, (unsigned long long)c);
}

/* The logprobs member of an output_text part or event: lp's entries (NULL: none yet) */
static void resp_put_logprobs(sbuf *b, const sbuf *lp) {
    sb_puts(b, ",\"logprobs\":[");
    if (lp && lp->len) sb_put(b, lp->s, lp->len);
    sb_puts(b, "]");
}

/* An output_text part with its text and its tokens' logprobs (NULL: none) */
static void resp_put_part(sbuf *b, const char *text, size_t n, const sbuf *lp) {
    sb_puts(b, "{\"type\":\"output_text\",\"text\":");
    sb_json_str(b, text, n);
    sb_puts(b, ",\"annotations\":[]");
    resp_put_logprobs(b, lp);
    sb_puts(b, "}");
}

/* A custom tool call's input: its shim's arguments {"input": ...} read (the raw arguments if the model
 * wrote something else: a call cut short) */
static void resp_custom_input(const srv_resp *rs, sbuf *out) {
    llm_json a;
    if (llm_json_parse(rs->part.s ? rs->part.s : "", rs->part.len, &a, NULL) != 0) {
        sb_put(out, rs->part.s ? rs->part.s : "", rs->part.len);
        return;
    }
    const llm_json *in = llm_json_get(&a, "input");
    if (in && in->type == LLM_JSON_STRING) sb_put(out, in->str, in->len);
    else sb_put(out, rs->part.s ? rs->part.s : "", rs->part.len);
    llm_json_free(&a);
}

/* The open item as JSON: as output_item.added shows it (done 0: in progress, no text) or as it is done
 * (status completed, or incomplete when cut short) */
static void resp_put_item(sbuf *b, srv_req *r, int done, int incomplete) {
    srv_resp *rs = r->resp;
    const char *status = !done ? "in_progress" : incomplete ? "incomplete" : "completed";
    const char *t = rs->part.s ? rs->part.s : "";
    int index = rs->n_items - 1;
    if (rs->open == RESP_REASONING) {
        sb_puts(b, "{\"type\":\"reasoning\",\"id\":"); resp_item_id(b, rs, "rs_", index);
        sb_puts(b, ",\"summary\":[");
        if (done && rs->summary) {
            sb_puts(b, "{\"type\":\"summary_text\",\"text\":");
            sb_json_str(b, t, rs->part.len);
            sb_puts(b, "}");
        }
        sb_puts(b, "],\"content\":[");
        if (done) {
            sb_puts(b, "{\"type\":\"reasoning_text\",\"text\":");
            sb_json_str(b, t, rs->part.len);
            sb_puts(b, "}");
        }
        sb_puts(b, "]");
        if (done && rs->encrypted) {
            sb_puts(b, ",\"encrypted_content\":\"llm-rs1.");
            sb_base64(b, (const unsigned char *)t, rs->part.len);
            sb_puts(b, "\"");
        }
        sb_printf(b, ",\"status\":\"%s\"}", status);
    } else if (rs->open == RESP_MESSAGE) {
        sb_puts(b, "{\"type\":\"message\",\"id\":"); resp_item_id(b, rs, "msg_", index);
        sb_printf(b, ",\"status\":\"%s\",\"role\":\"assistant\",\"content\":[", status);
        if (done) resp_put_part(b, t, rs->part.len, &rs->part_lp);
        sb_puts(b, "]}");
    } else if (rs->open == RESP_CUSTOM) {
        sbuf in = {0};
        if (done) resp_custom_input(rs, &in);
        sb_puts(b, "{\"type\":\"custom_tool_call\",\"id\":"); resp_item_id(b, rs, "ctc_", index);
        sb_puts(b, ",\"call_id\":"); put_tool_call_id(b, r, 0, rs->open_call);
        sb_puts(b, ",\"name\":"); sb_json_cstr(b, rs->call_name ? rs->call_name : "");
        sb_puts(b, ",\"input\":"); sb_json_str(b, in.s ? in.s : "", in.len);
        sb_printf(b, ",\"status\":\"%s\"}", status);
        b->failed |= in.failed;
        sb_free(&in);
    } else {
        sb_puts(b, "{\"type\":\"function_call\",\"id\":"); resp_item_id(b, rs, "fc_", index);
        sb_puts(b, ",\"call_id\":"); put_tool_call_id(b, r, 0, rs->open_call);
        sb_puts(b, ",\"name\":"); sb_json_cstr(b, rs->call_name ? rs->call_name : "");
        sb_puts(b, ",\"arguments\":"); sb_json_str(b, t, done ? rs->part.len : 0);
        sb_printf(b, ",\"status\":\"%s\"}", status);
    }
}

/* The members every event of an item names it by: item_id, output_index (and content_index for text) */
static void resp_put_where(sbuf *b, srv_resp *rs, int content) {
    static const char *const prefix[] = {"", "rs_", "msg_", "fc_", "ctc_"};
    sb_puts(b, "\"item_id\":"); resp_item_id(b, rs, prefix[rs->open], rs->n_items - 1);
    sb_printf(b, ",\"output_index\":%d", rs->n_items - 1);
    if (content) sb_puts(b, ",\"content_index\":0");
}

/* The open item closed: its *.done events, then output_item.done with the item, whose JSON is kept as is for
 * the final object's output */
static void resp_close(srv_state *S, srv_req *r, int incomplete) {
    srv_resp *rs = r->resp;
    if (rs->open == RESP_NONE) return;
    sbuf b = {0}, item = {0};
    const char *t = rs->part.s ? rs->part.s : "";
    resp_put_where(&b, rs, rs->open != RESP_CALL && rs->open != RESP_CUSTOM);
    if (rs->open == RESP_REASONING) {
        size_t where = b.len;
        sb_puts(&b, ",\"text\":"); sb_json_str(&b, t, rs->part.len);
        resp_emit(S, r, "response.reasoning_text.done", b.s, b.len);
        if (rs->summary) {
            b.len = where;
            sb_puts(&b, ",\"summary_index\":0,\"text\":"); sb_json_str(&b, t, rs->part.len);
            resp_emit(S, r, "response.reasoning_summary_text.done", b.s, b.len);
            b.len = where;
            sb_puts(&b, ",\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":");
            sb_json_str(&b, t, rs->part.len);
            sb_puts(&b, "}");
            resp_emit(S, r, "response.reasoning_summary_part.done", b.s, b.len);
        }
    } else if (rs->open == RESP_MESSAGE) {
        size_t where = b.len;
        sb_puts(&b, ",\"text\":"); sb_json_str(&b, t, rs->part.len); resp_put_logprobs(&b, &rs->part_lp);
        resp_emit(S, r, "response.output_text.done", b.s, b.len);
        b.len = where;
        sb_puts(&b, ",\"part\":"); resp_put_part(&b, t, rs->part.len, &rs->part_lp);
        resp_emit(S, r, "response.content_part.done", b.s, b.len);
    } else if (rs->open == RESP_CUSTOM) { /* its input whole, once the shim's arguments can be read */
        sbuf in = {0};
        size_t where = b.len;
        resp_custom_input(rs, &in);
        sb_puts(&b, ",\"delta\":"); sb_json_str(&b, in.s ? in.s : "", in.len);
        if (in.len) resp_emit(S, r, "response.custom_tool_call_input.delta", b.s, b.len);
        b.len = where;
        sb_puts(&b, ",\"input\":"); sb_json_str(&b, in.s ? in.s : "", in.len);
        resp_emit(S, r, "response.custom_tool_call_input.done", b.s, b.len);
        sb_free(&in);
    } else {
        sb_puts(&b, ",\"name\":"); sb_json_cstr(&b, rs->call_name ? rs->call_name : "");
        sb_puts(&b, ",\"arguments\":"); sb_json_str(&b, t, rs->part.len);
        resp_emit(S, r, "response.function_call_arguments.done", b.s, b.len);
    }
    resp_put_item(&item, r, 1, incomplete);
    b.len = 0;
    sb_printf(&b, "\"output_index\":%d,\"item\":", rs->n_items - 1);
    sb_put(&b, item.s, item.len);
    resp_emit(S, r, "response.output_item.done", b.s, b.len);
    if (rs->items.len) sb_puts(&rs->items, ",");
    sb_put(&rs->items, item.s, item.len);
    arrput(rs->item_ends, rs->items.len);
    rs->items.failed |= item.failed | b.failed;
    sb_free(&b); sb_free(&item);
    rs->open = RESP_NONE; rs->part.len = 0; rs->part_lp.len = 0;
}

/* A new output item: the open one closed, then output_item.added (and a message's content_part.added) */
static void resp_open(srv_state *S, srv_req *r, int kind, int call, const char *name) {
    srv_resp *rs = r->resp;
    resp_close(S, r, 0);
    rs->open = kind; rs->open_call = call; rs->n_items++;
    free(rs->call_name);
    rs->call_name = name ? strdup(name) : NULL;
    sbuf b = {0};
    sb_printf(&b, "\"output_index\":%d,\"item\":", rs->n_items - 1);
    resp_put_item(&b, r, 0, 0);
    resp_emit(S, r, "response.output_item.added", b.s, b.len);
    if (kind == RESP_MESSAGE) {
        b.len = 0;
        resp_put_where(&b, rs, 1);
        sb_puts(&b, ",\"part\":"); resp_put_part(&b, "", 0, NULL);
        resp_emit(S, r, "response.content_part.added", b.s, b.len);
    }
    if (kind == RESP_REASONING && rs->summary) {
        b.len = 0;
        resp_put_where(&b, rs, 0);
        sb_puts(&b, ",\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":\"\"}");
        resp_emit(S, r, "response.reasoning_summary_part.added", b.s, b.len);
    }
    sb_free(&b);
}

/* What the open item's text gained: kept, and sent as its kind's delta event */
static void resp_delta(srv_state *S, srv_req *r, const char *piece, size_t n) {
    static const char *const events[] = {"", "response.reasoning_text.delta", "response.output_text.delta",
                                         "response.function_call_arguments.delta"};
    srv_resp *rs = r->resp;
    sb_put(&rs->part, piece, n);
    if (rs->open == RESP_CUSTOM) { /* its input is sent when it closes (resp_close) */
        rs->lp_pending.len = 0;
        return;
    }
    sbuf b = {0};
    resp_put_where(&b, rs, rs->open != RESP_CALL);
    sb_puts(&b, ",\"delta\":"); sb_json_str(&b, piece, n);
    if (rs->open == RESP_MESSAGE) { /* tokens no delta showed are this one's, and the part's */
        resp_put_logprobs(&b, &rs->lp_pending);
        if (rs->part_lp.len && rs->lp_pending.len) sb_puts(&rs->part_lp, ",");
        sb_put(&rs->part_lp, rs->lp_pending.s ? rs->lp_pending.s : "", rs->lp_pending.len);
        rs->part_lp.failed |= rs->lp_pending.failed;
    }
    rs->lp_pending.len = 0; /* a thought's or a call's tokens: no part of the text */
    resp_emit(S, r, events[rs->open], b.s, b.len);
    if (rs->open == RESP_REASONING && rs->summary) {
        b.len = 0;
        resp_put_where(&b, rs, 0);
        sb_puts(&b, ",\"summary_index\":0,\"delta\":"); sb_json_str(&b, piece, n);
        resp_emit(S, r, "response.reasoning_summary_text.delta", b.s, b.len);
    }
    sb_free(&b);
}

/* The reply so far read again (llm_chat_parse_reply; final: the whole reply) and what each part gained turned
 * into items: thinking into the reasoning item, the answer into the message, each call into its own
 * function_call item, in the order they come; an item is closed when the next one opens. At the end the
 * last is closed (incomplete when max_output_tokens cut it, or a call's arguments were cut), and a reply
 * with nothing in it still has its (empty) message. The choice's sent_* counts are what each part had. */
static void resp_advance(srv_state *S, srv_req *r, srv_choice *ch, int finish) {
    srv_resp *rs = r->resp;
    llm_chat_reply rep;
    const char *text = ch->text.s ? ch->text.s : "";
    if (llm_chat_parse_reply(&r->chat, text, ch->text.len, r->reasoning > 0, r->tool_calls, !finish, &rep)) {
        llm_chat_reply_free(&rep);
        rs->items.failed = 1;
        return;
    }
    size_t nr = rep.reasoning ? strlen(rep.reasoning) : 0, nc = strlen(rep.content);
    if (nr > ch->sent_reasoning) {
        if (rs->open != RESP_REASONING) resp_open(S, r, RESP_REASONING, 0, NULL);
        resp_delta(S, r, rep.reasoning + ch->sent_reasoning, nr - ch->sent_reasoning);
        ch->sent_reasoning = nr;
    }
    int thinking = rs->open == RESP_REASONING;
    if (nc > ch->sent_content) {
        if (rs->open != RESP_MESSAGE) resp_open(S, r, RESP_MESSAGE, 0, NULL);
        resp_delta(S, r, rep.content + ch->sent_content, nc - ch->sent_content);
        ch->sent_content = nc;
    }
    for (int k = 0; k < rep.n_calls; k++) {
        if (k >= arrlen(ch->sent_args)) {
            int custom = 0;
            for (ptrdiff_t m = 0; m < arrlen(rs->customs) && !custom; m++)
                custom = !strcmp(rs->customs[m], rep.calls[k].name);
            resp_open(S, r, custom ? RESP_CUSTOM : RESP_CALL, k, rep.calls[k].name);
            arrput(ch->sent_args, 0);
        }
        size_t na = strlen(rep.calls[k].arguments);
        if (na > ch->sent_args[k] && rs->open >= RESP_CALL && rs->open_call == k) {
            resp_delta(S, r, rep.calls[k].arguments + ch->sent_args[k], na - ch->sent_args[k]);
            ch->sent_args[k] = na;
        }
    }
    if (thinking && (rs->open != RESP_REASONING || finish)) rs->reasoning_tokens = ch->n_tokens;
    if (finish) {
        if (!rs->n_items) resp_open(S, r, RESP_MESSAGE, 0, NULL);
        resp_close(S, r, finish == LLM_FINISH_LENGTH || (rs->open >= RESP_CALL && rep.in_call));
    }
    llm_chat_reply_free(&rep);
}

/* A finished response's usage (a compaction's too) */
static void resp_put_usage(sbuf *b, const srv_req *r) { /* openai 3.54.0's InputTokensDetails requires
                                                         * cache_write_tokens */
    sb_printf(b, "{\"input_tokens\":%d,\"input_tokens_details\":{\"cached_tokens\":%d,"
              "\"cache_write_tokens\":0},\"output_tokens\":%d,\"output_tokens_details\":"
              "{\"reasoning_tokens\":%d},\"total_tokens\":%d}",
              r->prompt_tokens, r->n_prompts ? r->prompts[0].n_cached : 0, r->completion_tokens,
              r->resp->reasoning_tokens, r->prompt_tokens + r->completion_tokens);
}

/* The response object: as created, in progress (no output, no usage yet) or done (status completed,
 * incomplete or failed, the closed items, the usage) */
static void resp_put_object(sbuf *b, srv_state *S, srv_req *r, const char *status) {
    srv_resp *rs = r->resp;
    int done = strcmp(status, "in_progress") != 0;
    sb_puts(b, "{\"id\":"); sb_json_cstr(b, rs->id);
    sb_printf(b, ",\"object\":\"response\",\"created_at\":%lld,\"status\":\"%s\",\"completed_at\":",
              r->created, status);
    if (!strcmp(status, "completed")) sb_printf(b, "%lld", (long long)wall_s()); else sb_puts(b, "null");
    sb_puts(b, ",\"error\":");
    if (!strcmp(status, "failed")) {
        sb_puts(b, "{\"code\":\"server_error\",\"message\":"); sb_json_cstr(b, r->error); sb_puts(b, "}");
    } else sb_puts(b, "null");
    sb_printf(b, ",\"incomplete_details\":%s,\"model\":", !strcmp(status, "incomplete") ?
              "{\"reason\":\"max_output_tokens\"}" : "null");
    sb_json_cstr(b, S->model_name);
    sb_puts(b, ",\"output\":[");
    if (done) sb_put(b, rs->items.s ? rs->items.s : "", rs->items.len);
    sb_puts(b, "],");
    sb_puts(b, rs->echo ? rs->echo : "");
    sb_puts(b, ",\"usage\":");
    if (done) resp_put_usage(b, r); else sb_puts(b, "null");
    sb_puts(b, "}");
}

/* The stream's first events, once the request is in the engine: response.created, response.in_progress */
static void resp_started(srv_state *S, srv_req *r) {
    sbuf b = {0};
    sb_puts(&b, "\"response\":");
    resp_put_object(&b, S, r, "in_progress");
    resp_emit(S, r, "response.created", b.s, b.len);
    resp_emit(S, r, "response.in_progress", b.s, b.len);
    sb_free(&b);
}

/* An engine output of a Responses request: its text kept, the items advanced (apply_event) */
static void resp_output(srv_state *S, srv_req *r, srv_choice *ch, const srv_event *ev) {
    if (r->logprobs >= 0 && ev->n_tokens) add_logprobs(S, r, ch, ev, &r->resp->lp_pending, 0);
    if (ev->text_len) sb_put(&ch->text, ev->text, (size_t)ev->text_len);
    if (ev->text_len || ev->finish) resp_advance(S, r, ch, ev->finish);
}

static void store_put(srv_state *S, const srv_resp *rs, const char *object, size_t n);

/* A compaction's end: {"id", "object": "response.compaction", "created_at", "output", "usage"}, its output
 * the conversation's user messages (rs->kept) and one compaction item, the reply's text (its thinking
 * aside) as the summary; never streamed, never stored. A summary cut by the context is still one. */
static void resp_compact_finish(srv_state *S, srv_req *r) {
    srv_resp *rs = r->resp;
    srv_choice *ch = &r->choices[0];
    llm_chat_reply rep;
    if (!r->error[0] && ch->finish >= LLM_FINISH_ABORT)
        snprintf(r->error, sizeof r->error, "the request was aborted");
    if (!r->error[0] && llm_chat_parse_reply(&r->chat, ch->text.s ? ch->text.s : "", ch->text.len,
                                             r->reasoning > 0, 0, 0, &rep) == 0) {
        sbuf b = {0};
        sb_puts(&b, "{\"id\":"); sb_json_cstr(&b, rs->id);
        sb_printf(&b, ",\"object\":\"response.compaction\",\"created_at\":%lld,\"output\":[", r->created);
        sb_put(&b, rs->kept.s ? rs->kept.s : "", rs->kept.len);
        sb_puts(&b, rs->kept.len ? ",{\"type\":\"compaction\",\"id\":" : "{\"type\":\"compaction\",\"id\":");
        resp_item_id(&b, rs, "cmp_", 0);
        sb_puts(&b, ",\"encrypted_content\":\"llm-cmp1.");
        sb_base64(&b, (const unsigned char *)rep.content, strlen(rep.content));
        sb_puts(&b, "\"}],\"usage\":");
        resp_put_usage(&b, r);
        sb_puts(&b, "}");
        llm_chat_reply_free(&rep);
        if (!b.failed) send_response(S, r->conn, 200, "application/json", b.s, b.len, NULL);
        else snprintf(r->error, sizeof r->error, "out of memory writing the compaction");
        sb_free(&b);
        if (!r->error[0]) return;
    } else if (!r->error[0]) snprintf(r->error, sizeof r->error, "the summary could not be read");
    send_error(S, r->conn, 500, NULL, "%s", r->error);
}

/* The end (finish_request): the object with its status; a stream's terminal event (after an error event
 * when the engine failed) and the chunked body's end, or the whole body; stored when store is on */
static void resp_finish(srv_state *S, srv_req *r) {
    srv_conn *c = r->conn;
    srv_resp *rs = r->resp;
    int finish = r->choices[0].finish;
    if (rs->compact) { resp_compact_finish(S, r); return; }
    const char *status = r->error[0] || finish >= LLM_FINISH_ABORT ? "failed" :
                         finish == LLM_FINISH_LENGTH ? "incomplete" : "completed";
    if (!r->error[0] && finish >= LLM_FINISH_ABORT)
        snprintf(r->error, sizeof r->error, "the request was aborted");
    sbuf b = {0};
    sb_puts(&b, "\"response\":");
    size_t at = b.len;
    resp_put_object(&b, S, r, status);
    if (b.failed || rs->items.failed) { /* the object could not be written whole */
        snprintf(r->error, sizeof r->error, "out of memory writing the response");
        status = "failed";
    }
    if (r->stream) {
        if (!strcmp(status, "failed")) {
            sbuf er = {0};
            sb_puts(&er, "\"code\":\"server_error\",\"message\":"); sb_json_cstr(&er, r->error);
            sb_puts(&er, ",\"param\":null");
            resp_emit(S, r, "error", er.s, er.len);
            sb_free(&er);
        }
        char type[40];
        snprintf(type, sizeof type, "response.%s", status);
        resp_emit(S, r, type, b.s, b.len);
        conn_send(S, c, "0\r\n\r\n", 5); /* the chunked body's end */
    } else if (!strcmp(status, "failed")) send_error(S, c, 500, NULL, "%s", r->error);
    else send_response(S, c, 200, "application/json", b.s + at, b.len - at, NULL);
    if (rs->store && strcmp(status, "failed")) store_put(S, rs, b.s + at, b.len - at);
    sb_free(&b);
}

/* ---- The store of responses -------------------------------------------------------------------------- */
/* store (true by default, as OpenAI's) keeps a response for GET /v1/responses/{id} and for a later request's
 * previous_response_id: its object and its conversation (the input items, its parent's first, then its
 * output items), so a continuation reads one entry, whatever became of its ancestors. In memory, bounded by
 * --responses-store entries and --responses-store-bytes: the oldest go first; an entry larger than a quarter
 * of the bytes is not kept. Written on the network thread, read by the workers: store_lock. */

/* An entry's memory freed (not yet in the store, or dropped from it) */
static void store_free(resp_stored *e) {
    free(e->object); free(e->history);
    arrfree(e->items);
}

static void store_drop(srv_state *S, ptrdiff_t i) { /* under store_lock */
    S->store_bytes -= S->store[i].bytes;
    store_free(&S->store[i]);
    arrdel(S->store, i);
}

/* The output items of a response indexed by id into e->items: each one's place in e->history, where its
 * output items (rs->items) begin at base. An item's JSON begins {"type":"...","id":"...": resp_put_item
 * writes every one so. */
static void store_index_items(resp_stored *e, const srv_resp *rs, size_t base) {
    size_t start = 0;
    for (ptrdiff_t k = 0; k < arrlen(rs->item_ends); k++) {
        size_t end = rs->item_ends[k];
        resp_item it = {{0}, base + start, end - start};
        const char *json = e->history + it.off, *id = strstr(json, "\"id\":\"");
        if (id && id < json + it.len) {
            id += 6;
            size_t n = strcspn(id, "\"");
            if (n < sizeof it.id) { memcpy(it.id, id, n); arrput(e->items, it); e->bytes += sizeof it; }
        }
        start = end + 1; /* past the comma */
    }
}

/* A finished response kept (on the network thread): its object as sent and its conversation, the parent's
 * first, then its own input and output items; then the oldest dropped until both bounds hold */
static void store_put(srv_state *S, const srv_resp *rs, const char *object, size_t n) {
    resp_stored e = {{0}, NULL, NULL, NULL, 0};
    memcpy(e.id, rs->id, sizeof e.id);
    sbuf h = {0};
    sb_puts(&h, "[");
    sb_puts(&h, rs->history ? rs->history : "");
    if (rs->history && rs->history[0] && rs->items.len) sb_puts(&h, ",");
    size_t items_at = h.len;
    sb_put(&h, rs->items.s ? rs->items.s : "", rs->items.len);
    sb_puts(&h, "]");
    e.bytes = n + h.len + sizeof e;
    e.object = (char *)malloc(n + 1);
    e.history = h.s;
    if (!h.failed && !rs->items.failed) store_index_items(&e, rs, items_at);
    if (h.failed || rs->items.failed || !e.object || e.bytes > S->store_max_bytes / 4 || S->store_max < 1) {
        if (e.object)
            fprintf(stderr, "llm serve: %s not stored (%zu bytes; --responses-store-bytes %zu keeps entries "
                    "up to a quarter of it)\n", rs->id, e.bytes, S->store_max_bytes);
        store_free(&e);
        return;
    }
    memcpy(e.object, object, n); e.object[n] = 0;
    pthread_mutex_lock(&S->store_lock);
    arrput(S->store, e);
    S->store_bytes += e.bytes;
    while (arrlen(S->store) > S->store_max || S->store_bytes > S->store_max_bytes) store_drop(S, 0);
    pthread_mutex_unlock(&S->store_lock);
}

/* GET /v1/responses/{id}: the stored object; DELETE: forgotten. An id not in the store: 404. */
static void handle_stored_response(srv_state *S, srv_conn *c, const http_request *rq) {
    const char *id = rq->path + 14;
    char *object = NULL;
    int found = 0, del = !strcmp(rq->method, "DELETE");
    pthread_mutex_lock(&S->store_lock);
    for (ptrdiff_t i = 0; i < arrlen(S->store) && !found; i++) {
        if (strcmp(S->store[i].id, id)) continue;
        found = 1;
        if (del) store_drop(S, i); else object = strdup(S->store[i].object);
    }
    pthread_mutex_unlock(&S->store_lock);
    if (!found) { send_error(S, c, 404, "response_id", "Response with id '%.64s' not found.", id); return; }
    if (del) {
        sbuf b = {0};
        sb_puts(&b, "{\"id\":"); sb_json_cstr(&b, id);
        sb_puts(&b, ",\"object\":\"response\",\"deleted\":true}");
        send_response(S, c, 200, "application/json", b.s, b.len, NULL);
        sb_free(&b);
    } else if (!object) send_error(S, c, 500, NULL, "out of memory");
    else send_response(S, c, 200, "application/json", object, strlen(object), NULL);
    free(object);
}

/* ===========================================================================================================
 * Embeddings: POST /v1/embeddings (OpenAI's shape, vLLM's pooling)
 *
 * Each input (a string, a list of them, a list of ids, a list of lists: completion_prompts reads them as it
 * reads a completion's prompts, with the same bounds) is one engine request whose sampling asks for the
 * model's pooling (llm_sampling_params.pooling): attach_generation adds them, so they share the scheduler,
 * the queue's bound and the steps with the generations. The finishing output of each carries its vector;
 * embed_finish normalises it (L2), keeps the first `dimensions` values (Matryoshka: then normalised again)
 * and writes floats (%.9g: a float32 read back is the same float) or base64 of the little-endian float32
 * values, padded, which the openai client asks for unless told otherwise and decodes with numpy.
 * ======================================================================================================== */
static const char *const pooling_names[5] = {"none", "mean", "cls", "last", "rank"};

/* /v1/embeddings' fields, checked, and its inputs tokenized into r (one prompt each) and p: 0, or -1 with
 * the 400 in *e. The model must pool: --pooling, or its GGUF pooling_type (mean, cls, last). */
static int prepare_embeddings(srv_state *S, const llm_json *body, const char *request_id, srv_req *r,
                              llm_sampling_params *p, srv_error *e) {
    r->kind = REQ_EMBED; r->n = 1; r->logprobs = -1; r->prompt_logprobs = -1;
    r->created = (long long)wall_s();
    snprintf(r->id, sizeof r->id, "embd-%s", request_id);
    if (check_fields(S, body, req_fields, sizeof req_fields / sizeof *req_fields, F_EMBED, e) ||
        check_model(S, body, e))
        return -1;
    const char *arch = llm_arch_names[S->model->cfg.arch];
    if (S->pooling == 0)
        return bad(e, 400, NULL, "this model makes no embeddings: it has no pooling type (GGUF key "
                   "%s.pooling_type) and --pooling was not given", arch);
    if (S->pooling > LLM_POOL_LAST)
        return bad(e, 400, NULL, "this model is a reranker: it answers /v1/rerank and /v1/score; --pooling "
                   "mean|cls|last embeds with it");
    const llm_json *fmt = llm_json_get(body, "encoding_format"), *user = llm_json_get(body, "user");
    if (fmt && fmt->type != LLM_JSON_NULL && !fv_str(fmt, "float") && !(r->base64 = fv_str(fmt, "base64")))
        return bad(e, 400, "encoding_format", "encoding_format must be \"float\" or \"base64\"");
    if (user && user->type != LLM_JSON_NULL && user->type != LLM_JSON_STRING)
        return bad(e, 400, "user", "user must be a string");
    int dim = S->model->cfg.dim;
    double x = 0;
    if (get_number(body, "dimensions", 1, dim, 1, &x, e)) return -1;
    /* fewer values than the model's only where it was trained for them (GGUF has no key that says so) */
    int matryoshka = S->matryoshka || strstr(S->model->name, "Qwen3-Embedding") != NULL;
    if (x && x < dim && !matryoshka)
        return bad(e, 400, "dimensions", "this model does not declare Matryoshka embeddings: dimensions must "
                   "be its size, %d, or absent (llm serve --matryoshka allows fewer)", dim);
    r->dimensions = (int)x;
    r->add_special = 1; /* BOS and EOS as the vocabulary asks: a last-token pooling reads the EOS */
    if (get_bool(body, "add_special_tokens", &r->add_special, e) || parse_truncation(S, body, r, e))
        return -1;
    const llm_json *input = llm_json_get(body, "input");
    for (int i = 0; input && i < (input->type == LLM_JSON_ARRAY ? input->n : 1); i++) {
        const llm_json *v = input->type == LLM_JSON_ARRAY ? &input->items[i] : input;
        if (v->type == LLM_JSON_STRING && v->len == 0)
            return bad(e, 400, "input", "input has an empty string");
    }
    if (completion_prompts(S, input, "input", r, e)) return -1;
    /* a text's ids end with EOS when the vocabulary asks, as llama.cpp's add_special (the engine's text
     * prompts too): an input item is a string when the input is a string or a list of them */
    int eos = llm_tokenizer_eos(S->model->tok), strings = input->type == LLM_JSON_STRING ||
        (input->type == LLM_JSON_ARRAY && input->n > 0 && input->items[0].type == LLM_JSON_STRING);
    strings = strings && r->add_special && llm_tokenizer_adds_eos(S->model->tok) && eos >= 0;
    for (int i = 0; i < r->n_prompts && strings; i++)
        if (arrlast(r->prompts[i].prompt_ids) != eos) arrput(r->prompts[i].prompt_ids, eos);
    if (truncate_prompts(S, r, e)) return -1;
    for (int i = 0; i < r->n_prompts; i++) { /* vLLM's words; all of the context, no token generated */
        int n = (int)arrlen(r->prompts[i].prompt_ids);
        if (n > S->max_model_len)
            return bad(e, 400, "input", "This model's maximum context length is %d tokens. However, you "
                       "requested %d tokens in the input for embedding generation. Please reduce the length "
                       "of the input.", S->max_model_len, n);
    }
    *p = llm_sampling_defaults();
    p->pooling = S->pooling;
    return 0;
}

/* n float32 values as standard base64, padded, of their little-endian bytes (the openai client's default:
 * it decodes them with numpy's frombuffer as float32) */
static void put_base64_floats(sbuf *b, const float *v, int n) {
    size_t len = (size_t)n * 4;
    uint8_t *bytes = (uint8_t *)malloc(len ? len : 1);
    if (!bytes) { b->failed = 1; return; }
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) bytes[i * 4 + k] = (uint8_t)(u >> (8 * k));
    }
    sb_puts(b, "\"");
    sb_base64(b, bytes, len);
    sb_puts(b, "\"");
    free(bytes);
}

/* The whole response of an embeddings request, every input's vector in order */
static void embed_finish(srv_state *S, srv_req *r) {
    srv_conn *c = r->conn;
    sbuf b = {0};
    sb_puts(&b, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < r->n_prompts; i++) {
        srv_prompt *sp = &r->prompts[i];
        int d = r->dimensions && r->dimensions < sp->n_embedding ? r->dimensions : sp->n_embedding;
        if (!sp->embedding) { b.failed = 1; break; } /* (every prompt finished with its vector) */
        llm_embedding_normalize(sp->embedding, d);
        sb_printf(&b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        if (r->base64) put_base64_floats(&b, sp->embedding, d);
        else {
            sb_puts(&b, "[");
            for (int k = 0; k < d; k++) sb_printf(&b, "%s%.9g", k ? "," : "", (double)sp->embedding[k]);
            sb_puts(&b, "]");
        }
        sb_puts(&b, "}");
    }
    sb_puts(&b, "],\"model\":");
    sb_json_cstr(&b, S->model_name);
    sb_printf(&b, ",\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}", r->prompt_tokens,
              r->prompt_tokens);
    if (b.failed) send_error(S, c, 500, NULL, "out of memory writing the response");
    else send_response(S, c, 200, "application/json", b.s, b.len, NULL);
    sb_free(&b);
}

/* ===========================================================================================================
 * Reranking: POST /v1/rerank (Jina's and Cohere's shape, as vLLM and llama-server serve it) and /v1/score
 * (vLLM's), on a reranker: a file llama.cpp converted (pooling_type rank, and cls.output: Qwen3-Reranker's
 * "yes" and "no" rows), the Qwen3-Reranker model as published (a plain Qwen3 LM, general.name with
 * "Reranker": the output layer's rows of "yes" and "no"), or any model with --pooling rank.
 *
 * Each (query, document) pair is one engine request pooled as rank (llm_sampling_params.pooling), so they
 * share the scheduler and the prefix cache (a query's shared opening is computed once) with generations.
 * Its prompt is the file's tokenizer.chat_template.rerank with {query} and {document} put in (llama.cpp's
 * converter writes it), else Qwen3-Reranker's own format (RANK_TEMPLATE, with its default instruction);
 * the engine's one value, the relevance logit l(yes) - l(no) of the last position, becomes the score
 * through a sigmoid: the softmax probability of "yes" against "no", as vLLM's Qwen3 reranker gives it.
 * ======================================================================================================== */
#define RANK_TEMPLATE "<|im_start|>system\nJudge whether the Document meets the requirements based on the " \
    "Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"      \
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the "  \
    "query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n"                  \
    "<think>\n\n</think>\n\n"

/* At the start: whether the model is a reranker, and how it scores: the file's pooling_type rank, --pooling
 * rank, or a general.name with "Reranker" (Qwen3-Reranker's GGUFs as published are the plain LM). One
 * without cls.output scores with its output rows of "yes" and "no", which must be one token each */
static int rank_setup(srv_state *S, char *err, size_t cap) {
    if (!S->pooling && strstr(S->model->name, "Reranker")) S->pooling = LLM_POOL_RANK;
    if (S->pooling != LLM_POOL_RANK) return 0;
    S->rank_template = llm_gguf_string(&S->model->gguf, "tokenizer.chat_template.rerank");
    if (!S->rank_template.ptr) S->rank_template = (llm_str){RANK_TEMPLATE, strlen(RANK_TEMPLATE)};
    const char *words[2] = {"yes", "no"};
    for (int k = 0; k < 2 && !S->model->cls_out.data; k++) {
        int32_t ids[4];
        if (llm_tokenize(S->model->tok, words[k], strlen(words[k]), 0, 0, ids, 4) != 1) {
            snprintf(err, cap, "--pooling rank: the model has no cls.output, and \"%s\" is not one token of "
                     "its vocabulary to score with", words[k]);
            return -1;
        }
        S->rank_ids[k] = ids[0];
    }
    return 0;
}

/* Item i of a rerank or score field: of a list, or the one value */
static const llm_json *rank_item(const llm_json *v, int i) {
    return v->type == LLM_JSON_ARRAY ? &v->items[i] : v;
}

/* A text of a rerank or score field: a string, or (a document) {"text": string} */
static const llm_json *rank_text(const llm_json *v) {
    if (v->type == LLM_JSON_OBJECT) v = llm_json_get(v, "text");
    return v && v->type == LLM_JSON_STRING ? v : NULL;
}

/* The prompt of one pair: the template with the query and the document in place of {query} and
 * {document} (each once, where the template has it), tokenized with its special tokens */
static int rank_prompt(srv_state *S, const llm_json *query, const llm_json *doc, int32_t **ids) {
    sbuf b = {0};
    const char *t = S->rank_template.ptr, *end = t + S->rank_template.len;
    while (t < end) {
        const char *q = memchr(t, '{', (size_t)(end - t));
        if (!q) { sb_put(&b, t, (size_t)(end - t)); break; }
        sb_put(&b, t, (size_t)(q - t));
        if ((size_t)(end - q) >= 7 && !memcmp(q, "{query}", 7)) {
            sb_put(&b, query->str, query->len); t = q + 7;
        } else if ((size_t)(end - q) >= 10 && !memcmp(q, "{document}", 10)) {
            sb_put(&b, doc->str, doc->len); t = q + 10;
        } else { sb_put(&b, q, 1); t = q + 1; }
    }
    int rc = b.failed ? -1 : tokenize_text(S, b.s ? b.s : "", b.len, 1, ids);
    sb_free(&b);
    return rc;
}

/* /v1/rerank's fields (query, documents, top_n, return_documents) or /v1/score's (text_1, text_2: one to
 * one, one to many, or many to many pairwise), checked, and each pair's prompt into r; 0, or -1 with the
 * 400 in *e. The count of pairs is bounded before anything is allocated (SRV_MAX_PROMPTS) */
static int prepare_rerank(srv_state *S, const llm_json *body, int score, const char *request_id, srv_req *r,
                          llm_sampling_params *p, srv_error *e) {
    r->kind = score ? REQ_SCORE : REQ_RERANK; r->n = 1; r->logprobs = -1; r->prompt_logprobs = -1;
    r->created = (long long)wall_s();
    snprintf(r->id, sizeof r->id, "%s-%s", score ? "score" : "rerank", request_id);
    if (check_fields(S, body, req_fields, sizeof req_fields / sizeof *req_fields, 1 << r->kind, e) ||
        check_model(S, body, e))
        return -1;
    if (S->pooling != LLM_POOL_RANK)
        return bad(e, 400, NULL, "this model is not a reranker: its pooling type is %d (%s), not 4 (rank); "
                   "llm serve --pooling rank scores with it anyway", S->pooling, pooling_names[S->pooling]);
    const char *f1 = score ? "text_1" : "query", *f2 = score ? "text_2" : "documents";
    const llm_json *a = llm_json_get(body, f1), *b = llm_json_get(body, f2);
    const llm_json *user = llm_json_get(body, "user");
    if (user && user->type != LLM_JSON_NULL && user->type != LLM_JSON_STRING)
        return bad(e, 400, "user", "user must be a string");
    if (score && (!a || (a->type != LLM_JSON_STRING && a->type != LLM_JSON_ARRAY)))
        return bad(e, 400, f1, "text_1 must be a string or a list of strings");
    if (!score && (!a || a->type != LLM_JSON_STRING)) return bad(e, 400, f1, "query must be a string");
    if (!b || (b->type != LLM_JSON_ARRAY && !(score && b->type == LLM_JSON_STRING)))
        return bad(e, 400, f2, score ? "text_2 must be a string or a list of strings"
                                     : "documents must be a list of strings or of {\"text\": ...} objects");
    int n1 = a->type == LLM_JSON_ARRAY ? a->n : 1, n2 = b->type == LLM_JSON_ARRAY ? b->n : 1;
    if (n1 <= 0 || n2 <= 0) return bad(e, 400, n1 > 0 ? f2 : f1, "%s is empty", n1 > 0 ? f2 : f1);
    if (n1 > 1 && n1 != n2)
        return bad(e, 400, f1, "text_1 has %d texts and text_2 %d: give one text_1, or as many as text_2", n1,
                   n2);
    if (n2 > SRV_MAX_PROMPTS) return bad(e, 400, f2, "at most %d %s in one request", SRV_MAX_PROMPTS, f2);
    double top_n = 0;
    r->rank_documents = !score; /* by default (vLLM's and Jina's) */
    if (!score && (get_number(body, "top_n", 0, 1e9, 1, &top_n, e) ||
                   get_bool(body, "return_documents", &r->rank_documents, e)))
        return -1;
    r->rank_top_n = top_n > 0 && top_n < n2 ? (int)top_n : n2;
    if (parse_truncation(S, body, r, e)) return -1;
    /* the text tokenized: a query repeats in every pair, so 1024 documents under one long query would be
     * a thousand times the body's bytes (and truncate_prompt_tokens lets each pair past the context) */
    size_t text_bytes = 0;
    for (int i = 0; i < n2; i++) {
        const llm_json *q = rank_text(rank_item(a, n1 > 1 ? i : 0)), *d = rank_text(rank_item(b, i));
        text_bytes += S->rank_template.len + (q ? q->len : 0) + (d ? d->len : 0);
    }
    if (text_bytes > SRV_MAX_BODY)
        return bad(e, 400, f1, "the prompts of these pairs come to %zu bytes, more than %d: send fewer or "
                   "shorter texts", text_bytes, SRV_MAX_BODY);
    if (!(r->prompts = (srv_prompt *)calloc((size_t)n2, sizeof(srv_prompt))))
        return bad(e, 500, NULL, "out of memory");
    r->n_prompts = n2;
    for (int i = 0; i < n2; i++) {
        const llm_json *qv = rank_item(a, n1 > 1 ? i : 0), *dv = rank_item(b, i), *q = rank_text(qv), *d;
        char param[48];
        if (!q || qv->type != LLM_JSON_STRING) {
            snprintf(param, sizeof param, a->type == LLM_JSON_ARRAY ? "%s[%d]" : "%s", f1, n1 > 1 ? i : 0);
            return bad(e, 400, param, "%s must be a string", param);
        }
        snprintf(param, sizeof param, b->type == LLM_JSON_ARRAY ? "%s[%d]" : "%s", f2, i);
        if (!(d = rank_text(dv)) || (score && dv->type != LLM_JSON_STRING))
            return bad(e, 400, param, score ? "%s must be a string" : "%s must be a string or {\"text\": "
                       "string}", param);
        if (dv->type == LLM_JSON_OBJECT && dv->n != 1)
            return bad(e, 400, param, "%s: a document object has only \"text\"", param);
        srv_prompt *sp = &r->prompts[i];
        sp->req = r; sp->index = i;
        if (rank_prompt(S, q, d, &sp->prompt_ids))
            return bad(e, 400, param, "%s could not be tokenized", param);
        if (!score && r->rank_documents) {
            if (!(sp->document = (char *)malloc(d->len + 1))) return bad(e, 500, NULL, "out of memory");
            memcpy(sp->document, d->str, d->len); sp->document[d->len] = 0; sp->document_len = d->len;
        }
    }
    if (truncate_prompts(S, r, e)) return -1;
    for (int i = 0; i < r->n_prompts; i++) { /* all of the context, no token generated */
        int n = (int)arrlen(r->prompts[i].prompt_ids);
        if (n > S->max_model_len)
            return bad(e, 400, f2, "This model's maximum context length is %d tokens. However, you requested "
                       "%d tokens in the input for scoring (%s[%d] with its query and the reranker's "
                       "prompt). Please reduce the length of the input.", S->max_model_len, n, f2, i);
    }
    *p = llm_sampling_defaults();
    p->pooling = LLM_POOL_RANK;
    p->rank_ids[0] = S->rank_ids[0]; p->rank_ids[1] = S->rank_ids[1];
    return 0;
}

/* A relevance logit as a score: the probability of "yes" against "no" */
static double rank_score(float logit) { return 1.0 / (1.0 + exp(-(double)logit)); }

/* The order of /v1/rerank's results: the higher score first, the earlier document on a tie */
static int rank_cmp(const void *x, const void *y) {
    const srv_prompt *a = *(const srv_prompt *const *)x, *b = *(const srv_prompt *const *)y;
    float sa = a->embedding[0], sb = b->embedding[0];
    return sa > sb ? -1 : sa < sb ? 1 : a->index - b->index;
}

/* The whole response of /v1/rerank (the top_n results, best first) or /v1/score (every pair's, in order) */
static void rerank_finish(srv_state *S, srv_req *r) {
    srv_conn *c = r->conn;
    sbuf b = {0};
    srv_prompt **order = (srv_prompt **)malloc((size_t)r->n_prompts * sizeof *order);
    int ok = order != NULL;
    for (int i = 0; ok && i < r->n_prompts; i++) {
        order[i] = &r->prompts[i];
        ok = r->prompts[i].embedding && r->prompts[i].n_embedding == 1; /* (every pair came with its value) */
    }
    if (ok && r->kind == REQ_RERANK) qsort(order, (size_t)r->n_prompts, sizeof *order, rank_cmp);
    sb_printf(&b, "{\"id\":\"%s\",", r->id);
    if (r->kind == REQ_SCORE) sb_printf(&b, "\"object\":\"list\",\"created\":%lld,", r->created);
    sb_puts(&b, "\"model\":");
    sb_json_cstr(&b, S->model_name);
    sb_puts(&b, r->kind == REQ_SCORE ? ",\"data\":[" : ",\"results\":[");
    for (int i = 0; ok && i < (r->kind == REQ_RERANK ? r->rank_top_n : r->n_prompts); i++) {
        const srv_prompt *sp = order[i];
        sb_printf(&b, "%s{\"index\":%d,", i ? "," : "", sp->index);
        double x = rank_score(sp->embedding[0]);
        if (r->kind == REQ_SCORE) { sb_printf(&b, "\"object\":\"score\",\"score\":%.9g}", x); continue; }
        if (sp->document) {
            sb_puts(&b, "\"document\":{\"text\":");
            sb_json_str(&b, sp->document, sp->document_len);
            sb_puts(&b, "},");
        }
        sb_printf(&b, "\"relevance_score\":%.9g}", x);
    }
    sb_printf(&b, "],\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}", r->prompt_tokens,
              r->prompt_tokens);
    if (!ok || b.failed) send_error(S, c, 500, NULL, "out of memory writing the response");
    else send_response(S, c, 200, "application/json", b.s, b.len, NULL);
    free(order);
    sb_free(&b);
}

/* ===========================================================================================================
 * Metrics: vLLM's names, so existing dashboards work
 *
 * GET /metrics answers in Prometheus' text format: for each metric a "# HELP name text" line, a "# TYPE name
 * counter|gauge|histogram" line, then its samples, "name{labels} value". A histogram is written as its
 * cumulative buckets (name_bucket{le="bound"}: the samples <= bound, the last le="+Inf"), then name_sum and
 * name_count; Prometheus computes quantiles from them (histogram_quantile). The names, help texts, labels and
 * bucket bounds are vLLM's (vllm/v1/metrics/loggers.py), so that dashboards made for vLLM read this server.
 * Where the figures come from: the engine's counters (running, waiting, blocks, prefix cache, preemptions)
 * are the engine thread's llm_engine_stats, copied under S->lock after each step; the request figures
 * (latencies, tokens per request, finish reasons) are kept by the network thread as events are applied
 * (apply_event, request_done), so it reads them without a lock. Each histogram is a fixed array of counts
 * (srv_hist): a metric costs the same memory after a billion requests as after one.
 * ======================================================================================================== */
/* vLLM's buckets, in seconds: time to first token and the gap between two tokens of a request */
static const double hist_ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double hist_itl[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
/* vLLM's request_latency_buckets: e2e, and the queue, prefill, decode and inference times */
static const double hist_e2e[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                  60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

/* vLLM's build_1_2_5_buckets(max_model_len), for token counts: 1, 2, 5, 10, 20, 50, ... up to max. Returns
 * how many (at most cap). */
static int hist_1_2_5(double *out, int cap, int max) {
    int n = 0;
    for (double scale = 1; n < cap; scale *= 10)
        for (int k = 0; k < 3 && n < cap; k++) {
            double x = (k == 0 ? 1 : k == 1 ? 2 : 5) * scale;
            if (x > max) return n;
            out[n++] = x;
        }
    return n;
}

/* Every series has vLLM's labels: model_name and engine (the engine's index: one engine here, "0") */
#define SRV_LABELS "model_name=\"%s\",engine=\"0\""

/* A histogram in Prometheus' text format: cumulative buckets (le), then its sum and count */
static void put_hist(sbuf *b, const char *name, const char *help, const srv_hist *h, const char *model) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    int64_t cum = 0;
    for (int i = 0; i <= h->n_bounds; i++) {
        cum += h->counts[i];
        char le[32] = "+Inf"; /* as Python's prometheus_client writes a bound: 0.001, 1.0, 2560.0 */
        if (i < h->n_bounds && h->bounds[i] == floor(h->bounds[i]) && h->bounds[i] < 1e15)
            snprintf(le, sizeof le, "%.1f", h->bounds[i]);
        else if (i < h->n_bounds) snprintf(le, sizeof le, "%g", h->bounds[i]);
        sb_printf(b, "%s_bucket{" SRV_LABELS ",le=\"%s\"} %lld\n", name, model, le, (long long)cum);
    }
    sb_printf(b, "%s_sum{" SRV_LABELS "} %.9g\n", name, model, h->sum);
    sb_printf(b, "%s_count{" SRV_LABELS "} %lld\n", name, model, (long long)h->count);
}

/* GET /metrics: the engine's stats (as its thread last left them, under S->lock) and the network thread's
 * counters and histograms, in Prometheus' text format, with vLLM's names and labels. */
static void handle_metrics(srv_state *S, srv_conn *c) {
    /* 1. a copy of the engine's stats, and the model's name made safe inside a label's quotes */
    pthread_mutex_lock(&S->lock);
    llm_engine_stats st = S->stats;
    pthread_mutex_unlock(&S->lock);
    sbuf b = {0};
    char model[300];
    snprintf(model, sizeof model, "%s", S->model_name);
    for (char *p = model; *p; p++) if (*p == '"' || *p == '\\' || *p == '\n') *p = '_';
    /* counters as prometheus_client writes them: "_total" ends the name on the HELP and TYPE lines too */
#define GAUGE(name, help, fmt, value) \
    sb_printf(&b, "# HELP " name " " help "\n# TYPE " name " gauge\n" name "{" SRV_LABELS "} " fmt "\n", \
              model, value)
#define COUNTER(name, help, value) \
    sb_printf(&b, "# HELP " name " " help "\n# TYPE " name " counter\n" name "{" SRV_LABELS "} %lld\n", \
              model, (long long)(value))
    /* 2. the engine's gauges and counters (the speculative ones only when it drafts) */
    GAUGE("vllm:num_requests_running", "Number of requests in model execution batches.", "%d", st.running);
    GAUGE("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "%d", st.waiting);
    GAUGE("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "%.6f",
          st.num_blocks ? (double)(st.num_blocks - st.num_free_blocks) / st.num_blocks : 0.0);
    GAUGE("llm:kv_cache_free_blocks", "KV-cache blocks free (cached prefixes count as free).", "%d",
          st.num_free_blocks);
    GAUGE("llm:kv_cache_blocks", "KV-cache blocks in the pool.", "%d", st.num_blocks);
    COUNTER("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
            st.prefix_cache_queries);
    COUNTER("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
            st.prefix_cache_hits);
    COUNTER("vllm:prompt_tokens_total", "Number of prefill tokens processed.", S->prompt_tokens_total);
    COUNTER("vllm:generation_tokens_total", "Number of generation tokens processed.", st.generation_tokens);
    COUNTER("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", st.preemptions);
    if (st.spec_tokens > 0) { /* as vLLM: with speculative decoding on */
        COUNTER("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", st.spec_drafts);
        COUNTER("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", st.spec_draft_tokens);
        COUNTER("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
                st.spec_accepted_tokens);
#define PER_POS "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        sb_puts(&b, "# HELP " PER_POS " Accepted tokens per draft position.\n# TYPE " PER_POS " counter\n");
        for (int i = 0; i < st.spec_tokens; i++)
            sb_printf(&b, PER_POS "{" SRV_LABELS ",position=\"%d\"} %lld\n", model, i,
                      (long long)st.spec_accepted_at[i]);
#undef PER_POS
    }
#undef GAUGE
#undef COUNTER
    /* 3. the process's memory, and the requests finished by reason (one series per finish reason) */
    /* as Prometheus's process collector names it (vLLM's prometheus_client exports it): a server's memory
     * should settle, and this shows whether it does */
    sb_printf(&b, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
              "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %.0f\n",
              proc_memory_bytes("VmRSS"));
    sb_puts(&b, "# HELP vllm:request_success_total Count of successfully processed requests.\n"
                "# TYPE vllm:request_success_total counter\n");
    for (int f = LLM_FINISH_STOP; f <= LLM_FINISH_ERROR; f++)
        sb_printf(&b, "vllm:request_success_total{" SRV_LABELS ",finished_reason=\"%s\"} %lld\n", model,
                  srv_finish_names[f], (long long)S->success[f]);
    /* vLLM's info gauge of the cache config (its labels are CacheConfig's fields; these are the ones that
     * mean something here), then engine */
    sb_printf(&b, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
              "# TYPE vllm:cache_config_info gauge\n"
              "vllm:cache_config_info{block_size=\"%d\",enable_prefix_caching=\"%s\",num_cpu_blocks=\"None\","
              "num_gpu_blocks=\"%d\",engine=\"0\"} 1\n", st.block_size,
              S->enable_prefix_caching ? "True" : "False", st.num_blocks);
    /* 4. the histograms: per request (ttft, gaps, end to end), then per engine request (a prompt) */
    put_hist(&b, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &S->ttft,
             model);
    put_hist(&b, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &S->itl,
             model);
    put_hist(&b, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &S->e2e,
             model);
    put_hist(&b, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
             &S->queue, model);
    put_hist(&b, "vllm:request_inference_time_seconds",
             "Histogram of time spent in RUNNING phase for request.", &S->inference, model);
    put_hist(&b, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
             &S->prefill, model);
    put_hist(&b, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
             &S->decode, model);
    put_hist(&b, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", &S->req_prompt, model);
    put_hist(&b, "vllm:request_generation_tokens", "Number of generation tokens processed.", &S->req_gen,
             model);
    send_response(S, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.s ? b.s : "", b.len, NULL);
    sb_free(&b);
}

/* ===========================================================================================================
 * llm serve
 *
 * The command: serve_config is what main.c's flags give (vLLM's names: --port, --api-key,
 * --served-model-name, --max-num-seqs...), serve sets up each piece the sections above use and runs the
 * network loop until a signal. SIGTERM or SIGINT drains (g_srv_stop): /health turns 503 and new
 * generations are refused, the requests in flight run to their end for up to --drain-timeout seconds, then
 * the ones left are cut short; a second signal stops at once. Read serve's numbered steps in order; the
 * loop of step 4 is the server's heartbeat.
 * ======================================================================================================== */
typedef struct {
    llm_engine_config engine;
    const char *host, *api_key, *served_model_name, *chat_template;
    int port, max_queue;
    double request_timeout;         /* seconds a client has to send a request once begun */
    int reasoning_none;             /* --reasoning-format none: thinking stays in content */
    double drain_timeout;           /* seconds SIGTERM waits for the requests in flight */
    const char *allowed_origins;    /* --allowed-origins: a JSON list or comma-separated (NULL: none) */
    int store_max;                  /* --responses-store: stored responses kept, at most */
    size_t store_max_bytes;         /* --responses-store-bytes: their bytes, at most */
    int pooling;                    /* --pooling (enum llm_pooling; 0: the file's pooling_type) */
    int matryoshka;                 /* --matryoshka: /v1/embeddings' dimensions may be under the model's */
} serve_config;

/* --allowed-origins as vLLM takes it (a JSON list of strings) or comma-separated, into S->origins ("*":
 * any origin): 0, or -1 with err set. */
static int parse_origins(srv_state *S, const char *v, char *err, size_t cap) {
    while (*v == ' ') v++;
    if (*v != '[') {
        for (const char *p = v; *p;) {
            const char *e = strchr(p, ',');
            if (!e) e = p + strlen(p);
            const char *b = p, *z = e;
            while (b < z && *b == ' ') b++;
            while (z > b && z[-1] == ' ') z--;
            if (z > b) arrput(S->origins, strndup(b, (size_t)(z - b)));
            p = *e ? e + 1 : e;
        }
        return 0;
    }
    llm_json j;
    char jerr[LLM_ERR_LEN];
    if (llm_json_parse(v, strlen(v), &j, jerr) != 0) {
        snprintf(err, cap, "--allowed-origins: not a JSON list: %.200s", jerr);
        return -1;
    }
    int ok = j.type == LLM_JSON_ARRAY;
    for (int i = 0; ok && i < j.n; i++)
        if ((ok = j.items[i].type == LLM_JSON_STRING)) arrput(S->origins, strdup(j.items[i].str));
    llm_json_free(&j);
    if (!ok)
        snprintf(err, cap, "--allowed-origins: give a JSON list of strings, or origins separated by commas");
    return ok ? 0 : -1;
}

/* llm serve: the engine and everything around it set up (chat template, sampling defaults, histograms,
 * listener, wake-up pipe, signals, the engine thread, the workers), then the network loop until a stop,
 * then the teardown in the order that frees each thing once: the engine thread stopped first (no more
 * events), the connections closed, the last events and jobs applied, the workers joined. Returns the exit
 * status. */
static int serve(const serve_config *a) {
    char err[LLM_ERR_LEN];
    srv_state *S = (srv_state *)calloc(1, sizeof *S);
    if (!S) { fprintf(stderr, "llm serve: out of memory\n"); return 1; }
    S->listen_fd = S->epoll_fd = S->wake[0] = S->wake[1] = -1;
    pthread_mutex_init(&S->job_lock, NULL);
    pthread_cond_init(&S->job_added, NULL);
    int rc = 1;
    double t0 = now_s();
    /* 1. the engine and the model's chat template; then the settings every request starts from */
    S->engine = llm_engine_create(&a->engine, err);
    if (!S->engine) { fprintf(stderr, "llm serve: %s\n", err); free(S); return 1; }
    S->model = llm_engine_model(S->engine);
    if (!S->model->tok) {
        fprintf(stderr, "llm serve: the model has no vocabulary (a dummy model): "
                        "nothing to serve text with\n");
        goto out;
    }
    llm_str tmpl = llm_gguf_string(&S->model->gguf, "tokenizer.chat_template");
    if (llm_chat_template_init(&S->chat, tmpl.ptr, tmpl.len, S->model->tok, a->chat_template, err) != 0) {
        fprintf(stderr, "llm serve: %s\n", err);
        goto out;
    }
    if (S->chat.note[0]) fprintf(stderr, "llm serve: warning: %s\n", S->chat.note);
    if (*llm_tokenizer_warning(S->model->tok))
        fprintf(stderr, "llm serve: warning: %s\n", llm_tokenizer_warning(S->model->tok));
    S->chat.enable_thinking = 1; /* the template's own default, as vLLM renders it */
    llm_engine_stats st = llm_engine_get_stats(S->engine);
    S->stats = st;
    S->max_model_len = st.max_model_len;
    S->max_queue = a->max_queue;
    S->scheduling_policy = a->engine.scheduling_policy;
    S->request_timeout = a->request_timeout;
    S->api_key = a->api_key;
    if (a->allowed_origins && parse_origins(S, a->allowed_origins, err, sizeof err) != 0) {
        fprintf(stderr, "llm serve: %s\n", err);
        goto out;
    }
    /* what a request omits: the file's general.sampling.* keys, as vLLM takes a model's generation_config,
     * else OpenAI's defaults (temperature 1, top_p 1) */
    S->defaults = llm_sampling_defaults();
    char sampling_note[LLM_ERR_LEN];
    int from_file = llm_model_sampling_defaults(S->model, &S->defaults, sampling_note);
    S->reasoning_format_none = a->reasoning_none;
    S->pooling = a->pooling ? a->pooling : S->model->cfg.pooling; S->matryoshka = a->matryoshka;
    if (rank_setup(S, err, sizeof err)) { fprintf(stderr, "llm serve: %s\n", err); goto out; }
    if (a->served_model_name) snprintf(S->model_name, sizeof S->model_name, "%s", a->served_model_name);
    else { /* the file's name without its folders and .gguf, as vLLM names a model by its path */
        const char *base = strrchr(a->engine.model_path, '/');
        snprintf(S->model_name, sizeof S->model_name, "%s", base ? base + 1 : a->engine.model_path);
        char *dot = strstr(S->model_name, ".gguf");
        if (dot && !dot[5]) *dot = 0;
    }
    S->drain_timeout = a->drain_timeout;
    S->store_max = a->store_max; S->store_max_bytes = a->store_max_bytes;
    pthread_mutex_init(&S->store_lock, NULL);
    S->enable_prefix_caching = a->engine.enable_prefix_caching;
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) /* else the clock and the pid */
        seed = (uint64_t)(wall_s() * 1e9) ^ ((uint64_t)getpid() << 32);
    S->id_rng = seed;
    /* 2. the metrics' histograms (the token counts' buckets go up to the context's length) */
    int n_lat = (int)(sizeof hist_e2e / sizeof *hist_e2e), n_tok = 0;
    S->token_bounds = (double *)malloc(64 * sizeof(double));
    if (S->token_bounds) n_tok = hist_1_2_5(S->token_bounds, 64, S->max_model_len);
    if (!S->token_bounds || hist_init(&S->ttft, hist_ttft, (int)(sizeof hist_ttft / sizeof *hist_ttft)) ||
        hist_init(&S->itl, hist_itl, (int)(sizeof hist_itl / sizeof *hist_itl)) ||
        hist_init(&S->e2e, hist_e2e, n_lat) || hist_init(&S->queue, hist_e2e, n_lat) ||
        hist_init(&S->prefill, hist_e2e, n_lat) || hist_init(&S->decode, hist_e2e, n_lat) ||
        hist_init(&S->inference, hist_e2e, n_lat) || hist_init(&S->req_prompt, S->token_bounds, n_tok) ||
        hist_init(&S->req_gen, S->token_bounds, n_tok)) {
        fprintf(stderr, "llm serve: out of memory\n");
        goto out;
    }
    /* 3. the listener, the wake-up pipe, epoll and the signals (SIGTERM drains); then the threads */
    int port = 0;
    S->listen_fd = open_listener(a->host, a->port, &port, err, sizeof err);
    if (S->listen_fd < 0) { fprintf(stderr, "llm serve: %s\n", err); goto out; }
    if (pipe2(S->wake, O_NONBLOCK | O_CLOEXEC) != 0 || (S->epoll_fd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        fprintf(stderr, "llm serve: %s\n", strerror(errno));
        goto out;
    }
    struct epoll_event ev = {0};
    ev.events = EPOLLIN; ev.data.ptr = &S->listen_fd;
    epoll_ctl(S->epoll_fd, EPOLL_CTL_ADD, S->listen_fd, &ev);
    ev.data.ptr = &S->wake[0];
    epoll_ctl(S->epoll_fd, EPOLL_CTL_ADD, S->wake[0], &ev);
    pthread_mutex_init(&S->lock, NULL);
    g_srv_wake_fd = S->wake[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = srv_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT); sigaddset(&sa.sa_mask, SIGTERM); /* one handler at a time */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
#ifdef __GLIBC__
    /* Request bodies, prompts and streams come and go in megabytes. glibc raises its mmap threshold to the
     * largest block freed (up to 32 MiB), after which such buffers grow by realloc on the heap, copying and
     * leaving freed holes that stay resident. A fixed threshold keeps them in mmaps, which grow in place
     * (mremap) and go back to the system when freed (10 bodies of 6 MB begun: RSS +60 MiB, not +65). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
    if (pthread_create(&S->engine_thread, NULL, srv_engine_loop, S) != 0) {
        fprintf(stderr, "llm serve: cannot start the engine thread\n");
        goto out;
    }
    pthread_attr_t attr; /* the JSON Schema converter may go 128 schemas deep: ~1 MB of stack, 2 under ASan */
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, SRV_WORKER_STACK);
    for (; S->n_workers < SRV_WORKERS; S->n_workers++)
        if (pthread_create(&S->workers[S->n_workers], &attr, srv_worker, S) != 0) break;
    pthread_attr_destroy(&attr);
    if (!S->n_workers) {
        fprintf(stderr, "llm serve: cannot start the request workers\n");
        goto out;
    }
    fprintf(stderr, "llm serve: %s (%s) on the %s, loaded in %.2f s; "
                    "context %d tokens, KV pool %d blocks of %d\n",
            S->model_name, S->model->name, st.backend, now_s() - t0, st.max_model_len, st.num_blocks,
            st.block_size);
    if (st.spec_tokens) /* as vLLM logs its speculative config */
        fprintf(stderr, "llm serve: speculative decoding: %s, up to %d tokens a step\n",
                a->engine.spec_model_path ? a->engine.spec_model_path : "n-gram lookup (prompt lookup)",
                st.spec_tokens);
    const llm_sampling_params *d = &S->defaults;
    fprintf(stderr, "llm serve: sampling, for what a request omits: temperature %g, top_p %g, top_k %d, "
            "min_p %g, repetition_penalty %g (%s)%s%s\n", d->temperature, d->top_p, d->top_k, d->min_p,
            d->repetition_penalty, from_file ? "the file's general.sampling.* over OpenAI's defaults"
            : "OpenAI's defaults: the file has no general.sampling.*",
            sampling_note[0] ? "; the file's " : "", sampling_note);
    fprintf(stderr, "listening on http://%s:%d\n", a->host, port);

    /* 4. the network loop: each pass the sockets' events, the engine's events and the workers' jobs, then
     * every connection moved on; a stop ends it once the requests in flight are out */
    double stop_since = 0;
    for (;;) {
        struct epoll_event events[256];
        /* the timeout is the time-outs' resolution (conn_tick runs at least this often): a second, or a
         * tenth while the listener rests or --request-timeout is under 2 s */
        int n = epoll_wait(S->epoll_fd, events, 256, S->accept_resume || S->request_timeout < 2 ? 100 : 1000);
        if (n < 0 && errno != EINTR) { fprintf(stderr, "llm serve: epoll: %s\n", strerror(errno)); break; }
        for (int i = 0; i < n; i++) {
            void *p = events[i].data.ptr;
            if (p == &S->listen_fd) { accept_all(S); continue; } /* draining too: /health must answer 503 */
            if (p == &S->wake[0]) { /* its bytes say nothing: they only end epoll_wait; the work is below */
                char buf[256];
                while (read(S->wake[0], buf, sizeof buf) > 0) {}
                continue;
            }
            srv_conn *c = (srv_conn *)p;
            unsigned e = events[i].events;
            if (e & (EPOLLERR | EPOLLHUP)) { c->closing = 2; continue; } /* reset, or shut both ways */
            if (e & EPOLLOUT) conn_flush(S, c);
            if (e & (EPOLLIN | EPOLLRDHUP)) conn_read(S, c);
        }
        drain_events(S);
        jobs_done(S);
        double t = now_s();
        if (S->accept_resume && t >= S->accept_resume) listener_rest(S, 0);
        /* from the last: conn_tick may close a connection, which moves the last one into its place */
        for (ptrdiff_t i = arrlen(S->conns) - 1; i >= 0; i--) conn_tick(S, S->conns[i], t);
        /* draining: the listener stays open (a load balancer's checks get 503, not a refused connection, and
         * new requests get a 503 with Connection: close); the process ends once every request in flight has
         * finished and its bytes are out, after --drain-timeout at the latest, or at a second signal */
        if (g_srv_stop) {
            int busy = 0;
            for (ptrdiff_t i = 0; i < arrlen(S->conns); i++)
                busy += conn_busy(S->conns[i]) || conn_unsent(S->conns[i]) > 0;
            if (!stop_since) {
                stop_since = t;
                fprintf(stderr, "llm serve: %s: draining: /health and new requests get 503; %d connections "
                        "with requests to finish (%g s at most)\n",
                        g_srv_signal == SIGINT ? "SIGINT" : "SIGTERM", busy, S->drain_timeout);
            }
            if (g_srv_stop > 1) { fprintf(stderr, "llm serve: a second signal: stopping now\n"); break; }
            if (busy && t - stop_since > S->drain_timeout) {
                fprintf(stderr, "llm serve: --drain-timeout: %d connections cut short\n", busy);
                break;
            }
            if (!busy) break;
        }
    }
    /* 5. the teardown: the engine thread first (no event comes after it), then the connections, the last
     * events and jobs, and the requests cut short */
    rc = 0;
    pthread_mutex_lock(&S->lock);
    S->stop_engine = 1;
    pthread_mutex_unlock(&S->lock);
    pthread_join(S->engine_thread, NULL);
    while (arrlen(S->conns)) conn_close(S, S->conns[0]);
    drain_events(S);
    jobs_done(S); /* (their connections closed: thrown away) */
    while (arrlen(S->live)) { req_free(S->live[0]); arrdelswap(S->live, 0); } /* cut short */
    fprintf(stderr, "llm serve: stopped\n");
out:
    pthread_mutex_lock(&S->job_lock); /* the workers end after the job they run, and what is left is freed */
    S->jobs_quit = 1;
    pthread_cond_broadcast(&S->job_added);
    pthread_mutex_unlock(&S->job_lock);
    for (int i = 0; i < S->n_workers; i++) pthread_join(S->workers[i], NULL);
    for (ptrdiff_t i = 0; i < arrlen(S->jobs_todo); i++) job_free(S->jobs_todo[i]);
    for (ptrdiff_t i = 0; i < arrlen(S->jobs_done); i++) job_free(S->jobs_done[i]);
    arrfree(S->jobs_todo); arrfree(S->jobs_done);
    g_srv_wake_fd = -1;
    if (S->listen_fd >= 0) close(S->listen_fd);
    if (S->epoll_fd >= 0) close(S->epoll_fd);
    if (S->wake[0] >= 0) { close(S->wake[0]); close(S->wake[1]); }
    arrfree(S->conns); arrfree(S->live);
    for (ptrdiff_t i = 0; i < arrlen(S->unknown_fields); i++) free(S->unknown_fields[i]);
    arrfree(S->unknown_fields);
    while (arrlen(S->store)) store_drop(S, 0);
    arrfree(S->store);
    for (ptrdiff_t i = 0; i < arrlen(S->origins); i++) free(S->origins[i]);
    arrfree(S->origins);
    free(S->ttft.counts); free(S->itl.counts); free(S->e2e.counts); free(S->queue.counts);
    free(S->prefill.counts); free(S->decode.counts); free(S->inference.counts); free(S->req_prompt.counts);
    free(S->req_gen.counts); free(S->token_bounds);
    llm_engine_destroy(S->engine);
    free(S);
    return rc;
}

/* ===========================================================================================================
 * llm bench serve: a load generator for an OpenAI-compatible server, as vLLM's bench serve
 * It sends --num-prompts streaming completion requests whose prompts are random token ids, arriving as a
 * Poisson process at --request-rate, at most --max-concurrency of them in flight, one thread each, over
 * plain HTTP/1.1 sockets. From the Server-Sent Events it times the first token (TTFT), the gaps between
 * tokens (ITL) and the whole request (E2EL), and prints vLLM's results table and one by prompt length.
 * Its names begin with bs_; it is the server's client, and shares only server.c's growable strings.
 *
 * What it measures, and how, for each request (one thread, one connection, Connection: close):
 *   t_start        before connect(): the connection's set-up is part of every latency, as a client sees it
 *   tok_t[i]       when the read that brought the i-th SSE event with text returned (bs_http_do): the
 *                  client's clock, so the network and the server's output buffering are in it too
 *   t_end          when data: [DONE] came (the server must close the body within BS_DONE_GRACE after it)
 *   TTFT = tok_t[0] - t_start; E2EL = t_end - t_start; TPOT = (E2EL - TTFT) / (completion tokens - 1), the
 *   mean decode time of a request (vLLM's formula); ITL = the gaps between events, each divided among the
 *   tokens it held when usage says the events carried more tokens than there were (bs_itl).
 * Token counts come from the usage chunk (stream_options.include_usage), else from what was sent and the
 * events that came. A request is "successful" only with a 200, some text and (streamed) [DONE]; any
 * failure is counted and the first one's message printed; the exit status is 1 unless all succeeded.
 * The workload is reproducible: prompts are --seed's random token ids (no tokenizer needed on this side),
 * max_tokens is drawn per request and ignore_eos asks the server for exactly that many, temperature 0.
 * Percentiles are nearest-rank (a latency some request really had); vLLM's numpy percentiles interpolate,
 * which differs a little on small runs.
 * ======================================================================================================== */
#define BS_MAX_THREADS 1024        /* requests in flight when --max-concurrency is not given */
#define BS_MAX_HEADER (64 << 10)   /* a response's status line and headers */
#define BS_MAX_BODY (8 << 20)      /* a body we keep whole (an error, /v1/models); SSE lines are consumed */
#define BS_DONE_GRACE 5.0          /* seconds the body may take to end after data: [DONE] */

static const char *bs_usage =
    "usage: llm bench serve [options]    load a running OpenAI-compatible server, as vLLM's bench serve\n"
    "  --host H               server host (default 127.0.0.1)\n"
    "  --port P               server port (default 8000)\n"
    "  --endpoint PATH        completions endpoint (default /v1/completions)\n"
    "  --model NAME           the \"model\" sent (default: the first of GET /v1/models, or none)\n"
    "  --api-key KEY          sent as Authorization: Bearer KEY\n"
    "  --num-prompts N        requests (default 200)\n"
    "  --request-rate R       requests per second, Poisson arrivals (default inf: all at once)\n"
    "  --max-concurrency C    at most C requests in flight (default: no limit but 1024 threads)\n"
    "  --input-len MIN:MAX    prompt lengths in tokens, drawn uniformly (default 32:256)\n"
    "  --output-len MIN:MAX   max_tokens, drawn uniformly, EOS ignored (default 16:128)\n"
    "  --min-token-id ID      prompts are random token ids in [min, max] (default 3)\n"
    "  --max-token-id ID      (default 500: fits a 512-token vocabulary)\n"
    "  --seed S               workload seed (default 0)\n"
    "  --timeout S            a request fails when the server is silent for S seconds (default 120)\n"
    "multi-turn chat (vLLM production-stack's multi-round QA; --num-prompts, --input-len, --max-concurrency\n"
    "and the token-id flags are refused with it, the flags below without it):\n"
    "  --multi-turn U:R       U users at once (or joining at --request-rate users per second, one after\n"
    "                         another), each a conversation of R rounds on /v1/chat/completions\n"
    "                         (unless --endpoint): every round sends the whole conversation so far, the\n"
    "                         model's answers included, and a new user turn; prints TTFT p50/p90 of\n"
    "                         round 1 and of rounds 2+, and the prefix cache's hit rate\n"
    "  --system-words N       the system prompt all users share, in words (default 200)\n"
    "  --turn-words MIN:MAX   each user turn's words, drawn uniformly (default 16:48); --output-len is\n"
    "                         each answer's max_tokens (EOS ignored)\n"
    "  --session-header       send x-session-id: user-N (for a load balancer's session affinity)\n"
    "  --metrics-url URL      a replica's /metrics (http://HOST:PORT/metrics), repeated for each: the hit\n"
    "                         rate is the sum of their vllm:prefix_cache_hits_total deltas over the sum of\n"
    "                         their vllm:prefix_cache_queries_total deltas (default: the server's own)\n";

typedef sbuf bs_buf; /* server.c's growable string, kept NUL-terminated */

typedef struct { /* a server to talk to: the one under load, or a replica whose /metrics is read */
    char host[256];
    int port;
    char path[256];         /* a --metrics-url's path */
    struct addrinfo *addrs; /* resolved once, before any thread starts */
    char host_hdr[300];
} bs_target;

typedef struct {
    /* what to send, from the flags */
    const char *endpoint, *api_key;
    bs_target srv;
    char *model; /* JSON-escaped already, so it goes into the body as it is; NULL: no "model" field */
    int num_prompts, max_conc, conc_given, in_min, in_max, out_min, out_max, tok_min, tok_max;
    double rate, timeout;
    uint64_t seed;
    /* --multi-turn: users, each a conversation of rounds, on the chat endpoint */
    int users, rounds, session_header, system_words, turn_min, turn_max;
    bs_target *metrics;     /* stb_ds: the /metrics to read the prefix cache's counters from */
    /* dispatch: the main thread waits on cv for a free slot, and at the end for all to be done */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int in_flight, done;
    int64_t out_tokens;     /* tokens of the requests done, for the progress line */
    double last_progress;
} bs_bench;

typedef struct {
    bs_bench *b;
    int in_len, out_len;
    uint64_t seed; /* of this prompt's token ids */
    /* what happened */
    int ok, done_seen, stream_failed;
    double t_start, t_end;  /* before connecting; at data: [DONE] (or at the end of a plain JSON body) */
    double *tok_t;          /* times of the events that carried text */
    int n_tok, cap_tok;
    int prompt_tokens, completion_tokens; /* from "usage"; -1 when the server sent none */
    int cached_tokens;      /* usage.prompt_tokens_details.cached_tokens; -1 when the server sent none */
    int keep_answer;        /* multi-turn: the reply's text is kept in answer (still JSON-escaped) */
    bs_buf answer;
    char err[400];
} bs_request;

/* One HTTP response as it is read: the headers, then the body with any chunked framing taken off. */
enum { BS_CH_SIZE, BS_CH_DATA, BS_CH_CRLF };
typedef struct {
    int status, chunked, sse, body_done;
    long long content_left; /* bytes of body still to come per Content-Length; -1: read until close */
    int ch_state;           /* chunked decoding: where in a chunk we are */
    unsigned long long ch_left;
    char ch_line[80];
    int ch_line_n;
    bs_buf body; /* the decoded body not yet consumed */
} bs_http;

static double bs_rand_unit(uint64_t *s) { return (llm_splitmix64(s) >> 11) * 0x1p-53; } /* [0, 1) */
static int bs_rand_int(uint64_t *s, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(llm_splitmix64(s) % (uint64_t)(hi - lo + 1));
}

/* bs_buf_add and bs_buf_printf: sb_put and sb_printf returning -1 once the buffer has failed, for the
 * "if (!rc) rc = ..." chains of the code below */
static int bs_buf_add(bs_buf *b, const void *s, size_t n) {
    sb_put(b, (const char *)s, n);
    return -b->failed;
}
#define bs_buf_printf(b, ...) (sb_printf((b), __VA_ARGS__), -(b)->failed)

/* ---- a tiny JSON scan: only what the OpenAI streaming format needs ---- */

/* Where the value of "key" starts (whitespace skipped), or NULL. A quoted key can only match a key or a
 * string value: a quote inside a JSON string is escaped, so this never looks inside generated text. */
static const char *bs_json_value(const char *s, const char *key) {
    size_t n = strlen(key);
    for (const char *p = s; (p = strchr(p, '"')) != NULL; p++) {
        if (strncmp(p + 1, key, n) || p[1 + n] != '"') continue;
        const char *v = p + 2 + n;
        while (*v == ' ' || *v == '\t' || *v == '\r' || *v == '\n') v++;
        if (*v != ':') continue; /* it was a string value, not a key */
        v++;
        while (*v == ' ' || *v == '\t' || *v == '\r' || *v == '\n') v++;
        return v;
    }
    return NULL;
}

static int bs_json_int(const char *s, const char *key, int *out) {
    const char *v = bs_json_value(s, key);
    if (!v || (*v < '0' || *v > '9')) return 0;
    *out = (int)strtol(v, NULL, 10);
    return 1;
}

/* Copies a JSON string value (v points at its opening quote) without undoing its escapes. */
static char *bs_json_raw_string(const char *v) {
    if (!v || *v != '"') return NULL;
    const char *e = v + 1;
    while (*e && *e != '"') e += (*e == '\\' && e[1]) ? 2 : 1;
    if (*e != '"' || e == v + 1) return NULL;
    char *s = malloc(e - v);
    if (!s) return NULL;
    memcpy(s, v + 1, e - v - 1);
    s[e - v - 1] = 0;
    return s;
}

/* A command-line string made fit to stand between quotes in JSON. */
static char *bs_json_escape(const char *s) {
    bs_buf b = {0};
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        int rc = c == '"' || c == '\\' ? bs_buf_printf(&b, "\\%c", c)
                 : c < 0x20           ? bs_buf_printf(&b, "\\u%04x", c)
                                      : bs_buf_add(&b, s, 1);
        if (rc) { free(b.s); return NULL; }
    }
    if (!b.s && bs_buf_add(&b, "", 0)) return NULL;
    return b.s;
}

/* ---- HTTP/1.1 over a plain socket ---- */

/* Waits for fd to be ready for ev, up to deadline (now_s() time). */
static int bs_wait(int fd, short ev, double deadline, char *err, size_t errn, const char *what) {
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) { snprintf(err, errn, "timed out %s", what); return -1; }
        struct pollfd p = {.fd = fd, .events = ev};
        int k = poll(&p, 1, left > 60 ? 60000 : (int)(left * 1000) + 1); /* slices: --timeout may be inf */
        if (k > 0) return 0; /* POLLERR and POLLHUP too: the call that follows tells what happened */
        if (k < 0 && errno != EINTR) { snprintf(err, errn, "poll: %s", strerror(errno)); return -1; }
    }
}

/* A non-blocking socket connected to the server, or -1. Non-blocking so that every wait has a timeout. */
static int bs_connect(const bs_target *t, double timeout, char *err, size_t errn) {
    char why[200] = "no address to connect to";
    for (struct addrinfo *a = t->addrs; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) { snprintf(why, sizeof why, "socket: %s", strerror(errno)); continue; }
        int fl = fcntl(fd, F_GETFL, 0);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
            snprintf(why, sizeof why, "fcntl: %s", strerror(errno));
            close(fd);
            continue;
        }
        int one = 1; /* the request goes out in one send anyway: failing to set this costs nothing */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
        if (errno != EINPROGRESS && errno != EINTR) {
            snprintf(why, sizeof why, "connect: %s", strerror(errno));
            close(fd);
            continue;
        }
        if (bs_wait(fd, POLLOUT, now_s() + timeout, why, sizeof why, "connecting") < 0) {
            close(fd);
            continue;
        }
        int e = 0;
        socklen_t len = sizeof e;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0) e = errno;
        if (e == 0) return fd;
        snprintf(why, sizeof why, "connect: %s", strerror(e));
        close(fd);
    }
    snprintf(err, errn, "%s:%d: %s", t->host, t->port, why);
    return -1;
}

/* Sends all n bytes of p, waiting (up to timeout each time) while the socket's buffer is full */
static int bs_send_all(double timeout, int fd, const char *p, size_t n, char *err, size_t errn) {
    while (n) {
        /* MSG_NOSIGNAL: a server that hung up makes this call fail, not SIGPIPE end the process */
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) { p += k; n -= k; continue; }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            snprintf(err, errn, "send: %s", strerror(errno));
            return -1;
        }
        if (bs_wait(fd, POLLOUT, now_s() + timeout, err, errn, "sending the request") < 0) return -1;
    }
    return 0;
}

/* Where the blank line after the headers ends, or 0 while it has not come. Bare \n line ends are allowed. */
static size_t bs_header_end(const char *p, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (p[i] != '\n') continue;
        if (p[i + 1] == '\n') return i + 2;
        if (p[i + 1] == '\r' && i + 2 < n && p[i + 2] == '\n') return i + 3;
    }
    return 0;
}

/* Reads the status and the headers that matter. hdr is NUL-terminated; it is cut into lines here. */
static int bs_parse_headers(bs_http *h, char *hdr, char *err, size_t errn) {
    if (sscanf(hdr, "HTTP/%*d.%*d %d", &h->status) != 1) {
        snprintf(err, errn, "not an HTTP response: %.60s", hdr);
        return -1;
    }
    h->content_left = -1;
    h->sse = 1; /* unless the server says its body is something else, e.g. JSON when it ignored "stream" */
    for (char *line = strchr(hdr, '\n'); line && *++line; line = strchr(line, '\n')) {
        char *colon = strchr(line, ':'), *eol = strchr(line, '\n');
        if (!colon || (eol && colon > eol)) continue;
        const char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        if (!strncasecmp(line, "transfer-encoding:", 18)) h->chunked = !strncasecmp(v, "chunked", 7);
        else if (!strncasecmp(line, "content-length:", 15)) h->content_left = strtoll(v, NULL, 10);
        else if (!strncasecmp(line, "content-type:", 13)) h->sse = !strncasecmp(v, "text/event-stream", 17);
    }
    if (h->chunked) h->content_left = -1; /* chunked wins over a length, as RFC 9112 says */
    if (h->content_left == 0) h->body_done = 1;
    return 0;
}

/* Appends n decoded body bytes: an SSE body is consumed line by line as it comes (bs_sse_lines), so only a
 * body kept whole (an error, /v1/models, /metrics) can come near BS_MAX_BODY */
static int bs_body_add(bs_http *h, const char *p, size_t n, char *err, size_t errn) {
    if (h->body.len + n > BS_MAX_BODY) {
        snprintf(err, errn, "response body over %d bytes", BS_MAX_BODY);
        return -1;
    }
    if (bs_buf_add(&h->body, p, n)) { snprintf(err, errn, "out of memory"); return -1; }
    return 0;
}

/* Takes n body bytes as they came off the wire, undoes chunked framing and appends the payload to h->body;
 * sets h->body_done at the end of the body. A chunk's size line may come split over two reads. */
static int bs_feed(bs_http *h, const char *p, size_t n, char *err, size_t errn) {
    if (!h->chunked) {
        if (h->content_left >= 0) {
            if ((long long)n >= h->content_left) { n = (size_t)h->content_left; h->body_done = 1; }
            h->content_left -= n;
        }
        return bs_body_add(h, p, n, err, errn);
    }
    size_t i = 0;
    while (i < n && !h->body_done) {
        if (h->ch_state == BS_CH_SIZE) {
            char c = p[i++];
            if (c != '\n') {
                if (h->ch_line_n < (int)sizeof h->ch_line - 1) h->ch_line[h->ch_line_n++] = c;
                continue;
            }
            h->ch_line[h->ch_line_n] = 0;
            h->ch_line_n = 0;
            char *end;
            unsigned long long size = strtoull(h->ch_line, &end, 16);
            if (end == h->ch_line) {
                snprintf(err, errn, "bad chunk size line: %.40s", h->ch_line);
                return -1;
            }
            if (size == 0) h->body_done = 1; /* the last chunk; trailers, if any, are not read */
            else { h->ch_left = size; h->ch_state = BS_CH_DATA; }
        } else if (h->ch_state == BS_CH_DATA) {
            size_t k = n - i < h->ch_left ? n - i : (size_t)h->ch_left;
            if (bs_body_add(h, p + i, k, err, errn)) return -1;
            i += k;
            h->ch_left -= k;
            if (!h->ch_left) h->ch_state = BS_CH_CRLF;
        } else if (p[i++] == '\n') {
            h->ch_state = BS_CH_SIZE; /* the \r\n after a chunk's data is over */
        }
    }
    return 0;
}

static void bs_event(bs_request *r, const char *json, double t);

/* Consumes the complete lines of an SSE body: each "data: ..." line is one event. At the end of the body
 * (final) a last line without its \n counts too. */
static void bs_sse_lines(bs_request *r, bs_http *h, double t, int final) {
    size_t at = 0;
    if (!h->body.len) return;
    while (at < h->body.len) {
        char *line = h->body.s + at, *nl = memchr(line, '\n', h->body.len - at);
        if (!nl && !final) break;
        size_t len = nl ? (size_t)(nl - line) : h->body.len - at;
        at += len + (nl != NULL);
        line[len] = 0;
        if (len && line[len - 1] == '\r') line[len - 1] = 0;
        if (strncmp(line, "data:", 5)) continue; /* blank lines between events, comments, event: lines */
        const char *d = line + 5;
        if (*d == ' ') d++;
        if (!strcmp(d, "[DONE]")) {
            if (!r->done_seen) { r->done_seen = 1; r->t_end = t; }
        } else if (!r->done_seen) {
            bs_event(r, d, t);
        }
    }
    memmove(h->body.s, h->body.s + at, h->body.len - at);
    h->body.len -= at;
    h->body.s[h->body.len] = 0;
}

/* One exchange: connect, send req, read the response. For a streamed 200 the SSE events go to r as they
 * arrive; otherwise the body is kept whole in h->body. Returns 0 when a complete response was read.
 * --timeout bounds each wait for the server (connect, send, each read), not the whole exchange: a long
 * stream whose tokens keep coming never times out. t, taken when each read returns, is the time of every
 * event in that read. */
static int bs_http_do(const bs_target *t, double timeout, const char *req, size_t req_n, bs_http *h,
                      bs_request *r, char *err, size_t errn) {
    int fd = bs_connect(t, timeout, err, errn);
    if (fd < 0) return -1;
    int rc = -1, in_body = 0;
    bs_buf hdr = {0};
    char buf[16384];
    if (bs_send_all(timeout, fd, req, req_n, err, errn)) goto out;
    /* each pass: wait for bytes, read them, then: the headers gathered until their blank line (and the
     * body bytes that came with them fed on), or body bytes decoded (bs_feed); a stream's complete lines
     * are consumed as events at once, so the time of an event is the time its bytes came */
    for (;;) {
        int streaming = in_body && r && h->status == 200 && h->sse;
        double deadline = now_s() + timeout;
        const char *what = in_body ? "reading the response body" : "waiting for the response headers";
        if (streaming && r->done_seen) { /* the body should end at once: a server that hangs on is a bug */
            deadline = r->t_end + BS_DONE_GRACE;
            what = "waiting for the response body to end after data: [DONE]";
        }
        if (bs_wait(fd, POLLIN, deadline, err, errn, what)) goto out;
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        double t = now_s();
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            snprintf(err, errn, "recv: %s", strerror(errno));
            goto out;
        }
        if (k == 0) { /* the server closed the connection: the end of a close-delimited body, or trouble */
            if (!in_body) { snprintf(err, errn, "connection closed before the response headers"); goto out; }
            if (h->chunked || h->content_left > 0) {
                snprintf(err, errn, "connection closed in the middle of the response body");
                goto out;
            }
            h->body_done = 1;
        } else if (!in_body) {
            if (hdr.len + k > BS_MAX_HEADER) { snprintf(err, errn, "response headers too long"); goto out; }
            if (bs_buf_add(&hdr, buf, k)) { snprintf(err, errn, "out of memory"); goto out; }
            size_t end = bs_header_end(hdr.s, hdr.len);
            if (!end) continue;
            char c = hdr.s[end];
            hdr.s[end] = 0;
            if (bs_parse_headers(h, hdr.s, err, errn)) goto out;
            hdr.s[end] = c;
            in_body = 1;
            if (!h->body_done && bs_feed(h, hdr.s + end, hdr.len - end, err, errn)) goto out;
        } else if (bs_feed(h, buf, k, err, errn)) {
            goto out;
        }
        if (in_body && r && h->status == 200 && h->sse) bs_sse_lines(r, h, t, h->body_done);
        if (h->body_done) break;
    }
    rc = 0;
out:
    close(fd);
    free(hdr.s);
    return rc;
}

/* ---- one benchmark request ---- */

/* One streamed event's JSON: a token's text, the usage at the end, or an error sent mid-stream. */
static void bs_event(bs_request *r, const char *json, double t) {
    const char *v = bs_json_value(json, "error");
    if (v && strncmp(v, "null", 4)) {
        if (!r->stream_failed) snprintf(r->err, sizeof r->err, "error in the stream: %.300s", json);
        r->stream_failed = 1;
        return;
    }
    /* an event with text is a token (or a few); the last may bring only a finish_reason, with "" */
    v = bs_json_value(json, "text");
    if (!v) v = bs_json_value(json, "content"); /* a chat chunk's delta (reasoning_content is not this key) */
    if (v && v[0] == '"' && v[1] != '"') {
        char *raw = r->keep_answer ? bs_json_raw_string(v) : NULL;
        if (raw) bs_buf_add(&r->answer, raw, strlen(raw)); /* escaped pieces joined: still valid JSON text */
        free(raw);
        if (r->n_tok == r->cap_tok) {
            int cap = r->cap_tok ? 2 * r->cap_tok : 256;
            double *p = realloc(r->tok_t, cap * sizeof *p);
            if (!p) {
                if (!r->stream_failed) snprintf(r->err, sizeof r->err, "out of memory");
                r->stream_failed = 1;
                return;
            }
            r->tok_t = p;
            r->cap_tok = cap;
        }
        r->tok_t[r->n_tok++] = t;
    }
    v = bs_json_value(json, "usage");
    if (v && *v == '{') {
        bs_json_int(v, "prompt_tokens", &r->prompt_tokens);
        bs_json_int(v, "completion_tokens", &r->completion_tokens);
        bs_json_int(v, "cached_tokens", &r->cached_tokens);
    }
}

/* The request line, headers and JSON body of one request; path and body may be NULL for a GET. */
static int bs_make_request(const bs_target *t, const char *api_key, bs_buf *req, const char *method,
                           const char *path, const bs_buf *body, const char *extra_headers) {
    int rc = bs_buf_printf(req, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: llm-bench\r\n"
                                "Accept: %s\r\nConnection: close\r\n%s", method, path, t->host_hdr,
                           body ? "text/event-stream" : "application/json",
                           extra_headers ? extra_headers : "");
    if (!rc && api_key) rc = bs_buf_printf(req, "Authorization: Bearer %s\r\n", api_key);
    if (!rc && body)
        rc = bs_buf_printf(req, "Content-Type: application/json\r\nContent-Length: %zu\r\n", body->len);
    if (!rc) rc = bs_buf_add(req, "\r\n", 2);
    if (!rc && body) rc = bs_buf_add(req, body->s, body->len);
    return rc;
}

static void bs_exchange(bs_request *r, const bs_buf *body, const char *extra_headers);

/* The random-prompt request of --num-prompts: r->in_len token ids drawn from r->seed in [--min-token-id,
 * --max-token-id] (ids, not text, so its length in tokens is exact on any server that takes ids), exactly
 * r->out_len tokens asked (ignore_eos), greedy, streamed with the usage at the end. */
static void bs_run_request(bs_request *r) {
    bs_bench *b = r->b;
    bs_buf body = {0};
    uint64_t rng = r->seed;
    int rc = bs_buf_add(&body, "{", 1);
    if (!rc && b->model) rc = bs_buf_printf(&body, "\"model\":\"%s\",", b->model);
    if (!rc) rc = bs_buf_add(&body, "\"prompt\":[", 10);
    for (int i = 0; i < r->in_len && !rc; i++)
        rc = bs_buf_printf(&body, i ? ",%d" : "%d", bs_rand_int(&rng, b->tok_min, b->tok_max));
    if (!rc)
        rc = bs_buf_printf(&body, "],\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0,"
                           "\"stream\":true,\"stream_options\":{\"include_usage\":true}}", r->out_len);
    if (rc) snprintf(r->err, sizeof r->err, "out of memory building the request");
    else bs_exchange(r, &body, NULL);
    free(body.s);
}

/* Sends one streamed request with body to the endpoint and reads its answer into r: r->ok when it ended
 * well with some text. */
static void bs_exchange(bs_request *r, const bs_buf *body, const char *extra_headers) {
    bs_bench *b = r->b;
    bs_buf req = {0};
    bs_http h = {0};
    char err[sizeof r->err] = "";
    r->prompt_tokens = r->completion_tokens = r->cached_tokens = -1;
    if (bs_make_request(&b->srv, b->api_key, &req, "POST", b->endpoint, body, extra_headers)) {
        snprintf(r->err, sizeof r->err, "out of memory building the request");
        goto out;
    }
    r->t_start = now_s();
    if (bs_http_do(&b->srv, b->timeout, req.s, req.len, &h, r, err, sizeof err)) {
        /* a stream error message says more than the broken connection that may follow it */
        if (!r->stream_failed) snprintf(r->err, sizeof r->err, "%s", err);
        goto out;
    }
    if (h.status != 200) {
        for (size_t i = 0; i < h.body.len; i++) /* one line on the terminal */
            if (h.body.s[i] == '\n' || h.body.s[i] == '\r') h.body.s[i] = ' ';
        snprintf(r->err, sizeof r->err, "HTTP %d: %.300s", h.status, h.body.len ? h.body.s : "(no body)");
        goto out;
    }
    if (!h.sse) { /* the server answered with one JSON body: all its tokens arrive at the end */
        r->t_end = now_s();
        if (h.body.s) bs_event(r, h.body.s, r->t_end);
    } else if (!r->stream_failed && !r->done_seen) {
        snprintf(r->err, sizeof r->err, "the stream ended without data: [DONE]");
        goto out;
    }
    if (r->stream_failed) goto out;
    if (r->n_tok == 0) { snprintf(r->err, sizeof r->err, "the response carried no token text"); goto out; }
    r->ok = 1;
out:
    free(req.s);
    free(h.body.s);
}

/* A request's thread: it runs the request, then frees its slot (in_flight) and wakes the dispatcher, which
 * waits on cv for a slot under --max-concurrency and for the last request at the end */
static void *bs_thread(void *arg) {
    bs_request *r = arg;
    bs_bench *b = r->b;
    bs_run_request(r);
    pthread_mutex_lock(&b->mu);
    b->in_flight--;
    b->done++;
    b->out_tokens += r->completion_tokens > 0 ? r->completion_tokens : r->n_tok;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* A run takes minutes: every 2 s (and at the end) a line on stderr says how far it is, redrawn in place
 * with \r on a terminal, a line each time otherwise (a log). Called with b->mu held. */
static void bs_progress(bs_bench *b, double t0, int final) {
    double t = now_s();
    if (!final && t - b->last_progress < 2) return;
    b->last_progress = t;
    int tty = isatty(STDERR_FILENO);
    fprintf(stderr, "%s[bench serve] %d/%d requests done, %d in flight, %.0f output tok/s%s", tty ? "\r" : "",
            b->done, b->num_prompts, b->in_flight, b->out_tokens / (t - t0 + 1e-9),
            tty && !final ? "   " : "\n");
    fflush(stderr);
}

/* Waits on b->cv for at most a second (b->mu held), so that the progress line keeps coming. */
static void bs_wait_done(bs_bench *b, double t0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    bs_progress(b, t0, 0);
}

/* GET /v1/models and take data[0].id (still JSON-escaped), or NULL with why in err. */
static char *bs_first_model(bs_bench *b, char *err, size_t errn) {
    bs_buf req = {0};
    bs_http h = {0};
    char *id = NULL;
    if (bs_make_request(&b->srv, b->api_key, &req, "GET", "/v1/models", NULL, NULL)) {
        snprintf(err, errn, "out of memory");
        goto out;
    }
    if (bs_http_do(&b->srv, b->timeout, req.s, req.len, &h, NULL, err, errn)) goto out;
    if (h.status != 200) { snprintf(err, errn, "HTTP %d", h.status); goto out; }
    const char *data = h.body.s ? bs_json_value(h.body.s, "data") : NULL;
    id = data ? bs_json_raw_string(bs_json_value(data, "id")) : NULL;
    if (!id) snprintf(err, errn, "no data[0].id in its answer");
out:
    free(req.s);
    free(h.body.s);
    return id;
}

/* ---- the report ---- */

static int bs_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double bs_mean(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n ? s / n : 0;
}

/* The nearest-rank percentile of sorted v: the ceil(p/100 n)-th smallest. */
static double bs_pct(const double *v, int n, int p) {
    if (!n) return 0;
    int k = (int)ceil(p * (double)n / 100);
    return v[k < 1 ? 0 : k > n ? n - 1 : k - 1];
}

static void bs_title(const char *title, char fill) { /* centered in 50 columns, as vLLM prints it */
    int len = (int)strlen(title), left = (50 - len) / 2, right = 50 - len - left;
    for (int i = 0; i < left; i++) putchar(fill);
    fputs(title, stdout);
    for (int i = 0; i < right; i++) putchar(fill);
    putchar('\n');
}

static void bs_metric(const char *title, const char *name, double *v, int n) { /* v in seconds; sorts v */
    char label[64];
    qsort(v, n, sizeof *v, bs_cmp_double);
    bs_title(title, '-');
    snprintf(label, sizeof label, "Mean %s (ms):", name);
    printf("%-40s %.2f\n", label, 1e3 * bs_mean(v, n));
    snprintf(label, sizeof label, "Median %s (ms):", name);
    printf("%-40s %.2f\n", label, 1e3 * bs_pct(v, n, 50));
    snprintf(label, sizeof label, "P99 %s (ms):", name);
    printf("%-40s %.2f\n", label, 1e3 * bs_pct(v, n, 99));
}

/* The gaps between a request's token events. When events carried more than one token each (usage says
 * more tokens than there were events), each gap is split evenly over the tokens it is taken to hold. */
static int bs_itl(const bs_request *r, double *out) {
    if (r->n_tok < 2) return 0;
    double per = 1; /* tokens per event after the first */
    if (r->completion_tokens > r->n_tok) per = (double)(r->completion_tokens - 1) / (r->n_tok - 1);
    for (int i = 1; i < r->n_tok; i++) out[i - 1] = (r->tok_t[i] - r->tok_t[i - 1]) / per;
    return r->n_tok - 1;
}

/* vLLM's "Serving Benchmark Result" table from the requests that succeeded: the counts, the throughputs
 * over the whole run's duration (the first request's dispatch to the last one's end: idle time at a low
 * --request-rate is in it, as in vLLM), and mean, median and P99 of TTFT, TPOT, ITL and E2EL in ms; then
 * the same by prompt length. Returns the exit status: 0 when every request succeeded. */
static int bs_report(bs_bench *b, bs_request *rs, double duration) {
    int n = b->num_prompts, ok = 0, failed = 0, n_itl_max = 0, first_failed = -1;
    long long in_tok = 0, out_tok = 0;
    for (int i = 0; i < n; i++) {
        bs_request *r = &rs[i];
        if (!r->ok) { failed++; if (first_failed < 0) first_failed = i; continue; }
        /* the exact counts come from the usage chunk; without it, what was sent and what arrived */
        if (r->prompt_tokens < 0) r->prompt_tokens = r->in_len;
        if (r->completion_tokens < 0) r->completion_tokens = r->n_tok;
        ok++;
        in_tok += r->prompt_tokens;
        out_tok += r->completion_tokens;
        n_itl_max += r->n_tok;
    }
    double *ttft = malloc((ok + 1) * sizeof *ttft), *tpot = malloc((ok + 1) * sizeof *tpot);
    double *e2el = malloc((ok + 1) * sizeof *e2el), *itl = malloc((n_itl_max + 1) * sizeof *itl);
    double *bitl = malloc((n_itl_max + 1) * sizeof *bitl);
    if (!ttft || !tpot || !e2el || !itl || !bitl) {
        fprintf(stderr, "llm bench serve: out of memory for the report\n");
        free(ttft); free(tpot); free(e2el); free(itl); free(bitl);
        return 1;
    }
    int n_tpot = 0, n_itl = 0, k = 0;
    for (int i = 0; i < n; i++) {
        bs_request *r = &rs[i];
        if (!r->ok) continue;
        ttft[k] = r->tok_t[0] - r->t_start;
        e2el[k] = r->t_end - r->t_start;
        if (r->completion_tokens > 1) tpot[n_tpot++] = (e2el[k] - ttft[k]) / (r->completion_tokens - 1);
        n_itl += bs_itl(r, itl + n_itl);
        k++;
    }

    char conc[32] = "inf";
    if (b->max_conc < n || b->conc_given) snprintf(conc, sizeof conc, "%d", b->max_conc);
    double d = duration > 0 ? duration : 1e-9;
    bs_title(" Serving Benchmark Result ", '=');
    printf("%-40s %d\n", "Successful requests:", ok);
    printf("%-40s %d\n", "Failed requests:", failed);
    if (isinf(b->rate)) printf("%-40s inf\n", "Request rate (req/s):");
    else printf("%-40s %.2f\n", "Request rate (req/s):", b->rate);
    printf("%-40s %s\n", "Max concurrency:", conc);
    printf("%-40s %.2f\n", "Benchmark duration (s):", duration);
    printf("%-40s %lld\n", "Total input tokens:", in_tok);
    printf("%-40s %lld\n", "Total generated tokens:", out_tok);
    printf("%-40s %.2f\n", "Request throughput (req/s):", ok / d);
    printf("%-40s %.2f\n", "Output token throughput (tok/s):", out_tok / d);
    printf("%-40s %.2f\n", "Total token throughput (tok/s):", (in_tok + out_tok) / d);
    bs_metric("Time to First Token", "TTFT", ttft, ok);
    bs_metric("Time per Output Token (excl. 1st token)", "TPOT", tpot, n_tpot);
    bs_metric("Inter-token Latency", "ITL", itl, n_itl);
    bs_metric("End-to-end Latency", "E2EL", e2el, ok);
    bs_title("", '=');

    /* by prompt length: four equal slices of the --input-len range; TTFT should grow with the prompt
     * (prefill) while ITL stays flat (decode steps cost about the same whatever the prompt) */
    int span = b->in_max - b->in_min + 1, nb = span < 4 ? span : 4;
    printf("\n");
    bs_title("By Prompt Length", '-');
    printf("%-13s %8s %12s %15s %16s %15s\n", "Prompt len", "Requests", "Mean prompt", "Mean TTFT (ms)",
           "Median ITL (ms)", "Mean E2EL (ms)");
    for (int q = 0; q < nb; q++) {
        int lo = b->in_min + (int)((long long)span * q / nb);
        int hi = b->in_min + (int)((long long)span * (q + 1) / nb) - 1;
        int cnt = 0, nbitl = 0;
        double sp = 0, st = 0, se = 0;
        for (int i = 0; i < n; i++) {
            bs_request *r = &rs[i];
            if (!r->ok || r->in_len < lo || r->in_len > hi) continue;
            cnt++;
            sp += r->prompt_tokens;
            st += r->tok_t[0] - r->t_start;
            se += r->t_end - r->t_start;
            nbitl += bs_itl(r, bitl + nbitl);
        }
        qsort(bitl, nbitl, sizeof *bitl, bs_cmp_double);
        char range[32];
        snprintf(range, sizeof range, "%d-%d", lo, hi);
        if (!cnt) { printf("%-13s %8d %12s %15s %16s %15s\n", range, 0, "-", "-", "-", "-"); continue; }
        printf("%-13s %8d %12.1f %15.2f %16.2f %15.2f\n", range, cnt, sp / cnt, 1e3 * st / cnt,
               1e3 * bs_pct(bitl, nbitl, 50), 1e3 * se / cnt);
    }
    bs_title("", '=');
    fflush(stdout);

    if (failed) {
        fprintf(stderr, "llm bench serve: %d of %d requests failed; the first: %s\n", failed, n,
                rs[first_failed].err);
    }
    free(ttft); free(tpot); free(e2el); free(itl); free(bitl);
    return ok > 0 && failed == 0 ? 0 : 1;
}

/* ---- --multi-turn: conversations that grow round by round, as vLLM production-stack's multi-round QA ----
 * USERS conversations run at once, each on its own thread. Every one opens with the same system prompt
 * (--system-words words: a prefix all users share), and each round sends the whole conversation so far (its
 * user turns and the model's answers, as they came) plus a new user turn of --turn-words words, streamed,
 * on the chat endpoint. Round 1 can only hit the shared system prompt in the prefix cache; rounds 2+ should
 * find their whole history there, so their TTFT is reported apart. The hit rate comes from the servers'
 * vllm:prefix_cache_* counters, read before and after: behind a load balancer, one /metrics is one replica,
 * so each replica is read (--metrics-url, repeated) and their deltas added. */
static const char *const bs_words[] = {
    "the", "little", "girl", "boy", "dog", "cat", "park", "sun", "tree", "ran", "saw", "big", "happy", "red",
    "ball", "home", "friend", "play", "day", "went", "to", "and", "with", "a", "bird", "sky", "blue", "mom",
    "said", "was", "very", "in", "garden", "flower", "car", "toy", "water", "found", "liked", "jump"};

static void bs_put_words(bs_buf *b, uint64_t *rng, int n) {
    for (int i = 0; i < n; i++) {
        if (i) bs_buf_add(b, " ", 1);
        const char *w = bs_words[llm_splitmix64(rng) % (sizeof bs_words / sizeof *bs_words)];
        bs_buf_add(b, w, strlen(w));
    }
}

typedef struct {
    bs_bench *b;
    int user;
    const char *system;     /* the shared system prompt (plain words: nothing to escape in JSON) */
    bs_request *rounds;     /* [b->rounds] */
} bs_user;

/* One user's conversation: its rounds one after another, each sent once the last answer is whole (a user
 * reads before asking again), the answer's text put into the history as it came (still JSON-escaped), so
 * that the next round's prompt repeats the earlier rounds and can find them in the prefix cache. A failed
 * round ends the conversation: the rounds after it fail without being sent. With --request-rate, user u
 * starts at u / rate seconds (evenly spaced, not Poisson); --max-concurrency is refused with --multi-turn:
 * the users are the concurrency. */
static void *bs_user_thread(void *arg) {
    bs_user *u = arg;
    bs_bench *b = u->b;
    uint64_t rng = b->seed * 0x9e3779b97f4a7c15ull + 1000003ull * (uint64_t)(u->user + 1);
    bs_buf history = {0}, body = {0}; /* history: the messages after the system one, each after a comma */
    char session[64];
    snprintf(session, sizeof session, "x-session-id: user-%d\r\n", u->user);
    if (isfinite(b->rate) && u->user > 0) { /* --request-rate: users join one after another */
        double wait = u->user / b->rate;
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&b->mu);
    b->in_flight++;
    pthread_mutex_unlock(&b->mu);
    for (int k = 0; k < b->rounds; k++) {
        bs_request *r = &u->rounds[k];
        r->in_len = bs_rand_int(&rng, b->turn_min, b->turn_max);
        r->out_len = bs_rand_int(&rng, b->out_min, b->out_max);
        sb_printf(&history, ",{\"role\":\"user\",\"content\":\"I am user %d, question %d. ", u->user, k + 1);
        bs_put_words(&history, &rng, r->in_len);
        sb_puts(&history, "\"}");
        body.len = 0;
        bs_buf_add(&body, "{", 1);
        if (b->model) sb_printf(&body, "\"model\":\"%s\",", b->model);
        sb_printf(&body, "\"messages\":[{\"role\":\"system\",\"content\":\"%s\"}", u->system);
        bs_buf_add(&body, history.s, history.len);
        sb_printf(&body, "],\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0,\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true}}", r->out_len);
        if (k && !u->rounds[k - 1].ok) /* the conversation cannot go on without its last answer */
            snprintf(r->err, sizeof r->err, "round %d failed, so the rounds after it were not sent", k);
        else if (history.failed || body.failed) snprintf(r->err, sizeof r->err, "out of memory");
        else bs_exchange(r, &body, b->session_header ? session : NULL);
        sb_puts(&history, ",{\"role\":\"assistant\",\"content\":\"");
        if (r->answer.len) bs_buf_add(&history, r->answer.s, r->answer.len);
        sb_puts(&history, "\"}");
        pthread_mutex_lock(&b->mu);
        b->done++;
        b->out_tokens += r->completion_tokens > 0 ? r->completion_tokens : r->n_tok;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
    }
    pthread_mutex_lock(&b->mu);
    b->in_flight--;
    pthread_mutex_unlock(&b->mu);
    free(history.s);
    free(body.s);
    return NULL;
}

/* "http://HOST[:PORT][/PATH]" (PATH default /metrics), resolved. */
static int bs_target_init(bs_target *t, const char *host, int port, const char *path, char *err,
                          size_t errn) {
    snprintf(t->host, sizeof t->host, "%s", host);
    snprintf(t->path, sizeof t->path, "%s", path);
    t->port = port;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    int gai = getaddrinfo(t->host, ports, &hints, &t->addrs);
    if (gai) { snprintf(err, errn, "%s: %s", t->host, gai_strerror(gai)); t->addrs = NULL; return -1; }
    snprintf(t->host_hdr, sizeof t->host_hdr, strchr(t->host, ':') ? "[%s]:%d" : "%s:%d", t->host, port);
    return 0;
}

static int bs_metrics_url(bs_target *t, const char *url, char *err, size_t errn) {
    char host[256];
    int port = 80;
    if (strncmp(url, "http://", 7)) { snprintf(err, errn, "not an http:// URL: %s", url); return -1; }
    const char *h = url + 7, *end = *h == '[' ? strchr(h, ']') : h + strcspn(h, ":/");
    if (!end || end == h || (size_t)(end - h) >= sizeof host) {
        snprintf(err, errn, "no host in %s", url);
        return -1;
    }
    if (*h == '[') { h++; snprintf(host, sizeof host, "%.*s", (int)(end - h), h); end++; }
    else snprintf(host, sizeof host, "%.*s", (int)(end - h), h);
    if (*end == ':') {
        char *e;
        long p = strtol(end + 1, &e, 10);
        if (e == end + 1 || p < 1 || p > 65535) { snprintf(err, errn, "bad port in %s", url); return -1; }
        port = (int)p;
        end = e;
    }
    if (*end && *end != '/') { snprintf(err, errn, "bad URL %s", url); return -1; }
    return bs_target_init(t, host, port, *end ? end : "/metrics", err, errn);
}

/* The prefix cache's token counters at a /metrics: the series of each name added up (one per engine). */
static int bs_scrape(const bs_bench *b, const bs_target *t, double *hits, double *queries, char *err,
                     size_t errn) {
    bs_buf req = {0};
    bs_http h = {0};
    int rc = -1, found = 0;
    *hits = *queries = 0;
    if (bs_make_request(t, NULL, &req, "GET", t->path, NULL, NULL)) {
        snprintf(err, errn, "out of memory");
        goto out;
    }
    if (bs_http_do(t, b->timeout, req.s, req.len, &h, NULL, err, errn)) goto out;
    if (h.status != 200 || !h.body.s) { snprintf(err, errn, "HTTP %d", h.status); goto out; }
    static const char hit_name[] = "vllm:prefix_cache_hits_total";
    static const char query_name[] = "vllm:prefix_cache_queries_total";
    for (const char *line = h.body.s; *line; line += strcspn(line, "\n") + (line[strcspn(line, "\n")] != 0)) {
        int is_hit = !strncmp(line, hit_name, sizeof hit_name - 1);
        size_t n = is_hit ? sizeof hit_name - 1 : sizeof query_name - 1;
        if (!is_hit && strncmp(line, query_name, n)) continue;
        if (line[n] != '{' && line[n] != ' ') continue;
        const char *value = line + strcspn(line, "\n");
        while (value > line && value[-1] != ' ') value--; /* the sample's value ends the line */
        *(is_hit ? hits : queries) += strtod(value, NULL);
        found++;
    }
    if (!found) snprintf(err, errn, "no vllm:prefix_cache_hits_total or _queries_total in it");
    else rc = 0;
out:
    free(req.s);
    free(h.body.s);
    return rc;
}

static void bs_ttft_lines(const char *what, double *v, int n) { /* v in seconds; sorts v */
    char label[64];
    qsort(v, n, sizeof *v, bs_cmp_double);
    snprintf(label, sizeof label, "%s requests:", what);
    printf("%-40s %d\n", label, n);
    snprintf(label, sizeof label, "%s TTFT P50 (ms):", what);
    printf("%-40s %.2f\n", label, 1e3 * bs_pct(v, n, 50));
    snprintf(label, sizeof label, "%s TTFT P90 (ms):", what);
    printf("%-40s %.2f\n", label, 1e3 * bs_pct(v, n, 90));
}

/* --multi-turn's run: the shared system prompt drawn from --seed, the prefix cache's counters read, one
 * thread per user, the counters read again; then its table: throughputs, TTFT P50/P90 of round 1 and of
 * rounds 2+ (the prefix cache's gain shows as their gap), the hit rate of the replicas read both times,
 * and the cached tokens the responses' usage reported. */
static int bs_multi_turn(bs_bench *b) {
    int n = b->users * b->rounds, n_metrics = (int)arrlen(b->metrics), rc = 1;
    bs_request *rs = calloc(n, sizeof *rs);
    bs_user *us = calloc(b->users, sizeof *us);
    pthread_t *th = calloc(b->users, sizeof *th);
    double *before = calloc(2 * n_metrics + 1, sizeof *before), *ttft1 = malloc((n + 1) * sizeof *ttft1);
    double *ttft2 = malloc((n + 1) * sizeof *ttft2);
    int *read_ok = calloc(n_metrics + 1, sizeof *read_ok);
    bs_buf system = {0};
    uint64_t rng = b->seed ^ 0x243f6a8885a308d3ull;
    sb_puts(&system, "You are a helpful assistant. Here is what you know: ");
    bs_put_words(&system, &rng, b->system_words);
    if (!rs || !us || !th || !before || !ttft1 || !ttft2 || !read_ok || system.failed) {
        fprintf(stderr, "llm bench serve: out of memory\n");
        goto out;
    }
    char err[300];
    for (int i = 0; i < n_metrics; i++) { /* before */
        read_ok[i] = bs_scrape(b, &b->metrics[i], &before[2 * i], &before[2 * i + 1], err, sizeof err) == 0;
        if (!read_ok[i]) fprintf(stderr, "llm bench serve: http://%s%s: %s\n", b->metrics[i].host_hdr,
                                 b->metrics[i].path, err);
    }
    fprintf(stderr, "llm bench serve: %d users x %d rounds to http://%s%s, model %s, system prompt %d words, "
            "turns %d:%d words, answers %d:%d tokens%s\n", b->users, b->rounds, b->srv.host_hdr, b->endpoint,
            b->model ? b->model : "(none)", b->system_words, b->turn_min, b->turn_max, b->out_min, b->out_max,
            b->session_header ? ", x-session-id: user-N" : "");
    b->num_prompts = n; /* for the progress line */
    double t0 = now_s();
    for (int u = 0; u < b->users; u++) {
        us[u] = (bs_user){b, u, system.s, rs + u * b->rounds};
        for (int k = 0; k < b->rounds; k++) us[u].rounds[k].b = b, us[u].rounds[k].keep_answer = 1;
        int e = pthread_create(&th[u], NULL, bs_user_thread, &us[u]);
        if (e) { /* that user's rounds fail */
            snprintf(us[u].rounds[0].err, sizeof us[u].rounds[0].err, "pthread_create: %s", strerror(e));
            us[u].b = NULL;
            pthread_mutex_lock(&b->mu);
            b->done += b->rounds;
            pthread_mutex_unlock(&b->mu);
        }
    }
    pthread_mutex_lock(&b->mu);
    while (b->done < n) bs_wait_done(b, t0);
    bs_progress(b, t0, 1);
    pthread_mutex_unlock(&b->mu);
    for (int u = 0; u < b->users; u++) if (us[u].b) pthread_join(th[u], NULL);
    double duration = now_s() - t0, d = duration > 0 ? duration : 1e-9;
    double hits = 0, queries = 0;
    int n_read = 0;
    for (int i = 0; i < n_metrics; i++) { /* after: the deltas of the replicas read both times */
        double h, q;
        if (!read_ok[i]) continue;
        if (bs_scrape(b, &b->metrics[i], &h, &q, err, sizeof err)) {
            fprintf(stderr, "llm bench serve: http://%s%s: %s\n", b->metrics[i].host_hdr, b->metrics[i].path,
                    err);
            continue;
        }
        hits += h - before[2 * i];
        queries += q - before[2 * i + 1];
        n_read++;
    }

    int ok = 0, failed = 0, n1 = 0, n2 = 0, first_failed = -1;
    long long in_tok = 0, out_tok = 0, cached = 0, cached_of = 0;
    for (int i = 0; i < n; i++) {
        bs_request *r = &rs[i];
        if (!r->ok) { failed++; if (first_failed < 0) first_failed = i; continue; }
        ok++;
        in_tok += r->prompt_tokens > 0 ? r->prompt_tokens : 0;
        out_tok += r->completion_tokens > 0 ? r->completion_tokens : r->n_tok;
        if (r->cached_tokens >= 0 && r->prompt_tokens > 0) {
            cached += r->cached_tokens;
            cached_of += r->prompt_tokens;
        }
        if (i % b->rounds == 0) ttft1[n1++] = r->tok_t[0] - r->t_start;
        else ttft2[n2++] = r->tok_t[0] - r->t_start;
    }
    bs_title(" Multi-turn Benchmark Result ", '=');
    printf("%-40s %d\n", "Users:", b->users);
    printf("%-40s %d\n", "Rounds per user:", b->rounds);
    printf("%-40s %d\n", "Successful requests:", ok);
    printf("%-40s %d\n", "Failed requests:", failed);
    printf("%-40s %.2f\n", "Benchmark duration (s):", duration);
    printf("%-40s %lld\n", "Total input tokens:", in_tok);
    printf("%-40s %lld\n", "Total generated tokens:", out_tok);
    printf("%-40s %.2f\n", "Request throughput (req/s):", ok / d);
    printf("%-40s %.2f\n", "Output token throughput (tok/s):", out_tok / d);
    bs_title("Time to First Token", '-');
    bs_ttft_lines("Round 1", ttft1, n1);
    bs_ttft_lines("Rounds 2+", ttft2, n2);
    bs_title("Prefix Cache", '-');
    printf("%-40s %d of %d\n", "Replicas read (/metrics):", n_read, n_metrics);
    printf("%-40s %.0f\n", "Prefix cache queries (tokens):", queries);
    printf("%-40s %.0f\n", "Prefix cache hits (tokens):", hits);
    if (queries > 0) printf("%-40s %.4f\n", "Prefix cache hit rate:", hits / queries);
    else printf("%-40s n/a\n", "Prefix cache hit rate:");
    if (cached_of) printf("%-40s %lld of %lld (%.4f)\n", "Cached prompt tokens (usage):", cached, cached_of,
                          (double)cached / cached_of);
    else printf("%-40s n/a\n", "Cached prompt tokens (usage):");
    bs_title("", '=');
    fflush(stdout);
    if (failed)
        fprintf(stderr, "llm bench serve: %d of %d requests failed; the first (user %d, round %d): %s\n",
                failed, n, first_failed / b->rounds, first_failed % b->rounds + 1, rs[first_failed].err);
    rc = ok > 0 && failed == 0 ? 0 : 1;
out:
    for (int i = 0; rs && i < n; i++) { free(rs[i].tok_t); free(rs[i].answer.s); }
    free(rs); free(us); free(th); free(before); free(ttft1); free(ttft2); free(read_ok); free(system.s);
    return rc;
}

/* ---- flags, dispatch ---- */

static int bs_parse_range(const char *s, int *lo, int *hi) {
    char *end;
    long a = strtol(s, &end, 10), b;
    if (end == s) return -1;
    if (*end == ':') b = strtol(end + 1, &end, 10); else b = a;
    if (*end || a < 1 || b < a || b > 1000000) return -1;
    *lo = (int)a;
    *hi = (int)b;
    return 0;
}

static int bs_parse_pair(const char *s, int *a, int *b) { /* "A:B", each in 1..100000 */
    char *end;
    long x = strtol(s, &end, 10), y;
    if (end == s || *end != ':') return -1;
    y = strtol(end + 1, &end, 10);
    if (*end || x < 1 || y < 1 || x > 100000 || y > 100000) return -1;
    *a = (int)x;
    *b = (int)y;
    return 0;
}

static int bs_parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static void bs_sleep_until(double t) {
    for (double left; (left = t - now_s()) > 0;) {
        struct timespec ts = {(time_t)left, (long)((left - (time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* llm bench serve's main: the flags (each checked; a flag of the other mode than the one chosen is refused
 * rather than ignored), the target resolved, the model named or found (GET /v1/models), then either
 * --multi-turn or the random workload below. The dispatcher sleeps until each request's arrival time,
 * waits for a free slot under --max-concurrency, and gives the request a detached thread of its own. */
static int bench_serve(int argc, char **argv, int start) {
    bs_bench b = {.endpoint = NULL, .num_prompts = 200,
                  .in_min = 32, .in_max = 256, .out_min = 16, .out_max = 128, .tok_min = 3, .tok_max = 500,
                  .rate = INFINITY, .timeout = 120, .system_words = 200, .turn_min = 16, .turn_max = 48};
    const char *model = NULL, *host = "127.0.0.1", **metrics_urls = NULL; /* stb_ds */
    const char *single_only = NULL, *multi_only = NULL; /* a flag given that only one of the two kinds
                                                         * reads */
    int max_conc = 0, port = 8000;
    for (int i = start; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { fputs(bs_usage, stdout); return 0; }
        if (f[0] != '-' || f[1] != '-') { fprintf(stderr, "llm bench serve: unexpected %s\n", f); return 1; }
        if (!strcmp(f, "--num-prompts") || !strcmp(f, "--input-len") || !strcmp(f, "--max-concurrency") ||
            !strcmp(f, "--min-token-id") || !strcmp(f, "--max-token-id")) single_only = f;
        if (!strcmp(f, "--system-words") || !strcmp(f, "--turn-words") || !strcmp(f, "--session-header") ||
            !strcmp(f, "--metrics-url")) multi_only = f;
        if (!strcmp(f, "--session-header")) { b.session_header = 1; continue; } /* the flag without a value */
        if (!v) { fprintf(stderr, "llm bench serve: %s needs a value (see --help)\n", f); return 1; }
        i++;
        if (!strcmp(f, "--host")) host = v;
        else if (!strcmp(f, "--port")) bad = bs_parse_int(v, 1, 65535, &port);
        else if (!strcmp(f, "--endpoint")) { b.endpoint = v; bad = v[0] != '/'; }
        else if (!strcmp(f, "--model")) model = v;
        else if (!strcmp(f, "--api-key")) b.api_key = v;
        else if (!strcmp(f, "--num-prompts")) bad = bs_parse_int(v, 1, 10000000, &b.num_prompts);
        else if (!strcmp(f, "--max-concurrency")) bad = bs_parse_int(v, 1, 1000000, &max_conc);
        else if (!strcmp(f, "--input-len")) bad = bs_parse_range(v, &b.in_min, &b.in_max);
        else if (!strcmp(f, "--output-len")) bad = bs_parse_range(v, &b.out_min, &b.out_max);
        else if (!strcmp(f, "--min-token-id")) bad = bs_parse_int(v, 0, 1 << 30, &b.tok_min);
        else if (!strcmp(f, "--max-token-id")) bad = bs_parse_int(v, 0, 1 << 30, &b.tok_max);
        else if (!strcmp(f, "--seed")) { char *e; b.seed = strtoull(v, &e, 10); bad = e == v || *e; }
        else if (!strcmp(f, "--multi-turn")) bad = bs_parse_pair(v, &b.users, &b.rounds);
        else if (!strcmp(f, "--system-words")) bad = bs_parse_int(v, 0, 1000000, &b.system_words);
        else if (!strcmp(f, "--turn-words")) bad = bs_parse_range(v, &b.turn_min, &b.turn_max);
        else if (!strcmp(f, "--metrics-url")) arrput(metrics_urls, v);
        else if (!strcmp(f, "--request-rate") || !strcmp(f, "--timeout")) {
            char *e;
            double x = strtod(v, &e);
            bad = e == v || *e || !(x > 0);
            if (!strcmp(f, "--timeout")) b.timeout = x; else b.rate = x;
        } else {
            fprintf(stderr, "llm bench serve: unknown option %s (see --help)\n", f);
            return 1;
        }
        if (bad) {
            fprintf(stderr, "llm bench serve: bad value for %s: %s\n", f, v);
            arrfree(metrics_urls);
            return 1;
        }
    }
    if (b.tok_min > b.tok_max) {
        fprintf(stderr, "llm bench serve: --min-token-id is above --max-token-id\n");
        arrfree(metrics_urls);
        return 1;
    }
    if (b.users ? single_only != NULL : multi_only != NULL) { /* given, it would be ignored: refused */
        if (b.users)
            fprintf(stderr, "llm bench serve: %s does not apply to --multi-turn (see --help)\n", single_only);
        else fprintf(stderr, "llm bench serve: %s applies only to --multi-turn (see --help)\n", multi_only);
        arrfree(metrics_urls);
        return 1;
    }
    /* one thread per request in flight: past BS_MAX_THREADS of them, requests wait their turn */
    b.conc_given = max_conc > 0;
    b.max_conc = max_conc ? max_conc : BS_MAX_THREADS;
    if (b.max_conc > BS_MAX_THREADS) b.max_conc = BS_MAX_THREADS;

    if (!b.endpoint) b.endpoint = b.users ? "/v1/chat/completions" : "/v1/completions";
    char err[300];
    int rc = 1;
    if (bs_target_init(&b.srv, host, port, "/", err, sizeof err)) {
        fprintf(stderr, "llm bench serve: %s\n", err);
        arrfree(metrics_urls);
        return 1;
    }
    bs_request *rs = calloc(b.num_prompts, sizeof *rs);
    double *arrival = malloc(b.num_prompts * sizeof *arrival);
    int mu_ok = 0, attr_ok = 0;
    pthread_attr_t attr;
    if (!rs || !arrival) { fprintf(stderr, "llm bench serve: out of memory\n"); goto out; }
    if (pthread_mutex_init(&b.mu, NULL)) {
        fprintf(stderr, "llm bench serve: pthread_mutex_init failed\n");
        goto out;
    }
    if (pthread_cond_init(&b.cv, NULL)) {
        pthread_mutex_destroy(&b.mu);
        fprintf(stderr, "llm bench serve: pthread_cond_init failed\n");
        goto out;
    }
    mu_ok = 1;
    /* detached, so a finished request's thread frees itself; a small stack, so a thousand are cheap */
    if (pthread_attr_init(&attr)) {
        fprintf(stderr, "llm bench serve: pthread_attr_init failed\n");
        goto out;
    }
    attr_ok = 1;
    if (pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) ||
        pthread_attr_setstacksize(&attr, 256 << 10)) {
        fprintf(stderr, "llm bench serve: pthread_attr_set* failed\n");
        goto out;
    }

    /* --multi-turn reads the prefix cache's counters: of each --metrics-url, else of the server itself */
    for (ptrdiff_t i = 0; b.users && i < (arrlen(metrics_urls) ? arrlen(metrics_urls) : 1); i++) {
        bs_target t = {0};
        int bad = arrlen(metrics_urls) ? bs_metrics_url(&t, metrics_urls[i], err, sizeof err)
                                       : bs_target_init(&t, host, port, "/metrics", err, sizeof err);
        if (bad) { fprintf(stderr, "llm bench serve: --metrics-url: %s\n", err); goto out; }
        arrput(b.metrics, t);
    }
    if (model) {
        b.model = bs_json_escape(model);
        if (!b.model) { fprintf(stderr, "llm bench serve: out of memory\n"); goto out; }
    } else {
        b.model = bs_first_model(&b, err, sizeof err);
        if (!b.model) fprintf(stderr, "llm bench serve: GET /v1/models: %s; sending no model\n", err);
    }
    if (b.users) { rc = bs_multi_turn(&b); goto out; }

    /* the workload: lengths and prompt seeds from --seed, arrival gaps from their own stream, so that
     * changing the rate does not change the prompts */
    uint64_t rng = b.seed * 0x9e3779b97f4a7c15ull + 12345, arng = b.seed ^ 0x5851f42d4c957f2dull;
    double at = 0;
    for (int i = 0; i < b.num_prompts; i++) {
        rs[i].b = &b;
        rs[i].in_len = bs_rand_int(&rng, b.in_min, b.in_max);
        rs[i].out_len = bs_rand_int(&rng, b.out_min, b.out_max);
        rs[i].seed = llm_splitmix64(&rng);
        arrival[i] = at;
        if (!isinf(b.rate)) at += -log(1 - bs_rand_unit(&arng)) / b.rate; /* exponential: Poisson arrivals */
    }
    char rate[32] = "inf";
    if (!isinf(b.rate)) snprintf(rate, sizeof rate, "%.2f", b.rate);
    fprintf(stderr, "llm bench serve: %d requests to http://%s%s, model %s, %s req/s, at most %d in flight, "
            "input %d:%d, output %d:%d tokens\n", b.num_prompts, b.srv.host_hdr, b.endpoint,
            b.model ? b.model : "(none)", rate, b.max_conc, b.in_min, b.in_max, b.out_min, b.out_max);

    double t0 = now_s();
    for (int i = 0; i < b.num_prompts; i++) {
        bs_sleep_until(t0 + arrival[i]);
        pthread_mutex_lock(&b.mu);
        while (b.in_flight >= b.max_conc) bs_wait_done(&b, t0);
        b.in_flight++;
        pthread_mutex_unlock(&b.mu);
        pthread_t th;
        int e = pthread_create(&th, &attr, bs_thread, &rs[i]);
        if (e) {
            snprintf(rs[i].err, sizeof rs[i].err, "pthread_create: %s", strerror(e));
            pthread_mutex_lock(&b.mu);
            b.in_flight--;
            b.done++;
            pthread_mutex_unlock(&b.mu);
        }
    }
    pthread_mutex_lock(&b.mu);
    while (b.done < b.num_prompts) bs_wait_done(&b, t0);
    bs_progress(&b, t0, 1);
    pthread_mutex_unlock(&b.mu);
    double duration = now_s() - t0;

    rc = bs_report(&b, rs, duration);
out:
    if (attr_ok) pthread_attr_destroy(&attr);
    if (mu_ok) { pthread_mutex_destroy(&b.mu); pthread_cond_destroy(&b.cv); }
    for (int i = 0; rs && i < b.num_prompts; i++) free(rs[i].tok_t);
    free(rs);
    free(arrival);
    free(b.model);
    freeaddrinfo(b.srv.addrs);
    for (ptrdiff_t i = 0; i < arrlen(b.metrics); i++) freeaddrinfo(b.metrics[i].addrs);
    arrfree(b.metrics);
    arrfree(metrics_urls);
    return rc;
}
