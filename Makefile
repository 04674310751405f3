# Two entry points that work on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench reliability clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

serve: $(STAMP)
	mkdir -p data
	$(BIN)/python -m proxy --config config.example.yaml

lint: $(STAMP)
	$(BIN)/ruff check proxy policies tests bench
	$(BIN)/ruff format --check proxy policies tests bench
	$(BIN)/mypy

test: $(STAMP) lint
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/replay.py
	$(BIN)/python bench/cache.py

# The long reliability suite: 20,000 fuzzed bodies, a 24 MiB message, a longer soak
# and kill -9 load; then one table of its figures (README "Reliability").
reliability: $(STAMP)
	rm -f .reliability.jsonl
	RELIABILITY_REPORT=$(CURDIR)/.reliability.jsonl RELIABILITY_BODIES=10000 \
	RELIABILITY_BIG_MIB=24 RELIABILITY_SOAK=3000 RELIABILITY_KILL_LOAD_S=3 \
	$(BIN)/pytest -q tests/reliability
	$(BIN)/python bench/reliability.py .reliability.jsonl

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
