"""The output directory of a dataset: where one may be written, its temporary directory, and moving it into place.

The rules (docs/robustness.md states them for users):

* the output may not be, contain or lie inside any input (``check_output_path``: compared
  resolved, and by device and inode, so symbolic links, ``..`` and bind mounts do not hide it);
* an existing output is used only when it is an empty directory, or an overlapviz dataset and
  ``overwrite`` is given; nothing else (a file, a symbolic link, a directory holding anything
  overlapviz did not write) is ever replaced or removed (``check_replaceable``);
* the temporary directory is named ``.<out>.ovz-tmp.<hash>.<host>.<pid>.<start>.<random>``
  (the process and its start time) and holds a marker until it is complete, so a later
  writer of the same output on the same host recognises one whose process is gone and
  removes it, and nothing else (``clean_stale_temporaries``);
* the replacement is one atomic exchange where the file system offers it
  (``renameat2(RENAME_EXCHANGE)``): at every instant the output is the old dataset or the
  new one. Elsewhere it is two renames; a writer killed between them is repaired by the
  next one (the old dataset goes back in place).

Names are carried as they are on disk (``str`` with surrogate escapes for bytes that are
not UTF-8) and shown through ``display_path``. No overlapviz imports: ``schema`` builds on it.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["INCOMPLETE", "Finishing", "check_output", "check_output_path", "check_replaceable", "clean_stale_temporaries", "display_path",
           "finish_tree", "is_dataset", "move_into_place", "process_tag", "temporary_prefix"]  # fmt: skip

METADATA_FILE = "dataset.json"  # schema.METADATA_FILE
# the dataset format's version (schema.SCHEMA_VERSION): here, without pyarrow, for the cache key (cache.content_key)
SCHEMA_VERSION = "1.1"  # 1.1: kernels.launch_end_ns; ranks.clock_domain, clock_offset_ns, clock_note

# a file in every temporary directory until its dataset is complete: with the name, how a
# later writer knows the directory for one of its own
INCOMPLETE = ".overlapviz-incomplete"
_TMP_KINDS = ("tmp", "old")
# what a dataset directory holds (an older or newer writer may add tables: any *.parquet)
_DATASET_TOP = re.compile(r"^(dataset\.json|[A-Za-z0-9_]+\.parquet|kernels)$")


def display_path(path: str | bytes | os.PathLike) -> str:
    """``path`` as printable, valid UTF-8 text: bytes that are not UTF-8 and control characters
    (a newline, an escape) as ``\\xNN``; what messages show and the dataset's text columns hold."""
    if isinstance(path, str):
        try:
            raw = path.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate no file name decodes to: escape it as text
            raw = path.encode("utf-8", "backslashreplace")
    else:
        raw = os.fsencode(path)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", raw.decode("utf-8", "backslashreplace"))


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_output_path(out: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> None:
    """Refuse an output that is, contains or lies inside one of ``inputs``, or is a symbolic link.

    Paths are compared resolved (symbolic links, ``..``) and by device and inode (bind
    mounts, case-insensitive file systems).

    Raises
    ------
    ValueError
        Naming ``out`` and the input.
    """
    out = Path(out)
    if os.path.islink(out):
        raise ValueError(f"{display_path(out)}: output is a symbolic link; name what it points to instead")
    identity = functools.lru_cache(maxsize=None)(_identity)  # inputs share their directories
    out_real = Path(os.path.realpath(out))
    out_chain = {identity(p) for p in [out_real, *out_real.parents]} - {None}  # out and every directory above it
    out_id = identity(out_real)
    for given in inputs:
        real = Path(os.path.realpath(given))
        ident = identity(real)
        if real == out_real or (ident is not None and ident == out_id):
            raise ValueError(f"{display_path(out)}: output is the input {display_path(given)}; choose another output")
        if out_real in real.parents or (out_id is not None and any(identity(p) == out_id for p in real.parents)):
            raise ValueError(f"{display_path(out)}: output contains the input {display_path(given)}; choose another output")
        if real in out_real.parents or (ident is not None and ident in out_chain):
            raise ValueError(f"{display_path(out)}: output lies inside the input {display_path(given)}; choose another output")


def check_output(out: str | os.PathLike, inputs: Sequence[str | os.PathLike], *, may_be_dataset: bool = False) -> None:
    """Refuse what any command that writes (``ingest -o``, ``export -o``, ``collect -o``, ``serve
    --token-file``) may not write to, before anything is written.

    ``check_output_path``'s rules, and: ``out`` may not lie inside an overlapviz dataset (a
    directory holding ``dataset.json``, or one being built), nor be one (unless
    ``may_be_dataset``: the dataset ``ingest --overwrite`` replaces), nor be a hard link to a
    file of a dataset among ``inputs``. Paths are compared resolved, so a symbolic link or
    ``..`` does not hide a dataset.

    Raises
    ------
    ValueError
        One line naming ``out`` and the input or the dataset.
    """
    check_output_path(out, inputs)
    out_real = Path(os.path.realpath(out))
    chain = [out_real, *out_real.parents] if not may_be_dataset else list(out_real.parents)
    for directory in chain:
        if _holds_dataset(directory):
            where = "is" if directory == out_real else "lies inside"
            raise ValueError(f"{display_path(out)}: output {where} the overlapviz dataset {display_path(directory)}; "
                             "writing there would change the dataset: choose a path outside it")  # fmt: skip
    try:
        st = os.stat(out_real)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:  # a hard link: the same file as one of a dataset read here?
        for given in inputs:
            for path in _dataset_files(Path(os.path.realpath(given))):
                if _identity(path) == (st.st_dev, st.st_ino):
                    raise ValueError(f"{display_path(out)}: output is the file {display_path(path)} of the input "
                                     f"dataset {display_path(given)} (a hard link); choose another output")  # fmt: skip


def _holds_dataset(directory: Path) -> bool:
    """True when ``directory`` is an overlapviz dataset (its ``dataset.json`` has a ``schema_version``:
    another tool's ``dataset.json`` does not count) or one being built, whatever else it holds."""
    if os.path.isfile(directory / INCOMPLETE):
        return True
    try:
        meta = json.loads((directory / METADATA_FILE).read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and "schema_version" in meta


def _dataset_files(directory: Path) -> list[Path]:
    """The files of the dataset at ``directory`` (none where it is not one)."""
    if not _holds_dataset(directory):
        return []
    found = []
    for root, _dirs, files in os.walk(directory):
        found.extend(Path(root) / f for f in files)
    return found


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def is_dataset(path: str | os.PathLike) -> bool:
    """True when ``path`` is a directory holding an overlapviz dataset and nothing else."""
    return _not_a_dataset(Path(path)) is None


def _not_a_dataset(path: Path) -> str | None:
    """Why ``path`` (a directory) is not an overlapviz dataset; None when it is one."""
    try:
        meta = json.loads((path / METADATA_FILE).read_text())
    except FileNotFoundError:
        return f"it has no {METADATA_FILE}"
    except (OSError, ValueError):
        return f"its {METADATA_FILE} is unreadable"
    if not isinstance(meta, dict) or "schema_version" not in meta:
        return f"its {METADATA_FILE} is not an overlapviz one"
    try:
        for entry in os.scandir(path):
            if not _DATASET_TOP.match(entry.name) or entry.is_symlink():
                return f"it holds {display_path(entry.name)}, which overlapviz did not write"
            if entry.name == "kernels":
                if not entry.is_dir(follow_symlinks=False):
                    return "its kernels is not a directory"
                for run in os.scandir(entry.path):
                    if not run.is_dir(follow_symlinks=False):
                        return f"it holds kernels/{display_path(run.name)}, which overlapviz did not write"
                    for f in os.scandir(run.path):
                        if not f.name.endswith(".parquet") or not f.is_file(follow_symlinks=False):
                            return f"it holds kernels/{display_path(run.name)}/{display_path(f.name)}, which overlapviz did not write"
    except OSError as exc:
        return f"it cannot be listed ({exc.strerror or exc})"
    return None


def check_replaceable(out: Path, overwrite: bool) -> None:
    """Refuse an existing ``out`` that may not be replaced (see the module docstring)."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ValueError(f"{display_path(out)}: cannot use as output: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise ValueError(f"{display_path(out)}: output is a symbolic link; name the directory it points to instead")
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{display_path(out)}: output exists and is not a directory; overlapviz never replaces it")
    try:
        empty_dir = next(os.scandir(out), None) is None
    except OSError as exc:
        raise ValueError(f"{display_path(out)}: cannot use as output: {exc.strerror or exc}") from None
    if empty_dir:
        return
    why = _not_a_dataset(out)
    if why is not None:
        raise ValueError(
            f"{display_path(out)}: output exists, is not empty and is not an overlapviz dataset ({why}); "
            "--overwrite replaces only a dataset: choose another output directory"
        )
    if not overwrite:
        raise ValueError(f"{display_path(out)}: output exists and is not empty (an overlapviz dataset: use --overwrite to replace it)")


def temporary_prefix(out: Path, kind: str) -> str:
    """The start of the names of ``out``'s temporary (``tmp``) and moved-aside (``old``) directories."""
    name = out.name or "dataset"
    digest = hashlib.sha1(os.fsencode(name)).hexdigest()[:8]
    return f".{name[:64]}.ovz-{kind}.{digest}."


def _host() -> str:
    import socket

    return re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname())[:40] or "host"


def process_tag(pid: int | None = None) -> str:
    """``<host>.<pid>.<start time>.``: which process on which host made a temporary directory."""
    pid = os.getpid() if pid is None else pid
    return f"{_host()}.{pid}.{_start_time(pid)}."


def _start_time(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot, Linux); 0 where unknown.

    With the pid it tells a process apart from a later one that reuses its pid.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return 0


def _alive(pid: int, start: int) -> bool:
    if pid == os.getpid():
        return not start or start == _start_time(pid)  # else an earlier process that had this pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return True  # cannot tell: keep its directory
    return not (start and _start_time(pid) not in (0, start))


def _stale_temporaries(out: Path) -> list[tuple[str, Path]]:
    """``(kind, path)`` of the temporary directories beside ``out`` that a writer of ``out``
    on this host left behind when it was killed (its process is gone)."""
    parent = out.parent if str(out.parent) else Path(".")
    prefixes = {kind: temporary_prefix(out, kind) for kind in _TMP_KINDS}
    tail = re.compile(rf"^{re.escape(_host())}\.(\d+)\.(\d+)\.[A-Za-z0-9_]+$")
    found = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    for entry in entries:
        for kind, prefix in prefixes.items():
            if not entry.name.startswith(prefix):
                continue
            m = tail.match(entry.name[len(prefix):])
            if m is None:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            if _alive(int(m.group(1)), int(m.group(2))):
                continue
            path = Path(entry.path)
            if kind == "tmp" and not (os.path.lexists(path / INCOMPLETE) or os.path.lexists(path / METADATA_FILE)):
                continue  # not in the state this writer leaves its directories in: not ours to remove
            found.append((kind, path))
    return sorted(found, key=lambda f: _TMP_KINDS.index(f[0]))


def clean_stale_temporaries(out: str | os.PathLike) -> list[Path]:
    """Remove what killed writers of ``out`` left beside it; return what was removed or restored.

    A temporary directory of a killed writer is removed. A dataset that a writer killed
    half-way through replacing it had moved aside (the file system without an atomic
    exchange) goes back to ``out`` when ``out`` is missing, else (the new one is in place)
    is removed. Directories of live processes, of other hosts or users, and anything not
    named and shaped like this writer's, are left alone.
    """
    out = Path(out)
    handled = []
    for kind, path in _stale_temporaries(out):
        if kind == "old" and not os.path.lexists(out):
            try:
                os.rename(path, out)
                handled.append(path)
            except OSError:
                pass
            continue
        shutil.rmtree(path, ignore_errors=True)
        handled.append(path)
    return handled


# --- moving a finished dataset into place ---------------------------------------------------

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(2)`` where libc has it; False where it or the file system does not support ``flags``."""
    fn = _renameat2_fn()
    if fn is None:
        return False
    import ctypes

    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


@functools.lru_cache(maxsize=1)
def _renameat2_fn():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def move_into_place(tmp: Path, out: Path) -> None:
    if not os.path.lexists(out):
        if not _renameat2(tmp, out, _RENAME_NOREPLACE):
            os.rename(tmp, out)  # replaces at most an empty directory made meanwhile
        _sync_dir(out.parent if str(out.parent) else Path("."))
        return
    aside = tmp.with_name(temporary_prefix(out, "old") + process_tag() + tmp.name.rsplit(".", 1)[-1])
    if _renameat2(tmp, out, _RENAME_EXCHANGE):
        os.rename(tmp, aside)  # the old dataset, by a name the next writer recognises if this one dies now
    else:
        os.rename(out, aside)  # killed between these two: the next writer puts the old dataset back
        os.rename(tmp, out)
    _sync_dir(out.parent if str(out.parent) else Path("."))
    shutil.rmtree(aside, ignore_errors=True)


def finish_tree(tmp: Path) -> None:
    """Give the dataset the permissions the user's umask asks for (a temporary directory is
    made private) and flush its files to disk before it is moved into place, so that a
    crash of the machine cannot leave a dataset whose files are empty."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o777 & ~mask)
    if os.environ.get("OVERLAPVIZ_FSYNC", "1") in ("0", "false", "no"):
        return
    for root, dirs, files in os.walk(tmp):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _sync_dir(Path(root))


def _sync_dir(path: Path) -> None:
    if os.environ.get("OVERLAPVIZ_FSYNC", "1") in ("0", "false", "no"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a directory
    finally:
        os.close(fd)




class Finishing:
    """``finish()`` (writing an output directory and moving it into place) running in a thread of its own, while this
    one goes on; ``wait`` gives its result or raises what it raised.

    Not a daemon: an interpreter that exits before ``wait`` still finishes the directory first (threading's shutdown
    joins it), so what was started is moved into place or, on a failure, removed by ``finish`` itself."""

    def __init__(self, finish: Callable[[], Path]):
        import threading

        self._result: Path | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(finish,), name="overlapviz-finishing")
        self._thread.start()

    def _run(self, finish: Callable[[], Path]) -> None:
        try:
            self._result = finish()
        except BaseException as exc:  # handed to wait(): raised in the thread that asks
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> Path:
        """The result of ``finish`` once it returned; what it raised, again at each call."""
        self._thread.join()
        if self._error is not None:
            raise self._error.with_traceback(None)
        assert self._result is not None
        return self._result
