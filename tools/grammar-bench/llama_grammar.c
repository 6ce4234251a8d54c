/* llama_grammar.c - llama.cpp's grammar cost on the CPU, the yardstick for llm's (see README.md here).
 *
 * usage: llama_grammar MODEL.gguf PROMPT GRAMMAR.gbnf|- N_TOKENS SEED THREADS
 * Generates N_TOKENS (or until the grammar ends the text) at temperature 1 from PROMPT, one token a step, and
 * prints the mean milliseconds per token of the forward pass (llama_decode) and of sampling. With a grammar
 * ("-": none) the sampling is llama.cpp's own common_sampler's: draw without the grammar, check the token
 * with it, and only when it is refused apply the grammar to every candidate and draw again. */
#include "llama.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: llama_grammar MODEL PROMPT GRAMMAR|- N SEED THREADS\n"); return 2; }
    int n_gen = atoi(argv[4]), threads = atoi(argv[6]);
    char *gbnf = NULL;
    if (strcmp(argv[3], "-")) {
        FILE *f = fopen(argv[3], "rb");
        if (!f) { perror(argv[3]); return 1; }
        gbnf = calloc(1, 1 << 20);
        fread(gbnf, 1, (1 << 20) - 1, f);
        fclose(f);
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048; cp.n_batch = 512; cp.n_threads = threads; cp.n_threads_batch = threads;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token prompt[512];
    int n_prompt = llama_tokenize(vocab, argv[2], (int)strlen(argv[2]), prompt, 512, 1, 0);
    struct llama_sampler *chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(chain, llama_sampler_init_temp(1.0f));
    llama_sampler_chain_add(chain, llama_sampler_init_dist((uint32_t)atoi(argv[5])));
    struct llama_sampler *grammar = gbnf ? llama_sampler_init_grammar(vocab, gbnf, "root") : NULL;
    if (gbnf && !grammar) { fprintf(stderr, "llama.cpp refused the grammar\n"); return 1; }
    llama_token_data *cand = malloc(sizeof *cand * (size_t)n_vocab);
    if (llama_decode(ctx, llama_batch_get_one(prompt, n_prompt))) return 1;
    double t_decode = 0, t_sample = 0;
    int n = 0, resampled = 0;
    char text[1 << 16];
    size_t text_len = 0;
    for (; n < n_gen; n++) {
        double t0 = now();
        float *logits = llama_get_logits_ith(ctx, -1);
        for (int i = 0; i < n_vocab; i++) { cand[i].id = i; cand[i].logit = logits[i]; cand[i].p = 0; }
        llama_token_data_array arr = {cand, (size_t)n_vocab, -1, false};
        llama_sampler_apply(chain, &arr);
        llama_token id = arr.data[arr.selected].id;
        if (grammar) { /* common_sampler_sample: the token drawn, checked alone */
            llama_token_data one = {id, 1.0f, 0.0f};
            llama_token_data_array single = {&one, 1, -1, false};
            llama_sampler_apply(grammar, &single);
            if (isinf(single.data[0].logit)) { /* refused: the grammar on every candidate, and again */
                resampled++;
                for (int i = 0; i < n_vocab; i++) { cand[i].id = i; cand[i].logit = logits[i]; cand[i].p = 0; }
                llama_token_data_array all = {cand, (size_t)n_vocab, -1, false};
                llama_sampler_apply(grammar, &all);
                llama_sampler_apply(chain, &all);
                id = all.data[all.selected].id;
            }
            llama_sampler_accept(grammar, id);
        }
        llama_sampler_accept(chain, id);
        t_sample += now() - t0;
        if (llama_vocab_is_eog(vocab, id)) break;
        char piece[256];
        int m = llama_token_to_piece(vocab, id, piece, sizeof piece, 0, 0);
        if (m > 0 && text_len + (size_t)m < sizeof text) { memcpy(text + text_len, piece, (size_t)m); text_len += (size_t)m; }
        t0 = now();
        if (llama_decode(ctx, llama_batch_get_one(&id, 1))) return 1;
        t_decode += now() - t0;
    }
    text[text_len] = 0;
    printf("%d tokens: decode %.3f ms/token, sampling %.3f ms/token (%d redrawn under the grammar)\n", n,
           1e3 * t_decode / (n ? n : 1), 1e3 * t_sample / (n ? n : 1), resampled);
    fprintf(stderr, "%s\n", text);
    return 0;
}
