"""Safetensors shards read in place: views equal the file's tensors, a fused weight is the
concatenation of its parts (read straight into its rows, or converted when the dtype
differs), and a shard cut inside a tensor's data fails with its path."""

from __future__ import annotations

import os

import pytest
import torch
from llmservice.server.model.parallel_weights import Part, Shard
from llmservice.server.model.quant_weights import source_for, weights_nbytes
from llmservice.server.model.safetensors_weights import CorruptShardError, SafetensorsWeights
from safetensors.torch import save_file


@pytest.fixture
def shards(tmp_path):
    torch.manual_seed(0)
    a = {"q.weight": torch.randn(8, 4), "k.weight": torch.randn(2, 4), "bias": torch.randn(3)}
    b = {"v.weight": torch.randn(2, 4), "half": torch.randn(5, 4).to(torch.bfloat16)}
    save_file(a, tmp_path / "a.safetensors")
    save_file(b, tmp_path / "b.safetensors")
    return [tmp_path / "a.safetensors", tmp_path / "b.safetensors"], {**a, **b}


def test_views_equal_the_saved_tensors(shards):
    files, saved = shards
    weights = SafetensorsWeights(files, "cpu", torch.float32)
    assert set(weights) == set(saved)
    for name, tensor in saved.items():
        assert torch.equal(weights[name], tensor.float()), name
    assert weights_nbytes(weights) == sum(t.numel() * 4 for t in saved.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_weight_is_the_concatenation_across_shards(shards, dtype):
    files, saved = shards
    weights = SafetensorsWeights(files, "cpu", dtype)
    source = source_for(weights, "cpu", dtype, consume=True)
    names = ["q.weight", "k.weight", "v.weight"]
    parts = [Part(n, 0, Shard(0, saved[n].shape[0])) for n in names]
    fused = source.linear(parts).weight
    assert fused.dtype == dtype
    assert torch.equal(fused, torch.cat([saved[n] for n in names]).to(dtype))
    assert not any(n in weights for n in names)  # taken: the model owns them now


def test_fusing_a_converted_dtype_and_a_replaced_tensor(shards):
    files, saved = shards
    weights = SafetensorsWeights(files, "cpu", torch.float32)
    weights["q.weight"] = torch.ones(8, 4)
    source = source_for(weights, "cpu", torch.float32, consume=False)
    fused = source.linear([Part("q.weight", 0, Shard(0, 8)), Part("half", 0, Shard(0, 5))]).weight
    assert torch.equal(fused, torch.cat([torch.ones(8, 4), saved["half"].float()]))
    assert "q.weight" in weights and "half" in weights  # consume=False leaves the caller's index whole


def test_a_part_slice_is_a_copy_of_those_rows(shards):
    files, saved = shards
    source = source_for(SafetensorsWeights(files, "cpu", torch.float32), "cpu", torch.float32, consume=True)
    fused = source.linear([Part("q.weight", 0, Shard(2, 3)), Part("k.weight", 0, Shard(0, 2))]).weight
    assert torch.equal(fused, torch.cat([saved["q.weight"][2:5], saved["k.weight"]]))


def test_data_cut_short_names_the_file(shards):
    files, _ = shards
    os.truncate(files[1], files[1].stat().st_size - 4)
    with pytest.raises(CorruptShardError, match=rf"^{files[1]}: truncated or corrupt safetensors file"):
        SafetensorsWeights(files, "cpu", torch.float32)
