"""`llmservice operator render -f FILE`: print the manifests the operator would apply.

Offline, like `helm template`: no cluster, no kopf. Exit 0 with the manifests on stdout;
1 when the CRD, the server or the VRAM check refuses an object (the message on stderr);
2 for a usage mistake. The CRD comes from this source tree unless --crd names one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from llmservice.operator.admission import CELUnavailable
from llmservice.operator.settings import add_settings, options_from
from llmservice.operator.template import Refused, Target, template

SOURCE_CRD = Path(__file__).resolve().parents[1] / "crds" / "llmservice.yaml"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, Target]:
    p = argparse.ArgumentParser(
        prog="llmservice operator render",
        description="Print the manifests the operator would apply for LLMService objects, "
        "with each VRAM plan as a comment (like helm template).",
    )
    p.add_argument("-f", "--filename", required=True, help="LLMService YAML file ('-': stdin)")
    add_settings(p)
    p.add_argument("-n", "--namespace", default="default",
                   help="namespace of objects without metadata.namespace (default: default)")
    p.add_argument("--service-monitor", action="store_true",
                   help="include the ServiceMonitor (the operator adds one when the cluster "
                   "serves monitoring.coreos.com/v1)")
    p.add_argument("--crd", type=Path, default=None,
                   help=f"the LLMService CRD (default: {SOURCE_CRD})")
    args = p.parse_args(argv)
    target = Target(options_from(p, args), args.namespace, args.service_monitor)
    return args, target


def crd_schema(path: Path | None) -> dict[str, Any]:
    crd_path = path or SOURCE_CRD
    if not crd_path.is_file():
        raise FileNotFoundError(
            f"no LLMService CRD at {crd_path}; pass --crd PATH (crds/llmservice.yaml of the "
            "llmservice repository)"
        )
    crd = yaml.safe_load(crd_path.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def read_documents(filename: str) -> list[Any]:
    text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
    return [d for d in yaml.safe_load_all(text) if d is not None]


def main(argv: list[str] | None = None) -> int:
    args, target = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        output = template(read_documents(args.filename), crd_schema(args.crd), target)
    except (Refused, CELUnavailable, OSError, yaml.YAMLError) as exc:
        print(f"error: {args.filename}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
