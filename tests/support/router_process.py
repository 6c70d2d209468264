"""Start the real `llmservice router` process in front of fixed backends, for tests."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.ports import free_port

BIN = Path(sys.executable).parent / "llmservice"
START_TIMEOUT_S = 60


def start_router(
    backends: list[str], log: Path, extra: list[str] = ()
) -> tuple[subprocess.Popen, str]:
    """The router process and its URL, once /healthz answers."""
    port = free_port()
    cmd = [str(BIN), "router", "--host", "127.0.0.1", "--port", str(port), *extra]
    for b in backends:
        cmd += ["--backend", b]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(log.read_text())
