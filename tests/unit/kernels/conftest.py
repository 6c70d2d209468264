"""Kernel tests run Triton on CPU through its interpreter.

TRITON_INTERPRET is set by tests/conftest.py before any test module is collected (Triton
reads it when a function is decorated, its own standard library's included); it is set
here too so that this folder's tests keep it when run with another root. TRITON_INTERPRET=0
on a GPU machine runs these tests on compiled kernels and CUDA tensors.
"""

import os

import pytest
import torch
from llmservice.kernels import reference
from llmservice.kernels.random_batch import PagedBatch, make_paged_batch

os.environ.setdefault("TRITON_INTERPRET", "1")

_ON_GPU = os.environ["TRITON_INTERPRET"] == "0" and torch.cuda.is_available()


@pytest.fixture
def device() -> str:
    return "cuda" if _ON_GPU else "cpu"


def _reference_attention(batch: PagedBatch, q: torch.Tensor | None = None) -> torch.Tensor:
    meta = batch.meta
    return reference.paged_attention(
        batch.q if q is None else q,
        batch.k_cache,
        batch.v_cache,
        meta.block_tables,
        meta.seq_lens_host,
        meta.query_lens,
        batch.scale,
    )


@pytest.fixture
def reference_attention():
    """The fp64 reference output, every row, of a PagedBatch (optionally with another q)."""
    return _reference_attention


@pytest.fixture
def paged_batch(device):
    """make_paged_batch on the test's device, by default 2 KV heads x 3 query heads of
    64 dims in 16-token fp32 blocks (the shape the decode and prefill tests vary from)."""

    def make(
        seqs,
        *,
        block_size=16,
        num_kv_heads=2,
        group=3,
        head_dim=64,
        dtype=torch.float32,
        seed=0,
    ) -> PagedBatch:
        return make_paged_batch(
            seqs,
            num_kv_heads=num_kv_heads,
            group=group,
            head_dim=head_dim,
            block_size=block_size,
            dtype=dtype,
            device=device,
            seed=seed,
        )

    return make
