"""A slower clock for every Python process of a test run: the machine looks faster.

`make test-fast-clock` puts this folder on PYTHONPATH with LLMSERVICE_CLOCK_RATE=0.5, so
every interpreter of the run (pytest, its workers, the servers, engine cores and operators
they start) reads a clock that advances half a second per real second. Work that takes a
real second measures as half a second, as on a machine twice as fast; a test that only
passes because this machine is slow fails here.

What is scaled: time.monotonic, time.perf_counter (and their _ns forms), which measure
durations, time.process_time and time.thread_time (CPU seconds: a fixed piece of work
costs half as many), and time.sleep, which waits for them (a 1 s sleep waits 2 real
seconds, so it still measures 1 s). asyncio reads time.monotonic, so its timers follow. What is not:
time.time and datetime (timestamps shared with the Go control plane must stay true), and
timeouts handed to C (socket timeouts, Event.wait, Queue.get): they wait in real seconds,
as they do in a normal run. All processes share one epoch (LLMSERVICE_CLOCK_EPOCH, set by
the first one and inherited), so monotonic readings compare across processes as they do
with the real clock (CLOCK_MONOTONIC is system-wide).
"""

from __future__ import annotations

import os
import time

_RATE = float(os.environ.get("LLMSERVICE_CLOCK_RATE", "1"))

if _RATE != 1.0:
    if not 0.0 < _RATE <= 1.0:
        raise SystemExit(f"LLMSERVICE_CLOCK_RATE={_RATE!r}: give a rate in (0, 1]")
    _real_monotonic_ns = time.monotonic_ns
    _real_sleep = time.sleep
    _EPOCH_NS = int(os.environ.setdefault("LLMSERVICE_CLOCK_EPOCH", str(_real_monotonic_ns())))

    def _fake_ns() -> int:
        return _EPOCH_NS + int((_real_monotonic_ns() - _EPOCH_NS) * _RATE)

    def _fake_seconds() -> float:
        return _fake_ns() / 1e9

    def _sleep(seconds: float) -> None:
        _real_sleep(seconds / _RATE if seconds > 0 else seconds)

    time.monotonic = _fake_seconds
    time.perf_counter = _fake_seconds
    time.monotonic_ns = _fake_ns
    time.perf_counter_ns = _fake_ns
    time.sleep = _sleep
    for _name in ("process_time", "thread_time"):
        _real_cpu_ns = getattr(time, f"{_name}_ns")
        setattr(time, f"{_name}_ns", lambda real=_real_cpu_ns: int(real() * _RATE))
        setattr(time, _name, lambda real=_real_cpu_ns: real() * _RATE / 1e9)
