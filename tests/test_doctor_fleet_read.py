"""How a log of several DP ranks is dealt out (doctor/fleet_read.py): the DP tag from the text before
the message in every prefix SGLang prints; timestamped lines without one go to every rank, lines with
neither follow the line before them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvadmit.doctor.fleet_read import dp_tag, split_log


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[2026-01-01 00:00:03 DP1] Decode batch, #running-req: 1", ("DP1", True)),
        ("[2025-06-12 11:41:56 DP0 TP0] Prefill batch, #new-seq: 1", ("DP0", True)),
        (
            "2025-10-20 03:02:22 INFO 31223 [DP3 TP3 EP3 scheduler_metrics_mixin.py:222] Decode batch.",
            ("DP3", True),
        ),
        ("[2025-06-12 11:41:56 ATTN_DP2 TP2] Decode batch", ("ATTN_DP2", True)),
        ("[2025-06-12 11:41:56 TP0] Decode batch, #running-req: 1", ("", True)),
        ("[2026-01-01 00:00:00] server_args=ServerArgs(dp_size=4, note='DP5] x')", ("", True)),
        ("Traceback (most recent call last):", ("", False)),
        ('  File "scheduler.py", line 1, in run', ("", False)),
    ],
)
def test_the_dp_tag_of_each_prefix(line: str, expected: tuple[str, bool]) -> None:
    assert dp_tag(line) == expected


def test_lines_are_dealt_to_ranks_with_the_whole_servers_lines_to_every_rank(tmp_path: Path) -> None:
    log = tmp_path / "dp.log"
    log.write_text(
        "[2026-01-01 00:00:00] server_args=ServerArgs(dp_size=2)\n"  # 1: every rank
        "[2026-01-01 00:00:01 DP0 TP0] Decode batch, #running-req: 1, #token: 10, token usage: 0.01, "
        "cuda graph: False, gen throughput (token/s): 1.00, #queue-req: 0\n"  # 2: DP0
        "[2026-01-01 00:00:01 DP1 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"  # 3
        '  File "scheduler.py", line 1, in event_loop\n'  # 4: follows DP1
        "ValueError: boom\n"  # 5: follows DP1
        "[2026-01-01 00:00:02 DP1 TP0] Decode batch, #running-req: 2, #token: 20, token usage: 0.02, "
        "cuda graph: False, gen throughput (token/s): 2.00, #queue-req: 0\n",  # 6: DP1
        encoding="utf-8",
    )
    streams, notes = split_log(str(log))
    assert [s.tag for s in streams] == ["DP0", "DP1"]
    assert [s.collected.lines for s in streams] == [2, 5]  # DP0: 1, 2; DP1: 1, 3, 4, 5, 6
    assert [s.dp_args for s in streams] == [{"dp_size": "2"}, {"dp_size": "2"}]
    assert notes == ["1 line without a DP tag was read by every rank"]


def test_a_log_without_dp_tags_is_one_stream_named_after_it(tmp_path: Path) -> None:
    log = tmp_path / "one.log"
    log.write_text("[2026-01-01 00:00:00] Decode batch, #running-req: 1, #token: 10, token usage: 0.01, "
                   "cuda graph: False, gen throughput (token/s): 1.00, #queue-req: 0\n" * 3)  # fmt: skip
    streams, notes = split_log(str(log))
    assert [(s.tag, s.collected.lines) for s in streams] == [("", 3)] and notes == []
