"""The autoscaler's decision table (operator/autoscaler.py): pure, no cluster, no clock."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from llmservice.operator.autoscaler import (
    METRICS_AVAILABLE,
    NO_METRICS,
    NO_READY_PODS,
    AutoscalingPolicy,
    History,
    Observation,
    PodMetrics,
    decide,
    signal_answers,
)

ROOT = Path(__file__).resolve().parents[3]
POLICY = AutoscalingPolicy(enabled=True, min_replicas=1, max_replicas=10)


def pods(n: int, kv: float | None = 0.1, waiting: float | None = 0.0, preempt: float | None = 0.0):
    return tuple(PodMetrics(kv, waiting, preempt) for _ in range(n))


def observe(current: int, scraped=(), ready: int | None = None, pending: int = 0, failures=()):
    return Observation(
        current_replicas=current,
        ready_pods=len(scraped) + len(failures) if ready is None else ready,
        pending_pods=pending,
        scraped=tuple(scraped),
        scrape_failures=tuple(failures),
    )


def once(
    obs: Observation, policy: AutoscalingPolicy = POLICY, history: History | None = None, now=100.0
):
    return decide(policy, obs, history or History(), now)


# ----------------------------------------------------------------- the policy itself


def test_policy_defaults_match_the_crd():
    crd = yaml.safe_load((ROOT / "crds/llmservice.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = schema["properties"]["spec"]["properties"]["autoscaling"]["properties"]
    crd_defaults = {k: v["default"] for k, v in fields.items()}
    ours = AutoscalingPolicy.from_dict({})
    assert crd_defaults == {
        "enabled": ours.enabled,
        "minReplicas": ours.min_replicas,
        "maxReplicas": ours.max_replicas,
        "preemptionsPerMinutePerReplica": ours.preemptions_per_minute_per_replica,
        "kvCacheUsageTarget": ours.kv_cache_usage_target,
        "waitingRequestsPerReplica": ours.waiting_requests_per_replica,
        "scaleUpStabilizationSeconds": ours.scale_up_stabilization_seconds,
        "scaleDownStabilizationSeconds": ours.scale_down_stabilization_seconds,
        "intervalSeconds": ours.interval_seconds,
        "scaleToZeroAfterSeconds": ours.scale_to_zero_after_seconds,
        "scaleToZero": ours.scale_to_zero,
    }


def test_policy_reads_the_spec():
    p = AutoscalingPolicy.from_dict(
        {"enabled": True, "minReplicas": 2, "maxReplicas": 7, "kvCacheUsageTarget": 0.5,
         "intervalSeconds": 3, "scaleDownStabilizationSeconds": 20}
    )  # fmt: skip
    assert (p.enabled, p.min_replicas, p.max_replicas) == (True, 2, 7)
    assert (p.kv_cache_usage_target, p.interval_seconds) == (0.5, 3.0)
    assert p.scale_down_stabilization_seconds == 20.0
    assert p.preemptions_per_minute_per_replica == 5.0  # unset: default


# ----------------------------------------------------------------- each signal alone


@pytest.mark.parametrize(
    ("metrics", "signal", "expected"),
    [
        # preemptions per minute per replica, target 5: 12/min on one pod -> ceil(12/5) = 3
        (pods(1, preempt=12.0), "preemptions", 3),
        # KV usage, target 0.8: 0.95 on 2 pods -> ceil(2 x 0.95 / 0.8) = 3
        (pods(2, kv=0.95), "kvCacheUsage", 3),
        # waiting per replica, target 5: 22 waiting on each of 2 pods -> ceil(2 x 22 / 5) = 9
        (pods(2, waiting=22.0), "waitingRequests", 9),
    ],
)
def test_each_signal_alone_scales_up(metrics, signal, expected):
    d = once(observe(len(metrics), metrics))
    assert d.replicas == expected
    answers = {s.name: s.desired for s in d.signals}
    assert answers[signal] == expected
    assert all(v < expected for k, v in answers.items() if k != signal)
    assert d.winner is not None and d.winner.name == signal


def test_the_issues_example_reason():
    d = once(observe(1, pods(1, preempt=12.0)))
    assert d.replicas == 3
    assert d.reason == "preemptions 12.0/min/replica > 5 → 3 replicas"
    assert d.active and d.active_reason == METRICS_AVAILABLE


def test_reasons_name_each_signal():
    assert once(observe(2, pods(2, kv=0.95))).reason == "KV cache usage 0.95 > 0.8 → 3 replicas"
    assert (
        once(observe(2, pods(2, waiting=22.0))).reason
        == "waiting requests 22.0/replica > 5 → 9 replicas"
    )


# ----------------------------------------------------------------- combinations


def test_the_largest_answer_wins():
    # KV says 3, waiting says 4, preemptions say 6: six replicas, for the preemptions
    metrics = (PodMetrics(0.95, 8.0, 12.0), PodMetrics(0.95, 8.0, 18.0))
    d = once(observe(2, metrics))
    assert {s.name: s.desired for s in d.signals} == {
        "preemptions": 6,
        "kvCacheUsage": 3,
        "waitingRequests": 4,
    }
    assert d.replicas == 6
    assert d.reason.startswith("preemptions 15.0/min/replica > 5 → 6 replicas")


def test_a_tie_prefers_preemptions():
    d = once(observe(1, (PodMetrics(1.2, 0.0, 6.0),)))  # both say 2
    assert d.replicas == 2 and d.winner is not None and d.winner.name == "preemptions"


def test_a_signal_no_pod_reports_is_left_out():
    # The first scrape of a pod has no preemption rate yet (it needs two counter readings).
    answers = signal_answers(POLICY, observe(2, pods(2, kv=0.5, preempt=None)))
    assert [s.name for s in answers] == ["kvCacheUsage", "waitingRequests"]


def test_signals_average_over_the_pods_that_report_them():
    metrics = (PodMetrics(0.9, 0.0, None), PodMetrics(0.5, 0.0, 10.0))
    answers = {s.name: s for s in signal_answers(POLICY, observe(2, metrics))}
    assert answers["kvCacheUsage"].current == pytest.approx(0.7)
    assert answers["preemptions"].current == 10.0  # only the second pod has a rate yet
    assert answers["preemptions"].desired == 4  # ceil(2 x 10 / 5)


# ----------------------------------------------------------------- tolerance band


@pytest.mark.parametrize(
    ("kv", "expected"),
    [
        (0.80, 4),  # at target
        (0.87, 4),  # +8.75%: inside the band, no change (ceil would say 5)
        (0.73, 4),  # -8.75%: inside the band, no change (ceil would say 4 anyway)
        (0.89, 5),  # +11%: outside, ceil(4 x 1.1125) = 5
        (0.60, 4),  # -25% -> ceil(3.0) = 3 recommended, but scale-down waits for its window
    ],
)
def test_tolerance_band(kv, expected):
    d = once(observe(4, pods(4, kv=kv, waiting=None, preempt=None)))
    assert d.replicas == expected


def test_inside_the_band_the_answer_is_the_current_count():
    (kv,) = signal_answers(POLICY, observe(4, pods(4, kv=0.87, waiting=None, preempt=None)))
    assert kv.desired == 4
    assert "≈" in kv.describe(4)


# ----------------------------------------------------------------- clamping


def test_clamped_to_max_replicas():
    policy = AutoscalingPolicy(enabled=True, min_replicas=1, max_replicas=3)
    d = once(observe(1, pods(1, preempt=30.0)), policy)
    assert d.replicas == 3 and d.recommendation == 3
    assert d.reason == "preemptions 30.0/min/replica > 5 → 6 replicas, limited to maxReplicas 3"


def test_clamped_to_min_replicas():
    policy = AutoscalingPolicy(
        enabled=True, min_replicas=2, max_replicas=5, scale_down_stabilization_seconds=0
    )
    d = once(observe(3, pods(3)), policy)  # idle: the signals say 1
    assert d.recommendation == 2 and d.replicas == 2
    assert "limited to minReplicas 2" in d.reason


def test_spec_outside_new_bounds_follows_them_at_once():
    policy = AutoscalingPolicy(enabled=True, min_replicas=1, max_replicas=3)
    d = once(observe(6, pods(6, kv=0.8, waiting=None, preempt=None)), policy)  # no window yet
    assert d.replicas == 3
    assert "spec.replicas 6 is outside [1, 3]" in d.reason


# ----------------------------------------------------------------- jump to size


def test_jumps_straight_to_the_needed_size():
    # 1 -> 6 in one step when load says 6 (KubeAI #229 went one pod at a time)
    d = once(observe(1, pods(1, waiting=30.0)))
    assert d.replicas == 6
    assert d.reason == "waiting requests 30.0/replica > 5 → 6 replicas"


def test_scale_up_stabilization_waits_for_every_answer_to_be_higher():
    policy = AutoscalingPolicy(enabled=True, max_replicas=10, scale_up_stabilization_seconds=10)
    h = History()
    d = decide(policy, observe(1, pods(1, waiting=30.0)), h, 0.0)
    assert d.replicas == 1 and "scale-up waits" in d.reason  # window not covered yet
    d = decide(policy, observe(1, pods(1, waiting=12.0)), d.history, 5.0)
    assert d.replicas == 1
    d = decide(policy, observe(1, pods(1, waiting=20.0)), d.history, 10.0)
    assert d.replicas == 3  # the lowest answer of the last 10 s (12 waiting -> 3)


# ----------------------------------------------------------------- scale-down


def run(policy, steps, current, start_history=None):
    """Feed (time, observation-builder) steps; the spec follows each decision."""
    history = start_history or History()
    out = []
    for t, metrics in steps:
        d = decide(policy, observe(current, metrics(current)), history, t)
        history, current = d.history, d.replicas
        out.append(d)
    return out


def test_scale_down_waits_for_the_whole_window_then_halves():
    policy = AutoscalingPolicy(
        enabled=True, min_replicas=1, max_replicas=10, scale_down_stabilization_seconds=30
    )
    idle = lambda n: pods(n)  # noqa: E731  every signal says 1
    busy = lambda n: pods(n, kv=0.1, waiting=30.0 / n)  # noqa: E731  30 waiting -> 6

    decisions = run(policy, [(0, busy)] + [(t, idle) for t in range(5, 100, 5)], current=1)
    replicas = [d.replicas for d in decisions]
    # 6 at t=0; lower answers from t=5 on; the window (30 s) holds the 6 until t=35
    assert replicas[0] == 6
    assert replicas[1:7] == [6] * 6  # t=5..30: the t=0 answer (6) is still in the window
    assert replicas[7] == 3  # t=35: every answer of the last 30 s was 1 -> at most half
    assert replicas[8] == 2  # t=40: ceil(3/2)
    assert replicas[9] == 1
    assert "at most half per step" in decisions[7].reason
    assert decisions[7].reason.endswith("at most half per step: 3")


def test_scale_down_goes_to_the_highest_answer_of_the_window():
    policy = AutoscalingPolicy(
        enabled=True, min_replicas=1, max_replicas=10, scale_down_stabilization_seconds=10
    )
    h = History(since=-100.0, entries=((-3.0, 7),))
    d = decide(policy, observe(8, pods(8)), h, 0.0)  # now says 1; 3 s ago 7
    assert d.replicas == 7
    assert "the highest recommendation of the last 10s: 7" in d.reason


def test_no_scale_down_right_after_a_restart():
    """A fresh History has not covered the window: nothing goes down until it has."""
    policy = AutoscalingPolicy(enabled=True, scale_down_stabilization_seconds=300)
    d = once(observe(4, pods(4)), policy)
    assert d.replicas == 4 and d.recommendation == 1
    assert "scale-down waits until every recommendation of the last 300s is lower" in d.reason


def test_oscillating_load_does_not_flap():
    policy = AutoscalingPolicy(
        enabled=True, min_replicas=1, max_replicas=4, scale_down_stabilization_seconds=60
    )
    high = lambda n: pods(n, kv=1.0, waiting=None, preempt=None)  # noqa: E731
    low = lambda n: pods(n, kv=0.1, waiting=None, preempt=None)  # noqa: E731
    steps = [(t, high if (t // 5) % 2 == 0 else low) for t in range(0, 60, 5)]
    replicas = [d.replicas for d in run(policy, steps, current=1)]
    changes = [b for a, b in zip(replicas, replicas[1:], strict=False) if a != b]
    assert all(b > a for a, b in zip(replicas, replicas[1:], strict=False) if a != b), replicas
    assert replicas[-1] == 4 and len(changes) <= 2, replicas  # up, never down in the window


def test_zero_window_scales_down_at_once_but_by_half():
    policy = AutoscalingPolicy(
        enabled=True, min_replicas=1, max_replicas=10, scale_down_stabilization_seconds=0
    )
    d = once(observe(8, pods(8)), policy)
    assert d.replicas == 4


# ----------------------------------------------------------------- pending pods


def test_pending_pods_are_capacity_already_requested():
    # 3 asked for, 1 Ready (2 still loading); the Ready pod's load says 3: no extra scale-up
    d = once(observe(3, pods(1, preempt=12.0), pending=2))
    assert d.replicas == 3
    assert d.recommendation == 3
    assert "1 of 1 Ready pods scraped, 2 starting" in d.active_message


def test_pending_pods_are_not_idle():
    # Averaging the loaded Ready pod with two zero-load pending pods would say 1 -> 2;
    # the average is over scraped pods, so the answer stays ceil(1 x 18/5) = 4.
    d = once(observe(3, pods(1, preempt=18.0), pending=2))
    assert d.replicas == 4


def test_starting_pods_are_assumed_at_target_on_the_way_down():
    """3 asked for, 1 Ready, 2 still loading weights. The Ready pod is busy but inside
    its target (KV 0.88 of 0.95), and saw no preemption this interval. Judged alone it
    says 1; with the 2 starting pods counted at the target it says 3: nothing is removed
    before it ever served (the e2e run that found this scaled 3 -> 2 -> 1 mid-load)."""
    policy = AutoscalingPolicy(
        enabled=True, max_replicas=3, kv_cache_usage_target=0.95,
        scale_down_stabilization_seconds=0,
    )  # fmt: skip
    d = once(observe(3, pods(1, kv=0.88, waiting=4.0, preempt=0.0), pending=2), policy)
    assert d.replicas == 3
    assert {s.name: s.desired for s in d.signals}["kvCacheUsage"] == 3


def test_idle_ready_pods_still_give_up_starting_ones():
    policy = AutoscalingPolicy(enabled=True, scale_down_stabilization_seconds=0)
    d = once(observe(4, pods(1, kv=0.0), pending=3), policy)  # idle: 0 + 3 starting at target
    assert d.recommendation == 3 and d.replicas == 3


def test_pods_still_going_away_do_not_scale_back_up():
    """spec says 1 but the second pod is not gone yet: 2 Ready pods sharing one pod's
    load (KV 1.0 + 0.0 against 0.95) is within 10% of 1 replica, not 'ceil(1.05) = 2'."""
    policy = AutoscalingPolicy(enabled=True, kv_cache_usage_target=0.95)
    metrics = (PodMetrics(1.0, 0.0, 0.0), PodMetrics(0.0, 0.0, None))
    d = once(observe(1, metrics), policy)
    assert d.replicas == 1


def test_only_pending_pods_holds():
    d = once(observe(3, (), ready=0, pending=3))
    assert d.replicas == 3 and d.recommendation is None
    assert not d.active and d.active_reason == NO_READY_PODS
    assert "3 starting" in d.active_message


# ----------------------------------------------------------------- scrape failures


def test_a_failed_scrape_drops_that_pod_from_the_average():
    # 2 Ready pods; one answered with 12 preemptions/min, the other timed out. The answer
    # assumes the silent pod carries the average: ceil(2 x 12 / 5) = 5, not 3 (halved).
    d = once(observe(2, pods(1, preempt=12.0), ready=2, failures=("pod-b: timed out after 2s",)))
    assert d.replicas == 5
    assert d.active
    assert "1 of 2 Ready pods scraped; skipped pod-b: timed out after 2s" in d.active_message


def test_no_pod_scraped_holds_the_last_decision():
    history = History(since=0.0, entries=((50.0, 3),))
    d = once(
        observe(3, (), ready=2, failures=("a: HTTP 500", "b: timed out after 2s")), history=history
    )
    assert d.replicas == 3 and d.recommendation is None
    assert not d.active and d.active_reason == NO_METRICS
    assert "a: HTTP 500; b: timed out after 2s" in d.active_message
    assert d.history == history  # a held tick is no recommendation


def test_held_decision_still_enforces_bounds():
    policy = AutoscalingPolicy(enabled=True, min_replicas=2, max_replicas=4)
    d = once(observe(1, (), ready=0), policy)
    assert d.replicas == 2 and not d.active


def test_metrics_without_any_signal_hold():
    d = once(observe(2, pods(2, kv=None, waiting=None, preempt=None)))
    assert d.replicas == 2 and not d.active and d.active_reason == NO_METRICS
    assert "vllm:kv_cache_usage_perc" in d.active_message


def test_history_keeps_only_the_longest_window():
    policy = AutoscalingPolicy(enabled=True, scale_down_stabilization_seconds=10)
    h = History(since=0.0, entries=((0.0, 2), (50.0, 3), (95.0, 4)))
    d = decide(policy, observe(4, pods(4, kv=0.8, waiting=None, preempt=None)), h, 100.0)
    assert d.history.entries == ((95.0, 4), (100.0, 4))
    assert d.history.since == 0.0
