"""Latency CDFs (TTFT, TPOT, ITL, E2EL) of one or more benchmark runs, as a PNG."""

from __future__ import annotations

from pathlib import Path

from llmservice.server.loadgen.stats import RequestResult

PANELS = (
    ("TTFT", lambda rs: [r.ttft for r in rs]),
    ("TPOT", lambda rs: [r.tpot for r in rs if r.output_len > 1]),
    ("ITL", lambda rs: [g for r in rs for g in r.itl]),
    ("E2E latency", lambda rs: [r.latency for r in rs]),
)


def plot_cdfs(runs: dict[str, list[RequestResult]], path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.6))
    for ax, (name, pick) in zip(axes, PANELS, strict=True):
        for label, results in runs.items():
            values = sorted(v * 1000.0 for v in pick([r for r in results if r.success]))
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, ys, where="post", label=label)
        ax.set_title(name)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of samples")
        ax.set_xscale("log")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
