"""Stop strings, one set of rules for the server and the offline engine.

* A request stops at the first token after which one of its stop strings appears anywhere in the text
  decoded so far; the stop string reported is the first of the request's list that appears (list order,
  not position in the text).
* The answer's text is cut just before the first occurrence of the matched stop string.
* While streaming, the text shown holds back the last (longest stop string - 1) characters, and never
  shows anything from the first occurrence of a stop string on: a streamed text never shows part of a
  stop string that is cut later.
"""

from __future__ import annotations

from kvadmit.model.detokenize import Decoder, IncrementalDetokenizer


class StopStringWatch:
    """One request's stop strings, checked as each output token arrives (the scheduler's stop_checker)."""

    def __init__(self, tokenizer: Decoder, stops: list[str]) -> None:
        self.stops = stops
        self.detok = IncrementalDetokenizer(tokenizer)

    def add(self, token_id: int) -> str | None:
        """Take the request's newest output token; the stop string now in the text, if any."""
        self.detok.add([token_id])
        return first_stop_in(self.detok.text, self.stops)


def first_stop_in(text: str, stops: list[str]) -> str | None:
    """The first of `stops` (in list order) that occurs in text."""
    for stop in stops:
        if stop in text:
            return stop
    return None


def cut_at_stop(text: str, matched: int | str | None) -> str:
    """The text before the first occurrence of the matched stop string (a stop token id cuts nothing)."""
    if isinstance(matched, str) and matched in text:
        return text[: text.find(matched)]
    return text


def shown_length(text: str, stops: list[str]) -> int:
    """How much of a streaming text may be shown now: all but the last (longest stop - 1) characters, and
    nothing from the first occurrence of any stop string on. Never more than len(text); may be negative
    (nothing to show yet)."""
    hold = max((len(s) for s in stops), default=1) - 1
    safe = len(text) - hold
    for stop in stops:
        at = text.find(stop)
        if at != -1:
            safe = min(safe, at)
    return safe
