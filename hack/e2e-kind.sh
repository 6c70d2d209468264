#!/usr/bin/env bash
# The user's whole path on a throwaway kind cluster: build both images, `helm install` the
# chart, apply examples/smollm2-cpu.yaml (the embedded SmolLM2-135M on a CPU-only pod), wait
# for Ready, and get a chat completion and the metrics through the Service.
#
#   make e2e-kind                      # or: hack/e2e-kind.sh
#   KEEP_CLUSTER=1 make e2e-kind       # leave the cluster up afterwards
#
# Needs a Docker engine, kind, helm and kubectl on PATH (and ~10 GB of disk for the server
# image with PyTorch's CUDA wheels). It cannot run on machines without a Docker engine,
# such as this project's build machines and CI: there the same scenario runs against a
# control plane built from Go modules (`make test-cluster`, docs/control-plane.md).
set -euo pipefail

cd "$(dirname "$0")/.."
CLUSTER=${KIND_CLUSTER:-llmservice-e2e}
NAMESPACE=${E2E_NAMESPACE:-default}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
SERVER_IMAGE=ghcr.io/llmservice/llmservice:${VERSION}
OPERATOR_IMAGE=ghcr.io/llmservice/llmservice-operator:${VERSION}
LOCAL_PORT=${E2E_PORT:-18000}

need() {
    command -v "$1" >/dev/null 2>&1 || {
        echo "e2e-kind: '$1' is not on PATH (this needs Docker, kind, helm and kubectl)" >&2
        exit 2
    }
}
for tool in docker kind helm kubectl curl; do need "$tool"; done
docker info >/dev/null 2>&1 || { echo "e2e-kind: no Docker engine is reachable" >&2; exit 2; }

PF_PID=""
cleanup() {
    [ -n "$PF_PID" ] && kill "$PF_PID" 2>/dev/null || true
    if [ "${KEEP_CLUSTER:-0}" != "1" ]; then kind delete cluster --name "$CLUSTER" || true; fi
}
trap cleanup EXIT

echo "== images ($VERSION)"
docker build -f Dockerfile.server -t "$SERVER_IMAGE" .
docker build -f Dockerfile.operator -t "$OPERATOR_IMAGE" .

echo "== kind cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 180s
kind load docker-image --name "$CLUSTER" "$SERVER_IMAGE" "$OPERATOR_IMAGE"

echo "== helm install"
helm upgrade --install llmservice charts/llmservice-operator \
    --namespace llm-system --create-namespace \
    --set image.pullPolicy=Never --wait --timeout 5m
kubectl -n llm-system rollout status deployment/llmservice-llmservice-operator --timeout 5m

echo "== an LLMService on a CPU-only pod"
kubectl -n "$NAMESPACE" apply -f examples/smollm2-cpu.yaml
if ! kubectl -n "$NAMESPACE" wait llms/smollm2 --for=condition=Ready --timeout=15m; then
    kubectl -n "$NAMESPACE" describe llms smollm2 || true
    kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/instance=smollm2 --tail=100 || true
    kubectl -n llm-system logs deployment/llmservice-llmservice-operator --tail=100 || true
    exit 1
fi
kubectl -n "$NAMESPACE" get llms

echo "== a chat completion through the Service"
kubectl -n "$NAMESPACE" port-forward svc/smollm2 "$LOCAL_PORT":8000 >/dev/null &
PF_PID=$!
for _ in $(seq 1 30); do
    curl -sf "http://127.0.0.1:$LOCAL_PORT/ready" >/dev/null && break
    sleep 1
done
answer=$(curl -sf "http://127.0.0.1:$LOCAL_PORT/v1/chat/completions" \
    -H 'Content-Type: application/json' \
    -d '{"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0}')
echo "$answer"
echo "$answer" | grep -q '"choices"'
curl -sf "http://127.0.0.1:$LOCAL_PORT/metrics" | grep '^vllm:kv_cache_usage_perc'
echo "e2e-kind: OK"
