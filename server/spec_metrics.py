"""Speculative decoding's metrics, vLLM's names (server/engine/spec_decode.py).

- `vllm:spec_decode_num_drafts_total`: verifications (a request's drafts in one step).
- `vllm:spec_decode_num_draft_tokens_total`: draft tokens proposed and verified.
- `vllm:spec_decode_num_accepted_tokens_total`: of which accepted.
- `vllm:spec_decode_num_accepted_tokens_per_pos_total{position}`: accepted drafts at
  draft position i (0-based): acceptance by position is this over the drafts.
Mean accepted length = 1 + accepted / drafts.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

# (drafts, draft tokens, accepted tokens, accepted per position): cumulative, from the engine
SpecTotals = tuple[int, int, int, tuple[int, ...]]


class SpecMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        labels, m = ["model_name"], {"model_name": model_name}
        self.drafts = Counter(
            "vllm:spec_decode_num_drafts",
            "Number of spec decoding drafts.",
            labels,
            registry=registry,
        ).labels(**m)
        self.draft_tokens = Counter(
            "vllm:spec_decode_num_draft_tokens",
            "Number of draft tokens.",
            labels,
            registry=registry,
        ).labels(**m)
        self.accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            labels,
            registry=registry,
        ).labels(**m)
        self._per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            ["model_name", "position"],
            registry=registry,
        )
        self._model_name = model_name
        self._last: SpecTotals = (0, 0, 0, ())

    def on_totals(self, totals: SpecTotals | None) -> None:
        """Advance the counters to the engine's cumulative totals."""
        if totals is None:
            return
        drafts, tokens, accepted, per_pos = totals
        last_drafts, last_tokens, last_accepted, last_pos = self._last
        self.drafts.inc(max(0, drafts - last_drafts))
        self.draft_tokens.inc(max(0, tokens - last_tokens))
        self.accepted.inc(max(0, accepted - last_accepted))
        for i, n in enumerate(per_pos):
            before = last_pos[i] if i < len(last_pos) else 0
            self._per_pos.labels(model_name=self._model_name, position=str(i)).inc(
                max(0, n - before)
            )
        self._last = totals
