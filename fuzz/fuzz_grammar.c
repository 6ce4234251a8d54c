/* fuzz_grammar.c - libFuzzer target: llm.h's grammar section: the GBNF parser and matcher, the token masks,
 * and the writers of JSON Schema, regular expressions and choices as GBNF.
 *
 * The input's first byte picks the mode, the rest is its text:
 *   0  GBNF, then (after a NUL) text fed to the matcher in chunks: the parser takes it or says why; a chunk
 *      is taken or refused leaving the state as it was; the mask of the state reached (over the SentencePiece
 *      test vocabulary) counts its bits, allows exactly the tokens the one-token check allows, and allows the
 *      end of generation exactly where the text is whole;
 *   1  a JSON Schema: the converter refuses it with a message, or writes GBNF that parses or is refused at
 *      one of the grammar's limits, by name (and so does gpt-oss's reply around it, its thinking then the
 *      answer);
 *   2  a regular expression: the same;
 *   3  choices, one a line: the grammar parses and takes each choice whole;
 *   (a first byte of 240 or more:)
 *   4  tools (JSON) written as each family's tool-call grammar: the grammar parses, or a reason is given;
 *   5  a reply read back in each tool format, whole and as each of its prefixes.
 * Any failure of these is an abort(). */
/* The grammar's limits, smaller than llm.h's, so that inputs of 4 KiB reach them and what happens past each
 * is fuzzed too (at llm.h's, rules, nesting and the matcher's stacks take 100 KB to 1 MB of text) */
#define LLM_GR_MAX_RULES 2048
#define LLM_GR_MAX_STACKS 512
#define LLM_GR_MAX_DEPTH 512
#define LLM_GR_MAX_WORK (1 << 18)
#define LLM_JS_MAX_RULES 1000
#define LLM_IMPLEMENTATION
#include "llm.h"
#include "fuzz/fuzz_common.h"

static llm_gguf g_gguf;
static llm_tokenizer *g_tok;
static llm_token_trie *g_trie;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    char err[LLM_ERR_LEN], path[4096];
    snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-llama-spm.gguf", fz_testdata_dir());
    if (llm_gguf_open(&g_gguf, path, err) != 0 || !(g_tok = llm_tokenizer_load(&g_gguf, err)) ||
        !(g_trie = llm_token_trie_build(g_tok, err))) {
        fprintf(stderr, "fuzz_grammar: %s (LLM_TESTDATA: the test data, testdata/ by default)\n", err);
        exit(1);
    }
    return 0;
}

/* Text that a writer made must be a grammar the parser takes, or refuses at one of its limits, by name (a
 * schema may ask for more rules than a grammar may have: the request is then refused, saying so). refs: the
 * schema has $refs, which may lead back to where they are before any character ({"$ref": "#"} at the root,
 * {"anyOf": [{"$ref": "#"}, ...]}): a grammar refused as left-recursive then, naming the rule. */
static llm_grammar *must_parse(const char *gbnf, const char *what, int refs) {
    char err[LLM_ERR_LEN];
    llm_grammar *g = llm_grammar_parse(gbnf, err);
    FUZZ_CHECK(g != NULL || strstr(err, "more than") || strstr(err, "too large") ||
               (refs && strstr(err, "left-recursive")), "%s wrote GBNF that does not parse: %s\n%s", what,
               err, gbnf);
    return g;
}

/* The one-token checks of one input stop after a second: a grammar ambiguous enough to keep thousands of
 * stacks makes each check slow, and 32,000 of them would pass libFuzzer's timeout without finding
 * anything more */
static void check_mask(const llm_grammar_state *st) {
    int V = llm_tokenizer_n_vocab(g_tok);
    uint8_t *mask = (uint8_t *)malloc((size_t)V / 8 + 1);
    int n = llm_grammar_mask(st, g_trie, mask), bits = 0;
    double t0 = llm_now();
    if (n >= 0) { /* -1: past the matcher's limits, which it may say */
        for (int t = 0, checking = 1; t < V; t++) {
            int bit = mask[t >> 3] >> (t & 7) & 1;
            bits += bit;
            if (checking && t % 256 == 0) checking = llm_now() - t0 < 1.0;
            if (checking && (t % 7 == 0 || bit)) /* every allowed token, and a sample of the others */
                FUZZ_CHECK(bit == llm_grammar_allows(st, g_trie, t), "mask and one-token check differ on %d",
                           t);
            if (llm_tokenizer_is_eog(g_tok, t))
                FUZZ_CHECK(bit == llm_grammar_can_end(st), "the end of generation allowed wrongly");
        }
        FUZZ_CHECK(bits == n, "mask count %d, bits %d", n, bits);
    }
    free(mask);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    /* modes 0-3 by the first byte mod 4, as before tools came (so the corpus keeps its meaning); 4-5
     * above 239 */
    int mode = data[0] >= 240 ? 4 + (data[0] & 1) : data[0] % 4;
    char *text = (char *)malloc(size), err[LLM_ERR_LEN];
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    size_t len = strlen(text);
    if (mode == 0) {
        llm_grammar *g = llm_grammar_parse(text, err);
        if (!g) FUZZ_CHECK(err[0] != 0, "a grammar refused without a reason");
        llm_grammar_state *st = g ? llm_grammar_start(g) : NULL;
        const char *feed = text + len + 1, *end = text + size - 1;
        double t0 = llm_now(); /* a second of feeding at most, as check_mask: an ambiguous grammar is slow */
        for (int chunk = 0; st && feed < end && chunk < 64 && llm_now() - t0 < 1.0; chunk++) {
            int n = 1 + (int)((unsigned char)*feed % 8);
            if (n > end - feed) n = (int)(end - feed);
            int before = llm_grammar_can_end(st);
            llm_grammar_state *copy = llm_grammar_state_copy(st);
            if (llm_grammar_accept(st, feed, n) != 0) {
                FUZZ_CHECK(llm_grammar_can_end(st) == before, "a refused chunk changed the state");
                llm_grammar_state_free(copy);
                break;
            }
            llm_grammar_state_free(copy);
            feed += n;
        }
        if (st && llm_now() - t0 < 1.0) check_mask(st);
        llm_grammar_state_free(st);
        llm_grammar_free(g);
    } else if (mode == 1 || mode == 2) {
        llm_json schema;
        char *gbnf = NULL;
        if (mode == 2) gbnf = llm_regex_to_grammar(text, err);
        else if (llm_json_parse(text, len, &schema, err) == 0) {
            gbnf = llm_json_schema_to_grammar(&schema, err);
            llm_json_free(&schema);
        }
        int refs = mode == 1 && strstr(text, "$ref");
        const char *what = mode == 1 ? "the JSON Schema converter" : "the regex converter";
        if (gbnf) llm_grammar_free(must_parse(gbnf, what, refs));
        else FUZZ_CHECK(err[0] != 0, "a refusal without a reason");
        if (gbnf && mode == 1) {
            llm_chat_template ct;
            memset(&ct, 0, sizeof ct);
            ct.family = LLM_CHAT_GPT_OSS;
            char *whole = llm_chat_answer_grammar(&ct, gbnf, err);
            FUZZ_CHECK(whole != NULL, "gpt-oss's answer grammar not made");
            llm_grammar_free(must_parse(whole, "gpt-oss's answer grammar", refs));
            free(whole);
        }
        free(gbnf);
    } else if (mode == 4) { /* tools (JSON) in each family's syntax: a grammar that parses, or a reason */
        for (int f = LLM_TOOLS_GENERIC; f <= LLM_TOOLS_HARMONY; f++) {
            llm_chat_template ct;
            memset(&ct, 0, sizeof ct);
            ct.tool_format = f; ct.thinks = data[0] & 8; ct.enable_thinking = 1;
            if (f == LLM_TOOLS_HARMONY) ct.family = LLM_CHAT_GPT_OSS;
            char *gbnf = llm_chat_tool_grammar(&ct, text, (data[0] >> 4) % 3, "f", data[0] & 64, err);
            if (gbnf) llm_grammar_free(must_parse(gbnf, "the tool call grammar", strstr(text, "$ref") != 0));
            else FUZZ_CHECK(err[0] != 0, "tools refused without a reason");
            free(gbnf);
        }
    } else if (mode == 5) { /* a reply read back, whole and as each of its prefixes: the parts only grow */
        for (int f = LLM_TOOLS_GENERIC; f <= LLM_TOOLS_HARMONY; f++) {
            llm_chat_template ct;
            memset(&ct, 0, sizeof ct);
            ct.tool_format = f; ct.thinks = 1;
            if (f == LLM_TOOLS_HARMONY) ct.family = LLM_CHAT_GPT_OSS;
            llm_chat_reply whole, part;
            FUZZ_CHECK(llm_chat_parse_reply(&ct, text, len, 1, 1, 0, &whole) == 0, "a reply not read");
            for (size_t k = 0; k <= len; k += 1 + k / 16) {
                FUZZ_CHECK(llm_chat_parse_reply(&ct, text, k, 1, 1, 1, &part) == 0,
                           "a partial reply not read");
                llm_chat_reply_free(&part);
            }
            llm_chat_reply_free(&whole);
        }
    } else {
        const char *choices[16];
        int n = 0;
        for (char *s = text; n < 16 && s < text + len;) {
            char *nl = strchr(s, '\n');
            if (nl) *nl = 0;
            choices[n++] = s;
            s = nl ? nl + 1 : text + len;
        }
        char *gbnf = n ? llm_choice_to_grammar(choices, n, err) : NULL;
        llm_grammar *g = gbnf ? must_parse(gbnf, "the choice writer", 0) : NULL;
        for (int i = 0; g && i < n; i++) {
            llm_grammar_state *st = llm_grammar_start(g);
            FUZZ_CHECK(st && llm_grammar_accept(st, choices[i], (int)strlen(choices[i])) == 0 &&
                       llm_grammar_can_end(st), "choice %d is not taken whole", i);
            llm_grammar_state_free(st);
        }
        llm_grammar_free(g);
        free(gbnf);
    }
    free(text);
    return 0;
}
