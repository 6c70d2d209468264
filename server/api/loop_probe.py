"""A periodic probe of the API event loop's lag (`llmservice:event_loop_lag_seconds`).

The probe asks to wake up every `period` seconds and records how late it woke. On a
loop that only moves bytes the lag is well under a millisecond; a tokenizer, a JSON
encode of a huge body or any other CPU work on the loop shows up as lag, which every
token of every stream also waits for (seed 000's fifth mistake, the advisor's rule 5).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

PROBE_PERIOD_S = 0.05


async def probe_event_loop(observe: Callable[[float], None], period: float = PROBE_PERIOD_S) -> None:
    """Run until cancelled; observe(lag_seconds) after every wake-up."""
    while True:
        expected = time.monotonic() + period
        await asyncio.sleep(period)
        observe(max(0.0, time.monotonic() - expected))
