"""`llmservice serve` of an HF folder with a shard cut short: one line naming the shard,
no traceback, a non-zero exit before the port is bound."""

from __future__ import annotations

import os
import subprocess

from tests.support.hub_endpoint import SHARDED, SPECS, save_tiny_model
from tests.support.server_process import BIN, free_port

START_TIMEOUT_S = 300  # generous: a loaded machine imports torch slowly; the error comes at load


def test_serve_of_a_truncated_shard_prints_one_error_naming_it(tmp_path):
    folder = save_tiny_model(tmp_path / "llama", SPECS[SHARDED], seed=0, max_shard_size="60KB")
    shards = sorted(folder.glob("*.safetensors"))
    assert len(shards) >= 2
    victim = shards[1]
    os.truncate(victim, victim.stat().st_size // 2)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [str(BIN), "serve", str(folder), "--host", "127.0.0.1", "--port", str(free_port()),
         "--max-model-len", "128", "--kv-cache-memory-gib", "0.01", "--num-threads", "1"],
        capture_output=True, text=True, env=env, timeout=START_TIMEOUT_S,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: CorruptShardError: {victim}: truncated or corrupt safetensors file "
                      "(incomplete metadata, file not fully covered); copy or download it again"], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "serving" not in done.stderr  # it never started listening
