"""Polling helpers for tests against a real, eventually consistent control plane."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from kubernetes.client.rest import ApiException

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], *, what: str, timeout: float = 60.0, every: float = 0.2
) -> T:
    """Poll until `predicate()` is truthy and return it; fail the test with `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def exists(read: Callable[[], object]) -> bool:
    """Whether a read succeeds (False on 404; other API errors propagate)."""
    try:
        read()
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True
