"""SGLang's server log lines, each format defined once: the engine renders with it, the doctor parses
with it (docs/sglang-rules.md §3.3, §4). A template names its fields in braces, with an optional format spec:

    "token usage: {token_usage:.2f}"

`render(**values)` fills it; `parse(line)` returns the fields (as int, float, bool or str) or None.

Releases and builds print variants of the same line (a period after "batch", extra or missing fields,
other retraction wordings). Those variants are defined here too, and `FieldReader` reads any of them
leniently: after the line's head it takes `label: value` pairs in any order, knowing each label from the
templates below, so a field the doctor has never seen is skipped rather than fatal.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from datetime import datetime

_FIELD = re.compile(r"\{(\w+)(?::([^}]*))?\}")
_NUMBER_BY_SPEC = {".2f": r"-?\d+\.\d+", ".4f": r"-?\d+\.\d+", "d": r"-?\d+"}


@dataclass(frozen=True)
class LineFormat:
    name: str
    template: str
    # Field overrides: a regex for the value and the type it parses to (default: int, or float for
    # a float spec, or str for the graph label).
    kinds: dict[str, tuple[str, type]] = field(default_factory=dict)
    # The words that open the line ("Prefill batch"); the fields follow after a comma, period or space.
    head: str = ""

    def render(self, **values: object) -> str:
        return self.template.format(**values)

    @property
    def regex(self) -> re.Pattern[str]:
        return _compile(self)

    def parse(self, text: str) -> dict[str, object] | None:
        m = self.regex.search(text)
        if m is None:
            return None
        out: dict[str, object] = {}
        for name, raw in m.groupdict().items():
            typ = self._type(name)
            out[name] = (raw == "True") if typ is bool else typ(raw)
        return out

    def values_at(self, text: str, pos: int, names: tuple[str, ...]) -> tuple[object, ...] | None:
        """The named fields (each must be in this format; no bool ones), typed, in the order asked, of a
        line whose message starts exactly at `pos`; None if the line is not in this format. The fast path
        of a big log: one regex, and only the fields asked for converted."""
        m = self.regex.match(text, pos)
        if m is None:
            return None
        plan = _PLANS.get((self.template, names))
        if plan is None:
            index = self.regex.groupindex
            plan = _PLANS[(self.template, names)] = (
                tuple(index[n] for n in names),
                tuple(self._type(n) for n in names),
            )
        return tuple(map(_call, plan[1], m.group(*plan[0])))

    def field_type(self, name: str) -> type:
        """The type a field parses to (int, float, bool or str)."""
        return self._type(name)

    def _type(self, name: str) -> type:
        if name in self.kinds:
            return self.kinds[name][1]
        spec = dict(_FIELD.findall(self.template)).get(name, "")
        return float if spec.endswith("f") else int


_COMPILED: dict[str, re.Pattern[str]] = {}
_PLANS: dict[tuple[str, tuple[str, ...]], tuple[tuple[int, ...], tuple[type, ...]]] = {}
_call = operator.call


def _compile(fmt: LineFormat) -> re.Pattern[str]:
    cached = _COMPILED.get(fmt.template)
    if cached is not None:
        return cached
    parts: list[str] = []
    pos = 0
    for m in _FIELD.finditer(fmt.template):
        parts.append(re.escape(fmt.template[pos : m.start()]))
        name, spec = m.group(1), m.group(2) or "d"
        value_re = fmt.kinds[name][0] if name in fmt.kinds else _NUMBER_BY_SPEC.get(spec, r"\S+")
        parts.append(f"(?P<{name}>{value_re})")
        pos = m.end()
    parts.append(re.escape(fmt.template[pos:]))
    compiled = re.compile("".join(parts))
    _COMPILED[fmt.template] = compiled
    return compiled


GRAPH_LABELS = ("cuda graph", "cpu graph", "npu graph", "musa graph")
MEM_LABELS = ("available_gpu_mem", "available_cpu_mem")
# Fields that are labels themselves, and the texts they take.
_LABEL_CHOICES = {"graph_label": GRAPH_LABELS, "mem_label": MEM_LABELS}
_GRAPH = {"graph_label": ("(?:" + "|".join(GRAPH_LABELS) + ")", str), "graph": (r"True|False", bool)}

PREFILL = LineFormat(
    "prefill",
    "Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached_token}, "
    "token usage: {token_usage:.2f}, #running-req: {running_req}, #queue-req: {queue_req}, "
    "#pending-token: {pending_token}, {graph_label}: {graph}, "
    "input throughput (token/s): {input_throughput:.2f}",
    _GRAPH,
    head="Prefill batch",
)
# Releases up to 0.5.10 print the same line without #pending-token.
PREFILL_CLASSIC = LineFormat(
    "prefill_classic",
    "Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached_token}, "
    "token usage: {token_usage:.2f}, #running-req: {running_req}, #queue-req: {queue_req}, "
    "{graph_label}: {graph}, input throughput (token/s): {input_throughput:.2f}",
    _GRAPH,
    head="Prefill batch",
)
DECODE = LineFormat(
    "decode",
    "Decode batch, #running-req: {running_req}, #token: {num_used_tokens}, token usage: {token_usage:.2f}, "
    "{graph_label}: {graph}, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queue_req}",
    _GRAPH,
    head="Decode batch",
)
RETRACT = LineFormat(
    "retract",
    "KV cache pool is full. Retract requests. #retracted_reqs: {num_retracted}, "
    "#new_tokens_gained: {new_tokens_gained}, #new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}",
    head="KV cache pool is full. Retract requests.",
)
# SGLANG_TEST_RETRACT: same call, another prefix, and no ratio part.
TEST_RETRACT = LineFormat(
    "test_retract",
    "Testing retraction. #retracted_reqs: {num_retracted}, #new_tokens_gained: {new_tokens_gained}",
    head="Testing retraction.",
)
LAST_REQUEST_ABORTED = LineFormat(
    "last_request_aborted",
    "retract_decode: aborted last request {rid} due to OOM",
    {"rid": (r"\S+", str)},
    head="retract_decode: aborted last request",
)
STARTUP = LineFormat(
    "startup",
    "max_total_num_tokens={max_total_num_tokens}, chunked_prefill_size={chunked_prefill_size}, "
    "max_prefill_tokens={max_prefill_tokens}, max_running_requests={max_running_requests}, "
    "context_len={context_len}, {mem_label}={available_mem:.2f} GB",
    {"mem_label": ("(?:" + "|".join(MEM_LABELS) + ")", str)},
)

ALL_FORMATS = (PREFILL, PREFILL_CLASSIC, DECODE, RETRACT, TEST_RETRACT, LAST_REQUEST_ABORTED, STARTUP)

# ---- Variants printed by other releases and builds (read by the doctor; rendered only in tests) ----

# SGLang 0.4.x (2025): "batch." with a period, a cache hit rate, no graph or throughput on prefill.
PREFILL_V04 = LineFormat(
    "prefill_v04",
    "Prefill batch. #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached_token}, "
    "cache hit rate: {cache_hit_rate:.2f}%, token usage: {token_usage:.2f}, #running-req: {running_req}, "
    "#queue-req: {queue_req}",
    head="Prefill batch",
)
DECODE_V04 = LineFormat(
    "decode_v04",
    "Decode batch. #running-req: {running_req}, #token: {num_used_tokens}, token usage: {token_usage:.2f}, "
    "gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queue_req}",
    head="Decode batch",
)
# Hybrid sliding-window models: two pools, each with its own usage.
DECODE_HYBRID_SWA = LineFormat(
    "decode_hybrid_swa",
    "Decode batch, #running-req: {running_req}, #full token: {full_num_used_tokens}, "
    "full token usage: {full_token_usage:.2f}, #swa token: {swa_num_used_tokens}, "
    "swa token usage: {swa_token_usage:.2f}, {graph_label}: {graph}, "
    "gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queue_req}",
    _GRAPH,
    head="Decode batch",
)
PREFILL_HYBRID_SWA = LineFormat(
    "prefill_hybrid_swa",
    "Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached_token}, "
    "full token usage: {full_token_usage:.2f}, swa token usage: {swa_token_usage:.2f}, "
    "#running-req: {running_req}, #queue-req: {queue_req}, #pending-token: {pending_token}, "
    "{graph_label}: {graph}, input throughput (token/s): {input_throughput:.2f}",
    _GRAPH,
    head="Prefill batch",
)
# Speculative decoding adds the accepted length (and rate) per verify step.
DECODE_SPEC = LineFormat(
    "decode_spec",
    "Decode batch, #running-req: {running_req}, #token: {num_used_tokens}, token usage: {token_usage:.2f}, "
    "accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, {graph_label}: {graph}, "
    "gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queue_req}",
    _GRAPH,
    head="Decode batch",
)
# Disaggregated (PD) decode workers: pre-allocation and transfer queues, and the retracted gauge.
DECODE_PD = LineFormat(
    "decode_pd",
    "Decode batch, #running-req: {running_req}, #token: {num_used_tokens}, token usage: {token_usage:.2f}, "
    "pre-allocated usage: {prealloc_usage:.2f}, #prealloc-req: {prealloc_req}, "
    "#transfer-req: {transfer_req}, #retracted-req: {retracted_req}, {graph_label}: {graph}, "
    "gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queue_req}",
    _GRAPH,
    head="Decode batch",
)
PREFILL_PD = LineFormat(
    "prefill_pd",
    "Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached_token}, "
    "token usage: {token_usage:.2f}, #running-req: {running_req}, #queue-req: {queue_req}, "
    "#prealloc-req: {prealloc_req}, #inflight-req: {inflight_req}, "
    "input throughput (token/s): {input_throughput:.2f}",
    head="Prefill batch",
)
# Optional fields some builds add to either line (a catalogue of labels, not a line of its own).
BATCH_EXTRAS = LineFormat(
    "batch_extras",
    "#replay-token: {replay_token}, mamba usage: {mamba_usage:.2f}, "
    "#grammar-queue-req: {grammar_queue_req}, #paused-req: {paused_req}",
)
BATCH_FORMATS = (
    PREFILL,
    PREFILL_CLASSIC,
    DECODE,
    PREFILL_V04,
    DECODE_V04,
    DECODE_HYBRID_SWA,
    PREFILL_HYBRID_SWA,
    DECODE_SPEC,
    DECODE_PD,
    PREFILL_PD,
    BATCH_EXTRAS,
)

# Retraction wording by release: "Decode out of memory happened." (0.4.x), then "KV cache pool is full.
# Retract requests." without and then with #new_tokens_gained; Mamba builds add #mamba_num_gained.
RETRACT_V04 = LineFormat(
    "retract_v04",
    "Decode out of memory happened. #retracted_reqs: {num_retracted}, "
    "#new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}",
    head="Decode out of memory happened.",
)
RETRACT_NO_GAINED = LineFormat(
    "retract_no_gained",
    "KV cache pool is full. Retract requests. #retracted_reqs: {num_retracted}, "
    "#new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}",
    head="KV cache pool is full. Retract requests.",
)
RETRACT_MAMBA = LineFormat(
    "retract_mamba",
    "KV cache pool is full. Retract requests. #retracted_reqs: {num_retracted}, "
    "#new_tokens_gained: {new_tokens_gained}, #mamba_num_gained: {mamba_num_gained}, "
    "#new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}",
    head="KV cache pool is full. Retract requests.",
)
RETRACT_FORMATS = (RETRACT, TEST_RETRACT, RETRACT_V04, RETRACT_NO_GAINED, RETRACT_MAMBA)
# Older start-up lines lack chunked_prefill_size or the memory field; read them field by field.
STARTUP_V04 = LineFormat(
    "startup_v04",
    "max_total_num_tokens={max_total_num_tokens}, max_prefill_tokens={max_prefill_tokens}, "
    "max_running_requests={max_running_requests}, context_len={context_len}",
)
STARTUP_FORMATS = (STARTUP, STARTUP_V04)


@dataclass(frozen=True, slots=True)
class _Segment:
    """One `label: value` part of a template: its field names and types, the text between the values
    (" -> " for a ratio change) and after them ("%")."""

    names: tuple[str, ...]
    types: tuple[type, ...]
    joiner: str
    suffix: str
    label_field: tuple[str, str] | None = None  # a label that is itself a field ("cuda graph")


def _segments(fmt: LineFormat, sep: str) -> dict[str, _Segment]:
    body = fmt.template[len(fmt.head) :].lstrip(",. ") if fmt.head else fmt.template
    out: dict[str, _Segment] = {}
    for part in body.split(", "):
        label, found, value = part.partition(sep)
        if not found:
            continue
        names = tuple(m.group(1) for m in _FIELD.finditer(value))
        if not names:
            continue
        types = tuple(fmt._type(n) for n in names)
        literals = _FIELD.split(value)[::3]  # the text around the fields
        joiner = literals[1] if len(names) > 1 else ""
        suffix = literals[-1]
        label_names = [m.group(1) for m in _FIELD.finditer(label)]
        if label_names:  # e.g. "{graph_label}: {graph}"
            for text in _LABEL_CHOICES.get(label_names[0], ()):
                out[text] = _Segment(names, types, joiner, suffix, (label_names[0], text))
            continue
        out[label] = _Segment(names, types, joiner, suffix)
    return out


class FieldReader:
    """Reads the `label: value` parts of a line in any order, for the labels of the given formats.
    Unknown labels are returned by name, values that do not convert are skipped: never an error."""

    def __init__(self, formats: tuple[LineFormat, ...], sep: str = ": ") -> None:
        self.sep = sep
        self.segments: dict[str, _Segment] = {}
        for fmt in formats:
            for label, seg in _segments(fmt, sep).items():
                self.segments.setdefault(label, seg)

    def read(self, body: str) -> tuple[dict[str, object], list[str]]:
        """(fields, unknown labels) of `body`, the text after the line's head."""
        fields: dict[str, object] = {}
        unknown: list[str] = []
        sep = self.sep
        for part in body.split(", "):
            label, found, raw = part.partition(sep)
            if not found:
                if part.strip():
                    unknown.append(part.strip())
                continue
            label = label.strip()
            seg = self.segments.get(label)
            if seg is None:
                unknown.append(label)
                continue
            raw = raw.strip()
            if seg.suffix.strip() and raw.endswith(seg.suffix.strip()):
                raw = raw[: -len(seg.suffix.strip())].strip()
            values = raw.split(seg.joiner) if seg.joiner else (raw,)
            if len(values) != len(seg.names):
                continue
            try:
                for name, typ, value in zip(seg.names, seg.types, values, strict=True):
                    v = (value.strip() == "True") if typ is bool else typ(value.strip())
                    if typ is float and not math.isfinite(v):  # "nan" or "inf": no reading at all
                        continue
                    fields[name] = v
            except ValueError:
                continue
            if seg.label_field is not None:
                fields[seg.label_field[0]] = seg.label_field[1]
        return fields, unknown


TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"


def timestamp_prefix(when: datetime) -> str:
    """SGLang's `[YYYY-MM-DD HH:MM:SS] ` prefix."""
    return f"[{when.strftime(TIMESTAMP_FORMAT)}] "
