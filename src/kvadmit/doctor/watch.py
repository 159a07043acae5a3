"""`--watch URL --for SECONDS`: scrape a live server's /metrics at the start, every few seconds, and at the
end, so counters give rates and gauges a timeline."""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from kvadmit.doctor.prom import Scrape, parse_text
from kvadmit.doctor.source import DoctorInputError

MAX_BYTES = 32 * 1024 * 1024


def metrics_url(url: str) -> str:
    """`host:port` or `http://host:port` becomes `http://host:port/metrics`; a given path is kept."""
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise DoctorInputError(f"--watch needs an http(s) URL like http://localhost:30000, got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)


def fetch(url: str, timeout: float = 10.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body: bytes = resp.read(MAX_BYTES)
    except urllib.error.HTTPError as e:
        raise DoctorInputError(f"cannot scrape {url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise DoctorInputError(f"cannot scrape {url}: {reason}") from None
    return body.decode("utf-8", errors="replace")


def watch(
    url: str,
    seconds: float,
    every: float = 5.0,
    get: Callable[[str], str] = fetch,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Scrape]:
    """Scrapes at 0, every `every` seconds, and at `seconds`; each stamped with its time since the start."""
    if not seconds > 0:
        raise DoctorInputError(f"--for must be a positive number of seconds, got {seconds:g}")
    target = metrics_url(url)
    start = clock()
    scrapes: list[Scrape] = []
    n = 0
    while True:
        now = clock() - start
        text = get(target)
        scrape = parse_text(text, f"{target} @ {now:.0f} s")
        scrape.t = now
        if n == 0 and not scrape.samples:
            raise DoctorInputError(
                f"{target} answered, but with no Prometheus metrics (is the server started with "
                "--enable-metrics?)"
            )
        scrapes.append(scrape)
        n += 1
        if now >= seconds:
            return scrapes
        next_at = min(n * every, seconds)
        sleep(max(next_at - (clock() - start), 0.0))
