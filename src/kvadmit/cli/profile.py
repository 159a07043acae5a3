"""`kvadmit profile`: measure the real executor's step times here and write a cost model (torch is
imported only when the command runs: the measuring is profile_timing.py, the fit costmodel/profile.py)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from kvadmit.cli.flags import add_model_flags
from kvadmit.errors import UsageError

if TYPE_CHECKING:
    from kvadmit.costmodel.costmodel import CostModel


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must list positive integers")
    return values


# (flag, default, help) of the grid's options; none of them may go with --average (it measures nothing).
GRID: tuple[tuple[str, tuple[int, ...], str], ...] = (
    ("--batch-sizes", (1, 4, 16, 64), "decode batch sizes"),
    ("--context-lens", (128, 512, 2048), "KV tokens per request"),
    ("--prefill-lens", (32, 128, 512, 2048), "tokens per prefill"),
    ("--prefill-requests", (1, 4), "requests per prefill batch"),
)
REPEATS = 3


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "profile",
        help="measure the real executor's step times on this machine and write a cost model",
        description="Run the torch executor over a grid of decode batch sizes × context lengths and "
        "prefill sizes, fit the cost model's coefficients and write it for kvadmit simulate.",
    )
    add_model_flags(p)  # as kvadmit serve loads the model, so the profile times the server's executor
    p.add_argument("-o", "--output", metavar="FILE", help="write the cost model (JSON) here")
    p.add_argument(
        "--enable-torch-compile",
        action="store_true",
        help="time decode batches of up to --torch-compile-max-bs requests compiled, as serve runs them",
    )
    p.add_argument("--torch-compile-max-bs", type=int, default=32)  # SGLang 0.5.22's default
    for flag, default, what in GRID:
        shown = ",".join(map(str, default))
        p.add_argument(flag, type=_ints, default=None, help=f"{what} (default: {shown})")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed runs per point, the median kept (default: {REPEATS})")  # fmt: skip
    p.add_argument("--average", nargs="+", metavar="FILE", default=None,
                   help="measure nothing: write the mean of these profiles of this machine (bare executor, "
                   "the same grid; taken at different times, e.g. before and after the runs they are to "
                   "predict), with how far they differ; --serving-log is then fitted against the mean",
                   )  # fmt: skip
    p.add_argument("--serving-log", metavar="LOG", nargs="+", default=None,
                   help="logs of kvadmit serve on this machine, run with --decode-log-interval 1: each "
                   "decode step there minus the executor's time for it is the serving stack's overhead "
                   "(HTTP, streaming, the client on the same cores), fitted as a + b × running requests "
                   "over all the logs' steps and added to every step (several logs, taken at different "
                   "times, weigh a slow spell of the machine in one of them less)")  # fmt: skip
    p.add_argument("--serving-steps", metavar="FILE", nargs="+", default=None,
                   help="with --serving-log: kvadmit serve --trace-steps files of the same runs; each "
                   "prefill step there minus the executor's time for it, their median, is added to every "
                   "prefill step in place of the decode fit's a + b × requests (a log line has no prefill "
                   "step time)")  # fmt: skip
    p.set_defaults(func=run)


def _step_rows(path: str) -> list[dict[str, object]]:
    """A --trace-steps file's rows, or a UsageError naming the file and the line that is not one."""
    import json
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"--serving-steps: cannot read {path!r}: {e.strerror}") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            raise UsageError(
                f"--serving-steps {path} line {n}: not a JSON object; give the files kvadmit serve "
                "--trace-steps writes (one JSON object per step)"
            )
        rows.append(row)
    return rows


def run(ns: argparse.Namespace) -> int:
    from kvadmit.cli.cost_model import describe, write_cost_model

    serving = _serving_inputs(ns)  # before the minutes of measuring
    cost = _averaged(ns) if ns.average is not None else _measured(ns)
    if serving is not None:
        cost = _with_serving_overhead(ns, cost, *serving)
    fit = cost.meta["fit"]
    table = cost.decode.table
    print("\n".join(describe(cost, context=(max(table.context_lens) if table else 2048,))))
    print(
        f"fit error: decode {fit['decode_mean_abs_error_pct']}% mean, "
        f"{fit['decode_max_abs_error_pct']}% max; prefill {fit['prefill_mean_abs_error_pct']}% mean, "
        f"{fit['prefill_max_abs_error_pct']}% max (the simulator reads the measured decode table, not "
        "the decode fit)"
    )
    if "profiles_averaged" in fit:
        print(
            f"averaged: {fit['profiles_averaged']} profiles; a grid point's decode step time differs from "
            f"the mean by up to {fit['profile_spread_mean_pct']}% on average, "
            f"{fit['profile_spread_max_pct']}% at most"
        )
    print(f"engine loop: {fit['loop_overhead_ms']:.2f} ms per step beyond the executor, added to every step")
    if ns.output:
        write_cost_model(cost, ns.output)
        print(f"wrote {ns.output}")
    return 0


StepRows = list[tuple[str, list[dict[str, object]]]]


def _serving_inputs(ns: argparse.Namespace) -> tuple[list[list[str]], StepRows] | None:
    """--serving-log's lines and --serving-steps' rows, or None without --serving-log; logs and steps
    that cannot give the overhead are refused now, before the minutes of measuring."""
    from pathlib import Path

    from kvadmit.costmodel.costmodel import CostModel
    from kvadmit.costmodel.serving_overhead import (
        ServingOverheadError,
        measure_overhead,
        measure_prefill_overhead,
    )

    if ns.serving_steps is not None and ns.serving_log is None:
        raise UsageError("--serving-steps refines --serving-log's fit for prefill steps: give both")
    serving_steps = [(path, _step_rows(path)) for path in ns.serving_steps or ()]
    if ns.serving_log is None:
        return None
    serving_logs = []
    for path in ns.serving_log:
        try:
            serving_logs.append(Path(path).read_text(encoding="utf-8", errors="replace").splitlines())
        except OSError as e:
            raise UsageError(f"--serving-log: cannot read {path!r}: {e.strerror}") from None
    try:
        measure_overhead(serving_logs, CostModel())
    except ServingOverheadError as e:
        raise UsageError(f"--serving-log {', '.join(ns.serving_log)}: {e}") from None
    if serving_steps:
        try:
            measure_prefill_overhead(serving_steps, CostModel())
        except ServingOverheadError as e:
            raise UsageError(f"--serving-steps: {e}") from None
    return serving_logs, serving_steps


def _with_serving_overhead(
    ns: argparse.Namespace, cost: CostModel, serving_logs: list[list[str]], serving_steps: StepRows
) -> CostModel:
    """The serving stack's overhead, fitted against `cost`, added to it (and said)."""
    from pathlib import Path

    from kvadmit.costmodel.serving_overhead import (
        ServingOverheadError,
        add_overhead,
        measure_overhead,
        measure_prefill_overhead,
    )

    logs_named = ", ".join(ns.serving_log)
    try:
        overhead = measure_overhead(serving_logs, cost)
    except ServingOverheadError as e:
        raise UsageError(f"--serving-log {logs_named}: {e}") from None
    # against the bare executor's prefill times, as the decode fit is against its decode times (the
    # steps were counted and checked above, so this cannot fail)
    prefill = measure_prefill_overhead(serving_steps, cost) if serving_steps else None
    steps_named = ", ".join(Path(x).name for x in ns.serving_steps or ())
    cost = add_overhead(cost, overhead, ", ".join(Path(x).name for x in ns.serving_log),
                        None if prefill is None else (prefill, steps_named))  # fmt: skip
    where = "to every step" if prefill is None else "to every decode step"
    print(
        f"serving stack: {overhead.base_ms:.2f} + {overhead.per_request_ms:.3f} × running requests ms "
        f"per step beyond the executor ({overhead.steps} decode steps of {logs_named}, "
        f"{overhead.batch_sizes[0]}–{overhead.batch_sizes[1]} running), added {where}"
    )
    if prefill is not None:
        print(
            f"serving stack, prefill: {prefill.ms:.2f} ms per prefill step beyond the executor (the "
            f"median of {prefill.steps} prefill steps of {', '.join(ns.serving_steps)}), added to every "
            "prefill step"
        )
    return cost


def _averaged(ns: argparse.Namespace) -> CostModel:
    """--average: the mean of the given profiles; nothing is measured."""
    from kvadmit.costmodel.costmodel import CostModel, CostModelError
    from kvadmit.costmodel.profile_average import ProfileAverageError, average_profiles

    given = [flag for flag, _, _ in GRID if getattr(ns, _dest(flag)) is not None]
    given += ["--repeats"] if ns.repeats is not None else []
    given += ["--model-path"] if ns.model_path is not None else []
    given += [f"--{k}" for k in ("dtype", "device") if getattr(ns, k) != "auto"]
    given += ["--quantization"] if ns.quantization is not None else []  # unquant too: it measures nothing
    given += ["--kv-cache-dtype"] if ns.kv_cache_dtype != "auto" else []
    given += ["--enable-torch-compile"] if ns.enable_torch_compile else []
    if given:
        raise UsageError(f"--average measures nothing: {', '.join(given)} cannot go with it")
    try:
        models = [CostModel.from_file(path) for path in ns.average]
        return average_profiles(models, list(ns.average))
    except (CostModelError, ProfileAverageError) as e:
        raise UsageError(f"--average: {e}") from None


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _measured(ns: argparse.Namespace) -> CostModel:
    """The executor timed over the grid (the model loaded as kvadmit serve loads it)."""
    from pathlib import Path

    import torch

    from kvadmit.cli.profile_timing import profile_model
    from kvadmit.costmodel.profile import Measurement, with_metadata
    from kvadmit.model.default import DefaultModelError
    from kvadmit.model.device import default_device, resolve_dtype
    from kvadmit.model.loading import ModelLoadError, kv_pool_dtype, load_hf_folder
    from kvadmit.model.quant import NO_QUANTIZATION
    from kvadmit.model.runtime import resolve_model_path

    grid = {_dest(flag): getattr(ns, _dest(flag)) or default for flag, default, _ in GRID}
    repeats = REPEATS if ns.repeats is None else ns.repeats
    if repeats <= 0:
        raise UsageError(f"--repeats must be positive, got {repeats}")
    if ns.model_path is not None and not Path(ns.model_path).exists():
        raise UsageError(f"--model-path {ns.model_path!r} does not exist")
    try:
        folder = resolve_model_path(ns.model_path)
        device = default_device() if ns.device == "auto" else ns.device
        if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
            raise UsageError(f"--device {ns.device!r}: choose auto, cpu or cuda[:N] (cuda needs a GPU that "
                             "torch sees)")  # fmt: skip
        quant = None if ns.quantization in NO_QUANTIZATION else ns.quantization
        dtype = resolve_dtype(ns.dtype, device, quantized=quant is not None)
        kv_dtype = kv_pool_dtype(ns.kv_cache_dtype)
        model = load_hf_folder(folder, dtype, device, quantization=quant)
        model.kv_dtype = kv_dtype or model.kv_dtype
    except (ModelLoadError, DefaultModelError) as e:
        raise UsageError(str(e)) from None

    def show(m: Measurement) -> None:
        what = "decode" if m.kind == "decode" else "prefill"
        unit = "tokens of context each" if m.kind == "decode" else "new tokens each"
        print(
            f"{what}: {m.requests} request(s), {m.tokens} {unit}: {1000 * m.seconds:.2f} ms", file=sys.stderr
        )

    compile_max_bs = ns.torch_compile_max_bs if ns.enable_torch_compile else None
    profile = profile_model(model, repeats=repeats, progress=show, compile_max_bs=compile_max_bs, **grid)
    precision = (
        str(dtype).removeprefix("torch.")
        + (f", {ns.quantization} weights" if ns.quantization else "")
        + (f", {ns.kv_cache_dtype} KV cache" if ns.kv_cache_dtype != "auto" else "")
        + (f", compiled decode up to batch {compile_max_bs}" if compile_max_bs else "")
    )
    return with_metadata(profile, folder.name, precision)
