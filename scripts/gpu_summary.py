"""The issue-18 figures of a GPU session against their targets, in one file:
bench/results/gpu-<date>.json (from the stage JSONs the session wrote to RES).

    python scripts/gpu_summary.py RES_DIR [--date 2026-12-04]
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

TARGETS = {"decode_b128_ms": 6.0, "decode_b128_floor_fraction": 0.65, "batch1_tok_per_s": 220.0,
           "offline_tok_per_s": 14000.0}  # fmt: skip


def _load(folder: Path, name: str) -> dict:
    path = folder / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {"missing": f"{path.name}: {exc}"}


def _run(decode: dict, mode: str, batch: int) -> dict:
    return next((r for r in decode.get("runs", []) if r["mode"] == mode and r["batch"] == batch), {})


def summarize(folder: Path) -> dict:
    """Pure over the stage files: each figure, its target and whether it is met (None: not measured)."""
    check, decode, offline, kv_fp8 = (_load(folder, f"gpu-{n}.json")
                                      for n in ("engine_check", "decode_step", "offline_throughput", "kv_fp8"))  # fmt: skip
    g128, e128, g1, e1 = _run(decode, "graphs", 128), _run(decode, "eager", 128), _run(decode, "graphs", 1), _run(decode, "eager", 1)
    engine = offline.get("engine", {})
    bw = decode.get("copy_bytes_per_s")
    floor_tok_s = (engine["decode_mean_batch"] * bw / engine["weight_bytes"]
                   if bw and engine.get("weight_bytes") and engine.get("decode_mean_batch") else None)  # fmt: skip
    figures = {
        "decode_b128_ms": g128.get("step_ms"), "decode_b128_ms_eager": e128.get("step_ms"),
        "decode_b128_floor_fraction": g128.get("floor_fraction"),
        "batch1_tok_per_s": g1.get("tok_per_s"), "batch1_tok_per_s_eager": e1.get("tok_per_s"),
        "launches_per_step_b128": {"eager": {k: e128.get(k) for k in ("python_ops", "kernel_launches", "graph_launches", "device_kernels")},
                                   "graphs": {k: g128.get(k) for k in ("python_ops", "kernel_launches", "graph_launches", "device_kernels")}},
        "offline_tok_per_s": engine.get("output_tok_per_s"), "offline_requests": offline.get("workload", {}).get("num_requests"),
        "offline_vs_hf": offline.get("ratio_vs_best_hf"),
        "offline_vs_weights_floor_at_mean_batch": engine.get("output_tok_per_s") / floor_tok_s if floor_tok_s else None,
        "graphs_identical_fp32": check.get("graphs_vs_eager", {}).get("graphs_sync", {}).get("identical"),
        "graphs_async_identical_fp32": check.get("graphs_vs_eager", {}).get("graphs_async", {}).get("identical"),
        "graphs_identical_to_static_eager": check.get("graphs_vs_eager", {}).get("graphs_sync", {})
                                                 .get("vs_static_eager", {}).get("identical"),
        "no_host_sync": check.get("no_host_sync"),
        "kv_fp8": _kv_fp8_figures(kv_fp8),
        "preemption_under_graphs": {m: {k: v for k, v in r.items() if k in ("identical", "preemptions", "graph_replays", "free_blocks_after", "num_blocks")}
                                    for m, r in check.get("preemption_modes", {}).items() if isinstance(r, dict)},
    }  # fmt: skip
    met = {}
    for key, target in TARGETS.items():
        value = figures.get(key)
        met[key] = None if value is None else (value <= target if key == "decode_b128_ms" else value >= target)
    return {"figures": figures, "targets": TARGETS, "met": met,
            "missing": [d["missing"] for d in (check, decode, offline, kv_fp8) if "missing" in d]}  # fmt: skip


def _kv_fp8_figures(kv_fp8: dict) -> dict:
    """--kv-cache-dtype fp8 vs auto (bf16): block counts, greedy agreement; fp8 Triton vs torch."""
    vs_auto, paths = kv_fp8.get("fp8_vs_auto_bfloat16", {}), kv_fp8.get("fp8_triton_vs_torch_fp32", {})
    runs = vs_auto.get("runs", {})
    return {"num_blocks": {k: r.get("num_blocks") for k, r in runs.items()},
            "max_concurrent_full_length_seqs": {k: r.get("max_concurrent_full_length_seqs") for k, r in runs.items()},
            "block_ratio_fp8_over_auto": vs_auto.get("block_ratio_fp8_over_auto"),
            "greedy_vs_auto": vs_auto.get("greedy"), "graph_replays_fp8": runs.get("fp8", {}).get("graph_replays"),
            "triton_vs_torch_logits_rel_err": paths.get("logits_rel_err"),
            "triton_vs_torch_greedy": paths.get("greedy"),
            "errors": [name for name, r in kv_fp8.items() if isinstance(r, dict) and "error" in r]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    args = ap.parse_args()
    folder = Path(args.folder)
    summary = summarize(folder)
    out = folder / f"gpu-{args.date}.json"
    out.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
