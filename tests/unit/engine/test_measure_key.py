"""Start-up measurements are cached per process: engines of the same model but other
weights (packed GGUF blocks vs dense fp32) or another tensor-parallel size must not
share them (their steps and prefills cost different times)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from llmservice.server.engine.measure_key import measurement_key
from llmservice.server.model.parallel import World
from llmservice.server.model.parallel_weights import DenseWeight
from llmservice.server.model.quant_weights import PackedWeight


def model(weight: object, world: World | None = None) -> SimpleNamespace:
    layer = SimpleNamespace(qkv=SimpleNamespace(weight=weight))
    return SimpleNamespace(config="cfg", layers=[layer], world=world or World(), device=torch.device("cpu"),
                           dtype=torch.float32)  # fmt: skip


def test_weight_kind_and_world_size_are_part_of_the_key():
    dense = model(DenseWeight(torch.zeros(2, 2)))
    assert measurement_key(dense, 1) == measurement_key(model(DenseWeight(torch.ones(2, 2))), 1)
    assert measurement_key(dense, 1) != measurement_key(model(PackedWeight(None)), 1)  # type: ignore[arg-type]
    assert measurement_key(dense, 1) != measurement_key(model(DenseWeight(torch.zeros(2, 2)), World(0, 3)), 1)
    assert measurement_key(dense, 1) != measurement_key(dense, 2)


def test_the_tensor_parallel_executor_keys_by_its_size():
    executor = SimpleNamespace(config="cfg", size=3, device=torch.device("cpu"), dtype=torch.float32)
    assert measurement_key(executor)[2] == 3
    assert measurement_key(executor) != measurement_key(SimpleNamespace(**{**vars(executor), "size": 2}))
