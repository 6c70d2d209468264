"""A pod's /metrics text as the server writes it with `--enable-lora`: the server's own
`LoRAMetrics` and its request gauges in a prometheus_client registry, rendered by
`generate_latest` (what `GET /metrics` answers)."""

from __future__ import annotations

from llmservice.server.lora_metrics import LoRAMetrics
from prometheus_client import CollectorRegistry, Gauge, generate_latest


def server_metrics(
    running_requests: int = 0,
    running: tuple[str, ...] = (),
    waiting: tuple[str, ...] = (),
    max_loras: int | None = 2,
    waiting_requests: int = 0,
) -> str:
    """`max_loras=None`: a server started without `--enable-lora` (no LoRA gauge)."""
    registry = CollectorRegistry()
    for name, value in (("running", running_requests), ("waiting", waiting_requests)):
        Gauge(f"vllm:num_requests_{name}", "requests", ["model_name"], registry=registry).labels(
            model_name="base"
        ).set(value)
    if max_loras is not None:
        LoRAMetrics(registry, max_loras).on_adapters(running, waiting)
    return generate_latest(registry).decode()
