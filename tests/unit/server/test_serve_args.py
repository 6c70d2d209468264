"""`llmservice serve`'s flags come from the option definitions of server/config.py: every
flag the server ever had still parses, defaults are the dataclasses', and flags rendered
from field values parse back to the same configuration."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from llmservice.server.argspec import ARG
from llmservice.server.cli_args import (
    SERVE_OPTIONS,
    UnsupportedError,
    add_serve_args,
    configs_from_args,
    parse_serve_argv,
    to_argv,
)
from llmservice.server.config import ConfigError, EngineConfig, ServerArgs

LLMSERVICE = Path(sys.executable).with_name("llmservice")

# Every flag `llmservice serve` had before the options were defined once, with a value.
LEGACY_ARGV = [
    "builtin:smollm2-135m",
    "--host", "127.0.0.1", "--port", "8123", "--served-model-name", "a", "b",
    "--dtype", "float32", "--device", "cpu", "--load-format", "dummy", "--block-size", "32",
    "--max-model-len", "512", "--max-num-batched-tokens", "1024", "--max-num-seqs", "8",
    "--no-enable-prefix-caching", "--no-enable-chunked-prefill", "--preemption-mode", "swap",
    "--swap-space", "2.5", "--gpu-memory-utilization", "0.8", "--kv-cache-memory-gib", "0.25",
    "--num-gpu-blocks-override", "64", "--scheduling-policy", "priority",
    "--max-queue-delay-ms", "250", "--max-waiting-requests", "16",
    "--shutdown-grace-seconds", "5", "-tp", "1", "--num-threads", "2", "--download-dir", "/d",
    "--seed", "7", "--tokenizer-workers", "3", "--log-level", "debug",
]  # fmt: skip


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmservice serve")
    add_serve_args(parser)
    return parser


def test_every_flag_the_server_had_still_parses_into_the_same_config():
    engine, server = configs_from_args(serve_parser().parse_args(LEGACY_ARGV))
    assert engine == EngineConfig(
        model="builtin:smollm2-135m", served_model_name="a", dtype="float32", device="cpu",
        load_format="dummy", block_size=32, max_model_len=512, max_num_batched_tokens=1024,
        max_num_seqs=8, enable_prefix_caching=False, enable_chunked_prefill=False,
        preemption_mode="swap", swap_space=2.5, gpu_memory_utilization=0.8,
        kv_cache_memory_gib=0.25, num_gpu_blocks_override=64, scheduling_policy="priority",
        max_queue_delay_ms=250.0, seed=7, num_threads=2,
    )  # fmt: skip
    assert server == ServerArgs(
        host="127.0.0.1", port=8123, max_waiting_requests=16, shutdown_grace_seconds=5.0,
        download_dir="/d", tokenizer_workers=3, log_level="debug",
    )  # fmt: skip


def test_no_flags_give_the_dataclass_defaults():
    assert configs_from_args(serve_parser().parse_args([])) == (EngineConfig(), ServerArgs())


def test_every_config_field_is_a_flag():
    for cls in (EngineConfig, ServerArgs):
        bare = [f.name for f in dataclasses.fields(cls) if ARG not in f.metadata]
        assert bare == [], f"{cls.__name__} fields without a command-line option: {bare}"


def test_flags_rendered_from_values_parse_back_to_the_same_config():
    engine = EngineConfig(
        model="/models/x", served_model_name="x", dtype="bfloat16", block_size=64,
        max_model_len=8192, max_num_batched_tokens=4096, enable_prefix_caching=False,
        preemption_mode="auto", swap_space=0.125, gpu_memory_utilization=0.123456789,
        kv_cache_memory_gib=3.0, scheduling_policy="priority", max_queue_delay_ms=12.5,
        priority_aging_per_s=0.5, seed=3,
    )  # fmt: skip
    server = ServerArgs(port=9000, max_waiting_requests=0, shutdown_grace_seconds=2.5)
    values = {**dataclasses.asdict(engine), **dataclasses.asdict(server)}
    assert configs_from_args(parse_serve_argv(to_argv(values))) == (engine, server)


def test_to_argv_spells_switches_and_leaves_none_out():
    argv = to_argv({"enable_prefix_caching": False, "enable_chunked_prefill": True,
                    "max_model_len": None, "swap_space": 4.0})  # fmt: skip
    assert argv == ["--no-enable-prefix-caching", "--enable-chunked-prefill", "--swap-space", "4"]


def test_to_argv_refuses_an_option_the_server_does_not_define():
    with pytest.raises(KeyError, match="not an option of llmservice serve"):
        to_argv({"max_batch_size": 8})


def test_a_mistake_raises_instead_of_exiting():
    with pytest.raises(ConfigError, match="unrecognized arguments: --max-batch-size"):
        parse_serve_argv(["--max-batch-size", "8"])
    with pytest.raises(ConfigError, match="invalid choice"):
        parse_serve_argv(["--block-size", "24"])
    with pytest.raises(ConfigError, match="unrecognized arguments: --help"):
        parse_serve_argv(["--help"])  # no usage text printed into an operator's log


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tensor-parallel-size", "16"], "--tensor-parallel-size 16: this engine shards a model over at most 8"),
        (["hf://meta-llama"], "model hf://meta-llama: not a Hub model reference; use hf://ORG/NAME"),
        (["builtin:nope"], "model builtin:nope: no builtin model of that name; use builtin:smollm2-135m"),
        (["s3://bucket/model"], "model s3://bucket/model: unknown model source scheme s3://"),
    ],
)
def test_start_refuses_what_this_build_cannot_run(argv, message):
    with pytest.raises(UnsupportedError) as caught:
        configs_from_args(parse_serve_argv(argv))
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-waiting-requests", "-1"], "--max-waiting-requests -1 must be >= 0"),
        (["--shutdown-grace-seconds", "-1"], "--shutdown-grace-seconds -1.0 must be >= 0"),
        (["--num-threads", "0"], "--num-threads 0 must be >= 1"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5 must be in (0, 1]"),
    ],
)
def test_bad_values_name_their_flag(argv, message):
    with pytest.raises(ConfigError) as caught:
        configs_from_args(parse_serve_argv(argv))
    assert str(caught.value) == message


def test_serve_exits_2_before_loading_anything_it_cannot_run(capsys):
    from llmservice.server.api.launch import serve

    assert serve(serve_parser().parse_args(["-tp", "9"])) == 2
    assert "--tensor-parallel-size 9" in capsys.readouterr().err


def test_serve_help_lists_every_flag():
    done = subprocess.run([str(LLMSERVICE), "serve", "--help"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for option in SERVE_OPTIONS:
        if not option.arg.hidden:
            assert option.arg.flag in done.stdout, option.arg.flag
    assert "--num-gpu-blocks-override" not in done.stdout
