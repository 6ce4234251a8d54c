#!/usr/bin/env python3
"""The oracle of test.c's JSON Schema tests: Python's jsonschema package on what the engine said and wrote.

Usage: tools/schema_oracle.py SCHEMAS CASES   (test.c writes CASES and runs this with .venv's python)
SCHEMAS is testdata/schemas/schemas.json. Each line of CASES is a JSON object {"i": schema index, "kind":
"valid" | "invalid" | "sample", "text": ..., "grammar": "accept" | "prefix" | "reject"}:
  valid    an example the schema's author wrote as valid: jsonschema must agree, and the grammar accept it
  invalid  an example written as invalid: jsonschema must agree (or the text is not JSON), and the grammar
           must not accept it
  sample   an answer the engine generated under the schema's grammar and finished ("stop"): it must be JSON
           that jsonschema validates (Draft 2020-12, formats checked)
Prints one line per failure and "N agree, M disagree"; exit status 1 when any disagree.
"""
import json, sys

import jsonschema

schemas = json.load(open(sys.argv[1], encoding="utf-8"))
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER  # date-time and time need rfc3339-validator
agree = disagree = 0


def valid(schema, text):
    try:
        value = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    except ValueError:
        return False
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
    return validator.is_valid(value)


for line in open(sys.argv[2], encoding="utf-8"):
    case = json.loads(line)
    entry = schemas[case["i"]]
    ok_schema = valid(entry["schema"], case["text"])
    if case["kind"] == "valid":
        same = ok_schema and case["grammar"] == "accept"
    elif case["kind"] == "invalid":
        same = not ok_schema and case["grammar"] != "accept"
    else:
        same = ok_schema
    if same:
        agree += 1
    else:
        disagree += 1
        if disagree <= 20:
            print(f"{entry['name']}: {case['kind']} {case['text'][:200]!r}: jsonschema says "
                  f"{'valid' if ok_schema else 'invalid'}, the grammar {case['grammar']}")
print(f"{agree} agree, {disagree} disagree")
sys.exit(1 if disagree or not agree else 0)
