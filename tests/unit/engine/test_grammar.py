"""Constrained decoding in the engine: masks in the sampler, matchers per request, the
compile worker, and the scheduler skipping a request whose grammar still compiles."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import jsonschema
import pytest
import torch
from llmservice.server.engine.engine import GRAMMAR_WAIT_S
from llmservice.server.engine.grammar import GrammarStates
from llmservice.server.engine.grammar_spec import StructuredSpec
from llmservice.server.engine.request import RequestStatus
from llmservice.server.engine.sampler import Sampler, SampleRow
from llmservice.server.engine.sampling_params import SamplingParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}


def _mask_allowing(vocab: int, allowed: list[int]) -> torch.Tensor:
    words = [0] * ((vocab + 31) // 32)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


def test_masked_rows_pick_only_allowed_tokens_and_free_rows_are_untouched():
    torch.manual_seed(0)
    logits = torch.randn(4, 100)
    before = logits.clone()
    greedy = SamplingParams(temperature=0)
    rows = [
        SampleRow(greedy),
        SampleRow(greedy, bitmask=_mask_allowing(100, [63, 95])),
        SampleRow(
            SamplingParams(temperature=1.0, seed=3, logprobs=1), bitmask=_mask_allowing(100, [31])
        ),
        SampleRow(greedy),
    ]
    results = Sampler(seed=0)(logits, rows)
    tokens = [t for t, _ in results]
    assert tokens[0] == before[0].argmax().item() and tokens[3] == before[3].argmax().item()
    assert tokens[1] == (63 if before[1, 63] > before[1, 95] else 95)
    assert tokens[2] == 31 and results[2][1].logprob == pytest.approx(0.0)  # the only token left
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[3], before[3])


def test_all_rows_masked_in_place():
    logits = torch.zeros(2, 64)
    rows = [
        SampleRow(SamplingParams(temperature=0), bitmask=_mask_allowing(64, [5])),
        SampleRow(SamplingParams(temperature=0), bitmask=_mask_allowing(64, [40])),
    ]
    assert [t for t, _ in Sampler()(logits, rows)] == [5, 40]


@pytest.fixture(scope="module")
def compiler(engine):
    return engine.grammars.compiler


def test_compile_cache_shares_one_future_per_schema(compiler):
    spec = StructuredSpec("json_schema", json.dumps(PERSON))
    assert compiler.submit(spec) is compiler.submit(
        StructuredSpec("json_schema", json.dumps(PERSON))
    )
    assert compiler.submit(spec).result(timeout=120) is not None


def test_matcher_follows_a_valid_document_and_terminates(engine, compiler):
    states = GrammarStates(compiler)
    states.add("r", StructuredSpec("json_schema", json.dumps(PERSON)))
    tokens = engine.tokenizer.encode('{"name": "Ann", "age": 7}', add_special_tokens=False)
    states._states["r"].future.result(timeout=120)
    # a matcher created late replays the output so far, then takes the rest one by one
    mask = states.bitmask("r", tokens[:3])
    assert mask is not None and mask.dtype == torch.int32
    assert not states.accept("r", tokens[3:])
    eos = engine.tokenizer.eos_token_ids[0]
    final = states.bitmask("r", [])
    allowed = [
        t for t in range(engine.model_config.vocab_size) if (int(final[t // 32]) >> (t % 32)) & 1
    ]
    assert allowed == [eos]  # the document is complete: only a stop token may follow
    assert states.accept("r", [eos])


def test_failed_compile_is_reported_once(compiler):
    states = GrammarStates(compiler)
    states.add("bad", StructuredSpec("regex", "[a-"))
    states._states["bad"].future.exception(timeout=120)
    assert [rid for rid, _ in states.failed()] == ["bad"]
    assert states.failed() == []


def test_engine_constrained_and_free_requests_share_a_batch(engine):
    spec = StructuredSpec("json_schema", json.dumps(PERSON))
    free = SamplingParams(temperature=0, max_tokens=12)
    alone = engine.generate(["The capital of France is"], free)[0]
    outs = engine.generate(
        ["A person as JSON:", "The capital of France is", "Another one:"],
        [
            SamplingParams(temperature=0, max_tokens=60, structured=spec),
            free,
            SamplingParams(temperature=0.9, seed=5, max_tokens=60, structured=spec),
        ],
    )
    assert outs[1].token_ids == alone.token_ids  # free rows are untouched by their neighbours
    for out in (outs[0], outs[2]):
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), PERSON)
    assert len(engine.grammars) == 0  # finished requests release their matchers


@contextmanager
def _compiles_after(engine, wait: Callable[[], object]) -> Iterator[None]:
    """The engine's grammar compiles first call `wait` (the real compile back afterwards)."""
    compiler = engine.grammars.compiler
    original = compiler._compile

    def slow(spec):
        wait()
        return original(spec)

    compiler._compile = slow
    try:
        yield
    finally:
        compiler._compile = original


def test_request_whose_grammar_compiles_waits_without_blocking_others(engine):
    gate = threading.Event()
    try:
        with _compiles_after(engine, lambda: gate.wait(60)):
            spec = StructuredSpec("json_schema", json.dumps({**PERSON, "title": "slow"}))
            held = engine.add_request(
                "A person:", SamplingParams(temperature=0, max_tokens=40, structured=spec)
            )
            free = engine.add_request("Once upon a time", SamplingParams(temperature=0, max_tokens=8))
            while not free.is_finished:
                engine.step()
            assert held.status == RequestStatus.WAITING and held.num_output_tokens == 0
            gate.set()
            while not held.is_finished:
                engine.step()
            assert held.status == RequestStatus.FINISHED_STOPPED and held.num_output_tokens > 0
            jsonschema.validate(json.loads(engine.tokenizer.decode(held.output_token_ids)), PERSON)
    finally:
        gate.set()


def test_an_empty_step_waits_for_the_compile_instead_of_spinning(engine):
    """With nothing else to run, the step loop sleeps on the pending compile (releasing the
    GIL): a loop spinning on "not ready" starved the compile thread, and a fresh server's
    first structured request took 140 s on 2 cores. The compile here takes 0.3 s: a
    spinning loop stepped 3.4 million times in it; a waiting one at most 0.3 s / 5 ms."""
    with _compiles_after(engine, lambda: threading.Event().wait(0.3)):
        spec = StructuredSpec("json_schema", json.dumps({**PERSON, "title": "slow2"}))
        held = engine.add_request(
            "A person:", SamplingParams(temperature=0, max_tokens=4, structured=spec)
        )
        empty_steps = 0
        while held.num_output_tokens == 0:
            engine.step()
            empty_steps += held.num_output_tokens == 0
        assert empty_steps <= 0.3 / GRAMMAR_WAIT_S + 10, empty_steps
        while not held.is_finished:
            engine.step()


def test_strided_logits_are_masked_too():
    logits = torch.zeros(64, 3).t()  # [3, 64], not contiguous
    rows = [
        SampleRow(SamplingParams(temperature=0)),
        SampleRow(SamplingParams(temperature=0), bitmask=_mask_allowing(64, [9])),
        SampleRow(SamplingParams(temperature=0)),
    ]
    assert [t for t, _ in Sampler()(logits, rows)] == [0, 9, 0]
