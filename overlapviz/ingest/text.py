"""Text that is not valid UTF-8 in a trace: read as U+FFFD, everything else exact, and counted.

PyTorch records Python function names as it finds them, so a Kineto trace can hold raw
bytes that are not UTF-8 or JSON escapes of unpaired UTF-16 surrogates (``"\\udcff"``), and
SQLite exports can hold text columns that are not UTF-8. A JSON parser refuses the whole
document for one such name; ingest reads each bad sequence as U+FFFD and says once per
file how many strings it repaired (``REPAIRED_KEY`` in a rank's info).
"""

from __future__ import annotations

import re

__all__ = ["REPAIRED_KEY", "needs_repair", "repair_json_text", "repaired_message", "count_strings"]

REPAIRED_KEY = "repaired_strings"

# one site to repair, left to right: a run of bytes that are not UTF-8 (surrogateescape'd to
# U+DC80..U+DCFF), a \uD800-\uDBFF escape with or without its low half (kept when it has
# one), or a lone \uDC00-\uDFFF escape; an escape counts only after an even run of backslashes
_SITE = re.compile(
    r"(?P<bad>[\udc80-\udcff]+)"
    r"|(?<!\\)(?P<p1>(?:\\\\)*)\\u(?P<hi>[dD][89abAB][0-9a-fA-F]{2})(?P<lo>\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
    r"|(?<!\\)(?P<p2>(?:\\\\)*)\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_ESCAPE_HINT = re.compile(rb"\\u[dD][89a-fA-F]")
_UNESCAPED_QUOTE = re.compile(r'(?<!\\)"')


def needs_repair(raw: bytes) -> bool:
    """Whether ``raw`` holds bytes that are not UTF-8 or a JSON escape of a surrogate
    (paired ones too: ``repair_json_text`` then finds nothing to change)."""
    if _ESCAPE_HINT.search(raw):
        return True
    if raw.isascii():
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def repair_json_text(raw: bytes) -> tuple[bytes, int]:
    """JSON text with every invalid UTF-8 sequence and unpaired surrogate escape made U+FFFD.

    Returns the repaired bytes and the number of JSON strings that held something to repair
    (sites with no unescaped quote between them are one string). Valid text, paired
    surrogate escapes (``"\\ud83d\\ude00"``) and every other byte are kept as they are.
    """
    text = raw.decode("utf-8", "surrogateescape")
    sites: list[int] = []

    def fix(m: re.Match) -> str:
        if m.group("lo"):  # a surrogate pair: valid
            return m.group(0)
        sites.append(m.start())
        if m.group("bad"):
            return "\ufffd"
        return (m.group("p1") if m.group("hi") else m.group("p2")) + "\\ufffd"

    fixed = _SITE.sub(fix, text)
    if not sites:
        return raw, 0
    return fixed.encode("utf-8"), count_strings(text, sites)


def count_strings(text: str, sites: list[int]) -> int:
    """How many JSON strings the repair ``sites`` (offsets into ``text``, ascending) fall in."""
    n = 1
    for a, b in zip(sites, sites[1:]):
        if _UNESCAPED_QUOTE.search(text, a, b):
            n += 1
    return n


def repaired_message(shown: str, n: int) -> str:
    """The one warning line for a file with ``n`` repaired strings."""
    return (f"warning: {shown}: {n} string{'s' if n != 1 else ''} not valid UTF-8 "
            f"(bytes that are not UTF-8, unpaired surrogates) read with U+FFFD in their place")
