"""The operator-wide settings (Helm values) as command-line flags, for both
`llmservice operator` and `llmservice operator render`, so a render shows what the
operator configured the same way would apply."""

from __future__ import annotations

import argparse

from llmservice.operator.reconcile import Options
from llmservice.operator.render import DEFAULT_SERVER_IMAGE

CEILING_RANGE = (0.5, 0.95)  # the CRD's bounds on spec.resources.gpuMemoryUtilization


def add_settings(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-gpu-memory-utilization",
        type=float,
        default=CEILING_RANGE[1],
        help="cluster-wide ceiling on spec.resources.gpuMemoryUtilization, in "
        f"[{CEILING_RANGE[0]}, {CEILING_RANGE[1]}]",
    )
    p.add_argument(
        "--server-image",
        metavar="IMAGE",
        default=DEFAULT_SERVER_IMAGE,
        help="model-server image for LLMServices without spec.engine.image "
        f"(default: {DEFAULT_SERVER_IMAGE})",
    )


def options_from(p: argparse.ArgumentParser, args: argparse.Namespace) -> Options:
    """The parsed settings, or a usage error (exit 2) naming the bad one."""
    low, high = CEILING_RANGE
    if not low <= args.max_gpu_memory_utilization <= high:
        p.error(f"--max-gpu-memory-utilization must lie in [{low}, {high}]")
    if not args.server_image.strip():
        p.error("--server-image must not be empty")
    return Options(
        max_gpu_memory_utilization=args.max_gpu_memory_utilization,
        server_image=args.server_image,
    )
