"""Ask the kernel to read the weight files while the engine core imports torch.

On a cold start (a new pod, a node whose page cache no longer holds the model) the weights
come from the disk, and the engine core's first 1.5-3 s are `import torch`, which reads
none of them. `llmservice serve` calls `prefetch_weights` just before it spawns the engine
core: one POSIX_FADV_WILLNEED per file, from a daemon thread, so the disk reads overlap
the imports and the loader later finds the pages in the cache. It costs no memory of the
process (page cache, not RSS) and nothing when the files are cached already. No torch,
nothing that can fail the start: a file that cannot be opened is the loader's to report.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from llmservice.server.model.hf_info import shard_files
from llmservice.server.model.loaded import UnsupportedModelError
from llmservice.server.model.registry import ModelNotFoundError, resolve_model_path

log = logging.getLogger(__name__)


def weight_files(model: str) -> list[Path]:
    """The files the loader will read for `model`: the .gguf file, or a folder's safetensors
    shards as the loader lists them (its .gguf files when it has none). Empty when the
    model cannot be found."""
    try:
        path = resolve_model_path(model)
    except ModelNotFoundError:
        return []
    if path.is_file():
        return [path]
    try:
        return shard_files(path)
    except UnsupportedModelError:  # no safetensors (or a broken index: the loader says which)
        return sorted(path.glob("*.gguf"))


def _advise(files: list[Path]) -> None:
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError as exc:  # e.g. a file system without readahead: nothing lost
            log.debug("no readahead for %s: %s", path, exc)
        finally:
            os.close(fd)


def prefetch_weights(model: str, load_format: str = "auto") -> threading.Thread | None:
    """Start reading `model`'s weight files into the page cache; the thread, or None when
    there is nothing to read (`--load-format dummy`, an unknown model)."""
    if load_format == "dummy":
        return None
    files = weight_files(model)
    if not files:
        return None
    thread = threading.Thread(target=_advise, args=(files,), name="llmservice-prefetch", daemon=True)
    thread.start()
    return thread
