#!/usr/bin/env python3
"""Chat-template oracle: renders conversations (tools included) through published Jinja chat templates the
way Hugging Face transformers' apply_chat_template(..., tokenize=False) does, so that the C renderer can be
compared with it byte for byte. Needs only jinja2 (>= 3.1); the "gguf:" source also needs the gguf package.

Usage: tools/chat_oracle.py < CASES      (one JSON object per line in, one JSON line out per input line)

Input fields (all but "template"/"template_text" and "messages" optional):
  template        path of a .jinja file, relative to the repository root (or absolute), or "gguf:PATH" to use
                  the tokenizer.chat_template string of a GGUF file (PATH relative to the repository root)
  template_text   the template itself, instead of "template"
  messages        OpenAI-style list: roles system/user/assistant/tool; assistant "tool_calls":
                  [{"id", "type": "function", "function": {"name", "arguments"}}]; tool "tool_call_id"
  tools           list of {"type": "function", "function": {...}}, or null (default null). Passed to the
                  template as given, like transformers does with dicts (see "vllm" below for vLLM's form)
  documents       list of dicts or null (default null), passed as "documents" like transformers does
  add_generation_prompt   bool, default false (transformers' default)
  continue_final_message  bool, default false: transformers' prefill handling of the last message
  bos_token, eos_token    strings; left undefined in the template when absent
  special_tokens  extra special-token variables (unk_token, pad_token, ...), like tokenizer.special_tokens_map
  kwargs          extra template variables (enable_thinking, date_string, ...); they override the tokens,
                  as apply_chat_template's {**special_tokens_map, **kwargs} does
  parse_arguments bool, default true: a tool call's "arguments" given as a JSON string becomes the parsed
                  object before rendering, as vLLM's _postprocess_messages does (its newest form: a string
                  that is not valid JSON, or JSON that is not an object, becomes {}; null/""/missing becomes
                  {}; a dict stays; an empty tool_calls list is removed from the message). false: the
                  messages reach the template exactly as given (plain transformers)
  vllm            bool, default false: also normalise the way vLLM's chat endpoint does before it calls
                  apply_chat_template: each message keeps only role, content, name, tool_calls (assistant),
                  reasoning/reasoning_content (assistant), tool_call_id (tool); content null becomes "" and a
                  list of text parts becomes their texts joined with "\\n" ("string" content format); each
                  tool becomes pydantic's model_dump() of ChatCompletionToolsParam: {"type": "function",
                  "function": {"name", "description" (null if absent), "parameters" (null if absent), extra
                  keys...}}
Output: {"text": rendered} or {"error": "ExceptionType: message"} (raise_exception gives TemplateError).
"""
import copy
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Generation(jinja2.ext.Extension):
    """transformers' AssistantTracker: parses {% generation %}...{% endgeneration %} and renders its body
    unchanged (the assistant-mask tracking it adds is not needed for text)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers overrides Jinja's tojson (which escapes HTML characters and sorts keys)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


_compiled = {}


def compile_template(text):
    """transformers.utils.chat_template_utils._cached_compile_jinja_template"""
    if text not in _compiled:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_Generation, jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        _compiled[text] = env.from_string(text)
    return _compiled[text]


_sources = {}


def template_text(case):
    if "template_text" in case:
        return case["template_text"]
    src = case["template"]
    if src not in _sources:
        if src.startswith("gguf:"):
            from gguf import GGUFReader
            path = os.path.join(ROOT, src[5:])
            field = GGUFReader(path).fields.get("tokenizer.chat_template")
            if field is None:
                raise ValueError("%s has no tokenizer.chat_template" % path)
            _sources[src] = field.contents()
        else:
            with open(os.path.join(ROOT, src), encoding="utf-8", newline="") as f:
                _sources[src] = f.read()
    return _sources[src]


def parse_arguments(messages):
    """vLLM's _postprocess_messages (vllm/renderers/chat_utils/parse_chat_message.py)."""
    for message in messages:
        if message.get("role") != "assistant" or "tool_calls" not in message:
            continue
        tool_calls = message.get("tool_calls")
        if not isinstance(tool_calls, list):
            continue
        if len(tool_calls) == 0:
            message.pop("tool_calls", None)
            continue
        for item in tool_calls:
            if not isinstance(item, dict):
                raise ValueError("assistant tool_calls entries must be objects.")
            function = item.get("function")
            if item.get("type", "function") != "function" or not isinstance(function, dict):
                raise ValueError("chat completions only support assistant tool_calls of type 'function'.")
            content = function.get("arguments")
            if content:
                if isinstance(content, dict):
                    parsed = content
                else:
                    if isinstance(content, str):
                        try:
                            parsed = json.loads(content)
                        except json.JSONDecodeError:
                            parsed = None
                    else:
                        parsed = content
                    if not isinstance(parsed, dict):
                        parsed = {}
                function["arguments"] = parsed
            else:
                function["arguments"] = {}


def vllm_messages(messages):
    """vLLM's _parse_chat_message_content with the "string" content format."""
    out = []
    for m in messages:
        role = m["role"]
        content = m.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            text = "\n".join(p if isinstance(p, str) else p.get("text", "") for p in content
                             if isinstance(p, str) or p.get("type") in ("text", "input_text", "output_text",
                                                                        "refusal", "thinking"))
        r = {"role": role, "content": text}
        if role == "assistant":
            if m.get("tool_calls") is not None:
                r["tool_calls"] = list(m["tool_calls"])
            reasoning = m.get("reasoning", m.get("reasoning_content"))
            if reasoning is not None:
                r["reasoning"] = reasoning
                r["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in m:
                r["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            r["name"] = m["name"]
        out.append(r)
    return out


def vllm_tools(tools):
    """[tool.model_dump() for tool in request.tools]: declared fields first, in declaration order, with their
    defaults; extra keys (OpenAIBaseModel allows them) after."""
    out = []
    for t in tools:
        f = t.get("function", {})
        fn = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
        fn.update((k, v) for k, v in f.items() if k not in fn)
        d = {"type": t.get("type", "function"), "function": fn}
        d.update((k, v) for k, v in t.items() if k not in d)
        out.append(d)
    return out


def render(case):
    """transformers' apply_chat_template(tokenize=False) -> render_jinja_template, for one conversation."""
    compiled = compile_template(template_text(case))
    messages = copy.deepcopy(case["messages"])
    tools = copy.deepcopy(case.get("tools"))
    if case.get("vllm"):
        messages = vllm_messages(messages)
        if tools is not None:
            tools = vllm_tools(tools)
    if case.get("parse_arguments", True):
        parse_arguments(messages)
    add_generation_prompt = case.get("add_generation_prompt", False)
    continue_final_message = case.get("continue_final_message", False)
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
    kwargs = {}
    for k in ("bos_token", "eos_token"):
        if k in case:
            kwargs[k] = case[k]
    kwargs.update(case.get("special_tokens") or {})
    kwargs.update(case.get("kwargs") or {})
    documents = case.get("documents")

    tag = "CONTINUE_FINAL_MESSAGE_TAG "
    final_message = None
    if continue_final_message:
        final_message = messages[-1].get("content")
        if final_message is None:
            raise ValueError('continue_final_message is set but the final message has no "content" to '
                             'continue!')
        if isinstance(final_message, (list, tuple)):
            for block in reversed(final_message):
                if "text" in block:
                    final_message = block["text"]
                    block["text"] = block["text"] + tag
                    break
            else:
                raise ValueError("continue_final_message is set but we could not find any text to continue "
                                 "in the final message!")
        else:
            messages[-1]["content"] = final_message + tag
    text = compiled.render(messages=messages, tools=tools, documents=documents,
                           add_generation_prompt=add_generation_prompt, **kwargs)
    if continue_final_message:
        if final_message.strip() not in text or tag.strip() not in text:
            raise ValueError("continue_final_message is set but the final message does not appear in the "
                             "chat after applying the chat template!")
        loc = text.rindex(tag.strip())
        if text[loc:loc + len(tag)] == tag:
            text = text[:loc]
        else:
            text = text[:loc].rstrip()
    return text


def main():
    sys.stdin.reconfigure(encoding="utf-8")
    sys.stdout.reconfigure(encoding="utf-8")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = {"text": render(json.loads(line))}
        except Exception as e:  # the template's own errors included: they are answers too
            out = {"error": "%s: %s" % (type(e).__name__, e)}
        try:
            s = json.dumps(out, ensure_ascii=False)
            s.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: only \u escapes can carry them
            s = json.dumps(out, ensure_ascii=True)
        sys.stdout.write(s + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
