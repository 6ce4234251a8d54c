#!/usr/bin/env python3
"""OpenAI's Responses API (POST /v1/responses) through the official clients, unchanged, against `llm serve`.

Usage: tools/responses_test.py [TESTDATA_DIR]   (make test runs it with the virtual environment's python)
It starts ./llm serve on stories260K (TESTDATA_DIR/models; fast: the wire format, the stream's events, the
store) and on models/SmolLM2-135M-Instruct.Q4_1.gguf (tool calls, structured output, the Agents SDK), then:
  1. responses.create: a message item (msg_ id), status incomplete at max_output_tokens with
     incomplete_details, usage (total = input + output, cached_tokens, cache_write_tokens 0);
  2. create(stream=True), raw events: the exact order of a text reply's events, sequence_number 0, 1, 2, ...,
     the same response id in created/in_progress/incomplete, the same msg_ id in every event, deltas joined ==
     output_text.done == content_part.done == output_item.done == the final output == GET /v1/responses/{id};
     include message.output_text.logprobs with top_logprobs 2: the deltas' logprobs joined are those of the
     done events, the final object and the unstreamed reply, their tokens joined the text; a client that
     leaves mid-stream has its generation aborted (the server's log) and nothing left running (/metrics);
  3. the store: previous_response_id continues with cached_tokens > 0; store false cannot be continued (400
     previous_response_id); DELETE then GET is a 404; an unknown previous_response_id is a 400;
  4. refusals: a built-in tool (web_search) names tools[0].type; an output for no call names input[0].call_id;
     arguments that are not JSON name input[1].arguments; an input_image part, background true; a custom
     tool with a lark grammar names tools[0].format; a tool_choice naming no tool names tool_choice;
  5. responses.stream (the client's helper, unchanged) on SmolLM2: get_final_response() is completed and its
     text is the deltas joined; the ids of the events are the final object's;
  6. a function-tool loop (tool_choice required, parallel_tool_calls false): one function_call item, fc_ id,
     call_id "call_" + 24 characters, arguments valid for the tool's schema; streamed: the same fc_ id and
     call_id in added, arguments.done, output_item.done and completed; then the call and its
     function_call_output sent back answer with a message; a Codex-like history (developer, user, reasoning
     without status, function_call, function_call_output, assistant output_text, an assistant message with
     empty content, user) is accepted; a custom tool (tool_choice {"type": "custom"}): a custom_tool_call
     item, ctc_ id, its input in custom_tool_call_input.done as in the item, its custom_tool_call_output
     accepted;
     parallel calls (tool_choice required): one function_call item per call at consecutive output indexes,
     never interleaved, distinct call_ids;
  7. text.format json_schema: responses.parse(text_format=a Pydantic model) gives a valid parsed object, and
     so does responses.stream(text_format=...)'s final response;
  8. the OpenAI Agents SDK's default Responses model (OpenAIResponsesModel) with a @function_tool: the tool
     runs with valid arguments and the run ends with a final output.
Prints what failed and "responses: N passed, M failed"; exit status 1 on any failure.
"""
import asyncio, base64, json, os, re, signal, socket, subprocess, sys, time, urllib.request, warnings

import jsonschema
import openai
import pydantic

from serve_port import Checks, listening_port

testdata = sys.argv[1] if len(sys.argv) > 1 else "testdata"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORIES = os.path.join(testdata, "models", "stories260K.gguf")
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
SMOL_NAME = "SmolLM2-135M-Instruct.Q4_1"
check = Checks("responses")



def start(model, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen(["./llm", "serve", "-m", model, "--port", "0", "--api-key", "k3y"], stderr=log)
    return proc, listening_port(proc, log_path, 60)


def refused(client, param, **kw):
    try:
        client.responses.create(**kw)
        return None
    except openai.BadRequestError as e:
        return e.body.get("param") == param and e.status_code == 400 or e.body


WEATHER = {"type": "function", "name": "get_weather", "description": "Get the weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}, "strict": True}


def text_part(client, port):
    # 1. create
    r = client.responses.create(model="stories260K", input="Once upon a time", max_output_tokens=8,
                                temperature=0)
    check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", f"status: {r}")
    check(len(r.output) == 1 and r.output[0].type == "message" and
          re.fullmatch(r"msg_[0-9a-f]{32}", r.output[0].id) and r.output_text, f"output: {r.output}")
    u = r.usage
    check(u.output_tokens == 8 and u.total_tokens == u.input_tokens + u.output_tokens and
          u.input_tokens_details.cache_write_tokens == 0 and u.output_tokens_details.reasoning_tokens == 0,
          f"usage: {u}")
    check(re.fullmatch(r"resp_[0-9a-f]{32}", r.id) is not None, r.id)
    # 2. the raw events of a stream
    events = list(client.responses.create(model="stories260K", input="Once upon a time", max_output_tokens=8,
                                          temperature=0, stream=True))
    types = [e.type for e in events]
    want = ["response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added"] + ["response.output_text.delta"] * (len(types) - 8) + \
           ["response.output_text.done", "response.content_part.done", "response.output_item.done",
            "response.incomplete"]
    check(types == want, f"event order: {types}")
    check([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers")
    rid = events[0].response.id
    check(all(e.response.id == rid for e in events if hasattr(e, "response")), "one response id")
    final = events[-1].response
    mid = final.output[0].id
    check(all(e.item_id == mid for e in events if hasattr(e, "item_id")) and events[2].item.id == mid and
          events[-2].item.id == mid, "one message id")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check(deltas == r.output_text == events[-4].text == events[-3].part.text ==
          events[-2].item.content[0].text == final.output_text, f"texts: {deltas!r} {r.output_text!r}")
    got = client.responses.retrieve(rid)
    check(got.model_dump() == final.model_dump(), f"GET: {got} != {final}")
    # 2b. include message.output_text.logprobs: the deltas' logprobs joined are the done events' and the final
    # object's, their tokens joined are the text, top_logprobs alternatives each; unstreamed the same
    lp = dict(model="stories260K", input="Once upon a time", max_output_tokens=8, temperature=0,
              top_logprobs=2, include=["message.output_text.logprobs"])
    events = list(client.responses.create(stream=True, **lp))
    dlp = [x.model_dump() for e in events if e.type == "response.output_text.delta" for x in e.logprobs]
    final = events[-1].response
    whole = [[x.model_dump() for x in lps] for lps in (events[-4].logprobs, events[-3].part.logprobs,
             events[-2].item.content[0].logprobs, final.output[0].content[0].logprobs,
             client.responses.create(**lp).output[0].content[0].logprobs)]
    check(len(dlp) == 8 and all(w == dlp for w in whole) and final.top_logprobs == 2 and
          "".join(x["token"] for x in dlp) == final.output_text and
          all(len(x["top_logprobs"]) == 2 and x["logprob"] <= 0 and bytes(x["bytes"]).decode() == x["token"]
              for x in dlp), f"logprobs: {dlp} {whole}")
    # a client that leaves mid-stream: its generation is aborted (the log names it "(gone)", "abort", with
    # fewer tokens than it asked for) and no request is left running
    body = json.dumps({"model": "stories260K", "input": "Once upon a time", "max_output_tokens": 400,
                       "temperature": 0, "stream": True, "metadata": {"case": "disconnect"}}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while got.count(b"event: response.output_text.delta") < 6:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    rid = re.search(rb'"id":"(resp_[0-9a-f]{32})"', got)
    sock.close()
    line = None
    for _ in range(600):
        m = rid and re.search(r"llm serve: %s \(gone\): .*output (\d+) tokens.*abort" % rid.group(1).decode(),
                              open("llm-test-responses.log").read())
        if m:
            line = m
            break
        time.sleep(0.05)
    deltas = got.count(b"event: response.output_text.delta")  # each one a token at least
    check(line is not None and deltas <= int(line.group(1)) < 400,
          f"a client gone mid-stream: aborted ({got[-300:]})")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    check(re.search(r"^vllm:num_requests_running\S* 0(\.0)?$", metrics, re.M),
          "no request left running after the client left")
    # 3. the store
    r2 = client.responses.create(model="stories260K", input="and then", previous_response_id=r.id,
                                 max_output_tokens=8, temperature=0)
    check(r2.previous_response_id == r.id and r2.usage.input_tokens_details.cached_tokens >=
          16 * (r.usage.input_tokens // 16) and r2.usage.input_tokens > r.usage.input_tokens,
          f"continuation's usage: {r2.usage} after {r.usage}")
    nostore = client.responses.create(model="stories260K", input="x", store=False, max_output_tokens=2)
    check(refused(client, "previous_response_id", input="y", previous_response_id=nostore.id) is True,
          "store false continued")
    client.responses.delete(r.id)
    try:
        client.responses.retrieve(r.id)
        check(False, "GET after DELETE")
    except openai.NotFoundError as e:
        check(e.body.get("param") == "response_id", f"404: {e.body}")
    check(refused(client, "previous_response_id", input="y", previous_response_id=r.id) is True,
          "deleted parent")
    # 4. refusals
    check(refused(client, "tools[0].type", input="x", tools=[{"type": "web_search"}]) is True, "web_search")
    check(refused(client, "input[0].call_id", input=[{"type": "function_call_output", "call_id": "c",
                                                      "output": "x"}]) is True, "output for no call")
    check(refused(client, "input[1].arguments",
                  input=[{"role": "user", "content": "x"},
                         {"type": "function_call", "call_id": "c", "name": "f",
                          "arguments": "{nope"}]) is True,
          "arguments not JSON")
    check(refused(client, "input[0].content", input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x"}]}]) is True, "input_image")
    check(refused(client, "background", input="x", background=True) is True, "background")
    # a reasoning item replayed without a store (as Codex does): our encrypted_content is read back
    blob = "llm-rs1." + base64.b64encode(b"Think of a story.").decode()
    replay = [{"role": "user", "content": "Once"},
              {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": blob},
              {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "upon"}]},
              {"role": "user", "content": "a time"}]
    r5 = client.responses.create(model="stories260K", input=replay, store=False, max_output_tokens=2,
                                 include=["reasoning.encrypted_content"])
    check(r5.status == "incomplete" and r5.store is False, f"encrypted_content replayed: {r5}")
    replay[1]["encrypted_content"] = "llm-rs1.!"
    check(refused(client, "input[1].encrypted_content", input=replay) is True, "a broken encrypted_content")
    lark = {"type": "grammar", "syntax": "lark", "definition": "start: /x/"}
    check(refused(client, "tools[0].format", input="x",
                  tools=[{"type": "custom", "name": "apply_patch", "format": lark}]) is True,
          "a lark grammar")
    check(refused(client, "tool_choice", input="x", tools=[WEATHER],
                  tool_choice={"type": "function", "name": "nope"}) is True, "tool_choice naming no tool")


class Weather(pydantic.BaseModel):
    city: str
    sunny: bool


calls = []


def tool_part(client, port):
    # 5. responses.stream, the client's helper
    with client.responses.stream(model=SMOL_NAME, input="Say hello.", max_output_tokens=48,
                                 temperature=0) as s:
        evs = list(s)
        final = s.get_final_response()
    deltas = "".join(e.delta for e in evs if e.type == "response.output_text.delta")
    check(final.status == "completed" and final.output_text == deltas and deltas, f"stream: {final}")
    check({e.item_id for e in evs if hasattr(e, "item_id")} == {final.output[0].id}, "stream ids")
    # 6. a function tool loop
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(model=SMOL_NAME, input=ask, tools=[WEATHER], tool_choice="required",
                                parallel_tool_calls=False, temperature=0, max_output_tokens=64)
    fc = [o for o in r.output if o.type == "function_call"]
    check(len(fc) == 1 and re.fullmatch(r"fc_[0-9a-f]{32}", fc[0].id) and
          re.fullmatch(r"call_[A-Za-z0-9]{24}", fc[0].call_id) and fc[0].name == "get_weather",
          f"call: {r.output}")
    if fc:
        args = json.loads(fc[0].arguments)
        try:
            jsonschema.validate(args, WEATHER["parameters"])
            check(True, "")
        except jsonschema.ValidationError as e:
            check(False, f"arguments: {e}")
        back = ask + [o.model_dump(exclude_none=True) for o in r.output] + \
            [{"type": "function_call_output", "call_id": fc[0].call_id, "output": "Sunny, 24 C."}]
        r2 = client.responses.create(model=SMOL_NAME, input=back, tools=[WEATHER], temperature=0,
                                     max_output_tokens=48)
        check(r2.output and r2.output[0].type in ("message", "function_call"), f"after the tool: {r2.output}")
    events = list(client.responses.create(model=SMOL_NAME, input=ask, tools=[WEATHER], tool_choice="required",
                                          parallel_tool_calls=False, temperature=0, max_output_tokens=64,
                                          stream=True))
    types = [e.type for e in events]
    check(types[:3] == ["response.created", "response.in_progress", "response.output_item.added"] and
          types[-4:] == ["response.function_call_arguments.delta", "response.function_call_arguments.done",
                         "response.output_item.done", "response.completed"], f"call events: {types}")
    done = events[-1].response.output
    check(len(done) == 1 and events[2].item.id == done[0].id == events[-2].item.id and
          events[2].item.call_id == done[0].call_id and events[2].item.arguments == "" and
          all(e.item_id == done[0].id for e in events if hasattr(e, "item_id")) and
          events[-3].arguments == done[0].arguments ==
          "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta"),
          f"call ids: {done}")
    codex = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
             {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Call it."}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": '{"city":"Rome"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "Rainy."},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Rainy."}]},
             {"type": "message", "role": "assistant", "content": []}, {"role": "user", "content": "Thanks."}]
    r3 = client.responses.create(model=SMOL_NAME, input=codex, tools=[WEATHER], max_output_tokens=4)
    check(r3.status in ("completed", "incomplete"), f"codex history: {r3}")
    # compaction (Codex's, when its context fills): the history's user messages and one compaction item;
    # with the same tools the conversation's prompt is the one just served, so the prefix cache holds it;
    # the compacted items continue the conversation
    c = client.responses.compact(model=SMOL_NAME, input=codex, extra_body={"tools": [WEATHER]})  # as Codex
    check(c.object == "response.compaction" and
          [o.type for o in c.output] == ["message", "message", "compaction"] and
          [[(p.type, p.text) for p in o.content] for o in c.output[:2]] ==
          [[("input_text", "Weather?")], [("input_text", "Thanks.")]] and
          c.output[2].encrypted_content.startswith("llm-cmp1.") and
          re.fullmatch(r"cmp_[0-9a-f]{32}", c.output[2].id) and
          c.usage.input_tokens_details.cached_tokens > 0 and c.usage.output_tokens > 0, f"compact: {c}")
    with warnings.catch_warnings():  # the SDK types an output message as the assistant's: the user's warn
        warnings.simplefilter("ignore", UserWarning)
        kept = [o.model_dump(exclude_none=True) for o in c.output]
    r5 = client.responses.create(model=SMOL_NAME, input=kept +
                                 [{"role": "user", "content": "And in Rome?"}], tools=[WEATHER],
                                 max_output_tokens=4)
    check(r5.status in ("completed", "incomplete"), f"after the compaction: {r5}")
    # custom tools (free text in): a custom_tool_call item, ctc_ id, its input events, its round trip
    shell = {"type": "custom", "name": "shell", "description": "Runs a shell command."}
    ask = [{"role": "user", "content": "List the files."}]
    events = list(client.responses.create(model=SMOL_NAME, input=ask, tools=[shell], temperature=0,
                                          tool_choice={"type": "custom", "name": "shell"},
                                          max_output_tokens=64, parallel_tool_calls=False, stream=True))
    out = events[-1].response.output
    done = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    check(len(out) == 1 and out[0].type == "custom_tool_call" and
          re.fullmatch(r"ctc_[0-9a-f]{32}", out[0].id) and
          out[0].name == "shell" and isinstance(out[0].input, str) and len(done) == 1 and
          done[0].input == out[0].input and done[0].item_id == out[0].id, f"custom tool call: {out}")
    if out and out[0].type == "custom_tool_call":
        back = ask + [out[0].model_dump(exclude_none=True),
                      {"type": "custom_tool_call_output", "call_id": out[0].call_id, "output": "a.txt"}]
        r4 = client.responses.create(model=SMOL_NAME, input=back, tools=[shell], max_output_tokens=4)
        check(r4.status in ("completed", "incomplete"), f"custom round trip: {r4}")
    # parallel calls (tool_choice required, parallel_tool_calls true: SmolLM2 greedy calls again and again):
    # one function_call item per call at consecutive output indexes, each closed (arguments.done,
    # output_item.done) before the next opens, call_ids distinct, all of it in the completed object
    events = list(client.responses.create(model=SMOL_NAME, input=[{"role": "user", "content":
                                          "What is the weather in Paris and in Rome?"}], tools=[WEATHER],
                                          tool_choice="required", temperature=0, max_output_tokens=96,
                                          stream=True))
    final = events[-1].response
    fcalls = [o for o in final.output if o.type == "function_call"]
    order, open_index, interleaved = [], None, False
    for e in events:
        if e.type == "response.output_item.added":
            interleaved |= open_index is not None
            open_index = e.output_index
            order.append(e.output_index)
        elif e.type == "response.output_item.done":
            interleaved |= open_index != e.output_index
            open_index = None
        elif hasattr(e, "output_index"):
            interleaved |= open_index != e.output_index
    check(len(fcalls) >= 2 and order == list(range(len(final.output))) and not interleaved and
          len({c.call_id for c in fcalls}) == len(fcalls) and
          all(re.fullmatch(r"call_[A-Za-z0-9]{24}", c.call_id) for c in fcalls),
          f"parallel calls: {len(fcalls)} calls, order {order}, interleaved {interleaved}: {final.output}")
    # 7. structured output, streamed through the client's helper: its final response is parsed
    with client.responses.stream(model=SMOL_NAME, input="The weather in Oslo: sunny.", text_format=Weather,
                                 temperature=0, max_output_tokens=64) as s:
        parsed = s.get_final_response().output_parsed
    check(isinstance(parsed, Weather), f"stream(text_format=...): {parsed!r}")
    # 7. structured output
    p = client.responses.parse(model=SMOL_NAME, input="The weather in Oslo: sunny.", text_format=Weather,
                               temperature=0, max_output_tokens=64)
    check(isinstance(p.output_parsed, Weather), f"parse: {p.output_text!r}")
    # 8. the Agents SDK
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    set_tracing_disabled(True)  # else it sends traces to api.openai.com

    @function_tool
    def get_weather(city: str) -> str:
        """Get the weather of a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    async def run():
        aclient = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k3y", max_retries=0)
        agent = Agent(name="weather", instructions="You answer questions about the weather.",
                      tools=[get_weather], model=OpenAIResponsesModel(SMOL_NAME, aclient),
                      model_settings=ModelSettings(tool_choice="required", temperature=0,
                                                   parallel_tool_calls=False))
        return await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    result = asyncio.run(run())
    check(calls and all(isinstance(c, str) and c for c in calls), f"agent's tool calls: {calls}")
    check(isinstance(result.final_output, str) and result.final_output,
          f"agent's answer: {result.final_output!r}")


servers = []
try:
    for model, log, part in ((STORIES, "llm-test-responses.log", text_part),
                              (SMOL, "llm-test-responses-smol.log", tool_part)):
        proc, port = start(model, log)
        servers.append(proc)
        check(port is not None, f"the server starts ({model})")
        if port is None:
            continue
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k3y", max_retries=0,
                               timeout=300)
        part(client, port)
finally:
    for proc in servers:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
sys.exit(check.summary())
