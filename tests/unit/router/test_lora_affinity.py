"""The routing decision for LoRA adapters, from the pods' real /metrics text: the pods
where the adapter is active first, else pods with a free slot, else the usual rule; the
base model and unknown names are routed as without adapters."""

from __future__ import annotations

import collections

import pytest
from llmservice.router.endpoints import Endpoint
from llmservice.router.loads import parse_load, parse_requests
from llmservice.router.lora_info import parse_lora_info
from llmservice.router.pod_load import PodLoad
from llmservice.router.pool import PodPool
from llmservice.router.routing import (
    LORA_AFFINITY,
    LORA_SLOT,
    PREFIX,
    SPILL,
    Choice,
    Ring,
    choose,
    route,
)

from tests.unit.router.lora_metrics_text import server_metrics

PODS = ["pod-a", "pod-b", "pod-c"]
ADAPTERS = frozenset({"sql", "chat", "poem"})
KEYS = [f"prompt {i}".encode() for i in range(60)]


def scraped(text: str, served: frozenset[str] = ADAPTERS) -> PodLoad:
    """A pod's record as the pool builds it from one scrape of `text` (and /v1/models)."""
    info = parse_lora_info(text)
    running, waiting = parse_requests(text)
    active = (info.active or frozenset()) if info else frozenset()
    return PodLoad(running + waiting, waiting, active, info.max_lora if info else 0,
                   served if info else frozenset())  # fmt: skip


def picks(loads: dict[str, PodLoad], model: str, **kw) -> collections.Counter:
    return collections.Counter(
        (c.pod, c.reason) for k in KEYS if (c := route(PODS, loads, model, k, 1.25, **kw))
    )


def test_the_pod_where_the_adapter_is_active_takes_all_its_requests():
    loads = {
        "pod-a": scraped(server_metrics(running=("chat",), max_loras=1)),
        "pod-b": scraped(server_metrics(1, running=("sql",), max_loras=2)),
        "pod-c": scraped(server_metrics(max_loras=2)),
    }
    assert picks(loads, "sql") == {("pod-b", LORA_AFFINITY): len(KEYS)}
    waiting = dict(loads, **{"pod-c": scraped(server_metrics(waiting=("poem",), max_loras=2))})
    assert picks(waiting, "poem") == {("pod-c", LORA_AFFINITY): len(KEYS)}


def test_active_on_several_pods_the_ring_chooses_among_them():
    loads = {
        "pod-a": scraped(server_metrics(running=("sql",), max_loras=2)),
        "pod-b": scraped(server_metrics(max_loras=2)),
        "pod-c": scraped(server_metrics(running=("sql", "chat"), max_loras=2)),
    }
    got = picks(loads, "sql")
    assert set(got) == {("pod-a", LORA_AFFINITY), ("pod-c", LORA_AFFINITY)}
    for k in KEYS:  # within the two: the ring's prefix rule, as without adapters
        assert (
            route(PODS, loads, "sql", k, 1.25).pod
            == choose(Ring(PODS), k, {}, 1.25, exclude={"pod-b"}).pod
        )


def test_active_nowhere_the_pods_with_a_free_slot():
    loads = {
        "pod-a": scraped(server_metrics(running=("chat",), max_loras=1)),  # full
        "pod-b": scraped(server_metrics(running=("sql",), max_loras=2)),  # one slot free
        "pod-c": scraped(server_metrics(max_loras=1)),  # one slot free
    }
    got = picks(loads, "poem")
    assert set(got) == {("pod-b", LORA_SLOT), ("pod-c", LORA_SLOT)}


def test_no_pod_holds_it_and_none_has_a_slot_the_usual_rule():
    loads = {
        p: scraped(server_metrics(running=(f"x{i}",), max_loras=1)) for i, p in enumerate(PODS)
    }
    for k in KEYS:
        got = route(PODS, loads, "poem", k, 1.25)
        want = choose(Ring(PODS), k, {}, 1.25)
        assert (got.pod, got.reason, got.adapter) == (want.pod, PREFIX, "poem")


@pytest.mark.parametrize("model", ["base", "no-such-model", None])
def test_the_base_model_and_unknown_names_are_routed_as_without_adapters(model):
    loads = {
        "pod-a": scraped(server_metrics(running=("chat",), max_loras=1)),
        "pod-b": scraped(server_metrics(running=("sql",), max_loras=2)),
        "pod-c": scraped(server_metrics(max_loras=None, waiting_requests=1)),
    }
    requests = {p: s.requests for p, s in loads.items()}
    for k in KEYS:
        got = route(PODS, loads, model, k, 1.25)
        assert got == choose(Ring(PODS), k, requests, 1.25)
        assert got.adapter is None
    # the pod whose one slot holds another adapter still gets its share
    assert {route(PODS, loads, model, k, 1.25).pod for k in KEYS} == {"pod-a", "pod-b"}


def test_a_pod_without_lora_info_is_never_a_free_slot():
    loads = {
        "pod-a": scraped(server_metrics(running=("chat",), max_loras=1)),
        "pod-b": scraped(server_metrics(max_loras=None)),
        "pod-c": scraped(server_metrics(max_loras=None)),
    }
    got = route(PODS, loads, "chat", KEYS[0], 1.25)
    assert (got.pod, got.reason) == ("pod-a", LORA_AFFINITY)
    poem = {route(PODS, loads, "poem", k, 1.25).reason for k in KEYS}
    assert poem <= {PREFIX, SPILL}  # no slot anywhere: the usual rule


def test_a_queueing_adapter_pod_spreads_to_free_slots_but_never_evicts():
    queueing = {
        "pod-a": scraped(server_metrics(8, running=("sql",), max_loras=2, waiting_requests=3)),
        "pod-b": scraped(server_metrics(6, max_loras=2)),  # a free slot
        "pod-c": scraped(server_metrics(running=("chat",), max_loras=1)),  # full, idle
    }
    assert picks(queueing, "sql") == {("pod-b", LORA_SLOT): len(KEYS)}
    no_free = dict(queueing, **{"pod-b": scraped(server_metrics(running=("poem",), max_loras=1))})
    assert picks(no_free, "sql") == {("pod-a", LORA_AFFINITY): len(KEYS)}
    # busy but admitting everything (nothing waiting): affinity holds at any load
    busy = dict(queueing, **{"pod-a": scraped(server_metrics(30, running=("sql",), max_loras=2))})
    assert picks(busy, "sql") == {("pod-a", LORA_AFFINITY): len(KEYS)}


def test_failed_pods_are_left_out_first():
    loads = {
        "pod-a": scraped(server_metrics(running=("sql",), max_loras=2)),
        "pod-b": scraped(server_metrics(running=("chat",), max_loras=1)),
        "pod-c": scraped(server_metrics(max_loras=2)),
    }
    got = route(PODS, loads, "sql", KEYS[0], 1.25, exclude={"pod-a"})
    assert (got.pod, got.reason) == ("pod-c", LORA_SLOT)
    assert route(PODS, loads, "sql", KEYS[0], 1.25, exclude=PODS) is None


def test_the_pool_counts_its_own_requests_in_flight_as_active_adapters():
    """Between scrapes, a burst for an adapter stays on the pod it was first sent to."""
    pool = PodPool()
    pool.update({p: Endpoint(p, f"http://{p}") for p in PODS})
    for pod in PODS:
        text = server_metrics(max_loras=2)
        pool.set_scraped(pod, parse_load(text), parse_lora_info(text))
        pool.set_served(pod, ADAPTERS)
    first = pool.pick(KEYS[0], "prefix", 1.25, model="poem")
    assert first.reason == LORA_SLOT and first.adapter == "poem"
    pool.started(first.pod, first.adapter)
    for k in KEYS[1:20]:
        assert pool.pick(k, "prefix", 1.25, model="poem") == Choice(
            first.pod, LORA_AFFINITY, "poem"
        )
    pool.finished(first.pod, first.adapter)
    assert pool.pod_loads()[first.pod].active_adapters == frozenset()


def test_the_pool_keeps_an_idle_pods_adapters_and_learns_adapter_names():
    pool = PodPool()
    pool.update({p: Endpoint(p, f"http://{p}") for p in PODS})
    scrapes = {"pod-a": server_metrics(running=("sql",), max_loras=1),
               "pod-b": server_metrics(max_loras=1), "pod-c": server_metrics(max_loras=None)}  # fmt: skip
    for pod, text in scrapes.items():
        pool.set_scraped(pod, parse_load(text), parse_lora_info(text))
    # known as an adapter because it ran on pod-a (no /v1/models read yet)
    assert pool.pick(KEYS[0], "prefix", 1.25, model="sql").pod == "pod-a"
    idle = server_metrics(max_loras=1)
    pool.set_scraped("pod-a", parse_load(idle), parse_lora_info(idle))
    assert pool.pod_loads()["pod-a"].active_adapters == {"sql"}
    # "chat" is an adapter only once a /v1/models lists it: then pod-b's free slot
    assert pool.pick(KEYS[0], "prefix", 1.25, model="chat").adapter is None
    pool.set_served("pod-b", frozenset({"sql", "chat"}))
    assert {pool.pick(k, "prefix", 1.25, model="chat").pod for k in KEYS} == {"pod-b"}
