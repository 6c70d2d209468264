#!/usr/bin/env python3
"""Write README.md's LLMService reference from the CRD's OpenAPI schema.

    hack/gen-crd-reference.py           rewrite the section between the markers
    hack/gen-crd-reference.py --check   exit 1 if README.md is out of date (a test runs this)

One source of truth: field names, types, defaults, bounds, enums and the CEL rules all
come from crds/llmservice.yaml. A field without a `description` there takes its text from
FALLBACK below (a test keeps FALLBACK free of fields the CRD no longer has, and fails if
any field ends up with no text at all); a description added to the CRD wins.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "llmservice.yaml"
README = ROOT / "README.md"
BEGIN = "<!-- BEGIN GENERATED: LLMService reference (hack/gen-crd-reference.py) -->"
END = "<!-- END GENERATED: LLMService reference -->"

FALLBACK = {
    "spec.engine.image": "Image of the model-server pods (Dockerfile.server); unset: the operator's `--server-image` (Helm value `serverImage`).",
    "spec.engine.imagePullPolicy": "When the kubelet pulls the server image.",
    "spec.engine.enablePrefixCaching": "Share the KV cache of common prompt prefixes (`--enable-prefix-caching`).",
    "spec.engine.enableChunkedPrefill": "Split long prompts across steps, interleaved with decodes (`--enable-chunked-prefill`).",
    "spec.engine.preemptionMode": "What happens to a request evicted when KV blocks run out: recompute (re-prefill later), swap (copy its KV to CPU memory), auto (per victim, whichever is estimated cheaper).",
    "spec.engine.schedulingPolicy": "Admission order: fcfs, or priority (lower value first, with aging).",
    "spec.engine.dtype": "Weights and activations type; auto is bfloat16 on GPU, float32 on CPU.",
    "spec.engine.tensorParallelSize": "GPUs one replica shards the model over.",
    "spec.engine.maxQueueDelayMs": "Latency bound on waiting: a request waiting longer is admitted ahead of policy order.",
    "spec.engine.extraArgs": "More `llmservice serve` flags, appended as given.",
    "spec.engine.env": "Extra environment variables of the server container.",
    "spec.engine.env[].name": "Variable name.",
    "spec.engine.env[].value": "Variable value.",
    "spec.model.hfTokenSecretRef.name": "Secret name.",
    "spec.model.hfTokenSecretRef.key": "Key of the token in the Secret.",
    "spec.model.architecture.numLayers": "Transformer layers (`num_hidden_layers`).",
    "spec.model.architecture.hiddenSize": "`hidden_size`.",
    "spec.model.architecture.numAttentionHeads": "`num_attention_heads`.",
    "spec.model.architecture.numKeyValueHeads": "`num_key_value_heads` (GQA); defaults to the attention heads.",
    "spec.model.architecture.headDim": "`head_dim`; defaults to hiddenSize / numAttentionHeads.",
    "spec.model.architecture.intermediateSize": "`intermediate_size` (FFN width).",
    "spec.model.architecture.vocabSize": "`vocab_size`.",
    "spec.model.architecture.tieWordEmbeddings": "`tie_word_embeddings`: the LM head shares the embedding matrix.",
    "spec.model.architecture.numExperts": "Experts per MoE layer (1: dense).",
    "spec.model.architecture.numExpertsPerToken": "Experts each token is routed to.",
    "spec.model.architecture.attentionBias": "Q/K/V projections have biases (Qwen2).",
    "spec.resources": "Per-pod GPUs, CPU and memory.",
    "spec.resources.gpu": "GPUs of one pod.",
    "spec.resources.gpu.resourceName": "Extended resource the GPUs are requested as.",
    "spec.resources.cpu": "CPU request and limit of the server container.",
    "spec.resources.memory": "Memory request and limit of the server container (weights are loaded through it, swap space lives in it).",
    "spec.engine": "The `llmservice serve` flags of every pod.",
    "spec.model": "Which model to serve and how to get it.",
    "spec.autoscaling": 'The operator\'s autoscaler (see "How autoscaling decides").',
    "spec.autoscaling.enabled": "Let the operator write spec.replicas; off: kubectl scale / HPA / KEDA own it.",
    "spec.autoscaling.minReplicas": "Lower bound of the autoscaler's decision.",
    "spec.autoscaling.maxReplicas": "Upper bound of the autoscaler's decision.",
    "spec.autoscaling.preemptionsPerMinutePerReplica": "Target preemptions per minute per replica (scale out past 5/min).",
    "spec.autoscaling.kvCacheUsageTarget": "Target mean KV cache usage (vllm:kv_cache_usage_perc).",
    "spec.autoscaling.waitingRequestsPerReplica": "Target waiting requests per replica (vllm:num_requests_waiting).",
    "spec.autoscaling.scaleUpStabilizationSeconds": "How long a higher desired count must persist before scaling up.",
    "spec.autoscaling.scaleDownStabilizationSeconds": "How long a lower desired count must persist before scaling down.",
    "spec.autoscaling.intervalSeconds": "How often pods' /metrics are scraped and a decision is made.",
    "spec.scheduling": "Where the pods may run.",
    "spec.scheduling.nodeSelector": "Node labels the pods require.",
    "spec.scheduling.tolerations": "Tolerations added to the pods (the nvidia.com/gpu taint is tolerated already).",
    "spec.scheduling.tolerations[].key": "Taint key.",
    "spec.scheduling.tolerations[].operator": "Exists or Equal.",
    "spec.scheduling.tolerations[].value": "Taint value (with Equal).",
    "spec.scheduling.tolerations[].effect": "Taint effect tolerated.",
    "spec.scheduling.tolerations[].tolerationSeconds": "How long a NoExecute taint is tolerated.",
    "spec.scheduling.affinity": "A core/v1 Affinity, passed to the pods as is.",
    "spec.scheduling.priorityClassName": "PriorityClass of the pods.",
    "status.observedGeneration": "The spec generation the status describes.",
    "status.readyReplicas": "Pods passing /ready.",
    "status.desiredReplicas": "The autoscaler's last decision.",
    "status.lastScaleTime": "When the autoscaler last changed spec.replicas.",
    "status.lastScaleReason": "Which signal drove the last scale, with its numbers.",
    "status.memoryPlan.budgetGiBPerGPU": "memoryGiB x gpuMemoryUtilization.",
    "status.memoryPlan.weightsGiBPerGPU": "Weights per GPU.",
    "status.memoryPlan.activationReserveGiBPerGPU": "Reserved for activations, logits, CUDA context.",
    "status.memoryPlan.kvCacheGiBPerGPU": "What is left for the KV cache.",
    "status.memoryPlan.kvBytesPerToken": "KV bytes of one token, all layers.",
    "status.memoryPlan.kvBytesPerTokenPerGPU": "The same, per GPU under tensor parallelism.",
    "status.memoryPlan.blockSize": "engine.blockSize used for the estimate.",
    "status.memoryPlan.estimatedKVBlocks": "KV blocks that fit.",
    "status.memoryPlan.estimatedMaxConcurrentSequences": "maxModelLen-long sequences that fit at once.",
    "status.memoryPlan.gpuMemoryUtilization": "The utilization in force (after the operator's ceiling).",
    "status.conditions": "Ready, Progressing, VRAMFit, Degraded, CapacityPending (Kubernetes condition convention).",
    "status.conditions[].type": "Condition name.",
    "status.conditions[].status": "True, False or Unknown.",
    "status.conditions[].reason": "CamelCase reason.",
    "status.conditions[].message": "What to do about it.",
    "status.conditions[].lastTransitionTime": "When status last changed.",
    "status.conditions[].observedGeneration": "Generation the condition was computed for.",
}


def walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(path, schema, required) for every field below `schema`, depth first."""
    required = set(schema.get("required", []))
    for name, sub in schema.get("properties", {}).items():
        here = f"{path}.{name}"
        yield here, sub, name in required
        yield from walk(sub, here)
        items = sub.get("items")
        if sub.get("type") == "array" and isinstance(items, dict) and items.get("properties"):
            yield from walk(items, f"{here}[]")


def type_of(s: dict[str, Any]) -> str:
    if s.get("x-kubernetes-int-or-string"):
        return "int or string"
    t = s.get("type", "any")
    if t == "array":
        return f"[]{type_of(s.get('items', {}))}"
    if t == "object" and s.get("x-kubernetes-preserve-unknown-fields"):
        return "object (free-form)"
    if t == "object" and "additionalProperties" in s:
        return f"map[string]{type_of(s['additionalProperties'])}"
    if s.get("format") in ("date-time",):
        return "timestamp"
    return str(t)


def code(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    text = text.removesuffix("...").strip()
    return f"`{text}`"


def constraints(s: dict[str, Any], required: bool) -> str:
    parts = []
    if required:
        parts.append("required")
    if "enum" in s:
        parts.append("one of " + ", ".join(code(v) for v in s["enum"]))
    lo, hi = s.get("minimum"), s.get("maximum")
    if lo is not None and hi is not None:
        parts.append(f"{lo}..{hi}")
    elif lo is not None:
        parts.append(f">= {lo}")
    elif hi is not None:
        parts.append(f"<= {hi}")
    if "maxLength" in s:
        parts.append(f"at most {s['maxLength']} characters")
    if "maxItems" in s:
        parts.append(f"at most {s['maxItems']} items")
    return "; ".join(parts)


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def rules(schema: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule["message"]
    for name, sub in schema.get("properties", {}).items():
        yield from rules(sub, f"{path}.{name}")


def table(root: dict[str, Any], prefix: str) -> tuple[list[str], list[str]]:
    lines = [
        "| field | type | default | constraints | description |",
        "|---|---|---|---|---|",
    ]
    missing = []
    for path, s, required in walk(root, prefix):
        text = s.get("description") or FALLBACK.get(path, "")
        if not text:
            missing.append(path)
        default = code(s["default"]) if "default" in s else ""
        lines.append(
            f"| `{path}` | {type_of(s)} | {default} | {cell(constraints(s, required))} | {cell(text)} |"
        )
    return lines, missing


def generate() -> tuple[str, list[str]]:
    crd = yaml.safe_load(CRD.read_text())
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    group, names = crd["spec"]["group"], crd["spec"]["names"]
    spec_lines, missing = table(schema["properties"]["spec"], "spec")
    status_lines, missing_status = table(schema["properties"]["status"], "status")
    out = [
        BEGIN,
        "",
        f"`apiVersion: {group}/{version['name']}`, `kind: {names['kind']}` "
        f"(plural `{names['plural']}`, short name `{', '.join(names.get('shortNames', []))}`), "
        "namespaced, with the `status` and `scale` subresources "
        f"(`kubectl scale llms NAME --replicas N` writes `spec.replicas`). "
        "Generated from `crds/llmservice.yaml`; the API server applies every default and "
        "bound below, so a bad spec is refused at `kubectl apply`.",
        "",
        "### spec",
        "",
        *spec_lines,
        "",
        "Cross-field rules (CEL, checked by the API server):",
        "",
        *[f"- `{p}`: {cell(m)}" for p, m in rules(schema["properties"]["spec"], "spec")],
        "",
        "### status",
        "",
        *status_lines,
        "",
        END,
    ]
    return "\n".join(out), missing + missing_status


def splice(readme: str, section: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"README.md lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + section + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if README.md is stale")
    args = parser.parse_args(argv)
    section, missing = generate()
    if missing:
        print("fields with no description (add one to the CRD):", *missing, file=sys.stderr)
        return 1
    current = README.read_text()
    wanted = splice(current, section)
    if args.check:
        if wanted != current:
            print(
                "README.md's LLMService reference is stale: run hack/gen-crd-reference.py",
                file=sys.stderr,
            )
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
