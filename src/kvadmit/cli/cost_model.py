"""`kvadmit cost-model`: show a cost model (a file or a roofline preset) and the step times it predicts,
or write it to a file to edit it."""

from __future__ import annotations

import argparse
import json

from kvadmit.costmodel.costmodel import CostModel
from kvadmit.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "cost-model",
        help="show a cost model (a file, a roofline preset GPU:MODEL[:tp=N] or a measured preset) "
        "and its step times",
        description="Show how a cost model was derived and what step times it predicts; write a roofline "
        "preset to a file to edit it.",
    )
    p.add_argument("spec", nargs="?", help="a JSON file or GPU:MODEL[:tp=N][:key=value…]")
    p.add_argument("-o", "--output", metavar="FILE", help="write the cost model (JSON) here")
    p.add_argument("--list", action="store_true", help="list the GPU and model presets and the measured ones")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    from kvadmit.costmodel.costmodel import CostModelError
    from kvadmit.costmodel.costspec import resolve_cost_model
    from kvadmit.costmodel.measured import MEASURED
    from kvadmit.costmodel.roofline import GPUS
    from kvadmit.costmodel.shapes import MODELS

    if ns.list or not ns.spec:
        print("GPUs:   " + ", ".join(f"{g.name} ({g.bytes_per_s / 1e12:g} TB/s, {g.flops / 1e12:g} TFLOPS)"
                                     for g in GPUS.values()))  # fmt: skip
        print("models: " + ", ".join(f"{m.name} ({m.params / 1e9:.2f} B)" for m in MODELS.values()))
        print("spec:   GPU:MODEL[:tp=N][:bw_eff=…][:decode_eff=…][:prefill_eff=…][:allreduce_us=…]")
        print("measured (no options; other machines: kvadmit profile -o FILE):")
        print("\n".join(f"        {p.name}: {p.what}" for p in MEASURED))
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
        write_cost_model(cost, ns.output)
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


def write_cost_model(cost: CostModel, path: str) -> None:
    """Write a cost model as JSON; a path that cannot be written is a UsageError."""
    try:
        cost.write(path)
    except OSError as e:
        raise UsageError(f"cannot write {path!r}: {e.strerror}") from None
