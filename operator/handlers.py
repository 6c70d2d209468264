"""kopf wiring: which events call which function. No decisions live here.

`register()` builds the handlers into a registry with the operator's options baked in
(the status timer's interval is a decoration-time value), so the CLI and tests can run
differently configured operators without import-time globals.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
from typing import Any

import kopf
from llmservice.operator import kube as k
from llmservice.operator import reconcile as rc
from llmservice.operator import telemetry as tm
from llmservice.operator.adapter_sync import AdapterSyncLoop
from llmservice.operator.autoscale_loop import AutoscaleLoop, Sources
from llmservice.operator.lws_support import lws_view
from llmservice.operator.publish import StatusPublisher
from llmservice.operator.render import FIELD_MANAGER, LABEL_SERVICE
from llmservice.operator.render_lws import LWS_API_VERSION, LWS_PLURAL, WORKER_INDEX
from llmservice.operator.scrape import pod_target
from llmservice.operator.spec import API_VERSION, GROUP, PLURAL, VERSION, LLMServiceSpec
from llmservice.operator.status import deployment_view, pod_view

from llmservice.pod_address import address_map


def llms_path(namespace: str, name: str) -> str:
    return k.path_for(API_VERSION, PLURAL, namespace, name)


CHILD_LABELS = {LABEL_SERVICE: kopf.PRESENT, "app.kubernetes.io/managed-by": FIELD_MANAGER}
LWS_GROUP, LWS_VERSION = LWS_API_VERSION.split("/")


def workload(key: tuple[str, str], deployments: kopf.Index, groups: kopf.Index) -> Any:
    """The replicas' workload as the status reads it: the Deployment, or for a multi-node
    vLLM object its LeaderWorkerSet (kopf only warns while that CRD is not installed)."""
    found = list(deployments.get(key, [])) or list(groups.get(key, []))
    return found[0] if found else None


def _emitter(body: kopf.Body) -> rc.Emit:
    """kopf.event() finds kopf's event queue in context variables, which exist only in a
    handler's context. The publisher may run this emit from another loop's thread (the
    autoscaler or advisor publishing a pending request of ours), so it carries the
    handler's context along: kopf.event is thread-safe once it can find its queue."""
    handler_context = contextvars.copy_context()

    def emit(type_: str, reason: str, message: str) -> None:
        handler_context.copy().run(
            kopf.event, body, type=type_, reason=reason, message=message[:1024]
        )

    return emit


def _temporary(exc: k.ApiError) -> Exception:
    """Conflicts and server errors retry soon; a rejected manifest will not fix itself."""
    if exc.status in (409, 429) or exc.status >= 500 or exc.status == 0:
        return kopf.TemporaryError(str(exc), delay=2)
    return kopf.PermanentError(str(exc))


def with_hub_shapes(options: rc.Options, get: Any) -> rc.Options:
    """Options whose checks read unknown hf:// models' shapes from options.hf_endpoint,
    with the LLMService's token Secret read through `get` (the operator's kube client)."""
    if not options.hf_endpoint or options.shapes is not None:
        return options
    from llmservice.operator.hub_shape import HubShapes, read_token_with

    shapes = HubShapes(read_token_with(get), endpoint=options.hf_endpoint)
    return dataclasses.replace(options, shapes=shapes)


def register(registry: kopf.OperatorRegistry, options: rc.Options) -> None:
    kube_holder: dict[str, k.Kube] = {}

    def kube() -> k.Kube:
        if "kube" not in kube_holder:
            kube_holder["kube"] = k.Kube()
        return kube_holder["kube"]

    options = with_hub_shapes(options, lambda path: kube().get(path))
    publisher = StatusPublisher(kube, options)

    def confirmed_drift(key: tuple[str, str], uid: str) -> dict[str, Any] | None:
        """The indexes lag behind our own writes: ask the API before 'repairing' anything.

        Returns the current LLMService when its children really drifted, else None.
        """
        current = kube().get(llms_path(*key))
        if not current or current["metadata"]["uid"] != uid:
            return None  # gone, or replaced by a new object of the same name
        if current["metadata"].get("deletionTimestamp"):
            return None
        if LLMServiceSpec.from_dict(current["spec"]).multi_node:
            found = kube().get(k.path_for(LWS_API_VERSION, LWS_PLURAL, *key))
            view = lws_view(found) if found else None
        else:
            found = kube().get(k.path_for("apps/v1", "deployments", *key))
            view = deployment_view(found) if found else None
        return current if rc.needs_repair(current, options, view) else None

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A fresh registry has none of kopf's implicit login handlers: use the same
        # kubeconfig / in-cluster credentials the `kubernetes` client loads.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(id="configure", registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        k.load_config()
        # Keep kopf's bookkeeping in annotations under our group, not in our status.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration"
        )
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        # Only our own Events (kopf.event) and real warnings reach `kubectl describe`.
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 30
        settings.execution.max_workers = 16  # sync handlers wait on HTTP, not on CPU

    @kopf.index(GROUP, VERSION, PLURAL, id="llms", registry=registry)
    def llms(namespace: str, name: str, body: kopf.Body, **_: Any) -> Any:
        return {(namespace, name): dict(body)}

    @kopf.index(
        "apps", "v1", "deployments", id="llms_deployments", labels=CHILD_LABELS, registry=registry
    )
    def llms_deployments(namespace: str, labels: dict[str, str], body: kopf.Body, **_: Any) -> Any:
        return {(namespace, labels[LABEL_SERVICE]): deployment_view(dict(body))}

    @kopf.index(
        LWS_GROUP, LWS_VERSION, LWS_PLURAL, id="llms_lws", labels=CHILD_LABELS, registry=registry
    )
    def llms_lws(namespace: str, labels: dict[str, str], body: kopf.Body, **_: Any) -> Any:
        return {(namespace, labels[LABEL_SERVICE]): lws_view(dict(body))}

    @kopf.index("", "v1", "pods", id="llms_pods", labels=CHILD_LABELS, registry=registry)
    def llms_pods(namespace: str, labels: dict[str, str], body: kopf.Body, **_: Any) -> Any:
        return {(namespace, labels[LABEL_SERVICE]): pod_view(dict(body))}

    @kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)
    def reconcile(
        body: kopf.Body,
        meta: kopf.Meta,
        llms_deployments: kopf.Index,
        llms_lws: kopf.Index,
        llms_pods: kopf.Index,
        **_: Any,
    ) -> None:
        raw, emit = dict(body), _emitter(body)
        key = (meta["namespace"], meta["name"])
        try:
            with tm.RECONCILE_SECONDS.time():
                applied = rc.reconcile(raw, kube(), options, emit).deployment

            def observe() -> tuple[dict[str, Any], Any, list[Any]]:
                watched = workload(key, llms_deployments, llms_lws)
                return (raw, rc.fresher(applied, watched), list(llms_pods.get(key, [])))

            publisher.publish(key, observe, emit, meta.get("generation"))
        except k.ApiError as exc:
            tm.RECONCILE_ERRORS.inc()
            raise _temporary(exc) from exc

    @kopf.on.delete(GROUP, VERSION, PLURAL, id="forget", optional=True, registry=registry)
    def forget(namespace: str, name: str, **_: Any) -> None:
        publisher.forget(namespace, name)  # the children go by ownerReference cascade

    @kopf.on.event(
        "apps", "v1", "deployments", id="deployment-changed", labels=CHILD_LABELS, registry=registry
    )
    @kopf.on.event("", "v1", "pods", id="pod-changed", labels=CHILD_LABELS, registry=registry)
    @kopf.on.event(
        LWS_GROUP, LWS_VERSION, LWS_PLURAL, id="lws-changed", labels=CHILD_LABELS, registry=registry
    )
    def child_changed(
        namespace: str,
        labels: dict[str, str],
        llms: kopf.Index,
        llms_deployments: kopf.Index,
        llms_lws: kopf.Index,
        llms_pods: kopf.Index,
        **_: Any,
    ) -> None:
        key = (namespace, labels[LABEL_SERVICE])

        def observe() -> tuple[dict[str, Any], Any, list[Any]] | None:
            bodies = list(llms.get(key, []))
            if not bodies:
                return None  # not ours, or the LLMService is gone
            found = workload(key, llms_deployments, llms_lws)
            return bodies[0], found, list(llms_pods.get(key, []))

        observed = observe()
        if observed is None:
            return
        emit = _emitter(kopf.Body(observed[0]))
        try:
            if rc.needs_repair(observed[0], options, observed[1]):
                current = confirmed_drift(key, observed[0]["metadata"]["uid"])
                if current is not None:
                    # Our Deployment was deleted or scaled behind our back: spec.replicas rules.
                    logging.getLogger(__name__).info("repairing the children of %s/%s", *key)
                    rc.reconcile(current, kube(), options, emit)
                    return  # the Deployment's own event publishes the status
            publisher.publish(key, observe, emit)
        except k.ApiError as exc:
            logging.getLogger(__name__).warning("status of %s/%s: %s", *key, exc)

    register_autoscaler(registry, kube, publisher)


def register_autoscaler(
    registry: kopf.OperatorRegistry, kube: Any, publisher: StatusPublisher
) -> None:
    """The autoscaling loop: one asyncio task for the whole operator (see autoscale_loop.py
    for why it is not a per-object timer or daemon: those put finalizers on LLMServices)."""
    loop = AutoscaleLoop(kube, publisher)
    adapters = AdapterSyncLoop(kube, publisher)  # spec.adapters into the ready pods (adapter_sync.py)
    pod_addresses = address_map()  # unset in a real cluster (llmservice/pod_address.py)

    @kopf.index("", "v1", "pods", id="llms_scrape_targets", labels=CHILD_LABELS, registry=registry)
    def llms_scrape_targets(
        namespace: str, labels: dict[str, str], body: kopf.Body, **_: Any
    ) -> Any:
        if labels.get(WORKER_INDEX, "0") != "0":
            return None  # an LWS worker serves no HTTP; the leader's /metrics covers its group
        return {(namespace, labels[LABEL_SERVICE]): pod_target(dict(body), pod_addresses)}

    @kopf.on.startup(id="autoscaler", registry=registry)
    async def start_autoscaler(
        memo: kopf.Memo,
        llms: kopf.Index,
        llms_deployments: kopf.Index,
        llms_lws: kopf.Index,
        llms_pods: kopf.Index,
        llms_scrape_targets: kopf.Index,
        **_: Any,
    ) -> None:
        def services() -> list[tuple[tuple[str, str], dict[str, Any]]]:
            found = []
            for key, store in list(llms.items()):
                bodies = list(store)
                if bodies:
                    found.append((key, bodies[0]))
            return found

        def observe(key: tuple[str, str]) -> Any:
            bodies = list(llms.get(key, []))
            if not bodies:
                return None
            found = workload(key, llms_deployments, llms_lws)
            return bodies[0], found, list(llms_pods.get(key, []))

        sources = Sources(
            services=services,
            targets=lambda key: list(llms_scrape_targets.get(key, [])),
            observe=observe,
        )
        loop.task = asyncio.create_task(loop.run(sources), name="autoscaler")
        memo["autoscaler"] = loop.task
        adapters.task = asyncio.create_task(adapters.run(sources), name="adapter-sync")
        memo["adapter_sync"] = adapters.task

    @kopf.on.cleanup(id="autoscaler", registry=registry)
    async def stop_autoscaler(memo: kopf.Memo, **_: Any) -> None:
        for name in ("autoscaler", "adapter_sync"):
            task = memo.get(name)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @kopf.on.probe(id="autoscaler", errors=kopf.ErrorsMode.PERMANENT, registry=registry)
    def autoscaler_health(**_: Any) -> dict[str, Any]:
        return loop.health()
