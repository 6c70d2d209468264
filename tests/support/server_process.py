"""Real `llmservice serve` processes for the tests (uvicorn on 127.0.0.1, embedded model).

Shared by the integration tier's fixtures (tests/integration/server/conftest.py) and the
advisor's end-to-end tests: one way to start a server, wait for it and stop it. Every
server runs the engine with one torch thread (the machine has 2 cores shared by everyone).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.ports import free_port

BIN = Path(sys.executable).parent / "llmservice"
START_TIMEOUT_S = 240
_LOGS = itertools.count()


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
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        assert match, status
        return int(match.group(1)) * 1024

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


def spawn_server(
    args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> ServerProcess:
    """Start `llmservice serve` without waiting (so slow start-ups overlap)."""
    port = free_port()
    cmd = [str(BIN), "serve", "--host", "127.0.0.1", "--port", str(port), "--num-threads", "1"]
    cmd += args
    full_env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    log_file = open(log_path, "w")  # noqa: SIM115 - owned by the process for its lifetime
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=full_env)
    return ServerProcess(proc, port, log_path, cmd)


def wait_ready(server: ServerProcess) -> ServerProcess:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {server.proc.returncode}:\n{server.log()[-4000:]}"
            )
        try:
            if httpx.get(server.url + "/ready", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"server not ready within {START_TIMEOUT_S} s:\n{server.log()[-4000:]}")


@contextmanager
def running_server(
    args: list[str], log_dir: Path, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """A ready server for the `with` block; SIGTERM (then SIGKILL) on exit."""
    server = spawn_server(args, log_dir / f"server-{next(_LOGS)}.log", env)
    try:
        yield wait_ready(server)
    finally:
        server.stop()


def wait_for_metric(server: ServerProcess, name: str, timeout_s: float) -> dict[str, float]:
    """Poll /metrics until `name` is exported (or the timeout); the last sample."""
    deadline = time.monotonic() + timeout_s
    sample = server.metrics()
    while name not in sample and time.monotonic() < deadline:
        time.sleep(0.2)
        sample = server.metrics()
    return sample
