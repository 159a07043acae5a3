"""Doctor test helpers: the real log excerpts under tests/data/logs by number, and a log of lines of a
test's own, each diagnosed as `kvadmit doctor LOG` would."""

from __future__ import annotations

from pathlib import Path

from kvadmit.doctor.diagnose import Inputs, diagnose
from kvadmit.doctor.model import Diagnosis

LOGS = Path(__file__).parent / "data" / "logs"


def run(name: str) -> Diagnosis:
    """The diagnosis of the excerpt whose file name starts with `name` (its number, e.g. "54")."""
    return diagnose(Inputs(log=str(next(LOGS.glob(f"{name}-*.log")))))


def run_lines(tmp_path: Path, lines: list[str]) -> Diagnosis:
    log = tmp_path / "x.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return diagnose(Inputs(log=str(log)))
