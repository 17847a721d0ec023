"""What was computed from a dataset, kept on disk for the next process: the dashboard's tables and the CLI's answers.

Both live under the overlapviz cache (``cache.cache_dir()``) in ``tables/<hash>/``, one folder per
dataset (its path, a stamp that changes when it is rewritten, overlapviz's version and code),
private to this account (folders 0700, files 0600, read only when this account wrote them),
written atomically (a temporary file, then a rename), the ``KEEP_DATASETS`` most recent kept.
``OVERLAPVIZ_TABLE_CACHE=0`` turns both off. Nothing here imports pyarrow or pandas: a warm
``overlapviz explain TRACES`` reads its answer through this module alone.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from overlapviz._version import __version__
from overlapviz.dataset.cache import cache_dir

TABLE_CACHE_ENV = "OVERLAPVIZ_TABLE_CACHE"  # "0": keep what was computed in memory only
KEEP_DATASETS = 24  # the tables and answers of this many datasets are kept (the most recently computed)
ANSWER_FORMAT = "overlapviz-answer 1"  # the first line of an answer file
# a longer answer (every kernel of a big dataset as CSV) is not kept: printing it costs more than computing it
ANSWER_MAX_CHARS = 32 << 20
# what the dashboard's tables are computed by, and what the CLI's answers are computed and printed by
TABLE_CODE = ("analysis", "dataset", "domain")
ANSWER_CODE = ("analysis", "cli", "dataset", "domain", "ingest")


def enabled() -> bool:
    return os.environ.get(TABLE_CACHE_ENV, "1") != "0"


@functools.cache
def code_stamp(folders: tuple[str, ...] = TABLE_CODE) -> str:
    """Names, sizes and times of the files in these folders of the package (its code and data: the vocabulary,
    the device list, the C readers), overlapviz's version and the versions of Python and of the libraries that
    compute and print: a change to any means new tables. Stat calls alone (about 100), no import."""
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    files = sorted(f for d in folders for f in (root / d).iterdir() if f.is_file() and not f.name.endswith(".pyc"))
    parts = [f"overlapviz {__version__}", f"python {sys.version}"]
    parts += [f"{f.relative_to(root)}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files]
    for lib in ("numpy", "pandas", "pyarrow"):  # an upgrade rewrites the package's __init__.py
        spec = importlib.util.find_spec(lib)
        origin = spec.origin if spec is not None else None
        st = os.stat(origin) if origin else None
        parts.append(f"{lib}:{origin}:{st.st_size}:{st.st_mtime_ns}" if st else f"{lib}:-")
    return ";".join(parts)


def dataset_stamp(path: str | os.PathLike) -> str:
    """A hash of every file of the dataset directory ``path`` (relative name, size, times, inode): it changes when
    the dataset is written again, or any of its files is replaced or changed."""
    root = os.fspath(path)
    listing = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(folder, name)
            st = os.stat(full)
            listing.append(f"{os.path.relpath(full, root)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}")
    return hashlib.sha256("\n".join(listing).encode("utf-8", "surrogateescape")).hexdigest()


def disk_dir(path: str, stamp: str, code: str | None = None) -> Path | None:
    """Where what was computed from the dataset ``path`` (in the state ``stamp`` names) is kept:
    ``<cache>/tables/<hash of the path, stamp, version and code>``; None when turned off (``TABLE_CACHE_ENV``)."""
    if not enabled():
        return None
    code = code_stamp() if code is None else code
    key = hashlib.sha256(f"{path}\0{stamp}\0{__version__}\0{code}".encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return cache_dir() / "tables" / key


def private(p: Path) -> bool:
    """Only this account can have written ``p`` (never read what another account could plant)."""
    try:
        st = p.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def prune(root: Path) -> None:
    """Drop the oldest datasets' folders beyond ``KEEP_DATASETS`` (a new one is about to be written)."""
    try:
        dirs = sorted((d for d in root.iterdir() if d.is_dir() and private(d)), key=lambda d: d.stat().st_mtime)
    except OSError:
        return
    for d in dirs[: max(0, len(dirs) - KEEP_DATASETS + 1)]:
        try:
            for f in d.iterdir():
                f.unlink(missing_ok=True)
            d.rmdir()
        except OSError:  # another process is writing there: it stays
            pass


def open_private(file: Path) -> BinaryIO | None:
    """``file`` open for reading where it and its folder are this account's alone, else None."""
    if not (private(file.parent) and private(file)):
        return None
    try:
        return open(file, "rb")
    except OSError:
        return None


def write_private(file: Path, write: Callable[[BinaryIO], None]) -> bool:
    """``write(fh)`` into ``file`` atomically (a temporary file beside it, then a rename), folders 0700 and the file
    0600; False, leaving nothing behind, where it cannot be written (a read-only cache, a full disk)."""
    where = file.parent
    tmp = file.with_suffix(f".{os.getpid()}.tmp")
    placed = False
    try:
        if not where.exists():
            prune(where.parent)
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not private(where):
            return False
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
            write(fh)
        os.replace(tmp, file)
        placed = True
        return True
    except OSError:
        return False
    finally:
        if not placed:  # a failed write, and an interrupted one (Ctrl-C, a SIGTERM turned into an exception)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)


def disk_file(path: str, stamp: str, name: str, code: str | None = None) -> Path | None:
    """The file ``name`` (what was computed, as text) of the dataset ``path`` in state ``stamp`` is kept in (``disk_dir``
    with ``code``: None, the table code); None when the cache is turned off."""
    where = disk_dir(path, stamp, code)
    return None if where is None else where / f"{hashlib.sha256(name.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}.pickle"


def on_disk(path: str, stamp: str, name: str, compute: Callable, *, code: str | None = None, valid: Callable | None = None):
    """``compute()`` once per dataset state and code across processes: read from the table cache, else computed and
    written (``disk_file``). A file that is damaged, not this account's, or whose value ``valid`` refuses is computed
    again; a cache that cannot be written keeps the value in memory only."""
    import pickle

    file = disk_file(path, stamp, name, code)
    fh = None if file is None or not file.exists() else open_private(file)
    if fh is not None:
        try:
            with fh:
                value = pickle.load(fh)
        except Exception:  # noqa: BLE001  (a damaged cache file is computed again)
            pass
        else:
            if valid is None or valid(value):
                return value
    value = compute()
    if file is not None:
        write_private(file, lambda out: pickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL))
    return value


def answer_file(path: str, stamp: str, key: str) -> tuple[Path, str] | None:
    """Where the answer ``key`` (a command and its options, as text) of the dataset ``path`` in state ``stamp`` is
    kept, and the whole key its file must name (the answer's key, the dataset, its stamp, the code); None when the
    cache is turned off."""
    code = code_stamp(ANSWER_CODE)
    where = disk_dir(path, stamp, code)
    if where is None:
        return None
    import json

    whole = json.dumps({"answer": key, "dataset": path, "stamp": stamp,
                        "code": hashlib.sha256(code.encode("utf-8", "surrogateescape")).hexdigest()})  # fmt: skip
    return where / f"{hashlib.sha256(whole.encode()).hexdigest()[:24]}.answer", whole


def read_answer(file: Path, key: str) -> str | None:
    """The text kept in ``file`` for ``key`` (``answer_file``'s whole key, one line); None where there is none, or it is
    not whole, not this key's (a file written for another answer or dataset, or by another format), or not this
    account's: never trusted, computed again."""
    fh = open_private(file)
    if fh is None:
        return None
    with fh:
        data = fh.read()
    head, sep, body = data.partition(b"\n\n")
    lines = head.split(b"\n")
    if not sep or len(lines) != 3 or lines[0] != ANSWER_FORMAT.encode() or lines[1] != key.encode("utf-8", "surrogateescape"):
        return None
    if hashlib.sha256(body).hexdigest().encode() != lines[2]:
        return None
    try:
        return body.decode("utf-8", "surrogateescape")
    except UnicodeDecodeError:
        return None


def write_answer(file: Path, key: str, text: str) -> bool:
    """Keep ``text``, the answer ``key``, in ``file``: a header (the format, the key, the text's SHA-256) then the text
    (not one longer than ``ANSWER_MAX_CHARS``)."""
    if len(text) > ANSWER_MAX_CHARS:
        return False
    try:
        body = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no file name gave: printed, not kept
        return False
    data = b"\n".join([ANSWER_FORMAT.encode(), key.encode("utf-8", "surrogateescape"), hashlib.sha256(body).hexdigest().encode()])
    return write_private(file, lambda fh: fh.write(data + b"\n\n" + body))
