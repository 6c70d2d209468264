"""Structured outputs and tool calling through the real server, with the `openai` client.

Runs on the session's shared `main_server` (no server of its own). Every schema is
bounded (string lengths, number ranges, item counts) so a 135M model finishes its JSON
within max_tokens: unbounded ones are valid too, but a small model may write digits
until the token budget runs out.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

MODEL = "builtin:smollm2-135m"

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                },
                "required": ["name", "id"],
            }
        },
        "required": ["user"],
    },
    "array": {
        "type": "object",
        "properties": {
            "colors": {
                "type": "array",
                "items": {"type": "string", "maxLength": 10},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["colors"],
    },
    "enum": {
        "type": "object",
        "properties": {"size": {"enum": ["small", "medium", "large"]}, "ok": {"type": "boolean"}},
        "required": ["size", "ok"],
    },
    "optional": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 30},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
            "note": {"type": "string", "maxLength": 20},
        },
        "required": ["title"],
    },
    "bounds": {
        "type": "object",
        "properties": {
            "celsius": {"type": "integer", "minimum": -50, "maximum": 60},
            "humidity": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["celsius", "humidity"],
    },
    "pattern": {
        "type": "object",
        "properties": {
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        },
        "required": ["zip", "code"],
    },
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 1000},
                    "b": {"type": "integer", "minimum": 0, "maximum": 1000},
                },
                "required": ["a", "b"],
            },
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris? Answer in JSON."}]


class Client:
    """A fresh AsyncOpenAI per event loop (a client outlives no `asyncio.run`)."""

    def __init__(self, base_url: str):
        self.base_url = base_url

    def __call__(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key="unused", max_retries=0, timeout=300
        )


@pytest.fixture(scope="module")
def make_client(main_server) -> Client:
    return Client(main_server.base_url)


def run(make, body):
    """Run `body(client)` on a new event loop with a client of its own."""

    async def main():
        async with make() as c:
            return await body(c)

    return asyncio.run(main())


async def _chat(client, stream: bool, **kwargs) -> tuple[str | None, list[dict], str | None]:
    """(content, tool calls as dicts, finish_reason); streamed deltas are concatenated."""
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("messages", ASK)
    if not stream:
        r = await client.chat.completions.create(**kwargs)
        msg = r.choices[0].message
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in msg.tool_calls or []
        ]
        return msg.content, calls, r.choices[0].finish_reason
    content, calls, finish = "", {}, None
    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for c in choice.delta.tool_calls or []:
            call = calls.setdefault(c.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or c.id
            call["name"] = call["name"] or (c.function.name if c.function else None)
            call["arguments"] += (c.function.arguments or "") if c.function else ""
        finish = choice.finish_reason or finish
    return content or None, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize(
    "temperatures",
    [(0.0,), pytest.param((0.0, 0.8), marks=pytest.mark.e2e)],  # sampled too: `make e2e`
    ids=["greedy", "greedy-and-sampled"],
)
def test_json_schemas_validate_greedy_and_sampled_streamed_and_not(make_client, temperatures):
    cases = [
        (name, temperature, stream)
        for name in SCHEMAS
        for temperature in temperatures
        for stream in (False, True)
    ]

    async def one(client, name, temperature, stream):
        fmt = {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True},
        }
        return await _chat(
            client,
            stream,
            messages=[{"role": "user", "content": f"Give an example {name} record as JSON."}],
            response_format=fmt,
            temperature=temperature,
            seed=11,
            max_tokens=120,
        )

    async def all_cases(client):
        return await asyncio.gather(*(one(client, *case) for case in cases))

    results = run(make_client, all_cases)
    for (name, temperature, stream), (content, calls, finish) in zip(cases, results, strict=True):
        assert finish == "stop" and not calls, (name, temperature, stream, content)
        jsonschema.validate(json.loads(content), SCHEMAS[name])
    # greedy: the streamed text is the non-streamed text
    by_case = dict(zip(cases, results, strict=True))
    for name in SCHEMAS:
        assert by_case[(name, 0.0, False)][0] == by_case[(name, 0.0, True)][0]


def test_structured_outputs_extra_on_completions(make_client):
    async def go(client):
        yes_no = await client.completions.create(
            model=MODEL,
            prompt="Is the sky blue? Answer:",
            max_tokens=8,
            temperature=0,
            extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
        )
        phone = await client.completions.create(
            model=MODEL,
            prompt="A phone number:",
            max_tokens=20,
            temperature=0.7,
            seed=3,
            extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}},
        )
        obj = await client.completions.create(
            model=MODEL,
            prompt="A JSON object:",
            max_tokens=60,
            temperature=0,
            n=2,
            extra_body={"response_format": {"type": "json_object"}},
        )
        ebnf = await client.completions.create(
            model=MODEL,
            prompt="Count:",
            max_tokens=20,
            temperature=0,
            extra_body={
                "structured_outputs": {"grammar": 'root ::= "one" (", " ("two" | "three"))*'}
            },
        )
        return yes_no, phone, obj, ebnf

    yes_no, phone, obj, ebnf = run(make_client, go)
    assert yes_no.choices[0].text in ("yes", "no")
    assert len(phone.choices[0].text) == 8 and phone.choices[0].text[3] == "-"
    for choice in obj.choices:  # n > 1: each choice has its own matcher
        assert isinstance(json.loads(choice.text), dict)
    assert ebnf.choices[0].text.startswith("one")


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_tool_calls_are_valid_and_streams_concatenate_to_them(make_client, tool_choice):
    async def go(client):
        kwargs = {"tools": TOOLS, "tool_choice": tool_choice, "temperature": 0, "max_tokens": 120}
        return await asyncio.gather(_chat(client, False, **kwargs), _chat(client, True, **kwargs))

    (content, calls, finish), (s_content, s_calls, s_finish) = run(make_client, go)
    assert content is None and s_content is None and calls
    assert finish == s_finish == ("tool_calls" if tool_choice == "required" else "stop")
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c["name"], c["arguments"]) for c in s_calls
    ]
    for call in calls + s_calls:
        assert call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), PARAMS[call["name"]])
    if tool_choice != "required":
        assert [c["name"] for c in calls] == ["get_weather"]


def test_no_parallel_calls_means_one_call_and_history_with_tool_messages_is_accepted(make_client):
    history = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "celsius"}',
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 18}'},
    ]

    async def go(client):
        one = await _chat(
            client,
            False,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0.9,
            seed=2,
            max_tokens=120,
        )
        answer = await _chat(
            client,
            False,
            messages=history,
            tools=TOOLS,
            tool_choice="none",
            max_tokens=8,
            temperature=0,
        )
        return one, answer

    (_, calls, finish), (content, answer_calls, _) = run(make_client, go)
    assert len(calls) == 1 and finish == "tool_calls"
    assert content and not answer_calls


def test_free_text_greedy_tokens_do_not_depend_on_constrained_neighbours(make_client):
    prompts = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]

    async def free(client):
        return await asyncio.gather(
            *(
                client.completions.create(
                    model=MODEL,
                    prompt=p,
                    max_tokens=16,
                    temperature=0,
                    logprobs=0,
                    extra_body={"ignore_eos": True},
                )
                for p in prompts
            )
        )

    async def mixed(client):
        fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMAS["nested"]}}
        # compiled first, so the constrained requests run alongside the free ones
        await client.chat.completions.create(
            model=MODEL, messages=ASK, response_format=fmt, max_tokens=1
        )
        constrained = [
            client.chat.completions.create(
                model=MODEL, messages=ASK, response_format=fmt, max_tokens=40, temperature=0.8
            )
            for _ in range(3)
        ]
        results = await asyncio.gather(free(client), *constrained)
        return results[0]

    alone = run(make_client, free)
    together = run(make_client, mixed)
    for a, b in zip(alone, together, strict=True):
        assert a.choices[0].logprobs.tokens == b.choices[0].logprobs.tokens


@pytest.mark.parametrize(
    "body, param, needle",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objekt"}},
                }
            },
            "response_format",
            "objekt",
        ),
        ({"extra_body": {"structured_outputs": {"regex": "(ab"}}}, "structured_outputs", "regex"),
        (
            {
                "extra_body": {
                    "structured_outputs": {
                        "json": {"type": "object", "properties": {"a": {"$ref": "#/x"}}}
                    }
                }
            },
            "structured_outputs",
            "#/x",
        ),
        (
            {
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "delete_all"}},
            },
            "tool_choice",
            "delete_all",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"a": {"type": "strin"}},
                            },
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
            "strin",
        ),
    ],
)
def test_bad_constraints_are_400s_naming_the_part_and_the_server_carries_on(
    make_client, body, param, needle
):
    async def go(client):
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, **body)
        ok = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2)
        return err.value, ok

    error, ok = run(make_client, go)
    assert (
        error.status_code == 400
        and error.body["param"] == param
        and needle in error.body["message"]
    )
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_logprobs_of_tokens_the_grammar_masks_are_floored_not_a_500(make_client):
    """Masked tokens have a logprob of -inf, which JSON cannot carry: vLLM's -9999.0 floor."""

    async def both(client):
        completion = await client.completions.create(
            model=MODEL, prompt="Is Paris in France? Answer:", max_tokens=1, temperature=0, logprobs=5,
            extra_body={"structured_outputs": {"choice": ["A"]}},  # one token allowed, 4 masked
        )
        chat = await client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=1, temperature=0, logprobs=True, top_logprobs=5,
            extra_body={"structured_outputs": {"choice": ["A"]}},
        )
        return completion, chat

    completion, chat = run(make_client, both)
    (top,) = completion.choices[0].logprobs.top_logprobs
    assert len(top) >= 5 and -9999.0 in top.values()  # the masked alternatives
    assert completion.choices[0].logprobs.token_logprobs[0] > -9999.0  # the chosen token is allowed
    (entry,) = chat.choices[0].logprobs.content
    assert entry.logprob > -9999.0 and -9999.0 in [t.logprob for t in entry.top_logprobs]
