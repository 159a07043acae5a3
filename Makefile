# `make serve` and `make test` work on a fresh machine: each sets up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test lint serve bench clean

$(STAMP): pyproject.toml constraints/cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[dev]" -c constraints/cpu.txt
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

serve: $(STAMP)
	@echo "kvadmit serve is not built yet (issues #4 and #5); try: $(BIN)/kvadmit capacity --help" >&2
	@exit 1

bench: $(STAMP)
	$(BIN)/python benchmarks/scheduler_overhead.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
