#!/usr/bin/env python3
"""The official openai Python client against `llm serve` on stories260K: what users point at the server.

Usage: tools/openai_test.py [TESTDATA_DIR]   (make test runs it with the virtual environment's python)
It starts ./llm serve on a free loopback port, runs the client through completions and chat, streaming and
not, n > 1, logprobs, invalid requests and fields refused as not supported, stops the server, and prints
"N passed, M failed".
"""
import json, os, re, subprocess, sys, typing

import jsonschema
import openai
import openai.lib._pydantic
import pydantic

from serve_port import Checks, finish, listening_port

testdata = sys.argv[1] if len(sys.argv) > 1 else "testdata"
model_path = os.path.join(testdata, "models", "stories260K.gguf")
log_path = "llm-test-openai.log"
check = Checks("openai client")



log = open(log_path, "w")
server = subprocess.Popen(["./llm", "serve", "-m", model_path, "--port", "0", "--api-key", "k3y"],
                          stderr=log)
port = listening_port(server, log_path, 30)
check(port is not None, "the server starts")
try:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k3y", max_retries=0, timeout=60)
    models = client.models.list()
    check([m.id for m in models.data] == ["stories260K"], f"models: {models}")

    # completions: llama.cpp's greedy text (testdata/reference/stories260K-greedy.json's first case)
    c = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=20,
                                  temperature=0)
    check(c.object == "text_completion" and len(c.choices) == 1 and c.choices[0].finish_reason == "length",
          f"completion: {c}")
    check(c.choices[0].text == ", there was a little girl named Lily. She loved to play outsid",
          repr(c.choices[0].text))
    check(c.usage.prompt_tokens == 5 and c.usage.completion_tokens == 20 and c.usage.total_tokens == 25,
          f"usage: {c.usage}")

    # streamed: the same text, chunk by chunk, and the usage at the end
    chunks = list(client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=20,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    check(text == c.choices[0].text, f"streamed completion: {text!r}")
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20, f"usage chunk: {chunks[-1]}")

    # n = 2 with a seed; logprobs
    c = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=8, n=2, seed=3,
                                  temperature=1.0)
    check([ch.index for ch in c.choices] == [0, 1] and c.usage.completion_tokens == 16, f"n=2: {c}")
    c = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=3, temperature=0,
                                  logprobs=2)
    lp = c.choices[0].logprobs
    check(lp.tokens == [",", " there", " was"] and len(lp.token_logprobs) == 3
          and len(lp.top_logprobs[0]) == 2 and all(x <= 0 for x in lp.token_logprobs), f"logprobs: {lp}")

    # chat, streamed and not: the same reply; the first chunk carries the role
    messages = [{"role": "system", "content": "You tell stories."},
                {"role": "user", "content": "A story, please."}]
    r = client.chat.completions.create(model="stories260K", messages=messages, max_tokens=12, temperature=0)
    check(r.object == "chat.completion" and r.choices[0].message.role == "assistant"
          and len(r.choices[0].message.content) > 0 and r.usage.completion_tokens == 12, f"chat: {r}")
    chunks = list(client.chat.completions.create(model="stories260K", messages=messages, max_tokens=12,
                                                 temperature=0, stream=True))
    check(chunks[0].choices[0].delta.role == "assistant", f"first chat chunk: {chunks[0]}")
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(streamed == r.choices[0].message.content,
          f"streamed chat: {streamed!r} vs {r.choices[0].message.content!r}")
    r = client.chat.completions.create(model="stories260K", messages=messages, max_tokens=2, temperature=0,
                                       logprobs=True, top_logprobs=2, n=2)
    check(len(r.choices) == 2 and len(r.choices[0].logprobs.content) == 2
          and len(r.choices[0].logprobs.content[0].top_logprobs) == 2, f"chat logprobs: {r}")

    # behind a load balancer: the client's X-Request-Id comes back and names the response (vLLM's cmpl-{id});
    # usage.prompt_tokens_details.cached_tokens, the prompt's full blocks of 16 from the prefix cache the
    # second time (all of a 40-token prompt but its last token's block: 32), streamed and not, n = 2 once
    story = "Tom had a red kite. He ran up the hill with it. The wind was strong and the kite went up high."
    raw = client.completions.with_raw_response.create(model="stories260K", prompt=story, max_tokens=2,
                                                      extra_headers={"X-Request-Id": "oa-1"})
    sc = raw.parse()
    n_prompt = sc.usage.prompt_tokens
    check(raw.headers.get("x-request-id") == "oa-1" and sc.id == "cmpl-oa-1",
          f"X-Request-Id: {raw.headers} {sc}")
    check(sc.usage.prompt_tokens_details.cached_tokens == 0, f"cached_tokens the first time: {sc.usage}")
    sc = client.completions.create(model="stories260K", prompt=story, max_tokens=2, n=2)
    check(sc.usage.prompt_tokens_details.cached_tokens == (n_prompt - 1) // 16 * 16 and n_prompt > 16,
          f"cached_tokens of a {n_prompt}-token prompt again, n=2: {sc.usage}")
    turn = [{"role": "user", "content": story}]
    chunks, again = (list(client.chat.completions.create(model="stories260K", messages=turn, max_tokens=2,
                                                         stream=True, stream_options={"include_usage": True}))
                     for _ in range(2))
    n_chat = again[-1].usage.prompt_tokens
    check(chunks[-1].usage.prompt_tokens_details.cached_tokens < n_chat - 16
          and again[-1].usage.prompt_tokens_details.cached_tokens == (n_chat - 1) // 16 * 16,
          f"chat, streamed: cached_tokens {chunks[-1].usage} then {again[-1].usage}")
    raw = client.chat.completions.with_raw_response.create(model="stories260K", max_tokens=1,
                                                           messages=[{"role": "user", "content": "x"}])
    check(re.fullmatch(r"[0-9a-f]{32}", raw.headers.get("x-request-id", "")) and
          raw.parse().id == "chatcmpl-" + raw.headers["x-request-id"],
          f"a minted X-Request-Id: {raw.headers}")

    # an invalid request surfaces as BadRequestError, with the field named; a wrong key as AuthenticationError
    try:
        client.completions.create(model="stories260K", prompt="x", max_tokens=0)
        check(False, "max_tokens=0 was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "max_tokens" in str(e), f"BadRequestError: {e}")
    try:
        client.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "x"}],
                                       top_p=2.0)
        check(False, "top_p=2 was accepted")
    except openai.BadRequestError as e:
        check("top_p" in str(e), f"BadRequestError: {e}")
    # fields not implemented are refused, not ignored (functions: use tools)
    for kw in ({"suffix": " The end."}, {"functions": [{"name": "f", "parameters": {}}]}):
        field = next(iter(kw))
        try:
            if field == "suffix":
                client.completions.create(model="stories260K", prompt="x", max_tokens=2, **kw)
            else:
                client.chat.completions.create(model="stories260K",
                                               messages=[{"role": "user", "content": "x"}],
                                               max_tokens=2, extra_body=kw)
            check(False, f"{field} was accepted")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and f"{field} is not supported" in str(e)
                  and e.param == field, f"BadRequestError: {e}")

    # structured output: the client's parse() with a Pydantic model (the strict json_schema it sends),
    # json_object, and a stream under a schema whose deltas put together validate (jsonschema)
    class Pet(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=12)
        kind: typing.Literal["cat", "dog"]
        age: int = pydantic.Field(ge=0, le=30)

    for seed in range(3):
        parsed = client.chat.completions.parse(model="stories260K",
                                               messages=[{"role": "user", "content": "A pet"}],
                                               response_format=Pet, max_tokens=200, seed=seed)
        msg = parsed.choices[0].message
        check(isinstance(msg.parsed, Pet) and msg.refusal is None
              and parsed.choices[0].finish_reason == "stop",
              f"parse(response_format=Pet), seed {seed}: {parsed}")
    pet_schema = openai.lib._pydantic.to_strict_json_schema(Pet)
    obj = client.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "x"}],
                                         response_format={"type": "json_object"}, max_tokens=300, seed=4,
                                         logit_bias={"500": -100})
    text = obj.choices[0].message.content
    check(obj.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict),
          f"json_object: {obj}")
    check(text.startswith("{"), f"json_object starts an object: {text!r}")
    chunks = list(client.completions.create(model="stories260K", prompt="My pet", max_tokens=200, seed=5,
                                            stream=True,
                                            extra_body={"structured_outputs": {"json": pet_schema}}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    check(chunks[-1].choices[0].finish_reason == "stop",
          f"stream under a schema ends with stop: {chunks[-1]}")
    try:
        jsonschema.validate(json.loads(text), pet_schema)
        check(True, "")
    except (ValueError, jsonschema.ValidationError) as e:
        check(False, f"the stream's text validates: {text!r}: {e}")
    try:
        client.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "x", "schema": {"type": "array", "uniqueItems": True}}})
        check(False, "uniqueItems was accepted")
    except openai.BadRequestError as e:
        check(e.param == "response_format.json_schema.schema" and "uniqueItems" in str(e), f"{e}")
    # logit_bias, OpenAI's meaning: +100 forces a token (300, " ha"); -100 keeps out the greedy first token
    # (",", llama.cpp's reference), which comes back later in the unbiased text too
    forced = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=4,
                                       temperature=0, logit_bias={"300": 100})
    check(forced.choices[0].text == " ha ha ha ha", f"logit_bias +100: {forced.choices[0].text!r}")
    with open(os.path.join(testdata, "reference", "stories260K-greedy.json")) as f:
        comma = json.load(f)[0]["completion_token_ids"][0]
    banned = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=20,
                                       temperature=0, logprobs=0, logit_bias={str(comma): -100})
    toks = banned.choices[0].logprobs.tokens
    check(len(toks) == 20 and "," not in toks and c.choices[0].text.count(",") >= 1,
          f"logit_bias -100 on {comma} (','): {toks}")
    # vLLM's fields, as its users send them (extra_body): the stop string kept, tokens named by id, the prompt
    # cut to its last two tokens (" a time" as ids: the same text as the ids given)
    kept = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=20,
                                     temperature=0, stop=[" lit"],
                                     extra_body={"include_stop_str_in_output": True})
    check(kept.choices[0].text == ", there was a lit" and kept.choices[0].finish_reason == "stop",
          f"include_stop_str_in_output: {kept.choices[0].text!r}")
    as_ids = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=1,
                                       temperature=0, logprobs=1,
                                       extra_body={"return_tokens_as_token_ids": True})
    check(as_ids.choices[0].logprobs.tokens == [f"token_id:{comma}"], f"return_tokens_as_token_ids: {as_ids}")
    cut = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=4,
                                    temperature=0, extra_body={"truncate_prompt_tokens": 2})
    tail = client.completions.create(model="stories260K", prompt=[261, 378], max_tokens=4, temperature=0)
    check(cut.usage.prompt_tokens == 2 and cut.choices[0].text == tail.choices[0].text,
          f"truncate_prompt_tokens: {cut} against {tail}")
    try:
        client.completions.create(model="no-such-model", prompt="x")
        check(False, "an unknown model was accepted")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"NotFoundError: {e}")
    try:
        openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0).models.list()
        check(False, "a wrong key was accepted")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, f"AuthenticationError: {e}")
except Exception as e:  # the server or the client broke: a failure, with what happened
    check(False, f"unexpected {type(e).__name__}: {e}")
finally:
    status = finish(check, server, log, log_path)
sys.exit(status)
