// The prefill router logits on f64 tensor cores (nf_moe.cuh
// moe_router_logits_dmma) against the f64 tiles (moe_router_logits_tiled) at
// the Nemotron-3-Nano shape (hidden 2688, 128 experts, bf16 gate), and
// their times for 1024 and 8192 tokens.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels bench/kernels/router_check.cu \
//     -o router_check && ./router_check
//
// Exit status 1 when a score differs by more than 1e-12 (f64 sums in
// another order).
#include "cuda_check.h"
#include "nf_moe.cuh"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace {
constexpr int E = 128, H = 2688, MAXT = 8192;
using WG = nf::bf16;

__global__ void __launch_bounds__(256)
    tiled(const nf_step_args *args, const float *x, const WG *gate,
          const float *bias, float *scores, float *sel, double *pre) {
  nf::moe_router_logits_tiled<WG, float, E, H, 32, 64>(
      nf::Step{args, nullptr}, x, gate, bias, scores, sel, pre);
}
template <int TT, int KC>
__global__ void __launch_bounds__(256)
    dmma(const nf_step_args *args, const float *x, const WG *gate,
         const float *bias, float *scores, float *sel, double *pre) {
  nf::moe_router_logits_dmma<WG, float, E, H, TT, KC>(
      nf::Step{args, nullptr}, x, gate, bias, scores, sel, pre);
}

// An expert count that is not a multiple of 8 (tiny-latent's 12).
constexpr int E2 = 12, H2 = 64;
__global__ void __launch_bounds__(256)
    tiled_odd(const nf_step_args *args, const float *x, const WG *gate,
              const float *bias, float *scores, float *sel, double *pre) {
  nf::moe_router_logits_tiled<WG, float, E2, H2, 16, 32>(
      nf::Step{args, nullptr}, x, gate, bias, scores, sel, pre);
}
template <int TT>
__global__ void __launch_bounds__(256)
    dmma_odd(const nf_step_args *args, const float *x, const WG *gate,
             const float *bias, float *scores, float *sel, double *pre) {
  nf::moe_router_logits_dmma<WG, float, E2, H2, TT>(
      nf::Step{args, nullptr}, x, gate, bias, scores, sel, pre);
}

} // namespace

int main() {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(MAXT) * H), bias(E);
  std::vector<unsigned short> gate(static_cast<size_t>(E) * H);
  for (float &v : x)
    v = nd(rng);
  for (auto &g : gate) {
    const float f = 0.02f * nd(rng);
    unsigned u;
    std::memcpy(&u, &f, 4);
    g = static_cast<unsigned short>(u >> 16);
  }
  for (float &v : bias)
    v = 0.1f * nd(rng);
  float *dx = device_alloc<float>(x.size()), *db = device_alloc<float>(E);
  WG *dg = device_alloc<WG>(gate.size());
  CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dg, gate.data(), gate.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, bias.data(), E * 4, cudaMemcpyHostToDevice));
  const size_t n = static_cast<size_t>(MAXT) * E;
  float *sc = device_alloc<float>(n), *se = device_alloc<float>(n);
  double *pre0 = device_alloc<double>(2 * n),
         *pre1 = device_alloc<double>(2 * n);
  nf_step_args host{};
  nf_step_args *args = device_alloc<nf_step_args>(1);
  auto time = [](auto &&fn) { return time_ms(fn); };
  bool ok = true;
  for (int T : {1000, MAXT}) {
    host.num_tokens = T;
    CHECK(cudaMemcpy(args, &host, sizeof host, cudaMemcpyHostToDevice));
    const float mt =
        time([&] { tiled<<<132 * 8, 256>>>(args, dx, dg, db, sc, se, pre0); });
    std::vector<double> ref(2 * static_cast<size_t>(T) * E), got(ref.size());
    CHECK(cudaMemcpy(ref.data(), pre0, ref.size() * 8, cudaMemcpyDeviceToHost));
    double worst = 0;
    std::printf("%d tokens: tiles %.3f ms", T, mt);
    auto variant = [&](const char *name, auto kernel, int tt) {
      CHECK(cudaMemset(pre1, 0, got.size() * 8));
      const float ms = time([&] {
        kernel<<<(T + tt - 1) / tt, 256>>>(args, dx, dg, db, sc, se, pre1);
      });
      CHECK(
          cudaMemcpy(got.data(), pre1, got.size() * 8, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < ref.size(); ++i)
        worst = std::fmax(worst, std::fabs(ref[i] - got[i]));
      std::printf(", %s %.3f ms", name, ms);
    };
    variant("dmma 16/16", dmma<16, 16>, 16);
    variant("dmma 16/32", dmma<16, 32>, 16);
    variant("dmma 32/16", dmma<32, 16>, 32);
    variant("dmma 32/32", dmma<32, 32>, 32);
    variant("dmma 64/16", dmma<64, 16>, 64);
    std::printf("\n");
    const bool pass = worst <= 1e-12;
    ok = ok && pass;
    std::printf("%s %d tokens: largest score difference %.3g\n",
                pass ? "PASS" : "FAIL", T, worst);
  }
  {
    const int T = 77;
    host.num_tokens = T;
    CHECK(cudaMemcpy(args, &host, sizeof host, cudaMemcpyHostToDevice));
    std::vector<double> ref(2 * T * E2), got(ref.size());
    tiled_odd<<<8, 256>>>(args, dx, dg, db, sc, se, pre0);
    CHECK(cudaMemcpy(ref.data(), pre0, ref.size() * 8, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int tt : {16, 32}) {
      CHECK(cudaMemset(pre1, 0, got.size() * 8));
      if (tt == 16)
        dmma_odd<16><<<3, 256>>>(args, dx, dg, db, sc, se, pre1);
      else
        dmma_odd<32><<<2, 256>>>(args, dx, dg, db, sc, se, pre1);
      CHECK(
          cudaMemcpy(got.data(), pre1, got.size() * 8, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < ref.size(); ++i)
        worst = std::fmax(worst, std::fabs(ref[i] - got[i]));
    }
    const bool pass = worst <= 1e-12;
    ok = ok && pass;
    std::printf("%s %d tokens, %d experts: largest score difference %.3g\n",
                pass ? "PASS" : "FAIL", T, E2, worst);
  }
  return ok ? 0 : 1;
}
