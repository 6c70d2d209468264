#!/usr/bin/env bash
# Everything a lent GPU session runs, in one call (the lease is 15 minutes, start-up
# included). Prepare here first: `.venv/bin/python scripts/gpu_prepare.py` and the gguf
# wheel in .gpu/whl (see docs/gpu.md); the call carries `.gpu`.
#
#   engine_check  the engine on CUDA, SmolLM2 shape fp32: Triton vs torch, CUDA graphs vs
#                 --enforce-eager (overlap on and off), swap/recompute under a tiny pool
#                 with graph replays
#   kv_fp8        (beside engine_check, same wall time) --kv-cache-dtype fp8 vs auto, SmolLM2
#                 shape bf16: KV blocks each plan gets, greedy agreement over 64 prompts;
#                 fp8 pools through Triton vs torch (fp32); graph replays under fp8
#   decode_step   8B shape bf16, --gpu-memory-utilization 0.95: decode step at batch 128 x
#                 512-token contexts and batch 1, graphs vs eager, kernel launches per step
#                 (torch profiler), the bandwidth floor
#   offline_throughput  8B shape, 5000 ShareGPT-like requests: ours vs HF static batching
#   summary       bench/results/gpu-<date>.json: the issue-18 figures against their targets
# Not in the default run (ONLY=... to run them; they passed on 2026-11-30 and nothing they
# measure changed since): kernel_tests (every Triton kernel test, compiled),
# seed_preemption (recompute vs swap vs auto, 8B shape), kernel_bench (kernel GB/s, TFLOP/s).
# The default stages do not fit one call's 600 s: run ONLY="engine_check kv_fp8 decode_step",
# then ONLY="offline_throughput", and make the summary of both calls' files after
# unpacking them: python scripts/gpu_summary.py bench/results (docs/gpu.md).
#
# Each stage has its own time limit and writes its JSON as it goes, so a stage that runs
# out of time or fails leaves the others' results. Logs, JSON and plots are packed after
# every stage into $OUT/gpu-session.tgz (a call brings back only a few files); unpack it
# into bench/results. `--dry` runs tiny versions on CPU to check the plumbing;
# ONLY="seed_preemption kernel_tests" reruns some stages; KERNEL_TESTS narrows stage 2.
#
# The LoRA kernels are one call of their own, ONLY="lora_tests lora_bench" (< 6 minutes):
#   lora_tests    tests/unit/kernels/test_triton_lora.py compiled, on CUDA tensors
#   lora_bench    bench/lora.py, SmolLM2 shape bf16, base vs 1/8/64 adapters -> gpu-lora.json
#
# The fused MoE kernel is one call of its own too, ONLY="moe_tests moe_kernel_bench moe_bench" (< 9 minutes):
#   moe_tests         tests/unit/kernels/test_triton_moe.py compiled, on CUDA tensors
#   moe_kernel_bench  bench/moe_kernel.py, Qwen3-30B-A3B layer bf16 (H 2048, I 768, E 128,
#                     K 8), T 1/16/128/1024: fused_moe vs a torch per-expert loop, a tile
#                     sweep -> gpu-moe_kernel.json
#   moe_bench         bench/moe.py, Qwen3-30B-A3B layer shape (4 of 48 layers), bf16, the
#                     engine with CUDA graphs: tok/s vs its dense equivalent and vs
#                     transformers on the same weights, greedy agreement -> gpu-moe.json
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/bench/results}"
mkdir -p "$OUT"
DRY=0; [[ "${1:-}" == "--dry" ]] && DRY=1
PY="${PYTHON:-python3}"; [[ -x "$ROOT/.venv/bin/python" && -z "${PYTHON:-}" ]] && PY="$ROOT/.venv/bin/python"
export PYTHONUNBUFFERED=1
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT

# gguf (the model loader imports it) is the one package the GPU image lacks
if ! "$PY" -c 'import gguf' 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$ROOT"/.gpu/whl/*.whl
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# llmservice maps several folders into one import namespace; assemble it from symlinks
# where it is not installed, and never run from the root (its operator/ shadows stdlib)
if ! "$PY" -c 'import llmservice.kernels, llmservice.server' 2>/dev/null; then
  mkdir -p "$WORK/shadow/llmservice"
  for f in "$ROOT"/src/llmservice/*; do ln -s "$f" "$WORK/shadow/llmservice/$(basename "$f")"; done
  ln -s "$ROOT/kernels" "$WORK/shadow/llmservice/kernels"
  ln -s "$ROOT/server" "$WORK/shadow/llmservice/server"
  export PYTHONPATH="$WORK/shadow${PYTHONPATH:+:$PYTHONPATH}"
fi
cd "$WORK"
RES="$WORK/res"; mkdir -p "$RES"
M="$ROOT/.gpu/models"
ONLY="${ONLY:-engine_check kv_fp8 decode_step offline_throughput summary}"
stage() {  # name, seconds, command...; ONLY="a b" runs just the stages named
  local name=$1 secs=$2; shift 2
  [[ " $ONLY " != *" $name "* ]] && return 0
  echo "=== $name (limit ${secs}s) $(date +%T)"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=10 "$secs" "$@" > "$RES/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc in $((SECONDS - t0))s"; tail -n 15 "$RES/$name.log"
  tar czf "$OUT/gpu-session.tgz.$BASHPID" -C "$RES" . && mv "$OUT/gpu-session.tgz.$BASHPID" "$OUT/gpu-session.tgz"
}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv

if [[ $DRY == 1 ]]; then
  export TRITON_INTERPRET=1
  stage engine_check 300 "$PY" "$ROOT/scripts/gpu_engine_check.py" --model "$M/smollm2-135m-shape" --out "$RES" --device cpu
  stage kv_fp8 300 "$PY" "$ROOT/scripts/gpu_kv_fp8_check.py" --model "$M/smollm2-135m-shape" --out "$RES" --device cpu \
    --prompts 2 --max-tokens 2 --dtype float32
  stage kernel_tests 300 "$PY" -m pytest -p no:cacheprovider --rootdir "$ROOT" -x "$ROOT/tests/unit/kernels/test_swap.py" "$ROOT/tests/unit/kernels/test_triton_norm.py"
  stage seed_preemption 300 "$PY" "$ROOT/bench/seed_preemption.py" --model "$M/smollm2-135m-shape" --load-format dummy \
    --device cpu --long-prompt 200 --long-requests 3 --long-kv-requests 2 --long-output 8 --short-requests 4 --short-output 20 --out "$RES"
  stage kernel_bench 300 "$PY" "$ROOT/bench/kernel_bench.py" --smoke --out "$RES"
  stage offline_throughput 300 "$PY" "$ROOT/bench/offline_throughput.py" --model "$M/smollm2-135m-shape" --load-format dummy \
    --device cpu --num-requests 8 --hf-requests 4 --hf-batches 4 --out "$RES"
  stage decode_step 300 "$PY" "$ROOT/bench/decode_step.py" --model "$M/smollm2-135m-shape" --load-format dummy \
    --device cpu --batch 4 1 --context 64 --steps 4 --kv-cache-memory-gib 0.2 --out "$RES"
  stage lora_tests 300 "$PY" -m pytest -p no:cacheprovider --rootdir "$ROOT" -x "$ROOT/tests/unit/kernels/test_triton_lora.py"
  stage lora_bench 300 "$PY" "$ROOT/bench/lora.py" --model "$M/smollm2-135m-shape" --load-format dummy \
    --device cpu --quick --adapters 1 2 --requests 2 --out "$RES"
  stage moe_tests 300 "$PY" -m pytest -p no:cacheprovider --rootdir "$ROOT" -x "$ROOT/tests/unit/kernels/test_triton_moe.py"
  stage moe_kernel_bench 120 "$PY" "$ROOT/bench/moe_kernel.py" --smoke --out "$RES"
  stage moe_bench 300 "$PY" "$ROOT/bench/moe.py" --quick --out "$RES"
  stage summary 60 "$PY" "$ROOT/scripts/gpu_summary.py" "$RES"
  exit 0
fi

export TRITON_INTERPRET=0  # compiled kernels; the tests' conftest keeps an explicit choice
XDIST=(); "$PY" -c 'import xdist' 2>/dev/null && XDIST=(-n 10)
stage engine_check 200 "$PY" "$ROOT/scripts/gpu_engine_check.py" --model "$M/smollm2-135m-shape" --out "$RES" &
# beside engine_check (no wall time added): its plans take --gpu-memory-utilization 0.4 of the GPU
stage kv_fp8 200 "$PY" "$ROOT/scripts/gpu_kv_fp8_check.py" --model "$M/smollm2-135m-shape" --out "$RES" \
  --prompts 64 --max-tokens 32 &
stage kernel_tests 150 "$PY" -m pytest -p no:cacheprovider --rootdir "$ROOT" "${XDIST[@]}" \
  ${KERNEL_TESTS:-"$ROOT"/tests/unit/kernels/test_triton_*.py "$ROOT/tests/unit/kernels/test_swap.py"}
wait
stage seed_preemption 300 "$PY" "$ROOT/bench/seed_preemption.py" --model "$M/llama3-8b-shape" --load-format dummy \
  --device cuda --warmup --repeats 2 --long-prompt 2500 --long-requests 24 --long-kv-requests 2.5 --long-output 128 \
  --short-requests 48 --short-output 192 --max-num-batched-tokens 2048 --swap-space 8 --out "$RES"
stage kernel_bench 60 "$PY" "$ROOT/bench/kernel_bench.py" --budget-s 50 --out "$RES"
# batch 128 x 512-token contexts (target <= 6 ms, >= 65 % of the bandwidth floor) and batch 1
# (target >= 220 tok/s); eager first, so the launch counts before/after sit side by side
stage decode_step 200 "$PY" "$ROOT/bench/decode_step.py" --model "$M/llama3-8b-shape" --load-format dummy \
  --device cuda --batch 128 1 --context 512 --steps 32 --modes eager graphs --gpu-memory-utilization 0.95 --out "$RES"
# >= 5000 requests to reach a steady state (target >= 14,000 output tok/s); HF on 128 of them
stage offline_throughput 280 "$PY" "$ROOT/bench/offline_throughput.py" --model "$M/llama3-8b-shape" --load-format dummy \
  --device cuda --num-requests 5000 --max-num-seqs 256 --kv-cache-memory-gib 16 --hf-requests 128 --hf-batches 64 --out "$RES"
# LoRA: the kernel tests compiled (the first use compiles each kernel variant), then the
# multi-adapter throughput (target: 64 adapters >= 0.8x of the base)
stage lora_tests 120 "$PY" -m pytest -p no:cacheprovider --rootdir "$ROOT" "${XDIST[@]}" "$ROOT/tests/unit/kernels/test_triton_lora.py"
stage lora_bench 240 "$PY" "$ROOT/bench/lora.py" --model "$M/smollm2-135m-shape" --load-format dummy \
  --device cuda --adapters 1 8 64 --requests 64 --out "$RES"
# MoE: the fused kernel's tests compiled, then fused vs the per-expert loop at a
# Qwen3-30B-A3B layer (about 1.2 GB of bf16 expert weights)
stage moe_tests 150 "$PY" -m pytest -p no:cacheprovider --rootdir "$ROOT" "${XDIST[@]}" "$ROOT/tests/unit/kernels/test_triton_moe.py"
stage moe_kernel_bench 150 "$PY" "$ROOT/bench/moe_kernel.py" --out "$RES"
stage moe_bench 240 "$PY" "$ROOT/bench/moe.py" --shape qwen3-30b-a3b --layers 4 --device cuda \
  --requests 64 --prompt 256 --output 64 --rounds 2 --threads 8 --out "$RES"
stage summary 60 "$PY" "$ROOT/scripts/gpu_summary.py" "$RES"
ls -la "$RES"
