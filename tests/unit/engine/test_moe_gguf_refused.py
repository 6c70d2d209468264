"""A mixture-of-experts GGUF (Mixtral's say `llama` and carry ffn_*_exps tensors) is
refused by name at the metadata read, not loaded as a dense Llama that lacks its MLP."""

from __future__ import annotations

import numpy as np
import pytest
from llmservice.server.model.gguf_info import read_gguf_info
from llmservice.server.model.loaded import UnsupportedModelError


def write_gguf(path, experts: int) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_feed_forward_length(16)
    writer.add_context_length(64)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(2)
    writer.add_token_list(["a", "b"])
    writer.add_tensor("token_embd.weight", np.zeros((2, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_moe_gguf_is_refused_naming_its_experts(tmp_path):
    write_gguf(tmp_path / "moe.gguf", experts=8)
    with pytest.raises(UnsupportedModelError, match=r"mixture-of-experts GGUF \(8 experts\) is not supported"):
        read_gguf_info(tmp_path / "moe.gguf")


def test_the_same_gguf_without_experts_reads(tmp_path):
    write_gguf(tmp_path / "dense.gguf", experts=0)
    config, _ = read_gguf_info(tmp_path / "dense.gguf")
    assert config.num_layers == 1 and not config.is_moe
