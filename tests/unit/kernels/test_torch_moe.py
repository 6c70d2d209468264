"""The CPU mixture-of-experts path (kernels/torch_moe.py) against the float64 reference:
both of its branches (one GEMM pair per expert group; every expert's rows padded into
two bmm calls), experts with no token, one expert taking every token, K = 1 and 2."""

from __future__ import annotations

import pytest
import torch
from llmservice.kernels import torch_moe
from llmservice.kernels.reference import moe_reference


def case(tokens: int, experts: int, k: int, hidden: int = 24, inter: int = 20, ids=None, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    if ids is None:
        ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, ids.shape[1], generator=gen)
    return x, w13, w2, weights / weights.sum(1, keepdim=True), ids


def branch(monkeypatch) -> list[str]:
    taken: list[str] = []
    for name in ("_per_expert", "_padded_bmm"):
        real = getattr(torch_moe, name)
        monkeypatch.setattr(torch_moe, name, lambda *a, _r=real, _n=name: (taken.append(_n), _r(*a))[1])
    return taken


@pytest.mark.parametrize(
    ("tokens", "experts", "k", "expected_branch"),
    [
        (1, 8, 2, "_per_expert"),  # 2 of 8 experts hit
        (3, 8, 2, "_per_expert"),
        (64, 4, 2, "_padded_bmm"),  # every expert hit, balanced
        (40, 8, 1, "_padded_bmm"),
    ],
)
def test_grouped_moe_matches_the_reference(monkeypatch, tokens, experts, k, expected_branch):
    taken = branch(monkeypatch)
    x, w13, w2, weights, ids = case(tokens, experts, k)
    out = torch_moe.grouped_moe(x, w13, w2, weights, ids)
    ref = moe_reference(x, w13, w2, weights, ids)
    assert taken == [expected_branch]
    torch.testing.assert_close(out.double(), ref.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("tokens", "expected_branch"), [(40, "_per_expert"), (16, "_padded_bmm")])
def test_one_expert_taking_every_token(monkeypatch, tokens, expected_branch):
    """Expert 0 in every row: 3x the mean of 6 experts. Past 16 rows padding every expert
    to it would triple the GEMMs' work (the loop runs); up to 16 a GEMM costs its weight
    read, so the padded block runs."""
    taken = branch(monkeypatch)
    ids = torch.zeros(tokens, 2, dtype=torch.long)
    ids[:, 1] = torch.arange(tokens) % 5 + 1
    x, w13, w2, weights, _ = case(tokens, 6, 2, ids=ids)
    out = torch_moe.grouped_moe(x, w13, w2, weights, ids)
    assert taken == [expected_branch]
    torch.testing.assert_close(out.double(), moe_reference(x, w13, w2, weights, ids).double(), rtol=1e-5, atol=1e-5)


def test_the_routing_weight_of_each_pair_is_its_own():
    """Swapping two pairs' weights changes exactly the tokens they belong to."""
    x, w13, w2, weights, ids = case(8, 4, 2, seed=3)
    base = torch_moe.grouped_moe(x, w13, w2, weights, ids)
    swapped = weights.clone()
    swapped[2] = weights[2].flip(0)
    out = torch_moe.grouped_moe(x, w13, w2, swapped, ids)
    changed = (out - base).abs().amax(1) > 1e-6
    assert changed.tolist() == [i == 2 for i in range(8)]
