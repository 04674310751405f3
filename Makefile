# Two entry points that work on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench clean

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
	$(BIN)/python bench/recall.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
