"""Child processes that cannot outlive the test run.

The machine is shared: a pytest killed by a timeout must not leave an apiserver, etcd or
a model server running. Linux's PR_SET_PDEATHSIG asks the kernel to SIGTERM the child
when the thread that started it exits.
"""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """`preexec_fn` for subprocess.Popen (runs in the child before exec)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
