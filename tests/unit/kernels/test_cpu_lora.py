"""The C LoRA delta (kernels/cpu_lora.c) against an fp64 reference, and its invariance.

One projection of three modules (widths not multiples of the vector width, so the scalar
tails run), slots of ranks below the padded rank and a module a slot does not target,
rows of several slots and of the base model mixed. A row's result must not depend on the
rows around it or the thread count: the C decoder and the Python loop rely on it."""

from __future__ import annotations

import pytest
import torch
from llmservice.kernels import cpu_lora

pytestmark = pytest.mark.skipif(
    not cpu_lora.available(), reason="the C kernels cannot be built here"
)
R, FAN_IN, WIDTHS = 16, 70, (40, 17, 23)
RANKS = [[8, 0, 16], [16, 16, 16], [3, 5, 1]]  # per slot and module; 0: not targeted
SCALINGS = [0.5, 2.0, 1.5]


def stacks() -> tuple[cpu_lora.LoRAStacks, torch.Tensor, torch.Tensor]:
    """Layer 0's qkv group as the pool pads it (zeros past each rank); the other three
    groups are empty placeholders."""
    gen = torch.Generator().manual_seed(0)
    slots, n = len(RANKS), len(WIDTHS)
    a = torch.randn(slots, n * R, FAN_IN, generator=gen)
    bt = torch.randn(slots, R, sum(WIDTHS), generator=gen)
    col = 0
    for i, width in enumerate(WIDTHS):
        for s in range(slots):
            a[s, i * R + RANKS[s][i] : (i + 1) * R] = 0
            bt[s, RANKS[s][i] :, col : col + width] = 0
        col += width
    ranks = torch.tensor(RANKS, dtype=torch.int32)
    empty = cpu_lora.GroupStacks(torch.zeros(slots, R, 5), torch.zeros(slots, R, 5),
                                 torch.zeros(slots, 1, dtype=torch.int32), (5,))  # fmt: skip
    qkv = cpu_lora.GroupStacks(a, bt, ranks, WIDTHS)
    return cpu_lora.LoRAStacks([[qkv, empty, empty, empty]], torch.tensor(SCALINGS), R), a, bt


def reference(a, bt, x, out, row_slots) -> torch.Tensor:
    want = out.double().clone()
    for row, s in enumerate(row_slots):
        col = 0
        for i, width in enumerate(WIDTHS):
            if s >= 0:
                a_m, b_m = (
                    a[s, i * R : (i + 1) * R].double(),
                    bt[s, :, col : col + width].double().T,
                )
                want[row, col : col + width] += SCALINGS[s] * (b_m @ (a_m @ x[row].double()))
            col += width
    return want


def inputs(num_rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random activations and the projection's output rows the delta is added to."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, FAN_IN, generator=gen), torch.randn(num_rows, sum(WIDTHS), generator=gen)


ROWS = [0, -1, 2, 1, 1, 0, -1, 2, 2]
MANY = ROWS * 400  # past the work from which a call runs on several threads


def test_delta_matches_fp64_and_leaves_base_rows_alone():
    st, a, bt = stacks()
    x, out = inputs(len(ROWS), seed=1)
    got = out.clone()
    assert st.add(0, 0, st.rows(ROWS), x, got)
    want = reference(a, bt, x, out, ROWS)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    for row, s in enumerate(ROWS):
        assert torch.equal(got[row], out[row]) == (s < 0)


@pytest.mark.parametrize("rows", [ROWS, MANY], ids=["few", "many"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_bits_do_not_depend_on_the_batch_or_threads(threads, rows):
    st, _, _ = stacks()
    x, out = inputs(len(rows), seed=2)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        batch = out.clone()
        st.add(0, 0, st.rows(rows), x, batch)
        torch.set_num_threads(1)
        for row, s in enumerate(rows[: len(ROWS)]):
            alone = out[row : row + 1].clone()
            st.add(0, 0, st.rows([s]), x[row : row + 1], alone)
            assert torch.equal(alone[0], batch[row]), row
    finally:
        torch.set_num_threads(before)


def test_refusals():
    st, _, _ = stacks()
    with pytest.raises(IndexError, match="outside the pool"):
        st.rows([3])
    x, out = torch.zeros(2, FAN_IN), torch.zeros(2, sum(WIDTHS))
    assert not st.add(0, 0, st.rows([0, 1]), x.double(), out)  # not fp32: the torch loop's
    assert not st.add(
        0, 0, st.rows([0, 1]), x.T.contiguous().T[:, : FAN_IN - 1], out
    )  # wrong shape
    with pytest.raises(ValueError, match="B \\(transposed\\)"):
        cpu_lora.LoRAStacks([[cpu_lora.GroupStacks(torch.zeros(3, R, 4), torch.zeros(3, 4, R),
                                                   torch.zeros(3, 1, dtype=torch.int32), (4,))] * 4],
                            torch.zeros(3), R)  # fmt: skip
