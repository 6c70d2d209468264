"""A free local TCP port, for the processes the tests start (servers, operators, etcd)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nobody listens on now (the OS picks it; a race with another binder is rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
