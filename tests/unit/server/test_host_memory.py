"""The command line asks torch for transparent huge pages before torch is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llmservice.server import host_memory

SMAPS = "AnonHugePages:"


def test_set_when_torch_is_not_imported_and_the_user_did_not_choose(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as in a fresh `llmservice` process
    env: dict[str, str] = {}
    assert host_memory.prefer_huge_pages(env) is True
    assert env == {host_memory.ENV: "1"}


def test_the_users_choice_stands(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    env = {host_memory.ENV: "0"}
    assert host_memory.prefer_huge_pages(env) is False
    assert env == {host_memory.ENV: "0"}


def test_too_late_once_torch_is_imported():
    import torch  # noqa: F401

    env: dict[str, str] = {}
    assert host_memory.prefer_huge_pages(env) is False
    assert env == {}


def _huge_kib_after_a_256_mib_tensor(code_before: str) -> int:
    """Run a fresh interpreter that allocates 256 MiB with torch; its AnonHugePages."""
    script = (
        f"{code_before}\nimport torch\na = torch.ones(64 << 20)\n"
        f"print(open('/proc/self/smaps_rollup').read().split('{SMAPS}')[1].split()[0])"
    )
    env = {k: v for k, v in os.environ.items() if k != host_memory.ENV}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def test_the_cli_entry_gets_torch_huge_pages_where_the_kernel_allows():
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    mode = thp.read_text() if thp.exists() else "[never]"
    with_cli = _huge_kib_after_a_256_mib_tensor("import llmservice.server.cli as c; c.prefer_huge_pages()")
    if "[never]" in mode:  # the kernel refuses huge pages: the variable changes nothing
        assert with_cli == 0
    else:  # madvise or always: the allocator's madvise gets them
        assert with_cli >= 128 * 1024
