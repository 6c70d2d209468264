"""The step cost model recovers known coefficients from synthetic step logs."""

from __future__ import annotations

import random

import pytest
from llmservice.server.engine.cost_model import (
    Coefficients,
    StepCostModel,
    StepShape,
    chunk_pairs,
    nonnegative_least_squares,
)

TRUE = Coefficients(fixed=0.020, prefill_token=2.5e-4, decode_token=1.2e-3, attended_pair=2e-7)


def random_step(rng: random.Random) -> StepShape:
    shape = StepShape()
    for _ in range(rng.randint(0, 48)):
        shape.add(1, rng.randint(10, 1500))
    for _ in range(rng.randint(0, 3)):
        shape.add(rng.randint(2, 600), rng.choice([0, 0, rng.randint(0, 1200)]))
    return shape if not shape.is_empty else StepShape.of([(1, 100)])


def test_pairs_count_every_query_key_pair():
    assert chunk_pairs(1, 99) == 100  # a decode at position 99 reads 100 keys
    assert chunk_pairs(4, 0) == 1 + 2 + 3 + 4
    assert chunk_pairs(3, 10) == 11 + 12 + 13
    shape = StepShape.of([(1, 99), (4, 0)])
    assert (shape.decode_tokens, shape.prefill_tokens, shape.attended_pairs) == (1, 4, 110)


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_fit_recovers_known_coefficients(noise):
    rng = random.Random(3)
    model = StepCostModel(decay=1.0)
    for _ in range(400):
        shape = random_step(rng)
        model.observe(shape, TRUE.predict(shape) * (1 + rng.gauss(0, noise)))
    got = model.coefficients
    tol = 1e-6 if noise == 0 else 0.12
    for name in ("fixed", "prefill_token", "decode_token", "attended_pair"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=tol), name


def test_decay_follows_a_change_of_machine():
    """Refit with decay: after the steps get 3x slower, the model follows within a few hundred steps."""
    rng = random.Random(5)
    model = StepCostModel(decay=0.98)
    slow = Coefficients(*(3 * c for c in TRUE.as_tuple()))
    for truth in (TRUE, slow):
        for _ in range(300):
            shape = random_step(rng)
            model.observe(shape, truth.predict(shape))
    probe = StepShape.of([(1, 500)] * 32 + [(256, 0)])
    assert model.predict(probe) == pytest.approx(slow.predict(probe), rel=0.02)


def test_seed_is_a_prior_the_online_fit_overrides():
    rng = random.Random(7)
    seeded = StepCostModel(decay=0.99)
    wrong = Coefficients(*(2 * c for c in TRUE.as_tuple()))
    seeded.seed([(s, wrong.predict(s)) for s in (random_step(rng) for _ in range(5))])
    assert seeded.ready and seeded.predict(StepShape.of([(64, 0)])) == pytest.approx(
        wrong.predict(StepShape.of([(64, 0)])), rel=0.01
    )
    for _ in range(600):
        shape = random_step(rng)
        seeded.observe(shape, TRUE.predict(shape))
    probe = StepShape.of([(1, 500)] * 16 + [(128, 0)])
    # the prior (worth 2 steps, never decayed) against ~100 decayed steps: a little bias left
    assert seeded.predict(probe) == pytest.approx(TRUE.predict(probe), rel=0.05)


def test_unseeded_model_is_not_ready_until_enough_steps():
    model = StepCostModel(min_observations=12)
    for i in range(11):
        model.observe(StepShape.of([(1, 10 + i)]), 0.01)
    assert not model.ready
    model.observe(StepShape.of([(1, 30)]), 0.01)
    assert model.ready


def test_a_slowed_step_counts_less_than_a_normal_one():
    """Huber weight: one step 20x slower (a noisy neighbour) moves the fit a little, not 20x."""
    rng = random.Random(9)
    model = StepCostModel(decay=1.0)
    for _ in range(100):
        shape = random_step(rng)
        model.observe(shape, TRUE.predict(shape))
    probe = random_step(rng)
    before = model.predict(probe)
    model.observe(probe, 20 * TRUE.predict(probe))
    assert model.predict(probe) < 1.1 * before


def test_coefficients_are_never_negative():
    # y = 1 - x: least squares wants a negative slope; the non-negative fit pins it at 0
    gram = [[2.0, 1.0], [1.0, 1.0]]  # x = (1,0) and (1,1)
    rhs = [1.0, 0.0]  # y = 1 at x=0, 0 at x=1
    w = nonnegative_least_squares(gram, rhs)
    assert w[1] == 0.0 and w[0] == pytest.approx(0.5)


def test_decay_out_of_range_is_refused():
    with pytest.raises(ValueError, match="decay 1.5"):
        StepCostModel(decay=1.5)


# the start-up profile's five shapes on CPU (step_profile.profile_shapes at P=64, N=8)
PROFILE = [
    StepShape.of([(64, 0)]),
    StepShape.of([(16, 0)]),
    StepShape.of([(1, 64)] * 8),
    StepShape.of([(1, 64)] * 2),
    StepShape.of([(1, 64)] * 8 + [(32, 0)]),
]


@pytest.mark.parametrize("slowed", range(len(PROFILE)))
def test_a_profile_step_slowed_by_something_else_is_left_out_of_the_prior(slowed):
    """One profile step 50x slower (a first-use compile, a noisy neighbour): it is dropped,
    and the prior is the other four, close to the truth instead of all on one term."""
    samples = [(s, TRUE.predict(s) * (50 if i == slowed else 1)) for i, s in enumerate(PROFILE)]
    model = StepCostModel()
    model.seed(samples)
    assert model.seeded and model.dropped == [samples[slowed]]
    for i, (shape, _) in enumerate(samples):
        if i != slowed:
            assert model.predict(shape) == pytest.approx(TRUE.predict(shape), rel=0.01)


def test_a_profile_with_no_consistent_core_seeds_nothing():
    """Two of five samples off (100x and 1/100): four points cannot agree either way."""
    samples = [(s, TRUE.predict(s)) for s in PROFILE]
    samples[0] = (PROFILE[0], TRUE.predict(PROFILE[0]) / 100)
    samples[2] = (PROFILE[2], TRUE.predict(PROFILE[2]) * 100)
    model = StepCostModel(min_observations=12)
    model.seed(samples)
    assert not model.seeded and not model.ready and len(model.dropped) == len(PROFILE)


def test_a_consistent_profile_is_kept_whole():
    model = StepCostModel()
    model.seed([(s, TRUE.predict(s) * f) for s, f in zip(PROFILE, (1.2, 0.9, 1.1, 1.0, 0.85), strict=True)])
    assert model.seeded and model.dropped == []


def test_the_margin_is_the_95th_percentile_of_mixed_steps_over_their_prediction():
    truth = Coefficients(fixed=0.01, prefill_token=1e-3, decode_token=2e-3, attended_pair=0.0)
    model = StepCostModel()
    model.seed([(StepShape(prefill_tokens=p, decode_tokens=d), truth.predict(StepShape(p, d)))
                for p, d in ((64, 0), (16, 0), (0, 8), (0, 2), (32, 8))])  # fmt: skip
    assert model.margin() == 1.0  # nothing seen yet
    mixed, decode_only = StepShape(prefill_tokens=40, decode_tokens=6), StepShape(decode_tokens=6)
    for i in range(60):
        model.observe(decode_only, 3.0 * truth.predict(decode_only), refit=False)  # not counted
        ratio = 1.3 if i % 10 else 1.6  # one step in ten runs long
        model.observe(mixed, ratio * model.predict(mixed), refit=False)
    assert model.margin() == pytest.approx(1.6)
    assert model.margin(0.5) == pytest.approx(1.3)  # the median mixed step
    for _ in range(64):  # the window forgets
        model.observe(mixed, 1.2 * model.predict(mixed), refit=False)
    assert model.margin() == pytest.approx(1.2)
    for _ in range(64):
        model.observe(mixed, 0.7 * model.predict(mixed), refit=False)
    assert model.margin() == 1.0  # never below 1
    for _ in range(64):
        model.observe(mixed, 5.0 * model.predict(mixed), refit=False)
    assert model.margin() == 2.0  # capped
