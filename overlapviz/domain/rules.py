"""Kernel classification rules (comm / compute / memory / other) as data, stored with each dataset.

A rule set is an ordered list of rules; the first rule that matches an activity gives
its kind. A rule matches on the activity's source ``category`` (any of a list), its
``name`` (a case-insensitive regular expression, ``re.search``), or both. Activities
no rule matches are ``compute`` when they are GPU kernels and ``other`` otherwise.

The rules travel as JSON (``to_json`` / ``from_json``) in ``dataset.json`` and in each
run's ``kind_rules`` column, so an analysis can always say how a kernel was classified.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.dataset.schema import KINDS
from overlapviz.domain.vocabulary import joined, vocabulary

MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset", "memcpy", "memset", "memory_copy")
GPU_CATEGORIES = ("kernel",) + MEMORY_CATEGORIES
HOST_CATEGORIES = ("user_annotation", "cpu_op")
# every library's comm kernel patterns of vocabulary.toml (NCCL, RCCL, MSCCL(++), DeepEP,
# NVSHMEM, PyTorch symmetric memory, vLLM/SGLang custom all-reduce, TE userbuffers, ...) as one regex
COMM_PATTERN = joined(vocabulary().patterns("kernel"))


@dataclass(frozen=True)
class Rule:
    """One classification rule: ``kind`` for activities matching ``pattern`` and ``categories``."""

    kind: str
    pattern: str | None = None  # case-insensitive regex searched in the name; None matches any name
    categories: tuple[str, ...] = ()  # source categories; empty matches any category

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"rule kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"rule pattern {self.pattern!r} is not a regular expression: {exc}") from None
        object.__setattr__(self, "categories", tuple(self.categories))


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"rules": [{"kind": r.kind, "pattern": r.pattern, "categories": list(r.categories)} for r in self.rules]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "RuleSet":
        try:
            return cls(tuple(Rule(**r) for r in data["rules"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"kind rules are malformed: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> "RuleSet":
        return cls.from_dict(json.loads(text))

    def with_overrides(self, overrides: list[Rule]) -> "RuleSet":
        """Overrides come first, so they win over the defaults."""
        return RuleSet(tuple(overrides) + self.rules)

    def classify(self, names: pa.Array | list, categories: pa.Array | list) -> pa.Array:
        """Kinds for parallel arrays of names and categories (vectorized per rule).

        Each distinct (name, category) pair is classified once, so the cost follows the
        number of distinct kernel names rather than the number of events.
        """
        names = pa.array(names, pa.string()) if not isinstance(names, (pa.Array, pa.ChunkedArray)) else names
        categories = (
            pa.array(categories, pa.string()) if not isinstance(categories, (pa.Array, pa.ChunkedArray)) else categories
        )
        if len(names) == 0:
            return pa.array([], pa.string())
        # each distinct (name, category) pair once: both dictionary-encoded (nulls get an
        # entry of their own), the pair numbered by mixed radix
        name_codes, uniq_names = _encode(names)
        cat_codes, uniq_cats = _encode(categories)
        cats = uniq_cats.to_pylist()  # a handful of categories: kernel, cpu_op, gpu_memcpy, ...
        pairs, inverse = np.unique(name_codes * len(cats) + cat_codes, return_inverse=True)
        pair_name, pair_cat = pairs // len(cats), pairs % len(cats)
        kind = np.full(len(pairs), -1, dtype=np.int8)  # index into KINDS; -1: undecided
        name_hits: dict[str, np.ndarray] = {}  # pattern -> hit per distinct name
        for rule in self.rules:
            hit = kind < 0
            if rule.pattern is not None:
                if rule.pattern not in name_hits:
                    m = pc.match_substring_regex(uniq_names, rule.pattern, ignore_case=True)
                    name_hits[rule.pattern] = np.asarray(m.fill_null(False), dtype=bool)
                hit &= name_hits[rule.pattern][pair_name]
            if rule.categories:
                hit &= np.array([c in rule.categories for c in cats], dtype=bool)[pair_cat]
            kind[hit] = KINDS.index(rule.kind)
        is_gpu = np.array([c == "kernel" for c in cats], dtype=bool)[pair_cat]
        kind[(kind < 0) & is_gpu] = KINDS.index("compute")
        kind[kind < 0] = KINDS.index("other")
        return _kinds_array().take(pa.array(kind[inverse.ravel()]))


@functools.lru_cache(maxsize=1)
def _kinds_array() -> pa.Array:
    return pa.array(KINDS, pa.string())


def _encode(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """``(codes, distinct values)`` of a string column; a null is a value of its own."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    if values.type != pa.string():
        values = values.cast(pa.string())
    encoded = pc.dictionary_encode(values, null_encoding="encode")
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64), encoded.dictionary


def default_rules() -> RuleSet:
    """DESIGN.md's defaults, the communication names from the vocabulary (``vocabulary.toml``).

    GPU side: memcpy/memset are ``memory``; kernels a library marks as computing
    (DeepEP's ``get_dispatch_layout``) are ``compute``; kernels matching a library's comm
    patterns (``nccl|rccl|msccl|ovz_comm``, DeepEP, NVSHMEM, PyTorch symmetric memory,
    vLLM/SGLang custom all-reduce, TE userbuffers, ...; docs/ingest.md) are ``comm``; every
    other kernel is ``compute``. Host side (CPU-only traces, where host activities stand in
    for kernels): ``gloo:<collective>`` (and ``nccl:``/``rccl:``) ranges are ``comm``;
    top-level ``cpu_op``s are ``compute`` except the host halves of collectives
    (``c10d::``, ``record_param_comms``), which are ``other`` so they are not counted as
    computation.
    """
    vocab = vocabulary()
    not_comm = vocab.patterns("compute")
    return RuleSet(
        (
            Rule("memory", None, MEMORY_CATEGORIES),
            *((Rule("compute", joined(not_comm), ("kernel",)),) if not_comm else ()),
            Rule("comm", COMM_PATTERN, ("kernel",)),
            Rule("comm", joined(vocab.patterns("host")), HOST_CATEGORIES),
            Rule("other", r"^c10d::|^record_param_comms$|ProcessGroup|^ProfilerStep#", ("cpu_op", "user_annotation")),
            Rule("compute", None, ("cpu_op",)),
        )
    )


def parse_rule(text: str) -> Rule:
    """Parse a CLI rule ``KIND=REGEX`` or ``KIND=REGEX@cat1,cat2``."""
    kind, sep, rest = text.partition("=")
    if not sep or not kind:
        raise ValueError(f"rule {text!r} is not KIND=REGEX[@category,...]")
    pattern, at, cats = rest.rpartition("@") if "@" in rest else (rest, "", "")
    return Rule(kind.strip(), pattern or None, tuple(c for c in cats.split(",") if c) if at else ())
