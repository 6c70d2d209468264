"""Status conditions from observed pods and Deployment, and when they deserve Events."""

from __future__ import annotations

from llmservice.operator import reconcile as rc
from llmservice.operator.spec import LLMServiceSpec
from llmservice.operator.status import (
    DeploymentView,
    PodView,
    compute_status,
    deployment_view,
    pod_view,
)
from llmservice.operator.vram import check_fit

UNSCHEDULABLE = (
    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are "
    "available: 3 No preemption victims found for incoming pod."
)
FIT = check_fit(LLMServiceSpec.from_dict({"model": {"source": "builtin:smollm2-135m"}}))
NO_FIT = check_fit(
    LLMServiceSpec.from_dict(
        {
            "model": {"source": "hf://meta-llama/Meta-Llama-3-70B-Instruct"},
            "resources": {"gpu": {"memoryGiB": 24}},
        }
    )
)


def status(deployment=None, pods=(), desired=2, fit=FIT, previous=None, now="t1"):
    return compute_status(
        generation=3,
        desired_replicas=desired,
        fit=fit,
        deployment=deployment,
        pods=list(pods),
        previous=previous,
        now=now,
        selector="a=b",
        endpoint="http://x.default.svc:8000/v1",
    )


def conditions(update):
    return {c["type"]: c for c in update.status["conditions"]}


def test_pending_unschedulable_pod_copies_the_scheduler_message():
    pod = pod_view(
        {
            "metadata": {"name": "p1"},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": UNSCHEDULABLE,
                    }
                ],
            },
        }
    )
    assert pod.unschedulable == UNSCHEDULABLE
    c = conditions(
        status(DeploymentView(1, 1, 2, 2, 2, 1, 1), [pod, PodView("p0", "Running", True)])
    )
    assert c["CapacityPending"]["status"] == "True"
    assert c["CapacityPending"]["reason"] == "Unschedulable"
    assert UNSCHEDULABLE in c["CapacityPending"]["message"]
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "PartiallyReady"
    assert c["Ready"]["message"].startswith("1/2 replicas ready")


def test_crash_looping_pod_degrades():
    pod = pod_view(
        {
            "metadata": {"name": "p1"},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "server",
                        "restartCount": 4,
                        "state": {
                            "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s"}
                        },
                    }
                ],
            },
        }
    )
    assert pod.restarts == 4 and pod.failing == "CrashLoopBackOff: back-off 1m20s"
    c = conditions(status(DeploymentView(1, 1, 2, 2, 2, 1, 1), [pod]))
    assert c["Degraded"]["status"] == "True" and c["Degraded"]["reason"] == "CrashLoopBackOff"
    assert "pod p1: CrashLoopBackOff" in c["Degraded"]["message"]


def test_terminating_pods_neither_degrade_nor_wait_for_capacity():
    pod = PodView("old", terminating=True, unschedulable="x", failing="Error: 1")
    c = conditions(status(DeploymentView(1, 1, 2, 2, 2, 2, 2), [pod]))
    assert c["Degraded"]["status"] == "False" and c["CapacityPending"]["status"] == "False"


def test_rollout_progress_then_ready():
    rolling = conditions(status(DeploymentView(2, 1, 2, 3, 1, 2, 2)))
    assert (
        rolling["Progressing"]["status"] == "True"
        and rolling["Progressing"]["reason"] == "RollingOut"
    )
    assert rolling["Ready"]["status"] == "True"  # the old pods still serve
    done = conditions(status(DeploymentView(2, 2, 2, 2, 2, 2, 2)))
    assert done["Progressing"] == {
        **done["Progressing"],
        "status": "False",
        "reason": "RolloutComplete",
    }
    assert done["Ready"]["reason"] == "AllReplicasReady"
    assert all(c["observedGeneration"] == 3 for c in done.values())


def test_vram_refusal_before_any_deployment():
    update = status(None, fit=NO_FIT)
    c = conditions(update)
    assert c["VRAMFit"]["status"] == "False" and c["VRAMFit"]["reason"] == "InsufficientVRAM"
    assert "smallest GPU count that fits: 8" in c["VRAMFit"]["message"]
    assert c["Ready"]["reason"] == "VRAMDoesNotFit"
    assert c["Progressing"]["reason"] == "RolloutBlocked"
    assert update.status["replicas"] == 0
    assert update.status["memoryPlan"]["weightsGiBPerGPU"] > 100


def test_vram_refusal_of_an_update_keeps_serving_the_old_spec():
    c = conditions(status(DeploymentView(1, 1, 2, 2, 2, 2, 2), fit=NO_FIT))
    assert c["Ready"]["status"] == "True"
    assert c["Progressing"]["reason"] == "RolloutBlocked"
    assert "still serving the previous one" in c["Progressing"]["message"]


def test_scaled_to_zero():
    c = conditions(status(DeploymentView(1, 1, 0, 0, 0, 0, 0), desired=0))
    assert c["Ready"]["reason"] == "ScaledToZero"


def test_transition_times_survive_unchanged_conditions():
    first = status(DeploymentView(1, 1, 2, 2, 0, 0, 0), now="t1")
    second = status(DeploymentView(1, 1, 2, 2, 1, 1, 1), previous=first.status, now="t2")
    third = status(DeploymentView(1, 1, 2, 2, 2, 2, 2), previous=second.status, now="t3")
    ready = [conditions(u)["Ready"] for u in (first, second, third)]
    assert [r["status"] for r in ready] == ["False", "False", "True"]
    assert ready[1]["lastTransitionTime"] == "t1"  # message changed, status did not
    assert ready[2]["lastTransitionTime"] == "t3"
    assert [t.type for t in third.transitions] == ["Ready", "Progressing"]  # rollout done
    assert not second.transitions


def test_which_transitions_become_events():
    events: list[tuple[str, str, str]] = []
    emit = lambda *e: events.append(e)  # noqa: E731
    pending = PodView("p", unschedulable=UNSCHEDULABLE)
    first = status(DeploymentView(1, 1, 1, 1, 0, 0, 0), [pending], desired=1)
    rc.emit_transitions(first, emit)
    assert [(t, r) for t, r, _ in events] == [("Warning", "CapacityPending")]
    events.clear()
    ready = status(
        DeploymentView(1, 1, 1, 1, 1, 1, 1),
        [PodView("p", "Running", True)],
        desired=1,
        previous=first.status,
    )
    rc.emit_transitions(ready, emit)
    assert [(t, r) for t, r, _ in events] == [
        ("Normal", "Ready"),
        ("Normal", "CapacityPendingResolved"),
    ]


def test_deployment_view_reads_status():
    view = deployment_view(
        {
            "metadata": {"generation": 4},
            "spec": {"replicas": 3},
            "status": {
                "observedGeneration": 4,
                "replicas": 3,
                "updatedReplicas": 3,
                "readyReplicas": 2,
            },
        }
    )
    assert view == DeploymentView(4, 4, 3, 3, 3, 2, 0)


def test_fresher_deployment_view():
    applied = DeploymentView(generation=3, spec_replicas=3, replicas=1)
    stale_watch = DeploymentView(generation=2, spec_replicas=1, replicas=1)
    newer_watch = DeploymentView(generation=3, spec_replicas=3, replicas=3)
    assert rc.fresher(applied, stale_watch) is applied  # the watch has not seen our apply
    assert rc.fresher(applied, newer_watch) is newer_watch  # same generation, newer counts
    assert rc.fresher(None, newer_watch) is newer_watch and rc.fresher(applied, None) is applied
