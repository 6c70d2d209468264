"""A step's cost, fitted online from the engine's own step timings.

    time ~= a + b * prefill tokens + c * decode tokens + d * attended pairs

`a` is the fixed cost of a step (launches, Python, sampling set-up), `b` and `c` the
per-token cost of a prefill chunk and of a decode (a decode is a query of one token; on
a GPU it is memory-bound, a prefill token compute-bound, so they differ), and `d` the
attention work: each query token attends to every earlier token of its sequence, so a
decode at context L adds L pairs and a chunk of q tokens starting at p adds
q*p + q(q+1)/2. Fitted by least squares over exponentially decayed sufficient statistics
(each step multiplies the past by `decay`), with non-negative coefficients, a mild Huber
weight (a step slowed by a noisy neighbour counts less) and the start-up profile as a
prior that never decays (a direction the recent steps do not explore, e.g. prefill
during a decode-only stretch, falls back to the profile instead of drifting).

The prior must be plausible: a profile step slowed by something else (a first-use
compile, a neighbour's burst; a soak once saw a 79 s profile whose fit put 11.5 ms on
every attended pair and nothing on tokens) would otherwise bias that direction for
good, since the prior never decays. So `seed` drops samples (leave-one-out) while its fit
is off by more than PLAUSIBLE_RATIO on any, down to MIN_PRIOR_SAMPLES, and
seeds nothing if the rest still disagree (the online fit then starts alone). With four
terms and the profile's five shapes this can drop one sample; the profile also times
every shape twice and keeps the faster (step_profile.py).
Pure Python: four unknowns, a 4x4 solve per refit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TERMS = ("fixed", "prefill_token", "decode_token", "attended_pair")
# Features are divided by these before fitting so the normal matrix is well conditioned.
_SCALES = (1.0, 1024.0, 64.0, float(1 << 20))
_RIDGE = 1e-9  # keeps the solve defined before every direction has been seen
# The margin for steps that mix decodes and prefill (`StepCostModel.margin`): the
# MARGIN_QUANTILE of their measured / predicted time over the last MARGIN_WINDOW of them,
# once MARGIN_MIN_STEPS were seen, within [1, MAX_MARGIN].
MARGIN_WINDOW = 64
MARGIN_MIN_STEPS = 8
MARGIN_QUANTILE = 0.95
# With `--max-step-ms` the target is the user's limit on inter-token latency, so its p99 is
# what counts: a mixed step stalls every decoding request, and about one step in ten mixes,
# so the budget plans for all but the longest of the window.
SLO_MARGIN_QUANTILE = 0.99
MAX_MARGIN = 2.0
PLAUSIBLE_RATIO = 3.0  # a prior sample its fit predicts more than 3x off (either way) is dropped
MIN_PRIOR_SAMPLES = 4  # with four terms, fewer points always fit: nothing left to check


def chunk_pairs(num_tokens: int, start: int) -> int:
    """Attended (query, key) pairs of `num_tokens` queries at positions start, start+1, ..."""
    return num_tokens * start + num_tokens * (num_tokens + 1) // 2


@dataclass
class StepShape:
    """The features of one step: what the cost model predicts from."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    attended_pairs: int = 0

    def add(self, num_tokens: int, start: int) -> None:
        """One request's share: `num_tokens` queries from position `start` (a query of one
        token is a decode, as the runner lays it out; k+1 verify tokens are a chunk)."""
        if num_tokens <= 0:
            return
        if num_tokens == 1:
            self.decode_tokens += 1
        else:
            self.prefill_tokens += num_tokens
        self.attended_pairs += chunk_pairs(num_tokens, start)

    def plus(self, other: StepShape) -> StepShape:
        return StepShape(
            self.prefill_tokens + other.prefill_tokens,
            self.decode_tokens + other.decode_tokens,
            self.attended_pairs + other.attended_pairs,
        )

    @property
    def is_empty(self) -> bool:
        return not (self.prefill_tokens or self.decode_tokens)

    def features(self) -> tuple[float, float, float, float]:
        return (
            1.0,
            float(self.prefill_tokens),
            float(self.decode_tokens),
            float(self.attended_pairs),
        )

    @classmethod
    def of(cls, requests: Iterable[tuple[int, int]]) -> StepShape:
        """From (num_tokens, start_position) per scheduled request."""
        shape = cls()
        for n, start in requests:
            shape.add(n, start)
        return shape


@dataclass(frozen=True)
class Coefficients:
    """Seconds per step, per prefill token, per decode token, per attended pair."""

    fixed: float = 0.0
    prefill_token: float = 0.0
    decode_token: float = 0.0
    attended_pair: float = 0.0

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (self.fixed, self.prefill_token, self.decode_token, self.attended_pair)

    def predict(self, shape: StepShape) -> float:
        return sum(w * x for w, x in zip(self.as_tuple(), shape.features(), strict=True))


def _solve(m: list[list[float]], v: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (small dense systems)."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        if abs(a[col][col]) < 1e-300:
            a[col][col] = 1e-300
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            if f:
                for k in range(col, n + 1):
                    a[r][k] -= f * a[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][k] * x[k] for k in range(r + 1, n))) / a[r][r]
    return x


def nonnegative_least_squares(gram: list[list[float]], rhs: list[float]) -> list[float]:
    """Minimise |Xw - y|^2 over w >= 0 given X'X and X'y: solve, pin the most negative
    coefficient at 0, solve the rest again (an active set; four unknowns at most)."""
    n = len(rhs)
    free = list(range(n))
    w = [0.0] * n
    while free:
        sub = _solve([[gram[i][j] for j in free] for i in free], [rhs[i] for i in free])
        worst = min(range(len(free)), key=lambda k: sub[k])
        if sub[worst] >= 0:
            w = [0.0] * n
            for k, i in enumerate(free):
                w[i] = sub[k]
            return w
        free.pop(worst)
    return w


class StepCostModel:
    """Online fit of `Coefficients` from (StepShape, seconds) observations."""

    def __init__(self, decay: float = 0.995, prior_weight: float = 2.0, min_observations: int = 12):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay {decay} must be in (0, 1]")
        self.decay = decay
        self.prior_weight = prior_weight
        self.min_observations = min_observations
        n = len(TERMS)
        self._gram = [[0.0] * n for _ in range(n)]
        self._rhs = [0.0] * n
        self._prior_gram = [[0.0] * n for _ in range(n)]
        self._prior_rhs = [0.0] * n
        self.steps_seen = 0
        self.seeded = False
        self.dropped: list[tuple[StepShape, float]] = []
        self.coefficients = Coefficients()
        self._mixed_ratios: deque[float] = deque(maxlen=MARGIN_WINDOW)

    @staticmethod
    def _scaled(shape: StepShape) -> list[float]:
        return [x / s for x, s in zip(shape.features(), _SCALES, strict=True)]

    @staticmethod
    def _accumulate(
        gram: list[list[float]], rhs: list[float], x: list[float], y: float, w: float
    ) -> None:
        for i, xi in enumerate(x):
            rhs[i] += w * xi * y
            row = gram[i]
            for j, xj in enumerate(x):
                row[j] += w * xi * xj

    @property
    def ready(self) -> bool:
        """Whether predictions are worth budgeting with: seeded, or enough steps seen."""
        return self.seeded or self.steps_seen >= self.min_observations

    def seed(self, samples: Sequence[tuple[StepShape, float]]) -> Coefficients:
        """The start-up profile: a prior worth `prior_weight` steps in all (it shapes the fit
        where recent steps say nothing; where they do, they win). Implausible samples are
        left out first (the module doc); `self.dropped` says which."""
        kept = [(shape, seconds) for shape, seconds in samples if not shape.is_empty and seconds > 0]
        self.dropped = []
        while kept and self._worst_error(kept) > math.log(PLAUSIBLE_RATIO):
            if len(kept) <= MIN_PRIOR_SAMPLES:  # what is left still disagrees: no prior at all
                self.dropped += kept
                kept = []
                break
            # leave one out: drop the sample without which the others agree best (the
            # slowed sample pulls a least-squares fit its way, so it is not always the
            # one the full fit predicts worst)
            best = min(range(len(kept)), key=lambda i: self._worst_error(kept[:i] + kept[i + 1 :]))
            self.dropped.append(kept.pop(best))
        self._prior_gram, self._prior_rhs = self._prior_of(kept)
        self.seeded = bool(kept)
        return self.refit()

    def _worst_error(self, samples: Sequence[tuple[StepShape, float]]) -> float:
        """The largest |log(predicted / measured)| of a fit to `samples` alone."""
        fit = self._fit(*self._prior_of(samples))
        return max(abs(math.log(max(fit.predict(shape), 1e-12) / seconds)) for shape, seconds in samples)

    def _prior_of(self, samples: Sequence[tuple[StepShape, float]]) -> tuple[list[list[float]], list[float]]:
        n = len(TERMS)
        gram, rhs = [[0.0] * n for _ in range(n)], [0.0] * n
        for shape, seconds in samples:
            self._accumulate(gram, rhs, self._scaled(shape), seconds, self.prior_weight / len(samples))
        return gram, rhs

    @staticmethod
    def _fit(gram: list[list[float]], rhs: list[float]) -> Coefficients:
        n = len(TERMS)
        regular = [[gram[i][j] + (_RIDGE if i == j else 0.0) for j in range(n)] for i in range(n)]
        w = nonnegative_least_squares(regular, rhs)
        return Coefficients(*(wi / s for wi, s in zip(w, _SCALES, strict=True)))

    def observe(self, shape: StepShape, seconds: float, refit: bool = True) -> None:
        if shape.is_empty or seconds <= 0:
            return
        weight = 1.0
        if self.ready:  # Huber: a residual past half the prediction counts as if it were that
            predicted = self.coefficients.predict(shape)
            if shape.prefill_tokens and shape.decode_tokens and predicted > 0:
                self._mixed_ratios.append(seconds / predicted)
            limit = max(0.5 * predicted, 1e-4)
            residual = abs(seconds - predicted)
            if residual > limit:
                weight = limit / residual
        n = len(TERMS)
        for i in range(n):
            self._rhs[i] *= self.decay
            row = self._gram[i]
            for j in range(n):
                row[j] *= self.decay
        self.steps_seen += 1
        self._accumulate(self._gram, self._rhs, self._scaled(shape), seconds, weight)
        if refit:
            self.refit()

    def refit(self) -> Coefficients:
        n = len(TERMS)
        gram = [[self._gram[i][j] + self._prior_gram[i][j] for j in range(n)] for i in range(n)]
        rhs = [self._rhs[i] + self._prior_rhs[i] for i in range(n)]
        self.coefficients = self._fit(gram, rhs)
        return self.coefficients

    def predict(self, shape: StepShape) -> float:
        return self.coefficients.predict(shape)

    def margin(self, quantile: float = MARGIN_QUANTILE) -> float:
        """How much longer than predicted recent mixed steps ran (their `quantile` of
        measured / predicted, at least 1). A linear fit is right on average, so about half
        of the steps that carry prefill beside decodes overrun it (the prefill and the
        decodes contend for the same cores and caches); the step budget plans prefill
        within target / margin so those steps, whose length every decoding request waits
        for, stay within the target. Decode-only steps are left out: they are planned
        whole whatever they cost."""
        if len(self._mixed_ratios) < MARGIN_MIN_STEPS:
            return 1.0
        ratios = sorted(self._mixed_ratios)
        q = ratios[min(len(ratios) - 1, int(quantile * len(ratios)))]
        return min(MAX_MARGIN, max(1.0, q))
