"""spec.engine.speculative (method, tokens, ...) admitted by the CRD, rendered to
--speculative-config, and parsed by the server into the config the object describes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from llmservice.operator.admission import admit
from llmservice.operator.render import Owner, server_args
from llmservice.operator.spec import LLMServiceSpec
from llmservice.server.cli_args import configs_from_args, parse_serve_argv
from llmservice.server.engine.spec_config import SpeculativeConfig, parse_speculative_config

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = yaml.safe_load((ROOT / "crds/llmservice.yaml").read_text())["spec"]["versions"][0][
    "schema"
]["openAPIV3Schema"]


def obj(speculative: dict, **engine) -> dict:
    return {
        "apiVersion": "llmservice.dev/v1alpha1",
        "kind": "LLMService",
        "metadata": {"name": "m"},
        "spec": {
            "model": {"source": "builtin:smollm2-135m"},
            "engine": {"speculative": speculative, **engine},
        },
    }


def rendered_config(speculative: dict) -> SpeculativeConfig | None:
    stored, errors = admit(SCHEMA, obj(speculative), None)
    assert errors == []
    argv = server_args(Owner("m", "default", "u"), LLMServiceSpec.from_dict(stored["spec"]), 0.95)
    engine_config, _ = configs_from_args(parse_serve_argv(argv[1:]))
    return parse_speculative_config(engine_config.speculative_config)


def test_ngram_renders_to_the_flag_the_server_parses():
    cfg = rendered_config(
        {"method": "ngram", "tokens": 3, "promptLookupMax": 4, "promptLookupMin": 2}
    )
    assert cfg == SpeculativeConfig("ngram", 3, prompt_lookup_max=4, prompt_lookup_min=2)


def test_layer_skip_and_draft_model_render():
    assert rendered_config({"method": "layer_skip", "tokens": 2, "numLayers": 8}).num_layers == 8
    assert (
        rendered_config({"method": "draft_model", "tokens": 4, "model": "builtin:x"}).model
        == "builtin:x"
    )


def test_no_speculative_field_renders_no_flag():
    stored, _ = admit(
        SCHEMA, {**obj({}), "spec": {"model": {"source": "builtin:smollm2-135m"}}}, None
    )
    argv = server_args(Owner("m", "default", "u"), LLMServiceSpec.from_dict(stored["spec"]), 0.95)
    assert "--speculative-config" not in argv


@pytest.mark.parametrize(
    ("speculative", "engine", "message"),
    [
        ({"method": "draft_model", "tokens": 2}, {}, "needs engine.speculative.model"),
        ({"method": "layer_skip", "tokens": 2}, {}, "needs engine.speculative.numLayers"),
        (
            {"method": "ngram", "tokens": 2, "promptLookupMin": 5, "promptLookupMax": 2},
            {},
            "must not exceed",
        ),
        ({"method": "ngram", "tokens": 0}, {}, "tokens"),
        ({"method": "medusa", "tokens": 2}, {}, "method"),
        ({"method": "ngram"}, {}, "tokens"),
        ({"method": "ngram", "tokens": 2}, {"kind": "vllm"}, "llmservice engine only"),
    ],
)
def test_the_crd_refuses_what_the_server_would(speculative, engine, message):
    _, errors = admit(SCHEMA, obj(speculative, **engine), None)
    assert any(message in str(e) for e in errors), errors
