"""Real `llmservice serve` processes (uvicorn on 127.0.0.1, embedded model) for the tests.

Model load takes 10-15 s, so servers are shared: `main_server` for the whole session,
others per module via `launch_server`. Every server runs the engine with one torch
thread (the machine has 2 cores shared by everyone) and a small max-model-len.
"""

from __future__ import annotations

import pytest

from tests.support.server_process import ServerProcess, spawn_server, wait_ready


@pytest.fixture(scope="session")
def launch_server(tmp_path_factory):
    started: list[ServerProcess] = []

    def launch(*args: str, wait: bool = True, env: dict[str, str] | None = None) -> ServerProcess:
        log_path = tmp_path_factory.mktemp("server") / "server.log"
        server = spawn_server(list(args), log_path, env)
        started.append(server)
        return wait_ready(server) if wait else server

    yield launch
    for server in started:
        server.stop()


MAIN_ARGS = ("--max-model-len", "512", "--kv-cache-memory-gib", "0.25", "--max-waiting-requests", "256")


# A tiny KV pool (8 blocks of 16 tokens), 64-token context, queue bound 8.
SMALL_ARGS = (
    "--max-model-len", "64", "--num-gpu-blocks-override", "8", "--max-num-seqs", "8",
    "--max-waiting-requests", "8", "--shutdown-grace-seconds", "120",
)


@pytest.fixture(scope="session")
def _spawned(launch_server) -> dict[str, ServerProcess]:
    """Both servers boot together, and while the first tests run."""
    return {"main": launch_server(*MAIN_ARGS, wait=False), "small": launch_server(*SMALL_ARGS, wait=False)}


@pytest.fixture(scope="session")
def _main_server_spawned(_spawned) -> ServerProcess:
    return _spawned["main"]


@pytest.fixture(scope="session")
def small_server_spawned(_spawned) -> ServerProcess:
    return _spawned["small"]


@pytest.fixture(scope="session")
def small_server(small_server_spawned) -> ServerProcess:
    """Only test_small_server.py uses it."""
    return wait_ready(small_server_spawned)


@pytest.fixture(scope="session")
def main_server(_main_server_spawned, offline_engine) -> ServerProcess:
    """Waits after loading the offline reference engine, so the two loads overlap."""
    return wait_ready(_main_server_spawned)


@pytest.fixture(scope="session")
def offline_engine(_main_server_spawned):
    """The engine used directly (no server): the reference for greedy outputs. Loaded
    while the main server boots."""
    from llmservice.server.config import EngineConfig
    from llmservice.server.engine.engine import LLMEngine

    return LLMEngine.from_config(EngineConfig(max_model_len=512, kv_cache_memory_gib=0.05, num_threads=1))
