// Weight-streaming bandwidth of the decode linear kernel (skinny_linear in
// kernels/nf_linear.cuh) over its tuning parameters, on the shapes of
// Nemotron-3-Nano-30B-A3B's decode step at batch 1: the routed experts (6 of
// 128, one row each), the Mamba in_proj, the shared expert and out_proj.
// A benchmark, not a test: it prints GB/s of weight bytes read per launch
// next to the device-to-device copy bandwidth measured in the same run.
// Dense layers rotate over 16 copies of their weights so that no launch
// finds them in L2; NF_SWEEP_DENSE=1 runs only the dense layers as the plan
// launches them (first weights fetched before the wait), NF_SWEEP_WIDE=1
// adds the batch-32/64 shapes, NF_SWEEP_ROWS8=1 batch-8 shapes.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels bench/kernels/skinny_sweep.cu \
//     -o skinny_sweep && ./skinny_sweep
#ifndef NF_TERMS
#define NF_TERMS 1 // activation terms: 1 (--matmul-inputs=bf16) or 3 (exact)
#endif
#ifndef NF_MIN_BLOCKS
#define NF_MIN_BLOCKS 1 // __launch_bounds__ minimum blocks per SM
#endif
// As in the generated decode modules: the arena's base comes from the step
// arguments (as a kernel parameter it cost this sweep's narrow kernel 128
// registers; nf_common.cuh, arena()). The registers still differ from the
// generated code's (nvcc 13, sm_90: narrow 102-104 here against 78 there,
// wide 134-138 against 111, so two blocks per SM there and one here):
// compare `-Xptxas -v` of both (`nfc compile --cuda-source-dir`) before
// trusting a difference in occupancy.
#define NF_ARENA_FROM_ARGS 1
#include "nf_linear.cuh"

#include "cuda_check.h"
#include "skinny_spec.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <vector>

// A dense layer as the plan has it (nf::DenseGroups, rows from the step's
// arguments: the first weights are fetched before the kernel would wait for
// the previous launch), one of E copies a step.
template <int N_, int K_, int E>
struct DenseSpec : nf::DenseGroups, Spec<N_, K_, 1> {
  using nf::DenseGroups::G, nf::DenseGroups::kGroupsEarly,
      nf::DenseGroups::group;
  __device__ static __forceinline__ const nf::bf16 *weight(nf::Step a, int) {
    const int32_t *off = nf::arena<int32_t>(a, 0);
    int copy = 0;
    for (int g = 0; g < E; ++g)
      copy = off[g + 1] > off[g] ? g : copy;
    return static_cast<const nf::bf16 *>(a->weights[0]) +
           static_cast<long long>(copy) * N_ * K_;
  }
};

template <class S, int MT, int STAGES, int KW>
__global__ void __launch_bounds__(32 * KW, NF_MIN_BLOCKS)
    skinny(const nf_step_args *__restrict__ args) {
  nf::skinny_linear<S, MT, STAGES, KW, NF_TERMS>(nf::Step{args, nullptr});
}

// Times `launch` over `iters` steps, each with its own dispatch (rotating
// experts so no step finds the previous one's weights in L2).
template <class Kernel>
static void run(const char *label, Kernel kernel, int grid, int block,
                const Problem &p, nf_step_args *dArgs, char *arena,
                size_t weightBytesPerStep, float copy) {
  const int iters = 200;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<int32_t> off(p.E + 1);
  // Precompute every step's offsets on the device (one buffer per step).
  int32_t *dOffs;
  CHECK(cudaMalloc(&dOffs, sizeof(int32_t) * (p.E + 1) * iters));
  for (int it = 0; it < iters; ++it) {
    int rows = 0;
    for (int g = 0; g < p.E; ++g) {
      off[g] = rows;
      const bool on =
          p.E == 1 || ((g * 7 + it * 13) % p.E) < p.active; // `active` of E
      rows += on ? p.rows : 0;
    }
    off[p.E] = rows;
    CHECK(cudaMemcpy(dOffs + it * (p.E + 1), off.data(),
                     sizeof(int32_t) * (p.E + 1), cudaMemcpyHostToDevice));
  }
  auto step = [&](int it) {
    CHECK(cudaMemcpyAsync(arena, dOffs + it * (p.E + 1),
                          sizeof(int32_t) * (p.E + 1),
                          cudaMemcpyDeviceToDevice));
    kernel<<<grid, block>>>(dArgs);
  };
  step(0);
  CHECK(cudaDeviceSynchronize());
  // The offset copies are timed too: time them alone and subtract.
  CHECK(cudaEventRecord(e0));
  for (int it = 0; it < iters; ++it)
    CHECK(cudaMemcpyAsync(arena, dOffs + it * (p.E + 1),
                          sizeof(int32_t) * (p.E + 1),
                          cudaMemcpyDeviceToDevice));
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float msCopy;
  CHECK(cudaEventElapsedTime(&msCopy, e0, e1));
  CHECK(cudaEventRecord(e0));
  for (int it = 0; it < iters; ++it)
    step(it);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  CHECK(cudaGetLastError());
  float ms;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const float us = (ms - msCopy) * 1e3f / iters;
  const float gbs = weightBytesPerStep / (us * 1e-6f) / 1e9f;
  std::printf("%-10s %-28s grid %4d: %7.2f us  %7.0f GB/s  %4.0f%% of copy\n",
              p.name, label, grid, us, gbs, 100.0f * gbs / copy);
  CHECK(cudaFree(dOffs));
}

template <int E, int N, int K, int MT, int STAGES, int KW>
static void sweepOne(const Problem &p, nf_step_args *dArgs, char *arena,
                     int sms, float copy) {
  using S = Spec<N, K, E>;
  const size_t bytes = size_t(p.active) * N * K * 2;
  char label[64];
  for (int perSm : {1, 2, 3, 4}) {
    int maxBlocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &maxBlocks, skinny<S, MT, STAGES, KW>, 32 * KW, 0));
    if (perSm > maxBlocks)
      continue;
    std::snprintf(label, sizeof label, "MT%d STAGES%d KW%d (%d/SM max)", MT,
                  STAGES, KW, maxBlocks);
    run(label, skinny<S, MT, STAGES, KW>, sms * perSm, 32 * KW, p, dArgs, arena,
        bytes, copy);
  }
}

// Batch 32: the shipped wide variant against more features or more K steps
// in flight per item.
template <int E, int N, int K>
static void sweepWide(const Problem &p, nf_step_args *dArgs, char *arena,
                      int sms, float copy) {
  sweepOne<E, N, K, 2, 2, 8>(p, dArgs, arena, sms, copy); // shipped wide
  sweepOne<E, N, K, 4, 2, 8>(p, dArgs, arena, sms, copy);
  sweepOne<E, N, K, 4, 3, 8>(p, dArgs, arena, sms, copy);
  sweepOne<E, N, K, 4, 2, 16>(p, dArgs, arena, sms, copy);
  sweepOne<E, N, K, 8, 1, 8>(p, dArgs, arena, sms, copy);
  sweepOne<E, N, K, 4, 2, 4>(p, dArgs, arena, sms, copy);
}

template <int E, int N, int K>
static void sweep(const Problem &p, nf_step_args *dArgs, char *arena, int sms,
                  float copy) {
  sweepOne<E, N, K, 1, 4, 8>(p, dArgs, arena, sms, copy); // shipped narrow
  sweepOne<E, N, K, 1, 8, 16>(p, dArgs, arena, sms, copy);
  sweepOne<E, N, K, 1, 8, 8>(p, dArgs, arena, sms, copy);
  sweepOne<E, N, K, 1, 6, 4>(p, dArgs, arena, sms, copy);
}

// Dense layers as the plan launches them (DenseSpec), two and three
// blocks per SM where the registers allow.
template <int N, int K>
static void sweepDense(const Problem &p, nf_step_args *dArgs, char *arena,
                       int sms, float copy) {
  using S = DenseSpec<N, K, 16>;
  const size_t bytes = size_t(N) * K * 2;
  for (int perSm : {2, 3}) {
    int maxBlocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &maxBlocks, skinny<S, 1, 4, 8>, 256, 0));
    if (perSm <= maxBlocks)
      run("dense MT1 STAGES4 KW8", skinny<S, 1, 4, 8>, sms * perSm, 256, p,
          dArgs, arena, bytes, copy);
  }
}

int main() {
  const SweepDevice d = sweep_device();
  const int sms = d.sms;
  const float copy = d.copy;
  char *arena = d.arena;
  nf_step_args *dArgs = d.dArgs;
  if (std::getenv("NF_SWEEP_DENSE")) {
    sweepDense<10304, 2688>({"in_proj", 16, 10304, 2688, 1}, dArgs, arena, sms,
                            copy);
    sweepDense<3712, 2688>({"shared_up", 16, 3712, 2688, 1}, dArgs, arena, sms,
                           copy);
    sweepDense<2688, 3712>({"shared_dn", 16, 2688, 3712, 1}, dArgs, arena, sms,
                           copy);
    sweepDense<2688, 4096>({"out_proj", 16, 2688, 4096, 1}, dArgs, arena, sms,
                           copy);
    return 0;
  }
  sweep<128, 1856, 2688>({"expert_up", 128, 1856, 2688, 6}, dArgs, arena, sms,
                         copy);
  sweep<128, 2688, 1856>({"expert_dn", 128, 2688, 1856, 6}, dArgs, arena, sms,
                         copy);
  // Dense layers: 16 copies, one a step (no step finds its weights in L2).
  sweep<16, 10304, 2688>({"in_proj", 16, 10304, 2688, 1}, dArgs, arena, sms,
                         copy);
  sweep<16, 3712, 2688>({"shared_up", 16, 3712, 2688, 1}, dArgs, arena, sms,
                        copy);
  sweep<16, 2688, 3712>({"shared_dn", 16, 2688, 3712, 1}, dArgs, arena, sms,
                        copy);
  sweep<16, 2688, 4096>({"out_proj", 16, 2688, 4096, 1}, dArgs, arena, sms,
                        copy);
  if (std::getenv("NF_SWEEP_ROWS8")) { // batch 8: dense rows, 8 each
    sweep<16, 10304, 2688>({"in_proj8", 16, 10304, 2688, 1, 8}, dArgs, arena,
                           sms, copy);
    sweep<128, 1856, 2688>({"expert_up8", 128, 1856, 2688, 30, 1}, dArgs, arena,
                           sms, copy);
  }
  if (std::getenv("NF_SWEEP_WIDE")) {
    // 32 tokens: ~23 experts of 8 rows (seeded random weights), dense 32.
    sweepWide<128, 1856, 2688>({"expert_up32", 128, 1856, 2688, 23, 8}, dArgs,
                               arena, sms, copy);
    sweepWide<128, 2688, 1856>({"expert_dn32", 128, 2688, 1856, 23, 8}, dArgs,
                               arena, sms, copy);
    sweepWide<1, 10304, 2688>({"in_proj32", 1, 10304, 2688, 1, 32}, dArgs,
                              arena, sms, copy);
    sweepWide<1, 2688, 4096>({"out_proj32", 1, 2688, 4096, 1, 32}, dArgs, arena,
                             sms, copy);
    sweepWide<128, 1856, 2688>({"expert_up64", 128, 1856, 2688, 30, 13}, dArgs,
                               arena, sms, copy);
    sweepWide<1, 10304, 2688>({"in_proj64", 1, 10304, 2688, 1, 64}, dArgs,
                              arena, sms, copy);
  }
  return 0;
}
