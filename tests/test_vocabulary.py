"""The communication vocabulary (overlapviz/domain/vocabulary.toml): real kernel names of each library are comm with the right collective, and no compute kernel of the reference traces is.

Names marked "trace" were copied from a real trace (ours in tests/data, or a public profile
that quotes it); names marked "source" were put together from the kernel's definition in the
library's source (vocabulary.toml's `source` says where), in the demangled form Kineto and
Nsight Systems write.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from overlapviz.domain.collectives import collective_of
from overlapviz.domain.rules import COMM_PATTERN, default_rules
from overlapviz.domain.vocabulary import load, vocabulary

ROOT = Path(__file__).resolve().parent.parent
NAMES_FILE = ROOT / "tests" / "data" / "vocabulary" / "kernel_names.txt"

# library -> [(kernel name, expected collective or None)], all comm
EXAMPLES: dict[str, list[tuple[str, str | None]]] = {
    "nccl": [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),  # trace (HTA)
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "broadcast"),  # trace (HTA)
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "send_recv"),  # trace
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),  # trace (B200)
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "send_recv"),  # trace (nsys)
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", None),  # trace: the kernel does not say
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgs4K)", "reduce_scatter"),  # source
        ("ncclSymkDevKernel_AllReduce_RSxLD_AGxST_sum_bf16(ncclSymkDevWorkArgs4K)", "all_reduce"),  # source
        ("ncclSymkDevKernel_ReduceScatter_LD_sum_f32(ncclSymkDevWorkArgs4K)", "reduce_scatter"),  # source
        ("ncclSymkDevKernel_AllGather_LL(ncclSymkDevWorkArgs4K)", "all_gather"),  # source
    ],
    "rccl": [
        ("void rcclGenericKernel<1, false>(ncclDevKernelArgsStorage<4096ul>)", None),  # trace (public ROCm profile)
        ("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", None),  # trace (rocprofv3 docs data)
    ],
    "msccl": [
        ("mscclKernel_Sum_uint8_t_LL128_false(ncclDevComm*, mscclAlgo*, mscclWork*)", None),  # source (RCCL)
        ("void mscclpp::collective::allreducePacket<(mscclpp::ReduceOp)0, __half, __half>(__half*, __half*, __half*, "
         "mscclpp::DeviceHandle<mscclpp::MemoryChannel>*, unsigned long, unsigned long, int, int, int, unsigned long, void*, "
         "unsigned int, unsigned int)", "all_reduce"),  # source
        ("void allgather6<false>(void*, mscclpp::DeviceHandle<mscclpp::MemoryChannel>*, unsigned long, unsigned long, "
         "unsigned long, unsigned long, unsigned long, unsigned long)", "all_gather"),  # source (apps/nccl)
    ],
    "mscclpp_nccl_shim": [
        ("allreduce7", "all_reduce"),  # source, as a short name (nsys shortName)
        ("allreduceAllPairs", "all_reduce"),
        ("allgather8", "all_gather"),
        ("broadcast6", "broadcast"),
    ],
    "overlapviz": [("ovz_comm_allreduce_standin", "all_reduce"), ("ovz_comm_allgather_standin", "all_gather")],
    "deepep": [
        ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*, dpsk::ep::internode::SourceMeta*, "
         "int4 const*, float const*, long const*, float const*)", "all_to_all"),  # trace (DeepSeek-V3)
        ("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, bool const*)", "all_to_all"),
        ("void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int, int const*, int*)", "all_to_all"),
        ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int, int, int const*)", "barrier"),  # trace
        ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int, int, bool const*)",
         "all_to_all"),  # source
        ("void deep_ep::intranode::cached_notify_dispatch<8>(int const*, int, void**, int**, int, int)", "barrier"),
        ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*)", "all_to_all"),
        ("void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int, int**, int, int)", "barrier"),
        ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*, int*)", "all_to_all"),
        ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*, int*, long*, int*, int*)", "all_to_all"),
        ("void deep_ep::internode_ll::combine<3, 7168, 9>(void*, void*, int*, void*, void const*, long const*)", "all_to_all"),
        ("void deep_ep::internode_ll::clean_low_latency_buffer<32>(int*, int, int*, int)", "barrier"),
        ("deep_ep::ep::dispatch_impl<true, false, false, 24, 4, 28, 8, 7168, 0, 4096, 256, 8, 1, 2, 100000000000>",
         "all_to_all"),  # source: DeepEP V2's JIT kernel
        ("deep_ep::ep::hybrid_combine_impl<false, 24, 8, 2, 4, 7168, 256, 8>", "all_to_all"),
        ("deep_ep::elastic::hybrid_unordered_dispatch_impl<24, 4, 8, 8>", "all_to_all"),
    ],
    "nvshmem": [
        ("void alltoall_on_stream_kernel<float>(int, float*, float const*, unsigned long)", "all_to_all"),  # source
        ("void rdxn_on_stream_kernel<float, (rdxn_ops)0>(int, float*, float const*, unsigned long)", "all_reduce"),
        ("void reducescatter_on_stream_kernel<float, (rdxn_ops)0>(int, float*, float const*, unsigned long)", "reduce_scatter"),
        ("void fcollect_on_stream_kernel<int>(int, int*, int const*, unsigned long)", "all_gather"),
        ("void broadcast_on_stream_kernel<char>(int, char*, char const*, unsigned long, int)", "broadcast"),
        ("void barrier_on_stream_kernel_threadgroup<(threadgroup_t)2>(int, int)", "barrier"),
        ("sync_all_on_stream_kernel()", "barrier"),
        ("alltoall32_on_stream_kernel(void*, void const*, unsigned long, int, int, int, long*)", "all_to_all"),  # older NVSHMEM
    ],
    "torch_symm_mem": [
        ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, "
         "unsigned int**, unsigned long, unsigned long)", "all_reduce"),  # trace (B200): compute under the old rule
        ("void (anonymous namespace)::multimem_one_shot_all_reduce_kernel<float, 16>(float*, float*, unsigned long, "
         "unsigned int**, unsigned long, unsigned long)", "all_reduce"),  # source
        ("void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, char*, unsigned long, unsigned int**, "
         "unsigned long, unsigned long)", "all_gather"),
        ("void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**, c10::BFloat16*, "
         "c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)", "all_reduce"),
        ("void (anonymous namespace)::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8, false, false>(c10::BFloat16**, "
         "c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long, unsigned long)",
         "all_reduce"),
        # reduce_scatter_out launches the two-shot kernel with reduce_scatter=true
        ("void (anonymous namespace)::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8, true, false>(c10::BFloat16**, "
         "c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long, unsigned long)",
         "reduce_scatter"),
        ("void (anonymous namespace)::two_shot_all_reduce_kernel<float, (int)16, (int)4, (bool)1, (bool)1>(float **, float *, "
         "unsigned long, unsigned long, unsigned int **, unsigned long, unsigned long, unsigned long)", "reduce_scatter"),
        ("void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<float, 16, -1>(float**, unsigned long, "
         "unsigned long, unsigned int**, unsigned long, unsigned long)", "all_reduce"),
        ("c10d::symmetric_memory::barrier_kernel(unsigned int**, int, int, int, unsigned long)", "barrier"),  # trace (public)
    ],
    "custom_all_reduce": [
        ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
         "__nv_bfloat16*, int, int)", "all_reduce"),  # trace (public vLLM profile)
        ("void sglang::cross_device_reduce_1stage<__half, 8>(sglang::RankData*, sglang::RankSignals, sglang::Signal*, "
         "__half*, int, int)", "all_reduce"),  # trace (public SGLang profile)
        ("void vllm::cross_device_reduce_2stage<c10::BFloat16, 4>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
         "c10::BFloat16*, int, int)", "all_reduce"),  # source
        ("void aiter::cross_device_reduce_2stage<__hip_bfloat16, 8>(aiter::RankData*, aiter::RankSignals, aiter::Signal*, "
         "__hip_bfloat16*, int, int)", "all_reduce"),
        ("void quickreduce::allreduce_prototype_twoshot<quickreduce::AllReduceTwoshot<__half, quickreduce::CodecFP<__half, 8> >, "
         "__half>(__half const*, __half*, unsigned int, unsigned int, int, unsigned char**, unsigned int, unsigned int)",
         "all_reduce"),
    ],
    "trtllm_all_reduce": [
        ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<(flashinfer::trtllm_allreduce_fusion::"
         "AllReduceFusionPattern)1, __nv_bfloat16, 8, false, false>(flashinfer::trtllm_allreduce_fusion::AllReduceFusionParams"
         "<__nv_bfloat16>)", "all_reduce"),  # trace (public SGLang profile)
        ("void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8>(tensorrt_llm::kernels::AllReduceParams)",
         "all_reduce"),  # source
        ("void c10d::intra_node_comm::twoShotAllReduceKernel<8>(c10::BFloat16*, unsigned long, unsigned long, "
         "c10d::intra_node_comm::P2pState**, c10::BFloat16**, unsigned long)", "all_reduce"),
    ],
    "te_userbuffers": [
        ("void userbuffers_fp16_sum_inplace_gpu_rr_rs<8>(int, int, int, int, int, int, int, void**, int, unsigned long)",
         "reduce_scatter"),  # source
        ("void userbuffers_fp16_sum_inplace_gpu_mc_rs_oop_fp8<4, __nv_fp8_e4m3>(int, int, int, int, int, int, int, int, int)",
         "reduce_scatter"),
        ("void userbuffers_fp16_sum_inplace_gpu_rr_ag<8>(int, int, int, int, int, int, int, void**, int, unsigned long)",
         "all_gather"),
        ("void userbuffers_fp16_sum_inplace_gpu_mc_ag<4>(int, int, int, int, int, int, int, void**, int, uint4*, unsigned long)",
         "all_gather"),
        ("void userbuffers_fp16_sum_inplace_gpu_rw<8>(int, int, int, int, int, int, int, void**, int, unsigned long)",
         "all_reduce"),
        ("kuserbuffers_pushsendrecv(int*, int*, int4*, int4*, int, int, int*, int*, unsigned long)", "send_recv"),
        ("kuserbuffers_pullsend(int, int, int*, int*)", "send"),
        ("kuserbuffers_pushrecv(int, int, int*, int*, int, unsigned long)", "recv"),
    ],
}
# host ranges (user_annotation / cpu_op) in CPU-only traces
HOST_EXAMPLES = {
    "gloo": [("gloo:all_reduce", "all_reduce"), ("gloo:broadcast", "broadcast"), ("gloo:all_to_all", "all_to_all")],
    "nccl": [("nccl:all_reduce", "all_reduce"), ("nccl:_allgather_base", "all_gather")],
    "rccl": [("rccl:reduce_scatter", "reduce_scatter")],
}

# kernels of the communication libraries that compute (or only copy locally): never comm
LIBRARY_COMPUTE = [
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",  # trace
    # trace (a public DeepEP profile): early DeepEP kept the layout kernel in deep_ep::internode::,
    # which the old pattern `ep::(?:intra|inter)node(?:_ll)?::` called communication
    "void deep_ep::internode::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
    "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
    "deep_ep::ep::dispatch_copy_epilogue_impl<true, false, false, true, 24, 1, 32, 1, 8, 14336, 0, 4096, 256, 8, 1>",
    "deep_ep::ep::combine_reduce_epilogue_impl<24, 8, 7168, 8>",
    "deep_ep::elastic::dispatch_deterministic_prologue_impl<24, 16, 8, 4096, 256, 8>",
]
# compute kernels whose names read like communication (made up, in the spelling of the libraries
# they imitate): reductions, gathers, dispatchers, Triton kernels named after fused reduce ops
LOOKALIKES = [
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, "
    "float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>"
    "::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)",
    "void cub::DeviceSegmentedReduceKernel<cub::DeviceReducePolicy<float, int, cub::Sum>::Policy600, float*, float*, int*, "
    "int*, int, cub::Sum, float>(float*, float*, int*, int*, int, cub::Sum, float)",
    "void cub::DeviceReduceByKeyKernel<cub::DispatchReduceByKey<long*, long*, cub::ConstantInputIterator<int, int>, int*, "
    "int*, cub::Equality, cub::Sum, int>::PtxReduceByKeyPolicy>(long*)",
    "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
    "void at::native::_scatter_gather_elementwise_kernel<128, 4, at::native::_cuda_scatter_gather_internal_kernel<true, "
    "float>::operator()<at::native::ReduceAdd>(at::TensorIterator&, long, long, long, at::native::ReduceAdd const&)"
    "::{lambda(int)#1}>(int, at::native::_cuda_scatter_gather_internal_kernel<true, float>)",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_sum_0",
    "triton_per_fused_all_reduce_sum_0",
    "triton_poi_fused_all_gather_into_tensor_copy_0",
    "void moe::dev::routing::routingIndicesHistogramKernel<moe::dev::routing::routingRenormalize::KernelParams<"
    "__nv_bfloat16, __nv_bfloat16, 128, false, true> >(moe::dev::routing::routingRenormalize::KernelParams<__nv_bfloat16, "
    "__nv_bfloat16, 128, false, true>)",
    "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned long, int*)",
    "fused_moe_kernel",
    "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int>, "
    "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<4, cute::tuple<cute::C<2>, "
    "cute::C<1>, cute::C<1> >, cutlass::gemm::KernelTmaWarpSpecializedCooperative> > > >(cutlass::gemm::kernel::Params)",
    "void cuda::reduce_fused_impl<__nv_bfloat16, false, false>(int4 const*, float const*, int const*, int4*, int, int, int)",
    "void k_bin_bcast<&(op_add(float, float)), float, float, float, float const*>(float const*, float const*, float*, int)",
    "void reduce_1Block_kernel<float, 128, 7, cublasGemvTensorStridedBatched<float>>(float const*, float)",
    "sendrecv_copy_kernel_local",  # not a library's name: a user's copy
    "__amd_rocclr_copyBuffer",
    "barrier_kernel",  # a bare barrier_kernel is anybody's: only c10d::symmetric_memory:: is PyTorch's
    "void broadcast_kernel_impl<float>(float*, float const*, int)",
    "allreduce_stats_kernel",  # not the MSCCL++ shim's allreduce<digits>
]
# the GPU kernel names of tests/data/vocabulary/kernel_names.txt that are communication, by hand:
# (prefix, collective); everything else there (897 names) is computation
REFERENCE_COMM = [
    ("ncclDevKernel_AllGather_RING_LL(", "all_gather"),
    ("ncclDevKernel_Generic(", None),
    ("ncclDevKernel_Generic_1(", None),
    ("ncclDevKernel_SendRecv(", "send_recv"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(", "all_reduce"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(", "broadcast"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(", "send_recv"),
    ("void (anonymous namespace)::multimem_all_reduce_kernel<", "all_reduce"),  # compute under the old rule
    ("void dpsk::ep::internode::cached_notify<", "barrier"),
    ("void dpsk::ep::internode::combine<", "all_to_all"),
    ("void dpsk::ep::internode::dispatch<false, 8, false, 8>(", "all_to_all"),
    ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(", "all_to_all"),
    ("void dpsk::ep::internode::notify_dispatch<", "all_to_all"),
]


def kinds(names, category="kernel"):
    return default_rules().classify(pa.array(names, pa.string()), pa.array([category] * len(names))).to_pylist()


def reference_names() -> list[str]:
    return [ln for ln in NAMES_FILE.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]


@pytest.mark.parametrize("library", sorted(EXAMPLES))
def test_library_kernels_are_comm_with_their_collective(library):
    names = [n for n, _ in EXAMPLES[library]]
    assert kinds(names) == ["comm"] * len(names)
    assert [collective_of(n) for n in names] == [c for _, c in EXAMPLES[library]]
    assert vocabulary().library_of(names[0]) is not None


@pytest.mark.parametrize("library", sorted(HOST_EXAMPLES))
def test_host_ranges_are_comm_with_their_collective(library):
    names = [n for n, _ in HOST_EXAMPLES[library]]
    for cat in ("user_annotation", "cpu_op"):
        assert kinds(names, cat) == ["comm"] * len(names)
    if library == "gloo":  # a GPU kernel named gloo:... is not gloo's range (nccl: names contain `nccl`)
        assert kinds(names) == ["compute"] * len(names)
    assert [collective_of(n) for n in names] == [c for _, c in HOST_EXAMPLES[library]]


def test_every_library_has_examples_and_a_source():
    libs = {lib.name: lib for lib in vocabulary().libraries}
    assert set(libs) == set(EXAMPLES) | set(HOST_EXAMPLES)
    for lib in libs.values():
        assert lib.source and all(s.strip() for s in lib.source), lib.name
        assert lib.kernel or lib.host, lib.name


def test_library_compute_kernels_and_lookalikes_stay_compute():
    assert kinds(LIBRARY_COMPUTE) == ["compute"] * len(LIBRARY_COMPUTE)
    assert kinds(LOOKALIKES) == ["compute"] * len(LOOKALIKES)
    # the old default pattern called an early DeepEP build's layout kernel communication
    old = re.compile(r"nccl|rccl|msccl|ovz_comm|ep::(?:intra|inter)node(?:_ll)?::", re.IGNORECASE)
    assert old.search(LIBRARY_COMPUTE[1])


def test_reference_kernel_names_comm_exactly_the_reviewed_ones():
    names = reference_names()
    assert len(names) == len(set(names)) == 910
    got = {n for n, k in zip(names, kinds(names)) if k == "comm"}
    expected = {}
    for prefix, coll in REFERENCE_COMM:
        hits = [n for n in names if n.startswith(prefix)]
        assert len(hits) == 1, (prefix, hits)
        expected[hits[0]] = coll
    assert got == set(expected)
    assert {n: collective_of(n) for n in got} == expected
    assert set(kinds(names)) == {"comm", "compute"}


def test_re2_and_python_re_agree():
    """The rules run on pyarrow (RE2) and collective_of on Python's re: same matches, per pattern."""
    names = reference_names() + [n for ex in EXAMPLES.values() for n, _ in ex] + LIBRARY_COMPUTE + LOOKALIKES
    arr = pa.array(names)
    for lib in vocabulary().libraries:
        for p in lib.kernel + lib.host + lib.compute + tuple(q for q, _ in lib.collectives):
            re2 = pc.match_substring_regex(arr, p, ignore_case=True).to_pylist()
            py = [re.search(p, n, re.IGNORECASE) is not None for n in names]
            assert re2 == py, (lib.name, p)
    re2 = pc.match_substring_regex(arr, COMM_PATTERN, ignore_case=True).to_pylist()
    assert re2 == [re.search(COMM_PATTERN, n, re.IGNORECASE) is not None for n in names]


def test_default_rules_only_gain_patterns():
    """An ingested dataset's rules JSON differs from the previous defaults only by the new patterns."""
    rules = default_rules().to_dict()["rules"]
    comm_kernel = next(r for r in rules if r["kind"] == "comm" and r["categories"] == ["kernel"])
    assert comm_kernel["pattern"].startswith("nccl|rccl|msccl|ovz_comm|(?:ep::(?:intra|inter)node(?:_ll)?::)|")
    host = next(r for r in rules if r["kind"] == "comm" and r["categories"] == ["user_annotation", "cpu_op"])
    assert host["pattern"] == "^gloo:|^nccl:|^rccl:"
    assert [r["kind"] for r in rules] == ["memory", "compute", "comm", "comm", "other", "compute"]


def test_vocabulary_ships_in_the_package():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "vocabulary.toml" in cfg["tool"]["setuptools"]["package-data"]["overlapviz.domain"]
    assert (ROOT / "overlapviz" / "domain" / "vocabulary.toml").is_file()


@pytest.mark.parametrize(
    "text, message",
    [
        ("version = 1\n[[library]]\nname = 'x'\nkernel = ['a']\n", "no source"),
        ("version = 1\n[[library]]\nname = 'x'\nkernel = ['(']\nsource = ['s']\n", "not a regular expression"),
        ("version = 1\n[[library]]\nname = 'x'\nkernel = ['a(?!b)']\nsource = ['s']\n", "look-around"),
        ("version = 1\n[[library]]\nname = 'x'\nkernels = ['a']\nsource = ['s']\n", "unknown field"),
        ("version = 1\n[[library]]\nname = 'x'\nkernel = ['a']\nsource = ['s']\n[[library.collective]]\npattern = 'a'\n"
         "collective = 'allreduce'\n", "not one of"),
        ("version = 2\n", "version"),
        ("version = ", "not valid TOML"),
    ],
)
def test_bad_vocabulary_is_refused_naming_the_field(text, message):
    with pytest.raises(ValueError, match=message):
        load(text, "v.toml")
