"""Zero-filled pools that cost nothing until they are used.

The KV and host swap pools must start as zeros (padded block-table rows read block 0,
and masked garbage must stay finite), but `torch.zeros` of a 1 GiB CPU pool writes every
byte at start-up (0.1-2.4 s on the shared 2-core machine) and makes it all resident. On
CPU the pool is instead a fresh anonymous mapping: the kernel hands out zero pages on
first touch, so start-up writes nothing and RSS grows with the blocks actually used. On a
GPU `torch.zeros` is one fast memset and stays.
"""

from __future__ import annotations

import math
import mmap

import torch


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """Like `torch.zeros`; on CPU backed by pages the kernel zeroes when first touched."""
    device = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    pages = mmap.mmap(-1, nbytes)  # anonymous, private, read-write; the tensor keeps it alive
    return torch.frombuffer(pages, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)
