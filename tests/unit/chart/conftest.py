"""Fixtures for the chart tests: the real helm (or a skip / failure that says why)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.unit.chart.helm import Helm, require_helm  # noqa: E402


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(require_helm(), tmp_path_factory.mktemp("helm-home"))
