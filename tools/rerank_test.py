#!/usr/bin/env python3
"""POST /v1/rerank and /v1/score on two rerankers, each score checked against tools/embed_oracle.py's
float64 forward: sigmoid(h . (yes_row - no_row)), h the final-normed hidden state of the prompt's last
position, the rows the classifier's, read from the file by the gguf package:

- random-qwen3-rerank.gguf, as llama.cpp's converter writes Qwen3-Reranker: pooling_type 4 (rank),
  cls.output (the "yes" and "no" rows) and a tokenizer.chat_template.rerank of its own instruction;
- random-qwen3-qknorm.gguf with --pooling rank, as Qwen3-Reranker is published (the plain LM): the output
  rows of "yes" and "no", and Qwen3-Reranker's own prompt (its default instruction).

Usage: tools/rerank_test.py [TESTDATA_DIR]   (make test runs it with the virtual environment's python)
The prompt's ids come from the server's /tokenize of the template filled in here (the tokenizer has its own
tests against llama.cpp's); the bound, |score - oracle| <= 2e-3 on the default path (16-bit activations):
measured 3.1e-4 at most (2026-11-29, Sapphire Rapids).
"""
import json, os, subprocess, sys, urllib.error, urllib.request

import numpy as np
import gguf
from gguf.quants import dequantize

import embed_oracle
from serve_port import Checks, finish, listening_port

testdata = sys.argv[1] if len(sys.argv) > 1 else "testdata"
check = Checks("rerank")
worst = [0.0]  # the largest |score - oracle| seen, printed at the end
# Qwen3-Reranker's format (vLLM's example, and llama.cpp's converter writes the same with this instruction)
QWEN3 = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the '
         'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
         '<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: '
         '{query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n')


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def fill(template, query, doc):
    """The template with the query and the document where it names them, once each (text in them that
    looks like a placeholder stays as it is)"""
    pre, rest = template.split("{query}", 1)
    mid, post_ = rest.split("{document}", 1)
    return pre + query + mid + doc + post_


def run(path, flags, template, rows_of, name):
    log_path = "llm-test-rerank.log"
    log = open(log_path, "w")
    server = subprocess.Popen(["./llm", "serve", "-m", path, "--port", "0"] + flags, stderr=log)
    port = listening_port(server, log_path, 30)
    check(port is not None, f"{name}: the server starts")
    base = f"http://127.0.0.1:{port}"
    m = embed_oracle.load(path)
    yes_no = rows_of(path)

    def oracle(query, doc):
        status, t = post(base, "/tokenize", {"prompt": fill(template, query, doc)})
        h = embed_oracle.hidden(m, t["tokens"])[-1]
        return 1 / (1 + np.exp(-(h @ (yes_no[0] - yes_no[1])))), len(t["tokens"])

    query = "What is the capital of China?"
    docs = ["The capital of China is Beijing.", "Gravity is a force that attracts two bodies.",
            "Beijing {document} {query} is in the north.", "Paris"]
    try:
        want = [oracle(query, d) for d in docs]
        status, r = post(base, "/v1/rerank", {"query": query, "documents": docs[:3] + [{"text": docs[3]}]})
        check(status == 200, f"{name}: rerank: {status} {r}")
        order = sorted(range(4), key=lambda i: (-want[i][0], i))
        got = r.get("results", [])
        check([x["index"] for x in got] == order, f"{name}: best first: {got} (oracle {want})")
        for x in got:
            i = x["index"]
            diff = abs(x["relevance_score"] - want[i][0])
            worst[0] = max(worst[0], diff)
            check(diff <= 2e-3 and x["document"] == {"text": docs[i]},
                  f"{name}: document {i}: score {x['relevance_score']:.6f}, oracle {want[i][0]:.6f} "
                  f"(|diff| {diff:.2g}), {x.get('document')}")
        n_tokens = sum(n for _, n in want)
        check(r.get("usage") == {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
              f"{name}: usage {r.get('usage')}")
        # top_n and return_documents false: the best two, without their text
        status, r2 = post(base, "/v1/rerank", {"query": query, "documents": docs, "top_n": 2,
                                               "return_documents": False})
        check(status == 200 and [x["index"] for x in r2["results"]] == order[:2] and
              all("document" not in x for x in r2["results"]) and
              [x["relevance_score"] for x in r2["results"]] == [x["relevance_score"] for x in got[:2]],
              f"{name}: top_n 2: {r2}")
        # return_documents null: the default (the documents shown)
        status, r3 = post(base, "/v1/rerank",
                          {"query": query, "documents": docs[:1], "return_documents": None})
        check(status == 200 and r3["results"][0].get("document") == {"text": docs[0]},
              f"{name}: return_documents null: {r3}")
        # /v1/score: one to many, then pairwise; the same scores in the documents' order
        status, s1 = post(base, "/v1/score", {"text_1": query, "text_2": docs})
        by_index = {x["index"]: x["relevance_score"] for x in got}
        check(status == 200 and s1["object"] == "list" and
              [d["index"] for d in s1["data"]] == [0, 1, 2, 3] and
              [d["score"] for d in s1["data"]] == [by_index[i] for i in range(4)], f"{name}: score 1:N {s1}")
        status, s2 = post(base, "/v1/score", {"text_1": [query, "Explain gravity"], "text_2": docs[:2]})
        g = oracle("Explain gravity", docs[1])[0]
        check(status == 200 and s2["data"][0]["score"] == by_index[0] and
              abs(s2["data"][1]["score"] - g) <= 2e-3,
              f"{name}: score N:N {s2} (oracle of the second {g:.6f})")
        # refusals, naming the field
        for path_, body, param in [("/v1/rerank", {"query": query}, "documents"),
                                   ("/v1/rerank", {"query": 3, "documents": ["a"]}, "query"),
                                   ("/v1/rerank", {"query": "a", "documents": ["a", 4]}, "documents[1]"),
                                   ("/v1/rerank", {"query": "a", "documents": []}, "documents"),
                                   ("/v1/rerank", {"query": "a", "documents": ["a"], "top_n": -1}, "top_n"),
                                   ("/v1/rerank", {"query": "a", "documents": ["a"], "rank_fields": ["x"]},
                                    "rank_fields"),
                                   ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_1"),
                                   ("/v1/score", {"text_1": "a", "text_2": "b", "top_n": 1}, "top_n"),
                                   ("/v1/rerank", {"query": "a", "documents": ["b"], "text_2": "c"},
                                    "text_2"),
                                   ("/v1/rerank", {"query": "a", "documents": ["a " * 5000]}, "documents"),
                                   # a query repeats in every pair: 1024 x 8 KB is past the bound, even
                                   # with truncate_prompt_tokens
                                   ("/v1/rerank", {"query": "q" * 8000, "documents": ["a"] * 1024,
                                                   "truncate_prompt_tokens": 8}, "query"),
                                   ("/v1/embeddings", {"input": "a"}, None)]:
            status, err = post(base, path_, body)
            e = err.get("error", {})
            check(status == 400 and e.get("param") == param,
                  f"{name}: {path_} {str(body)[:80]}: {status} {e}")
    except Exception as e:  # the server or the client broke: a failure, with what happened
        check(False, f"{name}: unexpected {type(e).__name__}: {e}")
    finally:
        return finish(check, server, log, log_path)


def tensor(path, tensor_name):
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == tensor_name)
    return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(int(t.shape[1]), -1)


def cls_rows(path):
    return tensor(path, "cls.output.weight")


def yes_no_rows(path):  # the tied output's rows of "yes" and "no"
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.ggml.tokens"]
    vocab = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    return tensor(path, "token_embd.weight")[[vocab.index("yes"), vocab.index("no")]]


rerank_template = gguf.GGUFReader(os.path.join(testdata, "models", "random-qwen3-rerank.gguf")) \
    .fields["tokenizer.chat_template.rerank"].contents()
check(rerank_template != QWEN3, "the file's template is its own")
run(os.path.join(testdata, "models", "random-qwen3-rerank.gguf"), [], rerank_template, cls_rows,
    "llama.cpp's reranker file")
status = run(os.path.join(testdata, "models", "random-qwen3-qknorm.gguf"), ["--pooling", "rank"], QWEN3,
             yes_no_rows, "the LM with --pooling rank")
print(f"rerank: the largest |score - oracle| {worst[0]:.2g}")
sys.exit(status)
