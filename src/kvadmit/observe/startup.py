"""SGLang's start-up line ("max_total_num_tokens=..., chunked_prefill_size=..., ..."), the one
`kvadmit serve`, `kvadmit simulate` and the offline Engine print: what goes in it and its text."""

from __future__ import annotations

from kvadmit.config import ServerArgs
from kvadmit.observe import loglines
from kvadmit.scheduler.events import StartupInfo
from kvadmit.scheduler.scheduler import Scheduler


def startup_info(
    sched: Scheduler, args: ServerArgs, available_mem_gb: float, device: str = "cuda"
) -> StartupInfo:
    """The line's fields: the pool and limits as the scheduler resolved them; chunked_prefill_size as
    given (the resolved default when not given, -1 when chunking is off); device "cpu" or "cuda"."""
    chunk = args.chunked_prefill_size
    return StartupInfo(
        max_total_num_tokens=sched.max_total_num_tokens,
        chunked_prefill_size=chunk if chunk is not None else sched.chunked_prefill_size or -1,
        max_prefill_tokens=args.max_prefill_tokens,
        max_running_requests=sched.max_running_requests,
        context_len=sched.context_len,
        available_mem_gb=available_mem_gb,
        device=device,
    )


def startup_line(info: StartupInfo) -> str:
    """The line's text, without the timestamp."""
    return loglines.STARTUP.render(
        max_total_num_tokens=info.max_total_num_tokens,
        chunked_prefill_size=info.chunked_prefill_size,
        max_prefill_tokens=info.max_prefill_tokens,
        max_running_requests=info.max_running_requests,
        context_len=info.context_len,
        mem_label="available_cpu_mem" if info.device == "cpu" else "available_gpu_mem",
        available_mem=info.available_mem_gb,
    )


def loop_line(args: ServerArgs) -> str:
    """kvadmit's own start-up line: whose rules and which of SGLang's event loops it schedules with."""
    if args.disable_overlap_schedule:
        loop = "the non-overlap event loop (--disable-overlap-schedule)"
    else:
        loop = "the overlap event loop (SGLang's default; --disable-overlap-schedule for the other)"
    return f"Scheduling as SGLang {args.profile.name} with {loop}"
