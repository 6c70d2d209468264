"""The product's text describes the software, not the history of its making.

README.md, docs/, the CRD's descriptions and the source and test folders' comments must not cite
tracker issue numbers ("issue 7", "Issue #12"): a reader of the product has no tracker.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
ISSUE = re.compile(r"\bissues?\s*#?\d", re.IGNORECASE)
SOURCE_DIRS = ("server", "operator", "kernels", "router", "src", "hack", "bench", "scripts", "charts", "crds", "tests")
SOURCE_SUFFIXES = {".py", ".c", ".h", ".sh", ".yaml", ".yml", ".tpl", ".txt", ".md", ".json", ".toml"}


def issue_mentions(path: Path) -> list[str]:
    text = path.read_text(errors="replace")
    return [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if ISSUE.search(line)
    ]


def descriptions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                yield value
            else:
                yield from descriptions(value)
    elif isinstance(node, list):
        for item in node:
            yield from descriptions(item)


def test_pattern_catches_the_forms_it_is_meant_to():
    for text in ("issue 7", "Issue 12", "issue #22", "issues 18 and 26", "ISSUE#3"):
        assert ISSUE.search(text), text
    for text in ("tissue 7", "the issue is 7 ms", "issues a request"):
        assert not ISSUE.search(text), text


def test_readme_and_docs_cite_no_issue_numbers():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    assert len(pages) > 5
    assert [hit for page in pages for hit in issue_mentions(page)] == []


def test_crd_descriptions_cite_no_issue_numbers():
    for crd in (ROOT / "crds" / "llmservice.yaml", ROOT / "charts/llmservice-operator/crds/llmservice.yaml"):
        texts = list(descriptions(yaml.safe_load(crd.read_text())))
        assert texts, crd
        assert [t for t in texts if ISSUE.search(t)] == [], crd


def test_source_folders_cite_no_issue_numbers():
    files = [
        path
        for folder in SOURCE_DIRS
        if (ROOT / folder).is_dir()
        for path in sorted((ROOT / folder).rglob("*"))
        if path.is_file()
        and path.suffix in SOURCE_SUFFIXES
        and "results" not in path.parts
        and path != Path(__file__).resolve()  # its own examples of the pattern
    ]
    assert files
    assert [hit for path in files for hit in issue_mentions(path)] == []
