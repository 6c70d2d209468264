"""The four PATCH content types of the Kubernetes API, on plain dicts.

- JSON patch (RFC 6902), with `test` ops (kopf uses one on resourceVersion);
- JSON merge patch (RFC 7386): maps merge, `null` deletes, lists are replaced;
- strategic merge patch: like merge patch, except lists of objects that all carry a
  `name` (containers, env, ports, volumes, volumeMounts) merge element-wise by name and
  `$patch: delete` removes an element. Other list merge keys (e.g. `containerPort`) and
  `$setElementOrder` directives are not emulated;
- server-side apply: approximated as create-or-merge-patch. Field ownership, conflicts
  between managers and removal of fields a manager stops sending are not emulated.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
APPLY_PATCH_CBOR = "application/apply-patch+cbor"


class PatchError(ValueError):
    """The patch cannot apply (422 in the API)."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and "name" in v for v in value)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and _named_list(value) and _named_list(result.get(key)):
            merged = {item["name"]: item for item in result[key]}
            order = [item["name"] for item in result[key]]
            for item in value:
                if item.get("$patch") == "delete":
                    merged.pop(item["name"], None)
                    continue
                if item["name"] not in merged:
                    order.append(item["name"])
                merged[item["name"]] = strategic_merge_patch(merged.get(item["name"]), item)
            result[key] = [merged[n] for n in order if n in merged]
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        return jsonpatch.apply_patch(copy.deepcopy(target), ops)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise PatchError(str(exc)) from exc


def apply_patch(target: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """Apply a PATCH body of the given Content-Type to a stored object."""
    kind = content_type.split(";")[0].strip()
    if kind == JSON_PATCH:
        if not isinstance(patch, list):
            raise PatchError("a JSON patch must be a list of operations")
        return json_patch(target, patch)
    if not isinstance(patch, dict):
        raise PatchError(f"a {kind} body must be an object")
    if kind == STRATEGIC_PATCH:
        return strategic_merge_patch(target, patch)
    return merge_patch(target, patch)  # merge patch, and apply (see the module docstring)
