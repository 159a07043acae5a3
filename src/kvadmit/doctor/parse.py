"""One log line in, one `Parsed` record out (or None for a line the doctor does not know).

The message is found by its head anywhere in the line, so every prefix seen in the wild works:
`[2026-09-13 16:06:04] `, `[2025-06-12 11:41:56 TP0] `, `2025-02-19 11:45:37 TP0] ` (no bracket),
`2025-10-20 03:02:22 INFO 31223 [DP3 TP3 EP3 file.py:222] `, vLLM's `INFO 06-16 21:24:15 metrics.py:341] `,
or nothing at all. The timestamp and rank tags are read from the text before the head, and a batch line's
fields, by observe/logread.py (the reader calibrate uses too). Field names and the heads come from
`kvadmit.observe.loglines` (SGLang) and `vllm_lines` (vLLM): no second definition.

Cheap substring tests pick the candidate format before any regex runs: most lines of a big log are
batch lines or HTTP access lines, and unknown lines cost a handful of `in` tests.
"""

from __future__ import annotations

import operator
import re

from kvadmit.doctor import vllm_lines
from kvadmit.observe import loglines
from kvadmit.observe.logread import BATCH_MARKER, PrefixReader, read_batch_fields
from kvadmit.scheduler.errors import BATCH_SIZE_HINT
from kvadmit.scheduler.retraction import (
    LAST_REQUEST_ABORT_MESSAGE,
    LAST_REQUEST_ASSERTION,
    LAST_REQUEST_VALUE_ERROR,
)

# Kinds of record.
PREFILL = "prefill"
DECODE = "decode"
RETRACT = "retract"
STARTUP = "startup"
LAST_REQUEST = "last_request"  # the last-request failure of retract_decode, by release
GPU_OOM = "gpu_oom"  # the allocator of the GPU itself ran out (activations, not the KV pool)
KV_ALLOC = "kv_alloc"  # the KV pool's allocator could not hand out a batch's slots: the scheduler crashed
KV_ALLOC_DETAIL = "kv_alloc_detail"  # that error's next lines: tokens asked for, tokens free
ABORT = "abort"
HTTP = "http"
HEALTH_FAIL = "health_fail"
ERROR = "error"
TRACEBACK = "traceback"
VLLM_STATUS = "vllm_status"
VLLM_PREEMPT = "vllm_preempt"
PROGRESS = "progress"
METRIC = "metric"

_ERROR = re.compile(r"\b([A-Z][A-Za-z0-9_.]*(?:Error|Exception))\b:?")
_ELAPSED = re.compile(r"\[(?:(\d+):)?(\d+):(\d\d)<")
_ABORT_RID = re.compile(r"Abort request (\S+)")
_KV_ALLOC = re.compile(r"(Prefill |Decode )?[Oo]ut of memory\. " + re.escape(BATCH_SIZE_HINT))
# The KV allocation failure's detail lines, in every release's spelling (`Avaliable` as 0.4 printed it,
# `Available full tokens` in 0.5).
_KV_ALLOC_ASKED = re.compile(r"^Try to allocate (\d+) tokens\.")
_KV_ALLOC_FREE = re.compile(r"^(?:Available|Avaliable) (?:full )?tokens: (\d+)")

_RETRACT_HEADS = tuple(dict.fromkeys(f.head for f in loglines.RETRACT_FORMATS))
# What the doctor reads from a batch line, in this order (`Parsed.values`); None where a line lacks it.
BATCH_VALUES = (
    "running_req",
    "queue_req",
    "token_usage",
    "num_used_tokens",
    "gen_throughput",
    "new_seq",
    "new_token",
    "cached_token",
)
_DECODE_VALUES = BATCH_VALUES[:5]
_PREFILL_VALUES = BATCH_VALUES[:3] + BATCH_VALUES[5:]
_NO_PREFILL = (None, None, None)
_NO_DECODE = (None, None)
_call = operator.call


class _Stamped:
    """An exact batch line behind SGLang's own `[YYYY-MM-DD HH:MM:SS] ` stamp, matched whole by one regex
    built from the format's definition: the fast path for the lines that make up most of a big log."""

    def __init__(self, kind: str, fmt: loglines.LineFormat, names: tuple[str, ...]) -> None:
        self.kind = kind
        self.regex = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] " + fmt.regex.pattern)
        self.groups = tuple(self.regex.groupindex[n] for n in names)
        self.types = tuple(fmt.field_type(n) for n in names)


_STAMPED = {
    "D": (_Stamped(DECODE, loglines.DECODE, _DECODE_VALUES),),
    "P": (
        _Stamped(PREFILL, loglines.PREFILL, _PREFILL_VALUES),
        _Stamped(PREFILL, loglines.PREFILL_CLASSIC, _PREFILL_VALUES),
    ),
}
_STAMP_LEN = len("[2026-01-01 00:00:00] ")
_RETRACT_READER = loglines.FieldReader(loglines.RETRACT_FORMATS)
_STARTUP_READER = loglines.FieldReader(loglines.STARTUP_FORMATS, sep="=")
_STARTUP_HEAD = "max_total_num_tokens="
_METRIC_PREFIXES = ("sglang:", "sglang_", "vllm:", "vllm_", "# HELP ", "# TYPE ")
_DAY = 86400.0
# A hybrid model's pools, each reported on its own: admission waits on whichever is fullest.
_POOL_USAGES = ("full_token_usage", "swa_token_usage", "mamba_usage")


class Parsed:
    """What one line says. `t` is seconds on a common clock (None without a timestamp), `ts` the
    timestamp text, `rank` the rank tags ("TP0", "DP3 TP3 EP3"), `scheduler` the DP rank ("" when
    there is one scheduler), `body` the message from its head on."""

    __slots__ = ("_fields", "body", "kind", "rank", "scheduler", "t", "ts", "values")

    def __init__(
        self, kind: str, body: str, fields: dict[str, object] | None, values: tuple[object, ...] | None = None
    ) -> None:
        self.kind = kind
        self.body = body
        self._fields = fields
        self.values = values  # batch lines: BATCH_VALUES in order
        self.t: float | None = None
        self.ts = ""
        self.rank = ""
        self.scheduler = ""

    @property
    def fields(self) -> dict[str, object]:
        if self._fields is None:
            self._fields = dict(zip(BATCH_VALUES, self.values or (), strict=False))
        return self._fields


class LineParser:
    """Parses lines; remembers the last timestamp conversion (a log has many lines per second)."""

    def __init__(self) -> None:
        self._prefix_reader = PrefixReader()
        self._last_prefix = ""
        self._last: tuple[str, float | None, str, str] = ("", None, "", "")
        self._day: float | None = None  # midnight of the last dated stamp (seconds since 1970)
        self._dated_t = 0.0  # that stamp's seconds
        self._fast_ts = ""  # fast_batch's last stamp and its seconds
        self._fast_t: float | None = None

    def _on_day(self, t: float | None) -> float | None:
        """A time of day alone (`[03:51:54]`, seconds from midnight) after dated stamps is taken on the
        last date seen (the next day when it is more than 12 h earlier), so one log keeps one clock when a
        user pastes blocks printed with and without the date."""
        if t is None:
            return None
        if t >= 2 * _DAY:  # dated
            self._day, self._dated_t = t - t % _DAY, t
            return t
        if self._day is None:
            return t
        t += self._day
        return t + _DAY if t < self._dated_t - _DAY / 2 else t

    def fast_batch(self, text: str) -> tuple[str, str, float | None, tuple[object, ...]] | None:
        """(kind, timestamp, seconds, BATCH_VALUES) of a current-release batch line behind SGLang's plain
        timestamp, or None: then `parse` reads the line. Skips everything `parse` would work out."""
        if len(text) <= _STAMP_LEN or text[0] != "[":
            return None
        for stamped in _STAMPED.get(text[_STAMP_LEN], ()):
            m = stamped.regex.match(text)
            if m is None:
                continue
            ts = m.group(1)
            if ts != self._fast_ts:  # consecutive lines share their stamp: convert it once
                self._fast_ts, self._fast_t = ts, self._on_day(self._prefix_reader.seconds(ts))
            t = self._fast_t
            got = tuple(map(_call, stamped.types, m.group(*stamped.groups)))
            if stamped.kind is DECODE:
                return DECODE, ts, t, got + _NO_PREFILL
            return PREFILL, ts, t, got[:3] + _NO_DECODE + got[3:]
        return None

    def parse(self, text: str) -> Parsed | None:
        rec, start = self._message(text)
        if rec is None:
            return None
        if start > 0:
            last = self._last_prefix
            if last and text.startswith(last) and start >= len(last):  # the same stamp as the line before
                rec.ts, rec.t, rec.rank, rec.scheduler = self._last
                return rec
            prefix = text[:start]
            if prefix[0] == "[":  # SGLang's "[date time rank] ": the rest (an access line's client) varies
                close = prefix.find("]")
                if close > 0 and "P" not in prefix[close:]:  # no rank tag after the bracket
                    prefix = prefix[: close + 1]
            if prefix == self._last_prefix:  # consecutive lines often share their prefix exactly
                rec.ts, rec.t, rec.rank, rec.scheduler = self._last
            else:
                rec.ts, rec.t, rec.rank, rec.scheduler = self._prefix_reader.read(prefix)
                rec.t = self._on_day(rec.t)
                self._last_prefix = prefix
                self._last = (rec.ts, rec.t, rec.rank, rec.scheduler)
        return rec

    # -- the message ---------------------------------------------------------------------------------

    def _message(self, text: str) -> tuple[Parsed | None, int]:
        if text.startswith(_METRIC_PREFIXES):
            return Parsed(METRIC, text, {}), 0
        if "batch" in text:
            # The current releases' exact lines: one regex, fields converted where they are used.
            start = text.find("Decode batch, ")
            if start >= 0:
                got = loglines.DECODE.values_at(text, start, _DECODE_VALUES)
                if got is not None:
                    return Parsed(DECODE, text[start:], None, got + _NO_PREFILL), start
            start = text.find("Prefill batch, ")
            if start >= 0:
                got = loglines.PREFILL.values_at(text, start, _PREFILL_VALUES)
                if got is None:
                    got = loglines.PREFILL_CLASSIC.values_at(text, start, _PREFILL_VALUES)
                if got is not None:
                    return Parsed(PREFILL, text[start:], None, got[:3] + _NO_DECODE + got[3:]), start
            m = BATCH_MARKER.search(text)
            if m is not None:
                kind = PREFILL if m.group(1) == "Prefill" else DECODE
                fields: dict[str, object] = dict(read_batch_fields(text[m.end() :]))
                if "token_usage" not in fields:  # hybrid models: the fullest pool decides
                    known = [(u, n) for n in _POOL_USAGES if isinstance(u := fields.get(n), float)]
                    if known:
                        usage, name = max(known)
                        fields["token_usage"] = usage
                        used = fields.get(name.replace("token_usage", "num_used_tokens"))
                        if "num_used_tokens" not in fields and isinstance(used, int):
                            fields["num_used_tokens"] = used  # that pool's #token
                values = tuple(_number(fields.get(n)) for n in BATCH_VALUES)
                return Parsed(kind, text[m.start() :], fields, values), m.start()
        end = text.find(" HTTP/")
        if end >= 0:  # an access line: `"POST /generate HTTP/1.1" 200 OK`
            start = text.rfind('"', 0, end)
            close = text.find('" ', end)
            status = text[close + 2 : close + 5]
            if close < 0 and text.rstrip().endswith('"'):  # cut after the request: no status to read
                close, status = len(text.rstrip()) - 1, ""
            method, _, path = text[start + 1 : end].partition(" ")
            if start >= 0 and close > 0 and (status.isdigit() or not status) and method.isupper() and path:
                fields = {"method": method, "path": path, "status": int(status) if status else None}
                if path.startswith("/health") and status >= "400":
                    return Parsed(HEALTH_FAIL, text[start:], fields), start
                return Parsed(HTTP, text[start:], fields), start
        if vllm_lines.STATUS_HEAD in text:
            start = text.find(vllm_lines.STATUS_HEAD)
            fields, _ = vllm_lines.STATUS_READER.read(text[start:])
            elapsed = _progress_elapsed(text[:start])
            if elapsed is not None:
                fields["elapsed_s"] = elapsed
            return Parsed(VLLM_STATUS, text[start:], fields), start
        for head in _RETRACT_HEADS:
            start = text.find(head)
            if start >= 0:
                fields, _ = _RETRACT_READER.read(text[start + len(head) :])
                fields["forced"] = head == loglines.TEST_RETRACT.head
                fields["wording"] = head
                return Parsed(RETRACT, text[start:], fields), start
        if _STARTUP_HEAD in text:
            start = text.find(_STARTUP_HEAD)
            fields, _ = _STARTUP_READER.read(text[start:])
            return Parsed(STARTUP, text[start:], fields), start
        rec = self._failure(text)
        if rec is not None:
            return rec
        if vllm_lines.PREEMPT_HEAD in text:
            parsed = vllm_lines.PREEMPT.parse(text)
            start = text.find("Sequence group")
            start = start if start >= 0 else text.find(vllm_lines.PREEMPT_HEAD)
            return Parsed(VLLM_PREEMPT, text[start:], dict(parsed or {})), start
        if "Processed prompts" in text:
            elapsed = _progress_elapsed(text)
            if elapsed is not None:
                start = text.find("Processed prompts")
                return Parsed(PROGRESS, text[start:], {"elapsed_s": elapsed}), start
        return None, 0

    def _failure(self, text: str) -> tuple[Parsed, int] | None:
        """Retraction's last-request failures by release, GPU OOM, aborts, health checks, tracebacks."""
        if "ut of memory" in text or "OutOfMemory" in text:
            start = text.find(LAST_REQUEST_VALUE_ERROR)
            if start >= 0:
                graceful = text.startswith(LAST_REQUEST_ABORT_MESSAGE, start)
                crash = "ValueError" in text[:start]
                release = ">=0.5.10" if graceful else ("0.5.7-0.5.9" if crash else "unknown")
                fields = {"release": release, "graceful": graceful}
                begin = text.rfind("ValueError", 0, start) if crash else start
                return Parsed(LAST_REQUEST, text[begin:], fields), begin
            m = _KV_ALLOC.search(text)
            if m is not None:
                begin = text.rfind("RuntimeError", 0, m.start())
                begin = begin if begin >= 0 else m.start()
                phase = (m.group(1) or "").strip().lower()
                return Parsed(KV_ALLOC, text[begin:], {"phase": phase}), begin
            for marker in ("CUDA out of memory", "HIP out of memory", "OutOfMemoryError"):
                start = text.find(marker)
                if start >= 0:
                    return Parsed(GPU_OOM, text[start:], {}), start
        if text.startswith(("Try to allocate ", "Ava")):
            asked, free = _KV_ALLOC_ASKED.match(text), _KV_ALLOC_FREE.match(text)
            if asked is not None:
                return Parsed(KV_ALLOC_DETAIL, text, {"asked": int(asked.group(1))}), 0
            if free is not None:
                return Parsed(KV_ALLOC_DETAIL, text, {"free": int(free.group(1))}), 0
        if LAST_REQUEST_ASSERTION in text:
            start = text.find(LAST_REQUEST_ASSERTION)
            begin = text.rfind("AssertionError", 0, start)
            begin = begin if begin >= 0 else start
            return Parsed(LAST_REQUEST, text[begin:], {"release": "<=0.5.6", "graceful": False}), begin
        if loglines.LAST_REQUEST_ABORTED.head in text:
            start = text.find(loglines.LAST_REQUEST_ABORTED.head)
            fields = {"release": ">=0.5.10", "graceful": True}
            return Parsed(LAST_REQUEST, text[start:], fields), start
        if "Abort request " in text:
            m = _ABORT_RID.search(text)
            if m is not None:
                return Parsed(ABORT, text[m.start() :], {"rid": m.group(1)}), m.start()
        if "ealth check" in text and ("fail" in text or "timeout" in text or "timed out" in text):
            start = max(text.find("Health check"), text.find("health check"))
            return Parsed(HEALTH_FAIL, text[start:], {}), start
        if "Traceback (most recent call last)" in text:
            start = text.find("Traceback")
            return Parsed(TRACEBACK, text[start:], {}), start
        if text.startswith(('  File "', "    ")) and ('File "' in text or text.strip().startswith("^")):
            return Parsed(TRACEBACK, text.strip(), {}), 0
        if "Error" in text or "Exception" in text:
            m = _ERROR.search(text)
            if m is not None and (m.group(0).endswith(":") or m.start() == 0):
                return Parsed(ERROR, text[m.start() :], {"type": m.group(1)}), m.start()
        return None


def _number(value: object) -> object:
    """A batch value as the doctor takes it: a number (int or float), else None."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _progress_elapsed(text: str) -> float | None:
    """Seconds elapsed in a tqdm bar (`[00:29<3:36:54`), as vLLM's offline runs print."""
    if "<" not in text:
        return None
    m = _ELAPSED.search(text)
    if m is None:
        return None
    hours = int(m.group(1)) if m.group(1) else 0
    return float(hours * 3600 + int(m.group(2)) * 60 + int(m.group(3)))
