"""The communication vocabulary (``vocabulary.toml``, shipped in the package): which kernel and host names are communication, per library, and the collective each names."""

from __future__ import annotations

import functools
import importlib.resources
import re
import tomllib
from dataclasses import dataclass

__all__ = ["Library", "Vocabulary", "function_name", "joined", "load", "short_name", "vocabulary"]

COLLECTIVE_LABELS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv", "broadcast",
                     "reduce", "gather", "scatter", "send", "recv", "barrier")  # fmt: skip


@dataclass(frozen=True)
class Library:
    """One communication library's names.

    Attributes
    ----------
    name, title
        Short key (``deepep``) and the name people know (``DeepEP``).
    kernel, host, compute
        Case-insensitive regexes searched in GPU kernel names (a match is ``comm``), in host
        ranges (``user_annotation``/``cpu_op``; a match is ``comm``), and in kernel names
        of the library that move nothing between GPUs (``compute``, tried first).
    collectives
        ``(regex, collective)`` pairs for this library's names, tried in order.
    source
        Where the names are defined (repository and path, or a documentation URL).
    """

    name: str
    title: str
    kernel: tuple[str, ...]
    host: tuple[str, ...]
    compute: tuple[str, ...]
    collectives: tuple[tuple[str, str], ...]
    source: tuple[str, ...]

    @functools.cached_property
    def _names_rx(self) -> re.Pattern | None:
        pats = self.kernel + self.host
        return re.compile(joined(pats), re.IGNORECASE) if pats else None

    @functools.cached_property
    def _collective_rx(self) -> tuple[tuple[re.Pattern, str], ...]:
        return tuple((re.compile(p, re.IGNORECASE), c) for p, c in self.collectives)

    def names(self, name: str) -> bool:
        """True when ``name`` matches one of the library's kernel or host patterns."""
        return self._names_rx is not None and self._names_rx.search(name) is not None

    def collective(self, name: str) -> str | None:
        """The collective one of the library's collective rules gives ``name``, else None."""
        return next((c for rx, c in self._collective_rx if rx.search(name)), None)


@dataclass(frozen=True)
class Vocabulary:
    libraries: tuple[Library, ...]
    words: tuple[tuple[str, str], ...]  # (collective, key in the alnum-lowered name), in order

    def patterns(self, side: str) -> tuple[str, ...]:
        """Every library's ``kernel``, ``host`` or ``compute`` patterns, in file order."""
        return tuple(p for lib in self.libraries for p in getattr(lib, side))

    def library_of(self, name: str) -> Library | None:
        """The first library whose kernel or host patterns match ``name``."""
        return next((lib for lib in self.libraries if lib.names(name)), None)


def joined(patterns: tuple[str, ...] | list[str]) -> str:
    """One regex matching any of ``patterns`` (those with a ``|`` are grouped first)."""
    return "|".join(f"(?:{p})" if "|" in p else p for p in patterns)


@functools.lru_cache(maxsize=1)
def vocabulary() -> Vocabulary:
    """The vocabulary shipped with overlapviz (``overlapviz/domain/vocabulary.toml``)."""
    text = importlib.resources.files("overlapviz.domain").joinpath("vocabulary.toml").read_text(encoding="utf-8")
    return load(text, "overlapviz/domain/vocabulary.toml")


def load(text: str, where: str = "vocabulary") -> Vocabulary:
    """Parse and check a vocabulary document (the format of ``vocabulary.toml``).

    Raises
    ------
    ValueError
        Naming ``where`` and the library or field at fault: bad TOML, an unknown field, a
        pattern that is not a regular expression, a collective outside the known labels.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: not valid TOML ({exc})") from None
    if doc.get("version") != 1:
        raise ValueError(f"{where}: version {doc.get('version')!r} is not 1")
    libs = []
    for i, entry in enumerate(doc.get("library", [])):
        name = entry.get("name") or f"library #{i + 1}"
        unknown = set(entry) - {"name", "title", "kernel", "host", "compute", "collective", "source"}
        if unknown:
            raise ValueError(f"{where}: {name}: unknown field(s) {', '.join(sorted(unknown))}")
        if not entry.get("source"):
            raise ValueError(f"{where}: {name}: no source (where the names are defined)")
        fields = {k: tuple(entry.get(k, ())) for k in ("kernel", "host", "compute", "source")}
        for side in ("kernel", "host", "compute"):
            for p in fields[side]:
                _check_pattern(p, f"{where}: {name}.{side}")
        colls = []
        for c in entry.get("collective", []):
            _check_pattern(c.get("pattern"), f"{where}: {name}.collective")
            if c.get("collective") not in COLLECTIVE_LABELS:
                raise ValueError(f"{where}: {name}.collective: {c.get('collective')!r} is not one of {', '.join(COLLECTIVE_LABELS)}")
            colls.append((c["pattern"], c["collective"]))
        libs.append(Library(name=name, title=entry.get("title", name), collectives=tuple(colls), **fields))
    words = []
    for w in doc.get("word", []):
        if w.get("collective") not in COLLECTIVE_LABELS or not isinstance(w.get("key"), str) or not w["key"].isalnum():
            raise ValueError(f"{where}: word {w!r} is not a known collective with a lower-case alphanumeric key")
        words.append((w["collective"], w["key"].lower()))
    return Vocabulary(tuple(libs), tuple(words))


def _check_pattern(pattern, where: str) -> None:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"{where}: pattern {pattern!r} is not a non-empty string")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{where}: {pattern!r} is not a regular expression: {exc}") from None
    if re.search(r"\(\?<?[=!]|\\[1-9]", pattern):  # RE2 (pyarrow's engine) has neither
        raise ValueError(f"{where}: {pattern!r} uses look-around or a back-reference, which RE2 does not support")


def function_name(name: str, *, templates: bool = False) -> str:
    """A kernel's function name from its demangled signature: no return type or parameter list, nor template arguments
    unless ``templates`` (a GEMM library's ``cutlass::Kernel2<cutlass_80_tensorop_...>`` says little without them).

    ``void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)`` -> ``at::native::vectorized_elementwise_kernel``;
    ``std::enable_if<!(...), void>::type internal::gemvx::kernel<...>(...)`` -> ``internal::gemvx::kernel``;
    ``void (anonymous namespace)::f<...>(...)`` -> ``{anonymous}::f``. A name that is no signature keeps its words
    (``Memcpy HtoD (Pageable -> Device)`` -> ``Memcpy HtoD``); empty only for a blank name.
    """
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    s = s.replace("(anonymous namespace)", "{anonymous}")
    depth, bracket, stack = [], [], []  # per character: brackets open around it, whether it is a matched bracket
    for ch in s:
        if ch in "<(":
            depth.append(len(stack))
            bracket.append(True)
            stack.append(ch)
        elif ch in ")>" and stack and stack[-1] == ("(" if ch == ")" else "<"):
            stack.pop()
            depth.append(len(stack))
            bracket.append(True)
        else:  # a '>' of '->' inside a parameter list closes nothing
            depth.append(len(stack))
            bracket.append(False)
    if stack:  # unbalanced: not a signature
        return s or name
    opens = [i for i, ch in enumerate(s) if ch == "(" and depth[i] == 0 and bracket[i]]
    end = opens[-1] if opens and opens[-1] > 0 else len(s)  # the parameter list: the last top-level (...)
    words, cur = [], []
    for i in range(end):
        if depth[i] == 0 and s[i].isspace():
            if cur:
                words.append("".join(cur))
                cur = []
        elif templates or not (depth[i] or bracket[i]):
            cur.append(s[i])
    if cur:
        words.append("".join(cur))
    if len(words) > 1 and any("::" in w for w in words):  # a return type (std::enable_if<...>::type, ...) before the name
        words = words[-1:]
    return " ".join(words) or s or name


def short_name(name: str, limit: int | None = 40, *, templates: bool = False) -> str:
    """``function_name`` cut to ``limit`` characters (the last one ``…``); a collective instance (``pos:GROUP:NAME#SEQ``)
    keeps its prefix and sequence number."""
    if name.startswith("pos:") and "#" in name:
        head, _, rest = name.partition(":")
        group, _, rest = rest.partition(":")
        body, _, seq = rest.rpartition("#")
        whole = f"{head}:{group}:{function_name(body, templates=templates)}"
        return f"{whole}#{seq}" if limit is None else shorten(whole, limit - len(seq) - 1) + f"#{seq}"
    short = function_name(name, templates=templates)
    return short if limit is None else shorten(short, limit)


def shorten(s: str, limit: int) -> str:
    """``s`` cut to ``limit`` characters, the last one an ellipsis where it was cut."""
    return s if len(s) <= limit else s[: max(1, limit - 1)] + "…"
