"""capacity/token_run.py: a run of synthetic token ids answers every read the scheduler makes of a waiting
request's tokens as the list of those ids would, without holding them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvadmit.capacity.token_run import TokenRun


def test_a_run_reads_as_its_ids() -> None:
    run = TokenRun(10, 5)  # 10, 11, 12, 13, 14
    assert len(run) == 5 and list(run) == [10, 11, 12, 13, 14]
    assert run[0] == 10 and run[4] == 14 and run[-1] == 14 and run[-5] == 10
    assert run[1:3] == [11, 12] and isinstance(run[1:3], list)
    assert run[3:] == [13, 14] and run[:0] == [] and run[::2] == [10, 12, 14]
    assert 12 in run and 15 not in run and 9 not in run
    with pytest.raises(IndexError):
        run[5]
    with pytest.raises(IndexError):
        run[-6]


def test_a_run_equals_the_list_of_its_ids_and_nothing_else() -> None:
    assert TokenRun(3, 2) == [3, 4] and [3, 4] == TokenRun(3, 2) and TokenRun(3, 2) == (3, 4)  # noqa: SIM300
    assert TokenRun(3, 2) != [3, 5] and TokenRun(3, 2) != [3] and TokenRun(3, 2) != [3, 4, 5]
    assert TokenRun(3, 2) == TokenRun(3, 2) and TokenRun(3, 2) != TokenRun(4, 2)
    assert TokenRun(3, 0) == [] and TokenRun(3, 0) == TokenRun(9, 0)
    assert TokenRun(3, 2) != "34" and TokenRun(3, 2) != 3


def test_a_prompt_and_the_outputs_that_continue_it_are_one_run() -> None:
    # 10**9 + 10**9 ids: a run again, never a list (the snapshot's waiting requests are built this way)
    whole = TokenRun(1 << 40, 10**9) + TokenRun((1 << 40) + 10**9, 10**9)
    assert isinstance(whole, TokenRun) and (whole.start, whole.n) == (1 << 40, 2 * 10**9)
    # (the scheduler's fill_ids is prompt + outputs: concatenation is what is tested here)
    assert TokenRun(5, 3) + TokenRun(99, 0) == [5, 6, 7]
    assert isinstance(TokenRun(5, 3) + [], TokenRun)  # noqa: RUF005
    assert isinstance([] + TokenRun(5, 3), TokenRun)  # noqa: RUF005


def test_runs_that_do_not_continue_each_other_concatenate_as_lists() -> None:
    assert TokenRun(5, 2) + TokenRun(9, 2) == [5, 6, 9, 10]
    assert TokenRun(5, 2) + [1, 2] == [5, 6, 1, 2]  # noqa: RUF005
    assert [1, 2] + TokenRun(5, 2) == [1, 2, 5, 6]  # noqa: RUF005
    with pytest.raises(TypeError):
        TokenRun(5, 2) + 1  # type: ignore[operator]


@given(
    st.integers(-(2**41), 2**41),
    st.integers(0, 40),
    st.integers(-45, 45) | st.none(),
    st.integers(-45, 45) | st.none(),
    st.sampled_from([None, 1, 2, 3, -1, -2]),
)
def test_every_slice_and_index_is_the_lists(
    start: int, n: int, a: int | None, b: int | None, step: int | None
) -> None:
    ids = list(range(start, start + n))
    run = TokenRun(start, n)
    assert run[a:b:step] == ids[a:b:step]
    for i in (a, b):
        if i is not None and -n <= i < n:
            assert run[i] == ids[i]
