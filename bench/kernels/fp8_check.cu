// The kernels' FP8 E4M3 decoders against an independent host decode, over
// all 256 codes: fp8_e4m3_to_f32 (nf_common.cuh; the f32 paths),
// fp8x4_to_bf16x4 (the skinny GEMVs and the plane GEMMs' widening, which
// widen codes to bf16 with fma.rn.bf16x2: this checks that subnormal codes
// survive it) and fp8x4_to_f32x4 (the row GEMVs: from sm_89 the hardware
// e4m3x2 -> f16x2 conversion), each code at every byte position of a word.
// Exit status 0 when every value is exact (the NaN codes 0x7f / 0xff: NaN
// from the f32 decoders, +-480 from the bf16 one, as nf_common.cuh
// documents). scripts/gpu_check.sh runs it.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels bench/kernels/fp8_check.cu
#include "cuda_check.h"

#include "nf_common.cuh"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

// Code c at byte (c + shift) % 4 of word c / 4 ... : every code at every
// position, 256 words for each of the four shifts.
__global__ void decode(const unsigned *words, float *f32, float *viaBf16,
                       float *f32x4, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  const unsigned w = words[i];
  for (int b = 0; b < 4; ++b)
    f32[4 * i + b] = nf::fp8_e4m3_to_f32((w >> (8 * b)) & 0xffu);
  const uint2 h = nf::fp8x4_to_bf16x4(w);
  nf::unpack_bf16x2(h.x, viaBf16 + 4 * i);
  nf::unpack_bf16x2(h.y, viaBf16 + 4 * i + 2);
  nf::fp8x4_to_f32x4(w, f32x4 + 4 * i);
}

// E4M3 ("fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0
// subnormal; S.1111.111 NaN.
double reference(unsigned code) {
  const unsigned e = (code >> 3) & 15u, m = code & 7u;
  const double sign = (code & 0x80u) ? -1.0 : 1.0;
  if (e == 15u && m == 7u)
    return std::nan("");
  if (e == 0u)
    return sign * std::ldexp(double(m), -9);
  return sign * std::ldexp(1.0 + m / 8.0, int(e) - 7);
}

bool same(float got, double want) {
  if (std::isnan(want))
    return std::isnan(got);
  return double(got) == want &&
         std::signbit(got) == std::signbit(static_cast<float>(want));
}

} // namespace

int main() {
  constexpr int kWords = 256; // 4 shifts x 64 words of 4 codes
  std::vector<unsigned> words(kWords);
  for (int i = 0; i < kWords; ++i) {
    const int shift = i / 64, first = (i % 64) * 4;
    unsigned w = 0;
    for (int b = 0; b < 4; ++b)
      w |= unsigned((first + (b + shift) % 4) & 0xff) << (8 * b);
    words[i] = w;
  }
  unsigned *dw = upload(words);
  float *df = device_alloc<float>(4 * kWords);
  float *db = device_alloc<float>(4 * kWords);
  float *dx = device_alloc<float>(4 * kWords);
  decode<<<(kWords + 127) / 128, 128>>>(dw, df, db, dx, kWords);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> f(4 * kWords), b(4 * kWords), x(4 * kWords);
  CHECK(cudaMemcpy(f.data(), df, f.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(b.data(), db, b.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(x.data(), dx, x.size() * 4, cudaMemcpyDeviceToHost));
  int bad = 0, subnormals = 0;
  for (int i = 0; i < kWords; ++i)
    for (int k = 0; k < 4; ++k) {
      const unsigned code = (words[i] >> (8 * k)) & 0xffu;
      const double want = reference(code);
      const bool nanCode = (code & 0x7fu) == 0x7fu;
      const double wantBf16 =
          nanCode ? ((code & 0x80u) ? -480.0 : 480.0) : want;
      subnormals += ((code >> 3) & 15u) == 0u && (code & 7u) != 0u;
      if (!same(f[4 * i + k], want) || !same(b[4 * i + k], wantBf16) ||
          !same(x[4 * i + k], want)) {
        if (++bad <= 10)
          std::printf("code 0x%02x at byte %d: f32 %.9g, via bf16 %.9g, "
                      "f32x4 %.9g, want %.9g\n",
                      code, k, f[4 * i + k], b[4 * i + k], x[4 * i + k], want);
      }
    }
  std::printf("fp8_check: %d codes x 4 positions (%d subnormal decodes), %d "
              "wrong: %s\n",
              256, subnormals, bad, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}
