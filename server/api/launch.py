"""`llmservice serve`: flags (vLLM's names), engine start-up, then uvicorn.

Start-up order: spawn the engine core (it shows a progress bar while the weights load),
read the tokenizer from the model metadata meanwhile, log the memory plan, then start
listening; `/ready` is 200 from the first request on.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

from llmservice.server.config import (
    BLOCK_SIZES,
    DTYPES,
    LOAD_FORMATS,
    PREEMPTION_MODES,
    SCHEDULING_POLICIES,
    ConfigError,
    EngineConfig,
)
from llmservice.server.model.registry import BUILTIN_PREFIX, DEFAULT_MODEL

log = logging.getLogger("llmservice.serve")

DEFAULT_MAX_WAITING = 512


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help="builtin:NAME, a .gguf file or an HF model directory (default %(default)s)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use in `model`; the first is reported (default: the model reference)")
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--load-format", choices=LOAD_FORMATS, default="auto",
                   help="dummy: random weights of the model's shape, for benchmarks (needs only config + tokenizer)")
    p.add_argument("--block-size", type=int, choices=BLOCK_SIZES, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--preemption-mode", choices=PREEMPTION_MODES, default="recompute")
    p.add_argument("--swap-space", type=float, default=4.0, help="GiB of CPU memory for swapped KV blocks")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    p.add_argument("--kv-cache-memory-gib", type=float, default=None,
                   help="explicit KV cache budget (CPU default 1 GiB; on CUDA overrides the profiled plan)")
    p.add_argument("--num-gpu-blocks-override", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs")
    p.add_argument("--max-queue-delay-ms", type=float, default=None,
                   help="a request waiting longer is admitted ahead of policy order")
    p.add_argument("--max-waiting-requests", type=int, default=DEFAULT_MAX_WAITING,
                   help="past this many waiting requests new ones get 503 + Retry-After (0: unbounded)")
    p.add_argument("--shutdown-grace-seconds", type=float, default=30.0,
                   help="on SIGTERM, how long in-flight requests may run before they are aborted")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads of the engine")
    p.add_argument("--download-dir", default=None, help="directory relative model paths are looked up in")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-workers", type=int, default=2, help="threads for tokenization off the event loop")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def resolve_model_ref(model: str, download_dir: str | None) -> str:
    if download_dir and not model.startswith(BUILTIN_PREFIX) and not Path(model).is_absolute():
        candidate = Path(download_dir) / model
        if candidate.exists():
            return str(candidate)
    return model


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    if args.tensor_parallel_size != 1:
        raise ConfigError(
            f"--tensor-parallel-size {args.tensor_parallel_size}: this engine runs on one device; "
            "use 1 (or run vLLM for multi-GPU tensor parallelism)"
        )
    if args.max_waiting_requests < 0:
        raise ConfigError(f"--max-waiting-requests {args.max_waiting_requests} must be >= 0")
    if args.shutdown_grace_seconds < 0:
        raise ConfigError(f"--shutdown-grace-seconds {args.shutdown_grace_seconds} must be >= 0")
    if args.num_threads is not None and args.num_threads < 1:
        raise ConfigError(f"--num-threads {args.num_threads} must be >= 1")
    return EngineConfig(
        model=resolve_model_ref(args.model, args.download_dir),
        served_model_name=args.served_model_name[0] if args.served_model_name else None,
        dtype=args.dtype,
        device=args.device,
        load_format=args.load_format,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill,
        preemption_mode=args.preemption_mode,
        swap_space=args.swap_space,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_gib=args.kv_cache_memory_gib,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        scheduling_policy=args.scheduling_policy,
        max_queue_delay_ms=args.max_queue_delay_ms,
        seed=args.seed,
        num_threads=args.num_threads,
    )


def curl_example(host: str, port: int, model: str) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 32,
    })
    return (
        f"curl http://{shown}:{port}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        f"  -d {shlex.quote(body)}"
    )


def serve(args: argparse.Namespace) -> int:
    from llmservice.server.api.app import create_app
    from llmservice.server.api.engine_client import EngineClient, EngineStartError
    from llmservice.server.api.server import run_server
    from llmservice.server.api.serving import ServerState
    from llmservice.server.api.tokenizer_service import TokenizerService, load_text_tokenizer
    from llmservice.server.metrics import CacheInfo, ServerMetrics

    level = getattr(logging, args.log_level.upper())
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    client = EngineClient(config, log_level=level, show_progress=True)
    client.spawn()
    try:
        tokenizer = load_text_tokenizer(config.model)
        info = client.start()
    except (EngineStartError, ConfigError, OSError, ValueError) as exc:
        client.close()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    log.info("%s (engine ready in %.1f s)", info.memory_plan, info.load_seconds)
    names = list(args.served_model_name or [info.model_name])
    state = ServerState(
        engine=client,
        tokenizer=TokenizerService(tokenizer, args.tokenizer_workers),
        served_model_names=names,
        model_root=config.model,
        max_model_len=info.max_model_len,
        scheduling_policy=info.scheduling_policy,
        max_waiting_requests=args.max_waiting_requests or None,
    )
    metrics = ServerMetrics(
        names[0],
        info.max_model_len,
        CacheInfo(info.block_size, info.num_gpu_blocks, info.num_cpu_blocks, info.gpu_memory_utilization),
    )
    app = create_app(state, metrics)
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    print(f"\nllmservice: serving {names[0]!r} at http://{shown}:{args.port}/v1  (docs: /docs, metrics: /metrics)\n"
          f"try:\n{curl_example(args.host, args.port, names[0])}\n", file=sys.stderr, flush=True)
    try:
        return run_server(app, state, args.host, args.port, args.shutdown_grace_seconds, args.log_level)
    finally:
        state.tokenizer.close()
        client.close()
