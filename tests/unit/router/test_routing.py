"""The routing function, table-tested: affinity, the load bound, pods coming and going."""

from __future__ import annotations

import collections

import pytest
from llmservice.router.routing import NO_KEY, PREFIX, ROUND_ROBIN, SPILL, Ring, choose, round_robin

PODS = ["pod-a", "pod-b", "pod-c"]
KEYS = [f"system prompt {i}".encode() for i in range(200)]


def owners(ring: Ring, loads: dict[str, float] | None = None) -> dict[bytes, str]:
    return {k: choose(ring, k, loads or {}, 1.25).pod for k in KEYS}


def test_the_same_prefix_goes_to_the_same_pod():
    ring = Ring(PODS)
    first = owners(ring)
    assert owners(Ring(list(reversed(PODS)))) == first  # order of discovery does not matter
    assert all(choose(ring, k, {}, 1.25).reason == PREFIX for k in KEYS)


def test_keys_spread_over_every_pod():
    counts = collections.Counter(owners(Ring(PODS)).values())
    assert set(counts) == set(PODS)
    assert min(counts.values()) >= 200 / 3 * 0.5, counts


@pytest.mark.parametrize(
    ("loads", "expected", "reason"),
    [
        # owner idle, others busy: affinity wins
        ({"OWNER": 0, "X": 5, "Y": 5}, "OWNER", PREFIX),
        # owner at the mean: 1.25 x (6+1)/3 = 2.9 >= 2+1 ... just fits
        ({"OWNER": 2, "X": 2, "Y": 2}, "OWNER", PREFIX),
        # owner far above the mean: the least-loaded pod
        ({"OWNER": 8, "X": 1, "Y": 0}, "Y", SPILL),
        ({"OWNER": 8, "X": 0, "Y": 3}, "X", SPILL),
    ],
)
def test_load_bound_spills_to_the_least_loaded(loads, expected, reason):
    ring = Ring(PODS)
    key = KEYS[0]
    owner = choose(ring, key, {}, 1.25).pod
    others = [p for p in ring.walk(0) if p != owner]
    names = {"OWNER": owner, "X": others[0], "Y": others[1]}
    got = choose(ring, key, {names[k]: v for k, v in loads.items()}, 1.25)
    assert (got.pod, got.reason) == (names[expected], reason)


def test_a_spilled_prefix_keeps_going_to_the_same_second_pod():
    ring = Ring(PODS)
    key = KEYS[3]
    owner = choose(ring, key, {}, 1.25).pod
    busy = {owner: 10.0}
    picks = {choose(ring, key, busy, 1.25).pod for _ in range(5)}
    assert len(picks) == 1 and owner not in picks


def test_a_pod_leaving_moves_only_its_own_keys():
    before = owners(Ring(PODS))
    after = owners(Ring(["pod-a", "pod-b"]))
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(before[k] == "pod-c" for k in moved)


def test_a_pod_joining_takes_keys_only_for_itself():
    before = owners(Ring(PODS))
    after = owners(Ring([*PODS, "pod-d"]))
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(after[k] == "pod-d" for k in moved)
    assert len(moved) < len(KEYS) / 2


def test_failed_pods_are_skipped_and_none_left_is_none():
    ring = Ring(PODS)
    key = KEYS[0]
    owner = choose(ring, key, {}, 1.25).pod
    other = choose(ring, key, {}, 1.25, exclude={owner})
    assert other is not None and other.pod != owner
    assert choose(ring, key, {}, 1.25, exclude=PODS) is None
    assert choose(Ring([]), key, {}, 1.25) is None


def test_no_key_is_least_loaded():
    got = choose(Ring(PODS), None, {"pod-a": 3, "pod-b": 0, "pod-c": 1}, 1.25)
    assert (got.pod, got.reason) == ("pod-b", NO_KEY)


def test_round_robin_cycles_in_name_order():
    picks = [round_robin(PODS, i).pod for i in range(6)]
    assert picks == PODS * 2
    assert round_robin(PODS, 0, exclude={"pod-a"}).reason == ROUND_ROBIN
    assert round_robin(PODS, 0, exclude=PODS) is None


def test_two_routers_with_the_same_view_agree():
    loads = {"pod-a": 2, "pod-b": 7, "pod-c": 1}
    r1, r2 = Ring(PODS), Ring(sorted(PODS))
    assert [choose(r1, k, loads, 1.25) for k in KEYS] == [choose(r2, k, loads, 1.25) for k in KEYS]
