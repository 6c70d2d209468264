"""The pure parts of speculative decoding: n-gram lookup, greedy acceptance, and the
rejection sampler's exactness (its output has the target's distribution whatever q)."""

from __future__ import annotations

import torch
from llmservice.server.engine.sampler import SampleRow
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.spec_ngram import propose_ngram
from llmservice.server.engine.spec_verify import greedy_accept, rejection_sample, verify


def chi_square_p(observed: list[int], expected_probs: list[float]) -> float:
    """Pearson's test p-value (survival of chi2 with len-1 degrees of freedom)."""
    n = sum(observed)
    stat = sum((o - n * e) ** 2 / (n * e) for o, e in zip(observed, expected_probs, strict=True))
    df = len(observed) - 1
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


def test_ngram_proposes_what_followed_the_last_match():
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert propose_ngram(tokens, k=2, min_n=2, max_n=3) == [7, 8]  # the most recent [1, 2, 3]
    assert propose_ngram(tokens, k=5, min_n=2, max_n=3) == [7, 8, 1, 2, 3]


def test_ngram_prefers_the_longest_suffix():
    # [3, 4] last occurred before 9; the longer [2, 3, 4] only before 5
    tokens = [2, 3, 4, 5, 0, 3, 4, 9, 0, 2, 3, 4]
    assert propose_ngram(tokens, k=1, min_n=2, max_n=3) == [5]
    assert propose_ngram(tokens, k=1, min_n=2, max_n=2) == [9]


def test_ngram_without_a_repeat_proposes_nothing():
    assert propose_ngram(list(range(50)), k=4, min_n=2, max_n=4) == []
    assert propose_ngram([5, 6, 5], k=4, min_n=2, max_n=4) == []  # only n=1 repeats, below min_n
    assert propose_ngram([5, 6, 5], k=4, min_n=1, max_n=4) == [6, 5]
    assert propose_ngram([1, 2, 1, 2], k=0, min_n=1, max_n=2) == []
    assert propose_ngram([7], k=3, min_n=1, max_n=2) == []


def test_ngram_draft_is_cut_at_the_end_of_the_sequence():
    assert propose_ngram([4, 5, 6, 4, 5], k=8, min_n=2, max_n=2) == [6, 4, 5]


def test_greedy_keeps_the_matching_prefix_then_the_targets_token():
    assert greedy_accept([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]
    assert greedy_accept([5, 6, 7], [5, 9, 7, 8]) == [5, 9]
    assert greedy_accept([5, 6, 7], [1, 6, 7, 8]) == [1]
    assert greedy_accept([], [3]) == [3]


def test_verify_greedy_on_logits():
    logits = torch.full((3, 10), -5.0)
    logits[0, 4] = logits[1, 2] = logits[2, 9] = 5.0
    row = SampleRow(SamplingParams(temperature=0, logprobs=1))
    tokens, lps = verify(logits, [4, 3], row, torch.Generator())
    assert tokens == [4, 2]
    assert [lp.token_id for lp in lps] == [4, 2] and lps[0].top[0][0] == 4


P = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]])
Q = torch.tensor([[0.1, 0.1, 0.1, 0.7]])  # a bad draft: most mass where p has least


def _first_tokens(draft_fn, n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    counts = [0] * 4
    for _ in range(n):
        draft, q = draft_fn(gen)
        counts[rejection_sample(draft, P, q, [gen, gen])[0]] += 1
    return counts


def test_rejection_sampling_with_a_sampled_draft_has_the_targets_distribution():
    # 4,000 draws, 3 degrees of freedom: moving 0.05 of probability between two tokens
    # (noncentrality >= 4000 * 0.05^2 * (1/0.5 + 1/0.3) = 53) is found with power > 0.99
    # at alpha 0.01; a seeded run's false-alarm rate is the alpha, 1 %
    counts = _first_tokens(
        lambda g: ([int(torch.multinomial(Q[0], 1, generator=g))], Q), 4000, seed=1
    )
    assert chi_square_p(counts, P[0].tolist()) > 0.01
    # the draft's own distribution is rejected by the same test: the test has power
    assert chi_square_p(counts, Q[0].tolist()) < 1e-6


def test_rejection_sampling_with_a_deterministic_draft_has_the_targets_distribution():
    counts = _first_tokens(lambda g: ([3], None), 4000, seed=3)
    assert chi_square_p(counts, P[0].tolist()) > 0.01


def test_a_draft_equal_to_the_target_is_always_accepted():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert rejection_sample([1], p, p[:1], [gen, gen]) == [1, 2]
    assert rejection_sample([0], p, None, [gen, gen]) == [1]  # p(0) = 0: rejected, residual is p
