"""Tool calls and structured outputs through the OpenAI server: the Hermes parser (whole and
streamed, malformed calls as text), tool_choice named / "required" (enforced by grammars) /
"auto" (parsed; a stubbed model output), response_format and vLLM's guided_* fields, driven
by the official openai client over in-process ASGI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")

from octavo.entrypoints.chat_utils import apply_chat_template  # noqa: E402
from octavo.entrypoints.openai.tool_parsers import HermesToolParser, ToolCall  # noqa: E402
from octavo.entrypoints.openai.tool_parsers.tool_choice import (  # noqa: E402
    ToolCallHandler,
    parse_required,
    required_tools_constraint,
)
from octavo.outputs import CompletionOutput, RequestOutput  # noqa: E402
from octavo.sampling_params import RequestOutputKind  # noqa: E402
from tests.running_server import openai_http_library, wait_idle  # noqa: E402

httpx = openai_http_library(openai)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 24},
                                  "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object",
                                       "properties": {"tz": {"type": "string",
                                                             "maxLength": 12}},
                                       "required": ["tz"]}}}
CALL_TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Paris", "unit": "c"}}\n</tool_call>\n<tool_call>\n'
             '{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')


# ------------------------------------------------------------------ the Hermes parser
def _stream_all(parser, text: str, step: int):
    items = []
    for i in range(0, len(text), step):
        items += parser.stream(text[i: i + step])
    items += parser.finish()
    content = "".join(x for x in items if isinstance(x, str))
    calls = [(c.name, json.loads(c.arguments)) for c in items if isinstance(c, ToolCall)]
    return content, calls


def test_hermes_extracts_calls_and_leading_text():
    got = HermesToolParser().extract(CALL_TEXT)
    assert got.content == "Let me check.\n"
    assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {"tz": "CET"})]
    assert HermesToolParser().extract("just text").content == "just text"
    # The output ended inside a call: still a call when its JSON is whole.
    cut = HermesToolParser().extract('<tool_call>{"name": "f", "arguments": {}}')
    assert [c.name for c in cut.tool_calls] == ["f"] and cut.content is None


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "f", "arguments": {</tool_call>',  # bad JSON
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>["f"]</tool_call>',
    "<tool_call>",
])
def test_hermes_malformed_calls_are_text(text):
    got = HermesToolParser().extract(text)
    assert got.tool_calls == [] and got.content == text
    content, calls = _stream_all(HermesToolParser(), text, 3)
    assert calls == [] and content == text


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_hermes_streaming_equals_whole(step):
    content, calls = _stream_all(HermesToolParser(), CALL_TEXT, step)
    whole = HermesToolParser().extract(CALL_TEXT)
    assert content.startswith(whole.content) and content.strip() == whole.content.strip()
    assert calls == [(c.name, json.loads(c.arguments)) for c in whole.tool_calls]
    # Text that only looks like the start of a tag is sent once it cannot be one.
    content, calls = _stream_all(HermesToolParser(), "a <tool b <tool_cal", step)
    assert content == "a <tool b <tool_cal" and calls == []


def test_required_schema_and_handler_messages():
    functions = [WEATHER["function"], TIME["function"]]
    schema = required_tools_constraint(functions).json
    good = [{"name": "get_time", "parameters": {"tz": "UTC"}}]
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "nope", "parameters": {}}], schema)
    assert required_tools_constraint(functions, parallel=False).json["maxItems"] == 1
    assert [c.name for c in parse_required(json.dumps(good))] == ["get_time"]
    assert parse_required('[{"name": "get_time", "param') is None

    msg, reason = ToolCallHandler("named", name="get_weather").message('{"city": "X"}', "stop")
    assert msg["content"] is None and reason == "stop"
    assert msg["tool_calls"][0]["function"] == {"name": "get_weather",
                                                "arguments": '{"city": "X"}'}
    msg, reason = ToolCallHandler("required").message(json.dumps(good), "stop")
    assert reason == "tool_calls" and msg["tool_calls"][0]["function"]["name"] == "get_time"
    msg, reason = ToolCallHandler("auto", parser_factory=HermesToolParser).message(
        "no call", "stop")
    assert msg == {"role": "assistant", "content": "no call"} and reason == "stop"


def test_named_stream_deltas_have_openai_shape():
    h = ToolCallHandler("named", name="f")
    first = h.stream(0, '{"a"')
    assert first[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert first[0]["tool_calls"][0]["id"].startswith("call_")
    assert first[1] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}
    assert h.stream(0, ": 1}") == [{"tool_calls": [{"index": 0,
                                                    "function": {"arguments": ": 1}"}}]}]
    assert h.finish(0, "stop") == ([], "stop")


def test_chat_template_receives_tools_and_mapping_arguments():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, chat_template, tokenize,
                                add_generation_prompt, **kwargs):
            self.seen = (messages, kwargs)
            return "rendered"

    tok = Tok()
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]},
                {"role": "tool", "content": "12:00", "tool_call_id": "c1"}]
    apply_chat_template(tok, messages, tools=[WEATHER])
    seen, kwargs = tok.seen
    assert kwargs == {"tools": [WEATHER]}
    assert seen[1]["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"}
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"tz": "UTC"}'
    apply_chat_template(tok, messages[:1])
    assert tok.seen[1] == {}


# ------------------------------------------------------------------ the server
@pytest.fixture(scope="module")
def engine():
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(EngineArgs(max_model_len=512, max_num_seqs=16))
    yield llm
    llm.shutdown()


def _client(app) -> openai.OpenAI:
    """The sync openai client over an in-process ASGI transport (no socket)."""
    transport = _SyncASGI(app)
    return openai.OpenAI(base_url="http://test/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(transport=transport))


class _SyncASGI(httpx.BaseTransport):
    """httpx's ASGI transport is async only: run it on a private loop per request."""

    def __init__(self, app) -> None:
        self.inner = httpx.ASGITransport(app=app)

    def handle_request(self, request):
        async def go():
            response = await self.inner.handle_async_request(request)
            body = b"".join([part async for part in response.stream])
            return httpx.Response(response.status_code, headers=response.headers,
                                  content=body)

        return asyncio.run(go())


@pytest.fixture(scope="module")
def client(engine):
    from octavo.entrypoints.openai.api_server import ServerSettings, build_app

    return _client(build_app(engine, ServerSettings(served_model_names=["smol"],
                                                    shutdown_engine=False)))


@pytest.fixture(autouse=True)
def _settle(request):
    yield
    if "engine" in request.fixturenames:
        wait_idle(request.getfixturevalue("engine"))


PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"]}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


def test_response_format_json_schema_and_json_object(client):
    fmt = {"type": "json_schema",
           "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    out = client.chat.completions.create(model="smol", messages=ASK, temperature=0,
                                         max_tokens=48, response_format=fmt)
    jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)
    out = client.chat.completions.create(
        model="smol", messages=ASK, temperature=0, max_tokens=48,
        response_format={"type": "json_object"}).choices[0]
    # Any object: the model may go on past max_tokens (then it is a valid prefix).
    assert out.message.content.startswith("{")
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.message.content), dict)
    text = client.chat.completions.create(model="smol", messages=ASK, temperature=0,
                                          max_tokens=4, response_format={"type": "text"})
    assert text.choices[0].message.content


def test_guided_fields_on_completions_and_chat(client):
    regex = r"[0-9]{3}-[a-z]{2,4}"
    out = client.completions.create(model="smol", prompt="Ticket code:", max_tokens=12,
                                    temperature=0, extra_body={"guided_regex": regex})
    import re

    assert re.fullmatch(regex, out.choices[0].text)
    choices = ["red", "green", "blue"]
    out = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "A colour?"}], temperature=0,
        max_tokens=6, extra_body={"guided_choice": choices})
    assert out.choices[0].message.content in choices
    out = client.completions.create(
        model="smol", prompt="Answer:", max_tokens=6, temperature=0,
        extra_body={"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}})
    assert out.choices[0].text in ("yes", "no")
    stream = client.chat.completions.create(
        model="smol", messages=ASK, temperature=0, max_tokens=48, stream=True,
        extra_body={"guided_json": PERSON, "structured_outputs": None})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("body, param", [
    ({"guided_regex": "("}, "guided_regex"),
    ({"guided_json": {"type": "frob"}}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"nope": 1}}, "structured_outputs"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"guided_regex": "a", "guided_decoding_backend": "nope"}, "guided_regex"),
])
def test_bad_constraints_are_400_naming_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smol", prompt="x", max_tokens=2, extra_body=body)
    assert e.value.body["param"] == param, e.value.body


def test_named_tool_choice_gives_a_valid_call(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = client.chat.completions.create(
        model="smol", messages=messages, tools=[WEATHER, TIME], temperature=0, max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = out.choices[0].message
    assert msg.content is None and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    # Streamed: the id and name first, then the arguments, which add up to valid JSON.
    chunks = list(client.chat.completions.create(
        model="smol", messages=messages, tools=[WEATHER], temperature=0, max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    args = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(args) == json.loads(call.function.arguments)


def test_required_tool_choice_gives_valid_calls(client):
    messages = [{"role": "user", "content": "Weather in Rome, and the time in Tokyo?"}]
    out = client.chat.completions.create(
        model="smol", messages=messages, tools=[WEATHER, TIME], tool_choice="required",
        temperature=0, max_tokens=80)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


@pytest.mark.parametrize("body, param", [
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice"),  # no --tool-call-parser
    ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "guided_regex"),
])
def test_bad_tool_requests_are_400(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=ASK, max_tokens=2,
                                       extra_body=body)
    assert e.value.body["param"] == param, e.value.body


class _Stubbed:
    """The real AsyncLLM, but ``generate`` answers with a canned text (in small deltas when
    streamed): what a Qwen model would write for the Hermes parser to read."""

    def __init__(self, engine, text: str) -> None:
        self._engine, self.text = engine, text

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def generate(self, prompt, params, request_id, **kwargs
                       ) -> AsyncIterator[RequestOutput]:
        def out(text, done):
            comp = CompletionOutput(0, text, [1] * len(text), None, None,
                                    "stop" if done else None)
            return RequestOutput(request_id, prompt.get("prompt"), [1, 2], None, [comp], done)

        if params.output_kind == RequestOutputKind.DELTA:
            for i in range(0, len(self.text), 7):
                yield out(self.text[i: i + 7], False)
            yield out("", True)
        else:
            yield out(self.text, True)

    start_request = generate  # what the servers call (sending at once): the same canned text


@pytest.fixture
def auto_client(engine):
    from octavo.entrypoints.openai.api_server import ServerSettings, build_app

    def make(text: str) -> openai.OpenAI:
        app = build_app(_Stubbed(engine, text), ServerSettings(
            served_model_names=["smol"], shutdown_engine=False, tool_call_parser="hermes"))
        return _client(app)

    return make


def test_auto_tool_choice_parses_hermes_calls(auto_client):
    client = auto_client(CALL_TEXT)
    messages = [{"role": "user", "content": "Weather in Paris and the time?"}]
    out = client.chat.completions.create(model="smol", messages=messages,
                                         tools=[WEATHER, TIME], max_tokens=100)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {"tz": "CET"})]
    chunks = list(client.chat.completions.create(model="smol", messages=messages,
                                                 tools=[WEATHER, TIME], max_tokens=100,
                                                 stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content.strip() == "Let me check."
    calls: dict[int, dict] = {}
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(tc.index, {"name": None, "args": "", "id": None})
            entry["name"] = tc.function.name or entry["name"]
            entry["id"] = tc.id or entry["id"]
            entry["args"] += tc.function.arguments or ""
    assert [(v["name"], json.loads(v["args"])) for _, v in sorted(calls.items())] == [
        ("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {"tz": "CET"})]
    assert all(v["id"] for v in calls.values())
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_tool_choice_malformed_call_is_text(auto_client):
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    client = auto_client(text)
    messages = [{"role": "user", "content": "Weather?"}]
    out = client.chat.completions.create(model="smol", messages=messages, tools=[WEATHER])
    assert out.choices[0].message.content == text
    assert not out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="smol", messages=messages,
                                                 tools=[WEATHER], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    # tool_choice "none": the text as it is, even with a call in it.
    client = auto_client(CALL_TEXT)
    out = client.chat.completions.create(model="smol", messages=messages, tools=[WEATHER],
                                         tool_choice="none")
    assert out.choices[0].message.content == CALL_TEXT
