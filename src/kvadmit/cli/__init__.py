"""`kvadmit <command>`: the command line, one module per command. Each command's flags use SGLang's names;
bad input gives one line naming the problem and exit status 2, never a traceback.

Building the parser imports no torch: a command's heavy imports happen inside its runner."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from kvadmit import __version__, native
from kvadmit.cli import (
    bench,
    calibrate,
    capacity,
    cost_model,
    doctor,
    generate,
    profile,
    serve,
    simulate,
    sweep,
)
from kvadmit.cli.flags import server_args_from
from kvadmit.cli.sglang_config import expand_config
from kvadmit.errors import UsageError

__all__ = ["EXIT_USAGE", "build_parser", "main", "server_args_from"]

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


class _Version(argparse.Action):
    """--version: one unwrapped line (argparse's own action wraps it to the terminal's width)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> NoReturn:
        print(f"kvadmit {__version__}: {native.status()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvadmit", description="Why LLM serving requests wait: SGLang's admission, exactly."
    )
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="the version, and whether the compiled core (make fast) is active",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    # in the order `kvadmit --help` lists them
    commands = (capacity, simulate, generate, serve, doctor, bench, calibrate, profile, cost_model, sweep)
    for command in commands:
        command.add_parser(sub)
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:  # SGLang's --config FILE: the file's flags first, the command line's after
        try:
            args = ["serve", *expand_config(args[1:], _subparser(parser, "serve"))]
        except UsageError as e:
            print(f"kvadmit serve: error: {e}", file=sys.stderr)
            return EXIT_USAGE
    ns = parser.parse_args(args)
    try:
        return int(ns.func(ns))
    except UsageError as e:
        print(f"kvadmit {ns.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0
