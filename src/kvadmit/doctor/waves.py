"""Reading a benchmark's request shape back out of a log that runs in waves.

When every request has the same prompt and generates the same number of tokens (bench_serving's
ignore_eos default), the batch turns over in waves: a prefill admits n requests into an empty batch while
others stay queued, the n decode together, finish together, and the next n start. Then the log fixes
the shape exactly:

* the prompt P: `(#new-token + #cached-token) / #new-seq` of each wave's prefill;
* decode steps done j at each decode line: `#token / n − P` (each decode step adds one slot per request);
* the decode log interval I: the step between j's of one wave (every 40 steps by default);
* the decode steps per wave D: the decode counter behind the log interval runs on across waves, so the
  first j of consecutive waves differ by −D modulo I; and D lies in [largest last j, smallest last j + I)
  (still running at its last line, finished before the next). Together: one value. When the finishing
  step is itself logged (its line shows the slots already released), D is that step exactly.

A request generates its first token in the prefill and one per decode step, so max_new_tokens = D + 1.
The estimate is only offered when every wave agrees; the caller checks it against the admission rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class WaveShape:
    waves: int
    running: int  # n: requests that run at once
    prompt_len: int
    max_new_tokens: int
    log_interval: int


@dataclass
class _Wave:
    n: int
    prompt: int
    first_j: int | None = None
    last_j: int | None = None
    interval: int | None = None
    completed: bool = False
    exact_end: int | None = None  # the steps of a wave whose last step was itself a logged one


@dataclass
class WaveEstimator:
    waves: list[_Wave] = field(default_factory=list)
    broken: str = ""  # why the log is not in waves (empty while it still may be)
    max_waves: int = 10_000

    def prefill(
        self,
        running: int | None,
        queued: int | None,
        new_seq: int | None,
        new_token: int | None,
        cached: int | None,
    ) -> None:
        if self.broken or new_seq is None or new_token is None or running is None:
            return
        if running > 0:
            # Requests joined a running batch: not waves (unless this is a chunk of the same wave).
            if self.waves and not self.waves[-1].completed:
                self.broken = "requests join a running batch"
            return
        if self.waves and not self.waves[-1].completed:
            self.waves[-1].completed = True  # the batch emptied: the previous wave finished
        if not queued:
            return  # nothing left waiting: this pass was not stopped by admission
        total = new_token + (cached or 0)
        if new_seq <= 0 or total % new_seq:
            self.broken = "prompts differ in length"
            return
        if len(self.waves) < self.max_waves:
            self.waves.append(_Wave(new_seq, total // new_seq))

    def decode(self, running: int | None, used: int | None) -> None:
        if self.broken or not self.waves or self.waves[-1].completed or running is None or used is None:
            return
        w = self.waves[-1]
        if running != w.n:
            if running < w.n and w.first_j is not None:
                w.completed = True  # some finished: the wave is ending
                return
            self.broken = "the running count changes within a wave"
            return
        if used < w.n * w.prompt:
            # Logged on the step where all finished (their slots already released): that step is
            # `interval` after the previous line, so the wave's length is known exactly.
            if w.last_j is not None and w.interval is not None:
                w.exact_end = w.last_j + w.interval
            w.completed = True
            return
        if used % w.n:
            self.broken = "requests hold different numbers of tokens"
            return
        j = used // w.n - w.prompt
        if w.last_j is not None:
            step = j - w.last_j
            if step <= 0 or (w.interval is not None and step != w.interval):
                self.broken = "decode lines are not evenly spaced"
                return
            w.interval = step
        if w.first_j is None:
            w.first_j = j
        w.last_j = j

    def shape(self) -> WaveShape | None:
        if self.broken:
            return None
        full = [w for w in self.waves if w.first_j is not None and w.last_j is not None]
        if len(full) < 2:
            return None
        n, prompt = full[0].n, full[0].prompt
        intervals = {w.interval for w in full if w.interval is not None}
        if len(intervals) != 1 or any(w.n != n or w.prompt != prompt for w in full):
            return None
        interval = intervals.pop()
        residues = set()
        for a, b in zip(self.waves, self.waves[1:], strict=False):
            if a.first_j is None or b.first_j is None or not a.completed:
                return None
            residues.add((a.first_j - b.first_j) % interval)
        if len(residues) != 1:
            return None
        residue = residues.pop()
        lower = max(w.last_j for w in full if w.last_j is not None)
        # Still running at its last line, and finished before the next line would have been printed
        # (or exactly on it, when that step's line shows the slots released).
        upper = min(w.last_j + interval for w in full if w.completed and w.last_j is not None)
        exact = {w.exact_end for w in full if w.exact_end is not None}
        if len(exact) > 1:
            return None
        steps = list(exact) if exact else [d for d in range(lower, upper) if d % interval == residue]
        if len(steps) != 1 or steps[0] < lower or steps[0] % interval != residue:
            return None
        return WaveShape(len(full), n, prompt, steps[0] + 1, interval)
