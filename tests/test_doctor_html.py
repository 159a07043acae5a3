"""`kvadmit doctor --html`: the page opens in headless Chromium with no console errors and no request
beyond itself, and its screenshot shows the charts.

Chromium is Debian's `chromium` (.ci/run installs it when missing). Where it is absent these tests fail
under CI (KVADMIT_REQUIRE_CHROMIUM=1 or CI set) and skip, saying why, on a developer's machine."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from chromium import colours, decode_png, find_chromium, open_page
from kvadmit.cli import main
from kvadmit.doctor.diagnose import Inputs, diagnose
from kvadmit.doctor.html import COLOURS, MARKER_COLOURS, render_html

LOGS = Path(__file__).parent / "data" / "logs"
BURST = LOGS / "04-sglang-q2-qwen3-4b-retraction-burst.log"


@pytest.fixture(scope="module")
def browser() -> str:
    path = find_chromium()
    if path is None:
        why = "chromium is not installed (apt-get install -y chromium)"
        if os.environ.get("KVADMIT_REQUIRE_CHROMIUM") or os.environ.get("CI"):
            pytest.fail(why + "; CI requires it")
        pytest.skip(why)
    return path


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


def test_the_page_is_self_contained() -> None:
    page = render_html(diagnose(Inputs(log=str(BURST))))
    assert "<script" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "@import" not in page and "url(" not in page
    assert page.count("<svg") == 3 and "<polyline" in page


def test_the_report_opens_without_errors_and_shows_the_charts(
    browser: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "report.html"
    assert main(["doctor", str(BURST), "--html", str(page)]) == 0
    capsys.readouterr()
    result = open_page(browser, page.as_uri())
    assert result.errors == []
    assert result.requests == [page.as_uri()]  # nothing fetched from anywhere else
    width, _, rows = decode_png(result.png)
    seen = colours(width, rows, len(rows[0]) // width)
    sampled = sum(seen.values())
    white = seen.get((255, 255, 255), 0)
    assert len(seen) > 50 and white < 0.95 * sampled, "the screenshot is (nearly) blank"
    # The charts are drawn: the series line colour and the retraction markers' colour are on screen.
    assert seen.get(rgb(COLOURS[0]), 0) > 100
    assert seen.get(rgb(MARKER_COLOURS["retract"]), 0) > 100
    (tmp_path / "report.png").write_bytes(result.png)


def test_a_page_without_a_timeline_opens_too(browser: str, tmp_path: Path) -> None:
    page = tmp_path / "oom.html"
    page.write_text(
        render_html(diagnose(Inputs(log=str(LOGS / "14-sglang-14948-no-space-left-for-one-request.log"))))
    )
    assert open_page(browser, page.as_uri()).errors == []


def test_the_error_check_itself_catches_errors(browser: str, tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text('<p>x</p><script>console.error("boom"); missing();</script><img src="gone.png">')
    errors = open_page(browser, page.as_uri()).errors
    assert any("boom" in e for e in errors)
    assert any("exception" in e for e in errors)
    assert any("Failed to load resource" in e for e in errors)


def test_a_fleet_page_opens_without_errors_and_shows_each_replicas_charts(
    browser: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Real log 20: four data-parallel ranks (DP2–DP5) of one PD decode server, in SGLang's own tags.
    page = tmp_path / "fleet.html"
    assert main(["doctor", "--fleet", str(LOGS / "20-sglang-11854-h20-pd-decode-healthy.log"),
                 "--html", str(page)]) == 0  # fmt: skip
    capsys.readouterr()
    html = page.read_text(encoding="utf-8")
    assert "Fleet verdict:" in html and html.count("<h2>DP") == 4
    result = open_page(browser, page.as_uri())
    assert result.errors == []
    assert result.requests == [page.as_uri()]  # nothing fetched from anywhere else
    width, _, rows = decode_png(result.png)
    seen = colours(width, rows, len(rows[0]) // width)
    assert len(seen) > 50 and seen.get((255, 255, 255), 0) < 0.95 * sum(seen.values()), "blank page"
    # The screenshot is the first screen: the verdict and the table, then the top of DP2's charts.
    assert seen.get(rgb(COLOURS[0]), 0) > 20  # a replica's series line is drawn
