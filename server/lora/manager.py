"""The engine's adapters: the registered names, the host LRU of parsed adapters
(--max-cpu-loras), the device slots (--max-loras) and the copies between them.

Reading an adapter from disk (safetensors parse, checks) runs on a loader thread, off
the step loop: a request whose adapter is not in host memory waits (the scheduler's
admission gate says no) until the thread has it. The copy into a device slot is a few
small tensor copies, done by the engine before the step that first needs it.

Each load of a name gets its own key (`name`, then `name#2`, ...): the prefix cache keys
a request's blocks by it (block_manager.root_hash), so an adapter unloaded and loaded
again from other weights never shares KV with the old one.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from llmservice.server.lora.adapter import LoRAAdapter, LoRAAdapterError, load_peft_adapter
from llmservice.server.lora.fit import check_fits
from llmservice.server.lora.slots import AdapterSlots
from llmservice.server.lora.weights import LoRAWeights
from llmservice.server.model.config import ModelConfig

log = logging.getLogger("llmservice.lora")


@dataclass(frozen=True)
class AdapterEntry:
    name: str
    path: str
    key: str  # the slot / cache / prefix-cache key of this load


class LoRAManager:
    def __init__(self, weights: LoRAWeights, config: ModelConfig, model_name: str, max_cpu_loras: int):
        self.weights = weights
        self.config = config
        self.model_name = model_name
        self.max_rank = weights.max_rank
        self.max_cpu_loras = max_cpu_loras
        self.slots = AdapterSlots(weights.num_slots)
        self.entries: dict[str, AdapterEntry] = {}  # registered name -> entry
        self.by_key: dict[str, AdapterEntry] = {}  # every key a request may still use
        self._loads: dict[str, int] = {}
        self._lock = threading.Lock()
        self._host: OrderedDict[str, LoRAAdapter] = OrderedDict()  # key -> parsed, LRU first
        self._reading: dict[str, Future] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="lora-loader")

    # ---- registration (start-up, /v1/load_lora_adapter, /v1/unload_lora_adapter) ------------
    def read(self, name: str, path: str) -> LoRAAdapter:
        """Parse and check an adapter against the model; LoRAAdapterError names the problem."""
        adapter = load_peft_adapter(name, path, self.max_rank)
        check_fits(adapter, self.config, self.model_name)
        return adapter

    def add(self, name: str, path: str) -> AdapterEntry:
        """Read, check and register; on any error nothing registered changes."""
        if name in self.entries:
            raise LoRAAdapterError(f"adapter {name!r} is already loaded; unload it first")
        if name == self.model_name:
            raise LoRAAdapterError(f"adapter name {name!r} is the base model's name")
        adapter = self.read(name, path)
        n = self._loads.get(name, 0) + 1
        self._loads[name] = n
        entry = AdapterEntry(name, str(path), name if n == 1 else f"{name}#{n}")
        self.entries[name] = entry
        self.by_key[entry.key] = entry
        self._keep(entry.key, adapter)
        return entry

    def remove(self, name: str) -> AdapterEntry:
        """Unregister: new requests cannot name it; running ones finish with it."""
        entry = self.entries.pop(name, None)
        if entry is None:
            raise KeyError(name)
        return entry

    def retire_unused(self, in_use: set[str]) -> None:
        """Forget the keys of unloaded adapters that no request uses any more."""
        for key in [k for k, e in self.by_key.items() if self.entries.get(e.name) is not e and k not in in_use]:
            del self.by_key[key]
            self.slots.forget(key)
            with self._lock:
                self._host.pop(key, None)
            self._reading.pop(key, None)

    def key_of(self, name: str) -> str | None:
        entry = self.entries.get(name)
        return entry.key if entry else None

    def name_of(self, key: str) -> str:
        return self.by_key[key].name if key in self.by_key else key.split("#", 1)[0]

    # ---- host LRU -------------------------------------------------------------------------------
    def _keep(self, key: str, adapter: LoRAAdapter) -> None:
        with self._lock:
            self._host[key] = adapter
            self._host.move_to_end(key)
            while len(self._host) > self.max_cpu_loras:
                self._host.popitem(last=False)

    def in_host(self, key: str) -> bool:
        with self._lock:
            return key in self._host

    def ensure_in_host(self, key: str) -> bool:
        """True when parsed in host memory; else start reading it on the loader thread."""
        if self.in_host(key):
            return True
        entry = self.by_key.get(key)
        reading = self._reading.get(key)
        # a finished read whose adapter the LRU has dropped since is read again; the future
        # stays in the map until then (a read that finished before submit() returned must
        # not leave a stale entry that blocks every later read of the key)
        if entry is not None and (reading is None or reading.done()):
            self._reading[key] = self._pool.submit(self._read_back, entry)
        return False

    def wait_for_reads(self, timeout_s: float) -> None:
        """Block up to timeout_s for an adapter read on the loader thread (none pending:
        return). The engine calls it after an empty step, so a loop whose requests wait for
        their adapters sleeps instead of spinning on the GIL the loader thread needs."""
        pending = [f for f in list(self._reading.values()) if not f.done()]
        if pending:
            wait(pending, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def _read_back(self, entry: AdapterEntry) -> None:
        try:
            self._keep(entry.key, self.read(entry.name, entry.path))
        except LoRAAdapterError as err:  # the files changed under a loaded adapter
            log.error("re-reading LoRA adapter %r failed: %s", entry.name, err)

    def host_copy(self, key: str) -> LoRAAdapter:
        """The parsed adapter (read now if the LRU dropped it since admission)."""
        with self._lock:
            adapter = self._host.get(key)
            if adapter is not None:
                self._host.move_to_end(key)
                return adapter
        entry = self.by_key[key]
        adapter = self.read(entry.name, entry.path)
        self._keep(key, adapter)
        return adapter

    # ---- device slots ---------------------------------------------------------------------------
    def can_start(self, key: str) -> bool:
        """The admission gate: in host memory and a slot holds it or can take it."""
        return self.ensure_in_host(key) and self.slots.can_acquire(key)

    def copy_pending(self) -> int:
        """Copy into their slots the adapters the scheduler just placed there."""
        loads = self.slots.take_loads()
        for slot, key in loads:
            self.weights.load_slot(slot, self.host_copy(key))
        return len(loads)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
