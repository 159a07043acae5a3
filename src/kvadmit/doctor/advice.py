"""What to do, following SGLang's hyperparameter tuning guide and the mission document: raise
--schedule-conservativeness (e.g. 1.3) or lower --max-running-requests for retraction storms; lower it
(e.g. 0.3) or set realistic max_new_tokens for an idle pool; never a larger --mem-fraction-static alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvadmit.doctor.model import CAP_CAUSE

if TYPE_CHECKING:
    from kvadmit.doctor.collect import Collected

NEVER_MEM_FRACTION = (
    "Do not fix it with a larger --mem-fraction-static alone: the memory comes out of what activations and "
    "CUDA graphs need, and the forecast still over-commits the bigger pool the same way."
)

LAST_REQUEST_WORDING = {
    "<=0.5.6": "This is SGLang ≤ 0.5.6's wording (AssertionError: No space left for only one request): the "
    "assertion crashes the scheduler, and every request on the server fails with it.",
    "0.5.7-0.5.9": "This is SGLang 0.5.7–0.5.9's wording (ValueError: Out of memory even after retracting "
    "all other requests): the error crashes the scheduler.",
    ">=0.5.10": "This is SGLang ≥ 0.5.10's wording: the last request is aborted (HTTP 500, 'Out of memory "
    "even after retracting all other requests in the decode batch. Aborting the last request.') and the "
    "server keeps serving the rest — the retraction loop ends instead of repeating forever.",
}


def oom(last_request: bool, gpu: bool, pool: int | None, kv_alloc: bool = False) -> list[str]:
    out = []
    if kv_alloc:
        out += [
            "Admission should never let through a batch the pool cannot hold: if --page-size is above 1 or "
            "speculative decoding is on, try --page-size 1 or a newer SGLang, and report the 'Try to "
            "allocate' numbers with the version upstream.",
            "Until then, lower --max-running-requests (or raise --schedule-conservativeness, e.g. to 1.3) so "
            "that decode keeps slack for the slots the checks do not count.",
        ]
    if last_request:
        size = f" (this pool: {pool:,} tokens)" if pool else ""
        out += [
            f"Keep one request within the pool{size}: cap --context-length, or the clients' max_new_tokens, "
            "so that prompt + output fits the pool on its own; a request longer than the pool can never "
            "finish.",
            "For more pool, add memory where the KV cache lives (more GPUs with tensor parallelism, a "
            "quantized "
            "KV cache, a smaller model) — " + NEVER_MEM_FRACTION[0].lower() + NEVER_MEM_FRACTION[1:],
            "On SGLang older than 0.5.10, upgrade: the same situation then aborts that one request instead "
            "of crashing the server.",
        ]
    if gpu:
        out.append(
            "For the GPU allocator's own out-of-memory: leave more room for activations (SGLang's guide: "
            "5–8 GB, see available_gpu_mem in the start-up line) with a lower --mem-fraction-static, a "
            "smaller --chunked-prefill-size, or a smaller --cuda-graph-max-bs."
        )
    return out


def storm(running_at_first: int | None) -> list[str]:
    lower = f" (below the {running_at_first:,} running when retraction began)" if running_at_first else ""
    return [
        "Raise --schedule-conservativeness, e.g. to 1.3: the new-token ratio then starts higher (0.7 × 1.3 "
        "= 0.91) and decays to a higher floor, so running requests hold back more of their remaining "
        "max_new_tokens and fewer are admitted than the pool can finish.",
        f"Or lower --max-running-requests{lower}, so that a full batch can finish within the pool.",
        "Set realistic max_new_tokens in clients: the forecast scales every reservation by it.",
        NEVER_MEM_FRACTION,
    ]


def vllm_storm() -> list[str]:
    return [
        "Give each running request more room: lower --max-num-seqs (fewer running at once) or "
        "--max-num-batched-tokens, so the batch fits the KV cache it grows into.",
        "Prefer recomputation to swapping when requests are short (--preemption-mode recompute on V0), and "
        "avoid n ≥ 2 sampling with chunked prefill on V0, which is what swapped here in the public report.",
        "Raising --gpu-memory-utilization alone moves the same problem to activation memory.",
    ]


def occasional() -> list[str]:
    return [
        "Nothing to change while it stays about once a minute or less; if it grows more frequent, raise "
        "--schedule-conservativeness (e.g. 1.3) or lower --max-running-requests.",
    ]


def stall_after_retraction(running_at_start: int | None) -> list[str]:
    lower = f" (below the {running_at_start:,} running when it stalled)" if running_at_start else ""
    return [
        "The retraction raised the new-token ratio, and the raised ratio holds admission back: stop the "
        "retractions so it stays low. Raise --schedule-conservativeness (e.g. 1.3) so the forecast admits "
        f"no more than the pool can finish, or lower --max-running-requests{lower}.",
        "The ratio decays by (init − min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS per decode step (600 steps by "
        "default): fewer steps shorten each stall, at the risk of the next retraction coming sooner. "
        "SGLANG_RETRACT_DECODE_STEPS (20) is the room per request that the ratio set by a retraction "
        "keeps for the survivors.",
        NEVER_MEM_FRACTION,
    ]


def prefill_bound() -> list[str]:
    return [
        "Nothing to change: the queue drains as fast as prefill runs, and the pool fills as it does.",
        "Only if time to first token matters during such bursts: raise --chunked-prefill-size and "
        "--max-prefill-tokens for larger prefill passes (more activation memory, and running requests "
        "wait longer between decode steps).",
    ]


def collapse() -> list[str]:
    return [
        "Treat it as an incident, not tuning: compare 'cuda graph' in the decode lines before and after (a "
        "batch that fell off CUDA graphs decodes much slower), and restart the server if it stays down.",
        "Prevent the retraction that triggered it: raise --schedule-conservativeness (e.g. 1.3) or lower "
        "--max-running-requests.",
        NEVER_MEM_FRACTION,
    ]


def idle(cause: str, c: Collected) -> list[str]:
    cap = c.startup.get("max_running_requests")
    if cause == "blocked":
        return [
            "Look for what blocks the scheduler: a stuck request, a failed worker, an exception before this "
            "point in the log. Report it upstream with the log: a queue beside an empty pool is an "
            "accounting bug.",
        ]
    if cause == "ratio-after-retraction":
        return [
            "Stop the retractions that push the ratio up (see the retraction finding); the ratio then "
            "decays back by itself and admission grows bolder again.",
            "Set realistic max_new_tokens in clients: a high ratio times an oversized max_new_tokens "
            "reserves far more than requests use.",
        ]
    if cause == CAP_CAUSE:
        if c.engine == {"vllm"}:
            return ["Raise --max-num-seqs if the KV cache has room: usage stays low at the cap."]
        value = f" (now {cap:,})" if isinstance(cap, int) else ""
        return [
            f"Raise --max-running-requests{value} if the pool has room: usage stays low at the cap.",
            "If the cap is the CUDA-graph batch size, raise --cuda-graph-max-bs with it.",
        ]
    return [
        "Set realistic max_new_tokens in clients: a client that asks for 4,096 tokens and uses 200 makes "
        "every reservation about 20 times too big.",
        "Or lower --schedule-conservativeness (e.g. 0.3), so running requests hold back less of their "
        "remaining max_new_tokens; SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION caps the estimate for new ones.",
        NEVER_MEM_FRACTION,
    ]


def healthy() -> list[str]:
    return [
        "Nothing is broken: the wait is the forecast keeping every running request fast. To serve more at "
        "once, the pool must hold more (more GPUs, a quantized KV cache) or requests must ask for fewer "
        "max_new_tokens.",
        "Watch #queue-req and time to first token; SGLang's guide calls a #queue-req of 100–2000 healthy.",
    ]


def full_without_queue() -> list[str]:
    return [
        "Nothing to change for admission from these lines. To see whether requests wait, and for how long, "
        "paste whole batch lines: #queue-req is near their end.",
        "A pool this full with few requests running would be worth a look: #token ÷ #running-req is what "
        "each running request holds, prompt and output together.",
    ]


def no_queue() -> list[str]:
    return [
        "Nothing to change for admission. If users still wait, look at time per output token or the client; "
        "in a benchmark, #queue-req staying at 0 means the client sends too slowly to load the server "
        "(SGLang's tuning guide).",
    ]


def unrelated() -> list[str]:
    return [
        "Look outside admission: the health-check path, timeouts, the network between ranks, client "
        "disconnects, and the errors quoted here.",
        "Probe with /health (or /ready) rather than /health_generate if the probes themselves are suspect.",
    ]
