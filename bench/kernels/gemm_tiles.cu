// Prefill GEMM tiles of kernels/ side by side on the shapes of
// Nemotron-3-Nano-30B-A3B's prefill (8192 tokens): the mma.sync pipeline
// (pipelined_mma_tile, nf_linear.cuh) and the Hopper wgmma tiles
// (wgmma_tile, nf_wgmma.cuh), for bf16 inputs (1 plane) and exact inputs
// (3 planes), and the warp-specialised wgmma GEMM (wgmma_ws_gemm, bf16
// inputs) with 64 CW x TN tiles. Each result is checked against a plain f32
// reference kernel (max error relative to the largest |reference|); a
// benchmark, not a test: it prints TFLOP/s of each tile kind.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels bench/kernels/gemm_tiles.cu \
//     -o gemm_tiles && ./gemm_tiles
#include "nf_linear.cuh"
#include "nf_wgmma.cuh"

#include "cuda_check.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <type_traits>
#include <vector>

__device__ const nf::bf16 *g_w;
__device__ const unsigned short *g_a;
__device__ float *g_c;

constexpr long long kMaxRows = 8192;

template <int N_, int K_> struct Spec {
  using W = nf::bf16;
  static constexpr int N = N_, K = K_;
  static constexpr long long PLANE = kMaxRows * K_;
  __device__ static const W *weight(nf::Step, int) { return g_w; }
  __device__ static const unsigned short *row16(nf::Step, int r) {
    return g_a + static_cast<long long>(r) * K;
  }
  __device__ static void store(nf::Step, int r, int n, float v) {
    g_c[static_cast<long long>(r) * N + n] = v;
  }
};

/// The same with column pairs stored at once (S::store2).
template <int N_, int K_> struct Spec2 : Spec<N_, K_> {
  static constexpr bool kStore2 = true;
  __device__ static void store2(nf::Step, int r, int n, float v0, float v1) {
    nf::store_act2(g_c + static_cast<long long>(r) * N_ + n, v0, v1);
  }
};

template <class S, int TERMS, bool WG>
__global__ void __launch_bounds__(256) gemm(int M) {
  extern __shared__ float4 smem[];
  const int NT = (S::N + 127) / 128, MT = (M + 127) / 128;
  for (int t = blockIdx.x; t < NT * MT; t += gridDim.x) {
    const int mt = t / NT, nt = t % NT;
    const int rows = min(128, M - mt * 128);
    if constexpr (WG) {
#ifdef NF_HAS_WGMMA
      nf::wgmma_tile<S, TERMS>(nf::Step{}, 0, mt * 128, rows, nt * 128,
                               reinterpret_cast<unsigned char *>(smem));
#endif
    } else {
      nf::pipelined_mma_tile<S, TERMS>(
          nf::Step{}, 0, mt * 128, rows, nt * 128,
          reinterpret_cast<unsigned short *>(smem));
    }
  }
}

__global__ void fill(unsigned short *p, long long n, unsigned seed,
                     float scale) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n;
       i += gridDim.x * 256ll) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = (static_cast<float>(h & 0xFFFF) / 65536.0f - 0.5f) * scale;
    p[i] = nf::f32_to_bf16_rn(v);
  }
}

__global__ void reference(const unsigned short *a, const unsigned short *w,
                          float *c, int M, int N, int K, int terms,
                          long long plane) {
  const long long i = blockIdx.x * 256ll + threadIdx.x;
  if (i >= static_cast<long long>(M) * N)
    return;
  const int r = static_cast<int>(i / N), n = static_cast<int>(i % N);
  float s = 0.0f;
  for (int p = 0; p < terms; ++p)
    for (int k = 0; k < K; ++k)
      s = fmaf(nf::bf16_bits_to_f32(
                   a[p * plane + static_cast<long long>(r) * K + k]),
               nf::bf16_bits_to_f32(w[static_cast<long long>(n) * K + k]), s);
  c[i] = s;
}

template <class S, int TN, int CW>
__global__ void __launch_bounds__(nf::wgmma_ws_threads<CW>()) gemm_ws(int M) {
#ifdef NF_HAS_WGMMA
  extern __shared__ float4 smem[];
  constexpr int TM = 64 * CW;
  const int NT = (S::N + TN - 1) / TN, MT = (M + TM - 1) / TM;
  nf::wgmma_ws_gemm<S, TN, CW>(
      nf::Step{}, NT * MT,
      [&](int t, int &g, int &row0, int &rows, int &n0) {
        const int mt = t / NT, nt = t % NT;
        g = 0;
        row0 = mt * TM;
        rows = min(TM, M - row0);
        n0 = nt * TN;
      },
      reinterpret_cast<unsigned char *>(smem));
#endif
}

/// Runs launch() once against the f32 reference kernel, then times it and
/// prints its TFLOP/s (and the tensor-core rate over all TERMS planes).
template <class Launch>
void check_and_time(const char *name, const char *kind, int terms, int M, int N,
                    int K, const unsigned short *a, const unsigned short *w,
                    long long plane, float *c, float *ref, Launch launch) {
  const long long outs = static_cast<long long>(M) * N;
  CHECK(cudaMemset(c, 0, outs * 4));
  launch();
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  reference<<<(outs + 255) / 256, 256>>>(a, w, ref, M, N, K, terms, plane);
  CHECK(cudaDeviceSynchronize());
  std::vector<float> hc(outs), hr(outs);
  CHECK(cudaMemcpy(hc.data(), c, outs * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hr.data(), ref, outs * 4, cudaMemcpyDeviceToHost));
  double maxRef = 0, maxErr = 0;
  for (long long i = 0; i < outs; ++i) {
    maxRef = std::max(maxRef, std::fabs(double(hr[i])));
    maxErr = std::max(maxErr, std::fabs(double(hc[i]) - hr[i]));
  }
  const float ms = time_ms(launch, 10, false);
  const double tflops = 2.0 * M * N * K / (ms * 1e-3) / 1e12;
  std::printf("%-8s %-9s terms %d  M %5d N %5d K %5d  %7.3f ms  %6.1f TFLOP/s"
              "  (x%d terms: %6.1f)  max err %.2e of %.2e %s\n",
              name, kind, terms, M, N, K, ms, tflops, terms, tflops * terms,
              maxErr, maxRef, maxErr <= 1e-4 * maxRef ? "ok" : "WRONG");
}

/// The warp-specialised GEMM (wgmma_ws_gemm) with 64 CW x TN tiles.
template <int N, int K, int TN, int CW = 2, bool kStore2 = false>
void run_ws(const char *name, int M, unsigned short *a, unsigned short *w,
            float *c, float *ref) {
  using S = std::conditional_t<kStore2, Spec2<N, K>, Spec<N, K>>;
  constexpr int smem = nf::wgmma_ws_smem<TN, CW>();
  CHECK(cudaFuncSetAttribute(
      gemm_ws<S, TN, CW>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  char kind[16];
  std::snprintf(kind, sizeof kind, "ws %dx%d%s", 64 * CW, TN,
                kStore2 ? "p" : "");
  check_and_time(name, kind, 1, M, N, K, a, w, S::PLANE, c, ref, [&] {
    gemm_ws<S, TN, CW><<<132, nf::wgmma_ws_threads<CW>(), smem>>>(M);
  });
}

template <int N, int K, int TERMS, bool WG>
void run(const char *name, int M, unsigned short *a, unsigned short *w,
         float *c, float *ref) {
  using S = Spec<N, K>;
  const int smem =
      WG ? nf::wgmma_gemm_smem<TERMS>() : nf::pipelined_gemm_smem<TERMS>();
  CHECK(cudaFuncSetAttribute(
      gemm<S, TERMS, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int perSm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &perSm, gemm<S, TERMS, WG>, 256, smem));
  const int grid = 132 * std::max(perSm, 1);
  check_and_time(name, WG ? "wgmma" : "mma", TERMS, M, N, K, a, w, S::PLANE, c,
                 ref, [&] { gemm<S, TERMS, WG><<<grid, 256, smem>>>(M); });
}

int main() {
  unsigned short *a, *w;
  float *c, *ref;
  const long long aElems = 3 * kMaxRows * 4096, wElems = 10304ll * 4096;
  CHECK(cudaMalloc(&a, aElems * 2));
  CHECK(cudaMalloc(&w, wElems * 2));
  CHECK(cudaMalloc(&c, kMaxRows * 10304ll * 4));
  CHECK(cudaMalloc(&ref, kMaxRows * 10304ll * 4));
  fill<<<1024, 256>>>(a, aElems, 1u, 2.0f);
  fill<<<1024, 256>>>(w, wElems, 2u, 0.1f);
  CHECK(cudaMemcpyToSymbol(g_w, &w, sizeof w));
  const unsigned short *ca = a;
  CHECK(cudaMemcpyToSymbol(g_a, &ca, sizeof ca));
  CHECK(cudaMemcpyToSymbol(g_c, &c, sizeof c));
  // Ragged shapes first (tile bounds, a K tail), then the Nano shapes.
  run<1000, 1000, 1, true>("ragged", 300, a, w, c, ref);
  run<1000, 1000, 3, true>("ragged", 300, a, w, c, ref);
  run<10304, 2688, 1, false>("in_proj", 8192, a, w, c, ref);
  run<10304, 2688, 1, true>("in_proj", 8192, a, w, c, ref);
  run<2688, 4096, 1, false>("out_proj", 8192, a, w, c, ref);
  run<2688, 4096, 1, true>("out_proj", 8192, a, w, c, ref);
  run<1856, 2688, 1, true>("expert", 384, a, w, c, ref);
  run<1856, 2688, 1, false>("expert", 384, a, w, c, ref);
  run_ws<1000, 1000, 128>("ragged", 300, a, w, c, ref);
  run_ws<1000, 1000, 192>("ragged", 300, a, w, c, ref);
  run_ws<1000, 1000, 256>("ragged", 300, a, w, c, ref);
  run_ws<10304, 2688, 128>("in_proj", 8192, a, w, c, ref);
  run_ws<10304, 2688, 192>("in_proj", 8192, a, w, c, ref);
  run_ws<10304, 2688, 256>("in_proj", 8192, a, w, c, ref);
  run_ws<2688, 4096, 128>("out_proj", 8192, a, w, c, ref);
  run_ws<2688, 4096, 192>("out_proj", 8192, a, w, c, ref);
  run_ws<2688, 4096, 256>("out_proj", 8192, a, w, c, ref);
  run_ws<1856, 2688, 192>("expert", 384, a, w, c, ref);
  run_ws<1856, 2688, 256>("expert", 384, a, w, c, ref);
  // Column pairs stored at once (S::store2).
  run_ws<1000, 1000, 192, 2, true>("ragged", 300, a, w, c, ref);
  run_ws<10304, 2688, 256, 2, true>("in_proj", 8192, a, w, c, ref);
  run_ws<2688, 4096, 192, 2, true>("out_proj", 8192, a, w, c, ref);
  run_ws<1856, 2688, 192, 2, true>("expert", 384, a, w, c, ref);
  run_ws<1000, 1000, 192, 3>("ragged", 300, a, w, c, ref);
  run_ws<10304, 2688, 192, 3>("in_proj", 8192, a, w, c, ref);
  run_ws<2688, 4096, 192, 3>("out_proj", 8192, a, w, c, ref);
  run_ws<1856, 2688, 192, 3>("expert", 384, a, w, c, ref);
  // Rows just past a whole tile (an expert's last tile mostly empty): one
  // consumer warpgroup idles.
  run_ws<1856, 2688, 192>("expert", 64 * 132 + 16, a, w, c, ref);
  run_ws<1856, 2688, 192>("expert", 64 * 132 + 80, a, w, c, ref);
  run<10304, 2688, 3, false>("in_proj", 8192, a, w, c, ref);
  run<10304, 2688, 3, true>("in_proj", 8192, a, w, c, ref);
  return 0;
}
