"""Bodies of `POST /v1/responses` (OpenAI's Responses API), strict as protocol.py's.

The request is what this server can serve by turning it into a chat completion
(responses.py): `input` items are messages, function calls and their outputs; tools
are function tools only, in the Responses API's flat shape. Every field the server
cannot honour is stated in the schema (so /openapi.json and the 400s agree): nothing
is stored, so `previous_response_id`, `conversation` and `background` are refused.

Input items need no `type` when they are messages (`{"role": "user", "content": "hi"}`
is OpenAI's short form), so items are told apart by a callable discriminator: a
missing `type` means `message`, and an unknown one gets a single clear error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from llmservice.server.api.protocol import (
    GENERATION_RESPONSES,
    ONLY_ZERO,
    SSE,
    TOOL_CHOICE_NEEDS_TOOLS,
    APIModel,
    FunctionDefinition,
    JSONSchemaFormat,
    RequestModel,
    TokenCount,
    TopLogprobs,
    schema_rules,
)
from pydantic import ConfigDict, Discriminator, Field, Tag

MAX_METADATA = 16  # OpenAI's limits on `metadata`: 16 pairs, 64-character keys, 512-character values
NOTHING_STORED = "not supported: this server stores no responses (send the whole conversation in `input`)"
ONLY_NULL = {"type": "null"}


def _json_kind(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "list" if isinstance(value, list) else None


def text_or_list(text: Any, items: Any, label: str) -> Any:
    """`text | items`, told apart by the JSON type: only the branch sent is validated, so
    an error's location names it (`input.list.0...`), not every branch's type."""
    return Annotated[
        Annotated[text, Tag("text")] | Annotated[items, Tag("list")],
        Discriminator(_json_kind, custom_error_type="string_or_list", custom_error_message=f"must be a string or a list of {label}"),
    ]


class InputText(RequestModel):
    type: Literal["input_text"]
    text: str


class OutputText(RequestModel):
    """An earlier answer's text, as the client got it back (its annotations are ignored)."""

    type: Literal["output_text"]
    text: str


TextPart = Annotated[InputText | OutputText, Field(discriminator="type")]


class MessageItem(RequestModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: text_or_list(str, list[TextPart], "content parts")


class FunctionCallItem(RequestModel):
    """A call the model made in an earlier turn (an output item sent back)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(RequestModel):
    """The client's result of that call."""

    type: Literal["function_call_output"]
    call_id: str
    output: text_or_list(str, list[InputText], "input_text parts")


def _item_kind(item: Any) -> str | None:
    if isinstance(item, dict):
        return item.get("type", "message")
    return getattr(item, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(
        _item_kind,
        custom_error_type="input_item_unsupported",
        custom_error_message="unsupported input item type: this server takes message, function_call and function_call_output items",
    ),
]


class FunctionTool(FunctionDefinition):
    """The Responses API's function tool: chat's `function` object, flat, with a `type`."""

    type: Literal["function"]


class FunctionToolChoice(RequestModel):
    type: Literal["function"]
    name: str


class TextFormatText(RequestModel):
    type: Literal["text"]


class TextFormatJSONObject(RequestModel):
    type: Literal["json_object"]


class TextFormatJSONSchema(JSONSchemaFormat):
    """Chat's `response_format.json_schema`, flat, with a `type`; the schema is required."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema", description="a JSON Schema")


TextFormat = Annotated[TextFormatText | TextFormatJSONObject | TextFormatJSONSchema, Field(discriminator="type")]


class TextConfig(RequestModel):
    format: TextFormat | None = None


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=MAX_METADATA),
]


class ResponsesRequest(RequestModel):
    model_config = ConfigDict(json_schema_extra=schema_rules(TOOL_CHOICE_NEEDS_TOOLS))

    model: str | None = None
    input: text_or_list(Annotated[str, Field(min_length=1)], Annotated[list[InputItem], Field(min_length=1)], "input items")
    instructions: str | None = Field(None, description="a system message before the input")
    max_output_tokens: TokenCount | None = Field(None, description="default: the rest of the context")
    temperature: float | None = Field(None, ge=0, description="0 means greedy; default 1")
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    metadata: Metadata | None = None
    parallel_tool_calls: bool = True
    tools: list[FunctionTool] | None = Field(None, description="function tools only")
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = Field(
        None, description="default: auto when tools are given, else none"
    )
    text: TextConfig | None = None
    user: str | None = None
    store: bool | None = Field(None, description="accepted; nothing is stored either way")
    previous_response_id: str | None = Field(None, description=NOTHING_STORED, json_schema_extra=ONLY_NULL)
    conversation: str | dict[str, Any] | None = Field(None, description=NOTHING_STORED, json_schema_extra=ONLY_NULL)
    background: bool | None = Field(None, description="only false: answers are never stored", json_schema_extra={"enum": [False, None]})
    prompt: dict[str, Any] | None = Field(None, description="stored prompts are not supported", json_schema_extra=ONLY_NULL)
    include: list[str] | None = Field(None, description="accepted only empty (not implemented)", json_schema_extra={"maxItems": 0})
    truncation: Literal["disabled"] | None = Field(None, description="only disabled: a prompt too long is a 400")
    top_logprobs: TopLogprobs | None = Field(None, description="accepted only as 0 (not implemented)", json_schema_extra=ONLY_ZERO)


# ---- the response ------------------------------------------------------------------------

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputTextPart(APIModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)


class OutputMessage(APIModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputTextPart]


class OutputFunctionCall(APIModel):
    id: str
    type: Literal["function_call"] = "function_call"
    status: ItemStatus
    call_id: str
    name: str
    arguments: str = Field(description="JSON text")


OutputItem = Annotated[OutputMessage | OutputFunctionCall, Field(discriminator="type")]


class InputTokensDetails(APIModel):
    cached_tokens: int = Field(0, description="always 0: prefix-cache hits are not reported per request")
    cache_write_tokens: int = 0


class OutputTokensDetails(APIModel):
    reasoning_tokens: int = 0


class ResponseUsage(APIModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(APIModel):
    reason: Literal["max_output_tokens"] | None = None


class ResponseError(APIModel):
    code: str
    message: str


class ResponseObject(APIModel):
    id: str = Field(description="resp_...")
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    instructions: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    max_output_tokens: int | None = None
    temperature: float
    top_p: float
    parallel_tool_calls: bool
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any]
    text: dict[str, Any]
    truncation: Literal["disabled"] = "disabled"
    user: str | None = None
    store: bool
    background: bool = False
    previous_response_id: None = None


# The same answers as the other generation endpoints; a stream is the Responses API's
# named events (`event:` and `data:` lines), which end without chat's `data: [DONE]`.
RESPONSES_SSE_EVENT = {
    "type": "object", "required": ["event", "data"],
    "properties": {"event": {"type": "string", "description": "the event's type"},
                   "data": {"type": "string", "description": "the event as JSON, with its type and sequence_number"}},
}
RESPONSES_RESPONSES: dict[int | str, dict[str, Any]] = {
    **GENERATION_RESPONSES,
    200: {"description": (
        "the response; with stream true, server-sent events (`event: TYPE` and `data: EVENT`, each "
        "event with its sequence_number) from response.created to response.completed, "
        "response.incomplete or response.failed (or an error event)"
    ), "content": {SSE: {"schema": RESPONSES_SSE_EVENT}}},
}
