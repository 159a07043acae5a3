"""The repository stands alone: no tracked text file points outside it.

A clone has no sibling folder of shared notes and no development machine's home or work directory, so a
tracked file that names one (a test reading data from there, a README linking there) breaks for everyone
else. The forbidden patterns are built from pieces so that this file does not match itself."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DOTS = ".."
SHARED = DOTS + "/" + "shared"
# An absolute path on a development machine: under the work, root, home/<user> or Users/<user> folders
# at the top of the file system.
# The look-behind keeps a folder of that name inside a URL's path (after another folder) from matching.
MACHINE_DIRS = "|".join(["wo" + "rk", "ro" + "ot", "ho" + "me/[^/\\s]+", "Us" + "ers/[^/\\s]+"])
FORBIDDEN = re.compile(re.escape(SHARED) + "|(?<![\\w.~-])/(?:" + MACHINE_DIRS + ")/")


def tracked_files() -> list[Path]:
    """The files git tracks here; skip (or fail under CI) when this is not a git checkout."""
    try:
        done = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        done = None
        why = f"git ls-files did not run: {e}"
    else:
        why = f"not a git checkout: {done.stderr.decode(errors='replace').strip()}"
    if done is None or done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run in a git checkout ({why})")
        pytest.skip(why)
    return [ROOT / name for name in done.stdout.decode().split("\0") if name]


def text_of(path: Path) -> str | None:
    """A tracked file's text; None for a binary file (one with a NUL byte) or one deleted but not staged."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def offending_lines(text: str) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if FORBIDDEN.search(line)]


def test_the_patterns_catch_what_they_must_and_spare_urls() -> None:
    for bad in [
        "see " + SHARED + "/DESIGN.md",
        "LOGS = Path('/" + "work/shared/logs')",
        "cd /" + "root/kvadmit",
        "open /" + "home/alice/notes.txt",
        "/" + "Users/bob/src/x.py",
    ]:
        assert FORBIDDEN.search(bad), bad
    for fine in [
        "https://example.org/network/" + "work/page",
        "tests/data/logs/README.md",
        "/" + "home/ alone is not a user's home",
        "/sgl-workspace/sglang/python/sglang/srt/managers/schedule_batch.py",
    ]:
        assert not FORBIDDEN.search(fine), fine


def test_no_tracked_file_points_outside_the_repository() -> None:
    found: list[str] = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        for n, line in offending_lines(text):
            found.append(f"{path.relative_to(ROOT)}:{n}: {line[:120]}")
    assert not found, "tracked files point outside the repository:\n" + "\n".join(found)
