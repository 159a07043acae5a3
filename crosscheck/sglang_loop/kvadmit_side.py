"""Run loop scenarios through kvadmit's Engine (its Scheduler, a stub executor that returns the scenario's
tokens, SGLang's log lines from kvadmit's log writer) and record what happened, in the same format as
sglang_side.py. One JSON line per scenario.

Usage (the project's venv, this worktree's src on PYTHONPATH):
    python kvadmit_side.py SCENARIOS.jsonl > kvadmit_records.jsonl
"""

from __future__ import annotations

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The recorder wraps the scheduler's check_decode_or_retract to see decode skips, which the compiled core
# (make fast) refuses: this side runs the Python source (the compiled core is checked against it
# byte for byte by tests/test_native.py and benchmarks/native_golden.sh).
os.environ["KVADMIT_PURE_PYTHON"] = "1"

import record

from kvadmit.config import SchedulerKnobs, ServerArgs
from kvadmit.engine import Engine, VirtualClock
from kvadmit.executor.base import StepResult
from kvadmit.observe.sglang_log import SGLangLogWriter
from kvadmit.request import Req, SamplingLimits
from kvadmit.scheduler.decode_memory import DECODE_SKIPPED
from kvadmit.scheduler.events import Event, LastRequestAborted, RequestAborted, Retraction
from kvadmit.scheduler.scheduler import EngineCrash, Scheduler
from kvadmit.scheduler.types import UNSCHEDULABLE_MESSAGE, ScheduledBatch

STALL_STEPS = 1_000_000


def server_args(server: dict) -> ServerArgs:
    chunk = server.get("chunked_prefill_size")
    kw = dict(
        max_total_tokens=server["max_total_tokens"],
        page_size=server["page_size"],
        schedule_conservativeness=server["schedule_conservativeness"],
        max_running_requests=server.get("max_running_requests"),
        max_prefill_tokens=server["max_prefill_tokens"],
        chunked_prefill_size=chunk if chunk is not None else -1,
        schedule_policy=server["schedule_policy"],
        disable_radix_cache=server["disable_radix_cache"],
        decode_log_interval=server["decode_log_interval"],
        context_length=server["context_length"],
    )
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    if "disable_overlap_schedule" in names:
        kw["disable_overlap_schedule"] = not server["overlap"]
    elif server["overlap"]:
        raise NotImplementedError("this kvadmit has no overlap loop (ServerArgs.disable_overlap_schedule)")
    if server.get("enable_priority_scheduling"):
        kw["enable_priority_scheduling"] = True
    if server.get("enable_mixed_chunk"):
        kw["enable_mixed_chunk"] = True
    if server.get("env"):
        kw["knobs"] = SchedulerKnobs.from_environ(server["env"])
    if server.get("sglang_version"):
        kw["sglang_version"] = server["sglang_version"]
    return ServerArgs(**kw)


class Recorder:
    """Engine listener, event observer and stub executor at once: it sees every launch, event and end."""

    def __init__(self, scenario: dict, scheduler: Scheduler) -> None:
        self.sc = scenario
        self.scheduler = scheduler
        self.events: list = []
        self.launched = 0
        self.eos_at = {r["rid"]: r.get("eos_at") for r in scenario["requests"]}
        self.pending: dict[str, int] = {}  # rid -> tokens launched but not yet appended (overlap)
        self.log = SGLangLogWriter(self._line, start_time=0.0)

    def watch(self, engine: Engine) -> None:
        """Record what SGLang's loop shows but kvadmit's events do not name (a skipped decode pass), and
        date the events of result processing as SGLang's overlap loop does. That loop launches the next
        batch before it processes the last one's result; kvadmit's engine processes it first, then
        launches. Both come before the next pass, so they are one moment: the ends and log lines of a
        result processed in a step that launches a batch are dated after that launch, as on SGLang's side."""
        scheduler = self.scheduler
        check = scheduler.check_decode_or_retract

        def check_decode_or_retract(*args, **kwargs):
            outcome = check(*args, **kwargs)
            if outcome is DECODE_SKIPPED:
                self.events.append(["S", self.launched])
            return outcome

        scheduler.check_decode_or_retract = check_decode_or_retract  # type: ignore[method-assign]
        if not getattr(engine, "overlap", False):
            return
        process = engine._process

        def processed(batch, result):
            launches = scheduler.last_batch is not None  # scheduled in this step, launched after
            self.launched += launches
            try:
                process(batch, result)
            finally:
                self.launched -= launches

        engine._process = processed  # type: ignore[method-assign]

    # executor
    def run(self, batch: ScheduledBatch) -> StepResult:
        self.launched += 1
        if batch.kind == "prefill":
            riding = set(map(id, getattr(batch, "decoding", None) or ()))  # mixed chunk: decode rows extend 1
            rows = [[r.rid, 1 if id(r) in riding else r.extend_input_len] for r in batch.reqs]
        else:
            rows = [[r.rid, 1] for r in batch.reqs]
        self.events.append(["B", self.launched, batch.kind, rows, self.scheduler.ratio.current])
        tokens = []
        for r in batch.reqs:
            index = len(r.output_ids)
            tokens.append(record.EOS_TOKEN if self.eos_at.get(r.rid) == index else record.OTHER_TOKEN)
        return StepResult(tokens, 0.0)

    # listener
    def on_step(self, batch: ScheduledBatch, now: float) -> None:
        pass

    def on_finish(self, req: Req, now: float) -> None:
        assert req.finished_reason is not None
        self.events.append(["F", self.launched, req.rid, req.finished_reason.kind.value])

    # observer
    def observe(self, event: Event, now: float) -> None:
        if isinstance(event, Retraction) and not event.forced:
            self.events.append(
                [
                    "R",
                    self.launched,
                    list(event.rids),
                    event.new_tokens_gained,
                    event.old_ratio,
                    event.new_ratio,
                ]
            )
        elif isinstance(event, LastRequestAborted):
            self.events.append(["A", self.launched, event.rid])
        elif isinstance(event, RequestAborted) and event.message == UNSCHEDULABLE_MESSAGE:
            self.events.append(["H", self.launched, event.rid])  # where SGLang would wait forever
        self.log.handle(event, now)

    def _line(self, text: str) -> None:
        line = record.normalise_log_line(text)
        if record.is_scheduling_line(line):
            self.events.append(["L", self.launched, line])


def run_scenario(sc: dict) -> dict:
    server = sc["server"]
    scheduler = Scheduler(
        server_args(server), context_len=server["context_length"], eos_token_ids=frozenset({record.EOS_TOKEN})
    )
    rec = Recorder(sc, scheduler)
    engine = Engine(scheduler, rec, VirtualClock(0.0), rec, observers=[rec.observe])
    rec.watch(engine)
    requests = sorted(sc["requests"], key=lambda r: r["arrive_after"])
    aborts = sorted((r["abort_after"], r["rid"]) for r in sc["requests"] if r.get("abort_after") is not None)
    nxt = nab = 0
    idle = False
    steps = 0
    while True:
        if nxt < len(requests) and (requests[nxt]["arrive_after"] <= rec.launched or idle):
            key = (
                max(requests[nxt]["arrive_after"], rec.launched)
                if not idle
                else requests[nxt]["arrive_after"]
            )
            key = max(key, rec.launched)
            while nxt < len(requests) and requests[nxt]["arrive_after"] <= key:
                spec = requests[nxt]
                req = Req(
                    spec["rid"],
                    list(spec["input_ids"]),
                    SamplingLimits(
                        requested_max_new_tokens=spec["max_new_tokens"],
                        ignore_eos=spec["ignore_eos"],
                        priority=spec.get("priority"),
                    ),
                )
                rec.events.append(["I", rec.launched, spec["rid"]])
                engine.submit(req)
                nxt += 1
            idle = False
        while nab < len(aborts) and aborts[nab][0] <= rec.launched:
            rec.events.append(["C", rec.launched, aborts[nab][1]])
            engine.abort(aborts[nab][1])
            nab += 1
        try:
            stepped = engine.step()
        except EngineCrash as e:  # where SGLang's scheduler raises "Out of memory" and its server dies
            rec.events.append(["X", rec.launched, str(e).removeprefix("RuntimeError: ").strip()])
            break
        if stepped:
            steps += 1
            if steps > STALL_STEPS:
                raise RuntimeError("runaway: too many steps")
            continue
        if not scheduler.is_fully_idle():
            raise RuntimeError("stalled: nothing to run but the scheduler is not idle")
        if nxt >= len(requests):
            break
        idle = True
    return {"id": sc["id"], "events": rec.events}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    record.run_each(sys.argv[1], run_scenario)


if __name__ == "__main__":
    main()
