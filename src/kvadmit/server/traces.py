"""The JSON-lines files `kvadmit serve` writes, one compact line per row, line by line (a run cut short
keeps every row written before the cut). `--trace-steps FILE`: one line per step, the fields `kvadmit
simulate --trace-steps` writes (observe/step_trace.py). `--trace-requests FILE`: one line per request as
it ends, with what `kvadmit simulate --replay` needs to run the same requests again, by their times or
step by step (its fields: observe/request_trace.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import IO, Any

log = logging.getLogger("kvadmit.server")


class TraceFile:
    def __init__(self, path: str, flag: str) -> None:
        self.path = path
        self.flag = flag  # named in its error
        self._file: IO[str] | None = open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115 (kept open)

    def write(self, row: dict[str, Any]) -> None:
        """One line; a write that fails (a full disk) stops the trace, never the engine loop."""
        if self._file is None:
            return
        try:
            self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
        except OSError as e:
            log.error("%s: writing %s failed (%s); the trace stops here", self.flag, self.path, e.strerror)
            with contextlib.suppress(OSError):  # its buffer cannot be written either
                self._file.close()
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
