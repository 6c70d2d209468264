"""Request and response bodies of the OpenAI-compatible API (pydantic), with vLLM's extras.

Field constraints live here so that FastAPI rejects bad input with a 400 before any
work is done, and so that /openapi.json describes exactly what is accepted (the fuzz
test generates requests from it). NaN and infinity are refused everywhere: a NaN
temperature would otherwise reach the sampler.

Request models are strict, as OpenAI's schema is: a value of the wrong JSON type
(`"max_tokens": "16"`, `"stream": 1`, `"n": 2.5`) is a 400, never coerced. An integral
number (`"n": 2.0`) is an integer, as JSON Schema reads it, so it is accepted. Each chat
role has OpenAI's required fields (a tool message needs `tool_call_id`, an assistant
message needs `content` unless it carries `tool_calls`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
JSON_SAFE_INT = 2**53 - 1
MAX_N = 128  # OpenAI's own limit on `n`
MAX_STOP = 4  # OpenAI: "Up to 4 sequences"
MAX_STOP_CHARS = 512  # one stop string; longer ones only cost the detokenizer
MAX_PROMPTS = 2048  # prompts of one batched completion request
LOGIT_BIAS_MIN, LOGIT_BIAS_MAX = -100, 100  # OpenAI's range



def _integral(value: Any) -> Any:
    """2.0 -> 2: JSON Schema's "integer" is any number without a fractional part. Other
    values pass unchanged to the strict int check (2.5, "2" and true stay 400s)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(ge: int, le: int) -> Any:
    """A bounded Integer. The bounds come before the validator: after it, pydantic
    would enforce them but leave them out of the JSON Schema."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral)]


Integer = Annotated[int, BeforeValidator(_integral)]
TokenCount = integer(1, INT32_MAX)
TopLogprobs = integer(0, 20)
TopK = integer(-1, INT32_MAX)

# A seed is any integer JSON carries exactly (RFC 8259 section 6: doubles, so within
# +-(2**53 - 1)); beyond that a client, or a validator comparing in doubles, would read
# another number than the server does.
Seed = integer(-JSON_SAFE_INT, JSON_SAFE_INT)
BestOf = integer(1, MAX_N)
LogitBias = integer(LOGIT_BIAS_MIN, LOGIT_BIAS_MAX)
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
# Accepted but not implemented: only the no-op value passes (params.py says why in the 400).
ONLY_ZERO = {"enum": [0, None]}
ONLY_EMPTY = {"maxProperties": 0}


def requires_when_set(field: str, needs: str, value: Any) -> dict[str, Any]:
    """JSON Schema for a rule between two fields: `field` set (not null) needs `needs` == value."""
    return {
        "if": {"required": [field], "properties": {field: {"not": {"type": "null"}}}},
        "then": {"required": [needs], "properties": {needs: {"const": value}}},
    }


def schema_rules(*rules: dict[str, Any]):
    """A json_schema_extra that adds cross-field rules (allOf of if/then) to a model's schema."""

    def extra(schema: dict[str, Any]) -> None:
        schema["allOf"] = [*schema.get("allOf", []), *rules]

    return extra


class APIModel(BaseModel):
    # Unknown fields are ignored (as vLLM does) so newer clients keep working.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class RequestModel(APIModel):
    """What clients send: strict JSON types, as OpenAI's schema."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


class StreamOptions(RequestModel):
    include_usage: bool = False


class JSONSchemaFormat(RequestModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema", description="a JSON Schema")
    strict: bool | None = None


class ResponseFormat(RequestModel):
    """OpenAI's `response_format`: free text, any JSON object, or JSON matching a schema."""

    model_config = ConfigDict(json_schema_extra={
        "if": {"required": ["type"], "properties": {"type": {"const": "json_schema"}}},
        "then": {"required": ["json_schema"], "properties": {"json_schema": {
            "type": "object", "required": ["schema"], "properties": {"schema": {"not": {"type": "null"}}},
        }}},
    })

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


def _set(field: str) -> dict[str, Any]:
    return {"required": [field], "properties": {field: {"not": {"enum": [None, False]}}}}


class StructuredOutputs(RequestModel):
    """vLLM's `structured_outputs` extra: exactly one constraint (null or false is unset)."""

    model_config = ConfigDict(json_schema_extra={
        "oneOf": [_set(field) for field in ("json", "regex", "choice", "grammar", "json_object")]
    })

    json_: dict[str, Any] | bool | str | None = Field(None, alias="json", description="a JSON Schema")
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1)] | None = None
    grammar: str | None = Field(None, description="EBNF (GBNF) grammar; the start rule is `root`")
    json_object: bool | None = None


class SamplingFields(RequestModel):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    n: Integer = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0, description="0 means greedy; default 1")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: TopK | None = Field(None, description="vLLM extra; -1 or 0 disables")
    min_tokens: Integer = Field(0, ge=0, le=INT32_MAX)
    seed: Seed | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = Field(
        None, description=f"up to {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters"
    )
    stop_token_ids: list[Integer] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    priority: Integer = Field(
        0, ge=INT32_MIN, le=INT32_MAX,
        description="vLLM semantics: lower is handled earlier; non-zero needs --scheduling-policy priority",
    )
    presence_penalty: float | None = Field(
        None, description="accepted only as 0 (not implemented)", json_schema_extra=ONLY_ZERO
    )
    frequency_penalty: float | None = Field(
        None, description="accepted only as 0 (not implemented)", json_schema_extra=ONLY_ZERO
    )
    logit_bias: dict[str, LogitBias] | None = Field(
        None, description="token id -> bias in [-100, 100]; accepted only empty (not implemented)",
        json_schema_extra=ONLY_EMPTY,
    )
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = Field(None, description="vLLM extra: json, regex, choice or grammar")


STREAM_OPTIONS_NEED_STREAM = requires_when_set("stream_options", "stream", True)


class CompletionRequest(SamplingFields):
    model_config = ConfigDict(json_schema_extra=schema_rules(STREAM_OPTIONS_NEED_STREAM))

    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Integer], Field(min_length=1)]
        | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[list[Annotated[list[Integer], Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    max_tokens: TokenCount | None = Field(
        None, description="default 16 (OpenAI's), or the server's --max-tokens-default"
    )
    logprobs: TopLogprobs | None = None
    echo: bool = Field(False, description="not supported; must be false", json_schema_extra={"const": False})
    suffix: str | None = Field(None, description="not supported; must be absent", json_schema_extra={"type": "null"})
    best_of: BestOf | None = Field(None, description="only best_of == n is supported")


class TextContentPart(RequestModel):
    type: Literal["text"]
    text: str


Content = str | list[TextContentPart]


class SystemMessage(RequestModel):
    role: Literal["system"]
    content: Content
    name: str | None = None


class DeveloperMessage(RequestModel):
    role: Literal["developer"]
    content: Content
    name: str | None = None


class UserMessage(RequestModel):
    role: Literal["user"]
    content: Content
    name: str | None = None


class FunctionCall(RequestModel):
    name: str
    arguments: str


class ToolCall(RequestModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


NOT_NULL = {"not": {"type": "null"}}


class AssistantMessage(RequestModel):
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": ["content"], "properties": {"content": NOT_NULL}},
        {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array", "minItems": 1}}},
        {"required": ["function_call"], "properties": {"function_call": NOT_NULL}},
    ]})

    role: Literal["assistant"]
    content: Content | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = None

    @model_validator(mode="after")
    def _content_or_calls(self) -> AssistantMessage:
        if self.content is None and not self.tool_calls and self.function_call is None:
            raise ValueError("an assistant message needs content unless it has tool_calls or function_call")
        return self


class ToolMessage(RequestModel):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


class FunctionMessage(RequestModel):
    role: Literal["function"]
    content: str | None
    name: str


ChatMessage = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage,
    Field(discriminator="role"),
]


class FunctionDefinition(RequestModel):
    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema (default: any object)")
    strict: bool | None = None


class ChatTool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


TOOL_CHOICE_NEEDS_TOOLS = {
    "if": {"required": ["tool_choice"], "properties": {"tool_choice": {"not": {"enum": ["none", None]}}}},
    "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
}


class ChatCompletionRequest(SamplingFields):
    model_config = ConfigDict(json_schema_extra=schema_rules(
        STREAM_OPTIONS_NEED_STREAM, requires_when_set("top_logprobs", "logprobs", True), TOOL_CHOICE_NEEDS_TOOLS
    ))

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="default: auto when tools are given, else none"
    )
    parallel_tool_calls: bool = True
    max_tokens: TokenCount | None = Field(None, description="default: the rest of the context")
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    add_generation_prompt: bool = True


class TokenizeCompletionRequest(RequestModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class TokenizeChatRequest(RequestModel):
    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True


# vLLM's shape: a prompt or chat messages (a body with both is read as the prompt).
TokenizeRequest = Annotated[TokenizeCompletionRequest | TokenizeChatRequest, Field(union_mode="left_to_right")]


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[Integer]


# ---- responses --------------------------------------------------------------------------


class UsageInfo(APIModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(APIModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(APIModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(APIModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class TopLogprob(APIModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(APIModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


class ChatResponseMessage(APIModel):
    role: str = "assistant"
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(APIModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(APIModel):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class ModelCard(APIModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "llmservice"
    root: str
    parent: str | None = None  # a LoRA adapter: the base model's id (vLLM's field)
    max_model_len: int


class ModelList(APIModel):
    object: str = "list"
    data: list[ModelCard]


class TokenizeResponse(APIModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(APIModel):
    prompt: str


class ErrorDetail(APIModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(APIModel):
    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": (
        "invalid parameters, including the rules between fields that the request schema "
        "cannot state: prompt tokens + max_tokens <= max_model_len, n x max_tokens <= "
        "max_model_len, n x prompts within --max-waiting-requests, best_of == n, a grammar, "
        "regex or JSON schema that compiles, tool function names unique and a named "
        "tool_choice among them, response_format and structured_outputs not both constraining"
    )},
    401: {"model": ErrorResponse, "description": "missing or wrong API key (--api-key)"},
    404: {"model": ErrorResponse, "description": "unknown model"},
    413: {"model": ErrorResponse, "description": "request body larger than --max-request-body-bytes"},
    503: {"model": ErrorResponse, "description": "queue full (see Retry-After) or draining for shutdown"},
}

SSE = "text/event-stream"
SSE_EVENT = {  # the schema of one event, as OpenAPI 3.2's itemSchema reads it
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON chunk; the last event is [DONE]"}},
}
GENERATION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the completion; with stream true, server-sent events of chunks ending in `data: [DONE]`",
          "content": {SSE: {"schema": SSE_EVENT}}},
    **ERROR_RESPONSES,
}

# ---- operations endpoints: what each answers, media type included -------------------------
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
UNAVAILABLE_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorResponse, "description": "the engine is not running (or, for /ready, draining)"},
}
HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "alive; the body is empty (as vLLM's)", "content": {}},
    **UNAVAILABLE_RESPONSES,
}
METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Prometheus text exposition format 0.0.4",
          "content": {"text/plain": {"schema": {"type": "string"}}}},
}
