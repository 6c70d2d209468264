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
from dataclasses import dataclass, field
from typing import Protocol

from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine import spec_policy
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.request import Request
from llmservice.server.engine.spec_config import SpeculativeConfig, parse_speculative_config
from llmservice.server.engine.spec_ngram import propose_ngram
from llmservice.server.engine.step import SchedulerOutput


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
    batch_off_steps: int = 0  # steps with drafts on offer where the plan drafted none

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
    def __init__(self, config: SpeculativeConfig, max_model_len: int, proposer: Proposer | None = None):
        if proposer is None and config.method != "ngram":
            raise ValueError(f"speculative method {config.method!r} needs its draft's proposer")
        self.proposer: Proposer = proposer or NgramProposer(config)
        # a lookup costs nothing worth planning around: look first, then plan on what was
        # found; a draft model's passes cost, so plan first and draft only what pays
        self.lookup_first = proposer is None
        self.config = config
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.stats = SpecDecodeStats(accepted_per_pos=[0] * self.k)
        self.engine_acceptance = spec_policy.AcceptanceByPosition.prior(self.k)
        self.acceptance: dict[str, spec_policy.AcceptanceByPosition] = {}
        self.step_times = spec_policy.StepTimes()
        self.round_seconds = 0.0  # a draft model's seconds per draft position (EWMA)
        self._drafting_s = 0.0  # spent in after_step drafting for the next step
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
            self.engine_acceptance.observe(drafted, accepted, spec_policy.ENGINE_EWMA)
            self._acceptance(s.request_id).observe(drafted, accepted, spec_policy.REQUEST_EWMA)
        for rid in out.finished_request_ids:
            self.acceptance.pop(rid, None)
        self.proposer.forget(out.finished_request_ids)

    def _acceptance(self, request_id: str) -> spec_policy.AcceptanceByPosition:
        track = self.acceptance.get(request_id)
        if track is None:
            track = spec_policy.AcceptanceByPosition(list(self.engine_acceptance.p))
            self.acceptance[request_id] = track
        return track

    # ---- before the next step: propose ------------------------------------------------------
    def propose(self, running: list[Request], bm: BlockManager) -> None:
        """Set the drafts of every decoding request for the next step (or clear them)."""
        self.step_index += 1
        decoding = [
            r for r in running if r.num_tokens - r.num_computed_tokens == 1 and not r.is_finished
        ]
        for req in running:
            req.spec_token_ids = []
        limit = self.config.disable_by_batch_size
        if not decoding or (limit is not None and len(decoding) >= limit):
            return
        budgets = [self._budget(req) for req in decoding]
        found: dict[str, list[int]] = {}
        if self.lookup_first:
            wanted = [(req, n) for req, n in zip(decoding, budgets, strict=True) if n > 0]
            found = self.proposer.propose(wanted, bm) if wanted else {}
            budgets = [len(found.get(req.request_id, ())) for req in decoding]
        if not any(budgets):
            return
        # disable_by_batch_size: vLLM's fixed rule (every draft below that batch size)
        # instead of the measured plan
        lengths = budgets if limit is not None else self._plan(decoding, budgets)
        if not any(lengths):
            self.stats.batch_off_steps += 1
            return
        if not self.lookup_first:
            t0 = time.perf_counter()
            found = self.proposer.propose(
                [(r, n) for r, n in zip(decoding, lengths, strict=True) if n > 0], bm
            )
            w = spec_policy.STEP_EWMA
            per_round = (time.perf_counter() - t0) / max(lengths)
            self.round_seconds = per_round if not self.round_seconds else (
                (1 - w) * self.round_seconds + w * per_round
            )
        drafts = [
            (req, found[req.request_id][:n])
            for req, n in zip(decoding, lengths, strict=True)
            if n > 0 and found.get(req.request_id)
        ]
        needs = [
            (r.num_computed_tokens, len(bm.block_ids(r.request_id)), len(d)) for r, d in drafts
        ]
        kept = spec_policy.fit_drafts_to_blocks(needs, bm.num_free_blocks, bm.block_size)
        for (req, draft), n in zip(drafts, kept, strict=True):
            req.spec_token_ids = draft[:n]

    def _budget(self, req: Request) -> int:
        """Drafts this request may verify next step (none under a grammar: its mask is
        per position, computed one token at a time)."""
        if getattr(req.sampling_params, "structured", None) is not None:
            return 0
        return spec_policy.draft_budget(
            self.k, req.num_output_tokens, req.max_tokens, req.num_tokens, self.max_model_len
        )

    def _plan(self, decoding: list[Request], budgets: list[int]) -> list[int]:
        """The draft lengths with the most expected tokens per second (spec_policy); a
        request that could draft but gets none relaxes toward the engine's acceptance."""
        tracks = [self._acceptance(req.request_id) for req in decoding]
        gains = [t.gains(n) for t, n in zip(tracks, budgets, strict=True)]
        round_s = 0.0 if self.lookup_first else self.round_seconds
        lengths = spec_policy.plan_drafts(
            gains, self.step_times.estimator(self.step_index), round_s
        )
        for track, n, got in zip(tracks, budgets, lengths, strict=True):
            if n and not got:
                track.relax_toward(self.engine_acceptance, spec_policy.RELAX)
        return lengths

    def observe_step(self, out: SchedulerOutput, seconds: float) -> None:
        """A decode-only step's seconds by the rows it verified, for the plan's cost side."""
        if out.num_prompt_tokens or not out.scheduled:
            return
        if any(len(s.token_ids) != 1 for s in out.scheduled):
            return
        rows = sum(1 + len(s.spec_token_ids) for s in out.scheduled)
        # the step's time holds the drafting for the next step, not its own
        self.step_times.observe(rows, seconds - self._drafting_s, self.step_index)

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
        self.propose(running, bm)
        self._drafting_s = time.perf_counter() - t0

    def forget(self, request_id: str) -> None:
        self.acceptance.pop(request_id, None)


def make_speculator(
    config: EngineConfig,
    max_model_len: int,
    target: object | None = None,
    num_blocks: int = 0,
) -> Speculator | None:
    """The engine's speculator for --speculative-config (None without the flag). `target`:
    the engine's model (a draft_model / layer_skip draft runs beside it on `num_blocks`
    blocks)."""
    spec = parse_speculative_config(config.speculative_config)
    if spec is None:
        return None
    proposer = None
    if spec.method != "ngram":
        from llmservice.server.engine.spec_draft import make_draft_proposer

        if target is None:
            raise ConfigError(f"--speculative-config method {spec.method!r} needs the target model")
        proposer = make_draft_proposer(spec, config, target, num_blocks, max_model_len)
    return Speculator(spec, max_model_len, proposer)
