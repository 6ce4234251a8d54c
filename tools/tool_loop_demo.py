#!/usr/bin/env python3
"""A streamed tool loop through the official openai client, against a running `llm serve`.

Usage: tools/tool_loop_demo.py [--tool-choice required|auto] [--parallel] [--seed S] [--temperature T]
                               [--rounds N] BASE_URL
  e.g. ./llm serve -m models/SmolLM2-135M-Instruct.Q4_1.gguf --port 8000 &
       .venv/bin/python tools/tool_loop_demo.py http://127.0.0.1:8000

The user asks for the weather in Paris; the model is given a get_weather tool (parallel_tool_calls false
unless --parallel: a model as small as SmolLM2 repeats its call until max_tokens). Each reply is streamed and
each delta printed as it arrives (text, the head of a call, pieces of its arguments); the calls are put
together from the deltas, run (a fake weather service), and their results sent back with their tool_call_id,
until the model answers in text (after --rounds rounds of calls, tool_choice "none" asks for the answer). A
transcript of the conversation follows. Exit status 1 when the server refuses a turn or a call is not valid.
"""
import argparse, json, sys

import openai

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("base_url", help="the server, e.g. http://127.0.0.1:8000 (/v1 is added when missing)")
ap.add_argument("--tool-choice", default="required", choices=["auto", "required"],
                help="for the first turn (the later ones: auto)")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--temperature", type=float, default=0.7)
ap.add_argument("--rounds", type=int, default=2,
                help="rounds of calls before tool_choice none asks for the answer")
ap.add_argument("--parallel", action="store_true", help="parallel_tool_calls true (tiny models repeat calls)")
ap.add_argument("--api-key", default="none")
args = ap.parse_args()

base = args.base_url.rstrip("/")
client = openai.OpenAI(base_url=base if base.endswith("/v1") else base + "/v1", api_key=args.api_key,
                       max_retries=0, timeout=120)
model = client.models.list().data[0].id

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "the city's name", "minLength": 1, "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}]


def get_weather(city, unit):  # the fake tool
    c = 18 + len(city) % 7
    return {"city": city, "temperature": c if unit == "celsius" else round(c * 9 / 5 + 32), "unit": unit,
            "sky": "partly cloudy"}


class Printer:
    """Deltas as they arrive: each kind on its own line, its pieces (repr) one after another on it."""
    def __init__(self):
        self.kind = None

    def put(self, kind, piece=None):
        if kind != self.kind:
            print(("\n" if self.kind else "") + f"  {kind}", end="", flush=True)
            self.kind = kind
        if piece is not None:
            print(f" {piece!r}", end="", flush=True)

    def end(self, line):
        print(("\n" if self.kind else "") + f"  {line}", flush=True)
        self.kind = None


def stream_turn(messages, tool_choice):
    """One streamed reply: each delta printed as it comes; returns (content, calls, finish)."""
    content, calls, finish, out = "", [], None, Printer()
    stream = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                            tool_choice=tool_choice, parallel_tool_calls=args.parallel,
                                            max_tokens=200, seed=args.seed, temperature=args.temperature,
                                            stream=True)
    for chunk in stream:
        for choice in chunk.choices:
            d = choice.delta
            if d.role:
                out.end(f"[role] {d.role}")
            r = getattr(d, "reasoning_content", None)
            if r:
                out.put("[reasoning]", r)
            if d.content:
                content += d.content
                out.put("[content]", d.content)
            for tc in d.tool_calls or []:
                if tc.id:  # the first delta of a call: its index, id, name (and arguments "")
                    calls.append({"id": tc.id, "type": "function",
                                  "function": {"name": tc.function.name,
                                               "arguments": tc.function.arguments or ""}})
                    out.end(f"[tool_calls[{tc.index}] begins] id={tc.id} type={tc.type} "
                            f"name={tc.function.name}")
                elif tc.function and tc.function.arguments:  # then pieces of its arguments
                    calls[tc.index]["function"]["arguments"] += tc.function.arguments
                    out.put(f"[tool_calls[{tc.index}].arguments +=]", tc.function.arguments)
            if choice.finish_reason:
                finish = choice.finish_reason
                out.end(f"[finish_reason] {finish}")
    return content, calls, finish


def compact(arguments):
    try:
        return json.dumps(json.loads(arguments))
    except ValueError:
        return arguments


messages = [{"role": "system", "content": "You are a helpful assistant. Use the tools when they help."},
            {"role": "user", "content": "What's the weather like in Paris today?"}]
print(f"server {client.base_url}, model {model}, tool_choice {args.tool_choice!r}, seed {args.seed}, "
      f"temperature {args.temperature}")
ok, tool_choice = True, args.tool_choice
try:
    for turn in range(1, args.rounds + 2):
        if turn == args.rounds + 1:
            tool_choice = "none"  # enough calls: the answer, in text
        print(f"\n--- turn {turn}: the model streams (tool_choice {tool_choice!r})")
        content, calls, finish = stream_turn(messages, tool_choice)
        message = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = calls
        messages.append(message)
        if finish == "length":
            print("  (cut by max_tokens: the loop ends here)")
        if finish == "length" or not calls:
            break
        print(f"\n--- running {len(calls)} call(s)")
        for call in calls:
            fn = call["function"]
            try:
                arguments = json.loads(fn["arguments"])
                result = get_weather(**arguments)
            except (ValueError, TypeError) as e:
                ok = False
                result = {"error": f"bad arguments: {e}"}
            print(f"  {fn['name']}({compact(fn['arguments'])}) -> {json.dumps(result)}")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
        tool_choice = "auto"
except openai.APIError as e:
    print(f"\nthe server refused the turn: {type(e).__name__}: {e}")
    ok = False

print("\n=== transcript")
for m in messages:
    if m["role"] == "tool":
        print(f"tool ({m['tool_call_id']}): {m['content']}")
    elif m.get("tool_calls"):
        said = f"{m['content']} " if m["content"] else ""
        print(f"assistant: {said}" + "; ".join(
            f"calls {c['function']['name']}({compact(c['function']['arguments'])}) [{c['id']}]"
            for c in m["tool_calls"]))
    else:
        print(f"{m['role']}: {m['content']}")
sys.exit(0 if ok else 1)
