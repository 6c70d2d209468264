"""Every benchmark script starts (`--help` runs its imports: siblings found the way
`python bench/x.py` finds them, the engine API it calls still there), and bench/ keeps to
its rules: no sys.path edits, nothing imported from tests/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
MODULES = sorted(BENCH.glob("*.py"))
SCRIPTS = [p for p in MODULES if 'if __name__ == "__main__":' in p.read_text()]


def test_the_scripts_are_found():
    names = {p.stem for p in SCRIPTS}
    assert {"offline_throughput", "seed_preemption", "serve_compare", "kernel_bench"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_script_starts(script: Path, tmp_path: Path):
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_no_sys_path_edits_and_no_test_imports(module: Path):
    tree = ast.parse(module.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert (node.value.id, node.attr) != ("sys", "path"), f"{module.name}:{node.lineno}"
        if isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert not any(n == "tests" or n.startswith("tests.") for n in names), f"{module.name}:{node.lineno}"
