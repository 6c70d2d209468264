"""Request body -> engine SamplingParams (pure), with OpenAI/vLLM defaults and 400s.

Kept apart from the handlers so every rule (greedy below 1e-5 like vLLM, chat's
max_tokens defaulting to the rest of the context, priority needing the priority
policy, n children getting distinct seeds) is testable without a server.
"""

from __future__ import annotations

import dataclasses
import json

from llmservice.server.api.errors import APIError
from llmservice.server.api.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from llmservice.server.engine.grammar_spec import StructuredSpec
from llmservice.server.engine.sampling_params import SamplingParams

SAMPLING_EPS = 1e-5  # below this temperature sampling is numerically greedy (vLLM's rule)
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _check_common(req: SamplingFields, scheduling_policy: str) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value not in (None, 0, 0.0):
            raise APIError(400, f"{name} is not supported by this server (got {value}); omit it or send 0", name)
    if req.priority != 0 and scheduling_policy != "priority":
        raise APIError(
            400,
            f"priority {req.priority} was given but the server schedules with policy "
            f"{scheduling_policy!r}; start it with --scheduling-policy priority or send priority 0",
            "priority",
        )
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
    if req.logit_bias:
        bad = [k for k in req.logit_bias if not k.isdigit()]
        if bad:
            raise APIError(400, f"logit_bias keys must be token ids, got {bad[0]!r}", "logit_bias")
        raise APIError(400, "logit_bias is not supported by this server; omit it or send {}", "logit_bias")


def check_total_tokens(n: int, max_tokens: int | None, max_model_len: int | None) -> None:
    """One request may ask for at most one context's worth of generated tokens in all:
    n x max_tokens <= max_model_len (each choice also needs prompt + max_tokens <= it,
    which the engine checks). Without this, a large n times a large max_tokens holds
    the batch for many contexts' worth of steps."""
    if max_model_len is None or max_tokens is None or n == 1:
        return
    if n * max_tokens > max_model_len:
        raise APIError(
            400,
            f"n ({n}) x max_tokens ({max_tokens}) = {n * max_tokens} exceeds max_model_len "
            f"({max_model_len}); lower n or max_tokens",
            "max_tokens",
        )


def with_model_defaults(req: SamplingFields, defaults: dict[str, float]) -> SamplingFields:
    """The request with the model's generation_config.json sampling defaults (temperature,
    top_p, top_k) in the fields it left unset; what it set wins (vLLM's rule)."""
    unset = {k: v for k, v in defaults.items() if getattr(req, k, 0) is None}
    return req.model_copy(update=unset) if unset else req


def _build(req: SamplingFields, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    temperature = 1.0 if req.temperature is None else req.temperature
    if temperature < SAMPLING_EPS:
        temperature = 0.0
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    try:
        return SamplingParams(
            temperature=temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k or 0,
            seed=req.seed,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=stop,
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
        )
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc


def completion_params(
    req: CompletionRequest,
    scheduling_policy: str,
    max_model_len: int | None = None,
    max_tokens_default: int | None = None,
) -> SamplingParams:
    """max_tokens left out: the server's --max-tokens-default (None here: the handler
    caps it to the rest of the context per prompt), else OpenAI's 16."""
    _check_common(req, scheduling_policy)
    if req.echo:
        raise APIError(400, "echo is not supported by this server", "echo")
    if req.suffix is not None:
        raise APIError(400, "suffix is not supported by this server", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, f"best_of ({req.best_of}) must equal n ({req.n}) on this server", "best_of")
    max_tokens = req.max_tokens
    if max_tokens is None and max_tokens_default is None:
        max_tokens = COMPLETION_MAX_TOKENS
    check_total_tokens(req.n, max_tokens, max_model_len)
    return _build(req, max_tokens, req.logprobs)


def chat_params(req: ChatCompletionRequest, scheduling_policy: str, max_model_len: int | None = None) -> SamplingParams:
    _check_common(req, scheduling_policy)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs set to true", "top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    check_total_tokens(req.n, max_tokens, max_model_len)
    # None: --max-tokens-default capped to the rest of the context (start_generation), or
    # without that flag the engine fills in max_model_len - prompt length, as vLLM does.
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return _build(req, max_tokens, logprobs)


def default_max_tokens(params: SamplingParams, prompt_len: int, max_model_len: int, default: int | None) -> SamplingParams:
    """The request left max_tokens out: --max-tokens-default, capped to the rest of the
    context (a default must not turn a fitting prompt into a 400)."""
    if params.max_tokens is not None or default is None or prompt_len >= max_model_len:
        return params
    return dataclasses.replace(params, max_tokens=min(default, max_model_len - prompt_len))


def child_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """One SamplingParams per choice; seeded requests get seed, seed+1, ... so the n
    choices differ yet stay reproducible."""
    if n == 1 or params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=params.seed + i) for i in range(n)]


def _schema_text(schema, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise APIError(400, f"{param} is not valid JSON: {exc}", param) from exc
    if not isinstance(schema, dict | bool):
        raise APIError(400, f"{param} must be a JSON Schema object", param)
    return json.dumps(schema, ensure_ascii=False)


def _choice_grammar(choices: list[str]) -> str:
    """EBNF for exactly one of the strings (json.dumps quotes and escapes as EBNF does)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def structured_spec(req: SamplingFields) -> StructuredSpec | None:
    """`response_format` (OpenAI) or `structured_outputs` (vLLM) -> the engine's constraint."""
    fmt, so = req.response_format, req.structured_outputs
    spec = None
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            spec = StructuredSpec("json_object")
        else:
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise APIError(400, "response_format json_schema needs json_schema.schema", "response_format")
            spec = StructuredSpec("json_schema", _schema_text(fmt.json_schema.schema_, "response_format"))
    if so is not None:
        given = [k for k in ("json_", "regex", "choice", "grammar", "json_object") if getattr(so, k) not in (None, False)]
        if len(given) != 1:
            shown = [k.rstrip("_") for k in given] or "none"
            raise APIError(400, f"structured_outputs needs exactly one of json, regex, choice, grammar, json_object (got {shown})", "structured_outputs")
        if spec is not None:
            raise APIError(400, "response_format and structured_outputs cannot both constrain the output", "structured_outputs")
        kind = given[0]
        if kind == "json_":
            spec = StructuredSpec("json_schema", _schema_text(so.json_, "structured_outputs.json"))
        elif kind == "regex":
            spec = StructuredSpec("regex", so.regex)
        elif kind == "choice":
            spec = StructuredSpec("grammar", _choice_grammar(so.choice))
        elif kind == "grammar":
            spec = StructuredSpec("grammar", so.grammar)
        else:
            spec = StructuredSpec("json_object")
    return spec


def with_structured(params: SamplingParams, spec: StructuredSpec | None) -> SamplingParams:
    return params if spec is None else dataclasses.replace(params, structured=spec)


_WHAT = {"json_schema": "JSON schema", "regex": "regex", "grammar": "grammar", "json_object": "JSON"}


def check_structured(spec: StructuredSpec | None, param: str) -> None:
    """400 naming the field when the constraint cannot compile (run in the tokenizer pool:
    converting a large schema takes milliseconds)."""
    if spec is None:
        return
    from llmservice.server.engine.grammar_check import InvalidSpecError, check_spec

    try:
        check_spec(spec)
    except InvalidSpecError as exc:
        raise APIError(400, f"{param}: invalid or unsupported {_WHAT[spec.kind]}: {exc}", param) from exc
