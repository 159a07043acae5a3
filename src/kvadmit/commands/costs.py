"""`kvadmit calibrate` (a cost model from an SGLang log) and `kvadmit cost-model` (show or write one)."""

from __future__ import annotations

import argparse
import json
import sys

from kvadmit.costmodel.calibrate import Calibration
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.errors import UsageError

SHOWN_LINES = 40  # per-line rows printed before only the worst are kept


def calibrate_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    p.set_defaults(func=run_calibrate)


def run_calibrate(ns: argparse.Namespace) -> int:
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
        _write(cal.cost, ns.output)
        print(f"wrote {ns.output}", file=sys.stderr if ns.json else sys.stdout)
    return 0


def _write(cost: CostModel, path: str) -> None:
    try:
        cost.write(path)
    except OSError as e:
        raise UsageError(f"cannot write {path!r}: {e.strerror}") from None


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


def cost_model_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "cost-model",
        help="show a cost model (a file or a roofline preset GPU:MODEL[:tp=N]) and its step times",
        description="Show how a cost model was derived and what step times it predicts; write a roofline "
        "preset to a file to edit it.",
    )
    p.add_argument("spec", nargs="?", help="a JSON file or GPU:MODEL[:tp=N][:key=value…]")
    p.add_argument("-o", "--output", metavar="FILE", help="write the cost model (JSON) here")
    p.add_argument("--list", action="store_true", help="list the GPU and model presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_cost_model)


def run_cost_model(ns: argparse.Namespace) -> int:
    from kvadmit.costmodel.costmodel import CostModelError
    from kvadmit.costmodel.costspec import resolve_cost_model
    from kvadmit.costmodel.roofline import GPUS
    from kvadmit.costmodel.shapes import MODELS

    if ns.list or not ns.spec:
        print("GPUs:   " + ", ".join(f"{g.name} ({g.bytes_per_s / 1e12:g} TB/s, {g.flops / 1e12:g} TFLOPS)"
                                     for g in GPUS.values()))  # fmt: skip
        print("models: " + ", ".join(f"{m.name} ({m.params / 1e9:.2f} B)" for m in MODELS.values()))
        print("spec:   GPU:MODEL[:tp=N][:bw_eff=…][:decode_eff=…][:prefill_eff=…][:allreduce_us=…]")
        return 0
    try:
        cost = resolve_cost_model(ns.spec)
    except CostModelError as e:
        raise UsageError(str(e)) from None
    if ns.json:
        print(json.dumps(cost.to_dict(), indent=2))
    else:
        print("\n".join(describe(cost)))
    if ns.output:
        _write(cost, ns.output)
    return 0


def describe(cost: CostModel, context: tuple[int, ...] = (1024, 8192)) -> list[str]:
    """The model's notes and a table of decode steps: batch size × tokens of context per request."""
    out = [cost.name or "cost model", *[f"  {n}" for n in cost.meta.get("notes", [])]]
    p = cost.prefill
    out.append(
        f"prefill: {p.tokens_per_s:,.0f} tokens/s; a 2,048-token prefill takes "
        f"{1000 * p.seconds(1, 2048, 0):.1f} ms"
    )
    sizes: tuple[int, ...] = (1, 8, 32, 64, 128, 256, 512)
    if cost.decode.table is not None:
        t = cost.decode.table
        out.append(
            f"decode: the measured step times of {', '.join(map(str, t.batch_sizes))} requests × "
            f"{', '.join(f'{c:,}' for c in t.context_lens)} tokens of context each, read between the "
            "points (the coefficients are the fit, for reading)"
        )
        sizes = tuple(sorted({*t.batch_sizes, *sizes}))
    out += [
        "",
        "| running requests | "
        + " | ".join(f"step ms @ {c:,} tok/req | tok/s @ {c:,}" for c in context)
        + " |",
        "| ---: |" + " ---: | ---: |" * len(context),
    ]
    for b in sizes:
        cells = []
        for c in context:
            s = cost.decode.seconds(b, b * c)
            cells.append(f"{1000 * s:.2f} | {b / s:,.0f}")
        out.append(f"| {b} | " + " | ".join(cells) + " |")
    return out
