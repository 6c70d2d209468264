#!/usr/bin/env python3
"""Print every `vllm serve` argument of vLLM v0.11.0, read from vLLM's own argument parser.

Why: tests/unit/operator/test_render_vllm.py checks that the `vllm serve` command the
operator renders for `engine.kind: vllm` (operator/render_vllm.py, VLLM_VERSION) uses only
arguments that vLLM really has, with values it accepts. Its fixture,
tests/unit/operator/fixtures/vllm-serve-args.txt, is the output of this script:

    python hack/vllm-serve-args.py vllm-0.11.0.tar.gz > tests/unit/operator/fixtures/vllm-serve-args.txt

How: the vLLM sdist from PyPI is unpacked into a temporary folder, put first on sys.path and
imported; the `serve` subparser is built exactly as `vllm/entrypoints/cli/main.py` does
(FlexibleArgumentParser -> add_subparsers -> ServeSubcommand().subparser_init) and its
`_actions` are written out in the parser's order. vLLM's source is not edited. Two things
stand in for a GPU install: the compiled extension `vllm._C` (absent from the sdist) is an
empty module, and the current platform is set to vLLM's own CudaPlatform (what the
vllm/vllm-openai image resolves to) because DeviceConfig's default needs a device type.
Built-in platforms' `pre_register_and_update(parser)` is a no-op, so the platform changes
defaults only, never which flags or choices exist.

Environment (none of it goes into the repo's .venv): a throwaway venv that sees the repo's
packages (torch, transformers, fastapi, pydantic, openai, ...) plus vLLM's pure-Python and
small binary dependencies that the repo lacks:

    python3.11 -m venv /tmp/vllmenv
    echo /work/main/.venv/lib/python3.11/site-packages \
        > /tmp/vllmenv/lib/python3.11/site-packages/zz_main_venv.pth
    /tmp/vllmenv/bin/pip install -U pip "setuptools>=77" setuptools_scm
    /tmp/vllmenv/bin/pip install --no-deps cachetools py-cpuinfo msgspec cbor2 pybase64 \
        cloudpickle pyzmq blake3 setproctitle prometheus_client partial-json-parser \
        sentencepiece openai-harmony uvloop prometheus-fastapi-instrumentator watchfiles \
        python-multipart diskcache==5.6.3

Then, with the sdist fetched by this script (`--download DIR`; pip builds the sdist's
metadata on the way, hence setuptools>=77, setuptools_scm, --no-build-isolation and
VLLM_TARGET_DEVICE=empty; the URL is given directly because that build reports the version
as 0.11.0+empty, which `vllm==0.11.0` would reject):

    /tmp/vllmenv/bin/python hack/vllm-serve-args.py --download /tmp/vllm-src \
        > tests/unit/operator/fixtures/vllm-serve-args.txt

or with one downloaded already (a .tar.gz, checked against SDIST_SHA256; or the folder it
unpacks into, checked by PKG-INFO's version only):

    /tmp/vllmenv/bin/python hack/vllm-serve-args.py /tmp/vllm-src/vllm-0.11.0.tar.gz > ...

Output: comment lines start with `#`; then one flag per line, `FLAG[,ALIAS...] KIND`, KIND
being `{a,b,...}` (choices), `(switch)` (takes no value) or `VALUE`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import types
from collections.abc import Iterable, Iterator
from pathlib import Path

VERSION = "0.11.0"  # operator/render_vllm.py VLLM_VERSION, without the "v"
SDIST = f"vllm-{VERSION}.tar.gz"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/82/5a/"
    f"36d2351206f4d8d871b10780f874d03957985e08298d430cc837723e07af/{SDIST}"
)
SDIST_SHA256 = "f435a64c24e9c4178d657a76f8edd8548ddc444012f7d06a9f79ac3a6392bfae"
FIXTURE = "tests/unit/operator/fixtures/vllm-serve-args.txt"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(folder: Path) -> Path:
    """Fetch the sdist from PyPI with pip into folder; return its path."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="empty")
    cmd = [sys.executable, "-m", "pip", "download", SDIST_URL, "--no-deps"]
    cmd += ["--no-build-isolation", "-d", str(folder)]
    subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)
    return folder / SDIST


def unpack(sdist: Path, into: Path) -> Path:
    """Check sdist against the pinned hash and unpack it; return the source tree."""
    got = sha256(sdist)
    if got != SDIST_SHA256:
        sys.exit(f"{sdist}: sha256 {got}, expected {SDIST_SHA256} (vLLM {VERSION} from PyPI)")
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    return into / f"vllm-{VERSION}"


def check_tree(tree: Path) -> None:
    pkg_info = (tree / "PKG-INFO").read_text()
    if f"\nVersion: {VERSION}\n" not in pkg_info:
        sys.exit(f"{tree}: PKG-INFO is not vLLM {VERSION}")


def serve_parser(tree: Path) -> tuple[argparse.ArgumentParser, set[argparse.Action]]:
    """Build `vllm serve`'s parser from the source tree; also return its deprecated actions."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    sys.path.insert(0, str(tree))
    # vLLM logs to stdout: keep stdout for the fixture while importing and building.
    with contextlib.redirect_stdout(sys.stderr):
        sys.modules["vllm._C"] = types.ModuleType("vllm._C")  # the sdist has no binaries
        import vllm
        import vllm.platforms
        from vllm.utils import FlexibleArgumentParser, resolve_obj_by_qualname

        if not Path(vllm.__file__).is_relative_to(tree):
            sys.exit(f"imported {vllm.__file__}, not vLLM from {tree}")
        platform = resolve_obj_by_qualname("vllm.platforms.cuda.CudaPlatform")
        vllm.platforms._current_platform = platform()

        from vllm.entrypoints.cli.serve import ServeSubcommand

        top = FlexibleArgumentParser(description="vLLM CLI")
        subparsers = top.add_subparsers(required=False, dest="subparser")
        parser = ServeSubcommand().subparser_init(subparsers)
    return parser, set(FlexibleArgumentParser._deprecated)


def choices(action: argparse.Action) -> list[str] | None:
    """The values of a flag: argparse's choices, else a list metavar (a str-typed Literal)."""
    values: Iterable[object] | None = action.choices
    if values is None and isinstance(action.metavar, list | tuple):
        values = action.metavar
    if values is None:
        return None
    out: list[str] = []
    for value in values:  # --collect-detailed-traces also lists "model,worker" combinations
        for part in str(value).split(","):
            if part not in out:
                out.append(part)
    return out


def names(action: argparse.Action) -> list[str]:
    """Long options first (the main flag), then short aliases, each in the parser's order."""
    long = [s for s in action.option_strings if s.startswith("--")]
    return long + [s for s in action.option_strings if s not in long]


def kind(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "(switch)"
    values = choices(action)
    return "{" + ",".join(values) + "}" if values is not None else "VALUE"


def lines(parser: argparse.ArgumentParser, deprecated: set[argparse.Action]) -> Iterator[str]:
    flags = [a for a in parser._actions if a.option_strings]
    positionals = [a.dest for a in parser._actions if not a.option_strings]
    metavar_choices = [names(a)[0] for a in flags if a.choices is None and choices(a)]
    optional_value = [names(a)[0] for a in flags if a.nargs == "?"]
    many_values = [
        names(a)[0] for a in flags if a.nargs in ("+", "*") or isinstance(a, argparse._AppendAction)
    ]
    old = [names(a)[0] for a in flags if a in deprecated]
    fixed = f"""\
`vllm serve` arguments of vLLM v{VERSION} (image vllm/vllm-openai:v{VERSION}, the operator's
default for engine.kind: vllm; operator/render_vllm.py VLLM_VERSION).
Source: PyPI sdist {SDIST}, sha256 {SDIST_SHA256}
Generated, not typed, by:
  python hack/vllm-serve-args.py {SDIST} > {FIXTURE}
(the venv it needs: that script's docstring)."""
    notes = [
        "It imports vLLM from the unpacked sdist, builds the `serve` subparser as "
        "vllm/entrypoints/cli/main.py does (make_arg_parser: FrontendArgs, AsyncEngineArgs) "
        f"and walks its _actions: {len(flags)} flags, in the parser's order.",
        f"Not listed: the positional {', '.join(positionals)} (MODEL); the spellings vLLM's "
        "FlexibleArgumentParser also accepts (--max_model_len for --max-model-len, "
        "--json-arg.key VALUE and --json-arg.key+ VALUE for JSON arguments, -O3 and "
        "-O.level for --compilation-config).",
        "Choices that also accept any string (a str-typed Literal; the braces are vLLM's "
        f"documented metavar): {', '.join(metavar_choices)}.",
        f"Taking several values (nargs + or append): {', '.join(many_values)}.",
        f"Optional value (nargs ?): {', '.join(optional_value)}.",
        f"Deprecated: {', '.join(old) or 'none'}.",
        "A flag missing here is treated as not vLLM's by test_render_vllm.py.",
        "One flag per line: FLAG[,ALIAS...] [{CHOICE,...} | VALUE | (switch)]",
    ]
    header = fixed.splitlines()
    for note in notes:
        header += textwrap.wrap(note, 92, break_long_words=False, break_on_hyphens=False)
    for line in header:
        yield f"# {line}"
    for action in flags:
        yield f"{','.join(names(action))} {kind(action)}"


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("source", nargs="?", type=Path, help=f"{SDIST} or the folder it unpacks into")
    cli.add_argument("--download", type=Path, metavar="DIR", help=f"fetch {SDIST} into DIR first")
    args = cli.parse_args()
    if args.download:
        args.source = download(args.download)
    if args.source is None:
        cli.error(f"give {SDIST} (or its unpacked folder), or --download DIR")
    with tempfile.TemporaryDirectory(prefix="vllm-src-") as tmp:
        tree = args.source if args.source.is_dir() else unpack(args.source, Path(tmp))
        check_tree(tree.resolve())
        parser, deprecated = serve_parser(tree.resolve())
        for line in lines(parser, deprecated):
            print(line)


if __name__ == "__main__":
    main()
