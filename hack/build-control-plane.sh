#!/usr/bin/env bash
# Build the real Kubernetes control plane (one hyperkube-style binary from
# hack/control-plane) and helm from their Go modules, for the "cluster" test tier.
#
# Why a cache outside the repo: compiling kube-apiserver takes many CPU-minutes, and CI
# runs in a fresh clone on the same machine. The binaries live in
#   ${LLMSERVICE_CACHE:-$HOME/.cache/llmservice}/bin/<pin-hash>/
# where <pin-hash> covers everything that determines them (go.mod, go.sum, main.go, the
# helm pin, the Go toolchain, this recipe). Same pins -> nothing is rebuilt. The repo's
# git-ignored .cache/bin is a symlink to that folder, which the test fixture reads.
#
# Usage: hack/build-control-plane.sh          build if needed, print the bin folder
#        hack/build-control-plane.sh --print  only print the bin folder (no build)
set -euo pipefail

HELM_VERSION="v3.22.0"
KUBE_VERSION="v1.37.2" # must match the k8s.io/kubernetes require line in go.mod
RECIPE="2"             # bump when the build commands below change

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$repo/hack/control-plane"
cache="${LLMSERVICE_CACHE:-$HOME/.cache/llmservice}"

if ! grep -q "k8s.io/kubernetes $KUBE_VERSION\$" "$src/go.mod"; then
	echo "build-control-plane: KUBE_VERSION=$KUBE_VERSION does not match $src/go.mod" >&2
	exit 1
fi

pin_hash="$(
	{
		cat "$src/go.mod" "$src/go.sum" "$src/main.go"
		echo "helm=$HELM_VERSION kube=$KUBE_VERSION recipe=$RECIPE"
		go env GOVERSION GOOS GOARCH
	} | sha256sum | cut -c1-16
)"
bin="$cache/bin/$pin_hash"

link_repo_cache() {
	mkdir -p "$repo/.cache"
	ln -sfn "$bin" "$repo/.cache/bin"
}

if [[ "${1:-}" == "--print" ]]; then
	echo "$bin"
	exit 0
fi

# etcd comes from Debian (3.4 is accepted by the pinned apiserver; docs/control-plane.md).
if ! command -v etcd >/dev/null; then
	echo "build-control-plane: warning: no etcd on PATH; the cluster tests need it:" \
		"apt-get install etcd-server" >&2
fi

if [[ -f "$bin/.complete" ]]; then
	link_repo_cache
	echo "control plane up to date: $bin (kube $KUBE_VERSION, helm $HELM_VERSION)"
	exit 0
fi

mkdir -p "$cache/bin"
# Two builds at once (a test run and a developer) would double a long compile: serialise.
exec 9>"$cache/bin/.build.lock"
flock 9
if [[ -f "$bin/.complete" ]]; then
	link_repo_cache
	echo "control plane up to date: $bin (built by a concurrent run)"
	exit 0
fi

start=$(date +%s)
tmp="$bin.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT # a failed build leaves nothing half-made behind
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}"

# The k8s components report their version from ldflags; without them the apiserver
# announces v0.0.0-master, which clients and helm's kubeVersion checks misread.
major="${KUBE_VERSION#v}"
major="${major%%.*}"
minor="$(echo "$KUBE_VERSION" | cut -d. -f2)"
vpkg="k8s.io/component-base/version"
ldflags="-s -w -X $vpkg.gitVersion=$KUBE_VERSION -X $vpkg.gitMajor=$major -X $vpkg.gitMinor=$minor"
ldflags+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"

echo "building control plane $KUBE_VERSION into $bin (nice -n 19; many minutes on 2 cores)"
(cd "$src" && nice -n 19 go build -trimpath -ldflags "$ldflags" -o "$tmp/control-plane" .)
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
	ln -s control-plane "$tmp/$c"
done
mid=$(date +%s)
echo "control-plane binary built in $((mid - start)) s"

echo "building helm $HELM_VERSION"
hv="helm.sh/helm/v3/internal/version"
GOBIN="$tmp" nice -n 19 go install -trimpath \
	-ldflags "-s -w -X $hv.version=$HELM_VERSION -X $hv.gitTreeState=clean" \
	"helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
end=$(date +%s)
echo "helm built in $((end - mid)) s"

echo "kube=$KUBE_VERSION helm=$HELM_VERSION go=$(go env GOVERSION) built=$(date -u +%FT%TZ) seconds=$((end - start))" \
	>"$tmp/.complete"
rm -rf "$bin"
mv "$tmp" "$bin"
link_repo_cache
echo "control plane built in $((end - start)) s: $bin"
