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
 *         _adds_bos, _is_eog; llm_tokenize_prompt
 *   chat: llm_chat_template_init, llm_chat_render, llm_chat_stop_ids, llm_chat_detect, llm_chat_family_name,
 *         llm_chat_family_from_name
 *   blocks: llm_block_manager_init, llm_block_manager_free, llm_block_alloc, llm_block_release,
 *         llm_block_hash, llm_block_lookup, llm_block_set_hash
 *   forward: llm_cpu_backend_create, llm_cpu_exact_backend_create (and with LLM_CUDA: llm_cuda_backend_create, llm_cuda_run_gemm,
 *         llm_cuda_run_attention)
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
 * more room), or -1 on error. parse_special: text like "<|im_end|>" becomes that control token. */
int  llm_tokenize(const llm_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                  int32_t *out, int cap);
int  llm_tokenizer_n_vocab(const llm_tokenizer *t);
int  llm_tokenizer_bos(const llm_tokenizer *t);                /* -1 when the vocabulary has none */
int  llm_tokenizer_eos(const llm_tokenizer *t);
int  llm_tokenizer_adds_bos(const llm_tokenizer *t);           /* add_bos_token, or the type's default */
int  llm_tokenizer_is_eog(const llm_tokenizer *t, int32_t id); /* end of generation: eos, eot, <|im_end|> */
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
/* The device bytes the backend's weight matrices take: a quantized matrix its file's bytes, a f32/f16/bf16 one
 * 2 bytes a value (rows padded to 8 values); norms and biases not counted */
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
void llm_qblock_scales(uint32_t type, const void *block, llm_qblock *b) {
    const uint8_t *p = (const uint8_t *)block, *sc;
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
enum { LLM_PRE_GPT2, LLM_PRE_LLAMA3, LLM_PRE_QWEN2, LLM_PRE_SMOLLM };
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
};

/* ---- UTF-8, and the classes of characters the pre-tokenizers split by ---------------------------------- */
/* 'L' letter (\p{L}), 'N' number (\p{N}), 'S' white space (\s), 0 anything else: in the appendix, with its
 * table. */
static int llm_uni_class(uint32_t c);

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
/* Each returns the end of the word that starts at character i; n ends the text. They take the alternatives of
 * the regex in its order, as a regex engine would: the first that matches at i wins. cls[] is
 * llm_uni_class. */

/* gpt2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int llm_pretok_gpt2(const uint32_t *cp, const char *cls, int i, int n) {
    if (cp[i] == '\'' && i + 1 < n) {
        uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    /* a run of letters, of digits, or of anything else but space, perhaps after one space */
    int j = i + (cp[i] == ' ' && i + 1 < n && cls[i + 1] != 'S');
    if (cls[j] != 'S') {
        char c = cls[j];
        while (j < n && cls[j] == c) j++;
        return j;
    }
    /* white space: to the end of the text; else up to the last one, which goes with the word after it (one
     * alone stays alone) */
    for (j = i; j < n && cls[j] == 'S'; j++) {}
    return j == n || j - i == 1 ? j : j - 1;
}

static uint32_t llm_ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* llama-bpe (max_digits 3) and qwen2 (max_digits 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+ */
static int llm_pretok_llama3(const uint32_t *cp, const char *cls, int i, int n, int max_digits) {
    if (cp[i] == '\'' && i + 1 < n) {
        uint32_t a = llm_ascii_lower(cp[i + 1]), b = i + 2 < n ? llm_ascii_lower(cp[i + 2]) : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    /* letters, perhaps after one character that is not a letter, digit or line break */
    int j = i + (cls[i] != 'L' && cls[i] != 'N' && cp[i] != '\r' && cp[i] != '\n');
    if (j < n && cls[j] == 'L') {
        while (j < n && cls[j] == 'L') j++;
        return j;
    }
    if (cls[i] == 'N') {
        for (j = i; j < n && j - i < max_digits && cls[j] == 'N'; j++) {}
        return j;
    }
    /* punctuation and symbols, perhaps after a space, with the line breaks right after them */
    j = i + (cp[i] == ' ');
    if (j < n && cls[j] == 0) {
        while (j < n && cls[j] == 0) j++;
        while (j < n && (cp[j] == '\r' || cp[j] == '\n')) j++;
        return j;
    }
    /* white space (all that is left): up to its last line break if it has one, else as gpt2 takes it */
    int last_break = -1;
    for (j = i; j < n && cls[j] == 'S'; j++) if (cp[j] == '\r' || cp[j] == '\n') last_break = j;
    if (last_break >= 0) return last_break + 1;
    return j == n || j - i == 1 ? j : j - 1;
}

/* The end of the word that starts at character i, for pre-tokenizer pre. *run_end is smollm's memory of where
 * the current run between digits ends (start it at 0). */
static int llm_pretok_next(int pre, const uint32_t *cp, const char *cls, int i, int n, int *run_end) {
    if (pre == LLM_PRE_LLAMA3) return llm_pretok_llama3(cp, cls, i, n, 3);
    if (pre == LLM_PRE_QWEN2) return llm_pretok_llama3(cp, cls, i, n, 1);
    if (pre == LLM_PRE_SMOLLM) { /* every digit is a word; the runs between digits split as gpt2 splits */
        if (cls[i] == 'N') return i + 1;
        if (*run_end <= i) for (*run_end = i; *run_end < n && cls[*run_end] != 'N'; ++*run_end) {}
        return llm_pretok_gpt2(cp, cls, i, *run_end);
    }
    return llm_pretok_gpt2(cp, cls, i, n);
}

/* Decodes text[0..len) into code points, their classes and their byte offsets (off has room for one more, the
 * end); returns the number of characters. A broken UTF-8 byte is a character of its own, of no class; it
 * keeps its byte through BPE (llama.cpp would put U+FFFD in its place). */
static int llm_decode_text(const char *text, size_t len, uint32_t *cp, char *cls, int *off) {
    int nc = 0;
    for (size_t i = 0; i < len; nc++) {
        int k = llm_utf8_check((const unsigned char *)text + i, len - i);
        off[nc] = (int)i;
        cp[nc] = k > 0 ? llm_utf8_decode((const unsigned char *)text + i, k) : 0xFFFD;
        cls[nc] = k > 0 ? (char)llm_uni_class(cp[nc]) : 0;
        i += k > 0 ? (size_t)k : 1;
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
    int *off = (int *)malloc((len + 1) * sizeof *off);
    llm_sym *sym = (llm_sym *)malloc(len * sizeof *sym);
    char *buf = (char *)malloc(2 * t->max_len + 1);
    if (cp && cls && off && sym && buf) {
        int nc = llm_decode_text(text, len, cp, cls, off), run_end = 0;
        for (int i = 0, end; i < nc; i = end) {
            end = llm_pretok_next(t->pre, cp, cls, i, nc, &run_end);
            llm_bpe_word(t, text + off[i], off[end] - off[i], sym, buf, o);
        }
    } else o->failed = 1;
    free(cp); free(cls); free(off); free(sym); free(buf);
}

/* ---- Public: tokenize ---------------------------------------------------------------------------------- */
/* The longest special token at s, or -1. */
static int llm_special_at(const llm_tokenizer *t, const char *s, size_t n, size_t *len) {
    for (ptrdiff_t k = 0; k < arrlen(t->special); k++) {
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
    for (size_t i = 0; parse_special && i < len && !o.failed;) {
        size_t n = 0;
        int id = t->special_start[(unsigned char)text[i]] ? llm_special_at(t, text + i, len - i, &n) : -1;
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
    int kind, pre_kind = LLM_PRE_GPT2;
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
        if (!pre.ptr || llm_str_eq(pre, "default") || llm_str_eq(pre, "gpt2") || llm_str_eq(pre, "gpt-2"))
            pre_kind = LLM_PRE_GPT2;
        else if (llm_str_eq(pre, "llama-bpe") || llm_str_eq(pre, "llama3") || llm_str_eq(pre, "llama-v3"))
            pre_kind = LLM_PRE_LLAMA3;
        else if (llm_str_eq(pre, "qwen2")) pre_kind = LLM_PRE_QWEN2;
        else if (llm_str_eq(pre, "smollm")) pre_kind = LLM_PRE_SMOLLM;
        else {
            /* a wrong split gives wrong ids without a word of warning: refuse instead */
            llm_fail(err, "unsupported tokenizer.ggml.pre '%.*s' (supported: default, gpt2, llama-bpe, "
                     "qwen2, smollm)",
                     (int)pre.len, pre.ptr);
            return NULL;
        }
    }

    llm_tokenizer *t = (llm_tokenizer *)calloc(1, sizeof *t);
    if (!t) { llm_fail(err, "out of memory loading the tokenizer"); return NULL; }
    t->kind = kind; t->pre = pre_kind; t->n_vocab = (int)n; t->text = tokens->strs;
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
        /* llama-bpe takes a word that is a token whole (llama.cpp's ignore_merges) */
        t->ignore_merges = pre_kind == LLM_PRE_LLAMA3;
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
    /* BOS by default for SentencePiece and, as llama.cpp does, for llama-bpe; the file's key overrides */
    t->add_bos = llm_gguf_int(g, "tokenizer.ggml.add_bos_token", spm || pre_kind == LLM_PRE_LLAMA3) != 0;
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

int llm_tokenize_prompt(const llm_tokenizer *t, const char *text, size_t len, int32_t *out, int cap) {
    if (!t || (!text && len)) return -1;
    size_t n = 0;
    int first = len && t->special_start[(unsigned char)text[0]] ? llm_special_at(t, text, len, &n) : -1;
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
    int16_t sum[2];     /* q[0..15] and q[16..31] added up: the weights' minimums and offsets meet these */
    int8_t q[32];
} llm_q8;

static void llm_q8_quantize(const float *x, llm_q8 *out, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127, inv = d > 0 ? 1 / d : 0;
        out[b].d = d;
        for (int h = 0; h < 2; h++) {
            int sum = 0;
            for (int j = h * 16; j < h * 16 + 16; j++) sum += out[b].q[j] = (int8_t)lrintf(x[j] * inv);
            out[b].sum[h] = (int16_t)sum;
        }
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
    case LLM_Q5_0: memcpy(&qh, p + 2, 4); return _mm256_or_si256(llm_avx2_nibbles(p + 6), llm_avx2_bits(qh, 16));
    case LLM_Q5_1: memcpy(&qh, p + 4, 4); return _mm256_or_si256(llm_avx2_nibbles(p + 8), llm_avx2_bits(qh, 16));
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

static inline __attribute__((always_inline)) float llm_q8_dot_avx2(uint32_t type, const void *row,
                                                                   const llm_q8 *x, int64_t n) {
    uint64_t block_bytes, block_values;
    llm_dtype_info(type, &block_bytes, &block_values);
    const int sub = type == LLM_Q2_K || type == LLM_Q3_K || type == LLM_Q6_K ? 16 : 32;
    const uint8_t *p = (const uint8_t *)row;
    __m256 acc = _mm256_setzero_ps();
    float rest = 0; /* the offsets and minimums */
    llm_qblock b;
    for (int64_t at = 0; at < n; at += (int64_t)block_values, p += block_bytes) {
        if (block_values == 32) { /* inline, as a call per 32 values would cost as much as the products */
            b.d = _cvtsh_ss(*(const uint16_t *)p);
            b.dmin = type == LLM_Q4_1 || type == LLM_Q5_1 ? _cvtsh_ss(*(const uint16_t *)(p + 2)) : 0;
            b.offset = type == LLM_Q4_0 ? 8 : type == LLM_Q5_0 ? 16 : 0;
            b.scale[0] = 1; b.min[0] = b.dmin != 0 ? -1 : 0;
        } else llm_qblock_scales(type, p, &b);
        for (int g = 0; g < (int)block_values / 32; g++, x++) {
            __m256i w = llm_avx2_group(type, p, g), xq = _mm256_loadu_si256((const __m256i *)x->q), pairs;
            if (type == LLM_Q8_0) /* signed weights: |w| times x with w's sign */
                pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w));
            else pairs = _mm256_maddubs_epi16(w, xq);
            int s0 = g * 32 / sub, s1 = (g * 32 + 16) / sub;
            __m256i scales = sub == 32 ? _mm256_set1_epi16(b.scale[s0])
                                       : _mm256_set_m128i(_mm_set1_epi16(b.scale[s1]), _mm_set1_epi16(b.scale[s0]));
            __m256i scaled = _mm256_madd_epi16(pairs, scales);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled), _mm256_set1_ps(x->d * b.d), acc);
            if (type == LLM_Q8_0) continue;
            int offsets = b.offset * (b.scale[s0] * x->sum[0] + b.scale[s1] * x->sum[1]);
            int mins = b.min[s0] * x->sum[0] + b.min[s1] * x->sum[1];
            rest -= x->d * (b.d * (float)offsets + b.dmin * (float)mins);
        }
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s) + rest;
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
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float r = _mm_cvtss_f32(s);
    for (; i < n; i++) r += (type == LLM_F16 ? llm_f16_to_f32(w[i]) : llm_bf16_to_f32(w[i])) * x[i];
    return r;
}
#endif

/* The fast path's dot product of one weight row: SIMD when the build has it, else the plain-C reference */
static float llm_q8_dot(uint32_t type, const void *row, const llm_q8 *x, int64_t n) {
#ifdef LLM_CPU_SIMD
    switch (type) { /* each call specializes the inlined loop to its type */
    case LLM_Q8_0: return llm_q8_dot_avx2(LLM_Q8_0, row, x, n);
    case LLM_Q4_0: return llm_q8_dot_avx2(LLM_Q4_0, row, x, n);
    case LLM_Q4_1: return llm_q8_dot_avx2(LLM_Q4_1, row, x, n);
    case LLM_Q5_0: return llm_q8_dot_avx2(LLM_Q5_0, row, x, n);
    case LLM_Q5_1: return llm_q8_dot_avx2(LLM_Q5_1, row, x, n);
    case LLM_Q2_K: return llm_q8_dot_avx2(LLM_Q2_K, row, x, n);
    case LLM_Q3_K: return llm_q8_dot_avx2(LLM_Q3_K, row, x, n);
    case LLM_Q4_K: return llm_q8_dot_avx2(LLM_Q4_K, row, x, n);
    case LLM_Q5_K: return llm_q8_dot_avx2(LLM_Q5_K, row, x, n);
    case LLM_Q6_K: return llm_q8_dot_avx2(LLM_Q6_K, row, x, n);
    }
#endif
    return llm_q8_dot_ref(type, row, x, n);
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
            int64_t r0 = tile * LLM_MATMUL_TILE, r1 = r0 + LLM_MATMUL_TILE < rows ? r0 + LLM_MATMUL_TILE : rows;
            const uint8_t *tile_data = (const uint8_t *)w->data + (size_t)r0 * row_bytes;
            if (kind == LLM_ROWS_CONVERT) {
                if (!converted) continue;
                for (int64_t r = r0; r < r1; r++)
                    llm_dtype_dequant_row(w->type, tile_data + (size_t)(r - r0) * row_bytes,
                                          converted + (size_t)(r - r0) * cols, cols);
            }
            for (int t = 0; t < T; t++) {
                const float *xt = x + (size_t)t * cols;
                for (int64_t r = r0; r < r1; r++) {
                    const void *row = tile_data + (size_t)(r - r0) * row_bytes;
                    float v;
                    switch (kind) {
                    case LLM_ROWS_F32: v = llm_dot((const float *)row, xt, cols); break;
                    case LLM_ROWS_Q8: v = llm_q8_dot(w->type, row, xq + (size_t)t * (cols / 32), cols); break;
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
llm_backend *llm_cpu_exact_backend_create(const llm_model *m, char *err) { return llm_cpu_backend_new(m, 1, err); }

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
typedef struct { uint32_t lo, hi; char cls; } llm_uni_range;

/* Generated by `python3 tools/gen_unicode.py` from UnicodeData.txt (Unicode 15.0.0): to change it, run that
 * again. */
static const llm_uni_range llm_uni_ranges[806] = {
    {0x9,0xD,'S'}, {0x20,0x20,'S'}, {0x30,0x39,'N'}, {0x41,0x5A,'L'}, {0x61,0x7A,'L'}, {0x85,0x85,'S'},
    {0xA0,0xA0,'S'}, {0xAA,0xAA,'L'}, {0xB2,0xB3,'N'}, {0xB5,0xB5,'L'}, {0xB9,0xB9,'N'}, {0xBA,0xBA,'L'},
    {0xBC,0xBE,'N'}, {0xC0,0xD6,'L'}, {0xD8,0xF6,'L'}, {0xF8,0x2C1,'L'}, {0x2C6,0x2D1,'L'}, {0x2E0,0x2E4,'L'},
    {0x2EC,0x2EC,'L'}, {0x2EE,0x2EE,'L'}, {0x370,0x374,'L'}, {0x376,0x377,'L'}, {0x37A,0x37D,'L'},
    {0x37F,0x37F,'L'}, {0x386,0x386,'L'}, {0x388,0x38A,'L'}, {0x38C,0x38C,'L'}, {0x38E,0x3A1,'L'},
    {0x3A3,0x3F5,'L'}, {0x3F7,0x481,'L'}, {0x48A,0x52F,'L'}, {0x531,0x556,'L'}, {0x559,0x559,'L'},
    {0x560,0x588,'L'}, {0x5D0,0x5EA,'L'}, {0x5EF,0x5F2,'L'}, {0x620,0x64A,'L'}, {0x660,0x669,'N'},
    {0x66E,0x66F,'L'}, {0x671,0x6D3,'L'}, {0x6D5,0x6D5,'L'}, {0x6E5,0x6E6,'L'}, {0x6EE,0x6EF,'L'},
    {0x6F0,0x6F9,'N'}, {0x6FA,0x6FC,'L'}, {0x6FF,0x6FF,'L'}, {0x710,0x710,'L'}, {0x712,0x72F,'L'},
    {0x74D,0x7A5,'L'}, {0x7B1,0x7B1,'L'}, {0x7C0,0x7C9,'N'}, {0x7CA,0x7EA,'L'}, {0x7F4,0x7F5,'L'},
    {0x7FA,0x7FA,'L'}, {0x800,0x815,'L'}, {0x81A,0x81A,'L'}, {0x824,0x824,'L'}, {0x828,0x828,'L'},
    {0x840,0x858,'L'}, {0x860,0x86A,'L'}, {0x870,0x887,'L'}, {0x889,0x88E,'L'}, {0x8A0,0x8C9,'L'},
    {0x904,0x939,'L'}, {0x93D,0x93D,'L'}, {0x950,0x950,'L'}, {0x958,0x961,'L'}, {0x966,0x96F,'N'},
    {0x971,0x980,'L'}, {0x985,0x98C,'L'}, {0x98F,0x990,'L'}, {0x993,0x9A8,'L'}, {0x9AA,0x9B0,'L'},
    {0x9B2,0x9B2,'L'}, {0x9B6,0x9B9,'L'}, {0x9BD,0x9BD,'L'}, {0x9CE,0x9CE,'L'}, {0x9DC,0x9DD,'L'},
    {0x9DF,0x9E1,'L'}, {0x9E6,0x9EF,'N'}, {0x9F0,0x9F1,'L'}, {0x9F4,0x9F9,'N'}, {0x9FC,0x9FC,'L'},
    {0xA05,0xA0A,'L'}, {0xA0F,0xA10,'L'}, {0xA13,0xA28,'L'}, {0xA2A,0xA30,'L'}, {0xA32,0xA33,'L'},
    {0xA35,0xA36,'L'}, {0xA38,0xA39,'L'}, {0xA59,0xA5C,'L'}, {0xA5E,0xA5E,'L'}, {0xA66,0xA6F,'N'},
    {0xA72,0xA74,'L'}, {0xA85,0xA8D,'L'}, {0xA8F,0xA91,'L'}, {0xA93,0xAA8,'L'}, {0xAAA,0xAB0,'L'},
    {0xAB2,0xAB3,'L'}, {0xAB5,0xAB9,'L'}, {0xABD,0xABD,'L'}, {0xAD0,0xAD0,'L'}, {0xAE0,0xAE1,'L'},
    {0xAE6,0xAEF,'N'}, {0xAF9,0xAF9,'L'}, {0xB05,0xB0C,'L'}, {0xB0F,0xB10,'L'}, {0xB13,0xB28,'L'},
    {0xB2A,0xB30,'L'}, {0xB32,0xB33,'L'}, {0xB35,0xB39,'L'}, {0xB3D,0xB3D,'L'}, {0xB5C,0xB5D,'L'},
    {0xB5F,0xB61,'L'}, {0xB66,0xB6F,'N'}, {0xB71,0xB71,'L'}, {0xB72,0xB77,'N'}, {0xB83,0xB83,'L'},
    {0xB85,0xB8A,'L'}, {0xB8E,0xB90,'L'}, {0xB92,0xB95,'L'}, {0xB99,0xB9A,'L'}, {0xB9C,0xB9C,'L'},
    {0xB9E,0xB9F,'L'}, {0xBA3,0xBA4,'L'}, {0xBA8,0xBAA,'L'}, {0xBAE,0xBB9,'L'}, {0xBD0,0xBD0,'L'},
    {0xBE6,0xBF2,'N'}, {0xC05,0xC0C,'L'}, {0xC0E,0xC10,'L'}, {0xC12,0xC28,'L'}, {0xC2A,0xC39,'L'},
    {0xC3D,0xC3D,'L'}, {0xC58,0xC5A,'L'}, {0xC5D,0xC5D,'L'}, {0xC60,0xC61,'L'}, {0xC66,0xC6F,'N'},
    {0xC78,0xC7E,'N'}, {0xC80,0xC80,'L'}, {0xC85,0xC8C,'L'}, {0xC8E,0xC90,'L'}, {0xC92,0xCA8,'L'},
    {0xCAA,0xCB3,'L'}, {0xCB5,0xCB9,'L'}, {0xCBD,0xCBD,'L'}, {0xCDD,0xCDE,'L'}, {0xCE0,0xCE1,'L'},
    {0xCE6,0xCEF,'N'}, {0xCF1,0xCF2,'L'}, {0xD04,0xD0C,'L'}, {0xD0E,0xD10,'L'}, {0xD12,0xD3A,'L'},
    {0xD3D,0xD3D,'L'}, {0xD4E,0xD4E,'L'}, {0xD54,0xD56,'L'}, {0xD58,0xD5E,'N'}, {0xD5F,0xD61,'L'},
    {0xD66,0xD78,'N'}, {0xD7A,0xD7F,'L'}, {0xD85,0xD96,'L'}, {0xD9A,0xDB1,'L'}, {0xDB3,0xDBB,'L'},
    {0xDBD,0xDBD,'L'}, {0xDC0,0xDC6,'L'}, {0xDE6,0xDEF,'N'}, {0xE01,0xE30,'L'}, {0xE32,0xE33,'L'},
    {0xE40,0xE46,'L'}, {0xE50,0xE59,'N'}, {0xE81,0xE82,'L'}, {0xE84,0xE84,'L'}, {0xE86,0xE8A,'L'},
    {0xE8C,0xEA3,'L'}, {0xEA5,0xEA5,'L'}, {0xEA7,0xEB0,'L'}, {0xEB2,0xEB3,'L'}, {0xEBD,0xEBD,'L'},
    {0xEC0,0xEC4,'L'}, {0xEC6,0xEC6,'L'}, {0xED0,0xED9,'N'}, {0xEDC,0xEDF,'L'}, {0xF00,0xF00,'L'},
    {0xF20,0xF33,'N'}, {0xF40,0xF47,'L'}, {0xF49,0xF6C,'L'}, {0xF88,0xF8C,'L'}, {0x1000,0x102A,'L'},
    {0x103F,0x103F,'L'}, {0x1040,0x1049,'N'}, {0x1050,0x1055,'L'}, {0x105A,0x105D,'L'}, {0x1061,0x1061,'L'},
    {0x1065,0x1066,'L'}, {0x106E,0x1070,'L'}, {0x1075,0x1081,'L'}, {0x108E,0x108E,'L'}, {0x1090,0x1099,'N'},
    {0x10A0,0x10C5,'L'}, {0x10C7,0x10C7,'L'}, {0x10CD,0x10CD,'L'}, {0x10D0,0x10FA,'L'}, {0x10FC,0x1248,'L'},
    {0x124A,0x124D,'L'}, {0x1250,0x1256,'L'}, {0x1258,0x1258,'L'}, {0x125A,0x125D,'L'}, {0x1260,0x1288,'L'},
    {0x128A,0x128D,'L'}, {0x1290,0x12B0,'L'}, {0x12B2,0x12B5,'L'}, {0x12B8,0x12BE,'L'}, {0x12C0,0x12C0,'L'},
    {0x12C2,0x12C5,'L'}, {0x12C8,0x12D6,'L'}, {0x12D8,0x1310,'L'}, {0x1312,0x1315,'L'}, {0x1318,0x135A,'L'},
    {0x1369,0x137C,'N'}, {0x1380,0x138F,'L'}, {0x13A0,0x13F5,'L'}, {0x13F8,0x13FD,'L'}, {0x1401,0x166C,'L'},
    {0x166F,0x167F,'L'}, {0x1680,0x1680,'S'}, {0x1681,0x169A,'L'}, {0x16A0,0x16EA,'L'}, {0x16EE,0x16F0,'N'},
    {0x16F1,0x16F8,'L'}, {0x1700,0x1711,'L'}, {0x171F,0x1731,'L'}, {0x1740,0x1751,'L'}, {0x1760,0x176C,'L'},
    {0x176E,0x1770,'L'}, {0x1780,0x17B3,'L'}, {0x17D7,0x17D7,'L'}, {0x17DC,0x17DC,'L'}, {0x17E0,0x17E9,'N'},
    {0x17F0,0x17F9,'N'}, {0x1810,0x1819,'N'}, {0x1820,0x1878,'L'}, {0x1880,0x1884,'L'}, {0x1887,0x18A8,'L'},
    {0x18AA,0x18AA,'L'}, {0x18B0,0x18F5,'L'}, {0x1900,0x191E,'L'}, {0x1946,0x194F,'N'}, {0x1950,0x196D,'L'},
    {0x1970,0x1974,'L'}, {0x1980,0x19AB,'L'}, {0x19B0,0x19C9,'L'}, {0x19D0,0x19DA,'N'}, {0x1A00,0x1A16,'L'},
    {0x1A20,0x1A54,'L'}, {0x1A80,0x1A89,'N'}, {0x1A90,0x1A99,'N'}, {0x1AA7,0x1AA7,'L'}, {0x1B05,0x1B33,'L'},
    {0x1B45,0x1B4C,'L'}, {0x1B50,0x1B59,'N'}, {0x1B83,0x1BA0,'L'}, {0x1BAE,0x1BAF,'L'}, {0x1BB0,0x1BB9,'N'},
    {0x1BBA,0x1BE5,'L'}, {0x1C00,0x1C23,'L'}, {0x1C40,0x1C49,'N'}, {0x1C4D,0x1C4F,'L'}, {0x1C50,0x1C59,'N'},
    {0x1C5A,0x1C7D,'L'}, {0x1C80,0x1C88,'L'}, {0x1C90,0x1CBA,'L'}, {0x1CBD,0x1CBF,'L'}, {0x1CE9,0x1CEC,'L'},
    {0x1CEE,0x1CF3,'L'}, {0x1CF5,0x1CF6,'L'}, {0x1CFA,0x1CFA,'L'}, {0x1D00,0x1DBF,'L'}, {0x1E00,0x1F15,'L'},
    {0x1F18,0x1F1D,'L'}, {0x1F20,0x1F45,'L'}, {0x1F48,0x1F4D,'L'}, {0x1F50,0x1F57,'L'}, {0x1F59,0x1F59,'L'},
    {0x1F5B,0x1F5B,'L'}, {0x1F5D,0x1F5D,'L'}, {0x1F5F,0x1F7D,'L'}, {0x1F80,0x1FB4,'L'}, {0x1FB6,0x1FBC,'L'},
    {0x1FBE,0x1FBE,'L'}, {0x1FC2,0x1FC4,'L'}, {0x1FC6,0x1FCC,'L'}, {0x1FD0,0x1FD3,'L'}, {0x1FD6,0x1FDB,'L'},
    {0x1FE0,0x1FEC,'L'}, {0x1FF2,0x1FF4,'L'}, {0x1FF6,0x1FFC,'L'}, {0x2000,0x200A,'S'}, {0x2028,0x2029,'S'},
    {0x202F,0x202F,'S'}, {0x205F,0x205F,'S'}, {0x2070,0x2070,'N'}, {0x2071,0x2071,'L'}, {0x2074,0x2079,'N'},
    {0x207F,0x207F,'L'}, {0x2080,0x2089,'N'}, {0x2090,0x209C,'L'}, {0x2102,0x2102,'L'}, {0x2107,0x2107,'L'},
    {0x210A,0x2113,'L'}, {0x2115,0x2115,'L'}, {0x2119,0x211D,'L'}, {0x2124,0x2124,'L'}, {0x2126,0x2126,'L'},
    {0x2128,0x2128,'L'}, {0x212A,0x212D,'L'}, {0x212F,0x2139,'L'}, {0x213C,0x213F,'L'}, {0x2145,0x2149,'L'},
    {0x214E,0x214E,'L'}, {0x2150,0x2182,'N'}, {0x2183,0x2184,'L'}, {0x2185,0x2189,'N'}, {0x2460,0x249B,'N'},
    {0x24EA,0x24FF,'N'}, {0x2776,0x2793,'N'}, {0x2C00,0x2CE4,'L'}, {0x2CEB,0x2CEE,'L'}, {0x2CF2,0x2CF3,'L'},
    {0x2CFD,0x2CFD,'N'}, {0x2D00,0x2D25,'L'}, {0x2D27,0x2D27,'L'}, {0x2D2D,0x2D2D,'L'}, {0x2D30,0x2D67,'L'},
    {0x2D6F,0x2D6F,'L'}, {0x2D80,0x2D96,'L'}, {0x2DA0,0x2DA6,'L'}, {0x2DA8,0x2DAE,'L'}, {0x2DB0,0x2DB6,'L'},
    {0x2DB8,0x2DBE,'L'}, {0x2DC0,0x2DC6,'L'}, {0x2DC8,0x2DCE,'L'}, {0x2DD0,0x2DD6,'L'}, {0x2DD8,0x2DDE,'L'},
    {0x2E2F,0x2E2F,'L'}, {0x3000,0x3000,'S'}, {0x3005,0x3006,'L'}, {0x3007,0x3007,'N'}, {0x3021,0x3029,'N'},
    {0x3031,0x3035,'L'}, {0x3038,0x303A,'N'}, {0x303B,0x303C,'L'}, {0x3041,0x3096,'L'}, {0x309D,0x309F,'L'},
    {0x30A1,0x30FA,'L'}, {0x30FC,0x30FF,'L'}, {0x3105,0x312F,'L'}, {0x3131,0x318E,'L'}, {0x3192,0x3195,'N'},
    {0x31A0,0x31BF,'L'}, {0x31F0,0x31FF,'L'}, {0x3220,0x3229,'N'}, {0x3248,0x324F,'N'}, {0x3251,0x325F,'N'},
    {0x3280,0x3289,'N'}, {0x32B1,0x32BF,'N'}, {0x3400,0x4DBF,'L'}, {0x4E00,0xA48C,'L'}, {0xA4D0,0xA4FD,'L'},
    {0xA500,0xA60C,'L'}, {0xA610,0xA61F,'L'}, {0xA620,0xA629,'N'}, {0xA62A,0xA62B,'L'}, {0xA640,0xA66E,'L'},
    {0xA67F,0xA69D,'L'}, {0xA6A0,0xA6E5,'L'}, {0xA6E6,0xA6EF,'N'}, {0xA717,0xA71F,'L'}, {0xA722,0xA788,'L'},
    {0xA78B,0xA7CA,'L'}, {0xA7D0,0xA7D1,'L'}, {0xA7D3,0xA7D3,'L'}, {0xA7D5,0xA7D9,'L'}, {0xA7F2,0xA801,'L'},
    {0xA803,0xA805,'L'}, {0xA807,0xA80A,'L'}, {0xA80C,0xA822,'L'}, {0xA830,0xA835,'N'}, {0xA840,0xA873,'L'},
    {0xA882,0xA8B3,'L'}, {0xA8D0,0xA8D9,'N'}, {0xA8F2,0xA8F7,'L'}, {0xA8FB,0xA8FB,'L'}, {0xA8FD,0xA8FE,'L'},
    {0xA900,0xA909,'N'}, {0xA90A,0xA925,'L'}, {0xA930,0xA946,'L'}, {0xA960,0xA97C,'L'}, {0xA984,0xA9B2,'L'},
    {0xA9CF,0xA9CF,'L'}, {0xA9D0,0xA9D9,'N'}, {0xA9E0,0xA9E4,'L'}, {0xA9E6,0xA9EF,'L'}, {0xA9F0,0xA9F9,'N'},
    {0xA9FA,0xA9FE,'L'}, {0xAA00,0xAA28,'L'}, {0xAA40,0xAA42,'L'}, {0xAA44,0xAA4B,'L'}, {0xAA50,0xAA59,'N'},
    {0xAA60,0xAA76,'L'}, {0xAA7A,0xAA7A,'L'}, {0xAA7E,0xAAAF,'L'}, {0xAAB1,0xAAB1,'L'}, {0xAAB5,0xAAB6,'L'},
    {0xAAB9,0xAABD,'L'}, {0xAAC0,0xAAC0,'L'}, {0xAAC2,0xAAC2,'L'}, {0xAADB,0xAADD,'L'}, {0xAAE0,0xAAEA,'L'},
    {0xAAF2,0xAAF4,'L'}, {0xAB01,0xAB06,'L'}, {0xAB09,0xAB0E,'L'}, {0xAB11,0xAB16,'L'}, {0xAB20,0xAB26,'L'},
    {0xAB28,0xAB2E,'L'}, {0xAB30,0xAB5A,'L'}, {0xAB5C,0xAB69,'L'}, {0xAB70,0xABE2,'L'}, {0xABF0,0xABF9,'N'},
    {0xAC00,0xD7A3,'L'}, {0xD7B0,0xD7C6,'L'}, {0xD7CB,0xD7FB,'L'}, {0xF900,0xFA6D,'L'}, {0xFA70,0xFAD9,'L'},
    {0xFB00,0xFB06,'L'}, {0xFB13,0xFB17,'L'}, {0xFB1D,0xFB1D,'L'}, {0xFB1F,0xFB28,'L'}, {0xFB2A,0xFB36,'L'},
    {0xFB38,0xFB3C,'L'}, {0xFB3E,0xFB3E,'L'}, {0xFB40,0xFB41,'L'}, {0xFB43,0xFB44,'L'}, {0xFB46,0xFBB1,'L'},
    {0xFBD3,0xFD3D,'L'}, {0xFD50,0xFD8F,'L'}, {0xFD92,0xFDC7,'L'}, {0xFDF0,0xFDFB,'L'}, {0xFE70,0xFE74,'L'},
    {0xFE76,0xFEFC,'L'}, {0xFF10,0xFF19,'N'}, {0xFF21,0xFF3A,'L'}, {0xFF41,0xFF5A,'L'}, {0xFF66,0xFFBE,'L'},
    {0xFFC2,0xFFC7,'L'}, {0xFFCA,0xFFCF,'L'}, {0xFFD2,0xFFD7,'L'}, {0xFFDA,0xFFDC,'L'}, {0x10000,0x1000B,'L'},
    {0x1000D,0x10026,'L'}, {0x10028,0x1003A,'L'}, {0x1003C,0x1003D,'L'}, {0x1003F,0x1004D,'L'},
    {0x10050,0x1005D,'L'}, {0x10080,0x100FA,'L'}, {0x10107,0x10133,'N'}, {0x10140,0x10178,'N'},
    {0x1018A,0x1018B,'N'}, {0x10280,0x1029C,'L'}, {0x102A0,0x102D0,'L'}, {0x102E1,0x102FB,'N'},
    {0x10300,0x1031F,'L'}, {0x10320,0x10323,'N'}, {0x1032D,0x10340,'L'}, {0x10341,0x10341,'N'},
    {0x10342,0x10349,'L'}, {0x1034A,0x1034A,'N'}, {0x10350,0x10375,'L'}, {0x10380,0x1039D,'L'},
    {0x103A0,0x103C3,'L'}, {0x103C8,0x103CF,'L'}, {0x103D1,0x103D5,'N'}, {0x10400,0x1049D,'L'},
    {0x104A0,0x104A9,'N'}, {0x104B0,0x104D3,'L'}, {0x104D8,0x104FB,'L'}, {0x10500,0x10527,'L'},
    {0x10530,0x10563,'L'}, {0x10570,0x1057A,'L'}, {0x1057C,0x1058A,'L'}, {0x1058C,0x10592,'L'},
    {0x10594,0x10595,'L'}, {0x10597,0x105A1,'L'}, {0x105A3,0x105B1,'L'}, {0x105B3,0x105B9,'L'},
    {0x105BB,0x105BC,'L'}, {0x10600,0x10736,'L'}, {0x10740,0x10755,'L'}, {0x10760,0x10767,'L'},
    {0x10780,0x10785,'L'}, {0x10787,0x107B0,'L'}, {0x107B2,0x107BA,'L'}, {0x10800,0x10805,'L'},
    {0x10808,0x10808,'L'}, {0x1080A,0x10835,'L'}, {0x10837,0x10838,'L'}, {0x1083C,0x1083C,'L'},
    {0x1083F,0x10855,'L'}, {0x10858,0x1085F,'N'}, {0x10860,0x10876,'L'}, {0x10879,0x1087F,'N'},
    {0x10880,0x1089E,'L'}, {0x108A7,0x108AF,'N'}, {0x108E0,0x108F2,'L'}, {0x108F4,0x108F5,'L'},
    {0x108FB,0x108FF,'N'}, {0x10900,0x10915,'L'}, {0x10916,0x1091B,'N'}, {0x10920,0x10939,'L'},
    {0x10980,0x109B7,'L'}, {0x109BC,0x109BD,'N'}, {0x109BE,0x109BF,'L'}, {0x109C0,0x109CF,'N'},
    {0x109D2,0x109FF,'N'}, {0x10A00,0x10A00,'L'}, {0x10A10,0x10A13,'L'}, {0x10A15,0x10A17,'L'},
    {0x10A19,0x10A35,'L'}, {0x10A40,0x10A48,'N'}, {0x10A60,0x10A7C,'L'}, {0x10A7D,0x10A7E,'N'},
    {0x10A80,0x10A9C,'L'}, {0x10A9D,0x10A9F,'N'}, {0x10AC0,0x10AC7,'L'}, {0x10AC9,0x10AE4,'L'},
    {0x10AEB,0x10AEF,'N'}, {0x10B00,0x10B35,'L'}, {0x10B40,0x10B55,'L'}, {0x10B58,0x10B5F,'N'},
    {0x10B60,0x10B72,'L'}, {0x10B78,0x10B7F,'N'}, {0x10B80,0x10B91,'L'}, {0x10BA9,0x10BAF,'N'},
    {0x10C00,0x10C48,'L'}, {0x10C80,0x10CB2,'L'}, {0x10CC0,0x10CF2,'L'}, {0x10CFA,0x10CFF,'N'},
    {0x10D00,0x10D23,'L'}, {0x10D30,0x10D39,'N'}, {0x10E60,0x10E7E,'N'}, {0x10E80,0x10EA9,'L'},
    {0x10EB0,0x10EB1,'L'}, {0x10F00,0x10F1C,'L'}, {0x10F1D,0x10F26,'N'}, {0x10F27,0x10F27,'L'},
    {0x10F30,0x10F45,'L'}, {0x10F51,0x10F54,'N'}, {0x10F70,0x10F81,'L'}, {0x10FB0,0x10FC4,'L'},
    {0x10FC5,0x10FCB,'N'}, {0x10FE0,0x10FF6,'L'}, {0x11003,0x11037,'L'}, {0x11052,0x1106F,'N'},
    {0x11071,0x11072,'L'}, {0x11075,0x11075,'L'}, {0x11083,0x110AF,'L'}, {0x110D0,0x110E8,'L'},
    {0x110F0,0x110F9,'N'}, {0x11103,0x11126,'L'}, {0x11136,0x1113F,'N'}, {0x11144,0x11144,'L'},
    {0x11147,0x11147,'L'}, {0x11150,0x11172,'L'}, {0x11176,0x11176,'L'}, {0x11183,0x111B2,'L'},
    {0x111C1,0x111C4,'L'}, {0x111D0,0x111D9,'N'}, {0x111DA,0x111DA,'L'}, {0x111DC,0x111DC,'L'},
    {0x111E1,0x111F4,'N'}, {0x11200,0x11211,'L'}, {0x11213,0x1122B,'L'}, {0x1123F,0x11240,'L'},
    {0x11280,0x11286,'L'}, {0x11288,0x11288,'L'}, {0x1128A,0x1128D,'L'}, {0x1128F,0x1129D,'L'},
    {0x1129F,0x112A8,'L'}, {0x112B0,0x112DE,'L'}, {0x112F0,0x112F9,'N'}, {0x11305,0x1130C,'L'},
    {0x1130F,0x11310,'L'}, {0x11313,0x11328,'L'}, {0x1132A,0x11330,'L'}, {0x11332,0x11333,'L'},
    {0x11335,0x11339,'L'}, {0x1133D,0x1133D,'L'}, {0x11350,0x11350,'L'}, {0x1135D,0x11361,'L'},
    {0x11400,0x11434,'L'}, {0x11447,0x1144A,'L'}, {0x11450,0x11459,'N'}, {0x1145F,0x11461,'L'},
    {0x11480,0x114AF,'L'}, {0x114C4,0x114C5,'L'}, {0x114C7,0x114C7,'L'}, {0x114D0,0x114D9,'N'},
    {0x11580,0x115AE,'L'}, {0x115D8,0x115DB,'L'}, {0x11600,0x1162F,'L'}, {0x11644,0x11644,'L'},
    {0x11650,0x11659,'N'}, {0x11680,0x116AA,'L'}, {0x116B8,0x116B8,'L'}, {0x116C0,0x116C9,'N'},
    {0x11700,0x1171A,'L'}, {0x11730,0x1173B,'N'}, {0x11740,0x11746,'L'}, {0x11800,0x1182B,'L'},
    {0x118A0,0x118DF,'L'}, {0x118E0,0x118F2,'N'}, {0x118FF,0x11906,'L'}, {0x11909,0x11909,'L'},
    {0x1190C,0x11913,'L'}, {0x11915,0x11916,'L'}, {0x11918,0x1192F,'L'}, {0x1193F,0x1193F,'L'},
    {0x11941,0x11941,'L'}, {0x11950,0x11959,'N'}, {0x119A0,0x119A7,'L'}, {0x119AA,0x119D0,'L'},
    {0x119E1,0x119E1,'L'}, {0x119E3,0x119E3,'L'}, {0x11A00,0x11A00,'L'}, {0x11A0B,0x11A32,'L'},
    {0x11A3A,0x11A3A,'L'}, {0x11A50,0x11A50,'L'}, {0x11A5C,0x11A89,'L'}, {0x11A9D,0x11A9D,'L'},
    {0x11AB0,0x11AF8,'L'}, {0x11C00,0x11C08,'L'}, {0x11C0A,0x11C2E,'L'}, {0x11C40,0x11C40,'L'},
    {0x11C50,0x11C6C,'N'}, {0x11C72,0x11C8F,'L'}, {0x11D00,0x11D06,'L'}, {0x11D08,0x11D09,'L'},
    {0x11D0B,0x11D30,'L'}, {0x11D46,0x11D46,'L'}, {0x11D50,0x11D59,'N'}, {0x11D60,0x11D65,'L'},
    {0x11D67,0x11D68,'L'}, {0x11D6A,0x11D89,'L'}, {0x11D98,0x11D98,'L'}, {0x11DA0,0x11DA9,'N'},
    {0x11EE0,0x11EF2,'L'}, {0x11F02,0x11F02,'L'}, {0x11F04,0x11F10,'L'}, {0x11F12,0x11F33,'L'},
    {0x11F50,0x11F59,'N'}, {0x11FB0,0x11FB0,'L'}, {0x11FC0,0x11FD4,'N'}, {0x12000,0x12399,'L'},
    {0x12400,0x1246E,'N'}, {0x12480,0x12543,'L'}, {0x12F90,0x12FF0,'L'}, {0x13000,0x1342F,'L'},
    {0x13441,0x13446,'L'}, {0x14400,0x14646,'L'}, {0x16800,0x16A38,'L'}, {0x16A40,0x16A5E,'L'},
    {0x16A60,0x16A69,'N'}, {0x16A70,0x16ABE,'L'}, {0x16AC0,0x16AC9,'N'}, {0x16AD0,0x16AED,'L'},
    {0x16B00,0x16B2F,'L'}, {0x16B40,0x16B43,'L'}, {0x16B50,0x16B59,'N'}, {0x16B5B,0x16B61,'N'},
    {0x16B63,0x16B77,'L'}, {0x16B7D,0x16B8F,'L'}, {0x16E40,0x16E7F,'L'}, {0x16E80,0x16E96,'N'},
    {0x16F00,0x16F4A,'L'}, {0x16F50,0x16F50,'L'}, {0x16F93,0x16F9F,'L'}, {0x16FE0,0x16FE1,'L'},
    {0x16FE3,0x16FE3,'L'}, {0x17000,0x187F7,'L'}, {0x18800,0x18CD5,'L'}, {0x18D00,0x18D08,'L'},
    {0x1AFF0,0x1AFF3,'L'}, {0x1AFF5,0x1AFFB,'L'}, {0x1AFFD,0x1AFFE,'L'}, {0x1B000,0x1B122,'L'},
    {0x1B132,0x1B132,'L'}, {0x1B150,0x1B152,'L'}, {0x1B155,0x1B155,'L'}, {0x1B164,0x1B167,'L'},
    {0x1B170,0x1B2FB,'L'}, {0x1BC00,0x1BC6A,'L'}, {0x1BC70,0x1BC7C,'L'}, {0x1BC80,0x1BC88,'L'},
    {0x1BC90,0x1BC99,'L'}, {0x1D2C0,0x1D2D3,'N'}, {0x1D2E0,0x1D2F3,'N'}, {0x1D360,0x1D378,'N'},
    {0x1D400,0x1D454,'L'}, {0x1D456,0x1D49C,'L'}, {0x1D49E,0x1D49F,'L'}, {0x1D4A2,0x1D4A2,'L'},
    {0x1D4A5,0x1D4A6,'L'}, {0x1D4A9,0x1D4AC,'L'}, {0x1D4AE,0x1D4B9,'L'}, {0x1D4BB,0x1D4BB,'L'},
    {0x1D4BD,0x1D4C3,'L'}, {0x1D4C5,0x1D505,'L'}, {0x1D507,0x1D50A,'L'}, {0x1D50D,0x1D514,'L'},
    {0x1D516,0x1D51C,'L'}, {0x1D51E,0x1D539,'L'}, {0x1D53B,0x1D53E,'L'}, {0x1D540,0x1D544,'L'},
    {0x1D546,0x1D546,'L'}, {0x1D54A,0x1D550,'L'}, {0x1D552,0x1D6A5,'L'}, {0x1D6A8,0x1D6C0,'L'},
    {0x1D6C2,0x1D6DA,'L'}, {0x1D6DC,0x1D6FA,'L'}, {0x1D6FC,0x1D714,'L'}, {0x1D716,0x1D734,'L'},
    {0x1D736,0x1D74E,'L'}, {0x1D750,0x1D76E,'L'}, {0x1D770,0x1D788,'L'}, {0x1D78A,0x1D7A8,'L'},
    {0x1D7AA,0x1D7C2,'L'}, {0x1D7C4,0x1D7CB,'L'}, {0x1D7CE,0x1D7FF,'N'}, {0x1DF00,0x1DF1E,'L'},
    {0x1DF25,0x1DF2A,'L'}, {0x1E030,0x1E06D,'L'}, {0x1E100,0x1E12C,'L'}, {0x1E137,0x1E13D,'L'},
    {0x1E140,0x1E149,'N'}, {0x1E14E,0x1E14E,'L'}, {0x1E290,0x1E2AD,'L'}, {0x1E2C0,0x1E2EB,'L'},
    {0x1E2F0,0x1E2F9,'N'}, {0x1E4D0,0x1E4EB,'L'}, {0x1E4F0,0x1E4F9,'N'}, {0x1E7E0,0x1E7E6,'L'},
    {0x1E7E8,0x1E7EB,'L'}, {0x1E7ED,0x1E7EE,'L'}, {0x1E7F0,0x1E7FE,'L'}, {0x1E800,0x1E8C4,'L'},
    {0x1E8C7,0x1E8CF,'N'}, {0x1E900,0x1E943,'L'}, {0x1E94B,0x1E94B,'L'}, {0x1E950,0x1E959,'N'},
    {0x1EC71,0x1ECAB,'N'}, {0x1ECAD,0x1ECAF,'N'}, {0x1ECB1,0x1ECB4,'N'}, {0x1ED01,0x1ED2D,'N'},
    {0x1ED2F,0x1ED3D,'N'}, {0x1EE00,0x1EE03,'L'}, {0x1EE05,0x1EE1F,'L'}, {0x1EE21,0x1EE22,'L'},
    {0x1EE24,0x1EE24,'L'}, {0x1EE27,0x1EE27,'L'}, {0x1EE29,0x1EE32,'L'}, {0x1EE34,0x1EE37,'L'},
    {0x1EE39,0x1EE39,'L'}, {0x1EE3B,0x1EE3B,'L'}, {0x1EE42,0x1EE42,'L'}, {0x1EE47,0x1EE47,'L'},
    {0x1EE49,0x1EE49,'L'}, {0x1EE4B,0x1EE4B,'L'}, {0x1EE4D,0x1EE4F,'L'}, {0x1EE51,0x1EE52,'L'},
    {0x1EE54,0x1EE54,'L'}, {0x1EE57,0x1EE57,'L'}, {0x1EE59,0x1EE59,'L'}, {0x1EE5B,0x1EE5B,'L'},
    {0x1EE5D,0x1EE5D,'L'}, {0x1EE5F,0x1EE5F,'L'}, {0x1EE61,0x1EE62,'L'}, {0x1EE64,0x1EE64,'L'},
    {0x1EE67,0x1EE6A,'L'}, {0x1EE6C,0x1EE72,'L'}, {0x1EE74,0x1EE77,'L'}, {0x1EE79,0x1EE7C,'L'},
    {0x1EE7E,0x1EE7E,'L'}, {0x1EE80,0x1EE89,'L'}, {0x1EE8B,0x1EE9B,'L'}, {0x1EEA1,0x1EEA3,'L'},
    {0x1EEA5,0x1EEA9,'L'}, {0x1EEAB,0x1EEBB,'L'}, {0x1F100,0x1F10C,'N'}, {0x1FBF0,0x1FBF9,'N'},
    {0x20000,0x2A6DF,'L'}, {0x2A700,0x2B739,'L'}, {0x2B740,0x2B81D,'L'}, {0x2B820,0x2CEA1,'L'},
    {0x2CEB0,0x2EBE0,'L'}, {0x2F800,0x2FA1D,'L'}, {0x30000,0x3134A,'L'}, {0x31350,0x323AF,'L'},
};

/* The pre-tokenizer class of a code point: 'L' letter (\p{L}), 'N' number (\p{N}), 'S' white space (\s),
 * 0 anything else. */
static int llm_uni_class(uint32_t c) {
    if (c < 0x80) { /* most text is ASCII: skip the search */
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 'L';
        if (c >= '0' && c <= '9') return 'N';
        return c == ' ' || (c >= 0x09 && c <= 0x0D) ? 'S' : 0;
    }
    int lo = 0, hi = (int)(sizeof llm_uni_ranges / sizeof llm_uni_ranges[0]) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < llm_uni_ranges[mid].lo) hi = mid - 1;
        else if (c > llm_uni_ranges[mid].hi) lo = mid + 1;
        else return llm_uni_ranges[mid].cls;
    }
    return 0;
}

#endif /* LLM_IMPLEMENTATION_DONE */
#endif /* LLM_IMPLEMENTATION */
