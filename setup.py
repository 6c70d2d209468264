"""Package discovery for the folders pyproject.toml's package-dir maps into `llmservice`.

setuptools' `find` names what it finds after the folder it searched (`engine`, not
`llmservice.server.engine`), and a hand-written list drops a new sub-package from the
wheel and the images without a word. Every folder under a mapped root that holds a
module is a package here; tests/unit/packaging builds the wheel and checks it.
Everything else about the project is in pyproject.toml.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def discover(package_dir: dict[str, str]) -> list[str]:
    """`llmservice.server.engine` for server/engine/, and so on under every mapped root."""
    packages = set()
    for name, folder in package_dir.items():
        root = ROOT / folder
        for module in root.rglob("*.py"):
            parts = module.parent.relative_to(root).parts
            if not any(p.startswith((".", "__")) for p in parts):
                packages.add(".".join((name, *parts)))
    return sorted(packages)


if __name__ == "__main__":
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setup(packages=discover(config["tool"]["setuptools"]["package-dir"]))
