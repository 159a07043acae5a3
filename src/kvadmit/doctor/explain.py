"""Why requests wait in a healthy queue, in the admission rule's own arithmetic.

With the pool size (the start-up line's `max_total_num_tokens`, a metrics gauge, or failing both the
range `#token / token usage` allows) and, when the log runs in waves, the request shape read back from it
(waves.py), the reservation arithmetic is rebuilt by the capacity calculator — the same code that
answers `kvadmit capacity` — and offered only when it predicts the running count the log shows.
"""

from __future__ import annotations

from kvadmit.capacity.fit import CapacityError, FitQuestion, explain_fit
from kvadmit.config import ConfigError, ServerArgs
from kvadmit.doctor.collect import Collected
from kvadmit.doctor.rates import n, ordinal, word
from kvadmit.doctor.waves import WaveShape
from kvadmit.observe.metric_names import MAX_TOTAL_NUM_TOKENS


def pool_size(c: Collected, from_metrics: float | None = None) -> tuple[int | None, str]:
    """(tokens, where the number comes from); tokens None when unknown."""
    value = c.startup.get("max_total_num_tokens")
    if isinstance(value, int) and value > 0:
        return value, "the start-up line"
    if from_metrics:
        return int(from_metrics), MAX_TOTAL_NUM_TOKENS.name
    q = c.queue
    if q.pool_points and q.pool_lo <= q.pool_hi and q.pool_hi < float("inf"):
        mid = (q.pool_lo + q.pool_hi) / 2
        return None, f"about {_round(mid)} tokens, from #token ÷ token usage"
    return None, ""


def _round(x: float) -> str:
    """Three significant figures, as the 2-decimal token usage allows."""
    digits = max(len(str(int(x))) - 3, 0)
    return f"{round(x, -digits):,.0f}"


def wave_arithmetic(c: Collected, shape: WaveShape, pool: int) -> list[str] | None:
    """Sentences that rebuild the waves' admission from the rule, or None if the rule disagrees."""
    context = c.startup.get("context_len")
    try:
        args = ServerArgs(max_total_tokens=pool, context_length=context if isinstance(context, int) else None)
        result = explain_fit(FitQuestion(args, shape.prompt_len, shape.max_new_tokens, ignore_eos=True))
    except (CapacityError, ConfigError):
        return None
    if result.get("running_at_once") != shape.running:
        return None
    k = shape.running
    need = (k + 1) * (shape.prompt_len + shape.max_new_tokens)
    lead = (
        f"{word(k).capitalize()} fit at once and a {ordinal(k + 1)} would need {need:,} of the {pool:,} "
        f"tokens: every request has a {shape.prompt_len:,}-token prompt and generates all "
        f"{shape.max_new_tokens:,} of its max_new_tokens (read from {shape.waves} waves of {k} in this log), "
        f"so each holds {shape.prompt_len + shape.max_new_tokens:,} tokens by its end and the scheduler "
        "reserves all of them up front."
    )
    lines = [lead]
    explanation = result.get("explanation")
    if isinstance(explanation, list):
        lines.extend(str(x) for x in explanation)
    return lines


def generic_arithmetic(c: Collected, pool: int | None, pool_note: str) -> list[str]:
    """The rule in words, with the log's own numbers at its fullest moment while requests waited."""
    q = c.queue
    lines: list[str] = []
    if pool:
        size = f" of the {pool:,}-token pool" + (
            "" if pool_note == "the start-up line" else f" ({pool_note})"
        )
    else:
        size = f" of a pool of {pool_note}" if pool_note else ""
    if q.peak_wait is not None:
        used, running, usage, _ = q.peak_wait
        lines.append(
            f"At the fullest moment while requests waited, {running:,} running requests held {used:,} tokens "
            f"(token usage {usage:.2f}, about {n(used / running)} tokens each){size}."
        )
    lines.append(
        "The rest is not free for newcomers: each running request holds back its remaining max_new_tokens × "
        "the new-token ratio (× 1.0 under ignore_eos), and a waiting request is admitted only when its "
        "uncached prompt plus its max_new_tokens (clipped to 4,096) plus one page is strictly less than "
        "what remains. Requests therefore wait while usage is below 1.0: that is the forecast doing its "
        "job."
    )
    return lines


def queue_trend(c: Collected) -> str | None:
    q = c.queue
    if q.first_queue is None or q.last_queue is None or q.max_queue is None:
        return None
    top = q.max_queue[0]
    if q.last_queue < top:
        trend = f"Up to {top:,} requests waited, and the queue drained to {q.last_queue:,} by the end"
    elif q.first_queue < top:
        trend = f"The queue grew from {q.first_queue:,} to {top:,}"
    else:
        trend = f"The queue held at {top:,}"
    if c.prefill.batches:
        trend += f"; {c.prefill.batches:,} prefill batches admitted {c.prefill.admitted:,} requests"
        return trend + ": nothing is stuck, requests are admitted as running ones finish."
    return trend + "."
