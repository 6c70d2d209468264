"""The operator's advisor hook: scrape results in, status.advice and Advice Events out;
OOMKilled restarts read from the pod (rule 6)."""

from __future__ import annotations

from pathlib import Path

from llmservice.operator.advisor import loop_hook
from llmservice.operator.advisor.service_advice import ServiceAdvisor
from llmservice.operator.scrape import PodTarget, ScrapeResult, pod_target

FIXTURES = Path(__file__).parent / "advisor_fixtures"
POD = PodTarget("uid-1", "svc-abc-1", "127.0.0.1", 8000, ready=True, terminating=False)


def result(which: str) -> ScrapeResult:
    return ScrapeResult(POD, None, text=(FIXTURES / f"vllm_block32_{which}.prom").read_text())


def test_pages_skip_failed_and_unparseable_scrapes():
    pages = loop_hook.pages([result("before"), ScrapeResult(POD, None, "HTTP 500"), ScrapeResult(POD, None, text="{{{ <html>")])
    assert [p.name for p in pages] == ["svc-abc-1"]


def test_advice_fields_and_events_over_windows():
    advisor, body = ServiceAdvisor(), {"spec": {}}
    assert loop_hook.advise(advisor, body, [result("before")], 0) == ({"advice": []}, [])
    assert loop_hook.advise(advisor, body, [result("after")], 60) == ({"advice": []}, [])  # one window
    advisor.last = {k: (loop_hook.pages([result("before")])[0].scrape, 60) for k in advisor.last}
    fields, events = loop_hook.advise(advisor, body, [result("after")], 120)
    assert [f["rule"] for f in fields["advice"]] == ["block-size"]
    assert events == [("Warning", f"block-size: {fields['advice'][0]['summary']}")]


def test_disabled_removes_advice_and_forgets_the_state():
    advisor = ServiceAdvisor()
    loop_hook.advise(advisor, {"spec": {}}, [result("before")], 0)
    off = {"spec": {"advisor": {"enabled": False}}}
    assert loop_hook.advise(advisor, off, [result("after")], 60) == ({"advice": None}, [])
    assert advisor.last == {}


def test_oom_killed_restarts_come_from_the_container_statuses():
    pod = {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {"podIP": "10.0.0.1", "phase": "Running", "containerStatuses": [
            {"restartCount": 2, "lastState": {"terminated": {"reason": "OOMKilled"}}},
            {"restartCount": 5, "lastState": {"terminated": {"reason": "Error"}}},
        ]},
    }
    assert pod_target(pod).oom_restarts == 2
