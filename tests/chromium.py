"""Headless Chromium for tests: open a page, collect console errors, take a screenshot.

Talks the DevTools protocol over `--remote-debugging-pipe` (NUL-separated JSON on file descriptors 3 and
4), so no websocket library is needed. Errors are every console.error/assert call, every uncaught
exception, and every browser log entry at error level (a resource that failed to load, for instance).
Also a small PNG decoder (zlib only) to check that a screenshot shows something.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import struct
import subprocess
import time
import zlib
from dataclasses import dataclass, field
from typing import Any


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)
    png: bytes = b""
    requests: list[str] = field(default_factory=list)  # every URL the page asked for


class _Pipe:
    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int, read_fd: int) -> None:
        self.proc = proc
        self.write_fd = write_fd
        self.read_fd = read_fd
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.write_fd, json.dumps(msg).encode() + b"\0")
        return self.next_id

    def _read_one(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self.read_fd], [], [], left)
            if ready:
                chunk = os.read(self.read_fd, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self.buffer += chunk
        raw, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(raw)  # type: ignore[no-any-return]

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        wanted = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_one(deadline)
            if msg.get("id") == wanted:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})  # type: ignore[no-any-return]
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_one(deadline)
            if msg.get("method") == method:
                return msg
            self.events.append(msg)

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read_one(deadline))
        except TimeoutError:
            pass


def open_page(browser: str, url: str, width: int = 1100, height: int = 1500) -> PageResult:
    """Load `url` in a fresh headless browser; return its errors and a full-page screenshot."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()

    def wire() -> None:  # in the child: the pipe ends become fds 3 and 4
        os.dup2(to_child_r, 3)
        os.dup2(from_child_w, 4)

    args = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--remote-debugging-pipe",
        "--no-first-run",
        "--disable-extensions",
        "--hide-scrollbars",
        "about:blank",
    ]
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=wire,
        pass_fds=(3, 4),
    )
    os.close(to_child_r)
    os.close(from_child_w)
    pipe = _Pipe(proc, to_child_w, from_child_r)
    result = PageResult()
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime.enable", "Log.enable", "Page.enable", "Network.enable"):
            pipe.call(domain, session=session)
        pipe.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        pipe.call("Page.navigate", {"url": url}, session)
        pipe.wait_event("Page.loadEventFired")
        pipe.drain(0.5)
        shot = pipe.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session)
        result.png = base64.b64decode(shot["data"])
        pipe.drain(0.2)
    finally:
        with contextlib.suppress(OSError):
            pipe.send("Browser.close")
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(to_child_w)
        os.close(from_child_r)
    for ev in pipe.events:
        method, params = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            result.errors.append(
                "console: " + " ".join(str(a.get("value", a)) for a in params.get("args", []))
            )
        elif method == "Runtime.exceptionThrown":
            result.errors.append("exception: " + str(params.get("exceptionDetails", {}).get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            result.errors.append("log: " + str(params["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            result.requests.append(str(params.get("request", {}).get("url")))
    return result


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = colour = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and colour in (2, 6), "unsupported PNG layout"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    i = 0
    for _ in range(height):
        f = raw[i]
        line = bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pred) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def colours(width: int, rows: list[bytes], bpp: int, step: int = 3) -> dict[tuple[int, int, int], int]:
    """How many sampled pixels have each RGB colour."""
    out: dict[tuple[int, int, int], int] = {}
    for row in rows[::step]:
        for x in range(0, width * bpp, bpp * step):
            key = (row[x], row[x + 1], row[x + 2])
            out[key] = out.get(key, 0) + 1
    return out
