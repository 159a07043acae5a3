"""The prompts `kvadmit bench` builds and the bodies it sends, checked against bench_serving's rules
(docs/sglang-rules.md §7): lengths from numpy's legacy generator, ignore_eos where each backend expects it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvadmit.bench.backends import PayloadOptions, build_payload
from kvadmit.bench.datasets import DatasetError, DatasetSpec, build_dataset, corpus_texts
from kvadmit.bench.tokenizer import load_tokenizer
from kvadmit.bench.workload import WorkloadSpec, build_workload

BYTES = load_tokenizer("byte-level")


class OneSpecialToken:
    """A byte tokenizer whose encode adds a BOS (id 1), as many HF tokenizers do."""

    name = "with-bos"
    vocab_size = 100

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def num_special_tokens_to_add(self) -> int:
        return 1

    def vocab_ids(self) -> list[int]:
        return list(range(self.vocab_size))


def test_random_ids_draws_input_then_output_lengths_then_offsets_from_the_seed() -> None:
    rows, rng = build_dataset(
        DatasetSpec("random-ids", num_prompts=5, input_len=40, output_len=20, range_ratio=0.5, seed=7,
                    tokenize_prompt=True), BYTES,
    )  # fmt: skip
    ref = np.random.RandomState(7)
    ins = ref.randint(20, 41, size=5)  # randint(max(int(40 × 0.5), 1), 40 + 1)
    outs = ref.randint(10, 21, size=5)
    offsets = ref.randint(0, 257, size=5)  # the byte tokenizer's vocabulary: 257 ids
    assert [r.prompt_len for r in rows] == ins.tolist()
    assert [r.output_len for r in rows] == outs.tolist()
    for i, r in enumerate(rows):
        assert r.prompt == [int((offsets[i] + i + j) % 257) for j in range(ins[i])]
    assert rng.random_sample() == ref.random_sample()  # handed on where the Poisson gaps are drawn


def test_random_ids_sends_what_kvadmit_simulate_simulates_for_the_same_seed() -> None:
    rows, _ = build_dataset(DatasetSpec("random-ids", num_prompts=20, input_len=64, output_len=32,
                                        range_ratio=0.25, seed=3, tokenize_prompt=True), BYTES)  # fmt: skip
    sims, _ = build_workload(WorkloadSpec(num_prompts=20, input_len=64, output_len=32, range_ratio=0.25,
                                          seed=3, vocab_size=257))  # fmt: skip
    assert [(r.prompt_len, r.output_len, r.prompt) for r in rows] == [
        (s.prompt_len, s.output_len, s.prompt(257)) for s in sims
    ]


def test_random_ids_as_text_leaves_room_for_the_special_tokens_the_server_adds() -> None:
    spec = DatasetSpec("random-ids", num_prompts=3, input_len=10, output_len=4, range_ratio=1.0, seed=1)
    rows, _ = build_dataset(spec, OneSpecialToken())
    offsets = np.random.RandomState(1)
    offsets.randint(10, 11, size=3)
    offsets.randint(4, 5, size=3)
    off = offsets.randint(0, 100, size=3)
    assert [r.prompt_len for r in rows] == [9, 9, 9]  # 10 − 1 special token
    assert rows[2].prompt == "".join(chr((off[2] + 2 + j) % 100) for j in range(9))


def test_random_text_repeats_or_cuts_the_corpus_to_each_drawn_length() -> None:
    spec = DatasetSpec("random", num_prompts=30, input_len=300, output_len=8, range_ratio=0.1, seed=5)
    rows, _ = build_dataset(spec, BYTES)
    ref = np.random.RandomState(5)
    assert [r.prompt_len for r in rows] == ref.randint(30, 301, size=30).tolist()
    corpus = corpus_texts()
    assert len(corpus) >= 20
    for r in rows:
        assert isinstance(r.prompt, str)
        assert len(BYTES.encode(r.prompt)) == r.prompt_len  # ASCII text: one byte token per character
        assert any(t.startswith(r.prompt[:30]) for t in corpus)  # each starts at a paragraph's start


def test_sharegpt_takes_first_turns_drops_short_ones_and_may_fix_the_output_length(tmp_path: Path) -> None:
    data = [
        {"conversations": [{"from": "human", "value": "What is a lighthouse for?"},
                           {"from": "gpt", "value": "Warning ships."}]},
        {"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "too short a prompt"}]},
        {"conversations": [{"from": "human", "value": "only one turn"}]},
        {"conversation": [{"from": "human", "value": "Name a river."},
                          {"from": "gpt", "value": "The Nile."}]},
    ]  # fmt: skip
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    rows, _ = build_dataset(DatasetSpec("sharegpt", num_prompts=10, dataset_path=str(path)), BYTES)
    assert sorted((r.prompt, r.prompt_len, r.output_len) for r in rows) == [
        ("Name a river.", 13, 9),
        ("What is a lighthouse for?", 25, 14),
    ]
    rows, _ = build_dataset(DatasetSpec("sharegpt", num_prompts=1, dataset_path=str(path),
                                        sharegpt_output_len=50), BYTES)  # fmt: skip
    assert len(rows) == 1 and rows[0].output_len == 50
    with pytest.raises(DatasetError, match="needs --dataset-path"):
        build_dataset(DatasetSpec("sharegpt"), BYTES)


def test_generated_shared_prefix_groups_share_their_system_prompt() -> None:
    spec = DatasetSpec("generated-shared-prefix", gsp_num_groups=3, gsp_prompts_per_group=4,
                       gsp_system_prompt_len=50, gsp_question_len=10, gsp_output_len=7)  # fmt: skip
    rows, _ = build_dataset(spec, load_tokenizer("byte-level"))
    assert len(rows) == 12 and {r.output_len for r in rows} == {7}
    prefixes = {str(r.prompt).split("\n\n")[0] for r in rows}
    assert len(prefixes) <= 3  # (a random system prompt could itself hold a blank line)
    for r in rows:
        assert r.prompt_len == len(BYTES.encode(str(r.prompt)))


OPTS = PayloadOptions(model="m")


def test_native_puts_ignore_eos_in_sampling_params() -> None:
    assert build_payload("native", [5, 6], 9, OPTS) == {
        "input_ids": [5, 6],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 9, "ignore_eos": True},
        "stream": True,
        "return_logprob": False,
        "logprob_start_len": -1,
    }
    off = build_payload("native", "hi", 9, PayloadOptions("m", stream=False, ignore_eos=False))
    assert off["text"] == "hi" and off["sampling_params"]["ignore_eos"] is False and off["stream"] is False


def test_openai_styles_put_ignore_eos_at_the_top_and_ask_for_usage() -> None:
    assert build_payload("completions", "hi", 9, OPTS) == {
        "model": "m", "prompt": "hi", "best_of": 1, "max_tokens": 9, "stream": True, "temperature": 0.0,
        "ignore_eos": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    assert build_payload("chat", "hi", 9, OPTS) == {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9,
        "stream": True, "temperature": 0.0, "ignore_eos": True, "stream_options": {"include_usage": True},
    }  # fmt: skip


def test_the_extra_request_body_is_merged_last() -> None:
    opts = PayloadOptions("m", extra={"temperature": 0.7, "top_p": 0.9})
    body = build_payload("completions", "hi", 9, opts)
    assert (body["temperature"], body["top_p"]) == (0.7, 0.9)
