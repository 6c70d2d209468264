"""Verification of draft tokens against the target's logits at k+1 positions.

Row j of a request's logits is the target's distribution for the token after draft
j-1 (row 0: after the last known token). Greedy keeps the longest draft prefix equal
to the target's argmax, then the target's own token: exactly what decoding one token
at a time would produce. Sampling uses standard rejection sampling (Leviathan et al.
2023, Chen et al. 2023): draft x_j is kept with probability min(1, p_j(x_j) / q_j(x_j));
the first rejected position draws from norm(max(p_j - q_j, 0)); when every draft is kept
a bonus token is drawn from p_k. The output then has the target's distribution p,
whatever the draft proposed. A deterministic draft (n-gram) has q = one-hot.
"""

from __future__ import annotations

import torch
from llmservice.server.engine.request import TokenLogprob
from llmservice.server.engine.sampler import Sampler, SampleRow, _filter_top_k_top_p
from llmservice.server.engine.sampling_params import SamplingParams


def greedy_accept(draft: list[int], target_argmax: list[int]) -> list[int]:
    """The accepted drafts then the target's next token (len(target_argmax) == len(draft) + 1)."""
    out: list[int] = []
    for j, token in enumerate(draft):
        if target_argmax[j] != token:
            break
        out.append(token)
    out.append(target_argmax[len(out)])
    return out


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws from, per row [n, vocab] (fp32, host)."""
    rows = [
        _filter_top_k_top_p(row / params.temperature, params.top_k, params.top_p)
        for row in logits.float()
    ]
    return torch.stack(rows).softmax(-1)


def rejection_sample(
    draft: list[int],
    p: torch.Tensor,
    q: torch.Tensor | None,
    generators: list[torch.Generator],
) -> list[int]:
    """Accepted drafts then one token drawn as above. p: [k+1, vocab] target; q: [k, vocab]
    draft distributions, None for a deterministic draft; generators: k+1, one per position."""
    out: list[int] = []
    for j, token in enumerate(draft):
        pj = p[j]
        qx = 1.0 if q is None else float(q[j, token])
        u = float(torch.rand((), generator=generators[j]))
        if qx > 0 and u * qx < float(pj[token]):  # u < p/q without dividing by zero
            out.append(token)
            continue
        residual = pj.clone()
        if q is None:
            residual[token] = 0.0
        else:
            residual = (residual - q[j]).clamp_min(0.0)
        total = float(residual.sum())
        # p == q on the support (total 0) cannot reject; guard float round-off anyway
        dist = residual / total if total > 0 else pj
        out.append(int(torch.multinomial(dist, 1, generator=generators[j]).item()))
        return out
    out.append(int(torch.multinomial(p[len(draft)], 1, generator=generators[len(draft)]).item()))
    return out


def position_generators(row: SampleRow, shared: torch.Generator, n: int) -> list[torch.Generator]:
    """One generator per output position: seeded requests derive it from (seed, position)
    as the sampler does, so their output does not depend on the batch."""
    seed = row.params.seed
    if seed is None:
        return [shared] * n
    return [
        torch.Generator().manual_seed(hash((seed, row.output_index + j)) & (2**63 - 1))
        for j in range(n)
    ]


def logprobs_of(logits: torch.Tensor, tokens: list[int], num_top: int) -> list[TokenLogprob]:
    """The sampler's logprobs (raw logits' log-softmax) for each chosen token, row by row."""
    logp = logits[: len(tokens)].float().log_softmax(-1).cpu()
    result = []
    for j, token in enumerate(tokens):
        top = []
        if num_top > 0:
            values, ids = torch.topk(logp[j], num_top)
            top = list(zip(ids.tolist(), values.tolist(), strict=True))
        result.append(TokenLogprob(token_id=token, logprob=float(logp[j, token]), top=top))
    return result


def verify(
    logits: torch.Tensor,
    draft: list[int],
    row: SampleRow,
    shared: torch.Generator,
    draft_probs: torch.Tensor | None = None,
) -> tuple[list[int], list[TokenLogprob]]:
    """One request's new tokens (1..k+1) and, if it asked, their logprobs; logits [k+1, vocab]."""
    params = row.params
    if params.greedy:
        tokens = greedy_accept(draft, logits.argmax(dim=-1).tolist())
    else:
        p = target_probs(logits.cpu(), params)
        q = None if draft_probs is None else draft_probs.float().cpu()
        tokens = rejection_sample(draft, p, q, position_generators(row, shared, len(draft) + 1))
    lps = [] if params.logprobs is None else logprobs_of(logits, tokens, params.logprobs)
    return tokens, lps


def sample_with_drafts(
    sampler: Sampler,
    logits: torch.Tensor,
    sample_rows: list[tuple[str, SampleRow]],
    drafts: dict[str, list[int]],
) -> tuple[dict[str, list[int]], dict[str, list[TokenLogprob]]]:
    """A step's sampling when some requests carry drafts: logits hold 1 + len(drafts)
    rows per sampling request, in sample_rows' order. Requests without drafts go through
    the sampler as one batch (the same draws as a step without speculation)."""
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list[TokenLogprob]] = {}
    plain_rows: list[int] = []
    plain: list[tuple[str, SampleRow]] = []
    at = 0
    for rid, row in sample_rows:
        draft = drafts.get(rid, [])
        if draft:
            new, lps = verify(logits[at : at + len(draft) + 1], draft, row, sampler.generator)
            tokens[rid] = new
            if lps:
                logprobs[rid] = lps
        else:
            plain_rows.append(at)
            plain.append((rid, row))
        at += len(draft) + 1
    if plain:
        picked = logits[torch.tensor(plain_rows, device=logits.device)]
        for (rid, _), (token, lp) in zip(
            plain, sampler(picked, [row for _, row in plain]), strict=True
        ):
            tokens[rid] = [token]
            if lp is not None:
                logprobs[rid] = [lp]
    return tokens, logprobs
