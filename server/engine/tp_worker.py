"""One tensor-parallel rank: a spawned process that holds its shard of the model and KV
cache and runs every step the engine sends it.

The scheduler stays in the engine process (`tp_executor.py`). Each step arrives here as
the pickled plain-data `SchedulerOutput`; every rank applies the same swaps and runs the
same forward (the layers' collectives keep them in lockstep); rank 0 alone samples and
answers. gloo on CPU, NCCL on CUDA: the code is the same, only the backend differs.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from llmservice.kernels.swap import copy_blocks, kv_pools
from llmservice.server.config import EngineConfig
from llmservice.server.engine import memory, startup
from llmservice.server.engine.runner import ModelRunner, StepResult
from llmservice.server.engine.step import SchedulerOutput
from llmservice.server.engine.swap_space import PreemptionCosts
from llmservice.server.model.llama import LlamaModel
from llmservice.server.model.loader import weight_source
from llmservice.server.model.parallel import World

log = logging.getLogger("llmservice.tp")

HEARTBEAT_S = 0.25  # each rank stamps its slot this often, from a thread of its own
COLLECTIVE_TIMEOUT_S = 60  # a peer gone mid-collective ends the rest (the engine acts sooner)
SHUTDOWN = b""  # an empty message: leave the loop


@dataclass
class RankReady:
    """What a rank tells the engine once its shard and KV pools are in place."""

    rank: int
    plan: memory.MemoryPlan
    num_swap_blocks: int
    load_seconds: float
    costs: PreemptionCosts | None = None


@dataclass
class RankFailed:
    rank: int
    message: str


@dataclass
class StepReply:
    """Rank 0's answer to one step, with its timestamps (time.monotonic, which every
    process of a host shares) so the engine can tell message passing from compute."""

    result: StepResult
    received_at: float
    done_at: float
    timings: dict[str, float] = field(default_factory=dict)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    device = startup.resolve_device(config.device)
    if device.type == "cuda":
        return torch.device("cuda", rank)
    return device


def _heartbeat(beats: Any, rank: int) -> None:
    while True:
        beats[rank] = time.monotonic()
        time.sleep(HEARTBEAT_S)


def _agree_on_blocks(num_blocks: int, device: torch.device) -> int:
    """The smallest pool of any rank, so every rank holds the same block ids."""
    t = torch.tensor([num_blocks], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def build_rank(
    config: EngineConfig, world: World, device: torch.device
) -> tuple[ModelRunner, RankReady, list]:
    """Load this rank's shard, plan its KV cache (same block count everywhere), allocate
    the pools and, for `auto` preemption, time both modes (all ranks together)."""
    t0 = time.perf_counter()
    dtype = startup.resolve_dtype(config.dtype, device)
    _, model_config, _, source = weight_source(
        config.model, dtype, config.load_format, device, cpu_weights=config.cpu_weights
    )
    config = config.resolve_lengths(model_config.max_position_embeddings)
    model = LlamaModel(model_config, source, device, dtype, int(config.max_model_len), world=world)
    load_seconds = time.perf_counter() - t0
    plan = startup.plan_memory(config, model)
    agreed = _agree_on_blocks(plan.num_blocks, device)
    if agreed != plan.num_blocks:
        plan.budget_source += f", lowered to the smallest rank's {agreed} blocks"
        plan.num_blocks = agreed
    log.info(
        "tensor-parallel rank %d/%d (pid %d): %d of %d query heads, %d of %d KV heads, %s",
        world.rank, world.size, os.getpid(), model.num_heads, model_config.num_heads, model.num_kv_heads,
        model_config.num_kv_heads, plan.describe(),
    )  # fmt: skip
    runner = ModelRunner(model, plan.num_blocks, config.block_size, config.seed,
                         kv_cache_dtype=config.kv_cache_dtype)
    swap_space, swap_pools = startup.allocate_swap_space(
        config, runner.kv_caches, plan.kv_bytes_per_token
    )
    costs = startup.measure_preemption_costs(  # every rank runs it: the prefill is collective
        config, model, runner.kv_caches, swap_pools, plan.num_blocks,
        swap_space.num_blocks, plan.kv_bytes_per_token,
    )  # fmt: skip
    return (
        runner,
        RankReady(world.rank, plan, swap_space.num_blocks, load_seconds, costs),
        swap_pools,
    )


def do_swaps(runner: ModelRunner, swap_pools: list, sched: SchedulerOutput) -> None:
    """This rank's share of the step's swaps (its KV heads' blocks)."""
    if not swap_pools:
        return
    device_pools = kv_pools(runner.kv_caches)
    if sched.swap_out:
        src, dst = zip(*sched.swap_out, strict=True)
        copy_blocks(device_pools, swap_pools, list(src), list(dst)).wait()
    if sched.swap_in:
        src, dst = zip(*sched.swap_in, strict=True)
        copy_blocks(swap_pools, device_pools, list(src), list(dst)).wait()


def run_worker(
    rank: int,
    size: int,
    config: EngineConfig,
    init_method: str,
    conn: Any,
    beats: Any,
    log_level: int,
) -> None:
    """Process entry point (spawned): rendezvous, build, then serve steps until told to stop."""
    logging.basicConfig(level=log_level, format=f"%(levelname)s %(name)s[rank {rank}]: %(message)s")
    threading.Thread(
        target=_heartbeat, args=(beats, rank), name="tp-heartbeat", daemon=True
    ).start()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    device = rank_device(config, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(
            backend_for(device), init_method=init_method, rank=rank, world_size=size,
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )  # fmt: skip
        runner, ready, swap_pools = build_rank(config, World(rank, size), device)
    except Exception as exc:
        log.exception("rank %d failed to start", rank)
        conn.send(RankFailed(rank, f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    conn.send(ready)
    serve_steps(runner, swap_pools, conn, rank)
    dist.destroy_process_group()


def serve_steps(runner: ModelRunner, swap_pools: list, conn: Any, rank: int) -> None:
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):  # the engine is gone: so are we
            os._exit(0)
        if payload == SHUTDOWN:
            return
        received = time.monotonic()
        sched: SchedulerOutput = pickle.loads(payload)
        try:
            do_swaps(runner, swap_pools, sched)
            result = runner.execute(sched)
        except Exception as exc:
            log.exception("rank %d: step failed", rank)
            conn.send_bytes(
                pickle.dumps(RankFailed(rank, f"step failed: {type(exc).__name__}: {exc}"))
            )
            os._exit(1)
        if rank == 0:
            conn.send_bytes(
                pickle.dumps(StepReply(result, received, time.monotonic()), pickle.HIGHEST_PROTOCOL)
            )
