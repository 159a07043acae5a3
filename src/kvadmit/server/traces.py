"""The JSON-lines files `kvadmit serve` writes. `--trace-steps FILE`: one line per step, the fields
`kvadmit simulate --trace-steps` writes (observe/step_trace.py). `--trace-requests FILE`: one line per
request as it ends, with what `kvadmit simulate --replay` needs to run the same requests again, by their
times or step by step:

    seq           the order the engine received requests in (0, 1, …)
    rid           the request's id
    arrival       seconds from the server's start to the engine receiving it
    arrival_step  the engine steps (prefill or decode batches) run before it was received: it was first
                  seen by the scheduling pass of step arrival_step + 1
    after_idle    whether the engine had found nothing to run since that step (an idle pass resets the
                  new-token ratio, so a replay must take it too)
    http_ms       from the HTTP request reaching the app to its hand-over to the engine thread (body
                  parsing, tokenization, the event loop's other work): the server's share of what
                  `kvadmit simulate --request-latency-ms` stands for
    queued_ms     from the hand-over to the engine receiving it: the rest of the step then running
                  (the engine takes requests between steps; a simulation makes this wait itself)
    prompt_len, input_ids, max_new_tokens (as the scheduler capped it), ignore_eos
    output_len    the tokens it generated; finish: stop, length or abort; cached_tokens; retractions

Both are written line by line (a run cut short keeps every row written before the cut).
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
