from __future__ import annotations

from llmservice.server.api.backpressure import admission_decision, retry_after_seconds


def test_admits_up_to_the_bound_then_503_with_retry_after():
    assert admission_decision(waiting=7, new=1, limit=8).status == 200
    d = admission_decision(waiting=8, new=1, limit=8, running=4)
    assert d.status == 503 and d.retry_after_s == 2 and "8 requests are waiting" in d.message


def test_a_request_larger_than_the_bound_is_400():
    d = admission_decision(waiting=0, new=9, limit=8)
    assert d.status == 400 and "--max-waiting-requests 8" in d.message


def test_unbounded():
    assert admission_decision(waiting=10**6, new=10, limit=None).status == 200


def test_retry_after_is_clamped():
    assert retry_after_seconds(0, 0) == 1
    assert retry_after_seconds(10**6, 1) == 60
