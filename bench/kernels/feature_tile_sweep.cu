// Weight-streaming bandwidth of the wide-step decode linear with feature
// tiles (feature_tile_linear, kernels/nf_linear.cuh; the plan's LM head at
// more than 16 tokens) against skinny_linear's wide variant
// (skinny_linear<S, 2, 2, 8, 1, true, true>), on Nemotron-3-Nano-30B-A3B's
// dense shapes at 24, 32 and 64 rows with bf16 inputs. A benchmark, not a test:
// it prints microseconds and GB/s of weight bytes per launch next to the
// device-to-device copy bandwidth of the same run, and each kernel's largest
// difference from a plain f32 reference (relative to the largest reference
// magnitude). Dense layers rotate over 16 copies of their weights so that no
// launch finds them in L2.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels \
//     bench/kernels/feature_tile_sweep.cu -o feature_tile_sweep &&
//     ./feature_tile_sweep
#define NF_ARENA_FROM_ARGS 1
#include "nf_linear.cuh"

#include "cuda_check.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
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

template <class S>
__global__ void __launch_bounds__(256) skinnyWide(const nf_step_args *args) {
  nf::skinny_linear<S, 2, 2, 8, 1, true, true>(nf::Step{args, nullptr});
}

template <class S, int MT, int NT, int WARPS, int STAGES, int KP>
__global__ void __launch_bounds__(32 * WARPS)
    featureTiles(const nf_step_args *args) {
  nf::feature_tile_linear<S, MT, NT, WARPS, STAGES, KP>(
      nf::Step{args, nullptr});
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
  const int iters = 200;
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

template <int N, int K>
static void shipped(const char *name, const Ctx &c, int rows, int copies) {
  using S = Spec<N, K>;
  const int smem = nf::skinny_smem<S, 2, 8, true, true>();
  CHECK(cudaFuncSetAttribute(
      skinnyWide<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  setRows(c, rows);
  const int grid = 2 * c.sms;
  timeIt(name, "skinny wide MT2 ST2 KW8 (shipped)", c, N, K, rows, copies,
         [&](const nf_step_args *a) { skinnyWide<S><<<grid, 256, smem>>>(a); });
}

template <int N, int K, int MT, int NT, int WARPS, int STAGES, int KP>
static void variant(const char *name, const Ctx &c, int rows, int copies) {
  using S = Spec<N, K>;
  auto kernel = featureTiles<S, MT, NT, WARPS, STAGES, KP>;
  const int smem = nf::feature_tile_smem<NT, KP>();
  CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int perSm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel,
                                                      32 * WARPS, smem));
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, kernel));
  setRows(c, rows);
  const int tiles = (N + WARPS * MT * 16 - 1) / (WARPS * MT * 16);
  const int items = tiles * ((rows + 8 * NT - 1) / (8 * NT));
  const int grid = std::min(items, c.sms * perSm);
  char label[96];
  std::snprintf(label, sizeof label, "tiles MT%d NT%d W%d ST%d KP%d r%d %d/SM",
                MT, NT, WARPS, STAGES, KP, fa.numRegs, perSm);
  timeIt(name, label, c, N, K, rows, copies,
         [&](const nf_step_args *a) { kernel<<<grid, 32 * WARPS, smem>>>(a); });
}

template <int N, int K>
static void shape(const char *name, const Ctx &c, int copies) {
  for (int rows : {32, 64, 24}) {
    shipped<N, K>(name, c, rows, copies);
    variant<N, K, 1, 4, 8, 4, 8>(name, c, rows, copies); // the plan's
    variant<N, K, 1, 4, 8, 8, 8>(name, c, rows, copies);
    variant<N, K, 2, 4, 4, 4, 8>(name, c, rows, copies);
    if (rows > 32)
      variant<N, K, 1, 8, 8, 4, 8>(name, c, rows, copies);
  }
}

int main() {
  Ctx c;
  CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
  c.copy = copy_bandwidth_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write), %d SMs\n",
              c.copy, c.sms);
  const size_t wElems = 131072ull * 2688; // the largest: one LM head
  const size_t wAll = std::max<size_t>(wElems, 16ull * 10304 * 2688);
  c.w = device_alloc<unsigned short>(wAll);
  fillBf16<<<4096, 256>>>(c.w, wAll, 1u);
  c.arena = device_alloc<char>(kYOff + 64ull * 131072 * 4);
  fillBf16<<<256, 256>>>(reinterpret_cast<unsigned short *>(c.arena + kXOff),
                         64 * 4096, 7u);
  c.ref = device_alloc<float>(64ull * 131072);
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
  shape<10304, 2688>("in_proj", c, kCopies);
  setWeights(2688ull * 4096);
  shape<2688, 4096>("out_proj", c, kCopies);
  setWeights(4608ull * 2688);
  shape<4608, 2688>("qkv", c, kCopies);
  setWeights(0); // one copy (705 MB, past L2)
  shape<131072, 2688>("lm_head", c, 1);
  return 0;
}
