"""Turn logits into tokens: greedy, temperature, top-k, top-p, per-request seeds, logprobs.

Seeded requests draw from a generator seeded by (seed, output position), so their
samples do not depend on what else is in the batch.

Constrained rows (structured outputs) carry a packed token bitmask from their grammar
(grammar.py); disallowed tokens get -inf before anything else reads the logits, so
greedy, sampling and logprobs all see the constrained distribution. Only those rows are
touched: a batch without them does no extra work, and free rows in a mixed batch are
never copied or masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from llmservice.server.engine.request import TokenLogprob
from llmservice.server.engine.sampling_params import SamplingParams


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        cum = probs.cumsum(-1)
        remove = cum - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    return logits


@dataclass(frozen=True)
class SampleRow:
    """What sampling one logits row needs: the request's parameters and which output
    token this is (seeded requests draw from a generator seeded by that position)."""

    params: SamplingParams
    output_index: int = 0
    # xgrammar's packed int32 bitmask of the allowed next tokens (bit set: allowed); None: free
    bitmask: torch.Tensor | None = None


@torch.inference_mode()  # the model's logits are inference tensors: in-place needs the mode
def apply_bitmasks(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """Mask the constrained rows in place with xgrammar's kernel for the logits' device:
    one [batch, vocab/32] int32 mask (free rows all ones, never read: `indices` names
    the constrained rows), so no logits row is copied."""
    picked = [i for i, row in enumerate(rows) if row.bitmask is not None]
    if not picked:
        return
    import xgrammar as xgr

    full = torch.full((len(rows), rows[picked[0]].bitmask.shape[-1]), -1, dtype=torch.int32)
    for i in picked:
        full[i] = rows[i].bitmask
    full = full.to(logits.device, non_blocking=True)
    indices = None if len(picked) == len(rows) else picked
    if logits.is_contiguous():
        xgr.apply_token_bitmask_inplace(logits, full, vocab_size=logits.shape[-1], indices=indices)
        return
    dense = logits.contiguous()  # the kernel wants a dense block
    xgr.apply_token_bitmask_inplace(dense, full, vocab_size=logits.shape[-1], indices=indices)
    logits.copy_(dense)


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[tuple[int, TokenLogprob | None]]:
        # Argmax where the logits are; only the rows that sample or want logprobs cross to
        # the host. On a GPU the whole [batch, vocab] block is ~70 MB per step at batch
        # 139 of Llama-3's 128k vocabulary, and a host argmax over it costs more than a
        # decode step's weight reads.
        apply_bitmasks(logits, rows)
        tokens = logits.argmax(dim=-1).tolist()
        wanted = [i for i, row in enumerate(rows) if not row.params.greedy or row.params.logprobs is not None]
        host_rows: dict[int, torch.Tensor] = {}
        if wanted:
            # a batch that samples throughout is moved whole: no gather copy first
            picked = logits if len(wanted) == len(rows) else logits[torch.tensor(wanted, device=logits.device)]
            picked = picked.float().cpu()
            host_rows = dict(zip(wanted, picked, strict=True))
        results: list[tuple[int, TokenLogprob | None]] = []
        for i, row in enumerate(rows):
            sp = row.params
            token = tokens[i]
            if not sp.greedy:
                scaled = _filter_top_k_top_p(host_rows[i] / sp.temperature, sp.top_k, sp.top_p)
                probs = scaled.softmax(-1)
                # A grammar that allows no token (all -inf), or a temperature so small that
                # the scaled row is not a distribution, leaves NaNs: such a row takes the
                # argmax, as greedy does, instead of a draw that raises and stops the engine.
                if bool(torch.isfinite(probs).all()):
                    gen = self.generator
                    if sp.seed is not None:
                        gen = torch.Generator().manual_seed(hash((sp.seed, row.output_index)) & (2**63 - 1))
                    token = int(torch.multinomial(probs, 1, generator=gen).item())
            lp = None
            if sp.logprobs is not None:
                logp = host_rows[i].log_softmax(-1)
                top = []
                if sp.logprobs > 0:
                    values, ids = torch.topk(logp, sp.logprobs)
                    top = list(zip(ids.tolist(), values.tolist(), strict=True))
                lp = TokenLogprob(token_id=token, logprob=float(logp[token]), top=top)
            results.append((token, lp))
        return results
