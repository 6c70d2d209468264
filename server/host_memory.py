"""Transparent huge pages for the CPU engine's weights and KV pools.

A decode step reads ~100 MB of packed weights and every running sequence's K/V, in runs
of a few hundred bytes spread over the whole of it. On 4 KiB pages nearly every run is a
TLB miss: the embedded model's batch-1 matmuls took about twice their huge-page time
(docs/cpu.md). torch's CPU allocator asks the kernel for huge pages (2 MiB-aligned,
madvise) when THP_MEM_ALLOC_ENABLE=1, a variable it reads once, at its first allocation,
so it has to be set before torch is imported: the command line does it first thing.
"""

from __future__ import annotations

import os
import sys

ENV = "THP_MEM_ALLOC_ENABLE"


def prefer_huge_pages(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Ask torch for huge pages unless the user set the variable; True if it will apply.

    Too late once torch is imported (it may have allocated already), so then nothing is
    set. Where the kernel's THP mode is `never` the allocator's madvise is a no-op.
    """
    if ENV in environ:
        return environ[ENV] == "1" and "torch" not in sys.modules
    if "torch" in sys.modules:
        return False
    environ[ENV] = "1"
    return True
