"""KV block allocation with ref counts and hash-chained prefix caching.

Blocks are ids into the per-layer pools. A full block's identity is
hash(parent block hash, its tokens); cached blocks whose ref count drops to zero stay
in the free queue with their contents, so a later request with the same prefix reuses
them, until the allocator needs the block (LRU eviction, front of the queue first).
Blocks without a hash are put at the front of the queue: reusing them loses nothing.
"""

from __future__ import annotations

from collections import OrderedDict

from llmservice.server.engine.host_tier import HostTier
from llmservice.server.engine.request import Request

_ROOT_HASH = hash(("llmservice-prefix-root",))


def root_hash(lora_name: str | None) -> int:
    """The hash chain's root: a request for a LoRA adapter roots its chain in the adapter's
    name, so two adapters (or an adapter and the base model) never share KV blocks."""
    return _ROOT_HASH if lora_name is None else hash((_ROOT_HASH, "lora", lora_name))


class KVBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "key")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.key: tuple | None = None  # (parent hash, tokens): guards against hash collisions


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.req_blocks: dict[str, list[int]] = {}
        self.req_num_hashed: dict[str, int] = {}
        # the host tier (host_tier.py), when --kv-offloading-size is set: evicted cached
        # blocks are copied there (pending_offloads: device block, host block) and pulled
        # back on a prefix match (pending_restores: host block, device block); the engine
        # runs both lists before the step as the step's swap-outs / swap-ins
        self.host_tier: HostTier | None = None
        self.pending_offloads: list[tuple[int, int]] = []
        self.pending_restores: list[tuple[int, int]] = []
        self.restored_tokens: dict[str, int] = {}  # request -> prefix tokens the host tier supplied

    # ---- queries -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vllm:kv_cache_usage_perc)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def block_ids(self, request_id: str) -> list[int]:
        return self.req_blocks.get(request_id, [])

    def blank_free_blocks(self, limit: int | None = None) -> list[int]:
        """Free blocks that hold no cached prefix, in allocation order (up to `limit`):
        their contents are nobody's, so start-up measurements may write them (warm_up.py)."""
        out: list[int] = []
        for block_id in self.free_queue:
            if limit is not None and len(out) >= limit:
                break
            if self.blocks[block_id].block_hash is None:
                out.append(block_id)
        return out

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix hashing --------------------------------------------------------------
    def _update_hashes(self, request: Request) -> list[int]:
        bs = self.block_size
        hashes = request.block_hashes
        tokens = request.all_token_ids
        for i in range(len(hashes), len(tokens) // bs):
            parent = hashes[-1] if hashes else root_hash(request.lora_name)
            hashes.append(hash((parent, tuple(tokens[i * bs : (i + 1) * bs]))))
        return hashes

    def prompt_block_hashes(self, request: Request) -> list[int]:
        """The hash chain of the request's full blocks (computed even with caching off:
        the prefix sketch counts what a cache would have hit)."""
        return self._update_hashes(request)

    def _lookup(self, request: Request, index: int) -> int | None:
        h = request.block_hashes[index]
        block_id = self.cached.get(h)
        if block_id is None:
            return None
        bs = self.block_size
        parent = request.block_hashes[index - 1] if index else root_hash(request.lora_name)
        key = (parent, tuple(request.all_token_ids[index * bs : (index + 1) * bs]))
        return block_id if self.blocks[block_id].key == key else None

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix of full blocks; always leaves >= 1 token to compute."""
        if not self.enable_prefix_caching:
            return [], 0
        self._update_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for i in range(min(max_blocks, len(request.block_hashes))):
            block_id = self._lookup(request, i)
            if block_id is None:
                break
            hits.append(block_id)
        return hits, len(hits) * self.block_size

    def restore_from_host(self, request: Request) -> int:
        """Pull the blocks after the request's device-cached prefix back from the host tier
        into free device blocks, registered as cached (ref 0), so that the next
        get_computed_blocks finds them; the copies are queued in pending_restores. The
        device prefix and the restored blocks go to the LRU end of the free queue, and at
        most as many blocks are restored as leave them there, so restoring never evicts
        its own prefix. Returns the number of tokens restored."""
        if self.host_tier is None or not self.enable_prefix_caching:
            return 0
        self._update_hashes(request)
        bs = self.block_size
        limit = min((request.num_tokens - 1) // bs, len(request.block_hashes))
        index, protected = 0, 0
        while index < limit and (block_id := self._lookup(request, index)) is not None:
            if self.blocks[block_id].ref_cnt == 0:
                self.free_queue.move_to_end(block_id)
                protected += 1
            index += 1
        restored = 0
        while index < limit and self.num_free_blocks - protected - restored > 0:
            parent = request.block_hashes[index - 1] if index else root_hash(request.lora_name)
            block_hash = request.block_hashes[index]
            key = (parent, tuple(request.all_token_ids[index * bs : (index + 1) * bs]))
            if self.host_tier.lookup(block_hash, key) is None:
                break
            host_block = self.host_tier.restore(block_hash)
            block_id = self._pop_free()
            block = self.blocks[block_id]
            block.ref_cnt = 0
            block.block_hash, block.key = block_hash, key
            self.cached[block_hash] = block_id
            self.free_queue[block_id] = None
            self.pending_restores.append((host_block, block_id))
            restored += 1
            index += 1
        if restored:
            self.restored_tokens[request.request_id] = self.restored_tokens.get(request.request_id, 0) + restored * bs
        return restored * bs

    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The host-tier copies queued since the last call: (offloads, restores)."""
        copies = (self.pending_offloads, self.pending_restores)
        self.pending_offloads, self.pending_restores = [], []
        return copies

    # ---- allocation ------------------------------------------------------------------
    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> bool:
        """Make room for num_new_tokens more tokens after request.num_computed_tokens
        (plus the prefix hits in computed_blocks). False, with nothing changed, if the
        free pool is too small."""
        computed_blocks = computed_blocks or []
        held = self.req_blocks.get(request.request_id, [])
        total_tokens = request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        num_new_blocks = self.blocks_needed(total_tokens) - len(held) - len(computed_blocks)
        reclaimed = sum(1 for b in computed_blocks if self.blocks[b].ref_cnt == 0)
        if max(num_new_blocks, 0) > self.num_free_blocks - reclaimed:
            return False
        for b in computed_blocks:
            block = self.blocks[b]
            if block.ref_cnt == 0:
                del self.free_queue[b]
            block.ref_cnt += 1
        new_blocks = [self._pop_free() for _ in range(max(num_new_blocks, 0))]
        self.req_blocks[request.request_id] = held + computed_blocks + new_blocks
        if computed_blocks:
            self.req_num_hashed[request.request_id] = len(held) + len(computed_blocks)
        return True

    def _pop_free(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:  # evict the cached contents (LRU)
            if self.host_tier is not None and block.key is not None:
                host_block = self.host_tier.offload(block.block_hash, block.key)
                if host_block is not None:
                    self.pending_offloads.append((block_id, host_block))
            if self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
            block.block_hash = None
            block.key = None
        block.ref_cnt = 1
        return block_id

    def cache_blocks(self, request: Request) -> None:
        """Register the request's newly full, computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        held = self.req_blocks.get(rid, [])
        hashes = self._update_hashes(request)
        start = self.req_num_hashed.get(rid, 0)
        end = min(request.num_computed_tokens // self.block_size, len(held), len(hashes))
        bs = self.block_size
        for i in range(start, end):
            block = self.blocks[held[i]]
            if block.block_hash is not None or hashes[i] in self.cached:
                continue  # already cached (a hit), or the same content lives in another block
            parent = hashes[i - 1] if i else root_hash(request.lora_name)
            block.block_hash = hashes[i]
            block.key = (parent, tuple(request.all_token_ids[i * bs : (i + 1) * bs]))
            self.cached[hashes[i]] = block.block_id
        self.req_num_hashed[rid] = max(start, end)

    def free(self, request: Request) -> None:
        """Drop the request's references; its deepest blocks become the first evicted."""
        rid = request.request_id
        self.req_num_hashed.pop(rid, None)
        self._release(self.req_blocks.pop(rid, []), rid)

    def truncate(self, request: Request) -> None:
        """Free the blocks past the request's computed tokens (rejected draft tokens were
        rolled back). Such blocks hold no cached prefix: only full blocks of computed
        tokens are ever hashed."""
        held = self.req_blocks.get(request.request_id, [])
        keep = self.blocks_needed(request.num_computed_tokens)
        self._release(held[keep:], request.request_id)
        del held[keep:]

    def _release(self, block_ids: list[int], rid: str) -> None:
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            block.ref_cnt -= 1
            if block.ref_cnt < 0:
                raise RuntimeError(f"block {block_id} freed twice (request {rid})")
            if block.ref_cnt == 0:
                self.free_queue[block_id] = None
                if block.block_hash is None:
                    self.free_queue.move_to_end(block_id, last=False)

    def check_invariants(self) -> None:
        """Every block is either free (ref 0, in the queue) or held exactly ref_cnt times."""
        held_count: dict[int, int] = {}
        for blocks in self.req_blocks.values():
            for b in blocks:
                held_count[b] = held_count.get(b, 0) + 1
        for block in self.blocks:
            expected = held_count.get(block.block_id, 0)
            if block.ref_cnt != expected:
                raise AssertionError(f"block {block.block_id}: ref_cnt {block.ref_cnt} != holders {expected}")
            if (block.ref_cnt == 0) != (block.block_id in self.free_queue):
                raise AssertionError(f"block {block.block_id}: ref_cnt {block.ref_cnt} but free={block.block_id in self.free_queue}")
        for h, b in self.cached.items():
            if self.blocks[b].block_hash != h:
                raise AssertionError(f"cache entry {h} -> block {b} has hash {self.blocks[b].block_hash}")
