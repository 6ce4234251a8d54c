#!/usr/bin/env python3
"""Gemma 3 270M in float64, the oracle of make test's Gemma 3 test: greedy continuations of the five prompts
of llama.cpp's references (their token ids), computed with numpy from the GGUF file's weights (dequantized by
the gguf package), and the gap between the top two log-probabilities at each step.

    .venv/bin/python tools/gemma3_f64.py models/gemma-3-270m-q4_k_m.gguf LLAMA_CPP_REFS.json OUT.json

Written straight from Gemma 3's definition (Hugging Face transformers' Gemma3 text model): embeddings times
sqrt(dim); per layer an RMS norm (weights stored as 1 + w in the GGUF file), Q/K/V, RMS norms of each query
and key head, RoPE (NEOX halves; base 10000 on local layers, 1e6 on every sixth, global, one), softmax
attention scaled by 1/sqrt(head_dim) over the last sliding_window positions on local layers, the output
projection and its RMS norm added to the stream; then an RMS norm, GeGLU (tanh GELU) and the down projection
with its RMS norm; a final RMS norm and the tied embedding as the output matrix. Nothing of llm.h is used.
LLAMA_CPP_REFS gives the prompts and llama.cpp's own continuations, kept beside ours in OUT for comparison."""
import json, sys
import numpy as np
import gguf
from gguf.quants import dequantize

path, refs_path, out_path = sys.argv[1:4]
r = gguf.GGUFReader(path)
tensors = {t.name: t for t in r.tensors}
field = lambda k: r.fields[k].contents()
D = int(field("gemma3.embedding_length"))
L = int(field("gemma3.block_count"))
H = int(field("gemma3.attention.head_count"))
HD = int(field("gemma3.attention.key_length"))
EPS = float(field("gemma3.attention.layer_norm_rms_epsilon"))
WINDOW = int(field("gemma3.attention.sliding_window"))
BASE_GLOBAL = float(field("gemma3.rope.freq_base"))
BASE_LOCAL = 10000.0  # llama.cpp's default for gemma3 when the file has no rope.freq_base_swa; so is Gemma's


def weight(name):
    t = tensors[name]
    a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)
    return a.reshape(int(t.shape[1]), int(t.shape[0])) if len(t.shape) > 1 else a.reshape(-1)


def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def rope(x, pos, base):  # x [n, HD]: the first half and the second half rotate together (NEOX)
    half = HD // 2
    ang = pos[:, None] * base ** (-np.arange(half, dtype=np.float64) * 2 / HD)[None, :]
    c, s = np.cos(ang), np.sin(ang)
    return np.concatenate([x[:, :half] * c - x[:, half:] * s, x[:, half:] * c + x[:, :half] * s], -1)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


emb = weight("token_embd.weight")
names = ["attn_q", "attn_k", "attn_v", "attn_output", "attn_norm", "attn_q_norm", "attn_k_norm",
         "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"]
layers = [{k: weight("blk.%d.%s.weight" % (l, k)) for k in names} for l in range(L)]
out_norm = weight("output_norm.weight")


def forward(ids, start, cache):
    """Log-probabilities after each of ids (at positions start...), keys and values kept in cache per
    layer."""
    n = len(ids)
    pos = np.arange(start, start + n, dtype=np.float64)
    x = emb[ids] * np.sqrt(D)
    for l, w in enumerate(layers):
        local = (l + 1) % 6 != 0
        base = BASE_LOCAL if local else BASE_GLOBAL
        h = rms(x, w["attn_norm"])
        q, k, v = h @ w["attn_q"].T, h @ w["attn_k"].T, h @ w["attn_v"].T
        kv_heads = k.shape[1] // HD
        k = np.concatenate([rope(rms(k[:, j * HD:(j + 1) * HD], w["attn_k_norm"]), pos, base)
                            for j in range(kv_heads)], -1)
        K, V = cache.setdefault(l, [np.zeros((0, k.shape[1])), np.zeros((0, v.shape[1]))])
        K, V = np.concatenate([K, k]), np.concatenate([V, v])
        cache[l] = [K, V]
        kpos = np.arange(K.shape[0], dtype=np.float64)
        allowed = (kpos[None, :] <= pos[:, None]) & (~local | (pos[:, None] - kpos[None, :] < WINDOW))
        att = np.zeros((n, H * HD))
        for hh in range(H):
            j = hh // (H // kv_heads)
            qh = rope(rms(q[:, hh * HD:(hh + 1) * HD], w["attn_q_norm"]), pos, base)
            s = np.where(allowed, qh @ K[:, j * HD:(j + 1) * HD].T / np.sqrt(HD), -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, hh * HD:(hh + 1) * HD] = (s / s.sum(-1, keepdims=True)) @ V[:, j * HD:(j + 1) * HD]
        x = x + rms(att @ w["attn_output"].T, w["post_attention_norm"])
        h = rms(x, w["ffn_norm"])
        x = x + rms((gelu(h @ w["ffn_gate"].T) * (h @ w["ffn_up"].T)) @ w["ffn_down"].T, w["post_ffw_norm"])
    logits = rms(x, out_norm) @ emb.T
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


out = []
for ref in json.load(open(refs_path)):
    prompt = ref["prompt_token_ids"]
    cache, ids, gaps, top2 = {}, [], [], []
    lp = forward(prompt, 0, cache)[-1]
    for step in range(ref["max_tokens"]):
        o = np.argsort(-lp)[:2]
        ids.append(int(o[0])); top2.append(int(o[1])); gaps.append(round(float(lp[o[0]] - lp[o[1]]), 6))
        if step + 1 < ref["max_tokens"]:
            lp = forward([ids[-1]], len(prompt) + step, cache)[-1]
    out.append({"prompt": ref["prompt"], "prompt_token_ids": prompt, "max_tokens": ref["max_tokens"],
                "completion_token_ids": ids, "second_token_ids": top2, "top2_logprob_gap": gaps,
                "llama_cpp_completion_token_ids": ref["completion_token_ids"],
                "llama_cpp_top2_logprob_gap": ref["top2_logprob_gap"], "llama_cpp": ref["llama_cpp"]})
    print("%s: %s" % (ref["prompt"], ids), file=sys.stderr)
with open(out_path, "w") as f:
    f.write("[\n" + ",\n".join(json.dumps(o) for o in out) + "\n]\n")
