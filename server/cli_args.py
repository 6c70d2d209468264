"""`llmservice serve`'s command line, built from the option definitions in config.py.

Three directions, one definition: `add_serve_args` (argparse), `configs_from_args` (the
parsed flags -> EngineConfig + ServerArgs, refusing what capabilities.py says this build
cannot run) and `to_argv` (field values -> flags, for the operator's pod command).
`parse_serve_argv` parses exactly as `serve` does but raises instead of exiting, so the
operator can ask "would this pod start?" before it creates one. No torch here.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmservice.server.argspec import Option, options
from llmservice.server.capabilities import Unsupported, unsupported
from llmservice.server.config import ConfigError, EngineConfig, ServerArgs
from llmservice.server.model.registry import BUILTIN_PREFIX

SERVE_OPTIONS: tuple[Option, ...] = tuple(options(EngineConfig, ServerArgs))
BY_NAME: dict[str, Option] = {o.name: o for o in SERVE_OPTIONS}


class UnsupportedError(ConfigError):
    """A value this build cannot run (see capabilities.py); `problem` says which."""

    def __init__(self, problem: Unsupported) -> None:
        self.problem = problem
        name = BY_NAME[problem.arg].arg.flag
        super().__init__(f"{name} {problem.value}: {problem.reason}; use {problem.supported}")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """Every option of config.py as an argparse argument, vLLM's spelling."""
    for o in SERVE_OPTIONS:
        a = o.arg
        kwargs: dict[str, Any] = {
            "default": o.default,
            "help": argparse.SUPPRESS if a.hidden else a.help,
        }
        if a.type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif a.type is not str:
            kwargs["type"] = a.type
        if a.choices is not None:
            kwargs["choices"] = a.choices
        if a.nargs is not None:
            kwargs["nargs"] = a.nargs
        if a.positional:
            assert a.flag == o.name, f"positional {a.flag!r} must be named like its field"
            p.add_argument(a.flag, **kwargs)
        else:
            p.add_argument(a.flag, *a.aliases, dest=o.name, **kwargs)


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"llmservice serve: {message}")


@functools.cache
def _strict_parser() -> argparse.ArgumentParser:
    parser = _RaisingParser(prog="llmservice serve", add_help=False)
    add_serve_args(parser)
    return parser


def parse_serve_argv(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments after `llmservice serve`, parsed as `serve` parses them; a mistake
    (unknown flag, bad value) raises ConfigError instead of exiting."""
    return _strict_parser().parse_args(list(argv))


def resolve_model_ref(model: str, download_dir: str | None) -> str:
    """A relative path is looked up in --download-dir first."""
    if download_dir and not model.startswith(BUILTIN_PREFIX) and not Path(model).is_absolute():
        candidate = Path(download_dir) / model
        if candidate.exists():
            return str(candidate)
    return model


API_KEY_ENV = ("LLMSERVICE_API_KEY", "VLLM_API_KEY")


def api_key_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """--api-key's fallback (the operator sets LLMSERVICE_API_KEY from a Secret, so the
    key never shows in the pod's command line); an empty variable counts as unset."""
    env = os.environ if environ is None else environ
    for name in API_KEY_ENV:
        if env.get(name):
            return env[name]
    return None


def _values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for o in options(cls):
        value = getattr(args, o.name)
        out[o.name] = o.arg.from_cli(value) if o.arg.from_cli else value
    return out


def configs_from_args(args: argparse.Namespace) -> tuple[EngineConfig, ServerArgs]:
    """What `serve` starts with; ConfigError (UnsupportedError for what this build cannot
    run) names the flag to change."""
    values = _values(ServerArgs, args)
    if values.get("api_key") is None:
        values["api_key"] = api_key_from_env()
    server = ServerArgs(**values)
    problem = unsupported(args.model, args.tensor_parallel_size)
    if problem is not None:
        raise UnsupportedError(problem)
    engine = _values(EngineConfig, args)
    engine["model"] = resolve_model_ref(args.model, server.download_dir)
    return EngineConfig(**engine), server


def _text(value: Any) -> str:
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def to_argv(values: Mapping[str, Any]) -> list[str]:
    """`{"block_size": 16, "enable_prefix_caching": False}` -> `--block-size 16
    --no-enable-prefix-caching`, in the mapping's order; None values are left out (the
    server's default applies). A name config.py does not define is a KeyError."""
    argv: list[str] = []
    for name, value in values.items():
        if name not in BY_NAME:
            raise KeyError(f"{name!r} is not an option of llmservice serve (server/config.py)")
        a = BY_NAME[name].arg
        if value is None:
            continue
        if a.positional:
            argv.append(_text(value))
        elif a.type is bool:
            argv.append(a.flag if value else f"--no-{a.flag.removeprefix('--')}")
        else:
            items = value if isinstance(value, (list, tuple)) else [value]
            argv += [a.flag, *map(_text, items)]
    return argv
