"""The mapped GGUF reader parses the embedded model exactly as gguf's own reader does."""

from __future__ import annotations

import numpy as np
from gguf import GGUFReader
from llmservice.server.model.gguf_reader import MappedGGUFReader
from llmservice.server.model.loader import read_model_info


def test_every_field_and_tensor_equals_the_stock_reader():
    path, _, _ = read_model_info("builtin:smollm2-135m")
    stock, mapped = GGUFReader(path), MappedGGUFReader(path)
    assert list(mapped.fields) == list(stock.fields)
    for name, field in stock.fields.items():
        other = mapped.fields[name]
        assert other.types == field.types and other.offset == field.offset, name
        assert len(other.parts) == len(field.parts), name
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(other.parts, field.parts, strict=True)), name
        assert other.contents() == field.contents(), name
    assert len(mapped.tensors) == len(stock.tensors) == 272
    for ours, theirs in zip(mapped.tensors, stock.tensors, strict=True):
        assert (ours.name, ours.tensor_type, ours.data_offset) == (theirs.name, theirs.tensor_type, theirs.data_offset)
        assert list(ours.shape) == list(theirs.shape)
        assert ours.data.dtype == theirs.data.dtype and np.array_equal(ours.data, theirs.data)
        assert not ours.data.flags.owndata  # a view of the file mapping, not a copy
