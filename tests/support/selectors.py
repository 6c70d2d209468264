"""Label and field selectors as the API's `?labelSelector=` / `?fieldSelector=` take them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_SET = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # In, NotIn, Exists, DoesNotExist (= is In with one value, != is NotIn)
    values: frozenset[str] = frozenset()

    def matches(self, get: Any) -> bool:
        """`get(key)` returns the value or None when absent."""
        value = get(self.key)
        if self.op == "In":
            return value in self.values
        if self.op == "NotIn":
            return value not in self.values
        if self.op == "Exists":
            return value is not None
        return value is None


def _split(selector: str) -> list[str]:
    """Split on commas that are not inside `in (a,b)` parentheses."""
    parts, depth, current = [], 0, ""
    for ch in selector:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse(selector: str | None) -> list[Requirement]:
    """`a=b,c!=d,e in (x,y),f notin (z),g,!h` -> requirements (field selectors too)."""
    out: list[Requirement] = []
    for term in _split(selector or ""):
        if m := _SET.match(term):
            values = frozenset(v.strip() for v in m.group(3).split(","))
            out.append(Requirement(m.group(1), "In" if m.group(2) == "in" else "NotIn", values))
        elif "!=" in term:
            key, value = term.split("!=", 1)
            out.append(Requirement(key.strip(), "NotIn", frozenset({value.strip()})))
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            out.append(Requirement(key.strip(), "In", frozenset({value.strip()})))
        elif term.startswith("!"):
            out.append(Requirement(term[1:].strip(), "DoesNotExist"))
        else:
            out.append(Requirement(term, "Exists"))
    return out


def labels_match(selector: str | None, labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    return all(req.matches(labels.get) for req in parse(selector))


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def fields_match(selector: str | None, obj: dict[str, Any]) -> bool:
    """`metadata.name=x,spec.nodeName!=` against an object (absent fields read as "")."""
    return all(req.matches(lambda path: _field(obj, path)) for req in parse(selector))


def match_label_selector(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector object (matchLabels + matchExpressions) against labels."""
    selector = selector or {}
    reqs = [
        Requirement(k, "In", frozenset({v})) for k, v in (selector.get("matchLabels") or {}).items()
    ]
    reqs += [
        Requirement(e["key"], e["operator"], frozenset(e.get("values") or []))
        for e in selector.get("matchExpressions") or []
    ]
    return all(req.matches(labels.get) for req in reqs)
