"""The router as an endpoint picker: a real grpc.aio ext-proc server and a real gRPC client
that streams ProcessingRequests as Envoy does (headers, body chunks, end_of_stream, then
the response phases), in front of fake pods that report their load on /metrics.

Checked against the endpoint-picker protocol: the `x-gateway-destination-endpoint` header
and the `envoy.lb` dynamic metadata name the same `ip:port`, the pod the router's policy
picks (least-loaded, the same pod for the same prefix); the subset hint restricts the
choice; no eligible pod is an ImmediateResponse 503; the full-duplex body goes back
unchanged. The round trips send the request on to the named pod, as the gateway would.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import json_format, struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmservice.router.endpoints import Endpoint
from llmservice.router.ext_proc import ExtProcServer, PoolPicker
from llmservice.router.loads import scrape_once
from llmservice.router.pool import PodPool
from llmservice.router.proxy import RouterConfig

from tests.support.ports import free_port
from tests.unit.router.fake_pods import FakePod
from tests.unit.router.lora_metrics_text import server_metrics

Mode = processing_mode_pb2.ProcessingMode
SYSTEM = "You are a terse assistant for a shipping company. " * 30  # ~1500 chars
BIN = Path(sys.executable).parent / "llmservice"


def chat(user: str, system: str = SYSTEM) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": user}]}  # fmt: skip


def headers_message(
    mode: int | None = Mode.FULL_DUPLEX_STREAMED,
    end_of_stream: bool = False,
    subset: list[str] | None = None,
    path: str = "/v1/chat/completions",
) -> pb.ProcessingRequest:
    header_map = base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode())
        for k, v in ((":method", "GET" if end_of_stream else "POST"), (":path", path),
                     (":authority", "gateway"), ("content-type", "application/json"))
    ])  # fmt: skip
    request = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=header_map, end_of_stream=end_of_stream)
    )
    if mode is not None:
        request.protocol_config.request_body_mode = mode
        request.protocol_config.response_body_mode = mode
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({"x-gateway-destination-endpoint-subset": subset})
        request.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    return request


def body_messages(body: bytes, chunks: int = 2) -> list[pb.ProcessingRequest]:
    size = max(1, -(-len(body) // chunks))
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    return [
        pb.ProcessingRequest(request_body=pb.HttpBody(body=part, end_of_stream=i == len(parts) - 1))
        for i, part in enumerate(parts)
    ]


async def exchange(
    stub: pb_grpc.ExternalProcessorStub, messages: list[pb.ProcessingRequest]
) -> list[pb.ProcessingResponse]:
    """Send every message, close the sending side, collect every answer to the end."""
    call = stub.Process()
    for m in messages:
        await call.write(m)
    await call.done_writing()
    out = []
    while (response := await call.read()) is not grpc.aio.EOF:
        out.append(response)
    return out


def destination(response: pb.ProcessingResponse) -> tuple[str, str]:
    """(the header the picker sets, the envoy.lb metadata value) of a headers/body answer."""
    phase = response.WhichOneof("response")
    common = getattr(response, phase).response
    (option,) = common.header_mutation.set_headers
    assert option.header.key == "x-gateway-destination-endpoint"
    assert option.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert common.clear_route_cache
    metadata = json_format.MessageToDict(response.dynamic_metadata)
    return option.header.raw_value.decode(), metadata["envoy.lb"]["x-gateway-destination-endpoint"]


async def with_picker(
    pods: list[FakePod],
    body: Callable[[pb_grpc.ExternalProcessorStub, PodPool, ExtProcServer], Awaitable[Any]],
    config: RouterConfig | None = None,
) -> Any:
    for pod in pods:
        await pod.start()
    pool = PodPool()
    pool.update({p.name: Endpoint(p.name, p.url) for p in pods})
    async with aiohttp.ClientSession() as session:
        await scrape_once(session, pool, timeout=5)
    server = await ExtProcServer(
        PoolPicker(pool, config or RouterConfig()), "chat", "127.0.0.1", 0
    ).start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            return await body(pb_grpc.ExternalProcessorStub(channel), pool, server)
    finally:
        await server.stop(0)
        for pod in pods:
            await pod.stop()


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def address(pod: FakePod) -> str:
    return f"127.0.0.1:{pod.port}"


def test_round_trip_full_duplex_names_a_pod_that_then_answers_the_request():
    pods = [FakePod("a"), FakePod("b"), FakePod("c")]
    payload = json.dumps(chat("Where is parcel 7?") | {"stream": True}).encode()

    async def body(stub, pool: PodPool, _) -> dict[str, Any]:
        call = stub.Process()
        await call.write(headers_message())
        for m in body_messages(payload, chunks=3):
            await call.write(m)
        head, echoed = await call.read(), await call.read()
        in_flight = dict(pool.in_flight)
        header, meta = destination(head)
        # The gateway sends the (echoed) body to the named endpoint.
        returned = echoed.request_body.response.body_mutation.streamed_response
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://{header}/v1/chat/completions", data=returned.body) as r:
                sse = await r.read()
                content_type = r.headers["Content-Type"]
        await call.write(pb.ProcessingRequest(response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(
                key=":status", raw_value=b"200")]))))  # fmt: skip
        continued = await call.read()
        await call.write(
            pb.ProcessingRequest(response_body=pb.HttpBody(body=sse, end_of_stream=True))
        )
        passed = await call.read()
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        return {
            "head": head, "header": header, "meta": meta, "returned": returned,
            "in_flight": in_flight, "after": dict(pool.in_flight), "sse": sse,
            "content_type": content_type, "continued": continued, "passed": passed,
        }  # fmt: skip

    out = run(with_picker(pods, body))
    assert out["head"].WhichOneof("response") == "request_headers"
    assert out["header"] == out["meta"]
    (served,) = [p for p in pods if address(p) == out["header"]]
    assert served.requests == 1 and sum(p.requests for p in pods) == 1
    assert out["content_type"] == "text/event-stream" and b"data: [DONE]" in out["sse"]
    assert out["returned"].body == payload and out["returned"].end_of_stream
    assert out["in_flight"] == {served.name: 1} and out["after"] == {}  # released at the end
    assert out["continued"].WhichOneof("response") == "response_headers"
    streamed = out["passed"].response_body.response.body_mutation.streamed_response
    assert streamed.body == out["sse"] and streamed.end_of_stream


def test_the_least_loaded_pod_is_named_when_the_prefix_owner_is_above_the_bound():
    pods = [FakePod("busy-1", running=6), FakePod("idle", running=0), FakePod("busy-2", running=6)]

    async def body(stub, pool: PodPool, _) -> list[str]:
        picked = []
        for i in range(6):
            payload = json.dumps(chat(f"question {i}", system=f"prompt {i} " * 200)).encode()
            answers = await exchange(stub, [headers_message(), *body_messages(payload)])
            picked.append(destination(answers[0])[0])
        return picked

    assert run(with_picker(pods, body)) == [address(pods[1])] * 6


def test_the_same_long_prefix_gets_the_same_pod_and_prefixes_spread():
    pods = [FakePod("a"), FakePod("b"), FakePod("c")]

    async def body(stub, pool: PodPool, _) -> tuple[set[str], set[str]]:
        same, spread = set(), set()
        for i in range(5):
            payload = json.dumps(chat(f"question {i}")).encode()
            answers = await exchange(stub, [headers_message(), *body_messages(payload)])
            same.add(destination(answers[0])[0])
        for i in range(12):
            payload = json.dumps(chat("same question", system=f"system {i} " * 100)).encode()
            answers = await exchange(stub, [headers_message(), *body_messages(payload)])
            spread.add(destination(answers[0])[0])
        return same, spread

    same, spread = run(with_picker(pods, body))
    assert len(same) == 1 and same <= {address(p) for p in pods}
    assert len(spread) >= 2


def test_no_pod_is_an_immediate_503_and_the_subset_hint_limits_the_choice():
    pods = [FakePod("a"), FakePod("b"), FakePod("c")]
    payload = json.dumps(chat("hello")).encode()

    async def body(stub, pool: PodPool, _) -> dict[str, Any]:
        only_b = [address(pods[1])]
        out: dict[str, Any] = {"subset": set()}
        for i in range(6):
            p = json.dumps(chat("q", system=f"s{i} " * 100)).encode()
            answers = await exchange(stub, [headers_message(subset=only_b), *body_messages(p)])
            out["subset"].add(destination(answers[0])[0])
        out["elsewhere"] = await exchange(
            stub, [headers_message(subset=["10.9.9.9:8000"]), *body_messages(payload)]
        )
        pool.update({})
        out["empty"] = await exchange(stub, [headers_message(), *body_messages(payload)])
        return out

    out = run(with_picker(pods, body))
    assert out["subset"] == {address(pods[1])}
    for answers in (out["elsewhere"], out["empty"]):
        (only,) = answers  # the immediate response ends the stream: nothing after it
        immediate = only.immediate_response
        assert immediate.status.code == 503
        error = json.loads(immediate.body)["error"]
        assert error["code"] == 503 and "no Ready replica" in error["message"]
        headers = {h.header.key: h.header.raw_value for h in immediate.headers.set_headers}
        assert headers["retry-after"] == b"5" and headers["content-type"] == b"application/json"
    assert "subset" in json.loads(out["elsewhere"][0].immediate_response.body)["error"]["message"]


def test_a_body_that_is_not_json_is_answered_400_and_counts_on_no_pod():
    pods = [FakePod("a"), FakePod("b")]

    async def body(stub, pool: PodPool, _) -> tuple[list[pb.ProcessingResponse], dict]:
        answers = await exchange(stub, [headers_message(), *body_messages(b'{"model": "m", ')])
        return answers, dict(pool.in_flight)

    answers, in_flight = run(with_picker(pods, body))
    (only,) = answers
    assert only.immediate_response.status.code == 400
    assert "not JSON" in json.loads(only.immediate_response.body)["error"]["message"]
    assert in_flight == {} and sum(p.requests for p in pods) == 0


class LoraPod(FakePod):
    """A fake pod that reports LoRA adapters active on it, as a server with --enable-lora."""

    active: tuple[str, ...] = ()

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=server_metrics(self.running, self.active, max_loras=1))


def test_a_lora_adapter_goes_to_the_pod_where_it_is_active_as_in_the_proxy():
    holder, other = LoraPod("holder"), LoraPod("other")
    holder.active = ("sql",)

    async def body(stub, pool: PodPool, _) -> dict[str, Any]:
        out: dict[str, set[str]] = {"sql": set(), "base": set()}
        for i in range(8):
            for model in ("sql", "base"):
                payload = chat(f"q{i}", system=f"schema {i} " * 100) | {"model": model}
                call = stub.Process()
                await call.write(headers_message())
                for m in body_messages(json.dumps(payload).encode()):
                    await call.write(m)
                out[model].add(destination(await call.read())[0])
                if model == "sql":  # counted on its pod until the stream ends
                    counted = {p: dict(c) for p, c in pool.adapters_in_flight.items()}
                await call.done_writing()
                while await call.read() is not grpc.aio.EOF:
                    pass
        return out | {"counted": counted, "after": dict(pool.adapters_in_flight)}

    out = run(with_picker([holder, other], body))
    assert out["sql"] == {address(holder)}
    assert out["base"] == {address(holder), address(other)}  # no adapter: the prefix ring
    assert out["counted"] == {"holder": {"sql": 1}} and out["after"] == {}


def test_buffered_mode_continues_the_headers_and_names_the_pod_in_the_body_answer():
    pods = [FakePod("a"), FakePod("b")]
    payload = json.dumps(chat("hi")).encode()

    async def body(stub, pool: PodPool, _) -> tuple[list, list]:
        buffered = await exchange(
            stub, [headers_message(Mode.BUFFERED), *body_messages(payload, chunks=1)]
        )
        duplex = await exchange(stub, [headers_message(), *body_messages(payload)])
        return buffered, duplex

    buffered, duplex = run(with_picker(pods, body))
    head, answer = buffered
    assert head.WhichOneof("response") == "request_headers"
    assert not head.request_headers.response.HasField("header_mutation")
    assert answer.WhichOneof("response") == "request_body"
    assert not answer.request_body.response.HasField("body_mutation")  # the body goes as is
    header, meta = destination(answer)
    assert header == meta == destination(duplex[0])[0]  # the same policy, the same pod


def test_a_request_without_a_body_and_envoy_without_protocol_config():
    pods = [FakePod("a", running=3), FakePod("b", running=0)]
    payload = json.dumps(chat("hi")).encode()

    async def body(stub, pool: PodPool, _) -> tuple[list, list]:
        no_body = await exchange(stub, [headers_message(end_of_stream=True, path="/v1/models")])
        unannounced = await exchange(stub, [headers_message(mode=None), *body_messages(payload)])
        return no_body, unannounced

    no_body, unannounced = run(with_picker(pods, body))
    (only,) = no_body
    assert destination(only)[0] == address(pods[1])  # no prompt: the least-loaded pod
    head, echoed = unannounced  # treated as full duplex, the inference extension's mode
    assert head.WhichOneof("response") == "request_headers"
    assert echoed.request_body.response.body_mutation.streamed_response.body == payload


def test_health_follows_readiness_and_liveness_stays_serving():
    async def body(stub, pool: PodPool, server: ExtProcServer) -> list[list[int]]:
        names = ["liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", ""]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)

            async def states() -> list[int]:
                return [
                    (await health.Check(health_pb2.HealthCheckRequest(service=n))).status
                    for n in names
                ]

            up = await states()
            await server.set_serving(False)
            return [up, await states()]

    up, down = run(with_picker([FakePod("a")], body))
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    assert up == [serving] * 4
    assert down == [serving, not_serving, not_serving, not_serving]


def test_cli_round_trip_router_ext_proc_beside_the_http_proxy(tmp_path: Path):
    """`llmservice router --ext-proc` as a process: the picker and the HTTP proxy agree on
    the pod for a prefix, the gateway's request reaches the named pod, SIGTERM exits 0."""
    pods = [FakePod("a"), FakePod("b"), FakePod("c")]
    payload = chat("Where is parcel 9?")

    async def scenario() -> dict[str, Any]:
        for pod in pods:
            await pod.start()
        http_port, grpc_port = free_port(), free_port()
        cmd = [str(BIN), "router", "--host", "127.0.0.1", "--port", str(http_port),
               "--ext-proc", "--ext-proc-port", str(grpc_port)]  # fmt: skip
        for pod in pods:
            cmd += ["--backend", pod.url]
        log = tmp_path / "router.log"
        proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                health = health_pb2_grpc.HealthStub(channel)
                deadline = time.monotonic() + 20
                while True:
                    assert proc.poll() is None, log.read_text()
                    try:
                        ready = await health.Check(
                            health_pb2.HealthCheckRequest(service="readiness"), timeout=1
                        )
                        if ready.status == health_pb2.HealthCheckResponse.SERVING:
                            break
                    except grpc.aio.AioRpcError:
                        pass
                    assert time.monotonic() < deadline, log.read_text()
                    await asyncio.sleep(0.1)
                stub = pb_grpc.ExternalProcessorStub(channel)
                raw = json.dumps(payload).encode()
                answers = await exchange(stub, [headers_message(), *body_messages(raw)])
                header, meta = destination(answers[0])
                async with aiohttp.ClientSession() as s:
                    async with s.post(f"http://{header}/v1/chat/completions", json=payload) as r:
                        via_gateway = (await r.json())["pod"]
                    async with s.post(
                        f"http://127.0.0.1:{http_port}/v1/chat/completions", json=payload
                    ) as r:
                        via_proxy = (await r.json())["pod"]
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 20)
            return {"header": header, "meta": meta, "gateway": via_gateway,
                    "proxy": via_proxy, "code": code}  # fmt: skip
        finally:
            if proc.poll() is None:
                proc.kill()
            for pod in pods:
                await pod.stop()

    out = run(scenario())
    (named,) = [p for p in pods if address(p) == out["header"]]
    assert out["header"] == out["meta"]
    assert out["gateway"] == named.name == out["proxy"]
    assert out["code"] == 0
