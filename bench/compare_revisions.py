"""Engine throughput of an earlier revision against the working tree, alternating runs in
one session on one machine, so a refactor's cost is a ratio and not two noisy figures.

The earlier revision is checked out as a git worktree and imported through a package
overlay on PYTHONPATH (the venv's editable install points at this checkout; PYTHONPATH
comes first). Each side runs `bench/offline_throughput.py --skip-hf` from its own tree.

    .venv/bin/python bench/compare_revisions.py BASE_REV [--rounds 2] [--num-requests 128] [--threads 2]

Writes bench/results/compare_revisions.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ENGINE_LINE = re.compile(r"engine: ([\d.]+) output tok/s")


def overlay(tree: Path, into: Path) -> Path:
    """A folder whose `llmservice` package is the tree's src/llmservice plus its mapped folders."""
    pkg = into / "llmservice"
    pkg.mkdir(parents=True)
    for item in (tree / "src" / "llmservice").iterdir():
        (pkg / item.name).symlink_to(item)
    for folder in ("server", "kernels", "operator"):
        (pkg / folder).symlink_to(tree / folder)
    return into


def run_side(tree: Path, pythonpath: str | None, args: argparse.Namespace, out: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, str(tree / "bench" / "offline_throughput.py"), "--skip-hf",
           "--threads", str(args.threads), "--num-requests", str(args.num_requests), "--out", str(out)]
    # cwd outside any checkout: the repository root on sys.path would shadow `operator`
    done = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True)
    match = ENGINE_LINE.search(done.stdout)
    if match is None:
        raise RuntimeError(f"no engine figure in the output of {cmd}:\n{done.stdout[-2000:]}")
    return float(match.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="the earlier revision (commit, tag, branch)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--num-requests", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    base_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.base], capture_output=True,
                              text=True, check=True).stdout.strip()
    head_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    runs: dict[str, list[float]] = {"base": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), base_rev],
                       check=True, capture_output=True)
        try:
            base_path = str(overlay(tree, Path(tmp) / "overlay"))
            for rnd in range(args.rounds):
                for side in ("base", "new"):
                    tok_s = run_side(tree if side == "base" else ROOT, base_path if side == "base" else None,
                                     args, Path(tmp) / f"{side}-{rnd}")
                    runs[side].append(tok_s)
                    print(f"round {rnd + 1} {side}: {tok_s:.1f} output tok/s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    ratio = statistics.median(runs["new"]) / statistics.median(runs["base"])
    print(f"new / base (medians): {ratio:.3f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"base": base_rev, "new": head_rev, "num_requests": args.num_requests, "threads": args.threads,
              "output_tok_per_s": runs, "ratio_of_medians": ratio}
    (RESULTS / "compare_revisions.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
