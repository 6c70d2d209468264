"""A periodic probe of the API event loop's lag (`llmservice:event_loop_lag_seconds`).

The probe asks to wake up every `period` seconds and records how late it woke. On a
loop that only moves bytes the lag is well under a millisecond; a tokenizer, a JSON
encode of a huge body or any other CPU work on the loop shows up as lag, which every
token of every stream also waits for (seed 000's fifth mistake, the advisor's rule 5).

A late wake-up has two causes: work on the loop, or a process starved of CPU (a busy
node, a CPU limit). Only the first is fixed by moving work off the loop, so the probe
also records the part of each lag the loop's own thread spent on the CPU
(`llmservice:event_loop_busy_lag_seconds`: min(lag, the loop thread's CPU time since
the previous wake-up)); the advisor needs both to be high.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

PROBE_PERIOD_S = 0.05


async def probe_event_loop(
    observe: Callable[[float], None],
    period: float = PROBE_PERIOD_S,
    observe_busy: Callable[[float], None] | None = None,
) -> None:
    """Run until cancelled; observe(lag) and observe_busy(lag on the loop's CPU) per wake-up."""
    cpu = time.thread_time()  # the loop's thread: the probe runs on it
    while True:
        expected = time.monotonic() + period
        await asyncio.sleep(period)
        lag = max(0.0, time.monotonic() - expected)
        now_cpu = time.thread_time()
        observe(lag)
        if observe_busy is not None:
            observe_busy(min(lag, max(0.0, now_cpu - cpu)))
        cpu = now_cpu
