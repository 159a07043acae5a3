"""`kvadmit serve --config FILE`: SGLang's config file, a mapping of flag name → value (YAML, or JSON).

As SGLang does, the file becomes command-line arguments placed before the ones given, so that a flag
given on the command line overrides the file (argparse keeps the last value): a key is a flag name
without its dashes (`max-running-requests` or `max_running_requests`); true turns a store_true flag on
and false leaves it off; a list gives the flag its items; a mapping is passed as JSON; anything else as
its text.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from kvadmit.errors import UsageError

CONFIG_FLAG = "--config"


def _config_path(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """The file --config names, and argv without it."""
    paths: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == CONFIG_FLAG:
            if i + 1 >= len(argv):
                raise UsageError("--config: no file given")
            paths.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith(CONFIG_FLAG + "="):
            paths.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    if len(paths) > 1:
        raise UsageError("--config given more than once: only one config file is allowed")
    return (paths[0] if paths else None), rest


def _read_config(path: str) -> dict[str, object]:
    suffix = Path(path).suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise UsageError(f"--config {path}: must be a YAML (.yaml, .yml) or JSON (.json) file")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--config {path}: cannot read it: {e.strerror}") from None
    try:
        if suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # each parser has its own error class; any of them means the same here
        raise UsageError(
            f"--config {path}: not valid {suffix[1:].upper()}: {str(e).splitlines()[0]}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: must hold a mapping of flag: value at its top level")
    return data


def _as_arguments(config: dict[str, object], parser: argparse.ArgumentParser, path: str) -> list[str]:
    actions = {name: a for a in parser._actions for name in a.option_strings}
    args: list[str] = []
    for key, value in config.items():
        flag = "--" + str(key).replace("_", "-")
        action = actions.get(flag)
        if action is None or flag in (CONFIG_FLAG, "--help"):
            raise UsageError(f"--config {path}: {key!r} is not a flag of kvadmit serve")
        if isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
            if not isinstance(value, bool):
                raise UsageError(f"--config {path}: {key} takes true or false, got {value!r}")
            if value:
                args.append(flag)
            elif isinstance(action, argparse.BooleanOptionalAction):
                args.append("--no-" + flag[2:])
        elif isinstance(value, bool):
            args += [flag, str(value).lower()]
        elif isinstance(value, list):
            if value:
                args += [flag, *(str(item) for item in value)]
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


def expand_config(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """argv with --config FILE replaced by the file's flags, placed first so that argv overrides them."""
    path, rest = _config_path(argv)
    if path is None:
        return list(argv)
    return _as_arguments(_read_config(path), parser, path) + rest
