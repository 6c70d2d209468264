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
Pure Python: four unknowns, a 4x4 solve per refit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TERMS = ("fixed", "prefill_token", "decode_token", "attended_pair")
# Features are divided by these before fitting so the normal matrix is well conditioned.
_SCALES = (1.0, 1024.0, 64.0, float(1 << 20))
_RIDGE = 1e-9  # keeps the solve defined before every direction has been seen


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
        self.coefficients = Coefficients()

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
        where recent steps say nothing; where they do, they win)."""
        for shape, seconds in samples:
            w = self.prior_weight / len(samples)
            self._accumulate(self._prior_gram, self._prior_rhs, self._scaled(shape), seconds, w)
        self.seeded = bool(samples)
        return self.refit()

    def observe(self, shape: StepShape, seconds: float, refit: bool = True) -> None:
        if shape.is_empty or seconds <= 0:
            return
        weight = 1.0
        if self.ready:  # Huber: a residual past half the prediction counts as if it were that
            predicted = self.coefficients.predict(shape)
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
        gram = [
            [
                self._gram[i][j] + self._prior_gram[i][j] + (_RIDGE if i == j else 0.0)
                for j in range(n)
            ]
            for i in range(n)
        ]
        rhs = [self._rhs[i] + self._prior_rhs[i] for i in range(n)]
        w = nonnegative_least_squares(gram, rhs)
        self.coefficients = Coefficients(*(wi / s for wi, s in zip(w, _SCALES, strict=True)))
        return self.coefficients

    def predict(self, shape: StepShape) -> float:
        return self.coefficients.predict(shape)
