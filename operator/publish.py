"""Write an LLMService's status when something it depends on changed.

Status is recomputed on every relevant event (the LLMService itself, its Deployment, any
of its pods), from several kopf worker threads at once. A per-object lock and the last
status this process published keep the writes ordered and each condition change
announced exactly once as an Event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from llmservice.operator import reconcile as rc
from llmservice.operator.kube import ApiError, Kube, path_for
from llmservice.operator.spec import API_VERSION, PLURAL
from llmservice.operator.status import DeploymentView, PodView, changed_fields

Observed = tuple[dict[str, Any], DeploymentView | None, list[PodView]]


class StatusPublisher:
    def __init__(self, kube: Callable[[], Kube], options: rc.Options) -> None:
        self._kube = kube
        self._options = options
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._published: dict[
            tuple[str, str], tuple[str, dict[str, Any]]
        ] = {}  # key -> (uid, status)

    def _lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def publish(
        self,
        key: tuple[str, str],
        observe: Callable[[], Observed | None],
        emit: rc.Emit,
        observed_generation: int | None = None,
    ) -> dict[str, Any]:
        """Patch the status fields that changed; returns the patch (empty: nothing to do).

        `observe` runs under the object's lock, so the write that lands last was computed
        from the freshest view: a slower thread cannot overwrite newer facts with older ones.
        """
        with self._lock(key):
            observed = observe()
            if observed is None:
                return {}
            body, deployment, pods = observed
            uid = body["metadata"].get("uid", "")
            cached_uid, last = self._published.get(key, ("", {}))
            if cached_uid != uid:
                last = dict(body.get("status") or {})
            update = rc.status_for({**body, "status": last}, self._options, deployment, pods)
            patch = changed_fields(last, update.status)
            if (
                observed_generation is not None
                and last.get("observedGeneration") != observed_generation
            ):
                patch["observedGeneration"] = observed_generation
            if patch:
                path = path_for(API_VERSION, PLURAL, key[0], key[1]) + "/status"
                try:
                    self._kube().merge_patch(path, {"status": patch})
                except ApiError as exc:
                    if exc.status == 404:
                        return {}
                    raise
                self._published[key] = (uid, {**last, **patch})
                rc.emit_transitions(update, emit)
            return patch

    def forget(self, namespace: str, name: str) -> None:
        with self._guard:
            self._published.pop((namespace, name), None)
            self._locks.pop((namespace, name), None)
