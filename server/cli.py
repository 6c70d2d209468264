"""`llmservice` command line: serve, demo, bench, operator, advise, router."""

from __future__ import annotations

import argparse
import sys
import time


def _demo(args: argparse.Namespace) -> int:
    """Offline generation: answer one chat prompt and print the speed."""
    from llmservice.server.config import EngineConfig
    from llmservice.server.engine.engine import LLMEngine
    from llmservice.server.engine.sampling_params import SamplingParams

    engine = LLMEngine.from_config(EngineConfig(model=args.model, max_model_len=2048))
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
    t0 = time.perf_counter()
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=args.max_tokens))[0]
    dt = time.perf_counter() - t0
    print(f"Q: {args.prompt}\nA: {out.text}")
    print(f"{len(out.token_ids)} tokens in {dt:.2f} s = {len(out.token_ids) / dt:.1f} tok/s")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from llmservice.server.api.launch import serve

    return serve(args)


def _bench(args: argparse.Namespace) -> int:
    from llmservice.server.loadgen.cli import run_bench_serve

    return run_bench_serve(args)


def _operator(argv: list[str]) -> int:
    if argv[:1] == ["render"]:  # offline: no kopf import
        from llmservice.operator.render_cli import main as render_main

        return render_main(argv[1:])
    from llmservice.operator.cli import main as operator_main

    return operator_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "operator":
        return _operator(argv[1:])
    if argv and argv[0] == "advise":  # its own parser (operator/advisor/cli.py)
        from llmservice.operator.advisor.cli import main as advise_main

        return advise_main(argv[1:])
    if argv and argv[0] == "router":  # its own parser (router/cli.py); no torch import
        from llmservice.router.cli import main as router_main

        return router_main(argv[1:])
    parser = argparse.ArgumentParser(prog="llmservice")
    sub = parser.add_subparsers(dest="command", required=True)
    from llmservice.server.cli_args import add_serve_args
    from llmservice.server.loadgen.cli import add_bench_serve_args

    serve = sub.add_parser("serve", help="OpenAI-compatible server (continuous batching engine)")
    add_serve_args(serve)
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    add_bench_serve_args(bench_sub.add_parser("serve", help="load-test a running OpenAI-compatible server"))
    demo = sub.add_parser("demo", help="offline generation demo on the embedded model")
    demo.add_argument("model", nargs="?", default="builtin:smollm2-135m")
    demo.add_argument("--prompt", default="What is the capital of France?")
    demo.add_argument("--max-tokens", type=int, default=64)
    sub.add_parser("operator", help="run the Kubernetes operator (kopf); `operator render -f FILE` prints its manifests")
    sub.add_parser("advise", help="find batching mistakes in a running server's /metrics (`advise URL --json`)")
    sub.add_parser("router", help="prefix-aware proxy in front of an LLMService's pods (docs/router.md)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "bench":
        return _bench(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
