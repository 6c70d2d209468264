"""What the routing decision knows of one pod: its load and its LoRA adapters. Pure data.

Built by the pool from the pod's own /metrics (and its adapter list from /v1/models), so
the HTTP proxy and any other front end (an ext-proc server) hand the same record to
`routing.route`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PodLoad:
    requests: float = 0.0  # running + waiting (or this router's own in flight, if more)
    waiting: float = 0.0  # of those, waiting: the pod admits no more now
    active_adapters: frozenset[str] = frozenset()  # running or waiting on the pod
    max_lora: int = 0  # adapter slots (`max_lora`); 0: the pod reports no LoRA info
    served_adapters: frozenset[str] = frozenset()  # names the pod serves as adapters

    @property
    def has_free_slot(self) -> bool:
        """Room for one more adapter without evicting one (vLLM's `--max-loras`)."""
        return len(self.active_adapters) < self.max_lora
