#!/usr/bin/env python3
"""The oracle of test.c's grammar tests: what the engine's GBNF matcher said of each string, checked against
Python's own matchers.

Usage: tools/grammar_oracle.py CASES   (test.c writes CASES and runs this with .venv's python)
Each line of CASES is a JSON array [oracle, pattern, text, verdict]: verdict is what llm.h's matcher said of
the text, "accept" (a whole sentence), "prefix" (it could go on to one) or "reject". The oracles:
  regex   the `regex` package with the equivalent regular expression: fullmatch for accept, and a partial
          fullmatch (the text could be the start of a match) for prefix
  json    json.loads (strict: no NaN or Infinity): accept exactly the JSON texts
  arith   Python's own parser on expressions of + - * / and parentheses over integers: accept exactly those
Prints one line per disagreement and "N agree, M disagree"; exit status 1 when any disagree.
"""
import ast, json, sys

import regex


def oracle_regex(pattern, text):
    if regex.fullmatch(pattern, text):
        return "accept"
    return "prefix" if regex.fullmatch(pattern, text, partial=True) else "reject"


def no_constant(name):
    raise ValueError(name)


def oracle_json(_, text):
    try:
        json.loads(text, parse_constant=no_constant)
        return "accept"
    except (ValueError, RecursionError):
        return "not accept"


ARITH_NODES = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)


def oracle_arith(_, text):
    if text.strip() != text or "\n" in text:
        return "not accept"
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return "not accept"
    ok = all(isinstance(n, ARITH_NODES) for n in ast.walk(tree))
    ok = ok and all(type(n.value) is int for n in ast.walk(tree) if isinstance(n, ast.Constant))
    return "accept" if ok else "not accept"


ORACLES = {"regex": oracle_regex, "json": oracle_json, "arith": oracle_arith}
agree = disagree = 0
for line in open(sys.argv[1], encoding="utf-8"):
    kind, pattern, text, verdict = json.loads(line)
    want = ORACLES[kind](pattern, text)
    same = want == verdict or (want == "not accept" and verdict != "accept")
    if same:
        agree += 1
    else:
        disagree += 1
        if disagree <= 20:
            print(f"{kind} {pattern!r} on {text!r}: llm.h says {verdict}, the oracle {want}")
print(f"{agree} agree, {disagree} disagree")
sys.exit(1 if disagree or not agree else 0)
