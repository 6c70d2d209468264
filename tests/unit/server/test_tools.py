"""Tool calling and structured outputs, pure parts: request -> constraint, tool parsers
(streamed pieces merge to the whole-answer message), 400s that name the bad part."""

from __future__ import annotations

import json

import pytest
from llmservice.server.api.errors import APIError
from llmservice.server.api.params import check_structured, structured_spec
from llmservice.server.api.protocol import ChatCompletionRequest, CompletionRequest
from llmservice.server.api.tool_parsers import make_parser, merge, num_calls
from llmservice.server.api.tools import plan_tools, template_message_calls

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
NAMES = ("get_weather", "add")


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_tool_choice_modes():
    assert plan_tools(chat()).mode == "none"
    assert plan_tools(chat(tools=[WEATHER])).mode == "auto"
    assert plan_tools(chat(tools=[WEATHER], tool_choice="none")).spec is None
    required = plan_tools(
        chat(tools=[WEATHER, ADD], tool_choice="required", parallel_tool_calls=False)
    )
    schema = json.loads(required.spec.source)
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    assert [alt["properties"]["name"]["enum"] for alt in schema["items"]["anyOf"]] == [
        ["get_weather"],
        ["add"],
    ]
    named = plan_tools(
        chat(
            tools=[WEATHER, ADD],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    )
    assert (
        named.mode == "named" and json.loads(named.spec.source) == WEATHER["function"]["parameters"]
    )
    assert named.template_tools[0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(
    "fields, param",
    [
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
    ],
)
def test_bad_tool_requests_name_the_field(fields, param):
    with pytest.raises(APIError) as err:
        plan_tools(chat(**fields))
    assert err.value.status == 400 and err.value.param == param


def test_structured_specs_from_both_apis():
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}
    assert structured_spec(chat(response_format=fmt)).kind == "json_schema"
    assert structured_spec(chat(response_format={"type": "json_object"})).kind == "json_object"
    assert structured_spec(chat(response_format={"type": "text"})) is None
    req = CompletionRequest.model_validate(
        {"prompt": "x", "structured_outputs": {"choice": ["yes", 'n"o']}}
    )
    spec = structured_spec(req)
    assert spec.kind == "grammar" and spec.source == 'root ::= "yes" | "n\\"o"'
    check_structured(spec, "structured_outputs")  # the escaped choice is a valid grammar
    with pytest.raises(APIError, match="exactly one"):
        structured_spec(chat(structured_outputs={"regex": "a", "grammar": 'root ::= "a"'}))
    with pytest.raises(APIError, match="cannot both"):
        structured_spec(
            chat(response_format={"type": "json_object"}, structured_outputs={"regex": "a+"})
        )


@pytest.mark.parametrize(
    "fields, needle",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "p", "schema": {"type": "objekt"}},
                }
            },
            "objekt",
        ),
        ({"structured_outputs": {"regex": "[a-"}}, "Unclosed"),
        ({"structured_outputs": {"grammar": "root ::= "}}, "EBNF"),
        (
            {
                "structured_outputs": {
                    "json": '{"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}'
                }
            },
            "nowhere",
        ),
    ],
)
def test_invalid_constraints_are_400_naming_the_field(fields, needle):
    req = chat(**fields)
    with pytest.raises(APIError) as err:
        check_structured(
            structured_spec(req),
            "structured_outputs" if req.structured_outputs else "response_format",
        )
    assert err.value.status == 400 and needle in err.value.message
    assert err.value.param == (
        "structured_outputs" if "structured_outputs" in fields else "response_format"
    )


def _stream(parser, pieces: list[str]) -> list[dict]:
    out = []
    for p in pieces:
        out.extend(parser.feed(p))
    return out + parser.finish()


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


HERMES = (
    'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
    '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
)


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_hermes_calls_and_content_stream_the_same_as_whole(size):
    whole = merge(_stream(make_parser("auto", NAMES, None, "hermes"), [HERMES]))
    parser = make_parser("auto", NAMES, None, "hermes")
    streamed = _stream(parser, _chunks(HERMES, size))
    assert num_calls(parser) == 2
    content, calls = merge(streamed)
    assert content == whole[0] == "Let me check.\n"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("add", {"a": 1}),
    ]
    assert [c["function"] for c in calls] == [c["function"] for c in whole[1]]


def test_text_that_only_looks_like_a_tag_stays_content():
    parser = make_parser("auto", NAMES, None, "hermes")
    text = "a <tool_ and <tool_call>not json</tool_call> b"
    assert merge(_stream(parser, _chunks(text, 2))) == (text, [])
    assert num_calls(parser) == 0


def test_plain_json_parser_and_default_detection():
    text = '[{"name": "add", "parameters": {"a": 2, "b": 3}}]'
    for parser_name in ("json", None):
        parser = make_parser("auto", NAMES, None, parser_name)
        content, calls = merge(_stream(parser, _chunks(text, 4)))
        assert content == "" and calls[0]["function"] == {
            "name": "add",
            "arguments": '{"a": 2, "b": 3}',
        }
    # the default parser reads free text as content; unknown functions are not calls
    assert merge(_stream(make_parser("auto", NAMES, None, None), ["Hello ", "there"])) == (
        "Hello there",
        [],
    )
    unknown = '{"name": "rm_rf", "arguments": {}}'
    assert merge(_stream(make_parser("auto", NAMES, None, "json"), [unknown])) == (unknown, [])


def test_required_array_streams_each_call_when_it_closes():
    text = '[{"name": "get_weather", "parameters": {"city": "a}\\"]["}}, {"name": "add", "parameters": {"a": 1}}]'
    parser = make_parser("required", NAMES, None, None)
    seen = []
    for ch in text:
        seen.append(len([d for d in parser.feed(ch) if "tool_calls" in d]))
    assert (
        sum(seen) == 2 and seen.index(1) < len(text) // 2 + 10
    )  # the first call went out mid-stream
    parser = make_parser("required", NAMES, None, None)
    _, calls = merge(_stream(parser, [text]))
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": 'a}"]['}
    truncated = make_parser("required", NAMES, None, None)
    assert merge(_stream(truncated, ['[{"name": "add", "para'])) == ('[{"name": "add", "para', [])


def test_named_streams_arguments_as_generated():
    parser = make_parser("named", NAMES, "add", None)
    deltas = _stream(parser, ['{"a"', ": 1}"])
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": ""}
    content, calls = merge(deltas)
    assert (
        content == ""
        and calls[0]["function"]["arguments"] == '{"a": 1}'
        and calls[0]["id"].startswith("call_")
    )


def test_assistant_tool_calls_reach_templates_as_objects():
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    assert template_message_calls(calls)[0]["function"]["arguments"] == {"x": 1}
    bad = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]
    assert template_message_calls(bad)[0]["function"]["arguments"] == "not json"
