#!/usr/bin/env python3
"""gpt-oss in float64, an oracle for the gpt-oss models of testdata/: greedy ids from prompt ids, computed
with numpy from the GGUF file's weights as the gguf package dequantizes them (MXFP4 too), and the smallest gap
between the top two log-probabilities along the way.

    .venv/bin/python tools/gpt_oss_f64.py MODEL.gguf N_TOKENS PROMPT_ID...

Prints a JSON object: {"completion_token_ids_float64": [...], "min_top2_gap_float64": g}. Written from
gpt-oss's definition as llama.cpp computes it (src/models/openai-moe-iswa.cpp): per layer an RMS norm, Q/K/V
with biases, NEOX RoPE, attention scaled by 1/sqrt(head_dim) whose softmax has one more logit per head, the
sink, which takes a share and gives no value; a sliding window of the last sliding_window positions on even
layers (0, 2, ...); the output projection with its bias; then the norm llama.cpp names post_attention_norm,
the router (logits plus bias, the top expert_used_count kept, the softmax of those), each chosen expert's
gate and up (with biases), min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1), its down
projection (with bias), weighted; a final norm and the output matrix. Nothing of llm.h is used."""
import json, sys
import numpy as np
import gguf
from gguf.quants import dequantize

path, n_tokens, prompt = sys.argv[1], int(sys.argv[2]), [int(a) for a in sys.argv[3:]]
r = gguf.GGUFReader(path)
T = {t.name: t for t in r.tensors}
field = lambda k: r.fields["gpt-oss." + k].contents()
D, L = int(field("embedding_length")), int(field("block_count"))
H, KV, HD = (int(field("attention.head_count")), int(field("attention.head_count_kv")),
              int(field("attention.key_length")))
E, K = int(field("expert_count")), int(field("expert_used_count"))
EPS, BASE, WINDOW = float(field("attention.layer_norm_rms_epsilon")), float(field("rope.freq_base")), \
    int(field("attention.sliding_window"))


def w(name):
    t = T[name]
    a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)
    return a.reshape([int(x) for x in reversed(t.shape)])


def rms(x, g): return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g


def rope(x, pos):  # x [n, HD], NEOX: the first half rotates with the second
    half = HD // 2
    ang = pos[:, None] * BASE ** (-np.arange(half, dtype=np.float64) * 2 / HD)[None, :]
    c, s = np.cos(ang), np.sin(ang)
    return np.concatenate([x[:, :half] * c - x[:, half:] * s, x[:, half:] * c + x[:, :half] * s], -1)


emb, out_norm, out_w = w("token_embd.weight"), w("output_norm.weight"), w("output.weight")
names = ["attn_norm.weight", "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias", "attn_v.weight",
         "attn_v.bias", "attn_output.weight", "attn_output.bias", "attn_sinks.weight",
         "post_attention_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp.bias", "ffn_gate_exps.weight",
         "ffn_gate_exps.bias", "ffn_up_exps.weight", "ffn_up_exps.bias", "ffn_down_exps.weight",
         "ffn_down_exps.bias"]
layers = [{k: w("blk.%d.%s" % (l, k)) for k in names} for l in range(L)]


def logprobs(ids):
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    x = emb[ids]
    for l, p in enumerate(layers):
        h = rms(x, p["attn_norm.weight"])
        q = h @ p["attn_q.weight"].T + p["attn_q.bias"]
        k = h @ p["attn_k.weight"].T + p["attn_k.bias"]
        v = h @ p["attn_v.weight"].T + p["attn_v.bias"]
        allowed = pos[None, :] <= pos[:, None]
        if l % 2 == 0:
            allowed &= pos[:, None] - pos[None, :] < WINDOW
        att = np.zeros((n, H * HD))
        for hh in range(H):
            j = hh // (H // KV)
            qh, kh = rope(q[:, hh * HD:(hh + 1) * HD], pos), rope(k[:, j * HD:(j + 1) * HD], pos)
            s = np.where(allowed, qh @ kh.T / np.sqrt(HD), -np.inf)
            sink = p["attn_sinks.weight"][hh]
            mx = np.maximum(s.max(-1, keepdims=True), sink)
            e = np.exp(s - mx)
            att[:, hh * HD:(hh + 1) * HD] = ((e / (e.sum(-1, keepdims=True) + np.exp(sink - mx)))
                                             @ v[:, j * HD:(j + 1) * HD])
        x = x + att @ p["attn_output.weight"].T + p["attn_output.bias"]
        h = rms(x, p["post_attention_norm.weight"])
        logits = h @ p["ffn_gate_inp.weight"].T + p["ffn_gate_inp.bias"]
        moe = np.zeros_like(x)
        for t in range(n):
            top = np.argsort(-logits[t], kind="stable")[:K]
            wts = np.exp(logits[t, top] - logits[t, top].max()); wts /= wts.sum()
            for e_, wt in zip(top, wts):
                g = np.minimum(p["ffn_gate_exps.weight"][e_] @ h[t] + p["ffn_gate_exps.bias"][e_], 7.0)
                u = np.clip(p["ffn_up_exps.weight"][e_] @ h[t] + p["ffn_up_exps.bias"][e_], -7.0, 7.0)
                a = g / (1 + np.exp(-1.702 * g)) * (u + 1)
                moe[t] += wt * (p["ffn_down_exps.weight"][e_] @ a + p["ffn_down_exps.bias"][e_])
        x = x + moe
    z = rms(x[-1], out_norm) @ out_w.T
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


ids, gap = list(prompt), float("inf")
for _ in range(n_tokens):
    lp = logprobs(ids)
    o = np.argsort(-lp)[:2]
    gap = min(gap, float(lp[o[0]] - lp[o[1]]))
    ids.append(int(o[0]))
print(json.dumps({"completion_token_ids_float64": ids[len(prompt):], "min_top2_gap_float64": round(gap, 5)}))
