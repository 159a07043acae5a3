"""`kvadmit simulate --replay TRACE.jsonl`: the requests of a measured (or simulated) run, each sent at
its own time with its own lengths, so a simulation can be compared with that run request by request.

One JSON object per line (observe/request_trace.py reads it). Fields (the per-request file
`kvadmit simulate --trace-requests` writes):

    arrival          seconds from the start of the run to when the client sent it (required)
    prompt_len       prompt tokens (required)
    max_new_tokens   what the client asked for (required)
    output_len       tokens it really generated
    true_output_len  where it stops (EOS), when known; preferred over output_len
    ignore_eos       default false
    rid              kept for reference; the simulation names requests req-0, req-1, … in arrival order
    input_ids        the prompt's token ids (optional; with them, cached prefixes replay as they were)
    seq              the order the server received requests in (breaks ties of arrival)
    arrival_step     the engine steps run before the server received it (needed by step replay)
    after_idle       whether an idle pass came between those steps and it (step replay; default false)
    finish           stop, length or abort: how it ended on the server (step replay refuses aborts)

`kvadmit serve --trace-requests FILE` writes all of these. A request without ignore_eos stops at
true_output_len (or output_len, or max_new_tokens when neither is known); with ignore_eos it runs to
max_new_tokens. Without input_ids, prompts are distinct token sequences, so no two requests share a
cached prefix.

Two ways to replay (`--replay-arrival`): `time` sends each request at its arrival time (the scheduler
sees it --request-latency-ms later), so a faster or slower simulated server sees requests at other steps
than the real one did; `step` hands each request to the scheduler right after the step it followed on
the server (taking the idle pass it saw first, if any), so given the same output lengths every
scheduling decision can be compared with the server's, step for step.

It also takes the file `kvadmit bench --output-file F --output-details` writes: one JSON line per run
whose per-request lists give, request by request, `arrival_times` (when the client made the request),
`input_lens`, `output_lens` (what the server generated: where the request stopped), `max_new_tokens`
and `ignore_eos`, and whose `max_concurrency` becomes the replay's concurrency limit: a request is sent
at its arrival time or when a slot frees, as the bench client sent it, so a slower or faster simulated
server shifts the sends as it would have shifted the real ones. Files from before `arrival_times`: each
request arrives at its `start_times` entry (when it was really sent) and no limit applies; from before
`max_new_tokens` and `ignore_eos`: the output length is the budget, ignore_eos false. Requests that
failed (a non-empty `errors` entry) are left out. A file that holds several runs (the output file is
appended to) must be cut to one: which run to replay is not guessed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from kvadmit.bench.workload import SimRequest
from kvadmit.observe.request_trace import TracedRequest, TraceError, read_row

ReplayError = TraceError  # the trace cannot be replayed; the message names the line and the field


@dataclass(frozen=True, slots=True)
class Replay:
    requests: tuple[SimRequest, ...]
    arrivals: tuple[float, ...]  # seconds after the start of the measured run, one per request
    rids: tuple[str, ...]  # the trace's own ids (or req-N when it has none)
    max_concurrency: int | None = None  # the bench run's limit, when its file gives arrival times
    arrival_steps: tuple[int, ...] | None = None  # per request, when every line gives arrival_step
    after_idle: tuple[bool, ...] | None = None
    # Why this trace cannot be replayed step for step (empty: it can), each naming its line.
    step_problems: tuple[str, ...] = ()


BENCH_LISTS = ("start_times", "input_lens", "output_lens")  # what marks a `kvadmit bench` details line


def bench_rows(run: dict[str, object], where: str) -> list[dict[str, object]]:
    """A `kvadmit bench --output-details` run as one trace row per request that succeeded."""
    n = None
    for key in (*BENCH_LISTS, "arrival_times", "max_new_tokens", "ignore_eos", "errors"):
        values = run.get(key)
        if values is None and key not in BENCH_LISTS:
            continue
        if not isinstance(values, list):
            raise ReplayError(f"{where}: the bench run's {key} must be a list, got {type(values).__name__}")
        if n is not None and len(values) != n:
            raise ReplayError(f"{where}: the bench run's {key} has {len(values)} entries, not {n}")
        n = len(values)
    sent, inputs, outputs = (run[k] for k in BENCH_LISTS)
    starts = run.get("arrival_times") or sent
    assert isinstance(starts, list) and isinstance(inputs, list) and isinstance(outputs, list)
    budgets = run.get("max_new_tokens") or outputs
    ignore = run.get("ignore_eos") or [False] * len(starts)
    errors = run.get("errors") or [""] * len(starts)
    assert isinstance(budgets, list) and isinstance(ignore, list) and isinstance(errors, list)
    return [
        {"rid": f"bench-{i}", "arrival": starts[i], "prompt_len": inputs[i], "output_len": outputs[i],
         "max_new_tokens": budgets[i], "ignore_eos": ignore[i]}
        for i in range(len(starts)) if not errors[i]
    ]  # fmt: skip


def bench_concurrency(run: dict[str, object], where: str) -> int | None:
    """The limit a bench run's requests waited for, when its file says when each was made."""
    limit = run.get("max_concurrency")
    if limit is None or run.get("arrival_times") is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise ReplayError(f"{where}: max_concurrency must be a positive integer or null, got {limit!r}")
    return limit


def _json_rows(lines: list[str], name: str) -> tuple[list[tuple[int, str, dict[str, object]]], int | None]:
    """(line number, where, row) per request: trace lines as they are, a bench run's line expanded; and
    the bench run's concurrency limit."""
    rows: list[tuple[int, str, dict[str, object]]] = []
    runs = 0
    limit = None
    for no, text in enumerate(lines, 1):
        if not text.strip():
            continue
        where = f"{name}:{no}"
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise ReplayError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ReplayError(f"{where}: each line must be a JSON object")
        if "arrival" not in row and any(k in row for k in BENCH_LISTS):
            if not all(k in row for k in BENCH_LISTS):
                raise ReplayError(f"{where}: a bench run line needs {', '.join(BENCH_LISTS)} "
                                  "(write it with kvadmit bench --output-details)")  # fmt: skip
            runs += 1
            if runs > 1:
                raise ReplayError(f"{name}: holds more than one bench run (line {no} is another); "
                                  "keep the one to replay")  # fmt: skip
            rows.extend((no, f"{where} {r['rid']}", r) for r in bench_rows(row, where))
            limit = bench_concurrency(row, where)
        else:
            rows.append((no, where, row))
    return rows, limit


def parse_replay(lines: list[str], vocab_size: int = 32000, seed: int = 0, name: str = "trace") -> Replay:
    """The requests in order of arrival (seq, then file order, on ties)."""
    rows: list[TracedRequest] = []
    problems: list[str] = []
    first_without_step: str | None = None
    found, limit = _json_rows(lines, name)
    for no, where, row in found:
        traced = read_row(row, where, no)
        if traced.finish == "abort":
            rid_text = row.get("rid", "no rid")
            problems.append(f"{where}: the request was aborted ({rid_text}), and the trace does not say at "
                            "which step")  # fmt: skip
        if traced.ignore_eos and traced.finish == "stop":
            problems.append(f"{where}: an ignore_eos request that a stop string ended (the replay cannot end "
                            "it there)")  # fmt: skip
        if traced.arrival_step is None and first_without_step is None:
            first_without_step = where
        rows.append(traced)
    if not rows:
        raise ReplayError(f"{name}: no requests")
    rows.sort(key=lambda r: (r.arrival, r.seq))
    offsets = np.random.RandomState(seed).randint(0, vocab_size, size=len(rows)).tolist()
    requests = tuple(
        SimRequest(i, r.prompt_len, r.max_new_tokens, r.max_new_tokens, r.stop_at, r.ignore_eos, offsets[i],
                   r.input_ids)
        for i, r in enumerate(rows)
    )  # fmt: skip
    steps = [r.arrival_step for r in rows]
    has_steps = all(s is not None for s in steps)
    if first_without_step is not None:
        missing = f"{first_without_step}: no arrival_step (kvadmit serve --trace-requests writes one)"
        problems.insert(0, missing)
    seqs = [r.seq for r in rows]
    if has_steps and len(set(seqs)) != len(seqs):
        problems.append(f"{name}: seq repeats (two requests with the same receipt number)")
    return Replay(
        requests,
        tuple(r.arrival for r in rows),
        tuple(r.rid for r in rows),
        limit,
        tuple(s for s in steps if s is not None) if has_steps else None,
        tuple(r.after_idle for r in rows) if has_steps else None,
        tuple(problems),
    )


def load_replay(path: str, vocab_size: int = 32000, seed: int = 0) -> Replay:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ReplayError(f"cannot read {path!r}: {e.strerror}") from None
    return parse_replay(lines, vocab_size, seed, path.rsplit("/", 1)[-1])
