"""Helpers for the advisor's end-to-end tests: a real `llmservice serve`, a real
workload over HTTP, and `llmservice advise --json` run as a user would run it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent / "llmservice"
START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(args: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A ready server's URL; SIGTERM on exit. One torch thread: the machine has 2 cores."""
    port = free_port()
    cmd = [str(BIN), "serve", "--host", "127.0.0.1", "--port", str(port), "--num-threads", "1", *args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    log_path = log_dir / f"server-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready in {START_TIMEOUT_S} s")
            time.sleep(0.5)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def _drive(url: str, prompts: list[list[int]] | list[str], max_tokens: int, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, trust_env=False) as client:

        async def one(prompt: list[int] | str) -> None:
            async with gate:
                r = await client.post("/v1/completions", json={
                    "model": "builtin:smollm2-135m", "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True,
                })
                r.raise_for_status()

        await asyncio.gather(*(one(p) for p in prompts))


def advise_during(url: str, window: float, prompts: list[list[int]] | list[str], max_tokens: int,
                  concurrency: int = 4) -> tuple[int, list[dict]]:
    """Start `llmservice advise URL --window W --json`, drive the workload inside the
    window, and return its exit code and findings."""
    proc = subprocess.Popen([str(BIN), "advise", url, "--window", str(window), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # its first scrape is taken before the workload
    started = time.monotonic()
    asyncio.run(_drive(url, prompts, max_tokens, concurrency))
    took = time.monotonic() - started
    out, err = proc.communicate(timeout=window + 60)
    assert took < window - 1, f"the workload took {took:.0f} s, longer than the {window} s window"
    assert proc.returncode in (0, 3), err
    return proc.returncode, json.loads(out)
