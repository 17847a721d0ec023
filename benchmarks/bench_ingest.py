"""Ingest + overlap analysis: overlapviz against HTA on the same traces, in one run.

    .venv/bin/python benchmarks/bench_ingest.py            # everything (~10 min on 2 cores)
    .venv/bin/python benchmarks/bench_ingest.py --quick    # real traces only, no 1M set
    ... --json benchmarks/results/ingest_vs_hta.json        # also the result file the README's table is made of

For each trace set (the real Kineto traces in tests/data, and a generated set of 1M
kernels over 8 ranks) every side runs in a fresh subprocess, timed from outside (wall
time, including interpreter start-up and imports) while a sampler sums the resident
memory of the whole process tree (both sides fork workers) every 10 ms:

- ``overlapviz``: ``ingest(files) + analyze_table(dataset)`` (library calls, one process),
  with the C scanner and again without it (``OVERLAPVIZ_PURE_PYTHON=1``); then
  ``overlapviz analyze DATASET --format json`` (the CLI) and ``analyze_table()`` alone,
  each in a fresh process;
- ``HTA``: ``TraceAnalysis(trace_dir=...)`` + ``get_comm_comp_overlap(visualize=False)``
  in its own virtualenv (benchmarks/.venv-hta, created on first use with
  ``pip install holistictraceanalysis``), and once more with ``HTA_DISABLE_NS_ROUNDING=1``
  to tell HTA's µs rounding apart from definition differences (accuracy only);
- ``reference``: benchmarks/reference.py, an independent computation from the raw JSON
  (exact Decimal ns, plain sweep), against which both are scored.

Results: a markdown table on stdout and in benchmarks/out/results.md (+ results.json).
The script's top level imports only the standard library: HTA's interpreter runs it too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = ROOT / "tests" / "data"
HTA_VENV = HERE / ".venv-hta"
METRIC_KEYS = ("comm_us", "compute_us", "overlap_us", "overlap_fraction", "exposed_comm_us", "span_us",
               "busy_us", "idle_us", "memory_us", "n_kernels", "n_comm_kernels")  # fmt: skip

REAL_SETS = {  # name -> files (one directory per set is staged: HTA wants a trace_dir)
    "hta_trace_filter_2rank": sorted((DATA / "hta_trace_filter_2rank").glob("*.json.gz")),
    "hta_nccl_parser_config": sorted((DATA / "hta_nccl_parser_config").glob("*.json.gz")),
    "rocm_resnet_act_checkpoint": [DATA / "torch_rocm" / "resnet_act_checkpoint.json.gz"],
    "rocm_bert_small": [DATA / "torch_rocm" / "gaunernst_bert-small-uncased__1016001.json.gz"],
    "rocm_gpu_only": [DATA / "torch_rocm" / "gpu_only_trace.json.gz"],
    "gloo_cpu_2rank": sorted((DATA / "gloo_cpu").glob("*.json.gz")),
}


# --- measuring a subprocess ----------------------------------------------------------


def _tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (Linux /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return total


def measure(cmd: list[str], *, env: dict | None = None, timeout: float = 900) -> dict:
    """Run ``cmd``; wall seconds, CPU seconds, peak tree RSS (sampled), exit code, and its stdout/stderr tails.

    CPU seconds (user + system of the process and every descendant it waited for, both tools'
    workers included) move less than wall time when other jobs share the cores.
    """
    import resource

    peak = [0]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT, text=True)
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        rc = "timeout"
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    done.set()
    sampler.join()
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak[0] / 2**20, "rc": rc, "stdout": out, "stderr": err[-2000:]}


def _last_json(text: str):
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{") or line.startswith("["):
            return json.loads(line)
    raise ValueError("no JSON result line")


# --- workers (run in fresh interpreters) -----------------------------------------------


def worker_ours(src: str, dataset: str) -> None:
    t0 = time.perf_counter()
    from overlapviz.ingest import chrome_columns, ingest
    from overlapviz.analysis.metrics import analyze_table

    t1 = time.perf_counter()
    ingest([src], dataset, overwrite=True, progress=False)
    t2 = time.perf_counter()
    table = analyze_table(dataset)  # what `overlapviz analyze` computes (no pandas)
    t3 = time.perf_counter()
    records = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in table.to_pylist()]
    print(json.dumps({"import_s": t1 - t0, "ingest_s": t2 - t1, "analyze_s": t3 - t2, "records": records,
                      "c_scanner": chrome_columns.available(), "pandas": "pandas" in sys.modules}))  # fmt: skip


def worker_ours_analyze(dataset: str) -> None:
    t0 = time.perf_counter()
    from overlapviz.analysis.metrics import analyze_table

    t1 = time.perf_counter()
    frame = analyze_table(dataset)
    t2 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "analyze_s": t2 - t1, "rows": len(frame)}))


def worker_profile(src: str, dataset: str) -> None:
    """cProfile of ``ingest`` (one worker, so the parse shows up) and of ``analyze``: the top functions by own time."""
    import cProfile
    import io
    import pstats

    from overlapviz.ingest import ingest
    from overlapviz.analysis.metrics import analyze_table

    for label, call in (
        ("ingest(workers=1)", lambda: ingest([src], dataset, overwrite=True, progress=False, workers=1)),
        ("analyze_table", lambda: analyze_table(dataset)),
    ):
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        call()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
        body = buf.getvalue()
        body = body[body.index("   ncalls"):] if "   ncalls" in body else body
        print(f"### {label}: {time.perf_counter() - t0:.2f} s (under the profiler)\n\n```\n{body.rstrip()}\n```\n")


def worker_hta(src: str) -> None:
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    t1 = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=src)
    t2 = time.perf_counter()
    frame = analysis.get_comm_comp_overlap(visualize=False)
    t3 = time.perf_counter()
    result = {str(int(r)): float(p) for r, p in zip(frame["rank"], frame["comp_comm_overlap_pctg"])}
    print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "overlap_s": t3 - t2, "pctg": result}))


# --- orchestration ----------------------------------------------------------------------


def ensure_hta(python: Path, setup: bool) -> tuple[Path | None, str]:
    """HTA's interpreter, creating benchmarks/.venv-hta on first use; (None, why) when unusable."""
    if not python.exists() and setup:
        print(f"creating {HTA_VENV} and installing holistictraceanalysis ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=False)
        # HTA 0.5.0 (2025-05) predates pandas 3: under pandas 3.1 its parser fails on ROCm traces
        # ("TypeError: Invalid value ... for dtype"), so its venv gets the pandas 2 it was built on
        r = subprocess.run([str(python), "-m", "pip", "install", "-q", "holistictraceanalysis", "pandas<3"],
                           capture_output=True, text=True)  # fmt: skip
        if r.returncode:
            return None, f"pip install holistictraceanalysis failed: {r.stderr.strip().splitlines()[-1:]}"
    if not python.exists():
        return None, f"{python} does not exist"
    r = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('holistictraceanalysis'), "
         "m.version('pandas'), m.version('numpy'))"],
        capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode:
        return None, f"HTA does not import: {r.stderr.strip().splitlines()[-1:]}"
    hta, pd_v, np_v = r.stdout.split()
    return python, f"HTA {hta} (pandas {pd_v}, numpy {np_v})"


def stage(name: str, files: list[Path], out: Path) -> Path:
    d = out / "traces" / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for f in files:
        shutil.copy2(f, d / f.name)
    return d


def generate(out: Path, n_kernels: int, ranks: int) -> Path:
    """Generated trace set (cached: regenerated only when the stamp differs)."""
    d = out / "traces" / f"generated_{n_kernels // 1000}k_{ranks}r"
    stamp = d.with_name(d.name + ".stamp")  # beside, not inside: HTA reads every file in the dir
    want = json.dumps({"n_kernels": n_kernels, "ranks": ranks, "seed": 0, "v": 2})
    if stamp.exists() and stamp.read_text() == want:
        return d
    from overlapviz.testing import generate_trace, write_trace

    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    per = n_kernels // ranks
    t0 = time.perf_counter()
    for r in range(ranks):
        # indented like torch's export_chrome_trace; HTA finds a file's rank with the regex
        # '"rank":\\s+(\\d+)', which compact JSON does not match (every file would be rank 0)
        write_trace(generate_trace(per, rank=r, world_size=ranks, seed=0), d / f"rank{r}.json.gz", pretty=True)
    print(f"generated {d.name} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    stamp.write_text(want)
    return d


def _rel(a, b) -> float:
    if a is None or b is None:
        return 0.0 if a is None and b is None else float("inf")
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(b), 1e-300)


def score_ours(records: list[dict], ref: dict[int, dict]) -> float:
    """Max relative error of every metric of every rank; ranks matched by number (single rank: by position)."""
    worst = 0.0
    if len(records) != len(ref):
        return float("inf")
    for rec in records:
        r = ref.get(int(rec["rank"])) if len(ref) > 1 else next(iter(ref.values()))
        if r is None:
            return float("inf")
        for k in METRIC_KEYS:
            worst = max(worst, _rel(rec.get(k), r[k]))
    return worst


def score_hta(pctg: dict[str, float], ref: dict[int, dict]) -> float:
    worst = 0.0
    for rank, p in pctg.items():
        r = ref.get(int(rank)) if len(ref) > 1 else next(iter(ref.values()))
        want = None if r is None else r["overlap_fraction"]
        got = None if p != p else p / 100  # NaN: HTA divides 0 by 0 when there is no comm
        worst = max(worst, _rel(got, want))
    return worst


def abs_err_hta(pctg: dict[str, float], hta_ref: dict[str, dict]) -> float:
    """Largest |HTA - HTA's rules re-derived| in overlap ratio (HTA reports 0.01 %-points)."""
    worst = 0.0
    for rank, p in pctg.items():
        want = (hta_ref.get(rank) or {}).get("overlap_fraction")
        got = None if p != p else p / 100
        if (got is None) != (want is None):
            return float("inf")
        if got is not None:
            worst = max(worst, abs(got - want))
    return worst


def median_run(cmd, repeat, **kw) -> dict:
    runs = [measure(cmd, **kw) for _ in range(repeat)]
    ok = [r for r in runs if r["rc"] == 0]
    if not ok:
        return runs[-1]
    best = dict(ok[0])
    best["wall_s"] = statistics.median(r["wall_s"] for r in ok)
    best["cpu_s"] = statistics.median(r["cpu_s"] for r in ok)
    best["calls_s"] = statistics.median(_calls_s(r["stdout"]) for r in ok)
    best["ingest_s"] = statistics.median(_calls_s(r["stdout"], "ingest_s") for r in ok)
    best["peak_rss_mb"] = max(r["peak_rss_mb"] for r in ok)
    best["stdout"] = ok[-1]["stdout"]
    return best


def _calls_s(stdout: str, *keys: str) -> float:
    """The library calls' seconds a worker printed (ours: ingest + analyze; HTA: load + overlap)."""
    r = _last_json(stdout)
    r = r if isinstance(r, dict) else {}  # the CLI prints a list
    return sum(r.get(k, 0) for k in keys or ("ingest_s", "analyze_s", "load_s", "overlap_s"))


def bench_set(name: str, src: Path, out: Path, hta_python: Path | None, repeat: int, *, big: bool) -> dict:
    sys.path.insert(0, str(HERE))
    import reference

    me = [sys.executable, str(Path(__file__).resolve())]
    dataset = out / "datasets" / name
    dataset.parent.mkdir(parents=True, exist_ok=True)
    row: dict = {"set": name, "files": len(list(src.iterdir())), "bytes": sum(f.stat().st_size for f in src.iterdir())}
    print(f"[{name}] overlapviz ingest + analyze ...", file=sys.stderr)
    ours = median_run(me + ["--worker", "ours", "--src", str(src), "--dataset", str(dataset)], repeat)
    if ours["rc"] != 0:
        row["ours_error"] = ours["stderr"].strip().splitlines()[-1:] or [str(ours["rc"])]
        return row
    res = _last_json(ours["stdout"])
    row.update(ours_wall_s=ours["wall_s"], ours_rss_mb=ours["peak_rss_mb"], ours_ingest_s=ours["ingest_s"],
               ours_analyze_s=res["analyze_s"], ours_import_s=res["import_s"], ours_cpu_s=ours["cpu_s"],
               ours_calls_s=ours["calls_s"])  # fmt: skip
    row["c_scanner"] = res.get("c_scanner")
    row["pandas_imported"] = res.get("pandas")
    # the same without the C scanner: what a machine that could not build it gets
    pure = median_run(me + ["--worker", "ours", "--src", str(src), "--dataset", str(dataset)], repeat,
                      env=dict(os.environ, OVERLAPVIZ_PURE_PYTHON="1"))  # fmt: skip
    if pure["rc"] == 0:
        row.update(pure_calls_s=pure["calls_s"], pure_rss_mb=pure["peak_rss_mb"], pure_cpu_s=pure["cpu_s"])
    records = res["records"]
    row["kernels"] = sum(r["n_kernels"] for r in records)
    row["ranks"] = len(records)
    import pyarrow.parquet as pq  # only for the event count ingest recorded

    row["events"] = int(sum(pq.read_table(dataset / "ranks.parquet", columns=["n_events"]).column(0).to_pylist()))

    cli = median_run([str(Path(sys.executable).with_name("overlapviz")), "analyze", str(dataset), "--format", "json"],
                     repeat)  # fmt: skip
    row["cli_analyze_wall_s"] = cli["wall_s"] if cli["rc"] == 0 else None
    lib = median_run(me + ["--worker", "ours-analyze", "--dataset", str(dataset)], repeat)
    if lib["rc"] == 0:
        r = _last_json(lib["stdout"])
        row.update(lib_analyze_wall_s=lib["wall_s"], lib_analyze_call_s=r["analyze_s"], lib_analyze_rss_mb=lib["peak_rss_mb"])

    print(f"[{name}] reference ...", file=sys.stderr)
    t0 = time.perf_counter()
    ref = {}
    # HTA's own rules too (see reference.hta_rules_fraction), to score HTA like with like
    hta_ref, hta_ref_exact = {}, {}
    for i, f in enumerate(sorted(src.iterdir())):
        doc = reference.load(f)
        rank = int((doc.get("distributedInfo") or {}).get("rank", i))
        ref[rank] = reference.metrics(reference.activities(doc))
        hta_ref[str(rank)] = {"overlap_fraction": reference.hta_rules_fraction(doc)}
        hta_ref_exact[str(rank)] = {"overlap_fraction": reference.hta_rules_fraction(doc, round_to_us=False)}
        del doc
    row["reference_s"] = time.perf_counter() - t0
    row["ours_max_rel_err"] = score_ours(records, ref)
    row["reference"] = {str(k): v for k, v in ref.items()}
    row["ours"] = records

    if hta_python is not None:
        print(f"[{name}] HTA ...", file=sys.stderr)
        hta_cmd = [str(hta_python), str(Path(__file__).resolve()), "--worker", "hta", "--src", str(src)]
        env = {k: v for k, v in os.environ.items() if k != "HTA_DISABLE_NS_ROUNDING"}
        hta = median_run(hta_cmd, repeat, env=env, timeout=1800)
        if hta["rc"] == 0:
            h = _last_json(hta["stdout"])
            row.update(hta_cpu_s=hta["cpu_s"], hta_calls_s=hta["calls_s"])
            row.update(hta_wall_s=hta["wall_s"], hta_rss_mb=hta["peak_rss_mb"], hta_load_s=h["load_s"],
                       hta_overlap_s=h["overlap_s"], hta_pctg=h["pctg"], hta_rel_err=score_hta(h["pctg"], ref),
                       hta_vs_hta_rules_abs_err=abs_err_hta(h["pctg"], hta_ref))  # fmt: skip
            row["speedup_vs_hta"] = hta["wall_s"] / row["ours_wall_s"]
            row["call_speedup_vs_hta"] = hta["calls_s"] / ours["calls_s"]  # medians of the repeats
            if row.get("pure_calls_s"):
                row["pure_call_speedup_vs_hta"] = hta["calls_s"] / row["pure_calls_s"]
            row["mem_ratio_vs_hta"] = hta["peak_rss_mb"] / row["ours_rss_mb"]
        else:
            tail = (hta["stderr"] or "").strip().splitlines()
            row["hta_error"] = f"rc={hta['rc']}: {tail[-1] if tail else ''}"
        if not big:
            exact = measure(hta_cmd, env=env | {"HTA_DISABLE_NS_ROUNDING": "1"})
            if exact["rc"] == 0:
                h = _last_json(exact["stdout"])
                row["hta_noround_pctg"] = h["pctg"]
                row["hta_noround_rel_err"] = score_hta(h["pctg"], ref)
                row["hta_noround_vs_hta_rules_abs_err"] = abs_err_hta(h["pctg"], hta_ref_exact)
    return row


def _fmt(v, spec=".3g", none="-"):
    if v is None:
        return none
    if isinstance(v, float) and v == float("inf"):
        return "mismatch"
    return format(v, spec)


def report(rows: list[dict], info: dict) -> str:
    lines = [
        "# overlapviz vs HTA: ingest + overlap",
        "",
        f"Machine: {info['machine']}. {info['hta']}.",
        f"Command: `{info['command']}` ({info['date']}; load average {info['load_before']} before, "
        f"{info['load_after']} after: the 2 cores are shared, so times vary with the load).",
        "",
        "Each measurement is a fresh process (median of the repeats). *wall*: the whole process, start-up and",
        "imports included. *calls*: inside the process, overlapviz `ingest()` + `analyze_table()` (what",
        "`overlapviz analyze` computes) against HTA `TraceAnalysis()` + `get_comm_comp_overlap()`; each side's",
        "package is imported before the clock starts. *pure-Python*: ours again with `OVERLAPVIZ_PURE_PYTHON=1`",
        "(no C scanner: what an install without a C compiler gets). *CPU*: user + system seconds of the whole",
        "process tree (both fork workers), less sensitive than wall time to other jobs on the cores. *peak MB*:",
        "resident memory of the whole process tree, sampled every 10 ms.",
        "",
        "| trace set | ranks | kernels | trace events | ours wall s | HTA wall s | wall speed-up | ours calls s |"
        " HTA calls s | calls speed-up | pure-Python calls s (speed-up) | ours CPU s | HTA CPU s | CPU ratio |"
        " ours peak MB | HTA peak MB | ingest events/s | analyze() s | analyze CLI s |",
        "|---" * 19 + "|",
    ]
    for r in rows:
        if "ours_error" in r:
            lines.append(f"| {r['set']} | ours failed: {r['ours_error']} |" + " |" * 17)
            continue
        calls = r.get("ours_calls_s") or r["ours_ingest_s"] + r["ours_analyze_s"]
        hta_calls = r.get("hta_calls_s") or (r["hta_load_s"] + r["hta_overlap_s"] if "hta_load_s" in r else None)
        cpu_ratio = r["hta_cpu_s"] / r["ours_cpu_s"] if r.get("hta_cpu_s") and r.get("ours_cpu_s") else None
        eps = r["events"] / r["ours_ingest_s"] if r.get("ours_ingest_s") else None
        hta_wall = _fmt(r.get("hta_wall_s"), ".2f") if "hta_error" not in r else f"failed: {r['hta_error'][:70]}"
        lines.append(
            f"| {r['set']} | {r['ranks']} | {r['kernels']:,} | {r['events']:,} | {_fmt(r['ours_wall_s'], '.2f')} |"
            f" {hta_wall} | {_fmt(r.get('speedup_vs_hta'), '.1f')}x | {_fmt(calls, '.3f')} | {_fmt(hta_calls, '.3f')} |"
            f" {_fmt(r.get('call_speedup_vs_hta'), '.1f')}x | {_fmt(r.get('pure_calls_s'), '.3f')}"
            f" ({_fmt(r.get('pure_call_speedup_vs_hta'), '.1f')}x) | {_fmt(r.get('ours_cpu_s'), '.2f')} | {_fmt(r.get('hta_cpu_s'), '.2f')} |"
            f" {_fmt(cpu_ratio, '.1f')}x | {_fmt(r['ours_rss_mb'], '.0f')} |"
            f" {_fmt(r.get('hta_rss_mb'), '.0f')} | {_fmt(eps, ',.0f')} | {_fmt(r.get('lib_analyze_call_s'), '.3f')} |"
            f" {_fmt(r.get('cli_analyze_wall_s'), '.2f')} |"
        )
    lines += [
        "",
        "Accuracy. *ours*: largest relative error of any metric of any rank against benchmarks/reference.py (an",
        "independent computation of DESIGN.md from the raw JSON, exact ns). *HTA vs DESIGN*: relative error of",
        "HTA's overlap ratio against the same reference. *HTA vs HTA's rules*: absolute error of HTA's ratio",
        "against reference.hta_rules_fraction (DESIGN.md's sweep under HTA's own filtering, kind regexes and",
        "µs rounding); HTA reports a percentage rounded to 0.01, so up to 5e-5 is agreement.",
        "",
        "| trace set | ours max rel err | HTA vs DESIGN rel err | HTA vs HTA's rules abs err |"
        " HTA (HTA_DISABLE_NS_ROUNDING=1) vs its rules without rounding |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "ours_error" in r:
            continue
        hta_nan = r.get("hta_pctg") and all(p != p for p in r["hta_pctg"].values())
        ref_null = all(v["overlap_fraction"] is None for v in r["reference"].values())
        if hta_nan and ref_null:
            hta_err = "both null (no comm)"
        elif hta_nan:
            hta_err = "no result (NaN)"
        else:
            hta_err = _fmt(r.get("hta_rel_err"), ".1e")
        lines.append(
            f"| {r['set']} | {_fmt(r['ours_max_rel_err'], '.1e')} | {hta_err} |"
            f" {_fmt(r.get('hta_vs_hta_rules_abs_err'), '.1e')} | {_fmt(r.get('hta_noround_vs_hta_rules_abs_err'), '.1e')} |"
        )
    lines += ["", "overlap_fraction per rank (reference / ours / HTA):", ""]
    for r in rows:
        if "reference" not in r:
            continue
        parts = []
        for rank, ref in sorted(r["reference"].items(), key=lambda kv: int(kv[0])):
            ours = next((o for o in r["ours"] if str(o["rank"]) == rank), r["ours"][0] if len(r["ours"]) == 1 else {})
            hta = (r.get("hta_pctg") or {}).get(rank)
            parts.append(
                f"rank {rank}: {_fmt(ref['overlap_fraction'], '.6f')} / {_fmt(ours.get('overlap_fraction'), '.6f')}"
                f" / {_fmt(None if hta is None or hta != hta else hta / 100, '.4f')}"
            )
        lines.append(f"- {r['set']}: " + "; ".join(parts[:8]) + (" ..." if len(parts) > 8 else ""))
    big = [r for r in rows if r.get("big") and "ours_error" not in r]
    if big:
        r = big[0]
        lines += [
            "",
            f"Targets on {r['set']} ({r['kernels']:,} kernels, {r['ranks']} ranks, {r['events']:,} trace events):",
            f"- ingest < 15 s: `ingest()` {r['ours_ingest_s']:.2f} s "
            f"({'met' if r['ours_ingest_s'] < 15 else 'MISSED'}); whole process with imports and analyze {r['ours_wall_s']:.2f} s",
            f"- analyze < 1 s: `analyze_table()` {r.get('lib_analyze_call_s', float('nan')):.3f} s"
            f" ({'met' if r.get('lib_analyze_call_s', 99) < 1 else 'MISSED'}); fresh process with imports"
            f" {_fmt(r.get('lib_analyze_wall_s'), '.2f')} s; `overlapviz analyze --format json` {_fmt(r.get('cli_analyze_wall_s'), '.2f')} s",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(HERE / "out"))
    ap.add_argument("--hta-python", default=str(HTA_VENV / "bin" / "python"))
    ap.add_argument("--no-hta", action="store_true", help="skip HTA")
    ap.add_argument("--no-setup", action="store_true", help="do not create the HTA virtualenv when missing")
    ap.add_argument("--n-kernels", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="repeats per measurement on the real traces (median)")
    ap.add_argument("--big-repeat", type=int, default=1, help="repeats on the generated set, HTA included (median)")
    ap.add_argument("--quick", action="store_true", help="real traces only (no generated set)")
    ap.add_argument("--sets", nargs="*", help="only these real trace sets")
    ap.add_argument("--profile", action="store_true", help="append a cProfile of ingest/analyze of one generated rank")
    ap.add_argument("--worker", choices=["ours", "ours-analyze", "hta", "profile"], help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--dataset", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the result here (format: benchmarks/readme_table.py)")
    args = ap.parse_args()
    if args.worker == "ours":
        return worker_ours(args.src, args.dataset)
    if args.worker == "ours-analyze":
        return worker_ours_analyze(args.dataset)
    if args.worker == "hta":
        return worker_hta(args.src)
    if args.worker == "profile":
        return worker_profile(args.src, args.dataset)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hta_python, hta_info = (None, "HTA skipped") if args.no_hta else ensure_hta(Path(args.hta_python), not args.no_setup)
    # pip compiles an installed package's bytecode (HTA's venv has it); an editable checkout
    # under PYTHONDONTWRITEBYTECODE would recompile every module in every fresh process
    import compileall

    compileall.compile_dir(str(HERE.parent / "overlapviz"), quiet=1)
    info = {
        "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, Python {platform.python_version()}",
        "hta": hta_info,
        "command": ".venv/bin/python benchmarks/bench_ingest.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": "%.1f" % os.getloadavg()[0],
    }
    rows = []
    for name, files in REAL_SETS.items():
        if args.sets and name not in args.sets:
            continue
        if not files or not all(f.exists() for f in files):
            print(f"[{name}] missing from tests/data, skipped", file=sys.stderr)
            continue
        rows.append(bench_set(name, stage(name, files, out), out, hta_python, args.repeat, big=False))
    if not args.quick:
        src = generate(out, args.n_kernels, args.ranks)
        row = bench_set(src.name, src, out, hta_python, args.big_repeat, big=True)
        row["big"] = True
        rows.append(row)
    info["load_after"] = "%.1f" % os.getloadavg()[0]
    text = report(rows, info)
    if args.profile:
        src = generate(out, args.n_kernels, args.ranks)
        one = out / "traces" / "profile_one_rank"
        stage("profile_one_rank", [sorted(src.glob("*.json*"))[0]], out)
        r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", "profile", "--src", str(one),
                            "--dataset", str(out / "datasets" / "profile_one_rank")], capture_output=True, text=True)  # fmt: skip
        text += f"\n## Profile: one generated rank ({args.n_kernels // args.ranks:,} kernels)\n\n" + (r.stdout or r.stderr[-2000:])
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1, default=str))
    print(text)
    if args.json:
        write_summary(args.json, rows, info)


def write_summary(path: str, rows: list[dict], info: dict) -> None:
    """The README's part of the result: per trace set, whole-process wall time and peak memory beside HTA's."""
    import readme_table

    hta = info["hta"].split(" (")[0]
    out = []
    for r in rows:
        if "ours_error" in r:
            continue
        what = f"{r['set']} ({r['ranks']} rank{'s' * (r['ranks'] != 1)}, {r['events']:,} events)"
        ok = "hta_error" not in r
        vs = {"baseline_label": hta if ok else None}
        out.append(readme_table.row(f"ingest + overlap calls, {what}", r["ours_calls_s"], "s",
                                    baseline=r.get("hta_calls_s") if ok else None, target=">= 10x faster than HTA", **vs))  # fmt: skip
        out.append(readme_table.row(f"whole process (start-up, imports), {what}", r["ours_wall_s"], "s",
                                    baseline=r.get("hta_wall_s") if ok else None, **vs))  # fmt: skip
        out.append(readme_table.row(f"peak memory, {what}", r["ours_rss_mb"], "MB", baseline=r.get("hta_rss_mb") if ok else None,
                                    target="below HTA", **vs))  # fmt: skip
        if r.get("big"):
            out.append(readme_table.row(f"ingest(), {what}", r["ours_ingest_s"], "s", target="< 15 s"))
            out.append(readme_table.row(f"analyze_table(), {what}", r.get("lib_analyze_call_s"), "s", target="< 1 s"))
    readme_table.write(path, "ingest_vs_hta", "Ingest + overlap against HTA", out, load_before=float(info["load_before"]),
                       note="Each side in fresh processes, medians of the repeats: *calls* times overlapviz `ingest()` + "
                            "`analyze_table()` against HTA `TraceAnalysis()` + `get_comm_comp_overlap()` (its own virtualenv) "
                            "inside the process, *whole process* from outside; peak: resident memory of the process tree, "
                            "sampled every 10 ms. The full table (CPU, pure-Python, accuracy) is benchmarks/out/results.md.")  # fmt: skip


if __name__ == "__main__":
    main()
