"""Check a GPU machine before a sweep: build the kernels, check them, report footprints, occupancy and timings.

    python -P -m overlapviz.collectors.selfcheck [--json FILE]

Prints one table per topic; ``--json`` writes every number too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _time_ms(fn, reps: int = 10) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def selfcheck(pads=(0, 32768, 65536, 98304, 114688, 163840), sizes=(2048, 4096)) -> dict:
    """Build, check and time the collector kernels on the visible GPU; returns every number."""
    import torch

    from overlapviz.collectors import extension
    from overlapviz.collectors.config import TILES
    from overlapviz.collectors.manifest import device_row, versions
    from overlapviz.collectors.workload import standin_expected

    report: dict = {"versions": versions()}
    t0 = time.perf_counter()
    ext = extension.load()
    report["build_s"] = round(time.perf_counter() - t0, 1)
    report["device"] = device_row(0, ext)
    report["priority_range"] = list(torch.cuda.Stream.priority_range())
    report["priority_clamp"] = {p: torch.cuda.Stream(priority=p).priority for p in (0, -1, -2, -3, -5, -128)}
    names = [extension.gemm_kernel_name(*t) for t in TILES] + list(extension.STANDIN_KERNELS.values())
    report["kernels"] = {n: dict(ext.kernel_attributes(n)) for n in names}

    gen = torch.Generator(device="cuda").manual_seed(1)
    checks = {}
    for tm, tn, tk in TILES:
        for m, n, k in ((1000, 1100, 900), (512, 512, 8), (2048, 2048, 2048)):
            a = torch.randn(m, k, device="cuda", generator=gen)
            b = torch.randn(k, n, device="cuda", generator=gen)
            c = torch.full((m, n), float("nan"), device="cuda")
            ext.tiled_gemm(a, b, c, tm, tn, tk, 4096)
            ref = a.double() @ b.double()
            checks[f"{tm}x{tn}x{tk} {m}x{n}x{k}"] = float(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref))
    report["gemm_rel_err_vs_fp64"] = checks
    standin_ok = {}
    for coll in ("all_reduce", "all_to_all"):
        for ranks in (2, 3, 8):
            data = torch.randn(4 * 10007, device="cuda", generator=gen)
            peer = torch.randn_like(data)
            want = standin_expected(data, peer, ranks, coll)
            ext.standin(coll, data, peer, ranks, 5, 512, 23552, 0.0)
            standin_ok[f"{coll} n={ranks}"] = bool(torch.equal(data, want))
    report["standin_correct"] = standin_ok

    occ = {}
    for tm, tn, tk in TILES:
        name = extension.gemm_kernel_name(tm, tn, tk)
        for pad in pads:
            smem = ext.gemm_smem_bytes(tm, tn, tk, pad)
            if smem <= report["device"]["shared_mem_per_block_optin"]:
                occ[f"{name} pad={pad}"] = ext.blocks_per_sm(name, 256, smem)
    for name in extension.STANDIN_KERNELS.values():
        for threads in (512, 640):
            occ[f"{name} threads={threads}"] = ext.blocks_per_sm(name, threads, 23552)
    report["blocks_per_sm"] = occ

    timing = {}
    for size in sizes:
        a = torch.randn(size, size, device="cuda", generator=gen)
        b = torch.randn(size, size, device="cuda", generator=gen)
        c = torch.empty(size, size, device="cuda")
        flop = 2 * size**3
        for tm, tn, tk in TILES:
            for pad in (0, 65536, 114688):
                ms = _time_ms(lambda: ext.tiled_gemm(a, b, c, tm, tn, tk, pad))
                timing[f"tiled {tm}x{tn}x{tk} pad={pad} {size}^3"] = {"ms": ms, "tflops": flop / ms / 1e9}
        ms = _time_ms(lambda: torch.mm(a, b, out=c))
        timing[f"torch.mm fp32 {size}^3"] = {"ms": ms, "tflops": flop / ms / 1e9}
        ah, bh = a.bfloat16(), b.bfloat16()
        ms = _time_ms(lambda: torch.mm(ah, bh))
        timing[f"torch.mm bf16 {size}^3"] = {"ms": ms, "tflops": flop / ms / 1e9}
    m = 8192
    a = torch.randn(m, 8, device="cuda", generator=gen)
    b = torch.randn(8, m, device="cuda", generator=gen)
    c = torch.empty(m, m, device="cuda")
    ms = _time_ms(lambda: ext.tiled_gemm(a, b, c, 64, 64, 32, 0))
    timing[f"tiled 64x64x32 {m}x{m}x8 (memory-bound)"] = {"ms": ms, "write_TBps": m * m * 4 / ms / 1e9}
    for mib in (64, 256):
        data = torch.randn(mib << 18, device="cuda", generator=gen)
        peer = torch.randn_like(data)
        for gbps in (0.0, 200.0):
            for ctas in (16, 32):
                ms = _time_ms(lambda: ext.standin("all_reduce", data, peer, 8, ctas, 512, 23552, gbps), reps=5)
                moved = 2 * 7 * (mib << 20) / 8
                timing[f"stand-in all_reduce {mib} MiB n=8 ctas={ctas} link={gbps:g} GB/s"] = {
                    "ms": ms, "peer_GBps": moved / ms / 1e6}
    report["timing"] = timing
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m overlapviz.collectors.selfcheck", description=__doc__)
    p.add_argument("--json", help="write the full report here")
    args = p.parse_args(argv)
    report = selfcheck()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    dev = report["device"]
    print(f"{dev['name']} {dev['arch']} SMs={dev['num_sms']} versions={report['versions']} build={report['build_s']}s")
    print(f"priority range {report['priority_range']} clamp {report['priority_clamp']}")
    for name, attrs in report["kernels"].items():
        print(f"  {name}: regs={attrs['regs_per_thread']} static_smem={attrs['static_shared_mem_bytes']} "
              f"local={attrs['local_mem_bytes_per_thread']}")
    for topic in ("gemm_rel_err_vs_fp64", "standin_correct", "blocks_per_sm", "timing"):
        print(topic)
        for k, v in report[topic].items():
            print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
