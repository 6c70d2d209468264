"""Tool calling: what `tools` + `tool_choice` ask of generation (pure).

* `none`: free text; the chat template still sees the tools (as vLLM).
* `auto` (the default with tools): free text, parsed afterwards for the model's own
  tool-call format (tool_parsers.py: Hermes `<tool_call>` tags, plain JSON).
* `required`: generation is constrained to a JSON array of `{"name", "parameters"}`
  objects, one alternative per function (its parameters schema); at most one element
  when `parallel_tool_calls` is false.
* a named function: generation is constrained to that function's parameters schema;
  the output is its arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from llmservice.server.api.errors import APIError
from llmservice.server.api.protocol import ChatCompletionRequest
from llmservice.server.engine.grammar_spec import StructuredSpec

ToolMode = Literal["none", "auto", "required", "named"]
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ToolPlan:
    mode: ToolMode
    names: tuple[str, ...] = ()
    named: str | None = None  # the function of a named tool_choice
    spec: StructuredSpec | None = None  # the constraint for required / named
    template_tools: list[dict] | None = field(default=None, compare=False)  # for the chat template


def required_schema(tools: dict[str, dict], parallel: bool) -> dict:
    """A non-empty array of calls, each `{"name": one of the tools, "parameters": its schema}`."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
            "required": ["name", "parameters"],
        }
        for name, params in tools.items()
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def plan_tools(req: ChatCompletionRequest) -> ToolPlan:
    tools = {t.function.name: (t.function.parameters or ANY_OBJECT) for t in req.tools or []}
    choice = req.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools: the request has none", "tool_choice")
        return ToolPlan("none")
    if len(tools) != len(req.tools or []):
        raise APIError(400, "tools: function names must be unique", "tools")
    template_tools = [t.model_dump(exclude_none=True, by_alias=True) for t in req.tools or []]
    names = tuple(tools)
    if choice == "none":
        return ToolPlan("none", names, template_tools=template_tools)
    if choice is None or choice == "auto":
        return ToolPlan("auto", names, template_tools=template_tools)
    if choice == "required":
        schema = required_schema(tools, req.parallel_tool_calls)
        spec = StructuredSpec("json_schema", json.dumps(schema, ensure_ascii=False))
        return ToolPlan("required", names, spec=spec, template_tools=template_tools)
    name = choice.function.name
    if name not in tools:
        raise APIError(
            400,
            f"tool_choice names the function {name!r}, which is not among the tools {list(names)}",
            "tool_choice",
        )
    spec = StructuredSpec("json_schema", json.dumps(tools[name], ensure_ascii=False))
    return ToolPlan("named", names, named=name, spec=spec, template_tools=template_tools)


def arguments_text(arguments: Any) -> str:
    """OpenAI's `arguments` is JSON text; the same text in streamed and whole answers."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def template_message_calls(tool_calls: list[dict]) -> list[dict]:
    """Assistant tool calls as chat templates expect them: `arguments` as an object
    (Qwen's and Llama's templates apply `tojson` to it), when it parses."""
    out = []
    for call in tool_calls:
        fn = dict(call.get("function", {}))
        try:
            fn["arguments"] = json.loads(fn.get("arguments", "") or "{}")
        except (TypeError, ValueError):
            pass
        out.append({**call, "function": fn})
    return out
