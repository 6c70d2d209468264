"""The engine's runner when `--tensor-parallel-size N > 1`: N rank processes in this pod.

The scheduler and the engine core stay in this process. `execute(step)` pickles the
plain-data `SchedulerOutput` once, writes it to every rank's pipe, and waits for rank 0's
sampled tokens, timing the message passing apart from the compute (`ipc`). A rank that
exits or stops stamping its heartbeat is named in a `TPWorkerError` within seconds;
`watch()` checks the same while the engine is idle, so a failure never leaves a hung pod.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.util as mp_util
import os
import pickle
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait

from llmservice.server.config import EngineConfig
from llmservice.server.engine import startup
from llmservice.server.engine.runner import StepResult
from llmservice.server.engine.step import SchedulerOutput
from llmservice.server.engine.tp_worker import (
    SHUTDOWN,
    RankFailed,
    RankReady,
    StepReply,
    run_worker,
)
from llmservice.server.model.loader import read_model_info

log = logging.getLogger("llmservice.tp")

HANG_S = 5.0  # a rank whose heartbeat is older than this is hung
POLL_S = 0.25


class TPWorkerError(RuntimeError):
    """A tensor-parallel rank died, hung or failed; the message names it."""


@dataclass
class IPCStats:
    """Per-step message passing: pickling, pipes and unpickling on both sides, i.e. the
    step's round trip minus rank 0's own time between receiving and replying."""

    steps: int = 0
    seconds: float = 0.0
    payload_bytes: int = 0

    @property
    def mean_us(self) -> float:
        return 1e6 * self.seconds / max(self.steps, 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe_exit(rank: int, pid: int | None, code: int) -> str:
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return f"tensor-parallel rank {rank} (pid {pid}) {how}"


def find_failure(
    exitcodes: list[int | None], pids: list[int | None], beats: list[float], now: float
) -> str | None:
    """Pure: which rank is dead or hung. Killed ranks first (the others of a group may
    exit after them, when a collective loses its peer); beats of 0 are ranks still starting."""
    dead = [(r, c) for r, c in enumerate(exitcodes) if c is not None]
    if dead:
        dead.sort(key=lambda rc: (rc[1] >= 0, rc[0]))
        return "; ".join(describe_exit(r, pids[r], c) for r, c in dead)
    for rank, beat in enumerate(beats):
        if beat and now - beat > HANG_S:
            return f"tensor-parallel rank {rank} (pid {pids[rank]}) is hung: no heartbeat for {now - beat:.1f} s"
    return None


class TPExecutor:
    def __init__(self, config: EngineConfig, log_level: int | None = None):
        self.size = size = config.tensor_parallel_size
        _, self.config, self.tokenizer_source = read_model_info(config.model)
        self.device = startup.resolve_device(config.device)
        self.dtype = startup.resolve_dtype(config.dtype, self.device)
        ctx = mp.get_context("spawn")
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = int(os.environ.get("MASTER_PORT") or free_port())
        self.beats = ctx.Array("d", size, lock=False)
        self.conns, self.procs = [], []
        level = log_level if log_level is not None else logging.getLogger().getEffectiveLevel()
        # The API server's engine core is a daemonic process, which multiprocessing forbids
        # to start children; this one ends its ranks itself (close, kill, the finalizer
        # below, and a rank reads EOF when the engine is gone), so lift the flag meanwhile.
        me = mp.current_process()
        daemonic = me._config.get("daemon", False)
        me._config["daemon"] = False
        try:
            for rank in range(size):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(
                    target=run_worker,
                    args=(rank, size, config, f"tcp://{addr}:{port}", theirs, self.beats, level),
                    name=f"llmservice-tp-rank-{rank}",
                    daemon=False,  # a daemonic engine core could not start daemons either
                )
                proc.start()
                theirs.close()
                self.conns.append(ours)
                self.procs.append(proc)
        finally:
            me._config["daemon"] = daemonic
        self.ipc = IPCStats()
        self._closed = False
        # run by multiprocessing's exit hook before it joins children, also in a spawned
        # engine core (which ends with os._exit: atexit handlers never run there)
        mp_util.Finalize(self, self.close, exitpriority=10)
        self.failure: str | None = None
        try:
            self.ready = [self._receive(rank, self.conns[rank].recv) for rank in range(size)]
        except BaseException:
            self._closed = True
            self.kill()
            raise
        first: RankReady = self.ready[0]
        self.plan = first.plan
        self.num_swap_blocks = first.num_swap_blocks
        self.costs = first.costs
        self.load_seconds = max(r.load_seconds for r in self.ready)
        log.info("%d tensor-parallel ranks ready (%s backend), %d KV blocks each",
                 size, "nccl" if self.device.type == "cuda" else "gloo", self.plan.num_blocks)  # fmt: skip

    @property
    def model(self) -> TPExecutor:
        """This process holds no model: the executor stands in for it (its `config`,
        `device` and `dtype`), as it does for LLMEngine's `model` at TP > 1."""
        return self

    # ---- health -------------------------------------------------------------------------
    def check(self) -> str | None:
        if self.failure is None:
            self.failure = find_failure(
                [p.exitcode for p in self.procs],
                [p.pid for p in self.procs],
                list(self.beats),
                time.monotonic(),
            )
        return self.failure

    def _receive(self, rank: int, read: Callable[[], object]) -> object:
        """Wait for `rank`'s next message while watching every rank."""
        while True:
            ready = wait([self.conns[rank], *(p.sentinel for p in self.procs)], timeout=POLL_S)
            if self.conns[rank] in ready:
                try:
                    msg = read()
                except (EOFError, OSError):
                    msg = None
                if isinstance(msg, RankFailed):
                    self.failure = f"tensor-parallel rank {msg.rank} failed: {msg.message}"
                    self.kill()
                    raise TPWorkerError(self.failure)
                if msg is not None:
                    return msg
            failure = self.check()
            if failure is None and ready:
                failure = self._report_from_others(rank)
            if failure is not None:
                self.kill()  # the others may be stuck in a collective with the failed rank
                raise TPWorkerError(failure)

    def _report_from_others(self, rank: int) -> str | None:
        for other, conn in enumerate(self.conns):
            if other != rank and conn.poll():
                try:
                    msg = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    continue
                if isinstance(msg, RankFailed):
                    self.failure = f"tensor-parallel rank {msg.rank} failed: {msg.message}"
                    return self.failure
        return None

    def watch(self, on_failure: Callable[[str], None]) -> None:
        """Check the ranks every POLL_S from a thread, also between steps."""

        def loop() -> None:
            while not self._closed:
                failure = self.check()
                if failure is not None:
                    self.kill()
                    on_failure(failure)
                    return
                time.sleep(POLL_S)

        threading.Thread(target=loop, name="tp-watchdog", daemon=True).start()

    # ---- steps ----------------------------------------------------------------------------
    def execute(self, sched: SchedulerOutput) -> StepResult:
        t0 = time.monotonic()
        payload = pickle.dumps(sched, pickle.HIGHEST_PROTOCOL)
        try:
            for conn in self.conns:
                conn.send_bytes(payload)
        except (BrokenPipeError, OSError):
            raise TPWorkerError(self.check() or "a tensor-parallel rank closed its pipe") from None
        reply: StepReply = self._receive(0, lambda: pickle.loads(self.conns[0].recv_bytes()))
        back = time.monotonic()
        self.ipc.steps += 1
        self.ipc.seconds += (back - t0) - (reply.done_at - reply.received_at)
        self.ipc.payload_bytes += len(payload)
        return reply.result

    def kill(self) -> None:
        """End every rank now (a failure: nothing is left waiting in a collective)."""
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()

    def close(self, timeout_s: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        if self.check() is not None:  # no goodbye to a group that lost a rank
            self.kill()
            return
        for conn in self.conns:
            try:
                conn.send_bytes(SHUTDOWN)
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self._closed = True
            self.kill()


def build_tp_engine(engine_cls: type, config: EngineConfig, executor: TPExecutor | None = None):
    """`LLMEngine.from_config` for N ranks: the ranks load and plan; this process keeps
    the scheduler, the tokenizer and the engine loop. Engines with other scheduling
    settings may share one `executor` (tests: the ranks start once)."""
    from llmservice.server.config import ConfigError
    from llmservice.server.tokenizer import TextTokenizer

    shared = executor is not None
    executor = executor or TPExecutor(config)
    try:
        config = config.resolve_lengths(executor.config.max_position_embeddings)
        max_model_len = int(config.max_model_len)
        plan = executor.plan
        if plan.num_blocks * config.block_size < max_model_len:
            raise ConfigError(
                f"the KV cache holds {plan.num_blocks * config.block_size} tokens per rank, fewer "
                f"than --max-model-len {max_model_len}; raise the KV memory or lower max-model-len"
            )
        tokenizer = TextTokenizer(executor.tokenizer_source, executor.config.eos_token_ids)
        engine = engine_cls(
            config, executor, tokenizer, plan, executor.load_seconds, runner=executor
        )
        if engine.scheduler.time_budget_on:  # the profile's steps run on the ranks
            engine.seed_cost_model()
    except BaseException:
        if not shared:
            executor.close()
        raise
    if executor.costs is not None:
        engine.scheduler.costs = executor.costs
    return engine
