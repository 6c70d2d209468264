"""The rendered multi-node objects on the real API server, with the pinned LWS CRD installed:
the LeaderWorkerSet (and its leader-only Service) pass the apiextensions validation of
the LWS CRD's schema and CEL rules (server-side dry run: nothing is stored)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest
import yaml
from kubernetes import client
from llmservice.operator.template import Target, template

from .binaries import REPO
from .lws import install_lws_crd, remove_lws_crd

pytestmark = pytest.mark.cluster

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def lws_crd(kubectl: Kubectl, kube_api: client.ApiClient) -> Iterator[None]:
    install_lws_crd(kubectl, kube_api)
    try:
        yield
    finally:
        remove_lws_crd(kube_api)  # other modules see a cluster without it


def test_rendered_leader_worker_set_is_accepted_by_the_api_server(
    lws_crd: None, llmservice_crd: object, kubectl: Kubectl, namespace: str
) -> None:
    schema = yaml.safe_load((REPO / "crds/llmservice.yaml").read_text())["spec"]["versions"][0][
        "schema"
    ]["openAPIV3Schema"]
    example = yaml.safe_load((REPO / "examples/vllm-llama-3-405b-multinode.yaml").read_text())
    rendered = template([example], schema, Target(namespace=namespace))
    docs = list(yaml.safe_load_all(rendered))
    assert [d["kind"] for d in docs] == ["LeaderWorkerSet", "Service"]
    out = kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=rendered)
    assert out.returncode == 0, out.stderr
    assert "leaderworkerset.leaderworkerset.x-k8s.io/vllm-llama-3-405b serverside-applied" in (
        out.stdout
    )
    # Not vacuous: the API server checks the LWS schema (an unknown restart policy fails).
    docs[0]["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    bad = kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-", input=yaml.safe_dump(docs[0])
    )
    assert bad.returncode != 0 and "restartPolicy" in bad.stderr
