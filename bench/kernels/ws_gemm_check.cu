// The warp-specialised wgmma GEMM (nf_wgmma.cuh wgmma_ws_gemm, through
// nf::linear with bf16 rows and 128 x 256 tiles, as the bf16-input plans
// run the Nano shared expert) against a plain f32 reference, for row counts
// whose last tile leaves a consumer warpgroup without rows. Built with
// -DNF_WS_SKEW_TEST, the consumer warps of a warpgroup run out of step (a
// sleep before each stage), which deadlocked the stage barriers when one
// arrival per warpgroup released a stage.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels [-DNF_WS_SKEW_TEST] \
//     bench/kernels/ws_gemm_check.cu -o ws_gemm_check && ./ws_gemm_check
//
// The same GEMMs with FP8 E4M3 weights that the producer widens to bf16 as
// it loads them (S::kCodesOnLoad), against the reference over the codes'
// bf16 values (exact), and each launch's time beside the bf16 weights'.
//
// Exit status 1 when a launch does not finish within 10 s or an output
// differs from the f64 reference by more than 3e-5 of the sum of its
// terms' magnitudes (f32 accumulation over K = 2688 or 3712 products).
#include "cuda_check.h"
#include "nf_common.cuh"
#include "nf_linear.cuh"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <unistd.h>

namespace {
constexpr long long kOut = 256ll << 20; // output rows' arena offset
constexpr int kMaxRows = 8192;

template <int N_, int K_> struct Spec : nf::DenseGroups {
  using W = nf::bf16;
  static constexpr int N = N_, K = K_;
  __device__ static __forceinline__ const W *weight(nf::Step a, int) {
    return nf::weight<nf::bf16>(a, 0);
  }
  static constexpr bool kRowsBf16 = true;
  static constexpr long long PLANE = 0ll;
  __device__ static __forceinline__ const unsigned short *row16(nf::Step a,
                                                                int r) {
    return nf::arena<unsigned short>(a, 0) + static_cast<long long>(r) * K;
  }
  __device__ static __forceinline__ void store2(nf::Step a, int r, int n,
                                                float v0, float v1) {
    float *o = nf::arena<float>(a, kOut) + static_cast<long long>(r) * N + n;
    o[0] = v0;
    o[1] = v1;
  }
  __device__ static __forceinline__ void store(nf::Step a, int r, int n,
                                               float v) {
    nf::arena<float>(a, kOut)[static_cast<long long>(r) * N + n] = v;
  }
};
using Down = Spec<2688, 3712>; // the Nano shared expert's down projection
using Up = Spec<3712, 2688>;   // and its up projection
// FP8 codes in weights[1], widened as they load (weights[0] is not read).
template <int N_, int K_> struct CodesSpec : Spec<N_, K_> {
  static constexpr bool kCodesOnLoad = true;
  __device__ static __forceinline__ const nf::fp8e4m3 *codes(nf::Step a, int) {
    return nf::weight<nf::fp8e4m3>(a, 1);
  }
};
using DownCodes = CodesSpec<2688, 3712>;
using UpCodes = CodesSpec<3712, 2688>;

__global__ void __launch_bounds__(384)
    down(const nf_step_args *args, char *arena) {
  nf::linear<Down, 1, true, true, 256>(nf::Step{args, arena});
}
__global__ void __launch_bounds__(384)
    up(const nf_step_args *args, char *arena) {
  nf::linear<Up, 1, true, true, 256>(nf::Step{args, arena});
}

__global__ void __launch_bounds__(384)
    down_codes(const nf_step_args *args, char *arena) {
  nf::linear<DownCodes, 1, true, true, 256>(nf::Step{args, arena});
}
__global__ void __launch_bounds__(384)
    up_codes(const nf_step_args *args, char *arena) {
  nf::linear<UpCodes, 1, true, true, 256>(nf::Step{args, arena});
}

// An E4M3 code's value as bf16 bits (exact: 3 mantissa bits, exponents
// 2^-9 .. 2^8).
unsigned short e4m3_as_bf16(unsigned code) {
  const unsigned e = (code >> 3) & 15u, m = code & 7u;
  const float v = e == 0 ? std::ldexp(float(m), -9)
                         : std::ldexp(1.0f + m / 8.0f, int(e) - 7);
  unsigned bits;
  std::memcpy(&bits, &v, 4);
  return static_cast<unsigned short>(bits >> 16 | (code & 0x80u) << 8);
}

__global__ void reference(const unsigned short *x, const unsigned short *w,
                          double *out, double *mag, int rows, int N, int K) {
  const long long i = blockIdx.x * 256ll + threadIdx.x;
  if (i >= static_cast<long long>(rows) * N)
    return;
  const long long r = i / N, n = i % N;
  double s = 0.0, m = 0.0;
  for (int k = 0; k < K; ++k) {
    const double p =
        double(__uint_as_float(static_cast<unsigned>(x[r * K + k]) << 16)) *
        __uint_as_float(static_cast<unsigned>(w[n * K + k]) << 16);
    s += p;
    m += fabs(p);
  }
  out[i] = s;
  mag[i] = m;
}
} // namespace

int main() {
  constexpr unsigned kSmem = nf::wgmma_ws_smem<256>();
  char *arena = device_alloc<char>(kOut + 4ll * kMaxRows * 3712);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> mant(-256, 255);
  std::vector<unsigned short> host(static_cast<size_t>(kMaxRows) * 3712);
  for (auto &v : host) // bf16 values around +-1
    v = static_cast<unsigned short>(0x3f80 + mant(rng)) | (rng() & 1) << 15;
  CHECK(
      cudaMemcpy(arena, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  host.resize(3712ull * 2688);
  const unsigned short *w = upload(host);
  // Codes of every finite value (no NaN: 0x7f, 0xff) and their bf16 values.
  std::vector<unsigned char> codes(host.size());
  std::vector<unsigned short> widened(host.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    unsigned c = rng() & 0xffu;
    if ((c & 0x7fu) == 0x7fu)
      c ^= 1u;
    codes[i] = static_cast<unsigned char>(c);
    widened[i] = e4m3_as_bf16(c);
  }
  const unsigned char *wc = upload(codes);
  const unsigned short *ww = upload(widened);
  const void *weights[2] = {w, wc};
  const void **dweights = device_alloc<const void *>(2);
  CHECK(cudaMemcpy(dweights, weights, sizeof(weights), cudaMemcpyHostToDevice));
  nf_step_args args{};
  args.arena = arena;
  args.weights = dweights;
  nf_step_args *dargs = device_alloc<nf_step_args>(1);
  double *ref = device_alloc<double>(static_cast<size_t>(kMaxRows) * 3712);
  double *mag = device_alloc<double>(static_cast<size_t>(kMaxRows) * 3712);
  CHECK(cudaFuncSetAttribute(down, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmem));
  CHECK(cudaFuncSetAttribute(up, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmem));
  CHECK(cudaFuncSetAttribute(
      down_codes, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CHECK(cudaFuncSetAttribute(
      up_codes, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  // Last tiles of 1, 40, 64 rows (the second consumer warpgroup idle), of
  // 65 and 128, and GEMV-only steps (<= kGemvRows).
  const int sizes[] = {2049, 1856, 2048, 2112, 2100, 8000, 129, 64, 40, 8, 1};
  bool ok = true;
  for (int kind = 0; kind < 4; ++kind)
    for (int rows : sizes) {
      const int which = kind & 1;
      const bool fp8 = kind >= 2;
      const int N = which ? Up::N : Down::N, K = which ? Up::K : Down::K;
      args.num_tokens = rows;
      CHECK(cudaMemcpy(dargs, &args, sizeof(args), cudaMemcpyHostToDevice));
      float ms = 0.0f;
      for (int rep = 0; rep < 20; ++rep) {
        CHECK(cudaMemset(arena + kOut, 0xff, 4ll * rows * N));
        CHECK(cudaEventRecord(e0));
        auto *kernel =
            fp8 ? (which ? up_codes : down_codes) : (which ? up : down);
        kernel<<<132, 384, kSmem>>>(dargs, arena);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaGetLastError());
        const auto t0 = std::chrono::steady_clock::now();
        cudaError_t q;
        while ((q = cudaStreamQuery(nullptr)) == cudaErrorNotReady) {
          if (std::chrono::steady_clock::now() - t0 >
              std::chrono::seconds(10)) {
            std::printf("%s, %d rows: launch %d did not finish in 10 s\n",
                        which ? "up" : "down", rows, rep);
            std::fflush(stdout);
            _exit(1); // the context cannot be torn down under a hung kernel
          }
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        CHECK(q);
        float m = 0.0f;
        CHECK(cudaEventElapsedTime(&m, e0, e1));
        ms += rep > 0 ? m : 0.0f; // the first launch warms up
      }
      reference<<<static_cast<unsigned>((1ll * rows * N + 255) / 256), 256>>>(
          reinterpret_cast<const unsigned short *>(arena), fp8 ? ww : w, ref,
          mag, rows, N, K);
      CHECK(cudaDeviceSynchronize());
      std::vector<float> got(static_cast<size_t>(rows) * N);
      std::vector<double> want(got.size()), size(got.size());
      CHECK(cudaMemcpy(got.data(), arena + kOut, got.size() * 4,
                       cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(want.data(), ref, want.size() * 8,
                       cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(size.data(), mag, size.size() * 8,
                       cudaMemcpyDeviceToHost));
      double worst = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs(got[i] - want[i]) / (size[i] + 1e-30);
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
      }
      const bool pass = worst <= 3e-5;
      ok = ok && pass;
      std::printf("%s %s, %5d rows: 20 launches, %8.1f us each, max "
                  "relative difference %.2e %s\n",
                  which ? "up  " : "down", fp8 ? "fp8 " : "bf16", rows,
                  1e3 * ms / 19, worst, pass ? "ok" : "FAIL");
    }
  return ok ? 0 : 1;
}
