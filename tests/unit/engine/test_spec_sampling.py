"""Sampling with n-gram speculation keeps the target's distribution: on a fixed prompt
that quotes itself (so drafts are proposed and partly accepted), the distribution of the
next 3 tokens with speculation matches the one without, by a chi-square test of
homogeneity (2 x K table, rare sequences pooled so each expected count is >= 5).

Power (e2e size, 2,000 samples a side, alpha 0.01, df >= 3): a change that moves 5 % of
the probability between two sequences of mass 0.2 has noncentrality
n/2 * sum (d^2 / p) = 1000 * 2 * 0.05^2 / 0.2 = 25, found with power ~0.95 at df 3 and
~0.86 at df 10 (normal approximation of the noncentral chi-square); and the
same test tells temperature 1.0 from 1.3 on this prompt (asserted below). Both are
e2e-marked (`make e2e`): 150 a side without the temperature check (gross errors only,
such as drafts accepted unconditionally), and the 2,000-sample test."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from llmservice.server.engine.sampling_params import SamplingParams

# disable_by_batch_size above max_num_seqs: every step drafts (the measured plan
# would turn batches of 128 off), so the whole sample is judged through verification
NGRAM = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3,
     "prompt_lookup_min": 1, "disable_by_batch_size": 4096}
)  # fmt: skip
PROMPT = [1504, 3070, 1093, 3456, 1504, 3070, 1093, 3456, 1504, 3070, 1093, 3456, 1504, 3070]


def homogeneity_p(a: Counter, b: Counter) -> tuple[float, int]:
    """Pearson's chi-square test that two samples come from one distribution; (p, df)."""
    na, nb = sum(a.values()), sum(b.values())
    n = na + nb
    cats = sorted(set(a) | set(b), key=lambda c: -(a[c] + b[c]))
    rows: list[tuple[int, int]] = []
    other = [0, 0]
    for c in cats:
        if (a[c] + b[c]) * min(na, nb) / n >= 5:
            rows.append((a[c], b[c]))
        else:
            other[0] += a[c]
            other[1] += b[c]
    if sum(other):
        rows.append((other[0], other[1]))
    stat = 0.0
    for x, y in rows:
        total = x + y
        for observed, size in ((x, na), (y, nb)):
            expected = total * size / n
            stat += (observed - expected) ** 2 / expected
    df = len(rows) - 1
    p = torch.special.gammaincc(
        torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
    )
    return float(p), df


def sample(
    make_engine, n: int, seed: int, temperature: float = 1.0, spec: bool = True
) -> tuple[Counter, object]:
    eng = make_engine(
        seed=seed,
        max_num_seqs=128,
        max_model_len=64,
        **({"speculative_config": NGRAM} if spec else {}),
    )
    params = SamplingParams(temperature=temperature, top_p=0.95, max_tokens=3, ignore_eos=True)
    outs = eng.generate([PROMPT] * n, params)
    return Counter(tuple(o.token_ids) for o in outs), eng


def check(make_engine, n: int, power_check: bool) -> None:
    with_spec, eng = sample(make_engine, n, seed=1)
    st = eng.speculator.stats
    assert (
        st.num_drafts > n // 2 and 0 < st.num_accepted_tokens < st.num_draft_tokens
    )  # drafts really judged
    without, _ = sample(make_engine, n, seed=2, spec=False)
    p, df = homogeneity_p(with_spec, without)
    assert df >= (3 if n >= 1000 else 1) and p > 0.01, (
        p,
        df,
        with_spec.most_common(8),
        without.most_common(8),
    )
    if not power_check:
        return
    hotter, _ = sample(make_engine, n, seed=3, temperature=1.3, spec=False)
    assert homogeneity_p(hotter, without)[0] < 0.01  # the test can tell a different distribution


@pytest.mark.e2e  # ~40 s of CPU; the default tier has the sampler's own chi-square tests (test_spec_pure.py)
def test_next_3_tokens_have_the_targets_distribution(make_engine):
    check(make_engine, 150, power_check=False)


@pytest.mark.e2e
def test_next_3_tokens_have_the_targets_distribution_2000(make_engine):
    check(make_engine, 2000, power_check=True)
