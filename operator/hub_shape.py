"""Read an `hf://` model's shape from the Hub for the VRAM check, and remember it.

The catalog knows a few models; for any other `hf://` repository the operator fetches
its `config.json` and the safetensors headers (the exact parameter count: the index
`model.safetensors.index.json` names the shards, each shard's header lists its tensors),
never the weights. It authenticates with the LLMService's own token Secret
(spec.model.hfTokenSecretRef), never with a token of its own, and talks to `HF_ENDPOINT`.

The lookup runs in kopf's worker threads (sync handlers, and the status publisher via
`asyncio.to_thread`), never on the event loop; still, one call waits at most `timeout`
seconds. Shapes are cached per (repo, revision); a failure is cached for
`retry_seconds` (per namespace and Secret, since the token may be what is wrong), and
while a stale entry is refreshed in the background callers get the stale answer at once.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmservice.operator.catalog import Architecture
from llmservice.operator.model_shape import ConfigError, architecture_from_config
from llmservice.operator.spec import ModelSpec, SecretKeyRef

DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class FoundShape:
    """What the Hub said about a model: its shape, or why there is none."""

    source: str  # hub:<repo>@<commit> when found, hub:<repo>@<revision> otherwise
    architecture: Architecture | None = None
    problem: str | None = None  # the reason in words when architecture is None


class TokenError(Exception):
    """The token Secret cannot be read (the message names it)."""


ReadToken = Callable[[str, SecretKeyRef], str]


def hub_repo(source: str) -> str | None:
    """`hf://org/name[/file.gguf]` -> `org/name`; None for other sources."""
    if not source.startswith("hf://"):
        return None
    parts = source.removeprefix("hf://").strip("/").split("/")
    return "/".join(parts[:2]) if len(parts) >= 2 else None


def read_token_with(get: Callable[[str], dict[str, Any] | None]) -> ReadToken:
    """A token reader over the operator's kube client (`Kube.get`)."""
    from llmservice.operator.kube import ApiError, path_for

    def read(namespace: str, ref: SecretKeyRef) -> str:
        where = f"Secret {namespace}/{ref.name}"
        try:
            secret = get(path_for("v1", "secrets", namespace, ref.name))
        except ApiError as exc:
            raise TokenError(f"cannot read {where} (spec.model.hfTokenSecretRef): {exc}") from exc
        if secret is None:
            raise TokenError(f"{where} (spec.model.hfTokenSecretRef) does not exist")
        value = (secret.get("data") or {}).get(ref.key)
        if not value:
            raise TokenError(f"{where} has no key {ref.key!r} (spec.model.hfTokenSecretRef.key)")
        return base64.b64decode(value).decode().strip()

    return read


def fetch_shape(endpoint: str, repo: str, revision: str, token: str | None, timeout: float) -> FoundShape:
    """config.json and the safetensors headers of one revision; raises on any failure."""
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    auth: str | bool = token or False  # False: never a token from the operator's own env
    headers = build_hf_headers(token=auth)

    def get(filename: str, rev: str) -> Any:
        url = hf_hub_url(repo, filename, revision=rev, endpoint=endpoint)
        response = get_session().get(url, headers=headers, timeout=timeout)
        hf_raise_for_status(response)
        return response

    response = get("config.json", revision)
    config = response.json()
    commit = response.headers.get("X-Repo-Commit") or revision
    api = HfApi(endpoint=endpoint)

    def count(name: str) -> int:
        meta = api.parse_safetensors_file_metadata(
            repo, name, revision=commit, token=auth, timeout=timeout
        )
        return sum(meta.parameter_count.values())

    parameters = _parameter_count(lambda name: get(name, commit), count)
    architecture = architecture_from_config(config, parameters or None)
    return FoundShape(f"hub:{repo}@{commit}", architecture)


def _parameter_count(get: Callable[[str], Any], count: Callable[[str], int]) -> int | None:
    """Sum of the safetensors headers' tensor sizes: the index's shards (read in
    parallel), else the one model.safetensors; None without safetensors (the count is
    then derived from the shape). Only headers are read (a ranged GET), never weights."""
    from huggingface_hub.errors import EntryNotFoundError

    try:
        index = get("model.safetensors.index.json").json()
    except EntryNotFoundError:
        try:
            return count("model.safetensors")
        except EntryNotFoundError:
            return None
    shards = sorted(set((index.get("weight_map") or {}).values()))
    if not shards:
        return None
    with cf.ThreadPoolExecutor(max_workers=min(8, len(shards))) as pool:
        return sum(pool.map(count, shards))


def describe_failure(exc: BaseException, repo: str, revision: str, endpoint: str) -> str:
    """Why the shape could not be read, in words a user can act on."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, TokenError):
        return str(exc)
    if isinstance(exc, GatedRepoError):
        return (
            f"{repo} is gated or private and the Hub refused the token "
            "(set spec.model.hfTokenSecretRef to a Secret with a token that has access)"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return f"the Hub at {endpoint} has no repository {repo} (or it needs a token)"
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo} has no revision {revision!r}"
    if isinstance(exc, ConfigError):
        return f"{repo}: {exc}"
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return f"the Hub at {endpoint} answered HTTP {status} for {repo}"
    if isinstance(exc, (TimeoutError, cf.TimeoutError)) or "Timeout" in type(exc).__name__:
        return f"the Hub at {endpoint} did not answer in time"  # ours, or httpx's Read/ConnectTimeout
    return f"the Hub at {endpoint} cannot be reached ({type(exc).__name__}: {exc})"


@dataclass
class _Entry:
    found: FoundShape
    expires: float


class HubShapes:
    """The operator's Hub shape lookups, cached; see the module docstring."""

    def __init__(
        self,
        read_token: ReadToken,
        endpoint: str | None = None,
        timeout: float = 3.0,
        retry_seconds: float = 30.0,
        refresh_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.refresh_seconds = refresh_seconds
        self._read_token = read_token
        self._clock = clock
        self._lock = threading.Lock()
        self._shapes: dict[tuple[str, str], _Entry] = {}
        self._failures: dict[tuple[Any, ...], _Entry] = {}
        self._inflight: dict[tuple[Any, ...], cf.Future[FoundShape]] = {}
        self._pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="hub-shape")

    def lookup(self, namespace: str, model: ModelSpec, revision: str = "main") -> FoundShape | None:
        """The shape of `model` (None when its source is not on the Hub)."""
        repo = hub_repo(model.source)
        if repo is None:
            return None
        ref = model.hf_token_secret
        key = (repo, revision)
        attempt = (repo, revision, namespace, ref)
        now = self._clock()
        with self._lock:
            cached = self._shapes.get(key) or self._failures.get(attempt)
            if cached is not None and now < cached.expires:
                return cached.found
            future = self._inflight.get(attempt)
            if future is None:
                # The worker stores its own result: a done-callback could run right here,
                # in this thread, while it holds the lock.
                future = self._pool.submit(self._fetch_and_store, key, attempt, namespace, ref)
                self._inflight[attempt] = future
        if cached is not None:
            return cached.found  # stale: answer now, the refresh lands for the next call
        try:
            return future.result(timeout=self.timeout)
        except cf.TimeoutError as exc:
            return FoundShape(
                f"hub:{repo}@{revision}",
                problem=describe_failure(exc, repo, revision, self.endpoint),
            )

    def _fetch(self, repo: str, revision: str, namespace: str, ref: SecretKeyRef | None) -> FoundShape:
        try:
            token = self._read_token(namespace, ref) if ref is not None else None
            return fetch_shape(self.endpoint, repo, revision, token, self.timeout)
        except Exception as exc:  # every failure is a reason on the condition, not a crash
            return FoundShape(
                f"hub:{repo}@{revision}", problem=describe_failure(exc, repo, revision, self.endpoint)
            )

    def _fetch_and_store(
        self, key: tuple[str, str], attempt: tuple[Any, ...], namespace: str, ref: SecretKeyRef | None
    ) -> FoundShape:
        found = self._fetch(key[0], key[1], namespace, ref)
        self._store(key, attempt, found)
        return found

    def _store(self, key: tuple[str, str], attempt: tuple[Any, ...], found: FoundShape) -> None:
        now = self._clock()
        with self._lock:
            self._inflight.pop(attempt, None)
            if found.architecture is not None:
                pinned = COMMIT.match(key[1]) is not None  # a commit's files never change
                expires = float("inf") if pinned else now + self.refresh_seconds
                self._shapes[key] = _Entry(found, expires)
                self._failures.pop(attempt, None)
            elif key in self._shapes:  # keep the last good shape; retry the Hub later
                self._shapes[key].expires = now + self.retry_seconds
            else:
                self._failures[attempt] = _Entry(found, now + self.retry_seconds)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
