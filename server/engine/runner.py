"""Turns a plain-data step (`step.SchedulerOutput`) into tensors, runs the model, samples.
Makes no policy, and reads nothing of the scheduler's: it keeps its own copy of each
request's block table and sampling parameters, updated by what each step says changed.

Layout of a step's flat batch: decodes (one new token) first, then prefill chunks, as
`AttentionMetadata` describes; logits are computed only for requests whose step reaches
the end of their known tokens (a partial prefill chunk samples nothing).

Pure-decode steps may run on fixed-address inputs padded to a captured batch size
(static_inputs.py), replayed from a CUDA graph on CUDA (cuda_graphs.py). With
overlapped scheduling (overlap.py) a step's placeholder tokens are filled from the
previous step's sampled tokens where they are: `submit` launches a step and returns
before its tokens reach the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from llmservice.kernels import kv_quant, ops
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.server.engine import cuda_graphs, spec_verify, zero_pages
from llmservice.server.engine.cuda_graphs import DecodeGraphs
from llmservice.server.engine.kv_scales import calibrated_scales
from llmservice.server.engine.request import TokenLogprob
from llmservice.server.engine.sampler import Sampler, SampleRow
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.static_inputs import StaticDecodeInputs, pad_decode, to_device
from llmservice.server.engine.step import PLACEHOLDER_TOKEN, ScheduledRequest, SchedulerOutput
from llmservice.server.model.llama import LlamaModel


def allocate_kv_caches(
    model: LlamaModel, num_blocks: int, block_size: int, kv_cache_dtype: str = "auto"
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (K, V) pools; with an fp8 `kv_cache_dtype` they are float8_e4m3fn with
    each pool's calibrated scale attached (kernels/kv_quant.py)."""
    cfg = model.config
    shape = (num_blocks, block_size, model.num_kv_heads, cfg.head_dim)  # this rank's KV heads
    dtype = kv_quant.FP8 if kv_quant.is_fp8(kv_cache_dtype) else model.dtype
    # zeros, not empty: padded block-table rows read block 0, and masked garbage must stay finite
    # (zero_pages: on CPU the zeros cost nothing until a block is written)
    caches = [
        (zero_pages.zeros(shape, dtype, model.device), zero_pages.zeros(shape, dtype, model.device))
        for _ in range(cfg.num_layers)
    ]
    if dtype == kv_quant.FP8:
        for (k, v), (k_scale, v_scale) in zip(caches, calibrated_scales(model, block_size), strict=True):
            kv_quant.set_scale(k, k_scale)
            kv_quant.set_scale(v, v_scale)
    return caches


@dataclass
class RunnerRequest:
    """What the runner remembers of a request between steps."""

    sampling_params: SamplingParams
    block_ids: list[int] = field(default_factory=list)


@dataclass
class StepResult:
    """Per request that sampled: its new tokens (one, or accepted drafts plus one) and logprobs."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)


@dataclass
class HostBatch:
    """A step's flat batch on the host (decodes first), before any tensor is built."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    query_lens: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    logits_rows: list[int] = field(default_factory=list)
    sample_rows: list[tuple[str, SampleRow]] = field(default_factory=list)
    fills: list[tuple[int, str]] = field(default_factory=list)  # (flat index, request id): placeholders
    lora_rows: list[int] = field(default_factory=list)  # per flat row: its adapter's slot, -1: none

    @property
    def pure_decode(self) -> bool:
        return cuda_graphs.is_pure_decode(self.query_lens)


@dataclass
class _Sampled:
    """The tokens of a launched step: on the device for the next step's placeholders,
    and (on CUDA, for greedy batches) on their way to a pinned host buffer."""

    rows: dict[str, int]  # request id -> its row in `device` (its last sampled token)
    device: torch.Tensor | None
    host: torch.Tensor | None = None
    event: object | None = None  # torch.cuda.Event recorded after the copy
    result: StepResult | None = None  # known on the host already (CPU, host sampling)
    sample_rows: list[tuple[str, SampleRow]] = field(default_factory=list)

    def wait(self) -> StepResult:
        if self.result is None:
            self.event.synchronize()
            tokens = self.host.tolist()
            self.result = StepResult(tokens={rid: [tokens[i]] for i, (rid, _) in enumerate(self.sample_rows)})
        return self.result


class _Launched:
    """A PendingStep (overlap.py) of this runner."""

    def __init__(self, sampled: _Sampled):
        self._sampled = sampled

    def result(self) -> StepResult:
        return self._sampled.wait()


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        seed: int = 0,
        decode_sizes: list[int] | None = None,
        max_model_len: int | None = None,
        kv_cache_dtype: str = "auto",
    ):
        """`decode_sizes`: run pure-decode steps of up to max(decode_sizes) rows on static
        inputs padded to one of these sizes (then the pool has one more block, the pad
        block, which the block manager never hands out); `capture_graphs` makes them
        CUDA graph replays."""
        self.model = model
        self.block_size = block_size
        self.decode_sizes = sorted(decode_sizes or [])
        self.static: StaticDecodeInputs | None = None
        extra = 0
        if self.decode_sizes:
            if max_model_len is None:
                raise ValueError("static decode inputs need max_model_len (the widest block table)")
            extra = 1  # the pad block
            self.static = StaticDecodeInputs(
                self.decode_sizes[-1], -(-max_model_len // block_size), block_size, num_blocks, model.device
            )
        self.max_model_len = max_model_len
        self.kv_caches = allocate_kv_caches(model, num_blocks + extra, block_size, kv_cache_dtype)
        self.sampler = Sampler(seed)
        self.device = model.device
        self.requests: dict[str, RunnerRequest] = {}
        self.graphs: DecodeGraphs | None = None
        self._last: _Sampled | None = None  # the previous step's tokens (placeholders read them)
        self.num_static_steps = 0  # pure-decode steps run on the static inputs (tests, metrics)
        self.num_graph_replays = 0

    def capture_graphs(self) -> DecodeGraphs:
        """Capture a CUDA graph per decode size on this runner's pool (CUDA only)."""
        if self.static is None or self.max_model_len is None:
            raise RuntimeError("CUDA graphs need the static decode inputs (decode_sizes)")
        self.graphs = DecodeGraphs(self.model, self.kv_caches, self.static, self.decode_sizes, self.max_model_len)
        self.graphs.capture()
        return self.graphs

    def _apply_changes(self, out: SchedulerOutput) -> None:
        for rid in out.finished_request_ids:
            self.requests.pop(rid, None)
        for rid, params in out.new_requests.items():
            self.requests[rid] = RunnerRequest(params)
        for s in out.scheduled:
            self.requests[s.request_id].block_ids[s.block_table_start :] = s.new_block_ids

    def host_batch(self, scheduled: list[ScheduledRequest]) -> HostBatch:
        bs = self.block_size
        order = sorted(scheduled, key=lambda s: s.num_tokens != 1)  # decodes first, stable
        b = HostBatch()
        input_ids = b.input_ids
        for s in order:
            start, end = s.start_position, s.end_position
            state = self.requests[s.request_id]
            blocks = state.block_ids
            if s.token_ids and s.token_ids[-1] == PLACEHOLDER_TOKEN:
                b.fills.append((len(input_ids) + len(s.token_ids) - 1, s.request_id))
            input_ids.extend(s.token_ids)
            input_ids.extend(s.spec_token_ids)  # drafts: verified at k+1 rows (spec_verify.py)
            b.positions.extend(range(start, end))
            b.lora_rows.extend([s.lora_slot] * (end - start))
            b.slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, end))
            b.query_lens.append(s.num_tokens)
            b.seq_lens.append(end)
            b.tables.append(blocks)
            if s.sample:
                b.logits_rows.extend(range(len(input_ids) - 1 - len(s.spec_token_ids), len(input_ids)))
                b.sample_rows.append((s.request_id, SampleRow(state.sampling_params, s.output_index, s.grammar_bitmask)))
        return b

    def _tensor(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """A host list on the device, copied without waiting for the GPU (static_inputs.to_device)."""
        return to_device(values, dtype, self.device)

    def prepare(self, scheduled: list[ScheduledRequest]):
        """The eager path's tensors: (ids, positions, metadata, logits rows, sample rows)."""
        b = self.host_batch(scheduled)
        ids, pos, meta = self._eager_inputs(b)
        self._fill_placeholders(ids, b.fills)
        return ids, pos, meta, self._tensor(b.logits_rows, torch.int64), b.sample_rows

    def _eager_inputs(self, b: HostBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        width = max(len(t) for t in b.tables)
        starts = [0]
        for q in b.query_lens:
            starts.append(starts[-1] + q)
        meta = AttentionMetadata(
            slot_mapping=self._tensor(b.slots, torch.int64),
            block_tables=self._tensor([t + [0] * (width - len(t)) for t in b.tables], torch.int32),
            seq_lens=self._tensor(b.seq_lens, torch.int32),
            query_start_loc=self._tensor(starts, torch.int32),
            query_lens=b.query_lens,
            seq_lens_host=b.seq_lens,
            num_decodes=sum(1 for q in b.query_lens if q == 1),
            block_size=self.block_size,
        )
        return self._tensor(b.input_ids, torch.int64), self._tensor(b.positions, torch.int64), meta

    def _fill_placeholders(self, ids: torch.Tensor, fills: list[tuple[int, str]]) -> None:
        """Each placeholder becomes the token the previous step sampled for its request,
        copied on the device (no host round trip)."""
        if not fills:
            return
        last = self._last
        if last is None or last.device is None:
            raise RuntimeError("a step has placeholder tokens but the previous step left no sampled tokens")
        dst = self._tensor([i for i, _ in fills], torch.int64)
        src = self._tensor([last.rows[rid] for _, rid in fills], torch.int64)
        ids.index_copy_(0, dst, last.device.index_select(0, src))

    def _hidden(self, b: HostBatch) -> torch.Tensor:
        """The final hidden states of the batch: static inputs (graph replay on CUDA) for a
        pure-decode step that fits a captured size, else the eager path."""
        padded = cuda_graphs.padded_batch_size(len(b.query_lens), self.decode_sizes) if b.pure_decode else None
        lora = self.model.lora
        if lora is not None:  # rows with an adapter run eagerly (graphs hold the base model only)
            lora.set_rows(b.lora_rows)
            padded = None if lora.active else padded
        if padded is None or self.static is None:
            ids, pos, meta = self._eager_inputs(b)
            self._fill_placeholders(ids, b.fills)
            return self.model.forward_hidden(ids, pos, meta, self.kv_caches)
        static = self.static
        batch = pad_decode(b.input_ids, b.positions, b.slots, b.seq_lens, b.tables, padded, static.pad_block,
                           self.block_size)  # fmt: skip
        static.fill(batch)
        self._fill_placeholders(static.input_ids, b.fills)
        self.num_static_steps += 1
        if self.graphs is not None:
            self.num_graph_replays += 1
            return self.graphs.replay(padded)
        meta = static.metadata(padded, self._static_host_lens(batch.seq_lens, static.input_ids))
        return self.model.forward_hidden(static.input_ids[:padded], static.positions[:padded], meta, self.kv_caches)

    def _static_host_lens(self, seq_lens: list[int], like: torch.Tensor) -> list[int]:
        """The host lengths of an eager static step: the Triton kernels read them only to
        size decode attention's splits, so they get the graphs' bound and compute exactly
        what a replay computes (the GPU check compares the two); the torch path masks
        with them, so it gets the exact ones."""
        if ops.backend_for(like) == "triton" and self.max_model_len is not None:
            return [self.max_model_len] * len(seq_lens)
        return seq_lens

    def submit(self, out: SchedulerOutput) -> _Launched:
        """Launch a step; its tokens are read by `result()` of what this returns. A greedy
        batch on CUDA leaves its tokens on the device (for the next step's placeholders)
        with a non-blocking copy to the host under way."""
        self._apply_changes(out)
        if out.is_empty:
            self._last = None
            return _Launched(_Sampled({}, None, result=StepResult()))
        b = self.host_batch(out.scheduled)
        hidden = self._hidden(b)
        logits = self.model.compute_logits(hidden, self._tensor(b.logits_rows, torch.int64))
        sampled = self._sample(out, b, logits)
        self._last = sampled
        return _Launched(sampled)

    def _sample(self, out: SchedulerOutput, b: HostBatch, logits: torch.Tensor | None) -> _Sampled:
        rows = {rid: i for i, (rid, _) in enumerate(b.sample_rows)}
        if not b.sample_rows or logits is None:  # None: a tensor-parallel rank other than 0
            return _Sampled(rows, None, result=StepResult())
        drafts = {s.request_id: s.spec_token_ids for s in out.scheduled if s.spec_token_ids}
        if drafts:
            result = StepResult()
            result.tokens, result.logprobs = spec_verify.sample_with_drafts(self.sampler, logits, b.sample_rows, drafts)
            return _Sampled(rows, None, result=result)  # speculation never overlaps (overlap.py)
        device_only = all(
            r.params.greedy and r.params.logprobs is None and r.bitmask is None for _, r in b.sample_rows
        )
        if device_only and self.device.type == "cuda":
            tokens = logits.argmax(dim=-1)
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            return _Sampled(rows, tokens, host=host, event=event, sample_rows=b.sample_rows)
        result = StepResult()
        sampled = self.sampler(logits, [row for _, row in b.sample_rows])
        for (rid, _), (token, lp) in zip(b.sample_rows, sampled, strict=True):
            result.tokens[rid] = [token]
            if lp is not None:
                result.logprobs[rid] = [lp]
        device = self._tensor([token for token, _ in sampled], torch.int64)
        return _Sampled(rows, device, result=result)

    def execute(self, out: SchedulerOutput) -> StepResult:
        """Run a step and wait for its tokens on the host."""
        return self.submit(out).result()
