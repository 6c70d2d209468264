"""The advisor's rules: a metrics snapshot and the engine settings in, findings out. Pure.

Each rule is one of seed 000's batching mistakes (docs/advisor.md has, per rule, the
seed's symptom, the threshold and why, and what a false positive looks like). A rule
fires only on enough evidence (`MIN_REQUESTS` finished requests in the window for the
rules about request shapes) and only when the settings it needs are known; a rule that
cannot tell stays silent. The operator adds hysteresis on top (hysteresis.py).

Names are vLLM's, so a stock vLLM pod is advised the same way; ours (`llmservice:*`)
add what vLLM does not export: prompt tokens that *would* have hit a prefix cache that
is off, and the API event loop's lag.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmservice.operator.advisor.engine_settings import EngineSettings
from llmservice.operator.advisor.snapshot import Snapshot

# metric names (vLLM's first, ours after)
GENERATION_TOKENS = "vllm:request_generation_tokens"
PROMPT_TOKENS = "vllm:request_prompt_tokens"
PROMPT_TOKENS_TOTAL = "vllm:prompt_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
POTENTIAL_HITS = "llmservice:prefix_cache_potential_hits_total"
LOOP_LAG = "llmservice:event_loop_lag_seconds"
LOOP_BUSY_LAG = "llmservice:event_loop_busy_lag_seconds"
TOKENIZE_SECONDS = "llmservice:tokenize_seconds_total"
DETOKENIZE_SECONDS = "llmservice:detokenize_seconds_total"
REQUESTS_FINISHED = "vllm:e2e_request_latency_seconds"
# what a preemption costs, measured by our engine at start-up (server/advisor_metrics.py)
PREEMPTED_RECOMPUTE = "llmservice:preempted_tokens_recompute_total"
PREEMPTED_SWAP = "llmservice:preempted_tokens_swap_total"
RECOMPUTE_S_PER_TOKEN = "llmservice:preemption_recompute_seconds_per_token"
SWAP_S_PER_TOKEN = "llmservice:preemption_swap_seconds_per_token"
SWAP_FIXED_S = "llmservice:preemption_swap_fixed_seconds"

# thresholds (docs/advisor.md says why each)
MIN_REQUESTS = 10
SHORT_ANSWER_TOKENS = 50
LONG_ANSWER_TOKENS = 1000
PREEMPTIONS_PER_MINUTE = 5.0
LONG_PROMPT_TOKENS = 2000
POTENTIAL_HIT_SHARE = 0.30
MAX_MODEL_LEN_HEADROOM = 4
LOOP_LAG_P99_SECONDS = 0.005
MIN_LOOP_PROBES = 20
GPU_UTILIZATION_CEILING = 0.92
GPU_UTILIZATION_SAFE = 0.90
KV_HIGH = 0.90
KV_LOW = 0.50

WARNING, INFO = "warning", "info"
SEVERITY_ORDER = {WARNING: 0, INFO: 1}


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    summary: str  # one line: the Event message and `llmservice advise` text
    evidence: dict[str, Any]
    recommendation: dict[str, Any]  # a JSON merge patch of the LLMService spec
    expected_effect: dict[str, Any] = field(default_factory=dict)  # estimate + arithmetic

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "summary": self.summary,
            "evidence": self.evidence,
            "recommendation": self.recommendation,
            "expectedEffect": self.expected_effect,
        }


def _r(x: float, digits: int = 3) -> float:
    return round(float(x), digits)


def _finished(snap: Snapshot) -> float:
    for name in (REQUESTS_FINISHED, GENERATION_TOKENS):
        h = snap.histogram(name)
        if h is not None:
            return h.count
    return 0.0


def _pow2_at_least(n: float) -> int:
    return 1 << max(4, math.ceil(math.log2(max(1.0, n))))


# ---- rule 1: block size vs answer length ---------------------------------------------------
def tail_waste(mean_tokens: float, block_size: int) -> float:
    """Share of KV slots left empty in requests' last blocks: a request's length modulo the
    block size is taken as uniform, so the mean tail is (B-1)/2 slots."""
    tail = (block_size - 1) / 2
    return tail / (mean_tokens + tail)


def block_size_rule(snap: Snapshot, s: EngineSettings) -> Finding | None:
    gen, prompt = snap.histogram(GENERATION_TOKENS), snap.histogram(PROMPT_TOKENS)
    if gen is None or gen.count < MIN_REQUESTS or s.block_size is None:
        return None
    mean_gen = gen.mean or 0.0
    mean_prompt = (prompt.mean or 0.0) if prompt is not None else 0.0
    bs = s.block_size
    if mean_gen < SHORT_ANSWER_TOKENS and bs >= 32:
        new_bs, severity = 16, WARNING
        why = f"answers average {mean_gen:.0f} tokens with blockSize {bs}"
    elif mean_gen > LONG_ANSWER_TOKENS and bs <= 16:
        new_bs, severity = 64, INFO
        why = f"answers average {mean_gen:.0f} tokens with blockSize {bs} (long block tables)"
    else:
        return None
    mean_len = mean_prompt + mean_gen
    waste, new_waste = tail_waste(mean_len, bs), tail_waste(mean_len, new_bs)
    slots, new_slots = mean_len + (bs - 1) / 2, mean_len + (new_bs - 1) / 2
    kv = snap.gauge_range(*KV_USAGE)
    running = snap.gauge_range(RUNNING)
    evidence: dict[str, Any] = {
        "meanGenerationTokens": _r(mean_gen, 1),
        "meanPromptTokens": _r(mean_prompt, 1),
        "requests": int(gen.count),
        "blockSize": bs,
        "kvWasteShare": _r(waste),
        "meanTailSlotsPerRequest": _r((bs - 1) / 2, 1),
        "meanSlotsPerRequest": _r(slots, 1),
    }
    if kv is not None and running is not None and s.max_num_seqs is not None:
        evidence["kvCacheUsageMax"] = _r(kv[1])
        evidence["runningMax"] = running[1]
        evidence["maxNumSeqs"] = s.max_num_seqs
        evidence["kvFullWhileBatchSmall"] = kv[1] >= KV_HIGH and running[1] < s.max_num_seqs
    gain = slots / new_slots
    return Finding(
        rule="block-size",
        severity=severity,
        summary=f"{why}: {waste:.0%} of KV slots are tail waste; set engine.blockSize {new_bs}",
        evidence=evidence,
        recommendation={"engine": {"blockSize": new_bs}},
        expected_effect={
            "kvWasteShare": _r(new_waste),
            "concurrentRequestsFactor": _r(gain),
            "arithmetic": (
                f"tail (B-1)/2: {(bs - 1) / 2:.1f} -> {(new_bs - 1) / 2:.1f} slots; slots per request "
                f"{mean_len:.1f}+{(bs - 1) / 2:.1f}={slots:.1f} -> {new_slots:.1f}; "
                f"requests per KV pool x{gain:.2f}"
            ),
        },
    )


# ---- rule 2: preemptions ---------------------------------------------------------------------
@dataclass(frozen=True)
class PreemptionPrice:
    """What the window's preemptions cost, from the engine's own measurement (our server
    exports it; stock vLLM does not, and then this is None)."""

    tokens_per_minute: float  # computed tokens the victims held (recomputed ones + swapped ones)
    # all of those tokens re-prefilled, at the measured marginal cost (what recompute-only costs)
    recompute_seconds_per_minute: float
    swap_seconds_per_minute: float | None  # all of them swapped instead (None: swap not measured)

    def evidence(self, rate: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "preemptedTokensPerMinute": _r(self.tokens_per_minute, 0),
            "tokensPerPreemption": _r(self.tokens_per_minute / rate, 0) if rate else None,
            "measuredRecomputeSecondsPerMinute": _r(self.recompute_seconds_per_minute, 3),
        }
        if self.swap_seconds_per_minute is not None:
            out["measuredSwapSecondsPerMinute"] = _r(self.swap_seconds_per_minute, 3)
        return out


def preemption_price(snap: Snapshot, rate: float) -> PreemptionPrice | None:
    recompute_tokens, swap_tokens = snap.increase(PREEMPTED_RECOMPUTE), snap.increase(PREEMPTED_SWAP)
    per_token = snap.after.value(RECOMPUTE_S_PER_TOKEN)
    if recompute_tokens is None or per_token is None or snap.seconds <= 0:
        return None
    tokens = (recompute_tokens + (swap_tokens or 0.0)) * 60.0 / snap.seconds
    swap_per_token, swap_fixed = snap.after.value(SWAP_S_PER_TOKEN), snap.after.value(SWAP_FIXED_S)
    swap = None
    if swap_per_token is not None and swap_fixed is not None:
        swap = rate * swap_fixed + tokens * swap_per_token
    return PreemptionPrice(tokens, tokens * per_token, swap)


def _price_arithmetic(price: PreemptionPrice | None) -> str:
    """The measured cost, as a sentence the arithmetic ends with ('' when not measured)."""
    if price is None:
        return ""
    text = (
        f"; measured: the victims held {price.tokens_per_minute:.0f} tokens/min; re-prefilling "
        f"them all costs {price.recompute_seconds_per_minute:.2f} s per minute "
        f"({price.recompute_seconds_per_minute / 60:.1%} of the engine's time)"
    )
    if price.swap_seconds_per_minute is not None:
        text += f", swapping them all would take {price.swap_seconds_per_minute:.2f} s/min"
    return text


def preemption_rule(snap: Snapshot, s: EngineSettings) -> Finding | None:
    rate = snap.per_minute(PREEMPTIONS)
    if rate is None or rate <= PREEMPTIONS_PER_MINUTE:
        return None
    prompt, gen = snap.histogram(PROMPT_TOKENS), snap.histogram(GENERATION_TOKENS)
    mean_prompt = prompt.mean if prompt is not None and prompt.count else None
    mean_gen = gen.mean if gen is not None and gen.count else None
    evidence: dict[str, Any] = {
        "preemptionsPerMinute": _r(rate, 1),
        "threshold": PREEMPTIONS_PER_MINUTE,
        "meanPromptTokens": None if mean_prompt is None else _r(mean_prompt, 1),
        "preemptionMode": s.preemption_mode,
    }
    price = preemption_price(snap, rate)
    if price is not None:
        evidence.update(price.evidence(rate))
    if mean_prompt is not None and mean_prompt >= LONG_PROMPT_TOKENS and s.preemption_mode == "recompute":
        swap = max(s.swap_space_gib or 0.0, 4.0)
        effect: dict[str, Any] = {"recomputedPromptTokensPerMinute": _r(rate * mean_prompt, 0)}
        if price is not None:
            effect["recomputeSecondsPerMinute"] = _r(price.recompute_seconds_per_minute, 3)
        return Finding(
            rule="preemptions",
            severity=WARNING,
            summary=(
                f"{rate:.0f} preemptions/min with {mean_prompt:.0f}-token prompts under recompute: "
                f"set engine.preemptionMode auto (swap when re-prefill costs more than the copy)"
            ),
            evidence=evidence,
            recommendation={"engine": {"preemptionMode": "auto", "swapSpaceGiB": swap}},
            expected_effect={
                **effect,
                "arithmetic": (
                    f"each preemption under recompute re-prefills ~{mean_prompt:.0f} prompt tokens: "
                    f"{rate:.1f}/min x {mean_prompt:.0f} = {rate * mean_prompt:.0f} tokens/min of "
                    "prefill that swap replaces with a KV copy (auto measures both at start-up and "
                    "takes the cheaper per victim)" + _price_arithmetic(price)
                ),
            },
        )
    # Short prompts: the cache cannot hold maxNumSeqs requests; fewer at once, or more replicas.
    target = None
    if s.num_gpu_blocks and s.block_size and mean_prompt is not None and mean_gen is not None:
        per_request = math.ceil((mean_prompt + mean_gen) / s.block_size)
        target = max(1, s.num_gpu_blocks // max(1, per_request))
        evidence["kvBlocks"] = s.num_gpu_blocks
        evidence["blocksPerRequest"] = per_request
    evidence["maxNumSeqs"] = s.max_num_seqs
    if target is not None and s.max_num_seqs is not None and target < s.max_num_seqs:
        recommendation: dict[str, Any] = {"engine": {"maxNumSeqs": target}}
        arithmetic = (
            f"{s.num_gpu_blocks} blocks / {evidence['blocksPerRequest']} blocks per request "
            f"({mean_prompt:.0f}+{mean_gen:.0f} tokens at block {s.block_size}) = {target} requests "
            "fit without preemption; or add replicas (autoscaling.enabled) to keep the batch"
        )
        summary = (
            f"{rate:.0f} preemptions/min with short prompts: the KV cache holds {target} requests, "
            f"not maxNumSeqs {s.max_num_seqs}; set engine.maxNumSeqs {target} or add replicas"
        )
    else:
        replicas = math.ceil(rate / PREEMPTIONS_PER_MINUTE)
        recommendation = {"autoscaling": {"enabled": True}}
        arithmetic = (
            f"{rate:.1f}/min / {PREEMPTIONS_PER_MINUTE:g} per replica = {replicas} replicas' worth "
            "of load on this one; the autoscaler's preemption signal adds them"
        )
        summary = f"{rate:.0f} preemptions/min with short prompts: add replicas (autoscaling.enabled)"
    arithmetic += _price_arithmetic(price)
    short_effect: dict[str, Any] = {"preemptionsPerMinute": 0}
    if price is not None:
        short_effect["recomputeSecondsPerMinuteSaved"] = _r(price.recompute_seconds_per_minute, 3)
    return Finding(
        rule="preemptions",
        severity=WARNING,
        summary=summary,
        evidence=evidence,
        recommendation=recommendation,
        expected_effect={**short_effect, "arithmetic": arithmetic},
    )


# ---- rule 3: prefix caching off while prompts share prefixes ---------------------------------
def prefix_caching_rule(snap: Snapshot, s: EngineSettings) -> Finding | None:
    potential, prompt_tokens = snap.increase(POTENTIAL_HITS), snap.increase(PROMPT_TOKENS_TOTAL)
    if potential is None or not prompt_tokens:
        return None
    caching_off = s.enable_prefix_caching is False
    if s.enable_prefix_caching is None:  # unknown: no lookups while prompts flow means off
        caching_off = (snap.increase(PREFIX_QUERIES) or 0.0) == 0.0
    share = potential / prompt_tokens
    if not caching_off or share <= POTENTIAL_HIT_SHARE:
        return None
    speedup = 1.0 / max(1e-9, 1.0 - share)
    return Finding(
        rule="prefix-caching-off",
        severity=WARNING,
        summary=(
            f"prefix caching is off but {share:.0%} of prompt tokens would have hit it; "
            "set engine.enablePrefixCaching true"
        ),
        evidence={
            "potentialHitTokens": int(potential),
            "promptTokens": int(prompt_tokens),
            "potentialHitShare": _r(share),
            "threshold": POTENTIAL_HIT_SHARE,
        },
        recommendation={"engine": {"enablePrefixCaching": True}},
        expected_effect={
            "prefillTokensComputedFactor": _r(1.0 - share),
            "prefillSpeedup": _r(speedup, 2),
            "arithmetic": (
                f"{int(prompt_tokens)} prompt tokens, {int(potential)} of them cached: "
                f"{int(prompt_tokens - potential)} computed = x{1 - share:.2f} prefill work "
                f"(up to {speedup:.2f}x faster prefill)"
            ),
        },
    )


# ---- rule 4: max_model_len far above use -----------------------------------------------------
def max_model_len_rule(snap: Snapshot, s: EngineSettings) -> Finding | None:
    prompt, gen = snap.histogram(PROMPT_TOKENS), snap.histogram(GENERATION_TOKENS)
    if prompt is None or gen is None or gen.count < MIN_REQUESTS:
        return None
    if not (s.max_model_len and s.max_num_seqs and s.num_gpu_blocks and s.block_size):
        return None
    # P(prompt > a) <= 0.05% and P(gen > b) <= 0.05% => P(prompt + gen > a + b) <= 0.1%
    a, b = prompt.upper_bound(0.9995), gen.upper_bound(0.9995)
    if a is None or b is None:
        return None
    need = min(float(s.max_model_len), a + b)
    if s.max_model_len <= MAX_MODEL_LEN_HEADROOM * need:
        return None
    kv_tokens = s.num_gpu_blocks * s.block_size
    full_length = kv_tokens // s.max_model_len
    if full_length >= s.max_num_seqs:
        return None
    new_len = min(_pow2_at_least(need), s.max_model_len)
    new_full = kv_tokens // new_len
    batched = max(2 * new_len, 2048)
    engine: dict[str, Any] = {"maxModelLen": new_len, "maxNumBatchedTokens": batched}
    if s.enable_chunked_prefill is False:
        engine["enableChunkedPrefill"] = True
    return Finding(
        rule="max-model-len",
        severity=WARNING,
        summary=(
            f"maxModelLen {s.max_model_len} is {s.max_model_len / need:.0f}x the p99.9 request "
            f"({need:.0f} tokens); the cache holds {full_length} full-length requests, "
            f"not maxNumSeqs {s.max_num_seqs}; set engine.maxModelLen {new_len}"
        ),
        evidence={
            "maxModelLen": s.max_model_len,
            "p999PromptPlusGenerationTokens": _r(need, 0),
            "promptTokensP9995": a,
            "generationTokensP9995": b,
            "kvCacheTokens": kv_tokens,
            "fullLengthConcurrency": full_length,
            "maxNumSeqs": s.max_num_seqs,
            "enableChunkedPrefill": s.enable_chunked_prefill,
        },
        recommendation={"engine": engine},
        expected_effect={
            "fullLengthConcurrency": min(new_full, s.max_num_seqs),
            "arithmetic": (
                f"{kv_tokens} KV tokens / {s.max_model_len} = {full_length} worst-case requests; "
                f"/ {new_len} = {new_full} (capped at maxNumSeqs {s.max_num_seqs}). The guaranteed "
                "worst case: a lazy KV allocator (ours, vLLM V1) already runs more short requests, "
                "so the step budget and admission limit are what change at once"
            ),
        },
    )


# ---- rule 5: the event loop is blocked --------------------------------------------------------
def event_loop_rule(snap: Snapshot, s: EngineSettings) -> Finding | None:
    lag = snap.histogram(LOOP_LAG)
    if lag is None or lag.count < MIN_LOOP_PROBES:
        return None
    above = lag.fraction_above(LOOP_LAG_P99_SECONDS) or 0.0
    if above <= 0.01 + 1e-9:  # p99 <= 5 ms (1e-9: 6 of 600 is 1 %, not 1.000001 %)
        return None
    p99 = lag.quantile(0.99) or 0.0
    evidence: dict[str, Any] = {
        "loopLagP99Seconds": _r(p99, 4),
        "probesOver5ms": _r(above),
        "probes": int(lag.count),
        "threshold": LOOP_LAG_P99_SECONDS,
    }
    busy = snap.histogram(LOOP_BUSY_LAG)
    if busy is not None and busy.count:
        # late, but not because of work on the loop: a CPU-starved process (not this rule)
        busy_above = busy.fraction_above(LOOP_LAG_P99_SECONDS) or 0.0
        if busy_above <= 0.01 + 1e-9:
            return None
        evidence["busyLagP99Seconds"] = _r(busy.quantile(0.99) or 0.0, 4)
    requests = _finished(snap)
    for key, name in (("tokenizeSecondsPerRequest", TOKENIZE_SECONDS), ("detokenizeSecondsPerRequest", DETOKENIZE_SECONDS)):
        spent = snap.increase(name)
        if spent is not None and requests:
            evidence[key] = _r(spent / requests, 4)
    mean = lag.mean or 0.0
    return Finding(
        rule="event-loop-blocked",
        severity=WARNING,
        summary=(
            f"the API event loop's p99 lag is {p99 * 1000:.1f} ms (> 5 ms): tokenizer or other "
            "CPU work runs on it; give the tokenizer more worker threads"
        ),
        evidence=evidence,
        recommendation={"engine": {"extraArgs": ["--tokenizer-workers", "4"]}},
        expected_effect={
            "loopLagP99Seconds": LOOP_LAG_P99_SECONDS,
            "arithmetic": (
                f"every token and request waits for the loop: mean lag {mean * 1000:.2f} ms per "
                f"wake-up, {above:.0%} of wake-ups over 5 ms; off the loop it is < 1 ms"
            ),
        },
    )


# ---- rule 6: memory margin, and queues with a free cache --------------------------------------
def gpu_memory_rule(snap: Snapshot, s: EngineSettings) -> Finding | None:
    util = s.gpu_memory_utilization
    if util is None or util <= GPU_UTILIZATION_CEILING:
        return None
    rate = snap.per_minute(PREEMPTIONS) or 0.0
    if rate <= 0 and snap.oom_restarts <= 0:
        return None
    return Finding(
        rule="gpu-memory-utilization",
        severity=WARNING,
        summary=(
            f"gpuMemoryUtilization {util:g} leaves no margin ({rate:.0f} preemptions/min, "
            f"{snap.oom_restarts} OOMKilled restarts); set resources.gpuMemoryUtilization "
            f"{GPU_UTILIZATION_SAFE:g}"
        ),
        evidence={"gpuMemoryUtilization": util, "preemptionsPerMinute": _r(rate, 1),
                  "oomKilledRestarts": snap.oom_restarts, "threshold": GPU_UTILIZATION_CEILING},
        recommendation={"resources": {"gpuMemoryUtilization": GPU_UTILIZATION_SAFE}},
        expected_effect={
            "freeMarginShare": _r(1 - GPU_UTILIZATION_SAFE),
            "arithmetic": (
                f"margin for activation spikes {1 - util:.0%} -> {1 - GPU_UTILIZATION_SAFE:.0%} of "
                f"the GPU; KV pool x~{GPU_UTILIZATION_SAFE / util:.2f} (weights unchanged, so a little less)"
            ),
        },
    )


def waiting_rule(snap: Snapshot, s: EngineSettings) -> Finding | None:
    waiting, kv, running = snap.gauge_range(WAITING), snap.gauge_range(*KV_USAGE), snap.gauge_range(RUNNING)
    if waiting is None or kv is None or running is None or waiting[0] <= 0 or kv[1] >= KV_LOW:
        return None
    evidence: dict[str, Any] = {
        "waitingMin": waiting[0],
        "kvCacheUsageMax": _r(kv[1]),
        "runningMax": running[1],
        "maxNumSeqs": s.max_num_seqs,
        "maxNumBatchedTokens": s.max_num_batched_tokens,
    }
    at_seq_cap = s.max_num_seqs is not None and running[1] >= s.max_num_seqs
    if at_seq_cap:
        assert s.max_num_seqs is not None
        # KV usage grows about linearly with running requests: stay under KV_HIGH.
        fit = int(running[1] * KV_HIGH / kv[1]) if kv[1] > 0 else 2 * s.max_num_seqs
        new = max(s.max_num_seqs + 1, min(2 * s.max_num_seqs, fit))
        recommendation: dict[str, Any] = {"engine": {"maxNumSeqs": new}}
        cap = f"maxNumSeqs {s.max_num_seqs}"
        arithmetic = (
            f"{running[1]:.0f} running use {kv[1]:.0%} of the KV cache: {KV_HIGH:.0%} fits "
            f"~{fit}; min(2 x {s.max_num_seqs}, {fit}) = {new}"
        )
    elif s.max_num_batched_tokens is not None:
        new = 2 * s.max_num_batched_tokens
        engine: dict[str, Any] = {"maxNumBatchedTokens": new}
        if s.enable_chunked_prefill is False:
            engine["enableChunkedPrefill"] = True
        recommendation = {"engine": engine}
        cap = f"the step budget maxNumBatchedTokens {s.max_num_batched_tokens}"
        arithmetic = f"a step admits up to {s.max_num_batched_tokens} tokens of prefill; x2 = {new}"
    else:
        return None
    return Finding(
        rule="waiting-with-free-kv",
        severity=INFO,
        summary=(
            f"{waiting[0]:.0f}+ requests wait while the KV cache is {kv[1]:.0%} used: the cap is "
            f"{cap}, not memory"
        ),
        evidence=evidence,
        recommendation=recommendation,
        expected_effect={"limit": cap, "arithmetic": arithmetic},
    )


# ---- rule 7: inter-token latency spikes made of long steps (seed 004) ------------------------
ITL = "vllm:inter_token_latency_seconds"
STEP_DURATION = "llmservice:step_duration_seconds"
STEP_TARGET = "llmservice:step_budget_target_seconds"
DECODE_OVERRUNS = "llmservice:step_budget_decode_overruns_total"
ITL_P99_OVER_MEDIAN = 4.0
MIN_ITL_GAPS = 100
STEP_SHARE_OF_SPIKE = 0.5  # the long steps must be at least this share of the ITL p99
MAX_STEP_PER_MEDIAN = 2.0  # the recommended target, in ITL medians


def itl_step_rule(snap: Snapshot, s: EngineSettings) -> Finding | None:
    """ITL p99 > 4x its median, and the steps are that long: cap the step time."""
    itl, steps = snap.histogram(ITL), snap.histogram(STEP_DURATION)
    if itl is None or itl.count < MIN_ITL_GAPS or steps is None or not steps.count:
        return None
    p50, p99 = itl.quantile(0.5) or 0.0, itl.quantile(0.99) or 0.0
    step_p50, step_p99 = steps.quantile(0.5) or 0.0, steps.quantile(0.99) or 0.0
    if p50 <= 0 or p99 <= ITL_P99_OVER_MEDIAN * p50 or step_p99 <= STEP_SHARE_OF_SPIKE * p99:
        return None
    target_ms = max(10, math.ceil(MAX_STEP_PER_MEDIAN * p50 * 100) * 10)
    current = snap.after.value(STEP_TARGET)
    if current and current * 1000 <= target_ms:
        return None  # the budget is already that tight: the spikes come from elsewhere
    evidence: dict[str, Any] = {
        "itlP50Seconds": _r(p50, 4),
        "itlP99Seconds": _r(p99, 4),
        "itlP99OverMedian": _r(p99 / p50, 2),
        "gaps": int(itl.count),
        "stepP50Seconds": _r(step_p50, 4),
        "stepP99Seconds": _r(step_p99, 4),
        "steps": int(steps.count),
        "threshold": ITL_P99_OVER_MEDIAN,
    }
    if current is not None:
        evidence["stepTargetSeconds"] = _r(current, 4)
    overruns = snap.increase(DECODE_OVERRUNS)
    if overruns is not None:
        evidence["decodeOverruns"] = int(overruns)
    return Finding(
        rule="itl-long-steps",
        severity=WARNING,
        summary=(
            f"inter-token latency p99 {p99 * 1000:.0f} ms is {p99 / p50:.1f}x its median "
            f"({p50 * 1000:.0f} ms) and steps reach {step_p99 * 1000:.0f} ms: prefill competes "
            f"with decode; set engine.maxStepMs {target_ms}"
        ),
        evidence=evidence,
        recommendation={"engine": {"maxStepMs": target_ms}},
        expected_effect={
            "itlP99Seconds": _r(target_ms / 1000, 3),
            "arithmetic": (
                f"a decoding request waits one step per token: steps capped at {MAX_STEP_PER_MEDIAN:g} x "
                f"the median gap ({p50 * 1000:.0f} ms) = {target_ms} ms bound the p99 gap near "
                f"{target_ms} ms (from {p99 * 1000:.0f} ms); prefill moves into more, shorter steps"
            ),
        },
    )


RULES: tuple[Callable[[Snapshot, EngineSettings], Finding | None], ...] = (
    block_size_rule,
    preemption_rule,
    prefix_caching_rule,
    max_model_len_rule,
    event_loop_rule,
    gpu_memory_rule,
    waiting_rule,
    itl_step_rule,
)


def evaluate(snap: Snapshot, settings: EngineSettings) -> list[Finding]:
    """Every rule's finding, warnings first (the printer column shows the first)."""
    found = [f for rule in RULES if (f := rule(snap, settings)) is not None]
    return sorted(found, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))
