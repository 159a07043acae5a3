"""The measured decode table a profile writes (costmodel.DecodeTable): each expected step time below is
worked out by hand from the reading rule (linear between grid points, the nearest segment's line
outside, slopes beyond the grid never falling), never read back from the code."""

from __future__ import annotations

import json
import re

import pytest

from kvadmit.costmodel.costmodel import CostModel, CostModelError, DecodeCost, DecodeTable

# batch sizes 1, 2, 4 × 100 and 300 tokens of context per request
TABLE = DecodeTable((1, 2, 4), (100, 300), ((10.0, 14.0), (20.0, 24.0), (24.0, 32.0)))


def ms(batch: int, context: int, table: DecodeTable = TABLE) -> float:
    return table.step_ms(batch, batch * context)


def test_grid_points_are_the_measured_times() -> None:
    assert ms(1, 100) == 10.0
    assert ms(2, 300) == 24.0
    assert ms(4, 300) == 32.0


def test_between_points_the_reading_is_linear_in_batch_and_context() -> None:
    assert ms(3, 100) == 22.0  # halfway from 20 (2 requests) to 24 (4 requests)
    assert ms(1, 200) == 12.0  # halfway from 10 to 14
    assert ms(3, 200) == 25.0  # 2 requests at 200: 22; 4 at 200: 28; halfway: 25
    # K / B is the context per request: 3 requests holding 150, 250 and 200 tokens read as 3 × 200.
    assert TABLE.step_ms(3, 600) == 25.0


def test_outside_the_grid_the_nearest_segment_goes_on() -> None:
    assert ms(1, 500) == 18.0  # 10 + (14 − 10) / 200 × 400
    assert ms(1, 50) == 10.0  # below the first context length, its column: never cheaper than measured
    assert ms(3, 0) == 22.0
    assert ms(8, 100) == 32.0  # past 4 requests the 2→4 line: 24 + (24 − 20) / 2 × 4
    assert ms(8, 300) == 48.0  # 32 + (32 − 24) / 2 × 4


def test_a_falling_last_pair_does_not_make_bigger_batches_cheaper() -> None:
    falling = DecodeTable((1, 2), (100,), ((30.0,), (20.0,)))
    assert falling.step_ms(2, 200) == 20.0
    assert falling.step_ms(5, 500) == 20.0  # the slope past the grid is floored at 0
    assert DecodeTable((2, 4), (100,), ((30.0,), (20.0,))).step_ms(3, 300) == 25.0  # inside: as measured


def test_below_the_smallest_batch_size_its_row_is_used() -> None:
    table = DecodeTable((2, 4), (100,), ((20.0,), (24.0,)))
    assert table.step_ms(1, 100) == 20.0


def test_one_context_length_means_the_context_does_not_matter() -> None:
    table = DecodeTable((1, 4), (128,), ((10.0,), (16.0,)))
    cost = DecodeCost(table=table)
    assert not cost.needs_kv_tokens
    assert cost.seconds(2, 0) == pytest.approx(0.012)  # 10 + 6 / 3 × 1 ms
    assert DecodeCost(table=TABLE).needs_kv_tokens


def test_the_table_wins_over_the_coefficients_and_round_trips_through_json() -> None:
    model = CostModel(DecodeCost(base_ms=99.0, per_request_ms=1.0, table=TABLE))
    assert model.decode.seconds(3, 600) == pytest.approx(0.025)
    again = CostModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again == model and again.decode.table == TABLE


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"batch_sizes": [2, 1], "context_lens": [10], "ms": [[1], [2]]}, "batch_sizes must list positive"),
        ({"batch_sizes": [1], "context_lens": [0], "ms": [[1]]}, "context_lens must list positive"),
        ({"batch_sizes": [1, 2], "context_lens": [10], "ms": [[1]]}, "one row per batch size (2)"),
        ({"batch_sizes": [1], "context_lens": [10, 20], "ms": [[1]]}, "ms[0] must be 2 step times"),
        ({"batch_sizes": [1], "context_lens": [10], "ms": [[0]]}, "ms[0] must be 1 step times in ms > 0"),
        ({"batch_sizes": [1], "context_lens": [10]}, 'an object with "batch_sizes"'),
    ],
)
def test_a_bad_table_is_refused_with_what_is_allowed(table: dict, message: str) -> None:
    with pytest.raises(CostModelError, match=re.escape(message)):
        CostModel.from_dict({"decode": {"table": table}})
