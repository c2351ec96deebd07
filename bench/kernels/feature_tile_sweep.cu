// Weight-streaming bandwidth of the wide-step decode linear with feature
// tiles (feature_tile_linear, kernels/nf_linear.cuh; the plan's LM head at
// more than 16 tokens) against skinny_linear's wide variant
// (skinny_linear<S, 2, 2, 8, 1, true, true>), on Nemotron-3-Nano-30B-A3B's
// dense shapes at 24, 32 and 64 rows with bf16 inputs. A benchmark, not a test:
// it prints microseconds and GB/s of weight bytes per launch next to the
// device-to-device copy bandwidth of the same run, and each kernel's largest
// difference from a plain f32 reference (relative to the largest reference
// magnitude). Dense layers rotate over 16 copies of their weights so that no
// launch finds them in L2.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels \
//     bench/kernels/feature_tile_sweep.cu -o feature_tile_sweep &&
//     ./feature_tile_sweep
#define NF_ARENA_FROM_ARGS 1
#include "nf_linear.cuh"

#include "dense_sweep.h"

template <class S>
__global__ void __launch_bounds__(256) skinnyWide(const nf_step_args *args) {
  nf::skinny_linear<S, 2, 2, 8, 1, true, true>(nf::Step{args, nullptr});
}

template <class S, int MT, int NT, int WARPS, int STAGES, int KP>
__global__ void __launch_bounds__(32 * WARPS)
    featureTiles(const nf_step_args *args) {
  nf::feature_tile_linear<S, MT, NT, WARPS, STAGES, KP>(
      nf::Step{args, nullptr});
}

template <int N, int K>
static void shipped(const char *name, const DenseSweep &c, int rows,
                    int copies) {
  using S = Spec<N, K>;
  const int smem = nf::skinny_smem<S, 2, 8, true, true>();
  CHECK(cudaFuncSetAttribute(
      skinnyWide<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  c.setRows(rows);
  const int grid = 2 * c.sms;
  c.time(name, "skinny wide MT2 ST2 KW8 (shipped)", N, K, rows, copies,
         [&](int copy) { skinnyWide<S><<<grid, 256, smem>>>(c.dArgs + copy); });
}

template <int N, int K, int MT, int NT, int WARPS, int STAGES, int KP>
static void variant(const char *name, const DenseSweep &c, int rows,
                    int copies) {
  using S = Spec<N, K>;
  auto kernel = featureTiles<S, MT, NT, WARPS, STAGES, KP>;
  const int smem = nf::feature_tile_smem<NT, KP>();
  CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int perSm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel,
                                                      32 * WARPS, smem));
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, kernel));
  c.setRows(rows);
  const int tiles = (N + WARPS * MT * 16 - 1) / (WARPS * MT * 16);
  const int items = tiles * ((rows + 8 * NT - 1) / (8 * NT));
  const int grid = std::min(items, c.sms * perSm);
  char label[96];
  std::snprintf(label, sizeof label, "tiles MT%d NT%d W%d ST%d KP%d r%d %d/SM",
                MT, NT, WARPS, STAGES, KP, fa.numRegs, perSm);
  c.time(name, label, N, K, rows, copies,
         [&](int copy) { kernel<<<grid, 32 * WARPS, smem>>>(c.dArgs + copy); });
}

template <int N, int K>
static void shape(const char *name, const DenseSweep &c, int copies) {
  for (int rows : {32, 64, 24}) {
    shipped<N, K>(name, c, rows, copies);
    variant<N, K, 1, 4, 8, 4, 8>(name, c, rows, copies); // the plan's
    variant<N, K, 1, 4, 8, 8, 8>(name, c, rows, copies);
    variant<N, K, 2, 4, 4, 4, 8>(name, c, rows, copies);
    if (rows > 32)
      variant<N, K, 1, 8, 8, 4, 8>(name, c, rows, copies);
  }
}

int main() {
  // The largest: one LM head's outputs, 16 copies of in_proj.
  const size_t wElems = 131072ull * 2688;
  const DenseSweep c(std::max<size_t>(wElems, 16ull * 10304 * 2688),
                     64ull * 131072, 64 * 4096);
  c.setWeights(10304ull * 2688);
  shape<10304, 2688>("in_proj", c, kCopies);
  c.setWeights(2688ull * 4096);
  shape<2688, 4096>("out_proj", c, kCopies);
  c.setWeights(4608ull * 2688);
  shape<4608, 2688>("qkv", c, kCopies);
  c.setWeights(0); // one copy (705 MB, past L2)
  shape<131072, 2688>("lm_head", c, 1);
  return 0;
}
