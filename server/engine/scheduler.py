"""Iteration-level scheduler (vLLM V1 rule). Decides, each step, how many tokens each
request computes; never touches tensors.

The decision goes out as plain data (`step.SchedulerOutput`): the runner never sees a
`Request`. `update` takes any number of new tokens per request (speculative decoding
verifies several at once) and rolls back the KV of rejected draft tokens.

Order: running requests first (decodes and unfinished chunked prefills), then waiting
ones, within `max_num_batched_tokens` and `max_num_seqs`. With the step-time budget on
(chunked prefill and `--max-step-ms` unset or > 0; step_budget.py has the rules)
decodes go first and the prefill chunks are sized by the fitted step cost model. When KV blocks run out a
victim chosen by the policy is preempted (recompute: its blocks are freed and it is
re-prefilled later; prefix caching usually makes that cheap), so the engine never
deadlocks under memory pressure.

Overlapped scheduling (overlap.py): `launched` is called once a step is on its way, so
the next `schedule` plans as if that step's tokens were computed and each request it
samples for had one more token, a placeholder (`step.PLACEHOLDER_TOKEN`) until
`update(..., launched=True)` brings the real one. Without overlap nothing is pending
and every rule is as before.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmservice.server.config import EngineConfig
from llmservice.server.engine import policy, step_budget
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.cost_model import (
    MARGIN_QUANTILE,
    SLO_MARGIN_QUANTILE,
    StepCostModel,
    StepShape,
)
from llmservice.server.engine.prefix_sketch import PrefixSketch
from llmservice.server.engine.request import Request, RequestStatus
from llmservice.server.engine.step import PLACEHOLDER_TOKEN, ScheduledRequest, SchedulerOutput
from llmservice.server.engine.swap_space import PreemptionCosts, SwapSpace
from llmservice.server.lora.slots import AdapterSlots

log = logging.getLogger("llmservice.scheduler")
OVERRUN_LOG_INTERVAL_S = 30.0


@dataclass
class _StepPlan:
    """The step being decided: what is left of the token budget, and who gets what."""

    budget: int
    scheduled: dict[str, int] = field(default_factory=dict)  # request id -> tokens this step
    table_starts: dict[str, int] = field(
        default_factory=dict
    )  # block table length before this step
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
    prefix_hits: int = 0  # of which found in the device pool
    prefix_host_hits: int = 0  # of which brought back from the host tier (--kv-offloading-size)
    prefix_potential_hits: int = 0  # prompt tokens a prefix cache would have served (on or off)
    # computed tokens the preempted requests held: what recompute re-prefills, what swap copies
    preempted_tokens_recompute: int = 0
    preempted_tokens_swap: int = 0


class Scheduler:
    admission_gate: Callable[[Request], bool] | None = None  # set by the engine (grammar compiled?)
    # --enable-lora: a request runs only while its adapter holds a device slot (lora/slots.py)
    lora_slots: AdapterSlots | None = None

    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        swap_space: SwapSpace | None = None,
        costs: PreemptionCosts | None = None,
        clock: Callable[[], float] = time.monotonic,
        cost_model: StepCostModel | None = None,
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
        self.cost_model = cost_model or StepCostModel()
        self.budget_stats = step_budget.BudgetStats()
        self._overrun_logged_at: float | None = None
        self._overruns_at_log = 0
        # overlapped scheduling: tokens sampled by a launched step, not yet on the host
        self._pending: dict[str, int] = {}

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
        self._release_adapter(request)
        self._pending.pop(request.request_id, None)
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
        if self.bm.host_tier is not None and n_blocks > self.swap_space.num_free:
            self.bm.host_tier.reclaim(n_blocks - self.swap_space.num_free)  # preemption comes first
        mode = policy.choose_preemption(
            self.config.preemption_mode,
            victim.num_computed_tokens,
            self.costs,
            n_blocks,
            self.swap_space.num_free,
        )
        if mode == "swap":
            self.stats.preempted_tokens_swap += victim.num_computed_tokens
            cpu_blocks = self.swap_space.allocate(n_blocks)
            out.swap_out.extend(
                zip(self.bm.block_ids(victim.request_id)[:n_blocks], cpu_blocks, strict=True)
            )
            victim.swap_blocks = cpu_blocks
            victim.status = RequestStatus.SWAPPED
            self.stats.num_swap_outs += 1
            self.bm.free(victim)
            self.swapped.append(victim)
            return
        self.stats.preempted_tokens_recompute += victim.num_computed_tokens
        self.bm.free(victim)
        self._release_adapter(victim)  # a recomputed request asks for a slot again
        victim.status = RequestStatus.WAITING
        victim.num_computed_tokens = 0
        self.waiting.append(victim)

    def _swap_in(self, req: Request, num_new: int, out: SchedulerOutput) -> bool:
        """Bring a swapped request back: fresh device blocks, copy its KV in, keep its progress."""
        if not self.bm.allocate_slots(req, num_new):
            return False
        device_blocks = self.bm.block_ids(req.request_id)[: len(req.swap_blocks)]
        out.swap_in.extend(zip(req.swap_blocks, device_blocks, strict=True))
        if self.bm.host_tier is not None:
            self.bm.host_tier.pin(req.swap_blocks)  # read by this step's swap-in
        self.swap_space.free(req.swap_blocks)
        req.swap_blocks = []
        self.swapped.remove(req)
        self.stats.num_swap_ins += 1
        return True

    # ---- overlapped scheduling -----------------------------------------------------------
    def _known(self, req: Request) -> int:
        """Its tokens, counting those a launched step is sampling (placeholders)."""
        return req.num_tokens + self._pending.get(req.request_id, 0)

    def _ends_by_length(self, req: Request) -> bool:
        """Its pending token certainly ends it (max_tokens or max_model_len): planning it
        into the next step would only compute a token to discard."""
        pending = self._pending.get(req.request_id, 0)
        return pending > 0 and (
            req.num_output_tokens + pending >= req.max_tokens or req.num_tokens + pending >= self.max_model_len
        )

    def launched(self, out: SchedulerOutput) -> None:
        """The step is on its way (overlap): its tokens count as computed, and each request
        it samples for has a pending token until `update(out, ..., launched=True)`."""
        for step in out.scheduled:
            req = self.requests.get(step.request_id)
            if req is None or req.is_finished:
                continue
            req.num_computed_tokens += step.num_tokens
            if step.sample:
                self._pending[step.request_id] = self._pending.get(step.request_id, 0) + 1

    # ---- the step decision -----------------------------------------------------------
    def _num_to_schedule(self, req: Request, budget: int) -> int:
        """Tokens to compute for a running request: the rest of its prompt or its last
        token, plus its draft tokens when it decodes, within the budget and max_model_len."""
        num_new = self._known(req) - req.num_computed_tokens
        if num_new == 1 and req.spec_token_ids:
            num_new += len(req.spec_token_ids)
        return min(num_new, budget, self.max_model_len - req.num_computed_tokens)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        plan = _StepPlan(budget=int(self.config.max_num_batched_tokens))
        if self.time_budget_on:
            self._plan_within_time(plan, out)
        else:
            self._schedule_running(plan, out)
            now = self.clock()
            if not plan.preempted:
                # Swapped requests resume before new ones are admitted (their KV is already paid for).
                self._resume_swapped(plan, out, now)
                if not self.swapped:
                    self._admit_waiting(plan, now)
        out.preempted_request_ids = [r.request_id for r in plan.preempted]
        offloads, restores = self.bm.take_copies()  # the host tier's, after the preemption swaps
        out.swap_out.extend(offloads)
        out.swap_in.extend(restores)
        by_id = {r.request_id: r for r in self.running}
        out.scheduled = [
            self._describe(by_id[rid], n, plan.table_starts[rid], out)
            for rid, n in plan.scheduled.items()
        ]
        out.finished_request_ids, self._finished_since_step = self._finished_since_step, []
        return out

    def _schedule_running(
        self,
        plan: _StepPlan,
        out: SchedulerOutput,
        order: list[Request] | None = None,
        allotted: dict[str, int] | None = None,
    ) -> None:
        """Running requests (all of them in order, or `order`, each within its `allotted`
        tokens) first; when blocks run out, preempt the policy's victim (possibly the
        request itself) and retry."""
        for req in list(self.running if order is None else order):
            if plan.budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING or req.request_id in plan.scheduled:
                continue  # preempted by an earlier request of this step
            if self._ends_by_length(req):
                continue
            num_new = self._num_to_schedule(req, plan.budget)
            if allotted is not None:
                num_new = min(num_new, allotted.get(req.request_id, 0))
            if num_new <= 0:
                continue
            while True:
                held = len(self.bm.block_ids(req.request_id))
                if self.bm.allocate_slots(req, num_new):
                    plan.add(req, num_new, held)
                    break
                if req.spec_token_ids:  # speculation shrinks before anything is preempted (spec)
                    num_new = min(num_new, req.num_tokens - req.num_computed_tokens)
                    req.spec_token_ids = []
                    continue
                victim = policy.pick_victim(self.running, self.config.scheduling_policy)
                self._preempt(victim, out)
                plan.drop(victim)
                if victim is req:
                    break

    def _resume_swapped(self, plan: _StepPlan, out: SchedulerOutput, now: float) -> None:
        cfg = self.config
        while self.swapped and plan.budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = policy.next_to_admit(
                self.swapped,
                now,
                cfg.scheduling_policy,
                cfg.priority_aging_per_s,
                cfg.max_queue_delay_ms,
            )
            num_new = min(self._known(req) - req.num_computed_tokens, plan.budget)
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
                (r for r in self.waiting if self._can_admit(r)),
                now,
                cfg.scheduling_policy,
                cfg.priority_aging_per_s,
                cfg.max_queue_delay_ms,
            )
            if req is None:
                break
            self.bm.restore_from_host(req)
            hits, num_cached = self.bm.get_computed_blocks(req)
            num_new = self._known(req) - num_cached
            if num_new > plan.budget:
                if not cfg.enable_chunked_prefill:
                    break
                num_new = plan.budget
            if not self._admit(req, num_new, hits, num_cached, plan, now):
                break

    def _can_admit(self, req: Request) -> bool:
        """Whether a waiting request may start now; both admission paths ask (a request
        that cannot start yet waits without holding up the others)."""
        # structured outputs: the engine's gate is False while the request's grammar compiles
        return self.admission_gate is None or self.admission_gate(req)

    def _admit(
        self,
        req: Request,
        num_new: int,
        hits: list[int],
        num_cached: int,
        plan: _StepPlan,
        now: float,
    ) -> bool:
        """Move a waiting request to running with `num_new` tokens this step (False, with
        nothing changed, when its KV blocks do not fit)."""
        if not self._acquire_adapter(req):
            return False
        if not self.bm.allocate_slots(req, num_new, hits):
            self._release_adapter(req)
            return False
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
            from_host = min(self.bm.restored_tokens.pop(req.request_id, 0), num_cached)
            self.stats.prefix_hits += num_cached - from_host  # the device tier's
            self.stats.prefix_host_hits += from_host
        plan.add(req, num_new, 0)
        return True

    def _acquire_adapter(self, req: Request) -> bool:
        """Pin a device slot for the request's adapter (True for the base model)."""
        return req.lora_name is None or self.lora_slots is None or self.lora_slots.acquire(req.request_id, req.lora_name)

    def _release_adapter(self, req: Request) -> None:
        if req.lora_name is not None and self.lora_slots is not None:
            self.lora_slots.release(req.request_id)

    def _count_potential_hits(self, req: Request) -> None:
        """First admission only: a recomputed request's prompt is not a new prompt."""
        max_blocks = (req.num_tokens - 1) // self.bm.block_size
        hit_blocks = self.prefix_sketch.observe(self.bm.prompt_block_hashes(req), max_blocks)
        self.stats.prefix_potential_hits += hit_blocks * self.bm.block_size

    def _describe(
        self, req: Request, num_new: int, table_start: int, out: SchedulerOutput
    ) -> ScheduledRequest:
        """The plain-data view of one scheduled request (and its sampling params, once)."""
        rid = req.request_id
        if rid not in self._runner_known:
            self._runner_known.add(rid)
            out.new_requests[rid] = req.sampling_params
        start = req.num_computed_tokens
        end = start + num_new
        known = self._known(req)
        out.num_prompt_tokens += max(0, min(req.num_prompt_tokens, end) - start)
        token_ids = req.all_token_ids[start : min(end, req.num_tokens)]
        token_ids += [PLACEHOLDER_TOKEN] * (min(end, known) - max(start, req.num_tokens))
        return ScheduledRequest(
            request_id=rid,
            token_ids=token_ids,
            start_position=start,
            block_table_start=table_start,
            new_block_ids=self.bm.block_ids(rid)[table_start:],
            sample=end >= known,
            output_index=req.num_output_tokens + self._pending.get(rid, 0),
            spec_token_ids=req.spec_token_ids[: max(0, end - known)],
            lora_slot=self._slot_of(req),
        )

    def _slot_of(self, req: Request) -> int:
        if req.lora_name is None or self.lora_slots is None:
            return -1
        slot = self.lora_slots.slot_of(req.lora_name)
        assert slot is not None, f"request {req.request_id} runs without its adapter's slot"
        return slot

    def update(
        self, out: SchedulerOutput, sampled: dict[str, list[int]], launched: bool = False
    ) -> list[tuple[Request, list[int]]]:
        """Advance computed tokens, append the sampled tokens, finish what stopped.

        `sampled` holds, per request, the tokens its step produced: one per step without
        speculation; with draft tokens, the accepted drafts then the target's own next
        token. The KV of rejected drafts is rolled back. Tokens after one that stops the
        request are dropped. Returns each request that got tokens, with those it kept.
        `launched`: `launched(out)` already counted the step's tokens (overlap); a request
        that finished meanwhile (stopped by the step before, aborted) gets nothing."""
        now = self.clock()
        touched: list[tuple[Request, list[int]]] = []
        for step in out.scheduled:
            req = self.requests.get(step.request_id)
            if req is None or req.is_finished:
                continue
            if not launched:
                req.num_computed_tokens += step.num_tokens
            elif step.sample:
                left = self._pending.get(step.request_id, 0) - 1
                if left > 0:
                    self._pending[step.request_id] = left
                else:
                    self._pending.pop(step.request_id, None)
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

    # ---- the step-time budget (step_budget.py has the rules) -------------------------
    @property
    def time_budget_on(self) -> bool:
        ms = self.config.max_step_ms
        return bool(self.config.enable_chunked_prefill) and (ms is None or ms > 0)

    def _is_decoding(self, req: Request) -> bool:
        """Its prompt is computed: it computes its last sampled token (and any drafts)."""
        return self._known(req) - req.num_computed_tokens == 1

    def _projected_decodes(self) -> StepShape:
        """A decode-only step of the batch the engine is heading for: the running, swapped
        and waiting requests up to max_num_seqs, each with its tokens per step (one, plus
        its draft tokens) at its current length."""
        shape = StepShape()
        for req in (self.running + self.swapped + self.waiting)[: self.config.max_num_seqs]:
            shape.add(1 + len(req.spec_token_ids), max(req.num_tokens - 1, 0))
        return shape

    def _planned_shape(self, plan: _StepPlan) -> StepShape:
        return StepShape.of(
            (n, self.requests[rid].num_computed_tokens) for rid, n in plan.scheduled.items()
        )

    def _plan_within_time(self, plan: _StepPlan, out: SchedulerOutput) -> None:
        """Decodes first; then swapped requests coming back; then prefill chunks for the
        running partial prefills and the waiting prompts (policy order), shared by
        `step_budget.share_prefill` within the time the cost model says is left."""
        cfg = self.config
        now = self.clock()
        coefs = self.cost_model.coefficients
        self._schedule_running(plan, out, [r for r in self.running if self._is_decoding(r)])
        decodes = self._planned_shape(plan)
        target = step_budget.resolve_target_s(
            cfg.max_step_ms, coefs, self._projected_decodes(), self.cost_model.ready
        )
        if cfg.max_step_ms is None and not decodes.decode_tokens:
            target = None  # the derived default protects running decodes; with none, a chunk only delays
        if target is not None and decodes.decode_tokens and coefs.predict(decodes) > target:
            self._count_overrun(target, coefs.predict(decodes), decodes.decode_tokens)
        if not plan.preempted:
            self._resume_swapped(plan, out, now)
        partial = [
            r
            for r in self.running
            if r.request_id not in plan.scheduled and not self._is_decoding(r)
        ]
        needs = [(self._num_to_schedule(r, plan.budget), r.num_computed_tokens) for r in partial]
        waiting: list[Request] = []
        if not plan.preempted and not self.swapped:
            room = max(0, cfg.max_num_seqs - len(self.running))
            key = lambda r: policy.admission_key(  # noqa: E731
                r, now, cfg.scheduling_policy, cfg.priority_aging_per_s, cfg.max_queue_delay_ms
            )
            waiting = heapq.nsmallest(
                room, (r for r in self.waiting if self._can_admit(r)), key=key
            )
            for req in waiting:
                self.bm.restore_from_host(req)
                _, num_cached = self.bm.get_computed_blocks(req)
                needs.append((self._known(req) - num_cached, num_cached))
        # prefill within target / margin: mixed steps have been running that much over the fit
        seconds = (
            None
            if target is None
            else target / self._margin() - coefs.predict(self._planned_shape(plan))
        )
        allotted = step_budget.share_prefill(
            needs,
            seconds,
            plan.budget,
            coefs,
            must_progress=not plan.scheduled,
            min_tokens=step_budget.DEFAULT_MIN_PREFILL_TOKENS if cfg.max_step_ms is None else 0,
        )
        self._schedule_running(
            plan, out, partial, {r.request_id: g for r, g in zip(partial, allotted, strict=False)}
        )
        if not plan.preempted:
            for req, tokens in zip(waiting, allotted[len(partial) :], strict=True):
                if tokens <= 0:
                    continue
                if len(self.running) >= cfg.max_num_seqs or plan.budget <= 0:
                    break
                # looked up again: an admission just before may have evicted cached blocks
                self.bm.restore_from_host(req)
                hits, num_cached = self.bm.get_computed_blocks(req)
                num_new = min(tokens, self._known(req) - num_cached, plan.budget)
                if not self._admit(req, num_new, hits, num_cached, plan, now):
                    break
        self.budget_stats.target_s = target
        self.budget_stats.predicted_s = coefs.predict(self._planned_shape(plan))
        least = (
            0.0
            if decodes.decode_tokens
            else step_budget.chunk_cost(coefs, step_budget.MIN_PROGRESS_TOKENS, 0)
        )
        self.budget_stats.forced = seconds is not None and seconds < least

    def _margin(self) -> float:
        """The cost model's margin: at the 99th percentile for the user's `--max-step-ms`
        (a latency limit), the 95th for the derived default (throughput matters as much)."""
        slo = self.config.max_step_ms is not None
        return self.cost_model.margin(SLO_MARGIN_QUANTILE if slo else MARGIN_QUANTILE)

    def _count_overrun(self, target_s: float, predicted_s: float, num_decodes: int) -> None:
        """Decodes alone are over the target: they run, prefill waits. Counted; logged at
        most every OVERRUN_LOG_INTERVAL_S."""
        stats = self.budget_stats
        stats.decode_overruns += 1
        now = self.clock()
        if (
            self._overrun_logged_at is not None
            and now - self._overrun_logged_at < OVERRUN_LOG_INTERVAL_S
        ):
            return
        log.warning(
            "step-time budget: %d running decode tokens alone are predicted at %.0f ms, over the %.0f ms "
            "target; such steps run without prefill (%d since the last message). Raise --max-step-ms or "
            "lower --max-num-seqs",
            num_decodes,
            predicted_s * 1000,
            target_s * 1000,
            stats.decode_overruns - self._overruns_at_log,
        )
        self._overrun_logged_at, self._overruns_at_log = now, stats.decode_overruns
