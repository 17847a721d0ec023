"""Reading trace files safely: printable names, regular files only, the first bytes of a file (gunzipped), bounded inflation, and the size of a file's content.

File names on Linux are bytes; Python carries the ones that are not UTF-8 as ``str``
with surrogate escapes (``os.fsdecode``). They are opened as they are, and shown (in
messages and in the dataset's text columns) through ``display``, which writes the
undecodable bytes and any control character as backslash escapes: a name can neither
break a one-line error nor send escape sequences to the terminal.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Callable
from pathlib import Path

from overlapviz.dataset.schema import display_path

SNIFF_BYTES = 64 * 1024
# inflating a gzip trace stops past this many bytes (a gzip bomb expands ~1000x); the
# environment variable sets another limit (bytes)
MAX_INFLATED_BYTES_ENV = "OVERLAPVIZ_MAX_INFLATED_BYTES"
DEFAULT_MAX_INFLATED_BYTES = 16 * 1024**3

__all__ = ["SNIFF_BYTES", "display", "gunzip_bounded", "head_bytes", "input_bytes", "max_inflated_bytes",
           "regular_file_problem"]  # fmt: skip

# how names are shown: undecodable bytes and control characters as \xNN (one rule for
# messages and the dataset's text columns, kept with the dataset's output directory)
display = display_path


def printable(text: str) -> str:
    """A message made safe to print on one line: ``display`` rules, whitespace runs as one space."""
    return display(" ".join(str(text).split()))


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def regular_file_problem(mode: int) -> str | None:
    """Why a file of ``mode`` (``st_mode``) cannot be a trace file; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, what in _KINDS:
        if test(mode):
            return f"not a regular file ({what})"
    return "not a regular file"


def _open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, refused unless it is a regular file.

    Opened without blocking, so a FIFO named as a trace is refused instead of waiting
    forever for a writer.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ValueError(f"{display(path)}: cannot read: {exc.strerror or exc}") from None
    try:
        problem = regular_file_problem(os.fstat(fd).st_mode)
    except OSError as exc:
        os.close(fd)
        raise ValueError(f"{display(path)}: cannot read: {exc.strerror or exc}") from None
    if problem:
        os.close(fd)
        raise ValueError(f"{display(path)}: {problem}, not a trace file")
    os.set_blocking(fd, True)
    return fd


def head_bytes(path: Path) -> bytes:
    """The first 64 KiB of ``path``, gunzipped when it is gzip.

    Raises
    ------
    ValueError
        Naming ``path`` when it cannot be read, is not a regular file (a FIFO, a device),
        or its gzip stream is corrupt.
    """
    fd = _open_regular(path)
    try:
        with open(fd, "rb", closefd=True) as fh:
            magic = fh.read(2)
            fh.seek(0)
            if magic == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=fh) as gz:
                    return gz.read(SNIFF_BYTES)
            return fh.read(SNIFF_BYTES)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(f"{display(path)}: truncated or corrupt gzip ({' '.join(str(exc).split())})") from None
    except OSError as exc:
        raise ValueError(f"{display(path)}: cannot read: {exc.strerror or exc}") from None


def input_bytes(path: Path) -> int:
    """The size of ``path``'s content: a gzip file's trailer says it (modulo 4 GiB); 0 where unknown."""
    try:
        fd = _open_regular(path)
    except ValueError:
        return 0
    try:
        with open(fd, "rb", closefd=True) as fh:
            if fh.read(2) != b"\x1f\x8b":
                return os.fstat(fh.fileno()).st_size
            fh.seek(-4, os.SEEK_END)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0


def read_regular(path: Path) -> bytes:
    """The bytes of ``path``, refused (naming it) unless it is a readable regular file."""
    fd = _open_regular(path)
    try:
        with open(fd, "rb", closefd=True) as fh:
            return fh.read()
    except OSError as exc:
        raise ValueError(f"{display(path)}: cannot read: {exc.strerror or exc}") from None


def max_inflated_bytes() -> int:
    """The most bytes one gzip trace may inflate to (``OVERLAPVIZ_MAX_INFLATED_BYTES``, else 16 GiB)."""
    text = os.environ.get(MAX_INFLATED_BYTES_ENV, "").strip()
    if text:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{MAX_INFLATED_BYTES_ENV}={text!r} is not a number of bytes") from None
        if value > 0:
            return value
    return DEFAULT_MAX_INFLATED_BYTES


_CHUNK = 64 * 1024 * 1024
try:  # ISA-L's inflater: 2-3x zlib's speed (a third of a large trace's ingest), where it has wheels
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - the same results through zlib
    _inflate = zlib


def gunzip_bounded(data: bytes, path: Path, limit: int | None = None) -> bytes:
    """Every member of the gzip file ``data``, refused past ``limit`` inflated bytes: the one gunzip of ingest.

    The inflater checks each member's CRC while it inflates (gzip.decompress runs a second
    pass for it, ~15 % of the time).

    A gzip bomb (a few MB that inflate to many GB) stops at the limit, with at most
    ``limit`` bytes held, instead of exhausting the machine's memory.

    Raises
    ------
    ValueError
        Naming ``path``: truncated or corrupt gzip, trailing garbage, or more than ``limit``
        bytes once inflated.
    """
    limit = max_inflated_bytes() if limit is None else limit
    parts: list[bytes] = []
    total = 0
    # gzip's last 4 bytes: the (last) member's inflated size mod 2**32. Asked for that much at once, a
    # one-member file inflates into one buffer, without joining 64 MB chunks (a copy: ~40% of inflating)
    size_hint = int.from_bytes(data[-4:], "little") + 1 if len(data) >= 18 else _CHUNK
    while True:
        inflater = _inflate.decompressobj(wbits=31)
        pending = data
        try:
            while not inflater.eof:
                chunk = inflater.decompress(pending, min(max(_CHUNK, size_hint), limit - total + 1))
                size_hint = 0
                total += len(chunk)
                if total > limit:
                    raise ValueError(
                        f"{display(path)}: inflates to more than {limit} bytes (a gzip bomb?); "
                        f"set {MAX_INFLATED_BYTES_ENV} to allow more"
                    )
                parts.append(chunk)
                progressed = chunk or len(inflater.unconsumed_tail) != len(pending)
                pending = inflater.unconsumed_tail
                if not progressed:
                    break  # no input left and nothing more to give: truncated
        except (zlib.error, _inflate.error) as exc:
            raise ValueError(f"{display(path)}: corrupt gzip data: {exc}") from None
        if not inflater.eof:
            raise ValueError(f"{display(path)}: truncated gzip file")
        data = inflater.unused_data.lstrip(b"\x00")  # gzip(1) tolerates zero padding after a member
        if not data:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if data[:2] != b"\x1f\x8b":
            raise ValueError(f"{display(path)}: corrupt gzip data: trailing garbage after the compressed data")


# gzip files a caller inflated ahead (cli/_dataset: while the ingest modules import), by ``file_identity``: a function
# giving the inflated bytes, or None where it did not read them as read_bytes would; read_bytes takes each one once
READ_AHEAD: dict[tuple, Callable[[], bytes | None]] = {}


def file_identity(st: os.stat_result) -> tuple:
    """What tells a file read ahead from any other, or from itself changed since: device, inode, size, mtime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_ahead(path: Path) -> bytes | None:
    try:
        inflated = READ_AHEAD.pop(file_identity(os.stat(path)), None)
    except OSError:
        return None
    data = inflated() if inflated is not None else None
    return data if data is not None and len(data) <= max_inflated_bytes() else None


def read_bytes(path: Path) -> bytes:
    """The bytes of a trace file, gunzipped when it is gzip (detected by content).

    Raises
    ------
    ValueError
        Naming ``path``: unreadable, truncated or corrupt gzip, empty.
    """
    raw = _read_ahead(path) if READ_AHEAD else None
    if raw is None:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
        if raw[:2] == b"\x1f\x8b":
            raw = gunzip_bounded(raw, path)
    if not raw[:256].strip() and not raw.strip():  # the head first: no copy of a whole trace
        raise ValueError(f"{path}: empty file, not a trace")
    return raw
