"""End to end: preemptions on a real server pod make the operator scale 1 -> 3 and back.

The API emulator and fake kubelet (tests/support) run the rendered pods' real command,
`llmservice serve builtin:smollm2-135m ...` with a deliberately tiny KV cache (24 blocks
of 16 tokens) and one torch thread each, as local processes on 127.x.y.z. The real
operator process (`kopf run`) autoscales with intervalSeconds 3 and a 20 s scale-down
window. `llmservice bench serve` drives 8 concurrent long generations at the first pod,
which cannot all fit: the engine preempts (recompute). Then:

- the operator must scale up with the preemption signal as the reason (lastScaleReason
  "preemptions ... /min/replica > 5 → ..."), reaching 3 replicas;
- after the load stops it must scale back to 1.

A recorder samples the LLMService (spec.replicas, readyReplicas, status.signals) and every
pod's own /metrics every 0.25 s. The reaction time is from the threshold crossing (the
first preemption: with one replica and a 3 s interval, one preemption in an interval is
already 20/min > 5) to the first spec.replicas change; the target is <= 2 intervals.
Writes bench/results/autoscale_e2e.{json,png}; exits 1 if an assertion fails.

    .venv/bin/python bench/autoscale_e2e.py            # ~4-6 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from llmservice.operator.scrape import parse_metrics  # noqa: E402

from tests.support.clients import Kubectl, llmservice, wait_until  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.kubelet import Node  # noqa: E402
from tests.support.metrics_pods import unique_ip_prefix  # noqa: E402
from tests.support.operator_process import OperatorProcess, free_port  # noqa: E402

RESULTS = ROOT / "bench" / "results"
LLMSERVICE = Path(sys.executable).with_name("llmservice")
NAME = "e2e"


def manifest(interval: int, window: int) -> dict[str, Any]:
    return llmservice(
        NAME,
        model={"source": "builtin:smollm2-135m", "servedName": "smollm2"},
        engine={
            "maxModelLen": 256,
            "maxNumBatchedTokens": 256,
            "maxNumSeqs": 8,
            "dtype": "float32",
            "enablePrefixCaching": False,
            "shutdownGraceSeconds": 5,
            "extraArgs": ["--num-threads", "1", "--num-gpu-blocks-override", "24"],
        },
        resources={"gpu": {"count": 0}, "cpu": "1", "memory": "2Gi"},
        autoscaling={
            "enabled": True,
            "minReplicas": 1,
            "maxReplicas": 3,
            "intervalSeconds": interval,
            "scaleDownStabilizationSeconds": window,
            "preemptionsPerMinutePerReplica": 5,
            # With 24 blocks the cache is ~100% full by construction and the queue holds
            # what the cache cannot: this scenario isolates the preemption signal (the
            # other two are covered by the unit and integration tests).
            "kvCacheUsageTarget": 0.95,
            "waitingRequestsPerReplica": 10,
        },
    )


@dataclass
class Timeline:
    """Samples (seconds since start) of the LLMService and of each pod's metrics."""

    t0: float = field(default_factory=time.monotonic)
    service: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)
    first_pod: str | None = None

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def mark(self, what: str) -> None:
        self.marks[what] = self.now()
        print(f"[{self.marks[what]:7.2f}s] {what}", flush=True)


class Recorder(threading.Thread):
    def __init__(self, k: Kubectl, timeline: Timeline, period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.k, self.timeline, self.period = k, timeline, period
        self.stop = threading.Event()
        self.client = httpx.Client(trust_env=False, timeout=1.0)

    def run(self) -> None:
        while not self.stop.is_set():
            t = self.timeline.now()
            with contextlib.suppress(Exception):
                body = self.k.llms(NAME)
                status = body.get("status") or {}
                self.timeline.service.append(
                    {
                        "t": t,
                        "replicas": body["spec"]["replicas"],
                        "readyReplicas": status.get("readyReplicas", 0),
                        "signals": status.get("signals") or {},
                        "lastScaleReason": status.get("lastScaleReason"),
                    }
                )
                for pod in self.k.pods(NAME):
                    ip = (pod.get("status") or {}).get("podIP")
                    if not ip or pod["metadata"].get("deletionTimestamp"):
                        continue
                    with contextlib.suppress(Exception):
                        s = parse_metrics(self.client.get(f"http://{ip}:8000/metrics").text)
                        self.timeline.pods.append(
                            {
                                "t": t,
                                "pod": pod["metadata"]["name"],
                                "preemptions_total": s.preemptions_total,
                                "kv_cache_usage": s.kv_cache_usage,
                                "waiting": s.waiting_requests,
                                "running": s.running_requests,
                            }
                        )
            self.stop.wait(self.period)


def first_change(samples: list[dict[str, Any]], key: str, after: float = 0.0) -> float | None:
    start = next((s[key] for s in samples if s["t"] >= after), None)
    return next((s["t"] for s in samples if s["t"] >= after and s[key] != start), None)


def first_preemption(pods: list[dict[str, Any]], pod: str) -> float | None:
    mine = [p for p in pods if p["pod"] == pod and p["preemptions_total"] is not None]
    if not mine:
        return None
    base = mine[0]["preemptions_total"]
    return next((p["t"] for p in mine if p["preemptions_total"] > base), None)


def analyse(tl: Timeline, interval: int) -> dict[str, Any]:
    crossed = first_preemption(tl.pods, tl.first_pod) if tl.first_pod else None
    patched = first_change(tl.service, "replicas", after=tl.marks.get("load started", 0.0))
    stopped = tl.marks.get("load stopped", float("inf"))
    reasons = [s["lastScaleReason"] for s in tl.service if s["lastScaleReason"]]
    after_load = [s for s in tl.service if s["t"] >= stopped]
    reaction = None if crossed is None or patched is None else round(patched - crossed, 2)
    return {
        "threshold_crossed_s": crossed,
        "replicas_patched_s": patched,
        "reaction_time_s": reaction,
        "reaction_time_intervals": None if reaction is None else round(reaction / interval, 2),
        "max_replicas": max((s["replicas"] for s in tl.service), default=None),
        "scale_up_reason": next((r for r in reasons if " > " in r), None),
        "final_replicas": after_load[-1]["replicas"] if after_load else None,
        "back_to_1_after_load_stopped_s": next(
            (round(s["t"] - stopped, 2) for s in after_load if s["replicas"] == 1), None
        ),
    }


def plot(tl: Timeline, result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    ts = [s["t"] for s in tl.service]
    axes[0].step(ts, [s["replicas"] for s in tl.service], where="post", label="spec.replicas")
    axes[0].step(ts, [s["readyReplicas"] for s in tl.service], where="post", label="ready", ls="--")
    axes[0].set_ylabel("replicas")
    axes[0].set_ylim(0, 3.5)
    axes[1].plot(
        ts,
        [s["signals"].get("preemptionsPerMinute") for s in tl.service],
        label="operator: preemptions/min (all pods)",
        drawstyle="steps-post",
    )
    first_seen = {}
    for p in tl.pods:
        first_seen.setdefault(p["pod"], p["t"])
    for i, pod in enumerate(sorted(first_seen, key=first_seen.__getitem__)):
        mine = [p for p in tl.pods if p["pod"] == pod]
        color = f"C{i + 2}"
        axes[1].plot([p["t"] for p in mine], [p["preemptions_total"] for p in mine], color=color,
                     label=f"pod {i + 1}: vllm:num_preemptions_total", alpha=0.6)  # fmt: skip
        axes[2].plot([p["t"] for p in mine], [p["kv_cache_usage"] for p in mine], color=color,
                     label=f"pod {i + 1}: vllm:kv_cache_usage_perc", alpha=0.7)  # fmt: skip
    axes[1].axhline(5, color="grey", ls=":", label="target 5/min/replica")
    axes[1].set_ylabel("preemptions (/min; total)")
    axes[2].set_ylabel("KV cache usage")
    axes[2].set_xlabel("seconds")
    for ax in axes:
        for what, t in tl.marks.items():
            if what in ("load started", "load stopped"):
                ax.axvline(t, color="black", alpha=0.3)
        if result.get("threshold_crossed_s") is not None:
            ax.axvline(result["threshold_crossed_s"], color="red", alpha=0.4)
        if result.get("replicas_patched_s") is not None:
            ax.axvline(result["replicas_patched_s"], color="green", alpha=0.4)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(
        f"Autoscaling on preemptions: reaction {result.get('reaction_time_s')} s "
        f"(red: first preemption, green: replicas patched)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def start_load(base_url: str, log: Path) -> subprocess.Popen[bytes]:
    argv = [
        str(LLMSERVICE), "bench", "serve", "--base-url", base_url, "--model", "smollm2",
        "--dataset", "random", "--input-len", "48", "--output-len", "128",
        "--num-prompts", "400", "--max-concurrency", "8", "--ignore-eos", "--disable-tqdm",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--interval", type=int, default=3)
    ap.add_argument("--window", type=int, default=20, help="scaleDownStabilizationSeconds")
    ap.add_argument("--hold-load", type=float, default=20, help="seconds of load after 3 replicas")
    ap.add_argument("--out", type=Path, default=RESULTS / "autoscale_e2e")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    args = ap.parse_args()
    if args.plot_only:
        saved = json.loads(args.out.with_suffix(".json").read_text())
        tl = Timeline(service=saved["timeline"]["service"], pods=saved["timeline"]["pods"],
                      marks=saved["marks"])  # fmt: skip
        plot(tl, saved["result"], args.out.with_suffix(".png"))
        return 0
    tl = Timeline()
    failures: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="autoscale-e2e-"))
    print(f"workdir (pod and operator logs): {workdir}", flush=True)
    load: subprocess.Popen[bytes] | None = None
    with Cluster(
        workdir,
        nodes=[Node("cpu-node-1", gpus=0)],
        mode="process",
        executables={"llmservice": str(LLMSERVICE)},
        env={"OMP_NUM_THREADS": "1"},
        log_dir=workdir,
        ip_prefix=unique_ip_prefix(),
    ) as cluster:
        k = Kubectl(cluster.api)
        k.install_crd(str(ROOT / "crds" / "llmservice.yaml"))
        metrics_port = free_port()
        operator = OperatorProcess(cluster.kubeconfig, workdir / "operator.log",
                                   "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1")  # fmt: skip
        recorder = Recorder(k, tl)
        with operator:
            tl.mark("operator live")
            k.apply(manifest(args.interval, args.window))
            recorder.start()
            try:
                wait_until(
                    lambda: k.condition(NAME, "Ready").get("status") == "True",
                    timeout=300,
                    interval=0.5,
                )
                tl.mark("first pod ready")
                (pod,) = k.pods(NAME)
                tl.first_pod = pod["metadata"]["name"]
                time.sleep(2 * args.interval)  # the operator's preemption counter has a baseline
                load = start_load(f"http://{pod['status']['podIP']}:8000", workdir / "load.log")
                tl.mark("load started")
                wait_until(lambda: k.llms(NAME)["spec"]["replicas"] > 1, timeout=120, interval=0.1)
                tl.mark(f"scaled up to {k.llms(NAME)['spec']['replicas']}")
                wait_until(lambda: k.llms(NAME)["spec"]["replicas"] == 3, timeout=90, interval=0.2)
                tl.mark("3 replicas asked")
                wait_until(lambda: (k.llms(NAME).get("status") or {}).get("readyReplicas") == 3,
                           timeout=240, interval=0.5)  # fmt: skip
                tl.mark("3 replicas ready")
                time.sleep(args.hold_load)
            except AssertionError as exc:
                failures.append(f"scale-up: {exc}")
            finally:
                if load is not None:
                    os.killpg(load.pid, signal.SIGTERM)
                    load.wait(timeout=30)
                    tl.mark("load stopped")
            if not failures:
                try:
                    wait_until(
                        lambda: k.llms(NAME)["spec"]["replicas"] == 1, timeout=150, interval=0.2
                    )
                    tl.mark("back to 1 replica asked")
                    wait_until(lambda: len(k.pods(NAME)) == 1, timeout=90, interval=0.5)
                    tl.mark("back to 1 pod")
                except AssertionError as exc:
                    failures.append(f"scale-down: {exc}")
            recorder.stop.set()
            recorder.join(timeout=5)
            events = [
                (r, m) for _, r, m in k.events(NAME) if r in ("Autoscaled", "ScalingInactive")
            ]
            k.delete_llms(NAME)
            wait_until(lambda: not k.pods(NAME), timeout=60, interval=0.5)

    result = analyse(tl, args.interval)
    if result["max_replicas"] != 3:
        failures.append(f"expected to reach 3 replicas, reached {result['max_replicas']}")
    if not (result["scale_up_reason"] or "").startswith("preemptions"):
        failures.append(
            f"the scale-up reason is not the preemption signal: {result['scale_up_reason']!r}"
        )
    if result["final_replicas"] != 1:
        failures.append(f"expected 1 replica after the load, got {result['final_replicas']}")
    reaction = result["reaction_time_s"]
    if reaction is None or reaction > 2 * args.interval:
        failures.append(f"reaction time {reaction} s exceeds 2 intervals ({2 * args.interval} s)")
    out = {
        "scenario": {
            "interval_s": args.interval,
            "scale_down_window_s": args.window,
            "kv_blocks": 24,
            "block_size": 16,
            "load": "bench serve, 8 concurrent, 48 in / 128 out",
        },  # fmt: skip
        "result": result,
        "events": sorted(events),
        "marks": tl.marks,
        "failures": failures,
        "timeline": {"service": tl.service, "pods": tl.pods},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=1))
    plot(tl, result, args.out.with_suffix(".png"))
    print(json.dumps({**result, "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
