"""The advisor's hysteresis (two windows to appear, one to clear) and its per-service
state in the operator: per-pod snapshots, aggregation over pods."""

from __future__ import annotations

from pathlib import Path

from llmservice.operator.advisor.hysteresis import Hysteresis, step
from llmservice.operator.advisor.service_advice import PodPage, ServiceAdvisor, enabled
from llmservice.operator.advisor.snapshot import parse

FIXTURES = Path(__file__).parent / "advisor_fixtures"


def test_a_finding_appears_after_two_windows_and_clears_after_one():
    windows = [{"a"}, {"a"}, {"a", "b"}, {"b"}, set(), {"b"}, {"b"}]
    shown, appeared, cleared = [], [], []
    state = Hysteresis()
    for present in windows:
        s = step(state, present)
        state = s.state
        shown.append(set(s.shown))
        appeared.append(set(s.appeared))
        cleared.append(set(s.cleared))
    assert shown == [set(), {"a"}, {"a"}, {"b"}, set(), set(), {"b"}]
    assert appeared == [set(), {"a"}, set(), {"b"}, set(), set(), {"b"}]
    assert cleared == [set(), set(), set(), {"a"}, {"b"}, set(), set()]


def test_a_one_window_blip_never_shows():
    state = Hysteresis()
    for present in ({"a"}, set(), {"a"}, set()):
        s = step(state, present)
        assert not s.shown
        state = s.state


def _pages(name: str) -> dict[str, PodPage]:
    return {
        which: PodPage(uid=f"uid-{name}", name=name, scrape=parse((FIXTURES / f"vllm_block32_{which}.prom").read_text()))
        for which in ("before", "after")
    }


def test_service_advisor_needs_a_previous_page_then_two_windows():
    advisor = ServiceAdvisor()
    a, b = _pages("pod-a"), _pages("pod-b")
    assert advisor.window({}, [a["before"], b["before"]], now=0).findings == []  # no window yet
    first = advisor.window({}, [a["after"], b["after"]], now=60)
    assert first.findings == []  # one window: pending
    # the counters keep growing the same way in the next window: same evidence again
    advisor.last = {k: (_pages("x")["before"].scrape, t) for k, (_, t) in advisor.last.items()}
    second = advisor.window({}, [a["after"], b["after"]], now=120)
    assert [f["rule"] for f in second.findings] == ["block-size"]
    assert second.findings[0]["pods"] == ["pod-a", "pod-b"]
    assert second.appeared == second.findings


def test_the_spec_fix_clears_the_finding_at_the_next_window():
    advisor = ServiceAdvisor()
    a = _pages("pod-a")
    for now in (0, 60, 120):
        advisor.last = {k: (a["before"].scrape, now - 60) for k in advisor.last}
        advice = advisor.window({}, [a["after"] if now else a["before"]], now=now)
    assert [f["rule"] for f in advice.findings] == ["block-size"]
    advisor.last = {k: (a["before"].scrape, 120) for k in advisor.last}
    fixed = advisor.window({"engine": {"blockSize": 16}}, [a["after"]], now=180)
    assert fixed.findings == [] and fixed.appeared == []


def test_advisor_enabled_defaults_to_true():
    assert enabled(None) and enabled({}) and enabled({"advisor": {}})
    assert not enabled({"advisor": {"enabled": False}})
