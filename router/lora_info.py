"""A pod's LoRA state from its own answers: `vllm:lora_requests_info` and `/v1/models`. Pure.

vLLM (and this project's server) exports one gauge per label set: `max_lora`,
`running_lora_adapters` and `waiting_lora_adapters` (comma separated), value = the Unix
time the set was current. As the Gateway API Inference Extension's endpoint picker reads
it: the newest sample by value wins, and samples with no running and no waiting adapter
are skipped, so an idle pod keeps the adapters it last ran (they stay in its slots until
another adapter needs one). `active is None` says only such idle samples were there.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

METRIC = "vllm:lora_requests_info"
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class LoraInfo:
    max_lora: int
    active: frozenset[str] | None  # None: the pod reported no running or waiting adapter

    def after(self, previous: LoraInfo | None) -> LoraInfo:
        """This scrape on top of the last one: an idle report keeps the last active set."""
        if self.active is not None:
            return self
        kept = previous.active if previous is not None else None
        return LoraInfo(self.max_lora, kept if kept is not None else frozenset())


def _labels(text: str) -> dict[str, str]:
    return {
        k: re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], v) for k, v in _LABEL.findall(text)
    }


def _names(value: str) -> frozenset[str]:
    return frozenset(n.strip() for n in value.split(",") if n.strip())


def parse_lora_info(text: str) -> LoraInfo | None:
    """The pod's adapter state from a /metrics text; None if it does not export the gauge."""
    newest: tuple[float, dict[str, str]] | None = None  # any sample: max_lora
    busiest: tuple[float, frozenset[str]] | None = None  # newest with adapters in it
    for line in text.splitlines():
        if not line.startswith(METRIC + "{"):
            continue
        head, _, value = line.rpartition("}")
        with contextlib.suppress(ValueError, IndexError):
            stamp = float(value.split()[0])
            labels = _labels(head)
            if newest is None or stamp > newest[0]:
                newest = (stamp, labels)
            active = _names(labels.get("running_lora_adapters", "")) | _names(
                labels.get("waiting_lora_adapters", "")
            )
            if active and (busiest is None or stamp > busiest[0]):
                busiest = (stamp, active)
    if newest is None:
        return None
    try:
        max_lora = max(0, int(newest[1].get("max_lora", "0")))
    except ValueError:
        max_lora = 0
    return LoraInfo(max_lora, busiest[1] if busiest is not None else None)


def adapter_names(models: Any) -> frozenset[str]:
    """The adapters in a `GET /v1/models` answer: entries with a `parent` (the base model)."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        return frozenset()
    return frozenset(
        str(m["id"]) for m in data if isinstance(m, dict) and m.get("parent") and m.get("id")
    )
