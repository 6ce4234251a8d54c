#!/usr/bin/env python3
"""The embeddings' oracle: a Qwen3 model's pooled, normalised hidden states in float64, with numpy, from the
GGUF file's weights (dequantized by the gguf package). Nothing of llm.h is used.

    .venv/bin/python tools/embed_oracle.py testdata/models/random-qwen3-embed.gguf OUT.json

writes, for a few prompts given as token ids (EOS last, as the tokenizer's add_eos_token puts it), their
vectors pooled three ways (mean, cls, last) and L2-normalised: testdata/reference/random-qwen3-embed-f64.json,
which test.c's "engine pooling" compares the engine with. tools/embeddings_test.py imports load and embed.

Written from Qwen3's definition (Hugging Face transformers' Qwen3 model): per layer an RMS norm, Q/K/V, an RMS
norm of each query and key head, RoPE on NEOX halves, causal softmax attention scaled by 1/sqrt(head_dim) with
grouped K/V heads, the output projection added to the stream; an RMS norm, SwiGLU (silu(gate) * up) and the
down projection added; then the final RMS norm, whose rows are the hidden states pooled (no output matrix)."""
import json, sys
import numpy as np
import gguf
from gguf.quants import dequantize


def load(path):
    """The model's weights in float64 and its shape, as a dict"""
    r = gguf.GGUFReader(path)
    tensors = {t.name: t for t in r.tensors}
    field = lambda k: r.fields[k].contents()
    arch = field("general.architecture")
    assert arch == "qwen3", arch

    def weight(name):
        t = tensors[name]
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)
        return a.reshape(int(t.shape[1]), int(t.shape[0])) if len(t.shape) > 1 else a.reshape(-1)

    m = {"H": int(field("qwen3.attention.head_count")), "KV": int(field("qwen3.attention.head_count_kv")),
         "HD": int(field("qwen3.attention.key_length")), "L": int(field("qwen3.block_count")),
         "eps": float(field("qwen3.attention.layer_norm_rms_epsilon")),
         "base": float(field("qwen3.rope.freq_base")), "emb": weight("token_embd.weight"),
         "out_norm": weight("output_norm.weight"),
         "pooling": int(field("qwen3.pooling_type")) if "qwen3.pooling_type" in r.fields else 0}
    names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
             "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
    m["layers"] = [{k: weight("blk.%d.%s.weight" % (l, k)) for k in names} for l in range(m["L"])]
    return m


def hidden(m, ids):
    """The final-norm hidden state of every position of the prompt ids: [len(ids), dim]"""
    H, KV, HD, eps = m["H"], m["KV"], m["HD"], m["eps"]
    rms = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    half = HD // 2
    ang = pos[:, None] * m["base"] ** (-np.arange(half, dtype=np.float64) * 2 / HD)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    rope = lambda x: np.concatenate([x[..., :half] * cos - x[..., half:] * sin,
                                     x[..., half:] * cos + x[..., :half] * sin], -1)  # x [n, heads, HD]
    x = m["emb"][np.asarray(ids)]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for w in m["layers"]:
        xn = rms(x, w["attn_norm"])
        q = rope(rms((xn @ w["attn_q"].T).reshape(n, H, HD), w["attn_q_norm"]))
        k = rope(rms((xn @ w["attn_k"].T).reshape(n, KV, HD), w["attn_k_norm"]))
        v = (xn @ w["attn_v"].T).reshape(n, KV, HD)
        att = np.empty((n, H, HD))
        for h in range(H):
            kv = h // (H // KV)
            s = q[:, h] @ k[:, kv].T / np.sqrt(HD) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            att[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + att.reshape(n, H * HD) @ w["attn_output"].T
        xn = rms(x, w["ffn_norm"])
        g, u = xn @ w["ffn_gate"].T, xn @ w["ffn_up"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w["ffn_down"].T
    return rms(x, m["out_norm"])


def embed(m, ids, pooling, dimensions=None):
    """The prompt's vector: mean, cls (position 0) or last, its first `dimensions` values, L2-normalised"""
    h = hidden(m, ids)
    v = {"mean": h.mean(0), "cls": h[0], "last": h[-1]}[pooling]
    if dimensions: v = v[:dimensions]
    return v / np.linalg.norm(v)


# The reference's prompts: short and long (over 2 blocks of 16, so a cached prefix could be taken), EOS last
EOS = 151645
PROMPTS = [[9707, 1879, EOS], [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, EOS],
           [(i * 7919) % 150000 for i in range(1, 41)] + [EOS]]

if __name__ == "__main__":
    path, out = sys.argv[1:3]
    m = load(path)
    ref = {"model": path.split("/")[-1], "note": "tools/embed_oracle.py: float64, L2-normalised",
           "prompts": [{"ids": ids, **{p: [round(float(x), 9) for x in embed(m, ids, p)]
                                       for p in ("mean", "cls", "last")}} for ids in PROMPTS]}
    with open(out, "w") as f:  # a line per prompt
        f.write(json.dumps(ref).replace('"prompts": [', '"prompts": [\n').replace('}, {', '},\n{') + "\n")
    print("wrote", out)
