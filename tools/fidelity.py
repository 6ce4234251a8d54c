#!/usr/bin/env python3
"""Fidelity of one OpenAI-compatible server against another, teacher-forced over a text.

Both servers score the same token ids (the text tokenized once, by the reference's /tokenize) with
/v1/completions, echo: true, logprobs: 20, max_tokens: 0 (1 where a server refuses 0), and the prompt's
logprobs are compared position by position, as test.c's fidelity test compares llm's default CPU path
with its exact one:
  top-1 agreement  the share of positions where both put the same token first
  mean KL          KL(reference || other) over the reference's top 20 at each position:
                   sum of p(t) (log p(t) - log q(t)), q(t) the other's logprob of t, or its 20th logprob when
                   t is not in its top 20; nothing renormalized (the mass beyond the top 20 is left out)
Tokens are matched by id where the server gives vLLM's prompt_logprobs (asked for too), else by their text
in OpenAI's top_logprobs.

  tools/fidelity.py --ref http://127.0.0.1:8000 --other http://127.0.0.1:8001 --text-file prose.txt
  tools/fidelity.py --serve models/SmolLM2-135M-Instruct.Q4_1.gguf     # llm serve --cpu-exact vs default

With --serve MODEL it starts ./llm serve twice itself (--cpu-exact as the reference, the default CPU path as
the other). Standard library only. A server without echo (llama.cpp's, for one) cannot be compared this way:
the tool says so and stops.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

DEFAULT_TEXT = (
    "<|im_start|>user\nWhat is the difference between weather and climate?<|im_end|>\n"
    "<|im_start|>assistant\nWeather is what the atmosphere does over hours and days: rain this afternoon, "
    "a cold front tomorrow, a heat wave next week. Climate is the pattern of weather over decades."
    "<|im_end|>\n"
    "The river rose slowly through the night. By morning the lower fields were under water, and the farmers "
    "who had lived in the valley all their lives walked along the embankment in silence, watching the brown "
    "current carry branches, fence posts and, once, a small wooden boat with nobody in it.")

K = 20


def post(base, path, body, timeout=600):
    req = urllib.request.Request(base.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, {}


def tokenize(base, text):
    status, body = post(base, "/tokenize", {"prompt": text, "content": text, "add_special": True})
    if status != 200 or "tokens" not in body:
        sys.exit("fidelity: %s/tokenize failed (%d): %s" % (base, status, body))
    return [int(t) for t in body["tokens"]]


def score(base, ids, model=None):
    """The prompt's rows: per position 1.., (own logprob, {key: logprob} of the top K), keyed by id when the
    server gives prompt_logprobs, else by token text."""
    body = {"prompt": ids, "echo": True, "logprobs": K, "max_tokens": 0, "temperature": 0,
            "prompt_logprobs": K}
    if model:
        body["model"] = model
    status, out = post(base, "/v1/completions", body)
    if status == 400:  # a server that wants at least one token
        body["max_tokens"] = 1
        status, out = post(base, "/v1/completions", body)
    if status != 200:
        sys.exit("fidelity: %s refused echo with logprobs (%d): %s" % (base, status, out))
    choice = out["choices"][0]
    n = len(ids)
    plp = choice.get("prompt_logprobs")
    if plp and len(plp) >= n:
        rows = []
        for i in range(1, n):
            entries = plp[i]
            own = entries[str(ids[i])]["logprob"]
            top = sorted(((e["rank"], int(t), e["logprob"]) for t, e in entries.items() if e["rank"] <= K))
            rows.append((own, {t: lp for _, t, lp in top}, [t for _, t, _ in top]))
        return rows, "ids"
    lp = choice.get("logprobs") or {}
    tops, values = lp.get("top_logprobs") or [], lp.get("token_logprobs") or []
    if len(tops) < n:
        sys.exit("fidelity: %s gave no logprobs for the echoed prompt (echo unsupported?)" % base)
    rows = []
    for i in range(1, n):
        order = sorted(tops[i].items(), key=lambda kv: -kv[1])
        rows.append((values[i], dict(order), [t for t, _ in order]))
    return rows, "text"


def compare(ref, other):
    agree, kl_sum, kl_max = 0, 0.0, 0.0
    for (_, p, p_order), (_, q, q_order) in zip(ref, other):
        agree += bool(p_order) and bool(q_order) and p_order[0] == q_order[0]
        floor = q[q_order[-1]] if q_order else -9999.0
        d = sum(math.exp(lp) * (lp - q.get(t, floor)) for t, lp in p.items())
        kl_sum += d
        kl_max = max(kl_max, d)
    n = len(ref)
    return agree / n, kl_sum / n, kl_max


def start_llm(model, flag, log):
    cmd = ["./llm", "serve", "-m", model, "--port", "0"] + ([flag] if flag else [])
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        log.write(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return proc, m.group(1).replace("0.0.0.0", "127.0.0.1")
    sys.exit("fidelity: %s did not start" % " ".join(cmd))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", help="the reference server's base URL (e.g. llm serve --cpu-exact)")
    ap.add_argument("--other", help="the server compared with it")
    ap.add_argument("--serve", metavar="MODEL", help="start ./llm serve MODEL twice: --cpu-exact and default")
    ap.add_argument("--text-file", help="the text (default: a short chat and some prose)")
    ap.add_argument("--tokenize-url", help="where to tokenize (default: the reference)")
    ap.add_argument("--model", help="the model field to send (default: none)")
    a = ap.parse_args()
    text = open(a.text_file, encoding="utf-8").read() if a.text_file else DEFAULT_TEXT
    procs = []
    try:
        if a.serve:
            log = open(os.devnull, "w")
            p1, a.ref = start_llm(a.serve, "--cpu-exact", log)
            p2, a.other = start_llm(a.serve, None, log)
            procs = [p1, p2]
        if not a.ref or not a.other:
            ap.error("give --ref and --other, or --serve MODEL")
        ids = tokenize(a.tokenize_url or a.ref, text)
        if len(ids) < 2:
            sys.exit("fidelity: the text is a single token")
        ref, how_ref = score(a.ref, ids, a.model)
        other, how_other = score(a.other, ids, a.model)
        if how_ref != how_other:  # match like with like: both by text
            ref, _ = score_as_text(ref, a.ref, ids, a.model) if how_ref == "ids" else (ref, None)
            other, _ = score_as_text(other, a.other, ids, a.model) if how_other == "ids" else (other, None)
        agreement, kl, kl_max = compare(ref, other)
        print("fidelity: %d positions (tokens matched by %s): top-1 agreement %.2f%%, mean KL(ref || other) "
              "%.5f nats (worst position %.4f)" % (len(ref), how_ref if how_ref == how_other else "text",
                                                   100 * agreement, kl, kl_max))
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def score_as_text(rows, base, ids, model):
    """Rows keyed by id from prompt_logprobs, asked again without it: keyed by text, as the other server's."""
    status, out = post(base, "/v1/completions", {"prompt": ids, "echo": True, "logprobs": K, "max_tokens": 1,
                                                 "temperature": 0, **({"model": model} if model else {})})
    lp = out["choices"][0]["logprobs"]
    new = []
    for i in range(1, len(ids)):
        order = sorted(lp["top_logprobs"][i].items(), key=lambda kv: -kv[1])
        new.append((lp["token_logprobs"][i], dict(order), [t for t, _ in order]))
    return new, "text"


if __name__ == "__main__":
    main()
