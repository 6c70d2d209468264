"""hub.LogProgress: the download's log lines give bytes, rate and the time left."""

from __future__ import annotations

import logging

import pytest
from llmservice.server.model import hub


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(hub.time, "monotonic", lambda: now[0])
    return now


def test_lines_give_bytes_rate_and_eta_then_the_total_time(clock, caplog) -> None:
    caplog.set_level(logging.INFO, logger=hub.log.name)
    bar = hub.LogProgress(total=400_000_000, label="model-00001-of-00002.safetensors")
    for _ in range(4):  # 100 MB a 2.5 s: 40 MB/s
        clock[0] += 2.5
        bar.update(100_000_000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "downloading model-00001-of-00002.safetensors: 0.10 GB of 0.40 GB (25%), 40.0 MB/s, ETA 8 s"
    assert lines[-1] == "downloading model-00001-of-00002.safetensors: 0.40 GB of 0.40 GB (100%), 40.0 MB/s, done in 10.0 s"
    assert len(lines) == 4


def test_at_most_one_line_per_two_seconds_until_the_end(clock, caplog) -> None:
    caplog.set_level(logging.INFO, logger=hub.log.name)
    bar = hub.LogProgress(total=1_000_000, desc="config.json")
    for _ in range(10):  # 10 % every 0.1 s: only the last update logs
        clock[0] += 0.1
        bar.update(100_000)
    assert [r.getMessage() for r in caplog.records] == [
        "downloading config.json: 1.0 MB of 1.0 MB (100%), 1.0 MB/s, done in 1.0 s"
    ]
