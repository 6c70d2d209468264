"""Scale from zero: writes replicas 1 only when it reads 0, at most once a second."""

from __future__ import annotations

import asyncio

from llmservice.router.wake import Waker


class FakeScaleApi:
    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.patches: list[dict] = []

    def get_namespaced_custom_object_scale(self, group, version, namespace, plural, name):
        assert (group, plural, namespace, name) == ("llmservice.dev", "llmservices", "ns", "chat")
        return {"spec": {"replicas": self.replicas}}

    def patch_namespaced_custom_object_scale(self, group, version, namespace, plural, name, body):
        self.patches.append(body)
        self.replicas = body["spec"]["replicas"]


async def poke_twice(waker: Waker) -> None:
    waker.poke()
    await asyncio.sleep(0.1)
    waker.poke()  # within MIN_INTERVAL_S: no second read
    await asyncio.sleep(0.1)


def test_wakes_from_zero_once():
    api, woken = FakeScaleApi(0), []
    waker = Waker("ns", "chat", on_wake=lambda: woken.append(1))
    waker._api = api
    asyncio.run(poke_twice(waker))
    assert api.patches == [{"spec": {"replicas": 1}}] and woken == [1]


def test_a_pod_on_its_way_is_left_alone():
    api = FakeScaleApi(1)  # replicas already 1: Pending or loading, keep waiting
    waker = Waker("ns", "chat")
    waker._api = api
    asyncio.run(poke_twice(waker))
    assert api.patches == []
