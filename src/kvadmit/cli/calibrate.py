"""`kvadmit calibrate`: a cost model fitted to an SGLang server log's Decode/Prefill batch lines."""

from __future__ import annotations

import argparse
import json
import sys

from kvadmit.cli.cost_model import write_cost_model
from kvadmit.costmodel.calibrate import Calibration
from kvadmit.errors import UsageError

SHOWN_LINES = 40  # per-line rows printed before only the worst are kept


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "calibrate",
        help="a cost model fitted to an SGLang server log's Decode/Prefill batch lines",
        description="Fit decode step time (as a function of #running-req and #token) and prefill "
        "throughput to the Decode batch and Prefill batch lines of an SGLang server log, show how well "
        "the fit predicts every line's gen throughput, and write the cost model for kvadmit simulate.",
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="server log files (excerpts of one server)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the cost model (JSON) here")
    p.add_argument(
        "--decode-log-interval", type=int, default=40, help="the server's --decode-log-interval (default 40)"
    )
    p.add_argument("--all-lines", action="store_true", help="print every decode line, not only the worst")
    p.add_argument("--json", action="store_true", help="print the cost model as JSON instead of a report")
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from kvadmit.costmodel.calibrate import CalibrationError, calibrate_files

    if ns.decode_log_interval <= 0:
        raise UsageError(f"--decode-log-interval must be positive, got {ns.decode_log_interval}")
    try:
        cal = calibrate_files(ns.logs, ns.decode_log_interval)
    except CalibrationError as e:
        raise UsageError(str(e)) from None
    if ns.json:
        print(json.dumps(cal.cost.to_dict(), indent=2))
    else:
        print("\n".join(render_calibration(cal, all_lines=ns.all_lines)))
    if ns.output:
        write_cost_model(cal.cost, ns.output)
        print(f"wrote {ns.output}", file=sys.stderr if ns.json else sys.stdout)
    return 0


def render_calibration(cal: Calibration, all_lines: bool = False) -> list[str]:
    d, p = cal.cost.decode, cal.cost.prefill
    fit = cal.decode_fit
    errors = [cal.error(w) for w in cal.windows]
    worst = max(range(len(errors)), key=lambda i: abs(errors[i]))
    out = [
        f"calibrated from {len(cal.windows)} Decode batch windows (--decode-log-interval "
        f"{cal.decode_log_interval}) and {len(cal.prefill_samples)} back-to-back Prefill batch lines",
        f"decode step  = {d.base_ms:.3f} ms + {d.per_request_ms:.5f} ms × #running-req "
        f"+ {d.per_kv_token_ms:.3g} ms × #token",
        f"prefill      = {p.base_ms:.3f} ms + tokens / {p.tokens_per_s:,.0f} tokens/s",
        f"range        = {cal.coverage().removeprefix('seen: ')}",
        f"fit error    = predicted gen throughput off by {100 * sum(map(abs, errors)) / len(errors):.1f}% "
        f"on average, {100 * abs(errors[worst]):.1f}% at worst ({cal.windows[worst].where})",
    ]
    if fit.outliers:
        out.append(
            f"left out of the fit as outliers: {', '.join(cal.windows[i].where for i in fit.outliers)}"
        )
    unknown = sum(not w.window_known for w in cal.windows)
    if unknown:
        out.append(
            f"{unknown} line(s) marked '?': the window began before the excerpt, so any prefill in it "
            "is unseen and counted as decode time"
        )
    out += [f"note: {n}" for n in cal.notes]
    rows = list(range(len(cal.windows)))
    if not all_lines and len(rows) > SHOWN_LINES:
        rows = sorted(sorted(rows, key=lambda i: -abs(errors[i]))[:SHOWN_LINES])
        out.append(f"the {SHOWN_LINES} decode lines the fit predicts worst (--all-lines for all):")
    out += [
        "",
        "| line | #running-req | #token | prefills in window | gen throughput | predicted | error |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i in rows:
        w = cal.windows[i]
        prefills = f"{len(w.prefills)} ({sum(t for _, t, _ in w.prefills):,} tok)" if w.window_known else "?"
        mark = " (outlier)" if cal.is_outlier(i) else ""
        out.append(
            f"| {w.where}{mark} | {w.running_req} | {w.num_used_tokens:,} | {prefills} | "
            f"{w.gen_throughput:,.2f} | {cal.predicted_gen_throughput(w):,.2f} | {100 * errors[i]:+.1f}% |"
        )
    return out
