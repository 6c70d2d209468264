"""The operator image has no torch: every operator module, the server modules it shares
(option definitions, parser, capabilities) and `operator render` import without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "numpy", "triton", "fastapi", "tokenizers", "gguf")


def test_operator_modules_and_render_import_no_torch():
    modules = sorted(p.stem for p in (ROOT / "operator").glob("*.py") if p.stem != "__init__")
    assert {"engine_support", "render_cli", "admission", "spec"} <= set(modules)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module('llmservice.operator.' + name)\n"
        "from llmservice.operator.render_cli import main\n"
        "assert main(['-f', 'examples/smollm2-cpu.yaml']) == 0\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "[]"
