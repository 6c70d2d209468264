"""Turns a scheduler decision into tensors, runs the model, samples. Makes no policy.

Layout of a step's flat batch: decodes (one new token) first, then prefill chunks, as
`AttentionMetadata` describes; logits are computed only for requests whose computed
tokens catch up with their total this step (a partial prefill chunk samples nothing).
"""

from __future__ import annotations

import torch
from llmservice.kernels.metadata import AttentionMetadata
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.request import Request, TokenLogprob
from llmservice.server.engine.sampler import Sampler
from llmservice.server.engine.scheduler import SchedulerOutput
from llmservice.server.model.llama import LlamaModel


def allocate_kv_caches(model: LlamaModel, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = model.config
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    # zeros, not empty: padded block-table rows read block 0, and masked garbage must stay finite
    return [
        (torch.zeros(shape, dtype=model.dtype, device=model.device), torch.zeros(shape, dtype=model.dtype, device=model.device))
        for _ in range(cfg.num_layers)
    ]


class ModelRunner:
    def __init__(self, model: LlamaModel, block_manager: BlockManager, seed: int = 0):
        self.model = model
        self.bm = block_manager
        self.block_size = block_manager.block_size
        self.kv_caches = allocate_kv_caches(model, block_manager.num_blocks, self.block_size)
        self.sampler = Sampler(seed)
        self.device = model.device

    def prepare(self, scheduled: list[tuple[Request, int]]):
        bs = self.block_size
        order = sorted(scheduled, key=lambda item: item[1] != 1)  # decodes first, stable
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        logits_rows: list[int] = []
        sample_reqs: list[Request] = []
        for req, n in order:
            start = req.num_computed_tokens
            end = start + n
            blocks = self.bm.block_ids(req.request_id)
            input_ids.extend(req.all_token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, end))
            query_lens.append(n)
            seq_lens.append(end)
            tables.append(blocks)
            if end == req.num_tokens:
                logits_rows.append(len(input_ids) - 1)
                sample_reqs.append(req)
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
        return ids, pos, meta, rows, sample_reqs

    def execute(self, out: SchedulerOutput) -> tuple[dict[str, int], dict[str, TokenLogprob]]:
        ids, pos, meta, rows, sample_reqs = self.prepare(out.scheduled)
        logits = self.model.forward(ids, pos, meta, self.kv_caches, rows)
        tokens: dict[str, int] = {}
        logprobs: dict[str, TokenLogprob] = {}
        if sample_reqs:
            for req, (token, lp) in zip(sample_reqs, self.sampler(logits, sample_reqs), strict=True):
                tokens[req.request_id] = token
                if lp is not None:
                    logprobs[req.request_id] = lp
        return tokens, logprobs
