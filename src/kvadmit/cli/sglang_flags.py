"""SGLang's launch flags as data: every flag of `python -m sglang.launch_server`, from SGLang 0.5.22.

sglang_flags_0_5_22.json holds one row per flag: its names (the first is the main one, the rest are
aliases), its argparse dest, how it parses (`action`: store, store_true or boolean_optional, where the
last also takes --no-NAME; `value`: int, float, str, json or human_int, the last an integer with an
optional SI or IEC suffix such as 4k or 2Ki; `nargs`; `choices`) and its default.

How the list was made, and how to refresh it for another release: crosscheck/sglang_flags/extract.py
builds the parser SGLang 0.5.22 builds (`ServerArgs.add_cli_args`, from the wheel of
`pip download --no-deps sglang==0.5.22`, its heavy imports stubbed) and writes every action of it; its
docstring has the commands. Then classify each new flag in sglang_treatment.py or sglang_no_effect.py
(tests/test_sglang_flags.py fails until every flag is in exactly one table).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from importlib import resources

SGLANG_FLAGS_VERSION = "0.5.22"
_DATA_FILE = "sglang_flags_0_5_22.json"


@dataclass(frozen=True)
class SglangFlag:
    names: tuple[str, ...]
    dest: str
    action: str  # "store", "store_true" or "boolean_optional"
    value: str | None  # how a stored value parses: a key of VALUE_PARSERS (None without a value)
    nargs: str | None  # None (one value), "?", "*" or "+"
    choices: tuple[object, ...] | None
    default: object

    @property
    def name(self) -> str:
        return self.names[0]


@cache
def sglang_flags() -> tuple[SglangFlag, ...]:
    """SGLang's launch flags, in the order its parser defines them."""
    text = resources.files("kvadmit.cli").joinpath(_DATA_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    assert data["sglang_version"] == SGLANG_FLAGS_VERSION, data["sglang_version"]
    return tuple(
        SglangFlag(
            names=tuple(row["names"]),
            dest=row["dest"],
            action=row["action"],
            value=row["value"],
            nargs=row["nargs"],
            choices=None if row["choices"] is None else tuple(row["choices"]),
            default=row["default"],
        )
        for row in data["flags"]
    )


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")


def human_readable_int(text: str) -> int:
    """An integer, or one with a case-sensitive suffix as SGLang's token counts take: 4k = 4000,
    25.6k = 25600 (decimals with SI suffixes only), 4Ki = 4096."""
    value = text.strip()
    match = _SUFFIXED.fullmatch(value)
    try:
        if match is None:
            return int(value)
        number, suffix = match.groups()
        if suffix in _IEC:
            return int(number) * _IEC[suffix]  # int() rejects a decimal here, as SGLang does
        return int(Decimal(number) * _SI[suffix])
    except (ValueError, InvalidOperation):
        # the words argparse uses for a plain int flag, so existing messages stay the same
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


def json_value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"invalid JSON value: {text!r}") from None


VALUE_PARSERS: dict[str, Callable[[str], object]] = {
    "int": int,
    "float": float,
    "str": str,
    "json": json_value,
    "human_int": human_readable_int,
}


def parse_kwargs(flag: SglangFlag) -> dict[str, object]:
    """argparse keyword arguments that parse the flag's values as SGLang's parser does."""
    if flag.action == "store_true":
        return {"action": "store_true"}
    if flag.action == "boolean_optional":
        return {"action": argparse.BooleanOptionalAction}
    kwargs: dict[str, object] = {"type": VALUE_PARSERS[flag.value or "str"]}
    if flag.nargs is not None:
        kwargs["nargs"] = flag.nargs
    if flag.choices is not None:
        kwargs["choices"] = flag.choices
    return kwargs
