"""`llmservice operator`: run the kopf operator with this project's handlers.

A thin wrapper over `kopf run` (kopf.run) that adds the operator-wide settings a Helm
chart sets, e.g. `--max-gpu-memory-utilization` to lower the VRAM ceiling below 0.95, or
`--server-image` for the pods of every LLMService that does not set spec.engine.image.
"""

from __future__ import annotations

import argparse
import sys

import kopf
from llmservice.operator import telemetry
from llmservice.operator.handlers import register
from llmservice.operator.reconcile import Options
from llmservice.operator.render import DEFAULT_SERVER_IMAGE


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="llmservice operator", description="Run the LLMService operator (kopf)."
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="namespace to serve (repeatable)"
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="serve the whole cluster"
    )
    p.add_argument(
        "--liveness", metavar="URL", help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    p.add_argument(
        "--max-gpu-memory-utilization",
        type=float,
        default=0.95,
        help="cluster-wide ceiling on spec.resources.gpuMemoryUtilization, in [0.5, 0.95]",
    )
    p.add_argument(
        "--server-image",
        metavar="IMAGE",
        default=DEFAULT_SERVER_IMAGE,
        help="model-server image for LLMServices without spec.engine.image "
        f"(default: {DEFAULT_SERVER_IMAGE})",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve the operator's own Prometheus /metrics on this port (default: off)",
    )
    p.add_argument("--metrics-address", default="0.0.0.0", help="bind address for --metrics-port")
    p.add_argument("--peering", metavar="NAME", help="kopf peering name (default: standalone)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("-d", "--debug", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    if not 0.5 <= args.max_gpu_memory_utilization <= 0.95:
        p.error("--max-gpu-memory-utilization must lie in [0.5, 0.95]")
    if not args.server_image.strip():
        p.error("--server-image must not be empty")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    options = Options(
        max_gpu_memory_utilization=args.max_gpu_memory_utilization,
        server_image=args.server_image,
    )
    if args.metrics_port is not None:
        telemetry.serve(args.metrics_port, args.metrics_address)
    registry = kopf.OperatorRegistry()
    register(registry, options)
    kopf.configure(verbose=args.verbose, debug=args.debug, quiet=args.quiet)
    kopf.run(
        registry=registry,
        standalone=args.peering is None,
        peering_name=args.peering,
        namespaces=args.namespace,
        clusterwide=args.all_namespaces or not args.namespace,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
