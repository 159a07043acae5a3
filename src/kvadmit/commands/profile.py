"""`kvadmit profile`: measure the real executor's step times here and write a cost model (torch is
imported only when the command runs)."""

from __future__ import annotations

import argparse
import sys

from kvadmit.errors import UsageError


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must list positive integers")
    return values


def profile_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "profile",
        help="measure the real executor's step times on this machine and write a cost model",
        description="Run the torch executor over a grid of decode batch sizes × context lengths and "
        "prefill sizes, fit the cost model's coefficients and write it for kvadmit simulate.",
    )
    p.add_argument(
        "--model-path", default=None, help="an HF folder or .gguf (default: SmolLM2-135M-Instruct)"
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the cost model (JSON) here")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="as kvadmit serve resolves it (auto: bfloat16 where the CPU computes it natively, "
                   "else float32; bfloat16/float16 on CUDA), so the profile times the server's executor")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when present), as for serve")
    p.add_argument("--batch-sizes", type=_ints, default=(1, 4, 16, 64), help="decode batch sizes")
    p.add_argument("--context-lens", type=_ints, default=(128, 512, 2048), help="KV tokens per request")
    p.add_argument("--prefill-lens", type=_ints, default=(32, 128, 512, 2048), help="tokens per prefill")
    p.add_argument("--prefill-requests", type=_ints, default=(1, 4), help="requests per prefill batch")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per point (the median is kept)")
    p.add_argument("--serving-log", metavar="LOG", default=None,
                   help="a log of kvadmit serve on this machine, run with --decode-log-interval 1: each "
                   "decode step there minus the executor's time for it is the serving stack's overhead "
                   "(HTTP, streaming, the client on the same cores), fitted as a + b × running requests "
                   "and added to every step")  # fmt: skip
    p.set_defaults(func=run_profile)


def run_profile(ns: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from kvadmit.commands.costs import describe
    from kvadmit.executor.costmodel import CostModel
    from kvadmit.executor.profile import Measurement, profile_model, with_metadata
    from kvadmit.executor.serving_overhead import ServingOverheadError, add_overhead, measure_overhead
    from kvadmit.model.default import DefaultModelError
    from kvadmit.model.device import default_device, resolve_dtype
    from kvadmit.model.loading import ModelLoadError, load_hf_folder
    from kvadmit.model.runtime import resolve_model_path

    if ns.repeats <= 0:
        raise UsageError(f"--repeats must be positive, got {ns.repeats}")
    if ns.model_path is not None and not Path(ns.model_path).exists():
        raise UsageError(f"--model-path {ns.model_path!r} does not exist")
    serving_lines: list[str] | None = None
    if ns.serving_log is not None:
        try:
            serving_lines = Path(ns.serving_log).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as e:
            raise UsageError(f"--serving-log: cannot read {ns.serving_log!r}: {e.strerror}") from None
        try:  # before the minutes of measuring: a log that cannot give the overhead is refused now
            measure_overhead(serving_lines, CostModel())
        except ServingOverheadError as e:
            raise UsageError(f"--serving-log {ns.serving_log}: {e}") from None
    try:
        folder = resolve_model_path(ns.model_path)
        device = default_device() if ns.device == "auto" else ns.device
        if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
            raise UsageError(f"--device {ns.device!r}: choose auto, cpu or cuda[:N] (cuda needs a GPU that "
                             "torch sees)")  # fmt: skip
        dtype = resolve_dtype(ns.dtype, device)
        model = load_hf_folder(folder, dtype, device)
    except (ModelLoadError, DefaultModelError) as e:
        raise UsageError(str(e)) from None

    def show(m: Measurement) -> None:
        what = "decode" if m.kind == "decode" else "prefill"
        unit = "tokens of context each" if m.kind == "decode" else "new tokens each"
        print(
            f"{what}: {m.requests} request(s), {m.tokens} {unit}: {1000 * m.seconds:.2f} ms", file=sys.stderr
        )

    profile = profile_model(
        model,
        batch_sizes=ns.batch_sizes,
        context_lens=ns.context_lens,
        prefill_lens=ns.prefill_lens,
        prefill_requests=ns.prefill_requests,
        repeats=ns.repeats,
        progress=show,
    )
    cost = with_metadata(profile, folder.name, str(dtype).removeprefix("torch."))
    if serving_lines is not None:
        try:
            overhead = measure_overhead(serving_lines, cost)
        except ServingOverheadError as e:
            raise UsageError(f"--serving-log {ns.serving_log}: {e}") from None
        cost = add_overhead(cost, overhead, Path(ns.serving_log).name)
        print(
            f"serving stack: {overhead.base_ms:.2f} + {overhead.per_request_ms:.3f} × running requests ms "
            f"per step beyond the executor ({overhead.steps} decode steps of {ns.serving_log}, "
            f"{overhead.batch_sizes[0]}–{overhead.batch_sizes[1]} running), added to every step"
        )
    fit = cost.meta["fit"]
    print("\n".join(describe(cost, context=(max(ns.context_lens),))))
    print(
        f"fit error: decode {fit['decode_mean_abs_error_pct']}% mean, "
        f"{fit['decode_max_abs_error_pct']}% max; prefill {fit['prefill_mean_abs_error_pct']}% mean, "
        f"{fit['prefill_max_abs_error_pct']}% max (the simulator reads the measured decode table, not "
        "the decode fit)"
    )
    print(
        f"engine loop: {fit['loop_overhead_ms']:.2f} ms per step beyond the executor, added to every step"
    )
    if ns.output:
        try:
            cost.write(ns.output)
        except OSError as e:
            raise UsageError(f"cannot write {ns.output!r}: {e.strerror}") from None
        print(f"wrote {ns.output}")
    return 0
