"""One `llmservice serve` option, described once, as dataclass field metadata.

`server/config.py` declares every option as a field whose metadata is an `Arg`: the
vLLM flag name, the argparse type and choices, the help text and the LLMService field
(`crd`, a path under `spec`). argparse (`server/cli_args.py`), the operator's rendered
command (`operator/render.py`) and the CRD contract test all read that one description,
so a flag, its default and its CRD field cannot drift apart. No third-party imports: the
operator image (no torch) imports this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

ARG = "llmservice.arg"


@dataclass(frozen=True)
class CRDDefault:
    """The CRD's default where it deliberately differs from the server's; `why` says why.

    `value=None`: the CRD has no default there (e.g. a required field).
    """

    value: Any
    why: str


@dataclass(frozen=True)
class Arg:
    flag: str  # "--block-size"; a positional argument's name has no dashes ("model")
    help: str = ""
    type: Callable[[str], Any] = str  # bool: a --x / --no-x switch (BooleanOptionalAction)
    choices: tuple[Any, ...] | None = None
    crd: str | None = None  # the LLMService field under `spec`, e.g. "engine.blockSize"
    crd_default: CRDDefault | None = None  # None: the CRD's default is the server's
    nargs: str | None = None
    aliases: tuple[str, ...] = ()
    hidden: bool = False  # accepted, not listed in --help (tests and benchmarks)
    from_cli: Callable[[Any], Any] | None = None  # argparse value -> field value

    @property
    def positional(self) -> bool:
        return not self.flag.startswith("-")


def arg(default: Any, flag: str, help: str = "", **kwargs: Any) -> Any:
    """A dataclass field carrying its command-line description (see `Arg`)."""
    return field(default=default, metadata={ARG: Arg(flag, help, **kwargs)})


def first(values: list[str] | None) -> str | None:
    """`--served-model-name a b`: the engine reports the first name."""
    return values[0] if values else None


@dataclass(frozen=True)
class Option:
    """A field of an options dataclass with its `Arg` and default."""

    name: str
    arg: Arg
    default: Any
    owner: type

    @property
    def crd_default(self) -> Any:
        """What the CRD must default this field to (None: no default in the CRD)."""
        return self.default if self.arg.crd_default is None else self.arg.crd_default.value


def options(*classes: type) -> Iterator[Option]:
    """Every field with an `Arg` of the given dataclasses, in declaration order."""
    for cls in classes:
        for f in dataclasses.fields(cls):
            if ARG in f.metadata:
                yield Option(f.name, f.metadata[ARG], f.default, cls)
