"""The step-time budget: how much prefill a step may carry so it ends within a target.

Pure functions of the cost model's coefficients (cost_model.py); the scheduler calls them.

Target (`--max-step-ms`):
- a number: that many milliseconds per step (SLO mode);
- unset: DEFAULT_DECODE_MULTIPLE x the predicted time of a decode-only step of the batch
  the engine is heading for (every running request plus the waiting ones, up to
  max-num-seqs, one token each at its current length). A decoding request's inter-token
  latency is the step time, so its p99 stays within about that multiple of a decode
  step while its median is at least one decode step; with no decode running in the step
  there is none to protect, so no time limit (chunking a lone prompt only delays it);
- 0: no time budget (the fixed token budget alone, vLLM's rule).
`--max-num-batched-tokens` caps the tokens of every step in all three.

Decode-first: running decodes are scheduled before any prefill, whatever the target;
prefill gets the time that is left. If the decodes alone exceed the target, the step
runs them with no prefill (the scheduler counts it and logs, rate-limited).

Fairness (`share_prefill`): prefill candidates (running partial prefills, then waiting
prompts in policy order: fcfs, or priority with aging) are served in order, except that
prompts whose remaining prefill needs more than LONG_SHARE of the step's room (in time
or tokens) share one pool of LONG_SHARE of it; what is left after one pass goes to the
candidates again in order. So a short prompt is never stuck behind long prefills: at
least half of every step's room is open to it, and a lone long prompt still gets the
whole room. If nothing at all would run, the first candidate gets MIN_PROGRESS_TOKENS
(a step is never empty while work waits).

Prefill floor (the derived default only): with the target unset, a step that has prompts
waiting carries at least DEFAULT_MIN_PREFILL_TOKENS of prefill (token budget permitting),
whatever the fit predicts. A young or skewed fit (seen under load: all of a step's cost put
on attended pairs) would otherwise size chunks at a few tokens, and time-to-first-token
and throughput would collapse while decodes gained nothing worth it. `--max-step-ms N`
has no floor: it is the user's explicit target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmservice.server.engine.cost_model import Coefficients, StepShape, chunk_pairs

DEFAULT_DECODE_MULTIPLE = 2.0
DEFAULT_MIN_PREFILL_TOKENS = 32  # progress against a skewed fit; 256 set the CPU ITL tail (docs/engine.md)
LONG_SHARE = 0.5
MIN_PROGRESS_TOKENS = 16


@dataclass
class BudgetStats:
    """What the budget did (the engine exports these as metrics)."""

    target_s: float | None = None  # the last step's target; None: no time limit
    predicted_s: float = 0.0  # the last step's predicted time
    decode_overruns: int = 0  # cumulative: steps whose decodes alone were predicted over the target
    # the last step's least (its decodes; with none, the smallest prefill chunk) was already
    # predicted over the target: a miss the budget could not avoid
    forced: bool = False


def resolve_target_s(
    max_step_ms: float | None,
    coefficients: Coefficients,
    projected_decodes: StepShape,
    model_ready: bool,
) -> float | None:
    """This step's time target in seconds; None: no time limit (see the module doc)."""
    if max_step_ms is not None and max_step_ms <= 0:
        return None
    if not model_ready:
        return None
    if max_step_ms is not None:
        return max_step_ms / 1000.0
    if projected_decodes.decode_tokens == 0:
        return None
    return DEFAULT_DECODE_MULTIPLE * coefficients.predict(projected_decodes)


def chunk_cost(c: Coefficients, num_tokens: int, start: int) -> float:
    """Seconds a prefill chunk adds to a step (the fixed cost is the step's, not the chunk's)."""
    return c.prefill_token * num_tokens + c.attended_pair * chunk_pairs(num_tokens, start)


def max_chunk(c: Coefficients, seconds: float, start: int, limit: int) -> int:
    """The most tokens (<= limit) a chunk starting at `start` may have within `seconds`."""
    if limit <= 0 or seconds <= 0:
        return 0
    if math.isinf(seconds) or chunk_cost(c, limit, start) <= seconds:
        return limit
    b, d = c.prefill_token, c.attended_pair
    if d <= 0:
        n = int(seconds / b)
    else:  # d/2 n^2 + (b + d (start + 1/2)) n <= seconds
        lin = b + d * (start + 0.5)
        n = int((-lin + math.sqrt(lin * lin + 2.0 * d * seconds)) / d)
    while n > 0 and chunk_cost(c, n, start) > seconds:  # float rounding
        n -= 1
    return max(0, min(n, limit))


def share_prefill(
    candidates: Sequence[tuple[int, int]],
    seconds: float | None,
    tokens: int,
    c: Coefficients,
    must_progress: bool = False,
    min_tokens: int = 0,
) -> list[int]:
    """Tokens for each prefill candidate, given as (tokens it still needs, its first
    position), in policy order, within `seconds` (None: no time limit) and `tokens`;
    at least `min_tokens` in all (the default mode's floor), time permitting or not."""
    time_left = math.inf if seconds is None else max(0.0, seconds)
    token_left = max(0, tokens)
    long_time, long_tokens = time_left * LONG_SHARE, token_left * LONG_SHARE
    pool_time, pool_tokens = long_time, int(long_tokens)
    alloc = [0] * len(candidates)
    for i, (need, start) in enumerate(candidates):
        is_long = need > long_tokens or chunk_cost(c, need, start) > long_time
        t_avail = min(time_left, pool_time) if is_long else time_left
        n_avail = min(token_left, pool_tokens) if is_long else token_left
        g = max_chunk(c, t_avail, start, min(need, n_avail))
        cost = chunk_cost(c, g, start)
        alloc[i] = g
        time_left -= cost
        token_left -= g
        if is_long:
            pool_time -= cost
            pool_tokens -= g
    for i, (need, start) in enumerate(candidates):  # what is left, in order
        if alloc[i] < need and token_left > 0 and time_left > 0:
            g = max_chunk(c, time_left, start + alloc[i], min(need - alloc[i], token_left))
            time_left -= chunk_cost(c, g, start + alloc[i])
            token_left -= g
            alloc[i] += g
    floor = min(min_tokens, sum(need for need, _ in candidates), max(0, tokens))
    for i, (need, _) in enumerate(candidates):  # the floor, in order
        short = floor - sum(alloc)
        if short <= 0:
            break
        alloc[i] += min(short, need - alloc[i])
    if must_progress and candidates and not any(alloc):
        alloc[0] = min(MIN_PROGRESS_TOKENS, candidates[0][0], max(0, tokens))
    return alloc
