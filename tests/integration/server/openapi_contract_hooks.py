"""Schemathesis hooks for the contract test (loaded with SCHEMATHESIS_HOOKS=<this file>).

/openapi.json states every limit JSON Schema can express. A few rules it cannot: they
count tokens (prompt + max_tokens <= max_model_len; a prompt of characters the model's
vocabulary lacks is empty), multiply or compare fields (n x max_tokens, n x prompts,
best_of == n), or need a compiler (a grammar, regex or JSON schema that compiles, unique
tool names). The 400 response of the generation endpoints lists them. /v1/responses
runs the chat path, so the same rules reach it under its own field names
(`max_output_tokens` for max_tokens, `text.format` for response_format). A schema-valid
request refused with a 400 whose message is one of exactly these rules is what the
document promises, so that one failure kind (positive data rejected) is dropped for
those messages only; every other failure, and any other 400, still fails the run.
"""

from __future__ import annotations

import json
import re

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData

UNSTATABLE_RULES = [re.compile(p) for p in (
    r"^prompt \(\d+ tokens\) \+ max_(output_)?tokens \(\d+\) = \d+ exceeds max_model_len \(\d+\)",
    r"^the prompt has \d+ tokens, but max_model_len is \d+",
    r"^the prompt is empty$",
    r"^n \(\d+\) x max_tokens \(\d+\) = \d+ exceeds max_model_len \(\d+\)",
    r"^this request needs \d+ engine requests \(n x prompts\), more than --max-waiting-requests",
    r"^best_of \(\d+\) must equal n \(\d+\) on this server$",
    r"^(structured_outputs|response_format|text\.format|tools\S*): invalid or unsupported (JSON schema|regex|grammar|JSON): ",
    r"^structured_outputs\.json is not valid JSON: ",
    r"^structured_outputs\.json must be a JSON Schema object$",
    r"^tools: function names must be unique$",
    r"^tool_choice names the function .*, which is not among the tools ",
    r"^tool_choice (required|named) constrains the output; (structured_outputs|response_format|text\.format) cannot as well$",
    r"^response_format and structured_outputs cannot both constrain the output$",
)]


def states_an_unstatable_rule(status: int, body: str) -> bool:
    """A 400 in OpenAI's shape whose message is one of the rules above."""
    if status != 400:
        return False
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(message, str) and any(rule.search(message) for rule in UNSTATABLE_RULES)


@schemathesis.hook
def filter_failure(ctx, failure, case, response) -> bool:
    if isinstance(failure, RejectedPositiveData):
        return not states_an_unstatable_rule(response.status_code, response.text)
    return True
