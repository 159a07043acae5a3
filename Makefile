# `make serve` and `make test` work on a fresh machine: each sets up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test test-fleet lint serve bench clean

$(STAMP): pyproject.toml constraints/cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[dev]" -c constraints/cpu.txt
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

# tests/fleet: simulated workers behind sglang-router and smg, and guidellm (the fleet extra, installed once)
FLEET_STAMP := $(VENV)/.installed-fleet

$(FLEET_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[dev,fleet]" -c constraints/cpu.txt
	touch $(FLEET_STAMP)

test-fleet: $(FLEET_STAMP)
	$(BIN)/python -m pytest tests/fleet

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The default model on 127.0.0.1:30000; pass more flags with ARGS="--enable-metrics ...". Its precision is
# the fastest measured that keeps answers right (benchmarks/engine_speed.txt): dtype auto, which is bf16 on a
# CPU with AVX512-BF16/AMX (16 concurrent requests: 1.8x int4's throughput there, single stream equal);
# ARGS="--quantization int4" gives 4-bit weights (less memory, 98.8% greedy agreement with float32).
serve: $(STAMP)
	$(BIN)/kvadmit serve $(ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/scheduler_overhead.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
