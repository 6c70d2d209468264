"""`--lora-modules` values, vLLM's two forms: `name=path` or a JSON object
`{"name": ..., "path": ..., "base_model_name": ...}`. No torch: the API process and the
operator's contract tests parse these."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")


@dataclass(frozen=True)
class LoRAModule:
    name: str
    path: str
    base_model_name: str | None = None


def check_lora_name(name: object) -> str:
    """A served adapter name: non-empty, no spaces or '=' (it is a `model` value)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"LoRA adapter name {name!r} must be letters, digits and ._:/@+- (no spaces)")
    return name


def parse_lora_module(value: str) -> LoRAModule:
    """One --lora-modules entry; ValueError names the entry and what is wrong."""
    text = value.strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"--lora-modules {value!r}: not valid JSON ({err.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("path"), str) or not obj["path"]:
            raise ValueError(f"--lora-modules {value!r}: the JSON form needs \"name\" and \"path\" strings")
        unknown = sorted(set(obj) - {"name", "path", "base_model_name"})
        if unknown:
            raise ValueError(f"--lora-modules {value!r}: unknown keys {unknown}")
        base = obj.get("base_model_name")
        if base is not None and not isinstance(base, str):
            raise ValueError(f"--lora-modules {value!r}: base_model_name must be a string")
        return LoRAModule(check_lora_name(obj.get("name")), obj["path"], base)
    name, sep, path = text.partition("=")
    if not sep or not path:
        raise ValueError(f"--lora-modules {value!r}: expected name=path or a JSON object")
    return LoRAModule(check_lora_name(name), path)


def parse_lora_modules(values: list[str] | tuple[str, ...] | None) -> list[LoRAModule]:
    """Every entry, refusing a name given twice."""
    modules = [parse_lora_module(v) for v in values or ()]
    seen: set[str] = set()
    for m in modules:
        if m.name in seen:
            raise ValueError(f"--lora-modules: adapter name {m.name!r} is given twice")
        seen.add(m.name)
    return modules


def check_lora_name_or_raise(name: object) -> str:
    """`check_lora_name` raising the adapter error the API answers with a 400."""
    from llmservice.server.lora.adapter import LoRAAdapterError

    try:
        return check_lora_name(name)
    except ValueError as err:
        raise LoRAAdapterError(str(err)) from None
