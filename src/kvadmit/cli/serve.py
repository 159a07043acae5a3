"""`kvadmit serve`: an OpenAI-compatible server with SGLang's scheduler, log lines and metrics."""

from __future__ import annotations

import argparse
import os

from kvadmit.cli.flags import add_model_flags, add_policy_flag, add_scheduler_flags, server_args_from
from kvadmit.cli.sglang_compat import add_sglang_flags, check_sglang_flags
from kvadmit.errors import UsageError

# The devices SGLang 0.5.22 runs on (utils/common.py get_device), and those kvadmit runs a model on
SGLANG_DEVICES = ("cuda", "xpu", "npu", "hpu", "musa", "mps", "cpu")
MODEL_DEVICES = ("cuda", "cpu")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="an OpenAI-compatible LLM server with SGLang's scheduler, log lines and metrics",
        description="Serve a model (default: SmolLM2-135M-Instruct) over HTTP with SGLang's endpoints, "
        "or, with --simulate COST_MODEL, a predicted GPU that admits, queues and retracts like one.",
    )
    add_scheduler_flags(p)
    add_policy_flag(p)
    add_serve_flags(p)
    add_sglang_flags(p)
    p.set_defaults(func=run)


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server (SGLang's flags)")
    add_model_flags(g)
    g.add_argument("--tokenizer-path", default=None)
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument("--mem-fraction-static", type=float, default=None)
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--api-key", default=None)
    g.add_argument("--enable-metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g.add_argument("--stream-interval", type=int, default=1,
                   help="a stream's first token goes out at once, then tokens go out once this many are "
                   "unsent (and with the end)")  # fmt: skip
    g.add_argument("--watchdog-timeout", type=float, default=300.0,
                   help="/health: 503 after this long without a step while work is pending")  # fmt: skip
    g.add_argument(
        "--enable-torch-compile",
        action="store_true",
        help="decode batches of up to --torch-compile-max-bs requests through torch.compile, "
        "compiled at start-up (minutes the first time; inductor's cache keeps it for later starts)",
    )
    g.add_argument(
        "--torch-compile-max-bs",
        type=int,
        default=32,  # SGLang 0.5.22's default
        help="larger decode batches and every prefill run eagerly (default %(default)s)",
    )
    add_cuda_graph_flags(g)
    add_kvadmit_serve_flags(p)


def add_cuda_graph_flags(g: argparse._ArgumentGroup) -> None:
    """SGLang's decode CUDA graph flags (model/cuda_graph.py); on a CPU they change nothing."""
    g.add_argument("--disable-cuda-graph", action="store_true",
                   help="on a GPU, decode eagerly instead of replaying CUDA graphs")  # fmt: skip
    g.add_argument("--disable-decode-cuda-graph", action="store_true",
                   help="the same here (kvadmit captures decode steps only)")  # fmt: skip
    g.add_argument("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs", dest="cuda_graph_max_bs_decode",
                   type=int, default=None, metavar="N",
                   help="the largest decode batch replayed from a CUDA graph; larger ones run eagerly "
                   "(default: by the GPU's memory, as SGLang 0.5.22 chooses it: 8 under 20 GiB, 48 under 35, "
                   "32 under 60, 256 under 160, 512 above; cut to --max-running-requests)")  # fmt: skip
    g.add_argument("--cuda-graph-bs-decode", type=int, nargs="+", default=None, metavar="N",
                   help="capture exactly these decode batch sizes (the largest is the max bs)")  # fmt: skip
    g.add_argument("--disable-cuda-graph-padding", action="store_true",
                   help="capture every batch size up to the max bs, so that no batch is padded")  # fmt: skip


def add_kvadmit_serve_flags(p: argparse.ArgumentParser) -> None:
    """serve's flags that SGLang 0.5.22's launch_server does not have."""
    g = p.add_argument_group("server (kvadmit's own flags)")
    g.add_argument("--log-file", default=None, help="also write the server log to this file")
    g.add_argument("--health-check-timeout", type=float,
                   default=float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", 20)))  # fmt: skip
    g.add_argument("--graceful-shutdown-timeout", type=float, default=10.0,
                   help="seconds in-flight requests get after SIGTERM before they are aborted")  # fmt: skip
    g.add_argument("--trace-requests", metavar="FILE", default=None,
                   help="write one JSON line per request as it ends: when the engine received it (time and "
                   "step), its lengths and prompt ids; `kvadmit simulate --replay FILE` runs it again, "
                   "with --replay-arrival step step for step")  # fmt: skip
    g.add_argument("--trace-steps", metavar="FILE", default=None,
                   help="write one JSON line per step: its batch, its measured time (and the executor's "
                   "part of it), the state after it: the fields `kvadmit simulate --trace-steps` "
                   "writes")  # fmt: skip
    g.add_argument("--simulate", metavar="COST_MODEL", default=None,
                   help="serve a predicted GPU: the simulated executor in real time with this cost model "
                   "(a JSON file or a preset such as h100:llama-3-8b), no weights needed")  # fmt: skip
    g.add_argument("--simulate-output-len", metavar="DIST", default=None,
                   help="with --simulate: where requests without ignore_eos stop, as completion tokens "
                   "(EOS included): uniform (default: 2..max_new_tokens), fixed:F (F × max_new_tokens), "
                   "lognormal:MEAN,SIGMA (MEAN tokens), or trace:FILE (one length a line, or "
                   "--trace-requests JSON lines; cycled); at least one visible token unless "
                   "fixed:0")  # fmt: skip


def run(ns: argparse.Namespace) -> int:
    from kvadmit.observe.startup import loop_line
    from kvadmit.server.main import serve

    ns.startup_notes = check_sglang_flags(ns)
    ns.startup_notes += device_notes(ns.device, ns.simulate is not None)
    args = server_args_from(ns)
    ns.startup_notes.append(loop_line(args))
    return serve(ns, args)


def device_notes(device: str, simulated: bool) -> list[str]:
    """--device: a device SGLang does not know is refused; under --simulate, where the device is the cost
    model's, any other is a start-up note; a model runs on cpu or cuda only."""
    if device == "auto":
        return []
    kind = device.split(":", 1)[0]
    if kind not in SGLANG_DEVICES:
        raise UsageError(f"--device {device}: SGLang 0.5.22 runs on " + ", ".join(SGLANG_DEVICES))
    if simulated:
        return [f"--device {device}: serve --simulate simulates the device (the cost model's); no effect"]
    if kind not in MODEL_DEVICES:
        raise UsageError(f"--device {device}: kvadmit runs a model on cuda or cpu (or simulates one with "
                         "--simulate)")  # fmt: skip
    return []
