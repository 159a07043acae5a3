"""A token's raw bytes, for OpenAI's logprobs: byte-level BPE vocabularies (GPT-2's, Llama 3's, Qwen's,
SmolLM's) spell each byte as one printable character, GPT-2's `bytes_to_unicode` table; reading a token's
piece back through that table gives its bytes, even when the token holds only part of a multi-byte
character and its decoded text is U+FFFD. Other vocabularies (SentencePiece's `▁` pieces) have no such
spelling: None, and the caller falls back to the text's UTF-8."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _byte_of_char() -> dict[str, int]:
    # GPT-2's table: the printable Latin-1 bytes stand for themselves; the other 68 bytes, in order,
    # take the characters from U+0100 on.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def raw_bytes(tokenizer: Any, token_id: int) -> list[int] | None:
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if convert is None:
        return None
    try:
        piece = convert(token_id)
    except Exception:  # an id the tokenizer does not know
        return None
    table = _byte_of_char()
    if not isinstance(piece, str) or not piece or any(ch not in table for ch in piece):
        return None
    return [table[ch] for ch in piece]


def token_bytes(tokenizer: Any, token_id: int, text: str) -> list[int]:
    """Chat logprobs' `bytes`: the raw bytes where the vocabulary spells them, else the text's UTF-8."""
    raw = raw_bytes(tokenizer, token_id)
    return raw if raw is not None else list(text.encode("utf-8"))


def lossless_text(tokenizer: Any, token_id: int, text: str) -> str:
    """Completions logprobs' token text: the decoded text, but a token holding part of a character (whose
    text is U+FFFD and whose bytes are not UTF-8) is spelled one Latin-1 character per byte, so distinct
    fragments stay distinct (SGLang 0.5.22's rule)."""
    if "\ufffd" not in text:
        return text
    raw = raw_bytes(tokenizer, token_id)
    if raw is None:
        return text
    try:
        bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return bytes(raw).decode("latin-1")
    return text  # a whole character that is U+FFFD itself
