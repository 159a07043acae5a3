"""The engine loop on its own thread.

HTTP handlers tokenize, build a Job and hand it over; the engine thread owns the scheduler, the executor
and every Req, and is the only thread that touches them. Everything crosses threads by message (channels.py):
commands go in through the Mailbox (run between steps), tokens and ends come out through each request's
Stream. So HTTP, tokenization and detokenization never stall a forward step, and a step never waits on a
client.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kvadmit.config import ServerArgs
from kvadmit.engine import Engine, WallClock
from kvadmit.executor.base import StepResult
from kvadmit.observe.request_trace import served_row
from kvadmit.observe.sglang_log import SGLangLogWriter
from kvadmit.observe.startup import startup_info
from kvadmit.observe.step_trace import step_row
from kvadmit.request import MAX_NEW_TOKENS_UNSET, FinishKind, Req
from kvadmit.scheduler.scheduler import Scheduler
from kvadmit.scheduler.types import ScheduledBatch
from kvadmit.server.backend import Backend
from kvadmit.server.channels import Finished, Job, Mailbox, Outbox, Tokens
from kvadmit.server.metrics import ServerMetrics
from kvadmit.server.request_times import RequestTimes
from kvadmit.server.traces import TraceFile
from kvadmit.stop_strings import StopStringWatch

T = TypeVar("T")
SHUTDOWN_MESSAGE = "The server is shutting down."
log = logging.getLogger("kvadmit.server")


@dataclass(slots=True)
class _Live:
    job: Job
    req: Req
    sent: int = 0  # output tokens already put on the stream
    first_token_time: float | None = None
    stop_watch: StopStringWatch | None = None  # only for requests with stop strings
    # When the engine received it (for --trace-requests): its order, seconds since the start, the steps
    # run before it, and whether an idle pass came between the last of them and it.
    seq: int = 0
    arrival: float = 0.0
    arrival_step: int = 0
    after_idle: bool = False


class EngineRunner:
    def __init__(
        self,
        backend: Backend,
        args: ServerArgs,
        *,
        metrics: ServerMetrics | None = None,
        emit_log: Callable[[str], None] | None = None,
        watchdog_timeout: float = 300.0,
        request_trace: TraceFile | None = None,
        step_trace: TraceFile | None = None,
        stream_interval: int = 1,
    ) -> None:
        self.backend = backend
        self.stream_interval = stream_interval  # --stream-interval
        self.request_trace = request_trace
        self.step_trace = step_trace
        self.started = time.monotonic()  # the traces' times: never out of receipt order
        self.args = args
        self.metrics = metrics
        self.watchdog_timeout = watchdog_timeout
        self.scheduler = Scheduler(
            args,
            max_total_tokens=backend.pool_size,
            context_len=backend.context_len,
            eos_token_ids=backend.eos_token_ids,
            stop_checker=self._stop_checker,
        )
        observers: list[Callable[[Any, float], None]] = []
        self.startup_line = ""
        if emit_log is not None:
            writer = SGLangLogWriter(
                emit_log,
                start_time=time.time(),
                graph_label="cpu graph" if backend.device == "cpu" else "cuda graph",
                pending_token_field=self.scheduler.profile.prefill_log_has_pending_token,
            )
            observers.append(writer.handle)
            device = "cpu" if backend.device == "cpu" else "cuda"
            writer.handle(startup_info(self.scheduler, args, backend.available_mem_gb, device), time.time())
        step_observers = []
        self.times: RequestTimes | None = None  # --enable-metrics: meta_info's time stats
        if metrics is not None:
            metrics.attach(self.scheduler)
            self.times = RequestTimes()
            observers += [metrics.on_event, self.times.on_event]
            step_observers += [metrics.on_step, self.times.on_step]
        if step_trace is not None:
            step_observers.append(self._note_step)
        self._step_row: dict[str, object] | None = None  # the step that ran, its times still to come
        self.engine = Engine(self.scheduler, backend.executor, WallClock(), self, observers, step_observers)
        self._live: dict[str, _Live] = {}
        self._outbox = Outbox()
        self._mailbox = Mailbox(self._outbox)
        self._stopping = False
        self._idle_published = False
        self.accepting = True
        self.error: str | None = None  # why the engine loop died
        self.last_progress = time.monotonic()
        self.steps = 0
        self._idle = True  # the last pass found nothing to run
        self.submitted = 0  # requests handed to the engine thread
        self.answered = 0  # requests whose end was put on their stream (each exactly once)
        self.thread = threading.Thread(target=self._loop, name="kvadmit-engine", daemon=True)

    # ----- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort whatever is still in flight (with a reason) and end the loop."""
        self.accepting = False

        def abort_all_and_stop() -> None:
            self._abort_all(SHUTDOWN_MESSAGE, 503)
            self._stopping = True

        if self.thread.is_alive():
            self._send(abort_all_and_stop)
            self.thread.join(timeout)

    def abort_in_flight(self, message: str = SHUTDOWN_MESSAGE, status: int = 503) -> None:
        """Answer every in-flight request now with this reason (the engine frees them as they end)."""
        self._send(lambda: self._abort_all(message, status))

    def _abort_all(self, message: str, status: int) -> None:
        for rid in list(self._live):
            self._abort_now(rid, message, status)

    @property
    def healthy(self) -> tuple[bool, str]:
        if self.error is not None:
            return False, f"the engine loop died: {self.error}"
        if not self.thread.is_alive():
            return False, "the engine loop is not running"
        stalled = time.monotonic() - self.last_progress
        if self._live and stalled > self.watchdog_timeout:
            return False, (
                f"no step completed for {stalled:.0f} s with {len(self._live)} requests pending "
                f"(watchdog timeout {self.watchdog_timeout:g} s)"
            )
        return True, "ok"

    # ----- commands (any thread) ------------------------------------------------------------------
    def _send(self, command: Callable[[], None]) -> None:
        self._mailbox.send(command)

    def submit(self, job: Job) -> None:
        job.handed = time.monotonic()
        self._send(lambda: self._submit(job))

    def abort(self, rid: str) -> None:
        self._send(lambda: self._abort_client(rid))

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run fn on the engine thread between steps (to read or change scheduler state safely)."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the caller
                fut.set_exception(e)

        self._send(run)
        return fut

    # ----- the loop (engine thread) ---------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stopping:
                self._mailbox.clear_wake()
                self._mailbox.run_pending()
                self._outbox.flush()
                if self._stopping:
                    break
                begun = time.monotonic()
                if self.engine.step():
                    self.steps += 1
                    self._idle = False
                    self._idle_published = False
                    self._outbox.flush()
                    self.last_progress = time.monotonic()
                    if self.step_trace is not None and self._step_row is not None:
                        # (under the overlap loop a step that only launched a batch processed none)
                        self._trace_step(begun, self.last_progress)
                    continue
                self._idle = True
                self.last_progress = time.monotonic()
                if not self._idle_published and self.metrics is not None:
                    self.metrics.publish_idle(len(self.scheduler.waiting))
                    self._idle_published = True
                self._mailbox.wait(0.5)
        except BaseException as e:  # the loop must never die silently
            self.error = f"{type(e).__name__}: {e}"
            log.error("The engine loop died:\n%s", traceback.format_exc())
            for live in list(self._live.values()):
                self._end(live, Finished("abort", None, f"internal error: {self.error}", 500, 0, 0, 0))
            self._live.clear()
        finally:
            self._mailbox.close()  # from now on _send runs commands itself: none is ever left unanswered

    def _note_step(self, batch: ScheduledBatch, result: StepResult, now: float) -> None:
        """--trace-steps: the batch and the state after it, read as the step ends (inside engine.step)."""
        self._step_row = step_row(self.scheduler, batch, self.steps + 1, 0.0, 0.0)  # t, seconds: below
        self._step_row["forward_s"] = round(result.seconds, 9)

    def _trace_step(self, begun: float, ended: float) -> None:
        assert self.step_trace is not None and self._step_row is not None
        row, self._step_row = self._step_row, None
        row.update(t=round(ended - self.started, 6), seconds=round(ended - begun, 9))
        self.step_trace.write(row)

    def _submit(self, job: Job) -> None:
        self.submitted += 1
        if self.error is not None or not self.accepting or self._stopping:
            message = SHUTDOWN_MESSAGE
            if self.error is not None:
                message = f"The engine loop is not running ({self.error})."
            self.answered += 1
            self._outbox.put(job.stream, Finished("abort", None, message, 503, len(job.input_ids), 0, 0))
            return
        req = Req(rid=job.rid, origin_input_ids=job.input_ids, sampling=job.limits, params=job.params)
        live = _Live(job, req, seq=self.submitted - 1, arrival=time.monotonic() - self.started,
                     arrival_step=self.steps, after_idle=self._idle)  # fmt: skip
        if job.stop:
            live.stop_watch = StopStringWatch(self.backend.tokenizer, job.stop)
        self._live[job.rid] = live
        if self.metrics is not None and self.times is not None:
            self.metrics.on_arrival(job.rid, time.time())
            self.times.arrived(job.rid, time.time())
        if job.return_logprob:
            self.backend.keep_logprobs(job.rid, job.top_logprobs_num)
        if self.engine.submit(req):  # a rejection ends it at once, through on_finish
            # req.max_new_tokens: the budget the scheduler granted (req.sampling keeps the ask)
            self.backend.plan_output(job.rid, req.max_new_tokens, req.sampling.ignore_eos, job.params.seed)

    def _abort_client(self, rid: str) -> None:
        if rid in self._live:
            self.engine.abort(rid)

    def _abort_now(self, rid: str, message: str, status: int) -> None:
        live = self._live.get(rid)
        if live is None:
            return
        self.engine.abort(rid)  # waiting: ends now; running: at its next result
        if rid in self._live:  # still in a batch: answer now, the scheduler frees it at its next result
            self._end(live, self._finished(live.req, ("abort", None, message, status)))

    def _stop_checker(self, req: Req) -> str | None:
        live = self._live.get(req.rid)
        if live is None or live.stop_watch is None:
            return None
        return live.stop_watch.add(req.output_ids[-1])

    # ----- Listener (engine thread) ---------------------------------------------------------------
    def on_step(self, batch: ScheduledBatch, now: float) -> None:
        for req in batch.reqs:
            if req is batch.chunked:
                continue
            live = self._live.get(req.rid)
            if live is None:
                continue
            if live.first_token_time is None and req.output_ids:
                live.first_token_time = now
            unsent = len(req.output_ids) - live.sent
            # SGLang's stream interval: the first token at once, then once `interval` tokens are unsent
            # (the rest comes with the end, on_finish)
            interval = live.job.stream_interval or self.stream_interval
            if live.job.stream_tokens and unsent > 0 and (live.sent == 0 or unsent >= interval):
                self._outbox.put(live.job.stream, self._tokens(live))
                live.sent = len(req.output_ids)

    def on_finish(self, req: Req, now: float) -> None:
        live = self._live.get(req.rid)
        if live is None:
            return
        if len(req.output_ids) > live.sent:
            self._outbox.put(live.job.stream, self._tokens(live))
            live.sent = len(req.output_ids)
        reason = req.finished_reason
        if reason is None:
            end = ("abort", None, "ended without a reason", 500)
        elif reason.kind is FinishKind.ABORT:
            end = ("abort", None, reason.message, reason.status_code)
        else:
            end = (reason.kind.value, reason.matched, "", 200)
        self._end(live, self._finished(req, end))

    def _tokens(self, live: _Live) -> Tokens:
        """The request's tokens not sent yet (with their log probabilities when it asked for them)."""
        req, sent = live.req, live.sent
        ids = req.output_ids[sent:]
        times = self.times.meta(req.rid) if self.times is not None else None
        if not live.job.return_logprob:
            return Tokens(ids, req.cached_tokens, req.retraction_count, times=times)
        lps, tops = self.backend.logprobs(req.rid)
        end = len(req.output_ids)
        top = tops[sent:end] if live.job.top_logprobs_num else None
        return Tokens(ids, req.cached_tokens, req.retraction_count, lps[sent:end], top, times)

    def _finished(self, req: Req, end: tuple[str, int | str | None, str, int]) -> Finished:
        kind, matched, message, status = end
        live = self._live.get(req.rid)
        return Finished(
            kind, matched, message, status, len(req.origin_input_ids), len(req.output_ids), req.cached_tokens,
            live.first_token_time if live is not None else None, req.retraction_count,
            self.times.meta(req.rid) if self.times is not None else None,
        )  # fmt: skip

    def _end(self, live: _Live, finished: Finished) -> None:
        rid = live.job.rid
        if self._live.pop(rid, None) is None:
            raise AssertionError(f"request {rid} would be answered twice")
        self.answered += 1
        self.backend.forget(rid)
        if self.metrics is not None and self.times is not None:
            self.metrics.forget(rid)
            self.times.forget(rid)
        self._outbox.put(live.job.stream, finished)
        if self.request_trace is not None:
            self._trace_request(live, finished)

    def _trace_request(self, live: _Live, finished: Finished) -> None:
        assert self.request_trace is not None
        req, job = live.req, live.job
        # The budget as granted; null for a request that asked for none and was turned away before the grant.
        granted = None if req.max_new_tokens == MAX_NEW_TOKENS_UNSET else req.max_new_tokens
        self.request_trace.write(served_row(
            seq=live.seq, rid=job.rid, arrival=live.arrival, arrival_step=live.arrival_step,
            after_idle=live.after_idle, http_s=job.handed - job.received,  # to the hand-over
            queued_s=self.started + live.arrival - job.handed,  # to the receipt
            input_ids=req.origin_input_ids, max_new_tokens=granted, ignore_eos=req.sampling.ignore_eos,
            output_len=len(req.output_ids), finish=finished.kind, cached_tokens=req.cached_tokens,
            retractions=req.retraction_count,
        ))  # fmt: skip

    # ----- state (engine thread, through call()) --------------------------------------------------
    def internal_state(self) -> dict[str, Any]:
        s = self.scheduler
        free = s.pool.available_size()
        evictable = s.cache.evictable_size()
        return {
            "max_total_num_tokens": s.max_total_num_tokens,
            "available_tokens": free,
            "evictable_tokens": evictable,
            "used_tokens": s.max_total_num_tokens - free - evictable,
            "token_usage": round((s.max_total_num_tokens - free - evictable) / s.max_total_num_tokens, 4),
            "num_running_reqs": len(s.running.reqs),
            "num_queue_reqs": len(s.waiting),
            "new_token_ratio": s.ratio.current,
            "max_running_requests": s.max_running_requests,
            "context_len": s.context_len,
            "chunked_prefill_size": s.chunked_prefill_size or -1,  # SGLang's -1: chunking off
            "page_size": s.page_size,
            "steps": self.steps,
        }

    def live_rids(self) -> list[str]:
        """Requests submitted and not yet answered (engine thread, through call())."""
        return list(self._live)

    def flush_cache(self) -> bool:
        if not self.scheduler.is_fully_idle() or self._live:
            return False
        self.scheduler.cache.reset()
        return True
