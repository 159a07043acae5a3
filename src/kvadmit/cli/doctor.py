"""`kvadmit doctor`: read a server log and metrics; a healthy queue or a retraction problem, why, and what
to do."""

from __future__ import annotations

import argparse

from kvadmit.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "doctor",
        help="read a server log and metrics: a healthy queue or a retraction problem, why, and what to do",
        description="Diagnose an SGLang (or vLLM) server from its log and/or Prometheus metrics: a healthy "
        "queue, an idle pool with a queue, occasional retraction or a storm, a throughput collapse, "
        "out-of-memory aborts, or failures unrelated to the KV pool. The verdict comes first, with the "
        "quoted lines that show it and what to do.",
    )
    p.add_argument(
        "log", nargs="?", help="the server log (plain, .gz, .bz2 or .xz; '-' reads standard input)"
    )
    p.add_argument(
        "--metrics",
        action="append",
        default=[],
        metavar="FILE",
        help="a /metrics scrape (Prometheus text); give it twice for counter rates",
    )
    p.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="seconds between the --metrics files (default: their modification times)",
    )
    p.add_argument("--watch", metavar="URL", help="scrape this server's /metrics over --for SECONDS")
    p.add_argument("--for", dest="for_s", type=float, metavar="SECONDS", help="how long to --watch")
    p.add_argument("--every", type=float, default=5.0, metavar="SECONDS", help="--watch scrape interval")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with charts")
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from kvadmit.doctor.diagnose import Inputs, diagnose
    from kvadmit.doctor.report import render_json, render_text
    from kvadmit.doctor.source import DoctorInputError

    if ns.log is None and not ns.metrics and not ns.watch:
        raise UsageError("give a log file, --metrics FILE or --watch URL --for SECONDS")
    if ns.watch and ns.for_s is None:
        raise UsageError("--watch needs --for SECONDS (how long to watch)")
    if ns.for_s is not None and not ns.watch:
        raise UsageError("--for goes with --watch URL")
    if ns.interval is not None and not ns.interval > 0:
        raise UsageError(f"--interval must be a positive number of seconds, got {ns.interval:g}")
    if not ns.every > 0:
        raise UsageError(f"--every must be a positive number of seconds, got {ns.every:g}")
    try:
        inputs = Inputs(log=ns.log, metrics=list(ns.metrics), interval_s=ns.interval)
        if ns.watch:
            from kvadmit.doctor.watch import watch

            inputs.scrapes = watch(ns.watch, ns.for_s, every=ns.every)
        result = diagnose(inputs)
    except DoctorInputError as e:
        raise UsageError(str(e)) from None
    if ns.html:
        from kvadmit.doctor.html import render_html

        try:
            with open(ns.html, "w", encoding="utf-8") as f:
                f.write(render_html(result))
        except OSError as e:
            raise UsageError(f"cannot write {ns.html!r}: {e.strerror}") from None
    print(render_json(result) if ns.json else render_text(result))
    return 0
