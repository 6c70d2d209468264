"""Load spec.adapters into every ready pod over HTTP, and unload the ones removed.

The pod template carries no adapter list (render.py renders `--enable-lora` and the
limits only), so editing spec.adapters never rolls the pods: this loop makes each ready
pod's `GET /v1/models` equal to the spec with vLLM's `POST /v1/load_lora_adapter` and
`/v1/unload_lora_adapter` (both engines have them; `VLLM_ALLOW_RUNTIME_LORA_UPDATING`
is set in the pods), with the API key of spec.engine.apiKeySecretRef when there is one.
A refused load (a 400 naming the problem) is kept per pod and adapter: an Event when it
first happens, `status.adapters[].error` and the AdaptersReady condition; the other
adapters and pods go on. A restarted pod lists nothing and gets every adapter again.

Like the autoscaler it is one asyncio task for the operator (no per-object timer: that
would put a finalizer on every LLMService); each LLMService with adapters is synced
every `interval` seconds, and at once when its adapters or its ready pods change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from llmservice.operator.adapter_diff import (
    PodAdapters,
    adapters_condition,
    adapters_status,
    loaded_adapters,
    plan_adapters,
)
from llmservice.operator.adapter_spec import served_path
from llmservice.operator.api_key import read_api_key
from llmservice.operator.autoscale_loop import Key, Sources, event_manifest
from llmservice.operator.kube import Kube, path_for
from llmservice.operator.publish import StatusPublisher
from llmservice.operator.scrape import PodTarget
from llmservice.operator.spec import LLMServiceSpec

log = logging.getLogger(__name__)

OWNER = "adapters"  # the publisher's name for the fields this loop owns
EVENT_FAILED = "AdapterLoadFailed"
EVENT_LOADED = "AdapterLoaded"
LIST_TIMEOUT_S = 5.0
LOAD_TIMEOUT_S = 300.0  # an hf:// adapter is downloaded inside the load call


def desired_paths(spec: LLMServiceSpec) -> dict[str, str]:
    """name -> the lora_path each pod should serve the adapter from."""
    return {a.name: served_path(a, spec.model.source, spec.engine.kind) for a in spec.adapters}


def _message(response: httpx.Response) -> str:
    """The server's error message (OpenAI's JSON shape, or vLLM's plain text)."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text.strip()[:500]}"
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else body.get("message") if isinstance(body, dict) else None
    return f"HTTP {response.status_code}: {message or response.text.strip()[:500]}"


async def sync_pod(
    client: httpx.AsyncClient,
    base_url: str,
    pod: str,
    desired: dict[str, str],
    api_key: str | None = None,
) -> PodAdapters:
    """Make one pod serve exactly `desired` (name -> lora_path); never raises for HTTP."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        listed = await client.get(f"{base_url}/v1/models", headers=headers, timeout=LIST_TIMEOUT_S)
        if listed.status_code != 200:
            return PodAdapters(pod, unreachable=f"GET /v1/models: {_message(listed)}")
        loaded = loaded_adapters(listed.json())
    except (httpx.HTTPError, ValueError) as exc:
        return PodAdapters(pod, unreachable=f"GET /v1/models: {type(exc).__name__}: {exc}")
    plan = plan_adapters(desired, loaded)
    errors: dict[str, str] = {}
    for name in plan.unload:
        answer = await _post(client, f"{base_url}/v1/unload_lora_adapter", {"lora_name": name}, headers)
        if answer is not None and answer.status_code in (200, 404):  # 404: gone already
            loaded.pop(name, None)
        elif name in desired:
            why = _message(answer) if answer is not None else "no answer"
            errors[name] = f"unloading the previous source: {why}"
    for name, path in plan.load:
        if name in loaded:
            continue  # its unload failed: reported above
        answer = await _post(client, f"{base_url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, headers)
        if answer is not None and answer.status_code == 200:
            loaded[name] = path
        else:
            errors[name] = _message(answer) if answer is not None else "no answer"
    return PodAdapters(pod, loaded, errors)


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, str], headers: dict[str, str]) -> httpx.Response | None:
    try:
        response = await client.post(url, json=body, headers=headers, timeout=LOAD_TIMEOUT_S)
    except httpx.HTTPError as exc:
        log.warning("POST %s %s: %s", url, body.get("lora_name"), exc)
        return None
    if response.status_code == 200:
        log.info("POST %s %s: %s", url, body.get("lora_name"), response.text.strip())
    return response


def pod_base_url(target: PodTarget) -> str:
    return f"http://{target.ip}:{target.port}"


async def sync_service(
    client: httpx.AsyncClient, targets: list[PodTarget], desired: dict[str, str], api_key: str | None
) -> list[PodAdapters]:
    """Every ready pod at once; one slow pod does not hold the others back."""
    ready = [t for t in targets if t.ready and t.ip and not t.terminating]
    return list(
        await asyncio.gather(*(sync_pod(client, pod_base_url(t), t.name, desired, api_key) for t in ready))
    )


@dataclass
class _State:
    fingerprint: tuple[Any, ...] = ()
    next_due: float = 0.0
    busy: bool = False
    reported: dict[tuple[str, str], str] = field(default_factory=dict)  # (pod, adapter) -> message


class AdapterSyncLoop:
    def __init__(
        self,
        kube: Callable[[], Kube],
        publisher: StatusPublisher,
        *,
        interval: float = 15.0,
        period: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._publisher = publisher
        self._interval = interval
        self._period = period
        self._clock = clock
        self._states: dict[Key, _State] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.task: asyncio.Task[None] | None = None

    async def run(self, sources: Sources) -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            try:
                while True:
                    self._pass(sources, client)
                    await asyncio.sleep(self._period)
            finally:
                for task in list(self._tasks):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    def _pass(self, sources: Sources, client: httpx.AsyncClient) -> None:
        now, seen = self._clock(), set()
        for key, body in sources.services():
            seen.add(key)
            spec = LLMServiceSpec.from_dict(body.get("spec") or {})
            state = self._states.get(key)
            if not spec.adapters:
                if state is not None:  # adapters removed: clear what this loop published
                    del self._states[key]
                    self._spawn(self._publish(key, body, sources, {"adapters": None}, []))
                continue
            state = self._states.setdefault(key, _State())
            ready = sorted(t.uid for t in sources.targets(key) if t.ready and t.ip and not t.terminating)
            fingerprint = (tuple(sorted(desired_paths(spec).items())), tuple(ready), spec.engine.api_key_secret)
            if state.busy or (now < state.next_due and fingerprint == state.fingerprint):
                continue
            state.busy, state.fingerprint, state.next_due = True, fingerprint, now + self._interval
            self._spawn(self._safely(key, body, spec, state, sources, client))
        for key in [k for k in self._states if k not in seen]:
            del self._states[key]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _safely(self, key: Key, body: dict[str, Any], spec: LLMServiceSpec, state: _State,
                      sources: Sources, client: httpx.AsyncClient) -> None:  # fmt: skip
        try:
            await self.sync(key, body, spec, state, sources, client)
        except Exception:
            log.exception("adapter sync of %s/%s failed; retrying next interval", *key)
        finally:
            state.busy = False

    async def sync(self, key: Key, body: dict[str, Any], spec: LLMServiceSpec, state: _State,
                   sources: Sources, client: httpx.AsyncClient) -> list[PodAdapters]:  # fmt: skip
        """One pass over one LLMService's ready pods, then its status and Events."""
        api_key = None
        if spec.engine.api_key_secret is not None:
            try:
                api_key = await asyncio.to_thread(read_api_key, self._kube(), key[0], spec.engine.api_key_secret)
            except ValueError as exc:
                fields = {"adapters": adapters_status(spec.adapters, desired_paths(spec), [])}
                failed = {"type": "AdaptersReady", "status": "False", "reason": "APIKeyUnavailable",
                          "message": f"cannot load adapters: {exc}"}  # fmt: skip
                await self._publish(key, body, sources, fields, [failed])
                return []
        desired = desired_paths(spec)
        pods = await sync_service(client, sources.targets(key), desired, api_key)
        for p in pods:
            for name, message in p.errors.items():
                if state.reported.get((p.pod, name)) != message:
                    await self._event(body, "Warning", EVENT_FAILED, f"adapter {name} on pod {p.pod}: {message}")
            for name in p.loaded:
                if (p.pod, name) in state.reported and name not in p.errors:
                    await self._event(body, "Normal", EVENT_LOADED, f"adapter {name} loaded on pod {p.pod}")
        state.reported = {(p.pod, n): m for p in pods for n, m in p.errors.items()}
        fields = {"adapters": adapters_status(spec.adapters, desired, pods)}
        await self._publish(key, body, sources, fields, [adapters_condition(spec.adapters, desired, pods)])
        return pods

    async def _publish(self, key: Key, body: dict[str, Any], sources: Sources,
                       fields: dict[str, Any], conditions: list[dict[str, str]]) -> None:  # fmt: skip
        self._publisher.set_extra(key, fields, conditions, owner=OWNER)
        await asyncio.to_thread(self._publisher.publish, key, lambda: sources.observe(key), self._emitter(body))

    def _emitter(self, body: dict[str, Any]) -> Callable[[str, str, str], None]:
        def emit(type_: str, reason: str, message: str) -> None:
            path = path_for("v1", "events", body["metadata"]["namespace"])
            try:
                self._kube().request("POST", path, body=event_manifest(body, type_, reason, message))
            except Exception as exc:  # an Event is worth a log line, not a failed sync
                log.warning("could not post the %s Event: %s", reason, exc)

        return emit

    async def _event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        await asyncio.to_thread(self._emitter(body), type_, reason, message)
