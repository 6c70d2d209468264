"""POST /v1/responses through the real server with the official `openai` client
(`client.responses.create`, unchanged), greedy for determinism.

Runs on the session's shared `main_server`. Every answer is also read raw and validated
with the client's own models (`Response`, each `ResponseStreamEvent`), so a field the
client needs but does not check is still checked. Responses run the chat path, so a
greedy answer equals the chat completion of the same messages.
"""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

MODEL = "builtin:smollm2-135m"
QUESTION = "What is the capital of France?"
EVENTS = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def client(main_server) -> OpenAI:
    return OpenAI(base_url=main_server.base_url, api_key="unused", max_retries=0, timeout=120)


def raw(server, **body) -> dict:
    """The non-streamed body as sent, validated with the client's Response model."""
    r = httpx.post(server.base_url + "/responses", json={"model": MODEL, "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    Response.model_validate(r.json())
    return r.json()


def raw_events(server, **body) -> list[dict]:
    """A stream's events as sent; each is checked against the client's event models, its
    `event:` name against its type, and sequence numbers count up from 0."""
    payload = {"model": MODEL, "temperature": 0, **body, "stream": True}
    with httpx.stream("POST", server.base_url + "/responses", json=payload, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert len(lines) % 2 == 0, lines
    events = []
    for name, data in zip(lines[::2], lines[1::2], strict=True):
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def test_text_answer_equals_the_chat_answer_streamed_or_not(client, main_server):
    out = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0
    )
    assert out.id.startswith("resp_") and out.object == "response" and out.status == "completed"
    assert out.output_text and out.output_text == chat.choices[0].message.content
    assert [(item.type, item.role) for item in out.output] == [("message", "assistant")]
    assert out.output[0].content[0].type == "output_text" and out.output[0].content[0].annotations == []
    assert out.usage.input_tokens == chat.usage.prompt_tokens
    assert out.usage.output_tokens == chat.usage.completion_tokens
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert out.usage.input_tokens_details.cached_tokens == 0 and out.usage.output_tokens_details.reasoning_tokens == 0

    events = list(client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0, stream=True))
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == out.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == out.usage.output_tokens

    sent = raw_events(main_server, input=QUESTION, max_output_tokens=24)
    assert [e["type"] for e in sent] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * len(of_type(sent, "response.output_text.delta")),
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
    ]
    assert of_type(sent, "response.output_text.done")[0]["text"] == out.output_text
    assert sent[0]["response"]["status"] == "in_progress" and sent[0]["response"]["output"] == []
    assert sent[-1]["response"]["id"] == sent[0]["response"]["id"]


def test_the_stream_helper_accumulates_the_same_answer(client):
    with client.responses.stream(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0) as stream:
        final = stream.get_final_response()
    assert final.output_text == client.responses.create(
        model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0
    ).output_text


def test_max_output_tokens_cuts_the_answer_as_incomplete(client, main_server):
    out = client.responses.create(model=MODEL, input="Tell me a long story about a dragon.", max_output_tokens=4, temperature=0)
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 4 and out.output_text
    assert out.output[0].status == "incomplete" and out.max_output_tokens == 4
    body = raw(main_server, input="Tell me a long story about a dragon.", max_output_tokens=4)
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}

    events = raw_events(main_server, input="Tell me a long story about a dragon.", max_output_tokens=4)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["usage"]["output_tokens"] == 4
    assert "".join(e["delta"] for e in of_type(events, "response.output_text.delta")) == out.output_text


def test_instructions_and_item_input_are_the_chat_messages(client, main_server):
    items = [
        {"role": "developer", "content": "Answer in one short sentence."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a color."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Blue.", "annotations": []}]},
        {"role": "user", "content": "Name another one."},
    ]
    out = client.responses.create(model=MODEL, instructions="You are terse.", input=items, max_output_tokens=16, temperature=0)
    chat = client.chat.completions.create(model=MODEL, max_tokens=16, temperature=0, messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": "Answer in one short sentence."},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Name another one."},
    ])
    assert out.output_text == chat.choices[0].message.content
    assert out.usage.input_tokens == chat.usage.prompt_tokens
    assert out.instructions == "You are terse."


def test_settings_are_echoed(client, main_server):
    out = client.responses.create(
        model=MODEL, input="Hi", max_output_tokens=4, temperature=0, top_p=0.5, store=False,
        metadata={"team": "search"}, user="user-1", parallel_tool_calls=False,
    )
    assert out.metadata == {"team": "search"} and out.user == "user-1" and out.store is False
    assert out.temperature == 0 and out.top_p == 0.5 and out.parallel_tool_calls is False
    assert out.model == MODEL and out.tools == [] and out.text.format.type == "text"
    assert abs(out.created_at - time.time()) < 300
    body = raw(main_server, input="Hi", max_output_tokens=4)
    assert body["previous_response_id"] is None and body["truncation"] == "disabled"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_json_schema_format_yields_json_that_validates(client, main_server, stream):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    if stream:
        events = raw_events(main_server, input="Make up a person.", text={"format": fmt}, max_output_tokens=60)
        text = "".join(e["delta"] for e in of_type(events, "response.output_text.delta"))
        final = events[-1]["response"]
        assert final["status"] == "completed"
        assert final["output"][0]["content"][0]["text"] == text
        assert final["text"]["format"]["name"] == "person"
    else:
        out = client.responses.create(model=MODEL, input="Make up a person.", text={"format": fmt}, max_output_tokens=60, temperature=0)
        assert out.status == "completed" and out.text.format.type == "json_schema"
        text = out.output_text
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_format_yields_a_json_object(client):
    out = client.responses.create(
        model=MODEL, input="Describe a cat as JSON.", text={"format": {"type": "json_object"}},
        max_output_tokens=80, temperature=0,
    )
    if out.status == "completed":
        assert isinstance(json.loads(out.output_text), dict)
    else:  # an object without bounds may run to the token limit; it is still JSON so far
        assert out.output_text.startswith("{")


def _call_of(out) -> dict:
    calls = [item for item in out.output if item.type == "function_call"]
    assert calls, out.output
    return calls[0]


@pytest.mark.parametrize("choice", ["named", "required"])
def test_a_forced_function_tool_yields_a_function_call_item(client, main_server, choice):
    tool_choice = {"type": "function", "name": "get_weather"} if choice == "named" else "required"
    ask = {"model": MODEL, "input": "What is the weather in Paris?", "tools": [WEATHER], "tool_choice": tool_choice,
           "max_output_tokens": 60, "temperature": 0}
    out = client.responses.create(**ask)
    assert out.status == "completed"
    call = _call_of(out)
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert out.tools[0].name == "get_weather" and out.tools[0].parameters == WEATHER["parameters"]

    events = raw_events(main_server, **{k: v for k, v in ask.items() if k != "model"})
    added = [e for e in of_type(events, "response.output_item.added") if e["item"]["type"] == "function_call"]
    assert added and added[0]["item"]["arguments"] == "" and added[0]["item"]["name"] == "get_weather"
    deltas = [e for e in of_type(events, "response.function_call_arguments.delta") if e["item_id"] == added[0]["item"]["id"]]
    done = of_type(events, "response.function_call_arguments.done")[0]
    assert "".join(e["delta"] for e in deltas) == done["arguments"] == call.arguments
    assert events[-1]["type"] == "response.completed"


def test_parallel_tool_calls_false_gives_one_call(client):
    out = client.responses.create(
        model=MODEL, input="What is the weather in Paris and in Rome?", tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=60, temperature=0,
    )
    assert [item.type for item in out.output] == ["function_call"]


def test_a_second_turn_takes_the_call_and_its_output(client):
    first = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60, temperature=0,
    )
    call = _call_of(first)
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        *[item.model_dump(exclude_none=True) for item in first.output],  # the output items, sent back
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 21, "sky": "sunny"}'},
    ]
    second = client.responses.create(model=MODEL, input=history, tools=[WEATHER], max_output_tokens=32, temperature=0)
    assert second.status in ("completed", "incomplete") and second.output
    assert second.usage.input_tokens > first.usage.input_tokens

    chat = client.chat.completions.create(model=MODEL, max_tokens=32, temperature=0, tools=[
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}},
    ], messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}},
        ]},
        {"role": "tool", "tool_call_id": call.call_id, "content": '{"temperature_c": 21, "sky": "sunny"}'},
    ])
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == (chat.choices[0].message.content or "")


BAD_REQUESTS = [
    ("empty string input", {"input": ""}, "input"),
    ("empty item list", {"input": []}, "input"),
    ("unknown item type", {"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ("bad role", {"input": [{"role": "tool", "content": "hi"}]}, "input"),
    ("image content", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input"),
    ("negative max_output_tokens", {"input": "hi", "max_output_tokens": -1}, "max_output_tokens"),
    ("string max_output_tokens", {"input": "hi", "max_output_tokens": "8"}, "max_output_tokens"),
    ("web_search tool", {"input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
    ("chat-shaped tool", {"input": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("previous_response_id", {"input": "hi", "previous_response_id": "resp_abc"}, "previous_response_id"),
    ("background", {"input": "hi", "background": True}, "background"),
    ("include", {"input": "hi", "include": ["message.output_text.logprobs"]}, "include"),
    ("tool_choice without tools", {"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ("tool_choice of an unknown function", {"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ("invalid json_schema", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objekt"}}}}, "text.format"),
    ("format and forced tool", {"input": "hi", "tools": [WEATHER], "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "text.format"),
    ("invalid tool parameters", {"input": "hi", "tools": [{**WEATHER, "parameters": {"type": "objekt"}}], "tool_choice": {"type": "function", "name": "get_weather"}}, "tools[get_weather].parameters"),
    ("unknown format type", {"input": "hi", "text": {"format": {"type": "yaml"}}}, "text"),
    ("negative temperature", {"input": "hi", "temperature": -1}, "temperature"),
]


@pytest.mark.parametrize(("body", "param"), [case[1:] for case in BAD_REQUESTS], ids=[case[0] for case in BAD_REQUESTS])
def test_bad_input_is_a_400_naming_the_field(main_server, body, param):
    r = httpx.post(main_server.base_url + "/responses", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
    assert error["param"] == param and error["message"]


def test_errors_reach_the_client_as_its_exceptions(client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_abc")
    assert "stores no responses" in bad.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="gpt-4o", input="hi")
    assert unknown.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as long:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=100_000)
    assert "max_output_tokens" in long.value.message  # the engine's rule, in this request's words


def test_the_openapi_document_describes_the_endpoint(main_server):
    doc = httpx.get(main_server.url + "/openapi.json", timeout=30).json()
    op = doc["paths"]["/v1/responses"]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ResponsesRequest")
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ResponseObject")
    assert {"400", "404", "503"} <= set(op["responses"]) and "text/event-stream" in op["responses"]["200"]["content"]
    request = doc["components"]["schemas"]["ResponsesRequest"]["properties"]
    assert request["max_output_tokens"]["anyOf"][0]["maximum"] == 512


def _metrics_once(server, done, timeout: float = 30.0) -> dict:
    """/metrics, polled until `done(sample)` holds."""
    deadline = time.monotonic() + timeout
    sample = server.metrics()
    while not done(sample):
        assert time.monotonic() < deadline, f"not reached in {timeout} s: {sample}"
        time.sleep(0.1)
        sample = server.metrics()
    return sample


def _idle(sample: dict) -> bool:
    return sample["vllm:num_requests_running"] == 0 and sample["vllm:num_requests_waiting"] == 0


def test_a_stream_left_early_aborts_its_engine_request(main_server):
    abort = f'vllm:request_success_total{{finished_reason="abort",model_name="{MODEL}"}}'
    before = _metrics_once(main_server, _idle)
    body = {"model": MODEL, "input": "List the numbers 1, 2, 3, 4, 5, 6 and continue to 300.",
            "max_output_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", main_server.base_url + "/responses", json=body, timeout=60) as r:
        deltas = 0
        for line in r.iter_lines():
            deltas += line == "event: response.output_text.delta"
            if deltas == 3:
                break
    after = _metrics_once(main_server, _idle)
    assert after.get(abort, 0) == before.get(abort, 0) + 1
    assert after["vllm:kv_cache_usage_perc"] == 0.0
