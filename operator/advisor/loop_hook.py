"""What the autoscaling loop does with the advisor each pass: pages -> `status.advice`
and `Advice` Events. The loop scrapes; this turns its results into the advisor's input
and its output into status fields and Event lines (kept out of autoscale_loop.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llmservice.operator.advisor.service_advice import Advice, PodPage, ServiceAdvisor, enabled
from llmservice.operator.advisor.snapshot import parse
from llmservice.operator.scrape import ScrapeResult

EVENT_REASON = "Advice"


def pages(results: Iterable[ScrapeResult]) -> list[PodPage]:
    """The pods whose page parsed (a failed scrape is no evidence either way)."""
    out = []
    for r in results:
        if r.text is None:
            continue
        try:
            scrape = parse(r.text)
        except ValueError:
            continue
        out.append(PodPage(r.target.uid, r.target.name, scrape, r.target.oom_restarts))
    return out


def advise(
    advisor: ServiceAdvisor, body: dict[str, Any], results: Iterable[ScrapeResult], now: float
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """(status fields, [(event type, message)]). Disabled: advice removed, no Events."""
    spec = body.get("spec") or {}
    if not enabled(spec):
        advisor.hysteresis = type(advisor.hysteresis)()
        advisor.last.clear()
        return {"advice": None}, []
    advice: Advice = advisor.window(spec, pages(results), now)
    events = [
        ("Warning" if f["severity"] == "warning" else "Normal", f"{f['rule']}: {f['summary']}")
        for f in advice.appeared
    ]
    return {"advice": advice.findings}, events
