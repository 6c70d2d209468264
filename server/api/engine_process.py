"""The engine-core process and its two queues, importable without the API or the engine.

`llmservice serve` starts this first, before it imports FastAPI or builds anything, so
the engine's longest path (import torch, read the weights) begins at once and the API's
own start-up runs beside it. The child is spawned, so it imports only what unpickling
its arguments needs: this module, the config and the engine core; nothing of the API.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmservice.server.config import EngineConfig


def run_engine_process(*args: Any) -> None:
    """The engine-core process's entry point (core.run_engine_core). The engine (torch,
    the model) is imported here, in the child only."""
    from llmservice.server.engine.core import run_engine_core

    run_engine_core(*args)


class EngineProcess:
    """The not-yet-started engine-core process; `start()` spawns it."""

    def __init__(self, config: EngineConfig, log_level: int, show_progress: bool):
        ctx = mp.get_context("spawn")
        self.inbox = ctx.Queue()  # commands to the engine
        self.outbox = ctx.Queue()  # EngineReady / EngineFailed, then reports
        self.process = ctx.Process(
            target=run_engine_process,
            args=(config, self.inbox, self.outbox, log_level, show_progress),
            name="llmservice-engine-core",
            daemon=True,
        )
        self.started = False

    def start(self) -> None:
        self.process.start()
        self.started = True
