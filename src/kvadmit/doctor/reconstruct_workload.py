"""The workload's side of a reconstruction from a log alone: when requests arrived, how long their prompts
and outputs were, what they asked for (max_new_tokens) and whether they stopped early.

The arithmetic (docs/sglang-rules.md §2–§4):
* Arrivals: arrivals.py.
* Prompts: (#new-token + #cached-token) ÷ #new-seq over the Prefill lines; their spread from the lines
  that admit one request.
* Outputs. Over the --decode-log-interval (n) steps between two Decode lines every running request
  gains a token per step, so #token grows by n × #running-req, plus what was prefilled, less what
  retraction freed (#new_tokens_gained) and less what finished requests freed. The requests that
  finished are Δ#running-req + Σ #new-seq − Σ #retracted_reqs. What a finished request freed, on
  average, is its prompt plus its output.
* The spread of the outputs: lengths.py (a running request is likely a long one).
* The budget. After a retraction the ratio is (Σ outputs + 20 × n) / (Σ max_new_tokens + 1) over the n
  requests left (§2), and the pool was full when it retracted: Σ outputs ≈ pool − freed − n × prompt,
  which gives the mean max_new_tokens.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from kvadmit.doctor.inferred import Inferred
from kvadmit.doctor.observed import Decode, Observed, Prefill, Retract
from kvadmit.doctor.readmissions import Readmissions

RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS's default (§2)
MIN_ALONE = 20  # Prefill lines of one request each, to tell the prompts' spread


@dataclass(slots=True)
class Start:
    """The server's state at the first batch line of the window."""

    t: float
    running: int
    tokens: int
    queue: int


def window_events(obs: Observed, t0: float, t1: float) -> list[Decode | Prefill | Retract]:
    return [e for e in obs.events if t0 <= e.t <= t1]


def infer_start(events: list[Decode | Prefill | Retract], pool: int) -> Start | None:
    """Running, tokens held and queue just before the window's first batch line."""
    for e in events:
        if isinstance(e, Decode):
            tokens = e.tokens if e.tokens is not None else round((e.usage or 0.0) * pool)
            return Start(e.t, e.running, tokens, e.queue or 0)
        if isinstance(e, Prefill):
            used = round((e.usage or 0.0) * pool) - e.new_token - e.cached
            # The line's queue is after admission; the admitted were waiting before it.
            return Start(e.t, e.running or 0, max(used, 0), (e.queue or 0) + e.new_seq)
    return None


def infer_prompt(obs: Observed, tracked: Readmissions | None = None) -> Inferred[float] | None:
    """(#new-token + #cached-token) ÷ #new-seq over the Prefill lines that admit no retracted request,
    when the queue's order tells them (readmissions.py). Otherwise over all of them less the
    re-admissions: each prefills again its prompt and what it had generated, taken as what its retraction
    freed (#new_tokens_gained; short of it when the cache kept the victim's prompt)."""
    seqs = sum(p.new_seq for p in obs.prefills)
    if seqs == 0:
        return None
    if tracked is not None and tracked.clean_seqs >= 3:
        how = (
            f"(#new-token + #cached-token) ÷ #new-seq over the Prefill lines that admit no retracted request "
            f"(fcfs queue order: {tracked.suspect_seqs:,} of {seqs:,} admissions may be re-admissions, left "
            f"out) ({tracked.clean_seqs:,} requests)"
        )
        return Inferred(tracked.prompt_mean, how, "estimate")
    tokens = sum(p.new_token + p.cached for p in obs.prefills)
    how = f"(#new-token + #cached-token) ÷ #new-seq over {len(obs.prefills):,} Prefill lines"
    retracted = sum(r.count for r in obs.retracts)
    gained = sum(r.gained for r in obs.retracts if r.gained is not None)
    counted = sum(r.count for r in obs.retracts if r.gained is not None)
    if retracted and counted == retracted and seqs - retracted >= 3 and tokens > gained:
        tokens, seqs = tokens - gained, seqs - retracted
        how += f", less {retracted:,} re-admitted after retraction (Σ #new_tokens_gained {gained:,})"
    how += f" ({seqs:,} requests)"
    return Inferred(tokens / seqs, how, "estimate" if seqs >= 3 else "guess")


def infer_prompt_spread(obs: Observed, tracked: Readmissions | None = None) -> Inferred[float]:
    """The prompts' squared coefficient of variation, from the Prefill lines that admit one request before
    the first retraction: each shows that request's prompt (#new-token + #cached-token). After a
    retraction a line may be a re-admission, which prefills the prompt and the output again (on the
    uniform-stop round trip those lines put CV² at 0.12 where every prompt is 128 tokens); where the
    queue's order tells which lines cannot be (readmissions.py), those count too (the storm round trip
    retracts after ~28 admissions: ~400 lines instead). Too few lines: every prompt as long as the mean."""
    first = obs.retracts[0].t if obs.retracts else float("inf")
    alone = [p.new_token + p.cached for p in obs.prefills if p.new_seq == 1 and p.t < first]
    where = "before the first retraction" if obs.retracts else "in the log"
    if tracked is not None and len(tracked.clean_alone) > len(alone):
        alone, where = list(tracked.clean_alone), "and no retracted one (fcfs queue order)"
    if len(alone) < MIN_ALONE:
        how = f"{len(alone)} Prefill lines admit one request {where} ({MIN_ALONE} tell): every prompt as long"
        return Inferred(0.0, how, "guess")
    mean = statistics.fmean(alone)
    value = statistics.pvariance(alone) / mean**2
    how = f"the prompts of the {len(alone):,} Prefill lines that admit one request {where}: CV² {value:.3f}"
    return Inferred(value, how, "estimate")


def finished_context(obs: Observed, interval: int) -> tuple[float, float, float] | None:
    """(tokens freed, requests finished, request-steps decoded) summed over consecutive Decode lines (see
    the module's note)."""
    freed = finished = decoded = 0.0
    prev: Decode | None = None
    prefilled = new_seq = retracted = gained = 0
    for e in obs.events:
        if isinstance(e, Prefill):
            prefilled += e.new_token + e.cached
            new_seq += e.new_seq
        elif isinstance(e, Retract):
            retracted += e.count
            gained += e.gained or 0
        elif e.tokens is not None:
            if prev is not None and prev.tokens is not None:
                grown = interval * (prev.running + e.running) / 2 + prefilled - gained
                freed += grown - (e.tokens - prev.tokens)
                finished += prev.running - e.running + new_seq - retracted
                decoded += interval * (prev.running + e.running) / 2
            prev = e
            prefilled = new_seq = retracted = gained = 0
    return (freed, finished, decoded) if finished > 0 else None


def mean_context(obs: Observed) -> float | None:
    ctx = [d.tokens / d.running for d in obs.decodes if d.tokens and d.running]
    return statistics.fmean(ctx) if ctx else None


def prompt_cap_from_retractions(obs: Observed, interval: int) -> tuple[float, str] | None:
    """An upper bound on the prompt from the retractions of a log with no admission in sight: the least,
    over those retractions, of #new_tokens_gained ÷ #retracted_reqs less the steps decoded since the first
    Decode line.

    Why: a retraction frees at least the retracted request's own tokens, its prompt (the part no other
    request shares in the radix cache) plus every token it has generated; eviction from the tree cache
    can only add to #new_tokens_gained. Between two Decode lines the server ran --decode-log-interval
    decode steps, each giving every request in the batch a token. So a request that was already running
    at the window's first Decode line has generated at least (Decode lines since − 1) × interval tokens by
    the time it is retracted, and its prompt is at most what it freed less that. (Log 04: the retraction
    after 14 Decode lines freed 1,005 tokens; 1,005 − 13 × 40 = 485.)

    When it does not apply: only while the log shows nothing was admitted since the window began, since a
    request admitted within the window has decoded an unknown part of those steps. So only the
    retractions before the first Prefill line count, and only while #running-req never rose from one
    Decode line to the next (a rise is an admission whose Prefill line is not in the excerpt); with no
    Decode line before a retraction nothing is known to have been decoded. Like the smallest
    #new_tokens_gained, it bounds the prompts of the requests retracted, not their mean: a cap on a guess."""
    decode_lines = 0
    last_running: int | None = None
    best: tuple[float, str] | None = None
    for e in obs.events:
        if isinstance(e, Prefill):
            break  # an admission: from here on a request's decoded count is not known
        if isinstance(e, Decode):
            if last_running is not None and e.running > last_running:
                break  # running rose: an admission the excerpt does not show
            last_running = e.running
            decode_lines += 1
        elif isinstance(e, Retract) and e.gained is not None and e.count > 0 and decode_lines >= 1:
            steps = (decode_lines - 1) * interval
            bound = e.gained / e.count - steps
            if bound >= 1 and (best is None or bound < best[0]):
                how = (
                    f"a retraction after {decode_lines} Decode lines with no admission freed "
                    f"{e.gained:,} tokens for {e.count}, each having decoded at least "
                    f"{decode_lines - 1} × {interval} = {steps:,} since the first: {bound:,.0f}"
                )
                best = (bound, how)
    return best


def unfreed_by_retraction(obs: Observed, tracked: Readmissions | None, prompt: float) -> float:
    """What the retracted requests held beyond the retractions' Σ #new_tokens_gained: the prompts the
    cache kept (readmissions.py), which left #token all the same. A re-admission prefills all its
    request held, so it is the re-admitted tokens less their share of what the retractions gained (the
    re-admitted of all retracted; 0 when it cannot be told)."""
    gains = [r.gained for r in obs.retracts]
    if tracked is None or not tracked.readmitted or None in gains:
        return 0.0
    share = tracked.readmitted / tracked.retracted
    return tracked.readmitted_tokens(prompt) - share * sum(g for g in gains if g is not None)


def infer_lengths(
    obs: Observed, interval: int, prompt: Inferred[float] | None, unfreed: float = 0.0
) -> tuple[Inferred[float], Inferred[float]]:
    """(prompt, output) means. Without Prefill lines the prompt comes from two facts: a running request
    holds its prompt plus, on average, half its output; a finished one freed its prompt plus all of it.
    `unfreed`: tokens the retracted requests released from #token beyond #new_tokens_gained, which the
    #token arithmetic (finished_context) would otherwise count as freed by finishing."""
    done = finished_context(obs, interval)
    if done is not None and unfreed:
        done = (done[0] - unfreed, done[1], done[2])
    ctx = mean_context(obs)
    at_finish = done[0] / done[1] if done and done[1] >= 3 else None
    if prompt is None:
        if at_finish is not None and ctx is not None:
            gained = [r.gained for r in obs.retracts if r.gained]
            cap = float(min(gained)) if gained else at_finish
            how = (
                f"no Prefill lines: 2 × the mean #token per running request ({ctx:,.0f}) − what a finished "
                f"request freed ({at_finish:,.0f}), at most the smallest retraction's #new_tokens_gained"
            )
            decoded_cap = prompt_cap_from_retractions(obs, interval)
            if decoded_cap is not None and decoded_cap[0] < cap:
                cap = decoded_cap[0]
                how += f" less what it had decoded ({decoded_cap[1]})"
            value = min(max(2 * ctx - at_finish, 1.0), cap)
            prompt = Inferred(value, how, "guess")
        else:
            prompt = Inferred(512.0, "no Prefill lines and no finishes to tell: 512 assumed", "guess")
    if at_finish is not None:
        assert done is not None
        value = max(at_finish - prompt.value, 1.0)
        how = (
            f"a finished request freed {at_finish:,.0f} tokens on average ({done[1]:,.0f} finished between "
            f"Decode lines, #token's growth over {interval} steps): that less the prompt"
        )
        if unfreed:
            how += f" (less {unfreed:,.0f} tokens that retracted requests held beyond #new_tokens_gained)"
        return prompt, Inferred(value, how, "estimate")
    if ctx is not None:
        value = max(2 * (ctx - prompt.value), 1.0)
        how = "no finishes seen: twice the mean output held by a running request"
        how += f" ({ctx:,.0f} tokens less the prompt)"
        return prompt, Inferred(value, how, "guess")
    return prompt, Inferred(256.0, "nothing to tell: 256 assumed", "guess")


def infer_budget(obs: Observed, pool: int, prompt: float, output: float) -> Inferred[float]:
    """The mean max_new_tokens from the ratios retraction set (see the module's note)."""
    running: int | None = None
    budgets: list[float] = []
    for e in obs.events:
        if isinstance(e, Decode):
            running = e.running
        elif isinstance(e, Prefill) and running is not None:
            running += e.new_seq
        elif isinstance(e, Retract) and running is not None:
            left = running - e.count
            running = left
            if left <= 0 or e.new_ratio is None or not 0 < e.new_ratio < 0.999 or e.gained is None:
                continue
            outputs = pool - e.gained - left * prompt
            if outputs <= 0:
                continue
            budgets.append(((outputs + RETRACT_DECODE_STEPS * left) / e.new_ratio - 1) / left)
    if budgets:
        value = max(statistics.median(budgets), output)
        how = (
            f"the ratio after {len(budgets)} retractions, (Σ outputs + 20 × left) ÷ (Σ max_new_tokens + 1), "
            "with the pool full"
        )
        return Inferred(value, how, "estimate")
    return Inferred(output, "not shown (no retraction): taken as the mean output", "guess")


def infer_spread(obs: Observed, prompt: Inferred[float], output: Inferred[float]) -> Inferred[float]:
    """The output lengths' squared coefficient of variation, from the inspection paradox (lengths.py):
    the mean output a running request holds, over the Decode lines, against the mean output."""
    tokens = sum(d.tokens for d in obs.decodes if d.tokens and d.running)
    running = sum(d.running for d in obs.decodes if d.tokens and d.running)
    if running == 0 or output.value <= 1:
        return Inferred(0.0, "no Decode line with #token: every output taken as long as the mean", "guess")
    age = tokens / running - prompt.value
    value = max(2.0 * age / output.value - 1.0, 0.0)
    how = (
        f"a running request holds {age:,.0f} output tokens on average (Σ #token ÷ Σ #running-req less the "
        f"prompt) against a mean output of {output.value:,.0f}: CV² = 2 × {age:,.0f} ÷ {output.value:,.0f} "
        "− 1"
    )
    sure = "guess" if "guess" in (prompt.confidence, output.confidence) else "estimate"
    return Inferred(value, how, sure)


def infer_remaining(obs: Observed, interval: int, output: float) -> Inferred[float]:
    """How many more tokens a request running when the window opens will generate, on average: the
    running batch decodes #running-req tokens a step and loses a request per finish, so at the log's
    own rate of finishing a running request has request-steps decoded ÷ finishes steps left (in a
    steady state that is the mean output; in a storm, where few finish, it is longer)."""
    done = finished_context(obs, interval)
    if done is None or done[1] < 3:
        return Inferred(output / 2, "no finishes to tell: half the mean output", "guess")
    value = done[2] / done[1]
    how = f"{done[2]:,.0f} request-steps decoded for {done[1]:,.0f} finishes between Decode lines"
    return Inferred(value, how, "estimate")
