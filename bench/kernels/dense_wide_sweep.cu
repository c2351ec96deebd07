// Weight-streaming bandwidth of the wide-step decode linears
// (skinny_linear's wide variant, kernels/nf_linear.cuh, bf16 inputs read
// from the rows' bf16 copy) over items of 16 or 32 rows, feature tiles of 16
// or 32, K steps in flight, warps a block and blocks an SM, on
// Nemotron-3-Nano-30B-A3B's dense in_proj, out_proj and qkv and the MoE
// router's shape, at 32, 64 and 24 rows. Every launch is a programmatic
// dependent of the one before (as in a plan's decode step). A benchmark,
// not a test: it prints microseconds and GB/s of weight bytes per launch
// next to the device-to-device copy bandwidth of the same run, and each
// variant's largest difference from a plain f32 reference (relative to the
// largest reference magnitude). Layers rotate over 16 copies of their
// weights so that no launch finds them in L2. NF_SWEEP_ROWS (one row
// count), NF_SWEEP_SHAPE (in_proj, out_proj, router or qkv) and
// NF_SWEEP_ITERS narrow a run (for ncu, say).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels \
//     bench/kernels/dense_wide_sweep.cu -o dense_wide_sweep &&
//     ./dense_wide_sweep
#define NF_ARENA_FROM_ARGS 1
#include "nf_linear.cuh"

#include "dense_sweep.h"
#include <string>

template <class S, int MT, int ST, int KW, int ROWS, bool STAGEX>
__global__ void __launch_bounds__(32 * KW)
    skinnyWide(const nf_step_args *args) {
  nf::skinny_linear<S, MT, ST, KW, 1, STAGEX, true, ROWS>(
      nf::Step{args, nullptr});
}

/// skinny_linear's wide variant with items of MT x 16 features and up to
/// ROWS rows, KW warps a block, PER_SM blocks an SM (the plan's: MT 2, ST 2,
/// ROWS 16, and KW 4 with four blocks an SM for layers of at least a tile
/// of 32 features an SM, else KW 8 with two).
template <int N, int K, int MT, int ST, int KW, int ROWS, bool STAGEX = true>
static void skinny(const char *name, const DenseSweep &c, int rows, int copies,
                   int perSm) {
  using S = Spec<N, K>;
  auto kernel = skinnyWide<S, MT, ST, KW, ROWS, STAGEX>;
  const int smem = nf::skinny_smem<S, MT, KW, STAGEX, true, ROWS>();
  CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, kernel));
  c.setRows(rows);
  const int items = (N + 16 * MT - 1) / (16 * MT) * ((rows + ROWS - 1) / ROWS);
  const int grid = std::min(items, perSm * c.sms);
  char label[96];
  std::snprintf(label, sizeof label, "skinny MT%d ST%d KW%d R%d%s r%d g%d", MT,
                ST, KW, ROWS, STAGEX ? "" : " unstaged", fa.numRegs, grid);
  c.time(name, label, N, K, rows, copies, [&](int copy) {
    launchPdl(kernel, grid, 32 * KW, smem,
              static_cast<const nf_step_args *>(c.dArgs + copy));
  });
}

/// The row counts to sweep: NF_SWEEP_ROWS (one), else 32, 64 and 24.
static std::vector<int> sweepRows() {
  if (const char *r = std::getenv("NF_SWEEP_ROWS"))
    return {std::atoi(r)};
  return {32, 64, 24};
}
/// Whether to sweep the layer `name` (NF_SWEEP_SHAPE, else all).
static bool sweepShape(const char *name) {
  const char *s = std::getenv("NF_SWEEP_SHAPE");
  return !s || std::string(s) == name;
}

template <int N, int K>
static void sweep(const char *name, const DenseSweep &c, int copies) {
  for (int rows : sweepRows()) {
    skinny<N, K, 2, 2, 4, 16>(name, c, rows, copies, 4);
    skinny<N, K, 2, 2, 8, 16>(name, c, rows, copies, 2);
    skinny<N, K, 2, 2, 4, 32>(name, c, rows, copies, 4);
    skinny<N, K, 2, 2, 8, 32>(name, c, rows, copies, 2);
    skinny<N, K, 2, 4, 4, 32>(name, c, rows, copies, 3);
    skinny<N, K, 2, 4, 8, 32>(name, c, rows, copies, 1);
    skinny<N, K, 1, 4, 4, 32>(name, c, rows, copies, 4);
    skinny<N, K, 1, 4, 8, 32>(name, c, rows, copies, 2);
    skinny<N, K, 1, 4, 8, 16>(name, c, rows, copies, 2);
  }
}

/// The MoE router's logits (128 experts): few feature tiles, so K is split
/// over many warps.
template <int N, int K>
static void router(const char *name, const DenseSweep &c, int copies) {
  for (int rows : sweepRows()) {
    skinny<N, K, 2, 2, 8, 16>(name, c, rows, copies, 2); // the plan's
    skinny<N, K, 2, 2, 16, 16, false>(name, c, rows, copies, 1);
    skinny<N, K, 2, 2, 32, 16, false>(name, c, rows, copies, 1);
    skinny<N, K, 1, 2, 16, 16, false>(name, c, rows, copies, 1);
    skinny<N, K, 1, 2, 32, 16, false>(name, c, rows, copies, 1);
    skinny<N, K, 1, 4, 32, 16, false>(name, c, rows, copies, 1);
    skinny<N, K, 1, 2, 32, 32, false>(name, c, rows, copies, 1);
    skinny<N, K, 1, 1, 32, 16, false>(name, c, rows, copies, 1);
  }
}

int main() {
  // The largest: in_proj's weights and outputs.
  const DenseSweep c(16ull * 10304 * 2688, 64ull * 10304, 64 * 4096);
  c.setWeights(10304ull * 2688);
  if (sweepShape("in_proj"))
    sweep<10304, 2688>("in_proj", c, kCopies);
  c.setWeights(2688ull * 4096);
  if (sweepShape("out_proj"))
    sweep<2688, 4096>("out_proj", c, kCopies);
  if (sweepShape("router")) {
    c.setWeights(128ull * 2688);
    router<128, 2688>("router", c, kCopies);
  }
  c.setWeights(4608ull * 2688);
  if (sweepShape("qkv"))
    sweep<4608, 2688>("qkv", c, kCopies);
  return 0;
}
