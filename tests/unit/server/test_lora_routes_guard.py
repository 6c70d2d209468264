"""The runtime LoRA endpoints are off unless VLLM_ALLOW_RUNTIME_LORA_UPDATING is true
(vLLM's variable) and --enable-lora is on; each refusal is a 400 naming what to set."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from llmservice.server.api.errors import APIError
from llmservice.server.api.lora_routes import _engine, runtime_updates_allowed
from llmservice.server.config import EngineConfig


def test_only_true_or_1_allows_runtime_updates():
    assert runtime_updates_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    assert runtime_updates_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    for value in ("", "0", "false", "yes-please"):
        assert not runtime_updates_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": value})
    assert not runtime_updates_allowed({})


def raw(enable_lora: bool, allowed: bool) -> SimpleNamespace:
    engine = SimpleNamespace(config=EngineConfig(enable_lora=enable_lora))
    state = SimpleNamespace(server=SimpleNamespace(engine=engine), allow_runtime_lora_updating=allowed)
    return SimpleNamespace(app=SimpleNamespace(state=state))


def test_the_guard_names_the_flag_or_the_variable():
    with pytest.raises(APIError, match="--enable-lora") as err:
        _engine(raw(False, True))
    assert err.value.status == 400
    with pytest.raises(APIError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=true"):
        _engine(raw(True, False))
    assert _engine(raw(True, True)).config.enable_lora
