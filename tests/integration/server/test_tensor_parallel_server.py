"""`llmservice serve --tensor-parallel-size 3`: the openai client gets the tokens TP=1
computes, and a rank that dies (SIGKILL) or hangs (SIGSTOP) makes the server fail its
readiness, then exit non-zero within 10 s with a log line naming the rank.

A tiny random model with SmolLM2's head layout keeps the loads short. e2e: three
servers of 5 processes each (API, engine core, 3 ranks) are too slow for the default tier
on 2 cores; the executor-level kill test and the TP=3 parity
tests are its fast variant (tests/unit/engine/test_tensor_parallel.py).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.hub_endpoint import SPECS, save_tiny_model
from tests.support.server_process import wait_ready

pytestmark = pytest.mark.e2e

# SmolLM2's head layout (9 query heads, 3 KV heads) in a tiny random model: TP=3 splits it
TINY = dict(SPECS["llama3"], hidden_size=72, intermediate_size=144, num_attention_heads=9,
            num_key_value_heads=3, rope_scaling=None)  # fmt: skip
ARGS = ("--max-model-len", "256", "--kv-cache-memory-gib", "0.05", "--tensor-parallel-size", "3")
PROMPTS = ["The capital of France is", "def f(x): return", "Hello world, how"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    return save_tiny_model(tmp_path_factory.mktemp("tp-serve") / "llama9", TINY, seed=3)


@pytest.fixture(scope="module")
def servers(launch_server, tiny):
    """All three boot together (their loads overlap)."""
    return {
        name: launch_server(str(tiny), *ARGS, wait=False) for name in ("main", "killed", "hung")
    }


def rank_pids(server) -> dict[int, int]:
    """rank -> pid, from the ranks' own start-up lines."""
    found = re.findall(r"tensor-parallel rank (\d+)/3 \(pid (\d+)\)", server.log())
    return {int(r): int(p) for r, p in found}


def test_openai_client_gets_the_tokens_tp1_computes(servers, tiny):
    from llmservice.server.config import EngineConfig
    from llmservice.server.engine.engine import LLMEngine
    from llmservice.server.engine.sampling_params import SamplingParams

    server = wait_ready(servers["main"])
    assert len(rank_pids(server)) == 3
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    offline = LLMEngine.from_config(
        EngineConfig(model=str(tiny), max_model_len=256, num_threads=1, max_step_ms=0)
    )
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = offline.generate(PROMPTS, params)
    model = client.models.list().data[0].id
    for prompt, ref in zip(PROMPTS, expected, strict=True):
        got = client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=12,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert got.choices[0].text == ref.text
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8
    )
    assert chat.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(("name", "sig", "says"), [("killed", signal.SIGKILL, "was killed by SIGKILL"),
                                                   ("hung", signal.SIGSTOP, "is hung")])  # fmt: skip
def test_a_rank_that_dies_or_hangs_ends_the_server_loudly(servers, name, sig, says):
    server = wait_ready(servers[name])
    pid = rank_pids(server)[2]
    os.kill(pid, sig)
    t0 = time.monotonic()
    not_ready_at = None
    while server.proc.poll() is None and time.monotonic() - t0 < 15:
        if not_ready_at is None:
            try:
                if httpx.get(server.url + "/ready", timeout=1).status_code == 503:
                    not_ready_at = time.monotonic() - t0
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    exited_at = time.monotonic() - t0
    if sig == signal.SIGSTOP:
        try:  # the server kills its ranks as it stops; make sure of the stopped one
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert server.proc.returncode not in (None, 0), server.log()[-3000:]
    assert exited_at < 10, f"exited after {exited_at:.1f} s"
    assert not_ready_at is not None and not_ready_at < exited_at  # readiness failed first
    assert re.search(rf"tensor-parallel rank 2 \(pid {pid}\) {says}", server.log())
