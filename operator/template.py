"""What the operator would apply for some LLMService objects, as YAML text. Pure.

Like `helm template`: each LLMService is admitted as the API server admits it (the CRD's
defaults, bounds and CEL rules), checked as the reconciler checks it (the server can run
it, it fits the GPUs), then rendered; the VRAM plan goes above its manifests as a
comment. Any refusal is a `Refused` with the message the cluster would give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from llmservice.operator.admission import admit
from llmservice.operator.engine_support import UNSUPPORTED_BY_ENGINE
from llmservice.operator.reconcile import Options, checks
from llmservice.operator.render import Owner, render
from llmservice.operator.spec import KIND, LLMServiceSpec
from llmservice.operator.vram import FitResult

# The API server assigns the real uid; rendered ownerReferences carry this one.
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


class Refused(Exception):
    """The message a user would get from the cluster for these objects."""


@dataclass(frozen=True)
class Target:
    """Where and how the manifests would be applied."""

    options: Options = Options()
    namespace: str = "default"
    with_service_monitor: bool = False


def plan_comment(fit: FitResult) -> str:
    lines = [f"VRAMFit={fit.status} ({fit.reason}): {fit.message}"]
    if fit.plan is not None:
        lines += yaml.safe_dump({"memoryPlan": fit.plan.as_status()}, sort_keys=False).splitlines()
    return "".join(f"# {line}\n" for line in lines)


def template_one(obj: dict[str, Any], schema: dict[str, Any], target: Target) -> str:
    name = (obj.get("metadata") or {}).get("name")
    label = f"LLMService {name or '(no metadata.name)'}"
    stored, errors = admit(schema, obj, None)
    problems = [str(e) for e in errors] + ([] if name else ["metadata.name: Required value"])
    if problems:
        raise Refused(f"{label}: the API server would refuse it:\n  " + "\n  ".join(problems))
    owner = Owner(name, stored["metadata"].get("namespace") or target.namespace, PLACEHOLDER_UID)
    spec = LLMServiceSpec.from_dict(stored["spec"])
    verdict = checks(owner, spec, target.options)
    if verdict.support.refuses_rollout:
        raise Refused(f"{label}: {UNSUPPORTED_BY_ENGINE}: {verdict.support.message}")
    if verdict.fit.refuses_rollout:
        raise Refused(f"{label}: VRAMFit=False ({verdict.fit.reason}): {verdict.fit.message}")
    manifests = render(
        owner,
        spec,
        max_gpu_memory_utilization=target.options.max_gpu_memory_utilization,
        server_image=target.options.server_image,
        with_service_monitor=target.with_service_monitor,
    )
    head = (
        f"# LLMService {owner.namespace}/{owner.name}: what the operator would apply "
        "(ownerReferences[].uid is a placeholder)\n"
    )
    body = yaml.safe_dump_all(manifests.all(), sort_keys=False, explicit_start=True)
    return head + plan_comment(verdict.fit) + body


def template(documents: list[Any], schema: dict[str, Any], target: Target) -> str:
    """Every LLMService among `documents`, rendered; other kinds are not the operator's
    and are skipped. All refusals at once, so one run lists every mistake."""
    services = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    if not services:
        raise Refused(f"no {KIND} object in the input")
    rendered, refusals = [], []
    for obj in services:
        try:
            rendered.append(template_one(obj, schema, target))
        except Refused as exc:
            refusals.append(str(exc))
    if refusals:
        raise Refused("\n".join(refusals))
    return "".join(rendered)
