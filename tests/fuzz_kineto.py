"""Coverage-guided fuzzing of the Kineto scanner (``overlapviz.ingest._kineto.scan``) with atheris (libFuzzer).

Not a pytest module: ``.ci/sanitize`` runs it for a bounded time against a build of ``_kineto.c`` with
AddressSanitizer, UndefinedBehaviorSanitizer and gcc's coverage hooks (``-fsanitize-coverage=trace-pc,trace-cmp``),
atheris's ``asan_with_fuzzer.so`` preloaded (the libFuzzer that counts those hooks). By hand, after that build::

    python tests/fuzz_kineto.py --make-seeds CORPUS        # small real documents to start from
    python tests/fuzz_kineto.py -max_total_time=600 CORPUS

What must hold for every input: the scanner neither crashes nor trips a sanitizer; it reads the document or
raises ``Unsupported`` (handed to the Python reader) or ``BadArgs``; a document it reads is JSON the
standard library reads, with as many events as ``traceEvents`` holds, and its columns make Arrow tables.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import atheris

from overlapviz.ingest import _kineto, chrome_columns  # the C code is what is instrumented (at its build)

DATA = Path(__file__).parent / "data"
SEEDS = [DATA / "hostile" / "event_sync_trace.json.gz", DATA / "hostile" / "mi250_rocm62_kineto.json.gz"]
CATS, META_KEYS = chrome_columns._CATS, chrome_columns.META_KEYS


def check(data: bytes) -> None:
    try:
        out = _kineto.scan(data, CATS, META_KEYS)
    except (_kineto.Unsupported, _kineto.BadArgs):
        return
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AssertionError(f"the scanner read a document that is not JSON: {exc}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if isinstance(events, list):
        assert out["n_events"] == len(events), (out["n_events"], len(events))
    for cols, type_ in zip(out["buckets"], chrome_columns.BUCKET_TYPES, strict=True):
        chrome_columns._table(cols, type_).validate(full=True)


def make_seeds(corpus: Path) -> None:
    """Small documents cut from the real traces: each category's first events, and the metadata."""
    corpus.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(SEEDS):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        meta = {k: v for k, v in doc.items() if k != "traceEvents"}
        by_cat: dict[str, list] = {}
        for e in doc["traceEvents"]:
            by_cat.setdefault(str(e.get("cat")), []).append(e)
        for j, (cat, events) in enumerate(sorted(by_cat.items())):
            (corpus / f"seed{i}_{j}.json").write_text(json.dumps({**meta, "traceEvents": events[:3]}))
        (corpus / f"seed{i}_all.json").write_text(json.dumps({**meta, "traceEvents": [es[0] for es in by_cat.values()]}))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--make-seeds":
        make_seeds(Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
