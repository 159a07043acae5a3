"""Where a simulated request stops when it may stop early (no ignore_eos): `serve --simulate-output-len`.

A request's output length L is the number of tokens it generates, its end-of-sequence token included:
what `usage.completion_tokens` (SGLang's `meta_info.completion_tokens`) reports when it stops there. Its
visible text is the L − 1 tokens before the EOS. A length past max_new_tokens means the request ends by
length instead, with max_new_tokens visible tokens.

    uniform               L uniform in [2, max_new_tokens] (the default)
    fixed:F               L = F × max_new_tokens, rounded half up (F ≥ 0; F > 1 runs to max_new_tokens)
    lognormal:MEAN,SIGMA  L = a lognormal draw of mean MEAN tokens and log-space deviation SIGMA, rounded
    trace:FILE            L from a file, cycled in arrival order: one integer a line, or JSON lines with
                          true_output_len or output_len (what `serve --trace-requests` writes)

Every draw is at least 2 (one visible token before the EOS), so no answer is a lone EOS with empty
content unless asked for: `fixed:0` gives L = 1 for every request, and a trace's 1s are kept.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

LEAST = 2  # one visible token, then the end-of-sequence token
KINDS = ("uniform", "fixed:F", "lognormal:MEAN,SIGMA", "trace:FILE")


class OutputLengthError(ValueError):
    """A --simulate-output-len value that cannot be used; its message is one line for the user."""


@dataclass
class OutputLengths:
    kind: str  # uniform, fixed, lognormal or trace
    fraction: float = 0.0  # fixed
    mean: float = 0.0  # lognormal: the mean in tokens
    sigma: float = 0.0  # lognormal: the deviation of its logarithm
    lengths: tuple[int, ...] = ()  # trace
    source: str = ""  # trace: the file
    _drawn: int = 0  # trace: how many lengths were handed out

    def draw(self, max_new_tokens: int, rng: random.Random) -> int:
        """One request's output length L (EOS included; ≥ 1, and ≥ 2 unless asked)."""
        if self.kind == "uniform":
            return rng.randint(LEAST, max_new_tokens) if max_new_tokens >= LEAST else LEAST
        if self.kind == "fixed":
            if self.fraction == 0:
                return 1  # asked for: a lone end-of-sequence token
            return max(LEAST, _round_half_up(self.fraction * max_new_tokens))
        if self.kind == "lognormal":
            # A lognormal's mean is exp(mu + sigma²/2), so this mu gives the mean asked for
            mu = math.log(self.mean) - self.sigma**2 / 2
            return max(LEAST, _round_half_up(rng.lognormvariate(mu, self.sigma)))
        length = self.lengths[self._drawn % len(self.lengths)]
        self._drawn += 1
        return length

    def describe(self) -> str:
        """The distribution in words, for the start-up log."""
        if self.kind == "uniform":
            text = "uniform from 2 to max_new_tokens"
        elif self.kind == "fixed":
            text = "fixed: a lone end-of-sequence token" if self.fraction == 0 else (
                f"fixed: {self.fraction:g} × max_new_tokens, rounded, at least 2"
            )  # fmt: skip
        elif self.kind == "lognormal":
            text = f"lognormal with mean {self.mean:g} tokens and sigma {self.sigma:g}, rounded, at least 2"
        else:
            text = f"trace: {len(self.lengths)} lengths from {self.source}, cycled in arrival order"
        return (
            f"Simulated output lengths (requests without ignore_eos; end-of-sequence token included): {text}"
        )


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def parse_output_lengths(spec: str) -> OutputLengths:
    """The distribution a --simulate-output-len value names; OutputLengthError with one line if bad."""
    kind, _, arg = spec.partition(":")
    if kind == "uniform" and not arg:
        return OutputLengths("uniform")
    if kind == "fixed" and arg:
        fraction = _number(arg, spec)
        if fraction < 0:
            raise OutputLengthError(f"--simulate-output-len {spec}: the fraction must be ≥ 0")
        return OutputLengths("fixed", fraction=fraction)
    if kind == "lognormal" and arg.count(",") == 1:
        mean, sigma = (_number(x, spec) for x in arg.split(","))
        if not (mean >= 1 and sigma > 0):
            raise OutputLengthError(f"--simulate-output-len {spec}: the mean must be ≥ 1 token and sigma > 0")
        return OutputLengths("lognormal", mean=mean, sigma=sigma)
    if kind == "trace" and arg:
        return OutputLengths("trace", lengths=_read_trace(arg), source=arg)
    raise OutputLengthError(f"--simulate-output-len {spec!r}: expected one of {', '.join(KINDS)}")


def _number(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise OutputLengthError(f"--simulate-output-len {spec}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise OutputLengthError(f"--simulate-output-len {spec}: {text!r} is not a finite number")
    return value


def _read_trace(path: str) -> tuple[int, ...]:
    try:
        with open(path, encoding="utf-8") as f:
            rows = [(n, line.strip()) for n, line in enumerate(f, 1) if line.strip()]
    except OSError as e:
        raise OutputLengthError(f"--simulate-output-len trace:{path}: cannot read it ({e.strerror})") from e
    lengths = tuple(x for n, text in rows if (x := _trace_length(text, f"{path}:{n}")) is not None)
    if not lengths:
        raise OutputLengthError(f"--simulate-output-len trace:{path}: the file lists no lengths")
    return lengths


def _trace_length(text: str, where: str) -> int | None:
    """The line's length; None for a JSON line of a request that generated nothing (aborted early)."""
    value: object = text
    if text.startswith("{"):
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            raise OutputLengthError(f"--simulate-output-len trace:{where}: not a JSON line") from None
        if not isinstance(row, dict):
            raise OutputLengthError(f"--simulate-output-len trace:{where}: not a JSON object")
        value = next((row[k] for k in ("true_output_len", "output_len") if row.get(k)), None)
        if value is None:
            return None
    try:
        length = int(str(value))
    except ValueError:
        raise OutputLengthError(f"--simulate-output-len trace:{where}: {value!r} is not an integer") from None
    if length < 1:
        raise OutputLengthError(f"--simulate-output-len trace:{where}: lengths must be ≥ 1, got {length}")
    return length
