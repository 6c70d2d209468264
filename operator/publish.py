"""Write an LLMService's status when something it depends on changed.

Status is recomputed on every relevant event (the LLMService itself, its Deployment, any
of its pods), from several kopf worker threads at once. Requests for one object are
coalesced: one thread publishes while the others only leave a note and return (so a
burst of pod events cannot tie up kopf's whole thread pool waiting on a lock), and that
thread publishes again if notes arrived meanwhile. Each pass observes the indexes afresh,
so the write that lands last is computed from the freshest view. The last status this
process published is remembered so that each condition change becomes one Event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmservice.operator import reconcile as rc
from llmservice.operator.kube import ApiError, Kube, path_for
from llmservice.operator.spec import API_VERSION, PLURAL
from llmservice.operator.status import DeploymentView, PodView, changed_fields

Observed = tuple[dict[str, Any], DeploymentView | None, list[PodView]]
Key = tuple[str, str]


@dataclass
class _Request:
    observe: Callable[[], Observed | None]
    emit: rc.Emit
    observed_generation: int | None


class StatusPublisher:
    def __init__(self, kube: Callable[[], Kube], options: rc.Options) -> None:
        self._kube = kube
        self._options = options
        self._guard = threading.Lock()
        self._busy: set[Key] = set()
        self._pending: dict[Key, _Request] = {}
        self._published: dict[Key, tuple[str, dict[str, Any]]] = {}  # key -> (uid, status)
        # Fields other loops own (the autoscaler, the adapter sync): written with ours, one
        # merge patch; per object, per owner.
        self._extra: dict[Key, dict[str, tuple[dict[str, Any], list[dict[str, str]]]]] = {}

    def set_extra(
        self, key: Key, fields: dict[str, Any], conditions: list[dict[str, str]], owner: str = "autoscaler"
    ) -> None:
        """Status fields and conditions owned by someone else, included in every write;
        each owner's call replaces only that owner's fields and conditions."""
        with self._guard:
            self._extra.setdefault(key, {})[owner] = (dict(fields), list(conditions))

    def _merged_extra(self, key: Key) -> tuple[dict[str, Any], list[dict[str, str]]]:
        fields: dict[str, Any] = {}
        conditions: list[dict[str, str]] = []
        with self._guard:
            for owned_fields, owned_conditions in self._extra.get(key, {}).values():
                fields.update(owned_fields)
                conditions += owned_conditions
        return fields, conditions

    def publish(
        self,
        key: Key,
        observe: Callable[[], Observed | None],
        emit: rc.Emit,
        observed_generation: int | None = None,
    ) -> None:
        """Bring the object's status up to date now, or leave it to the thread doing so."""
        with self._guard:
            previous = self._pending.get(key)
            if previous is not None and observed_generation is None:
                observed_generation = previous.observed_generation
            self._pending[key] = _Request(observe, emit, observed_generation)
            if key in self._busy:
                return
            self._busy.add(key)
        try:
            while True:
                with self._guard:
                    request = self._pending.pop(key, None)
                    if request is None:
                        self._busy.discard(key)
                        return
                self._publish_once(key, request)
        except BaseException:
            with self._guard:
                self._busy.discard(key)
            raise

    def _publish_once(self, key: Key, request: _Request) -> dict[str, Any]:
        observed = request.observe()
        if observed is None:
            return {}
        body, deployment, pods = observed
        uid = body["metadata"].get("uid", "")
        cached_uid, last = self._published.get(key, ("", {}))
        if cached_uid != uid:
            last = dict(body.get("status") or {})
        extra, extra_conditions = self._merged_extra(key)
        generation = request.observed_generation
        # Conditions carry the generation a reconcile observed: a child's event (no
        # generation of its own) may arrive before the reconcile of a new spec, and must
        # not stamp the spec's new generation on conditions computed from the old rollout.
        stamped = generation if generation is not None else last.get("observedGeneration")
        meta = body["metadata"] if stamped is None else {**body["metadata"], "generation": stamped}
        update = rc.status_for(
            {**body, "metadata": meta, "status": last}, self._options, deployment, pods, extra, extra_conditions
        )
        patch = changed_fields(last, update.status)
        if generation is not None and last.get("observedGeneration") != generation:
            patch["observedGeneration"] = generation
        if patch:
            path = path_for(API_VERSION, PLURAL, key[0], key[1]) + "/status"
            try:
                self._kube().merge_patch(path, {"status": patch})
            except ApiError as exc:
                if exc.status == 404:
                    return {}
                raise
            self._published[key] = (uid, {**last, **patch})
            rc.emit_transitions(update, request.emit)
        return patch

    def forget(self, namespace: str, name: str) -> None:
        with self._guard:
            self._published.pop((namespace, name), None)
            self._extra.pop((namespace, name), None)
