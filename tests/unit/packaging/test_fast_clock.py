"""hack/fast-clock: the half-speed clock `make test-fast-clock` gives every Python process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SHIM = Path(__file__).resolve().parents[3] / "hack" / "fast-clock"


def run_child(code: str, **env: str) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("LLMSERVICE_CLOCK_")}
    full_env = {**inherited, "PYTHONPATH": str(SHIM), **env}
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=60)


def test_a_child_reads_the_shared_epoch_plus_half_the_real_time_since_it() -> None:
    # the epoch is 20 real seconds ago: the child's clock has advanced 10 s since it
    real_now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # not scaled, even in a fast-clock run
    epoch_ns = real_now_ns - 20_000_000_000
    out = run_child(
        "import time; print(time.monotonic(), time.perf_counter(), time.monotonic_ns())",
        LLMSERVICE_CLOCK_RATE="0.5", LLMSERVICE_CLOCK_EPOCH=str(epoch_ns),
    )
    assert out.returncode == 0, out.stderr
    monotonic, perf_counter, monotonic_ns = (float(v) for v in out.stdout.split())
    for reading in (monotonic, perf_counter, monotonic_ns / 1e9):
        advanced = reading - epoch_ns / 1e9
        assert 10.0 <= advanced < 10.0 + 30.0 * 0.5  # 10 s, plus half of however long the child took


def test_rate_one_leaves_the_clock_alone() -> None:
    out = run_child("import time; print(time.monotonic.__module__, time.sleep.__module__)", LLMSERVICE_CLOCK_RATE="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["time", "time"]  # the builtins, not sitecustomize's functions


def test_a_rate_outside_zero_to_one_is_refused_with_the_value() -> None:
    out = run_child("pass", LLMSERVICE_CLOCK_RATE="2")
    assert out.returncode != 0
    assert "LLMSERVICE_CLOCK_RATE=2.0" in out.stderr


def test_every_duration_clock_and_sleep_are_scaled_and_timestamps_are_not() -> None:
    names = ["monotonic", "perf_counter", "process_time", "thread_time", "sleep", "time"]
    out = run_child(f"import time; print(*(getattr(time, n).__module__ for n in {names!r}))", LLMSERVICE_CLOCK_RATE="0.5")
    assert out.returncode == 0, out.stderr
    assert dict(zip(names, out.stdout.split(), strict=True)) == {
        "monotonic": "sitecustomize", "perf_counter": "sitecustomize", "process_time": "sitecustomize",
        "thread_time": "sitecustomize", "sleep": "sitecustomize", "time": "time",
    }
