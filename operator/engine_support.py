"""Would the server start the pod the operator is about to render? Pure.

The rendered command goes through the server's own parser and start-up check
(server/cli_args.py, server/capabilities.py): the very code `llmservice serve` runs
before it loads a model. What it refuses, the operator does not roll out: Ready=False,
reason UnsupportedByEngine, an Event, and a message naming the LLMService field to
change. The operator judges by the server it ships with, the release of its default
`--server-image`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmservice.operator.render import Owner, server_args
from llmservice.operator.spec import LLMServiceSpec
from llmservice.server.capabilities import Unsupported
from llmservice.server.cli_args import (
    BY_NAME,
    SERVE_OPTIONS,
    UnsupportedError,
    configs_from_args,
    parse_serve_argv,
)
from llmservice.server.config import ConfigError
from llmservice.server.model.registry import builtin_names

UNSUPPORTED_BY_ENGINE = "UnsupportedByEngine"

# What to write in the LLMService instead, per refused server option.
FIXES = {
    "model": (
        "use {builtins} (weights inside the image), or pvc://claim/path with a .gguf file "
        "or an HF model directory on a PersistentVolumeClaim"
    ),
    "tensor_parallel_size": (
        "set spec.engine.tensorParallelSize to {supported} (one GPU per rank, or "
        "resources.gpu.count 0 for CPU ranks)"
    ),
}


@dataclass(frozen=True)
class EngineSupport:
    supported: bool
    message: str = ""
    reason: str = UNSUPPORTED_BY_ENGINE  # Ready's reason when refused (LeaderWorkerSetMissing)

    @property
    def refuses_rollout(self) -> bool:
        return not self.supported


SUPPORTED = EngineSupport(True)


def _refused(problem: Unsupported, spec: LLMServiceSpec) -> str:
    crd = BY_NAME[problem.arg].arg.crd
    value = spec.model.source if problem.arg == "model" else problem.value
    fix = FIXES.get(problem.arg, "use {supported}").format(
        supported=problem.supported, builtins=", ".join(builtin_names())
    )
    return f"spec.{crd} {value}: {problem.reason}; {fix}"


def _fields_named(message: str) -> list[str]:
    """The LLMService fields behind the flags a server error names."""
    named = []
    for o in SERVE_OPTIONS:
        if o.arg.crd and re.search(rf"{re.escape(o.arg.flag)}(?![\w-])", message):
            named.append(f"spec.{o.arg.crd}")
    return named + ["spec.engine.extraArgs"]


def lora_refusal(spec: LLMServiceSpec) -> str | None:
    """What the bundled server cannot combine with LoRA adapters (server/lora/flags.py),
    said in the LLMService's own fields before a pod would exit on `--enable-lora`."""
    if not spec.adapters:
        return None
    names = ", ".join(a.name for a in spec.adapters)
    tp = spec.engine.tensor_parallel_size
    if tp > 1:
        return (
            f"spec.adapters ({names}) with spec.engine.tensorParallelSize {tp}: the llmservice engine "
            "serves LoRA adapters on one rank only; set engine.tensorParallelSize 1 (a model that fits "
            "one GPU), remove spec.adapters, or use engine.kind: vllm (LoRA with tensor parallelism)"
        )
    if spec.engine.speculative is not None:
        return (
            f"spec.adapters ({names}) with spec.engine.speculative: the llmservice engine does not "
            "combine LoRA adapters with speculative decoding; remove one of them"
        )
    return None


def check_engine(owner: Owner, spec: LLMServiceSpec, max_utilization: float) -> EngineSupport:
    """Parse and check the command the pods would run, as the server does at start."""
    if spec.engine.kind == "vllm":
        # Stock vLLM: the CRD's CEL rules refuse the flags it lacks (render_vllm.py);
        # what vLLM itself can run (architectures, TP, hf://) is vLLM's to judge.
        return SUPPORTED
    refused = lora_refusal(spec)
    if refused:
        return EngineSupport(False, refused)
    argv = server_args(owner, spec, max_utilization)
    try:
        configs_from_args(parse_serve_argv(argv[1:]))
    except UnsupportedError as exc:
        return EngineSupport(False, _refused(exc.problem, spec))
    except ConfigError as exc:
        fields = " or ".join(_fields_named(str(exc)))
        return EngineSupport(False, f"the server would exit at start: {exc}; change {fields}")
    return SUPPORTED
