"""The GGUF header parser reads the embedded model exactly as gguf's own reader does."""

from __future__ import annotations

import numpy as np
from gguf import GGUFReader
from llmservice.server.model.gguf_header import GGUFFile
from llmservice.server.model.loader import read_model_info


def test_every_field_and_tensor_equals_the_stock_reader():
    path, _, _ = read_model_info("builtin:smollm2-135m")
    stock, ours = GGUFReader(path), GGUFFile(path)
    stock_fields = {k: f.contents() for k, f in stock.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.fields) == list(stock_fields)
    for name, value in stock_fields.items():
        assert ours.fields[name] == value and type(ours.fields[name]) is type(value), name
    assert len(stock_fields["tokenizer.ggml.tokens"]) == 49152  # the big arrays are all there
    assert len(ours.tensors) == len(stock.tensors) == 272
    for mine, theirs in zip(ours.tensors, stock.tensors, strict=True):
        assert (mine.name, mine.tensor_type, mine.n_elements) == (theirs.name, theirs.tensor_type, theirs.n_elements)
        assert list(mine.shape) == list(theirs.shape)
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape
        assert np.array_equal(mine.data, theirs.data)
        assert not mine.data.flags.owndata and not mine.data.flags.writeable  # a view of the file mapping
