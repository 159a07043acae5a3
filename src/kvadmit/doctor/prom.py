"""Prometheus text from SGLang (`sglang:*`) or vLLM (`vllm:*`), read with prometheus_client's parser.

Text that the strict parser rejects (a user's copy with labels abbreviated to `{...}`, say) is read
leniently line by line, and the scrape says so. A scrape becomes one sample of the scheduler (running,
queued, usage, throughput) plus its counters; two scrapes of a counter give a rate.

Pitfall the doctor explains: `sglang:num_retracted_reqs` is a gauge holding the count of the most recent
retraction and is reset to 0 at the next log interval, so a 0 says nothing about the run; the counter
`sglang:num_retracted_requests_total` (vLLM: `vllm:num_preemptions_total`) does, as a rate between scrapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kvadmit.doctor.trackers import Quote
from kvadmit.observe import metric_names as m

_LENIENT = re.compile(
    r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+)|NaN|[+-]?Inf)\b"
)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# What each engine calls the things the doctor reads (first name found wins).
RUNNING = (m.NUM_RUNNING_REQS.sample, "vllm:num_requests_running")
QUEUED = (m.NUM_QUEUE_REQS.sample, "vllm:num_requests_waiting")
USAGE = (m.TOKEN_USAGE.sample, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
HYBRID_USAGE = (m.FULL_TOKEN_USAGE.sample, m.SWA_TOKEN_USAGE.sample)
USED = (m.NUM_USED_TOKENS.sample,)
THROUGHPUT = (m.GEN_THROUGHPUT.sample,)
POOL = (m.MAX_TOTAL_NUM_TOKENS.sample,)
SWAPPED = ("vllm:num_requests_swapped",)
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
KEY_METRICS = (*RUNNING, QUEUED[0], QUEUED[1], WAITING_BY_REASON, *USAGE, *SWAPPED)
RETRACTED_GAUGE = m.NUM_RETRACTED_REQS.sample
RETRACTED_COUNTER = m.NUM_RETRACTED_REQUESTS.sample
PREEMPTED_COUNTER = "vllm:num_preemptions_total"
ABORTED_COUNTER = m.NUM_ABORTED_REQUESTS.sample
# Per-rank gauges where the ranks of one scheduler repeat the value; data-parallel ranks add up.
_MAX_LIKE = USAGE + HYBRID_USAGE + POOL


@dataclass(frozen=True, slots=True)
class MetricSample:
    name: str
    labels: dict[str, str]
    value: float
    line: int


@dataclass
class Scrape:
    source: str
    samples: list[MetricSample] = field(default_factory=list)
    lenient: bool = False
    t: float | None = None  # seconds on the caller's clock (file time, or time since --watch began)
    first_line: int = 1
    skipped_lines: int = 0
    text_of_line: dict[int, str] = field(default_factory=dict)  # the sample lines as written

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def value(self, names: tuple[str, ...] | str) -> float | None:
        """The value of the first of `names` present: summed over data-parallel ranks, the largest over
        other labels (tensor-parallel ranks repeat one scheduler's value)."""
        for name in (names,) if isinstance(names, str) else names:
            found = [s for s in self.samples if s.name == name]
            if not found:
                continue
            if name in _MAX_LIKE:
                return max(s.value for s in found)
            groups: dict[str, float] = {}
            for s in found:
                key = s.labels.get("dp_rank", "")
                groups[key] = max(groups.get(key, s.value), s.value)
            return sum(groups.values())
        return None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.samples:
            if s.name == name and label in s.labels:
                out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
        return out

    def line_of(self, names: tuple[str, ...] | str) -> int | None:
        for name in (names,) if isinstance(names, str) else names:
            for s in self.samples:
                if s.name == name:
                    return s.line
        return None

    def quotes(self, names: tuple[str, ...]) -> list[Quote]:
        """The written lines of these metrics (every label set), as evidence."""
        out = []
        for s in self.samples:
            if s.name in names and s.line in self.text_of_line:
                out.append(Quote(s.line, self.text_of_line[s.line], self.source))
        seen: set[int] = set()
        return [q for q in out if not (q.line in seen or seen.add(q.line))]  # type: ignore[func-returns-value]

    @property
    def engine(self) -> str:
        names = self.names()
        if any(n.startswith("vllm") for n in names):
            return "vllm"
        return "sglang" if any(n.startswith("sglang") for n in names) else ""


def looks_like_metrics(lines: list[str]) -> bool:
    """Whether most non-empty lines of a text are Prometheus samples or comments."""
    body = [ln for ln in lines if ln.strip()]
    if not body:
        return False
    hits = sum(1 for ln in body if ln.startswith("#") or _LENIENT.match(ln))
    return hits >= 0.8 * len(body)


def parse_text(text: str, source: str, line_numbers: list[int] | None = None) -> Scrape:
    """Strict parse with prometheus_client; on any error, the lenient reading. `line_numbers` maps the
    text's lines to the input's (when the metric lines were picked out of a longer file)."""
    numbers = line_numbers or list(range(1, text.count("\n") + 2))
    first_line = numbers[0] if numbers else 1
    raw_lines = text.splitlines()
    written = {numbers[i]: ln for i, ln in enumerate(raw_lines) if i < len(numbers) and ln and ln[0] != "#"}
    scrape = Scrape(source, first_line=first_line, text_of_line=written)
    lines = {name: numbers[i - 1] for name, i in _sample_lines(text).items() if i - 1 < len(numbers)}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                scrape.samples.append(
                    MetricSample(s.name, dict(s.labels), float(s.value), lines.get(s.name, first_line))
                )
        return scrape
    except (ValueError, TypeError, KeyError, IndexError):
        pass
    scrape = Scrape(source, lenient=True, first_line=first_line, text_of_line=written)
    for i, raw in enumerate(raw_lines):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LENIENT.match(line)
        if m is None:
            scrape.skipped_lines += 1
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            value = float(m.group(3))
        except ValueError:
            scrape.skipped_lines += 1
            continue
        scrape.samples.append(
            MetricSample(m.group(1), labels, value, numbers[i] if i < len(numbers) else i + 1)
        )
    return scrape


def _sample_lines(text: str) -> dict[str, int]:
    """Line number (1-based) of each metric name's first sample."""
    out: dict[str, int] = {}
    for i, raw in enumerate(text.splitlines()):
        if raw and not raw.startswith("#"):
            name = re.split(r"[{\s]", raw, maxsplit=1)[0]
            out.setdefault(name, i + 1)
    return out


def usage_of(scrape: Scrape) -> float | None:
    usage = scrape.value(USAGE)
    if usage is None:
        parts = [v for v in (scrape.value(n) for n in HYBRID_USAGE) if v is not None]
        usage = max(parts) if parts else None
    return usage


def counter_rate(a: Scrape, b: Scrape, name: str) -> tuple[float, float] | None:
    """(increase, seconds) of a counter between two scrapes; None without both values and times.
    A decrease means the server restarted in between: the later value is the increase."""
    va, vb = a.value(name), b.value(name)
    if va is None or vb is None or a.t is None or b.t is None or b.t <= a.t:
        return None
    increase = vb - va if vb >= va else vb
    return increase, b.t - a.t
