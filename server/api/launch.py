"""`llmservice serve`: engine start-up, then uvicorn (the flags: server/cli_args.py).

Start-up order: spawn the engine core first (it shows a progress bar while the weights
load), then import the API and read the tokenizer from the model metadata meanwhile, log
the memory plan, then start listening; `/ready` is 200 from the first request on.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys

from llmservice.server.cli_args import configs_from_args
from llmservice.server.config import ConfigError
from llmservice.server.lora.sources import AdapterSourceError, localize_lora_modules
from llmservice.server.model.hub import HubFetchError, localize

log = logging.getLogger("llmservice.serve")


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
    level = getattr(logging, args.log_level.upper())
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        config, server = configs_from_args(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model_ref = config.model
    try:  # a Hub model is fetched now, so every download failure exits before the port is bound
        config = localize(config, server.revision, server.download_dir)
    except HubFetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:  # hf:// --lora-modules too (server/lora/sources.py)
        config, lora_sources = localize_lora_modules(config, server.download_dir)
    except AdapterSourceError as exc:
        print(f"error: --lora-modules: {exc}", file=sys.stderr)
        return 1
    from llmservice.server.api.engine_process import EngineProcess
    from llmservice.server.model.prefetch import prefetch_weights

    prefetch_weights(config.model, config.load_format)  # the disk reads overlap the engine's imports
    engine = EngineProcess(config, level, show_progress=True)
    engine.start()  # before the API's own imports: the engine's path to ready is the longer one
    from llmservice.server.api.app import create_app
    from llmservice.server.api.engine_client import EngineClient, EngineStartError
    from llmservice.server.api.server import run_server
    from llmservice.server.api.serving import ServerState
    from llmservice.server.api.tokenizer_service import TokenizerService, load_text_tokenizer
    from llmservice.server.metrics import CacheInfo, ServerMetrics
    from llmservice.server.model.hf_info import sampling_defaults

    client = EngineClient(config, engine=engine)
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
        tokenizer=TokenizerService(tokenizer, server.tokenizer_workers),
        served_model_names=names,
        model_root=model_ref,
        max_model_len=info.max_model_len,
        scheduling_policy=info.scheduling_policy,
        max_waiting_requests=server.max_waiting_requests or None,
        max_tokens_default=server.max_tokens_default,
        sampling_defaults=sampling_defaults(config.model),
        request_timeout_s=server.request_timeout_s,
        tool_call_parser=server.tool_call_parser,
        api_key=server.api_key,
        max_request_body_bytes=server.max_request_body_bytes,
        download_dir=server.download_dir,
        lora_sources=lora_sources,
    )
    metrics = ServerMetrics(
        names[0],
        info.max_model_len,
        CacheInfo(info.block_size, info.num_gpu_blocks, info.num_cpu_blocks, info.gpu_memory_utilization),
        max_loras=info.max_loras,
    )
    metrics.advisor.set_engine_config(config.resolve_lengths(info.max_model_len))
    metrics.advisor.set_preemption_costs(info.recompute_s_per_token, info.swap_s_per_token, info.swap_fixed_s)
    state.tokenizer.on_tokenize_seconds = metrics.advisor.tokenize_seconds.inc
    app = create_app(state, metrics)
    shown = "127.0.0.1" if server.host in ("0.0.0.0", "::") else server.host
    print(f"\nllmservice: serving {names[0]!r} at http://{shown}:{server.port}/v1  (docs: /docs, metrics: /metrics)\n"
          f"try:\n{curl_example(server.host, server.port, names[0])}\n", file=sys.stderr, flush=True)
    try:
        return run_server(app, state, server.host, server.port, server.shutdown_grace_seconds, server.log_level)
    finally:
        state.tokenizer.close()
        client.close()
