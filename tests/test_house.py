"""The house rules that keep the source readable: no module in src/ over 400 lines, no function over 80.

A file that outgrows one job, or a function that no longer fits on a screen, fails here with its name and
its length, so it is split when it grows rather than when someone finally notices."""

from __future__ import annotations

import ast
from pathlib import Path

import kvadmit

SRC = Path(kvadmit.__file__).parent
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_source_file_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in _modules()
        if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_FILE_LINES
    }
    assert not long, f"source files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_is_over_80_lines() -> None:
    long: dict[str, int] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(SRC)}:{node.lineno} {node.name}"] = length
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_checks_see_the_whole_package() -> None:
    """Guards the two tests above against an empty or wrong folder, which would pass them vacuously."""
    names = {str(p.relative_to(SRC)) for p in _modules()}
    assert {"engine.py", "scheduler/admission.py", "server/app.py", "doctor/diagnose.py"} <= names
