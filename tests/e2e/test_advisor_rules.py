"""End to end, one test per advisor rule: a real server started with the mistake, the
workload that shows it, `llmservice advise --json` reporting exactly that rule with its
numbers; then the server restarted with the recommended patch, and the finding is gone.

Minutes each on 2 CPU cores (one torch thread per server): opt-in, `make e2e`.
"""

from __future__ import annotations

import random

import pytest

from tests.e2e.advisor_support import advise_during, advise_while, server

pytestmark = pytest.mark.e2e

# the same for every run: the KV pool fits 8 full-length requests, so rule 4 stays quiet
BASE = ["--max-model-len", "512", "--kv-cache-memory-gib", "0.25", "--max-num-seqs", "8"]


def _random_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(300, 40000) for _ in range(length)] for _ in range(n)]


def test_rule_1_short_answers_at_block_32(tmp_path):
    prompts = _random_prompts(24, 20, seed=1)
    with server([*BASE, "--block-size", "32"], tmp_path) as url:
        code, findings = advise_during(url, 30, prompts, max_tokens=10)
    assert code == 3 and [f["rule"] for f in findings] == ["block-size"], findings
    f = findings[0]
    assert f["evidence"]["blockSize"] == 32 and f["evidence"]["meanGenerationTokens"] == 10
    assert f["evidence"]["requests"] == 24
    # tail (32-1)/2 = 15.5 slots on 20 + 10 tokens
    assert f["evidence"]["kvWasteShare"] == pytest.approx(15.5 / 45.5, abs=1e-3)
    assert f["recommendation"] == {"engine": {"blockSize": 16}}

    with server([*BASE, "--block-size", "16"], tmp_path) as url:  # the patch applied
        code, findings = advise_during(url, 30, prompts, max_tokens=10)
    assert (code, findings) == (0, [])


# 26 blocks of 16 tokens: 3 requests of 20 + 100 tokens (8 blocks each) fit, 8 are let in.
# Short prompts make each preemption cheap to recompute, so they come fast enough on a CPU
# to pass 5/min (2000-token prompts re-prefill for seconds each: ~2/min here, bench/
# advisor_effect.py); the long-prompt branch is table-tested in the unit tier.
SMALL_POOL = ["--max-model-len", "256", "--num-gpu-blocks-override", "26",
              "--preemption-mode", "recompute"]  # fmt: skip


def test_rule_2_preemptions_when_max_num_seqs_outgrows_the_pool(tmp_path):
    prompts = _random_prompts(16, 20, seed=2)
    with server([*SMALL_POOL, "--max-num-seqs", "8"], tmp_path) as url:
        code, findings = advise_during(url, 90, prompts, max_tokens=100, concurrency=8)
    assert code == 3 and [f["rule"] for f in findings] == ["preemptions"], findings
    ev = findings[0]["evidence"]
    assert ev["preemptionsPerMinute"] > 5 and ev["meanPromptTokens"] == 20
    assert (ev["kvBlocks"], ev["blocksPerRequest"], ev["maxNumSeqs"]) == (26, 8, 8)
    # 26 blocks // 8 blocks per request = 3 requests at once without preemption
    assert findings[0]["recommendation"] == {"engine": {"maxNumSeqs": 3}}
    # priced with the engine's own start-up measurement (recompute only: no swap space)
    assert ev["preemptedTokensPerMinute"] > 0 and ev["measuredRecomputeSecondsPerMinute"] > 0
    assert "measuredSwapSecondsPerMinute" not in ev
    assert findings[0]["expectedEffect"]["recomputeSecondsPerMinuteSaved"] > 0

    with server([*SMALL_POOL, "--max-num-seqs", "3"], tmp_path) as url:  # the patch applied
        code, findings = advise_during(url, 90, prompts, max_tokens=100, concurrency=8)
    assert (code, findings) == (0, [])


def test_rule_6_gpu_memory_utilization_above_092_with_preemptions(tmp_path):
    """0.95 with preemptions: that finding and the preemptions one; the patch (0.90)
    clears the first, and the preemptions stand (their own fix is rule 2's)."""
    prompts = _random_prompts(16, 20, seed=6)
    pool = [*SMALL_POOL, "--max-num-seqs", "8"]
    with server([*pool, "--gpu-memory-utilization", "0.95"], tmp_path) as url:
        code, findings = advise_during(url, 90, prompts, max_tokens=100, concurrency=8)
    assert code == 3 and [f["rule"] for f in findings] == [
        "preemptions",
        "gpu-memory-utilization",
    ], findings
    f = findings[1]
    assert f["evidence"]["gpuMemoryUtilization"] == 0.95
    assert f["evidence"]["preemptionsPerMinute"] > 0
    assert f["recommendation"] == {"resources": {"gpuMemoryUtilization": 0.9}}

    with server([*pool, "--gpu-memory-utilization", "0.90"], tmp_path) as url:
        code, findings = advise_during(url, 90, prompts, max_tokens=100, concurrency=8)
    assert [f["rule"] for f in findings] == ["preemptions"], findings


def test_rule_6_requests_wait_while_the_kv_cache_is_mostly_free(tmp_path):
    """4 clients, maxNumSeqs 2, a big pool: a standing queue at both scrapes with the KV
    cache nearly empty; the patch (maxNumSeqs 4) lets all four run, and the queue is gone."""
    prompts = _random_prompts(16, 20, seed=7)
    args = ["--max-model-len", "256", "--kv-cache-memory-gib", "0.25"]
    with server([*args, "--max-num-seqs", "2"], tmp_path) as url:
        code, findings = advise_while(url, 20, prompts, max_tokens=40, concurrency=4)
    assert code == 3 and [f["rule"] for f in findings] == ["waiting-with-free-kv"], findings
    ev = findings[0]["evidence"]
    assert ev["waitingMin"] >= 1 and ev["kvCacheUsageMax"] < 0.5
    assert (ev["runningMax"], ev["maxNumSeqs"]) == (2, 2)
    assert findings[0]["recommendation"] == {"engine": {"maxNumSeqs": 4}}

    with server([*args, "--max-num-seqs", "4"], tmp_path) as url:
        code, findings = advise_while(url, 20, prompts, max_tokens=40, concurrency=4)
    assert (code, findings) == (0, [])


def test_rule_3_shared_system_prompt_with_caching_off(tmp_path):
    rng = random.Random(3)
    system = [rng.randrange(300, 40000) for _ in range(1000)]
    prompts = [system + [rng.randrange(300, 40000) for _ in range(40)] for _ in range(8)]
    args = ["--max-model-len", "2048", "--kv-cache-memory-gib", "0.5", "--max-num-seqs", "4"]
    with server([*args, "--no-enable-prefix-caching"], tmp_path) as url:
        code, findings = advise_during(url, 90, prompts, max_tokens=2, concurrency=2)
    assert code == 3 and [f["rule"] for f in findings] == ["prefix-caching-off"], findings
    ev = findings[0]["evidence"]
    assert ev["promptTokens"] == 8 * 1040
    # the 7 later prompts each share the system prompt's 62 full blocks of 16 tokens
    assert ev["potentialHitTokens"] == 7 * 62 * 16
    assert findings[0]["recommendation"] == {"engine": {"enablePrefixCaching": True}}

    with server([*args, "--enable-prefix-caching"], tmp_path) as url:
        code, findings = advise_during(url, 90, prompts, max_tokens=2, concurrency=2)
    assert (code, findings) == (0, [])


def test_rule_4_max_model_len_8192_for_200_token_requests(tmp_path):
    prompts = _random_prompts(16, 150, seed=4)
    pool = ["--kv-cache-memory-gib", "0.5", "--max-num-seqs", "8"]  # ~11k KV tokens
    with server([*pool, "--max-model-len", "8192"], tmp_path) as url:
        code, findings = advise_during(url, 60, prompts, max_tokens=50)
    assert code == 3 and [f["rule"] for f in findings] == ["max-model-len"], findings
    f = findings[0]
    # p99.95 bucket bounds: prompts <= 200, answers <= 50 -> 250 tokens at p99.9
    assert f["evidence"]["p999PromptPlusGenerationTokens"] == 250
    assert f["evidence"]["maxModelLen"] == 8192 and f["evidence"]["fullLengthConcurrency"] == 1
    patch = f["recommendation"]["engine"]
    assert patch == {"maxModelLen": 256, "maxNumBatchedTokens": 2048}

    fixed = ["--max-model-len", str(patch["maxModelLen"]), "--max-num-batched-tokens", str(patch["maxNumBatchedTokens"])]
    with server([*pool, *fixed], tmp_path) as url:
        code, findings = advise_during(url, 60, prompts, max_tokens=50)
    assert (code, findings) == (0, [])


def test_rule_5_tokenizer_blocking_the_event_loop(tmp_path):
    """The test-only hook tokenizes on the event loop, 50 ms per request. The patch
    (more tokenizer workers) cannot undo a tokenizer that runs on the loop, which our
    server never does: the fixed run is the same server, patch applied, without the hook,
    under the same load — and the loop lag must not give a false positive there."""
    from llmservice.server.api.tokenizer_service import TEST_ONLY_SLOW_TOKENIZER_ENV

    prompts = [f"Request {i}: translate this short sentence into French, please." for i in range(60)]  # text: tokenized
    hook = {TEST_ONLY_SLOW_TOKENIZER_ENV: "50"}
    with server(BASE, tmp_path, env=hook) as url:
        code, findings = advise_during(url, 30, prompts, max_tokens=5)
    assert code == 3 and [f["rule"] for f in findings] == ["event-loop-blocked"], findings
    ev = findings[0]["evidence"]
    assert ev["loopLagP99Seconds"] > 0.005 and ev["probesOver5ms"] > 0.01
    assert ev["tokenizeSecondsPerRequest"] >= 0.05  # the slow tokenizer shows in the evidence
    extra = findings[0]["recommendation"]["engine"]["extraArgs"]

    with server([*BASE, *extra], tmp_path) as url:
        code, findings = advise_during(url, 30, prompts, max_tokens=5)
    assert (code, findings) == (0, [])
