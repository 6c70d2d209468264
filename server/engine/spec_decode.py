"""The engine's speculative decoding driver: after each step, propose the drafts the
next step verifies (`Request.spec_token_ids`), and count what was accepted.

The scheduler already schedules 1 + len(drafts) tokens for a decoding request and rolls
back rejected ones; the runner verifies (spec_verify.py). This module decides who
drafts (spec_policy.py) and asks a proposer: n-gram prompt lookup (spec_ngram.py) for
`method: ngram`, a draft model or the target's first layers (spec_draft.py) for
`draft_model` and `layer_skip`. Requests with a structured-output grammar draft nothing
(their mask is per position, computed one token at a time).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine import spec_policy
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.request import Request
from llmservice.server.engine.spec_config import SpeculativeConfig, parse_speculative_config
from llmservice.server.engine.spec_ngram import propose_ngram
from llmservice.server.engine.step import SchedulerOutput

# (num_tokens, start_position) per request -> predicted step seconds (the engine's cost model)
StepPredictor = Callable[[list[tuple[int, int]]], float]
PROBE_EVERY_STEPS = 32


class Proposer(Protocol):
    def propose(self, wanted: list[tuple[Request, int]], bm: BlockManager) -> dict[str, list[int]]:
        """Up to n draft tokens for each (request, n); a request may get none."""
        ...

    def forget(self, request_ids: list[str]) -> None:
        """These requests finished: drop what is kept for them."""
        ...


class NgramProposer:
    """Prompt lookup: the tokens that followed the last earlier occurrence of the newest n-gram."""

    def __init__(self, config: SpeculativeConfig):
        self.config = config

    def propose(self, wanted: list[tuple[Request, int]], bm: BlockManager) -> dict[str, list[int]]:
        cfg = self.config
        return {
            req.request_id: propose_ngram(req.all_token_ids, n, cfg.prompt_lookup_min, cfg.prompt_lookup_max)
            for req, n in wanted
        }

    def forget(self, request_ids: list[str]) -> None:
        pass


@dataclass
class SpecDecodeStats:
    """Cumulative counters, vLLM's spec_decode metrics."""

    num_drafts: int = 0  # verifications (requests x steps with drafts)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # accepted drafts at position i
    batch_off_steps: int = 0  # steps the batch-level rule turned speculation off

    def totals(self) -> tuple[int, int, int, tuple[int, ...]]:
        """What EngineStats carries to the metrics (server/spec_metrics.py)."""
        return (
            self.num_drafts,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            tuple(self.accepted_per_pos),
        )

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verification: accepted drafts plus the target's own."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


class Speculator:
    def __init__(
        self,
        config: SpeculativeConfig,
        max_model_len: int,
        predict: StepPredictor | None = None,
        proposer: Proposer | None = None,
    ):
        if proposer is None and config.method != "ngram":
            raise ValueError(f"speculative method {config.method!r} needs its draft's proposer")
        self.proposer: Proposer = proposer or NgramProposer(config)
        self.config = config
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.predict = predict
        self.stats = SpecDecodeStats(accepted_per_pos=[0] * self.k)
        self.acceptance: dict[str, spec_policy.RequestAcceptance] = {}
        self.mean_accepted = float(self.k) / 2  # prior until drafts are verified
        self.rates = spec_policy.BatchRates()
        # how the step just run and the next one were fed: (the batch rule speculated,
        # seconds spent drafting for it)
        self._fed: tuple[tuple[bool, float], tuple[bool, float]] = ((False, 0.0), (False, 0.0))
        self.step_index = 0

    # ---- after a step: count -------------------------------------------------------------
    def observe(self, out: SchedulerOutput, tokens: dict[str, list[int]]) -> None:
        """Count each verified draft: the runner returns accepted drafts + one token."""
        for s in out.scheduled:
            drafted = len(s.spec_token_ids)
            if not drafted or s.request_id not in tokens:
                continue
            accepted = len(tokens[s.request_id]) - 1
            st = self.stats
            st.num_drafts += 1
            st.num_draft_tokens += drafted
            st.num_accepted_tokens += accepted
            for i in range(accepted):
                st.accepted_per_pos[i] += 1
            w = spec_policy.EWMA_WEIGHT
            self.mean_accepted = (1 - w) * self.mean_accepted + w * accepted
            track = self.acceptance.setdefault(s.request_id, spec_policy.RequestAcceptance())
            track.observe(drafted, accepted, self.step_index)
        for rid in out.finished_request_ids:
            self.acceptance.pop(rid, None)
        self.proposer.forget(out.finished_request_ids)

    # ---- before the next step: propose ------------------------------------------------------
    def propose(self, running: list[Request], bm: BlockManager) -> bool:
        """Set the drafts of every decoding request for the next step (or clear them);
        whether the batch rule speculates for it (found drafts or not)."""
        self.step_index += 1
        decoding = [
            r for r in running if r.num_tokens - r.num_computed_tokens == 1 and not r.is_finished
        ]
        for req in running:
            req.spec_token_ids = []
        if not decoding or not self._batch_pays(decoding):
            return False
        wanted: list[tuple[Request, int]] = []
        for req in decoding:
            track = self.acceptance.get(req.request_id)
            if getattr(req.sampling_params, "structured", None) is not None:
                continue
            if track is not None and not track.enabled(self.step_index):
                continue
            n = spec_policy.draft_budget(
                self.k, req.num_output_tokens, req.max_tokens, req.num_tokens, self.max_model_len
            )
            if n > 0:
                wanted.append((req, n))
        proposed = self.proposer.propose(wanted, bm) if wanted else {}
        drafts = [(req, proposed[req.request_id]) for req, _ in wanted if proposed.get(req.request_id)]
        if not drafts:
            return True
        needs = [
            (r.num_computed_tokens, len(bm.block_ids(r.request_id)), len(d)) for r, d in drafts
        ]
        kept = spec_policy.fit_drafts_to_blocks(needs, bm.num_free_blocks, bm.block_size)
        for (req, draft), n in zip(drafts, kept, strict=True):
            req.spec_token_ids = draft[:n]
        return True

    def observe_step(self, out: SchedulerOutput, num_tokens: int, seconds: float) -> None:
        """A decode-only step's output tokens and time, for the batch-level rule."""
        if out.num_prompt_tokens or not out.scheduled:
            return
        if any(len(s.token_ids) != 1 for s in out.scheduled):
            return
        # the step's time held the drafting for the next step, not its own (a draft
        # model's forward passes): charge each step the drafting that fed it
        (speculated, fed_it), (_, for_next) = self._fed
        seconds += fed_it - for_next
        # a step is "with drafts" when the rule had speculation on for it, whether or not
        # lookups found any: a failed lookup's cost is the price of speculating
        self.rates.observe(len(out.scheduled), speculated, num_tokens, seconds)

    def _batch_pays(self, decoding: list[Request]) -> bool:
        limit = self.config.disable_by_batch_size
        measured = self.rates.decide(len(decoding)) if limit is None else None
        if limit is not None:
            pays = len(decoding) < limit
        elif measured is not None:
            pays = measured
        elif self.predict is None:
            pays = True
        else:
            plain = [(1, r.num_computed_tokens) for r in decoding]
            spec = [(1 + self.k, r.num_computed_tokens) for r in decoding]
            pays = spec_policy.speculation_pays(
                self.predict(plain), self.predict(spec), self.mean_accepted
            )
        if not pays and measured is None and self.step_index % PROBE_EVERY_STEPS == 0:
            pays = True  # re-measure acceptance now and then, or a low mean would stick
        if not pays:
            self.stats.batch_off_steps += 1
        return pays

    def after_step(
        self,
        out: SchedulerOutput,
        tokens: dict[str, list[int]],
        running: list[Request],
        bm: BlockManager,
    ) -> None:
        """The engine's one hook: count this step's verifications, draft for the next."""
        self.observe(out, tokens)
        t0 = time.perf_counter()
        speculating = self.propose(running, bm)
        self._fed = (self._fed[1], (speculating, time.perf_counter() - t0))

    def forget(self, request_id: str) -> None:
        self.acceptance.pop(request_id, None)


def make_speculator(
    config: EngineConfig,
    max_model_len: int,
    cost_model: object | None,
    target: object | None = None,
    num_blocks: int = 0,
) -> Speculator | None:
    """The engine's speculator for --speculative-config (None without the flag). The
    batch-level rule predicts step times with the engine's step-cost model. `target`: the
    engine's model (a draft_model / layer_skip draft runs beside it on `num_blocks` blocks)."""
    spec = parse_speculative_config(config.speculative_config)
    if spec is None:
        return None
    proposer = None
    if spec.method != "ngram":
        from llmservice.server.engine.spec_draft import make_draft_proposer

        if target is None:
            raise ConfigError(f"--speculative-config method {spec.method!r} needs the target model")
        proposer = make_draft_proposer(spec, config, target, num_blocks, max_model_len)
    predict = None
    if cost_model is not None:
        from llmservice.server.engine.cost_model import StepShape

        def predict(requests: list[tuple[int, int]]) -> float:
            return cost_model.predict(StepShape.of(requests))

    return Speculator(spec, max_model_len, predict, proposer)
