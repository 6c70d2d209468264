"""Adapter paths: a local directory is read as given; hf://ORG/NAME[@REVISION] is a Hub
reference (downloaded before parsing: tests/integration/operator/test_adapter_sync.py
runs it against the Hub-compatible endpoint); anything else under hf:// is refused naming it."""

from __future__ import annotations

import json

import pytest
from llmservice.server.config import EngineConfig
from llmservice.server.lora.sources import (
    AdapterSourceError,
    localize_lora_modules,
    parse_adapter_ref,
)


@pytest.mark.parametrize(
    ("path", "repo", "revision"),
    [("hf://org/sql-lora", "org/sql-lora", None), ("hf://org/sql-lora@v2", "org/sql-lora", "v2"),
     ("hf://org/sql-lora@0123abcd", "org/sql-lora", "0123abcd")],
)  # fmt: skip
def test_hub_references(path, repo, revision):
    ref, rev = parse_adapter_ref(path)
    assert (ref.repo_id, rev, ref.given) == (repo, revision, path)


@pytest.mark.parametrize("path", ["/adapters/sql", "adapters/sql", "org/sql"])
def test_local_paths_are_not_hub_references(path):
    assert parse_adapter_ref(path) is None


@pytest.mark.parametrize("path", ["hf://just-a-name", "hf://org/name/extra", "hf://org/name@", "hf://"])
def test_a_malformed_reference_is_refused_naming_it(path):
    with pytest.raises(AdapterSourceError, match=f"adapter path '{path}' is not a Hub reference"):
        parse_adapter_ref(path)


def test_local_lora_modules_are_left_as_given(tmp_path):
    modules = [f"a={tmp_path}", json.dumps({"name": "b", "path": str(tmp_path)})]
    config = EngineConfig(enable_lora=True, lora_modules=modules)
    same, sources = localize_lora_modules(config, None)
    assert same is config and sources == {}
