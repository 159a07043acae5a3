"""`kvadmit serve`: build the backend, the engine runner and the app, and run uvicorn until SIGTERM.

On SIGTERM (or Ctrl-C) the server stops admitting (new requests get 503), gives in-flight requests
--graceful-shutdown-timeout seconds to finish, aborts the rest with "The server is shutting down.",
and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import logging
import shlex
import signal
import sys
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from kvadmit.config import ServerArgs
from kvadmit.errors import UsageError

if TYPE_CHECKING:
    from kvadmit.executor.output_lengths import OutputLengths
    from kvadmit.model.cuda_graph_sizes import GraphFlags
    from kvadmit.server.traces import TraceFile

log = logging.getLogger("kvadmit.server")


def _setup_logging(level: str, log_file: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for h in handlers:
        h.setFormatter(logging.Formatter("%(message)s"))
    for name in ("kvadmit", "kvadmit.server"):
        logging.getLogger(name).handlers.clear()
    root = logging.getLogger("kvadmit")
    root.setLevel(level.upper())
    for h in handlers:
        root.addHandler(h)
    root.propagate = False


def _trace_file(path: str | None, flag: str) -> TraceFile | None:
    if path is None:
        return None
    from kvadmit.server.traces import TraceFile

    try:
        return TraceFile(path, flag)
    except OSError as e:
        raise UsageError(f"{flag}: cannot write {path!r}: {e.strerror}") from None


def _graph_flags(ns: argparse.Namespace, args: ServerArgs) -> GraphFlags:
    """serve's CUDA graph flags, checked before any model is loaded."""
    from kvadmit.model.cuda_graph_sizes import GraphFlags

    graphs = GraphFlags(
        disable=ns.disable_cuda_graph or ns.disable_decode_cuda_graph, max_bs=ns.cuda_graph_max_bs_decode,
        sizes=ns.cuda_graph_bs_decode, no_padding=ns.disable_cuda_graph_padding,
        max_running_requests=args.max_running_requests,
    )  # fmt: skip
    try:
        graphs.check()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return graphs


def build_state(ns: argparse.Namespace, args: ServerArgs) -> Any:
    from kvadmit.observe.load_snapshot import LoadCounters
    from kvadmit.server.backend import model_backend, simulated_backend
    from kvadmit.server.metrics import ServerMetrics
    from kvadmit.server.runner import EngineRunner
    from kvadmit.server.state import ServerState

    if ns.trace_requests is not None and ns.trace_requests == ns.trace_steps:
        raise UsageError(f"--trace-requests and --trace-steps both name {ns.trace_steps!r}: give each its "
                         "own file")  # fmt: skip
    began = time.monotonic()
    if ns.simulate:
        from kvadmit.costmodel.costmodel import CostModelError

        lengths = _output_lengths(getattr(ns, "simulate_output_len", None))
        if ns.kv_cache_dtype != "auto":
            raise UsageError(
                f"--kv-cache-dtype {ns.kv_cache_dtype} stores a real model's KV pool; --simulate has none "
                "(its pool is --max-total-tokens tokens, or the cost model's)"
            )
        try:
            backend = simulated_backend(
                ns.simulate, ns.tokenizer_path, args.max_total_tokens, args.context_length, lengths
            )
        except CostModelError as e:
            raise UsageError(str(e)) from None
        log.info(lengths.describe())
    elif getattr(ns, "simulate_output_len", None) is not None:
        raise UsageError("--simulate-output-len needs --simulate COST_MODEL (a model ends where it ends)")
    else:
        from kvadmit.model.default import DefaultModelError
        from kvadmit.model.loading import ModelLoadError

        graphs = _graph_flags(ns, args)
        try:
            backend = model_backend(
                ns.model_path, ns.tokenizer_path, ns.dtype, None if ns.device == "auto" else ns.device,
                args.max_total_tokens, ns.mem_fraction_static, args.context_length, ns.quantization,
                ns.torch_compile_max_bs if ns.enable_torch_compile else None, ns.kv_cache_dtype,
                graphs)  # fmt: skip
        except (ModelLoadError, DefaultModelError, OSError, ValueError) as e:
            raise UsageError(f"cannot load the model: {e}") from None
    name = ns.served_model_name or (
        "simulated" if ns.simulate else (ns.model_path or "SmolLM2-135M-Instruct")
    )
    loaded = time.monotonic()
    metrics = None
    if ns.enable_metrics:
        metrics = ServerMetrics(
            name, backend.pool_size, args.page_size, backend.context_len,
            weight_gb=backend.weight_bytes / 2**30, kv_cache_gb=backend.kv_cache_bytes / 2**30,
            available_gb=backend.available_mem_gb, priority_scheduling=args.enable_priority_scheduling,
            default_priority=args.default_priority_value,
        )  # fmt: skip
    emit = logging.getLogger("kvadmit.server").info
    runner = EngineRunner(
        backend, args, metrics=metrics, emit_log=emit, watchdog_timeout=ns.watchdog_timeout,
        stream_interval=getattr(ns, "stream_interval", 1),
        request_trace=_trace_file(ns.trace_requests, "--trace-requests"),
        step_trace=_trace_file(ns.trace_steps, "--trace-steps"),
    )  # fmt: skip
    resolved = _resolved_args(ns, args, backend, runner, name)
    state = ServerState(
        runner=runner,
        served_model_name=name,
        server_args=resolved,
        api_key=ns.api_key,
        enable_metrics=ns.enable_metrics,
        health_timeout=ns.health_check_timeout,
        created=int(time.time()),
        accelerator=_accelerator_name(backend.device, backend.simulated),
        scheduler_info=_scheduler_info(runner, loaded - began, time.monotonic() - loaded),
        load=LoadCounters(metrics_on=ns.enable_metrics),
    )
    state.load.attach(runner.engine)
    return state


def _resolved_args(
    ns: argparse.Namespace, args: ServerArgs, backend: Any, runner: Any, name: str
) -> dict[str, Any]:
    """The resolved arguments /server_info reports, as SGLang's server_args hold them."""
    resolved: dict[str, Any] = {k: v for k, v in asdict(args).items() if k != "knobs"}
    resolved.update(
        # serve --simulate has no model folder: its model_path is the served name, never a path that a
        # router would try to download
        model_path=name if ns.simulate else backend.model_path,
        tokenizer_path=backend.tokenizer_path, host=ns.host, port=ns.port,
        dtype=backend.dtype, device=backend.device, served_model_name=name, enable_metrics=ns.enable_metrics,
        quantization=None if ns.simulate else ns.quantization,
        kv_cache_dtype="auto" if ns.simulate else ns.kv_cache_dtype,
        simulate=ns.simulate, max_total_tokens=backend.pool_size, context_length=backend.context_len,
        max_running_requests=runner.scheduler.max_running_requests,
        # SGLang keeps -1 (chunking off) in its arguments, where kvadmit's scheduler holds None
        chunked_prefill_size=runner.scheduler.chunked_prefill_size or -1,
    )  # fmt: skip
    for key in ("tp_size", "dp_size", "pp_size"):
        resolved.setdefault(key, 1)  # one device, one scheduler
    resolved.setdefault("launch_command", launch_command(sys.argv))
    return resolved


def _output_lengths(spec: str | None) -> OutputLengths:
    from kvadmit.executor.output_lengths import OutputLengthError, OutputLengths, parse_output_lengths

    try:
        return parse_output_lengths(spec) if spec is not None else OutputLengths("uniform")
    except OutputLengthError as e:
        raise UsageError(str(e)) from None


def launch_command(argv: list[str]) -> str:
    """The command line as launched (SGLang's `launch_command`), the API key's value hidden."""
    shown, hide_next = [], False
    for arg in argv:
        if hide_next:
            arg, hide_next = "<redacted>", False
        elif arg == "--api-key":
            hide_next = True
        elif arg.startswith("--api-key="):
            arg = "--api-key=<redacted>"
        shown.append(arg)
    return shlex.join(shown)


def _accelerator_name(device: str, simulated: bool) -> str | None:
    """The GPU's marketing name, as /v1/loads reports it; None on CPU and in serve --simulate."""
    if simulated or not device.startswith("cuda"):
        return None
    import torch

    return str(torch.cuda.get_device_name(torch.device(device)))


def _scheduler_info(runner: Any, load_s: float, scheduler_s: float) -> dict[str, Any]:
    """What SGLang's scheduler hands the tokenizer manager at start-up (get_init_info), as /server_info
    shows it: the pool, the longest prompt (min(context − 1, pool − 1) − 5) and the start-up times."""
    s = runner.scheduler
    times = {
        "load_weight": round(load_s, 3),
        "kv_cache_allocation": 0.0,
        "scheduler_e2e": round(scheduler_s, 3),
    }
    return {
        "status": "ready",
        "max_total_num_tokens": s.max_total_num_tokens,
        "max_req_input_len": min(s.context_len - 1, s.max_total_num_tokens - 1) - 5,
        "startup_time": {**times, "cuda_graph": {}},
    }


def serve(ns: argparse.Namespace, args: ServerArgs) -> int:
    import uvicorn

    from kvadmit.server.app import create_app

    _setup_logging(ns.log_level, ns.log_file)
    for note in getattr(ns, "startup_notes", ()):  # about SGLang's flags: those with no effect here
        log.info(note)
    state = build_state(ns, args)
    runner = state.runner
    runner.start()
    app = create_app(state)
    # What start-up built (modules, the app, the pool) lives as long as the server: out of the collector's
    # sight, a full collection costs microseconds instead of ~25 ms of every thread's time
    gc.freeze()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if runner.accepting:
                runner.accepting = False  # new requests get 503 while in-flight ones finish
                grace = threading.Timer(ns.graceful_shutdown_timeout, runner.abort_in_flight)
                grace.daemon = True
                grace.start()
            super().handle_exit(sig, frame)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                log.info("The server is fired up and ready to roll!")

    config = uvicorn.Config(
        app, host=ns.host, port=ns.port, log_level=ns.log_level,
        # uvicorn waits for open connections; ours end once the grace timer has aborted what is left
        timeout_graceful_shutdown=ns.graceful_shutdown_timeout + 5,
    )  # fmt: skip
    server = Server(config)
    # uvicorn re-raises the signal that stopped it once it is done, with the handlers it found
    # installed: make those no-ops, so a SIGTERM'd server exits 0 after its orderly shutdown.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run()
    finally:
        runner.stop()
    if not server.started:
        raise UsageError(f"could not start the server on {ns.host}:{ns.port} (is the port in use?)")
    return 0
