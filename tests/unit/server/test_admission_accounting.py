"""The API's admission count: each admitted engine request is counted once, whether it
is still being tokenized (reserved) or already handed to the engine client (in flight).
Counting it twice turned a burst of exactly --max-waiting-requests into spurious 503s."""

from __future__ import annotations

import asyncio
import time

import pytest
from llmservice.server.api.engine_client import EngineClient
from llmservice.server.api.errors import APIError
from llmservice.server.api.serving import ClientDisconnected, ServerState, start_generation
from llmservice.server.config import EngineConfig
from llmservice.server.engine.sampling_params import SamplingParams

LIMIT = 8


class Inbox(list):
    put = list.append


class SilentClient:
    """An HTTP request whose client neither sends nor disconnects."""

    async def receive(self) -> dict:
        await asyncio.Event().wait()
        return {}


def make_state() -> ServerState:
    client = EngineClient(EngineConfig())  # never spawned: the test plays the engine
    client.inbox = Inbox()
    client._loop = asyncio.get_running_loop()
    return ServerState(
        engine=client, tokenizer=None, served_model_names=["m"], model_root="", max_model_len=64,
        scheduling_policy="fcfs", max_waiting_requests=LIMIT,
    )


async def submit_one(state: ServerState, tokenize_s: float):
    with state.admitted(1) as reservation:
        await asyncio.sleep(tokenize_s)  # tokenizing: counted as reserved
        return await start_generation(
            state, reservation, SilentClient(), [[1, 2, 3]], SamplingParams(max_tokens=4), 1, 0, time.monotonic(), "cmpl"
        )


async def burst_then_accept() -> None:
    state = make_state()
    client = state.engine
    # Staggered tokenization: some requests are registered while others still tokenize.
    tasks = [asyncio.create_task(submit_one(state, 0.001 * (i % 3))) for i in range(LIMIT)]
    await asyncio.sleep(0.05)
    assert all(not t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
    assert state.reserved == 0 and len(client.streams) == LIMIT and len(client.inbox) == LIMIT
    assert client.num_waiting_estimate + state.reserved == LIMIT
    with pytest.raises(APIError) as refused:
        state.admit(1)
    assert refused.value.status == 503 and f"{LIMIT} requests are waiting" in refused.value.message
    for stream in client.streams.values():  # the engine accepts them all
        stream.accepted.set_result(None)
    gens = [gen for _, gen in await asyncio.gather(*tasks)]
    for gen in gens:  # clients leave: every request aborted, nothing left counted
        gen.close()
    assert state.idle and client.num_waiting_estimate == 0


def test_a_burst_of_exactly_the_bound_is_admitted_and_counted_once():
    asyncio.run(burst_then_accept())


async def cancelled_while_waiting_for_the_engine() -> None:
    state = make_state()
    task = asyncio.create_task(submit_one(state, 0))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert state.idle and state.reserved == 0


def test_a_cancelled_submission_releases_everything():
    asyncio.run(cancelled_while_waiting_for_the_engine())


class LeavingClient:
    """An HTTP request whose client disconnects before the engine accepted it."""

    async def receive(self) -> dict:
        await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}


async def client_gone_before_acceptance() -> None:
    state = make_state()
    with state.admitted(1) as reservation:
        with pytest.raises(ClientDisconnected):  # not a CancelledError out of the ASGI app
            await start_generation(
                state, reservation, LeavingClient(), [[1, 2, 3]], SamplingParams(max_tokens=4), 1, 0,
                time.monotonic(), "cmpl",
            )  # fmt: skip
    assert state.idle and not state.engine.streams
    assert [type(m).__name__ for m in state.engine.inbox] == ["AddRequest", "AbortRequests"]


def test_a_client_gone_before_acceptance_is_a_disconnect_and_is_aborted():
    asyncio.run(client_gone_before_acceptance())
