"""A Hugging Face Hub-compatible HTTP endpoint on 127.0.0.1 for tests (no network).

Point `HF_ENDPOINT` at `hub.base_url` and `huggingface_hub` (snapshot_download,
hf_hub_download, HfApi.model_info, transformers' from_pretrained) talks to this server.
It answers only the requests huggingface_hub makes and logs each as
`"METHOD /path"` in `hub.requests` (query strings dropped), so a test can pin the list.

    from tests.support.hub_endpoint import HubEndpoint, tiny_models

    with HubEndpoint() as hub:                      # starts on a free port
        hub.add_repo("org/llama", folder)           # serve a saved model folder
        hub.add_repo("org/private", folder, status=401)   # gated: 401 + X-Error-Code GatedRepo
        # any repo never added answers 404 + X-Error-Code RepoNotFound
        hub.cut("org/llama", "model.safetensors", at=1000, times=1)  # drop the connection
        ...                                         # after 1000 bytes of that file, once
        hub.stop()                                  # connection refused from now on
        hub.start()                                 # same port again

    models = tiny_models(tmp_dir)   # {"llama3", "mistral", "qwen2", "qwen3", "sharded",
                                    #  "bin_only", "unknown_arch"} -> saved folder

Pytest: `hub_models` (session, the folders above, built once in a tmp dir) and `hub`
(session, an endpoint serving every folder as `tiny/<name>` plus `tiny/gated` (401));
import both into a conftest or test module. Each repo is at one fake commit (40 hex digits,
derived from its name); `revision` may be `main`, that commit, or any name passed to
`add_repo(..., revisions=...)`.

Tiny random models are saved with transformers (fp32, hidden 64, 2 layers), so tests can
compare against transformers on the very same weights.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

CHUNK = 64 * 1024


@dataclass
class Repo:
    repo_id: str
    folder: Path
    status: int = 200  # 401: gated (needs a token)
    revisions: tuple[str, ...] = ("main",)

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.repo_id.encode()).hexdigest()

    def files(self) -> list[Path]:
        return sorted(p for p in self.folder.rglob("*") if p.is_file())

    def rel(self, path: Path) -> str:
        return path.relative_to(self.folder).as_posix()


def _etag(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class _Cut:
    at: int
    times: int


@dataclass
class HubEndpoint:
    """The endpoint; see the module docstring."""

    port: int = 0
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # one per request, same order, lower-case names
    cuts: dict[tuple[str, str], _Cut] = field(default_factory=dict)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- control ---------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_repo(
        self, repo_id: str, folder: Path, status: int = 200, revisions: tuple[str, ...] = ("main",)
    ) -> Repo:
        repo = Repo(repo_id, Path(folder), status, revisions)
        self.repos[repo_id] = repo
        return repo

    def cut(self, repo_id: str, filename: str, at: int, times: int = 1) -> None:
        """The next `times` GETs of that file close the connection after `at` bytes
        (counted from the start of the file, whatever Range was asked)."""
        self.cuts[(repo_id, filename)] = _Cut(at, times)

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()
            self.headers.clear()

    def start(self) -> HubEndpoint:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HubEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- lookup ----------------------------------------------------------------------
    def _log(self, method: str, path: str, headers: dict[str, str]) -> None:
        with self._lock:
            self.requests.append(f"{method} {path}")
            self.headers.append(headers)

    def _resolve(self, repo: Repo, revision: str) -> bool:
        return revision in repo.revisions or revision == repo.sha


def _handler(hub: HubEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        # -- replies --
        def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, obj: Any, headers: dict[str, str] | None = None) -> None:
            self._reply(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self._reply(status, body, {"Content-Type": "application/json", "X-Error-Code": code,
                                       "X-Error-Message": message})

        def _repo(self, repo_id: str, revision: str | None) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            if repo.status == 401 and not self.headers.get("Authorization"):
                self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in.")
                return None
            if revision is not None and not hub._resolve(repo, revision):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return None
            return repo

        # -- routes --
        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            hub._log(self.command, path, {k.lower(): v for k, v in self.headers.items()})
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id = "/".join(parts[2:4])
                rest = parts[4:]
                if rest[:1] == ["revision"] and len(rest) >= 2:
                    return self._model_info(repo_id, "/".join(rest[1:]))
                if not rest:
                    return self._model_info(repo_id, "main")
                if rest[:1] == ["tree"] and len(rest) >= 2:
                    return self._tree(repo_id, rest[1], "/".join(rest[2:]))
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._file(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]))
            self._error(404, "EntryNotFound", f"no route {path}")

        def _model_info(self, repo_id: str, revision: str) -> None:
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            self._json({
                "_id": repo.sha[:24], "id": repo_id, "modelId": repo_id, "sha": repo.sha,
                "private": False, "gated": repo.status == 401, "disabled": False, "tags": [],
                "siblings": [{"rfilename": repo.rel(p)} for p in repo.files()],
            })

        def _tree(self, repo_id: str, revision: str, under: str) -> None:
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            entries = []
            for p in repo.files():
                rel = repo.rel(p)
                if under and not rel.startswith(under.rstrip("/") + "/"):
                    continue
                size = p.stat().st_size
                entry: dict[str, Any] = {"type": "file", "path": rel, "size": size,
                                         "oid": hashlib.sha1(rel.encode() + repo.sha.encode()).hexdigest()}
                if p.suffix in (".safetensors", ".bin", ".gguf"):
                    entry["lfs"] = {"oid": _etag(p), "size": size, "pointerSize": 134}
                entries.append(entry)
            self._json(entries)

        def _file(self, repo_id: str, revision: str, filename: str) -> None:
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            file = repo.folder / filename
            if not file.is_file():
                self._error(404, "EntryNotFound", f"{filename} does not exist at {revision}")
                return
            size = file.stat().st_size
            etag = _etag(file)
            headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            if file.suffix in (".safetensors", ".bin", ".gguf"):
                headers["X-Linked-Etag"] = f'"{etag}"'
                headers["X-Linked-Size"] = str(size)
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng.removeprefix("bytes=").split("-")[0] or 0)
            status = 206 if start else 200
            if start:
                headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(size - start))
            self.end_headers()
            if self.command == "HEAD":
                return
            cut = hub.cuts.get((repo_id, filename))
            stop_at = size
            if cut is not None and cut.times > 0 and cut.at > start:
                cut.times -= 1
                stop_at = cut.at
            with file.open("rb") as f:
                f.seek(start)
                pos = start
                while pos < stop_at:
                    chunk = f.read(min(CHUNK, stop_at - pos))
                    self.wfile.write(chunk)
                    pos += len(chunk)
            if stop_at < size:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)

    return Handler


# ---- tiny random models ------------------------------------------------------------------
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, vocab_size=None)

SPECS: dict[str, dict[str, Any]] = {
    "llama3": dict(cls="LlamaForCausalLM", config="LlamaConfig", tie_word_embeddings=False,
                   rope_theta=500000.0, bos_token_id=1, eos_token_id=[2, 3],
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": dict(cls="MistralForCausalLM", config="MistralConfig", tie_word_embeddings=False,
                    sliding_window=None, bos_token_id=1, eos_token_id=2),
    "qwen2": dict(cls="Qwen2ForCausalLM", config="Qwen2Config", tie_word_embeddings=True,
                  bos_token_id=None, eos_token_id=2, rope_theta=1000000.0),
    "qwen3": dict(cls="Qwen3ForCausalLM", config="Qwen3Config", tie_word_embeddings=True,
                  head_dim=32, bos_token_id=None, eos_token_id=2, rope_theta=1000000.0),
}
SHARDED = "llama3"  # the architecture of the `sharded` repo (saved into >= 3 files)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer(folder: Path) -> int:
    """A small byte-level BPE tokenizer.json + tokenizer_config.json; returns the vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, special_tokens=["<unk>", "<s>", "</s>", "<|eot|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    text = ["The capital of France is Paris. " * 4, "Hello world, how are you today? " * 4,
            "def f(x): return x + 1\n" * 4]
    tok.train_from_iterator(text, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast",
    }))
    return tok.get_vocab_size()


def save_tiny_model(folder: Path, spec: dict[str, Any], seed: int, max_shard_size: str | None = None,
                    safe: bool = True) -> Path:
    """Save one random model (fp32) with transformers, plus tokenizer and generation config."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = tiny_tokenizer(folder)
    spec = dict(spec)
    cls, cfg_cls = spec.pop("cls"), spec.pop("config")
    config = getattr(transformers, cfg_cls)(**{**_COMMON, "vocab_size": vocab, **spec})
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(config).to(torch.float32).eval()
    kwargs: dict[str, Any] = {"safe_serialization": safe}
    if max_shard_size:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(folder, **kwargs)
    gen = folder / "generation_config.json"
    if not gen.exists():
        gen.write_text(json.dumps({"eos_token_id": spec.get("eos_token_id")}))
    return folder


def tiny_models(root: Path) -> dict[str, Path]:
    """Every test repo's folder under `root` (built once; reused when already there)."""
    import torch

    root = Path(root)
    out: dict[str, Path] = {}
    for i, (name, spec) in enumerate(SPECS.items()):
        out[name] = root / name
        if not (out[name] / "config.json").exists():
            save_tiny_model(out[name], spec, seed=i)
    out["sharded"] = root / "sharded"
    if not (out["sharded"] / "config.json").exists():
        save_tiny_model(out["sharded"], SPECS[SHARDED], seed=10, max_shard_size="60KB")
    out["bin_only"] = root / "bin_only"
    if not (out["bin_only"] / "config.json").exists():
        save_tiny_model(out["bin_only"], SPECS["mistral"], seed=11)
        weights = out["bin_only"] / "model.safetensors"
        from safetensors.torch import load_file

        torch.save(load_file(str(weights)), out["bin_only"] / "pytorch_model.bin")
        weights.unlink()
    out["unknown_arch"] = root / "unknown_arch"
    if not (out["unknown_arch"] / "config.json").exists():
        save_tiny_model(out["unknown_arch"], SPECS["mistral"], seed=12)
        cfg_file = out["unknown_arch"] / "config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg["architectures"], cfg["model_type"] = ["FancyNewForCausalLM"], "fancy_new"
        cfg_file.write_text(json.dumps(cfg))
    return out


def serve_all(hub: HubEndpoint, models: dict[str, Path], org: str = "tiny") -> None:
    """`org/<name>` for every folder, plus `org/gated` (401 without a token)."""
    for name, folder in models.items():
        hub.add_repo(f"{org}/{name}", folder)
    hub.add_repo(f"{org}/gated", models["llama3"], status=401)


@pytest.fixture(scope="session")
def hub_models(tmp_path_factory) -> dict[str, Path]:
    return tiny_models(tmp_path_factory.mktemp("hub-models"))


@pytest.fixture(scope="session")
def hub(hub_models) -> Iterator[HubEndpoint]:
    with HubEndpoint() as endpoint:
        serve_all(endpoint, hub_models)
        yield endpoint
