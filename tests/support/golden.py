"""Rendered examples and their golden files, shared by the render tests of both engines.

An example goes through `admit` (pruned, defaulted, validated as the API server stores
it) and `render`; its manifests, dumped as YAML, must equal the golden file. Regenerate
after an intended change with `UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/operator/...`
and review the diff.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from llmservice.operator.admission import admit
from llmservice.operator.render import Owner, render
from llmservice.operator.spec import LLMServiceSpec

ROOT = Path(__file__).resolve().parents[2]
UID = "11111111-2222-3333-4444-555555555555"


@cache
def crd_schema() -> dict[str, Any]:
    """The LLMService CRD's schema, read once (admit does not change it)."""
    crd = yaml.safe_load((ROOT / "crds/llmservice.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def admitted(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the API server stores it: pruned, defaulted, validated."""
    stored, errors = admit(crd_schema(), obj, None)
    assert errors == []
    return stored


def example(name: str) -> dict[str, Any]:
    return admitted(yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text()))


def rendered(obj: dict[str, Any], **kwargs: Any):
    owner = Owner(obj["metadata"]["name"], "default", UID)
    return render(owner, LLMServiceSpec.from_dict(obj["spec"]), **kwargs)


def assert_golden(name: str, golden_dir: Path) -> None:
    """examples/NAME.yaml renders (with a ServiceMonitor) to exactly golden_dir/NAME.yaml."""
    manifests = rendered(example(name), with_service_monitor=True)
    text = yaml.safe_dump_all(manifests.all(), sort_keys=False)
    path = golden_dir / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()
