#!/usr/bin/env bash
# The Gateway API Inference Extension CRDs, taken from the pinned
# sigs.k8s.io/gateway-api-inference-extension Go module, for the tests that validate and
# apply the InferencePool and InferenceObjective the operator renders
# (spec.gateway.inferencePool), and its model-server protocol document, for the test of
# the metrics the endpoint picker scrapes. Not hand-copied: the files are the module's own
# (config/crd/bases YAMLs, docs/proposals/003-model-server-protocol/README.md),
# downloaded through the Go module proxy into the module cache and copied to
# ${LLMSERVICE_CACHE:-$HOME/.cache/llmservice}/gateway-inference/ (and linked from the
# repo's git-ignored .cache/gateway-inference). Same pins -> nothing is downloaded.
#
# InferencePool (inference.networking.k8s.io/v1) comes from GIE_VERSION; the
# InferenceObjective (inference.networking.x-k8s.io/v1alpha2) from GIE_OBJECTIVE_VERSION,
# the last release of the module that ships it (later ones moved it to llm-d).
#
# Usage: hack/fetch-gateway-crds.sh            fetch if needed, print the cache directory
#        hack/fetch-gateway-crds.sh --version  print the pinned versions
set -euo pipefail

GIE_VERSION="v1.6.0"           # operator/render_gateway.py GIE_VERSION must match
GIE_OBJECTIVE_VERSION="v1.5.0" # operator/render_gateway.py GIE_OBJECTIVE_VERSION must match
MODULE="sigs.k8s.io/gateway-api-inference-extension"
BASES="config/crd/bases"
# What the endpoint picker scrapes (tests/integration/server/test_gateway_protocol.py).
PROTOCOL="docs/proposals/003-model-server-protocol/README.md"

if [[ "${1:-}" == "--version" ]]; then
	echo "$GIE_VERSION $GIE_OBJECTIVE_VERSION"
	exit 0
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${LLMSERVICE_CACHE:-$HOME/.cache/llmservice}/gateway-inference/$GIE_VERSION-$GIE_OBJECTIVE_VERSION"

module_dir() { # the module's extracted source in the Go module cache
	local tmp
	tmp="$(mktemp -d)"
	(cd "$tmp" && go mod init fetch-gie >/dev/null 2>&1 &&
		GOFLAGS=-mod=mod go mod download -json "$MODULE@$1" |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
	rm -rf "$tmp"
}

copy() { # copy <version> <path in the module> [<name in the cache>] into the cache
	local out="$cache/${3:-$(basename "$2")}"
	[[ -s "$out" ]] && return
	cp "$(module_dir "$1")/$2" "$out.$$.tmp"
	chmod 0644 "$out.$$.tmp"
	mv "$out.$$.tmp" "$out"
}

mkdir -p "$cache"
copy "$GIE_VERSION" "$BASES/inference.networking.k8s.io_inferencepools.yaml"
copy "$GIE_OBJECTIVE_VERSION" "$BASES/inference.networking.x-k8s.io_inferenceobjectives.yaml"
copy "$GIE_VERSION" "$PROTOCOL" model-server-protocol.md
mkdir -p "$repo/.cache"
ln -sfn "$cache" "$repo/.cache/gateway-inference"
echo "$cache"
