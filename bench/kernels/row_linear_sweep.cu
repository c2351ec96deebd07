// The decode linear of one-token steps on CUDA cores, a warp per feature
// over the whole of K (row_linear, kernels/nf_linear.cuh), against the
// skinny_linear narrow variant (kernels/nf_linear.cuh; NF_TERMS: its
// activation terms, 1 or 3; row_linear multiplies f32 activations either way)
// on the shapes of Nemotron-3-Nano-30B-A3B's decode step at batch 1 (and 2):
// the routed experts (6 of 128), the Mamba in_proj, the shared expert and
// out_proj. It first compares both outputs (they differ only in the order
// of the f32 sums), then prints GB/s of weight bytes per launch next to the
// device-to-device copy bandwidth measured in the same run. A benchmark,
// not a test. Each step takes other experts (dense layers: one of 16
// copies), so no launch finds its weights in L2.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels -I bench/kernels \
//     bench/kernels/row_linear_sweep.cu -o row_linear_sweep &&
//     ./row_linear_sweep
#ifndef NF_TERMS
#define NF_TERMS 1 // activation terms: 1 (--matmul-inputs=bf16) or 3 (exact)
#endif
#define NF_ARENA_FROM_ARGS 1
#include "nf_linear.cuh"

#include "cuda_check.h"
#include "skinny_spec.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>

template <class S, int WARPS, int U, int R, int MINB>
__global__ void __launch_bounds__(32 * WARPS, MINB)
    rowk(const nf_step_args *args) {
  nf::row_linear<S, U, R>(nf::Step{args, nullptr});
}

template <class S> struct Compare {
  const Problem &p;
  nf_step_args *dArgs;
  char *arena;
  int sms;
  float copy;
  std::vector<float> ref;

  size_t outputs() const { return size_t(offsetsOf(p, 0)[p.E]) * S::N; }
  template <class Kernel>
  std::vector<float> once(Kernel kernel, int grid, int block, int smem) {
    const std::vector<int32_t> off = offsetsOf(p, 0);
    const size_t ys = outputs();
    std::vector<float> y(ys);
    CHECK(cudaMemcpy(arena, off.data(), sizeof(int32_t) * (p.E + 1),
                     cudaMemcpyHostToDevice));
    CHECK(cudaMemset(arena + kYOff, 0xff, ys * 4));
    kernel<<<grid, block, smem>>>(dArgs);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(y.data(), arena + kYOff, ys * 4, cudaMemcpyDeviceToHost));
    return y;
  }
  void report(const char *label, int grid, float us, double err) {
    const size_t bytes = size_t(p.E == 16 ? 1 : p.active) * S::N * S::K * 2;
    const float gbs = bytes / (us * 1e-6f) / 1e9f;
    std::printf("%-12s %-30s grid %4d: %7.2f us %6.0f GB/s %4.0f%% of copy"
                "  (max diff %.1e)\n",
                p.name, label, grid, us, gbs, 100.0f * gbs / copy, err);
  }
  void shipped() {
    const int smem = nf::skinny_smem<S, 1, 8, false>();
    ref = once(skinny_narrow<S>, 3 * sms, 256, smem);
    report("skinny narrow (shipped)", 3 * sms,
           timeSteps(skinny_narrow<S>, 3 * sms, 256, smem, p, dArgs, arena),
           0.0);
  }
  // perSm > 0: that many blocks an SM (the grid), else as many as fit.
  template <int WARPS, int U, int R, int MINB> void row(int perSm = 0) {
    auto k = rowk<S, WARPS, U, R, MINB>;
    int maxBlocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&maxBlocks, k,
                                                        32 * WARPS, 0));
    if (perSm > 0)
      maxBlocks = std::min(maxBlocks, perSm);
    const std::vector<float> y = once(k, maxBlocks * sms, 32 * WARPS, 0);
    double err = 0, scale = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      err = std::max(err, std::fabs(double(y[i]) - ref[i]));
      scale = std::max(scale, std::fabs(double(ref[i])));
    }
    err /= std::max(scale, 1e-30);
    char label[64];
    std::snprintf(label, sizeof label, "row W%d U%d R%d (%d/SM)", WARPS, U, R,
                  maxBlocks);
    report(label, maxBlocks * sms,
           timeSteps(k, maxBlocks * sms, 32 * WARPS, 0, p, dArgs, arena), err);
  }
};

template <class S>
static void sweep(const Problem &p, nf_step_args *dArgs, char *arena, int sms,
                  float copy) {
  Compare<S> c{p, dArgs, arena, sms, copy, {}};
  c.shipped();
  if (NF_TERMS == 3) // the exact plan's launch: two blocks an SM
    c.report("skinny narrow 264", 2 * sms,
             timeSteps(skinny_narrow<S>, 2 * sms, 256,
                       nf::skinny_smem<S, 1, 8, false>(), p, dArgs, arena),
             0.0);
  c.template row<8, 6, 1, 4>();
  c.template row<8, 4, 1, 4>();
  c.template row<4, 6, 1, 8>();
  c.template row<8, 6, 1, 4>(3); // the occupancy of a narrow skinny launch
  c.template row<8, 6, 1, 4>(2);
  c.template row<8, 8, 1, 4>(3);
  c.template row<8, 8, 1, 4>(2);
  c.template row<8, 11, 1, 1>(2);
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
  sweep<Spec<1856, 2688, 128>>({"expert_up2", 128, 1856, 2688, 11, 1}, dArgs,
                               arena, sms, copy);
  // Dense layers: 16 copies, one a step (Spec's groups: one active copy).
  sweep<Spec<10304, 2688, 16>>({"in_proj", 16, 10304, 2688, 1}, dArgs, arena,
                               sms, copy);
  sweep<Spec<10304, 2688, 16>>({"in_proj2", 16, 10304, 2688, 1, 2}, dArgs,
                               arena, sms, copy);
  sweep<Spec<3712, 2688, 16>>({"shared_up", 16, 3712, 2688, 1}, dArgs, arena,
                              sms, copy);
  sweep<Spec<2688, 3712, 16>>({"shared_dn", 16, 2688, 3712, 1}, dArgs, arena,
                              sms, copy);
  sweep<Spec<2688, 4096, 16>>({"out_proj", 16, 2688, 4096, 1}, dArgs, arena,
                              sms, copy);
  return 0;
}
