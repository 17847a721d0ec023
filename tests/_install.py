"""What an install of overlapviz brings (pyproject's dependencies, an extra's, what each requires), and a folder of
links to exactly those distributions of the running environment (test_base_install, test_collect_install)."""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def norm(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(*extras: str, build: bool = False) -> set[str]:
    """The (normalized) names of the distributions ``pip install '.[EXTRAS]'`` installs: pyproject's dependencies,
    those of ``extras``, with ``build`` the build system's, and what each of them requires (no extras of theirs
    unless asked for), as the running environment's metadata says; overlapviz itself included."""
    project = PYPROJECT["project"]
    specs = list(project["dependencies"]) + [r for e in extras for r in project["optional-dependencies"][e]]
    if build:
        specs += PYPROJECT["build-system"]["requires"]
    todo, seen = [(Requirement(s), ("",)) for s in specs], {"overlapviz"}
    while todo:
        req, asked = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in asked):
            continue
        name = norm(req.name)
        if name == "overlapviz":  # a self-reference (test: overlapviz[dashboard]): its extras' requirements
            todo += [(Requirement(r), ("",)) for e in req.extras for r in project["optional-dependencies"][e]]
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(req.name) or []
        except md.PackageNotFoundError:  # another platform's dependency (isal where it ships no wheel)
            continue
        todo += [(Requirement(r), ("", *sorted(req.extras))) for r in requires]
    return seen


def link_site(names: set[str], dst: Path) -> Path:
    """``dst`` holding a link to every top-level file and folder (packages, modules, .dist-info, .libs) of the
    distributions ``names`` installed here, overlapviz excepted: a folder to put on ``sys.path`` (a .pth) of another
    environment that should see those distributions and no other."""
    dst.mkdir(parents=True, exist_ok=True)
    for dist in md.distributions():
        if norm(dist.metadata["Name"]) not in names or norm(dist.metadata["Name"]) == "overlapviz":
            continue
        for top in {f.parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            link = dst / top
            if not link.exists():
                link.symlink_to(dist.locate_file(top))
    return dst
