"""The Kubernetes API emulator: kmock's `KubernetesEmulator` plus real API semantics.

kmock provides the HTTP server, request parsing (resource, namespace, name,
subresource, action), discovery from its bundled resource list, the object store with
history, and its DSL for tests that want to intercept requests. This subclass routes
the object verbs to `Store` (store.py) instead of kmock's plain dict merging, adds PUT,
and serves lists and watches with resourceVersions, selectors, bookmarks and 410 Gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncIterator
from typing import Any

import kmock
import yaml
from kmock._internal import enums, rendering

from tests.support.store import ApiError, Change, Store, Watcher

BOOKMARK_INTERVAL = 5.0


class ApiEmulator(kmock.KubernetesEmulator):
    """`kmock.KubernetesEmulator` that behaves like kube-apiserver where tests need it.

    Write verbs always answer with an explicit `kmock.Response(status=...)`: kmock copies
    a returned Response's status onto the (shared) fallback reaction, so every write
    must set its own status or it would inherit the previous one.
    """

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.store = Store(self)
        self.bookmark_interval = BOOKMARK_INTERVAL
        self.closing = False  # set on shutdown: open watch streams end
        with warnings.catch_warnings():  # kmock reads its bundle with a deprecated call
            warnings.simplefilter("ignore", DeprecationWarning)
            self.resources.load_bundled()
        self.fallback[enums.method.PUT] << self._serve_put

    async def _handle(self, request: rendering.Request):  # type: ignore[no-untyped-def]
        # Skip KubernetesEmulator's own pre-dispatch mutation: Store does the writes.
        return await kmock.RawHandler._handle(self, request)

    # ------------------------------------------------------------ helpers

    @staticmethod
    def _body(request: rendering.Request) -> Any:
        if request.data is not None:
            return request.data
        if request.text.strip():
            try:
                return yaml.safe_load(request.text)
            except yaml.YAMLError as exc:
                raise ApiError(400, "BadRequest", f"cannot parse the body: {exc}") from exc
        raise ApiError(400, "BadRequest", "the request has no body")

    @staticmethod
    def _dry_run(request: rendering.Request) -> bool:
        return request.params.get("dryRun") == "All"

    @staticmethod
    def _content_type(request: rendering.Request) -> str:
        return request.headers.get("Content-Type", "application/merge-patch+json")

    def _resource(self, request: rendering.Request) -> kmock.resource:
        assert request.resource is not None
        return request.resource

    # ------------------------------------------------------------ verbs

    async def _serve_fetch(self, request: rendering.Request) -> dict[str, Any]:
        res = self._resource(request)
        obj = self.store.get(res, request.namespace, request.name or "")
        if request.subresource == "scale":
            return self.store.scale_of(self.store.kind(res), obj)
        return obj

    async def _serve_list(self, request: rendering.Request) -> dict[str, Any]:
        p = request.params
        return self.store.list(
            self._resource(request),
            request.namespace,
            p.get("labelSelector"),
            p.get("fieldSelector"),
        )

    async def _serve_create(self, request: rendering.Request) -> kmock.Response:
        body = self._body(request)
        created = self.store.create(
            self._resource(request), request.namespace, body, dry_run=self._dry_run(request)
        )
        return kmock.Response(status=201, payload=created)

    async def _serve_update(self, request: rendering.Request) -> kmock.Response:
        res, name = self._resource(request), request.name or ""
        body, content_type = self._body(request), self._content_type(request)
        is_apply = content_type.startswith("application/apply-patch")
        if is_apply and not request.params.get("fieldManager"):
            raise ApiError(
                400, "BadRequest", "PATCH with apply requires the fieldManager parameter"
            )
        if is_apply and request.subresource is None:
            if self.store.find(res, request.namespace, name) is None:
                body = dict(body)
                body.setdefault("metadata", {})["name"] = name
                created = self.store.create(res, request.namespace, body, self._dry_run(request))
                return kmock.Response(status=201, payload=created)
        patched = self.store.patch(
            res,
            request.namespace,
            name,
            body,
            content_type,
            request.subresource,
            self._dry_run(request),
        )
        return kmock.Response(status=200, payload=patched)

    async def _serve_put(self, request: rendering.Request) -> kmock.Response:
        body = self._body(request)
        replaced = self.store.replace(
            self._resource(request),
            request.namespace,
            request.name or "",
            body,
            request.subresource,
        )
        return kmock.Response(status=200, payload=replaced)

    async def _serve_delete(self, request: rendering.Request) -> kmock.Response:
        options = request.data if isinstance(request.data, dict) else {}
        grace = request.params.get("gracePeriodSeconds")
        deleted = self.store.delete(
            self._resource(request),
            request.namespace,
            request.name or "",
            {
                **options,
                **(
                    {"propagationPolicy": request.params["propagationPolicy"]}
                    if "propagationPolicy" in request.params
                    else {}
                ),
            },
            grace=int(grace) if grace is not None else None,
        )
        return kmock.Response(status=200, payload=deleted)

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        """A watch stream: initial state or the log since `resourceVersion`, then live."""
        yield b""  # send the headers now, as kmock's own watch does
        res = self._resource(request)
        kind = self.store.kind(res)
        p = request.params
        queue: asyncio.Queue[Change] = asyncio.Queue()
        watcher = Watcher(
            res, request.namespace, p.get("labelSelector"), p.get("fieldSelector"), queue.put_nowait
        )
        token = self.store.watch(watcher)
        try:
            since = p.get("resourceVersion")
            initial = not since or since == "0" or p.get("sendInitialEvents") == "true"
            sent_rv = self.store.rv
            if initial:
                for obj in self.store.list(
                    res, request.namespace, p.get("labelSelector"), p.get("fieldSelector")
                )["items"]:
                    yield {"type": "ADDED", "object": obj}
                if p.get("sendInitialEvents") == "true":
                    yield self._bookmark(kind, {"k8s.io/initial-events-end": "true"})
            else:
                changes = self.store.changes_since(res, int(since))
                if changes is None:
                    yield {
                        "type": "ERROR",
                        "object": {
                            "apiVersion": "v1",
                            "kind": "Status",
                            "metadata": {},
                            "status": "Failure",
                            "reason": "Expired",
                            "code": 410,
                            "message": f"too old resource version: {since}",
                        },
                    }
                    return
                for change in changes:
                    if change.rv <= sent_rv and (event := watcher.translate(change)):
                        yield event
            timeout = float(p["timeoutSeconds"]) if p.get("timeoutSeconds") else None
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            bookmarks = p.get("allowWatchBookmarks") == "true"
            next_bookmark = loop.time() + self.bookmark_interval
            transport = request._raw_request.transport if request._raw_request else None
            while deadline is None or loop.time() < deadline:
                if self.closing or (transport is not None and transport.is_closing()):
                    return  # the client went away (aiohttp does not cancel us) or we stop
                wait = min(self.bookmark_interval, 0.5)
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                try:
                    change = await asyncio.wait_for(queue.get(), timeout=max(wait, 0.001))
                except TimeoutError:
                    if bookmarks and loop.time() >= next_bookmark:
                        next_bookmark = loop.time() + self.bookmark_interval
                        yield self._bookmark(kind)
                    continue
                if change.rv > sent_rv and (event := watcher.translate(change)):
                    yield event
        finally:
            self.store.unwatch(token)

    def _bookmark(self, kind: Any, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        if annotations:
            meta["annotations"] = annotations
        return {
            "type": "BOOKMARK",
            "object": {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta},
        }


@contextlib.asynccontextmanager
async def serving(emulator: ApiEmulator | None = None) -> AsyncIterator[tuple[ApiEmulator, str]]:
    """Run an emulator on a free 127.0.0.1 port; yields it and its base URL."""
    emulator = emulator or ApiEmulator()
    async with emulator, kmock.Server(emulator) as server:
        try:
            yield emulator, str(server.url).rstrip("/")
        finally:
            emulator.closing = True
            await asyncio.sleep(0.6)  # let watch streams notice and finish
