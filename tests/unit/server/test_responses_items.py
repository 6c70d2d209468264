"""Responses API items, both ways, without a server: input items -> the chat request
that /v1/responses runs, and chat chunks -> output items and events (each event checked
with the `openai` client's own event models)."""

from __future__ import annotations

import pytest
from llmservice.server.api.responses import chat_request, input_messages
from llmservice.server.api.responses_protocol import ResponsesRequest
from llmservice.server.api.responses_stream import ChatStreamError, ResponseEvents
from llmservice.server.api.tokenizer_service import message_dicts
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError


def request(**body) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"input": "hi", **body})


def messages(items, instructions=None) -> list[dict]:
    return input_messages(instructions, request(input=items).input)


def test_a_string_is_one_user_message_after_the_instructions():
    assert input_messages("Be brief.", "Hi") == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
    ]
    assert input_messages(None, "Hi") == [{"role": "user", "content": "Hi"}]


def test_message_items_keep_their_role_and_join_their_text_parts():
    got = messages([
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Two "}, {"type": "input_text", "text": "parts."},
        ]},
        {"role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Ok.", "annotations": []}]},
    ])
    assert got == [
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": "Two parts."},
        {"role": "assistant", "content": "Ok."},
    ]


def test_function_calls_are_assistant_tool_calls_and_outputs_tool_messages():
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a": 1}', "id": "fc_1", "status": "completed"}
    got = messages([
        {"role": "user", "content": "Go."},
        call,
        {**call, "call_id": "call_2", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]},
        {"role": "assistant", "content": "Done, calling again."},
        {**call, "call_id": "call_3"},
    ])
    fn = {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert got == [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "tool_calls": [  # consecutive calls: one turn, as parallel chat calls
            {"id": "call_1", **fn}, {"id": "call_2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
        {"role": "assistant", "content": "Done, calling again.", "tool_calls": [{"id": "call_3", **fn}]},
    ]


def test_the_chat_request_is_what_the_responses_request_asks_for():
    tool = {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    chat = chat_request(request(
        model="m", instructions="sys", max_output_tokens=7, temperature=0.5, top_p=0.9, user="u",
        tools=[tool], tool_choice={"type": "function", "name": "f"}, parallel_tool_calls=False,
    ))
    assert chat.model == "m" and chat.max_tokens == 7 and chat.temperature == 0.5 and chat.top_p == 0.9
    assert chat.user == "u" and chat.parallel_tool_calls is False and chat.n == 1
    assert chat.stream is True and chat.stream_options.include_usage is True  # read back as events
    assert [t.model_dump(exclude_none=True) for t in chat.tools] == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}},
    ]
    assert chat.tool_choice.function.name == "f"
    assert message_dicts(chat.messages) == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]

    fmt = chat_request(request(text={"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}}))
    assert fmt.response_format.type == "json_schema"
    assert fmt.response_format.json_schema.schema_ == schema and fmt.response_format.json_schema.name == "n"
    assert chat_request(request(text={"format": {"type": "json_object"}})).response_format.type == "json_object"
    assert chat_request(request(text={"format": {"type": "text"}})).response_format is None
    assert chat_request(request(tool_choice="none")).tool_choice == "none"


@pytest.mark.parametrize("body", [
    {"input": ""}, {"input": []}, {"input": 3},
    {"input": [{"type": "reasoning"}]},
    {"input": [{"role": "tool", "content": "x"}]},
    {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
    {"input": [{"type": "function_call_output", "output": "x"}]},
    {"tools": [{"type": "web_search"}]},
    {"tool_choice": {"type": "allowed_tools", "tools": []}},
    {"max_output_tokens": 0},
    {"truncation": "auto"},
])
def test_what_cannot_become_a_chat_request_is_refused_by_the_model(body):
    with pytest.raises(ValidationError) as err:
        request(**body)
    assert err.value.errors()[0]["loc"][0] == next(iter(body))


# ---- output: chat chunks -> events --------------------------------------------------------

EVENT = TypeAdapter(ResponseStreamEvent)
HEAD = {
    "id": "resp_", "object": "response", "created_at": 0, "model": "m", "error": None, "incomplete_details": None,
    "usage": None, "instructions": None, "metadata": {}, "max_output_tokens": None, "temperature": 1.0,
    "top_p": 1.0, "parallel_tool_calls": True, "tools": [], "tool_choice": "auto", "text": {"format": {"type": "text"}},
    "truncation": "disabled", "user": None, "store": True, "background": False, "previous_response_id": None,
}
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "choices": choices, **({"usage": usage} if usage else {})}


def call(index: int, arguments: str, name: str | None = "f") -> dict:
    piece = {"index": index, "function": {"arguments": arguments}}
    if name is not None:
        piece.update(id=f"call_{index}", type="function", function={"name": name, "arguments": arguments})
    return {"tool_calls": [piece]}


def run(*chunks: dict) -> tuple[list[dict], dict]:
    events = ResponseEvents(dict(HEAD))
    sent = [e for c in chunks for e in events.chunk(c)]
    for e in sent:
        EVENT.validate_python(e)
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    Response.model_validate(events.final)
    return sent, events.final


def test_text_then_calls_make_items_in_order_and_the_id_is_the_chat_request_s():
    sent, final = run(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let me check."}),
        chunk(call(0, "")), chunk(call(0, '{"a":', name=None)), chunk(call(0, " 1}", name=None)),
        chunk(call(1, "{}"), finish="tool_calls"),
        chunk(usage=USAGE),
    )
    assert final["id"] == "resp_abc" and final["status"] == "completed"
    assert [(i["type"], i["status"]) for i in final["output"]] == [
        ("message", "completed"), ("function_call", "completed"), ("function_call", "completed"),
    ]
    assert final["output"][0]["content"][0]["text"] == "Let me check."
    assert [i.get("arguments") for i in final["output"][1:]] == ['{"a": 1}', "{}"]
    assert final["usage"]["input_tokens"] == 5 and final["usage"]["output_tokens"] == 3
    added = [e["item"] for e in sent if e["type"] == "response.output_item.added"]
    assert [i["status"] for i in added] == ["in_progress"] * 3 and added[1]["arguments"] == ""
    assert sent[-1]["type"] == "response.completed"


def test_whitespace_around_calls_is_no_message_and_an_empty_answer_is_one():
    _, final = run(chunk({"content": "\n"}), chunk(call(0, "{}")), chunk({"content": "\n"}, finish="stop"), chunk(usage=USAGE))
    assert [i["type"] for i in final["output"]] == ["function_call"]
    _, final = run(chunk({"content": " "}, finish="stop"), chunk(usage=USAGE))
    assert [(i["type"], i["content"][0]["text"]) for i in final["output"]] == [("message", " ")]


def test_length_is_incomplete_and_abort_failed():
    _, final = run(chunk({"content": "Once"}, finish="length"), chunk(usage=USAGE))
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    sent, final = run(chunk({"content": "x"}, finish="abort"), chunk(usage=USAGE))
    assert final["status"] == "failed" and final["error"]["code"] == "server_error"
    assert sent[-1]["type"] == "response.failed"


def test_an_error_chunk_ends_the_stream_with_an_error_event():
    events = ResponseEvents(dict(HEAD))
    events.chunk(chunk({"content": "x"}))
    with pytest.raises(ChatStreamError) as err:
        events.chunk({"error": {"message": "the engine failed", "type": "InternalServerError", "param": None, "code": 500}})
    event = events.error(err.value.error)
    EVENT.validate_python(event)
    assert event["type"] == "error" and event["code"] == "500" and event["message"] == "the engine failed"
