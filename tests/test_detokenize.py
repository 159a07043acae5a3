"""Streaming text: deltas add up to the full decode and never split a multi-byte character."""

from __future__ import annotations

import pytest

from kvadmit.model.detokenize import IncrementalDetokenizer

tokenizers = pytest.importorskip("tokenizers")

CORPUS = ["héllo wörld, ça va? 日本語のテキスト 🙂 emoji and plain ascii words"] * 20


@pytest.fixture(scope="module")
def byte_bpe() -> object:
    """A real byte-level BPE tokenizer trained here on a tiny corpus (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    return tok


TEXT = "ça va? 日本語 🙂 wörld"


def test_deltas_add_up_to_the_text_and_hold_back_incomplete_characters(byte_bpe: object) -> None:
    ids = byte_bpe.encode(TEXT).ids  # type: ignore[attr-defined]
    assert len(ids) > len(TEXT.split())  # multi-byte characters span several byte-level tokens
    detok = IncrementalDetokenizer(byte_bpe)  # type: ignore[arg-type]
    deltas = [detok.add([i]) for i in ids]
    assert "".join(deltas) + detok.flush() == TEXT
    assert all("\ufffd" not in d for d in deltas)
    assert any(d == "" for d in deltas)  # it waited at least once for a character to complete


def test_a_prompt_gives_context_without_being_emitted(byte_bpe: object) -> None:
    prompt = byte_bpe.encode("héllo ").ids  # type: ignore[attr-defined]
    ids = byte_bpe.encode("héllo wörld").ids[len(prompt) :]  # type: ignore[attr-defined]
    detok = IncrementalDetokenizer(byte_bpe, prompt_ids=prompt)  # type: ignore[arg-type]
    out = "".join(detok.add([i]) for i in ids) + detok.flush()
    assert out == byte_bpe.decode(ids)  # type: ignore[attr-defined]
