"""Scale to zero, table-tested: the idle clock, when 0 is due, and the condition."""

from __future__ import annotations

import pytest
from llmservice.operator import autoscale_zero as zero
from llmservice.operator.autoscaler import (
    AutoscalingPolicy,
    History,
    Observation,
    PodMetrics,
    decide,
)

POLICY = AutoscalingPolicy(
    enabled=True, min_replicas=0, max_replicas=3, scale_to_zero_after_seconds=60
)
IDLE_POD = zero.PodActivity("u1", running=0, waiting=0, requests_total=5)
OBS = Observation(current_replicas=1, ready_pods=1, scraped=(PodMetrics(0.0, 0.0, 0.0),))


def clock(*steps):
    """Feed (time, pods, replicas) steps through observe (one Ready pod per pod given)."""
    idle = None
    for t, pods, replicas in steps:
        idle = zero.observe(idle, pods, replicas, t, f"wall-{t}", ready=len(pods))
    return idle


def test_idle_for_the_window_goes_to_zero():
    idle = clock((0, [IDLE_POD], 1), (30, [IDLE_POD], 1), (61, [IDLE_POD], 1))
    decision = decide(POLICY, OBS, History(), 61)
    assert decision.replicas == 1  # the ordinary rules never go below 1
    out = zero.apply(POLICY, OBS, idle, decision, 61)
    assert out.replicas == 0 and "no request for 61s" in out.reason


@pytest.mark.parametrize(
    "busy",
    [
        zero.PodActivity("u1", running=1, waiting=0, requests_total=5),
        zero.PodActivity("u1", running=0, waiting=2, requests_total=5),
        zero.PodActivity("u1", running=0, waiting=0, requests_total=6),  # one finished in between
    ],
)
def test_any_request_restarts_the_clock(busy):
    after = zero.PodActivity("u1", running=0, waiting=0, requests_total=busy.requests_total)
    idle = clock((0, [IDLE_POD], 1), (50, [busy], 1), (70, [after], 1))
    assert idle.last_activity == 50 and idle.last_request_time == "wall-50"
    assert not zero.zero_due(POLICY, OBS, idle, 70)
    assert zero.zero_due(POLICY, OBS, idle, 111)


def test_the_window_starts_when_watching_starts_and_at_a_wake():
    assert not zero.zero_due(POLICY, OBS, clock((100, [IDLE_POD], 1)), 150)  # operator restart
    woken = clock((0, [], 0), (100, [], 0), (200, [], 1), (230, [IDLE_POD], 1))
    assert woken.last_activity == 230  # replicas left 0 at 200, its pod Ready at 230
    assert not zero.zero_due(POLICY, OBS, woken, 280) and zero.zero_due(POLICY, OBS, woken, 291)
    deployed = clock((0, [], 1), (100, [], 1), (150, [IDLE_POD], 1))  # loading 150 s, no traffic
    assert deployed.last_activity == 150


@pytest.mark.parametrize(
    ("policy", "obs"),
    [
        (AutoscalingPolicy(enabled=True, min_replicas=1, scale_to_zero_after_seconds=60), OBS),
        (AutoscalingPolicy(enabled=False, min_replicas=0, scale_to_zero_after_seconds=60), OBS),
        (POLICY, Observation(current_replicas=0, ready_pods=0)),  # already there
        (POLICY, Observation(current_replicas=1, ready_pods=1, pending_pods=1)),  # a wake under way
        (POLICY, Observation(current_replicas=1, ready_pods=0, pending_pods=1)),
        (
            POLICY,
            Observation(current_replicas=2, ready_pods=2, scrape_failures=("pod-b: timed out",)),
        ),
    ],
)
def test_never_to_zero(policy, obs):
    idle = clock((0, [IDLE_POD], obs.current_replicas))
    assert not zero.zero_due(policy, obs, idle, 10_000)


def test_condition_only_for_objects_that_may_scale_to_zero():
    idle = clock((0, [IDLE_POD], 1), (20, [IDLE_POD], 1))
    assert zero.condition(AutoscalingPolicy(enabled=True), 1, idle, 20) is None
    serving = zero.condition(POLICY, 1, idle, 20)
    assert (serving["status"], serving["reason"]) == ("False", "Serving")
    assert "idle for 20s of the 60s" in serving["message"]
    at_zero = zero.condition(POLICY, 0, idle, 90)
    assert (at_zero["type"], at_zero["status"], at_zero["reason"]) == (
        "ScaledToZero",
        "True",
        "Idle",
    )


SLEEPY = AutoscalingPolicy(
    enabled=True, min_replicas=0, max_replicas=3, scale_to_zero_after_seconds=60,
    scale_to_zero=zero.SLEEP,
)  # fmt: skip


def test_sleep_mode_keeps_the_replicas_and_sleeps_the_awake_pods_once_idle():
    idle = clock((0, [IDLE_POD], 1), (61, [IDLE_POD], 1))
    decision = decide(SLEEPY, OBS, History(), 61)
    assert zero.apply(SLEEPY, OBS, idle, decision, 61) == decision  # no pod goes away
    levels = {"u1": 0.0, "u2": 1.0, "u3": None}  # awake, asleep, not the bundled server
    assert zero.pods_to_sleep(SLEEPY, OBS, idle, 61, levels) == ("u1",)
    assert zero.pods_to_sleep(SLEEPY, OBS, idle, 59, levels) == ()  # the window has not passed
    assert zero.pods_to_sleep(POLICY, OBS, idle, 61, levels) == ()  # scaleToZero delete


def test_a_request_after_a_wake_restarts_the_window_before_sleeping_again():
    busy = zero.PodActivity("u1", running=0, waiting=0, requests_total=6)  # the router woke it
    idle = clock((0, [IDLE_POD], 1), (61, [IDLE_POD], 1), (90, [busy], 1))
    assert zero.pods_to_sleep(SLEEPY, OBS, idle, 120, {"u1": 0.0}) == ()
    assert zero.pods_to_sleep(SLEEPY, OBS, idle, 150, {"u1": 0.0}) == ("u1",)


def test_sleep_mode_condition_says_asleep_only_when_every_pod_sleeps():
    idle = clock((0, [IDLE_POD], 1), (70, [IDLE_POD], 1))
    asleep = zero.condition(SLEEPY, 1, idle, 70, zero.all_asleep({"u1": 1.0}))
    assert (asleep["status"], asleep["reason"]) == ("True", "Asleep")
    assert "router wakes a pod" in asleep["message"]
    half = zero.condition(SLEEPY, 2, idle, 70, zero.all_asleep({"u1": 1.0, "u2": 0.0}))
    assert (half["status"], half["reason"]) == ("False", "Serving")
    assert "before its pods sleep" in half["message"]
    assert not zero.all_asleep({})
