"""Logprobs as JSON can carry them.

A token the grammar of a structured output masks, or one a logit bias of -100 rules out,
has a logprob of -inf, and JSON has no infinities: serializing one failed the whole
response with a 500. vLLM's API floors every logprob it returns at -9999.0; so do we, at
the one place both endpoints take their values from. The engine keeps the true -inf.
"""

from __future__ import annotations

LOGPROB_FLOOR = -9999.0


def json_logprob(value: float) -> float:
    """`value`, or the floor for -inf (and for a NaN, which no comparison passes)."""
    return value if value >= LOGPROB_FLOOR else LOGPROB_FLOOR
