"""Block copy between pools by block-id lists (the CPU path; the CUDA path runs in bench)."""

import torch
from llmservice.kernels.swap import copy_blocks, kv_pools


def _pools(num_layers, num_blocks, seed):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(num_blocks, 8, 2, 16, generator=gen),
            torch.randn(num_blocks, 8, 2, 16, generator=gen),
        )
        for _ in range(num_layers)
    ]


def test_swap_out_and_back_in_restores_blocks():
    device_kv = _pools(num_layers=3, num_blocks=10, seed=0)
    swap_kv = [
        (torch.full((6, 8, 2, 16), float("nan")), torch.full((6, 8, 2, 16), float("nan")))
        for _ in range(3)
    ]
    originals = [(k.clone(), v.clone()) for k, v in device_kv]
    moved, slots = [7, 2, 9], [4, 0, 5]

    out = copy_blocks(kv_pools(device_kv), kv_pools(swap_kv), moved, slots)
    out.wait()
    assert out.done
    for (k, v), (sk, sv) in zip(originals, swap_kv, strict=True):
        for src, dst in zip(moved, slots, strict=True):
            assert torch.equal(sk[dst], k[src]) and torch.equal(sv[dst], v[src])
        untouched = [i for i in range(6) if i not in slots]
        assert torch.isnan(sk[untouched]).all() and torch.isnan(sv[untouched]).all()

    # the device blocks get reused, then the swapped blocks come back into other slots
    for k, v in device_kv:
        k.fill_(float("nan"))
        v.fill_(float("nan"))
    back = [1, 3, 8]
    copy_blocks(kv_pools(swap_kv), kv_pools(device_kv), slots, back).wait()
    for (k, v), (ok, ov) in zip(device_kv, originals, strict=True):
        for src, dst in zip(moved, back, strict=True):
            assert torch.equal(k[dst], ok[src]) and torch.equal(v[dst], ov[src])
        assert torch.isnan(k[[0, 2, 4, 5, 6, 7, 9]]).all()


def test_empty_copy_is_a_no_op():
    pools = kv_pools(_pools(1, 4, seed=1))
    before = [p.clone() for p in pools]
    handle = copy_blocks(pools, pools, [], [])
    handle.wait()
    assert handle.done and all(torch.equal(a, b) for a, b in zip(pools, before, strict=True))
