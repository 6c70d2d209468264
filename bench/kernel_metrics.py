"""The kernel benchmark's pure arithmetic: flops counted, the target judged, the table.

No torch and no sibling imports, so its unit test loads it by file path.
"""

from __future__ import annotations

import statistics


def causal_attention_flops(seqs: list[tuple[int, int]], num_heads: int, head_dim: int) -> float:
    """QK^T and PV over the visible (causal) keys only: 4 * D flops per query-key pair."""
    pairs = 0
    for q_len, seq_len in seqs:
        ctx = seq_len - q_len
        pairs += q_len * ctx + q_len * (q_len + 1) // 2
    return 4.0 * head_dim * num_heads * pairs


def summarize(report: dict) -> dict:
    """The issue's target: decode >= 70% of copy bandwidth at batch >= 32, context >= 4k."""
    copy = report["copy_GBps"]
    target = [
        r for r in report["decode"] if "GBps" in r and r["batch"] >= 32 and r["context"] >= 4096
    ]
    fractions = [r["GBps"] / copy for r in target]
    prefill = [r["TFLOPs"] for r in report["prefill"] if "TFLOPs" in r]
    return {
        "all_correct": all(c["ok"] for c in report["correctness"]),
        "decode_target_cases": len(target),
        "decode_min_fraction_of_copy_bw": min(fractions, default=None),
        "decode_median_fraction_of_copy_bw": statistics.median(fractions) if fractions else None,
        "decode_meets_70pct": bool(fractions) and min(fractions) >= 0.7,
        "prefill_best_fraction_of_matmul": max(prefill, default=0.0) / report["matmul_TFLOPs"],
    }


def table(report: dict) -> str:
    s = report["summary"]
    lines = [f"device: {report['meta']['device']}  elapsed {report['elapsed_s']:.0f}s"]
    bad = [c["kernel"] for c in report["correctness"] if not c["ok"]]
    lines.append(f"correctness: {'all ok' if not bad else 'FAILED: ' + ', '.join(bad)}")
    lines.append(
        f"ceilings: copy {report['copy_GBps']:.0f} GB/s, bf16 matmul {report['matmul_TFLOPs']:.0f} TFLOP/s"
    )
    lines.append(
        "decode GB/s (% of copy)  "
        + "  ".join(f"ctx {c:>5}" for c in report["plan"]["decode_contexts"])
    )
    for b in report["plan"]["decode_batches"]:
        cells = []
        for c in report["plan"]["decode_contexts"]:
            r = next((r for r in report["decode"] if r["batch"] == b and r["context"] == c), {})
            cells.append(
                f"{r['GBps']:5.0f} {100 * r['GBps'] / report['copy_GBps']:3.0f}%"
                if "GBps" in r
                else "      --  "
            )
        lines.append(f"  batch {b:>3}              " + "  ".join(cells))
    for r in report["prefill"]:
        if "TFLOPs" in r:
            lines.append(f"prefill {r['case']:<36} {r['TFLOPs']:7.1f} TFLOP/s  {r['ms']:.2f} ms")
    e = report.get("engine_step", {})
    if "error" in e:
        lines.append(f"engine step: error {e['error']}")
    elif e:
        parts = [
            f"{p} {e[p + '_ms']:.2f} ms ({e[p + '_tok_per_s']:.0f} tok/s)"
            for p in ("triton", "torch")
            if p + "_ms" in e
        ]
        lines.append(f"engine decode step b={e['batch']}: " + ", ".join(parts))
    frac = s["decode_min_fraction_of_copy_bw"]
    lines.append(
        f"target decode >= 70% copy bw (b>=32, ctx>=4k): "
        f"{'MET' if s['decode_meets_70pct'] else 'NOT MET'} (min {100 * frac:.0f}%)"
        if frac is not None
        else "target: no cases ran"
    )
    return "\n".join(lines)
