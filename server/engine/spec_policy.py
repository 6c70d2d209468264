"""When to speculate: pure decisions, unit-tested without a model.

- Per request: a recent acceptance rate (EWMA over its verified drafts) below
  `MIN_ACCEPTANCE` turns its drafts off; it is probed again after a back-off that doubles
  each time the probe fails, so a request whose text starts quoting (code, edits) gets
  speculation back.
- Per batch: drafting k tokens for each of B decodes makes the step verify B(k+1)
  tokens. On a memory-bound step that costs little more than the plain step; once the
  batch is large enough to be compute-bound it costs nearly k+1 times as much, and
  speculation must turn off. The rule (`BatchRates`) measures it: the output tokens per
  second of decode-only steps at each batch size, with drafts and without, and
  speculates at a batch size while its rate with drafts is at least the rate without.
  A batch size measured one way only is tried the other way next; the losing way is
  tried again now and then, since acceptance and context lengths drift. Before any
  measurement, the engine's linear step-cost model predicts (`speculation_pays`): its
  verify time is a guess (a linear model has no memory-bound regime), so the
  measurement decides from the first steps on.
- Under memory pressure drafts are cut to the free blocks before anything is preempted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_ACCEPTANCE = 0.2  # accepted / drafted below this: the request drafts nothing for a while
EWMA_WEIGHT = 0.3  # of the newest verification
MIN_VERIFIED = 2  # drafts verified before the rate may turn a request off
FIRST_BACKOFF_STEPS = 8
MAX_BACKOFF_STEPS = 256


@dataclass
class RequestAcceptance:
    rate: float = 1.0  # EWMA of accepted / drafted
    verified: int = 0
    off_until_step: int = 0
    backoff: int = FIRST_BACKOFF_STEPS

    def enabled(self, step: int) -> bool:
        return step >= self.off_until_step

    def observe(self, drafted: int, accepted: int, step: int) -> None:
        if drafted <= 0:
            return
        was_probe = self.verified >= MIN_VERIFIED and self.rate < MIN_ACCEPTANCE
        self.rate = (1 - EWMA_WEIGHT) * self.rate + EWMA_WEIGHT * (accepted / drafted)
        if was_probe:  # a probe after a back-off: judged on itself alone
            self.rate = accepted / drafted
        self.verified += 1
        if self.verified >= MIN_VERIFIED and self.rate < MIN_ACCEPTANCE:
            self.off_until_step = step + self.backoff
            self.backoff = min(self.backoff * 2, MAX_BACKOFF_STEPS)
        elif self.rate >= MIN_ACCEPTANCE:
            self.backoff = FIRST_BACKOFF_STEPS


def speculation_pays(plain_step_s: float, spec_step_s: float, mean_accepted: float) -> bool:
    """A speculating step yields 1 + mean_accepted tokens per request for spec_step_s;
    a plain step 1 token for plain_step_s."""
    if plain_step_s <= 0:
        return True
    return spec_step_s / plain_step_s < 1.0 + mean_accepted


RATE_EWMA_WEIGHT = 0.3  # of the newest decode-only step at a batch size
RETRY_LOSER_EVERY = 32  # measurements at a batch size between two tries of the losing way


@dataclass
class BatchRates:
    """Output tokens per second of decode-only steps by batch size, with and without drafts
    (EWMAs), and the decision they imply."""

    plain: dict[int, float] = field(default_factory=dict)
    spec: dict[int, float] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)  # measurements at each batch size

    def observe(self, batch: int, speculated: bool, tokens: int, seconds: float) -> None:
        if batch <= 0 or seconds <= 0:
            return
        rates = self.spec if speculated else self.plain
        rate = tokens / seconds
        old = rates.get(batch)
        rates[batch] = rate if old is None else (1 - RATE_EWMA_WEIGHT) * old + RATE_EWMA_WEIGHT * rate
        self.seen[batch] = self.seen.get(batch, 0) + 1

    def decide(self, batch: int) -> bool | None:
        """Speculate at this batch size? None: measured neither way (the caller predicts)."""
        spec, plain = self.spec.get(batch), self.plain.get(batch)
        if spec is None and plain is None:
            return None
        if spec is None or plain is None:
            return spec is None  # try the way not yet measured
        wins = spec >= plain
        if self.seen.get(batch, 0) % RETRY_LOSER_EVERY == 0:
            return not wins  # now and then the other way, so a stale loss does not stick
        return wins


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
