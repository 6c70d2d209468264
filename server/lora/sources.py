"""Where an adapter's files are: a local directory as given, or `hf://ORG/NAME[@REVISION]`
downloaded into the Hub cache first (the model's hub code: HF_ENDPOINT, HF_TOKEN,
HF_HUB_OFFLINE, the same error messages). Only the adapter's two files are fetched.

The API process resolves a reference before the engine reads the directory: at start for
--lora-modules, and for /v1/load_lora_adapter on a worker thread (a download never
blocks the event loop or the engine's steps). `/v1/models` still shows the reference
as given, so a client (or the operator) sees the source it asked for.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmservice.server.lora.modules import parse_lora_module
from llmservice.server.model.sources import _REPO, HF_PREFIX, HubRef

ADAPTER_FILES = ["adapter_config.json", "adapter_model.safetensors"]


class AdapterSourceError(ValueError):
    """An adapter path that names no readable source; the message names the adapter."""


def parse_adapter_ref(path: str) -> tuple[HubRef, str | None] | None:
    """The Hub repo and revision of an `hf://` adapter path; None for a local path."""
    if not path.startswith(HF_PREFIX):
        return None
    repo, _, revision = path[len(HF_PREFIX):].strip("/").partition("@")
    if not _REPO.match(repo) or (_ and not revision):
        raise AdapterSourceError(
            f"adapter path {path!r} is not a Hub reference: expected hf://ORG/NAME or hf://ORG/NAME@REVISION"
        )
    return HubRef(repo, None, path), revision or None


def fetch_adapter(ref: HubRef, revision: str | None, cache_dir: str | None) -> Path:
    """The local snapshot folder of a Hub adapter, downloading what the cache lacks."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars
    from llmservice.server.model.hub import hub_errors

    disable_progress_bars()
    for name in ("httpx", "httpx2"):  # one INFO line per HTTP request otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
    with hub_errors(ref, revision, cache_dir):
        folder = snapshot_download(ref.repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=ADAPTER_FILES)
    return Path(folder)


def resolve_adapter_path(name: str, path: str, cache_dir: str | None = None) -> str:
    """A local directory for the adapter; AdapterSourceError names the adapter and why not."""
    from llmservice.server.model.hub import HubFetchError

    found = parse_adapter_ref(path)
    if found is None:
        return path
    try:
        return str(fetch_adapter(*found, cache_dir))
    except HubFetchError as err:
        raise AdapterSourceError(f"adapter {name!r}: {err}") from None


def localize_lora_modules(config: Any, cache_dir: str | None) -> tuple[Any, dict[str, str]]:
    """`config` (an EngineConfig) with every hf:// --lora-modules entry downloaded and
    replaced by its local folder, and {local folder: reference as given}."""
    if not config.lora_modules:
        return config, {}
    entries, sources = [], {}
    for value in config.lora_modules:
        module = parse_lora_module(value)
        local = resolve_adapter_path(module.name, module.path, cache_dir)
        if local == module.path:
            entries.append(value)
            continue
        sources[local] = module.path
        body = {"name": module.name, "path": local}
        if module.base_model_name is not None:
            body["base_model_name"] = module.base_model_name
        entries.append(json.dumps(body))
    return (replace(config, lora_modules=entries), sources) if sources else (config, {})
