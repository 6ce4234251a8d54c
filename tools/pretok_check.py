#!/usr/bin/env python3
"""pretok_check.py - llm.h's hand-written pre-tokenizers against llama.cpp's split patterns run by Python's
regex.

llama.cpp (src/llama-vocab.cpp) maps each tokenizer.ggml.pre name to a list of regexes: the first cuts the
text into its matches and the text between them, each later one cuts each of those pieces again. PATTERNS
below are those lists, written as llama.cpp writes them (its adapted forms, e.g. (?i:'s|...) spelled
'[sS]|...), and NAMES every name it maps, with the pattern llama.cpp gives it, or None where llm.h falls back
to 'default' with a warning (vocabularies that are not byte-level BPE). Where llama.cpp runs its own code
instead of a regex, the pattern is the regex that code stands for: the model's published one (kimi-k2) or what
the code computes (afmoe).

For each name this script asks `llm-test --split NAME` how llm.h splits a few thousand generated strings
(seeded: the same every run; letters of each case, digits, punctuation, white space runs, CJK and other Asian
scripts, emoji, combining marks, chameleon's image tokens, invalid UTF-8, which both sides read as U+FFFD) and
compares the word boundaries with the regexes' exactly. It prints how many strings each pattern was checked on
and fails on the first disagreement of each name.

.venv/bin/python tools/pretok_check.py [./llm-test] [--strings N]
"""
import random
import subprocess
import sys

import regex

CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = (CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CASED = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
CASED_UPPER = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
ASCII_PUNCT_WORD = r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
HAN_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"                    # [一-龥぀-ゟ゠-ヿ]+
HAN_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"                  # [一-龥ࠀ-一가-퟿]+
# deepseek-llm's letters, escaped: some of them (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A) are what
# Unicode normalization replaces, which a copy of the text of llama.cpp's regex through an editor does
DEEPSEEK_LETTERS = ("A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
                    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
                    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
                    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
                    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
                    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
                    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
                    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
                    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
                    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
                    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
                    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
                    "\U000118a0-\U000118df\U0001e900-\U0001e943")
UPPER, LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
CASED_LETTERS = (r"[^\r\n\p{L}\p{N}]?" + UPPER + "*" + LOWER + "+" + CONTRACTIONS + "?"
                 r"|[^\r\n\p{L}\p{N}]?" + UPPER + "+" + LOWER + "*" + CONTRACTIONS + "?")
# ?[^(\s|.,!?…。，、।۔،)]+
BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"

PATTERNS = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
    "gpt2": [GPT2],
    "llama3": [LLAMA3],
    "qwen2": [QWEN2],
    "starcoder": [r"\p{N}", GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
    "deepseek-coder": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", HAN_HANGUL, r"\p{N}"],
    "deepseek-v3": [r"\p{N}{1,3}", HAN_KANA,
                    ASCII_PUNCT_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "spark2_5": [r"\p{N}{1,3}", HAN_KANA,
                 ASCII_PUNCT_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]"
                 r"|\s+(?!\S)|\s+", r"\p{N}"],
    "jais-2": [CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
               r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"],
    "qwen35": [CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "bloom": [BLOOM],
    "viking": [BLOOM, r"\p{N}"],
    "tekken": [CASED + "|" + CASED_UPPER + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "gpt-4o": [CASED + CONTRACTIONS + "?|" + CASED_UPPER + CONTRACTIONS + "?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "granite-embed-multi-97m": [
        (CASED + CONTRACTIONS + "?|" + CASED_UPPER + CONTRACTIONS + "?").replace(r"(?=[\p{L}])",
                                                                                 r"(?=[\p{L}\p{M}])")
        + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "superbpe": [r"\p{N}+", r"(?=(\d{3})+(?!\d))"],
    "bailingmoe": [r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"],
    "seed-coder": [CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+"],
    "ufakzeka": [r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "laguna": [r"[^\n]+|[\n]+", QWEN2],
    "exaone-moe": [CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"],
    "deepseek-llm": ["[\r\n]", r"\s?[" + DEEPSEEK_LETTERS + "]+",
                     "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", r"\s+$", HAN_HANGUL,
                     r"\p{N}+"],
    # [가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+
    "youtu": ["[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c"
              "\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|" + HAN_KANA,
              CASED_LETTERS + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "tiny_aya": [r"\d{1,3}(?=(?:\d{3})*\b)",
                 CASED_LETTERS + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    # tokenization_kimi.py's (&& needs regex's version 1); llama.cpp's own code for it takes letters of either
    # case alike, and no marks
    "kimi-k2": [r"(?V1)[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
                r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+" + CONTRACTIONS + "?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
                r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*" + CONTRACTIONS
                + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    # \p{AFMoE_digits} is llama.cpp's own code (unicode_regex_split_custom_afmoe): a run of \p{N} cut in
    # threes from its end, which is this regex
    "afmoe": [r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))",
              "[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf"
              "\u0e00-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af"
              "\u1100-\u11ff]+",
              ASCII_PUNCT_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+"],
    "chameleon": [r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                  r"[\p{P}!-/:-@\[-`{-~]", GPT2],
    "minicpm5": [r"\p{N}{1,3}", CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+"],
}

# every tokenizer.ggml.pre name llama.cpp maps, with the pattern it gets there; None: llm.h warns and splits
# as 'default': the vocabularies whose words llama.cpp hands to BPE as raw UTF-8 (byte_encode = false), not
# byte-level BPE: gemma4 and granite-embed-multi-311m (one pattern in llama.cpp) and sarvam-moe
# (SentencePiece vocabularies written as BPE, spaces as U+2581), and whitespace (\S+)
NAMES = {}
for pattern, names in [
    ("default", "default"),
    ("llama3", "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano dbrx "
               "smaug-bpe glm4 chatglm-bpe"),
    ("gpt2", "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
             "jina-v1-en jina-v2-code roberta-bpe mpt olmo jais trillion granite-docling exaone4"),
    ("qwen2", "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open grok-2"),
    ("starcoder", "starcoder refact command-r smollm codeshell exaone minerva-7b mellum2"),
    ("falcon", "falcon"), ("deepseek-coder", "deepseek-coder"),
    ("deepseek-v3", "deepseek-v3 hunyuan-dense hy_v4 joyai-llm"), ("spark2_5", "spark2_5"),
    ("jais-2", "jais-2"), ("qwen35", "qwen35"), ("bloom", "bloom gpt3-finnish poro-chat"),
    ("viking", "viking"), ("tekken", "tekken"), ("gpt-4o", "gpt-4o llama4 kanana2 talkie minimax-m2"),
    ("granite-embed-multi-97m", "granite-embed-multi-97m"), ("superbpe", "superbpe"),
    ("bailingmoe", "bailingmoe bailingmoe2 llada-moe"), ("seed-coder", "seed-coder"),
    ("ufakzeka", "ufakzeka"), ("laguna", "laguna"), ("exaone-moe", "exaone-moe"), ("minicpm5", "minicpm5"),
    ("deepseek-llm", "deepseek-llm"), ("youtu", "youtu"), ("tiny_aya", "tiny_aya cohere2moe"),
    ("kimi-k2", "kimi-k2"), ("afmoe", "afmoe"), ("chameleon", "chameleon"),
    (None, "gemma4 granite-embed-multi-311m sarvam-moe whitespace"),
]:
    for name in names.split():
        NAMES[name] = pattern


def pool():
    """Characters (and short strings) to draw from, by kind."""
    r = lambda lo, hi: [chr(c) for c in range(lo, hi + 1)]
    return {
        "ascii letters": r(0x41, 0x5A) + r(0x61, 0x7A),
        "digits": r(0x30, 0x39) + ["\u0663", "\uff15", "\u00b2", "\u00bd", "\u2167", "\u2460", "\u0f33"],
        "punctuation": list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
                       + list("\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c\u2018\u201c\u00bf\uff01\u00a7"),
        "contractions": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "'x", "'"],
        "spaces": [" ", " ", " ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2009", "\u0085", "\u2028",
                   "\x0b"],
        "latin": list("\u00e9\u00c0\u00df\u00f8\u0141\u0133\u01c5\u1e9e\u00b5\u00aa\u02b0"),
        "greek, cyrillic": r(0x391, 0x3A9) + r(0x3B1, 0x3C9) + r(0x410, 0x44F),
        "cjk": r(0x4E00, 0x4E40) + r(0x9FA0, 0x9FAF) + r(0x3040, 0x30FF) + r(0xAC00, 0xAC30)
               + r(0x3131, 0x3140) + r(0x0800, 0x0815) + ["\u3005", "\uff76"],
        "emoji": r(0x1F600, 0x1F64F) + ["\u2764\ufe0f", "\U0001F44D\U0001F3FD", "\u200d", "\u00a9"],
        "marks": r(0x300, 0x36F) + r(0x900, 0x97F) + r(0xE01, 0xE3A) + ["\u20dd"],
        "other": ["\x00", "\x01", "\x7f", "\u200b", "\ufeff", "\ue000"],
        # letters of each kind (Lu, Ll, Lt, Lm, Lo) and deepseek-llm's list's edges: the singletons
        # normalization replaces and what they replace, letters just outside its ranges
        "cased": list("\u01c5\u01c8\u1f88\u02b0\u3005\u01bb\u0294\u037a\u1f7d\u03ce\u1fbe\u03b9\u1fd3\u0390"
                      "\u1fdb\u038a\u2126\u03a9\u212a\u212e\u1fbd\u10d0\u10c7\u1c90\u13a0\uab70\ufb00\uff21"
                      "\uff41\u2c7c\U00010400\U0001e900\U0001e944\u0561\u1d2c\u1d6b"),
        # Han that is no letter (radicals, \u3007 and the like), youtu's and afmoe's blocks and their edges
        "han, asian": list("\u2e80\u2f00\u2fdf\u3007\u3021\u303b\u3400\u4dbf\u9fa6\u9fff\uf900\ufaff"
                           "\U00020000\u3105\u312f\u3130\u318e\u318f\ud7a3\ud7a4\ud7af\u2014\u2026\u201d"
                           "\ufe30\ufe4f\u303f\uff1a\uff1b\uff5e\u201f\u3003\uff65\uff9f\u0e40\u0e81\u1780"
                           "\u1000\uaa60\ua9e0\u1100"),
        # \w that is no letter, mark or digit (for \b), and chameleon's image and sentinel tokens
        "word, tokens": ["_", "\u203f", "\u200c", "\u24b6", "\u2167", "<sentinel:12>", "<sentinel:>",
                         "IMGIMGABZ", "IMGIMGABCDEZ", "IMGIMGIZ", "IMGIMG", "<sentinel:7", "    "],
    }


def random_bmp(rng):
    import unicodedata
    while True:
        c = chr(rng.randrange(0x80, 0x10000))
        if unicodedata.category(c) not in ("Cn", "Cs"):
            return c


INVALID = [b"\xff", b"\xc3", b"\xe4\xb8", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80",
           b"\xf0\x9f"]


def generate(n, seed=14):
    """n byte strings, the same every run."""
    rng = random.Random(seed)
    kinds = pool()
    names = list(kinds)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(0, 24)):
            x = rng.random()
            if x < 0.05:
                parts.append(rng.choice(INVALID))
                continue
            if x < 0.10:
                s = random_bmp(rng)
            else:
                s = rng.choice(kinds[rng.choice(names)])
            if rng.random() < 0.2:  # runs: of spaces, digits, letters ...
                s *= rng.choice([2, 3, 4, 5, 6, 7, 9, 12, 17])
            parts.append(s.encode("utf-8"))
        out.append(b"".join(parts))
    return out


def regex_cuts(text, regexes):
    """Where llama.cpp's words start (character indices after 0), splitting text with the regexes in turn."""
    spans = [(0, len(text))] if text else []
    for rx in regexes:
        new = []
        for a, b in spans:
            piece, pos = text[a:b], 0
            for m in rx.finditer(piece):
                s, e = m.span()
                if s > pos:
                    new.append((a + pos, a + s))
                if e > s:
                    new.append((a + s, a + e))
                pos = e
            if pos < len(piece):
                new.append((a + pos, b))
        spans = new
    return [a for a, _ in spans if a > 0]


def main():
    args = sys.argv[1:]
    n = 3000
    if "--strings" in args:
        i = args.index("--strings")
        n = int(args[i + 1])
        del args[i:i + 2]
    llm_test = args[0] if args else "./llm-test"
    strings = generate(n)
    texts = [s.decode("utf-8", errors="replace") for s in strings]
    stdin = "".join(s.hex() + "\n" for s in strings)
    compiled = {p: [regex.compile(r) for r in rs] for p, rs in PATTERNS.items()}
    want = {}  # pattern -> cuts of every string
    checked = {p: 0 for p in PATTERNS}
    failed = []
    for name, pattern in NAMES.items():
        run = subprocess.run([llm_test, "--split", name], input=stdin, capture_output=True, text=True)
        if run.returncode != 0:
            failed.append("%s: llm-test --split failed: %s" % (name, run.stderr.strip()))
            continue
        lines = run.stdout.split("\n")
        warning = lines[0][len("warning: "):] if lines[0].startswith("warning: ") else None
        if pattern is None and not warning:
            failed.append("%s: falls back to 'default' in llm.h, but with no warning" % name)
        if pattern is not None and warning != "":
            failed.append("%s: llm.h does not know it (%r)" % (name, lines[0]))
            continue
        pattern = pattern or "default"
        if pattern not in want:
            want[pattern] = [regex_cuts(t, compiled[pattern]) for t in texts]
        for k, t in enumerate(texts):
            got = [int(x) for x in lines[1 + k].split()]
            if got != want[pattern][k]:
                failed.append("%s (pattern %s): string %r\n    regex: %s\n    llm.h: %s"
                              % (name, pattern, t, pieces(t, want[pattern][k]), pieces(t, got)))
                break
        else:
            checked[pattern] += len(texts)
    print("pre-tokenizer splits against llama.cpp's patterns in Python's regex %s (%d generated strings):"
          % (regex.__version__, len(texts)))
    for p in PATTERNS:
        names = [x for x, q in NAMES.items() if (q or "default") == p]
        print("  %-24s %2d names, %6d strings agree" % (p, len(names), checked[p]))
    print("  %d names in all: %d known, %d split as 'default' with a warning"
          % (len(NAMES), sum(p is not None for p in NAMES.values()), sum(p is None for p in NAMES.values())))
    for f in failed:
        print("FAIL " + f)
    return 1 if failed else 0


def pieces(text, cuts):
    bounds = [0] + cuts + [len(text)]
    return "|".join(text[a:b] for a, b in zip(bounds, bounds[1:])).encode("unicode_escape").decode()


if __name__ == "__main__":
    sys.exit(main())
