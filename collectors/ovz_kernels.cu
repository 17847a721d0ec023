// overlapviz collector kernels: a tiled GEMM whose per-block shared memory can be padded
// (occupancy shaping) and single-GPU stand-ins for collectives with an NCCL-like footprint.
//
// Built at run time by torch.utils.cpp_extension.load (collectors/extension.py); on ROCm
// torch hipifies this same file. Compiled with -DOVZ_KERNELS_ONLY it needs no torch
// headers, so `nvcc -Xptxas -v -DOVZ_KERNELS_ONLY -c` reports registers and shared memory.
//
// Kernels are extern "C" so that profiler traces show plain names: the stand-ins'
// names start with `ovz_comm` (overlapviz's comm rule) and end in `_standin`.

#include <cstdint>
#ifndef OVZ_KERNELS_ONLY
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#endif
#include <cuda_runtime.h>

#define OVZ_GEMM_THREADS 256
// NCCL compiles its device kernels with __launch_bounds__(NCCL_MAX_NTHREADS=640, 1),
// which caps them at 96 registers per thread; the stand-ins use the same bound.
#define OVZ_COMM_MAX_THREADS 640
// vectors in flight per thread: chosen so ptxas lands at NCCL's 96 registers on sm_90
#define OVZ_COMM_UNROLL 10

// ---------------------------------------------------------------------------------------
// Tiled GEMM, fp32, row-major: C[M,N] = A[M,K] @ B[K,N].
// Dynamic shared memory = (TM*TK + TK*TN)*4 bytes of tiles + pad bytes nobody touches:
// the pad only lowers how many blocks fit on one SM.
// ---------------------------------------------------------------------------------------
template <int TM, int TN, int TK>
__device__ __forceinline__ void gemm_tile(const float* __restrict__ A, const float* __restrict__ B,
                                          float* __restrict__ C, int M, int N, int K) {
  extern __shared__ float4 ovz_smem_gemm[];
  float* As = reinterpret_cast<float*>(ovz_smem_gemm);  // [TK][TM], transposed
  float* Bs = As + TM * TK;                             // [TK][TN]
  constexpr int RM = TM / 16, RN = TN / 16;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int row0 = blockIdx.y * TM, col0 = blockIdx.x * TN;
  float acc[RM][RN];
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int j = 0; j < RN; ++j) acc[i][j] = 0.f;

  for (int k0 = 0; k0 < K; k0 += TK) {
    for (int idx = threadIdx.x; idx < TM * TK; idx += OVZ_GEMM_THREADS) {
      const int r = idx / TK, c = idx % TK, gr = row0 + r, gc = k0 + c;
      As[c * TM + r] = (gr < M && gc < K) ? A[(int64_t)gr * K + gc] : 0.f;
    }
    for (int idx = threadIdx.x; idx < TK * TN; idx += OVZ_GEMM_THREADS) {
      const int r = idx / TN, c = idx % TN, gr = k0 + r, gc = col0 + c;
      Bs[r * TN + c] = (gr < K && gc < N) ? B[(int64_t)gr * N + gc] : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < TK; ++kk) {
      float a[RM], b[RN];
#pragma unroll
      for (int i = 0; i < RM; ++i) a[i] = As[kk * TM + ty + 16 * i];
#pragma unroll
      for (int j = 0; j < RN; ++j) b[j] = Bs[kk * TN + tx + 16 * j];
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int r = row0 + ty + 16 * i;
    if (r >= M) continue;
#pragma unroll
    for (int j = 0; j < RN; ++j) {
      const int c = col0 + tx + 16 * j;
      if (c < N) C[(int64_t)r * N + c] = acc[i][j];
    }
  }
}

#define OVZ_GEMM(TM, TN, TK)                                                                          \
  extern "C" __global__ void __launch_bounds__(OVZ_GEMM_THREADS) ovz_gemm_tiled_##TM##x##TN##x##TK( \
      const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,  \
      int K) {                                                                                        \
    gemm_tile<TM, TN, TK>(A, B, C, M, N, K);                                                         \
  }
OVZ_GEMM(64, 64, 32)
OVZ_GEMM(64, 64, 64)
OVZ_GEMM(128, 128, 32)

// ---------------------------------------------------------------------------------------
// Stand-in collectives. One process on one GPU plays one rank of an n-rank ring; `peer`
// plays the bytes that arrive over the links. Each vector goes global -> registers ->
// shared memory (handed to the neighbouring lane, as NCCL hands data between warps
// through its shared-memory buffers) -> global.
//
// all-reduce (ring, rank 0 of n, chunks of message/n):
//   reduce-scatter, steps s = 0..n-2: data[chunk n-1-s] += peer[chunk n-1-s]
//   all-gather,     steps s = 0..n-2: data[chunk (n-s) % n] = peer[chunk (n-s) % n]
//   -> reads 2(n-1)/n x message from `peer`: the bytes a ring all-reduce receives per rank.
// all-to-all: data[chunk j] = peer[chunk j] for j = 1..n-1 -> (n-1)/n x message.
//
// Pacing (link_bytes_per_ns > 0): each CTA waits until its share of the link bandwidth
// would have delivered the bytes it has read, so the kernel stays resident as long as a
// link-bound collective would (NCCL's CTAs likewise sit on their SMs waiting for data).
// ---------------------------------------------------------------------------------------
__device__ __forceinline__ uint64_t ovz_now_ns() {
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
  return wall_clock64() * 10ull;  // AMD: constant 100 MHz wall clock
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

// Exchange between lanes of one warp through shared memory. On AMD a block-wide barrier
// stands in for __syncwarp, which not every ROCm release has.
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#define OVZ_SYNC_LANES() __syncthreads()
#else
#define OVZ_SYNC_LANES() __syncwarp()
#endif

struct OvzPace {
  uint64_t t0;
  double ns_per_byte;  // per CTA; 0 = unpaced
  double done_bytes;
  __device__ __forceinline__ void wait(double bytes) {
    if (ns_per_byte <= 0.0) return;
    done_bytes += bytes;
    const uint64_t due = t0 + (uint64_t)(done_bytes * ns_per_byte);
    while (ovz_now_ns() < due) {
    }
  }
};

// One pass over one chunk: dst[i] = (ACC ? dst[i] : 0) + src[i] for i in [0, len).
template <bool ACC, int U>
__device__ __forceinline__ void ovz_comm_chunk(float4* __restrict__ dst, const float4* __restrict__ src,
                                               int64_t len, float4* stage, OvzPace& pace) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x * U;
  const int lane = threadIdx.x & 31;
  const int partner = threadIdx.x ^ 1;
  for (int64_t base = (int64_t)blockIdx.x * blockDim.x * U; base < len; base += stride) {
    float4 v[U];
    float4 d[ACC ? U : 1];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + (int64_t)u * blockDim.x + threadIdx.x;
      v[u] = i < len ? src[i] : make_float4(0.f, 0.f, 0.f, 0.f);
      if (ACC) d[ACC ? u : 0] = i < len ? dst[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float4 r = v[u];
      if (ACC) {
        const float4 o = d[ACC ? u : 0];
        r = make_float4(r.x + o.x, r.y + o.y, r.z + o.z, r.w + o.w);
      }
      stage[threadIdx.x] = r;
      OVZ_SYNC_LANES();
      const float4 got = stage[partner];
      OVZ_SYNC_LANES();
      const int64_t i = base + (int64_t)u * blockDim.x + partner;
      if (i < len) dst[i] = got;
    }
    (void)lane;
    const int64_t left = len - base;
    const int64_t mine = left < (int64_t)blockDim.x * U ? left : (int64_t)blockDim.x * U;
    pace.wait((double)mine * 16.0 / blockDim.x);
  }
}

__device__ __forceinline__ OvzPace ovz_pace_start(double link_bytes_per_ns) {
  OvzPace p;
  p.t0 = ovz_now_ns();
  // per thread: each thread accounts for its 1/blockDim share of its CTA's bytes
  p.ns_per_byte = link_bytes_per_ns > 0.0 ? (double)gridDim.x * blockDim.x / link_bytes_per_ns : 0.0;
  p.done_bytes = 0.0;
  return p;
}

// Both kernels run one generic body and take the collective as an argument, as NCCL's
// kernels share one generic body: both then get the heavier (all-reduce) path's registers.
__device__ __forceinline__ void ovz_comm_body(int collective, float4* __restrict__ data, const float4* __restrict__ peer,
                                           int64_t n_vec, int n_ranks, double link_bytes_per_ns) {
  extern __shared__ float4 ovz_smem_comm[];
  OvzPace pace = ovz_pace_start(link_bytes_per_ns);
  if (collective == 0) {  // all-reduce
    for (int s = 0; s < n_ranks - 1; ++s) {
      const int j = n_ranks - 1 - s;
      const int64_t lo = n_vec * j / n_ranks, hi = n_vec * (j + 1) / n_ranks;
      ovz_comm_chunk<true, OVZ_COMM_UNROLL>(data + lo, peer + lo, hi - lo, ovz_smem_comm, pace);
    }
    for (int s = 0; s < n_ranks - 1; ++s) {
      const int j = (n_ranks - s) % n_ranks;
      const int64_t lo = n_vec * j / n_ranks, hi = n_vec * (j + 1) / n_ranks;
      ovz_comm_chunk<false, OVZ_COMM_UNROLL>(data + lo, peer + lo, hi - lo, ovz_smem_comm, pace);
    }
  } else {  // all-to-all
    for (int j = 1; j < n_ranks; ++j) {
      const int64_t lo = n_vec * j / n_ranks, hi = n_vec * (j + 1) / n_ranks;
      ovz_comm_chunk<false, OVZ_COMM_UNROLL>(data + lo, peer + lo, hi - lo, ovz_smem_comm, pace);
    }
  }
}

extern "C" __global__ void __launch_bounds__(OVZ_COMM_MAX_THREADS, 1)
    ovz_comm_allreduce_standin(int collective, float4* __restrict__ data, const float4* __restrict__ peer, int64_t n_vec,
                               int n_ranks, double link_bytes_per_ns) {
  ovz_comm_body(collective, data, peer, n_vec, n_ranks, link_bytes_per_ns);
}

extern "C" __global__ void __launch_bounds__(OVZ_COMM_MAX_THREADS, 1)
    ovz_comm_alltoall_standin(int collective, float4* __restrict__ data, const float4* __restrict__ peer, int64_t n_vec,
                              int n_ranks, double link_bytes_per_ns) {
  ovz_comm_body(collective, data, peer, n_vec, n_ranks, link_bytes_per_ns);
}

// ---------------------------------------------------------------------------------------
// SM probe: every block records the SM it ran on, after holding it for spin_ns, so that a
// grid of a few blocks per SM spreads over every SM its stream can reach (used to measure
// the SMs a green context grants). 1024 threads per block: at most 2 blocks per SM.
// ---------------------------------------------------------------------------------------
extern "C" __global__ void ovz_probe_smid(int* __restrict__ out, long long spin_ns) {
  unsigned smid;
#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
  smid = __smid();
#else
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
#endif
  const uint64_t t0 = ovz_now_ns();
  while (ovz_now_ns() - t0 < (uint64_t)spin_ns) {
  }
  if (threadIdx.x == 0) out[blockIdx.x] = (int)smid;
}

#ifndef OVZ_KERNELS_ONLY
// ---------------------------------------------------------------------------------------
// Host side (torch bindings). Every launch goes to torch's current stream.
// ---------------------------------------------------------------------------------------
namespace {

using GemmFn = void (*)(const float*, const float*, float*, int, int, int);

struct GemmKernel {
  int tm, tn, tk;
  GemmFn fn;
  const char* name;
};

const GemmKernel kGemms[] = {
    {64, 64, 32, ovz_gemm_tiled_64x64x32, "ovz_gemm_tiled_64x64x32"},
    {64, 64, 64, ovz_gemm_tiled_64x64x64, "ovz_gemm_tiled_64x64x64"},
    {128, 128, 32, ovz_gemm_tiled_128x128x32, "ovz_gemm_tiled_128x128x32"},
};

const GemmKernel& find_gemm(int tm, int tn, int tk) {
  for (const auto& g : kGemms)
    if (g.tm == tm && g.tn == tn && g.tk == tk) return g;
  TORCH_CHECK(false, "tile ", tm, "x", tn, "x", tk, " is not built; built tiles: 64x64x32, 64x64x64, 128x128x32");
  return kGemms[0];  // not reached
}

const void* find_kernel(const std::string& name) {
  for (const auto& g : kGemms)
    if (name == g.name) return reinterpret_cast<const void*>(g.fn);
  if (name == "ovz_comm_allreduce_standin") return reinterpret_cast<const void*>(ovz_comm_allreduce_standin);
  if (name == "ovz_comm_alltoall_standin") return reinterpret_cast<const void*>(ovz_comm_alltoall_standin);
  TORCH_CHECK(false, "no kernel named ", name);
  return nullptr;  // not reached
}

int64_t gemm_smem_bytes(int tm, int tn, int tk, int64_t pad) { return (int64_t)(tm * tk + tk * tn) * 4 + pad; }

void set_dynamic_smem(const void* fn, int64_t bytes, const char* what) {
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  int optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  TORCH_CHECK(bytes <= optin, what, ": ", bytes, " bytes of shared memory per block exceed this device's opt-in limit of ",
              optin);
  // above 48 KB a kernel must opt in to more dynamic shared memory
  C10_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

void tiled_gemm(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c, int64_t tm, int64_t tn,
                int64_t tk, int64_t pad_bytes) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda(), "tiled_gemm: tensors must be on the GPU");
  TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && c.scalar_type() == at::kFloat,
              "tiled_gemm: tensors must be float32");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && c.is_contiguous(), "tiled_gemm: tensors must be contiguous");
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  TORCH_CHECK(b.size(0) == K && c.size(0) == M && c.size(1) == N, "tiled_gemm: shapes do not match");
  const auto& g = find_gemm((int)tm, (int)tn, (int)tk);
  const int64_t smem = gemm_smem_bytes(g.tm, g.tn, g.tk, pad_bytes);
  const c10::cuda::CUDAGuard guard(a.device());
  set_dynamic_smem(reinterpret_cast<const void*>(g.fn), smem, g.name);
  const dim3 grid((unsigned)((N + g.tn - 1) / g.tn), (unsigned)((M + g.tm - 1) / g.tm));
  const GemmFn fn = g.fn;  // a plain name: hipify rewrites launches of plain names only
  fn<<<grid, OVZ_GEMM_THREADS, (size_t)smem, c10::cuda::getCurrentCUDAStream()>>>(
      a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), (int)M, (int)N, (int)K);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void standin(const std::string& collective, torch::Tensor& data, const torch::Tensor& peer, int64_t n_ranks,
             int64_t ctas, int64_t threads, int64_t smem_bytes, double link_bytes_per_ns) {
  TORCH_CHECK(data.is_cuda() && peer.is_cuda(), "stand-in: tensors must be on the GPU");
  TORCH_CHECK(data.is_contiguous() && peer.is_contiguous() && data.nbytes() == peer.nbytes(),
              "stand-in: data and peer must be contiguous and the same size");
  TORCH_CHECK(data.nbytes() % 16 == 0, "stand-in: message bytes must be a multiple of 16");
  TORCH_CHECK(threads >= 64 && threads <= OVZ_COMM_MAX_THREADS && threads % 32 == 0,
              "stand-in: threads must be a multiple of 32 in [64, 640]");
  TORCH_CHECK(n_ranks >= 2, "stand-in: n_ranks must be >= 2");
  TORCH_CHECK(smem_bytes >= threads * 16, "stand-in: shared memory must hold 16 bytes per thread");
  const void* fn = collective == "all_reduce" ? reinterpret_cast<const void*>(ovz_comm_allreduce_standin)
                   : collective == "all_to_all" ? reinterpret_cast<const void*>(ovz_comm_alltoall_standin)
                                                 : nullptr;
  TORCH_CHECK(fn != nullptr, "stand-in: no stand-in for collective ", collective);
  const c10::cuda::CUDAGuard guard(data.device());
  set_dynamic_smem(fn, smem_bytes, "stand-in");
  const int64_t n_vec = data.nbytes() / 16;
  auto* d = reinterpret_cast<float4*>(data.data_ptr());
  const auto* p = reinterpret_cast<const float4*>(peer.data_ptr());
  auto stream = c10::cuda::getCurrentCUDAStream();
  if (collective == "all_reduce")
    ovz_comm_allreduce_standin<<<(unsigned)ctas, (unsigned)threads, (size_t)smem_bytes, stream>>>(
        0, d, p, n_vec, (int)n_ranks, link_bytes_per_ns);
  else
    ovz_comm_alltoall_standin<<<(unsigned)ctas, (unsigned)threads, (size_t)smem_bytes, stream>>>(
        1, d, p, n_vec, (int)n_ranks, link_bytes_per_ns);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor probe_sms(int64_t blocks, int64_t spin_ns) {
  TORCH_CHECK(blocks >= 1, "probe_sms: blocks must be >= 1");
  auto out = torch::full({blocks}, -1, torch::dtype(torch::kInt32).device(torch::kCUDA, c10::cuda::current_device()));
  ovz_probe_smid<<<(unsigned)blocks, 1024, 0, c10::cuda::getCurrentCUDAStream()>>>(out.data_ptr<int>(), (long long)spin_ns);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

pybind11::dict kernel_attributes(const std::string& name) {
  cudaFuncAttributes attr;
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, find_kernel(name)));
  pybind11::dict out;
  out["name"] = name;
  out["regs_per_thread"] = attr.numRegs;
  out["static_shared_mem_bytes"] = (int64_t)attr.sharedSizeBytes;
  out["local_mem_bytes_per_thread"] = (int64_t)attr.localSizeBytes;  // > 0: register spills
  out["max_threads_per_block"] = attr.maxThreadsPerBlock;
  out["max_dynamic_shared_mem_bytes"] = attr.maxDynamicSharedSizeBytes;
  out["ptx_version"] = attr.ptxVersion;
  out["binary_version"] = attr.binaryVersion;
  return out;
}

int64_t blocks_per_sm(const std::string& name, int64_t threads, int64_t dynamic_smem_bytes) {
  const void* fn = find_kernel(name);
  if (dynamic_smem_bytes > 48 * 1024) set_dynamic_smem(fn, dynamic_smem_bytes, name.c_str());
  int blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, (int)threads, (size_t)dynamic_smem_bytes));
  return blocks;
}

// The SM's L1/shared-memory split is chosen per launch; by default the driver may size it
// for the launching kernel alone, which can leave no shared memory for another kernel's
// blocks beside it. Asking for the maximum split (100) lets blocks of two kernels share an SM.
bool set_smem_carveout(const std::string& name, int64_t percent) {
  const cudaError_t err =
      cudaFuncSetAttribute(find_kernel(name), cudaFuncAttributePreferredSharedMemoryCarveout, (int)percent);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // unsupported here (e.g. fixed LDS on AMD): report, do not fail
    return false;
  }
  return true;
}

pybind11::dict device_attributes(int64_t device) {
  struct Item {
    const char* key;
    cudaDeviceAttr attr;
  };
  const Item items[] = {
      {"num_sms", cudaDevAttrMultiProcessorCount},
      {"max_threads_per_sm", cudaDevAttrMaxThreadsPerMultiProcessor},
      {"max_threads_per_block", cudaDevAttrMaxThreadsPerBlock},
      {"max_blocks_per_sm", cudaDevAttrMaxBlocksPerMultiprocessor},
      {"regs_per_sm", cudaDevAttrMaxRegistersPerMultiprocessor},
      {"regs_per_block", cudaDevAttrMaxRegistersPerBlock},
      {"shared_mem_per_sm", cudaDevAttrMaxSharedMemoryPerMultiprocessor},
      {"shared_mem_per_block", cudaDevAttrMaxSharedMemoryPerBlock},
      {"shared_mem_per_block_optin", cudaDevAttrMaxSharedMemoryPerBlockOptin},
      {"warp_size", cudaDevAttrWarpSize},
      {"compute_major", cudaDevAttrComputeCapabilityMajor},
      {"compute_minor", cudaDevAttrComputeCapabilityMinor},
#if !defined(__HIP_PLATFORM_AMD__) && !defined(USE_ROCM)
      {"reserved_shared_mem_per_block", cudaDevAttrReservedSharedMemoryPerBlock},
#endif
  };
  pybind11::dict out;
  for (const auto& it : items) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, it.attr, (int)device) == cudaSuccess) out[it.key] = v;
    else (void)cudaGetLastError();  // an attribute this runtime lacks: leave it out
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tiled_gemm", &tiled_gemm, "C = A @ B with the tiled GEMM (fp32), padded dynamic shared memory");
  m.def("standin", &standin, "stand-in collective kernel on the current stream");
  m.def("kernel_attributes", &kernel_attributes, "cudaFuncGetAttributes of one of this module's kernels");
  m.def("blocks_per_sm", &blocks_per_sm, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  m.def("set_smem_carveout", &set_smem_carveout, "cudaFuncAttributePreferredSharedMemoryCarveout; false if refused");
  m.def("device_attributes", &device_attributes, "cudaDeviceGetAttribute values of one device");
  m.def("gemm_smem_bytes", &gemm_smem_bytes, "dynamic shared memory of one tiled GEMM block");
  m.def("probe_sms", &probe_sms, "SM id of each block of a probe grid on the current stream (int32, one per block)");
}
#endif
