"""Does a kernel launched second fit beside a resident one within the resident one's carve-out? (H200 probe)

For tests/data/carveout_coresidency_h200/: kernel A ("hold") fills the SMs with its blocks
(each spins for HOLD_NS on %globaltimer); 0.5 ms later kernel B ("probe") is launched on a
second stream and each of its blocks records when it started. B's blocks that start before
A's first block ends ran *beside* A. A's shared memory, grid and carve-out preference vary;
B's shared memory varies. Run on a GPU with CuPy:

    PYTHONUNBUFFERED=1 python3 tests/data/carveout_coresidency_h200/probe.py --out DIR
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import sys
import time
from pathlib import Path

SOURCE = r"""
extern "C" __global__ void hold(unsigned long long hold_ns, unsigned long long* t, unsigned int* sm) {
    unsigned long long t0, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    now = t0;
    while (now - t0 < hold_ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        t[2 * blockIdx.x] = t0; t[2 * blockIdx.x + 1] = now; sm[blockIdx.x] = s;
    }
}
extern "C" __global__ void probe(unsigned long long* t, unsigned int* sm) {
    if (threadIdx.x == 0) {  // its dynamic shared memory is only reserved, never touched (it may be 0 B)
        unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        unsigned int s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        t[blockIdx.x] = t0; sm[blockIdx.x] = s;
    }
}
"""
HOLD_NS = 4_000_000
NUM_REGS, MAX_DYN, CARVEOUT = 4, 8, 9  # CUfunction_attribute
# (case, A threads, A dynamic smem, A grid per SM, A carve-out preference (-1: none), B threads, B dynamic smem,
#  B carve-out preference)
CASES = [
    ("a1blk_132096_b24576", 256, 131072, 1, -1, 128, 23552, -1),
    ("a1blk_132096_b24576_pref100", 256, 131072, 1, 100, 128, 23552, -1),
    ("a1of3_70016_b40960", 256, 68992, 1, -1, 128, 39936, -1),
    ("a1of3_70016_b32768", 256, 68992, 1, -1, 128, 31744, -1),
    ("a4blk_50176_b8192", 256, 49152, 4, -1, 128, 7168, -1),
    ("a4blk_50176_b8192_pref100", 256, 49152, 4, 100, 128, 7168, -1),
    ("a5blk_40960_b16384", 256, 39936, 5, -1, 128, 15360, -1),
    ("a5blk_40960_b32768", 256, 39936, 5, -1, 128, 31744, -1),
    ("a2blk_82944_b1024", 256, 81920, 2, -1, 128, 0, -1),
    ("a2blk_82944_b3072", 256, 81920, 2, -1, 128, 2048, -1),
    ("a3blk_40960_pref50_b8192", 256, 39936, 3, 50, 128, 7168, -1),
    ("a3blk_40960_pref50_b16384", 256, 39936, 3, 50, 128, 15360, -1),
    ("a1of8_1024_b6144", 256, 0, 1, -1, 128, 5120, -1),
    ("a1of8_1024_b8192", 256, 0, 1, -1, 128, 7168, -1),
    # the second kernel's own carve-out: does it join an SM whose configuration is below its own?
    ("a1of4_50176_b24576", 256, 49152, 1, -1, 128, 23552, -1),
    ("a1of4_50176_b16384", 256, 49152, 1, -1, 128, 15360, -1),
    ("a1of4_50176_b12288", 256, 49152, 1, -1, 128, 11264, -1),
    ("a1of8_1024_b1024", 256, 0, 1, -1, 128, 0, -1),
    ("a1of8_1024_b6144_bpref0", 256, 0, 1, -1, 128, 5120, 0),
    ("a1of4_50176_b24576_bpref0", 256, 49152, 1, -1, 128, 23552, 0),
]
REPS = 3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    import cupy

    lib = ctypes.CDLL("libcuda.so.1")

    def set_attr(func, attr, value):
        st = lib.cuFuncSetAttribute(ctypes.c_void_p(func), attr, ctypes.c_int(value))
        if st != 0:
            raise RuntimeError(f"cuFuncSetAttribute({attr}, {value}) failed: CUresult {st}")

    def get_attr(func, attr):
        v = ctypes.c_int()
        st = lib.cuFuncGetAttribute(ctypes.byref(v), attr, ctypes.c_void_p(func))
        if st != 0:
            raise RuntimeError(f"cuFuncGetAttribute({attr}) failed: CUresult {st}")
        return v.value

    def occupancy(func, threads, dyn):
        v = ctypes.c_int(-1)
        st = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(v), ctypes.c_void_p(func), threads, ctypes.c_size_t(dyn))
        return v.value if st == 0 else None

    mod = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
    hold, probe = mod.get_function("hold"), mod.get_function("probe")
    fa, fb = int(hold.kernel.ptr if hasattr(hold, "kernel") else hold.ptr), int(probe.kernel.ptr if hasattr(probe, "kernel") else probe.ptr)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    sms = props["multiProcessorCount"]
    optin = props["sharedMemPerBlockOptin"]
    set_attr(fa, MAX_DYN, optin)
    set_attr(fb, MAX_DYN, optin)
    sa, sb = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    rows = []
    for case, at, adyn, aper, apref, bt, bdyn, bpref in CASES:
        set_attr(fa, CARVEOUT, apref)
        set_attr(fb, CARVEOUT, bpref)
        occ_a = occupancy(fa, at, adyn)
        grid_a, grid_b = aper * sms, sms
        for rep in range(REPS):
            ta = cupy.zeros(2 * grid_a, dtype=cupy.uint64)
            sma = cupy.zeros(grid_a, dtype=cupy.uint32)
            tb = cupy.zeros(grid_b, dtype=cupy.uint64)
            smb = cupy.zeros(grid_b, dtype=cupy.uint32)
            cupy.cuda.Device().synchronize()
            hold((grid_a,), (at,), (cupy.uint64(HOLD_NS), ta, sma), shared_mem=adyn, stream=sa)
            time.sleep(0.0005)  # A's blocks are all placed before B arrives
            probe((grid_b,), (bt,), (tb, smb), shared_mem=bdyn, stream=sb)
            cupy.cuda.Device().synchronize()
            a = ta.get().reshape(-1, 2).astype("int64")
            b = tb.get().astype("int64")
            a_first_end, a_last_start = int(a[:, 1].min()), int(a[:, 0].max())
            rows.append({
                "case": case, "rep": rep, "a_threads": at, "a_regs": get_attr(fa, NUM_REGS), "a_dynamic_smem": adyn,
                "a_grid": grid_a, "a_carveout": apref, "a_occupancy_cuda": occ_a, "b_threads": bt,
                "b_regs": get_attr(fb, NUM_REGS), "b_dynamic_smem": bdyn, "b_grid": grid_b, "b_carveout": bpref,
                "b_occupancy_cuda": occupancy(fb, bt, bdyn),
                "a_sms_used": len(set(sma.get().tolist())),
                "a_start_spread_us": (a_last_start - int(a[:, 0].min())) / 1000,
                "b_blocks_beside_a": int((b < a_first_end).sum()),
                "b_first_start_after_a_start_us": (int(b.min()) - int(a[:, 0].min())) / 1000,
                "b_median_start_after_a_start_us": (float(sorted(b)[len(b) // 2]) - int(a[:, 0].min())) / 1000,
                "a_hold_us": HOLD_NS / 1000,
            })
            r = rows[-1]
            print(f"{case} rep{rep}: A occ {occ_a} on {r['a_sms_used']} SMs; B beside A: {r['b_blocks_beside_a']}/{grid_b}, "
                  f"first B start {r['b_first_start_after_a_start_us']:.1f} us after A", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "coresidency_h200.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    dev = {"name": props["name"].decode() if isinstance(props["name"], bytes) else props["name"], "num_sms": sms,
           "shared_mem_per_sm": props["sharedMemPerMultiprocessor"], "shared_mem_per_block_optin": optin,
           "driver_version": cupy.cuda.runtime.driverGetVersion(), "runtime_version": cupy.cuda.runtime.runtimeGetVersion(),
           "cupy_version": cupy.__version__}
    (args.out / "device.json").write_text(json.dumps(dev, indent=1))
    print(json.dumps(dev))
    return 0


if __name__ == "__main__":
    sys.exit(main())
