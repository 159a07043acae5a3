"""A long prefill batch computed in passes of at most PASS_TOKENS new tokens (executor/prefill_passes.py):
the split itself, and the real model's greedy text through it."""

from __future__ import annotations

import pytest

from kvadmit.executor.prefill_passes import PASS_TOKENS, Piece, split_passes


def test_requests_that_fit_share_one_pass() -> None:
    assert split_passes([(0, 3), (5, 9)], limit=7) == [[Piece(0, 0, 3, True), Piece(1, 5, 9, True)]]


def test_a_request_spreads_over_consecutive_passes_and_only_its_last_piece_ends_it() -> None:
    # 10 + 5 new tokens in passes of 4: [0,4) | [4,8) | [8,10) + 2 of the second | its other 3
    assert split_passes([(0, 10), (20, 25)], limit=4) == [
        [Piece(0, 0, 4, False)],
        [Piece(0, 4, 8, False)],
        [Piece(0, 8, 10, True), Piece(1, 20, 22, False)],
        [Piece(1, 22, 25, True)],
    ]


def test_a_request_that_fills_a_pass_exactly_ends_in_it() -> None:
    assert split_passes([(0, 4), (0, 1)], limit=4) == [[Piece(0, 0, 4, True)], [Piece(1, 0, 1, True)]]


def test_the_default_pass_and_a_bad_limit() -> None:
    assert PASS_TOKENS == 512
    assert [len(p) for p in split_passes([(0, 2048)])] == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="at least one token"):
        split_passes([(0, 1)], limit=0)
