"""scripts/gpu_summary.py: the GPU session's figures against the GPU targets of docs/gpu.md."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "gpu_summary", Path(__file__).resolve().parents[3] / "scripts" / "gpu_summary.py"
)
gpu_summary = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_summary)


def _run(mode: str, batch: int, step_ms: float, floor_fraction: float) -> dict:
    return {"mode": mode, "batch": batch, "step_ms": step_ms, "tok_per_s": batch / step_ms * 1e3,
            "floor_fraction": floor_fraction, "python_ops": 500.0, "kernel_launches": 400.0}  # fmt: skip


def test_targets_met_missed_and_unmeasured(tmp_path: Path):
    decode = {"copy_bytes_per_s": 4e12, "runs": [
        _run("eager", 128, 40.0, 0.1), _run("graphs", 128, 5.5, 0.7), _run("graphs", 1, 5.0, 0.8)]}  # fmt: skip
    (tmp_path / "gpu-decode_step.json").write_text(json.dumps(decode))
    s = gpu_summary.summarize(tmp_path)
    assert s["met"]["decode_b128_ms"] is True and s["met"]["decode_b128_floor_fraction"] is True
    assert s["met"]["batch1_tok_per_s"] is False  # 200 tok/s < 220
    assert s["met"]["offline_tok_per_s"] is None  # no offline file: not measured, not failed
    assert len(s["missing"]) == 3  # offline, engine check, kv_fp8
    assert s["figures"]["launches_per_step_b128"]["eager"]["python_ops"] == 500.0


def test_offline_ratio_to_the_weights_floor(tmp_path: Path):
    (tmp_path / "gpu-decode_step.json").write_text(json.dumps({"copy_bytes_per_s": 4e12, "runs": []}))
    offline = {"engine": {"output_tok_per_s": 15000.0, "decode_mean_batch": 200, "weight_bytes": 16e9},
               "workload": {"num_requests": 5000}, "ratio_vs_best_hf": 60.0}  # fmt: skip
    (tmp_path / "gpu-offline_throughput.json").write_text(json.dumps(offline))
    s = gpu_summary.summarize(tmp_path)
    assert s["met"]["offline_tok_per_s"] is True
    # 200 rows per read of 16 GB at 4 TB/s: 50,000 tok/s at most
    assert abs(s["figures"]["offline_vs_weights_floor_at_mean_batch"] - 0.3) < 1e-9


def test_kv_fp8_figures(tmp_path: Path):
    runs = {"auto": {"num_blocks": 1000, "max_concurrent_full_length_seqs": 15, "graph_replays": 40},
            "fp8": {"num_blocks": 2000, "max_concurrent_full_length_seqs": 31, "graph_replays": 41}}  # fmt: skip
    kv = {"fp8_vs_auto_bfloat16": {"runs": runs, "block_ratio_fp8_over_auto": 2.0, "greedy": {"identical": 0.5}},
          "fp8_triton_vs_torch_fp32": {"error": "Traceback ..."}}  # fmt: skip
    (tmp_path / "gpu-kv_fp8.json").write_text(json.dumps(kv))
    fig = gpu_summary.summarize(tmp_path)["figures"]["kv_fp8"]
    assert fig["num_blocks"] == {"auto": 1000, "fp8": 2000} and fig["block_ratio_fp8_over_auto"] == 2.0
    assert fig["max_concurrent_full_length_seqs"]["fp8"] == 31 and fig["graph_replays_fp8"] == 41
    assert fig["greedy_vs_auto"] == {"identical": 0.5} and fig["triton_vs_torch_logits_rel_err"] is None
    assert fig["errors"] == ["fp8_triton_vs_torch_fp32"]
