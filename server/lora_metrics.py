"""vllm:lora_requests_info exactly as vLLM exports it: a gauge whose labels are
max_lora (--max-loras), running_lora_adapters and waiting_lora_adapters (comma-joined
adapter names) and whose value is the time it was set (set_to_current_time). Routers
(the Gateway API Inference Extension, llm-d, AIBrix) read the labels of the newest sample;
this server keeps only the current label set, so the newest is the only one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge


class LoRAMetrics:
    def __init__(self, registry: CollectorRegistry, max_loras: int):
        self.max_lora = str(max_loras)
        self.gauge = Gauge(
            "vllm:lora_requests_info", "Running stats on lora requests.",
            ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=registry,
        )  # fmt: skip
        self._labels: tuple[str, str] | None = None
        self.on_adapters((), ())

    def on_adapters(self, running: tuple[str, ...], waiting: tuple[str, ...]) -> None:
        labels = (",".join(running), ",".join(waiting))
        if labels != self._labels:
            self.gauge.clear()
            self._labels = labels
        self.gauge.labels(
            max_lora=self.max_lora, waiting_lora_adapters=labels[1], running_lora_adapters=labels[0]
        ).set_to_current_time()
