/* fuzz_json.c - libFuzzer target: llm.h's JSON reader (llm_json_parse, llm_json_free) and its string writer
 * (sb_json_str).
 *
 * Any bytes: llm_json_parse takes them or refuses them with a message, and frees all it made either way. Then
 * two round trips (abort() when one fails):
 *   - a document it took, written back out (strings and keys through sb_json_str, numbers exactly), reads
 *     again as the same tree;
 *   - the input as a string, through sb_json_str, reads back as one JSON string: the same bytes when the
 *     input is UTF-8, else valid UTF-8 (each bad byte as U+FFFD) of the same length or more. */
#include "fuzz/fuzz_server.h"

static void write_json(sbuf *b, const llm_json *v) {
    switch (v->type) {
    case LLM_JSON_NULL: sb_puts(b, "null"); break;
    case LLM_JSON_FALSE: sb_puts(b, "false"); break;
    case LLM_JSON_TRUE: sb_puts(b, "true"); break;
    case LLM_JSON_NUMBER: sb_printf(b, "%.17g", v->num); break; /* 17 digits: the same double back */
    case LLM_JSON_STRING: sb_json_str(b, v->str, v->len); break;
    case LLM_JSON_ARRAY: case LLM_JSON_OBJECT:
        sb_puts(b, v->type == LLM_JSON_ARRAY ? "[" : "{");
        for (int i = 0; i < v->n; i++) {
            if (i) sb_puts(b, ",");
            if (v->type == LLM_JSON_OBJECT) { sb_json_cstr(b, v->keys[i]); sb_puts(b, ":"); }
            write_json(b, &v->items[i]);
        }
        sb_puts(b, v->type == LLM_JSON_ARRAY ? "]" : "}");
        break;
    default: FUZZ_CHECK(0, "a value of type %d", v->type);
    }
}

/* 1 when a and b are the same tree (keys compared as C strings, as llm_json_get compares them) */
static int same_json(const llm_json *a, const llm_json *b) {
    if (a->type != b->type) return 0;
    switch (a->type) {
    case LLM_JSON_NUMBER: return a->num == b->num || (a->num != a->num && b->num != b->num);
    case LLM_JSON_STRING: return a->len == b->len && !memcmp(a->str, b->str, a->len);
    case LLM_JSON_ARRAY: case LLM_JSON_OBJECT:
        if (a->n != b->n) return 0;
        for (int i = 0; i < a->n; i++) {
            if (a->type == LLM_JSON_OBJECT && strcmp(a->keys[i], b->keys[i])) return 0;
            if (!same_json(&a->items[i], &b->items[i])) return 0;
        }
        return 1;
    }
    return 1;
}

/* Strings and keys the reader made: NUL-terminated, UTF-8 (the reader takes only UTF-8 and \u escapes). */
static void check_strings(const llm_json *v) {
    if (v->type == LLM_JSON_STRING) {
        FUZZ_CHECK(v->str && v->str[v->len] == 0, "a string without its NUL");
        size_t bad = fz_utf8_bad_at(v->str, v->len);
        FUZZ_CHECK(bad == v->len, "a string the reader made is not UTF-8 at byte %zu: %s", bad,
                   fz_hex_around(v->str, v->len, bad));
    }
    for (int i = 0; i < v->n; i++) {
        if (v->type == LLM_JSON_OBJECT) {
            FUZZ_CHECK(v->keys && v->keys[i], "an object key missing");
            size_t kl = strlen(v->keys[i]);
            FUZZ_CHECK(fz_utf8_valid(v->keys[i], kl), "a key is not UTF-8");
        }
        check_strings(&v->items[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    char err[256];
    llm_json v;
    err[0] = 0;
    if (llm_json_parse(text, size, &v, err) == 0) {
        check_strings(&v);
        sbuf out = {0};
        write_json(&out, &v);
        FUZZ_CHECK(!out.failed, "out of memory");
        llm_json back;
        char err2[256];
        int rc = llm_json_parse(out.s, out.len, &back, err2);
        FUZZ_CHECK(rc == 0, "what was written does not read again: %s: %.*s", err2,
                   (int)(out.len < 200 ? out.len : 200), out.s);
        FUZZ_CHECK(same_json(&v, &back), "written and read again, it is another tree: %.*s",
                   (int)(out.len < 200 ? out.len : 200), out.s);
        (void)llm_json_get(&v, "model");
        llm_json_free(&back);
        sb_free(&out);
        llm_json_free(&v);
        FUZZ_CHECK(v.type == 0 && v.n == 0 && !v.items && !v.str, "llm_json_free left the value set");
    } else {
        FUZZ_CHECK(err[0], "llm_json_parse refused the text without a message");
    }

    /* the input's bytes as a JSON string */
    sbuf s = {0};
    sb_json_str(&s, text, size);
    FUZZ_CHECK(!s.failed, "out of memory");
    llm_json str;
    int rc = llm_json_parse(s.s, s.len, &str, err);
    FUZZ_CHECK(rc == 0, "sb_json_str wrote what llm_json_parse refuses: %s", err);
    FUZZ_CHECK(str.type == LLM_JSON_STRING, "sb_json_str wrote a value of type %d", str.type);
    if (fz_utf8_valid(text, size))
        FUZZ_CHECK(str.len == size && !memcmp(str.str, text, size), "UTF-8 text did not come back as it was");
    else
        FUZZ_CHECK(str.len >= size && fz_utf8_valid(str.str, str.len), "bad bytes did not become U+FFFD");
    llm_json_free(&str);
    sb_free(&s);
    return 0;
}
