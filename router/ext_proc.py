"""`llmservice router --ext-proc`: the router as an inference gateway's endpoint picker.

A grpc.aio server implementing Envoy's `envoy.service.ext_proc.v3.ExternalProcessor`
(one bidirectional stream per HTTP request; ext_proc_stream.py decides each answer) and
the gRPC health service the endpoint-picker protocol asks for (`liveness`, `readiness`,
the ExternalProcessor service name, and ""). It picks from the same `PodPool` as the
HTTP proxy (the EndpointSlice watch or `--backend` pods, their scraped loads) with the
same policy (routing.py through `PodPool.pick`, prefix_key.py, the body's `model` for
LoRA adapter affinity), so a request gets the pod the HTTP router would have sent it to. A pick counts as in flight on that pod until
the gateway closes the stream (the end of the HTTP request), as a proxied request does.
No pod: 503 at once (Envoy's ext-proc message timeout is far shorter than a hold), and
with `--scale-from-zero` the waker is poked so the next request finds a pod.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from llmservice.router.ext_proc_messages import endpoint_address, in_subset
from llmservice.router.ext_proc_stream import ExtProcStream, Picked
from llmservice.router.metrics import RouterMetrics
from llmservice.router.pool import PodPool
from llmservice.router.prefix_key import prefix_key
from llmservice.router.proxy import RouterConfig, request_model
from llmservice.router.wake import Waker

log = logging.getLogger(__name__)

EXT_PROC_PORT = 9002  # the reference endpoint picker's port (InferencePool endpointPickerRef)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name
HEALTH_SERVICES = ("", "liveness", "readiness", SERVICE_NAME)


class PoolPicker:
    """The HTTP router's choice, for an ext-proc request: prefix key, pool, policy."""

    def __init__(
        self,
        pool: PodPool,
        config: RouterConfig,
        metrics: RouterMetrics | None = None,
        waker: Waker | None = None,
    ) -> None:
        self.pool, self.config, self.waker = pool, config, waker
        self.metrics = metrics or RouterMetrics()

    def pick(self, body: Any, subset: frozenset[str] | None) -> Picked | None:
        cfg = self.config
        key = None if cfg.policy == "round-robin" else prefix_key(body, cfg.prefix_tokens)
        exclude: frozenset[str] = frozenset()
        if subset is not None:
            exclude = frozenset(
                pod for pod, ep in self.pool.endpoints.items()
                if not in_subset(endpoint_address(ep.url), subset)
            )  # fmt: skip
        choice = self.pool.pick(key, cfg.policy, cfg.load_factor, exclude, request_model(body))
        if choice is None:
            self.metrics.requests.labels("", "503").inc()
            if self.waker is not None:
                self.waker.poke()
            return None
        self.metrics.decisions.labels(choice.reason).inc()
        self.pool.started(choice.pod, choice.adapter)
        address = endpoint_address(self.pool.endpoints[choice.pod].url)
        return Picked(choice.pod, address, choice.adapter)

    def release(self, picked: Picked) -> None:
        self.pool.finished(picked.pod, picked.adapter)


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):
    def __init__(self, picker: PoolPicker, service: str = "") -> None:
        self.picker = picker
        self.service = service

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = ExtProcStream(self.picker, self.service)
        try:
            async for request in request_iterator:
                for response in stream.feed(request):
                    yield response
                if stream.closed:
                    return
        finally:
            if stream.picked is not None:
                self.picker.release(stream.picked)


class ExtProcServer:
    """The gRPC server: ExternalProcessor and health, on `host:port` (port 0: any free)."""

    def __init__(
        self,
        picker: PoolPicker,
        service: str = "",
        host: str = "0.0.0.0",
        port: int = EXT_PROC_PORT,
    ) -> None:
        self.server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(
            ExternalProcessor(picker, service), self.server
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        try:
            self.port = self.server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as exc:  # grpc's answer to a port in use
            raise OSError(f"--ext-proc-port {port}: cannot listen on {host}:{port}: {exc}") from exc

    async def start(self) -> ExtProcServer:
        await self.server.start()
        await self.set_serving(True)
        return self

    async def set_serving(self, serving: bool) -> None:
        """Readiness and the ExternalProcessor service follow the router's own readiness;
        liveness stays SERVING while the process answers."""
        up, down = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        for name in HEALTH_SERVICES:
            await self.health.set(name, up if serving or name == "liveness" else down)

    async def stop(self, grace_s: float) -> None:
        """Not ready first, then up to `grace_s` for open streams (whole HTTP requests)."""
        await self.set_serving(False)
        await self.server.stop(grace_s)
