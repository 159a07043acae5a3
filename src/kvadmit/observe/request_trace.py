"""`--trace-requests FILE`: one JSON line per request, written by `kvadmit serve` as each request ends and
by `kvadmit simulate` at the end of its run, and read back by `kvadmit simulate --replay`. Fields:

    seq              (served) the order the engine received requests in (0, 1, …); breaks ties of arrival
    rid              the request's id (a simulation's are req-0, req-1, … in arrival order)
    arrival          seconds from the start to the engine receiving it (served) or the client sending it
                     (simulated)
    arrival_step     (served) the engine steps (prefill or decode batches) run before it was received: it
                     was first seen by the scheduling pass of step arrival_step + 1
    after_idle       (served) whether the engine had found nothing to run since that step (an idle pass
                     resets the new-token ratio, so a replay must take it too)
    http_ms          (served) from the HTTP request reaching the app to its hand-over to the engine thread
                     (body parsing, tokenization, the event loop's other work): the server's share of
                     what `kvadmit simulate --request-latency-ms` stands for
    queued_ms        (served) from the hand-over to the engine receiving it: the rest of the step then
                     running (the engine takes requests between steps; a simulation makes this wait itself)
    prompt_len       prompt tokens
    max_new_tokens   what the client asked for (served: as the scheduler capped it)
    ignore_eos
    output_len       the tokens it generated
    true_output_len  (simulated) where it stops (EOS), when known
    finish           (served) stop, length or abort
    cached_tokens    (served) prompt tokens found in the prefix cache; retractions: (served) how often
    success, ttft, latency, error: (simulated) what the client saw
    input_ids        (served) the prompt's token ids

A served trace is written line by line (a run cut short keeps every row written before the cut), compact
(server/traces.py); a simulated one at the end, with json's default separators. What a replay needs of a
line, and how it reads one, is read_row's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass


class TraceError(ValueError):
    """A trace line cannot be read; the message names the line and the field."""


def served_row(
    seq: int, rid: str, arrival: float, arrival_step: int, after_idle: bool, http_s: float, queued_s: float,
    input_ids: Sequence[int], max_new_tokens: int | None, ignore_eos: bool, output_len: int, finish: str,
    cached_tokens: int, retractions: int,
) -> dict[str, object]:  # fmt: skip
    """A `kvadmit serve` request's line; http_s and queued_s are its two waits in seconds."""
    return {
        "seq": seq, "rid": rid, "arrival": round(arrival, 6), "arrival_step": arrival_step,
        "after_idle": after_idle, "http_ms": round(1000 * http_s, 3), "queued_ms": round(1000 * queued_s, 3),
        "prompt_len": len(input_ids), "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos,
        "output_len": output_len, "finish": finish, "cached_tokens": cached_tokens,
        "retractions": retractions, "input_ids": list(input_ids),
    }  # fmt: skip


def simulated_line(
    rid: str, arrival: float, prompt_len: int, max_new_tokens: int, output_len: int,
    true_output_len: int | None, ignore_eos: bool, success: bool, ttft: float, latency: float, error: str,
) -> str:  # fmt: skip
    """A `kvadmit simulate` request's line."""
    row = {
        "rid": rid, "arrival": round(arrival, 6), "prompt_len": prompt_len, "max_new_tokens": max_new_tokens,
        "output_len": output_len, "true_output_len": true_output_len, "ignore_eos": ignore_eos,
        "success": success, "ttft": round(ttft, 6), "latency": round(latency, 6), "error": error,
    }  # fmt: skip
    return json.dumps(row) + "\n"


@dataclass(frozen=True, slots=True)
class TracedRequest:
    """What a replay takes from one line."""

    arrival: float
    prompt_len: int
    max_new_tokens: int  # 0: a prefill-only request (native /generate)
    stop_at: int | None  # where it stops (None: it runs to max_new_tokens, ignore_eos)
    ignore_eos: bool
    rid: str
    input_ids: tuple[int, ...] | None
    arrival_step: int | None
    after_idle: bool
    seq: int  # the line number when the line has none
    finish: str | None


def read_row(row: dict[str, object], where: str, line_no: int) -> TracedRequest:
    """One line's request. arrival, prompt_len and max_new_tokens are required (an aborted request
    without max_new_tokens was rejected before its budget was set: 1); a request without ignore_eos stops
    at true_output_len, else output_len, else max_new_tokens."""
    arrival = row.get("arrival")
    if isinstance(arrival, bool) or not isinstance(arrival, int | float) or not arrival >= 0:
        raise TraceError(f"{where}: arrival must be a number of seconds ≥ 0, got {arrival!r}")
    prompt_len = _int(row, "prompt_len", where, 1)
    finish = row.get("finish")
    if finish == "abort" and row.get("max_new_tokens") is None:
        row = {**row, "max_new_tokens": 1}
    max_new = _int(row, "max_new_tokens", where, 0)
    ignore_eos = _bool(row, "ignore_eos", where)
    return TracedRequest(
        arrival=float(arrival),
        prompt_len=prompt_len,
        max_new_tokens=max_new,
        stop_at=None if ignore_eos else _stop(row, where, max_new),
        ignore_eos=ignore_eos,
        rid=str(row.get("rid", f"line-{line_no}")),
        input_ids=_tokens(row, where, prompt_len),
        arrival_step=_int(row, "arrival_step", where, 0) if row.get("arrival_step") is not None else None,
        seq=_int(row, "seq", where, 0) if row.get("seq") is not None else line_no,
        after_idle=_bool(row, "after_idle", where),
        finish=finish if isinstance(finish, str) else None,
    )


def _int(row: dict[str, object], key: str, where: str, minimum: int) -> int:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise TraceError(f"{where}: {key} must be an integer, got {value!r}")
    if value < minimum:
        raise TraceError(f"{where}: {key} must be ≥ {minimum}, got {value}")
    return int(value)


def _stop(row: dict[str, object], where: str, max_new: int) -> int:
    for key in ("true_output_len", "output_len"):
        if row.get(key) is not None and row.get(key) != 0:
            return min(_int(row, key, where, 1), max_new)
    return max_new


def _bool(row: dict[str, object], key: str, where: str) -> bool:
    value = row.get(key, False)
    if not isinstance(value, bool):
        raise TraceError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _tokens(row: dict[str, object], where: str, prompt_len: int) -> tuple[int, ...] | None:
    ids = row.get("input_ids")
    if ids is None:
        return None
    if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
        raise TraceError(f"{where}: input_ids must be a list of token ids (integers ≥ 0)")
    if len(ids) != prompt_len:
        raise TraceError(f"{where}: input_ids has {len(ids)} tokens but prompt_len is {prompt_len}")
    return tuple(ids)
