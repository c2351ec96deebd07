// What the weight-streaming sweeps over bf16 rows share (dense_wide_sweep.cu,
// feature_tile_sweep.cu and tma_gemv_sweep.cu; wide_expert_sweep.cu takes the
// arena layout, the fill and the spec): the spec they time, a fill of varied
// finite bf16 values, a plain f32 reference, launches as programmatic
// dependents, and the harness that rotates 16 copies of a layer's weights
// (so that no launch finds them in L2) and checks the last output. Include
// after the kernel header (the sweeps define NF_ARENA_FROM_ARGS first, as
// the generated decode modules do).
#pragma once

#include "cuda_check.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

// Arena: [0, 4 KiB) dispatch offsets (grouped specs), bf16 rows at kXOff
// (up to 512 x 4096), f32 rows and outputs at kYOff.
constexpr long long kXOff = 4096, kYOff = 8 << 20;
constexpr int kCopies = 16;

// Varied finite bf16 values in [-1, 1) (a hash of the index and seed).
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

__device__ inline float bf(unsigned short u) {
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

// An N x K bf16 weight (grouped: the groups' weights stacked in weights[0])
// over the arena's bf16 rows, f32 outputs.
template <int N_, int K_, class Groups = nf::DenseGroups> struct Spec : Groups {
  using W = nf::bf16;
  static constexpr int N = N_, K = K_;
  __device__ static __forceinline__ const W *weight(nf::Step a, int g) {
    const W *w = static_cast<const W *>(a->weights[0]);
    if constexpr (std::is_same_v<Groups, nf::DenseGroups>)
      return w;
    else
      return w + static_cast<long long>(g) * N * K;
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

/// kernel<<<grid, block, smem>>>(args...) as a programmatic dependent of the
/// launch before it (as in a plan's decode step).
template <class Kernel, class... Args>
void launchPdl(Kernel kernel, int grid, int block, int smem, Args... args) {
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

/// The device, kCopies step arguments (one per weight copy) over one arena,
/// the weights and the reference's outputs.
struct DenseSweep {
  int sms = 0;
  float copy = 0; // device-to-device copy bandwidth, GB/s
  nf_step_args *dArgs = nullptr;
  char *arena = nullptr;
  float *ref = nullptr;
  unsigned short *w = nullptr;

  /// Weights of wElems, outputs of up to outElems, xElems bf16 rows
  /// (all filled).
  DenseSweep(size_t wElems, size_t outElems, size_t xElems) {
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    copy = copy_bandwidth_gbs();
    std::printf("device-to-device copy: %.0f GB/s (read + write), %d SMs\n",
                copy, sms);
    w = device_alloc<unsigned short>(wElems);
    fillBf16<<<4096, 256>>>(w, wElems, 1u);
    arena = device_alloc<char>(kYOff + outElems * 4);
    fillBf16<<<256, 256>>>(reinterpret_cast<unsigned short *>(arena + kXOff),
                           xElems, 7u);
    ref = device_alloc<float>(outElems);
    dArgs = device_alloc<nf_step_args>(kCopies);
  }

  /// Copy i of the weights at w + i * elems (elems 0: one copy for all).
  void setWeights(size_t elems) const {
    std::vector<nf_step_args> args(kCopies);
    const void **ptrs = device_alloc<const void *>(kCopies);
    for (int i = 0; i < kCopies; ++i) {
      const void *p = w + elems * i;
      CHECK(cudaMemcpy(ptrs + i, &p, sizeof p, cudaMemcpyHostToDevice));
      args[i] = nf_step_args{};
      args[i].arena = arena;
      args[i].weights = ptrs + i;
      args[i].num_tokens = 32;
      args[i].num_seqs = 1;
    }
    CHECK(cudaMemcpy(dArgs, args.data(), sizeof(nf_step_args) * kCopies,
                     cudaMemcpyHostToDevice));
  }

  void setRows(int rows) const {
    std::vector<nf_step_args> args(kCopies);
    CHECK(cudaMemcpy(args.data(), dArgs, sizeof(nf_step_args) * kCopies,
                     cudaMemcpyDeviceToHost));
    for (auto &a : args)
      a.num_tokens = rows;
    CHECK(cudaMemcpy(dArgs, args.data(), sizeof(nf_step_args) * kCopies,
                     cudaMemcpyHostToDevice));
  }

  /// Times launch(copy) over NF_SWEEP_ITERS (200) launches rotating `copies`
  /// weight copies, then checks the last output against the reference.
  template <class Launch>
  void time(const char *name, const char *label, int N, int K, int rows,
            int copies, Launch launch) const {
    static const int iters = std::getenv("NF_SWEEP_ITERS")
                                 ? std::atoi(std::getenv("NF_SWEEP_ITERS"))
                                 : 200;
    for (int it = 0; it < 3; ++it)
      launch(it % copies);
    int it = 0;
    const float ms = time_ms([&] { launch(it++ % copies); }, iters, false);
    CHECK(cudaGetLastError());
    const float us = ms * 1e3f;
    const float gbs = float(N) * K * 2 / (us * 1e-6f) / 1e9f;
    // The last launch used copy (iters - 1) % copies.
    const int last = (iters - 1) % copies;
    reference<<<(static_cast<long long>(rows) * N + 255) / 256, 256>>>(
        reinterpret_cast<unsigned short *>(arena + kXOff),
        w + static_cast<size_t>(last) * N * K, ref, rows, N, K);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> y(size_t(rows) * N), r(size_t(rows) * N);
    CHECK(cudaMemcpy(y.data(), arena + kYOff, y.size() * 4,
                     cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(r.data(), ref, r.size() * 4, cudaMemcpyDeviceToHost));
    double maxRef = 0, maxDiff = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      maxRef = std::max(maxRef, double(std::fabs(r[i])));
      maxDiff = std::max(maxDiff, double(std::fabs(y[i] - r[i])));
    }
    std::printf("%-8s rows %2d %-40s %8.2f us %6.0f GB/s %4.0f%% of copy  "
                "diff %.1e\n",
                name, rows, label, us, gbs, 100.0f * gbs / copy,
                maxDiff / std::max(maxRef, 1e-30));
    std::fflush(stdout);
    // Clear the outputs so that the next kernel cannot pass on stale ones.
    CHECK(cudaMemset(arena + kYOff, 0xff, size_t(rows) * N * 4));
  }
};
