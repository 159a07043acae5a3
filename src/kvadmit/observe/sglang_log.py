"""Turns scheduler events into SGLang's log lines, timestamped by whatever clock drives the engine."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from kvadmit.observe import loglines
from kvadmit.observe.startup import startup_line
from kvadmit.scheduler.events import (
    DecodeBatchStats,
    Event,
    LastRequestAborted,
    PrefillBatchStats,
    Retraction,
    StartupInfo,
)


class SGLangLogWriter:
    """Renders events as SGLang prints them. Throughputs are tokens since the previous line of the same
    kind divided by the seconds between them, as SGLang's metrics reporter computes them."""

    def __init__(
        self,
        emit: Callable[[str], None],
        *,
        start_time: float,
        graph_label: str = "cuda graph",
        pending_token_field: bool = True,
        to_datetime: Callable[[float], datetime] = datetime.fromtimestamp,
    ) -> None:
        self.emit = emit
        self.graph_label = graph_label
        self.prefill_format = loglines.PREFILL if pending_token_field else loglines.PREFILL_CLASSIC
        self.to_datetime = to_datetime
        self._last_prefill = start_time
        self._last_decode = start_time

    def _line(self, now: float, text: str) -> None:
        self.emit(loglines.timestamp_prefix(self.to_datetime(now)) + text)

    def handle(self, event: Event, now: float) -> None:
        if isinstance(event, PrefillBatchStats):
            elapsed = now - self._last_prefill
            self._last_prefill = now
            self._line(
                now,
                self.prefill_format.render(
                    new_seq=event.new_seq,
                    new_token=event.new_token,
                    cached_token=event.cached_token,
                    token_usage=event.token_usage,
                    running_req=event.running_req,
                    queue_req=event.queue_req,
                    pending_token=event.pending_token,
                    graph_label=self.graph_label,
                    graph=False,
                    input_throughput=event.new_token / elapsed if elapsed > 0 else 0.0,
                ),
            )
        elif isinstance(event, DecodeBatchStats):
            elapsed = now - self._last_decode
            self._last_decode = now
            self._line(
                now,
                loglines.DECODE.render(
                    running_req=event.running_req,
                    num_used_tokens=event.num_used_tokens,
                    token_usage=event.token_usage,
                    graph_label=self.graph_label,
                    graph=event.graph,
                    gen_throughput=event.generated_tokens / elapsed if elapsed > 0 else 0.0,
                    queue_req=event.queue_req,
                ),
            )
        elif isinstance(event, Retraction):
            fmt = loglines.TEST_RETRACT if event.forced else loglines.RETRACT
            self._line(
                now,
                fmt.render(
                    num_retracted=len(event.rids),
                    new_tokens_gained=event.new_tokens_gained,
                    old_ratio=event.old_ratio,
                    new_ratio=event.new_ratio,
                ),
            )
        elif isinstance(event, LastRequestAborted):
            self._line(now, loglines.LAST_REQUEST_ABORTED.render(rid=event.rid))
        elif isinstance(event, StartupInfo):
            self._line(now, startup_line(event))
