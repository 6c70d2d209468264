"""server/model/prefetch.py: which files `serve` asks the kernel to read ahead."""

from __future__ import annotations

import os
from pathlib import Path

from llmservice.server.model.prefetch import prefetch_weights, weight_files
from llmservice.server.model.registry import resolve_model_path


def test_a_folder_gives_its_safetensors_shards_in_order(tmp_path: Path) -> None:
    for name in ("model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors", "config.json", "x.gguf"):
        (tmp_path / name).write_bytes(b"0")
    assert [p.name for p in weight_files(str(tmp_path))] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    ]


def test_a_folder_without_safetensors_gives_its_gguf(tmp_path: Path) -> None:
    (tmp_path / "model-q4.gguf").write_bytes(b"0")
    (tmp_path / "config.json").write_text("{}")
    assert weight_files(str(tmp_path)) == [tmp_path / "model-q4.gguf"]


def test_the_embedded_model_is_its_gguf_file() -> None:
    assert weight_files("builtin:smollm2-135m") == [resolve_model_path("builtin:smollm2-135m")]


def test_nothing_to_read_for_dummy_weights_or_a_missing_model(tmp_path: Path) -> None:
    assert prefetch_weights("builtin:smollm2-135m", "dummy") is None
    assert prefetch_weights(str(tmp_path / "absent")) is None
    assert weight_files("builtin:no-such-model") == []


def test_the_read_ahead_runs_off_the_caller_and_skips_a_file_it_cannot_open(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a.safetensors").symlink_to(tmp_path / "gone")  # listed, but open() fails
    (tmp_path / "b.safetensors").write_bytes(os.urandom(1 << 20))
    advised: list[int] = []
    real_fadvise = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: advised.append(advice) or real_fadvise(fd, off, n, advice))
    thread = prefetch_weights(str(tmp_path))
    assert thread is not None and thread.daemon
    thread.join(30)
    assert not thread.is_alive()
    assert advised == [os.POSIX_FADV_WILLNEED]  # b, after a was skipped
