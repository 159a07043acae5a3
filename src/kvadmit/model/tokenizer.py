"""The model's tokenizer for serving: `tokenizers`' Tokenizer read from the folder's tokenizer.json, its
chat template rendered with jinja2, without importing transformers into the serving process.

transformers' tokenizer of the default model held ~60 MB more than this one after loading and peaked ~85
MB higher while loading (measured on this machine's Python 3.11, transformers 5.24, tokenizers 0.23), a
large part of a small model's server. Its fast tokenizer does no more than tokenizer.json says for the
tokenizer classes in PLAIN_CLASSES, so this one is used only for those, when the folder has tokenizer.json
and asks for no clean-up of spaces when decoding; any other folder gets transformers' AutoTokenizer.
tests/test_tokenizer.py checks encoding, decoding and the chat template against transformers'.

The chat template sees what transformers gives it: the messages, add_generation_prompt, tools and
documents (None here), the special tokens by name (bos_token, eos_token, unk_token, pad_token); in a
sandboxed jinja2 environment that trims blocks, with loop controls, `raise_exception`, `strftime_now` and a
`tojson` filter that does not escape HTML.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def load_tokenizer(path: str) -> Any:
    """The tokenizer in folder `path` (PlainTokenizer where it applies), else transformers' AutoTokenizer
    (also for a hub name)."""
    plain = PlainTokenizer.from_folder(Path(path))
    if plain is not None:
        return plain
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class PlainTokenizer:
    """encode / decode / convert_ids_to_tokens / apply_chat_template / eos_token_id, as transformers'
    fast tokenizer answers them for the classes this is used for."""

    def __init__(self, tokenizer: Any, special: dict[str, str], chat_template: str | None) -> None:
        self._tok = tokenizer
        self.special = special  # name → token text, the names of SPECIAL_NAMES that are set
        self.chat_template = chat_template
        self.eos_token_id = self._id(special.get("eos_token"))
        self.bos_token_id = self._id(special.get("bos_token"))
        self._template: Any = None

    @classmethod
    def from_folder(cls, folder: Path) -> PlainTokenizer | None:
        """None unless the folder holds a tokenizer this class reproduces (see the module's docstring)."""
        tok_file, cfg_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
        if not (tok_file.is_file() and cfg_file.is_file()):
            return None
        try:
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if cfg.get("tokenizer_class") not in PLAIN_CLASSES or cfg.get("clean_up_tokenization_spaces"):
            return None
        from tokenizers import Tokenizer

        special = {name: text for name in SPECIAL_NAMES if (text := _token_text(cfg.get(name))) is not None}
        template = cfg.get("chat_template")
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():  # (transformers prefers the separate file)
            template = jinja.read_text(encoding="utf-8")
        return cls(
            Tokenizer.from_file(str(tok_file)), special, template if isinstance(template, str) else None
        )

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = self.encode(text, add_special_tokens)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def decode(self, ids: list[int] | int, skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode([ids] if isinstance(ids, int) else list(ids), skip_special_tokens))

    def convert_ids_to_tokens(self, ids: int | list[int]) -> str | list[str | None] | None:
        if isinstance(ids, int):
            return self._tok.id_to_token(ids)
        return [self._tok.id_to_token(i) for i in ids]

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = False, tokenize: bool = True
    ) -> str | list[int]:
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if self._template is None:
            self._template = _compile(self.chat_template)
        text = self._template.render(
            messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
            **self.special,
        )  # fmt: skip
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _compile(template: str) -> Any:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
