"""The CRD's LLMService fields against the server's own option definitions
(server/config.py): every default is the server's or declared there as the CRD's own,
with a reason; every enum is the server's choices; and the operator renders only flags
the server defines."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from llmservice.operator.admission import admit
from llmservice.operator.render import Owner, server_args, server_options
from llmservice.operator.spec import (
    OPERATOR_ENGINE_FIELDS,
    SERVER_OPTIONS,
    EngineSpec,
    LLMServiceSpec,
)
from llmservice.operator.vram import TENSOR_PARALLEL_SIZES
from llmservice.server.capabilities import MAX_TENSOR_PARALLEL_SIZE
from llmservice.server.cli_args import BY_NAME, SERVE_OPTIONS

ROOT = Path(__file__).resolve().parents[3]
CRD_FILES = [ROOT / "crds/llmservice.yaml", ROOT / "charts/llmservice-operator/crds/llmservice.yaml"]
CRD = yaml.safe_load(CRD_FILES[0].read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
# vllm-*: stock vLLM pods, whose flags are checked against vLLM's list (test_render_vllm.py).
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if not p.stem.startswith("vllm-"))
JSON_TYPES = {"integer": (int, float), "number": (float,), "boolean": (bool,), "string": (str,)}


def field_schema(schema: dict[str, Any], crd_path: str) -> dict[str, Any] | None:
    node = schema["properties"]["spec"]
    for key in crd_path.split("."):
        node = (node.get("properties") or {}).get(key)
        if node is None:
            return None
    return node


def mismatches(schema: dict[str, Any]) -> list[str]:
    """Every way the CRD disagrees with the server's option definitions."""
    found = []
    for o in SERVE_OPTIONS:
        if o.arg.crd is None:
            continue
        crd = field_schema(schema, o.arg.crd)
        if crd is None:
            found.append(f"{o.name}: no CRD field spec.{o.arg.crd}")
            continue
        if crd.get("default") != o.crd_default:
            found.append(f"spec.{o.arg.crd}: CRD default {crd.get('default')!r}, expected {o.crd_default!r}")
        if o.arg.choices is not None and crd.get("enum") != list(o.arg.choices):
            found.append(f"spec.{o.arg.crd}: CRD enum {crd.get('enum')}, server choices {list(o.arg.choices)}")
        server_type = bool if o.arg.type is bool else o.arg.type
        if server_type not in JSON_TYPES[crd["type"]]:
            found.append(f"spec.{o.arg.crd}: CRD type {crd['type']}, server type {server_type.__name__}")
    return found


def test_crd_copies_are_identical():
    assert CRD_FILES[0].read_text() == CRD_FILES[1].read_text()


def test_crd_defaults_enums_and_types_are_the_servers():
    assert mismatches(SCHEMA) == []


@pytest.mark.parametrize(
    ("path", "key", "value", "expected"),
    [
        ("engine.maxWaitingRequests", "default", 512, "CRD default 512, expected 1024"),
        ("engine.maxModelLen", "default", 8192, "CRD default 8192, expected 4096"),
        ("engine.blockSize", "enum", [8, 16, 32, 64], "server choices [8, 16, 32, 64, 128]"),
        ("engine.dtype", "enum", ["auto", "float16"], "CRD enum ['auto', 'float16']"),
        ("engine.enablePrefixCaching", "type", "string", "CRD type string, server type bool"),
    ],
)
def test_a_drifted_crd_is_caught(path, key, value, expected):
    drifted = copy.deepcopy(SCHEMA)
    field_schema(drifted, path)[key] = value
    assert any(expected in m for m in mismatches(drifted)), mismatches(drifted)


def test_crd_side_defaults_say_why_and_differ():
    declared = [o for o in SERVE_OPTIONS if o.arg.crd_default is not None]
    assert {o.name for o in declared} == {"model", "max_model_len", "max_num_batched_tokens"}
    for o in declared:
        assert o.arg.crd_default.why.strip() and o.arg.crd_default.value != o.default


def test_tensor_parallel_sizes_are_the_servers():
    """The CRD admits the sizes the bundled server shards over (capabilities.py), and the
    VRAM check's suggestions are among them."""
    schema = field_schema(SCHEMA, "engine.tensorParallelSize")
    assert (schema["minimum"], schema["maximum"]) == (1, MAX_TENSOR_PARALLEL_SIZE)
    assert set(TENSOR_PARALLEL_SIZES) <= set(range(1, MAX_TENSOR_PARALLEL_SIZE + 1))


def test_every_crd_engine_field_is_a_server_option_or_the_operators():
    crd_fields = set(SCHEMA["properties"]["spec"]["properties"]["engine"]["properties"])
    from_server = {
        o.arg.crd.removeprefix("engine.")
        for o in SERVE_OPTIONS
        if o.arg.crd and o.arg.crd.startswith("engine.")
    }
    assert from_server.isdisjoint(OPERATOR_ENGINE_FIELDS)
    assert crd_fields == from_server | set(OPERATOR_ENGINE_FIELDS)
    assert {BY_NAME[o].arg.crd.removeprefix("engine.") for o in SERVER_OPTIONS.values()} == from_server


def test_engine_spec_defaults_are_the_crds():
    engine = EngineSpec()
    for name, option in SERVER_OPTIONS.items():
        assert getattr(engine, name) == BY_NAME[option].crd_default, name


def admitted_example(path: Path) -> LLMServiceSpec:
    stored, errors = admit(SCHEMA, yaml.safe_load(path.read_text()), None)
    assert errors == []
    return LLMServiceSpec.from_dict(stored["spec"])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_engine_option_of_the_spec_is_rendered(path):
    spec = admitted_example(path)
    rendered = server_options(Owner("x", "default", "u"), spec, 0.95)
    assert set(spec.engine.server_options()) <= set(rendered)
    assert set(rendered) <= set(BY_NAME)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_operator_renders_only_flags_the_server_defines(path):
    defined = set()
    for o in SERVE_OPTIONS:
        defined |= {o.arg.flag, *o.arg.aliases}
        if o.arg.type is bool:
            defined.add(f"--no-{o.arg.flag.removeprefix('--')}")
    args = server_args(Owner("x", "default", "u"), admitted_example(path), 0.95)
    flags = {a for a in args if a.startswith("-")}
    assert flags and flags <= defined, sorted(flags - defined)
