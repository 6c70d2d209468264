"""The autoscaler scenario's PNG, drawn from the JSON it saved (so it can be redrawn):

    .venv/bin/python tests/e2e/plot.py [bench/results/autoscale_e2e.json]

No sibling imports: it runs as a script and is imported by the scenario alike.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULT = Path(__file__).resolve().parents[2] / "bench" / "results" / "autoscale_e2e.json"


def plot(saved: dict[str, Any], path: Path) -> None:
    """Replicas, preemptions and KV usage over time; `saved` is the scenario's JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    service, pods = saved["timeline"]["service"], saved["timeline"]["pods"]
    marks, result = saved["marks"], saved["result"]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    ts = [s["t"] for s in service]
    axes[0].step(ts, [s["replicas"] for s in service], where="post", label="spec.replicas")
    axes[0].step(ts, [s["readyReplicas"] for s in service], where="post", label="ready", ls="--")
    axes[0].set_ylabel("replicas")
    axes[0].set_ylim(0, 3.5)
    axes[1].plot(
        ts,
        [s["signals"].get("preemptionsPerMinute") for s in service],
        label="operator: preemptions/min (all pods)",
        drawstyle="steps-post",
    )
    first_seen: dict[str, float] = {}
    for p in pods:
        first_seen.setdefault(p["pod"], p["t"])
    for i, pod in enumerate(sorted(first_seen, key=first_seen.__getitem__)):
        mine = [p for p in pods if p["pod"] == pod]
        color = f"C{i + 2}"
        axes[1].plot([p["t"] for p in mine], [p["preemptions_total"] for p in mine], color=color,
                     label=f"pod {i + 1}: vllm:num_preemptions_total", alpha=0.6)  # fmt: skip
        axes[2].plot([p["t"] for p in mine], [p["kv_cache_usage"] for p in mine], color=color,
                     label=f"pod {i + 1}: vllm:kv_cache_usage_perc", alpha=0.7)  # fmt: skip
    axes[1].axhline(5, color="grey", ls=":", label="target 5/min/replica")
    axes[1].set_ylabel("preemptions (/min; total)")
    axes[2].set_ylabel("KV cache usage")
    axes[2].set_xlabel("seconds")
    for ax in axes:
        for what, t in marks.items():
            if what in ("load started", "load stopped"):
                ax.axvline(t, color="black", alpha=0.3)
        if result.get("threshold_crossed_s") is not None:
            ax.axvline(result["threshold_crossed_s"], color="red", alpha=0.4)
        if result.get("replicas_patched_s") is not None:
            ax.axvline(result["replicas_patched_s"], color="green", alpha=0.4)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(
        f"Autoscaling on preemptions: reaction {result.get('reaction_time_s')} s "
        f"(red: first preemption, green: replicas patched)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description="redraw the autoscaler scenario's PNG from its JSON")
    ap.add_argument("json", nargs="?", type=Path, default=RESULT)
    args = ap.parse_args()
    png = args.json.with_suffix(".png")
    plot(json.loads(args.json.read_text()), png)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
