"""The figure registry: every figure ``overlapviz export`` writes, its formats and paper sizes (no plotting import).

One list drives ``export --help``, ``export --all``, ``build_figure``'s check and the README's figure list, so a
figure is added in one place. Importing this module imports no plotting library.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FIGURES", "FORMATS", "Figure", "PAPER_SIZES", "PaperSize", "figure_list_markdown", "help_lines", "parse_length"]


@dataclass(frozen=True)
class Figure:
    """One exportable figure.

    Attributes
    ----------
    name
        The ``--figure`` value.
    summary
        What it shows, one line (``export --help``, the README, ``index.html``).
    scope
        ``"run"``: one figure per run; ``"pair"``: two runs (compare); ``"dataset"``: the whole dataset.
    """

    name: str
    summary: str
    scope: str = "run"


_FIGURES = (
    Figure("timeline", "kernels per rank and stream coloured by kind, step bands, each collective's wait by cause"),
    Figure("breakdown", "per rank, where communication time went: overlapped, peer wait, dependent, host idle, other"),
    Figure("why", "late-start time of the collectives by cause per rank, and the computation kernels that blocked them"),
    Figure("collectives", "collective instances across ranks: arrival per rank, arrival skew, peer wait"),
    Figure("ranks", "communication overlapped vs exposed and GPU span per rank, spans over the median marked"),
    Figure("residency", "resident computation blocks per SM of the busiest launch shapes, by limiting resource"),
    Figure("budget", "one SM's resources for one collective: what the resident computation holds, what a comm block needs"),
    Figure("heatmap", "TimeRatio, speedup or overlap over the configuration grid (shaping x setup)", "dataset"),
    Figure("speedup", "speedup over baseline overlap per configuration with its 95% interval", "dataset"),
    Figure("compare", "two runs' timelines on one time axis", "pair"),
)
FIGURES: dict[str, Figure] = {f.name: f for f in _FIGURES}
FORMATS = ("png", "svg", "pdf", "html")
STATIC_FORMATS = ("png", "svg", "pdf")


@dataclass(frozen=True)
class PaperSize:
    """A figure size for a paper: width and height in inches, the font size in points and the PNG resolution."""

    width_in: float
    height_in: float
    font_pt: float
    dpi: int = 300


# a two-column paper (IEEE, ACM, LNCS two-column): one column is about 3.3-3.5 in, the text width about 7-7.2 in
PAPER_SIZES = {"column": PaperSize(3.5, 2.6, 8.0), "page": PaperSize(7.16, 3.0, 9.0)}
PX_PER_IN = 96.0  # CSS pixels: a figure laid out at 96 px per inch prints its fonts at their point size
_UNITS = {"px": 1.0, "in": PX_PER_IN, "cm": PX_PER_IN / 2.54, "mm": PX_PER_IN / 25.4, "pt": PX_PER_IN / 72.0}


def parse_length(text: str) -> tuple[int, bool]:
    """A figure dimension as ``800``, ``800px``, ``3.5in``, ``8.9cm``, ``89mm`` or ``252pt``: (CSS pixels, whether it was
    given in a physical unit).

    Raises
    ------
    ValueError
        Not a positive number with one of those units.
    """
    t = str(text).strip().lower()
    unit = next((u for u in _UNITS if t.endswith(u)), "")
    try:
        value = float(t[: len(t) - len(unit)] if unit else t)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{text!r} is not a length (a positive number, optionally with px, in, cm, mm or pt)")
    return round(value * _UNITS[unit or "px"]), unit not in ("", "px")


def help_lines() -> str:
    """``name: summary`` of every figure, for ``export --help``."""
    return "\n".join(f"{f.name}: {f.summary}" for f in _FIGURES)


def figure_list_markdown() -> str:
    """The README's figure list (a markdown table), generated from the registry."""
    rows = ["| figure | what it shows | one file per |", "|---|---|---|"]
    per = {"run": "run", "pair": "pair of runs (`--run A --run B`)", "dataset": "dataset"}
    rows += [f"| `{f.name}` | {f.summary} | {per[f.scope]} |" for f in _FIGURES]
    return "\n".join(rows)
