// Read bandwidth of the decode linear's weight access pattern against a
// linear stream, from DRAM: 60 MB (six Nano experts, 1856 x 2688 bf16) per
// launch, rotating over 1.25 GB so no launch finds its bytes in L2.
// rows16: items of 16 weight rows, 8 warps splitting K, lane (gid, tig)
// loading V 16-byte vectors of rows gid and gid + 8 per step (the skinny
// kernel's pattern is V = 1), STAGES steps in flight. linear: each warp
// streams a contiguous range, 512 bytes per instruction. A benchmark, not
// a test (results: bench/results/2026-11-30g/sweeps/read_patterns.txt).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 bench/kernels/read_patterns.cu \
//     -o read_patterns && ./read_patterns
#include <cstdio>
#include <cuda_runtime.h>
#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      printf("%s\n", cudaGetErrorString(e));                                   \
      return 1;                                                                \
    }                                                                          \
  } while (0)
constexpr int K = 2688 * 2; // bytes per row
// Items of 16 rows; 8 warps split K in steps of 64*V bytes per row; lane
// (gid,tig) loads V uint4 of rows gid and gid+8 per step. Ring of STAGES.
template <int V, int STAGES>
__global__ void __launch_bounds__(256)
    rows16(const char *W, int items, unsigned *out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2,
            tig = lane & 3;
  constexpr int STEP = 64 * V, KS = K / STEP;
  unsigned acc = 0;
  for (int it = blockIdx.x; it < items; it += gridDim.x) {
    const char *r0 = W + (long long)(it * 16 + gid) * K + tig * 16 * V;
    const char *r1 = r0 + 8LL * K;
    uint4 w[STAGES][2][V];
    // Stage s's loads of K step ks (zeros past K).
    auto fetch = [&](int s, int ks) {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        w[s][0][v] = ks < KS ? __ldg((const uint4 *)(r0 + ks * STEP) + v)
                             : make_uint4(0, 0, 0, 0);
        w[s][1][v] = ks < KS ? __ldg((const uint4 *)(r1 + ks * STEP) + v)
                             : make_uint4(0, 0, 0, 0);
      }
    };
#pragma unroll
    for (int s = 0; s < STAGES; ++s)
      fetch(s, warp + s * 8);
    for (int ks0 = warp; ks0 < KS; ks0 += STAGES * 8) {
#pragma unroll
      for (int s = 0; s < STAGES; ++s) {
#pragma unroll
        for (int v = 0; v < V; ++v)
          acc ^= w[s][0][v].x ^ w[s][1][v].y ^ w[s][0][v].z ^ w[s][1][v].w;
        fetch(s, ks0 + (s + STAGES) * 8);
      }
    }
  }
  if (acc == 0x12345678)
    out[0] = acc;
}
// Linear: every warp streams a contiguous range, 512 B per instruction.
template <int STAGES>
__global__ void __launch_bounds__(256)
    linear(const char *W, long long bytes, unsigned *out) {
  const int lane = threadIdx.x & 31;
  const long long nw = (long long)gridDim.x * 8,
                  gw = blockIdx.x * 8LL + (threadIdx.x >> 5);
  const long long chunks = bytes / 512, per = (chunks + nw - 1) / nw;
  const long long c0 = gw * per, c1 = c0 + per < chunks ? c0 + per : chunks;
  unsigned acc = 0;
  uint4 w[STAGES];
#pragma unroll
  for (int s = 0; s < STAGES; ++s)
    w[s] = c0 + s < c1 ? __ldg((const uint4 *)(W + (c0 + s) * 512) + lane)
                       : make_uint4(0, 0, 0, 0);
  for (long long c = c0; c < c1; c += STAGES) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      acc ^= w[s].x ^ w[s].y ^ w[s].z ^ w[s].w;
      long long n = c + s + STAGES;
      w[s] = n < c1 ? __ldg((const uint4 *)(W + n * 512) + lane)
                    : make_uint4(0, 0, 0, 0);
    }
  }
  if (acc == 0x12345678)
    out[0] = acc;
}
int main() {
  const long long total = 1280LL << 20,
                  per = 6LL * 1856 * K; // 6 experts of 1856 x 2688
  char *W;
  unsigned *out;
  CHECK(cudaMalloc(&W, total));
  CHECK(cudaMalloc(&out, 4));
  CHECK(cudaMemset(W, 1, total));
  const int slots = total / per, items = per / K / 16;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto time = [&](const char *name, auto launch) {
    for (int i = 0; i < 3; ++i)
      launch(i % slots);
    cudaEventRecord(e0);
    const int iters = 200;
    for (int i = 0; i < iters; ++i)
      launch((i * 7) % slots);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = ms * 1e3 / iters;
    printf("%-34s %7.2f us %6.0f GB/s\n", name, us, per / us / 1e3);
  };
  char name[64];
#define ROWS(V, S, PERSM)                                                      \
  for (int g : {132 * PERSM}) {                                                \
    snprintf(name, 64, "rows16 V%d S%d grid %d", V, S, g);                     \
    time(name,                                                                 \
         [&](int s) { rows16<V, S><<<g, 256>>>(W + s * per, items, out); });   \
  }
  ROWS(1, 4, 2)
  ROWS(1, 4, 3)
  ROWS(1, 8, 2)
  ROWS(2, 2, 2) ROWS(2, 4, 2) ROWS(2, 4, 3) ROWS(4, 2, 2) ROWS(4, 2, 3)
      ROWS(4, 4, 2) for (int g : {132, 264, 396, 528}) for (int s : {4, 8}) {
    snprintf(name, 64, "linear S%d grid %d", s, g);
    if (s == 4)
      time(name,
           [&](int sl) { linear<4><<<g, 256>>>(W + sl * per, per, out); });
    else
      time(name,
           [&](int sl) { linear<8><<<g, 256>>>(W + sl * per, per, out); });
  }
  CHECK(cudaGetLastError());
  return 0;
}
