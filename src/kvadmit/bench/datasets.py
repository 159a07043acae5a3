"""The benchmark's prompts, drawn as bench_serving draws them (docs/sglang-rules.md §7).

One numpy generator (legacy RandomState, seeded with --seed) draws lengths in bench_serving's order and
is then handed on for the Poisson gaps; one Python generator (random.Random(seed)) shuffles and picks
tokens where bench_serving uses Python's `random`. `recorded prompt_len` is the dataset's length (the
target for random datasets), as bench_serving records it.

* random-ids: the lengths and token offsets of `kvadmit simulate` (bench/workload.py), the same request
  for the same seed; token j of prompt i is (offset_i + i + j) mod vocab. Sent as text (the ids decoded)
  with the tokenizer's special-token count taken off the length, or as ids with --tokenize-prompt.
* random: the shipped corpus (or a local ShareGPT file), each prompt's tokens repeated or cut to length.
* sharegpt: a local ShareGPT JSON file (never downloaded): the first human turn as the prompt, the
  reply's length (or --sharegpt-output-len) as the output length.
* generated-shared-prefix: groups of prompts sharing a system prompt of random tokens.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from kvadmit.bench.tokenizer import BenchTokenizer
from kvadmit.bench.workload import WorkloadSpec, build_workload

DATASETS = ("random-ids", "random", "sharegpt", "generated-shared-prefix")


class DatasetError(Exception):
    """The dataset cannot be built: the message says why."""


@dataclass(frozen=True, slots=True)
class DatasetRow:
    prompt: str | list[int]
    prompt_len: int
    output_len: int
    priority: int | None = None  # sent as the request's `priority` (--priority-mix)


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    name: str = "random-ids"
    num_prompts: int = 1000
    input_len: int = 1024
    output_len: int = 1024
    range_ratio: float = 0.0
    seed: int = 42
    dataset_path: str = ""
    tokenize_prompt: bool = False  # random-ids: send token ids instead of their text
    sharegpt_output_len: int | None = None
    sharegpt_context_len: int | None = None
    gsp_num_groups: int = 64
    gsp_prompts_per_group: int = 16
    gsp_system_prompt_len: int = 2048
    gsp_question_len: int = 128
    gsp_output_len: int = 256


def build_dataset(spec: DatasetSpec, tok: BenchTokenizer) -> tuple[list[DatasetRow], np.random.RandomState]:
    """The rows, and the numpy generator where bench_serving draws its Poisson gaps from."""
    if spec.name == "random-ids":
        return _random_ids(spec, tok)
    rng = np.random.RandomState(spec.seed)
    py = random.Random(spec.seed)
    if spec.name == "random":
        return _random_text(spec, tok, rng, py), rng
    if spec.name == "sharegpt":
        return _sharegpt(spec, tok, py), rng
    if spec.name == "generated-shared-prefix":
        return _shared_prefix(spec, tok, rng, py), rng
    raise DatasetError(f"unknown dataset {spec.name!r}; choose from {', '.join(DATASETS)}")


def _random_lens(rng: np.random.RandomState, full: int, ratio: float, n: int) -> list[int]:
    return [int(x) for x in rng.randint(max(int(full * ratio), 1), full + 1, size=n)]


def _random_ids(spec: DatasetSpec, tok: BenchTokenizer) -> tuple[list[DatasetRow], np.random.RandomState]:
    workload = WorkloadSpec(
        num_prompts=spec.num_prompts, input_len=spec.input_len, output_len=spec.output_len,
        range_ratio=spec.range_ratio, seed=spec.seed, vocab_size=tok.vocab_size,
    )  # fmt: skip
    try:
        reqs, rng = build_workload(workload)
    except ValueError as e:
        raise DatasetError(str(e)) from None
    special = 0 if spec.tokenize_prompt else tok.num_special_tokens_to_add()
    rows = []
    for r in reqs:
        length = max(0, r.prompt_len - special)  # the server adds the special tokens back
        ids = dataclasses.replace(r, prompt_len=length).prompt(tok.vocab_size)
        rows.append(DatasetRow(ids if spec.tokenize_prompt else tok.decode(ids), length, r.output_len))
    return rows, rng


def corpus_texts() -> list[str]:
    """The shipped corpus: original prose written for kvadmit (public domain), one prompt a paragraph."""
    text = resources.files("kvadmit.bench").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def _read_sharegpt(path: str) -> list[tuple[str, str]]:
    """(first turn, second turn) of every conversation with at least two turns."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise DatasetError(f"cannot read --dataset-path {path!r}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise DatasetError(f"--dataset-path {path!r} is not JSON: {e}") from None
    if not isinstance(data, list):
        raise DatasetError(f"--dataset-path {path!r} must hold a JSON list of conversations (ShareGPT)")
    pairs = []
    for item in data:
        turns: Any = item.get("conversations", item.get("conversation", [])) if isinstance(item, dict) else []
        if isinstance(turns, list) and len(turns) >= 2:
            try:
                pairs.append((str(turns[0]["value"]), str(turns[1]["value"])))
            except (KeyError, TypeError):
                raise DatasetError(f"{path!r}: each turn needs a 'value' (ShareGPT format)") from None
    if not pairs:
        raise DatasetError(f"{path!r} holds no conversation with two turns")
    return pairs


def _random_text(
    spec: DatasetSpec, tok: BenchTokenizer, rng: np.random.RandomState, py: random.Random
) -> list[DatasetRow]:
    _check_lengths(spec)
    input_lens = _random_lens(rng, spec.input_len, spec.range_ratio, spec.num_prompts)
    output_lens = _random_lens(rng, spec.output_len, spec.range_ratio, spec.num_prompts)
    special = tok.num_special_tokens_to_add()
    input_lens = [max(0, n - special) for n in input_lens]
    texts = [p for p, _ in _read_sharegpt(spec.dataset_path)] if spec.dataset_path else corpus_texts()
    py.shuffle(texts)
    encoded = [ids for ids in (tok.encode(t) for t in texts) if ids]
    if not encoded:
        raise DatasetError("the prompt texts encode to no tokens")
    rows = []
    for i in range(spec.num_prompts):
        ids = encoded[i % len(encoded)]  # a small corpus is cycled (bench_serving stops at its end)
        want = input_lens[i]
        reps = -(-want // len(ids))
        rows.append(DatasetRow(tok.decode((ids * reps)[:want]), want, output_lens[i]))
    return rows


def _sharegpt(spec: DatasetSpec, tok: BenchTokenizer, py: random.Random) -> list[DatasetRow]:
    if not spec.dataset_path:
        raise DatasetError("--dataset-name sharegpt needs --dataset-path (a local ShareGPT JSON file)")
    if spec.sharegpt_output_len is not None and spec.sharegpt_output_len < 4:
        raise DatasetError("--sharegpt-output-len must be at least 4")
    pairs = _read_sharegpt(spec.dataset_path)
    py.shuffle(pairs)
    rows: list[DatasetRow] = []
    for prompt, reply in pairs:
        if len(rows) == spec.num_prompts:
            break
        prompt_len = len(tok.encode(prompt))
        output_len = spec.sharegpt_output_len or len(tok.encode(reply))
        if prompt_len < 2 or output_len < 2:
            continue
        if spec.sharegpt_context_len and prompt_len + output_len > spec.sharegpt_context_len:
            continue
        rows.append(DatasetRow(prompt, prompt_len, output_len))
    return rows


def _shared_prefix(
    spec: DatasetSpec, tok: BenchTokenizer, rng: np.random.RandomState, py: random.Random
) -> list[DatasetRow]:
    groups, per_group = spec.gsp_num_groups, spec.gsp_prompts_per_group
    if min(groups, per_group, spec.gsp_system_prompt_len, spec.gsp_question_len, spec.gsp_output_len) <= 0:
        raise DatasetError("the --gsp-* counts and lengths must be positive")
    # bench_serving draws these with a range ratio of 1, so the lengths are exact (the draws still happen).
    system_lens = _random_lens(rng, spec.gsp_system_prompt_len, 1.0, groups)
    question_lens = _random_lens(rng, spec.gsp_question_len, 1.0, groups * per_group)
    output_lens = _random_lens(rng, spec.gsp_output_len, 1.0, groups * per_group)
    vocab = tok.vocab_ids()

    def random_text(n: int) -> str:
        return tok.decode(py.choices(vocab, k=n))

    systems = [random_text(n) for n in system_lens]
    questions = [random_text(n) for n in question_lens]
    rows = []
    for g in range(groups):
        for p in range(per_group):
            k = g * per_group + p
            prompt = f"{systems[g]}\n\n{questions[k]}"
            rows.append(DatasetRow(prompt, len(tok.encode(prompt)), output_lens[k]))
    py.shuffle(rows)
    return rows


def _check_lengths(spec: DatasetSpec) -> None:
    if spec.num_prompts <= 0:
        raise DatasetError(f"--num-prompts must be positive, got {spec.num_prompts}")
    if spec.input_len <= 0 or spec.output_len <= 0:
        raise DatasetError("--random-input-len and --random-output-len must be positive")
    if not 0.0 <= spec.range_ratio <= 1.0:
        raise DatasetError(f"--random-range-ratio must be within [0, 1], got {spec.range_ratio}")
