#!/usr/bin/env python3
"""POST /v1/embeddings through the clients RAG stacks use: the openai client's embeddings.create and
LangChain's OpenAIEmbeddings, against `llm serve` on the random qwen3 embedding model (last-token pooling, EOS
appended by its vocabulary), each vector checked against tools/embed_oracle.py's float64 forward.

Usage: tools/embeddings_test.py [TESTDATA_DIR]   (make test runs it with the virtual environment's python)
It starts ./llm serve --matryoshka with default flags otherwise (16-bit activations, f16 KV cache), and
prints "N passed, M failed". The bound: cosine >= 0.9999 and max |diff| <= 1e-3 against the oracle (measured
on the default path: 1 - 5e-8 and 1.1e-4; test.c's "engine pooling" holds the exact path to 1e-5).
"""
import json, os, subprocess, sys, urllib.request

import numpy as np
import openai
from langchain_openai import OpenAIEmbeddings

import embed_oracle
from serve_port import Checks, finish, listening_port

testdata = sys.argv[1] if len(sys.argv) > 1 else "testdata"
model_path = os.path.join(testdata, "models", "random-qwen3-embed.gguf")
log_path = "llm-test-embeddings.log"
check = Checks("embeddings")
EOS = 151645  # the vocabulary's EOS, which its add_eos_token puts after every text



m = embed_oracle.load(model_path)
log = open(log_path, "w")
server = subprocess.Popen(["./llm", "serve", "-m", model_path, "--port", "0", "--matryoshka"], stderr=log)
port = listening_port(server, log_path, 30)
check(port is not None, "the server starts")
base = f"http://127.0.0.1:{port}"


def ids_of(text):
    """The text's ids as the server tokenizes it (its /tokenize), and EOS after them"""
    req = urllib.request.Request(base + "/tokenize", json.dumps({"prompt": text}).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))["tokens"] + [EOS]


oracle = {}  # (text, dimensions): its vector, computed once


def close(got, text, what, dimensions=None):
    if (text, dimensions) not in oracle:
        oracle[text, dimensions] = embed_oracle.embed(m, ids_of(text), "last", dimensions)
    want = oracle[text, dimensions]
    got = np.asarray(got, dtype=np.float64)
    cos = float(got @ want / np.linalg.norm(got)) if got.shape == want.shape else 0.0
    diff = float(np.abs(got - want).max()) if got.shape == want.shape else 1e9
    check(cos >= 0.9999 and diff <= 1e-3, f"{what} {text!r}: cosine {cos:.9f}, max diff {diff:.2g}")


texts = ["Hello world", "The quick brown fox jumps over the lazy dog.", "Embeddings in a vector database"]
try:
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
    # the client's default asks for base64 and decodes it; float asks for the numbers: the same vectors
    r64 = client.embeddings.create(model="random-qwen3-embed", input=texts)
    rf = client.embeddings.create(model="random-qwen3-embed", input=texts, encoding_format="float")
    check([d.index for d in r64.data] == [0, 1, 2] and r64.object == "list" and
          r64.model == "random-qwen3-embed", f"the list: {r64}")
    check(r64.usage.prompt_tokens == r64.usage.total_tokens == sum(len(ids_of(t)) for t in texts),
          f"usage: {r64.usage}")
    check(all(np.array_equal(np.float32(a.embedding), np.float32(b.embedding))
              for a, b in zip(r64.data, rf.data)), "base64 and float: the same float32 values")
    for d, t in zip(r64.data, texts): close(d.embedding, t, "embeddings.create")
    # Matryoshka: the first 8 values, normalised again
    r8 = client.embeddings.create(model="random-qwen3-embed", input=texts[0], dimensions=8)
    check(len(r8.data[0].embedding) == 8, f"dimensions 8: {r8}")
    close(r8.data[0].embedding, texts[0], "dimensions 8", 8)
    # token ids as input: the same vector as the text
    rid = client.embeddings.create(model="random-qwen3-embed", input=[ids_of(texts[0])],
                                   encoding_format="float")
    check(rid.data[0].embedding == rf.data[0].embedding, "ids: the same vector as the text")
    try:
        client.embeddings.create(model="random-qwen3-embed", input="x", dimensions=64)
        check(False, "dimensions 64 (over the model's 32) was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.param == "dimensions" and "between 1 and 32" in e.message,
              f"BadRequestError: {e}")
    # LangChain, as a RAG stack calls it (check_embedding_ctx_length=False: the default tokenizes with
    # tiktoken, which downloads its vocabulary)
    lc = OpenAIEmbeddings(model="random-qwen3-embed", base_url=base + "/v1", api_key="none",
                          check_embedding_ctx_length=False)
    docs = lc.embed_documents(texts)
    check(len(docs) == 3, f"embed_documents: {len(docs)} vectors")
    for v, t in zip(docs, texts): close(v, t, "LangChain embed_documents")
    close(lc.embed_query(texts[1]), texts[1], "LangChain embed_query")
except Exception as e:  # the server or the client broke: a failure, with what happened
    check(False, f"unexpected {type(e).__name__}: {e}")
finally:
    status = finish(check, server, log, log_path)
sys.exit(status)
