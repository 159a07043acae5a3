"""`kvadmit doctor`: read a server log and metrics; a healthy queue or a retraction problem, why, and what
to do."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, NoReturn

from kvadmit.errors import UsageError

if TYPE_CHECKING:
    from kvadmit.doctor.model import Diagnosis
    from kvadmit.doctor.whatif import Scenario


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
        "log",
        nargs="*",
        help="the server log (plain, .gz, .bz2 or .xz; '-' reads standard input); several logs, one per "
        "replica, give a verdict per replica and for the fleet",
    )
    p.add_argument(
        "--fleet",
        action="store_true",
        help="read one log of several data-parallel ranks (DP0, DP1, … tags) as a fleet: a verdict per "
        "rank and for the fleet",
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
    p.add_argument(
        "--what-if",
        dest="what_if",
        action="append",
        default=[],
        metavar="FLAGS",
        help="simulate the reconstructed server with these server flags changed (repeatable), e.g. "
        '--what-if "--schedule-conservativeness 1.3"; the advice is simulated too',
    )
    p.add_argument(
        "--no-what-if",
        dest="no_what_if",
        action="store_true",
        help="skip the reconstruction, the replay check and the what-if simulations",
    )
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from kvadmit.doctor.diagnose import Inputs, diagnose
    from kvadmit.doctor.report import render_json, render_text
    from kvadmit.doctor.source import DoctorInputError

    logs: list[str] = ns.log
    if len(logs) > 1 or ns.fleet:
        return run_fleet(ns, logs)
    ns.log = logs[0] if logs else None
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
    scenarios = what_if_scenarios(ns.what_if)
    if ns.what_if and ns.log is None:
        raise UsageError("--what-if needs a log file (the reconstruction is made from it)")
    try:
        inputs = Inputs(log=ns.log, metrics=list(ns.metrics), interval_s=ns.interval)
        if ns.watch:
            from kvadmit.doctor.watch import watch

            inputs.scrapes = watch(ns.watch, ns.for_s, every=ns.every)
        result = diagnose(inputs)
    except DoctorInputError as e:
        raise UsageError(str(e)) from None
    proof = None
    if ns.log is not None and not ns.no_what_if:
        from kvadmit.doctor.prove import prove

        proof = prove(ns.log, result.verdict, scenarios, result.lead.cause)
    if ns.html:
        from kvadmit.doctor.html import render_html

        try:
            with open(ns.html, "w", encoding="utf-8") as f:
                f.write(render_html(result, proof))
        except OSError as e:
            raise UsageError(f"cannot write {ns.html!r}: {e.strerror}") from None
    _fleet_hint(result)
    print(render_json(result, proof) if ns.json else render_text(result, proof))
    return 0


def _fleet_hint(result: Diagnosis) -> None:
    """A log of several data-parallel ranks is diagnosed as one server; say how to read it per rank."""
    ranks = result.server.get("ranks") or []
    tags = {t for r in ranks for t in str(r).split() if t.startswith(("DP", "ATTN_DP"))}
    dp = sorted(tags, key=lambda t: (len(t), t))  # DP2 before DP10
    if len(dp) > 1 and result.inputs and result.inputs[0].kind == "log":
        named = ", ".join(dp[:4]) + (", …" if len(dp) > 4 else "")
        result.inputs[0].notes.append(
            f"the log holds data-parallel ranks ({named}): kvadmit doctor --fleet LOG gives a verdict per "
            "rank and for the fleet"
        )


def run_fleet(ns: argparse.Namespace, logs: list[str]) -> int:
    """Several logs (one per replica) or one log of DP ranks: a verdict per replica and for the fleet."""
    from kvadmit.doctor.fleet import diagnose_fleet
    from kvadmit.doctor.fleet_report import render_fleet_json, render_fleet_text
    from kvadmit.doctor.source import DoctorInputError

    if not logs:
        raise UsageError("--fleet needs a log of several data-parallel ranks, or give one log per replica")
    given = [f for f, on in (("--metrics", ns.metrics), ("--watch", ns.watch), ("--what-if", ns.what_if))
             if on]  # fmt: skip
    if given:
        raise UsageError(f"{given[0]} reads one server; a fleet's logs take --json and --html")
    try:
        result = diagnose_fleet(logs)
    except DoctorInputError as e:
        raise UsageError(str(e)) from None
    if not ns.no_what_if:
        from kvadmit.doctor.fleet_prove import prove_held_back

        prove_held_back(result, logs)
    if ns.html:
        from kvadmit.doctor.fleet_html import render_fleet_html

        try:
            with open(ns.html, "w", encoding="utf-8") as f:
                f.write(render_fleet_html(result))
        except OSError as e:
            raise UsageError(f"cannot write {ns.html!r}: {e.strerror}") from None
    print(render_fleet_json(result) if ns.json else render_fleet_text(result))
    return 0


def what_if_scenarios(texts: list[str]) -> list[Scenario]:
    """Each --what-if's quoted flags, read by the server flag group `simulate` takes (flags.py), as the
    ServerArgs fields it changes; a bad flag is one line and exit status 2."""
    import shlex

    from kvadmit.cli.flags import add_scheduler_flags, server_fields
    from kvadmit.doctor.whatif import Scenario

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(f"--what-if {text!r}: {message}")

    parser = _Parser(prog="--what-if", add_help=False)
    add_scheduler_flags(parser)
    names = [f.name for f in server_fields()]
    out: list[Scenario] = []
    for text in texts:
        try:
            words = shlex.split(text)
        except ValueError as e:
            raise UsageError(f"--what-if {text!r}: {e}") from None
        if not words:
            example = '--what-if "--schedule-conservativeness 1.3"'
            raise UsageError(f"--what-if needs server flags, e.g. {example}")
        defaults = parser.parse_args([])
        ns = parser.parse_args(words)
        changed = {n: getattr(ns, n) for n in names if getattr(ns, n) != getattr(defaults, n)}
        if not changed:
            raise UsageError(f"--what-if {text!r}: no server flag changed")
        if "max_total_tokens" in changed and changed["max_total_tokens"] is not None:
            changed["max_total_tokens"] = int(changed["max_total_tokens"])
        out.append(Scenario(" ".join(words), "user", changed))
    return out
