"""A fake data plane for the emulator: deployment controller, scheduler and kubelet.

- Deployment controller: keeps `spec.replicas` pods of the current template (labelled
  with `pod-template-hash`), removes old-template pods only as new ones become ready
  (maxUnavailable 0), and writes the Deployment's status. ReplicaSets are skipped: pods
  are owned by the Deployment directly.
- Scheduler: binds a pod to a node that has the free GPUs it requests, tolerates the
  node's taints and matches its nodeSelector; otherwise the pod stays Pending with
  `PodScheduled=False, reason=Unschedulable` and the scheduler's usual message
  ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. ...").
- Kubelet: marks bound pods Running with an IP 127.0.0.x and Ready after `ready_delay`
  (mode "ready"), or starts the container's real command as a local process on that IP,
  with `--host 0.0.0.0` pointed at it, and reports readiness from the pod's own
  readinessProbe (mode "process"). Images listed in `failing_images` never start
  (e.g. ImagePullBackOff). Pods being deleted get SIGTERM, then SIGKILL after their grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kmock

from tests.support.selectors import match_label_selector
from tests.support.store import Change, Store, now

PODS = kmock.resource("", "v1", "pods")
NODES = kmock.resource("", "v1", "nodes")
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
SECRETS = kmock.resource("", "v1", "secrets")
GPU = "nvidia.com/gpu"


@dataclass
class Node:
    name: str
    gpus: int = 8
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] | None = None  # default: the GPU taint when gpus > 0

    def manifest(self) -> dict[str, Any]:
        taints = self.taints
        if taints is None:
            taints = [{"key": GPU, "value": "present", "effect": "NoSchedule"}] if self.gpus else []
        capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        if self.gpus:
            capacity[GPU] = str(self.gpus)
        return {
            "metadata": {
                "name": self.name,
                "labels": {"kubernetes.io/hostname": self.name, **self.labels},
            },
            "spec": {"taints": taints},
            "status": {"capacity": capacity, "allocatable": capacity},
        }


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def gpu_request(pod: dict[str, Any]) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers", []):
        res = c.get("resources") or {}
        total += int((res.get("limits") or {}).get(GPU, (res.get("requests") or {}).get(GPU, 0)))
    return total


def tolerates(pod: dict[str, Any], taint: dict[str, str]) -> bool:
    for t in pod.get("spec", {}).get("tolerations") or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value") == taint.get("value"):
            return True
    return False


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


@dataclass
class Running:
    """A pod's local process and its probe task (mode "process")."""

    process: asyncio.subprocess.Process
    prober: asyncio.Task[None]
    log: Any


class FakeKubelet:
    def __init__(
        self,
        store: Store,
        nodes: list[Node],
        *,
        mode: str = "ready",
        ready_delay: float = 0.2,
        failing_images: dict[str, str] | None = None,
        executables: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
        ip_prefix: str = "127.0.0.",
    ) -> None:
        self.store = store
        self.ip_prefix = ip_prefix  # another 127.x.y. keeps concurrent test runs' pods apart
        self.nodes = nodes
        self.mode = mode
        self.ready_delay = ready_delay
        self.failing_images = failing_images or {}
        self.executables = executables or {}
        self.env = env or {}
        self.log_dir = log_dir
        self._wake = asyncio.Event()
        self._started: dict[str, float] = {}  # pod uid -> loop time it started running
        self._processes: dict[str, Running] = {}
        self._ips: dict[str, str] = {}
        self._terminating: set[str] = set()

    # ------------------------------------------------------------ lifecycle

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FakeKubelet]:
        for node in self.nodes:
            self.store.create(NODES, None, node.manifest())

        def listener(res: kmock.resource, change: Change) -> None:
            if res in (PODS, DEPLOYMENTS, NODES):
                self._wake.set()

        self.store.listeners.append(listener)
        task = asyncio.create_task(self._loop())
        try:
            yield self
        finally:
            self.store.listeners.remove(listener)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # All at once: one after another, a few server pods' 5 s graces outlast the
            # cluster's teardown wait on a loaded machine.
            await asyncio.gather(*(self._stop_process(uid, grace=5) for uid in list(self._processes)))

    def add_node(self, node: Node) -> None:
        """A new node joins (what a cluster autoscaler would do); pending pods retry."""
        self.nodes.append(node)
        self.store.create(NODES, None, node.manifest())

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=0.1)
            self._wake.clear()
            try:
                await self.sync()
            except Exception as exc:  # keep the data plane alive; tests see the logs
                print(f"fake kubelet: sync failed: {exc!r}")

    async def sync(self) -> None:
        by_owner: dict[str, list[dict[str, Any]]] = {}
        for pod in self.store.items(PODS, copied=False):
            for ref in pod["metadata"].get("ownerReferences") or []:
                by_owner.setdefault(ref.get("uid", ""), []).append(pod)
        for deployment in self.store.items(DEPLOYMENTS, copied=False):
            self._sync_deployment(deployment, by_owner.get(deployment["metadata"]["uid"], []))
        pods = list(self.store.items(PODS, copied=False))
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                await self._terminate(pod)
            elif not pod["spec"].get("nodeName"):
                self._schedule(pod)
            else:
                await self._run(pod)

    # ------------------------------------------------------------ deployment controller

    def _sync_deployment(self, d: dict[str, Any], owned: list[dict[str, Any]]) -> None:
        meta, spec = d["metadata"], d["spec"]
        ns, uid = meta["namespace"], meta["uid"]
        desired = int(spec.get("replicas", 1))
        template = spec["template"]
        current_hash = template_hash(template)
        live = [p for p in owned if not p["metadata"].get("deletionTimestamp")]
        new = [
            p
            for p in live
            if p["metadata"].get("labels", {}).get("pod-template-hash") == current_hash
        ]
        new_ids = {id(p) for p in new}
        old = [p for p in live if id(p) not in new_ids]
        changed = len(new) != desired or bool(old)
        for _ in range(desired - len(new)):
            self._create_pod(d, current_hash)
        if len(new) > desired:
            # As the ReplicaSet controller ranks them: not Ready first, then the newest.
            newest = sorted(new, key=lambda p: p["metadata"]["creationTimestamp"], reverse=True)
            extra = sorted(newest, key=_ready)
            for pod in extra[: len(new) - desired]:
                self.store.delete(PODS, ns, pod["metadata"]["name"])
        ready_new = sum(1 for p in new if _ready(p))
        keep_old = max(0, desired - ready_new)
        if len(old) > keep_old:
            doomed = sorted(old, key=lambda p: _ready(p))[: len(old) - keep_old]
            for pod in doomed:
                self.store.delete(PODS, ns, pod["metadata"]["name"])
        if changed:  # pods were created or deleted above: count again
            live = [
                p
                for p in self.store.items(PODS, copied=False)
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
                and p["metadata"].get("namespace") == ns
                and not p["metadata"].get("deletionTimestamp")
            ]
        ready = sum(1 for p in live if _ready(p))
        updated = sum(
            1
            for p in live
            if p["metadata"].get("labels", {}).get("pod-template-hash") == current_hash
        )
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(live),
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(0, len(live) - ready),
        }
        old_status = {k: v for k, v in (d.get("status") or {}).items() if k != "conditions"}
        if old_status != status:
            available = "True" if ready >= desired else "False"
            conditions = [
                {
                    "type": "Available",
                    "status": available,
                    "reason": "MinimumReplicasAvailable"
                    if available == "True"
                    else "MinimumReplicasUnavailable",
                    "lastUpdateTime": now(),
                    "lastTransitionTime": now(),
                },
                {
                    "type": "Progressing",
                    "status": "True",
                    "reason": "NewReplicaSetAvailable"
                    if updated == desired == ready
                    else "ReplicaSetUpdated",
                    "lastUpdateTime": now(),
                    "lastTransitionTime": now(),
                },
            ]
            self.store.update(
                DEPLOYMENTS,
                ns,
                meta["name"],
                lambda o: {**o, "status": {**status, "conditions": conditions}},
                "status",
            )

    def _create_pod(self, d: dict[str, Any], hash_: str) -> None:
        template = copy.deepcopy(d["spec"]["template"])
        meta = template.get("metadata") or {}
        self.store.create(
            PODS,
            d["metadata"]["namespace"],
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "generateName": f"{d['metadata']['name']}-{hash_}-",
                    "labels": {**(meta.get("labels") or {}), "pod-template-hash": hash_},
                    "annotations": meta.get("annotations") or {},
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": d["metadata"]["name"],
                            "uid": d["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": template["spec"],
            },
        )

    # ------------------------------------------------------------ scheduler

    def _schedule(self, pod: dict[str, Any]) -> None:
        want = gpu_request(pod)
        selector = pod["spec"].get("nodeSelector") or {}
        reasons: dict[str, int] = {}
        for node in self.nodes:
            manifest = node.manifest()
            used = sum(
                gpu_request(p)
                for p in self.store.items(PODS, copied=False)  # fresh: this pass's bindings count
                if p["spec"].get("nodeName") == node.name
                and not p["metadata"].get("deletionTimestamp")
            )
            untolerated = [t for t in manifest["spec"]["taints"] if not tolerates(pod, t)]
            labels = manifest["metadata"]["labels"]
            if not match_label_selector({"matchLabels": selector}, labels):
                reasons["node(s) didn't match Pod's node affinity/selector"] = (
                    reasons.get("node(s) didn't match Pod's node affinity/selector", 0) + 1
                )
            elif untolerated:
                t = untolerated[0]
                key = f"node(s) had untolerated taint {{{t['key']}: {t.get('value', '')}}}"
                reasons[key] = reasons.get(key, 0) + 1
            elif node.gpus - used < want:
                reasons[f"Insufficient {GPU}"] = reasons.get(f"Insufficient {GPU}", 0) + 1
            else:
                self._bind(pod, node.name)
                return
        n = len(self.nodes)
        detail = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
        message = f"0/{n} nodes are available: {detail}. preemption: 0/{n} nodes are available: {n} No preemption victims found for incoming pod."
        conditions = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": now(),
            }
        ]
        old = (pod.get("status") or {}).get("conditions") or []
        if [(c.get("reason"), c.get("message")) for c in old] != [("Unschedulable", message)]:
            self._set_status(pod, {"phase": "Pending", "conditions": conditions})

    def _bind(self, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]
        self.store.update(
            PODS,
            meta["namespace"],
            meta["name"],
            lambda o: {**o, "spec": {**o["spec"], "nodeName": node}},
        )
        self._set_status(
            pod,
            {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}
                ],
            },
        )

    def _set_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if self.store.find(PODS, meta["namespace"], meta["name"]) is not None:
            self.store.update(
                PODS, meta["namespace"], meta["name"], lambda o: {**o, "status": status}, "status"
            )

    # ------------------------------------------------------------ kubelet

    def _ip(self, uid: str) -> str:
        if uid not in self._ips:
            used = set(self._ips.values())
            self._ips[uid] = next(
                f"{self.ip_prefix}{i}" for i in range(2, 255) if f"{self.ip_prefix}{i}" not in used
            )
        return self._ips[uid]

    def _pod_status(
        self,
        pod: dict[str, Any],
        *,
        ready: bool,
        container_state: dict[str, Any],
        restarts: int = 0,
        phase: str = "Running",
    ) -> dict[str, Any]:
        uid = pod["metadata"]["uid"]
        flag = "True" if ready else "False"
        container = pod["spec"]["containers"][0]
        return {
            "phase": phase,
            "podIP": self._ip(uid),
            "podIPs": [{"ip": self._ip(uid)}],
            "hostIP": "127.0.0.1",
            "startTime": (pod.get("status") or {}).get("startTime") or now(),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": flag},
                {"type": "Ready", "status": flag},
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": ready,
                    "started": "running" in container_state,
                    "restartCount": restarts,
                    "state": container_state,
                }
            ],
        }

    def _write_if_changed(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        old = pod.get("status") or {}
        strip = lambda s: {k: v for k, v in s.items() if k != "startTime"}  # noqa: E731
        if strip(old) != strip(status):
            self._set_status(pod, status)

    async def _run(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        image = pod["spec"]["containers"][0].get("image", "")
        if image in self.failing_images:
            reason = self.failing_images[image]
            waiting = {
                "waiting": {"reason": reason, "message": f'Back-off pulling image "{image}"'}
            }
            self._write_if_changed(
                pod, self._pod_status(pod, ready=False, container_state=waiting, phase="Pending")
            )
            return
        if self.mode == "process":
            await self._run_process(pod)
            return
        loop = asyncio.get_running_loop()
        started = self._started.setdefault(uid, loop.time())
        ready = loop.time() - started >= self.ready_delay
        state = {"running": {"startedAt": now()}}
        old_state = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state")
        if old_state and "running" in old_state:
            state = old_state
        self._write_if_changed(pod, self._pod_status(pod, ready=ready, container_state=state))
        if not ready:
            loop.call_later(self.ready_delay, self._wake.set)

    async def _terminate(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        if uid in self._processes or uid in self._terminating:
            if uid not in self._terminating:
                self._terminating.add(uid)
                grace = int(meta.get("deletionGracePeriodSeconds") or 30)
                asyncio.create_task(
                    self._stop_then_remove(uid, meta["namespace"], meta["name"], grace)
                )
            return
        self._started.pop(uid, None)
        self._ips.pop(uid, None)
        if self.store.find(PODS, meta["namespace"], meta["name"]) is not None:
            self.store.delete(PODS, meta["namespace"], meta["name"], grace=0)

    async def _stop_then_remove(self, uid: str, ns: str, name: str, grace: int) -> None:
        await self._stop_process(uid, grace)
        self._ips.pop(uid, None)
        self._terminating.discard(uid)
        if self.store.find(PODS, ns, name) is not None:
            self.store.delete(PODS, ns, name, grace=0)

    # ------------------------------------------------------------ real processes

    def _command(self, pod: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        container = pod["spec"]["containers"][0]
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        argv[0] = self.executables.get(argv[0]) or shutil.which(argv[0]) or argv[0]
        ip = self._ip(pod["metadata"]["uid"])
        argv = [ip if a == "0.0.0.0" else a for a in argv]
        env = {**os.environ, **self.env}
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = e["value"]
            elif ref := (e.get("valueFrom") or {}).get("secretKeyRef"):
                secret = self.store.find(SECRETS, pod["metadata"]["namespace"], ref["name"]) or {}
                if ref["key"] in (secret.get("stringData") or {}):
                    env[e["name"]] = secret["stringData"][ref["key"]]
        env["HOME"] = os.environ.get("HOME", "/tmp")  # the pod's emptyDir /tmp is not emulated
        return argv, env

    async def _run_process(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if uid in self._processes:
            return
        argv, env = self._command(pod)
        log = (
            open(self.log_dir / f"{pod['metadata']['name']}.log", "wb")
            if self.log_dir
            else asyncio.subprocess.DEVNULL
        )  # noqa: SIM115
        process = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=log, stderr=asyncio.subprocess.STDOUT, start_new_session=True
        )
        prober = asyncio.create_task(self._probe(pod, process))
        self._processes[uid] = Running(process, prober, log)
        self._write_if_changed(
            pod,
            self._pod_status(pod, ready=False, container_state={"running": {"startedAt": now()}}),
        )

    async def _probe(self, pod: dict[str, Any], process: asyncio.subprocess.Process) -> None:
        """Poll the pod's readinessProbe until the process exits; mirror it into status."""
        container = pod["spec"]["containers"][0]
        probe = (container.get("readinessProbe") or {}).get("httpGet") or {
            "path": "/",
            "port": 8000,
        }
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
        port = ports.get(probe["port"], probe["port"])
        url = f"http://{self._ip(pod['metadata']['uid'])}:{port}{probe.get('path', '/')}"
        meta = pod["metadata"]
        ready = None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while process.returncode is None:
                try:
                    async with session.get(url) as response:
                        now_ready = response.status < 400
                except (aiohttp.ClientError, TimeoutError):
                    now_ready = False
                current = self.store.find(PODS, meta["namespace"], meta["name"])
                if current is None:
                    return
                if now_ready != ready:
                    ready = now_ready
                    state = ((current.get("status") or {}).get("containerStatuses") or [{}])[0].get(
                        "state"
                    ) or {"running": {"startedAt": now()}}
                    self._write_if_changed(
                        current, self._pod_status(current, ready=ready, container_state=state)
                    )
                await asyncio.sleep(0.2)
        current = self.store.find(PODS, meta["namespace"], meta["name"])
        if current is not None and not current["metadata"].get("deletionTimestamp"):
            state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"container exited with code {process.returncode}",
                }
            }
            self._write_if_changed(
                current, self._pod_status(current, ready=False, container_state=state, restarts=1)
            )

    async def _stop_process(self, uid: str, grace: int) -> None:
        """SIGTERM, SIGKILL after `grace` s. The process stays listed until it is gone, so
        the kubelet's own shutdown also ends one still in a pod's (longer) grace period."""
        running = self._processes.get(uid)
        if running is None:
            return
        if running.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(running.process.wait(), timeout=grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(running.process.pid, signal.SIGKILL)
                # bounded: a teardown must not hang on a process the kernel has not reaped
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(running.process.wait(), timeout=10)
        self._processes.pop(uid, None)
        running.prober.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running.prober
        if hasattr(running.log, "close"):
            running.log.close()
