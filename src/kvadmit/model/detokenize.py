"""Incremental detokenization for streaming: text deltas that never split a multi-byte character.

Decoding a growing id list one token at a time is wrong for byte-level tokenizers: a character can span
tokens, and a token's text can depend on its neighbours (leading spaces). So each step decodes a short
window that starts a few tokens back (`prefix_offset`) and emits only what the new tokens added beyond the
text already sent (`read_offset`); while the tail is an incomplete character (U+FFFD), it waits.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT = "\ufffd"
WINDOW = 5  # tokens of context kept before the unread part


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: Decoder, prompt_ids: list[int] | None = None, skip_special_tokens: bool = True
    ):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = list(prompt_ids or [])[-WINDOW:]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # everything emitted so far (outputs only)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def add(self, token_ids: list[int]) -> str:
        """Add new output tokens; return the text they complete (possibly empty)."""
        self.ids.extend(token_ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith(REPLACEMENT):
            return ""  # nothing new yet, or a character still incomplete
        delta = full[len(prefix) :]
        self.prefix_offset = max(self.read_offset, len(self.ids) - WINDOW)
        self.read_offset = len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end: whatever is left, incomplete characters included (as U+FFFD)."""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        delta = full[len(prefix) :] if full.startswith(prefix) else ""
        self.read_offset = len(self.ids)
        self.text += delta
        return delta
