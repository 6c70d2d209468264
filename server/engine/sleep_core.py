"""The engine core's side of sleep mode: Sleep waits until no request is in flight, then
frees memory (sleep.py); WakeUp restores it. Each answers with one SleepChanged."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from llmservice.server.engine import sleep as sleep_mode
from llmservice.server.engine.messages import Sleep, SleepChanged, WakeUp

log = logging.getLogger("llmservice.engine")


class SleepController:
    def __init__(self, engine: Any):
        self.engine = engine
        self.state = sleep_mode.SleepState()
        self.pending: int | None = None  # a Sleep level waiting for the running requests

    @property
    def sleeping(self) -> bool:
        return self.state.sleeping

    def handle(self, cmd: Sleep | WakeUp) -> list[SleepChanged]:
        """The answers, in the order the commands came (one each; a pending Sleep that a
        WakeUp cancels is answered first)."""
        if not self.engine.config.enable_sleep_mode:
            return [SleepChanged(self.state.level, 0.0, "sleep mode is off (start the server with --enable-sleep-mode)")]
        if isinstance(cmd, WakeUp):
            cancelled = [] if self.pending is None else [SleepChanged(0, 0.0, "cancelled by /wake_up")]
            self.pending = None
            return cancelled + [self._wake()]
        return [answer for answer in [self._sleep(cmd.level)] if answer is not None]

    def _wake(self) -> SleepChanged:
        if not self.sleeping:
            return SleepChanged(0, 0.0)
        try:
            seconds = sleep_mode.wake(self.engine, self.state, self._reload)
        except Exception as exc:  # the engine cannot serve without its weights: say why
            log.exception("wake-up failed")
            return SleepChanged(self.state.level, 0.0, f"wake-up failed: {type(exc).__name__}: {exc}")
        return SleepChanged(0, seconds)

    def _sleep(self, level: int) -> SleepChanged | None:
        if level not in sleep_mode.SLEEP_LEVELS:
            return SleepChanged(self.state.level, 0.0, f"sleep level must be one of {sleep_mode.SLEEP_LEVELS}")
        if self.sleeping or self.pending is not None:
            return SleepChanged(self.state.level, 0.0, "already asleep or falling asleep")
        self.pending = level
        return self.maybe_sleep()

    def maybe_sleep(self) -> SleepChanged | None:
        """Sleep now if one is pending and the engine is idle (called each loop turn)."""
        if self.pending is None or self.engine.has_unfinished_requests():
            return None
        level, self.pending = self.pending, None
        t0 = time.perf_counter()
        self.state = sleep_mode.sleep(self.engine, level)
        return SleepChanged(level, time.perf_counter() - t0)

    def _reload(self) -> Any:
        """Level 2's wake: the model read from disk again, as at start-up."""
        from llmservice.server.model.llama import LlamaModel
        from llmservice.server.model.loader import load_model

        e, cfg = self.engine, self.engine.config
        loaded = load_model(cfg.model, torch.float32 if e.device.type == "cpu" else e.dtype,
                            load_format=cfg.load_format, device=e.device, cpu_weights=cfg.cpu_weights)
        return LlamaModel(loaded.config, loaded.weights, e.device, e.dtype, e.max_model_len, consume=True)
