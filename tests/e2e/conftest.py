"""Make `tests.support` importable (pytest runs with --import-mode=importlib), and keep
the scenarios opt-in: they run only when `-m` names e2e (`make e2e`), not in `pytest tests`."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "e2e" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="opt-in end-to-end scenario: make e2e (pytest -m e2e)")
    for item in items:
        if item.get_closest_marker("e2e"):
            item.add_marker(skip)
