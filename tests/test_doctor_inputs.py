"""What the doctor reads besides clean logs: garbage, empty, binary, archives, truncated and compressed
files, other encodings. Each gives one clear line and exit status 2, or a diagnosis with a note; never a
traceback."""

from __future__ import annotations

import bz2
import gzip
import lzma
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvadmit.cli import main
from kvadmit.doctor.diagnose import Inputs, diagnose

LOGS = Path(__file__).parent / "data" / "logs"
BURST = LOGS / "04-sglang-q2-qwen3-4b-retraction-burst.log"


def doctor(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["doctor", *args])
    out, err = capsys.readouterr()
    return code, out, err


def refused(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = doctor([str(path)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvadmit doctor: error: "), err
    assert "Traceback" not in err
    return err


def test_an_empty_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.log").write_bytes(b"")
    assert "is empty" in refused(tmp_path / "empty.log", capsys)


def test_binary_data_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = bytes((i * 97 + 13) % 256 for i in range(20_000))  # every byte value, NULs included
    (tmp_path / "core.bin").write_bytes(data)
    assert "binary" in refused(tmp_path / "core.bin", capsys)


def test_an_archive_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with zipfile.ZipFile(tmp_path / "logs.zip", "w") as z:
        z.write(BURST, BURST.name)
    assert "zip archive" in refused(tmp_path / "logs.zip", capsys)


def test_text_that_is_no_server_log_is_refused_with_an_example(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("dear diary\nthe GPU was warm today\n", encoding="utf-8")
    err = refused(tmp_path / "notes.txt", capsys)
    assert "no SGLang or vLLM log lines" in err and "dear diary" in err


def test_a_missing_file_and_a_directory_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "No such file" in refused(tmp_path / "nope.log", capsys)
    assert "directory" in refused(tmp_path, capsys)


def test_a_truncated_log_is_diagnosed_with_a_note(tmp_path: Path) -> None:
    cut = BURST.read_bytes()[:3000]  # ends inside a line
    (tmp_path / "cut.log").write_bytes(cut)
    d = diagnose(Inputs(log=str(tmp_path / "cut.log")))
    assert any("incomplete" in n for n in d.inputs[0].notes)
    assert d.inputs[0].lines == cut.count(b"\n") + 1


@pytest.mark.parametrize("opener", [gzip.compress, bz2.compress, lzma.compress])
def test_compressed_logs_read_like_plain_ones(tmp_path: Path, opener: object) -> None:
    path = tmp_path / "burst.log.z"
    path.write_bytes(opener(BURST.read_bytes()))  # type: ignore[operator]
    assert diagnose(Inputs(log=str(path))).verdict == "retraction-storm"


def test_a_truncated_gzip_gives_what_came_before_the_cut(tmp_path: Path) -> None:
    whole = gzip.compress(BURST.read_bytes())
    (tmp_path / "cut.log.gz").write_bytes(whole[: len(whole) * 2 // 3])
    d = diagnose(Inputs(log=str(tmp_path / "cut.log.gz")))
    assert 0 < d.inputs[0].lines < BURST.read_text().count("\n")
    assert any("ends early" in n for n in d.inputs[0].notes)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-8-sig"])
def test_other_unicode_encodings_are_decoded(tmp_path: Path, encoding: str) -> None:
    path = tmp_path / "burst.log"
    path.write_bytes(BURST.read_text(encoding="utf-8").encode(encoding))
    d = diagnose(Inputs(log=str(path)))
    assert d.verdict == "retraction-storm" and d.lead.numbers["events"] == 16


def test_invalid_utf8_lines_are_read_as_cp1252_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "mixed.log"
    path.write_bytes(BURST.read_bytes() + "caf\xe9 au lait\n".encode("latin-1"))
    d = diagnose(Inputs(log=str(path)))
    assert d.verdict == "retraction-storm"
    assert any("not valid UTF-8" in n for n in d.inputs[0].notes)
    assert d.inputs[0].unknown_examples[-1].text == "café au lait"


def test_one_enormous_line_is_cut_not_held(tmp_path: Path) -> None:
    path = tmp_path / "one.log"
    path.write_bytes(b"x" * 3_000_000 + b"\n" + BURST.read_bytes())
    d = diagnose(Inputs(log=str(path)))
    assert d.verdict == "retraction-storm"
    assert any("64 KiB" in n for n in d.inputs[0].notes)


def test_the_cli_prints_one_line_and_no_traceback_as_a_real_process(tmp_path: Path) -> None:
    (tmp_path / "random.bin").write_bytes(bytes(range(256)) * 100)
    out = subprocess.run(
        [sys.executable, "-m", "kvadmit", "doctor", str(tmp_path / "random.bin")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().startswith("kvadmit doctor: error:") and "Traceback" not in out.stderr


def test_flags_that_need_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--watch", "localhost:1"], ["--for", "5"], [], ["--metrics", "x", "--interval", "0"]):
        code, _, err = doctor(args, capsys)
        assert code == 2 and err.count("\n") == 1, (args, err)


def test_log_from_standard_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    class Stdin:
        buffer = io.BytesIO(BURST.read_bytes())

    monkeypatch.setattr(sys, "stdin", Stdin)
    code, out, _ = doctor(["-"], capsys)
    assert code == 0 and "Verdict: retraction-storm" in out and "standard input" in out


@pytest.mark.parametrize("block", [1, 3, 7, 64])
def test_lines_survive_any_block_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    from kvadmit.doctor import source

    monkeypatch.setattr(source, "BLOCK", block)
    monkeypatch.setattr(source, "MAX_LINE", 40)
    text = "first\n\nnaïve — ünïcode ✓\r\nprogress 1\rprogress 2\n" + "y" * 100 + "\nafter the long one\nlast"
    path = tmp_path / "b.log"
    path.write_bytes(text.encode("utf-8"))
    src = source.LogSource(str(path))
    got = list(src.lines())
    assert got == [
        (1, "first"),
        (2, ""),
        (3, "naïve — ünïcode ✓"),
        (4, "progress 1"),
        (4, "progress 2"),
        (5, "y" * 40),
        (6, "after the long one"),
        (7, "last"),
    ]
    assert src.stats.long_lines == 1 and src.stats.ends_without_newline
