#!/usr/bin/env python3
"""gen_unicode.py - print the Unicode category table that the tokenizer's pre-tokenizers use.

The split patterns of the byte-level BPE vocabularies (see llm.h, section 3) ask of a character whether it is
a letter (\\p{L}), a combining mark (\\p{M}), a decimal digit (\\d, \\p{Nd}), another number (\\p{N}),
punctuation (\\p{P}), a symbol (\\p{S}) or white space (\\s); a few also ask which kind of letter (\\p{Lu},
\\p{Ll}, ...), whether it is Han (\\p{Han}) or a word character (\\w, for \\b). This script derives a class
byte for each code point from the Unicode Character Database and prints them as one sorted table of runs: each
entry is the first code point of a run of code points of one class byte, shifted left by 8, with the byte in
the low 8 bits; the run lasts until the next entry's first code point. Code points of no class (controls,
unassigned, ...) are class 0. Ready to paste into llm.h's appendix (the tokenizer binary-searches it).
Debian's package unicode-data installs UnicodeData.txt, and beside it the files the flags come from
(Scripts.txt, DerivedCoreProperties.txt, PropList.txt).

The class byte: the class (the low 3 bits, llm.h's LLM_UC_*) and flags

    python3 tools/gen_unicode.py [/usr/share/unicode/UnicodeData.txt] > /tmp/table.txt

  white space: the White_Space property, which is what \\s means to the regex engines the patterns were
          written for (Python's `regex`, Oniguruma) and to llama.cpp. UnicodeData.txt has no property column,
          but White_Space is exactly Zs, Zl, Zp plus U+0009..U+000D and U+0085; when PropList.txt sits beside
          UnicodeData.txt we check that. (Python's str.isspace() would also take U+001C..U+001F: not \\s.)
  the others: the general category's first letter (L, M, P, S), N split into Nd and the rest (Nl, No)
  8:  upper: Lu or Lt (\\p{Lu}, \\p{Lt}); 16: lower: Ll. A letter with neither is Lm or Lo.
  32: Han: the Script property is Han (Scripts.txt), as \\p{Han} means to Python's regex
  64: word: \\w to Python's regex: Alphabetic (DerivedCoreProperties.txt), marks, Nd, Pc and Join_Control
"""
import os
import sys

# llm.h's LLM_UC_* numbers
CLASSES = {"other": 0, "letter": 1, "mark": 2, "digit": 3, "number": 4, "punct": 5, "symbol": 6, "space": 7}
UPPER, LOWER, HAN, WORD = 8, 16, 32, 64  # llm.h's LLM_UC_UPPER, ...


def category_class(cat, cp):
    if cat in ("Zs", "Zl", "Zp") or 0x09 <= cp <= 0x0D or cp == 0x85:
        return "space"
    if cat == "Nd":
        return "digit"
    return {"L": "letter", "M": "mark", "N": "number", "P": "punct", "S": "symbol"}.get(cat[0], "other")


def categories(path):
    """A dict: code point -> general category, for every code point UnicodeData.txt lists."""
    out, first = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split(";")
            cp, name, cat = int(fields[0], 16), fields[1], fields[2]
            # big blocks (CJK, Hangul, ...) are given as a <..., First> line and a <..., Last> line
            if name.endswith(", First>"):
                first = cp
                continue
            lo = first if name.endswith(", Last>") else cp
            first = None
            for c in range(lo, cp + 1):
                out[c] = cat
    return out


def classes(path):
    """A dict: code point -> class name, for every code point UnicodeData.txt lists."""
    return {c: category_class(cat, c) for c, cat in categories(path).items()}


def property_set(path, name):
    """The code points a UCD file of "range ; value" lines gives the value name."""
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line:
                continue
            cps, prop = [s.strip() for s in line.split(";")[:2]]
            if prop != name:
                continue
            lo, _, hi = cps.partition("..")
            out.update(range(int(lo, 16), int(hi or lo, 16) + 1))
    return out


def check_white_space(path, spaces):
    proplist = os.path.join(os.path.dirname(path), "PropList.txt")
    if os.path.exists(proplist):
        assert property_set(proplist, "White_Space") == spaces, \
            "White_Space derived from categories differs from PropList.txt"


def class_bytes(path):
    """A dict: code point -> class byte (CLASSES and flags), for the code points of some class or flag."""
    here = os.path.dirname(path)
    cats = categories(path)
    han = property_set(os.path.join(here, "Scripts.txt"), "Han")
    alphabetic = property_set(os.path.join(here, "DerivedCoreProperties.txt"), "Alphabetic")
    joiners = property_set(os.path.join(here, "PropList.txt"), "Join_Control")
    out = {}
    for c in set(cats) | han:
        cat = cats.get(c, "Cn")
        k = CLASSES[category_class(cat, c)] if c in cats else 0
        if cat in ("Lu", "Lt"):
            k |= UPPER
        if cat == "Ll":
            k |= LOWER
        if c in han:
            k |= HAN
        if c in alphabetic or c in joiners or cat[0] == "M" or cat in ("Nd", "Pc"):
            k |= WORD
        out[c] = k
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/unicode/UnicodeData.txt"
    check_white_space(path, {c for c, k in classes(path).items() if k == "space"})
    cls = class_bytes(path)

    runs = []  # (first code point, class byte) where the class byte changes
    for c in range(0x110000):
        k = cls.get(c, 0)
        if not runs or runs[-1][1] != k:
            runs.append((c, k))

    print("/* Generated by `python3 tools/gen_unicode.py` from %s (%s): to change it, run that"
          % (os.path.basename(path), unicode_version(path)))
    print(" * again. */")
    print("static const uint32_t llm_uni_runs[%d] = {" % len(runs))
    line = "   "
    for c, k in runs:
        item = " 0x%X," % (c << 8 | k)
        if len(line) + len(item) > 110:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};")


def unicode_version(path):
    readme = os.path.join(os.path.dirname(path), "ReadMe.txt")
    try:
        with open(readme, encoding="utf-8") as f:
            for line in f:
                if "of the Unicode Standard" in line and "Version " in line:
                    return "Unicode " + line.split("Version ")[1].split()[0]
    except OSError:
        pass
    return "UCD"


if __name__ == "__main__":
    main()
