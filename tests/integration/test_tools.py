"""Tool calling through the official openai client, on Gemma 3 270M served
with each call format: its own built-in template (generic: the tools
described in the conversation) and published templates given by
chat_template_file (Qwen 2.5: hermes; Llama 3.1: llama3; Mistral Nemo:
mistral; Mistral Small 3.2: mistral-args; Qwen3-Coder: xml; Gemma 4:
gemma4, whose answers carry control tokens' text; a forced call in the
last two takes the generic shape). For each: a named call and a
required call (whole and streamed) come back as tool_calls whose
arguments validate against the tool's parameters (jsonschema), finish
reason tool_calls, content null; the stream's deltas add up to the whole
answer's calls; the round trip (the call, the tool's result, the final
answer) renders through the template; tool_choice none leaves the tools
out; bad tools and choices are 400s naming the field."""
import json

import jsonschema
import openai
import pytest

from harness import NAME, Server, shared


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two small numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

FORMATS = {
    "generic": None,
    "hermes": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "llama3": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "mistral-args": "Mistral-Small-3.2-24B-Instruct-2506.jinja",
    "xml": "Qwen3-Coder.jinja",
    "gemma4": "google-gemma-4-31B-it.jinja",
}


@pytest.fixture(scope="module", params=list(FORMATS))
def fmt_srv(request, gemma):
    tmpl = FORMATS[request.param]
    args = ["--n_ctx", "2048"] + (["--chat_template_file", shared(f"testdata/chat-templates/{tmpl}")] if tmpl else [])
    s = Server(gemma, *args)
    yield request.param, s
    s.stop()
    assert f"tool calls: {request.param}" in s.log or (request.param == "generic" and "built-in gemma" in s.log)


def check_calls(calls, allowed):
    assert calls, "no tool calls"
    for c in calls:
        assert c.type == "function" and c.id and c.function.name in allowed
        jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])


def ask(s, **kw):
    return s.client().chat.completions.create(model=NAME, messages=kw.pop("messages", ASK), tools=TOOLS,
                                              max_tokens=kw.pop("max_tokens", 120), temperature=0,
                                              parallel_tool_calls=False, **kw)


def test_named_and_required_calls(fmt_srv):
    name, s = fmt_srv
    for choice, allowed in (({"type": "function", "function": {"name": "add"}}, {"add"}),
                            ("required", {"add", "get_weather"})):
        r = ask(s, tool_choice=choice)
        m = r.choices[0]
        assert m.finish_reason == "tool_calls", (name, m)
        assert m.message.content is None
        check_calls(m.message.tool_calls, allowed)
        assert len(m.message.tool_calls) == 1  # parallel_tool_calls false


def test_stream_deltas_add_up_to_the_calls(fmt_srv):
    name, s = fmt_srv
    whole = ask(s, tool_choice="required").choices[0].message.tool_calls
    content, calls, finish = collect_stream(ask(s, tool_choice="required", stream=True))
    assert finish == "tool_calls" and content == "", (name, content)
    assert calls == [(c.function.name, json.loads(c.function.arguments)) for c in whole]


def test_round_trip(fmt_srv):
    """call -> tool result -> final answer, the history rendered by the template."""
    name, s = fmt_srv
    first = ask(s, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]
    for choice in ("auto", "none"):
        r = ask(s, messages=history, tool_choice=choice, max_tokens=16)
        m = r.choices[0]
        assert m.finish_reason in ("stop", "length", "tool_calls")
        if choice == "none":
            assert m.message.tool_calls is None and isinstance(m.message.content, str)
        if m.message.tool_calls:
            check_calls(m.message.tool_calls, {"add", "get_weather"})


def test_bad_tool_requests(fmt_srv):
    name, s = fmt_srv
    c = s.client()
    bad = [
        (dict(tools=[{"type": "function", "function": {"name": "has space"}}]), "tools"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "string", "contentEncoding": "base64"}}}}}],
              tool_choice="required"), "tools"),
    ]
    for kw, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=NAME, messages=ASK, max_tokens=4, **kw)
        assert e.value.body["param"] == param, (kw, e.value.body)


def collect_stream(stream):
    """(content, [(name, arguments)], finish) from a chat stream's deltas."""
    calls, finish, content = {}, None, ""
    for ch in stream:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return content, [(c["name"], json.loads(c["arguments"])) for c in calls.values()], finish


@pytest.mark.parametrize("prompt", ["What is the weather in Paris?", "Add 2 and 3.", "Say hello."])
def test_auto_stream_equals_whole(fmt_srv, prompt):
    """tool_choice auto, greedy: whatever the model writes (text, calls or
    both), the stream's content and calls are the whole answer's."""
    name, s = fmt_srv
    msgs = [{"role": "user", "content": prompt}]
    whole = ask(s, messages=msgs, tool_choice="auto", max_tokens=48).choices[0]
    content, calls, finish = collect_stream(ask(s, messages=msgs, tool_choice="auto", max_tokens=48, stream=True))
    assert finish == whole.finish_reason, name
    assert calls == [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls or []]
    if whole.message.tool_calls:
        check_calls(whole.message.tool_calls, {"add", "get_weather"})
        assert content.strip() == (whole.message.content or "").strip()
    else:
        assert content == whole.message.content
