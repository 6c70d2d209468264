"""Make `tests.support` and bench/router_workload.py importable (importlib import mode)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
for path in (str(ROOT), str(ROOT / "bench")):
    if path not in sys.path:
        sys.path.append(path)  # appended: the repository's operator/ never shadows the stdlib's
