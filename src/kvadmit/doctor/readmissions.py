"""Which Prefill lines may re-admit a retracted request, from the queue's order (issue 21).

Why it matters: a retracted request goes back to the queue and, when admitted again, prefills its prompt
and everything it had generated. The prompts' mean used to subtract those re-admissions as the
retractions' #new_tokens_gained, but that is what the pool gained, not what the victims held: a victim's
prompt sits in the radix cache, and when the freed outputs already make room, the retraction evicts none
of it (SGLang's retract_decode evicts only what the remaining requests' next steps need). That prompt is
then not in #new_tokens_gained, yet it leaves #token (evictable cache does not count) and is prefilled
again. On the storm round trip 19 of 246 retractions gained only the victim's output: 3,566 tokens over
1,400 requests, the prompt mean 2.5 tokens high and the outputs' CV² (which divides by a near-cancellation,
lengths.py) 15% low.

The rule: under --schedule-policy fcfs SGLang serves the queue in order, and a retracted request is
appended at its tail (scheduler._add_request_to_queue). Between two Prefill lines the queue grows by
the arrivals and the retracted requests and shrinks by #new-seq, each line's #queue-req is what is left
after it admits, so queue positions can be counted: position k is the k-th request to enter the queue
since the log's first Prefill line. The requests retracted between two Prefill lines entered somewhere
among that interval's arrivals (whether each arrival came before or after the retraction is not shown),
so they sit within [entered, entered + arrivals + retracted). A Prefill line that admits positions
[admitted, admitted + #new-seq) overlapping such a range may re-admit one; the others admit only
requests seen for the first time, and their tokens are those requests' prompts exactly. The Decode
lines' #queue-req are not used: under the overlap loop a Decode line can show the queue after the next
prefill's admission (it printed 52 after 53 with no Prefill line between, on the storm)."""

from __future__ import annotations

from dataclasses import dataclass

from kvadmit.doctor.observed import Observed, Prefill, Retract

FIFO_POLICIES = ("fcfs",)  # the policies that serve the queue in order (SGLang's default is fcfs)


@dataclass(frozen=True, slots=True)
class Readmissions:
    """The Prefill lines split into those that admit only first-time requests and the rest."""

    clean_tokens: int  # Σ (#new-token + #cached-token) over the lines that admit no retracted request
    clean_seqs: int
    clean_alone: tuple[int, ...]  # the prompts of the clean lines that admit one request
    suspect_tokens: int  # the same over the lines that may re-admit one
    suspect_seqs: int
    readmitted: int  # retracted requests admitted again by the last Prefill line
    retracted: int  # all the log's retracted requests

    @property
    def prompt_mean(self) -> float:
        return self.clean_tokens / self.clean_seqs

    def readmitted_tokens(self, prompt: float) -> float:
        """What the re-admissions prefilled (their prompts and outputs so far): the suspect lines' tokens
        less a prompt for each first-time request among them."""
        return self.suspect_tokens - prompt * (self.suspect_seqs - self.readmitted)


def track_readmissions(obs: Observed) -> Readmissions | None:
    """None when the log cannot be read so: a policy other than fcfs, no retraction, no line that surely
    admits only first-time requests, or a queue that shrank by more than the lines admitted (aborts, or
    lines missing)."""
    if obs.server_args.get("schedule_policy", "fcfs").strip("'\"") not in FIFO_POLICIES:
        return None
    entered: int | None = None  # queue positions handed out so far
    admitted = retracted = 0
    ranges: list[tuple[int, int, int]] = []  # (first, end, count): where retracted requests may sit
    clean = [0, 0]
    suspect = [0, 0]
    alone: list[int] = []
    for e in obs.events:
        if isinstance(e, Retract):
            retracted += e.count
            continue
        if not isinstance(e, Prefill) or e.queue is None:
            continue
        before = e.queue + e.new_seq  # the queue just before this line admitted
        if entered is None:  # the first line: its queue's order is not known
            entered = before
            if retracted:  # retracted before it: anywhere in that queue
                ranges.append((0, before, retracted))
                retracted = 0
        else:
            arrivals = before - (entered - admitted) - retracted
            if arrivals < 0:
                return None
            if retracted:
                ranges.append((entered, entered + arrivals + retracted, retracted))
            entered += arrivals + retracted
            retracted = 0
        lo, hi = admitted, admitted + e.new_seq
        tokens = e.new_token + e.cached
        if any(first < hi and lo < end for first, end, _ in ranges):
            suspect[0] += tokens
            suspect[1] += e.new_seq
        else:
            clean[0] += tokens
            clean[1] += e.new_seq
            if e.new_seq == 1:
                alone.append(tokens)
        admitted = hi
        ranges = [r for r in ranges if r[1] > admitted]
    total = sum(r.count for r in obs.retracts)
    if clean[1] == 0 or total == 0:
        return None
    # Retracted requests not admitted again by the end: those whose range lies past the last admission
    # (all of a range's requests when it starts past it, at most its unadmitted positions otherwise).
    waiting = sum(min(n, end - max(first, admitted)) for first, end, n in ranges) + retracted
    readmitted = max(total - waiting, 0)
    return Readmissions(clean[0], clean[1], tuple(alone), suspect[0], suspect[1], readmitted, total)
