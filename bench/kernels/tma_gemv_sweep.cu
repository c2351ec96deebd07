// The TMA decode linear (nf::tma_linear, kernels/nf_tma.cuh: weights and
// rows streamed into shared memory by cp.async.bulk.tensor through tensor
// maps in global memory, as the runtime encodes them) against the
// register-ring skinny_linear variants (nf_linear.cuh) on
// Nemotron-3-Nano-30B-A3B's dense in_proj, out_proj and qkv, at 32, 64, 16
// and 8 rows, over items of 16 MT features, BK-deep stages, ST stages, CW
// consumer warps and ROWS rows. Every launch is a programmatic dependent of
// the one before; layers rotate over 16 copies of their weights so that no
// launch finds them in L2. A benchmark, not a test: microseconds and GB/s
// of weight bytes per launch next to the device-to-device copy bandwidth of
// the same run, and each variant's largest difference from a plain f32
// reference (relative to the largest reference magnitude).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels \
//     bench/kernels/tma_gemv_sweep.cu -o tma_gemv_sweep -lcuda &&
//     ./tma_gemv_sweep
#define NF_ARENA_FROM_ARGS 1
#include "nf_linear.cuh"
#include "nf_tma.cuh"

#include "cuda_check.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <string>
#include <vector>

constexpr long long kXOff = 0, kYOff = 1 << 20;
constexpr int kCopies = 16;
constexpr int kXRowsAlloc = 64;

__global__ void fillBf16(unsigned short *w, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u + seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = (h & 0xffff) / 32768.0f - 1.0f;
    w[i] = static_cast<unsigned short>(__float_as_uint(v) >> 16);
  }
}
__device__ float bf(unsigned short u) {
  return __uint_as_float(unsigned(u) << 16);
}
__global__ void reference(const unsigned short *x, const unsigned short *w,
                          float *y, int rows, int N, int K) {
  const long long i = blockIdx.x * 256LL + threadIdx.x;
  if (i >= static_cast<long long>(rows) * N)
    return;
  const int r = static_cast<int>(i / N), n = static_cast<int>(i % N);
  float s = 0.0f;
  for (int k = 0; k < K; ++k)
    s += bf(x[static_cast<long long>(r) * K + k]) *
         bf(w[static_cast<long long>(n) * K + k]);
  y[static_cast<long long>(r) * N + n] = s;
}

// ---------------------------------------------------------------- skinny
template <int N_, int K_> struct Spec : nf::DenseGroups {
  using W = nf::bf16;
  static constexpr int N = N_, K = K_;
  __device__ static __forceinline__ const W *weight(nf::Step a, int) {
    return static_cast<const W *>(a->weights[0]);
  }
  __device__ static __forceinline__ const float *row(nf::Step a, int r) {
    return nf::arena<float>(a, kYOff) + static_cast<long long>(r) * K;
  }
  __device__ static __forceinline__ const unsigned short *row16(nf::Step a,
                                                                int r) {
    return nf::arena<unsigned short>(a, kXOff) + static_cast<long long>(r) * K;
  }
  __device__ static __forceinline__ void store(nf::Step a, int r, int n,
                                               float v) {
    nf::arena<float>(a, kYOff)[static_cast<long long>(r) * N + n] = v;
  }
};
template <class S, int MT, int ST, int KW, int ROWS>
__global__ void __launch_bounds__(32 * KW)
    skinnyWide(const nf_step_args *args) {
  nf::skinny_linear<S, MT, ST, KW, 1, true, true, ROWS>(
      nf::Step{args, nullptr});
}

// ---------------------------------------------------------------- TMA
// Tensor maps: [0, kCopies) the weight copies (box 64 x 32), then the rows
// (box 64 x ROWS) for ROWS 16, 32 and 64.
__device__ nf_tensor_map g_maps[kCopies + 3];
constexpr int kXMap16 = kCopies, kXMap32 = kCopies + 1, kXMap64 = kCopies + 2;

template <class S, int MT, int BK, int ST, int CW, int ROWS>
__global__ void __launch_bounds__(32 * (CW + 1))
    tmaWide(const nf_step_args *args, int wmap, int xmap) {
  nf::allow_next_grid();
  nf::tma_linear<S, MT, BK, ST, CW, ROWS>(nf::Step{args, nullptr},
                                          &g_maps[wmap], &g_maps[xmap]);
}

// ---------------------------------------------------------------- harness
template <class Kernel, class... Args>
static void launchPdl(Kernel kernel, int grid, int block, int smem,
                      Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

struct Ctx {
  int sms = 0;
  float copy = 0;
  nf_step_args *dArgs = nullptr;
  char *arena = nullptr;
  float *ref = nullptr;
  unsigned short *w = nullptr;
};

template <class Launch>
static void timeIt(const char *name, const char *label, const Ctx &c, int N,
                   int K, int rows, Launch launch) {
  const int iters = 200;
  for (int it = 0; it < 3; ++it)
    launch(it % kCopies);
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  for (int it = 0; it < iters; ++it)
    launch(it % kCopies);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  CHECK(cudaGetLastError());
  float ms;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const float us = ms * 1e3f / iters;
  const float gbs = float(N) * K * 2 / (us * 1e-6f) / 1e9f;
  const int last = (iters - 1) % kCopies;
  reference<<<(static_cast<long long>(rows) * N + 255) / 256, 256>>>(
      reinterpret_cast<unsigned short *>(c.arena + kXOff),
      c.w + static_cast<size_t>(last) * N * K, c.ref, rows, N, K);
  CHECK(cudaDeviceSynchronize());
  std::vector<float> y(size_t(rows) * N), r(size_t(rows) * N);
  CHECK(cudaMemcpy(y.data(), c.arena + kYOff, y.size() * 4,
                   cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(r.data(), c.ref, r.size() * 4, cudaMemcpyDeviceToHost));
  double maxRef = 0, maxDiff = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    maxRef = std::max(maxRef, double(std::fabs(r[i])));
    maxDiff = std::max(maxDiff, double(std::fabs(y[i] - r[i])));
  }
  std::printf("%-8s rows %2d %-40s %8.2f us %6.0f GB/s %4.0f%% of copy  "
              "diff %.1e\n",
              name, rows, label, us, gbs, 100.0f * gbs / c.copy,
              maxDiff / std::max(maxRef, 1e-30));
  std::fflush(stdout);
  CHECK(cudaMemset(c.arena + kYOff, 0xff, size_t(rows) * N * 4));
}

static void setRows(const Ctx &c, int rows) {
  std::vector<nf_step_args> args(kCopies);
  CHECK(cudaMemcpy(args.data(), c.dArgs, sizeof(nf_step_args) * kCopies,
                   cudaMemcpyDeviceToHost));
  for (auto &a : args)
    a.num_tokens = rows;
  CHECK(cudaMemcpy(c.dArgs, args.data(), sizeof(nf_step_args) * kCopies,
                   cudaMemcpyHostToDevice));
}

template <int N, int K, int MT, int ST, int KW, int ROWS>
static void skinny(const char *name, const Ctx &c, int rows, int perSm) {
  using S = Spec<N, K>;
  auto kernel = skinnyWide<S, MT, ST, KW, ROWS>;
  const int smem = nf::skinny_smem<S, MT, KW, true, true, ROWS>();
  CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  setRows(c, rows);
  const int items = (N + 16 * MT - 1) / (16 * MT) * ((rows + ROWS - 1) / ROWS);
  const int grid = std::min(items, perSm * c.sms);
  char label[96];
  std::snprintf(label, sizeof label, "skinny MT%d ST%d KW%d R%d g%d", MT, ST,
                KW, ROWS, grid);
  timeIt(name, label, c, N, K, rows, [&](int copy) {
    launchPdl(kernel, grid, 32 * KW, smem,
              static_cast<const nf_step_args *>(c.dArgs + copy));
  });
}

static CUtensorMap makeMap(const void *base, int inner, int outer,
                           int boxOuter) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(inner), cuuint64_t(outer)};
  const cuuint64_t strides[1] = {cuuint64_t(inner) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(boxOuter)};
  const cuuint32_t estr[2] = {1, 1};
  CUresult r = cuTensorMapEncodeTiled(
      &m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims,
      strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(r));
    std::exit(1);
  }
  return m;
}

/// The maps of an N x K layer (MT 2: weight boxes of 32 rows).
static void setMaps(const Ctx &c, int N, int K) {
  std::vector<CUtensorMap> maps;
  for (int i = 0; i < kCopies; ++i)
    maps.push_back(makeMap(c.w + size_t(i) * N * K, K, N, 32));
  for (int rows : {16, 32, 64})
    maps.push_back(makeMap(c.arena + kXOff, K, kXRowsAlloc, rows));
  CHECK(cudaMemcpyToSymbol(g_maps, maps.data(),
                           maps.size() * sizeof(CUtensorMap)));
}

template <int N, int K, int MT, int BK, int ST, int CW, int ROWS>
static void tma(const char *name, const Ctx &c, int rows) {
  static_assert(MT == 2, "the weight maps' boxes are 32 rows");
  using S = Spec<N, K>;
  constexpr int smem = nf::tma_linear_smem<MT, BK, ST, CW, ROWS>();
  auto kernel = tmaWide<S, MT, BK, ST, CW, ROWS>;
  if (smem > 227 * 1024) {
    std::printf("%-8s rows %2d MT%d BK%d ST%d CW%d R%d: %d bytes of smem, "
                "skipped\n",
                name, rows, MT, BK, ST, CW, ROWS, smem);
    return;
  }
  CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, kernel));
  setRows(c, rows);
  const int items = (N + 16 * MT - 1) / (16 * MT) * ((rows + ROWS - 1) / ROWS);
  const int grid = std::min(items, c.sms);
  const int xmap = ROWS == 16 ? kXMap16 : ROWS == 32 ? kXMap32 : kXMap64;
  char label[96];
  std::snprintf(label, sizeof label, "tma MT%d BK%d ST%d CW%d R%d r%d g%d", MT,
                BK, ST, CW, ROWS, fa.numRegs, grid);
  timeIt(name, label, c, N, K, rows, [&](int copy) {
    launchPdl(kernel, grid, 32 * (CW + 1), smem,
              static_cast<const nf_step_args *>(c.dArgs + copy), copy, xmap);
  });
}

template <int N, int K> static void sweep(const char *name, const Ctx &c) {
  setMaps(c, N, K);
  for (int rows : {32, 64, 16, 8}) {
    if (rows > 16) {
      skinny<N, K, 2, 2, 4, 32>(name, c, rows, 4);
      skinny<N, K, 2, 2, 8, 16>(name, c, rows, 2);
    } else {
      skinny<N, K, 1, 4, 8, 16>(name, c, rows, 3);
      skinny<N, K, 2, 2, 8, 16>(name, c, rows, 2);
    }
    if (rows <= 32) {
      tma<N, K, 2, 256, 6, 8, 32>(name, c, rows); // the plan's, to 32 rows
      tma<N, K, 2, 256, 6, 4, 32>(name, c, rows);
      tma<N, K, 2, 256, 4, 16, 32>(name, c, rows);
    }
    if (rows <= 16) {
      tma<N, K, 2, 256, 8, 8, 16>(name, c, rows);
      tma<N, K, 2, 256, 8, 16, 16>(name, c, rows);
      tma<N, K, 2, 256, 8, 4, 16>(name, c, rows);
      tma<N, K, 2, 128, 12, 8, 16>(name, c, rows);
    }
    if (rows > 32) {
      tma<N, K, 2, 256, 4, 4, 64>(name, c, rows);
      tma<N, K, 2, 256, 3, 8, 64>(name, c, rows); // the plan's, above 32
      tma<N, K, 2, 128, 6, 8, 64>(name, c, rows);
    }
  }
}

int main() {
  Ctx c;
  CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
  c.copy = copy_bandwidth_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write), %d SMs\n",
              c.copy, c.sms);
  const size_t wAll = size_t(kCopies) * 10304 * 2688;
  c.w = device_alloc<unsigned short>(wAll);
  fillBf16<<<4096, 256>>>(c.w, wAll, 1u);
  c.arena = device_alloc<char>(kYOff + 64ull * 10304 * 4);
  fillBf16<<<256, 256>>>(reinterpret_cast<unsigned short *>(c.arena + kXOff),
                         kXRowsAlloc * 4096, 7u);
  c.ref = device_alloc<float>(64ull * 10304);
  c.dArgs = device_alloc<nf_step_args>(kCopies);
  auto setWeights = [&](size_t elems) {
    std::vector<nf_step_args> args(kCopies);
    const void **ptrs = device_alloc<const void *>(kCopies);
    for (int i = 0; i < kCopies; ++i) {
      const void *p = c.w + elems * i;
      CHECK(cudaMemcpy(ptrs + i, &p, sizeof p, cudaMemcpyHostToDevice));
      args[i] = nf_step_args{};
      args[i].arena = c.arena;
      args[i].weights = ptrs + i;
      args[i].num_tokens = 32;
      args[i].num_seqs = 1;
    }
    CHECK(cudaMemcpy(c.dArgs, args.data(), sizeof(nf_step_args) * kCopies,
                     cudaMemcpyHostToDevice));
  };
  const char *only = std::getenv("NF_SWEEP_SHAPE");
  auto want = [&](const char *s) { return !only || std::string(only) == s; };
  setWeights(2688ull * 4096);
  if (want("out_proj"))
    sweep<2688, 4096>("out_proj", c);
  setWeights(10304ull * 2688);
  if (want("in_proj"))
    sweep<10304, 2688>("in_proj", c);
  setWeights(4608ull * 2688);
  if (want("qkv"))
    sweep<4608, 2688>("qkv", c);
  return 0;
}
