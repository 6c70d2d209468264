"""Turns a plain-data step (`step.SchedulerOutput`) into tensors, runs the model, samples.
Makes no policy, and reads nothing of the scheduler's: it keeps its own copy of each
request's block table and sampling parameters, updated by what each step says changed.

Layout of a step's flat batch: decodes (one new token) first, then prefill chunks, as
`AttentionMetadata` describes; logits are computed only for requests whose step reaches
the end of their known tokens (a partial prefill chunk samples nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.server.engine import spec_verify
from llmservice.server.engine.request import TokenLogprob
from llmservice.server.engine.sampler import Sampler, SampleRow
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.step import ScheduledRequest, SchedulerOutput
from llmservice.server.model.llama import LlamaModel


def allocate_kv_caches(model: LlamaModel, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = model.config
    shape = (num_blocks, block_size, model.num_kv_heads, cfg.head_dim)  # this rank's KV heads
    # zeros, not empty: padded block-table rows read block 0, and masked garbage must stay finite
    return [
        (torch.zeros(shape, dtype=model.dtype, device=model.device), torch.zeros(shape, dtype=model.dtype, device=model.device))
        for _ in range(cfg.num_layers)
    ]


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


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, seed: int = 0):
        self.model = model
        self.block_size = block_size
        self.kv_caches = allocate_kv_caches(model, num_blocks, block_size)
        self.sampler = Sampler(seed)
        self.device = model.device
        self.requests: dict[str, RunnerRequest] = {}

    def _apply_changes(self, out: SchedulerOutput) -> None:
        for rid in out.finished_request_ids:
            self.requests.pop(rid, None)
        for rid, params in out.new_requests.items():
            self.requests[rid] = RunnerRequest(params)
        for s in out.scheduled:
            self.requests[s.request_id].block_ids[s.block_table_start :] = s.new_block_ids

    def prepare(self, scheduled: list[ScheduledRequest]):
        bs = self.block_size
        order = sorted(scheduled, key=lambda s: s.num_tokens != 1)  # decodes first, stable
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        logits_rows: list[int] = []
        sample_rows: list[tuple[str, SampleRow]] = []
        for s in order:
            start, end = s.start_position, s.end_position
            state = self.requests[s.request_id]
            blocks = state.block_ids
            input_ids.extend(s.token_ids)
            input_ids.extend(s.spec_token_ids)  # drafts: verified at k+1 rows (spec_verify.py)
            positions.extend(range(start, end))
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, end))
            query_lens.append(s.num_tokens)
            seq_lens.append(end)
            tables.append(blocks)
            if s.sample:
                logits_rows.extend(range(len(input_ids) - 1 - len(s.spec_token_ids), len(input_ids)))
                sample_rows.append((s.request_id, SampleRow(state.sampling_params, s.output_index, s.grammar_bitmask)))
        width = max(len(t) for t in tables)
        table_tensor = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=table_tensor.to(dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            query_lens=query_lens,
            seq_lens_host=seq_lens,
            num_decodes=sum(1 for q in query_lens if q == 1),
            block_size=bs,
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        rows = torch.tensor(logits_rows, dtype=torch.int64, device=dev)
        return ids, pos, meta, rows, sample_rows

    def execute(self, out: SchedulerOutput) -> StepResult:
        self._apply_changes(out)
        result = StepResult()
        if out.is_empty:
            return result
        ids, pos, meta, rows, sample_rows = self.prepare(out.scheduled)
        logits = self.model.forward(ids, pos, meta, self.kv_caches, rows)
        drafts = {s.request_id: s.spec_token_ids for s in out.scheduled if s.spec_token_ids}
        if drafts and sample_rows and logits is not None:
            result.tokens, result.logprobs = spec_verify.sample_with_drafts(self.sampler, logits, sample_rows, drafts)
            return result
        if sample_rows and logits is not None:  # None: a tensor-parallel rank other than 0
            sampled = self.sampler(logits, [row for _, row in sample_rows])
            for (rid, _), (token, lp) in zip(sample_rows, sampled, strict=True):
                result.tokens[rid] = [token]
                if lp is not None:
                    result.logprobs[rid] = [lp]
        return result
