"""The model pods, from the EndpointSlices of the LLMService's headless pods Service.

`pods_from_slices` is pure: the API's EndpointSlice JSON in, routable pods out (Ready,
not terminating, with an address). `SliceWatcher` keeps the slices current with a
`kubernetes` client watch (list, then watch from its resourceVersion; a 410 Gone or a
dropped stream lists again) in a daemon thread, and hands every new set of pods to a
callback; the proxy turns that into an asyncio wake-up. Pending pods have no address
yet and appear in no slice: held requests just keep waiting for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmservice.pod_address import address_map, host_of

__all__ = ["Endpoint", "SliceWatcher", "address_map", "pods_from_slices"]

log = logging.getLogger(__name__)

SERVICE_LABEL = "kubernetes.io/service-name"


@dataclass(frozen=True)
class Endpoint:
    pod: str  # the pod's name (targetRef), the same in every router replica
    url: str  # http://ip:port


def pods_from_slices(
    slices: Iterable[Mapping[str, Any]],
    port_name: str = "http",
    rewrite: tuple[str, str] | None = None,
) -> dict[str, Endpoint]:
    """Routable pods by name. A missing `ready` condition means ready (the API's rule)."""
    found: dict[str, Endpoint] = {}
    for s in slices:
        ports = s.get("ports") or []
        port = next((p.get("port") for p in ports if p.get("name") == port_name), None)
        if port is None and ports:
            port = ports[0].get("port")
        if port is None:
            continue
        for ep in s.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            if cond.get("ready") is False or cond.get("terminating") is True:
                continue
            addresses = ep.get("addresses") or []
            if not addresses:
                continue
            name = (ep.get("targetRef") or {}).get("name") or addresses[0]
            found[name] = Endpoint(name, f"http://{host_of(addresses[0], rewrite)}:{port}")
    return found


class SliceWatcher:
    """Watch one Service's EndpointSlices; call `on_change(pods)` on every change."""

    def __init__(
        self,
        namespace: str,
        service: str,
        on_change: Callable[[dict[str, Endpoint]], None],
        *,
        rewrite: tuple[str, str] | None = None,
    ) -> None:
        self.namespace, self.service = namespace, service
        self.on_change = on_change
        self.rewrite = rewrite
        self._stop = threading.Event()
        self._watch: Any = None
        self.thread = threading.Thread(target=self._run, name="endpointslices", daemon=True)

    def start(self) -> SliceWatcher:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _run(self) -> None:
        from kubernetes import client, watch

        api = client.DiscoveryV1Api()
        serialize = api.api_client.sanitize_for_serialization
        selector = f"{SERVICE_LABEL}={self.service}"
        while not self._stop.is_set():
            try:
                listed = api.list_namespaced_endpoint_slice(self.namespace, label_selector=selector)
                slices = {s.metadata.name: serialize(s) for s in listed.items}
                self._publish(slices)
                version = listed.metadata.resource_version
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=selector,
                    resource_version=version,
                    timeout_seconds=300,
                ):
                    obj = event["object"]
                    if event["type"] == "DELETED":
                        slices.pop(obj.metadata.name, None)
                    else:
                        slices[obj.metadata.name] = serialize(obj)
                    self._publish(slices)
            except Exception as exc:  # 410 Gone, a dropped stream, an API restart: list again
                if self._stop.is_set():
                    return
                log.warning(
                    "EndpointSlice watch of %s/%s: %s; listing again",
                    self.namespace,
                    self.service,
                    exc,
                )
                time.sleep(0.5)

    def _publish(self, slices: dict[str, Any]) -> None:
        self.on_change(pods_from_slices(slices.values(), rewrite=self.rewrite))
