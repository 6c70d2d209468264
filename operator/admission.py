"""A CRD's structural schema applied to writes, the way kube-apiserver does it.

Order per write: prune unknown fields -> apply defaults -> validate (OpenAPI keywords, then
`x-kubernetes-validations` CEL rules via cel-python). Error strings follow the
apimachinery field-error format, e.g.
`spec.autoscaling: Invalid value: "object": autoscaling.minReplicas must be <= ...`.
Not emulated: CEL cost budgets, `format` checks, list-type uniqueness, ratcheting.

`llmservice operator render` admits objects with it offline, and the tests' API emulator
on every write. Pruning, defaults and the OpenAPI keywords are plain Python; only the CEL
rules need cel-python, imported when the first rule runs (CELUnavailable if missing).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

ROOT_KEEP = ("apiVersion", "kind", "metadata")


@dataclass(frozen=True)
class FieldError:
    path: str
    detail: str  # already formatted: "Invalid value: ...", "Required value", ...

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _should(path: str, value: Any, rule: str) -> FieldError:
    """The API server's wording for a value that breaks an OpenAPI bound."""
    return FieldError(path, f"Invalid value: {_value_repr(value)}: {path} in body should {rule}")


def _value_repr(value: Any) -> str:
    return json.dumps(value)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


# ---------------------------------------------------------------- pruning and defaults


def prune(schema: dict[str, Any], value: Any, root: bool = False) -> Any:
    """Drop fields the schema does not declare (unless it preserves unknown fields)."""
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            props = schema.get("properties")
            if not props:
                return value
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            if root and key in ROOT_KEEP:
                out[key] = item
            elif props and key in props:
                out[key] = prune(props[key], item)
            elif isinstance(extra, dict):
                out[key] = prune(extra, item)
            elif extra is True or schema.get("x-kubernetes-preserve-unknown-fields"):
                out[key] = item
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(schema["items"], v) for v in value]
    return value


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Fill missing (or null, non-nullable) fields that have defaults, recursively."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        out = dict(value)
        for key, sub in props.items():
            missing = key not in out or (out[key] is None and not sub.get("nullable"))
            if missing and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out and out[key] is not None:
                out[key] = apply_defaults(sub, out[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in out:
                if key not in props and out[key] is not None:
                    out[key] = apply_defaults(extra, out[key])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], v) for v in value]
    return value


# ---------------------------------------------------------------- OpenAPI keywords


def _check_type(schema: dict[str, Any], value: Any, path: str) -> list[FieldError]:
    if value is None:
        if schema.get("nullable"):
            return []
        return [
            FieldError(
                path,
                f'Invalid value: "null": {path} in body must be of type {schema.get("type", "object")}: "null"',
            )
        ]
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        return (
            []
            if ok
            else [
                FieldError(
                    path,
                    f'Invalid value: "{_type_name(value)}": {path} in body must be of type int-or-string',
                )
            ]
        )
    expected = schema.get("type")
    if expected is None:
        return []
    actual = _type_name(value)
    ok = actual == expected or (expected == "number" and actual == "integer")
    if expected == "integer" and isinstance(value, float) and value.is_integer():
        ok = True
    if ok:
        return []
    return [
        FieldError(
            path,
            f'Invalid value: "{actual}": {path} in body must be of type {expected}: "{actual}"',
        )
    ]


def _check_keywords(schema: dict[str, Any], value: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(
            _value_repr(v) if isinstance(v, str) else f'"{v}"' for v in schema["enum"]
        )
        errors.append(
            FieldError(
                path, f"Unsupported value: {_value_repr(value)}: supported values: {supported}"
            )
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(_should(path, value, f"be greater than or equal to {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(_should(path, value, f"be less than or equal to {schema['maximum']}"))
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(
                FieldError(path, f"Too long: may not be more than {schema['maxLength']} bytes")
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(_should(path, value, f"be at least {schema['minLength']} chars long"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(_should(path, value, f"match '{schema['pattern']}'"))
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(
                FieldError(
                    path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items"
                )
            )
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(
                FieldError(
                    path,
                    f"Invalid value: {len(value)}: {path} in body should have at least {schema['minItems']} items",
                )
            )
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(FieldError(_join(path, key), "Required value"))
    return errors


# ---------------------------------------------------------------- CEL


class CELUnavailable(RuntimeError):
    """The schema has CEL rules and cel-python is not installed."""


@functools.cache
def _celpy() -> ModuleType:
    try:
        import celpy
    except ImportError as exc:
        raise CELUnavailable(
            "the CRD's validation rules (x-kubernetes-validations) need cel-python: "
            "pip install 'cel-python>=0.2'"
        ) from exc
    return celpy


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> Any:
    env = _celpy().Environment()
    return env.program(env.compile(expression))


def to_cel_input(schema: dict[str, Any], value: Any) -> Any:
    """JSON -> CEL-ready JSON: `type: number` fields become doubles even if written as 1."""
    if value is None:
        return None
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        return {
            k: to_cel_input(props.get(k) or (extra if isinstance(extra, dict) else {}), v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [to_cel_input(items, v) for v in value]
    return value


def _cel_type(schema: dict[str, Any]) -> str:
    return (
        "object"
        if schema.get("type") is None and schema.get("properties")
        else schema.get("type", "object")
    )


def _run_rules(schema: dict[str, Any], value: Any, old: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    rules = schema.get("x-kubernetes-validations", [])
    if not rules:
        return errors
    celpy = _celpy()
    for rule in rules:
        expression = rule["rule"]
        uses_old = re.search(r"\boldSelf\b", expression) is not None
        if uses_old and old is None:
            continue  # transition rules only run on updates
        activation = {"self": celpy.json_to_cel(to_cel_input(schema, value))}
        if uses_old:
            activation["oldSelf"] = celpy.json_to_cel(to_cel_input(schema, old))
        result = _program(expression).evaluate(activation)
        field = path + rule.get("fieldPath", "") if rule.get("fieldPath") else path
        if isinstance(result, celpy.CELEvalError):
            errors.append(
                FieldError(
                    field,
                    f'Invalid value: "{_cel_type(schema)}": {result.args[0] if result.args else result} evaluating rule: {expression}',
                )
            )
            continue
        if bool(result):
            continue
        message = rule.get("message") or f"failed rule: {expression}"
        if rule.get("messageExpression"):
            produced = _program(rule["messageExpression"]).evaluate(activation)
            if not isinstance(produced, celpy.CELEvalError) and str(produced).strip():
                message = str(produced)
        errors.append(FieldError(field, f'Invalid value: "{_cel_type(schema)}": {message}'))
    return errors


# ---------------------------------------------------------------- the walk


def validate(
    schema: dict[str, Any], value: Any, old: Any = None, path: str = "", root: bool = True
) -> list[FieldError]:
    """All field errors of `value` against `schema` (OpenAPI first, then CEL), like the API."""
    errors = [] if root else _check_type(schema, value, path)
    if errors or value is None:
        return errors
    errors += _check_keywords(schema, value, path)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if root and key in ROOT_KEEP:
                continue
            sub = props.get(key) or (extra if isinstance(extra, dict) else None)
            if sub is not None:
                old_item = old.get(key) if isinstance(old, dict) else None
                errors += validate(sub, item, old_item, _join(path, key), root=False)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += validate(schema["items"], item, None, f"{path}[{i}]", root=False)
    if not root or schema.get("x-kubernetes-validations"):
        errors += _run_rules(schema, value, old, path)
    return errors


def admit(
    schema: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None
) -> tuple[dict[str, Any], list[FieldError]]:
    """Prune, default and validate one custom object; returns the object to store."""
    stored = apply_defaults(schema, prune(schema, obj, root=True))
    return stored, validate(schema, stored, old)
