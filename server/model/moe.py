"""A mixture-of-experts MLP block (Mixtral, Qwen2-MoE, Qwen3-MoE) over the weight seam.

Every expert stays resident: each layer holds its experts stacked as two tensors,
w13 [E, 2I, H] (each expert's gate rows then up rows, the dense gate_up layout) and
w2 [E, H, I], so one kernel call (kernels/ops.fused_moe) runs all the experts a step's
tokens chose. Tensor parallelism splits every expert's intermediate columns over the
ranks (as vLLM does): each rank computes a partial of every routed token's output, and
one all-reduce per layer sums them, the shared expert's partial included.

The router is replicated: each rank routes the same hidden states to the same experts.
Routing follows transformers: softmax over all experts in fp32, the top k, then (Mixtral
always, Qwen only with norm_topk_prob) the k weights renormalised to sum to 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from llmservice.kernels import ops
from llmservice.server.model.config import ModelConfig
from llmservice.server.model.parallel import World, even_shard
from llmservice.server.model.parallel_weights import LinearWeight, Part, Shard, WeightSource


@dataclass(frozen=True)
class ExpertNames:
    """Where a family's checkpoint keeps one layer's MoE tensors (under `model.layers.N.`)."""

    router: str
    expert: str  # formatted with the expert's index
    gate: str
    up: str
    down: str
    shared: str | None = None  # the shared expert's module, its gate `<shared>_gate`


MIXTRAL = ExpertNames("block_sparse_moe.gate", "block_sparse_moe.experts.{}.", "w1", "w3", "w2")
QWEN_MOE = ExpertNames("mlp.gate", "mlp.experts.{}.", "gate_proj", "up_proj", "down_proj")
QWEN2_MOE = ExpertNames(
    "mlp.gate", "mlp.experts.{}.", "gate_proj", "up_proj", "down_proj", shared="mlp.shared_expert"
)
NAMES = {"mixtral": MIXTRAL, "qwen2_moe": QWEN2_MOE, "qwen3_moe": QWEN_MOE}


def route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] fp32, expert ids [T, k]) of each token's top-k experts."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def expert_shard(config: ModelConfig, world: World) -> Shard:
    return even_shard(config.moe_intermediate_size, world, "moe_intermediate_size")


class MoEBlock:
    """One layer's router, experts and optional shared expert; see the module docstring."""

    def __init__(self, src: WeightSource, prefix: str, config: ModelConfig, world: World):
        names = NAMES[config.architecture]
        self.world = world
        self.top_k = config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.router = src.get(prefix + names.router + ".weight")
        self.w13, self.w2 = _stacked_experts(src, prefix, names, config, expert_shard(config, world))
        self.shared_gate_up: LinearWeight | None = None
        self.shared_down: LinearWeight | None = None
        self.shared_gate: torch.Tensor | None = None
        if names.shared and config.shared_expert_intermediate_size:
            s = prefix + names.shared + "."
            cols = even_shard(config.shared_expert_intermediate_size, world, "shared_expert_intermediate_size")
            self.shared_gate_up = src.linear([Part(s + "gate_proj.weight", 0, cols), Part(s + "up_proj.weight", 0, cols)])
            self.shared_down = src.linear([Part(s + "down_proj.weight", 1, cols)])
            self.shared_gate = src.get(prefix + names.shared + "_gate.weight")

    @property
    def nbytes(self) -> int:
        tensors = [self.router, self.w13, self.w2] + ([self.shared_gate] if self.shared_gate is not None else [])
        total = sum(t.numel() * t.element_size() for t in tensors)
        if self.shared_gate_up is not None and self.shared_down is not None:
            total += self.shared_gate_up.nbytes + self.shared_down.nbytes
        return total

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(F.linear(x, self.router), self.top_k, self.renormalize)
        out = ops.fused_moe(x, self.w13, self.w2, weights, ids)
        if self.shared_gate_up is not None and self.shared_down is not None:
            shared = self.shared_down.matmul(ops.silu_and_mul(self.shared_gate_up.matmul(x)))
            out = out + torch.sigmoid(F.linear(x, self.shared_gate)) * shared
        return self.world.all_reduce(out)


def _stacked_experts(
    src: WeightSource, prefix: str, names: ExpertNames, config: ModelConfig, cols: Shard
) -> tuple[torch.Tensor, torch.Tensor]:
    """w13 [E, 2I, H] and w2 [E, H, I] of this rank's columns, filled one expert at a
    time (peak memory: the stack plus one expert's tensors)."""
    num_experts, hidden, n = config.num_experts, config.hidden_size, cols.length
    w13 = torch.empty(num_experts, 2 * n, hidden, dtype=src.dtype, device=src.device)
    w2 = torch.empty(num_experts, hidden, n, dtype=src.dtype, device=src.device)
    for e in range(num_experts):
        p = prefix + names.expert.format(e)
        w13[e, :n].copy_(src.get(p + names.gate + ".weight", 0, cols))
        w13[e, n:].copy_(src.get(p + names.up + ".weight", 0, cols))
        w2[e].copy_(src.get(p + names.down + ".weight", 1, cols))
    return w13, w2


def moe_rank_weight_elements(config: ModelConfig, world: World) -> int:
    """Elements one MoE layer's block holds on rank `world.rank` (what MoEBlock.nbytes
    counts, from the shape alone)."""
    h = config.hidden_size
    n = expert_shard(config, world).length
    total = config.num_experts * h + config.num_experts * 3 * h * n
    if config.shared_expert_intermediate_size:
        shared = even_shard(config.shared_expert_intermediate_size, world, "shared_expert_intermediate_size")
        total += 3 * h * shared.length + h
    return total
