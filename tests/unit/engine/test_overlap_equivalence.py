"""Overlapped scheduling and the static (CUDA-graph) decode inputs change nothing a client
sees: the tokens are identical with either on or off, under recompute and swap
preemption, prefix hits, chunked prefill, stops and aborts, and no KV block leaks."""

from __future__ import annotations

import random

import pytest
from llmservice.server.engine import overlap
from llmservice.server.engine.sampling_params import SamplingParams


def workload(seed: int = 5):
    """Eight requests: shared prefixes (prefix hits), a few seeded samplers (host sampling
    and their output positions), lengths that end mid-block."""
    rng = random.Random(seed)
    shared = [rng.randrange(200, 40000) for _ in range(40)]
    prompts, params = [], []
    for i in range(8):
        suffix = [rng.randrange(200, 40000) for _ in range(rng.randint(1, 20))]
        prompts.append((shared if i % 2 else []) + suffix)
        temperature, seed_ = (0.8, 100 + i) if i % 4 == 3 else (0.0, None)
        params.append(SamplingParams(temperature=temperature, seed=seed_, max_tokens=rng.randint(3, 10), ignore_eos=True))
    return prompts, params


@pytest.fixture(scope="module")
def mixed():
    return workload()


def _engine(make_engine, **overrides):
    overrides.setdefault("max_model_len", 128)
    return make_engine(**overrides)


@pytest.fixture(scope="module")
def reference(make_engine, mixed):
    eng = _engine(make_engine, async_scheduling=False, static_decode_inputs=False)
    return [o.token_ids for o in eng.generate(*mixed)]


CASES = {
    "static": dict(static_decode_inputs=True),
    "overlap_thread": dict(async_scheduling=True),
    "overlap_inline_static": dict(async_scheduling=True, static_decode_inputs=True),
    "overlap_chunk_7_prefix": dict(async_scheduling=True, static_decode_inputs=True, max_num_batched_tokens=7),
    # the step-time budget (CUDA's default) plans decodes first and sizes chunks by time
    "overlap_time_budget": dict(async_scheduling=True, static_decode_inputs=True, max_step_ms=None),
    # 6 blocks of 16 hold about two of these requests: decodes preempt each other
    "overlap_recompute": dict(
        async_scheduling=True, static_decode_inputs=True, num_gpu_blocks_override=6, max_model_len=96
    ),
    "overlap_swap": dict(
        async_scheduling=True, static_decode_inputs=True, num_gpu_blocks_override=6, max_model_len=96,
        preemption_mode="swap", swap_space=0.05,
    ),
}


def _assert_clean(eng) -> None:
    eng.block_manager.check_invariants()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    assert eng.swap_space.num_free == eng.swap_space.num_blocks
    assert not eng.has_unfinished_requests() and eng.scheduler._pending == {}


@pytest.mark.parametrize("case", list(CASES))
def test_tokens_identical(make_engine, mixed, reference, case):
    eng = _engine(make_engine, **CASES[case])
    if "inline" in case:
        eng.launcher = overlap.InlineLauncher()  # CUDA's launcher, run on CPU
    assert [o.token_ids for o in eng.generate(*mixed)] == reference
    _assert_clean(eng)
    if CASES[case].get("static_decode_inputs"):
        assert eng.runner.num_static_steps > 0
        assert eng.runner.kv_caches[0][0].shape[0] == eng.block_manager.num_blocks + 1  # the pad block
    stats = eng.scheduler.stats
    if "num_gpu_blocks_override" in CASES[case]:
        assert stats.num_preemptions > 0
    if case == "overlap_swap":
        assert stats.num_swap_outs > 0 and eng.overlap_syncs.get("swap", 0) > 0
    if "prefix" in case:
        assert stats.prefix_hits > 0


def test_stops_are_exact_with_overlap(make_engine, mixed, reference):
    """A stop token met by the step in flight ends the request there: the token its next
    (already launched) step computed is never emitted."""
    greedy = [0, 1, 2, 4]  # the workload's seeded samplers are 3 and 7
    prompts = [mixed[0][i] for i in greedy]
    params = [
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop_token_ids=[reference[i][1]])
        for i in greedy
    ]
    expected = _engine(make_engine).generate(prompts, params)
    eng = _engine(make_engine, async_scheduling=True, static_decode_inputs=True)
    got = eng.generate(prompts, params)
    assert [(o.token_ids, o.finish_reason) for o in got] == [(o.token_ids, o.finish_reason) for o in expected]
    assert all(len(o.token_ids) <= 2 for o in got)
    _assert_clean(eng)


def test_aborts_in_flight_free_every_block(make_engine, mixed, reference):
    """Requests aborted while their step is in flight: the others' tokens are unchanged,
    the aborted ones get nothing more, and every block (and the runner's state) is free."""
    eng = _engine(make_engine, async_scheduling=True, static_decode_inputs=True)
    prompts, params = mixed
    ids = [eng.add_request(p, sp).request_id for p, sp in zip(prompts, params, strict=True)]
    got: dict[str, list[int]] = {rid: [] for rid in ids}
    aborted = {ids[1], ids[4]}
    steps = 0
    while eng.has_unfinished_requests():
        for d in eng.step():
            assert d.request_id not in aborted or steps < 3
            got[d.request_id].extend(d.new_token_ids)
        steps += 1
        if steps == 3:
            assert eng._in_flight is not None  # the aborts land while a step is launched
            for rid in aborted:
                assert eng.abort_request(rid)
    for i, rid in enumerate(ids):
        if rid not in aborted:
            assert got[rid] == reference[i]
    _assert_clean(eng)
    eng.step()  # the next step tells the runner which requests finished
    assert eng.runner.requests == {}


class _EagerReplay:
    """Stands in for DecodeGraphs on CPU: a 'replay' runs what the captured graph holds,
    the forward on the static buffers with the capture's metadata (host lengths at the
    fixed bound, not this step's), so the runner's replay branch is checked end to end."""

    def __init__(self, runner):
        self.runner = runner
        self.sizes = runner.decode_sizes
        self.replayed: set[int] = set()

    def replay(self, size: int):
        r = self.runner
        meta = r.static.graph_metadata(size, r.max_model_len)
        self.replayed.add(size)
        return r.model.forward_hidden(r.static.input_ids[:size], r.static.positions[:size], meta, r.kv_caches)


def test_the_replay_branch_reads_only_the_static_buffers(make_engine, mixed, reference):
    eng = _engine(make_engine, async_scheduling=True, static_decode_inputs=True, num_gpu_blocks_override=6,
                  max_model_len=96)  # fmt: skip
    eng.launcher = overlap.InlineLauncher()
    eng.runner.graphs = fake = _EagerReplay(eng.runner)
    assert [o.token_ids for o in eng.generate(*mixed)] == reference
    assert eng.runner.num_graph_replays > 0 and len(fake.replayed) > 1  # several padded sizes
    assert eng.scheduler.stats.num_preemptions > 0
    _assert_clean(eng)


def test_capture_refuses_a_cpu_model(make_engine):
    eng = _engine(make_engine, static_decode_inputs=True)
    with pytest.raises(RuntimeError, match="CUDA"):
        eng.runner.capture_graphs()


def test_structured_outputs_wait_for_the_step_in_flight(make_engine):
    """A constrained request's bitmask needs the previous token on the host: those steps
    wait (counted), and the outputs match the engine without overlap."""
    import re

    from llmservice.server.engine.grammar_spec import StructuredSpec

    spec = StructuredSpec("regex", "(yes|no), [a-z]{2,6}\\.")
    prompts = ["Answer:", "The capital of France is"]
    params = [SamplingParams(temperature=0, max_tokens=12, structured=spec),
              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]  # fmt: skip
    expected = _engine(make_engine).generate(prompts, params)
    eng = _engine(make_engine, async_scheduling=True, static_decode_inputs=True)
    got = eng.generate(prompts, params)
    assert [(o.token_ids, o.finish_reason) for o in got] == [(o.token_ids, o.finish_reason) for o in expected]
    assert eng.overlap_syncs.get("grammar", 0) > 0
    assert got[0].finish_reason == "stop" and re.fullmatch(r"(yes|no), [a-z]{2,6}\.", got[0].text)
    _assert_clean(eng)


def test_eager_static_steps_size_triton_splits_like_a_replay(make_engine, monkeypatch):
    """Triton reads the host lengths only to size decode attention's splits: an eager
    static step gets the graphs' bound (so it computes what a replay does); the torch
    path masks with them and gets the exact lengths."""
    runner = _engine(make_engine, static_decode_inputs=True).runner
    like = runner.static.input_ids
    monkeypatch.setenv("LLMSERVICE_KERNELS", "triton")
    assert runner._static_host_lens([5, 1], like) == [128, 128]
    monkeypatch.setenv("LLMSERVICE_KERNELS", "torch")
    assert runner._static_host_lens([5, 1], like) == [5, 1]
