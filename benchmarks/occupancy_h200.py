"""Measure CUDA's own occupancy answer over a grid of kernels, for tests/data/occupancy_h200/.

Run on a CUDA GPU (it was run on an NVIDIA H200 through the device tool)::

    PYTHONUNBUFFERED=1 python3 benchmarks/occupancy_h200.py --out OUTDIR [--trace]

For each kernel compiled here with NVRTC (through CuPy) at a register cap
(``--maxrregcount``) and a static shared-memory size, it reads back the register count
and static shared memory the compiler actually used (``cuFuncGetAttribute``), opts the
function in to the largest dynamic shared memory (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``)
or leaves the 48 KB default, sets a carve-out preference where the row says, and asks
the driver's ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` (what the runtime's
``cudaOccupancyMaxActiveBlocksPerMultiprocessor`` calls) for the resident blocks per SM
over threads x dynamic shared memory. Output:

* ``occupancy_h200.csv``: kernel, threads, regs, smem_static, smem_dynamic,
  max_dynamic_smem_attr, carveout, blocks_per_sm (null where CUDA returned an error),
  cuda_status;
* ``device.json``: the device attributes the calculator needs;
* ``triton_kernels.csv``: the same question for Triton-compiled matmul kernels (real
  kernels, not ours);
* ``h200_torch_trace.json.gz`` (``--trace``): a small torch.profiler trace, for
  cross-checking Kineto's per-kernel fields.

Without a GPU (or without CuPy) it exits with status 2 and says why: it never writes a
partial table silently.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import gzip
import json
import os
import sys
import time
import traceback
from pathlib import Path

KERNEL_SOURCE = r"""
#ifndef NV
#define NV 256
#endif
extern "C" __global__ void occ_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
    extern __shared__ float dyn[];
#if STATIC_BYTES > 0
    __shared__ float st[STATIC_BYTES / 4];
#endif
    float v[NV];
    int i0 = blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
    for (int k = 0; k < NV; ++k) v[k] = in[(i0 + k * 977) % n];
#pragma unroll
    for (int r = 0; r < 3; ++r) {
#pragma unroll
        for (int k = 0; k < NV; ++k) v[k] = fmaf(v[k], v[(k + 1) % NV], v[(k + 7) % NV]);
    }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) s += v[k] * (float)(k + 1);
#if STATIC_BYTES > 0
    st[threadIdx.x % (STATIC_BYTES / 4)] = s;
    __syncthreads();
    s += st[(threadIdx.x + 1) % (STATIC_BYTES / 4)];
#endif
    if (n < 0) s += dyn[threadIdx.x];
    out[i0] = s;
}
"""

# register caps x static shared memory (bytes); NV=8 gives a light kernel
KERNELS = [(cap, 0, 256) for cap in (16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 128, 168, 200, 232, 255)]
KERNELS += [(32, 12 * 1024, 256), (128, 40 * 1024, 256), (64, 1000, 256), (255, 0, 8)]
THREADS = (32, 64, 96, 128, 160, 192, 256, 288, 384, 512, 640, 768, 896, 1024, 1056)
DYNAMIC_SMEM = (
    0, 1, 100, 1024, 3000, 4096, 8192, 12288, 16384, 24576, 32768, 40000, 47104, 48128, 49152, 49153,
    65536, 81920, 98304, 102400, 114688, 131072, 163840, 196608, 200000, 229376, 231424, 232448, 232449,
)
CARVEOUTS = (0, 10, 25, 50, 70, 100)
CARVEOUT_THREADS = (64, 128, 256, 512)

# CUDA driver API enums (cuda.h)
CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
DEVICE_ATTRS = {  # cudaDeviceAttr / CUdevice_attribute numbers
    "max_threads_per_block": 1,
    "shared_mem_per_block": 8,
    "regs_per_block": 12,
    "warp_size": 10,
    "num_sms": 16,
    "max_threads_per_sm": 39,
    "shared_mem_per_sm": 81,
    "regs_per_sm": 82,
    "shared_mem_per_block_optin": 97,
    "max_blocks_per_sm": 106,
    "reserved_shared_mem_per_block": 111,
    "compute_major": 75,
    "compute_minor": 76,
}


class Driver:
    """The few driver calls we need, through ctypes, every return code checked."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with CUresult {status}")

    def func_attr(self, func: int, attr: int) -> int:
        value = ctypes.c_int()
        self.check(self.lib.cuFuncGetAttribute(ctypes.byref(value), attr, ctypes.c_void_p(func)), "cuFuncGetAttribute")
        return value.value

    def set_func_attr(self, func: int, attr: int, value: int) -> None:
        self.check(self.lib.cuFuncSetAttribute(ctypes.c_void_p(func), attr, ctypes.c_int(value)), "cuFuncSetAttribute")

    def occupancy(self, func: int, threads: int, dynamic_smem: int) -> tuple[int | None, int]:
        blocks = ctypes.c_int(-1)
        status = self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), ctypes.c_void_p(func), ctypes.c_int(threads), ctypes.c_size_t(dynamic_smem)
        )
        return (blocks.value if status == 0 else None), status

    def device_attr(self, attr: int, device: int = 0) -> int:
        value = ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(value), attr, device), "cuDeviceGetAttribute")
        return value.value


def _fail(msg: str):
    print(f"occupancy_h200: {msg}", file=sys.stderr)
    sys.exit(2)


def require_gpu():
    try:
        import cupy
    except ImportError as exc:
        _fail(f"CuPy is needed (and a CUDA GPU): {exc}")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver
        _fail(f"no CUDA device: {exc}")
    if n < 1:
        _fail("no CUDA device")
    cupy.zeros(1).sum()  # create the context before any driver call
    return cupy


def compile_kernel(cupy, cap: int, static_bytes: int, nv: int):
    options = ("-std=c++17", f"--maxrregcount={cap}", f"-DSTATIC_BYTES={static_bytes}", f"-DNV={nv}")
    module = cupy.RawModule(code=KERNEL_SOURCE, options=options)
    kernel = module.get_function("occ_kernel")
    # RawModule.get_function gives a RawKernel (its .kernel is the loaded Function) or a Function
    return int(getattr(kernel, "kernel", kernel).ptr)


def measure_grid(cupy, drv: Driver, device: dict, log) -> list[dict]:
    rows = []
    optin = device["shared_mem_per_block_optin"]
    for cap, static_bytes, nv in KERNELS:
        t0 = time.time()
        func = compile_kernel(cupy, cap, static_bytes, nv)
        regs = drv.func_attr(func, CU_FUNC_ATTRIBUTE_NUM_REGS)
        static = drv.func_attr(func, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        name = f"occ_cap{cap}_st{static_bytes}_nv{nv}"
        log(f"{name}: regs={regs} static_smem={static} compiled in {time.time() - t0:.1f}s")
        # two passes: the 48 KB default (no opt-in), then opted in to the largest dynamic size
        for max_dyn in (None, optin - static):
            if max_dyn is not None:
                drv.set_func_attr(func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, max_dyn)
            attr = drv.func_attr(func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
            carveouts = [-1] + (list(CARVEOUTS) if max_dyn is not None and cap in (32, 128) and static_bytes == 0 else [])
            for carve in carveouts:  # -1 (no preference) first: it is the function's default
                if carve != -1:
                    drv.set_func_attr(func, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, carve)
                threads = THREADS if carve == -1 else CARVEOUT_THREADS
                for t in threads:
                    for d in DYNAMIC_SMEM:
                        blocks, status = drv.occupancy(func, t, d)
                        rows.append(
                            {
                                "kernel": name,
                                "threads": t,
                                "regs": regs,
                                "smem_static": static,
                                "smem_dynamic": d,
                                "max_dynamic_smem_attr": attr,
                                "carveout": carve,
                                "blocks_per_sm": "" if blocks is None else blocks,
                                "cuda_status": status,
                            }
                        )
    return rows


def measure_triton(drv: Driver, log) -> list[dict]:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
            y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))

    M = N = K = 1024
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    rows = []
    for bm, bn, bk, warps, stages in ((64, 64, 32, 4, 2), (64, 64, 64, 4, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 4), (64, 128, 32, 4, 5)):
        grid = (M // bm, N // bn)
        compiled = matmul[grid](a, b, c, M, N, K, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
        torch.cuda.synchronize()
        if hasattr(compiled, "_init_handles"):
            compiled._init_handles()
        func = int(compiled.function)
        shared = int(compiled.metadata.shared)
        threads = warps * 32
        regs = drv.func_attr(func, CU_FUNC_ATTRIBUTE_NUM_REGS)
        static = drv.func_attr(func, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        maxdyn = drv.func_attr(func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        blocks, status = drv.occupancy(func, threads, shared)
        row = {
            "kernel": f"triton_matmul_{bm}x{bn}x{bk}_w{warps}_s{stages}",
            "threads": threads,
            "regs": regs,
            "smem_static": static,
            "smem_dynamic": shared,
            "max_dynamic_smem_attr": maxdyn,
            "carveout": -1,
            "blocks_per_sm": "" if blocks is None else blocks,
            "cuda_status": status,
        }
        log(f"triton: {row}")
        rows.append(row)
    return rows


def torch_trace(out: Path, log) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream(priority=-1)
    big = torch.randn(64 << 20, device="cuda")
    for _ in range(3):
        (x @ w).softmax(-1)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            y = x @ w
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                big.mul_(1.0001)  # a memory-bound kernel beside the GEMM on a high-priority stream
            y = torch.nn.functional.layer_norm(y.float(), (4096,)).softmax(-1)
            torch.cuda.current_stream().wait_stream(side)
            s = y.sum()
        torch.cuda.synchronize()
    raw = out / "h200_torch_trace.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(out / "h200_torch_trace.json.gz", "wb") as dst:
        dst.write(src.read())
    raw.unlink()
    log(f"torch trace written; sum={float(s):.3f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "out"), help="output directory")
    parser.add_argument("--trace", action="store_true", help="also record a small torch.profiler trace")
    args = parser.parse_args(argv)
    cupy = require_gpu()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "occupancy_h200.log", "w")

    def log(msg: str) -> None:
        print(msg)
        logf.write(msg + "\n")
        logf.flush()

    drv = Driver()
    device = {k: drv.device_attr(v) for k, v in DEVICE_ATTRS.items()}
    device["name"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    device["driver_version"] = cupy.cuda.runtime.driverGetVersion()
    device["runtime_version"] = cupy.cuda.runtime.runtimeGetVersion()
    device["cupy_version"] = cupy.__version__
    (out / "device.json").write_text(json.dumps(device, indent=2) + "\n")
    log(f"device: {device}")

    rows = measure_grid(cupy, drv, device, log)
    fields = list(rows[0])
    with open(out / "occupancy_h200.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    log(f"grid: {len(rows)} rows")

    try:
        trows = measure_triton(drv, log)
        with open(out / "triton_kernels.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(trows)
    except Exception:  # optional part: say so, keep the grid
        log("triton part FAILED:\n" + traceback.format_exc())
    if args.trace:
        try:
            torch_trace(out, log)
        except Exception:
            log("torch trace FAILED:\n" + traceback.format_exc())
    return 0


if __name__ == "__main__":
    sys.exit(main())
