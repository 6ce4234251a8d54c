"""Writes small random-weight GGUF models of real architectures, for fidelity tests against llama.cpp (and
copies of models in the same folder with MXFP4 weights, Llama 3.1's rope_freqs, Phi-3.5's LongRoPE factors or 64
more tokens).

Usage: python3 make_random_models.py VOCAB_DIR OUT_DIR   (make test runs it once, in .venv, with the gguf package)
The files are the same bytes on every machine (numpy's default_rng with a fixed seed per model; gguf 0.19.0's
writer): models/random-models.sha256 holds their sums, and make checks them after writing. llama.cpp's greedy
answers on these files are in reference/random-models-greedy.json.
The tokenizer of each model is copied from a vocab-only GGUF (llama.cpp's fixtures). Weights are drawn with a
fixed seed. Embeddings have unit scale, so logits are far apart and greedy decoding is robust to rounding
differences between engines; the layers' output projections are scaled up so that, with a tied embedding, the
next token is not just an echo of the last one (which would pass even with broken attention).
"""
import sys, numpy as np, gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType
from gguf_fields import copy_fields, copy_tokenizer

vocab_dir, out_dir = sys.argv[1], sys.argv[2]

def make(name, arch, vocab_file, dim, n_layer, n_head, n_kv, ffn, head_dim=None, rope_base=10000.0,
         qkv_bias=False, qk_norm=False, tied=True, seed=0, moe=None):
    """moe: (n_expert, n_used, ffn_exp, ffn_shexp), qwen2moe's FFN: a softmax router over n_expert experts of
    width ffn_exp, the top n_used weighted as they come (not renormalised), plus a shared expert of width
    ffn_shexp gated by sigmoid(ffn_gate_inp_shexp . x)"""
    rng = np.random.default_rng(seed)
    hd = head_dim or dim // n_head
    w = GGUFWriter(f"{out_dir}/{name}.gguf", arch)
    n_vocab = copy_tokenizer(w, vocab_file)
    w.add_name(name)
    w.add_context_length(2048); w.add_embedding_length(dim); w.add_block_count(n_layer)
    w.add_feed_forward_length(ffn); w.add_head_count(n_head); w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(rope_base); w.add_layer_norm_rms_eps(1e-6); w.add_rope_dimension_count(hd)
    if head_dim: w.add_key_length(hd); w.add_value_length(hd)
    if moe:
        n_expert, n_used, ffn_exp, ffn_shexp = moe
        w.add_expert_count(n_expert); w.add_expert_used_count(n_used)
        w.add_expert_feed_forward_length(ffn_exp); w.add_expert_shared_feed_forward_length(ffn_shexp)
    w.add_file_type(0)
    f32 = lambda *s, std=1.0: (rng.standard_normal(s) * std).astype(np.float32)
    w.add_tensor("token_embd.weight", f32(n_vocab, dim, std=1.0))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        w.add_tensor(p + "attn_q.weight", f32(n_head * hd, dim, std=dim ** -0.5))
        w.add_tensor(p + "attn_k.weight", f32(n_kv * hd, dim, std=dim ** -0.5))
        w.add_tensor(p + "attn_v.weight", f32(n_kv * hd, dim, std=dim ** -0.5))
        if qkv_bias:
            w.add_tensor(p + "attn_q.bias", f32(n_head * hd, std=0.5))
            w.add_tensor(p + "attn_k.bias", f32(n_kv * hd, std=0.5))
            w.add_tensor(p + "attn_v.bias", f32(n_kv * hd, std=0.5))
        if qk_norm:
            w.add_tensor(p + "attn_q_norm.weight", (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32))
            w.add_tensor(p + "attn_k_norm.weight", (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32))
        w.add_tensor(p + "attn_output.weight", f32(dim, n_head * hd, std=4 * (n_head * hd) ** -0.5))
        w.add_tensor(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        if moe:
            w.add_tensor(p + "ffn_gate_inp.weight", f32(n_expert, dim, std=dim ** -0.5 * 3))
            w.add_tensor(p + "ffn_gate_exps.weight", f32(n_expert, ffn_exp, dim, std=dim ** -0.5))
            w.add_tensor(p + "ffn_up_exps.weight", f32(n_expert, ffn_exp, dim, std=dim ** -0.5))
            w.add_tensor(p + "ffn_down_exps.weight", f32(n_expert, dim, ffn_exp, std=4 * ffn_exp ** -0.5))
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", f32(dim, std=dim ** -0.5))
            w.add_tensor(p + "ffn_gate_shexp.weight", f32(ffn_shexp, dim, std=dim ** -0.5))
            w.add_tensor(p + "ffn_up_shexp.weight", f32(ffn_shexp, dim, std=dim ** -0.5))
            w.add_tensor(p + "ffn_down_shexp.weight", f32(dim, ffn_shexp, std=4 * ffn_shexp ** -0.5))
            continue
        w.add_tensor(p + "ffn_gate.weight", f32(ffn, dim, std=dim ** -0.5))
        w.add_tensor(p + "ffn_up.weight", f32(ffn, dim, std=dim ** -0.5))
        w.add_tensor(p + "ffn_down.weight", f32(dim, ffn, std=4 * ffn ** -0.5))
    w.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    if not tied:
        w.add_tensor("output.weight", f32(n_vocab, dim, std=1.0))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    print("wrote", name, n_vocab, "tokens")

make("random-llama3-gqa", "llama", f"{vocab_dir}/ggml-vocab-llama-bpe.gguf", dim=64, n_layer=2, n_head=4, n_kv=2,
     ffn=96, rope_base=500000.0, seed=1)
make("random-qwen2-bias", "qwen2", f"{vocab_dir}/ggml-vocab-qwen2.gguf", dim=32, n_layer=2, n_head=4, n_kv=2,
     ffn=64, rope_base=1000000.0, qkv_bias=True, seed=2)
make("random-qwen3-qknorm", "qwen3", f"{vocab_dir}/ggml-vocab-qwen2.gguf", dim=32, n_layer=2, n_head=4, n_kv=2,
     ffn=64, head_dim=16, rope_base=1000000.0, qk_norm=True, seed=3)
make("random-llama2-untied", "llama", f"{vocab_dir}/ggml-vocab-llama-spm.gguf", dim=64, n_layer=2, n_head=8, n_kv=8,
     ffn=128, tied=False, seed=4)
make("random-qwen2moe", "qwen2moe", f"{vocab_dir}/ggml-vocab-qwen2.gguf", dim=32, n_layer=2, n_head=4, n_kv=2,
     ffn=64, rope_base=1000000.0, qkv_bias=True, tied=False, seed=17, moe=(4, 2, 16, 48))

def copy_changed(src, dst, mxfp4=(), add_keys=(), add_tensors=(), extra_tokens=0):
    """A copy of the model src (in out_dir) with the tensors named in mxfp4 quantized to MXFP4 by the gguf
    package (what gpt-oss's published files do to their experts), with the keys add_keys ((name, value, type))
    and the f32 tensors add_tensors ((name, values)) added, and with extra_tokens more tokens (control tokens
    <extra_i>, zero embeddings; the first one's output row the sum of the first 64 rows, the others' zero);
    every other key and tensor as it is"""
    r = GGUFReader(f"{out_dir}/{src}")
    w = GGUFWriter(f"{out_dir}/{dst}", r.fields["general.architecture"].contents())
    arrays = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
    if not extra_tokens: arrays = ()
    copy_fields(w, r, lambda name: not name.startswith("GGUF.") and name != "general.architecture" and
                name not in arrays)
    if extra_tokens:
        f = r.fields["tokenizer.ggml.tokens"]
        tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        tokens += [f"<extra_{i}>" for i in range(extra_tokens)]
        scores = [r.fields["tokenizer.ggml.scores"].parts[i].tolist()[0]
                  for i in r.fields["tokenizer.ggml.scores"].data]
        types = [r.fields["tokenizer.ggml.token_type"].parts[i].tolist()[0]
                 for i in r.fields["tokenizer.ggml.token_type"].data]
        w.add_token_list(tokens); w.add_token_scores(scores + [0.0] * extra_tokens)
        w.add_token_types(types + [gguf.TokenType.CONTROL] * extra_tokens)
    for name, value, t in add_keys: w.add_key_value(name, value, t)
    for t in r.tensors:
        data = np.asarray(t.data)
        if t.name in mxfp4:
            qt = gguf.GGMLQuantizationType.MXFP4
            w.add_tensor(t.name, gguf.quants.quantize(data.astype(np.float32), qt), raw_dtype=qt)
            continue
        if extra_tokens and t.name in ("token_embd.weight", "output.weight"):
            extra = np.zeros((extra_tokens, data.shape[1]), dtype=np.float32)
            if t.name == "output.weight": extra[0] = data[:64].sum(axis=0)
            data = np.concatenate([data, extra])
        w.add_tensor(t.name, data)
    for name, values in add_tensors: w.add_tensor(name, np.array(values, dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    print("wrote", dst)

# gpt-oss with MXFP4 weights (whose blocks of 32 need rows of a multiple of 32 values: the experts' down
# projections and the attention's output projection of this small model)
copy_changed("random-gpt-oss.gguf", "random-gpt-oss-mxfp4.gguf",
             mxfp4={"blk.%d.%s.weight" % (l, n) for l in range(2) for n in ("ffn_down_exps", "attn_output")})
# Llama 3.1's RoPE frequency factors (rope_freqs: each pair's angle divided by its factor), with factors under
# 1 on the slow pairs so that they turn visibly over a short prompt
copy_changed("random-llama3-gqa.gguf", "random-llama3-rope-freqs.gguf",
             add_tensors=[("rope_freqs.weight", [1.0, 1.0, 0.8, 0.5, 0.2, 0.1, 0.05, 0.02])])
# Phi-3.5's LongRoPE: per-pair factors for contexts past the original one (long) and within it (short), and
# the attention factor that scales cos and sin
U32, F32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
copy_changed("random-phi3.gguf", "random-phi3-longrope.gguf",
             add_keys=[("phi3.rope.scaling.original_context_length", 2048, U32),
                       ("phi3.rope.scaling.attn_factor", 1.19, F32)],
             add_tensors=[("rope_factors_long.weight", [1.0, 1.1, 1.5, 2.5, 5.0, 0.1, 0.05, 0.02]),
                          ("rope_factors_short.weight", [1.0, 1.0, 1.2, 0.9, 0.5, 0.3, 0.2, 0.1])])

# 64 tokens more than random-llama2-untied, a draft model for it whose greedy pick is now and then a token the
# model does not have (the first new token's logit is the largest about a third of the time)
copy_changed("random-llama2-untied.gguf", "random-llama2-wider.gguf", extra_tokens=64)

# an embedding model as Qwen3-Embedding's GGUF is: random-qwen3-qknorm with last-token pooling, and EOS
# appended to every prompt (its last position is the one pooled); tools/embed_oracle.py computes its vectors
BOOL = GGUFValueType.BOOL
copy_changed("random-qwen3-qknorm.gguf", "random-qwen3-embed.gguf",
             add_keys=[("qwen3.pooling_type", 3, U32), ("tokenizer.ggml.add_eos_token", True, BOOL)])

# a reranker as llama.cpp's converter writes Qwen3-Reranker: random-qwen3-qknorm with pooling_type 4 (rank),
# cls.output the output rows (the tied embedding's) of "yes" and "no", and a rerank template; its instruction
# differs from Qwen3-Reranker's default (server.c's RANK_TEMPLATE) so that a test tells which one was used
src = GGUFReader(f"{out_dir}/random-qwen3-qknorm.gguf")
vocab = [bytes(src.fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
         for i in src.fields["tokenizer.ggml.tokens"].data]
emb = np.asarray(next(t for t in src.tensors if t.name == "token_embd.weight").data)
RERANK = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the '
          'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
          '<Instruct>: Given a question, find the passage that answers it\n<Query>: {query}\n<Document>: '
          '{document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n')
copy_changed("random-qwen3-qknorm.gguf", "random-qwen3-rerank.gguf",
             add_keys=[("qwen3.pooling_type", 4, U32),
                       ("tokenizer.chat_template.rerank", RERANK, GGUFValueType.STRING)],
             add_tensors=[("cls.output.weight", emb[[vocab.index("yes"), vocab.index("no")]])])
