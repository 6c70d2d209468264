"""When to speculate: pure decisions, unit-tested without a model.

- Per request: a recent acceptance rate (EWMA over its verified drafts) below
  `MIN_ACCEPTANCE` turns its drafts off; it is probed again after a back-off that doubles
  each time the probe fails, so a request whose text starts quoting (code, edits) gets
  speculation back.
- Per batch: drafting k tokens for each of B decodes makes the step verify B(k+1)
  tokens. It pays when that step's predicted time, over the plain step's, is below the
  tokens a speculating request gets per step (1 + mean accepted). On a memory-bound
  step the ratio is near 1; once the batch is large enough to be compute-bound it
  approaches k+1 and speculation turns off. Both times come from the engine's measured
  step-cost model, so the threshold is measured, not a constant.
- Under memory pressure drafts are cut to the free blocks before anything is preempted.
"""

from __future__ import annotations

from dataclasses import dataclass

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
