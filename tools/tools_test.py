#!/usr/bin/env python3
"""Tool calling and the reasoning split through the official openai client against `llm serve`.

Usage: tools/tools_test.py [TESTDATA_DIR]   (with the virtual environment's python, as tools/openai_test.py)
It starts ./llm serve on free loopback ports for models/SmolLM2-135M-Instruct.Q4_1.gguf (ChatML: the generic
tool format, the whole reply JSON) and TESTDATA_DIR/models/random-qwen3-qknorm.gguf (random weights, Qwen3's
template: Hermes <tool_call> blocks, <think> thinking), and a third on the Qwen3 model with --reasoning-format
none. The two models'
parts run side by side, and the requests of a part together where they can (the server batches them). Checks:
  1. tool_choice "required", a named function and "auto", n = 3, streamed and not: every call names one of
     the tools and its arguments are a JSON object that jsonschema validates against that tool's parameters
     (required properties, enums, integer bounds, maxLength); ids "call_" + 24 characters, unique; content
     null when the message only calls; "required" and named give calls and no text; finish_reason
     "tool_calls" exactly when calls ended the reply ("length" is accepted: tiny and random models run on,
     and a call max_tokens cuts is dropped, or in a stream sent in part; every whole call must be valid);
  2. streams: the first delta of a call carries index, id, type, name and arguments "", the later ones only
     the index and pieces of arguments; put together they are valid calls, and equal what the same request
     (same seed, temperature 1, n = 1) returns unstreamed (content, calls, reasoning, finish reason, token
     count), on Qwen3 also with thinking on (logit_bias opens and closes the think block before the call);
     the client's own helpers: parse() with pydantic_function_tool (a strict tool, arguments read into the
     model; a nested model too, its parameters with $defs and $ref) and stream(), which puts the deltas
     together itself;
  3. a full loop: user -> a call -> the assistant message as the client returned it (the pydantic object
     itself, or model_dump(exclude_none=True), or built from the deltas) and a tool result by tool_call_id ->
     the second request is accepted and answers (text or calls, with new ids), streamed and not;
  4. parallel_tool_calls false never gives two calls (3 choices x 3 tool_choices x 2, streamed and not);
  5. the reasoning split: a GBNF `grammar` forces <think>letters</think>letters on the Qwen3 model:
     reasoning_content == reasoning == the first letters, content == the second (the logprobs' tokens put
     together are the whole reply), streamed too; include_reasoning false drops the fields;
     enable_thinking false (and reasoning_effort "none") make /tokenize count more tokens (the empty think
     block); with --reasoning-format none the tags stay in content and there is no reasoning field;
  6. bad shapes: 400, type invalid_request_error, param naming the field (tools not a list, a tool without a
     name, a tool not a function, parameters not an object, tool_choice naming no tool or not a known value,
     "required" without tools, a tool message answering no call or without tool_call_id, assistant arguments
     that are not a JSON object, schema keywords the grammar engine refuses (an unknown format, uniqueItems:
     the message names them), tools with response_format).
Prints what failed, the seconds each part took and "tools: N passed, M failed"; exit status 1 on any failure.
"""
import concurrent.futures, json, os, re, signal, subprocess, sys, threading, time, urllib.error, \
    urllib.request

import jsonschema
import openai

from serve_port import listening_port

testdata = sys.argv[1] if len(sys.argv) > 1 else "testdata"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN3 = os.path.join(testdata, "models", "random-qwen3-qknorm.gguf")
passed = failed = 0
lock = threading.Lock()


def check(ok, what):
    global passed, failed
    with lock:
        if ok:
            passed += 1
        else:
            failed += 1
            print("FAIL tools:", str(what)[:2000], flush=True)
    return ok


# ------------------------------------------------------------------------------------------------ servers

class Server:
    def __init__(self, name, model, *flags):
        self.name, self.port = name, None
        self.log_path = f"llm-test-tools-{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(["./llm", "serve", "-m", model, "--port", "0", *flags], stderr=self.log)

    def wait_ready(self):
        self.port = listening_port(self.proc, self.log_path, 60)
        if not check(self.port is not None, f"the {self.name} server starts"):
            return False
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                                    max_retries=0, timeout=600)
        self.model = self.client.models.list().data[0].id
        return True

    def post(self, path, body):  # plain HTTP: (status, JSON body)
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = None
        check(code == 0, f"the {self.name} server exits 0 on SIGTERM (got {code})")
        self.log.close()
        if failed:
            print(f"--- {self.name} server log (end)\n" + open(self.log_path).read()[-3000:])
        os.remove(self.log_path)


# ---------------------------------------------------------------------------------------- tools and calls

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 20},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 100},
            "b": {"type": "integer", "minimum": -5, "maximum": 5}},
            "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "book_table", "description": "Book a table at a restaurant",
        "parameters": {"type": "object", "properties": {
            "guests": {"type": "integer", "minimum": 1, "maximum": 8},
            "vegan": {"type": "boolean"},
            "time": {"type": "string", "enum": ["19:00", "20:00", "21:00"]}},
            "required": ["guests", "vegan", "time"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "system", "content": "You are a helpful assistant with tools."},
       {"role": "user", "content": "What is the weather in Paris, in celsius?"}]
ID = re.compile(r"call_[A-Za-z0-9]{24}")


def call_problem(name, arguments, only=None):
    """Why a call is not valid (None when it is)."""
    if name not in SCHEMAS or (only and name != only):
        return f"name {name!r} is not {only or 'one of the tools'}"
    try:
        args = json.loads(arguments)
    except (TypeError, ValueError) as e:
        return f"arguments {arguments!r} are not JSON: {e}"
    if not isinstance(args, dict):
        return f"arguments {arguments!r} are not an object"
    try:
        jsonschema.validate(args, SCHEMAS[name])
    except jsonschema.ValidationError as e:
        return f"arguments {arguments!r} do not validate: {e.message}"
    return None


def check_choice(what, choice_mode, finish, content, calls, ids, parallel=True):
    """One choice of a reply: calls [(name, arguments)], content (None or text), ids of the calls."""
    only = choice_mode["function"]["name"] if isinstance(choice_mode, dict) else None
    for k, (name, args) in enumerate(calls):
        problem = call_problem(name, args, only)
        check(problem is None, f"{what}: call {k}: {problem}")
    check(all(ID.fullmatch(i or "") for i in ids) and len(set(ids)) == len(ids), f"{what}: ids {ids}")
    check(finish in ("tool_calls", "stop", "length"), f"{what}: finish_reason {finish!r}")
    check((finish == "tool_calls") == (bool(calls) and finish != "length"),
          f"{what}: finish_reason {finish!r} with {len(calls)} calls")
    if choice_mode != "auto" and finish != "length":  # a call is owed, and nothing else
        check(len(calls) >= 1 and not content, f"{what}: no call, or text besides: {content!r}, {calls}")
    if calls:  # null when the message only calls (Hermes may write text before its calls)
        check(content is None or content != "", f"{what}: content {content!r} besides calls")
    if not parallel:
        check(len(calls) <= 1, f"{what}: parallel_tool_calls false gave {len(calls)} calls: {calls}")


def read_message(msg):
    calls = [(tc.function.name, tc.function.arguments) for tc in (msg.tool_calls or [])]
    ids = [tc.id for tc in (msg.tool_calls or [])]
    for tc in msg.tool_calls or []:
        check(tc.type == "function", f"tool call type {tc.type!r}")
    return msg.content, calls, ids


def read_stream(what, chunks):
    """The choices of a streamed chat reply, put together from their deltas: {index: {...}}; content None
    when no delta had any (the first chunk's "" says only who speaks). What the deltas break is one
    failure."""
    out, problems = {}, []
    for ch in chunks:
        for c in ch.choices:
            o = out.setdefault(c.index, {"content": None, "reasoning": None, "calls": [], "ids": [],
                                         "finish": None})
            d = c.delta
            if o["finish"] is not None:
                problems.append(f"a delta after finish_reason: {ch}")
            if d.content:
                o["content"] = (o["content"] or "") + d.content
            r1, r2 = getattr(d, "reasoning_content", None), getattr(d, "reasoning", None)
            if r1 != r2:
                problems.append(f"delta reasoning_content {r1!r} != reasoning {r2!r}")
            if r1:
                o["reasoning"] = (o["reasoning"] or "") + r1
            for tc in d.tool_calls or []:
                if tc.index == len(o["calls"]):  # a new call: its head
                    if not (tc.id is not None and tc.type == "function" and tc.function.name
                            and tc.function.arguments == ""):
                        problems.append(f"the first delta of a call: {tc}")
                    o["calls"].append([tc.function.name, ""])
                    o["ids"].append(tc.id)
                elif not 0 <= tc.index < len(o["calls"]):
                    problems.append(f"a delta of call {tc.index}, {len(o['calls'])} begun: {tc}")
                else:
                    if tc.id is not None or tc.type is not None or tc.function.name is not None:
                        problems.append(f"a later delta of call {tc.index} repeats its head: {tc}")
                    o["calls"][tc.index][1] += tc.function.arguments or ""
            if c.finish_reason:
                o["finish"] = c.finish_reason
    check(not problems, f"{what}: the deltas: {problems[:3]}")
    for o in out.values():
        o["calls"] = [tuple(c) for c in o["calls"]]
    return out


# -------------------------------------------------------------------------------------------- the checks

def together(jobs):
    """Runs the callables side by side (the server batches their sequences: much faster than one by one)."""
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        for fut in [pool.submit(job) for job in jobs]:
            try:
                fut.result()
            except openai.APIError as e:
                check(False, f"{type(e).__name__}: {e}")


def tool_choices(S, tag, extra):
    """1 and 4: required, named, auto; n = 3; streamed and not; parallel on and off; all at once."""
    def one(mode, parallel, stream):
        what = f"{tag} tool_choice={json.dumps(mode)} parallel={parallel}{' streamed' if stream else ''}"
        kw = dict(model=S.model, messages=ASK, tools=TOOLS, tool_choice=mode, n=3,
                  max_tokens=80 if parallel else 120, parallel_tool_calls=parallel,
                  seed=(11 if parallel else 12) + 100 * stream, extra_body=extra)
        try:
            if not stream:
                r = S.client.chat.completions.create(**kw)
                check(len(r.choices) == 3, f"{what}: {len(r.choices)} choices")
                for c in r.choices:
                    content, calls, ids = read_message(c.message)
                    check_choice(f"{what} choice {c.index}", mode, c.finish_reason, content, calls, ids,
                                 parallel)
                return
            got = read_stream(what, S.client.chat.completions.create(stream=True, **kw))
            check(sorted(got) == [0, 1, 2], f"{what}: choices {sorted(got)}")
            for i, o in got.items():
                calls = o["calls"]
                if o["finish"] == "length" and calls and call_problem(*calls[-1]):
                    calls = calls[:-1]  # the call max_tokens cut short: sent in part, not whole
                check_choice(f"{what} choice {i}", mode, o["finish"], o["content"], calls,
                             o["ids"][:len(calls)], parallel)
        except openai.APIError as e:
            check(False, f"{what}: {e}")

    modes = ["required", {"type": "function", "function": {"name": "add"}}, "auto"]
    together([lambda m=m, p=p, st=st: one(m, p, st)
              for m in modes for p in (True, False) for st in (False, True)])


def stream_equals_unstreamed(S, tag, extra, seeds):
    """2: the same request (seed, temperature 1, n = 1), streamed and not, gives the same reply."""
    for seed, mode, parallel, more in seeds:
        what = f"{tag} seed {seed} tool_choice={json.dumps(mode)} parallel={parallel}"
        what += f" {json.dumps(more)}" if more else ""
        kw = dict(model=S.model, messages=ASK, tools=TOOLS, tool_choice=mode, n=1, max_tokens=150, seed=seed,
                  temperature=1.0, parallel_tool_calls=parallel, extra_body=extra, **more)
        try:
            r = S.client.chat.completions.create(**kw)
            content, calls, ids = read_message(r.choices[0].message)
            chunks = list(S.client.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **kw))
            check(chunks[-1].choices == [] and chunks[-1].usage is not None,
                  f"{what}: the usage chunk {chunks[-1]}")
            o = read_stream(what, chunks).get(0)
            if not check(o is not None, f"{what}: no streamed choice"):
                continue
            check(o["calls"] == calls and (o["content"] or "") == (content or "")
                  and o["finish"] == r.choices[0].finish_reason
                  and chunks[-1].usage.completion_tokens == r.usage.completion_tokens,
                  f"{what}: streamed {o['finish']} {o['content']!r} {o['calls']} "
                  f"({chunks[-1].usage.completion_tokens} tokens) != unstreamed {r.choices[0].finish_reason} "
                  f"{content!r} {calls} ({r.usage.completion_tokens} tokens)")
            if o["finish"] != "length":
                check_choice(what + " streamed", mode, o["finish"], o["content"], o["calls"], o["ids"],
                             parallel)
            reasoning = getattr(r.choices[0].message, "reasoning_content", None)
            check((reasoning or "") == (o["reasoning"] or ""),
                  f"{what}: streamed reasoning {o['reasoning']!r} != {reasoning!r}")
            # the think block that the bias opens and closes at once: no call in it
            if more.get("logit_bias"):
                check(reasoning is not None and "<" not in reasoning and calls,
                      f"{what}: {r.choices[0].message}")
        except openai.APIError as e:
            check(False, f"{what}: {e}")


def client_helpers(S, extra):
    """2, 3: the client's own helpers: parse() with pydantic_function_tool (a strict tool whose arguments it
    reads into the model; and one of a nested model, whose parameters use $defs and $ref) and stream(), which
    puts the deltas together itself."""
    import typing, pydantic

    class GetWeather(pydantic.BaseModel):
        city: str = pydantic.Field(min_length=1, max_length=20)
        unit: typing.Literal["celsius", "fahrenheit"]

    kw = dict(model=S.model, messages=ASK, tools=[openai.pydantic_function_tool(GetWeather)],
              tool_choice="required", max_tokens=100, seed=5, parallel_tool_calls=False, extra_body=extra)
    try:
        r = S.client.chat.completions.parse(**kw)
        calls = r.choices[0].message.tool_calls or []
        check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
              and isinstance(calls[0].function.parsed_arguments, GetWeather),
              f"parse(tools=[GetWeather]): {r}")
        with S.client.chat.completions.stream(**kw) as stream:
            done = [ev for ev in stream if ev.type == "tool_calls.function.arguments.done"]
            final = stream.get_final_completion()
        fc = final.choices[0].message.tool_calls or []
        check(len(done) == 1 and len(fc) == 1 and final.choices[0].finish_reason == "tool_calls"
              and isinstance(fc[0].function.parsed_arguments, GetWeather)
              and fc[0].function.arguments == done[0].arguments == calls[0].function.arguments,
              f"stream(tools=[GetWeather]): {final} (unstreamed {calls})")
    except (openai.APIError, pydantic.ValidationError) as e:
        check(False, f"the client's helpers: {type(e).__name__} {e}")

    class Place(pydantic.BaseModel):
        city: str = pydantic.Field(min_length=1, max_length=20)
        country: typing.Literal["FR", "NO", "IT"]

    class GetForecast(pydantic.BaseModel):  # a nested model: the tool's parameters use $defs and $ref
        place: Place
        days: int = pydantic.Field(ge=1, le=7)

    tool = openai.pydantic_function_tool(GetForecast)
    kw.update(tools=[tool], max_tokens=200)
    try:
        r = S.client.chat.completions.parse(**kw)
        calls = r.choices[0].message.tool_calls or []
        check("$defs" in json.dumps(tool) and r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
              and isinstance(calls[0].function.parsed_arguments, GetForecast)
              and isinstance(calls[0].function.parsed_arguments.place, Place),
              f"parse(tools=[GetForecast]): {r}")
    except (openai.APIError, pydantic.ValidationError) as e:
        check(False, f"the client's helpers, a nested model: {type(e).__name__} {e}")


def full_loop(S, tag, extra, seed, stream):
    """3: user -> calls -> the assistant message and a result per call -> a second answer."""
    what = f"{tag} loop seed {seed}{' streamed' if stream else ''}"
    msgs = list(ASK)
    kw = dict(model=S.model, tools=TOOLS, max_tokens=120, seed=seed, parallel_tool_calls=False,
              extra_body=extra)
    try:
        if stream:
            o = read_stream(what, S.client.chat.completions.create(messages=msgs, tool_choice="required",
                                                                   stream=True, **kw))[0]
            if not check(o["finish"] == "tool_calls" and len(o["calls"]) == 1, f"{what}: first turn {o}"):
                return
            calls, ids = o["calls"], o["ids"]
            msgs.append({"role": "assistant", "content": o["content"] or None, "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in zip(ids, calls)]})
        else:
            r = S.client.chat.completions.create(messages=msgs, tool_choice="required", **kw)
            content, calls, ids = read_message(r.choices[0].message)
            if not check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1,
                         f"{what}: first turn {r}"):
                return
            # the message as the client returned it: the object itself (the client sends its fields, nulls
            # and all) on even seeds, model_dump(exclude_none=True) on odd ones
            m = r.choices[0].message
            msgs.append(m if seed % 2 == 0 else m.model_dump(exclude_none=True))
        for i, (name, args) in zip(ids, calls):
            check(call_problem(name, args) is None, f"{what}: {call_problem(name, args)}")
            result = {"get_weather": {"temperature": 21, "sky": "sunny"}, "add": {"sum": 7},
                      "book_table": {"booked": True}}[name]
            msgs.append({"role": "tool", "tool_call_id": i, "content": json.dumps(result)})
        # the second turn: the server must take the history (no 400); the answer is text or more calls
        if stream:
            o = read_stream(what + " second turn",
                            S.client.chat.completions.create(messages=msgs, stream=True, **kw))[0]
            content, calls2, finish = o["content"], o["calls"], o["finish"]
            if finish == "length" and calls2 and call_problem(*calls2[-1]):
                calls2 = calls2[:-1]
            ids2 = o["ids"][:len(calls2)]
        else:
            r = S.client.chat.completions.create(messages=msgs, **kw)
            content, calls2, ids2 = read_message(r.choices[0].message)
            finish = r.choices[0].finish_reason
        check_choice(what + " second turn", "auto", finish, content, calls2, ids2, parallel=False)
        check(bool(content) or bool(calls2) or finish == "length", f"{what}: an empty answer ({finish})")
        check(not set(ids2) & set(ids), f"{what}: the second turn reuses call ids {ids2} {ids}")
    except openai.APIError as e:
        check(False, f"{what}: {e}")


THINK_GRAMMAR = 'root ::= "<think>" [a-z]{3,10} "</think>" [a-z]{3,10}'


def reasoning(S, tag):
    """5: the thinking apart from the answer, on a model that thinks."""
    msgs = [{"role": "user", "content": "Think, then answer."}]
    for seed in (1, 2):
        what = f"{tag} reasoning seed {seed}"
        kw = dict(model=S.model, messages=msgs, max_tokens=60, seed=seed,
                  extra_body={"grammar": THINK_GRAMMAR})
        try:
            r = S.client.chat.completions.create(logprobs=True, **kw)
            m = r.choices[0].message
            rc, rs = getattr(m, "reasoning_content", None), getattr(m, "reasoning", None)
            raw = "".join(t.token for t in r.choices[0].logprobs.content)
            check(r.choices[0].finish_reason == "stop"
                  and re.fullmatch(r"<think>[a-z]{3,10}</think>[a-z]{3,10}", raw),
                  f"{what}: the reply {raw!r} ({r.choices[0].finish_reason}) does not follow the grammar")
            check(rc == rs and re.fullmatch("[a-z]{3,10}", rc or "")
                  and re.fullmatch("[a-z]{3,10}", m.content or "")
                  and raw == f"<think>{rc}</think>{m.content}",
                  f"{what}: reasoning_content {rc!r}, reasoning {rs!r}, content {m.content!r}, reply {raw!r}")
            chunks = list(S.client.chat.completions.create(stream=True, **kw))
            o = read_stream(what + " streamed", chunks)[0]
            check(o["reasoning"] == rc and o["content"] == m.content and o["finish"] == "stop",
                  f"{what} streamed: reasoning {o['reasoning']!r} content {o['content']!r} "
                  f"vs {rc!r} {m.content!r}")
            r = S.client.chat.completions.create(**{**kw, "extra_body": {**kw["extra_body"],
                                                                          "include_reasoning": False}})
            m2 = r.choices[0].message
            check(getattr(m2, "reasoning_content", None) is None and getattr(m2, "reasoning", None) is None
                  and m2.content == m.content, f"{what} include_reasoning false: {m2}")
        except openai.APIError as e:
            check(False, f"{what}: {e}")
    # the empty think block that enable_thinking false (or reasoning_effort none) writes in the prompt
    counts = {}
    for key, extra in (("on", {"chat_template_kwargs": {"enable_thinking": True}}),
                       ("off", {"chat_template_kwargs": {"enable_thinking": False}}),
                       ("effort none", {"reasoning_effort": "none"}), ("default", {})):
        status, body = S.post("/tokenize", {"model": S.model, "messages": msgs, **extra})
        check(status == 200 and body.get("count") == len(body.get("tokens", [])),
              f"/tokenize {key}: {status} {body}")
        counts[key] = body.get("count")
    check(counts["off"] is not None and counts["on"] is not None and counts["off"] > counts["on"]
          and counts["effort none"] == counts["off"] and counts["default"] == counts["on"],
          f"{tag}: /tokenize counts with thinking on, off, reasoning_effort none, default: {counts}")
    status, body = S.post("/tokenize", {"model": S.model, "messages": msgs, "tools": TOOLS})
    check(status == 200 and body["count"] > counts["default"] + 50, f"/tokenize with tools: {status} {body}")


def reasoning_format_none(S):
    """5: --reasoning-format none: the thinking stays in content, tags and all."""
    msgs = [{"role": "user", "content": "Think, then answer."}]
    kw = dict(model=S.model, messages=msgs, max_tokens=60, seed=1, extra_body={"grammar": THINK_GRAMMAR})
    try:
        m = S.client.chat.completions.create(**kw).choices[0].message
        check(re.fullmatch(r"<think>[a-z]{3,10}</think>[a-z]{3,10}", m.content or "")
              and getattr(m, "reasoning_content", None) is None and getattr(m, "reasoning", None) is None,
              f"--reasoning-format none: {m}")
        o = read_stream("--reasoning-format none streamed",
                        S.client.chat.completions.create(stream=True, **kw))[0]
        check(o["content"] == m.content and o["reasoning"] is None, f"--reasoning-format none streamed: {o}")
    except openai.APIError as e:
        check(False, f"--reasoning-format none: {e}")


def bad_shapes(S):
    """6: each a 400 naming the field."""
    user = [{"role": "user", "content": "hi"}]
    f = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    cases = [
        ("tools not a list", dict(messages=user, tools={"type": "function"}), "tools", "list"),
        ("a tool without a name",
         dict(messages=user, tools=[{"type": "function", "function": {"parameters": {}}}]),
         "tools[0]", "name"),
        ("a tool not a function", dict(messages=user, tools=[f, {"type": "retrieval"}]), "tools[1]",
         "function"),
        ("parameters not an object", dict(messages=user, tools=[{"type": "function", "function": {
            "name": "f", "parameters": ["x"]}}]), "tools[0]", "parameters"),
        ("tool_choice naming no tool", dict(messages=user, tools=[f], tool_choice={
            "type": "function", "function": {"name": "g"}}), "tool_choice", '"g"'),
        ("tool_choice not a known value", dict(messages=user, tools=[f], tool_choice="sometimes"),
         "tool_choice", None),
        ("required without tools", dict(messages=user, tool_choice="required"), "tool_choice", None),
        ("a tool message answering no call", dict(messages=user + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_2", "content": "42"}]),
         "messages[2].tool_call_id", "call_2"),
        ("a tool message without tool_call_id", dict(messages=user + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "42"}]), "messages[2].tool_call_id", None),
        ("arguments not JSON", dict(messages=user + [{"role": "assistant", "content": None, "tool_calls": [
            {**call, "function": {"name": "f", "arguments": "{not json"}}]}]),
         "messages[1].tool_calls[0]", "arguments"),
        ("arguments a JSON list", dict(messages=user + [{"role": "assistant", "content": None, "tool_calls": [
            call, {**call, "id": "call_2", "function": {"name": "f", "arguments": "[1, 2]"}}]}]),
         "messages[1].tool_calls[1]", "arguments"),
        ("a schema keyword the grammar engine refuses", dict(messages=user, tools=[f, {
            "type": "function", "function": {"name": "lookup", "parameters": {
                "type": "object",
                "properties": {"x": {"type": "string", "format": "hostname-idn-weird"}}}}}]),
         "tools", "hostname-idn-weird"),
        ("uniqueItems in parameters", dict(messages=user, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {
                "xs": {"type": "array", "uniqueItems": True}}}}}]), "tools", "uniqueItems"),
        ("tools and response_format together",
         dict(messages=user, tools=[f], response_format={"type": "json_object"}),
         "tools", None),
    ]
    for what, kw, param, words in cases:
        try:
            S.client.chat.completions.create(model=S.model, max_tokens=4, **kw)
            check(False, f"{what}: accepted")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.param == param and (words is None or words in e.message)
                  and e.type == "invalid_request_error",
                  f"{what}: {e.status_code} param {e.param!r}: {e.message}")
        except openai.APIError as e:
            check(False, f"{what}: {type(e).__name__} {e}")


# ----------------------------------------------------------------------------------------------- the run

start, times = time.time(), []
servers = {"smol": Server("smol", SMOL), "qwen3": Server("qwen3", QWEN3),
           "qwen3-none": Server("qwen3-none", QWEN3, "--reasoning-format", "none")}
try:
    if all([s.wait_ready() for s in servers.values()]):
        smol, qwen3 = servers["smol"], servers["qwen3"]
        no_think = {"chat_template_kwargs": {"enable_thinking": False}}

        # two lists of parts, one per model, run side by side (the servers batch; the machine may have 2
        # cores)
        on_smol = [
            ("choices", lambda: tool_choices(smol, "SmolLM2", None)),
            ("stream=unstreamed", lambda: stream_equals_unstreamed(smol, "SmolLM2", None, [
                (1, "required", True, {}), (2, "auto", True, {}), (3, "auto", False, {}),
                (4, "required", False, {})])),
            ("client helpers", lambda: client_helpers(smol, None)),
            ("loops", lambda: [full_loop(smol, "SmolLM2", None, seed, stream)
                               for seed, stream in ((1, False), (2, False), (3, True))]),
            ("bad shapes", lambda: bad_shapes(smol))]
        on_qwen3 = [
            ("choices", lambda: tool_choices(qwen3, "Qwen3", no_think)),
            ("stream=unstreamed", lambda: stream_equals_unstreamed(qwen3, "Qwen3", no_think, [
                (1, "required", False, {}),
                (2, {"type": "function", "function": {"name": "book_table"}}, False, {})])),
            # thinking on: <think> (id 151667) then </think> (151668) at once, by logit_bias, then the call
            ("thinking call", lambda: stream_equals_unstreamed(qwen3, "Qwen3 thinking", None, [
                (3, "required", False, {"logit_bias": {"151667": 50, "151668": 100}})])),
            ("loops", lambda: [full_loop(qwen3, "Qwen3", no_think, seed, stream)
                               for seed, stream in ((1, False), (2, False), (3, True))]),
            ("reasoning", lambda: reasoning(qwen3, "Qwen3")),
            ("--reasoning-format none", lambda: reasoning_format_none(servers["qwen3-none"]))]

        def run_parts(tag, parts):
            for name, part in parts:
                t = time.time()
                try:
                    part()
                except Exception as e:  # the server or the client broke: a failure, with what happened
                    check(False, f"{tag} {name}: unexpected {type(e).__name__}: {e}")
                times.append(f"{tag} {name} {time.time() - t:.1f}")

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for fut in [pool.submit(run_parts, "SmolLM2", on_smol),
                        pool.submit(run_parts, "Qwen3", on_qwen3)]:
                fut.result()
finally:
    for s in servers.values():
        s.stop()

print("tools: seconds per part:", ", ".join(times))
print(f"tools: {passed} passed, {failed} failed ({time.time() - start:.1f} s)")
sys.exit(1 if failed else 0)
