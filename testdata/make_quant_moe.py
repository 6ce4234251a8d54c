"""Writes a small random-weight mixture of experts in f32 (Mixtral's shape: arch llama with expert_count 4,
expert_used_count 2, experts as wide as feed_forward_length) with stories260K's vocabulary,
dim 256 and experts of width 256 so that llama-quantize gives its experts k-quants (which need rows of 256s).
testdata/models/random-quant-moe-q4_k_m.gguf is this file quantized by llama.cpp's llama-quantize:
    python3 testdata/make_quant_moe.py testdata/models/stories260K.gguf /tmp/random-quant-moe-f32.gguf
    llama-quantize /tmp/random-quant-moe-f32.gguf testdata/models/random-quant-moe-q4_k_m.gguf Q4_K_M
(llama-cpp-python 0.3.36's vendored llama.cpp). The stored file is what the tests read; llama-quantize is not
something a test may need.
"""
import sys, numpy as np
from gguf import GGUFWriter
from gguf_fields import copy_tokenizer

vocab_file, out = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(23)
dim, n_layer, n_head, n_kv, ffn, n_expert, n_used = 256, 2, 4, 2, 256, 4, 2
hd = dim // n_head
w = GGUFWriter(out, "llama")
n_vocab = copy_tokenizer(w, vocab_file)
w.add_name("random-quant-moe")
w.add_context_length(2048); w.add_embedding_length(dim); w.add_block_count(n_layer)
w.add_feed_forward_length(ffn); w.add_head_count(n_head); w.add_head_count_kv(n_kv)
w.add_rope_freq_base(10000.0); w.add_layer_norm_rms_eps(1e-5); w.add_rope_dimension_count(hd)
w.add_expert_count(n_expert); w.add_expert_used_count(n_used)
w.add_file_type(0)
f32 = lambda *s, std=1.0: (rng.standard_normal(s) * std).astype(np.float32)
norm = lambda: (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
w.add_tensor("token_embd.weight", f32(n_vocab, dim))
# each layer's tensors in file order: a norm, or a matrix's shape (its last, the input width) and how much
# larger than 1/sqrt(input width) its values are (the output projections larger, as make_random_models.py's)
layer = [("attn_norm", None, 0), ("attn_q", (n_head * hd, dim), 1), ("attn_k", (n_kv * hd, dim), 1),
         ("attn_v", (n_kv * hd, dim), 1), ("attn_output", (dim, n_head * hd), 4), ("ffn_norm", None, 0),
         ("ffn_gate_inp", (n_expert, dim), 3), ("ffn_gate_exps", (n_expert, ffn, dim), 1),
         ("ffn_up_exps", (n_expert, ffn, dim), 1), ("ffn_down_exps", (n_expert, dim, ffn), 4)]
for i in range(n_layer):
    for name, shape, scale in layer:
        w.add_tensor(f"blk.{i}.{name}.weight",
                     norm() if shape is None else f32(*shape, std=scale * shape[-1] ** -0.5))
w.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
w.add_tensor("output.weight", f32(n_vocab, dim))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
