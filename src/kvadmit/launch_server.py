"""`python -m kvadmit.launch_server ARGS`: `kvadmit serve ARGS`, for a `python -m sglang.launch_server ARGS`
line pasted as it is (every SGLang 0.5.22 launch flag parses; see kvadmit.cli.sglang_compat)."""

from __future__ import annotations

import sys

from kvadmit.cli import main


def run() -> int:
    return main(["serve", *sys.argv[1:]])


if __name__ == "__main__":
    raise SystemExit(run())
