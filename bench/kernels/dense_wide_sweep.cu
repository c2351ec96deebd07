// Weight-streaming bandwidth of the wide-step decode linears
// (skinny_linear's wide variant, kernels/nf_linear.cuh, bf16 inputs read
// from the rows' bf16 copy) over items of 16 or 32 rows, feature tiles of 16
// or 32, K steps in flight, warps a block and blocks an SM, on
// Nemotron-3-Nano-30B-A3B's dense in_proj, out_proj and qkv and the MoE
// router's shape, at 32, 64 and 24 rows. Every launch is a programmatic
// dependent of the one before (as in a plan's decode step). A benchmark,
// not a test: it prints microseconds and GB/s of weight bytes per launch
// next to the device-to-device copy bandwidth of the same run, and each
// variant's largest difference from a plain f32 reference (relative to the
// largest reference magnitude). Layers rotate over 16 copies of their
// weights so that no launch finds them in L2. NF_SWEEP_ROWS (one row
// count), NF_SWEEP_SHAPE (in_proj, out_proj, router or qkv) and
// NF_SWEEP_ITERS narrow a run (for ncu, say).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels \
//     bench/kernels/dense_wide_sweep.cu -o dense_wide_sweep &&
//     ./dense_wide_sweep
#define NF_ARENA_FROM_ARGS 1
#include "nf_linear.cuh"

#include "cuda_check.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// Arena: bf16 rows at kXOff (64 x 4096 max), f32 outputs at kYOff.
constexpr long long kXOff = 0, kYOff = 1 << 20;
constexpr int kCopies = 16;

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

// y[r, n] = sum_k x[r, k] w[n, k], one thread per output, f32.
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

template <class S, int MT, int ST, int KW, int ROWS, bool STAGEX>
__global__ void __launch_bounds__(32 * KW)
    skinnyWide(const nf_step_args *args) {
  nf::skinny_linear<S, MT, ST, KW, 1, STAGEX, true, ROWS>(
      nf::Step{args, nullptr});
}

/// kernel<<<grid, block, smem>>>(args) as a programmatic dependent of the
/// launch before it.
template <class Kernel>
static void launchPdl(Kernel kernel, int grid, int block, int smem,
                      const nf_step_args *args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, kernel, args));
}

struct Ctx {
  int sms = 0;
  float copy = 0;
  nf_step_args *dArgs = nullptr; // kCopies, one per weight copy
  char *arena = nullptr;
  float *ref = nullptr;
  unsigned short *w = nullptr;
};

// Times launch(args) over 200 launches rotating the weight copies, then
// checks the last output against the reference of copy (200 - 1) % kCopies.
template <class Launch>
static void timeIt(const char *name, const char *label, const Ctx &c, int N,
                   int K, int rows, int copies, Launch launch) {
  static const int iters = std::getenv("NF_SWEEP_ITERS")
                               ? std::atoi(std::getenv("NF_SWEEP_ITERS"))
                               : 200;
  for (int it = 0; it < 3; ++it)
    launch(c.dArgs + it % copies);
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  for (int it = 0; it < iters; ++it)
    launch(c.dArgs + it % copies);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  CHECK(cudaGetLastError());
  float ms;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const float us = ms * 1e3f / iters;
  const float gbs = float(N) * K * 2 / (us * 1e-6f) / 1e9f;
  // Check: the last launch used copy (iters - 1) % copies.
  const int last = (iters - 1) % copies;
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
  std::printf("%-8s rows %2d %-34s %8.2f us %6.0f GB/s %4.0f%% of copy  "
              "diff %.1e\n",
              name, rows, label, us, gbs, 100.0f * gbs / c.copy,
              maxDiff / std::max(maxRef, 1e-30));
  // Clear the outputs so that the next kernel cannot pass on stale ones.
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

/// skinny_linear's wide variant with items of MT x 16 features and up to
/// ROWS rows, KW warps a block, PER_SM blocks an SM (the plan's: MT 2, ST 2,
/// ROWS 16, and KW 4 with four blocks an SM for layers of at least a tile
/// of 32 features an SM, else KW 8 with two).
template <int N, int K, int MT, int ST, int KW, int ROWS, bool STAGEX = true>
static void skinny(const char *name, const Ctx &c, int rows, int copies,
                   int perSm) {
  using S = Spec<N, K>;
  auto kernel = skinnyWide<S, MT, ST, KW, ROWS, STAGEX>;
  const int smem = nf::skinny_smem<S, MT, KW, STAGEX, true, ROWS>();
  CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, kernel));
  setRows(c, rows);
  const int items = (N + 16 * MT - 1) / (16 * MT) * ((rows + ROWS - 1) / ROWS);
  const int grid = std::min(items, perSm * c.sms);
  char label[96];
  std::snprintf(label, sizeof label, "skinny MT%d ST%d KW%d R%d%s r%d g%d", MT,
                ST, KW, ROWS, STAGEX ? "" : " unstaged", fa.numRegs, grid);
  timeIt(name, label, c, N, K, rows, copies, [&](const nf_step_args *a) {
    launchPdl(kernel, grid, 32 * KW, smem, a);
  });
}

/// The row counts to sweep: NF_SWEEP_ROWS (one), else 32, 64 and 24.
static std::vector<int> sweepRows() {
  if (const char *r = std::getenv("NF_SWEEP_ROWS"))
    return {std::atoi(r)};
  return {32, 64, 24};
}
/// Whether to sweep the layer `name` (NF_SWEEP_SHAPE, else all).
static bool sweepShape(const char *name) {
  const char *s = std::getenv("NF_SWEEP_SHAPE");
  return !s || std::string(s) == name;
}

template <int N, int K>
static void sweep(const char *name, const Ctx &c, int copies) {
  for (int rows : sweepRows()) {
    skinny<N, K, 2, 2, 4, 16>(name, c, rows, copies, 4);
    skinny<N, K, 2, 2, 8, 16>(name, c, rows, copies, 2);
    skinny<N, K, 2, 2, 4, 32>(name, c, rows, copies, 4);
    skinny<N, K, 2, 2, 8, 32>(name, c, rows, copies, 2);
    skinny<N, K, 2, 4, 4, 32>(name, c, rows, copies, 3);
    skinny<N, K, 2, 4, 8, 32>(name, c, rows, copies, 1);
    skinny<N, K, 1, 4, 4, 32>(name, c, rows, copies, 4);
    skinny<N, K, 1, 4, 8, 32>(name, c, rows, copies, 2);
    skinny<N, K, 1, 4, 8, 16>(name, c, rows, copies, 2);
  }
}

/// The MoE router's logits (128 experts): few feature tiles, so K is split
/// over many warps.
template <int N, int K>
static void router(const char *name, const Ctx &c, int copies) {
  for (int rows : sweepRows()) {
    skinny<N, K, 2, 2, 8, 16>(name, c, rows, copies, 2); // the plan's
    skinny<N, K, 2, 2, 16, 16, false>(name, c, rows, copies, 1);
    skinny<N, K, 2, 2, 32, 16, false>(name, c, rows, copies, 1);
    skinny<N, K, 1, 2, 16, 16, false>(name, c, rows, copies, 1);
    skinny<N, K, 1, 2, 32, 16, false>(name, c, rows, copies, 1);
    skinny<N, K, 1, 4, 32, 16, false>(name, c, rows, copies, 1);
    skinny<N, K, 1, 2, 32, 32, false>(name, c, rows, copies, 1);
    skinny<N, K, 1, 1, 32, 16, false>(name, c, rows, copies, 1);
  }
}

int main() {
  Ctx c;
  CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
  c.copy = copy_bandwidth_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write), %d SMs\n",
              c.copy, c.sms);
  const size_t wAll = 16ull * 10304 * 2688; // the largest: in_proj
  c.w = device_alloc<unsigned short>(wAll);
  fillBf16<<<4096, 256>>>(c.w, wAll, 1u);
  c.arena = device_alloc<char>(kYOff + 64ull * 10304 * 4);
  fillBf16<<<256, 256>>>(reinterpret_cast<unsigned short *>(c.arena + kXOff),
                         64 * 4096, 7u);
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
  setWeights(10304ull * 2688);
  if (sweepShape("in_proj"))
    sweep<10304, 2688>("in_proj", c, kCopies);
  setWeights(2688ull * 4096);
  if (sweepShape("out_proj"))
    sweep<2688, 4096>("out_proj", c, kCopies);
  if (sweepShape("router")) {
    setWeights(128ull * 2688);
    router<128, 2688>("router", c, kCopies);
  }
  setWeights(4608ull * 2688);
  if (sweepShape("qkv"))
    sweep<4608, 2688>("qkv", c, kCopies);
  return 0;
}
