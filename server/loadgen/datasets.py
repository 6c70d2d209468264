"""Benchmark prompts, generated locally (no dataset download), seeded and reproducible.

- random: every prompt has `input_len` words and asks for `output_len` tokens
  (vLLM's default dataset, with words instead of token ids so any server can take it).
- sharegpt-like: prompt and output lengths drawn from log-normal distributions shaped
  like ShareGPT conversations (long tail, median prompt ~1/3 of the mean).
- prefix: `num_prefixes` shared prefixes of `prefix_len` words, each followed by a
  unique `input_len`-word suffix (vLLM's prefix_repetition): measures prefix caching.
Common English words are mostly one token each, so word counts approximate tokens;
the server's own usage numbers are what the report uses.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part over new sound take only little work know place year live me back give most very "
    "after thing our just name good sentence man think say great where help through much before line right "
    "too mean old any same tell boy follow came want show also around form three small set put end does "
    "another well large must big even such because turn here why ask went men read need land different home "
    "us move try kind hand picture again change off play spell air away animal house point page letter mother "
    "answer found study still learn should world high every near add food between own below country plant"
).split()

DATASETS = ("random", "sharegpt-like", "prefix")


@dataclass(frozen=True)
class BenchPrompt:
    prompt: str
    approx_prompt_len: int
    output_len: int


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


def _lognormal_len(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(rng.lognormvariate(0.0, sigma) * median))))


def make_prompts(
    dataset: str,
    num_prompts: int,
    input_len: int = 128,
    output_len: int = 128,
    prefix_len: int = 256,
    num_prefixes: int = 4,
    max_len: int = 2048,
    seed: int = 0,
) -> list[BenchPrompt]:
    rng = random.Random(seed)
    if dataset == "random":
        return [BenchPrompt(_words(rng, input_len), input_len, output_len) for _ in range(num_prompts)]
    if dataset == "sharegpt-like":
        out = []
        for _ in range(num_prompts):
            n_in = _lognormal_len(rng, input_len, 1.0, 4, max_len // 2)
            n_out = _lognormal_len(rng, output_len, 0.8, 4, max_len - n_in)
            out.append(BenchPrompt(_words(rng, n_in), n_in, n_out))
        return out
    if dataset == "prefix":
        prefixes = [_words(rng, prefix_len) for _ in range(num_prefixes)]
        return [
            BenchPrompt(f"{prefixes[i % num_prefixes]}\n{_words(rng, input_len)}", prefix_len + input_len, output_len)
            for i in range(num_prompts)
        ]
    raise ValueError(f"unknown dataset {dataset!r}; choose one of {list(DATASETS)}")
