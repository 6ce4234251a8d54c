/* fuzz_engine.c - libFuzzer target: llm.h's engine (scheduler, KV blocks, sampler, stop strings) on
 * stories260K, with requests made from the input.
 *
 * Engines on $LLM_TESTDATA/models/stories260K.gguf (CPU backend) are made once, in four configurations: a
 * roomy pool (64 blocks), a tight one (10 blocks, a budget of 32 tokens a step, 4 sequences: chunked
 * prefill and preemption), static batching, and the tight one under the priority policy. Per input: the
 * first byte picks the engine, then 1 to 4 requests are read from the bytes: sampling parameters (floats
 * taken from raw bits too, so NaN, infinities, denormals and negative values occur: the engine must refuse
 * bad ones with a message, never crash), n, max and min tokens, logprobs, stop strings (kept in the output
 * or not) and stop ids, a priority (refused but under the priority policy), a cache salt, and a prompt of
 * token ids or of text. Some requests
 * join at a later step, and one may be aborted at a step the input picks. The engine steps until it has no
 * work, and these must hold (else abort()):
 *   - llm_engine_check_blocks passes after every step;
 *   - every sample of every accepted request finishes exactly once, and nothing comes after its finish;
 *   - outputs name only requests that were accepted, with indexes in 0..n-1, ids inside the vocabulary,
 *     at most max_tokens tokens per sample, and logprobs when asked;
 *   - with stop strings that are UTF-8 (what the server accepts), every piece of text is valid UTF-8;
 *   - at the end nothing runs or waits and every KV block is free again.
 * The engines are reused, and their prefix caches with them: blocks cached by an earlier input may be
 * taken by a later one, which is what a server does too. */
#define LLM_IMPLEMENTATION
#include "llm.h"
#include "fuzz/fuzz_common.h"

#define MAX_REQ 4
#define MAX_N 4
#define MAX_STEPS 2000

static llm_engine *g_engine[4];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    char err[LLM_ERR_LEN], path[4096];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", fz_testdata_dir());
    for (int i = 0; i < 4; i++) {
        llm_engine_config cfg = llm_engine_defaults();
        cfg.model_path = path;
        cfg.create_backend = llm_cpu_backend_create;
        cfg.num_blocks = 64;
        cfg.max_model_len = 128;
        if (i == 1 || i == 3) { cfg.num_blocks = 10; cfg.max_num_batched_tokens = 32; cfg.max_num_seqs = 4; }
        if (i == 3) cfg.scheduling_policy = LLM_SCHED_PRIORITY;
        if (i == 2) { cfg.static_batching = 1; cfg.enable_prefix_caching = 0; cfg.num_blocks = 24; }
        if (!(g_engine[i] = llm_engine_create(&cfg, err))) {
            fprintf(stderr, "fuzz_engine: %s (LLM_TESTDATA: the test data, testdata/ by default)\n",
                    err);
            exit(1);
        }
    }
    return 0;
}

typedef struct {
    llm_sampling_params p;
    char stop_buf[3][9], salt[9];
    const char *stops[3];
    int32_t stop_ids[4];
    int32_t prompt_ids[160];
    int n_prompt_ids;                 /* -1: a text prompt */
    char text[160];
    int join_step;                    /* added before this step */
    uint64_t id;                      /* 0: refused (or not added yet) */
    int finished[MAX_N], tokens[MAX_N]; /* per sample (an n out of 1..MAX_N is one the engine refuses) */
    int stops_utf8;
} fz_request;

static void read_request(fz_in *in, fz_request *r, const fz_request *prev, int n_vocab) {
    memset(r, 0, sizeof *r);
    llm_sampling_params *p = &r->p;
    *p = llm_sampling_defaults();
    uint8_t on = fz_u8(in); /* which parameters differ from the defaults */
    uint8_t on2 = fz_u8(in);
    p->n = 1 + fz_u8(in) % MAX_N;
    p->max_tokens = 1 + fz_u8(in) % 16;
    p->seed = (int64_t)(fz_u32(in) & 0x7fffffff); /* not -1: a clock seed would make runs unrepeatable */
    if (on & 1) p->temperature = fz_float(in, 0.0f, 2.0f);
    else if (on2 & 1) p->temperature = 0.0f;
    if (on & 2) p->top_k = (int)(int8_t)fz_u8(in);
    if (on & 4) p->top_p = fz_float(in, 0.0f, 1.0f);
    if (on & 8) p->min_p = fz_float(in, 0.0f, 1.0f);
    if (on & 16) p->repetition_penalty = fz_float(in, 0.5f, 2.0f);
    if (on & 32) {
        p->presence_penalty = fz_float(in, -2.0f, 2.0f);
        p->frequency_penalty = fz_float(in, -2.0f, 2.0f);
    }
    if (on & 64) p->logprobs = fz_range(in, -1, 5);
    if (on & 128) { p->min_tokens = fz_u8(in) % 20; p->ignore_eos = fz_u8(in) & 1; }
    p->special_text = on2 >> 1 & 1;
    if (on2 & 32) p->priority = (int)(int8_t)fz_u8(in);
    p->include_stop_str = on2 >> 6 & 1;
    if (on2 & 128) { fz_str(in, r->salt, 8); p->cache_salt = r->salt; }
    if (on2 & 4) { /* sometimes a value out of its range: it must be refused, not run */
        switch (fz_u8(in) % 6) {
        case 0: { uint8_t b = fz_u8(in); p->n = b & 1 ? -(int)(b >> 1) : 129 + b; } break;
        case 1: p->max_tokens = -1 - fz_u8(in); break;
        case 2: p->logprobs = 20 + fz_u8(in); break;
        case 3: p->top_k = -1 - fz_u8(in); break;
        case 4: p->n_stop = 17; p->stop = r->stops; break;
        case 5: p->n_stop_token_ids = -1 - fz_u8(in); break;
        }
    }
    r->stops_utf8 = 1;
    if (on2 & 8) {
        int n_stop = 1 + fz_u8(in) % 3;
        for (int i = 0; i < n_stop; i++) {
            size_t len = fz_str(in, r->stop_buf[i], 8);
            r->stops[i] = r->stop_buf[i];
            if (!fz_utf8_valid(r->stop_buf[i], len)) r->stops_utf8 = 0;
        }
        if (p->n_stop != 17) { p->n_stop = n_stop; p->stop = r->stops; }
    }
    if (on2 & 16) {
        int n = 1 + fz_u8(in) % 4;
        for (int i = 0; i < n; i++) {
            uint16_t v = fz_u16(in);
            r->stop_ids[i] = v >= 0xFF00 ? (int32_t)(int16_t)v * 1000 : (int32_t)(v % (n_vocab + 8)) - 4;
        }
        if (p->n_stop_token_ids >= 0) { p->n_stop_token_ids = n; p->stop_token_ids = r->stop_ids; }
    }
    /* the prompt: ids, text, or the previous request's prompt with more after it (a shared prefix) */
    uint8_t kind = fz_u8(in) % 4;
    uint8_t lb = fz_u8(in); /* mostly short prompts (the forward pass takes the time), now and then long */
    int len = lb < 0xE0 ? 1 + lb % 32 : 1 + fz_u8(in) % 140;
    r->n_prompt_ids = -1;
    if (kind == 3 && prev && prev->n_prompt_ids > 0) {
        int keep = prev->n_prompt_ids;
        memcpy(r->prompt_ids, prev->prompt_ids, (size_t)keep * sizeof(int32_t));
        int more = len % 24;
        for (int i = 0; i < more && keep + i < 160; i++) r->prompt_ids[keep + i] = fz_u16(in) % 512;
        r->n_prompt_ids = keep + more < 160 ? keep + more : 160;
    } else if (kind == 3 && prev && prev->n_prompt_ids < 0) {
        memcpy(r->text, prev->text, sizeof r->text);
    } else if (kind <= 1) {
        r->n_prompt_ids = kind == 1 ? 0 : len; /* an empty prompt now and then: refused */
        for (int i = 0; i < r->n_prompt_ids; i++) {
            uint16_t v = fz_u16(in);
            r->prompt_ids[i] = v >= 0xFFF0 ? (int32_t)v : (int32_t)(v % 512); /* 512 and up: refused */
        }
    } else {
        fz_str(in, r->text, 159);
    }
    r->join_step = fz_u8(in) < 192 ? 0 : fz_u8(in) % 8;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    llm_engine *e = g_engine[fz_u8(&in) % 4];
    char err[LLM_ERR_LEN];
    int n_vocab = llm_engine_model(e)->cfg.vocab_size;
    FUZZ_CHECK(!llm_engine_has_work(e), "the engine has work left from the last input");

    static fz_request req[MAX_REQ]; /* static: big, and ASan's stack is slow to poison */
    int n_req = 1 + fz_u8(&in) % MAX_REQ;
    for (int i = 0; i < n_req; i++) read_request(&in, &req[i], i ? &req[i - 1] : NULL, n_vocab);
    int abort_req = fz_u8(&in) % (MAX_REQ + 1);       /* MAX_REQ: none */
    int abort_step = fz_u8(&in) % 24;
    uint64_t bogus_abort = fz_u8(&in) & 1 ? fz_u64(&in) : 0; /* an id that is no request's */

    int n_added = 0, any_work = 0;
    for (int step = 0; step < MAX_STEPS; step++) {
        for (int i = 0; i < n_req; i++) {
            fz_request *r = &req[i];
            if (r->join_step != step) continue;
            err[0] = 0;
            r->id = r->n_prompt_ids >= 0
                  ? llm_engine_add_request(e, NULL, r->prompt_ids, r->n_prompt_ids, &r->p, r, err)
                  : llm_engine_add_request(e, r->text, NULL, 0, &r->p, r, err);
            if (!r->id) FUZZ_CHECK(err[0], "add_request refused request %d without a message", i);
            else FUZZ_CHECK(r->p.n >= 1 && r->p.n <= MAX_N, "add_request took n = %d", r->p.n);
            n_added++;
        }
        if (step == abort_step) {
            if (abort_req < n_req && req[abort_req].id) llm_engine_abort(e, req[abort_req].id);
            if (bogus_abort) llm_engine_abort(e, bogus_abort);
        }
        if (!llm_engine_has_work(e)) {
            if (n_added == n_req && step > abort_step) break;
            continue;
        }
        any_work = 1;
        const llm_output *out;
        int n_out = llm_engine_step(e, &out);
        FUZZ_CHECK(n_out >= 0, "llm_engine_step returned %d", n_out);
        if (llm_engine_check_blocks(e, err) != 0) FUZZ_CHECK(0, "after step %d: %s", step, err);
        for (int k = 0; k < n_out; k++) {
            const llm_output *o = &out[k];
            fz_request *r = (fz_request *)o->user;
            FUZZ_CHECK(r >= req && r < req + n_req && r->id == o->request_id,
                       "an output for request %llu, which this input did not add",
                       (unsigned long long)o->request_id);
            FUZZ_CHECK(o->index >= 0 && o->index < r->p.n, "output index %d of n = %d", o->index, r->p.n);
            FUZZ_CHECK(!r->finished[o->index], "request %llu sample %d: an output after its finish",
                       (unsigned long long)o->request_id, o->index);
            FUZZ_CHECK(o->n_tokens >= 0 && o->text_len >= 0, "negative counts");
            for (int t = 0; t < o->n_tokens; t++)
                FUZZ_CHECK(o->token_ids[t] >= 0 && o->token_ids[t] < n_vocab, "token id %d", o->token_ids[t]);
            r->tokens[o->index] += o->n_tokens;
            FUZZ_CHECK(r->tokens[o->index] <= r->p.max_tokens,
                       "request %llu sample %d: %d tokens, max_tokens %d",
                       (unsigned long long)o->request_id, o->index, r->tokens[o->index], r->p.max_tokens);
            if (r->p.logprobs >= 0 && o->n_tokens > 0) {
                FUZZ_CHECK(o->logprobs, "logprobs asked for, none given");
                for (int t = 0; t < o->n_tokens; t++)
                    FUZZ_CHECK(!(o->logprobs[t] > 0.0f), "a logprob of %g", (double)o->logprobs[t]);
                if (r->p.logprobs > 0) {
                    FUZZ_CHECK(o->n_top == r->p.logprobs && o->top_ids && o->top_logprobs, "top logprobs");
                    for (int t = 0; t < o->n_tokens * o->n_top; t++)
                        FUZZ_CHECK(o->top_ids[t] >= -1 && o->top_ids[t] < n_vocab, "top id %d",
                                   o->top_ids[t]);
                }
            }
            if (o->text_len > 0 && r->stops_utf8) {
                size_t bad = fz_utf8_bad_at(o->text, (size_t)o->text_len);
                FUZZ_CHECK(bad == (size_t)o->text_len, "output text not UTF-8 at byte %zu of %d: %s", bad,
                           o->text_len, fz_hex_around(o->text, (size_t)o->text_len, bad));
            }
            if (o->finish_reason) {
                FUZZ_CHECK(llm_finish_reason_name(o->finish_reason), "finish reason %d", o->finish_reason);
                if (o->finish_reason == LLM_FINISH_ERROR)
                    FUZZ_CHECK(o->error && o->error[0], "an error without text");
                r->finished[o->index] = 1;
            }
        }
    }
    (void)any_work;
    FUZZ_CHECK(!llm_engine_has_work(e), "work left after %d steps", MAX_STEPS);
    for (int i = 0; i < n_req; i++) {
        if (!req[i].id) continue;
        for (int s = 0; s < req[i].p.n; s++)
            FUZZ_CHECK(req[i].finished[s], "request %d (id %llu) sample %d never finished", i,
                       (unsigned long long)req[i].id, s);
    }
    llm_engine_stats st = llm_engine_get_stats(e);
    FUZZ_CHECK(st.running == 0 && st.waiting == 0, "%d running, %d waiting at the end", st.running,
               st.waiting);
    FUZZ_CHECK(st.num_free_blocks == st.num_blocks, "%d of %d blocks free at the end", st.num_free_blocks,
               st.num_blocks);
    return 0;
}
