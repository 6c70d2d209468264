"""Run the real operator (`python -m llmservice.operator.cli`, i.e. `kopf run`) as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.ports import free_port  # noqa: F401 - re-exported for the tests


class OperatorProcess:
    """`with OperatorProcess(kubeconfig, log) as op:` starts and waits for kopf's liveness."""

    def __init__(
        self, kubeconfig: Path, log_path: Path, *extra_args: str, env: dict[str, str] | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.liveness = ""  # kopf's /healthz URL, once started

    def start(self, timeout: float = 30) -> None:
        port = free_port()
        liveness = self.liveness = f"http://127.0.0.1:{port}/healthz"
        argv = [
            sys.executable, "-m", "llmservice.operator.cli",
            "--all-namespaces", "--liveness", liveness,
            *self.extra_args,
        ]  # fmt: skip
        env = {**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the operator exited early: {self.logs()[-3000:]}")
            try:
                with urllib.request.urlopen(liveness, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the operator did not become live: {self.logs()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self._log.close()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> OperatorProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
