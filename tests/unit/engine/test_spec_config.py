"""`--speculative-config JSON`: vLLM's keys, defaults, and a clear message for each mistake."""

from __future__ import annotations

import pytest
from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine.spec_config import SpeculativeConfig, parse_speculative_config


def test_ngram_with_vllms_keys():
    cfg = parse_speculative_config(
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    )
    assert cfg == SpeculativeConfig("ngram", 3, prompt_lookup_max=4, prompt_lookup_min=2)


def test_lookup_bounds_default_as_vllms():
    assert (
        parse_speculative_config(
            '{"method": "ngram", "num_speculative_tokens": 2}'
        ).prompt_lookup_min
        == 5
    )
    one = parse_speculative_config(
        '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'
    )
    assert (one.prompt_lookup_min, one.prompt_lookup_max) == (3, 3)


def test_draft_model_and_layer_skip():
    d = parse_speculative_config(
        '{"method": "draft_model", "model": "builtin:x", "num_speculative_tokens": 4}'
    )
    assert d.model == "builtin:x" and d.num_layers is None
    s = parse_speculative_config(
        '{"method": "layer_skip", "num_layers": 6, "num_speculative_tokens": 4}'
    )
    assert s.num_layers == 6 and s.model is None


def test_no_flag_is_no_speculation():
    assert parse_speculative_config(None) is None and EngineConfig().speculative_config is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"method": "eagle", "num_speculative_tokens": 2}', "method must be one of"),
        ('{"method": "ngram"}', "num_speculative_tokens is required"),
        (
            '{"method": "ngram", "num_speculative_tokens": 0}',
            "num_speculative_tokens must be an integer in [1, 16]",
        ),
        ('{"method": "ngram", "num_speculative_tokens": true}', "must be an integer"),
        (
            '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
            "exceeds",
        ),
        ('{"method": "ngram", "num_speculative_tokens": 2, "foo": 1}', "unknown keys ['foo']"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', 'needs "model"'),
        ('{"method": "layer_skip", "num_speculative_tokens": 2}', 'needs "num_layers"'),
    ],
)
def test_mistakes_are_named(text, message):
    with pytest.raises(ValueError) as e:
        parse_speculative_config(text)
    assert message in str(e.value)
    with pytest.raises(ConfigError) as e:
        EngineConfig(speculative_config=text)
    assert message in str(e.value)
