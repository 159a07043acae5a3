"""`kvadmit serve` takes every launch flag of SGLang 0.5.22, so that a `python -m sglang.launch_server`
line runs as it is: the flags kvadmit implements keep their own definitions (SGLang's aliases and choices
added), every other flag parses as SGLang parses it, and after parsing each is either accepted with no
effect (named once in the start-up log) or refused with one line (sglang_treatment.py says which)."""

from __future__ import annotations

import argparse

from kvadmit.cli.sglang_flags import SGLANG_FLAGS_VERSION, SglangFlag, parse_kwargs, sglang_flags
from kvadmit.cli.sglang_no_effect import NO_EFFECT
from kvadmit.cli.sglang_treatment import REFUSED, UNMODELLED_SCHEDULE_POLICIES
from kvadmit.config import SCHEDULE_POLICIES
from kvadmit.errors import UsageError

# The namespace attribute of a flag kvadmit only parses: prefixed, so that none can clash with a kvadmit
# dest. Its default is SUPPRESS: the attribute exists only when the flag was given.
COMPAT_PREFIX = "sglang__"
_NO_EFFECT = frozenset(NO_EFFECT)


def _option_actions(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {name: a for a in p._actions for name in a.option_strings}


def _alias_kwargs(base: argparse.Action) -> dict[str, object]:
    """Keyword arguments for another name of an existing flag (e.g. SGLang's --model for --model-path)."""
    if isinstance(base, argparse._StoreTrueAction):
        return {"action": "store_true"}
    return {"type": base.type, "choices": base.choices, "nargs": base.nargs}


def add_sglang_flags(p: argparse.ArgumentParser) -> None:
    """Every SGLang launch flag `p` (the serve parser, its own flags already added) does not define yet."""
    existing = _option_actions(p)
    # SGLang's full list: the ones kvadmit does not model are refused after parsing, with the reason
    existing["--schedule-policy"].choices = SCHEDULE_POLICIES + UNMODELLED_SCHEDULE_POLICIES
    g = p.add_argument_group(
        f"SGLang {SGLANG_FLAGS_VERSION}'s other launch flags",
        "All of them parse, so that a `python -m sglang.launch_server` line runs as it is. One that would "
        "change decisions kvadmit does not model (parallelism, speculative decoding, disaggregation, "
        "hybrid pools, mixed chunks, ...) is refused with one line; the others have no effect "
        "here, and the start-up log names those given.",
    )
    g.add_argument(
        "--config",
        metavar="FILE",
        help="a YAML (or JSON) file of flag: value, as SGLang's --config; flags on the command line "
        "override it",
    )
    existing = _option_actions(p)
    for flag in sglang_flags():
        missing = [n for n in flag.names if n not in existing]
        if not missing:
            continue
        present = [n for n in flag.names if n in existing]
        if present:  # an alias of a flag kvadmit has
            base = existing[present[0]]
            kwargs = _alias_kwargs(base)
            g.add_argument(
                *missing, dest=base.dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs
            )  # type: ignore[arg-type]
            continue
        g.add_argument(
            *flag.names,
            dest=COMPAT_PREFIX + flag.dest,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
            **parse_kwargs(flag),  # type: ignore[arg-type]
        )


def _shown(value: object) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def _refusal(flag: SglangFlag, value: object) -> str | None:
    refusal = REFUSED.get(flag.dest)
    if refusal is None or value in refusal.allowed:
        return None
    given = flag.name if value is True else f"{flag.name} {_shown(value)}"
    return f"{given}: {refusal.reason}"


def check_sglang_flags(ns: argparse.Namespace) -> list[str]:
    """Refuse what kvadmit does not model (UsageError, one line); otherwise the start-up log's notes about
    SGLang's flags: those given that have no effect here, and the event loop kvadmit runs."""
    if ns.schedule_policy == "priority":
        raise UsageError(
            "--schedule-policy priority: SGLang 0.5.22's parser takes it but its scheduler stops with "
            '"Unknown schedule_policy"; priority scheduling is --enable-priority-scheduling (fcfs or lof)'
        )
    if ns.schedule_policy in UNMODELLED_SCHEDULE_POLICIES:
        raise UsageError(
            f"--schedule-policy {ns.schedule_policy}: kvadmit models SGLang's "
            + ", ".join(SCHEDULE_POLICIES)
            + f"; {ns.schedule_policy} is not modelled"
        )
    no_effect: list[str] = []
    for flag in sglang_flags():
        key = COMPAT_PREFIX + flag.dest
        if not hasattr(ns, key):
            continue
        value = getattr(ns, key)
        refused = _refusal(flag, value)
        if refused is not None:
            raise UsageError(refused)
        if flag.dest in REFUSED or flag.dest in _NO_EFFECT:
            no_effect.append(flag.name)
    notes = []
    if no_effect:
        notes.append("accepted, no effect here: " + ", ".join(no_effect))
    return notes
