// What the decode-linear sweeps share (skinny_sweep.cu, bulk_linear_sweep.cu,
// row_linear_sweep.cu): the grouped spec they time (experts' weights stacked
// in weights[0], the dispatch offsets, rows and outputs at fixed places of
// the arena), a fill of varied finite bf16 values, the problems, their
// timing and the device buffers. Include after the kernel header (the
// sweeps define NF_ARENA_FROM_ARGS first, as the generated decode modules
// do).
#pragma once

#include "cuda_check.h"
#include <cstddef>
#include <cstdint>
#include <vector>

// Arena layout of the sweep: [0, 4 KiB) dispatch offsets (E + 1 i32),
// then x rows (f32, 64 x K), then y (f32, 64 x N).
constexpr long long kXOff = 4096, kYOff = kXOff + 64LL * 8192 * 4;

// Varied finite bf16 weights in [-1, 1) (a hash of the index).
__global__ void fillBf16(unsigned short *w, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u;
    h ^= h >> 15;
    const float v = (h & 0xffff) / 32768.0f - 1.0f;
    w[i] = static_cast<unsigned short>(__float_as_uint(v) >> 16);
  }
}

// Groups: the dispatch offsets at arena offset 0, read after the wait.
template <int N_, int K_, int E> struct Spec : nf::DispatchGroups<E, 0> {
  using W = nf::bf16;
  static constexpr int N = N_, K = K_;
  __device__ static __forceinline__ const W *weight(nf::Step a, int g) {
    return static_cast<const W *>(a->weights[0]) +
           static_cast<long long>(g) * N * K;
  }
  __device__ static __forceinline__ const float *row(nf::Step a, int r) {
    return nf::arena<float>(a, kXOff) + static_cast<long long>(r) * K;
  }
  __device__ static __forceinline__ void store(nf::Step a, int r, int n,
                                               float v) {
    nf::arena<float>(a, kYOff)[static_cast<long long>(r) * N + n] = v;
  }
};

#ifdef NF_TERMS
// skinny_linear's narrow variant as the plans launch it (NF_TERMS activation
// terms), the kernel the sweeps compare others with.
template <class S>
__global__ void __launch_bounds__(256) skinny_narrow(const nf_step_args *args) {
  nf::skinny_linear<S, 1, 4, 8, NF_TERMS>(nf::Step{args, nullptr});
}
#endif

// A problem of a sweep: E weights (experts, or dense copies) of N x K, of
// which `active` take `rows` rows each step.
struct Problem {
  const char *name;
  int E, N, K, active; // experts (dense: 16 copies), active experts per step
  int rows = 1;        // rows of each active expert (dense: of the layer)
};

inline std::vector<int32_t> offsetsOf(const Problem &p, int it) {
  std::vector<int32_t> off(p.E + 1);
  int rows = 0;
  for (int g = 0; g < p.E; ++g) {
    off[g] = rows;
    rows += ((g * 7 + it * 13) % p.E) < p.active ? p.rows : 0;
  }
  off[p.E] = rows;
  return off;
}

// Median-free simple timing: `iters` steps, each with its own offsets
// (copied first; the copies are timed alone and subtracted).
template <class Kernel>
float timeSteps(Kernel kernel, int grid, int block, int smem, const Problem &p,
                nf_step_args *dArgs, char *arena) {
  const int iters = 200;
  int32_t *dOffs = device_alloc<int32_t>(size_t(p.E + 1) * iters);
  for (int it = 0; it < iters; ++it) {
    std::vector<int32_t> off = offsetsOf(p, it);
    CHECK(cudaMemcpy(dOffs + it * (p.E + 1), off.data(),
                     sizeof(int32_t) * (p.E + 1), cudaMemcpyHostToDevice));
  }
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  auto copies = [&](bool launch) {
    for (int it = 0; it < iters; ++it) {
      CHECK(cudaMemcpyAsync(arena, dOffs + it * (p.E + 1),
                            sizeof(int32_t) * (p.E + 1),
                            cudaMemcpyDeviceToDevice));
      if (launch)
        kernel<<<grid, block, smem>>>(dArgs);
    }
  };
  copies(true);
  CHECK(cudaDeviceSynchronize());
  float ms[2];
  for (int launch = 0; launch < 2; ++launch) {
    CHECK(cudaEventRecord(e0));
    copies(launch == 1);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaEventElapsedTime(&ms[launch], e0, e1));
  }
  CHECK(cudaGetLastError());
  CHECK(cudaFree(dOffs));
  return (ms[1] - ms[0]) * 1e3f / iters;
}

// The device side of a sweep: the weights of the largest problem (128
// experts x 1856 x 2688 bf16, 1.28 GB, varied values), the arena with its
// activation rows filled with varied finite values (the same fill, read as
// bf16 pairs) and one-token step arguments on the device.
struct SweepDevice {
  int sms = 0;
  float copy = 0; // device-to-device copy bandwidth, GB/s
  char *arena = nullptr;
  nf_step_args *dArgs = nullptr;
};
inline SweepDevice sweep_device() {
  SweepDevice d;
  CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, 0));
  d.copy = copy_bandwidth_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write), %d SMs", d.copy,
              d.sms);
#ifdef NF_TERMS
  std::printf(", %d activation term(s)", NF_TERMS);
#endif
  std::printf("\n");
  const size_t wBytes = 128ull * 1856 * 2688 * 2;
  void *w = device_alloc<char>(wBytes);
  fillBf16<<<4096, 256>>>(static_cast<unsigned short *>(w), wBytes / 2);
  d.arena = device_alloc<char>(kYOff + 64ull * 16384 * 4);
  fillBf16<<<1024, 256>>>(reinterpret_cast<unsigned short *>(d.arena + kXOff),
                          64ull * 8192 * 2);
  const void **dW = device_alloc<const void *>(1);
  CHECK(cudaMemcpy(dW, &w, sizeof(void *), cudaMemcpyHostToDevice));
  nf_step_args args{};
  args.arena = d.arena;
  args.weights = dW;
  args.num_tokens = 1;
  args.num_seqs = 1;
  d.dArgs = device_alloc<nf_step_args>(1);
  CHECK(cudaMemcpy(d.dArgs, &args, sizeof args, cudaMemcpyHostToDevice));
  return d;
}
