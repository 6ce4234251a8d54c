#!/usr/bin/env python3
"""make-corpus.py - seed inputs for the libFuzzer targets in fuzz/ (python3, standard library only).

usage: python3 fuzz/make-corpus.py [--testdata DIR] [--out DIR] [TARGET...]

Writes fuzz/corpus/<target>/ for gguf, tokenizer, engine, json, http and grammar (all of them when no target is
named; files already there stay). The GGUF seeds are small files made here by a tiny GGUF
writer (a SentencePiece vocabulary, byte-level BPE ones, every metadata type, every tensor type, a model of
stories260K's shape with tiny weights), plus stories260K's metadata rewritten without its tensors and the
first 16 KiB of the real file when DIR (the test data, testdata/ by default) has it. libFuzzer adds
what it finds to the same folders.
"""
import argparse
import hashlib
import json
import os
import random
import struct
import sys

# ---------------------------------------------------------------------------------------------------------
# GGUF: a small writer (version 3, little-endian), enough for valid files with any key types and tensors
# ---------------------------------------------------------------------------------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
              U64: "<Q", I64: "<q", F64: "<d"}
F32_T, F16_T, Q4_0_T, Q4_1_T, Q8_0_T, Q4_K_T, Q6_K_T, BF16_T = 0, 1, 2, 3, 8, 12, 14, 30
BLOCK = {F32_T: (4, 1), F16_T: (2, 1), BF16_T: (2, 1), Q8_0_T: (34, 32), Q4_0_T: (18, 32), Q4_1_T: (20, 32),
         Q4_K_T: (144, 256), Q6_K_T: (210, 256)}  # type: (bytes per block, values per block)


def gguf_str(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def gguf_value(vtype, value):
    if vtype == STRING:
        return gguf_str(value)
    if vtype == ARRAY:
        etype, items = value
        out = struct.pack("<IQ", etype, len(items))
        return out + b"".join(gguf_value(etype, v) for v in items)
    return struct.pack(SCALAR_FMT[vtype], value)


def gguf_file(kvs, tensors=(), alignment=32, version=3):
    """kvs: [(key, type, value)]; tensors: [(name, shape innermost first, dtype, data bytes or None)]"""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)))
    for key, vtype, value in kvs:
        out += gguf_str(key) + struct.pack("<I", vtype) + gguf_value(vtype, value)
    offset, datas = 0, []
    for name, shape, dtype, data in tensors:
        bb, bv = BLOCK[dtype]
        n = 1
        for d in shape:
            n *= d
        size = n // bv * bb
        if data is None:
            data = bytes((i * 37 + 11) & 0x3F for i in range(size))  # small values whatever the type
        assert len(data) == size, (name, len(data), size)
        out += gguf_str(name) + struct.pack("<I", len(shape)) + struct.pack("<%dQ" % len(shape), *shape)
        out += struct.pack("<IQ", dtype, offset)
        datas.append((offset, data))
        offset += (size + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    base = len(out)
    for off, data in datas:
        out += b"\0" * (base + off - len(out)) + data
    return bytes(out)


def f16_bytes(values):
    return b"".join(struct.pack("<e", v) for v in values)


def f32_bytes(values):
    return b"".join(struct.pack("<f", v) for v in values)


# ---- vocabularies ----------------------------------------------------------------------------------------
NORMAL, UNKNOWN, CONTROL, USER, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def spm_vocab(n_pieces=40):
    """A SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then pieces with scores."""
    toks, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [UNKNOWN, CONTROL, CONTROL]
    for b in range(256):
        toks.append("<0x%02X>" % b); scores.append(0.0); types.append(BYTE)
    pieces = ["\u2581", "\u2581t", "he", "\u2581the", "\u2581a", "in", "\u2581H", "ello", "\u2581Hello",
              "\u2581w", "or", "ld", "\u2581world", "!", ",", ".", "\u2581\u2581", "\u00e9", "t\u00e9",
              "\u4e2d", "\u6587", "\u2581Once", "\u2581upon", "\u2581time", "\u2581there", "\u2581was",
              "\u2581a",
              "\u2581little", "\u2581girl", "\u2581Lily", "<|im_start|>", "<|im_end|>", "[INST]", "[/INST]"]
    for i, p in enumerate(pieces[:n_pieces]):
        toks.append(p); scores.append(-1.0 - i * 0.25)
        types.append(CONTROL if p.startswith("<|") else USER if p.startswith("[") else NORMAL)
    toks.append("<unused0>"); scores.append(0.0); types.append(UNUSED)
    return toks, scores, types


def gpt2_byte_chars():
    """GPT-2's printable stand-in for each byte."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bpe_vocab(specials):
    """A byte-level BPE vocabulary: the 256 byte tokens, a few merges, then special tokens."""
    bc = gpt2_byte_chars()
    toks = [bc[b] for b in range(256)]
    sp = bc[ord(" ")]
    merges = [(sp, "t"), ("h", "e"), (sp + "t", "he"), (sp, "a"), ("i", "n"), (sp, "w"), ("o", "r"),
              ("l", "d"), (sp + "w", "or"), (sp + "wor", "ld"), ("H", "e"), ("l", "l"), ("He", "ll"),
              ("Hell", "o"), ("\u010a", "\u010a"), (sp, sp), ("\u00c3", "\u00a9")]
    for a, b in merges:
        if a + b not in toks:
            toks.append(a + b)
    types = [NORMAL] * len(toks)
    for s in specials:
        toks.append(s); types.append(CONTROL)
    return toks, types, ["%s %s" % m for m in merges]


def spm_kvs(with_template=True):
    toks, scores, types = spm_vocab()
    kvs = [("general.architecture", STRING, "llama"), ("general.name", STRING, "fuzz-spm"),
           ("tokenizer.ggml.model", STRING, "llama"),
           ("tokenizer.ggml.tokens", ARRAY, (STRING, toks)),
           ("tokenizer.ggml.scores", ARRAY, (F32, scores)),
           ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
           ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
           ("tokenizer.ggml.unknown_token_id", U32, 0), ("tokenizer.ggml.add_bos_token", BOOL, True),
           ("tokenizer.ggml.add_space_prefix", BOOL, True)]
    if with_template:
        kvs.append(("tokenizer.chat_template", STRING,
                    "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"))
    return kvs


def bpe_kvs(pre, specials, template):
    toks, types, merges = bpe_vocab(specials)
    kvs = [("general.architecture", STRING, "qwen2" if pre == "qwen2" else "llama"),
           ("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, pre),
           ("tokenizer.ggml.tokens", ARRAY, (STRING, toks)),
           ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
           ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
           ("tokenizer.ggml.bos_token_id", U32, len(toks) - len(specials)),
           ("tokenizer.ggml.eos_token_id", U32, len(toks) - len(specials) + 1)]
    if template:
        kvs.append(("tokenizer.chat_template", STRING, template))
    return kvs, len(toks)


def model_tensors(vocab, dim=8, layers=1, heads=2, kv_heads=1, ffn=16, dtype=F32_T, bias=False):
    """The tensors of a tiny llama-shaped model (shapes innermost first, as GGUF stores them)."""
    hd = dim // heads
    t = [("token_embd.weight", (dim, vocab), dtype, None), ("output_norm.weight", (dim,), F32_T, None)]
    for i in range(layers):
        p = "blk.%d." % i
        t += [(p + "attn_norm.weight", (dim,), F32_T, None),
              (p + "attn_q.weight", (dim, heads * hd), dtype, None),
              (p + "attn_k.weight", (dim, kv_heads * hd), dtype, None),
              (p + "attn_v.weight", (dim, kv_heads * hd), dtype, None),
              (p + "attn_output.weight", (heads * hd, dim), dtype, None),
              (p + "ffn_norm.weight", (dim,), F32_T, None), (p + "ffn_gate.weight", (dim, ffn), dtype, None),
              (p + "ffn_down.weight", (ffn, dim), dtype, None),
              (p + "ffn_up.weight", (dim, ffn), dtype, None)]
        if bias:
            t += [(p + "attn_q.bias", (heads * hd,), F32_T, None),
                  (p + "attn_k.bias", (kv_heads * hd,), F32_T, None),
                  (p + "attn_v.bias", (kv_heads * hd,), F32_T, None)]
    return t


def model_kvs(arch, dim=8, layers=1, heads=2, kv_heads=1, ffn=16, ctx=64):
    return [("%s.embedding_length" % arch, U32, dim), ("%s.block_count" % arch, U32, layers),
            ("%s.attention.head_count" % arch, U32, heads),
            ("%s.attention.head_count_kv" % arch, U32, kv_heads),
            ("%s.feed_forward_length" % arch, U32, ffn), ("%s.context_length" % arch, U32, ctx),
            ("%s.attention.layer_norm_rms_epsilon" % arch, F32, 1e-5),
            ("%s.rope.freq_base" % arch, F32, 10000.0)]


def read_kvs(path):
    """The metadata of a real GGUF file, as [(key, type, value)] (tensors left out)."""
    with open(path, "rb") as f:
        data = f.read(1 << 20)
    off = 24

    def rd(fmt):
        nonlocal off
        v = struct.unpack_from(fmt, data, off)
        off += struct.calcsize(fmt)
        return v[0]

    def rstr():
        nonlocal off
        n = rd("<Q")
        s = data[off:off + n]
        off += n
        return s

    def rval(t):
        if t == STRING:
            return rstr()
        if t == ARRAY:
            et, n = rd("<I"), rd("<Q")
            return (et, [rval(et) for _ in range(n)])
        return rd(SCALAR_FMT[t])

    n_kv = struct.unpack_from("<Q", data, 16)[0]
    kvs = []
    for _ in range(n_kv):
        key = rstr().decode("utf-8")
        t = rd("<I")
        kvs.append((key, t, rval(t)))
    return kvs


def gguf_seeds(testdata):
    seeds = {}
    spm = spm_kvs()
    seeds["spm-vocab"] = gguf_file(spm)
    seeds["spm-no-types-no-scores"] = gguf_file([kv for kv in spm if kv[0] not in
                                                 ("tokenizer.ggml.token_type", "tokenizer.ggml.scores")])
    llama3 = "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    kvs, _ = bpe_kvs("llama-bpe", ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                                    "<|start_header_id|>", "<|end_header_id|>"], llama3)
    seeds["bpe-llama3-vocab"] = gguf_file(kvs)
    kvs, _ = bpe_kvs("qwen2", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                     "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n")
    seeds["bpe-qwen2-vocab"] = gguf_file(kvs)
    kvs, _ = bpe_kvs("gpt2", ["<|endoftext|>"], None)
    seeds["bpe-gpt2-vocab"] = gguf_file(kvs, version=2)
    # every metadata type, as a scalar and as an array, and odd alignments
    every = [("u8", U8, 200), ("i8", I8, -100), ("u16", U16, 60000), ("i16", I16, -30000),
             ("u32", U32, 4000000000),
             ("i32", I32, -2000000000), ("f32", F32, 1.5), ("bool", BOOL, True),
             ("str", STRING, "h\u00e9llo"),
             ("u64", U64, 1 << 63), ("i64", I64, -(1 << 62)), ("f64", F64, -2.25)]
    arrays = [("arr.%s" % k, ARRAY, (t, [v, v])) for k, t, v in every]
    seeds["every-type"] = gguf_file(every + arrays + [("general.alignment", U32, 64)], alignment=64)
    seeds["every-tensor-type"] = gguf_file(
        [("general.alignment", U32, 16)],
        [("f32", (4, 2), F32_T, f32_bytes([1, -2, 0.5, 3, 0, 1e-3, -1e3, 7])),
         ("f16", (8,), F16_T, f16_bytes([1, -2, 0.5, 3, 0, 1e-3, -1e3, 7])), ("bf16", (8,), BF16_T, None),
         ("q8_0", (32, 2), Q8_0_T, None), ("q4_0", (32,), Q4_0_T, None), ("q4_1", (64,), Q4_1_T, None),
         ("q4_K", (256,), Q4_K_T, None), ("q6_K", (256,), Q6_K_T, None), ("4d", (1, 2, 1, 2), F32_T, None)],
        alignment=16)
    # whole tiny models: vocabulary, config and weights that bind
    _, _, vocab_types = spm_vocab()
    n_spm = len(vocab_types)
    seeds["model-llama-spm"] = gguf_file(spm + model_kvs("llama"), model_tensors(n_spm))
    seeds["model-llama-spm-f16"] = gguf_file(spm + model_kvs("llama", layers=2),
                                             model_tensors(n_spm, layers=2, dtype=F16_T))
    seeds["model-llama-q8"] = gguf_file(spm + model_kvs("llama", dim=32, heads=4, kv_heads=2, ffn=32),
                                        model_tensors(n_spm, dim=32, heads=4, kv_heads=2, ffn=32,
                                                      dtype=Q8_0_T))
    kvs, n_bpe = bpe_kvs("qwen2", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None)
    seeds["model-qwen2-bpe"] = gguf_file(kvs + model_kvs("qwen2"), model_tensors(n_bpe, bias=True))
    stories = os.path.join(testdata, "models", "stories260K.gguf")
    if os.path.exists(stories):
        seeds["stories260K-metadata"] = gguf_file(read_kvs(stories))
        with open(stories, "rb") as f:
            seeds["stories260K-first-16k"] = f.read(16384)
    else:
        print("make-corpus.py: %s is missing: no seeds from it" % stories, file=sys.stderr)
    seeds["empty-v3"] = gguf_file([])
    seeds["truncated"] = gguf_file(spm)[:300]
    return seeds


# ---------------------------------------------------------------------------------------------------------
# the other targets
# ---------------------------------------------------------------------------------------------------------
TEXTS = [
    "Hello world", " Hello  world!\n", "Once upon a time, there was a little girl named Lily.",
    "h\u00e9llo w\u00f6rld \u00e7a va?", "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4",
    "emoji \U0001F600\U0001F44D\U0001F3FD and \u200d joiners", "<s>Hello</s>",
    "<|begin_of_text|>Hi<|eot_id|>",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "[INST] hi [/INST]",
    "   leading spaces\t\ttabs\r\n\r\nnewlines", "numbers 1234567890 3.14159 -42", "don't I'll we've they're",
    "\u2581already \u2581 spm spaces", "",
]


def tokenizer_seeds():
    seeds = {}
    for i, text in enumerate(TEXTS):
        b = text.encode("utf-8")
        # flags: vocabulary bit 0, special tokens bit 1, BOS bit 2, detokenize with control text bit 3
        for flags in (0x00, 0x01, 0x03, 0x06, 0x0B, 0x0E):
            seeds["text%02d-flags%02x" % (i, flags)] = bytes([flags]) + b
    seeds["invalid-utf8"] = b"\x01abc\xff\xfe\xc3(\xe2\x82\xf0\x9f\x98 \xed\xa0\x80\xc0\xaf"
    seeds["invalid-utf8-spm"] = b"\x08abc\xff\xfe\xc3(\xe2\x82\xf0\x9f\x98 \xed\xa0\x80\xc0\xaf"
    # raw ids (flags bits 4-5 both set): some ordinary, control tokens, byte tokens that split a character
    for vocab in (0, 1):
        ids = [1, 15043, 3186, 2, 0, 227, 162, 131, 32000, 31999] if vocab == 0 else \
              [128000, 9906, 1917, 128009, 126, 223, 1, 128255, 127999, 5]
        seeds["ids-vocab%d" % vocab] = bytes([0x38 | vocab]) + b"".join(struct.pack("<I", i) for i in ids)
    return seeds


def engine_seeds():
    rng = random.Random(1234)
    seeds = {}
    for i in range(24):
        seeds["random%02d" % i] = bytes(rng.randrange(256) for _ in range(rng.randrange(8, 160)))
    # hand-made: engine, request count, then per request: on, on2, n, max_tokens, seed(4) ...
    seeds["greedy-ids"] = bytes([0, 0, 0, 1, 0, 7, 1, 0, 0, 0, 0, 8] + [5, 0, 6, 0, 7, 0, 8, 0] * 4 +
                                [0, 4, 0])
    seeds["four-requests-tight"] = bytes([1, 3] + [0xFF, 0x1F, 3, 15, 9, 9, 9, 9] * 12 + list(range(200)))
    seeds["text-prompts"] = bytes([0, 1, 0, 2, 1, 5, 0, 0, 0, 0, 2, 5, 20]) + b"Once upon a time" + bytes(8)
    return seeds


JSON_DOCS = [
    {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0},
    {"model": "m", "prompt": ["a", "b"], "n": 2, "stop": ["\n", "."], "logprobs": 2, "echo": True,
     "stream": True, "stream_options": {"include_usage": True}, "seed": 42},
    {"model": "m", "prompt": [1, 2, 3, 4], "top_p": 0.9, "top_k": 40, "min_p": 0.05,
     "repetition_penalty": 1.1, "presence_penalty": -0.5, "frequency_penalty": 1.5e-1},
    {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                {"role": "user",
                                 "content": [{"type": "text", "text": "Hi \u00e9\U0001F600"}]}],
     "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 3, "stop_token_ids": [2, 13]},
    {"prompt": "x", "max_tokens": None, "user": "u\u0000v", "extra": [[[[]]], {}, -0.0, 1e308, 5e-324]},
]
JSON_RAW = [
    '{"a":"\\ud83d\\ude00\\u00e9\\n\\t\\"\\\\\\/\\b\\f\\r"}', "[1, -2.5e+10, 0.000001, -0, 1E400]",
    '{"a":1,"a":2}', "  true  ", "null", '"\\ud800"', "[" * 70 + "]" * 70, '{"k" "v"}', "[1,]", "01",
    '"\xff"',
    # past the reader's nesting limit (64): arrays, objects, both
    "[" * 100 + "]" * 100, '{"a":' * 100 + "1" + "}" * 100, '[{"a":' * 40 + "[]" + "}]" * 40,
]


def json_seeds():
    seeds = {}
    for i, d in enumerate(JSON_DOCS):
        seeds["request%d" % i] = json.dumps(d, ensure_ascii=i % 2 == 0).encode("utf-8")
    for i, t in enumerate(JSON_RAW):
        seeds["raw%02d" % i] = t.encode("latin-1" if "\xff" in t else "utf-8")
    return seeds


def http_seeds():
    """fuzz_http: a byte choosing where reads end (pieces of 1 to it + 1 bytes), then what a client sent"""
    body = json.dumps(JSON_DOCS[0]).encode()
    get = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer sk-test\r\n\r\n"
    post = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body
    chunked = (b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
               b"Expect: 100-continue\r\n\r\n"
               b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\n")
    te = (b"POST /tokenize HTTP/1.1\r\nContent-Type: application/json; charset=utf-8\r\n"
          b"Transfer-Encoding: chunked\r\n\r\n")
    seeds = {
        "get": get, "post": post, "chunked": chunked,
        "pipelined": get + post + chunked + b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        "http10-close": b"GET /metrics?x=1 HTTP/1.0\r\nConnection: close\r\n\r\n",
        "incomplete-body": b"POST /tokenize HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"prompt\":",
        "bad-cl": b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        "te-gzip": b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        "bare-lf-chunks": te + b"3\nabc\n0\n\n",
        "cl-and-te": b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "smuggle": te + b"2a\r\n0\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n\r\n0\r\n\r\n"
                        b"GET /health HTTP/1.1\r\n\r\n",
        "extensions-trailers": te + b"1A;a=b;c=\"d e\"\r\n" + b"x" * 26 +
                               b"\r\n00000003 ;q\r\nabc\r\n0;last\r\nX-One: 1\r\nX-Two:\t2 \r\n\r\n",
        "obs-fold": b"GET /health HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n",
        "space-colon": b"GET /health HTTP/1.1\r\nHost : x\r\n\r\n",
        "leading-crlf": b"\r\n\r\nGET http://example.com/health?x HTTP/1.1\r\n"
                        b"Connection: keep-alive, Upgrade\r\n\r\n",
        "cors-preflight": b"OPTIONS /v1/completions HTTP/1.1\r\nOrigin: http://a.example\r\n"
                          b"Access-Control-Request-Method: POST\r\n"
                          b"Access-Control-Request-Headers: content-type\r\n\r\n",
        "huge-chunk": te + b"7fffffffffffffff\r\n",
        "long-extension": te + b"1;" + b"e" * 5000 + b"\r\nx\r\n0\r\n\r\n",
    }
    # each with a byte choosing its reads: one byte at a time (0), up to 8 bytes (7), up to 256 (255)
    return {"%s-%d" % (name, cut): bytes([cut]) + data
            for name, data in seeds.items() for cut in (0, 7, 255)}


def grammar_seeds():
    """fuzz_grammar: a mode byte, then GBNF (and a NUL and text to match), a JSON Schema, a regex or choices"""
    json_gbnf = (b'root ::= object\nvalue ::= object | array | string | number | "true" | "false" | "null"\n'
                 b'object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}"\n'
                 b'array ::= "[" ws ( value ("," ws value)* )? "]"\n'
                 b'string ::= "\\"" ( [^"\\\\\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\\""\n'
                 b'number ::= "-"? [0-9]+ ("." [0-9]+)?\nws ::= [ \\t\\n]{0,4}\n')
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
              "n": {"type": "integer", "minimum": -5, "maximum": 120}, "tags": {"type": "array", "items":
              {"enum": ["a", "b"]}, "maxItems": 2}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
              "d": {"type": "string", "format": "date"}, "p": {"type": "string", "pattern": "^[A-Z]{2}-\\d+$"}},
              "required": ["name", "n"], "additionalProperties": {"type": "boolean"}}
    deep = {
        "gbnf-json": b"\x00" + json_gbnf + b"\x00" + b'{"a": [1, -2.5, "x\\u00e9"], "b": {}}',
        "gbnf-repeat": b"\x00" + b'root ::= ("a" [bc]{1,3} "d"?){2,4} [^\\n]* .\n' + b"\x00abcdacbd\xc3\xa9!",
        "gbnf-bad": b"\x00" + b"root ::= root \"x\" | [",
        "schema": b"\x01" + json.dumps(schema).encode(),
        "schema-allof": b"\x01" + json.dumps({"allOf": [{"properties": {"a": {}}, "additionalProperties": False},
                                                        {"properties": {"a": {"type": "integer"}}}]}).encode(),
        "regex": b"\x02" + b"(?:[a-f0-9]{2}:){5}[a-f0-9]{2}|\\(\\d{3}\\) \\w+?\\s*$",
        "choices": b"\x03" + "yes\nno\nmaybe \"so\"\n\u00e9t\u00e9".encode(),
    }
    # deep inputs that reach the limits (fuzz_grammar.c sets them low): nesting, chains of rules and of $refs,
    # rules that fan out, too many rules; schemas that loop through allOf; long names; choices that share
    # beginnings (a trie); tools whose parameters use $defs and $ref
    pydantic = {"$defs": {"Pet": {"properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"],
                                  "type": "object", "additionalProperties": False}},
                "properties": {"name": {"type": "string", "maxLength": 8},
                               "pets": {"items": {"$ref": "#/$defs/Pet"}, "type": "array"}},
                "required": ["name", "pets"], "type": "object"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": pydantic}}]
    ref_chain = {"$ref": "#/$defs/a0", "$defs": dict(("a%d" % i, {"$ref": "#/$defs/a%d" % (i + 1)})
                                                     for i in range(80))}
    ref_chain["$defs"]["a80"] = {"enum": ["ok"]}
    deep.update({
        "gbnf-nested": b"\x00root ::= " + b"(" * 1500 + b'"a"' + b")" * 1500 + b"\x00a",
        "gbnf-nested-after": b"\x00root ::= " + b"(" * 600 + b'"a"' + b') "b"' * 600 + b"\x00ab",
        "gbnf-chain": b"\x00root ::= r0\n" + b"".join(b"r%d ::= r%d\n" % (i, i + 1) for i in range(250)) +
                      b'r250 ::= "z"\x00z',
        "gbnf-nullable-chain": b"\x00root ::= r0 \"q\"\n" + b"".join(b"r%d ::= r%d\n" % (i, i + 1)
                                                                     for i in range(250)) + b'r250 ::= "" | "z"',
        "gbnf-left-chain": b"\x00root ::= r0\n" + b"".join(b"r%d ::= r%d\n" % (i, i + 1) for i in range(250)) +
                           b'r250 ::= root "z"',
        "gbnf-fanout": b"\x00root ::= r0\n" + b"".join(b"r%d ::= r%d | r%d\n" % (i, i + 1, i + 1)
                                                       for i in range(30)) + b'r30 ::= "z"',
        "gbnf-rules": b'\x00root ::=' + b' "a"{0,1000}' * 3,
        "gbnf-stacks": b'\x00root ::= ' + b'|'.join([b'"a"'] * 600) + b"\x00a",
        "schema-rules": b"\x01" + json.dumps({"properties": dict(("%d" % i, {}) for i in range(340))},
                                             separators=(",", ":")).encode(),
        "schema-ref-chain": b"\x01" + json.dumps(ref_chain).encode(),
        "schema-allof-loop": b"\x01" + json.dumps({"properties": {"x": {"allOf": [{"$ref": "#"},
                                                                                  {"type": "object"}]}}}).encode(),
        "schema-allof-self": b"\x01" + json.dumps({"allOf": [{"$ref": "#"}, {"type": "object"}]}).encode(),
        "schema-long-name": b"\x01" + json.dumps({"properties": {"k" * 300: {}}, "additionalProperties": True}).encode(),
        "schema-enum": b"\x01" + json.dumps({"enum": ["value-%d" % i for i in range(300)] + [1, None]}).encode(),
        "regex-nested": b"\x02" + b"(" * 100 + b"a" + b")" * 100,
        "choices-trie": b"\x03" + b"\n".join(b"the same beginning, then %d" % i for i in range(16)),
        "tools-defs": b"\xf0" + json.dumps(tools).encode(),
    })
    assert all(len(v) <= 4096 for v in deep.values()), [k for k, v in deep.items() if len(v) > 4096]
    return deep


TARGETS = {"gguf": None, "tokenizer": tokenizer_seeds, "engine": engine_seeds, "json": json_seeds,
           "http": http_seeds, "grammar": grammar_seeds}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="seed corpora for the fuzz targets")
    default_testdata = os.environ.get("LLM_TESTDATA", os.path.join(here, "..", "testdata"))
    ap.add_argument("--testdata", default=default_testdata)
    ap.add_argument("--out", default=os.path.join(here, "corpus"))
    ap.add_argument("targets", nargs="*", default=list(TARGETS))
    args = ap.parse_args()
    for target in args.targets:
        if target not in TARGETS:
            sys.exit("make-corpus.py: unknown target '%s' (targets: %s)" % (target, ", ".join(TARGETS)))
        seeds = gguf_seeds(args.testdata) if target == "gguf" else TARGETS[target]()
        folder = os.path.join(args.out, target)
        os.makedirs(folder, exist_ok=True)
        for name, data in seeds.items():  # named by content, as libFuzzer names what it adds
            path = os.path.join(folder, "seed-%s-%s" % (name, hashlib.sha1(data).hexdigest()[:12]))
            with open(path, "wb") as f:
                f.write(data)
        print("make-corpus.py: %d seeds in %s" % (len(seeds), folder))


if __name__ == "__main__":
    main()
