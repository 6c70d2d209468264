"""The kernel benchmark (bench/kernel_bench.py): its pure arithmetic, and a tiny end-to-end
CPU run (`--smoke`, Triton interpreter) so the script cannot rot while no GPU is around.

bench/ holds scripts, not a package: the arithmetic module is loaded from its file, and the
script runs the way it is run by hand, in its own interpreter.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
_spec = importlib.util.spec_from_file_location("kernel_metrics", BENCH / "kernel_metrics.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_causal_flops_count_only_visible_pairs():
    # fresh prompt of 2: query 0 sees 1 key, query 1 sees 2 -> 3 pairs x 4 flops x D x H
    assert bench.causal_attention_flops([(2, 2)], num_heads=1, head_dim=1) == 12
    # one new token on a 4-token prefix sees 5 keys
    assert bench.causal_attention_flops([(1, 5)], num_heads=2, head_dim=8) == 4 * 8 * 2 * 5
    # chunk of 3 on a prefix of 10: 3 * 10 + (1 + 2 + 3)
    assert bench.causal_attention_flops([(3, 13)], num_heads=1, head_dim=1) == 4 * 36


def _report(decode_gbps: dict[tuple[int, int], float]) -> dict:
    return {
        "copy_GBps": 4000.0,
        "matmul_TFLOPs": 800.0,
        "correctness": [{"ok": True}, {"ok": True}],
        "decode": [{"batch": b, "context": c, "GBps": g} for (b, c), g in decode_gbps.items()],
        "prefill": [{"TFLOPs": 400.0}, {"skipped": "time budget"}],
    }


def test_summary_judges_the_target_on_large_cases_only():
    report = _report(
        {(1, 32768): 500.0, (32, 2048): 100.0, (32, 4096): 3000.0, (256, 8192): 3600.0}
    )
    summary = bench.summarize(report)
    assert summary["decode_target_cases"] == 2  # batch >= 32 and context >= 4096
    assert summary["decode_min_fraction_of_copy_bw"] == pytest.approx(0.75)
    assert summary["decode_meets_70pct"] is True
    assert summary["prefill_best_fraction_of_matmul"] == pytest.approx(0.5)

    report = _report({(64, 4096): 2000.0, (64, 8192): 3600.0})
    assert bench.summarize(report)["decode_meets_70pct"] is False


def test_smoke_run_writes_a_complete_report(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH / "kernel_bench.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "TRITON_INTERPRET": "1"},  # a smoke run is a CPU run
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    [path] = tmp_path.glob("smoke-*.json")
    report = json.loads(path.read_text())

    kernels = {c["kernel"] for c in report["correctness"]}
    assert {
        "decode attention",
        "rotary (k)",
        "kv write (bit exact)",
        "swap out + in (bit exact)",
    } <= kernels
    assert all(c["ok"] for c in report["correctness"])
    assert report["copy_GBps"] > 0 and report["matmul_TFLOPs"] > 0
    timed = [r for r in report["decode"] if "GBps" in r]
    assert len(timed) == len(report["plan"]["decode_batches"]) * len(
        report["plan"]["decode_contexts"]
    )
    assert all(r["ms"] > 0 and r["num_splits"] >= 1 for r in timed)
    assert report["decode_tuning"] and report["decode_split_ablation"]
    assert all(r["TFLOPs"] > 0 for r in report["prefill"])
    assert report["engine_step"]["torch_ms"] > 0, report["engine_step"]
    assert report["summary"]["all_correct"] is True
    printed = done.stdout
    assert "correctness: all ok" in printed and printed.rstrip().splitlines()[-1].startswith(
        "target"
    )
