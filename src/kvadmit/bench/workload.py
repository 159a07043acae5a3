"""Workloads as bench_serving draws them (docs/sglang-rules.md §7), plus where each request really stops.

Lengths come from numpy's legacy generator seeded with --seed, in bench_serving's order: input lengths,
output lengths, then random-ids token offsets, then (with a finite --request-rate) Poisson gaps. Where a
request stops under --disable-ignore-eos is drawn from a second generator, and each request's priority
(--priority-mix) from a third, so neither ever shifts those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from kvadmit.pickling import by_fields

STOP_DISTRIBUTIONS = ("uniform", "full")
_set_field: Final = object.__setattr__  # (a frozen dataclass sets its fields so)


@dataclass(frozen=True, slots=True)
class SimRequest:
    index: int
    prompt_len: int
    output_len: int  # the dataset's output length (bench_serving's `output_len`)
    max_new_tokens: int  # what the client asks for
    true_output_len: int | None  # the token that is EOS (None: it never stops early)
    ignore_eos: bool
    # random-ids: token j of the prompt is (offset + index + j) % vocab_size, offsets drawn with
    # randint(0, vocab_size) — bench_serving 0.5.22's sample_random_requests (sglang/benchmark/datasets/
    # random.py in the PyPI wheel), not spelled out in the reference.
    offset: int
    tokens: tuple[int, ...] | None = None  # the prompt itself (a replayed trace's input_ids)
    priority: int | None = None  # the request's priority (--priority-mix), None: it sends none

    # Written out (the fields, in order, with their defaults; tests/test_native_inits.py checks): the
    # compiled core builds it natively, where dataclass's generated __init__ is interpreted Python.
    def __init__(
        self, index: int, prompt_len: int, output_len: int, max_new_tokens: int, true_output_len: int | None,
        ignore_eos: bool, offset: int, tokens: tuple[int, ...] | None = None, priority: int | None = None,
    ) -> None:  # fmt: skip
        _set_field(self, "index", index)
        _set_field(self, "prompt_len", prompt_len)
        _set_field(self, "output_len", output_len)
        _set_field(self, "max_new_tokens", max_new_tokens)
        _set_field(self, "true_output_len", true_output_len)
        _set_field(self, "ignore_eos", ignore_eos)
        _set_field(self, "offset", offset)
        _set_field(self, "tokens", tokens)
        _set_field(self, "priority", priority)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # (kvadmit/pickling.py: compiled, a frozen field refuses the restore)

    def prompt(self, vocab_size: int, token_ids: list[int] | None = None) -> list[int]:
        """Token j is (offset + index + j) % vocab_size, built from whole ranges (or `tokens`, when given).

        `token_ids` (= list(range(vocab_size)), built once by the caller) makes this a few slices of
        existing int objects instead of a thousand new ones.
        """
        if self.tokens is not None:
            return list(self.tokens)
        ids = token_ids if token_ids is not None else list(range(vocab_size))
        start = (self.offset + self.index) % vocab_size
        tokens = ids[start : start + self.prompt_len]
        while len(tokens) < self.prompt_len:  # wrapped past the end of the vocabulary
            tokens.extend(ids[: min(vocab_size, self.prompt_len - len(tokens))])
        return tokens


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    num_prompts: int = 1000
    input_len: int = 1024
    output_len: int = 1024
    range_ratio: float = 0.0
    seed: int = 42
    vocab_size: int = 32000
    ignore_eos: bool = True
    max_new_tokens: int | None = None  # ask for this instead of the dataset's output length
    stop: str = "uniform"  # without ignore_eos, where a request stops: uniform in [1, max_new] or "full"
    output_lens: tuple[int, ...] | None = None  # true output lengths from a file (cycled)
    priority_mix: PriorityMix | None = None  # (priority, weight) pairs: each request draws one

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return by_fields(self)  # (kvadmit/pickling.py: compiled, a frozen field refuses the restore)

    def validate(self) -> None:
        if self.num_prompts <= 0:
            raise ValueError(f"--num-prompts must be positive, got {self.num_prompts}")
        if self.input_len <= 0 or self.output_len <= 0:
            raise ValueError("--random-input-len and --random-output-len must be positive")
        if not 0.0 <= self.range_ratio <= 1.0:
            raise ValueError(f"--random-range-ratio must be within [0, 1], got {self.range_ratio}")
        if self.max_new_tokens is not None and self.max_new_tokens <= 0:
            raise ValueError(f"--max-new-tokens must be positive, got {self.max_new_tokens}")
        if self.stop not in STOP_DISTRIBUTIONS:
            raise ValueError(f"--stop-distribution must be one of {', '.join(STOP_DISTRIBUTIONS)}")
        if self.output_lens is not None and (not self.output_lens or min(self.output_lens) <= 0):
            raise ValueError("the output-length file must list positive integers")


PriorityMix = tuple[tuple[int, float], ...]


def parse_priority_mix(text: str) -> PriorityMix:
    """--priority-mix "0:0.8,10:0.2": priority:weight pairs (weights > 0, any scale; a bare priority
    weighs 1). ValueError says what is wrong."""
    pairs: list[tuple[int, float]] = []
    for part in text.split(","):
        prio, _, weight = part.strip().partition(":")
        try:
            pair = (int(prio), float(weight) if weight else 1.0)
        except ValueError:
            raise ValueError(
                f"--priority-mix {text!r}: each entry is PRIORITY:WEIGHT (an integer and a number), "
                f"got {part.strip()!r}"
            ) from None
        if not pair[1] > 0 or pair[1] == float("inf"):
            raise ValueError(f"--priority-mix {text!r}: weights must be positive numbers, got {weight}")
        if any(p == pair[0] for p, _ in pairs):
            raise ValueError(f"--priority-mix {text!r}: priority {pair[0]} is listed twice")
        pairs.append(pair)
    return tuple(pairs)


def draw_priorities(mix: PriorityMix, n: int, seed: int) -> list[int]:
    """Each of `n` requests' priority, drawn with the mix's weights from a generator of its own."""
    weights = np.array([w for _, w in mix], dtype=float)
    picks = np.random.RandomState(seed + 2).choice(len(mix), size=n, p=weights / weights.sum())
    return [mix[i][0] for i in picks.tolist()]


def _random_lens(rng: np.random.RandomState, full_len: int, ratio: float, n: int) -> list[int]:
    return rng.randint(max(int(full_len * ratio), 1), full_len + 1, size=n).tolist()


def build_workload(spec: WorkloadSpec) -> tuple[list[SimRequest], np.random.RandomState]:
    """The requests, and the generator positioned where bench_serving draws its Poisson gaps."""
    spec.validate()
    rng = np.random.RandomState(spec.seed)
    input_lens = _random_lens(rng, spec.input_len, spec.range_ratio, spec.num_prompts)
    output_lens = _random_lens(rng, spec.output_len, spec.range_ratio, spec.num_prompts)
    offsets = rng.randint(0, spec.vocab_size, size=spec.num_prompts).tolist()
    stops = np.random.RandomState(spec.seed + 1)
    priorities: list[int | None] = [None] * spec.num_prompts
    if spec.priority_mix:
        priorities = list(draw_priorities(spec.priority_mix, spec.num_prompts, spec.seed))
    asks = output_lens if spec.max_new_tokens is None else [spec.max_new_tokens] * spec.num_prompts
    true_lens: list[int | None] = [None] * spec.num_prompts
    if not spec.ignore_eos:
        if spec.output_lens is not None:
            true_lens = [spec.output_lens[i % len(spec.output_lens)] for i in range(spec.num_prompts)]
        elif spec.max_new_tokens is not None or spec.stop == "full":
            true_lens = list(output_lens)  # each asks for more than it uses
        else:
            # one draw in [1, asked] per request, in order: with an array of bounds numpy draws the very
            # values (and leaves the generator where) one call per request would
            true_lens = stops.randint(1, np.asarray(asks, dtype=np.int64) + 1).tolist()
    reqs = [
        SimRequest(i, input_lens[i], output_lens[i], asks[i], true_lens[i], spec.ignore_eos, offsets[i],
                   priority=priorities[i])
        for i in range(spec.num_prompts)
    ]  # fmt: skip
    return reqs, rng
