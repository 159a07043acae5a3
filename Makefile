# `make serve` and `make test` work on a fresh machine: each sets up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup fast test test-fleet test-native lint serve bench clean

$(STAMP): pyproject.toml constraints/cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[dev]" -c constraints/cpu.txt
	touch $(STAMP)

setup: $(STAMP) fast

# The compiled core (kvadmit/native.py): mypyc builds the simulator's hot modules into src/kvadmit/_native,
# about 1.4x faster `kvadmit simulate` (docs/sim-speed-profile.md). Needs a C compiler; when the build fails
# it says so in one line and kvadmit stays pure Python. KVADMIT_PURE_PYTHON=1 runs the Python source anyway;
# a build older than the source is never loaded. `make test` does not need it.
fast: $(STAMP)
	$(BIN)/pip install --quiet -e ".[fast]" -c constraints/cpu.txt || echo "kvadmit: mypy could not be installed"
	$(BIN)/python -m kvadmit.native_build

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

# The compiled core built (failing if it cannot be) and the tests that read it: compiled and pure simulate
# byte for byte (tests/test_native.py), then the scheduler, capacity and simulate tests on the compiled core
test-native: $(STAMP)
	$(BIN)/pip install --quiet -e ".[fast]" -c constraints/cpu.txt
	$(BIN)/python -m kvadmit.native_build --strict
	$(BIN)/python -m pytest tests/test_native.py tests/test_scheduler_properties.py tests/test_scenario_errors.py \
		tests/test_simulate.py tests/test_leaps.py tests/test_rules_detail.py tests/test_admission.py \
		tests/test_native_inits.py tests/test_pickling.py tests/test_workload_stops.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The default model on 127.0.0.1:30000; pass more flags with ARGS="--enable-metrics ...". SERVE_DEFAULTS is
# the setting that meets all three of issue 22's targets at once (benchmarks/engine_speed.txt, 2 AMD EPYC
# cores, 1 thread each, best of 2 rounds): int4 weights through kvadmit's own CPU kernels and an int8 KV
# cache (98.8% greedy agreement with float32; Paris): single stream 86.5 tok/s against llama.cpp's
# llama-server 84.5 on 2026-12-03 (102.5 against 88.9 the day before: the single stream moves by a quarter
# between runs), 16 concurrent requests 79.3 against 29.1, peak memory 543 MB against 434 (target 600).
# It starts in seconds. Faster in a single stream, at 847 MB
# and a first start that compiles for about 2 minutes: SERVE_DEFAULTS="--quantization int4
# --enable-torch-compile" (134.7 tok/s, 7.4 ms a token; bf16 KV, 99.2%). The kernels run on one thread.
# On a GPU: SERVE_DEFAULTS= (int4 is CPU only).
SERVE_DEFAULTS ?= --quantization int4 --kv-cache-dtype int8
serve: $(STAMP)
	$(BIN)/kvadmit serve $(SERVE_DEFAULTS) $(ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/scheduler_overhead.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache src/kvadmit/_native
