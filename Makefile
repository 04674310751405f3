# Two entry points that work on a fresh machine: `make serve` and `make test`.
# Both install exactly the versions pinned, with hashes, in the lock files
# (requirements.lock: runtime; requirements-dev.lock: runtime + dev tools), so a
# new release of a dependency changes nothing until `make lock` is run and committed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.runtime-installed
DEV := $(VENV)/.dev-installed
PIP := $(VENV)/.pip-installed
# The resolver behind `make lock` (uv's pip-compatible compile), itself pinned.
UV_VERSION := 0.13.9
LOCK_FLAGS := --universal --python-version 3.11 --generate-hashes --quiet \
	--custom-compile-command "make lock"

.PHONY: serve test lint bench reliability lock lock-upgrade clean chromium screenshots node

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip first, pinned with its hash: the one a new venv starts with varies by machine
# and an old one misreads the locks (requirements-pip.lock says how).
$(PIP): requirements-pip.lock | $(BIN)/python
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements-pip.lock
	touch $@

# The project itself goes in without dependencies: the lock brought them all.
$(RUNTIME): requirements.lock pyproject.toml $(PIP)
	$(BIN)/pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

# llama-cpp-python (dev extra: tests/local, bench/local.py) compiles llama.cpp from its
# sdist, once (then pip's wheel cache): CPU only and portable (no -march=native, no BLAS,
# no OpenMP), without llama.cpp's own tests, examples, tools and server.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF

$(DEV): requirements-dev.lock pyproject.toml $(PIP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --quiet --require-hashes -r requirements-dev.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(RUNTIME) $@

# The coding agents the tests drive through the proxy (tests/agents/: the Codex CLI, Claude Code),
# exactly as package-lock.json pins them; again only when the lock changes.
NODE_STAMP := node_modules/.installed
$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

node: $(NODE_STAMP)

serve: $(RUNTIME)
	$(BIN)/python -m proxy --config config.example.yaml

lint: $(DEV)
	$(BIN)/ruff check proxy policies tests bench
	$(BIN)/ruff format --check proxy policies tests bench
	$(BIN)/mypy

test: $(DEV) lint $(NODE_STAMP)
	@./.ci/ensure-chromium
	$(BIN)/pytest -q

# The browser tests drive Debian's chromium: apt-installed when missing (idempotent).
chromium:
	@./.ci/ensure-chromium

# Regenerate the session viewer's screenshots (docs/screenshots/) from the browser tests.
screenshots: $(DEV) chromium
	CTXPROXY_SCREENSHOTS=1 $(BIN)/pytest -q tests/ops/test_viewer_browser.py

bench: $(DEV)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/replay.py
	$(BIN)/python bench/cache.py
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/recall.py
	$(BIN)/python bench/history.py
	$(BIN)/python bench/agents.py
	$(BIN)/python bench/local.py

# The long reliability suite: 10,000 fuzzed bodies per endpoint (fewer for the path-id
# ones: tests/reliability/endpoints.py), a 24 MiB message, a longer soak and kill -9
# load; then one table of its figures (docs/benchmarks/reliability.md).
reliability: $(DEV)
	rm -f .reliability.jsonl
	RELIABILITY_REPORT=$(CURDIR)/.reliability.jsonl RELIABILITY_BODIES=10000 \
	RELIABILITY_BIG_MIB=24 RELIABILITY_SOAK=3000 RELIABILITY_KILL_LOAD_S=3 \
	$(BIN)/pytest -q tests/reliability
	$(BIN)/python bench/reliability.py .reliability.jsonl

# After a change to the dependencies in pyproject.toml: pins what is new, keeps
# every other pin (lock-upgrade moves everything to the newest allowed versions).
lock: | $(BIN)/python
	$(BIN)/pip install --quiet "uv==$(UV_VERSION)"
	$(BIN)/uv pip compile pyproject.toml --extra dev $(LOCK_FLAGS) $(UPGRADE) \
		-o requirements-dev.lock
	$(BIN)/uv pip compile pyproject.toml $(LOCK_FLAGS) -c requirements-dev.lock \
		-o requirements.lock

lock-upgrade:
	$(MAKE) lock UPGRADE=--upgrade

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis node_modules
