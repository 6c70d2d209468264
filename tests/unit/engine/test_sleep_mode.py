"""Sleep mode in the engine: greedy outputs are the same before sleep and after wake, the
KV pool's memory is really released, level 2 reads the weights from disk again, and a
request that reaches the core while asleep is refused with 503."""

from __future__ import annotations

from llmservice.server.config import EngineConfig
from llmservice.server.engine.core import EngineCore
from llmservice.server.engine.engine import LLMEngine
from llmservice.server.engine.messages import AddRequest, Sleep, SleepChanged, WakeUp
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.sleep import device_tensors

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


class Outbox(list):
    put = list.append


def greedy(engine: LLMEngine) -> list[list[int]]:
    return [out.token_ids for out in engine.generate(PROMPTS, GREEDY)]


def weight_elements(engine: LLMEngine) -> int:
    return sum(t.numel() for _, t in device_tensors(engine.model, engine.device))


def kv_bytes(engine: LLMEngine) -> int:
    return sum(t.untyped_storage().nbytes() for k, v in engine.runner.kv_caches for t in (k, v))


def test_level_1_frees_the_kv_pool_and_wakes_to_the_same_greedy_output(make_engine):
    engine = make_engine(enable_sleep_mode=True)
    before = greedy(engine)
    outbox = Outbox()
    core = EngineCore(engine, outbox)
    pool = kv_bytes(engine)
    assert pool > 0
    core.apply([Sleep(1)])
    assert outbox == [SleepChanged(1, outbox[0].seconds)]
    assert kv_bytes(engine) == 0 and core.sleep.sleeping
    report, _ = core.apply([AddRequest("late", [1, 2, 3], GREEDY)])
    assert [(r.request_id, r.status) for r in report.rejected] == [("late", 503)]
    core.apply([WakeUp()])
    assert outbox[-1].level == 0 and outbox[-1].error is None
    assert kv_bytes(engine) == pool
    assert greedy(engine) == before


def test_level_2_discards_the_weights_and_reloads_them_from_disk():
    config = EngineConfig(model="builtin:smollm2-135m", max_model_len=512, num_threads=1, max_step_ms=0,
                          enable_sleep_mode=True)
    engine = LLMEngine.from_config(config)
    before = greedy(engine)
    outbox = Outbox()
    core = EngineCore(engine, outbox)
    core.apply([Sleep(2)])
    assert outbox[-1].level == 2
    assert weight_elements(engine) == 0
    core.apply([WakeUp()])
    assert outbox[-1].error is None and weight_elements(engine) > 0
    assert greedy(engine) == before


def test_sleep_waits_for_running_requests(make_engine):
    engine = make_engine(enable_sleep_mode=True)
    outbox = Outbox()
    core = EngineCore(engine, outbox)
    core.apply([AddRequest("busy", [1, 2, 3, 4], GREEDY), Sleep(1)])
    assert not core.sleep.sleeping and not any(isinstance(m, SleepChanged) for m in outbox)
    while engine.has_unfinished_requests():
        core.step()
    assert core.sleep.maybe_sleep().level == 1 and core.sleep.sleeping
    core.apply([WakeUp()])


def test_sleep_is_refused_without_the_flag(make_engine):
    engine = make_engine()
    outbox = Outbox()
    EngineCore(engine, outbox).apply([Sleep(1)])
    assert "--enable-sleep-mode" in outbox[0].error and kv_bytes(engine) > 0
