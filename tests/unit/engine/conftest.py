"""Shared fixtures: the embedded model parsed once per session, engines built from it."""

from __future__ import annotations

import pytest
import torch
from llmservice.server.config import EngineConfig
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.model.loader import load_model

# OpenMP threads collapse when the 2 cores are shared with other processes; one thread is steady.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm():
    return load_model("builtin:smollm2-135m", torch.float32)


@pytest.fixture(scope="session")
def make_engine(smollm):
    def make(**overrides) -> LLMEngine:
        overrides.setdefault("max_model_len", 1024)
        overrides.setdefault("num_threads", 1)
        # No timed step budget unless a test asks: the derived one sizes chunks from
        # measured step times, so admission (and preemption counts) would follow the load.
        overrides.setdefault("max_step_ms", 0)
        return LLMEngine.from_config(EngineConfig(**overrides), loaded=smollm)

    return make


@pytest.fixture(scope="session")
def engine(make_engine) -> LLMEngine:
    return make_engine()
