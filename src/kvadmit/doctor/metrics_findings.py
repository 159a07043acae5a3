"""Findings from Prometheus scrapes: each scrape is a sample of the scheduler (fed to the same rules as a
log line), and counters read twice give the retraction or preemption rate."""

from __future__ import annotations

from kvadmit.doctor import prom
from kvadmit.doctor.collect import Collector
from kvadmit.doctor.model import (
    OCCASIONAL,
    RANK_NOTE,
    RANK_OCCASIONAL,
    RANK_STORM,
    STORM,
    Finding,
)
from kvadmit.doctor.rates import Rate, duration, per_minute
from kvadmit.doctor.trackers import Quote, Sample


def feed(collector: Collector, scrapes: list[prom.Scrape]) -> None:
    """Each scrape as one sample of the scheduler."""
    t0 = next((s.t for s in scrapes if s.t is not None), None)
    for s in scrapes:
        running, queued, usage = s.value(prom.RUNNING), s.value(prom.QUEUED), prom.usage_of(s)
        if running is None and queued is None and usage is None:
            continue
        quotes = s.quotes(prom.QUEUED) or s.quotes(prom.RUNNING) or s.quotes(prom.USAGE)
        q = quotes[0] if quotes else Quote(s.first_line, _summary(s), s.source)
        t = None if s.t is None or t0 is None else s.t - t0
        used = s.value(prom.USED)
        tput = s.value(prom.THROUGHPUT)
        sample = Sample(q.line, t, "metrics", "", _i(running), _i(queued), usage, _i(used), tput, text=q.text)
        collector.add_sample(sample, q)


def _i(v: float | None) -> int | None:
    return None if v is None else round(v)


def _summary(s: prom.Scrape) -> str:
    parts = []
    for name in (*prom.RUNNING, *prom.QUEUED, *prom.USAGE, *prom.HYBRID_USAGE):
        v = s.value(name)
        if v is not None:
            parts.append(f"{name} {v:g}")
    for reason, v in sorted(s.by_label(prom.WAITING_BY_REASON, "reason").items()):
        parts.append(f'{prom.WAITING_BY_REASON}{{reason="{reason}"}} {v:g}')
    return ", ".join(parts)


def metric_findings(scrapes: list[prom.Scrape]) -> list[Finding]:
    if not scrapes:
        return []
    out: list[Finding] = []
    rate = _counter_finding(scrapes)
    if rate is not None:
        out.append(rate)
    note = _pitfall(scrapes)
    if note is not None:
        out.append(note)
    lenient = [s for s in scrapes if s.lenient]
    if lenient:
        out.append(
            Finding(
                "metrics-format",
                None,
                RANK_NOTE,
                f"{lenient[0].source}: not valid Prometheus text (labels abbreviated or cut?); read line by "
                "line",
                [
                    "prometheus_client's parser rejected it, so each `name{labels} value` line was read on "
                    "its own; "
                    f"{lenient[0].skipped_lines} lines could not be read at all."
                ],
                [],
                [],
            )
        )
    return out


def _counter_finding(scrapes: list[prom.Scrape]) -> Finding | None:
    timed = [s for s in scrapes if s.t is not None]
    for name, what in ((prom.RETRACTED_COUNTER, "retraction"), (prom.PREEMPTED_COUNTER, "preemption")):
        having = [s for s in timed if s.value(name) is not None]
        if len(having) < 2:
            continue
        first, last = having[0], having[-1]
        got = prom.counter_rate(first, last, name)
        if got is None:
            continue
        increase, seconds = got
        rate = Rate(round(increase), seconds)
        pm = rate.per_minute or 0.0
        evidence = [*first.quotes((name,)), *last.quotes((name,))]
        text = (
            f"{name} rose by {increase:g} in {duration(seconds)} between scrapes: {per_minute(pm)} {what}s "
            "per minute"
        )
        if increase == 0:
            return Finding(
                "metrics-rate", None, RANK_NOTE, f"No {what} between the scrapes: {text}", [], evidence, []
            )
        if rate.is_storm():
            return Finding(
                STORM,
                STORM,
                RANK_STORM,
                f"Retraction storm (from metrics): {text}",
                ["The counter covers the whole interval, unlike the num_retracted_reqs gauge."],
                evidence,
                [
                    "Raise --schedule-conservativeness (e.g. 1.3) or lower --max-running-requests; never a "
                    "larger --mem-fraction-static alone."
                ],
                {"increase": increase, "seconds": seconds},
            )
        return Finding(
            OCCASIONAL,
            OCCASIONAL,
            RANK_OCCASIONAL,
            f"Occasional {what} (from metrics): {text}",
            [],
            evidence,
            [],
            {"increase": increase, "seconds": seconds},
        )
    return None


def _pitfall(scrapes: list[prom.Scrape]) -> Finding | None:
    sglang = [s for s in scrapes if s.engine == "sglang"]
    if not sglang:
        return None
    names = set().union(*(s.names() for s in sglang))
    gauge = prom.RETRACTED_GAUGE in names
    counter = prom.RETRACTED_COUNTER in names
    lines = []
    evidence: list[Quote] = []
    if gauge:
        s = next(s for s in sglang if prom.RETRACTED_GAUGE in s.names())
        evidence += s.quotes((prom.RETRACTED_GAUGE,))
        lines.append(
            f"{prom.RETRACTED_GAUGE} is a gauge that holds the most recent retraction's count and is reset "
            "to 0 at the next log interval: a 0 covers only the last interval, not the run."
        )
    if counter:
        having = [s for s in sglang if s.value(prom.RETRACTED_COUNTER) is not None]
        if len(having) < 2 or any(s.t is None for s in having):
            v = having[-1].value(prom.RETRACTED_COUNTER)
            lines.append(
                f"{prom.RETRACTED_COUNTER} = {v:g} since the server started; scrape it twice (--metrics A "
                "--metrics B, or --watch URL --for SECONDS) for the rate that tells occasional from a "
                "storm."
            )
    elif not gauge:
        lines.append(
            "This /metrics output has no retraction metrics at all (older releases, e.g. 0.5.1, export "
            "none): it cannot show retraction; read the server log's 'Retract requests' lines instead."
        )
    queue_known = any(s.value(prom.QUEUED) is not None for s in sglang)
    if not queue_known:
        lines.append(f"It has no {prom.QUEUED[0]} either, so it cannot show whether requests wait.")
    if not lines:
        return None
    title = (
        f"Metrics pitfall: {prom.RETRACTED_GAUGE} is reset every interval; use the _total counter's rate"
        if gauge
        else "Metrics: what this scrape can and cannot tell"
    )
    return Finding(
        "metrics-pitfall",
        None,
        RANK_NOTE,
        title,
        lines,
        evidence,
        [f"Alert on rate({prom.RETRACTED_COUNTER}[5m]) * 60 > 1 (retractions per minute), not on the gauge."],
    )


def with_metric_lines(findings: list[Finding], scrapes: list[prom.Scrape]) -> None:
    """A finding that quotes one line of a scrape quotes its other key lines too (running, waiting, usage)."""
    for f in findings:
        for s in scrapes:
            if any(q.source == s.source for q in f.evidence):
                have = {(q.source, q.line) for q in f.evidence}
                f.evidence += [q for q in s.quotes(prom.KEY_METRICS) if (q.source, q.line) not in have]
                f.evidence.sort(key=lambda q: (q.source, q.line))
