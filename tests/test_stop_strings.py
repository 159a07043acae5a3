"""Stop strings (kvadmit/stop_strings.py), the one rule set of the server and the offline engine, on a
hand-made tokenizer whose tokens are known pieces of text."""

from __future__ import annotations

from kvadmit.server.session import TextAssembler
from kvadmit.stop_strings import StopStringWatch, cut_at_stop, first_stop_in, shown_length

PIECES = ["he", "llo ", "wor", "ld", "xy", "ab", "cd"]
HE, LLO, WOR, LD, XY, AB, CD = range(len(PIECES))


class Pieces:
    """Token i is PIECES[i]; a text is its pieces joined."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(PIECES[i] for i in ids)


def watch_tokens(stops: list[str], ids: list[int]) -> list[str | None]:
    watch = StopStringWatch(Pieces(), stops)
    return [watch.add(i) for i in ids]


def test_a_stop_string_split_across_two_tokens_stops_at_the_second() -> None:
    # "hello " then "hello wor": "o w" spans the end of token 1 and the start of token 2
    assert watch_tokens(["o w"], [HE, LLO, WOR, LD]) == [None, None, "o w", "o w"]


def test_no_match_never_stops_and_cuts_nothing() -> None:
    assert watch_tokens(["stop", "zz"], [HE, LLO, WOR, LD]) == [None, None, None, None]
    assert cut_at_stop("hello world", None) == "hello world"
    assert cut_at_stop("hello world", 7) == "hello world"  # a stop token id cuts no text
    assert cut_at_stop("hello world", "zz") == "hello world"  # not in the text: nothing to cut


def test_of_several_stop_strings_the_first_listed_is_reported() -> None:
    # token "xy" brings both at once: "y" is listed first, though "x" comes first in the text
    assert watch_tokens(["y", "x"], [XY]) == ["y"]
    assert first_stop_in("xy", ["y", "x"]) == "y"
    assert first_stop_in("xy", ["q", "x", "y"]) == "x"
    assert first_stop_in("xy", []) is None


def test_the_text_is_cut_before_the_first_occurrence_of_the_matched_stop() -> None:
    assert cut_at_stop("hello world", "o") == "hell"  # "o" occurs at 4 and 7
    assert cut_at_stop("hello world", "hello") == ""


def test_the_shown_text_holds_back_the_longest_stop_minus_one() -> None:
    assert shown_length("hello wo", ["world"]) == 4  # 8 characters, 4 held back
    assert shown_length("hello wo", ["world", "o"]) == 4  # the longest sets the hold; "o" is at 4 too
    assert shown_length("abc", []) == 3  # no stop strings: everything shows
    assert shown_length("abcSTOPdef", ["STOP"]) == 3  # never from a stop string on
    assert shown_length("ab", ["xyz"]) == 0


def test_a_stream_never_shows_part_of_the_stop_string_it_cuts() -> None:
    text = TextAssembler(Pieces(), ["o w"], skip_special_tokens=True)
    assert text.add([HE]) == ""  # "he": 2 characters, both held back (the stop is 3 long)
    assert text.add([LLO]) == "hell"  # "hello ": the last two held back
    assert text.add([WOR]) == ""  # "hello wor": the stop string starts at 4, all shown already
    assert text.finish("o w") == ("hell", "")


def test_a_stream_that_ends_without_a_stop_releases_the_held_back_tail() -> None:
    text = TextAssembler(Pieces(), ["xyz"], skip_special_tokens=True)
    assert text.add([AB]) == ""
    assert text.add([CD]) == "ab"
    assert text.finish(None) == ("abcd", "cd")
