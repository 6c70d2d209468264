"""N-gram prompt lookup (vLLM's `ngram` method): the draft is what followed the most
recent earlier occurrence of the sequence's last n tokens, longest n first.

Costs no model: text that quotes its context (summaries, edits, code) gets the quoted
run for free, and text with no repeats gets no draft at all, so speculation is skipped
instead of wasting a verification.
"""

from __future__ import annotations


def propose_ngram(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the last occurrence (before the end) of the longest
    suffix of `tokens` of length in [min_n, max_n]; [] when no such suffix repeats."""
    size = len(tokens)
    if k <= 0 or size < min_n + 1:
        return []
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = tokens[size - n :]
        first = suffix[0]
        # scan right to left: the most recent match quotes the freshest context
        start = size - n - 1
        while start >= 0:
            try:
                start = _rindex(tokens, first, start)
            except ValueError:
                break
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                if follow:
                    return follow
            start -= 1
    return []


def _rindex(tokens: list[int], value: int, last: int) -> int:
    """The largest index <= last holding value (ValueError if none)."""
    for i in range(last, -1, -1):
        if tokens[i] == value:
            return i
    raise ValueError(value)
