"""The API process's handle on the engine-core process: an asyncio bridge.

Commands go out through a multiprocessing queue (its feeder thread does the pickling,
so `put` never blocks the event loop). One reader thread blocks on the engine's
reports and hands each one to the event loop with a single `call_soon_threadsafe`;
the loop then only resolves futures, fills per-request queues and updates metrics.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import Any

from llmservice.server.api.engine_process import EngineProcess, run_engine_process  # noqa: F401  (re-exported)
from llmservice.server.api.errors import APIError
from llmservice.server.config import EngineConfig
from llmservice.server.engine.messages import (
    AbortRequests,
    AddRequest,
    CostsMeasured,
    EngineFailed,
    EngineReady,
    EngineStats,
    Listening,
    LoadLoRA,
    LoRAChanged,
    Report,
    Shutdown,
    Sleep,
    SleepChanged,
    UnloadLoRA,
    WakeUp,
)
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.metrics import ServerMetrics

log = logging.getLogger("llmservice.api")


class EngineDeadError(RuntimeError):
    pass


class EngineStartError(RuntimeError):
    pass


class RequestStream:
    """One engine request as seen by the client: acceptance, timings, where deltas go."""

    def __init__(
        self,
        request_id: str,
        num_prompt_tokens: int,
        arrival_time: float,
        loop: asyncio.AbstractEventLoop,
        out: asyncio.Queue,
    ):
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.arrival_time = arrival_time
        self.accepted: asyncio.Future[None] = loop.create_future()
        self.queue = out  # shared by the n choices of one HTTP request
        self.num_output_tokens = 0
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.first_scheduled_time: float | None = None
        self.finished = False


class EngineClient:
    def __init__(
        self,
        config: EngineConfig,
        log_level: int = logging.INFO,
        show_progress: bool = True,
        engine: EngineProcess | None = None,
    ):
        """`engine`: the engine-core process, possibly started already (serve starts it
        before importing the API); by default one is made here and `spawn()` starts it."""
        self.config = config
        self._engine = engine or EngineProcess(config, log_level, show_progress)
        self.inbox = self._engine.inbox
        self.outbox = self._engine.outbox
        self.process: Any = self._engine.process if self._engine.started else None
        self.info: EngineReady | None = None
        self.stats = EngineStats()
        self.streams: dict[str, RequestStream] = {}
        self.dead: str | None = None
        self.metrics: ServerMetrics | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: threading.Thread | None = None
        self._closing = False
        # sleep mode: the level the engine reported (0: awake), and who waits for the next answer
        self.sleep_level = 0
        self.sleep_requested = False  # from POST /sleep on: new requests get 503 + Retry-After
        self._sleep_waiters: list[asyncio.Future[SleepChanged]] = []
        # --enable-lora: the adapters the engine serves (name -> path), and who waits for an answer
        self.lora_adapters: dict[str, str] = {}
        self._lora_waiters: list[asyncio.Future[LoRAChanged]] = []

    # ---- lifecycle ---------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the engine-core process (it loads the weights in the background)."""
        if not self._engine.started:
            self._engine.start()
        self.process = self._engine.process

    def start(self, timeout_s: float = 3600.0) -> EngineReady:
        """Spawn the engine core if needed and wait (blocking) until it is ready."""
        if self.process is None:
            self.spawn()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                msg = self.outbox.get(timeout=0.5)
            except queue.Empty:
                if not self.process.is_alive():
                    raise EngineStartError(f"the engine process exited with code {self.process.exitcode}") from None
                continue
            if isinstance(msg, EngineFailed):
                self.process.join(5)
                raise EngineStartError(msg.message)
            if isinstance(msg, EngineReady):
                self.info = msg
                self.lora_adapters = dict(msg.lora_adapters)
                return msg
        raise EngineStartError(f"the engine did not become ready within {timeout_s:.0f} s")

    def attach(self, loop: asyncio.AbstractEventLoop, metrics: ServerMetrics) -> None:
        """Start delivering reports to this event loop."""
        self._loop = loop
        self.metrics = metrics
        self._reader = threading.Thread(target=self._read_loop, name="engine-reader", daemon=True)
        self._reader.start()
        self.inbox.put(Listening())

    def close(self, timeout_s: float = 10.0) -> None:
        self._closing = True
        if self.process is None:
            return
        if self.process.is_alive():
            self.inbox.put(Shutdown())
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self._reader is not None:
            self._reader.join(2)
        self.inbox.close()
        self.outbox.close()

    # ---- requests ----------------------------------------------------------------------------
    @property
    def num_in_flight(self) -> int:
        return len(self.streams)

    @property
    def num_waiting_estimate(self) -> int:
        """Requests the engine has not started: all in flight minus those running at the
        last step (new arrivals count as waiting until the engine reports otherwise)."""
        return max(0, len(self.streams) - self.stats.num_running)

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int,
        arrival_time: float,
        out: asyncio.Queue,
        lora_name: str | None = None,
    ) -> RequestStream:
        """Register the request (from now on it counts as in flight) and send it to the
        engine; its `accepted` future resolves when the engine took it."""
        if self.dead is not None:
            raise APIError(503, f"the engine is not running: {self.dead}")
        if self.sleep_requested or self.sleep_level:
            raise APIError(503, "the engine is asleep: POST /wake_up first", headers=self._asleep_headers())
        assert self._loop is not None, "attach() first"
        stream = RequestStream(request_id, len(prompt_token_ids), arrival_time, self._loop, out)
        self.streams[request_id] = stream
        self.inbox.put(AddRequest(request_id, prompt_token_ids, params, priority, arrival_time, lora_name))
        return stream

    async def wait_accepted(self, streams: list[RequestStream]) -> None:
        """Wait until the engine accepted all; raises APIError if it refused one."""
        try:
            await asyncio.gather(*(s.accepted for s in streams))
        except asyncio.CancelledError:
            self.abort([s.request_id for s in streams])
            raise

    def abort(self, request_ids: list[str]) -> None:
        """Stop requests (client gone, grace period over); frees their KV blocks."""
        live = []
        now = time.monotonic()
        for rid in request_ids:
            stream = self.streams.pop(rid, None)
            if stream is None or stream.finished:
                continue
            stream.finished = True
            live.append(rid)
            if not stream.accepted.done():
                stream.accepted.cancel()  # nobody waits for an aborted admission
            elif self.metrics is not None:
                self._observe_finish(stream, "abort", now)
        if live and self.dead is None:
            self.inbox.put(AbortRequests(live))

    # ---- sleep mode ----------------------------------------------------------------------------
    async def sleep(self, level: int) -> SleepChanged:
        """Ask the engine to sleep once its running requests finish; new ones get 503."""
        self.sleep_requested = True
        answer = await self._ask(Sleep(level))
        if answer.error is not None:
            self.sleep_requested = bool(self.sleep_level)
        return answer

    async def wake_up(self) -> SleepChanged:
        answer = await self._ask(WakeUp())
        if answer.error is None:
            self.sleep_requested = False
        return answer

    async def _ask(self, command: Sleep | WakeUp) -> SleepChanged:
        if self.dead is not None:
            raise APIError(503, f"the engine is not running: {self.dead}")
        waiter = asyncio.get_running_loop().create_future()
        self._sleep_waiters.append(waiter)
        self.inbox.put(command)
        return await waiter

    # ---- LoRA adapters ------------------------------------------------------------------------------
    async def change_lora(self, command: LoadLoRA | UnloadLoRA) -> LoRAChanged:
        """Send a load or unload to the engine and wait for its answer (in order)."""
        if self.dead is not None:
            raise APIError(503, f"the engine is not running: {self.dead}")
        waiter = asyncio.get_running_loop().create_future()
        self._lora_waiters.append(waiter)
        self.inbox.put(command)
        return await waiter

    def _on_lora_changed(self, msg: LoRAChanged) -> None:
        self.lora_adapters = dict(msg.adapters)
        if self._lora_waiters:
            waiter = self._lora_waiters.pop(0)
            if not waiter.done():
                waiter.set_result(msg)

    def _on_sleep_changed(self, msg: SleepChanged) -> None:
        self.sleep_level = msg.level
        if self.metrics is not None:
            self.metrics.sleep_level.set(msg.level)
        if self._sleep_waiters:
            waiter = self._sleep_waiters.pop(0)
            if not waiter.done():
                waiter.set_result(msg)

    # ---- reports (reader thread -> loop) --------------------------------------------------------
    def _read_loop(self) -> None:
        assert self._loop is not None
        while not self._closing:
            try:
                msg = self.outbox.get(timeout=0.5)
            except queue.Empty:
                if not self.process.is_alive() and not self._closing:
                    self._post(EngineFailed(f"the engine process exited with code {self.process.exitcode}"))
                    return
                continue
            except (EOFError, OSError):
                return
            self._post(msg)
            if isinstance(msg, EngineFailed):
                return

    def _post(self, msg: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._on_message, msg, time.monotonic())
        except RuntimeError:  # loop closed during shutdown
            pass

    def _on_message(self, msg: Any, received_at: float) -> None:
        if isinstance(msg, Report):
            self._on_report(msg, received_at)
        elif isinstance(msg, SleepChanged):
            self._on_sleep_changed(msg)
        elif isinstance(msg, LoRAChanged):
            self._on_lora_changed(msg)
        elif isinstance(msg, CostsMeasured):  # the engine's start-up measurements, done after ready
            self.metrics.advisor.set_preemption_costs(msg.recompute_s_per_token, msg.swap_s_per_token,
                                                      msg.swap_fixed_s)  # fmt: skip
        elif isinstance(msg, EngineFailed):
            self._fail_all(msg.message)

    def _asleep_headers(self) -> dict[str, str]:
        """llmservice-asleep tells a router that this 503 is sleep, not overload: it wakes the
        pod and sends the request again (router/pod_wake.py)."""
        return {"Retry-After": "5", "llmservice-asleep": str(self.sleep_level or 1)}

    def _on_report(self, report: Report, now: float) -> None:
        self.stats = report.stats
        metrics = self.metrics
        metrics.on_stats(report.stats)
        for rid in report.accepted:
            stream = self.streams.get(rid)
            if stream is not None and not stream.accepted.done():
                stream.accepted.set_result(None)
        for rej in report.rejected:
            stream = self.streams.pop(rej.request_id, None)
            if stream is not None and not stream.accepted.done():
                stream.finished = True
                asleep = rej.status == 503 and (self.sleep_requested or self.sleep_level)
                stream.accepted.set_exception(
                    APIError(rej.status, rej.message, headers=self._asleep_headers() if asleep else None)
                )
        for delta in report.deltas:
            stream = self.streams.get(delta.request_id)
            if stream is None:
                continue  # aborted while the step ran
            n = len(delta.new_token_ids)
            if n:
                if stream.first_token_at is None:
                    stream.first_token_at = now
                    metrics.on_first_token(now - stream.arrival_time, stream.num_prompt_tokens)
                    metrics.on_tokens(n, None)
                else:
                    metrics.on_tokens(n, now - stream.last_token_at)
                stream.last_token_at = now
                stream.num_output_tokens += n
            if delta.first_scheduled_time is not None:
                stream.first_scheduled_time = delta.first_scheduled_time
            if delta.finished:
                stream.finished = True
                del self.streams[delta.request_id]
                self._observe_finish(stream, delta.finish_reason or "stop", now)
            stream.queue.put_nowait(delta)

    def _observe_finish(self, stream: RequestStream, reason: str, now: float) -> None:
        tpot = None
        if stream.first_token_at is not None and stream.num_output_tokens > 1:
            tpot = (now - stream.first_token_at) / (stream.num_output_tokens - 1)
        queue_s = None
        if stream.first_scheduled_time is not None:
            queue_s = stream.first_scheduled_time - stream.arrival_time
        self.metrics.on_finish(
            reason, now - stream.arrival_time, queue_s, stream.num_prompt_tokens, stream.num_output_tokens, tpot
        )

    def _fail_all(self, message: str) -> None:
        if self.dead is not None:
            return
        self.dead = message
        log.error("engine core failed: %s", message)
        err = APIError(500, f"the engine failed: {message}")
        for stream in self.streams.values():
            stream.finished = True
            if not stream.accepted.done():
                stream.accepted.set_exception(err)
            stream.queue.put_nowait(EngineDeadError(message))
        self.streams.clear()
        for waiter in self._sleep_waiters + self._lora_waiters:
            if not waiter.done():
                waiter.set_exception(APIError(503, f"the engine failed: {message}"))
        self._sleep_waiters.clear()
        self._lora_waiters.clear()
