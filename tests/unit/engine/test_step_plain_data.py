"""The engine step as plain data: the runner works from a pickled step alone, the
scheduler takes any number of tokens per request per step and rolls back rejected
draft tokens, and stop rules hold in the middle of a multi-token step."""

from __future__ import annotations

import dataclasses
import pickle

from llmservice.server.config import EngineConfig
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.request import Request, RequestStatus
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.scheduler import Scheduler
from llmservice.server.engine.step import SchedulerOutput

PROMPTS = [[(i * 37 + j * 11) % 30000 + 100 for j in range(n)] for i, n in enumerate([5, 40, 17, 70])]


def _plain_values(value, path="out"):
    """Every leaf of a step is a number, string, bool, None or SamplingParams."""
    if dataclasses.is_dataclass(value) and not isinstance(value, SamplingParams):
        for f in dataclasses.fields(value):
            yield from _plain_values(getattr(value, f.name), f"{path}.{f.name}")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _plain_values(k, f"{path}[key]")
            yield from _plain_values(v, f"{path}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _plain_values(v, f"{path}[{i}]")
    else:
        yield path, value


def test_a_step_holds_only_plain_data_and_the_runner_needs_nothing_else(make_engine):
    """The runner gets each step through pickle, as another process would; tokens match."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = [o.token_ids for o in make_engine(max_num_batched_tokens=48).generate(PROMPTS, params)]

    eng = make_engine(max_num_batched_tokens=48)
    real_execute = eng.runner.execute
    seen: list[SchedulerOutput] = []

    def through_pickle(out: SchedulerOutput):
        for path, leaf in _plain_values(out):
            assert isinstance(leaf, (int, float, str, bool, type(None), SamplingParams)), (path, type(leaf))
        seen.append(out)
        return real_execute(pickle.loads(pickle.dumps(out)))

    eng.runner.execute = through_pickle
    assert [o.token_ids for o in eng.generate(PROMPTS, params)] == expected
    assert any(len(s.token_ids) > 1 for out in seen for s in out.scheduled)  # prefill chunks went too
    eng.step()  # the next step tells the runner which requests finished
    assert eng.runner.requests == {}


def _two_at_a_time(real_execute, script: dict[str, list[int]]):
    """A runner that hands back the next two tokens of each request's script per step."""

    def execute(out: SchedulerOutput):
        result = real_execute(out)
        positions = {s.request_id: s.output_index for s in out.scheduled}
        for rid in result.tokens:
            k = positions[rid]
            result.tokens[rid] = script[rid][k : k + 2]
        return result

    return execute


def _stop_completed_at_even_token(tokenizer, answer: list[int]) -> str:
    """A stop string whose last character comes with an even-indexed answer token: the
    first of a two-token step, so the step's second token must be dropped."""
    for k in range(2, len(answer) - 1, 2):
        upto = tokenizer.decode(answer[: k + 1])
        stop = upto[-4:]
        if len(upto) > len(tokenizer.decode(answer[:k])) and stop.strip() and stop not in upto[:-1]:
            return stop
    raise AssertionError(f"no usable stop string in {answer}")


def test_stop_rules_hold_when_a_step_brings_two_tokens(make_engine, engine):
    """A runner that returns two tokens per step (from a one-token run's answer) gives the
    same outputs: a stop string, a stop token or max_tokens met at the first of the two
    truncates there."""
    base = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = make_engine()  # one engine for every expected output, one scripted for every case
    reference = plain.generate(PROMPTS, base)
    answers = {i: o.token_ids for i, o in enumerate(reference)}
    cases = [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),  # odd: the pair crosses the limit
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[answers[1][4]]),
    ]
    cases.append(SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                stop=[_stop_completed_at_even_token(engine.tokenizer, answers[2])]))
    eng = make_engine()
    script: dict[str, list[int]] = {}
    eng.runner.execute = _two_at_a_time(eng.runner.execute, script)
    for params in cases:
        expected = plain.generate(PROMPTS, params)
        script.clear()
        ids = []
        for i, prompt in enumerate(PROMPTS):
            req = eng.add_request(prompt, params)
            script[req.request_id] = answers[i]
            ids.append(req.request_id)
        got: dict[str, list] = {rid: [[], ""] for rid in ids}
        finish: dict[str, tuple] = {}
        while eng.has_unfinished_requests():
            for d in eng.step():
                got[d.request_id][0].extend(d.new_token_ids)
                got[d.request_id][1] += d.new_text
                if d.finished:
                    finish[d.request_id] = (d.finish_reason, d.stop_reason)
        for rid, exp in zip(ids, expected, strict=True):
            assert got[rid] == [exp.token_ids, exp.text], params
            assert finish[rid] == (exp.finish_reason, exp.stop_reason), params
        eng.block_manager.check_invariants()
        assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def _scheduler(num_blocks: int = 16) -> Scheduler:
    cfg = EngineConfig(block_size=8, max_model_len=128, max_num_batched_tokens=64, max_num_seqs=4)
    return Scheduler(cfg, BlockManager(num_blocks, 8, enable_prefix_caching=True))


def _decode_ready(sched: Scheduler, prompt_len: int) -> Request:
    req = Request("r", list(range(100, 100 + prompt_len)), SamplingParams(max_tokens=20), max_tokens=20)
    sched.add(req)
    out = sched.schedule()
    sched.update(out, {"r": [7]})
    return req


def test_rejected_draft_tokens_are_rolled_back_with_their_blocks():
    sched = _scheduler()
    req = _decode_ready(sched, prompt_len=14)  # 14 computed, 15 tokens
    req.spec_token_ids = [1, 2, 3, 4]
    out = sched.schedule()
    (step,) = out.scheduled
    assert step.token_ids == [7] and step.spec_token_ids == [1, 2, 3, 4] and step.num_tokens == 5
    assert step.start_position == 14 and step.sample
    assert len(sched.bm.block_ids("r")) == 3  # positions 14..18 reach the third block
    assert step.block_table_start == 2 and step.new_block_ids == sched.bm.block_ids("r")[2:]
    # the target agreed with the first draft only: [1] accepted, then its own token 9
    touched = sched.update(out, {"r": [1, 9]})
    assert touched == [(req, [1, 9])]
    assert req.num_computed_tokens == 16 and req.output_token_ids == [7, 1, 9]
    assert len(sched.bm.block_ids("r")) == 2 and req.spec_token_ids == []
    sched.bm.check_invariants()
    # the next step computes the bonus token only, in the kept blocks
    (step,) = sched.schedule().scheduled
    assert step.token_ids == [9] and step.start_position == 16 and step.spec_token_ids == []
    assert step.block_table_start == 2 and step.new_block_ids == sched.bm.block_ids("r")[2:]


def test_all_drafts_accepted_keeps_every_slot():
    sched = _scheduler()
    req = _decode_ready(sched, prompt_len=14)
    req.spec_token_ids = [1, 2]
    out = sched.schedule()
    sched.update(out, {"r": [1, 2, 3]})
    assert req.num_computed_tokens == 17 and req.output_token_ids == [7, 1, 2, 3]
    assert len(sched.bm.block_ids("r")) == 3


def test_a_stop_token_among_several_ends_the_request_there():
    sched = _scheduler()
    req = Request("r", [5, 6, 7], SamplingParams(max_tokens=10, stop_token_ids=[42]), max_tokens=10)
    sched.add(req)
    out = sched.schedule()
    sched.update(out, {"r": [1, 42, 3, 4]})
    assert req.output_token_ids == [1, 42] and req.status is RequestStatus.FINISHED_STOPPED
    assert req.stop_reason == 42
    assert sched.bm.num_free_blocks == sched.bm.num_blocks
    assert sched.schedule().finished_request_ids == ["r"]


def test_resolve_lengths_leaves_the_callers_config_alone():
    cfg = EngineConfig()
    resolved = cfg.resolve_lengths(8192)
    assert cfg.max_model_len is None and cfg.max_num_batched_tokens is None
    assert resolved.max_model_len == 8192 and resolved.max_num_batched_tokens == 2048
