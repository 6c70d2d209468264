"""The start-up measurements, as pieces the engine core can run after it reports ready.

The step-cost profile (step_profile.py) and the preemption prices (startup.py) are
priors: the scheduler budgets by tokens until the cost model has a prior or 12 served
steps, and `auto` preemption swaps until a recompute has a price. The first request needs
neither, yet on a CPU they took more time than reading the weights, so `serve` reports
ready without them and the engine core runs them here while it is idle: one profiled
shape (two steps) per piece, a request that arrives waits for at most one piece, and the
last piece seeds the cost model and prices preemption. `LLMEngine.from_config` without
deferral runs every piece at once, before it returns (tests, benchmarks).

The profiled steps write KV only into free blocks that hold no cached prefix (their
contents are nobody's), so pieces may run between requests; a shape that no longer finds
enough such blocks is left out, as the profile's time budget leaves shapes out.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from llmservice.server.engine import startup, step_profile
from llmservice.server.engine.cost_model import StepShape
from llmservice.server.engine.measure_key import measurement_key
from llmservice.server.engine.swap_space import PreemptionCosts

if TYPE_CHECKING:
    from llmservice.server.engine.engine import LLMEngine

log = logging.getLogger("llmservice.engine")


class WarmUp:
    """What is left of the start-up measurements of one engine, run piece by piece."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.cuda = engine.device.type == "cuda"
        config = engine.config
        self.shapes: list[list[tuple[int, int]]] = []
        self.samples: list[tuple[StepShape, float]] = []
        self.profiled = engine.scheduler.time_budget_on
        if self.profiled:
            blank = len(engine.block_manager.blank_free_blocks())
            self.shapes = step_profile.profile_shapes(config, self.cuda, blank)
            self.key = measurement_key(engine.runner.model, repr(self.shapes))
            if self.key in step_profile._MEASURED:  # this process measured it for an earlier engine
                self.samples, self.shapes = list(step_profile._MEASURED[self.key]), []
        self.complete = not self.shapes  # every shape measured (so later engines may reuse it)
        self.profile_seconds = 0.0
        self.done = False

    def run(self) -> PreemptionCosts:
        """Every piece, now."""
        while not self.run_piece():
            pass
        return self.engine.preemption_costs

    def run_piece(self) -> bool:
        """One profiled shape, or the closing piece; True once everything has run."""
        if self.done:
            return True
        if self.shapes:
            self._profile(self.shapes.pop(0))
            return False
        self._finish()
        return True

    def _profile(self, requests: list[tuple[int, int]]) -> None:
        engine = self.engine
        budget = step_profile.PROFILE_BUDGET_S["cuda" if self.cuda else "cpu"]
        if self.profile_seconds > budget:
            log.warning("step profile: over its %.0f s budget after %d shapes; the rest are left out",
                        budget, len(self.samples))  # fmt: skip
            self.shapes, self.complete = [], False
            return
        blocks = engine.block_manager.blank_free_blocks(step_profile.blocks_needed(requests, engine.config.block_size))
        if len(blocks) < step_profile.blocks_needed(requests, engine.config.block_size):
            log.info("step profile: too few free blocks without cached prefixes for %s; left out", requests)
            self.complete = False
            return
        t0 = time.perf_counter()
        self.samples += step_profile._measure(engine.runner, engine.config, [requests], self.cuda, block_ids=blocks)
        self.profile_seconds += time.perf_counter() - t0

    def _finish(self) -> None:
        engine = self.engine
        if self.profiled:
            if self.complete:
                step_profile._MEASURED.setdefault(self.key, list(self.samples))
            engine.seed_cost_model(self.samples, self.profile_seconds)
        # in every mode: auto chooses by them, and the advisor prices preemptions with them
        device_blocks = engine.block_manager.blank_free_blocks()
        engine.scheduler.costs = startup.measure_preemption_costs(
            engine.config,
            engine.model,
            engine.runner.kv_caches,
            engine.swap_pools,
            len(device_blocks),
            engine.swap_space.num_free,
            engine.memory_plan.kv_bytes_per_token,
            prefill=startup.profiled_prefills(self.samples) if self.profiled else None,
            device_blocks=device_blocks,
            swap_blocks=engine.swap_space.free_ids[::-1],
        )
        self.done = True


def reported_costs(costs: PreemptionCosts) -> tuple[float | None, float | None, float | None]:
    """(recompute s/token, swap s/token, swap fixed s), None where not measured: what the
    API's advisor exports."""
    return (
        costs.recompute_s_per_token if costs.measured else None,
        costs.swap_s_per_token if costs.swap_measured else None,
        costs.swap_fixed_s if costs.swap_measured else None,
    )
