"""`llmservice operator`: run the kopf operator with this project's handlers.

A thin wrapper over `kopf run` (kopf.run) that adds the operator-wide settings a Helm
chart sets, e.g. `--max-gpu-memory-utilization` to lower the VRAM ceiling below 0.95, or
`--server-image` for the pods of every LLMService that does not set spec.engine.image.
`llmservice operator render -f FILE` prints what it would apply (render_cli.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import kopf
from llmservice.operator import telemetry
from llmservice.operator.handlers import register
from llmservice.operator.hub_shape import DEFAULT_ENDPOINT
from llmservice.operator.settings import add_settings, options_from


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
    add_settings(p)
    p.add_argument(
        "--hf-endpoint",
        metavar="URL",
        default=os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT,
        help="the Hub the VRAM check reads an unknown hf:// model's config.json and "
        "safetensors headers from (default: $HF_ENDPOINT or %(default)s); '' turns it off",
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
    args.options = dataclasses.replace(options_from(p, args), hf_endpoint=args.hf_endpoint or None)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["render"]:
        from llmservice.operator.render_cli import main as render_main

        return render_main(argv[1:])
    args = parse_args(argv)
    options = args.options
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
