"""README.md and docs/ stay true: the generated CRD reference, the commands, the files they name."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()


def generator():
    spec = importlib.util.spec_from_file_location(
        "gen_crd_reference", ROOT / "hack" / "gen-crd-reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def crd_paths() -> set[str]:
    gen = generator()
    schema = yaml.safe_load((ROOT / "crds" / "llmservice.yaml").read_text())["spec"]["versions"][0]
    props = schema["schema"]["openAPIV3Schema"]["properties"]
    return {p for part in ("spec", "status") for p, _, _ in gen.walk(props[part], part)}


def test_crd_reference_is_up_to_date():
    done = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen-crd-reference.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_crd_reference_lists_every_field_with_a_description():
    gen = generator()
    section, missing = gen.generate()
    assert missing == []
    for path in crd_paths():
        assert f"| `{path}` |" in section, path
    assert "gpuMemoryUtilization must lie in [0.5, 0.95]" in section  # the CEL rules too


def test_fallback_descriptions_name_only_existing_fields():
    assert set(generator().FALLBACK) <= crd_paths()


def test_quickstart_keeps_the_two_commands():
    assert "make test   # creates .venv" in README
    assert "make run    # same install" in README


def test_every_make_target_in_the_readme_exists():
    makefile = (ROOT / "Makefile").read_text()
    defined = set(re.findall(r"^([A-Za-z][\w-]*):", makefile, re.MULTILINE))
    listed = set(re.findall(r"^\| `make ([\w-]+)` \|", README, re.MULTILINE))
    assert {
        "test",
        "run",
        "test-slow",
        "test-cluster",
        "bench",
        "bench-seeds",
        "bench-peers",
        "e2e-kind",
    } <= listed
    # e2e-kind's recipe lives in hack/e2e-kind.sh; the Makefile line is added by its owner.
    assert listed - {"e2e-kind"} <= defined, sorted(listed - defined)
    if "e2e-kind" in defined:
        assert "hack/e2e-kind.sh" in makefile


def test_readme_is_a_front_page():
    """The manual lives in docs/; the README keeps the quickstart, the install, one table, links."""
    assert len(README.splitlines()) <= 150
    assert "## What it does" in README
    assert "(docs/reference.md)" in README


def test_links_in_docs_resolve():
    """Relative links of docs/*.md point at files that exist (relative to the page)."""
    broken = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                broken.append(f"{page.name}: {target}")
    assert broken == []


def test_files_the_readme_names_exist():
    named = set(
        re.findall(
            r"\b((?:examples|docs|hack|charts|dashboards|crds)/[\w./-]+\.(?:yaml|md|sh|json|py))",
            README,
        )
    )
    named |= set(re.findall(r"\((docs/[\w.-]+\.md)\)", README))
    assert named
    assert [n for n in named if not (ROOT / n).exists()] == []


def test_python_example_parses_and_uses_the_served_model():
    (code,) = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    ast.parse(code)
    assert 'model="builtin:smollm2-135m"' in code
    assert "builtin:smollm2-135m" in (ROOT / "Makefile").read_text()


def test_e2e_kind_script_is_valid_bash_and_uses_the_repos_files():
    script = ROOT / "hack" / "e2e-kind.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    for path in (
        "Dockerfile.server",
        "Dockerfile.operator",
        "charts/llmservice-operator",
        "examples/smollm2-cpu.yaml",
    ):
        assert path in text and (ROOT / path).exists(), path
    # The operator Deployment's name the script waits for is the chart's for release "llmservice".
    assert "deployment/llmservice-llmservice-operator" in text
