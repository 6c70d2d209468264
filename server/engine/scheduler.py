"""Iteration-level scheduler (vLLM V1 rule). Decides, each step, how many tokens each
request computes; never touches tensors.

The decision goes out as plain data (`step.SchedulerOutput`): the runner never sees a
`Request`. `update` takes any number of new tokens per request (speculative decoding
verifies several at once) and rolls back the KV of rejected draft tokens.

Order: running requests first (decodes and unfinished chunked prefills), then waiting
ones, within `max_num_batched_tokens` and `max_num_seqs`. When KV blocks run out a
victim chosen by the policy is preempted (recompute: its blocks are freed and it is
re-prefilled later; prefix caching usually makes that cheap), so the engine never
deadlocks under memory pressure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmservice.server.config import EngineConfig
from llmservice.server.engine import policy
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.prefix_sketch import PrefixSketch
from llmservice.server.engine.request import Request, RequestStatus
from llmservice.server.engine.step import ScheduledRequest, SchedulerOutput
from llmservice.server.engine.swap_space import PreemptionCosts, SwapSpace


@dataclass
class _StepPlan:
    """The step being decided: what is left of the token budget, and who gets what."""

    budget: int
    scheduled: dict[str, int] = field(default_factory=dict)  # request id -> tokens this step
    table_starts: dict[str, int] = field(default_factory=dict)  # block table length before this step
    preempted: list[Request] = field(default_factory=list)

    def add(self, req: Request, num_tokens: int, table_start: int) -> None:
        self.scheduled[req.request_id] = num_tokens
        self.table_starts[req.request_id] = table_start
        self.budget -= num_tokens

    def drop(self, victim: Request) -> None:
        self.preempted.append(victim)
        self.budget += self.scheduled.pop(victim.request_id, 0)
        self.table_starts.pop(victim.request_id, None)


@dataclass
class SchedulerStats:
    num_preemptions: int = 0
    num_swap_outs: int = 0
    num_swap_ins: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of which found
    prefix_potential_hits: int = 0  # prompt tokens a prefix cache would have served (on or off)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        swap_space: SwapSpace | None = None,
        costs: PreemptionCosts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.clock = clock
        self.bm = block_manager
        self.swap_space = swap_space or SwapSpace(0)
        self.costs = costs or PreemptionCosts()
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.stats = SchedulerStats()
        self.prefix_sketch = PrefixSketch()
        self.max_model_len = int(config.max_model_len or 0)
        self._runner_known: set[str] = set()  # requests whose sampling params the runner holds
        self._finished_since_step: list[str] = []

    # ---- queue management ------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Finish a request in any state and release everything it holds."""
        if request.is_finished:
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        elif request in self.swapped:
            self.swapped.remove(request)
            self.swap_space.free(request.swap_blocks)
            request.swap_blocks = []
        self.bm.free(request)
        request.status = status
        request.finish_time = self.clock()
        self.requests.pop(request.request_id, None)
        if request.request_id in self._runner_known:
            self._runner_known.discard(request.request_id)
            self._finished_since_step.append(request.request_id)

    def abort(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is not None:
            self.finish(request, RequestStatus.FINISHED_ABORTED)
        return request

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        self.running.remove(victim)
        victim.num_preemptions += 1
        self.stats.num_preemptions += 1
        n_blocks = self.bm.blocks_needed(victim.num_computed_tokens)
        mode = policy.choose_preemption(
            self.config.preemption_mode,
            victim.num_computed_tokens,
            self.costs,
            n_blocks,
            self.swap_space.num_free,
        )
        if mode == "swap":
            cpu_blocks = self.swap_space.allocate(n_blocks)
            out.swap_out.extend(zip(self.bm.block_ids(victim.request_id)[:n_blocks], cpu_blocks, strict=True))
            victim.swap_blocks = cpu_blocks
            victim.status = RequestStatus.SWAPPED
            self.stats.num_swap_outs += 1
            self.bm.free(victim)
            self.swapped.append(victim)
            return
        self.bm.free(victim)
        victim.status = RequestStatus.WAITING
        victim.num_computed_tokens = 0
        self.waiting.append(victim)

    def _swap_in(self, req: Request, num_new: int, out: SchedulerOutput) -> bool:
        """Bring a swapped request back: fresh device blocks, copy its KV in, keep its progress."""
        if not self.bm.allocate_slots(req, num_new):
            return False
        device_blocks = self.bm.block_ids(req.request_id)[: len(req.swap_blocks)]
        out.swap_in.extend(zip(req.swap_blocks, device_blocks, strict=True))
        self.swap_space.free(req.swap_blocks)
        req.swap_blocks = []
        self.swapped.remove(req)
        self.stats.num_swap_ins += 1
        return True

    # ---- the step decision -----------------------------------------------------------
    def _num_to_schedule(self, req: Request, budget: int) -> int:
        """Tokens to compute for a running request: the rest of its prompt or its last
        token, plus its draft tokens when it decodes, within the budget and max_model_len."""
        num_new = req.num_tokens - req.num_computed_tokens
        if num_new == 1 and req.spec_token_ids:
            num_new += len(req.spec_token_ids)
        return min(num_new, budget, self.max_model_len - req.num_computed_tokens)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        plan = _StepPlan(budget=int(self.config.max_num_batched_tokens))
        self._schedule_running(plan, out)
        now = self.clock()
        if not plan.preempted:
            # Swapped requests resume before new ones are admitted (their KV is already paid for).
            self._resume_swapped(plan, out, now)
            if not self.swapped:
                self._admit_waiting(plan, now)
        out.preempted_request_ids = [r.request_id for r in plan.preempted]
        by_id = {r.request_id: r for r in self.running}
        out.scheduled = [
            self._describe(by_id[rid], n, plan.table_starts[rid], out) for rid, n in plan.scheduled.items()
        ]
        out.finished_request_ids, self._finished_since_step = self._finished_since_step, []
        return out

    def _schedule_running(self, plan: _StepPlan, out: SchedulerOutput) -> None:
        """Running requests first, in order; when blocks run out, preempt the policy's
        victim (possibly the request itself) and retry."""
        i = 0
        while i < len(self.running) and plan.budget > 0:
            req = self.running[i]
            num_new = self._num_to_schedule(req, plan.budget)
            if num_new <= 0:
                i += 1
                continue
            while True:
                held = len(self.bm.block_ids(req.request_id))
                if self.bm.allocate_slots(req, num_new):
                    plan.add(req, num_new, held)
                    i += 1
                    break
                victim = policy.pick_victim(self.running, self.config.scheduling_policy)
                victim_index = self.running.index(victim)
                self._preempt(victim, out)
                plan.drop(victim)
                if victim is req:
                    break
                if victim_index < i:
                    i -= 1

    def _resume_swapped(self, plan: _StepPlan, out: SchedulerOutput, now: float) -> None:
        cfg = self.config
        while self.swapped and plan.budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = policy.next_to_admit(
                self.swapped, now, cfg.scheduling_policy, cfg.priority_aging_per_s, cfg.max_queue_delay_ms
            )
            num_new = min(req.num_tokens - req.num_computed_tokens, plan.budget)
            if not self._swap_in(req, num_new, out):
                break
            self.running.append(req)
            req.status = RequestStatus.RUNNING
            plan.add(req, num_new, 0)

    def _admit_waiting(self, plan: _StepPlan, now: float) -> None:
        """New (and recomputing) requests in policy order, after their prefix-cache hits."""
        cfg = self.config
        while self.waiting and plan.budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = policy.next_to_admit(
                self.waiting, now, cfg.scheduling_policy, cfg.priority_aging_per_s, cfg.max_queue_delay_ms
            )
            hits, num_cached = self.bm.get_computed_blocks(req)
            num_new = req.num_tokens - num_cached
            if num_new > plan.budget:
                if not cfg.enable_chunked_prefill:
                    break
                num_new = plan.budget
            if not self.bm.allocate_slots(req, num_new, hits):
                break
            self.waiting.remove(req)
            self.running.append(req)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_cached
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_cached
                req.first_scheduled_time = now
                self._count_potential_hits(req)
            if self.bm.enable_prefix_caching:
                self.stats.prefix_queries += req.num_tokens
                self.stats.prefix_hits += num_cached
            plan.add(req, num_new, 0)

    def _count_potential_hits(self, req: Request) -> None:
        """First admission only: a recomputed request's prompt is not a new prompt."""
        max_blocks = (req.num_tokens - 1) // self.bm.block_size
        hit_blocks = self.prefix_sketch.observe(self.bm.prompt_block_hashes(req), max_blocks)
        self.stats.prefix_potential_hits += hit_blocks * self.bm.block_size

    def _describe(self, req: Request, num_new: int, table_start: int, out: SchedulerOutput) -> ScheduledRequest:
        """The plain-data view of one scheduled request (and its sampling params, once)."""
        rid = req.request_id
        if rid not in self._runner_known:
            self._runner_known.add(rid)
            out.new_requests[rid] = req.sampling_params
        start = req.num_computed_tokens
        end = start + num_new
        known = req.num_tokens
        out.num_prompt_tokens += max(0, min(req.num_prompt_tokens, end) - start)
        return ScheduledRequest(
            request_id=rid,
            token_ids=req.all_token_ids[start : min(end, known)],
            start_position=start,
            block_table_start=table_start,
            new_block_ids=self.bm.block_ids(rid)[table_start:],
            sample=end >= known,
            output_index=req.num_output_tokens,
            spec_token_ids=req.spec_token_ids[: max(0, end - known)],
        )

    def update(self, out: SchedulerOutput, sampled: dict[str, list[int]]) -> list[tuple[Request, list[int]]]:
        """Advance computed tokens, append the sampled tokens, finish what stopped.

        `sampled` holds, per request, the tokens its step produced: one per step without
        speculation; with draft tokens, the accepted drafts then the target's own next
        token. The KV of rejected drafts is rolled back. Tokens after one that stops the
        request are dropped. Returns each request that got tokens, with those it kept."""
        now = self.clock()
        touched: list[tuple[Request, list[int]]] = []
        for step in out.scheduled:
            req = self.requests.get(step.request_id)
            if req is None or req.is_finished:
                continue
            req.num_computed_tokens += step.num_tokens
            tokens = sampled.get(step.request_id, [])
            if step.spec_token_ids:
                rejected = len(step.spec_token_ids) - max(len(tokens) - 1, 0)
                if rejected > 0:
                    req.num_computed_tokens -= rejected
                    self.bm.truncate(req)
            req.spec_token_ids = []
            kept: list[int] = []
            status = None
            for token in tokens:
                req.append_output(token)
                kept.append(token)
                status = req.check_stop(self.max_model_len)
                if status is not None:
                    break
            if kept:
                if req.first_token_time is None:
                    req.first_token_time = now
                req.last_token_time = now
                touched.append((req, kept))
            self.bm.cache_blocks(req)
            if status is not None:
                self.finish(req, status)
        return touched
