"""The engine core: runs in its own process, owns the LLMEngine and steps it.

Keeping model steps (and the engine's incremental detokenizer) in a separate process
means the API's event loop never waits on the GIL held by the engine's Python code
(the fifth batching mistake of docs/troubleshooting.md: work on the event loop; 8 ms idle gaps -> 0.4 ms). The loop: take every queued command,
acknowledge admissions at once, run one step, report what changed, repeat; block on
the inbox only when there is nothing to run.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import sys
import time
from typing import Any

from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine.engine import LLMEngine, UnknownAdapterError
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
    Rejected,
    Report,
    Shutdown,
    Sleep,
    UnloadLoRA,
    WakeUp,
)
from llmservice.server.engine.sleep_core import SleepController
from llmservice.server.engine.warm_up import reported_costs
from llmservice.server.lora.adapter import LoRAAdapterError
from llmservice.server.model.loaded import UnsupportedModelError

log = logging.getLogger("llmservice.engine_core")

IDLE_POLL_S = 0.5  # how often an idle core checks that its parent is still alive
# The start-up measurements (warm_up.py) begin once the API listens and the engine has been
# idle this long, so the requests that come right after ready do not queue behind them.
WARM_UP_AFTER_IDLE_S = 1.0

# TEST ONLY: every step takes at least this many ms (the core sleeps out the rest). Tests
# of clocks (a request timeout that must fire mid-generation) set it, so that what they
# check does not depend on how fast the machine is. Never set it in production.
TEST_ONLY_MIN_STEP_ENV = "LLMSERVICE_TEST_ONLY_MIN_STEP_MS"


def _min_step_s() -> float:
    return float(os.environ.get(TEST_ONLY_MIN_STEP_ENV, "0")) / 1000.0


def engine_stats(engine: LLMEngine, stepped: bool) -> EngineStats:
    sched = engine.scheduler.stats
    lora_running, lora_waiting = engine.lora_request_names()
    return EngineStats(
        lora_running=tuple(lora_running),
        lora_waiting=tuple(lora_waiting),
        num_running=engine.num_running,
        num_waiting=engine.num_waiting,
        num_swapped=engine.num_swapped,
        kv_cache_usage=float(engine.block_manager.usage),
        cpu_cache_usage=engine.swap_usage,
        num_preemptions=sched.num_preemptions,
        prefix_queries=sched.prefix_queries,
        prefix_hits=sched.prefix_hits,
        prefix_host_hits=sched.prefix_host_hits,
        prefix_potential_hits=sched.prefix_potential_hits,
        detokenize_seconds=engine.detokenize_seconds,
        preempted_tokens_recompute=sched.preempted_tokens_recompute,
        preempted_tokens_swap=sched.preempted_tokens_swap,
        step_tokens=engine.last_step.num_batched_tokens if stepped else None,
        step_seconds=engine.last_step.duration_s if stepped and engine.last_step.kind else None,
        step_kind=engine.last_step.kind if stepped else "",
        step_target_seconds=engine.last_step.target_s if stepped else None,
        step_forced=stepped and engine.scheduler.budget_stats.forced,
        step_cost=engine.cost_model.coefficients.as_tuple(),
        step_decode_overruns=engine.scheduler.budget_stats.decode_overruns,
        spec_decode=engine.speculator.stats.totals() if engine.speculator else None,
    )


def lora_adapters(engine: LLMEngine) -> dict[str, str]:
    """The registered adapters, name -> path (/v1/models lists them)."""
    return {name: e.path for name, e in engine.lora.entries.items()} if engine.lora is not None else {}


class EngineCore:
    """Applies commands to the engine and turns each step into a Report."""

    def __init__(self, engine: LLMEngine, outbox: Any = None):
        self.engine = engine
        self.sleep = SleepController(engine)
        self.outbox = outbox  # sleep answers go out as soon as they are known
        self.listening = False  # the API serves (Listening): deferred measurements may start

    def apply(self, commands: list[Any]) -> tuple[Report | None, bool]:
        """Returns the admission report (None if nothing was admitted/aborted) and
        whether a Shutdown was among the commands."""
        report = Report(stats=EngineStats())
        touched = False
        for cmd in commands:
            if isinstance(cmd, Shutdown):
                return None, True
            if isinstance(cmd, Listening):
                self.listening = True
                continue
            touched = True
            if isinstance(cmd, AddRequest):
                self._add(cmd, report)
            elif isinstance(cmd, AbortRequests):
                for rid in cmd.request_ids:
                    self.engine.abort_request(rid)
            elif isinstance(cmd, (LoadLoRA, UnloadLoRA)):
                self._answer(self._lora(cmd))
            elif isinstance(cmd, (Sleep, WakeUp)):
                for answer in self.sleep.handle(cmd):
                    self._answer(answer)
        if not touched:
            return None, False
        report.stats = engine_stats(self.engine, stepped=False)
        return report, False

    def _answer(self, answer: Any) -> None:
        if answer is not None and self.outbox is not None:
            self.outbox.put(answer)

    def _lora(self, cmd: LoadLoRA | UnloadLoRA) -> LoRAChanged:
        engine = self.engine
        try:
            if isinstance(cmd, LoadLoRA):
                engine.add_lora(cmd.lora_name, cmd.lora_path)
            else:
                engine.remove_lora(cmd.lora_name)
        except LoRAAdapterError as exc:
            return LoRAChanged(lora_adapters(engine), str(exc), 400)
        except KeyError:
            return LoRAChanged(lora_adapters(engine), f"the LoRA adapter {cmd.lora_name!r} is not loaded", 404)
        return LoRAChanged(lora_adapters(engine))

    def _add(self, cmd: AddRequest, report: Report) -> None:
        if self.sleep.sleeping:  # the API answers 503 while asleep; one that raced the Sleep
            report.rejected.append(Rejected(cmd.request_id, "the engine is asleep (POST /wake_up)", 503))
            return
        try:
            self.engine.add_request(
                cmd.prompt_token_ids, cmd.params, cmd.request_id, cmd.priority, cmd.arrival_time, cmd.lora_name
            )
        except UnknownAdapterError as exc:  # unloaded between the API's check and now
            report.rejected.append(Rejected(cmd.request_id, str(exc), 404))
        except ValueError as exc:  # PromptTooLongError, bad token ids, duplicate id
            report.rejected.append(Rejected(cmd.request_id, str(exc), 400))
        except Exception as exc:  # an engine bug must not take the server down with one request
            log.exception("engine refused request %s", cmd.request_id)
            report.rejected.append(Rejected(cmd.request_id, f"engine error: {exc}", 500))
        else:
            report.accepted.append(cmd.request_id)

    @property
    def warming_up(self) -> bool:
        """Start-up measurements are left to run (warm_up.py), and the engine is awake."""
        warm_up = self.engine.warm_up
        return warm_up is not None and not warm_up.done and not self.sleep.sleeping

    def warm_up_piece(self) -> CostsMeasured | None:
        """One piece of the start-up measurements (the loop runs it while idle); after the
        last, the preemption prices for the API."""
        if not self.warming_up or not self.engine.warm_up.run_piece():
            return None
        return CostsMeasured(*reported_costs(self.engine.preemption_costs))

    def step(self) -> Report:
        deltas = self.engine.step()
        return Report(stats=engine_stats(self.engine, stepped=True), deltas=deltas)


def _drain(inbox: Any, block: bool, timeout_s: float = IDLE_POLL_S) -> list[Any]:
    commands: list[Any] = []
    if block:
        try:
            commands.append(inbox.get(timeout=timeout_s))
        except queue.Empty:
            return commands
    while True:
        try:
            commands.append(inbox.get_nowait())
        except queue.Empty:
            return commands


def _progress_bar():
    from tqdm import tqdm

    bar: dict[str, Any] = {}

    def progress(done: int, total: int) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, desc="loading weights", unit="tensor", file=sys.stderr)
        bar["bar"].update(done - bar["bar"].n)
        if done >= total:
            bar["bar"].close()

    return progress


def _die_loudly(outbox: Any, message: str) -> None:
    """A rank is gone: the API server hears why (its readiness fails, then it exits 1)."""
    log.error("%s: the engine stops", message)
    try:
        outbox.put(EngineFailed(message))
        outbox.close()
        outbox.join_thread()
    finally:
        os._exit(1)


def run_engine_core(config: EngineConfig, inbox: Any, outbox: Any, log_level: int, show_progress: bool) -> None:
    """Process entry point (spawned)."""
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        engine = LLMEngine.from_config(
            config, progress=_progress_bar() if show_progress else None, defer_warm_up=True
        )
    except (ConfigError, UnsupportedModelError) as exc:  # the model or flags: the message says it all
        outbox.put(EngineFailed(f"{type(exc).__name__}: {exc}"))
        return
    except Exception as exc:
        log.exception("engine failed to start")
        outbox.put(EngineFailed(f"{type(exc).__name__}: {exc}"))
        return
    plan = engine.memory_plan
    recompute_s, swap_s, swap_fixed_s = reported_costs(engine.preemption_costs)
    outbox.put(
        EngineReady(
            model_name=engine.model_name,
            max_model_len=engine.max_model_len,
            vocab_size=engine.model_config.vocab_size,
            block_size=config.block_size,
            num_gpu_blocks=plan.num_blocks,
            num_cpu_blocks=engine.num_cpu_blocks,
            gpu_memory_utilization=config.gpu_memory_utilization,
            memory_plan=plan.describe(),
            load_seconds=engine.load_seconds,
            scheduling_policy=config.scheduling_policy,
            recompute_s_per_token=recompute_s,
            swap_s_per_token=swap_s,
            swap_fixed_s=swap_fixed_s,
            lora_adapters=lora_adapters(engine),
            max_loras=config.max_loras if config.enable_lora else 0,
        )
    )
    watch = getattr(engine.runner, "watch", None)
    if watch is not None:  # tensor-parallel ranks: one that dies or hangs ends this process
        watch(lambda message: _die_loudly(outbox, message))
    core = EngineCore(engine, outbox)
    parent = mp.parent_process()
    min_step_s = _min_step_s()
    busy_at = time.monotonic()  # when the engine last had work (the warm-up waits for idle time)
    while True:
        idle = not engine.has_unfinished_requests()
        wait_s = IDLE_POLL_S
        if core.warming_up and core.listening:
            wait_s = max(0.0, busy_at + WARM_UP_AFTER_IDLE_S - time.monotonic())
        commands = _drain(inbox, block=idle and wait_s > 0, timeout_s=min(wait_s, IDLE_POLL_S))
        if commands or not idle:
            busy_at = time.monotonic()
        if not commands and idle and parent is not None and not parent.is_alive():
            return
        report, shutdown = core.apply(commands)
        if shutdown:
            return
        if report is not None:
            outbox.put(report)
        core._answer(core.sleep.maybe_sleep())
        if core.listening and not commands and idle and time.monotonic() - busy_at >= WARM_UP_AFTER_IDLE_S:
            core._answer(core.warm_up_piece())
        if engine.has_unfinished_requests():
            try:
                started = time.monotonic()
                stepped = core.step()
                if min_step_s:
                    time.sleep(max(0.0, min_step_s - (time.monotonic() - started)))
                outbox.put(stepped)
            except Exception as exc:
                log.exception("engine step failed")
                outbox.put(EngineFailed(f"engine step failed: {type(exc).__name__}: {exc}"))
                return
