"""Which adapter each device slot holds, decided by the scheduler; no tensors.

A slot is pinned while a running (or swapped) request uses its adapter; an unpinned
slot keeps its adapter (a later request reuses it without a copy) until the least
recently used unpinned slot is taken for another adapter. The copies a step needs
(`take_loads`) are done by the engine before the step runs.
"""

from __future__ import annotations

from collections import OrderedDict


class AdapterSlots:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.adapter_of: list[str | None] = [None] * num_slots
        self._slot: dict[str, int] = {}
        self._users: dict[int, set[str]] = {s: set() for s in range(num_slots)}
        self._holder: dict[str, int] = {}  # request id -> its slot
        self._idle: OrderedDict[int, None] = OrderedDict((s, None) for s in range(num_slots))  # LRU first
        self._loads: list[tuple[int, str]] = []

    def slot_of(self, key: str) -> int | None:
        return self._slot.get(key)

    def can_acquire(self, key: str) -> bool:
        return key in self._slot or bool(self._idle)

    def acquire(self, request_id: str, key: str) -> bool:
        """Pin a slot holding `key` for the request (loading it into the least recently
        used idle slot when none holds it); False when every slot is pinned."""
        if request_id in self._holder:
            return True
        slot = self._slot.get(key)
        if slot is None:
            if not self._idle:
                return False
            slot = next(iter(self._idle))
            old = self.adapter_of[slot]
            if old is not None:
                del self._slot[old]
            self.adapter_of[slot] = key
            self._slot[key] = slot
            self._loads.append((slot, key))
        self._idle.pop(slot, None)
        self._users[slot].add(request_id)
        self._holder[request_id] = slot
        return True

    def release(self, request_id: str) -> None:
        slot = self._holder.pop(request_id, None)
        if slot is None:
            return
        users = self._users[slot]
        users.discard(request_id)
        if not users:
            self._idle[slot] = None  # most recently used idle slot: taken last

    def forget(self, key: str) -> None:
        """Drop an unpinned adapter from its slot (unloaded): it is never reused."""
        slot = self._slot.get(key)
        if slot is not None and not self._users[slot]:
            del self._slot[key]
            self.adapter_of[slot] = None
            self._idle.move_to_end(slot, last=False)

    def take_loads(self) -> list[tuple[int, str]]:
        """(slot, adapter) copies to do before the next step runs."""
        loads, self._loads = self._loads, []
        return loads

    def pinned(self) -> dict[str, int]:
        """Adapters in use by requests holding slots -> number of such requests."""
        return {self.adapter_of[s]: len(u) for s, u in self._users.items() if u}
