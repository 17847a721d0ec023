"""Build and load the collector's CUDA/HIP extension (collectors/ovz_kernels.cu) once per process."""

from __future__ import annotations

import functools
import os
from pathlib import Path

SOURCE = Path(__file__).with_name("ovz_kernels.cu")
NAME = "ovz_kernels"
STANDIN_KERNELS = {"all_reduce": "ovz_comm_allreduce_standin", "all_to_all": "ovz_comm_alltoall_standin"}


def gemm_kernel_name(tile_m: int, tile_n: int, tile_k: int) -> str:
    return f"ovz_gemm_tiled_{tile_m}x{tile_n}x{tile_k}"


@functools.lru_cache(maxsize=1)
def load(verbose: bool = False):
    """Compile (first use, ~1 min; cached under TORCH_EXTENSIONS_DIR) and import the extension.

    On ROCm torch hipifies the same source. The build targets the visible GPU's
    architecture unless TORCH_CUDA_ARCH_LIST / PYTORCH_ROCM_ARCH say otherwise.

    Raises
    ------
    RuntimeError
        If no GPU is visible (the kernels need one) or the build fails.
    """
    import torch
    from torch.utils.cpp_extension import load as _load

    if not torch.cuda.is_available():
        raise RuntimeError("the overlapviz GPU kernels need a CUDA or ROCm GPU; none is visible")
    if not torch.version.hip and "TORCH_CUDA_ARCH_LIST" not in os.environ:
        major, minor = torch.cuda.get_device_capability()
        # sm_90 rather than PTX for an older arch: the kernels then use the device's own ISA
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    return _load(
        name=NAME,
        sources=[str(SOURCE)],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3"],
        verbose=verbose,
    )
