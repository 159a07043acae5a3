"""Opening what the doctor reads: a log file (plain, gzip, bz2 or xz; UTF-8, UTF-16 or a legacy 8-bit
encoding) or standard input, streamed line by line in blocks, so a 1 GB log takes constant memory.

Anything that is not a readable text log (missing, a directory, empty, binary, an archive) raises
`DoctorInputError` with one sentence saying so; a damaged stream (a truncated gzip) ends the lines early
and is reported in `ReadStats`, never as a traceback.
"""

from __future__ import annotations

import bz2
import codecs
import lzma
import os
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

BLOCK = 1 << 20  # bytes read at a time
MAX_LINE = 64 * 1024  # longer lines are cut here (the rest is skipped, still one line)
SNIFF = 64 * 1024


class DoctorInputError(Exception):
    """The input cannot be diagnosed; the message says why in one sentence."""


@dataclass
class ReadStats:
    """What reading the input met besides lines: re-decoded bytes, cut lines, an early end."""

    encoding: str = "utf-8"
    compression: str = ""
    undecodable_lines: int = 0  # lines that were not valid UTF-8 (read as cp1252/latin-1 instead)
    long_lines: int = 0
    truncated: str = ""  # why the stream ended early, if it did
    ends_without_newline: bool = False
    bytes_read: int = 0


_ARCHIVES = {
    b"PK\x03\x04": "a zip archive",
    b"\x28\xb5\x2f\xfd": "a zstd-compressed file",
    b"%PDF": "a PDF document",
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"\x7fELF": "an executable (ELF)",
    b"SQLite format 3": "an SQLite database",
}


def _open_raw(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    if os.path.isdir(path):
        raise DoctorInputError(f"{path!r} is a directory; give a log file")
    try:
        return open(path, "rb")
    except OSError as e:
        raise DoctorInputError(f"cannot read {path!r}: {e.strerror or e}") from None


class _Peekable:
    """A binary stream whose first bytes can be looked at before reading."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.head = b""

    def peek(self, n: int) -> bytes:
        while len(self.head) < n:
            chunk = self.raw.read(n - len(self.head))
            if not chunk:
                break
            self.head += chunk
        return self.head[:n]

    def read(self, n: int) -> bytes:
        if self.head:
            out, self.head = self.head[:n], self.head[n:]
            if len(out) < n:
                out += self.raw.read(n - len(out))
            return out
        return self.raw.read(n)


class _Decompressed:
    """A compressed stream read through the decompressor objects of the standard library, so that a
    truncated file yields everything before the cut (and says so) instead of failing on its first read."""

    def __init__(self, name: str, stream: _Peekable) -> None:
        self.name = name
        self.stream = stream
        self.dec = self._new()
        self.buffer = b""
        self.ended = False
        self.truncated = ""

    def _new(self) -> zlib._Decompress | bz2.BZ2Decompressor | lzma.LZMADecompressor:
        if self.name == "gzip":
            return zlib.decompressobj(wbits=31)
        if self.name == "bz2":
            return bz2.BZ2Decompressor()
        return lzma.LZMADecompressor()

    def read(self, n: int) -> bytes:
        while len(self.buffer) < n and not self.ended:
            chunk = self.stream.read(BLOCK)
            if not chunk:
                self.ended = True
                if not self.dec.eof:
                    self.truncated = f"the {self.name} stream ends early (truncated file?)"
                break
            try:
                self.buffer += self.dec.decompress(chunk)
                while self.dec.eof and self.dec.unused_data:  # concatenated members (rotated logs)
                    rest = self.dec.unused_data
                    self.dec = self._new()
                    self.buffer += self.dec.decompress(rest)
            except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError) as e:
                self.ended = True
                self.truncated = f"the {self.name} stream is damaged ({e})"
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out


_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz"}


def _sniff_encoding(head: bytes, label: str) -> str:
    if head.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    sample = head[:4096]
    if len(sample) >= 4 and sample.count(b"\x00") * 3 >= len(sample):
        # UTF-16 without a byte-order mark: every other byte of ASCII text is zero.
        even, odd = sample[0::2].count(b"\x00"), sample[1::2].count(b"\x00")
        if odd > 0.9 * len(sample[1::2]) and even < 0.1 * len(sample[0::2]):
            return "utf-16-le"
        if even > 0.9 * len(sample[0::2]) and odd < 0.1 * len(sample[1::2]):
            return "utf-16-be"
    for magic, what in _ARCHIVES.items():
        if head.startswith(magic):
            raise DoctorInputError(f"{label} is {what}, not a server log")
    if b"\x00" in sample:
        raise DoctorInputError(f"{label} is binary data (it contains NUL bytes), not a text log")
    controls = sum(1 for b in sample if b < 32 and b not in (9, 10, 12, 13, 27))
    if sample and controls > 0.1 * len(sample):
        raise DoctorInputError(
            f"{label} is binary data ({controls} control bytes in its first {len(sample)}), not a text log"
        )
    return "utf-8"


class LogSource:
    """The lines of one input, numbered from 1, with `stats` filled in as they are read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.label = "standard input" if path == "-" else repr(path)
        self.stats = ReadStats()
        self._raw = _open_raw(path)
        stream = _Peekable(self._raw)
        try:
            head = stream.peek(8)
        except OSError as e:
            raise DoctorInputError(f"cannot read {self.label}: {e.strerror or e}") from None
        if not head:
            raise DoctorInputError(f"{self.label} is empty: there is nothing to diagnose")
        self._bytes: IO[bytes] | _Peekable = stream
        self._decompressed: _Decompressed | None = None
        for magic, name in _COMPRESSED.items():
            if head.startswith(magic):
                self.stats.compression = name
                self._decompressed = _Decompressed(name, stream)
                inner = _Peekable(self._decompressed)  # type: ignore[arg-type]
                head = inner.peek(SNIFF)
                if not head:
                    why = self._decompressed.truncated or "it holds no data"
                    raise DoctorInputError(f"{self.label} is an unreadable {name} file: {why}")
                self._bytes = inner
                break
        else:
            head = stream.peek(SNIFF)
        self.stats.encoding = _sniff_encoding(head, self.label)

    def close(self) -> None:
        if self._raw is not sys.stdin.buffer:
            self._raw.close()

    def _blocks(self) -> Iterator[bytes]:
        while True:
            try:
                block = self._bytes.read(BLOCK)
            except OSError as e:
                self.stats.truncated = f"reading stopped early ({e})"
                return
            if not block:
                if self._decompressed is not None:
                    self.stats.truncated = self._decompressed.truncated
                return
            self.stats.bytes_read += len(block)
            yield block

    def lines(self) -> Iterator[tuple[int, str]]:
        """(line number, text without its line end). Carriage returns inside a line (progress bars)
        split it into parts that share the line's number."""
        return self._utf8_lines() if self.stats.encoding == "utf-8" else self._decoded_lines()

    def _cut(self, line: bytes) -> bytes:
        if len(line) > MAX_LINE:
            self.stats.long_lines += 1
            return line[:MAX_LINE]
        return line

    def _utf8_lines(self) -> Iterator[tuple[int, str]]:
        carry = b""
        skipping = False  # inside an over-long line whose start was already yielded
        n = 0
        stats = self.stats
        for block in self._blocks():
            data = carry + block
            cut = data.rfind(b"\n")
            if cut >= 0:
                complete, carry = data[:cut], data[cut + 1 :]
                has_lines = True
                if skipping:  # the rest of an over-long line runs up to the first newline
                    first = complete.find(b"\n")
                    has_lines = first >= 0
                    complete = complete[first + 1 :]
                    skipping = False
                if has_lines:
                    for text in self._decode_block(complete):
                        n += 1
                        if "\r" in text:
                            for piece in text.split("\r"):
                                if piece:
                                    yield n, piece
                        else:
                            yield n, text
            else:
                carry = data
            if len(carry) > MAX_LINE and not skipping:
                n += 1
                stats.long_lines += 1
                yield n, carry[:MAX_LINE].decode("utf-8", errors="replace")
                carry = b""
                skipping = True
            elif skipping:
                carry = b""
        if carry and not skipping:
            stats.ends_without_newline = True
            n += 1
            for piece in self._decode_block(carry)[0].split("\r"):
                if piece:
                    yield n, piece

    def _decode_block(self, complete: bytes) -> list[str]:
        """Complete lines (joined by newlines) as text: one decode for the block when it is valid UTF-8
        with no over-long line, else line by line (invalid lines are read as cp1252 and counted)."""
        try:
            lines = complete.decode("utf-8").split("\n")
            if max(map(len, lines)) <= MAX_LINE:
                return lines
        except UnicodeDecodeError:
            pass
        out = []
        for raw in complete.split(b"\n"):
            if len(raw) > MAX_LINE:
                raw = self._cut(raw)
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                self.stats.undecodable_lines += 1
                out.append(raw.decode("cp1252", errors="replace"))
        return out

    def _decoded_lines(self) -> Iterator[tuple[int, str]]:
        decoder = codecs.getincrementaldecoder(self.stats.encoding)(errors="replace")
        carry = ""
        n = 0
        for block in self._blocks():
            text = carry + decoder.decode(block)
            parts = text.split("\n")
            carry = parts.pop()
            if len(carry) > MAX_LINE:
                self.stats.long_lines += 1
                carry = carry[:MAX_LINE]
            for line in parts:
                n += 1
                for piece in line[:MAX_LINE].split("\r"):
                    if piece:
                        yield n, piece
        carry += decoder.decode(b"", final=True)
        if carry:
            self.stats.ends_without_newline = True
            n += 1
            for piece in carry.split("\r"):
                if piece:
                    yield n, piece
