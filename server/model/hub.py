"""Fetch a Hugging Face Hub model into the local cache before the engine starts.

`fetch_model` runs in the API process before anything listens: every failure raises
`HubFetchError` whose message names the problem (a token, the name, pickle weights,
the architecture, the disk), and `serve` exits non-zero with it. Only what the server
reads is downloaded: config, tokenizer and generation config first (so a wrong
architecture or pickle-only weights fail in seconds), then the `*.safetensors` files,
one log line per file as it progresses. huggingface_hub does the HTTP: HF_ENDPOINT,
HF_TOKEN, HF_HUB_OFFLINE=1 (start from the cache, no network), retries that resume a
cut download from the bytes already received, and files completed by an earlier,
interrupted start are not fetched again.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from llmservice.server.model.sources import HubRef, architecture_problem

# A server does not report its user agent's environment to the Hub (huggingface_hub
# would fetch /api/agent-harnesses on first use to do so); set before it is imported.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

log = logging.getLogger("llmservice.hub")

META_FILES = [
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.jinja", "model.safetensors.index.json",
]
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
TOKEN_SECRET = (
    "set HF_TOKEN to a token that may read it; on Kubernetes the operator passes it from the "
    "Secret named in the LLMService's spec.model.hfTokenSecretRef (key `token` unless "
    "spec.model.hfTokenSecretRef.key names another)"
)
DOWNLOAD_WORKERS = 4


class HubFetchError(RuntimeError):
    """A Hub model cannot be fetched; the message says why and what to change."""


# ---- pure decisions ------------------------------------------------------------------------
def weight_files(files: dict[str, int], given: str) -> list[str]:
    """The top-level *.safetensors of a repo listing {path: bytes}; pickle-only is refused
    (the server never unpickles: a .bin can run code when loaded)."""
    top = {f: s for f, s in files.items() if "/" not in f}
    safe = sorted(f for f in top if f.endswith(".safetensors"))
    if safe:
        return safe
    pickles = sorted(f for f in top if f.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise HubFetchError(
            f"{given} has only pickle weights ({', '.join(pickles[:3])}); this server loads "
            "*.safetensors only and never unpickles. Use a revision or a copy of the model "
            "with safetensors weights (e.g. converted with `transformers` save_pretrained)"
        )
    raise HubFetchError(f"{given} has no weights (*.safetensors) at the top of the repo")


def disk_shortfall(needed: int, free: int, where: str) -> str | None:
    """Why `needed` bytes do not fit in `free` bytes at `where`, or None."""
    if needed <= free:
        return None
    return (
        f"not enough disk space in {where}: the model needs {gb(needed)} more, "
        f"{gb(free)} are free; free space there or pass a larger --download-dir"
    )


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


class LogProgress:
    """A tqdm stand-in for huggingface_hub that writes one log line per file every ~10%
    (at most every 2 s) instead of drawing a bar: pod logs are not terminals. Each line
    gives the bytes, the mean rate so far and the time left at that rate."""

    def __init__(self, *args, total: int | None = None, initial: int = 0, desc: str = "",
                 label: str | None = None, **kwargs):
        self.total, self.n, self.desc = total, initial, label or desc
        self.t0 = time.monotonic()
        self.last_t, self.last_pct = self.t0, -10.0
        if initial:
            log.info("resuming %s at %s", desc, gb(initial))

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float | None = 1) -> None:
        self.n += int(n or 0)
        now = time.monotonic()
        pct = 100.0 * self.n / self.total if self.total else 0.0
        if pct - self.last_pct >= 10.0 and now - self.last_t >= 2.0 or self.total and self.n >= self.total:
            elapsed = max(now - self.t0, 1e-9)
            rate = self.n / elapsed
            if self.total and self.n < self.total:
                left = f"ETA {(self.total - self.n) / rate:.0f} s" if rate > 0 else "ETA unknown"
            else:
                left = f"done in {elapsed:.1f} s"
            log.info("downloading %s: %s of %s (%.0f%%), %.1f MB/s, %s", self.desc, gb(self.n),
                     gb(self.total or 0), pct, rate / 1e6, left)
            self.last_t, self.last_pct = now, pct

    def close(self) -> None:
        pass

    def set_description(self, *args, **kwargs) -> None:
        pass

    set_postfix_str = refresh = set_description


# ---- I/O -----------------------------------------------------------------------------------
@contextmanager
def hub_errors(ref: HubRef, revision: str | None, cache_dir: str | None) -> Iterator[None]:
    """huggingface_hub's exceptions -> HubFetchError with a message that says what to do."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = ref.given or ref.repo_id
    where = cache_dir or constants.HF_HUB_CACHE
    try:
        yield
    except GatedRepoError as exc:
        raise HubFetchError(f"{name} is gated or private (the Hub answered {_status(exc)}): {TOKEN_SECRET}") from None
    except RevisionNotFoundError:
        raise HubFetchError(f"{name} has no revision {revision!r} on the Hub ({constants.ENDPOINT})") from None
    except EntryNotFoundError:
        raise HubFetchError(f"{name}: the repo has no file {ref.filename!r}") from None
    except RepositoryNotFoundError as exc:
        if _status(exc) == 401:
            raise HubFetchError(
                f"{name}: the Hub ({constants.ENDPOINT}) answered 401: no such model, or it is "
                f"private and needs a token; check the name, or {TOKEN_SECRET}"
            ) from None
        raise HubFetchError(f"{name}: no such model on the Hub ({constants.ENDPOINT}); check the name") from None
    except LocalEntryNotFoundError:
        how = "HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE else f"the Hub ({constants.ENDPOINT}) cannot be reached"
        raise HubFetchError(
            f"{name}{'@' + revision if revision else ''}: {how} and the cache {where} has no complete copy"
        ) from None
    except HfHubHTTPError as exc:
        raise HubFetchError(f"{name}: the Hub ({constants.ENDPOINT}) answered {_status(exc)}: {exc}") from None
    except _transport_errors() as exc:
        raise HubFetchError(
            f"{name}: the download from {constants.ENDPOINT} failed ({type(exc).__name__}: {exc}) after "
            "huggingface_hub's retries; start again to resume (files already downloaded are kept)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise HubFetchError(f"the disk of {where} is full while downloading {name}; free space there or pass a larger --download-dir") from None
        raise


def _transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP client's connection errors (huggingface_hub >= 1 uses httpx; newer, httpx2)."""
    found: list[type[Exception]] = []
    for module in ("httpx2", "httpx"):
        try:
            found.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _listing(ref: HubRef, commit: str, folder: Path, cache_dir: str | None) -> dict[str, int]:
    """{path: bytes} of the repo at that commit, from the tree listing huggingface_hub
    cached (no network); a cache without one: the files already in the snapshot."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        return {f.path: int(f.size or 0) for f in get_cached_repo_tree(ref.repo_id, revision=commit, cache_dir=cache_dir)}
    except CachedRepoTreeNotFoundError:
        return {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def check_config(folder: Path, given: str) -> None:
    """A wrong architecture fails before any weight is fetched (and before torch loads)."""
    file = folder / "config.json"
    if not file.exists():
        raise HubFetchError(f"{given} has no config.json (for a GGUF file name it: hf://ORG/NAME/FILE.gguf)")
    problem = architecture_problem(json.loads(file.read_text()).get("architectures") or [])
    if problem:
        raise HubFetchError(f"{given}: {problem}")


def fetch_model(ref: HubRef, revision: str | None = None, cache_dir: str | None = None) -> Path:
    """The local snapshot folder (or .gguf file) of a Hub model, downloading what is missing."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # huggingface_hub's own bars; LogProgress logs per file instead
    for name in ("httpx", "httpx2"):  # one INFO line per HTTP request otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
    t0 = time.monotonic()
    with hub_errors(ref, revision, cache_dir):
        if ref.filename is not None:
            return Path(hf_hub_download(ref.repo_id, ref.filename, revision=revision, cache_dir=cache_dir,
                                        tqdm_class=partial(LogProgress, label=ref.filename)))  # type: ignore[arg-type]
        folder = Path(snapshot_download(ref.repo_id, revision=revision, cache_dir=cache_dir,
                                        allow_patterns=META_FILES))
        check_config(folder, ref.given or ref.repo_id)
        commit = folder.name
        files = _listing(ref, commit, folder, cache_dir)
        weights = weight_files(files, ref.given or ref.repo_id)
        missing = [w for w in weights if not (folder / w).exists()]
        needed = sum(files.get(w, 0) for w in missing)
        shortfall = disk_shortfall(needed, shutil.disk_usage(folder).free, str(folder.parents[2]))
        if shortfall:
            raise HubFetchError(shortfall)
        if missing:
            log.info("downloading %d weight files (%s) of %s", len(missing), gb(needed), ref.given)

        def one(filename: str) -> str:
            return hf_hub_download(ref.repo_id, filename, revision=commit, cache_dir=cache_dir,
                                   tqdm_class=partial(LogProgress, label=filename))  # type: ignore[arg-type]

        with ThreadPoolExecutor(DOWNLOAD_WORKERS) as pool:
            list(pool.map(one, weights))
    dt = time.monotonic() - t0
    total = sum(files.get(w, 0) for w in weights)
    log.info("%s: %d weight files (%s) ready in %s after %.1f s (%s downloaded)", ref.given, len(weights),
             gb(total), folder, dt, gb(needed))
    return folder


def localize(config, revision: str | None, download_dir: str | None):
    """`config` (an EngineConfig) with a Hub model replaced by its local snapshot, and the
    served name defaulting to the reference as given; anything else is returned as is."""
    from dataclasses import replace

    from llmservice.server.model.sources import parse_hub_ref

    ref = parse_hub_ref(config.model)
    if ref is None:
        return config
    path = fetch_model(ref, revision, download_dir)
    return replace(config, model=str(path), served_model_name=config.served_model_name or ref.given)
