"""The tokenizer the benchmark builds prompts with and re-counts outputs with.

Found as bench_serving finds it: `--tokenizer`, else the server's /model_info `tokenizer_path`, else
`--model`. `byte-level` (what `kvadmit serve --simulate` reports without --tokenizer-path) needs no files;
anything else is loaded with transformers' AutoTokenizer, imported only then.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from kvadmit.model.byte_tokenizer import VOCAB_SIZE, ByteTokenizer

BYTE_LEVEL = "byte-level"


class BenchTokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def num_special_tokens_to_add(self) -> int: ...
    def vocab_ids(self) -> list[int]: ...


class TokenizerError(Exception):
    """No tokenizer could be loaded: the message says what was tried."""


class _Bytes:
    name = BYTE_LEVEL
    vocab_size = VOCAB_SIZE

    def __init__(self) -> None:
        self._tok = ByteTokenizer()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def num_special_tokens_to_add(self) -> int:
        return 0

    def vocab_ids(self) -> list[int]:
        return list(range(VOCAB_SIZE))


class _HF:
    """A transformers tokenizer, used as bench_serving uses it (decode keeps special tokens)."""

    def __init__(self, name: str, tok: Any) -> None:
        self.name = name
        self._tok = tok
        self.vocab_size = int(tok.vocab_size)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))

    def num_special_tokens_to_add(self) -> int:
        return int(self._tok.num_special_tokens_to_add())

    def vocab_ids(self) -> list[int]:
        return list(self._tok.get_vocab().values())


def load_tokenizer(name: str) -> BenchTokenizer:
    if name == BYTE_LEVEL:
        return _Bytes()
    try:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        if name.endswith(".json") and os.path.isfile(name):
            tok = PreTrainedTokenizerFast(tokenizer_file=name)
        else:
            tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # a missing folder, an offline hub name, a broken file: one line says which
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TokenizerError(f"cannot load the tokenizer {name!r}: {first}") from None
    return _HF(name, tok)


def choose_tokenizer(explicit: str | None, server_path: str | None, model: str | None) -> str | None:
    """bench_serving's order: --tokenizer, the server's tokenizer_path (when usable here), --model."""
    if explicit:
        return explicit
    if server_path and (server_path == BYTE_LEVEL or os.path.exists(server_path)):
        return server_path
    return model
