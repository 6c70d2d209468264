"""A pool of gloo ranks started once per test module: each task runs on ranks 0..n-1 of
it (a sub-group for n below the pool's size) and rank 0's answer comes back. Spawning
and rendezvous cost seconds, so tests share one pool instead of one group per test."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any

from llmservice.server.engine.tp_executor import free_port


def _rank_main(rank: int, size: int, init_method: str, conn: Any) -> None:
    import torch
    import torch.distributed as dist
    from llmservice.server.model.parallel import World

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=size)
    groups = {n: dist.new_group(list(range(n))) for n in range(1, size)}  # every rank joins each
    groups[size] = None
    while (task := conn.recv()) is not None:
        fn, n, args = task
        try:
            out = fn(World(rank, n, groups[n]), *args) if rank < n else None
        except Exception as exc:  # the test sees it
            out = exc
        if rank == 0:
            conn.send(out)
    # no destroy_process_group: it waits on peers that may already be gone; exiting is enough


class RankPool:
    def __init__(self, size: int):
        ctx = mp.get_context("spawn")
        init = f"tcp://127.0.0.1:{free_port()}"
        self.conns, self.procs = [], []
        for rank in range(size):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, args=(rank, size, init, theirs), daemon=True)
            proc.start()
            self.conns.append(ours)
            self.procs.append(proc)

    def run(self, fn: Callable[..., Any], n: int, *args: Any) -> Any:
        """fn(world, *args) on ranks 0..n-1 (the others skip it); rank 0's result."""
        for conn in self.conns:
            conn.send((fn, n, args))
        if not self.conns[0].poll(300):
            raise TimeoutError("rank 0 did not answer in 300 s")
        out = self.conns[0].recv()
        if isinstance(out, Exception):
            raise out
        return out

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(3)
            if proc.is_alive():
                proc.kill()
