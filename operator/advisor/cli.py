"""`llmservice advise URL [--window 60] [--json] [--spec FILE]`: advise a running server.

Reads the server's `/metrics` twice, `--window` seconds apart (ours, or stock vLLM: the
rules use vLLM's names, plus ours where they exist), and prints the findings. The engine
settings come from the page's info metrics (`vllm:cache_config_info`,
`llmservice:engine_config_info`); `--spec` (an LLMService YAML, or just its spec) adds or
overrides them — stock vLLM exports no scheduler limits, so give a spec there.
Exit codes: 0 no finding, 3 findings, 1 the server could not be read, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from llmservice.operator.advisor import engine_settings, rules
from llmservice.operator.advisor.snapshot import Scrape, Snapshot, parse

EXIT_FINDINGS = 3


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="llmservice advise",
        description="Find seed 000's batching mistakes in a running server's metrics and "
        "print each with its evidence, the spec change (a JSON merge patch) and its expected effect.",
    )
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8000 (or its /metrics URL)")
    p.add_argument(
        "--window", type=float, default=60.0, help="seconds between the two scrapes (default: 60)"
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of findings")
    p.add_argument(
        "--spec",
        type=Path,
        default=None,
        help="LLMService YAML (or its spec) for settings the server does not export",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per scrape (default: 10)")
    args = p.parse_args(argv)
    if args.window <= 0:
        p.error(f"--window {args.window:g} must be > 0 seconds")
    return args


def metrics_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/metrics") else url + "/metrics"


def read_spec(path: Path) -> dict[str, Any]:
    """An LLMService object or a bare spec; a clear error naming the file otherwise."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--spec {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(
            f"--spec {path}: expected an LLMService or its spec, got {type(doc).__name__}"
        )
    return doc["spec"] if isinstance(doc.get("spec"), dict) else doc


def scrape(client: httpx.Client, url: str, timeout: float) -> Scrape:
    try:
        response = client.get(url, timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        raise ValueError(f"{url}: HTTP {exc.response.status_code}") from exc
    except httpx.HTTPError as exc:
        raise ValueError(f"{url}: {type(exc).__name__} {exc}".strip()) from exc
    try:
        return parse(response.text)
    except ValueError as exc:
        raise ValueError(f"{url}: not Prometheus metrics ({exc})") from exc


def format_text(findings: list[rules.Finding], window: float) -> str:
    if not findings:
        return f"no findings over {window:g} s"
    lines = []
    for f in findings:
        lines.append(f"[{f.severity}] {f.rule}: {f.summary}")
        lines.append(f"  evidence:  {json.dumps(f.evidence)}")
        lines.append(f"  patch:     {json.dumps(f.recommendation)}")
        lines.append(f"  effect:    {f.expected_effect.get('arithmetic', '')}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    url = metrics_url(args.url)
    try:
        spec = engine_settings.from_spec(read_spec(args.spec)) if args.spec else None
        with httpx.Client(trust_env=False) as client:
            start = time.monotonic()
            before = scrape(client, url, args.timeout)
            time.sleep(args.window)
            after = scrape(client, url, args.timeout)
            seconds = time.monotonic() - start
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    settings = engine_settings.from_metrics(after)
    if spec is not None:
        settings = settings.overlaid(spec)
    findings = rules.evaluate(Snapshot(before, after, seconds), settings)
    if args.json:
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        print(format_text(findings, seconds))
    return EXIT_FINDINGS if findings else 0
