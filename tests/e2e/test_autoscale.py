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
Writes bench/results/autoscale_e2e.{json,png} (also when an assertion fails), then fails
on what went wrong. Opt-in (marker `e2e`, not in `make test`):

    make e2e            # ~4-6 minutes on 2 CPU cores; tests/e2e/plot.py redraws the PNG
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import Kubectl, llmservice, wait_until
from tests.support.cluster import Cluster
from tests.support.kubelet import Node
from tests.support.metrics_pods import unique_ip_prefix
from tests.support.operator_process import OperatorProcess, free_port

from .plot import plot
from .timeline import Recorder, Timeline, analyse

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "autoscale_e2e"
LLMSERVICE = Path(sys.executable).with_name("llmservice")
NAME = "e2e"
INTERVAL = 3  # autoscaling.intervalSeconds
WINDOW = 20  # scaleDownStabilizationSeconds
HOLD_LOAD = 20  # seconds of load after 3 replicas are ready


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


def start_load(base_url: str, log: Path) -> subprocess.Popen[bytes]:
    argv = [
        str(LLMSERVICE), "bench", "serve", "--base-url", base_url, "--model", "smollm2",
        "--dataset", "random", "--input-len", "48", "--output-len", "128",
        "--num-prompts", "400", "--max-concurrency", "8", "--ignore-eos", "--disable-tqdm",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # fmt: skip


def drive(k: Kubectl, tl: Timeline, workdir: Path, failures: list[str]) -> None:
    """One pod under load until 3 are ready, then no load until 1 is left."""
    load: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: k.condition(NAME, "Ready").get("status") == "True", timeout=300, interval=0.5)
        tl.mark("first pod ready")
        (pod,) = k.pods(NAME)
        tl.first_pod = pod["metadata"]["name"]
        time.sleep(2 * INTERVAL)  # the operator's preemption counter has a baseline
        load = start_load(f"http://{pod['status']['podIP']}:8000", workdir / "load.log")
        tl.mark("load started")
        wait_until(lambda: k.llms(NAME)["spec"]["replicas"] > 1, timeout=120, interval=0.1)
        tl.mark(f"scaled up to {k.llms(NAME)['spec']['replicas']}")
        wait_until(lambda: k.llms(NAME)["spec"]["replicas"] == 3, timeout=90, interval=0.2)
        tl.mark("3 replicas asked")
        wait_until(lambda: (k.llms(NAME).get("status") or {}).get("readyReplicas") == 3,
                   timeout=240, interval=0.5)  # fmt: skip
        tl.mark("3 replicas ready")
        time.sleep(HOLD_LOAD)
    except AssertionError as exc:
        failures.append(f"scale-up: {exc}")
    finally:
        if load is not None:
            os.killpg(load.pid, signal.SIGTERM)
            load.wait(timeout=30)
            tl.mark("load stopped")
    if failures:
        return
    try:
        wait_until(lambda: k.llms(NAME)["spec"]["replicas"] == 1, timeout=150, interval=0.2)
        tl.mark("back to 1 replica asked")
        wait_until(lambda: len(k.pods(NAME)) == 1, timeout=90, interval=0.5)
        tl.mark("back to 1 pod")
    except AssertionError as exc:
        failures.append(f"scale-down: {exc}")


def judge(result: dict[str, Any]) -> list[str]:
    failures = []
    if result["max_replicas"] != 3:
        failures.append(f"expected to reach 3 replicas, reached {result['max_replicas']}")
    if not (result["scale_up_reason"] or "").startswith("preemptions"):
        failures.append(f"the scale-up reason is not the preemption signal: {result['scale_up_reason']!r}")
    if result["final_replicas"] != 1:
        failures.append(f"expected 1 replica after the load, got {result['final_replicas']}")
    reaction = result["reaction_time_s"]
    if reaction is None or reaction > 2 * INTERVAL:
        failures.append(f"reaction time {reaction} s exceeds 2 intervals ({2 * INTERVAL} s)")
    return failures


@pytest.mark.timeout(1800)  # the waits above add up to ~18 minutes at worst
def test_preemptions_scale_out_to_three_and_back_to_one() -> None:
    tl = Timeline()
    failures: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="autoscale-e2e-"))
    print(f"workdir (pod and operator logs): {workdir}", flush=True)
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
        operator = OperatorProcess(cluster.kubeconfig, workdir / "operator.log",
                                   "--metrics-port", str(free_port()), "--metrics-address", "127.0.0.1")  # fmt: skip
        recorder = Recorder(k, NAME, tl)
        with operator:
            tl.mark("operator live")
            k.apply(manifest(INTERVAL, WINDOW))
            recorder.start()
            drive(k, tl, workdir, failures)
            recorder.stop.set()
            recorder.join(timeout=5)
            events = [(r, m) for _, r, m in k.events(NAME) if r in ("Autoscaled", "ScalingInactive")]
            k.delete_llms(NAME)
            wait_until(lambda: not k.pods(NAME), timeout=60, interval=0.5)

    result = analyse(tl, INTERVAL)
    failures += judge(result)
    out = {
        "scenario": {
            "interval_s": INTERVAL,
            "scale_down_window_s": WINDOW,
            "kv_blocks": 24,
            "block_size": 16,
            "load": "bench serve, 8 concurrent, 48 in / 128 out",
        },
        "result": result,
        "events": sorted(events),
        "marks": tl.marks,
        "failures": failures,
        "timeline": {"service": tl.service, "pods": tl.pods},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(out, indent=1))
    plot(out, OUT.with_suffix(".png"))
    print(json.dumps({**result, "failures": failures}, indent=1))
    assert failures == []
