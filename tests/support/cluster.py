"""An emulated cluster for synchronous tests: API emulator + fake kubelet in a thread.

Tests and the operator process talk to it over HTTP (a kubeconfig file points at it);
tests may also peek at the store directly through `cluster.call(...)`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import yaml

from tests.support.emulator import ApiEmulator, serving
from tests.support.kubelet import FakeKubelet, Node

T = TypeVar("T")


def write_kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": url}}],
                "users": [{"name": "tester", "user": {"token": "emulated"}}],
                "contexts": [
                    {"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}
                ],
                "current-context": "emulator",
            }
        )
    )
    return path


class Cluster:
    """Start with `with Cluster(tmp_path) as c:`; `c.api` is a kubernetes ApiClient."""

    def __init__(self, workdir: Path, nodes: list[Node] | None = None, **kubelet: Any) -> None:
        self.workdir = workdir
        self.nodes = (
            nodes if nodes is not None else [Node("gpu-node-1", gpus=8), Node("cpu-node-1", gpus=0)]
        )
        self.kubelet_options = kubelet
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._stop: asyncio.Event | None = None
        self._runner: concurrent.futures.Future[None] | None = None
        self.emulator: ApiEmulator
        self.kubelet: FakeKubelet
        self.url = ""

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the cluster's loop (store access is not thread-safe)."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    async def _serve(self, started: concurrent.futures.Future[None]) -> None:
        self._stop = asyncio.Event()
        try:
            async with serving() as (emulator, url):
                self.emulator, self.url = emulator, url
                self.kubelet = FakeKubelet(emulator.store, self.nodes, **self.kubelet_options)
                async with self.kubelet.running():
                    started.set_result(None)
                    await self._stop.wait()
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    def __enter__(self) -> Cluster:
        self._thread.start()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._runner = asyncio.run_coroutine_threadsafe(self._serve(started), self.loop)
        started.result(timeout=30)
        self.kubeconfig = write_kubeconfig(self.workdir / "kubeconfig", self.url)
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=str(self.kubeconfig), client_configuration=config
        )
        self.api = kubernetes.client.ApiClient(config)
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.close()
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._runner is not None:
            # The kubelet stops its pods' processes (5 s grace, then SIGKILL) before this
            # resolves; under load a server process can take long to reap.
            self._runner.result(timeout=120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
