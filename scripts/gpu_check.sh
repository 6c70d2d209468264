#!/usr/bin/env bash
# GPU check of the Triton kernels: correctness at production sizes, then the benchmark
# (decode GB/s vs copy bandwidth, prefill TFLOP/s vs matmul, a model decode step).
#
#   scripts/gpu_check.sh            on a CUDA machine; finishes in under 5 minutes
#   scripts/gpu_check.sh --smoke    anywhere: tiny CPU run through the Triton interpreter
#   scripts/gpu_check.sh --unit     on a CUDA machine: the kernel unit tests (every block
#                                   size, GQA ratio, head dim, dtype) on compiled kernels
#
# Writes <gpu|smoke>-<date>.json under $OUT if set, else bench/results/, and prints a
# short table last. Exit status: 0 all kernels correct, 1 a kernel failed its check.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ " $* " != *" --smoke "* ]]; then
  unset TRITON_INTERPRET  # the real check runs compiled kernels
fi

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi

# Run from a scratch folder: the repository root holds an `operator/` folder that would
# shadow the standard library's `operator` if the root were on sys.path.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

# llmservice maps several folders into one import namespace (pyproject package-dir).
# Where it is not installed (a bare GPU image), assemble that namespace from symlinks.
if ! "$PY" -c 'import llmservice.kernels' 2>/dev/null; then
  mkdir -p shadow/llmservice
  for f in "$ROOT"/src/llmservice/*; do ln -s "$f" "shadow/llmservice/$(basename "$f")"; done
  ln -s "$ROOT/kernels" shadow/llmservice/kernels
  ln -s "$ROOT/server" shadow/llmservice/server
  export PYTHONPATH="$WORK/shadow${PYTHONPATH:+:$PYTHONPATH}"
fi

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
fi
export PYTHONUNBUFFERED=1
if [[ "${1:-}" == "--unit" ]]; then
  # the tests' conftest keeps TRITON_INTERPRET=0 and moves their tensors to CUDA
  TRITON_INTERPRET=0 exec timeout 295 "$PY" -m pytest -q -p no:cacheprovider -m "not slow" \
    --rootdir "$ROOT" "$ROOT"/tests/unit/kernels/test_triton_*.py
fi
timeout 295 "$PY" "$ROOT/bench/kernel_bench.py" "$@"
