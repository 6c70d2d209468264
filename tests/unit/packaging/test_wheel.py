"""The wheel (and so the images, which `pip install .`) holds every module of every
mapped folder: a new sub-package under server/, kernels/ or operator/ cannot be left out.

Built once per module from a copy of what the build reads, so the checkout's build/ and
egg-info stay untouched.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BUILD_INPUTS = ["pyproject.toml", "setup.py", "README.md"]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]


def expected_files() -> set[str]:
    """Every .py file under each mapped folder, named as it lands in the wheel."""
    names = set()
    for package, folder in PACKAGE_DIR.items():
        prefix = package.replace(".", "/")
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder)
            if not any(part.startswith((".", "__pycache__")) for part in rel.parts):
                names.add(f"{prefix}/{rel.as_posix()}")
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, src / name)
    for folder in {f.split("/")[0] for f in PACKAGE_DIR.values()}:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = out.glob("llmservice-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def test_every_module_of_every_mapped_folder_is_in_the_wheel(wheel: zipfile.ZipFile):
    expected = expected_files()
    assert {"llmservice/server/engine/engine.py", "llmservice/kernels/ops.py",
            "llmservice/operator/render.py", "llmservice/cli.py"} <= expected  # fmt: skip
    assert sorted(expected - set(wheel.namelist())) == []


def test_the_wheel_holds_nothing_from_outside_the_package(wheel: zipfile.ZipFile):
    tops = {n.split("/")[0] for n in wheel.namelist()}
    assert tops == {"llmservice", f"llmservice-{PYPROJECT['project']['version']}.dist-info"}, tops


def test_the_console_script_is_declared(wheel: zipfile.ZipFile):
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert re.search(r"^llmservice = llmservice\.cli:main$", wheel.read(entry_points).decode(), re.M)


@pytest.mark.parametrize("dockerfile", ["Dockerfile.server", "Dockerfile.operator"])
def test_images_copy_what_the_build_reads(dockerfile: str):
    """`pip install .` in the image runs setup.py's discovery: it must be there."""
    copied = set()
    for line in (ROOT / dockerfile).read_text().splitlines():
        if line.startswith("COPY "):
            copied |= set(line.split()[1:-1])
    assert [name for name in BUILD_INPUTS if name not in copied] == []


def test_the_cpu_kernel_sources_are_in_the_wheel(wheel: zipfile.ZipFile):
    """kernels/cpu_native.py compiles them at first use (package-data in pyproject.toml),
    with the headers they include (cpu_math.h)."""
    kernels = ROOT / "kernels"
    sources = {f"llmservice/kernels/{p.name}" for p in [*kernels.glob("*.c"), *kernels.glob("*.h")]}
    assert any(s.endswith(".h") for s in sources)
    assert sorted(sources - set(wheel.namelist())) == []
