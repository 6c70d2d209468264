"""Real `llmservice serve` processes (uvicorn on 127.0.0.1, embedded model) for the tests.

Model load takes 10-15 s, so servers are shared: `main_server` for the whole session,
others per module via `launch_server`. Every server runs the engine with one torch
thread (the machine has 2 cores shared by everyone) and a small max-model-len.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

BIN = Path(sys.executable).parent / "llmservice"
START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics as {'name{labels}': value}, plus bare names summed over labels."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return parse_metrics(text)

    def rss_bytes(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
        bare = key.split("{", 1)[0]
        if bare != key:
            out[bare] = out.get(bare, 0.0) + float(value)
    return out


def spawn_server(args: list[str], log_path: Path) -> ServerProcess:
    """Start `llmservice serve` without waiting (so slow start-ups overlap)."""
    port = free_port()
    cmd = [str(BIN), "serve", "--host", "127.0.0.1", "--port", str(port), "--num-threads", "1", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    log_file = open(log_path, "w")  # noqa: SIM115 - owned by the process for its lifetime
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    return ServerProcess(proc, port, log_path, cmd)


def wait_ready(server: ServerProcess) -> ServerProcess:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if httpx.get(server.url + "/ready", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"server not ready within {START_TIMEOUT_S} s:\n{server.log()[-4000:]}")


@pytest.fixture(scope="session")
def launch_server(tmp_path_factory):
    started: list[ServerProcess] = []

    def launch(*args: str, wait: bool = True) -> ServerProcess:
        log_path = tmp_path_factory.mktemp("server") / "server.log"
        server = spawn_server(list(args), log_path)
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
    """Only test_small_server.py uses it; its last test stops it with SIGTERM."""
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
