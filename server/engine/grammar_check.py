"""Is a structured-output spec usable? Checked in the API process before the request is
accepted, so a bad schema, regex or grammar is a 400 that names it, not a failed
request later.

The check builds xgrammar's grammar (JSON schema -> EBNF, regex -> EBNF, EBNF parse)
without the vocabulary: the same converter the engine's compile runs, so what passes
here compiles there, at a fraction of the cost (no token mask tables).
"""

from __future__ import annotations

import re

from llmservice.server.engine.grammar_spec import StructuredSpec

# xgrammar's messages start with "[hh:mm:ss] /project/cpp/file.cc:123: "; keep the sentence.
_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")
_CHECK_FAILED = re.compile(r"^Check failed: \(.*?\) is false: ")


class InvalidSpecError(ValueError):
    """The spec cannot be compiled; the message says why, in xgrammar's words."""


def clean_message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = _PREFIX.sub("", text)
    return _CHECK_FAILED.sub("", text)


def check_spec(spec: StructuredSpec) -> None:
    import xgrammar as xgr

    try:
        if spec.kind == "json_schema":
            xgr.Grammar.from_json_schema(spec.source, any_whitespace=False)
        elif spec.kind == "regex":
            xgr.Grammar.from_regex(spec.source)
        elif spec.kind == "grammar":
            xgr.Grammar.from_ebnf(spec.source)
    except Exception as exc:  # xgrammar raises RuntimeError / ValueError from its C++ core
        raise InvalidSpecError(clean_message(exc)) from exc
