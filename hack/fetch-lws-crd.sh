#!/usr/bin/env bash
# The LeaderWorkerSet CRD (leaderworkerset.x-k8s.io/v1), taken from the pinned
# sigs.k8s.io/lws Go module, for the tests that validate and apply the multi-node
# (engine.kind: vllm) manifests. Not hand-copied: the file is the module's own
# config/crd/bases YAML, downloaded through the Go module proxy into the module cache
# and copied to ${LLMSERVICE_CACHE:-$HOME/.cache/llmservice}/lws/<version>/ (and linked
# from the repo's git-ignored .cache/lws). Same pin -> nothing is downloaded.
#
# In a cluster the same version installs with
#   kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases/download/$LWS_VERSION/manifests.yaml
#
# Usage: hack/fetch-lws-crd.sh          fetch if needed, print the CRD file's path
#        hack/fetch-lws-crd.sh --version print the pinned version
set -euo pipefail

LWS_VERSION="v0.7.0" # operator/render_lws.py LWS_VERSION must match (test_render_lws.py)
CRD_PATH="config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"

if [[ "${1:-}" == "--version" ]]; then
	echo "$LWS_VERSION"
	exit 0
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${LLMSERVICE_CACHE:-$HOME/.cache/llmservice}/lws/$LWS_VERSION"
out="$cache/leaderworkersets.yaml"

if [[ ! -s "$out" ]]; then
	tmp="$(mktemp -d)"
	trap 'rm -rf "$tmp"' EXIT
	(cd "$tmp" && go mod init fetch-lws >/dev/null 2>&1)
	dir="$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
	mkdir -p "$cache"
	cp "$dir/$CRD_PATH" "$out.$$.tmp"
	chmod 0644 "$out.$$.tmp"
	mv "$out.$$.tmp" "$out"
fi
mkdir -p "$repo/.cache"
ln -sfn "$cache" "$repo/.cache/lws"
echo "$out"
