// The grouped spec the decode-linear sweeps time (skinny_sweep.cu,
// bulk_linear_sweep.cu): experts' weights stacked in weights[0], the
// dispatch offsets, rows and outputs at fixed places of the arena, and a
// fill of varied finite bf16 values. Include after the kernel header (the
// sweeps define NF_ARENA_FROM_ARGS first, as the generated decode modules
// do).
#pragma once

#include <cstddef>

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

template <int N_, int K_, int E> struct Spec {
  using W = nf::bf16;
  static constexpr int N = N_, K = K_, G = E;
  static constexpr bool kGroupsEarly = false; // groups from the arena
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
  __device__ static __forceinline__ void group(nf::Step a, int g, int &begin,
                                               int &count) {
    const int32_t *off = nf::arena<int32_t>(a, 0);
    begin = off[g];
    count = off[g + 1] - off[g];
  }
};
