"""The doctor's one entry point: read a log (streamed), metrics files and/or a live /metrics endpoint, and
return the diagnosis: ordered findings, what was read, and the timeline."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kvadmit.doctor import findings as rules
from kvadmit.doctor import metrics_findings, prom
from kvadmit.doctor.collect import Collected, Collector
from kvadmit.doctor.model import Diagnosis, Finding, InputSummary, order
from kvadmit.doctor.parse import LineParser
from kvadmit.doctor.source import DoctorInputError, LogSource
from kvadmit.doctor.timeline import Timeline

MAX_METRICS_BYTES = 64 * 1024 * 1024


@dataclass
class Inputs:
    log: str | None = None
    metrics: list[str] = field(default_factory=list)
    interval_s: float | None = None  # seconds between the metrics files (default: their modification times)
    scrapes: list[prom.Scrape] = field(default_factory=list)  # from --watch


def read_log(path: str) -> tuple[Collected, InputSummary]:
    """Stream one log through the parser and the collector."""
    src = LogSource(path)
    parser = LineParser()
    collector = Collector()
    fast, parse = parser.fast_batch, parser.parse
    add_batch, add, unknown = collector.add_batch, collector.add, collector.add_unknown
    last = 0
    try:
        for lineno, text in src.lines():
            last = lineno
            batch = fast(text)
            if batch is not None:
                add_batch(lineno, text, *batch)
                continue
            rec = parse(text)
            if rec is None:
                unknown(lineno, text)
            else:
                add(lineno, rec, text)
    finally:
        src.close()
    c = collector.c
    summary = InputSummary(
        src.label.strip("'"),
        "log",
        last,
        c.recognised,
        c.unknown,
        c.unknown_examples,
        span_s=c.span_s,
        by_kind=dict(c.kinds),
    )
    st = src.stats
    if st.compression:
        summary.notes.append(f"read through {st.compression}")
    if st.encoding not in ("utf-8", "utf-8-sig"):
        summary.notes.append(f"decoded as {st.encoding}")
    if st.undecodable_lines:
        summary.notes.append(f"{st.undecodable_lines:,} lines were not valid UTF-8 and were read as cp1252")
    if st.long_lines:
        summary.notes.append(f"{st.long_lines:,} lines longer than 64 KiB were cut")
    if st.truncated:
        summary.notes.append(st.truncated + "; diagnosed what came before")
    if st.ends_without_newline and c.unknown_examples and c.unknown_examples[-1].line == last:
        summary.notes.append("the last line is incomplete (the file may be truncated)")
    if c.duplicate_rank_lines:
        summary.notes.append(f"{c.duplicate_rank_lines:,} lines repeated by other ranks were counted once")
    return c, summary


def read_metrics_file(path: str) -> prom.Scrape:
    src = LogSource(path)  # the same checks: missing, empty, binary, compressed, encodings
    lines: list[str] = []
    size = 0
    try:
        for _, text in src.lines():
            size += len(text) + 1
            if size > MAX_METRICS_BYTES:
                raise DoctorInputError(f"{src.label} is over 64 MiB: not a /metrics scrape")
            lines.append(text)
    finally:
        src.close()
    if not prom.looks_like_metrics(lines):
        raise DoctorInputError(
            f"{src.label} is not Prometheus text (expected lines like 'sglang:token_usage{{…}} 0.5')"
        )
    scrape = prom.parse_text("\n".join(lines), path)
    try:
        scrape.t = os.path.getmtime(path) if path != "-" else None
    except OSError:
        scrape.t = None
    return scrape


def diagnose(inputs: Inputs) -> Diagnosis:
    summaries: list[InputSummary] = []
    collected: Collected | None = None
    scrapes: list[prom.Scrape] = []
    if inputs.log is not None:
        collected, summary = read_log(inputs.log)
        summaries.append(summary)
        if collected.metric_lines:
            embedded = prom.parse_text(
                "\n".join(collected.metric_lines), summary.source, collected.metric_line_numbers
            )
            scrapes.append(embedded)
    for i, path in enumerate(inputs.metrics):
        scrape = read_metrics_file(path)
        if inputs.interval_s is not None:
            scrape.t = i * inputs.interval_s
        scrapes.append(scrape)
        summaries.append(InputSummary(path, "metrics", len(scrape.samples), len(scrape.samples), 0))
    if inputs.scrapes:
        scrapes.extend(inputs.scrapes)
        summaries.append(
            InputSummary(
                inputs.scrapes[0].source.split(" @ ")[0], "watch", len(inputs.scrapes), len(inputs.scrapes), 0
            )
        )
    if collected is None:
        collected = Collector().c
    if not collected.queue.with_queue_info and scrapes:
        collector = Collector()
        collector.c = collected
        metrics_findings.feed(collector, scrapes)
    _check_something_known(collected, scrapes, summaries)
    pool_metric = next((v for v in (s.value(prom.POOL) for s in scrapes) if v), None)
    found: list[Finding] = rules.log_findings(collected, pool_metric)
    found += metrics_findings.metric_findings(scrapes)
    found = order(found)
    if not found or found[0].verdict is None:
        found.insert(0, insufficient_data(collected, scrapes))
    metrics_findings.with_metric_lines(found, scrapes)
    server: dict[str, object] = dict(collected.startup)
    server["engine"] = sorted(collected.engine | {s.engine for s in scrapes if s.engine})
    if collected.ranks:
        server["ranks"] = sorted(collected.ranks)[:16]
    timeline = collected.timeline if collected is not None else Timeline()
    return Diagnosis(found, summaries, timeline, server)


def _check_something_known(c: Collected, scrapes: list[prom.Scrape], summaries: list[InputSummary]) -> None:
    if c.recognised - c.kinds.get("metric", 0) > 0:
        return
    if any(s.samples for s in scrapes):
        return
    s = summaries[0] if summaries else None
    if s is None:
        raise DoctorInputError("nothing to diagnose: give a log file, --metrics FILE or --watch URL")
    example = (
        f"; line {s.unknown_examples[0].line}: {s.unknown_examples[0].text[:80]!r}"
        if s.unknown_examples
        else ""
    )
    raise DoctorInputError(
        f"no SGLang or vLLM log lines or metrics found in {s.source} ({s.lines:,} lines read{example})"
    )


def insufficient_data(c: Collected, scrapes: list[prom.Scrape]) -> Finding:
    q = c.queue
    if q.samples and not q.with_queue_info:
        top = q.max_usage
        usage = f"token usage up to {top[0]:.2f}" if top else "no token usage"
        what = "this /metrics scrape shows" if q.samples == 1 else f"these {q.samples:,} observations show"
        reason = (
            f"Not enough to judge: {what} {usage} but no queue size, so waiting cannot be told from not "
            "waiting, and nothing shows retraction"
        )
        evidence = [top[1]] if top else []
        return rules.insufficient(reason, evidence)
    if not q.samples:
        kinds = ", ".join(
            f"{n:,} {k.replace('startup', 'start-up').replace('_', ' ')} line{'s' if n > 1 else ''}"
            for k, n in sorted(c.kinds.items())
        )
        lines, evidence = [], []
        pool = c.startup.get("max_total_num_tokens")
        if c.startup_quote is not None and isinstance(pool, int):
            # What the start-up line does say: the server as configured, before any request.
            lines.append(
                f"The start-up line gives the server as configured (a pool of {pool:,} tokens and its "
                "prefill budgets), but not one batch line says how requests were admitted or how full the "
                "pool got: the failure, if any, is in lines not shown here."
            )
            evidence.append(c.startup_quote)
        return rules.insufficient(
            f"Not enough to judge: no batch statistics (Prefill/Decode batch lines) or metrics, only {kinds}",
            evidence,
            lines,
        )
    return rules.insufficient("Nothing wrong and nothing conclusive in this input", [])
