// The decode linear of few rows on bulk copies (bulk_linear,
// kernels/nf_bulk.cuh) against the register-ring skinny_linear narrow
// variant it replaces (kernels/nf_linear.cuh), on the shapes of
// Nemotron-3-Nano-30B-A3B's decode step: the routed experts at batch 1 (6 of
// 128, one row each) and batch 8 (~30 of 128), and the dense layers of one
// row. It first checks that both write the same bits (bulk_linear's
// contract), then prints GB/s of weight bytes per launch next to the
// device-to-device copy bandwidth measured in the same run. A benchmark, not
// a test. Each step takes other experts (dense layers: one of 16 copies),
// so no launch finds its weights in L2.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels -I bench/kernels \
//     bench/kernels/bulk_linear_sweep.cu -o bulk_linear_sweep &&
//     ./bulk_linear_sweep
#ifndef NF_TERMS
#define NF_TERMS 1 // activation terms: 1 (--matmul-inputs=bf16) or 3 (exact)
#endif
#define NF_ARENA_FROM_ARGS 1
#include "nf_bulk.cuh"

#include "cuda_check.h"
#include "skinny_spec.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <vector>

template <class S, int ST, int SK, int CG>
__global__ void __launch_bounds__(32 * (8 * CG + 1))
    bulk(const nf_step_args *args) {
  nf::bulk_linear<S, ST, SK, CG, NF_TERMS>(nf::Step{args, nullptr});
}

template <class S, int ST, int SK, int CG>
static void compare(const Problem &p, nf_step_args *dArgs, char *arena, int sms,
                    float copy, bool shipped = false) {
  constexpr int smem = nf::bulk_linear_smem<S::K, ST, SK, CG>();
  constexpr int threads = 32 * (8 * CG + 1);
  // (Configurations that do not fit, or break the ring's invariant, skip.)
  if constexpr (smem > 227 * 1024 ||
                ST < CG * nf::BulkLinearShape<S::K, ST, SK, CG>::SPI)
    return;
  else {
    auto kb = bulk<S, ST, SK, CG>;
    CHECK(cudaFuncSetAttribute(kb, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem));
    // Same bits: one step's output of each (y poisoned before each).
    const std::vector<int32_t> off = offsetsOf(p, 0);
    const size_t ys = size_t(off[p.E]) * S::N;
    std::vector<float> y0(ys), y1(ys);
    auto once = [&](auto kernel, int grid, int block, int sm,
                    std::vector<float> &y) {
      CHECK(cudaMemcpy(arena, off.data(), sizeof(int32_t) * (p.E + 1),
                       cudaMemcpyHostToDevice));
      CHECK(cudaMemset(arena + kYOff, 0xff, ys * 4));
      kernel<<<grid, block, sm>>>(dArgs);
      CHECK(cudaDeviceSynchronize());
      CHECK(
          cudaMemcpy(y.data(), arena + kYOff, ys * 4, cudaMemcpyDeviceToHost));
    };
    const int skinnySmem = nf::skinny_smem<S, 1, 8, false>();
    once(skinny_narrow<S>, 3 * sms, 256, skinnySmem, y0);
    once(kb, sms, threads, smem, y1);
    size_t diff = 0;
    for (size_t i = 0; i < ys; ++i)
      diff += std::memcmp(&y0[i], &y1[i], 4) != 0;
    const size_t bytes = size_t(p.E == 16 ? 1 : p.active) * S::N * S::K * 2;
    auto report = [&](const char *label, int grid, float us) {
      const float gbs = bytes / (us * 1e-6f) / 1e9f;
      std::printf("%-12s %-34s grid %4d: %7.2f us %6.0f GB/s %4.0f%% of copy\n",
                  p.name, label, grid, us, gbs, 100.0f * gbs / copy);
    };
    char label[64];
    std::snprintf(label, sizeof label, "bulk ST%d SK%d CG%d %3dK (%s)", ST, SK,
                  CG, smem / 1024, diff ? "DIFFERS" : "same bits");
    if (diff)
      std::printf("%s: %zu of %zu outputs differ from skinny_linear\n", p.name,
                  diff, ys);
    for (int perSm : {1, 2}) {
      int maxBlocks = 0;
      CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&maxBlocks, kb,
                                                          threads, smem));
      if (perSm <= maxBlocks)
        report(label, perSm * sms,
               timeSteps(kb, perSm * sms, threads, smem, p, dArgs, arena));
    }
    if (shipped)
      report("skinny narrow (shipped)", 3 * sms,
             timeSteps(skinny_narrow<S>, 3 * sms, 256, skinnySmem, p, dArgs,
                       arena));
  }
}

template <class S>
static void sweep(const Problem &p, nf_step_args *dArgs, char *arena, int sms,
                  float copy) {
  compare<S, 5, 40, 1>(p, dArgs, arena, sms, copy, true);
  compare<S, 2, 88, 2>(p, dArgs, arena, sms, copy);
  compare<S, 4, 48, 2>(p, dArgs, arena, sms, copy);
  compare<S, 6, 32, 2>(p, dArgs, arena, sms, copy);
  compare<S, 3, 88, 3>(p, dArgs, arena, sms, copy);
  compare<S, 2, 128, 2>(p, dArgs, arena, sms, copy);
}

int main() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  const SweepDevice d = sweep_device();
  const int sms = d.sms;
  const float copy = d.copy;
  char *arena = d.arena;
  nf_step_args *dArgs = d.dArgs;
  sweep<Spec<1856, 2688, 128>>({"expert_up", 128, 1856, 2688, 6}, dArgs, arena,
                               sms, copy);
  sweep<Spec<2688, 1856, 128>>({"expert_dn", 128, 2688, 1856, 6}, dArgs, arena,
                               sms, copy);
  sweep<Spec<1856, 2688, 128>>({"expert_up8", 128, 1856, 2688, 30, 2}, dArgs,
                               arena, sms, copy);
  sweep<Spec<2688, 1856, 128>>({"expert_dn8", 128, 2688, 1856, 30, 2}, dArgs,
                               arena, sms, copy);
  // Dense layers: 16 copies, one a step (Spec's groups: one active copy).
  sweep<Spec<10304, 2688, 16>>({"in_proj", 16, 10304, 2688, 1}, dArgs, arena,
                               sms, copy);
  sweep<Spec<3712, 2688, 16>>({"shared_up", 16, 3712, 2688, 1}, dArgs, arena,
                              sms, copy);
  sweep<Spec<2688, 4096, 16>>({"out_proj", 16, 2688, 4096, 1}, dArgs, arena,
                              sms, copy);
  return 0;
}
