"""Reading trace files: the first bytes of a file (gunzipped), and the size of its content."""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

SNIFF_BYTES = 64 * 1024

__all__ = ["SNIFF_BYTES", "head_bytes", "input_bytes"]


def head_bytes(path: Path) -> bytes:
    """The first 64 KiB of ``path``, gunzipped when it is gzip.

    Raises
    ------
    ValueError
        Naming ``path`` when it cannot be read or its gzip stream is corrupt.
    """
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
            fh.seek(0)
            if magic == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=fh) as gz:
                    return gz.read(SNIFF_BYTES)
            return fh.read(SNIFF_BYTES)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(f"{path}: truncated or corrupt gzip ({' '.join(str(exc).split())})") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None


def input_bytes(path: Path) -> int:
    """The size of ``path``'s content: a gzip file's trailer says it (modulo 4 GiB)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                return os.fstat(fh.fileno()).st_size
            fh.seek(-4, os.SEEK_END)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0
