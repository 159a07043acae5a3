"""SGLang's server log lines, each format defined once: the engine renders with it, the doctor parses
with it (reference §3.3, §4). A template names its fields in braces, with an optional format spec:

    "token usage: {token_usage:.2f}"

`render(**values)` fills it; `parse(line)` returns the fields (as int, float, bool or str) or None.
"""

from __future__ import annotations

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

    def _type(self, name: str) -> type:
        if name in self.kinds:
            return self.kinds[name][1]
        spec = dict(_FIELD.findall(self.template)).get(name, "")
        return float if spec.endswith("f") else int


_COMPILED: dict[str, re.Pattern[str]] = {}


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


_GRAPH = {"graph_label": (r"(?:cuda|cpu|npu|musa) graph", str), "graph": (r"True|False", bool)}

PREFILL = LineFormat(
    "prefill",
    "Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached_token}, "
    "token usage: {token_usage:.2f}, #running-req: {running_req}, #queue-req: {queue_req}, "
    "#pending-token: {pending_token}, {graph_label}: {graph}, "
    "input throughput (token/s): {input_throughput:.2f}",
    _GRAPH,
)
# Releases up to 0.5.10 print the same line without #pending-token.
PREFILL_CLASSIC = LineFormat(
    "prefill_classic",
    "Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached_token}, "
    "token usage: {token_usage:.2f}, #running-req: {running_req}, #queue-req: {queue_req}, "
    "{graph_label}: {graph}, input throughput (token/s): {input_throughput:.2f}",
    _GRAPH,
)
DECODE = LineFormat(
    "decode",
    "Decode batch, #running-req: {running_req}, #token: {num_used_tokens}, token usage: {token_usage:.2f}, "
    "{graph_label}: {graph}, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queue_req}",
    _GRAPH,
)
RETRACT = LineFormat(
    "retract",
    "KV cache pool is full. Retract requests. #retracted_reqs: {num_retracted}, "
    "#new_tokens_gained: {new_tokens_gained}, #new_token_ratio: {old_ratio:.4f} -> {new_ratio:.4f}",
)
# SGLANG_TEST_RETRACT: same call, another prefix, and no ratio part.
TEST_RETRACT = LineFormat(
    "test_retract",
    "Testing retraction. #retracted_reqs: {num_retracted}, #new_tokens_gained: {new_tokens_gained}",
)
LAST_REQUEST_ABORTED = LineFormat(
    "last_request_aborted",
    "retract_decode: aborted last request {rid} due to OOM",
    {"rid": (r"\S+", str)},
)
STARTUP = LineFormat(
    "startup",
    "max_total_num_tokens={max_total_num_tokens}, chunked_prefill_size={chunked_prefill_size}, "
    "max_prefill_tokens={max_prefill_tokens}, max_running_requests={max_running_requests}, "
    "context_len={context_len}, {mem_label}={available_mem:.2f} GB",
    {"mem_label": (r"available_(?:gpu|cpu)_mem", str)},
)

ALL_FORMATS = (PREFILL, PREFILL_CLASSIC, DECODE, RETRACT, TEST_RETRACT, LAST_REQUEST_ABORTED, STARTUP)

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"


def timestamp_prefix(when: datetime) -> str:
    """SGLang's `[YYYY-MM-DD HH:MM:SS] ` prefix."""
    return f"[{when.strftime(TIMESTAMP_FORMAT)}] "
