"""Overlapped scheduling (SGLang's overlap scheduler, vLLM's async scheduling): the engine
plans and prepares step N+1 while step N runs, and reads step N's tokens only after
N+1 is on its way.

How the steps stay exact:
- The scheduler plans N+1 as if N's tokens were computed and each request N samples for
  had its token (`Scheduler.launched`); that token is `step.PLACEHOLDER_TOKEN` in N+1's
  plain data, and the runner fills it from N's sampled tokens where they are (on the
  device on CUDA: no host round trip before N+1's inputs need them).
- When N's tokens arrive, stop rules run exactly as without overlap. A request that
  stopped at N may already be in N+1: its N+1 token is discarded (`Scheduler.update`
  skips finished requests), and its blocks were freed at N, which is safe because any
  later step that reuses them runs after N+1 (one CUDA stream; one worker thread on CPU).
  A request whose N token certainly ends it by length is not planned into N+1 at all.

Steps that wait for N before launching (`sync_reason`): ones that copy blocks to or
from the swap space (a swap-out must read KV that N is still writing; a swap-in may
write blocks N still writes), and ones where a structured-output request samples (its
grammar bitmask needs N's token on the host). Speculative decoding turns overlap off
(drafts are proposed from the host tokens of the step before). Recompute preemption
needs no wait. Rows that sample with temperature > 0 or want logprobs are sampled on
the host (sampler.py), which synchronises inside that step's launch: the overlap of
such a step is lost, the result is the same.

Launchers: on CUDA the step is launched inline (kernel launches are asynchronous, so the
host goes on while the GPU runs); on CPU a single worker thread runs the model (torch
releases the GIL inside its ops) while the engine thread schedules and detokenizes.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from llmservice.server.engine.step import SchedulerOutput


class PendingStep(Protocol):
    """A launched step; `result()` waits for its tokens on the host."""

    def result(self): ...


def sync_reason(out: SchedulerOutput, constrained: Container[str]) -> str | None:
    """Why this step must wait for the step in flight before it launches (None: it need
    not). `constrained`: the ids of requests with a structured-output grammar."""
    if out.swap_out or out.swap_in:
        return "swap"
    if any(s.sample and s.request_id in constrained for s in out.scheduled):
        return "grammar"
    return None


def resolve_async_scheduling(flag: bool | None, device_type: str, speculative: bool, tensor_parallel: int) -> bool:
    """--async-scheduling: on by default on CUDA; off on CPU by default (measured: on two
    shared cores the worker thread's Python competes with the scheduler's for the GIL,
    docs/engine.md); never with speculative decoding or tensor parallelism."""
    if speculative or tensor_parallel > 1:
        if flag:
            raise ValueError("--async-scheduling does not run with --speculative-config or --tensor-parallel-size > 1")
        return False
    return device_type == "cuda" if flag is None else flag


class _Done:
    """An already-finished step (the inline launcher)."""

    def __init__(self, pending: PendingStep):
        self._pending = pending

    def result(self):
        return self._pending.result()


class _Threaded:
    """A step running on the worker thread."""

    def __init__(self, future: Future):
        self._future = future

    def result(self):
        return self._future.result().result()


class InlineLauncher:
    """Launch on the calling thread (CUDA: the launches are asynchronous)."""

    def submit(self, launch: Callable[[SchedulerOutput], PendingStep], out: SchedulerOutput) -> PendingStep:
        return _Done(launch(out))

    def close(self) -> None:
        pass


class ThreadLauncher:
    """Launch on one worker thread (CPU): steps run in submission order."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmservice-step")

    def submit(self, launch: Callable[[SchedulerOutput], PendingStep], out: SchedulerOutput) -> PendingStep:
        return _Threaded(self._pool.submit(launch, out))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
