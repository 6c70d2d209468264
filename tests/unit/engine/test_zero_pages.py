"""Pools from zero_pages read as zeros everywhere, write like any tensor, and use no
memory for the pages nobody touched."""

from __future__ import annotations

import torch
from llmservice.server.engine import zero_pages


def test_zeros_on_cpu_are_zeros_of_the_dtype_and_shape():
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        pool = zero_pages.zeros((7, 16, 3, 64), dtype)
        assert pool.shape == (7, 16, 3, 64) and pool.dtype == dtype and pool.is_contiguous()
        assert torch.equal(pool.float(), torch.zeros(pool.shape))
        pool[3, 5] = 1.5
        assert pool.float().sum().item() == 1.5 * 3 * 64


def test_untouched_pages_are_not_resident():
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    before = rss()
    pool = zero_pages.zeros((256, 1024, 1024), torch.uint8)  # 256 MiB
    assert rss() - before < 32 << 20
    pool[:64].fill_(1)  # a quarter of it, touched
    assert rss() - before >= 60 << 20
    assert int(pool[64:].sum()) == 0
