"""Will the model fit the GPU with the margin we promise? Pure arithmetic, no I/O.

Per GPU the engine needs: its share of the weights, an activation reserve (vLLM profiles
the peak of one `max_num_batched_tokens` step; we estimate it), and KV cache for at least
one sequence of `max_model_len` tokens. All of it must fit inside
`memoryGiB x gpuMemoryUtilization`; the rest (5-10%) stays free for fragmentation and
allocator spikes. If one max-length sequence cannot fit, the operator refuses to roll out
and says what would fit instead: the longest `maxModelLen` on these GPUs, and the
smallest tensor-parallel size that fits the requested length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from llmservice.operator.catalog import CATALOG, Architecture, lookup
from llmservice.operator.spec import LLMServiceSpec
from llmservice.server.config import CPU_KV_CACHE_GIB

if TYPE_CHECKING:
    from llmservice.operator.hub_shape import FoundShape

GIB = 1024**3
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
FIXED_OVERHEAD_GIB = 1.0  # CUDA context, cuBLAS workspaces, CUDA graphs
TENSOR_PARALLEL_OVERHEAD_GIB = 0.5  # NCCL buffers when TP > 1


def dtype_bytes(dtype: str, on_gpu: bool) -> int:
    """Bytes per weight/KV element: `auto` is bf16 on GPUs and fp32 on CPUs (as the server)."""
    if dtype == "float32" or (dtype == "auto" and not on_gpu):
        return 4
    return 2


@dataclass(frozen=True)
class Shape:
    """Everything the arithmetic needs, flattened from the spec."""

    architecture: Architecture
    dtype_bytes: int
    tensor_parallel_size: int
    gpu_memory_gib: float
    utilization: float
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    pipeline_parallel_size: int = 1  # stages hold 1/PP of the layers each (vLLM)
    lora_slots: int = 0  # engine.maxLoras with spec.adapters (0: no LoRA slot pool)
    lora_rank: int = 0  # engine.maxLoraRank, the slots' padded rank


@dataclass(frozen=True)
class MemoryPlan:
    budget_gib_per_gpu: float
    weights_gib_per_gpu: float
    activation_reserve_gib_per_gpu: float
    kv_cache_gib_per_gpu: float
    kv_bytes_per_token: int  # whole model, all layers, K and V
    kv_bytes_per_token_per_gpu: int
    block_size: int
    estimated_kv_blocks: int
    estimated_max_concurrent_sequences: int  # sequences of max_model_len tokens at once
    gpu_memory_utilization: float
    shape_source: str = "catalog"  # spec.model.architecture | catalog:NAME | hub:REPO@COMMIT
    lora_slots_gib_per_gpu: float = 0.0  # the LoRA device slot pool (spec.adapters)

    def as_status(self) -> dict[str, float | int | str]:
        lora = {"loraSlotsGiBPerGPU": round(self.lora_slots_gib_per_gpu, 3)} if self.lora_slots_gib_per_gpu else {}
        return {
            "budgetGiBPerGPU": round(self.budget_gib_per_gpu, 2),
            "weightsGiBPerGPU": round(self.weights_gib_per_gpu, 2),
            "activationReserveGiBPerGPU": round(self.activation_reserve_gib_per_gpu, 2),
            "kvCacheGiBPerGPU": round(self.kv_cache_gib_per_gpu, 2),
            "kvBytesPerToken": self.kv_bytes_per_token,
            "kvBytesPerTokenPerGPU": self.kv_bytes_per_token_per_gpu,
            "blockSize": self.block_size,
            "estimatedKVBlocks": self.estimated_kv_blocks,
            "estimatedMaxConcurrentSequences": self.estimated_max_concurrent_sequences,
            "gpuMemoryUtilization": self.gpu_memory_utilization,
            "shapeSource": self.shape_source,
            **lora,
        }


@dataclass(frozen=True)
class FitResult:
    status: str  # "True" | "False" | "Unknown", as the condition wants it
    reason: str
    message: str
    plan: MemoryPlan | None = None
    largest_max_model_len: int | None = None
    smallest_tensor_parallel_size: int | None = None

    @property
    def refuses_rollout(self) -> bool:
        return self.status == "False"


def kv_heads_per_gpu(arch: Architecture, tp: int) -> int:
    """KV heads each rank holds; with TP > KV heads they are replicated, not split."""
    return max(1, math.ceil(arch.num_key_value_heads / tp))


def lora_projection_shapes(arch: Architecture) -> dict[str, tuple[int, int]]:
    """(in, out) of the seven LoRA-servable projections (server/lora/fit.py)."""
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    return {
        "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
        "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
    }  # fmt: skip


ROW_PARALLEL = ("o_proj", "down_proj")  # their input is split across ranks, the others' output


def lora_pool_bytes(arch: Architecture, slots: int, rank: int, nbytes: int, tp: int = 1, layers: int | None = None) -> int:
    """The device slot pool the engine allocates before its memory plan
    (server/lora/weights.py): per layer and projection, A [slots, rank, in] and
    B [slots, out, rank]. With TP (vLLM) a rank holds the split side's 1/TP share."""
    per_slot = 0
    for module, (fan_in, fan_out) in lora_projection_shapes(arch).items():
        if module in ROW_PARALLEL:
            per_slot += rank * math.ceil(fan_in / tp) + fan_out * rank
        else:
            per_slot += rank * fan_in + math.ceil(fan_out / tp) * rank
    return slots * per_slot * (arch.num_layers if layers is None else layers) * nbytes


def plan_memory(shape: Shape) -> MemoryPlan:
    """Weights, activation reserve and KV cache per GPU for one configuration. With
    pipeline parallelism each GPU holds 1/(TP x PP) of the weights and the KV cache of
    its stage's layers (ceil(layers / PP)) for its 1/TP share of the KV heads."""
    arch, tp, nbytes = shape.architecture, shape.tensor_parallel_size, shape.dtype_bytes
    pp = max(1, shape.pipeline_parallel_size)
    budget = shape.gpu_memory_gib * shape.utilization * GIB
    weights = arch.parameters * nbytes / (tp * pp)
    kv_per_token = 2 * arch.num_layers * arch.num_key_value_heads * arch.head_dim * nbytes
    stage_layers = math.ceil(arch.num_layers / pp)
    kv_per_token_gpu = 2 * stage_layers * kv_heads_per_gpu(arch, tp) * arch.head_dim * nbytes
    reserve = activation_reserve_bytes(shape)
    lora = lora_pool_bytes(arch, shape.lora_slots, shape.lora_rank, nbytes, tp, stage_layers)
    kv_cache = max(0.0, budget - weights - reserve - lora)
    blocks = int(kv_cache // (kv_per_token_gpu * shape.block_size))
    return MemoryPlan(
        budget_gib_per_gpu=budget / GIB,
        weights_gib_per_gpu=weights / GIB,
        activation_reserve_gib_per_gpu=reserve / GIB,
        kv_cache_gib_per_gpu=kv_cache / GIB,
        kv_bytes_per_token=kv_per_token,
        kv_bytes_per_token_per_gpu=kv_per_token_gpu,
        block_size=shape.block_size,
        estimated_kv_blocks=blocks,
        estimated_max_concurrent_sequences=blocks * shape.block_size // shape.max_model_len,
        gpu_memory_utilization=shape.utilization,
        lora_slots_gib_per_gpu=lora / GIB,
    )


def activation_reserve_bytes(shape: Shape) -> float:
    """Peak of one profiling step: hidden states, MLP intermediates, logits, fixed overhead."""
    arch, tp = shape.architecture, shape.tensor_parallel_size
    qkv = (arch.num_attention_heads + 2 * arch.num_key_value_heads) * arch.head_dim
    per_token = shape.dtype_bytes * (
        mlp_activation_elements(arch, tp) + 4 * arch.hidden_size + qkv / tp
    )
    if arch.num_moe_layers:
        per_token += 4 * arch.num_experts  # the router's fp32 probabilities
    logits = min(shape.max_num_seqs, shape.max_num_batched_tokens) * arch.vocab_size * 4
    fixed = FIXED_OVERHEAD_GIB + (TENSOR_PARALLEL_OVERHEAD_GIB if tp > 1 else 0.0)
    return shape.max_num_batched_tokens * per_token + logits + fixed * GIB


def mlp_activation_elements(arch: Architecture, tp: int) -> float:
    """Elements per token of the widest MLP step. Dense: gate and up, 2 x FFN / TP. MoE:
    a prefill materialises each (token, k) pair, so gate and up of k experts (and of the
    shared expert), plus the token's k copies of its hidden state into the experts and
    their k outputs before the weighted sum (hidden-wide, not split by TP). A model with
    dense layers and MoE layers peaks at the larger of the two."""
    if not arch.num_moe_layers:
        return 2 * arch.intermediate_size * arch.num_experts_per_token / tp
    k = arch.num_experts_per_token
    experts = 2 * (arch.intermediate_size * k + arch.shared_expert_intermediate_size) / tp
    dense = 2 * arch.dense_mlp_size / tp if arch.num_dense_layers else 0.0
    return max(dense, experts + 2 * k * arch.hidden_size)


def sequence_fits(plan: MemoryPlan, max_model_len: int) -> bool:
    blocks_needed = math.ceil(max_model_len / plan.block_size)
    return plan.estimated_kv_blocks >= blocks_needed


def largest_max_model_len(plan: MemoryPlan) -> int:
    """The longest sequence the KV cache could hold, a whole number of blocks."""
    return plan.estimated_kv_blocks * plan.block_size


def smallest_tensor_parallel_size(shape: Shape) -> int | None:
    """The fewest GPUs (a valid TP size: divides the attention heads) that fit the request."""
    for tp in TENSOR_PARALLEL_SIZES:
        if shape.architecture.num_attention_heads % tp:
            continue
        candidate = Shape(**{**shape.__dict__, "tensor_parallel_size": tp})
        if sequence_fits(plan_memory(candidate), shape.max_model_len):
            return tp
    return None


def resolve_architecture(spec: LLMServiceSpec) -> Architecture | None:
    """The user's architecture, else the catalog entry named or implied by the source."""
    found = resolve_shape(spec)
    return found[0] if found else None


def resolve_shape(spec: LLMServiceSpec) -> tuple[Architecture, str] | None:
    """The architecture the spec or the catalog gives, and where it came from."""
    model = spec.model
    if model.architecture is not None:
        return model.architecture, "spec.model.architecture"
    if model.catalog_name and model.catalog_name in CATALOG:
        return CATALOG[model.catalog_name].architecture, f"catalog:{model.catalog_name}"
    entry = lookup(model.source)
    return (entry.architecture, f"catalog:{entry.name}") if entry else None


def shape_unknown(spec: LLMServiceSpec, hub: FoundShape | None) -> FitResult:
    """VRAMFit=Unknown: no shape from the spec, the catalog or the Hub (the pods still
    roll out; the server itself says at start whether the model loads)."""
    if hub is not None and hub.problem:
        return FitResult(
            "Unknown",
            "ShapeUnavailable",
            f"cannot read the shape of {spec.model.source!r} from the Hub: {hub.problem}; "
            "rolling out without a VRAM check (set spec.model.catalogName or "
            "spec.model.architecture to check without the Hub)",
        )
    return FitResult(
        "Unknown",
        "ArchitectureUnknown",
        f"the operator does not know the shape of {spec.model.source!r}; set "
        "spec.model.catalogName or spec.model.architecture to get a VRAM check",
    )


def check_fit(
    spec: LLMServiceSpec, max_utilization: float = 0.95, hub: FoundShape | None = None
) -> FitResult:
    """Decide VRAMFit for a spec; `max_utilization` is the operator-wide ceiling. `hub` is
    what the Hub said about an `hf://` model the spec and the catalog do not know."""
    known = resolve_shape(spec)
    if known is None and hub is not None and hub.architecture is not None:
        known = hub.architecture, hub.source
    if known is None:
        return shape_unknown(spec, hub)
    result = _check_known(spec, known[0], max_utilization)
    if result.plan is None:
        return result
    return replace(result, plan=replace(result.plan, shape_source=known[1]))


def _check_known(spec: LLMServiceSpec, arch: Architecture, max_utilization: float) -> FitResult:
    engine, gpus = spec.engine, spec.gpus_per_replica
    utilization = min(spec.resources.gpu_memory_utilization, max_utilization)
    on_gpu = gpus > 0
    shape = Shape(
        architecture=arch,
        dtype_bytes=dtype_bytes(engine.dtype, on_gpu),
        tensor_parallel_size=max(1, engine.tensor_parallel_size),
        pipeline_parallel_size=max(1, engine.pipeline_parallel_size),
        gpu_memory_gib=spec.resources.gpu.memory_gib,
        utilization=utilization,
        max_model_len=engine.max_model_len,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs,
        block_size=engine.block_size,
        lora_slots=engine.max_loras if spec.adapters else 0,
        lora_rank=engine.max_lora_rank if spec.adapters else 0,
    )
    if not on_gpu:
        return _cpu_fit(
            shape, engine.kv_cache_memory_gib or CPU_KV_CACHE_GIB, builtin_cpu_weight_bytes(spec)
        )
    plan = plan_memory(shape)
    lora = lora_term(shape, plan)
    experts = experts_term(arch)
    if sequence_fits(plan, shape.max_model_len):
        return FitResult(
            "True",
            "Fits",
            f"weights {plan.weights_gib_per_gpu:.1f} GiB{experts} + activations "
            f"{plan.activation_reserve_gib_per_gpu:.1f} GiB{lora} + KV cache "
            f"{plan.kv_cache_gib_per_gpu:.1f} GiB per GPU within "
            f"{plan.budget_gib_per_gpu:.1f} GiB ({shape.gpu_memory_gib:g} GiB x {utilization:.2f}); "
            f"about {plan.estimated_max_concurrent_sequences} sequences of "
            f"{shape.max_model_len} tokens at once",
            plan=plan,
        )
    longest = largest_max_model_len(plan)
    tp = smallest_tensor_parallel_size(shape)
    need = plan.weights_gib_per_gpu + plan.activation_reserve_gib_per_gpu + plan.lora_slots_gib_per_gpu
    lead = (
        f"one sequence of maxModelLen {shape.max_model_len} does not fit: weights "
        f"{plan.weights_gib_per_gpu:.1f} GiB{experts} + activations "
        f"{plan.activation_reserve_gib_per_gpu:.1f} GiB"
        f"{lora} per GPU leave {max(0.0, plan.budget_gib_per_gpu - need):.1f} GiB of the "
        f"{plan.budget_gib_per_gpu:.1f} GiB budget ({shape.gpu_memory_gib:g} GiB x {utilization:.2f}) "
        f"for KV cache, which needs {plan.kv_bytes_per_token_per_gpu} bytes per token per GPU"
    )
    length_hint = (
        f"largest maxModelLen that fits: {longest}"
        if longest > 0
        else "largest maxModelLen that fits: 0 (the weights alone do not fit)"
    )
    gpu_hint = (
        f"smallest GPU count that fits: {tp} (engine.tensorParallelSize: {tp}, "
        f"resources.gpu.count: {tp})"
        if tp is not None
        else f"no tensor-parallel size up to {TENSOR_PARALLEL_SIZES[-1]} fits on "
        f"{shape.gpu_memory_gib:g} GiB GPUs"
    )
    return FitResult(
        "False",
        "InsufficientVRAM",
        f"{lead}; {length_hint}; {gpu_hint}",
        plan=plan,
        largest_max_model_len=longest,
        smallest_tensor_parallel_size=tp,
    )


def experts_term(arch: Architecture) -> str:
    """A MoE model's weights in a fit message: all experts are resident, not the active
    ones, so the message says so ('' for a dense model)."""
    if not arch.num_moe_layers:
        return ""
    return (
        f" ({arch.parameters / 1e9:.1f} B parameters: all {arch.num_experts} experts of each "
        f"MoE layer resident, {arch.num_experts_per_token} active per token)"
    )


def lora_term(shape: Shape, plan: MemoryPlan) -> str:
    """The LoRA slot pool in a fit message, with the numbers that size it ('' without)."""
    if not shape.lora_slots:
        return ""
    return (
        f" + LoRA slots {plan.lora_slots_gib_per_gpu:.2f} GiB (engine.maxLoras {shape.lora_slots} x "
        f"engine.maxLoraRank {shape.lora_rank}, 7 projections x {shape.architecture.num_layers} layers)"
    )


def builtin_cpu_weight_bytes(spec: LLMServiceSpec) -> int | None:
    """What a builtin GGUF's weights take on a CPU pod (kept packed), when the spec serves
    one; None: dense weights of parameters x dtype bytes."""
    entry = lookup(spec.model.source)
    if entry is None or entry.builtin is None or spec.model.source != f"builtin:{entry.builtin}":
        return None
    return entry.builtin_cpu_weight_bytes


def _cpu_fit(shape: Shape, kv_gib: float, weight_bytes: int | None = None) -> FitResult:
    """No GPU: the server sizes its KV cache from --kv-cache-memory-gib; report that plan.
    With CPU tensor parallelism the budget is per rank, for the rank's share of the KV
    heads and 1/TP of the weights ("per GPU" then reads "per rank"). `weight_bytes`: the
    weights as the server holds them, when not parameters x dtype bytes (packed GGUF)."""
    arch, tp = shape.architecture, shape.tensor_parallel_size
    weight_bytes = weight_bytes or arch.parameters * shape.dtype_bytes
    kv_per_token = 2 * arch.num_layers * arch.num_key_value_heads * arch.head_dim
    kv_per_token *= shape.dtype_bytes
    kv_per_rank = 2 * arch.num_layers * kv_heads_per_gpu(arch, tp) * arch.head_dim
    kv_per_rank *= shape.dtype_bytes
    blocks = int(kv_gib * GIB // (kv_per_rank * shape.block_size))
    plan = MemoryPlan(
        budget_gib_per_gpu=0.0,
        weights_gib_per_gpu=weight_bytes / tp / GIB,
        activation_reserve_gib_per_gpu=0.0,
        kv_cache_gib_per_gpu=kv_gib,
        kv_bytes_per_token=kv_per_token,
        kv_bytes_per_token_per_gpu=kv_per_rank,
        block_size=shape.block_size,
        estimated_kv_blocks=blocks,
        estimated_max_concurrent_sequences=blocks * shape.block_size // shape.max_model_len,
        gpu_memory_utilization=shape.utilization,
    )
    if blocks * shape.block_size < shape.max_model_len:
        return FitResult(
            "False",
            "InsufficientKVCache",
            f"engine.kvCacheMemoryGiB {kv_gib:g} holds {blocks * shape.block_size} tokens, "
            f"less than one sequence of maxModelLen {shape.max_model_len}; largest maxModelLen "
            f"that fits: {blocks * shape.block_size}",
            plan=plan,
            largest_max_model_len=blocks * shape.block_size,
        )
    return FitResult(
        "True",
        "CPUOnly",
        f"no GPU requested; KV cache of {kv_gib:g} GiB holds about "
        f"{plan.estimated_max_concurrent_sequences} sequences of {shape.max_model_len} tokens",
        plan=plan,
    )
