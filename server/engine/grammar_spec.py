"""What a constrained request asks its output to match, as plain data.

It rides on `SamplingParams` from the API process to the engine process (pickled), so it
holds only strings: the grammar engine (xgrammar) is imported where grammars are compiled.
`key` is the compile cache's key: the n choices of one request, and every request with
the same schema, share one compiled grammar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GrammarKind = Literal["json_schema", "json_object", "regex", "grammar"]


@dataclass(frozen=True)
class StructuredSpec:
    kind: GrammarKind
    # json_schema: the schema as JSON text; regex: the pattern; grammar: EBNF (GBNF);
    # json_object: empty (any JSON object).
    source: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.source)
