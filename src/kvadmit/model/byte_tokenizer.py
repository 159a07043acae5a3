"""The tokenizer of `serve --simulate` when no --tokenizer-path is given: one token per UTF-8 byte.

Ids 0–255 are the bytes; 256 is the end-of-sequence token. No download, no vocabulary file, and token
counts a client can check by hand (a prompt of n ASCII characters is n tokens).
"""

from __future__ import annotations

EOS_ID = 256
VOCAB_SIZE = 257


class ByteTokenizer:
    eos_token_id = EOS_ID
    vocab_size = VOCAB_SIZE
    name_or_path = "byte-level"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        data = bytes(i for i in ids if 0 <= i < 256)
        text = data.decode("utf-8", errors="replace")
        if not skip_special_tokens and EOS_ID in ids:
            text += "</s>"
        return text

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True, tokenize: bool = False
    ) -> str:
        """A plain template: each message as `<|role|>` and its content on the next line."""
        parts = [f"<|{m['role']}|>\n{m['content']}\n" for m in messages]
        if add_generation_prompt:
            parts.append("<|assistant|>\n")
        return "".join(parts)
