"""The host tier of the prefix cache (`--kv-offloading-size` GiB): evicted cached blocks
kept in host memory, keyed by their prefix hash, LRU.

It shares one host pool with swap preemption: its blocks come from the same
`SwapSpace` allocator, and preemption takes precedence (`reclaim` gives LRU entries
back so a swap-out always finds room). This module is accounting only; the copies are
the step's `swap_out` / `swap_in` lists, run by the one copy engine (kernels/swap.py)
before the step's forward pass, swap-outs first.

A host block read or written by the step being scheduled is *pinned* until
`step_done()`: reusing it within the same step would let a later copy overwrite data
an earlier copy has not read yet (swap-outs run before swap-ins).
"""

from __future__ import annotations

from collections import OrderedDict

from llmservice.server.engine.swap_space import SwapSpace


class HostTier:
    def __init__(self, space: SwapSpace, capacity_blocks: int):
        self.space = space
        self.capacity_blocks = capacity_blocks  # at most this many host blocks hold cached entries
        self.entries: OrderedDict[int, tuple[int, tuple]] = OrderedDict()  # hash -> (host block, key), LRU first
        self.pinned: set[int] = set()
        self.offloaded_blocks = 0  # cumulative: device blocks copied to the host tier
        self.restored_blocks = 0  # cumulative: host blocks copied back to the device pool

    @property
    def num_entries(self) -> int:
        return len(self.entries)

    def lookup(self, block_hash: int, key: tuple) -> int | None:
        """The host block holding this exact block (hash and key match), or None."""
        entry = self.entries.get(block_hash)
        if entry is None or entry[1] != key:
            return None
        return entry[0]

    def restore(self, block_hash: int) -> int:
        """Mark the entry as read by this step (pinned, most recently used); its host block."""
        host_block, _ = self.entries[block_hash]
        self.entries.move_to_end(block_hash)
        self.pinned.add(host_block)
        self.restored_blocks += 1
        return host_block

    def offload(self, block_hash: int, key: tuple) -> int | None:
        """Room for an evicted device block: the host block to copy it into, or None when the
        content is already here (same hash and key) or no host block can be had."""
        entry = self.entries.get(block_hash)
        if entry is not None:
            self.entries.move_to_end(block_hash)
            if entry[1] == key:
                return None
        host_block = self._take_block()
        if host_block is None:
            return None
        if entry is not None:  # a hash collision: the newer content replaces the entry
            self._drop(block_hash)
        self.entries[block_hash] = (host_block, key)
        self.pinned.add(host_block)
        self.offloaded_blocks += 1
        return host_block

    def reclaim(self, num_blocks: int) -> int:
        """Give up to num_blocks LRU (unpinned) entries back to the shared pool, for a
        swap-out; how many were given back."""
        freed = 0
        for block_hash in [h for h, (b, _) in self.entries.items() if b not in self.pinned]:
            if freed >= num_blocks:
                break
            self._drop(block_hash)
            freed += 1
        return freed

    def pin(self, host_blocks: list[int]) -> None:
        """Host blocks a swap-in of this step still reads (freed to the pool already)."""
        self.pinned.update(host_blocks)

    def step_done(self) -> None:
        """The step's copies have run: every host block may be reused."""
        self.pinned.clear()

    def _take_block(self) -> int | None:
        if len(self.entries) < self.capacity_blocks:
            free_ids = self.space.free_ids
            for i in range(len(free_ids) - 1, -1, -1):
                if free_ids[i] not in self.pinned:
                    return free_ids.pop(i)
        for block_hash, (host_block, _) in self.entries.items():  # LRU eviction
            if host_block not in self.pinned:
                del self.entries[block_hash]
                return host_block
        return None

    def _drop(self, block_hash: int) -> None:
        host_block, _ = self.entries.pop(block_hash)
        self.space.free([host_block])

    def check_invariants(self) -> None:
        """No host block is both free and an entry, or two entries: no leak, no double use."""
        used = [b for b, _ in self.entries.values()]
        if len(set(used)) != len(used):
            raise AssertionError("a host block backs two entries")
        overlap = set(used) & set(self.space.free_ids)
        if overlap:
            raise AssertionError(f"host blocks {sorted(overlap)} are both free and cached")
        if len(self.entries) > self.capacity_blocks:
            raise AssertionError(f"{len(self.entries)} entries > capacity {self.capacity_blocks}")


def available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_offload_fits(offload_gib: float, swap_gib: float, available_bytes: int | None) -> None:
    """Refuse a host pool (offload + swap) larger than the host's free memory, with the numbers."""
    gib = 1 << 30
    if available_bytes is None or offload_gib <= 0:
        return
    wanted = (offload_gib + swap_gib) * gib
    if wanted > available_bytes:
        raise ValueError(
            f"--kv-offloading-size {offload_gib:g} GiB (+ --swap-space {swap_gib:g} GiB) needs "
            f"{wanted / gib:.2f} GiB of host memory, but only {available_bytes / gib:.2f} GiB is available"
        )
