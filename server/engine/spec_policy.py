"""How many tokens each request drafts: pure decisions, unit-tested without a model.

One rule covers the issue's two switches (a request with low acceptance stops drafting;
a batch large enough to be compute-bound stops speculating), the way SmartSpec frames
it: choose the draft lengths that maximize the step's expected output tokens per second.

- Benefit: each request keeps its acceptance by position, P(draft i accepted | drafts
  before it accepted), an EWMA over its own verifications, started from the engine-wide
  one. Its i-th draft is worth the product of the first i: the chance it is reached and
  accepted.
- Cost: `StepTimes` keeps the measured seconds of decode-only steps by the rows they
  verified (decodes + drafts). On a memory-bound step extra rows cost little; on a
  compute-bound one nearly their share, and the plan then drafts nothing. No constant:
  the table is this machine's, this model's, measured as it serves.
- The plan (`plan_drafts`) adds drafts best-first and keeps the count with the most
  expected tokens per second (drafting seconds included for a draft model), and drafts
  at all only when that beats plain decoding by `MIN_GAIN`.

A request whose drafts stop paying drafts nothing, and its estimate relaxes each step
toward the engine-wide one, so it is probed again later (text that starts quoting gets
speculation back). Unmeasured row counts are explored: above the largest measured, a
step is assumed to cost what the largest did (so more drafts get tried once); below the
smallest, proportionally less (so plain steps get tried once). Measurements older than
`STALE_STEPS` are dropped, so a slow outlier does not keep a row count avoided for good.
Under memory pressure drafts are cut to the free blocks before anything is preempted.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

PRIOR_ACCEPTANCE = 0.7  # P(accept | reached) at each position before any verification
REQUEST_EWMA = 0.3  # weight of a request's newest verification in its own estimate
ENGINE_EWMA = 0.05  # ... in the engine-wide estimate new requests start from
RELAX = 0.05  # per step without drafts: how far a request's estimate moves back to the engine's
STEP_EWMA = 0.3  # weight of the newest decode-only step at a row count
STALE_STEPS = 256  # a row count not measured for this many steps is forgotten
MIN_GAIN = 1.02  # drafting must promise this much more tokens/s than a plain step


@dataclass
class AcceptanceByPosition:
    """P(draft i accepted | drafts 0..i-1 accepted), one EWMA per position."""

    p: list[float]

    @classmethod
    def prior(cls, k: int) -> AcceptanceByPosition:
        return cls([PRIOR_ACCEPTANCE] * k)

    def observe(self, drafted: int, accepted: int, weight: float) -> None:
        """Positions up to the first rejection were reached; the rest say nothing."""
        for i in range(min(accepted + 1, drafted, len(self.p))):
            hit = 1.0 if i < accepted else 0.0
            self.p[i] = (1 - weight) * self.p[i] + weight * hit

    def relax_toward(self, other: AcceptanceByPosition, rate: float) -> None:
        self.p = [a + rate * (b - a) for a, b in zip(self.p, other.p, strict=True)]

    def gains(self, n: int) -> list[float]:
        """Expected tokens the 1st..n-th draft each add: P(reached and accepted)."""
        out, reach = [], 1.0
        for q in self.p[:n]:
            reach *= q
            out.append(reach)
        return out


@dataclass
class StepTimes:
    """Seconds of decode-only steps by rows verified (EWMA per row count), with when each
    was last measured (a step index)."""

    seconds: dict[int, float] = field(default_factory=dict)
    measured_at: dict[int, int] = field(default_factory=dict)

    def observe(self, rows: int, seconds: float, step: int) -> None:
        if rows <= 0 or seconds <= 0:
            return
        old = self.seconds.get(rows)
        fresh = old is None or step - self.measured_at[rows] > STALE_STEPS
        self.seconds[rows] = seconds if fresh else (1 - STEP_EWMA) * old + STEP_EWMA * seconds
        self.measured_at[rows] = step

    def estimator(self, step: int) -> Callable[[int], float] | None:
        """rows -> seconds from the measurements still fresh at `step`; None if there are none."""
        keys = sorted(r for r, at in self.measured_at.items() if step - at <= STALE_STEPS)
        if not keys:
            return None
        values = [self.seconds[r] for r in keys]

        def estimate(rows: int) -> float:
            if rows <= keys[0]:
                return values[0] * rows / keys[0]  # fewer rows than measured: try them
            if rows >= keys[-1]:
                return values[-1]  # more rows than measured: try them
            i = bisect.bisect_left(keys, rows)
            if keys[i] == rows:
                return values[i]
            lo, hi = keys[i - 1], keys[i]
            return values[i - 1] + (values[i] - values[i - 1]) * (rows - lo) / (hi - lo)

        return estimate


def plan_drafts(
    gains: list[list[float]],
    step_seconds: Callable[[int], float] | None,
    round_seconds: float = 0.0,
) -> list[int]:
    """Draft lengths for a decode batch: gains[r] are request r's expected tokens from its
    1st, 2nd... draft (non-increasing; its length is the most r may draft). A step of R
    rows takes step_seconds(R), plus round_seconds per draft position when a draft model
    drafts. Drafts are added best-first; the count with the most expected tokens per
    second wins, and drafting must beat the plain step by MIN_GAIN. No measurement yet
    (step_seconds None): draft all (the first steps measure)."""
    lengths = [0] * len(gains)
    if step_seconds is None:
        return [len(g) for g in gains]
    batch = len(gains)
    order = sorted(
        ((g, r) for r, gs in enumerate(gains) for g in gs if g > 0), key=lambda x: -x[0]
    )
    best_rate = batch / step_seconds(batch) * MIN_GAIN
    best_count = 0
    tokens, deepest, taken = float(batch), 0, [0] * batch
    for count, (g, r) in enumerate(order, start=1):
        tokens += g
        taken[r] += 1
        deepest = max(deepest, taken[r])
        rate = tokens / (step_seconds(batch + count) + round_seconds * deepest)
        if rate > best_rate:
            best_rate, best_count = rate, count
    for _, r in order[:best_count]:
        lengths[r] += 1
    return lengths


def draft_budget(
    k: int, num_output: int, max_tokens: int, num_tokens: int, max_model_len: int
) -> int:
    """Draft tokens worth verifying: a step yields at most drafts + 1 tokens, so never
    more drafts than the request may still output minus one, nor past max_model_len."""
    return max(0, min(k, max_tokens - num_output - 1, max_model_len - num_tokens))


def fit_drafts_to_blocks(
    needs: list[tuple[int, int, int]], free_blocks: int, block_size: int
) -> list[int]:
    """Cut drafts so the step's extra blocks fit the free pool (earlier requests keep theirs first).

    needs: per request (tokens it holds KV slots for, its blocks, its draft length); a
    step computes 1 + drafts tokens. Returns the draft length each may keep. The plain
    decode's own block is counted first: speculation never takes a block a decode needs."""
    plain = sum(max(0, -(-(held + 1) // block_size) - blocks) for held, blocks, _ in needs)
    left = free_blocks - plain
    kept = []
    for held, blocks, drafts in needs:
        base = max(blocks, -(-(held + 1) // block_size))
        n = drafts
        while n > 0 and -(-(held + 1 + n) // block_size) - base > left:
            n -= 1
        left -= -(-(held + 1 + n) // block_size) - base
        kept.append(n)
    return kept
