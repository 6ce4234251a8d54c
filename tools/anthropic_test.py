"""The official anthropic Python client against `llm serve`: Anthropic's Messages API, as Claude Code and
every tool built on the anthropic SDK call it.

Usage: tools/anthropic_test.py [TESTDATA_DIR]   (make test runs it with the virtual environment's python)
It starts ./llm serve on free loopback ports for models/SmolLM2-135M-Instruct.Q4_1.gguf (with an API key,
given as x-api-key, the SDK's way) and for a copy of TESTDATA_DIR/models/random-qwen3-qknorm.gguf whose chat
template is QwQ's (testdata/templates/Qwen-QwQ-32B.jinja: its generation prompt opens <think>, so every
reply begins in its thinking), then runs the client unchanged: messages.create and messages.stream (text,
the same greedy text both ways, the events in Anthropic's order), a tool-use loop (tool_choice any: tool_use
-> tool_result -> answer), count_tokens equal to the prompt's tokens a message reports, stop_sequences,
thinking (a thinking block with its signature, streamed as thinking_delta and signature_delta; budget_tokens
enforced: the thinking cut there, as chat completions' thinking_token_budget cuts it), and the
errors (BadRequestError's status_code and body for a missing max_tokens, an image block, a server tool;
AuthenticationError). It prints "N passed, M failed" and exits non-zero on a failure.
"""
import json, os, shutil, subprocess, sys, tempfile, urllib.error, urllib.request

import anthropic

from serve_port import Checks, listening_port

testdata = sys.argv[1] if len(sys.argv) > 1 else "testdata"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN3 = os.path.join(testdata, "models", "random-qwen3-qknorm.gguf")
QWQ_TEMPLATE = os.path.join(testdata, "templates", "Qwen-QwQ-32B.jinja")
check = Checks("anthropic client")



def with_template(src, dst, template_file):
    """A copy of the GGUF src at dst with tokenizer.chat_template replaced by template_file's text, by the
    gguf package's own script (every other key and tensor as it is)"""
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", src, dst, "--chat-template-file",
                    template_file, "--force"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def serve(name, model, *flags):
    """./llm serve on a free port, its log in tmp (shown on a failure): the process and its port"""
    log_path = os.path.join(tmp, f"{name}.log")
    proc = subprocess.Popen(["./llm", "serve", "-m", model, "--port", "0", *flags],
                            stderr=open(log_path, "w"))
    port = listening_port(proc, log_path, 60)
    check(port is not None, f"the {name} server starts")
    servers.append((proc, log_path))
    return proc, port


GREEDY = {"temperature": 0}  # the 2026 SDK has no temperature argument: extra_body sends Anthropic's field
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


def text_and_stream(client, model):
    """messages.create and messages.stream: the same greedy text, the stream's events in Anthropic's order"""
    kw = dict(model=model, max_tokens=16, system="You are a helpful assistant.", extra_body=GREEDY,
              messages=[{"role": "user", "content": "Say hello."}])
    m = client.messages.create(**kw)
    check(m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == model
          and len(m.content) == 1 and m.content[0].type == "text" and m.content[0].text
          and m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens > 0, f"create: {m}")
    with client.messages.stream(**kw) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    check(final.content[0].text == m.content[0].text and final.stop_reason == m.stop_reason
          and final.usage.output_tokens == m.usage.output_tokens,
          f"stream's final message {final} != {m}")
    # the SDK adds its own derived events (text...); the wire's order: message_start first, one block,
    # message_delta and message_stop last
    wire = [e for e in events if e in ("message_start", "content_block_start", "content_block_delta",
                                       "content_block_stop", "message_delta", "message_stop")]
    check(wire[0] == "message_start" and wire[1] == "content_block_start" and wire[-3:] ==
          ["content_block_stop", "message_delta", "message_stop"] and wire.count("content_block_start") == 1
          and set(wire[2:-3]) == {"content_block_delta"}, f"stream events: {wire}")
    # count_tokens: the prompt's tokens, as the message counts them (cache reads included)
    n = client.messages.count_tokens(model=model, system=kw["system"], messages=kw["messages"])
    m2 = client.messages.create(**kw)
    check(n.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens
          == m2.usage.input_tokens + m2.usage.cache_read_input_tokens and m2.usage.cache_read_input_tokens > 0
          and m.usage.cache_creation_input_tokens == 0, f"count_tokens {n} vs {m.usage} and {m2.usage}")
    n_tools = client.messages.count_tokens(model=model, messages=kw["messages"], tools=[WEATHER])
    check(n_tools.input_tokens > n.input_tokens - 20, f"count_tokens with tools: {n_tools} vs {n}")
    # a stop sequence: named in stop_sequence, cut from the text
    word = m.content[0].text.split()[1] if len(m.content[0].text.split()) > 1 else m.content[0].text
    st = client.messages.create(**kw, stop_sequences=[word])
    check(st.stop_reason == "stop_sequence" and st.stop_sequence == word and word not in st.content[0].text
          and m.content[0].text.startswith(st.content[0].text), f"stop_sequences [{word!r}]: {st}")


def tool_loop(client, model, transcript):
    """tool_choice any: a tool_use block, its tool_result sent back, then an answer"""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = dict(model=model, max_tokens=100, tools=[WEATHER], messages=messages, extra_body=GREEDY,
                tool_choice={"type": "any", "disable_parallel_tool_use": True})
    m = client.messages.create(**call)
    uses = [b for b in m.content if b.type == "tool_use"]
    check(m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
          and uses[0].id.startswith("toolu_") and isinstance(uses[0].input.get("city"), str),
          f"tool_use: {m}")
    if not uses:
        return
    transcript.append(f">>> user: {messages[0]['content']}")
    transcript.append(f"<<< {m.stop_reason}: tool_use {uses[0].id} "
                      f"{uses[0].name}({json.dumps(uses[0].input)})")
    # the same streamed: a tool_use block whose input_json_delta pieces make the same input
    with client.messages.stream(**call) as s:
        final = s.get_final_message()
    su = [b for b in final.content if b.type == "tool_use"]
    check(final.stop_reason == "tool_use" and len(su) == 1 and su[0].input == uses[0].input
          and su[0].id.startswith("toolu_"), f"streamed tool_use: {final}")
    result = f"It is sunny and 21 C in {uses[0].input['city']}."
    messages += [{"role": "assistant", "content": m.content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                               "content": result}]}]
    transcript.append(f">>> tool_result {uses[0].id}: {result}")
    a = client.messages.create(model=model, max_tokens=40, tools=[WEATHER], messages=messages,
                               extra_body=GREEDY)
    check(a.stop_reason in ("end_turn", "max_tokens") and a.content[0].type == "text" and a.content[0].text,
          f"answer after the tool_result: {a}")
    transcript.append(f"<<< {a.stop_reason}: {a.content[0].text!r}")
    n = client.messages.count_tokens(model=model, tools=[WEATHER], messages=messages)
    check(n.input_tokens == a.usage.input_tokens + a.usage.cache_read_input_tokens,
          f"count_tokens of the loop {n} vs {a.usage}")


def errors(client, model):
    """Anthropic's error shape and statuses, as the SDK raises them"""
    def bad_request(what, expect, **kw):
        try:
            if "max_tokens" in kw:
                client.messages.create(model=model, **kw)
            else:  # the SDK itself refuses a call without max_tokens: the request as a raw POST, through it
                client.post("/v1/messages", body={"model": model, **kw}, cast_to=anthropic.types.Message)
            check(False, f"{what}: no error")
        except anthropic.BadRequestError as e:
            check(e.status_code == 400 and e.body == {"type": "error", "error": {
                "type": "invalid_request_error", "message": expect}}, f"{what}: {e.status_code} {e.body}")
    hello = [{"role": "user", "content": "hi"}]
    bad_request("no max_tokens", "max_tokens: Field required", messages=hello)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    bad_request("an image", "messages.0.content.1.type: image blocks are not supported by this server (a "
                "user message takes text and tool_result)", max_tokens=4,
                messages=[{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}])
    bad_request("a server tool", "tools.0.type: web_search_20250305 tools are not supported by this server "
                "(only custom tools: name, description, input_schema)", max_tokens=4, messages=hello,
                tools=[{"type": "web_search_20250305", "name": "web_search"}])
    bad_request("mcp_servers", "mcp_servers: not supported by this server", max_tokens=4, messages=hello,
                extra_body={"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]})
    bad_request("temperature 1.5", "temperature: temperature must be between 0 and 1, got 1.5", max_tokens=4,
                messages=hello, extra_body={"temperature": 1.5})
    bad_request("thinking on a model that does not think", "thinking: this model's chat template does not "
                "think", max_tokens=2000, messages=hello, thinking={"type": "enabled", "budget_tokens": 1024})
    try:
        client.messages.create(model="claude-sonnet-4", max_tokens=4, messages=hello)
        check(False, "another model: no error")
    except anthropic.NotFoundError as e:
        check(e.status_code == 404 and e.body["error"]["type"] == "not_found_error",
              f"another model: {e.body}")


def chat(port, body):
    """POST /v1/chat/completions with body (raw HTTP, as vLLM's fields go): the status and the JSON answer"""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def thinking(client, model, port):
    """thinking enabled on a template whose prompt opens <think>, and whose model thinks past 1030 tokens
    greedily: budget_tokens 1024 of max_tokens 1030 cuts the thinking at 1024 tokens ("</think>" forced),
    so a thinking block (its signature too) whose text is that of the first 1024 tokens (chat completions'
    reasoning at max_tokens 1024), then a text block; the same streamed (thinking_delta, signature_delta)
    and as chat completions' thinking_token_budget (vLLM's); disabled, or not asked for: no thinking block"""
    kw = dict(model=model, max_tokens=1030, messages=[{"role": "user", "content": "Think."}],
              extra_body=GREEDY)
    m = client.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 1024})
    check([b.type for b in m.content] == ["thinking", "text"] and len(m.content[0].thinking) > 0
          and m.content[0].signature.startswith("llm1.") and m.stop_reason == "max_tokens"
          and m.usage.output_tokens == 1030, f"thinking: {str(m)[:400]}")
    status, cut = chat(port, {"messages": kw["messages"], "max_tokens": 1024, "temperature": 0})
    cut = cut["choices"][0]["message"] if status == 200 else cut
    check(cut.get("reasoning_content") == m.content[0].thinking and not cut.get("content"),
          f"thinking: the first 1024 tokens' thinking: {str(cut)[-200:]} != {m.content[0].thinking[-200:]}")
    status, vllm = chat(port, {"messages": kw["messages"], "max_tokens": 1030, "temperature": 0,
                               "thinking_token_budget": 1024})
    vllm = vllm["choices"][0]["message"] if status == 200 else vllm
    check(vllm.get("reasoning_content") == m.content[0].thinking and
          vllm.get("content") == m.content[-1].text,
          f"thinking_token_budget: {str(vllm)[-300:]}")
    status, zero = chat(port, {"messages": kw["messages"], "max_tokens": 4, "thinking_token_budget": 0})
    check(status == 400 and zero["error"]["param"] == "thinking_token_budget" and zero["error"]["message"] ==
          "thinking_token_budget must be between 1 and 1073741824, got 0", f"thinking_token_budget 0: {zero}")
    with client.messages.stream(**kw, thinking={"type": "enabled", "budget_tokens": 1024}) as s:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in s]
        final = s.get_final_message()
    def blocks(msg):  # the stream's text block is a ParsedTextBlock: compare what the blocks say
        return [(b.type, getattr(b, "thinking", None), getattr(b, "signature", None),
                 getattr(b, "text", None)) for b in msg.content]
    check(blocks(final) == blocks(m), f"streamed thinking: {str(final)[-300:]} != {str(m)[-300:]}")
    check(("content_block_delta", "thinking_delta") in kinds and
          ("content_block_delta", "signature_delta") in kinds, f"thinking events: {set(kinds)}")
    off = client.messages.create(**kw, thinking={"type": "disabled"})
    check([b.type for b in off.content] == ["text"] and off.content[0].text == "", f"thinking off: {off}")
    try:
        client.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 2000})
        check(False, "budget_tokens >= max_tokens: no error")
    except anthropic.BadRequestError as e:
        check(e.body["error"]["message"] == "thinking.budget_tokens: must be less than max_tokens",
              f"{e.body}")


servers = []
transcript = []
tmp = tempfile.mkdtemp(prefix="llm-anthropic-")
try:
    qwq = os.path.join(tmp, "random-qwen3-qwq.gguf")
    with_template(QWEN3, qwq, QWQ_TEMPLATE)
    smol, smol_port = serve("smol", SMOL, "--api-key", "k3y")
    think, think_port = serve("qwq", qwq)
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{smol_port}", api_key="k3y", max_retries=0,
                                 timeout=120)
    model = "SmolLM2-135M-Instruct.Q4_1"
    text_and_stream(client, model)
    tool_loop(client, model, transcript)
    errors(client, model)
    try:
        wrong = anthropic.Anthropic(base_url=f"http://127.0.0.1:{smol_port}", api_key="wrong", max_retries=0)
        wrong.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        check(False, "a wrong key: no error")
    except anthropic.AuthenticationError as e:
        check(e.status_code == 401 and e.body["error"]["type"] == "authentication_error",
              f"wrong key: {e.body}")
    thinking(anthropic.Anthropic(base_url=f"http://127.0.0.1:{think_port}", api_key="none", max_retries=0,
                                 timeout=120), "random-qwen3-qwq", think_port)
finally:
    for p, log_path in servers:
        p.terminate()
        check(p.wait(timeout=60) == 0, f"{log_path}: the server exits 0 on SIGTERM")
        if check.failed:
            print(open(log_path).read()[-4000:])
    shutil.rmtree(tmp)
if transcript:
    print("anthropic client tool loop against llm serve (SmolLM2):\n  " + "\n  ".join(transcript))
sys.exit(check.summary())
