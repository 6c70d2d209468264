"""Drafts from a model: a smaller model of the same tokenizer (`method: draft_model`), or
the target's own first L layers with its final norm and LM head (`method: layer_skip`, a
self-draft for a model with no smaller sibling, as in LayerSkip's early exit).

The draft runs in the engine process, through its own `ModelRunner`, on its own paged KV
pool. That pool is indexed by the target's block ids (so the draft's blocks are the
target's: the memory plan gives every block room for both, `draft_kv_bytes_per_token`),
plus SCRATCH blocks per running request for the positions the target has not allocated
yet (the last sampled token and the drafts; recomputed once the target's block exists).

Each `propose`: every decoding request's draft KV catches up with its tokens (its whole
prompt the first time, afterwards the tokens accepted since), then the draft extends it
greedily by n tokens, one batched step per token. Drafts are one-hot (greedy), so the
target's rejection sampling keeps its output distribution exact; the draft's quality only
decides the speed. What the draft computed stays valid while the request's tokens and
block ids still agree with it: a rollback of rejected drafts, a recompute or a swap that
moved its blocks make the draft recompute from the first position that differs.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from llmservice.server.config import ConfigError, EngineConfig
from llmservice.server.engine.runner import ModelRunner
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.spec_config import SpeculativeConfig, parse_speculative_config
from llmservice.server.engine.step import ScheduledRequest, SchedulerOutput
from llmservice.server.model.llama import LlamaModel

if TYPE_CHECKING:
    from llmservice.server.engine.block_manager import BlockManager
    from llmservice.server.engine.request import Request

log = logging.getLogger("llmservice.engine")

_GREEDY = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)


@dataclass
class DraftState:
    """What the draft pool holds for a request: the KV of `tokens` at positions 0..,
    in the target's blocks `block_ids` (a prefix of its table)."""

    tokens: list[int]
    block_ids: list[int]


def valid_prefix(state: DraftState | None, tokens: list[int], block_ids: list[int]) -> int:
    """Pure: how many leading positions of the draft's KV are still right: its tokens
    agree with the request's, and the blocks they sit in are still the request's."""
    if state is None or state.block_ids != block_ids[: len(state.block_ids)]:
        return 0
    n = 0
    for ours, theirs in zip(state.tokens, tokens, strict=False):
        if ours != theirs:
            break
        n += 1
    return n


def scratch_blocks_per_request(num_speculative_tokens: int, block_size: int) -> int:
    """Blocks past the target's table a request may need: its last sampled token and the
    drafts (k positions at most) may start a block the target has not allocated."""
    return -(-(num_speculative_tokens + 1) // block_size) + 1


def layer_skip_model(target: LlamaModel, num_layers: int) -> LlamaModel:
    """The target's first `num_layers` layers, final norm and LM head: shared weights, no copy."""
    if num_layers >= target.config.num_layers:
        raise ConfigError(
            f"--speculative-config: layer_skip num_layers {num_layers} must be below the "
            f"target's {target.config.num_layers} layers"
        )
    draft = copy.copy(target)
    draft.config = replace(target.config, num_layers=num_layers)
    draft.layers = target.layers[:num_layers]
    return draft


def load_draft_model(spec: SpeculativeConfig, target: LlamaModel, max_model_len: int) -> LlamaModel:
    """The draft of `method: draft_model`, on the target's device and dtype; it must share
    the target's vocabulary (the drafts are the target's token ids)."""
    from llmservice.server.model.loader import load_model

    assert spec.model is not None
    loaded = load_model(spec.model, target.dtype if target.device.type != "cpu" else torch.float32,
                        device=target.device)  # fmt: skip
    if loaded.config.vocab_size != target.config.vocab_size:
        raise ConfigError(
            f"--speculative-config: the draft model {spec.model!r} has a vocabulary of "
            f"{loaded.config.vocab_size} tokens, the target {target.config.vocab_size}; the "
            "draft must share the target's tokenizer"
        )
    return LlamaModel(loaded.config, loaded.weights, target.device, target.dtype, max_model_len, consume=True)


def draft_kv_bytes_per_token(config: EngineConfig, target: LlamaModel) -> int:
    """KV bytes per token the draft adds to every block (0 without a model draft)."""
    spec = parse_speculative_config(config.speculative_config)
    element = torch.tensor([], dtype=target.dtype).element_size()
    if spec is None or spec.method == "ngram":
        return 0
    if spec.method == "layer_skip":
        assert spec.num_layers is not None
        return target.kv_bytes_per_token(element) * spec.num_layers // target.config.num_layers
    from llmservice.server.model.loader import read_model_info

    _, draft, _ = read_model_info(spec.model)
    return draft.kv_bytes_per_token(element)


def draft_weight_bytes(config: EngineConfig, target: LlamaModel) -> int:
    """Weights a `draft_model` draft adds beside the target (a layer_skip draft shares the
    target's), estimated from its shape at the target's dtype before it is loaded."""
    spec = parse_speculative_config(config.speculative_config)
    if spec is None or spec.method != "draft_model":
        return 0
    from llmservice.server.model.loader import read_model_info

    _, draft, _ = read_model_info(spec.model)
    return draft.num_params * torch.tensor([], dtype=target.dtype).element_size()


class DraftModelProposer:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, max_num_seqs: int, k: int):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.scratch_per_request = scratch_blocks_per_request(k, block_size)
        num_scratch = max_num_seqs * self.scratch_per_request
        self.runner = ModelRunner(model, num_blocks + num_scratch, block_size)
        self.states: dict[str, DraftState] = {}
        self.finished: set[str] = set()  # to tell the draft's runner with the next step

    def forget(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            if self.states.pop(rid, None) is not None:
                self.finished.add(rid)

    def _step(self, scheduled: list[ScheduledRequest]) -> dict[str, int]:
        out = SchedulerOutput(scheduled=scheduled, finished_request_ids=sorted(self.finished))
        self.finished.clear()
        out.new_requests = {
            s.request_id: _GREEDY for s in scheduled if s.request_id not in self.runner.requests
        }
        result = self.runner.execute(out)
        return {rid: tokens[-1] for rid, tokens in result.tokens.items()}

    def propose(self, wanted: list[tuple[Request, int]], bm: BlockManager) -> dict[str, list[int]]:
        """Up to n greedy draft tokens for each (request, n)."""
        bs = self.block_size
        tables: dict[str, list[int]] = {}
        first: list[ScheduledRequest] = []
        for slot, (req, n) in enumerate(wanted):
            rid, tokens = req.request_id, req.all_token_ids
            blocks = bm.block_ids(rid)
            start = min(valid_prefix(self.states.get(rid), tokens, blocks), len(tokens) - 1)
            need = -(-(len(tokens) + n - 1) // bs)
            scratch = self.num_blocks + slot * self.scratch_per_request
            tables[rid] = blocks + list(range(scratch, scratch + max(0, need - len(blocks))))
            first.append(ScheduledRequest(rid, tokens[start:], start, 0, tables[rid], sample=True))
        drafts = {rid: [tok] for rid, tok in self._step(first).items()}
        for i in range(1, max((n for _, n in wanted), default=0)):
            step = [
                ScheduledRequest(req.request_id, [drafts[req.request_id][-1]], req.num_tokens + i - 1,
                                 0, tables[req.request_id], sample=True)
                for req, n in wanted if n > i
            ]  # fmt: skip
            for rid, tok in self._step(step).items():
                drafts[rid].append(tok)
        for req, _ in wanted:  # remember what the pool holds in the target's own blocks
            rid = req.request_id
            blocks = bm.block_ids(rid)
            computed = (req.all_token_ids + drafts[rid][:-1])[: len(blocks) * bs]
            self.states[rid] = DraftState(computed, blocks[: -(-len(computed) // bs)])
        return drafts


def make_draft_proposer(
    spec: SpeculativeConfig, config: EngineConfig, target: object, num_blocks: int, max_model_len: int
) -> DraftModelProposer:
    """The proposer of a model-based method, for a target LlamaModel in this process."""
    if not isinstance(target, LlamaModel):
        raise ConfigError(
            f"--speculative-config method {spec.method!r} needs the target model in the engine "
            "process: it is not available with --tensor-parallel-size > 1 (use ngram)"
        )
    if spec.method == "layer_skip":
        assert spec.num_layers is not None
        draft = layer_skip_model(target, spec.num_layers)
    else:
        draft = load_draft_model(spec, target, max_model_len)
    log.info("speculative decoding: %s draft of %d layers, %d tokens per step", spec.method,
             draft.config.num_layers, spec.num_speculative_tokens)  # fmt: skip
    return DraftModelProposer(
        draft, num_blocks, config.block_size, config.max_num_seqs, spec.num_speculative_tokens
    )
