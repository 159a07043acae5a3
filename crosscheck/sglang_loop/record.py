"""The shared vocabulary of both sides of the loop check: the stub model's tokens and how a run is
recorded (plain Python: imported by the SGLang side in its venv and by the kvadmit side in the project's)."""

from __future__ import annotations

import json
import re
import sys
import traceback
from collections.abc import Callable
from typing import TextIO

EOS_TOKEN = 2  # the stub model's EOS id (the model config's only EOS id)
OTHER_TOKEN = 7  # every other output token

# Timestamps, throughputs and the graph flag are left out of the compared log lines.
_DROP = [
    re.compile(r"^\[[^\]]*\]\s*"),
    re.compile(r",?\s*(input|gen) throughput \(token/s\): [0-9.]+"),
    re.compile(r",?\s*(cuda graph|cpu graph|graph): (True|False)"),
]


def normalise_log_line(line: str) -> str:
    for pat in _DROP:
        line = pat.sub("", line)
    return line.strip().rstrip(",").strip()


def is_scheduling_line(line: str) -> bool:
    return line.startswith(("Prefill batch", "Decode batch", "KV cache pool is full", "retract_decode"))


def run_each(path: str, run_scenario: Callable[[dict], dict], out: TextIO | None = None) -> None:
    """Run every scenario of a JSON-lines file and print its record as a JSON line; a scenario that
    raises is reported as an error with its traceback, and the rest still run."""
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            sc = json.loads(line)
            try:
                record = run_scenario(sc)
            except Exception as e:  # report, keep going
                record = {
                    "id": sc["id"],
                    "error": f"{type(e).__name__}: {e}",
                    "trace": traceback.format_exc()[-2000:],
                }
            print(json.dumps(record), file=out or sys.stdout, flush=True)
