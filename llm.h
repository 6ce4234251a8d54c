/* llm.h - a small LLM serving engine in one header, written to be read top to bottom: what vLLM does, in C.
 *
 * A GGUF model file goes in. Prompts come in as requests, from any thread. Each step the scheduler picks the
 * sequences to compute and how many tokens each (continuous batching, chunked prefill) within the KV-cache
 * blocks that are free (a paged KV cache with prefix caching and copy-on-write; when blocks run out the
 * youngest sequence is preempted and recomputed later), one forward pass computes them all, the sampler
 * picks each sequence's next token where the logits are (the backend's sample step), and text streams out.
 * The plain-C forward pass here is the CPU backend and the reference the CUDA backend (llm.cu) is checked
 * against.
 *
 * Use it stb style: include llm.h anywhere for the declarations, and in exactly one C file write
 *     #define LLM_IMPLEMENTATION
 *     #include "llm.h"
 *
 * Compile options
 *   LLM_IMPLEMENTATION            compile the implementation here (in one C file only)
 *   LLM_NO_STB_DS_IMPLEMENTATION  your program defines STB_DS_IMPLEMENTATION itself, elsewhere
 *   LLM_CUDA                      link llm.cu (built with nvcc): the engine runs on the GPU when one answers
 *   LLM_NO_GRAMMAR                leave the grammar layer out (structured output, tool calls' grammars): a
 *                                 request with a grammar is then refused, by name
 *   LLM_NO_SIMD                   the plain C only, even where the compiler may use AVX2 or AVX-512
 *   LLM_CPU_VARIANT=NAME          (make llm-dist) this copy is a CPU variant: it exports llm_cpu_variant_NAME
 *   LLM_CPU_DISPATCH              (make llm-dist) the CPU backends start the CPU's best variant (section 7)
 *   -fopenmp                      the CPU forward pass uses every core (without it, one). Run with
 *                                 GOMP_SPINCOUNT=2000: libgomp's default spinning costs 75x beside a busy
 *                                 process (the llm command sets it for itself)
 * The implementation needs libc, libm, pthreads and stb_ds.h (Debian: libstb-dev; <stb/stb_ds.h>).
 * Errors are returned (0 ok, -1 failed, a message in the caller's char err[LLM_ERR_LEN]), never exit()ed.
 *
 * The data's path, and the order of the sections below, in the declarations and in the implementation. The
 * core (1 to 10) is the serving engine and reads straight through; the layers after it (11 to 14) are what
 * it can do without, each opening with what it does and the hook by which the core calls it:
 *   1. GGUF         a file -> metadata and tensors       llm_gguf: memory-mapped, every offset checked
 *   2. Model        tensors -> weights and a config      llm_model: typed pointers into the file
 *   3. Tokenizer    text -> token ids                    llm_tokenizer: SentencePiece and byte-level BPE
 *   4. Chat         messages -> a prompt                 llm_chat_render: the chat template families
 *   5. Requests     token ids -> a step's plan           the scheduler: admission, budget, preemption
 *   6. Blocks       sequences -> KV-cache blocks         llm_block_manager: free list, refs, prefix cache
 *   7. Forward      a batch -> logits                    llm_backend: the CPU one here, CUDA in llm.cu
 *   8. Sampler      logits -> the next token             llm_sampler: temperature, top-k/p, min-p, penalties;
 *                                                        the backends' sample step (llm_sample_row)
 *   9. Detokenizer  token ids -> text, stop strings      llm_detok: only whole UTF-8 characters come out
 *  10. Engine       all of the above, one step at a time llm_engine: requests in, outputs out
 *  11. JSON         text <-> values                      llm_json: what tools, schemas and requests are in
 *  12. Grammar      which tokens may come next           llm_grammar: GBNF, JSON Schema, regex; token masks
 *                                                        (LLM_NO_GRAMMAR: none; the engine then refuses one)
 *  13. Tools        tools and calls in a family's syntax the tools a prompt lists, a call's grammar, a reply
 *                                                        read back into thinking, answer and calls
 *  14. SIMD         kernels -> the same, 8 or 16 at once x86 AVX2 and AVX-512 kernels for the CPU
 *                                                        forward (LLM_NO_SIMD: none; the plain C runs)
 *   Appendix        the Unicode table the tokenizer's pre-tokenizers read
 * Their sizes in the implementation (lines, a quarter of the core's comments; a test keeps them within a
 * fifth of the truth): 1 GGUF 590, 2 Model 540, 3 Tokenizer 1320, 4 Chat 900, 5 Requests 740, 6 Blocks 140,
 * 7 Forward 1570, 8 Sampler 410, 9 Detokenizer 220, 10 Engine 1520: the core, 7950; then the layers:
 * 11 JSON 310, 12 Grammar 2500, 13 Tools 980, 14 SIMD 2380 (2000, then the appendix's 380). A first
 * reading: the engine's API below, then 5 Requests, 6 Blocks, 10 Engine (llm_engine_step), 7 Forward
 * (llm_cpu_forward) and 8 Sampler; the rest as needed.
 *
 * The engine: what a program that serves a model calls
 *   llm_engine_defaults   llm_engine_create   llm_engine_destroy           a model, a backend, a KV pool
 *   llm_sampling_defaults   llm_engine_add_request   llm_engine_abort      requests in, from any thread
 *   llm_model_sampling_defaults                                             the file's general.sampling.*
 *   llm_engine_step   llm_engine_wait   llm_engine_has_work                 the loop, on one thread
 *   llm_engine_get_stats   llm_engine_model   llm_finish_reason_name   llm_engine_check_blocks
 *   (logprobs of the prompt's own tokens, vLLM's prompt_logprobs: llm_sampling_params.prompt_logprobs in,
 *   llm_output.prompt_logprobs out; structured output: llm_sampling_params.grammar, GBNF text, which
 *   llm_json_schema_to_grammar, llm_regex_to_grammar and llm_choice_to_grammar write, or grammar_parsed,
 *   parsed ahead on another thread by llm_engine_parse_grammar; speculative decoding
 *   by n-gram lookup or a draft model: llm_engine_config.spec_tokens, spec_model_path)
 * The parts: each section's own functions, for tools, tests and programs that take one piece
 *   GGUF: llm_gguf_open, _parse, _close, _find, _tensor_find, _int, _float, _string, _arr_int, _arr_float;
 *         llm_dtype_name, llm_dtype_row_bytes, llm_dtype_dequant_row, llm_qblock_unpack
 *   model: llm_model_load, llm_model_dummy, llm_model_dummy_names, llm_model_free; llm_layer_window,
 *         llm_kv_group_layers, llm_kv_groups, llm_kv_place
 *   tokenizer: llm_tokenizer_load, llm_tokenizer_free, llm_tokenize, llm_tokenizer_n_vocab, _bos, _eos,
 *         _adds_bos, _is_eog, _warning; llm_tokenize_prompt
 *   chat: llm_chat_template_init, llm_chat_template_set_today, llm_chat_render, llm_chat_stop_ids,
 *         llm_chat_think_end_ids, llm_chat_detect, llm_chat_family_name, llm_chat_family_from_name
 *   blocks: llm_block_manager_init, llm_block_manager_free, llm_block_alloc, llm_block_release,
 *         llm_block_hash, llm_block_lookup, llm_block_set_hash
 *   forward: llm_rope_freqs, llm_moe_route, llm_cpu_backend_create, llm_cpu_exact_backend_create,
 *         llm_cpu_int8_backend_create (and with LLM_CUDA: llm_cuda_backend_create, llm_cuda_weight_bytes,
 *         llm_cuda_run_gemm, llm_cuda_gemm_config_name, llm_cuda_run_attention)
 *   sampler: llm_sampler_create, llm_sampler_free, llm_sampler_penalize, llm_sampler_candidates,
 *         llm_sampler_sample
 *   grammar: llm_json_parse, _free, _get, _dumps; llm_json_schema_to_grammar, llm_regex_to_grammar,
 *         llm_choice_to_grammar; llm_chat_tool_grammar, llm_chat_answer_grammar, llm_chat_parse_reply,
 *         llm_chat_reply_free (tool calls and thinking, in each chat family's syntax); llm_grammar_parse,
 *         _free, _start, _state_copy, _state_free, _accept, _can_end, _done, _mask, _allows;
 *         llm_token_trie_build, _free
 *   detokenizer: llm_tokenizer_piece, llm_detok_push, llm_detok_flush, llm_detokenize
 *
 * An example: the greedy continuation of a prompt, streamed to stdout (`make test` compiles and runs it).
 * A server runs the same loop on its own thread, sleeping in llm_engine_wait while there is no work, and
 * tells its requests apart by the user pointer that add_request took and every output gives back.
 */
#if 0 /* LLM_EXAMPLE: usage: example MODEL.gguf PROMPT MAX_TOKENS */
#define LLM_IMPLEMENTATION
#include "llm.h"
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    char err[LLM_ERR_LEN];
    if (argc != 4) { fprintf(stderr, "usage: example MODEL.gguf PROMPT MAX_TOKENS\n"); return 2; }
    llm_engine_config cfg = llm_engine_defaults();
    cfg.model_path = argv[1];
    llm_engine *engine = llm_engine_create(&cfg, err);
    if (!engine) { fprintf(stderr, "%s\n", err); return 1; }
    llm_sampling_params params = llm_sampling_defaults();
    params.temperature = 0;                  // greedy
    params.max_tokens = atoi(argv[3]);
    int failed = !llm_engine_add_request(engine, argv[2], NULL, 0, &params, NULL, err);
    if (failed) fprintf(stderr, "%s\n", err);
    while (llm_engine_has_work(engine)) {
        const llm_output *out;
        int n = llm_engine_step(engine, &out); // one forward pass for every running request
        for (int i = 0; i < n; i++) {
            fwrite(out[i].text, 1, (size_t)out[i].text_len, stdout);
            if (out[i].finish_reason != LLM_FINISH_ERROR) continue;
            fprintf(stderr, "%s\n", out[i].error);
            failed = 1;
        }
        fflush(stdout);
    }
    llm_engine_destroy(engine);
    return failed;
}
#endif /* LLM_EXAMPLE */
#ifndef LLM_H
#define LLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LLM_ERR_LEN 256

/* -----------------------------------------------------------------------------------------------------------
 * 1. GGUF: the file's metadata and tensors, as pointers into the mapped file
 * -------------------------------------------------------------------------------------------------------- */
enum llm_gguf_type { /* metadata value types, as numbered in the file */
    LLM_GGUF_U8, LLM_GGUF_I8, LLM_GGUF_U16, LLM_GGUF_I16, LLM_GGUF_U32, LLM_GGUF_I32, LLM_GGUF_F32,
    LLM_GGUF_BOOL, LLM_GGUF_STRING, LLM_GGUF_ARRAY, LLM_GGUF_U64, LLM_GGUF_I64, LLM_GGUF_F64, LLM_GGUF_NTYPES
};

enum llm_dtype { /* tensor element types, numbered as ggml numbers them */
    LLM_F32 = 0, LLM_F16 = 1, LLM_Q4_0 = 2, LLM_Q4_1 = 3, LLM_Q5_0 = 6, LLM_Q5_1 = 7, LLM_Q8_0 = 8,
    LLM_Q2_K = 10, LLM_Q3_K = 11, LLM_Q4_K = 12, LLM_Q5_K = 13, LLM_Q6_K = 14, LLM_BF16 = 30, LLM_MXFP4 = 39
};

typedef struct { const char *ptr; uint64_t len; } llm_str; /* points into the file: not NUL-terminated */

typedef struct {
    llm_str key;
    uint32_t type;          /* enum llm_gguf_type */
    uint32_t arr_type;      /* element type when type == LLM_GGUF_ARRAY */
    uint64_t arr_len;       /* elements in the array (checked against the file's size) */
    const uint8_t *data;    /* the value (or the first array element) in the file */
    llm_str *strs;          /* arrays of strings: each element, indexed once at load */
} llm_gguf_kv;

typedef struct {
    llm_str name;           /* "token_embd.weight", "blk.0.attn_q.weight", ... */
    uint32_t n_dims;        /* 1 to 4 */
    uint64_t ne[4];         /* innermost first: ne[0] values per row */
    uint32_t type;          /* enum llm_dtype */
    uint64_t offset, nbytes; /* offset from the data section's start (a multiple of the alignment); size */
    const void *data;       /* the tensor's first byte in the file, checked to lie within it */
} llm_gguf_tensor;

typedef struct {
    const uint8_t *base; uint64_t size; int mapped; /* the file's bytes; mapped: llm_gguf_close unmaps them */
    uint32_t version;       /* 2 or 3 */
    uint64_t alignment;     /* of the data section and each tensor's offset: general.alignment, else 32 */
    int64_t n_kv, n_tensors;
    llm_gguf_kv *kv;        /* n_kv entries, in file order */
    llm_gguf_tensor *tensors; /* n_tensors entries, in file order */
} llm_gguf;

int  llm_gguf_open(llm_gguf *g, const char *path, char *err);                 /* map a file and parse it */
int  llm_gguf_parse(llm_gguf *g, const void *data, uint64_t size, char *err); /* parse bytes in memory */
void llm_gguf_close(llm_gguf *g);
const llm_gguf_kv *llm_gguf_find(const llm_gguf *g, const char *key);
const llm_gguf_tensor *llm_gguf_tensor_find(const llm_gguf *g, const char *name);
int64_t llm_gguf_int(const llm_gguf *g, const char *key, int64_t fallback);    /* any integer or bool type */
double  llm_gguf_float(const llm_gguf *g, const char *key, double fallback);   /* any numeric type */
llm_str llm_gguf_string(const llm_gguf *g, const char *key);                  /* {NULL,0} when absent */
int64_t llm_gguf_arr_int(const llm_gguf_kv *kv, uint64_t i);
double  llm_gguf_arr_float(const llm_gguf_kv *kv, uint64_t i);

const char *llm_dtype_name(uint32_t type);
/* The bytes a row of n values of a type takes (0 for a type this engine cannot compute with), and such a
 * row as f32, exactly (every type above): what the reference CPU path and the tests read weights as. */
size_t llm_dtype_row_bytes(uint32_t type, int64_t n);
void   llm_dtype_dequant_row(uint32_t type, const void *row, float *out, int64_t n);

/* One block of a quantized type, unpacked: value i = (d * scale[s]) * q[i] - dmin * min[s], s = i / sub.
 * Every quantized type fits this one form (q4_1's minimum is dmin = m, min = -1), so the exact
 * dequantization and the plain-C integer dot products are written once. offset is what the file adds to q
 * to store it unsigned (q4_0: 8, q5_0: 16, q3_K: 4, q6_K: 32): the SIMD dot products work on the stored
 * values and take the offset back out with the sub-block sums of the activations. */
typedef struct {
    float d, dmin;
    int n, sub, offset;             /* values in the block (32 or 256), values per scale (16 or 32) */
    int16_t scale[16], min[16];
    int8_t q[256];
} llm_qblock;
void llm_qblock_unpack(uint32_t type, const void *block, llm_qblock *b);

/* -----------------------------------------------------------------------------------------------------------
 * 2. Model: the configuration from the metadata, and the weights
 * -------------------------------------------------------------------------------------------------------- */
enum llm_arch {
    LLM_ARCH_LLAMA, LLM_ARCH_QWEN2, LLM_ARCH_QWEN3, LLM_ARCH_GEMMA3, LLM_ARCH_PHI3, LLM_ARCH_SMOLLM3,
    LLM_ARCH_QWEN3MOE, LLM_ARCH_GPT_OSS, LLM_ARCH_QWEN2MOE, LLM_ARCH_COUNT
};

typedef struct {
    int arch;                 /* enum llm_arch */
    /* the shape: the residual stream's width, layers, query heads, K/V heads (fewer: grouped-query
     * attention), values per head, the dense FFN's hidden width, the embedding's rows, trained context */
    int dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, context_length;
    int rope_dim;             /* leading dims of each head that RoPE rotates (usually head_dim) */
    int rope_neox;            /* 1: rotate x[i] with x[i + rope_dim/2] (qwen); 0: adjacent pairs (llama) */
    float rope_base, rms_eps;
    /* RoPE scaling (rope.scaling.*, as llama.cpp reads it): angles times rope_freq_scale (1 / the factor;
     * "linear"; local layers: rope_freq_scale_swa), cos and sin times rope_attn_factor, and with YaRN
     * (gpt-oss: factor 32 over an original 4096 positions) the fast dimensions kept as they were, a ramp
     * between yarn_dims[0] and [1], and cos and sin times 1 + 0.1 ln(1 / scale) too (0, in a config written
     * by hand: 1) */
    float rope_freq_scale, rope_freq_scale_swa, rope_attn_factor, yarn_dims[2];
    int rope_yarn;
    /* per-pair divisors of the angles (rope_dim / 2 of them; NULL: none): Llama 3.1's rope_freqs, or
     * Phi-3.5's LongRoPE, whose long factors serve a context past rope_orig_ctx and the short ones one within
     * it (as llama.cpp picks them, by the context the engine runs with: llm_model_set_context) */
    const float *rope_factors, *rope_factors_long, *rope_factors_short;
    int rope_orig_ctx;
    /* Gemma 3, gpt-oss: local layers attend to the last sliding_window positions only, with their own RoPE
     * base and scale (gpt-oss: the same as the others'; Gemma 3: its own base, no scaling); every
     * swa_pattern-th layer is global (0: no window) */
    int sliding_window, swa_pattern;
    float rope_base_swa;
    int nope_every;           /* SmolLM3: every nope_every-th layer has no RoPE (0: all have it) */
    /* mixture of experts (qwen3moe, qwen2moe, gpt-oss; llama files with experts, as Mixtral): each token's
     * FFN is the weighted sum of n_experts_used of n_experts FFNs of width expert_ffn_dim, picked by a router
     * (0: a dense FFN); qwen2moe adds a shared expert of width shared_ffn_dim that every token goes
     * through */
    int n_experts, n_experts_used, expert_ffn_dim, shared_ffn_dim;
    int pooling;              /* an embedding model's pooling ({arch}.pooling_type, llama.cpp's enum: 0 none,
                               * 1 mean, 2 cls, 3 last, 4 rank; enum llm_pooling for the first four) */
} llm_config;

/* rows of cols values; tiles: the same in a CPU backend's layout for decode steps (section 14's decode tiles:
 * q4_0's, q4_1's, q5_0's, q5_1's, q8_0's, q4_K's, q5_K's and q6_K's rows 8 side by side), or NULL */
typedef struct { const void *data; uint32_t type; int64_t rows, cols; const void *tiles; } llm_weight;

typedef struct {
    llm_weight attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm; /* b*, *_norm: data NULL when absent */
    llm_weight bo, sinks;     /* gpt-oss: the output projection's bias; a logit per head that takes a share of
                               * the softmax and gives nothing (an "attention sink") */
    llm_weight ffn_norm, w_gate, w_up, w_down;
    llm_weight post_attn_norm, post_ffn_norm; /* Gemma 3: the norms of each block's output (else absent) */
    /* mixture of experts: the router (n_experts rows) and the experts' matrices stacked, expert e's rows
     * e * rows_per_expert on (w_gate, w_up, w_down unused) */
    llm_weight router, gate_exps, up_exps, down_exps;
    llm_weight router_b, gate_exps_b, up_exps_b, down_exps_b; /* gpt-oss: their biases, a row per expert */
    llm_weight shared_gate_inp, shared_gate, shared_up, shared_down; /* qwen2moe: the shared expert and the
                                                                     * vector its gate's logit comes from */
} llm_layer;

typedef struct llm_tokenizer llm_tokenizer;

typedef struct llm_model {
    llm_config cfg;
    char name[128];
    llm_gguf gguf;            /* the mapped file (zeroed for a dummy model) */
    llm_tokenizer *tok;       /* NULL for a dummy model: it takes token ids only */
    llm_weight tok_embd, output_norm, output; /* output is tok_embd when the file ties them */
    llm_weight cls_out, cls_out_bias; /* a reranker's classifier (llama.cpp's cls.output: Qwen3-Reranker's
                                       * "yes" and "no" rows), or data NULL */
    llm_layer *layers;        /* n_layers of them */
    void *owned;              /* weights we allocated (dummy models) */
} llm_model;

int  llm_model_load(llm_model *m, const char *path, char *err);
/* A model of a real checkpoint's shape with random weights and no file, like vLLM's dummy load format; the
 * presets are named by llm_model_dummy_names ("tiny", "tinyllama-1.1b", "llama-3.2-1b", "qwen2.5-0.5b", and
 * the mixtures of experts "tiny-moe" and "qwen3-30b-a3b-4l", Qwen3-30B-A3B's shape with 4 of its 48
 * layers). */
int  llm_model_dummy(llm_model *m, const char *preset, uint64_t seed, char *err);
const char *llm_model_dummy_names(void);
void llm_model_free(llm_model *m);
/* What a backend needs of a model's layers: a layer's attention window (0: every earlier position), and where
 * its K and V live in the KV cache: the layers that attend alike form groups of llm_kv_group_layers layers,
 * llm_kv_groups of them, each with its own block tables; a layer has a group and a place among its group's
 * layers in a block */
int  llm_layer_window(const llm_config *c, int layer);
int  llm_kv_group_layers(const llm_config *c);
int  llm_kv_groups(const llm_config *c);
void llm_kv_place(const llm_config *c, int layer, int *group, int *index);

/* -----------------------------------------------------------------------------------------------------------
 * 3. Tokenizer: text to token ids (built from the GGUF vocabulary; it points into the llm_gguf, which must
 *    outlive it). Several threads may tokenize with one tokenizer at once.
 * -------------------------------------------------------------------------------------------------------- */
llm_tokenizer *llm_tokenizer_load(const llm_gguf *g, char *err);   /* NULL and a message on error */
void llm_tokenizer_free(llm_tokenizer *t);
/* Text to ids. Returns the number of ids (which may exceed cap: then only cap were written; call again with
 * more room), or -1 on error. parse_special: text like "<|im_end|>" becomes that control token (user-defined
 * tokens are taken whole always, as llama.cpp takes them). */
int  llm_tokenize(const llm_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                  int32_t *out, int cap);
int  llm_tokenizer_n_vocab(const llm_tokenizer *t);
int  llm_tokenizer_bos(const llm_tokenizer *t);                /* -1 when the vocabulary has none */
int  llm_tokenizer_eos(const llm_tokenizer *t);
int  llm_tokenizer_adds_bos(const llm_tokenizer *t);           /* add_bos_token, or the type's default */
int  llm_tokenizer_adds_eos(const llm_tokenizer *t);           /* add_eos_token: an embedding's text ends
                                                                * with EOS (llama.cpp's add_special) */
int  llm_tokenizer_is_eog(const llm_tokenizer *t, int32_t id); /* end of generation: eos, eot, <|im_end|> */
/* What loading found doubtful, for the program to show ("" when nothing): a pre-tokenizer
 * (tokenizer.ggml.pre) it does not know, split as llama.cpp's 'default' instead. */
const char *llm_tokenizer_warning(const llm_tokenizer *t);
/* A prompt's ids, as the engine takes a text prompt: special tokens parsed, and BOS first when the vocabulary
 * asks for one and the text does not begin with it already (chat templates write it themselves). */
int  llm_tokenize_prompt(const llm_tokenizer *t, const char *text, size_t len, int32_t *out, int cap);

/* -----------------------------------------------------------------------------------------------------------
 * 4. Chat: a conversation written out as the model's chat template writes it, without a Jinja engine
 * As llama.cpp does, the template's family is recognised from the template text in the GGUF
 * (tokenizer.chat_template), or from the vocabulary's special tokens when there is none, and each family is
 * written by hand, byte for byte what its published Jinja template renders. The REPL and the server's
 * /v1/chat/completions both go through llm_chat_render.
 * -------------------------------------------------------------------------------------------------------- */
enum llm_chat_family {
    LLM_CHAT_CHATML, LLM_CHAT_QWEN3, LLM_CHAT_LLAMA3, LLM_CHAT_LLAMA2,
    LLM_CHAT_MISTRAL_V1, LLM_CHAT_MISTRAL_V3, LLM_CHAT_MISTRAL_V3_TEKKEN, LLM_CHAT_MISTRAL_V7,
    LLM_CHAT_MISTRAL_V7_TEKKEN, LLM_CHAT_ZEPHYR, LLM_CHAT_PHI3, LLM_CHAT_GEMMA, LLM_CHAT_QWQ,
    LLM_CHAT_GPT_OSS, LLM_CHAT_NFAMILIES
};

typedef struct {                    /* a call of a tool that an assistant turn made */
    const char *id;                 /* "call_..." (NULL: none) */
    const char *name;
    const char *arguments;          /* JSON text of an object */
} llm_chat_tool_call;

typedef struct {
    const char *role;               /* "system" (or "developer", the same), "user", "assistant" or "tool" */
    const char *content;            /* NULL: none (an assistant turn that only calls tools) */
    const char *reasoning;          /* assistant: its thinking apart from content (NULL: none, or in content
                                     * inside <think></think>) */
    const llm_chat_tool_call *tool_calls; /* assistant: the calls it made */
    int n_tool_calls;
    const char *tool_call_id;       /* tool: the call this is the result of */
} llm_chat_message;

/* How a family writes tools and calls (set by llm_chat_template_init from the template's markers) */
enum llm_tool_format {
    LLM_TOOLS_GENERIC,              /* no format of its own: the tools described in the system turn, and the
                                     * reply always JSON, {"tool_calls": [...]} or {"response": "..."} */
    LLM_TOOLS_HERMES,               /* Qwen2.5, Qwen3: <tools></tools>, <tool_call>{"name", "arguments"}
                                     * </tool_call>, results in <tool_response> */
    LLM_TOOLS_LLAMA3,               /* Llama 3.1-3.3: JSON {"name", "parameters"}, the ipython role */
    LLM_TOOLS_MISTRAL,              /* Mistral v3 (7B v0.3, Nemo, Large 2407): [AVAILABLE_TOOLS], calls as
                                     * [TOOL_CALLS][{"name", "arguments", "id"}], [TOOL_RESULTS]; ids of 9 */
    LLM_TOOLS_MISTRAL_ARGS,         /* Mistral Small 3.2 (v11): [TOOL_CALLS]name[CALL_ID]id[ARGS]{...},
                                     * results [TOOL_RESULTS]id[TOOL_CONTENT]...[/TOOL_RESULTS]; ids of 9 */
    LLM_TOOLS_HARMONY               /* gpt-oss: the tools as a TypeScript namespace in the developer message,
                                     * calls as messages to=functions.NAME on the commentary channel */
};

typedef struct {
    int family;                     /* enum llm_chat_family */
    char bos[64], eos[64];          /* the vocabulary's BOS and EOS texts, which some templates write */
    char default_system[4096];      /* written when the conversation has no system message, as the templates
                                     * of SmolLM2, Qwen2.5 and Mistral Small 3.2 do ("" for none) */
    int enable_thinking;            /* Qwen3: 0 writes the empty <think></think> block that turns thinking
                                     * off (init: 1, the template's own default) */
    int dated_system;               /* Llama 3.1 and later: the system turn opens with the knowledge cutoff
                                     * and today's date, always */
    char date[32];                  /* that date, as "26 Jul 2024" (init: today's, or the template's own;
                                     * gpt-oss: today's, as "2026-11-26") */
    int dated_today;                /* the date is today's (Llama 3.2's strftime_now, gpt-oss): a program
                                     * that runs for days renews it (llm_chat_template_set_today) */
    char reasoning_effort[16];      /* gpt-oss: its system message's "Reasoning:" (init: "medium") */
    int tool_format;                /* enum llm_tool_format */
    int call_id_len;                /* Mistral: the template takes only call ids of 9 letters and digits; 0
                                     * any */
    int thinks;                     /* the model writes <think>...</think> before its answer (Qwen3) */
    int opens_think;                /* the generation prompt opens the <think> block itself (Qwen3's
                                     * thinking-only templates, as DeepSeek-R1's): the reply starts inside */
    size_t max_text;                /* the longest text a render writes, in bytes: past it the render stops
                                     * and returns -2 (init 0, as is more than LLM_CHAT_MAX_TEXT: that) */
    char note[LLM_ERR_LEN];         /* a warning: why the family is not what was asked for ("" when it is) */
} llm_chat_template;

const char *llm_chat_family_name(int family);        /* "chatml", "qwen3", "llama3", ...; NULL past the end */
int  llm_chat_family_from_name(const char *name);    /* -1 for a name that is none of them */
/* The family a template text belongs to; with no text (len 0), what the vocabulary's special tokens say
 * (t may be NULL). -1 when neither tells. */
int  llm_chat_detect(const char *template_text, size_t len, const llm_tokenizer *t);
/* The template of a model from its template text (the GGUF's tokenizer.chat_template; len 0 for none) and
 * its tokenizer: the family named (name NULL: detected), its BOS/EOS texts, default system prompt and date.
 * A name or template it does not know falls back to ChatML, with a warning in ct->note. -1 and a message
 * without a tokenizer. */
int  llm_chat_template_init(llm_chat_template *ct, const char *template_text, size_t len,
                            const llm_tokenizer *t, const char *name, char *err);
/* A template that dates its prompts today (ct->dated_today) gets the date of unix_seconds in the local time
 * zone, in its format, the month's name in English whatever the locale; any other keeps its date. A server
 * calls it for each request, or a prompt would carry the day it started. */
void llm_chat_template_set_today(llm_chat_template *ct, int64_t unix_seconds);
/* The longest text llm_tokenize takes (INT32_MAX / 4 bytes): a render's bound unless ct->max_text is less
 * (a longer text could not be tokenized anyway) */
#define LLM_CHAT_MAX_TEXT ((size_t)INT32_MAX / 4)
/* The conversation as text, with the assistant's generation prompt at the end when asked; tools: the JSON
 * text of a request's tools, a list of {"type": "function", "function": {"name", "description",
 * "parameters"}} (NULL: none), written as the family writes them. Returns the length (which may exceed cap:
 * then call again with more room; out is NUL-terminated when the text fits), -1 for a role it does not
 * know or tools or arguments that are not JSON, or -2 for a text longer than ct->max_text. */
int  llm_chat_render(const llm_chat_template *ct, const llm_chat_message *msgs, int n_msgs, const char *tools,
                     int add_generation_prompt, char *out, int cap);
/* The ids that end the assistant's turn in this family (<|im_end|>, <|eot_id|>, <end_of_turn>, ... and EOS),
 * to give a request as stop_token_ids. Returns how many (at most cap written). */
int  llm_chat_stop_ids(const llm_chat_template *ct, const llm_tokenizer *t, int32_t *ids, int cap);
/* The ids that close this family's think block ("</think>", tokenized with its control tokens: one id in
 * Qwen3's vocabulary, several in a vocabulary without it), to give a request as think_end_ids with a
 * think_budget. Returns how many (at most cap written); 0 for a family that does not think in <think> blocks
 * (gpt-oss thinks in a channel) or too many for cap. */
int  llm_chat_think_end_ids(const llm_chat_template *ct, const llm_tokenizer *t, int32_t *ids, int cap);
/* The ids that open the think block ("<think>") when the reply opens it itself (Qwen3), to give as
 * think_start_ids with a think_budget; 0 when the generation prompt opened it (QwQ, thinking-only
 * templates: the reply starts inside) or the family does not think in <think> blocks. */
int  llm_chat_think_start_ids(const llm_chat_template *ct, const llm_tokenizer *t, int32_t *ids, int cap);

/* -----------------------------------------------------------------------------------------------------------
 * 5. Requests: what a request asks for. (The scheduler that turns requests into each step's plan is private
 *    to the implementation: see its section 5.)
 * -------------------------------------------------------------------------------------------------------- */
#define LLM_THINK_OPENS_WITHIN 4    /* think_start_ids are looked for at the output's tokens 0..4 */
typedef struct {
    int n;                          /* parallel samples of one prompt (they share the prompt's KV blocks) */
    float temperature;              /* 0: greedy */
    int top_k;                      /* 0: off */
    float top_p;                    /* 1: off */
    float min_p;                    /* 0: off; keep tokens with p >= min_p * p_max */
    float repetition_penalty;       /* 1: off; prompt and output tokens (vLLM's definition) */
    float presence_penalty, frequency_penalty;  /* 0: off; output tokens only */
    int64_t seed;                   /* -1: a random seed; sample i of a request uses seed + i */
    int max_tokens;                 /* 0: until the context is full */
    int ignore_eos;
    int logprobs;                   /* -1: none; 0: the sampled token's; K: also the top K alternatives */
    int prompt_logprobs;            /* -1: none; 0: each prompt token's own (after the first); K: also the
                                     * top K there (K <= 20). Every prompt position is computed: such a
                                     * request takes nothing from the prefix cache (see llm_output) */
    const char *const *stop;        /* stop strings (copied by add_request); not in the output unless: */
    int n_stop;
    int include_stop_str;           /* 1: the stop string found ends the output (vLLM's
                                     * include_stop_str_in_output) */
    const int32_t *stop_token_ids;  /* copied */
    int n_stop_token_ids;
    int min_tokens;                 /* end of generation and stop ids cannot be sampled before this many */
    int special_text;               /* 1: control tokens' text is output too (vLLM's skip_special_tokens=0) */
    const int32_t *logit_bias_ids;  /* OpenAI's logit_bias: bias[i] (in [-100, 100]) is added to the */
    const float *logit_bias;        /* logit of token logit_bias_ids[i] before sampling: -100 keeps it out, */
    int n_logit_bias;               /* +100 forces it (copied; logprobs stay the model's own) */
    const int32_t *allowed_token_ids; /* vLLM's: only these can be sampled (copied); 0 of them: any */
    int n_allowed_token_ids;
    const int32_t *bad_word_ids;    /* vLLM's bad_words as token sequences, one after another (copied): a */
    const int32_t *bad_word_lens;   /* word's last token cannot be sampled when the output ends with the */
    int n_bad_words;                /* rest of it (a word of one token never) */
    const char *grammar;            /* GBNF text (copied; start rule "root"), NULL: none. The output, from its
                                     * first byte, is a sentence of it: only tokens that go on in it are
                                     * sampled, end of generation only where the sentence is whole, and the
                                     * sequence stops ("stop") when nothing more may follow. Section 12 writes
                                     * JSON Schema, regular expressions and choices as GBNF. */
    struct llm_grammar *grammar_parsed; /* or the grammar parsed already (llm_engine_parse_grammar, off the
                                     * thread that adds the request: a large one takes a while); the request
                                     * takes a reference of its own. Both NULL: none */
    int priority;                   /* under the priority policy, lower is served first (vLLM's); else 0 */
    const char *cache_salt;         /* NULL: none. A request shares cached prefix blocks only with requests of
                                     * the same salt (vLLM's cache_salt: one tenant cannot time another's
                                     * prompts through the cache). Hashed by add_request, not kept. */
    int think_budget;               /* 0: none. A thinking budget (vLLM's thinking_token_budget, Anthropic's
                                     * budget_tokens): once think_budget tokens are out and none of them
                                     * closed the think block (think_end_ids in a row), the next tokens are
                                     * think_end_ids, forced (through a grammar's check too: a grammar that
                                     * refuses them wins); then the answer, sampled. The budget counts
                                     * from the output's first token (the prompt opened the think block:
                                     * QwQ), or from the end of think_start_ids when given */
    const int32_t *think_end_ids;   /* the family's "</think>" as token ids, 1 to 8 of them (copied) */
    int n_think_end_ids;
    const int32_t *think_start_ids; /* the family's "<think>", when the reply opens its block itself (Qwen3):
                                     * 0 to 8 ids (copied). The budget counts from their end if they open
                                     * the output (within its first LLM_THINK_OPENS_WITHIN tokens); a reply
                                     * that opens no think block has nothing of it cut */
    int n_think_start_ids;
    int pooling;                    /* enum llm_pooling: 0 generates; else an embedding: the prompt's final
                                     * hidden states (after the final norm, no output layer) pooled into one
                                     * vector, in the finishing output (llm_output.embedding), nothing
                                     * generated. Mean and cls compute every position: they take nothing
                                     * from the prefix cache; last may. n must be 1, no grammar or
                                     * prompt_logprobs */
    int rank_ids[2];                /* rank pooling on a model without cls.output: its relevance logit is
                                     * the output rows of rank_ids[0] ("yes") minus rank_ids[1] ("no") at
                                     * the last position (vLLM's classifier_from_token, Qwen3-Reranker) */
} llm_sampling_params;

/* How an embedding pools a prompt's hidden states (llama.cpp's pooling_type values): their mean, the first
 * position's (cls), or the last position's (last: Qwen3-Embedding reads the EOS its tokenizer appends).
 * rank: a reranker's one value, the relevance logit of the last position (llm_rank_logit); its output's
 * embedding holds that value alone */
enum llm_pooling { LLM_POOL_NONE, LLM_POOL_MEAN, LLM_POOL_CLS, LLM_POOL_LAST, LLM_POOL_RANK };

llm_sampling_params llm_sampling_defaults(void);
/* The sampling a model's file recommends, as llama.cpp reads it: the general.sampling.* keys this sampler has
 * a field for (temp, top_k, top_p, min_p, penalty_repeat) are written into *p, the fields the file does not
 * name are left as they are (a program puts its own defaults there first, and its flags over them after).
 * Returns the fields written, LLM_SAMPLING_* bits (0 when the file names none, as most files do). note (may
 * be NULL; LLM_ERR_LEN bytes) gets what was left out: a value out of range, or a key with no field here
 * (penalty_last_n: the repetition penalty here spans the whole prompt and output; xtc_*, mirostat*,
 * sequence); "" when nothing was. */
enum {
    LLM_SAMPLING_TEMP = 1, LLM_SAMPLING_TOP_K = 2, LLM_SAMPLING_TOP_P = 4, LLM_SAMPLING_MIN_P = 8,
    LLM_SAMPLING_REPEAT = 16
};
int llm_model_sampling_defaults(const llm_model *m, llm_sampling_params *p, char *note);

/* -----------------------------------------------------------------------------------------------------------
 * 6. Blocks: the KV pool's bookkeeping (the memory itself is the backend's)
 * A full block of prompt or output is named by a hash of (its predecessor's hash, its token ids); when freed
 * it keeps its contents and its name, so a later request with the same prefix takes it back (automatic prefix
 * caching) until allocation evicts it. Free blocks sit in one list: the unnamed ones first, the most recently
 * freed first (their memory is warm, and a pool used so touches no more pages than its busiest moment needed:
 * a long-running server's memory settles), then the named ones, least recently freed first (evicted in that
 * order, after every unnamed block is taken).
 * -------------------------------------------------------------------------------------------------------- */
typedef struct {
    int ref_count;                  /* 0: the block is in the free list */
    int prev_free, next_free;       /* links in the free list; -1 at the ends */
    uint64_t hash;                  /* its name in the prefix cache; 0: none (llm_block_hash never gives 0) */
} llm_block;

typedef struct { uint64_t key; int value; } llm_block_hash_entry;

typedef struct {
    int num_blocks, block_size;     /* blocks in the pool; token positions per block */
    llm_block *blocks;              /* num_blocks records, indexed by block id */
    int free_head, free_tail, num_free_blocks; /* the free list's ends (-1 when empty) and length */
    llm_block_hash_entry *cached;   /* stb_ds hash map: block hash -> block id */
    int enable_prefix_caching;      /* 0: no block is ever named or looked up */
    int64_t evictions;              /* named blocks taken for new content, since init */
} llm_block_manager;

int  llm_block_manager_init(llm_block_manager *bm, int num_blocks, int block_size, int enable_prefix_caching,
                            char *err);
void llm_block_manager_free(llm_block_manager *bm);
int  llm_block_alloc(llm_block_manager *bm);           /* a block with ref_count 1, or -1 when none is free */
void llm_block_release(llm_block_manager *bm, int id); /* ref_count - 1; at 0 it joins the free list */
uint64_t llm_block_hash(uint64_t prev_hash, const int32_t *tokens, int n);
int  llm_block_lookup(llm_block_manager *bm, uint64_t hash);  /* cached block id (ref taken) or -1 */
void llm_block_set_hash(llm_block_manager *bm, int id, uint64_t hash);

/* -----------------------------------------------------------------------------------------------------------
 * 7. Forward: a batch through the model, over the paged KV cache, on a backend
 * The cache is a pool of blocks of block_size token slots (K and V, for each layer of a group). A sequence
 * owns a list of blocks for each group of layers, its block tables: position p lives in block
 * block_table[p / block_size], slot p % block_size. A model without windows has one group, of all its
 * layers; in a group of local layers the entries of blocks wholly outside the window are -1.
 * -------------------------------------------------------------------------------------------------------- */
/* One forward call: the new tokens of several sequences, flattened. Each token attends to its sequence's
 * positions 0..its own, read from the cache through the sequence's block table (earlier positions must be
 * there already: computed in an earlier step, or shared from the prefix cache). */
typedef struct {
    int n_tokens;
    const int32_t *tokens, *positions;  /* [n_tokens]: a sequence's tokens are at consecutive positions */
    int n_seqs;
    const int32_t *seq_start;           /* [n_seqs + 1]: sequence s: tokens [seq_start[s], seq_start[s+1]) */
    const int32_t *const *block_tables; /* [groups * n_seqs]: group g's table of sequence s at g * n_seqs +
                                         * s */
    int n_logits;
    const int32_t *logit_rows;          /* [n_logits]: the tokens whose logits come out, in this order */
    /* host_rows[i] = 1 when the engine reads logit row i on the host (a grammar's mask may need the whole
     * row); the other rows only go to the sample step that follows (llm_backend.sample), which reads them
     * where they are: a GPU need not copy them. NULL: every row is wanted on the host. */
    const uint8_t *host_rows;
    int n_copies;
    const int32_t *copy_src, *copy_dst; /* [n_copies]: blocks copied first (copy-on-write of shared blocks) */
    int n_hidden;                       /* embeddings (llm_sampling_params.pooling): these tokens' last */
    const int32_t *hidden_rows;         /* hidden states after the final norm, without the output layer, */
    float *hidden;                      /* written into hidden[n_hidden][dim] (a backend that has_hidden) */
} llm_batch;

/* One draw from a row of logits, as its request asks (the backend's sample step, and the engine's own for
 * the rows it reads): the row adjusted (allowed ids, logit_bias, bad words; under min_tokens the stop ids and
 * the ends of generation masked), the penalties, one draw from *rng_state (greedy: the argmax), and the
 * logprobs of the row as the model gave it. Or, with score, no draw: the token given is scored (a prompt's
 * token, for prompt_logprobs). llm_sampler_sample_rows (section 8) is the host's. */
typedef struct {
    int row;                            /* the last forward call's logit row */
    const llm_sampling_params *params;
    const int32_t *history;             /* the prompt's n_prompt tokens, then the output's: penalties,
                                         * bad words, min_tokens */
    int n_prompt, n_history;
    const int32_t *eog; int n_eog;      /* the vocabulary's ends of generation */
    uint64_t *rng_state;                /* the request's generator, advanced by the draw */
    int32_t *top_ids; float *top_logprobs; /* out: the top min(params->logprobs, vocab) (none when -1);
                                         * scoring: params->prompt_logprobs of them */
    int score;                          /* 1: token is given, history[n_history] (the prompt's next) */
    int32_t token;                      /* out: the token; -1: the row is not finite; -2: nothing to pick */
    float logprob;                      /* out, when params->logprobs >= 0 (or scoring): the token's */
    int32_t rank;                       /* out, scoring: 1 + the tokens more likely than it */
} llm_sample_row;

/* A backend starts from a loaded model (the CPU reads the weights where they are, so the model must outlive
 * it; CUDA copies them to the GPU), says what a KV value costs it and how much memory it has; the engine
 * sizes the KV pool from that and calls alloc_kv once. Then each step is a forward call and a sample step. */
typedef struct llm_backend {
    const char *name;
    const char *kernels;            /* the CPU's SIMD kernels: "avx512vnni", "avx512", "avx2", "neon" or
                                     * "plain C" (a distribution build's: the variant it picked); or NULL */
    int kv_head_bytes;              /* bytes of one cached K or V head (head_dim values): 2 a value on the CPU
                                     * (f16; 4 on the exact path, f32; q8_0 34 and q4_0 18 per 32, a head
                                     * whole blocks) and on CUDA (bf16) */
    size_t free_memory;             /* bytes left for the KV pool, after the weights and the activations */
    size_t activation_memory;       /* the room for the activations free_memory leaves out (0: none held
                                     * back): a second model on the same device must leave it too */
    double default_kv_fraction;     /* the pool when the config gives no size: this fraction of free_memory
                                     * (0: room for max_num_seqs full contexts, 4 GiB at most) */
    int default_batched_tokens;     /* the step's token budget when the config gives none (0: 2048): a GPU
                                     * takes long prompts in fewer, larger steps */
    int has_hidden;                 /* 1: forward writes llm_batch.hidden (embeddings); 0: it cannot, and
                                     * the engine refuses pooling requests */
    int  (*alloc_kv)(struct llm_backend *be, int num_blocks, int block_size, char *err);
    /* K/V in the config's kv_cache_dtype (enum llm_kv_dtype, not auto) from now on, called before alloc_kv
     * when the config names one (NULL: the backend keeps its one type) */
    int  (*set_kv_dtype)(struct llm_backend *be, int dtype, char *err);
    /* logits: [n_logits][vocab_size], written for the batch's logit rows */
    int  (*forward)(struct llm_backend *be, const llm_batch *b, float *logits, char *err);
    /* rows[n_rows] of the last forward call's logits sampled where they are: each row's token and logprobs
     * written. logits: the rows that call wrote on the host; a backend that keeps its rows elsewhere reads
     * its own, and may stage them in the rows it did not write */
    int  (*sample)(struct llm_backend *be, llm_sample_row *rows, int n_rows, float *logits, char *err);
    void (*destroy)(struct llm_backend *be);
    void *ctx;
} llm_backend;

/* RoPE as a frequency per rotated pair (rope_dim / 2 of them): pair i of a head at position pos turns by
 * pos * freq[i], and cos and sin are scaled by *mscale, as the file's RoPE scaling says (base, freq_scale: a
 * global layer's rope_base and rope_freq_scale, a local one's rope_base_swa and rope_freq_scale_swa) */
void llm_rope_freqs(const llm_config *c, float base, float freq_scale, float *freq, float *mscale);
/* A mixture of experts' routing, as the arch has it (see llm_cpu_moe): T rows of router logits in scores
 * ([T][n_experts]; overwritten), router_bias (gpt-oss; else NULL) added; out: each token's n_experts_used
 * experts, best first, and their weights ([T][n_experts_used] each) */
void llm_moe_route(const llm_config *cf, const float *router_bias, float *scores, int T, int *chosen,
                   float *weight);
/* The CPU: quantized weights as stored (q4_0's, q4_1's, q5_0's, q5_1's, q8_0's, q4_K's, q5_K's and q6_K's
 * matrices copied, 8 rows side by side, when it starts), times activations rounded to 16 bits (see
 * llm_cpu_path) */
llm_backend *llm_cpu_backend_create(const llm_model *m, char *err);
/* The plain-C reference: each weight row converted to f32 exactly (llm_dtype_dequant_row) and multiplied in
 * f32, activations as they are. Slower; what the fast path and the CUDA kernels are checked against. */
llm_backend *llm_cpu_exact_backend_create(const llm_model *m, char *err);
/* llama.cpp's arithmetic: activations rounded to 8 bits. Faster prompts; answers part from the exact path's
 * at near ties. */
llm_backend *llm_cpu_int8_backend_create(const llm_model *m, char *err);
#ifdef LLM_CUDA
llm_backend *llm_cuda_backend_create(const llm_model *m, char *err);   /* NULL and why, when no GPU answers */
/* The device bytes the backend's weight matrices take: a quantized matrix its file's bytes, a f32/f16/bf16
 * one 2 bytes a value (rows padded to 8 values); norms and biases not counted */
size_t llm_cuda_weight_bytes(const llm_backend *be);

/* llm.cu's kernels one at a time on plain f32 host arrays, as the forward pass launches them: for test.c's
 * GPU checks and kernel benchmarks. With reps > 0 the call also times reps more runs (CUDA events) and gives
 * the mean in seconds. A NULL input is filled on the device instead (a constant pattern: what the benchmarks
 * use, whose sizes would make host copies slow); a NULL output is not read back. */
typedef struct {
    int M, N, K;
    const float *A, *W;             /* [M][K], [N][K]: rounded to bf16 on upload, as the weights are */
    /* W_raw instead of W: N rows of K values of the quantized type w_type, as a file holds them, kept so on
     * the device as the backend keeps them. M <= 8 then runs the decode GEMV (exact weights), larger M the
     * GEMM that dequantizes tiles to bf16 in shared memory. W_out (NULL: not read back): [N][K], the
     * device's own dequantization of W_raw, which must equal llm_dtype_dequant_row's bit for bit. */
    uint32_t w_type;
    const void *W_raw;
    float *W_out;
    float *C;                       /* [M][N]: C = A W^T, or C += A W^T with accumulate */
    int accumulate, reps;
    int used_gemv;                  /* out: 1 when the GEMV ran, 0 for the tensor-core GEMM */
    /* tuning: config k > 0 runs the GEMM's tile shape k (llm_cuda_gemm_config_name(k) names it, NULL past
     * the last; the later ones for bf16 W only) instead of the backend's choice; no_split: no split-K */
    int config, no_split;
    double seconds;
} llm_cuda_gemm_run;
int llm_cuda_run_gemm(llm_cuda_gemm_run *r, char *err);
const char *llm_cuda_gemm_config_name(int config);

/* The QKV preparation (bias, q/k norm, RoPE, K/V written to the cache) and paged attention of the config's
 * first layer: a local one when the config gives it a window (llm_layer_window; RoPE base rope_base_swa) */
typedef struct {
    const llm_config *cfg;
    const llm_batch *batch;         /* positions and block tables (its tokens are not read) */
    int num_blocks, block_size, part_size;  /* part_size: attention partition length, a multiple of 32 */
    const float *qkv;               /* [n_tokens][q_dim + 2 kv_dim]: the QKV projection's output */
    const float *bias, *q_norm, *k_norm;    /* NULL when absent */
    float *k_cache, *v_cache;       /* in and out: [block][slot][kv_head][head_dim], llm.h's CPU layout
                                     * (f32, rounded to bf16 on the way in); the new tokens' K/V written */
    float *q_out, *att_out;         /* [n_tokens][q_dim]: q after norm and RoPE; the attention output */
    int generic_kernel;             /* the kernel for any head_dim, not one compiled for cfg's (64, 128) */
    int reps;
    double seconds;
} llm_cuda_attention_run;
int llm_cuda_run_attention(llm_cuda_attention_run *r, char *err);
#endif

/* -----------------------------------------------------------------------------------------------------------
 * 8. Sampler: the next token from a row of logits. It only reads the logits (so logprobs and the n samples of
 *    a request read the same row); its scratch is its own, made once for a vocabulary size. One per thread.
 * -------------------------------------------------------------------------------------------------------- */
typedef struct llm_sampler llm_sampler;

llm_sampler *llm_sampler_create(int n_vocab, char *err);
void llm_sampler_free(llm_sampler *s);
/* The logits with the repetition, presence and frequency penalties applied (a copy in the sampler's scratch),
 * or logits itself when no penalty is on. history: the prompt's n_prompt tokens, then the output so far. */
const float *llm_sampler_penalize(llm_sampler *s, const llm_sampling_params *p, const float *logits,
                                  const int32_t *history, int n_prompt, int n_history);
/* The tokens sampling may pick after temperature, top-k, top-p and min-p (most likely first when top-k or
 * top-p is on, else in id order: a draw needs no order), with their renormalised probabilities (in the
 * sampler's scratch, valid until its next call); returns how many. logits:
 * n of them, the vocabulary's (n = n_vocab) or a part of it gathered (the ids are then positions in it). */
int llm_sampler_candidates(llm_sampler *s, const llm_sampling_params *p, const float *logits, int n,
                           const int32_t **ids, const float **probs);
/* Penalties, then the candidates, then one draw from *rng_state (greedy: the argmax). -1 when there is no
 * candidate (logits that are not numbers). */
int32_t llm_sampler_sample(llm_sampler *s, const llm_sampling_params *p, const float *logits,
                           const int32_t *history, int n_prompt, int n_history, uint64_t *rng_state);
/* A row of logits (n_vocab of them) as r's request samples from it: allowed ids, logit_bias, bad words and,
 * under min_tokens, the stop ids and ends of generation masked. logits itself when nothing changes it, else
 * a copy in the sampler's scratch. */
const float *llm_sampler_adjust(llm_sampler *s, const llm_sample_row *r, const float *logits);
/* 1 when all r wants is its row's argmax: greedy, nothing adjusts the row and no logprobs (what a GPU picks
 * where the logits are) */
int llm_sample_row_is_argmax(const llm_sample_row *r);
/* r's token (r->token too): -1 when a value of the row is not finite; else the row adjusted, then
 * llm_sampler_sample (-2: no candidate) */
int32_t llm_sampler_draw(llm_sampler *s, llm_sample_row *r, const float *logits);
/* r's logprobs, from the row as the model gave it: the top ones, and r->token's (scoring: its rank too) */
void llm_sample_row_logprobs(llm_sample_row *r, const float *logits, int n_vocab);
/* The sample step on the host: each row drawn and its logprobs written (row r->row at logits + r->row *
 * n_vocab), on OpenMP's threads, each with scratch of its own that s keeps */
void llm_sampler_sample_rows(llm_sampler *s, llm_sample_row *rows, int n_rows, const float *logits);

/* -----------------------------------------------------------------------------------------------------------
 * 9. Detokenizer: token ids back to text
 * -------------------------------------------------------------------------------------------------------- */
/* The raw bytes a token stands for (may be part of a UTF-8 character); control tokens give "" unless special.
 * Returns the byte count (which may exceed cap), -1 for an id outside the vocabulary. */
int  llm_tokenizer_piece(const llm_tokenizer *t, int32_t id, int special, char *buf, int cap);

/* Streaming: feed ids one at a time; only whole UTF-8 characters come out, the bytes of a character that is
 * not complete yet are held back, and bytes that can never form a valid character come out as U+FFFD. Start
 * from a zeroed llm_detok. A push writes at most 3 x (piece length + 3) bytes; given less room than its
 * output needs, it writes nothing, keeps its state and returns the room needed (> cap). */
typedef struct {
    unsigned char pending[8]; int n_pending;
    int special;                    /* 1: control tokens' text too (set before the first push) */
} llm_detok;
int  llm_detok_push(const llm_tokenizer *t, llm_detok *d, int32_t id, char *out, int cap); /* bytes written */
int  llm_detok_flush(llm_detok *d, char *out, int cap);  /* end of stream: what is held back, as U+FFFD */
/* A whole sequence of ids to text, as llama.cpp's llama_detokenize: bytes that are not UTF-8 as U+FFFD, and
 * the space SentencePiece put in front of the text removed. Returns the length (which may exceed cap: then
 * call again with more room; NUL-terminated when it fits). */
int  llm_detokenize(const llm_tokenizer *t, const int32_t *ids, int n, int special, char *out, int cap);

/* -----------------------------------------------------------------------------------------------------------
 * 10. Engine: requests in, tokens and text out, one step at a time
 *
 * Threads: llm_engine_add_request and llm_engine_abort may be called from any thread at any time (they take
 * the engine's lock and leave the request in an inbox, and wake llm_engine_wait); everything else belongs to
 * the one thread that drives the engine. A server runs wait and step in a loop on its own thread and hands
 * requests in from its connection threads; the outputs of a step stay valid until the next step.
 *
 * Errors in a step: when the backend fails (or memory runs out), every sequence that step was computing
 * finishes with LLM_FINISH_ERROR and the message in its output's error; their blocks go back to the pool.
 * Requests that were not in that step are untouched, and the engine goes on: a backend that cannot recover
 * (a GPU fault) fails each later step's sequences the same way, so every request still gets its one finish.
 * -------------------------------------------------------------------------------------------------------- */
/* the KV cache's values (llm_engine_config); q8_0 and q4_0: GGUF's blocks of 32 values and a scale */
enum llm_kv_dtype { LLM_KV_AUTO, LLM_KV_F16, LLM_KV_F32, LLM_KV_Q8_0, LLM_KV_Q4_0 };
enum llm_sched_policy { LLM_SCHED_FCFS, LLM_SCHED_PRIORITY }; /* who waits and who is preempted (the same) */
typedef struct {
    const char *model_path;         /* a GGUF file, or: */
    const char *dummy;              /* a dummy preset name (random weights, token ids only) */
    uint64_t dummy_seed;            /* the dummy's random weights: the same seed, the same model */
    /* NULL: the first backend that starts, of CUDA (when built in) and the CPU; or e.g.
     * llm_cpu_backend_create */
    llm_backend *(*create_backend)(const llm_model *m, char *err);
    int block_size;                 /* tokens per KV block: 16 */
    int num_blocks;                 /* the KV pool in blocks; 0: from kv_bytes */
    size_t kv_bytes;                /* the KV pool in bytes; 0: from kv_fraction */
    double kv_fraction;             /* the KV pool as a fraction of the backend's free memory (like vLLM's
                                     * gpu_memory_utilization); 0: the backend's default (llm_backend) */
    int max_num_seqs;               /* sequences in one step: 256 */
    int max_num_batched_tokens;     /* tokens in a step (the budget); 0: the backend's (CPU 2048, GPU 8192) */
    int max_model_len;              /* 0: the model's context length */
    int enable_prefix_caching;      /* 1 */
    int static_batching;            /* no one joins until the whole batch has finished (for comparison): 0 */
    int scheduling_policy;          /* enum llm_sched_policy (vLLM's --scheduling-policy): fcfs, first come
                                     * first served, the youngest preempted; priority: waiting requests by
                                     * (priority, arrival), and the one preempted is the lowest priority's
                                     * latest, wherever it is in the step's plan */
    int kv_cache_dtype;             /* enum llm_kv_dtype (vLLM's --kv-cache-dtype, llama.cpp's -ctk): auto,
                                     * the backend's: the CPU's f16 (as llama.cpp's; f32 on the exact path),
                                     * CUDA's bf16. f32 on the CPU: twice the memory, the logits 3 to 4 times
                                     * nearer the exact path's; q8_0 and q4_0 (CPU): 1.88 and 3.56 times the
                                     * blocks of f16 in the same bytes where head_dim is a multiple of 32 (a
                                     * head is padded to whole blocks of 32: head_dim 8 costs 4 times f16) */
    /* speculative decoding by n-gram lookup (vLLM's "ngram" method, prompt lookup): a decoding sequence whose
     * last spec_ngram_max..spec_ngram_min tokens occurred before in its prompt or output proposes the up to
     * spec_tokens tokens that followed there, and one step checks them all: the same tokens come out as
     * without it (the same distribution, when sampled), several a step where the text repeats */
    int spec_tokens;                /* vLLM's num_speculative_tokens, at most LLM_SPEC_MAX: 0, off */
    int spec_ngram_max, spec_ngram_min; /* prompt_lookup_max and _min: 4 and 2 */
    /* or the proposals come from a draft model (vLLM's draft_model method, llama.cpp's -md): a smaller GGUF
     * file with the model's vocabulary, on the same backend, proposes spec_tokens tokens by greedy decoding.
     * It computes every token the model computes, its K/V in the same blocks, so the prefix cache, the
     * copies and preemption serve both. NULL: n-gram lookup */
    const char *spec_model_path;
} llm_engine_config;

#define LLM_SPEC_MAX 16                /* the most tokens one proposal holds (spec_tokens) */

/* The values in the comments above; model_path (or dummy) is the caller's to set */
llm_engine_config llm_engine_defaults(void);

enum llm_finish { LLM_FINISH_NONE, LLM_FINISH_STOP, LLM_FINISH_LENGTH, LLM_FINISH_ABORT, LLM_FINISH_ERROR };
const char *llm_finish_reason_name(int reason);   /* "stop", "length", "abort", "error"; NULL for none */

/* What one sample of a request did in one step. Its pointers are the engine's, valid until the next
 * llm_engine_step (or llm_engine_destroy): copy what must live longer. */
typedef struct {
    uint64_t request_id;            /* what add_request returned */
    void *user;                     /* what add_request was given */
    int index;                      /* which of the request's n samples */
    const int32_t *token_ids;       /* new tokens this step (several with speculative decoding; a stop token
                                     * is among them though its text is not) */
    int n_tokens;
    const char *text;               /* new text this step (text that may begin a stop string is held back) */
    int text_len;                   /* in bytes; text is not NUL-terminated */
    const float *logprobs;          /* when asked: per new token, its log-probability */
    const int32_t *top_ids;         /* when logprobs = K > 0: per new token K alternatives ... */
    const float *top_logprobs;      /* ... and their log-probabilities */
    int n_top;                      /* K, the alternatives per token in top_ids and top_logprobs */
    int finish_reason;              /* LLM_FINISH_NONE while it runs */
    int stop_string;                /* finish "stop" by a stop string: 1 + its index in params.stop; 0: by a
                                     * stop token, a grammar's end, or another reason (Anthropic's
                                     * stop_sequence names it) */
    const char *error;              /* LLM_FINISH_ERROR: what went wrong */
    /* the usage: the prompt's tokens, those of them the prefix cache had at admission (not computed), and
     * the tokens generated so far by this sample */
    int n_prompt_tokens, n_cached_tokens, n_generated;
    /* prompt_logprobs >= 0: once, in sample 0's output of the step that computes the prompt's end (the one
     * with the first new token), row i - 1 for prompt token i = 1 .. n_prompt_tokens - 1: its log-probability
     * given tokens 0..i-1, its rank in the vocabulary (1: the most likely) and the K most likely tokens
     * there, from the same distribution as logprobs. Prompt token 0 has no row: nothing comes before it. */
    const float *prompt_logprobs;   /* [n_prompt_logprobs]; NULL in every other output */
    const int32_t *prompt_ranks;    /* [n_prompt_logprobs] */
    const int32_t *prompt_top_ids;  /* [n_prompt_logprobs][n_prompt_top] */
    const float *prompt_top_logprobs;
    int n_prompt_logprobs, n_prompt_top;
    /* pooling: the prompt's vector, pooled as asked but not normalised, in the finishing output (NULL in
     * every other) */
    const float *embedding;         /* [n_embedding], the model's dim */
    int n_embedding;
} llm_output;

typedef struct {
    const char *backend;            /* "cpu", "cuda" */
    const char *backend_kernels;    /* the CPU backend's SIMD kernels (llm_backend.kernels), or NULL */
    const char *backend_note;       /* why the backends before it did not start ("" when none was skipped) */
    int block_size, max_model_len;  /* as the engine runs: the config's, or what create chose */
    size_t kv_bytes_per_block;      /* K and V of one group of layers for one block, as the backend stores
                                     * them */
    int kv_groups;                  /* the groups of layers (1 but for windows): each holds its own blocks */
    int running, waiting;           /* sequences (samples) in each queue now */
    /* the KV pool: all its blocks, the free ones (cached ones among them: a prefix hit takes one back until
     * the block is handed out anew), and those the prefix cache names (held or free) */
    int num_blocks, num_free_blocks, num_cached_blocks;
    int64_t prefix_cache_queries, prefix_cache_hits;  /* in tokens */
    int64_t kv_tokens;              /* tokens whose K/V the running sequences hold */
    /* since create: sequences preempted, prompt tokens computed (not those from the cache, recomputed ones
     * again), tokens generated, steps whose forward pass succeeded, and samples finished (each of n) */
    int64_t preemptions, prompt_tokens_computed, generation_tokens, steps, requests_finished;
    /* structured output: tokens sampled under a grammar, how many of them took a full mask (the token sampled
     * first was refused: every token was checked, or the mask came from the cache), and the seconds the
     * grammar took (checks, masks, moving the states on) */
    int64_t grammar_tokens, grammar_masks, grammar_masks_cached;
    double grammar_seconds;
    /* speculative decoding (vLLM's spec_decode metrics): proposals checked, their tokens, those accepted, and
     * how many were accepted at each position of a proposal */
    int spec_tokens;                /* the most a proposal holds (0: speculative decoding is off) */
    int64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens, spec_accepted_at[LLM_SPEC_MAX];
    /* where a step's time goes: in the backend's forward calls and its sample steps (the rest is the host's:
     * scheduling, the rows it samples, text), the steps that computed prompt tokens (the others decode
     * only), and the rows of logits: all of them, and those the host read (llm_batch.host_rows: a
     * grammar's; the others only went to the sample step) */
    double forward_seconds, sample_seconds;
    int64_t prompt_steps, logit_rows, host_rows;
    double draft_seconds;           /* in the draft model's forward calls (spec_model_path) */
} llm_engine_stats;

typedef struct llm_engine llm_engine;

/* Loads the model, starts a backend and allocates the KV pool; NULL and why (config, file, memory). cfg is
 * copied; its strings need live only for the call. */
llm_engine *llm_engine_create(const llm_engine_config *cfg, char *err);
void llm_engine_destroy(llm_engine *e);         /* every request dropped without an output; NULL: nothing */
/* Returns the request id (> 0), or 0 with a message when the request can never run (prompt longer than the
 * context or the KV pool, bad parameters). Give text, or token ids (prompt_ids non-NULL). user comes back in
 * every output of the request. */
uint64_t llm_engine_add_request(llm_engine *e, const char *prompt, const int32_t *prompt_ids,
                                int n_prompt_ids, const llm_sampling_params *p, void *user, char *err);
void llm_engine_abort(llm_engine *e, uint64_t request_id);  /* every sample finishes with LLM_FINISH_ABORT */
/* One scheduler step, one forward call and one sample step. Returns the number of outputs: one per sample
 * that produced something or finished (with an error, too: see above). */
int  llm_engine_step(llm_engine *e, const llm_output **outputs);
/* Sleeps until there is work (requests waiting or running, or an add or abort from another thread) or
 * timeout_ms passes (-1: no limit). Returns 1 when there is work, 0 when there is none. */
int  llm_engine_wait(llm_engine *e, int timeout_ms);
int  llm_engine_has_work(llm_engine *e);                      /* llm_engine_wait(e, 0) */
llm_engine_stats llm_engine_get_stats(llm_engine *e); /* the counters now, by value (the engine's thread) */
const llm_model *llm_engine_model(const llm_engine *e); /* the model it runs: its config and tokenizer */
/* An embedding (llm_output.embedding) as clients take one: its first n values (Matryoshka truncation: n
 * below the model's dim where the model was trained for it) scaled to length 1, in place (all zero: left) */
void llm_embedding_normalize(float *v, int n);
/* A grammar parsed for requests to come (llm_sampling_params.grammar_parsed), through the engine's cache of
 * the last grammars it parsed; any thread. A reference: llm_grammar_free drops it. NULL and why when the
 * text is not GBNF. */
struct llm_grammar *llm_engine_parse_grammar(llm_engine *e, const char *gbnf, char *err);
/* Audits the block bookkeeping (for tests): every block's ref_count equals the number of block tables holding
 * it, free blocks are exactly those with ref_count 0, and the prefix-cache map names blocks that carry that
 * hash. 0 when consistent, else -1 and what is wrong. Call it between steps, from the engine's thread. */
int  llm_engine_check_blocks(llm_engine *e, char *err);

/* -----------------------------------------------------------------------------------------------------------
 * 11. JSON: the reader and the writer (a layer the core does not need: tools, schemas and
 *    the server read JSON with it)
 * -------------------------------------------------------------------------------------------------------- */
enum { LLM_JSON_NULL, LLM_JSON_FALSE, LLM_JSON_TRUE, LLM_JSON_NUMBER, LLM_JSON_STRING, LLM_JSON_ARRAY,
       LLM_JSON_OBJECT };
#define LLM_JSON_DEPTH 64           /* nesting of arrays and objects the reader takes */
typedef struct llm_json {
    int type;                       /* LLM_JSON_* */
    double num;
    char *str; size_t len;          /* strings: decoded, NUL-terminated (may hold \u0000: use len);
                                     * integers: their digits as written */
    struct llm_json *items;         /* array elements, object values */
    char **keys;                    /* objects: the key of each value, in the text's order */
    int n;
    int fraction;                   /* numbers: written with a fraction or an exponent (a float to Python) */
} llm_json;
/* RFC 8259 JSON only (valid UTF-8, its escapes, numbers that fit a double). 0, or -1 with where and why in
 * err (LLM_ERR_LEN bytes); *out is freed on failure. */
int llm_json_parse(const char *text, size_t len, llm_json *out, char *err);
void llm_json_free(llm_json *v);
llm_json *llm_json_get(const llm_json *obj, const char *key);  /* the last value of key; NULL: none */
/* A value as JSON text (malloc'ed; NULL when out of memory): compact, or (python = 1) byte for byte what
 * Python's json.dumps(value, ensure_ascii=False) writes, which is what chat templates' tojson writes
 * (python = N > 1: with indent=N) */
char *llm_json_dumps(const llm_json *v, int python);


/* -----------------------------------------------------------------------------------------------------------
 * 12. Grammar (a layer; LLM_NO_GRAMMAR leaves it out): the tokens that may come next, when the
 *    output must follow a grammar (structured output). A grammar is GBNF as llama.cpp writes
 *    it; JSON Schema, regular expressions and lists of choices are converted to GBNF text
 *    first. The engine's hook: llm_sampling_params.grammar, parsed by add_request.
 * -------------------------------------------------------------------------------------------------------- */
/* GBNF (llama.cpp's grammar format) to GBNF text, from the other ways of saying what the output must be. Each
 * returns malloc'ed text whose start rule is "root", or NULL with the reason in err (a schema keyword that
 * cannot be honoured is named with its path in the schema: nothing is dropped quietly). */
char *llm_json_schema_to_grammar(const llm_json *schema, char *err);
char *llm_regex_to_grammar(const char *regex, char *err);      /* the whole output matches the regex */
char *llm_choice_to_grammar(const char *const *choices, int n, char *err);  /* exactly one of them */

/* A grammar parsed into rules, shared by every sequence that follows it (the engine keeps the last few it
 * parsed, by text, so that requests that give the same grammar share its rules and its cache of masks). Its
 * rules are read-only once made; its masks' cache is not: masks of one grammar from one thread at a time. */
typedef struct llm_grammar llm_grammar;
llm_grammar *llm_grammar_parse(const char *gbnf, char *err);   /* start rule "root"; NULL with the reason */
void llm_grammar_free(llm_grammar *g);  /* drops a reference (parse gives one): the last one frees it */
/* Where a text is in the grammar: the positions it may go on from (a set of pushdown stacks), and the bytes
 * of a UTF-8 character that is not complete yet. */
typedef struct llm_grammar_state llm_grammar_state;
llm_grammar_state *llm_grammar_start(const llm_grammar *g);    /* at the start; NULL when out of memory */
llm_grammar_state *llm_grammar_state_copy(const llm_grammar_state *st);
void llm_grammar_state_free(llm_grammar_state *st);
int llm_grammar_accept(llm_grammar_state *st, const char *bytes, int n); /* 0, or -1 (then st is unchanged) */
int llm_grammar_can_end(const llm_grammar_state *st);  /* 1: the text so far is a whole sentence */
int llm_grammar_done(const llm_grammar_state *st);     /* 1: a whole sentence, and nothing may follow */
/* The token masks: the bytes of every token of a vocabulary in a trie, built once per tokenizer. */
typedef struct llm_token_trie llm_token_trie;
llm_token_trie *llm_token_trie_build(const llm_tokenizer *t, char *err);
void llm_token_trie_free(llm_token_trie *tt);
/* mask[i] (n_vocab bits, bit i of byte i / 8) = 1 when token i may come next from st: its bytes go on in the
 * grammar, or it ends generation (eog) and the text so far is whole. Returns how many may; -1 when out of
 * memory. */
int llm_grammar_mask(const llm_grammar_state *st, const llm_token_trie *tt, uint8_t *mask);
/* The same question for one token (the sampler's fast path: the sampled token checked first) */
int llm_grammar_allows(const llm_grammar_state *st, const llm_token_trie *tt, int32_t token);

/* -----------------------------------------------------------------------------------------------------------
 * 13. Tools (a layer): tool calls in each chat family's syntax. How a family writes tools
 *    into a prompt is this layer's too (the Chat section calls it); here, the grammar a
 *    reply follows to call tools, and a reply read back into thinking, answer and calls.
 * -------------------------------------------------------------------------------------------------------- */
/* Tool calls. The grammar a reply follows to call tools in the family's syntax, each call's arguments
 * following its function's "parameters" schema. choice: LLM_TOOL_AUTO, the model writes freely and a call
 * begins when it writes the family's marker (Hermes: <tool_call>; generic: the reply is either {"response":
 * text} or the calls); LLM_TOOL_REQUIRED, calls from the first token (after the thinking, when thinking);
 * LLM_TOOL_NAMED, one call of `name`. parallel: several calls may come, or one. GBNF text (malloc'ed), or
 * NULL with the reason in err (a tool that is not {"type": "function", "function": {"name", "parameters"}},
 * parameters the grammar engine cannot honour). */
enum { LLM_TOOL_AUTO, LLM_TOOL_REQUIRED, LLM_TOOL_NAMED };
char *llm_chat_tool_grammar(const llm_chat_template *ct, const char *tools, int choice, const char *name,
                            int parallel, char *err);
/* The grammar of a whole reply whose answer follows gbnf (a structured output's): for gpt-oss, its thinking
 * on the analysis channel, then the answer as the final channel's message; for the other families gbnf
 * itself. GBNF text (malloc'ed), or NULL with the reason in err. */
char *llm_chat_answer_grammar(const llm_chat_template *ct, const char *gbnf, char *err);
/* A reply read back: the thinking apart (think: for a family that thinks, from <think> to </think>, and from
 * the start when the generation prompt opened the block), the answer, and the calls (tools: in the family's
 * syntax). partial: the text so far of a reply still being written; what may yet be a marker is held back,
 * and so the fields of each partial reading begin the next ones (a stream sends the difference), the last
 * call's arguments may be cut (in_call). Strings are malloc'ed; -1 when out of memory. */
typedef struct {
    char *reasoning;                /* NULL: no thinking */
    char *content;                  /* "" for none */
    llm_chat_tool_call *calls;      /* name, arguments (the model's own JSON text); id NULL */
    int n_calls;
    int in_call;                    /* partial: the last call's arguments are not finished */
} llm_chat_reply;
int  llm_chat_parse_reply(const llm_chat_template *ct, const char *text, size_t len, int think, int tools,
                          int partial, llm_chat_reply *reply);
void llm_chat_reply_free(llm_chat_reply *reply);

/* -----------------------------------------------------------------------------------------------------------
 * 14. SIMD kernels (a layer; LLM_NO_SIMD leaves it out): AVX2 and AVX-512 versions of the CPU
 *    forward pass's kernels, compiled where the compiler was told the target (-march=native). Nothing
 *    here is public: the CPU backend (section 7) calls them where the build has them.
 * -------------------------------------------------------------------------------------------------------- */

#ifdef __cplusplus
}
#endif
#endif /* LLM_H */

/* ===========================================================================================================
 * Implementation
 * ======================================================================================================== */
#ifdef LLM_IMPLEMENTATION
#ifndef LLM_IMPLEMENTATION_DONE
#define LLM_IMPLEMENTATION_DONE

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/resource.h> /* the grammar thread's priority */
#if defined(__aarch64__)
#include <sys/auxv.h> /* getauxval: what the CPU has (llm_cpu_supports) */
#endif
#include <sys/syscall.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
/* The SIMD layer: x86 kernels beside the plain C, which stays the reference they are tested against. They
 * are compiled where the compiler was told the target (-march=native), and never with LLM_NO_SIMD: the
 * macros below choose the kernels; at run time the CPU backend only checks that the CPU has what the build
 * was told of (llm_cpu_missing_feature, section 7), or in make llm-dist's program picks the copy of this
 * file, compiled for a variant of CPU, that it has (llm_cpu_variant). */
#if !defined(LLM_NO_SIMD) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LLM_AVX2 1
#include <immintrin.h>
#ifdef __AVX512F__
#define LLM_AVX512F 1
#endif
#ifdef __AVX512VL__
#define LLM_AVX512VL 1
#endif
#ifdef __AVX512BW__
#define LLM_AVX512BW 1
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LLM_AVX512VNNI 1
#endif
/* AMX (Sapphire Rapids on): one instruction multiplies a tile of 16 x 64 bytes by one of 64 x 16, what a
 * prefill's packed products use where the CPU has it and Linux lets the process use it (llm_amx_usable) */
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__) && defined(LLM_AVX512VNNI) && \
    defined(__AVX512BW__)
#define LLM_AMX 1
#include <cpuid.h>
#endif
#endif
/* 64-bit ARM converts half floats in one instruction (fcvt, through the compiler's __fp16), which the
 * compiler also vectorizes in the loops over rows of them (fcvtl); with the dot product instructions
 * (armv8.2-a+dotprod: Graviton 2 on, Apple M1 on) the fast path's quantized types have NEON kernels */
#if !defined(LLM_NO_SIMD) && defined(__aarch64__)
#define LLM_ARM64 1
#ifdef __ARM_FEATURE_DOTPROD
#define LLM_NEON_DOT 1
#endif
#endif
#ifndef LLM_NO_STB_DS_IMPLEMENTATION
#define STB_DS_IMPLEMENTATION
#endif
#include <stb/stb_ds.h>

/* ---- Preamble: helpers every section uses -------------------------------------------------------------- */
static int llm_fail(char *err, const char *fmt, ...) {
    if (err) { va_list ap; va_start(ap, fmt); vsnprintf(err, LLM_ERR_LEN, fmt, ap); va_end(ap); }
    return -1;
}

static int llm_str_eq(llm_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

/* Half-precision floats, as GGUF stores f16 and bf16 weights and scales. */
static float llm_f16_to_f32(uint16_t h) {
#if defined(LLM_AVX2)
    return _cvtsh_ss(h); /* the same value, in one instruction */
#elif defined(LLM_ARM64)
    __fp16 v;
    memcpy(&v, &h, 2);
    return (float)v;
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) bits = sign;
        else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) bits = sign | 0x7f800000 | (mant << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    float f; memcpy(&f, &bits, 4); return f;
#endif
}

static float llm_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f; memcpy(&f, &bits, 4); return f;
}
static float llm_half_to_f32(uint32_t type, uint16_t h) {
    return type == LLM_F16 ? llm_f16_to_f32(h) : llm_bf16_to_f32(h);
}
static uint16_t llm_f32_to_f16(float f) { /* round to nearest even */
#if defined(LLM_AVX2)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); /* the same bits, in one instruction */
#elif defined(LLM_ARM64)
    __fp16 v = (__fp16)f; /* fcvt: to nearest even, the default rounding */
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
#else
    uint32_t x; memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, mant = x & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 | mant >> 13 : 0)); /* as F16C's */
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) { /* subnormal or zero */
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e), half = mant >> shift, rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into the exponent: still right */
    return (uint16_t)half;
#endif
}

/* splitmix64: the random numbers of dummy weights and of sampling, and the mixing step of block hashes */
static uint64_t llm_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float llm_rand_uniform(uint64_t *state) { /* [0, 1), 24 bits */
    return (float)(llm_splitmix64(state) >> 40) * (1.0f / 16777216.0f);
}

static int llm_hex_digit(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static double llm_now(void) { /* seconds, monotonic */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The largest of x[0..n) (n > 0), as a scan that keeps the best so far by > finds it (a NaN is never
 * better; x[0] NaN stays), and *finite: whether every value is finite. 16 lanes side by side, which the
 * compiler turns into vector instructions: the scan waits on each comparison (a SmolLM2 row of 49,152 took
 * 146 us, 8% of a batched decode step). x - x is 0 for a finite value, NaN for the others, and a NaN stays in
 * a sum. */
static float llm_row_max(const float *x, int n, int *finite) {
    float m[16], nan_sum[16], mx = x[0], sum = 0;
    int i = 0;
    for (int j = 0; j < 16; j++) { m[j] = x[0]; nan_sum[j] = 0; }
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) {
            float v = x[i + j];
            m[j] = v > m[j] ? v : m[j];
            nan_sum[j] += v - v;
        }
    for (; i < n; i++) { mx = x[i] > mx ? x[i] : mx; sum += x[i] - x[i]; }
    for (int j = 0; j < 16; j++) { mx = m[j] > mx ? m[j] : mx; sum += nan_sum[j]; }
    *finite = sum == 0;
    return mx;
}

/* The first of the largest values (0 when x[0] is NaN); with finite_only, -1 when a value is not finite (a
 * greedy row's pick as the sample step makes it) */
static int llm_row_argmax(const float *x, int n, int finite_only) {
    int finite, i = 0;
    float mx = llm_row_max(x, n, &finite);
    if (finite_only && !finite) return -1;
    if (isnan(mx)) return 0;
    while (x[i] != mx) i++;
    return i;
}
static int llm_argmax(const float *x, int n) { return llm_row_argmax(x, n, 0); }
static int32_t llm_argmax_finite(const float *x, int n) { return llm_row_argmax(x, n, 1); }

/* ===========================================================================================================
 * 1. GGUF
 * A GGUF file is a header, key/value metadata, a table of tensor infos, then the aligned tensor data. We map
 * the file and keep pointers into it; every read goes through llm_rd, which refuses to step past the end.
 *
 * The layout (little-endian throughout; a string is a u64 byte count and that many bytes, no NUL):
 *
 *   "GGUF" | u32 version (2 or 3) | u64 n_tensors | u64 n_kv
 *   n_kv times:      string key | u32 value type | value
 *                    (a scalar: its 1-8 bytes; a string; an array: u32 element type, u64 count, elements)
 *   n_tensors times: string name | u32 n_dims | u64 ne[n_dims] | u32 dtype | u64 offset
 *   padding to a multiple of general.alignment (32 when the key is absent)
 *   the data section: tensor i's bytes at data_start + offset_i, each offset a multiple of the alignment
 *
 * Nothing is copied out: llm_gguf_open maps the file read-only, and each key, string and tensor is a
 * pointer into the mapping (llm_str is not NUL-terminated). The weights are then the kernel's page cache:
 * opening a file of gigabytes reads only its metadata and tensor table, pages come in on first touch, and
 * processes that serve the same file share them. The mapping must outlive everything that points into it:
 * the model, the tokenizer, the weights (llm_model_free closes it last). llama.cpp's gguf.cpp reads the
 * header with fread and copies each value into its own vectors; it also refuses duplicate keys and tensor
 * names, where here the first of a name wins (llm_gguf_find, llm_gguf_tensor_find).
 *
 * The file is untrusted input: every count is checked against the bytes left before anything is allocated
 * by it, every shape against overflow, every tensor against the end of the file; an error returns -1 and
 * says what is wrong (naming the key or tensor where there is one), and nothing reads past the mapping.
 *
 * Tensors: ne[0] is the innermost dimension, the values of one row, stored contiguously; a PyTorch weight of
 * shape (out, in) is ne = {in, out}, so row r holds output r's weights and a matrix-vector product reads
 * whole rows. A quantized row is a run of blocks (32 or 256 values each, llm_dtype_info), so row r starts at
 * r * llm_dtype_row_bytes(type, ne[0]). The block layouts and their exact dequantization follow below.
 *
 * Read first: llm_gguf_parse (the layout above, step by step), then llm_gguf_int and llm_gguf_string (how
 * section 2 reads the config), then llm_qblock_read_scales and llm_dequant_blocks (what a weight's bytes
 * mean).
 * ======================================================================================================== */
/* A bounded cursor over the file's bytes. Once a read fails, failed stays set and every later read returns
 * nothing, so a parser can chain several reads and test r->failed once; err has the first failure's
 * message. */
typedef struct { const uint8_t *p, *end; char *err; int failed; } llm_rd;

static const uint8_t *llm_rd_take(llm_rd *r, uint64_t n, const char *what) {
    if (r->failed) return NULL;
    if (n > (uint64_t)(r->end - r->p)) {
        llm_fail(r->err, "GGUF file truncated: %s runs past the end of the file", what);
        r->failed = 1; return NULL;
    }
    const uint8_t *p = r->p; r->p += n; return p;
}
static uint32_t llm_rd_u32(llm_rd *r, const char *what) {
    const uint8_t *p = llm_rd_take(r, 4, what); uint32_t v = 0;
    if (p) memcpy(&v, p, 4);
    return v;
}
static uint64_t llm_rd_u64(llm_rd *r, const char *what) {
    const uint8_t *p = llm_rd_take(r, 8, what); uint64_t v = 0;
    if (p) memcpy(&v, p, 8);
    return v;
}
/* A string: its u64 byte count, then the bytes; the result points into the file ({NULL, 0} on failure). */
static llm_str llm_rd_str(llm_rd *r, const char *what) {
    llm_str s = {0, 0}; uint64_t n = llm_rd_u64(r, what);
    const uint8_t *p = llm_rd_take(r, n, what);
    if (p) { s.ptr = (const char *)p; s.len = n; }
    return s;
}

/* Bytes of one metadata value, by enum llm_gguf_type; 0 for a string and an array, whose sizes are in the
 * data (a bool takes one byte). */
static const uint64_t llm_gguf_type_size[LLM_GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* Bytes per block and values per block of each tensor type; 0 for a type we cannot compute with.
 * A block is the unit a quantized type is stored in: block_values values share their scales, packed in
 * block_bytes bytes (q4_0: a f16 scale and 32 4-bit values, 2 + 16 = 18 bytes, 4.5 bits a value). A row of
 * a tensor is a whole number of blocks, which llm_gguf_parse_tensor checks. */
static int llm_dtype_info(uint32_t type, uint64_t *block_bytes, uint64_t *block_values) {
    switch (type) {
    case LLM_F32:  *block_bytes = 4;   *block_values = 1;   return 1;
    case LLM_F16:  *block_bytes = 2;   *block_values = 1;   return 1;
    case LLM_BF16: *block_bytes = 2;   *block_values = 1;   return 1;
    case LLM_Q8_0: *block_bytes = 34;  *block_values = 32;  return 1;
    case LLM_Q4_0: *block_bytes = 18;  *block_values = 32;  return 1;
    case LLM_Q4_1: *block_bytes = 20;  *block_values = 32;  return 1;
    case LLM_Q5_0: *block_bytes = 22;  *block_values = 32;  return 1;
    case LLM_Q5_1: *block_bytes = 24;  *block_values = 32;  return 1;
    case LLM_Q2_K: *block_bytes = 84;  *block_values = 256; return 1;
    case LLM_Q3_K: *block_bytes = 110; *block_values = 256; return 1;
    case LLM_Q4_K: *block_bytes = 144; *block_values = 256; return 1;
    case LLM_Q5_K: *block_bytes = 176; *block_values = 256; return 1;
    case LLM_Q6_K: *block_bytes = 210; *block_values = 256; return 1;
    case LLM_MXFP4: *block_bytes = 17; *block_values = 32; return 1;
    default: return 0;
    }
}

const char *llm_dtype_name(uint32_t type) {
    switch (type) {
    case LLM_F32: return "f32";   case LLM_F16: return "f16";   case LLM_BF16: return "bf16";
    case LLM_Q8_0: return "q8_0"; case LLM_Q4_0: return "q4_0"; case LLM_Q4_1: return "q4_1";
    case LLM_Q5_0: return "q5_0"; case LLM_Q5_1: return "q5_1"; case LLM_Q2_K: return "q2_K";
    case LLM_Q3_K: return "q3_K"; case LLM_Q4_K: return "q4_K"; case LLM_Q5_K: return "q5_K";
    case LLM_Q6_K: return "q6_K"; case LLM_MXFP4: return "mxfp4";
    default: return "unknown";
    }
}

/* The metadata: each value stays in the file; arrays of strings get an index of their elements.
 * Reads one key/value pair at r and leaves r after it. A scalar or string is only stepped over (kv->data
 * points at it); a numeric array is stepped over as count * element size; an array of strings (a
 * tokenizer's vocabulary, tokenizer.ggml.tokens: tens of thousands of strings) must be walked, as its
 * elements have their own lengths, so their llm_str are indexed once here in kv->strs (malloc'd, freed by
 * llm_gguf_close, also on error). An array's count is checked against the bytes left before it sizes that
 * index: a 40-byte file cannot make us allocate 2^64 entries. Arrays of arrays are refused. */
static int llm_gguf_parse_kv(llm_gguf_kv *kv, llm_rd *r, char *err) {
    /* 1. the key and the value's type */
    kv->key = llm_rd_str(r, "metadata key");
    kv->type = llm_rd_u32(r, "metadata type");
    if (r->failed) return -1;
    int klen = (int)kv->key.len;
    if (kv->type >= LLM_GGUF_NTYPES)
        return llm_fail(err, "corrupt GGUF metadata: key '%.*s' has unknown value type %u", klen, kv->key.ptr,
                        kv->type);
    /* 2. a string or a scalar: step over it */
    kv->data = r->p;
    if (kv->type == LLM_GGUF_STRING) { llm_rd_str(r, "metadata string"); return r->failed ? -1 : 0; }
    if (kv->type != LLM_GGUF_ARRAY) {
        llm_rd_take(r, llm_gguf_type_size[kv->type], "metadata value");
        return r->failed ? -1 : 0;
    }
    /* 3. an array: its element type and count, the count bounded by the bytes left, then its elements */
    kv->arr_type = llm_rd_u32(r, "metadata array");
    kv->arr_len = llm_rd_u64(r, "metadata array");
    if (r->failed) return -1;
    if (kv->arr_type >= LLM_GGUF_NTYPES || kv->arr_type == LLM_GGUF_ARRAY)
        return llm_fail(err, "corrupt GGUF metadata: array '%.*s' has unsupported element type %u", klen,
                        kv->key.ptr, kv->arr_type);
    kv->data = r->p;
    /* a string takes 8 bytes at least: a count beyond what is left is corrupt (and would not fit in
     * memory) */
    uint64_t min_size = kv->arr_type == LLM_GGUF_STRING ? 8 : llm_gguf_type_size[kv->arr_type];
    if (kv->arr_len > (uint64_t)(r->end - r->p) / min_size)
        return llm_fail(err, "GGUF file truncated: array '%.*s' runs past the end of the file", klen,
                        kv->key.ptr);
    if (kv->arr_type != LLM_GGUF_STRING) {
        llm_rd_take(r, kv->arr_len * min_size, "metadata array");
        return r->failed ? -1 : 0;
    }
    kv->strs = (llm_str *)malloc((kv->arr_len ? kv->arr_len : 1) * sizeof(llm_str));
    if (!kv->strs) return llm_fail(err, "out of memory indexing '%.*s'", klen, kv->key.ptr);
    for (uint64_t j = 0; j < kv->arr_len && !r->failed; j++)
        kv->strs[j] = llm_rd_str(r, "metadata string array");
    return r->failed ? -1 : 0;
}

/* A tensor info: name, shape, type, offset. The size follows from the shape and the type's blocks.
 * Unused dimensions are 1, so ne[0] * ne[1] * ne[2] * ne[3] is always the count of values. The bounds (each
 * dimension 1 to 2^40, the product at most 2^50) keep the count, and the bytes computed from it, free of
 * overflow before the data pointer is checked against the file (in llm_gguf_parse, once the data section's
 * start is known). */
static int llm_gguf_parse_tensor(llm_gguf_tensor *t, llm_rd *r, char *err) {
    /* 1. the name and the shape, unused dimensions set to 1 */
    t->name = llm_rd_str(r, "tensor info");
    t->n_dims = llm_rd_u32(r, "tensor info");
    if (r->failed) return -1;
    int nlen = (int)t->name.len;
    if (t->n_dims == 0 || t->n_dims > 4)
        return llm_fail(err, "corrupt tensor '%.*s': %u dimensions", nlen, t->name.ptr, t->n_dims);
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) t->ne[d] = llm_rd_u64(r, "tensor info");
    /* 2. the type, which must be one we compute with, and the offset */
    t->type = llm_rd_u32(r, "tensor info");
    t->offset = llm_rd_u64(r, "tensor info");
    if (r->failed) return -1;
    uint64_t bb, bv;
    if (!llm_dtype_info(t->type, &bb, &bv))
        return llm_fail(err, "tensor '%.*s' has unknown or unsupported tensor type %u", nlen, t->name.ptr,
                        t->type);
    /* 3. the count of values, bounded as it is multiplied up, then the bytes: whole blocks per row */
    uint64_t n = 1;
    for (int d = 0; d < 4; d++) {
        if (t->ne[d] == 0 || t->ne[d] > ((uint64_t)1 << 40) || n > ((uint64_t)1 << 50) / t->ne[d])
            return llm_fail(err, "corrupt tensor '%.*s': bad dimensions", nlen, t->name.ptr);
        n *= t->ne[d];
    }
    if (t->ne[0] % bv)
        return llm_fail(err, "corrupt tensor '%.*s': row of %llu values is not a whole number of %s blocks",
                        nlen, t->name.ptr, (unsigned long long)t->ne[0], llm_dtype_name(t->type));
    t->nbytes = n / bv * bb;
    return 0;
}

/* Parses a whole GGUF image in memory (the mapped file, or bytes a test or fuzzer made): the steps follow the
 * layout in the section's opener. data is not copied and must outlive g. On success g's tensors have their
 * data pointers, each checked to lie inside [data, data + size); on error the message is in err, -1 is
 * returned and g holds nothing to free (whatever was allocated is freed). */
int llm_gguf_parse(llm_gguf *g, const void *data, uint64_t size, char *err) {
    memset(g, 0, sizeof *g);
    g->base = (const uint8_t *)data; g->size = size; g->alignment = 32;
    llm_rd r = {g->base, g->base + size, err, 0};
    /* 1. the header: magic, version, the two counts */
    const uint8_t *magic = llm_rd_take(&r, 4, "header");
    if (!magic) return -1;
    if (memcmp(magic, "GGUF", 4) != 0) return llm_fail(err, "not a GGUF file: bad magic (expected \"GGUF\")");
    g->version = llm_rd_u32(&r, "header");
    if (!r.failed && g->version != 2 && g->version != 3)
        return llm_fail(err, "unsupported GGUF version %u (supported: 2, 3)", g->version);
    uint64_t n_tensors = llm_rd_u64(&r, "header"), n_kv = llm_rd_u64(&r, "header");
    if (r.failed) return -1;
    /* each kv takes at least 12 bytes and each tensor info at least 24: a count beyond that is corrupt */
    if (n_kv > size / 12 || n_tensors > size / 24)
        return llm_fail(err, "GGUF file truncated or corrupt: its header counts %llu tensors and %llu "
                        "metadata keys, more than a %llu-byte file holds", (unsigned long long)n_tensors,
                        (unsigned long long)n_kv, (unsigned long long)size);
    /* the tables, zeroed: a half-parsed g (strs NULL past the failing entry) is safe for llm_gguf_close */
    g->n_kv = (int64_t)n_kv; g->n_tensors = (int64_t)n_tensors;
    g->kv = (llm_gguf_kv *)calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = (llm_gguf_tensor *)calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        llm_gguf_close(g);
        return llm_fail(err, "out of memory reading GGUF header");
    }

    /* 2. the metadata; general.alignment, if any, sets where the data section starts */
    for (uint64_t i = 0; i < n_kv; i++)
        if (llm_gguf_parse_kv(&g->kv[i], &r, err) != 0) { llm_gguf_close(g); return -1; }
    if (llm_gguf_find(g, "general.alignment")) {
        int64_t a = llm_gguf_int(g, "general.alignment", 32);
        if (a <= 0 || (a & (a - 1))) {
            llm_gguf_close(g);
            return llm_fail(err, "corrupt GGUF metadata: general.alignment %lld is not a power of two",
                            (long long)a);
        }
        g->alignment = (uint64_t)a;
    }
    /* 3. the tensor infos: names, shapes, types, offsets relative to the data section */
    for (uint64_t i = 0; i < n_tensors; i++)
        if (llm_gguf_parse_tensor(&g->tensors[i], &r, err) != 0) { llm_gguf_close(g); return -1; }

    /* 4. the data section starts at the next multiple of the alignment; each tensor must lie inside the file
     * (the comparisons are arranged so that none of them can overflow) */
    uint64_t data_start = (uint64_t)(r.p - g->base);
    data_start = (data_start + g->alignment - 1) / g->alignment * g->alignment;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        llm_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment || t->offset > size || data_start > size - t->offset ||
            t->nbytes > size - data_start - t->offset) {
            llm_fail(err, "tensor '%.*s' points past the end of the file (offset %llu, %llu bytes, file %llu "
                     "bytes)", (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
                     (unsigned long long)t->nbytes, (unsigned long long)size);
            llm_gguf_close(g);
            return -1;
        }
        t->data = g->base + data_start + t->offset;
    }
    return 0;
}

/* Maps the file and parses it. MAP_PRIVATE and PROT_READ: the weights are never written, and pages are read
 * from disk on first touch, so a model larger than free memory still opens (and runs, slowly). The file
 * descriptor is closed at once: the mapping keeps the file. A file under 4 bytes is refused before mmap
 * (it cannot hold the magic, and mmap cannot map 0 bytes); the mapping is undone if parsing fails. */
int llm_gguf_open(llm_gguf *g, const char *path, char *err) {
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return llm_fail(err, "cannot open model file '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return llm_fail(err, "'%s' is not a regular file", path);
    }
    if (st.st_size < 4) {
        close(fd);
        return llm_fail(err, "GGUF file truncated: '%s' has %lld bytes", path, (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return llm_fail(err, "cannot map '%s': %s", path, strerror(errno));
    if (llm_gguf_parse(g, map, (uint64_t)st.st_size, err) != 0) {
        munmap(map, (size_t)st.st_size);
        return -1;
    }
    g->mapped = 1;
    return 0;
}

/* Frees what parsing allocated (the tables, the string indexes) and unmaps a mapped file. It zeroes g, so a
 * zeroed or already closed g is safe to close again. */
void llm_gguf_close(llm_gguf *g) {
    if (g->kv) for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].strs);
    free(g->kv); free(g->tensors);
    if (g->mapped) munmap((void *)g->base, g->size);
    memset(g, 0, sizeof *g);
}

/* Lookups by name are linear scans: a model has a few dozen keys and a few hundred tensors, each looked up
 * once at load, so an index would cost more than it saves. */
const llm_gguf_kv *llm_gguf_find(const llm_gguf *g, const char *key) {
    for (int64_t i = 0; i < g->n_kv; i++) if (llm_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const llm_gguf_tensor *llm_gguf_tensor_find(const llm_gguf *g, const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (llm_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

/* One value of a numeric type, as an integer and as a double. 0 for strings and arrays.
 * The bytes are copied into a union first: a value in the file has no alignment (it follows a string of any
 * length), and reading it through a cast pointer would be undefined behaviour. Any numeric type reads as
 * either result, so callers need not care which width a converter chose for a key. */
static int llm_gguf_scalar(uint32_t type, const uint8_t *p, int64_t *iv, double *fv) {
    union {
        uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f32;
        uint64_t u64; int64_t i64; double f64;
    } v;
    *iv = 0; *fv = 0;
    if (type >= LLM_GGUF_NTYPES || !llm_gguf_type_size[type]) return 0;
    memcpy(&v, p, llm_gguf_type_size[type]);
    switch (type) {
    case LLM_GGUF_U8: case LLM_GGUF_BOOL: *iv = v.u8; break;
    case LLM_GGUF_I8: *iv = v.i8; break;
    case LLM_GGUF_U16: *iv = v.u16; break;
    case LLM_GGUF_I16: *iv = v.i16; break;
    case LLM_GGUF_U32: *iv = v.u32; break;
    case LLM_GGUF_I32: *iv = v.i32; break;
    case LLM_GGUF_U64: *iv = (int64_t)v.u64; break;
    case LLM_GGUF_I64: *iv = v.i64; break;
    case LLM_GGUF_F32: case LLM_GGUF_F64: /* as an integer only when it is one that fits (NaN does not) */
        *fv = type == LLM_GGUF_F32 ? v.f32 : v.f64;
        *iv = *fv >= -9.2e18 && *fv <= 9.2e18 ? (int64_t)*fv : 0;
        return 1;
    }
    *fv = (double)*iv;
    return 1;
}

/* The typed getters: fallback (or an empty string) when the key is absent or not of a fitting kind. */
int64_t llm_gguf_int(const llm_gguf *g, const char *key, int64_t fallback) {
    const llm_gguf_kv *kv = llm_gguf_find(g, key); int64_t iv; double fv;
    return kv && llm_gguf_scalar(kv->type, kv->data, &iv, &fv) ? iv : fallback;
}
double llm_gguf_float(const llm_gguf *g, const char *key, double fallback) {
    const llm_gguf_kv *kv = llm_gguf_find(g, key); int64_t iv; double fv;
    return kv && llm_gguf_scalar(kv->type, kv->data, &iv, &fv) ? fv : fallback;
}
llm_str llm_gguf_string(const llm_gguf *g, const char *key) {
    const llm_gguf_kv *kv = llm_gguf_find(g, key); llm_str s = {NULL, 0};
    if (kv && kv->type == LLM_GGUF_STRING) { /* data points at the string's u64 length, then its bytes */
        uint64_t n; memcpy(&n, kv->data, 8);
        s.ptr = (const char *)kv->data + 8; s.len = n;
    }
    return s;
}
/* Element i of a numeric array, as an integer and as a double (0 past the end, or for strings). */
static void llm_gguf_arr_at(const llm_gguf_kv *kv, uint64_t i, int64_t *iv, double *fv) {
    *iv = 0; *fv = 0;
    if (i < kv->arr_len) llm_gguf_scalar(kv->arr_type, kv->data + i * llm_gguf_type_size[kv->arr_type], iv,
                                         fv);
}
/* The exported forms, which the tokenizer reads its token types and scores with */
int64_t llm_gguf_arr_int(const llm_gguf_kv *kv, uint64_t i) {
    int64_t iv; double fv;
    llm_gguf_arr_at(kv, i, &iv, &fv);
    return iv;
}
double llm_gguf_arr_float(const llm_gguf_kv *kv, uint64_t i) {
    int64_t iv; double fv;
    llm_gguf_arr_at(kv, i, &iv, &fv);
    return fv;
}

/* ---- Tensor data: quantized blocks, and a row of a weight as f32 ------------------------------------- */
/* The bytes of a row of n values: n / block_values blocks; 0 when n is not a whole number of blocks or the
 * type is unknown, which callers treat as "cannot compute with this tensor" (llm_model_weight). */
size_t llm_dtype_row_bytes(uint32_t type, int64_t n) {
    uint64_t bb, bv;
    if (!llm_dtype_info(type, &bb, &bv) || n % (int64_t)bv) return 0;
    return (size_t)(n / bv * bb);
}

/* A f16 at any byte offset (a block's fields are not aligned: q4_0's blocks are 18 bytes apart) */
static float llm_f16_at(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return llm_f16_to_f32(h); }

/* The block layouts, from the GGUF/ggml specification. 32-value blocks: a f16 scale d (and a f16 minimum m
 * for the _1 types), then 4-bit values, value j in the low nibble of byte j and value j + 16 in the high
 * one, q5's fifth bits in a 32-bit word (bit j for value j); q8_0 is d and 32 int8. The k-quants are
 * "super-blocks" of 256 values whose sub-blocks of 16 or 32 values have their own small integer scales
 * (and minimums), which a f16 d (and dmin) scale in turn:
 *   q2_K  84 bytes: 16 bytes of 4-bit scale | 4-bit min, 64 bytes of 2-bit values, d, dmin
 *   q3_K 110 bytes: 32 bytes of high bits, 64 bytes of 2-bit low bits, 12 bytes of 6-bit scales, d
 *   q4_K 144 bytes: d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes of nibbles
 *   q5_K 176 bytes: as q4_K, with 32 bytes of fifth bits before the nibbles
 *   q6_K 210 bytes: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales, d
 * The 2-bit fields run across 32 bytes: value i of a 128-value half is bits 2 * (i / 32) of byte i % 32.
 * mxfp4 (OCP microscaling, gpt-oss's experts) is 17 bytes for 32 values: an exponent e (E8M0: the scale is a
 * power of two, 2^(e - 127)), then 16 bytes of 4-bit E2M1 codes laid out as q4_0's, each an index into the
 * values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; doubled, those are integers, and the scale
 * halved. */
static const int8_t llm_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static float llm_e8m0_half(uint8_t e) { /* 2^(e - 128), denormal below e = 2, as ggml_e8m0_to_fp32_half */
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* A block's scales, into the one form of llm_qblock: value i = (d * scale[s]) * q[i] - dmin * min[s]. The
 * byte offsets are those of the layouts above (q2_K: 16 bytes of scales, 64 of values, then d at 80 and
 * dmin at 82). How each type fits that form:
 *   q4_0, q5_0, q8_0, mxfp4: one sub-block of 32, scale 1, no minimum; mxfp4's d is its power of two
 *   q4_1, q5_1: d, and the minimum m as dmin with min = -1, so the subtraction adds m
 *   q2_K: 16 sub-blocks of 16, a 4-bit scale and a 4-bit min each, scaled by d and dmin
 *   q3_K: 16 sub-blocks of 16, 6-bit scales stored with 32 added (so signed, -32 to 31), no minimum
 *   q4_K, q5_K: 8 sub-blocks of 32, 6-bit scales and mins in 12 bytes:
 *       bytes 0-3: scale[0..3] in bits 0-5       bytes 4-7: min[0..3] in bits 0-5
 *       bytes 8-11: scale[4..7] low 4 bits | min[4..7] low 4 bits << 4; their top 2 bits in bits 6-7 of
 *       bytes 0-3 (scales) and 4-7 (mins)
 *   q6_K: 16 sub-blocks of 16, int8 scales, no minimum
 * offset is the bias the stored values carry, subtracted from q by llm_qblock_read. */
static inline __attribute__((always_inline)) void llm_qblock_read_scales(uint32_t type, const uint8_t *p,
                                                                        llm_qblock *b) {
    const uint8_t *sc;
    b->n = 32; b->sub = 32; b->offset = 0; b->d = llm_f16_at(p); b->dmin = 0;
    b->scale[0] = 1; b->min[0] = 0; /* a 32-value block's one sub-block; the k-quants set all theirs */
    switch (type) {
    case LLM_Q4_0: b->offset = 8; break;
    case LLM_Q5_0: b->offset = 16; break;
    case LLM_Q4_1: case LLM_Q5_1: b->dmin = llm_f16_at(p + 2); b->min[0] = -1; break; /* q * d + m */
    case LLM_Q2_K:
        b->n = 256; b->sub = 16; b->d = llm_f16_at(p + 80); b->dmin = llm_f16_at(p + 82);
        for (int s = 0; s < 16; s++) { b->scale[s] = p[s] & 15; b->min[s] = p[s] >> 4; }
        break;
    case LLM_Q3_K: /* 16 6-bit scales: low 4 bits in bytes 0-7 (two each), high 2 bits in bytes 8-11 */
        b->n = 256; b->sub = 16; b->offset = 4; b->d = llm_f16_at(p + 108); sc = p + 96;
        for (int s = 0; s < 16; s++) {
            int low = (s < 8 ? sc[s] : sc[s - 8] >> 4) & 15, high = sc[8 + s % 4] >> (2 * (s / 4)) & 3;
            b->scale[s] = (int16_t)((low | high << 4) - 32);
            b->min[s] = 0;
        }
        break;
    case LLM_Q4_K: case LLM_Q5_K: /* 8 6-bit scales and mins: the last four split over the spare bits */
        b->n = 256; b->dmin = llm_f16_at(p + 2); sc = p + 4;
        for (int s = 0; s < 4; s++) {
            b->scale[s] = sc[s] & 63; b->min[s] = sc[s + 4] & 63;
            b->scale[s + 4] = (int16_t)((sc[s + 8] & 15) | (sc[s] >> 6) << 4);
            b->min[s + 4] = (int16_t)((sc[s + 8] >> 4) | (sc[s + 4] >> 6) << 4);
        }
        break;
    case LLM_Q6_K:
        b->n = 256; b->sub = 16; b->offset = 32; b->d = llm_f16_at(p + 208);
        for (int s = 0; s < 16; s++) { b->scale[s] = (int8_t)p[192 + s]; b->min[s] = 0; }
        break;
    case LLM_MXFP4: b->d = llm_e8m0_half(p[0]); break;
    }
}

/* The values of a block, type by type, in loops over the layout's own runs (which the compiler vectorizes)
 * On return b->q[0 .. b->n) holds the block's integer values in their natural order, the offset taken out
 * (q4_0: -8 to 7; q6_K: -32 to 31; mxfp4: twice the E2M1 value), ready for llm_dequant_blocks or an integer
 * dot product. The bit fields are gathered so that each inner loop reads a run of consecutive bytes: one
 * byte of a 2-bit field holds values l, l + 32, l + 64, l + 96 of a 128-value half, one byte of nibbles
 * values l and l + 16 (32-value blocks), l and l + 32 (q4_K, q5_K) or l and l + 64 (q6_K). */
static inline __attribute__((always_inline)) void llm_qblock_read(uint32_t type, const uint8_t *p,
                                                                 llm_qblock *b) {
    llm_qblock_read_scales(type, p, b);
    int8_t *q = b->q;
    uint32_t qh;
    switch (type) {
    case LLM_Q8_0: for (int j = 0; j < 32; j++) q[j] = (int8_t)p[2 + j]; break;
    case LLM_Q4_0: case LLM_Q4_1: { /* value j in the low nibble of byte j, value j + 16 in the high one */
        const uint8_t *qs = p + (type == LLM_Q4_0 ? 2 : 4);
        for (int j = 0; j < 16; j++) q[j] = (int8_t)(qs[j] & 15);
        for (int j = 0; j < 16; j++) q[j + 16] = (int8_t)(qs[j] >> 4);
        break;
    }
    case LLM_MXFP4: /* as q4_0's nibbles, each the index of its value */
        for (int j = 0; j < 16; j++) q[j] = llm_mxfp4_values[p[1 + j] & 15];
        for (int j = 0; j < 16; j++) q[j + 16] = llm_mxfp4_values[p[1 + j] >> 4];
        break;
    case LLM_Q5_0: case LLM_Q5_1: { /* and the fifth bits, bit j of a 32-bit word for value j */
        const uint8_t *qs = p + (type == LLM_Q5_0 ? 6 : 8);
        memcpy(&qh, qs - 4, 4);
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((qs[j] & 15) | (qh >> j & 1) << 4);
            q[j + 16] = (int8_t)((qs[j] >> 4) | (qh >> (j + 16) & 1) << 4);
        }
        break;
    }
    case LLM_Q2_K: case LLM_Q3_K: /* 2 bits: value 32 * s + l of a half of 128 is bits 2s of byte l */
        for (int half = 0; half < 2; half++)
            for (int s = 0; s < 4; s++)
                for (int l = 0; l < 32; l++) {
                    int i = half * 128 + s * 32 + l;
                    int u = p[(type == LLM_Q2_K ? 16 : 32) + half * 32 + l] >> 2 * s & 3;
                    /* q3_K: a third bit per value, in bit i / 32 of byte i % 32 */
                    if (type == LLM_Q3_K) u |= (p[l] >> (half * 4 + s) & 1) << 2;
                    q[i] = (int8_t)u;
                }
        break;
    case LLM_Q4_K: case LLM_Q5_K: /* 32 bytes of nibbles per 64 values; q5_K's fifth bit as q3_K's third */
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                uint8_t byte = p[(type == LLM_Q4_K ? 16 : 48) + c * 32 + l];
                int lo = byte & 15, hi = byte >> 4;
                if (type == LLM_Q5_K) {
                    lo |= (p[16 + l] >> (2 * c) & 1) << 4;
                    hi |= (p[16 + l] >> (2 * c + 1) & 1) << 4;
                }
                q[c * 64 + l] = (int8_t)lo; q[c * 64 + 32 + l] = (int8_t)hi;
            }
        break;
    /* q6_K: each value is a low nibble and 2 high bits, 0 to 63 (32 is taken out below) */
    case LLM_Q6_K: /* per half of 128: low nibbles across 64 bytes, the 2-bit high parts across 32 */
        for (int half = 0; half < 2; half++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *ql = p + half * 64;
                uint8_t h = p[128 + half * 32 + l];
                q[half * 128 + l]      = (int8_t)((ql[l] & 15)      | (h & 3) << 4);
                q[half * 128 + 32 + l] = (int8_t)((ql[l + 32] & 15) | (h >> 2 & 3) << 4);
                q[half * 128 + 64 + l] = (int8_t)((ql[l] >> 4)      | (h >> 4 & 3) << 4);
                q[half * 128 + 96 + l] = (int8_t)((ql[l + 32] >> 4) | (h >> 6 & 3) << 4);
            }
        break;
    }
    if (b->offset) for (int i = 0; i < b->n; i++) q[i] = (int8_t)(q[i] - b->offset);
}
/* The exported form of llm_qblock_read, which stays inlined in the loops of this file */
void llm_qblock_unpack(uint32_t type, const void *block, llm_qblock *b) {
    llm_qblock_read(type, (const uint8_t *)block, b);
}

/* Exactly what the file's values are in f32, each written in the specification's order of operations,
 * (d * scale) * q - dmin * min, so that the result is bit-exact (the build keeps a * b - c unfused). */
/* n must be a whole number of blocks (a row of a checked tensor is): the loop stops before a partial one. */
static inline __attribute__((always_inline)) void llm_dequant_blocks(uint32_t type, const uint8_t *p,
                                                                    float *out, int64_t n) {
    uint64_t block_bytes, block_values;
    llm_dtype_info(type, &block_bytes, &block_values);
    llm_qblock b;
    for (int64_t at = 0; at + (int64_t)block_values <= n; at += (int64_t)block_values, p += block_bytes) {
        llm_qblock_unpack(type, p, &b); /* a call: inlined, GCC scalarizes b.q byte by byte */
        /* per sub-block: its two products of scales once, then a multiply and a subtract per value */
        for (int s = 0; s < b.n / b.sub; s++) {
            float ds = b.d * (float)b.scale[s], dm = b.dmin * (float)b.min[s];
            for (int i = s * b.sub; i < (s + 1) * b.sub; i++) out[at + i] = ds * (float)b.q[i] - dm;
        }
    }
}

/* A row of n values as f32, exactly: the reference the SIMD and CUDA dot products are tested against, and
 * what the CPU path reads embeddings (a row per token), f16 K and a prompt's tiles of weight rows with.
 * Each quantized case calls the inlined llm_dequant_blocks with a constant type, so the compiler drops the
 * type switches from the inner loops; an unknown type writes nothing (llm_model_weight refused such tensors
 * at load). */
#if defined(LLM_AVX2)
/* Section 14's: an f16 or bf16 row's first n / 8 * 8 values as f32, 8 at a time (the same values); returns
 * how many */
static inline __attribute__((always_inline)) int64_t llm_half_row_avx2(uint32_t type, const uint8_t *p,
                                                                       float *out, int64_t n);
#endif
void llm_dtype_dequant_row(uint32_t type, const void *row, float *out, int64_t n) {
    const uint8_t *p = (const uint8_t *)row;
    switch (type) { /* each call specializes the inlined loops to its type */
    case LLM_F32: memcpy(out, row, (size_t)n * sizeof(float)); return;
    /* the half-precision types have no blocks: a value in every 2 bytes */
    case LLM_F16: case LLM_BF16: {
        int64_t i = 0;
#if defined(LLM_AVX2)
        i = llm_half_row_avx2(type, p, out, n); /* section 14: prompts' tiles and f16 K come here */
#endif
        for (; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = llm_half_to_f32(type, h);
        }
        return;
    }
    case LLM_Q8_0: llm_dequant_blocks(LLM_Q8_0, p, out, n); return;
    case LLM_Q4_0: llm_dequant_blocks(LLM_Q4_0, p, out, n); return;
    case LLM_Q4_1: llm_dequant_blocks(LLM_Q4_1, p, out, n); return;
    case LLM_Q5_0: llm_dequant_blocks(LLM_Q5_0, p, out, n); return;
    case LLM_Q5_1: llm_dequant_blocks(LLM_Q5_1, p, out, n); return;
    case LLM_Q2_K: llm_dequant_blocks(LLM_Q2_K, p, out, n); return;
    case LLM_Q3_K: llm_dequant_blocks(LLM_Q3_K, p, out, n); return;
    case LLM_Q4_K: llm_dequant_blocks(LLM_Q4_K, p, out, n); return;
    case LLM_Q5_K: llm_dequant_blocks(LLM_Q5_K, p, out, n); return;
    case LLM_Q6_K: llm_dequant_blocks(LLM_Q6_K, p, out, n); return;
    case LLM_MXFP4: llm_dequant_blocks(LLM_MXFP4, p, out, n); return;
    }
}

/* ===========================================================================================================
 * 2. Model: the configuration from the metadata, the weights as typed pointers into the mapped file
 * Takes the parsed GGUF (section 1) and hands on an llm_model: an llm_config of plain numbers that the
 * forward pass (section 7) and the KV cache's sizing read, an llm_weight per matrix pointing into the
 * mapping (no copy, no conversion: a q4_K file stays q4_K in memory), and the tokenizer (section 3).
 *
 * The metadata keys are named after the architecture, general.architecture's value:
 *
 *   general.architecture = "qwen2"
 *   qwen2.embedding_length      dim             qwen2.block_count               n_layers
 *   qwen2.feed_forward_length   ffn_dim         qwen2.context_length            context_length
 *   qwen2.attention.head_count  n_heads         qwen2.attention.head_count_kv   n_kv_heads (GQA)
 *   qwen2.attention.key_length  head_dim        qwen2.rope.dimension_count      rope_dim
 *   qwen2.rope.freq_base        rope_base       qwen2.attention.layer_norm_rms_epsilon  rms_eps
 *
 * and the tensors after llama.cpp's names: token_embd.weight, output_norm.weight, output.weight (absent when
 * the output projection is tied to the embedding), and per layer blk.N.attn_norm, attn_q, attn_k, attn_v,
 * attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down (.weight, and .bias for biases).
 *
 * Why configurations differ: a converter (llama.cpp's convert_hf_to_gguf.py) writes what a checkpoint's
 * config.json says in numbers, but much of an architecture is in its modelling code, not its config, so the
 * architecture's name implies it, here as in llama.cpp:
 *   llama    RoPE on adjacent pairs (rope_neox 0); optional rope_freqs (Llama 3.1); experts if expert_count
 *            is set (Mixtral)
 *   qwen2    biases on Q, K and V (required); RoPE on halves (rope_neox 1), as every model below but smollm3
 *   qwen3    a RMS norm over each head of Q and K (q_norm, k_norm) instead of qwen2's biases
 *   gemma3   q/k norms, a norm after attention and after the FFN too, 5 local (sliding window) layers then
 *            a global one, the local ones with their own RoPE base
 *   phi3     Q, K, V fused in one matrix and gate, up in another (bound as row ranges); LongRoPE factors
 *   smollm3  llama's RoPE, none at all in every 4th layer
 *   qwen3moe, qwen2moe, gpt-oss  mixtures of experts (qwen2moe with a shared expert; gpt-oss with biases,
 *            attention sinks, every other layer local, YaRN, experts in mxfp4)
 * A key that only some architectures have is read only for them (the sliding window: gemma3, gpt-oss); a
 * tensor an architecture needs and the file lacks is an error naming the tensor; every number is
 * range-checked before it sizes anything.
 *
 * A weight is rows x cols (llm_weight): cols = ne[0], the input dimension; y = W x takes row r's dot product
 * with x for y[r]. The experts of a layer are one 3-D tensor, ne = {cols, rows per expert, n_experts}, bound
 * as rows_per_expert * n_experts rows, expert e's from row e * rows_per_expert on.
 *
 * Read first: llm_model_load (the order of things), llm_model_read_config, llm_model_bind_weights; then the
 * KV cache's groups of layers (llm_kv_group_layers), which the block manager and the backends size by.
 * ======================================================================================================== */
static const char *llm_arch_names[LLM_ARCH_COUNT] = {"llama", "qwen2", "qwen3", "gemma3", "phi3", "smollm3",
                                                     "qwen3moe", "gpt-oss", "qwen2moe"};

/* Weights stay in the file's type; the forward pass converts one row at a time (llm_dtype_dequant_row). rows
 * 0: a vector (a norm or a bias), which must be f32.
 * Binds w to tensor name, checked to hold cols values a row and rows rows (the dimensions past ne[0] are
 * multiplied together, so a stack of experts binds as one tall matrix). Absent and not required: w stays
 * zeroed (data NULL, which the forward pass reads as "this model has none") and 0 is returned. A type
 * without a row size here (llm_dtype_row_bytes 0) is refused now rather than met in the middle of a
 * forward pass. */
static int llm_model_weight(llm_model *m, llm_weight *w, const char *name, int64_t cols, int64_t rows,
                            int required, char *err) {
    const llm_gguf_tensor *t = llm_gguf_tensor_find(&m->gguf, name);
    memset(w, 0, sizeof *w);
    if (!t) return required ? llm_fail(err, "model file is missing tensor '%s'", name) : 0;
    int64_t want_rows = rows ? rows : 1;
    if ((int64_t)t->ne[0] != cols || (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]) != want_rows)
        return llm_fail(err, "tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name,
                        (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)cols,
                        (long long)want_rows);
    if (!llm_dtype_row_bytes(t->type, cols))
        return llm_fail(err, "tensor '%s' has type %s, which this engine cannot compute with yet", name,
                        llm_dtype_name(t->type));
    if (rows == 0 && t->type != LLM_F32) /* norms and biases are small: we read them as f32 directly */
        return llm_fail(err, "tensor '%s' has type %s; norm and bias tensors must be f32", name,
                        llm_dtype_name(t->type));
    w->data = t->data; w->type = t->type; w->rows = want_rows; w->cols = cols;
    return 0;
}

/* The context the model runs with picks Phi-3.5's RoPE factors, as llama.cpp does: the long ones past the
 * original context, else the short ones (the engine calls it with its max_model_len) */
static void llm_model_set_context(llm_model *m, int n_ctx) {
    llm_config *c = &m->cfg;
    if (c->rope_factors_long)
        c->rope_factors = n_ctx > c->rope_orig_ctx ? c->rope_factors_long : c->rope_factors_short;
}

/* A layer's attention window: 0, every earlier position; Gemma 3's and gpt-oss's local layers, the last
 * sliding_window positions */
int llm_layer_window(const llm_config *c, int layer) {
    return c->sliding_window > 0 && (layer + 1) % c->swa_pattern != 0 ? c->sliding_window : 0;
}

/* The KV cache's groups of layers, as vLLM's hybrid KV cache has them: layers that attend alike share a
 * block table, so that a local layer's blocks can go back to the pool once they slide out of its window
 * while a global layer keeps every block. The global layers, in order, then the local ones are cut into
 * groups of one size, the greatest common divisor of their counts (Gemma 3 270M: 3 global, 15 local, 6
 * groups of 3; a model without windows: one group of all its layers). A block of the pool holds one
 * group's layers for block_size positions, whichever group it serves. */
int llm_kv_group_layers(const llm_config *c) {
    int n_local = 0;
    for (int l = 0; l < c->n_layers; l++) n_local += llm_layer_window(c, l) > 0;
    int a = c->n_layers - n_local, b = n_local; /* gcd(a, 0) = a */
    while (b) { int t = a % b; a = b; b = t; }
    return a;
}

int llm_kv_groups(const llm_config *c) { return c->n_layers / llm_kv_group_layers(c); }

/* The window of a group's layers: the global groups come first */
static int llm_kv_group_window(const llm_config *c, int group) {
    int n_global = 0;
    for (int l = 0; l < c->n_layers; l++) n_global += llm_layer_window(c, l) == 0;
    return group < n_global / llm_kv_group_layers(c) ? 0 : c->sliding_window;
}

/* Where a layer's K and V are: its group, and its place among the group's layers in a block
 * The global layers, counted in order, fill the first groups, then the local ones the rest, g at a time
 * (g = llm_kv_group_layers). Gemma 3 270M (18 layers, global 5, 11, 17; g = 3): group 0 holds layers 5, 11,
 * 17; group 1 layers 0, 1, 2; group 2 layers 3, 4, 6 (so layer 6 is at index 2); ... group 5 layers 14,
 * 15, 16. A model without windows: group 0, index = the layer. */
void llm_kv_place(const llm_config *c, int layer, int *group, int *index) {
    int g = llm_kv_group_layers(c), local = llm_layer_window(c, layer) > 0, n_global = 0, before = 0;
    for (int l = 0; l < c->n_layers; l++) {
        n_global += llm_layer_window(c, l) == 0;
        before += l < layer && (llm_layer_window(c, l) > 0) == local;
    }
    *group = (local ? n_global / g : 0) + before / g;
    *index = before % g;
}

/* Rows [first, first + n) of w, as a weight of their own (where a file fuses several matrices in one),
 * without decode tiles (a slice need not start where a tile does) */
static llm_weight llm_weight_rows(llm_weight w, int64_t first, int64_t n) {
    w.data = (const uint8_t *)w.data + (size_t)first * llm_dtype_row_bytes(w.type, w.cols);
    w.rows = n;
    w.tiles = NULL;
    return w;
}

/* An integer key of the config, in [lo, hi] (absent: fallback, when that is in range).
 * A fallback below lo makes the key required ("is missing"). A value of any numeric type is accepted if it
 * is a whole number (a f32 2.0 is 2; 2.5 and NaN are errors), and the range check comes before the cast to
 * int, so no value in a file reaches an int it does not fit. */
static int llm_config_int(const llm_gguf *g, const char *key, int64_t fallback, int64_t lo, int64_t hi,
                          int *out, char *err) {
    const llm_gguf_kv *kv = llm_gguf_find(g, key);
    int64_t v = fallback;
    double f = (double)fallback;
    if (kv && (!llm_gguf_scalar(kv->type, kv->data, &v, &f) || f != (double)v))
        return llm_fail(err, "model metadata %s is not an integer", key);
    if (!kv && fallback < lo) return llm_fail(err, "model metadata %s is missing", key);
    if (v < lo || v > hi)
        return llm_fail(err, "model metadata %s is %lld: it must be between %lld and %lld", key, (long long)v,
                        (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

/* A real number of the config: finite, in [lo, hi]. */
static int llm_config_float(const llm_gguf *g, const char *key, double fallback, double lo, double hi,
                            float *out, char *err) {
    double v = llm_gguf_float(g, key, fallback);
    if (!(v >= lo && v <= hi)) /* NaN too */
        return llm_fail(err, "model metadata %s is %g: it must be between %g and %g", key, v, lo, hi);
    *out = (float)v;
    return 0;
}

/* The llm_config from the metadata, in steps: the architecture, the shape, the sliding windows, RoPE and its
 * scaling, the experts, then the checks across keys. Returns -1 with err naming the key at the first value
 * that is missing, of the wrong kind or out of range; c is then partly filled, and llm_model_load frees. */
static int llm_model_read_config(llm_model *m, char *err) {
    llm_gguf *g = &m->gguf;
    llm_config *c = &m->cfg;
    /* 1. the architecture: its name prefixes every key below */
    llm_str arch = llm_gguf_string(g, "general.architecture");
    if (!arch.ptr) return llm_fail(err, "model file has no general.architecture key");
    c->arch = -1;
    for (int i = 0; i < LLM_ARCH_COUNT; i++) if (llm_str_eq(arch, llm_arch_names[i])) c->arch = i;
    if (c->arch < 0)
        return llm_fail(err, "unsupported architecture '%.*s' (supported: llama, qwen2, qwen3, gemma3, phi3, "
                        "smollm3, qwen3moe, gpt-oss, qwen2moe)", (int)arch.len, arch.ptr);
    /* keys are prefixed by the architecture: llama.embedding_length, qwen2.block_count, ... Every number is
     * checked against its range before it is used (a count drives allocations; a cast of a value out of range
     * is undefined behaviour), and an error names the key. */
    /* LLM_KEY(suffix) builds "<arch>.<suffix>" in key; LLM_INT and LLM_FLOAT read a key into a field of c,
     * or return -1 from here with err set */
    char key[128];
#define LLM_KEY(suffix) (snprintf(key, sizeof key, "%s.%s", llm_arch_names[c->arch], suffix), key)
#define LLM_INT(field, suffix, fallback, lo, hi) \
    if (llm_config_int(g, LLM_KEY(suffix), fallback, lo, hi, &c->field, err)) return -1
#define LLM_FLOAT(field, suffix, fallback, lo, hi) \
    if (llm_config_float(g, LLM_KEY(suffix), fallback, lo, hi, &c->field, err)) return -1
    /* 2. the shape. head_dim defaults to dim / n_heads, but Qwen3 and Gemma 3 give key_length, which differs
     * from it (Qwen3-0.6B: 1024 / 16 = 64, key_length 128); n_kv_heads < n_heads is grouped-query attention,
     * each K/V head serving n_heads / n_kv_heads query heads */
    LLM_INT(dim, "embedding_length", -1, 1, 1 << 20);
    LLM_INT(n_layers, "block_count", -1, 1, 4096);
    LLM_INT(ffn_dim, "feed_forward_length", -1, 1, 1 << 22);
    LLM_INT(n_heads, "attention.head_count", -1, 1, 4096);
    LLM_INT(n_kv_heads, "attention.head_count_kv", c->n_heads, 1, c->n_heads);
    LLM_INT(context_length, "context_length", 2048, 1, 1 << 24);
    LLM_INT(head_dim, "attention.key_length", c->dim / c->n_heads, 1, 4096);
    LLM_INT(rope_dim, "rope.dimension_count", c->head_dim, 2, c->head_dim);
    LLM_FLOAT(rms_eps, "attention.layer_norm_rms_epsilon", 1e-5, 1e-12, 1.0);
    LLM_FLOAT(rope_base, "rope.freq_base", 10000.0, 1.0, 1e12);
    LLM_INT(pooling, "pooling_type", 0, 0, 4); /* embedding models: how a prompt's vector is pooled */
    /* 3. sliding windows: the file gives the window; which layers are local is the architecture's (a
     * layer l is global when (l + 1) % swa_pattern == 0, llm_layer_window) */
    if (c->arch == LLM_ARCH_GEMMA3) { /* llama.cpp's pattern: 5 local layers, then a global one */
        LLM_INT(sliding_window, "attention.sliding_window", 0, 0, 1 << 24);
        LLM_FLOAT(rope_base_swa, "rope.freq_base_swa", 10000.0, 1.0, 1e12);
        c->swa_pattern = 6;
    }
    if (c->arch == LLM_ARCH_GPT_OSS) { /* every other layer local, from layer 0, with the same RoPE base */
        LLM_INT(sliding_window, "attention.sliding_window", 0, 0, 1 << 24);
        LLM_FLOAT(rope_base_swa, "rope.freq_base_swa", c->rope_base, 1.0, 1e12);
        c->swa_pattern = 2;
    }
    /* 4. RoPE scaling, as llama.cpp reads it: linear unless named, the factor 1 unless given. Scaling lets a
     * model run past the context it was trained on: "linear" divides every angle by the factor (position
     * interpolation); YaRN divides only the slow dimensions and ramps between, so that the fast ones, which
     * encode nearby order, keep their trained frequencies */
    llm_str scaling = llm_gguf_string(g, LLM_KEY("rope.scaling.type"));
    float factor = 1, attn_factor = 1, log_mul = 0;
    int orig_ctx = 0;
    LLM_FLOAT(rope_freq_scale, "rope.scale_linear", 1.0, 1e-6, 1e6); /* the old key of the factor */
    factor = c->rope_freq_scale;
    if (llm_config_float(g, LLM_KEY("rope.scaling.factor"), factor, 0, 1e6, &factor, err) ||
        llm_config_float(g, LLM_KEY("rope.scaling.attn_factor"), 1.0, 1e-6, 1e6, &attn_factor, err) ||
        llm_config_float(g, LLM_KEY("rope.scaling.yarn_log_multiplier"), 0, -1e6, 1e6, &log_mul, err) ||
        llm_config_int(g, LLM_KEY("rope.scaling.original_context_length"), c->context_length, 1, 1 << 24,
                       &orig_ctx, err))
        return -1;
    if (factor == 0) factor = 1;
    c->rope_yarn = scaling.ptr && llm_str_eq(scaling, "yarn");
    if (scaling.ptr && !c->rope_yarn && !llm_str_eq(scaling, "linear") && !llm_str_eq(scaling, "none"))
        return llm_fail(err, "this file scales RoPE with %.*s, which this engine does not read (it reads "
                        "linear and yarn)", (int)scaling.len, scaling.ptr);
    if (c->rope_yarn && log_mul != 0)
        return llm_fail(err, "this file's YaRN has a yarn_log_multiplier (DeepSeek's), which this engine "
                        "does not read yet");
    if (c->rope_yarn && factor < 1)
        return llm_fail(err, "model metadata %s.rope.scaling.factor is %g: YaRN needs a factor of 1 or more",
                        llm_arch_names[c->arch], factor);
    c->rope_freq_scale = scaling.ptr && llm_str_eq(scaling, "none") ? 1.0f : 1.0f / factor;
    c->rope_attn_factor = attn_factor;
    c->rope_orig_ctx = orig_ctx;
    /* local layers: gpt-oss scales them as the others, Gemma 3 not (llama.cpp's rope_freq_scale_train_swa) */
    c->rope_freq_scale_swa = c->arch == LLM_ARCH_GPT_OSS ? c->rope_freq_scale : 1.0f;
    /* YaRN's ramp: rotary pair i turns orig_ctx / (2 pi base^(2i / rope_dim)) times over the original
     * context; solving that for turns = beta gives the pair index below, as llama.cpp's
     * ggml_rope_yarn_corr_dims does. Pairs before yarn_dims[0] turn more than beta_fast times and keep
     * their angles, pairs past yarn_dims[1] fewer than beta_slow times and are divided by the factor, and
     * those between are blended */
    if (c->rope_yarn) { /* the dimensions that turn beta_fast (32) and beta_slow (1) times in orig_ctx */
        float beta[2] = {32, 1};
        for (int k = 0; k < 2; k++) {
            float d = (float)c->rope_dim * logf((float)orig_ctx / (beta[k] * 2 * (float)M_PI)) /
                      (2 * logf(c->rope_base));
            c->yarn_dims[k] = k == 0 ? fmaxf(0, floorf(d)) : fminf((float)c->rope_dim - 1, ceilf(d));
        }
    }
    if (c->arch == LLM_ARCH_SMOLLM3) c->nope_every = 4; /* as llama.cpp has it: layers 3, 7, 11, ... */
    /* 5. the experts: expert_count of them, expert_used_count chosen per token by the router */
    LLM_INT(n_experts, "expert_count", 0, 0, 1 << 16);
    int qwen2moe = c->arch == LLM_ARCH_QWEN2MOE;
    if ((c->arch == LLM_ARCH_QWEN3MOE || c->arch == LLM_ARCH_GPT_OSS || qwen2moe) && !c->n_experts)
        return llm_fail(err, "model metadata %s.expert_count is missing", llm_arch_names[c->arch]);
    if (c->n_experts) { /* qwen2moe's experts: ffn_dim / experts used, unless given (as llama.cpp has it) */
        LLM_INT(n_experts_used, "expert_used_count", -1, 1, c->n_experts);
        LLM_INT(expert_ffn_dim, "expert_feed_forward_length",
                qwen2moe && c->ffn_dim >= c->n_experts_used ? c->ffn_dim / c->n_experts_used : c->ffn_dim, 1,
                1 << 22);
        if (qwen2moe) LLM_INT(shared_ffn_dim, "expert_shared_feed_forward_length", c->ffn_dim, 1, 1 << 22);
    }
#undef LLM_INT
#undef LLM_FLOAT
    /* 6. what no single key's range can say: the keys must agree with each other and with the tensors */
    const char *an = llm_arch_names[c->arch];
    if (c->n_heads % c->n_kv_heads)
        return llm_fail(err, "model metadata is inconsistent: %s.attention.head_count=%d is not a multiple "
                        "of %s.attention.head_count_kv=%d", an, c->n_heads, an, c->n_kv_heads);
    if (c->rope_dim % 2)
        return llm_fail(err, "model metadata %s.rope.dimension_count=%d is odd", an, c->rope_dim);
    /* the layers must be in the file before anything is sized by block_count */
    snprintf(key, sizeof key, "blk.%d.attn_norm.weight", c->n_layers - 1);
    if (!llm_gguf_tensor_find(g, key))
        return llm_fail(err, "%s.block_count is %d, but the file has no tensor '%s'", an, c->n_layers, key);
#undef LLM_KEY
    /* 7. what the architecture implies: the RoPE pairing (HF's Llama checkpoints are permuted by the
     * converter into adjacent pairs; the others keep HF's halves), and the vocabulary from the embedding's
     * rows (the tokenizer must not have more tokens, which llm_model_load checks) */
    c->rope_neox = c->arch != LLM_ARCH_LLAMA && c->arch != LLM_ARCH_SMOLLM3;
    const llm_gguf_tensor *emb = llm_gguf_tensor_find(g, "token_embd.weight");
    if (!emb) return llm_fail(err, "model file is missing tensor 'token_embd.weight'");
    c->vocab_size = (int)emb->ne[1];
    return 0;
}

/* Every weight of the model, bound and shape-checked against the config: first the model-wide ones, then
 * each layer's, by the tensor names of the section's opener. What an architecture must have is required
 * (qwen2's biases, gemma3's extra norms, gpt-oss's sinks); what it may have is optional and stays NULL
 * when absent. Allocates m->layers; on error llm_model_load frees it. */
static int llm_model_bind_weights(llm_model *m, char *err) {
    llm_config *c = &m->cfg;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    if (llm_model_weight(m, &m->tok_embd, "token_embd.weight", c->dim, c->vocab_size, 1, err) ||
        llm_model_weight(m, &m->output_norm, "output_norm.weight", c->dim, 0, 1, err) ||
        llm_model_weight(m, &m->output, "output.weight", c->dim, c->vocab_size, 0, err)) return -1;
    if (!m->output.data) m->output = m->tok_embd; /* tied output embedding */
    /* a reranker as llama.cpp converts one: 1 or 2 classifier rows (Qwen3-Reranker's "yes", "no") */
    const llm_gguf_tensor *cls = llm_gguf_tensor_find(&m->gguf, "cls.output.weight");
    int64_t n_cls = cls ? (int64_t)(cls->ne[1] * cls->ne[2] * cls->ne[3]) : 0;
    if (cls && n_cls != 1 && n_cls != 2)
        return llm_fail(err, "tensor 'cls.output.weight' has %lld rows: a reranker has 1 or 2",
                        (long long)n_cls);
    if (cls && (llm_model_weight(m, &m->cls_out, "cls.output.weight", c->dim, n_cls, 1, err) ||
                llm_model_weight(m, &m->cls_out_bias, "cls.output.bias", n_cls, 0, 0, err))) return -1;
    /* RoPE's per-pair factors: Llama 3.1's rope_freqs; Phi-3.5's long and short ones (both or neither) */
    llm_weight freqs, factors_long, factors_short;
    if (llm_model_weight(m, &freqs, "rope_freqs.weight", c->rope_dim / 2, 0, 0, err) ||
        llm_model_weight(m, &factors_long, "rope_factors_long.weight", c->rope_dim / 2, 0, 0, err) ||
        llm_model_weight(m, &factors_short, "rope_factors_short.weight", c->rope_dim / 2, 0, 0, err))
        return -1;
    if (!factors_long.data != !factors_short.data)
        return llm_fail(err, "this file has only one of rope_factors_long and rope_factors_short");
    c->rope_factors = (const float *)freqs.data;
    c->rope_factors_long = (const float *)factors_long.data;
    c->rope_factors_short = (const float *)factors_short.data;
    llm_model_set_context(m, c->context_length);
    m->layers = (llm_layer *)calloc((size_t)c->n_layers, sizeof(llm_layer));
    if (!m->layers) return llm_fail(err, "out of memory");
    int qwen2 = c->arch == LLM_ARCH_QWEN2, qwen2moe = c->arch == LLM_ARCH_QWEN2MOE;
    int qk_norm = c->arch == LLM_ARCH_QWEN3 || c->arch == LLM_ARCH_GEMMA3 ||
                                                     c->arch == LLM_ARCH_QWEN3MOE;
    int64_t E = c->n_experts, Fe = c->expert_ffn_dim;
    int gemma3 = c->arch == LLM_ARCH_GEMMA3, phi3 = c->arch == LLM_ARCH_PHI3;
    int gpt_oss = c->arch == LLM_ARCH_GPT_OSS;
    /* each layer: attention, its norms, then the FFN (dense, or the router and the experts) */
    for (int l = 0; l < c->n_layers; l++) {
        llm_layer *L = &m->layers[l];
        char name[96];
#define LLM_W(field, suffix, cols, rows, req) (snprintf(name, sizeof name, "blk.%d.%s", l, suffix), \
                                              llm_model_weight(m, &L->field, name, cols, rows, req, err))
        if (phi3) { /* Phi-3 fuses Q, K and V in one matrix, and the FFN's gate and up in another: their
                     * rows */
            llm_weight qkv, gate_up;
            if (LLM_W(attn_norm, "attn_norm.weight", c->dim, 0, 1) ||
                LLM_W(wo, "attn_output.weight", q_dim, c->dim, 1) ||
                LLM_W(ffn_norm, "ffn_norm.weight", c->dim, 0, 1) ||
                LLM_W(w_down, "ffn_down.weight", c->ffn_dim, c->dim, 1) ||
                (snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l),
                 llm_model_weight(m, &qkv, name, c->dim, q_dim + 2 * kv_dim, 1, err)) ||
                (snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l),
                 llm_model_weight(m, &gate_up, name, c->dim, 2 * (int64_t)c->ffn_dim, 1, err)))
                return -1;
            L->wq = llm_weight_rows(qkv, 0, q_dim); L->wk = llm_weight_rows(qkv, q_dim, kv_dim);
            L->wv = llm_weight_rows(qkv, q_dim + kv_dim, kv_dim);
            L->w_gate = llm_weight_rows(gate_up, 0, c->ffn_dim);
            L->w_up = llm_weight_rows(gate_up, c->ffn_dim, c->ffn_dim);
            continue;
        }
        /* attention: Q has n_heads * head_dim rows, K and V n_kv_heads * head_dim; the output projection
         * maps the heads back to dim */
        if (LLM_W(attn_norm, "attn_norm.weight", c->dim, 0, 1) ||
            LLM_W(wq, "attn_q.weight", c->dim, q_dim, 1) ||
            LLM_W(wk, "attn_k.weight", c->dim, kv_dim, 1) || LLM_W(wv, "attn_v.weight", c->dim, kv_dim, 1) ||
            LLM_W(wo, "attn_output.weight", q_dim, c->dim, 1) ||
            LLM_W(bq, "attn_q.bias", q_dim, 0, qwen2 || gpt_oss) ||
            LLM_W(bk, "attn_k.bias", kv_dim, 0, qwen2 || gpt_oss) ||
            LLM_W(bv, "attn_v.bias", kv_dim, 0, qwen2 || gpt_oss) ||
            LLM_W(bo, "attn_output.bias", c->dim, 0, gpt_oss) ||
            LLM_W(sinks, "attn_sinks.weight", c->n_heads, 0, gpt_oss) ||
            LLM_W(q_norm, "attn_q_norm.weight", c->head_dim, 0, qk_norm) ||
            LLM_W(k_norm, "attn_k_norm.weight", c->head_dim, 0, qk_norm))
            return -1;
        if (gpt_oss ? LLM_W(ffn_norm, "post_attention_norm.weight", c->dim, 0, 1) /* its name for the FFN's */
                    : LLM_W(post_attn_norm, "post_attention_norm.weight", c->dim, 0, gemma3) ||
                      LLM_W(post_ffn_norm, "post_ffw_norm.weight", c->dim, 0, gemma3) ||
                      LLM_W(ffn_norm, "ffn_norm.weight", c->dim, 0, 1))
            return -1;
        /* qwen2moe's shared expert: a SwiGLU every token goes through, weighted by the sigmoid of the dot
         * product of shared_gate_inp (one row) with the token's normed vector */
        if (qwen2moe && (LLM_W(shared_gate_inp, "ffn_gate_inp_shexp.weight", c->dim, 0, 1) ||
                         LLM_W(shared_gate, "ffn_gate_shexp.weight", c->dim, c->shared_ffn_dim, 1) ||
                         LLM_W(shared_up, "ffn_up_shexp.weight", c->dim, c->shared_ffn_dim, 1) ||
                         LLM_W(shared_down, "ffn_down_shexp.weight", c->shared_ffn_dim, c->dim, 1)))
            return -1;
        /* gpt-oss's router and experts have biases: the router's one per expert, each expert's matrices'
         * a row of their output width per expert; f32, as the forward pass adds them as they are */
        if (gpt_oss && (LLM_W(router_b, "ffn_gate_inp.bias", E, 0, 1) ||
                        LLM_W(gate_exps_b, "ffn_gate_exps.bias", Fe, E, 1) ||
                        LLM_W(up_exps_b, "ffn_up_exps.bias", Fe, E, 1) ||
                        LLM_W(down_exps_b, "ffn_down_exps.bias", c->dim, E, 1)))
            return -1;
        if ((gpt_oss && (L->gate_exps_b.type != LLM_F32 || L->up_exps_b.type != LLM_F32 ||
                         L->down_exps_b.type != LLM_F32)))
            return llm_fail(err, "blk.%d: the experts' biases must be f32", l);
        /* the FFN: gate and up map dim to the hidden width, down maps it back; with experts, each of those
         * is E matrices stacked, and the router gives a logit per expert */
        if (E ? LLM_W(router, "ffn_gate_inp.weight", c->dim, E, 1) ||
                LLM_W(gate_exps, "ffn_gate_exps.weight", c->dim, Fe * E, 1) ||
                LLM_W(up_exps, "ffn_up_exps.weight", c->dim, Fe * E, 1) ||
                LLM_W(down_exps, "ffn_down_exps.weight", Fe, c->dim * E, 1)
              : LLM_W(w_gate, "ffn_gate.weight", c->dim, c->ffn_dim, 1) ||
                LLM_W(w_up, "ffn_up.weight", c->dim, c->ffn_dim, 1) ||
                LLM_W(w_down, "ffn_down.weight", c->ffn_dim, c->dim, 1))
            return -1;
#undef LLM_W
    }
    return 0;
}

/* Loads a model file: map and parse it, read the config, bind the weights, build the tokenizer, each step
 * checking what the next one relies on. On any error everything is freed (llm_model_free on the partial
 * model) and err says why. The model then owns the mapping: free it with llm_model_free. */
int llm_model_load(llm_model *m, const char *path, char *err) {
    memset(m, 0, sizeof *m);
    if (llm_gguf_open(&m->gguf, path, err) != 0) return -1;
    if (llm_model_read_config(m, err) != 0 || llm_model_bind_weights(m, err) != 0) {
        llm_model_free(m);
        return -1;
    }
    /* the tokenizer's ids index the embedding's rows: none may be past them */
    m->tok = llm_tokenizer_load(&m->gguf, err);
    if (!m->tok) { llm_model_free(m); return -1; }
    if (llm_tokenizer_n_vocab(m->tok) > m->cfg.vocab_size) {
        llm_fail(err, "tokenizer has %d tokens but the embedding only %d rows", llm_tokenizer_n_vocab(m->tok),
                 m->cfg.vocab_size);
        llm_model_free(m); return -1;
    }
    llm_str name = llm_gguf_string(&m->gguf, "general.name");
    snprintf(m->name, sizeof m->name, "%.*s", name.ptr ? (int)name.len : 0, name.ptr ? name.ptr : "");
    return 0;
}

/* Dummy models: the shapes of real checkpoints (from their config.json), random weights: f16, or f32 for the
 * small CPU one ("tiny", a model the size of stories260K's big brothers, quick enough to benchmark on a
 * laptop). */
typedef struct {
    const char *name;
    int arch, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, ctx;
    float rope_base;
    int n_experts, n_experts_used; /* qwen3moe: experts of width ffn_dim (0: a dense FFN) */
} llm_dummy_preset;

static const llm_dummy_preset llm_dummy_presets[] = {
    {"tiny",             LLM_ARCH_LLAMA,    128,   2,  4, 2,  32,  256,  2048,   2048, 10000.0f,   0,   0},
    {"tinyllama-1.1b",   LLM_ARCH_LLAMA,    2048, 22, 32, 4,  64,  5632, 32000,  2048, 10000.0f,   0,   0},
    {"llama-3.2-1b",     LLM_ARCH_LLAMA,    2048, 16, 32, 8,  64,  8192, 128256, 8192, 500000.0f,  0,   0},
    {"qwen2.5-0.5b",     LLM_ARCH_QWEN2,    896,  24, 14, 2,  64,  4864, 151936, 4096, 1000000.0f, 0,   0},
    {"tiny-moe",         LLM_ARCH_QWEN3MOE, 128,   2,  4, 2,  32,  64,   2048,   2048, 1000000.0f, 8,   2},
    {"qwen3-30b-a3b-4l", LLM_ARCH_QWEN3MOE, 2048,  4, 32, 4,  128, 768,  151936, 4096, 1000000.0f, 128, 8},
};

const char *llm_model_dummy_names(void) {
    return "tiny, tinyllama-1.1b, llama-3.2-1b, qwen2.5-0.5b, tiny-moe, qwen3-30b-a3b-4l";
}

/* A dummy model: the preset's shape, deterministic random weights from seed, no file and no tokenizer. All
 * weights live in one allocation (m->owned), carved in order by LLM_TAKE_MAT and LLM_TAKE_VEC: the matrices
 * (f32 for a small model, f16 past 64 M values, so the big presets' memory is a checkpoint's), then the f32
 * norms (all ones) and biases (zeros). */
int llm_model_dummy(llm_model *m, const char *preset, uint64_t seed, char *err) {
    memset(m, 0, sizeof *m);
    /* 1. the preset, and the config it implies */
    const llm_dummy_preset *p = NULL;
    for (size_t i = 0; i < sizeof llm_dummy_presets / sizeof *llm_dummy_presets; i++)
        if (!strcmp(llm_dummy_presets[i].name, preset)) p = &llm_dummy_presets[i];
    if (!p) return llm_fail(err, "unknown dummy model '%s' (presets: %s)", preset, llm_model_dummy_names());
    llm_config *c = &m->cfg;
    c->arch = p->arch; c->dim = p->dim; c->n_layers = p->n_layers; c->n_heads = p->n_heads;
    c->n_kv_heads = p->n_kv_heads; c->head_dim = p->head_dim; c->rope_dim = p->head_dim;
    c->ffn_dim = p->ffn_dim;
    c->vocab_size = p->vocab; c->context_length = p->ctx; c->rope_base = p->rope_base; c->rms_eps = 1e-6f;
    c->rope_neox = p->arch != LLM_ARCH_LLAMA;
    c->rope_freq_scale = c->rope_freq_scale_swa = c->rope_attn_factor = 1;
    c->n_experts = p->n_experts; c->n_experts_used = p->n_experts_used; c->expert_ffn_dim = p->ffn_dim;
    snprintf(m->name, sizeof m->name, "dummy:%s", p->name);
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t E = c->n_experts, ffn_mats = E ? E * 3 : 3; /* the experts' gate, up and down, or the FFN's */
    /* one allocation: the matrices, then the f32 norm weights and biases */
    int64_t per_layer_mat = q_dim * c->dim * 2 + kv_dim * c->dim * 2 +
        (int64_t)c->ffn_dim * c->dim * ffn_mats +
                            E * c->dim;
    int64_t n_mat = (int64_t)c->vocab_size * c->dim + per_layer_mat * c->n_layers;
    int64_t per_layer_vec = 2 * c->dim + q_dim + 2 * kv_dim + 2 * c->head_dim;
    int64_t n_vec = c->dim + per_layer_vec * c->n_layers;
    uint32_t mat_type = n_mat < ((int64_t)64 << 20) ? LLM_F32 : LLM_F16;
    size_t esize = mat_type == LLM_F32 ? 4 : 2;
    uint8_t *mat = (uint8_t *)malloc((size_t)n_mat * esize + (size_t)n_vec * 4);
    m->layers = (llm_layer *)calloc((size_t)c->n_layers, sizeof(llm_layer));
    if (!mat || !m->layers) {
        free(mat); free(m->layers); m->layers = NULL;
        return llm_fail(err, "out of memory for dummy model %s", p->name);
    }
    m->owned = mat;
    float *vec = (float *)(mat + (size_t)n_mat * esize);
    /* 2. fill it: random matrices, norms of ones */
    uint64_t rng = seed;
    /* a small table of random f16 values, tiled: filling billions of weights one by one would take longer
     * than the benchmark; the scale keeps activations bounded like a trained model's */
    float table[4096];
    uint16_t table16[4096];
    for (int i = 0; i < 4096; i++) {
        table[i] = (llm_rand_uniform(&rng) * 2 - 1) * 0.05f;
        table16[i] = llm_f32_to_f16(table[i]);
    }
    for (int64_t i = 0; i < n_mat; i += 4096) {
        int64_t n = n_mat - i < 4096 ? n_mat - i : 4096, shift = (int64_t)(llm_splitmix64(&rng) % 4096);
        for (int64_t j = 0; j < n; j++) {
            if (mat_type == LLM_F32) ((float *)mat)[i + j] = table[(j + shift) % 4096];
            else ((uint16_t *)mat)[i + j] = table16[(j + shift) % 4096];
        }
    }
    for (int64_t i = 0; i < n_vec; i++) vec[i] = 1.0f;
    /* 3. carve the allocation in order: the embedding (tied to the output), the output norm, then each
     * layer's matrices and vectors */
#define LLM_TAKE_MAT(w, r, cl) \
    (w.data = mat, w.type = mat_type, w.rows = (r), w.cols = (cl), mat += (size_t)(r) * (cl) * esize)
#define LLM_TAKE_VEC(w, n) (w.data = vec, w.type = LLM_F32, w.rows = 1, w.cols = (n), vec += (n))
    LLM_TAKE_MAT(m->tok_embd, c->vocab_size, c->dim); m->output = m->tok_embd;
    LLM_TAKE_VEC(m->output_norm, c->dim);
    for (int l = 0; l < c->n_layers; l++) {
        llm_layer *L = &m->layers[l];
        LLM_TAKE_MAT(L->wq, q_dim, c->dim); LLM_TAKE_MAT(L->wk, kv_dim, c->dim);
        LLM_TAKE_MAT(L->wv, kv_dim, c->dim);
        LLM_TAKE_MAT(L->wo, c->dim, q_dim);
        if (E) { /* qwen3moe: the router, the experts stacked, Q/K norms */
            LLM_TAKE_MAT(L->router, E, c->dim);
            LLM_TAKE_MAT(L->gate_exps, E * c->ffn_dim, c->dim);
            LLM_TAKE_MAT(L->up_exps, E * c->ffn_dim, c->dim);
            LLM_TAKE_MAT(L->down_exps, E * c->dim, c->ffn_dim);
            LLM_TAKE_VEC(L->q_norm, c->head_dim); LLM_TAKE_VEC(L->k_norm, c->head_dim);
        } else {
            LLM_TAKE_MAT(L->w_gate, c->ffn_dim, c->dim); LLM_TAKE_MAT(L->w_up, c->ffn_dim, c->dim);
            LLM_TAKE_MAT(L->w_down, c->dim, c->ffn_dim);
        }
        LLM_TAKE_VEC(L->attn_norm, c->dim); LLM_TAKE_VEC(L->ffn_norm, c->dim);
        if (c->arch == LLM_ARCH_QWEN2) { /* zero biases */
            LLM_TAKE_VEC(L->bq, q_dim); LLM_TAKE_VEC(L->bk, kv_dim); LLM_TAKE_VEC(L->bv, kv_dim);
            for (int64_t i = 0; i < q_dim + 2 * kv_dim; i++) vec[i - q_dim - 2 * kv_dim] = 0.0f;
        }
    }
#undef LLM_TAKE_MAT
#undef LLM_TAKE_VEC
    return 0;
}

/* Frees in the reverse order of llm_model_load: the tokenizer and the layers point into the mapping, which
 * goes last. Safe on a zeroed or partly loaded model. */
void llm_model_free(llm_model *m) {
    if (m->tok) llm_tokenizer_free(m->tok);
    free(m->layers); free(m->owned);
    if (m->gguf.base) llm_gguf_close(&m->gguf);
    memset(m, 0, sizeof *m);
}
/* ===========================================================================================================
 * 3. Tokenizer
 * Two kinds of vocabulary, told apart by tokenizer.ggml.model; both give the ids llama.cpp gives.
 *  - "llama": SentencePiece BPE. Every space becomes U+2581 (and one goes in front of the text); the
 *    text starts as single characters, and the adjacent pair whose concatenation is the highest-scoring
 *    token merges first. What never becomes a token is spelled out as <0xNN> byte tokens.
 *  - "gpt2": byte-level BPE. A pre-tokenizer (the model's split regex, written out by hand) cuts the text
 *    into words; a word starts as single bytes, each a token spelled with GPT-2's printable stand-in for
 *    that byte, and the pair listed earliest in tokenizer.ggml.merges merges first.
 * One merge loop serves both: a linked list of symbols and a heap of candidate pairs, so a long text costs
 * n log n. Special tokens are cut out of the text first, when the caller asks for them. Lookups go through
 * stb_ds hash maps (token text -> id, pair of ids -> merge) that are only read after loading, so several
 * threads may tokenize with one tokenizer at once.
 *
 * Takes in: the GGUF's tokenizer.ggml.* keys (llm_tokenizer_load) and, per request, a text. Hands on: token
 * ids, the prompt the scheduler (section 5) is given. The way of one text through llm_tokenize:
 *
 *   "Hi<|im_end|> 42"   special tokens cut out first (llm_special_at), each part tokenized on its own:
 *   "Hi" | <|im_end|> | " 42"
 *     SPM part: ' ' -> U+2581, one symbol per UTF-8 character, merge       (llm_tokenize_spm)
 *     BPE part: split into words by the pre-tokenizer's regexes            (llm_pretokenize)
 *               (gpt2's keeps " 42" one word, by ` ?\p{N}+`); a word starts as its bytes' tokens
 *               (H i), and merges happen within a word only                (llm_bpe_word)
 *   ids go to the caller's array through llm_out, which counts them all and stores what fits
 *
 * Why merges go by priority rather than left to right: BPE is trained by merging, again and again, the most
 * frequent adjacent pair of the corpus, and tokenizing replays that training. So the pair learned first (the
 * lowest rank, the line number in tokenizer.ggml.merges) merges first wherever it is in the word, and the
 * new symbol can then take part in later merges. SentencePiece BPE keeps no merge list: the score of each
 * token stands in for it, and the pair whose concatenation scores best merges first. With the merges
 * "l o" (rank 0), "lo w" (1), "e r" (2):
 *
 *   l o w e r  ->  lo w e r  ->  low e r  ->  low er      (a longest-match scan may give other tokens)
 *
 * The merge loop (llm_merge_symbols) keeps sym[], one entry per starting symbol, linked in text order; each
 * is a byte range [start, start + len) of the text and the id of its token. A merge grows the left symbol
 * over the right one and sets the right one's len to 0: symbols only grow, a symbol of len 0 is gone, and
 * the live symbols always tile the text. A merged symbol is always a token (merges only make tokens), so
 * what is left as no token at the end is a single character (SPM: written as <0xNN> byte tokens) or a byte
 * the vocabulary lacks (BPE: <unk>).
 *
 * Special tokens: a control token (<|im_end|>, <s>) is matched in the text only when the caller asks
 * (parse_special: the engine's prompts, a chat template's output); a user-defined token always, as
 * llama.cpp and Hugging Face's tokenizers match them. A few control tokens of tool-call syntaxes are made
 * user-defined at load (see llm_tokenizer_load) so that they read back as text.
 *
 * Memory: a text of len bytes costs about 30 bytes a byte for BPE (code points, classes, cuts, offsets,
 * symbols) and up to 63 for SPM (its copy and symbols are sized for each space grown to 3 bytes), plus the
 * heap of pairs (at most 3 pairs a symbol: n - 1 at first, 2 more a merge); llm_tokenize refuses texts over
 * INT32_MAX / 4 bytes, so that byte offsets, SPM's grown ones too, fit in an int.
 *
 * vLLM hands the same job to Hugging Face's tokenizers (Rust); this section follows llama.cpp's
 * src/llama-vocab.cpp instead, id for id. Read first: llm_tokenize, llm_merge_symbols, llm_pretokenize.
 * ======================================================================================================== */
enum { LLM_VOCAB_SPM, LLM_VOCAB_BPE };
/* token kinds, numbered as tokenizer.ggml.token_type numbers them */
enum {
    LLM_TOKEN_NORMAL = 1, LLM_TOKEN_UNKNOWN, LLM_TOKEN_CONTROL, LLM_TOKEN_USER, LLM_TOKEN_UNUSED,
    LLM_TOKEN_BYTE
};

typedef struct { char *key; int value; } llm_tok_entry;             /* token text -> id */
typedef struct { int rank, id; } llm_merge;                        /* rank in the merges list, merged token */
typedef struct { uint64_t key; llm_merge value; } llm_merge_entry; /* left id << 32 | right id -> merge */

/* The tokenizer, built once by llm_tokenizer_load and then only read. For a gpt2 vocabulary, say:
 *
 *   text[id]            "!" ... "Ġt" ... "Ġthe" ... "<|endoftext|>"   (in the GGUF's memory)
 *   ids                 "Ġthe" -> its id                              (every token's text, a hash map)
 *   merges              (id of "Ġ", id of "t") -> {rank, id of "Ġt"}  (from the merges line "Ġ t")
 *   byte_token[0x20]    the id of "Ġ", the token of the space byte
 *   special             "<|endoftext|>" and the other control and user-defined ids, longest first
 *
 * A SentencePiece vocabulary has score[] instead of merges, and byte_token[b] is the id of "<0xNN>". */
struct llm_tokenizer {
    int kind;                   /* LLM_VOCAB_SPM or LLM_VOCAB_BPE */
    int pre;                    /* LLM_PRE_*: how a BPE vocabulary splits text into words */
    int n_vocab;
    const llm_str *text;        /* token texts, in the GGUF file */
    float *score;               /* SPM: merge priority of each token */
    uint8_t *type;              /* LLM_TOKEN_* of each token */
    llm_tok_entry *ids;         /* stb_ds string map */
    llm_merge_entry *merges;    /* stb_ds map, BPE only */
    int *special;               /* stb_ds array: control and user-defined tokens, longest text first */
    int *special_text;          /* the same ids by text (bytes, then id): llm_special_at's binary search */
    int *special_head;          /* for each of those, the first with the same text */
    int *special_up;            /* ... and the first of the longest text that is a proper prefix of it, -1 */
    uint8_t special_start[256]; /* first bytes of the special tokens: most text positions need no search */
    int *eog;                   /* stb_ds array: ids that end generation */
    int byte_token[256];        /* SPM: the <0xNN> token; BPE: the token of the byte's stand-in; -1 if none */
    uint16_t byte_char[256];    /* BPE: GPT-2's stand-in code point for each byte */
    int16_t char_byte[324];     /* ... and back, for the code points below 324; -1 if not a stand-in */
    int bos, eos, eot, eom, unk;
    int add_bos, add_eos, add_space_prefix;
    int ignore_merges;          /* llama-bpe: a word that is a token is taken whole */
    size_t max_len;             /* the longest token text, in bytes: longer strings need no lookup */
    char warning[LLM_ERR_LEN];  /* what loading found doubtful ("" when nothing) */
};

/* ---- UTF-8, and the classes of characters the pre-tokenizers split by ---------------------------------- */
/* A prompt is bytes from a client and need not be UTF-8. Tokenizing must still give ids for every byte
 * (BPE is byte-level, and SPM has its <0xNN> tokens), so broken UTF-8 is not an error here: it is cut into
 * the same pieces llama.cpp cuts it into, and those bytes go through BPE like any other. */
/* A character's class for the split patterns: letter \p{L}, mark \p{M}, digit \p{Nd}, number the rest of
 * \p{N}, punctuation \p{P}, symbol \p{S}, white space \s (the White_Space property), other the rest; in the
 * low 3 bits (LLM_UC_CLASS) of a byte whose other bits are flags that a few patterns ask for. */
enum {
    LLM_UC_OTHER, LLM_UC_LETTER, LLM_UC_MARK, LLM_UC_DIGIT, LLM_UC_NUMBER, LLM_UC_PUNCT, LLM_UC_SYMBOL,
    LLM_UC_SPACE, LLM_UC_CLASS = 7,
    LLM_UC_UPPER = 8,  /* \p{Lu} or \p{Lt} */
    LLM_UC_LOWER = 16, /* \p{Ll}; a letter neither upper nor lower is \p{Lm} or \p{Lo} */
    LLM_UC_HAN = 32,   /* \p{Han}: the Script property */
    LLM_UC_WORD = 64   /* \w, as Python's regex has it: Alphabetic, marks, \p{Nd}, \p{Pc}, Join_Control */
};
static int llm_uni_class(uint32_t c); /* LLM_UC_* and flags: in the appendix, with its table */

/* Looks at the UTF-8 at s (n > 0 bytes there). Returns the length of the character that starts there; 0 when
 * the n bytes are a good start of a character that needs more bytes; -k when the first k bytes can never
 * begin a character (Unicode's "maximal subpart": a stray continuation byte, a byte that is never in UTF-8,
 * or a lead byte with the wrong follower). Overlong forms, surrogates and code points past U+10FFFF count as
 * broken. */
static int llm_utf8_check(const unsigned char *s, size_t n) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF; /* the range allowed for the next byte */
    int len;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return -1;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return 0;
        if (s[i] < lo || s[i] > hi) return -i;
        lo = 0x80; hi = 0xBF;
    }
    return len;
}

static uint32_t llm_utf8_decode(const unsigned char *s, int len) { /* of a character llm_utf8_check passed */
    uint32_t c = len == 1 ? s[0] : s[0] & (0x7Fu >> len);
    for (int i = 1; i < len; i++) c = c << 6 | (s[i] & 0x3Fu);
    return c;
}

/* Writes code point c (below U+110000) as UTF-8 at out (room for 4); returns its length. Used for GPT-2's
 * byte stand-ins, all below U+0800, so 1 or 2 bytes there. */
static int llm_utf8_encode(uint32_t c, char *out) {
    if (c < 0x80) { out[0] = (char)c; return 1; }
    if (c < 0x800) { out[0] = (char)(0xC0 | c >> 6); out[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    int len = c < 0x10000 ? 3 : 4;
    out[0] = (char)(len == 3 ? 0xE0 | c >> 12 : 0xF0 | c >> 18);
    for (int i = 1; i < len; i++) out[i] = (char)(0x80 | (c >> 6 * (len - 1 - i) & 0x3F));
    return len;
}

/* ---- Lookups ------------------------------------------------------------------------------------------- */
/* The id of the token whose text is s[0..n), or -1. */
static int llm_tok_find(const llm_tokenizer *t, const char *s, size_t n) {
    /* stb_ds keys are C strings: a string with a NUL byte, or longer than every token, can be no token */
    if (n == 0 || n > t->max_len || memchr(s, 0, n)) return -1;
    /* the key is built on the stack when short, as nearly all are: SPM's merge loop looks up every pair */
    char small[256], *key = n < sizeof small ? small : (char *)malloc(n + 1);
    if (!key) return -1;
    memcpy(key, s, n); key[n] = 0;
    /* the thread-safe lookup: it keeps its result out of the map's header (stb_ds has no shgeti_ts macro) */
    llm_tok_entry *ids = t->ids;
    ptrdiff_t i = -1;
    if (ids) stbds_hmget_key_ts(ids, sizeof *ids, key, sizeof ids->key, &i, STBDS_HM_STRING);
    if (key != small) free(key);
    return i >= 0 ? ids[i].value : -1;
}

/* The merge of the pair (left, right) of token ids: 1 and *m (its rank and the merged token's id), or 0 when
 * the merges list has no such line. The key packs both ids in 64 bits, left in the high half. */
static int llm_merge_find(const llm_tokenizer *t, int left, int right, llm_merge *m) {
    llm_merge_entry *map = t->merges;
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    ptrdiff_t i;
    if (!map) return 0;
    hmgeti_ts(map, key, i);
    if (i < 0) return 0;
    *m = map[i].value;
    return 1;
}

/* ---- The merge loop, for both kinds -------------------------------------------------------------------- */
/* A symbol: text[start, start + len), its token's id (-1: none), and its neighbours' indices in sym[] (-1:
 * none). Symbols live in one array, one per starting character or byte, and are never moved: a merge only
 * changes lengths and links, so an index stays a symbol's name for the whole loop.
 *
 *   sym:   [0] "lo" next 2   [1] "" (merged into 0)   [2] "w" prev 0 next 3   [3] "er" ...
 */
typedef struct { int start, len, prev, next, id; } llm_sym;          /* a run of bytes of the text, merged */
/* A candidate merge: symbols left and right (indices in sym[]), the merged token's id, its length in bytes,
 * and its priority: SPM, the merged token's score; BPE, minus the merge's rank (a double holds both). */
typedef struct { double score; int left, right, len, id; } llm_pair; /* adjacent symbols that could merge */

/* The order llama.cpp's queues pop in: higher score first (BPE scores are minus the rank), then leftmost. */
static int llm_pair_first(const llm_pair *a, const llm_pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

/* A binary heap of candidate pairs in an stb_ds array, best (llm_pair_first) at [0]; the children of [i] are
 * [2i + 1] and [2i + 2]. Push appends and sifts up; pop takes [0], moves the last entry there and sifts it
 * down. Both cost log n. The heap may hold pairs that are no longer adjacent: llm_merge_symbols skips
 * them. */
static void llm_heap_push(llm_pair **heap, llm_pair p) {
    arrput(*heap, p);
    llm_pair *h = *heap;
    for (ptrdiff_t i = arrlen(h) - 1; i > 0 && llm_pair_first(&h[i], &h[(i - 1) / 2]); i = (i - 1) / 2) {
        llm_pair tmp = h[i]; h[i] = h[(i - 1) / 2]; h[(i - 1) / 2] = tmp;
    }
}

static llm_pair llm_heap_pop(llm_pair **heap) {
    llm_pair *h = *heap, top = h[0], last = arrpop(h);
    ptrdiff_t n = arrlen(h), i = 0;
    if (n == 0) return top;
    h[0] = last;
    for (;;) {
        ptrdiff_t best = i, l = 2 * i + 1, r = l + 1;
        if (l < n && llm_pair_first(&h[l], &h[best])) best = l;
        if (r < n && llm_pair_first(&h[r], &h[best])) best = r;
        if (best == i) return top;
        llm_pair tmp = h[i]; h[i] = h[best]; h[best] = tmp;
        i = best;
    }
}

/* Can symbols a and b (adjacent, a first) merge? If so fill *p. a or b < 0 (the end of the list): no.
 * p->len remembers the pair's length in bytes, so that the pop can tell a pair made stale by a merge next to
 * it. SPM looks the concatenation up as text (adjacent symbols are adjacent bytes of the text); BPE looks the
 * two ids up in the merges. */
static int llm_pair_make(const llm_tokenizer *t, const char *text, const llm_sym *sym, int a, int b,
                         llm_pair *p) {
    if (a < 0 || b < 0) return 0;
    if (t->kind == LLM_VOCAB_SPM) {
        /* SentencePiece: any pair whose concatenation is a token, best score first */
        int id = llm_tok_find(t, text + sym[a].start, (size_t)(sym[a].len + sym[b].len));
        if (id < 0) return 0;
        p->score = t->score[id]; p->id = id;
    } else {
        /* byte-level BPE: only the pairs in the merges list, in its order */
        llm_merge m;
        if (sym[a].id < 0 || sym[b].id < 0 || !llm_merge_find(t, sym[a].id, sym[b].id, &m)) return 0;
        p->score = -(double)m.rank; p->id = m.id;
    }
    p->left = a; p->right = b; p->len = sym[a].len + sym[b].len;
    return 1;
}

/* Merges the n symbols (a linked list over text, in order) until no pair can merge.
 * The idea: every adjacent pair that could merge goes in a heap, best first. Pop the best; merge it (the
 * left symbol takes the right one's bytes and the merged token's id; the right one is emptied and unlinked);
 * then only two new pairs can have appeared, the merged symbol with each of its new neighbours, so push
 * those. Pairs already in the heap that involve the two old symbols are not removed (a heap cannot find
 * them cheaply): they are recognised when popped, because one of their symbols is now empty, no longer
 * next to the other, or longer than when the pair was made (symbols only grow, so the lengths' sum is
 * enough). Each pop is log n and there are at most 3n pushes: n log n for the word, where rescanning every
 * pair after each merge, as a plain reading of BPE does, costs n^2. On return the live symbols (len > 0,
 * from sym[0] along next) are the tokens, in order. */
static void llm_merge_symbols(const llm_tokenizer *t, const char *text, llm_sym *sym, int n) {
    llm_pair *heap = NULL, p;
    for (int i = 1; i < n; i++) if (llm_pair_make(t, text, sym, i - 1, i, &p)) llm_heap_push(&heap, p);
    /* the best pair left: merge it unless stale, then offer the merged symbol's two new pairs */
    while (arrlen(heap) > 0) {
        p = llm_heap_pop(&heap);
        llm_sym *l = &sym[p.left], *r = &sym[p.right];
        /* pairs stay in the heap when a neighbour merges first: skip one whose symbols changed since */
        if (l->len == 0 || r->len == 0 || l->next != p.right || l->len + r->len != p.len) continue;
        l->len += r->len; l->id = p.id; l->next = r->next; r->len = 0;
        if (r->next >= 0) sym[r->next].prev = p.left;
        int at = p.left;
        if (llm_pair_make(t, text, sym, l->prev, at, &p)) llm_heap_push(&heap, p);
        if (llm_pair_make(t, text, sym, at, l->next, &p)) llm_heap_push(&heap, p);
    }
    arrfree(heap);
}

/* ---- Output -------------------------------------------------------------------------------------------- */
/* The caller's array and how much of it is used. Counting past cap lets a caller tokenize with a guess of
 * room (or cap 0) and, when the count is larger, again with room for all (the engine does so), with no
 * growing buffer inside the tokenizer. An id of -1 (a token the vocabulary lacks, as a missing BOS) is
 * skipped. */
typedef struct { int32_t *ids; int cap, n, failed; } llm_out; /* counts every id, stores the first cap */

static void llm_out_put(llm_out *o, int id) {
    if (id < 0) return;
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* ---- SentencePiece ------------------------------------------------------------------------------------- */
/* Tokenizes text[0..len) with a SentencePiece vocabulary, appending to o (o->failed on no memory).
 * SentencePiece has no pre-tokenizer: the whole part is one word, and spaces are ordinary characters,
 * written as U+2581 ("\u2581Hello\u2581world"), so that a token can start with one. space_prefix puts one
 * in front, so that the first word tokenizes as it would after a space. */
static void llm_tokenize_spm(const llm_tokenizer *t, const char *text, size_t len, int space_prefix,
                             llm_out *o) {
    static const char space[] = "\xE2\x96\x81"; /* U+2581, SentencePiece's visible space */
    /* 1. the text again, with its spaces as U+2581 (3 bytes each): s, of n bytes */
    size_t n = space_prefix ? 3 : 0;
    for (size_t i = 0; i < len; i++) n += text[i] == ' ' ? 3 : 1;
    char *s = (char *)malloc(n ? n : 1);
    llm_sym *sym = (llm_sym *)malloc((n ? n : 1) * sizeof *sym);
    if (!s || !sym) { free(s); free(sym); o->failed = 1; return; }
    n = 0;
    if (space_prefix) { memcpy(s, space, 3); n = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(s + n, space, 3); n += 3; }
        else s[n++] = text[i];
    }
    /* start from single characters; a broken UTF-8 byte is a symbol of its own */
    int ns = 0;
    for (size_t i = 0; i < n; ns++) {
        int k = llm_utf8_check((const unsigned char *)s + i, n - i), clen = k > 0 ? k : 1;
        llm_sym x = {(int)i, clen, ns - 1, i + clen < n ? ns + 1 : -1, llm_tok_find(t, s + i, (size_t)clen)};
        sym[ns] = x;
        i += (size_t)clen;
    }
    /* 2. merge, best score first; 3. the symbols left, in order, as ids */
    llm_merge_symbols(t, s, sym, ns);
    for (int i = ns ? 0 : -1; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0) { llm_out_put(o, sym[i].id); continue; }
        /* a character that is no token: its bytes as <0xNN> tokens */
        for (int j = 0; j < sym[i].len; j++) {
            int b = t->byte_token[(unsigned char)s[sym[i].start + j]];
            llm_out_put(o, b >= 0 ? b : t->unk);
        }
    }
    free(s); free(sym);
}

/* ---- Byte-level BPE: pre-tokenizers -------------------------------------------------------------------- */
/* llama.cpp splits a text with a list of regexes chosen by tokenizer.ggml.pre: the first regex cuts the text
 * into its matches and the runs of text between them, and each later regex cuts each of those pieces again,
 * the same way (a regex sees only its piece). A regex here is a list of alternatives, tried in order at each
 * position as a regex engine tries them, and each kind of alternative is one hand-written matcher below that
 * takes sets of characters as parameters. The patterns themselves are llama.cpp's (src/llama-vocab.cpp);
 * tools/pretok_check.py checks every one against Python's regex module.
 * Why split at all: byte-level BPE learned its merges inside words only, so merging across a word's edge
 * would make tokens the model never saw. The split decides, for instance, that a space belongs to the word
 * after it (" world"), that digits go in groups of at most 3 (llama3), or one by one (qwen2).
 * Why by hand: a regex engine with \p{L} and look-ahead is a large dependency; the patterns in use are
 * built from a dozen kinds of alternative, and each is a short loop over classified code points. The
 * alternatives are tried as Python's regex tries them: leftmost first, the first alternative that matches
 * wins (not the longest), each greedy, with only the backing off the pattern needs written out (as
 * \s+(?!\S), which gives back the last space so that the next word can take it: "a   b" -> "a" "  " " b"). */

/* The sets of characters the patterns name (cls[] holds each character's LLM_UC_* class and flags) */
enum {
    LLM_SET_NONE,
    LLM_SET_SPACE_CHAR,         /* ' ' */
    LLM_SET_SPACE,              /* \s */
    LLM_SET_LETTER,             /* \p{L} */
    LLM_SET_LETTER_MARK,        /* [\p{L}\p{M}] */
    LLM_SET_NUMBER,             /* \p{N} */
    LLM_SET_ASCII_DIGIT,        /* [0-9] */
    LLM_SET_ASCII_LETTER,       /* [A-Za-z] */
    LLM_SET_ASCII_PUNCT,        /* [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~] */
    LLM_SET_BREAK,              /* [\r\n] */
    LLM_SET_BREAK_SLASH,        /* [\r\n/] */
    LLM_SET_NEWLINE,            /* [\n] */
    LLM_SET_NOT_NEWLINE,        /* [^\n] */
    LLM_SET_NOT_BREAK_L_N,      /* [^\r\n\p{L}\p{N}] */
    LLM_SET_NOT_BREAK_L_P_S,    /* [^\r\n\p{L}\p{P}\p{S}] */
    LLM_SET_NOT_SPACE_L_N,      /* [^\s\p{L}\p{N}] */
    LLM_SET_NOT_SPACE_L_M_N,    /* [^\s\p{L}\p{M}\p{N}] */
    LLM_SET_PUNCT,              /* \p{P} */
    LLM_SET_PUNCT_SYMBOL,       /* [\p{P}\p{S}] */
    LLM_SET_PUNCT_FALCON,       /* [\p{P}\$\+<=>\^~\|`] */
    LLM_SET_PUNCT_DEFAULT,      /* [\p{P}\$\+<=>\^~\|] */
    LLM_SET_NOT_LOWER,          /* ((?=[\p{L}])([^a-z])): a letter but a-z */
    LLM_SET_NOT_UPPER,          /* ((?=[\p{L}])([^A-Z])): a letter but A-Z */
    LLM_SET_NOT_LOWER_M,        /* ((?=[\p{L}\p{M}])([^a-z])) */
    LLM_SET_NOT_UPPER_M,        /* ((?=[\p{L}\p{M}])([^A-Z])) */
    LLM_SET_BLOOM,              /* [^(\s|.,!?…。，、।۔،)] */
    LLM_SET_HAN_KANA,           /* [一-龥぀-ゟ゠-ヿ] */
    LLM_SET_HAN_HANGUL,         /* [一-龥ࠀ-一가-퟿] */
    LLM_SET_CASED_UPPER,        /* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] */
    LLM_SET_CASED_LOWER,        /* [\p{Ll}\p{Lm}\p{Lo}\p{M}] */
    LLM_SET_CASED_UPPER_NO_HAN, /* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] */
    LLM_SET_CASED_LOWER_NO_HAN, /* [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] */
    LLM_SET_HAN,                /* \p{Han} */
    LLM_SET_DIGIT,              /* \d (\p{Nd}) */
    LLM_SET_DEEPSEEK_LETTER,    /* [A-Za-zµÀ-ÖØ-ö...]: deepseek-llm's cased letters,
                                 * llm_deepseek_letters */
    LLM_SET_DEEPSEEK_PUNCT,     /* [!-/:-~！-／：-～‘-‟　-。] */
    LLM_SET_YOUTU_HANGUL,       /* [가-힣ㄱ-ㆎ] */
    LLM_SET_YOUTU_PUNCT,        /* [！…“”‘’—：；，、-〿︰-﹏] */
    LLM_SET_BOPOMOFO,           /* [ㄅ-ㄯ] */
    LLM_SET_AFMOE_ASIAN,        /* [一-鿿㐀-䶿豈-﫿぀-ゟ...]: afmoe's CJK and Southeast Asian
                                 * blocks */
    LLM_SET_A_TO_I,             /* [A-I] */
    LLM_SET_TAB_NEWLINE,        /* [\t\n] */
    LLM_SET_PUNCT_ASCII         /* [\p{P}!-/:-@\[-`{-~] */
};

/* deepseek-llm's letters: its regex lists them, the letters with case of some Unicode version, rather than
 * \p{L}. Written as code points, since some (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A) are the ones
 * that Unicode normalization replaces: a copy of the regex's text through an editor loses them. Ranges, in
 * order. */
static const uint32_t llm_deepseek_letters[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA}, {0x1BC, 0x1BF},
    {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D}, {0x37F, 0x37F},
    {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481},
    {0x48A, 0x52F}, {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107},
    {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F},
    {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F},
    {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943}};
/* afmoe's [一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟
 * เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ], in order (豈 is U+F900, which
 * normalization would also replace) */
static const uint32_t llm_afmoe_asian[][2] = {
    {0x0E00, 0x0EFF}, {0x1000, 0x109F}, {0x1100, 0x11FF}, {0x1780, 0x17FF}, {0x2F00, 0x2FDF},
    {0x3040, 0x30FF}, {0x3400, 0x4DBF}, {0x4E00, 0x9FFF}, {0xA9E0, 0xA9FF}, {0xAA60, 0xAA7F},
    {0xAC00, 0xD7AF}, {0xF900, 0xFAFF}, {0xFF65, 0xFF9F}};

/* Whether c is in one of the n ranges (in order, apart). */
static int llm_in_ranges(uint32_t c, const uint32_t (*ranges)[2], int n) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < ranges[mid][0]) hi = mid - 1;
        else if (c > ranges[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}
#define LLM_IN_RANGES(c, ranges) llm_in_ranges(c, ranges, (int)(sizeof ranges / sizeof ranges[0]))

/* Whether code point c, of class and flags `flags` (llm_uni_class), is in the set (LLM_SET_*). The class
 * answers the Unicode properties; the code point the ASCII and block ranges some patterns list. */
static int llm_in_set(int set, uint32_t c, int flags) {
    int uc = flags & LLM_UC_CLASS;
    int letter = uc == LLM_UC_LETTER, number = uc == LLM_UC_DIGIT || uc == LLM_UC_NUMBER;
    int space = uc == LLM_UC_SPACE, brk = c == '\r' || c == '\n';
    int punct = uc == LLM_UC_PUNCT, symbol = uc == LLM_UC_SYMBOL, mark = uc == LLM_UC_MARK;
    /* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}]: Lm and Lo are in both */
    int upper = (letter && !(flags & LLM_UC_LOWER)) || mark;
    int lower = (letter && !(flags & LLM_UC_UPPER)) || mark;
    int han = (flags & LLM_UC_HAN) != 0;
    switch (set) {
    case LLM_SET_SPACE_CHAR: return c == ' ';
    case LLM_SET_SPACE: return space;
    case LLM_SET_LETTER: return letter;
    case LLM_SET_LETTER_MARK: return letter || mark;
    case LLM_SET_NUMBER: return number;
    case LLM_SET_ASCII_DIGIT: return c >= '0' && c <= '9';
    case LLM_SET_ASCII_LETTER: return c < 0x80 && letter;
    case LLM_SET_ASCII_PUNCT: return c < 0x80 && (punct || symbol);
    case LLM_SET_BREAK: return brk;
    case LLM_SET_BREAK_SLASH: return brk || c == '/';
    case LLM_SET_NEWLINE: return c == '\n';
    case LLM_SET_NOT_NEWLINE: return c != '\n';
    case LLM_SET_NOT_BREAK_L_N: return !brk && !letter && !number;
    case LLM_SET_NOT_BREAK_L_P_S: return !brk && !letter && !punct && !symbol;
    case LLM_SET_NOT_SPACE_L_N: return !space && !letter && !number;
    case LLM_SET_NOT_SPACE_L_M_N: return !space && !letter && !mark && !number;
    case LLM_SET_PUNCT: return punct;
    case LLM_SET_PUNCT_SYMBOL: return punct || symbol;
    case LLM_SET_PUNCT_FALCON: return punct || (c < 0x80 && c && strchr("$+<=>^~|`", (int)c));
    case LLM_SET_PUNCT_DEFAULT: return punct || (c < 0x80 && c && strchr("$+<=>^~|", (int)c));
    case LLM_SET_NOT_LOWER: return letter && !(c >= 'a' && c <= 'z');
    case LLM_SET_NOT_UPPER: return letter && !(c >= 'A' && c <= 'Z');
    case LLM_SET_NOT_LOWER_M: return (letter || mark) && !(c >= 'a' && c <= 'z');
    case LLM_SET_NOT_UPPER_M: return (letter || mark) && !(c >= 'A' && c <= 'Z');
    case LLM_SET_BLOOM:
        return !space && !(c < 0x80 && c && strchr("(|).,!?", (int)c)) && c != 0x2026 && c != 0x3002 &&
               c != 0xFF0C && c != 0x3001 && c != 0x0964 && c != 0x06D4 && c != 0x060C;
    case LLM_SET_HAN_KANA: return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF);
    case LLM_SET_HAN_HANGUL: return (c >= 0x0800 && c <= 0x9FA5) || (c >= 0xAC00 && c <= 0xD7FF);
    case LLM_SET_CASED_UPPER: return upper;
    case LLM_SET_CASED_LOWER: return lower;
    case LLM_SET_CASED_UPPER_NO_HAN: return upper && !han;
    case LLM_SET_CASED_LOWER_NO_HAN: return lower && !han;
    case LLM_SET_HAN: return han;
    case LLM_SET_DIGIT: return uc == LLM_UC_DIGIT;
    case LLM_SET_DEEPSEEK_LETTER: return LLM_IN_RANGES(c, llm_deepseek_letters);
    case LLM_SET_DEEPSEEK_PUNCT:
        return (c >= 0x21 && c <= 0x7E && !(c >= '0' && c <= '9')) || (c >= 0xFF01 && c <= 0xFF0F) ||
               (c >= 0xFF1A && c <= 0xFF5E) || (c >= 0x2018 && c <= 0x201F) || (c >= 0x3000 && c <= 0x3002);
    case LLM_SET_YOUTU_HANGUL: return (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x3131 && c <= 0x318E);
    case LLM_SET_YOUTU_PUNCT:
        return c == 0xFF01 || c == 0x2026 || c == 0x201C || c == 0x201D || c == 0x2018 || c == 0x2019 ||
               c == 0x2014 || c == 0xFF1A || c == 0xFF1B || c == 0xFF0C || (c >= 0x3001 && c <= 0x303F) ||
               (c >= 0xFE30 && c <= 0xFE4F);
    case LLM_SET_BOPOMOFO: return c >= 0x3105 && c <= 0x312F;
    case LLM_SET_AFMOE_ASIAN: return LLM_IN_RANGES(c, llm_afmoe_asian);
    case LLM_SET_A_TO_I: return c >= 'A' && c <= 'I';
    case LLM_SET_TAB_NEWLINE: return c == '\t' || c == '\n';
    case LLM_SET_PUNCT_ASCII: return punct || (c < 0x80 && symbol);
    }
    return 0;
}

/* The kinds of alternative. prefix: a set of one optional character in front (NONE: none); body, tail:
 * sets. */
enum {
    LLM_ALT_END,            /* ends a regex's list */
    LLM_ALT_RUN,            /* prefix? body{min,max} tail{0,tail_max} (0: no limit; min 0 means 1) */
    LLM_ALT_CONTRACTION,    /* 's|'t|'re|'ve|'m|'ll|'d */
    LLM_ALT_BREAKS,         /* \s*[\r\n]+ (the same as \s*[\r\n]) */
    LLM_ALT_SPACES,         /* \s+(?!\S) */
    LLM_ALT_SPACES_JAIS2,   /* \s{512}(?!\S)|\s{256}(?!\S)|...|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1} */
    LLM_ALT_CASED,          /* prefix? body* tail+: body, tail: LLM_SET_NOT_LOWER, _NOT_UPPER (tekken) */
    LLM_ALT_CASED_UPPER,    /* prefix? body+ tail* */
    LLM_ALT_PHRASE,         /* prefix? (?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+ : words joined by single spaces */
    LLM_ALT_DIGIT_GROUPS,   /* (?=(\d{3})+(?!\d)): an empty match where the digits left are whole threes */
    LLM_ALT_THREES,         /* body{1,3}(?=(?:body{3})*(?!body)): a run cut in threes from its end; with
                             * LLM_ALT_WORD_AFTER, \d{1,3}(?=(?:\d{3})*\b): only a run no \w follows */
    LLM_ALT_TRAILING_SPACES, /* \s+$ */
    LLM_ALT_LITERAL         /* before body{1,max} after: literal ASCII strings around a run (body NONE:
                             * none) */
};
enum { /* flags */
    LLM_ALT_ANY_CASE = 1, LLM_ALT_PREFIX_REQUIRED = 2, LLM_ALT_THEN_CONTRACTION = 4, LLM_ALT_WORD_AFTER = 8
};

/* One alternative of a regex: a kind (LLM_ALT_*) and the sets and counts it takes. A regex is an array of
 * them ended by {0} (LLM_ALT_END). Example: llama3's ` ?[^\s\p{L}\p{N}]+[\r\n]*` is
 * {RUN, prefix SPACE_CHAR, body NOT_SPACE_L_N, tail BREAK, tail_max 0}. */
typedef struct {
    uint8_t kind, prefix, body, min, max, tail, tail_max, flags;
    const char *before, *after; /* LLM_ALT_LITERAL */
} llm_alt;

/* The end of the run of characters of set from j (at most max of them; 0: no limit), before n. */
static int llm_set_run(int set, const uint32_t *cp, const char *cls, int j, int n, int max) {
    int end = j;
    while (end < n && (max == 0 || end - j < max) && llm_in_set(set, cp[end], cls[end])) end++;
    return end;
}

/* The last unbounded run scanned in a piece: characters [from, end) of set, and end_break, the end of the
 * last line break in it (-1: none). Why: a run from any j inside [from, end) ends at end too, so the kinds
 * that match only part of a run and come back for the rest (LLM_ALT_THREES takes three digits at a time,
 * LLM_ALT_DIGIT_GROUPS an empty match, jais2's spaces 512 at a time, \s+$ and \s*[\r\n]+ that fail at
 * each space of a run with no end or break) look its end up instead of scanning it again: each run is
 * scanned once per regex, so a piece costs linear time, where a scan at each match made a run of d digits
 * cost d^2 / 3 (a 1 MB prompt of digits: minutes). Valid for one piece (one n): llm_pretokenize resets it. */
typedef struct { int set, from, end, end_break; } llm_run_memo;

/* llm_set_run with no limit, through the memo: the end of the run of set from j, before n */
static int llm_set_run_memo(llm_run_memo *memo, int set, const uint32_t *cp, const char *cls, int j, int n) {
    if (memo->set != set || j < memo->from || j >= memo->end) {
        memo->set = set; memo->from = j; memo->end_break = -1;
        for (memo->end = j; memo->end < n && llm_in_set(set, cp[memo->end], cls[memo->end]); memo->end++)
            if (cp[memo->end] == '\r' || cp[memo->end] == '\n') memo->end_break = memo->end + 1;
    }
    return memo->end > j ? memo->end : j;
}

static uint32_t llm_ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* English contractions: where 's 't 're 've 'm 'll or 'd ends when one starts at i (ASCII letters of either
 * case when any_case), else -1. Note 's matches in "'sun" too, as the regex does: no word boundary after. */
static int llm_contraction(const uint32_t *cp, int i, int n, int any_case) {
    if (cp[i] != '\'' || i + 1 >= n) return -1;
    uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
    if (any_case) { a = llm_ascii_lower(a); b = llm_ascii_lower(b); }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return -1;
}

/* Where the ASCII string lit ends when it is the text at j, else -1. */
static int llm_literal(const char *lit, const uint32_t *cp, int j, int n) {
    for (; *lit; lit++, j++) if (j >= n || cp[j] != (uint8_t)*lit) return -1;
    return j;
}

/* Where alternative a, tried at i, ends (i itself for an empty match), or -1 when it does not match there. n
 * ends the piece. A regex engine would search the ways to match by backtracking; each kind here computes
 * the one match that search ends with. The switch handles the kinds without an optional prefix; the rest
 * try the prefix character first (`?` is greedy), then without it. Cost: a call scans at most to n; most
 * matches then take what was scanned, and the kinds that take part of a run, or fail inside one, read the
 * run's end from memo (llm_run_memo), so a piece costs linear time. */
static int llm_alt_match(const llm_alt *a, const uint32_t *cp, const char *cls, int i, int n,
                         llm_run_memo *memo) {
    int run, end;
    switch (a->kind) {
    case LLM_ALT_CONTRACTION: return llm_contraction(cp, i, n, a->flags & LLM_ALT_ANY_CASE);
    case LLM_ALT_BREAKS: /* all the white space, backed off to its last line break (one at i or later) */
        llm_set_run_memo(memo, LLM_SET_SPACE, cp, cls, i, n);
        return memo->end_break > i ? memo->end_break : -1;
    case LLM_ALT_SPACES: /* all the white space at the end of the piece, else all of it but the last */
        run = llm_set_run(LLM_SET_SPACE, cp, cls, i, n, 0) - i;
        return run == 0 ? -1 : i + run == n ? n : run > 1 ? i + run - 1 : -1;
    case LLM_ALT_SPACES_JAIS2: /* the same, but in lengths of 512, 256, ..., 4, then 2 or 1 */
        run = llm_set_run_memo(memo, LLM_SET_SPACE, cp, cls, i, n) - i;
        if (run == 0) return -1;
        for (int len = 512; len >= 1; len = len == 4 ? 2 : len / 2)
            if (len < run || (len == run && i + run == n)) return i + len;
        return i + 1;
    case LLM_ALT_DIGIT_GROUPS:
        run = llm_set_run_memo(memo, LLM_SET_DIGIT, cp, cls, i, n) - i;
        return run > 0 && run % 3 == 0 ? i : -1;
    case LLM_ALT_THREES: /* what is left of the run over whole threes, else three */
        run = llm_set_run_memo(memo, a->body, cp, cls, i, n) - i;
        if (run == 0) return -1;
        /* \b after a digit (a \w): the piece ends, or what follows is no \w */
        if ((a->flags & LLM_ALT_WORD_AFTER) && i + run < n && (cls[i + run] & LLM_UC_WORD)) return -1;
        return i + (run % 3 ? run % 3 : 3);
    case LLM_ALT_TRAILING_SPACES: /* the white space that ends the piece */
        run = llm_set_run_memo(memo, LLM_SET_SPACE, cp, cls, i, n);
        return run > i && run == n ? n : -1;
    case LLM_ALT_LITERAL: /* the string after is no character of body's set: there is nothing to back off */
        end = llm_literal(a->before, cp, i, n);
        if (end < 0 || a->body == LLM_SET_NONE) return end;
        run = llm_set_run(a->body, cp, cls, end, n, a->max) - end;
        return run > 0 ? llm_literal(a->after, cp, end + run, n) : -1;
    }
    /* the rest may start with the prefix character: first with it, then (unless required) without it */
    int with = a->prefix != LLM_SET_NONE && llm_in_set(a->prefix, cp[i], cls[i]);
    int without = !(a->flags & LLM_ALT_PREFIX_REQUIRED);
    for (int p = with; p >= !without; p--) {
        int j = i + p;
        end = -1;
        if (a->kind == LLM_ALT_RUN) {
            run = llm_set_run(a->body, cp, cls, j, n, a->max) - j;
            if (run < (a->min ? a->min : 1)) continue;
            end = j + run;
            if (a->tail) end = llm_set_run(a->tail, cp, cls, end, n, a->tail_max);
            return end;
        }
        if (a->kind == LLM_ALT_PHRASE) {
            if (j >= n || !llm_in_set(LLM_SET_LETTER, cp[j], cls[j])) continue;
            for (end = j + 1; end < n;) {
                if (llm_in_set(LLM_SET_LETTER_MARK, cp[end], cls[end])) end++;
                else if (cp[end] == ' ' && end + 1 < n &&
                         llm_in_set(LLM_SET_LETTER, cp[end + 1], cls[end + 1]))
                    end += 2;
                else break;
            }
            return end;
        }
        /* LLM_ALT_CASED: body* takes all it can, then gives back characters one at a time until tail+ can
         * start; LLM_ALT_CASED_UPPER: body+ then tail* */
        int body_end = llm_set_run(a->body, cp, cls, j, n, 0);
        if (a->kind == LLM_ALT_CASED_UPPER) {
            if (body_end > j) end = llm_set_run(a->tail, cp, cls, body_end, n, 0);
        } else {
            for (int k = body_end; k >= j && end < 0; k--)
                if (k < n && llm_in_set(a->tail, cp[k], cls[k])) end = llm_set_run(a->tail, cp, cls, k, n, 0);
        }
        if (end < 0) continue;
        if (a->flags & LLM_ALT_THEN_CONTRACTION) {
            int c = end < n ? llm_contraction(cp, end, n, 1) : -1;
            if (c > 0) end = c;
        }
        return end;
    }
    return -1;
}

/* The regexes, as llama.cpp writes them (its adapted forms: (?i:'s|...) spelled '[sS]|..., which is what
 * LLM_ALT_ANY_CASE means: ASCII letters only) */
/* LLM_RUN(pre, set): pre? set+ ; LLM_RUN_MAX(set, n): set{1,n} (n 0: set+) ; LLM_RUN_TAIL(pre, set, t, m):
 * pre? set+ t{0,m} (m 0: t*) */
#define LLM_RUN(pre, set) {.kind = LLM_ALT_RUN, .prefix = pre, .body = set}
#define LLM_RUN_MAX(set, n) {.kind = LLM_ALT_RUN, .body = set, .max = n}
#define LLM_RUN_TAIL(pre, set, t, t_max) \
    {.kind = LLM_ALT_RUN, .prefix = pre, .body = set, .tail = t, .tail_max = t_max}
#define LLM_CONTRACTIONS_ANY_CASE {.kind = LLM_ALT_CONTRACTION, .flags = LLM_ALT_ANY_CASE}
#define LLM_SPACES_THEN_ANY /* \s+(?!\S)|\s+ */ {.kind = LLM_ALT_SPACES}, LLM_RUN(0, LLM_SET_SPACE)

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) (gpt2's own adds |\s+: the same
 * split, as what \s+(?!\S) leaves out stays a piece of its own) */
static const llm_alt llm_re_gpt2[] = {
    {.kind = LLM_ALT_CONTRACTION}, LLM_RUN(LLM_SET_SPACE_CHAR, LLM_SET_LETTER),
    LLM_RUN(LLM_SET_SPACE_CHAR, LLM_SET_NUMBER), LLM_RUN(LLM_SET_SPACE_CHAR, LLM_SET_NOT_SPACE_L_N),
    {.kind = LLM_ALT_SPACES}, {0}};
/* (?:'[sS]|...|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+,
 * and the same with \p{N} one at a time (qwen2), or as many as there are (minicpm5) */
#define LLM_RE_LLAMA3(max_digits) {                                                                          \
    LLM_CONTRACTIONS_ANY_CASE, LLM_RUN(LLM_SET_NOT_BREAK_L_N, LLM_SET_LETTER),                               \
    LLM_RUN_MAX(LLM_SET_NUMBER, max_digits),                                                                 \
    LLM_RUN_TAIL(LLM_SET_SPACE_CHAR, LLM_SET_NOT_SPACE_L_N, LLM_SET_BREAK, 0), {.kind = LLM_ALT_BREAKS},     \
    LLM_SPACES_THEN_ANY, {0}}
static const llm_alt llm_re_llama3[] = LLM_RE_LLAMA3(3);
static const llm_alt llm_re_qwen2[] = LLM_RE_LLAMA3(1);
static const llm_alt llm_re_minicpm5[] = LLM_RE_LLAMA3(0);
/* llama3's, with white space cut in lengths of powers of two */
static const llm_alt llm_re_jais2[] = {
    LLM_CONTRACTIONS_ANY_CASE, LLM_RUN(LLM_SET_NOT_BREAK_L_N, LLM_SET_LETTER), LLM_RUN_MAX(LLM_SET_NUMBER, 3),
    LLM_RUN_TAIL(LLM_SET_SPACE_CHAR, LLM_SET_NOT_SPACE_L_N, LLM_SET_BREAK, 0), {.kind = LLM_ALT_BREAKS},
    {.kind = LLM_ALT_SPACES_JAIS2}, {0}};
/* qwen2's, with combining marks taken as letters: ...|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|
 * ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|... */
static const llm_alt llm_re_qwen35[] = {
    LLM_CONTRACTIONS_ANY_CASE, LLM_RUN(LLM_SET_NOT_BREAK_L_N, LLM_SET_LETTER_MARK),
    LLM_RUN_MAX(LLM_SET_NUMBER, 1),
    LLM_RUN_TAIL(LLM_SET_SPACE_CHAR, LLM_SET_NOT_SPACE_L_M_N, LLM_SET_BREAK, 0), {.kind = LLM_ALT_BREAKS},
    LLM_SPACES_THEN_ANY, {0}};
/* qwen2's with a contraction's apostrophe first: '(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|...|\s*[\r\n]|...
 * (the same strings, and \s*[\r\n] ends where \s*[\r\n]+ does) */
#define llm_re_bailingmoe llm_re_qwen2
/* qwen2's with ` ?[^\s\p{L}\p{N}\r\n]+` (no line breaks after the punctuation) */
static const llm_alt llm_re_seed_coder[] = {
    LLM_CONTRACTIONS_ANY_CASE, LLM_RUN(LLM_SET_NOT_BREAK_L_N, LLM_SET_LETTER), LLM_RUN_MAX(LLM_SET_NUMBER, 1),
    LLM_RUN(LLM_SET_SPACE_CHAR, LLM_SET_NOT_SPACE_L_N), {.kind = LLM_ALT_BREAKS}, LLM_SPACES_THEN_ANY, {0}};
/* qwen2's without the contractions */
static const llm_alt llm_re_ufakzeka[] = {
    LLM_RUN(LLM_SET_NOT_BREAK_L_N, LLM_SET_LETTER), LLM_RUN_MAX(LLM_SET_NUMBER, 1),
    LLM_RUN_TAIL(LLM_SET_SPACE_CHAR, LLM_SET_NOT_SPACE_L_N, LLM_SET_BREAK, 0), {.kind = LLM_ALT_BREAKS},
    LLM_SPACES_THEN_ANY, {0}};
/* ...|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|... */
static const llm_alt llm_re_exaone_moe[] = {
    LLM_CONTRACTIONS_ANY_CASE, {.kind = LLM_ALT_PHRASE, .prefix = LLM_SET_NOT_BREAK_L_N},
    LLM_RUN_MAX(LLM_SET_NUMBER, 1),
    LLM_RUN_TAIL(LLM_SET_SPACE_CHAR, LLM_SET_NOT_SPACE_L_N, LLM_SET_BREAK_SLASH, 1),
    {.kind = LLM_ALT_BREAKS}, LLM_SPACES_THEN_ANY, {0}};
/* tekken: [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|
 * [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|... ;
 * gpt-4o: the same with an optional contraction after each word and \p{N}{1,3}; granite-embed-multi-97m:
 * gpt-4o's with marks as letters */
#define LLM_RE_CASED(upper, lower, flags_, max_digits) {                                                     \
    {.kind = LLM_ALT_CASED, .prefix = LLM_SET_NOT_BREAK_L_N, .body = upper, .tail = lower, .flags = flags_}, \
    {.kind = LLM_ALT_CASED_UPPER, .prefix = LLM_SET_NOT_BREAK_L_N, .body = upper, .tail = lower,             \
     .flags = flags_},                                                                                       \
    LLM_RUN_MAX(LLM_SET_NUMBER, max_digits),                                                                 \
    LLM_RUN_TAIL(LLM_SET_SPACE_CHAR, LLM_SET_NOT_SPACE_L_N, LLM_SET_BREAK_SLASH, 0),                         \
    {.kind = LLM_ALT_BREAKS}, LLM_SPACES_THEN_ANY, {0}}
static const llm_alt llm_re_tekken[] = LLM_RE_CASED(LLM_SET_NOT_LOWER, LLM_SET_NOT_UPPER, 0, 1);
static const llm_alt llm_re_gpt4o[] =
    LLM_RE_CASED(LLM_SET_NOT_LOWER, LLM_SET_NOT_UPPER, LLM_ALT_THEN_CONTRACTION, 3);
static const llm_alt llm_re_granite_multi[] =
    LLM_RE_CASED(LLM_SET_NOT_LOWER_M, LLM_SET_NOT_UPPER_M, LLM_ALT_THEN_CONTRACTION, 3);
/* tekken's and gpt-4o's as their tokenizer.json has them, with the kinds of letter for their cases:
 * [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|...)?|
 * [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|...)?|\p{N}{1,3}|
 * ?[^\s\p{L}\p{N}]+[\r\n/]*|... (tiny_aya; youtu's has \p{N}) */
static const llm_alt llm_re_tiny_aya[] =
    LLM_RE_CASED(LLM_SET_CASED_UPPER, LLM_SET_CASED_LOWER, LLM_ALT_THEN_CONTRACTION, 3);
static const llm_alt llm_re_youtu[] =
    LLM_RE_CASED(LLM_SET_CASED_UPPER, LLM_SET_CASED_LOWER, LLM_ALT_THEN_CONTRACTION, 1);
/* kimi-k2 (its tokenization_kimi.py; llama.cpp's own code for it takes letters of either case alike):
 * [\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*
 * [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|...)?|[^\r\n\p{L}\p{N}]?[...&&[^\p{Han}]]+[...&&[^\p{Han}]]*
 * (?i:'s|...)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static const llm_alt llm_re_kimi_k2[] = {
    LLM_RUN(0, LLM_SET_HAN),
    {.kind = LLM_ALT_CASED, .prefix = LLM_SET_NOT_BREAK_L_N, .body = LLM_SET_CASED_UPPER_NO_HAN,
     .tail = LLM_SET_CASED_LOWER_NO_HAN, .flags = LLM_ALT_THEN_CONTRACTION},
    {.kind = LLM_ALT_CASED_UPPER, .prefix = LLM_SET_NOT_BREAK_L_N, .body = LLM_SET_CASED_UPPER_NO_HAN,
     .tail = LLM_SET_CASED_LOWER_NO_HAN, .flags = LLM_ALT_THEN_CONTRACTION},
    LLM_RUN_MAX(LLM_SET_NUMBER, 3), LLM_RUN_TAIL(LLM_SET_SPACE_CHAR, LLM_SET_NOT_SPACE_L_N, LLM_SET_BREAK, 0),
    {.kind = LLM_ALT_BREAKS}, LLM_SPACES_THEN_ANY, {0}};
/* deepseek-v3: [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
 * ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ ; spark2_5: the same with ` ?[\p{P}\p{S}]+|[\r\n]` */
static const llm_alt llm_re_deepseek3[] = {
    {.kind = LLM_ALT_RUN, .prefix = LLM_SET_ASCII_PUNCT, .body = LLM_SET_ASCII_LETTER,
     .flags = LLM_ALT_PREFIX_REQUIRED},
    LLM_RUN(LLM_SET_NOT_BREAK_L_P_S, LLM_SET_LETTER_MARK),
    LLM_RUN_TAIL(LLM_SET_SPACE_CHAR, LLM_SET_PUNCT_SYMBOL, LLM_SET_BREAK, 0), {.kind = LLM_ALT_BREAKS},
    LLM_SPACES_THEN_ANY, {0}};
static const llm_alt llm_re_spark2_5[] = {
    {.kind = LLM_ALT_RUN, .prefix = LLM_SET_ASCII_PUNCT, .body = LLM_SET_ASCII_LETTER,
     .flags = LLM_ALT_PREFIX_REQUIRED},
    LLM_RUN(LLM_SET_NOT_BREAK_L_P_S, LLM_SET_LETTER_MARK), LLM_RUN(LLM_SET_SPACE_CHAR, LLM_SET_PUNCT_SYMBOL),
    LLM_RUN_MAX(LLM_SET_BREAK, 1), LLM_SPACES_THEN_ANY, {0}};
/* one-alternative regexes */
static const llm_alt llm_re_number[] = {LLM_RUN(0, LLM_SET_NUMBER), {0}};                /* \p{N}+ */
static const llm_alt llm_re_digit[] = {LLM_RUN_MAX(LLM_SET_NUMBER, 1), {0}};             /* \p{N} */
static const llm_alt llm_re_digits3[] = {LLM_RUN_MAX(LLM_SET_NUMBER, 3), {0}};           /* \p{N}{1,3} */
static const llm_alt llm_re_ascii_digits3[] = {                                         /* [0-9][0-9][0-9] */
    {.kind = LLM_ALT_RUN, .body = LLM_SET_ASCII_DIGIT, .min = 3, .max = 3}, {0}};
static const llm_alt llm_re_break[] = {LLM_RUN_MAX(LLM_SET_BREAK, 1), {0}};              /* [\r\n] */
/* [一-龥぀-ゟ゠-ヿ]+ */
static const llm_alt llm_re_han_kana[] = {LLM_RUN(0, LLM_SET_HAN_KANA), {0}};
/* [一-龥ࠀ-一가-퟿]+ */
static const llm_alt llm_re_han_hangul[] = {LLM_RUN(0, LLM_SET_HAN_HANGUL), {0}};
static const llm_alt llm_re_space_letters[] = {LLM_RUN(LLM_SET_SPACE, LLM_SET_LETTER), {0}}; /* \s?\p{L}+ */
static const llm_alt llm_re_space_punct[] = {LLM_RUN(LLM_SET_SPACE, LLM_SET_PUNCT), {0}};    /* \s?\p{P}+ */
/* [\p{P}\$\+<=>\^~\|`]+ and [\p{P}\$\+<=>\^~\|]+ */
static const llm_alt llm_re_punct_falcon[] = {LLM_RUN(0, LLM_SET_PUNCT_FALCON), {0}};
static const llm_alt llm_re_punct_default[] = {LLM_RUN(0, LLM_SET_PUNCT_DEFAULT), {0}};
/* ?[^(\s|.,!?…。，、।۔،)]+ */
static const llm_alt llm_re_bloom[] = {LLM_RUN(LLM_SET_SPACE_CHAR, LLM_SET_BLOOM), {0}};
static const llm_alt llm_re_lines[] = {                                                  /* [^\n]+|[\n]+ */
    LLM_RUN(0, LLM_SET_NOT_NEWLINE), LLM_RUN(0, LLM_SET_NEWLINE), {0}};
/* (?=(\d{3})+(?!\d)) */
static const llm_alt llm_re_digit_groups[] = {{.kind = LLM_ALT_DIGIT_GROUPS}, {0}};
/* tiny_aya's \d{1,3}(?=(?:\d{3})*\b), and afmoe's \p{AFMoE_digits}: llama.cpp's own code, which is
 * \p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N})) */
static const llm_alt llm_re_digit_threes[] = {
    {.kind = LLM_ALT_THREES, .body = LLM_SET_DIGIT, .flags = LLM_ALT_WORD_AFTER}, {0}};
static const llm_alt llm_re_number_threes[] = {{.kind = LLM_ALT_THREES, .body = LLM_SET_NUMBER}, {0}};
/* deepseek-llm: \s?[A-Za-zµÀ-ÖØ-ö...]+, \s?[!-/:-~！-／：-～‘-‟　-。]+ and \s+$ */
static const llm_alt llm_re_space_deepseek_letters[] = {LLM_RUN(LLM_SET_SPACE, LLM_SET_DEEPSEEK_LETTER), {0}};
static const llm_alt llm_re_space_deepseek_punct[] = {LLM_RUN(LLM_SET_SPACE, LLM_SET_DEEPSEEK_PUNCT), {0}};
static const llm_alt llm_re_trailing_spaces[] = {{.kind = LLM_ALT_TRAILING_SPACES}, {0}};
/* youtu:
 * [가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+ */
static const llm_alt llm_re_youtu_cjk[] = {
    LLM_RUN(0, LLM_SET_YOUTU_HANGUL), LLM_RUN(0, LLM_SET_YOUTU_PUNCT), LLM_RUN(0, LLM_SET_BOPOMOFO),
    LLM_RUN(0, LLM_SET_HAN_KANA), {0}};
/* afmoe: [一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟
 * เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+ (one class) */
static const llm_alt llm_re_afmoe_asian[] = {LLM_RUN(0, LLM_SET_AFMOE_ASIAN), {0}};
/* chameleon's image and sentinel tokens: <sentinel:[0-9]+> and (IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z; then
 * ([\t\n]|    |  ) and [\p{P}!-/:-@\[-`{-~] */
static const llm_alt llm_re_sentinel[] = {
    {.kind = LLM_ALT_LITERAL, .before = "<sentinel:", .body = LLM_SET_ASCII_DIGIT, .after = ">"}, {0}};
static const llm_alt llm_re_image[] = {
    {.kind = LLM_ALT_LITERAL, .before = "IMGIMG", .body = LLM_SET_A_TO_I, .max = 4, .after = "Z"}, {0}};
static const llm_alt llm_re_tab_spaces[] = {
    LLM_RUN_MAX(LLM_SET_TAB_NEWLINE, 1), {.kind = LLM_ALT_LITERAL, .before = "    "},
    {.kind = LLM_ALT_LITERAL, .before = "  "}, {0}};
static const llm_alt llm_re_punct_ascii[] = {LLM_RUN_MAX(LLM_SET_PUNCT_ASCII, 1), {0}};

/* The split patterns: each a list of regexes applied one after the other (at most LLM_PRE_MAX_REGEXES, the
 * row ended by NULL), as llama.cpp lists them. deepseek-v3's, for one, first cuts numbers into runs of at
 * most 3 digits, then Han and kana runs, then the rest; each later regex only sees the pieces the earlier
 * ones left (llm_pretokenize). */
enum {
    LLM_PRE_DEFAULT, LLM_PRE_GPT2, LLM_PRE_LLAMA3, LLM_PRE_QWEN2, LLM_PRE_STARCODER, LLM_PRE_FALCON,
    LLM_PRE_DEEPSEEK_CODER, LLM_PRE_DEEPSEEK3, LLM_PRE_SPARK2_5, LLM_PRE_JAIS2, LLM_PRE_QWEN35, LLM_PRE_BLOOM,
    LLM_PRE_VIKING, LLM_PRE_TEKKEN, LLM_PRE_GPT4O, LLM_PRE_GRANITE_MULTI, LLM_PRE_SUPERBPE,
    LLM_PRE_BAILINGMOE,
    LLM_PRE_SEED_CODER, LLM_PRE_UFAKZEKA, LLM_PRE_LAGUNA, LLM_PRE_EXAONE_MOE, LLM_PRE_MINICPM5,
    LLM_PRE_DEEPSEEK_LLM, LLM_PRE_YOUTU, LLM_PRE_TINY_AYA, LLM_PRE_KIMI_K2, LLM_PRE_AFMOE, LLM_PRE_CHAMELEON,
    LLM_PRE_COUNT
};
#define LLM_PRE_MAX_REGEXES 6
static const llm_alt *const llm_pre_regexes[LLM_PRE_COUNT][LLM_PRE_MAX_REGEXES] = {
    [LLM_PRE_DEFAULT] = {llm_re_punct_default, llm_re_gpt2, llm_re_number, llm_re_ascii_digits3},
    [LLM_PRE_GPT2] = {llm_re_gpt2},
    [LLM_PRE_LLAMA3] = {llm_re_llama3},
    [LLM_PRE_QWEN2] = {llm_re_qwen2},
    [LLM_PRE_STARCODER] = {llm_re_digit, llm_re_gpt2},
    [LLM_PRE_FALCON] = {llm_re_punct_falcon, llm_re_gpt2, llm_re_ascii_digits3},
    [LLM_PRE_DEEPSEEK_CODER] = {llm_re_break, llm_re_space_letters, llm_re_space_punct, llm_re_han_hangul,
                                llm_re_digit},
    [LLM_PRE_DEEPSEEK3] = {llm_re_digits3, llm_re_han_kana, llm_re_deepseek3},
    [LLM_PRE_SPARK2_5] = {llm_re_digits3, llm_re_han_kana, llm_re_spark2_5, llm_re_digit},
    [LLM_PRE_JAIS2] = {llm_re_jais2},
    [LLM_PRE_QWEN35] = {llm_re_qwen35},
    [LLM_PRE_BLOOM] = {llm_re_bloom},
    [LLM_PRE_VIKING] = {llm_re_bloom, llm_re_digit},
    [LLM_PRE_TEKKEN] = {llm_re_tekken},
    [LLM_PRE_GPT4O] = {llm_re_gpt4o},
    [LLM_PRE_GRANITE_MULTI] = {llm_re_granite_multi},
    [LLM_PRE_SUPERBPE] = {llm_re_number, llm_re_digit_groups},
    [LLM_PRE_BAILINGMOE] = {llm_re_bailingmoe},
    [LLM_PRE_SEED_CODER] = {llm_re_seed_coder},
    [LLM_PRE_UFAKZEKA] = {llm_re_ufakzeka},
    [LLM_PRE_LAGUNA] = {llm_re_lines, llm_re_qwen2},
    [LLM_PRE_EXAONE_MOE] = {llm_re_exaone_moe},
    [LLM_PRE_MINICPM5] = {llm_re_digits3, llm_re_minicpm5},
    [LLM_PRE_DEEPSEEK_LLM] = {llm_re_break, llm_re_space_deepseek_letters, llm_re_space_deepseek_punct,
                              llm_re_trailing_spaces, llm_re_han_hangul, llm_re_number},
    [LLM_PRE_YOUTU] = {llm_re_youtu_cjk, llm_re_youtu},
    [LLM_PRE_TINY_AYA] = {llm_re_digit_threes, llm_re_tiny_aya},
    [LLM_PRE_KIMI_K2] = {llm_re_kimi_k2},
    [LLM_PRE_AFMOE] = {llm_re_number_threes, llm_re_afmoe_asian, llm_re_deepseek3},
    [LLM_PRE_CHAMELEON] = {llm_re_sentinel, llm_re_image, llm_re_tab_spaces, llm_re_digit, llm_re_punct_ascii,
                           llm_re_gpt2},
};

/* tokenizer.ggml.pre names, as llama.cpp maps them to patterns, with what else the name sets there. The
 * converter that wrote the GGUF (llama.cpp's convert_hf_to_gguf.py) names the pre-tokenizer by a hash of the
 * ids the model's own tokenizer gives a fixed test text, so a name stands for a split the model was trained
 * with; several names share one split. Names are matched exactly. */
/* What a name sets besides its split: ignore_merges (a word that is a token is taken whole), and BOS by
 * default when the file has no tokenizer.ggml.add_bos_token */
enum { LLM_PRE_IGNORE_MERGES = 1, LLM_PRE_ADD_BOS = 2 };
static const struct { const char *names; int pre, flags; } llm_pre_names[] = {
    {"default", LLM_PRE_DEFAULT, 0},
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", LLM_PRE_LLAMA3,
     LLM_PRE_IGNORE_MERGES | LLM_PRE_ADD_BOS},
    {"dbrx smaug-bpe glm4 chatglm-bpe", LLM_PRE_LLAMA3, 0},
    {"gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert jina-v1-en "
     "jina-v2-code roberta-bpe mpt olmo jais trillion granite-docling exaone4", LLM_PRE_GPT2, 0},
    {"qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open grok-2", LLM_PRE_QWEN2, 0},
    {"starcoder refact command-r smollm codeshell exaone minerva-7b mellum2", LLM_PRE_STARCODER, 0},
    {"falcon", LLM_PRE_FALCON, 0},
    {"deepseek-coder", LLM_PRE_DEEPSEEK_CODER, 0},
    {"deepseek-v3 hunyuan-dense hy_v4 joyai-llm", LLM_PRE_DEEPSEEK3, 0},
    {"spark2_5", LLM_PRE_SPARK2_5, 0},
    {"jais-2", LLM_PRE_JAIS2, 0},
    {"qwen35", LLM_PRE_QWEN35, 0},
    {"bloom gpt3-finnish poro-chat", LLM_PRE_BLOOM, 0},
    {"viking", LLM_PRE_VIKING, 0},
    {"tekken", LLM_PRE_TEKKEN, LLM_PRE_IGNORE_MERGES | LLM_PRE_ADD_BOS},
    {"gpt-4o llama4 kanana2 talkie minimax-m2", LLM_PRE_GPT4O, 0},
    {"granite-embed-multi-97m", LLM_PRE_GRANITE_MULTI, LLM_PRE_IGNORE_MERGES},
    {"superbpe", LLM_PRE_SUPERBPE, 0},
    {"bailingmoe bailingmoe2 llada-moe", LLM_PRE_BAILINGMOE, 0},
    {"seed-coder", LLM_PRE_SEED_CODER, 0},
    {"ufakzeka", LLM_PRE_UFAKZEKA, 0},
    {"laguna", LLM_PRE_LAGUNA, 0},
    {"exaone-moe", LLM_PRE_EXAONE_MOE, 0},
    {"minicpm5", LLM_PRE_MINICPM5, LLM_PRE_IGNORE_MERGES},
    {"deepseek-llm", LLM_PRE_DEEPSEEK_LLM, 0},
    {"youtu", LLM_PRE_YOUTU, LLM_PRE_IGNORE_MERGES},
    {"tiny_aya cohere2moe", LLM_PRE_TINY_AYA, 0},
    {"kimi-k2", LLM_PRE_KIMI_K2, 0},
    {"afmoe", LLM_PRE_AFMOE, 0},
    {"chameleon", LLM_PRE_CHAMELEON, LLM_PRE_ADD_BOS},
    /* not here, so split as 'default' with a warning: gemma4, granite-embed-multi-311m, sarvam-moe and
     * whitespace, whose words llama.cpp hands to BPE as raw UTF-8 (byte_encode = false; the first three are
     * SentencePiece vocabularies written as BPE, spaces as U+2581), not byte-level BPE */
};

/* The row of llm_pre_names that holds name, or -1. A row's names are one string, separated by single
 * spaces; a name matches whole, never as a prefix ("qwen2" is not "qwen35"). */
static int llm_pre_find(llm_str name) {
    for (size_t r = 0; r < sizeof llm_pre_names / sizeof llm_pre_names[0]; r++) {
        for (const char *s = llm_pre_names[r].names; *s;) {
            size_t len = strcspn(s, " ");
            if (len == name.len && memcmp(s, name.ptr, len) == 0) return (int)r;
            s += len + (s[len] == ' ');
        }
    }
    return -1;
}

/* Cuts the nc characters into words by pattern pre: cut[i] = 1 where a word starts (cut has nc + 1 entries;
 * cut[nc] = 1 ends the last). Each regex of the pattern runs over each piece the regexes before it left,
 * and a match sets a cut at its start and its end; a cut is never removed, so the pieces only get smaller.
 * With gpt2's regex:
 *
 *   text  H e l l o _ w o r l d _ 1 2 3        ("_": a space)
 *   cut   1 0 0 0 0 1 0 0 0 0 0 1 0 0 0 1   ->  "Hello" " world" " 123"
 *
 * An empty match (a look-ahead only, as superbpe's (?=(\d{3})+(?!\d))) sets a cut where it is, and the
 * scan goes on one character further: "1234567" -> "1" "234" "567". */
static void llm_pretokenize(int pre, const uint32_t *cp, const char *cls, int nc, uint8_t *cut) {
    memset(cut, 0, (size_t)nc + 1);
    cut[0] = cut[nc] = 1;
    for (int r = 0; r < LLM_PRE_MAX_REGEXES && llm_pre_regexes[pre][r]; r++) {
        const llm_alt *alts = llm_pre_regexes[pre][r];
        for (int start = 0, end; start < nc; start = end) {
            for (end = start + 1; !cut[end]; end++) {}
            /* the regex's matches in the piece [start, end); the text between them stays as it is */
            llm_run_memo memo = {-1, 0, 0, -1}; /* no run scanned yet in this piece */
            for (int i = start; i < end;) {
                int m = -1;
                for (const llm_alt *a = alts; a->kind != LLM_ALT_END && m < 0; a++)
                    m = llm_alt_match(a, cp, cls, i, end, &memo);
                if (m < 0) { i++; continue; }
                cut[i] = cut[m] = 1;
                i = m > i ? m : i + 1;
            }
        }
    }
}

/* Decodes text[0..len) into code points, their classes and their byte offsets (off has room for one more, the
 * end); returns the number of characters. Bytes that are no UTF-8 are split as llama.cpp splits them, as
 * U+FFFD, one for each maximal subpart; they keep their bytes through BPE. */
static int llm_decode_text(const char *text, size_t len, uint32_t *cp, char *cls, int *off) {
    int nc = 0;
    for (size_t i = 0; i < len; nc++) {
        int k = llm_utf8_check((const unsigned char *)text + i, len - i);
        off[nc] = (int)i;
        cp[nc] = k > 0 ? llm_utf8_decode((const unsigned char *)text + i, k) : 0xFFFD;
        cls[nc] = (char)llm_uni_class(cp[nc]);
        /* k == 0: a character cut short by the end of the text */
        i += k > 0 ? (size_t)k : k < 0 ? (size_t)-k : len - i;
    }
    off[nc] = (int)len;
    return nc;
}

/* ---- Byte-level BPE: words ----------------------------------------------------------------------------- */
/* Tokenizes one word w[0..n) (raw bytes). sym has room for n symbols, buf for 2 * t->max_len bytes (a
 * byte's stand-in is 1 or 2 bytes of UTF-8). The symbols are the word's bytes, each with the id of the
 * token that spells the byte's stand-in (byte_token); the merges then work on ids only, never on text,
 * because a pair's merge is looked up by its two ids. */
static void llm_bpe_word(const llm_tokenizer *t, const char *w, int n, llm_sym *sym, char *buf, llm_out *o) {
    if (t->ignore_merges && (size_t)n <= t->max_len) {
        /* a word that is itself a token is taken whole, even where the merges would split it differently */
        size_t m = 0;
        for (int i = 0; i < n; i++) m += (size_t)llm_utf8_encode(t->byte_char[(unsigned char)w[i]], buf + m);
        int id = llm_tok_find(t, buf, m);
        if (id >= 0) { llm_out_put(o, id); return; }
    }
    for (int i = 0; i < n; i++) {
        llm_sym x = {i, 1, i - 1, i + 1 < n ? i + 1 : -1, t->byte_token[(unsigned char)w[i]]};
        sym[i] = x;
    }
    llm_merge_symbols(t, w, sym, n);
    /* a symbol is a token unless the vocabulary lacks one of the 256 bytes: then <unk> if it has one */
    for (int i = n ? 0 : -1; i >= 0; i = sym[i].next) llm_out_put(o, sym[i].id >= 0 ? sym[i].id : t->unk);
}

/* Tokenizes text[0..len) with a byte-level BPE vocabulary, appending to o (o->failed on no memory): the
 * text decoded to classified code points, cut into words by the pre-tokenizer, each word merged on its
 * own. The arrays are sized for the whole text once, and each word reuses sym and buf. */
static void llm_tokenize_bpe(const llm_tokenizer *t, const char *text, size_t len, llm_out *o) {
    if (len == 0) return;
    uint32_t *cp = (uint32_t *)malloc(len * sizeof *cp);
    char *cls = (char *)malloc(len);
    uint8_t *cut = (uint8_t *)malloc(len + 1);
    int *off = (int *)malloc((len + 1) * sizeof *off);
    llm_sym *sym = (llm_sym *)malloc(len * sizeof *sym);
    char *buf = (char *)malloc(2 * t->max_len + 1);
    /* one code point, class, cut and offset per byte at most: sized by len, whatever the text holds */
    if (cp && cls && cut && off && sym && buf) {
        int nc = llm_decode_text(text, len, cp, cls, off);
        llm_pretokenize(t->pre, cp, cls, nc, cut);
        /* each word, from one cut to the next, as its bytes (off maps characters back to bytes) */
        for (int i = 0, end; i < nc; i = end) {
            for (end = i + 1; !cut[end]; end++) {}
            llm_bpe_word(t, text + off[i], off[end] - off[i], sym, buf, o);
        }
    } else o->failed = 1;
    free(cp); free(cls); free(cut); free(off); free(sym); free(buf);
}

/* ---- Public: tokenize ---------------------------------------------------------------------------------- */
/* The longest special token at s, or -1: a control token only when parse_special, a user-defined one always
 * (as llama.cpp and Hugging Face's tokenizers take them); of two with one text, the lower id. A scan of
 * every special token at each position whose first byte can start one cost text x tokens (Llama 3's 256
 * all start "<|": an 8 MB prompt of "<|" spent 8 s here), so the search is by text instead: e, the last
 * special text <= s in byte order (a binary search), then up the chain of its prefixes (special_up). Each
 * special text that is a prefix of s is on that chain: it sorts between itself and s, so does e, and what
 * sorts between a prefix of s and s starts with that prefix. The first on the chain within the bytes e
 * and s share is the longest. Work per position: log2(tokens) comparisons and the chain's length, both
 * bounded by the vocabulary, not by the text; llm_tokenize calls it only where special_start says some
 * special token starts with the byte there. */
static int llm_special_at(const llm_tokenizer *t, const char *s, size_t n, int parse_special, size_t *len) {
    const int *by = t->special_text;
    ptrdiff_t lo = 0, hi = arrlen(by);
    while (lo < hi) { /* lo: how many special texts are <= s */
        ptrdiff_t mid = lo + (hi - lo) / 2;
        llm_str x = t->text[by[mid]];
        int c = memcmp(x.ptr, s, x.len < n ? x.len : n);
        if (c < 0 || (c == 0 && x.len <= n)) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return -1;
    llm_str e = t->text[by[lo - 1]];
    size_t shared = 0; /* the bytes e and s share */
    while (shared < e.len && shared < n && e.ptr[shared] == s[shared]) shared++;
    for (int k = t->special_head[lo - 1]; k >= 0; k = t->special_up[k]) {
        llm_str x = t->text[by[k]];
        if (x.len > shared) continue; /* no prefix of s: a shorter one up the chain may be */
        /* that text's ids, lowest first */
        for (ptrdiff_t j = k; j < arrlen(by) && t->special_head[j] == k; j++)
            if (parse_special || t->type[by[j]] == LLM_TOKEN_USER) { *len = x.len; return by[j]; }
    }
    return -1;
}

/* One part of a text with no special token in it, by the vocabulary's kind */
static void llm_tokenize_text(const llm_tokenizer *t, const char *s, size_t n, llm_out *o) {
    /* every part of the text starts the text or follows a special token: either way llama.cpp gives it
     * SentencePiece's space prefix */
    if (t->kind == LLM_VOCAB_SPM) llm_tokenize_spm(t, s, n, t->add_space_prefix, o);
    else llm_tokenize_bpe(t, s, n, o);
}

/* add_bos also appends EOS when the vocabulary asks for it (add_eos_token), as llama.cpp's add_special
 * does. Returns the number of ids, which may exceed cap (then only the first cap are in out: call again
 * with room for them all), or -1 for bad arguments, a text over INT32_MAX / 4 bytes or no memory. The
 * text is scanned once for special tokens; the plain text between two of them (or the text's ends) is
 * tokenized as a text of its own, so no token ever spans a special token's edge. */
int llm_tokenize(const llm_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                 int32_t *out, int cap) {
    if (!t || (!text && len) || cap < 0 || (!out && cap > 0)) return -1;
    if (len > (size_t)INT32_MAX / 4) return -1; /* offsets are ints: tokenize such a text in parts */
    /* 1. BOS (a vocabulary without one has bos -1, which llm_out_put skips) */
    llm_out o = {out, cap, 0, 0};
    if (add_bos) llm_out_put(&o, t->bos);
    /* 2. text between special tokens is tokenized on its own, as if each part were a whole text */
    size_t start = 0;
    for (size_t i = 0; i < len && !o.failed;) {
        size_t n = 0;
        int id = -1;
        if (t->special_start[(unsigned char)text[i]])
            id = llm_special_at(t, text + i, len - i, parse_special, &n);
        if (id < 0) { i++; continue; }
        if (i > start) llm_tokenize_text(t, text + start, i - start, &o);
        llm_out_put(&o, id);
        start = i += n;
    }
    /* 3. the text after the last special token; then EOS where the vocabulary asks for it */
    if (len > start && !o.failed) llm_tokenize_text(t, text + start, len - start, &o);
    if (add_bos && t->add_eos) llm_out_put(&o, t->eos);
    return o.failed ? -1 : o.n;
}

/* ---- Loading ------------------------------------------------------------------------------------------- */
/* A special token's id from the GGUF key, fallback when absent; -1 when it is out of the vocabulary, so a
 * bad file cannot make the engine index past the token arrays. */
static int llm_tok_id_key(const llm_gguf *g, const char *key, int fallback, int n_vocab) {
    int64_t v = llm_gguf_int(g, key, fallback); /* absent ids are stored as -1 or as 2^32 - 1 */
    return v >= 0 && v < n_vocab ? (int)v : -1;
}

/* The special tokens' order: longest text first, so that the first match is the longest (a text like
 * "<|im_end|>" must not be read as a shorter token it starts with); equal lengths by id, so the order does
 * not depend on qsort's */
typedef struct { size_t len; int id; } llm_special_sort;
static int llm_special_cmp(const void *a, const void *b) { /* longest text first, then lowest id */
    const llm_special_sort *x = (const llm_special_sort *)a, *y = (const llm_special_sort *)b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id - y->id;
}

/* The special tokens by text: bytes in order, a prefix first, then the lower id */
typedef struct { llm_str text; int id; } llm_special_text;
static int llm_special_text_cmp(const void *a, const void *b) {
    const llm_special_text *x = (const llm_special_text *)a, *y = (const llm_special_text *)b;
    int c = memcmp(x->text.ptr, y->text.ptr, x->text.len < y->text.len ? x->text.len : y->text.len);
    if (c) return c;
    if (x->text.len != y->text.len) return x->text.len < y->text.len ? -1 : 1;
    return x->id - y->id;
}

/* Adds id to the end-of-generation set unless it is -1 or there already (the set is a few ids: a scan) */
static void llm_add_eog(llm_tokenizer *t, int id) {
    if (id < 0) return;
    for (ptrdiff_t i = 0; i < arrlen(t->eog); i++) if (t->eog[i] == id) return;
    arrput(t->eog, id);
}

/* Builds the tokenizer from the GGUF's keys. The token texts stay in the GGUF (t->text points into it, so
 * the GGUF must outlive the tokenizer); the maps are built here. The steps: check the keys' types and sizes
 * (a file is input like any other); copy the types and scores, refusing scores no float holds; the map
 * text -> id; GPT-2's byte stand-ins and each byte's token; the merges by id pair; the special tokens,
 * longest first; the special ids and flags; the end-of-generation set. An unknown pre-tokenizer is no
 * error: it splits as 'default', with a warning (t->warning). NULL and a message in err on error. */
llm_tokenizer *llm_tokenizer_load(const llm_gguf *g, char *err) {
    llm_str model = llm_gguf_string(g, "tokenizer.ggml.model");
    llm_str pre = llm_gguf_string(g, "tokenizer.ggml.pre");
    const llm_gguf_kv *tokens = llm_gguf_find(g, "tokenizer.ggml.tokens");
    const llm_gguf_kv *scores = llm_gguf_find(g, "tokenizer.ggml.scores");
    const llm_gguf_kv *types = llm_gguf_find(g, "tokenizer.ggml.token_type");
    const llm_gguf_kv *merges = llm_gguf_find(g, "tokenizer.ggml.merges");
    int kind, pre_row = 0; /* the row of llm_pre_names */
    char warning[LLM_ERR_LEN] = "";
    char *key = NULL;

    /* 1. the keys: a kind this engine knows, the arrays of the vocabulary's size, the pre-tokenizer */
    if (!model.ptr) {
        llm_fail(err, "the GGUF file has no tokenizer (no tokenizer.ggml.model)");
        return NULL;
    }
    if (llm_str_eq(model, "llama")) kind = LLM_VOCAB_SPM;
    else if (llm_str_eq(model, "gpt2")) kind = LLM_VOCAB_BPE;
    else {
        llm_fail(err, "unsupported tokenizer.ggml.model '%.*s' (supported: llama, gpt2)", (int)model.len,
                 model.ptr);
        return NULL;
    }
    if (!tokens || tokens->type != LLM_GGUF_ARRAY || tokens->arr_type != LLM_GGUF_STRING ||
        tokens->arr_len == 0 || tokens->arr_len > INT32_MAX) {
        llm_fail(err, "tokenizer.ggml.tokens is missing or is not a list of strings"); return NULL;
    }
    uint64_t n = tokens->arr_len;
    if (scores && (scores->type != LLM_GGUF_ARRAY || scores->arr_type == LLM_GGUF_STRING ||
                   scores->arr_len != n)) {
        llm_fail(err, "tokenizer.ggml.scores is not a list of %llu numbers", (unsigned long long)n);
        return NULL;
    }
    if (types && (types->type != LLM_GGUF_ARRAY || types->arr_type == LLM_GGUF_STRING ||
                  types->arr_len != n)) {
        llm_fail(err, "tokenizer.ggml.token_type is not a list of %llu numbers", (unsigned long long)n);
        return NULL;
    }
    /* gpt2: the merges are required; a missing or unknown pre-tokenizer only warns */
    if (kind == LLM_VOCAB_BPE) {
        if (!merges || merges->type != LLM_GGUF_ARRAY || merges->arr_type != LLM_GGUF_STRING) {
            llm_fail(err, "a gpt2 tokenizer needs tokenizer.ggml.merges (a list of strings)"); return NULL;
        }
        if (!pre.ptr) {
            pre_row = 0;
            snprintf(warning, sizeof warning, "the vocabulary names no pre-tokenizer (tokenizer.ggml.pre): "
                     "splitting as 'default' does, which may give other ids than the model was trained on");
        } else if ((pre_row = llm_pre_find(pre)) < 0) {
            /* as llama.cpp's 'default', which is what it uses when it is given no name */
            pre_row = 0;
            snprintf(warning, sizeof warning, "unknown pre-tokenizer '%.*s' "
                                              "(tokenizer.ggml.pre): splitting as "
                     "'default' does, which may give other ids than the model was trained on",
                     (int)(pre.len < 64 ? pre.len : 64), pre.ptr);
        }
    }

    /* 2. each token's type and score, and the longest text (llm_tok_find's bound) */
    llm_tokenizer *t = (llm_tokenizer *)calloc(1, sizeof *t);
    if (!t) { llm_fail(err, "out of memory loading the tokenizer"); return NULL; }
    t->kind = kind; t->n_vocab = (int)n; t->text = tokens->strs;
    t->pre = llm_pre_names[pre_row].pre;
    int pre_flags = kind == LLM_VOCAB_BPE ? llm_pre_names[pre_row].flags : 0;
    memcpy(t->warning, warning, sizeof warning);
    t->score = (float *)calloc(n, sizeof *t->score);
    t->type = (uint8_t *)malloc(n);
    if (!t->score || !t->type) goto oom;
    for (uint64_t i = 0; i < n; i++) {
        int64_t ty = types ? llm_gguf_arr_int(types, i) : LLM_TOKEN_NORMAL;
        t->type[i] = ty >= LLM_TOKEN_NORMAL && ty <= LLM_TOKEN_BYTE ? (uint8_t)ty : LLM_TOKEN_NORMAL;
        double score = scores ? llm_gguf_arr_float(scores, i) : 0;
        if (!(fabs(score) <= 3.4e38)) { /* NaN, infinities and what no float can hold */
            llm_fail(err, "tokenizer.ggml.scores[%llu] is %g: scores must be finite numbers",
                     (unsigned long long)i, score);
            goto fail;
        }
        t->score[i] = (float)score;
        if (t->text[i].len > t->max_len) t->max_len = t->text[i].len;
    }

    /* 3. token text -> id; where a text repeats, the last id wins, as in llama.cpp */
    if (!(key = (char *)malloc(t->max_len + 1))) goto oom;
    sh_new_arena(t->ids);
    for (uint64_t i = 0; i < n; i++) {
        llm_str s = t->text[i];
        if (s.len == 0 || memchr(s.ptr, 0, s.len)) continue; /* no C-string key for these: never looked up */
        memcpy(key, s.ptr, s.len); key[s.len] = 0;
        shput(t->ids, key, (int)i);
    }

    /* 4. GPT-2 gives every byte a printable stand-in so that no token has spaces or control bytes in it: the
     * printable Latin-1 bytes stand for themselves, the other 68 take U+0100 onwards in byte order:
     *   byte 0x00 -> U+0100 "Ā", ..., 0x20 (space) -> U+0120 "Ġ", 0x21 '!' -> '!', 0x0A (\n) -> U+010A "Ċ"
     * so " world" is the token text "Ġworld". byte_char maps a byte to its stand-in, char_byte back (the
     * detokenizer's way from token text to bytes), byte_token a byte to the token that spells it. */
    for (int c = 0; c < 324; c++) t->char_byte[c] = -1;
    for (int b = 0, extra = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        t->byte_char[b] = (uint16_t)(printable ? b : 256 + extra++);
        t->char_byte[t->byte_char[b]] = (int16_t)b;
    }
    for (int b = 0; b < 256; b++) {
        char s[8];
        if (kind == LLM_VOCAB_SPM) {
            /* SentencePiece's byte fallback tokens; failing those, a token that is the byte itself */
            snprintf(s, sizeof s, "<0x%02X>", b);
            t->byte_token[b] = llm_tok_find(t, s, 6);
            if (t->byte_token[b] < 0) { s[0] = (char)b; t->byte_token[b] = llm_tok_find(t, s, 1); }
        } else {
            t->byte_token[b] = llm_tok_find(t, s, (size_t)llm_utf8_encode(t->byte_char[b], s));
        }
    }
    if (kind == LLM_VOCAB_SPM && !types) /* with no types given, the <0xNN> tokens still decode as bytes */
        for (int b = 0; b < 256; b++)
            if (t->byte_token[b] >= 0 && t->text[t->byte_token[b]].len == 6)
                t->type[t->byte_token[b]] = LLM_TOKEN_BYTE;

    /* 5. merges: "left right", rank = line number. We keep them by the ids of the two halves; a line whose
     * halves or whole are no tokens could never apply to our symbols (which are always tokens) and is
     * dropped. Going from the last line up lets a pair listed twice keep its first rank without a lookup. */
    if (kind == LLM_VOCAB_BPE) {
        for (uint64_t i = merges->arr_len < INT32_MAX ? merges->arr_len : INT32_MAX; i-- > 0;) {
            llm_str m = merges->strs[i];
            const char *sp = m.len > 1 ? (const char *)memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
            if (!sp) continue;
            size_t la = (size_t)(sp - m.ptr), lb = m.len - la - 1;
            if (la + lb > t->max_len) continue;
            int a = llm_tok_find(t, m.ptr, la), b = llm_tok_find(t, sp + 1, lb);
            memcpy(key, m.ptr, la); memcpy(key + la, sp + 1, lb);
            int ab = llm_tok_find(t, key, la + lb);
            if (a < 0 || b < 0 || ab < 0) continue;
            uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
            llm_merge v = {(int)i, ab};
            hmput(t->merges, k, v);
        }
        /* llama-bpe and others take a word that is a token whole (llama.cpp's ignore_merges) */
        t->ignore_merges = (pre_flags & LLM_PRE_IGNORE_MERGES) != 0;
    }

    /* 6. the control tokens of a tool-call syntax are text in the output, as user-defined tokens are: the
     * reply's reader finds the calls by them, and the grammar writes them (llama.cpp's "preserved tokens";
     * vLLM keeps special tokens for Mistral's calls) */
    static const char *const marker_texts[] = {"[TOOL_CALLS]", "[CALL_ID]", "[ARGS]", "<|channel|>",
                                               "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"};
    /* gpt-oss's harmony messages: <|start|>assistant<|channel|>final<|message|>...<|end|>, the reply's
     * reader splits them by their markers (its turn ends at <|return|> or <|call|>: <|end|> only closes a
     * message, and is a marker only there: Phi-3 ends its turns with it) */
    int harmony = 0;
    for (uint64_t i = 0; i < n; i++)
        harmony |= t->type[i] == LLM_TOKEN_CONTROL && llm_str_eq(t->text[i], "<|channel|>");
    for (uint64_t i = 0; i < n; i++)
        for (size_t k = 0; k < sizeof marker_texts / sizeof marker_texts[0] - !harmony; k++)
            if (t->type[i] == LLM_TOKEN_CONTROL && llm_str_eq(t->text[i], marker_texts[k]))
                t->type[i] = LLM_TOKEN_USER;

    /* 7. special tokens, matched in the text when the caller asks: longest first, so that "<|im_end|>" is not
     * taken for a shorter token that is a prefix of it */
    llm_special_sort *sp = NULL;
    for (uint64_t i = 0; i < n; i++) {
        if ((t->type[i] == LLM_TOKEN_CONTROL || t->type[i] == LLM_TOKEN_USER) && t->text[i].len > 0) {
            llm_special_sort x = {t->text[i].len, (int)i};
            arrput(sp, x);
        }
    }
    if (arrlen(sp) > 1) qsort(sp, (size_t)arrlen(sp), sizeof *sp, llm_special_cmp);
    for (ptrdiff_t i = 0; i < arrlen(sp); i++) {
        arrput(t->special, sp[i].id);
        t->special_start[(unsigned char)t->text[sp[i].id].ptr[0]] = 1;
    }
    /* ... and by text for llm_special_at: each text's first, and the first of its longest proper prefix,
     * from a stack that holds the chain of prefixes of the text before (in byte order a text's prefixes
     * come before it, and what sorts between them and it starts with them) */
    llm_special_text *by = NULL;
    for (ptrdiff_t i = 0; i < arrlen(sp); i++) {
        llm_special_text x = {t->text[sp[i].id], sp[i].id};
        arrput(by, x);
    }
    if (arrlen(by) > 1) qsort(by, (size_t)arrlen(by), sizeof *by, llm_special_text_cmp);
    int *chain = NULL;
    for (ptrdiff_t i = 0; i < arrlen(by); i++) {
        llm_str x = by[i].text, before = i > 0 ? by[i - 1].text : x;
        arrput(t->special_text, by[i].id);
        if (i > 0 && before.len == x.len && memcmp(before.ptr, x.ptr, x.len) == 0) { /* the same text */
            arrput(t->special_head, t->special_head[i - 1]);
            arrput(t->special_up, t->special_up[i - 1]);
            continue;
        }
        while (arrlen(chain)) { /* down to the longest text before that is a prefix of this one */
            llm_str p = by[arrlast(chain)].text;
            if (p.len < x.len && memcmp(p.ptr, x.ptr, p.len) == 0) break;
            (void)arrpop(chain);
        }
        arrput(t->special_head, (int)i);
        arrput(t->special_up, arrlen(chain) ? arrlast(chain) : -1);
        arrput(chain, (int)i);
    }
    arrfree(chain); arrfree(by);
    arrfree(sp);

    /* 8. the special ids; llama.cpp's defaults for SentencePiece where the file gives none (<unk> 0, <s> 1,
     * </s> 2, as in Llama 2's vocabulary); an id past the vocabulary is taken as none */
    int spm = kind == LLM_VOCAB_SPM;
    t->bos = llm_tok_id_key(g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, t->n_vocab);
    t->eos = llm_tok_id_key(g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, t->n_vocab);
    t->unk = llm_tok_id_key(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, t->n_vocab);
    t->eot = llm_tok_id_key(g, "tokenizer.ggml.eot_token_id", -1, t->n_vocab);
    t->eom = llm_tok_id_key(g, "tokenizer.ggml.eom_token_id", -1, t->n_vocab);
    /* BOS by default for SentencePiece and, as llama.cpp does, for llama-bpe and the others whose names say
     * so; the file's key overrides */
    t->add_bos = llm_gguf_int(g, "tokenizer.ggml.add_bos_token", spm || (pre_flags & LLM_PRE_ADD_BOS)) != 0;
    t->add_eos = llm_gguf_int(g, "tokenizer.ggml.add_eos_token", 0) != 0;
    t->add_space_prefix = llm_gguf_int(g, "tokenizer.ggml.add_space_prefix", spm) != 0;

    /* 9. end of generation: eos, eot, eom, and the control tokens chat models end their turns with. A
     * request's generation stops at any of them unless it asks not to (ignore_eos). */
    static const char *const eog_texts[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end_of_text|>",
                                            "<|endoftext|>", "<end_of_turn>", "</s>", "<|end|>", "<|return|>",
                                            "<|call|>"};
    llm_add_eog(t, t->eos); llm_add_eog(t, t->eot); llm_add_eog(t, t->eom);
    for (ptrdiff_t i = 0; i < arrlen(t->special); i++) {
        int id = t->special[i];
        if (t->type[id] != LLM_TOKEN_CONTROL) continue;
        for (size_t k = 0; k < sizeof eog_texts / sizeof eog_texts[0]; k++)
            if (llm_str_eq(t->text[id], eog_texts[k])) llm_add_eog(t, id);
    }
    free(key);
    return t;
oom:
    llm_fail(err, "out of memory loading the tokenizer");
fail:
    free(key);
    llm_tokenizer_free(t);
    return NULL;
}

/* Frees what load allocated; the token texts belong to the GGUF, which the caller closes after this */
void llm_tokenizer_free(llm_tokenizer *t) {
    if (!t) return;
    free(t->score); free(t->type);
    shfree(t->ids); hmfree(t->merges);
    arrfree(t->special); arrfree(t->special_text); arrfree(t->special_head); arrfree(t->special_up);
    arrfree(t->eog);
    free(t);
}

int llm_tokenizer_n_vocab(const llm_tokenizer *t) { return t ? t->n_vocab : 0; }
int llm_tokenizer_bos(const llm_tokenizer *t) { return t ? t->bos : -1; }
int llm_tokenizer_eos(const llm_tokenizer *t) { return t ? t->eos : -1; }
int llm_tokenizer_adds_bos(const llm_tokenizer *t) { return t ? t->add_bos : 0; }
int llm_tokenizer_adds_eos(const llm_tokenizer *t) { return t ? t->add_eos : 0; }

/* A scan of the few end-of-generation ids (eos, eot, eom and the turn-ending control tokens) */
int llm_tokenizer_is_eog(const llm_tokenizer *t, int32_t id) {
    if (!t || id < 0) return 0;
    for (ptrdiff_t i = 0; i < arrlen(t->eog); i++) if (t->eog[i] == id) return 1;
    return 0;
}

const char *llm_tokenizer_warning(const llm_tokenizer *t) { return t ? t->warning : ""; }

/* Special tokens parsed, and BOS added when the vocabulary asks for it (add_bos) and the text does not begin
 * with BOS's text already: a rendered chat template often writes it, and a doubled BOS changes what the
 * model reads. */
int llm_tokenize_prompt(const llm_tokenizer *t, const char *text, size_t len, int32_t *out, int cap) {
    if (!t || (!text && len)) return -1;
    size_t n = 0;
    int first = len && t->special_start[(unsigned char)text[0]] ? llm_special_at(t, text, len, 1, &n) : -1;
    return llm_tokenize(t, text, len, t->add_bos && first != t->bos, 1, out, cap);
}

/* ===========================================================================================================
 * 4. Chat templates
 * A chat template is a Jinja program, but the ones models ship fall into a few families that differ in their
 * markers and in small ways (where the system prompt goes, what is trimmed, whether BOS is written). So, as
 * llama.cpp does, we recognise the family by its markers and write each one out by hand. Each family below
 * names the published template it follows; the tests render a fixed conversation with each and compare it
 * with what that template renders (Hugging Face's apply_chat_template: trim_blocks, lstrip_blocks).
 *
 * Takes in: the GGUF's tokenizer.chat_template text (or only the vocabulary, when there is none), then per
 * request a list of messages and the request's tools. Hands on: one text, the prompt, which the engine
 * tokenizes with special tokens parsed (llm_tokenize_prompt), and the ids that end the answer's turn. A
 * ChatML conversation with the generation prompt:
 *
 *   <|im_start|>system\nYou are brief.<|im_end|>\n
 *   <|im_start|>user\nHi<|im_end|>\n
 *   <|im_start|>assistant\n                       <- the generation prompt: the model writes from here
 *   Hello!<|im_end|>                              <- its answer; <|im_end|> is a stop id (llm_chat_stop_ids)
 *
 * How much of Jinja runs: none. The template text is never executed: it is only searched for fixed strings,
 * the markers that tell its family (llm_chat_detect), a few features (tools, dates, thinking) and two
 * literal default system prompts (ChatML's, Mistral Small 3.2's). What the template's {% for %}, {% if %},
 * filters (trim, tojson) and raise_exception do is written in C, once per family (llm_chat_render), for what
 * that family's published template does. Hence the bounds: a template only picks a family and those
 * features, and cannot make the engine loop, recurse or allocate on its behalf; rendering is one pass over
 * the messages (llm_chat_render calls itself once at most, for the generic tool format); the output is the
 * messages' and tools' text with a fixed markup per message, except that Mistral's families write the tools
 * before each user message equal to the last one, as their templates do. Where a family's template would
 * raise an exception (a role it does not know, turns that do not alternate where Mistral's templates check
 * it, a Mistral call id not 9 long, a Llama 3 turn with two calls), llm_chat_render returns -1. The price:
 * a fine-tune that changed its template's markup is rendered as its family, not as written; when no family
 * matches, ChatML is used and ct->note says so.
 *
 * Why byte for byte: a chat model was fine-tuned on text its template wrote, and a newline more or a space
 * less gives other tokens, a prompt the model never saw in that form, and worse answers; it also changes
 * which blocks the prefix cache can share between requests. Hence the exact trims, the Python-style JSON
 * (tojson) and the BOS written as text where the template writes it (llm_tokenize_prompt then adds none).
 *
 * The generation prompt (add_generation_prompt) opens an assistant turn after the conversation so that the
 * model's next tokens are the answer: "<|im_start|>assistant\n" (ChatML), "<start_of_turn>model\n" (Gemma),
 * "<|start|>assistant" (gpt-oss, whose model then names its channel). Llama 2 and the Mistral families
 * write none: a user turn ends with [/INST], and the answer follows it directly.
 *
 * llm_chat_render keeps no state between calls and only reads ct, so any number of threads may render
 * with one template at once; llm_chat_template_init is the only place that reads the clock.
 *
 * vLLM renders the template itself with Jinja (Hugging Face's apply_chat_template); this follows
 * llama.cpp's hand-written templates (src/llama-chat.cpp) instead. Read first: llm_chat_template_init, then
 * llm_chat_render's ChatML case (the switch's default) and one other family.
 * ======================================================================================================== */
/* The families' names, in enum llm_chat_family's order: what --chat-template and the logs call them */
static const char *llm_chat_family_names[LLM_CHAT_NFAMILIES] = {
    "chatml", "qwen3", "llama3", "llama2", "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7",
    "mistral-v7-tekken", "zephyr", "phi3", "gemma", "qwq", "gpt-oss"
};

const char *llm_chat_family_name(int family) {
    return family >= 0 && family < LLM_CHAT_NFAMILIES ? llm_chat_family_names[family] : NULL;
}

/* The family of a name given by the user (--chat-template); -1 for none, which init turns into ChatML with
 * a note listing the known names */
int llm_chat_family_from_name(const char *name) {
    for (int f = 0; name && f < LLM_CHAT_NFAMILIES; f++)
        if (!strcmp(name, llm_chat_family_names[f])) return f;
    return -1;
}

/* The template text is a counted string (a GGUF string has no NUL), so strstr cannot search it */
static const char *llm_find(const char *s, size_t n, const char *what) { /* what in s[0..n), or NULL */
    size_t m = strlen(what);
    for (size_t i = 0; m <= n && i <= n - m; i++)
        if (s[i] == what[0] && !memcmp(s + i, what, m)) return s + i;
    return NULL;
}
static int llm_has(const char *s, size_t n, const char *what) { return llm_find(s, n, what) != NULL; }

/* Whether the vocabulary has a token spelled text: the fallback evidence when a model has no template */
static int llm_vocab_has(const llm_tokenizer *t, const char *text) {
    return t && llm_tok_find(t, text, strlen(text)) >= 0;
}

/* Each family's markers, checked most specific first (the order of llama.cpp's llm_chat_detect_template).
 * The order matters because families share markers: Qwen3's and QwQ's templates are ChatML with <think>
 * added, so <|im_start|> alone says ChatML only once the thinking markers are ruled out; Phi-3 and Zephyr
 * both write <|user|>, and only Phi-3 ends turns with <|end|>; every Mistral template and Llama 2's write
 * [INST], and what tells them apart is the spacing around it in the template's own strings. The markers are
 * the template's literal text, so a template that builds them from pieces is not recognised (-1: the caller
 * falls back to ChatML). Without a template the vocabulary's special tokens are all there is: they tell the
 * family but not its variant, so one variant stands for each (Mistral v3 for [INST], v7-tekken for
 * [SYSTEM_PROMPT], Qwen3 for <|im_start|> with <think>). */
int llm_chat_detect(const char *tt, size_t n, const llm_tokenizer *t) {
    if (tt && n) {
        if (llm_has(tt, n, "<|channel|>")) return LLM_CHAT_GPT_OSS; /* OpenAI's harmony format */
        if (llm_has(tt, n, "<|im_start|>")) { /* QwQ: the thinking of earlier answers cut, none kept apart */
            if (llm_has(tt, n, "<think>") && !llm_has(tt, n, "reasoning_content") &&
                llm_has(tt, n, "split('</think>')"))
                return LLM_CHAT_QWQ;
            return llm_has(tt, n, "<think>") || llm_has(tt, n, "enable_thinking") ? LLM_CHAT_QWEN3
                                                                                   : LLM_CHAT_CHATML;
        }
        if (llm_has(tt, n, "<|start_header_id|>")) return LLM_CHAT_LLAMA3;
        if (llm_has(tt, n, "<start_of_turn>")) return LLM_CHAT_GEMMA;
        if (llm_has(tt, n, "<|user|>")) return llm_has(tt, n, "<|end|>") ? LLM_CHAT_PHI3 : LLM_CHAT_ZEPHYR;
        if (llm_has(tt, n, "[SYSTEM_PROMPT]"))
            return llm_has(tt, n, "[INST] ") ? LLM_CHAT_MISTRAL_V7 : LLM_CHAT_MISTRAL_V7_TEKKEN;
        if (llm_has(tt, n, "[INST]")) {
            /* Mistral's own templates: the v1 one puts a space before [INST]; v3-tekken none after it */
            if (llm_has(tt, n, "' [INST] ' + system_message") || llm_has(tt, n, "[AVAILABLE_TOOLS]")) {
                if (llm_has(tt, n, " [INST]")) return LLM_CHAT_MISTRAL_V1;
                return llm_has(tt, n, "\"[INST]\"") ? LLM_CHAT_MISTRAL_V3_TEKKEN : LLM_CHAT_MISTRAL_V3;
            }
            return LLM_CHAT_LLAMA2; /* Llama 2 and the templates modelled on it */
        }
        return -1;
    }
    /* no template: the vocabulary's special tokens, in the same order */
    if (llm_vocab_has(t, "<|channel|>")) return LLM_CHAT_GPT_OSS;
    if (llm_vocab_has(t, "<|im_start|>"))
        return llm_vocab_has(t, "<think>") ? LLM_CHAT_QWEN3 : LLM_CHAT_CHATML;
    if (llm_vocab_has(t, "<|start_header_id|>")) return LLM_CHAT_LLAMA3;
    if (llm_vocab_has(t, "<start_of_turn>")) return LLM_CHAT_GEMMA;
    if (llm_vocab_has(t, "<|user|>")) return llm_vocab_has(t, "<|end|>") ? LLM_CHAT_PHI3 : LLM_CHAT_ZEPHYR;
    if (llm_vocab_has(t, "[SYSTEM_PROMPT]")) return LLM_CHAT_MISTRAL_V7_TEKKEN;
    if (llm_vocab_has(t, "[INST]")) return LLM_CHAT_MISTRAL_V3;
    return -1;
}

/* A ChatML template's own system prompt, for conversations without one (SmolLM2: "You are a helpful AI
 * assistant named SmolLM, trained by Hugging Face"; Qwen2.5: "You are Qwen, created by Alibaba Cloud. ..."):
 * the literal text after "<|im_start|>system" and a newline (a real one, or \n inside a Jinja string), up to
 * <|im_end|>. Where an expression follows instead (messages[0]['content']), that is not it. The scan is a
 * heuristic on the template's source, not an evaluation: a quote or '{' before <|im_end|> means the text
 * is not one literal, and the next occurrence of the marker is tried. out holds at most cap - 1 bytes; a
 * prompt that does not fit is not taken (out stays ""). */
static void llm_chat_find_default_system(const char *tt, size_t n, char *out, size_t cap) {
    static const char marker[] = "<|im_start|>system";
    size_t m = sizeof marker - 1;
    out[0] = 0;
    for (size_t i = 0; tt && m <= n && i <= n - m; i++) {
        /* 1. the marker, then a newline written either way; 2. the literal up to <|im_end|> */
        if (memcmp(tt + i, marker, m)) continue;
        size_t j = i + m, k = 0;
        if (j < n && tt[j] == '\n') j++;
        else if (j + 1 < n && tt[j] == '\\' && tt[j + 1] == 'n') j += 2;
        else continue;
        for (; j < n && tt[j] != '\'' && tt[j] != '"' && tt[j] != '{' && k + 1 < cap; j++) {
            if (tt[j] == '<' && j + 10 <= n && !memcmp(tt + j, "<|im_end|>", 10)) { out[k] = 0; return; }
            if (tt[j] == '\\' && j + 1 < n && tt[j + 1] == 'n') { out[k++] = '\n'; j++; }
            else out[k++] = tt[j];
        }
        out[0] = 0; /* an expression, or no <|im_end|>: look further */
    }
}

/* Mistral Small 3.2's own system prompt: `set default_system_message = "..." + today + "..."`, Jinja string
 * literals (with their escapes) and `today`, which the template sets to strftime_now("%Y-%m-%d"). A tiny
 * evaluator of exactly that expression: string literals and `today` joined by +, read until anything else
 * (the %} that ends the statement). The date is taken at init, in local time, and kept in the text: the
 * server inits once, at its start, so it keeps that day. What does not fit in cap is cut. */
static void llm_chat_find_mistral_system(const char *tt, size_t n, char *out, size_t cap) {
    static const char set[] = "set default_system_message = ";
    const char *p = NULL;
    size_t k = 0;
    for (size_t i = 0; tt && i + sizeof set - 1 <= n && !p; i++)
        if (!memcmp(tt + i, set, sizeof set - 1)) p = tt + i;
    out[0] = 0;
    if (!p) return;
    const char *end = tt + n;
    for (p += sizeof set - 1; p < end && k + 1 < cap;) {
        /* the next operand, after the spaces and + that join them: a literal, `today`, or the end */
        while (p < end && (*p == ' ' || *p == '+')) p++;
        if (p < end && (*p == '"' || *p == '\'')) { /* a string literal */
            char q = *p++;
            for (; p < end && *p != q && k + 1 < cap; p++) {
                if (*p == '\\' && p + 1 < end) {
                    p++;
                    out[k++] = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : *p;
                } else out[k++] = *p;
            }
            if (p >= end) break;
            p++;
        } else if (end - p >= 5 && !memcmp(p, "today", 5)) {
            time_t now = time(NULL);
            struct tm tm;
            if (localtime_r(&now, &tm)) k += strftime(out + k, cap - k, "%Y-%m-%d", &tm);
            p += 5;
        } else break; /* %} or anything else: the end */
    }
    out[k] = 0;
}

/* The text of token id as a C string in out; "" when there is no such token or its text does not fit */
static void llm_chat_copy_token_text(const llm_tokenizer *t, int id, char *out, size_t cap) {
    out[0] = 0;
    if (id < 0 || id >= t->n_vocab || t->text[id].len >= cap) return;
    memcpy(out, t->text[id].ptr, t->text[id].len);
    out[t->text[id].len] = 0;
}

/* Everything the render needs, decided once per model: the family, the BOS/EOS texts some families write,
 * the tool format, the default system prompt, the date, the thinking flags. All of it is read from the
 * template's text by llm_has (and the two system prompt scanners), never by running it. ct is a plain
 * value with no pointers: a caller copies it per request to change enable_thinking or reasoning_effort
 * (the server does). Returns -1 only without a tokenizer; an unknown family is a note, not an error. */
int llm_chat_template_init(llm_chat_template *ct, const char *template_text, size_t len,
                           const llm_tokenizer *t, const char *name, char *err) {
    memset(ct, 0, sizeof *ct);
    if (!t) return llm_fail(err, "this model has no vocabulary, so it cannot chat");
    /* 1. the family: the one named, else the one the template's (or vocabulary's) markers tell, else
     * ChatML */
    llm_str tt = {template_text, template_text ? len : 0};
    ct->family = name ? llm_chat_family_from_name(name) : llm_chat_detect(tt.ptr, tt.len, t);
    if (ct->family < 0) {
        ct->family = LLM_CHAT_CHATML;
        if (name) {
            char known[256] = "";
            for (int f = 0; f < LLM_CHAT_NFAMILIES; f++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", f ? ", " : "",
                         llm_chat_family_names[f]);
            snprintf(ct->note, sizeof ct->note, "unknown chat template '%.32s' (known: %.160s): using chatml",
                     name, known);
        } else {
            snprintf(ct->note, sizeof ct->note, "%s: using chatml", tt.len ?
                     "the model's chat template is none this engine knows" :
                     "the model has no chat template and its vocabulary names none");
        }
    }
    /* 2. the BOS and EOS texts: the families that write them write them as text, which the tokenizer turns
     * back into the ids (special tokens parsed) */
    llm_chat_copy_token_text(t, t->bos, ct->bos, sizeof ct->bos);
    llm_chat_copy_token_text(t, t->eos, ct->eos, sizeof ct->eos);
    /* Qwen3 thinks unless told not to: a request's enable_thinking = false turns it off in its copy */
    ct->enable_thinking = 1;
    /* 3. tools: Hermes style where the template (or, without one, the vocabulary) knows <tool_call>;
     * Llama 3.1's JSON calls where it says "Environment: ipython"; Mistral v3's where it writes
     * "[TOOL_CALLS][" (or, with no template, the vocabulary has the token), v11's where it writes [CALL_ID];
     * the generic format elsewhere */
    int hermes = tt.len ? llm_has(tt.ptr, tt.len, "<tool_call>") : llm_vocab_has(t, "<tool_call>");
    if ((ct->family == LLM_CHAT_CHATML || ct->family == LLM_CHAT_QWEN3 ||
         ct->family == LLM_CHAT_QWQ) && hermes)
        ct->tool_format = LLM_TOOLS_HERMES;
    if (ct->family == LLM_CHAT_LLAMA3 && llm_has(tt.ptr, tt.len, "Environment: ipython"))
        ct->tool_format = LLM_TOOLS_LLAMA3;
    int mistral_calls = tt.len ? llm_has(tt.ptr, tt.len, "[TOOL_CALLS][") ||
                                 llm_has(tt.ptr, tt.len, "[TOOL_CALLS] [") : llm_vocab_has(t, "[TOOL_CALLS]");
    if ((ct->family == LLM_CHAT_MISTRAL_V3 || ct->family == LLM_CHAT_MISTRAL_V3_TEKKEN) && mistral_calls)
        ct->tool_format = LLM_TOOLS_MISTRAL;
    int v7 = ct->family == LLM_CHAT_MISTRAL_V7 || ct->family == LLM_CHAT_MISTRAL_V7_TEKKEN;
    if (v7 && (tt.len ? llm_has(tt.ptr, tt.len, "[CALL_ID]") : llm_vocab_has(t, "[CALL_ID]")))
        ct->tool_format = LLM_TOOLS_MISTRAL_ARGS;
    /* Mistral's templates refuse a call id that is not 9 letters and digits: the caller shortens ids */
    if (ct->tool_format == LLM_TOOLS_MISTRAL || ct->tool_format == LLM_TOOLS_MISTRAL_ARGS)
        ct->call_id_len = 9;
    /* 4. the default system prompt, thinking, and the date the system turn carries */
    if (v7) llm_chat_find_mistral_system(tt.ptr, tt.len, ct->default_system, sizeof ct->default_system);
    ct->thinks = ct->family == LLM_CHAT_QWEN3 || ct->family == LLM_CHAT_QWQ;
    /* a template whose generation prompt is the literal '<|im_start|>assistant\n<think>\n' always thinks:
     * the model's reply starts inside the think block (the reply's reader must know it) */
    ct->opens_think = ct->thinks && llm_has(tt.ptr, tt.len, "'<|im_start|>assistant\\n<think>\\n'");
    if (ct->family == LLM_CHAT_CHATML)
        llm_chat_find_default_system(tt.ptr, tt.len, ct->default_system, sizeof ct->default_system);
    /* Llama 3.1's template dates the system turn 26 Jul 2024; 3.2's asks for today's date (strftime_now) */
    ct->dated_system = ct->family == LLM_CHAT_LLAMA3 && llm_has(tt.ptr, tt.len, "Cutting Knowledge Date");
    snprintf(ct->date, sizeof ct->date, "26 Jul 2024");
    int gpt_oss = ct->family == LLM_CHAT_GPT_OSS;
    ct->dated_today = gpt_oss || llm_has(tt.ptr, tt.len, "strftime_now");
    llm_chat_template_set_today(ct, (int64_t)time(NULL));
    /* gpt-oss always thinks first (its analysis channel) */
    if (gpt_oss) { ct->thinks = 1; ct->tool_format = LLM_TOOLS_HARMONY; }
    /* gpt-oss's default effort; a request's reasoning_effort replaces it in its copy */
    snprintf(ct->reasoning_effort, sizeof ct->reasoning_effort, "medium");
    return 0;
}

/* The date as the templates' strftime_now writes it: "%d %b %Y" (Llama 3.2, "02 Jan 2030") or "%Y-%m-%d"
 * (gpt-oss). The month's name comes from this table, not strftime's %b, whose names follow LC_TIME: a
 * program that sets a locale would otherwise write names the model never saw in training. */
void llm_chat_template_set_today(llm_chat_template *ct, int64_t unix_seconds) {
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                       "Nov", "Dec"};
    time_t now = (time_t)unix_seconds;
    struct tm tm;
    if (!ct->dated_today || !localtime_r(&now, &tm) || tm.tm_mon < 0 || tm.tm_mon > 11) return;
    if (ct->family == LLM_CHAT_GPT_OSS)
        snprintf(ct->date, sizeof ct->date, "%04d-%02d-%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
    else
        snprintf(ct->date, sizeof ct->date, "%02d %s %04d", tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900);
}

/* ---- Rendering ----------------------------------------------------------------------------------------- */
/* The output: the caller's buffer, written up to cap and counted past it, as llm_out is for ids. A render
 * with cap 0 measures; the caller then allocates n + 1 and renders again. The two passes write the same
 * bytes because a render depends only on its arguments (the date is fixed at init). max bounds the text
 * (0: no bound): a write past it sets over and nothing more is written or counted. Why: the text is not
 * linear in the request's bytes (Mistral's templates write all the tools again before each user message
 * that repeats the last one: an 8 MB request could render to gigabytes), and a caller allocates what a
 * measure counts; with over set, each later write costs nothing, so the render stops early in effect. */
typedef struct { char *out; size_t cap, n, max; int over; } llm_chat_text; /* counts, stores the first cap */

/* Appends n bytes: what fits is copied, all are counted (c->out may be NULL with cap 0); none past max */
static void llm_chat_put(llm_chat_text *c, const char *s, size_t n) {
    if (c->over || (c->max && n > c->max - c->n)) { c->over = 1; return; }
    if (n && c->n < c->cap) memcpy(c->out + c->n, s, c->n + n <= c->cap ? n : c->cap - c->n);
    c->n += n;
}
static void llm_chat_puts(llm_chat_text *c, const char *s) { if (!c->over) llm_chat_put(c, s, strlen(s)); }

/* Python's str.strip() of white space (Jinja's trim), and strip(chars) of one character, on each side asked
 * (ASCII white space, and the separators 0x1c-0x1f that Python counts too). Byte for byte matters here:
 * the prompt's tokens, and so the prefix cache and the model's answer, change with one space more or less.
 * Non-ASCII white space (U+00A0, U+3000), which Python strips too, is kept. */
static int llm_is_space(char ch) {
    return ch == ' ' || (ch >= '\t' && ch <= '\r') || (ch >= 0x1c && ch <= 0x1f);
}
static void llm_chat_put_stripped(llm_chat_text *c, const char *s, int left, int right, char only) {
    size_t a = 0, b = strlen(s);
#define LLM_STRIPS(ch) (only ? (ch) == only : llm_is_space(ch))
    while (left && a < b && LLM_STRIPS(s[a])) a++;
    while (right && b > a && LLM_STRIPS(s[b - 1])) b--;
#undef LLM_STRIPS
    llm_chat_put(c, s + a, b - a);
}
static void llm_chat_put_trimmed(llm_chat_text *c, const char *s) { llm_chat_put_stripped(c, s, 1, 1, 0); }

/* A message's role as a number, -1 for a role no family writes (the render then fails, as a template's
 * raise_exception would). "developer", OpenAI's newer name for the system role, is the system role. */
enum { LLM_ROLE_SYSTEM, LLM_ROLE_USER, LLM_ROLE_ASSISTANT, LLM_ROLE_TOOL };
static int llm_chat_role(const char *role) {
    if (!role) return -1;
    if (!strcmp(role, "system") || !strcmp(role, "developer")) return LLM_ROLE_SYSTEM;
    if (!strcmp(role, "user")) return LLM_ROLE_USER;
    if (!strcmp(role, "tool")) return LLM_ROLE_TOOL;
    return !strcmp(role, "assistant") ? LLM_ROLE_ASSISTANT : -1;
}
/* Indexed by LLM_ROLE_*: the names the templates write in their turns ("developer" is written "system") */
static const char *llm_chat_role_names[] = {"system", "user", "assistant", "tool"};

/* A JSON text written again as Python's json.dumps writes it (a template's tojson); -1 when it is not JSON
 * (or NULL, or out of memory), which fails the render: a call's arguments must be JSON to be written.
 * The arguments of a call come from the client as a JSON text, and the template would print them with
 * tojson, so ", " and ": " separators and Python's escapes, whatever spacing the client used. */
static int llm_chat_put_json(llm_chat_text *c, const char *text) {
    llm_json v;
    if (!text || llm_json_parse(text, strlen(text), &v, NULL) != 0) return -1;
    char *py = llm_json_dumps(&v, 1);
    llm_json_free(&v);
    if (!py) return -1;
    llm_chat_puts(c, py);
    free(py);
    return 0;
}

/* The tool writers (the Tools layer, section 13): the render calls them where a family's template writes the
 * tools, an assistant's calls and a tool's results. Hermes (<tool_call> JSON) serves ChatML, Qwen3 and QwQ;
 * Mistral's serve v3 and v3-tekken; harmony's serves gpt-oss; Llama 3 and Mistral v7 write theirs inline
 * below; every other family goes through llm_chat_generic_tools, which makes plain turns of them. */
static void llm_hermes_tools(llm_chat_text *c, const llm_json *tools);
static int llm_hermes_calls(llm_chat_text *c, const llm_chat_message *m, int newline_first);
static void llm_hermes_result(llm_chat_text *c, const int *role, int n, int i, const char *content);
static int llm_mistral_tools(llm_chat_text *c, const llm_json *tools, int tekken);
static int llm_mistral_calls(llm_chat_text *c, const llm_chat_message *m, int tekken, const char *eos);
static int llm_harmony_tools(llm_chat_text *c, const llm_json *tools);
static int llm_chat_generic_tools(const llm_chat_template *ct, const llm_chat_message *msgs, int n,
                                  const llm_json *tools, llm_chat_message **out, char ***texts);

/* After the system prompt, questions and answers take turns (calls and results aside), as Mistral's
 * templates check (a system turn later on breaks the turns too): the k-th counted message from `first`
 * must be a user's for even k and an assistant's for odd k. 1 when they do. */
static int llm_mistral_turns_alternate(const llm_chat_message *msgs, const int *role, int first, int n) {
    for (int i = first, turns = 0; i < n; i++) {
        if (role[i] == LLM_ROLE_TOOL || (role[i] == LLM_ROLE_ASSISTANT && msgs[i].n_tool_calls > 0)) continue;
        if (role[i] != (turns++ % 2 ? LLM_ROLE_ASSISTANT : LLM_ROLE_USER)) return 0;
    }
    return 1;
}

/* A message's body must not hold the markers of another: the template refuses such a message */
static int llm_harmony_has_channel(const char *text) {
    return text && (strstr(text, "<|channel|>analysis<|message|>") ||
                    strstr(text, "<|channel|>final<|message|>"));
}

/* Qwen3 (Qwen/Qwen3-0.6B): an assistant turn. Its reasoning (given apart, or inside <think></think> at the
 * start of its content) is kept after the last user query, where the last turn always shows the <think>
 * block; elsewhere only the text after </think>. Then its calls. */
static int llm_qwen3_assistant(llm_chat_text *c, const llm_chat_message *m, int after_last_query, int last) {
    /* 1. reasoning and body: the reasoning given apart, or else the content up to its first </think>, from
     * after the last <think> before that (or from the start); the body: what follows the last </think> */
    const char *content = m->content ? m->content : "";
    const char *first_end = strstr(content, "</think>"), *body = content, *reasoning = m->reasoning;
    size_t n_reasoning = reasoning ? strlen(reasoning) : 0;
    if (!reasoning && first_end) {
        for (const char *p = first_end; p; p = strstr(p + 1, "</think>")) body = p + 8;
        while (*body == '\n') body++;
        reasoning = content;
        for (const char *p = content; (p = strstr(p, "<think>")) && p < first_end; p++) reasoning = p + 7;
        n_reasoning = (size_t)(first_end - reasoning);
        while (n_reasoning && reasoning[0] == '\n') { reasoning++; n_reasoning--; }
        while (n_reasoning && reasoning[n_reasoning - 1] == '\n') n_reasoning--;
    } else if (reasoning) { /* .strip('\n') where it is written */
        while (n_reasoning && reasoning[0] == '\n') { reasoning++; n_reasoning--; }
        while (n_reasoning && reasoning[n_reasoning - 1] == '\n') n_reasoning--;
    }
    /* 2. the turn: the think block only after the last query, then the body, the calls, the end */
    llm_chat_puts(c, "<|im_start|>assistant\n");
    if (after_last_query && (last || n_reasoning)) {
        llm_chat_puts(c, "<think>\n");
        llm_chat_put(c, reasoning, n_reasoning);
        llm_chat_puts(c, "\n</think>\n\n");
        while (*body == '\n') body++;
    }
    llm_chat_puts(c, body);
    if (llm_hermes_calls(c, m, body[0] != 0) != 0) return -1;
    llm_chat_puts(c, "<|im_end|>\n");
    return 0;
}

/* Qwen3's last query: the last user turn that is not tool results wrapped in <tool_response> (the template
 * tests content.startswith('<tool_response>') and endswith('</tool_response>'): both need 31 bytes at
 * least). With none, n - 1: every assistant turn is then before it, and keeps no reasoning. */
static int llm_qwen3_last_query(const llm_chat_message *msgs, const int *role, int n) {
    for (int i = n - 1; i >= 0; i--) {
        if (role[i] != LLM_ROLE_USER) continue;
        const char *t = msgs[i].content ? msgs[i].content : "";
        size_t len = strlen(t);
        if (strncmp(t, "<tool_response>", 15) || len < 16 + 15 || strcmp(t + len - 16, "</tool_response>"))
            return i;
    }
    return n - 1;
}

/* The families' turns at a glance: a user's "Hi" and the answer "Yo", as rendered (\n a newline; BOS, EOS
 * the vocabulary's texts, as <s> and </s>):
 *   chatml, qwen3, qwq  <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n
 *   llama3              BOS<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>
 *                       <|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>
 *   llama2              BOS[INST] Hi [/INST] Yo EOS
 *   mistral-v1          BOS [INST] Hi [/INST] YoEOS
 *   mistral-v3, -v7     BOS[INST] Hi[/INST] YoEOS           (their -tekken forms: BOS[INST]Hi[/INST]YoEOS)
 *   zephyr              <|user|>\nHiEOS\n<|assistant|>\nYoEOS\n
 *   phi3                <|user|>\nHi<|end|>\n<|assistant|>\nYo<|end|>\n
 *   gemma               BOS<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n
 *   gpt-oss             <|start|>system<|message|>...<|end|><|start|>user<|message|>Hi<|end|>
 *                       <|start|>assistant<|channel|>final<|message|>Yo<|return|>  (<|end|> if not last)
 *
 * The conversation as the family's template writes it (see the section's opener). The steps: parse the
 * tools; for a family with no tool format of its own, rewrite tools, calls and results as plain turns and
 * render that instead; map the roles; write the family's turns; the generation prompt when gen. Each
 * family's case is the C form of its template's loop over the messages: `first` skips the system message
 * where the family writes it elsewhere (Llama 2, Mistral v1, Gemma: inside the first turn after it;
 * Mistral v3: inside the last message, when that is a user's, else nowhere; gpt-oss: in the developer
 * message; Qwen3 and QwQ: first, with the tools). Failing cases set `failed` and stop at the
 * next check; the function then returns -1 and what it wrote to out is not to be used. The messages are
 * only read: the strings they point to belong to the caller. The length returned counts the text's bytes
 * without a NUL: a caller that measured with cap 0 allocates that + 1 and renders again with it. */
int llm_chat_render(const llm_chat_template *ct, const llm_chat_message *msgs, int n, const char *tools,
                    int gen, char *out, int cap) {
    /* the bound: the caller's, within what llm_tokenize takes (and so within an int) */
    size_t max = ct->max_text && ct->max_text < LLM_CHAT_MAX_TEXT ? ct->max_text : LLM_CHAT_MAX_TEXT;
    llm_chat_text c = {out, out && cap > 0 ? (size_t)cap : 0, 0, max, 0};
    llm_json tl;
    memset(&tl, 0, sizeof tl);
    int bad_tools = tools && (llm_json_parse(tools, strlen(tools), &tl, NULL) != 0 ||
                              tl.type != LLM_JSON_ARRAY);
    if (n < 0 || bad_tools) {
        llm_json_free(&tl);
        return -1;
    }
    /* 1. the tools: a JSON array, or the render fails; an empty one is as none */
    const llm_json *tl_given = tools && tl.n > 0 ? &tl : NULL;
    /* 2. a family without a tool format of its own: tools, calls and results become plain turns first. The
     * rewritten conversation has no tools, calls or tool turns, so the call below does not come back here */
    int uses_tools = tl_given != NULL;
    for (int i = 0; i < n; i++)
        uses_tools |= msgs[i].n_tool_calls > 0 || llm_chat_role(msgs[i].role) == LLM_ROLE_TOOL;
    if (uses_tools && ct->tool_format == LLM_TOOLS_GENERIC) {
        llm_chat_message *plain;
        char **texts;
        /* plain: the rewritten messages; texts: the n + 1 strings made for them (NULL where a message was
         * kept as it was), both owned here and freed after the render */
        int m = llm_chat_generic_tools(ct, msgs, n, tl_given, &plain, &texts);
        llm_json_free(&tl);
        if (m < 0) return -1;
        int len = llm_chat_render(ct, plain, m, NULL, gen, out, cap);
        for (int i = 0; i <= n; i++) free(texts[i]);
        free(texts); free(plain);
        return len;
    }
    /* 3. the roles, as numbers; one the families do not know fails the render */
    int *role = (int *)calloc((size_t)(n > 0 ? n : 1), sizeof(int)), failed = 0;
    if (!role) { llm_json_free(&tl); return -1; }
    for (int i = 0; i < n; i++) if ((role[i] = llm_chat_role(msgs[i].role)) < 0) failed = 1;
    /* a message's content, "" for none (an assistant turn that only calls tools) */
#define CONTENT(i) (msgs[i].content ? msgs[i].content : "")
    /* only a first message can be the system prompt; a later system message is a turn where the family
     * writes one (ChatML, Qwen3, QwQ, Llama 3, Gemma, Zephyr, Phi-3, Mistral v7), else dropped or
     * refused */
    int has_sys = n > 0 && role[0] == LLM_ROLE_SYSTEM, first = has_sys; /* first: after the system turn */
    const char *sys = has_sys ? CONTENT(0) : "";
    const char *bos = ct->bos, *eos = ct->eos;
    /* 4. the family's turns (only the families with a tool format write a tool's turn themselves) */
    for (int i = 0; i < n && ct->tool_format == LLM_TOOLS_GENERIC; i++) failed |= role[i] == LLM_ROLE_TOOL;
    /* a role no family knows, or a tool turn that no writer takes: nothing is written, the render fails */
    switch (failed ? -1 : ct->family) {
    case -1: break;
    case LLM_CHAT_QWEN3: { /* Qwen/Qwen3-0.6B */
        /* the system turn: the system prompt, then the tools when there are any */
        if (tl_given) {
            llm_chat_puts(&c, "<|im_start|>system\n");
            if (has_sys) { llm_chat_puts(&c, sys); llm_chat_puts(&c, "\n\n"); }
            llm_hermes_tools(&c, tl_given);
        } else if (has_sys) {
            llm_chat_puts(&c, "<|im_start|>system\n"); llm_chat_puts(&c, sys);
            llm_chat_puts(&c, "<|im_end|>\n");
        }
        /* the turns: results grouped as the template groups them, answers with or without their thinking */
        int last_query = llm_qwen3_last_query(msgs, role, n);
        for (int i = first; i < n && !failed; i++) {
            if (role[i] == LLM_ROLE_TOOL) llm_hermes_result(&c, role, n, i, CONTENT(i));
            else if (role[i] == LLM_ROLE_ASSISTANT)
                failed = llm_qwen3_assistant(&c, &msgs[i], i > last_query, i == n - 1) != 0;
            else {
                llm_chat_puts(&c, role[i] == LLM_ROLE_USER ? "<|im_start|>user\n" : "<|im_start|>system\n");
                llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, "<|im_end|>\n");
            }
        }
        /* the generation prompt: with <think> opened (templates that always think), plain (the model chooses
         * to think), or with an empty think block, which is how enable_thinking=false tells it not to */
        if (gen)
            llm_chat_puts(&c, ct->opens_think ? "<|im_start|>assistant\n<think>\n" : ct->enable_thinking ?
                               "<|im_start|>assistant\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
        break;
    }
    case LLM_CHAT_QWQ: { /* Qwen/QwQ-32B: earlier answers lose their thinking; the prompt opens <think> */
        /* with tools, a system turn always, even with no system prompt (it then opens with "\n\n"); Qwen3's
         * case writes the prompt and its "\n\n" only when there is one */
        if (tl_given) {
            llm_chat_puts(&c, "<|im_start|>system\n"); llm_chat_puts(&c, sys); llm_chat_puts(&c, "\n\n");
            llm_hermes_tools(&c, tl_given);
        } else if (has_sys) {
            llm_chat_puts(&c, "<|im_start|>system\n"); llm_chat_puts(&c, sys);
            llm_chat_puts(&c, "<|im_end|>\n");
        }
        for (int i = first; i < n && !failed; i++) {
            if (role[i] == LLM_ROLE_TOOL) { llm_hermes_result(&c, role, n, i, CONTENT(i)); continue; }
            if (role[i] != LLM_ROLE_ASSISTANT) {
                llm_chat_puts(&c, "<|im_start|>"); llm_chat_puts(&c, llm_chat_role_names[role[i]]);
                llm_chat_puts(&c, "\n"); llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, "<|im_end|>\n");
                continue;
            }
            /* an answer: the last one whole (it may be the one being continued), earlier ones thoughtless */
            const char *body = CONTENT(i); /* but the last: what follows the last </think>, newlines cut */
            for (const char *p = body; i < n - 1 && (p = strstr(p, "</think>")); p += 8) body = p + 8;
            while (i < n - 1 && *body == '\n') body++;
            llm_chat_puts(&c, "<|im_start|>assistant");
            if (CONTENT(i)[0] || !msgs[i].n_tool_calls) { llm_chat_puts(&c, "\n"); llm_chat_puts(&c, body); }
            failed = llm_hermes_calls(&c, &msgs[i], 1) != 0;
            llm_chat_puts(&c, "<|im_end|>\n");
        }
        if (gen) llm_chat_puts(&c, "<|im_start|>assistant\n<think>\n");
        break;
    }
    case LLM_CHAT_LLAMA3: { /* meta-llama/Meta-Llama-3-8B-Instruct; dated: Llama-3.1-8B-Instruct, 3.2-1B */
        int tools_here = ct->tool_format == LLM_TOOLS_LLAMA3 && tl_given;
        llm_chat_puts(&c, bos);
        /* 3.1 and later: a system turn always, even without a system message, with the knowledge cutoff and
         * the date (the system message, trimmed, after them); 3.0 writes a system message as any turn */
        if (ct->dated_system) {
            llm_chat_puts(&c, "<|start_header_id|>system<|end_header_id|>\n\n");
            if (tools_here) llm_chat_puts(&c, "Environment: ipython\n");
            llm_chat_puts(&c, "Cutting Knowledge Date: December 2023\nToday Date: ");
            llm_chat_puts(&c, ct->date); llm_chat_puts(&c, "\n\n");
            llm_chat_put_trimmed(&c, sys); llm_chat_puts(&c, "<|eot_id|>");
        }
        int i = ct->dated_system ? first : 0;
        if (tools_here) { /* Llama 3.1: the tools go in the first user turn, each as tojson(indent=4) */
            /* no message left to hold them: the template raises an exception there, so this fails */
            if (i >= n) { failed = 1; break; }
            llm_chat_puts(&c, "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, "
                          "please respond with a JSON for a function call with its "
                          "proper arguments that best "
                          "answers the given prompt.\n\nRespond in the format {\"name\": function name, "
                          "\"parameters\": dictionary of argument name and its value}.Do not use "
                          "variables.\n\n");
            for (int k = 0; k < tl_given->n; k++) {
                char *py = llm_json_dumps(&tl_given->items[k], 4);
                llm_chat_puts(&c, py ? py : ""); llm_chat_puts(&c, "\n\n");
                free(py);
            }
            llm_chat_put_trimmed(&c, CONTENT(i)); llm_chat_puts(&c, "<|eot_id|>");
            i++;
        }
        /* the turns: a result in the ipython role, a call as JSON, anything else as a trimmed turn */
        for (; i < n && !failed; i++) {
            if (role[i] == LLM_ROLE_TOOL) { /* a result: tojson of its text (a string is iterable to Jinja) */
                llm_json text = {LLM_JSON_STRING, 0, (char *)CONTENT(i),
                                 strlen(CONTENT(i)), NULL, NULL, 0, 0};
                char *py = llm_json_dumps(&text, 1);
                llm_chat_puts(&c, "<|start_header_id|>ipython<|end_header_id|>\n\n");
                llm_chat_puts(&c, py ? py : "");
                llm_chat_puts(&c, "<|eot_id|>");
                free(py);
            } else if (role[i] == LLM_ROLE_ASSISTANT && msgs[i].n_tool_calls > 0) { /* one call a turn */
                const llm_chat_tool_call *tc = &msgs[i].tool_calls[0];
                if (msgs[i].n_tool_calls != 1) { failed = 1; break; }
                llm_chat_puts(&c, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
                llm_chat_puts(&c, tc->name ? tc->name : ""); llm_chat_puts(&c, "\", \"parameters\": ");
                failed = llm_chat_put_json(&c, tc->arguments) != 0;
                llm_chat_puts(&c, "}<|eot_id|>");
            } else {
                llm_chat_puts(&c, "<|start_header_id|>"); llm_chat_puts(&c, llm_chat_role_names[role[i]]);
                llm_chat_puts(&c, "<|end_header_id|>\n\n");
                llm_chat_put_trimmed(&c, CONTENT(i)); llm_chat_puts(&c, "<|eot_id|>");
            }
        }
        if (gen) llm_chat_puts(&c, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    }
    /* Llama 2: each user turn is "<s>[INST] ... [/INST]" and each answer " ... </s>", so every exchange is
     * a BOS..EOS pair of its own; the system prompt goes in <<SYS>> inside the first turn */
    case LLM_CHAT_LLAMA2: /* meta-llama/Llama-2-7b-chat-hf: no generation prompt; no later system turns */
        for (int i = first; i < n; i++) {
            char *joined = NULL; /* the system block joins the first turn before the strip */
            const char *content = CONTENT(i);
            if (i == first && has_sys) {
                size_t len = strlen(sys) + strlen(content) + 32;
                if (!(joined = (char *)malloc(len))) { failed = 1; break; }
                snprintf(joined, len, "<<SYS>>\n%s\n<</SYS>>\n\n%s", sys, content);
                content = joined;
            }
            if (role[i] == LLM_ROLE_USER) {
                llm_chat_puts(&c, bos); llm_chat_puts(&c, "[INST] "); llm_chat_put_trimmed(&c, content);
                llm_chat_puts(&c, " [/INST]");
            } else if (role[i] == LLM_ROLE_ASSISTANT) {
                llm_chat_puts(&c, " "); llm_chat_put_trimmed(&c, content); llm_chat_puts(&c, " ");
                llm_chat_puts(&c, eos);
            }
            free(joined);
        }
        break;
    /* Mistral v1: one BOS for the whole conversation, " [INST] ... [/INST]" and " ...</s>" turns */
    case LLM_CHAT_MISTRAL_V1: /* mistralai/Mistral-7B-Instruct-v0.1, its template with a system prompt */
        llm_chat_puts(&c, bos);
        for (int i = first; i < n; i++) {
            if (role[i] == LLM_ROLE_USER) {
                llm_chat_puts(&c, " [INST] ");
                if (i == first && has_sys) { llm_chat_puts(&c, sys); llm_chat_puts(&c, "\n\n"); }
                llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, " [/INST]");
            } else if (role[i] == LLM_ROLE_ASSISTANT) {
                llm_chat_puts(&c, " "); llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, eos);
            }
        }
        break;
    /* Mistral v3: "[INST] ...[/INST]" and " ...</s>" after one BOS; tekken writes no space after [INST] and
     * none before an answer. The template checks that user and assistant alternate, and so does this. */
    case LLM_CHAT_MISTRAL_V3: /* mistralai/Mistral-7B-Instruct-v0.3: the system prompt joins the last turn */
    case LLM_CHAT_MISTRAL_V3_TEKKEN: { /* mistralai/Mistral-Nemo-Instruct-2407 */
        int tekken = ct->family == LLM_CHAT_MISTRAL_V3_TEKKEN, last_user = -1;
        /* the tools go before the last question (and before any earlier one just like it) */
        for (int i = first; i < n; i++) if (role[i] == LLM_ROLE_USER) last_user = i;
        if ((failed = !llm_mistral_turns_alternate(msgs, role, first, n))) break;
        llm_chat_puts(&c, bos);
        /* per message: the tools before the last question, then a call, a result, a question or an answer */
        for (int i = first; i < n && !failed; i++) {
            if (role[i] == LLM_ROLE_USER && tl_given && ct->tool_format == LLM_TOOLS_MISTRAL && !c.over &&
                !strcmp(CONTENT(i), CONTENT(last_user)))
                failed = llm_mistral_tools(&c, tl_given, tekken) != 0;
            int calls = role[i] == LLM_ROLE_ASSISTANT && msgs[i].n_tool_calls > 0;
            if (calls && ct->tool_format == LLM_TOOLS_MISTRAL) { /* [TOOL_CALLS] and a JSON list, then EOS */
                failed = llm_mistral_calls(&c, &msgs[i], tekken, eos) != 0;
            } else if (role[i] == LLM_ROLE_TOOL) { /* the content written as it is, not quoted */
                const char *id = msgs[i].tool_call_id;
                llm_chat_puts(&c, tekken ? "[TOOL_RESULTS]{\"content\": " : "[TOOL_RESULTS] {\"content\": ");
                llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, ", \"call_id\": \"");
                llm_chat_puts(&c, id ? id : ""); llm_chat_puts(&c, "\"}[/TOOL_RESULTS]");
                failed = !id || strlen(id) != 9;
            } else if (role[i] == LLM_ROLE_USER) {
                llm_chat_puts(&c, tekken ? "[INST]" : "[INST] ");
                if (i == n - 1 && has_sys) { llm_chat_puts(&c, sys); llm_chat_puts(&c, "\n\n"); }
                llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, "[/INST]");
            } else if (role[i] == LLM_ROLE_ASSISTANT) {
                if (tekken) llm_chat_puts(&c, CONTENT(i));
                else { llm_chat_puts(&c, " "); llm_chat_put_trimmed(&c, CONTENT(i)); }
                llm_chat_puts(&c, eos);
            }
        }
        break;
    }
    /* Mistral v7: system messages where they are, as [SYSTEM_PROMPT]...[/SYSTEM_PROMPT]; v11 (Small 3.2)
     * adds the tools as [AVAILABLE_TOOLS], calls and results with a 9-character call id each */
    case LLM_CHAT_MISTRAL_V7: /* mistralai/Mistral-Large-Instruct-2411 */
    case LLM_CHAT_MISTRAL_V7_TEKKEN: { /* mistralai/Mistral-Small-24B-Instruct-2501; Small 3.2 (v11 tools) */
        int tekken = ct->family == LLM_CHAT_MISTRAL_V7_TEKKEN,
            args = ct->tool_format == LLM_TOOLS_MISTRAL_ARGS;
        int last_user = -1;
        for (int i = first; i < n; i++) if (role[i] == LLM_ROLE_USER) last_user = i;
        /* with v11's tool format only, the turns must alternate (llm_mistral_turns_alternate) */
        if (args && (failed = !llm_mistral_turns_alternate(msgs, role, first, n))) break;
        llm_chat_puts(&c, bos);
        /* no system message: the template's own system prompt, where it has one */
        if (!has_sys && ct->default_system[0]) { /* Small 3.2's own, dated today */
            llm_chat_puts(&c, "[SYSTEM_PROMPT]"); llm_chat_puts(&c, ct->default_system);
            llm_chat_puts(&c, "[/SYSTEM_PROMPT]");
        }
        /* every message where it is, the system messages too: no `first` here */
        for (int i = 0; i < n && !failed; i++) {
            if (role[i] == LLM_ROLE_SYSTEM) {
                llm_chat_puts(&c, tekken ? "[SYSTEM_PROMPT]" : "[SYSTEM_PROMPT] ");
                llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, "[/SYSTEM_PROMPT]");
            } else if (role[i] == LLM_ROLE_USER) {
                /* the tools, as tojson (not once over the bound: each dump costs the tools' size) */
                if (args && tl_given && !c.over && !strcmp(CONTENT(i), CONTENT(last_user))) {
                    char *py = llm_json_dumps(tl_given, 1);
                    llm_chat_puts(&c, "[AVAILABLE_TOOLS]"); llm_chat_puts(&c, py ? py : "");
                    llm_chat_puts(&c, "[/AVAILABLE_TOOLS]");
                    free(py);
                }
                llm_chat_puts(&c, tekken ? "[INST]" : "[INST] "); llm_chat_puts(&c, CONTENT(i));
                llm_chat_puts(&c, "[/INST]");
            } else if (role[i] == LLM_ROLE_TOOL) { /* v11:
                                                    * [TOOL_RESULTS]id[TOOL_CONTENT]text[/TOOL_RESULTS] */
                const char *id = msgs[i].tool_call_id;
                failed = !id || strlen(id) != 9;
                llm_chat_puts(&c, "[TOOL_RESULTS]"); llm_chat_puts(&c, id ? id : "");
                llm_chat_puts(&c, "[TOOL_CONTENT]"); llm_chat_puts(&c, CONTENT(i));
                llm_chat_puts(&c, "[/TOOL_RESULTS]");
            } else if (args && msgs[i].n_tool_calls > 0) { /* v11: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} */
                for (int k = 0; k < msgs[i].n_tool_calls && !failed; k++) {
                    const llm_chat_tool_call *tc = &msgs[i].tool_calls[k];
                    llm_chat_puts(&c, "[TOOL_CALLS]"); llm_chat_puts(&c, tc->name ? tc->name : "");
                    llm_chat_puts(&c, "[CALL_ID]"); llm_chat_puts(&c, tc->id ? tc->id : "");
                    llm_chat_puts(&c, "[ARGS]");
                    failed = !tc->id || strlen(tc->id) != 9 || llm_chat_put_json(&c, tc->arguments) != 0;
                }
                llm_chat_puts(&c, eos);
            } else {
                if (!tekken) llm_chat_puts(&c, " ");
                llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, eos);
            }
        }
        break;
    }
    /* gpt-oss (harmony): every message is <|start|>ROLE<|channel|>CHANNEL<|message|>TEXT<|end|>. A fixed
     * system message (date, reasoning effort), a developer message with the system prompt and the tools,
     * then the turns. An answer's thinking (the analysis channel) is dropped from earlier answers, and kept
     * before a call until a final answer follows; a tool's result is a message from functions.NAME. */
    case LLM_CHAT_GPT_OSS: { /* openai/gpt-oss-20b: system (date, reasoning effort), developer, messages */
        /* the system message: fixed text, today's date and the reasoning effort the request asks for */
        llm_chat_puts(&c, "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
                      "OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: ");
        llm_chat_puts(&c, ct->date);
        llm_chat_puts(&c, "\n\nReasoning: "); llm_chat_puts(&c, ct->reasoning_effort);
        llm_chat_puts(&c, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
                      "every message.");
        if (tl_given)
            llm_chat_puts(&c, "\nCalls to these tools must go to the commentary channel: 'functions'.");
        llm_chat_puts(&c, "<|end|>");
        /* the developer message: the system prompt as instructions, then the tools as TypeScript */
        if (sys[0] || tl_given) {
            llm_chat_puts(&c, "<|start|>developer<|message|>");
            if (sys[0]) {
                llm_chat_puts(&c, "# Instructions\n\n"); llm_chat_puts(&c, sys); llm_chat_puts(&c, "\n\n");
            }
            if (tl_given) failed = llm_harmony_tools(&c, tl_given) != 0;
            llm_chat_puts(&c, "<|end|>");
        }
        const char *last_call = NULL; /* a tool's result answers the last call made */
        /* the last final answer (an assistant message without calls; -1: none), found once: a call's
         * thinking is kept unless one follows it, and a scan of the later messages at each call would cost
         * calls x messages, quadratic in a request's messages */
        int last_answer = -1;
        for (int k = n - 1; k >= first && last_answer < 0; k--)
            if (role[k] == LLM_ROLE_ASSISTANT && !msgs[k].n_tool_calls) last_answer = k;
        for (int i = first; i < n && !failed; i++) {
            if (role[i] == LLM_ROLE_USER) {
                llm_chat_puts(&c, "<|start|>user<|message|>"); llm_chat_puts(&c, CONTENT(i));
                llm_chat_puts(&c, "<|end|>");
            } else if (role[i] == LLM_ROLE_TOOL) { /* a result, as a JSON string, from the tool last called */
                if (!last_call) { failed = 1; break; }
                llm_json v = {LLM_JSON_STRING, 0, (char *)CONTENT(i), strlen(CONTENT(i)), NULL, NULL, 0, 0};
                char *quoted = llm_json_dumps(&v, 1);
                llm_chat_puts(&c, "<|start|>functions."); llm_chat_puts(&c, last_call);
                llm_chat_puts(&c, " to=assistant<|channel|>commentary<|message|>");
                llm_chat_puts(&c, quoted ? quoted : ""); llm_chat_puts(&c, "<|end|>");
                failed = !quoted;
                free(quoted);
            } else if (role[i] == LLM_ROLE_ASSISTANT) {
                /* an answer: refused when its text holds another message's markers; then a call (its
                 * thinking kept unless a final answer follows), the last answer whole, or an earlier
                 * answer without its thinking */
                const char *thinking = msgs[i].reasoning;
                if (llm_harmony_has_channel(CONTENT(i)) || llm_harmony_has_channel(thinking)) {
                    failed = 1;
                    break;
                }
                if (msgs[i].n_tool_calls > 0) { /* its first call; the thinking kept until a final answer */
                    int answered = last_answer > i;
                    const llm_chat_tool_call *tc = &msgs[i].tool_calls[0];
                    if (CONTENT(i)[0] && thinking && thinking[0]) { failed = 1; break; }
                    const char *analysis = CONTENT(i)[0] ? CONTENT(i) :
                                           thinking && thinking[0] ? thinking : NULL;
                    if (analysis && !answered) {
                        llm_chat_puts(&c, "<|start|>assistant<|channel|>analysis<|message|>");
                        llm_chat_puts(&c, analysis); llm_chat_puts(&c, "<|end|>");
                    }
                    /* the call: a message to functions.NAME on the commentary channel, its arguments as
                     * JSON, ended by <|call|> (where the model stops to wait for the result) */
                    llm_chat_puts(&c, "<|start|>assistant to=functions.");
                    llm_chat_puts(&c, tc->name ? tc->name : "");
                    llm_chat_puts(&c, "<|channel|>commentary json<|message|>");
                    failed = llm_chat_put_json(&c, tc->arguments) != 0;
                    llm_chat_puts(&c, "<|call|>");
                    last_call = tc->name ? tc->name : "";
                } else if (i == n - 1 && !gen) { /* the last answer, whole (as in training) */
                    if (thinking) {
                        llm_chat_puts(&c, "<|start|>assistant<|channel|>analysis<|message|>");
                        llm_chat_puts(&c, thinking); llm_chat_puts(&c, "<|end|>");
                    }
                    llm_chat_puts(&c, "<|start|>assistant<|channel|>final<|message|>");
                    llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, "<|return|>");
                } else { /* earlier answers: their thinking dropped */
                    llm_chat_puts(&c, "<|start|>assistant<|channel|>final<|message|>");
                    llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, "<|end|>");
                    last_call = NULL;
                }
            } /* a system message past the first: the template writes nothing */
        }
        if (gen) llm_chat_puts(&c, "<|start|>assistant");
        break;
    }
    /* Zephyr and Phi-3: "<|role|>\n...END\n" for every message, the system message too; END is EOS for
     * Zephyr and <|end|> for Phi-3. Their templates differ at the end: Zephyr's prompts only after a
     * message, and Phi-3's ends with EOS when it does not prompt. */
    case LLM_CHAT_ZEPHYR: /* TinyLlama/TinyLlama-1.1B-Chat-v1.0, HuggingFaceH4/zephyr-7b-beta */
    case LLM_CHAT_PHI3:   /* microsoft/Phi-3.5-mini-instruct */
        /* every message by its role's name, the system message too */
        for (int i = 0; i < n; i++) {
            llm_chat_puts(&c, "<|"); llm_chat_puts(&c, llm_chat_role_names[role[i]]);
            llm_chat_puts(&c, "|>\n");
            llm_chat_puts(&c, CONTENT(i));
            llm_chat_puts(&c, ct->family == LLM_CHAT_PHI3 ? "<|end|>" : eos); llm_chat_puts(&c, "\n");
        }
        if (gen && (n > 0 || ct->family == LLM_CHAT_PHI3)) llm_chat_puts(&c, "<|assistant|>\n");
        else if (ct->family == LLM_CHAT_PHI3) llm_chat_puts(&c, eos);
        break;
    /* Gemma: <start_of_turn>user|model\n...<end_of_turn>\n after one BOS; there is no system role, so the
     * system prompt opens the first turn after it, and every content is trimmed */
    case LLM_CHAT_GEMMA: /* google/gemma-3-1b-it: the system prompt opens the first turn */
        llm_chat_puts(&c, bos);
        /* each turn trimmed, the system prompt (untrimmed) in front of the first one's */
        for (int i = first; i < n; i++) {
            llm_chat_puts(&c, "<start_of_turn>");
            llm_chat_puts(&c, role[i] == LLM_ROLE_ASSISTANT ? "model" : llm_chat_role_names[role[i]]);
            llm_chat_puts(&c, "\n");
            if (i == first && has_sys) { llm_chat_puts(&c, sys); llm_chat_puts(&c, "\n\n"); }
            llm_chat_put_trimmed(&c, CONTENT(i)); llm_chat_puts(&c, "<end_of_turn>\n");
        }
        if (gen) llm_chat_puts(&c, "<start_of_turn>model\n");
        break;
    /* ChatML: "<|im_start|>ROLE\n...<|im_end|>\n" for every message, the template's own system prompt when
     * the conversation has none; with tools, one system turn holds the system prompt and the tools */
    default: /* ChatML: HuggingFaceTB/SmolLM2-135M-Instruct, Qwen/Qwen2.5-0.5B-Instruct (Hermes tools) */
        if (tl_given) {
            llm_chat_puts(&c, "<|im_start|>system\n"); llm_chat_puts(&c, has_sys ? sys : ct->default_system);
            llm_chat_puts(&c, "\n\n");
            llm_hermes_tools(&c, tl_given);
        } else if (!has_sys && n > 0 && ct->default_system[0]) {
            llm_chat_puts(&c, "<|im_start|>system\n"); llm_chat_puts(&c, ct->default_system);
            llm_chat_puts(&c, "<|im_end|>\n");
        }
        /* the turns; the system message among them unless the tools' system turn took it */
        for (int i = tl_given ? first : 0; i < n && !failed; i++) {
            if (role[i] == LLM_ROLE_TOOL) { llm_hermes_result(&c, role, n, i, CONTENT(i)); continue; }
            if (role[i] == LLM_ROLE_ASSISTANT && msgs[i].n_tool_calls > 0) { /* Qwen2.5's calls */
                llm_chat_puts(&c, "<|im_start|>assistant");
                if (CONTENT(i)[0]) { llm_chat_puts(&c, "\n"); llm_chat_puts(&c, CONTENT(i)); }
                failed = llm_hermes_calls(&c, &msgs[i], 1) != 0;
                llm_chat_puts(&c, "<|im_end|>\n");
                continue;
            }
            llm_chat_puts(&c, "<|im_start|>"); llm_chat_puts(&c, llm_chat_role_names[role[i]]);
            llm_chat_puts(&c, "\n"); llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, "<|im_end|>\n");
        }
        if (gen) llm_chat_puts(&c, "<|im_start|>assistant\n");
        break;
    }
#undef CONTENT
    /* 5. the length (max keeps it within an int); the text NUL-terminated when it fits */
    free(role);
    llm_json_free(&tl);
    if (failed) return -1;
    if (c.over) return -2;
    if (c.n < c.cap) out[c.n] = 0;
    return (int)c.n;
}

/* EOS and the family's end-of-turn tokens that the vocabulary has (EOS not twice). The server and the REPL
 * give them to chat requests as stop_token_ids, on top of the vocabulary's end-of-generation set
 * (llm_tokenizer_is_eog), which is chosen by token type and text with no knowledge of the family. Returns
 * the count, which may exceed cap (only the first cap written). */
int llm_chat_stop_ids(const llm_chat_template *ct, const llm_tokenizer *t, int32_t *ids, int cap) {
    /* each family's end-of-turn texts (none for the families whose turns end with EOS), looked up in the
     * vocabulary: a token the vocabulary lacks is left out */
    static const char *const end_of_turn[LLM_CHAT_NFAMILIES][2] = {
        [LLM_CHAT_CHATML] = {"<|im_end|>"}, [LLM_CHAT_QWEN3] = {"<|im_end|>"},
        [LLM_CHAT_QWQ] = {"<|im_end|>"},
        [LLM_CHAT_LLAMA3] = {"<|eot_id|>", "<|eom_id|>"}, [LLM_CHAT_PHI3] = {"<|end|>"},
        [LLM_CHAT_GEMMA] = {"<end_of_turn>"}, [LLM_CHAT_GPT_OSS] = {"<|return|>", "<|call|>"},
    };
    int n = 0;
    if (!t) return 0;
    if (t->eos >= 0) { if (n < cap) ids[n] = t->eos; n++; }
    for (int k = 0; k < 2 && ct->family >= 0 && ct->family < LLM_CHAT_NFAMILIES; k++) {
        const char *s = end_of_turn[ct->family][k];
        int id = s ? llm_tok_find(t, s, strlen(s)) : -1;
        if (id >= 0 && id != t->eos) { if (n < cap) ids[n] = id; n++; }
    }
    return n;
}

/* The </think> text the Qwen3 and QwQ families close their thinking with, as the tokenizer writes it */
int llm_chat_think_end_ids(const llm_chat_template *ct, const llm_tokenizer *t, int32_t *ids, int cap) {
    if (!t || (ct->family != LLM_CHAT_QWEN3 && ct->family != LLM_CHAT_QWQ)) return 0;
    int n = llm_tokenize(t, "</think>", 8, 0, 1, ids, cap);
    return n > 0 && n <= cap ? n : 0;
}

/* <think>, as the tokenizer writes it, where the reply writes it (Qwen3's, but for its thinking-only
 * templates, whose generation prompt opens the block as QwQ's does) */
int llm_chat_think_start_ids(const llm_chat_template *ct, const llm_tokenizer *t, int32_t *ids, int cap) {
    if (!t || ct->family != LLM_CHAT_QWEN3 || ct->opens_think) return 0;
    int n = llm_tokenize(t, "<think>", 7, 0, 1, ids, cap);
    return n > 0 && n <= cap ? n : 0;
}


/* ===========================================================================================================
 * 5. Requests and the scheduler
 * A request of n samples starts as one sequence; when its prompt is computed it forks into n sequences that
 * share the prompt's blocks. Every sequence goes the same way: its tokens [0, n_computed) have K/V in the
 * cache; each step computes the next chunk of the rest (a prompt chunk, or the one newest token), and when a
 * step reaches the end of its tokens, samples one more. Prefill, chunked prefill, decode and recompute after
 * preemption are all this one loop. The scheduler plans each step (vLLM's Scheduler.schedule): running
 * sequences first, oldest first, each given the blocks for its next chunk; when the pool runs out, the
 * youngest running sequence is preempted (its blocks go back; its tokens will be computed again). Then
 * waiting sequences, first come first served, while the step's token budget, max_num_seqs and the pool
 * allow. (Under the priority policy the queue is kept in order of priority, then arrival, and the sequence
 * preempted is the last in that order.) The plan is a list of (sequence, new tokens) and the block copies
 * that copy-on-write needs before the forward pass.
 *
 * A request's life, as the status of each of its sequences (llm_seq.status):
 *
 *   llm_engine_add_request -> inbox -> WAITING --admitted (llm_schedule)--> RUNNING --a stop--> FINISHED
 *                                        ^      prefix cache looked up       |       blocks back at once;
 *                                        |                                   |       output at the end of
 *                                        +--- preempted (llm_preempt) -------+       the step; freed at the
 *                                             blocks back, tokens kept,              start of the next
 *                                             head of the queue
 *
 * There is no PREEMPTED status: a preempted sequence is WAITING with more tokens than its prompt. It keeps
 * its tokens, its generator and its grammar state; it loses its K/V, so on its return it computes tokens
 * [0, len) again as one long prompt (recompute, as vLLM's V1 scheduler does: its _preempt_request frees the
 * blocks and sets num_computed_tokens to 0; there is no swapping to host memory here). Nothing is sampled
 * again: the tokens it has stand, and its next token is drawn when the recompute reaches their end. Its full
 * blocks were named in the prefix cache and wait at the free list's tail (section 6: evicted last), so a
 * return before the pool reuses them takes most of them back from the cache and computes only the rest.
 *
 * One step's plan (llm_schedule) has no prefill phase and no decode phase (vLLM's words): each sequence gets
 * n_new tokens so that its n_computed catches up with its tokens.
 *   1. Running sequences in list order (the order of admission), each its next chunk (llm_seq_chunk: all it
 *      has left, within the step's token budget, max_num_batched_tokens) and the blocks for it
 *      (llm_seq_reserve). Decoding costs 1 token; a prompt takes what the budget has left, so chunked prefill
 *      is just that minimum: a 10,000-token prompt under a budget of 2048 takes at least 5 steps, and when
 *      the budget runs out the sequences after it wait for the next step (they are not preempted).
 *   2. When the pool cannot give those blocks, the youngest running sequence (the last admitted) is
 *      preempted, again and again until the blocks are there, or until the sequence asking is the youngest
 *      and goes itself. Why the youngest: first come, first served holds among running sequences too, so an
 *      older request never loses its blocks to a younger one, and the one preempted goes back to the head of
 *      the queue, the first to return. What it costs is the recompute (less with the prefix cache). vLLM:
 *      self.running.pop() under FCFS, the max of (priority, arrival) under the priority policy, as
 *      llm_sched_victim.
 *   3. Speculative decoding's proposals, from the budget and the blocks left (never preempting for them).
 *   4. Waiting sequences from the head of the queue, while the budget, max_num_seqs and the pool allow; the
 *      first that does not fit stops the rest (strict order, as vLLM's waiting loop). None at all in a step
 *      that preempted: the pool is short, and a newcomer would take the blocks the preempted ones need back.
 *
 * Prefix caching at admission (llm_seq_take_cached_prefix): a sequence with no K/V (new, or back from a
 * preemption) looks up its full blocks by the hash of the whole prefix up to each block's end, a chain:
 *
 *   tokens (block_size 16, 50 tokens):  [t0 .. t15]     [t16 .. t31]    [t32 .. t47]    [t48 t49]
 *   the name of each full block:         h1 = H(salt,..)  h2 = H(h1, ..)  h3 = H(h2, ..)  (not full: no name)
 *   in the cache?                        yes              yes             no
 *   -> blocks 0 and 1 are shared (ref_count + 1), n_computed = 32, the step computes tokens 32..49
 *
 * One name stands for the whole prefix, so a block matches only where everything before it matches too, and
 * the first miss ends the run. At least one token is always left to compute, as its logits give the next
 * token (vLLM's max_cache_hit_length = num_tokens - 1). A block from the cache is never written: writing
 * starts at n_computed, a block boundary after a hit. The salt (cache_salt) starts the chain, so requests
 * with different salts share nothing. Entry points: llm_schedule, then llm_seq_reserve and
 * llm_seq_take_cached_prefix.
 * ======================================================================================================== */
llm_sampling_params llm_sampling_defaults(void) {
    llm_sampling_params p;
    memset(&p, 0, sizeof p);
    p.n = 1; p.temperature = 1.0f; p.top_p = 1.0f; p.repetition_penalty = 1.0f; p.seed = -1; p.logprobs = -1;
    p.prompt_logprobs = -1;
    return p;
}

/* Each key is taken when it is a number in the range the request check takes (so a file cannot make every
 * request fail), else named in the note; a key llama.cpp knows that has no field here is named too. */
int llm_model_sampling_defaults(const llm_model *m, llm_sampling_params *p, char *note) {
    static const struct { const char *key; int bit; double lo, hi; } keys[] = {
        {"general.sampling.temp", LLM_SAMPLING_TEMP, 0, 1e6},
        {"general.sampling.top_k", LLM_SAMPLING_TOP_K, -1e9, 1e9},     /* <= 0: off, as in llama.cpp */
        {"general.sampling.top_p", LLM_SAMPLING_TOP_P, 1e-9, 1},
        {"general.sampling.min_p", LLM_SAMPLING_MIN_P, 0, 1},
        {"general.sampling.penalty_repeat", LLM_SAMPLING_REPEAT, 1e-9, 1e6},
    };
    static const char *const unused[] = {
        "general.sampling.penalty_last_n", "general.sampling.xtc_probability",
        "general.sampling.xtc_threshold",
        "general.sampling.mirostat", "general.sampling.mirostat_tau", "general.sampling.mirostat_eta",
        "general.sampling.sequence"};
    char buf[LLM_ERR_LEN] = "";
    size_t at = 0;
    int got = 0;
#define LLM_NOTE(...) (at < sizeof buf ? at += (size_t)snprintf(buf + at, sizeof buf - at, __VA_ARGS__) : 0)
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const llm_gguf_kv *kv = llm_gguf_find(&m->gguf, keys[i].key);
        int64_t iv;
        double v;
        if (!kv) continue;
        int ok = llm_gguf_scalar(kv->type, kv->data, &iv, &v) && v >= keys[i].lo && v <= keys[i].hi;
        if (ok && keys[i].bit == LLM_SAMPLING_TOP_K) ok = v == floor(v);
        if (!ok) {
            LLM_NOTE("%s%s is not a number in [%g, %g]: ignored", at ? "; " : "", keys[i].key, keys[i].lo,
                     keys[i].hi);
            continue;
        }
        got |= keys[i].bit;
        switch (keys[i].bit) {
        case LLM_SAMPLING_TEMP: p->temperature = (float)v; break;
        case LLM_SAMPLING_TOP_K: p->top_k = v > 0 ? (int)v : 0; break;
        case LLM_SAMPLING_TOP_P: p->top_p = (float)v; break;
        case LLM_SAMPLING_MIN_P: p->min_p = (float)v; break;
        default: p->repetition_penalty = (float)v; break;
        }
    }
    int n_unused = 0;
    for (size_t i = 0; i < sizeof unused / sizeof *unused; i++)
        if (llm_gguf_find(&m->gguf, unused[i]))
            LLM_NOTE("%s%s", n_unused++ ? ", " : at ? "; not used (no such sampler here): " :
                     "not used (no such sampler here): ", unused[i] + strlen("general.sampling."));
#undef LLM_NOTE
    if (note) snprintf(note, LLM_ERR_LEN, "%s", buf);
    return got;
}

/* What the n sequences of one request share: its id, the caller's pointer, its parameters. The caller's
 * arrays (stop strings, stop ids, biases, allowed ids, bad words) are copied here, since a request outlives
 * the call that added it; params points at the copies. Counted: each sequence holds a reference (refs), and
 * the last one to be freed frees the request (llm_request_unref). */
typedef struct llm_request {
    uint64_t id;
    void *user;
    llm_sampling_params params;     /* its stop strings, stop ids and logit biases point at the copies */
    char **stop_copies;
    int32_t *stop_ids_copy, *bias_ids_copy, *allowed_copy, *bad_ids_copy, *bad_lens_copy, *think_end_copy;
    int32_t *think_start_copy;
    float *bias_copy;
    llm_grammar *grammar;           /* params.grammar parsed (params.grammar itself is NULL here) */
    uint64_t prefix_salt;           /* params.cache_salt hashed: its blocks' hash chain begins here (0:
                                     * none) */
    uint64_t grammar_turn;          /* the grammar thread's: when it last ran a job of it (its own count) */
    int n_prompt;
    int refs;                       /* sequences still pointing here */
} llm_request;

/* Where a sequence is: in the scheduler's waiting queue (new, or preempted), in its running list, or done
 * (its blocks already back, its output and then its memory going at the end of the step and the start of
 * the next) */
enum { LLM_SEQ_WAITING, LLM_SEQ_RUNNING, LLM_SEQ_FINISHED };

/* One sample of a request, the unit the scheduler plans: its tokens, how many of them have K/V in the cache
 * (n_computed), the blocks that hold them (a block table for each group of layers), where it is in the
 * prefix cache's hash chain, its generator, its detokenizer and its output for the step. The invariant the
 * scheduler keeps: the block tables cover at least positions [0, n_computed), and after llm_seq_reserve the
 * chunk planned too. */
typedef struct llm_seq {
    llm_request *req;
    int index;                      /* which of the request's n samples */
    int status;
    int32_t *tokens;                /* stb_ds array: the prompt, then the generated tokens */
    int n_computed;                 /* tokens [0, n_computed) have their K/V in the cache */
    int n_kv_groups;
    int32_t **block_tables;         /* [n_kv_groups] stb_ds arrays: the blocks that hold them, in position
                                     * order, for each group of layers (-1: slid out of a local group's
                                     * window) */
    int n_hashed_blocks;            /* leading full blocks named in the prefix cache ... */
    uint64_t last_hash;             /* ... and the name of the last of them */
    int fork_pending;               /* n > 1 and the prompt is not computed yet: this one stands for all n */
    int n_cached_tokens;            /* prompt tokens the prefix cache had at admission */
    int32_t draft[LLM_SPEC_MAX];    /* speculative decoding: the tokens proposed to follow, checked this
                                     * step */
    int n_draft;
    int32_t *spec_history;          /* stb_ds: the tokens, then the proposal: what its rows are drawn after */
    int n_draft_computed;           /* a draft model's K/V: tokens [0, n_draft_computed) (at most n_computed
                                     * but for the proposal it computes; one behind after a proposal kept
                                     * whole) */
    int spec_cap, spec_wait, spec_backoff; /* how many it may propose, steps to wait, the next wait after a
                                            * miss */
    float spec_rate;                /* the share of proposed tokens kept, recent proposals weighing most */
    uint64_t rng;
    int finish_reason;
    int stop_string;                /* finished by a stop string: 1 + its index in params.stop (0: not) */
    const char *error;              /* LLM_FINISH_ERROR: what went wrong */
    llm_grammar_state *grammar;     /* with a grammar: where the output so far is in it (a preempted sequence
                                     * keeps its tokens, and so its state) */
    int parked;                     /* its next token is the grammar thread's (section 10): the scheduler
                                     * neither plans nor preempts it until the token comes back */
    llm_detok detok;
    char *held_text;                /* stb_ds array: text decoded, not emitted (may begin a stop string) */
    /* this step's output (stb_ds arrays, emptied at the start of each step) */
    int32_t *out_tokens; char *out_text; float *out_logprobs; int32_t *out_top_ids; float *out_top_logprobs;
    /* prompt_logprobs: row i - 1 for prompt token i, written as the chunks of the prompt are computed (a
     * recompute after preemption writes them again), handed out once, by the step that computes its end */
    int plp_state;                  /* enum below */
    float *plp; int32_t *plp_rank, *plp_top_ids; float *plp_top;  /* malloc'ed: [n_prompt - 1] (x K) */
    /* an embedding (params.pooling): the hidden rows so far, summed in double (mean), or the one row kept
     * (cls, last), emptied when a chunk starts from position 0 again (a recompute after preemption); the
     * vector handed out in the finishing output */
    double *pool;                   /* malloc'ed: [dim] */
    int pool_rows;
    float *embedding;               /* malloc'ed: [dim] */
} llm_seq;

enum { LLM_PLP_NONE, LLM_PLP_PENDING, LLM_PLP_READY }; /* none asked (or handed out), computing, to go out */

/* A request with prompt logprobs sends its prompt through in chunks of at most this many tokens: each of its
 * tokens needs a row of logits (vocab_size floats), and a whole 2048-token budget of them is gigabytes. */
#define LLM_PLP_CHUNK 256

/* The scheduler: its limits (max_num_seqs running at once, max_num_batched_tokens a step), the block
 * manager it hands blocks from, the two queues, and the plan of the step it last made (scheduled, n_new and
 * the block copies), which the engine reads to build the batch. */
typedef struct {
    int max_num_seqs, max_num_batched_tokens, static_batching;
    int priority_policy;            /* LLM_SCHED_PRIORITY (llm_engine_config.scheduling_policy) */
    llm_block_manager *bm;
    int spec_tokens, spec_ngram_max, spec_ngram_min; /* speculative decoding (llm_engine_config) */
    int spec_draft_model;           /* the proposals come from a draft model, written before the forward
                                     * pass */
    int max_model_len;
    int n_kv_groups;                /* the model's groups of layers (llm_kv_groups) ... */
    int *kv_window;                 /* ... and each one's window (0: a global group keeps every block) */
    llm_seq **waiting, **running;   /* stb_ds arrays, in order of arrival (waiting under the priority policy:
                                     * of llm_seq_served_before); waiting is served from the front */
    int static_batch_open;          /* static batching: the batch may take new sequences */
    /* the plan of this step: scheduled[i] computes n_new[i] tokens from its n_computed on, after the
     * copies */
    llm_seq **scheduled;
    int *n_new;
    int32_t *copy_src, *copy_dst;
    int64_t preemptions, prefix_cache_queries, prefix_cache_hits;
} llm_scheduler;

/* All of s's blocks go back to the pool, and its K/V with them (n_computed 0: all of its tokens are to be
 * computed again). A block the prefix cache named keeps its name on the free list until it is reused, so a
 * later admission may take it back; the hash chain starts again from the request's salt. */
static void llm_seq_release_blocks(llm_scheduler *sch, llm_seq *s) {
    for (int g = 0; g < sch->n_kv_groups; g++) {
        for (int i = 0; i < arrlen(s->block_tables[g]); i++)
            if (s->block_tables[g][i] >= 0) llm_block_release(sch->bm, s->block_tables[g][i]);
        arrsetlen(s->block_tables[g], 0);
    }
    s->n_computed = 0; s->n_draft_computed = 0; s->n_hashed_blocks = 0; s->last_hash = s->req->prefix_salt;
}

/* The blocks past the first n_tokens positions go back to the pool (those of a proposal's refused tokens) */
static void llm_seq_trim_blocks(llm_block_manager *bm, llm_seq *s, int n_tokens) {
    int bs = bm->block_size, keep = (n_tokens + bs - 1) / bs;
    for (int g = 0; g < s->n_kv_groups; g++)
        while (arrlen(s->block_tables[g]) > keep) {
            int id = arrpop(s->block_tables[g]);
            if (id >= 0) llm_block_release(bm, id);
        }
}

/* The first block that a query at position pos or later reads in a group of layers with this window: the
 * blocks before it have slid out of the window (0 for a global group, window 0) */
static int llm_window_first_block(int window, int pos, int block_size) {
    return window > 0 && pos + 1 > window ? (pos + 1 - window) / block_size : 0;
}

/* Gives s the blocks for positions [0, n_total) in each group of layers, with a private copy of any shared
 * block it is about to write (copy-on-write), and returns 1; or, when the pool has not that many free
 * blocks, returns 0 having changed nothing but this: first, a local group gives back the blocks that its
 * window has left (vLLM's sliding-window manager), as no query from n_computed on reads them. */
static int llm_seq_reserve(llm_scheduler *sch, llm_seq *s, int n_total) {
    llm_block_manager *bm = sch->bm;
    int bs = bm->block_size, first = s->n_computed / bs, want = (n_total + bs - 1) / bs, need = 0;
    /* 1. count: a new block for each one the table lacks up to want (none where the window has passed),
     *    and a private copy of each shared block from `first` (the block n_computed falls in) on, as those
     *    are the ones this chunk writes into */
    for (int g = 0; g < sch->n_kv_groups; g++) {
        int32_t *table = s->block_tables[g];
        int have = (int)arrlen(table), gone = llm_window_first_block(sch->kv_window[g], s->n_computed, bs);
        for (int b = 0; b < gone && b < have; b++)
            if (table[b] >= 0) { llm_block_release(bm, table[b]); table[b] = -1; }
        for (int b = have; b < want; b++) need += b >= gone;
        for (int b = first; b < have && b * bs < n_total; b++) need += bm->blocks[table[b]].ref_count > 1;
    }
    /* 2. all or nothing: without that many free blocks nothing is taken (cached blocks with no user count as
     *    free: they are on the free list, and taking one drops its name) */
    if (need > bm->num_free_blocks) return 0;
    /* 3. the copies (each planned in copy_src/copy_dst for the forward pass, the shared block's reference
     *    dropped), then the new blocks at the table's end */
    for (int g = 0; g < sch->n_kv_groups; g++) {
        int gone = llm_window_first_block(sch->kv_window[g], s->n_computed, bs);
        for (int b = first; b < arrlen(s->block_tables[g]) && b * bs < n_total; b++) {
            int shared = s->block_tables[g][b];
            if (bm->blocks[shared].ref_count <= 1) continue;
            int copy = llm_block_alloc(bm);
            arrput(sch->copy_src, shared); arrput(sch->copy_dst, copy);
            llm_block_release(bm, shared);
            s->block_tables[g][b] = copy;
        }
        while (arrlen(s->block_tables[g]) < want)
            arrput(s->block_tables[g], arrlen(s->block_tables[g]) < gone ? -1 : llm_block_alloc(bm));
    }
    return 1;
}

/* A block's name in the prefix cache, for one group of layers: the hash of its prefix, told apart by group
 * (group 0's, the only one of a model without windows, is the hash itself) */
static uint64_t llm_kv_group_hash(uint64_t hash, int group) {
    int32_t g = group;
    return group ? llm_block_hash(hash, &g, 1) : hash;
}

/* The longest run of whole cached blocks at the start of the tokens, leaving at least one token to compute
 * (the step that computes it gives the logits to sample from). A prefix of L blocks is there when every
 * global group has its L blocks and every local group those that a query at position L * block_size reads
 * (its window's; the rest may have gone back to the pool and been reused). */
static void llm_seq_take_cached_prefix(llm_scheduler *sch, llm_seq *s) {
    llm_block_manager *bm = sch->bm;
    int bs = bm->block_size, n = (int)arrlen(s->tokens), n_global = 0;
    if (!bm->enable_prefix_caching) return;
    while (n_global < sch->n_kv_groups && sch->kv_window[n_global] == 0) n_global++; /* they come first */
    uint64_t *hashes = NULL, h = s->req->prefix_salt; /* stb_ds array: each block's prefix hash, while the
                                                        * global groups have it */
    /* 1. the run of full blocks (of the first n - 1 tokens) that every global group has, block by block
     *    along the hash chain */
    for (int b = 0; (b + 1) * bs <= n - 1; b++) {
        h = llm_block_hash(h, s->tokens + b * bs, bs);
        int all = 1;
        for (int g = 0; g < n_global && all; g++) all = hmgeti(bm->cached, llm_kv_group_hash(h, g)) >= 0;
        if (!all) break;
        arrput(hashes, h);
    }
    int L = (int)arrlen(hashes);
    /* 2. shortened until each local group has the blocks its window reads at position L * bs (a miss
     *    shortens L, which moves the window: the local groups are checked again from the first) */
    for (int g = n_global; g < sch->n_kv_groups && L > 0; g++) { /* a miss at block b: L at most b */
        for (int b = L - 1; b >= llm_window_first_block(sch->kv_window[g], L * bs, bs); b--)
            if (hmgeti(bm->cached, llm_kv_group_hash(hashes[b], g)) < 0) { L = b; g = n_global - 1; break; }
    }
    /* 3. the L blocks taken: each one a reference more (llm_block_lookup takes an unused one off the free
     *    list), -1 for those a local window has left */
    for (int g = 0; g < sch->n_kv_groups && L > 0; g++) {
        int gone = llm_window_first_block(sch->kv_window[g], L * bs, bs);
        for (int b = 0; b < L; b++)
            arrput(s->block_tables[g], b < gone ? -1 : llm_block_lookup(bm, llm_kv_group_hash(hashes[b], g)));
    }
    if (L > 0) { /* a draft model's K/V are in them too: it computed every token the model did */
        s->n_hashed_blocks = L; s->last_hash = hashes[L - 1]; s->n_computed = s->n_draft_computed = L * bs;
    }
    arrfree(hashes);
}

/* The priority policy's order: lower priority first, then arrival (request ids are handed out in order), then
 * the samples of one request in their order */
static int llm_seq_served_before(const llm_seq *a, const llm_seq *b) {
    int pa = a->req->params.priority, pb = b->req->params.priority;
    if (pa != pb) return pa < pb;
    if (a->req->id != b->req->id) return a->req->id < b->req->id;
    return a->index < b->index;
}

/* s joins the waiting queue: new at its end, preempted at its head; under the priority policy at its place */
static void llm_sched_wait(llm_scheduler *sch, llm_seq *s, int preempted) {
    int at = preempted ? 0 : (int)arrlen(sch->waiting);
    if (sch->priority_policy)
        for (at = 0; at < arrlen(sch->waiting) && llm_seq_served_before(sch->waiting[at], s); at++) {}
    arrins(sch->waiting, at, s);
}

/* Preemption by recompute: the sequence gives its blocks back and waits again (vLLM's _preempt_request). Its
 * tokens, generator, grammar state and text stay, so it goes on where it stopped once its tokens are
 * computed again; a proposal not checked yet is dropped. The caller has taken it out of the running list. */
static void llm_preempt(llm_scheduler *sch, llm_seq *s) {
    llm_seq_release_blocks(sch, s);
    s->n_draft = 0;
    s->status = LLM_SEQ_WAITING;
    llm_sched_wait(sch, s, 1);
    sch->preemptions++;
}

/* The running sequence to preempt when the pool runs out: the youngest, or under the priority policy the last
 * in its order (vLLM's max by (priority, arrival)) */
static int llm_sched_victim(const llm_scheduler *sch) {
    int v = (int)arrlen(sch->running) - 1;
    while (v > 0 && sch->running[v]->parked) v--; /* (the sequence asking is never parked) */
    for (int j = 0; sch->priority_policy && j < arrlen(sch->running); j++)
        if (!sch->running[j]->parked && llm_seq_served_before(sch->running[v], sch->running[j])) v = j;
    return v;
}

/* s leaves the step's plan (the priority policy may preempt a sequence planned already): its tokens go back
 * to the budget, and the copies into its blocks (copy on write) are not made: those blocks go back with it */
static void llm_sched_unplan(llm_scheduler *sch, llm_seq *s, int *budget) {
    for (int k = 0; k < arrlen(sch->scheduled); k++)
        if (sch->scheduled[k] == s) {
            *budget += sch->n_new[k];
            arrdel(sch->scheduled, k); arrdel(sch->n_new, k);
            break;
        }
    for (int k = 0; k < arrlen(sch->copy_dst); k++) {
        int mine = 0;
        for (int g = 0; g < sch->n_kv_groups; g++)
            for (int b = 0; b < arrlen(s->block_tables[g]); b++)
                mine |= s->block_tables[g][b] == sch->copy_dst[k];
        if (mine) { arrdel(sch->copy_src, k); arrdel(sch->copy_dst, k); k--; }
    }
}

/* The next chunk of s: the rest of its tokens, within the budget (and LLM_PLP_CHUNK for prompt logprobs).
 * This minimum is all of chunked prefill: a prompt longer than the budget goes through over several steps,
 * a part a step, and only the step that reaches its end samples. */
static int llm_seq_chunk(const llm_seq *s, int budget) {
    int n_new = (int)arrlen(s->tokens) - s->n_computed;
    if (n_new > budget) n_new = budget;
    if (s->plp_state == LLM_PLP_PENDING && n_new > LLM_PLP_CHUNK) n_new = LLM_PLP_CHUNK;
    return n_new;
}

static void llm_schedule_add(llm_scheduler *sch, llm_seq *s, int n_new, int *budget) {
    arrput(sch->scheduled, s); arrput(sch->n_new, n_new);
    *budget -= n_new;
}

/* Speculative decoding's proposer, n-gram lookup (prompt lookup): the sequence's last n tokens, n from
 * spec_ngram_max down to spec_ngram_min, found at an earlier place in its prompt or output (the latest),
 * propose the tokens that followed them there, at most max. Where those run up to the end of the sequence
 * (a match p tokens back: the text repeating with period p, as a model caught in a loop does), the proposal
 * goes on repeating them: token len + k is proposed as token len + k - p (a sequence looping over two tokens
 * proposed 2 at a time, not max). Returns how many, in s->draft. */
static int llm_seq_propose(const llm_scheduler *sch, llm_seq *s, int max) {
    int len = (int)arrlen(s->tokens);
    const int32_t *t = s->tokens;
    for (int n = sch->spec_ngram_max; n >= sch->spec_ngram_min; n--)
        for (int at = len - n - 1; at >= 0; at--) {
            if (memcmp(t + at, t + len - n, (size_t)n * sizeof(int32_t)) != 0) continue;
            int period = len - n - at;
            for (int k = 0; k < max; k++)
                s->draft[k] = k < period ? t[len - period + k] : s->draft[k - period];
            return max;
        }
    return 0;
}

/* A decoding sequence's proposal, when speculative decoding is on, with the blocks for it: the step then
 * computes its last token and the proposal's, within budget more tokens (not before its prompt's samples
 * fork). Under a grammar too: each token is sampled under it, and a proposed one kept only when it is the
 * token sampled. Returns how many tokens were proposed (a draft model's: how many it is to propose, before
 * the forward pass, llm_engine_draft). */
static int llm_seq_speculate(llm_scheduler *sch, llm_seq *s, int budget) {
    int len = (int)arrlen(s->tokens), max = sch->spec_tokens;
    const llm_sampling_params *p = &s->req->params;
    if (!max || s->n_computed != len - 1 || s->fork_pending || s->plp_state == LLM_PLP_PENDING || p->pooling)
        return 0;
    if (max > budget) max = budget;                         /* the step's token budget */
    if (max > sch->max_model_len - len - 1) max = sch->max_model_len - len - 1; /* the context */
    /* accepted, all would end it */
    if (p->max_tokens > 0 && max > p->max_tokens - (len - s->req->n_prompt) - 1)
        max = p->max_tokens - (len - s->req->n_prompt) - 1;
    /* the proposal's length follows how the last ones fared: all kept, twice as many next time; some, that
     * many. And a step of k + 1 tokens costs more than one of 1 (on a CPU, SmolLM2 Q4_1's matrix products on
     * one thread: 2 tokens 1.5 times one, 5 tokens 1.8, 8 tokens 2.3, 17 tokens 3.9, on a Sapphire Rapids:
     * tools/matmul_steps.c), so proposals that are mostly refused cost more than they give: while under 85%
     * of the proposed tokens are kept (recent proposals weighing most), none for a while, twice as long each
     * time in a row (a text that does not repeat soon stops paying for proposals) */
    if (!s->spec_cap) { s->spec_cap = sch->spec_tokens; s->spec_backoff = 1; s->spec_rate = 1; }
    if (s->spec_wait > 0) { s->spec_wait--; return 0; }
    if (max > s->spec_cap) max = s->spec_cap;
    if (max <= 0) return 0;
    int n = sch->spec_draft_model ? max : llm_seq_propose(sch, s, max);
    if (n > 0 && llm_seq_reserve(sch, s, len + n)) s->n_draft = n;
    return s->n_draft;
}

/* Plans one step, parts 1-4 of the section's opening: running sequences (preempting the youngest when
 * blocks run out), proposals, then waiting ones. Writes scheduled, n_new and the copies; moves
 * sequences between the queues (admitted: waiting -> running; preempted: running -> waiting). Sequences
 * are only planned here: n_computed moves when the step's tokens are computed (llm_engine_sample). */
static void llm_schedule(llm_scheduler *sch) {
    int budget = sch->max_num_batched_tokens, preempted = 0;
    arrsetlen(sch->scheduled, 0); arrsetlen(sch->n_new, 0);
    arrsetlen(sch->copy_src, 0); arrsetlen(sch->copy_dst, 0);
    /* running sequences first, oldest first */
    for (int i = 0; i < arrlen(sch->running) && budget > 0; i++) {
        llm_seq *s = sch->running[i];
        if (s->parked) continue; /* its token is not drawn yet */
        int n_new = llm_seq_chunk(s, budget), ok;
        s->n_draft = 0;
        while (!(ok = llm_seq_reserve(sch, s, s->n_computed + n_new))) {
            /* out of blocks: the youngest running sequence gives its blocks back (perhaps s itself; under the
             * priority policy perhaps one planned already) */
            int v = llm_sched_victim(sch);
            llm_seq *victim = sch->running[v];
            if (v < i) { llm_sched_unplan(sch, victim, &budget); i--; }
            arrdel(sch->running, v);
            llm_preempt(sch, victim);
            preempted = 1;
            if (victim == s) break;
        }
        if (!ok) break;
        llm_schedule_add(sch, s, n_new, &budget);
    }
    if (preempted) return; /* the pool is short: nobody new until the preempted are back */
    /* speculative decoding: proposals from the blocks and budget left, never preempting anyone for them */
    for (int i = 0; i < arrlen(sch->scheduled) && budget > 0; i++) {
        int n_draft = llm_seq_speculate(sch, sch->scheduled[i], budget);
        sch->n_new[i] += n_draft; budget -= n_draft;
    }
    if (sch->static_batching) {
        if (arrlen(sch->running) == 0) sch->static_batch_open = 1;
        if (!sch->static_batch_open) return;
    }
    /* then waiting sequences, first come first served: the first that does not fit stops the rest */
    while (arrlen(sch->waiting) > 0 && budget > 0) {
        llm_seq *s = sch->waiting[0];
        /* a request of n samples takes n places at once, as it forks once its prompt is computed; with
         * nothing running it goes in even when n > max_num_seqs, or it could never run */
        int width = s->fork_pending ? s->req->params.n : 1;
        if (arrlen(sch->running) > 0 && arrlen(sch->running) + width > sch->max_num_seqs) break;
        /* prompt logprobs need the logits of every prompt position, so such a request computes its whole
         * prompt and takes nothing from the prefix cache, as vLLM does (its blocks are named for others) */
        /* so does a mean or cls embedding: it needs the hidden state of every position, which the cache
         * does not keep (a last-token one computes its last position anyway) */
        int pool_all = s->req->params.pooling == LLM_POOL_MEAN || s->req->params.pooling == LLM_POOL_CLS;
        if (s->n_computed == 0 && arrlen(s->block_tables[0]) == 0 && s->plp_state != LLM_PLP_PENDING &&
            !pool_all)
            llm_seq_take_cached_prefix(sch, s);
        int n_new = llm_seq_chunk(s, budget);
        /* no room: the cached blocks it took go back too (it looks again next step) */
        if (!llm_seq_reserve(sch, s, s->n_computed + n_new)) { llm_seq_release_blocks(sch, s); break; }
        arrdel(sch->waiting, 0);
        /* counted at admission: a request that waits at the head looks the cache up again every step */
        sch->prefix_cache_queries += arrlen(s->tokens); sch->prefix_cache_hits += s->n_computed;
        if (s->n_cached_tokens == 0) s->n_cached_tokens = s->n_computed;
        s->status = LLM_SEQ_RUNNING;
        arrput(sch->running, s);
        llm_schedule_add(sch, s, n_new, &budget);
    }
    /* static batching closes the batch once it is full, or was stopped by something other than the budget */
    if (sch->static_batching &&
        (arrlen(sch->waiting) == 0 || arrlen(sch->running) >= sch->max_num_seqs || budget > 0))
        sch->static_batch_open = 0;
}

/* ---- Sequences: made from a request, forked, named in the prefix cache, freed -------------------------- */
/* The tokens of all of a request's bad words (their lengths checked first) */
static int64_t llm_bad_words_total(const llm_sampling_params *p) {
    int64_t n = 0;
    for (int i = 0; i < p->n_bad_words; i++) n += p->bad_word_lens[i];
    return n;
}

/* Rejects parameters that could never run, with the reason. */
static int llm_request_check(const llm_sampling_params *p, char *err) {
    if (p->n < 1 || p->n > 128) return llm_fail(err, "n must be between 1 and 128, got %d", p->n);
    if (!(p->temperature >= 0.0f && isfinite(p->temperature)))
        return llm_fail(err, "temperature must be a finite number >= 0");
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return llm_fail(err, "top_p must be in (0, 1]");
    if (p->top_k < 0) return llm_fail(err, "top_k must be >= 0 (0 disables it)");
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return llm_fail(err, "min_p must be in [0, 1]");
    if (!(p->repetition_penalty > 0.0f && isfinite(p->repetition_penalty)))
        return llm_fail(err, "repetition_penalty must be a finite number > 0");
    if (!(fabsf(p->presence_penalty) <= 2.0f && fabsf(p->frequency_penalty) <= 2.0f))
        return llm_fail(err, "presence_penalty and frequency_penalty must be in [-2, 2]");
    if (p->max_tokens < 0) return llm_fail(err, "max_tokens must be >= 0");
    if (p->min_tokens < 0 || (p->max_tokens > 0 && p->min_tokens > p->max_tokens))
        return llm_fail(err, "min_tokens must be between 0 and max_tokens");
    if (p->logprobs > 20) return llm_fail(err, "logprobs must be at most 20");
    if (p->prompt_logprobs > 20) return llm_fail(err, "prompt_logprobs must be at most 20");
    if (p->pooling < LLM_POOL_NONE || p->pooling > LLM_POOL_RANK)
        return llm_fail(err, "pooling must be none, mean, cls, last or rank (%d)", p->pooling);
    if (p->pooling && (p->n != 1 || p->prompt_logprobs >= 0 || p->grammar || p->grammar_parsed))
        return llm_fail(err, "an embedding (pooling) generates nothing: n must be 1, and no prompt_logprobs "
                        "or grammar");
    if (p->n_stop < 0 || p->n_stop > 16 || (p->n_stop && !p->stop))
        return llm_fail(err, "at most 16 stop strings");
    if (p->n_stop_token_ids < 0 || (p->n_stop_token_ids && !p->stop_token_ids))
        return llm_fail(err, "n_stop_token_ids without stop_token_ids");
    if (p->n_logit_bias < 0 || (p->n_logit_bias && (!p->logit_bias_ids || !p->logit_bias)))
        return llm_fail(err, "n_logit_bias without logit_bias_ids and logit_bias");
    if (p->n_allowed_token_ids < 0 || (p->n_allowed_token_ids && !p->allowed_token_ids))
        return llm_fail(err, "n_allowed_token_ids without allowed_token_ids");
    if (p->n_bad_words < 0 || (p->n_bad_words && (!p->bad_word_ids || !p->bad_word_lens)))
        return llm_fail(err, "n_bad_words without bad_word_ids and bad_word_lens");
    for (int i = 0; i < p->n_bad_words; i++)
        if (p->bad_word_lens[i] < 1 || p->bad_word_lens[i] > 4096)
            return llm_fail(err, "bad word %d has %d tokens (1 to 4096)", i, p->bad_word_lens[i]);
    if (p->think_budget < 0 || (p->think_budget && (p->n_think_end_ids < 1 || p->n_think_end_ids > 8 ||
                                                   !p->think_end_ids)))
        return llm_fail(err, "think_budget must be >= 0, and with one think_end_ids must hold 1 to 8 ids");
    if (p->n_think_start_ids < 0 || p->n_think_start_ids > 8 || (p->n_think_start_ids && !p->think_start_ids))
        return llm_fail(err, "think_start_ids must hold 0 to 8 ids");
    for (int i = 0; i < p->n_logit_bias; i++)
        if (!(fabsf(p->logit_bias[i]) <= 100.0f))
            return llm_fail(err, "logit_bias values must be in [-100, 100], got %g for token %d",
                            (double)p->logit_bias[i], p->logit_bias_ids[i]);
    return 0;
}

/* The generator of sample `index` of a request: seed + index, or the clock when the seed is -1. Each
 * sequence has a generator of its own (splitmix64's state, llm_seq.rng), so that the draws of a seeded
 * request depend on its seed and its logits alone: not on the other sequences in the batch, their order, the
 * thread that draws its row, or a preemption. Sample i of n mixes in its index: the n samples differ, and
 * each is reproducible. */
static uint64_t llm_seed_mix(int64_t seed, int index) {
    uint64_t s = seed >= 0 ? (uint64_t)seed
                           : ((uint64_t)time(NULL) ^ ((uint64_t)clock() << 20) ^ (uint64_t)(uintptr_t)&seed);
    s += 0x632be59bd9b4e019ull * (uint64_t)(index + 1);
    return llm_splitmix64(&s);
}

/* A sequence lets go of its request: the last one frees the copies, the grammar and the request */
static void llm_request_unref(llm_request *r) {
    if (--r->refs > 0) return;
    for (int i = 0; i < r->params.n_stop; i++) free(r->stop_copies[i]);
    free(r->stop_copies); free(r->stop_ids_copy); free(r->bias_ids_copy); free(r->bias_copy);
    free(r->allowed_copy); free(r->bad_ids_copy); free(r->bad_lens_copy); free(r->think_end_copy);
    free(r->think_start_copy);
    llm_grammar_free(r->grammar);
    free(r);
}

/* Frees s and its arrays, and lets go of its request. Its blocks are not given back here: finishing did that
 * (llm_seq_finish), or the pool goes with the engine. */
static void llm_seq_free(llm_seq *s) {
    for (int g = 0; s->block_tables && g < s->n_kv_groups; g++) arrfree(s->block_tables[g]);
    free(s->block_tables);
    arrfree(s->tokens); arrfree(s->held_text);
    arrfree(s->out_tokens); arrfree(s->out_text); arrfree(s->out_logprobs);
    arrfree(s->out_top_ids); arrfree(s->out_top_logprobs); arrfree(s->spec_history);
    free(s->plp); free(s->plp_rank); free(s->plp_top_ids); free(s->plp_top);
    free(s->pool); free(s->embedding);
    llm_grammar_state_free(s->grammar);
    llm_request_unref(s->req);
    free(s);
}

/* A copy of n values of size bytes each (room for one more, so that n = 0 is not a NULL) */
static void *llm_copy_of(const void *src, int64_t n, size_t size) {
    void *copy = malloc(((size_t)n + 1) * size);
    if (copy && n > 0) memcpy(copy, src, (size_t)n * size);
    return copy;
}

/* A request and its first sequence, which takes the prompt's ids (an stb_ds array). The caller's stop strings
 * and stop ids are copied: the request outlives the call. NULL when out of memory (ids freed). The grammar,
 * when given, is taken (freed on failure). The sequence starts WAITING, with no blocks and n_computed 0; with
 * n > 1 it stands for all n samples until its prompt is computed (fork_pending). */
static llm_seq *llm_seq_new(int32_t *ids, const llm_sampling_params *p, llm_grammar *grammar, void *user,
                            int n_kv_groups) {
    llm_request *r = (llm_request *)calloc(1, sizeof *r);
    llm_seq *s = (llm_seq *)calloc(1, sizeof *s);
    if (s) s->block_tables = (int32_t **)calloc((size_t)n_kv_groups, sizeof(int32_t *));
    if (s && s->block_tables) s->n_kv_groups = n_kv_groups;
    if (r) {
        r->params = *p; r->user = user; r->n_prompt = (int)arrlen(ids); r->refs = 1;
        r->params.stop = NULL; r->params.stop_token_ids = NULL; r->params.n_stop = 0;
        for (const char *c = p->cache_salt; c && *c; c++) { /* a byte a step of the chain */
            int32_t byte = (unsigned char)*c;
            r->prefix_salt = llm_block_hash(r->prefix_salt, &byte, 1);
        }
        r->params.cache_salt = NULL;
        r->stop_copies = (char **)calloc((size_t)p->n_stop + 1, sizeof(char *));
        r->stop_ids_copy = (int32_t *)llm_copy_of(p->stop_token_ids, p->n_stop_token_ids, sizeof(int32_t));
        r->bias_ids_copy = (int32_t *)llm_copy_of(p->logit_bias_ids, p->n_logit_bias, sizeof(int32_t));
        r->bias_copy = (float *)llm_copy_of(p->logit_bias, p->n_logit_bias, sizeof(float));
        r->allowed_copy = (int32_t *)llm_copy_of(p->allowed_token_ids,
                                                 p->n_allowed_token_ids, sizeof(int32_t));
        r->bad_ids_copy = (int32_t *)llm_copy_of(p->bad_word_ids, llm_bad_words_total(p), sizeof(int32_t));
        r->bad_lens_copy = (int32_t *)llm_copy_of(p->bad_word_lens, p->n_bad_words, sizeof(int32_t));
        r->think_end_copy = (int32_t *)llm_copy_of(p->think_end_ids, p->n_think_end_ids, sizeof(int32_t));
        r->think_start_copy = (int32_t *)llm_copy_of(p->think_start_ids, p->n_think_start_ids,
                                                     sizeof(int32_t));
    }
    int ok = s && s->block_tables && r && r->stop_copies && r->stop_ids_copy && r->bias_ids_copy &&
        r->bias_copy && r->allowed_copy && r->bad_ids_copy && r->bad_lens_copy && r->think_end_copy &&
        r->think_start_copy;
    if (ok && grammar) { r->grammar = grammar; ok = (s->grammar = llm_grammar_start(grammar)) != NULL; }
    else llm_grammar_free(grammar); /* not taken: the caller's copy goes with the rest */
    if (ok && p->prompt_logprobs >= 0) { /* the rows of prompt tokens 1.., and K alternatives each */
        size_t rows = (size_t)arrlen(ids), k = (size_t)p->prompt_logprobs; /* n_prompt - 1, and a spare */
        s->plp_state = LLM_PLP_PENDING;
        ok = (s->plp = (float *)malloc(rows * sizeof(float))) &&
             (s->plp_rank = (int32_t *)malloc(rows * sizeof(int32_t))) &&
             (s->plp_top_ids = (int32_t *)malloc(rows * k * sizeof(int32_t) + 4)) &&
             (s->plp_top = (float *)malloc(rows * k * sizeof(float) + 4));
    }
    for (int i = 0; ok && i < p->n_stop; i++, r->params.n_stop++)
        ok = (r->stop_copies[i] = strdup(p->stop[i] ? p->stop[i] : "")) != NULL;
    if (!ok) {
        if (r) { r->refs = 1; llm_request_unref(r); }
        if (s) { free(s->plp); free(s->plp_rank); free(s->plp_top_ids); free(s->plp_top); }
        if (s) { llm_grammar_state_free(s->grammar); free(s->block_tables); }
        free(s); arrfree(ids);
        return NULL;
    }
    r->params.stop = (const char *const *)r->stop_copies;
    r->params.stop_token_ids = r->stop_ids_copy;
    r->params.logit_bias_ids = r->bias_ids_copy; r->params.logit_bias = r->bias_copy;
    r->params.allowed_token_ids = r->allowed_copy;
    r->params.bad_word_ids = r->bad_ids_copy; r->params.bad_word_lens = r->bad_lens_copy;
    r->params.think_end_ids = r->think_end_copy; r->params.think_start_ids = r->think_start_copy;
    r->params.grammar = NULL; r->params.grammar_parsed = NULL;
    s->req = r; s->tokens = ids; s->rng = llm_seed_mix(p->seed, 0); s->fork_pending = p->n > 1;
    s->last_hash = r->prefix_salt;
    s->detok.special = p->special_text != 0;
    s->status = LLM_SEQ_WAITING;
    return s;
}

/* n > 1, when the prompt is computed: samples 1..n-1 start from it, sharing all its blocks (a block is copied
 * only when a sample writes into it), each with its own generator. They join the end of the running list. -1
 * when out of memory (then nothing changed). Why fork this late: the prompt is computed once, not n times,
 * and its K/V are shared for free; only a last, partly filled block is copied, by each sample that writes
 * into it while another still shares it (llm_seq_reserve). Until then the one sequence stands for all n
 * (admission counts n places).
 * A child copies the parent's tokens and block tables (each block a reference more) and its place in the
 * hash chain; its output, text and speculation start empty. */
static int llm_seq_fork(llm_scheduler *sch, llm_seq *s) {
    int n = s->req->params.n;
    llm_seq **children = (llm_seq **)calloc((size_t)n, sizeof *children);
    int ok = children != NULL;
    for (int i = 1; ok && i < n; i++) {
        ok = (children[i] = (llm_seq *)calloc(1, sizeof(llm_seq))) != NULL &&
             (children[i]->block_tables = (int32_t **)calloc((size_t)s->n_kv_groups, sizeof(int32_t *)));
        if (ok) children[i]->n_kv_groups = s->n_kv_groups;
        if (ok && s->grammar) ok = (children[i]->grammar = llm_grammar_state_copy(s->grammar)) != NULL;
    }
    if (!ok) {
        for (int i = 1; children && i < n; i++)
            if (children[i]) {
                llm_grammar_state_free(children[i]->grammar);
                free(children[i]->block_tables); free(children[i]);
            }
        free(children);
        return -1;
    }
    s->fork_pending = 0;
    for (int i = 1; i < n; i++) {
        llm_seq *c = children[i];
        c->req = s->req; c->index = i; c->status = s->status; c->n_computed = s->n_computed;
        c->n_draft_computed = s->n_draft_computed;
        c->n_hashed_blocks = s->n_hashed_blocks; c->last_hash = s->last_hash;
        c->n_cached_tokens = s->n_cached_tokens;
        c->rng = llm_seed_mix(s->req->params.seed, i);
        c->detok.special = s->detok.special;
        int n_tokens = (int)arrlen(s->tokens);
        memcpy(arraddnptr(c->tokens, n_tokens), s->tokens, (size_t)n_tokens * sizeof(int32_t));
        for (int g = 0; g < sch->n_kv_groups; g++) {
            int n_blocks = (int)arrlen(s->block_tables[g]);
            memcpy(arraddnptr(c->block_tables[g], n_blocks), s->block_tables[g],
                   (size_t)n_blocks * sizeof(int32_t));
            for (int b = 0; b < n_blocks; b++)
                if (c->block_tables[g][b] >= 0) sch->bm->blocks[c->block_tables[g][b]].ref_count++;
        }
        s->req->refs++;
        arrput(sch->running, c);
    }
    free(children);
    return 0;
}

/* Names each newly completed block by its prefix (and group), so that later requests can share it. Called
 * when a step's tokens are computed and when a proposal is checked: blocks [n_hashed_blocks, n_computed / bs)
 * get the next links of the chain from last_hash. Generated tokens are named too, so a preempted sequence
 * finds them on its return, as does a later prompt with the same tokens. A block whose content is cached in
 * another block already keeps no name (llm_block_set_hash). */
static void llm_seq_hash_blocks(llm_block_manager *bm, llm_seq *s) {
    int bs = bm->block_size;
    while ((s->n_hashed_blocks + 1) * bs <= s->n_computed) {
        int b = s->n_hashed_blocks;
        s->last_hash = llm_block_hash(s->last_hash, s->tokens + b * bs, bs);
        for (int g = 0; g < s->n_kv_groups; g++)
            if (s->block_tables[g][b] >= 0)
                llm_block_set_hash(bm, s->block_tables[g][b], llm_kv_group_hash(s->last_hash, g));
        s->n_hashed_blocks++;
    }
}

/* ===========================================================================================================
 * 6. Blocks: KV blocks handed out from a free list, named by hash for prefix caching
 * The bookkeeping of the paged KV cache, as vLLM's BlockPool: block ids, reference counts, names; the K and V
 * memory itself is the backend's (section 7), a block id an index into it. The scheduler (section 5) asks
 * for blocks (llm_seq_reserve), shares them (a cached prefix, the n samples of one request), copies a
 * shared block before writing it (copy-on-write) and names each block once it is full (llm_seq_hash_blocks).
 *
 * The free list, a doubly linked list through the block records (O(1) to take the head, to append, to
 * unlink any block):
 *
 *   free_head -> [unnamed, freed last] ... [unnamed] [named, freed first] ... [named, freed last] <- tail
 *                 taken first                         evicted first                 evicted last
 *
 * Invariants:
 *   - ref_count > 0: the block is in that many block-table entries and not in the list; ref_count 0: it is
 *     in the list. num_free_blocks is the list's length. (llm_engine_check_blocks audits these.)
 *   - hash != 0 exactly when cached maps hash to this block: a name belongs to one block, and a block has
 *     at most one name, which it keeps while free (its K and V are still there) until llm_block_alloc
 *     takes it for new content (an eviction).
 *   - a name is the hash of the whole prefix up to and including the block (llm_block_hash chains them),
 *     seeded by the request's cache_salt (0 without one): equal names mean equal tokens at equal
 *     positions, so equal K/V (the draft model's too, when there is one: a block id holds both).
 *
 * Where vLLM differs: its free queue appends every freed block to the tail, named or not, and it lets
 * several blocks carry the same hash (so that a block table never changes once written); here unnamed
 * blocks go to the head (reused while their memory is warm, evicting no cached prefix while any unnamed
 * block is free), and a block whose content is already cached elsewhere stays unnamed
 * (llm_block_set_hash), which changes no block table either. vLLM hashes with SHA-256 or xxHash
 * (prefix_caching_hash_algo); llm_block_hash is a 64-bit splitmix64 chain: fast, but not collision-resistant
 * against someone who chooses prompts to collide. A cache_salt keeps tenants apart: the same tokens under
 * different salts get different names.
 * ======================================================================================================== */
/* All blocks start free and unnamed, in id order, so the first allocations take blocks 0, 1, 2, ... No KV
 * memory is allocated here: the engine sizes the pool (llm_kv_pool_blocks), has the backend allocate it
 * (alloc_kv), and then gives its num_blocks to this. */
int llm_block_manager_init(llm_block_manager *bm, int num_blocks, int block_size, int enable_prefix_caching,
                           char *err) {
    memset(bm, 0, sizeof *bm);
    if (num_blocks <= 0 || block_size <= 0) return llm_fail(err, "the KV pool needs at least one block");
    bm->blocks = (llm_block *)calloc((size_t)num_blocks, sizeof(llm_block));
    if (!bm->blocks) return llm_fail(err, "out of memory for %d block records", num_blocks);
    bm->num_blocks = num_blocks; bm->block_size = block_size;
    bm->enable_prefix_caching = enable_prefix_caching;
    for (int i = 0; i < num_blocks; i++) {
        bm->blocks[i].prev_free = i - 1;
        bm->blocks[i].next_free = i + 1 < num_blocks ? i + 1 : -1;
    }
    bm->free_head = 0; bm->free_tail = num_blocks - 1; bm->num_free_blocks = num_blocks;
    return 0;
}

void llm_block_manager_free(llm_block_manager *bm) {
    free(bm->blocks); hmfree(bm->cached);
    memset(bm, 0, sizeof *bm);
}

/* Unlinks a free block from wherever it is in the list: for llm_block_alloc (the head) and for a cache
 * hit on a free block (llm_block_lookup, anywhere in the named part). */
static void llm_free_list_remove(llm_block_manager *bm, int id) {
    llm_block *b = &bm->blocks[id];
    if (b->prev_free >= 0) bm->blocks[b->prev_free].next_free = b->next_free;
    else bm->free_head = b->next_free;
    if (b->next_free >= 0) bm->blocks[b->next_free].prev_free = b->prev_free;
    else bm->free_tail = b->prev_free;
    b->prev_free = b->next_free = -1;
    bm->num_free_blocks--;
}

/* Take the list's first block: the unnamed one freed last, else the least recently freed named one, whose
 * cache entry dies now. */
int llm_block_alloc(llm_block_manager *bm) {
    int id = bm->free_head;
    if (id < 0) return -1;
    llm_free_list_remove(bm, id);
    llm_block *b = &bm->blocks[id];
    if (b->hash) {
        (void)hmdel(bm->cached, b->hash);
        b->hash = 0; bm->evictions++;
    }
    b->ref_count = 1;
    return id;
}

/* Drops one reference. A block still shared (a cached prefix another sequence uses, a parent's block a
 * sample shares) stays as it is; the last reference puts it in the free list, where a named block waits at
 * the tail as a cache entry and an unnamed one goes to the head. The caller must hold a reference: a
 * release of a free block would link it into the list a second time, and the list would be corrupt. */
void llm_block_release(llm_block_manager *bm, int id) {
    llm_block *b = &bm->blocks[id];
    if (--b->ref_count > 0) return;
    b->ref_count = 0;
    if (b->hash) { /* a cached prefix: to the tail, evicted last */
        b->prev_free = bm->free_tail; b->next_free = -1;
        if (bm->free_tail >= 0) bm->blocks[bm->free_tail].next_free = id; else bm->free_head = id;
        bm->free_tail = id;
    } else { /* nothing to keep: to the head, taken next */
        b->prev_free = -1; b->next_free = bm->free_head;
        if (bm->free_head >= 0) bm->blocks[bm->free_head].prev_free = id; else bm->free_tail = id;
        bm->free_head = id;
    }
    bm->num_free_blocks++;
}

/* The name of a block: its predecessor's name and its tokens, mixed one token at a time by splitmix64 (a
 * 64-bit mixer: a changed input bit changes about half the output bits). Chaining through prev_hash
 * makes the name depend on the whole prefix, so two requests that share a block's tokens at different
 * places, or after different prefixes, do not share its K and V. The result is never 0, which marks "no
 * name". Also used with n = 1 to chain other things into a name: the cache_salt's bytes, a group id. */
uint64_t llm_block_hash(uint64_t prev_hash, const int32_t *tokens, int n) {
    uint64_t h = prev_hash ^ 0x243f6a8885a308d3ull;
    for (int i = 0; i < n; i++) { uint64_t s = h ^ (uint32_t)tokens[i]; h = llm_splitmix64(&s); }
    return h ? h : 1;
}

/* A cache hit: the block named hash, with a reference taken for the caller (vLLM's touch); a free block
 * leaves the free list, so it cannot be evicted while in use. -1 when nothing has that name or prefix caching
 * is off. */
int llm_block_lookup(llm_block_manager *bm, uint64_t hash) {
    if (!bm->enable_prefix_caching) return -1;
    ptrdiff_t i = hmgeti(bm->cached, hash);
    if (i < 0) return -1;
    int id = bm->cached[i].value;
    if (bm->blocks[id].ref_count == 0) llm_free_list_remove(bm, id);
    bm->blocks[id].ref_count++;
    return id;
}

/* Names a full block so later requests can find it. A block keeps its first name (its content does not change
 * once full), and a name already held by another block is not moved: the first copy stays the cached one,
 * and this block is freed unnamed, to the head of the list, when its users are done. */
void llm_block_set_hash(llm_block_manager *bm, int id, uint64_t hash) {
    if (!bm->enable_prefix_caching || bm->blocks[id].hash) return;
    if (hmgeti(bm->cached, hash) >= 0) return; /* the same content is cached in another block already */
    bm->blocks[id].hash = hash;
    hmput(bm->cached, hash, id);
}

/* ===========================================================================================================
 * 7. Forward: the model over a batch, reading and writing the paged KV cache. The CPU backend, which is the
 *    reference the CUDA kernels are checked against; llm.cu has the CUDA one behind the same llm_backend.
 * In comes an llm_batch: the new tokens of several sequences, flattened one after the other, each with its
 * position, and each sequence's block tables; out comes a row of vocab_size logits for each of the
 * batch's logit rows (a prompt's prefill usually asks for one: its last). llm_cpu_forward runs the whole
 * model over the batch, a layer at a time, on activations of one row per token:
 *     token ids -> their embedding rows                    x [T][dim]: the residual stream
 *     each layer:  xn = rmsnorm(x)
 *                  q, k, v = xn Wq, xn Wk, xn Wv           (biases, q/k norms, RoPE at the token's position)
 *                  k, v -> the cache, at the token's slot: block_table[pos / block_size], pos % block_size
 *                  att = softmax(q . k_p / sqrt(head_dim)) v_p, over the positions p the token sees, read
 *                        back from the cache through its sequence's block table (paged attention)
 *                  x += att Wo;  xn = rmsnorm(x)
 *                  x += (silu(xn Wgate) * xn Wup) Wdown    (or a mixture of experts; Gemma: GELU for silu)
 *     the logit rows only: logits = rmsnorm(x) Woutput
 * Every matrix product is llm_matmul's, out[t][r] = W[r] . x[t], which reads each weight row once for all
 * the step's tokens: what batching many sequences into one step buys, since a decode step's time goes to
 * reading the weights. A token's arithmetic is meant not to depend on the tokens batched beside it (test
 * "batch invariance": requests batched give the tokens they give alone).
 * How the products meet the weights is the backend's path (llm_cpu_path): "cpu", the default, rounds the
 * activations to 16-bit integers and multiplies them by the weights as the file stores them; "cpu-int8"
 * rounds to 8 bits, as llama.cpp does; "cpu-exact" converts each weight row to f32 and rounds nothing, the
 * reference the others are measured against. The kernels here are plain C; a build with SIMD runs section
 * 14's versions of them, declared just before the function that calls them (#ifdef LLM_CPU_SIMD).
 * Threads (OpenMP, with -fopenmp; else one thread runs the same code): a matrix product's tiles of rows,
 * attention's (run of a sequence's tokens, K/V head) pairs, and the token-by-token steps from
 * LLM_TOKENS_PARALLEL tokens on are shared among them. Memory: the activations are allocated once and grown
 * on demand (llm_cpu.scratch), the KV pool once (alloc_kv); a step allocates only scratch (the quantized
 * activations, each thread's buffers), and when one fails the step returns -1, out of memory.
 * Read first: llm_cpu_forward (the layers), llm_cpu_attention (paged attention), llm_matmul (the products).
 * vLLM's PagedAttention kernels read K and V through block tables the same way, on the GPU. llama.cpp
 * builds a graph of ggml operations for each batch and runs it; here a layer is C loops, read in order.
 * ======================================================================================================== */
/* K and V of one group's layers (all the layers of a model without windows) for one block: what one block
 * of the pool costs a backend */
static size_t llm_kv_bytes_per_block(const llm_config *c, int block_size, int head_bytes) {
    return (size_t)2 * llm_kv_group_layers(c) * block_size * c->n_kv_heads * head_bytes;
}

/* ---- The math ------------------------------------------------------------------------------------------ */
/* The f32 dot products everything else is made of: attention's scores, f32 weights and the exact path's
 * rows converted to f32. However many vectors one call takes, each sum is added up in the same order as
 * alone, so that a token's result does not depend on what was computed beside it. */
/* a . b[c] for nc (1 to LLM_DOT_MAX_VECTORS) vectors b[c], b_stride floats apart, into out[c]: eight running
 * sums per vector (the compiler keeps them in one vector register), so that a is read once for all of them
 * while each sum is added up in the same order as alone, bit for bit */
#define LLM_DOT_MAX_VECTORS 12
static inline __attribute__((always_inline)) void llm_dot_n(const float *a, const float *b, int64_t b_stride,
                                                           int nc, int64_t n, float *out) {
    float acc[LLM_DOT_MAX_VECTORS][8] = {{0}};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int c = 0; c < nc; c++)
            for (int j = 0; j < 8; j++) acc[c][j] += a[i + j] * b[c * b_stride + i + j];
    for (int c = 0; c < nc; c++) {
        float s = 0, *q = acc[c];
        for (int64_t k = i; k < n; k++) s += a[k] * b[c * b_stride + k];
        out[c] = s + ((q[0] + q[4]) + (q[1] + q[5])) + ((q[2] + q[6]) + (q[3] + q[7]));
    }
}
#if defined(LLM_AVX2)
/* With AVX2 the products are section 14's llm_dot_n_avx2, the same sums bit for bit; with AVX-512 a
 * prompt's attention scores also take llm_dot_pairs (two queries' sums in one 512-bit register) */
static inline __attribute__((always_inline)) void llm_dot_n_avx2(const float *a, const float *b,
                                                                 int64_t b_stride, int nc, int64_t n,
                                                                 float *out);
#define llm_dot_n_simd llm_dot_n_avx2
#if defined(LLM_AVX512F)
static void llm_dot_pairs(const float *a, const float *b, int np, int64_t n, float *out);
#endif
#else
#define llm_dot_n_simd llm_dot_n
#endif
static float llm_dot(const float *a, const float *b, int64_t n) {
    float r;
    llm_dot_n(a, b, 0, 1, n, &r);
    return r;
}
/* A row's products with nc (1 to 4) tokens, the inlined loops specialized to each count: CALL(k, s, ...)
 * computes k tokens from token s on (every row product below is dispatched this way) */
#define LLM_BY_TOKENS(nc, CALL, ...)                                                                       \
    do {                                                                                                   \
        if ((nc) == 4) CALL(4, 0, __VA_ARGS__);                                                            \
        else if ((nc) == 3) CALL(3, 0, __VA_ARGS__);                                                       \
        else if ((nc) == 2) CALL(2, 0, __VA_ARGS__);                                                       \
        else for (int one = 0; one < (nc); one++) CALL(1, one, __VA_ARGS__);                               \
    } while (0)
/* llm_dot_n, specialized to 1 to 4 vectors */
#define LLM_DOT_CALL(k, s, _) llm_dot_n_simd(a, b + (s) * b_stride, b_stride, k, n, out + (s))
static void llm_dot_rows(const float *a, const float *b, int64_t b_stride, int nc, int64_t n, float *out) {
    LLM_BY_TOKENS(nc, LLM_DOT_CALL, 0);
}
#undef LLM_DOT_CALL
/* llm_dot_rows for any number of vectors: 12 or 8 at a time while there are (a's chunk loaded once for 12
 * running sums: enough independent additions to keep the adders busy), the rest 4 at most */
static void llm_dot_many(const float *a, const float *b, int64_t b_stride, int nc, int64_t n, float *out) {
    for (int k; nc >= 8; nc -= k, b += k * b_stride, out += k) {
        k = nc >= LLM_DOT_MAX_VECTORS ? LLM_DOT_MAX_VECTORS : 8;
        if (k == LLM_DOT_MAX_VECTORS) llm_dot_n_simd(a, b, b_stride, LLM_DOT_MAX_VECTORS, n, out);
        else llm_dot_n_simd(a, b, b_stride, 8, n, out);
    }
    for (int k; nc > 0; nc -= k, b += k * b_stride, out += k) {
        k = nc < 4 ? nc : 4;
        llm_dot_rows(a, b, b_stride, k, n, out);
    }
}

/* ---- Quantized weights times activations ---------------------------------------------------------------
 * The fast CPU path multiplies by the weights as the file stores them, as llama.cpp does: each step's
 * activations are quantized once to blocks of 32 integers with a float scale, and every weight row meets them
 * block by block in integer arithmetic, one float multiply-add per 32 values. Converting each weight row to
 * f32 first (the reference path, llm_dtype_dequant_row) costs more than the products themselves.
 * How finely the activations are rounded is the CPU path's choice (llm_cpu_path):
 * - 8 bits (llama.cpp's, "cpu-int8"): int8 with a scale of 1/127 of the block's largest value. Logits move by
 *   about a thousandth of their size, which flips near ties: SmolLM2-135M's top token parts from the exact
 *   path's at 2.6% of positions of a text, and "What is the capital of France?" is answered "L'Étoile...".
 * - 16 bits (the default, "cpu"): the same int8 and a second int8 for what that rounding left over, on a 256
 *   times finer scale, each run through the same integer products (value = d * (256 q + r)). It costs a
 *   second integer multiply per product (SmolLM2 Q4_1, 2 threads, AVX-512 VNNI: +7 to 15% decode time, +18
 *   to 28% prompt time) and agrees with the exact path's top token at 99.9% of positions, with a mean KL
 *   under 1e-5.
 * The reference backend, "cpu-exact", rounds nothing. */
enum llm_cpu_path { LLM_PATH_ACT16, LLM_PATH_ACT8, LLM_PATH_EXACT };
typedef struct {
    float d;            /* value j = d * (256 q[j] + r[j]) with 16-bit activations, d * q[j] with 8-bit
                         * ones */
    float s;            /* d * (the sum of those integers): what a block minimum (q4_1, q5_1) multiplies */
    int32_t sum[2];     /* the integers of values 0..15 and 16..31 added up: what sub-block minimums
                         * multiply */
    int8_t q[32];
    int8_t r[32];       /* what q's rounding left, in 256ths of q's step (16-bit activations; else 0) */
    int16_t a[32];      /* 256 q + r as one 16-bit integer, what 16-bit products meet (16-bit; else 0) */
} llm_q8;
/* section 14's row products load d and s as one 8-byte pair */
_Static_assert(offsetof(llm_q8, s) == offsetof(llm_q8, d) + sizeof(float), "llm_q8: s must follow d");

/* One block of activations, 32 values x[0..31]:
 *     d = max |x[j]| / 127                    q[j] = round(x[j] / d)                 8 bits: x[j] ~ d q[j]
 *     16 bits: r[j] = round((x[j] - d q[j]) / (d / 256)), within +-127;  x[j] ~ (d / 256) (256 q[j] + r[j])
 *     sum[0], sum[1]: the integers of values 0-15 and 16-31 added up (what a weight block's minimum and
 *     offset multiply), s = the block's d times their total
 * Rounding is to nearest, ties to even (lrintf), so that the SIMD version gives the same bytes. */
/* The reference quantization (a SIMD build calls it only from the tests: unused otherwise); wide: 16 bits */
static __attribute__((unused)) void llm_q8_quantize_ref(const float *x, llm_q8 *out, int64_t n, int wide) {
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float d = amax / 127, inv = d > 0 ? 1 / d : 0, fine = d / 256, inv_fine = fine > 0 ? 1 / fine : 0;
        out[b].d = wide ? fine : d;
        for (int h = 0; h < 2; h++) {
            int sum = 0;
            for (int j = h * 16; j < h * 16 + 16; j++) {
                int q = out[b].q[j] = (int8_t)lrintf(x[j] * inv), r = 0;
                if (wide) {
                    r = (int)lrintf((x[j] - d * (float)q) * inv_fine); /* |r| <= 128: 128 only at a tie */
                    r = r > 127 ? 127 : r < -127 ? -127 : r;
                }
                out[b].r[j] = (int8_t)r;
                out[b].a[j] = (int16_t)(wide ? 256 * q + r : 0); /* |256 q + r| <= 32,639 */
                sum += wide ? 256 * q + r : q;
            }
            out[b].sum[h] = sum;
        }
        out[b].s = out[b].d * (float)(out[b].sum[0] + out[b].sum[1]);
    }
}

/* The dot product of a weight row (n values of a quantized type) with quantized activations, in plain C: the
 * reference the SIMD versions are tested against. A group of 32 values has one activation scale xd and one
 * or two weight sub-blocks s; with value = (d * scale[s]) * q - dmin * min[s] it adds
 *     xd * (d * sum_s scale[s] * (q . x)_s  -  dmin * sum_s min[s] * (sum of x)_s)
 * where everything inside the sums is an integer. */
static inline __attribute__((always_inline)) float llm_q8_dot_plain(uint32_t type, const void *row,
                                                                    const llm_q8 *x, int64_t n, int wide) {
    uint64_t block_bytes, block_values;
    llm_dtype_info(type, &block_bytes, &block_values);
    const uint8_t *p = (const uint8_t *)row;
    llm_qblock b;
    float acc = 0;
    for (int64_t at = 0; at < n; at += (int64_t)block_values, p += block_bytes) {
        llm_qblock_read(type, p, &b);
        for (int g = 0; g < b.n / 32; g++, x++) {
            int64_t scaled = 0, mins = 0; /* 16-bit activations: past 32 bits for the k-quants' scales */
            for (int h = 0; h < 2; h++) { /* the two halves of 16: one sub-block each, or both of one */
                int s = (g * 32 + h * 16) / b.sub, dot = 0;
                for (int j = h * 16; j < h * 16 + 16; j++)
                    dot += b.q[g * 32 + j] * (wide ? 256 * x->q[j] + x->r[j] : x->q[j]);
                scaled += (int64_t)b.scale[s] * dot;
                mins += (int64_t)b.min[s] * x->sum[h];
            }
            acc += x->d * (b.d * (float)scaled - b.dmin * (float)mins);
        }
    }
    return acc;
}
static float llm_q8_dot_ref(uint32_t type, const void *row, const llm_q8 *x, int64_t n, int wide) {
    switch (type) { /* each call specializes the inlined loops to its type (plain C is fast enough to use) */
    case LLM_Q8_0: return llm_q8_dot_plain(LLM_Q8_0, row, x, n, wide);
    case LLM_Q4_0: return llm_q8_dot_plain(LLM_Q4_0, row, x, n, wide);
    case LLM_Q4_1: return llm_q8_dot_plain(LLM_Q4_1, row, x, n, wide);
    case LLM_Q5_0: return llm_q8_dot_plain(LLM_Q5_0, row, x, n, wide);
    case LLM_Q5_1: return llm_q8_dot_plain(LLM_Q5_1, row, x, n, wide);
    case LLM_Q2_K: return llm_q8_dot_plain(LLM_Q2_K, row, x, n, wide);
    case LLM_Q3_K: return llm_q8_dot_plain(LLM_Q3_K, row, x, n, wide);
    case LLM_Q4_K: return llm_q8_dot_plain(LLM_Q4_K, row, x, n, wide);
    case LLM_Q5_K: return llm_q8_dot_plain(LLM_Q5_K, row, x, n, wide);
    case LLM_MXFP4: return llm_q8_dot_plain(LLM_MXFP4, row, x, n, wide);
    default: return llm_q8_dot_plain(LLM_Q6_K, row, x, n, wide);
    }
}

#if defined(LLM_AVX2)
/* With SIMD (LLM_AVX2: the build was told an x86 target with AVX2, FMA and F16C), the fast path's kernels
 * are section 14's: the activations quantized 32 values at a time, the row products of 32-value and
 * 256-value blocks, the packed tiles of a prefill, the f16/bf16 tiles. Their shapes are set here, where
 * llm_matmul sizes its tiles and buffers by them. */
#define LLM_CPU_SIMD "avx2"
/* With AVX-512 VNNI, a 512-bit register holds 16 rows' 4 bytes and one vpdpbusd multiplies them all: 16 rows
 * are packed side by side (Sapphire Rapids issues two 512-bit vpdpbusd a cycle, as it does 256-bit ones) */
#if defined(LLM_AVX512VNNI) && defined(LLM_AVX512BW)
#define LLM_PACK_ROWS 16
#else
#define LLM_PACK_ROWS 8
#endif
/* A decode step's products take LLM_DOT_ROWS weight rows a call (llm_q8_dot32_avx2 says why): 4 with
 * AVX-512's 32 registers, 2 with AVX2's 16, which leave too few beside 4 rows' sums (one thread of a
 * Sapphire Rapids, q4_1's products from memory: 4 rows 1.12 times as fast as 1 built with AVX-512, 0.95-1.0
 * built for AVX2; 2 rows built for AVX2 1.03-1.07, SmolLM2 Q4_1 tg128 1.05 times, Gemma 3 270M 1.01) */
#if defined(LLM_AVX512F)
#define LLM_DOT_ROWS 4
#else
#define LLM_DOT_ROWS 2
#endif
/* f16/bf16 weights meet f32 activations in tiles of up to LLM_HALF_ROWS rows times LLM_HALF_TOKENS tokens */
#define LLM_HALF_ROWS 4
#if defined(LLM_AVX512F)
#define LLM_HALF_TOKENS 6 /* 24 sums of 512 bits in 32 registers: llm_half_runs16 */
#else
#define LLM_HALF_TOKENS 3
#endif
static void llm_q8_quantize_avx2(const float *x, llm_q8 *out, int64_t n, int wide);
static inline __attribute__((always_inline)) void llm_q8_dot32_avx2(uint32_t type, int wide, const uint8_t *p,
    size_t row_bytes, int nr, const llm_q8 *x, int64_t n_blocks, int64_t x_stride, int nc, float *out,
    int64_t out_stride);
static inline __attribute__((always_inline)) void llm_q8_dotk_avx2(uint32_t type, int wide, const uint8_t *p,
    size_t row_bytes, int nr, const llm_q8 *x, int64_t n_blocks, int64_t x_stride, int nc, float *out,
    int64_t out_stride);
#elif defined(LLM_NEON_DOT)
/* On 64-bit ARM, section 14's NEON kernels for the activations' quantization and the row products of every
 * quantized type (sdot: four bytes' products into each 32-bit lane); f16 and bf16 rows are converted to f32,
 * as in a build without SIMD, and the other kernels are plain C */
static void llm_q8_quantize_neon(const float *x, llm_q8 *out, int64_t n, int wide);
static inline __attribute__((always_inline)) void llm_q8_dot32_neon(uint32_t type, int wide,
    const uint8_t *p, size_t row_bytes, int nr, const llm_q8 *x, int64_t n_blocks, int64_t x_stride,
    int nc, float *out, int64_t out_stride);
static inline __attribute__((always_inline)) void llm_q8_dotk_neon(uint32_t type, int wide,
    const uint8_t *p, size_t row_bytes, int nr, const llm_q8 *x, int64_t n_blocks, int64_t x_stride,
    int nc, float *out, int64_t out_stride);
#endif

/* A row of activations quantized for the fast path: with SIMD when the build has it */
static void llm_q8_quantize(const float *x, llm_q8 *out, int64_t n, int wide) {
#ifdef LLM_CPU_SIMD
    llm_q8_quantize_avx2(x, out, n, wide);
#elif defined(LLM_NEON_DOT)
    llm_q8_quantize_neon(x, out, n, wide);
#else
    llm_q8_quantize_ref(x, out, n, wide);
#endif
}

/* The fast path's products of nr weight rows (row_bytes apart) with nc rows of quantized activations
 * (x_stride blocks apart), nr or nc 1 and the other up to 4, into out[c * out_stride + r]: SIMD when the
 * build has it, else the plain-C reference. A row's product is the same bits whichever rows and tokens share
 * its call. */
#define LLM_DOT_MAX_COLS 4
#ifndef LLM_DOT_ROWS
#define LLM_DOT_ROWS 1 /* NEON and plain C: a row a call */
#endif
static void llm_q8_dot(uint32_t type, int wide, const void *row, size_t row_bytes, int nr, const llm_q8 *x,
                       int64_t n, int64_t x_stride, int nc, float *out, int64_t out_stride) {
#if defined(LLM_CPU_SIMD) || defined(LLM_NEON_DOT)
    /* each call specializes the inlined loops to its type, its activations' width, and to 1 to 4 tokens: a
     * step of 2 or 3 (a few sequences decoding together, a short speculative proposal) then reads each weight
     * block once, not once per token (SmolLM2 Q4_1, one thread: 2 tokens 1.5 times one, was 1.8; 3 tokens
     * 1.9, was 2.6: tools/matmul_steps.c); or to LLM_DOT_ROWS rows and one token (a decode step: below) */
#define LLM_Q8_CALL(k, s, T, dot, per_block, W)                                                           \
    dot(T, W, (const uint8_t *)row + r * row_bytes, 0, 1, x + (s) * x_stride, n / per_block, x_stride, k, \
        out + (s) * out_stride + r, out_stride)
#define LLM_Q8_WIDTHS(T, dot, per_block, W)                                                                 \
    if (LLM_DOT_ROWS > 1 && nr == LLM_DOT_ROWS && nc == 1)                                                  \
        dot(T, W, (const uint8_t *)row, row_bytes, LLM_DOT_ROWS, x, n / per_block, 0, 1, out, out_stride); \
    else for (int r = 0; r < nr; r++) LLM_BY_TOKENS(nc, LLM_Q8_CALL, T, dot, per_block, W);
#define LLM_Q8_CASE(T, dot, per_block)                                                                 \
    case T:                                                                                            \
        if (wide) { LLM_Q8_WIDTHS(T, dot, per_block, 1) } else { LLM_Q8_WIDTHS(T, dot, per_block, 0) } \
        return;
    switch (type) {
#if defined(LLM_NEON_DOT)
    LLM_Q8_CASE(LLM_Q8_0, llm_q8_dot32_neon, 32) LLM_Q8_CASE(LLM_Q4_0, llm_q8_dot32_neon, 32)
    LLM_Q8_CASE(LLM_Q4_1, llm_q8_dot32_neon, 32) LLM_Q8_CASE(LLM_Q5_0, llm_q8_dot32_neon, 32)
    LLM_Q8_CASE(LLM_Q5_1, llm_q8_dot32_neon, 32) LLM_Q8_CASE(LLM_Q2_K, llm_q8_dotk_neon, 256)
    LLM_Q8_CASE(LLM_Q3_K, llm_q8_dotk_neon, 256) LLM_Q8_CASE(LLM_Q4_K, llm_q8_dotk_neon, 256)
    LLM_Q8_CASE(LLM_Q5_K, llm_q8_dotk_neon, 256) LLM_Q8_CASE(LLM_Q6_K, llm_q8_dotk_neon, 256)
    LLM_Q8_CASE(LLM_MXFP4, llm_q8_dot32_neon, 32)
#else
    LLM_Q8_CASE(LLM_Q8_0, llm_q8_dot32_avx2, 32) LLM_Q8_CASE(LLM_Q4_0, llm_q8_dot32_avx2, 32)
    LLM_Q8_CASE(LLM_Q4_1, llm_q8_dot32_avx2, 32) LLM_Q8_CASE(LLM_Q5_0, llm_q8_dot32_avx2, 32)
    LLM_Q8_CASE(LLM_Q5_1, llm_q8_dot32_avx2, 32) LLM_Q8_CASE(LLM_Q2_K, llm_q8_dotk_avx2, 256)
    LLM_Q8_CASE(LLM_Q3_K, llm_q8_dotk_avx2, 256) LLM_Q8_CASE(LLM_Q4_K, llm_q8_dotk_avx2, 256)
    LLM_Q8_CASE(LLM_Q5_K, llm_q8_dotk_avx2, 256) LLM_Q8_CASE(LLM_Q6_K, llm_q8_dotk_avx2, 256)
    LLM_Q8_CASE(LLM_MXFP4, llm_q8_dot32_avx2, 32)
#endif
    }
#undef LLM_Q8_CASE
#undef LLM_Q8_WIDTHS
#undef LLM_Q8_CALL
#endif
    /* plain C: a build without SIMD (whose llm_matmul converts the rows instead: only the tests come here) */
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++)
            out[c * out_stride + r] =
                llm_q8_dot_ref(type, (const uint8_t *)row + r * row_bytes, x + c * x_stride, n, wide);
}

/* How a matrix product reads a weight type: rows as they are (f32), quantized blocks against quantized
 * activations (the fast path, with SIMD), f16/bf16 rows converted on the fly (with SIMD), or rows converted
 * to f32 (the exact path; and every type in a build without SIMD, where the compiler's vectorized f32 loops
 * beat plain-C integer products: SmolLM2 Q4_1 on one thread, decode 30 against 18 tok/s, prompt 118
 * against 22) */
enum { LLM_ROWS_F32, LLM_ROWS_Q8, LLM_ROWS_HALF, LLM_ROWS_CONVERT, LLM_ROWS_PACKED };
static int llm_matmul_kind(uint32_t type, int path) {
    if (type == LLM_F32) return LLM_ROWS_F32;
#ifdef LLM_CPU_SIMD
    if (path == LLM_PATH_EXACT) return LLM_ROWS_CONVERT;
    return type == LLM_F16 || type == LLM_BF16 ? LLM_ROWS_HALF : LLM_ROWS_Q8;
#elif defined(LLM_NEON_DOT)
    /* every quantized type has NEON products (a prefill's too: 4 tokens a row, no packed tiles yet) */
    int neon = type != LLM_F16 && type != LLM_BF16;
    return path != LLM_PATH_EXACT && neon ? LLM_ROWS_Q8 : LLM_ROWS_CONVERT;
#else
    (void)path;
    return LLM_ROWS_CONVERT;
#endif
}

/* out[t][r] = sum_c W[r][c] * x[t][c] for the T rows of x. Threads share the weight rows in tiles of 16; a
 * tile meets all T inputs before the next is read, so a prefill of many tokens reads each weight once from
 * memory (from cache after that): that is what batching buys on any hardware. -1 when there was no memory
 * for the quantized activations or a thread's converted rows (what it would have computed is left undone). */
#define LLM_MATMUL_TILE 16
/* f16/bf16 rows meet a prefill's f32 activations (4 bytes a value, not a quantized byte) in larger tiles: a
 * thread's share of the rows in equal tiles of up to 256 kB, which stay in L2 while every token's activations
 * pass through once per tile, not once per 16 rows (SmolLM2 F16 pp512, Sapphire Rapids, one thread: the
 * products 1.15 times as fast, 103 against 90 GFLOP/s, ffn_down's 1,536-wide activations, 3 MB, no longer
 * read from L3 36 times; two threads: 1.35 times, where tiles of 256 kB, 2 for one thread and 1 for the
 * other, were 1.15) */
#define LLM_HALF_TILE_BYTES (256 * 1024)
/* from 5 tokens on, packing a tile costs less than what it saves: the row path's products take 4 tokens at a
 * time, so a 5th reads the weights again (tools/matmul_steps.c, one thread, Sapphire Rapids, time of T tokens
 * over one token's, row path against packed: Q4_1 T = 4 2.54 and 2.02, T = 5 3.55 and 2.34; Q8_0 1.98 and
 * 1.93, 2.71 and 2.21; Q4_K_M 2.09 and 1.99, 3.10 and 2.29; built for AVX2, T = 5 costs 4.16 and 3.02 on
 * Q4_1, 2.65 and 2.58 on Q8_0) */
#define LLM_PACK_MIN_TOKENS 5
/* A matrix in decode tiles (q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K: section 14) is read through them
 * up to 16 tokens, its rows 8 side by side meeting 4 tokens a call, each 16 rows' tile from cache after the
 * first 4: SmolLM2 Q4_1, one thread of a Sapphire Rapids, a step of 4 sequences 1.46 times as fast as the
 * rows a row at a time, 16 sequences 1.02-1.06 times as packing (measured when packing unpacked rows from the
 * tiles first) */
#define LLM_TILES_MAX_TOKENS 16
#ifdef LLM_CPU_SIMD
/* Section 14's: a tile of rows packed and multiplied by every token (from LLM_PACK_MIN_TOKENS on), the
 * bytes a packed group takes, and the f16/bf16 tiles */
static void llm_matmul_packed(float *out, const llm_q8 *xq, int wide, uint32_t type,
                              const uint8_t *tile_data, int tiled, size_t row_bytes, int64_t r0, int64_t r1,
                              int64_t rows, int64_t cols, int T, uint8_t *pack, const void *amx_x);
static inline __attribute__((always_inline)) size_t llm_pack_group_bytes(int wide);
#if defined(LLM_AMX)
/* with AMX: the packed products 16 tokens at a time, their activations laid out for its tiles */
enum { LLM_AMX_TOKENS = 16 };
/* a group of 16 tokens' activations, laid out for the tiles: their bytes a token a row (tile rows 32 bytes
 * apart, not a llm_q8's 144 times the groups: a few cache lines, not 16 pages), and the numbers that
 * llm_pack_dot computes as it goes, 16 tokens side by side. llm_matmul lays out every token's once */
typedef struct {
    int8_t q[LLM_AMX_TOKENS][32], r[LLM_AMX_TOKENS][32];
    float d[LLM_AMX_TOKENS];               /* the token's step */
    float ds[2][LLM_AMX_TOKENS];           /* per half (in blocks of 32: both): d times its integers' sum */
    int32_t offset_sum[2][LLM_AMX_TOKENS]; /* per half: the type's offset times that sum */
} llm_amx_group;
static int llm_amx_usable(void);
static void llm_amx_layout(uint32_t type, const llm_q8 *x, int64_t n_groups, llm_amx_group *numbers);
#endif
static void llm_dot_half(uint32_t type, const void *w, int64_t w_stride, int nr, const float *x,
                         int64_t x_stride, int nc, int64_t n, float *out, int64_t out_stride);
/* and the decode tiles: q4_0's, q4_1's, q5_0's, q5_1's, q8_0's, q4_K's, q5_K's and q6_K's matrices with their
 * rows 8 side by side, which the CPU backend copies them into when it starts (llm_weight's tiles), and what a
 * step of up to LLM_TILES_MAX_TOKENS tokens reads */
#define LLM_TILE_ROWS 8
static int llm_tiles_type(uint32_t type);
static void llm_tiles_copy(uint32_t type, uint8_t *rows, uint8_t *tiles, int64_t n_rows, int64_t cols,
                           int into_tiles);
static void llm_tiles_dot(uint32_t type, int wide, const uint8_t *tile, int64_t cols, const llm_q8 *x,
                          int64_t x_stride, int nc, float *out, int64_t out_stride);
#endif
static int llm_matmul(float *out, const float *x, const llm_weight *w, int T, int path) {
    /* 1. how the rows are read (the kind), and the tiles the threads share */
    int64_t rows = w->rows, cols = w->cols;
    size_t row_bytes = llm_dtype_row_bytes(w->type, cols);
    int kind = llm_matmul_kind(w->type, path), failed = 0, wide = path == LLM_PATH_ACT16;
    int64_t tile_rows = LLM_MATMUL_TILE;
    int convert = kind == LLM_ROWS_CONVERT; /* each thread converts a tile's rows to f32 */
#ifdef LLM_CPU_SIMD
#if defined(LLM_AVX512F)
    /* with AVX-512, a prompt's f16/bf16 tile too, once (exact: the same products, bit for bit), where the
     * 4 x 6 tile converted its 4 rows' values again for every 6 tokens, 2 micro-ops each on the ports of the
     * multiply-adds (SmolLM2 F16 pp512, one thread: 1.08 times as fast; the 4 x 6 tile alone, in L1, 137 ->
     * 160 GFLOP/s). Not with AVX2: 0.75 times as fast, its 4 x 3 tile passes twice over the rows (the even
     * runs, then the odd), each pass reading all of the rows' lines from L2, twice the bytes in f32 */
    convert |= kind == LLM_ROWS_HALF && T > LLM_HALF_TOKENS;
#endif
    if (kind == LLM_ROWS_HALF && T > 1) { /* each thread's share in as many equal tiles as 256 kB needs */
        int threads = 1;
#ifdef _OPENMP
        threads = omp_get_max_threads();
#endif
        int64_t share = (rows + threads - 1) / threads, fit = (int64_t)(LLM_HALF_TILE_BYTES / row_bytes);
        if (fit < 1) fit = 1;
        int64_t pieces = (share + fit - 1) / fit;
        tile_rows = ((share + pieces - 1) / pieces + LLM_HALF_ROWS - 1) / LLM_HALF_ROWS * LLM_HALF_ROWS;
    }
#endif
    /* 2. the fast path's activations, quantized once for every row to meet */
    int64_t n_tiles = (rows + tile_rows - 1) / tile_rows;
    llm_q8 *xq = NULL;
    if (kind == LLM_ROWS_Q8 && !(xq = (llm_q8 *)malloc((size_t)T * (size_t)(cols / 32) * sizeof(llm_q8))))
        return -1;
    if (xq && T == 1) llm_q8_quantize(x, xq, cols, wide); /* a decode step's: no wait for the threads */
#ifdef LLM_CPU_SIMD
    if (kind == LLM_ROWS_Q8 && T >= LLM_PACK_MIN_TOKENS && !(w->tiles && T <= LLM_TILES_MAX_TOKENS))
        kind = LLM_ROWS_PACKED;
#endif
    /* with AMX, every 16 tokens' activations laid out for its tiles (section 14), and tiles of more rows: the
     * products are so fast that reading the activations again for every 16 rows would take longer than
     * them; a thread's share in tiles whose packed rows stay in L2 (256 kB) while 16 tokens' activations
     * pass through once per tile */
    void *amx_x = NULL;
#if defined(LLM_AMX)
    if (kind == LLM_ROWS_PACKED && T >= LLM_AMX_TOKENS && llm_amx_usable() &&
        (amx_x = malloc((size_t)(T / LLM_AMX_TOKENS) * (size_t)(cols / 32) * sizeof(llm_amx_group)))) {
        int threads = 1;
#ifdef _OPENMP
        threads = omp_get_max_threads();
#endif
        int64_t share = (rows + threads - 1) / threads;
        size_t row_packed = (size_t)(cols / 32) * llm_pack_group_bytes(wide) / LLM_PACK_ROWS;
        int64_t fit = (int64_t)(256 * 1024 / row_packed);
        tile_rows = (share < fit ? share : fit) / LLM_PACK_ROWS * LLM_PACK_ROWS;
        if (tile_rows < LLM_MATMUL_TILE) tile_rows = LLM_MATMUL_TILE;
        n_tiles = (rows + tile_rows - 1) / tile_rows;
    }
#endif
    /* 3. each thread: its buffers (a tile's rows converted to f32, or packed), then its share of the tiles,
     * each tile's rows times every token */
    #pragma omp parallel
    {
        float *converted = NULL;
        size_t converted_bytes = ((size_t)tile_rows * (size_t)cols * sizeof(float) + 63) / 64 * 64;
        if (convert && !(converted = (float *)aligned_alloc(64, converted_bytes))) {
            #pragma omp atomic write
            failed = 1;
        }
#ifdef LLM_CPU_SIMD
        uint8_t *pack = NULL; /* the tile's rows, packed: 8 at a time */
        if (kind == LLM_ROWS_PACKED &&
            !(pack = (uint8_t *)malloc((size_t)(tile_rows + LLM_PACK_ROWS - 1) / LLM_PACK_ROWS *
                                       (size_t)(cols / 32) * llm_pack_group_bytes(wide)))) {
            #pragma omp atomic write
            failed = 1;
        }
#endif
        if (xq && T > 1) { /* the tokens' activations quantized by all the threads (by one: 5% of a prompt's
                            * time; SmolLM2 Q8_0 pp512, 2 threads: 1.06 times as fast) */
            #pragma omp for schedule(static)
            for (int t = 0; t < T; t++)
                llm_q8_quantize(x + (size_t)t * cols, xq + (size_t)t * (cols / 32), cols, wide);
        }
#if defined(LLM_AMX)
        if (amx_x) {
            #pragma omp for schedule(static)
            for (int b = 0; b < T / LLM_AMX_TOKENS; b++)
                llm_amx_layout(w->type, xq + (size_t)b * LLM_AMX_TOKENS * (cols / 32), cols / 32,
                               (llm_amx_group *)amx_x + (size_t)b * (cols / 32));
        }
#endif
        #pragma omp for schedule(static)
        for (int64_t tile = 0; tile < n_tiles; tile++) {
            int64_t r0 = tile * tile_rows;
            int64_t r1 = r0 + tile_rows < rows ? r0 + tile_rows : rows;
            const uint8_t *tile_data = (const uint8_t *)w->data + (size_t)r0 * row_bytes;
            if (convert) { /* the tile's rows to f32, once for all the tokens */
                if (!converted) continue;
                for (int64_t r = r0; r < r1; r++)
                    llm_dtype_dequant_row(w->type, tile_data + (size_t)(r - r0) * row_bytes,
                                          converted + (size_t)(r - r0) * cols, cols);
            }
#ifdef LLM_CPU_SIMD
            /* a prefill's packed tiles, and the f16/bf16 tiles: section 14's kernels */
            if (kind == LLM_ROWS_PACKED) {
                if (!pack) continue;
                if (w->tiles) tile_data = (const uint8_t *)w->tiles + (size_t)r0 * row_bytes;
                llm_matmul_packed(out, xq, wide, w->type, tile_data, w->tiles != NULL, row_bytes, r0, r1,
                                  rows, cols, T, pack, amx_x);
                continue;
            }
            if (kind == LLM_ROWS_HALF) { /* tiles of up to 4 rows and 3 tokens (AVX-512: 6) */
                int nr = T == 1 ? 2 : LLM_HALF_ROWS; /* a decode step: 2 rows a call */
                uint32_t type = convert ? LLM_F32 : w->type;
                const uint8_t *half_rows = convert ? (const uint8_t *)converted : tile_data;
                size_t stride = convert ? (size_t)cols * sizeof(float) : row_bytes;
                for (int t = 0; t < T; t += LLM_HALF_TOKENS)
                    for (int64_t r = r0; r < r1; r += nr)
                        llm_dot_half(type, half_rows + (size_t)(r - r0) * stride, cols,
                                     r1 - r < nr ? (int)(r1 - r) : nr, x + (size_t)t * cols,
                                     cols, T - t < LLM_HALF_TOKENS ? T - t : LLM_HALF_TOKENS, cols,
                                     out + (size_t)t * rows + r, rows);
                continue;
            }
#endif
            /* LLM_DOT_MAX_COLS tokens at a time: each row read once for them */
            for (int t = 0; t < T; t += LLM_DOT_MAX_COLS) {
                const float *xt = x + (size_t)t * cols;
                int nc = T - t < LLM_DOT_MAX_COLS ? T - t : LLM_DOT_MAX_COLS;
#ifdef LLM_CPU_SIMD
                if (kind == LLM_ROWS_Q8 && w->tiles) { /* the decode tiles: 8 rows a call (section 14) */
                    const uint8_t *tiles = (const uint8_t *)w->tiles + (size_t)r0 * row_bytes;
                    for (int64_t r = r0; r < r1; r += LLM_TILE_ROWS)
                        llm_tiles_dot(w->type, wide, tiles + (size_t)(r - r0) * row_bytes, cols,
                                      xq + (size_t)t * (cols / 32), cols / 32, nc, out + (size_t)t * rows + r,
                                      rows);
                    continue;
                }
#endif
                if (kind == LLM_ROWS_Q8) { /* one token: LLM_DOT_ROWS rows a call (llm_q8_dot32_avx2: why) */
                    for (int64_t r = r0, nr; r < r1; r += nr) {
                        nr = nc == 1 && r1 - r >= LLM_DOT_ROWS ? LLM_DOT_ROWS : 1;
                        llm_q8_dot(w->type, wide, tile_data + (size_t)(r - r0) * row_bytes, row_bytes,
                                   (int)nr, xq + (size_t)t * (cols / 32), cols, cols / 32, nc,
                                   out + (size_t)t * rows + r, rows);
                    }
                    continue;
                }
                for (int64_t r = r0; r < r1; r++) {
                    const void *row = tile_data + (size_t)(r - r0) * row_bytes;
                    float v[LLM_DOT_MAX_COLS];
                    if (kind == LLM_ROWS_F32) llm_dot_rows((const float *)row, xt, cols, nc, cols, v);
                    else llm_dot_rows(converted + (size_t)(r - r0) * cols, xt, cols, nc, cols, v);
                    for (int c = 0; c < nc; c++) out[(size_t)(t + c) * rows + r] = v[c];
                }
            }
        }
        free(converted);
#ifdef LLM_CPU_SIMD
        free(pack);
#endif
    }
    free(xq);
    free(amx_x);
    return failed ? -1 : 0;
}

/* RMS norm: out = x / sqrt(mean(x^2) + eps) * weight, element by element (no mean taken off and no bias, as
 * LayerNorm has: Llama's and every model's here). out may be x. */
static void llm_rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
    double ss = 0; /* in double, as llama.cpp does: the mean of squares of thousands of values */
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * weight[i];
}

#ifdef LLM_CPU_SIMD
/* Section 14's: exp of 8 floats, glibc's expf bit for bit (the sampler's too), and the row kernels below
 * in vectors. Each does the first values of the row and returns how many it did, and the plain loop after
 * it does the rest; llm_softmax_exp_avx2 does the whole row (the last 8 padded) */
static inline __attribute__((always_inline)) __m256 llm_exp_avx2(__m256 x);
static inline __attribute__((always_inline)) int llm_max_avx2(const float *x, int n, float *mx);
static inline __attribute__((always_inline)) void llm_softmax_exp_avx2(float *row, int n, float mx);
static inline __attribute__((always_inline)) size_t llm_swiglu_avx2(float *gate, const float *up, size_t n);
#endif
/* The largest of x[0..n-1] and mx, NaNs passed over: with SIMD 8 lanes at a time (a largest value is the
 * same in any order, but for a zero's sign, which exp(x - mx) does not see) */
static float llm_max(const float *x, int n, float mx) {
    int i = 0;
#ifdef LLM_CPU_SIMD
    i = llm_max_avx2(x, n, &mx);
#endif
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}
/* row[p] = exp(row[p] - mx) for p < n: with SIMD 8 at a time (the last 8 padded), else libm's expf */
static void llm_softmax_exp(float *row, int n, float mx) {
#ifdef LLM_CPU_SIMD
    llm_softmax_exp_avx2(row, n, mx);
#else
    for (int p = 0; p < n; p++) row[p] = expf(row[p] - mx);
#endif
}

/* gate[i] = silu(gate[i]) up[i] = gate[i] / (1 + exp(-gate[i])) up[i] for i < n (SwiGLU): with SIMD 8 at a
 * time, the same roundings */
static void llm_swiglu(float *gate, const float *up, size_t n) {
    size_t i = 0;
#ifdef LLM_CPU_SIMD
    i = llm_swiglu_avx2(gate, up, n);
#endif
    for (; i < n; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* RoPE's scaling, shared by the two ways below of computing the angles: the factor on cos and sin (the
 * file's attention factor; YaRN's 1 + 0.1 ln(1 / scale)), and how much of pair i's angle YaRN keeps as it
 * was (1: a fast dimension, below yarn_dims[0]; 0: past yarn_dims[1], scaled; a ramp between; 0 without
 * YaRN) */
static float llm_rope_mscale(const llm_config *c, float freq_scale) {
    return (c->rope_attn_factor > 0 ? c->rope_attn_factor : 1) *
           (c->rope_yarn ? 1.0f + 0.1f * logf(1.0f / freq_scale) : 1.0f);
}
static float llm_rope_yarn_keep(const llm_config *c, int i) {
    if (!c->rope_yarn) return 0;
    float y = ((float)i - c->yarn_dims[0]) / fmaxf(0.001f, c->yarn_dims[1] - c->yarn_dims[0]);
    return 1 - fminf(1, fmaxf(0, y));
}

/* RoPE at position pos: the cosine and sine of each of the rope_dim / 2 rotated pairs, the same for every
 * head of every layer that has the same base and scale (computed once per token and step, applied to all).
 * The angle of pair i is pos * base^(-2i/rope_dim), built by repeated multiplication as llama.cpp does, so
 * that greedy outputs match it bit for bit more often; divided by the pair's factor, times freq_scale (the
 * layer's RoPE scaling; 0: 1), as the config says. */
static void llm_rope_angles(float *cs, float *sn, int pos, const llm_config *c,
                            float base, float freq_scale) {
    float theta_scale = powf(base, -2.0f / (float)c->rope_dim), theta = (float)pos;
    if (!(freq_scale > 0)) freq_scale = 1;
    float mscale = llm_rope_mscale(c, freq_scale);
    for (int i = 0; i < c->rope_dim / 2; i++, theta *= theta_scale) {
        float pair = c->rope_factors ? theta / c->rope_factors[i] : theta; /* Llama 3.1's, Phi-3.5's
                                                                            * factors */
        float angle = freq_scale * pair; /* interpolated (linear, YaRN) or, at scale 1, as it was */
        if (c->rope_yarn) { /* YaRN: dimensions below yarn_dims[0] keep their angle, those past [1] scale */
            float keep = llm_rope_yarn_keep(c, i);
            angle = angle * (1 - keep) + pair * keep;
        }
        cs[i] = cosf(angle) * mscale; sn[i] = sinf(angle) * mscale;
    }
}

/* The same angles as a frequency per pair, for a backend that turns pair i by pos * freq[i] itself (llm.cu),
 * cos and sin times *mscale. They agree with llm_rope_angles' to f32 rounding (a test checks): the frequency
 * is computed once, in double, where llm_rope_angles multiplies step by step. */
void llm_rope_freqs(const llm_config *c, float base, float freq_scale, float *freq, float *mscale) {
    if (!(freq_scale > 0)) freq_scale = 1;
    *mscale = llm_rope_mscale(c, freq_scale);
    for (int i = 0; i < c->rope_dim / 2; i++) {
        double f = pow((double)base, -2.0 * i / c->rope_dim) / (c->rope_factors ? c->rope_factors[i] : 1.0);
        double keep = llm_rope_yarn_keep(c, i);
        freq[i] = (float)(f * (freq_scale * (1 - keep) + keep));
    }
}

/* Rotate the first rope_dim values of one head by the angles of llm_rope_angles: pair i is values (i,
 * i + rope_dim / 2) with rope_neox (GPT-NeoX's layout: Qwen, Gemma, gpt-oss...), else the adjacent (2i,
 * 2i + 1) (Llama's and SmolLM3's, as llama.cpp has them); values past rope_dim stay as they are */
static void llm_rope(float *x, const float *cs, const float *sn, const llm_config *c) {
    int half = c->rope_dim / 2;
    for (int i = 0; i < half; i++) {
        int a = c->rope_neox ? i : 2 * i, b = c->rope_neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * cs[i] - x1 * sn[i];
        x[b] = x0 * sn[i] + x1 * cs[i];
    }
}

/* ---- The CPU backend ----------------------------------------------------------------------------------- */
/* In order: its state, the threads, the KV pool (its addresses, stores, allocation and block copies),
 * paged attention, the mixture-of-experts FFN, the forward call, the sample step, and the backends made. */
/* Its state: the model (weights read where they are), and the KV cache in host memory, K and V each
 * laid out [index][block][slot][kv_head][head_dim], index a layer's place in its group (llm_kv_place): for
 * one layer, the K of a sequence's position p is the n_kv_heads * head_dim values at slot
 * block_table[p / block_size] * block_size + p % block_size, block_table its group's. One layer's K, in a
 * pool of 3 blocks of 4 slots, for a model of 2 K/V heads:
 *     block 0: slot 0 [head 0 | head 1]  slot 1 [head 0 | head 1]  slot 2 [...]  slot 3 [...]
 *     block 1: slot 0 [head 0 | head 1]  ...
 *     block 2: ...
 * A sequence whose block table is [2, 0] has its positions 0-3 in block 2, 4-7 in block 0; the next
 * layer's K comes after the whole pool's, so that a block number means the same slots in every layer. */
typedef struct {
    const llm_model *model;         /* &view: the model as the forward pass reads it (llm_cpu_make_tiles) */
    llm_model view;                 /* the model's struct, but for its layers' array: view_layers */
    llm_layer *view_layers;         /* the model's layers, their matrices of tiled types with decode tiles */
    uint8_t *tiles;                 /* those tiles (and the output layer's), one allocation */
    int num_blocks, block_size;
    void *k, *v;                    /* kv_bytes each, mapped: on a page, so that rows of 16 floats never
                                     * straddle two cache lines; pages of zeros until a block is written */
    size_t kv_bytes;
    int kv_half;                    /* K and V in f16 (the default but on the exact path: half the memory,
                                     * and half the bytes attention reads, as llama.cpp's cache), else f32 */
    uint32_t kv_quant;              /* or (kv_half 0) in LLM_Q8_0 or LLM_Q4_0 blocks (--kv-cache-dtype); 0 */
    float *scratch;                 /* the forward pass's activations for up to scratch_tokens tokens ... */
    int32_t *seq_of;                /* ... and their sequences: grown on demand, reused every step */
    int scratch_tokens;
    llm_sampler *sampler;           /* the sample step's, made by its first call */
    int path;                       /* enum llm_cpu_path: how the products meet quantized weights */
    int max_threads;                /* OpenMP's threads as the backend started (OMP_NUM_THREADS, or cores) */
    int adapt_threads;              /* 0 when OMP_NUM_THREADS was set: the user's number, always */
    double others_running;          /* other runnable tasks on the machine, smoothed over steps */
} llm_cpu;

/* How many threads a step uses. Every parallel loop waits for its slowest thread, so a thread that shares
 * its core with another busy process (a compiler, a second server) holds up each of the hundreds of loops of
 * a decode step: measured on 2 cores beside one busy process, 2 threads decoded 3-4 times slower than 1.
 * So each step counts the other runnable tasks (the "running" field of /proc/loadavg, less this thread),
 * smoothed over steps so that a passing blip changes nothing, and leaves that many cores to them. Returns
 * the count for the next step given the line, updating the smoothed figure; max_threads when it cannot
 * read the line. */
static __attribute__((unused)) int llm_cpu_threads_for_load(double *others_running, int max_threads,
                                                             const char *loadavg) {
    double a1, a5, a15;
    int running, total;
    if (!loadavg || sscanf(loadavg, "%lf %lf %lf %d/%d", &a1, &a5, &a15, &running, &total) != 5 ||
        running < 1)
        return max_threads;
    *others_running = 0.8 * *others_running + 0.2 * (running - 1);
    int n = max_threads - (int)(*others_running + 0.5);
    return n < 1 ? 1 : n;
}

/* The bytes of one cached K or V head (head_dim values): 2 a value in f16, 4 in f32; q8_0's 34 and q4_0's
 * 18 per block of 32, a head whole blocks (the last padded with zeros), so that no block spans two heads */
static size_t llm_cpu_kv_head_bytes(const llm_cpu *c) {
    size_t hd = (size_t)c->model->cfg.head_dim;
    return c->kv_quant ? llm_dtype_row_bytes(c->kv_quant, (int64_t)(hd + 31) / 32 * 32)
                       : hd * (c->kv_half ? 2 : 4);
}

/* Where the K (cache c->k) or V (c->v) row of a sequence's position pos lies, for the layer at index in its
 * group: the block table turns the position into a slot of the pool (block_table[pos / block_size], slot
 * pos % block_size), and the slot holds the n_kv_heads heads' rows side by side. The table's entry for pos
 * must be a block (not -1). */
static uint8_t *llm_cpu_kv_at(const llm_cpu *c, void *cache, int index, const int32_t *block_table, int pos) {
    size_t slot = (size_t)block_table[pos / c->block_size] * c->block_size + (size_t)(pos % c->block_size);
    size_t per_slot = (size_t)c->model->cfg.n_kv_heads * llm_cpu_kv_head_bytes(c); /* bytes */
    return (uint8_t *)cache + ((size_t)index * c->num_blocks * c->block_size + slot) * per_slot;
}

#ifdef LLM_CPU_SIMD
/* Section 14's: the f16 values below, 8 at a time; a quantized head's whole blocks back as f32 */
static inline __attribute__((always_inline)) int llm_f16_store_avx2(void *dst, const float *src, int n);
static inline __attribute__((always_inline)) int llm_kv_dequant_avx2(uint32_t type, const uint8_t *p,
                                                                     float *out, int hd);
#endif
/* n values into GGUF's q8_0 or q4_0 blocks, as ggml's reference quantizers: q8_0 a scale d = max |x| / 127
 * (stored in f16) and x / d rounded; q4_0 d = -(the value of largest magnitude) / 8, and x / d + 8 in 4 bits
 * (values j and j + 16 of a block share a byte, j in the low half), so that the extreme value is exactly
 * -8 d. A last block of fewer than 32 values is padded with zeros. The quantized KV cache's stores, read
 * back by llm_kv_dequant_head. */
/* roundf(x) for |x| < 2^31 (halves away from zero), as an int, with no call: libm's roundf is SSE code,
 * and called from AVX code it paid a state transition on every value (SmolLM2, a 1024-token prompt into a
 * q8_0 cache, Sapphire Rapids: the stores 32% of the time, now under 1%). The fraction a - i is exact. */
static inline int llm_round_away(float x) {
    float a = fabsf(x);
    int i = (int)a;
    i += a - (float)i >= 0.5f;
    return x < 0 ? -i : i;
}

static void llm_kv_quantize_row(uint32_t type, const float *src, uint8_t *out, int n) {
    for (int b = 0; b < n; b += 32, src += 32) {
        float amax = 0, max = 0, x[32] = {0};
        memcpy(x, src, (size_t)(n - b < 32 ? n - b : 32) * sizeof(float));
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
        float d = type == LLM_Q8_0 ? amax / 127 : max / -8, id = d != 0 ? 1 / d : 0;
        uint16_t h = llm_f32_to_f16(d);
        memcpy(out, &h, 2);
        if (type == LLM_Q8_0) {
            for (int j = 0; j < 32; j++) out[2 + j] = (uint8_t)(int8_t)llm_round_away(x[j] * id);
            out += 34;
            continue;
        }
        for (int j = 0; j < 16; j++) {
            int lo = (int)(int8_t)(x[j] * id + 8.5f), hi = (int)(int8_t)(x[j + 16] * id + 8.5f);
            out[2 + j] = (uint8_t)((lo < 15 ? lo : 15) | (hi < 15 ? hi : 15) << 4);
        }
        out += 18;
    }
}

/* A quantized cache's head of hd values back as f32: its whole blocks, then the padded last one's first
 * hd % 32 values */
static void llm_kv_dequant_head(uint32_t type, const uint8_t *p, float *out, int hd) {
    /* plain loops the compiler vectorizes, where the general llm_dtype_dequant_row unpacked each block byte
     * by byte (q4_0's conversions were 30% of a prompt's time: a run of 4 tokens converts every row before
     * it); the same values, d times the code. With SIMD the whole blocks are section 14's: a decode step
     * converts every K and V row of every sequence, and as plain C q4_0's were a quarter of the time (its
     * decode 0.73 of f16's speed). q4_0's low and high nibbles are taken 8 at a time in 64-bit words, then
     * each 16 in a loop of their own (as one loop over both halves they were converted one by one). */
    int b = 0;
#ifdef LLM_CPU_SIMD
    b = llm_kv_dequant_avx2(type, p, out, hd);
    p += llm_dtype_row_bytes(type, b);
#endif
    for (; b < hd; b += 32) {
        float d = llm_f16_at(p), v[32], *o = hd - b >= 32 ? out + b : v;
        if (type == LLM_Q8_0) {
            for (int j = 0; j < 32; j++) o[j] = d * (float)(int8_t)p[2 + j];
            p += 34;
        } else {
            uint64_t w[2], low = 0x0f0f0f0f0f0f0f0full, lo[2], hi[2];
            memcpy(w, p + 2, 16);
            lo[0] = w[0] & low, lo[1] = w[1] & low, hi[0] = w[0] >> 4 & low, hi[1] = w[1] >> 4 & low;
            const uint8_t *l = (const uint8_t *)lo, *h = (const uint8_t *)hi;
            for (int j = 0; j < 16; j++) o[j] = d * (float)((int)l[j] - 8);
            for (int j = 0; j < 16; j++) o[16 + j] = d * (float)((int)h[j] - 8);
            p += 18;
        }
        if (o == v) memcpy(out + b, v, (size_t)(hd - b) * sizeof(float));
    }
}

/* A quantized cache's blocks are rotated before they are rounded. A block's 32 values share one step (its
 * largest value / 127 in q8_0, / 8 in q4_0), and K rows have a few channels far larger than the others,
 * which then get few steps. H, the 32 x 32 Walsh-Hadamard matrix divided by sqrt(32), is orthonormal and its
 * own inverse, and spreads one large value over the whole block: K and V are stored as H times each block,
 * the queries are multiplied by H too (Hq . Hk = q . k), and attention's output, a weighted sum of rows Hv,
 * by H again, which gives the sum of the v (QuaRot's rotation, Ashkboos et al. 2024, on the blocks the
 * format already has). SmolLM2 Q4_1, 4,088 positions of docs/internals.md and docs/server.md teacher-forced
 * (tools/kv_fidelity.c), top-1 agreement with the exact path and mean KL from it, unrotated -> rotated: q8_0
 * 98.14% -> 99.14%, 0.00030 -> 0.00026 nats; q4_0 74.4% -> 84.0%, 0.136 -> 0.045 (the f16 cache: 99.93%,
 * 0.000007); on 4,088 other positions q8_0 98.41% -> 99.00%, 0.00040 -> 0.00011. Fixed sign flips before H,
 * or H over a whole head of 64, did no better (results/2026-12-05-kv-cache-rotation-spr-cpu.log). A head
 * that is not whole blocks (head_dim not a multiple of 32) is not rotated: its padded last block would mix
 * the padding into its values. */
static inline __attribute__((always_inline)) void llm_hadamard_round(float *x, int len) {
    for (int i = 0; i < 32; i += 2 * len)
        for (int j = i; j < i + len; j++) {
            float a = x[j], b = x[j + len];
            x[j] = a + b; x[j + len] = a - b;
        }
}
static void llm_hadamard32(float *x) {
    /* the fast transform: 5 rounds of sums and differences, each with its stride a constant, which the
     * compiler unrolls and vectorizes (10 ns a block on a Sapphire Rapids, 72 ns as one loop over the
     * strides: 5% of a prompt's time with a q8_0 cache) */
    llm_hadamard_round(x, 1); llm_hadamard_round(x, 2); llm_hadamard_round(x, 4);
    llm_hadamard_round(x, 8); llm_hadamard_round(x, 16);
    for (int j = 0; j < 32; j++) x[j] *= 0.17677669529663687f; /* 1 / sqrt(32) */
}
static int llm_cpu_kv_rotated(const llm_cpu *c) { return c->kv_quant && c->model->cfg.head_dim % 32 == 0; }

/* A slot's n values of K or V (its heads side by side) into the cache, as it holds them (f16: rounded to
 * nearest even, 8 at a time with F16C: the same bits as llm_f32_to_f16, which took 2.6% of a SmolLM2
 * prompt's time one at a time; q8_0, q4_0: each head into its whole blocks, llm_kv_quantize_row, each block
 * rotated first where the heads are whole blocks) */
static void llm_cpu_kv_store(const llm_cpu *c, void *dst, const float *src, int n) {
    if (c->kv_quant) {
        int hd = c->model->cfg.head_dim;
        size_t block_bytes = llm_dtype_row_bytes(c->kv_quant, 32);
        for (int h = 0; h < n / hd; h++) {
            const float *head = src + (size_t)h * hd;
            uint8_t *out = (uint8_t *)dst + h * llm_cpu_kv_head_bytes(c);
            if (!llm_cpu_kv_rotated(c)) { llm_kv_quantize_row(c->kv_quant, head, out, hd); continue; }
            for (int b = 0; b < hd; b += 32) {
                float block[32];
                memcpy(block, head + b, sizeof block);
                llm_hadamard32(block);
                llm_kv_quantize_row(c->kv_quant, block, out + (size_t)b / 32 * block_bytes, 32);
            }
        }
        return;
    }
    if (!c->kv_half) { memcpy(dst, src, (size_t)n * sizeof(float)); return; }
    int i = 0;
#ifdef LLM_CPU_SIMD
    i = llm_f16_store_avx2(dst, src, n);
#endif
    for (; i < n; i++) ((uint16_t *)dst)[i] = llm_f32_to_f16(src[i]);
}

/* Value i of a cached row, as f32 */
static float llm_cpu_kv_value(const llm_cpu *c, const void *v, int i) {
    return c->kv_half ? llm_f16_to_f32(((const uint16_t *)v)[i]) : ((const float *)v)[i];
}

/* The pool: K and V, each one anonymous mapping for all of a group's layers (its kv_bytes). alloc_kv may
 * be called again: the old pool goes first. Its pages cost memory only once written; -1 with the reason
 * when a mapping fails. */
static void llm_cpu_free_kv(llm_cpu *c) {
    if (c->k) munmap(c->k, c->kv_bytes);
    if (c->v) munmap(c->v, c->kv_bytes);
    c->k = c->v = NULL;
}

static int llm_cpu_alloc_kv(llm_backend *be, int num_blocks, int block_size, char *err) {
    llm_cpu *c = (llm_cpu *)be->ctx;
    if (num_blocks <= 0 || block_size <= 0)
        return llm_fail(err, "KV cache needs at least one block of one slot");
    llm_cpu_free_kv(c);
    c->kv_bytes = llm_kv_bytes_per_block(&c->model->cfg, block_size, be->kv_head_bytes) / 2 *
                  (size_t)num_blocks; /* K's, and V's */
    c->k = mmap(NULL, c->kv_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    c->v = mmap(NULL, c->kv_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (c->k == MAP_FAILED) c->k = NULL;
    if (c->v == MAP_FAILED) c->v = NULL;
    c->num_blocks = num_blocks; c->block_size = block_size;
    if (!c->k || !c->v) {
        llm_cpu_free_kv(c);
        return llm_fail(err, "out of memory for %d KV blocks", num_blocks);
    }
    return 0;
}

/* Copy-on-write: block dst becomes a copy of block src, in every layer of a group, for K and V. */
static void llm_cpu_copy_block(llm_cpu *c, int src, int dst) {
    size_t per_block = (size_t)c->block_size * c->model->cfg.n_kv_heads * llm_cpu_kv_head_bytes(c);
    for (int l = 0, n = llm_kv_group_layers(&c->model->cfg); l < n; l++) {
        size_t layer = (size_t)l * c->num_blocks * per_block;
        uint8_t *k = (uint8_t *)c->k + layer, *v = (uint8_t *)c->v + layer;
        memcpy(k + (size_t)dst * per_block, k + (size_t)src * per_block, per_block);
        memcpy(v + (size_t)dst * per_block, v + (size_t)src * per_block, per_block);
    }
}

#ifdef LLM_CPU_SIMD
/* Section 14's: o = sum_p w_p v_p for ng (1 to 3) heads, over nv runs of LLM_VRUN values from i0, in
 * registers (with AVX-512 up to 4 runs of 16, a 64-value head at once; with AVX2 3 runs of 8): from the f16
 * cache's blocks (llm_cpu_weighted_v), or from a quantized cache's rows once converted (llm_weighted_rows) */
#if defined(LLM_AVX512F)
#define LLM_VRUN 16
#define LLM_VRUNS 4
#else
#define LLM_VRUN 8
#define LLM_VRUNS 3
#endif
static void llm_weighted_rows(int ng, int nv, const float *rows, int64_t row_stride, int n_rows,
                              const float *w, int64_t w_stride, int i0, float *o, int hd);
static void llm_cpu_weighted_v(const llm_cpu *c, int ng, int nv, int index, const int32_t *block_table,
                               size_t head_offset, int first, int last, const float *w, int64_t w_stride,
                               int i0, float *o, int hd);
#endif

/* Paged attention for the nq query heads that share K/V head kv_head (grouped-query attention) of nt tokens
 * of one sequence at positions pos..pos + nt - 1 (a prompt's run; one token in a decode step): for each token
 * and head, softmax over the scores q . k_p / sqrt(hd) of the positions p up to its own, then the weighted
 * sum of their v_p. K and V are read through the block table; each k_p once for all nt * nq queries, 12 at a
 * time, whose sums' additions then overlap (SmolLM2 F16, a 512-token prompt, one thread: attention in 0.75 of
 * the time of one token at a time), each score the same bit for bit as the token's alone would give.
 * sinks: each head's sink logit (gpt-oss), or NULL. q and out: token i's heads at i * stride, hd values each,
 * one after another. An f16 cache: each block's K rows converted to f32 first (exact), then the same code, so
 * the scores are those of an f32 cache holding the same values, bit for bit. scratch: room for
 * nt * nq * (pos + nt + hd) + (block_size + 1) * hd values; nq at most LLM_MAX_GROUP, nt * nq at most
 * LLM_DOT_MAX_VECTORS. */
#define LLM_MAX_GROUP 8
static void llm_cpu_attention(const llm_cpu *c, int index, const int32_t *block_table, int pos, int nt,
                              int kv_head, int nq, int window, const float *sinks, const float *q,
                              float *out, int64_t stride, float *scratch) {
    int hd = c->model->cfg.head_dim, n_ctx = pos + nt, bs = c->block_size, nqt = nt * nq;
    int first = window > 0 && pos + 1 > window ? pos + 1 - window : 0; /* a local layer: the last window */
    /* a block's slots are per_slot bytes apart, a slot's heads head_bytes */
    size_t head_bytes = llm_cpu_kv_head_bytes(c);
    size_t per_slot = c->model->cfg.n_kv_heads * head_bytes;
    float scale = 1.0f / sqrtf((float)hd), dots[LLM_DOT_MAX_VECTORS];
    /* scores[j * n_ctx + p] for query j = token i's head g = i * nq + g; the queries side by side; an f16
     * cache's block of K rows as f32 */
    /* 1. the queries side by side in scratch (with AVX-512, 4 or more of them, in pairs). A run of nt = 3
     * tokens and nq = 2 heads: 6 queries, each k_p read once for all of them,
     *     queries   [t0 h0][t0 h1][t1 h0][t1 h1][t2 h0][t2 h1]      query j = token j / nq's head j % nq
     *     scores    row j: query j's scores over positions first..pos + nt - 1 (token i sees to pos + i) */
    float *scores = scratch, *queries = scratch + (size_t)nqt * n_ctx;
    float *k_rows = queries + (size_t)(nqt + 1) * hd;
    int pairs = 0; /* with AVX-512, a prompt's queries (4 to 12) side by side in pairs for llm_dot_pairs */
#if defined(LLM_CPU_SIMD) && defined(LLM_AVX512F)
    pairs = nqt >= 4 && hd % 8 == 0;
    for (int j = 0; pairs && j < nqt + nqt % 2; j++) /* values i..i+7 of query j at 2 hd (j / 2) + 2 i */
        for (int i = 0; i < hd; i += 8)
            for (int k = 0; k < 8; k++)
                queries[(size_t)(j / 2) * 2 * hd + 2 * i + 8 * (j % 2) + k] =
                    j < nqt ? q[(j / nq) * stride + (j % nq) * hd + i + k] : 0;
#endif
    for (int i = 0; !pairs && i < nt; i++)
        memcpy(queries + (size_t)i * nq * hd, q + i * stride, (size_t)nq * hd * sizeof(float));
    /* 2. the scores q . k_p / sqrt(hd) of every query with every position from first to the last token's */
    for (int p0 = first - first % bs; p0 < n_ctx; p0 += bs) { /* block by block: the table read once each */
        int lo = p0 > first ? p0 : first, hi = p0 + bs < n_ctx ? p0 + bs : n_ctx; /* the positions wanted */
        const uint8_t *kp = llm_cpu_kv_at(c, c->k, index, block_table, lo) + kv_head * head_bytes;
        const float *k = (const float *)kp; /* position lo's K row, the next k_stride floats on */
        int64_t k_stride = (int64_t)(per_slot / sizeof(float));
        if (c->kv_half || c->kv_quant) {
            for (int p = lo; p < hi; p++)
                if (c->kv_quant)
                    llm_kv_dequant_head(c->kv_quant, kp + (size_t)(p - lo) * per_slot,
                                        k_rows + (size_t)(p - lo) * hd, hd);
                else
                    llm_dtype_dequant_row(LLM_F16, kp + (size_t)(p - lo) * per_slot,
                                          k_rows + (size_t)(p - lo) * hd, hd);
            k = k_rows, k_stride = hd;
        }
        if (nqt < 4) { /* a decode step's few queries: each against the block's K rows, 12 or 8 at a time,
                        * their lanes added 8 sums at once (llm_dot_many): the same products and sums as k
                        * against the queries, bit for bit, where 3 sums a call added their lanes one by one
                        * (16 SmolLM2 Q8_0 sequences decoding, 2 threads: the scores 15% of the time before,
                        * 10% after; decode 1.065 times as fast) */
            for (int j = 0; j < nqt; j++) {
                float *sc = scores + (size_t)j * n_ctx + lo;
                llm_dot_many(queries + (size_t)j * hd, k, k_stride, hi - lo, hd, sc);
                for (int p = 0; p < hi - lo; p++) sc[p] *= scale;
            }
            continue;
        }
        /* a prompt's run: each k_p against all its queries at once (llm_dot_many, or the pairs) */
        for (int p = lo; p < hi; p++, k += k_stride) { /* a token's dots with later p are left unused */
#if defined(LLM_CPU_SIMD) && defined(LLM_AVX512F)
            if (pairs) llm_dot_pairs(k, queries, (nqt + 1) / 2, hd, dots);
            else
#endif
            llm_dot_many(k, queries, hd, nqt, hd, dots);
            for (int j = 0; j < nqt; j++) scores[(size_t)j * n_ctx + p] = dots[j] * scale;
        }
    }
    /* 3. per token, per head: the softmax of its scores over the positions it sees (a sink's logit joins the
     * sum but has no value) */
    for (int i = 0; i < nt; i++) { /* token i: positions first_i..pos + i */
        int last = pos + i, first_i = window > 0 && last + 1 > window ? last + 1 - window : 0;
        for (int g = 0; g < nq; g++) {
            float *row = scores + (size_t)(i * nq + g) * n_ctx, mx = sinks ? sinks[g] : -INFINITY, sum = 0;
            /* exp(s - the largest s) / their sum: the largest taken off first, so that no exp overflows */
            mx = llm_max(row + first_i, last + 1 - first_i, mx);
            llm_softmax_exp(row + first_i, last + 1 - first_i, mx);
            for (int p = first_i; p <= last; p++) sum += row[p];
            if (sinks) sum += expf(sinks[g] - mx);
            for (int p = first_i; p <= last; p++) row[p] /= sum;
        }
    }
    /* 4. each token's o = sum_p w_p v_p, a multiply then an add for each p in turn. A quantized cache: each
     * block's V rows as f32 once (into k_rows, free now) for all the run's tokens, not once per token (a
     * 512-token prompt converted each row 256 times): each o value still adds its products in order of p */
    if (c->kv_quant) {
        for (int i = 0; i < nt; i++) memset(out + i * stride, 0, (size_t)nq * hd * sizeof(float));
        for (int p0 = first - first % bs; p0 < n_ctx; p0 += bs) {
            int lo = p0 > first ? p0 : first, hi = p0 + bs < n_ctx ? p0 + bs : n_ctx;
            const uint8_t *vp = llm_cpu_kv_at(c, c->v, index, block_table, p0) + kv_head * head_bytes;
            for (int p = lo; p < hi; p++)
                llm_kv_dequant_head(c->kv_quant, vp + (size_t)(p - p0) * per_slot,
                                    k_rows + (size_t)(p - p0) * hd, hd);
            for (int i = 0; i < nt; i++) {
                int last = pos + i, first_i = window > 0 && last + 1 > window ? last + 1 - window : 0;
                int from = lo > first_i ? lo : first_i, to = hi - 1 < last ? hi - 1 : last;
                const float *sc = scores + (size_t)i * nq * n_ctx;
                float *o = out + i * stride;
                if (from > to) continue;
                int k0 = 0; /* with SIMD: runs of LLM_VRUN values, o in registers over the block's rows */
#ifdef LLM_CPU_SIMD
                while (k0 + LLM_VRUN <= hd) {
                    int nv = (hd - k0) / LLM_VRUN < LLM_VRUNS ? (hd - k0) / LLM_VRUN : LLM_VRUNS;
                    for (int g0 = 0; g0 < nq; g0 += 3)
                        llm_weighted_rows(nq - g0 < 3 ? nq - g0 : 3, nv, k_rows + (size_t)(from - p0) * hd,
                                          hd, to - from + 1, sc + (size_t)g0 * n_ctx + from, n_ctx, k0,
                                          o + (size_t)g0 * hd, hd);
                    k0 += LLM_VRUN * nv;
                }
#endif
                for (int p = from; p <= to; p++) {
                    const float *v = k_rows + (size_t)(p - p0) * hd;
                    for (int g = 0; g < nq; g++) {
                        float w = sc[(size_t)g * n_ctx + p];
                        for (int k = k0; k < hd; k++) o[(size_t)g * hd + k] += w * v[k];
                    }
                }
            }
        }
        return;
    }
    for (int i = 0; i < nt; i++) {
        int last = pos + i, first_i = window > 0 && last + 1 > window ? last + 1 - window : 0;
        float *sc = scores + (size_t)i * nq * n_ctx, *o = out + i * stride;
        int i0 = 0; /* with SIMD: llm_cpu_weighted_v, runs of LLM_VRUN values */
#ifdef LLM_CPU_SIMD
        while (i0 + LLM_VRUN <= hd) { /* nv runs of LLM_VRUN values at a time */
            int nv = (hd - i0) / LLM_VRUN < LLM_VRUNS ? (hd - i0) / LLM_VRUN : LLM_VRUNS;
            for (int g0 = 0; g0 < nq; g0 += 3)
                llm_cpu_weighted_v(c, nq - g0 < 3 ? nq - g0 : 3, nv, index, block_table, kv_head * head_bytes,
                                   first_i, last, sc + (size_t)g0 * n_ctx, n_ctx, i0,
                                   o + (size_t)g0 * hd, hd);
            i0 += LLM_VRUN * nv;
        }
#endif
        for (int g = 0; g < nq; g++)
            for (int k = i0; k < hd; k++) o[(size_t)g * hd + k] = 0;
        for (int p0 = first_i - first_i % bs; i0 < hd && p0 <= last; p0 += bs) {
            const uint8_t *vp = llm_cpu_kv_at(c, c->v, index, block_table, p0) + kv_head * head_bytes;
            for (int p = p0; p <= last && p < p0 + bs; p++, vp += per_slot) {
                if (p < first_i) continue;
                for (int g = 0; g < nq; g++)
                    for (int k = i0; k < hd; k++)
                        o[(size_t)g * hd + k] += sc[(size_t)g * n_ctx + p] * llm_cpu_kv_value(c, vp, k);
            }
        }
    }
}

/* A mixture-of-experts FFN on T normalised rows xn, into delta. The router scores each token's experts; the
 * softmax over all of them, its top n_experts_used kept and renormalised (qwen3moe's and Mixtral's way, as
 * llama.cpp has them), weight each chosen expert's SwiGLU. gpt-oss: the router and the experts have biases,
 * the top n_experts_used scores are kept and the softmax is over them alone, and the experts' gate is
 * clamped: min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1). qwen2moe: the top weights are not
 * renormalised, and a shared expert adds its SwiGLU to every token, gated by sigmoid(shared_gate_inp . x).
 * Grouped by expert: each expert's tokens are
 * gathered into rows, so its matrices are read once per step, not once per token; a row's arithmetic is the
 * same in any group, so a token's output does not depend on the batch. scratch: llm_cpu_moe_floats(cf) per
 * token of the batch. 1: out of memory. */
void llm_moe_route(const llm_config *cf, const float *router_bias, float *scores, int T, int *chosen,
                   float *weight) {
    int E = cf->n_experts, K = cf->n_experts_used;
    int gpt_oss = cf->arch == LLM_ARCH_GPT_OSS, renormalise = cf->arch != LLM_ARCH_QWEN2MOE;
    for (int t = 0; t < T; t++) { /* softmax, top K (the lower index on a tie), renormalised */
        float *p = scores + (size_t)t * E, mx = -INFINITY, sum = 0, kept = 0;
        for (int e = 0; router_bias && e < E; e++) p[e] += router_bias[e];
        for (int e = 0; e < E; e++) if (p[e] > mx) mx = p[e];
        for (int e = 0; !gpt_oss && e < E; e++) { p[e] = expf(p[e] - mx); sum += p[e]; }
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= chosen[t * K + j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            chosen[t * K + k] = best;
            weight[t * K + k] = gpt_oss ? expf(p[best] - mx) : p[best] / sum; /* gpt-oss: the kept ones'
                                                                               * softmax */
            kept += weight[t * K + k];
        }
        for (int k = 0; renormalise && k < K; k++) weight[t * K + k] /= kept;
    }
}

/* The scratch floats llm_cpu_moe needs per token of a batch (0 for a model without experts) */
static size_t llm_cpu_moe_floats(const llm_config *cf) {
    size_t width = (size_t)(cf->shared_ffn_dim > cf->expert_ffn_dim ? cf->shared_ffn_dim :
                            cf->expert_ffn_dim);
    return cf->n_experts ? (size_t)cf->n_experts + 2 * (size_t)cf->n_experts_used + 1 + 2 * (size_t)cf->dim +
                           2 * width : 0;
}

static int llm_cpu_moe(const llm_config *cf, const llm_layer *L, const float *xn, int T, float *delta,
                       int path, float *scratch) {
    int D = cf->dim, E = cf->n_experts, K = cf->n_experts_used, Fe = cf->expert_ffn_dim,
        Fs = cf->shared_ffn_dim;
    int failed = 0, width = Fs > Fe ? Fs : Fe;
    /* per token: scores [E], weight [K], chosen [K] (ints), rows [1] (ints), xe and oe [D], ge and ue [Fe]
     * (or the shared expert's [Fs], when wider) */
    float *scores = scratch, *weight = scores + (size_t)T * E;
    int *chosen = (int *)(weight + (size_t)T * K), *rows = chosen + (size_t)T * K;
    float *xe = (float *)(rows + T), *oe = xe + (size_t)T * D, *ge = oe + (size_t)T * D;
    float *ue = ge + (size_t)T * width;
    int gpt_oss = cf->arch == LLM_ARCH_GPT_OSS;
    /* 1. the router's scores, each token's chosen experts and their weights */
    failed = llm_matmul(scores, xn, &L->router, T, path);
    if (!failed) llm_moe_route(cf, (const float *)L->router_b.data, scores, T, chosen, weight);
    /* 2. expert by expert: the tokens that chose it gathered into rows xe, its FFN on them, each output
     * added to its token's delta times the token's weight for that expert */
    memset(delta, 0, (size_t)T * D * sizeof(float));
    for (int e = 0; !failed && e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) if (chosen[t * K + k] == e) rows[n++] = t;
        if (!n) continue;
        for (int i = 0; i < n; i++)
            memcpy(xe + (size_t)i * D, xn + (size_t)rows[i] * D, (size_t)D * sizeof(float));
        llm_weight wg = llm_weight_rows(L->gate_exps, (int64_t)e * Fe, Fe);
        llm_weight wu = llm_weight_rows(L->up_exps, (int64_t)e * Fe, Fe);
        llm_weight wd = llm_weight_rows(L->down_exps, (int64_t)e * D, D);
        failed = llm_matmul(ge, xe, &wg, n, path) | llm_matmul(ue, xe, &wu, n, path);
        if (!failed && gpt_oss) {
            const float *bg = (const float *)L->gate_exps_b.data + (size_t)e * Fe;
            const float *bu = (const float *)L->up_exps_b.data + (size_t)e * Fe;
            for (int r = 0; r < n; r++)
                for (int j = 0; j < Fe; j++) {
                    size_t i = (size_t)r * Fe + j;
                    float g = fminf(ge[i] + bg[j], 7.0f), u = fminf(fmaxf(ue[i] + bu[j], -7.0f), 7.0f);
                    ge[i] = g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
                }
        } else if (!failed)
            llm_swiglu(ge, ue, (size_t)n * Fe);
        failed |= failed ? 0 : llm_matmul(oe, ge, &wd, n, path);
        for (int i = 0; !failed && gpt_oss && i < n; i++)
            for (int d = 0; d < D; d++)
                oe[(size_t)i * D + d] += ((const float *)L->down_exps_b.data)[(size_t)e * D + d];
        for (int i = 0; !failed && i < n; i++) {
            int t = rows[i];
            float w = 0;
            for (int k = 0; k < K; k++) if (chosen[t * K + k] == e) w = weight[t * K + k];
            for (int d = 0; d < D; d++) delta[(size_t)t * D + d] += w * oe[(size_t)i * D + d];
        }
    }
    /* 3. a shared expert: every token through it, gated by sigmoid(shared_gate_inp . xn) */
    if (!failed && L->shared_gate.data) { /* qwen2moe's shared expert, for every token */
        failed = llm_matmul(ge, xn, &L->shared_gate, T, path) | llm_matmul(ue, xn, &L->shared_up, T, path);
        if (!failed) llm_swiglu(ge, ue, (size_t)T * Fs);
        failed |= failed ? 0 : llm_matmul(oe, ge, &L->shared_down, T, path);
        for (int t = 0; !failed && t < T; t++) {
            float logit = llm_dot((const float *)L->shared_gate_inp.data, xn + (size_t)t * D, D);
            float gate = 1.0f / (1.0f + expf(-logit));
            for (int d = 0; d < D; d++) delta[(size_t)t * D + d] += gate * oe[(size_t)t * D + d];
        }
    }
    return failed;
}

/* a step's work token by token (norms, RoPE, the residual stream, the activation) shared among the threads
 * from this many tokens on, below which they would cost more than they save (one thread did it while the
 * other waited: SmolLM2 pp512, two threads, F16 and Q8_0 1.03 to 1.08 times as fast; 16 sequences decoding,
 * Q8_0, 1.05 to 1.08) */
#define LLM_TOKENS_PARALLEL 8
/* The backend's forward call: the batch's tokens through every layer, their K and V written into the cache
 * at their slots, the logit rows' logits into logits ([n_logits][vocab_size]). The block copies of the
 * batch (copy-on-write) are made first, before any token reads a block. Each step of a layer is over all T
 * tokens at once (the matrix products), or token by token where tokens are independent (norms, RoPE, the
 * activation), shared among the threads; attention runs over (run of a sequence's tokens, K/V head) pairs.
 * 0, or -1 with the reason: no KV cache, a block copy outside the pool or a token id outside the vocabulary
 * (found before any layer runs), or out of memory (the logits are then not to be read). */
static int llm_cpu_forward(llm_backend *be, const llm_batch *b, float *logits, char *err) {
    llm_cpu *c = (llm_cpu *)be->ctx;
    /* 0. this step's threads: fewer while other processes keep cores busy */
#ifdef _OPENMP
    if (c->adapt_threads) {
        char line[128];
        FILE *f = fopen("/proc/loadavg", "r");
        int ok = f && fgets(line, sizeof line, f) != NULL;
        if (f) fclose(f);
        omp_set_num_threads(llm_cpu_threads_for_load(&c->others_running, c->max_threads, ok ? line : NULL));
    }
#endif
    /* 1. the batch checked, the copies made */
    const llm_model *m = c->model;
    const llm_config *cf = &m->cfg;
    int T = b->n_tokens, D = cf->dim, hd = cf->head_dim, F = cf->ffn_dim;
    int q_dim = cf->n_heads * hd, kv_dim = cf->n_kv_heads * hd, group = cf->n_heads / cf->n_kv_heads;
    int path = c->path;
    if (!c->k) return llm_fail(err, "the CPU backend has no KV cache (alloc_kv was not called)");
    for (int i = 0; i < b->n_copies; i++) {
        int src = b->copy_src[i], dst = b->copy_dst[i];
        if (src < 0 || dst < 0 || src >= c->num_blocks || dst >= c->num_blocks)
            return llm_fail(err, "block copy %d -> %d: outside the KV pool of %d blocks", src, dst,
                            c->num_blocks);
        llm_cpu_copy_block(c, src, dst);
    }
    if (T <= 0) return 0;
    for (int i = 0; i < T; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= cf->vocab_size)
            return llm_fail(err, "token id %d outside the vocabulary", b->tokens[i]);

    /* 2. the activations' rows, and what the layers share: each token's sequence, attention's runs, RoPE */
    /* Scratch, one row per token of the batch:
     *   x         [T][D]      the residual stream: the token's embedding, plus the output of every block
     *   xn        [T][D]      x normalised: the input of the next matrix products (later, of the logits)
     *   q         [T][q_dim]  queries, heads side by side; k, v [T][kv_dim] this step's keys and values
     *   att       [T][q_dim]  the attention output, heads side by side
     *   gate, up  [T][F]      the feed-forward's two projections; gate becomes silu(gate) * up
     *   delta     [T][D]      a block's last matrix product, added to x
     *   moe                   a mixture of experts' routing and rows (llm_cpu_moe), when the model has one
     *   rope      [T][2][2][rope_dim / 2]  RoPE's cos and sin at the token's position, for the global layers
     *                                      and for the local ones (their own base and scale)
     *   seq_of    [T]         the sequence each token belongs to (whose block table it reads)
     *   run_start [T + 1]     attention's runs of tokens (below) */
    size_t per_token = 3 * (size_t)D + 2 * (size_t)q_dim + 2 * (size_t)kv_dim + 2 * (size_t)F +
                       llm_cpu_moe_floats(cf) + 2 * (size_t)cf->rope_dim;
    if (T > c->scratch_tokens) { /* kept from step to step: the same activations are rewritten every step */
        free(c->scratch); free(c->seq_of);
        /* on 64 bytes, a cache line: rows of a width of 16 floats then never straddle two, which cost the
         * products' loads of them a second read (SmolLM2 F16 pp512, one thread: 1.1 times as fast) */
        size_t bytes = ((size_t)T * per_token * sizeof(float) + 63) / 64 * 64;
        c->scratch = (float *)aligned_alloc(64, bytes);
        c->seq_of = (int32_t *)malloc((2 * (size_t)T + 1) * sizeof(int32_t)); /* and run_start */
        c->scratch_tokens = c->scratch && c->seq_of ? T : 0;
        if (!c->scratch_tokens) return llm_fail(err, "out of memory in the forward pass (%d tokens)", T);
    }
    float *x = c->scratch;
    int32_t *seq_of = c->seq_of;
    float *xn = x + (size_t)T * D, *q = xn + (size_t)T * D, *k = q + (size_t)T * q_dim;
    float *v = k + (size_t)T * kv_dim, *att = v + (size_t)T * kv_dim, *gate = att + (size_t)T * q_dim;
    float *up = gate + (size_t)T * F, *delta = up + (size_t)T * F, *moe = delta + (size_t)T * D;
    float *rope_tab = moe + (size_t)T * llm_cpu_moe_floats(cf);
    int max_ctx = 0, failed = 0, pairs = cf->rope_dim / 2;
    for (int s = 0; s < b->n_seqs; s++)
        for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i++) {
            seq_of[i] = s;
            if (b->positions[i] + 1 > max_ctx) max_ctx = b->positions[i] + 1;
        }
    /* attention's runs: consecutive tokens of a sequence at consecutive positions (a prompt's), as many as
     * make LLM_DOT_MAX_VECTORS queries of a K/V head, meet each k_p together (llm_cpu_attention). A batch
     * of 5 prompt tokens of sequence 0 and a decode token of sequence 1, 3 query heads to a K/V head
     * (run_tokens = 12 / 3 = 4): runs [0..3], [4], [5] */
    int32_t *run_start = seq_of + T;
    int n_runs = 0, group_calls = (group + LLM_MAX_GROUP - 1) / LLM_MAX_GROUP;
    int run_tokens = LLM_DOT_MAX_VECTORS / (group < LLM_MAX_GROUP ? group : LLM_MAX_GROUP);
    for (int t = 0; t < T; t++)
        if (t == 0 || seq_of[t] != seq_of[t - 1] || b->positions[t] != b->positions[t - 1] + 1 ||
            t - run_start[n_runs - 1] == run_tokens)
            run_start[n_runs++] = t;
    run_start[n_runs] = T;

    /* the angles once per step, not once per layer */
    for (int t = 0; t < T; t++) {
        float *r = rope_tab + (size_t)t * 4 * pairs;
        llm_rope_angles(r, r + pairs, b->positions[t], cf, cf->rope_base, cf->rope_freq_scale);
        if (cf->sliding_window > 0)
            llm_rope_angles(r + 2 * pairs, r + 3 * pairs, b->positions[t], cf, cf->rope_base_swa,
                            cf->rope_freq_scale_swa);
    }

    /* the embedding of each token */
    size_t emb_row = llm_dtype_row_bytes(m->tok_embd.type, D);
    const uint8_t *emb = (const uint8_t *)m->tok_embd.data;
    for (int t = 0; t < T; t++)
        llm_dtype_dequant_row(m->tok_embd.type, emb + emb_row * (size_t)b->tokens[t], x + (size_t)t * D, D);
    if (cf->arch == LLM_ARCH_GEMMA3) { /* Gemma scales its embeddings by sqrt(dim) */
        float scale = sqrtf((float)D);
        for (size_t i = 0; i < (size_t)T * D; i++) x[i] *= scale;
    }

    /* 3. the layers, each adding its attention's and its feed-forward's outputs to the residual stream x */
    for (int l = 0; l < cf->n_layers; l++) {
        const llm_layer *L = &m->layers[l];
        /* Gemma 3's local layers: a window of the last positions, and a RoPE base of their own; their K and
         * V in their group's blocks */
        int window = llm_layer_window(cf, l), local = window > 0, kv_group, kv_index;
        int rope = !cf->nope_every || (l + 1) % cf->nope_every != 0; /* SmolLM3's layers without RoPE */
        llm_kv_place(cf, l, &kv_group, &kv_index);
        const int32_t *const *tables = b->block_tables + (size_t)kv_group * b->n_seqs;
        /* attention block: the normalised stream projected to queries, keys and values */
        #pragma omp parallel for schedule(static) if (T >= LLM_TOKENS_PARALLEL)
        for (int t = 0; t < T; t++)
            llm_rmsnorm(xn + (size_t)t * D, x + (size_t)t * D, (const float *)L->attn_norm.data, D,
                        cf->rms_eps);
        failed |= llm_matmul(q, xn, &L->wq, T, path) | llm_matmul(k, xn, &L->wk, T, path) |
                  llm_matmul(v, xn, &L->wv, T, path);
        /* per token: the biases (qwen2), an RMS norm of each q and k head (qwen3), RoPE at the token's
         * position; then its k and v go into the cache at its slot, where this step and later ones read
         * them */
        #pragma omp parallel for schedule(static) if (T >= LLM_TOKENS_PARALLEL)
        for (int t = 0; t < T; t++) {
            float *qt = q + (size_t)t * q_dim, *kt = k + (size_t)t * kv_dim, *vt = v + (size_t)t * kv_dim;
            const float *rope_cos = rope_tab + (size_t)t * 4 * pairs + (local ? 2 * pairs : 0);
            const float *rope_sin = rope_cos + pairs;
            for (int i = 0; L->bq.data && i < q_dim; i++) qt[i] += ((const float *)L->bq.data)[i];
            for (int i = 0; L->bk.data && i < kv_dim; i++) kt[i] += ((const float *)L->bk.data)[i];
            for (int i = 0; L->bv.data && i < kv_dim; i++) vt[i] += ((const float *)L->bv.data)[i];
            for (int h = 0; h < cf->n_heads; h++) {
                if (L->q_norm.data)
                    llm_rmsnorm(qt + h * hd, qt + h * hd, (const float *)L->q_norm.data, hd, cf->rms_eps);
                if (rope) llm_rope(qt + h * hd, rope_cos, rope_sin, cf);
            }
            for (int h = 0; h < cf->n_kv_heads; h++) {
                if (L->k_norm.data)
                    llm_rmsnorm(kt + h * hd, kt + h * hd, (const float *)L->k_norm.data, hd, cf->rms_eps);
                if (rope) llm_rope(kt + h * hd, rope_cos, rope_sin, cf);
            }
            if (llm_cpu_kv_rotated(c)) /* a quantized cache's K is rotated: the queries alike */
                for (int i = 0; i < q_dim; i += 32) llm_hadamard32(qt + i);
            const int32_t *bt = tables[seq_of[t]];
            llm_cpu_kv_store(c, llm_cpu_kv_at(c, c->k, kv_index, bt, b->positions[t]), kt, kv_dim);
            llm_cpu_kv_store(c, llm_cpu_kv_at(c, c->v, kv_index, bt, b->positions[t]), vt, kv_dim);
        }
        /* attention: every (token, query head) pair is independent once this step's K/V are in the cache */
        #pragma omp parallel
        {
            float *scratch = (float *)malloc(((size_t)LLM_DOT_MAX_VECTORS * (max_ctx + hd) +
                                              (size_t)(c->block_size + 1) * hd) * sizeof(float));
            if (!scratch) {
                #pragma omp atomic write
                failed = 1;
            }
            /* a run's query heads that share a K/V head, LLM_MAX_GROUP at most at a time */
            int n_calls = n_runs * cf->n_kv_heads * group_calls;
            #pragma omp for schedule(dynamic, 2)
            for (int call = 0; call < n_calls; call++) {
                int run = call / (cf->n_kv_heads * group_calls), kv = call / group_calls % cf->n_kv_heads;
                int h = kv * group + call % group_calls * LLM_MAX_GROUP, t = run_start[run];
                int nq = kv * group + group - h < LLM_MAX_GROUP ? kv * group + group - h : LLM_MAX_GROUP;
                if (scratch)
                    llm_cpu_attention(c, kv_index, tables[seq_of[t]], b->positions[t], run_start[run + 1] - t,
                                      kv, nq, window, L->sinks.data ? (const float *)L->sinks.data + h : NULL,
                                      q + (size_t)t * q_dim + h * hd, att + (size_t)t * q_dim + h * hd, q_dim,
                                      scratch);
            }
            free(scratch);
        }
        if (llm_cpu_kv_rotated(c)) { /* sums of rotated V rows: rotated back (H is its own inverse) */
            #pragma omp parallel for schedule(static) if (T >= LLM_TOKENS_PARALLEL)
            for (int t = 0; t < T; t++)
                for (int i = 0; i < q_dim; i += 32) llm_hadamard32(att + (size_t)t * q_dim + i);
        }
        /* the output projection (gpt-oss: with a bias; Gemma 3: normalised), added to the residual stream */
        failed |= llm_matmul(delta, att, &L->wo, T, path);
        for (int t = 0; L->bo.data && t < T; t++)
            for (int i = 0; i < D; i++) delta[(size_t)t * D + i] += ((const float *)L->bo.data)[i];
        for (int t = 0; L->post_attn_norm.data && t < T; t++)
            llm_rmsnorm(delta + (size_t)t * D, delta + (size_t)t * D, (const float *)L->post_attn_norm.data,
                        D, cf->rms_eps);
        #pragma omp parallel for schedule(static) if (T >= LLM_TOKENS_PARALLEL)
        for (int t = 0; t < T; t++) { /* the residual stream, normalised for the feed-forward block */
            for (int i = 0; i < D; i++) x[(size_t)t * D + i] += delta[(size_t)t * D + i];
            llm_rmsnorm(xn + (size_t)t * D, x + (size_t)t * D, (const float *)L->ffn_norm.data, D,
                        cf->rms_eps);
        }

        /* feed-forward block: down(act(gate(xn)) * up(xn)), act SiLU (SwiGLU) or, for Gemma, GELU's tanh
         * form (GeGLU); Gemma 3 normalises the output too; added to the residual stream */
        if (cf->n_experts) failed |= llm_cpu_moe(cf, L, xn, T, delta, path, moe);
        else {
            failed |= llm_matmul(gate, xn, &L->w_gate, T, path) | llm_matmul(up, xn, &L->w_up, T, path);
            #pragma omp parallel for schedule(static) if (T >= LLM_TOKENS_PARALLEL)
            for (int t = 0; t < T; t++) { /* token by token: a token's values the same in any batch */
                float *g = gate + (size_t)t * F;
                const float *u = up + (size_t)t * F;
                if (cf->arch == LLM_ARCH_GEMMA3)
                    for (int i = 0; i < F; i++) {
                        float z = g[i];
                        g[i] = 0.5f * z * (1.0f + tanhf(0.7978845608f * (z + 0.044715f * z * z * z))) * u[i];
                    }
                else llm_swiglu(g, u, (size_t)F);
            }
            failed |= llm_matmul(delta, gate, &L->w_down, T, path);
        }
        #pragma omp parallel for schedule(static) if (T >= LLM_TOKENS_PARALLEL)
        for (int t = 0; t < T; t++) {
            if (L->post_ffn_norm.data)
                llm_rmsnorm(delta + (size_t)t * D, delta + (size_t)t * D,
                            (const float *)L->post_ffn_norm.data, D, cf->rms_eps);
            for (int i = 0; i < D; i++) x[(size_t)t * D + i] += delta[(size_t)t * D + i];
        }
    }
    /* 4. the logits */
    /* the final norm and the output matrix, only for the rows that need logits: a prefill of 500 tokens
     * samples once */
    for (int i = 0; i < b->n_logits; i++)
        llm_rmsnorm(xn + (size_t)i * D, x + (size_t)b->logit_rows[i] * D, (const float *)m->output_norm.data,
                    D, cf->rms_eps);
    failed |= llm_matmul(logits, xn, &m->output, b->n_logits, path);
    /* an embedding's rows: the same final norm, and no output matrix */
    for (int i = 0; i < b->n_hidden; i++)
        llm_rmsnorm(b->hidden + (size_t)i * D, x + (size_t)b->hidden_rows[i] * D,
                    (const float *)m->output_norm.data, D, cf->rms_eps);
    return failed ? llm_fail(err, "out of memory in the forward pass (%d tokens)", T) : 0;
}

/* The sample step: the rows are here already, in the host's buffer */
static int llm_cpu_sample(llm_backend *be, llm_sample_row *rows, int n_rows, float *logits, char *err) {
    llm_cpu *c = (llm_cpu *)be->ctx;
    if (!c->sampler && !(c->sampler = llm_sampler_create(c->model->cfg.vocab_size, err))) return -1;
    llm_sampler_sample_rows(c->sampler, rows, n_rows, logits);
    return 0;
}

/* The KV pool, the sampler and the scratch freed, and the backend; the model is the caller's */
static void llm_cpu_destroy(llm_backend *be) {
    llm_cpu *c = (llm_cpu *)be->ctx;
    llm_cpu_free_kv(c);
    free(c->view_layers); free(c->tiles);
    llm_sampler_free(c->sampler); free(c->scratch); free(c->seq_of); free(c);
    free(be);
}

/* K/V in f16, f32, q8_0 or q4_0 from now on (before alloc_kv); none but f32 on the exact path, which rounds
 * nothing */
static int llm_cpu_set_kv_dtype(llm_backend *be, int dtype, char *err) {
    llm_cpu *c = (llm_cpu *)be->ctx;
    int quant = dtype == LLM_KV_Q8_0 || dtype == LLM_KV_Q4_0;
    if ((dtype == LLM_KV_F16 || quant) && c->path == LLM_PATH_EXACT)
        return llm_fail(err, "the exact CPU path keeps K/V in f32: it rounds nothing");
    c->kv_half = dtype == LLM_KV_F16;
    c->kv_quant = dtype == LLM_KV_Q8_0 ? LLM_Q8_0 : dtype == LLM_KV_Q4_0 ? LLM_Q4_0 : 0;
    be->kv_head_bytes = (int)llm_cpu_kv_head_bytes(c);
    return 0;
}

/* A binary built for one CPU (-march=native) and run on another that lacks a feature the compiler was told
 * of dies of an illegal instruction in its first product, or anywhere the compiler vectorized a loop. The CPU
 * backend asks the CPU first (GCC's and Clang's __builtin_cpu_supports, which takes only a literal: hence the
 * calls one by one) and refuses to start, naming what is missing. has is that question (a test's stand-in
 * too; on 64-bit ARM Linux the kernel's hwcaps, for the dot product instructions); NULL when the CPU has
 * everything the build needs */
static int llm_cpu_supports(const char *feature) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LLM_CPU_FEATURE(name) if (!strcmp(feature, name)) return __builtin_cpu_supports(name);
    LLM_CPU_FEATURE("avx2") LLM_CPU_FEATURE("fma") LLM_CPU_FEATURE("bmi2") LLM_CPU_FEATURE("avx512f")
    LLM_CPU_FEATURE("avx512vl") LLM_CPU_FEATURE("avx512bw") LLM_CPU_FEATURE("avx512dq")
    LLM_CPU_FEATURE("avx512vnni")
#if !defined(__clang__) /* Clang's (14) does not know f16c; every CPU with AVX2 and FMA has it */
    LLM_CPU_FEATURE("f16c")
#endif
#undef LLM_CPU_FEATURE
#elif defined(__aarch64__) && defined(__linux__)
    if (!strcmp(feature, "asimddp")) return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
    (void)feature;
    return 0;
}
/* what this build was compiled for, which a CPU must have */
static const char *const llm_cpu_built_for[] = {
#if defined(__x86_64__)
#ifdef __AVX2__
    "avx2",
#endif
#ifdef __FMA__
    "fma",
#endif
#if defined(__F16C__) && !defined(__clang__)
    "f16c",
#endif
#ifdef __BMI2__
    "bmi2",
#endif
#ifdef __AVX512F__
    "avx512f",
#endif
#ifdef __AVX512VL__
    "avx512vl",
#endif
#ifdef __AVX512BW__
    "avx512bw",
#endif
#ifdef __AVX512DQ__
    "avx512dq",
#endif
#ifdef __AVX512VNNI__
    "avx512vnni",
#endif
#elif defined(__aarch64__) && defined(__linux__) && defined(__ARM_FEATURE_DOTPROD)
    "asimddp",
#endif
    NULL};
static const char *llm_cpu_missing_feature(const char *const *built_for, int (*has)(const char *feature)) {
    for (int i = 0; built_for[i]; i++)
        if (!has(built_for[i])) return built_for[i];
    return NULL;
}

/* How far ahead of the matrix products, in bytes, section 14's kernels ask for the weight rows from memory
 * ([0] quantized rows, [1] f16/bf16 ones: 2 to 4 times the bytes per value), into L1 and, further, into L2.
 * A decode step reads every weight once, in one run: the CPU's own prefetchers should have each line in
 * cache before a load asks for it, but run too little ahead on some machines. How far is best was measured
 * per CPU, decode on one thread (tools/decode_bandwidth.c: the products' GB/s against a plain loop's over
 * the same bytes, which is itself bound by the misses one core keeps in flight):
 * - a virtualized Sapphire Rapids: 2 kB into L1 for quantized rows (SmolLM2 Q4_K_M's products per token
 *   21.3 ms without, 11.4 with 2 kB, 14.9 with 1 kB; 4 kB as 2), 4 kB for f16 (1.03 to 1.05 times 2 kB's
 *   speed); and 4 times as far into L2 (prefetcht1), whose queue holds more lines than L1's: q8_0's products
 *   70-85% of the plain loop -> 97-101% (Gemma 3 270M's 262k-row output layer included), q4_1's 71 -> 73%,
 *   f16's 89 -> 90-92%; decode tok/s (SmolLM2 Q8_0, Gemma 3 270M Q4_K_M) 1.3 times; L2 alone 2 kB further
 *   or 4 kB into L1 alone did less;
 * - a virtualized AMD EPYC (family 26, Zen 5): 8 kB for both (Q8_0 decode 1.14 to 1.17 times 2 kB's tok/s,
 *   16 kB 1.12; F16 1.18 times 4 kB's, 16 kB 0.98, 2 kB 0.77; q4_0 to q5_1 and the k-quants alike with
 *   any: their products are bound by the instructions, not the memory); the L2 prefetch asks for the same
 *   line (not measured there yet).
 * The first for Intel's and every other CPU, the second for AMD's. Set when a CPU backend is created (each
 * time to the same values: atomic stores, so that backends made on two threads are no data race) */
static int llm_prefetch_ahead[2][2] = {{2048, 8192}, {4096, 16384}}; /* [quantized, f16/bf16][to L1, to L2] */
static void llm_prefetch_choose(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    int amd = __builtin_cpu_is("amd");
    for (int level = 0; level < 2; level++) {
        __atomic_store_n(&llm_prefetch_ahead[0][level], amd ? 8192 : level ? 8192 : 2048, __ATOMIC_RELAXED);
        __atomic_store_n(&llm_prefetch_ahead[1][level], amd ? 8192 : level ? 16384 : 4096, __ATOMIC_RELAXED);
    }
#endif
}
/* The products' own prefetches (section 14's kernels, and tools/decode_bandwidth.c's loop that measures
 * them): the line p + ahead[0] into L1, p + ahead[1] into L2, the distances of a kind of row (0 quantized,
 * 1 f16/bf16) read once per call */
static inline void llm_prefetch(const void *p, const int ahead[2]) {
    __builtin_prefetch((const char *)p + ahead[0]);       /* to L1 */
    __builtin_prefetch((const char *)p + ahead[1], 0, 2); /* to L2 */
}
static inline void llm_prefetch_load(int kind, int ahead[2]) {
    for (int level = 0; level < 2; level++)
        ahead[level] = __atomic_load_n(&llm_prefetch_ahead[kind][level], __ATOMIC_RELAXED);
}

#ifdef LLM_CPU_SIMD
/* Memory for the decode tiles, in 2 MB pages where the kernel has them (NULL if none is left). Linux gives
 * anonymous memory transparent huge pages only where asked in its common "madvise" mode, else 4 kB pages
 * from anywhere, while a model file's page cache comes in large folios (runs of contiguous pages, a few
 * mapped 2 MB at a time): in 4 kB pages the tiles read 8-25% slower than the file's rows, in 2 MB pages as
 * fast or faster (a plain read loop, one thread of a Sapphire Rapids VM) */
static void *llm_alloc_huge(size_t bytes) {
    size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (posix_memalign(&p, huge, (bytes + huge - 1) / huge * huge) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* before the first touch; a kernel without them: 4 kB pages */
#endif
    return p;
}
#endif

/* The model as the CPU backend's forward pass reads it (c->model): model's struct, copied with its layers
 * when the backend starts (the model is not changed: another backend may read it), where every layer's q4_0,
 * q4_1, q5_0, q5_1, q8_0, q4_K, q5_K and q6_K matrix (of rows in eights) and the output layer are given their
 * rows again in decode tiles (section 14), in memory, which steps of up to LLM_TILES_MAX_TOKENS tokens read;
 * a longer one packs its rows from them (llm_pack_tiles). The experts' matrices of a mixture stay rows (a
 * step reads slices of them). */
static int llm_cpu_make_tiles(llm_cpu *c, const llm_model *m, char *err) {
    c->view = *m;
    c->model = &c->view;
#ifdef LLM_CPU_SIMD
    if (c->path == LLM_PATH_EXACT) return 0;
    static const size_t tiled[] = {offsetof(llm_layer, wq), offsetof(llm_layer, wk), offsetof(llm_layer, wv),
                                   offsetof(llm_layer, wo), offsetof(llm_layer, w_gate),
                                   offsetof(llm_layer, w_up), offsetof(llm_layer, w_down),
                                   offsetof(llm_layer, shared_gate), offsetof(llm_layer, shared_up),
                                   offsetof(llm_layer, shared_down)};
    int n_layers = m->cfg.n_layers, n_tiled = (int)(sizeof tiled / sizeof tiled[0]);
    if (!(c->view_layers = (llm_layer *)calloc(n_layers ? (size_t)n_layers : 1, sizeof(llm_layer))))
        return llm_fail(err, "out of memory");
    memcpy(c->view_layers, m->layers, (size_t)n_layers * sizeof(llm_layer));
    c->view.layers = c->view_layers;
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) { /* the bytes, then the tiles */
        size_t at = 0;
        for (int k = 0; k <= n_layers * n_tiled; k++) { /* the last: the output layer */
            llm_weight *w = k == n_layers * n_tiled ? &c->view.output
                          : (llm_weight *)((char *)&c->view_layers[k / n_tiled] + tiled[k % n_tiled]);
            if (!w->data || !llm_tiles_type(w->type) || w->rows % LLM_TILE_ROWS) continue;
            size_t row_bytes = llm_dtype_row_bytes(w->type, w->cols), bytes = (size_t)w->rows * row_bytes;
            if (pass) {
                /* the rows in the mapped file, which this backend reads no more, leave the process's memory
                 * as they are copied: their whole pages given back (the kernel maps them again from the file
                 * if anything reads them, as another backend on the model may), 8 MB of rows at a time, so
                 * that the tiles do not double the weights, not even for a while (Gemma 3 270M's output
                 * layer, 178 MB: a peak RSS of 446 MB when it was given back whole, 280 in slices) */
                uint8_t *rows = (uint8_t *)w->data; /* only read (into_tiles) */
                int mapped = m->gguf.mapped && rows >= m->gguf.base &&
                             rows + bytes <= m->gguf.base + m->gguf.size;
                uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = (uintptr_t)rows;
                uintptr_t given = (start + page - 1) / page * page; /* the pages before are given back */
                int64_t slice = (int64_t)((8u << 20) / row_bytes) / LLM_TILE_ROWS * LLM_TILE_ROWS;
                if (slice < LLM_TILE_ROWS) slice = LLM_TILE_ROWS;
                for (int64_t r0 = 0; r0 < w->rows; r0 += slice) {
                    int64_t r1 = r0 + slice < w->rows ? r0 + slice : w->rows;
                    #pragma omp parallel for schedule(static)
                    for (int64_t r = r0; r < r1; r += LLM_TILE_ROWS)
                        llm_tiles_copy(w->type, rows + (size_t)r * row_bytes,
                                       c->tiles + at + (size_t)r * row_bytes, LLM_TILE_ROWS, w->cols, 1);
                    uintptr_t end = (start + (size_t)r1 * row_bytes) / page * page;
                    if (mapped && end > given) {
                        madvise((void *)given, end - given, MADV_DONTNEED);
                        given = end;
                    }
                }
                w->tiles = c->tiles + at;
            }
            at += (bytes + 63) / 64 * 64;
        }
        total = at;
        if (!pass && total && !(c->tiles = (uint8_t *)llm_alloc_huge(total)))
            return llm_fail(err, "out of memory for the decode tiles (%zu bytes)", total);
        if (!total) break;
    }
#else
    (void)err;
#endif
    return 0;
}

/* A CPU backend on path (enum llm_cpu_path) over the model, which it reads in place and must outlive it (its
 * struct copied as the backend starts: llm_cpu_make_tiles). The KV cache holds f16 but on the exact path
 * (set_kv_dtype may say otherwise before alloc_kv); free_memory is the RAM free now; the threads are
 * OpenMP's (OMP_NUM_THREADS, else as many as the cores, fewer while other processes run:
 * llm_cpu_threads_for_load). NULL with the reason when out of memory. */
/* ---- A distribution build: the CPU backend in variants, the CPU's best picked when it starts ---------- */
/* -march=native fits a binary to the CPU it was built on. A binary shipped to many (a package, a container
 * image) carries several builds of the CPU backend instead, as llama.cpp's GGML_CPU_ALL_VARIANTS does:
 * make llm-dist compiles this file once more for each variant (LLM_CPU_VARIANT=avx512vnni, avx512, avx2,
 * each with its -march flags), keeps only the variant's llm_cpu_variant_NAME global in each object (objcopy
 * makes the rest local: a whole copy of the library, of which the CPU backend alone is used), and builds the
 * program for any x86-64 with LLM_CPU_DISPATCH: its CPU backends start the first variant, best first, whose
 * features the CPU has, or the one the environment's LLM_CPU_VARIANT names, or the program's own plain C when
 * none fits. The model, the batch and the backend are the same structs in every copy of the header. */
typedef struct {
    const char *name;
    const char *const *built_for; /* the features the variant was compiled for, a CPU must have */
    llm_backend *(*create)(const llm_model *m, int path, char *err);
} llm_cpu_variant;

/* Which of variants (best first, NULL-ended) to start on a CPU that has what has says: the one named by
 * wanted (when not NULL or ""), else the first the CPU can run. Returns its index; -1 when none fits (the
 * caller's own build then runs); -2 with the reason when wanted is unknown or needs what the CPU lacks. */
static __attribute__((unused)) int llm_cpu_pick_variant(const llm_cpu_variant *const *variants,
                                                        const char *wanted, int (*has)(const char *feature),
                                                        char *err) {
    char names[128] = "";
    for (int i = 0; variants[i]; i++) {
        if (wanted && wanted[0] && strcmp(wanted, variants[i]->name)) {
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     variants[i]->name);
            continue;
        }
        const char *missing = llm_cpu_missing_feature(variants[i]->built_for, has);
        if (!missing) return i;
        if (wanted && wanted[0]) {
            llm_fail(err, "LLM_CPU_VARIANT=%s needs a CPU with %s, which this one lacks", wanted, missing);
            return -2;
        }
    }
    if (wanted && wanted[0]) {
        llm_fail(err, "LLM_CPU_VARIANT=%s is none of this build's CPU variants (%s)", wanted, names);
        return -2;
    }
    return -1;
}

#ifdef LLM_CPU_DISPATCH
extern const llm_cpu_variant llm_cpu_variant_avx512vnni, llm_cpu_variant_avx512, llm_cpu_variant_avx2;
static const llm_cpu_variant *const llm_cpu_variants[] = {
    &llm_cpu_variant_avx512vnni, &llm_cpu_variant_avx512, &llm_cpu_variant_avx2, NULL};
#endif
#define LLM_STRING(x) LLM_STRING_OF(x)
#define LLM_STRING_OF(x) #x

static llm_backend *llm_cpu_backend_new(const llm_model *m, int path, char *err) {
#ifdef LLM_CPU_DISPATCH
    int variant = llm_cpu_pick_variant(llm_cpu_variants, getenv("LLM_CPU_VARIANT"), llm_cpu_supports, err);
    if (variant == -2) return NULL;
    if (variant >= 0) return llm_cpu_variants[variant]->create(m, path, err);
#endif
    const char *missing = llm_cpu_missing_feature(llm_cpu_built_for, llm_cpu_supports);
    if (missing) {
        llm_fail(err, "this build needs a CPU with %s, which this one lacks: build it on this machine "
                      "(make), or for any x86-64 CPU (make ARCH=)", missing);
        return NULL;
    }
    llm_prefetch_choose();
    llm_backend *be = (llm_backend *)calloc(1, sizeof *be);
    llm_cpu *c = (llm_cpu *)calloc(1, sizeof *c);
    if (!be || !c) { free(be); free(c); llm_fail(err, "out of memory"); return NULL; }
    c->path = path;
    if (llm_cpu_make_tiles(c, m, err) != 0) { free(c->view_layers); free(be); free(c); return NULL; }
    c->kv_half = path != LLM_PATH_EXACT; /* f16 by default, as llama.cpp's cache: half the memory */
#ifdef _OPENMP
    c->max_threads = omp_get_max_threads();
    c->adapt_threads = !getenv("OMP_NUM_THREADS");
#else
    c->max_threads = 1;
#endif
    be->name = path == LLM_PATH_EXACT ? "cpu-exact" : path == LLM_PATH_ACT8 ? "cpu-int8" : "cpu"; be->ctx = c;
#if defined(LLM_CPU_VARIANT)
    be->kernels = LLM_STRING(LLM_CPU_VARIANT);
#elif defined(LLM_AVX512VNNI) && defined(LLM_AVX512BW)
    be->kernels = "avx512vnni";
#elif defined(LLM_AVX512F)
    be->kernels = "avx512";
#elif defined(LLM_AVX2)
    be->kernels = "avx2";
#elif defined(LLM_NEON_DOT)
    be->kernels = "neon";
#else
    be->kernels = "plain C";
#endif
    be->kv_head_bytes = (int)llm_cpu_kv_head_bytes(c);
    be->set_kv_dtype = llm_cpu_set_kv_dtype;
    long pages = sysconf(_SC_AVPHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    be->free_memory = pages > 0 && page_size > 0 ? (size_t)pages * (size_t)page_size : 0;
    be->default_kv_fraction = 0; /* vLLM's CPU backend sizes its KV cache by the workload, not the RAM */
    be->alloc_kv = llm_cpu_alloc_kv; be->forward = llm_cpu_forward; be->sample = llm_cpu_sample;
    be->destroy = llm_cpu_destroy; be->has_hidden = 1;
    return be;
}

/* The three CPU backends, by path: "cpu" (16-bit activations, the default), "cpu-exact" (the reference),
 * "cpu-int8" (8-bit activations, llama.cpp's rounding) */
llm_backend *llm_cpu_backend_create(const llm_model *m, char *err) {
    return llm_cpu_backend_new(m, LLM_PATH_ACT16, err);
}
llm_backend *llm_cpu_exact_backend_create(const llm_model *m, char *err) {
    return llm_cpu_backend_new(m, LLM_PATH_EXACT, err);
}
llm_backend *llm_cpu_int8_backend_create(const llm_model *m, char *err) {
    return llm_cpu_backend_new(m, LLM_PATH_ACT8, err);
}
#ifdef LLM_CPU_VARIANT /* this copy is the variant LLM_CPU_VARIANT of a distribution build: its one global */
#define LLM_CPU_VARIANT_SYMBOL(v) LLM_CPU_VARIANT_JOIN(llm_cpu_variant_, v)
#define LLM_CPU_VARIANT_JOIN(a, b) a##b
extern const llm_cpu_variant LLM_CPU_VARIANT_SYMBOL(LLM_CPU_VARIANT);
const llm_cpu_variant LLM_CPU_VARIANT_SYMBOL(LLM_CPU_VARIANT) = {LLM_STRING(LLM_CPU_VARIANT),
                                                                  llm_cpu_built_for, llm_cpu_backend_new};
#endif

/* ===========================================================================================================
 * 8. Sampler
 * The order is vLLM's: the request's own changes to the row (allowed ids, logit_bias, bad words, min_tokens:
 * its logits processors), penalties, then temperature, then top-k, top-p and min-p keep a head of the
 * distribution, renormalised, and one uniform draw picks from it. The logits are only read; what changes is
 * copied into the sampler's scratch. A backend's sample step is llm_sampler_sample_rows where the rows are
 * on the host (the CPU's), and the engine's for the rows it reads itself.
 *
 * One row's way (llm_sampler_draw), each stage a function:
 *
 *   the model's row of logits (read only) ---> logprobs: log-softmax of this row as it is
 *     |                                         (llm_sample_row_logprobs; as vLLM's by default)
 *     v
 *   llm_sampler_adjust    allowed ids, logit_bias, bad words; under min_tokens the stop ids and the ends of
 *     |                   generation masked (-inf)                                     -> a copy, `adjusted`
 *   llm_sampler_penalize  repetition (prompt and output tokens), presence and frequency (output tokens)
 *     |                                                                                -> a copy, `penalized`
 *   llm_sampler_pick      greedy (temperature < 1e-5, or top_k 1): the argmax, no draw. Else
 *                         llm_sampler_candidates: weights exp((x - max) / T), then top-k, top-p, min-p keep
 *                         a head of them, renormalised; and one uniform u in [0, 1) from the sequence's
 *                         generator picks the first candidate whose cumulative probability passes u.
 *
 * vLLM's V1 sampler applies min-p right after the temperature, before top-k and top-p (so its top-p
 * measures mass among min-p's survivors); here min-p comes last, as in vLLM's V0 sampler, and with both
 * top_p and min_p set the head kept can be longer than V1's. vLLM draws by an exponential race (probs / q,
 * q ~ Exp(1), the argmax), not by the inverse of the cumulative distribution: the same distribution, other
 * tokens for a seed.
 *
 * Seeds: each sequence has a generator of its own, splitmix64 seeded from the request's seed and the sample's
 * index (llm_seed_mix, section 5), and a draw takes exactly one number from it (a greedy one: none). So a
 * seeded request draws the same tokens from the same logits whatever else is in the batch, whichever thread
 * samples its row, and after a preemption; and speculative decoding can give the row of a proposal's token
 * j the state that j draws leave (llm_sampling_rng_after) and draw all the rows at once. vLLM keeps a
 * torch.Generator for each seeded request, and the others share the global one. The sums that normalise are
 * made in double in a fixed order (llm_sampler_weights), so a seed picks the same token in every build, with
 * or without SIMD.
 * ======================================================================================================== */
/* A candidate token while the head is chosen: its weight (exp((x - max) / T), not yet divided by the sum)
 * and its id */
typedef struct { float p; int32_t id; } llm_prob_id;
#define LLM_SAMPLING_EPS 1e-5f /* temperatures below it are greedy (vLLM's _SAMPLING_EPS): 1 / T overflows */

/* Greedy sampling: the argmax (temperature 0, or top-k 1) */
static int llm_sampling_is_greedy(const llm_sampling_params *p) {
    return p->temperature < LLM_SAMPLING_EPS || p->top_k == 1;
}

/* Penalties, which read the tokens so far */
static int llm_sampling_has_penalties(const llm_sampling_params *p) {
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

/* The generator's state after n draws of p's sampling from state: one number a draw (greedy: none). A
 * speculative proposal's rows are drawn at once, each as if the ones before it had been. */
static uint64_t llm_sampling_rng_after(const llm_sampling_params *p, uint64_t state, int n) {
    for (int i = 0; i < n && !llm_sampling_is_greedy(p); i++) llm_splitmix64(&state);
    return state;
}

/* The request changes its row of logits before sampling: allowed ids, logit_bias, bad words */
static int llm_sampling_adjusts_row(const llm_sampling_params *p) {
    return p->n_logit_bias || p->n_allowed_token_ids || p->n_bad_words;
}

/* Too early to stop: fewer than min_tokens tokens out, so the row is sampled without the stop tokens */
static int llm_sample_row_too_early(const llm_sample_row *r) {
    return r->n_history - r->n_prompt < r->params->min_tokens;
}

/* The token a thinking budget forces next, or -1: with think_budget tokens of thinking out and no
 * think_end_ids in a row among them, the end's ids one after another (the k-th token past the budget is the
 * end's k-th: the ones before it were forced). The thinking starts at the output's start, or past
 * think_start_ids where they open it (looked for in its first few tokens: a block opens a reply, and the
 * look stays short every step). The scan of the budget's tokens runs in those few steps only. */
static int32_t llm_sample_row_forced(const llm_sample_row *r) {
    const llm_sampling_params *p = r->params;
    const int32_t *out = r->history + r->n_prompt;
    int n = p->n_think_end_ids, n_out = r->n_history - r->n_prompt, start = 0, m = p->n_think_start_ids;
    if (p->think_budget <= 0 || r->score) return -1;
    if (m) { /* the reply opens its think block itself: where it does, if it does */
        start = -1;
        for (int i = 0; start < 0 && i <= LLM_THINK_OPENS_WITHIN && i + m <= n_out; i++)
            if (!memcmp(out + i, p->think_start_ids, (size_t)m * sizeof(int32_t))) start = i + m;
        if (start < 0) return -1;
    }
    int k = n_out - start - p->think_budget;
    if (k < 0 || k >= n) return -1;
    out += start;
    for (int i = 0; i + n <= p->think_budget; i++)
        if (!memcmp(out + i, p->think_end_ids, (size_t)n * sizeof(int32_t))) return -1; /* closed already */
    return p->think_end_ids[k];
}

/* The scratch of one thread: the rows it changes are copies here (the model's logits stay as they are, for
 * logprobs and the other samples of the row), each [n_vocab], made once. Not shared between threads: the
 * sample step gives each thread its own (helpers). */
struct llm_sampler {
    int n_vocab;
    float *penalized;               /* [n_vocab] the logits with penalties applied */
    int *count;                     /* [n_vocab] occurrences of each token in the output */
    unsigned char *seen;            /* [n_vocab] 1 for tokens of the prompt or the output */
    float *adjusted;                /* [n_vocab] a row as its request samples from it (llm_sampler_adjust) */
    llm_prob_id *cand;              /* [n_vocab] candidates while they are filtered */
    int32_t *ids;                   /* [n_vocab] the candidates that are left ... */
    float *probs;                   /* [n_vocab] ... and their probabilities */
    struct llm_sampler **helpers;   /* stb_ds: the scratch of the other threads of llm_sampler_sample_rows */
};

llm_sampler *llm_sampler_create(int n_vocab, char *err) {
    llm_sampler *s = (llm_sampler *)calloc(1, sizeof *s);
    if (s && n_vocab > 0) {
        size_t n = (size_t)n_vocab;
        s->n_vocab = n_vocab;
        s->penalized = (float *)malloc(n * sizeof(float)); s->count = (int *)malloc(n * sizeof(int));
        s->seen = (unsigned char *)malloc(n); s->cand = (llm_prob_id *)malloc(n * sizeof(llm_prob_id));
        s->ids = (int32_t *)malloc(n * sizeof(int32_t)); s->probs = (float *)malloc(n * sizeof(float));
        s->adjusted = (float *)malloc(n * sizeof(float));
        if (s->penalized && s->count && s->seen && s->cand && s->ids && s->probs && s->adjusted) return s;
    }
    llm_sampler_free(s);
    llm_fail(err, n_vocab > 0 ? "out of memory for the sampler" : "the sampler needs a vocabulary");
    return NULL;
}

void llm_sampler_free(llm_sampler *s) {
    if (!s) return;
    free(s->penalized); free(s->count); free(s->seen); free(s->cand); free(s->ids); free(s->probs);
    free(s->adjusted);
    for (ptrdiff_t i = 0; i < arrlen(s->helpers); i++) llm_sampler_free(s->helpers[i]);
    arrfree(s->helpers); free(s);
}

/* vLLM's definitions: the repetition penalty divides a positive logit (multiplies a negative one) of every
 * token seen in the prompt or the output; presence and frequency penalties subtract, for tokens of the
 * output, once and once per occurrence. The whole history counts (no window of the last n tokens); ids in it
 * outside the vocabulary are skipped. Two passes: count the history into seen/count, then change the copy. */
const float *llm_sampler_penalize(llm_sampler *s, const llm_sampling_params *p, const float *logits,
                                  const int32_t *history, int n_prompt, int n_history) {
    if (!llm_sampling_has_penalties(p)) return logits;
    int V = s->n_vocab;
    memset(s->count, 0, (size_t)V * sizeof(int));
    memset(s->seen, 0, (size_t)V);
    for (int i = 0; i < n_history; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= V) continue;
        s->seen[t] = 1;
        if (i >= n_prompt) s->count[t]++;
    }
    float *x = s->penalized;
    memcpy(x, logits, (size_t)V * sizeof(float));
    for (int t = 0; t < V; t++) {
        if (s->seen[t] && p->repetition_penalty != 1.0f)
            x[t] = x[t] > 0 ? x[t] / p->repetition_penalty : x[t] * p->repetition_penalty;
        if (s->count[t]) x[t] -= p->presence_penalty + p->frequency_penalty * (float)s->count[t];
        if (x[t] > FLT_MAX) x[t] = FLT_MAX; /* a tiny repetition penalty must not make a logit infinite */
    }
    return x;
}

static int llm_prob_desc(const void *a, const void *b) {
    const llm_prob_id *x = (const llm_prob_id *)a, *y = (const llm_prob_id *)b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;  /* ties in id order, so that a seed always gives the same choice */
}

/* The k most likely of c[0..n) moved to c[0..k) (in no order): c[0..k) is kept as a heap whose root is the
 * least of them, so each other candidate costs one comparison with it as a rule. The order is
 * llm_prob_desc's, ties and all, so these are the first k of a full sort, at a fraction of its cost (a sort
 * of 150k candidates takes ~10 ms, every step). */
static void llm_prob_sift(llm_prob_id *c, int k, int i) {
    for (;;) { /* the heap's order: a parent after its children in llm_prob_desc's order */
        int least = i, l = 2 * i + 1, r = l + 1;
        if (l < k && llm_prob_desc(&c[l], &c[least]) > 0) least = l;
        if (r < k && llm_prob_desc(&c[r], &c[least]) > 0) least = r;
        if (least == i) return;
        llm_prob_id t = c[i]; c[i] = c[least]; c[least] = t;
        i = least;
    }
}
/* (The heap of the first k is built bottom up; then a candidate that beats its root takes the root's place
 * and sinks to where it belongs.) */
static void llm_prob_top_k(llm_prob_id *c, int n, int k) {
    for (int i = k / 2 - 1; i >= 0; i--) llm_prob_sift(c, k, i);
    for (int i = k; i < n; i++)
        if (llm_prob_desc(&c[i], &c[0]) < 0) { c[0] = c[i]; llm_prob_sift(c, k, 0); }
}

/* w[i] = exp((x[i] - mx) inv_t), a NaN (-inf minus -inf, or a logit not a number) weighing 0, and their sum
 * (w NULL: the sum alone).
 * The sum is kept in 8 partial sums in double, whether SIMD adds them 8 at a time or plain C one at a time,
 * and llm_exp_avx2 is libm's expf bit for bit: so a seed picks the same token in every build. (One scalar
 * expf and one add a token, each waiting on the last, took 100 of a sampled SmolLM2 row's 190 us.) */
#ifdef LLM_CPU_SIMD
/* Section 14's: the weights' first n / 8 * 8 values and their 8 partial sums, and the division by the sum,
 * in vectors; each returns how many values it did */
static inline __attribute__((always_inline)) int llm_sampler_weights_avx2(const float *x, int n, float mx,
                                                                          float inv_t, float *w,
                                                                          double part[8]);
static inline __attribute__((always_inline)) int llm_sampler_normalize_avx2(float *w, int n, double sum);
#endif
static double llm_sampler_weights(const float *x, int n, float mx, float inv_t, float *w) {
    double part[8] = {0};
    int i = 0;
#ifdef LLM_CPU_SIMD
    i = llm_sampler_weights_avx2(x, n, mx, inv_t, w, part);
#endif
    for (; i < n; i += 8)
        for (int j = 0; j < 8 && i + j < n; j++) {
            float e = expf((x[i + j] - mx) * inv_t);
            e = e >= 0.0f ? e : 0.0f;
            if (w) w[i + j] = e;
            part[j] += e;
        }
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/* w[i] = w[i] / sum, divided in double (exact before the one rounding to float, in any build) */
static void llm_sampler_normalize(float *w, int n, double sum) {
    int i = 0;
#ifdef LLM_CPU_SIMD
    i = llm_sampler_normalize_avx2(w, n, sum);
#endif
    for (; i < n; i++) w[i] = (float)(w[i] / sum);
}

/* The head of the distribution a draw picks from (see the declaration). Each filter keeps a head of the
 * tokens in llm_prob_desc's order, so they compose: top-k the k first, top-p the shortest head whose mass
 * (among those top-k left) reaches top_p, min-p those whose weight is at least min_p times the largest. The
 * work is kept off the whole vocabulary where it can be: a heap for top-k, a floor before the sort for top-p,
 * no sort at all when no filter is on (then the ids come in id order, not most likely first). 0 when the
 * weights sum to no positive number (every logit -inf or NaN). */
int llm_sampler_candidates(llm_sampler *s, const llm_sampling_params *p, const float *logits, int V,
                           const int32_t **ids, const float **probs) {
    llm_prob_id *c = s->cand;
    *ids = s->ids; *probs = s->probs;
    if (llm_sampling_is_greedy(p)) {
        s->ids[0] = llm_argmax(logits, V); s->probs[0] = 1.0f;
        return 1;
    }
    /* weights exp((logit - max) / T): the most likely token weighs 1; a masked token (-inf) weighs 0 */
    int finite;
    float mx = llm_row_max(logits, V, &finite);
    double sum = llm_sampler_weights(logits, V, mx, 1.0f / p->temperature, s->probs);
    if (!(sum > 0)) return 0;
    int n = V, top_k_on = p->top_k > 0 && p->top_k < V;
    if (!top_k_on && p->top_p >= 1.0f && p->min_p <= 0.0f) { /* every token a candidate: no sort, no copy */
        for (int i = 0; i < V; i++) s->ids[i] = i;
        llm_sampler_normalize(s->probs, V, sum);
        return V;
    }
    for (int i = 0; i < V; i++) { c[i].id = i; c[i].p = s->probs[i]; }
    if (p->top_p < 1.0f && !top_k_on) {
        /* the head that top_p keeps never reaches a token whose weight is under (1 - top_p) / V of the total:
         * all such tokens together weigh less than 1 - top_p. Drop them before the sort (most of a vocabulary
         * of 150k, every step). */
        double floor_w = (1.0 - p->top_p) * sum / V;
        int kept = 0;
        for (int i = 0; i < n; i++) if (c[i].p >= floor_w) c[kept++] = c[i];
        n = kept;
    }
    /* top-k: the k heaviest to the front, then sorted (only k of them); top-p alone sorts what the floor
     * left */
    if (top_k_on) llm_prob_top_k(c, n, p->top_k);
    if (top_k_on || p->top_p < 1.0f) qsort(c, (size_t)(top_k_on ? p->top_k : n), sizeof *c, llm_prob_desc);
    if (top_k_on) {
        n = p->top_k; sum = 0;
        for (int i = 0; i < n; i++) sum += c[i].p;
    }
    if (p->top_p < 1.0f) { /* the smallest head of the distribution whose mass reaches top_p */
        double cum = 0; int keep = n;
        for (int i = 0; i < n; i++) { cum += c[i].p / sum; if (cum >= p->top_p) { keep = i + 1; break; } }
        n = keep; sum = 0;
        for (int i = 0; i < n; i++) sum += c[i].p;
    }
    if (p->min_p > 0.0f) { /* relative to the most likely token, whose weight is 1 */
        int keep = 0; double kept_sum = 0;
        for (int i = 0; i < n; i++) if (c[i].p >= p->min_p) { c[keep++] = c[i]; kept_sum += c[i].p; }
        n = keep; sum = kept_sum;
    }
    /* what is left, renormalised: its weights over their own sum, most likely first */
    for (int i = 0; i < n; i++) { s->ids[i] = c[i].id; s->probs[i] = (float)(c[i].p / sum); }
    return n;
}

/* One draw from n logits with penalties applied: a position in x, -1 when none can be picked. The inverse
 * of the cumulative distribution: u uniform in [0, 1) (24 bits), the first candidate whose running sum of
 * probabilities passes it. Greedy rows take the argmax and leave the generator alone. */
static int32_t llm_sampler_pick(llm_sampler *s, const llm_sampling_params *p, const float *x, int n_x,
                                uint64_t *rng_state) {
    if (llm_sampling_is_greedy(p)) return llm_argmax(x, n_x);
    const int32_t *ids; const float *probs;
    int n = llm_sampler_candidates(s, p, x, n_x, &ids, &probs);
    if (n <= 0) return -1;
    float u = llm_rand_uniform(rng_state), cum = 0;
    for (int i = 0; i < n; i++) { cum += probs[i]; if (u < cum) return ids[i]; }
    return ids[n - 1]; /* u beyond the rounded sum of the probabilities */
}

/* Penalties, then the pick (the row adjusted already, when the request adjusts it: llm_sampler_draw) */
int32_t llm_sampler_sample(llm_sampler *s, const llm_sampling_params *p, const float *logits,
                           const int32_t *history, int n_prompt, int n_history, uint64_t *rng_state) {
    const float *x = llm_sampler_penalize(s, p, logits, history, n_prompt, n_history);
    return llm_sampler_pick(s, p, x, s->n_vocab, rng_state);
}

/* The log-probabilities that logprobs reports: from the model's own distribution, before penalties and
 * temperature (as vLLM). Writes the k most likely tokens and theirs, and returns log(sum exp(logits)). */
static float llm_logprobs_top(const float *logits, int n, int k, int32_t *top_ids, float *top_logprobs) {
    int finite;
    float mx = llm_row_max(logits, n, &finite);
    double sum = llm_sampler_weights(logits, n, mx, 1.0f, NULL);
    float lse = mx + (float)log(sum);
    int have = 0;
    for (int i = 0; i < n && k > 0; i++) { /* insertion into a sorted list of k: k is small */
        if (have == k) { /* the list is full: runs of 16 whose largest would not enter are passed at once */
            float least = logits[top_ids[k - 1]];
            while (i + 16 <= n && llm_max(logits + i, 16, least) == least) i += 16;
            if (i >= n) break;
            if (logits[i] <= least) continue;
        }
        int j = have < k ? have++ : k - 1;
        while (j > 0 && logits[top_ids[j - 1]] < logits[i]) { top_ids[j] = top_ids[j - 1]; j--; }
        top_ids[j] = i;
    }
    for (int j = 0; j < k; j++) top_logprobs[j] = logits[top_ids[j]] - lse;
    return lse;
}

/* vLLM's logits processors, on a copy of the row: only the allowed ids, the bias, the bad words, and under
 * min_tokens what would stop the text. The ids of the allowed list, the biases and the bad words are trusted
 * here: llm_engine_add_request checks them against the vocabulary (stop ids are not checked there, so they
 * are here). A bad word of one token is always masked; a longer one only where the output ends with all of
 * it but its last token. */
const float *llm_sampler_adjust(llm_sampler *s, const llm_sample_row *r, const float *logits) {
    const llm_sampling_params *p = r->params;
    int V = s->n_vocab, too_early = llm_sample_row_too_early(r);
    if (!too_early && !llm_sampling_adjusts_row(p)) return logits;
    float *x = s->adjusted;
    if (!p->n_allowed_token_ids) memcpy(x, logits, (size_t)V * sizeof(float));
    else {
        for (int i = 0; i < V; i++) x[i] = -INFINITY;
        for (int i = 0; i < p->n_allowed_token_ids; i++) {
            int32_t t = p->allowed_token_ids[i];
            x[t] = logits[t];
        }
    }
    for (int i = 0; i < p->n_logit_bias; i++) x[p->logit_bias_ids[i]] += p->logit_bias[i];
    /* a bad word's last token, where the output so far ends with the rest of the word (as vLLM: the output's
     * tokens only, not the prompt's) */
    const int32_t *word = p->bad_word_ids, *out = r->history + r->n_prompt;
    int n_out = r->n_history - r->n_prompt;
    for (int i = 0; i < p->n_bad_words; word += p->bad_word_lens[i], i++) {
        int rest = p->bad_word_lens[i] - 1;
        if (rest <= n_out && !memcmp(out + n_out - rest, word, (size_t)rest * sizeof(int32_t)))
            x[word[rest]] = -INFINITY;
    }
    if (too_early) { /* too early to stop: mask what would stop it */
        for (int i = 0; i < p->n_stop_token_ids; i++)
            if (p->stop_token_ids[i] >= 0 && p->stop_token_ids[i] < V) x[p->stop_token_ids[i]] = -INFINITY;
        for (int i = 0; !p->ignore_eos && i < r->n_eog; i++) x[r->eog[i]] = -INFINITY;
    }
    return x;
}

/* The fast path's test: no score, greedy, nothing that changes the row, no logprobs to compute, so one pass
 * over the row (its argmax) is the whole draw */
int llm_sample_row_is_argmax(const llm_sample_row *r) {
    const llm_sampling_params *p = r->params;
    return !r->score && llm_sampling_is_greedy(p) && !llm_sampling_has_penalties(p) &&
           !llm_sampling_adjusts_row(p) && !llm_sample_row_too_early(r) && p->logprobs < 0 &&
           llm_sample_row_forced(r) < 0;
}

/* One row's draw in order: a scored row takes its given token; an argmax row one pass; else a row with a
 * value that is not finite fails (-1: a broken model is never sampled from), and the rest go through
 * adjust, penalties and the pick (-2 when nothing is left to pick). */
int32_t llm_sampler_draw(llm_sampler *s, llm_sample_row *r, const float *logits) {
    int V = s->n_vocab;
    if (r->score) return r->token = r->history[r->n_history]; /* no draw: the token given */
    int32_t forced = llm_sample_row_forced(r); /* a thinking budget's end: it takes a draw's number */
    if (forced >= 0 && !llm_sampling_is_greedy(r->params)) llm_splitmix64(r->rng_state);
    if (forced >= 0) return r->token = forced;
    if (llm_sample_row_is_argmax(r)) return r->token = llm_argmax_finite(logits, V); /* one pass */
    r->token = -1;
    int finite;
    llm_row_max(logits, V, &finite);
    if (!finite) return -1; /* a broken model: never sample from it */
    const float *x = llm_sampler_adjust(s, r, logits);
    int32_t token = llm_sampler_sample(s, r->params, x, r->history, r->n_prompt, r->n_history, r->rng_state);
    return r->token = token >= 0 ? token : -2;
}

/* r's logprobs from the raw row: the top k and the token's own (k: logprobs for a draw, prompt_logprobs
 * for a scored prompt token, at most the vocabulary), and for a scored token its rank (1 + the tokens with a
 * larger logit). Nothing for k < 0 or a failed draw. */
void llm_sample_row_logprobs(llm_sample_row *r, const float *logits, int n_vocab) {
    int k = r->score ? r->params->prompt_logprobs : r->params->logprobs;
    if (k > n_vocab) k = n_vocab;
    if (k < 0 || r->token < 0) return;
    float lse = llm_logprobs_top(logits, n_vocab, k, r->top_ids, r->top_logprobs);
    r->logprob = logits[r->token] - lse;
    if (!r->score) return;
    r->rank = 1;
    for (int i = 0; i < n_vocab; i++) r->rank += logits[i] > logits[r->token];
}

/* The threads take rows in turn, each with scratch of its own (the helpers, made as they are first needed;
 * without memory for one, fewer threads): a draw is a few passes over the vocabulary (SmolLM2, 64 sequences,
 * one thread: 8% of a decode step's time greedy, 14% sampled). Each row draws from its own generator
 * (r->rng_state), so which thread takes it, and when, changes no token. */
void llm_sampler_sample_rows(llm_sampler *s, llm_sample_row *rows, int n_rows, const float *logits) {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads() < n_rows ? omp_get_max_threads() : n_rows;
#endif
    while (arrlen(s->helpers) < threads - 1) {
        llm_sampler *h = llm_sampler_create(s->n_vocab, NULL);
        if (!h) break;
        arrput(s->helpers, h);
    }
    if (threads > 1 + arrlen(s->helpers)) threads = 1 + (int)arrlen(s->helpers);
    #pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1)
    for (int i = 0; i < n_rows; i++) {
        llm_sampler *t = s;
#ifdef _OPENMP
        if (omp_get_thread_num() > 0) t = s->helpers[omp_get_thread_num() - 1];
#endif
        const float *row = logits + (size_t)rows[i].row * (size_t)s->n_vocab;
        llm_sampler_draw(t, &rows[i], row);
        llm_sample_row_logprobs(&rows[i], row, s->n_vocab);
    }
}

/* ===========================================================================================================
 * 9. Detokenizer and stop conditions: token ids back to text, and where the text must stop
 * A token is a string of bytes (its piece: llm_tokenizer_piece), not of characters: a byte-level BPE may
 * split a rare character over several tokens, and SentencePiece's byte fallback gives one token a byte. So a
 * sequence's new token goes through two holding stages before its text is output:
 *
 *   token -> piece bytes -> llm_detok (pending: at most 3 bytes, the start of one character not finished)
 *         -> whole UTF-8 characters -> held_text (a tail that may begin a stop string) -> out_text
 *
 *   "e" with an acute accent as byte tokens <0xC3> <0xA9>:  push <0xC3>: 0 bytes out, C3 pending
 *                                                         push <0xA9>: C3 A9 out, nothing pending
 *   <0xC3> then "a": C3 can never begin a character followed by "a": U+FFFD, then "a"
 *
 *   stop "\n\nUser:", text "Hi!\n\nUs":  "Hi!" out, "\n\nUs" held (it begins the stop string)
 *   next token "er: ok":               held "\n\nUser: ok": the stop string found, the sequence finishes
 *                                      (finish "stop") and none of it goes out
 *
 * The invariants: every byte out is part of a whole, valid character (or a U+FFFD standing for bytes that
 * never were one), and no stop string can begin in text already out, so the search for one looks at the
 * held text only, which stays short: what was held (less than the longest stop string) and the newest
 * token's text. A sequence that finishes for another reason (an end of generation, max_tokens) lets all it
 * holds out, an unfinished character as one U+FFFD.
 *
 * vLLM's incremental detokenizer decodes a window of tokens and waits while the new text ends in U+FFFD
 * (detokenize_incrementally); here the bytes themselves wait. For stop strings vLLM's V1 holds back a fixed
 * number of characters, the longest stop string's length - 1 (when the stop string is not to be output);
 * here only the tail that could still begin one waits (in bytes), so text that begins no stop string goes
 * out at once. Entry points: llm_detok_push, llm_seq_push_text.
 * ======================================================================================================== */

/* Counts every byte, stores the first cap of them. */
static void llm_put_byte(char *buf, size_t cap, size_t *n, int byte) {
    if (*n < cap) buf[*n] = (char)byte;
    (*n)++;
}

/* The text of each kind of token, as llama.cpp gives it: control and unknown tokens only when asked for;
 * user-defined tokens as written; byte tokens as their byte; unused tokens as nothing; normal tokens with
 * U+2581 as space (SPM) or with each stand-in character back to its byte (BPE). */
int llm_tokenizer_piece(const llm_tokenizer *t, int32_t id, int special, char *buf, int cap) {
    if (!t || id < 0 || id >= t->n_vocab) return -1;
    if (!buf || cap < 0) cap = 0;
    const unsigned char *s = (const unsigned char *)t->text[id].ptr;
    size_t len = t->text[id].len, n = 0, i = 0;
    int type = t->type[id];
    if (type == LLM_TOKEN_UNUSED || ((type == LLM_TOKEN_CONTROL || type == LLM_TOKEN_UNKNOWN) && !special))
        return 0;
    if (type == LLM_TOKEN_BYTE && len == 6 && llm_hex_digit(s[3]) >= 0 && llm_hex_digit(s[4]) >= 0) {
        llm_put_byte(buf, (size_t)cap, &n, llm_hex_digit(s[3]) * 16 + llm_hex_digit(s[4]));
    } else if (type != LLM_TOKEN_NORMAL && type != LLM_TOKEN_BYTE) {
        for (; i < len; i++) llm_put_byte(buf, (size_t)cap, &n, s[i]);
    } else if (t->kind == LLM_VOCAB_SPM) {
        while (i < len) {
            int space = i + 3 <= len && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81;
            llm_put_byte(buf, (size_t)cap, &n, space ? ' ' : s[i]);
            i += space ? 3 : 1;
        }
    } else {
        while (i < len) {
            int k = llm_utf8_check(s + i, len - i);
            uint32_t c = k > 0 ? llm_utf8_decode(s + i, k) : 0xFFFFFFFF;
            size_t clen = k > 0 ? (size_t)k : 1;
            if (k > 0 && c < 324 && t->char_byte[c] >= 0) llm_put_byte(buf, (size_t)cap, &n, t->char_byte[c]);
            else for (size_t j = 0; j < clen; j++) llm_put_byte(buf, (size_t)cap, &n, s[i + j]); /* as is */
            i += clen;
        }
    }
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

/* Copies in[0..n) to out (when out is not NULL) with each broken sequence replaced by U+FFFD and the
 * incomplete character at the end, if any, left out; returns the bytes that make and sets *keep to the bytes
 * left out. */
static size_t llm_utf8_clean(const unsigned char *in, size_t n, char *out, size_t *keep) {
    size_t i = 0, m = 0;
    *keep = 0;
    while (i < n) {
        int k = llm_utf8_check(in + i, n - i);
        if (k == 0) { *keep = n - i; break; }
        if (k > 0) { if (out) memcpy(out + m, in + i, (size_t)k); m += (size_t)k; i += (size_t)k; }
        else { if (out) memcpy(out + m, "\xEF\xBF\xBD", 3); m += 3; i += (size_t)-k; }
    }
    return m;
}

/* Writes all of its output or none of it: when the output would not fit in cap bytes, it writes nothing,
 * keeps its state and returns the room needed (more than cap), so the caller can call again with that
 * much. The output is at most 3 x (held bytes + piece bytes) <= 3 x piece length + 9 (every byte could
 * turn into U+FFFD), so a buffer of 3 x the longest token + 9 always suffices. Ids outside the vocabulary
 * add nothing. */
int llm_detok_push(const llm_tokenizer *t, llm_detok *d, int32_t id, char *out, int cap) {
    if (!t || !d) return 0;
    if (!out || cap < 0) cap = 0;
    if (d->n_pending < 0 || d->n_pending > 3) d->n_pending = 0; /* never more than 3: not a state we made */
    /* 1. the piece's length, then the held bytes and the piece in one buffer (on the stack when small) */
    int n = llm_tokenizer_piece(t, id, d->special, NULL, 0);
    if (n <= 0) return 0;
    size_t total = (size_t)d->n_pending + (size_t)n, keep;
    unsigned char small[512], *buf = total <= sizeof small ? small : (unsigned char *)malloc(total);
    if (!buf) return 0;
    memcpy(buf, d->pending, (size_t)d->n_pending);
    llm_tokenizer_piece(t, id, d->special, (char *)buf + d->n_pending, n);
    /* 2. measured first, written only when it fits: the whole characters out, the unfinished tail kept */
    size_t m = llm_utf8_clean(buf, total, NULL, &keep);
    if (m <= (size_t)cap) {
        llm_utf8_clean(buf, total, out, &keep);
        memcpy(d->pending, buf + total - keep, keep);
        d->n_pending = (int)keep;
    }
    if (buf != small) free(buf);
    return (int)m;
}

/* The end of the stream: bytes still pending never became a character. Returns 3 (U+FFFD written, when cap
 * allows) or 0 when nothing was pending; like a push, it writes nothing when there is no room. */
int llm_detok_flush(llm_detok *d, char *out, int cap) {
    if (!d) return 0;
    if (d->n_pending <= 0 || d->n_pending > 3) { d->n_pending = 0; return 0; }
    /* what is held is the start of a character that never finished: one U+FFFD for all of it */
    if (!out || cap < 3) return 3;
    memcpy(out, "\xEF\xBF\xBD", 3);
    d->n_pending = 0;
    return 3;
}

/* ---- Stop strings -------------------------------------------------------------------------------------- */
/* Where the first of the stop strings begins in text[0..len), or -1; *stop_len: that stop string's length
 * and *which its index in p->stop
 * (of two that begin there, the first in the list's) */
/* (A plain scan: at most 16 stop strings over the held text, which is short, each token.) */
static int llm_stop_find(const llm_sampling_params *p, const char *text, int len, int *stop_len,
                         int *which) {
    int first = -1;
    for (int i = 0; i < p->n_stop; i++) {
        int sl = (int)strlen(p->stop[i]);
        if (sl == 0) continue;
        for (int at = 0; at + sl <= len && (first < 0 || at < first); at++)
            if (memcmp(text + at, p->stop[i], (size_t)sl) == 0) {
                first = at; *stop_len = sl; *which = i;
                break;
            }
    }
    return first;
}

/* The longest tail of text[0..len) that is the beginning of a stop string: it must wait for the next
 * token. Tails of length 1 to (that stop string's length - 1) are tried, longest first: a whole stop string
 * would have been found by llm_stop_find. With stop "</s>" and text "ab</": 2 ("</" begins it, "b</" does
 * not). Everything before this tail can go out, as no stop string can begin there any more. */
static int llm_stop_holdback(const llm_sampling_params *p, const char *text, int len) {
    int hold = 0;
    for (int i = 0; i < p->n_stop; i++) {
        const char *stop = p->stop[i];
        int sl = (int)strlen(stop);
        for (int k = sl - 1 < len ? sl - 1 : len; k > hold; k--)
            if (memcmp(text + len - k, stop, (size_t)k) == 0) { hold = k; break; }
    }
    return hold;
}

/* A sequence's new token (-1: none) becomes text: decoded into what is held back, then emitted up to what
 * could still begin a stop string. A stop string found ends the sequence (finish "stop") without its text,
 * or with it (include_stop_str) and nothing after it; finishing releases all that is held. */
static void llm_seq_push_text(llm_seq *s, int32_t token, const llm_tokenizer *tok, int finishing) {
    /* 1. the token's text (none for -1: a stop token's own text is not output) into the held text; on
     *    finishing, the detokenizer's pending bytes as U+FFFD (3 bytes of room kept for that) */
    if (tok) { /* a push that needs more room writes nothing and says how much: then once more, on the heap */
        char small[512], *buf = small;
        int n = token >= 0 ? llm_detok_push(tok, &s->detok, token, small, (int)sizeof small - 3) : 0;
        if (n > (int)sizeof small - 3) {
            buf = (char *)malloc((size_t)n + 3);
            n = buf ? llm_detok_push(tok, &s->detok, token, buf, n) : 0;
            if (!buf) buf = small;
        }
        if (finishing) n += llm_detok_flush(&s->detok, buf + n, 3);
        if (n > 0) memcpy(arraddnptr(s->held_text, n), buf, (size_t)n);
        if (buf != small) free(buf);
    }
    /* 2. a stop string in the held text ends the sequence there (the text cut before it, or after it) */
    const llm_sampling_params *p = &s->req->params;
    int len = (int)arrlen(s->held_text), stop_len = 0, which = 0;
    int stop_at = llm_stop_find(p, s->held_text, len, &stop_len, &which);
    if (stop_at >= 0) {
        len = stop_at + (p->include_stop_str ? stop_len : 0);
        s->finish_reason = LLM_FINISH_STOP;
        s->stop_string = which + 1;
    }
    /* 3. out goes all of it but a tail that may begin a stop string (all of it when finishing) */
    int emit = s->finish_reason || finishing ? len : len - llm_stop_holdback(p, s->held_text, len);
    if (emit > 0) memcpy(arraddnptr(s->out_text, emit), s->held_text, (size_t)emit);
    if (s->finish_reason) arrsetlen(s->held_text, 0);
    else if (emit > 0) arrdeln(s->held_text, 0, emit);
}

/* The whole ids at once, pushed through an llm_detok as a stream is, then the flush. Where the tokenizer
 * adds a space prefix (SentencePiece's add_space_prefix), the first text's leading space is dropped. Bytes
 * past cap are counted, not written: the caller may call again with the length returned. */
int llm_detokenize(const llm_tokenizer *t, const int32_t *ids, int n, int special, char *out, int cap) {
    if (!t || n < 0 || (n && !ids)) return -1;
    if (!out || cap < 0) cap = 0;
    llm_detok d;
    memset(&d, 0, sizeof d);
    d.special = special != 0;
    size_t len = 0;
    int at_start = 1; /* nothing written yet: where SentencePiece's leading space would be */
    for (int i = 0; i <= n; i++) {
        char small[256], *buf = small;
        int m = i < n ? llm_detok_push(t, &d, ids[i], small, (int)sizeof small)
                      : llm_detok_flush(&d, small, 8);
        if (m > (int)sizeof small) { /* a long piece: once more, on the heap */
            if (!(buf = (char *)malloc((size_t)m))) return -1;
            m = llm_detok_push(t, &d, ids[i], buf, m);
        }
        int skip = at_start && m > 0 && t->kind == LLM_VOCAB_SPM && t->add_space_prefix && buf[0] == ' ';
        for (int k = skip; k < m; k++, len++) if (len < (size_t)cap) out[len] = buf[k];
        if (m > 0) at_start = 0;
        if (buf != small) free(buf);
    }
    if (len >= (size_t)INT32_MAX) return -1;
    if (len < (size_t)cap) out[len] = 0;
    return (int)len;
}

/* ===========================================================================================================
 * 10. Engine
 * The engine owns the model, the backend and its KV pool, the block manager, the scheduler and the sampler.
 * llm_engine_step runs, in this order (and so do the functions below): what the last step handed out is
 * freed; new requests and aborts come in from the inbox; the scheduler plans the step; a draft model, when
 * there is one, computes the step's tokens and makes its proposals; the plan becomes one batch and one
 * forward call; each sequence that reached the end of its tokens samples the next one, which
 * goes through the stop conditions and the detokenizer; every sequence with news gives an output, and
 * finished ones leave. A grammar's costly masks are the one piece of a step's work done on a thread of the
 * engine's own (the grammar thread): the sequence that needs one sits out the steps until it is done.
 *
 * The public API, and who may call what:
 *   llm_engine_create(cfg, err)     the model loaded, a backend started, the KV pool sized and allocated
 *   llm_engine_add_request(...)     any thread: checks the request, tokenizes it, leaves it in the inbox
 *   llm_engine_abort(e, id)         any thread: leaves the id in the inbox; the next step finishes it
 *   llm_engine_parse_grammar(...)   any thread: a grammar for requests to come, through a cache
 *   llm_engine_wait / has_work      the engine's thread: sleeps until the inbox or the queues hold work
 *   llm_engine_step(e, &outputs)    the engine's thread: one step; the outputs live until the next step
 *   llm_engine_get_stats, check_blocks, destroy: the engine's thread, between steps
 * The functions that any thread may call touch only the inbox and the grammar cache (under e->lock) and what
 * create fixed (the model, the pool's size, the policy); everything else (the queues, the block manager, the
 * sampler, the step's scratch) belongs to the engine's thread alone and takes no lock. The one other thread
 * that reads a sequence is the grammar thread, and only a parked sequence, which the engine's thread neither
 * plans nor frees while it is parked (an abort finishes it; it is freed when its job comes back).
 *
 * A request's life, in the engine's lists (section 5's llm_seq and llm_scheduler):
 *
 *   add_request --> inbox --(step 2)--> sched.waiting --(llm_schedule admits)--> sched.running
 *                                             ^                                      |  |
 *                                             +-------- preempted (blocks freed) ----+  |
 *                                                                                      v
 *   llm_seq_free <--(start of next step)-- e->finished <--(finished: stop, length, abort, error)
 *
 * For example, alone with a 2048-token budget (nothing cached, no speculation), a request with a 3000-token
 * prompt and max_tokens 3: step 1 admits it and computes prompt tokens 0..2047 (no output: nothing is
 * sampled yet); step 2 computes 2048..2999 and samples token 1 (an output with it and its text); steps 3
 * and 4 compute one token each and sample the next, and the output of step 4 carries finish_reason "length"
 * (its blocks already back in the pool); step 5 frees the sequence. Requests added meanwhile share each
 * step's budget (running ones are planned first).
 *
 * The pieces that are not in the step's straight line: the prefix cache is looked up by the scheduler when it
 * admits a waiting sequence (llm_seq_take_cached_prefix) and fed after each forward pass, which names each
 * block once it is full (llm_seq_hash_blocks). Preemption is the scheduler's too (recompute: a sequence that
 * does not fit gives all its blocks back and waits again, first in line under FCFS, its tokens kept; when
 * readmitted it computes them again, less the full blocks the prefix cache still holds). Speculation is
 * proposals planned by the scheduler (n-gram lookup, or a slot the draft model fills in llm_engine_draft)
 * and checked here after the forward pass (llm_seq_verify). The grammar thread takes rows of logits the
 * step could not afford to mask (llm_seq_park) and hands tokens back at the start of a later step.
 *
 * Ownership: the engine copies what a request gives it (the prompt, the stop strings and ids, the biases) and
 * keeps a reference to its grammar; the caller's memory is free again when add_request returns. An output's
 * arrays point into the sequence's own buffers (out_tokens, out_text, ...), emptied at the start of the next
 * step, and a finished sequence is freed then: copy what must live longer, as server.c does.
 * Errors: create returns NULL and add_request 0, each with the message in err; a failure inside a step is
 * no return code but a finish, LLM_FINISH_ERROR with a message, of the sequences it touched.
 *
 * vLLM's EngineCore.step is the same loop (scheduler.schedule, execute_model, update_from_output), with the
 * detokenizer in another process (its OutputProcessor); here the text is made in the step, and the engine
 * is one thread and the grammar thread beside it (the backend may use threads of its own inside a forward
 * pass). Read llm_engine_step first, then the functions it calls, in order.
 * ======================================================================================================== */
/* A step's grammar checks may take this share of its forward pass's time (llm_seq_sample_on_host) */
#define LLM_GRAMMAR_STEP_SHARE 0.25
#define LLM_GRAMMAR_STEP_MIN_S 0.0002 /* the budget of a step whose forward pass took next to nothing */

/* A parked sequence's draw, for the grammar thread (llm_seq_park, below). A job's life (todo and done are
 * shared, under e->lock; spare is the engine thread's own):
 *
 *   grammar_spare (or calloc) --llm_seq_park--> grammar_todo --grammar thread runs it--> grammar_done
 *        ^                                                                                    |
 *        +------------------- llm_engine_take_grammar_jobs (next step: the token taken) ------+
 *
 * The job owns its row and its next state, both reused from one job to the next; seq is borrowed: the
 * sequence is not freed while a job holds it (e->parked_finished keeps an aborted one till it returns). */
typedef struct {
    llm_seq *seq;
    float *row;                     /* [vocab_size]: its logits, copied */
    llm_sample_row r;               /* the draw: r.token (the step's, when drawn is set), its logprobs */
    int drawn;
    int32_t top_ids[20]; float top_logprobs[20]; /* r's top logprobs (a request asks for 20 at most) */
    llm_grammar_state *next;        /* the state r.token leads to */
    const char *error;              /* the sequence fails with this; NULL: r.token is taken */
    int64_t tokens, masks, masks_cached; /* for the engine's stats */
    double seconds;
} llm_grammar_job;

typedef struct { /* what a thread that runs jobs keeps: a sampler of its own and the mask's room */
    llm_sampler *sampler;
    uint8_t *mask;                  /* [vocab_size bits] */
    int32_t *ids;                   /* [vocab_size] the tokens a mask allows ... */
    float *logits;                  /* [vocab_size] ... their logits: what a refused draw is redrawn from */
} llm_grammar_scratch;

static void llm_grammar_scratch_free(llm_grammar_scratch *w) {
    llm_sampler_free(w->sampler); free(w->mask); free(w->ids); free(w->logits);
    memset(w, 0, sizeof *w);
}

/* The engine. Three kinds of fields: what create sets up and never changes after (cfg, the models, the
 * backends, the pool's size, the scheduler's limits), which any thread may read; the inbox and the grammar
 * cache, shared with other threads under lock; and the engine thread's own state and scratch (the block
 * manager, the queues in sched, the b_* batch arrays, the rows of logits and samples, the outputs), which
 * grow to the largest step seen and are reused, never shrunk, so that steps do not allocate them again. */
struct llm_engine {
    llm_engine_config cfg;          /* as given, but max_num_batched_tokens filled in (0: the backend's) */
    llm_model model;
    llm_backend *backend;           /* forward, sample, the KV pool's memory (llm_backend, section 7) */
    llm_backend *(*backend_create)(const llm_model *m, char *err); /* the backend's: the draft model's too */
    char backend_note[LLM_ERR_LEN]; /* why the backends before it did not start */
    llm_model draft_model;          /* speculative decoding's draft model (spec_model_path) ... */
    llm_backend *draft_backend;     /* ... on its own backend of the same kind, its K/V in the same blocks */
    float *draft_logits;            /* [draft_logits_rows][its vocab_size] */
    int draft_logits_rows;
    llm_block_manager bm;           /* the pool's block ids: ref counts, the free list, the prefix cache */
    llm_scheduler sched;            /* the queues and each step's plan (section 5) */
    llm_sampler *sampler;           /* the host's: the draws of the rows the host reads (a grammar's) */
    int max_model_len;              /* the model's context, or less (cfg.max_model_len) */
    llm_engine_stats stats;         /* the engine's own counters; llm_engine_get_stats adds the rest */
    /* the inbox, filled from any thread */
    pthread_mutex_t lock;           /* guards the inbox, the aborts and next_id */
    pthread_cond_t work_added;      /* add_request and abort signal it: it wakes llm_engine_wait */
    llm_seq **inbox;                /* added, not yet taken by a step: stb_ds, in the order they came */
    uint64_t *inbox_abort;          /* request ids to abort, taken by the next step */
    uint64_t next_id;               /* the next request's id: 1, 2, ... (0 is add_request's failure) */
    /* one step's scratch (stb_ds arrays) */
    llm_seq **finished;             /* finished this step, freed at the start of the next: outputs point in */
    /* the batch's arrays, llm_batch's fields of the same names (a picture above llm_engine_forward) */
    int32_t *b_tokens, *b_positions, *b_seq_start, *b_logit_rows;
    int32_t *b_row_seq;             /* per logit row of a draft pass: its sequence's index in scheduled */
    uint8_t *b_host_rows;           /* per logit row: the host reads it (llm_batch.host_rows) */
    int32_t *b_hidden_rows;         /* the tokens whose hidden states embeddings pool (llm_batch) ... */
    float *hidden;                  /* ... and the states: [hidden_cap][dim] */
    int hidden_cap;
    const int32_t **b_tables;
    float *logits;                  /* [logits_rows][vocab_size] */
    int logits_rows;
    llm_sample_row *sample_rows;    /* the rows for the backend's sample step ... */
    llm_seq **sample_seqs;          /* ... the sequence each one's token goes to ... */
    uint64_t *sample_rngs;          /* ... and its generator, as the draw leaves it */
    int32_t *top_ids; float *top_logprobs; /* the rows' top logprobs */
    llm_token_trie *trie;           /* the vocabulary's bytes, built for the first request with a grammar */
    /* the grammar thread (section 5 of the step, structured output): jobs in, jobs done, under lock */
    pthread_t grammar_thread;
    /* started (at the first parked sequence), could not start (jobs run on the engine's thread), to quit */
    int grammar_thread_on, grammar_thread_failed, grammar_quit;
    pthread_cond_t grammar_added;   /* a job came, or the thread is to quit */
    llm_grammar_job **grammar_todo, **grammar_done;
    /* the engine thread's own */
    llm_grammar_job **grammar_spare;/* done with: their rows kept for the next */
    int grammar_in_flight;          /* jobs handed out and not taken back */
    llm_seq **parked_finished;      /* finished (aborted) while parked: freed when their job comes back */
    llm_grammar_scratch grammar_here; /* the jobs' room here, if the grammar thread would not start */
    double grammar_step_seconds, grammar_step_budget; /* this step's checks so far, and how far they may go */
    double grammar_step_share;      /* the budget's share of the forward pass's time (tests change it: < 0,
                                     * every grammar sequence parked before its draw) */
    int step_idle;                  /* the last step planned nothing and gave nothing out */
    struct { char *text; llm_grammar *g; } *grammars; /* stb_ds, under lock: the last LLM_ENGINE_GRAMMARS
                                     * grammars parsed, each holding a reference, replaced in turn */
    int grammars_next;
    llm_grammar_state *grammar_next;/* scratch: a sequence's state after the token sampled, swapped in once
                                     * the token is taken */
    char step_error[LLM_ERR_LEN];   /* why this step's forward pass failed: the error of its outputs */
    llm_output *outputs;            /* stb_ds: the step's outputs, handed out by llm_engine_step */
};

/* vLLM's defaults where it has them (16-token blocks, 256 sequences, the prefix cache on, prompt lookup of
 * 2 to 4 tokens); the zeros (the pool, the token budget, the context) are filled in by create, from the
 * model and the backend */
llm_engine_config llm_engine_defaults(void) {
    llm_engine_config c;
    memset(&c, 0, sizeof c);
    c.block_size = 16; c.max_num_seqs = 256; c.max_num_batched_tokens = 0; c.enable_prefix_caching = 1;
    c.spec_ngram_max = 4; c.spec_ngram_min = 2;
    return c;
}

const char *llm_finish_reason_name(int reason) {
    switch (reason) {
    case LLM_FINISH_STOP: return "stop"; case LLM_FINISH_LENGTH: return "length";
    case LLM_FINISH_ABORT: return "abort"; case LLM_FINISH_ERROR: return "error";
    }
    return NULL;
}

/* ---- Creation: the model, a backend, the KV pool ------------------------------------------------------- */
/* The backends the engine tries in this order, when the config names none */
static const struct {
    const char *name;
    llm_backend *(*create)(const llm_model *m, char *err);
} llm_backends[] = {
#ifdef LLM_CUDA
    {"cuda", llm_cuda_backend_create},
#endif
    {"cpu", llm_cpu_backend_create},
};

/* A config that could never work is refused before anything is loaded: -1 and the field that is wrong.
 * (What depends on the model or the backend, such as a pool too small for one block, is checked later.) */
static int llm_engine_check_config(const llm_engine_config *c, char *err) {
    if (c->block_size <= 0 || c->block_size > 1024)
        return llm_fail(err, "block_size must be between 1 and 1024, got %d", c->block_size);
    if (c->max_num_seqs <= 0)
        return llm_fail(err, "max_num_seqs must be at least 1, got %d", c->max_num_seqs);
    if (c->max_num_batched_tokens < 0)
        return llm_fail(err, "max_num_batched_tokens must be at least 1 (0: the backend's), got %d",
                        c->max_num_batched_tokens);
    if (c->num_blocks < 0 || c->max_model_len < 0)
        return llm_fail(err, "num_blocks and max_model_len must be >= 0");
    if (!(c->kv_fraction >= 0 && c->kv_fraction <= 1))
        return llm_fail(err, "kv_fraction must be in [0, 1] (0: the backend's default)");
    if (c->scheduling_policy != LLM_SCHED_FCFS && c->scheduling_policy != LLM_SCHED_PRIORITY)
        return llm_fail(err, "scheduling_policy must be LLM_SCHED_FCFS or LLM_SCHED_PRIORITY, got %d",
                        c->scheduling_policy);
    if (c->spec_tokens < 0 || c->spec_tokens > LLM_SPEC_MAX)
        return llm_fail(err, "num_speculative_tokens must be between 0 and %d, got %d", LLM_SPEC_MAX,
                        c->spec_tokens);
    /* n-gram lookup compares up to spec_ngram_max tokens at each earlier position, for each length: the cap
     * of 64 bounds that work per step */
    if (c->spec_tokens &&
        (c->spec_ngram_min < 1 || c->spec_ngram_max < c->spec_ngram_min || c->spec_ngram_max > 64))
        return llm_fail(err, "prompt_lookup_min must be at least 1 and prompt_lookup_max "
                             "between it and 64, got "
                        "%d and %d", c->spec_ngram_min, c->spec_ngram_max);
    return 0;
}

/* The config's backend, or the first of llm_backends that starts. Each one that does not start adds its
 * reason to backend_note (get_stats shows it), so that an engine that fell back to the CPU can say why;
 * -1 with the last one's error when none starts. backend_create is kept: the draft model starts with it. */
static int llm_engine_start_backend(llm_engine *e, char *err) {
    e->backend_create = e->cfg.create_backend;
    if (e->backend_create) return (e->backend = e->backend_create(&e->model, err)) != NULL ? 0 : -1;
    for (size_t i = 0; i < sizeof llm_backends / sizeof llm_backends[0] && !e->backend; i++) {
        e->backend = (e->backend_create = llm_backends[i].create)(&e->model, err);
        if (!e->backend) {
            size_t at = strlen(e->backend_note);
            snprintf(e->backend_note + at, sizeof e->backend_note - at, "%s%s: %s", at ? "; " : "",
                     llm_backends[i].name, err);
        }
    }
    return e->backend ? 0 : -1;
}

/* The config's KV cache type on a backend (before alloc_kv): auto keeps the backend's own */
static int llm_backend_kv_dtype(llm_backend *be, int dtype, char *err) {
    if (dtype == LLM_KV_AUTO) return 0;
    if (!be->set_kv_dtype)
        return llm_fail(err, "the %s backend keeps its own KV cache type: f16, f32, q8_0 and q4_0 caches are "
                        "the CPU's", be->name);
    return be->set_kv_dtype(be, dtype, err);
}

/* The draft model (spec_model_path): the model's vocabulary (llama.cpp's rule: sizes within 128 of each
 * other, and each token both have the same text), one group of layers (its K/V go in the blocks of the
 * model's first group, which must keep every position), on a backend of the model's kind */
static int llm_engine_start_draft(llm_engine *e, char *err) {
    llm_model *d = &e->draft_model;
    const llm_tokenizer *a = e->model.tok, *b;
    char why[LLM_ERR_LEN];
    if (e->cfg.spec_tokens < 1)
        return llm_fail(err, "a draft model needs num_speculative_tokens between 1 and %d", LLM_SPEC_MAX);
    /* 1. The file, run with the model's context */
    if (llm_model_load(d, e->cfg.spec_model_path, why) != 0) return llm_fail(err, "the draft model: %s", why);
    llm_model_set_context(d, e->max_model_len);
    /* 2. The same vocabulary: a proposed token id must mean the same text to both models */
    b = d->tok;
    int Va = e->model.cfg.vocab_size, Vb = d->cfg.vocab_size;
    if (abs(Va - Vb) > 128 || !a != !b)
        return llm_fail(err, "the draft model's vocabulary (%d tokens%s) is not the model's (%d tokens%s)",
                        Vb, b ? "" : ", no tokenizer", Va, a ? "" : ", no tokenizer");
    for (int i = 0; a && b && i < a->n_vocab && i < b->n_vocab; i++)
        if (a->text[i].len != b->text[i].len || memcmp(a->text[i].ptr, b->text[i].ptr, a->text[i].len))
            return llm_fail(err, "the draft model's vocabulary is not the model's: "
                                 "token %d is \"%.*s\" in the "
                            "draft, \"%.*s\" in the model", i,
                            (int)(b->text[i].len < 40 ? b->text[i].len : 40),
                            b->text[i].ptr, (int)(a->text[i].len < 40 ? a->text[i].len : 40), a->text[i].ptr);
    /* 3. The blocks: the draft's K/V follow the model's first group's block table, every position kept */
    if (llm_kv_groups(&d->cfg) != 1)
        return llm_fail(err, "the draft model has layers with sliding windows: a draft here attends to every "
                        "position");
    if (e->sched.kv_window[0] != 0)
        return llm_fail(err, "every layer of the model has a sliding window: a draft model needs a group of "
                        "layers that keeps every position");
    /* 4. Its backend, of the model's kind, with the same KV cache type */
    if (!(e->draft_backend = e->backend_create(d, why)))
        return llm_fail(err, "the draft model on the %s backend: %s", e->backend->name, why);
    if (llm_backend_kv_dtype(e->draft_backend, e->cfg.kv_cache_dtype, why) != 0)
        return llm_fail(err, "the draft model: %s", why);
    return 0;
}

/* The most blocks a sequence of n tokens holds at once, computed in chunks of up to the step's token budget:
 * in a global group all of its blocks, in a local one those of a chunk and of the window before it. The
 * queries of a chunk of c tokens read the window's w - 1 positions before its first and the c of the chunk,
 * w + c - 1 positions, which touch at most (w + c - 2) / bs + 2 blocks: with w 4096, c 2048 and bs 16, 385
 * blocks in a local group however long the sequence. add_request refuses a prompt whose count exceeds the
 * whole pool (it could never run), and llm_kv_pool_blocks sizes a pool with no memory figure (the CPU's)
 * as max_num_seqs full contexts of it. */
static int64_t llm_engine_blocks_for(const llm_engine *e, int n) {
    int bs = e->cfg.block_size;
    int64_t all = ((int64_t)n + bs - 1) / bs, total = 0;
    for (int g = 0; g < e->sched.n_kv_groups; g++) {
        int64_t window = e->sched.kv_window[g], chunk = e->cfg.max_num_batched_tokens;
        int64_t held = window > 0 ? (window + chunk - 2) / bs + 2 : all;
        total += held < all ? held : all;
    }
    return total;
}

/* The KV pool in blocks, one policy for every backend: num_blocks; else kv_bytes; else kv_fraction of the
 * memory the backend has free; else the backend's default fraction of it; and a backend with none (the CPU,
 * like vLLM's) gets room for max_num_seqs full contexts, 4 GiB at most. */
static int llm_kv_pool_blocks(const llm_engine *e, size_t block_bytes, char *err) {
    const llm_engine_config *c = &e->cfg;
    if (c->num_blocks > 0) return c->num_blocks;
    double fraction = c->kv_fraction > 0 ? c->kv_fraction : e->backend->default_kv_fraction;
    size_t bytes = c->kv_bytes, free_memory = e->backend->free_memory, act = e->backend->activation_memory;
    if (e->draft_backend) /* measured after both models' weights, less the draft's activations: less the
                           * model's too */
        free_memory = e->draft_backend->free_memory > act ? e->draft_backend->free_memory - act : 0;
    if (!bytes && fraction > 0) bytes = (size_t)(fraction * (double)free_memory);
    if (!bytes) {
        size_t blocks_per_context = (size_t)llm_engine_blocks_for(e, e->max_model_len);
        bytes = (size_t)c->max_num_seqs * blocks_per_context * block_bytes;
        if (bytes > ((size_t)4 << 30)) bytes = (size_t)4 << 30;
    }
    size_t n = bytes / block_bytes;
    if (n == 0)
        return llm_fail(err, "the KV pool of %zu bytes holds no block of %zu bytes", bytes, block_bytes);
    return n > (1u << 30) ? (1 << 30) : (int)n; /* ids are ints; the block manager keeps a record each */
}

/* The engine, or NULL and why. The order matters: the context length picks the model's RoPE factors (a
 * long-context model's), the backend chooses the token budget and the KV value size, the groups of layers
 * and their windows decide how many blocks a context holds, the draft model adds its K/V to every block,
 * and only then is the pool sized.
 * Every failure after the calloc goes through llm_engine_destroy, which frees whatever was made so far (e
 * is calloc'ed: NULL and 0 mean "not made"). */
llm_engine *llm_engine_create(const llm_engine_config *cfg, char *err) {
    /* 1. The config alone, then the engine's lock and condition variables */
    if (llm_engine_check_config(cfg, err) != 0) return NULL;
    llm_engine *e = (llm_engine *)calloc(1, sizeof *e);
    if (!e) { llm_fail(err, "out of memory"); return NULL; }
    e->cfg = *cfg;
    e->next_id = 1;
    e->grammar_step_share = LLM_GRAMMAR_STEP_SHARE;
    pthread_mutex_init(&e->lock, NULL);
    pthread_condattr_t attr; /* timed waits on the monotonic clock: changes of the wall clock do not matter */
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&e->work_added, &attr);
    pthread_cond_init(&e->grammar_added, NULL);
    pthread_condattr_destroy(&attr);
    /* 2. The model (or a dummy one), and the context it runs with: its own, or max_model_len if shorter */
    int rc = cfg->dummy ? llm_model_dummy(&e->model, cfg->dummy, cfg->dummy_seed, err)
           : cfg->model_path ? llm_model_load(&e->model, cfg->model_path, err)
           : llm_fail(err, "no model given");
    if (rc != 0) { llm_engine_destroy(e); return NULL; }
    e->max_model_len = e->model.cfg.context_length;
    if (cfg->max_model_len > 0 && cfg->max_model_len < e->max_model_len)
        e->max_model_len = cfg->max_model_len;
    llm_model_set_context(&e->model, e->max_model_len);
    /* 3. The backend, its KV cache type, and the step's token budget (the backend's default unless given) */
    if (llm_engine_start_backend(e, err) != 0) { llm_engine_destroy(e); return NULL; }
    if (llm_backend_kv_dtype(e->backend, cfg->kv_cache_dtype, err) != 0) {
        llm_engine_destroy(e);
        return NULL;
    }
    int *budget = &e->cfg.max_num_batched_tokens, backend_budget = e->backend->default_batched_tokens;
    if (!*budget) *budget = backend_budget > 0 ? backend_budget : 2048;
    llm_scheduler *sch = &e->sched; /* the groups of layers first: the pool's size depends on their windows */
    sch->n_kv_groups = llm_kv_groups(&e->model.cfg);
    if (!(sch->kv_window = (int *)calloc((size_t)sch->n_kv_groups, sizeof(int)))) {
        llm_fail(err, "out of memory"); llm_engine_destroy(e); return NULL;
    }
    for (int g = 0; g < sch->n_kv_groups; g++) sch->kv_window[g] = llm_kv_group_window(&e->model.cfg, g);
    /* 4. The draft model, then the pool: one block id holds the model's K/V in each backend (and the
     *    draft's), so both backends get the same number of blocks; then the block manager and the sampler */
    if (cfg->spec_model_path && llm_engine_start_draft(e, err) != 0) { llm_engine_destroy(e); return NULL; }
    size_t block_bytes = llm_kv_bytes_per_block(&e->model.cfg, cfg->block_size, e->backend->kv_head_bytes);
    if (e->draft_backend) /* a block id holds the draft's K/V too */
        block_bytes += llm_kv_bytes_per_block(&e->draft_model.cfg, cfg->block_size,
                                              e->draft_backend->kv_head_bytes);
    int num_blocks = llm_kv_pool_blocks(e, block_bytes, err);
    if (num_blocks < 0 || e->backend->alloc_kv(e->backend, num_blocks, cfg->block_size, err) != 0 ||
        (e->draft_backend && e->draft_backend->alloc_kv(e->draft_backend, num_blocks, cfg->block_size,
                                                        err)) ||
        llm_block_manager_init(&e->bm, num_blocks, cfg->block_size, cfg->enable_prefix_caching, err) != 0 ||
        !(e->sampler = llm_sampler_create(e->model.cfg.vocab_size, err))) {
        llm_engine_destroy(e); return NULL;
    }
    /* 5. The scheduler's limits, copied from the config */
    sch->bm = &e->bm; sch->static_batching = cfg->static_batching; sch->static_batch_open = 1;
    sch->priority_policy = cfg->scheduling_policy == LLM_SCHED_PRIORITY;
    sch->max_num_seqs = cfg->max_num_seqs; sch->max_num_batched_tokens = e->cfg.max_num_batched_tokens;
    sch->spec_tokens = cfg->spec_tokens; sch->spec_ngram_max = cfg->spec_ngram_max;
    sch->spec_ngram_min = cfg->spec_ngram_min; sch->max_model_len = e->max_model_len;
    sch->spec_draft_model = e->draft_backend != NULL;
    return e;
}

/* Frees everything, in any state create left it in (also a half-made engine: fields not made are NULL or
 * 0). The grammar thread stops first, as it may be reading a parked sequence; then every sequence wherever
 * it is (waiting, running, finished last step, still in the inbox, parked and finished), and only then the
 * backends and models the sequences' blocks lived in. The last step's outputs die with it. */
void llm_engine_destroy(llm_engine *e) {
    if (!e) return;
    if (e->grammar_thread_on) { /* first: it may be reading a sequence */
        pthread_mutex_lock(&e->lock);
        e->grammar_quit = 1;
        pthread_cond_signal(&e->grammar_added);
        pthread_mutex_unlock(&e->lock);
        pthread_join(e->grammar_thread, NULL);
    }
    llm_seq **all[5] = {e->sched.waiting, e->sched.running, e->finished, e->inbox, e->parked_finished};
    for (int k = 0; k < 5; k++) for (int i = 0; i < arrlen(all[k]); i++) llm_seq_free(all[k][i]);
    arrfree(e->parked_finished);
    llm_scheduler *sch = &e->sched;
    arrfree(sch->waiting); arrfree(sch->running);
    arrfree(sch->scheduled); arrfree(sch->n_new); arrfree(sch->copy_src); arrfree(sch->copy_dst);
    free(sch->kv_window);
    arrfree(e->finished); arrfree(e->inbox); arrfree(e->inbox_abort);
    arrfree(e->b_tokens); arrfree(e->b_positions); arrfree(e->b_seq_start); arrfree(e->b_logit_rows);
    arrfree(e->b_host_rows); arrfree(e->b_row_seq); arrfree(e->b_hidden_rows); free(e->hidden);
    arrfree(e->sample_rows); arrfree(e->sample_seqs); arrfree(e->sample_rngs);
    arrfree(e->top_ids); arrfree(e->top_logprobs);
    arrfree(e->b_tables); arrfree(e->outputs);
    free(e->logits); llm_token_trie_free(e->trie);
    llm_grammar_state_free(e->grammar_next);
    llm_grammar_job **jobs[3] = {e->grammar_todo, e->grammar_done, e->grammar_spare};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < arrlen(jobs[k]); i++) {
            free(jobs[k][i]->row); llm_grammar_state_free(jobs[k][i]->next); free(jobs[k][i]);
        }
    arrfree(e->grammar_todo); arrfree(e->grammar_done); arrfree(e->grammar_spare);
    llm_grammar_scratch_free(&e->grammar_here);
    for (ptrdiff_t i = 0; i < arrlen(e->grammars); i++) {
        free(e->grammars[i].text);
        llm_grammar_free(e->grammars[i].g);
    }
    arrfree(e->grammars);
    llm_sampler_free(e->sampler);
    if (e->backend) e->backend->destroy(e->backend);
    if (e->draft_backend) e->draft_backend->destroy(e->draft_backend);
    free(e->draft_logits);
    llm_block_manager_free(&e->bm);
    llm_model_free(&e->model);
    llm_model_free(&e->draft_model);
    pthread_cond_destroy(&e->work_added);
    pthread_cond_destroy(&e->grammar_added);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

const llm_model *llm_engine_model(const llm_engine *e) { return &e->model; }

/* ---- Requests in, from any thread ---------------------------------------------------------------------- */
/* -1 and why when one of the n ids (what: whose they are) is outside the vocabulary */
static int llm_ids_check(const int32_t *ids, int64_t n, int vocab_size, const char *what, char *err) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab_size)
            return llm_fail(err, "%s token id %d is outside the vocabulary (0..%d)", what, ids[i],
                            vocab_size - 1);
    return 0;
}

/* In double: a vector of thousands of values keeps its float32 precision */
void llm_embedding_normalize(float *v, int n) {
    double norm = 0;
    for (int i = 0; i < n; i++) norm += (double)v[i] * v[i];
    if (norm > 0) for (int i = 0; i < n; i++) v[i] = (float)(v[i] / sqrt(norm));
}

/* The grammar layer's hooks (section 12) that the engine calls besides its public API */
static llm_grammar *llm_grammar_ref(llm_grammar *g);
static int64_t llm_grammar_cache_hits(const llm_grammar *g);
static int llm_gr_allows_into(const llm_grammar_state *st, const llm_token_trie *tt, int32_t token,
                              llm_grammar_state *next);

/* A request's grammar: the one parsed for an earlier request with the same text (its masks cached), or
 * parsed now and kept for the next ones. A reference for the request (or for a server's worker, which parses
 * it before the request is added: llm_sampling_params.grammar_parsed). The cache is a ring of the last
 * LLM_ENGINE_GRAMMARS texts, looked up by the whole text; the lock is held only to look up and to insert,
 * never while parsing, so a costly grammar does not hold up add_request or abort on other threads (two
 * threads that parse the same new text at once both insert it: a wasted slot, nothing worse). A grammar's
 * references are counted atomically, so the engine's thread drops a finished request's without the lock. */
#define LLM_ENGINE_GRAMMARS 32
llm_grammar *llm_engine_parse_grammar(llm_engine *e, const char *text, char *err) {
    llm_grammar *g = NULL;
    pthread_mutex_lock(&e->lock);
    for (ptrdiff_t i = 0; i < arrlen(e->grammars) && !g; i++)
        if (!strcmp(e->grammars[i].text, text)) g = e->grammars[i].g;
    if (g) llm_grammar_ref(g);
    pthread_mutex_unlock(&e->lock);
    if (g || !(g = llm_grammar_parse(text, err))) return g;
    char *copy = strdup(text);
    if (!copy) return g; /* not kept: only the cache is lost */
    llm_grammar_ref(g);
    pthread_mutex_lock(&e->lock);
    int k = (int)arrlen(e->grammars);
    if (k < LLM_ENGINE_GRAMMARS) arrsetlen(e->grammars, k + 1);
    else { /* full: the oldest goes (requests that still hold it keep it alive) */
        k = e->grammars_next;
        e->grammars_next = (k + 1) % LLM_ENGINE_GRAMMARS;
        free(e->grammars[k].text);
        llm_grammar_free(e->grammars[k].g);
    }
    e->grammars[k].text = copy; e->grammars[k].g = g;
    pthread_mutex_unlock(&e->lock);
    return g;
}

/* Any thread. What can be known wrong with a request before it runs is checked here, on the caller's
 * thread, so that it fails at once with a message the caller can give its client rather than later in a
 * step: the parameters, every token id against the vocabulary, the prompt against the context and the whole
 * KV pool, the grammar parsed. The tokenizing (and the parsing of a grammar not parsed yet) also happens
 * here, off the engine's thread. Besides the grammar cache's look-up, only a request that passes takes the
 * lock, for an arrput. Returns its id, or 0 with the reason in err; on 0 nothing of the request is kept
 * (its ids and its grammar reference are freed). */
uint64_t llm_engine_add_request(llm_engine *e, const char *prompt, const int32_t *prompt_ids,
                                int n_prompt_ids, const llm_sampling_params *p, void *user, char *err) {
    int V = e->model.cfg.vocab_size;
    /* 1. The sampling parameters, and the token ids they name */
    if (p->priority && !e->sched.priority_policy) {
        llm_fail(err, "priority needs the priority scheduling policy (this engine serves first come first)");
        return 0;
    }
    if (llm_request_check(p, err) != 0 ||
        llm_ids_check(p->logit_bias_ids, p->n_logit_bias, V, "logit_bias", err) != 0 ||
        llm_ids_check(p->allowed_token_ids, p->n_allowed_token_ids, V, "allowed_token_ids", err) != 0 ||
        llm_ids_check(p->bad_word_ids, llm_bad_words_total(p), V, "bad_words", err) != 0 ||
        llm_ids_check(p->think_end_ids, p->n_think_end_ids, V, "think_end_ids", err) != 0 ||
        llm_ids_check(p->think_start_ids, p->n_think_start_ids, V, "think_start_ids", err) != 0)
        return 0;
    /* the prompt's ids: as given, or the text tokenized (llm_tokenize_prompt) */
    int32_t *ids = NULL;
    if (prompt_ids) {
        if (n_prompt_ids < 0) { llm_fail(err, "n_prompt_ids is negative (%d)", n_prompt_ids); return 0; }
        if (llm_ids_check(prompt_ids, n_prompt_ids, V, "prompt", err) != 0) return 0;
        if (n_prompt_ids)
            memcpy(arraddnptr(ids, n_prompt_ids), prompt_ids, (size_t)n_prompt_ids * sizeof(int32_t));
    } else {
        if (!e->model.tok) { llm_fail(err, "this model has no tokenizer: give prompt token ids"); return 0; }
        const char *text = prompt ? prompt : "";
        size_t len = strlen(text);
        int cap = len < INT32_MAX / 2 ? (int)len + 8 : INT32_MAX / 2;
        arrsetlen(ids, cap);
        int n = llm_tokenize_prompt(e->model.tok, text, len, ids, cap);
        if (n > cap) { arrsetlen(ids, n); n = llm_tokenize_prompt(e->model.tok, text, len, ids, n); }
        if (n < 0) { arrfree(ids); llm_fail(err, "could not tokenize the prompt"); return 0; }
        arrsetlen(ids, n);
        /* an embedding's text ends with EOS when the vocabulary asks (Qwen3-Embedding pools that position) */
        int eos = llm_tokenizer_eos(e->model.tok);
        if (p->pooling && llm_tokenizer_adds_eos(e->model.tok) && eos >= 0 && (n == 0 || ids[n - 1] != eos))
            arrput(ids, eos);
    }
    /* 2. The prompt must leave room for one new token in the context, and fit the pool on its own: a prompt
     *    that needs more blocks than the pool has would wait forever */
    int n_prompt = (int)arrlen(ids), gen = !p->pooling; /* an embedding generates no token */
    int64_t blocks_needed = llm_engine_blocks_for(e, n_prompt + gen); /* with the first new token */
    if (n_prompt == 0) { arrfree(ids); llm_fail(err, "the prompt is empty"); return 0; }
    if (p->pooling && !e->backend->has_hidden) {
        arrfree(ids);
        llm_fail(err, "embeddings (pooling) need the CPU backend: the %s backend gives no hidden states yet",
                 e->backend->name);
        return 0;
    }
    int n_vocab = e->model.cfg.vocab_size;
    const int *rank = p->rank_ids;
    if (p->pooling == LLM_POOL_RANK && !e->model.cls_out.data &&
        (rank[0] < 0 || rank[0] >= n_vocab || rank[1] < 0 || rank[1] >= n_vocab)) {
        arrfree(ids);
        llm_fail(err, "rank pooling without the file's cls.output needs rank_ids in [0, %d)", n_vocab);
        return 0;
    }
    if (!gen && n_prompt > e->max_model_len) {
        arrfree(ids);
        llm_fail(err, "the prompt has %d tokens, but this model's context is %d tokens", n_prompt,
                 e->max_model_len);
        return 0;
    }
    if (gen && n_prompt >= e->max_model_len) {
        arrfree(ids);
        llm_fail(err, "the prompt has %d tokens, but this model's context is %d tokens (the prompt and at "
                 "least one new token must fit)", n_prompt, e->max_model_len);
        return 0;
    }
    if (blocks_needed > e->bm.num_blocks) {
        arrfree(ids);
        llm_fail(err, "the prompt needs %lld KV blocks but the whole pool has %d", (long long)blocks_needed,
                 e->bm.num_blocks);
        return 0;
    }
    /* 3. The grammar: a reference of the request's own, to the one given or to the cache's */
    llm_grammar *grammar = NULL;
    if ((p->grammar || p->grammar_parsed) && !e->model.tok) {
        arrfree(ids);
        llm_fail(err, "a grammar needs the model's tokenizer");
        return 0;
    }
    if (p->grammar_parsed) grammar = llm_grammar_ref(p->grammar_parsed);
    else if (p->grammar && !(grammar = llm_engine_parse_grammar(e, p->grammar, err))) {
        arrfree(ids);
        return 0;
    }
    /* 4. The request and its first sequence (its copies made), then into the inbox; the engine's thread is
     *    woken if it sleeps in llm_engine_wait */
    llm_seq *s = llm_seq_new(ids, p, grammar, user, e->sched.n_kv_groups);
    if (!s) { llm_fail(err, "out of memory"); return 0; }
    size_t dim = (size_t)e->model.cfg.dim;
    if (p->pooling && (!(s->pool = (double *)calloc(dim, sizeof(double))) ||
                       !(s->embedding = (float *)malloc(dim * sizeof(float))))) {
        llm_seq_free(s);
        llm_fail(err, "out of memory");
        return 0;
    }
    pthread_mutex_lock(&e->lock);
    uint64_t id = s->req->id = e->next_id++;
    arrput(e->inbox, s);
    pthread_cond_signal(&e->work_added);
    pthread_mutex_unlock(&e->lock);
#ifdef LLM_TEST_AFTER_ADD
    LLM_TEST_AFTER_ADD(); /* the tests widen the window here: the engine thread runs the request to its end */
#endif
    return id; /* not s->req->id: once the lock is let go, the engine thread may finish and free it */
}

/* Any thread. Only the id is noted here: the next step finishes every sample of the request (waiting or
 * running, parked too) with LLM_FINISH_ABORT and gives each an output. An id that is unknown or finished
 * already changes nothing. */
void llm_engine_abort(llm_engine *e, uint64_t request_id) {
    pthread_mutex_lock(&e->lock);
    arrput(e->inbox_abort, request_id);
    pthread_cond_signal(&e->work_added);
    pthread_mutex_unlock(&e->lock);
}

/* Work: something in the inbox, or sequences waiting or running, or a grammar job out (its sequence's token
 * comes back: a step then waits for it in llm_engine_begin_step rather than spinning). Lock held. */
static int llm_engine_work_locked(llm_engine *e) {
    return arrlen(e->inbox) > 0 || arrlen(e->inbox_abort) > 0 || arrlen(e->sched.waiting) > 0 ||
           arrlen(e->sched.running) > 0 || e->grammar_in_flight > 0;
}

/* News for a step that found nothing to do: a request, an abort, or a grammar job done. Lock held. */
static int llm_engine_news_locked(llm_engine *e) {
    return arrlen(e->inbox) > 0 || arrlen(e->inbox_abort) > 0 || arrlen(e->grammar_done) > 0;
}

/* The engine thread's sleep between steps: on work_added, which add_request, abort and the grammar thread
 * signal. The deadline is on the monotonic clock (create set the condition variable to it), so a change of
 * the wall clock neither cuts the wait short nor stretches it. Waiting and running are read under the lock
 * but changed only by the engine's thread, the caller: they cannot change during the wait. */
int llm_engine_wait(llm_engine *e, int timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
    }
    /* the deadline is fixed before the loop: a spurious wakeup waits again for what is left, not longer */
    pthread_mutex_lock(&e->lock);
    int work;
    while (!(work = llm_engine_work_locked(e)) && timeout_ms != 0) {
        int rc = timeout_ms < 0 ? pthread_cond_wait(&e->work_added, &e->lock)
                                : pthread_cond_timedwait(&e->work_added, &e->lock, &until);
        if (rc == ETIMEDOUT) { work = llm_engine_work_locked(e); break; }
    }
    pthread_mutex_unlock(&e->lock);
    return work;
}

int llm_engine_has_work(llm_engine *e) { return llm_engine_wait(e, 0); }

/* ---- One step, in the order llm_engine_step runs it ---------------------------------------------------- */
/* 1. What the last step handed out is done with: its finished sequences are freed, the running ones' output
 *    emptied. Only running sequences have output: one the scheduler preempts later in this step has had its
 *    emptied here first. */
static void llm_engine_begin_step(llm_engine *e) {
    /* the wait for grammar jobs: after a step that did nothing, until a job comes back, a request or an
     * abort (no timeout: each of them signals work_added); else for the jobs out, up to the grammar budget
     * of the last step (a sequence whose mask comes in time loses no step) */
    if (e->grammar_in_flight) {
        /* nothing else to do: wait for the grammar thread; else a while for its jobs, so that a cheap mask
         * loses its sequence no step, within the budget (a costly one is left for a later step) */
        double until = llm_now() + e->grammar_step_budget;
        struct timespec ts = {(time_t)until, (long)((until - floor(until)) * 1e9)};
        pthread_mutex_lock(&e->lock);
        if (e->step_idle) while (!llm_engine_news_locked(e)) pthread_cond_wait(&e->work_added, &e->lock);
        else
            while (arrlen(e->grammar_done) < e->grammar_in_flight && llm_now() < until &&
                   pthread_cond_timedwait(&e->work_added, &e->lock, &ts) != ETIMEDOUT) {}
        pthread_mutex_unlock(&e->lock);
    }
    /* what the last step's outputs pointed into goes now: the finished sequences, the running ones' output */
    for (int i = 0; i < arrlen(e->finished); i++) /* a parked one waits for its job */
        if (e->finished[i]->parked) arrput(e->parked_finished, e->finished[i]);
        else llm_seq_free(e->finished[i]);
    arrsetlen(e->finished, 0); arrsetlen(e->outputs, 0);
    e->step_error[0] = 0;
    for (int i = 0; i < arrlen(e->sched.running); i++) {
        llm_seq *s = e->sched.running[i];
        arrsetlen(s->out_tokens, 0); arrsetlen(s->out_text, 0); arrsetlen(s->out_logprobs, 0);
        arrsetlen(s->out_top_ids, 0); arrsetlen(s->out_top_logprobs, 0);
    }
}

/* A sequence is done: its blocks go back at once; its output says why at the end of the step. The
 * invariant: each sample gets exactly one output with a finish_reason. A sequence finished while in running
 * gives it in llm_engine_collect; one taken out of the lists at once (an abort, a grammar job's end) gives it
 * there with llm_emit; one aborted while parked gives it at the abort, and is freed silently when its job
 * comes back. (llm_engine_destroy drops what is left without outputs.) */
static void llm_seq_finish(llm_engine *e, llm_seq *s, int reason, const char *error) {
    s->finish_reason = reason; s->error = error; s->status = LLM_SEQ_FINISHED;
    llm_seq_release_blocks(&e->sched, s);
}

/* The output of a sequence for this step. A sequence that finishes before its prompt was computed (aborted,
 * or failed) still stands for all n samples of its request: each gets its finish. */
static void llm_emit(llm_engine *e, llm_seq *s) {
    /* no copies: the output's arrays are s's own (this step's tokens, text, logprobs), valid until s's
     * output is emptied or s freed, both at the start of the next step */
    llm_output o;
    memset(&o, 0, sizeof o);
    o.request_id = s->req->id; o.user = s->req->user; o.index = s->index;
    o.token_ids = s->out_tokens; o.n_tokens = (int)arrlen(s->out_tokens);
    o.text = s->out_text; o.text_len = (int)arrlen(s->out_text);
    if (s->req->params.logprobs >= 0) {
        o.logprobs = s->out_logprobs; o.n_top = s->req->params.logprobs;
        o.top_ids = s->out_top_ids; o.top_logprobs = s->out_top_logprobs;
    }
    o.finish_reason = s->finish_reason; o.error = s->error; o.stop_string = s->stop_string;
    o.n_prompt_tokens = s->req->n_prompt; o.n_cached_tokens = s->n_cached_tokens;
    o.n_generated = (int)arrlen(s->tokens) - s->req->n_prompt;
    if (s->req->params.pooling && s->finish_reason == LLM_FINISH_STOP) {
        o.embedding = s->embedding;
        o.n_embedding = s->req->params.pooling == LLM_POOL_RANK ? 1 : e->model.cfg.dim;
    }
    if (s->plp_state == LLM_PLP_READY) { /* once: a recompute after preemption does not score them again */
        s->plp_state = LLM_PLP_NONE;
        o.prompt_logprobs = s->plp; o.prompt_ranks = s->plp_rank; o.n_prompt_logprobs = s->req->n_prompt - 1;
        o.prompt_top_ids = s->plp_top_ids; o.prompt_top_logprobs = s->plp_top;
        o.n_prompt_top = s->req->params.prompt_logprobs < e->model.cfg.vocab_size ?
                         s->req->params.prompt_logprobs : e->model.cfg.vocab_size;
    }
    int copies = s->finish_reason && s->fork_pending ? s->req->params.n : 1;
    for (int i = 0; i < copies; i++) {
        o.index = s->index + i;
        arrput(e->outputs, o);
        if (o.finish_reason) e->stats.requests_finished++;
    }
}

/* 2. The inbox: new requests join the waiting queue; aborted requests finish at once, wherever they are. */
static void llm_engine_take_inbox(llm_engine *e) {
    /* under the lock only the moves: the new sequences into the waiting queue, the aborts' list taken */
    pthread_mutex_lock(&e->lock);
    for (int i = 0; i < arrlen(e->inbox); i++) llm_sched_wait(&e->sched, e->inbox[i], 0);
    arrsetlen(e->inbox, 0);
    uint64_t *aborts = e->inbox_abort;
    e->inbox_abort = NULL;
    pthread_mutex_unlock(&e->lock);
    /* each abort finds all the samples of its request, in both queues (a request added and aborted before
     * this step is in waiting by now), and finishes them: blocks back, an output, freed next step */
    for (int a = 0; a < arrlen(aborts); a++) {
        llm_seq ***lists[2] = {&e->sched.waiting, &e->sched.running};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < arrlen(*lists[k]); i++) {
                llm_seq *s = (*lists[k])[i];
                if (s->req->id != aborts[a]) continue;
                llm_seq_finish(e, s, LLM_FINISH_ABORT, NULL);
                llm_emit(e, s);
                arrput(e->finished, s);
                arrdel(*lists[k], i);
                i--;
            }
    }
    arrfree(aborts);
}

/* 3. The scheduler plans the step: llm_schedule (section 5). Its plan is sched.scheduled[i], which computes
 *    sched.n_new[i] tokens from its n_computed on, and the block copies (copy_src to copy_dst) to make
 *    first. Within max_num_batched_tokens tokens and max_num_seqs sequences: the running sequences first,
 *    each its next token or prompt chunk (when the pool runs out, the youngest running one, or the lowest
 *    priority's, is preempted, and no one new is admitted that step); then the proposals of speculative
 *    decoding, from what is left; then waiting sequences in order, each taking what the prefix cache holds
 *    of its prompt before its blocks are counted, until one does not fit. A parked sequence is left out.
 *    Every block the plan writes is reserved by then: the forward pass cannot run out of blocks. */

/* 3-4. The step's batch, built in the b_* arrays by the draft's passes and the model's: emptied before
 * each */
static void llm_engine_batch_clear(llm_engine *e) {
    arrsetlen(e->b_tokens, 0); arrsetlen(e->b_positions, 0); arrsetlen(e->b_logit_rows, 0);
    arrsetlen(e->b_seq_start, 0); arrsetlen(e->b_tables, 0); arrsetlen(e->b_host_rows, 0);
    arrsetlen(e->b_row_seq, 0); arrsetlen(e->b_hidden_rows, 0);
}

/* 3-4. ... then seen as an llm_batch of n_seqs sequences, with the rows of logits it asks for made room for
 *      in *logits (the model's or the draft's, of vocab_size V: it only grows) */
static int llm_engine_batch_view(llm_engine *e, llm_batch *b, int n_seqs, float **logits, int *logits_rows,
                                 int V, char *err) {
    /* the batch points into the b_* arrays (no copy): valid until the next llm_engine_batch_clear */
    memset(b, 0, sizeof *b);
    b->n_tokens = (int)arrlen(e->b_tokens); b->tokens = e->b_tokens; b->positions = e->b_positions;
    b->n_seqs = n_seqs; b->seq_start = e->b_seq_start; b->block_tables = e->b_tables;
    b->n_logits = (int)arrlen(e->b_logit_rows); b->logit_rows = e->b_logit_rows;
    b->host_rows = e->b_host_rows;
    if (b->n_logits <= *logits_rows) return 0;
    /* too small: replaced, not realloc'ed (the old rows are done with, no need to copy them) */
    free(*logits);
    *logits_rows = b->n_logits;
    if ((*logits = (float *)malloc((size_t)b->n_logits * (size_t)V * sizeof(float)))) return 0;
    *logits_rows = 0;
    return llm_fail(err, "out of memory for %d rows of logits", b->n_logits);
}

/* 3. Then a draft model's proposals (spec_model_path). First the draft computes the tokens the model computes
 *    this step, from the first it has not (its K/V stay in step with the model's, in the same blocks: the
 *    prefix cache, the copies and preemption serve both), the copies first. Then each sequence that
 *    speculates decodes greedily from its last token, a pass for each proposed token; the last proposed
 *    token is not computed by the draft (the model computes it, and the draft next step if it is kept). A
 *    token outside the model's vocabulary ends a proposal, and the blocks past the shorter one go back. */
static int llm_engine_draft(llm_engine *e, char *err) {
    llm_scheduler *sch = &e->sched;
    int n_seqs = (int)arrlen(sch->scheduled), V = e->model.cfg.vocab_size, Vd = e->draft_model.cfg.vocab_size;
    int rc = 0, longest = 0;
    llm_sampling_params greedy = llm_sampling_defaults();
    greedy.temperature = 0;
    /* pass 0: for each scheduled sequence, the tokens the model computes this step (the proposal's aside)
     * that the draft has not computed yet; a speculating sequence's last token gives the logits that
     * propose token 0. Pass j > 0: proposed token j - 1 alone, whose logits propose token j. A proposal of
     * k tokens takes k passes, so the step makes as many passes as its longest proposal. */
    for (int pass = 0; rc == 0 && (pass == 0 || pass < longest); pass++) {
        llm_engine_batch_clear(e);
        for (int i = 0; i < n_seqs; i++) {
            llm_seq *s = sch->scheduled[i];
            int len = (int)arrlen(s->tokens), from = len + pass - 1, end = from + 1;
            if (pass == 0) { from = s->n_draft_computed; end = s->n_computed + sch->n_new[i] - s->n_draft; }
            else if (s->n_draft <= pass) continue;
            arrput(e->b_seq_start, (int32_t)arrlen(e->b_tokens));
            arrput(e->b_tables, s->block_tables[0]); /* the model's first group: every position */
            for (int pos = from; pos < end; pos++) {
                arrput(e->b_tokens, pos < len ? s->tokens[pos] : s->draft[pos - len]);
                arrput(e->b_positions, pos);
            }
            s->n_draft_computed = end;
            if (s->n_draft > longest) longest = s->n_draft;
            if (s->n_draft <= pass) continue;
            arrput(e->b_logit_rows, (int32_t)arrlen(e->b_tokens) - 1);
            arrput(e->b_host_rows, 0);
            arrput(e->b_row_seq, i);
        }
        if (arrlen(e->b_tokens) == 0) break; /* every proposal ended early */
        arrput(e->b_seq_start, (int32_t)arrlen(e->b_tokens));
        llm_batch b;
        int n_batch_seqs = (int)arrlen(e->b_seq_start) - 1;
        if ((rc = llm_engine_batch_view(e, &b, n_batch_seqs, &e->draft_logits,
                                        &e->draft_logits_rows, Vd, err)))
            break;
        if (pass == 0) { /* the model's copies, in the draft's blocks too */
            b.n_copies = (int)arrlen(sch->copy_src); b.copy_src = sch->copy_src; b.copy_dst = sch->copy_dst;
        }
        arrsetlen(e->sample_rows, b.n_logits); /* each proposed token: its row's argmax */
        for (int r = 0; r < b.n_logits; r++)
            e->sample_rows[r] = (llm_sample_row){.row = r, .params = &greedy};
        /* the draft's forward pass and its argmax per row, on the draft's backend; then each row's token
         * becomes the proposal's next, or ends it */
        double t0 = llm_now();
        rc = e->draft_backend->forward(e->draft_backend, &b, e->draft_logits, err);
        if (rc == 0)
            rc = e->draft_backend->sample(e->draft_backend, e->sample_rows, b.n_logits, e->draft_logits, err);
        e->stats.draft_seconds += llm_now() - t0;
        for (int r = 0; rc == 0 && r < b.n_logits; r++) {
            int i = e->b_row_seq[r];
            llm_seq *s = sch->scheduled[i];
            int32_t token = e->sample_rows[r].token;
            if (token >= 0 && token < V) { s->draft[pass] = token; continue; }
            sch->n_new[i] -= s->n_draft - pass; s->n_draft = pass; /* the proposal ends before it */
            llm_seq_trim_blocks(&e->bm, s, (int)arrlen(s->tokens) + pass);
        }
    }
    return rc;
}

/* 4. Whether the host reads s's next rows of logits itself: a grammar may mask the whole row. Any other
 *    sequence's rows (sampling, penalties, logit_bias, logprobs, the samples of n > 1, a proposal's) only go
 *    to the backend's sample step. */
static int llm_seq_reads_rows(const llm_seq *s) {
    return s->grammar != NULL;
}

/* 4. Whether an embedding pooled as pool reads the hidden state of position pos of its len tokens: mean
 *    every one, cls the first, last the last */
static int llm_pool_reads(int pool, int pos, int len) {
    return pool == LLM_POOL_MEAN || (pool == LLM_POOL_CLS && pos == 0) ||
           ((pool == LLM_POOL_LAST || pool == LLM_POOL_RANK) && pos == len - 1);
}

/* 4. The plan as one batch: each scheduled sequence's next n_new tokens, flattened, with its block table;
 *    logits for the sequences whose chunk reaches the end of their tokens, and for every prompt token of a
 *    chunk that scores its prompt (prompt_logprobs) but the last (its logits are the first sample's); the
 *    copy-on-write copies first. A step of three sequences: A decodes (7 tokens, 6 computed), B's prompt of
 *    10 tokens gets its first chunk of 4, C's prompt of 3 fits whole:
 *
 *      b_tokens      A6 | B0 B1 B2 B3 | C0 C1 C2      b_seq_start  0, 1, 5, 8
 *      b_positions    6 |  0  1  2  3 |  0  1  2      b_logit_rows 0, 7  (A's next token, C's first)
 *      b_tables      [A's, B's, C's] for group 0, then the same for group 1, ... (llm_batch.block_tables)
 *
 *    B's chunk gives no logits: its prompt goes on next step. With a proposal (A proposing d0 d1), A's part
 *    is A6 d0 d1 at positions 6 7 8, each with a row of logits, to verify d0 and d1 and draw one more. */
static int llm_engine_forward(llm_engine *e, char *err) {
    llm_scheduler *sch = &e->sched;
    int n_seqs = (int)arrlen(sch->scheduled), V = e->model.cfg.vocab_size;
    llm_engine_batch_clear(e);
    int prompt_step = 0;
    /* 1. Each scheduled sequence's tokens and positions, and the rows of logits it needs, in plan order */
    for (int i = 0; i < n_seqs; i++) {
        llm_seq *s = sch->scheduled[i];
        prompt_step |= s->n_computed < s->req->n_prompt;
        arrput(e->b_seq_start, (int32_t)arrlen(e->b_tokens));
        int scoring = s->plp_state == LLM_PLP_PENDING, n_prompt = s->req->n_prompt;
        int len = (int)arrlen(s->tokens), end = s->n_computed + sch->n_new[i], pool = s->req->params.pooling;
        for (int pos = s->n_computed; pos < end; pos++) { /* past the tokens: the proposal's */
            arrput(e->b_tokens, pos < len ? s->tokens[pos] : s->draft[pos - len]);
            arrput(e->b_positions, pos);
            if (pool) { /* an embedding: hidden rows, no logits */
                if (llm_pool_reads(pool, pos, len))
                    arrput(e->b_hidden_rows, (int32_t)arrlen(e->b_tokens) - 1);
                continue;
            }
            if ((scoring && pos < n_prompt - 1) || (end >= len && pos >= len - 1)) { /* the last, proposed */
                arrput(e->b_logit_rows, (int32_t)arrlen(e->b_tokens) - 1);
                int host = pos >= len - 1 && llm_seq_reads_rows(s); /* not a prompt token's: scored there */
                arrput(e->b_host_rows, (uint8_t)host);
                e->stats.host_rows += host; e->stats.logit_rows++;
            }
        }
    }
    /* 2. The end of the last sequence, and the block tables (pointers to the sequences' own arrays: the
     *    scheduler has given them every block the step writes) */
    arrput(e->b_seq_start, (int32_t)arrlen(e->b_tokens));
    for (int g = 0; g < sch->n_kv_groups; g++) /* group by group */
        for (int i = 0; i < n_seqs; i++) arrput(e->b_tables, sch->scheduled[i]->block_tables[g]);
    llm_batch b;
    if (llm_engine_batch_view(e, &b, n_seqs, &e->logits, &e->logits_rows, V, err)) return -1;
    b.n_hidden = (int)arrlen(e->b_hidden_rows); b.hidden_rows = e->b_hidden_rows;
    if (b.n_hidden > e->hidden_cap) { /* grows only; the old rows are done with */
        free(e->hidden);
        e->hidden = (float *)malloc((size_t)b.n_hidden * (size_t)e->model.cfg.dim * sizeof(float));
        e->hidden_cap = e->hidden ? b.n_hidden : 0;
        if (!e->hidden) return llm_fail(err, "out of memory for %d hidden rows", b.n_hidden);
    }
    b.hidden = e->hidden;
    /* 3. The forward pass: the copies, then every token's K/V written into its block, and the rows of
     *    logits asked for, in b_logit_rows' order (in e->logits: the host rows at least, llm_batch) */
    b.n_copies = (int)arrlen(sch->copy_src); b.copy_src = sch->copy_src; b.copy_dst = sch->copy_dst;
    double t0 = llm_now();
    int rc = e->backend->forward(e->backend, &b, e->logits, err);
    e->stats.forward_seconds += llm_now() - t0;
    e->stats.prompt_steps += prompt_step;
    return rc;
}

/* 4, when the forward pass failed: every sequence of the step finishes with the error; nothing else
 * changes. Whatever the failed pass wrote is in blocks that go back to the pool unnamed (the prefix cache
 * names a block only after a pass that computed it succeeded), so no later request reuses those values. */
static void llm_engine_fail_step(llm_engine *e) {
    if (!e->step_error[0]) /* a backend that gave no reason */
        snprintf(e->step_error, sizeof e->step_error, "the %s backend failed", e->backend->name);
    for (int i = 0; i < arrlen(e->sched.scheduled); i++)
        llm_seq_finish(e, e->sched.scheduled[i], LLM_FINISH_ERROR, e->step_error);
}

/* 5. Structured output. Under a grammar, the token sampled first is checked: most of the time the grammar
 *    allows it (a model asked for JSON mostly writes JSON), and that costs one walk of its bytes. When it
 *    does not, every token is checked (a mask, through the vocabulary's trie, or from the cache), the refused
 *    ones are masked out and the sampler draws again: the same distribution as masking first (a refused draw
 *    is thrown away), for the price of a mask only where one is needed. The ends of generation and the
 *    request's stop ids are allowed exactly where the text so far is a whole sentence. A mask costs
 *    microseconds or tens of milliseconds, as the grammar makes it (thousands of stacks in an ambiguous one),
 *    and a request's bytes choose the grammar. So no step waits for a mask: a sequence whose token was
 *    refused is parked, its row of logits copied into a job, and the engine's grammar thread builds the mask
 *    and draws again while the steps go on without it; the token is taken by the first step after. A costly
 *    grammar slows its own request, not the others (vLLM fills its masks beside the forward pass for the same
 *    reason). The checks stay in the step up to a budget, LLM_GRAMMAR_STEP_SHARE of the forward pass's time;
 *    past it the step's other grammar sequences are parked before their draw. A job draws with its sequence's
 *    own generator, so a seed gives the same tokens whichever thread draws. */

/* Whether the grammar lets token come next; a token that adds text leaves the state it leads to in next */
static int llm_seq_grammar_allows(const llm_engine *e, const llm_seq *s, int32_t token,
                                  llm_grammar_state *next) {
    const llm_sampling_params *p = &s->req->params;
    for (int i = 0; i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] == token) return llm_grammar_can_end(s->grammar) && !p->ignore_eos;
    if (p->ignore_eos && llm_tokenizer_is_eog(e->model.tok, token)) return 0; /* it would not end the text */
    return llm_gr_allows_into(s->grammar, e->trie, token, next);
}

/* The grammar thread's work on a parked sequence: the draw (unless the step made it), the check, and when the
 * token is refused the mask and the draw again from the tokens it allows; then the token's logprobs. Only
 * this thread builds masks, so the grammars' mask caches have one writer. */
static void llm_grammar_job_run(const llm_engine *e, llm_grammar_scratch *w, llm_grammar_job *j) {
    llm_seq *s = j->seq;
    const llm_sampling_params *p = &s->req->params;
    int V = e->model.cfg.vocab_size;
    double t0 = llm_now();
    j->error = NULL; j->tokens = 1; j->masks = j->masks_cached = 0;
    /* 1. The thread's room, made once and kept (w), and the state the token leads to (kept in the job) */
    if ((!w->sampler && !(w->sampler = llm_sampler_create(V, NULL))) ||
        (!w->mask && !(w->mask = (uint8_t *)malloc(((size_t)V + 7) / 8))) ||
        (!w->ids && !(w->ids = (int32_t *)malloc((size_t)V * sizeof(int32_t)))) ||
        (!w->logits && !(w->logits = (float *)malloc((size_t)V * sizeof(float)))) ||
        (!j->next && !(j->next = llm_grammar_state_copy(s->grammar)))) {
        j->error = "out of memory for the grammar's mask";
        return;
    }
    /* 2. The draw, unless the step made it, and the cheap check of the one token drawn */
    if (!j->drawn) llm_sampler_draw(w->sampler, &j->r, j->row);
    int32_t token = j->r.token;
    if (token >= 0 && !llm_seq_grammar_allows(e, s, token, j->next)) {
        /* 3. Refused: the mask of every token the grammar allows here (from the grammar's cache when this
         *    state was met before) */
        int64_t cached = llm_grammar_cache_hits(s->req->grammar);
        int n = llm_grammar_mask(s->grammar, e->trie, w->mask);
        j->masks = 1; j->masks_cached = llm_grammar_cache_hits(s->req->grammar) - cached;
        if (n < 0) {
            j->error = "the grammar's mask could not be built (out of memory, or the grammar is too "
                       "ambiguous)";
            j->seconds = llm_now() - t0;
            return;
        }
        /* 4. The request's stop ids are allowed exactly where the grammar may end; under ignore_eos no end
         *    of generation is (it would not end the text) */
        uint8_t *mask = w->mask;
        int can_end = llm_grammar_can_end(s->grammar) && !p->ignore_eos;
        for (int i = 0; i < p->n_stop_token_ids; i++) { /* stop ids end the text, as ends of generation do */
            int32_t t = p->stop_token_ids[i];
            if (t < 0 || t >= V) continue;
            if (can_end) mask[t >> 3] |= (uint8_t)(1u << (t & 7));
            else mask[t >> 3] &= (uint8_t)~(1u << (t & 7));
        }
        for (ptrdiff_t i = 0; p->ignore_eos && i < arrlen(e->model.tok->eog); i++) { /* would not end it */
            int32_t t = e->model.tok->eog[i];
            mask[t >> 3] &= (uint8_t)~(1u << (t & 7));
        }
        /* 5. The draw again, from the allowed tokens only (gathered: a mask allows a few as a rule, and the
         * refused ones would weigh nothing), with the request's penalties: the same draw as from the row
         * masked */
        const float *adjusted = llm_sampler_adjust(w->sampler, &j->r, j->row);
        const float *pen = llm_sampler_penalize(w->sampler, p, adjusted, s->tokens, s->req->n_prompt,
                                                (int)arrlen(s->tokens));
        int n_ids = 0;
        for (int i = 0; i < V; i += 8)
            for (unsigned bits = mask[i >> 3]; bits; bits &= bits - 1) {
                int t = i + __builtin_ctz(bits);
                if (t < V && pen[t] > -INFINITY) { w->ids[n_ids] = t; w->logits[n_ids++] = pen[t]; }
            }
        int32_t at = n_ids ? llm_sampler_pick(w->sampler, p, w->logits, n_ids, &s->rng) : -1;
        token = at >= 0 ? w->ids[at] : -1;
        if (token < 0 || !llm_seq_grammar_allows(e, s, token, j->next))
            j->error = "the grammar allows no token here that the request allows";
        j->r.token = token;
    }
    /* 6. The logprobs of the token taken (and the top ones, when asked), from the row as the model gave it */
    llm_sample_row_logprobs(&j->r, j->row, V);
    j->seconds = llm_now() - t0;
}

/* The grammar thread: the lock let go while a job runs; each one done wakes the engine's wait. Requests take
 * turns: the next job is the first of the request served least recently, so that one request's many costly
 * masks (n samples, every step) do not queue another's behind them. Its priority is lowered: the forward
 * passes' threads come first. */
static void *llm_grammar_thread(void *arg) {
    llm_engine *e = (llm_engine *)arg;
    llm_grammar_scratch w;
    memset(&w, 0, sizeof w);
    uint64_t turn = 0;
#ifdef __linux__
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
#endif
    pthread_mutex_lock(&e->lock);
    for (;;) {
        while (!arrlen(e->grammar_todo) && !e->grammar_quit) pthread_cond_wait(&e->grammar_added, &e->lock);
        if (e->grammar_quit) break;
        /* the next job: of the request whose last turn is oldest (0: never served) */
        int next = 0;
        for (int i = 1; i < arrlen(e->grammar_todo); i++)
            if (e->grammar_todo[i]->seq->req->grammar_turn < e->grammar_todo[next]->seq->req->grammar_turn)
                next = i;
        llm_grammar_job *j = e->grammar_todo[next];
        arrdel(e->grammar_todo, next);
        j->seq->req->grammar_turn = ++turn;
        pthread_mutex_unlock(&e->lock);
#ifdef LLM_TEST_GRAMMAR_JOB
        LLM_TEST_GRAMMAR_JOB(j->seq->req->id); /* the tests hold the thread here, and see whose turn it is */
#endif
        llm_grammar_job_run(e, &w, j);
        /* done: back to the engine, whose wait (llm_engine_wait or llm_engine_begin_step) it wakes */
        pthread_mutex_lock(&e->lock);
        arrput(e->grammar_done, j);
        pthread_cond_signal(&e->work_added);
    }
    pthread_mutex_unlock(&e->lock);
    llm_grammar_scratch_free(&w);
    return NULL;
}

/* s's draw goes to the grammar thread (drawn: r.token is drawn already, and refused): its row copied into a
 * job (a recycled one when there is one), s parked. Without the thread (it could not start) the job runs
 * here. */
static void llm_seq_park(llm_engine *e, llm_seq *s, const llm_sample_row *r, const float *logits, int drawn) {
    int V = e->model.cfg.vocab_size;
    llm_grammar_job *j = arrlen(e->grammar_spare) ? arrpop(e->grammar_spare)
                                                  : (llm_grammar_job *)calloc(1, sizeof(llm_grammar_job));
    if (j && !j->row) j->row = (float *)malloc((size_t)V * sizeof(float));
    if (!j || !j->row) {
        if (j) { llm_grammar_state_free(j->next); free(j); }
        llm_seq_finish(e, s, LLM_FINISH_ERROR, "out of memory for the grammar's job");
        return;
    }
    memcpy(j->row, logits, (size_t)V * sizeof(float));
    j->seq = s; j->r = *r; j->drawn = drawn;
    j->r.rng_state = &s->rng; j->r.top_ids = j->top_ids; j->r.top_logprobs = j->top_logprobs;
    s->parked = 1;
    e->grammar_in_flight++;
    /* the thread starts with the first job: an engine that never meets a costly grammar never has one; if it
     * cannot start, each job runs here, at once (slower steps, the same tokens) */
    if (!e->grammar_thread_on && !e->grammar_thread_failed) {
        if (pthread_create(&e->grammar_thread, NULL, llm_grammar_thread, e) == 0) e->grammar_thread_on = 1;
        else e->grammar_thread_failed = 1;
    }
    if (!e->grammar_thread_on) llm_grammar_job_run(e, &e->grammar_here, j); /* no thread: the job now, here */
    pthread_mutex_lock(&e->lock);
    if (e->grammar_thread_on) { arrput(e->grammar_todo, j); pthread_cond_signal(&e->grammar_added); }
    else arrput(e->grammar_done, j);
    pthread_mutex_unlock(&e->lock);
}

/* 5. The sampling of s's next token, as a row for a sample step: its request's parameters, its tokens so
 *    far, its generator; the top logprobs' room is given later */
static llm_sample_row llm_seq_sample_row(const llm_engine *e, llm_seq *s, int row) {
    llm_sample_row r;
    memset(&r, 0, sizeof r);
    r.row = row; r.params = &s->req->params; r.rng_state = &s->rng;
    r.history = s->tokens; r.n_prompt = s->req->n_prompt; r.n_history = (int)arrlen(s->tokens);
    if (e->model.tok) { r.eog = e->model.tok->eog; r.n_eog = (int)arrlen(e->model.tok->eog); }
    return r;
}

/* 5. Room for the top logprobs of n rows' draws, in the engine's scratch (what it held before is done; a
 *    scored row's go to its sequence's prompt logprobs) */
static int llm_sample_row_n_top(const llm_sample_row *r) {
    return r->score || r->params->logprobs <= 0 ? 0 : r->params->logprobs;
}
static void llm_engine_top_room(llm_engine *e, llm_sample_row *rows, int n) {
    size_t k = 0;
    for (int i = 0; i < n; i++) k += (size_t)llm_sample_row_n_top(&rows[i]);
    arrsetlen(e->top_ids, k); arrsetlen(e->top_logprobs, k);
    for (int i = 0, at = 0; i < n; i++) {
        if (!llm_sample_row_n_top(&rows[i])) continue; /* none (no array at all when k = 0) */
        rows[i].top_ids = e->top_ids + at; rows[i].top_logprobs = e->top_logprobs + at;
        at += llm_sample_row_n_top(&rows[i]);
    }
}

/* 5. One sampled token for s (r: its draw): the logprobs asked for, the token, then the stop conditions (end
 *    of generation, stop ids, max_tokens, the context, the pool) and its text. A draw of -1 (a row that was
 *    not finite) or -2 (no token left to pick) finishes s with the error; -3: s is finished already. */
static void llm_seq_accept(llm_engine *e, llm_seq *s, const llm_sample_row *r) {
    const llm_sampling_params *p = &s->req->params;
    int V = e->model.cfg.vocab_size, n_prompt = s->req->n_prompt;
    int32_t token = r->token;
    if (token == -1) /* a broken model: never sample from it */
        llm_seq_finish(e, s, LLM_FINISH_ERROR, "the model's logits are not finite numbers (NaN or infinite)");
    if (token == -2)
        llm_seq_finish(e, s, LLM_FINISH_ERROR, "sampling found no token to pick: the logits are not numbers");
    if (token < 0) return; /* finished with the reason */
    /* 1. Into the output: the logprobs asked for, then the token itself, in the sequence and the output */
    if (p->logprobs >= 0) {
        int K = p->logprobs < V ? p->logprobs : V;
        if (K > 0) {
            memcpy(arraddnptr(s->out_top_ids, K), r->top_ids, (size_t)K * sizeof(int32_t));
            memcpy(arraddnptr(s->out_top_logprobs, K), r->top_logprobs, (size_t)K * sizeof(float));
        }
        arrput(s->out_logprobs, r->logprob);
    }
    arrput(s->tokens, token); arrput(s->out_tokens, token);
    e->stats.generation_tokens++;
    /* 2. The stop conditions on the token: an end of generation (unless ignore_eos) or a stop id */
    int n_tokens = (int)arrlen(s->tokens), reason = LLM_FINISH_NONE;
    const llm_tokenizer *tok = e->model.tok;
    if (!p->ignore_eos && tok && llm_tokenizer_is_eog(tok, token)) reason = LLM_FINISH_STOP;
    for (int i = 0; i < p->n_stop_token_ids; i++) if (p->stop_token_ids[i] == token) reason = LLM_FINISH_STOP;
    int hidden = reason == LLM_FINISH_STOP; /* a stop token's own text is not output */
    /* 3. The grammar moves on: e->grammar_next, filled by the check that allowed the token, becomes s's
     *    state, and s's old state becomes the scratch for the next check (a swap, no copy) */
    if (s->grammar && !hidden) { /* the state the token leads to; whole, with nothing to follow: stop */
        llm_grammar_state *moved = e->grammar_next;
        e->grammar_next = s->grammar; s->grammar = moved;
        if (llm_grammar_done(s->grammar)) reason = LLM_FINISH_STOP;
    }
    /* out of room: max_tokens, the model's context, or (a tiny pool) the whole KV pool, which the next token
     * could not fit in */
    if (!reason && ((p->max_tokens > 0 && n_tokens - n_prompt >= p->max_tokens) ||
                    n_tokens >= e->max_model_len || llm_engine_blocks_for(e, n_tokens) > e->bm.num_blocks))
        reason = LLM_FINISH_LENGTH;
    /* 4. The text: the detokenizer and the stop strings (llm_seq_push_text, section 9), which may finish s
     *    too; a finish gives s's blocks back at once */
    llm_seq_push_text(s, hidden ? -1 : token, tok, reason != LLM_FINISH_NONE);
    if (s->finish_reason) reason = s->finish_reason; /* a stop string */
    if (reason) llm_seq_finish(e, s, reason, NULL);
}

/* 5. s's next token from its row of logits on the host (a grammar's): the sample step's draw, as the backends
 *    make it, and the grammar's check, within the step's budget for them; then taken (llm_seq_accept). A
 *    refused token, or a draw past the budget, parks s (its token comes from the grammar thread): 1 then. */
static int llm_seq_sample_on_host(llm_engine *e, llm_seq *s, const float *logits) {
    int V = e->model.cfg.vocab_size;
    char err[LLM_ERR_LEN];
    if (!e->trie && !(e->trie = llm_token_trie_build(e->model.tok, err))) { /* once: not in grammar_seconds */
        llm_seq_finish(e, s, LLM_FINISH_ERROR, "out of memory for the vocabulary's trie");
        return 0;
    }
    /* 1. The step's budget for grammar checks spent: no draw here, the whole of it goes to the thread */
    llm_sample_row r = llm_seq_sample_row(e, s, 0);
    if (e->grammar_step_seconds > e->grammar_step_budget) { llm_seq_park(e, s, &r, logits, 0); return 1; }
    /* 2. The draw from the unmasked row, and the one check of the token drawn (e->grammar_next: its state) */
    double t0 = llm_now();
    if (!e->grammar_next && !(e->grammar_next = llm_grammar_state_copy(s->grammar))) {
        llm_seq_finish(e, s, LLM_FINISH_ERROR, "out of memory for the grammar's state");
        return 0;
    }
    llm_engine_top_room(e, &r, 1);
    llm_sampler_draw(e->sampler, &r, logits);
    int allowed = r.token < 0 || llm_seq_grammar_allows(e, s, r.token, e->grammar_next);
    double seconds = llm_now() - t0;
    e->grammar_step_seconds += seconds;
    /* 3. Refused: the mask is the thread's; allowed: taken now, as any sampled token */
    if (!allowed) { llm_seq_park(e, s, &r, logits, 1); return 1; }
    e->stats.grammar_tokens += r.token >= 0; e->stats.grammar_seconds += seconds;
    llm_sample_row_logprobs(&r, logits, V);
    llm_seq_accept(e, s, &r);
    return 0;
}

/* 1. The grammar thread's finished jobs: each parked sequence takes its token (or fails with the job's
 *    error); one that finished while parked (aborted) is freed now, its job being done with it. This runs
 *    before the scheduler: a sequence whose token came back is unparked and planned in this very step. */
static void llm_engine_take_grammar_jobs(llm_engine *e) {
    pthread_mutex_lock(&e->lock);
    llm_grammar_job **done = e->grammar_done;
    e->grammar_done = NULL;
    pthread_mutex_unlock(&e->lock);
    for (int i = 0; i < arrlen(done); i++) {
        llm_grammar_job *j = done[i];
        llm_seq *s = j->seq;
        s->parked = 0; e->grammar_in_flight--;
        e->stats.grammar_tokens += j->tokens; e->stats.grammar_masks += j->masks;
        e->stats.grammar_masks_cached += j->masks_cached; e->stats.grammar_seconds += j->seconds;
        /* aborted while parked: it is in parked_finished (moved there by llm_engine_begin_step), and the job
         * was its last user */
        if (s->status == LLM_SEQ_FINISHED) {
            for (int k = 0; k < arrlen(e->parked_finished); k++)
                if (e->parked_finished[k] == s) { arrdelswap(e->parked_finished, k); break; }
            llm_seq_free(s);
        } else { /* the token taken as if the step had drawn it: stop conditions, text, output this step */
            if (j->error) llm_seq_finish(e, s, LLM_FINISH_ERROR, j->error);
            else {
                llm_grammar_state *next = j->next; /* the state the token leads to, for llm_seq_accept */
                j->next = e->grammar_next; e->grammar_next = next;
                llm_seq_accept(e, s, &j->r);
            }
            if (s->status == LLM_SEQ_FINISHED) /* out now: the scheduler plans running sequences only */
                for (int k = 0; k < arrlen(e->sched.running); k++)
                    if (e->sched.running[k] == s) {
                        llm_emit(e, s);
                        arrput(e->finished, s);
                        arrdel(e->sched.running, k);
                        break;
                    }
        }
        j->seq = NULL;
        arrput(e->grammar_spare, j);
    }
    arrfree(done);
}

/* 5. A draw of the sample step taken: the sequence's generator where the draw left it, then the token */
static void llm_seq_take(llm_engine *e, llm_seq *s, const llm_sample_row *r) {
    s->rng = *r->rng_state;
    llm_seq_accept(e, s, r);
}

/* 5. Speculative decoding: the rows of the last token and of the proposal's tokens (from logit row `row`),
 *    taken in turn as if each came alone (stop strings, max_tokens, logprobs, penalties see each), while the
 *    token sampled is the one proposed: its K/V, computed from it, stand. A sampled token is exactly the
 *    model's draw, so a proposed one is kept with the probability the model gives it and, when not, the
 *    token drawn instead follows the model's distribution without it: the rejection-sampling rule with a
 *    one-hot proposal; the same tokens, greedily. The rows were drawn in the sample step (drawn[j]: after the
 *    tokens and the proposal's first j, the generator as j draws leave it), or are drawn on the host now (a
 *    grammar's, drawn NULL). The blocks past what was kept go back to the pool. For example a proposal
 *    d0 d1 d2 has rows r0..r3: r0 draws t0 = d0, kept (d0's K/V stand); r1 draws t1 != d1: t1 is taken
 *    and the check stops. Two new tokens (d0, t1), one accepted; d1's and d2's K/V are thrown away (t1's
 *    position is computed next step). Had all three been kept, r3 would give a fourth token. */
static void llm_seq_verify(llm_engine *e, llm_seq *s, int row, const llm_sample_row *drawn) {
    int V = e->model.cfg.vocab_size, n_draft = s->n_draft, accepted = 0;
    for (int j = 0; j <= n_draft; j++) {
        if (drawn) llm_seq_take(e, s, &drawn[j]);
        else if (llm_seq_sample_on_host(e, s, e->logits + (size_t)(row + j) * V)) break; /* parked: the
                                          * proposal's rest is recomputed after the token, as if refused */
        if (s->status == LLM_SEQ_FINISHED || j == n_draft || s->tokens[arrlen(s->tokens) - 1] != s->draft[j])
            break;
        s->n_computed++; accepted++;
        e->stats.spec_accepted_at[j]++;
    }
    e->stats.spec_drafts++; e->stats.spec_draft_tokens += n_draft; e->stats.spec_accepted_tokens += accepted;
    s->n_draft = 0;
    /* the next proposals (llm_seq_speculate's rule): as long as this one's kept part (at least 1), or twice
     * this one's cap (spec_tokens at most) when all was kept; and while the recent share kept is under 85%,
     * a wait of some steps without any, doubling each time (64 at most) */
    int most = e->sched.spec_tokens;
    s->spec_cap = accepted < n_draft ? (accepted > 1 ? accepted : 1)
                                     : 2 * s->spec_cap < most ? 2 * s->spec_cap : most;
    s->spec_rate = 0.5f * s->spec_rate + 0.5f * (float)accepted / (float)n_draft;
    if (s->spec_rate >= 0.85f) s->spec_backoff = 1;
    else {
        s->spec_wait = s->spec_backoff;
        s->spec_backoff = s->spec_backoff < 64 ? 2 * s->spec_backoff : 64;
    }
    if (s->status == LLM_SEQ_FINISHED) return; /* its blocks went back */
    /* the refused tokens' K/V: the blocks past the tokens go back, and the draft model's count (it computed
     * the proposal's tokens up to the last) falls back to the model's */
    if (s->n_draft_computed > s->n_computed) s->n_draft_computed = s->n_computed;
    llm_seq_trim_blocks(&e->bm, s, (int)arrlen(s->tokens));
    llm_seq_hash_blocks(&e->bm, s);
}

/* 5. A row for the sample step: s's, drawn with a copy of the generator at rng */
static void llm_engine_queue_row(llm_engine *e, llm_seq *s, llm_sample_row r, uint64_t rng) {
    arrput(e->sample_rows, r);
    arrput(e->sample_seqs, s);
    arrput(e->sample_rngs, rng);
}

/* 5. s draws its next token from logit row `row`: on the host now if it reads its rows there (a grammar),
 *    else in the sample step, with a copy of its generator */
static void llm_engine_draw(llm_engine *e, llm_seq *s, int row) {
    if (llm_seq_reads_rows(s)) {
        llm_seq_sample_on_host(e, s, e->logits + (size_t)row * e->model.cfg.vocab_size);
        return;
    }
    llm_engine_queue_row(e, s, llm_seq_sample_row(e, s, row), s->rng);
}

/* 5. ... a proposal's rows, from logit row `row`: row j after the tokens and the proposal's first j ... */
static void llm_engine_draw_proposal(llm_engine *e, llm_seq *s, int row) {
    /* row j's penalties see the tokens and the proposal's first j as history (spec_history, which lives in s
     * until the sample step has read it), and its generator is where j draws would leave it */
    int len = (int)arrlen(s->tokens);
    arrsetlen(s->spec_history, 0);
    memcpy(arraddnptr(s->spec_history, len), s->tokens, (size_t)len * sizeof(int32_t));
    memcpy(arraddnptr(s->spec_history, s->n_draft), s->draft, (size_t)s->n_draft * sizeof(int32_t));
    for (int j = 0; j <= s->n_draft; j++) {
        llm_sample_row r = llm_seq_sample_row(e, s, row + j);
        r.history = s->spec_history; r.n_history = len + j;
        llm_engine_queue_row(e, s, r, llm_sampling_rng_after(&s->req->params, s->rng, j));
    }
}

/* 5. ... and prompt logprobs: the row of logits at prompt position pos scores prompt token pos + 1, as a
 *    sampled token is scored, into s's prompt logprobs */
static void llm_engine_score(llm_engine *e, llm_seq *s, int pos, int row) {
    int V = e->model.cfg.vocab_size, K = s->req->params.prompt_logprobs;
    if (K > V) K = V;
    llm_sample_row r = llm_seq_sample_row(e, s, row);
    r.score = 1; r.n_history = pos + 1;
    r.top_ids = s->plp_top_ids + (size_t)pos * K; r.top_logprobs = s->plp_top + (size_t)pos * K;
    llm_engine_queue_row(e, s, r, s->rng); /* (no draw: the generator stays) */
}

/* 5. A reranker's relevance logit from the last position's hidden state h (final-normed): the classifier's
 *    first row times h less its second (so the score, its sigmoid, is the softmax probability of the first
 *    label: Qwen3-Reranker's "yes"), plus the bias; a model without cls.output takes the output layer's rows
 *    of rank_ids (the same rows llama.cpp's converter copies into cls.output). In double: one dot per row.
 *    row: room for dim values, each row converted there in turn */
static float llm_rank_logit(const llm_model *m, const double *h, const int *rank_ids, float *row) {
    int D = m->cfg.dim, n_rows = m->cls_out.data ? (int)m->cls_out.rows : 2;
    double logit = 0;
    for (int r = 0; r < n_rows; r++) {
        llm_weight w = m->cls_out.data ? m->cls_out : m->output;
        int64_t index = m->cls_out.data ? r : rank_ids[r];
        size_t row_bytes = llm_dtype_row_bytes(w.type, D);
        llm_dtype_dequant_row(w.type, (const uint8_t *)w.data + (size_t)index * row_bytes, row, D);
        double dot = m->cls_out_bias.data ? ((const float *)m->cls_out_bias.data)[r] : 0;
        for (int i = 0; i < D; i++) dot += (double)row[i] * h[i];
        logit += r == 0 ? dot : -dot;
    }
    return (float)logit;
}

/* 5. ... and embeddings: a chunk's hidden rows (from row on: as llm_engine_forward asked for them) into s's
 *    pool; the chunk that ends the prompt finishes s with the vector (the mean, or the one row kept).
 *    Returns how many rows it took. */
static int llm_seq_pool(llm_engine *e, llm_seq *s, int start, int end, int row) {
    int D = e->model.cfg.dim, pool = s->req->params.pooling, len = (int)arrlen(s->tokens), n = 0;
    if (start == 0) { memset(s->pool, 0, (size_t)D * sizeof(double)); s->pool_rows = 0; } /* anew */
    for (int pos = start; pos < end; pos++) {
        if (!llm_pool_reads(pool, pos, len)) continue;
        const float *h = e->hidden + (size_t)(row + n++) * D;
        for (int i = 0; i < D; i++) s->pool[i] += h[i];
        s->pool_rows++;
    }
    if (end < len) return n; /* a prompt chunk: more rows to come */
    if (pool == LLM_POOL_RANK) /* (the vector's room is the rows' scratch: its one value is the logit) */
        s->embedding[0] = llm_rank_logit(&e->model, s->pool, s->req->params.rank_ids, s->embedding);
    else
        for (int i = 0; i < D; i++) s->embedding[i] = (float)(s->pool[i] / (s->pool_rows ? s->pool_rows : 1));
    llm_seq_finish(e, s, LLM_FINISH_STOP, NULL);
    return n;
}

/* 5. The step's tokens are computed: full blocks are named for the prefix cache, prompt tokens are scored
 *    (prompt_logprobs), and each sequence at the end of its tokens draws the next one (n > 1: the prompt
 *    forks first; each sample draws from its row), or checks its proposal. The draws the host does not make
 *    itself are the backend's sample step, all at once, where the logits are; then their tokens are taken. */
static void llm_engine_sample(llm_engine *e) {
    llm_scheduler *sch = &e->sched;
    int row = 0, hidden_row = 0;
    arrsetlen(e->sample_rows, 0); arrsetlen(e->sample_seqs, 0); arrsetlen(e->sample_rngs, 0);
    /* 1. Walk the plan in the batch's order; `row` follows the logit rows llm_engine_forward asked for, in
     *    the same order. A host draw (a grammar's) happens now; every other draw and every prompt score is
     *    queued as a row for the sample step */
    for (int i = 0; i < arrlen(sch->scheduled); i++) {
        llm_seq *s = sch->scheduled[i];
        int start = s->n_computed, end = start + sch->n_new[i], n_prompt = s->req->n_prompt;
        /* a decoding sequence with a proposal: its n_draft + 1 rows are checked together (llm_seq_verify),
         * now if it draws on the host, else after the sample step */
        if (s->n_draft) { /* its last token computed, and the proposal's, whose K/V stand only if kept */
            s->n_computed = start + 1;
            if (llm_seq_reads_rows(s)) llm_seq_verify(e, s, row, NULL);
            else llm_engine_draw_proposal(e, s, row);
            row += sch->n_new[i];
            continue;
        }
        /* the chunk's K/V are in the cache now: its full blocks get their prefix-cache names */
        if (start < n_prompt) e->stats.prompt_tokens_computed += (end < n_prompt ? end : n_prompt) - start;
        s->n_computed = end;
        llm_seq_hash_blocks(&e->bm, s);
        if (s->req->params.pooling) { hidden_row += llm_seq_pool(e, s, start, end, hidden_row); continue; }
        for (int pos = start; s->plp_state == LLM_PLP_PENDING && pos < end && pos < n_prompt - 1; pos++)
            llm_engine_score(e, s, pos, row++);
        if (end < arrlen(s->tokens)) continue; /* a prompt chunk: nothing to sample yet */
        if (s->plp_state == LLM_PLP_PENDING) s->plp_state = LLM_PLP_READY; /* all scored: out this step */
        /* the prompt is done: with n > 1 the samples 1..n-1 fork from it now (sharing its blocks), and all n
         * draw their first token from the same row, each with its own generator */
        if (s->fork_pending) {
            int first_child = (int)arrlen(sch->running);
            if (llm_seq_fork(sch, s) != 0) {
                llm_seq_finish(e, s, LLM_FINISH_ERROR, "out of memory for the samples of a request");
                row++;
                continue;
            }
            for (int k = first_child; k < arrlen(sch->running); k++) llm_engine_draw(e, sch->running[k], row);
        }
        llm_engine_draw(e, s, row++);
    }
    /* 2. The sample step: the queued rows drawn all at once on the backend, each with a copy of its
     *    sequence's generator (sample_rngs: a proposal's rows start from different states) */
    int n = (int)arrlen(e->sample_rows);
    if (!n) return;
    llm_engine_top_room(e, e->sample_rows, n);
    for (int i = 0; i < n; i++) e->sample_rows[i].rng_state = &e->sample_rngs[i];
    double t0 = llm_now();
    int rc = e->backend->sample(e->backend, e->sample_rows, n, e->logits, e->step_error);
    e->stats.sample_seconds += llm_now() - t0;
    /* 3. The draws taken, in the order queued: a score into the prompt logprobs, a token accepted, a
     *    proposal's n_draft + 1 rows verified together; a failed sample step fails those sequences */
    for (int i = 0; i < n; i++) {
        llm_seq *s = e->sample_seqs[i];
        if (rc != 0) {
            if (s->status != LLM_SEQ_FINISHED)
                llm_seq_finish(e, s, LLM_FINISH_ERROR, e->step_error[0] ? e->step_error :
                               "the backend's sample step failed");
            continue;
        }
        llm_sample_row *r = &e->sample_rows[i];
        if (r->score) { /* a prompt token's */
            s->plp[r->n_history - 1] = r->logprob; s->plp_rank[r->n_history - 1] = r->rank;
            continue;
        }
        if (!s->n_draft) { llm_seq_take(e, s, r); continue; }
        int rows = s->n_draft + 1; /* its proposal's, checked in turn */
        llm_seq_verify(e, s, 0, r);
        i += rows - 1;
    }
}

/* 6. Outputs: every running sequence with something new, or finished, gives one; the finished leave now.
 *    arrdel, not a swap: running stays in the order sequences were admitted (or forked), the order the
 *    scheduler serves them in and preempts the youngest by. A sequence that only computed a prompt chunk
 *    gives none. */
static void llm_engine_collect(llm_engine *e) {
    llm_scheduler *sch = &e->sched;
    for (int i = 0; i < arrlen(sch->running); i++) {
        llm_seq *s = sch->running[i];
        if (arrlen(s->out_tokens) || arrlen(s->out_text) || s->status == LLM_SEQ_FINISHED) llm_emit(e, s);
        if (s->status == LLM_SEQ_FINISHED) { arrput(e->finished, s); arrdel(sch->running, i); i--; }
    }
}

/* One step: the numbers are those of the functions above. Returns how many outputs *outputs holds (0 when
 * nothing happened); they are e->outputs, valid until the next call. A step never fails as a whole: a
 * failed draft or forward pass finishes the step's sequences with LLM_FINISH_ERROR (llm_engine_fail_step),
 * a failed sample step those whose rows it held, and the step still hands out their outputs. The grammar
 * checks' budget is LLM_GRAMMAR_STEP_SHARE of this step's own draft and forward time: once the checks have
 * spent it, the step's remaining grammar draws are parked (a share below 0, from the tests, parks all). */
int llm_engine_step(llm_engine *e, const llm_output **outputs) {
    /* 1. The last step's finished sequences freed, the outputs emptied; tokens from the grammar thread */
    llm_engine_begin_step(e);
    llm_engine_take_grammar_jobs(e);
    /* 2. New requests and aborts */
    llm_engine_take_inbox(e);
    /* 3. The plan: who computes how many tokens, with which blocks (prefix cache, preemption, proposals) */
    llm_schedule(&e->sched);
    if (arrlen(e->sched.scheduled) > 0) {
        /* 3-4. The draft's passes, then the model's forward pass; 5. sampling, stop conditions and text */
        double t0 = llm_now();
        if ((!e->draft_backend || llm_engine_draft(e, e->step_error) == 0) &&
            llm_engine_forward(e, e->step_error) == 0) {
            e->stats.steps++;
            e->grammar_step_seconds = 0;
            e->grammar_step_budget = e->grammar_step_share * (llm_now() - t0);
            if (e->grammar_step_share > 0 && e->grammar_step_budget < LLM_GRAMMAR_STEP_MIN_S)
                e->grammar_step_budget = LLM_GRAMMAR_STEP_MIN_S;
            llm_engine_sample(e);
        } else llm_engine_fail_step(e);
    }
    /* 6. The outputs. A step that did nothing, with grammar jobs out, makes the next one sleep until news
     *    (llm_engine_begin_step) rather than spin */
    llm_engine_collect(e);
    e->step_idle = arrlen(e->sched.scheduled) == 0 && arrlen(e->outputs) == 0;
    *outputs = e->outputs;
    return (int)arrlen(e->outputs);
}

/* ---- Looking inside ------------------------------------------------------------------------------------ */
/* For monitoring (the server's /metrics and the benchmarks read get_stats) and for tests (check_blocks):
 * neither changes the engine. */
/* A copy of the counters, by value: the engine's own (e->stats), plus what the scheduler and the block
 * manager count and a look at the queues now. The engine's thread only (it reads the queues unlocked):
 * server.c copies it after each step for its other threads. backend and backend_note live as long as e. */
llm_engine_stats llm_engine_get_stats(llm_engine *e) {
    llm_engine_stats s = e->stats;
    s.backend = e->backend->name; s.backend_kernels = e->backend->kernels; s.backend_note = e->backend_note;
    s.block_size = e->cfg.block_size; s.max_model_len = e->max_model_len;
    s.kv_bytes_per_block = llm_kv_bytes_per_block(&e->model.cfg, s.block_size, e->backend->kv_head_bytes);
    s.kv_groups = e->sched.n_kv_groups; s.spec_tokens = e->sched.spec_tokens;
    s.running = (int)arrlen(e->sched.running); s.waiting = (int)arrlen(e->sched.waiting);
    s.num_blocks = e->bm.num_blocks; s.num_free_blocks = e->bm.num_free_blocks;
    s.num_cached_blocks = (int)hmlen(e->bm.cached);
    s.preemptions = e->sched.preemptions;
    s.prefix_cache_queries = e->sched.prefix_cache_queries; s.prefix_cache_hits = e->sched.prefix_cache_hits;
    for (int i = 0; i < arrlen(e->sched.running); i++) s.kv_tokens += e->sched.running[i]->n_computed;
    return s;
}

int llm_engine_check_blocks(llm_engine *e, char *err) {
    llm_block_manager *bm = &e->bm;
    int *refs = (int *)calloc((size_t)bm->num_blocks, sizeof(int)), rc = 0;
    if (!refs) return llm_fail(err, "out of memory");
    /* 1. Count the block tables' references to each block (waiting sequences too, which should hold none) */
    llm_seq **lists[2] = {e->sched.running, e->sched.waiting};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < arrlen(lists[k]); i++)
            for (int g = 0; g < e->sched.n_kv_groups; g++)
                for (int b = 0; b < arrlen(lists[k][i]->block_tables[g]); b++) {
                    int id = lists[k][i]->block_tables[g][b];
                    if (id == -1 && e->sched.kv_window[g] > 0) continue; /* slid out of a local window */
                    if (id < 0 || id >= bm->num_blocks) {
                        rc = llm_fail(err, "block table holds block %d, outside the pool", id);
                        goto done;
                    }
                    refs[id]++;
                }
    /* 2. Each block's ref_count is that count: a leak (too high) or a block reused while held (too low) */
    int n_free = 0;
    for (int id = 0; id < bm->num_blocks; id++) {
        if (bm->blocks[id].ref_count != refs[id]) {
            rc = llm_fail(err, "block %d has ref_count %d but %d block tables hold it", id,
                          bm->blocks[id].ref_count, refs[id]);
            goto done;
        }
        n_free += refs[id] == 0;
    }
    /* the free list links exactly the unreferenced blocks, each once (refs[] now marks the ones walked) */
    int walked = 0;
    for (int id = bm->free_head; id >= 0 && walked <= bm->num_blocks; id = bm->blocks[id].next_free) {
        walked++;
        if (refs[id] != 0) {
            rc = llm_fail(err, "block %d is in the free list but %s", id,
                          refs[id] > 0 ? "referenced" : "linked twice");
            goto done;
        }
        refs[id] = -1;
    }
    if (n_free != bm->num_free_blocks || walked != n_free) {
        rc = llm_fail(err, "%d blocks are unreferenced, num_free_blocks says %d, the free list links %d",
                      n_free, bm->num_free_blocks, walked);
        goto done;
    }
    /* 3. The prefix cache: each hash names a block that carries it */
    for (ptrdiff_t i = 0; i < hmlen(bm->cached); i++) {
        int id = bm->cached[i].value;
        if (id < 0 || id >= bm->num_blocks || bm->blocks[id].hash != bm->cached[i].key) {
            rc = llm_fail(err, "the prefix cache names block %d for a hash it does not carry", id);
            goto done;
        }
    }
done:
    free(refs);
    return rc;
}

/* ===========================================================================================================
 * 11. JSON
 * RFC 8259's JSON, read strictly (errors say where) and written as Python's json.dumps writes it
 * (what chat templates' tojson writes). A layer: the core needs none of it; the tools, the
 * schemas and the server's requests are read with it.
 * ======================================================================================================== */
/* ---- JSON: the reader (RFC 8259, strict; errors say where) --------------------------------------------- */
typedef struct { const char *p, *start, *end; char *err; } llm_json_reader;

void llm_json_free(llm_json *v) {
    if (!v) return;
    for (int i = 0; i < v->n; i++) { llm_json_free(&v->items[i]); if (v->keys) free(v->keys[i]); }
    free(v->items); free(v->keys); free(v->str);
    memset(v, 0, sizeof *v);
}

static int llm_json_fail(llm_json_reader *r, const char *what) {
    if (!r->err[0]) llm_fail(r->err, "%s at byte %ld", what, (long)(r->p - r->start));
    return -1;
}

static void llm_json_space(llm_json_reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static int llm_json_hex4(llm_json_reader *r, unsigned *out) {
    if (r->end - r->p < 4) return llm_json_fail(r, "a \\u escape is cut short");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int d = llm_hex_digit((unsigned char)r->p[i]);
        if (d < 0) return llm_json_fail(r, "a \\u escape needs four hex digits");
        v = v * 16 + (unsigned)d;
    }
    r->p += 4;
    *out = v;
    return 0;
}

static int llm_json_string_body(llm_json_reader *r, char **out, size_t *len) {
    char *b = NULL; /* stb_ds */
    int rc = -1;
    r->p++; /* the opening quote */
    for (;;) {
        if (r->p >= r->end) { llm_json_fail(r, "a string is not closed"); break; }
        unsigned char c = (unsigned char)*r->p;
        if (c == '"') { r->p++; rc = 0; break; }
        if (c < 0x20) { llm_json_fail(r, "a control character inside a string"); break; }
        if (c == '\\') {
            if (r->end - r->p < 2) { llm_json_fail(r, "an escape is cut short"); break; }
            char e = r->p[1];
            r->p += 2;
            const char *simple = strchr("\"\\/bfnrt", e);
            if (e && simple) { arrput(b, "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"]); continue; }
            if (e != 'u') { llm_json_fail(r, "an unknown escape"); break; }
            unsigned cp, lo;
            if (llm_json_hex4(r, &cp) != 0) break;
            if (cp >= 0xdc00 && cp <= 0xdfff) { llm_json_fail(r, "a lone low surrogate"); break; }
            if (cp >= 0xd800 && cp <= 0xdbff) { /* a high surrogate: its low half must follow */
                if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u') {
                    llm_json_fail(r, "a high surrogate without its low surrogate");
                    break;
                }
                r->p += 2;
                if (llm_json_hex4(r, &lo) != 0) break;
                if (lo < 0xdc00 || lo > 0xdfff) { llm_json_fail(r, "a bad surrogate pair"); break; }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            char u[4];
            int n = llm_utf8_encode(cp, u);
            memcpy(arraddnptr(b, n), u, (size_t)n);
            continue;
        }
        int n = llm_utf8_check((const unsigned char *)r->p, (size_t)(r->end - r->p));
        if (n <= 0) { llm_json_fail(r, "invalid UTF-8 in a string"); break; }
        memcpy(arraddnptr(b, n), r->p, (size_t)n);
        r->p += n;
    }
    if (rc == 0) {
        size_t n = (size_t)arrlen(b);
        *out = (char *)malloc(n + 1);
        if (*out) { if (n) memcpy(*out, b, n); (*out)[n] = 0; *len = n; }
        else rc = llm_json_fail(r, "out of memory");
    }
    arrfree(b);
    return rc;
}

static int llm_json_number(llm_json_reader *r, llm_json *v) {
    const char *s = r->p;
    if (*r->p == '-') r->p++;
    if (r->p < r->end && *r->p == '0') r->p++;
    else if (r->p < r->end && *r->p >= '1' && *r->p <= '9')
        while (r->p < r->end && isdigit((unsigned char)*r->p)) r->p++;
    else return llm_json_fail(r, "a bad number");
    if (r->p < r->end && *r->p == '.') {
        r->p++;
        if (r->p >= r->end || !isdigit((unsigned char)*r->p)) return llm_json_fail(r, "a bad number");
        while (r->p < r->end && isdigit((unsigned char)*r->p)) r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
        if (r->p >= r->end || !isdigit((unsigned char)*r->p)) return llm_json_fail(r, "a bad number");
        while (r->p < r->end && isdigit((unsigned char)*r->p)) r->p++;
    }
    char tmp[64];
    size_t n = (size_t)(r->p - s);
    if (n >= sizeof tmp) return llm_json_fail(r, "a number too long");
    memcpy(tmp, s, n); tmp[n] = 0;
    v->type = LLM_JSON_NUMBER;
    v->num = strtod(tmp, NULL);
    v->fraction = strpbrk(tmp, ".eE") != NULL;
    if (!v->fraction && !(v->str = strdup(strcmp(tmp, "-0") ? tmp : "0"))) /* an integer's digits, exact */
        return llm_json_fail(r, "out of memory");
    if (!v->fraction) v->len = strlen(v->str);
    if (!isfinite(v->num)) return llm_json_fail(r, "a number out of range");
    return 0;
}

static int llm_json_value(llm_json_reader *r, llm_json *v, int depth) {
    memset(v, 0, sizeof *v);
    llm_json_space(r);
    if (r->p >= r->end) return llm_json_fail(r, "a value is missing");
    char c = *r->p;
    if (c == '"') { v->type = LLM_JSON_STRING; return llm_json_string_body(r, &v->str, &v->len); }
    if (c == '-' || (c >= '0' && c <= '9')) return llm_json_number(r, v);
    static const struct { const char *word; int type; } words[] = {
        {"null", LLM_JSON_NULL}, {"true", LLM_JSON_TRUE}, {"false", LLM_JSON_FALSE}};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i].word);
        if ((size_t)(r->end - r->p) >= n && !memcmp(r->p, words[i].word, n)) {
            r->p += n; v->type = words[i].type;
            return 0;
        }
    }
    if (c != '[' && c != '{') return llm_json_fail(r, "an unexpected character");
    if (depth >= LLM_JSON_DEPTH) { /* checked before going in: the recursion is at most this deep */
        char what[80];
        snprintf(what, sizeof what, "nesting too deep (more than %d arrays and objects)", LLM_JSON_DEPTH);
        return llm_json_fail(r, what);
    }
    int object = c == '{';
    v->type = object ? LLM_JSON_OBJECT : LLM_JSON_ARRAY;
    r->p++;
    llm_json_space(r);
    if (r->p < r->end && *r->p == (object ? '}' : ']')) { r->p++; return 0; }
    int cap = 0;
    for (;;) {
        if (v->n == cap) {
            cap = cap ? cap * 2 : 4;
            llm_json *items = (llm_json *)realloc(v->items, (size_t)cap * sizeof(llm_json));
            if (!items) return llm_json_fail(r, "out of memory");
            v->items = items;
            if (object) {
                char **keys = (char **)realloc(v->keys, (size_t)cap * sizeof(char *));
                if (!keys) return llm_json_fail(r, "out of memory");
                v->keys = keys;
            }
        }
        if (object) {
            llm_json_space(r);
            if (r->p >= r->end || *r->p != '"') return llm_json_fail(r, "an object key must be a string");
            size_t klen;
            v->keys[v->n] = NULL;
            memset(&v->items[v->n], 0, sizeof(llm_json));
            if (llm_json_string_body(r, &v->keys[v->n], &klen) != 0) { v->n++; return -1; }
            llm_json_space(r);
            if (r->p >= r->end || *r->p != ':') { v->n++; return llm_json_fail(r, "a ':' is missing"); }
            r->p++;
        }
        int rc = llm_json_value(r, &v->items[v->n], depth + 1);
        v->n++;
        if (rc != 0) return -1;
        llm_json_space(r);
        if (r->p < r->end && *r->p == ',') { r->p++; continue; }
        if (r->p < r->end && *r->p == (object ? '}' : ']')) { r->p++; return 0; }
        return llm_json_fail(r, object ? "a ',' or '}' is missing" : "a ',' or ']' is missing");
    }
}

int llm_json_parse(const char *text, size_t len, llm_json *out, char *err) {
    char buf[LLM_ERR_LEN] = "";
    llm_json_reader r = {text, text, text + len, err ? err : buf};
    r.err[0] = 0;
    int rc = llm_json_value(&r, out, 0);
    if (rc == 0) { llm_json_space(&r);
                   if (r.p != r.end) rc = llm_json_fail(&r, "more text after the value"); }
    if (rc != 0) llm_json_free(out);
    return rc;
}

llm_json *llm_json_get(const llm_json *obj, const char *key) {
    if (!obj || obj->type != LLM_JSON_OBJECT) return NULL;
    for (int i = obj->n - 1; i >= 0; i--) if (!strcmp(obj->keys[i], key)) return &obj->items[i];
    return NULL;
}

/* Text appended to a growing char array (stb_ds): the JSON writer's, and the grammar and tool layers' */
static void llm_str_puts(char **out, const char *s) {
    size_t n = strlen(s);
    if (n) memcpy(arraddnptr(*out, n), s, n); /* nothing: not even a pointer into an array not made yet */
}

static void llm_str_printf(char **out, const char *fmt, ...) {
    char small[256], *buf = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof small && (buf = (char *)malloc((size_t)n + 1)) != NULL) { /* a long one: again */
        va_start(ap, fmt);
        vsnprintf(buf, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    if (n > 0 && buf) memcpy(arraddnptr(*out, n), buf, (size_t)n);
    if (buf != small) free(buf);
}

/* A float as Python's repr writes it: the fewest digits that read back the same; plain from 1e-4 up to 1e16
 * (with ".0" when whole), else d.ddde+XX */
static void llm_json_write_float(char **out, double x) {
    char digits[32];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(digits, sizeof digits, "%.*e", p - 1, x);
        if (strtod(digits, NULL) == x) break;
    }
    snprintf(digits, sizeof digits, "%.*e", p - 1, x);
    char *e = strchr(digits, 'e'), mant[24];
    int exp10 = atoi(e + 1), neg = digits[0] == '-', k = 0;
    for (const char *c = digits + neg; c < e; c++) if (*c != '.') mant[k++] = *c; /* the significant digits */
    mant[k] = 0;
    if (neg) arrput(*out, '-');
    if (exp10 < -4 || exp10 >= 16) {
        arrput(*out, mant[0]);
        if (k > 1) { arrput(*out, '.'); llm_str_puts(out, mant + 1); }
        llm_str_printf(out, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (exp10 < 0) {
        llm_str_puts(out, "0.");
        for (int i = 0; i < -exp10 - 1; i++) arrput(*out, '0');
        llm_str_puts(out, mant);
    } else {
        for (int i = 0; i <= exp10; i++) arrput(*out, i < k ? mant[i] : '0');
        arrput(*out, '.');
        if (k > exp10 + 1) llm_str_puts(out, mant + exp10 + 1); else arrput(*out, '0');
    }
}

/* A JSON value written compactly (for const and enum: the text the model must write), or as Python's
 * json.dumps writes it: ", " and ": " between the parts, floats as Python writes them, and every control
 * character escaped (\n, \t, ... by name), everything else as it is */
static void llm_json_write_indented(char **out, const llm_json *v, int python, int indent, int level);
static void llm_json_write_compact(char **out, const llm_json *v, int python) {
    llm_json_write_indented(out, v, python, 0, 0);
}

/* indent > 0: Python's json.dumps(value, indent=indent): each item on its own line, "," between them */
static void llm_json_write_indented(char **out, const llm_json *v, int python, int indent, int level) {
    switch (v->type) {
    case LLM_JSON_NULL: llm_str_puts(out, "null"); break;
    case LLM_JSON_TRUE: llm_str_puts(out, "true"); break;
    case LLM_JSON_FALSE: llm_str_puts(out, "false"); break;
    case LLM_JSON_NUMBER:
        if (!python) llm_str_printf(out, "%.17g", v->num);
        else if (v->fraction) llm_json_write_float(out, v->num);
        else if (v->str) llm_str_puts(out, v->str); /* Python's int: every digit, as written */
        else llm_str_printf(out, "%.0f", v->num == 0 ? 0.0 : v->num);
        break;
    case LLM_JSON_STRING:
        arrput(*out, '"');
        for (size_t i = 0; i < v->len; i++) {
            unsigned char ch = (unsigned char)v->str[i];
            const char *named = !python ? NULL : ch == '\n' ? "\\n" : ch == '\r' ? "\\r" :
                                ch == '\t' ? "\\t" : ch == '\b' ? "\\b" : ch == '\f' ? "\\f" : NULL;
            if (ch == '"' || ch == '\\') { arrput(*out, '\\'); arrput(*out, (char)ch); }
            else if (named) llm_str_puts(out, named);
            else if (ch < 0x20) llm_str_printf(out, "\\u%04x", ch);
            else arrput(*out, (char)ch);
        }
        arrput(*out, '"');
        break;
    default: {
        int obj = v->type == LLM_JSON_OBJECT;
        arrput(*out, obj ? '{' : '[');
        for (int i = 0; i < v->n; i++) {
            if (i) llm_str_puts(out, python && !indent ? ", " : ",");
            if (indent) arrput(*out, '\n');
            for (int k = 0; k < (level + 1) * indent; k++) arrput(*out, ' ');
            if (obj) {
                llm_json key = {LLM_JSON_STRING, 0, v->keys[i], strlen(v->keys[i]), NULL, NULL, 0, 0};
                llm_json_write_compact(out, &key, python);
                llm_str_puts(out, python ? ": " : ":");
            }
            llm_json_write_indented(out, &v->items[i], python, indent, level + 1);
        }
        if (indent && v->n) arrput(*out, '\n');
        for (int k = 0; v->n && k < level * indent; k++) arrput(*out, ' ');
        arrput(*out, obj ? '}' : ']');
    }
    }
}

char *llm_json_dumps(const llm_json *v, int python) {
    char *b = NULL; /* stb_ds */
    llm_json_write_indented(&b, v, python > 0, python > 1 ? python : 0, 0);
    arrput(b, 0);
    char *text = strdup(b);
    arrfree(b);
    return text;
}

/* ===========================================================================================================
 * 12. Grammar (a layer: LLM_NO_GRAMMAR leaves it out)
 * The output must be a sentence of a grammar. A grammar (GBNF) is parsed once into rules of elements; a
 * sequence's place in it is a set of pushdown stacks, each a path of positions still to match, as llama.cpp's
 * llama-grammar.cpp keeps it. A character is accepted by every stack whose top position matches it; each of
 * those pops it and expands what follows (a rule reference becomes each of its alternatives) until its top is
 * a character to match again. A token is allowed when its bytes leave at least one stack alive. To find all
 * tokens allowed, the vocabulary's bytes are walked as a trie, so that the tokens that share a prefix share
 * its work, and the masks are cached by state (JSON's states repeat: inside a string, after a comma). JSON
 * Schema, regular expressions and choices are written out as GBNF text first, so one engine runs them all.
 * ======================================================================================================== */
#ifndef LLM_NO_GRAMMAR
/* ---- GBNF: the parser ---------------------------------------------------------------------------------- */
/* A rule is a list of elements: its alternatives one after another, each ended by ALT, the last by END. A
 * character class is its first element (CHAR, or CHAR_NOT when negated) then CHAR_ALT for each further
 * character, and CHAR_UPPER after a character that begins a range. Repetition (* + ? {m,n}) is written out
 * into new rules as it is parsed (S* is S' ::= S S' | empty), so the matcher knows only sequences,
 * alternatives and references. */
enum { LLM_GR_END, LLM_GR_ALT, LLM_GR_RULE, LLM_GR_CHAR, LLM_GR_CHAR_NOT, LLM_GR_CHAR_UPPER, LLM_GR_CHAR_ALT,
       LLM_GR_CHAR_ANY };
typedef struct { uint32_t type, value; } llm_gr_elem;

/* The limits of what a grammar may cost (each overridable, as the fuzz target does to reach them) */
#ifndef LLM_GR_MAX_ELEMS
#define LLM_GR_MAX_ELEMS  (1 << 22)  /* a grammar's elements: what repetition counts can blow up to */
#endif
#ifndef LLM_GR_MAX_RULES
#define LLM_GR_MAX_RULES  (1 << 18)  /* its rules, groups and repetitions among them (each costs a name) */
#endif
#define LLM_GR_MAX_REPEAT 10000      /* the largest m and n of {m,n} */
#ifndef LLM_GR_MAX_STACKS
/* the stacks of one state: an ambiguous grammar could grow them without end */
#define LLM_GR_MAX_STACKS 4096
#endif
#ifndef LLM_GR_MAX_DEPTH
#define LLM_GR_MAX_DEPTH  4096       /* the positions of one stack (nesting) */
#endif
#ifndef LLM_GR_MAX_WORK
#define LLM_GR_MAX_WORK   (1 << 24)  /* positions one character's expansion may write (rules that fan out and
                                      * meet again, r0 ::= r1 | r1 and so on, would double it per rule) */
#endif

typedef struct { uint32_t *data, *lens; } llm_gr_set; /* stacks one after another, and each one's length */

typedef struct {                    /* one cached mask: the state it is for, and which tokens it allows */
    uint64_t hash;
    uint32_t *key; int n_key;       /* the state written out: its partial character, then its stacks */
    uint8_t *mask; int n_allowed;
} llm_gr_cached_mask;

struct llm_grammar {
    int refs;                       /* references (atomic: the engine's table and its requests share it) */
    llm_gr_elem *elems;             /* stb_ds: every rule's elements, rule after rule */
    uint32_t *rule_start;           /* stb_ds: where each rule's elements begin */
    char **rule_names;              /* stb_ds: by rule id (generated rules are named after their parent) */
    uint32_t root;
    /* the masks: not read-only, so one thread at a time asks for masks of one grammar (the engine's) */
    const llm_token_trie *cache_trie;  /* the vocabulary the cached masks are for */
    llm_gr_cached_mask *cache;      /* stb_ds, at most LLM_GR_CACHE entries, replaced in turn */
    int cache_next;
    int64_t cache_hits;
    uint32_t *walk_buf;             /* stb_ds: the walk's scratch for stacks being built */
    llm_gr_set walk_seen;           /* and for the stacks one step has met after an empty alternative */
    llm_gr_set *walk;               /* stb_ds: the sets one walk of the trie meets, by number */
};
#define LLM_GR_CACHE 512

typedef struct {
    const char *p, *start, *end;
    char *err;
    struct { char *key; int value; } *ids; /* stb_ds string hash: rule name -> id */
    llm_gr_elem **rules;            /* stb_ds: each rule's elements (an stb_ds array), by id */
    char **names;
    int *defined;
    int64_t n_elems;
} llm_gr_parser;

static int llm_gr_fail(llm_gr_parser *ps, const char *fmt, const char *arg) {
    if (ps->err[0]) return -1;
    int line = 1, col = 1;
    for (const char *q = ps->start; q < ps->p; q++) { if (*q == '\n') { line++; col = 1; } else col++; }
    char what[160];
    snprintf(what, sizeof what, fmt, arg ? arg : "");
    llm_fail(ps->err, "grammar: %s at line %d, column %d", what, line, col);
    return -1;
}

static int llm_gr_is_word(int c) { return isalnum(c) || c == '-' || c == '_'; }

static void llm_gr_space(llm_gr_parser *ps, int newline_ok) {
    for (;;) {
        char c = *ps->p;
        if (c == ' ' || c == '\t') ps->p++;
        else if (c == '#') while (*ps->p && *ps->p != '\n' && *ps->p != '\r') ps->p++;
        else if (newline_ok && (c == '\n' || c == '\r')) ps->p++;
        else return;
    }
}

/* The id of a rule name (a new one the first time it is seen: it may be defined after its first use) */
static int llm_gr_id(llm_gr_parser *ps, const char *name, size_t n) {
    char buf[256];
    if (n >= sizeof buf) return llm_gr_fail(ps, "a rule name longer than 255 characters%s", NULL);
    memcpy(buf, name, n); buf[n] = 0;
    ptrdiff_t i = shgeti(ps->ids, buf);
    if (i >= 0) return ps->ids[i].value;
    if (arrlen(ps->rules) >= LLM_GR_MAX_RULES) {
        char limit[16];
        snprintf(limit, sizeof limit, "%d", LLM_GR_MAX_RULES);
        return llm_gr_fail(ps, "more than %s rules (each group and repetition is one)", limit);
    }
    int id = (int)arrlen(ps->rules);
    shput(ps->ids, buf, id);
    arrput(ps->rules, NULL); arrput(ps->defined, 0); arrput(ps->names, ps->ids[shgeti(ps->ids, buf)].key);
    return id;
}

/* A new rule for a group or a repetition, named after the rule it is part of */
static int llm_gr_new_id(llm_gr_parser *ps, int parent) {
    char buf[300];
    for (int k = (int)arrlen(ps->rules);; k++) {
        snprintf(buf, sizeof buf, "%.200s_%d", ps->names[parent], k);
        if (shgeti(ps->ids, buf) < 0) return llm_gr_id(ps, buf, strlen(buf));
    }
}

/* One character of a literal or a class: an escape or a UTF-8 character; -1 when broken. */
static int64_t llm_gr_char(llm_gr_parser *ps) {
    const unsigned char *s = (const unsigned char *)ps->p;
    if (!*s) return llm_gr_fail(ps, "the text ends inside a literal or a class%s", NULL);
    if (*s == '\\') {
        int e = s[1], digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int i = 0; i < digits; i++) {
                int d = llm_hex_digit(s[2 + i]);
                if (d < 0)
                    return llm_gr_fail(ps, "\\%s needs hex digits", e == 'x' ? "x" : e == 'u' ? "u" : "U");
                v = v * 16 + (uint32_t)d;
            }
            if (v > 0x10FFFF) return llm_gr_fail(ps, "a character past U+10FFFF%s", NULL);
            ps->p += 2 + digits;
            return v;
        }
        const char *named = strchr("ntr0", e);
        if (e && named) { ps->p += 2; return "\n\t\r"[named - "ntr0"]; }
        if (e && e < 0x80 && ispunct(e)) { ps->p += 2; return e; }
        return llm_gr_fail(ps, "an unknown escape%s", NULL);
    }
    int k = llm_utf8_check(s, (size_t)(ps->end - ps->p));
    if (k <= 0) return llm_gr_fail(ps, "text that is not UTF-8%s", NULL);
    ps->p += k;
    return llm_utf8_decode(s, k);
}

static void llm_gr_push(llm_gr_elem **out, uint32_t type, uint32_t value) {
    llm_gr_elem el = {type, value};
    arrput(*out, el);
}

/* S{min,max} (max -1: no bound) for the item that begins at (*out)[item]: S min times, then the optional
 * rest as rules: S{0,k} ::= S S{0,k-1} | (empty), and with no bound, S' ::= S S' | (empty). */
static int llm_gr_repeat(llm_gr_parser *ps, int id, llm_gr_elem **out, size_t item,
                         int64_t min, int64_t max) {
    size_t n = (size_t)arrlen(*out) - item;
    if (n == 0) return llm_gr_fail(ps, "a repetition with nothing before it%s", NULL);
    if (min > LLM_GR_MAX_REPEAT || max > LLM_GR_MAX_REPEAT)
        return llm_gr_fail(ps, "a repetition count over 10000%s", NULL);
    if (max >= 0 && max < min) return llm_gr_fail(ps, "a repetition {m,n} with n < m%s", NULL);
    int64_t n_opt = max < 0 ? 1 : max - min;
    ps->n_elems += (int64_t)n * (min + n_opt);
    if (ps->n_elems > LLM_GR_MAX_ELEMS) return llm_gr_fail(ps, "the grammar is too large%s", NULL);
    llm_gr_elem *s = (llm_gr_elem *)malloc(n * sizeof *s);
    if (!s) return llm_gr_fail(ps, "out of memory%s", NULL);
    memcpy(s, *out + item, n * sizeof *s);
    arrsetlen(*out, item);
    for (int64_t i = 0; i < min; i++) memcpy(arraddnptr(*out, n), s, n * sizeof *s);
    int last = -1;
    for (int64_t i = 0; i < n_opt; i++) {
        int rid = llm_gr_new_id(ps, id);
        if (rid < 0) { free(s); return -1; }
        llm_gr_elem *r = NULL;
        memcpy(arraddnptr(r, n), s, n * sizeof *s);
        if (max < 0 || i > 0) llm_gr_push(&r, LLM_GR_RULE, (uint32_t)(max < 0 ? rid : last));
        llm_gr_push(&r, LLM_GR_ALT, 0); llm_gr_push(&r, LLM_GR_END, 0);
        ps->rules[rid] = r; ps->defined[rid] = 1;
        last = rid;
    }
    if (n_opt > 0) llm_gr_push(out, LLM_GR_RULE, (uint32_t)last);
    free(s);
    return 0;
}

static int64_t llm_gr_number(llm_gr_parser *ps) {
    if (!isdigit((unsigned char)*ps->p)) return llm_gr_fail(ps, "a number is expected%s", NULL);
    int64_t v = 0;
    while (isdigit((unsigned char)*ps->p)) { if (v < 1000000) v = v * 10 + (*ps->p - '0'); ps->p++; }
    llm_gr_space(ps, 1);
    return v;
}

/* A rule's alternatives, and inside them the groups in parentheses, each group a rule of its own. Read with
 * a stack of the groups open, not by recursion: how deep groups nest is the text's to say (100,000 deep is
 * 20 KB), and it costs this array, not the thread's stack. open[0] is the rule being defined; each group's
 * elements grow until its ')' (or the rule's end) makes them its rule. item: where the group's last item
 * begins, what a repetition after it repeats. Groups and repetitions are named after the rule (root_7). */
typedef struct { int id; llm_gr_elem *elems; size_t item; } llm_gr_group;

static int llm_gr_close(llm_gr_parser *ps, llm_gr_group *gr) { /* the group's elements become its rule */
    llm_gr_push(&gr->elems, LLM_GR_END, 0);
    ps->n_elems += arrlen(gr->elems);
    arrfree(ps->rules[gr->id]);
    ps->rules[gr->id] = gr->elems; ps->defined[gr->id] = 1;
    gr->elems = NULL;
    return ps->n_elems > LLM_GR_MAX_ELEMS ? llm_gr_fail(ps, "the grammar is too large%s", NULL) : 0;
}

static int llm_gr_alternates(llm_gr_parser *ps, int id) {
    llm_gr_group *open = NULL, rule = {id, NULL, 0}; /* stb_ds */
    arrput(open, rule);
    int rc = 0;
    while (rc == 0) {
        llm_gr_group *gr = &arrlast(open);
        llm_gr_elem **out = &gr->elems;
        char c = *ps->p;
        if (c == '"') {
            ps->p++; gr->item = (size_t)arrlen(*out);
            while (rc == 0 && *ps->p != '"') {
                int64_t ch = llm_gr_char(ps);
                if (ch < 0) rc = -1;
                else llm_gr_push(out, LLM_GR_CHAR, (uint32_t)ch);
            }
            ps->p += rc == 0;
        } else if (c == '[') {
            ps->p++; gr->item = (size_t)arrlen(*out);
            uint32_t type = LLM_GR_CHAR;
            if (*ps->p == '^') { ps->p++; type = LLM_GR_CHAR_NOT; }
            while (rc == 0 && *ps->p != ']') {
                int64_t lo = llm_gr_char(ps), hi;
                if (lo < 0) { rc = -1; break; }
                llm_gr_push(out, (size_t)arrlen(*out) == gr->item ? type : LLM_GR_CHAR_ALT, (uint32_t)lo);
                if (ps->p[0] == '-' && ps->p[1] && ps->p[1] != ']') {
                    ps->p++;
                    if ((hi = llm_gr_char(ps)) < 0) rc = -1;
                    else if (hi < lo) rc = llm_gr_fail(ps, "a range that ends before it begins%s", NULL);
                    else llm_gr_push(out, LLM_GR_CHAR_UPPER, (uint32_t)hi);
                }
            }
            if (rc == 0 && (size_t)arrlen(*out) == gr->item)
                rc = llm_gr_fail(ps, "an empty character class%s", NULL);
            ps->p += rc == 0;
        } else if (llm_gr_is_word((unsigned char)c)) {
            size_t n = 0;
            while (llm_gr_is_word((unsigned char)ps->p[n])) n++;
            int ref = llm_gr_id(ps, ps->p, n);
            if (ref < 0) { rc = -1; break; }
            ps->p += n; gr->item = (size_t)arrlen(*out);
            llm_gr_push(out, LLM_GR_RULE, (uint32_t)ref);
        } else if (c == '(') { /* a group opens: its items go to it until its ')' */
            ps->p++;
            llm_gr_space(ps, 1);
            llm_gr_group sub = {llm_gr_new_id(ps, id), NULL, 0};
            if (sub.id < 0) { rc = -1; break; }
            arrput(open, sub);
            continue;
        } else if (c == ')' && arrlen(open) > 1) { /* it closes: a reference to it is its parent's item */
            ps->p++;
            llm_gr_group done = arrpop(open);
            if ((rc = llm_gr_close(ps, &done)) != 0) break;
            gr = &arrlast(open);
            gr->item = (size_t)arrlen(gr->elems);
            llm_gr_push(&gr->elems, LLM_GR_RULE, (uint32_t)done.id);
        } else if (c == '|') {
            ps->p++;
            llm_gr_push(out, LLM_GR_ALT, 0);
            gr->item = (size_t)arrlen(*out);
            llm_gr_space(ps, 1);
            continue;
        } else if (c == '.') {
            ps->p++; gr->item = (size_t)arrlen(*out);
            llm_gr_push(out, LLM_GR_CHAR_ANY, 0);
        } else if (c == '*' || c == '+' || c == '?') {
            ps->p++;
            rc = llm_gr_repeat(ps, id, out, gr->item, c == '+', c == '?' ? 1 : -1);
        } else if (c == '{') {
            ps->p++;
            llm_gr_space(ps, 1);
            int64_t min = llm_gr_number(ps), max = min;
            if (min < 0) { rc = -1; break; }
            if (*ps->p == ',') {
                ps->p++;
                llm_gr_space(ps, 1);
                max = *ps->p == '}' ? -1 : llm_gr_number(ps);
                if (max < -1 || (max == -1 && *ps->p != '}')) { rc = -1; break; }
            }
            if (*ps->p != '}') rc = llm_gr_fail(ps, "a '}' is missing%s", NULL);
            else { ps->p++; rc = llm_gr_repeat(ps, id, out, gr->item, min, max); }
        } else break; /* the rule's end, or what the caller refuses */
        if (rc == 0) llm_gr_space(ps, arrlen(open) > 1); /* inside parentheses, lines go on */
    }
    if (rc == 0 && arrlen(open) > 1) rc = llm_gr_fail(ps, "a ')' is missing%s", NULL);
    if (rc == 0) rc = llm_gr_close(ps, &open[0]);
    for (ptrdiff_t i = 0; i < arrlen(open); i++) arrfree(open[i].elems);
    arrfree(open);
    return rc;
}

static int llm_gr_is_end(const llm_gr_elem *e) { return e->type == LLM_GR_END || e->type == LLM_GR_ALT; }

/* Which rules can match the empty text: those with an alternative made only of references to such rules.
 * Found from the empty alternatives outward, each alternative counting its references not yet known to be
 * empty: linear in the grammar (a chain of 100,000 rules ending in an empty one is one pass, not 100,000). */
static int llm_gr_nullable(const llm_grammar *g, uint8_t *nullable) {
    uint32_t n_rules = (uint32_t)arrlen(g->rule_start);
    uint32_t *left = NULL, *alt_rule = NULL, *queue = NULL; /* stb_ds: per alternative, and the rules found */
    uint32_t *first = (uint32_t *)calloc((size_t)n_rules + 2, sizeof *first), *users = NULL;
    if (!first) return -1;
    for (int pass = 0; pass < 2; pass++) { /* by rule, the alternatives that refer to it: counted, then put */
        arrsetlen(left, 0); arrsetlen(alt_rule, 0);
        if (pass == 1) {
            for (uint32_t r = 0; r < n_rules; r++) first[r + 1] += first[r];
            users = (uint32_t *)malloc(((size_t)first[n_rules] + 1) * sizeof *users);
            if (!users) break;
        }
        for (uint32_t r = 0; r < n_rules; r++)
            for (uint32_t pos = g->rule_start[r];;) {
                uint32_t a = (uint32_t)arrlen(left), refs = 0, at = pos;
                for (; !llm_gr_is_end(&g->elems[pos]); pos++)
                    refs = g->elems[pos].type == LLM_GR_RULE && refs != UINT32_MAX ? refs + 1 : UINT32_MAX;
                arrput(left, refs); arrput(alt_rule, r);
                for (; refs != UINT32_MAX && at < pos; at++) { /* a character: never empty, nobody waits */
                    uint32_t ref = g->elems[at].value;
                    if (pass == 0) first[ref + 1]++;
                    else users[first[ref]++] = a;
                }
                if (g->elems[pos++].type == LLM_GR_END) break;
            }
    }
    if (users) { /* first[r] moved to where r's users end: back one rule */
        for (uint32_t r = n_rules; r > 0; r--) first[r] = first[r - 1];
        first[0] = 0;
        for (ptrdiff_t a = 0; a < arrlen(left); a++) {
            uint32_t r = alt_rule[a];
            if (left[a] == 0 && !nullable[r]) { nullable[r] = 1; arrput(queue, r); }
        }
        for (ptrdiff_t q = 0; q < arrlen(queue); q++)
            for (uint32_t u = first[queue[q]]; u < first[queue[q] + 1]; u++) {
                uint32_t a = users[u], r = alt_rule[a];
                if (--left[a] == 0 && !nullable[r]) { nullable[r] = 1; arrput(queue, r); }
            }
    }
    int rc = users ? 0 : -1;
    free(first); free(users); arrfree(left); arrfree(alt_rule); arrfree(queue);
    return rc;
}

/* A rule that can match the empty text before its first character would let the matcher expand it forever:
 * left recursion (a ::= a "x", or through rules that can be empty) is refused, as llama.cpp refuses it. A
 * depth-first walk along what may come first, with its own stack (a chain of 100,000 rules is 100,000 deep):
 * state 1 while a rule is on the stack, 2 once done. Each frame is a rule and the element it is at; a
 * reference to a rule not seen yet pushes it, and the element is looked at again once that rule is done.
 * Returns the rule met again plus 1, 0 when there is none, -1 when out of memory. */
static int64_t llm_gr_left_recursive(const llm_grammar *g, const uint8_t *nullable, uint8_t *state,
                                     uint32_t r) {
    uint32_t *frames = NULL; /* stb_ds: (rule, element) pairs */
    int64_t found = 0;
    state[r] = 1;
    arrput(frames, r); arrput(frames, g->rule_start[r]);
    while (arrlen(frames) && !found) {
        uint32_t *f = &frames[arrlen(frames) - 2], pos = f[1];
        const llm_gr_elem *e = &g->elems[pos];
        if (e->type == LLM_GR_END) { state[f[0]] = 2; arrsetlen(frames, arrlen(frames) - 2); continue; }
        if (e->type == LLM_GR_ALT) { f[1]++; continue; }
        if (e->type == LLM_GR_RULE && state[e->value] == 1) { found = (int64_t)e->value + 1; break; }
        if (e->type == LLM_GR_RULE && state[e->value] == 0) {
            state[e->value] = 1;
            arrput(frames, e->value); arrput(frames, g->rule_start[e->value]);
            continue;
        }
        if (e->type == LLM_GR_RULE && nullable[e->value]) { f[1]++; continue; } /* and what follows it too */
        while (!llm_gr_is_end(&g->elems[pos])) pos++; /* a character, or a rule that cannot be empty: next */
        frames[arrlen(frames) - 1] = pos;
    }
    arrfree(frames);
    return found;
}

static int llm_gr_check(llm_grammar *g, char *err) {
    uint32_t n = (uint32_t)arrlen(g->rule_start);
    uint8_t *nullable = (uint8_t *)calloc(n + 1, 1), *state = (uint8_t *)calloc(n + 1, 1);
    if (!nullable || !state || llm_gr_nullable(g, nullable) != 0) {
        free(nullable); free(state);
        return llm_fail(err, "out of memory");
    }
    int64_t bad = 0;
    for (uint32_t r = 0; r < n && !bad; r++)
        if (!state[r]) bad = llm_gr_left_recursive(g, nullable, state, r);
    free(nullable); free(state);
    if (bad)
        return llm_fail(err, "grammar: rule %s is left-recursive (it can reach itself before any character)",
                             g->rule_names[bad - 1]);
    return 0;
}

void llm_grammar_free(llm_grammar *g) {
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    arrfree(g->elems); arrfree(g->rule_start);
    for (ptrdiff_t i = 0; i < arrlen(g->rule_names); i++) free(g->rule_names[i]);
    arrfree(g->rule_names);
    for (ptrdiff_t i = 0; i < arrlen(g->cache); i++) { free(g->cache[i].key); free(g->cache[i].mask); }
    arrfree(g->cache);
    for (ptrdiff_t i = 0; i < arrlen(g->walk); i++) { arrfree(g->walk[i].data); arrfree(g->walk[i].lens); }
    arrfree(g->walk); arrfree(g->walk_buf); arrfree(g->walk_seen.data); arrfree(g->walk_seen.lens);
    free(g);
}

/* One more reference to g: the engine's table of grammars and each request that follows g hold one */
static llm_grammar *llm_grammar_ref(llm_grammar *g) {
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL);
    return g;
}

/* The masks g's cache has given so far (the engine's stats) */
static int64_t llm_grammar_cache_hits(const llm_grammar *g) { return g->cache_hits; }

static int llm_gr_check_start(const llm_grammar *g, char *err); /* with the matcher, below */

llm_grammar *llm_grammar_parse(const char *gbnf, char *err) {
    char buf[LLM_ERR_LEN] = "";
    if (!gbnf) { llm_fail(err, "grammar: no text"); return NULL; }
    llm_gr_parser ps;
    memset(&ps, 0, sizeof ps);
    ps.p = ps.start = gbnf; ps.end = gbnf + strlen(gbnf); ps.err = err ? err : buf;
    ps.err[0] = 0;
    sh_new_strdup(ps.ids);
    llm_grammar *g = (llm_grammar *)calloc(1, sizeof *g);
    int rc = g ? 0 : llm_gr_fail(&ps, "out of memory%s", NULL);
    if (g) g->refs = 1;
    llm_gr_space(&ps, 1);
    while (rc == 0 && *ps.p) { /* name ::= alternatives, one rule after another */
        size_t n = 0;
        while (llm_gr_is_word((unsigned char)ps.p[n])) n++;
        if (!n) { rc = llm_gr_fail(&ps, "a rule name is expected%s", NULL); break; }
        int id = llm_gr_id(&ps, ps.p, n);
        if (id < 0) { rc = -1; break; }
        if (ps.defined[id]) { rc = llm_gr_fail(&ps, "rule %s is defined twice", ps.names[id]); break; }
        ps.p += n;
        llm_gr_space(&ps, 0);
        if (strncmp(ps.p, "::=", 3) != 0) { rc = llm_gr_fail(&ps, "'::=' is expected%s", NULL); break; }
        ps.p += 3;
        llm_gr_space(&ps, 1);
        if ((rc = llm_gr_alternates(&ps, id)) != 0) break;
        if (*ps.p && *ps.p != '\n' && *ps.p != '\r') {
            rc = llm_gr_fail(&ps, "an unexpected character%s", NULL); break; }
        llm_gr_space(&ps, 1);
    }
    int n_rules = (int)arrlen(ps.rules);
    for (int r = 0; rc == 0 && r < n_rules; r++)
        if (!ps.defined[r]) rc = llm_fail(ps.err, "grammar: rule %s is used but not defined", ps.names[r]);
    ptrdiff_t root = shgeti(ps.ids, "root");
    if (rc == 0 && root < 0) rc = llm_fail(ps.err, "grammar: there is no rule named root");
    if (rc == 0) { /* the rules, flattened: a reference is a rule id, its elements found by rule_start */
        g->root = (uint32_t)ps.ids[root].value;
        for (int r = 0; r < n_rules; r++) {
            arrput(g->rule_start, (uint32_t)arrlen(g->elems));
            memcpy(arraddnptr(g->elems, arrlen(ps.rules[r])), ps.rules[r],
                   (size_t)arrlen(ps.rules[r]) * sizeof(llm_gr_elem));
            char *name = strdup(ps.names[r]);
            arrput(g->rule_names, name);
            if (!name) rc = llm_fail(ps.err, "out of memory");
        }
        llm_gr_push(&g->elems, LLM_GR_END, 0); /* the element after the last: reading one past a class is
                                                * safe */
    }
    for (int r = 0; r < n_rules; r++) arrfree(ps.rules[r]);
    arrfree(ps.rules); arrfree(ps.defined); arrfree(ps.names); shfree(ps.ids);
    if (rc == 0) rc = llm_gr_check(g, ps.err);
    if (rc == 0) rc = llm_gr_check_start(g, ps.err);
    if (rc != 0) { llm_grammar_free(g); return NULL; }
    return g;
}

/* ---- The matcher: a set of stacks, advanced a character at a time ------------------------------------- */
struct llm_grammar_state {
    const llm_grammar *g;
    llm_gr_set set;
    llm_gr_set next[2], seen; uint32_t *buf; /* accept's scratch, kept for the next call */
    uint32_t partial; int partial_left, partial_len; /* a UTF-8 character begun: its bits, bytes to come */
};

static void llm_gr_set_clear(llm_gr_set *s) { arrsetlen(s->data, 0); arrsetlen(s->lens, 0); }
static void llm_gr_set_free(llm_gr_set *s) { arrfree(s->data); arrfree(s->lens); }

/* 1: added, 0: it was there, -1: the set is full */
static int llm_gr_set_add(llm_gr_set *s, const uint32_t *stack, uint32_t n) {
    size_t at = 0;
    for (ptrdiff_t i = 0; i < arrlen(s->lens); at += s->lens[i++])
        if (s->lens[i] == n && !memcmp(s->data + at, stack, n * sizeof *stack)) return 0;
    if (arrlen(s->lens) >= LLM_GR_MAX_STACKS) return -1;
    if (!s->data) arrsetcap(s->data, 64); /* a set with a stack has data, even if the stack is empty */
    arrput(s->lens, n);
    if (n) memcpy(arraddnptr(s->data, n), stack, n * sizeof *stack);
    return 1;
}

/* The matcher's limits, passed (what its functions return; llm_gr_limit says which in words) */
enum { LLM_GR_FULL = -1, LLM_GR_DEEP = -2, LLM_GR_COSTLY = -3 };

static int llm_gr_limit(char *err, int code, const char *where) {
    if (code == LLM_GR_DEEP)
        return llm_fail(err, "grammar: rules nest more than %d deep %s (each rule reference with something "
                        "after it is one level)", LLM_GR_MAX_DEPTH, where);
    if (code == LLM_GR_COSTLY)
        return llm_fail(err, "grammar: expanding its rules %s takes more than %d steps (rules that fan out "
                        "into alternatives that meet again)", where, LLM_GR_MAX_WORK);
    return llm_fail(err, "grammar: more than %d alternatives are open at once %s (the matcher's limit)",
                    LLM_GR_MAX_STACKS, where);
}

/* A stack whose top is a rule reference becomes one stack per alternative of the rule, and so on, until
 * every top is a character to match, or the stack is empty (the sentence is whole). Added to out. The stack
 * is (*buf)[base, base + n); the stacks still to expand go after it in the same scratch array, last in first
 * out, each followed by a word with its length (and bit 31: reached by an empty alternative), so that a step
 * allocates nothing once the scratch has grown (indices, not pointers: the array may move as it grows). A
 * rule's alternatives go in last to first, so the first comes out first: the order recursion would take,
 * without a frame per reference (a chain of 100,000 rules r0 ::= r1 ... is 100,000 references deep).
 * An empty alternative leaves the stack below it, which the rule's other empty derivations reach again:
 * (a|b|)? or x? y? z? reach it by as many ways as there are, and nested, that is exponential. seen holds
 * the stacks so reached in this step (as llama.cpp's matcher keeps those it has seen): each is expanded once.
 * *work counts the positions written, against LLM_GR_MAX_WORK: rules that fan out and meet again without an
 * empty alternative (r0 ::= r1 | r1, r1 ::= r2 | r2 ...) would double it per rule. 0, or an LLM_GR_*
 * limit. */
static int llm_gr_expand(const llm_grammar *g, uint32_t **buf, size_t base, uint32_t n, llm_gr_set *out,
                         llm_gr_set *seen, int64_t *work) {
    size_t top = base + n + 1; /* the end of the records still to expand */
    arrsetlen(*buf, top);
    (*buf)[top - 1] = n;
    while (top > base) {
        uint32_t head = (*buf)[top - 1], k = head & 0x7FFFFFFFu;
        size_t at = top - 1 - k; /* the stack: (*buf)[at, at + k) */
        top = at;
        int again;
        if (head >> 31 && (again = llm_gr_set_add(seen, *buf + at, k)) <= 0) {
            if (again < 0) return LLM_GR_FULL;
            continue;
        }
        uint32_t pos = k ? (*buf)[at + k - 1] : 0;
        if (k == 0 || g->elems[pos].type != LLM_GR_RULE) {
            if (llm_gr_set_add(out, *buf + at, k) < 0) return LLM_GR_FULL;
            continue;
        }
        if (k >= LLM_GR_MAX_DEPTH) return LLM_GR_DEEP;
        /* each alternative: the stack less its top, what follows the reference, the alternative's start;
         * the first record is written where the stack was (its positions below the top are already there) */
        uint32_t m = k - 1, follow = !llm_gr_is_end(&g->elems[pos + 1]);
        uint32_t first = g->rule_start[g->elems[pos].value], end = first;
        while (g->elems[end].type != LLM_GR_END) end++;
        for (uint32_t close = end;;) { /* close: the ALT or END after the alternative */
            uint32_t alt = close;
            while (alt > first && g->elems[alt - 1].type != LLM_GR_ALT) alt--;
            uint32_t len = m + follow + (alt < close);
            if ((*work += len + 1) > LLM_GR_MAX_WORK) return LLM_GR_COSTLY;
            arrsetlen(*buf, top + len + 1);
            if (top != at) memcpy(*buf + top, *buf + at, m * sizeof(uint32_t));
            if (follow) (*buf)[top + m] = pos + 1;
            if (alt < close) (*buf)[top + m + follow] = alt;
            (*buf)[top + len] = len | (alt < close ? 0 : 1u << 31);
            top += len + 1;
            if (alt == first) break;
            close = alt - 1;
        }
    }
    arrsetlen(*buf, base + n);
    return 0;
}

/* Whether the class at e matches c; *next: the element after the class. */
static int llm_gr_match_char(const llm_gr_elem *e, uint32_t c, const llm_gr_elem **next) {
    int found = 0, positive = e->type != LLM_GR_CHAR_NOT;
    do {
        if (e->type == LLM_GR_CHAR_ANY) { found = 1; e++; }
        else if (e[1].type == LLM_GR_CHAR_UPPER) { found |= e->value <= c && c <= e[1].value; e += 2; }
        else { found |= e->value == c; e++; }
    } while (e->type == LLM_GR_CHAR_ALT);
    *next = e;
    return found == positive;
}

/* Whether the class at e could match a character that begins with the bits of a partial UTF-8 character
 * (left bytes to come): the range of code points it can still become meets the class. */
static int llm_gr_match_partial(const llm_gr_elem *e, uint32_t partial, int left, int len) {
    uint32_t lo = partial << (6 * left), hi = lo | ((1u << (6 * left)) - 1);
    if (len == 3 && lo < 0x800) lo = 0x800;
    if (len == 4 && lo < 0x10000) lo = 0x10000;
    int positive = e->type != LLM_GR_CHAR_NOT;
    do {
        uint32_t a = e->value, b = e[1].type == LLM_GR_CHAR_UPPER ? e[1].value : e->value;
        if (e->type == LLM_GR_CHAR_ANY) return 1;
        if (positive && a <= hi && lo <= b) return 1;
        if (!positive && a <= lo && hi <= b) return 0; /* the whole range is excluded */
        e += e[1].type == LLM_GR_CHAR_UPPER ? 2 : 1;
    } while (e->type == LLM_GR_CHAR_ALT);
    return !positive;
}

/* One character: every stack whose top matches c pops it and is expanded into out (buf: scratch). 0, or
 * the LLM_GR_* limit passed. */
static int llm_gr_step(const llm_grammar *g, const llm_gr_set *in, uint32_t c, llm_gr_set *out,
                       uint32_t **buf, llm_gr_set *seen) {
    llm_gr_set_clear(out);
    llm_gr_set_clear(seen);
    size_t at = 0;
    int64_t work = 0;
    for (ptrdiff_t i = 0; i < arrlen(in->lens); at += in->lens[i++]) {
        uint32_t n = in->lens[i], m = n - 1;
        const llm_gr_elem *next;
        if (!n || !llm_gr_match_char(&g->elems[in->data[at + n - 1]], c, &next)) continue;
        arrsetlen(*buf, n);
        memcpy(*buf, in->data + at, m * sizeof(uint32_t));
        if (!llm_gr_is_end(next)) (*buf)[m++] = (uint32_t)(next - g->elems);
        int rc = llm_gr_expand(g, buf, 0, m, out, seen, &work);
        if (rc != 0) return rc;
    }
    return 0;
}

static int llm_gr_partial_ok(const llm_grammar *g, const llm_gr_set *s, uint32_t partial, int left, int len) {
    if (!left) return 1;
    size_t at = 0;
    for (ptrdiff_t i = 0; i < arrlen(s->lens); at += s->lens[i++])
        if (s->lens[i] && llm_gr_match_partial(&g->elems[s->data[at + s->lens[i] - 1]], partial, left, len))
            return 1;
    return 0;
}

/* The UTF-8 decoder between bytes: 1 when b completes a character (in *cp), 0 when more bytes are to come,
 * -1 when the bytes are not UTF-8 (overlong forms and surrogates included). */
static int llm_gr_byte(uint32_t *cp, int *left, int *len, unsigned char b) {
    if (*left) {
        if ((b & 0xC0) != 0x80) return -1;
        *cp = *cp << 6 | (b & 0x3F);
        --*left;
        /* the second byte already says whether the character can be valid: no overlong form, no surrogate,
         * nothing past U+10FFFF (else a text could take a byte that no next byte can complete) */
        if (*len - *left == 2 && ((*len == 3 && (*cp < 0x20 || (*cp >= 0x360 && *cp <= 0x37F))) ||
                                  (*len == 4 && (*cp < 0x10 || *cp > 0x10F)))) return -1;
        return *left == 0;
    }
    if (b < 0x80) { *cp = b; *len = 1; return 1; }
    if (b >= 0xC2 && b <= 0xDF) { *cp = b & 0x1F; *left = 1; *len = 2; return 0; }
    if (b >= 0xE0 && b <= 0xEF) { *cp = b & 0x0F; *left = 2; *len = 3; return 0; }
    if (b >= 0xF0 && b <= 0xF4) { *cp = b & 0x07; *left = 3; *len = 4; return 0; }
    return -1;
}

/* The stacks at the start: one per alternative of root, each expanded. 0, or the LLM_GR_* limit passed. */
static int llm_gr_start_set(llm_grammar_state *st) {
    const llm_grammar *g = st->g;
    uint32_t root = g->rule_start[g->root];
    int64_t work = 0;
    for (;;) {
        arrsetlen(st->buf, 1);
        st->buf[0] = root;
        int rc = llm_gr_expand(g, &st->buf, 0, !llm_gr_is_end(&g->elems[root]), &st->set, &st->seen, &work);
        if (rc != 0) return rc;
        while (!llm_gr_is_end(&g->elems[root])) root++;
        if (g->elems[root++].type == LLM_GR_END) return 0;
    }
}

llm_grammar_state *llm_grammar_start(const llm_grammar *g) {
    llm_grammar_state *st = (llm_grammar_state *)calloc(1, sizeof *st);
    if (st) st->g = g;
    if (st && llm_gr_start_set(st) != 0) { llm_grammar_state_free(st); return NULL; }
    return st;
}

/* A grammar's start within the matcher's limits (the parser asks: else no request could begin with it) */
static int llm_gr_check_start(const llm_grammar *g, char *err) {
    llm_grammar_state *st = (llm_grammar_state *)calloc(1, sizeof *st);
    if (!st) return llm_fail(err, "out of memory");
    st->g = g;
    int why = llm_gr_start_set(st);
    llm_grammar_state_free(st);
    return why ? llm_gr_limit(err, why, "at its start") : 0;
}

static void llm_gr_set_assign(llm_gr_set *dst, const llm_gr_set *src) { /* in dst's own memory */
    arrsetlen(dst->data, arrlen(src->data)); arrsetlen(dst->lens, arrlen(src->lens));
    if (arrlen(src->data)) memcpy(dst->data, src->data, (size_t)arrlen(src->data) * sizeof(uint32_t));
    if (arrlen(src->lens)) memcpy(dst->lens, src->lens, (size_t)arrlen(src->lens) * sizeof(uint32_t));
}

/* dst becomes a copy of src, reusing dst's memory (the engine's scratch state: no allocation per token) */
static void llm_gr_state_assign(llm_grammar_state *dst, const llm_grammar_state *src) {
    dst->g = src->g;
    llm_gr_set_assign(&dst->set, &src->set);
    dst->partial = src->partial; dst->partial_left = src->partial_left; dst->partial_len = src->partial_len;
}

llm_grammar_state *llm_grammar_state_copy(const llm_grammar_state *st) {
    llm_grammar_state *c = (llm_grammar_state *)calloc(1, sizeof *c);
    if (c) llm_gr_state_assign(c, st);
    return c;
}

void llm_grammar_state_free(llm_grammar_state *st) {
    if (!st) return;
    llm_gr_set_free(&st->set); llm_gr_set_free(&st->next[0]); llm_gr_set_free(&st->next[1]);
    llm_gr_set_free(&st->seen); arrfree(st->buf);
    free(st);
}

int llm_grammar_accept(llm_grammar_state *st, const char *bytes, int n) {
    llm_gr_set *sets = st->next;
    const llm_gr_set *cur = &st->set;
    uint32_t cp = st->partial;
    int left = st->partial_left, len = st->partial_len, rc = 0, k = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        int r = llm_gr_byte(&cp, &left, &len, (unsigned char)bytes[i]);
        if (r < 0) rc = -1;
        else if (r == 1) {
            llm_gr_set *out = &sets[k];
            k ^= 1;
            rc = llm_gr_step(st->g, cur, cp, out, &st->buf, &st->seen) != 0 ||
                arrlen(out->lens) == 0 ? -1 : 0;
            cur = out;
        }
    }
    if (rc == 0 && !llm_gr_partial_ok(st->g, cur, cp, left, len)) rc = -1;
    if (rc == 0) {
        if (cur != &st->set) { llm_gr_set old = st->set; st->set = *cur; *(llm_gr_set *)cur = old; }
        st->partial = cp; st->partial_left = left; st->partial_len = len;
    }
    return rc;
}

int llm_grammar_can_end(const llm_grammar_state *st) {
    if (st->partial_left) return 0;
    for (ptrdiff_t i = 0; i < arrlen(st->set.lens); i++) if (!st->set.lens[i]) return 1;
    return 0;
}

int llm_grammar_done(const llm_grammar_state *st) {
    return !st->partial_left && arrlen(st->set.lens) == 1 && st->set.lens[0] == 0;
}

/* ---- Token masks: the vocabulary as a trie, walked once per state -------------------------------------- */
/* The nodes in preorder: a node's subtree is the nodes from it to end[node], so a prefix the grammar refuses
 * skips every token that begins with it in one jump. */
struct llm_token_trie {
    int n_vocab, max_len, n_nodes;
    uint8_t *byte;                  /* [n_nodes] the byte from the node's parent to it */
    uint16_t *depth;                /* [n_nodes] its bytes: 1 for the root's children */
    int32_t *end;                   /* [n_nodes] the node after its subtree */
    int32_t *first;                 /* [n_nodes + 1] where the tokens whose bytes end at a node begin in
                                     * ... */
    int32_t *tokens;                /* [tokens with bytes] ... every such token, in the nodes' order */
    char *bytes; int64_t *offset;   /* [n_vocab + 1] every token's bytes, one after another */
    int32_t *ends;                  /* stb_ds: the tokens that end generation (allowed where the text is
                                     * whole) */
};

typedef struct { const char *s; int len; int32_t id; } llm_trie_entry;
static int llm_trie_entry_cmp(const void *a, const void *b) {
    const llm_trie_entry *x = (const llm_trie_entry *)a, *y = (const llm_trie_entry *)b;
    int n = x->len < y->len ? x->len : y->len, c = memcmp(x->s, y->s, (size_t)n);
    if (c) return c;
    return x->len != y->len ? x->len - y->len : x->id - y->id;
}

void llm_token_trie_free(llm_token_trie *tt) {
    if (!tt) return;
    free(tt->byte); free(tt->depth); free(tt->end); free(tt->first); free(tt->tokens);
    free(tt->bytes); free(tt->offset); arrfree(tt->ends);
    free(tt);
}

llm_token_trie *llm_token_trie_build(const llm_tokenizer *t, char *err) {
    int V = llm_tokenizer_n_vocab(t);
    llm_token_trie *tt = (llm_token_trie *)calloc(1, sizeof *tt);
    llm_trie_entry *ent = (llm_trie_entry *)malloc(((size_t)V + 1) * sizeof *ent);
    char *blob = NULL; /* stb_ds */
    if (!tt || !ent || !(tt->offset = (int64_t *)malloc(((size_t)V + 1) * sizeof(int64_t)))) goto oom;
    tt->n_vocab = V;
    for (int id = 0; id < V; id++) { /* the bytes a token adds to the text (control tokens: none) */
        tt->offset[id] = arrlen(blob);
        char small[64];
        int n = llm_tokenizer_piece(t, id, 0, small, (int)sizeof small);
        if (n > (int)sizeof small) n = llm_tokenizer_piece(t, id, 0, arraddnptr(blob, n), n);
        else if (n > 0) memcpy(arraddnptr(blob, n), small, (size_t)n);
        if (n > 65535) goto oom;
        if (n > tt->max_len) tt->max_len = n;
    }
    tt->offset[V] = arrlen(blob);
    if (!(tt->bytes = (char *)malloc((size_t)arrlen(blob) + 1))) goto oom;
    if (arrlen(blob)) memcpy(tt->bytes, blob, (size_t)arrlen(blob));
    arrfree(blob);
    int n_ent = 0;
    int64_t n_bytes = 0;
    for (int id = 0; id < V; id++) {
        int len = (int)(tt->offset[id + 1] - tt->offset[id]);
        if (len > 0) { llm_trie_entry e = {tt->bytes + tt->offset[id], len, id};
                       ent[n_ent++] = e; n_bytes += len; }
    }
    qsort(ent, (size_t)n_ent, sizeof *ent, llm_trie_entry_cmp);
    size_t cap = (size_t)n_bytes + 1;
    tt->byte = (uint8_t *)malloc(cap); tt->depth = (uint16_t *)malloc(cap * sizeof(uint16_t));
    tt->end = (int32_t *)malloc(cap * sizeof(int32_t));
    tt->first = (int32_t *)calloc(cap + 1, sizeof(int32_t));
    tt->tokens = (int32_t *)malloc(((size_t)n_ent + 1) * sizeof(int32_t));
    int32_t *path = (int32_t *)malloc(((size_t)tt->max_len + 1) * sizeof(int32_t));
    if (!tt->byte || !tt->depth || !tt->end || !tt->first || !tt->tokens || !path) { free(path); goto oom; }
    for (int i = 0; i < n_ent; i++) { /* sorted: each token shares a prefix with the one before, the rest is
                                       * new */
        int common = 0;
        if (i > 0) {
            int m = ent[i - 1].len < ent[i].len ? ent[i - 1].len : ent[i].len;
            while (common < m && ent[i - 1].s[common] == ent[i].s[common]) common++;
        }
        for (int d = common + 1; d <= ent[i].len; d++) {
            int32_t node = tt->n_nodes++;
            tt->byte[node] = (uint8_t)ent[i].s[d - 1]; tt->depth[node] = (uint16_t)d;
            path[d] = node;
        }
        tt->first[path[ent[i].len] + 1]++; /* counted at its node (the node of the token before, if the same
                                            * bytes): the tokens come in the nodes' order */
        tt->tokens[i] = ent[i].id;
    }
    for (int32_t i = 0; i < tt->n_nodes; i++) tt->first[i + 1] += tt->first[i];
    for (int32_t i = 0, top = 0; i <= tt->n_nodes; i++) { /* end: the next node no deeper than it */
        int d = i < tt->n_nodes ? tt->depth[i] : 0;
        while (top > 0 && tt->depth[path[top - 1]] >= d) tt->end[path[--top]] = i;
        if (i < tt->n_nodes) path[top++] = i;
    }
    free(path); free(ent);
    for (ptrdiff_t i = 0; i < arrlen(t->eog); i++) arrput(tt->ends, t->eog[i]);
    return tt;
oom:
    arrfree(blob); free(ent); llm_token_trie_free(tt);
    llm_fail(err, "out of memory for the vocabulary's trie");
    return NULL;
}

/* A state written out for the masks' cache: its partial character, then each stack with its length */
static uint32_t *llm_gr_state_key(const llm_grammar_state *st, int *n, uint64_t *hash) {
    int m = 3 + (int)arrlen(st->set.lens) + (int)arrlen(st->set.data);
    uint32_t *key = (uint32_t *)malloc((size_t)m * sizeof *key);
    if (!key) return NULL;
    key[0] = st->partial; key[1] = (uint32_t)st->partial_left; key[2] = (uint32_t)st->partial_len;
    int k = 3;
    size_t at = 0;
    for (ptrdiff_t i = 0; i < arrlen(st->set.lens); i++) {
        key[k++] = st->set.lens[i];
        for (uint32_t j = 0; j < st->set.lens[i]; j++) key[k++] = st->set.data[at++];
    }
    uint64_t h = 0x84222325cbf29ce4ull;
    for (int i = 0; i < m; i++) { h ^= key[i]; h *= 0x100000001b3ull; }
    *n = m; *hash = h;
    return key;
}

/* The walk: the trie in preorder, the state after each node's bytes kept per depth, a subtree skipped where
 * its prefix is refused. A state is a set of stacks; the sets one walk meets are few (inside a JSON string,
 * every ordinary character leads back to the same set), so each is kept once, by number, and each (set,
 * character) step is computed once: most nodes cost a lookup in a table, by ASCII character, or for all the
 * characters past ASCII at once where the set's classes do not tell them apart (most of a 150k vocabulary is
 * such characters, byte by byte). Returns the tokens allowed (bits set in mask, which is zeroed), -1 when out
 * of memory or the grammar's limits are passed. */
typedef struct { uint64_t key; int32_t value; } llm_gr_memo;

/* The walk's steps, (set, character) -> set: an open-addressed table of 64-bit keys (a general hash map
 * costs half the walk here) */
typedef struct { uint64_t *keys; int32_t *vals; size_t cap, n; } llm_gr_steps; /* vals: 0 empty, else set +
                                                                                * 2 */

static uint64_t llm_gr_mix(uint64_t k) { k ^= k >> 33; k *= 0xff51afd7ed558ccdull; return k ^ (k >> 33); }

/* The slot of key: its value (set + 2), or 0 where it may be put. NULL when out of memory. */
static int32_t *llm_gr_steps_slot(llm_gr_steps *t, uint64_t key) {
    if (2 * (t->n + 1) > t->cap) { /* grow: every key into a table twice the size */
        size_t cap = t->cap ? 2 * t->cap : 4096;
        uint64_t *keys = (uint64_t *)malloc(cap * sizeof *keys);
        int32_t *vals = (int32_t *)calloc(cap, sizeof *vals);
        if (!keys || !vals) { free(keys); free(vals); return NULL; }
        for (size_t i = 0; i < t->cap; i++) {
            if (!t->vals[i]) continue;
            size_t j = llm_gr_mix(t->keys[i]) & (cap - 1);
            while (vals[j]) j = (j + 1) & (cap - 1);
            keys[j] = t->keys[i]; vals[j] = t->vals[i];
        }
        free(t->keys); free(t->vals);
        t->keys = keys; t->vals = vals; t->cap = cap;
    }
    size_t j = llm_gr_mix(key) & (t->cap - 1);
    while (t->vals[j] && t->keys[j] != key) j = (j + 1) & (t->cap - 1);
    t->keys[j] = key;
    return &t->vals[j];
}

static uint64_t llm_gr_set_hash(const llm_gr_set *s) {
    uint64_t h = 0x84222325cbf29ce4ull;
    for (ptrdiff_t i = 0; i < arrlen(s->lens); i++) { h ^= s->lens[i]; h *= 0x100000001b3ull; }
    for (ptrdiff_t i = 0; i < arrlen(s->data); i++) { h ^= s->data[i]; h *= 0x100000001b3ull; }
    return h;
}

static int llm_gr_set_equal(const llm_gr_set *a, const llm_gr_set *b) {
    return arrlen(a->lens) == arrlen(b->lens) && arrlen(a->data) == arrlen(b->data) &&
           !memcmp(a->lens, b->lens, (size_t)arrlen(a->lens) * sizeof(uint32_t)) &&
           (!arrlen(a->data) || !memcmp(a->data, b->data, (size_t)arrlen(a->data) * sizeof(uint32_t)));
}

/* Whether the class at e matches every code point of [lo, hi] (1), none of them (0), or some (-1) */
static int llm_gr_class_covers(const llm_gr_elem *e, uint32_t lo, uint32_t hi) {
    int positive = e->type != LLM_GR_CHAR_NOT, all = 0, some = 0;
    do {
        uint32_t a = e->value, b = e[1].type == LLM_GR_CHAR_UPPER ? e[1].value : e->value;
        if (e->type == LLM_GR_CHAR_ANY) { a = 0; b = 0x10FFFF; }
        if (a <= lo && hi <= b) all = 1;
        else if (a <= hi && lo <= b) some = 1;
        e += e->type != LLM_GR_CHAR_ANY && e[1].type == LLM_GR_CHAR_UPPER ? 2 : 1;
    } while (e->type == LLM_GR_CHAR_ALT);
    return all ? positive : some ? -1 : !positive;
}

typedef struct {
    llm_grammar *g;                 /* g->walk: the sets met, by number (0: the start), and one more at the
                                     * end as the step's scratch */
    int n_sets;
    llm_gr_memo *by_hash;           /* stb_ds: a set's hash -> its number */
    int32_t *ascii;                 /* stb_ds: [set][128] the steps by ASCII characters, -2 until known */
    int32_t *wide;                  /* stb_ds: [set] where every character past ASCII leads alike (a JSON
                                     * string's, most classes'): there, -1 nowhere; -2 not known yet; -3 the
                                     * set's classes tell such characters apart */
    llm_gr_steps steps;             /* and for those: (set, character) -> set + 2 */
} llm_gr_walker;

/* The set `from` leads to by the character cp, numbered (a new one gets the next number); -1 when no stack
 * takes cp, -2 when out of memory or the grammar's limits are passed. */
static int32_t llm_gr_walk_step(llm_gr_walker *w, int32_t from, uint32_t cp) {
    llm_grammar *g = w->g;
    while (arrlen(g->walk) <= w->n_sets) { llm_gr_set empty = {0}; arrput(g->walk, empty); }
    llm_gr_set *out = &g->walk[w->n_sets];
    if (llm_gr_step(g, &g->walk[from], cp, out, &g->walk_buf, &g->walk_seen) != 0) return -2;
    if (!arrlen(out->lens)) return -1;
    uint64_t h = llm_gr_set_hash(out);
    ptrdiff_t same = hmgeti(w->by_hash, h);
    if (same >= 0 && llm_gr_set_equal(&g->walk[w->by_hash[same].value], out)) return w->by_hash[same].value;
    if (same < 0) hmput(w->by_hash, h, w->n_sets);
    for (int c = 0; c < 128; c++) arrput(w->ascii, -2);
    arrput(w->wide, -2);
    return w->n_sets++;
}

/* Where every character past ASCII leads from the set `from`, when the top of each of its stacks takes all
 * of them or none (then the step by U+0080 stands for them all, and a character begun goes on exactly
 * when that step goes somewhere); -3 when they do not, -2 when out of memory. */
static int32_t llm_gr_walk_wide(llm_gr_walker *w, int32_t from) {
    if (w->wide[from] != -2) return w->wide[from];
    const llm_gr_set *s = &w->g->walk[from];
    size_t at = 0;
    for (ptrdiff_t i = 0; i < arrlen(s->lens); at += s->lens[i++])
        if (s->lens[i] && llm_gr_class_covers(&w->g->elems[s->data[at + s->lens[i] - 1]], 0x80, 0x10FFFF) < 0)
            return w->wide[from] = -3;
    int32_t to = llm_gr_walk_step(w, from, 0x80);
    if (to != -2) w->wide[from] = to;
    return to;
}

static int llm_gr_walk(llm_grammar *g, const llm_grammar_state *st, const llm_token_trie *tt, uint8_t *mask) {
    for (ptrdiff_t i = 0; i < arrlen(g->walk); i++) llm_gr_set_clear(&g->walk[i]);
    llm_gr_walker w = {g, 1, NULL, NULL, NULL, {NULL, NULL, 0, 0}};
    int32_t *set_at = (int32_t *)malloc(((size_t)tt->max_len + 1) * sizeof(int32_t));
    int *part = (int *)malloc(((size_t)tt->max_len + 1) * 3 * sizeof(int));
    int n_allowed = 0, rc = 0;
    if (!arrlen(g->walk)) { llm_gr_set empty = {0}; arrput(g->walk, empty); }
    llm_gr_set_assign(&g->walk[0], &st->set);
    for (int c = 0; c < 128; c++) arrput(w.ascii, -2);
    arrput(w.wide, -2);
    if (!set_at || !part) rc = -1;
    else {
        set_at[0] = 0;
        part[0] = (int)st->partial; part[1] = st->partial_left; part[2] = st->partial_len;
    }
    for (int32_t i = 0; rc == 0 && i < tt->n_nodes;) {
        int d = tt->depth[i];
        uint32_t cp = (uint32_t)part[3 * (d - 1)];
        int left = part[3 * (d - 1) + 1], len = part[3 * (d - 1) + 2], from = set_at[d - 1], to;
        int r = llm_gr_byte(&cp, &left, &len, tt->byte[i]);
        if (r < 0) to = -1;
        else if (r == 1 && cp < 128) { /* ASCII: by table */
            if ((to = w.ascii[(size_t)from * 128 + cp]) == -2) {
                if ((to = llm_gr_walk_step(&w, from, cp)) == -2) { rc = -1; break; }
                w.ascii[(size_t)from * 128 + cp] = to;
            }
        } else if ((to = llm_gr_walk_wide(&w, from)) != -3) { /* past ASCII, every character alike */
            if (to == -2) { rc = -1; break; }
            if (r == 0) to = to >= 0 ? from : -1; /* a character begun: it stays in the set until whole */
        } else { /* past ASCII, where the classes tell characters apart: each (set, character) once */
            uint64_t key = (uint64_t)from << 32 | (uint64_t)(r == 0) << 31 | (uint64_t)len << 28 |
                           (uint64_t)left << 24 | cp;
            int32_t *slot = llm_gr_steps_slot(&w.steps, key);
            if (!slot) { rc = -1; break; }
            if (*slot) to = *slot - 2;
            else {
                if (r == 0) to = llm_gr_partial_ok(g, &g->walk[from], cp, left, len) ? from : -1;
                else if ((to = llm_gr_walk_step(&w, from, cp)) == -2) { rc = -1; break; }
                *slot = to + 2; w.steps.n++;
            }
        }
        if (to < 0) { i = tt->end[i]; continue; } /* refused: every token below this node is too */
        set_at[d] = to;
        part[3 * d] = (int)cp; part[3 * d + 1] = left; part[3 * d + 2] = len;
        for (int32_t k = tt->first[i]; k < tt->first[i + 1]; k++) {
            int32_t tok = tt->tokens[k];
            mask[tok >> 3] |= (uint8_t)(1u << (tok & 7));
        }
        n_allowed += tt->first[i + 1] - tt->first[i];
        i++;
    }
    free(w.steps.keys); free(w.steps.vals); hmfree(w.by_hash); arrfree(w.ascii); arrfree(w.wide);
    free(set_at); free(part);
    return rc == 0 ? n_allowed : -1;
}

int llm_grammar_mask(const llm_grammar_state *st, const llm_token_trie *tt, uint8_t *mask) {
    llm_grammar *g = (llm_grammar *)st->g; /* its cache and scratch change; its rules do not */
    size_t mask_bytes = ((size_t)tt->n_vocab + 7) / 8;
    int n_key;
    uint64_t hash;
    uint32_t *key = llm_gr_state_key(st, &n_key, &hash);
    if (!key) return -1;
    if (g->cache_trie != tt) { /* masks of another vocabulary: of no use */
        for (ptrdiff_t i = 0; i < arrlen(g->cache); i++) { free(g->cache[i].key); free(g->cache[i].mask); }
        arrsetlen(g->cache, 0);
        g->cache_trie = tt;
    }
    for (ptrdiff_t i = 0; i < arrlen(g->cache); i++) {
        llm_gr_cached_mask *c = &g->cache[i];
        if (c->hash == hash && c->n_key == n_key && !memcmp(c->key, key, (size_t)n_key * sizeof *key)) {
            memcpy(mask, c->mask, mask_bytes);
            g->cache_hits++;
            free(key);
            return c->n_allowed;
        }
    }
    memset(mask, 0, mask_bytes);
    int n_allowed = llm_gr_walk(g, st, tt, mask);
    if (n_allowed < 0) { free(key); return -1; }
    int can_end = llm_grammar_can_end(st);
    for (ptrdiff_t i = 0; i < arrlen(tt->ends); i++) { /* the end of generation: where the text is whole */
        int32_t tok = tt->ends[i];
        int was = mask[tok >> 3] >> (tok & 7) & 1;
        if (was != can_end) { mask[tok >> 3] ^= (uint8_t)(1u << (tok & 7)); n_allowed += can_end ? 1 : -1; }
    }
    llm_gr_cached_mask c = {hash, key, n_key, (uint8_t *)malloc(mask_bytes), n_allowed};
    if (!c.mask) { free(key); return n_allowed; }
    memcpy(c.mask, mask, mask_bytes);
    if (arrlen(g->cache) < LLM_GR_CACHE) arrput(g->cache, c);
    else { /* full: the oldest goes */
        free(g->cache[g->cache_next].key); free(g->cache[g->cache_next].mask);
        g->cache[g->cache_next] = c;
        g->cache_next = (g->cache_next + 1) % LLM_GR_CACHE;
    }
    return n_allowed;
}

/* Whether token may come next from st; when it adds text, next (a scratch state) is left where it leads. */
static int llm_gr_allows_into(const llm_grammar_state *st, const llm_token_trie *tt, int32_t token,
                              llm_grammar_state *next) {
    if (token < 0 || token >= tt->n_vocab) return 0;
    for (ptrdiff_t i = 0; i < arrlen(tt->ends); i++) if (tt->ends[i] == token) return llm_grammar_can_end(st);
    int64_t n = tt->offset[token + 1] - tt->offset[token];
    if (n == 0) return 0; /* a control token adds no text: it would not move the grammar on */
    llm_gr_state_assign(next, st);
    return llm_grammar_accept(next, tt->bytes + tt->offset[token], (int)n) == 0;
}

int llm_grammar_allows(const llm_grammar_state *st, const llm_token_trie *tt, int32_t token) {
    llm_grammar_state next;
    memset(&next, 0, sizeof next);
    int ok = llm_gr_allows_into(st, tt, token, &next);
    llm_gr_set_free(&next.set); llm_gr_set_free(&next.next[0]); llm_gr_set_free(&next.next[1]);
    llm_gr_set_free(&next.seen); arrfree(next.buf);
    return ok;
}

/* ---- Regular expressions, written as GBNF ---------------------------------------------------------------
 * The subset people write in patterns: literals and escapes, ., classes, groups (capturing, (?:...), named),
 * alternation, the quantifiers * + ? {m} {m,} {m,n} (lazy ones taken as greedy: the language is the same),
 * and ^ $ at the ends. Inside a JSON string (a schema's pattern) what the regex matches is the string's
 * value: a quote, a backslash or a control character is written as its JSON escape. */
#define LLM_RE_DEPTH 64             /* groups inside groups (each a few frames of the recursive reader) */
typedef struct {
    const char *p, *start;
    char *out;                      /* stb_ds: the GBNF expression */
    int json;                       /* inside a JSON string */
    int work;                       /* items read so far, again and again: see llm_re_item */
    char *err;
} llm_re;

static int llm_re_fail(llm_re *re, const char *what) {
    if (!re->err[0]) llm_fail(re->err, "regex: %s at offset %d", what, (int)(re->p - re->start));
    return -1;
}

/* A code point inside a GBNF literal or class: printable ASCII as itself (escaped where GBNF needs it),
 * the rest as \x, \u or \U */
static void llm_re_gbnf_char(char **out, uint32_t c, int in_class) {
    if (c >= 0x20 && c < 0x7F) {
        if (c == '"' || c == '\\' || (in_class && (c == ']' || c == '[' || c == '-' || c == '^')))
            arrput(*out, '\\');
        arrput(*out, (char)c);
    } else if (c < 0x100) llm_str_printf(out, "\\x%02X", c);
    else if (c < 0x10000) llm_str_printf(out, "\\u%04X", c);
    else llm_str_printf(out, "\\U%08X", c);
}

/* One character as a GBNF item: itself, or (in a JSON string) its escape */
static void llm_re_literal(llm_re *re, uint32_t c) {
    const char *named = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" :
                        c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
    arrput(re->out, '"');
    if (re->json && (named || c < 0x20)) {
        if (named) for (const char *s = named; *s; s++) llm_re_gbnf_char(&re->out, (unsigned char)*s, 0);
        else { char u[8]; snprintf(u, sizeof u, "\\u%04x", c);
               for (char *s = u; *s; s++) llm_re_gbnf_char(&re->out, (unsigned char)*s, 0); }
    } else llm_re_gbnf_char(&re->out, c, 0);
    arrput(re->out, '"');
}

typedef struct { uint32_t lo, hi; } llm_re_range;

/* The ranges of a class escape (\d \w \s); 0 when c is not one */
static int llm_re_class_escape(int c, llm_re_range *r) {
    static const llm_re_range d[] = {{'0', '9'}}, w[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
                              s[] = {{'\t', '\r'}, {' ', ' '}};
    const llm_re_range *src = c == 'd' ? d : c == 'w' ? w : c == 's' ? s : NULL;
    int n = c == 'd' ? 1 : c == 'w' ? 4 : c == 's' ? 2 : 0;
    for (int i = 0; i < n; i++) r[i] = src[i];
    return n;
}

/* A character of a regex (after a backslash or not) as a code point; -1 when broken */
static int64_t llm_re_char(llm_re *re) {
    const unsigned char *s = (const unsigned char *)re->p;
    if (*s != '\\') {
        int k = llm_utf8_check(s, strlen((const char *)s));
        if (k <= 0) return llm_re_fail(re, "text that is not UTF-8");
        re->p += k;
        return llm_utf8_decode(s, k);
    }
    int e = s[1];
    if (!e) return llm_re_fail(re, "a lone backslash at the end");
    const char *named = strchr("ntrfv0", e);
    if (named) { re->p += 2; return "\n\t\r\f\v"[named - "ntrfv0"]; }
    if (e == 'x' || e == 'u') {
        int digits = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = llm_hex_digit(s[2 + i]);
            if (h < 0) return llm_re_fail(re, "\\x or \\u without its hex digits");
            v = v * 16 + (uint32_t)h;
        }
        re->p += 2 + digits;
        return v;
    }
    if (e < 0x80 && ispunct(e)) { re->p += 2; return e; }
    if (e >= '1' && e <= '9') return llm_re_fail(re, "backreferences (\\1) are not supported");
    if (e == 'b' || e == 'B' || e == 'A' || e == 'Z' || e == 'z')
        return llm_re_fail(re, "anchors and word boundaries inside the pattern (\\b, \\A, "
                               "\\Z) are not supported");
    return llm_re_fail(re, "an unknown escape");
}

static int llm_re_range_cmp(const void *a, const void *b) {
    const llm_re_range *x = (const llm_re_range *)a, *y = (const llm_re_range *)b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* A class as GBNF: its ranges, negated or not. Inside a JSON string, the characters that need an escape (the
 * controls, the quote, the backslash) are taken out of the class and, where the class takes them, written as
 * alternatives in their escaped form. */
static void llm_re_class_out(llm_re *re, const llm_re_range *r, int n, int negated) {
    llm_re_range *kept = (llm_re_range *)malloc(((size_t)n * 3 + 4) * sizeof *kept);
    uint32_t specials[40];
    int m = 0, n_special = 0;
    if (!kept) { llm_re_fail(re, "out of memory"); return; }
    for (int i = 0; i < n; i++) {
        if (!re->json || negated) { kept[m++] = r[i]; continue; }
        for (uint32_t c = 0; c < 0x60; c++) /* the specials in this range */
            if ((c < 0x20 || c == '"' || c == '\\') && c >= r[i].lo && c <= r[i].hi)
                specials[n_special++] = c;
        uint32_t lo = r[i].lo < 0x20 ? 0x20 : r[i].lo; /* and the range less them, in pieces */
        for (uint32_t c = lo; c <= r[i].hi && c <= '\\'; c++)
            if (c == '"' || c == '\\') {
                if (c > lo) { llm_re_range piece = {lo, c - 1}; kept[m++] = piece; }
                lo = c + 1;
            }
        if (lo <= r[i].hi) { llm_re_range piece = {lo, r[i].hi}; kept[m++] = piece; }
    }
    if (re->json && negated) { /* the escapes are not taken: a class never writes them */
        llm_re_range sp[3] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
        for (int k = 0; k < 3; k++) kept[m++] = sp[k];
    }
    int alts = (m > 0 || negated) + n_special;
    if (alts > 1) arrput(re->out, '(');
    if (m > 0 || negated) {
        arrput(re->out, '[');
        if (negated) arrput(re->out, '^');
        for (int i = 0; i < m; i++) {
            llm_re_gbnf_char(&re->out, kept[i].lo, 1);
            if (kept[i].hi != kept[i].lo) { arrput(re->out, '-'); llm_re_gbnf_char(&re->out, kept[i].hi, 1); }
        }
        arrput(re->out, ']');
    }
    for (int k = 0; k < n_special; k++) {
        if (k || m > 0 || negated) llm_str_puts(&re->out, " | ");
        llm_re_literal(re, specials[k]);
    }
    if (alts > 1) arrput(re->out, ')');
    if (!alts) llm_str_puts(&re->out, "[^\\x00-\\U0010FFFF]"); /* a class no character matches */
    free(kept);
}

static int llm_re_class(llm_re *re) {
    re->p++; /* [ */
    int negated = *re->p == '^';
    if (negated) re->p++;
    llm_re_range *r = NULL; /* stb_ds */
    int first = 1;
    while (*re->p && (*re->p != ']' || first)) {
        first = 0;
        llm_re_range esc[4];
        int n = re->p[0] == '\\' ? llm_re_class_escape(re->p[1], esc) : 0;
        if (n) { re->p += 2; for (int i = 0; i < n; i++) arrput(r, esc[i]); continue; }
        if (re->p[0] == '\\' && (re->p[1] == 'D' || re->p[1] == 'W' || re->p[1] == 'S')) {
            arrfree(r);
            return llm_re_fail(re, "\\D, \\W and \\S inside a class are not supported");
        }
        if (re->p[0] == '[' && re->p[1] == ':') {
            arrfree(r); return llm_re_fail(re, "POSIX classes ([:alpha:]) are not supported"); }
        int64_t lo = llm_re_char(re), hi = lo;
        if (lo < 0) { arrfree(r); return -1; }
        if (re->p[0] == '-' && re->p[1] && re->p[1] != ']') {
            re->p++;
            if ((hi = llm_re_char(re)) < 0) { arrfree(r); return -1; }
            if (hi < lo) { arrfree(r); return llm_re_fail(re, "a range that ends before it begins"); }
        }
        llm_re_range range = {(uint32_t)lo, (uint32_t)hi};
        arrput(r, range);
    }
    if (*re->p != ']') { arrfree(r); return llm_re_fail(re, "a class is not closed"); }
    re->p++;
    qsort(r, (size_t)arrlen(r), sizeof *r, llm_re_range_cmp);
    int m = 0; /* merged: overlapping and touching ranges as one */
    for (int i = 0; i < arrlen(r); i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) { if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi; }
        else r[m++] = r[i];
    }
    llm_re_class_out(re, r, m, negated);
    arrfree(r);
    return 0;
}

/* A repetition of what can match the empty text (a?*, (a|)+, (a?b?){2,}) would be a left-recursive rule in
 * GBNF (its part could go round without reading a character), which GBNF refuses; its language is that of the
 * part's non-empty texts repeated: (a|)* is (a)*. So each part is written in one of two forms: as it is, or
 * (nonempty) less the empty text. A part learnt to be able to match nothing is read again from its text in
 * the other form; re->work bounds what patterns of such parts nested in each other cost. */
static int llm_re_alternation(llm_re *re, int depth, int nonempty, int *nullable);

/* What one item is before its quantifier: a group, a class, a literal; *nullable: it can match nothing */
static int llm_re_atom(llm_re *re, int depth, int nonempty, int *nullable) {
    char c = *re->p;
    *nullable = 0;
    if (c == '(') {
        re->p++;
        if (*re->p == '?') {
            if (re->p[1] == ':') re->p += 2;
            else if (re->p[1] == 'P' && re->p[2] == '<') re->p += 3;
            else if (re->p[1] == '<' && re->p[2] != '=' && re->p[2] != '!') re->p += 2;
            else return llm_re_fail(re, "lookaround and flags ((?=, (?!, (?i) ...) are not supported");
            if (re->p[-1] == '<') { /* a name, skipped */
                while (*re->p && *re->p != '>') re->p++;
                if (*re->p++ != '>') return llm_re_fail(re, "a group's name is not closed");
            }
        }
        if (depth >= LLM_RE_DEPTH) { /* checked before going in: the recursion is at most this deep */
            char what[64];
            snprintf(what, sizeof what, "groups nested too deep (more than %d)", LLM_RE_DEPTH);
            return llm_re_fail(re, what);
        }
        arrput(re->out, '(');
        if (llm_re_alternation(re, depth + 1, nonempty, nullable) != 0) return -1;
        if (*re->p != ')') return llm_re_fail(re, "a ')' is missing");
        re->p++;
        arrput(re->out, ')');
    } else if (c == '[') {
        if (llm_re_class(re) != 0) return -1;
    } else if (c == '.') {
        re->p++;
        llm_str_puts(&re->out, re->json ? "[^\"\\\\\\x00-\\x1F]" : "[^\\n]");
    } else if (c == '\\' && (re->p[1] == 'd' || re->p[1] == 'w' || re->p[1] == 's' || re->p[1] == 'D' ||
                             re->p[1] == 'W' || re->p[1] == 'S')) {
        llm_re_range r[4];
        int n = llm_re_class_escape(tolower((unsigned char)re->p[1]), r);
        llm_re_class_out(re, r, n, isupper((unsigned char)re->p[1]));
        re->p += 2;
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        return llm_re_fail(re, "a quantifier with nothing before it");
    } else {
        int64_t ch = llm_re_char(re);
        if (ch < 0) return -1;
        llm_re_literal(re, (uint32_t)ch);
    }
    return 0;
}

/* The quantifier after an item: 1 with {*min, *max} (max -1: no bound), 0 when there is none */
static int llm_re_quantifier(llm_re *re, long *min, long *max) {
    char c = *re->p;
    if (c == '*' || c == '+' || c == '?') { *min = c == '+'; *max = c == '?' ? 1 : -1; re->p++; }
    else if (c == '{' && isdigit((unsigned char)re->p[1])) {
        char *end;
        *min = *max = strtol(re->p + 1, &end, 10);
        if (*end == ',' && isdigit((unsigned char)end[1])) *max = strtol(end + 1, &end, 10);
        else if (*end == ',') { *max = -1; end++; } /* {m,} */
        if (*end != '}') return llm_re_fail(re, "a bad {m,n}");
        if (*min > 1000 || *max > 1000 || (*max >= 0 && *max < *min))
            return llm_re_fail(re, "a repetition count over 1000 or {m,n} with n < m");
        re->p = end + 1;
    } else return 0;
    if (*re->p == '?') re->p++; /* lazy: the same language */
    else if (*re->p == '+') return llm_re_fail(re, "possessive quantifiers are not supported");
    return 1;
}

static void llm_re_put_quantifier(llm_re *re, long min, long max) {
    if (min == 1 && max == 1) return;
    if (min == 0 && max < 0) arrput(re->out, '*');
    else if (min == 1 && max < 0) arrput(re->out, '+');
    else if (min == 0 && max == 1) arrput(re->out, '?');
    else if (max < 0) llm_str_printf(&re->out, "{%ld,}", min);
    else if (min == max) llm_str_printf(&re->out, "{%ld}", min);
    else llm_str_printf(&re->out, "{%ld,%ld}", min, max);
}

/* One item with its quantifier, as it is or (nonempty) less the empty text */
static int llm_re_item(llm_re *re, int depth, int nonempty, int *nullable) {
    const char *at = re->p, *after;
    size_t out_at = (size_t)arrlen(re->out);
    int atom_nullable;
    long min = 1, max = 1;
    if (++re->work > 100000)
        return llm_re_fail(re, "a pattern too complex (repetitions of what can be empty)");
    if (llm_re_atom(re, depth, 0, &atom_nullable) != 0 || llm_re_quantifier(re, &min, &max) < 0) return -1;
    *nullable = atom_nullable || min == 0;
    if (nonempty ? !*nullable : !(atom_nullable && max < 0)) { /* as written */
        llm_re_put_quantifier(re, min, max);
        return 0;
    }
    if (nonempty && max == 0) { /* a{0} less the empty text: nothing at all, a class no character matches */
        arrsetlen(re->out, out_at);
        llm_str_puts(&re->out, "[^\\x00-\\U0010FFFF]");
    } else {
        if (atom_nullable) { /* the atom again, less the empty text */
            after = re->p; re->p = at;
            arrsetlen(re->out, out_at);
            if (llm_re_atom(re, depth, 1, &atom_nullable) != 0) return -1;
            re->p = after;
        }
        /* as written, (a|)* is (a)* and (a|){2,} is too; less the empty text, (a|)* is (a)+ and a? is a */
        llm_re_put_quantifier(re, !nonempty ? 0 : 1, max);
    }
    *nullable = !nonempty;
    return 0;
}

/* Items until | or ) or the end, as they are or (nonempty) less the empty text */
static int llm_re_sequence(llm_re *re, int depth, int nonempty, int *nullable) {
    const char **items = NULL; /* stb_ds: where each item begins */
    size_t out_at = (size_t)arrlen(re->out);
    int rc = 0, item_nullable;
    *nullable = 1;
    while (rc == 0 && *re->p && *re->p != '|' && *re->p != ')') {
        char c = *re->p;
        if (c == '^' && re->p == re->start) { re->p++; continue; }
        if (c == '$' && (re->p[1] == 0)) { re->p++; continue; }
        if (c == '^' || c == '$') {
            rc = llm_re_fail(re, "^ or $ inside the pattern (only at its ends) is not supported");
            break;
        }
        if (arrlen(items)) arrput(re->out, ' ');
        arrput(items, re->p);
        rc = llm_re_item(re, depth, 0, &item_nullable);
        *nullable &= item_nullable;
    }
    int n = (int)arrlen(items);
    if (rc == 0 && n == 0) llm_str_puts(&re->out, nonempty ? "[^\\x00-\\U0010FFFF]" : "\"\"");
    if (rc == 0 && n > 0 && nonempty && *nullable) { /* every item can be empty: the first non-empty one is
                                                      * j */
        const char *end = re->p;
        arrsetlen(re->out, out_at);
        arrput(re->out, '(');
        for (int j = 0; rc == 0 && j < n; j++) {
            if (j) llm_str_puts(&re->out, " | ");
            for (int i = j; rc == 0 && i < n; i++) {
                if (i > j) arrput(re->out, ' ');
                re->p = items[i];
                rc = llm_re_item(re, depth, i == j, &item_nullable);
            }
        }
        arrput(re->out, ')');
        re->p = end;
    }
    if (nonempty) *nullable = 0;
    arrfree(items);
    return rc;
}

static int llm_re_alternation(llm_re *re, int depth, int nonempty, int *nullable) {
    int seq_nullable;
    if (llm_re_sequence(re, depth, nonempty, nullable) != 0) return -1;
    while (*re->p == '|') {
        re->p++;
        llm_str_puts(&re->out, " | ");
        if (llm_re_sequence(re, depth, nonempty, &seq_nullable) != 0) return -1;
        *nullable |= seq_nullable;
    }
    return 0;
}

/* A regex as a GBNF expression appended to *out (json: inside a JSON string); -1 with the reason in err */
static int llm_re_to_gbnf(const char *regex, int json, char **out, char *err) {
    llm_re re = {regex, regex, *out, json, 0, err};
    int nullable;
    re.err[0] = 0;
    arrput(re.out, '(');
    int rc = llm_re_alternation(&re, 0, 0, &nullable);
    if (rc == 0 && *re.p) rc = llm_re_fail(&re, "an unmatched ')'");
    arrput(re.out, ')');
    *out = re.out;
    return rc;
}

char *llm_regex_to_grammar(const char *regex, char *err) {
    char buf[LLM_ERR_LEN], *out = NULL;
    if (!err) err = buf;
    if (!regex) { llm_fail(err, "regex: none given"); return NULL; }
    llm_str_puts(&out, "root ::= ");
    if (llm_re_to_gbnf(regex, 0, &out, err) != 0) { arrfree(out); return NULL; }
    arrput(out, '\n'); arrput(out, 0);
    char *text = strdup(out);
    arrfree(out);
    if (!text) llm_fail(err, "out of memory");
    return text;
}

/* Text as a GBNF literal */
static void llm_js_literal(char **out, const char *s, size_t n) {
    arrput(*out, '"');
    for (size_t i = 0; i < n;) {
        int k = llm_utf8_check((const unsigned char *)s + i, n - i);
        if (k <= 0) { llm_re_gbnf_char(out, 0xFFFD, 0); i++; continue; }
        llm_re_gbnf_char(out, llm_utf8_decode((const unsigned char *)s + i, k), 0);
        i += (size_t)k;
    }
    arrput(*out, '"');
}

/* Texts as GBNF alternatives whose shared beginnings are written once: a trie. Sorted, a node of it is a
 * run of texts that share their first `depth` bytes; its alternatives are the empty text when one ends
 * there, one per next character (the texts that go on with it share a longer part: one literal, then the
 * node below as a rule of its own), and the characters that end a text alone, as one class. So the grammar
 * is deterministic: along a shared part one stack moves, not one per text (4,000 choices with a long
 * common beginning cost a mask what one costs), and a node opens one stack per next character it has,
 * whatever the number of texts. The root's alternatives go to *body, the nodes below to rules named
 * prefix-T1, prefix-T2 ... in *rules (names no converter nor the parser makes). Nodes are taken from a
 * list, not by recursion; the work is linear in the texts' bytes. The texts are sorted in place. */
typedef struct { const char *s; size_t len; } llm_gr_text;
typedef struct { int lo, hi; size_t depth; int rule; } llm_gr_trie_node;

static int llm_gr_text_cmp(const void *a, const void *b) {
    const llm_gr_text *x = (const llm_gr_text *)a, *y = (const llm_gr_text *)b;
    int c = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static void llm_gr_trie(char **body, char **rules, const char *prefix, llm_gr_text *t, int n) {
    qsort(t, (size_t)n, sizeof *t, llm_gr_text_cmp);
    int m = 0;
    for (int i = 0; i < n; i++) if (!m || llm_gr_text_cmp(&t[m - 1], &t[i])) t[m++] = t[i]; /* once each */
    llm_gr_trie_node *todo = NULL, root = {0, m, 0, 0}; /* stb_ds */
    int n_rules = 0;
    uint32_t *ends = NULL; /* stb_ds: a node's characters that end a text alone */
    arrput(todo, root);
    while (arrlen(todo)) {
        llm_gr_trie_node nd = arrpop(todo);
        char **out = nd.rule ? rules : body;
        int alts = 0;
        if (nd.rule) llm_str_printf(out, "%s-T%d ::= ", prefix, nd.rule);
        arrsetlen(ends, 0);
        for (int i = nd.lo, j; i < nd.hi; i = j) {
            const unsigned char *c = (const unsigned char *)t[i].s + nd.depth;
            if (t[i].len == nd.depth) { llm_str_puts(out, alts++ ? " | \"\"" : "\"\""); j = i + 1; continue; }
            int k = llm_utf8_check(c, t[i].len - nd.depth);
            if (k <= 0) k = 1;
            j = i + 1; /* the run that goes on with the same character */
            while (j < nd.hi && t[j].len >= nd.depth + k && !memcmp(t[j].s + nd.depth, c, (size_t)k)) j++;
            if (j - i == 1 && t[i].len == nd.depth + k) { /* one character, and the text ends */
                arrput(ends, llm_utf8_check(c, (size_t)k) == k ? llm_utf8_decode(c, k) : 0xFFFD);
                continue;
            }
            if (alts++) llm_str_puts(out, " | ");
            if (j - i == 1) { llm_js_literal(out, (const char *)c, t[i].len - nd.depth); continue; }
            size_t lcp = nd.depth + (size_t)k; /* the run's common part: its first and last text's */
            while (lcp < t[i].len && lcp < t[j - 1].len && t[i].s[lcp] == t[j - 1].s[lcp]) lcp++;
            while (lcp > nd.depth + (size_t)k && lcp < t[j - 1].len && (t[j - 1].s[lcp] & 0xC0) == 0x80)
                lcp--; /* back to where a character begins */
            llm_js_literal(out, (const char *)c, lcp - nd.depth);
            llm_gr_trie_node below = {i, j, lcp, ++n_rules};
            llm_str_printf(out, " %s-T%d", prefix, below.rule);
            arrput(todo, below);
        }
        if (arrlen(ends)) llm_str_puts(out, alts++ ? " | " : "");
        if (arrlen(ends) == 1) { arrput(*out, '"'); llm_re_gbnf_char(out, ends[0], 0); arrput(*out, '"'); }
        else if (arrlen(ends) > 1) {
            arrput(*out, '[');
            for (ptrdiff_t e = 0; e < arrlen(ends); e++) llm_re_gbnf_char(out, ends[e], 1);
            arrput(*out, ']');
        }
        if (nd.rule) arrput(*out, '\n');
    }
    arrfree(todo); arrfree(ends);
}

char *llm_choice_to_grammar(const char *const *choices, int n, char *err) {
    if (n < 1 || !choices) { llm_fail(err, "a choice needs at least one string"); return NULL; }
    llm_gr_text *t = (llm_gr_text *)malloc((size_t)n * sizeof *t);
    if (!t) { llm_fail(err, "out of memory"); return NULL; }
    for (int i = 0; i < n; i++) {
        t[i].s = choices[i] ? choices[i] : "";
        t[i].len = strlen(t[i].s);
        for (size_t k = 0; k < t[i].len;) {
            int len = llm_utf8_check((const unsigned char *)t[i].s + k, t[i].len - k);
            if (len <= 0) { free(t); llm_fail(err, "choice %d is not UTF-8", i); return NULL; }
            k += (size_t)len;
        }
    }
    char *out = NULL, *rules = NULL; /* stb_ds */
    llm_str_puts(&out, "root ::= ");
    llm_gr_trie(&out, &rules, "root", t, n);
    arrput(out, '\n');
    if (arrlen(rules)) memcpy(arraddnptr(out, arrlen(rules)), rules, (size_t)arrlen(rules));
    arrput(out, 0);
    char *text = strdup(out);
    arrfree(out); arrfree(rules); free(t);
    if (!text) llm_fail(err, "out of memory");
    return text;
}

/* ---- JSON Schema, written as GBNF ------------------------------------------------------------------------
 * Each schema becomes a rule (a $ref's target one rule, named before it is written, so that recursive schemas
 * work). Values are written without whitespace around them; objects and arrays put bounded whitespace between
 * their parts (a space, or a newline and at most 20 spaces or tabs: a small model cannot run on in spaces).
 * The root rule ends where the value ends, so the sequence stops there. Properties come in the schema's
 * order; the required ones always, the others as the model likes. A keyword that would constrain the output
 * in a way not written here is refused, naming it and where it is; annotations are ignored. */
#define LLM_JS_XSTR(x) LLM_JS_STR(x) /* a limit's digits, for its message */
#define LLM_JS_STR(x) #x
#ifndef LLM_JS_MAX_RULES             /* (overridable, as the grammar's limits) */
#define LLM_JS_MAX_RULES 10000      /* the rules a schema may need: its work and the grammar's size */
#endif
#define LLM_JS_MAX_DEPTH 128        /* schemas written inside each other (properties, items, anyOf, allOf) */
#define LLM_JS_MAX_WORK 16777216    /* keywords and properties looked at (an allOf merges its parts' again) */
#define LLM_JS_MAX_PARTS 1000       /* the parts one allOf merges, with the allOf and $ref inside them */
static const char llm_js_too_many[] = "the schema needs more than " LLM_JS_XSTR(LLM_JS_MAX_RULES)
                                      " rules (its $refs, properties and alternatives together)";
typedef struct {                    /* a $ref's target, named, to be written after the schema that used it */
    const llm_json *target, *root;
    const char *ref;                /* the $ref itself (in the schema's own strings) */
    char name[64];
} llm_js_pending;

typedef struct { char *key; int value; } llm_js_key; /* stb_ds string hash: an object's key -> its index */
typedef struct {
    const llm_json *root;           /* what "#" means: the schema, or the document a $ref went into */
    const llm_json *const *docs;    /* more documents, $ref "llm:K#..." (the tool grammars' parameters) */
    int n_docs;
    char *out;                      /* stb_ds: the rules written */
    char *err;
    int n_rules, depth;             /* rules named; schemas being written inside each other now */
    int64_t work;                   /* keywords and properties looked at, against LLM_JS_MAX_WORK */
    struct { char *key; char *value; } *refs;  /* stb_ds string hash: root and "$ref" -> its rule's name */
    llm_js_pending *pending;        /* stb_ds: $refs named and not written yet */
    struct { const llm_json *key; llm_js_key *value; } *index; /* stb_ds: the keys of the big objects $refs go
                                     * through ($defs), hashed, each found in one look */
    unsigned used;                  /* LLM_JS_* primitives used */
} llm_js;

enum { LLM_JS_WS = 1, LLM_JS_STRING = 2, LLM_JS_NUMBER = 4, LLM_JS_INTEGER = 8, LLM_JS_VALUE = 16,
       LLM_JS_CHAR = 32, LLM_JS_BOOLEAN = 64 };

/* The primitives, written once at the end for the ones used */
static const struct { unsigned bit; const char *rules; } llm_js_primitives[] = {
    {LLM_JS_WS, "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"},
    {LLM_JS_CHAR, "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"},
    {LLM_JS_STRING, "string ::= \"\\\"\" char* \"\\\"\"\n"},
    {LLM_JS_INTEGER, "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"},
    {LLM_JS_NUMBER, "number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? "
                    "([eE] [-+]? [0-9]{1,3})?\n"},
    {LLM_JS_BOOLEAN, "boolean ::= \"true\" | \"false\"\n"},
    {LLM_JS_VALUE, "value ::= object | array | string | number | boolean | \"null\"\n"
                   "object ::= \"{\" ws ( string ws \":\" ws value ws (\",\" ws string ws \":\" "
                   "ws value ws)* )? \"}\"\n"
                   "array ::= \"[\" ws ( value ws (\",\" ws value ws)* )? \"]\"\n"},
};

static int llm_js_fail(llm_js *c, const char *path, const char *fmt, const char *what) {
    if (c->err[0]) return -1;
    char msg[256];
    snprintf(msg, sizeof msg, fmt, what);
    llm_fail(c->err, "JSON schema: %s at %s", msg, path[0] ? path : "/ (the root)");
    return -1;
}

/* n more keywords or properties looked at: -1 (the reason in c->err) past LLM_JS_MAX_WORK, checked before
 * the looking. What else bounds the work (the rules, the depth) lets an object of 100,000 keys be merged by
 * an allOf at 10,000 places, each a scan. */
static int llm_js_spend(llm_js *c, int64_t n, const char *path) {
    if ((c->work += n) <= LLM_JS_MAX_WORK) return 0;
    return llm_js_fail(c, path, "%s", "the schema is too large to write as a grammar (more than "
                       LLM_JS_XSTR(LLM_JS_MAX_WORK) " keywords and properties looked at)");
}

/* A new rule's name: a readable stem and a number */
static void llm_js_name(llm_js *c, const char *stem, char *name, size_t cap) {
    size_t k = 0;
    for (const char *s = stem; *s && k < 24; s++)
        name[k++] = isalnum((unsigned char)*s) ? (char)tolower((unsigned char)*s) : '-';
    snprintf(name + k, cap - k, "-%d", c->n_rules++);
}

static void llm_js_rule(llm_js *c, const char *name, const char *body, size_t n) {
    llm_str_puts(&c->out, name); llm_str_puts(&c->out, " ::= ");
    memcpy(arraddnptr(c->out, n), body, n);
    arrput(c->out, '\n');
}

/* A JSON value as a GBNF literal of its compact text */
static void llm_js_const(char **out, const llm_json *v) {
    char *text = NULL;
    llm_json_write_compact(&text, v, 0);
    llm_js_literal(out, text, (size_t)arrlen(text));
    arrfree(text);
}

/* Digits: the GBNF for decimal numbers of exactly len(a) digits between a and b (same length, as text) */
static void llm_js_digits_between(char **out, const char *a, const char *b) {
    size_t n = strlen(a);
    if (n == 0) { llm_str_puts(out, "\"\""); return; }
    if (a[0] == b[0]) {
        llm_str_printf(out, "\"%c\" ", a[0]);
        llm_js_digits_between(out, a + 1, b + 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', n - 1); nines[n - 1] = 0;
    memset(zeros, '0', n - 1); zeros[n - 1] = 0;
    int a_low = !strcmp(a + 1, zeros), b_high = !strcmp(b + 1, nines);
    arrput(*out, '(');
    char lo = a_low ? a[0] : (char)(a[0] + 1), hi = b_high ? b[0] : (char)(b[0] - 1);
    int alts = 0;
    if (!a_low) {
        llm_str_printf(out, "\"%c\" (", a[0]);
        llm_js_digits_between(out, a + 1, nines);
        arrput(*out, ')');
        alts++;
    }
    if (lo <= hi) {
        if (alts++) llm_str_puts(out, " | ");
        llm_str_printf(out, "[%c-%c]", lo, hi);
        if (n > 1) llm_str_printf(out, " [0-9]{%d}", (int)n - 1);
    }
    if (!b_high) {
        if (alts++) llm_str_puts(out, " | ");
        llm_str_printf(out, "\"%c\" (", b[0]);
        llm_js_digits_between(out, zeros, b + 1);
        arrput(*out, ')');
    }
    arrput(*out, ')');
}

/* The integers in [lo, hi] (hi < 0: no upper bound) of 0 or more, no leading zeros, at most 16 digits */
static void llm_js_naturals(char **out, int64_t lo, int64_t hi) {
    char a[24], b[24];
    int first = 1;
    arrput(*out, '(');
    for (int len = 1; len <= 16; len++) {
        int64_t lo_len = len == 1 ? 0 : 1, hi_len = 9; /* the numbers of this many digits: [lo_len, hi_len] */
        for (int k = 1; k < len; k++) { lo_len *= 10; hi_len = hi_len * 10 + 9; }
        int64_t x = lo > lo_len ? lo : lo_len, y = hi >= 0 && hi < hi_len ? hi : hi_len;
        if (x > y) continue;
        if (!first) llm_str_puts(out, " | ");
        first = 0;
        if (x == lo_len && y == hi_len) { /* every number of this many digits */
            llm_str_puts(out, len == 1 ? "[0-9]" : "[1-9]");
            if (len > 1) llm_str_printf(out, " [0-9]{%d}", len - 1);
            continue;
        }
        snprintf(a, sizeof a, "%lld", (long long)x); snprintf(b, sizeof b, "%lld", (long long)y);
        llm_js_digits_between(out, a, b);
    }
    if (first) llm_str_puts(out, "[^\\x00-\\U0010FFFF]"); /* no number at all */
    arrput(*out, ')');
}

/* An integer schema's bounds: [lo, hi], INT64_MIN / INT64_MAX for none */
static void llm_js_integer_range(char **out, int64_t lo, int64_t hi) {
    int neg = lo < 0, pos = hi >= 0;
    arrput(*out, '(');
    if (neg) { /* -x for x in [max(1, -hi), -lo] */
        llm_str_puts(out, "\"-\" ");
        llm_js_naturals(out, hi < 0 ? -hi : 1, lo == INT64_MIN ? -1 : -lo);
    }
    if (neg && pos) llm_str_puts(out, " | ");
    if (pos) llm_js_naturals(out, lo > 0 ? lo : 0, hi == INT64_MAX ? -1 : hi);
    arrput(*out, ')');
}

static int llm_js_visit(llm_js *c, const llm_json *s, const char *path, const char *stem, char *name);

/* The keywords: those that change nothing the output must be (annotations), those that are refused */
static const char *const llm_js_ignored[] = {
    "title", "description", "$schema", "$id", "$anchor", "$comment", "default", "examples", "readOnly",
    "writeOnly", "deprecated", "contentEncoding", "contentMediaType", "$defs", "definitions", "strict",
    "discriminator", "nullable", "name"};
static const char *const llm_js_refused[] = {
    "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "dependencies", "patternProperties",
    "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
    "multipleOf", "minProperties", "maxProperties", "$dynamicRef", "$recursiveRef", "$dynamicAnchor",
    "$recursiveAnchor", "additionalItems"};

static int llm_js_key_in(const char *key, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++) if (!strcmp(key, list[i])) return 1;
    return 0;
}

/* The value of key in the object v (the last, as llm_json_get): through a hash of its keys when it has many,
 * made at the first look (a $defs of 100,000 entries would cost a scan per $ref) */
static const llm_json *llm_js_member(llm_js *c, const llm_json *v, const char *key) {
    if (v->n < 32) return llm_json_get(v, key);
    ptrdiff_t i = hmgeti(c->index, v);
    if (i < 0) {
        llm_js_key *keys = NULL; /* stb_ds string hash over the object's own key strings (not copied) */
        for (int k = 0; k < v->n; k++) shput(keys, v->keys[k], k);
        hmput(c->index, v, keys);
        i = hmgeti(c->index, v);
    }
    ptrdiff_t k = shgeti(c->index[i].value, key);
    return k < 0 ? NULL : &v->items[c->index[i].value[k].value];
}

/* Where a $ref points: "#", or "#/a/b" with ~0 and ~1 decoded, in the document it is in (c->root); or
 * "llm:K#..." in the document c->docs[K]. *root (when not NULL): that document. */
static const llm_json *llm_js_resolve(llm_js *c, const char *ref, const llm_json **root) {
    const llm_json *v = c->root;
    if (!strncmp(ref, "llm:", 4)) {
        char *end;
        long k = strtol(ref + 4, &end, 10);
        if (end == ref + 4 || k < 0 || k >= c->n_docs) return NULL;
        v = c->docs[k];
        ref = end;
    }
    if (ref[0] != '#') return NULL;
    if (root) *root = v;
    const char *p = ref + 1;
    while (v && *p == '/') {
        char part[256];
        size_t k = 0;
        for (p++; *p && *p != '/' && k < sizeof part - 1; p++) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) { part[k++] = p[1] == '0' ? '~' : '/'; p++; }
            else part[k++] = *p;
        }
        part[k] = 0;
        if (v->type == LLM_JSON_OBJECT) v = llm_js_member(c, v, part);
        else if (v->type == LLM_JSON_ARRAY && isdigit((unsigned char)part[0]) && atoi(part) < v->n)
            v = &v->items[atoi(part)];
        else v = NULL;
    }
    return *p ? NULL : v;
}

static int llm_js_number_of(const llm_json *s, const char *key, double *x) {
    const llm_json *v = llm_json_get(s, key);
    if (!v || v->type != LLM_JSON_NUMBER) return 0;
    *x = v->num;
    return 1;
}

/* A string schema's content between the quotes */
static int llm_js_string(llm_js *c, const llm_json *s, const char *path, char **body) {
    const llm_json *fmt = llm_json_get(s, "format"), *pattern = llm_json_get(s, "pattern");
    double min = 0, max = -1;
    int has_min = llm_js_number_of(s, "minLength", &min), has_max = llm_js_number_of(s, "maxLength", &max);
    if ((has_min && (min < 0 || min > 10000 || min != floor(min))) ||
        (has_max && (max < 0 || max > 10000 || max != floor(max))))
        return llm_js_fail(c, path, "%s must be a whole number from 0 to 10000", "minLength/maxLength");
    if (has_min && has_max && max < min)
        return llm_js_fail(c, path, "%s: maxLength is below minLength", "maxLength");
    if ((fmt || pattern) && (has_min || has_max))
        return llm_js_fail(c, path, "%s with format or pattern is not supported", "minLength/maxLength");
    if (fmt && pattern) return llm_js_fail(c, path, "%s together with pattern is not supported", "format");
    llm_str_puts(body, "\"\\\"\" ");
    if (fmt) {
        static const struct { const char *name, *gbnf; } formats[] = {
            {"date", "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | "
                     "[12] [0-9] | \"3\" [01])"},
            {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
                     "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
            {"date-time", "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | "
                          "[12] [0-9] | \"3\" [01]) "
                          "\"T\" ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] "
                          "[0-9] (\".\" [0-9]{1,6})? "
                          "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
            {"uuid", "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [1-8] [0-9a-f]{3} \"-\" [89ab] "
                     "[0-9a-f]{3} \"-\" [0-9a-f]{12}"},
            {"email", "[a-zA-Z0-9_+-] [a-zA-Z0-9._+-]{0,40} \"@\" [a-zA-Z0-9] [a-zA-Z0-9-]{0,30} "
                      "(\".\" [a-zA-Z0-9] [a-zA-Z0-9-]{0,30}){0,3} \".\" [a-zA-Z]{2,8}"},
        };
        size_t i = 0, n = sizeof formats / sizeof *formats;
        while (fmt->type == LLM_JSON_STRING && i < n && strcmp(formats[i].name, fmt->str)) i++;
        if (i == n)
            return llm_js_fail(c, path, "format \"%s\" is not supported (date, time, date-time, uuid, "
                                        "email are)", fmt->type == LLM_JSON_STRING ? fmt->str : "?");
        llm_str_puts(body, formats[i].gbnf);
    } else if (pattern) {
        if (pattern->type != LLM_JSON_STRING) return llm_js_fail(c, path, "%s must be a string", "pattern");
        /* a pattern matches anywhere in the string unless anchored: what is around it is any text */
        size_t n = pattern->len;
        int head = n && pattern->str[0] == '^', tail = n && pattern->str[n - 1] == '$' &&
                   (n < 2 || pattern->str[n - 2] != '\\');
        char err[LLM_ERR_LEN];
        if (!head) llm_str_puts(body, "char* ");
        if (llm_re_to_gbnf(pattern->str, 1, body, err) != 0) {
            char what[200];
            snprintf(what, sizeof what, "pattern \"%.60s\": %.120s", pattern->str, err);
            return llm_js_fail(c, path, "%s", what);
        }
        if (!tail) llm_str_puts(body, " char*");
        c->used |= LLM_JS_CHAR;
    } else {
        if (!has_max) llm_str_printf(body, "char{%d,}", (int)min);
        else llm_str_printf(body, "char{%d,%d}", (int)min, (int)max);
        c->used |= LLM_JS_CHAR;
    }
    llm_str_puts(body, " \"\\\"\"");
    return 0;
}

/* A decimal bound's digits: |x| as its integer part and its fraction's digits (no trailing zeros), from the
 * shortest text that reads back as x (llm_json_write_float's): the number the schema's author wrote, for any
 * a double keeps. -1 when |x| is beyond 10^15 or has more than 16 digits after the point (what the number
 * grammars write). */
typedef struct { int64_t whole; char frac[20]; } llm_js_decimal;
static int llm_js_decimal_of(double x, llm_js_decimal *d) {
    x = fabs(x);
    if (!(x <= 1e15)) return -1;
    char *text = NULL, mant[40];
    llm_json_write_float(&text, x);
    arrput(text, 0);
    int k = 0, point = -1;
    const char *c = text;
    for (; *c && *c != 'e' && k < 32; c++) { if (*c == '.') point = k; else mant[k++] = *c; }
    int exp10 = (point < 0 ? k : point) - 1 + (*c == 'e' ? atoi(c + 1) : 0); /* mant[0]'s power of ten */
    arrfree(text);
    int last = k - 1;
    while (last >= 0 && mant[last] == '0') last--;
    if (last - exp10 > 16) return -1; /* the last digit that is not 0 is the 17th after the point, or later */
    d->whole = 0;
    for (int i = 0; i <= exp10; i++) d->whole = d->whole * 10 + (i < k ? mant[i] - '0' : 0);
    int n = 0;
    for (int i = exp10 + 1; i < k && n < 16; i++) d->frac[n++] = i < 0 ? '0' : mant[i];
    while (n > 0 && d->frac[n - 1] == '0') n--;
    d->frac[n] = 0;
    return 0;
}

/* out += open, the stb_ds string b, close: how the number rules put their parts together */
static void llm_js_append(char **out, const char *open, const char *b, const char *close) {
    llm_str_puts(out, open);
    if (arrlen(b)) memcpy(arraddnptr(*out, arrlen(b)), b, (size_t)arrlen(b));
    llm_str_puts(out, close);
}

/* The digit strings s of length 0..n (each read as the fraction 0.s) from the lower bound 0.p (p_ex: strictly
 * above it) to the upper 0.q (q_kind 0: none, 1: at most, 2: below it), p and q without trailing zeros; the
 * empty string only when allow_empty. Digit by digit as llm_js_digits_between: the first digit equal to p's
 * (or q's) goes on with the same question one digit on, the digits between take any rest. n falls at each
 * call (depth <= 16), and once the digits leave p's or q's the rest is one-sided: O(n) alternatives. 1 when
 * the set is not empty (then it was written to out as one parenthesized GBNF expression). */
static int llm_js_fraction_digits(char **out, const char *p, int p_ex, const char *q, int q_kind, int n,
                                  int allow_empty) {
    int empty_ok = allow_empty && !*p && !p_ex && (q_kind != 2 || *q), alts = 0;
    if (!*p && !p_ex && (!q_kind || (q_kind == 1 && !*q)) && n > 0) { /* any digits; at most 0: 0s */
        llm_str_printf(out, q_kind ? "(\"0\"{%d,%d})" : "([0-9]{%d,%d})", allow_empty ? 0 : 1, n);
        return 1;
    }
    char *b = NULL;                         /* stb_ds: the alternatives */
    if (empty_ok) { llm_str_puts(&b, "\"\""); alts++; }
    int pd = *p ? *p : '0', qd = q_kind ? (*q ? *q : '0') : '9' + 1;
    const char *p_rest = *p ? p + 1 : p, *q_rest = *q ? q + 1 : q;
    for (int part = 0; n > 0 && part < 3; part++) {
        char *sub = NULL;
        int d = part == 0 ? pd : part == 2 ? qd : 0, ok = 0;
        if (part == 0 && pd <= '9' && pd <= qd) /* p's digit: still at p (and at q when it is q's too) */
            ok = llm_js_fraction_digits(&sub, p_rest, p_ex, pd == qd ? q_rest : "", pd == qd ? q_kind : 0,
                                        n - 1, 1);
        else if (part == 2 && qd <= '9' && qd > pd) /* q's digit above p's: p left behind */
            ok = llm_js_fraction_digits(&sub, "", 0, q_rest, q_kind, n - 1, 1);
        else if (part == 1 && pd + 1 <= (qd - 1 < '9' ? qd - 1 : '9')) { /* between: any rest */
            llm_str_printf(&sub, "[%c-%c] [0-9]{0,%d}", pd + 1, qd - 1 < '9' ? qd - 1 : '9', n - 1);
            ok = 1;
        }
        if (ok) {
            if (alts++) llm_str_puts(&b, " | ");
            if (part != 1) llm_str_printf(&b, "\"%c\" ", d);
            llm_js_append(&b, "", sub, "");
        }
        arrfree(sub);
    }
    if (alts) llm_js_append(out, "(", b, ")");
    arrfree(b);
    return alts > 0;
}

/* A number's fraction ("." and digits, or none) between 0.p and 0.q (as llm_js_fraction_digits): 1 when
 * some fraction is, then written to out */
static int llm_js_fraction(char **out, const char *p, int p_ex, const char *q, int q_kind) {
    int none_ok = !*p && !p_ex && (q_kind != 2 || *q); /* no fraction: .0 */
    char *digits = NULL;
    int some = llm_js_fraction_digits(&digits, p, p_ex, q, q_kind, 16, 0);
    if (some) {
        llm_js_append(out, none_ok ? "(\".\" " : "\".\" ", digits, none_ok ? ")?" : "");
    } else if (none_ok) llm_str_puts(out, "\"\"");
    arrfree(digits);
    return some || none_ok;
}

/* The numbers m >= 0 without sign or exponent from lo (lo_ex: strictly above) to hi (hi_kind 0: none, 1: at
 * most, 2: below), split by the integer part: lo's own takes fractions from lo's, those between take any,
 * hi's own fractions up to hi's (one part and both bounds when they share it). 1 when any is, then
 * written. */
static int llm_js_magnitude(char **out, const llm_js_decimal *lo, int lo_ex, const llm_js_decimal *hi,
                            int hi_kind) {
    int64_t a = lo->whole, b = hi_kind ? hi->whole : -1;
    if (hi_kind && b < a) return 0;
    char *alts = NULL, *f = NULL;
    int n = 0;
    if (llm_js_fraction(&f, lo->frac, lo_ex, b == a ? hi->frac : "", b == a ? hi_kind : 0)) { /* lo's part */
        llm_str_printf(&alts, "\"%lld\" ", (long long)a);
        llm_js_append(&alts, "", f, "");
        n++;
    }
    arrsetlen(f, 0);
    if (b < 0 || b - 1 > a) { /* the parts between: any fraction */
        if (n++) llm_str_puts(&alts, " | ");
        llm_js_naturals(&alts, a + 1, b < 0 ? -1 : b - 1);
        llm_str_puts(&alts, " (\".\" [0-9]{1,16})?");
    }
    if (b > a && llm_js_fraction(&f, "", 0, hi->frac, hi_kind)) { /* hi's part */
        if (n++) llm_str_puts(&alts, " | ");
        llm_str_printf(&alts, "\"%lld\" ", (long long)b);
        llm_js_append(&alts, "", f, "");
    }
    if (n) llm_js_append(out, "(", alts, ")");
    arrfree(alts); arrfree(f);
    return n > 0;
}

/* A bound: minimum and exclusiveMinimum (a number, or draft 4's true making minimum strict), the stricter
 * when both are (lower: which = 0), or maximum and exclusiveMaximum (which = 1). 1 when there is one, 0 when
 * none, -1 when it is not a number a grammar writes (the reason, naming the keyword, in c->err). */
static int llm_js_bound(llm_js *c, const llm_json *s, const char *path, int which, int integer, double *x,
                        int *ex) {
    const char *key = which ? "maximum" : "minimum", *xkey = which ? "exclusiveMaximum" : "exclusiveMinimum";
    double v = 0, xv = 0;
    int has = llm_js_number_of(s, key, &v), has_x = llm_js_number_of(s, xkey, &xv);
    const llm_json *draft4 = llm_json_get(s, xkey);
    llm_js_decimal d;
    if (has && llm_js_decimal_of(v, &d) != 0 && (!integer || fabs(v) > 1e15))
        return llm_js_fail(c, path, "%s beyond 10^15 or with more than 16 digits after the point", key);
    if (has_x && llm_js_decimal_of(xv, &d) != 0 && (!integer || fabs(xv) > 1e15))
        return llm_js_fail(c, path, "%s beyond 10^15 or with more than 16 digits after the point", xkey);
    *ex = has && draft4 && draft4->type == LLM_JSON_TRUE;
    *x = v;
    if (has_x && (!has || (which ? xv <= v : xv >= v))) { *x = xv; *ex = 1; }
    return has || has_x;
}

/* A number schema: integers as a range of their digits (llm_js_integer_range); numbers with bounds as a sign
 * when the range goes below zero ("-" and a magnitude above 0: no "-0") and a magnitude, with no exponent */
static int llm_js_number(llm_js *c, const llm_json *s, const char *path, int integer, char **body) {
    double lo = 0, hi = 0;
    int lo_ex = 0, hi_ex = 0;
    int has_lo = llm_js_bound(c, s, path, 0, integer, &lo, &lo_ex);
    int has_hi = llm_js_bound(c, s, path, 1, integer, &hi, &hi_ex);
    if (has_lo < 0 || has_hi < 0) return -1;
    if (!has_lo && !has_hi) {
        llm_str_puts(body, integer ? "integer" : "number");
        c->used |= integer ? LLM_JS_INTEGER : LLM_JS_NUMBER;
        return 0;
    }
    if (integer) {
        int64_t min = !has_lo ? INT64_MIN : lo_ex ? (int64_t)floor(lo) + 1 : (int64_t)ceil(lo);
        int64_t max = !has_hi ? INT64_MAX : hi_ex ? (int64_t)ceil(hi) - 1 : (int64_t)floor(hi);
        if (min > max) return llm_js_fail(c, path, "%s: no integer is within the bounds", "minimum/maximum");
        llm_js_integer_range(body, min, max);
        return 0;
    }
    llm_js_decimal l, h, zero = {0, ""};
    llm_js_decimal_of(lo, &l); llm_js_decimal_of(hi, &h);
    char *neg = NULL, *pos = NULL;
    int has_neg = 0, has_pos = 0;
    if (!has_hi || hi > 0 || (hi == 0 && !hi_ex)) /* the numbers >= 0: from max(lo, 0) */
        has_pos = llm_js_magnitude(&pos, has_lo && lo >= 0 ? &l : &zero, has_lo && lo >= 0 && lo_ex,
                                   &h, has_hi ? 1 + hi_ex : 0);
    if (!has_lo || lo < 0) /* the numbers below 0: "-" and a magnitude above max(-hi, 0), up to -lo */
        has_neg = llm_js_magnitude(&neg, has_hi && hi < 0 ? &h : &zero, has_hi && hi < 0 ? hi_ex : 1,
                                   &l, has_lo ? 1 + lo_ex : 0);
    if (has_neg || has_pos) {
        if (has_neg) llm_js_append(body, "(\"-\" ", neg, has_pos ? " | " : ")");
        if (has_pos) llm_js_append(body, has_neg ? "" : "(", pos, ")");
    }
    arrfree(neg); arrfree(pos);
    if (!has_neg && !has_pos)
        return llm_js_fail(c, path, "%s: no number is within the bounds", "minimum/maximum");
    return 0;
}

/* The text of a JSON string that is none of the names (names[i] all begin with the depth bytes already
 * matched): a next character none of them has, then anything; or one that some have, and the same question
 * one character on; or the end here, where no name ends. */
static void llm_js_not_names(char **out, const char **names, int n, size_t depth) {
    int ends = 0, alts = 0;
    char *firsts = NULL; /* stb_ds: the distinct next characters, as UTF-8 */
    int *starts = NULL;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if (len == depth) { ends = 1; continue; }
        int k = llm_utf8_check((const unsigned char *)names[i] + depth, len - depth);
        if (k <= 0) k = 1;
        int seen = 0;
        for (ptrdiff_t j = 0; j < arrlen(starts) && !seen; j++)
            seen = !strncmp(firsts + starts[j], names[i] + depth, (size_t)k) && firsts[starts[j] + k] == 0;
        if (seen) continue;
        arrput(starts, (int)arrlen(firsts));
        memcpy(arraddnptr(firsts, k), names[i] + depth, (size_t)k);
        arrput(firsts, 0);
    }
    arrput(*out, '(');
    /* a character none of them has next, then any text */
    llm_str_puts(out, "([^\"\\\\\\x00-\\x1F");
    for (ptrdiff_t j = 0; j < arrlen(starts); j++) {
        const unsigned char *ch = (const unsigned char *)firsts + starts[j];
        int k = llm_utf8_check(ch, strlen((const char *)ch));
        llm_re_gbnf_char(out, k > 0 ? llm_utf8_decode(ch, k) : ch[0], 1);
    }
    llm_str_puts(out, "] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})) char*");
    alts++;
    for (ptrdiff_t j = 0; j < arrlen(starts); j++) { /* one that some have: on to the next character */
        const char *ch = firsts + starts[j];
        size_t k = strlen(ch);
        const char **sub = (const char **)malloc((size_t)n * sizeof *sub);
        int m = 0;
        if (!sub) continue;
        for (int i = 0; i < n; i++)
            if (strlen(names[i]) > depth && !strncmp(names[i] + depth, ch, k)) sub[m++] = names[i];
        llm_str_puts(out, " | ");
        llm_js_literal(out, ch, k);
        arrput(*out, ' ');
        llm_js_not_names(out, sub, m, depth + k);
        free(sub);
        alts++;
    }
    if (!ends && depth > 0) llm_str_puts(out, " | \"\""); /* stopping here: a prefix of names, not a name */
    arrput(*out, ')');
    arrfree(firsts); arrfree(starts);
}

/* The properties of an object in order: the required ones always, the others when the model likes, and
 * (additionalProperties true or a schema) more keys after them. first[i]: the properties from i on when none
 * has been written yet; rest[i]: when one has (each then begins with a comma). */
static int llm_js_object(llm_js *c, const llm_json *s, const char *path, const char *stem, char **body) {
    const llm_json *props = llm_json_get(s, "properties"), *req = llm_json_get(s, "required");
    const llm_json *add = llm_json_get(s, "additionalProperties");
    if (props && props->type != LLM_JSON_OBJECT)
        return llm_js_fail(c, path, "%s must be an object", "properties");
    if (req && req->type != LLM_JSON_ARRAY) return llm_js_fail(c, path, "%s must be an array", "required");
    int n = props ? props->n : 0;
    /* three rules a property, and each required name looked for among them: bounded before the work */
    if (c->n_rules > LLM_JS_MAX_RULES || (unsigned)n > (unsigned)(LLM_JS_MAX_RULES - c->n_rules) / 3)
        return llm_js_fail(c, path, "%s", llm_js_too_many);
    if (req && req->n > n)
        return llm_js_fail(c, path, "%s lists more names than there are properties", "required");
    if (req && llm_js_spend(c, (int64_t)n * req->n, path) != 0) return -1; /* each name looked for, twice */
    for (int k = 0; req && k < req->n; k++) { /* a required key that is not a property: any value */
        if (req->items[k].type != LLM_JSON_STRING)
            return llm_js_fail(c, path, "%s must list strings", "required");
        if (!llm_json_get(props, req->items[k].str))
            return llm_js_fail(c, path, "required \"%s\" is not among the properties (not supported)",
                               req->items[k].str);
    }
    char extra[64] = "";
    c->used |= LLM_JS_WS | LLM_JS_STRING | LLM_JS_CHAR;
    llm_json any = {LLM_JSON_TRUE, 0, NULL, 0, NULL, NULL, 0};
    if (!add && n == 0) add = &any; /* {"type": "object"}: any object. With properties listed and no word on
                                     * others, only the listed ones are written (valid, and what is meant) */
    if (add && add->type != LLM_JSON_FALSE) { /* more keys (none of the listed ones), each with its value */
        char vname[64], kname[64], sub[512];
        snprintf(sub, sizeof sub, "%.400s/additionalProperties", path);
        if (llm_js_visit(c, add, sub, "additional", vname) != 0) return -1;
        char *b = NULL;
        strcpy(kname, "string");
        if (n) {
            llm_js_name(c, "key", kname, sizeof kname);
            for (int i = 0; i < n; i++) /* llm_js_not_names recurses once per byte of a name: bounded here */
                if (strlen(props->keys[i]) > 256)
                    return llm_js_fail(c, path, "%s: a property name longer than 256 bytes beside it is not "
                                       "supported", "additionalProperties");
            const char **names = (const char **)malloc((size_t)(unsigned)n * sizeof *names);
            if (!names) return llm_js_fail(c, path, "%s", "out of memory");
            for (int i = 0; i < n; i++) names[i] = props->keys[i];
            llm_str_puts(&b, "\"\\\"\" ");
            llm_js_not_names(&b, names, n, 0);
            llm_str_puts(&b, " \"\\\"\"");
            free(names);
            llm_js_rule(c, kname, b, (size_t)arrlen(b));
            arrsetlen(b, 0);
        }
        llm_str_printf(&b, "%s ws \":\" ws %s ws", kname, vname);
        llm_js_name(c, "extra", extra, sizeof extra);
        llm_js_rule(c, extra, b, (size_t)arrlen(b));
        arrfree(b);
    }
    char (*kv)[64] = (char (*)[64])calloc((size_t)n + 1, 64);
    char (*first)[64] = (char (*)[64])calloc((size_t)n + 1, 64),
        (*rest)[64] = (char (*)[64])calloc((size_t)n + 1, 64);
    if (!kv || !first || !rest) { free(kv); free(first); free(rest);
                                  return llm_js_fail(c, path, "%s", "out of memory"); }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) { /* each property: "key" ws ":" ws value ws */
        char vname[64], sub[512];
        snprintf(sub, sizeof sub, "%.300s/properties/%.150s", path, props->keys[i]);
        rc = llm_js_visit(c, &props->items[i], sub, props->keys[i], vname);
        if (rc) break;
        char *b = NULL;
        llm_json key = {LLM_JSON_STRING, 0, props->keys[i], strlen(props->keys[i]), NULL, NULL, 0};
        llm_js_const(&b, &key);
        llm_str_printf(&b, " ws \":\" ws %s ws", vname);
        llm_js_name(c, props->keys[i], kv[i], 64);
        llm_js_rule(c, kv[i], b, (size_t)arrlen(b));
        arrfree(b);
    }
    for (int i = n; i >= 0 && rc == 0; i--) {
        int required = 0;
        for (int k = 0; i < n && req && k < req->n; k++)
            required |= !strcmp(req->items[k].str, props->keys[i]);
        char *b = NULL;
        llm_js_name(c, stem, rest[i], 64);
        if (i == n) { if (extra[0]) llm_str_printf(&b, "(\",\" ws %s)*", extra);
                      else llm_str_puts(&b, "\"\""); }
        else llm_str_printf(&b, required ? "\",\" ws %s %s" : "(\",\" ws %s)? %s", kv[i], rest[i + 1]);
        llm_js_rule(c, rest[i], b, (size_t)arrlen(b));
        arrsetlen(b, 0);
        llm_js_name(c, stem, first[i], 64);
        if (i == n) { if (extra[0]) llm_str_printf(&b, "(%s (\",\" ws %s)*)?", extra, extra);
                      else llm_str_puts(&b, "\"\""); }
        else if (required) llm_str_printf(&b, "%s %s", kv[i], rest[i + 1]);
        else llm_str_printf(&b, "%s %s | %s", kv[i], rest[i + 1], first[i + 1]);
        llm_js_rule(c, first[i], b, (size_t)arrlen(b));
        arrfree(b);
    }
    if (rc == 0) llm_str_printf(body, "\"{\" ws %s \"}\"", first[0]);
    free(kv); free(first); free(rest);
    return rc;
}

static const char llm_js_not_unique[] = "%s: a grammar cannot keep array items distinct (it can for an enum "
                                        "of at most 64 values)";

/* uniqueItems true, items an enum (or const; or a $ref to one) of at most 64 distinct values: the values in
 * the enum's order, each at most once (an increasing choice: linear in the values). first[k]: the array from
 * value k on, none written yet; rest[k]: after one, each then after a comma. minItems 0 or 1; maxItems, when
 * given, at least the values' number (else the 400). */
static int llm_js_unique(llm_js *c, const llm_json *s, const char *path, char **body) {
    const llm_json *items = llm_json_get(s, "items"), *ref = items ? llm_json_get(items, "$ref") : NULL;
    if (ref && ref->type == LLM_JSON_STRING) items = llm_js_resolve(c, ref->str, NULL);
    const llm_json *en = items ? llm_json_get(items, "enum") : NULL;
    const llm_json *cst = items ? llm_json_get(items, "const") : NULL;
    double min = 0, max = 64;
    llm_js_number_of(s, "minItems", &min);
    int has_max = llm_js_number_of(s, "maxItems", &max), n = en && en->type == LLM_JSON_ARRAY ? en->n : 1;
    if (llm_json_get(s, "prefixItems") || (!cst && (!en || en->type != LLM_JSON_ARRAY || en->n == 0)) ||
        n > 64 || (min != 0 && min != 1) || (has_max && max < n))
        return llm_js_fail(c, path, llm_js_not_unique, "uniqueItems");
    char **text = (char **)calloc((size_t)n, sizeof *text); /* stb_ds: each value's compact JSON */
    int rc = text ? 0 : llm_js_fail(c, path, "%s", "out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        llm_json_write_compact(&text[i], cst ? cst : &en->items[i], 0);
        for (int j = 0; j < i; j++) /* a value twice: the grammar would let both in */
            if (arrlen(text[j]) == arrlen(text[i]) && !memcmp(text[j], text[i], (size_t)arrlen(text[i])))
                rc = llm_js_fail(c, path, llm_js_not_unique, "uniqueItems");
    }
    if (rc == 0 && (c->n_rules > LLM_JS_MAX_RULES || 2 * n > LLM_JS_MAX_RULES - c->n_rules))
        rc = llm_js_fail(c, path, "%s", llm_js_too_many);
    char first[64] = "", rest[64] = "", name[64];
    for (int k = n - 1; rc == 0 && k >= 0; k--) {
        char *b = NULL, *v = NULL;
        llm_js_literal(&v, text[k], (size_t)arrlen(text[k]));
        arrput(v, 0);
        if (k > 0) { /* rest[k]: value k after a comma, or not; then rest[k+1] */
            llm_str_printf(&b, "\",\" ws %s ws", v);
            if (rest[0]) llm_str_printf(&b, " %s | %s", rest, rest);
            else llm_str_puts(&b, " | \"\"");
            llm_js_name(c, "unique-rest", name, sizeof name);
            llm_js_rule(c, name, b, (size_t)arrlen(b));
            arrsetlen(b, 0);
        }
        llm_str_printf(&b, "%s ws%s%s", v, rest[0] ? " " : "", rest); /* first[k]: value k first, or later */
        if (first[0]) llm_str_printf(&b, " | %s", first);
        strcpy(rest, name);
        llm_js_name(c, "unique", first, sizeof first);
        llm_js_rule(c, first, b, (size_t)arrlen(b));
        arrfree(b); arrfree(v);
    }
    c->used |= LLM_JS_WS;
    if (rc == 0) llm_str_printf(body, min ? "\"[\" ws %s \"]\"" : "\"[\" ws (%s)? \"]\"", first);
    for (int i = 0; text && i < n; i++) arrfree(text[i]);
    free(text);
    return rc;
}

/* Array: prefixItems in order, then items (a schema, or any value when absent; none when false), between
 * minItems and maxItems. Every prefix item is written (the schema would let the array stop sooner). */
static int llm_js_array(llm_js *c, const llm_json *s, const char *path, char **body) {
    const llm_json *prefix = llm_json_get(s, "prefixItems"), *items = llm_json_get(s, "items");
    const llm_json *unique = llm_json_get(s, "uniqueItems");
    if (unique && unique->type == LLM_JSON_TRUE) return llm_js_unique(c, s, path, body);
    if (prefix && prefix->type != LLM_JSON_ARRAY)
        return llm_js_fail(c, path, "%s must be an array", "prefixItems");
    if (items && items->type == LLM_JSON_ARRAY)
        return llm_js_fail(c, path, "%s as an array (draft 4's tuples) is not "
                                                                   "supported: use prefixItems", "items");
    double min = 0, max = -1;
    llm_js_number_of(s, "minItems", &min);
    int has_max = llm_js_number_of(s, "maxItems", &max);
    if (min < 0 || min > 1000 || min != floor(min) ||
        (has_max && (max < min || max > 100000 || max != floor(max))))
        return llm_js_fail(c, path, "%s out of range (0 to 1000, maxItems >= minItems)", "minItems/maxItems");
    int n_prefix = prefix ? prefix->n : 0, lo = (int)min, hi = has_max ? (int)max : -1;
    if (hi >= 0 && n_prefix > hi) n_prefix = hi;
    c->used |= LLM_JS_WS;
    llm_str_puts(body, "\"[\" ws");
    for (int i = 0; i < n_prefix; i++) {
        char vname[64], sub[512];
        snprintf(sub, sizeof sub, "%.400s/prefixItems/%d", path, i);
        if (llm_js_visit(c, &prefix->items[i], sub, "item", vname) != 0) return -1;
        llm_str_printf(body, "%s %s ws", i ? " \",\" ws" : "", vname);
    }
    int more_lo = lo > n_prefix ? lo - n_prefix : 0, more_hi = hi < 0 ? -1 : hi - n_prefix;
    if (items && items->type == LLM_JSON_FALSE) more_hi = 0;
    if (more_lo > 0 && more_hi == 0)
        return llm_js_fail(c, path, "%s: minItems needs items that are refused", "items");
    if (more_hi != 0) {
        char vname[64], sub[512];
        snprintf(sub, sizeof sub, "%.400s/items", path);
        if (items) { if (llm_js_visit(c, items, sub, "item", vname) != 0) return -1; }
        else { strcpy(vname, "value");
               c->used |= LLM_JS_VALUE | LLM_JS_STRING | LLM_JS_CHAR | LLM_JS_NUMBER | LLM_JS_BOOLEAN; }
        char elem[128];
        snprintf(elem, sizeof elem, "%s ws", vname);
        if (n_prefix) { /* each further item after a comma */
            if (more_hi < 0) llm_str_printf(body, " (\",\" ws %s){%d,}", elem, more_lo);
            else llm_str_printf(body, " (\",\" ws %s){%d,%d}", elem, more_lo, more_hi);
        } else if (more_lo == 0) { /* none, or one and then more after commas */
            if (more_hi < 0) llm_str_printf(body, " (%s (\",\" ws %s)*)?", elem, elem);
            else if (more_hi == 1) llm_str_printf(body, " (%s)?", elem);
            else llm_str_printf(body, " (%s (\",\" ws %s){0,%d})?", elem, elem, more_hi - 1);
        } else {
            if (more_hi < 0) llm_str_printf(body, " %s (\",\" ws %s){%d,}", elem, elem, more_lo - 1);
            else llm_str_printf(body, " %s (\",\" ws %s){%d,%d}", elem, elem, more_lo - 1, more_hi - 1);
        }
    }
    llm_str_puts(body, " \"]\"");
    return 0;
}

/* A shallow copy of an object schema with the value of key replaced (or added) */
static int llm_js_with(const llm_json *s, const char *key, const llm_json *value, llm_json *copy) {
    *copy = *s;
    copy->items = (llm_json *)malloc(((size_t)s->n + 1) * sizeof(llm_json));
    copy->keys = (char **)malloc(((size_t)s->n + 1) * sizeof(char *));
    if (!copy->items || !copy->keys) { free(copy->items); free(copy->keys); return -1; }
    int at = -1;
    for (int i = 0; i < s->n; i++) {
        copy->items[i] = s->items[i]; copy->keys[i] = s->keys[i];
        if (!strcmp(s->keys[i], key)) at = i;
    }
    if (at < 0) { at = copy->n++; copy->keys[at] = (char *)key; }
    copy->items[at] = *value;
    return 0;
}

/* allOf: the parts (and the schema around them) merged into one object schema: properties and required
 * joined, every other keyword taken where the parts agree on it; what they disagree on is refused. A part's
 * own allOf and $ref are more parts, taken in turn from one list (no recursion; LLM_JS_MAX_PARTS ends a
 * $ref that leads back into the allOf). A property of several parts gets all their schemas, as its own
 * allOf. */
static int llm_js_all_of(llm_js *c, const llm_json *s, const char *path, const char *stem, char *name) {
    const llm_json *all = llm_json_get(s, "allOf");
    if (all->type != LLM_JSON_ARRAY || all->n == 0)
        return llm_js_fail(c, path, "%s must be a non-empty array", "allOf");
    llm_json merged = {LLM_JSON_OBJECT, 0, NULL, 0, NULL, NULL, 0};
    llm_json props = {LLM_JSON_OBJECT, 0, NULL, 0, NULL, NULL, 0},
        req = {LLM_JSON_ARRAY, 0, NULL, 0, NULL, NULL, 0};
    llm_json *m_items = NULL, *p_items = NULL, *r_items = NULL; /* stb_ds */
    char **m_keys = NULL, **p_keys = NULL;
    llm_json **lists = NULL;        /* stb_ds: the schemas of a property several parts have (stb_ds each) */
    int *list_of = NULL;            /* stb_ds, by property: its list in lists, or -1 (one part has it) */
    llm_json *made = NULL;          /* stb_ds: the allOf objects made of lists, one key each */
    const llm_json **parts = NULL;  /* stb_ds: s, its allOf's parts, then theirs and their $refs' targets */
    const llm_json **closed = NULL; /* stb_ds: the properties of each part closed by additionalProperties
                                     * false (NULL: none), which are then the only ones allowed */
    static char *all_of_key = (char *)"allOf";
    int rc = 0;
    arrput(parts, s);
    for (ptrdiff_t part = 0; part < arrlen(parts) && rc == 0; part++) {
        const llm_json *ps = parts[part], *inner = llm_json_get(ps, "allOf"), *ref = llm_json_get(ps, "$ref");
        if (!ps || ps->type != LLM_JSON_OBJECT) {
            rc = llm_js_fail(c, path, "%s: a part that is not an object schema", "allOf");
            break;
        }
        if (inner && inner->type != LLM_JSON_ARRAY) {
            rc = llm_js_fail(c, path, "%s must be an array", "allOf");
            break;
        }
        if (arrlen(parts) + (inner ? inner->n : 0) + 1 > LLM_JS_MAX_PARTS) {
            rc = llm_js_fail(c, path, "%s merges more than " LLM_JS_XSTR(LLM_JS_MAX_PARTS) " parts (with the "
                             "allOf and $ref inside them)", "allOf");
            break;
        }
        if ((rc = llm_js_spend(c, ps->n, path)) != 0) break;
        for (int k = 0; inner && k < inner->n; k++) arrput(parts, &inner->items[k]);
        if (part > 0 && ref && ref->type == LLM_JSON_STRING) {
            const llm_json *target = llm_js_resolve(c, ref->str, NULL);
            if (!target) {
                rc = llm_js_fail(c, path, "allOf: $ref \"%.80s\" does not point into this schema", ref->str);
                break;
            }
            arrput(parts, target);
        }
        for (int i = 0; i < ps->n && rc == 0; i++) {
            const char *key = ps->keys[i];
            const llm_json *v = &ps->items[i];
            if (!strcmp(key, "allOf") || (part > 0 && !strcmp(key, "$ref") && v->type == LLM_JSON_STRING))
                continue; /* parts of their own, above */
            if (!strcmp(key, "additionalProperties") && v->type == LLM_JSON_FALSE) {
                const llm_json *own = llm_json_get(ps, "properties");
                arrput(closed, own);
                continue;
            }
            if (!strcmp(key, "properties") && v->type == LLM_JSON_OBJECT) {
                for (int k = 0; k < v->n; k++) {
                    ptrdiff_t dup = -1;
                    if ((rc = llm_js_spend(c, 1 + arrlen(p_keys), path)) != 0) break;
                    for (ptrdiff_t j = 0; j < arrlen(p_keys); j++)
                        if (!strcmp(p_keys[j], v->keys[k])) dup = j;
                    if (dup < 0) {
                        arrput(p_keys, v->keys[k]); arrput(p_items, v->items[k]); arrput(list_of, -1);
                        continue;
                    }
                    if (list_of[dup] < 0) { /* a property of two parts: both schemas hold */
                        llm_json *list = NULL;
                        arrput(list, p_items[dup]);
                        list_of[dup] = (int)arrlen(lists);
                        arrput(lists, list);
                    }
                    arrput(lists[list_of[dup]], v->items[k]);
                }
                continue;
            }
            if (!strcmp(key, "required") && v->type == LLM_JSON_ARRAY) {
                for (int k = 0; k < v->n; k++) arrput(r_items, v->items[k]);
                continue;
            }
            int same = -1;
            if ((rc = llm_js_spend(c, 1 + arrlen(m_keys), path)) != 0) break;
            for (ptrdiff_t j = 0; j < arrlen(m_keys); j++) if (!strcmp(m_keys[j], key)) same = (int)j;
            if (same < 0) { arrput(m_keys, (char *)key); arrput(m_items, *v); continue; }
            char *a = NULL, *b = NULL; /* the same keyword twice: it must say the same */
            llm_json_write_compact(&a, &m_items[same], 0); llm_json_write_compact(&b, v, 0);
            int differ = arrlen(a) != arrlen(b) || memcmp(a, b, (size_t)arrlen(a));
            arrfree(a); arrfree(b);
            if (differ && !llm_js_key_in(key, llm_js_ignored, sizeof llm_js_ignored / sizeof *llm_js_ignored))
                rc = llm_js_fail(c, path, "allOf: the parts differ on \"%s\" (not supported)", key);
        }
    }
    arrsetlen(made, arrlen(lists)); /* the lists, now that they have stopped growing: {"allOf": list} */
    for (ptrdiff_t k = 0; k < arrlen(p_keys); k++) {
        if (list_of[k] < 0) continue;
        llm_json list = {LLM_JSON_ARRAY, 0, NULL, 0, lists[list_of[k]], NULL, (int)arrlen(lists[list_of[k]])};
        made[list_of[k]] = list;
        llm_json obj = {LLM_JSON_OBJECT, 0, NULL, 0, &made[list_of[k]], &all_of_key, 1};
        p_items[k] = obj;
    }
    for (ptrdiff_t j = 0; rc == 0 && j < arrlen(closed); j++) /* what a closed part does not list goes */
        for (ptrdiff_t k = 0; k < arrlen(p_keys); k++)
            if (!llm_json_get(closed[j], p_keys[k])) { arrdel(p_keys, k); arrdel(p_items, k); k--; }
    for (ptrdiff_t k = 0; rc == 0 && k < arrlen(r_items); k++) {
        int listed = arrlen(closed) == 0;
        for (ptrdiff_t j = 0; j < arrlen(p_keys) && !listed; j++)
            listed = r_items[k].type == LLM_JSON_STRING && !strcmp(p_keys[j], r_items[k].str);
        if (!listed) rc = llm_js_fail(c, path, "allOf: \"%s\" is required but another part's "
                                      "additionalProperties false forbids it",
                                      r_items[k].str ? r_items[k].str : "?");
    }
    if (rc == 0 && arrlen(closed)) { /* closed: no other keys */
        llm_json no = {LLM_JSON_FALSE, 0, NULL, 0, NULL, NULL, 0};
        arrput(m_keys, "additionalProperties"); arrput(m_items, no);
    }
    if (rc == 0) {
        props.items = p_items; props.keys = p_keys; props.n = (int)arrlen(p_keys);
        req.items = r_items; req.n = (int)arrlen(r_items);
        if (arrlen(p_keys)) { arrput(m_keys, "properties"); arrput(m_items, props); }
        if (arrlen(r_items)) { arrput(m_keys, "required"); arrput(m_items, req); }
        merged.items = m_items; merged.keys = m_keys; merged.n = (int)arrlen(m_keys);
        rc = llm_js_visit(c, &merged, path, stem, name);
    }
    arrfree(m_items); arrfree(m_keys); arrfree(p_items); arrfree(p_keys); arrfree(r_items); arrfree(closed);
    for (ptrdiff_t i = 0; i < arrlen(lists); i++) arrfree(lists[i]);
    arrfree(lists); arrfree(list_of); arrfree(made); arrfree(parts);
    return rc;
}

/* How many of a schema's keywords say something of the value (annotations do not) */
static int llm_js_constraining(const llm_json *s) {
    int n = 0;
    for (int i = 0; i < s->n; i++)
        n += !llm_js_key_in(s->keys[i], llm_js_ignored, sizeof llm_js_ignored / sizeof *llm_js_ignored);
    return n;
}

/* A $ref: the name of its target's rule. The first time, the target is named and left in c->pending, to
 * be written after the schema that used it (llm_js_rules), not here: a chain of 100,000 $refs, each
 * target another $ref, costs no depth at all. Named before it is written, a schema may refer to itself. */
static int llm_js_ref(llm_js *c, const char *ref, const char *path, char *name) {
    const llm_json *root = NULL, *target = llm_js_resolve(c, ref, &root);
    if (!target)
        return llm_js_fail(c, path, "$ref \"%.80s\" does not point into this schema (not supported)", ref);
    char *key = NULL; /* stb_ds: the document and the place in it */
    llm_str_printf(&key, "%p %s", (const void *)root, strchr(ref, '#'));
    arrput(key, 0);
    ptrdiff_t k = shgeti(c->refs, key);
    if (k >= 0) { snprintf(name, 64, "%s", c->refs[k].value); arrfree(key); return 0; }
    const char *last = strrchr(ref, '/');
    llm_js_name(c, last ? last + 1 : "root", name, 64);
    llm_js_pending p = {target, root, ref, ""};
    memcpy(p.name, name, 64);
    char *copy = strdup(name);
    if (copy) { shput(c->refs, key, copy); arrput(c->pending, p); }
    arrfree(key);
    return copy ? 0 : llm_js_fail(c, path, "%s", "out of memory");
}

/* The rule for schema s (its name in name, 64 bytes): written out, or a primitive's name */
static int llm_js_schema(llm_js *c, const llm_json *s, const char *path, const char *stem, char *name) {
    if (s->type == LLM_JSON_TRUE || (s->type == LLM_JSON_OBJECT && s->n == 0)) {
        strcpy(name, "value");
        c->used |= LLM_JS_VALUE | LLM_JS_WS | LLM_JS_STRING | LLM_JS_CHAR | LLM_JS_NUMBER | LLM_JS_BOOLEAN;
        return 0;
    }
    if (s->type == LLM_JSON_FALSE)
        return llm_js_fail(c, path, "%s (no value at all) is not supported", "false");
    if (s->type != LLM_JSON_OBJECT)
        return llm_js_fail(c, path, "%s", "a schema must be an object or a boolean");
    for (int i = 0; i < s->n; i++)
        if (llm_js_key_in(s->keys[i], llm_js_refused, sizeof llm_js_refused / sizeof *llm_js_refused))
            return llm_js_fail(c, path, "\"%s\" is not supported", s->keys[i]);
    int constraining = llm_js_constraining(s); /* keywords that say something, beside $ref, anyOf ... */
    const llm_json *ref = llm_json_get(s, "$ref"), *cst = llm_json_get(s, "const"),
        *en = llm_json_get(s, "enum");
    const llm_json *any = llm_json_get(s, "anyOf"), *one = llm_json_get(s, "oneOf"),
        *type = llm_json_get(s, "type");
    const llm_json *all = llm_json_get(s, "allOf");
    const llm_json *only = all && all->type == LLM_JSON_ARRAY && all->n == 1 ? &all->items[0] : NULL;
    if (only && constraining == 1 && only->type == LLM_JSON_OBJECT && llm_js_constraining(only) == 1 &&
        (ref = llm_json_get(only, "$ref")) && ref->type == LLM_JSON_STRING) /* {"allOf": [{"$ref": ...}]} */
        return llm_js_ref(c, ref->str, path, name);
    if (all) return llm_js_all_of(c, s, path, stem, name);
    char *body = NULL;
    int rc = 0;
    if (ref) {
        if (ref->type != LLM_JSON_STRING) return llm_js_fail(c, path, "%s must be a string", "$ref");
        if (constraining > 1)
            return llm_js_fail(c, path, "%s beside other keywords is not supported", "$ref");
        return llm_js_ref(c, ref->str, path, name);
    }
    if (cst) llm_js_const(&body, cst);
    else if (en) {
        if (en->type != LLM_JSON_ARRAY || en->n == 0)
            return llm_js_fail(c, path, "%s must be a non-empty array", "enum");
        char *texts = NULL, prefix[64]; /* stb_ds: the values' compact texts, one after another, as a trie */
        size_t *at = (size_t *)malloc(((size_t)en->n + 1) * sizeof *at);
        llm_gr_text *t = (llm_gr_text *)malloc((size_t)en->n * sizeof *t);
        if (!at || !t) { free(at); free(t); return llm_js_fail(c, path, "%s", "out of memory"); }
        for (int i = 0; i < en->n; i++) {
            at[i] = (size_t)arrlen(texts);
            llm_json_write_compact(&texts, &en->items[i], 0);
        }
        at[en->n] = (size_t)arrlen(texts);
        for (int i = 0; i < en->n; i++) { t[i].s = texts + at[i]; t[i].len = at[i + 1] - at[i]; }
        llm_js_name(c, stem, prefix, sizeof prefix);
        llm_gr_trie(&body, &c->out, prefix, t, en->n);
        arrfree(texts); free(at); free(t);
    } else if (any || one) {
        const llm_json *alts = any ? any : one;
        if (any && one) return llm_js_fail(c, path, "%s together with oneOf is not supported", "anyOf");
        if (alts->type != LLM_JSON_ARRAY || alts->n == 0)
            return llm_js_fail(c, path, "%s must be a non-empty array", any ? "anyOf" : "oneOf");
        if (constraining > 1)
            return llm_js_fail(c, path, "%s beside other keywords is not supported (put them "
                                                 "in each alternative)", any ? "anyOf" : "oneOf");
        for (int i = 0; i < alts->n && rc == 0; i++) {
            char sub[512], alt[64];
            snprintf(sub, sizeof sub, "%.400s/%s/%d", path, any ? "anyOf" : "oneOf", i);
            rc = llm_js_visit(c, &alts->items[i], sub, stem, alt);
            if (rc == 0) llm_str_printf(&body, "%s%s", i ? " | " : "", alt);
        }
    } else if (type && type->type == LLM_JSON_ARRAY) { /* a list of types: each is an alternative */
        for (int i = 0; i < type->n && rc == 0; i++) {
            llm_json one_type;
            char alt[64];
            if (llm_js_with(s, "type", &type->items[i],
                            &one_type) != 0) { rc = llm_js_fail(c, path, "%s", "out of memory"); break; }
            rc = llm_js_visit(c, &one_type, path, stem, alt);
            free(one_type.items); free(one_type.keys);
            if (rc == 0) llm_str_printf(&body, "%s%s", i ? " | " : "", alt);
        }
        if (type->n == 0) rc = llm_js_fail(c, path, "%s must not be empty", "type");
    } else {
        const char *t = type && type->type == LLM_JSON_STRING ? type->str : NULL;
        if (type && !t) return llm_js_fail(c, path, "%s must be a string or a list of strings", "type");
        if (!t) { /* no type: what the keywords are about */
            static const struct { const char *key, *type; } hints[] = {
                {"properties", "object"}, {"additionalProperties", "object"}, {"required", "object"},
                {"items", "array"}, {"prefixItems", "array"}, {"minItems", "array"}, {"maxItems", "array"},
                {"minLength", "string"}, {"maxLength", "string"}, {"pattern", "string"}, {"format", "string"},
                {"minimum", "number"}, {"maximum", "number"}, {"exclusiveMinimum", "number"},
                {"exclusiveMaximum", "number"}};
            for (size_t i = 0; !t && i < sizeof hints / sizeof *hints; i++)
                if (llm_json_get(s, hints[i].key)) t = hints[i].type;
        }
        if (!t) { strcpy(name, "value");
                  c->used |= LLM_JS_VALUE | LLM_JS_WS | LLM_JS_STRING | LLM_JS_CHAR | LLM_JS_NUMBER |
                      LLM_JS_BOOLEAN; return 0; }
        if (!strcmp(t, "string")) rc = llm_js_string(c, s, path, &body);
        else if (!strcmp(t, "integer") || !strcmp(t, "number"))
            rc = llm_js_number(c, s, path, t[0] == 'i', &body);
        else if (!strcmp(t, "boolean")) { llm_str_puts(&body, "boolean"); c->used |= LLM_JS_BOOLEAN; }
        else if (!strcmp(t, "null")) llm_str_puts(&body, "\"null\"");
        else if (!strcmp(t, "object")) rc = llm_js_object(c, s, path, stem, &body);
        else if (!strcmp(t, "array")) rc = llm_js_array(c, s, path, &body);
        else rc = llm_js_fail(c, path, "type \"%s\" is not a JSON Schema type", t);
    }
    if (rc == 0) {
        llm_js_name(c, stem, name, 64);
        llm_js_rule(c, name, body, (size_t)arrlen(body));
    }
    arrfree(body);
    return rc;
}

/* llm_js_schema, in the bounds: schemas inside schemas (properties, items, anyOf, allOf) are written by
 * calling this again, so c->depth, checked before going in, bounds that recursion; and the rules written,
 * the work. $refs add no depth (llm_js_ref). */
static int llm_js_visit(llm_js *c, const llm_json *s, const char *path, const char *stem, char *name) {
    if (c->n_rules > LLM_JS_MAX_RULES) return llm_js_fail(c, path, "%s", llm_js_too_many);
    if (llm_js_spend(c, s->type == LLM_JSON_OBJECT ? s->n : 1, path) != 0) return -1;
    if (c->depth >= LLM_JS_MAX_DEPTH)
        return llm_js_fail(c, path, "the schema nests more than %s deep (properties, items, anyOf, allOf "
                           "inside each other)", LLM_JS_XSTR(LLM_JS_MAX_DEPTH));
    c->depth++;
    int rc = llm_js_schema(c, s, path, stem, name);
    c->depth--;
    return rc;
}

/* The rules of several schemas in one GBNF text, with no root: names[i] is schema i's rule (each schema the
 * root of its own $refs; $refs "llm:K#..." go into docs[K]). The $refs' targets are written after each
 * schema, one after another (each may name more), from c.pending. NULL with the reason in err. */
static char *llm_js_rules(const llm_json *const *schemas, int n, const llm_json *const *docs, int n_docs,
                          char (*names)[64], char *err) {
    char buf[LLM_ERR_LEN];
    llm_js c;
    memset(&c, 0, sizeof c);
    c.err = err ? err : buf; c.err[0] = 0;
    c.docs = docs; c.n_docs = n_docs;
    int rc = n > 0 ? 0 : llm_fail(c.err, "JSON schema: none given");
    for (int i = 0; rc == 0 && i < n; i++) {
        c.root = schemas[i];
        sh_new_strdup(c.refs);
        rc = schemas[i] ? llm_js_visit(&c, schemas[i], "", "root", names[i]) :
                          llm_fail(c.err, "JSON schema: none given");
        while (rc == 0 && arrlen(c.pending)) {
            llm_js_pending p = arrpop(c.pending);
            const char *last = strrchr(p.ref, '/');
            char target_name[64];
            c.root = p.root;
            rc = llm_js_visit(&c, p.target, strchr(p.ref, '#') + 1, last ? last + 1 : "root", target_name);
            if (rc == 0) llm_js_rule(&c, p.name, target_name, strlen(target_name));
        }
        arrsetlen(c.pending, 0);
        for (ptrdiff_t k = 0; k < shlen(c.refs); k++) free(c.refs[k].value);
        shfree(c.refs);
    }
    char *text = NULL;
    if (rc == 0) {
        for (size_t i = 0; i < sizeof llm_js_primitives / sizeof *llm_js_primitives; i++)
            if (c.used & llm_js_primitives[i].bit) llm_str_puts(&c.out, llm_js_primitives[i].rules);
        arrput(c.out, 0);
        if (!(text = strdup(c.out))) llm_fail(c.err, "out of memory");
    }
    for (ptrdiff_t i = 0; i < hmlen(c.index); i++) shfree(c.index[i].value);
    hmfree(c.index); arrfree(c.pending); arrfree(c.out);
    return text;
}

/* A schema as GBNF whose start rule is root (docs: as llm_js_rules) */
static char *llm_js_grammar(const llm_json *schema, const llm_json *const *docs, int n_docs, char *err) {
    char name[1][64];
    char *rules = llm_js_rules(&schema, 1, docs, n_docs, name, err), *text = NULL;
    if (rules && (text = (char *)malloc(strlen(rules) + 80)) != NULL)
        sprintf(text, "root ::= %s\n%s", name[0], rules);
    else if (rules) llm_fail(err, "out of memory");
    free(rules);
    return text;
}

char *llm_json_schema_to_grammar(const llm_json *schema, char *err) {
    return llm_js_grammar(schema, NULL, 0, err);
}

#else /* LLM_NO_GRAMMAR: the API stays and refuses: the engine and the server then refuse a grammar */
struct llm_grammar { int refs; };
static char *llm_gr_none(char *err) {
    llm_fail(err, "this build has no grammars (LLM_NO_GRAMMAR)");
    return NULL;
}
char *llm_json_schema_to_grammar(const llm_json *schema, char *err) { (void)schema; return llm_gr_none(err); }
char *llm_regex_to_grammar(const char *regex, char *err) { (void)regex; return llm_gr_none(err); }
char *llm_choice_to_grammar(const char *const *choices, int n, char *err) {
    (void)choices; (void)n;
    return llm_gr_none(err);
}
llm_grammar *llm_grammar_parse(const char *gbnf, char *err) { (void)gbnf; llm_gr_none(err); return NULL; }
void llm_grammar_free(llm_grammar *g) { (void)g; }
static llm_grammar *llm_grammar_ref(llm_grammar *g) { return g; }
static int64_t llm_grammar_cache_hits(const llm_grammar *g) { (void)g; return 0; }
llm_grammar_state *llm_grammar_start(const llm_grammar *g) { (void)g; return NULL; }
llm_grammar_state *llm_grammar_state_copy(const llm_grammar_state *st) { (void)st; return NULL; }
void llm_grammar_state_free(llm_grammar_state *st) { (void)st; }
int llm_grammar_accept(llm_grammar_state *st, const char *bytes, int n) {
    (void)st; (void)bytes; (void)n;
    return -1;
}
int llm_grammar_can_end(const llm_grammar_state *st) { (void)st; return 1; }
int llm_grammar_done(const llm_grammar_state *st) { (void)st; return 0; }
llm_token_trie *llm_token_trie_build(const llm_tokenizer *t, char *err) {
    (void)t;
    llm_gr_none(err);
    return NULL;
}
void llm_token_trie_free(llm_token_trie *tt) { (void)tt; }
int llm_grammar_mask(const llm_grammar_state *st, const llm_token_trie *tt, uint8_t *mask) {
    (void)st; (void)tt; (void)mask;
    return -1;
}
int llm_grammar_allows(const llm_grammar_state *st, const llm_token_trie *tt, int32_t token) {
    (void)st; (void)tt; (void)token;
    return 0;
}
static int llm_gr_allows_into(const llm_grammar_state *st, const llm_token_trie *tt, int32_t token,
                              llm_grammar_state *next) {
    (void)st; (void)tt; (void)token; (void)next;
    return 0;
}
#endif /* LLM_NO_GRAMMAR */

/* ===========================================================================================================
 * 13. Tools (a layer)
 * Tool calling in each chat family's own syntax: how a family writes the tools, a turn's calls and their
 * results into a prompt (llm_chat_render, section 4, calls these writers where the template puts them), the
 * grammar a reply follows to call tools (over the grammar layer: without it, none), and a reply read back
 * into its thinking, its answer and its calls.
 * ======================================================================================================== */
/* ---- Tools: Hermes style (Qwen2.5, Qwen3) -------------------------------------------------------------- */
/* The system turn's list of tools (Qwen/Qwen2.5-7B-Instruct, Qwen/Qwen3-0.6B): each one as tojson writes
 * it */
static void llm_hermes_tools(llm_chat_text *c, const llm_json *tools) {
    llm_chat_puts(c, "# Tools\n\nYou may call one or more functions to assist with the "
                     "user query.\n\nYou are "
                  "provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for (int i = 0; i < tools->n; i++) {
        char *py = llm_json_dumps(&tools->items[i], 1);
        llm_chat_puts(c, "\n"); llm_chat_puts(c, py ? py : "");
        free(py);
    }
    llm_chat_puts(c, "\n</tools>\n\nFor each function call, return a json object with function name and "
                  "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                  "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
}

/* An assistant turn's calls: Qwen3 puts a newline before each but a first one that follows no text; Qwen2.5
 * before each */
static int llm_hermes_calls(llm_chat_text *c, const llm_chat_message *m, int newline_first) {
    for (int k = 0; k < m->n_tool_calls; k++) {
        if (k || newline_first) llm_chat_puts(c, "\n");
        llm_chat_puts(c, "<tool_call>\n{\"name\": \"");
        llm_chat_puts(c, m->tool_calls[k].name ? m->tool_calls[k].name : "");
        llm_chat_puts(c, "\", \"arguments\": ");
        if (llm_chat_put_json(c, m->tool_calls[k].arguments) != 0) return -1;
        llm_chat_puts(c, "}\n</tool_call>");
    }
    return 0;
}

/* A tool's result: the results in a row share one user turn, each inside <tool_response> */
static void llm_hermes_result(llm_chat_text *c, const int *role, int n, int i, const char *content) {
    if (i == 0 || role[i - 1] != LLM_ROLE_TOOL) llm_chat_puts(c, "<|im_start|>user");
    llm_chat_puts(c, "\n<tool_response>\n"); llm_chat_puts(c, content);
    llm_chat_puts(c, "\n</tool_response>");
    if (i == n - 1 || role[i + 1] != LLM_ROLE_TOOL) llm_chat_puts(c, "<|im_end|>\n");
}

/* ---- Tools: Mistral v3 (Mistral-7B-Instruct-v0.3, Mistral-Nemo-Instruct-2407, Mistral-Large-2407) ---- */
/* The tools before the last question: each function's keys as the template writes them, a string value
 * between quotes as it is (not escaped: the template does not), any other value as tojson writes it */
static int llm_mistral_tools(llm_chat_text *c, const llm_json *tools, int tekken) {
    llm_chat_puts(c, tekken ? "[AVAILABLE_TOOLS][" : "[AVAILABLE_TOOLS] [");
    for (int i = 0; i < tools->n; i++) {
        const llm_json *fn = llm_json_get(&tools->items[i], "function");
        if (!fn || fn->type != LLM_JSON_OBJECT) return -1;
        llm_chat_puts(c, i ? ", {\"type\": \"function\", \"function\": {" :
                                "{\"type\": \"function\", \"function\": {");
        for (int k = 0, first = 1; k < fn->n; k++) {
            if (!strcmp(fn->keys[k], "return")) continue;
            llm_chat_puts(c, first ? "\"" : ", \""); llm_chat_puts(c, fn->keys[k]); llm_chat_puts(c, "\": ");
            first = 0;
            if (fn->items[k].type == LLM_JSON_STRING) {
                llm_chat_puts(c, "\""); llm_chat_puts(c, fn->items[k].str); llm_chat_puts(c, "\"");
            } else {
                char *py = llm_json_dumps(&fn->items[k], 1);
                llm_chat_puts(c, py ? py : "");
                free(py);
            }
        }
        llm_chat_puts(c, "}}");
    }
    llm_chat_puts(c, "][/AVAILABLE_TOOLS]");
    return 0;
}


/* An assistant's calls, [TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "..."}, ...], then EOS; -1 for
 * an id that is not 9 characters long (the template refuses it: llm serve makes every id 9 long first) */
static int llm_mistral_calls(llm_chat_text *c, const llm_chat_message *m, int tekken, const char *eos) {
    llm_chat_puts(c, tekken ? "[TOOL_CALLS][" : "[TOOL_CALLS] [");
    for (int k = 0; k < m->n_tool_calls; k++) {
        const llm_chat_tool_call *tc = &m->tool_calls[k];
        const char *name = tc->name ? tc->name : "";
        llm_json name_v = {LLM_JSON_STRING, 0, (char *)name, strlen(name), NULL, NULL, 0, 0};
        char *py = llm_json_dumps(&name_v, 1);
        llm_chat_puts(c, k ? ", {\"name\": " : "{\"name\": "); llm_chat_puts(c, py ? py : "");
        free(py);
        llm_chat_puts(c, ", \"arguments\": ");
        if (llm_chat_put_json(c, tc->arguments) != 0 || !tc->id || strlen(tc->id) != 9) return -1;
        llm_chat_puts(c, ", \"id\": \""); llm_chat_puts(c, tc->id); llm_chat_puts(c, "\"}");
    }
    llm_chat_puts(c, "]"); llm_chat_puts(c, eos);
    return 0;
}

/* ---- Tools: the generic format, for a family without its own ------------------------------------------
 * As llama.cpp does for such templates: the tools are described at the end of the system turn, the reply is
 * always one JSON object (the grammar sees to it), earlier calls are written as that JSON in the assistant's
 * turn and results as JSON in a user turn; then the family writes the conversation as it writes any. */
#define LLM_GENERIC_TOOLS_HOWTO \
    "\n\nRespond in JSON format: to call tools, {\"tool_calls\": [{\"name\": \"<the tool's name>\", " \
    "\"arguments\": {<its arguments>}}]}; to answer the user, {\"response\": \"<your answer>\"}."

static char *llm_chat_text_dup(llm_chat_text *c) { /* what c holds, as a C string (c from a NULL buffer) */
    char *s = (char *)malloc(c->n + 1);
    if (s && c->out) memcpy(s, c->out, c->n);
    if (s) s[c->n] = 0;
    free(c->out);
    return s;
}

static void llm_chat_grow_put(llm_chat_text *c, const char *s) { /* appends to a growing buffer */
    size_t n = strlen(s);
    if (c->n + n + 1 > c->cap) {
        size_t cap = (c->n + n + 1) * 2;
        char *out = (char *)realloc(c->out, cap);
        if (!out) return;
        c->out = out; c->cap = cap;
    }
    memcpy(c->out + c->n, s, n);
    c->n += n;
}

/* ---- gpt-oss: OpenAI's harmony format (openai/gpt-oss-20b's template) ---------------------------------- */
static int llm_json_truthy(const llm_json *v) { /* as Jinja's if: null, false, 0, "", [] and {} are false */
    if (!v || v->type == LLM_JSON_NULL || v->type == LLM_JSON_FALSE) return 0;
    if (v->type == LLM_JSON_NUMBER) return v->num != 0;
    if (v->type == LLM_JSON_STRING) return v->len > 0;
    return v->type == LLM_JSON_TRUE || v->n > 0;
}
static int llm_json_is(const llm_json *v, const char *text) {
    return v && v->type == LLM_JSON_STRING && !strcmp(v->str, text);
}

/* A value as Jinja's + and join write it, Python's str(): a string as it is, others as JSON (True, False and
 * None as Python spells them) */
static void llm_harmony_str(llm_chat_text *c, const llm_json *v) {
    if (v->type == LLM_JSON_STRING) { llm_chat_grow_put(c, v->str); return; }
    if (v->type == LLM_JSON_TRUE || v->type == LLM_JSON_FALSE || v->type == LLM_JSON_NULL) {
        llm_chat_grow_put(c, v->type == LLM_JSON_TRUE ? "True" :
                          v->type == LLM_JSON_FALSE ? "False" : "None");
        return;
    }
    char *js = llm_json_dumps(v, 1);
    llm_chat_grow_put(c, js ? js : "");
    free(js);
}

/* A JSON Schema as the TypeScript type the template's render_typescript_type writes, its white space too */
static void llm_harmony_type(llm_chat_text *c, const llm_json *spec) {
    const llm_json *type = llm_json_get(spec, "type"), *items = llm_json_get(spec, "items");
    const llm_json *one_of = llm_json_get(spec, "oneOf"), *props = llm_json_get(spec, "properties");
    int nullable = llm_json_truthy(llm_json_get(spec, "nullable"));
    if (llm_json_is(type, "array")) {
        if (!llm_json_truthy(items)) llm_chat_grow_put(c, "any[]");
        else {
            const llm_json *it = llm_json_get(items, "type");
            if (llm_json_is(it, "string")) llm_chat_grow_put(c, "string[]");
            else if (llm_json_is(it, "number") || llm_json_is(it, "integer"))
                llm_chat_grow_put(c, "number[]");
            else if (llm_json_is(it, "boolean")) llm_chat_grow_put(c, "boolean[]");
            else {
                llm_chat_text inner = {NULL, 0, 0};
                llm_harmony_type(&inner, items);
                size_t chars = 0; /* |length counts characters */
                for (size_t i = 0; i < inner.n; i++) chars += (inner.out[i] & 0xC0) != 0x80;
                int any = chars > 50 || (inner.n == 15 && !memcmp(inner.out, "object | object", 15));
                if (any) llm_chat_grow_put(c, "any[]");
                else { llm_chat_grow_put(c, inner.out ? inner.out : ""); llm_chat_grow_put(c, "[]"); }
                free(inner.out);
            }
        }
        if (nullable) llm_chat_grow_put(c, " | null");
    } else if (type && type->type == LLM_JSON_ARRAY && type->n > 0) { /* ["string", "null"] */
        for (int i = 0; i < type->n; i++) {
            if (i) llm_chat_grow_put(c, " | ");
            llm_harmony_str(c, &type->items[i]);
        }
    } else if (llm_json_truthy(one_of) && one_of->type == LLM_JSON_ARRAY) {
        /* (the template's test for object variants sets a variable inside its loop, which Jinja forgets
         * there: the variants are always written) */
        for (int i = 0; i < one_of->n; i++) {
            const llm_json *v = &one_of->items[i], *d = llm_json_get(v, "description");
            llm_harmony_type(c, v);
            if (llm_json_truthy(d)) { llm_chat_grow_put(c, "// "); llm_harmony_str(c, d); }
            if ((d = llm_json_get(v, "default"))) {
                char *js = llm_json_dumps(d, 1);
                llm_chat_grow_put(c, "                    // default: "); llm_chat_grow_put(c, js ? js : "");
                free(js);
            }
            if (i < one_of->n - 1) llm_chat_grow_put(c, " | \n");
        }
    } else if (llm_json_is(type, "string")) {
        const llm_json *e = llm_json_get(spec, "enum");
        if (llm_json_truthy(e) && e->type == LLM_JSON_ARRAY) {
            llm_chat_grow_put(c, "\"");
            for (int i = 0; i < e->n; i++) {
                if (i) llm_chat_grow_put(c, "\" | \"");
                llm_harmony_str(c, &e->items[i]);
            }
            llm_chat_grow_put(c, "\"");
        } else llm_chat_grow_put(c, nullable ? "string | null" : "string");
    } else if (llm_json_is(type, "number") || llm_json_is(type, "integer")) llm_chat_grow_put(c, "number");
    else if (llm_json_is(type, "boolean")) llm_chat_grow_put(c, "boolean");
    else if (llm_json_is(type, "object")) {
        if (!llm_json_truthy(props) || props->type != LLM_JSON_OBJECT) {
            llm_chat_grow_put(c, "object");
            return;
        }
        const llm_json *req = llm_json_get(spec, "required");
        llm_chat_grow_put(c, "{\n");
        for (int i = 0; i < props->n; i++) {
            int required = 0;
            for (int k = 0; req && req->type == LLM_JSON_ARRAY && k < req->n; k++)
                required |= llm_json_is(&req->items[k], props->keys[i]);
            llm_chat_grow_put(c, props->keys[i]);
            llm_chat_grow_put(c, required ? ": \n                " : "?: \n                ");
            llm_harmony_type(c, &props->items[i]);
            if (i < props->n - 1) llm_chat_grow_put(c, ", ");
        }
        llm_chat_grow_put(c, "}");
    } else llm_chat_grow_put(c, "any");
}

/* The developer message's tools: a TypeScript namespace "functions", each function a type of its parameters
 * (their descriptions and defaults as comments). -1 for a tool the template cannot write (no description). */
static int llm_harmony_tools(llm_chat_text *c, const llm_json *tools) {
    llm_chat_text t = {NULL, 0, 0};
    llm_chat_grow_put(&t, "# Tools\n\n## functions\n\nnamespace functions {\n\n");
    for (int i = 0; i < tools->n; i++) {
        const llm_json *fn = llm_json_get(&tools->items[i], "function");
        const llm_json *desc = llm_json_get(fn, "description"), *name = llm_json_get(fn, "name");
        const llm_json *params = llm_json_get(fn, "parameters"), *props = llm_json_get(params, "properties");
        if (!desc || desc->type != LLM_JSON_STRING || !name || name->type != LLM_JSON_STRING) {
            free(t.out);
            return -1;
        }
        llm_chat_grow_put(&t, "// "); llm_chat_grow_put(&t, desc->str);
        llm_chat_grow_put(&t, "\ntype "); llm_chat_grow_put(&t, name->str); llm_chat_grow_put(&t, " = ");
        if (!llm_json_truthy(params) || !llm_json_truthy(props) || props->type != LLM_JSON_OBJECT) {
            llm_chat_grow_put(&t, "() => any;\n\n");
            continue;
        }
        const llm_json *req = llm_json_get(params, "required");
        llm_chat_grow_put(&t, "(_: {\n");
        for (int k = 0; k < props->n; k++) {
            const llm_json *spec = &props->items[k], *d = llm_json_get(spec, "description");
            int required = 0;
            for (int j = 0; req && req->type == LLM_JSON_ARRAY && j < req->n; j++)
                required |= llm_json_is(&req->items[j], props->keys[k]);
            if (llm_json_truthy(d)) {
                llm_chat_grow_put(&t, "// "); llm_harmony_str(&t, d); llm_chat_grow_put(&t, "\n");
            }
            llm_chat_grow_put(&t, props->keys[k]);
            llm_chat_grow_put(&t, required ? ": " : "?: ");
            llm_harmony_type(&t, spec);
            if ((d = llm_json_get(spec, "default"))) {
                if (llm_json_truthy(llm_json_get(spec, "enum"))) {
                    llm_chat_grow_put(&t, ", // default: "); llm_harmony_str(&t, d);
                } else if (llm_json_truthy(llm_json_get(spec, "oneOf"))) {
                    llm_chat_grow_put(&t, "// default: "); llm_harmony_str(&t, d);
                } else {
                    char *js = llm_json_dumps(d, 1);
                    llm_chat_grow_put(&t, ", // default: "); llm_chat_grow_put(&t, js ? js : "");
                    free(js);
                }
            }
            llm_chat_grow_put(&t, ",\n");
        }
        llm_chat_grow_put(&t, "}) => any;\n\n");
    }
    llm_chat_grow_put(&t, "} // namespace functions");
    llm_chat_put(c, t.out, t.n);
    free(t.out);
    return 0;
}


/* The conversation with tools, calls and results written as text for a family without a tool format: new
 * messages in *out (n of them) and their texts in *texts (n, malloc'ed). -1 when arguments are not JSON. */
static int llm_chat_generic_tools(const llm_chat_template *ct, const llm_chat_message *msgs, int n,
                                  const llm_json *tools, llm_chat_message **out, char ***texts) {
    llm_chat_message *m = (llm_chat_message *)calloc((size_t)n + 1, sizeof *m);
    char **t = (char **)calloc((size_t)n + 1, sizeof(char *));
    int has_sys = n > 0 && llm_chat_role(msgs[0].role) == LLM_ROLE_SYSTEM, k = 0, ok = m && t;
    if (ok && tools && tools->n > 0) { /* the system turn: its own text, then the tools */
        llm_chat_text c = {NULL, 0, 0};
        llm_chat_grow_put(&c, has_sys ? (msgs[0].content ? msgs[0].content : "") : ct->default_system);
        if (c.n) llm_chat_grow_put(&c, "\n\n");
        llm_chat_grow_put(&c, "You can call these tools:");
        for (int i = 0; i < tools->n; i++) {
            char *py = llm_json_dumps(&tools->items[i], 1);
            llm_chat_grow_put(&c, "\n"); llm_chat_grow_put(&c, py ? py : "");
            free(py);
        }
        llm_chat_grow_put(&c, LLM_GENERIC_TOOLS_HOWTO);
        m[k].role = "system"; m[k].content = t[k] = llm_chat_text_dup(&c); ok = t[k++] != NULL;
    }
    for (int i = k && has_sys ? 1 : 0; ok && i < n; i++, k++) {
        int role = llm_chat_role(msgs[i].role);
        m[k] = msgs[i];
        if (role == LLM_ROLE_ASSISTANT && msgs[i].n_tool_calls > 0) {
            llm_chat_text c = {NULL, 0, 0};
            if (msgs[i].content && msgs[i].content[0]) {
                llm_chat_grow_put(&c, msgs[i].content); llm_chat_grow_put(&c, "\n");
            }
            llm_chat_grow_put(&c, "{\"tool_calls\": [");
            for (int j = 0; j < msgs[i].n_tool_calls; j++) {
                const llm_chat_tool_call *tc = &msgs[i].tool_calls[j];
                llm_json args;
                if (!tc->arguments || llm_json_parse(tc->arguments, strlen(tc->arguments),
                                                     &args, NULL) != 0) {
                    ok = 0;
                    break;
                }
                llm_json name = {LLM_JSON_STRING, 0, (char *)(tc->name ? tc->name : ""), 0, NULL, NULL, 0, 0};
                name.len = strlen(name.str);
                char *py_name = llm_json_dumps(&name, 1), *py_args = llm_json_dumps(&args, 1);
                llm_json_free(&args);
                llm_chat_grow_put(&c, j ? ", {\"name\": " : "{\"name\": ");
                llm_chat_grow_put(&c, py_name ? py_name : "\"\"");
                llm_chat_grow_put(&c, ", \"arguments\": "); llm_chat_grow_put(&c, py_args ? py_args : "{}");
                llm_chat_grow_put(&c, "}");
                free(py_name); free(py_args);
            }
            llm_chat_grow_put(&c, "]}");
            m[k].content = t[k] = llm_chat_text_dup(&c);
            ok = ok && t[k];
        } else if (role == LLM_ROLE_TOOL) {
            llm_json content = {LLM_JSON_STRING, 0, (char *)(msgs[i].content ? msgs[i].content : ""), 0, NULL,
                                NULL, 0, 0};
            content.len = strlen(content.str);
            char *py = llm_json_dumps(&content, 1);
            llm_chat_text c = {NULL, 0, 0};
            llm_chat_grow_put(&c, "{\"tool_response\": "); llm_chat_grow_put(&c, py ? py : "\"\"");
            llm_chat_grow_put(&c, "}");
            free(py);
            m[k].role = "user"; m[k].content = t[k] = llm_chat_text_dup(&c);
            ok = t[k] != NULL;
        }
        m[k].tool_calls = NULL; m[k].n_tool_calls = 0;
    }
    if (!ok) {
        for (int i = 0; t && i <= n; i++) free(t[i]);
        free(t); free(m);
        return -1;
    }
    *out = m; *texts = t;
    return k;
}

/* ---- A reply read back: its thinking, its answer, its calls ------------------------------------------- */
/* Where a JSON value that begins at s[i] ends: 1 and *end past it; 0 when the text ends first; -1 when it is
 * not JSON there. Only the nesting and the strings are followed (a grammar wrote it). */
static int llm_json_span(const char *s, size_t n, size_t i, size_t *end) {
    int depth = 0;
    while (i < n && llm_is_space(s[i])) i++;
    if (i >= n) return 0;
    if (!strchr("{[\"-0123456789tfn", s[i])) return -1;
    for (; i < n; i++) {
        char ch = s[i];
        if (ch == '"') {
            for (i++; i < n && s[i] != '"'; i++) if (s[i] == '\\') i++;
            if (i >= n) return 0;
        } else if (ch == '{' || ch == '[') depth++;
        else if (ch == '}' || ch == ']') { if (--depth < 0) return -1; }
        else if (depth == 0 && (ch == ',' || llm_is_space(ch))) break;
        if (depth == 0 && (ch == '"' || ch == '}' || ch == ']')) { i++; break; }
    }
    if (depth > 0 || i > n || (i == n && depth == 0 && !strchr("\"}]", s[i - 1]))) {
        if (depth > 0 || i >= n) return 0; /* a number or a word may go on */
    }
    *end = i;
    return 1;
}

/* A JSON string's text, decoded as far as it is whole (an escape cut short waits); 1 when it is closed */
static int llm_json_string_prefix(const char *s, size_t n, size_t i, char **out /* stb_ds */, size_t *end) {
    for (i++; i < n; i++) {
        if (s[i] == '"') { *end = i + 1; return 1; }
        if (s[i] != '\\') { arrput(*out, s[i]); continue; }
        if (i + 1 >= n) break;
        char e = s[i + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) { arrput(*out, "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"]); i++; continue; }
        if (i + 6 > n) break;
        unsigned cp = (unsigned)strtoul((char[5]){s[i + 2], s[i + 3], s[i + 4], s[i + 5], 0}, NULL, 16);
        if (cp >= 0xd800 && cp <= 0xdbff) { /* a high surrogate: with its low half, or alone (U+FFFD) */
            if (i + 12 > n) break;
            char low[5] = {s[i + 8], s[i + 9], s[i + 10], s[i + 11], 0};
            unsigned lo = s[i + 6] == '\\' && s[i + 7] == 'u' ? (unsigned)strtoul(low, NULL, 16) : 0;
            if (lo >= 0xdc00 && lo <= 0xdfff) { cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                                                i += 6; }
            else cp = 0xfffd;
        } else if ((cp >= 0xdc00 && cp <= 0xdfff) || cp == 0) { /* a lone low half; NUL would end the text */
            cp = 0xfffd;
        }
        char u[4];
        int k = llm_utf8_encode(cp, u);
        memcpy(arraddnptr(*out, k), u, (size_t)k);
        i += 5;
    }
    *end = i;
    return 0;
}

/* How much of the end of s[0..n) may be the start of marker (held back while a reply is being written) */
static size_t llm_marker_tail(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--) if (!memcmp(s + n - k, marker, k)) return k;
    return 0;
}

static char *llm_strndup(const char *s, size_t n) {
    char *d = (char *)malloc(n + 1);
    if (d) { memcpy(d, s, n); d[n] = 0; }
    return d;
}

/* A call read from a reply: its name and the first n bytes of args (a NULL name or arguments: out of
 * memory) */
static void llm_reply_add_call(llm_chat_reply *r, const char *name, const char *args, size_t n) {
    llm_chat_tool_call *calls = (llm_chat_tool_call *)realloc(r->calls,
                                                              (size_t)(r->n_calls + 1) * sizeof *calls);
    if (!calls) return;
    r->calls = calls;
    calls[r->n_calls].id = NULL;
    calls[r->n_calls].name = strdup(name);
    calls[r->n_calls++].arguments = llm_strndup(args, n);
}

/* One call's object, {"name": "...", "arguments": {...}} at s[i]: its name and arguments into the reply.
 * Returns 1 when the object is whole (*end past it), 0 when it is cut short (a call is added once its name
 * is whole, with the arguments so far), -1 when it is not a call. */
static int llm_reply_call(llm_chat_reply *r, const char *s, size_t n, size_t i, size_t *end) {
    while (i < n && llm_is_space(s[i])) i++;
    if (i >= n) return 0;
    if (s[i] != '{') return -1;
    char *name = NULL; /* stb_ds */
    int have_name = 0, added = 0;
    for (i++;;) {
        while (i < n && (llm_is_space(s[i]) || s[i] == ',')) i++;
        if (i >= n) break;
        if (s[i] == '}') {
            *end = i + 1;
            if (!added && have_name) { /* a call without arguments */
                arrput(name, 0);
                llm_reply_add_call(r, name, "{}", 2);
            }
            arrfree(name);
            return have_name ? 1 : -1;
        }
        if (s[i] != '"') { arrfree(name); return -1; }
        char *key = NULL;
        size_t after;
        int closed = llm_json_string_prefix(s, n, i, &key, &after);
        arrput(key, 0);
        i = after;
        while (closed && i < n && (llm_is_space(s[i]) || s[i] == ':')) i++;
        if (!closed || i >= n) { arrfree(key); break; }
        if (!strcmp(key, "name") && s[i] == '"') {
            arrsetlen(name, 0);
            have_name = llm_json_string_prefix(s, n, i, &name, &after);
            i = after;
            if (!have_name) { arrfree(key); break; }
        } else if (!strcmp(key, "arguments") || !strcmp(key, "parameters")) {
            size_t args_end;
            int whole = llm_json_span(s, n, i, &args_end);
            if (whole < 0) { arrfree(key); arrfree(name); return -1; }
            if (have_name && !added) {
                arrput(name, 0);
                while (i < n && llm_is_space(s[i])) i++;
                llm_reply_add_call(r, name, s + i, whole ? args_end - i : n - i);
                added = 1;
                r->in_call = !whole;
            }
            if (!whole) { arrfree(key); break; }
            i = args_end;
        } else { /* another key (an id): skipped */
            size_t e;
            if (llm_json_span(s, n, i, &e) != 1) { arrfree(key); break; }
            i = e;
        }
        arrfree(key);
    }
    arrfree(name);
    return 0;
}

static void llm_bytes_put(char **b, const char *s, size_t n) { /* appends n bytes to an stb_ds array */
    if (n) memcpy(arraddnptr(*b, n), s, n);
}

/* gpt-oss: the reply is harmony messages, each a header (<|channel|>NAME, a recipient to=functions.NAME, a
 * content type <|constrain|>json) then <|message|> and its text, up to <|end|> (and <|start|>assistant before
 * the next header) or the end of the turn. analysis is the thinking; commentary to=functions.X a call of X;
 * final, and commentary to no one, the answer. A text that is not such messages is the answer as it is. */
static int llm_harmony_parse_reply(const char *s, size_t n, int tools, int partial, llm_chat_reply *r) {
    char *reasoning = NULL, *content = NULL; /* stb_ds */
    int thought = 0;
    size_t i = 0;
    while (i < n) {
        const char *msg = llm_find(s + i, n - i, "<|message|>");
        if (!msg) { /* a header not finished yet; or, at the end, no message at all */
            if (!partial && !llm_find(s + i, n - i, "<|channel|>")) llm_bytes_put(&content, s + i, n - i);
            break;
        }
        const char *head = s + i, *body = msg + 11, *end = NULL;
        size_t head_len = (size_t)(msg - head), left = n - (size_t)(body - s);
        static const char *const ends[] = {"<|end|>", "<|start|>", "<|call|>", "<|return|>"};
        for (int k = 0; k < 4; k++) {
            const char *e = llm_find(body, left, ends[k]);
            if (e && (!end || e < end)) end = e;
        }
        size_t body_len = end ? (size_t)(end - body) : left;
        if (!end && partial) { /* what may yet be a marker is held back */
            size_t tail = 0;
            for (int k = 0; k < 4; k++) {
                size_t t = llm_marker_tail(body, left, ends[k]);
                if (t > tail) tail = t;
            }
            body_len -= tail;
        }
        const char *channel = llm_find(head, head_len, "<|channel|>"), *to = llm_find(head, head_len, "to=");
        if (to && tools && (size_t)(head + head_len - to) > 13 && !memcmp(to, "to=functions.", 13)) {
            const char *name = to + 13, *name_end = name;
            while (name_end < head + head_len && *name_end != ' ' && *name_end != '<') name_end++;
            char *nm = llm_strndup(name, (size_t)(name_end - name));
            size_t a = 0;
            while (a < body_len && llm_is_space(body[a])) a++;
            if (nm) llm_reply_add_call(r, nm, body + a, body_len - a);
            free(nm);
            r->in_call = partial && !end; /* (whole, the turn ended at <|call|>) */
        } else if (channel && (size_t)(head + head_len - channel) >= 19 &&
                   !memcmp(channel + 11, "analysis", 8)) {
            if (thought++) llm_bytes_put(&reasoning, "\n", 1);
            llm_bytes_put(&reasoning, body, body_len);
        } else llm_bytes_put(&content, body, body_len);
        if (!end) break;
        i = (size_t)(end - s);
        if (!memcmp(end, "<|end|>", 7)) i += 7;
        if (n - i >= 9 && !memcmp(s + i, "<|start|>", 9)) i += 9;
        else if (memcmp(end, "<|end|>", 7)) break; /* the end of the turn */
    }
    arrput(content, 0);
    r->content = strdup(content);
    if (thought) { arrput(reasoning, 0); r->reasoning = strdup(reasoning); }
    arrfree(content); arrfree(reasoning);
    return r->content && (!thought || r->reasoning) ? 0 : -1;
}

int llm_chat_parse_reply(const llm_chat_template *ct, const char *s, size_t n, int think, int tools,
                         int partial, llm_chat_reply *r) {
    memset(r, 0, sizeof *r);
    if (ct->family == LLM_CHAT_GPT_OSS && think) return llm_harmony_parse_reply(s, n, tools, partial, r);
    size_t i = 0;
    /* the thinking: from <think> (or the start, when the prompt opened the block) to </think> */
    if (think && ct->thinks) {
        size_t a = 0;
        while (a < n && llm_is_space(s[a])) a++;
        int opened = n - a >= 7 && !memcmp(s + a, "<think>", 7);
        if (ct->opens_think && !opened) { opened = 1; a = 0; } /* opened by the prompt: the reply is inside */
        else if (opened) a += 7;
        if (!opened && partial && llm_marker_tail(s + a, n - a, "<think>") == n - a) { /* maybe <think> yet */
            r->content = strdup("");
            return r->content ? 0 : -1;
        }
        if (opened) {
            const char *close = NULL;
            for (size_t k = a; k + 8 <= n && !close; k++) if (!memcmp(s + k, "</think>", 8)) close = s + k;
            size_t b = close ? (size_t)(close - s) : n;
            if (!close && partial) b -= llm_marker_tail(s + a, n - a, "</think>");
            while (a < b && s[a] == '\n') a++;
            size_t keep = b; /* trailing newlines: dropped at </think>, held back before it */
            while (keep > a && s[keep - 1] == '\n') keep--;
            if (!(r->reasoning = llm_strndup(s + a, keep - a))) return -1;
            if (!close) { r->content = strdup(""); return r->content ? 0 : -1; }
            i = b + 8;
            while (i < n && llm_is_space(s[i])) i++;
        }
    }
    char *content = NULL; /* stb_ds */
    if (tools && ct->tool_format == LLM_TOOLS_GENERIC) {
        /* {"response": "..."} or {"tool_calls": [...]} */
        size_t k = i;
        while (k < n && llm_is_space(s[k])) k++;
        if (k < n && s[k] == '{') {
            k++;
            while (k < n && llm_is_space(s[k])) k++;
            char *key = NULL;
            size_t after = k;
            int closed = k < n && s[k] == '"' && llm_json_string_prefix(s, n, k, &key, &after);
            arrput(key, 0);
            k = after;
            while (closed && k < n && (llm_is_space(s[k]) || s[k] == ':')) k++;
            if (closed && !strcmp(key, "response") && k < n && s[k] == '"') {
                llm_json_string_prefix(s, n, k, &content, &after);
            } else if (closed && !strcmp(key, "tool_calls") && k < n && s[k] == '[') {
                for (k++;;) {
                    while (k < n && (llm_is_space(s[k]) || s[k] == ',')) k++;
                    if (k >= n || s[k] == ']') break;
                    size_t e;
                    if (llm_reply_call(r, s, n, k, &e) != 1) break;
                    k = e;
                }
            } else if (!partial || (closed && k < n)) { /* not the generic reply: all of it is the answer */
                llm_bytes_put(&content, s + i, n - i);
            }
            arrfree(key);
        } else if (!partial || k < n) llm_bytes_put(&content, s + i, n - i);
    } else if (tools && ct->tool_format == LLM_TOOLS_LLAMA3) {
        /* Llama 3.1: a reply that begins with "{" is a call */
        size_t k = i, e;
        while (k < n && llm_is_space(s[k])) k++;
        if (k < n && s[k] == '{' && llm_reply_call(r, s, n, k, &e) >= 0) {
            if (!r->n_calls && !partial) llm_bytes_put(&content, s + i, n - i); /* no call after all */
        } else if (!partial || k < n) llm_bytes_put(&content, s + i, n - i);
    } else if (tools && (ct->tool_format == LLM_TOOLS_MISTRAL || ct->tool_format == LLM_TOOLS_MISTRAL_ARGS)) {
        /* Mistral: text, then the calls after [TOOL_CALLS]: v3 a list [{...}, ...] (the ids the model may
         * write are not read: llm serve gives each call its own); v11 name[CALL_ID]id[ARGS]{...} one after
         * another, each read once its name is whole (at [ARGS]) */
        static const char marker[] = "[TOOL_CALLS]";
        const char *at = NULL;
        for (size_t k = i; k + 12 <= n && !at; k++) if (!memcmp(s + k, marker, 12)) at = s + k;
        size_t text_end = at ? (size_t)(at - s) : n;
        if (!at && partial) text_end -= llm_marker_tail(s + i, n - i, marker);
        llm_bytes_put(&content, s + i, text_end - i);
        int v11 = ct->tool_format == LLM_TOOLS_MISTRAL_ARGS;
        for (size_t k = text_end; at && v11 && n - k >= 12 && !memcmp(s + k, marker, 12);) {
            size_t name = k + 12, a = name, e;
            while (a < n && s[a] != '[') a++;
            size_t name_end = a;
            if (n - a >= 9 && !memcmp(s + a, "[CALL_ID]", 9)) for (a += 9; a < n && s[a] != '[';) a++;
            if (n - a < 6 || memcmp(s + a, "[ARGS]", 6)) break;
            for (a += 6; a < n && llm_is_space(s[a]);) a++;
            int whole = llm_json_span(s, n, a, &e);
            if (whole < 0) break;
            char *nm = llm_strndup(s + name, name_end - name);
            if (nm) llm_reply_add_call(r, nm, s + a, whole ? e - a : n - a);
            free(nm);
            r->in_call = !whole;
            if (!whole) break;
            for (k = e; k < n && llm_is_space(s[k]);) k++;
        }
        size_t k = at && !v11 ? (size_t)(at - s) + 12 : n, e;
        while (k < n && llm_is_space(s[k])) k++;
        if (k < n && s[k] == '[') {
            for (k++;;) {
                while (k < n && (llm_is_space(s[k]) || s[k] == ',')) k++;
                if (k >= n || s[k] == ']' || llm_reply_call(r, s, n, k, &e) != 1) break;
                k = e;
            }
        }
    } else if (tools) {
        /* Hermes: text, then <tool_call>{...}</tool_call> one after another */
        static const char open[] = "<tool_call>", close[] = "</tool_call>";
        while (i < n) {
            const char *at = NULL;
            for (size_t k = i; k + 11 <= n && !at; k++) if (!memcmp(s + k, open, 11)) at = s + k;
            size_t text_end = at ? (size_t)(at - s) : n;
            if (!at && partial) text_end -= llm_marker_tail(s + i, n - i, open);
            if (!r->n_calls) llm_bytes_put(&content, s + i, text_end - i);
            if (!at) break;
            size_t e;
            int rc = llm_reply_call(r, s, n, (size_t)(at - s) + 11, &e);
            if (rc <= 0) break;
            while (e < n && llm_is_space(s[e])) e++;
            if (n - e >= 12 && !memcmp(s + e, close, 12)) e += 12;
            while (e < n && llm_is_space(s[e])) e++;
            i = e;
        }
    } else {
        llm_bytes_put(&content, s + i, n - i);
    }
    /* Hermes puts a newline between the text and the first call: not part of the answer (and so, while the
     * reply is being written, white space at the end is held back: a call may follow) */
    while ((r->n_calls || (tools && partial)) && arrlen(content) &&
           llm_is_space(content[arrlen(content) - 1]))
        arrsetlen(content, arrlen(content) - 1);
    r->content = llm_strndup(content ? content : "", (size_t)arrlen(content));
    arrfree(content);
    for (int k = 0; k < r->n_calls; k++) if (!r->calls[k].name || !r->calls[k].arguments) return -1;
    return r->content ? 0 : -1;
}

void llm_chat_reply_free(llm_chat_reply *r) {
    for (int k = 0; k < r->n_calls; k++) {
        free((char *)r->calls[k].name);
        free((char *)r->calls[k].arguments);
    }
    free(r->calls); free(r->reasoning); free(r->content);
    memset(r, 0, sizeof *r);
}

/* ---- The grammar of a call in each family's syntax (over the grammar layer) -------------------------- */
#ifndef LLM_NO_GRAMMAR
/* GBNF rules for "any text, up to and with `until`": a state per character of `until` matched so far, as a
 * string-search automaton (KMP) steps; at the end of `until` the text goes on with rule `then` (NULL: it
 * ends). can_end: the text may end in any state before that. Rules are named prefix-0, prefix-1, ... */
static void llm_gr_until(char **out, const char *prefix, const char *until, const char *then, int can_end) {
    int n = (int)strlen(until);
    for (int j = 0; j < n; j++) {
        llm_str_printf(out, "%s-%d ::= ", prefix, j);
        if (can_end) llm_str_puts(out, "\"\" | ");
        /* on the next character of until: one state on (or the rest); on any other: where the automaton
         * falls back to, which for a character c is the longest prefix of until that ends the text with c */
        arrput(*out, '"'); llm_re_gbnf_char(out, (unsigned char)until[j], 0); arrput(*out, '"');
        if (j + 1 < n) llm_str_printf(out, " %s-%d", prefix, j + 1);
        else if (then) llm_str_printf(out, " %s", then);
        char seen[256] = {0};
        seen[(unsigned char)until[j]] = 1;
        for (int k = j; k >= 0; k--) { /* characters that fall back to a state above 0 */
            unsigned char ch = (unsigned char)until[k];
            if (seen[ch]) continue;
            /* the text is until[0..j) + ch; its longest suffix that is a prefix of until */
            int best = 0;
            for (int len = j + 1 < n ? j + 1 : n; len > 0 && !best; len--) {
                if (len > j + 1) continue;
                if ((unsigned char)until[len - 1] != ch) continue;
                if (!memcmp(until, until + j + 1 - len, (size_t)len - 1)) best = len;
            }
            if (!best) continue;
            seen[ch] = 1;
            llm_str_puts(out, " | \""); llm_re_gbnf_char(out, ch, 0);
            llm_str_printf(out, "\" %s-%d", prefix, best);
        }
        llm_str_puts(out, " | [^");
        for (int ch = 1; ch < 256; ch++) if (seen[ch]) llm_re_gbnf_char(out, (uint32_t)ch, 1);
        llm_str_printf(out, "] %s-0\n", prefix);
    }
}

/* The schema of one call in the generic and Hermes syntax, {"name": NAME, "arguments": PARAMETERS}, as JSON
 * text appended to *out; -1 (err) for a tool that is not a function with a name. The parameters are a $ref
 * to the document "llm:i" (tools[i]'s parameters themselves, see llm_js_resolve), so that their own $refs
 * ("#/$defs/...", as Pydantic writes them) mean what they mean in a response_format schema. */
static int llm_tool_call_schema(char **out, const llm_json *tool, int i, const char *args_key, char *err) {
    const llm_json *type = llm_json_get(tool, "type"), *fn = llm_json_get(tool, "function");
    const llm_json *name = llm_json_get(fn, "name"), *params = llm_json_get(fn, "parameters");
    if (!type || type->type != LLM_JSON_STRING || strcmp(type->str, "function") || !fn ||
        fn->type != LLM_JSON_OBJECT)
        return llm_fail(err, "tools[%d] must be {\"type\": \"function\", \"function\": {...}}", i);
    if (!name || name->type != LLM_JSON_STRING || !name->len)
        return llm_fail(err, "tools[%d].function.name must be a non-empty string", i);
    if (params && params->type != LLM_JSON_OBJECT && params->type != LLM_JSON_NULL)
        return llm_fail(err, "tools[%d].function.parameters must be a JSON Schema object", i);
    char *name_json = llm_json_dumps(name, 0), params_json[48];
    snprintf(params_json, sizeof params_json, "{\"$ref\":\"llm:%d#\"}", i);
    /* no parameters: OpenAI's "empty parameter list" */
    llm_str_printf(out, "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":%s},\"%s\":%s},"
                  "\"required\":[\"name\",\"%s\"],\"additionalProperties\":false}",
                  name_json ? name_json : "\"\"",
                  args_key, params && params->type == LLM_JSON_OBJECT ? params_json :
                  "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}", args_key);
    /* the parameters alone through the converter: a keyword it refuses is named where the client wrote it */
    char *alone = params && params->type == LLM_JSON_OBJECT ? llm_json_schema_to_grammar(params, err) : NULL;
    if (params && params->type == LLM_JSON_OBJECT && !alone) {
        char why[LLM_ERR_LEN];
        snprintf(why, sizeof why, "%s", err);
        free(name_json);
        return llm_fail(err, "tools[%d].function.parameters: %s", i, why);
    }
    free(alone);
    free(name_json);
    return 0;
}

/* GBNF of a schema given as JSON text, its start rule renamed from root to `rule` (docs: the tools'
 * parameters, by index) */
static char *llm_tool_schema_rules(const char *schema, size_t len, const char *rule,
                                   const llm_json *const *docs, int n_docs, char *err) {
    llm_json v;
    if (llm_json_parse(schema, len, &v, err) != 0) return NULL;
    char *g = llm_js_grammar(&v, docs, n_docs, err);
    llm_json_free(&v);
    if (!g) return NULL;
    char *renamed = (char *)malloc(strlen(g) + strlen(rule) + 1);
    if (renamed) sprintf(renamed, "%s%s", rule, g + 4); /* "root ::= ..." -> "rule ::= ..." */
    free(g);
    if (!renamed) llm_fail(err, "out of memory");
    return renamed;
}

char *llm_chat_tool_grammar(const llm_chat_template *ct, const char *tools, int choice, const char *name,
                            int parallel, char *err) {
    llm_json tl;
    char buf[LLM_ERR_LEN];
    if (!err) err = buf;
    if (!tools || llm_json_parse(tools, strlen(tools), &tl, err) != 0) {
        if (!tools) llm_fail(err, "no tools");
        return NULL;
    }
    char *any = NULL, *out = NULL, *rules = NULL; /* stb_ds: the calls' anyOf, the grammar */
    int n = 0, rc = tl.type == LLM_JSON_ARRAY && tl.n > 0 ? 0 :
        llm_fail(err, "tools must be a non-empty list");
    const llm_json **docs = rc == 0 ? (const llm_json **)calloc((size_t)tl.n, sizeof *docs) : NULL;
    if (rc == 0 && !docs) rc = llm_fail(err, "out of memory");
    for (int i = 0; rc == 0 && i < tl.n; i++) /* what the calls' $refs "llm:i#" point to */
        docs[i] = llm_json_get(llm_json_get(&tl.items[i], "function"), "parameters");
    for (int i = 0; rc == 0 && i < tl.n; i++) {
        const llm_json *nm = llm_json_get(llm_json_get(&tl.items[i], "function"), "name");
        if (choice == LLM_TOOL_NAMED && (!nm || nm->type != LLM_JSON_STRING || strcmp(nm->str, name)))
            continue;
        llm_str_puts(&any, n++ ? "," : "{\"anyOf\":[");
        rc = llm_tool_call_schema(&any, &tl.items[i], i, ct->tool_format == LLM_TOOLS_LLAMA3 ? "parameters" :
                                  "arguments", err);
    }
    if (rc == 0 && !n) rc = llm_fail(err, "tool_choice names \"%.64s\", which is none of the tools", name);
    llm_str_puts(&any, "]}");
    arrput(any, 0);
    if (rc == 0 && ct->tool_format == LLM_TOOLS_HERMES) {
        /* <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, one after another */
        rules = llm_tool_schema_rules(any, strlen(any), "tool-json", docs, tl.n, err);
        const char *more = parallel ? " ( \"\\n\"? \"<tool_call>\" call-rest )?" : "";
        int think = ct->thinks && ct->enable_thinking;
        if (choice == LLM_TOOL_AUTO) llm_str_puts(&out, "root ::= text-0\n");
        else if (think)
            llm_str_puts(&out, "root ::= ( \"<think>\" think-0 )? [\\n]{0,2} \"<tool_call>\" call-rest\n");
        else llm_str_puts(&out, "root ::= \"<tool_call>\" call-rest\n");
        llm_str_printf(&out, "call-rest ::= \"\\n\"? tool-json \"\\n\"? \"</tool_call>\"%s\n", more);
        if (choice == LLM_TOOL_AUTO) llm_gr_until(&out, "text", "<tool_call>", "call-rest", 1);
        else if (think) llm_gr_until(&out, "think", "</think>", NULL, 0);
    } else if (rc == 0 && ct->tool_format == LLM_TOOLS_MISTRAL) {
        /* Mistral v3: [TOOL_CALLS][{"name": ..., "arguments": ...}, ...] (a space before "[" in the
         * SentencePiece models' history, none in Nemo's: either); auto: text until [TOOL_CALLS] */
        rules = llm_tool_schema_rules(any, strlen(any), "tool-json", docs, tl.n, err);
        llm_str_puts(&out, choice == LLM_TOOL_AUTO ? "root ::= text-0\n" :
                    "root ::= \"[TOOL_CALLS]\" call-rest\n");
        llm_str_printf(&out, "call-rest ::= \" \"? \"[\" tool-json%s \"]\"\n",
                      parallel ? " ( \",\" \" \"? tool-json )*" : "");
        if (choice == LLM_TOOL_AUTO) llm_gr_until(&out, "text", "[TOOL_CALLS]", "call-rest", 1);
    } else if (rc == 0 && (ct->tool_format == LLM_TOOLS_MISTRAL_ARGS ||
                           ct->tool_format == LLM_TOOLS_HARMONY)) {
        /* Mistral v11: [TOOL_CALLS]name[ARGS]{...} (and [CALL_ID] and 9 letters and digits before [ARGS], as
         * the history writes them), one call after another; gpt-oss: after its thinking, one message
         * <|channel|>commentary to=functions.name <|constrain|>json<|message|>{...} (the header's parts in
         * either order its template or the model writes them). The name is outside the JSON, so each
         * function's arguments are a rule of their own. */
        int harmony = ct->tool_format == LLM_TOOLS_HARMONY;
        const llm_json **schemas = (const llm_json **)calloc((size_t)tl.n, sizeof *schemas);
        char (*names)[64] = (char (*)[64])calloc((size_t)tl.n, 64);
        llm_json none;
        if (!schemas || !names) rc = llm_fail(err, "out of memory");
        static const char no_params[] = "{\"type\":\"object\",\"properties\":{},"
                                        "\"additionalProperties\":false}";
        if (rc == 0) rc = llm_json_parse(no_params, sizeof no_params - 1, &none, err);
        for (int i = 0; rc == 0 && i < tl.n; i++) {
            const llm_json *params = llm_json_get(llm_json_get(&tl.items[i], "function"), "parameters");
            schemas[i] = params && params->type == LLM_JSON_OBJECT ? params : &none;
        }
        if (rc == 0) rules = llm_js_rules(schemas, tl.n, NULL, 0, names, err);
        if (rc == 0) llm_json_free(&none);
        if (harmony) {
            llm_str_puts(&out, choice == LLM_TOOL_AUTO ? "root ::= text-0\n" :
                         "root ::= ( \"<|channel|>analysis"
                        "<|message|>\" think-0 \"<|start|>assistant\" )? "
                        "\"<|channel|>commentary to=functions.\" "
                        "call-rest\n");
            llm_str_puts(&out, "call-rest ::= call\ncall ::= ");
        } else {
            llm_str_puts(&out, choice == LLM_TOOL_AUTO ? "root ::= text-0\n" :
                        "root ::= \"[TOOL_CALLS]\" call-rest\n");
            llm_str_printf(&out, "call-rest ::= call%s\ncall ::= ",
                           parallel ? " ( \"[TOOL_CALLS]\" call )*" : "");
        }
        for (int i = 0, k = 0; rules && i < tl.n; i++) {
            const llm_json *nm = llm_json_get(llm_json_get(&tl.items[i], "function"), "name");
            if (choice == LLM_TOOL_NAMED && strcmp(nm->str, name)) continue;
            llm_str_puts(&out, k++ ? " | \"" : "\"");
            for (size_t b = 0; b < nm->len;) { /* the name's characters */
                int len = llm_utf8_check((const unsigned char *)nm->str + b, nm->len - b);
                if (len <= 0) { rc = llm_fail(err, "tools[%d].function.name is not UTF-8", i); break; }
                llm_re_gbnf_char(&out, llm_utf8_decode((const unsigned char *)nm->str + b, len), 0);
                b += (size_t)len;
            }
            llm_str_printf(&out, harmony ? "\" header %s" : "\" call-id? \"[ARGS]\" %s", names[i]);
        }
        if (harmony) {
            llm_str_puts(&out, "\nheader ::= \" \"? ( \"<|channel|>commentary\" \" \"? )? \"<|constrain|>\"? "
                        "\"json\"? \"<|message|>\"\n");
            if (choice == LLM_TOOL_AUTO) llm_gr_until(&out, "text", "to=functions.", "call-rest", 1);
            else llm_gr_until(&out, "think", "<|end|>", NULL, 0);
        } else {
            llm_str_puts(&out, "\ncall-id ::= \"[CALL_ID]\" [a-zA-Z0-9]{9}\n");
            if (choice == LLM_TOOL_AUTO) llm_gr_until(&out, "text", "[TOOL_CALLS]", "call-rest", 1);
        }
        free(schemas); free(names);
    } else if (rc == 0 && ct->tool_format == LLM_TOOLS_LLAMA3) {
        /* Llama 3.1: one call, {"name": ..., "parameters": ...}, as the whole reply; auto: or a reply that
         * does not begin with "{" */
        rules = llm_tool_schema_rules(any, strlen(any), "tool-json", docs, tl.n, err);
        llm_str_puts(&out, choice == LLM_TOOL_AUTO ? "root ::= tool-json | ( [^{] [^\\x00]* )?\n" :
                    "root ::= tool-json\n");
    } else if (rc == 0) {
        /* generic: the whole reply is {"tool_calls": [...]} or, unless required, {"response": "..."} */
        char *schema = NULL;
        llm_str_puts(&schema, choice == LLM_TOOL_AUTO ? "{\"anyOf\":[" : "");
        llm_str_printf(&schema, "{\"type\":\"object\",\"properties\":{\"tool_calls\":{\"type\":\"array\","
                      "\"items\":%s,\"minItems\":1%s}},\"required\":[\"tool_calls\"],"
                      "\"additionalProperties\":false}",
                      any, parallel ? "" : ",\"maxItems\":1");
        if (choice == LLM_TOOL_AUTO)
            llm_str_puts(&schema, ",{\"type\":\"object\",\"properties\":{\"response\":{\"type\":\"string\"}},"
                        "\"required\":[\"response\"],\"additionalProperties\":false}]}");
        rules = llm_tool_schema_rules(schema, (size_t)arrlen(schema), "root", docs, tl.n, err);
        arrfree(schema);
    }
    char *text = NULL;
    if (rc == 0 && rules) {
        llm_str_puts(&out, rules);
        arrput(out, 0);
        if (!(text = strdup(out))) llm_fail(err, "out of memory");
    }
    free(rules); arrfree(any); arrfree(out); free(docs);
    llm_json_free(&tl);
    return text;
}

/* GBNF with its rule `from` named `to`: each whole rule name outside literals, classes and comments */
static char *llm_gbnf_rename(const char *g, const char *from, const char *to) {
    char *out = NULL; /* stb_ds */
    size_t n_from = strlen(from);
    for (const char *p = g; *p;) {
        if (*p == '"' || *p == '[') { /* a literal or a class, escapes and all */
            char close = *p == '"' ? '"' : ']';
            const char *q = p + 1;
            while (*q && *q != close) q += q[0] == '\\' && q[1] ? 2 : 1;
            if (*q) q++;
            llm_bytes_put(&out, p, (size_t)(q - p));
            p = q;
        } else if (*p == '#') {
            const char *q = p;
            while (*q && *q != '\n') q++;
            llm_bytes_put(&out, p, (size_t)(q - p));
            p = q;
        } else if (llm_gr_is_word((unsigned char)*p)) {
            const char *q = p;
            while (llm_gr_is_word((unsigned char)*q)) q++;
            int same = (size_t)(q - p) == n_from && !memcmp(p, from, n_from);
            llm_bytes_put(&out, same ? to : p, same ? strlen(to) : (size_t)(q - p));
            p = q;
        } else llm_bytes_put(&out, p++, 1);
    }
    arrput(out, 0);
    char *text = strdup(out);
    arrfree(out);
    return text;
}

char *llm_chat_answer_grammar(const llm_chat_template *ct, const char *gbnf, char *err) {
    if (ct->family != LLM_CHAT_GPT_OSS) {
        char *copy = strdup(gbnf);
        if (!copy) llm_fail(err, "out of memory");
        return copy;
    }
    /* its rules renamed out of the way of the two added here: root and the thinking's */
    char *answer = llm_gbnf_rename(gbnf, "root", "harmony-answer"), *out = NULL; /* stb_ds */
    if (!answer) { llm_fail(err, "out of memory"); return NULL; }
    llm_str_puts(&out, "root ::= ( \"<|channel|>analysis<|message|>\" harmony-think-0 "
                       "\"<|start|>assistant\" )? "
                "\"<|channel|>final<|message|>\" harmony-answer\n");
    llm_gr_until(&out, "harmony-think", "<|end|>", NULL, 0);
    llm_str_puts(&out, answer);
    arrput(out, 0);
    char *text = strdup(out);
    arrfree(out); free(answer);
    if (!text) llm_fail(err, "out of memory");
    return text;
}

#else /* LLM_NO_GRAMMAR: no grammar, no call held to one */
char *llm_chat_tool_grammar(const llm_chat_template *ct, const char *tools, int choice, const char *name,
                            int parallel, char *err) {
    (void)ct; (void)tools; (void)choice; (void)name; (void)parallel;
    llm_fail(err, "tool calls under a grammar: this build has no grammars (LLM_NO_GRAMMAR)");
    return NULL;
}
char *llm_chat_answer_grammar(const llm_chat_template *ct, const char *gbnf, char *err) {
    (void)ct; (void)gbnf;
    llm_fail(err, "this build has no grammars (LLM_NO_GRAMMAR)");
    return NULL;
}
#endif /* LLM_NO_GRAMMAR */

/* ===========================================================================================================
 * 14. SIMD kernels (a layer: LLM_NO_SIMD leaves it out)
 * The Forward section's kernels again, in x86 vector instructions, for a build whose compiler was told that
 * its target has AVX2, FMA and F16C (-march=native on Intel CPUs since Haswell, AMD's since Zen): the
 * preamble then sets LLM_AVX2 (and LLM_AVX512F, _VL, _BW and _VNNI where the target has those too),
 * section 7 sets LLM_CPU_SIMD, and this section is compiled. The kernels are chosen when the file is
 * compiled, not at run time: a binary built for AVX-512 needs a CPU that has it (the CPU backend refuses to
 * start on one without, saying so: llm_cpu_missing_feature); make llm-dist compiles this file once per
 * variant and picks one when the program starts (llm_cpu_variant, section 7). AMX alone is asked for at run
 * time, where the build has it (llm_amx_usable: the CPU and Linux). What is here, in the order the core
 * calls it:
 *   f16 and bf16 values  llm_half8 (8 values as f32), llm_half_row_avx2 (section 1's rows of them)
 *   f32 dot products     llm_dot_n_avx2 (8 running sums a vector in one register); with AVX-512,
 *                        llm_dot_pairs (two queries' sums in one 512-bit register: a prompt's attention)
 *   quantized weights    llm_q8_quantize_avx2 (activations to blocks of 8- or 16-bit integers);
 *                        llm_q8_dot32_avx2 and llm_q8_dotk_avx2 (a weight row times 1 to 4 tokens, or 4
 *                        rows times one with AVX-512, 2 with AVX2; 32-value blocks and k-quants);
 *                        llm_tiles_copy and llm_tiles_dot (q4_0's, q4_1's, q5_0's, q5_1's, q8_0's, q4_K's,
 *                        q5_K's and q6_K's matrices with 8 rows side by side, the decode tiles the CPU
 *                        backend keeps them in: steps of up to 16 tokens);
 *                        llm_pack_rows, llm_pack_tiles (from decode tiles), llm_pack_dot and
 *                        llm_matmul_packed (a prefill: 8 rows, 16 with AVX-512 VNNI, unpacked side by side
 *                        once for every token); with AMX, llm_amx_layout and llm_pack_dot_amx (16 tokens
 *                        at a time through its tiles, the same bits)
 *   f16 and bf16 weights llm_dot_half (tiles of up to 4 rows times 3 tokens, 6 with AVX-512)
 *   the row kernels      llm_exp_avx2 (glibc's expf, bit for bit; the sampler's too), llm_max_avx2,
 *                        llm_softmax_exp_avx2, llm_swiglu_avx2, llm_f16_store_avx2 (the KV cache in f16),
 *                        llm_cpu_weighted_v and llm_weighted_rows (attention's sum of V weighted by the
 *                        softmax, from the f16 cache and from a quantized cache's converted rows)
 *   the sampler's rows   llm_sampler_weights_avx2, llm_sampler_normalize_avx2 (section 8)
 * The hook: section 7 (1 and 8 for theirs) declares each kernel (a prototype under #ifdef LLM_CPU_SIMD, or
 * LLM_AVX2: the same test) just before the plain-C function that calls it, and that function is the
 * dispatch: with SIMD it calls the kernel, without it runs its own loop (llm_dot_many, llm_q8_quantize,
 * llm_q8_dot, llm_matmul, llm_max, llm_softmax_exp, llm_swiglu, llm_cpu_kv_store, llm_cpu_attention,
 * llm_dtype_dequant_row, llm_sampler_weights, llm_sampler_normalize). A row kernel does the first values of
 * a row and returns how many it did, and the plain loop does the rest (llm_softmax_exp_avx2 does the whole
 * row). The always_inline kernels are compiled into their callers as if written there (GCC and Clang read
 * the whole file before they inline, so a body may follow its call).
 * The plain C stays the reference, and test.c holds the kernels to it: the f32 products, the pairs, the
 * f16/bf16 tiles, exp, softmax and SwiGLU bit for bit ("weight types"); the quantization byte for byte and
 * the quantized products' integer parts exactly, on blocks whose scales make every product an integer
 * ("quant dot products", "quant prefill tiles"); the whole forward pass through the model references, and
 * the fast path's logits against the exact path's ("quant fast path"). make test-core builds without this
 * section (LLM_NO_SIMD) and runs the core's tests on the plain C alone.
 * At the end, 64-bit ARM's part (LLM_NEON_DOT, with the dot product instructions): llm_q8_quantize_neon,
 * llm_q8_dot32_neon (q8_0, q4_0 to q5_1, mxfp4) and llm_q8_dotk_neon (the k-quants), shaped like their AVX2
 * twins and held to the same tests (make test-variants runs them under qemu-aarch64); every other kernel is
 * plain C there.
 * ======================================================================================================== */
#if defined(LLM_AVX2)
/* ---- f16 and bf16 values (section 1's rows, the f16/bf16 tiles below) ---------------------------------- */
/* 8 values of type f16, bf16 or f32 at at, as f32 (exact) */
static inline __attribute__((always_inline)) __m256 llm_half8(uint32_t type, const void *at) {
    if (type == LLM_F32) return _mm256_loadu_ps((const float *)at);
    __m128i h = _mm_loadu_si128((const __m128i *)at);
    return type == LLM_F16 ? _mm256_cvtph_ps(h)
                           : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
/* llm_dtype_dequant_row's f16 or bf16 row, its first n / 8 * 8 values: returns how many */
static inline __attribute__((always_inline)) int64_t llm_half_row_avx2(uint32_t type, const uint8_t *p,
                                                                       float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, llm_half8(type, p + 2 * i));
    return i;
}
/* ---- f32 dot products (llm_dot_n) ---------------------------------------------------------------------- */
/* llm_dot_n_avx2's last additions for 8 sums of a row without a tail (s = 0) at once, the same ones: per sum,
 * lanes j and j + 4, then pairs 0 + 1 and 2 + 3, each added to 0, then those two (0 + h1 differs from h1 only
 * in a zero's sign, which cannot change (0 + h0) + h1). 12 instructions for 8 sums, not 5 each (a 64-value
 * attention score's lanes took as long as its products) */
static inline __attribute__((always_inline)) __m256 llm_avx2_hsum8(const __m256 v[8]) {
    __m256 t[4], zero = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) /* [v_2k's lanes j + (j + 4) | v_2k+1's] */
        t[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31));
    __m256 u0 = _mm256_add_ps(_mm256_hadd_ps(t[0], t[1]), zero); /* [v0 h0 h1, v2 h0 h1 | v1, v3] */
    __m256 u1 = _mm256_add_ps(_mm256_hadd_ps(t[2], t[3]), zero); /* [v4, v6 | v5, v7] */
    return _mm256_permutevar8x32_ps(_mm256_hadd_ps(u0, u1), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
/* llm_dot_n in AVX2, the same roundings bit for bit: the compiler vectorizes one vector well, but 2 to 4 into
 * shuffles (a SmolLM2 prompt's attention scores, 3 query heads to a K head: 6 times slower than one) */
static inline __attribute__((always_inline)) void llm_dot_n_avx2(const float *a, const float *b,
                                                                 int64_t b_stride, int nc, int64_t n,
                                                                 float *out) {
    __m256 acc[LLM_DOT_MAX_VECTORS];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 av = _mm256_loadu_ps(a + i);
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(av, _mm256_loadu_ps(b + c * b_stride + i)));
    }
    if (nc >= 4 && i == n) { /* no tail (s = 0), 4 or more sums: their lanes added 8 sums at a time */
        for (int c0 = 0; c0 < nc; c0 += 8) {
            __m256 v[8];
            float r[8];
            for (int k = 0; k < 8; k++) v[k] = c0 + k < nc ? acc[c0 + k] : _mm256_setzero_ps();
            _mm256_storeu_ps(r, llm_avx2_hsum8(v));
            for (int k = 0; k < 8 && c0 + k < nc; k++) out[c0 + k] = r[k];
        }
        return;
    }
    for (int c = 0; c < nc; c++) {
        float s = 0;
        for (int64_t k = i; k < n; k++) s += a[k] * b[c * b_stride + k];
        /* lanes j and j + 4, then those pairs 0 + 1 and 2 + 3, added to s one after the other */
        __m128 q = _mm_add_ps(_mm256_castps256_ps128(acc[c]), _mm256_extractf128_ps(acc[c], 1));
        q = _mm_hadd_ps(q, q);
        out[c] = (s + _mm_cvtss_f32(q)) + _mm_cvtss_f32(_mm_movehdup_ps(q));
    }
}
#if defined(LLM_AVX512F)
/* llm_dot_n_avx2 (4 or more vectors, n a multiple of 8) for np pairs of vectors laid side by side 8 values
 * at a time: pair j's values 8i..8i+7 are the 16 floats at b + 2 n j + 16 i, the first vector's then the
 * second's. One 512-bit register holds both vectors' eight running sums, so that one multiply and one add
 * serve two: the same sums, lane by lane, and the same last additions (llm_avx2_hsum8), bit for bit. */
static inline __attribute__((always_inline)) void llm_dot_pairs_n(const float *a, const float *b, int np,
                                                                 int64_t n, float *out) {
    __m512 acc[LLM_DOT_MAX_VECTORS / 2];
    for (int j = 0; j < np; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m512 av = _mm512_broadcast_f32x8(_mm256_loadu_ps(a + i));
        for (int j = 0; j < np; j++)
            acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(av, _mm512_loadu_ps(b + 2 * n * j + 2 * i)));
    }
    for (int c0 = 0; c0 < 2 * np; c0 += 8) {
        __m256 v[8];
        float r[8];
        for (int k = 0; k < 8; k++) {
            int c = c0 + k;
            __m512 both = c < 2 * np ? acc[c / 2] : _mm512_setzero_ps();
            v[k] = c % 2 ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(both), 1))
                         : _mm512_castps512_ps256(both);
        }
        _mm256_storeu_ps(r, llm_avx2_hsum8(v));
        for (int k = 0; k < 8 && c0 + k < 2 * np; k++) out[c0 + k] = r[k];
    }
}
/* llm_dot_pairs_n specialized to 2 to 6 pairs */
static void llm_dot_pairs(const float *a, const float *b, int np, int64_t n, float *out) {
    switch (np) {
    case 2: llm_dot_pairs_n(a, b, 2, n, out); return;
    case 3: llm_dot_pairs_n(a, b, 3, n, out); return;
    case 4: llm_dot_pairs_n(a, b, 4, n, out); return;
    case 5: llm_dot_pairs_n(a, b, 5, n, out); return;
    case 6: llm_dot_pairs_n(a, b, 6, n, out); return;
    }
}
#endif

/* ---- Quantized weights times quantized activations (llm_q8_dot, llm_matmul) ---------------------------- */
/* AVX2 (the build was told the target: -march=native). The same products as llm_q8_dot_ref with the same
 * integer sums, on 32 values at a time: each type's stored values are unpacked into 32 bytes, which meet
 * the activations in _mm256_maddubs_epi16 (unsigned times signed bytes, pairs added) and then
 * _mm256_madd_epi16 with the sub-blocks' scales. The stored values are unsigned (q = stored - offset): the
 * offsets come back out with the activations' sums, outside the vector loop. */

static inline __m256i llm_avx2_nibbles(const uint8_t *q) { /* 16 bytes: the low nibbles, then the high */
    __m128i b = _mm_loadu_si128((const __m128i *)q);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(15));
}
static inline __m256i llm_avx2_bits(uint32_t bits, char value) { /* bit j set: byte j is value, else 0 */
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(value));
}
static inline __m256i llm_avx2_field(const uint8_t *p, int shift, char mask) { /* 32 bytes >> shift & mask */
    __m256i v = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)p), _mm_cvtsi32_si128(shift));
    return _mm256_and_si256(v, _mm256_set1_epi8(mask));
}

/* The stored values of group g (values 32g..32g+31) of a block, as llm_qblock_unpack reads them; mxfp4's
 * are its table's values plus 12 (unsigned, as the others: llm_pack_offset takes the 12 back out) */
static inline __m256i llm_avx2_group(uint32_t type, const uint8_t *p, int g) {
    uint32_t qh;
    switch (type) {
    case LLM_Q4_0: return llm_avx2_nibbles(p + 2);
    case LLM_MXFP4: {
        const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                               12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
        return _mm256_shuffle_epi8(table, llm_avx2_nibbles(p + 1));
    }
    case LLM_Q4_1: return llm_avx2_nibbles(p + 4);
    case LLM_Q5_0: memcpy(&qh, p + 2, 4);
        return _mm256_or_si256(llm_avx2_nibbles(p + 6), llm_avx2_bits(qh, 16));
    case LLM_Q5_1: memcpy(&qh, p + 4, 4);
        return _mm256_or_si256(llm_avx2_nibbles(p + 8), llm_avx2_bits(qh, 16));
    case LLM_Q2_K: return llm_avx2_field(p + 16 + g / 4 * 32, 2 * (g % 4), 3);
    case LLM_Q3_K:
        return _mm256_or_si256(llm_avx2_field(p + 32 + g / 4 * 32, 2 * (g % 4), 3),
                               _mm256_slli_epi16(llm_avx2_field(p, g, 1), 2));
    case LLM_Q4_K: return llm_avx2_field(p + 16 + g / 2 * 32, 4 * (g % 2), 15);
    case LLM_Q5_K:
        return _mm256_or_si256(llm_avx2_field(p + 48 + g / 2 * 32, 4 * (g % 2), 15),
                               _mm256_slli_epi16(llm_avx2_field(p + 16, g, 1), 4));
    case LLM_Q6_K:
        return _mm256_or_si256(llm_avx2_field(p + g / 4 * 64 + g % 2 * 32, 4 * (g % 4 / 2), 15),
                               _mm256_slli_epi16(llm_avx2_field(p + 128 + g / 4 * 32, 2 * (g % 4), 3), 4));
    default: return _mm256_loadu_si256((const __m256i *)(p + 2)); /* q8_0: signed */
    }
}

/* A 32-value block's stored values as 16-bit integers, the offset taken off (q4_1's and q5_1's stay
 * unsigned: their minimum is added apart): values 0-15, and 16-31 in *hi. Nibbles are widened first, then
 * split (an and, a shift); fifth bit j is lane j of a 16-bit broadcast of its half of qh, tested against
 * 1 << j */
static inline __m256i llm_avx2_group16(uint32_t type, const uint8_t *p, __m256i *hi) {
    if (type == LLM_Q8_0) { /* signed bytes, widened */
        *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 18)));
        return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 2)));
    }
    if (type == LLM_MXFP4) {
        __m256i w = _mm256_sub_epi8(llm_avx2_group(type, p, 0), _mm256_set1_epi8(12));
        *hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
        return _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
    }
    const int qh_at = type == LLM_Q5_0 ? 2 : 4, /* after d (and m): then the nibbles */
        qs_at = type == LLM_Q4_0 ? 2 : type == LLM_Q4_1 ? 4 : type == LLM_Q5_0 ? 6 : 8;
    __m256i n = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + qs_at)));
    __m256i v[2] = {_mm256_and_si256(n, _mm256_set1_epi16(15)), _mm256_srli_epi16(n, 4)};
    for (int h = 0; h < 2; h++) {
        if (type == LLM_Q4_0) v[h] = _mm256_sub_epi16(v[h], _mm256_set1_epi16(8));
        if (type != LLM_Q5_0 && type != LLM_Q5_1) continue;
        const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
                                              16384, -32768);
        int16_t half;
        memcpy(&half, p + qh_at + 2 * h, 2);
        __m256i set = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16(half), bit), bit);
        if (type == LLM_Q5_0) /* a clear bit: the nibble with 0xfff0 over it, the nibble - 16 */
            v[h] = _mm256_or_si256(v[h], _mm256_andnot_si256(set, _mm256_set1_epi16(-16)));
        else v[h] = _mm256_or_si256(v[h], _mm256_and_si256(set, _mm256_set1_epi16(16)));
    }
    *hi = v[1];
    return v[0];
}

static inline float llm_avx2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* acc plus 8 sums of 4 products of unsigned bytes u and signed bytes x: one VNNI instruction where the
 * target has it. Without VNNI, _mm256_maddubs_epi16 adds pairs of products into 16 bits, saturating: exact
 * only while u stays under 128 (every type's stored values but q8_0's, which is signed). */
#if defined(LLM_AVX512VNNI)
#define LLM_AVX2_VNNI 1
static inline __m256i llm_avx2_dpbusd(__m256i acc, __m256i u, __m256i x) {
    return _mm256_dpbusd_epi32(acc, u, x);
}
#elif defined(__AVXVNNI__)
#define LLM_AVX2_VNNI 1
static inline __m256i llm_avx2_dpbusd(__m256i acc, __m256i u, __m256i x) {
    return _mm256_dpbusd_avx_epi32(acc, u, x);
}
#else
#define LLM_AVX2_VNNI 0
static inline __m256i llm_avx2_dpbusd(__m256i acc, __m256i u, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
}
#endif
/* acc plus 8 sums of 2 products of signed 16-bit integers: one instruction with VNNI, else two */
static inline __m256i llm_avx2_dpwssd(__m256i acc, __m256i a, __m256i b) {
#if defined(LLM_AVX512VNNI)
    return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* The products of one weight row with nc rows of activations (nc up to 4, x_stride blocks apart): a step of
 * a few tokens unpacks each weight block once for them all. 32-value blocks: one scale per block; q4_1 and
 * q5_1 add their minimum times the block's activation sum. With 8-bit activations the signed types (q8_0,
 * and q4_0 and q5_0 once their offset is taken off) multiply |w| by x with w's sign, in bytes. With 16-bit
 * ones the weights are widened to 16 bits and meet 256 q + r at once: two 16-bit multiply-adds a block,
 * where bytes took two products for q and r, a shift and three sign flips (SmolLM2 Q4_K_M's q5_0 matrices,
 * a decode step, one thread of a Sapphire Rapids: 1.4 times as fast; Q4_1 decode 1.13 times). Even and odd
 * blocks add into two sets of accumulators: two chains of additions, which the CPU overlaps (the calls are
 * written out so the sets stay in registers). */
static inline __attribute__((always_inline)) void llm_q8_block32_avx2(uint32_t type, int wide,
                                                                      const uint8_t *p,
                                                                      const llm_q8 *x, int64_t x_stride,
                                                                      int nc, __m256 acc[4], __m128 mins[4],
                                                                      const __m256 *given_scale) {
    const int has_min = type == LLM_Q4_1 || type == LLM_Q5_1;
    /* d, and m after it for q4_1 and q5_1, converted at once; then times the activations' d and s (which
     * follow each other too) at once: lane 0 the block's scale, lane 1 what its minimum adds, summed in mins'
     * lane 1 (the products and sums of a scalar loop, two conversions and a multiply fewer a block: q4_1's
     * products 1.12-1.16 times as fast, SmolLM2 Q4_1 decode 1.09 times, one thread of a Sapphire Rapids) */
    int32_t halves = 0;
    if (!given_scale) memcpy(&halves, p, has_min ? 4 : 2);
    __m128 dm = type == LLM_MXFP4 ? _mm_set_ss(llm_e8m0_half(p[0])) : _mm_cvtph_ps(_mm_cvtsi32_si128(halves));
    __m256i hi, lo, w, w_abs;
    if (wide) lo = llm_avx2_group16(type, p, &hi);
    else {
        w = w_abs = llm_avx2_group(type, p, 0);
        if (type == LLM_Q4_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
        if (type == LLM_Q5_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(16));
        if (type == LLM_MXFP4) w = _mm256_sub_epi8(w, _mm256_set1_epi8(12));
        if (!has_min) w_abs = _mm256_sign_epi8(w, w);
    }
    for (int c = 0; c < nc; c++) {
        const llm_q8 *xb = x + c * x_stride;
        __m256i dot;
        if (wide) /* 4 sums of 2 products in each 32-bit lane of each half: at most 4 x 128 x 32,639 < 2^24 */
            dot = llm_avx2_dpwssd(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)xb->a)),
                                  hi, _mm256_loadu_si256((const __m256i *)xb->a + 1));
        else {
            __m256i xq = _mm256_loadu_si256((const __m256i *)xb->q);
            if (!has_min) xq = _mm256_sign_epi8(xq, w);
            dot = llm_avx2_dpbusd(_mm256_setzero_si256(), w_abs, xq);
        }
        if (given_scale) { /* the caller's, for one token and this row (llm_avx2_scales4) */
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), *given_scale, acc[c]);
            continue;
        }
        __m128 scale = has_min ? _mm_mul_ps(dm, _mm_castpd_ps(_mm_load_sd((const double *)&xb->d)))
                               : _mm_mul_ss(dm, _mm_load_ss(&xb->d));
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcastss_ps(scale), acc[c]);
        if (has_min) mins[c] = _mm_add_ps(mins[c], scale);
    }
}

/* The sums of v[k]'s 8 lanes into lane k, in llm_avx2_hsum's order whatever the others hold (the halves
 * added, h; then h0 + h2 and h1 + h3; then those two): a row's product is the same bits whichever rows and
 * tokens share its call, and as one row at a time gave them (a default path's KV cache rounds to f16, where
 * another order's last bits could tip a value to the next f16 and on through the steps) */
static inline __m128 llm_avx2_hsum4(const __m256 v[4]) {
    __m128 h[4], pairs[2];
    for (int k = 0; k < 4; k++)
        h[k] = _mm_add_ps(_mm256_castps256_ps128(v[k]), _mm256_extractf128_ps(v[k], 1));
    for (int k = 0; k < 2; k++) /* (h0 + h2 of v[2k], of v[2k + 1], h1 + h3 of v[2k], of v[2k + 1]) */
        pairs[k] = _mm_add_ps(_mm_unpacklo_ps(h[2 * k], h[2 * k + 1]),
                              _mm_unpackhi_ps(h[2 * k], h[2 * k + 1]));
    return _mm_add_ps(_mm_movelh_ps(pairs[0], pairs[1]), _mm_movehl_ps(pairs[1], pairs[0]));
}

/* Four rows' block scales at once, for one token, where the block has a minimum (q4_1, q5_1): the rows'
 * first 4 bytes (d, m) side by side, converted and multiplied by the token's (d, s) in one instruction each,
 * where a row at a time took four instructions a row for them: lane 2r holds row r's d times the token's
 * d, lane 2r + 1 its m times the token's sum (llm_q8_block32_avx2's products, bit for bit). One thread of a
 * Sapphire Rapids: SmolLM2 Q4_1's products 1.07 times as fast. For the types without m it saved less and
 * measured mixed (q5_0 faster, Gemma 3's q8_0 output layer slower): they keep theirs a row at a time. */
static inline __attribute__((always_inline)) __m256 llm_avx2_scales4(const uint8_t *p, size_t row_bytes,
                                                                     const llm_q8 *xb) {
    int32_t dm[4];
    for (int r = 0; r < 4; r++) memcpy(&dm[r], p + r * row_bytes, 4);
    __m256 halves = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dm));
    return _mm256_mul_ps(halves, _mm256_castpd_ps(_mm256_broadcast_sd((const double *)&xb->d)));
}

/* nr rows times nc tokens (nr * nc <= 4). A decode step's rows are short (SmolLM2's 576 values, Gemma 3
 * 270M's 640: 18 and 20 blocks), and one at a time a third of a row's time went to what a row costs besides
 * its blocks (the call, the sums across lanes, the loop's start and end); LLM_DOT_ROWS rows a call (4, AVX2
 * 2), their blocks in turn, share that (one thread of a Sapphire Rapids: q4_1's products from L2 1.17 times
 * as fast, from memory 73 -> 82% of the plain read loop's speed). The rows lie one after the other in
 * memory: the prefetches follow their bytes in that order, as far ahead of where the rows' blocks have
 * reached together as one row's would be, so that memory still sees one run (each row's own prefetch, 4
 * runs at once, made them slower than one row at a time). */
static inline __attribute__((always_inline)) void llm_q8_dot32_avx2(uint32_t type, int wide, const uint8_t *p,
    size_t row_bytes, int nr, const llm_q8 *x, int64_t n_blocks, int64_t x_stride, int nc, float *out,
    int64_t out_stride) {
    const size_t bytes = type == LLM_Q8_0 ? 34 : type == LLM_Q4_0 ? 18 : type == LLM_Q4_1 ? 20 :
                         type == LLM_Q5_0 ? 22 : type == LLM_MXFP4 ? 17 : 24;
    const int has_min = type == LLM_Q4_1 || type == LLM_Q5_1, by4 = nr == 4 && has_min;
    __m256 even[4], odd[4]; /* [row * nc + token] */
    __m128 mins_even[4], mins_odd[4]; /* lane 1: the minimums' part */
    __m256 mins4_even = _mm256_setzero_ps(), mins4_odd = _mm256_setzero_ps(); /* by4: lane 2r + 1, row r's */
    for (int k = 0; k < nr * nc; k++) { /* only these: all 4 made a build for AVX2 keep them in memory */
        even[k] = odd[k] = _mm256_setzero_ps();
        mins_even[k] = mins_odd[k] = _mm_setzero_ps();
    }
    int64_t b = 0;
    int ahead[2];
    llm_prefetch_load(0, ahead);
    const uint8_t *rows = p;
    for (; b + 2 <= n_blocks; b += 2, p += 2 * bytes) {
        __m256 scales_even = _mm256_setzero_ps(), scales_odd = _mm256_setzero_ps();
        if (by4) {
            scales_even = llm_avx2_scales4(p, row_bytes, x + b);
            scales_odd = llm_avx2_scales4(p + bytes, row_bytes, x + b + 1);
        }
        for (int r = 0; r < nr; r++) {
            const uint8_t *pr = p + r * row_bytes;
            llm_prefetch(rows + (b * nr + 2 * r) * bytes, ahead); /* a line each 64 bytes, at most */
            __m256 row_even = _mm256_permutevar8x32_ps(scales_even, _mm256_set1_epi32(2 * r));
            __m256 row_odd = _mm256_permutevar8x32_ps(scales_odd, _mm256_set1_epi32(2 * r));
            llm_q8_block32_avx2(type, wide, pr, x + b, x_stride, nc, even + r * nc, mins_even + r * nc,
                                by4 ? &row_even : NULL);
            llm_q8_block32_avx2(type, wide, pr + bytes, x + b + 1, x_stride, nc, odd + r * nc,
                                mins_odd + r * nc, by4 ? &row_odd : NULL);
        }
        if (by4) {
            mins4_even = _mm256_add_ps(mins4_even, scales_even);
            mins4_odd = _mm256_add_ps(mins4_odd, scales_odd);
        }
    }
    if (b < n_blocks) {
        __m256 scales = by4 ? llm_avx2_scales4(p, row_bytes, x + b) : _mm256_setzero_ps();
        for (int r = 0; r < nr; r++) {
            __m256 row_scale = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(2 * r));
            llm_q8_block32_avx2(type, wide, p + r * row_bytes, x + b, x_stride, nc, even + r * nc,
                                mins_even + r * nc, by4 ? &row_scale : NULL);
        }
        if (by4) mins4_even = _mm256_add_ps(mins4_even, scales);
    }
    __m256 both[4];
    __m128 mins[4];
    for (int k = 0; k < 4; k++) {
        both[k] = k < nr * nc ? _mm256_add_ps(even[k], odd[k]) : _mm256_setzero_ps();
        mins[k] = k < nr * nc ? _mm_add_ps(mins_even[k], mins_odd[k]) : _mm_setzero_ps();
    }
    __m128 lane1 = _mm_movehl_ps(_mm_unpacklo_ps(mins[2], mins[3]), _mm_unpacklo_ps(mins[0], mins[1]));
    if (by4)
        lane1 = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(_mm256_add_ps(mins4_even, mins4_odd),
                                                                _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)));
    float sums[4];
    _mm_storeu_ps(sums, _mm_add_ps(llm_avx2_hsum4(both), lane1));
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) out[c * out_stride + r] = sums[r * nc + c];
}

/* 256-value k-quant blocks: per group of 32, the products scaled by the sub-block scales in integers, then by
 * d and the group's activation scale (even and odd groups into two sets of accumulators); the offsets and
 * minimums meet the activation sums once per block, for its 8 groups side by side (the groups' first halves'
 * sums in one register, the second halves' in another) */
static inline __attribute__((always_inline)) void llm_q8_groupk_avx2(uint32_t type, int wide,
                                                                     const uint8_t *p, int g,
                                                                     const int32_t half_scale[2][8], float d,
                                                                     const llm_q8 *x, int64_t x_stride,
                                                                     int nc, __m256 acc[4]) {
    __m256i w = llm_avx2_group(type, p, g);
    __m256i sc = _mm256_set_m128i(_mm_set1_epi16((int16_t)half_scale[1][g]),   /* scales fit 16 bits */
                                  _mm_set1_epi16((int16_t)half_scale[0][g]));
    for (int c = 0; c < nc; c++) {
        const llm_q8 *xg = x + c * x_stride + g;
        __m256i scaled =
            _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i *)xg->q)), sc);
        if (!wide) {
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled), _mm256_set1_ps(xg->d * d), acc[c]);
            continue;
        }
        /* 256 times the q part would pass 2^31 with q6_k's scales: q and r each to float, then added */
        __m256i fine = _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i *)xg->r)),
                                         sc);
        __m256 both = _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled), _mm256_set1_ps(256.0f),
                                      _mm256_cvtepi32_ps(fine));
        acc[c] = _mm256_fmadd_ps(both, _mm256_set1_ps(xg->d * d), acc[c]);
    }
}

/* A k-quant block's d, dmin and offset into b, and its scales and minimums per half of 16 values of each
 * group of 32, [half][group]. q4_K's and q5_K's 6-bit fields (one scale and minimum a group: both halves
 * alike) are taken apart 4 at a time in 32-bit words and widened in a register (SmolLM2 Q4_K_M's q4_K
 * matrices, one thread of a Zen 5, their products alone: 1.25 times as fast as one field at a time); the
 * others' one at a time (q6_K's signed bytes too: written as vectors and read back one by one for the
 * groups, they made its products 0.85 times as fast) */
static inline __attribute__((always_inline)) void llm_avx2_kscales(uint32_t type, const uint8_t *p,
                                                                   llm_qblock *b, int32_t scale[2][8],
                                                                   int32_t min[2][8]) {
    if (type == LLM_Q4_K || type == LLM_Q5_K) {
        uint32_t u[3]; /* bytes 0-3: scales 0-3 and the top bits of 4-7; 4-7 mins likewise; 8-11 the rest */
        memcpy(u, p + 4, 12);
        uint64_t sc = (u[0] & 0x3f3f3f3f) |
                      (uint64_t)((u[2] & 0x0f0f0f0f) | (u[0] >> 6 & 0x03030303) << 4) << 32;
        uint64_t mn = (u[1] & 0x3f3f3f3f) |
                      (uint64_t)((u[2] >> 4 & 0x0f0f0f0f) | (u[1] >> 6 & 0x03030303) << 4) << 32;
        __m256i scales = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc));
        __m256i mins = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn));
        for (int h = 0; h < 2; h++) {
            _mm256_storeu_si256((__m256i *)scale[h], scales);
            _mm256_storeu_si256((__m256i *)min[h], mins);
        }
        b->n = 256; b->sub = 32; b->offset = 0; b->d = llm_f16_at(p); b->dmin = llm_f16_at(p + 2);
        return;
    }
    llm_qblock_read_scales(type, p, b);
    for (int h = 0; h < 16; h++) {
        scale[h % 2][h / 2] = b->scale[h * 16 / b->sub];
        min[h % 2][h / 2] = b->min[h * 16 / b->sub];
    }
}

/* A k-quant block's 8 groups of activations: their scales (xd) and their halves' sums (sum0, sum1), each
 * group's first 16 bytes (d, s, sum[0], sum[1]) loaded and transposed (gathers took 1.33 times as long for
 * q4_K's products alone, Zen 5) */
static inline __attribute__((always_inline)) void llm_avx2_kgroups(const llm_q8 *xb, __m256 *xd,
                                                                   __m256i *sum0, __m256i *sum1) {
    __m256 v[4], lo[2], hi[2];
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(&xb[k].d)),
                                    _mm_loadu_ps(&xb[k + 4].d), 1);
    for (int k = 0; k < 2; k++) {
        lo[k] = _mm256_unpacklo_ps(v[2 * k], v[2 * k + 1]); /* d and s of 4 groups */
        hi[k] = _mm256_unpackhi_ps(v[2 * k], v[2 * k + 1]); /* sum[0] and sum[1] */
    }
    *xd = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(lo[0]), _mm256_castps_pd(lo[1])));
    *sum0 = _mm256_castpd_si256(_mm256_unpacklo_pd(_mm256_castps_pd(hi[0]), _mm256_castps_pd(hi[1])));
    *sum1 = _mm256_castpd_si256(_mm256_unpackhi_pd(_mm256_castps_pd(hi[0]), _mm256_castps_pd(hi[1])));
}

static inline __attribute__((always_inline)) void llm_q8_dotk_avx2(uint32_t type, int wide, const uint8_t *p,
    size_t row_bytes, int nr, const llm_q8 *x, int64_t n_blocks, int64_t x_stride, int nc, float *out,
    int64_t out_stride) {
    const size_t bytes = type == LLM_Q2_K ? 84 : type == LLM_Q3_K ? 110 : type == LLM_Q4_K ? 144 :
                         type == LLM_Q5_K ? 176 : 210;
    __m256 even[4], odd[4], rest[4]; /* [row * nc + token] */
    for (int k = 0; k < nr * nc; k++) even[k] = odd[k] = rest[k] = _mm256_setzero_ps();
    llm_qblock b;
    int32_t half_scale[2][8], half_min[2][8]; /* [half][group] */
    int ahead[2];
    llm_prefetch_load(0, ahead);
    const uint8_t *rows = p;
    for (int64_t blk = 0; blk < n_blocks; blk++, p += bytes, x += 8) {
        __m256 xd_first = _mm256_setzero_ps(); /* several rows share one token's (nc is 1 then) */
        __m256i sum0_first = _mm256_setzero_si256(), sum1_first = _mm256_setzero_si256();
        if (nr > 1) llm_avx2_kgroups(x, &xd_first, &sum0_first, &sum1_first);
        for (int r = 0; r < nr; r++) {
            const uint8_t *pr = p + r * row_bytes;
            __m256 *even_r = even + r * nc, *odd_r = odd + r * nc, *rest_r = rest + r * nc;
            for (size_t line = 0; line < bytes; line += 64) /* in the rows' order, as llm_q8_dot32_avx2's */
                llm_prefetch(rows + (blk * nr + r) * bytes + line, ahead);
            llm_avx2_kscales(type, pr, &b, half_scale, half_min);
            for (int g = 0; g < 8; g += 2) {
                llm_q8_groupk_avx2(type, wide, pr, g, half_scale, b.d, x, x_stride, nc, even_r);
                llm_q8_groupk_avx2(type, wide, pr, g + 1, half_scale, b.d, x, x_stride, nc, odd_r);
            }
            __m256i sc[2], mn[2];
            for (int h = 0; h < 2; h++) {
                sc[h] = _mm256_loadu_si256((const __m256i *)half_scale[h]);
                mn[h] = _mm256_loadu_si256((const __m256i *)half_min[h]);
            }
            __m256 offset = _mm256_set1_ps(b.d * (float)b.offset), dmin = _mm256_set1_ps(b.dmin);
            for (int c = 0; c < nc; c++) {
                __m256 xd = xd_first;
                __m256i sum0 = sum0_first, sum1 = sum1_first;
                if (nr == 1) llm_avx2_kgroups(x + c * x_stride, &xd, &sum0, &sum1);
                __m256 offsets = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_mullo_epi32(sum0, sc[0]),
                                                                     _mm256_mullo_epi32(sum1, sc[1])));
                __m256 minimums = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_mullo_epi32(sum0, mn[0]),
                                                                      _mm256_mullo_epi32(sum1, mn[1])));
                __m256 per_group =
                    _mm256_add_ps(_mm256_mul_ps(offsets, offset), _mm256_mul_ps(minimums, dmin));
                rest_r[c] = _mm256_fmadd_ps(per_group, xd, rest_r[c]);
            }
        }
    }
    __m256 both[4], rests[4];
    for (int k = 0; k < 4; k++) {
        both[k] = k < nr * nc ? _mm256_add_ps(even[k], odd[k]) : _mm256_setzero_ps();
        rests[k] = k < nr * nc ? rest[k] : _mm256_setzero_ps();
    }
    float sums[4];
    _mm_storeu_ps(sums, _mm_sub_ps(llm_avx2_hsum4(both), llm_avx2_hsum4(rests)));
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) out[c * out_stride + r] = sums[r * nc + c];
}

/* ---- Decode tiles: q4_0's, q4_1's, q5_0's, q5_1's, q8_0's, q4_K's, q5_K's, q6_K's rows 8 side by side -- */
/* A decode step meets each weight row with one token (or a few), and a row at a time a q4_0 or q4_1 block
 * costs about 10 instructions for its 18 or 20 bytes: the nibbles widened and split, two multiply-adds, the
 * scale converted and applied, and at the row's end sums across lanes. That bounds the products at 11-12
 * GB/s on one core of a Sapphire Rapids, where a plain loop reads the same bytes at 17-24. Stored 8 rows
 * side by side instead, a row sits in each 32-bit lane: one vpdpbusd adds 4 products for each of 8 rows,
 * a block's 8 scales convert in one instruction, and nothing is summed across lanes (about 4 instructions
 * a row and block). The CPU backend copies each q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K and q6_K matrix
 * into this layout when it starts (llm_cpu_make_tiles), as llama.cpp's CPU backend repacks Q4_0; one tile of
 * 8 rows and one block takes the 8 rows' block bytes, in this order:
 *     the block's f16 scales, each of rows 0..7 side by side: d (q4_0, q5_0, q8_0, q6_K); d, then m (q4_1,
 *     q5_1); d, then dmin (q4_K, q5_K)
 *     the rest of the block in runs of 32 bytes: run u holds the rest's bytes 4u..4u+3 of each row, row i's
 *     at 4i. q4_0, q4_1: 4 runs, run c holding nibble bytes 4c..4c+3 (low nibbles: the row's values
 *     4c..4c+3; high: 16 + 4c..16 + 4c + 3). q5_0, q5_1: a run of the 32-bit words of fifth bits, then 4
 *     runs of nibbles as q4_0's. q8_0: 8 runs, run c holding values 4c..4c+3. q4_K: 3 runs of the 12 bytes
 *     of 6-bit scales and mins, then 32 of nibbles, run 3 + 8k + c holding values 64k + 4c.. (low) and 64k +
 *     32 + 4c.. (high). q5_K: 3 runs of scales and mins as q4_K's, 8 runs of fifth bits (run 3 + c holding
 *     the bytes qh[4c..4c+3], bit 2k of qh[l] value 64k + l's, bit 2k + 1 value 64k + 32 + l's), then 32 of
 *     nibbles as q4_K's. q6_K (its d is its block's last 2 bytes): 32 runs of low nibbles, 16 of 2-bit high
 *     parts, 4 of 8-bit scales
 * so that a matrix's tiles take its rows' bytes, and rows r..r+7 start at byte r * row_bytes, as rows do.
 * One thread of a Sapphire Rapids, SmolLM2 Q4_1's matrices from memory, one token: 61-75% -> 88-91% of a
 * plain read loop's speed (results/2026-12-05-decode-tiles-spr-cpu.log). */
/* the types stored in tiles: q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K and q6_K (a block's bytes: 18, 20, 22,
 * 24, 34, 144, 176, 210) */
static int llm_tiles_type(uint32_t type) {
    return type == LLM_Q4_0 || type == LLM_Q4_1 || type == LLM_Q5_0 || type == LLM_Q5_1 || type == LLM_Q8_0 ||
           type == LLM_Q4_K || type == LLM_Q5_K || type == LLM_Q6_K;
}
/* the f16 scales of a block of the type, which a tile holds 8 rows side by side: q4_0's, q5_0's and q8_0's d;
 * q4_1's and q5_1's d and m; q4_K's and q5_K's d and dmin, the block's first bytes; q6_K's d, its last two
 * (its rest: the bytes before) */
static int llm_tiles_halves(uint32_t type) {
    return type == LLM_Q4_1 || type == LLM_Q5_1 || type == LLM_Q4_K || type == LLM_Q5_K ? 2 : 1;
}

/* 4 x 4 dwords transposed in each 128-bit half (dword j of v[k] <-> dword k of v[j]): 4 of a tile's runs
 * become 16 bytes of each of its rows (row k in v[k]'s low half, row k + 4 in its high half), and back */
static inline void llm_avx2_transpose4x4(__m256i v[4]) {
    __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    v[0] = _mm256_unpacklo_epi64(t0, t2); v[1] = _mm256_unpackhi_epi64(t0, t2);
    v[2] = _mm256_unpacklo_epi64(t1, t3); v[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* n_rows (a multiple of 8) rows of cols values into their tiles (as many bytes), or (into_tiles 0) back:
 * a prefill's packing reads rows (llm_matmul), and the rows in the file stay unread */
static void llm_tiles_copy(uint32_t type, uint8_t *rows, uint8_t *tiles, int64_t n_rows, int64_t cols,
                           int into_tiles) {
    uint64_t block_bytes, block_values;
    llm_dtype_info(type, &block_bytes, &block_values);
    const int halves = llm_tiles_halves(type), n_runs = ((int)block_bytes - 2 * halves) / 4;
    const int halves_at = type == LLM_Q6_K ? (int)block_bytes - 2 : 0, rest_at = halves_at ? 0 : 2 * halves;
    size_t row_bytes = llm_dtype_row_bytes(type, cols);
    int64_t n_blocks = cols / (int64_t)block_values;
    for (int64_t t = 0; t < n_rows / LLM_TILE_ROWS; t++)
        for (int64_t b = 0; b < n_blocks; b++) {
            uint8_t *tile = tiles + (size_t)(t * n_blocks + b) * LLM_TILE_ROWS * block_bytes, *row[8];
            for (int i = 0; i < LLM_TILE_ROWS; i++) {
                row[i] = rows + (size_t)(t * LLM_TILE_ROWS + i) * row_bytes + (size_t)b * block_bytes;
                for (int k = 0; k < halves; k++) /* d, then m or dmin: 8 rows' each */
                    memcpy(into_tiles ? tile + 16 * k + 2 * i : row[i] + halves_at + 2 * k,
                           into_tiles ? row[i] + halves_at + 2 * k : tile + 16 * k + 2 * i, 2);
            }
            uint8_t *runs = tile + 16 * halves;
            int u = 0;
            for (; u + 4 <= n_runs; u += 4) { /* 4 runs at a time: rows k and k + 4 in v[k], or the runs */
                __m256i v[4];
                int rest = rest_at + 4 * u; /* the rows' bytes from here */
                for (int k = 0; k < 4; k++)
                    v[k] = into_tiles ? _mm256_loadu2_m128i((const __m128i *)(row[k + 4] + rest),
                                                            (const __m128i *)(row[k] + rest))
                                      : _mm256_loadu_si256((const __m256i *)(runs + 32 * (u + k)));
                llm_avx2_transpose4x4(v);
                for (int k = 0; k < 4; k++) {
                    if (into_tiles) _mm256_storeu_si256((__m256i *)(runs + 32 * (u + k)), v[k]);
                    else _mm256_storeu2_m128i((__m128i *)(row[k + 4] + rest), (__m128i *)(row[k] + rest),
                                              v[k]);
                }
            }
            for (; u < n_runs; u++) /* the last runs (q4_K: 35 in all) one at a time */
                for (int i = 0; i < LLM_TILE_ROWS; i++)
                    memcpy(into_tiles ? runs + 32 * u + 4 * i : row[i] + rest_at + 4 * u,
                           into_tiles ? row[i] + rest_at + 4 * u : runs + 32 * u + 4 * i, 4);
        }
}

/* q5_0's fifth bits of values 4c..4c+3 (c 0..7) of a tile's 8 rows, as 16 or 0 in byte k of each row's lane,
 * from the run of their 32-bit words (bit j: value j's): the byte that holds the four bits copied into the
 * lane's 4 bytes, byte k tested against its bit */
static inline __attribute__((always_inline)) __m256i llm_tiles_fifth(__m256i qh, int c) {
    const __m256i lanes = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, /* a lane's first byte */
                                            0, 0x04040404, 0x08080808, 0x0c0c0c0c);
    const __m256i which = _mm256_add_epi32(lanes, _mm256_set1_epi32(c / 2 * 0x01010101)); /* its byte c / 2 */
    const __m256i bit = _mm256_set1_epi32(c & 1 ? (int)0x80402010 : 0x08040201); /* bits 4 (c % 2) + k */
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, which), bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

/* A tile (8 rows, n_blocks blocks) times nc tokens (x_stride blocks apart): out[c * out_stride + i], row i's.
 * A block's integer for row i is w . (256 q + r) (16-bit activations; 8-bit: w . q), as vpdpbusd adds
 * unsigned stored values (nibbles; q5_0's and q5_1's with their fifth bits) times signed bytes: 256 times
 * the products with q plus those with r, less the offset (q4_0's 8, q5_0's 16) times the activations' sum
 * (at most 32 x 31 x 32,639 in size, converted to float once, as the plain C converts it); then times d and
 * the token's d, and q4_1's and q5_1's m times the token's s, each row in its lane. */
static inline __attribute__((always_inline)) void llm_tiles_dot_avx2(uint32_t type, int wide,
                                                                     const uint8_t *p, int64_t n_blocks,
                                                                     const llm_q8 *x, int64_t x_stride,
                                                                     int nc, float *out, int64_t out_stride) {
    const int has_min = type == LLM_Q4_1 || type == LLM_Q5_1, fifth = type == LLM_Q5_0 || type == LLM_Q5_1;
    const int offset = fifth ? 16 : 8; /* of the types without m */
    const int tile_bytes = LLM_TILE_ROWS * (2 * has_min + 4 * fifth + 18);
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256 acc[4], mins[4];
    for (int c = 0; c < nc; c++) acc[c] = mins[c] = _mm256_setzero_ps();
    int ahead[2];
    llm_prefetch_load(0, ahead);
    for (int64_t b = 0; b < n_blocks; b++, p += tile_bytes) {
        for (int at = 0; at < tile_bytes; at += 64) llm_prefetch(p + at, ahead);
        const uint8_t *nibbles = p + 16 * (1 + has_min) + 32 * fifth; /* after the run of fifth bits */
        __m256i dq[4], dr[4]; /* per token: the products with q, with r */
        for (int c = 0; c < nc; c++) dq[c] = dr[c] = _mm256_setzero_si256();
        __m256i qh = _mm256_setzero_si256();
        if (fifth) qh = _mm256_loadu_si256((const __m256i *)(p + 16 * (1 + has_min)));
        for (int run = 0; run < 4; run++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(nibbles + 32 * run));
            __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
            if (fifth) {
                lo = _mm256_or_si256(lo, llm_tiles_fifth(qh, run));
                hi = _mm256_or_si256(hi, llm_tiles_fifth(qh, 4 + run));
            }
            for (int c = 0; c < nc; c++) {
                const llm_q8 *xb = x + c * x_stride + b;
                int32_t q_lo, q_hi, r_lo, r_hi; /* the token's values 4 run.. and 16 + 4 run..: 4 bytes */
                memcpy(&q_lo, xb->q + 4 * run, 4); memcpy(&q_hi, xb->q + 16 + 4 * run, 4);
                dq[c] = llm_avx2_dpbusd(dq[c], lo, _mm256_set1_epi32(q_lo));
                dq[c] = llm_avx2_dpbusd(dq[c], hi, _mm256_set1_epi32(q_hi));
                if (!wide) continue;
                memcpy(&r_lo, xb->r + 4 * run, 4); memcpy(&r_hi, xb->r + 16 + 4 * run, 4);
                dr[c] = llm_avx2_dpbusd(dr[c], lo, _mm256_set1_epi32(r_lo));
                dr[c] = llm_avx2_dpbusd(dr[c], hi, _mm256_set1_epi32(r_hi));
            }
        }
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        __m256 m = has_min ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))) : d;
        for (int c = 0; c < nc; c++) {
            const llm_q8 *xb = x + c * x_stride + b;
            __m256i dot = wide ? _mm256_add_epi32(_mm256_slli_epi32(dq[c], 8), dr[c]) : dq[c];
            if (!has_min)
                dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(offset * (xb->sum[0] + xb->sum[1])));
            __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(xb->d));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[c]);
            if (has_min) mins[c] = _mm256_fmadd_ps(m, _mm256_set1_ps(xb->s), mins[c]);
        }
    }
    for (int c = 0; c < nc; c++) _mm256_storeu_ps(out + c * out_stride, _mm256_add_ps(acc[c], mins[c]));
}

/* The same for q8_0, whose 8 runs hold values 4c..4c+3 as signed bytes: with VNNI stored + 128 (unsigned, as
 * vpdpbusd takes them; 128 times the activations' sum taken off), else as |w| times x with w's sign (at most
 * 2 x 128 x 127 a pair: _mm256_maddubs_epi16's 16 bits hold it). The block's integer for a row, up to 32 x
 * 128 x 32,639, is converted to float once, as the plain C converts it. */
static inline __attribute__((always_inline)) void llm_tiles_dot8_avx2(int wide, const uint8_t *p,
                                                                      int64_t n_blocks, const llm_q8 *x,
                                                                      int64_t x_stride, int nc, float *out,
                                                                      int64_t out_stride) {
    const int tile_bytes = LLM_TILE_ROWS * 34;
    __m256 acc[4];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    int ahead[2];
    llm_prefetch_load(0, ahead);
    for (int64_t b = 0; b < n_blocks; b++, p += tile_bytes) {
        for (int at = 0; at < tile_bytes; at += 64) llm_prefetch(p + at, ahead);
        __m256i dq[4], dr[4]; /* per token: the products with q, with r */
        for (int c = 0; c < nc; c++) dq[c] = dr[c] = _mm256_setzero_si256();
        for (int run = 0; run < 8; run++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * run));
            __m256i u = LLM_AVX2_VNNI ? _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)) /* w + 128 */
                                      : _mm256_abs_epi8(w);
            for (int c = 0; c < nc; c++) {
                const llm_q8 *xb = x + c * x_stride + b;
                int32_t q4, r4; /* the token's values 4 run..4 run + 3 */
                memcpy(&q4, xb->q + 4 * run, 4);
                __m256i xq = _mm256_set1_epi32(q4);
                dq[c] = llm_avx2_dpbusd(dq[c], u, LLM_AVX2_VNNI ? xq : _mm256_sign_epi8(xq, w));
                if (!wide) continue;
                memcpy(&r4, xb->r + 4 * run, 4);
                __m256i xr = _mm256_set1_epi32(r4);
                dr[c] = llm_avx2_dpbusd(dr[c], u, LLM_AVX2_VNNI ? xr : _mm256_sign_epi8(xr, w));
            }
        }
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        for (int c = 0; c < nc; c++) {
            const llm_q8 *xb = x + c * x_stride + b;
            __m256i dot = wide ? _mm256_add_epi32(_mm256_slli_epi32(dq[c], 8), dr[c]) : dq[c];
            if (LLM_AVX2_VNNI)
                dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(128 * (xb->sum[0] + xb->sum[1])));
            __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(xb->d));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) _mm256_storeu_ps(out + c * out_stride, acc[c]);
}

/* Byte b (0..3) of each 32-bit lane of v, zero-extended: one shuffle (each lane's bytes stay in its 128-bit
 * half) */
static inline __attribute__((always_inline)) __m256i llm_avx2_lane_byte(__m256i v, int b) {
    const __m256i pick = _mm256_setr_epi32(0x80808000 + b, 0x80808004 + b, 0x80808008 + b, 0x8080800c + b,
                                           0x80808000 + b, 0x80808004 + b, 0x80808008 + b, 0x8080800c + b);
    return _mm256_shuffle_epi8(v, pick);
}

/* q4_K's 6-bit scales and mins of a tile's 8 rows as bytes, from the 3 runs that hold them (runs[0..2]):
 * byte j of a row's first run is its scale j < 4, of its second its min j < 4; scales and mins 4..7 lie in
 * the third run's nibbles, their top 2 bits in the first two runs' top bits (llama.cpp's get_scale_min_k4
 * reads one row's the same way). bytes[0]: scales 0..3 (byte j of each row's lane), [1] scales 4..7, [2]
 * mins 0..3, [3] mins 4..7: 11 instructions for the block's 16 (then a shuffle each), where taken apart a
 * sub-block at a time its scale and min took 4 to 12 */
static inline __attribute__((always_inline)) void llm_tiles_scales_mins(const __m256i runs[3],
                                                                        __m256i bytes[4]) {
    const __m256i six = _mm256_set1_epi8(63), four = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
    bytes[0] = _mm256_and_si256(runs[0], six);
    bytes[2] = _mm256_and_si256(runs[1], six);
    /* bits 6, 7 of the first two runs' bytes to bits 4, 5 (a 32-bit shift: bits 0, 1 of the byte above
     * come in at 6, 7 and are masked off) */
    bytes[1] = _mm256_or_si256(_mm256_and_si256(runs[2], four),
                               _mm256_and_si256(_mm256_srli_epi32(runs[0], 2), top));
    bytes[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(runs[2], 4), four),
                               _mm256_and_si256(_mm256_srli_epi32(runs[1], 2), top));
}
/* sub-block j's (0..7) scale and min of the 8 rows, one in each 32-bit lane */
static inline __attribute__((always_inline)) void llm_tiles_scale_min(const __m256i runs[3], int j,
                                                                      __m256i *scale, __m256i *min) {
    __m256i bytes[4];
    llm_tiles_scales_mins(runs, bytes);
    *scale = llm_avx2_lane_byte(bytes[j / 4], j % 4);
    *min = llm_avx2_lane_byte(bytes[2 + j / 4], j % 4);
}

/* q5_K's fifth bits of sub-block j (bit j of each byte of a run of them) as 16 or 0 in each byte: moved to
 * bit 4 by a 16-bit shift (at most 4 places, so no byte takes a bit of its neighbour's) */
static inline __attribute__((always_inline)) __m256i llm_tiles_fifth_k(__m256i qh, int j) {
    __m256i at4 = j <= 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
    return _mm256_and_si256(at4, _mm256_set1_epi8(16));
}

/* q4_K's (q5_K's) tile (8 rows, n_blocks blocks of 256 values) times nc tokens, as above: sub-block j's
 * integer w . (256 q + r) times d scale_j and the token's d of those 32 values, less dmin min_j times their
 * sum s. q5_K: each value's fifth bit (16) or'ed into its nibble from the run of fifth bits. q4_K with VNNI:
 * the high nibbles meet the activations as they lie (16 times the nibble: vpdpbusd's 32-bit sums hold it,
 * where _mm256_maddubs_epi16's 16 bits would not), their sums divided by 16 at the sub-block's end, one
 * shift there rather than one a run. The same integers and floats as taking each nibble apart: the same
 * bits. One thread of a Sapphire Rapids, a token against q4_K tiles in L2: 26.3 -> 35.1 GB/s, q5_K 24.0 ->
 * 29.8, with the chains below (results/2026-12-06-k-quant-decode-chains-spr-cpu.log) */
static inline __attribute__((always_inline)) void llm_tiles_dotk_avx2(int fifth, int wide, const uint8_t *p,
                                                                      int64_t n_blocks, const llm_q8 *x,
                                                                      int64_t x_stride, int nc, float *out,
                                                                      int64_t out_stride) {
    const int tile_bytes = LLM_TILE_ROWS * (fifth ? 176 : 144), nibbles_at = fifth ? 384 : 128;
    const int times16 = LLM_AVX2_VNNI && !fifth; /* the high nibbles unshifted */
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256 acc[4], mins[4];
    for (int c = 0; c < nc; c++) acc[c] = mins[c] = _mm256_setzero_ps();
    int ahead[2];
    llm_prefetch_load(0, ahead);
    for (int64_t b = 0; b < n_blocks; b++, p += tile_bytes) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
        __m256i scale_runs[3], scales_mins[4];
        for (int u = 0; u < 3; u++) scale_runs[u] = _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * u));
        llm_tiles_scales_mins(scale_runs, scales_mins);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) { /* sub-blocks 2k (the low nibbles of runs 3 + 8k..) and 2k + 1 (high) */
            /* a quarter of the tile's 18 cache lines asked for at a time: all at once, their requests
             * stalled the loop (a pure q4_K file, one thread: 62-65% -> 72-74% of the read loop's speed) */
            for (int at = tile_bytes / 4 * k; at < tile_bytes / 4 * (k + 1); at += 64)
                llm_prefetch(p + at, ahead);
            const uint8_t *nibbles = p + nibbles_at + 256 * k;
            /* [run's parity][sub-block 2k + h][token]: the products with q, with r. One token's are in two
             * parts, the even runs' and the odd's, added at the end: each vpdpbusd waits for the one before
             * on its sum (5 cycles), and the 4 chains of one part kept it at 0.8 an instruction a cycle */
            const int parts = nc == 1 ? 2 : 1;
            __m256i dq[2][2][4], dr[2][2][4];
            for (int u = 0; u < parts; u++)
                for (int c = 0; c < nc; c++)
                    dq[u][0][c] = dq[u][1][c] = dr[u][0][c] = dr[u][1][c] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int run = 0; run < 8; run++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(nibbles + 32 * run));
                __m256i lo = _mm256_and_si256(w, low4);
                __m256i hi = times16 ? _mm256_andnot_si256(low4, w)
                                     : _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                if (fifth) { /* qh[4 run..]: bit 2k for the low nibbles' values, 2k + 1 for the high */
                    __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * run));
                    lo = _mm256_or_si256(lo, llm_tiles_fifth_k(qh, 2 * k));
                    hi = _mm256_or_si256(hi, llm_tiles_fifth_k(qh, 2 * k + 1));
                }
                const int u = run % parts;
                for (int c = 0; c < nc; c++) {
                    const llm_q8 *xb = x + c * x_stride + 8 * b + 2 * k; /* sub-block 2k's 32 values */
                    int32_t q_lo, q_hi, r_lo, r_hi;
                    memcpy(&q_lo, xb[0].q + 4 * run, 4); memcpy(&q_hi, xb[1].q + 4 * run, 4);
                    dq[u][0][c] = llm_avx2_dpbusd(dq[u][0][c], lo, _mm256_set1_epi32(q_lo));
                    dq[u][1][c] = llm_avx2_dpbusd(dq[u][1][c], hi, _mm256_set1_epi32(q_hi));
                    if (!wide) continue;
                    memcpy(&r_lo, xb[0].r + 4 * run, 4); memcpy(&r_hi, xb[1].r + 4 * run, 4);
                    dr[u][0][c] = llm_avx2_dpbusd(dr[u][0][c], lo, _mm256_set1_epi32(r_lo));
                    dr[u][1][c] = llm_avx2_dpbusd(dr[u][1][c], hi, _mm256_set1_epi32(r_hi));
                }
            }
            for (int h = 0; parts == 2 && h < 2; h++) {
                dq[0][h][0] = _mm256_add_epi32(dq[0][h][0], dq[1][h][0]);
                dr[0][h][0] = _mm256_add_epi32(dr[0][h][0], dr[1][h][0]);
            }
            for (int h = 0; h < 2; h++) {
                int j = 2 * k + h;
                __m256 d_scale =
                    _mm256_mul_ps(d, _mm256_cvtepi32_ps(llm_avx2_lane_byte(scales_mins[j / 4], j % 4)));
                __m256i min = llm_avx2_lane_byte(scales_mins[2 + j / 4], j % 4);
                __m256 dmin_min = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(min));
                for (int c = 0; c < nc; c++) {
                    const llm_q8 *xb = x + c * x_stride + 8 * b + j;
                    __m256i dot = wide ? _mm256_add_epi32(_mm256_slli_epi32(dq[0][h][c], 8), dr[0][h][c])
                                       : dq[0][h][c];
                    if (h && times16) dot = _mm256_srai_epi32(dot, 4); /* exact: 16 times each term */
                    __m256 times = _mm256_mul_ps(d_scale, _mm256_set1_ps(xb->d));
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), times, acc[c]);
                    mins[c] = _mm256_fmadd_ps(dmin_min, _mm256_set1_ps(xb->s), mins[c]);
                }
            }
        }
    }
    for (int c = 0; c < nc; c++) _mm256_storeu_ps(out + c * out_stride, _mm256_sub_ps(acc[c], mins[c]));
}

/* (a & mask) | b: one instruction with AVX-512's three-input logic */
static inline __attribute__((always_inline)) __m256i llm_avx2_and_or(__m256i a, __m256i mask, __m256i b) {
#if defined(LLM_AVX512VL)
    return _mm256_ternarylogic_epi32(a, mask, b, 0xea); /* a 0xf0, mask 0xcc, b 0xaa: (a & mask) | b */
#else
    return _mm256_or_si256(_mm256_and_si256(a, mask), b);
#endif
}

/* q6_K's values of a tile's 8 rows, 4 of each (0..63, stored + 32), for quarters j and j + 2 (j = 0, 1) of
 * half n of a block, ql bytes 4c..4c+3 (values 128n + 32j + 4c.. and 128n + 64 + 32j + 4c.., as llama.cpp
 * orders a block): run 16n + 8j + c (at the tile's runs) holds their low 4 bits (quarter j's in the low
 * nibbles, j + 2's in the high), run 32 + 8n + c their top 2 (quarter q's: bits 2q, 2q + 1) */
static inline __attribute__((always_inline)) void llm_tiles_q6(const uint8_t *runs, int n, int j, int c,
                                                               __m256i w[2]) {
    const __m256i low4 = _mm256_set1_epi8(15), top2 = _mm256_set1_epi8(0x30);
    __m256i ql = _mm256_loadu_si256((const __m256i *)(runs + 32 * (16 * n + 8 * j + c)));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(runs + 32 * (32 + 8 * n + c)));
    w[0] = llm_avx2_and_or(ql, low4, _mm256_and_si256(_mm256_slli_epi16(qh, 4 - 2 * j), top2));
    w[1] = llm_avx2_and_or(_mm256_srli_epi16(ql, 4), low4,
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), top2));
}

/* q6_K's signed 8-bit scale of sub-block i (0..15) for a tile's 8 rows: byte i % 4 of run 48 + i / 4 */
static inline __attribute__((always_inline)) __m256i llm_tiles_scale6(const uint8_t *runs, int i) {
    __m256i run = _mm256_loadu_si256((const __m256i *)(runs + 32 * (48 + i / 4)));
    return _mm256_srai_epi32(_mm256_slli_epi32(run, 24 - 8 * (i % 4)), 24);
}

/* q6_K's tile (8 rows, n_blocks blocks of 256 values) times nc tokens, as above: sub-block i of 16 values
 * (quarter q's 4 runs c = 4g..4g + 3, i = 8n + 2q + g) gives w . (256 q + r) less 32 times the sum of its
 * 16 activations, times d, its signed 8-bit scale (byte i % 4 of run 48 + i / 4) and the token's d. One
 * token's products in two parts (the even runs', the odd's), as q4_K's: 8 chains of vpdpbusd, not 4 */
static inline __attribute__((always_inline)) void llm_tiles_dot6_avx2(int wide, const uint8_t *p,
                                                                      int64_t n_blocks, const llm_q8 *x,
                                                                      int64_t x_stride, int nc, float *out,
                                                                      int64_t out_stride) {
    const int tile_bytes = LLM_TILE_ROWS * 210, parts = nc == 1 ? 2 : 1;
    __m256 acc[4];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    int ahead[2];
    llm_prefetch_load(0, ahead);
    for (int64_t b = 0; b < n_blocks; b++, p += tile_bytes) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        const uint8_t *runs = p + 16;
#pragma GCC unroll 4
        for (int part = 0; part < 4; part++) { /* half n's quarters j and j + 2, which share their runs */
            for (int at = tile_bytes / 4 * part; at < tile_bytes / 4 * (part + 1); at += 64)
                llm_prefetch(p + at, ahead); /* a quarter of the tile's lines at a time, as q4_K's */
            int n = part / 2, j = part % 2;
#pragma GCC unroll 2
            for (int g = 0; g < 2; g++) {
                __m256i dq[2][2][4], dr[2][2][4]; /* [run's parity][quarter j, j + 2][token] */
                for (int u = 0; u < parts; u++)
                    for (int c = 0; c < nc; c++)
                        dq[u][0][c] = dq[u][1][c] = dr[u][0][c] = dr[u][1][c] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int c4 = 4 * g; c4 < 4 * g + 4; c4++) {
                    __m256i w[2];
                    const int u = c4 % parts;
                    llm_tiles_q6(runs, n, j, c4, w);
                    for (int c = 0; c < nc; c++)
                        for (int h = 0; h < 2; h++) {
                            const llm_q8 *xb = x + c * x_stride + 8 * b + 4 * n + j + 2 * h; /* 32 values */
                            int32_t q4, r4;
                            memcpy(&q4, xb->q + 4 * c4, 4);
                            dq[u][h][c] = llm_avx2_dpbusd(dq[u][h][c], w[h], _mm256_set1_epi32(q4));
                            if (!wide) continue;
                            memcpy(&r4, xb->r + 4 * c4, 4);
                            dr[u][h][c] = llm_avx2_dpbusd(dr[u][h][c], w[h], _mm256_set1_epi32(r4));
                        }
                }
                for (int h = 0; parts == 2 && h < 2; h++) {
                    dq[0][h][0] = _mm256_add_epi32(dq[0][h][0], dq[1][h][0]);
                    dr[0][h][0] = _mm256_add_epi32(dr[0][h][0], dr[1][h][0]);
                }
                for (int h = 0; h < 2; h++) {
                    int i = 8 * n + 2 * (j + 2 * h) + g;
                    __m256 d_scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(llm_tiles_scale6(runs, i)));
                    for (int c = 0; c < nc; c++) {
                        const llm_q8 *xb = x + c * x_stride + 8 * b + 4 * n + j + 2 * h;
                        __m256i dot = wide ? _mm256_add_epi32(_mm256_slli_epi32(dq[0][h][c], 8),
                                                              dr[0][h][c])
                                           : dq[0][h][c];
                        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(32 * xb->sum[g]));
                        __m256 times = _mm256_mul_ps(d_scale, _mm256_set1_ps(xb->d));
                        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), times, acc[c]);
                    }
                }
            }
        }
    }
    for (int c = 0; c < nc; c++) _mm256_storeu_ps(out + c * out_stride, acc[c]);
}

/* The kernel specialized to its type, activations and tokens: up to 4 tokens a call with AVX-512's 32
 * registers, 2 with AVX2's 16 (each token's sums are its own: the same bits however many share a call) */
#if defined(LLM_AVX512F)
#define LLM_TILE_TOKENS 4
#else
#define LLM_TILE_TOKENS 2
#endif
static void llm_tiles_dot(uint32_t type, int wide, const uint8_t *tile, int64_t cols, const llm_q8 *x,
                          int64_t x_stride, int nc, float *out, int64_t out_stride) {
#define LLM_TILES_CALL(k, s, T, W)                                                                         \
    (T == LLM_Q4_K   ? llm_tiles_dotk_avx2(0, W, tile, cols / 256, x + (s) * x_stride, x_stride, k,        \
                                           out + (s) * out_stride, out_stride)                             \
     : T == LLM_Q5_K ? llm_tiles_dotk_avx2(1, W, tile, cols / 256, x + (s) * x_stride, x_stride, k,        \
                                           out + (s) * out_stride, out_stride)                             \
     : T == LLM_Q6_K ? llm_tiles_dot6_avx2(W, tile, cols / 256, x + (s) * x_stride, x_stride, k,           \
                                           out + (s) * out_stride, out_stride)                             \
     : T == LLM_Q8_0 ? llm_tiles_dot8_avx2(W, tile, cols / 32, x + (s) * x_stride, x_stride, k,            \
                                           out + (s) * out_stride, out_stride)                             \
                     : llm_tiles_dot_avx2(T, W, tile, cols / 32, x + (s) * x_stride, x_stride, k,          \
                                          out + (s) * out_stride, out_stride))
#if LLM_TILE_TOKENS == 4
#define LLM_TILES_TOKENS(T, W) LLM_BY_TOKENS(nc, LLM_TILES_CALL, T, W)
#else
#define LLM_TILES_TOKENS(T, W)                                                                             \
    for (int s = 0; s < nc; s += 2) {                                                                      \
        if (nc - s >= 2) LLM_TILES_CALL(2, s, T, W);                                                       \
        else LLM_TILES_CALL(1, s, T, W);                                                                   \
    }
#endif
    if (type == LLM_Q4_0 && wide) { LLM_TILES_TOKENS(LLM_Q4_0, 1); }
    else if (type == LLM_Q4_0) { LLM_TILES_TOKENS(LLM_Q4_0, 0); }
    else if (type == LLM_Q4_1 && wide) { LLM_TILES_TOKENS(LLM_Q4_1, 1); }
    else if (type == LLM_Q4_1) { LLM_TILES_TOKENS(LLM_Q4_1, 0); }
    else if (type == LLM_Q5_0 && wide) { LLM_TILES_TOKENS(LLM_Q5_0, 1); }
    else if (type == LLM_Q5_0) { LLM_TILES_TOKENS(LLM_Q5_0, 0); }
    else if (type == LLM_Q5_1 && wide) { LLM_TILES_TOKENS(LLM_Q5_1, 1); }
    else if (type == LLM_Q5_1) { LLM_TILES_TOKENS(LLM_Q5_1, 0); }
    else if (type == LLM_Q8_0 && wide) { LLM_TILES_TOKENS(LLM_Q8_0, 1); }
    else if (type == LLM_Q8_0) { LLM_TILES_TOKENS(LLM_Q8_0, 0); }
    else if (type == LLM_Q4_K && wide) { LLM_TILES_TOKENS(LLM_Q4_K, 1); }
    else if (type == LLM_Q4_K) { LLM_TILES_TOKENS(LLM_Q4_K, 0); }
    else if (type == LLM_Q5_K && wide) { LLM_TILES_TOKENS(LLM_Q5_K, 1); }
    else if (type == LLM_Q5_K) { LLM_TILES_TOKENS(LLM_Q5_K, 0); }
    else if (wide) { LLM_TILES_TOKENS(LLM_Q6_K, 1); }
    else { LLM_TILES_TOKENS(LLM_Q6_K, 0); }
#undef LLM_TILES_TOKENS
#undef LLM_TILES_CALL
}

/* Prefill: a tile of weight rows unpacked once for every token of the step ("packing", as BLAS libraries
 * do), from LLM_PACK_MIN_TOKENS on. The row-at-a-time products above unpack each weight block again for
 * every 4 tokens and add up each product across the 8 lanes of a register. Packed, 8 rows lie side by side,
 * their stored values interleaved 4 bytes at a time: one _mm256_dpbusd multiplies 4 values of each of the 8
 * rows by the same 4 activations (broadcast), and lane r of the sum is row r's. The scales are vectors over
 * the 8 rows too, so that a group of 32 values costs 8 integer instructions and a few float ones per token
 * for 8 rows, with no sum across lanes. The integer parts are those of llm_q8_dot_ref: the stored values'
 * products, less the offset times the activations' sums, per half of 16 values when the sub-blocks are 16
 * long. */
typedef struct {
    float scale[2][LLM_PACK_ROWS];  /* per half of 16 values: d * the sub-block's scale */
    float min[2][LLM_PACK_ROWS];    /* per half: dmin * the sub-block's minimum, which the x sums multiply */
} llm_pack_scales;
typedef struct {
    uint8_t q[8][LLM_PACK_ROWS][4]; /* [chunk j][row r]: stored values 4j..4j+3 of row r in this group */
    llm_pack_scales s;
} llm_pack_group;
/* The same group with its values widened to 16 bits, 2 at a time (llm_pack_pairs_of below) */
typedef struct {
    int16_t q[16][LLM_PACK_ROWS][2]; /* [pair j][row r]: stored values 2j, 2j + 1 of row r */
    llm_pack_scales s;
} llm_pack_pairs;

/* q8_0's bytes are signed: with VNNI they are stored + 128 (an offset like q4_0's 8); without, where
 * _mm256_maddubs_epi16 would overflow on them, they stay signed and meet x as |w| times x with w's sign. */
static inline __attribute__((always_inline)) int llm_pack_two_halves(uint32_t type) {
    return type == LLM_Q2_K || type == LLM_Q3_K || type == LLM_Q6_K; /* sub-blocks of 16 */
}
static inline __attribute__((always_inline)) int llm_pack_has_min(uint32_t type) {
    return type == LLM_Q4_1 || type == LLM_Q5_1 || type == LLM_Q2_K || type == LLM_Q4_K || type == LLM_Q5_K;
}
static inline __attribute__((always_inline)) int llm_pack_offset(uint32_t type) {
    return type == LLM_Q8_0 ? (LLM_AVX2_VNNI ? 128 : 0) : type == LLM_Q4_0 ? 8 : type == LLM_Q5_0 ? 16 :
           type == LLM_MXFP4 ? 12 : type == LLM_Q3_K ? 4 : type == LLM_Q6_K ? 32 : 0;
}

/* Without VNNI, _mm256_maddubs_epi16 gives a chunk's products as pairs added in 16 bits, and
 * _mm256_madd_epi16 widens them to 32 bits. Where the pairs of all of a half's chunks (8, or 4 in sub-blocks
 * of 16) fit 16 bits (each at most 2 * 128 * the type's largest stored value), they add up there and are
 * widened once at the end, one multiply for them all, not one each: the same integers (SmolLM2 Q4_1, 16
 * tokens: 13% fewer instructions, 7% less time). */
static inline __attribute__((always_inline)) int llm_pack_adds16(uint32_t type) {
    int most = type == LLM_Q2_K ? 3 : type == LLM_Q3_K ? 7 : type == LLM_MXFP4 ? 24 : type == LLM_Q6_K ? 63 :
               type == LLM_Q5_0 || type == LLM_Q5_1 || type == LLM_Q5_K ? 31 : type == LLM_Q8_0 ? 128 : 15;
    return !LLM_AVX2_VNNI && 2 * 128 * most * (llm_pack_two_halves(type) ? 4 : 8) <= 32767;
}
/* Without VNNI, 16-bit activations meet the weights packed as 16-bit pairs (llm_pack_pairs): each
 * activation is one 16-bit integer, 256 q + r (at most 32,639 in size), and one _mm256_madd_epi16 per 2
 * values of the 8 rows gives their products added in 32 bits, the same integers as w . q and w . r apart,
 * which take a maddubs each and, where their 16-bit pairs cannot add up there (q8_0's signed bytes, 5- and
 * 6-bit values), a widening multiply each too (q8_0: two sign flips as well). SmolLM2 pp512, one thread,
 * Sapphire Rapids, built for AVX2: Q4_K_M (mostly q5_0) 1.23 times as fast as the two products, Q4_1 1.07;
 * Q8_0, Zen 3: 1.35. */
static inline __attribute__((always_inline)) int llm_pack_pairs_of(int wide) {
    return wide && !LLM_AVX2_VNNI;
}
static inline __attribute__((always_inline)) size_t llm_pack_group_bytes(int wide) {
    return llm_pack_pairs_of(wide) ? sizeof(llm_pack_pairs) : sizeof(llm_pack_group);
}

/* 8 registers of 8 32-bit lanes transposed: lane j of register r goes to lane r of register j */
static inline void llm_avx2_transpose8(__m256i v[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);      /* per 128-bit lane: r0 r1 of dwords 0, 1 */
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);  /* dwords 2, 3 */
    }
    for (int i = 0; i < 8; i += 4)
        for (int k = 0; k < 2; k++) {
            u[i + 2 * k] = _mm256_unpacklo_epi64(t[i + k], t[i + 2 + k]);      /* 4 rows of dword 2k */
            u[i + 2 * k + 1] = _mm256_unpackhi_epi64(t[i + k], t[i + 2 + k]);  /* 4 rows of dword 2k + 1 */
        }
    for (int j = 0; j < 4; j++) { /* the 128-bit halves: rows 0-3 from u[j], rows 4-7 from u[4 + j] */
        v[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
        v[j + 4] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
    }
}

/* Rows of a weight (n_rows of them, LLM_PACK_ROWS at most: the rest are zeros), n values each, into n / 32
 * packed groups: each group's rows of 32 stored bytes, transposed 8 rows at a time as 8 x 8 lanes of 4 bytes
 * (or, widened to 16 bits for 16-bit activations where llm_pack_pairs_of says, as 2 x 8 x 8 lanes of 2
 * values) */
static inline __attribute__((always_inline)) void llm_pack_rows(uint32_t type, int wide, const uint8_t *rows,
                                                                size_t row_bytes, int n_rows, int64_t n,
                                                                void *pack) {
    uint64_t block_bytes, block_values;
    llm_dtype_info(type, &block_bytes, &block_values);
    const int groups_per_block = (int)block_values / 32, halves = llm_pack_two_halves(type) ? 2 : 1;
    const int pairs = llm_pack_pairs_of(wide);
    /* a 32-value block's scale is its f16 d (and, for the _1 types, its minimum its f16 m): 8 rows' converted
     * at once, the same floats as d * 1 and m * -1 below (one f16 at a time, the scales took half of the
     * packing: SmolLM2 Q4_1, 17 tokens) */
    const int f16_scales = type == LLM_Q4_0 || type == LLM_Q4_1 || type == LLM_Q5_0 || type == LLM_Q5_1 ||
                           type == LLM_Q8_0;
    llm_qblock b[LLM_PACK_ROWS];
    for (int r = n_rows; r < LLM_PACK_ROWS; r++) memset(&b[r], 0, offsetof(llm_qblock, q)); /* zeros */
    /* the rows are read a group at a time across all of them, a few cache lines of each before the next: too
     * short a run for the hardware's prefetcher, so the cache lines are asked for from memory first, all at
     * once (SmolLM2 Q4_1, one thread: 8 tokens' products in 0.8 of the time, 16 tokens' in 0.88) */
    for (size_t at = 0; at < (size_t)n_rows * row_bytes; at += 64)
        _mm_prefetch((const char *)rows + at, _MM_HINT_T0);
    for (int64_t g0 = 0; g0 < n / 32; g0 += groups_per_block) {
        const uint8_t *p = rows + (size_t)(g0 / groups_per_block) * block_bytes;
        uint16_t d16[LLM_PACK_ROWS] = {0}, m16[LLM_PACK_ROWS] = {0};
        for (int r = 0; r < n_rows; r++) {
            if (f16_scales) {
                memcpy(&d16[r], p + (size_t)r * row_bytes, 2);
                if (llm_pack_has_min(type)) memcpy(&m16[r], p + (size_t)r * row_bytes + 2, 2);
            } else
                llm_qblock_read_scales(type, p + (size_t)r * row_bytes, &b[r]);
        }
        for (int g = 0; g < groups_per_block; g++) {
            uint8_t *at = (uint8_t *)pack + (size_t)(g0 + g) * llm_pack_group_bytes(wide);
            llm_pack_scales *s = pairs ? &((llm_pack_pairs *)at)->s : &((llm_pack_group *)at)->s;
            for (int r0 = 0; r0 < LLM_PACK_ROWS; r0 += 8) { /* 8 rows: r0 .. r0 + 7 */
                __m256i v[8];
                for (int r = 0; r < 8; r++) {
                    v[r] = r0 + r < n_rows ? llm_avx2_group(type, p + (size_t)(r0 + r) * row_bytes, g)
                                           : _mm256_setzero_si256();
                    if (type == LLM_Q8_0 && LLM_AVX2_VNNI) /* stored + 128: unsigned */
                        v[r] = _mm256_xor_si256(v[r], _mm256_set1_epi8((char)0x80));
                }
                if (pairs) { /* values 0-15, then 16-31, sign-extended (q8_0's), transposed in pairs */
                    llm_pack_pairs *pp = (llm_pack_pairs *)at;
                    for (int part = 0; part < 2; part++) {
                        __m256i v16[8];
                        for (int r = 0; r < 8; r++)
                            v16[r] = _mm256_cvtepi8_epi16(part ? _mm256_extracti128_si256(v[r], 1)
                                                               : _mm256_castsi256_si128(v[r]));
                        llm_avx2_transpose8(v16);
                        for (int j = 0; j < 8; j++)
                            _mm256_storeu_si256((__m256i *)pp->q[part * 8 + j][r0], v16[j]);
                    }
                } else {
                    llm_pack_group *pg = (llm_pack_group *)at;
                    llm_avx2_transpose8(v);
                    for (int j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)pg->q[j][r0], v[j]);
                }
                if (f16_scales) {
                    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)&d16[r0]));
                    __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)&m16[r0]));
                    _mm256_storeu_ps(s->scale[0] + r0, d);
                    _mm256_storeu_ps(s->min[0] + r0, llm_pack_has_min(type) ?
                                     _mm256_sub_ps(_mm256_setzero_ps(), m) : _mm256_setzero_ps());
                }
            }
            for (int h = 0; !f16_scales && h < halves; h++)
                for (int r = 0; r < LLM_PACK_ROWS; r++) {
                    int k = (g * 32 + h * 16) / (halves == 2 ? 16 : 32);
                    s->scale[h][r] = b[r].d * (float)b[r].scale[k];
                    s->min[h][r] = b[r].dmin * (float)b[r].min[k];
                }
        }
    }
}

/* sum plus one chunk's products: 4 stored values of each of the 8 rows times the same 4 activations */
static inline __attribute__((always_inline)) __m256i llm_pack_chunk(uint32_t type, int add16, __m256i sum,
                                                                    __m256i w, const int8_t *four_x) {
    int32_t four;
    memcpy(&four, four_x, 4);
    __m256i xs = _mm256_set1_epi32(four);
    if (add16) return _mm256_add_epi16(sum, _mm256_maddubs_epi16(w, xs));
    if (type == LLM_Q8_0 && !LLM_AVX2_VNNI) /* signed: |w| times x, w's sign */
        return llm_avx2_dpbusd(sum, _mm256_sign_epi8(w, w), _mm256_sign_epi8(xs, w));
    return llm_avx2_dpbusd(sum, w, xs);
}

#if LLM_PACK_ROWS == 16
/* 16 packed rows times nc tokens (1 to 4, x_stride blocks apart): out[c * out_stride + r], as below with
 * 512-bit registers: one vpdpbusd per 4 values of the 16 rows and a token (and one more for r with 16-bit
 * activations), lane by lane the same integers and floats as the 8-row version (SmolLM2 Q8_0, 512 tokens,
 * one thread: pp512 1.28 to 1.39 times as fast) */
static inline __attribute__((always_inline)) void llm_pack_dot(uint32_t type, int wide, const void *pack,
                                                               int64_t n_groups, const llm_q8 *x,
                                                               int64_t x_stride, int nc,
                                                               float *out, int64_t out_stride) {
    const int halves = llm_pack_two_halves(type) ? 2 : 1, offset = llm_pack_offset(type);
    __m512 acc[4];
    for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t g = 0; g < n_groups; g++) {
        const llm_pack_group *pg = (const llm_pack_group *)pack + g;
        for (int h = 0; h < halves; h++) {
            __m512i dot[4], fine[4];
            for (int c = 0; c < nc; c++) dot[c] = fine[c] = _mm512_setzero_si512();
            for (int j = h * 8 / halves; j < (h + 1) * 8 / halves; j++) {
                __m512i w = _mm512_loadu_si512(pg->q[j]);
                for (int c = 0; c < nc; c++) {
                    const llm_q8 *xg = x + c * x_stride + g;
                    int32_t four;
                    memcpy(&four, xg->q + 4 * j, 4);
                    dot[c] = _mm512_dpbusd_epi32(dot[c], w, _mm512_set1_epi32(four));
                    if (wide) {
                        memcpy(&four, xg->r + 4 * j, 4);
                        fine[c] = _mm512_dpbusd_epi32(fine[c], w, _mm512_set1_epi32(four));
                    }
                }
            }
            for (int c = 0; wide && c < nc; c++) /* 256 (w . q) + w . r */
                dot[c] = _mm512_add_epi32(_mm512_slli_epi32(dot[c], 8), fine[c]);
            __m512 scale = _mm512_loadu_ps(pg->s.scale[h]), min = _mm512_loadu_ps(pg->s.min[h]);
            for (int c = 0; c < nc; c++) {
                const llm_q8 *xg = x + c * x_stride + g;
                int sum = halves == 2 ? xg->sum[h] : xg->sum[0] + xg->sum[1];
                if (offset) dot[c] = _mm512_sub_epi32(dot[c], _mm512_set1_epi32(offset * sum));
                __m512 xd = _mm512_set1_ps(xg->d);
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[c]), _mm512_mul_ps(scale, xd), acc[c]);
                if (llm_pack_has_min(type))
                    acc[c] = _mm512_fnmadd_ps(min, _mm512_set1_ps(xg->d * (float)sum), acc[c]);
            }
        }
    }
    for (int c = 0; c < nc; c++) _mm512_storeu_ps(out + c * out_stride, acc[c]);
}

#if defined(LLM_AMX)
/* A prefill's packed products with AMX, 16 tokens at a time. The 16 tokens' activation bytes of a group
 * (32 values; 16, a half, in sub-blocks of 16) are a 16-row tile; the packed group's chunks, 16 rows' 4
 * bytes side by side, are already the tile the multiply's other side takes; and one tdpbsud (signed
 * activations times unsigned stored values) gives the 16 x 16 integer sums that the vpdpbusd above take 8
 * instructions a token for (16 with 16-bit activations). The same integers, then the same float steps in
 * the same order: the same bits as llm_pack_dot. Each group's sums go through memory (a tile store, then
 * vector loads) for its scales: the float steps, not the multiply, set the pace (one thread of a Sapphire
 * Rapids, q5_K, 16-bit activations: a step of 16 tokens and 16 rows 47 ns, 30 of them the tiles' loads,
 * products and stores alone, 25 the floats alone; vpdpbusd's 97). The multiplier works beside the vector
 * ports: each step's products are asked for before the previous step's floats, into the other of two pairs
 * of result tiles. */

/* AMX is used where the CPU has it (cpuid leaf 7: tiles and their int8 products) and Linux grants the
 * process the tiles' state (arch_prctl's ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, 18): a virtual machine
 * may advertise AMX and not grant it. Asked once; llm_amx_state is 1 (used), -1 (not), 0 (not asked yet),
 * which a test sets to -1 to compare with the vpdpbusd products */
static int llm_amx_state;
static int llm_amx_usable(void) {
    int state = __atomic_load_n(&llm_amx_state, __ATOMIC_RELAXED);
    if (state) return state > 0;
    unsigned eax, ebx, ecx, edx;
    state = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 24 & 1) && (edx >> 25 & 1) &&
            syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
    __atomic_store_n(&llm_amx_state, state, __ATOMIC_RELAXED);
    return state > 0;
}

/* The tiles, for products of k values (32; 16 in sub-blocks of 16): 0 and 1 the tokens' q and r bytes (16
 * rows of k), 2 the packed chunks (k / 4 rows of 16 x 4 bytes), 3 and 4 the products with q and with r (16
 * x 16 32-bit sums), 5 and 6 the next step's */
static void llm_amx_configure(int k) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t bytes_per_row[16];
        uint8_t rows[16];
    } config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 7; t++) {
        config.rows[t] = (uint8_t)(t == 2 ? k / 4 : 16);
        config.bytes_per_row[t] = (uint16_t)(t < 2 ? k : 64);
    }
    /* not _tile_loadconfig: GCC 12's tells the compiler that it reads 8 bytes of the 64, and the stores of
     * the rest can go */
    __asm__ volatile("ldtilecfg %0" ::"m"(config));
}

/* 16 tokens' activations (x: n_groups blocks apart) laid out for the tiles, every group's */
static void llm_amx_layout(uint32_t type, const llm_q8 *x, int64_t n_groups, llm_amx_group *numbers) {
    const int halves = llm_pack_two_halves(type) ? 2 : 1, offset = llm_pack_offset(type);
    for (int64_t g = 0; g < n_groups; g++)
        for (int c = 0; c < LLM_AMX_TOKENS; c++) {
            const llm_q8 *xg = x + c * n_groups + g;
            memcpy(numbers[g].q[c], xg->q, 32);
            memcpy(numbers[g].r[c], xg->r, 32);
            numbers[g].d[c] = xg->d;
            for (int h = 0; h < halves; h++) {
                int sum = halves == 2 ? xg->sum[h] : xg->sum[0] + xg->sum[1];
                numbers[g].ds[h][c] = xg->d * (float)sum;
                numbers[g].offset_sum[h][c] = offset * sum;
            }
        }
}

/* one step's products into result tiles 3, 4 (set 0) or 5, 6 (set 1); then, a step later, out of them */
static inline __attribute__((always_inline)) void llm_amx_products(int set, int wide, const int8_t *q,
                                                                   const int8_t *r, size_t stride,
                                                                   const void *chunks) {
    _tile_loadd(0, q, stride);
    _tile_loadd(2, chunks, 64);
    if (set) { _tile_zero(5); _tile_dpbsud(5, 0, 2); }
    else { _tile_zero(3); _tile_dpbsud(3, 0, 2); }
    if (!wide) return;
    _tile_loadd(1, r, stride);
    if (set) { _tile_zero(6); _tile_dpbsud(6, 1, 2); }
    else { _tile_zero(4); _tile_dpbsud(4, 1, 2); }
}
static inline __attribute__((always_inline)) void llm_amx_sums(int set, int wide, int32_t (*q)[16],
                                                               int32_t (*r)[16]) {
    if (set) _tile_stored(5, q, 64);
    else _tile_stored(3, q, 64);
    if (wide && set) _tile_stored(6, r, 64);
    else if (wide) _tile_stored(4, r, 64);
}

/* 16 packed rows times 16 tokens (x: their groups, llm_amx_layout's): out[c * out_stride + r]. The tiles are
 * configured (llm_amx_configure) */
static inline __attribute__((always_inline)) void llm_pack_dot_amx(uint32_t type, int wide, const void *pack,
                                                                   int64_t n_groups, const llm_amx_group *x,
                                                                   float *out, int64_t out_stride) {
    const int halves = llm_pack_two_halves(type) ? 2 : 1, k = 32 / halves;
    const size_t stride = 32;
    const llm_pack_group *groups = (const llm_pack_group *)pack;
    const int64_t steps = n_groups * halves;
    /* the tile loads' asm does not tell the compiler what they read: every store before them is made first */
    __asm__ volatile("" ::: "memory");
    int32_t sum_q[2][16][16] __attribute__((aligned(64))), sum_r[2][16][16] __attribute__((aligned(64)));
    __m512 acc[LLM_AMX_TOKENS];
    for (int c = 0; c < LLM_AMX_TOKENS; c++) acc[c] = _mm512_setzero_ps();
    llm_amx_products(0, wide, x[0].q[0], x[0].r[0], stride, groups[0].q[0]);
    for (int64_t s = 0; s < steps; s++) {
        const int set = (int)(s & 1);
        if (s + 1 < steps) { /* the next step's products, into the other set */
            int64_t g = (s + 1) / halves;
            int h = (int)((s + 1) % halves);
            const int8_t *q = x[g].q[0] + h * k, *r = x[g].r[0] + h * k;
            if (set) llm_amx_products(0, wide, q, r, stride, groups[g].q[h * 4]);
            else llm_amx_products(1, wide, q, r, stride, groups[g].q[h * 4]);
        }
        if (set) llm_amx_sums(1, wide, sum_q[1], sum_r[1]);
        else llm_amx_sums(0, wide, sum_q[0], sum_r[0]);
        /* llm_pack_dot's float steps, token by token */
        int64_t g = s / halves;
        int h = (int)(s % halves);
        const llm_amx_group *xg = x + g;
        __m512 scale = _mm512_loadu_ps(groups[g].s.scale[h]), min = _mm512_loadu_ps(groups[g].s.min[h]);
#pragma GCC unroll 16
        for (int c = 0; c < LLM_AMX_TOKENS; c++) { /* unrolled: the 16 sums stay in registers */
            __m512i dot = _mm512_load_si512(sum_q[set][c]);
            if (wide) /* 256 (w . q) + w . r */
                dot = _mm512_add_epi32(_mm512_slli_epi32(dot, 8), _mm512_load_si512(sum_r[set][c]));
            if (llm_pack_offset(type)) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(xg->offset_sum[h][c]));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, _mm512_set1_ps(xg->d[c])),
                                     acc[c]);
            if (llm_pack_has_min(type))
                acc[c] = _mm512_fnmadd_ps(min, _mm512_set1_ps(xg->ds[h][c]), acc[c]);
        }
    }
    for (int c = 0; c < LLM_AMX_TOKENS; c++) _mm512_storeu_ps(out + c * out_stride, acc[c]);
}
#endif
#else
/* 8 packed rows times nc tokens (1 to 4, x_stride blocks apart): out[c * out_stride + r]. With 16-bit
 * activations each weight register meets q and r: two products, joined as 256 (w . q) + w . r; or, packed in
 * pairs, it meets a, 256 q + r as 16-bit integers */
static inline __attribute__((always_inline)) void llm_pack_dot(uint32_t type, int wide, const void *pack,
                                                               int64_t n_groups, const llm_q8 *x,
                                                               int64_t x_stride, int nc,
                                                               float *out, int64_t out_stride) {
    const int halves = llm_pack_two_halves(type) ? 2 : 1, offset = llm_pack_offset(type);
    const int pairs = llm_pack_pairs_of(wide), add16 = llm_pack_adds16(type);
    __m256 acc[4];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t g = 0; g < n_groups; g++) {
        const uint8_t *at = (const uint8_t *)pack + (size_t)g * llm_pack_group_bytes(wide);
        const llm_pack_scales *s = pairs ? &((const llm_pack_pairs *)at)->s
                                         : &((const llm_pack_group *)at)->s;
        for (int h = 0; h < halves; h++) {
            __m256i dot[4], fine[4];
            for (int c = 0; c < nc; c++) dot[c] = fine[c] = _mm256_setzero_si256();
            if (pairs) { /* 2 values at a time: 256 q + r at once; unrolled twice, not 16 times: GCC then
                          * issues the loads first and spills the products (AVX2, SmolLM2 Q8_0 pp512, one
                          * thread: 1.35 times as fast) */
#pragma GCC unroll 2
                for (int j = h * 16 / halves; j < (h + 1) * 16 / halves; j++) {
                    __m256i w = _mm256_loadu_si256((const __m256i *)((const llm_pack_pairs *)at)->q[j]);
                    for (int c = 0; c < nc; c++) {
                        int32_t two;
                        memcpy(&two, x[c * x_stride + g].a + 2 * j, 4);
                        dot[c] = _mm256_add_epi32(dot[c], _mm256_madd_epi16(w, _mm256_set1_epi32(two)));
                    }
                }
            } else { /* a loop, unrolled twice only where 32 vector registers hold both turns (AVX-512: Q8_0
                    * prompts 1.06 times as fast); with AVX2's 16, GCC issues all the chunks' products first
                    * and spills them (0.75 times) */
#if defined(LLM_AVX512VL)
#pragma GCC unroll 2
#else
#pragma GCC unroll 1
#endif
                for (int j = h * 8 / halves; j < (h + 1) * 8 / halves; j++) {
                    __m256i w = _mm256_loadu_si256((const __m256i *)((const llm_pack_group *)at)->q[j]);
                    for (int c = 0; c < nc; c++) {
                        const llm_q8 *xg = x + c * x_stride + g;
                        dot[c] = llm_pack_chunk(type, add16, dot[c], w, xg->q + 4 * j);
                        if (wide) fine[c] = llm_pack_chunk(type, add16, fine[c], w, xg->r + 4 * j);
                    }
                }
                for (int c = 0; add16 && c < nc; c++) { /* widened: 8 sums of 4 products */
                    dot[c] = _mm256_madd_epi16(dot[c], _mm256_set1_epi16(1));
                    fine[c] = _mm256_madd_epi16(fine[c], _mm256_set1_epi16(1));
                }
                for (int c = 0; wide && c < nc; c++) /* 256 (w . q) + w . r */
                    dot[c] = _mm256_add_epi32(_mm256_slli_epi32(dot[c], 8), fine[c]);
            }
            __m256 scale = _mm256_loadu_ps(s->scale[h]), min = _mm256_loadu_ps(s->min[h]);
            for (int c = 0; c < nc; c++) {
                const llm_q8 *xg = x + c * x_stride + g;
                int sum = halves == 2 ? xg->sum[h] : xg->sum[0] + xg->sum[1];
                if (offset) dot[c] = _mm256_sub_epi32(dot[c], _mm256_set1_epi32(offset * sum));
                __m256 xd = _mm256_set1_ps(xg->d);
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[c]), _mm256_mul_ps(scale, xd), acc[c]);
                if (llm_pack_has_min(type))
                    acc[c] = _mm256_fnmadd_ps(min, _mm256_set1_ps(xg->d * (float)sum), acc[c]);
            }
        }
    }
    for (int c = 0; c < nc; c++) _mm256_storeu_ps(out + c * out_stride, acc[c]);
}
#endif

/* The two above, each specialized to its type and activations (and the product to 4 tokens or 1) */
static void llm_pack(uint32_t type, int wide, const uint8_t *rows, size_t row_bytes, int n_rows, int64_t n,
                     void *pack) {
#define LLM_PACK_ROWS_CASE(T)                                                                              \
    case T:                                                                                                \
        if (wide) llm_pack_rows(T, 1, rows, row_bytes, n_rows, n, pack);                                   \
        else llm_pack_rows(T, 0, rows, row_bytes, n_rows, n, pack);                                        \
        return;
    switch (type) {
    LLM_PACK_ROWS_CASE(LLM_Q8_0) LLM_PACK_ROWS_CASE(LLM_Q4_0) LLM_PACK_ROWS_CASE(LLM_Q4_1)
    LLM_PACK_ROWS_CASE(LLM_Q5_0) LLM_PACK_ROWS_CASE(LLM_Q5_1) LLM_PACK_ROWS_CASE(LLM_Q2_K)
    LLM_PACK_ROWS_CASE(LLM_Q3_K) LLM_PACK_ROWS_CASE(LLM_Q4_K) LLM_PACK_ROWS_CASE(LLM_Q5_K)
    LLM_PACK_ROWS_CASE(LLM_MXFP4) LLM_PACK_ROWS_CASE(LLM_Q6_K)
    }
#undef LLM_PACK_ROWS_CASE
}
/* nc tokens (1 to 4), or, with amx (their activations laid out by llm_amx_layout), 16 through AMX's tiles */
static void llm_pack_mul(uint32_t type, int wide, const void *pack, int64_t n_groups, const llm_q8 *x,
                         int64_t x_stride, int nc, const void *amx, float *out, int64_t out_stride) {
#define LLM_PACK_CALL(k, s, T, W) \
    llm_pack_dot(T, W, pack, n_groups, x + (s) * x_stride, x_stride, k, out + (s) * out_stride, out_stride)
#if defined(LLM_AMX)
#define LLM_PACK_WIDTHS(T, W)                                                                              \
    if (amx) llm_pack_dot_amx(T, W, pack, n_groups, (const llm_amx_group *)amx, out, out_stride);         \
    else LLM_BY_TOKENS(nc, LLM_PACK_CALL, T, W);
#else
#define LLM_PACK_WIDTHS(T, W) LLM_BY_TOKENS(nc, LLM_PACK_CALL, T, W); (void)amx;
#endif
#define LLM_PACK_CASE(T)                                                                                   \
    case T:                                                                                                \
        if (wide) { LLM_PACK_WIDTHS(T, 1) } else { LLM_PACK_WIDTHS(T, 0) }                                 \
        return;
    switch (type) {
    LLM_PACK_CASE(LLM_Q8_0) LLM_PACK_CASE(LLM_Q4_0) LLM_PACK_CASE(LLM_Q4_1) LLM_PACK_CASE(LLM_Q5_0)
    LLM_PACK_CASE(LLM_Q5_1) LLM_PACK_CASE(LLM_Q2_K) LLM_PACK_CASE(LLM_Q3_K) LLM_PACK_CASE(LLM_Q4_K)
    LLM_PACK_CASE(LLM_Q5_K) LLM_PACK_CASE(LLM_Q6_K) LLM_PACK_CASE(LLM_MXFP4)
    }
#undef LLM_PACK_CASE
#undef LLM_PACK_WIDTHS
#undef LLM_PACK_CALL
}

/* Rows packed (as llm_pack_rows packs them) straight from their decode tiles (n_rows a multiple of 8): a
 * tile's runs are the packed group's chunks already, 4 values of each of 8 rows side by side (q4_0, q4_1: run
 * c holds chunk c in its low nibbles, chunk 4 + c in its high ones; q5_0, q5_1: run 1 + c, with the fifth
 * bits of run 0; q8_0: run c holds chunk c; q4_K: runs 3 + 8k.. hold sub-block 2k's chunks in their low
 * nibbles, 2k + 1's in their high ones; q5_K: runs 11 + 8k.. the same, with the fifth bits of runs 3 + c;
 * q6_K: llm_tiles_q6), and its 8 rows' scales lie together */
static void llm_pack_tiles(uint32_t type, int wide, const uint8_t *tiles, size_t row_bytes, int n_rows,
                           int64_t n, void *pack) {
    uint64_t block_bytes, block_values;
    llm_dtype_info(type, &block_bytes, &block_values);
    const int halves = llm_tiles_halves(type), groups_per_block = (int)block_values / 32;
    const __m256i low4 = _mm256_set1_epi8(15), pairs_order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int64_t g = 0; g < n / 32; g++) {
        uint8_t *at = (uint8_t *)pack + (size_t)g * llm_pack_group_bytes(wide);
        llm_pack_pairs *pairs = (llm_pack_pairs *)at;
        llm_pack_group *group = (llm_pack_group *)at;
        llm_pack_scales *s = llm_pack_pairs_of(wide) ? &pairs->s : &group->s;
        int sub = (int)(g % groups_per_block); /* the group's 32 values in their block (q4_K, q5_K, q6_K) */
        for (int r0 = 0; r0 < LLM_PACK_ROWS; r0 += 8) { /* a tile: rows r0 .. r0 + 7 */
            const uint8_t *tile = tiles + (size_t)r0 * row_bytes +
                                  (size_t)(g / groups_per_block) * LLM_TILE_ROWS * block_bytes;
            const uint8_t *runs = tile + 16 * halves;
            __m256i chunk[8], qh = _mm256_setzero_si256(); /* q5_0's and q5_1's fifth bits: their run 0 */
            int fifth_run = type == LLM_Q5_0 || type == LLM_Q5_1;
            if (fifth_run && r0 < n_rows) qh = _mm256_loadu_si256((const __m256i *)runs);
            for (int c = 0; c < 8; c++) {
                if (r0 >= n_rows) { chunk[c] = _mm256_setzero_si256(); continue; }
                if (type == LLM_Q6_K) { /* quarter sub % 4 of half sub / 4 */
                    __m256i w[2];
                    llm_tiles_q6(runs, sub / 4, sub % 2, c, w);
                    chunk[c] = w[sub % 4 / 2];
                    continue;
                }
                if (type == LLM_Q8_0) { /* run c, signed bytes (stored + 128 with VNNI, as llm_pack_rows) */
                    chunk[c] = _mm256_loadu_si256((const __m256i *)(runs + 32 * c));
                    if (LLM_AVX2_VNNI) chunk[c] = _mm256_xor_si256(chunk[c], _mm256_set1_epi8((char)0x80));
                    continue;
                }
                int k_quant = type == LLM_Q4_K || type == LLM_Q5_K;
                int run = type == LLM_Q4_K ? 3 + 8 * (sub / 2) + c : type == LLM_Q5_K ? 11 + 8 * (sub / 2) + c
                        : fifth_run ? 1 + (c & 3) : c & 3;
                int shift = k_quant ? 4 * (sub & 1) : c < 4 ? 0 : 4;
                __m256i w = _mm256_loadu_si256((const __m256i *)(runs + 32 * run));
                chunk[c] = _mm256_and_si256(_mm256_srli_epi16(w, shift), low4);
                if (fifth_run) chunk[c] = _mm256_or_si256(chunk[c], llm_tiles_fifth(qh, c));
                if (type == LLM_Q5_K) /* bit sub of the run of fifth bits 3 + c */
                    chunk[c] = _mm256_or_si256(chunk[c], llm_tiles_fifth_k(_mm256_loadu_si256(
                                                             (const __m256i *)(runs + 32 * (3 + c))), sub));
            }
            /* the scales and mins as llm_pack_rows stores them: one pair for the 32 values, or (q6_K) one for
             * each sub-block of 16 */
            __m256 scale[2], min[2];
            scale[0] = scale[1] = min[0] = min[1] = _mm256_setzero_ps();
            if (r0 < n_rows) {
                __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tile));
                __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile + 16))); /* m, dmin */
                scale[0] = d;
                if (type == LLM_Q4_1 || type == LLM_Q5_1) /* values d q + m */
                    min[0] = _mm256_sub_ps(_mm256_setzero_ps(), m);
                if (type == LLM_Q4_K || type == LLM_Q5_K) { /* values d scale_j q - dmin min_j */
                    __m256i scale_runs[3], scale_j, min_j;
                    for (int u = 0; u < 3; u++)
                        scale_runs[u] = _mm256_loadu_si256((const __m256i *)(runs + 32 * u));
                    llm_tiles_scale_min(scale_runs, sub, &scale_j, &min_j);
                    scale[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(scale_j));
                    min[0] = _mm256_mul_ps(m, _mm256_cvtepi32_ps(min_j));
                }
                for (int h = 0; type == LLM_Q6_K && h < 2; h++) { /* d times sub-block i's signed scale */
                    int i = 2 * sub + h;
                    scale[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(llm_tiles_scale6(runs, i)));
                }
            }
            for (int h = 0; h < (type == LLM_Q6_K ? 2 : 1); h++) {
                _mm256_storeu_ps(s->scale[h] + r0, scale[h]);
                _mm256_storeu_ps(s->min[h] + r0, min[h]);
            }
            if (llm_pack_pairs_of(wide)) /* chunk j's 4 values of a row as pairs 2j and 2j + 1, in 16 bits */
                for (int j = 0; j < 8; j++) { /* (sign-extended: q8_0's are signed, the others under 64) */
                    __m256i rows03 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(chunk[j]));
                    __m256i rows47 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(chunk[j], 1));
                    /* pair 2j of rows 0-3, then pair 2j + 1; rows 4-7 the same */
                    rows03 = _mm256_permutevar8x32_epi32(rows03, pairs_order);
                    rows47 = _mm256_permutevar8x32_epi32(rows47, pairs_order);
                    _mm256_storeu_si256((__m256i *)pairs->q[2 * j][r0],
                                        _mm256_permute2x128_si256(rows03, rows47, 0x20));
                    _mm256_storeu_si256((__m256i *)pairs->q[2 * j + 1][r0],
                                        _mm256_permute2x128_si256(rows03, rows47, 0x31));
                }
            else
                for (int j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)group->q[j][r0], chunk[j]);
        }
    }
}

/* One tile of rows r0..r1 (of rows, at tile_data: rows, or decode tiles where tiled), packed 8 rows at a
 * time, times every token's quantized activations */
static void llm_matmul_packed(float *out, const llm_q8 *xq, int wide, uint32_t type,
                              const uint8_t *tile_data, int tiled, size_t row_bytes, int64_t r0, int64_t r1,
                              int64_t rows, int64_t cols, int T, uint8_t *pack, const void *amx_x) {
    int64_t n_groups = cols / 32;
    size_t pack_bytes = (size_t)n_groups * llm_pack_group_bytes(wide); /* 8 rows' */
    int n_packs = (int)((r1 - r0 + LLM_PACK_ROWS - 1) / LLM_PACK_ROWS);
    for (int i = 0; i < n_packs; i++) {
        int64_t n_rows = r1 - r0 - i * LLM_PACK_ROWS;
        const uint8_t *first = tile_data + (size_t)i * LLM_PACK_ROWS * row_bytes;
        int n_packed = n_rows < LLM_PACK_ROWS ? (int)n_rows : LLM_PACK_ROWS;
        if (tiled) llm_pack_tiles(type, wide, first, row_bytes, n_packed, cols, pack + i * pack_bytes);
        else llm_pack(type, wide, first, row_bytes, n_packed, cols, pack + i * pack_bytes);
    }
    /* with AMX (amx_x: llm_amx_layout's, else NULL), 16 tokens at a time while 16 are left; the rest below */
    int amx_tokens = amx_x ? T / 16 * 16 : 0;
    /* the next tile's rows are asked for from memory a few cache lines at a time between the products, so
     * that their reads overlap this tile's work rather than stall its packing */
    const char *next = (const char *)tile_data + (size_t)(r1 - r0) * row_bytes;
    size_t next_bytes = r1 < rows ? (size_t)(r1 - r0) * row_bytes : 0, next_at = 0;
    size_t calls = (size_t)n_packs *
                   (size_t)(amx_tokens / 16 + (T - amx_tokens + LLM_DOT_MAX_COLS - 1) / LLM_DOT_MAX_COLS);
    size_t next_step = next_bytes / calls + 64;
#if defined(LLM_AMX)
    if (amx_tokens) llm_amx_configure(llm_pack_two_halves(type) ? 16 : 32);
#endif
    for (int t = 0, nc; t < T; t += nc) {
        const void *amx = NULL; /* these 16 tokens' activations laid out for AMX's tiles */
        nc = T - t < LLM_DOT_MAX_COLS ? T - t : LLM_DOT_MAX_COLS;
#if defined(LLM_AMX)
        if (t < amx_tokens) {
            amx = (const llm_amx_group *)amx_x + (size_t)t / LLM_AMX_TOKENS * n_groups;
            nc = LLM_AMX_TOKENS;
        }
#endif
        for (int i = 0; i < n_packs; i++) {
            int64_t first = r0 + i * LLM_PACK_ROWS, n_rows = r1 - first;
            for (size_t end = next_at + next_step; next_at < next_bytes && next_at < end; next_at += 64)
                _mm_prefetch(next + next_at, _MM_HINT_T0);
            float v[16][LLM_PACK_ROWS];
            if (n_rows >= LLM_PACK_ROWS) { /* straight into out */
                llm_pack_mul(type, wide, pack + i * pack_bytes, n_groups, xq + (size_t)t * n_groups,
                             n_groups, nc, amx, out + (size_t)t * rows + first, rows);
                continue;
            }
            llm_pack_mul(type, wide, pack + i * pack_bytes, n_groups, xq + (size_t)t * n_groups,
                         n_groups, nc, amx, v[0], LLM_PACK_ROWS);
            for (int c = 0; c < nc; c++)
                memcpy(out + (size_t)(t + c) * rows + first, v[c], (size_t)n_rows * sizeof(float));
        }
#if defined(LLM_AMX)
        if (t + nc == amx_tokens) _tile_release();
#endif
    }
}

/* llm_q8_quantize_ref, 32 values at a time: the same scale, the same rounding (to nearest, ties to even, as
 * lrintf does), the same bytes */
static void llm_q8_quantize_avx2(const float *x, llm_q8 *out, int64_t n, int wide) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        float d = _mm_cvtss_f32(m) / 127, inv = d > 0 ? 1 / d : 0;
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
        /* 32-bit to 8-bit: the packs interleave 128-bit lanes, the permute puts them back in order */
        __m256i q16 = _mm256_packs_epi32(q[0], q[1]), q16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16, q16b),
                                                 _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)out[b].q, q8);
        const float fine = d / 256, inv_fine = fine > 0 ? 1 / fine : 0;
        if (wide) { /* the residual in 256ths of the step, rounded and clamped to +-127 as the reference
                     * does */
            __m256i r[4];
            for (int i = 0; i < 4; i++) {
                __m256 rest = _mm256_sub_ps(v[i], _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(q[i])));
                r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(rest, _mm256_set1_ps(inv_fine)));
                r[i] = _mm256_max_epi32(_mm256_min_epi32(r[i], _mm256_set1_epi32(127)),
                                        _mm256_set1_epi32(-127));
                q[i] = _mm256_add_epi32(_mm256_slli_epi32(q[i], 8), r[i]); /* what the sums add */
            }
            __m256i r16 = _mm256_packs_epi32(r[0], r[1]), r16b = _mm256_packs_epi32(r[2], r[3]);
            _mm256_storeu_si256((__m256i *)out[b].r,
                                _mm256_permutevar8x32_epi32(_mm256_packs_epi16(r16, r16b),
                                                            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            for (int i = 0; i < 2; i++) /* 256 q + r in 16 bits: the pack interleaves 64-bit quarters */
                _mm256_storeu_si256((__m256i *)out[b].a + i,
                                    _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2 * i], q[2 * i + 1]),
                                                             0xd8));
        } else {
            memset(out[b].r, 0, sizeof out[b].r);
            memset(out[b].a, 0, sizeof out[b].a);
        }
        __m256i halves = _mm256_hadd_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        halves = _mm256_hadd_epi32(halves, halves); /* per 128-bit lane: the halves' sums over it */
        int sum0 = _mm256_extract_epi32(halves, 0) + _mm256_extract_epi32(halves, 4);
        int sum1 = _mm256_extract_epi32(halves, 1) + _mm256_extract_epi32(halves, 5);
        out[b].d = wide ? fine : d;
        out[b].sum[0] = sum0; out[b].sum[1] = sum1;
        out[b].s = out[b].d * (float)(sum0 + sum1);
    }
}

/* ---- f16 and bf16 weights times f32 activations (llm_matmul) ------------------------------------------- */
/* f16 and bf16 weights meet f32 activations in tiles of nr (1 to 4) rows times nc (1 to 3) tokens: 8 weights
 * converted once serve 3 tokens and 8 activations loaded once serve 4 rows. Each (row, token) keeps two
 * running sums of 8, for the even and the odd runs of 8 along the row (a chain of fused multiply-adds waits
 * on each one before it: two chains overlap, where a decode step has one row and one token); then the two
 * sums added, their lanes added as llm_avx2_hsum does, then the rest of the row one value at a time. So a
 * token's product is the same bit for bit in whatever tile it falls (alone, in a decode step of a few, in a
 * prefill of many), and test.c's half_dot_ref says what it is in plain C. Up to 6 (row, token) pairs keep
 * both sums in registers (12 of the 16); a tile of more runs twice over its rows, the even runs then the odd
 * ones, with one sum each in registers (a 4 x 3 tile: 12 sums, 4 conversions and 3 loads for 12
 * multiply-adds, where 2 x 3 has 2 and 3 for 6: 1.2 times as fast on Zen 3). A decode step (one token) takes
 * two rows at a time: two chains of multiply-adds, and half the calls and ends of rows (SmolLM2 F16 decode,
 * Sapphire Rapids, one thread: 1.18 times as fast as one row, 4 rows 1.06; AVX2 build 1.11; once measured 0.8
 * times on Zen 3, with the prefetch nearer). Rows are w_stride values apart, tokens x_stride; out[c *
 * out_stride + r] */
typedef __m256 llm_half_sums[2][LLM_HALF_ROWS][LLM_HALF_TOKENS]; /* [even, odd][row][token] */
/* value k of rows w of type f16, bf16 or f32 (a tile's f16/bf16 rows converted for a prompt: llm_matmul) */
#define LLM_HALF_AT(type, w, k) ((const char *)(w) + (k) * ((type) == LLM_F32 ? 4 : 2))
static inline float llm_half_value(uint32_t type, const void *w, int64_t k) {
    return type == LLM_F32 ? ((const float *)w)[k] : llm_half_to_f32(type, ((const uint16_t *)w)[k]);
}
/* one run of 8 values of the tile's rows and tokens, into sums */
static inline __attribute__((always_inline)) void llm_half_run(uint32_t type, int nr, int nc, const void *w,
                                                              int64_t w_stride, const float *x,
                                                              int64_t x_stride,
                                                              __m256 sums[LLM_HALF_ROWS][LLM_HALF_TOKENS]) {
    __m256 xv[LLM_HALF_TOKENS];
    for (int c = 0; c < nc; c++) {
        xv[c] = _mm256_loadu_ps(x + c * x_stride);
        __asm__("" : "+x"(xv[c])); /* in a register: else GCC loads it again for each row's product */
    }
    for (int r = 0; r < nr; r++) {
        __m256 wv = llm_half8(type, LLM_HALF_AT(type, w, r * w_stride));
        for (int c = 0; c < nc; c++) sums[r][c] = _mm256_fmadd_ps(wv, xv[c], sums[r][c]);
    }
}
#if defined(LLM_AVX512F)
/* AVX-512: a run of 16 values is an even run of 8 in the low half and the odd run after it in the high half,
 * so one 512-bit sum per (row, token) makes the same multiply-adds, lane by lane, as the two sums of 8: the
 * same result bit for bit, at twice the width; and tiles of 4 rows x 6 tokens, 24 sums in the 32 registers
 * (SmolLM2 F16 pp512, one thread, Sapphire Rapids, best of 3 alternations: 290 -> 355 tok/s at 4 x 3, 378 at
 * 4 x 6) */
static inline __attribute__((always_inline)) __m512 llm_half16(uint32_t type, const void *at) {
    if (type == LLM_F32) return _mm512_loadu_ps((const float *)at);
    __m256i h = _mm256_loadu_si256((const __m256i *)at);
    return type == LLM_F16 ? _mm512_cvtph_ps(h)
                           : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __attribute__((always_inline)) int64_t llm_half_runs16(uint32_t type, int nr, int nc,
                                                                     const void *w, int64_t w_stride,
                                                                     const float *x, int64_t x_stride,
                                                                     int64_t n, llm_half_sums sums) {
    __m512 both[LLM_HALF_ROWS][LLM_HALF_TOKENS];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) both[r][c] = _mm512_setzero_ps();
    int64_t i = 0;
    int ahead[2];
    llm_prefetch_load(1, ahead);
    for (; i + 16 <= n; i += 16) {
        __m512 xv[LLM_HALF_TOKENS];
        for (int c = 0; c < nc; c++) {
            xv[c] = _mm512_loadu_ps(x + c * x_stride + i);
            __asm__("" : "+v"(xv[c])); /* in a register: else GCC loads it again for each row's product */
        }
        for (int r = 0; r < nr; r++) {
            if (type != LLM_F32) llm_prefetch(LLM_HALF_AT(type, w, r * w_stride + i), ahead); /* f32: L2 */
            __m512 wv = llm_half16(type, LLM_HALF_AT(type, w, r * w_stride + i));
            for (int c = 0; c < nc; c++) both[r][c] = _mm512_fmadd_ps(wv, xv[c], both[r][c]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) {
            sums[0][r][c] = _mm512_castps512_ps256(both[r][c]);
            sums[1][r][c] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(both[r][c]), 1));
        }
    return i;
}
#endif
static inline __attribute__((always_inline)) void llm_dot_half_tile(uint32_t type, int nr, int nc,
                                                                   const void *w, int64_t w_stride,
                                                                   const float *x, int64_t x_stride,
                                                                   int64_t n,
                                                                   float *out, int64_t out_stride) {
    llm_half_sums sums;
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < nc; c++) sums[h][r][c] = _mm256_setzero_ps();
    int64_t i = 0;
#if defined(LLM_AVX512F)
    i = llm_half_runs16(type, nr, nc, w, w_stride, x, x_stride, n, sums);
    if (i + 8 <= n) {
        llm_half_run(type, nr, nc, LLM_HALF_AT(type, w, i), w_stride, x + i, x_stride, sums[0]);
        i += 8;
    }
#else
    if (nr * nc <= 6) {
        int ahead[2];
        llm_prefetch_load(1, ahead);
        for (; i + 16 <= n; i += 16) { /* an even run, then an odd one */
            for (int r = 0; r < nr; r++) llm_prefetch(LLM_HALF_AT(type, w, r * w_stride + i), ahead);
            llm_half_run(type, nr, nc, LLM_HALF_AT(type, w, i), w_stride, x + i, x_stride, sums[0]);
            llm_half_run(type, nr, nc, LLM_HALF_AT(type, w, i + 8), w_stride, x + i + 8, x_stride, sums[1]);
        }
        if (i + 8 <= n) {
            llm_half_run(type, nr, nc, LLM_HALF_AT(type, w, i), w_stride, x + i, x_stride, sums[0]);
            i += 8;
        }
    } else {
        __m256 one[LLM_HALF_ROWS][LLM_HALF_TOKENS]; /* the even runs' sums, then the odd runs' */
        for (int h = 0; h < 2; h++) {
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < nc; c++) one[r][c] = _mm256_setzero_ps();
            for (int64_t j = 8 * h; j + 8 <= n; j += 16)
                llm_half_run(type, nr, nc, LLM_HALF_AT(type, w, j), w_stride, x + j, x_stride, one);
            for (int r = 0; r < nr; r++)
                for (int c = 0; c < nc; c++) sums[h][r][c] = one[r][c];
        }
        i = n / 8 * 8;
    }
#endif
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) {
            float s = llm_avx2_hsum(_mm256_add_ps(sums[0][r][c], sums[1][r][c]));
            for (int64_t k = i; k < n; k++)
                s += llm_half_value(type, w, r * w_stride + k) * x[c * x_stride + k];
            out[c * out_stride + r] = s;
        }
}
/* llm_dot_half_tile specialized to each tile shape and type */
static void llm_dot_half(uint32_t type, const void *w, int64_t w_stride, int nr, const float *x,
                         int64_t x_stride, int nc, int64_t n, float *out, int64_t out_stride) {
#define LLM_HALF_TILE(R, C)                                                                                 \
    case (R) * 8 + (C):                                                                                    \
        if (type == LLM_F16) llm_dot_half_tile(LLM_F16, R, C, w, w_stride, x, x_stride, n, out, out_stride); \
        else if (type == LLM_BF16) llm_dot_half_tile(LLM_BF16, R, C, w, w_stride, x, x_stride, n, out,      \
                                                     out_stride);                                          \
        else llm_dot_half_tile(LLM_F32, R, C, w, w_stride, x, x_stride, n, out, out_stride);               \
        return;
    switch (nr * 8 + nc) {
    LLM_HALF_TILE(1, 1) LLM_HALF_TILE(1, 2) LLM_HALF_TILE(1, 3) LLM_HALF_TILE(2, 1) LLM_HALF_TILE(2, 2)
    LLM_HALF_TILE(2, 3) LLM_HALF_TILE(3, 1) LLM_HALF_TILE(3, 2) LLM_HALF_TILE(3, 3) LLM_HALF_TILE(4, 1)
    LLM_HALF_TILE(4, 2) LLM_HALF_TILE(4, 3)
#if LLM_HALF_TOKENS == 6
    LLM_HALF_TILE(1, 4) LLM_HALF_TILE(1, 5) LLM_HALF_TILE(1, 6) LLM_HALF_TILE(2, 4) LLM_HALF_TILE(2, 5)
    LLM_HALF_TILE(2, 6) LLM_HALF_TILE(3, 4) LLM_HALF_TILE(3, 5) LLM_HALF_TILE(3, 6) LLM_HALF_TILE(4, 4)
    LLM_HALF_TILE(4, 5) LLM_HALF_TILE(4, 6)
#endif
    }
#undef LLM_HALF_TILE
}

/* ---- exp, and the row kernels of the norms, softmax, SwiGLU and attention ------------------------------ */
/* exp(x) of 8 floats, bit for bit what glibc's expf gives on a machine with FMA (the algorithm of Arm's
 * optimized routines, glibc's since 2.27; a NaN's bits aside): x / ln2 = (k + r) / 32 with k whole and r in
 * [-1/2, 1/2]; exp(x) = 2^(k/32) 2^(r/32), 2^(k/32) from a table of 2^(j/32), j = k mod 32, and 2^(r/32) a
 * cubic in r, in double. Attention's softmax takes one for every score (libm's, a call each, were a fifth of
 * a prompt's attention), SwiGLU one for every value of the FFN. test.c holds it to a plain-C copy and to
 * expf. */
static const double llm_exp2_32nds[32] = { /* 2^(j/32), rounded to nearest */
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0,
};
static inline __attribute__((always_inline)) __m256 llm_exp_avx2(__m256 x) {
    const __m256d invln2_32 = _mm256_set1_pd(0x1.71547652b82fep+5), shift = _mm256_set1_pd(0x1.8p+52);
    const __m256d c0 = _mm256_set1_pd(0x1.c6af84b912394p-20), c1 = _mm256_set1_pd(0x1.ebfce50fac4f3p-13);
    const __m256d c2 = _mm256_set1_pd(0x1.62e42ff0c52d6p-6), one = _mm256_set1_pd(1.0);
    __m128 half[2];
    for (int h = 0; h < 2; h++) {
        __m256d xd = _mm256_cvtps_pd(h ? _mm256_extractf128_ps(x, 1) : _mm256_castps256_ps128(x));
        __m256d kd = _mm256_fmadd_pd(invln2_32, xd, shift); /* k in the low bits: rounded to nearest */
        __m256i ki = _mm256_castpd_si256(kd);
        kd = _mm256_sub_pd(kd, shift);
        __m256d r = _mm256_fmsub_pd(invln2_32, xd, kd);
        /* 2^(k/32): the table's 2^(j/32) with k div 32 added to its exponent */
        __m256i j = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        __m256i s = _mm256_i64gather_epi64((const long long *)llm_exp2_32nds, j, 8);
        s = _mm256_add_epi64(s, _mm256_slli_epi64(_mm256_sub_epi64(ki, j), 47));
        __m256d z = _mm256_fmadd_pd(c0, r, c1), r2 = _mm256_mul_pd(r, r);
        __m256d y = _mm256_fmadd_pd(z, r2, _mm256_fmadd_pd(r, c2, one));
        half[h] = _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(s)));
    }
    __m256 e = _mm256_set_m128(half[1], half[0]);
    /* below -0x1.9fe368p6f (-inf too) the result is 0, above 0x1.62e42ep6f infinity */
    e = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-0x1.9fe368p6f), _CMP_LT_OQ), e);
    __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(0x1.62e42ep6f), _CMP_GT_OQ);
    return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), over);
}
/* llm_max's first n / 8 * 8 values (when n >= 8), 8 lanes at a time: into *mx; returns how many */
static inline __attribute__((always_inline)) int llm_max_avx2(const float *x, int n, float *mx_io) {
    int i = 0;
    float mx = *mx_io;
    if (n >= 8) {
        __m256 m = _mm256_set1_ps(mx);
        for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m); /* x > m ? x : m */
        float lanes[8];
        _mm256_storeu_ps(lanes, m);
        for (int j = 0; j < 8; j++) mx = lanes[j] > mx ? lanes[j] : mx;
    }
    *mx_io = mx;
    return i;
}
/* llm_softmax_exp's whole row, 8 at a time, the last 8 padded with zeros */
static inline __attribute__((always_inline)) void llm_softmax_exp_avx2(float *row, int n, float mx) {
    int p = 0;
    for (; p + 8 <= n; p += 8)
        _mm256_storeu_ps(row + p, llm_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(row + p), _mm256_set1_ps(mx))));
    if (p < n) {
        float tail[8] = {0};
        memcpy(tail, row + p, (size_t)(n - p) * sizeof(float));
        _mm256_storeu_ps(tail, llm_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(tail), _mm256_set1_ps(mx))));
        memcpy(row + p, tail, (size_t)(n - p) * sizeof(float));
        return;
    }
}
/* llm_swiglu's first n / 8 * 8 values, 8 at a time, the same roundings: returns how many */
static inline __attribute__((always_inline)) size_t llm_swiglu_avx2(float *gate, const float *up, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i), e = llm_exp_avx2(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
        __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    return i;
}
/* llm_cpu_kv_store's f16 values, n / 8 * 8 of them, 8 at a time with F16C: rounded to nearest even, the same
 * bits as llm_f32_to_f16. Returns how many */
static inline __attribute__((always_inline)) int llm_f16_store_avx2(void *dst, const float *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)((uint16_t *)dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}
/* llm_kv_dequant_head's whole blocks (hd / 32 of them), 8 values at a time: the code widened to 32 bits,
 * to float, times d, the plain loop's one rounding. Returns how many values */
static inline __attribute__((always_inline)) int llm_kv_dequant_avx2(uint32_t type, const uint8_t *p,
                                                                     float *out, int hd) {
    int b = 0;
    for (; b + 32 <= hd; b += 32, out += 32) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)p));
        __m128i code[2];
        if (type == LLM_Q8_0) {
            code[0] = _mm_loadu_si128((const __m128i *)(p + 2));
            code[1] = _mm_loadu_si128((const __m128i *)(p + 18));
            p += 34;
        } else { /* values j and j + 16 share byte j: the low nibbles, then the high ones, less 8 */
            __m128i raw = _mm_loadu_si128((const __m128i *)(p + 2)), low = _mm_set1_epi8(15);
            code[0] = _mm_sub_epi8(_mm_and_si128(raw, low), _mm_set1_epi8(8));
            code[1] = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_set1_epi8(8));
            p += 18;
        }
        for (int h = 0; h < 2; h++) {
            __m256i lo = _mm256_cvtepi8_epi32(code[h]), hi = _mm256_cvtepi8_epi32(_mm_srli_si128(code[h], 8));
            _mm256_storeu_ps(out + 16 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(lo)));
            _mm256_storeu_ps(out + 16 * h + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(hi)));
        }
    }
    return b;
}
/* ---- the sampler's weights (section 8) ----------------------------------------------------------------- */
/* llm_sampler_weights' first n / 8 * 8 values, 8 at a time: w[i] = exp((x[i] - mx) inv_t), a NaN weighing 0,
 * and lane j's values added into part[j] in double, in the plain loop's order (so a seed draws the same token
 * in every build). Returns how many */
static inline __attribute__((always_inline)) int llm_sampler_weights_avx2(const float *x, int n, float mx,
                                                                          float inv_t, float *w,
                                                                          double part[8]) {
    int i = 0;
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (; i + 8 <= n; i += 8) {
        __m256 t = _mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(mx));
        __m256 e = llm_exp_avx2(_mm256_mul_ps(t, _mm256_set1_ps(inv_t)));
        e = _mm256_and_ps(e, _mm256_cmp_ps(e, e, _CMP_ORD_Q)); /* a NaN: 0 */
        if (w) _mm256_storeu_ps(w + i, e);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    _mm256_storeu_pd(part, lo); _mm256_storeu_pd(part + 4, hi);
    return i;
}
/* llm_sampler_normalize's first n / 4 * 4 values: w[i] / sum in double, 4 at a time. Returns how many */
static inline __attribute__((always_inline)) int llm_sampler_normalize_avx2(float *w, int n, double sum) {
    int i = 0;
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(w + i, _mm256_cvtpd_ps(_mm256_div_pd(_mm256_cvtps_pd(_mm_loadu_ps(w + i)),
                                                            _mm256_set1_pd(sum))));
    return i;
}
/* A token's o = sum_p w_p v_p, p = first..last, for ng (1 to 3) heads (weights w_stride apart, outputs hd)
 * and nv (1 to LLM_VRUNS) runs of LLM_VRUN values from i0: a multiply then an add for each p in turn, the
 * roundings of the plain loop, with the sums in registers over all p. Specialized to each ng and nv and to
 * the cache's type: with them variables, GCC kept the sums and v in memory, each add waiting on the store
 * before it (40% of a SmolLM2 prompt's attention went there once). Each value's sum is its own, so the
 * runs are as wide as the registers: with AVX-512, 3 heads by 4 runs of 16 (a 64-value head at once: 12
 * sums, 4 v and a weight in the 32 registers); with AVX2, 3 runs of 8 (3 by 4 would need 18 of 16) */
#if defined(LLM_AVX512F)
typedef __m512 llm_vrun;
#define llm_vrun_zero _mm512_setzero_ps
#define llm_vrun_set1 _mm512_set1_ps
#define llm_vrun_add _mm512_add_ps
#define llm_vrun_mul _mm512_mul_ps
#define llm_vrun_store _mm512_storeu_ps
#define llm_vrun_load(half, at) ((half) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(at))) \
                                        : _mm512_loadu_ps((const float *)(at)))
#else
typedef __m256 llm_vrun;
#define llm_vrun_zero _mm256_setzero_ps
#define llm_vrun_set1 _mm256_set1_ps
#define llm_vrun_add _mm256_add_ps
#define llm_vrun_mul _mm256_mul_ps
#define llm_vrun_store _mm256_storeu_ps
#define llm_vrun_load(half, at) ((half) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(at))) \
                                        : _mm256_loadu_ps((const float *)(at)))
#endif
static inline __attribute__((always_inline)) void llm_cpu_weighted_v_tile(const llm_cpu *c, int half, int ng,
                                                                         int nv, int index,
                                                                         const int32_t *block_table,
                                                                         size_t head_offset, int first,
                                                                         int last, const float *w,
                                                                         int64_t w_stride, int i0, float *o,
                                                                         int hd) {
    int bs = c->block_size;
    size_t per_slot = (size_t)c->model->cfg.n_kv_heads * hd * (half ? sizeof(uint16_t) : sizeof(float));
    llm_vrun acc[3][LLM_VRUNS];
    for (int g = 0; g < ng; g++)
        for (int j = 0; j < nv; j++) acc[g][j] = llm_vrun_zero();
    for (int p0 = first - first % bs; p0 <= last; p0 += bs) {
        const uint8_t *vp = llm_cpu_kv_at(c, c->v, index, block_table, p0) + head_offset;
        for (int p = p0; p <= last && p < p0 + bs; p++, vp += per_slot) {
            if (p < first) continue;
            llm_vrun v[LLM_VRUNS];
            for (int j = 0; j < nv; j++)
                v[j] = llm_vrun_load(half, vp + (size_t)(i0 + LLM_VRUN * j) * (half ? 2 : 4));
            for (int g = 0; g < ng; g++) {
                llm_vrun wg = llm_vrun_set1(w[g * w_stride + p]);
                for (int j = 0; j < nv; j++) acc[g][j] = llm_vrun_add(acc[g][j], llm_vrun_mul(wg, v[j]));
            }
        }
    }
    for (int g = 0; g < ng; g++)
        for (int j = 0; j < nv; j++) llm_vrun_store(o + (size_t)g * hd + i0 + LLM_VRUN * j, acc[g][j]);
}
static void llm_cpu_weighted_v(const llm_cpu *c, int ng, int nv, int index, const int32_t *block_table,
                               size_t head_offset, int first, int last, const float *w, int64_t w_stride,
                               int i0, float *o, int hd) {
#define LLM_WEIGHTED_V(G, V)                                                                               \
    case (G) * 4 + (V):                                                                                    \
        if (c->kv_half)                                                                                    \
            llm_cpu_weighted_v_tile(c, 1, G, V, index, block_table, head_offset, first, last, w, w_stride, \
                                    i0, o, hd);                                                            \
        else                                                                                               \
            llm_cpu_weighted_v_tile(c, 0, G, V, index, block_table, head_offset, first, last, w, w_stride, \
                                    i0, o, hd);                                                            \
        return;
    switch (ng * 4 + nv) {
    LLM_WEIGHTED_V(1, 1) LLM_WEIGHTED_V(1, 2) LLM_WEIGHTED_V(1, 3) LLM_WEIGHTED_V(2, 1) LLM_WEIGHTED_V(2, 2)
    LLM_WEIGHTED_V(2, 3) LLM_WEIGHTED_V(3, 1) LLM_WEIGHTED_V(3, 2) LLM_WEIGHTED_V(3, 3)
#if LLM_VRUNS == 4
    LLM_WEIGHTED_V(1, 4) LLM_WEIGHTED_V(2, 4) LLM_WEIGHTED_V(3, 4)
#endif
    }
#undef LLM_WEIGHTED_V
}
/* o += sum_p w_p v_p over n_rows f32 rows (a quantized cache's rows, converted), for ng heads and nv runs
 * from i0: o loaded into registers, each row's product added in turn, stored once: the plain loop's bits */
static inline __attribute__((always_inline)) void llm_weighted_rows_tile(int ng, int nv, const float *rows,
                                                                        int64_t row_stride, int n_rows,
                                                                        const float *w, int64_t w_stride,
                                                                        int i0, float *o, int hd) {
    llm_vrun acc[3][LLM_VRUNS];
    for (int g = 0; g < ng; g++)
        for (int j = 0; j < nv; j++) acc[g][j] = llm_vrun_load(0, o + (size_t)g * hd + i0 + LLM_VRUN * j);
    for (int p = 0; p < n_rows; p++, rows += row_stride) {
        llm_vrun v[LLM_VRUNS];
        for (int j = 0; j < nv; j++) v[j] = llm_vrun_load(0, rows + i0 + LLM_VRUN * j);
        for (int g = 0; g < ng; g++) {
            llm_vrun wg = llm_vrun_set1(w[g * w_stride + p]);
            for (int j = 0; j < nv; j++) acc[g][j] = llm_vrun_add(acc[g][j], llm_vrun_mul(wg, v[j]));
        }
    }
    for (int g = 0; g < ng; g++)
        for (int j = 0; j < nv; j++) llm_vrun_store(o + (size_t)g * hd + i0 + LLM_VRUN * j, acc[g][j]);
}
static void llm_weighted_rows(int ng, int nv, const float *rows, int64_t row_stride, int n_rows,
                              const float *w, int64_t w_stride, int i0, float *o, int hd) {
#define LLM_WEIGHTED_ROWS(G, V)                                                                          \
    case (G) * 4 + (V):                                                                                      \
        llm_weighted_rows_tile(G, V, rows, row_stride, n_rows, w, w_stride, i0, o, hd);                      \
        return;
    switch (ng * 4 + nv) {
    LLM_WEIGHTED_ROWS(1, 1) LLM_WEIGHTED_ROWS(1, 2) LLM_WEIGHTED_ROWS(1, 3) LLM_WEIGHTED_ROWS(2, 1)
    LLM_WEIGHTED_ROWS(2, 2) LLM_WEIGHTED_ROWS(2, 3) LLM_WEIGHTED_ROWS(3, 1) LLM_WEIGHTED_ROWS(3, 2)
    LLM_WEIGHTED_ROWS(3, 3)
#if LLM_VRUNS == 4
    LLM_WEIGHTED_ROWS(1, 4) LLM_WEIGHTED_ROWS(2, 4) LLM_WEIGHTED_ROWS(3, 4)
#endif
    }
#undef LLM_WEIGHTED_ROWS
}
#endif /* LLM_AVX2 */

#if defined(LLM_NEON_DOT)
/* ---- 64-bit ARM: NEON (section 7's fast path, its quantized types) ------------------------------------- */
#include <arm_neon.h>
static inline int8x16_t llm_neon_bytes(const int32x4_t v[4]) { /* 16 integers within +-127, as bytes */
    return vcombine_s8(vmovn_s16(vcombine_s16(vmovn_s32(v[0]), vmovn_s32(v[1]))),
                       vmovn_s16(vcombine_s16(vmovn_s32(v[2]), vmovn_s32(v[3]))));
}
/* llm_q8_quantize_ref, 32 values at a time: the same scale, the same rounding (vcvtnq: to nearest, ties to
 * even, as lrintf in the default mode), the same bytes */
static void llm_q8_quantize_neon(const float *x, llm_q8 *out, int64_t n, int wide) {
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float32x4_t v[8], amax = vdupq_n_f32(0);
        for (int i = 0; i < 8; i++) {
            v[i] = vld1q_f32(x + 4 * i);
            amax = vmaxq_f32(amax, vabsq_f32(v[i]));
        }
        float d = vmaxvq_f32(amax) / 127, inv = d > 0 ? 1 / d : 0;
        float fine = d / 256, inv_fine = fine > 0 ? 1 / fine : 0;
        int32x4_t q[8], r[8];
        for (int i = 0; i < 8; i++) q[i] = vcvtnq_s32_f32(vmulq_n_f32(v[i], inv));
        for (int h = 0; h < 2; h++) vst1q_s8(out[b].q + 16 * h, llm_neon_bytes(q + 4 * h)); /* |q| <= 127 */
        if (wide) { /* the residual in 256ths of the step, rounded and clamped to +-127 as the reference */
            for (int i = 0; i < 8; i++) {
                float32x4_t rest = vsubq_f32(v[i], vmulq_n_f32(vcvtq_f32_s32(q[i]), d));
                r[i] = vcvtnq_s32_f32(vmulq_n_f32(rest, inv_fine));
                r[i] = vmaxq_s32(vminq_s32(r[i], vdupq_n_s32(127)), vdupq_n_s32(-127));
                q[i] = vaddq_s32(vshlq_n_s32(q[i], 8), r[i]); /* what the sums add */
            }
            for (int h = 0; h < 2; h++) vst1q_s8(out[b].r + 16 * h, llm_neon_bytes(r + 4 * h));
            for (int i = 0; i < 4; i++) /* 256 q + r in 16 bits */
                vst1q_s16(out[b].a + 8 * i, vcombine_s16(vmovn_s32(q[2 * i]), vmovn_s32(q[2 * i + 1])));
        } else {
            memset(out[b].r, 0, sizeof out[b].r);
            memset(out[b].a, 0, sizeof out[b].a);
        }
        out[b].d = wide ? fine : d;
        for (int h = 0; h < 2; h++)
            out[b].sum[h] = vaddvq_s32(vaddq_s32(vaddq_s32(q[4 * h], q[4 * h + 1]),
                                                 vaddq_s32(q[4 * h + 2], q[4 * h + 3])));
        out[b].s = out[b].d * (float)(out[b].sum[0] + out[b].sum[1]);
    }
}

/* The products of one weight row with nc rows of activations, as llm_q8_dot32_avx2 takes them: a block's 32
 * weights as signed bytes (q4_0's offset taken off; q4_1's nibbles, below 128, the same as signed bytes, its
 * minimum added apart with the activations' sum); with 8-bit activations two sdot a block, with 16-bit ones
 * the weights widened to 16 bits against 256 q + r (two sums of 4 products a lane: at most 4 x 128 x 32,639
 * < 2^24 each, exact as floats, as llm_q8_block32_avx2's); even and odd blocks into two sets of
 * accumulators */
static inline uint8x16_t llm_neon_bits16(uint32_t bits) { /* bit j of 16 as byte j: 16 where set, else 0 */
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(16));
}
static inline __attribute__((always_inline)) void llm_q8_block32_neon(uint32_t type, int wide,
                                                                      const uint8_t *p, const llm_q8 *x,
                                                                      int64_t x_stride, int nc,
                                                                      float32x4_t acc[4], float mins[4]) {
    const int has_min = type == LLM_Q4_1 || type == LLM_Q5_1;
    float d = type == LLM_MXFP4 ? llm_e8m0_half(p[0]) : llm_f16_to_f32(*(const uint16_t *)p);
    float m = has_min ? llm_f16_to_f32(*(const uint16_t *)(p + 2)) : 0;
    int8x16_t w[2];
    if (type == LLM_Q8_0) {
        w[0] = vld1q_s8((const int8_t *)p + 2);
        w[1] = vld1q_s8((const int8_t *)p + 18);
    } else if (type == LLM_MXFP4) { /* the nibbles index the e2m1 values, doubled (llm_mxfp4_values) */
        uint8x16_t packed = vld1q_u8(p + 1);
        int8x16_t values = vld1q_s8(llm_mxfp4_values);
        w[0] = vqtbl1q_s8(values, vandq_u8(packed, vdupq_n_u8(15)));
        w[1] = vqtbl1q_s8(values, vshrq_n_u8(packed, 4));
    } else { /* nibbles after d (and m, and q5's 32 fifth bits), values j and j + 16 sharing byte j */
        const int qs_at = type == LLM_Q4_0 ? 2 : type == LLM_Q4_1 ? 4 : type == LLM_Q5_0 ? 6 : 8;
        uint8x16_t packed = vld1q_u8(p + qs_at), lo = vandq_u8(packed, vdupq_n_u8(15));
        uint8x16_t hi = vshrq_n_u8(packed, 4);
        if (type == LLM_Q5_0 || type == LLM_Q5_1) {
            uint32_t qh;
            memcpy(&qh, p + qs_at - 4, 4);
            lo = vorrq_u8(lo, llm_neon_bits16(qh));
            hi = vorrq_u8(hi, llm_neon_bits16(qh >> 16));
        }
        w[0] = vreinterpretq_s8_u8(lo); /* below 32: the same as signed bytes */
        w[1] = vreinterpretq_s8_u8(hi);
        if (type == LLM_Q4_0 || type == LLM_Q5_0) {
            int8x16_t offset = vdupq_n_s8(type == LLM_Q4_0 ? 8 : 16);
            w[0] = vsubq_s8(w[0], offset);
            w[1] = vsubq_s8(w[1], offset);
        }
    }
    if (wide) {
        int16x8_t w16[4] = {vmovl_s8(vget_low_s8(w[0])), vmovl_s8(vget_high_s8(w[0])),
                            vmovl_s8(vget_low_s8(w[1])), vmovl_s8(vget_high_s8(w[1]))};
        for (int c = 0; c < nc; c++) {
            const llm_q8 *xb = x + c * x_stride;
            int32x4_t dot[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
            for (int i = 0; i < 4; i++) {
                int16x8_t a = vld1q_s16(xb->a + 8 * i);
                dot[i / 2] = vmlal_s16(dot[i / 2], vget_low_s16(w16[i]), vget_low_s16(a));
                dot[i / 2] = vmlal_high_s16(dot[i / 2], w16[i], a);
            }
            float32x4_t sum = vaddq_f32(vcvtq_f32_s32(dot[0]), vcvtq_f32_s32(dot[1]));
            acc[c] = vfmaq_n_f32(acc[c], sum, d * xb->d);
            if (has_min) mins[c] += m * xb->s;
        }
        return;
    }
    for (int c = 0; c < nc; c++) {
        const llm_q8 *xb = x + c * x_stride;
        int32x4_t dot = vdotq_s32(vdupq_n_s32(0), w[0], vld1q_s8(xb->q));
        dot = vdotq_s32(dot, w[1], vld1q_s8(xb->q + 16));
        acc[c] = vfmaq_n_f32(acc[c], vcvtq_f32_s32(dot), d * xb->d);
        if (has_min) mins[c] += m * xb->s;
    }
}
/* A row a call: llm_q8_dot gives NEON builds nr = 1 (LLM_DOT_ROWS; the x86 builds' 2 or 4 rows at once are
 * unmeasured here: no ARM machine) */
static inline __attribute__((always_inline)) void llm_q8_dot32_neon(uint32_t type, int wide,
    const uint8_t *p, size_t row_bytes, int nr, const llm_q8 *x, int64_t n_blocks, int64_t x_stride,
    int nc, float *out, int64_t out_stride) {
    (void)row_bytes, (void)nr;
    const size_t bytes = type == LLM_Q8_0 ? 34 : type == LLM_Q4_0 ? 18 : type == LLM_Q4_1 ? 20 :
                         type == LLM_Q5_0 ? 22 : type == LLM_MXFP4 ? 17 : 24;
    float32x4_t even[4], odd[4];
    float mins_even[4], mins_odd[4];
    for (int c = 0; c < nc; c++) {
        even[c] = odd[c] = vdupq_n_f32(0);
        mins_even[c] = mins_odd[c] = 0;
    }
    int64_t b = 0;
    for (; b + 2 <= n_blocks; b += 2, p += 2 * bytes) {
        __builtin_prefetch(p + 2048);
        llm_q8_block32_neon(type, wide, p, x + b, x_stride, nc, even, mins_even);
        llm_q8_block32_neon(type, wide, p + bytes, x + b + 1, x_stride, nc, odd, mins_odd);
    }
    if (b < n_blocks) llm_q8_block32_neon(type, wide, p, x + b, x_stride, nc, even, mins_even);
    for (int c = 0; c < nc; c++)
        out[c * out_stride] = vaddvq_f32(vaddq_f32(even[c], odd[c])) + (mins_even[c] + mins_odd[c]);
}

/* The k-quants' 256-value blocks, as llm_q8_dotk_avx2 takes them: per group of 32, the stored values
 * (unsigned, below 128: signed bytes all the same) times the activations with sdot, per half of 16 times its
 * sub-block's scale in integers, then by d and the group's activation scale (even and odd groups into two
 * sets of accumulators); the offsets and minimums meet the activations' half sums once per block */
static inline void llm_neon_field(const uint8_t *p, int shift, uint8_t mask, uint8x16_t out[2]) {
    int8x16_t s = vdupq_n_s8((int8_t)-shift); /* 32 bytes >> shift & mask */
    out[0] = vandq_u8(vshlq_u8(vld1q_u8(p), s), vdupq_n_u8(mask));
    out[1] = vandq_u8(vshlq_u8(vld1q_u8(p + 16), s), vdupq_n_u8(mask));
}
static inline void llm_neon_groupk(uint32_t type, const uint8_t *p, int g, int8x16_t w[2]) {
    uint8x16_t a[2], b[2]; /* group g's 32 stored values, as llm_avx2_group reads them */
    switch (type) {
    case LLM_Q2_K: llm_neon_field(p + 16 + g / 4 * 32, 2 * (g % 4), 3, a); break;
    case LLM_Q3_K:
        llm_neon_field(p + 32 + g / 4 * 32, 2 * (g % 4), 3, a);
        llm_neon_field(p, g, 1, b);
        for (int h = 0; h < 2; h++) a[h] = vorrq_u8(a[h], vshlq_n_u8(b[h], 2));
        break;
    case LLM_Q4_K: llm_neon_field(p + 16 + g / 2 * 32, 4 * (g % 2), 15, a); break;
    case LLM_Q5_K:
        llm_neon_field(p + 48 + g / 2 * 32, 4 * (g % 2), 15, a);
        llm_neon_field(p + 16, g, 1, b);
        for (int h = 0; h < 2; h++) a[h] = vorrq_u8(a[h], vshlq_n_u8(b[h], 4));
        break;
    default: /* q6_K */
        llm_neon_field(p + g / 4 * 64 + g % 2 * 32, 4 * (g % 4 / 2), 15, a);
        llm_neon_field(p + 128 + g / 4 * 32, 2 * (g % 4), 3, b);
        for (int h = 0; h < 2; h++) a[h] = vorrq_u8(a[h], vshlq_n_u8(b[h], 4));
        break;
    }
    w[0] = vreinterpretq_s8_u8(a[0]);
    w[1] = vreinterpretq_s8_u8(a[1]);
}
static inline __attribute__((always_inline)) void llm_q8_dotk_neon(uint32_t type, int wide,
    const uint8_t *p, size_t row_bytes, int nr, const llm_q8 *x, int64_t n_blocks, int64_t x_stride,
    int nc, float *out, int64_t out_stride) { /* a row a call, as llm_q8_dot32_neon */
    (void)row_bytes, (void)nr;
    const int sub = type == LLM_Q2_K || type == LLM_Q3_K || type == LLM_Q6_K ? 16 : 32;
    const size_t bytes = type == LLM_Q2_K ? 84 : type == LLM_Q3_K ? 110 : type == LLM_Q4_K ? 144 :
                         type == LLM_Q5_K ? 176 : 210;
    float32x4_t acc[2][4];
    float rest[4];
    for (int c = 0; c < nc; c++) {
        acc[0][c] = acc[1][c] = vdupq_n_f32(0);
        rest[c] = 0;
    }
    llm_qblock b;
    for (int64_t blk = 0; blk < n_blocks; blk++, p += bytes, x += 8) {
        for (size_t line = 0; line < bytes; line += 64) __builtin_prefetch(p + line + 2048);
        llm_qblock_read_scales(type, p, &b);
        for (int g = 0; g < 8; g++) {
            int8x16_t w[2];
            llm_neon_groupk(type, p, g, w);
            int s0 = b.scale[g * 32 / sub], s1 = b.scale[(g * 32 + 16) / sub];
            for (int c = 0; c < nc; c++) {
                const llm_q8 *xg = x + c * x_stride + g;
                int32x4_t q0 = vdotq_s32(vdupq_n_s32(0), w[0], vld1q_s8(xg->q));
                int32x4_t q1 = vdotq_s32(vdupq_n_s32(0), w[1], vld1q_s8(xg->q + 16));
                float32x4_t v = vcvtq_f32_s32(vmlaq_n_s32(vmulq_n_s32(q0, s0), q1, s1));
                if (wide) { /* 256 times the q part would pass 2^31 with q6_k's scales: each to float */
                    int32x4_t r0 = vdotq_s32(vdupq_n_s32(0), w[0], vld1q_s8(xg->r));
                    int32x4_t r1 = vdotq_s32(vdupq_n_s32(0), w[1], vld1q_s8(xg->r + 16));
                    v = vfmaq_n_f32(vcvtq_f32_s32(vmlaq_n_s32(vmulq_n_s32(r0, s0), r1, s1)), v, 256.0f);
                }
                acc[g % 2][c] = vfmaq_n_f32(acc[g % 2][c], v, xg->d * b.d);
            }
        }
        for (int c = 0; c < nc; c++) { /* the offsets and minimums, with the activations' half sums */
            const llm_q8 *xb = x + c * x_stride;
            float r = 0;
            for (int g = 0; g < 8; g++) {
                int h0 = g * 32 / sub, h1 = (g * 32 + 16) / sub;
                int offsets = xb[g].sum[0] * b.scale[h0] + xb[g].sum[1] * b.scale[h1];
                int minimums = xb[g].sum[0] * b.min[h0] + xb[g].sum[1] * b.min[h1];
                r += xb[g].d * ((float)offsets * (b.d * (float)b.offset) + (float)minimums * b.dmin);
            }
            rest[c] += r;
        }
    }
    for (int c = 0; c < nc; c++)
        out[c * out_stride] = vaddvq_f32(vaddq_f32(acc[0][c], acc[1][c])) - rest[c];
}
#endif /* LLM_NEON_DOT */


/* ===========================================================================================================
 * Appendix: the Unicode classes of the pre-tokenizers (section 3)
 * ======================================================================================================== */
/* Generated by `python3 tools/gen_unicode.py` from UnicodeData.txt (Unicode 15.0.0): to change it, run that
 * again. */
static const uint32_t llm_uni_runs[3486] = {
    0x0, 0x907, 0xE00, 0x2007, 0x2105, 0x2406, 0x2505, 0x2B06, 0x2C05, 0x3043, 0x3A05, 0x3C06, 0x3F05, 0x4149,
    0x5B05, 0x5E06, 0x5F45, 0x6006, 0x6151, 0x7B05, 0x7C06, 0x7D05, 0x7E06, 0x7F00, 0x8507, 0x8600, 0xA007,
    0xA105, 0xA206, 0xA705, 0xA806, 0xAA41, 0xAB05, 0xAC06, 0xAD00, 0xAE06, 0xB204, 0xB406, 0xB551, 0xB605,
    0xB806, 0xB904, 0xBA41, 0xBB05, 0xBC04, 0xBF05, 0xC049, 0xD706, 0xD849, 0xDF51, 0xF706, 0xF851, 0x10049,
    0x10151, 0x10249, 0x10351, 0x10449, 0x10551, 0x10649, 0x10751, 0x10849, 0x10951, 0x10A49, 0x10B51,
    0x10C49, 0x10D51, 0x10E49, 0x10F51, 0x11049, 0x11151, 0x11249, 0x11351, 0x11449, 0x11551, 0x11649,
    0x11751, 0x11849, 0x11951, 0x11A49, 0x11B51, 0x11C49, 0x11D51, 0x11E49, 0x11F51, 0x12049, 0x12151,
    0x12249, 0x12351, 0x12449, 0x12551, 0x12649, 0x12751, 0x12849, 0x12951, 0x12A49, 0x12B51, 0x12C49,
    0x12D51, 0x12E49, 0x12F51, 0x13049, 0x13151, 0x13249, 0x13351, 0x13449, 0x13551, 0x13649, 0x13751,
    0x13949, 0x13A51, 0x13B49, 0x13C51, 0x13D49, 0x13E51, 0x13F49, 0x14051, 0x14149, 0x14251, 0x14349,
    0x14451, 0x14549, 0x14651, 0x14749, 0x14851, 0x14A49, 0x14B51, 0x14C49, 0x14D51, 0x14E49, 0x14F51,
    0x15049, 0x15151, 0x15249, 0x15351, 0x15449, 0x15551, 0x15649, 0x15751, 0x15849, 0x15951, 0x15A49,
    0x15B51, 0x15C49, 0x15D51, 0x15E49, 0x15F51, 0x16049, 0x16151, 0x16249, 0x16351, 0x16449, 0x16551,
    0x16649, 0x16751, 0x16849, 0x16951, 0x16A49, 0x16B51, 0x16C49, 0x16D51, 0x16E49, 0x16F51, 0x17049,
    0x17151, 0x17249, 0x17351, 0x17449, 0x17551, 0x17649, 0x17751, 0x17849, 0x17A51, 0x17B49, 0x17C51,
    0x17D49, 0x17E51, 0x18149, 0x18351, 0x18449, 0x18551, 0x18649, 0x18851, 0x18949, 0x18C51, 0x18E49,
    0x19251, 0x19349, 0x19551, 0x19649, 0x19951, 0x19C49, 0x19E51, 0x19F49, 0x1A151, 0x1A249, 0x1A351,
    0x1A449, 0x1A551, 0x1A649, 0x1A851, 0x1A949, 0x1AA51, 0x1AC49, 0x1AD51, 0x1AE49, 0x1B051, 0x1B149,
    0x1B451, 0x1B549, 0x1B651, 0x1B749, 0x1B951, 0x1BB41, 0x1BC49, 0x1BD51, 0x1C041, 0x1C449, 0x1C651,
    0x1C749, 0x1C951, 0x1CA49, 0x1CC51, 0x1CD49, 0x1CE51, 0x1CF49, 0x1D051, 0x1D149, 0x1D251, 0x1D349,
    0x1D451, 0x1D549, 0x1D651, 0x1D749, 0x1D851, 0x1D949, 0x1DA51, 0x1DB49, 0x1DC51, 0x1DE49, 0x1DF51,
    0x1E049, 0x1E151, 0x1E249, 0x1E351, 0x1E449, 0x1E551, 0x1E649, 0x1E751, 0x1E849, 0x1E951, 0x1EA49,
    0x1EB51, 0x1EC49, 0x1ED51, 0x1EE49, 0x1EF51, 0x1F149, 0x1F351, 0x1F449, 0x1F551, 0x1F649, 0x1F951,
    0x1FA49, 0x1FB51, 0x1FC49, 0x1FD51, 0x1FE49, 0x1FF51, 0x20049, 0x20151, 0x20249, 0x20351, 0x20449,
    0x20551, 0x20649, 0x20751, 0x20849, 0x20951, 0x20A49, 0x20B51, 0x20C49, 0x20D51, 0x20E49, 0x20F51,
    0x21049, 0x21151, 0x21249, 0x21351, 0x21449, 0x21551, 0x21649, 0x21751, 0x21849, 0x21951, 0x21A49,
    0x21B51, 0x21C49, 0x21D51, 0x21E49, 0x21F51, 0x22049, 0x22151, 0x22249, 0x22351, 0x22449, 0x22551,
    0x22649, 0x22751, 0x22849, 0x22951, 0x22A49, 0x22B51, 0x22C49, 0x22D51, 0x22E49, 0x22F51, 0x23049,
    0x23151, 0x23249, 0x23351, 0x23A49, 0x23C51, 0x23D49, 0x23F51, 0x24149, 0x24251, 0x24349, 0x24751,
    0x24849, 0x24951, 0x24A49, 0x24B51, 0x24C49, 0x24D51, 0x24E49, 0x24F51, 0x29441, 0x29551, 0x2B041,
    0x2C206, 0x2C641, 0x2D206, 0x2E041, 0x2E506, 0x2EC41, 0x2ED06, 0x2EE41, 0x2EF06, 0x30042, 0x37049,
    0x37151, 0x37249, 0x37351, 0x37441, 0x37506, 0x37649, 0x37751, 0x37800, 0x37A41, 0x37B51, 0x37E05,
    0x37F49, 0x38000, 0x38406, 0x38649, 0x38705, 0x38849, 0x38B00, 0x38C49, 0x38D00, 0x38E49, 0x39051,
    0x39149, 0x3A200, 0x3A349, 0x3AC51, 0x3CF49, 0x3D051, 0x3D249, 0x3D551, 0x3D849, 0x3D951, 0x3DA49,
    0x3DB51, 0x3DC49, 0x3DD51, 0x3DE49, 0x3DF51, 0x3E049, 0x3E151, 0x3E249, 0x3E351, 0x3E449, 0x3E551,
    0x3E649, 0x3E751, 0x3E849, 0x3E951, 0x3EA49, 0x3EB51, 0x3EC49, 0x3ED51, 0x3EE49, 0x3EF51, 0x3F449,
    0x3F551, 0x3F606, 0x3F749, 0x3F851, 0x3F949, 0x3FB51, 0x3FD49, 0x43051, 0x46049, 0x46151, 0x46249,
    0x46351, 0x46449, 0x46551, 0x46649, 0x46751, 0x46849, 0x46951, 0x46A49, 0x46B51, 0x46C49, 0x46D51,
    0x46E49, 0x46F51, 0x47049, 0x47151, 0x47249, 0x47351, 0x47449, 0x47551, 0x47649, 0x47751, 0x47849,
    0x47951, 0x47A49, 0x47B51, 0x47C49, 0x47D51, 0x47E49, 0x47F51, 0x48049, 0x48151, 0x48206, 0x48342,
    0x48A49, 0x48B51, 0x48C49, 0x48D51, 0x48E49, 0x48F51, 0x49049, 0x49151, 0x49249, 0x49351, 0x49449,
    0x49551, 0x49649, 0x49751, 0x49849, 0x49951, 0x49A49, 0x49B51, 0x49C49, 0x49D51, 0x49E49, 0x49F51,
    0x4A049, 0x4A151, 0x4A249, 0x4A351, 0x4A449, 0x4A551, 0x4A649, 0x4A751, 0x4A849, 0x4A951, 0x4AA49,
    0x4AB51, 0x4AC49, 0x4AD51, 0x4AE49, 0x4AF51, 0x4B049, 0x4B151, 0x4B249, 0x4B351, 0x4B449, 0x4B551,
    0x4B649, 0x4B751, 0x4B849, 0x4B951, 0x4BA49, 0x4BB51, 0x4BC49, 0x4BD51, 0x4BE49, 0x4BF51, 0x4C049,
    0x4C251, 0x4C349, 0x4C451, 0x4C549, 0x4C651, 0x4C749, 0x4C851, 0x4C949, 0x4CA51, 0x4CB49, 0x4CC51,
    0x4CD49, 0x4CE51, 0x4D049, 0x4D151, 0x4D249, 0x4D351, 0x4D449, 0x4D551, 0x4D649, 0x4D751, 0x4D849,
    0x4D951, 0x4DA49, 0x4DB51, 0x4DC49, 0x4DD51, 0x4DE49, 0x4DF51, 0x4E049, 0x4E151, 0x4E249, 0x4E351,
    0x4E449, 0x4E551, 0x4E649, 0x4E751, 0x4E849, 0x4E951, 0x4EA49, 0x4EB51, 0x4EC49, 0x4ED51, 0x4EE49,
    0x4EF51, 0x4F049, 0x4F151, 0x4F249, 0x4F351, 0x4F449, 0x4F551, 0x4F649, 0x4F751, 0x4F849, 0x4F951,
    0x4FA49, 0x4FB51, 0x4FC49, 0x4FD51, 0x4FE49, 0x4FF51, 0x50049, 0x50151, 0x50249, 0x50351, 0x50449,
    0x50551, 0x50649, 0x50751, 0x50849, 0x50951, 0x50A49, 0x50B51, 0x50C49, 0x50D51, 0x50E49, 0x50F51,
    0x51049, 0x51151, 0x51249, 0x51351, 0x51449, 0x51551, 0x51649, 0x51751, 0x51849, 0x51951, 0x51A49,
    0x51B51, 0x51C49, 0x51D51, 0x51E49, 0x51F51, 0x52049, 0x52151, 0x52249, 0x52351, 0x52449, 0x52551,
    0x52649, 0x52751, 0x52849, 0x52951, 0x52A49, 0x52B51, 0x52C49, 0x52D51, 0x52E49, 0x52F51, 0x53000,
    0x53149, 0x55700, 0x55941, 0x55A05, 0x56051, 0x58905, 0x58B00, 0x58D06, 0x59000, 0x59142, 0x5BE05,
    0x5BF42, 0x5C005, 0x5C142, 0x5C305, 0x5C442, 0x5C605, 0x5C742, 0x5C800, 0x5D041, 0x5EB00, 0x5EF41,
    0x5F305, 0x5F500, 0x60606, 0x60905, 0x60B06, 0x60C05, 0x60E06, 0x61042, 0x61B05, 0x61C00, 0x61D05,
    0x62041, 0x64B42, 0x66043, 0x66A05, 0x66E41, 0x67042, 0x67141, 0x6D405, 0x6D541, 0x6D642, 0x6DD00,
    0x6DE06, 0x6DF42, 0x6E541, 0x6E742, 0x6E906, 0x6EA42, 0x6EE41, 0x6F043, 0x6FA41, 0x6FD06, 0x6FF41,
    0x70005, 0x70E00, 0x71041, 0x71142, 0x71241, 0x73042, 0x74B00, 0x74D41, 0x7A642, 0x7B141, 0x7B200,
    0x7C043, 0x7CA41, 0x7EB42, 0x7F441, 0x7F606, 0x7F705, 0x7FA41, 0x7FB00, 0x7FD42, 0x7FE06, 0x80041,
    0x81642, 0x81A41, 0x81B42, 0x82441, 0x82542, 0x82841, 0x82942, 0x82E00, 0x83005, 0x83F00, 0x84041,
    0x85942, 0x85C00, 0x85E05, 0x85F00, 0x86041, 0x86B00, 0x87041, 0x88806, 0x88941, 0x88F00, 0x89842,
    0x8A041, 0x8CA42, 0x8E200, 0x8E342, 0x90441, 0x93A42, 0x93D41, 0x93E42, 0x95041, 0x95142, 0x95841,
    0x96242, 0x96405, 0x96643, 0x97005, 0x97141, 0x98142, 0x98400, 0x98541, 0x98D00, 0x98F41, 0x99100,
    0x99341, 0x9A900, 0x9AA41, 0x9B100, 0x9B241, 0x9B300, 0x9B641, 0x9BA00, 0x9BC42, 0x9BD41, 0x9BE42,
    0x9C500, 0x9C742, 0x9C900, 0x9CB42, 0x9CE41, 0x9CF00, 0x9D742, 0x9D800, 0x9DC41, 0x9DE00, 0x9DF41,
    0x9E242, 0x9E400, 0x9E643, 0x9F041, 0x9F206, 0x9F404, 0x9FA06, 0x9FC41, 0x9FD05, 0x9FE42, 0x9FF00,
    0xA0142, 0xA0400, 0xA0541, 0xA0B00, 0xA0F41, 0xA1100, 0xA1341, 0xA2900, 0xA2A41, 0xA3100, 0xA3241,
    0xA3400, 0xA3541, 0xA3700, 0xA3841, 0xA3A00, 0xA3C42, 0xA3D00, 0xA3E42, 0xA4300, 0xA4742, 0xA4900,
    0xA4B42, 0xA4E00, 0xA5142, 0xA5200, 0xA5941, 0xA5D00, 0xA5E41, 0xA5F00, 0xA6643, 0xA7042, 0xA7241,
    0xA7542, 0xA7605, 0xA7700, 0xA8142, 0xA8400, 0xA8541, 0xA8E00, 0xA8F41, 0xA9200, 0xA9341, 0xAA900,
    0xAAA41, 0xAB100, 0xAB241, 0xAB400, 0xAB541, 0xABA00, 0xABC42, 0xABD41, 0xABE42, 0xAC600, 0xAC742,
    0xACA00, 0xACB42, 0xACE00, 0xAD041, 0xAD100, 0xAE041, 0xAE242, 0xAE400, 0xAE643, 0xAF005, 0xAF106,
    0xAF200, 0xAF941, 0xAFA42, 0xB0000, 0xB0142, 0xB0400, 0xB0541, 0xB0D00, 0xB0F41, 0xB1100, 0xB1341,
    0xB2900, 0xB2A41, 0xB3100, 0xB3241, 0xB3400, 0xB3541, 0xB3A00, 0xB3C42, 0xB3D41, 0xB3E42, 0xB4500,
    0xB4742, 0xB4900, 0xB4B42, 0xB4E00, 0xB5542, 0xB5800, 0xB5C41, 0xB5E00, 0xB5F41, 0xB6242, 0xB6400,
    0xB6643, 0xB7006, 0xB7141, 0xB7204, 0xB7800, 0xB8242, 0xB8341, 0xB8400, 0xB8541, 0xB8B00, 0xB8E41,
    0xB9100, 0xB9241, 0xB9600, 0xB9941, 0xB9B00, 0xB9C41, 0xB9D00, 0xB9E41, 0xBA000, 0xBA341, 0xBA500,
    0xBA841, 0xBAB00, 0xBAE41, 0xBBA00, 0xBBE42, 0xBC300, 0xBC642, 0xBC900, 0xBCA42, 0xBCE00, 0xBD041,
    0xBD100, 0xBD742, 0xBD800, 0xBE643, 0xBF004, 0xBF306, 0xBFB00, 0xC0042, 0xC0541, 0xC0D00, 0xC0E41,
    0xC1100, 0xC1241, 0xC2900, 0xC2A41, 0xC3A00, 0xC3C42, 0xC3D41, 0xC3E42, 0xC4500, 0xC4642, 0xC4900,
    0xC4A42, 0xC4E00, 0xC5542, 0xC5700, 0xC5841, 0xC5B00, 0xC5D41, 0xC5E00, 0xC6041, 0xC6242, 0xC6400,
    0xC6643, 0xC7000, 0xC7705, 0xC7804, 0xC7F06, 0xC8041, 0xC8142, 0xC8405, 0xC8541, 0xC8D00, 0xC8E41,
    0xC9100, 0xC9241, 0xCA900, 0xCAA41, 0xCB400, 0xCB541, 0xCBA00, 0xCBC42, 0xCBD41, 0xCBE42, 0xCC500,
    0xCC642, 0xCC900, 0xCCA42, 0xCCE00, 0xCD542, 0xCD700, 0xCDD41, 0xCDF00, 0xCE041, 0xCE242, 0xCE400,
    0xCE643, 0xCF000, 0xCF141, 0xCF342, 0xCF400, 0xD0042, 0xD0441, 0xD0D00, 0xD0E41, 0xD1100, 0xD1241,
    0xD3B42, 0xD3D41, 0xD3E42, 0xD4500, 0xD4642, 0xD4900, 0xD4A42, 0xD4E41, 0xD4F06, 0xD5000, 0xD5441,
    0xD5742, 0xD5804, 0xD5F41, 0xD6242, 0xD6400, 0xD6643, 0xD7004, 0xD7906, 0xD7A41, 0xD8000, 0xD8142,
    0xD8400, 0xD8541, 0xD9700, 0xD9A41, 0xDB200, 0xDB341, 0xDBC00, 0xDBD41, 0xDBE00, 0xDC041, 0xDC700,
    0xDCA42, 0xDCB00, 0xDCF42, 0xDD500, 0xDD642, 0xDD700, 0xDD842, 0xDE000, 0xDE643, 0xDF000, 0xDF242,
    0xDF405, 0xDF500, 0xE0141, 0xE3142, 0xE3241, 0xE3442, 0xE3B00, 0xE3F06, 0xE4041, 0xE4742, 0xE4F05,
    0xE5043, 0xE5A05, 0xE5C00, 0xE8141, 0xE8300, 0xE8441, 0xE8500, 0xE8641, 0xE8B00, 0xE8C41, 0xEA400,
    0xEA541, 0xEA600, 0xEA741, 0xEB142, 0xEB241, 0xEB442, 0xEBD41, 0xEBE00, 0xEC041, 0xEC500, 0xEC641,
    0xEC700, 0xEC842, 0xECF00, 0xED043, 0xEDA00, 0xEDC41, 0xEE000, 0xF0041, 0xF0106, 0xF0405, 0xF1306,
    0xF1405, 0xF1506, 0xF1842, 0xF1A06, 0xF2043, 0xF2A04, 0xF3406, 0xF3542, 0xF3606, 0xF3742, 0xF3806,
    0xF3942, 0xF3A05, 0xF3E42, 0xF4041, 0xF4800, 0xF4941, 0xF6D00, 0xF7142, 0xF8505, 0xF8642, 0xF8841,
    0xF8D42, 0xF9800, 0xF9942, 0xFBD00, 0xFBE06, 0xFC642, 0xFC706, 0xFCD00, 0xFCE06, 0xFD005, 0xFD506,
    0xFD905, 0xFDB00, 0x100041, 0x102B42, 0x103F41, 0x104043, 0x104A05, 0x105041, 0x105642, 0x105A41,
    0x105E42, 0x106141, 0x106242, 0x106541, 0x106742, 0x106E41, 0x107142, 0x107541, 0x108242, 0x108E41,
    0x108F42, 0x109043, 0x109A42, 0x109E06, 0x10A049, 0x10C600, 0x10C749, 0x10C800, 0x10CD49, 0x10CE00,
    0x10D051, 0x10FB05, 0x10FC41, 0x10FD51, 0x110041, 0x124900, 0x124A41, 0x124E00, 0x125041, 0x125700,
    0x125841, 0x125900, 0x125A41, 0x125E00, 0x126041, 0x128900, 0x128A41, 0x128E00, 0x129041, 0x12B100,
    0x12B241, 0x12B600, 0x12B841, 0x12BF00, 0x12C041, 0x12C100, 0x12C241, 0x12C600, 0x12C841, 0x12D700,
    0x12D841, 0x131100, 0x131241, 0x131600, 0x131841, 0x135B00, 0x135D42, 0x136005, 0x136904, 0x137D00,
    0x138041, 0x139006, 0x139A00, 0x13A049, 0x13F600, 0x13F851, 0x13FE00, 0x140005, 0x140141, 0x166D06,
    0x166E05, 0x166F41, 0x168007, 0x168141, 0x169B05, 0x169D00, 0x16A041, 0x16EB05, 0x16EE44, 0x16F141,
    0x16F900, 0x170041, 0x171242, 0x171600, 0x171F41, 0x173242, 0x173505, 0x173700, 0x174041, 0x175242,
    0x175400, 0x176041, 0x176D00, 0x176E41, 0x177100, 0x177242, 0x177400, 0x178041, 0x17B442, 0x17D405,
    0x17D741, 0x17D805, 0x17DB06, 0x17DC41, 0x17DD42, 0x17DE00, 0x17E043, 0x17EA00, 0x17F004, 0x17FA00,
    0x180005, 0x180B42, 0x180E00, 0x180F42, 0x181043, 0x181A00, 0x182041, 0x187900, 0x188041, 0x188542,
    0x188741, 0x18A942, 0x18AA41, 0x18AB00, 0x18B041, 0x18F600, 0x190041, 0x191F00, 0x192042, 0x192C00,
    0x193042, 0x193C00, 0x194006, 0x194100, 0x194405, 0x194643, 0x195041, 0x196E00, 0x197041, 0x197500,
    0x198041, 0x19AC00, 0x19B041, 0x19CA00, 0x19D043, 0x19DA04, 0x19DB00, 0x19DE06, 0x1A0041, 0x1A1742,
    0x1A1C00, 0x1A1E05, 0x1A2041, 0x1A5542, 0x1A5F00, 0x1A6042, 0x1A7D00, 0x1A7F42, 0x1A8043, 0x1A8A00,
    0x1A9043, 0x1A9A00, 0x1AA005, 0x1AA741, 0x1AA805, 0x1AAE00, 0x1AB042, 0x1ACF00, 0x1B0042, 0x1B0541,
    0x1B3442, 0x1B4541, 0x1B4D00, 0x1B5043, 0x1B5A05, 0x1B6106, 0x1B6B42, 0x1B7406, 0x1B7D05, 0x1B7F00,
    0x1B8042, 0x1B8341, 0x1BA142, 0x1BAE41, 0x1BB043, 0x1BBA41, 0x1BE642, 0x1BF400, 0x1BFC05, 0x1C0041,
    0x1C2442, 0x1C3800, 0x1C3B05, 0x1C4043, 0x1C4A00, 0x1C4D41, 0x1C5043, 0x1C5A41, 0x1C7E05, 0x1C8051,
    0x1C8900, 0x1C9049, 0x1CBB00, 0x1CBD49, 0x1CC005, 0x1CC800, 0x1CD042, 0x1CD305, 0x1CD442, 0x1CE941,
    0x1CED42, 0x1CEE41, 0x1CF442, 0x1CF541, 0x1CF742, 0x1CFA41, 0x1CFB00, 0x1D0051, 0x1D2C41, 0x1D6B51,
    0x1D7841, 0x1D7951, 0x1D9B41, 0x1DC042, 0x1E0049, 0x1E0151, 0x1E0249, 0x1E0351, 0x1E0449, 0x1E0551,
    0x1E0649, 0x1E0751, 0x1E0849, 0x1E0951, 0x1E0A49, 0x1E0B51, 0x1E0C49, 0x1E0D51, 0x1E0E49, 0x1E0F51,
    0x1E1049, 0x1E1151, 0x1E1249, 0x1E1351, 0x1E1449, 0x1E1551, 0x1E1649, 0x1E1751, 0x1E1849, 0x1E1951,
    0x1E1A49, 0x1E1B51, 0x1E1C49, 0x1E1D51, 0x1E1E49, 0x1E1F51, 0x1E2049, 0x1E2151, 0x1E2249, 0x1E2351,
    0x1E2449, 0x1E2551, 0x1E2649, 0x1E2751, 0x1E2849, 0x1E2951, 0x1E2A49, 0x1E2B51, 0x1E2C49, 0x1E2D51,
    0x1E2E49, 0x1E2F51, 0x1E3049, 0x1E3151, 0x1E3249, 0x1E3351, 0x1E3449, 0x1E3551, 0x1E3649, 0x1E3751,
    0x1E3849, 0x1E3951, 0x1E3A49, 0x1E3B51, 0x1E3C49, 0x1E3D51, 0x1E3E49, 0x1E3F51, 0x1E4049, 0x1E4151,
    0x1E4249, 0x1E4351, 0x1E4449, 0x1E4551, 0x1E4649, 0x1E4751, 0x1E4849, 0x1E4951, 0x1E4A49, 0x1E4B51,
    0x1E4C49, 0x1E4D51, 0x1E4E49, 0x1E4F51, 0x1E5049, 0x1E5151, 0x1E5249, 0x1E5351, 0x1E5449, 0x1E5551,
    0x1E5649, 0x1E5751, 0x1E5849, 0x1E5951, 0x1E5A49, 0x1E5B51, 0x1E5C49, 0x1E5D51, 0x1E5E49, 0x1E5F51,
    0x1E6049, 0x1E6151, 0x1E6249, 0x1E6351, 0x1E6449, 0x1E6551, 0x1E6649, 0x1E6751, 0x1E6849, 0x1E6951,
    0x1E6A49, 0x1E6B51, 0x1E6C49, 0x1E6D51, 0x1E6E49, 0x1E6F51, 0x1E7049, 0x1E7151, 0x1E7249, 0x1E7351,
    0x1E7449, 0x1E7551, 0x1E7649, 0x1E7751, 0x1E7849, 0x1E7951, 0x1E7A49, 0x1E7B51, 0x1E7C49, 0x1E7D51,
    0x1E7E49, 0x1E7F51, 0x1E8049, 0x1E8151, 0x1E8249, 0x1E8351, 0x1E8449, 0x1E8551, 0x1E8649, 0x1E8751,
    0x1E8849, 0x1E8951, 0x1E8A49, 0x1E8B51, 0x1E8C49, 0x1E8D51, 0x1E8E49, 0x1E8F51, 0x1E9049, 0x1E9151,
    0x1E9249, 0x1E9351, 0x1E9449, 0x1E9551, 0x1E9E49, 0x1E9F51, 0x1EA049, 0x1EA151, 0x1EA249, 0x1EA351,
    0x1EA449, 0x1EA551, 0x1EA649, 0x1EA751, 0x1EA849, 0x1EA951, 0x1EAA49, 0x1EAB51, 0x1EAC49, 0x1EAD51,
    0x1EAE49, 0x1EAF51, 0x1EB049, 0x1EB151, 0x1EB249, 0x1EB351, 0x1EB449, 0x1EB551, 0x1EB649, 0x1EB751,
    0x1EB849, 0x1EB951, 0x1EBA49, 0x1EBB51, 0x1EBC49, 0x1EBD51, 0x1EBE49, 0x1EBF51, 0x1EC049, 0x1EC151,
    0x1EC249, 0x1EC351, 0x1EC449, 0x1EC551, 0x1EC649, 0x1EC751, 0x1EC849, 0x1EC951, 0x1ECA49, 0x1ECB51,
    0x1ECC49, 0x1ECD51, 0x1ECE49, 0x1ECF51, 0x1ED049, 0x1ED151, 0x1ED249, 0x1ED351, 0x1ED449, 0x1ED551,
    0x1ED649, 0x1ED751, 0x1ED849, 0x1ED951, 0x1EDA49, 0x1EDB51, 0x1EDC49, 0x1EDD51, 0x1EDE49, 0x1EDF51,
    0x1EE049, 0x1EE151, 0x1EE249, 0x1EE351, 0x1EE449, 0x1EE551, 0x1EE649, 0x1EE751, 0x1EE849, 0x1EE951,
    0x1EEA49, 0x1EEB51, 0x1EEC49, 0x1EED51, 0x1EEE49, 0x1EEF51, 0x1EF049, 0x1EF151, 0x1EF249, 0x1EF351,
    0x1EF449, 0x1EF551, 0x1EF649, 0x1EF751, 0x1EF849, 0x1EF951, 0x1EFA49, 0x1EFB51, 0x1EFC49, 0x1EFD51,
    0x1EFE49, 0x1EFF51, 0x1F0849, 0x1F1051, 0x1F1600, 0x1F1849, 0x1F1E00, 0x1F2051, 0x1F2849, 0x1F3051,
    0x1F3849, 0x1F4051, 0x1F4600, 0x1F4849, 0x1F4E00, 0x1F5051, 0x1F5800, 0x1F5949, 0x1F5A00, 0x1F5B49,
    0x1F5C00, 0x1F5D49, 0x1F5E00, 0x1F5F49, 0x1F6051, 0x1F6849, 0x1F7051, 0x1F7E00, 0x1F8051, 0x1F8849,
    0x1F9051, 0x1F9849, 0x1FA051, 0x1FA849, 0x1FB051, 0x1FB500, 0x1FB651, 0x1FB849, 0x1FBD06, 0x1FBE51,
    0x1FBF06, 0x1FC251, 0x1FC500, 0x1FC651, 0x1FC849, 0x1FCD06, 0x1FD051, 0x1FD400, 0x1FD651, 0x1FD849,
    0x1FDC00, 0x1FDD06, 0x1FE051, 0x1FE849, 0x1FED06, 0x1FF000, 0x1FF251, 0x1FF500, 0x1FF651, 0x1FF849,
    0x1FFD06, 0x1FFF00, 0x200007, 0x200B00, 0x200C40, 0x200E00, 0x201005, 0x202807, 0x202A00, 0x202F07,
    0x203005, 0x203F45, 0x204105, 0x204406, 0x204505, 0x205206, 0x205305, 0x205445, 0x205505, 0x205F07,
    0x206000, 0x207004, 0x207141, 0x207200, 0x207404, 0x207A06, 0x207D05, 0x207F41, 0x208004, 0x208A06,
    0x208D05, 0x208F00, 0x209041, 0x209D00, 0x20A006, 0x20C100, 0x20D042, 0x20F100, 0x210006, 0x210249,
    0x210306, 0x210749, 0x210806, 0x210A51, 0x210B49, 0x210E51, 0x211049, 0x211351, 0x211406, 0x211549,
    0x211606, 0x211949, 0x211E06, 0x212449, 0x212506, 0x212649, 0x212706, 0x212849, 0x212906, 0x212A49,
    0x212E06, 0x212F51, 0x213049, 0x213451, 0x213541, 0x213951, 0x213A06, 0x213C51, 0x213E49, 0x214006,
    0x214549, 0x214651, 0x214A06, 0x214E51, 0x214F06, 0x215004, 0x216044, 0x218349, 0x218451, 0x218544,
    0x218904, 0x218A06, 0x218C00, 0x219006, 0x230805, 0x230C06, 0x232905, 0x232B06, 0x242700, 0x244006,
    0x244B00, 0x246004, 0x249C06, 0x24B646, 0x24EA04, 0x250006, 0x276805, 0x277604, 0x279406, 0x27C505,
    0x27C706, 0x27E605, 0x27F006, 0x298305, 0x299906, 0x29D805, 0x29DC06, 0x29FC05, 0x29FE06, 0x2B7400,
    0x2B7606, 0x2B9600, 0x2B9706, 0x2C0049, 0x2C3051, 0x2C6049, 0x2C6151, 0x2C6249, 0x2C6551, 0x2C6749,
    0x2C6851, 0x2C6949, 0x2C6A51, 0x2C6B49, 0x2C6C51, 0x2C6D49, 0x2C7151, 0x2C7249, 0x2C7351, 0x2C7549,
    0x2C7651, 0x2C7C41, 0x2C7E49, 0x2C8151, 0x2C8249, 0x2C8351, 0x2C8449, 0x2C8551, 0x2C8649, 0x2C8751,
    0x2C8849, 0x2C8951, 0x2C8A49, 0x2C8B51, 0x2C8C49, 0x2C8D51, 0x2C8E49, 0x2C8F51, 0x2C9049, 0x2C9151,
    0x2C9249, 0x2C9351, 0x2C9449, 0x2C9551, 0x2C9649, 0x2C9751, 0x2C9849, 0x2C9951, 0x2C9A49, 0x2C9B51,
    0x2C9C49, 0x2C9D51, 0x2C9E49, 0x2C9F51, 0x2CA049, 0x2CA151, 0x2CA249, 0x2CA351, 0x2CA449, 0x2CA551,
    0x2CA649, 0x2CA751, 0x2CA849, 0x2CA951, 0x2CAA49, 0x2CAB51, 0x2CAC49, 0x2CAD51, 0x2CAE49, 0x2CAF51,
    0x2CB049, 0x2CB151, 0x2CB249, 0x2CB351, 0x2CB449, 0x2CB551, 0x2CB649, 0x2CB751, 0x2CB849, 0x2CB951,
    0x2CBA49, 0x2CBB51, 0x2CBC49, 0x2CBD51, 0x2CBE49, 0x2CBF51, 0x2CC049, 0x2CC151, 0x2CC249, 0x2CC351,
    0x2CC449, 0x2CC551, 0x2CC649, 0x2CC751, 0x2CC849, 0x2CC951, 0x2CCA49, 0x2CCB51, 0x2CCC49, 0x2CCD51,
    0x2CCE49, 0x2CCF51, 0x2CD049, 0x2CD151, 0x2CD249, 0x2CD351, 0x2CD449, 0x2CD551, 0x2CD649, 0x2CD751,
    0x2CD849, 0x2CD951, 0x2CDA49, 0x2CDB51, 0x2CDC49, 0x2CDD51, 0x2CDE49, 0x2CDF51, 0x2CE049, 0x2CE151,
    0x2CE249, 0x2CE351, 0x2CE506, 0x2CEB49, 0x2CEC51, 0x2CED49, 0x2CEE51, 0x2CEF42, 0x2CF249, 0x2CF351,
    0x2CF400, 0x2CF905, 0x2CFD04, 0x2CFE05, 0x2D0051, 0x2D2600, 0x2D2751, 0x2D2800, 0x2D2D51, 0x2D2E00,
    0x2D3041, 0x2D6800, 0x2D6F41, 0x2D7005, 0x2D7100, 0x2D7F42, 0x2D8041, 0x2D9700, 0x2DA041, 0x2DA700,
    0x2DA841, 0x2DAF00, 0x2DB041, 0x2DB700, 0x2DB841, 0x2DBF00, 0x2DC041, 0x2DC700, 0x2DC841, 0x2DCF00,
    0x2DD041, 0x2DD700, 0x2DD841, 0x2DDF00, 0x2DE042, 0x2E0005, 0x2E2F41, 0x2E3005, 0x2E5006, 0x2E5205,
    0x2E5E00, 0x2E8026, 0x2E9A00, 0x2E9B26, 0x2EF400, 0x2F0026, 0x2FD600, 0x2FF006, 0x2FFC00, 0x300007,
    0x300105, 0x300406, 0x300561, 0x300641, 0x300764, 0x300805, 0x301206, 0x301405, 0x302006, 0x302164,
    0x302A42, 0x303005, 0x303141, 0x303606, 0x303864, 0x303B61, 0x303C41, 0x303D05, 0x303E06, 0x304000,
    0x304141, 0x309700, 0x309942, 0x309B06, 0x309D41, 0x30A005, 0x30A141, 0x30FB05, 0x30FC41, 0x310000,
    0x310541, 0x313000, 0x313141, 0x318F00, 0x319006, 0x319204, 0x319606, 0x31A041, 0x31C006, 0x31E400,
    0x31F041, 0x320006, 0x321F00, 0x322004, 0x322A06, 0x324804, 0x325006, 0x325104, 0x326006, 0x328004,
    0x328A06, 0x32B104, 0x32C006, 0x340061, 0x4DC006, 0x4E0061, 0xA00041, 0xA48D00, 0xA49006, 0xA4C700,
    0xA4D041, 0xA4FE05, 0xA50041, 0xA60D05, 0xA61041, 0xA62043, 0xA62A41, 0xA62C00, 0xA64049, 0xA64151,
    0xA64249, 0xA64351, 0xA64449, 0xA64551, 0xA64649, 0xA64751, 0xA64849, 0xA64951, 0xA64A49, 0xA64B51,
    0xA64C49, 0xA64D51, 0xA64E49, 0xA64F51, 0xA65049, 0xA65151, 0xA65249, 0xA65351, 0xA65449, 0xA65551,
    0xA65649, 0xA65751, 0xA65849, 0xA65951, 0xA65A49, 0xA65B51, 0xA65C49, 0xA65D51, 0xA65E49, 0xA65F51,
    0xA66049, 0xA66151, 0xA66249, 0xA66351, 0xA66449, 0xA66551, 0xA66649, 0xA66751, 0xA66849, 0xA66951,
    0xA66A49, 0xA66B51, 0xA66C49, 0xA66D51, 0xA66E41, 0xA66F42, 0xA67305, 0xA67442, 0xA67E05, 0xA67F41,
    0xA68049, 0xA68151, 0xA68249, 0xA68351, 0xA68449, 0xA68551, 0xA68649, 0xA68751, 0xA68849, 0xA68951,
    0xA68A49, 0xA68B51, 0xA68C49, 0xA68D51, 0xA68E49, 0xA68F51, 0xA69049, 0xA69151, 0xA69249, 0xA69351,
    0xA69449, 0xA69551, 0xA69649, 0xA69751, 0xA69849, 0xA69951, 0xA69A49, 0xA69B51, 0xA69C41, 0xA69E42,
    0xA6A041, 0xA6E644, 0xA6F042, 0xA6F205, 0xA6F800, 0xA70006, 0xA71741, 0xA72006, 0xA72249, 0xA72351,
    0xA72449, 0xA72551, 0xA72649, 0xA72751, 0xA72849, 0xA72951, 0xA72A49, 0xA72B51, 0xA72C49, 0xA72D51,
    0xA72E49, 0xA72F51, 0xA73249, 0xA73351, 0xA73449, 0xA73551, 0xA73649, 0xA73751, 0xA73849, 0xA73951,
    0xA73A49, 0xA73B51, 0xA73C49, 0xA73D51, 0xA73E49, 0xA73F51, 0xA74049, 0xA74151, 0xA74249, 0xA74351,
    0xA74449, 0xA74551, 0xA74649, 0xA74751, 0xA74849, 0xA74951, 0xA74A49, 0xA74B51, 0xA74C49, 0xA74D51,
    0xA74E49, 0xA74F51, 0xA75049, 0xA75151, 0xA75249, 0xA75351, 0xA75449, 0xA75551, 0xA75649, 0xA75751,
    0xA75849, 0xA75951, 0xA75A49, 0xA75B51, 0xA75C49, 0xA75D51, 0xA75E49, 0xA75F51, 0xA76049, 0xA76151,
    0xA76249, 0xA76351, 0xA76449, 0xA76551, 0xA76649, 0xA76751, 0xA76849, 0xA76951, 0xA76A49, 0xA76B51,
    0xA76C49, 0xA76D51, 0xA76E49, 0xA76F51, 0xA77041, 0xA77151, 0xA77949, 0xA77A51, 0xA77B49, 0xA77C51,
    0xA77D49, 0xA77F51, 0xA78049, 0xA78151, 0xA78249, 0xA78351, 0xA78449, 0xA78551, 0xA78649, 0xA78751,
    0xA78841, 0xA78906, 0xA78B49, 0xA78C51, 0xA78D49, 0xA78E51, 0xA78F41, 0xA79049, 0xA79151, 0xA79249,
    0xA79351, 0xA79649, 0xA79751, 0xA79849, 0xA79951, 0xA79A49, 0xA79B51, 0xA79C49, 0xA79D51, 0xA79E49,
    0xA79F51, 0xA7A049, 0xA7A151, 0xA7A249, 0xA7A351, 0xA7A449, 0xA7A551, 0xA7A649, 0xA7A751, 0xA7A849,
    0xA7A951, 0xA7AA49, 0xA7AF51, 0xA7B049, 0xA7B551, 0xA7B649, 0xA7B751, 0xA7B849, 0xA7B951, 0xA7BA49,
    0xA7BB51, 0xA7BC49, 0xA7BD51, 0xA7BE49, 0xA7BF51, 0xA7C049, 0xA7C151, 0xA7C249, 0xA7C351, 0xA7C449,
    0xA7C851, 0xA7C949, 0xA7CA51, 0xA7CB00, 0xA7D049, 0xA7D151, 0xA7D200, 0xA7D351, 0xA7D400, 0xA7D551,
    0xA7D649, 0xA7D751, 0xA7D849, 0xA7D951, 0xA7DA00, 0xA7F241, 0xA7F549, 0xA7F651, 0xA7F741, 0xA7FA51,
    0xA7FB41, 0xA80242, 0xA80341, 0xA80642, 0xA80741, 0xA80B42, 0xA80C41, 0xA82342, 0xA82806, 0xA82C42,
    0xA82D00, 0xA83004, 0xA83606, 0xA83A00, 0xA84041, 0xA87405, 0xA87800, 0xA88042, 0xA88241, 0xA8B442,
    0xA8C600, 0xA8CE05, 0xA8D043, 0xA8DA00, 0xA8E042, 0xA8F241, 0xA8F805, 0xA8FB41, 0xA8FC05, 0xA8FD41,
    0xA8FF42, 0xA90043, 0xA90A41, 0xA92642, 0xA92E05, 0xA93041, 0xA94742, 0xA95400, 0xA95F05, 0xA96041,
    0xA97D00, 0xA98042, 0xA98441, 0xA9B342, 0xA9C105, 0xA9CE00, 0xA9CF41, 0xA9D043, 0xA9DA00, 0xA9DE05,
    0xA9E041, 0xA9E542, 0xA9E641, 0xA9F043, 0xA9FA41, 0xA9FF00, 0xAA0041, 0xAA2942, 0xAA3700, 0xAA4041,
    0xAA4342, 0xAA4441, 0xAA4C42, 0xAA4E00, 0xAA5043, 0xAA5A00, 0xAA5C05, 0xAA6041, 0xAA7706, 0xAA7A41,
    0xAA7B42, 0xAA7E41, 0xAAB042, 0xAAB141, 0xAAB242, 0xAAB541, 0xAAB742, 0xAAB941, 0xAABE42, 0xAAC041,
    0xAAC142, 0xAAC241, 0xAAC300, 0xAADB41, 0xAADE05, 0xAAE041, 0xAAEB42, 0xAAF005, 0xAAF241, 0xAAF542,
    0xAAF700, 0xAB0141, 0xAB0700, 0xAB0941, 0xAB0F00, 0xAB1141, 0xAB1700, 0xAB2041, 0xAB2700, 0xAB2841,
    0xAB2F00, 0xAB3051, 0xAB5B06, 0xAB5C41, 0xAB6051, 0xAB6941, 0xAB6A06, 0xAB6C00, 0xAB7051, 0xABC041,
    0xABE342, 0xABEB05, 0xABEC42, 0xABEE00, 0xABF043, 0xABFA00, 0xAC0041, 0xD7A400, 0xD7B041, 0xD7C700,
    0xD7CB41, 0xD7FC00, 0xF90061, 0xFA6E00, 0xFA7061, 0xFADA00, 0xFB0051, 0xFB0700, 0xFB1351, 0xFB1800,
    0xFB1D41, 0xFB1E42, 0xFB1F41, 0xFB2906, 0xFB2A41, 0xFB3700, 0xFB3841, 0xFB3D00, 0xFB3E41, 0xFB3F00,
    0xFB4041, 0xFB4200, 0xFB4341, 0xFB4500, 0xFB4641, 0xFBB206, 0xFBC300, 0xFBD341, 0xFD3E05, 0xFD4006,
    0xFD5041, 0xFD9000, 0xFD9241, 0xFDC800, 0xFDCF06, 0xFDD000, 0xFDF041, 0xFDFC06, 0xFE0042, 0xFE1005,
    0xFE1A00, 0xFE2042, 0xFE3005, 0xFE3345, 0xFE3505, 0xFE4D45, 0xFE5005, 0xFE5300, 0xFE5405, 0xFE6206,
    0xFE6305, 0xFE6406, 0xFE6700, 0xFE6805, 0xFE6906, 0xFE6A05, 0xFE6C00, 0xFE7041, 0xFE7500, 0xFE7641,
    0xFEFD00, 0xFF0105, 0xFF0406, 0xFF0505, 0xFF0B06, 0xFF0C05, 0xFF1043, 0xFF1A05, 0xFF1C06, 0xFF1F05,
    0xFF2149, 0xFF3B05, 0xFF3E06, 0xFF3F45, 0xFF4006, 0xFF4151, 0xFF5B05, 0xFF5C06, 0xFF5D05, 0xFF5E06,
    0xFF5F05, 0xFF6641, 0xFFBF00, 0xFFC241, 0xFFC800, 0xFFCA41, 0xFFD000, 0xFFD241, 0xFFD800, 0xFFDA41,
    0xFFDD00, 0xFFE006, 0xFFE700, 0xFFE806, 0xFFEF00, 0xFFFC06, 0xFFFE00, 0x1000041, 0x1000C00, 0x1000D41,
    0x1002700, 0x1002841, 0x1003B00, 0x1003C41, 0x1003E00, 0x1003F41, 0x1004E00, 0x1005041, 0x1005E00,
    0x1008041, 0x100FB00, 0x1010005, 0x1010300, 0x1010704, 0x1013400, 0x1013706, 0x1014044, 0x1017504,
    0x1017906, 0x1018A04, 0x1018C06, 0x1018F00, 0x1019006, 0x1019D00, 0x101A006, 0x101A100, 0x101D006,
    0x101FD42, 0x101FE00, 0x1028041, 0x1029D00, 0x102A041, 0x102D100, 0x102E042, 0x102E104, 0x102FC00,
    0x1030041, 0x1032004, 0x1032400, 0x1032D41, 0x1034144, 0x1034241, 0x1034A44, 0x1034B00, 0x1035041,
    0x1037642, 0x1037B00, 0x1038041, 0x1039E00, 0x1039F05, 0x103A041, 0x103C400, 0x103C841, 0x103D005,
    0x103D144, 0x103D600, 0x1040049, 0x1042851, 0x1045041, 0x1049E00, 0x104A043, 0x104AA00, 0x104B049,
    0x104D400, 0x104D851, 0x104FC00, 0x1050041, 0x1052800, 0x1053041, 0x1056400, 0x1056F05, 0x1057049,
    0x1057B00, 0x1057C49, 0x1058B00, 0x1058C49, 0x1059300, 0x1059449, 0x1059600, 0x1059751, 0x105A200,
    0x105A351, 0x105B200, 0x105B351, 0x105BA00, 0x105BB51, 0x105BD00, 0x1060041, 0x1073700, 0x1074041,
    0x1075600, 0x1076041, 0x1076800, 0x1078041, 0x1078600, 0x1078741, 0x107B100, 0x107B241, 0x107BB00,
    0x1080041, 0x1080600, 0x1080841, 0x1080900, 0x1080A41, 0x1083600, 0x1083741, 0x1083900, 0x1083C41,
    0x1083D00, 0x1083F41, 0x1085600, 0x1085705, 0x1085804, 0x1086041, 0x1087706, 0x1087904, 0x1088041,
    0x1089F00, 0x108A704, 0x108B000, 0x108E041, 0x108F300, 0x108F441, 0x108F600, 0x108FB04, 0x1090041,
    0x1091604, 0x1091C00, 0x1091F05, 0x1092041, 0x1093A00, 0x1093F05, 0x1094000, 0x1098041, 0x109B800,
    0x109BC04, 0x109BE41, 0x109C004, 0x109D000, 0x109D204, 0x10A0041, 0x10A0142, 0x10A0400, 0x10A0542,
    0x10A0700, 0x10A0C42, 0x10A1041, 0x10A1400, 0x10A1541, 0x10A1800, 0x10A1941, 0x10A3600, 0x10A3842,
    0x10A3B00, 0x10A3F42, 0x10A4004, 0x10A4900, 0x10A5005, 0x10A5900, 0x10A6041, 0x10A7D04, 0x10A7F05,
    0x10A8041, 0x10A9D04, 0x10AA000, 0x10AC041, 0x10AC806, 0x10AC941, 0x10AE542, 0x10AE700, 0x10AEB04,
    0x10AF005, 0x10AF700, 0x10B0041, 0x10B3600, 0x10B3905, 0x10B4041, 0x10B5600, 0x10B5804, 0x10B6041,
    0x10B7300, 0x10B7804, 0x10B8041, 0x10B9200, 0x10B9905, 0x10B9D00, 0x10BA904, 0x10BB000, 0x10C0041,
    0x10C4900, 0x10C8049, 0x10CB300, 0x10CC051, 0x10CF300, 0x10CFA04, 0x10D0041, 0x10D2442, 0x10D2800,
    0x10D3043, 0x10D3A00, 0x10E6004, 0x10E7F00, 0x10E8041, 0x10EAA00, 0x10EAB42, 0x10EAD05, 0x10EAE00,
    0x10EB041, 0x10EB200, 0x10EFD42, 0x10F0041, 0x10F1D04, 0x10F2741, 0x10F2800, 0x10F3041, 0x10F4642,
    0x10F5104, 0x10F5505, 0x10F5A00, 0x10F7041, 0x10F8242, 0x10F8605, 0x10F8A00, 0x10FB041, 0x10FC504,
    0x10FCC00, 0x10FE041, 0x10FF700, 0x1100042, 0x1100341, 0x1103842, 0x1104705, 0x1104E00, 0x1105204,
    0x1106643, 0x1107042, 0x1107141, 0x1107342, 0x1107541, 0x1107600, 0x1107F42, 0x1108341, 0x110B042,
    0x110BB05, 0x110BD00, 0x110BE05, 0x110C242, 0x110C300, 0x110D041, 0x110E900, 0x110F043, 0x110FA00,
    0x1110042, 0x1110341, 0x1112742, 0x1113500, 0x1113643, 0x1114005, 0x1114441, 0x1114542, 0x1114741,
    0x1114800, 0x1115041, 0x1117342, 0x1117405, 0x1117641, 0x1117700, 0x1118042, 0x1118341, 0x111B342,
    0x111C141, 0x111C505, 0x111C942, 0x111CD05, 0x111CE42, 0x111D043, 0x111DA41, 0x111DB05, 0x111DC41,
    0x111DD05, 0x111E000, 0x111E104, 0x111F500, 0x1120041, 0x1121200, 0x1121341, 0x1122C42, 0x1123805,
    0x1123E42, 0x1123F41, 0x1124142, 0x1124200, 0x1128041, 0x1128700, 0x1128841, 0x1128900, 0x1128A41,
    0x1128E00, 0x1128F41, 0x1129E00, 0x1129F41, 0x112A905, 0x112AA00, 0x112B041, 0x112DF42, 0x112EB00,
    0x112F043, 0x112FA00, 0x1130042, 0x1130400, 0x1130541, 0x1130D00, 0x1130F41, 0x1131100, 0x1131341,
    0x1132900, 0x1132A41, 0x1133100, 0x1133241, 0x1133400, 0x1133541, 0x1133A00, 0x1133B42, 0x1133D41,
    0x1133E42, 0x1134500, 0x1134742, 0x1134900, 0x1134B42, 0x1134E00, 0x1135041, 0x1135100, 0x1135742,
    0x1135800, 0x1135D41, 0x1136242, 0x1136400, 0x1136642, 0x1136D00, 0x1137042, 0x1137500, 0x1140041,
    0x1143542, 0x1144741, 0x1144B05, 0x1145043, 0x1145A05, 0x1145C00, 0x1145D05, 0x1145E42, 0x1145F41,
    0x1146200, 0x1148041, 0x114B042, 0x114C441, 0x114C605, 0x114C741, 0x114C800, 0x114D043, 0x114DA00,
    0x1158041, 0x115AF42, 0x115B600, 0x115B842, 0x115C105, 0x115D841, 0x115DC42, 0x115DE00, 0x1160041,
    0x1163042, 0x1164105, 0x1164441, 0x1164500, 0x1165043, 0x1165A00, 0x1166005, 0x1166D00, 0x1168041,
    0x116AB42, 0x116B841, 0x116B905, 0x116BA00, 0x116C043, 0x116CA00, 0x1170041, 0x1171B00, 0x1171D42,
    0x1172C00, 0x1173043, 0x1173A04, 0x1173C05, 0x1173F06, 0x1174041, 0x1174700, 0x1180041, 0x1182C42,
    0x1183B05, 0x1183C00, 0x118A049, 0x118C051, 0x118E043, 0x118EA04, 0x118F300, 0x118FF41, 0x1190700,
    0x1190941, 0x1190A00, 0x1190C41, 0x1191400, 0x1191541, 0x1191700, 0x1191841, 0x1193042, 0x1193600,
    0x1193742, 0x1193900, 0x1193B42, 0x1193F41, 0x1194042, 0x1194141, 0x1194242, 0x1194405, 0x1194700,
    0x1195043, 0x1195A00, 0x119A041, 0x119A800, 0x119AA41, 0x119D142, 0x119D800, 0x119DA42, 0x119E141,
    0x119E205, 0x119E341, 0x119E442, 0x119E500, 0x11A0041, 0x11A0142, 0x11A0B41, 0x11A3342, 0x11A3A41,
    0x11A3B42, 0x11A3F05, 0x11A4742, 0x11A4800, 0x11A5041, 0x11A5142, 0x11A5C41, 0x11A8A42, 0x11A9A05,
    0x11A9D41, 0x11A9E05, 0x11AA300, 0x11AB041, 0x11AF900, 0x11B0005, 0x11B0A00, 0x11C0041, 0x11C0900,
    0x11C0A41, 0x11C2F42, 0x11C3700, 0x11C3842, 0x11C4041, 0x11C4105, 0x11C4600, 0x11C5043, 0x11C5A04,
    0x11C6D00, 0x11C7005, 0x11C7241, 0x11C9000, 0x11C9242, 0x11CA800, 0x11CA942, 0x11CB700, 0x11D0041,
    0x11D0700, 0x11D0841, 0x11D0A00, 0x11D0B41, 0x11D3142, 0x11D3700, 0x11D3A42, 0x11D3B00, 0x11D3C42,
    0x11D3E00, 0x11D3F42, 0x11D4641, 0x11D4742, 0x11D4800, 0x11D5043, 0x11D5A00, 0x11D6041, 0x11D6600,
    0x11D6741, 0x11D6900, 0x11D6A41, 0x11D8A42, 0x11D8F00, 0x11D9042, 0x11D9200, 0x11D9342, 0x11D9841,
    0x11D9900, 0x11DA043, 0x11DAA00, 0x11EE041, 0x11EF342, 0x11EF705, 0x11EF900, 0x11F0042, 0x11F0241,
    0x11F0342, 0x11F0441, 0x11F1100, 0x11F1241, 0x11F3442, 0x11F3B00, 0x11F3E42, 0x11F4305, 0x11F5043,
    0x11F5A00, 0x11FB041, 0x11FB100, 0x11FC004, 0x11FD506, 0x11FF200, 0x11FFF05, 0x1200041, 0x1239A00,
    0x1240044, 0x1246F00, 0x1247005, 0x1247500, 0x1248041, 0x1254400, 0x12F9041, 0x12FF105, 0x12FF300,
    0x1300041, 0x1343000, 0x1344042, 0x1344141, 0x1344742, 0x1345600, 0x1440041, 0x1464700, 0x1680041,
    0x16A3900, 0x16A4041, 0x16A5F00, 0x16A6043, 0x16A6A00, 0x16A6E05, 0x16A7041, 0x16ABF00, 0x16AC043,
    0x16ACA00, 0x16AD041, 0x16AEE00, 0x16AF042, 0x16AF505, 0x16AF600, 0x16B0041, 0x16B3042, 0x16B3705,
    0x16B3C06, 0x16B4041, 0x16B4405, 0x16B4506, 0x16B4600, 0x16B5043, 0x16B5A00, 0x16B5B04, 0x16B6200,
    0x16B6341, 0x16B7800, 0x16B7D41, 0x16B9000, 0x16E4049, 0x16E6051, 0x16E8004, 0x16E9705, 0x16E9B00,
    0x16F0041, 0x16F4B00, 0x16F4F42, 0x16F5041, 0x16F5142, 0x16F8800, 0x16F8F42, 0x16F9341, 0x16FA000,
    0x16FE041, 0x16FE225, 0x16FE361, 0x16FE442, 0x16FE500, 0x16FF062, 0x16FF200, 0x1700041, 0x187F800,
    0x1880041, 0x18CD600, 0x18D0041, 0x18D0900, 0x1AFF041, 0x1AFF400, 0x1AFF541, 0x1AFFC00, 0x1AFFD41,
    0x1AFFF00, 0x1B00041, 0x1B12300, 0x1B13241, 0x1B13300, 0x1B15041, 0x1B15300, 0x1B15541, 0x1B15600,
    0x1B16441, 0x1B16800, 0x1B17041, 0x1B2FC00, 0x1BC0041, 0x1BC6B00, 0x1BC7041, 0x1BC7D00, 0x1BC8041,
    0x1BC8900, 0x1BC9041, 0x1BC9A00, 0x1BC9C06, 0x1BC9D42, 0x1BC9F05, 0x1BCA000, 0x1CF0042, 0x1CF2E00,
    0x1CF3042, 0x1CF4700, 0x1CF5006, 0x1CFC400, 0x1D00006, 0x1D0F600, 0x1D10006, 0x1D12700, 0x1D12906,
    0x1D16542, 0x1D16A06, 0x1D16D42, 0x1D17300, 0x1D17B42, 0x1D18306, 0x1D18542, 0x1D18C06, 0x1D1AA42,
    0x1D1AE06, 0x1D1EB00, 0x1D20006, 0x1D24242, 0x1D24506, 0x1D24600, 0x1D2C004, 0x1D2D400, 0x1D2E004,
    0x1D2F400, 0x1D30006, 0x1D35700, 0x1D36004, 0x1D37900, 0x1D40049, 0x1D41A51, 0x1D43449, 0x1D44E51,
    0x1D45500, 0x1D45651, 0x1D46849, 0x1D48251, 0x1D49C49, 0x1D49D00, 0x1D49E49, 0x1D4A000, 0x1D4A249,
    0x1D4A300, 0x1D4A549, 0x1D4A700, 0x1D4A949, 0x1D4AD00, 0x1D4AE49, 0x1D4B651, 0x1D4BA00, 0x1D4BB51,
    0x1D4BC00, 0x1D4BD51, 0x1D4C400, 0x1D4C551, 0x1D4D049, 0x1D4EA51, 0x1D50449, 0x1D50600, 0x1D50749,
    0x1D50B00, 0x1D50D49, 0x1D51500, 0x1D51649, 0x1D51D00, 0x1D51E51, 0x1D53849, 0x1D53A00, 0x1D53B49,
    0x1D53F00, 0x1D54049, 0x1D54500, 0x1D54649, 0x1D54700, 0x1D54A49, 0x1D55100, 0x1D55251, 0x1D56C49,
    0x1D58651, 0x1D5A049, 0x1D5BA51, 0x1D5D449, 0x1D5EE51, 0x1D60849, 0x1D62251, 0x1D63C49, 0x1D65651,
    0x1D67049, 0x1D68A51, 0x1D6A600, 0x1D6A849, 0x1D6C106, 0x1D6C251, 0x1D6DB06, 0x1D6DC51, 0x1D6E249,
    0x1D6FB06, 0x1D6FC51, 0x1D71506, 0x1D71651, 0x1D71C49, 0x1D73506, 0x1D73651, 0x1D74F06, 0x1D75051,
    0x1D75649, 0x1D76F06, 0x1D77051, 0x1D78906, 0x1D78A51, 0x1D79049, 0x1D7A906, 0x1D7AA51, 0x1D7C306,
    0x1D7C451, 0x1D7CA49, 0x1D7CB51, 0x1D7CC00, 0x1D7CE43, 0x1D80006, 0x1DA0042, 0x1DA3706, 0x1DA3B42,
    0x1DA6D06, 0x1DA7542, 0x1DA7606, 0x1DA8442, 0x1DA8506, 0x1DA8705, 0x1DA8C00, 0x1DA9B42, 0x1DAA000,
    0x1DAA142, 0x1DAB000, 0x1DF0051, 0x1DF0A41, 0x1DF0B51, 0x1DF1F00, 0x1DF2551, 0x1DF2B00, 0x1E00042,
    0x1E00700, 0x1E00842, 0x1E01900, 0x1E01B42, 0x1E02200, 0x1E02342, 0x1E02500, 0x1E02642, 0x1E02B00,
    0x1E03041, 0x1E06E00, 0x1E08F42, 0x1E09000, 0x1E10041, 0x1E12D00, 0x1E13042, 0x1E13741, 0x1E13E00,
    0x1E14043, 0x1E14A00, 0x1E14E41, 0x1E14F06, 0x1E15000, 0x1E29041, 0x1E2AE42, 0x1E2AF00, 0x1E2C041,
    0x1E2EC42, 0x1E2F043, 0x1E2FA00, 0x1E2FF06, 0x1E30000, 0x1E4D041, 0x1E4EC42, 0x1E4F043, 0x1E4FA00,
    0x1E7E041, 0x1E7E700, 0x1E7E841, 0x1E7EC00, 0x1E7ED41, 0x1E7EF00, 0x1E7F041, 0x1E7FF00, 0x1E80041,
    0x1E8C500, 0x1E8C704, 0x1E8D042, 0x1E8D700, 0x1E90049, 0x1E92251, 0x1E94442, 0x1E94B41, 0x1E94C00,
    0x1E95043, 0x1E95A00, 0x1E95E05, 0x1E96000, 0x1EC7104, 0x1ECAC06, 0x1ECAD04, 0x1ECB006, 0x1ECB104,
    0x1ECB500, 0x1ED0104, 0x1ED2E06, 0x1ED2F04, 0x1ED3E00, 0x1EE0041, 0x1EE0400, 0x1EE0541, 0x1EE2000,
    0x1EE2141, 0x1EE2300, 0x1EE2441, 0x1EE2500, 0x1EE2741, 0x1EE2800, 0x1EE2941, 0x1EE3300, 0x1EE3441,
    0x1EE3800, 0x1EE3941, 0x1EE3A00, 0x1EE3B41, 0x1EE3C00, 0x1EE4241, 0x1EE4300, 0x1EE4741, 0x1EE4800,
    0x1EE4941, 0x1EE4A00, 0x1EE4B41, 0x1EE4C00, 0x1EE4D41, 0x1EE5000, 0x1EE5141, 0x1EE5300, 0x1EE5441,
    0x1EE5500, 0x1EE5741, 0x1EE5800, 0x1EE5941, 0x1EE5A00, 0x1EE5B41, 0x1EE5C00, 0x1EE5D41, 0x1EE5E00,
    0x1EE5F41, 0x1EE6000, 0x1EE6141, 0x1EE6300, 0x1EE6441, 0x1EE6500, 0x1EE6741, 0x1EE6B00, 0x1EE6C41,
    0x1EE7300, 0x1EE7441, 0x1EE7800, 0x1EE7941, 0x1EE7D00, 0x1EE7E41, 0x1EE7F00, 0x1EE8041, 0x1EE8A00,
    0x1EE8B41, 0x1EE9C00, 0x1EEA141, 0x1EEA400, 0x1EEA541, 0x1EEAA00, 0x1EEAB41, 0x1EEBC00, 0x1EEF006,
    0x1EEF200, 0x1F00006, 0x1F02C00, 0x1F03006, 0x1F09400, 0x1F0A006, 0x1F0AF00, 0x1F0B106, 0x1F0C000,
    0x1F0C106, 0x1F0D000, 0x1F0D106, 0x1F0F600, 0x1F10004, 0x1F10D06, 0x1F13046, 0x1F14A06, 0x1F15046,
    0x1F16A06, 0x1F17046, 0x1F18A06, 0x1F1AE00, 0x1F1E606, 0x1F20300, 0x1F21006, 0x1F23C00, 0x1F24006,
    0x1F24900, 0x1F25006, 0x1F25200, 0x1F26006, 0x1F26600, 0x1F30006, 0x1F6D800, 0x1F6DC06, 0x1F6ED00,
    0x1F6F006, 0x1F6FD00, 0x1F70006, 0x1F77700, 0x1F77B06, 0x1F7DA00, 0x1F7E006, 0x1F7EC00, 0x1F7F006,
    0x1F7F100, 0x1F80006, 0x1F80C00, 0x1F81006, 0x1F84800, 0x1F85006, 0x1F85A00, 0x1F86006, 0x1F88800,
    0x1F89006, 0x1F8AE00, 0x1F8B006, 0x1F8B200, 0x1F90006, 0x1FA5400, 0x1FA6006, 0x1FA6E00, 0x1FA7006,
    0x1FA7D00, 0x1FA8006, 0x1FA8900, 0x1FA9006, 0x1FABE00, 0x1FABF06, 0x1FAC600, 0x1FACE06, 0x1FADC00,
    0x1FAE006, 0x1FAE900, 0x1FAF006, 0x1FAF900, 0x1FB0006, 0x1FB9300, 0x1FB9406, 0x1FBCB00, 0x1FBF043,
    0x1FBFA00, 0x2000061, 0x2A6E000, 0x2A70061, 0x2B73A00, 0x2B74061, 0x2B81E00, 0x2B82061, 0x2CEA200,
    0x2CEB061, 0x2EBE100, 0x2F80061, 0x2FA1E00, 0x3000061, 0x3134B00, 0x3135061, 0x323B000, 0xE010042,
    0xE01F000,
};

/* The pre-tokenizers' class of a code point: LLM_UC_* with its flags. */
static int llm_uni_class(uint32_t c) {
    if (c < 0x80) { /* most text is ASCII: skip the search */
        if (c >= 'A' && c <= 'Z') return LLM_UC_LETTER | LLM_UC_UPPER | LLM_UC_WORD;
        if (c >= 'a' && c <= 'z') return LLM_UC_LETTER | LLM_UC_LOWER | LLM_UC_WORD;
        if (c >= '0' && c <= '9') return LLM_UC_DIGIT | LLM_UC_WORD;
        if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return LLM_UC_SPACE;
        if (c < 0x20 || c == 0x7F) return LLM_UC_OTHER;
    }
    /* the last run that starts at or before c */
    int lo = 0, hi = (int)(sizeof llm_uni_runs / sizeof llm_uni_runs[0]) - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (llm_uni_runs[mid] >> 8 <= c) lo = mid;
        else hi = mid - 1;
    }
    return (int)(llm_uni_runs[lo] & 0xFF);
}

#endif /* LLM_IMPLEMENTATION_DONE */
#endif /* LLM_IMPLEMENTATION */
