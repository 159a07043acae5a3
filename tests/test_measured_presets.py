"""Measured presets: cpu-int4:smollm2-135m is the file `kvadmit profile --quantization int4` wrote on one
machine, shipped in the package, and cpu-int4-kv8:smollm2-135m the one `... --kv-cache-dtype int8` wrote;
each one's decode steps are the times its run printed (its .log), plus the engine loop's time per step the
profile adds to each."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvadmit.costmodel.costmodel import CostModelError
from kvadmit.costmodel.costspec import resolve_cost_model

DATA = Path(__file__).parent.parent / "src" / "kvadmit" / "costmodel" / "data"
# preset name → (its file's stem, the command its log must record)
EAGER = {
    "cpu-int4:smollm2-135m": ("cpu-int4_smollm2-135m", "kvadmit profile --quantization int4 -o"),
    "cpu-int4-kv8:smollm2-135m": (
        "cpu-int4-kv8_smollm2-135m",
        "kvadmit profile --quantization int4 --kv-cache-dtype int8 -o",
    ),
}
LINE = re.compile(r"^decode: (\d+) request\(s\), (\d+) tokens of context each: ([\d.]+) ms$")


def _logged_decode_ms(stem: str) -> dict[tuple[int, int], float]:
    """The run's own progress lines, as it printed them to two decimals."""
    found = {}
    for line in (DATA / f"{stem}.log").read_text(encoding="utf-8").splitlines():
        m = LINE.match(line.strip())
        if m:
            found[(int(m[1]), int(m[2]))] = float(m[3])
    return found


@pytest.mark.parametrize("name", list(EAGER))
def test_the_log_records_the_command_and_every_decode_point(name: str) -> None:
    stem, command = EAGER[name]
    text = (DATA / f"{stem}.log").read_text(encoding="utf-8")
    assert command in text
    logged = _logged_decode_ms(stem)
    # the default grid: batch sizes 1, 4, 16, 64 × 128, 512, 2048 tokens of context each
    assert sorted(logged) == [(b, c) for b in (1, 4, 16, 64) for c in (128, 512, 2048)]


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("cpu-int4:smollm2-135m", "cpu-int4:smollm2-135m"),
        ("CPU-INT4:SmolLM2-135M-Instruct", "cpu-int4:smollm2-135m"),
        ("cpu-int4:smollm2", "cpu-int4:smollm2-135m"),
        ("cpu-int4-kv8:smollm2", "cpu-int4-kv8:smollm2-135m"),
    ],
)
def test_the_preset_steps_are_the_measured_ones(spec: str, name: str) -> None:
    cost = resolve_cost_model(spec)
    assert cost.name == name
    stem = EAGER[name][0]
    data = json.loads((DATA / f"{stem}.json").read_text(encoding="utf-8"))
    loop_ms = data["fit"]["loop_overhead_ms"]  # rounded to 3 decimals in the file
    assert 0 <= loop_ms < 5
    for (batch, context), ms in _logged_decode_ms(stem).items():
        predicted_ms = 1000 * cost.decode.seconds(batch, batch * context)
        assert predicted_ms == pytest.approx(ms + loop_ms, abs=0.006), (batch, context)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("cpu-int4:qwen3-8b", "no measured preset for model 'qwen3-8b' on cpu-int4"),
        (
            "cpu-int4:gpt-5",
            "no measured preset for model 'gpt-5'.*measured presets: cpu-int4-kv8:smollm2-135m, cpu-int4:",
        ),
        ("cpu-int4:smollm2-135m:tp=2", "takes no options"),
        (
            "cpu-int8:smollm2-135m",
            "unknown GPU 'cpu-int8'.*measured cpu-int4-kv8:smollm2-135m, cpu-int4:smollm2-135m",
        ),
    ],
)
def test_wrong_measured_names_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(CostModelError, match=message):
        resolve_cost_model(spec)


def test_cost_model_list_names_it_and_a_wrong_name_is_one_line() -> None:
    run = [sys.executable, "-m", "kvadmit", "cost-model"]
    listed = subprocess.run([*run, "--list"], capture_output=True, text=True, check=True, timeout=60)
    assert "cpu-int4:smollm2-135m: kvadmit profile --quantization int4" in listed.stdout
    bad = subprocess.run([*run, "cpu-int4:qwen3-8b"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "no measured preset for model 'qwen3-8b'" in bad.stderr


def test_serve_simulate_takes_the_measured_preset() -> None:
    from kvadmit.server.backend import simulated_backend

    backend = simulated_backend("cpu-int4:smollm2-135m", None, 4096, None)
    assert backend.model_path == "simulated:cpu-int4:smollm2-135m" and backend.simulated
