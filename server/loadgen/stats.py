"""Benchmark metrics from per-request results (pure), as vLLM's `calculate_metrics`.

TTFT: first token. TPOT: (latency - TTFT) / (output tokens - 1), per request. ITL:
every gap between two streamed token chunks. E2EL: whole request, client side.
Goodput: requests meeting every given SLO, per second.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class RequestResult:
    success: bool
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0  # seconds
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start: float = 0.0  # seconds after the benchmark started
    error: str = ""

    @property
    def tpot(self) -> float:
        return (self.latency - self.ttft) / (self.output_len - 1) if self.output_len > 1 else 0.0


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """['ttft:500', 'tpot:50'] -> {'ttft': 500.0, 'tpot': 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"--goodput {item!r}: expected NAME:MS with NAME in {list(SLO_METRICS)}")
        ms = float(value)
        if ms <= 0:
            raise ValueError(f"--goodput {item!r}: the limit must be > 0 ms")
        slos[name] = ms
    return slos


def meets_slos(r: RequestResult, slos: dict[str, float]) -> bool:
    values = {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.latency}
    return all(values[name] * 1000.0 <= limit for name, limit in slos.items())


def _describe(values_s: list[float], percentiles: list[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    out = {
        "mean_ms": statistics.fmean(ms) if ms else math.nan,
        "median_ms": statistics.median(ms) if ms else math.nan,
        "std_ms": statistics.pstdev(ms) if ms else math.nan,
    }
    for p in percentiles:
        out[f"p{p:g}_ms"] = percentile(ms, p)
    return out


def summarize(
    results: list[RequestResult], duration_s: float, slos: dict[str, float] | None = None,
    percentiles: list[float] | None = None,
) -> dict:
    percentiles = percentiles or [50.0, 99.0]
    ok = [r for r in results if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    summary = {
        "duration_s": duration_s,
        "num_requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else math.nan,
        "output_throughput": total_out / duration_s if duration_s > 0 else math.nan,
        "total_token_throughput": (total_in + total_out) / duration_s if duration_s > 0 else math.nan,
        "ttft": _describe([r.ttft for r in ok], percentiles),
        "tpot": _describe([r.tpot for r in ok if r.output_len > 1], percentiles),
        "itl": _describe([g for r in ok for g in r.itl], percentiles),
        "e2el": _describe([r.latency for r in ok], percentiles),
    }
    if slos:
        good = sum(1 for r in ok if meets_slos(r, slos))
        summary["goodput"] = {"slos_ms": slos, "good_requests": good,
                              "request_goodput": good / duration_s if duration_s > 0 else math.nan}
    return summary
