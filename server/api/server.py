"""Run the app under uvicorn with Kubernetes-friendly shutdown.

On SIGTERM (or the first Ctrl-C) the server does not stop listening at once, as
uvicorn would: it starts draining. `/ready` answers 503 at once so the Service takes
the pod out of rotation, new generation requests get 503 (a retrying client moves to
another replica), in-flight requests run to completion, and only then, or when
`--shutdown-grace-seconds` run out (remaining requests are aborted), does uvicorn
close. The process exits 0. A second signal exits immediately.

If the engine-core process dies (killed, out of memory), the streams in flight get an
error event (engine_client.py), `/health` answers 503, and shortly after the server
stops and exits 1, so that the kubelet restarts the container rather than leaving a
pod that accepts connections and can never generate.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType

import uvicorn
from llmservice.server.api.serving import ServerState

log = logging.getLogger("llmservice.api")

DRAIN_POLL_S = 0.05
ENGINE_POLL_S = 0.2
DEAD_ENGINE_LINGER_S = 1.0  # lets the error events reach the clients before the sockets close


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, grace_s: float):
        super().__init__(config)
        self.state = state
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        watch = self._loop.create_task(self._watch_engine())
        try:
            await super().serve(sockets)
        finally:
            watch.cancel()

    async def _watch_engine(self) -> None:
        while self.state.engine.dead is None:
            await asyncio.sleep(ENGINE_POLL_S)
        log.error("the engine core is gone (%s): stopping the server, exit code 1", self.state.engine.dead)
        await asyncio.sleep(DEAD_ENGINE_LINGER_S)
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.state.draining or self._loop is None or not self.started:
            super().handle_exit(sig, frame)  # second signal, or not serving yet: stop now
            return
        log.info("received %s: draining (grace %.0f s)", signal.Signals(sig).name, self.grace_s)
        self.state.draining = True
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.grace_s
        while not self.state.idle and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if not self.state.idle:
            left = list(self.state.engine.streams)
            log.warning("grace period over: aborting %d requests", len(left))
            self.state.engine.abort(left)
        else:
            log.info("drained: all in-flight requests finished")
        self.should_exit = True


def run_server(app, state: ServerState, host: str, port: int, grace_s: float, log_level: str = "info") -> int:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=5,  # after draining only idle/last-bytes connections remain
        access_log=False,
        # asyncio, not uvicorn's "auto" (uvloop once installed, as it is for the router):
        # the server's loop is measured on asyncio (loop-lag probe, drain); uvloop here is
        # a separate, unmeasured change
        loop="asyncio",
    )
    server = DrainingServer(config, state, grace_s)
    server.run()
    return 1 if state.engine.dead is not None else 0
