// Bandwidth of the decode SSM update (nf_kv.ssm_update: ssm_decode in
// kernels/nf_mamba.cuh) at the Nemotron-3-Nano-30B-A3B shape (64 heads of
// 64 channels, state 128, 8 groups) over its launch shape: blocks an SM
// (minimum-blocks launch bounds, so fewer registers) and threads a block,
// next to an in-place read-modify-write of the same state bytes (its
// ceiling: every state byte read once and written once) and the
// device-to-device copy of the same run. The state rotates over four
// copies so that no launch finds it in L2. A benchmark, not a test: it
// prints microseconds, GB/s of state bytes (read + write) and each
// variant's largest difference from the shipped launch's outputs.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels -I bench/kernels \
//     bench/kernels/ssm_decode_sweep.cu -o ssm_decode_sweep
#include "nf_mamba.cuh"

#include "cuda_check.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

constexpr int NH = 64, P = 64, N = 128, G = 8;
constexpr int I = NH * P, CD = I + 2 * G * N;
constexpr int kCopies = 4, kIters = 100;
constexpr long long kStateFloats = 1LL * NH * P * N; // a slot

template <int THREADS, int MINB, int NS>
__global__ void __launch_bounds__(THREADS, MINB)
    ssm(const nf_step_args *args, const float *xbc, const float *dt,
        const float *bias, const float *alog, const float *d, float *state,
        float *y) {
  nf::ssm_decode<float, float, float, NH, P, N, G, NS>(
      nf::Step{args, nullptr}, xbc, dt, bias, alog, d, 0.001f, 0.1f, state, y);
}

// The ceiling: each float4 of the step's slots read, scaled, written back.
__global__ void __launch_bounds__(256) rmw(float4 *s, long long n4) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n4;
       i += 256LL * gridDim.x) {
    float4 v = s[i];
    v.x *= 0.999f, v.y *= 0.999f, v.z *= 0.999f, v.w *= 0.999f;
    s[i] = v;
  }
}

__global__ void fill(float *p, long long n, unsigned seed, float scale) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n;
       i += 256LL * gridDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u + seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = ((h & 0xffff) / 32768.0f - 1.0f) * scale;
  }
}

static float copyBandwidth(size_t bytes) {
  char *src = device_alloc<char>(bytes), *dst = device_alloc<char>(bytes);
  const float ms = time_ms(
      [&] { CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice)); },
      20);
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  return 2.0f * bytes / (ms * 1e-3f) / 1e9f;
}

struct Ctx {
  int sms = 0, seqs = 0;
  nf_step_args *args = nullptr;
  float *xbc, *dt, *bias, *alog, *d, *y;
  float *state[kCopies];
  float *init; // the states every variant starts from
};

static void reset(const Ctx &c) {
  for (float *s : c.state)
    CHECK(cudaMemcpy(s, c.init, c.seqs * kStateFloats * 4,
                     cudaMemcpyDeviceToDevice));
}

// NS lanes a head channel (the generator's choice: 8, N / NS = 16 state
// values a lane).
template <int THREADS, int MINB, int NS = 8>
static void variant(const Ctx &c, int perSm, std::vector<float> *ref) {
  auto kernel = ssm<THREADS, MINB, NS>;
  int maxPerSm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&maxPerSm, kernel,
                                                      THREADS, 0));
  if (perSm > maxPerSm)
    return;
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, kernel));
  const int grid = c.sms * perSm;
  reset(c);
  auto launch = [&](int it) {
    kernel<<<grid, THREADS>>>(c.args, c.xbc, c.dt, c.bias, c.alog, c.d,
                              c.state[it % kCopies], c.y);
  };
  const float ms = time_ms(
      [&] {
        for (int it = 0; it < kIters; ++it)
          launch(it);
      },
      1, true);
  CHECK(cudaGetLastError());
  const float us = ms * 1e3f / kIters;
  const double bytes = 2.0 * c.seqs * kStateFloats * 4;
  // Outputs after one more launch on a fresh state (the comparison).
  reset(c);
  launch(0);
  std::vector<float> out(static_cast<size_t>(c.seqs) * I);
  CHECK(cudaMemcpy(out.data(), c.y, out.size() * 4, cudaMemcpyDeviceToHost));
  if (ref->empty())
    *ref = out;
  double diff = 0;
  for (size_t i = 0; i < out.size(); ++i)
    diff = std::max(diff, double(std::fabs(out[i] - (*ref)[i])));
  std::printf("ssm_decode NS %2d, %4d threads, min %2d blocks, r%3d, %2d/%2d "
              "an SM, grid %4d: %7.2f us %6.0f GB/s  diff %.1e\n",
              NS, THREADS, MINB, fa.numRegs, perSm, maxPerSm, grid, us,
              bytes / (us * 1e-6) / 1e9, diff);
}

int main() {
  int dev = 0;
  CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  for (int seqs : {32, 64}) {
    Ctx c;
    c.sms = prop.multiProcessorCount;
    c.seqs = seqs;
    const size_t stateBytes = seqs * kStateFloats * 4;
    std::printf("\n%d sequences (state %.1f MB read + written a launch), "
                "device-to-device copy of the same bytes: %.0f GB/s\n",
                seqs, stateBytes / 1e6, copyBandwidth(stateBytes));
    std::vector<nf_seq_desc> descs(seqs);
    for (int s = 0; s < seqs; ++s)
      descs[s] = nf_seq_desc{s, 1, 100, s};
    nf_step_args h{};
    h.seqs = upload(descs);
    h.num_seqs = seqs;
    h.num_tokens = seqs;
    c.args = upload(std::vector<nf_step_args>{h});
    auto random = [&](long long n, unsigned seed, float scale) {
      float *p = device_alloc<float>(n);
      fill<<<1024, 256>>>(p, n, seed, scale);
      return p;
    };
    c.xbc = random(1LL * seqs * CD, 1, 1.0f);
    c.dt = random(1LL * seqs * NH, 2, 1.0f);
    c.bias = random(NH, 3, 0.5f);
    c.alog = random(NH, 4, 1.0f);
    c.d = random(NH, 5, 1.0f);
    c.y = device_alloc<float>(1LL * seqs * I);
    c.init = random(seqs * kStateFloats, 6, 1.0f);
    for (float *&s : c.state)
      s = device_alloc<float>(seqs * kStateFloats);
    CHECK(cudaDeviceSynchronize());

    std::vector<float> ref;
    variant<256, 1>(c, 4, &ref); // shipped
    variant<256, 1>(c, 2, &ref);
    variant<256, 6>(c, 6, &ref);
    variant<256, 8>(c, 8, &ref);
    variant<128, 8>(c, 8, &ref);
    variant<128, 12>(c, 12, &ref);
    variant<128, 16>(c, 16, &ref);
    variant<512, 1>(c, 2, &ref);
    variant<512, 3>(c, 3, &ref);
    variant<512, 4>(c, 4, &ref);
    variant<256, 1, 16>(c, 4, &ref);
    variant<256, 5, 16>(c, 5, &ref);
    variant<256, 6, 16>(c, 6, &ref);
    variant<128, 10, 16>(c, 10, &ref);
    variant<128, 12, 16>(c, 12, &ref);
    variant<256, 1, 32>(c, 4, &ref);
    variant<256, 6, 32>(c, 6, &ref);
    variant<256, 8, 32>(c, 8, &ref);
    for (int perSm : {4, 8}) {
      const long long n4 = seqs * kStateFloats / 4;
      const int grid = c.sms * perSm;
      const float ms = time_ms(
          [&] {
            for (int it = 0; it < kIters; ++it)
              rmw<<<grid, 256>>>(
                  reinterpret_cast<float4 *>(c.state[it % kCopies]), n4);
          },
          1, true);
      const float us = ms * 1e3f / kIters;
      std::printf("read-modify-write, %d blocks of 256 an SM:            "
                  "%7.2f us %6.0f GB/s\n",
                  perSm, us, 2.0 * stateBytes / (us * 1e-6) / 1e9);
    }
    for (float *s : c.state)
      CHECK(cudaFree(s));
    CHECK(cudaFree(c.init));
  }
  return 0;
}
