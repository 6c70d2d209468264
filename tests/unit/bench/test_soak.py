"""The soak's pure parts: RSS growth after warm-up, and the mixed request bodies."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("soak", Path(__file__).resolve().parents[3] / "bench" / "soak.py")
soak = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(soak)


def test_rss_growth_ignores_warm_up_and_uses_the_tail():
    samples = [(0, 50), (10, 100), (20, 100), (30, 101), (40, 102), (50, 104)]
    assert soak.rss_growth(samples, warmup_s=10) == pytest.approx(0.04) # tail = last quarter (1 sample) vs first after warm-up
    assert soak.rss_growth([(0, 100)], warmup_s=0) == 0.0
    assert soak.rss_growth(samples, warmup_s=0) == pytest.approx(104 / 50 - 1)


def test_every_kind_has_a_body():
    rng = random.Random(0)
    bodies = {k: soak.body_for(k, rng, "m") for k in soak.KINDS}
    assert bodies["n2"]["n"] == 2 and not bodies["n2"]["stream"]
    assert bodies["stream"]["stream"] and bodies["abort"]["stream"]
    assert len(bodies["long_prompt"]["prompt"]) > len(bodies["stream"]["messages"][0]["content"]) * 10
