"""bench serve's pure parts: arrivals, datasets, metrics, goodput."""

from __future__ import annotations

import math
import statistics

import pytest
from llmservice.server.loadgen.arrivals import arrival_offsets
from llmservice.server.loadgen.datasets import make_prompts
from llmservice.server.loadgen.stats import RequestResult, parse_goodput, percentile, summarize


def test_arrivals_span_n_over_rate_with_mean_gap_one_over_rate():
    offs = arrival_offsets(1000, rate=20.0, burstiness=1.0, seed=1)
    assert offs == sorted(offs)
    assert offs[-1] == pytest.approx(1000 / 20.0)
    gaps = [b - a for a, b in zip([0.0, *offs], offs, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.05, rel=1e-6)


def test_burstiness_changes_variability_not_mean():
    def cv(b):
        offs = arrival_offsets(4000, 10.0, b, seed=3)
        gaps = [y - x for x, y in zip([0.0, *offs], offs, strict=False)]
        return statistics.pstdev(gaps) / statistics.fmean(gaps)

    assert cv(0.25) > 1.5 > cv(1.0) > 0.8 > cv(8.0)  # gamma CV = 1/sqrt(shape)


def test_infinite_rate_sends_everything_at_once():
    assert arrival_offsets(5, math.inf) == [0.0] * 5


def test_datasets():
    rnd = make_prompts("random", 5, input_len=10, output_len=7, seed=0)
    assert all(len(p.prompt.split()) == 10 and p.output_len == 7 for p in rnd)
    assert make_prompts("random", 5, 10, 7, seed=0) == rnd
    pre = make_prompts("prefix", 6, input_len=5, prefix_len=20, num_prefixes=2, seed=0)
    heads = {p.prompt.split("\n")[0] for p in pre}
    assert len(heads) == 2 and len({p.prompt for p in pre}) == 6
    share = make_prompts("sharegpt-like", 200, input_len=100, output_len=50, max_len=1024, seed=0)
    lens = [p.approx_prompt_len for p in share]
    assert min(lens) >= 4 and max(lens) <= 512 and len(set(lens)) > 50
    assert all(p.approx_prompt_len + p.output_len <= 1024 for p in share)


def test_summary_metrics_and_goodput():
    rs = [
        RequestResult(True, prompt_len=10, output_len=5, ttft=0.1, itl=[0.02] * 4, latency=0.18),
        RequestResult(True, prompt_len=10, output_len=3, ttft=0.5, itl=[0.1, 0.1], latency=0.7),
        RequestResult(False, error="HTTP 503"),
    ]
    s = summarize(rs, duration_s=2.0, slos=parse_goodput(["ttft:200", "tpot:50"]))
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["output_throughput"] == 4.0 and s["total_token_throughput"] == 14.0
    assert s["tpot"]["mean_ms"] == pytest.approx((20 + 100) / 2)
    assert s["ttft"]["p50_ms"] == pytest.approx(300)
    assert s["goodput"]["good_requests"] == 1 and s["goodput"]["request_goodput"] == 0.5


def test_percentile_and_goodput_parsing():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    with pytest.raises(ValueError):
        parse_goodput(["latency:3"])
