/* llm.h - a small LLM serving engine in one header, written to be read top to bottom: what vLLM does, in C.
 *
 * A GGUF model file goes in. Prompts come in as requests, from any thread. Each step the scheduler picks the
 * sequences to compute and how many tokens each (continuous batching, chunked prefill) within the KV-cache
 * blocks that are free (a paged KV cache with prefix caching and copy-on-write; when blocks run out the
 * youngest sequence is preempted and recomputed later), one forward pass computes them all, the sampler
 * picks each sequence's next token, and text streams out. The plain-C forward pass here is the CPU backend
 * and the reference the CUDA backend (llm.cu) is checked against.
 *
 * Use it stb style: include llm.h anywhere for the declarations, and in exactly one C file write
 *     #define LLM_IMPLEMENTATION
 *     #include "llm.h"
 *
 * Compile options
 *   LLM_IMPLEMENTATION            compile the implementation here (in one C file only)
 *   LLM_NO_STB_DS_IMPLEMENTATION  your program defines STB_DS_IMPLEMENTATION itself, elsewhere
 *   LLM_CUDA                      link llm.cu (built with nvcc): the engine runs on the GPU when one answers
 *   -fopenmp                      the CPU forward pass uses every core (without it, one). Run with
 *                                 GOMP_SPINCOUNT=2000: libgomp's default spinning costs 75x beside a busy
 *                                 process (the llm command sets it for itself)
 * The implementation needs libc, libm, pthreads and stb_ds.h (Debian: libstb-dev; <stb/stb_ds.h>).
 * Errors are returned (0 ok, -1 failed, a message in the caller's char err[LLM_ERR_LEN]), never exit()ed.
 *
 * The data's path, and the order of the sections below, in the declarations and in the implementation:
 *   1. GGUF         a file -> metadata and tensors       llm_gguf: memory-mapped, every offset checked
 *   2. Model        tensors -> weights and a config      llm_model: typed pointers into the file
 *   3. Tokenizer    text -> token ids                    llm_tokenizer: SentencePiece and byte-level BPE
 *   4. Chat         messages -> a prompt                 llm_chat_render: the chat template families
 *   5. Requests     token ids -> a step's plan           the scheduler: admission, budget, preemption
 *   6. Blocks       sequences -> KV-cache blocks         llm_block_manager: free list, refs, prefix cache
 *   7. Forward      a batch -> logits                    llm_backend: the CPU one here, CUDA in llm.cu
 *   8. Sampler      logits -> the next token             llm_sampler: temperature, top-k/p, min-p, penalties
 *   9. Detokenizer  token ids -> text, stop strings      llm_detok: only whole UTF-8 characters come out
 *  10. Engine       all of the above, one step at a time llm_engine: requests in, outputs out
 *   Appendix        the Unicode table the tokenizer's pre-tokenizers read
 *
 * The engine: what a program that serves a model calls
 *   llm_engine_defaults   llm_engine_create   llm_engine_destroy           a model, a backend, a KV pool
 *   llm_sampling_defaults   llm_engine_add_request   llm_engine_abort      requests in, from any thread
 *   llm_engine_step   llm_engine_wait   llm_engine_has_work                 the loop, on one thread
 *   llm_engine_get_stats   llm_engine_model   llm_finish_reason_name   llm_engine_check_blocks
 * The parts: each section's own functions, for tools, tests and programs that take one piece
 *   GGUF: llm_gguf_open, _parse, _close, _find, _tensor_find, _int, _float, _string, _arr_int, _arr_float;
 *         llm_dtype_name, llm_dtype_row_bytes, llm_dtype_dequant_row
 *   model: llm_model_load, llm_model_dummy, llm_model_dummy_names, llm_model_free
 *   tokenizer: llm_tokenizer_load, llm_tokenizer_free, llm_tokenize, llm_tokenizer_n_vocab, _bos, _eos,
 *         _adds_bos, _is_eog, _warning; llm_tokenize_prompt
 *   chat: llm_chat_template_init, llm_chat_render, llm_chat_stop_ids, llm_chat_detect, llm_chat_family_name,
 *         llm_chat_family_from_name
 *   blocks: llm_block_manager_init, llm_block_manager_free, llm_block_alloc, llm_block_release,
 *         llm_block_hash, llm_block_lookup, llm_block_set_hash
 *   forward: llm_cpu_backend_create, llm_cpu_exact_backend_create (and with LLM_CUDA:
 *         llm_cuda_backend_create, llm_cuda_weight_bytes, llm_cuda_run_gemm, llm_cuda_run_attention)
 *   sampler: llm_sampler_create, llm_sampler_free, llm_sampler_penalize, llm_sampler_candidates,
 *         llm_sampler_sample
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
    LLM_Q2_K = 10, LLM_Q3_K = 11, LLM_Q4_K = 12, LLM_Q5_K = 13, LLM_Q6_K = 14, LLM_BF16 = 30
};

typedef struct { const char *ptr; uint64_t len; } llm_str; /* points into the file: not NUL-terminated */

typedef struct {
    llm_str key;
    uint32_t type;          /* enum llm_gguf_type */
    uint32_t arr_type;      /* element type when type == LLM_GGUF_ARRAY */
    uint64_t arr_len;
    const uint8_t *data;    /* the value (or the first array element) in the file */
    llm_str *strs;          /* arrays of strings: each element, indexed once at load */
} llm_gguf_kv;

typedef struct {
    llm_str name;
    uint32_t n_dims;
    uint64_t ne[4];         /* innermost first: ne[0] values per row */
    uint32_t type;          /* enum llm_dtype */
    uint64_t offset, nbytes;
    const void *data;
} llm_gguf_tensor;

typedef struct {
    const uint8_t *base; uint64_t size; int mapped;
    uint32_t version;
    uint64_t alignment;
    int64_t n_kv, n_tensors;
    llm_gguf_kv *kv;
    llm_gguf_tensor *tensors;
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
void llm_qblock_scales(uint32_t type, const void *block, llm_qblock *b); /* all but q */
void llm_qblock_unpack(uint32_t type, const void *block, llm_qblock *b);

/* -----------------------------------------------------------------------------------------------------------
 * 2. Model: the configuration from the metadata, and the weights
 * -------------------------------------------------------------------------------------------------------- */
enum llm_arch { LLM_ARCH_LLAMA, LLM_ARCH_QWEN2, LLM_ARCH_QWEN3 };

typedef struct {
    int arch;                 /* enum llm_arch */
    int dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, context_length;
    int rope_dim;             /* leading dims of each head that RoPE rotates (usually head_dim) */
    int rope_neox;            /* 1: rotate x[i] with x[i + rope_dim/2] (qwen); 0: adjacent pairs (llama) */
    float rope_base, rms_eps;
} llm_config;

typedef struct { const void *data; uint32_t type; int64_t rows, cols; } llm_weight; /* rows of cols values */

typedef struct {
    llm_weight attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm; /* b*, *_norm: data NULL when absent */
    llm_weight ffn_norm, w_gate, w_up, w_down;
} llm_layer;

typedef struct llm_tokenizer llm_tokenizer;

typedef struct llm_model {
    llm_config cfg;
    char name[128];
    llm_gguf gguf;            /* the mapped file (zeroed for a dummy model) */
    llm_tokenizer *tok;       /* NULL for a dummy model: it takes token ids only */
    llm_weight tok_embd, output_norm, output;
    llm_layer *layers;
    void *owned;              /* weights we allocated (dummy models) */
} llm_model;

int  llm_model_load(llm_model *m, const char *path, char *err);
/* A model of a real checkpoint's shape with random weights and no file, like vLLM's dummy load format; the
 * presets are named by llm_model_dummy_names ("tiny", "tinyllama-1.1b", "llama-3.2-1b", "qwen2.5-0.5b"). */
int  llm_model_dummy(llm_model *m, const char *preset, uint64_t seed, char *err);
const char *llm_model_dummy_names(void);
void llm_model_free(llm_model *m);

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
int  llm_tokenizer_is_eog(const llm_tokenizer *t, int32_t id); /* end of generation: eos, eot, <|im_end|> */
/* What loading found doubtful, for the program to show ("" when nothing): a pre-tokenizer (tokenizer.ggml.pre)
 * it does not know, split as llama.cpp's 'default' instead. */
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
    LLM_CHAT_MISTRAL_V7_TEKKEN, LLM_CHAT_ZEPHYR, LLM_CHAT_PHI3, LLM_CHAT_GEMMA, LLM_CHAT_NFAMILIES
};

typedef struct {
    const char *role;               /* "system" (or "developer", the same), "user" or "assistant" */
    const char *content;
} llm_chat_message;

typedef struct {
    int family;                     /* enum llm_chat_family */
    char bos[64], eos[64];          /* the vocabulary's BOS and EOS texts, which some templates write */
    char default_system[1024];      /* written when the conversation has no system message, as the templates
                                     * of SmolLM2 and Qwen2.5 do ("" for none) */
    int enable_thinking;            /* Qwen3: 0 writes the empty <think></think> block that turns thinking
                                     * off (init: 1, the template's own default) */
    int dated_system;               /* Llama 3.1 and later: the system turn opens with the knowledge cutoff
                                     * and today's date, always */
    char date[32];                  /* that date, as "26 Jul 2024" (init: today's, or the template's own) */
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
/* The conversation as text, with the assistant's generation prompt at the end when asked. Returns the length
 * (which may exceed cap: then call again with more room; out is NUL-terminated when the text fits), or -1
 * for a role it does not know. */
int  llm_chat_render(const llm_chat_template *ct, const llm_chat_message *msgs, int n_msgs,
                     int add_generation_prompt, char *out, int cap);
/* The ids that end the assistant's turn in this family (<|im_end|>, <|eot_id|>, <end_of_turn>, ... and EOS),
 * to give a request as stop_token_ids. Returns how many (at most cap written). */
int  llm_chat_stop_ids(const llm_chat_template *ct, const llm_tokenizer *t, int32_t *ids, int cap);

/* -----------------------------------------------------------------------------------------------------------
 * 5. Requests: what a request asks for. (The scheduler that turns requests into each step's plan is private
 *    to the implementation: see its section 5.)
 * -------------------------------------------------------------------------------------------------------- */
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
    const char *const *stop;        /* stop strings (copied by add_request); not included in the output */
    int n_stop;
    const int32_t *stop_token_ids;  /* copied */
    int n_stop_token_ids;
    int min_tokens;                 /* end of generation and stop ids cannot be sampled before this many */
    int special_text;               /* 1: control tokens' text is output too (vLLM's skip_special_tokens=0) */
} llm_sampling_params;

llm_sampling_params llm_sampling_defaults(void);

/* -----------------------------------------------------------------------------------------------------------
 * 6. Blocks: the KV pool's bookkeeping (the memory itself is the backend's)
 * Free blocks sit in one list in least-recently-freed order. A full block of prompt or output is named by a
 * hash of (its predecessor's hash, its token ids); when freed it keeps its contents and its name, so a later
 * request with the same prefix takes it back (automatic prefix caching) until allocation evicts it.
 * -------------------------------------------------------------------------------------------------------- */
typedef struct {
    int ref_count;                  /* 0: the block is in the free list */
    int prev_free, next_free;       /* links in the free list; -1 at the ends */
    uint64_t hash;                  /* its name in the prefix cache; 0: none (llm_block_hash never gives 0) */
} llm_block;

typedef struct { uint64_t key; int value; } llm_block_hash_entry;

typedef struct {
    int num_blocks, block_size;
    llm_block *blocks;
    int free_head, free_tail, num_free_blocks;
    llm_block_hash_entry *cached;   /* stb_ds hash map: block hash -> block id */
    int enable_prefix_caching;
    int64_t evictions;
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
 * The cache is a pool of blocks of block_size token slots (per layer, K and V). A sequence owns a list of
 * blocks, its block table: position p lives in block block_table[p / block_size], slot p % block_size.
 * -------------------------------------------------------------------------------------------------------- */
/* One forward call: the new tokens of several sequences, flattened. Each token attends to its sequence's
 * positions 0..its own, read from the cache through the sequence's block table (earlier positions must be
 * there already: computed in an earlier step, or shared from the prefix cache). */
typedef struct {
    int n_tokens;
    const int32_t *tokens, *positions;  /* [n_tokens]: a sequence's tokens are at consecutive positions */
    int n_seqs;
    const int32_t *seq_start;           /* [n_seqs + 1]: sequence s: tokens [seq_start[s], seq_start[s+1]) */
    const int32_t *const *block_tables; /* [n_seqs] */
    int n_logits;
    const int32_t *logit_rows;          /* [n_logits]: the tokens whose logits come out, in this order */
    int n_copies;
    const int32_t *copy_src, *copy_dst; /* [n_copies]: blocks copied first (copy-on-write of shared blocks) */
} llm_batch;

/* A backend starts from a loaded model (the CPU reads the weights where they are, so the model must outlive
 * it; CUDA copies them to the GPU), says what a KV value costs it and how much memory it has; the engine
 * sizes the KV pool from that and calls alloc_kv once. Then each step is one forward call. */
typedef struct llm_backend {
    const char *name;
    int kv_value_bytes;             /* bytes per cached K or V value: 4 on the CPU (f32), 2 on CUDA (bf16) */
    size_t free_memory;             /* bytes left for the KV pool, after the weights and the activations */
    double default_kv_fraction;     /* the pool when the config gives no size: this fraction of free_memory
                                     * (0: room for max_num_seqs full contexts, 4 GiB at most) */
    int  (*alloc_kv)(struct llm_backend *be, int num_blocks, int block_size, char *err);
    /* logits: [n_logits][vocab_size], written for the batch's logit rows */
    int  (*forward)(struct llm_backend *be, const llm_batch *b, float *logits, char *err);
    void (*destroy)(struct llm_backend *be);
    void *ctx;
} llm_backend;

llm_backend *llm_cpu_backend_create(const llm_model *m, char *err);
/* The plain-C reference: each weight row converted to f32 exactly (llm_dtype_dequant_row) and multiplied in
 * f32, activations as they are. Slower; what the fast path and the CUDA kernels are checked against. */
llm_backend *llm_cpu_exact_backend_create(const llm_model *m, char *err);
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
    double seconds;
} llm_cuda_gemm_run;
int llm_cuda_run_gemm(llm_cuda_gemm_run *r, char *err);

/* The QKV preparation (bias, q/k norm, RoPE, K/V written to the cache) and paged attention of one layer. */
typedef struct {
    const llm_config *cfg;
    const llm_batch *batch;         /* positions and block tables (its tokens are not read) */
    int num_blocks, block_size, part_size;  /* part_size: attention partition length, a multiple of 32 */
    const float *qkv;               /* [n_tokens][q_dim + 2 kv_dim]: the QKV projection's output */
    const float *bias, *q_norm, *k_norm;    /* NULL when absent */
    float *k_cache, *v_cache;       /* in and out: [block][slot][kv_head][head_dim], llm.h's CPU layout
                                     * (f32, rounded to bf16 on the way in); the new tokens' K/V written */
    float *q_out, *att_out;         /* [n_tokens][q_dim]: q after norm and RoPE; the attention output */
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
/* The tokens sampling may pick after temperature, top-k, top-p and min-p, most likely first, with their
 * renormalised probabilities (in the sampler's scratch, valid until its next call); returns how many. */
int llm_sampler_candidates(llm_sampler *s, const llm_sampling_params *p, const float *logits,
                           const int32_t **ids, const float **probs);
/* Penalties, then the candidates, then one draw from *rng_state (greedy: the argmax). -1 when there is no
 * candidate (logits that are not numbers). */
int32_t llm_sampler_sample(llm_sampler *s, const llm_sampling_params *p, const float *logits,
                           const int32_t *history, int n_prompt, int n_history, uint64_t *rng_state);

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
typedef struct {
    const char *model_path;         /* a GGUF file, or: */
    const char *dummy;              /* a dummy preset name (random weights, token ids only) */
    uint64_t dummy_seed;
    /* NULL: the first backend that starts, of CUDA (when built in) and the CPU; or e.g.
     * llm_cpu_backend_create */
    llm_backend *(*create_backend)(const llm_model *m, char *err);
    int block_size;                 /* tokens per KV block: 16 */
    int num_blocks;                 /* the KV pool in blocks; 0: from kv_bytes */
    size_t kv_bytes;                /* the KV pool in bytes; 0: from kv_fraction */
    double kv_fraction;             /* the KV pool as a fraction of the backend's free memory (like vLLM's
                                     * gpu_memory_utilization); 0: the backend's default (llm_backend) */
    int max_num_seqs;               /* sequences in one step: 256 */
    int max_num_batched_tokens;     /* tokens in one step (the budget): 2048 */
    int max_model_len;              /* 0: the model's context length */
    int enable_prefix_caching;      /* 1 */
    int static_batching;            /* no one joins until the whole batch has finished (for comparison): 0 */
} llm_engine_config;

llm_engine_config llm_engine_defaults(void);

enum llm_finish { LLM_FINISH_NONE, LLM_FINISH_STOP, LLM_FINISH_LENGTH, LLM_FINISH_ABORT, LLM_FINISH_ERROR };
const char *llm_finish_reason_name(int reason);   /* "stop", "length", "abort", "error"; NULL for none */

typedef struct {
    uint64_t request_id;
    void *user;                     /* what add_request was given */
    int index;                      /* which of the request's n samples */
    const int32_t *token_ids;       /* new tokens this step */
    int n_tokens;
    const char *text;               /* new text this step (text that may begin a stop string is held back) */
    int text_len;
    const float *logprobs;          /* when asked: per new token, its log-probability */
    const int32_t *top_ids;         /* when logprobs = K > 0: per new token K alternatives ... */
    const float *top_logprobs;      /* ... and their log-probabilities */
    int n_top;
    int finish_reason;              /* LLM_FINISH_NONE while it runs */
    const char *error;              /* LLM_FINISH_ERROR: what went wrong */
    int n_prompt_tokens, n_cached_tokens, n_generated;
} llm_output;

typedef struct {
    const char *backend;            /* "cpu", "cuda" */
    const char *backend_note;       /* why the backends before it did not start ("" when none was skipped) */
    int block_size, max_model_len;
    size_t kv_bytes_per_block;      /* K and V of every layer for one block, as the backend stores them */
    int running, waiting;
    int num_blocks, num_free_blocks, num_cached_blocks;
    int64_t prefix_cache_queries, prefix_cache_hits;  /* in tokens */
    int64_t kv_tokens;              /* tokens whose K/V the running sequences hold */
    int64_t preemptions, prompt_tokens_computed, generation_tokens, steps, requests_finished;
} llm_engine_stats;

typedef struct llm_engine llm_engine;

llm_engine *llm_engine_create(const llm_engine_config *cfg, char *err);
void llm_engine_destroy(llm_engine *e);
/* Returns the request id (> 0), or 0 with a message when the request can never run (prompt longer than the
 * context or the KV pool, bad parameters). Give text, or token ids (prompt_ids non-NULL). user comes back in
 * every output of the request. */
uint64_t llm_engine_add_request(llm_engine *e, const char *prompt, const int32_t *prompt_ids,
                                int n_prompt_ids, const llm_sampling_params *p, void *user, char *err);
void llm_engine_abort(llm_engine *e, uint64_t request_id);  /* every sample finishes with LLM_FINISH_ABORT */
/* One scheduler step and one forward call. Returns the number of outputs: one per sample that produced
 * something or finished (with an error, too: see above). */
int  llm_engine_step(llm_engine *e, const llm_output **outputs);
/* Sleeps until there is work (requests waiting or running, or an add or abort from another thread) or
 * timeout_ms passes (-1: no limit). Returns 1 when there is work, 0 when there is none. */
int  llm_engine_wait(llm_engine *e, int timeout_ms);
int  llm_engine_has_work(llm_engine *e);                      /* llm_engine_wait(e, 0) */
llm_engine_stats llm_engine_get_stats(llm_engine *e);
const llm_model *llm_engine_model(const llm_engine *e);
/* Audits the block bookkeeping (for tests): every block's ref_count equals the number of block tables holding
 * it, free blocks are exactly those with ref_count 0, and the prefix-cache map names blocks that carry that
 * hash. 0 when consistent, else -1 and what is wrong. Call it between steps, from the engine's thread. */
int  llm_engine_check_blocks(llm_engine *e, char *err);

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
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
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
}

static float llm_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f; memcpy(&f, &bits, 4); return f;
}

static uint16_t llm_f32_to_f16(float f) { /* round to nearest even */
    uint32_t x; memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, mant = x & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
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

static int llm_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

/* ===========================================================================================================
 * 1. GGUF
 * A GGUF file is a header, key/value metadata, a table of tensor infos, then the aligned tensor data. We map
 * the file and keep pointers into it; every read goes through llm_rd, which refuses to step past the end.
 * ======================================================================================================== */
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
static llm_str llm_rd_str(llm_rd *r, const char *what) {
    llm_str s = {0, 0}; uint64_t n = llm_rd_u64(r, what);
    const uint8_t *p = llm_rd_take(r, n, what);
    if (p) { s.ptr = (const char *)p; s.len = n; }
    return s;
}

static const uint64_t llm_gguf_type_size[LLM_GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* Bytes per block and values per block of each tensor type; 0 for a type we cannot compute with. */
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
    default: return 0;
    }
}

const char *llm_dtype_name(uint32_t type) {
    switch (type) {
    case LLM_F32: return "f32";   case LLM_F16: return "f16";   case LLM_BF16: return "bf16";
    case LLM_Q8_0: return "q8_0"; case LLM_Q4_0: return "q4_0"; case LLM_Q4_1: return "q4_1";
    case LLM_Q5_0: return "q5_0"; case LLM_Q5_1: return "q5_1"; case LLM_Q2_K: return "q2_K";
    case LLM_Q3_K: return "q3_K"; case LLM_Q4_K: return "q4_K"; case LLM_Q5_K: return "q5_K";
    case LLM_Q6_K: return "q6_K";
    default: return "unknown";
    }
}

/* The metadata: each value stays in the file; arrays of strings get an index of their elements. */
static int llm_gguf_parse_kv(llm_gguf_kv *kv, llm_rd *r, char *err) {
    kv->key = llm_rd_str(r, "metadata key");
    kv->type = llm_rd_u32(r, "metadata type");
    if (r->failed) return -1;
    int klen = (int)kv->key.len;
    if (kv->type >= LLM_GGUF_NTYPES)
        return llm_fail(err, "corrupt GGUF metadata: key '%.*s' has unknown value type %u", klen, kv->key.ptr,
                        kv->type);
    kv->data = r->p;
    if (kv->type == LLM_GGUF_STRING) { llm_rd_str(r, "metadata string"); return r->failed ? -1 : 0; }
    if (kv->type != LLM_GGUF_ARRAY) {
        llm_rd_take(r, llm_gguf_type_size[kv->type], "metadata value");
        return r->failed ? -1 : 0;
    }
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

/* A tensor info: name, shape, type, offset. The size follows from the shape and the type's blocks. */
static int llm_gguf_parse_tensor(llm_gguf_tensor *t, llm_rd *r, char *err) {
    t->name = llm_rd_str(r, "tensor info");
    t->n_dims = llm_rd_u32(r, "tensor info");
    if (r->failed) return -1;
    int nlen = (int)t->name.len;
    if (t->n_dims == 0 || t->n_dims > 4)
        return llm_fail(err, "corrupt tensor '%.*s': %u dimensions", nlen, t->name.ptr, t->n_dims);
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) t->ne[d] = llm_rd_u64(r, "tensor info");
    t->type = llm_rd_u32(r, "tensor info");
    t->offset = llm_rd_u64(r, "tensor info");
    if (r->failed) return -1;
    uint64_t bb, bv;
    if (!llm_dtype_info(t->type, &bb, &bv))
        return llm_fail(err, "tensor '%.*s' has unknown or unsupported tensor type %u", nlen, t->name.ptr,
                        t->type);
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

int llm_gguf_parse(llm_gguf *g, const void *data, uint64_t size, char *err) {
    memset(g, 0, sizeof *g);
    g->base = (const uint8_t *)data; g->size = size; g->alignment = 32;
    llm_rd r = {g->base, g->base + size, err, 0};
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
    g->n_kv = (int64_t)n_kv; g->n_tensors = (int64_t)n_tensors;
    g->kv = (llm_gguf_kv *)calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = (llm_gguf_tensor *)calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        llm_gguf_close(g);
        return llm_fail(err, "out of memory reading GGUF header");
    }

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
    for (uint64_t i = 0; i < n_tensors; i++)
        if (llm_gguf_parse_tensor(&g->tensors[i], &r, err) != 0) { llm_gguf_close(g); return -1; }

    /* the data section starts at the next multiple of the alignment; each tensor must lie inside the file */
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

void llm_gguf_close(llm_gguf *g) {
    if (g->kv) for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].strs);
    free(g->kv); free(g->tensors);
    if (g->mapped) munmap((void *)g->base, g->size);
    memset(g, 0, sizeof *g);
}

const llm_gguf_kv *llm_gguf_find(const llm_gguf *g, const char *key) {
    for (int64_t i = 0; i < g->n_kv; i++) if (llm_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const llm_gguf_tensor *llm_gguf_tensor_find(const llm_gguf *g, const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (llm_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

/* One value of a numeric type, as an integer and as a double. 0 for strings and arrays. */
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
    if (kv && kv->type == LLM_GGUF_STRING) {
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
size_t llm_dtype_row_bytes(uint32_t type, int64_t n) {
    uint64_t bb, bv;
    if (!llm_dtype_info(type, &bb, &bv) || n % (int64_t)bv) return 0;
    return (size_t)(n / bv * bb);
}

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
 * The 2-bit fields run across 32 bytes: value i of a 128-value half is bits 2 * (i / 32) of byte i % 32. */
static inline __attribute__((always_inline)) void llm_qblock_read_scales(uint32_t type, const uint8_t *p,
                                                                        llm_qblock *b) {
    const uint8_t *sc;
    b->n = 32; b->sub = 32; b->offset = 0; b->d = llm_f16_at(p); b->dmin = 0;
    for (int s = 0; s < 16; s++) { b->scale[s] = 1; b->min[s] = 0; }
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
        for (int s = 0; s < 16; s++) b->scale[s] = (int8_t)p[192 + s];
        break;
    }
}
/* (inlined where a loop calls it for one type, which leaves only that type's case) */
void llm_qblock_scales(uint32_t type, const void *block, llm_qblock *b) {
    llm_qblock_read_scales(type, (const uint8_t *)block, b);
}

void llm_qblock_unpack(uint32_t type, const void *block, llm_qblock *b) {
    const uint8_t *p = (const uint8_t *)block;
    llm_qblock_scales(type, block, b);
    for (int i = 0; i < b->n; i++) {
        int u = 0, half = i / 128, k = i % 128; /* k-quants: the half of 128 values, and the place in it */
        uint32_t qh;
        switch (type) {
        case LLM_Q8_0: u = (int8_t)p[2 + i]; break;
        case LLM_Q4_0: case LLM_Q4_1: u = p[(type == LLM_Q4_0 ? 2 : 4) + i % 16] >> (4 * (i / 16)) & 15;
            break;
        case LLM_Q5_0: case LLM_Q5_1: {
            const uint8_t *q = p + (type == LLM_Q5_0 ? 2 : 4);
            memcpy(&qh, q, 4);
            u = (q[4 + i % 16] >> (4 * (i / 16)) & 15) | (qh >> i & 1) << 4;
            break;
        }
        case LLM_Q2_K: u = p[16 + half * 32 + k % 32] >> (2 * (k / 32)) & 3; break;
        case LLM_Q3_K: /* and a high bit per value, in bit i / 32 of byte i % 32: set means no offset */
            u = (p[32 + half * 32 + k % 32] >> (2 * (k / 32)) & 3) | (p[i % 32] >> (i / 32) & 1) << 2;
            break;
        case LLM_Q4_K: u = p[16 + i / 64 * 32 + i % 32] >> (4 * (i / 32 % 2)) & 15; break;
        case LLM_Q5_K: /* the nibbles of q4_K, and a fifth bit as q3_K has its third */
            u = (p[48 + i / 64 * 32 + i % 32] >> (4 * (i / 32 % 2)) & 15) | (p[16 + i % 32] >> (i / 32) & 1)
                << 4;
            break;
        case LLM_Q6_K: /* the low nibbles run across 64 bytes, the 2-bit high parts across 32 */
            u = (p[half * 64 + k % 64] >> (4 * (k / 64)) & 15) |
                (p[128 + half * 32 + k % 32] >> (2 * (k / 32)) & 3) << 4;
            break;
        }
        b->q[i] = (int8_t)(u - b->offset);
    }
}

/* Exactly what the file's values are in f32, each written in the specification's order of operations,
 * (d * scale) * q - dmin * min, so that the result is bit-exact (the build keeps a * b - c unfused). */
void llm_dtype_dequant_row(uint32_t type, const void *row, float *out, int64_t n) {
    const uint8_t *p = (const uint8_t *)row;
    uint64_t block_bytes, block_values;
    if (type == LLM_F32) { memcpy(out, row, (size_t)n * sizeof(float)); return; }
    if (type == LLM_F16 || type == LLM_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = type == LLM_F16 ? llm_f16_to_f32(h) : llm_bf16_to_f32(h);
        }
        return;
    }
    if (!llm_dtype_info(type, &block_bytes, &block_values)) return;
    llm_qblock b;
    for (int64_t at = 0; at + (int64_t)block_values <= n; at += (int64_t)block_values, p += block_bytes) {
        llm_qblock_unpack(type, p, &b);
        for (int i = 0; i < b.n; i++) {
            float ds = b.d * (float)b.scale[i / b.sub], dm = b.dmin * (float)b.min[i / b.sub];
            out[at + i] = ds * (float)b.q[i] - dm;
        }
    }
}

/* ===========================================================================================================
 * 2. Model: the configuration from the metadata, the weights as typed pointers into the mapped file
 * ======================================================================================================== */
static const char *llm_arch_names[] = {"llama", "qwen2", "qwen3"};

/* Weights stay in the file's type; the forward pass converts one row at a time (llm_dtype_dequant_row). rows
 * 0: a vector (a norm or a bias), which must be f32. */
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

/* An integer key of the config, in [lo, hi] (absent: fallback, when that is in range). */
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

static int llm_model_read_config(llm_model *m, char *err) {
    llm_gguf *g = &m->gguf;
    llm_config *c = &m->cfg;
    llm_str arch = llm_gguf_string(g, "general.architecture");
    if (!arch.ptr) return llm_fail(err, "model file has no general.architecture key");
    c->arch = -1;
    for (int i = 0; i < 3; i++) if (llm_str_eq(arch, llm_arch_names[i])) c->arch = i;
    if (c->arch < 0)
        return llm_fail(err, "unsupported architecture '%.*s' (supported: llama, qwen2, qwen3)",
                        (int)arch.len, arch.ptr);
    /* keys are prefixed by the architecture: llama.embedding_length, qwen2.block_count, ... Every number is
     * checked against its range before it is used (a count drives allocations; a cast of a value out of range
     * is undefined behaviour), and an error names the key. */
    char key[128];
#define LLM_KEY(suffix) (snprintf(key, sizeof key, "%s.%s", llm_arch_names[c->arch], suffix), key)
#define LLM_INT(field, suffix, fallback, lo, hi) \
    if (llm_config_int(g, LLM_KEY(suffix), fallback, lo, hi, &c->field, err)) return -1
#define LLM_FLOAT(field, suffix, fallback, lo, hi) \
    if (llm_config_float(g, LLM_KEY(suffix), fallback, lo, hi, &c->field, err)) return -1
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
#undef LLM_INT
#undef LLM_FLOAT
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
    c->rope_neox = c->arch != LLM_ARCH_LLAMA;
    const llm_gguf_tensor *emb = llm_gguf_tensor_find(g, "token_embd.weight");
    if (!emb) return llm_fail(err, "model file is missing tensor 'token_embd.weight'");
    c->vocab_size = (int)emb->ne[1];
    return 0;
}

static int llm_model_bind_weights(llm_model *m, char *err) {
    llm_config *c = &m->cfg;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    if (llm_model_weight(m, &m->tok_embd, "token_embd.weight", c->dim, c->vocab_size, 1, err) ||
        llm_model_weight(m, &m->output_norm, "output_norm.weight", c->dim, 0, 1, err) ||
        llm_model_weight(m, &m->output, "output.weight", c->dim, c->vocab_size, 0, err)) return -1;
    if (!m->output.data) m->output = m->tok_embd; /* tied output embedding */
    m->layers = (llm_layer *)calloc((size_t)c->n_layers, sizeof(llm_layer));
    if (!m->layers) return llm_fail(err, "out of memory");
    int qwen2 = c->arch == LLM_ARCH_QWEN2, qwen3 = c->arch == LLM_ARCH_QWEN3;
    for (int l = 0; l < c->n_layers; l++) {
        llm_layer *L = &m->layers[l];
        char name[96];
#define LLM_W(field, suffix, cols, rows, req) (snprintf(name, sizeof name, "blk.%d.%s", l, suffix), \
                                              llm_model_weight(m, &L->field, name, cols, rows, req, err))
        if (LLM_W(attn_norm, "attn_norm.weight", c->dim, 0, 1) ||
            LLM_W(wq, "attn_q.weight", c->dim, q_dim, 1) ||
            LLM_W(wk, "attn_k.weight", c->dim, kv_dim, 1) || LLM_W(wv, "attn_v.weight", c->dim, kv_dim, 1) ||
            LLM_W(wo, "attn_output.weight", q_dim, c->dim, 1) ||
            LLM_W(bq, "attn_q.bias", q_dim, 0, qwen2) || LLM_W(bk, "attn_k.bias", kv_dim, 0, qwen2) ||
            LLM_W(bv, "attn_v.bias", kv_dim, 0, qwen2) ||
            LLM_W(q_norm, "attn_q_norm.weight", c->head_dim, 0, qwen3) ||
            LLM_W(k_norm, "attn_k_norm.weight", c->head_dim, 0, qwen3) ||
            LLM_W(ffn_norm, "ffn_norm.weight", c->dim, 0, 1) ||
            LLM_W(w_gate, "ffn_gate.weight", c->dim, c->ffn_dim, 1) ||
            LLM_W(w_up, "ffn_up.weight", c->dim, c->ffn_dim, 1) ||
            LLM_W(w_down, "ffn_down.weight", c->ffn_dim, c->dim, 1))
            return -1;
#undef LLM_W
    }
    return 0;
}

int llm_model_load(llm_model *m, const char *path, char *err) {
    memset(m, 0, sizeof *m);
    if (llm_gguf_open(&m->gguf, path, err) != 0) return -1;
    if (llm_model_read_config(m, err) != 0 || llm_model_bind_weights(m, err) != 0) {
        llm_model_free(m);
        return -1;
    }
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
} llm_dummy_preset;

static const llm_dummy_preset llm_dummy_presets[] = {
    {"tiny",           LLM_ARCH_LLAMA, 128,   2,  4, 2,  32,  256,  2048,   2048, 10000.0f},
    {"tinyllama-1.1b", LLM_ARCH_LLAMA, 2048, 22, 32, 4,  64,  5632, 32000,  2048, 10000.0f},
    {"llama-3.2-1b",   LLM_ARCH_LLAMA, 2048, 16, 32, 8,  64,  8192, 128256, 8192, 500000.0f},
    {"qwen2.5-0.5b",   LLM_ARCH_QWEN2, 896,  24, 14, 2,  64,  4864, 151936, 4096, 1000000.0f},
};

const char *llm_model_dummy_names(void) { return "tiny, tinyllama-1.1b, llama-3.2-1b, qwen2.5-0.5b"; }

int llm_model_dummy(llm_model *m, const char *preset, uint64_t seed, char *err) {
    memset(m, 0, sizeof *m);
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
    snprintf(m->name, sizeof m->name, "dummy:%s", p->name);
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    /* one allocation: the matrices, then the f32 norm weights and biases */
    int64_t per_layer_mat = q_dim * c->dim * 2 + kv_dim * c->dim * 2 + (int64_t)c->ffn_dim * c->dim * 3;
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
#define LLM_TAKE_MAT(w, r, cl) \
    (w.data = mat, w.type = mat_type, w.rows = (r), w.cols = (cl), mat += (size_t)(r) * (cl) * esize)
#define LLM_TAKE_VEC(w, n) (w.data = vec, w.type = LLM_F32, w.rows = 1, w.cols = (n), vec += (n))
    LLM_TAKE_MAT(m->tok_embd, c->vocab_size, c->dim); m->output = m->tok_embd;
    LLM_TAKE_VEC(m->output_norm, c->dim);
    for (int l = 0; l < c->n_layers; l++) {
        llm_layer *L = &m->layers[l];
        LLM_TAKE_MAT(L->wq, q_dim, c->dim); LLM_TAKE_MAT(L->wk, kv_dim, c->dim);
        LLM_TAKE_MAT(L->wv, kv_dim, c->dim);
        LLM_TAKE_MAT(L->wo, c->dim, q_dim); LLM_TAKE_MAT(L->w_gate, c->ffn_dim, c->dim);
        LLM_TAKE_MAT(L->w_up, c->ffn_dim, c->dim); LLM_TAKE_MAT(L->w_down, c->dim, c->ffn_dim);
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
/* A character's class for the split patterns: letter \p{L}, mark \p{M}, digit \p{Nd}, number the rest of
 * \p{N}, punctuation \p{P}, symbol \p{S}, white space \s (the White_Space property), other the rest. */
enum {
    LLM_UC_OTHER, LLM_UC_LETTER, LLM_UC_MARK, LLM_UC_DIGIT, LLM_UC_NUMBER, LLM_UC_PUNCT, LLM_UC_SYMBOL,
    LLM_UC_SPACE
};
static int llm_uni_class(uint32_t c); /* LLM_UC_*: in the appendix, with its table */

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
typedef struct { int start, len, prev, next, id; } llm_sym;          /* a run of bytes of the text, merged */
typedef struct { double score; int left, right, len, id; } llm_pair; /* adjacent symbols that could merge */

/* The order llama.cpp's queues pop in: higher score first (BPE scores are minus the rank), then leftmost. */
static int llm_pair_first(const llm_pair *a, const llm_pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

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

/* Can symbols a and b (adjacent, a first) merge? If so fill *p. */
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

/* Merges the n symbols (a linked list over text, in order) until no pair can merge. */
static void llm_merge_symbols(const llm_tokenizer *t, const char *text, llm_sym *sym, int n) {
    llm_pair *heap = NULL, p;
    for (int i = 1; i < n; i++) if (llm_pair_make(t, text, sym, i - 1, i, &p)) llm_heap_push(&heap, p);
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
typedef struct { int32_t *ids; int cap, n, failed; } llm_out; /* counts every id, stores the first cap */

static void llm_out_put(llm_out *o, int id) {
    if (id < 0) return;
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* ---- SentencePiece ------------------------------------------------------------------------------------- */
static void llm_tokenize_spm(const llm_tokenizer *t, const char *text, size_t len, int space_prefix,
                             llm_out *o) {
    static const char space[] = "\xE2\x96\x81"; /* U+2581, SentencePiece's visible space */
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
 * into its matches and the runs of text between them, and each later regex cuts each of those pieces again, the
 * same way (a regex sees only its piece). A regex here is a list of alternatives, tried in order at each
 * position as a regex engine tries them, and each kind of alternative is one hand-written matcher below that
 * takes sets of characters as parameters. The patterns themselves are llama.cpp's (src/llama-vocab.cpp);
 * tools/pretok_check.py checks every one against Python's regex module. */

/* The sets of characters the patterns name (cls[] holds each character's LLM_UC_* class) */
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
    LLM_SET_HAN_HANGUL          /* [一-龥ࠀ-一가-퟿] */
};

static int llm_in_set(int set, uint32_t c, int uc) {
    int letter = uc == LLM_UC_LETTER, number = uc == LLM_UC_DIGIT || uc == LLM_UC_NUMBER;
    int space = uc == LLM_UC_SPACE, brk = c == '\r' || c == '\n';
    int punct = uc == LLM_UC_PUNCT, symbol = uc == LLM_UC_SYMBOL, mark = uc == LLM_UC_MARK;
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
    }
    return 0;
}

/* The kinds of alternative. prefix: a set of one optional character in front (NONE: none); body, tail: sets. */
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
    LLM_ALT_DIGIT_GROUPS    /* (?=(\d{3})+(?!\d)): an empty match where the digits left are whole threes */
};
enum { LLM_ALT_ANY_CASE = 1, LLM_ALT_PREFIX_REQUIRED = 2, LLM_ALT_THEN_CONTRACTION = 4 }; /* flags */

typedef struct { uint8_t kind, prefix, body, min, max, tail, tail_max, flags; } llm_alt;

/* The end of the run of characters of set from j (at most max of them; 0: no limit), before n. */
static int llm_set_run(int set, const uint32_t *cp, const char *cls, int j, int n, int max) {
    int end = j;
    while (end < n && (max == 0 || end - j < max) && llm_in_set(set, cp[end], cls[end])) end++;
    return end;
}

static uint32_t llm_ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static int llm_contraction(const uint32_t *cp, int i, int n, int any_case) {
    if (cp[i] != '\'' || i + 1 >= n) return -1;
    uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
    if (any_case) { a = llm_ascii_lower(a); b = llm_ascii_lower(b); }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return -1;
}

/* Where alternative a, tried at i, ends (i itself for an empty match), or -1 when it does not match there. n
 * ends the piece. */
static int llm_alt_match(const llm_alt *a, const uint32_t *cp, const char *cls, int i, int n) {
    int run, end;
    switch (a->kind) {
    case LLM_ALT_CONTRACTION: return llm_contraction(cp, i, n, a->flags & LLM_ALT_ANY_CASE);
    case LLM_ALT_BREAKS: /* all the white space, backed off to its last line break */
        end = -1;
        for (int j = i; j < n && cls[j] == LLM_UC_SPACE; j++) if (cp[j] == '\r' || cp[j] == '\n') end = j + 1;
        return end;
    case LLM_ALT_SPACES: /* all the white space at the end of the piece, else all of it but the last */
        run = llm_set_run(LLM_SET_SPACE, cp, cls, i, n, 0) - i;
        return run == 0 ? -1 : i + run == n ? n : run > 1 ? i + run - 1 : -1;
    case LLM_ALT_SPACES_JAIS2: /* the same, but in lengths of 512, 256, ..., 4, then 2 or 1 */
        run = llm_set_run(LLM_SET_SPACE, cp, cls, i, n, 0) - i;
        if (run == 0) return -1;
        for (int len = 512; len >= 1; len = len == 4 ? 2 : len / 2)
            if (len < run || (len == run && i + run == n)) return i + len;
        return i + 1;
    case LLM_ALT_DIGIT_GROUPS:
        run = 0;
        while (i + run < n && cls[i + run] == LLM_UC_DIGIT) run++;
        return run > 0 && run % 3 == 0 ? i : -1;
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
            if (j >= n || cls[j] != LLM_UC_LETTER) continue;
            for (end = j + 1; end < n;) {
                if (cls[end] == LLM_UC_LETTER || cls[end] == LLM_UC_MARK) end++;
                else if (cp[end] == ' ' && end + 1 < n && cls[end + 1] == LLM_UC_LETTER) end += 2;
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
#define LLM_RE_LLAMA3(max_digits) {                                                                           \
    LLM_CONTRACTIONS_ANY_CASE, LLM_RUN(LLM_SET_NOT_BREAK_L_N, LLM_SET_LETTER),                               \
    LLM_RUN_MAX(LLM_SET_NUMBER, max_digits),                                                                  \
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
#define LLM_RE_CASED(upper, lower, flags_, max_digits) {                                                      \
    {.kind = LLM_ALT_CASED, .prefix = LLM_SET_NOT_BREAK_L_N, .body = upper, .tail = lower, .flags = flags_},  \
    {.kind = LLM_ALT_CASED_UPPER, .prefix = LLM_SET_NOT_BREAK_L_N, .body = upper, .tail = lower,               \
     .flags = flags_},                                                                                        \
    LLM_RUN_MAX(LLM_SET_NUMBER, max_digits),                                                                  \
    LLM_RUN_TAIL(LLM_SET_SPACE_CHAR, LLM_SET_NOT_SPACE_L_N, LLM_SET_BREAK_SLASH, 0),                          \
    {.kind = LLM_ALT_BREAKS}, LLM_SPACES_THEN_ANY, {0}}
static const llm_alt llm_re_tekken[] = LLM_RE_CASED(LLM_SET_NOT_LOWER, LLM_SET_NOT_UPPER, 0, 1);
static const llm_alt llm_re_gpt4o[] =
    LLM_RE_CASED(LLM_SET_NOT_LOWER, LLM_SET_NOT_UPPER, LLM_ALT_THEN_CONTRACTION, 3);
static const llm_alt llm_re_granite_multi[] =
    LLM_RE_CASED(LLM_SET_NOT_LOWER_M, LLM_SET_NOT_UPPER_M, LLM_ALT_THEN_CONTRACTION, 3);
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
static const llm_alt llm_re_han_kana[] = {LLM_RUN(0, LLM_SET_HAN_KANA), {0}};            /* [一-龥぀-ゟ゠-ヿ]+ */
static const llm_alt llm_re_han_hangul[] = {LLM_RUN(0, LLM_SET_HAN_HANGUL), {0}};        /* [一-龥ࠀ-一가-퟿]+ */
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

/* The split patterns: each a list of regexes applied one after the other */
enum {
    LLM_PRE_DEFAULT, LLM_PRE_GPT2, LLM_PRE_LLAMA3, LLM_PRE_QWEN2, LLM_PRE_STARCODER, LLM_PRE_FALCON,
    LLM_PRE_DEEPSEEK_CODER, LLM_PRE_DEEPSEEK3, LLM_PRE_SPARK2_5, LLM_PRE_JAIS2, LLM_PRE_QWEN35, LLM_PRE_BLOOM,
    LLM_PRE_VIKING, LLM_PRE_TEKKEN, LLM_PRE_GPT4O, LLM_PRE_GRANITE_MULTI, LLM_PRE_SUPERBPE, LLM_PRE_BAILINGMOE,
    LLM_PRE_SEED_CODER, LLM_PRE_UFAKZEKA, LLM_PRE_LAGUNA, LLM_PRE_EXAONE_MOE, LLM_PRE_MINICPM5, LLM_PRE_COUNT
};
#define LLM_PRE_MAX_REGEXES 5
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
};

/* tokenizer.ggml.pre names, as llama.cpp maps them to patterns, with what else the name sets there */
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
};

/* The row of llm_pre_names that holds name, or -1. */
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
 * cut[nc] = 1 ends the last). */
static void llm_pretokenize(int pre, const uint32_t *cp, const char *cls, int nc, uint8_t *cut) {
    memset(cut, 0, (size_t)nc + 1);
    cut[0] = cut[nc] = 1;
    for (int r = 0; r < LLM_PRE_MAX_REGEXES && llm_pre_regexes[pre][r]; r++) {
        const llm_alt *alts = llm_pre_regexes[pre][r];
        for (int start = 0, end; start < nc; start = end) {
            for (end = start + 1; !cut[end]; end++) {}
            /* the regex's matches in the piece [start, end); the text between them stays as it is */
            for (int i = start; i < end;) {
                int m = -1;
                for (const llm_alt *a = alts; a->kind != LLM_ALT_END && m < 0; a++)
                    m = llm_alt_match(a, cp, cls, i, end);
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
/* Tokenizes one word w[0..n) (raw bytes). sym has room for n symbols, buf for 2 * t->max_len bytes. */
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

static void llm_tokenize_bpe(const llm_tokenizer *t, const char *text, size_t len, llm_out *o) {
    if (len == 0) return;
    uint32_t *cp = (uint32_t *)malloc(len * sizeof *cp);
    char *cls = (char *)malloc(len);
    uint8_t *cut = (uint8_t *)malloc(len + 1);
    int *off = (int *)malloc((len + 1) * sizeof *off);
    llm_sym *sym = (llm_sym *)malloc(len * sizeof *sym);
    char *buf = (char *)malloc(2 * t->max_len + 1);
    if (cp && cls && cut && off && sym && buf) {
        int nc = llm_decode_text(text, len, cp, cls, off);
        llm_pretokenize(t->pre, cp, cls, nc, cut);
        for (int i = 0, end; i < nc; i = end) {
            for (end = i + 1; !cut[end]; end++) {}
            llm_bpe_word(t, text + off[i], off[end] - off[i], sym, buf, o);
        }
    } else o->failed = 1;
    free(cp); free(cls); free(cut); free(off); free(sym); free(buf);
}

/* ---- Public: tokenize ---------------------------------------------------------------------------------- */
/* The longest special token at s, or -1: a control token only when parse_special, a user-defined one always
 * (as llama.cpp and Hugging Face's tokenizers take them). */
static int llm_special_at(const llm_tokenizer *t, const char *s, size_t n, int parse_special, size_t *len) {
    for (ptrdiff_t k = 0; k < arrlen(t->special); k++) {
        if (!parse_special && t->type[t->special[k]] != LLM_TOKEN_USER) continue;
        llm_str x = t->text[t->special[k]];
        if (x.len <= n && memcmp(x.ptr, s, x.len) == 0) { *len = x.len; return t->special[k]; }
    }
    return -1;
}

static void llm_tokenize_text(const llm_tokenizer *t, const char *s, size_t n, llm_out *o) {
    /* every part of the text starts the text or follows a special token: either way llama.cpp gives it
     * SentencePiece's space prefix */
    if (t->kind == LLM_VOCAB_SPM) llm_tokenize_spm(t, s, n, t->add_space_prefix, o);
    else llm_tokenize_bpe(t, s, n, o);
}

/* add_bos also appends EOS when the vocabulary asks for it (add_eos_token), as llama.cpp's add_special
 * does */
int llm_tokenize(const llm_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                 int32_t *out, int cap) {
    if (!t || (!text && len) || cap < 0 || (!out && cap > 0)) return -1;
    if (len > (size_t)INT32_MAX / 4) return -1; /* offsets are ints: tokenize such a text in parts */
    llm_out o = {out, cap, 0, 0};
    if (add_bos) llm_out_put(&o, t->bos);
    /* text between special tokens is tokenized on its own, as if each part were a whole text */
    size_t start = 0;
    for (size_t i = 0; i < len && !o.failed;) {
        size_t n = 0;
        int id = -1;
        if (t->special_start[(unsigned char)text[i]]) id = llm_special_at(t, text + i, len - i, parse_special, &n);
        if (id < 0) { i++; continue; }
        if (i > start) llm_tokenize_text(t, text + start, i - start, &o);
        llm_out_put(&o, id);
        start = i += n;
    }
    if (len > start && !o.failed) llm_tokenize_text(t, text + start, len - start, &o);
    if (add_bos && t->add_eos) llm_out_put(&o, t->eos);
    return o.failed ? -1 : o.n;
}

/* ---- Loading ------------------------------------------------------------------------------------------- */
static int llm_tok_id_key(const llm_gguf *g, const char *key, int fallback, int n_vocab) {
    int64_t v = llm_gguf_int(g, key, fallback); /* absent ids are stored as -1 or as 2^32 - 1 */
    return v >= 0 && v < n_vocab ? (int)v : -1;
}

typedef struct { size_t len; int id; } llm_special_sort;
static int llm_special_cmp(const void *a, const void *b) { /* longest text first, then lowest id */
    const llm_special_sort *x = (const llm_special_sort *)a, *y = (const llm_special_sort *)b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id - y->id;
}

static void llm_add_eog(llm_tokenizer *t, int id) {
    if (id < 0) return;
    for (ptrdiff_t i = 0; i < arrlen(t->eog); i++) if (t->eog[i] == id) return;
    arrput(t->eog, id);
}

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
            snprintf(warning, sizeof warning, "unknown pre-tokenizer '%.*s' (tokenizer.ggml.pre): splitting as "
                     "'default' does, which may give other ids than the model was trained on",
                     (int)(pre.len < 64 ? pre.len : 64), pre.ptr);
        }
    }

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

    /* token text -> id; where a text repeats, the last id wins, as in llama.cpp */
    if (!(key = (char *)malloc(t->max_len + 1))) goto oom;
    sh_new_arena(t->ids);
    for (uint64_t i = 0; i < n; i++) {
        llm_str s = t->text[i];
        if (s.len == 0 || memchr(s.ptr, 0, s.len)) continue; /* no C-string key for these: never looked up */
        memcpy(key, s.ptr, s.len); key[s.len] = 0;
        shput(t->ids, key, (int)i);
    }

    /* GPT-2 gives every byte a printable stand-in so that no token has spaces or control bytes in it: the
     * printable Latin-1 bytes stand for themselves, the other 68 take U+0100 onwards in byte order */
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

    /* merges: "left right", rank = line number. We keep them by the ids of the two halves; a line whose
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

    /* special tokens, matched in the text when the caller asks: longest first, so that "<|im_end|>" is not
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
    arrfree(sp);

    /* the special ids; llama.cpp's defaults for SentencePiece where the file gives none */
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

    /* end of generation: eos, eot, eom, and the control tokens chat models end their turns with */
    static const char *const eog_texts[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end_of_text|>",
                                            "<|endoftext|>", "<end_of_turn>", "</s>", "<|end|>"};
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

void llm_tokenizer_free(llm_tokenizer *t) {
    if (!t) return;
    free(t->score); free(t->type);
    shfree(t->ids); hmfree(t->merges);
    arrfree(t->special); arrfree(t->eog);
    free(t);
}

int llm_tokenizer_n_vocab(const llm_tokenizer *t) { return t ? t->n_vocab : 0; }
int llm_tokenizer_bos(const llm_tokenizer *t) { return t ? t->bos : -1; }
int llm_tokenizer_eos(const llm_tokenizer *t) { return t ? t->eos : -1; }
int llm_tokenizer_adds_bos(const llm_tokenizer *t) { return t ? t->add_bos : 0; }

int llm_tokenizer_is_eog(const llm_tokenizer *t, int32_t id) {
    if (!t || id < 0) return 0;
    for (ptrdiff_t i = 0; i < arrlen(t->eog); i++) if (t->eog[i] == id) return 1;
    return 0;
}

const char *llm_tokenizer_warning(const llm_tokenizer *t) { return t ? t->warning : ""; }

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
 * ======================================================================================================== */
static const char *llm_chat_family_names[LLM_CHAT_NFAMILIES] = {
    "chatml", "qwen3", "llama3", "llama2", "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7",
    "mistral-v7-tekken", "zephyr", "phi3", "gemma"
};

const char *llm_chat_family_name(int family) {
    return family >= 0 && family < LLM_CHAT_NFAMILIES ? llm_chat_family_names[family] : NULL;
}

int llm_chat_family_from_name(const char *name) {
    for (int f = 0; name && f < LLM_CHAT_NFAMILIES; f++)
        if (!strcmp(name, llm_chat_family_names[f])) return f;
    return -1;
}

static int llm_has(const char *s, size_t n, const char *what) { /* does s[0..n) contain what? */
    size_t m = strlen(what);
    for (size_t i = 0; m <= n && i <= n - m; i++) if (s[i] == what[0] && !memcmp(s + i, what, m)) return 1;
    return 0;
}

static int llm_vocab_has(const llm_tokenizer *t, const char *text) {
    return t && llm_tok_find(t, text, strlen(text)) >= 0;
}

/* Each family's markers, checked most specific first (the order of llama.cpp's llm_chat_detect_template). */
int llm_chat_detect(const char *tt, size_t n, const llm_tokenizer *t) {
    if (tt && n) {
        if (llm_has(tt, n, "<|im_start|>"))
            return llm_has(tt, n, "<think>") || llm_has(tt, n, "enable_thinking") ? LLM_CHAT_QWEN3
                                                                                   : LLM_CHAT_CHATML;
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
 * <|im_end|>. Where an expression follows instead (messages[0]['content']), that is not it. */
static void llm_chat_find_default_system(const char *tt, size_t n, char *out, size_t cap) {
    static const char marker[] = "<|im_start|>system";
    size_t m = sizeof marker - 1;
    out[0] = 0;
    for (size_t i = 0; tt && m <= n && i <= n - m; i++) {
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

static void llm_chat_copy_token_text(const llm_tokenizer *t, int id, char *out, size_t cap) {
    out[0] = 0;
    if (id < 0 || id >= t->n_vocab || t->text[id].len >= cap) return;
    memcpy(out, t->text[id].ptr, t->text[id].len);
    out[t->text[id].len] = 0;
}

int llm_chat_template_init(llm_chat_template *ct, const char *template_text, size_t len,
                           const llm_tokenizer *t, const char *name, char *err) {
    memset(ct, 0, sizeof *ct);
    if (!t) return llm_fail(err, "this model has no vocabulary, so it cannot chat");
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
    llm_chat_copy_token_text(t, t->bos, ct->bos, sizeof ct->bos);
    llm_chat_copy_token_text(t, t->eos, ct->eos, sizeof ct->eos);
    ct->enable_thinking = 1;
    if (ct->family == LLM_CHAT_CHATML)
        llm_chat_find_default_system(tt.ptr, tt.len, ct->default_system, sizeof ct->default_system);
    /* Llama 3.1's template dates the system turn 26 Jul 2024; 3.2's asks for today's date (strftime_now) */
    ct->dated_system = ct->family == LLM_CHAT_LLAMA3 && llm_has(tt.ptr, tt.len, "Cutting Knowledge Date");
    snprintf(ct->date, sizeof ct->date, "26 Jul 2024");
    if (llm_has(tt.ptr, tt.len, "strftime_now")) {
        time_t now = time(NULL);
        struct tm tm;
        if (localtime_r(&now, &tm)) strftime(ct->date, sizeof ct->date, "%d %b %Y", &tm);
    }
    return 0;
}

/* ---- Rendering ----------------------------------------------------------------------------------------- */
typedef struct { char *out; size_t cap, n; } llm_chat_text; /* counts every byte, stores the first cap */

static void llm_chat_put(llm_chat_text *c, const char *s, size_t n) {
    if (c->n < c->cap) memcpy(c->out + c->n, s, c->n + n <= c->cap ? n : c->cap - c->n);
    c->n += n;
}
static void llm_chat_puts(llm_chat_text *c, const char *s) { llm_chat_put(c, s, strlen(s)); }

/* Python's str.strip() of white space (Jinja's trim), and strip(chars) of one character, on each side asked
 * (ASCII white space, and the separators 0x1c-0x1f that Python counts too) */
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

enum { LLM_ROLE_SYSTEM, LLM_ROLE_USER, LLM_ROLE_ASSISTANT };
static int llm_chat_role(const char *role) {
    if (!role) return -1;
    if (!strcmp(role, "system") || !strcmp(role, "developer")) return LLM_ROLE_SYSTEM;
    if (!strcmp(role, "user")) return LLM_ROLE_USER;
    return !strcmp(role, "assistant") ? LLM_ROLE_ASSISTANT : -1;
}
static const char *llm_chat_role_names[] = {"system", "user", "assistant"};

/* Qwen3 (Qwen/Qwen3-0.6B): an assistant turn. Its reasoning (inside <think></think>) is kept after the last
 * user turn, where the last turn always shows the <think> block; elsewhere only the text after </think>. */
static void llm_qwen3_assistant(llm_chat_text *c, const char *content, int after_last_user, int last) {
    const char *first_end = strstr(content, "</think>"), *body = content, *reasoning = "";
    size_t n_reasoning = 0;
    if (first_end) {
        for (const char *p = first_end; p; p = strstr(p + 1, "</think>")) body = p + 8;
        while (*body == '\n') body++;
        reasoning = content;
        for (const char *p = content; (p = strstr(p, "<think>")) && p < first_end; p++) reasoning = p + 7;
        n_reasoning = (size_t)(first_end - reasoning);
    }
    while (n_reasoning && reasoning[0] == '\n') { reasoning++; n_reasoning--; }
    while (n_reasoning && reasoning[n_reasoning - 1] == '\n') n_reasoning--;
    if (after_last_user && (last || n_reasoning)) {
        llm_chat_puts(c, "<think>\n");
        llm_chat_put(c, reasoning, n_reasoning);
        llm_chat_puts(c, "\n</think>\n\n");
        while (*body == '\n') body++;
    }
    llm_chat_puts(c, body);
}

int llm_chat_render(const llm_chat_template *ct, const llm_chat_message *msgs, int n, int gen, char *out,
                    int cap) {
    llm_chat_text c = {out, out && cap > 0 ? (size_t)cap : 0, 0};
    int *role = (int *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    if (!role || n < 0) { free(role); return -1; }
    for (int i = 0; i < n; i++) if ((role[i] = llm_chat_role(msgs[i].role)) < 0) { free(role); return -1; }
#define CONTENT(i) (msgs[i].content ? msgs[i].content : "")
    int has_sys = n > 0 && role[0] == LLM_ROLE_SYSTEM, first = has_sys; /* first: after the system turn */
    const char *sys = has_sys ? CONTENT(0) : "";
    const char *bos = ct->bos, *eos = ct->eos;
    switch (ct->family) {
    case LLM_CHAT_QWEN3: { /* Qwen/Qwen3-0.6B */
        int last_user = n - 1;
        while (last_user >= 0 && role[last_user] != LLM_ROLE_USER) last_user--;
        for (int i = 0; i < n; i++) {
            if (role[i] != LLM_ROLE_ASSISTANT) {
                llm_chat_puts(&c, "<|im_start|>"); llm_chat_puts(&c, llm_chat_role_names[role[i]]);
                llm_chat_puts(&c, "\n"); llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, "<|im_end|>\n");
                continue;
            }
            llm_chat_puts(&c, "<|im_start|>assistant\n");
            llm_qwen3_assistant(&c, CONTENT(i), i > last_user, i == n - 1);
            llm_chat_puts(&c, "<|im_end|>\n");
        }
        if (gen) llm_chat_puts(&c, ct->enable_thinking ? "<|im_start|>assistant\n" :
                               "<|im_start|>assistant\n<think>\n\n</think>\n\n");
        break;
    }
    case LLM_CHAT_LLAMA3: /* meta-llama/Meta-Llama-3-8B-Instruct; dated: Llama-3.1-8B-Instruct, 3.2-1B */
        llm_chat_puts(&c, bos);
        if (ct->dated_system) {
            llm_chat_puts(&c, "<|start_header_id|>system<|end_header_id|>\n\n"
                          "Cutting Knowledge Date: December 2023\nToday Date: ");
            llm_chat_puts(&c, ct->date); llm_chat_puts(&c, "\n\n");
            llm_chat_put_trimmed(&c, sys); llm_chat_puts(&c, "<|eot_id|>");
        }
        for (int i = ct->dated_system ? first : 0; i < n; i++) {
            llm_chat_puts(&c, "<|start_header_id|>"); llm_chat_puts(&c, llm_chat_role_names[role[i]]);
            llm_chat_puts(&c, "<|end_header_id|>\n\n");
            llm_chat_put_trimmed(&c, CONTENT(i)); llm_chat_puts(&c, "<|eot_id|>");
        }
        if (gen) llm_chat_puts(&c, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case LLM_CHAT_LLAMA2: /* meta-llama/Llama-2-7b-chat-hf: no generation prompt; no later system turns */
        for (int i = first; i < n; i++) {
            char *joined = NULL; /* the system block joins the first turn before the strip */
            const char *content = CONTENT(i);
            if (i == first && has_sys) {
                size_t len = strlen(sys) + strlen(content) + 32;
                if (!(joined = (char *)malloc(len))) { free(role); return -1; }
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
    case LLM_CHAT_MISTRAL_V3: /* mistralai/Mistral-7B-Instruct-v0.3: the system prompt joins the last turn */
    case LLM_CHAT_MISTRAL_V3_TEKKEN: { /* mistralai/Mistral-Nemo-Instruct-2407 */
        int tekken = ct->family == LLM_CHAT_MISTRAL_V3_TEKKEN;
        llm_chat_puts(&c, bos);
        for (int i = first; i < n; i++) {
            if (role[i] == LLM_ROLE_USER) {
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
    case LLM_CHAT_MISTRAL_V7: /* mistralai/Mistral-Large-Instruct-2411 */
    case LLM_CHAT_MISTRAL_V7_TEKKEN: { /* mistralai/Mistral-Small-24B-Instruct-2501, without its default */
        int tekken = ct->family == LLM_CHAT_MISTRAL_V7_TEKKEN;
        llm_chat_puts(&c, bos);
        for (int i = 0; i < n; i++) {
            if (role[i] == LLM_ROLE_SYSTEM) {
                llm_chat_puts(&c, tekken ? "[SYSTEM_PROMPT]" : "[SYSTEM_PROMPT] ");
                llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, "[/SYSTEM_PROMPT]");
            } else if (role[i] == LLM_ROLE_USER) {
                llm_chat_puts(&c, tekken ? "[INST]" : "[INST] "); llm_chat_puts(&c, CONTENT(i));
                llm_chat_puts(&c, "[/INST]");
            } else {
                if (!tekken) llm_chat_puts(&c, " ");
                llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, eos);
            }
        }
        break;
    }
    case LLM_CHAT_ZEPHYR: /* TinyLlama/TinyLlama-1.1B-Chat-v1.0, HuggingFaceH4/zephyr-7b-beta */
    case LLM_CHAT_PHI3:   /* microsoft/Phi-3.5-mini-instruct */
        for (int i = 0; i < n; i++) {
            llm_chat_puts(&c, "<|"); llm_chat_puts(&c, llm_chat_role_names[role[i]]);
            llm_chat_puts(&c, "|>\n");
            llm_chat_puts(&c, CONTENT(i));
            llm_chat_puts(&c, ct->family == LLM_CHAT_PHI3 ? "<|end|>" : eos); llm_chat_puts(&c, "\n");
        }
        if (gen && (n > 0 || ct->family == LLM_CHAT_PHI3)) llm_chat_puts(&c, "<|assistant|>\n");
        else if (ct->family == LLM_CHAT_PHI3) llm_chat_puts(&c, eos);
        break;
    case LLM_CHAT_GEMMA: /* google/gemma-3-1b-it: the system prompt opens the first turn */
        llm_chat_puts(&c, bos);
        for (int i = first; i < n; i++) {
            llm_chat_puts(&c, "<start_of_turn>");
            llm_chat_puts(&c, role[i] == LLM_ROLE_ASSISTANT ? "model" : llm_chat_role_names[role[i]]);
            llm_chat_puts(&c, "\n");
            if (i == first && has_sys) { llm_chat_puts(&c, sys); llm_chat_puts(&c, "\n\n"); }
            llm_chat_put_trimmed(&c, CONTENT(i)); llm_chat_puts(&c, "<end_of_turn>\n");
        }
        if (gen) llm_chat_puts(&c, "<start_of_turn>model\n");
        break;
    default: /* ChatML: HuggingFaceTB/SmolLM2-135M-Instruct, Qwen/Qwen2.5-0.5B-Instruct */
        if (!has_sys && n > 0 && ct->default_system[0]) {
            llm_chat_puts(&c, "<|im_start|>system\n"); llm_chat_puts(&c, ct->default_system);
            llm_chat_puts(&c, "<|im_end|>\n");
        }
        for (int i = 0; i < n; i++) {
            llm_chat_puts(&c, "<|im_start|>"); llm_chat_puts(&c, llm_chat_role_names[role[i]]);
            llm_chat_puts(&c, "\n"); llm_chat_puts(&c, CONTENT(i)); llm_chat_puts(&c, "<|im_end|>\n");
        }
        if (gen) llm_chat_puts(&c, "<|im_start|>assistant\n");
        break;
    }
#undef CONTENT
    free(role);
    if (c.n >= (size_t)INT32_MAX) return -1;
    if (c.n < c.cap) out[c.n] = 0;
    return (int)c.n;
}

int llm_chat_stop_ids(const llm_chat_template *ct, const llm_tokenizer *t, int32_t *ids, int cap) {
    static const char *const end_of_turn[LLM_CHAT_NFAMILIES][2] = {
        [LLM_CHAT_CHATML] = {"<|im_end|>"}, [LLM_CHAT_QWEN3] = {"<|im_end|>"},
        [LLM_CHAT_LLAMA3] = {"<|eot_id|>", "<|eom_id|>"}, [LLM_CHAT_PHI3] = {"<|end|>"},
        [LLM_CHAT_GEMMA] = {"<end_of_turn>"},
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
 * allow. The plan is a list of (sequence, new tokens) and the block copies that copy-on-write needs before
 * the forward pass.
 * ======================================================================================================== */
llm_sampling_params llm_sampling_defaults(void) {
    llm_sampling_params p;
    memset(&p, 0, sizeof p);
    p.n = 1; p.temperature = 1.0f; p.top_p = 1.0f; p.repetition_penalty = 1.0f; p.seed = -1; p.logprobs = -1;
    return p;
}

typedef struct llm_request {
    uint64_t id;
    void *user;
    llm_sampling_params params;     /* its stop strings and stop ids point at the copies below */
    char **stop_copies;
    int32_t *stop_ids_copy;
    int n_prompt;
    int refs;                       /* sequences still pointing here */
} llm_request;

enum { LLM_SEQ_WAITING, LLM_SEQ_RUNNING, LLM_SEQ_FINISHED };

typedef struct llm_seq {
    llm_request *req;
    int index;                      /* which of the request's n samples */
    int status;
    int32_t *tokens;                /* stb_ds array: the prompt, then the generated tokens */
    int n_computed;                 /* tokens [0, n_computed) have their K/V in the cache */
    int32_t *block_table;           /* stb_ds array: the blocks that hold them, in position order */
    int n_hashed_blocks;            /* leading full blocks named in the prefix cache ... */
    uint64_t last_hash;             /* ... and the name of the last of them */
    int fork_pending;               /* n > 1 and the prompt is not computed yet: this one stands for all n */
    int n_cached_tokens;            /* prompt tokens the prefix cache had at admission */
    uint64_t rng;
    int finish_reason;
    const char *error;              /* LLM_FINISH_ERROR: what went wrong */
    llm_detok detok;
    char *held_text;                /* stb_ds array: text decoded, not emitted (may begin a stop string) */
    /* this step's output (stb_ds arrays, emptied at the start of each step) */
    int32_t *out_tokens; char *out_text; float *out_logprobs; int32_t *out_top_ids; float *out_top_logprobs;
} llm_seq;

typedef struct {
    int max_num_seqs, max_num_batched_tokens, static_batching;
    llm_block_manager *bm;
    llm_seq **waiting, **running;   /* stb_ds arrays, in order of arrival; waiting is served from the front */
    int static_batch_open;          /* static batching: the batch may take new sequences */
    /* the plan of this step: scheduled[i] computes n_new[i] tokens from its n_computed on, after the
     * copies */
    llm_seq **scheduled;
    int *n_new;
    int32_t *copy_src, *copy_dst;
    int64_t preemptions, prefix_cache_queries, prefix_cache_hits;
} llm_scheduler;

static void llm_seq_release_blocks(llm_block_manager *bm, llm_seq *s) {
    for (int i = 0; i < arrlen(s->block_table); i++) llm_block_release(bm, s->block_table[i]);
    arrsetlen(s->block_table, 0);
    s->n_computed = 0; s->n_hashed_blocks = 0; s->last_hash = 0;
}

/* Gives s the blocks for positions [0, n_total), with a private copy of any shared block it is about to write
 * (copy-on-write), and returns 1; or, when the pool has not that many free blocks, changes nothing and
 * returns 0. */
static int llm_seq_reserve(llm_scheduler *sch, llm_seq *s, int n_total) {
    llm_block_manager *bm = sch->bm;
    int bs = bm->block_size, first = s->n_computed / bs, have = (int)arrlen(s->block_table);
    int want = (n_total + bs - 1) / bs, need = want > have ? want - have : 0;
    for (int b = first; b < have && b * bs < n_total; b++)
        need += bm->blocks[s->block_table[b]].ref_count > 1;
    if (need > bm->num_free_blocks) return 0;
    for (int b = first; b < have && b * bs < n_total; b++) {
        int shared = s->block_table[b];
        if (bm->blocks[shared].ref_count <= 1) continue;
        int copy = llm_block_alloc(bm);
        arrput(sch->copy_src, shared); arrput(sch->copy_dst, copy);
        llm_block_release(bm, shared);
        s->block_table[b] = copy;
    }
    while (arrlen(s->block_table) < want) arrput(s->block_table, llm_block_alloc(bm));
    return 1;
}

/* The longest run of whole cached blocks at the start of the tokens, leaving at least one token to compute
 * (the step that computes it gives the logits to sample from). */
static void llm_seq_take_cached_prefix(llm_block_manager *bm, llm_seq *s) {
    int bs = bm->block_size, n = (int)arrlen(s->tokens);
    if (!bm->enable_prefix_caching) return;
    uint64_t h = 0;
    for (int b = 0; (b + 1) * bs <= n - 1; b++) {
        uint64_t hb = llm_block_hash(h, s->tokens + b * bs, bs);
        int id = llm_block_lookup(bm, hb);
        if (id < 0) break;
        arrput(s->block_table, id);
        h = hb; s->n_hashed_blocks = b + 1; s->last_hash = hb; s->n_computed = (b + 1) * bs;
    }
}

/* Preemption by recompute: the sequence gives its blocks back and waits at the head of the queue. */
static void llm_preempt(llm_scheduler *sch, llm_seq *s) {
    llm_seq_release_blocks(sch->bm, s);
    s->status = LLM_SEQ_WAITING;
    arrins(sch->waiting, 0, s);
    sch->preemptions++;
}

static void llm_schedule_add(llm_scheduler *sch, llm_seq *s, int n_new, int *budget) {
    arrput(sch->scheduled, s); arrput(sch->n_new, n_new);
    *budget -= n_new;
}

static void llm_schedule(llm_scheduler *sch) {
    int budget = sch->max_num_batched_tokens, preempted = 0;
    arrsetlen(sch->scheduled, 0); arrsetlen(sch->n_new, 0);
    arrsetlen(sch->copy_src, 0); arrsetlen(sch->copy_dst, 0);
    /* running sequences first, oldest first */
    for (int i = 0; i < arrlen(sch->running) && budget > 0; i++) {
        llm_seq *s = sch->running[i];
        int n_new = (int)arrlen(s->tokens) - s->n_computed, ok;
        if (n_new > budget) n_new = budget;
        while (!(ok = llm_seq_reserve(sch, s, s->n_computed + n_new))) {
            /* out of blocks: the youngest running sequence gives its blocks back (perhaps s itself) */
            llm_seq *victim = arrpop(sch->running);
            llm_preempt(sch, victim);
            preempted = 1;
            if (victim == s) break;
        }
        if (!ok) break;
        llm_schedule_add(sch, s, n_new, &budget);
    }
    if (preempted) return; /* the pool is short: nobody new until the preempted are back */
    if (sch->static_batching) {
        if (arrlen(sch->running) == 0) sch->static_batch_open = 1;
        if (!sch->static_batch_open) return;
    }
    /* then waiting sequences, first come first served: the first that does not fit stops the rest */
    while (arrlen(sch->waiting) > 0 && budget > 0) {
        llm_seq *s = sch->waiting[0];
        int width = s->fork_pending ? s->req->params.n : 1;
        if (arrlen(sch->running) > 0 && arrlen(sch->running) + width > sch->max_num_seqs) break;
        if (s->n_computed == 0 && arrlen(s->block_table) == 0) llm_seq_take_cached_prefix(sch->bm, s);
        int n_new = (int)arrlen(s->tokens) - s->n_computed;
        if (n_new > budget) n_new = budget;
        if (!llm_seq_reserve(sch, s, s->n_computed + n_new)) { llm_seq_release_blocks(sch->bm, s); break; }
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
    if (p->n_stop < 0 || p->n_stop > 16 || (p->n_stop && !p->stop))
        return llm_fail(err, "at most 16 stop strings");
    if (p->n_stop_token_ids < 0 || (p->n_stop_token_ids && !p->stop_token_ids))
        return llm_fail(err, "n_stop_token_ids without stop_token_ids");
    return 0;
}

/* The generator of sample `index` of a request: seed + index, or the clock when the seed is -1 */
static uint64_t llm_seed_mix(int64_t seed, int index) {
    uint64_t s = seed >= 0 ? (uint64_t)seed
                           : ((uint64_t)time(NULL) ^ ((uint64_t)clock() << 20) ^ (uint64_t)(uintptr_t)&seed);
    s += 0x632be59bd9b4e019ull * (uint64_t)(index + 1);
    return llm_splitmix64(&s);
}

static void llm_request_unref(llm_request *r) {
    if (--r->refs > 0) return;
    for (int i = 0; i < r->params.n_stop; i++) free(r->stop_copies[i]);
    free(r->stop_copies); free(r->stop_ids_copy); free(r);
}

static void llm_seq_free(llm_seq *s) {
    arrfree(s->tokens); arrfree(s->block_table); arrfree(s->held_text);
    arrfree(s->out_tokens); arrfree(s->out_text); arrfree(s->out_logprobs);
    arrfree(s->out_top_ids); arrfree(s->out_top_logprobs);
    llm_request_unref(s->req);
    free(s);
}

/* A request and its first sequence, which takes the prompt's ids (an stb_ds array). The caller's stop strings
 * and stop ids are copied: the request outlives the call. NULL when out of memory (ids freed). */
static llm_seq *llm_seq_new(int32_t *ids, const llm_sampling_params *p, void *user) {
    llm_request *r = (llm_request *)calloc(1, sizeof *r);
    llm_seq *s = (llm_seq *)calloc(1, sizeof *s);
    if (r) {
        r->params = *p; r->user = user; r->n_prompt = (int)arrlen(ids); r->refs = 1;
        r->params.stop = NULL; r->params.stop_token_ids = NULL; r->params.n_stop = 0;
        r->stop_copies = (char **)calloc((size_t)p->n_stop + 1, sizeof(char *));
        r->stop_ids_copy = (int32_t *)malloc(((size_t)p->n_stop_token_ids + 1) * sizeof(int32_t));
    }
    int ok = s && r && r->stop_copies && r->stop_ids_copy;
    for (int i = 0; ok && i < p->n_stop; i++, r->params.n_stop++)
        ok = (r->stop_copies[i] = strdup(p->stop[i] ? p->stop[i] : "")) != NULL;
    if (!ok) {
        if (r) { r->refs = 1; llm_request_unref(r); }
        free(s); arrfree(ids);
        return NULL;
    }
    if (p->n_stop_token_ids)
        memcpy(r->stop_ids_copy, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof(int32_t));
    r->params.stop = (const char *const *)r->stop_copies;
    r->params.stop_token_ids = r->stop_ids_copy;
    s->req = r; s->tokens = ids; s->rng = llm_seed_mix(p->seed, 0); s->fork_pending = p->n > 1;
    s->detok.special = p->special_text != 0;
    s->status = LLM_SEQ_WAITING;
    return s;
}

/* n > 1, when the prompt is computed: samples 1..n-1 start from it, sharing all its blocks (a block is copied
 * only when a sample writes into it), each with its own generator. They join the end of the running list. -1
 * when out of memory (then nothing changed). */
static int llm_seq_fork(llm_scheduler *sch, llm_seq *s) {
    int n = s->req->params.n;
    llm_seq **children = (llm_seq **)calloc((size_t)n, sizeof *children);
    int ok = children != NULL;
    for (int i = 1; ok && i < n; i++) ok = (children[i] = (llm_seq *)calloc(1, sizeof(llm_seq))) != NULL;
    if (!ok) {
        for (int i = 1; children && i < n; i++) free(children[i]);
        free(children);
        return -1;
    }
    s->fork_pending = 0;
    for (int i = 1; i < n; i++) {
        llm_seq *c = children[i];
        c->req = s->req; c->index = i; c->status = s->status; c->n_computed = s->n_computed;
        c->n_hashed_blocks = s->n_hashed_blocks; c->last_hash = s->last_hash;
        c->n_cached_tokens = s->n_cached_tokens;
        c->rng = llm_seed_mix(s->req->params.seed, i);
        c->detok.special = s->detok.special;
        int n_tokens = (int)arrlen(s->tokens), n_blocks = (int)arrlen(s->block_table);
        memcpy(arraddnptr(c->tokens, n_tokens), s->tokens, (size_t)n_tokens * sizeof(int32_t));
        memcpy(arraddnptr(c->block_table, n_blocks), s->block_table, (size_t)n_blocks * sizeof(int32_t));
        for (int b = 0; b < arrlen(c->block_table); b++) sch->bm->blocks[c->block_table[b]].ref_count++;
        s->req->refs++;
        arrput(sch->running, c);
    }
    free(children);
    return 0;
}

/* Names each newly completed block by its prefix, so that later requests can share it. */
static void llm_seq_hash_blocks(llm_block_manager *bm, llm_seq *s) {
    int bs = bm->block_size;
    while ((s->n_hashed_blocks + 1) * bs <= s->n_computed) {
        int b = s->n_hashed_blocks;
        s->last_hash = llm_block_hash(s->last_hash, s->tokens + b * bs, bs);
        llm_block_set_hash(bm, s->block_table[b], s->last_hash);
        s->n_hashed_blocks++;
    }
}

/* ===========================================================================================================
 * 6. Blocks: KV blocks handed out from a free list, named by hash for prefix caching
 * ======================================================================================================== */
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

static void llm_free_list_remove(llm_block_manager *bm, int id) {
    llm_block *b = &bm->blocks[id];
    if (b->prev_free >= 0) bm->blocks[b->prev_free].next_free = b->next_free;
    else bm->free_head = b->next_free;
    if (b->next_free >= 0) bm->blocks[b->next_free].prev_free = b->prev_free;
    else bm->free_tail = b->prev_free;
    b->prev_free = b->next_free = -1;
    bm->num_free_blocks--;
}

/* Take the least recently freed block. If it still holds a cached prefix, that cache entry dies now. */
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

void llm_block_release(llm_block_manager *bm, int id) {
    llm_block *b = &bm->blocks[id];
    if (--b->ref_count > 0) return;
    b->ref_count = 0;
    b->prev_free = bm->free_tail; b->next_free = -1;  /* to the tail: evicted last */
    if (bm->free_tail >= 0) bm->blocks[bm->free_tail].next_free = id; else bm->free_head = id;
    bm->free_tail = id;
    bm->num_free_blocks++;
}

uint64_t llm_block_hash(uint64_t prev_hash, const int32_t *tokens, int n) {
    uint64_t h = prev_hash ^ 0x243f6a8885a308d3ull;
    for (int i = 0; i < n; i++) { uint64_t s = h ^ (uint32_t)tokens[i]; h = llm_splitmix64(&s); }
    return h ? h : 1;
}

int llm_block_lookup(llm_block_manager *bm, uint64_t hash) {
    if (!bm->enable_prefix_caching) return -1;
    ptrdiff_t i = hmgeti(bm->cached, hash);
    if (i < 0) return -1;
    int id = bm->cached[i].value;
    if (bm->blocks[id].ref_count == 0) llm_free_list_remove(bm, id);
    bm->blocks[id].ref_count++;
    return id;
}

void llm_block_set_hash(llm_block_manager *bm, int id, uint64_t hash) {
    if (!bm->enable_prefix_caching || bm->blocks[id].hash) return;
    if (hmgeti(bm->cached, hash) >= 0) return; /* the same content is cached in another block already */
    bm->blocks[id].hash = hash;
    hmput(bm->cached, hash, id);
}

/* ===========================================================================================================
 * 7. Forward: the model over a batch, reading and writing the paged KV cache. The CPU backend, which is the
 *    reference the CUDA kernels are checked against; llm.cu has the CUDA one behind the same llm_backend.
 * ======================================================================================================== */
/* K and V of every layer for one block: what one block of the pool costs a backend */
static size_t llm_kv_bytes_per_block(const llm_config *c, int block_size, int value_bytes) {
    return (size_t)2 * c->n_layers * block_size * c->n_kv_heads * c->head_dim * value_bytes;
}

/* ---- The math ------------------------------------------------------------------------------------------ */
static float llm_dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0}; /* eight running sums: the compiler keeps them in one vector register */
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; i++) s += a[i] * b[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* ---- Quantized weights times activations ---------------------------------------------------------------
 * The fast CPU path multiplies by the weights as the file stores them, as llama.cpp does: each step's
 * activations are quantized once to blocks of 32 int8 with a float scale, and every weight row meets them
 * block by block in integer arithmetic, one float multiply-add per 32 values. Converting each weight row to
 * f32 first (the reference path, llm_dtype_dequant_row) costs more than the products themselves. The
 * activations' rounding (1/254 of each block's largest value) moves logits by about a thousandth of their
 * size; the reference backend, "cpu-exact", does without it. */
typedef struct {
    float d;            /* value j = d * q[j] */
    float s;            /* d * (sum of q): what a block minimum (q4_1, q5_1) multiplies */
    int16_t sum[2];     /* q[0..15] and q[16..31] added up: what the k-quants' sub-block minimums multiply */
    int8_t q[32];
} llm_q8;

static void llm_q8_quantize(const float *x, llm_q8 *out, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float d = amax / 127, inv = d > 0 ? 1 / d : 0;
        out[b].d = d;
        for (int h = 0; h < 2; h++) {
            int sum = 0;
            for (int j = h * 16; j < h * 16 + 16; j++) sum += out[b].q[j] = (int8_t)lrintf(x[j] * inv);
            out[b].sum[h] = (int16_t)sum;
        }
        out[b].s = d * (float)(out[b].sum[0] + out[b].sum[1]);
    }
}

/* The dot product of a weight row (n values of a quantized type) with quantized activations, in plain C: the
 * reference the SIMD versions are tested against. A group of 32 values has one activation scale xd and one
 * or two weight sub-blocks s; with value = (d * scale[s]) * q - dmin * min[s] it adds
 *     xd * (d * sum_s scale[s] * (q . x)_s  -  dmin * sum_s min[s] * (sum of x)_s)
 * where everything inside the sums is an integer. */
static float llm_q8_dot_ref(uint32_t type, const void *row, const llm_q8 *x, int64_t n) {
    uint64_t block_bytes, block_values;
    llm_dtype_info(type, &block_bytes, &block_values);
    const uint8_t *p = (const uint8_t *)row;
    llm_qblock b;
    float acc = 0;
    for (int64_t at = 0; at < n; at += (int64_t)block_values, p += block_bytes) {
        llm_qblock_unpack(type, p, &b);
        for (int g = 0; g < b.n / 32; g++, x++) {
            int scaled = 0, mins = 0;
            for (int h = 0; h < 2; h++) { /* the two halves of 16: one sub-block each, or both of one */
                int s = (g * 32 + h * 16) / b.sub, dot = 0;
                for (int j = 0; j < 16; j++) dot += b.q[g * 32 + h * 16 + j] * x->q[h * 16 + j];
                scaled += b.scale[s] * dot;
                mins += b.min[s] * x->sum[h];
            }
            acc += x->d * (b.d * (float)scaled - b.dmin * (float)mins);
        }
    }
    return acc;
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* AVX2 (the build was told the target: -march=native). The same products as llm_q8_dot_ref with the same
 * integer sums, on 32 values at a time: each type's stored values are unpacked into 32 bytes, which meet
 * the activations in _mm256_maddubs_epi16 (unsigned times signed bytes, pairs added) and then
 * _mm256_madd_epi16 with the sub-blocks' scales. The stored values are unsigned (q = stored - offset): the
 * offsets come back out with the activations' sums, outside the vector loop. */
#define LLM_CPU_SIMD "avx2"

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

/* The stored values of group g (values 32g..32g+31) of a block, as llm_qblock_unpack reads them */
static inline __m256i llm_avx2_group(uint32_t type, const uint8_t *p, int g) {
    uint32_t qh;
    switch (type) {
    case LLM_Q4_0: return llm_avx2_nibbles(p + 2);
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

static inline float llm_avx2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* 8 sums of 4 products of unsigned bytes u and signed bytes x: one VNNI instruction where the target has
 * it */
static inline __m256i llm_avx2_dot_u8s8(__m256i u, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
#endif
}

/* The products of one weight row with nc rows of activations (nc up to 4, x_stride blocks apart): a prefill
 * unpacks each weight block once for 4 tokens. 32-value blocks: one scale per block. Signed types (q8_0,
 * and q4_0 and q5_0 once their offset is taken off) multiply |w| by x with w's sign; q4_1 and q5_1 add their
 * minimum times the block's activation sum. Even and odd blocks add into two sets of accumulators: two
 * chains of additions, which the CPU overlaps (the calls are written out so the sets stay in registers). */
static inline __attribute__((always_inline)) void llm_q8_block32_avx2(uint32_t type, const uint8_t *p,
                                                                      const llm_q8 *x, int64_t x_stride, int nc,
                                                                      __m256 acc[4], float mins[4]) {
    const int has_min = type == LLM_Q4_1 || type == LLM_Q5_1;
    __m256i w = llm_avx2_group(type, p, 0), w_abs = w;
    if (type == LLM_Q4_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
    if (type == LLM_Q5_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(16));
    if (!has_min) w_abs = _mm256_sign_epi8(w, w);
    float d = _cvtsh_ss(*(const uint16_t *)p), m = has_min ? _cvtsh_ss(*(const uint16_t *)(p + 2)) : 0;
    for (int c = 0; c < nc; c++) {
        const llm_q8 *xb = x + c * x_stride;
        __m256i xq = _mm256_loadu_si256((const __m256i *)xb->q);
        if (!has_min) xq = _mm256_sign_epi8(xq, w);
        __m256 dot = _mm256_cvtepi32_ps(llm_avx2_dot_u8s8(w_abs, xq));
        acc[c] = _mm256_fmadd_ps(dot, _mm256_set1_ps(d * xb->d), acc[c]);
        if (has_min) mins[c] += m * xb->s;
    }
}

static inline __attribute__((always_inline)) void llm_q8_dot32_avx2(uint32_t type, const uint8_t *p,
                                                                    const llm_q8 *x, int64_t n_blocks,
                                                                    int64_t x_stride, int nc, float *out) {
    const size_t bytes = type == LLM_Q8_0 ? 34 : type == LLM_Q4_0 ? 18 : type == LLM_Q4_1 ? 20 :
                         type == LLM_Q5_0 ? 22 : 24;
    __m256 even[4], odd[4];
    float mins_even[4], mins_odd[4];
    for (int c = 0; c < nc; c++) {
        even[c] = odd[c] = _mm256_setzero_ps();
        mins_even[c] = mins_odd[c] = 0;
    }
    int64_t b = 0;
    for (; b + 2 <= n_blocks; b += 2, p += 2 * bytes) {
        llm_q8_block32_avx2(type, p, x + b, x_stride, nc, even, mins_even);
        llm_q8_block32_avx2(type, p + bytes, x + b + 1, x_stride, nc, odd, mins_odd);
    }
    if (b < n_blocks) llm_q8_block32_avx2(type, p, x + b, x_stride, nc, even, mins_even);
    for (int c = 0; c < nc; c++)
        out[c] = llm_avx2_hsum(_mm256_add_ps(even[c], odd[c])) + (mins_even[c] + mins_odd[c]);
}

/* 256-value k-quant blocks: per group of 32, the products scaled by the sub-block scales in integers, then by
 * d and the group's activation scale (even and odd groups into two sets of accumulators); the offsets and
 * minimums meet the activation sums once per block, for its 8 groups side by side (the sums of two halves
 * are one 32-bit lane each: one gather) */
static inline __attribute__((always_inline)) void llm_q8_groupk_avx2(uint32_t type, const uint8_t *p, int g,
                                                                     const int16_t *scales, float d,
                                                                     const llm_q8 *x, int64_t x_stride, int nc,
                                                                     __m256 acc[4]) {
    __m256i w = llm_avx2_group(type, p, g);
    __m256i sc = _mm256_set_m128i(_mm_set1_epi16(scales[2 * g + 1]), _mm_set1_epi16(scales[2 * g]));
    for (int c = 0; c < nc; c++) {
        const llm_q8 *xg = x + c * x_stride + g;
        __m256i scaled = _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i *)xg->q)),
                                           sc);
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled), _mm256_set1_ps(xg->d * d), acc[c]);
    }
}

static inline __attribute__((always_inline)) void llm_q8_dotk_avx2(uint32_t type, const uint8_t *p,
                                                                   const llm_q8 *x, int64_t n_blocks,
                                                                   int64_t x_stride, int nc, float *out) {
    const int sub = type == LLM_Q2_K || type == LLM_Q3_K || type == LLM_Q6_K ? 16 : 32;
    const size_t bytes = type == LLM_Q2_K ? 84 : type == LLM_Q3_K ? 110 : type == LLM_Q4_K ? 144 :
                         type == LLM_Q5_K ? 176 : 210;
    const __m256i group_at = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                _mm256_set1_epi32((int)sizeof(llm_q8)));
    __m256 even[4], odd[4], rest[4];
    for (int c = 0; c < nc; c++) even[c] = odd[c] = rest[c] = _mm256_setzero_ps();
    llm_qblock b;
    int16_t scales[16], mins[16]; /* per half of a group */
    for (int64_t blk = 0; blk < n_blocks; blk++, p += bytes, x += 8) {
        llm_qblock_read_scales(type, p, &b);
        for (int h = 0; h < 16; h++) { scales[h] = b.scale[h * 16 / sub]; mins[h] = b.min[h * 16 / sub]; }
        for (int g = 0; g < 8; g += 2) {
            llm_q8_groupk_avx2(type, p, g, scales, b.d, x, x_stride, nc, even);
            llm_q8_groupk_avx2(type, p, g + 1, scales, b.d, x, x_stride, nc, odd);
        }
        __m256i sc16 = _mm256_loadu_si256((const __m256i *)scales);
        __m256i mn16 = _mm256_loadu_si256((const __m256i *)mins);
        __m256 offset = _mm256_set1_ps(b.d * (float)b.offset), dmin = _mm256_set1_ps(b.dmin);
        for (int c = 0; c < nc; c++) {
            const llm_q8 *xb = x + c * x_stride;
            __m256 xd = _mm256_i32gather_ps(&xb->d, group_at, 1);
            __m256i sums = _mm256_i32gather_epi32((const int *)xb->sum, group_at, 1);
            __m256 offsets = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, sc16));
            __m256 minimums = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, mn16));
            __m256 per_group = _mm256_add_ps(_mm256_mul_ps(offsets, offset), _mm256_mul_ps(minimums, dmin));
            rest[c] = _mm256_fmadd_ps(per_group, xd, rest[c]);
        }
    }
    for (int c = 0; c < nc; c++)
        out[c] = llm_avx2_hsum(_mm256_add_ps(even[c], odd[c])) - llm_avx2_hsum(rest[c]);
}

/* f16 and bf16 weights meet f32 activations: 8 values converted and multiplied at a time */
static float llm_dot_half(uint32_t type, const uint16_t *w, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(w + i));
        __m256 wf = type == LLM_F16 ? _mm256_cvtph_ps(h)
                                    : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        acc = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + i), acc);
    }
    float r = llm_avx2_hsum(acc);
    for (; i < n; i++) r += (type == LLM_F16 ? llm_f16_to_f32(w[i]) : llm_bf16_to_f32(w[i])) * x[i];
    return r;
}
#endif

/* The fast path's products of one weight row with nc (1 to 4) rows of quantized activations, x_stride blocks
 * apart, into out[0..nc-1]: SIMD when the build has it, else the plain-C reference */
#define LLM_Q8_MAX_COLS 4
static void llm_q8_dot(uint32_t type, const void *row, const llm_q8 *x, int64_t n, int64_t x_stride, int nc,
                       float *out) {
#ifdef LLM_CPU_SIMD
    /* each call specializes the inlined loops to its type, and to 4 tokens or 1 */
#define LLM_Q8_CASE(T, dot, per_block)                                                                 \
    case T:                                                                                            \
        if (nc == 4) dot(T, (const uint8_t *)row, x, n / per_block, x_stride, 4, out);                 \
        else for (int c = 0; c < nc; c++)                                                              \
            dot(T, (const uint8_t *)row, x + c * x_stride, n / per_block, 0, 1, out + c);              \
        return;
    switch (type) {
    LLM_Q8_CASE(LLM_Q8_0, llm_q8_dot32_avx2, 32) LLM_Q8_CASE(LLM_Q4_0, llm_q8_dot32_avx2, 32)
    LLM_Q8_CASE(LLM_Q4_1, llm_q8_dot32_avx2, 32) LLM_Q8_CASE(LLM_Q5_0, llm_q8_dot32_avx2, 32)
    LLM_Q8_CASE(LLM_Q5_1, llm_q8_dot32_avx2, 32) LLM_Q8_CASE(LLM_Q2_K, llm_q8_dotk_avx2, 256)
    LLM_Q8_CASE(LLM_Q3_K, llm_q8_dotk_avx2, 256) LLM_Q8_CASE(LLM_Q4_K, llm_q8_dotk_avx2, 256)
    LLM_Q8_CASE(LLM_Q5_K, llm_q8_dotk_avx2, 256) LLM_Q8_CASE(LLM_Q6_K, llm_q8_dotk_avx2, 256)
    }
#undef LLM_Q8_CASE
#endif
    for (int c = 0; c < nc; c++) out[c] = llm_q8_dot_ref(type, row, x + c * x_stride, n);
}

/* How a matrix product reads a weight type: rows as they are (f32), rows quantized blocks against quantized
 * activations (the fast path), f16/bf16 rows converted on the fly (with SIMD), or rows converted to f32
 * (the reference, and f16/bf16 without SIMD) */
enum { LLM_ROWS_F32, LLM_ROWS_Q8, LLM_ROWS_HALF, LLM_ROWS_CONVERT };
static int llm_matmul_kind(uint32_t type, int exact) {
    if (type == LLM_F32) return LLM_ROWS_F32;
    if (exact) return LLM_ROWS_CONVERT;
    if (type == LLM_F16 || type == LLM_BF16) {
#ifdef LLM_CPU_SIMD
        return LLM_ROWS_HALF;
#endif
        return LLM_ROWS_CONVERT;
    }
    return LLM_ROWS_Q8;
}

/* out[t][r] = sum_c W[r][c] * x[t][c] for the T rows of x. Threads share the weight rows in tiles of 16; a
 * tile meets all T inputs before the next is read, so a prefill of many tokens reads each weight once from
 * memory (from cache after that): that is what batching buys on any hardware. -1 when there was no memory
 * for the quantized activations or a thread's converted rows (what it would have computed is left undone). */
#define LLM_MATMUL_TILE 16
static int llm_matmul(float *out, const float *x, const llm_weight *w, int T, int exact) {
    int64_t rows = w->rows, cols = w->cols, n_tiles = (rows + LLM_MATMUL_TILE - 1) / LLM_MATMUL_TILE;
    size_t row_bytes = llm_dtype_row_bytes(w->type, cols);
    int kind = llm_matmul_kind(w->type, exact), failed = 0;
    llm_q8 *xq = NULL;
    if (kind == LLM_ROWS_Q8) {
        if (!(xq = (llm_q8 *)malloc((size_t)T * (size_t)(cols / 32) * sizeof(llm_q8)))) return -1;
        for (int t = 0; t < T; t++) llm_q8_quantize(x + (size_t)t * cols, xq + (size_t)t * (cols / 32), cols);
    }
    #pragma omp parallel
    {
        float *converted = NULL;
        if (kind == LLM_ROWS_CONVERT &&
            !(converted = (float *)malloc((size_t)LLM_MATMUL_TILE * (size_t)cols * sizeof(float)))) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t tile = 0; tile < n_tiles; tile++) {
            int64_t r0 = tile * LLM_MATMUL_TILE;
            int64_t r1 = r0 + LLM_MATMUL_TILE < rows ? r0 + LLM_MATMUL_TILE : rows;
            const uint8_t *tile_data = (const uint8_t *)w->data + (size_t)r0 * row_bytes;
            if (kind == LLM_ROWS_CONVERT) {
                if (!converted) continue;
                for (int64_t r = r0; r < r1; r++)
                    llm_dtype_dequant_row(w->type, tile_data + (size_t)(r - r0) * row_bytes,
                                          converted + (size_t)(r - r0) * cols, cols);
            }
            for (int t = 0; t < T; t++) {
                const float *xt = x + (size_t)t * cols;
                if (kind == LLM_ROWS_Q8) { /* LLM_Q8_MAX_COLS tokens at a time */
                    int nc = T - t < LLM_Q8_MAX_COLS ? T - t : LLM_Q8_MAX_COLS;
                    float v[LLM_Q8_MAX_COLS];
                    for (int64_t r = r0; r < r1; r++) {
                        llm_q8_dot(w->type, tile_data + (size_t)(r - r0) * row_bytes,
                                   xq + (size_t)t * (cols / 32), cols, cols / 32, nc, v);
                        for (int c = 0; c < nc; c++) out[(size_t)(t + c) * rows + r] = v[c];
                    }
                    t += nc - 1;
                    continue;
                }
                for (int64_t r = r0; r < r1; r++) {
                    const void *row = tile_data + (size_t)(r - r0) * row_bytes;
                    float v;
                    switch (kind) {
                    case LLM_ROWS_F32: v = llm_dot((const float *)row, xt, cols); break;
#ifdef LLM_CPU_SIMD
                    case LLM_ROWS_HALF: v = llm_dot_half(w->type, (const uint16_t *)row, xt, cols); break;
#endif
                    default: v = llm_dot(converted + (size_t)(r - r0) * cols, xt, cols); break;
                    }
                    out[(size_t)t * rows + r] = v;
                }
            }
        }
        free(converted);
    }
    free(xq);
    return failed ? -1 : 0;
}

static void llm_rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
    double ss = 0; /* in double, as llama.cpp does: the mean of squares of thousands of values */
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * weight[i];
}

/* Rotate the first rope_dim values of one head by position pos. The angle of pair i is
 * pos * base^(-2i/rope_dim), built by repeated multiplication as llama.cpp does, so that greedy outputs match
 * it bit for bit more often. */
static void llm_rope(float *x, int pos, const llm_config *c) {
    float theta_scale = powf(c->rope_base, -2.0f / (float)c->rope_dim), theta = (float)pos;
    int half = c->rope_dim / 2;
    for (int i = 0; i < half; i++, theta *= theta_scale) {
        float cs = cosf(theta), sn = sinf(theta);
        int a = c->rope_neox ? i : 2 * i, b = c->rope_neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * cs - x1 * sn;
        x[b] = x0 * sn + x1 * cs;
    }
}

/* ---- The CPU backend ----------------------------------------------------------------------------------- */
/* Its state: the model (weights read where they are), and the KV cache in host memory as f32, K and V each
 * laid out [layer][block][slot][kv_head][head_dim]: for one layer, the K of a sequence's position p is the
 * n_kv_heads * head_dim values at slot block_table[p / block_size] * block_size + p % block_size. */
typedef struct {
    const llm_model *model;
    int num_blocks, block_size;
    float *k, *v;
    float *scratch;                 /* the forward pass's activations for up to scratch_tokens tokens ... */
    int32_t *seq_of;                /* ... and their sequences: grown on demand, reused every step */
    int scratch_tokens;
    int exact;                      /* the reference: weights converted to f32, activations unrounded */
} llm_cpu;

static float *llm_cpu_kv_at(const llm_cpu *c, float *cache, int layer, const int32_t *block_table, int pos) {
    size_t slot = (size_t)block_table[pos / c->block_size] * c->block_size + (size_t)(pos % c->block_size);
    size_t per_slot = (size_t)c->model->cfg.n_kv_heads * c->model->cfg.head_dim;
    return cache + ((size_t)layer * c->num_blocks * c->block_size + slot) * per_slot;
}

static int llm_cpu_alloc_kv(llm_backend *be, int num_blocks, int block_size, char *err) {
    llm_cpu *c = (llm_cpu *)be->ctx;
    if (num_blocks <= 0 || block_size <= 0)
        return llm_fail(err, "KV cache needs at least one block of one slot");
    size_t n = llm_kv_bytes_per_block(&c->model->cfg, block_size, sizeof(float)) / 2 / sizeof(float);
    free(c->k); free(c->v);
    c->k = (float *)calloc(n * (size_t)num_blocks, sizeof(float));
    c->v = (float *)calloc(n * (size_t)num_blocks, sizeof(float));
    c->num_blocks = num_blocks; c->block_size = block_size;
    if (!c->k || !c->v) {
        free(c->k); free(c->v); c->k = c->v = NULL;
        return llm_fail(err, "out of memory for %d KV blocks", num_blocks);
    }
    return 0;
}

/* Copy-on-write: block dst becomes a copy of block src, in every layer, for K and V. */
static void llm_cpu_copy_block(llm_cpu *c, int src, int dst) {
    size_t per_block = (size_t)c->block_size * c->model->cfg.n_kv_heads * c->model->cfg.head_dim;
    for (int l = 0; l < c->model->cfg.n_layers; l++) {
        size_t layer = (size_t)l * c->num_blocks * per_block;
        memcpy(c->k + layer + (size_t)dst * per_block, c->k + layer + (size_t)src * per_block,
               per_block * sizeof(float));
        memcpy(c->v + layer + (size_t)dst * per_block, c->v + layer + (size_t)src * per_block,
               per_block * sizeof(float));
    }
}

/* Paged attention for one query head of one token at position pos: softmax over the scores q . k_p / sqrt(hd)
 * of its sequence's positions p = 0..pos, then the weighted sum of their v_p; K and V are read through the
 * block table. kv_head: the K/V head this query head shares with the rest of its group (grouped-query
 * attention). scores: room for pos + 1 values. */
static void llm_cpu_attention(const llm_cpu *c, int layer, const int32_t *block_table, int pos, int kv_head,
                              const float *q, float *scores, float *out) {
    int hd = c->model->cfg.head_dim, n_ctx = pos + 1;
    float scale = 1.0f / sqrtf((float)hd), mx = -INFINITY, sum = 0;
    for (int p = 0; p < n_ctx; p++) {
        scores[p] = llm_dot(q, llm_cpu_kv_at(c, c->k, layer, block_table, p) + kv_head * hd, hd) * scale;
        if (scores[p] > mx) mx = scores[p];
    }
    for (int p = 0; p < n_ctx; p++) { scores[p] = expf(scores[p] - mx); sum += scores[p]; }
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int p = 0; p < n_ctx; p++) {
        const float *vp = llm_cpu_kv_at(c, c->v, layer, block_table, p) + kv_head * hd;
        float w = scores[p] / sum;
        for (int i = 0; i < hd; i++) out[i] += w * vp[i];
    }
}

static int llm_cpu_forward(llm_backend *be, const llm_batch *b, float *logits, char *err) {
    llm_cpu *c = (llm_cpu *)be->ctx;
    const llm_model *m = c->model;
    const llm_config *cf = &m->cfg;
    int T = b->n_tokens, D = cf->dim, hd = cf->head_dim, F = cf->ffn_dim;
    int q_dim = cf->n_heads * hd, kv_dim = cf->n_kv_heads * hd, group = cf->n_heads / cf->n_kv_heads;
    int ex = c->exact;
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

    /* Scratch, one row per token of the batch:
     *   x         [T][D]      the residual stream: the token's embedding, plus the output of every block
     *   xn        [T][D]      x normalised: the input of the next matrix products (later, of the logits)
     *   q         [T][q_dim]  queries, heads side by side; k, v [T][kv_dim] this step's keys and values
     *   att       [T][q_dim]  the attention output, heads side by side
     *   gate, up  [T][F]      the feed-forward's two projections; gate becomes silu(gate) * up
     *   delta     [T][D]      a block's last matrix product, added to x
     *   seq_of    [T]         the sequence each token belongs to (whose block table it reads) */
    size_t per_token = 3 * (size_t)D + 2 * (size_t)q_dim + 2 * (size_t)kv_dim + 2 * (size_t)F;
    if (T > c->scratch_tokens) { /* kept from step to step: the same activations are rewritten every step */
        free(c->scratch); free(c->seq_of);
        c->scratch = (float *)malloc((size_t)T * per_token * sizeof(float));
        c->seq_of = (int32_t *)malloc((size_t)T * sizeof(int32_t));
        c->scratch_tokens = c->scratch && c->seq_of ? T : 0;
        if (!c->scratch_tokens) return llm_fail(err, "out of memory in the forward pass (%d tokens)", T);
    }
    float *x = c->scratch;
    int32_t *seq_of = c->seq_of;
    float *xn = x + (size_t)T * D, *q = xn + (size_t)T * D, *k = q + (size_t)T * q_dim;
    float *v = k + (size_t)T * kv_dim, *att = v + (size_t)T * kv_dim, *gate = att + (size_t)T * q_dim;
    float *up = gate + (size_t)T * F, *delta = up + (size_t)T * F;
    int max_ctx = 0, failed = 0;
    for (int s = 0; s < b->n_seqs; s++)
        for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i++) {
            seq_of[i] = s;
            if (b->positions[i] + 1 > max_ctx) max_ctx = b->positions[i] + 1;
        }

    /* the embedding of each token */
    size_t emb_row = llm_dtype_row_bytes(m->tok_embd.type, D);
    const uint8_t *emb = (const uint8_t *)m->tok_embd.data;
    for (int t = 0; t < T; t++)
        llm_dtype_dequant_row(m->tok_embd.type, emb + emb_row * (size_t)b->tokens[t], x + (size_t)t * D, D);

    for (int l = 0; l < cf->n_layers; l++) {
        const llm_layer *L = &m->layers[l];
        /* attention block: the normalised stream projected to queries, keys and values */
        for (int t = 0; t < T; t++)
            llm_rmsnorm(xn + (size_t)t * D, x + (size_t)t * D, (const float *)L->attn_norm.data, D,
                        cf->rms_eps);
        failed |= llm_matmul(q, xn, &L->wq, T, ex) | llm_matmul(k, xn, &L->wk, T, ex) |
                  llm_matmul(v, xn, &L->wv, T, ex);
        /* per token: the biases (qwen2), an RMS norm of each q and k head (qwen3), RoPE at the token's
         * position; then its k and v go into the cache at its slot, where this step and later ones read
         * them */
        for (int t = 0; t < T; t++) {
            float *qt = q + (size_t)t * q_dim, *kt = k + (size_t)t * kv_dim, *vt = v + (size_t)t * kv_dim;
            if (L->bq.data) {
                for (int i = 0; i < q_dim; i++) qt[i] += ((const float *)L->bq.data)[i];
                for (int i = 0; i < kv_dim; i++) kt[i] += ((const float *)L->bk.data)[i];
                for (int i = 0; i < kv_dim; i++) vt[i] += ((const float *)L->bv.data)[i];
            }
            for (int h = 0; h < cf->n_heads; h++) {
                if (L->q_norm.data)
                    llm_rmsnorm(qt + h * hd, qt + h * hd, (const float *)L->q_norm.data, hd, cf->rms_eps);
                llm_rope(qt + h * hd, b->positions[t], cf);
            }
            for (int h = 0; h < cf->n_kv_heads; h++) {
                if (L->k_norm.data)
                    llm_rmsnorm(kt + h * hd, kt + h * hd, (const float *)L->k_norm.data, hd, cf->rms_eps);
                llm_rope(kt + h * hd, b->positions[t], cf);
            }
            const int32_t *bt = b->block_tables[seq_of[t]];
            memcpy(llm_cpu_kv_at(c, c->k, l, bt, b->positions[t]), kt, (size_t)kv_dim * sizeof(float));
            memcpy(llm_cpu_kv_at(c, c->v, l, bt, b->positions[t]), vt, (size_t)kv_dim * sizeof(float));
        }
        /* attention: every (token, query head) pair is independent once this step's K/V are in the cache */
        #pragma omp parallel
        {
            float *scores = (float *)malloc((size_t)max_ctx * sizeof(float));
            if (!scores) {
                #pragma omp atomic write
                failed = 1;
            }
            #pragma omp for schedule(dynamic, 4)
            for (int th = 0; th < T * cf->n_heads; th++) {
                int t = th / cf->n_heads, h = th % cf->n_heads;
                if (scores)
                    llm_cpu_attention(c, l, b->block_tables[seq_of[t]], b->positions[t], h / group,
                                      q + (size_t)t * q_dim + h * hd, scores,
                                      att + (size_t)t * q_dim + h * hd);
            }
            free(scores);
        }
        /* the output projection, added to the residual stream */
        failed |= llm_matmul(delta, att, &L->wo, T, ex);
        for (size_t i = 0; i < (size_t)T * D; i++) x[i] += delta[i];

        /* feed-forward block (SwiGLU): down(silu(gate(xn)) * up(xn)), added to the residual stream */
        for (int t = 0; t < T; t++)
            llm_rmsnorm(xn + (size_t)t * D, x + (size_t)t * D, (const float *)L->ffn_norm.data, D,
                        cf->rms_eps);
        failed |= llm_matmul(gate, xn, &L->w_gate, T, ex) | llm_matmul(up, xn, &L->w_up, T, ex);
        for (size_t i = 0; i < (size_t)T * F; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
        failed |= llm_matmul(delta, gate, &L->w_down, T, ex);
        for (size_t i = 0; i < (size_t)T * D; i++) x[i] += delta[i];
    }
    /* the final norm and the output matrix, only for the rows that need logits: a prefill of 500 tokens
     * samples once */
    for (int i = 0; i < b->n_logits; i++)
        llm_rmsnorm(xn + (size_t)i * D, x + (size_t)b->logit_rows[i] * D, (const float *)m->output_norm.data,
                    D, cf->rms_eps);
    failed |= llm_matmul(logits, xn, &m->output, b->n_logits, ex);
    return failed ? llm_fail(err, "out of memory in the forward pass (%d tokens)", T) : 0;
}

static void llm_cpu_destroy(llm_backend *be) {
    llm_cpu *c = (llm_cpu *)be->ctx;
    free(c->k); free(c->v); free(c->scratch); free(c->seq_of); free(c);
    free(be);
}

static llm_backend *llm_cpu_backend_new(const llm_model *m, int exact, char *err) {
    llm_backend *be = (llm_backend *)calloc(1, sizeof *be);
    llm_cpu *c = (llm_cpu *)calloc(1, sizeof *c);
    if (!be || !c) { free(be); free(c); llm_fail(err, "out of memory"); return NULL; }
    c->model = m; c->exact = exact;
    be->name = exact ? "cpu-exact" : "cpu"; be->ctx = c;
    be->kv_value_bytes = sizeof(float);
    long pages = sysconf(_SC_AVPHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    be->free_memory = pages > 0 && page_size > 0 ? (size_t)pages * (size_t)page_size : 0;
    be->default_kv_fraction = 0; /* vLLM's CPU backend sizes its KV cache by the workload, not the RAM */
    be->alloc_kv = llm_cpu_alloc_kv; be->forward = llm_cpu_forward; be->destroy = llm_cpu_destroy;
    return be;
}

llm_backend *llm_cpu_backend_create(const llm_model *m, char *err) { return llm_cpu_backend_new(m, 0, err); }
llm_backend *llm_cpu_exact_backend_create(const llm_model *m, char *err) {
    return llm_cpu_backend_new(m, 1, err);
}

/* ===========================================================================================================
 * 8. Sampler
 * The order is vLLM's: penalties on the raw logits, then temperature, then top-k, top-p and min-p keep a
 * head of the distribution, renormalised, and one uniform draw picks from it. The logits are only read; what
 * changes is copied into the sampler's scratch.
 * ======================================================================================================== */
typedef struct { float p; int32_t id; } llm_prob_id;
#define LLM_SAMPLING_EPS 1e-5f /* temperatures below it are greedy (vLLM's _SAMPLING_EPS): 1 / T overflows */

struct llm_sampler {
    int n_vocab;
    float *penalized;               /* [n_vocab] the logits with penalties applied */
    int *count;                     /* [n_vocab] occurrences of each token in the output */
    unsigned char *seen;            /* [n_vocab] 1 for tokens of the prompt or the output */
    llm_prob_id *cand;              /* [n_vocab] candidates while they are filtered */
    int32_t *ids;                   /* [n_vocab] the candidates that are left ... */
    float *probs;                   /* [n_vocab] ... and their probabilities */
};

llm_sampler *llm_sampler_create(int n_vocab, char *err) {
    llm_sampler *s = (llm_sampler *)calloc(1, sizeof *s);
    if (s && n_vocab > 0) {
        size_t n = (size_t)n_vocab;
        s->n_vocab = n_vocab;
        s->penalized = (float *)malloc(n * sizeof(float)); s->count = (int *)malloc(n * sizeof(int));
        s->seen = (unsigned char *)malloc(n); s->cand = (llm_prob_id *)malloc(n * sizeof(llm_prob_id));
        s->ids = (int32_t *)malloc(n * sizeof(int32_t)); s->probs = (float *)malloc(n * sizeof(float));
        if (s->penalized && s->count && s->seen && s->cand && s->ids && s->probs) return s;
    }
    llm_sampler_free(s);
    llm_fail(err, n_vocab > 0 ? "out of memory for the sampler" : "the sampler needs a vocabulary");
    return NULL;
}

void llm_sampler_free(llm_sampler *s) {
    if (!s) return;
    free(s->penalized); free(s->count); free(s->seen); free(s->cand); free(s->ids); free(s->probs);
    free(s);
}

/* vLLM's definitions: the repetition penalty divides a positive logit (multiplies a negative one) of every
 * token seen in the prompt or the output; presence and frequency penalties subtract, for tokens of the
 * output, once and once per occurrence. */
const float *llm_sampler_penalize(llm_sampler *s, const llm_sampling_params *p, const float *logits,
                                  const int32_t *history, int n_prompt, int n_history) {
    if (p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f)
        return logits;
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

int llm_sampler_candidates(llm_sampler *s, const llm_sampling_params *p, const float *logits,
                           const int32_t **ids, const float **probs) {
    int V = s->n_vocab;
    llm_prob_id *c = s->cand;
    *ids = s->ids; *probs = s->probs;
    if (p->temperature < LLM_SAMPLING_EPS || p->top_k == 1) {
        s->ids[0] = llm_argmax(logits, V); s->probs[0] = 1.0f;
        return 1;
    }
    /* weights exp((logit - max) / T): the most likely token weighs 1; a masked token (-inf) weighs 0 */
    float mx = logits[llm_argmax(logits, V)], inv_t = 1.0f / p->temperature;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        float w = expf((logits[i] - mx) * inv_t);
        c[i].id = i; c[i].p = w >= 0.0f ? w : 0.0f; /* NaN: -inf minus -inf, or a logit not a number */
        sum += c[i].p;
    }
    if (!(sum > 0)) return 0;
    int n = V, top_k_on = p->top_k > 0 && p->top_k < V;
    if (p->top_p < 1.0f && !top_k_on) {
        /* the head that top_p keeps never reaches a token whose weight is under (1 - top_p) / V of the total:
         * all such tokens together weigh less than 1 - top_p. Drop them before the sort (most of a vocabulary
         * of 150k, every step). */
        double floor_w = (1.0 - p->top_p) * sum / V;
        int kept = 0;
        for (int i = 0; i < n; i++) if (c[i].p >= floor_w) c[kept++] = c[i];
        n = kept;
    }
    if (top_k_on || p->top_p < 1.0f) qsort(c, (size_t)n, sizeof *c, llm_prob_desc);
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
    for (int i = 0; i < n; i++) { s->ids[i] = c[i].id; s->probs[i] = (float)(c[i].p / sum); }
    return n;
}

int32_t llm_sampler_sample(llm_sampler *s, const llm_sampling_params *p, const float *logits,
                           const int32_t *history, int n_prompt, int n_history, uint64_t *rng_state) {
    const float *x = llm_sampler_penalize(s, p, logits, history, n_prompt, n_history);
    if (p->temperature < LLM_SAMPLING_EPS || p->top_k == 1) return llm_argmax(x, s->n_vocab);
    const int32_t *ids; const float *probs;
    int n = llm_sampler_candidates(s, p, x, &ids, &probs);
    if (n <= 0) return -1;
    float u = llm_rand_uniform(rng_state), cum = 0;
    for (int i = 0; i < n; i++) { cum += probs[i]; if (u < cum) return ids[i]; }
    return ids[n - 1]; /* u beyond the rounded sum of the probabilities */
}

/* The log-probabilities that logprobs reports: from the model's own distribution, before penalties and
 * temperature (as vLLM). Writes the k most likely tokens and theirs, and returns log(sum exp(logits)). */
static float llm_logprobs_top(const float *logits, int n, int k, int32_t *top_ids, float *top_logprobs) {
    float mx = logits[llm_argmax(logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)(logits[i] - mx));
    float lse = mx + (float)log(sum);
    int have = 0;
    for (int i = 0; i < n && k > 0; i++) { /* insertion into a sorted list of k: k is small */
        if (have == k && logits[i] <= logits[top_ids[k - 1]]) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && logits[top_ids[j - 1]] < logits[i]) { top_ids[j] = top_ids[j - 1]; j--; }
        top_ids[j] = i;
    }
    for (int j = 0; j < k; j++) top_logprobs[j] = logits[top_ids[j]] - lse;
    return lse;
}

/* ===========================================================================================================
 * 9. Detokenizer and stop conditions: token ids back to text, and where the text must stop
 * ======================================================================================================== */
static int llm_hex_digit(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

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
    int n = llm_tokenizer_piece(t, id, d->special, NULL, 0);
    if (n <= 0) return 0;
    size_t total = (size_t)d->n_pending + (size_t)n, keep;
    unsigned char small[512], *buf = total <= sizeof small ? small : (unsigned char *)malloc(total);
    if (!buf) return 0;
    memcpy(buf, d->pending, (size_t)d->n_pending);
    llm_tokenizer_piece(t, id, d->special, (char *)buf + d->n_pending, n);
    size_t m = llm_utf8_clean(buf, total, NULL, &keep);
    if (m <= (size_t)cap) {
        llm_utf8_clean(buf, total, out, &keep);
        memcpy(d->pending, buf + total - keep, keep);
        d->n_pending = (int)keep;
    }
    if (buf != small) free(buf);
    return (int)m;
}

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
/* Where the first of the stop strings begins in text[0..len), or -1. */
static int llm_stop_find(const llm_sampling_params *p, const char *text, int len) {
    int first = -1;
    for (int i = 0; i < p->n_stop; i++) {
        int sl = (int)strlen(p->stop[i]);
        if (sl == 0) continue;
        for (int at = 0; at + sl <= len && (first < 0 || at < first); at++)
            if (memcmp(text + at, p->stop[i], (size_t)sl) == 0) { first = at; break; }
    }
    return first;
}

/* The longest tail of text[0..len) that is the beginning of a stop string: it must wait for the next
 * token. */
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
 * could still begin a stop string. A stop string found ends the sequence (finish "stop") without its text;
 * finishing releases all that is held. */
static void llm_seq_push_text(llm_seq *s, int32_t token, const llm_tokenizer *tok, int finishing) {
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
    const llm_sampling_params *p = &s->req->params;
    int len = (int)arrlen(s->held_text), stop_at = llm_stop_find(p, s->held_text, len);
    if (stop_at >= 0) { len = stop_at; s->finish_reason = LLM_FINISH_STOP; }
    int emit = s->finish_reason || finishing ? len : len - llm_stop_holdback(p, s->held_text, len);
    if (emit > 0) memcpy(arraddnptr(s->out_text, emit), s->held_text, (size_t)emit);
    if (s->finish_reason) arrsetlen(s->held_text, 0);
    else if (emit > 0) arrdeln(s->held_text, 0, emit);
}

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
 * freed; new requests and aborts come in from the inbox; the scheduler plans the step; the plan becomes one
 * batch and one forward call; each sequence that reached the end of its tokens samples the next one, which
 * goes through the stop conditions and the detokenizer; every sequence with news gives an output, and
 * finished ones leave.
 * ======================================================================================================== */
struct llm_engine {
    llm_engine_config cfg;
    llm_model model;
    llm_backend *backend;
    char backend_note[LLM_ERR_LEN]; /* why the backends before it did not start */
    llm_block_manager bm;
    llm_scheduler sched;
    llm_sampler *sampler;
    int max_model_len;
    llm_engine_stats stats;         /* the engine's own counters; llm_engine_get_stats adds the rest */
    /* the inbox, filled from any thread */
    pthread_mutex_t lock;           /* guards the inbox, the aborts and next_id */
    pthread_cond_t work_added;      /* add_request and abort signal it: it wakes llm_engine_wait */
    llm_seq **inbox;
    uint64_t *inbox_abort;
    uint64_t next_id;
    /* one step's scratch (stb_ds arrays) */
    llm_seq **finished;             /* finished this step, freed at the start of the next: outputs point in */
    int32_t *b_tokens, *b_positions, *b_seq_start, *b_logit_rows;
    const int32_t **b_tables;
    float *logits;                  /* [logits_rows][vocab_size] */
    int logits_rows;
    float *masked_logits;           /* [vocab_size]: a row with the stop tokens masked, for min_tokens */
    char step_error[LLM_ERR_LEN];   /* why this step's forward pass failed: the error of its outputs */
    llm_output *outputs;
};

llm_engine_config llm_engine_defaults(void) {
    llm_engine_config c;
    memset(&c, 0, sizeof c);
    c.block_size = 16; c.max_num_seqs = 256; c.max_num_batched_tokens = 2048; c.enable_prefix_caching = 1;
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

static int llm_engine_check_config(const llm_engine_config *c, char *err) {
    if (c->block_size <= 0 || c->block_size > 1024)
        return llm_fail(err, "block_size must be between 1 and 1024, got %d", c->block_size);
    if (c->max_num_seqs <= 0)
        return llm_fail(err, "max_num_seqs must be at least 1, got %d", c->max_num_seqs);
    if (c->max_num_batched_tokens <= 0)
        return llm_fail(err, "max_num_batched_tokens must be at least 1, got %d", c->max_num_batched_tokens);
    if (c->num_blocks < 0 || c->max_model_len < 0)
        return llm_fail(err, "num_blocks and max_model_len must be >= 0");
    if (!(c->kv_fraction >= 0 && c->kv_fraction <= 1))
        return llm_fail(err, "kv_fraction must be in [0, 1] (0: the backend's default)");
    return 0;
}

static int llm_engine_start_backend(llm_engine *e, char *err) {
    if (e->cfg.create_backend) return (e->backend = e->cfg.create_backend(&e->model, err)) != NULL ? 0 : -1;
    for (size_t i = 0; i < sizeof llm_backends / sizeof llm_backends[0] && !e->backend; i++) {
        e->backend = llm_backends[i].create(&e->model, err);
        if (!e->backend) {
            size_t at = strlen(e->backend_note);
            snprintf(e->backend_note + at, sizeof e->backend_note - at, "%s%s: %s", at ? "; " : "",
                     llm_backends[i].name, err);
        }
    }
    return e->backend ? 0 : -1;
}

/* The KV pool in blocks, one policy for every backend: num_blocks; else kv_bytes; else kv_fraction of the
 * memory the backend has free; else the backend's default fraction of it; and a backend with none (the CPU,
 * like vLLM's) gets room for max_num_seqs full contexts, 4 GiB at most. */
static int llm_kv_pool_blocks(const llm_engine *e, size_t block_bytes, char *err) {
    const llm_engine_config *c = &e->cfg;
    if (c->num_blocks > 0) return c->num_blocks;
    double fraction = c->kv_fraction > 0 ? c->kv_fraction : e->backend->default_kv_fraction;
    size_t bytes = c->kv_bytes;
    if (!bytes && fraction > 0) bytes = (size_t)(fraction * (double)e->backend->free_memory);
    if (!bytes) {
        size_t blocks_per_context = (size_t)((e->max_model_len + c->block_size - 1) / c->block_size);
        bytes = (size_t)c->max_num_seqs * blocks_per_context * block_bytes;
        if (bytes > ((size_t)4 << 30)) bytes = (size_t)4 << 30;
    }
    size_t n = bytes / block_bytes;
    if (n == 0)
        return llm_fail(err, "the KV pool of %zu bytes holds no block of %zu bytes", bytes, block_bytes);
    return n > (1u << 30) ? (1 << 30) : (int)n; /* ids are ints; the block manager keeps a record each */
}

llm_engine *llm_engine_create(const llm_engine_config *cfg, char *err) {
    if (llm_engine_check_config(cfg, err) != 0) return NULL;
    llm_engine *e = (llm_engine *)calloc(1, sizeof *e);
    if (!e) { llm_fail(err, "out of memory"); return NULL; }
    e->cfg = *cfg;
    e->next_id = 1;
    pthread_mutex_init(&e->lock, NULL);
    pthread_condattr_t attr; /* timed waits on the monotonic clock: changes of the wall clock do not matter */
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&e->work_added, &attr);
    pthread_condattr_destroy(&attr);
    int rc = cfg->dummy ? llm_model_dummy(&e->model, cfg->dummy, cfg->dummy_seed, err)
           : cfg->model_path ? llm_model_load(&e->model, cfg->model_path, err)
           : llm_fail(err, "no model given");
    if (rc != 0) { llm_engine_destroy(e); return NULL; }
    e->max_model_len = e->model.cfg.context_length;
    if (cfg->max_model_len > 0 && cfg->max_model_len < e->max_model_len)
        e->max_model_len = cfg->max_model_len;
    if (llm_engine_start_backend(e, err) != 0) { llm_engine_destroy(e); return NULL; }
    size_t block_bytes = llm_kv_bytes_per_block(&e->model.cfg, cfg->block_size, e->backend->kv_value_bytes);
    int num_blocks = llm_kv_pool_blocks(e, block_bytes, err);
    if (num_blocks < 0 || e->backend->alloc_kv(e->backend, num_blocks, cfg->block_size, err) != 0 ||
        llm_block_manager_init(&e->bm, num_blocks, cfg->block_size, cfg->enable_prefix_caching, err) != 0 ||
        !(e->sampler = llm_sampler_create(e->model.cfg.vocab_size, err))) {
        llm_engine_destroy(e); return NULL;
    }
    llm_scheduler *sch = &e->sched;
    sch->bm = &e->bm; sch->static_batching = cfg->static_batching; sch->static_batch_open = 1;
    sch->max_num_seqs = cfg->max_num_seqs; sch->max_num_batched_tokens = cfg->max_num_batched_tokens;
    return e;
}

void llm_engine_destroy(llm_engine *e) {
    if (!e) return;
    llm_seq **all[4] = {e->sched.waiting, e->sched.running, e->finished, e->inbox};
    for (int k = 0; k < 4; k++) for (int i = 0; i < arrlen(all[k]); i++) llm_seq_free(all[k][i]);
    llm_scheduler *sch = &e->sched;
    arrfree(sch->waiting); arrfree(sch->running);
    arrfree(sch->scheduled); arrfree(sch->n_new); arrfree(sch->copy_src); arrfree(sch->copy_dst);
    arrfree(e->finished); arrfree(e->inbox); arrfree(e->inbox_abort);
    arrfree(e->b_tokens); arrfree(e->b_positions); arrfree(e->b_seq_start); arrfree(e->b_logit_rows);
    arrfree(e->b_tables); arrfree(e->outputs);
    free(e->logits); free(e->masked_logits);
    llm_sampler_free(e->sampler);
    if (e->backend) e->backend->destroy(e->backend);
    llm_block_manager_free(&e->bm);
    llm_model_free(&e->model);
    pthread_cond_destroy(&e->work_added);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

const llm_model *llm_engine_model(const llm_engine *e) { return &e->model; }

/* ---- Requests in, from any thread ---------------------------------------------------------------------- */
uint64_t llm_engine_add_request(llm_engine *e, const char *prompt, const int32_t *prompt_ids,
                                int n_prompt_ids, const llm_sampling_params *p, void *user, char *err) {
    const llm_config *c = &e->model.cfg;
    if (llm_request_check(p, err) != 0) return 0;
    /* the prompt's ids: as given, or the text tokenized (llm_tokenize_prompt) */
    int32_t *ids = NULL;
    if (prompt_ids) {
        if (n_prompt_ids < 0) { llm_fail(err, "n_prompt_ids is negative (%d)", n_prompt_ids); return 0; }
        for (int i = 0; i < n_prompt_ids; i++)
            if (prompt_ids[i] < 0 || prompt_ids[i] >= c->vocab_size) {
                llm_fail(err, "prompt token id %d is outside the vocabulary (0..%d)", prompt_ids[i],
                         c->vocab_size - 1);
                return 0;
            }
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
    }
    int n_prompt = (int)arrlen(ids);
    int blocks_needed = (n_prompt + e->cfg.block_size) / e->cfg.block_size; /* with the first new token */
    if (n_prompt == 0) { arrfree(ids); llm_fail(err, "the prompt is empty"); return 0; }
    if (n_prompt >= e->max_model_len) {
        arrfree(ids);
        llm_fail(err, "the prompt has %d tokens, but this model's context is %d tokens (the prompt and at "
                 "least one new token must fit)", n_prompt, e->max_model_len);
        return 0;
    }
    if (blocks_needed > e->bm.num_blocks) {
        arrfree(ids);
        llm_fail(err, "the prompt needs %d KV blocks but the whole pool has %d", blocks_needed,
                 e->bm.num_blocks);
        return 0;
    }
    llm_seq *s = llm_seq_new(ids, p, user);
    if (!s) { llm_fail(err, "out of memory"); return 0; }
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

void llm_engine_abort(llm_engine *e, uint64_t request_id) {
    pthread_mutex_lock(&e->lock);
    arrput(e->inbox_abort, request_id);
    pthread_cond_signal(&e->work_added);
    pthread_mutex_unlock(&e->lock);
}

/* Work: something in the inbox, or sequences waiting or running. Called with the lock held. */
static int llm_engine_work_locked(llm_engine *e) {
    return arrlen(e->inbox) > 0 || arrlen(e->inbox_abort) > 0 || arrlen(e->sched.waiting) > 0 ||
           arrlen(e->sched.running) > 0;
}

int llm_engine_wait(llm_engine *e, int timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
    }
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
    for (int i = 0; i < arrlen(e->finished); i++) llm_seq_free(e->finished[i]);
    arrsetlen(e->finished, 0); arrsetlen(e->outputs, 0);
    e->step_error[0] = 0;
    for (int i = 0; i < arrlen(e->sched.running); i++) {
        llm_seq *s = e->sched.running[i];
        arrsetlen(s->out_tokens, 0); arrsetlen(s->out_text, 0); arrsetlen(s->out_logprobs, 0);
        arrsetlen(s->out_top_ids, 0); arrsetlen(s->out_top_logprobs, 0);
    }
}

/* A sequence is done: its blocks go back at once; its output says why at the end of the step. */
static void llm_seq_finish(llm_engine *e, llm_seq *s, int reason, const char *error) {
    s->finish_reason = reason; s->error = error; s->status = LLM_SEQ_FINISHED;
    llm_seq_release_blocks(&e->bm, s);
}

/* The output of a sequence for this step. A sequence that finishes before its prompt was computed (aborted,
 * or failed) still stands for all n samples of its request: each gets its finish. */
static void llm_emit(llm_engine *e, llm_seq *s) {
    llm_output o;
    memset(&o, 0, sizeof o);
    o.request_id = s->req->id; o.user = s->req->user; o.index = s->index;
    o.token_ids = s->out_tokens; o.n_tokens = (int)arrlen(s->out_tokens);
    o.text = s->out_text; o.text_len = (int)arrlen(s->out_text);
    if (s->req->params.logprobs >= 0) {
        o.logprobs = s->out_logprobs; o.n_top = s->req->params.logprobs;
        o.top_ids = s->out_top_ids; o.top_logprobs = s->out_top_logprobs;
    }
    o.finish_reason = s->finish_reason; o.error = s->error;
    o.n_prompt_tokens = s->req->n_prompt; o.n_cached_tokens = s->n_cached_tokens;
    o.n_generated = (int)arrlen(s->tokens) - s->req->n_prompt;
    int copies = s->finish_reason && s->fork_pending ? s->req->params.n : 1;
    for (int i = 0; i < copies; i++) {
        o.index = s->index + i;
        arrput(e->outputs, o);
        if (o.finish_reason) e->stats.requests_finished++;
    }
}

/* 2. The inbox: new requests join the waiting queue; aborted requests finish at once, wherever they are. */
static void llm_engine_take_inbox(llm_engine *e) {
    pthread_mutex_lock(&e->lock);
    for (int i = 0; i < arrlen(e->inbox); i++) arrput(e->sched.waiting, e->inbox[i]);
    arrsetlen(e->inbox, 0);
    uint64_t *aborts = e->inbox_abort;
    e->inbox_abort = NULL;
    pthread_mutex_unlock(&e->lock);
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

/* 3. The scheduler plans the step: llm_schedule (section 5). */

/* 4. The plan as one batch: each scheduled sequence's next n_new tokens, flattened, with its block table;
 *    logits for the sequences whose chunk reaches the end of their tokens; the copy-on-write copies first. */
static int llm_engine_forward(llm_engine *e, char *err) {
    llm_scheduler *sch = &e->sched;
    int n_seqs = (int)arrlen(sch->scheduled), V = e->model.cfg.vocab_size;
    arrsetlen(e->b_tokens, 0); arrsetlen(e->b_positions, 0); arrsetlen(e->b_logit_rows, 0);
    arrsetlen(e->b_seq_start, 0); arrsetlen(e->b_tables, 0);
    for (int i = 0; i < n_seqs; i++) {
        llm_seq *s = sch->scheduled[i];
        arrput(e->b_seq_start, (int32_t)arrlen(e->b_tokens));
        arrput(e->b_tables, s->block_table);
        for (int j = 0; j < sch->n_new[i]; j++) {
            arrput(e->b_tokens, s->tokens[s->n_computed + j]);
            arrput(e->b_positions, s->n_computed + j);
        }
        if (s->n_computed + sch->n_new[i] == arrlen(s->tokens))
            arrput(e->b_logit_rows, (int32_t)arrlen(e->b_tokens) - 1);
    }
    arrput(e->b_seq_start, (int32_t)arrlen(e->b_tokens));
    llm_batch b;
    memset(&b, 0, sizeof b);
    b.n_tokens = (int)arrlen(e->b_tokens); b.tokens = e->b_tokens; b.positions = e->b_positions;
    b.n_seqs = n_seqs; b.seq_start = e->b_seq_start; b.block_tables = e->b_tables;
    b.n_logits = (int)arrlen(e->b_logit_rows); b.logit_rows = e->b_logit_rows;
    b.n_copies = (int)arrlen(sch->copy_src); b.copy_src = sch->copy_src; b.copy_dst = sch->copy_dst;
    if (b.n_logits > e->logits_rows) {
        free(e->logits);
        e->logits_rows = b.n_logits;
        e->logits = (float *)malloc((size_t)b.n_logits * (size_t)V * sizeof(float));
        if (!e->logits) {
            e->logits_rows = 0;
            return llm_fail(err, "out of memory for %d rows of logits", b.n_logits);
        }
    }
    return e->backend->forward(e->backend, &b, e->logits, err);
}

/* 4, when the forward pass failed: every sequence of the step finishes with the error; nothing else
 * changes. */
static void llm_engine_fail_step(llm_engine *e) {
    if (!e->step_error[0]) /* a backend that gave no reason */
        snprintf(e->step_error, sizeof e->step_error, "the %s backend failed", e->backend->name);
    for (int i = 0; i < arrlen(e->sched.scheduled); i++)
        llm_seq_finish(e, e->sched.scheduled[i], LLM_FINISH_ERROR, e->step_error);
}

/* 5. One sampled token for s, from its row of logits: the logprobs asked for, the token, then the stop
 *    conditions (end of generation, stop ids, max_tokens, the context, the pool) and its text. */
static void llm_seq_accept(llm_engine *e, llm_seq *s, const float *logits) {
    const llm_sampling_params *p = &s->req->params;
    int V = e->model.cfg.vocab_size, n_prompt = s->req->n_prompt;
    for (int i = 0; i < V; i++) if (!isfinite(logits[i])) { /* a broken model: never sample from it */
        llm_seq_finish(e, s, LLM_FINISH_ERROR, "the model's logits are not finite numbers (NaN or infinite)");
        return;
    }
    const float *sample_from = logits;
    if ((int)arrlen(s->tokens) - n_prompt < p->min_tokens) { /* too early to stop: mask what would stop it */
        if (!e->masked_logits && !(e->masked_logits = (float *)malloc((size_t)V * sizeof(float)))) {
            llm_seq_finish(e, s, LLM_FINISH_ERROR, "out of memory for min_tokens");
            return;
        }
        memcpy(e->masked_logits, logits, (size_t)V * sizeof(float));
        for (int i = 0; i < p->n_stop_token_ids; i++)
            if (p->stop_token_ids[i] >= 0 && p->stop_token_ids[i] < V)
                e->masked_logits[p->stop_token_ids[i]] = -INFINITY;
        for (ptrdiff_t i = 0; !p->ignore_eos && e->model.tok && i < arrlen(e->model.tok->eog); i++)
            e->masked_logits[e->model.tok->eog[i]] = -INFINITY;
        sample_from = e->masked_logits;
    }
    int32_t token = llm_sampler_sample(e->sampler, p, sample_from, s->tokens, n_prompt,
                                       (int)arrlen(s->tokens), &s->rng);
    if (token < 0) {
        llm_seq_finish(e, s, LLM_FINISH_ERROR, "sampling found no token to pick: the logits are not numbers");
        return;
    }
    if (p->logprobs >= 0) {
        int K = p->logprobs < V ? p->logprobs : V;
        int32_t *top_ids = arraddnptr(s->out_top_ids, K);
        float *top_logprobs = arraddnptr(s->out_top_logprobs, K);
        float lse = llm_logprobs_top(logits, V, K, top_ids, top_logprobs);
        arrput(s->out_logprobs, logits[token] - lse);
    }
    arrput(s->tokens, token); arrput(s->out_tokens, token);
    e->stats.generation_tokens++;
    int n_tokens = (int)arrlen(s->tokens), reason = LLM_FINISH_NONE;
    const llm_tokenizer *tok = e->model.tok;
    if (!p->ignore_eos && tok && llm_tokenizer_is_eog(tok, token)) reason = LLM_FINISH_STOP;
    for (int i = 0; i < p->n_stop_token_ids; i++) if (p->stop_token_ids[i] == token) reason = LLM_FINISH_STOP;
    /* out of room: max_tokens, the model's context, or (a tiny pool) the whole KV pool, which the next token
     * could not fit in */
    if (!reason && ((p->max_tokens > 0 && n_tokens - n_prompt >= p->max_tokens) ||
                    n_tokens >= e->max_model_len || n_tokens > e->bm.num_blocks * e->cfg.block_size))
        reason = LLM_FINISH_LENGTH;
    /* the text: a stop token's own text is not output */
    llm_seq_push_text(s, reason == LLM_FINISH_STOP ? -1 : token, tok, reason != LLM_FINISH_NONE);
    if (s->finish_reason) reason = s->finish_reason; /* a stop string */
    if (reason) llm_seq_finish(e, s, reason, NULL);
}

/* 5. The step's tokens are computed: full blocks are named for the prefix cache, and each sequence at the end
 *    of its tokens samples the next one (n > 1: the prompt forks first; each sample draws from its row). */
static void llm_engine_sample(llm_engine *e) {
    llm_scheduler *sch = &e->sched;
    int row = 0, V = e->model.cfg.vocab_size;
    for (int i = 0; i < arrlen(sch->scheduled); i++) {
        llm_seq *s = sch->scheduled[i];
        int start = s->n_computed, end = start + sch->n_new[i], n_prompt = s->req->n_prompt;
        if (start < n_prompt) e->stats.prompt_tokens_computed += (end < n_prompt ? end : n_prompt) - start;
        s->n_computed = end;
        llm_seq_hash_blocks(&e->bm, s);
        if (end < arrlen(s->tokens)) continue; /* a prompt chunk: nothing to sample yet */
        const float *logits = e->logits + (size_t)row++ * V;
        if (s->fork_pending) {
            int first_child = (int)arrlen(sch->running);
            if (llm_seq_fork(sch, s) != 0) {
                llm_seq_finish(e, s, LLM_FINISH_ERROR, "out of memory for the samples of a request");
                continue;
            }
            for (int k = first_child; k < arrlen(sch->running); k++)
                llm_seq_accept(e, sch->running[k], logits);
        }
        llm_seq_accept(e, s, logits);
    }
}

/* 6. Outputs: every running sequence with something new, or finished, gives one; the finished leave now. */
static void llm_engine_collect(llm_engine *e) {
    llm_scheduler *sch = &e->sched;
    for (int i = 0; i < arrlen(sch->running); i++) {
        llm_seq *s = sch->running[i];
        if (arrlen(s->out_tokens) || arrlen(s->out_text) || s->status == LLM_SEQ_FINISHED) llm_emit(e, s);
        if (s->status == LLM_SEQ_FINISHED) { arrput(e->finished, s); arrdel(sch->running, i); i--; }
    }
}

int llm_engine_step(llm_engine *e, const llm_output **outputs) {
    llm_engine_begin_step(e);
    llm_engine_take_inbox(e);
    llm_schedule(&e->sched);
    if (arrlen(e->sched.scheduled) > 0) {
        if (llm_engine_forward(e, e->step_error) == 0) { e->stats.steps++; llm_engine_sample(e); }
        else llm_engine_fail_step(e);
    }
    llm_engine_collect(e);
    *outputs = e->outputs;
    return (int)arrlen(e->outputs);
}

/* ---- Looking inside ------------------------------------------------------------------------------------ */
llm_engine_stats llm_engine_get_stats(llm_engine *e) {
    llm_engine_stats s = e->stats;
    s.backend = e->backend->name; s.backend_note = e->backend_note;
    s.block_size = e->cfg.block_size; s.max_model_len = e->max_model_len;
    s.kv_bytes_per_block = llm_kv_bytes_per_block(&e->model.cfg, s.block_size, e->backend->kv_value_bytes);
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
    llm_seq **lists[2] = {e->sched.running, e->sched.waiting};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < arrlen(lists[k]); i++)
            for (int b = 0; b < arrlen(lists[k][i]->block_table); b++) {
                int id = lists[k][i]->block_table[b];
                if (id < 0 || id >= bm->num_blocks) {
                    rc = llm_fail(err, "block table holds block %d, outside the pool", id);
                    goto done;
                }
                refs[id]++;
            }
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
 * Appendix: the Unicode classes of the pre-tokenizers (section 3)
 * ======================================================================================================== */
/* Generated by `python3 tools/gen_unicode.py` from UnicodeData.txt (Unicode 15.0.0): to change it, run that
 * again. */
static const uint32_t llm_uni_runs[2261] = {
    0x0, 0x97, 0xE0, 0x207, 0x215, 0x246, 0x255, 0x2B6, 0x2C5, 0x303, 0x3A5, 0x3C6, 0x3F5, 0x411, 0x5B5,
    0x5E6, 0x5F5, 0x606, 0x611, 0x7B5, 0x7C6, 0x7D5, 0x7E6, 0x7F0, 0x857, 0x860, 0xA07, 0xA15, 0xA26, 0xA75,
    0xA86, 0xAA1, 0xAB5, 0xAC6, 0xAD0, 0xAE6, 0xB24, 0xB46, 0xB51, 0xB65, 0xB86, 0xB94, 0xBA1, 0xBB5, 0xBC4,
    0xBF5, 0xC01, 0xD76, 0xD81, 0xF76, 0xF81, 0x2C26, 0x2C61, 0x2D26, 0x2E01, 0x2E56, 0x2EC1, 0x2ED6, 0x2EE1,
    0x2EF6, 0x3002, 0x3701, 0x3756, 0x3761, 0x3780, 0x37A1, 0x37E5, 0x37F1, 0x3800, 0x3846, 0x3861, 0x3875,
    0x3881, 0x38B0, 0x38C1, 0x38D0, 0x38E1, 0x3A20, 0x3A31, 0x3F66, 0x3F71, 0x4826, 0x4832, 0x48A1, 0x5300,
    0x5311, 0x5570, 0x5591, 0x55A5, 0x5601, 0x5895, 0x58B0, 0x58D6, 0x5900, 0x5912, 0x5BE5, 0x5BF2, 0x5C05,
    0x5C12, 0x5C35, 0x5C42, 0x5C65, 0x5C72, 0x5C80, 0x5D01, 0x5EB0, 0x5EF1, 0x5F35, 0x5F50, 0x6066, 0x6095,
    0x60B6, 0x60C5, 0x60E6, 0x6102, 0x61B5, 0x61C0, 0x61D5, 0x6201, 0x64B2, 0x6603, 0x66A5, 0x66E1, 0x6702,
    0x6711, 0x6D45, 0x6D51, 0x6D62, 0x6DD0, 0x6DE6, 0x6DF2, 0x6E51, 0x6E72, 0x6E96, 0x6EA2, 0x6EE1, 0x6F03,
    0x6FA1, 0x6FD6, 0x6FF1, 0x7005, 0x70E0, 0x7101, 0x7112, 0x7121, 0x7302, 0x74B0, 0x74D1, 0x7A62, 0x7B11,
    0x7B20, 0x7C03, 0x7CA1, 0x7EB2, 0x7F41, 0x7F66, 0x7F75, 0x7FA1, 0x7FB0, 0x7FD2, 0x7FE6, 0x8001, 0x8162,
    0x81A1, 0x81B2, 0x8241, 0x8252, 0x8281, 0x8292, 0x82E0, 0x8305, 0x83F0, 0x8401, 0x8592, 0x85C0, 0x85E5,
    0x85F0, 0x8601, 0x86B0, 0x8701, 0x8886, 0x8891, 0x88F0, 0x8982, 0x8A01, 0x8CA2, 0x8E20, 0x8E32, 0x9041,
    0x93A2, 0x93D1, 0x93E2, 0x9501, 0x9512, 0x9581, 0x9622, 0x9645, 0x9663, 0x9705, 0x9711, 0x9812, 0x9840,
    0x9851, 0x98D0, 0x98F1, 0x9910, 0x9931, 0x9A90, 0x9AA1, 0x9B10, 0x9B21, 0x9B30, 0x9B61, 0x9BA0, 0x9BC2,
    0x9BD1, 0x9BE2, 0x9C50, 0x9C72, 0x9C90, 0x9CB2, 0x9CE1, 0x9CF0, 0x9D72, 0x9D80, 0x9DC1, 0x9DE0, 0x9DF1,
    0x9E22, 0x9E40, 0x9E63, 0x9F01, 0x9F26, 0x9F44, 0x9FA6, 0x9FC1, 0x9FD5, 0x9FE2, 0x9FF0, 0xA012, 0xA040,
    0xA051, 0xA0B0, 0xA0F1, 0xA110, 0xA131, 0xA290, 0xA2A1, 0xA310, 0xA321, 0xA340, 0xA351, 0xA370, 0xA381,
    0xA3A0, 0xA3C2, 0xA3D0, 0xA3E2, 0xA430, 0xA472, 0xA490, 0xA4B2, 0xA4E0, 0xA512, 0xA520, 0xA591, 0xA5D0,
    0xA5E1, 0xA5F0, 0xA663, 0xA702, 0xA721, 0xA752, 0xA765, 0xA770, 0xA812, 0xA840, 0xA851, 0xA8E0, 0xA8F1,
    0xA920, 0xA931, 0xAA90, 0xAAA1, 0xAB10, 0xAB21, 0xAB40, 0xAB51, 0xABA0, 0xABC2, 0xABD1, 0xABE2, 0xAC60,
    0xAC72, 0xACA0, 0xACB2, 0xACE0, 0xAD01, 0xAD10, 0xAE01, 0xAE22, 0xAE40, 0xAE63, 0xAF05, 0xAF16, 0xAF20,
    0xAF91, 0xAFA2, 0xB000, 0xB012, 0xB040, 0xB051, 0xB0D0, 0xB0F1, 0xB110, 0xB131, 0xB290, 0xB2A1, 0xB310,
    0xB321, 0xB340, 0xB351, 0xB3A0, 0xB3C2, 0xB3D1, 0xB3E2, 0xB450, 0xB472, 0xB490, 0xB4B2, 0xB4E0, 0xB552,
    0xB580, 0xB5C1, 0xB5E0, 0xB5F1, 0xB622, 0xB640, 0xB663, 0xB706, 0xB711, 0xB724, 0xB780, 0xB822, 0xB831,
    0xB840, 0xB851, 0xB8B0, 0xB8E1, 0xB910, 0xB921, 0xB960, 0xB991, 0xB9B0, 0xB9C1, 0xB9D0, 0xB9E1, 0xBA00,
    0xBA31, 0xBA50, 0xBA81, 0xBAB0, 0xBAE1, 0xBBA0, 0xBBE2, 0xBC30, 0xBC62, 0xBC90, 0xBCA2, 0xBCE0, 0xBD01,
    0xBD10, 0xBD72, 0xBD80, 0xBE63, 0xBF04, 0xBF36, 0xBFB0, 0xC002, 0xC051, 0xC0D0, 0xC0E1, 0xC110, 0xC121,
    0xC290, 0xC2A1, 0xC3A0, 0xC3C2, 0xC3D1, 0xC3E2, 0xC450, 0xC462, 0xC490, 0xC4A2, 0xC4E0, 0xC552, 0xC570,
    0xC581, 0xC5B0, 0xC5D1, 0xC5E0, 0xC601, 0xC622, 0xC640, 0xC663, 0xC700, 0xC775, 0xC784, 0xC7F6, 0xC801,
    0xC812, 0xC845, 0xC851, 0xC8D0, 0xC8E1, 0xC910, 0xC921, 0xCA90, 0xCAA1, 0xCB40, 0xCB51, 0xCBA0, 0xCBC2,
    0xCBD1, 0xCBE2, 0xCC50, 0xCC62, 0xCC90, 0xCCA2, 0xCCE0, 0xCD52, 0xCD70, 0xCDD1, 0xCDF0, 0xCE01, 0xCE22,
    0xCE40, 0xCE63, 0xCF00, 0xCF11, 0xCF32, 0xCF40, 0xD002, 0xD041, 0xD0D0, 0xD0E1, 0xD110, 0xD121, 0xD3B2,
    0xD3D1, 0xD3E2, 0xD450, 0xD462, 0xD490, 0xD4A2, 0xD4E1, 0xD4F6, 0xD500, 0xD541, 0xD572, 0xD584, 0xD5F1,
    0xD622, 0xD640, 0xD663, 0xD704, 0xD796, 0xD7A1, 0xD800, 0xD812, 0xD840, 0xD851, 0xD970, 0xD9A1, 0xDB20,
    0xDB31, 0xDBC0, 0xDBD1, 0xDBE0, 0xDC01, 0xDC70, 0xDCA2, 0xDCB0, 0xDCF2, 0xDD50, 0xDD62, 0xDD70, 0xDD82,
    0xDE00, 0xDE63, 0xDF00, 0xDF22, 0xDF45, 0xDF50, 0xE011, 0xE312, 0xE321, 0xE342, 0xE3B0, 0xE3F6, 0xE401,
    0xE472, 0xE4F5, 0xE503, 0xE5A5, 0xE5C0, 0xE811, 0xE830, 0xE841, 0xE850, 0xE861, 0xE8B0, 0xE8C1, 0xEA40,
    0xEA51, 0xEA60, 0xEA71, 0xEB12, 0xEB21, 0xEB42, 0xEBD1, 0xEBE0, 0xEC01, 0xEC50, 0xEC61, 0xEC70, 0xEC82,
    0xECF0, 0xED03, 0xEDA0, 0xEDC1, 0xEE00, 0xF001, 0xF016, 0xF045, 0xF136, 0xF145, 0xF156, 0xF182, 0xF1A6,
    0xF203, 0xF2A4, 0xF346, 0xF352, 0xF366, 0xF372, 0xF386, 0xF392, 0xF3A5, 0xF3E2, 0xF401, 0xF480, 0xF491,
    0xF6D0, 0xF712, 0xF855, 0xF862, 0xF881, 0xF8D2, 0xF980, 0xF992, 0xFBD0, 0xFBE6, 0xFC62, 0xFC76, 0xFCD0,
    0xFCE6, 0xFD05, 0xFD56, 0xFD95, 0xFDB0, 0x10001, 0x102B2, 0x103F1, 0x10403, 0x104A5, 0x10501, 0x10562,
    0x105A1, 0x105E2, 0x10611, 0x10622, 0x10651, 0x10672, 0x106E1, 0x10712, 0x10751, 0x10822, 0x108E1,
    0x108F2, 0x10903, 0x109A2, 0x109E6, 0x10A01, 0x10C60, 0x10C71, 0x10C80, 0x10CD1, 0x10CE0, 0x10D01,
    0x10FB5, 0x10FC1, 0x12490, 0x124A1, 0x124E0, 0x12501, 0x12570, 0x12581, 0x12590, 0x125A1, 0x125E0,
    0x12601, 0x12890, 0x128A1, 0x128E0, 0x12901, 0x12B10, 0x12B21, 0x12B60, 0x12B81, 0x12BF0, 0x12C01,
    0x12C10, 0x12C21, 0x12C60, 0x12C81, 0x12D70, 0x12D81, 0x13110, 0x13121, 0x13160, 0x13181, 0x135B0,
    0x135D2, 0x13605, 0x13694, 0x137D0, 0x13801, 0x13906, 0x139A0, 0x13A01, 0x13F60, 0x13F81, 0x13FE0,
    0x14005, 0x14011, 0x166D6, 0x166E5, 0x166F1, 0x16807, 0x16811, 0x169B5, 0x169D0, 0x16A01, 0x16EB5,
    0x16EE4, 0x16F11, 0x16F90, 0x17001, 0x17122, 0x17160, 0x171F1, 0x17322, 0x17355, 0x17370, 0x17401,
    0x17522, 0x17540, 0x17601, 0x176D0, 0x176E1, 0x17710, 0x17722, 0x17740, 0x17801, 0x17B42, 0x17D45,
    0x17D71, 0x17D85, 0x17DB6, 0x17DC1, 0x17DD2, 0x17DE0, 0x17E03, 0x17EA0, 0x17F04, 0x17FA0, 0x18005,
    0x180B2, 0x180E0, 0x180F2, 0x18103, 0x181A0, 0x18201, 0x18790, 0x18801, 0x18852, 0x18871, 0x18A92,
    0x18AA1, 0x18AB0, 0x18B01, 0x18F60, 0x19001, 0x191F0, 0x19202, 0x192C0, 0x19302, 0x193C0, 0x19406,
    0x19410, 0x19445, 0x19463, 0x19501, 0x196E0, 0x19701, 0x19750, 0x19801, 0x19AC0, 0x19B01, 0x19CA0,
    0x19D03, 0x19DA4, 0x19DB0, 0x19DE6, 0x1A001, 0x1A172, 0x1A1C0, 0x1A1E5, 0x1A201, 0x1A552, 0x1A5F0,
    0x1A602, 0x1A7D0, 0x1A7F2, 0x1A803, 0x1A8A0, 0x1A903, 0x1A9A0, 0x1AA05, 0x1AA71, 0x1AA85, 0x1AAE0,
    0x1AB02, 0x1ACF0, 0x1B002, 0x1B051, 0x1B342, 0x1B451, 0x1B4D0, 0x1B503, 0x1B5A5, 0x1B616, 0x1B6B2,
    0x1B746, 0x1B7D5, 0x1B7F0, 0x1B802, 0x1B831, 0x1BA12, 0x1BAE1, 0x1BB03, 0x1BBA1, 0x1BE62, 0x1BF40,
    0x1BFC5, 0x1C001, 0x1C242, 0x1C380, 0x1C3B5, 0x1C403, 0x1C4A0, 0x1C4D1, 0x1C503, 0x1C5A1, 0x1C7E5,
    0x1C801, 0x1C890, 0x1C901, 0x1CBB0, 0x1CBD1, 0x1CC05, 0x1CC80, 0x1CD02, 0x1CD35, 0x1CD42, 0x1CE91,
    0x1CED2, 0x1CEE1, 0x1CF42, 0x1CF51, 0x1CF72, 0x1CFA1, 0x1CFB0, 0x1D001, 0x1DC02, 0x1E001, 0x1F160,
    0x1F181, 0x1F1E0, 0x1F201, 0x1F460, 0x1F481, 0x1F4E0, 0x1F501, 0x1F580, 0x1F591, 0x1F5A0, 0x1F5B1,
    0x1F5C0, 0x1F5D1, 0x1F5E0, 0x1F5F1, 0x1F7E0, 0x1F801, 0x1FB50, 0x1FB61, 0x1FBD6, 0x1FBE1, 0x1FBF6,
    0x1FC21, 0x1FC50, 0x1FC61, 0x1FCD6, 0x1FD01, 0x1FD40, 0x1FD61, 0x1FDC0, 0x1FDD6, 0x1FE01, 0x1FED6,
    0x1FF00, 0x1FF21, 0x1FF50, 0x1FF61, 0x1FFD6, 0x1FFF0, 0x20007, 0x200B0, 0x20105, 0x20287, 0x202A0,
    0x202F7, 0x20305, 0x20446, 0x20455, 0x20526, 0x20535, 0x205F7, 0x20600, 0x20704, 0x20711, 0x20720,
    0x20744, 0x207A6, 0x207D5, 0x207F1, 0x20804, 0x208A6, 0x208D5, 0x208F0, 0x20901, 0x209D0, 0x20A06,
    0x20C10, 0x20D02, 0x20F10, 0x21006, 0x21021, 0x21036, 0x21071, 0x21086, 0x210A1, 0x21146, 0x21151,
    0x21166, 0x21191, 0x211E6, 0x21241, 0x21256, 0x21261, 0x21276, 0x21281, 0x21296, 0x212A1, 0x212E6,
    0x212F1, 0x213A6, 0x213C1, 0x21406, 0x21451, 0x214A6, 0x214E1, 0x214F6, 0x21504, 0x21831, 0x21854,
    0x218A6, 0x218C0, 0x21906, 0x23085, 0x230C6, 0x23295, 0x232B6, 0x24270, 0x24406, 0x244B0, 0x24604,
    0x249C6, 0x24EA4, 0x25006, 0x27685, 0x27764, 0x27946, 0x27C55, 0x27C76, 0x27E65, 0x27F06, 0x29835,
    0x29996, 0x29D85, 0x29DC6, 0x29FC5, 0x29FE6, 0x2B740, 0x2B766, 0x2B960, 0x2B976, 0x2C001, 0x2CE56,
    0x2CEB1, 0x2CEF2, 0x2CF21, 0x2CF40, 0x2CF95, 0x2CFD4, 0x2CFE5, 0x2D001, 0x2D260, 0x2D271, 0x2D280,
    0x2D2D1, 0x2D2E0, 0x2D301, 0x2D680, 0x2D6F1, 0x2D705, 0x2D710, 0x2D7F2, 0x2D801, 0x2D970, 0x2DA01,
    0x2DA70, 0x2DA81, 0x2DAF0, 0x2DB01, 0x2DB70, 0x2DB81, 0x2DBF0, 0x2DC01, 0x2DC70, 0x2DC81, 0x2DCF0,
    0x2DD01, 0x2DD70, 0x2DD81, 0x2DDF0, 0x2DE02, 0x2E005, 0x2E2F1, 0x2E305, 0x2E506, 0x2E525, 0x2E5E0,
    0x2E806, 0x2E9A0, 0x2E9B6, 0x2EF40, 0x2F006, 0x2FD60, 0x2FF06, 0x2FFC0, 0x30007, 0x30015, 0x30046,
    0x30051, 0x30074, 0x30085, 0x30126, 0x30145, 0x30206, 0x30214, 0x302A2, 0x30305, 0x30311, 0x30366,
    0x30384, 0x303B1, 0x303D5, 0x303E6, 0x30400, 0x30411, 0x30970, 0x30992, 0x309B6, 0x309D1, 0x30A05,
    0x30A11, 0x30FB5, 0x30FC1, 0x31000, 0x31051, 0x31300, 0x31311, 0x318F0, 0x31906, 0x31924, 0x31966,
    0x31A01, 0x31C06, 0x31E40, 0x31F01, 0x32006, 0x321F0, 0x32204, 0x322A6, 0x32484, 0x32506, 0x32514,
    0x32606, 0x32804, 0x328A6, 0x32B14, 0x32C06, 0x34001, 0x4DC06, 0x4E001, 0xA48D0, 0xA4906, 0xA4C70,
    0xA4D01, 0xA4FE5, 0xA5001, 0xA60D5, 0xA6101, 0xA6203, 0xA62A1, 0xA62C0, 0xA6401, 0xA66F2, 0xA6735,
    0xA6742, 0xA67E5, 0xA67F1, 0xA69E2, 0xA6A01, 0xA6E64, 0xA6F02, 0xA6F25, 0xA6F80, 0xA7006, 0xA7171,
    0xA7206, 0xA7221, 0xA7896, 0xA78B1, 0xA7CB0, 0xA7D01, 0xA7D20, 0xA7D31, 0xA7D40, 0xA7D51, 0xA7DA0,
    0xA7F21, 0xA8022, 0xA8031, 0xA8062, 0xA8071, 0xA80B2, 0xA80C1, 0xA8232, 0xA8286, 0xA82C2, 0xA82D0,
    0xA8304, 0xA8366, 0xA83A0, 0xA8401, 0xA8745, 0xA8780, 0xA8802, 0xA8821, 0xA8B42, 0xA8C60, 0xA8CE5,
    0xA8D03, 0xA8DA0, 0xA8E02, 0xA8F21, 0xA8F85, 0xA8FB1, 0xA8FC5, 0xA8FD1, 0xA8FF2, 0xA9003, 0xA90A1,
    0xA9262, 0xA92E5, 0xA9301, 0xA9472, 0xA9540, 0xA95F5, 0xA9601, 0xA97D0, 0xA9802, 0xA9841, 0xA9B32,
    0xA9C15, 0xA9CE0, 0xA9CF1, 0xA9D03, 0xA9DA0, 0xA9DE5, 0xA9E01, 0xA9E52, 0xA9E61, 0xA9F03, 0xA9FA1,
    0xA9FF0, 0xAA001, 0xAA292, 0xAA370, 0xAA401, 0xAA432, 0xAA441, 0xAA4C2, 0xAA4E0, 0xAA503, 0xAA5A0,
    0xAA5C5, 0xAA601, 0xAA776, 0xAA7A1, 0xAA7B2, 0xAA7E1, 0xAAB02, 0xAAB11, 0xAAB22, 0xAAB51, 0xAAB72,
    0xAAB91, 0xAABE2, 0xAAC01, 0xAAC12, 0xAAC21, 0xAAC30, 0xAADB1, 0xAADE5, 0xAAE01, 0xAAEB2, 0xAAF05,
    0xAAF21, 0xAAF52, 0xAAF70, 0xAB011, 0xAB070, 0xAB091, 0xAB0F0, 0xAB111, 0xAB170, 0xAB201, 0xAB270,
    0xAB281, 0xAB2F0, 0xAB301, 0xAB5B6, 0xAB5C1, 0xAB6A6, 0xAB6C0, 0xAB701, 0xABE32, 0xABEB5, 0xABEC2,
    0xABEE0, 0xABF03, 0xABFA0, 0xAC001, 0xD7A40, 0xD7B01, 0xD7C70, 0xD7CB1, 0xD7FC0, 0xF9001, 0xFA6E0,
    0xFA701, 0xFADA0, 0xFB001, 0xFB070, 0xFB131, 0xFB180, 0xFB1D1, 0xFB1E2, 0xFB1F1, 0xFB296, 0xFB2A1,
    0xFB370, 0xFB381, 0xFB3D0, 0xFB3E1, 0xFB3F0, 0xFB401, 0xFB420, 0xFB431, 0xFB450, 0xFB461, 0xFBB26,
    0xFBC30, 0xFBD31, 0xFD3E5, 0xFD406, 0xFD501, 0xFD900, 0xFD921, 0xFDC80, 0xFDCF6, 0xFDD00, 0xFDF01,
    0xFDFC6, 0xFE002, 0xFE105, 0xFE1A0, 0xFE202, 0xFE305, 0xFE530, 0xFE545, 0xFE626, 0xFE635, 0xFE646,
    0xFE670, 0xFE685, 0xFE696, 0xFE6A5, 0xFE6C0, 0xFE701, 0xFE750, 0xFE761, 0xFEFD0, 0xFF015, 0xFF046,
    0xFF055, 0xFF0B6, 0xFF0C5, 0xFF103, 0xFF1A5, 0xFF1C6, 0xFF1F5, 0xFF211, 0xFF3B5, 0xFF3E6, 0xFF3F5,
    0xFF406, 0xFF411, 0xFF5B5, 0xFF5C6, 0xFF5D5, 0xFF5E6, 0xFF5F5, 0xFF661, 0xFFBF0, 0xFFC21, 0xFFC80,
    0xFFCA1, 0xFFD00, 0xFFD21, 0xFFD80, 0xFFDA1, 0xFFDD0, 0xFFE06, 0xFFE70, 0xFFE86, 0xFFEF0, 0xFFFC6,
    0xFFFE0, 0x100001, 0x1000C0, 0x1000D1, 0x100270, 0x100281, 0x1003B0, 0x1003C1, 0x1003E0, 0x1003F1,
    0x1004E0, 0x100501, 0x1005E0, 0x100801, 0x100FB0, 0x101005, 0x101030, 0x101074, 0x101340, 0x101376,
    0x101404, 0x101796, 0x1018A4, 0x1018C6, 0x1018F0, 0x101906, 0x1019D0, 0x101A06, 0x101A10, 0x101D06,
    0x101FD2, 0x101FE0, 0x102801, 0x1029D0, 0x102A01, 0x102D10, 0x102E02, 0x102E14, 0x102FC0, 0x103001,
    0x103204, 0x103240, 0x1032D1, 0x103414, 0x103421, 0x1034A4, 0x1034B0, 0x103501, 0x103762, 0x1037B0,
    0x103801, 0x1039E0, 0x1039F5, 0x103A01, 0x103C40, 0x103C81, 0x103D05, 0x103D14, 0x103D60, 0x104001,
    0x1049E0, 0x104A03, 0x104AA0, 0x104B01, 0x104D40, 0x104D81, 0x104FC0, 0x105001, 0x105280, 0x105301,
    0x105640, 0x1056F5, 0x105701, 0x1057B0, 0x1057C1, 0x1058B0, 0x1058C1, 0x105930, 0x105941, 0x105960,
    0x105971, 0x105A20, 0x105A31, 0x105B20, 0x105B31, 0x105BA0, 0x105BB1, 0x105BD0, 0x106001, 0x107370,
    0x107401, 0x107560, 0x107601, 0x107680, 0x107801, 0x107860, 0x107871, 0x107B10, 0x107B21, 0x107BB0,
    0x108001, 0x108060, 0x108081, 0x108090, 0x1080A1, 0x108360, 0x108371, 0x108390, 0x1083C1, 0x1083D0,
    0x1083F1, 0x108560, 0x108575, 0x108584, 0x108601, 0x108776, 0x108794, 0x108801, 0x1089F0, 0x108A74,
    0x108B00, 0x108E01, 0x108F30, 0x108F41, 0x108F60, 0x108FB4, 0x109001, 0x109164, 0x1091C0, 0x1091F5,
    0x109201, 0x1093A0, 0x1093F5, 0x109400, 0x109801, 0x109B80, 0x109BC4, 0x109BE1, 0x109C04, 0x109D00,
    0x109D24, 0x10A001, 0x10A012, 0x10A040, 0x10A052, 0x10A070, 0x10A0C2, 0x10A101, 0x10A140, 0x10A151,
    0x10A180, 0x10A191, 0x10A360, 0x10A382, 0x10A3B0, 0x10A3F2, 0x10A404, 0x10A490, 0x10A505, 0x10A590,
    0x10A601, 0x10A7D4, 0x10A7F5, 0x10A801, 0x10A9D4, 0x10AA00, 0x10AC01, 0x10AC86, 0x10AC91, 0x10AE52,
    0x10AE70, 0x10AEB4, 0x10AF05, 0x10AF70, 0x10B001, 0x10B360, 0x10B395, 0x10B401, 0x10B560, 0x10B584,
    0x10B601, 0x10B730, 0x10B784, 0x10B801, 0x10B920, 0x10B995, 0x10B9D0, 0x10BA94, 0x10BB00, 0x10C001,
    0x10C490, 0x10C801, 0x10CB30, 0x10CC01, 0x10CF30, 0x10CFA4, 0x10D001, 0x10D242, 0x10D280, 0x10D303,
    0x10D3A0, 0x10E604, 0x10E7F0, 0x10E801, 0x10EAA0, 0x10EAB2, 0x10EAD5, 0x10EAE0, 0x10EB01, 0x10EB20,
    0x10EFD2, 0x10F001, 0x10F1D4, 0x10F271, 0x10F280, 0x10F301, 0x10F462, 0x10F514, 0x10F555, 0x10F5A0,
    0x10F701, 0x10F822, 0x10F865, 0x10F8A0, 0x10FB01, 0x10FC54, 0x10FCC0, 0x10FE01, 0x10FF70, 0x110002,
    0x110031, 0x110382, 0x110475, 0x1104E0, 0x110524, 0x110663, 0x110702, 0x110711, 0x110732, 0x110751,
    0x110760, 0x1107F2, 0x110831, 0x110B02, 0x110BB5, 0x110BD0, 0x110BE5, 0x110C22, 0x110C30, 0x110D01,
    0x110E90, 0x110F03, 0x110FA0, 0x111002, 0x111031, 0x111272, 0x111350, 0x111363, 0x111405, 0x111441,
    0x111452, 0x111471, 0x111480, 0x111501, 0x111732, 0x111745, 0x111761, 0x111770, 0x111802, 0x111831,
    0x111B32, 0x111C11, 0x111C55, 0x111C92, 0x111CD5, 0x111CE2, 0x111D03, 0x111DA1, 0x111DB5, 0x111DC1,
    0x111DD5, 0x111E00, 0x111E14, 0x111F50, 0x112001, 0x112120, 0x112131, 0x1122C2, 0x112385, 0x1123E2,
    0x1123F1, 0x112412, 0x112420, 0x112801, 0x112870, 0x112881, 0x112890, 0x1128A1, 0x1128E0, 0x1128F1,
    0x1129E0, 0x1129F1, 0x112A95, 0x112AA0, 0x112B01, 0x112DF2, 0x112EB0, 0x112F03, 0x112FA0, 0x113002,
    0x113040, 0x113051, 0x1130D0, 0x1130F1, 0x113110, 0x113131, 0x113290, 0x1132A1, 0x113310, 0x113321,
    0x113340, 0x113351, 0x1133A0, 0x1133B2, 0x1133D1, 0x1133E2, 0x113450, 0x113472, 0x113490, 0x1134B2,
    0x1134E0, 0x113501, 0x113510, 0x113572, 0x113580, 0x1135D1, 0x113622, 0x113640, 0x113662, 0x1136D0,
    0x113702, 0x113750, 0x114001, 0x114352, 0x114471, 0x1144B5, 0x114503, 0x1145A5, 0x1145C0, 0x1145D5,
    0x1145E2, 0x1145F1, 0x114620, 0x114801, 0x114B02, 0x114C41, 0x114C65, 0x114C71, 0x114C80, 0x114D03,
    0x114DA0, 0x115801, 0x115AF2, 0x115B60, 0x115B82, 0x115C15, 0x115D81, 0x115DC2, 0x115DE0, 0x116001,
    0x116302, 0x116415, 0x116441, 0x116450, 0x116503, 0x1165A0, 0x116605, 0x1166D0, 0x116801, 0x116AB2,
    0x116B81, 0x116B95, 0x116BA0, 0x116C03, 0x116CA0, 0x117001, 0x1171B0, 0x1171D2, 0x1172C0, 0x117303,
    0x1173A4, 0x1173C5, 0x1173F6, 0x117401, 0x117470, 0x118001, 0x1182C2, 0x1183B5, 0x1183C0, 0x118A01,
    0x118E03, 0x118EA4, 0x118F30, 0x118FF1, 0x119070, 0x119091, 0x1190A0, 0x1190C1, 0x119140, 0x119151,
    0x119170, 0x119181, 0x119302, 0x119360, 0x119372, 0x119390, 0x1193B2, 0x1193F1, 0x119402, 0x119411,
    0x119422, 0x119445, 0x119470, 0x119503, 0x1195A0, 0x119A01, 0x119A80, 0x119AA1, 0x119D12, 0x119D80,
    0x119DA2, 0x119E11, 0x119E25, 0x119E31, 0x119E42, 0x119E50, 0x11A001, 0x11A012, 0x11A0B1, 0x11A332,
    0x11A3A1, 0x11A3B2, 0x11A3F5, 0x11A472, 0x11A480, 0x11A501, 0x11A512, 0x11A5C1, 0x11A8A2, 0x11A9A5,
    0x11A9D1, 0x11A9E5, 0x11AA30, 0x11AB01, 0x11AF90, 0x11B005, 0x11B0A0, 0x11C001, 0x11C090, 0x11C0A1,
    0x11C2F2, 0x11C370, 0x11C382, 0x11C401, 0x11C415, 0x11C460, 0x11C503, 0x11C5A4, 0x11C6D0, 0x11C705,
    0x11C721, 0x11C900, 0x11C922, 0x11CA80, 0x11CA92, 0x11CB70, 0x11D001, 0x11D070, 0x11D081, 0x11D0A0,
    0x11D0B1, 0x11D312, 0x11D370, 0x11D3A2, 0x11D3B0, 0x11D3C2, 0x11D3E0, 0x11D3F2, 0x11D461, 0x11D472,
    0x11D480, 0x11D503, 0x11D5A0, 0x11D601, 0x11D660, 0x11D671, 0x11D690, 0x11D6A1, 0x11D8A2, 0x11D8F0,
    0x11D902, 0x11D920, 0x11D932, 0x11D981, 0x11D990, 0x11DA03, 0x11DAA0, 0x11EE01, 0x11EF32, 0x11EF75,
    0x11EF90, 0x11F002, 0x11F021, 0x11F032, 0x11F041, 0x11F110, 0x11F121, 0x11F342, 0x11F3B0, 0x11F3E2,
    0x11F435, 0x11F503, 0x11F5A0, 0x11FB01, 0x11FB10, 0x11FC04, 0x11FD56, 0x11FF20, 0x11FFF5, 0x120001,
    0x1239A0, 0x124004, 0x1246F0, 0x124705, 0x124750, 0x124801, 0x125440, 0x12F901, 0x12FF15, 0x12FF30,
    0x130001, 0x134300, 0x134402, 0x134411, 0x134472, 0x134560, 0x144001, 0x146470, 0x168001, 0x16A390,
    0x16A401, 0x16A5F0, 0x16A603, 0x16A6A0, 0x16A6E5, 0x16A701, 0x16ABF0, 0x16AC03, 0x16ACA0, 0x16AD01,
    0x16AEE0, 0x16AF02, 0x16AF55, 0x16AF60, 0x16B001, 0x16B302, 0x16B375, 0x16B3C6, 0x16B401, 0x16B445,
    0x16B456, 0x16B460, 0x16B503, 0x16B5A0, 0x16B5B4, 0x16B620, 0x16B631, 0x16B780, 0x16B7D1, 0x16B900,
    0x16E401, 0x16E804, 0x16E975, 0x16E9B0, 0x16F001, 0x16F4B0, 0x16F4F2, 0x16F501, 0x16F512, 0x16F880,
    0x16F8F2, 0x16F931, 0x16FA00, 0x16FE01, 0x16FE25, 0x16FE31, 0x16FE42, 0x16FE50, 0x16FF02, 0x16FF20,
    0x170001, 0x187F80, 0x188001, 0x18CD60, 0x18D001, 0x18D090, 0x1AFF01, 0x1AFF40, 0x1AFF51, 0x1AFFC0,
    0x1AFFD1, 0x1AFFF0, 0x1B0001, 0x1B1230, 0x1B1321, 0x1B1330, 0x1B1501, 0x1B1530, 0x1B1551, 0x1B1560,
    0x1B1641, 0x1B1680, 0x1B1701, 0x1B2FC0, 0x1BC001, 0x1BC6B0, 0x1BC701, 0x1BC7D0, 0x1BC801, 0x1BC890,
    0x1BC901, 0x1BC9A0, 0x1BC9C6, 0x1BC9D2, 0x1BC9F5, 0x1BCA00, 0x1CF002, 0x1CF2E0, 0x1CF302, 0x1CF470,
    0x1CF506, 0x1CFC40, 0x1D0006, 0x1D0F60, 0x1D1006, 0x1D1270, 0x1D1296, 0x1D1652, 0x1D16A6, 0x1D16D2,
    0x1D1730, 0x1D17B2, 0x1D1836, 0x1D1852, 0x1D18C6, 0x1D1AA2, 0x1D1AE6, 0x1D1EB0, 0x1D2006, 0x1D2422,
    0x1D2456, 0x1D2460, 0x1D2C04, 0x1D2D40, 0x1D2E04, 0x1D2F40, 0x1D3006, 0x1D3570, 0x1D3604, 0x1D3790,
    0x1D4001, 0x1D4550, 0x1D4561, 0x1D49D0, 0x1D49E1, 0x1D4A00, 0x1D4A21, 0x1D4A30, 0x1D4A51, 0x1D4A70,
    0x1D4A91, 0x1D4AD0, 0x1D4AE1, 0x1D4BA0, 0x1D4BB1, 0x1D4BC0, 0x1D4BD1, 0x1D4C40, 0x1D4C51, 0x1D5060,
    0x1D5071, 0x1D50B0, 0x1D50D1, 0x1D5150, 0x1D5161, 0x1D51D0, 0x1D51E1, 0x1D53A0, 0x1D53B1, 0x1D53F0,
    0x1D5401, 0x1D5450, 0x1D5461, 0x1D5470, 0x1D54A1, 0x1D5510, 0x1D5521, 0x1D6A60, 0x1D6A81, 0x1D6C16,
    0x1D6C21, 0x1D6DB6, 0x1D6DC1, 0x1D6FB6, 0x1D6FC1, 0x1D7156, 0x1D7161, 0x1D7356, 0x1D7361, 0x1D74F6,
    0x1D7501, 0x1D76F6, 0x1D7701, 0x1D7896, 0x1D78A1, 0x1D7A96, 0x1D7AA1, 0x1D7C36, 0x1D7C41, 0x1D7CC0,
    0x1D7CE3, 0x1D8006, 0x1DA002, 0x1DA376, 0x1DA3B2, 0x1DA6D6, 0x1DA752, 0x1DA766, 0x1DA842, 0x1DA856,
    0x1DA875, 0x1DA8C0, 0x1DA9B2, 0x1DAA00, 0x1DAA12, 0x1DAB00, 0x1DF001, 0x1DF1F0, 0x1DF251, 0x1DF2B0,
    0x1E0002, 0x1E0070, 0x1E0082, 0x1E0190, 0x1E01B2, 0x1E0220, 0x1E0232, 0x1E0250, 0x1E0262, 0x1E02B0,
    0x1E0301, 0x1E06E0, 0x1E08F2, 0x1E0900, 0x1E1001, 0x1E12D0, 0x1E1302, 0x1E1371, 0x1E13E0, 0x1E1403,
    0x1E14A0, 0x1E14E1, 0x1E14F6, 0x1E1500, 0x1E2901, 0x1E2AE2, 0x1E2AF0, 0x1E2C01, 0x1E2EC2, 0x1E2F03,
    0x1E2FA0, 0x1E2FF6, 0x1E3000, 0x1E4D01, 0x1E4EC2, 0x1E4F03, 0x1E4FA0, 0x1E7E01, 0x1E7E70, 0x1E7E81,
    0x1E7EC0, 0x1E7ED1, 0x1E7EF0, 0x1E7F01, 0x1E7FF0, 0x1E8001, 0x1E8C50, 0x1E8C74, 0x1E8D02, 0x1E8D70,
    0x1E9001, 0x1E9442, 0x1E94B1, 0x1E94C0, 0x1E9503, 0x1E95A0, 0x1E95E5, 0x1E9600, 0x1EC714, 0x1ECAC6,
    0x1ECAD4, 0x1ECB06, 0x1ECB14, 0x1ECB50, 0x1ED014, 0x1ED2E6, 0x1ED2F4, 0x1ED3E0, 0x1EE001, 0x1EE040,
    0x1EE051, 0x1EE200, 0x1EE211, 0x1EE230, 0x1EE241, 0x1EE250, 0x1EE271, 0x1EE280, 0x1EE291, 0x1EE330,
    0x1EE341, 0x1EE380, 0x1EE391, 0x1EE3A0, 0x1EE3B1, 0x1EE3C0, 0x1EE421, 0x1EE430, 0x1EE471, 0x1EE480,
    0x1EE491, 0x1EE4A0, 0x1EE4B1, 0x1EE4C0, 0x1EE4D1, 0x1EE500, 0x1EE511, 0x1EE530, 0x1EE541, 0x1EE550,
    0x1EE571, 0x1EE580, 0x1EE591, 0x1EE5A0, 0x1EE5B1, 0x1EE5C0, 0x1EE5D1, 0x1EE5E0, 0x1EE5F1, 0x1EE600,
    0x1EE611, 0x1EE630, 0x1EE641, 0x1EE650, 0x1EE671, 0x1EE6B0, 0x1EE6C1, 0x1EE730, 0x1EE741, 0x1EE780,
    0x1EE791, 0x1EE7D0, 0x1EE7E1, 0x1EE7F0, 0x1EE801, 0x1EE8A0, 0x1EE8B1, 0x1EE9C0, 0x1EEA11, 0x1EEA40,
    0x1EEA51, 0x1EEAA0, 0x1EEAB1, 0x1EEBC0, 0x1EEF06, 0x1EEF20, 0x1F0006, 0x1F02C0, 0x1F0306, 0x1F0940,
    0x1F0A06, 0x1F0AF0, 0x1F0B16, 0x1F0C00, 0x1F0C16, 0x1F0D00, 0x1F0D16, 0x1F0F60, 0x1F1004, 0x1F10D6,
    0x1F1AE0, 0x1F1E66, 0x1F2030, 0x1F2106, 0x1F23C0, 0x1F2406, 0x1F2490, 0x1F2506, 0x1F2520, 0x1F2606,
    0x1F2660, 0x1F3006, 0x1F6D80, 0x1F6DC6, 0x1F6ED0, 0x1F6F06, 0x1F6FD0, 0x1F7006, 0x1F7770, 0x1F77B6,
    0x1F7DA0, 0x1F7E06, 0x1F7EC0, 0x1F7F06, 0x1F7F10, 0x1F8006, 0x1F80C0, 0x1F8106, 0x1F8480, 0x1F8506,
    0x1F85A0, 0x1F8606, 0x1F8880, 0x1F8906, 0x1F8AE0, 0x1F8B06, 0x1F8B20, 0x1F9006, 0x1FA540, 0x1FA606,
    0x1FA6E0, 0x1FA706, 0x1FA7D0, 0x1FA806, 0x1FA890, 0x1FA906, 0x1FABE0, 0x1FABF6, 0x1FAC60, 0x1FACE6,
    0x1FADC0, 0x1FAE06, 0x1FAE90, 0x1FAF06, 0x1FAF90, 0x1FB006, 0x1FB930, 0x1FB946, 0x1FBCB0, 0x1FBF03,
    0x1FBFA0, 0x200001, 0x2A6E00, 0x2A7001, 0x2B73A0, 0x2B7401, 0x2B81E0, 0x2B8201, 0x2CEA20, 0x2CEB01,
    0x2EBE10, 0x2F8001, 0x2FA1E0, 0x300001, 0x3134B0, 0x313501, 0x323B00, 0xE01002, 0xE01F00,
};

/* The pre-tokenizers' class of a code point (LLM_UC_*). */
static int llm_uni_class(uint32_t c) {
    if (c < 0x80) { /* most text is ASCII: skip the search */
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return LLM_UC_LETTER;
        if (c >= '0' && c <= '9') return LLM_UC_DIGIT;
        if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return LLM_UC_SPACE;
        if (c < 0x20 || c == 0x7F) return LLM_UC_OTHER;
    }
    /* the last run that starts at or before c */
    int lo = 0, hi = (int)(sizeof llm_uni_runs / sizeof llm_uni_runs[0]) - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (llm_uni_runs[mid] >> 4 <= c) lo = mid;
        else hi = mid - 1;
    }
    return (int)(llm_uni_runs[lo] & 15);
}

#endif /* LLM_IMPLEMENTATION_DONE */
#endif /* LLM_IMPLEMENTATION */
