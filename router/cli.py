"""`llmservice router`: flags, the EndpointSlice watch or fixed pods, graceful drain.

SIGTERM: /readyz turns 503 (the router's own Service stops sending), then the router
keeps serving whatever is in flight or held for up to `--drain-seconds` before it exits;
with preStop's sleep in front of it, no accepted request is dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time

from aiohttp import web
from llmservice.router.endpoints import Endpoint, SliceWatcher, address_map
from llmservice.router.ext_proc import EXT_PROC_PORT, ExtProcServer, PoolPicker
from llmservice.router.loads import scrape_forever
from llmservice.router.proxy import Router, RouterConfig
from llmservice.router.wake import Waker

log = logging.getLogger("llmservice.router")


def add_router_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--namespace", help="namespace of the LLMService and its pods")
    p.add_argument("--service", default="", help="the LLMService's name (scale from zero target)")
    p.add_argument(
        "--endpoint-slices-of",
        dest="pods_service",
        help="watch the EndpointSlices of this Service (the pods' headless Service)",
    )
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="URL",
        help="a fixed pod URL instead of the EndpointSlice watch (repeatable; tests, benchmarks)",
    )
    p.add_argument("--policy", choices=["prefix", "round-robin"], default="prefix")
    p.add_argument("--load-factor", type=float, default=1.25)
    p.add_argument("--prefix-tokens", type=int, default=256)
    p.add_argument("--max-held-requests", type=int, default=100)
    p.add_argument("--hold-timeout-seconds", type=float, default=300.0)
    p.add_argument(
        "--scale-from-zero",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="a held request sets the LLMService's replicas 0 -> 1 (scale subresource)",
    )
    p.add_argument("--drain-seconds", type=float, default=30.0)
    p.add_argument(
        "--event-loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="auto: uvloop when installed (as uvicorn's --loop auto), else asyncio",
    )
    p.add_argument(
        "--ext-proc",
        action="store_true",
        help="also serve Envoy ext-proc gRPC as an inference gateway's endpoint picker "
        "(the same pods and policy as the HTTP proxy; docs/router.md)",
    )
    p.add_argument("--ext-proc-port", type=int, default=EXT_PROC_PORT)
    p.add_argument("--log-level", default="info")  # fmt: skip


def validate(args: argparse.Namespace) -> str | None:
    if not args.backend and not (args.namespace and args.pods_service):
        return "give --backend URL (repeatable) or --namespace and --endpoint-slices-of SERVICE"
    if args.scale_from_zero and not (args.namespace and args.service):
        return "--scale-from-zero needs --namespace and --service"
    if args.load_factor < 1:
        return f"--load-factor must be >= 1 (got {args.load_factor})"
    if args.max_held_requests < 0 or args.hold_timeout_seconds <= 0:
        return "--max-held-requests must be >= 0 and --hold-timeout-seconds > 0"
    if not 1 <= args.ext_proc_port <= 65535:
        return f"--ext-proc-port must be in 1-65535 (got {args.ext_proc_port})"
    return None


def load_kube_config() -> None:
    """In a pod: its ServiceAccount; elsewhere: $KUBECONFIG or ~/.kube/config."""
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def config_of(args: argparse.Namespace) -> RouterConfig:
    return RouterConfig(
        service=args.service or args.pods_service or "",
        policy=args.policy,
        load_factor=args.load_factor,
        prefix_tokens=args.prefix_tokens,
        max_held=args.max_held_requests,
        hold_timeout_s=args.hold_timeout_seconds,
    )


async def serve(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    watcher = None
    if not args.backend or args.scale_from_zero:
        load_kube_config()
    waker = Waker(args.namespace, args.service) if args.scale_from_zero else None
    router = Router(config_of(args), waker=waker)
    if waker is not None:
        waker.on_wake = router.metrics.wakes.inc
    if args.backend:
        router.pool.update(
            {f"pod-{i}": Endpoint(f"pod-{i}", u.rstrip("/")) for i, u in enumerate(args.backend)}
        )
    else:
        watcher = SliceWatcher(
            args.namespace, args.pods_service,
            lambda pods: loop.call_soon_threadsafe(router.pool.update, pods), rewrite=address_map(),
        ).start()  # fmt: skip
    runner = web.AppRunner(
        router.app(), handle_signals=False, access_log=None, shutdown_timeout=args.drain_seconds
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=1024, reuse_address=True)
    await site.start()
    assert router.session is not None
    scraper = asyncio.create_task(scrape_forever(router.session, router.pool))
    ext_proc = None
    if args.ext_proc:
        picker = PoolPicker(router.pool, router.config, router.metrics, waker)
        ext_proc = await ExtProcServer(
            picker, router.config.service, args.host, args.ext_proc_port
        ).start()
        log.info("ext-proc endpoint picker on %s:%d", args.host, ext_proc.port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "router for %s on %s:%d (%s)",
        router.config.service,
        args.host,
        args.port,
        router.config.policy,
    )
    await stop.wait()
    router.draining = True
    if ext_proc is not None:
        await ext_proc.set_serving(False)
    deadline = time.monotonic() + args.drain_seconds
    while router.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if ext_proc is not None:
        await ext_proc.stop(max(0.0, deadline - time.monotonic()))
    log.info("drained (%d still in flight); exiting", router.in_flight)
    scraper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await scraper
    if watcher is not None:
        watcher.stop()
    await runner.cleanup()
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llmservice router", description=__doc__.split("\n")[0])
    add_router_args(parser)
    args = parser.parse_args(argv)
    problem = validate(args)
    if problem:
        parser.error(problem)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return run_on(args.event_loop, serve(args))


def run_on(event_loop: str, main_coro) -> int:
    """Run the router's main coroutine on the chosen event loop. uvloop's loop (libuv)
    does the proxy's per-request socket work in C; bench/router.py measures both."""
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise SystemExit("--event-loop uvloop: uvloop is not installed") from None
        else:
            return uvloop.run(main_coro)
    return asyncio.run(main_coro)
