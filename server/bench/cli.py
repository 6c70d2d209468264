"""placeholder replaced below"""
import argparse


def add_bench_serve_args(p: argparse.ArgumentParser) -> None:
    pass
def run_bench_serve(args) -> int:
    return 2
