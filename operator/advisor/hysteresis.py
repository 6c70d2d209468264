"""When a finding is shown: it must hold for two consecutive windows to appear, and it
clears as soon as one window lacks it. Pure.

One window's evidence can be a burst (a batch job's short answers, a minute of
preemptions during a rollout); two in a row is a pattern worth a user's attention. A
finding that went away is cleared at once: stale advice is worse than none.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hysteresis:
    pending: frozenset[str] = frozenset()  # seen in the last window only: not shown yet
    shown: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Step:
    state: Hysteresis
    shown: frozenset[str]
    appeared: frozenset[str]  # shown now, not before: worth an Event
    cleared: frozenset[str]


def step(state: Hysteresis, present: set[str] | frozenset[str]) -> Step:
    """Advance by one window in which the rules found `present`."""
    present = frozenset(present)
    shown = frozenset(r for r in present if r in state.shown or r in state.pending)
    return Step(
        state=Hysteresis(pending=present - shown, shown=shown),
        shown=shown,
        appeared=shown - state.shown,
        cleared=state.shown - shown,
    )
