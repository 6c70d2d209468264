"""How many prompt tokens a prefix cache would have served, even when it is off.

The advisor's rule 3 needs to know, on a server running with prefix caching off, whether
turning it on would pay. The sketch remembers the most recent `capacity` full-block
hashes (the block manager's own hash chain, so a "hit" here means exactly what a cache
hit would be) in LRU order; a new prompt's leading run of remembered hashes is its
potential hit. Bounded memory: 65536 hashes is a few MiB, whatever the traffic. It
never evicts for memory pressure, so it is an upper bound of what a real cache of
limited size would hit — the rule's 30 % threshold leaves room for that.
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_CAPACITY = 65536


class PrefixSketch:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError(f"the prefix sketch needs a capacity >= 1, got {capacity}")
        self.capacity = capacity
        self._recent: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._recent)

    def observe(self, block_hashes: list[int], max_hit_blocks: int) -> int:
        """Blocks of this prompt's prefix already seen (at most max_hit_blocks, as a real
        cache always leaves one token to compute); then remember all of its blocks."""
        hits = 0
        for h in block_hashes[:max_hit_blocks]:
            if h not in self._recent:
                break
            hits += 1
        for h in block_hashes:
            self._recent[h] = None
            self._recent.move_to_end(h)
        while len(self._recent) > self.capacity:
            self._recent.popitem(last=False)
        return hits
