"""What the Gateway API Inference Extension's endpoint picker scrapes, on a real server.

The requirements are read from the pinned module's model-server protocol document
(docs/proposals/003-model-server-protocol/README.md, fetched by hack/fetch-gateway-crds.sh):
every metric of its table under its vLLM name and type, with the labels it names, and the
values meaning what the table says (queue, running, KV fraction, block size, block
count). Its LoRA metric is required only of servers that serve LoRA adapters: it is
checked on a server started with --enable-lora, once the server has that flag.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway_crds import protocol_doc
from tests.support.model_server_protocol import lora_metric, metric_table
from tests.support.server_process import ServerProcess

MODEL = "builtin:smollm2-135m"
BLOCK_SIZE, NUM_BLOCKS = 16, 64
# One running sequence at a time, so a second request is queued (TotalQueuedRequests).
ARGS = (
    "--max-model-len", "512", "--max-num-seqs", "1", "--block-size", str(BLOCK_SIZE),
    "--num-gpu-blocks-override", str(NUM_BLOCKS), "--max-waiting-requests", "8",
)  # fmt: skip
# A copy of the table's vLLM column (module v1.6.0), the floor of what the parse must find:
# a change of the document's layout that the parser misses fails here, not silently.
FLOOR = {
    "TotalQueuedRequests": ("vllm:num_requests_waiting", None),
    "TotalRunningRequests": ("vllm:num_requests_running", None),
    "KVCacheUtilization": ("vllm:kv_cache_usage_perc", None),
    "BlockSize": ("vllm:cache_config_info", "block_size"),
    "NumGPUBlocks": ("vllm:cache_config_info", "num_gpu_blocks"),
}


@pytest.fixture(scope="module")
def server(launch_server) -> ServerProcess:
    return launch_server(*ARGS)


def families(server: ServerProcess) -> dict[str, Any]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], name: str) -> float:
    (sample,) = [s for s in fams[name].samples if s.name == name]
    return sample.value


def test_the_protocol_document_is_read():
    doc = protocol_doc()
    rows = {r.concept: (r.metric, r.label) for r in metric_table(doc)}
    assert FLOOR.items() <= rows.items()
    assert {r.type for r in metric_table(doc)} == {"gauge"}
    lora = lora_metric(doc)
    assert (lora.metric, lora.type) == ("vllm:lora_requests_info", "gauge")
    assert lora.labels == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}


def test_every_metric_of_the_table_is_exposed_with_its_type_and_labels(server):
    fams = families(server)
    for row in metric_table(protocol_doc()):  # optional rows too: the server has them all
        assert row.metric in fams, f"{row.concept}: /metrics has no {row.metric}"
        assert fams[row.metric].type == row.type, row
        if row.label is not None:
            (sample,) = fams[row.metric].samples
            assert row.label in sample.labels, (row, sample.labels)
    (info,) = fams["vllm:cache_config_info"].samples
    assert info.labels["block_size"] == str(BLOCK_SIZE)  # BlockSize: the server's --block-size
    assert info.labels["num_gpu_blocks"] == str(NUM_BLOCKS)  # NumGPUBlocks: the whole device pool


class Stream:
    """A streaming completion held open in a thread until `close()`."""

    def __init__(self, server: ServerProcess) -> None:
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(server,), daemon=True)
        self.thread.start()

    def _run(self, server: ServerProcess) -> None:
        body = {"model": MODEL, "prompt": "Count from one to a thousand:", "max_tokens": 400,
                "temperature": 0, "stream": True, "ignore_eos": True}  # fmt: skip
        with httpx.Client(timeout=120) as http, http.stream("POST", server.base_url + "/completions", json=body) as r:
            for _ in r.iter_lines():
                if self.done.is_set():
                    return  # the connection closes: the server aborts the request

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=60)


def wait_for(server: ServerProcess, ok, what: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        fams = families(server)
        if ok(fams):
            return fams
        if time.monotonic() > deadline:
            pytest.fail(f"never saw {what}: running {value(fams, 'vllm:num_requests_running')}, "
                        f"waiting {value(fams, 'vllm:num_requests_waiting')}")  # fmt: skip
        time.sleep(0.05)


@pytest.fixture
def streams(server) -> Iterator[list[Stream]]:
    opened: list[Stream] = []
    yield opened
    for s in opened:
        s.close()


def test_queue_running_and_kv_usage_mean_what_the_table_says(server, streams):
    def load(running: int, waiting: int):
        return lambda f: (value(f, "vllm:num_requests_running"), value(f, "vllm:num_requests_waiting")) == (
            running, waiting,
        )  # fmt: skip

    idle = wait_for(server, load(0, 0), "an idle engine")
    assert value(idle, "vllm:kv_cache_usage_perc") == 0.0
    streams.append(Stream(server))
    one = wait_for(server, load(1, 0), "one request running")
    streams.append(Stream(server))  # --max-num-seqs 1: this one queues behind it
    both = wait_for(server, load(1, 1), "one running and one queued")
    for fams in (one, both):  # KVCacheUtilization: a fraction of the pool (1.0 is full)
        assert 0.0 < value(fams, "vllm:kv_cache_usage_perc") <= 1.0
    for s in streams:
        s.close()
    after = wait_for(server, load(0, 0), "both requests gone")
    assert value(after, "vllm:kv_cache_usage_perc") == 0.0

