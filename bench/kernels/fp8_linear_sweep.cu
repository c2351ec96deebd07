// FP8 E4M3 weights (codes and one f32 scale per output feature) against
// bf16 weights in the decode linears (kernels/nf_linear_row.cuh,
// nf_linear_skinny.cuh), on the shapes of Nemotron-3-Nano-30B-A3B's decode
// step: batch 1 (row_linear, a warp per F features, and candidates for it:
// rowp; the routed experts 6 of 128, in_proj, out_proj) and the skinny
// variants at 4 and 16 rows an
// expert and 32 rows of in_proj. For each it prints microseconds, GB/s of
// weight bytes (FP8: codes and scales) next to the device-to-device copy
// bandwidth measured in the same run, the FP8 / bf16 time ratio (the bytes
// halve, so 0.5 is the roofline's), and the FP8 output's largest difference
// from a host f64 product of the same codes, scales and activations,
// relative to the largest output. A benchmark, not a test. Build it against
// two kernel trees (-I) to compare two versions of a kernel on one machine
// (-DNF_SWEEP_F1_ONLY for a tree whose row_linear has no F).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels -I bench/kernels \
//     bench/kernels/fp8_linear_sweep.cu -o fp8_linear_sweep &&
//     ./fp8_linear_sweep
#define NF_ARENA_FROM_ARGS 1
#include "nf_linear.cuh"

#include "cuda_check.h"
#include "skinny_spec.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>

namespace {

// The FP8 copy of Spec: codes in weights[1] (E x N x K bytes), row scales
// in weights[2] (E x N f32).
template <int N_, int K_, int E> struct Fp8Spec : Spec<N_, K_, E> {
  using W = nf::fp8e4m3;
  static constexpr bool kRowScales = true;
  __device__ static __forceinline__ const W *weight(nf::Step a, int g) {
    return static_cast<const W *>(a->weights[1]) +
           static_cast<long long>(g) * N_ * K_;
  }
  __device__ static __forceinline__ const float *row_scales(nf::Step a, int g) {
    return static_cast<const float *>(a->weights[2]) +
           static_cast<long long>(g) * N_;
  }
};

// Varied finite codes (no NaN codes) and scales around 1/448.
__global__ void fillCodes(unsigned char *c, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2246822519u + 374761393u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    unsigned code = h & 0xffu;
    c[i] =
        static_cast<unsigned char>((code & 0x7fu) == 0x7fu ? code ^ 1u : code);
  }
}
__global__ void fillScales(float *s, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    s[i] = (1.0f + (i % 7) / 8.0f) / 448.0f;
}

double decode(unsigned code) {
  const unsigned e = (code >> 3) & 15u, m = code & 7u;
  const double v = e == 0 ? std::ldexp(double(m), -9)
                          : std::ldexp(1.0 + m / 8.0, int(e) - 7);
  return (code & 0x80u) ? -v : v;
}

template <class S, int U, int F = 1>
__global__ void __launch_bounds__(256, 3) rowk(const nf_step_args *args) {
#ifdef NF_SWEEP_F1_ONLY
  nf::row_linear<S, U, 1>(nf::Step{args, nullptr});
#else
  nf::row_linear<S, U, 1, F>(nf::Step{args, nullptr});
#endif
}
template <class S, int MT, int STAGES, int KW, int TERMS, bool kStageX,
          int ROWS>
__global__ void __launch_bounds__(32 * KW) skinnyk(const nf_step_args *args) {
  nf::skinny_linear<S, MT, STAGES, KW, TERMS, kStageX, false, ROWS>(
      nf::Step{args, nullptr});
}

// Candidates for the FP8 row GEMV, timed next to row_linear.
// Four E4M3 codes as floats by bit placement: each code's sign at bit 31
// and its exponent and mantissa bits at 20-26 make an f32 whose exponent is
// 120 short (subnormal codes land on f32 denormals of the same bits), then
// times 2^120, exactly: integer and FP32 pipes only, against
// fp8x4_to_f32x4's cvt.rn.f16x2.e4m3x2 and f16 -> f32 (H100: 5-15% slower
// here, bench/results/2026-12-07d).
__device__ __forceinline__ void fp8x4_bits(unsigned w, float *out) {
  const unsigned s4 = w >> 4, l4 = w << 4, l8 = w << 8;
  const unsigned b0 = ((l8 & 0x8000u) | (l4 & 0x07f0u)) << 16;
  const unsigned b1 = ((w & 0x8000u) | (s4 & 0x07f0u)) << 16;
  const unsigned b2 = (l8 & 0x80000000u) | (l4 & 0x07f00000u);
  const unsigned b3 = (w & 0x80000000u) | (s4 & 0x07f00000u);
  out[0] = __uint_as_float(b0) * 0x1p120f;
  out[1] = __uint_as_float(b1) * 0x1p120f;
  out[2] = __uint_as_float(b2) * 0x1p120f;
  out[3] = __uint_as_float(b3) * 0x1p120f;
}
template <class W, int MODE>
__device__ __forceinline__ void unpack_chunk(uint4 v, float *out) {
  if constexpr (MODE == 3 && sizeof(W) == 1) {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 16; ++i)
      out[i] = __uint_as_float(u[i / 4] & (0x3f7fffffu ^ i));
  } else if constexpr (MODE == 1 && sizeof(W) == 1) {
    fp8x4_bits(v.x, out);
    fp8x4_bits(v.y, out + 4);
    fp8x4_bits(v.z, out + 8);
    fp8x4_bits(v.w, out + 12);
  } else {
    nf::RowChunk<W>::unpack(v, out);
  }
}
// row_linear's loop for one row, arranged otherwise: a lane loads its
// activation chunk first, then decodes and multiplies each of the P
// features' weight chunks in turn (one feature's floats live at a time).
// On the H100, FP8 at P = 2: 14.5 us for Nano's routed expert up
// projection, against 20.1 for row_linear<.., 6, 1, 2> with the
// bit-placement decoder; the same order in row_linear with the hardware
// conversion changed nothing end to end (Nano batch 1: 363 against 364
// tok/s, bench/results/2026-12-07e/ab-row-order.md).
template <class S, int U, int P, int MODE>
__global__ void __launch_bounds__(256, 3) rowp(const nf_step_args *args) {
  using namespace nf;
  const Step a{args, nullptr};
  using W = typename S::W;
  constexpr int E = RowChunk<W>::E;
  constexpr int C = S::K / E, J = (C + 31) / 32, UU = U < J ? U : J;
  constexpr int NF = (S::N + P - 1) / P;
  __shared__ GroupItems<S> s_groups;
  wait_for_previous_grids();
  s_groups.build(a, [](int c) { return c * NF; });
  const int items = s_groups.total();
  const int lane = lane_id();
  for (long long item = global_warp(a); item < items; item += grid_warps(a)) {
    const int g = s_groups.group_of(static_cast<int>(item));
    const int local = static_cast<int>(item) - s_groups.first[g];
    const int chunk = local / NF;
    const int n0 = local % NF * P;
    const int row = s_groups.begin[g] + chunk;
    const W *wrow[P];
#pragma unroll
    for (int f = 0; f < P; ++f)
      wrow[f] = S::weight(a, g) +
                static_cast<long long>(min(n0 + f, S::N - 1)) * S::K;
    auto fetch = [&](int f, int c) {
      return n0 + f < S::N && c < C ? load_stream16(wrow[f] + E * c)
                                    : make_uint4(0u, 0u, 0u, 0u);
    };
    uint4 w[UU][P];
#pragma unroll
    for (int j = 0; j < UU; ++j)
#pragma unroll
      for (int f = 0; f < P; ++f)
        w[j][f] = fetch(f, lane + 32 * j);
    const float *xr = S::row(a, row);
    float acc[P];
#pragma unroll
    for (int f = 0; f < P; ++f)
      acc[f] = 0.0f;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = lane + 32 * j;
      uint4 wv[P];
#pragma unroll
      for (int f = 0; f < P; ++f) {
        wv[f] = w[j % UU][f];
        if (j + UU < J)
          w[j % UU][f] = fetch(f, c + 32 * UU);
      }
      if (c < C) {
        float xv[E];
        if constexpr (MODE == 2) {
#pragma unroll
          for (int i = 0; i < E; ++i)
            xv[i] = 1.0f + 0.001f * (lane + i);
        } else {
#pragma unroll
          for (int i = 0; i < E; i += 4)
            load4_act(xr + E * c + i, xv + i);
        }
#pragma unroll
        for (int f = 0; f < P; ++f) {
          float wf[E];
          unpack_chunk<W, MODE>(wv[f], wf);
#pragma unroll
          for (int i = 0; i < E; ++i)
            acc[f] = fmaf(wf[i], xv[i], acc[f]);
        }
      }
    }
#pragma unroll
    for (int f = 0; f < P; ++f) {
      const float v = warp_sum(acc[f]);
      if (lane == 0 && n0 + f < S::N)
        S::store(a, row, n0 + f, scaled_output<S>(a, g, n0 + f, v));
    }
  }
}

struct Device {
  SweepDevice d;
  unsigned char *codes = nullptr;
  float *scales = nullptr;
};

template <int N, int K, int E> struct Shape {
  using B = Spec<N, K, E>;
  using F = Fp8Spec<N, K, E>;
  const Device &dev;
  Problem p;

  template <class Kernel> float time(Kernel k, int block, int smem) const {
    int perSm = 0;
    CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem));
    CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, k, block, smem));
    const int grid = std::min(perSm, 3) * dev.d.sms;
    return timeSteps(k, grid, block, smem, p, dev.d.dArgs, dev.d.arena);
  }
  // The FP8 output of step 0 against the host's f64 product.
  double error() const {
    const std::vector<int32_t> off = offsetsOf(p, 0);
    const int rows = off[E];
    std::vector<float> y(size_t(rows) * N), x(size_t(rows) * K);
    CHECK(cudaMemcpy(y.data(), dev.d.arena + kYOff, y.size() * 4,
                     cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(x.data(), dev.d.arena + kXOff, x.size() * 4,
                     cudaMemcpyDeviceToHost));
    std::vector<unsigned char> c(size_t(N) * K);
    std::vector<float> sc(N);
    double err = 0, scale = 1e-30;
    for (int g = 0; g < E; ++g) {
      if (off[g + 1] == off[g])
        continue;
      CHECK(cudaMemcpy(c.data(), dev.codes + size_t(g) * N * K, c.size(),
                       cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(sc.data(), dev.scales + size_t(g) * N, N * 4,
                       cudaMemcpyDeviceToHost));
      for (int r = off[g]; r < off[g + 1]; ++r)
        for (int n = 0; n < N; ++n) {
          double s = 0;
          for (int k = 0; k < K; ++k)
            s += decode(c[size_t(n) * K + k]) * double(x[size_t(r) * K + k]);
          s *= sc[n];
          err = std::max(err, std::fabs(s - y[size_t(r) * N + n]));
          scale = std::max(scale, std::fabs(s));
        }
    }
    return err / scale;
  }
  template <class KB, class KF>
  void compare(const char *label, KB kb, KF kf, int block, int smemB,
               int smemF) const {
    const float ub = time(kb, block, smemB), uf = time(kf, block, smemF);
    CHECK(cudaMemset(dev.d.arena + kYOff, 0xff, size_t(64) * N * 4));
    // Step 0's dispatch, then one launch for the check.
    const std::vector<int32_t> off = offsetsOf(p, 0);
    CHECK(cudaMemcpy(dev.d.arena, off.data(), sizeof(int32_t) * (E + 1),
                     cudaMemcpyHostToDevice));
    int perSm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kf, block,
                                                        smemF));
    kf<<<std::min(perSm, 3) * dev.d.sms, block, smemF>>>(dev.d.dArgs);
    CHECK(cudaDeviceSynchronize());
    const double err = error();
    const double active = E == 16 ? 1 : p.active;
    const double bB = active * N * K * 2, bF = active * N * (K + 4.0);
    std::printf("%-11s rows %2d %-22s bf16 %7.2f us (%3.0f%%)  fp8 %7.2f us "
                "(%3.0f%%)  fp8/bf16 %.2f  err %.1e\n",
                p.name, p.rows, label, ub, 100 * bB / (ub * 1e3) / dev.d.copy,
                uf, 100 * bF / (uf * 1e3) / dev.d.copy, uf / ub, err);
  }
  void rows1() const {
    compare("row U6", rowk<B, 6>, rowk<F, 6>, 256, 0, 0);
    compare("row U8 / U4", rowk<B, 8>, rowk<F, 4>, 256, 0, 0);
#ifndef NF_SWEEP_F1_ONLY
    compare("row U6 / U6 F2", rowk<B, 6>, rowk<F, 6, 2>, 256, 0, 0);
    compare("row U6 / U3 F2", rowk<B, 6>, rowk<F, 3, 2>, 256, 0, 0);
    compare("row U6 / U2 F4", rowk<B, 6>, rowk<F, 2, 4>, 256, 0, 0);
    compare("row U6 F2 / U6", rowk<B, 6, 2>, rowk<F, 6>, 256, 0, 0);
    compare("row U4 F2 / U6", rowk<B, 4, 2>, rowk<F, 6>, 256, 0, 0);
#endif
    compare("row U6 / bits U6", rowk<B, 6>, rowp<F, 6, 1, 1>, 256, 0, 0);
    compare("row U6 / bits F2 U6", rowk<B, 6>, rowp<F, 6, 2, 1>, 256, 0, 0);
    compare("row U6 / rowp F2 U6", rowk<B, 6>, rowp<F, 6, 2, 0>, 256, 0, 0);
    compare("row U6 / no-x U6", rowk<B, 6>, rowp<F, 6, 1, 2>, 256, 0, 0);
    compare("row U6 / no-x F2 U6", rowk<B, 6>, rowp<F, 6, 2, 2>, 256, 0, 0);
    compare("row U6 / raw U6", rowk<B, 6>, rowp<F, 6, 1, 3>, 256, 0, 0);
    compare("row U6 / raw F2 U6", rowk<B, 6>, rowp<F, 6, 2, 3>, 256, 0, 0);
  }
  template <int ST> void narrow() const {
    constexpr int smem = nf::skinny_smem<B, 1, 8, false>();
    char label[48];
    std::snprintf(label, sizeof label, "narrow ST4 / ST%d", ST);
    compare(label, skinnyk<B, 1, 4, 8, 1, false, 16>,
            skinnyk<F, 1, ST, 8, 1, false, 16>, 256, smem, smem);
  }
  template <int KW, int ST, int ROWS> void wide() const {
    constexpr int smem = nf::skinny_smem<B, 2, KW, true, false, ROWS>();
    char label[48];
    std::snprintf(label, sizeof label, "wide W%d R%d ST2 / ST%d", KW, ROWS, ST);
    compare(label, skinnyk<B, 2, 2, KW, 1, true, ROWS>,
            skinnyk<F, 2, ST, KW, 1, true, ROWS>, 32 * KW, smem, smem);
  }
};

} // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  Device dev{sweep_device()};
  const size_t codeBytes = 128ull * 1856 * 2688;
  dev.codes = device_alloc<unsigned char>(codeBytes);
  fillCodes<<<4096, 256>>>(dev.codes, codeBytes);
  dev.scales = device_alloc<float>(128ull * 10304);
  fillScales<<<256, 256>>>(dev.scales, 128ull * 10304);
  // weights[0] bf16 (sweep_device), [1] codes, [2] scales.
  nf_step_args args{};
  CHECK(cudaMemcpy(&args, dev.d.dArgs, sizeof args, cudaMemcpyDeviceToHost));
  const void *w[3];
  CHECK(cudaMemcpy(w, args.weights, sizeof(void *), cudaMemcpyDeviceToHost));
  w[1] = dev.codes;
  w[2] = dev.scales;
  const void **dW = upload(std::vector<const void *>(w, w + 3));
  args.weights = dW;
  CHECK(cudaMemcpy(dev.d.dArgs, &args, sizeof args, cudaMemcpyHostToDevice));

  const Shape<1856, 2688, 128> up1{dev, {"expert_up", 128, 1856, 2688, 6}};
  const Shape<2688, 1856, 128> dn1{dev, {"expert_dn", 128, 2688, 1856, 6}};
  const Shape<10304, 2688, 16> in1{dev, {"in_proj", 16, 10304, 2688, 1}};
  const Shape<2688, 4096, 16> out1{dev, {"out_proj", 16, 2688, 4096, 1}};
  up1.rows1();
  dn1.rows1();
  in1.rows1();
  out1.rows1();
  const Shape<1856, 2688, 128> up4{dev, {"expert_up", 128, 1856, 2688, 6, 4}};
  const Shape<10304, 2688, 16> in4{dev, {"in_proj", 16, 10304, 2688, 1, 4}};
  up4.narrow<4>();
  up4.narrow<8>();
  in4.narrow<4>();
  in4.narrow<8>();
  const Shape<1856, 2688, 128> up16{dev, {"expert_up", 128, 1856, 2688, 24, 8}};
  const Shape<2688, 1856, 128> dn16{dev, {"expert_dn", 128, 2688, 1856, 24, 8}};
  up16.wide<4, 2, 16>();
  up16.wide<4, 4, 16>();
  up16.wide<8, 2, 16>();
  up16.wide<8, 4, 16>();
  dn16.wide<4, 2, 16>();
  dn16.wide<4, 4, 16>();
  const Shape<10304, 2688, 16> in32{dev, {"in_proj", 16, 10304, 2688, 1, 32}};
  in32.wide<4, 2, 32>();
  in32.wide<4, 4, 32>();
  return 0;
}
