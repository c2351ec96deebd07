// The TMA decode linear (nf::tma_linear, kernels/nf_tma.cuh: weights and
// rows streamed into shared memory by cp.async.bulk.tensor through tensor
// maps in global memory, as the runtime encodes them) against the
// register-ring skinny_linear variants (nf_linear.cuh) on
// Nemotron-3-Nano-30B-A3B's dense in_proj, out_proj and qkv, at 32, 64, 16
// and 8 rows, over items of 16 MT features, BK-deep stages, ST stages, CW
// consumer warps and ROWS rows. Every launch is a programmatic dependent of
// the one before; layers rotate over 16 copies of their weights so that no
// launch finds them in L2. A benchmark, not a test: microseconds and GB/s
// of weight bytes per launch next to the device-to-device copy bandwidth of
// the same run, and each variant's largest difference from a plain f32
// reference (relative to the largest reference magnitude).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels \
//     bench/kernels/tma_gemv_sweep.cu -o tma_gemv_sweep -lcuda &&
//     ./tma_gemv_sweep
#define NF_ARENA_FROM_ARGS 1
#include "nf_linear.cuh"
#include "nf_tma.cuh"

#include "dense_sweep.h"
#include <cuda.h>
#include <string>

constexpr int kXRowsAlloc = 64;

// ---------------------------------------------------------------- skinny
template <class S, int MT, int ST, int KW, int ROWS>
__global__ void __launch_bounds__(32 * KW)
    skinnyWide(const nf_step_args *args) {
  nf::skinny_linear<S, MT, ST, KW, 1, true, true, ROWS>(
      nf::Step{args, nullptr});
}

// ---------------------------------------------------------------- TMA
// Tensor maps: [0, kCopies) the weight copies (box 64 x 32), then the rows
// (box 64 x ROWS) for ROWS 16, 32 and 64.
__device__ nf_tensor_map g_maps[kCopies + 3];
constexpr int kXMap16 = kCopies, kXMap32 = kCopies + 1, kXMap64 = kCopies + 2;

template <class S, int MT, int BK, int ST, int CW, int ROWS>
__global__ void __launch_bounds__(32 * (CW + 1))
    tmaWide(const nf_step_args *args, int wmap, int xmap) {
  nf::allow_next_grid();
  nf::tma_linear<S, MT, BK, ST, CW, ROWS>(nf::Step{args, nullptr},
                                          &g_maps[wmap], &g_maps[xmap]);
}

template <int N, int K, int MT, int ST, int KW, int ROWS>
static void skinny(const char *name, const DenseSweep &c, int rows, int perSm) {
  using S = Spec<N, K>;
  auto kernel = skinnyWide<S, MT, ST, KW, ROWS>;
  const int smem = nf::skinny_smem<S, MT, KW, true, true, ROWS>();
  CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  c.setRows(rows);
  const int items = (N + 16 * MT - 1) / (16 * MT) * ((rows + ROWS - 1) / ROWS);
  const int grid = std::min(items, perSm * c.sms);
  char label[96];
  std::snprintf(label, sizeof label, "skinny MT%d ST%d KW%d R%d g%d", MT, ST,
                KW, ROWS, grid);
  c.time(name, label, N, K, rows, kCopies, [&](int copy) {
    launchPdl(kernel, grid, 32 * KW, smem,
              static_cast<const nf_step_args *>(c.dArgs + copy));
  });
}

static CUtensorMap makeMap(const void *base, int inner, int outer,
                           int boxOuter) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(inner), cuuint64_t(outer)};
  const cuuint64_t strides[1] = {cuuint64_t(inner) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(boxOuter)};
  const cuuint32_t estr[2] = {1, 1};
  CUresult r = cuTensorMapEncodeTiled(
      &m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims,
      strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(r));
    std::exit(1);
  }
  return m;
}

/// The maps of an N x K layer (MT 2: weight boxes of 32 rows).
static void setMaps(const DenseSweep &c, int N, int K) {
  std::vector<CUtensorMap> maps;
  for (int i = 0; i < kCopies; ++i)
    maps.push_back(makeMap(c.w + size_t(i) * N * K, K, N, 32));
  for (int rows : {16, 32, 64})
    maps.push_back(makeMap(c.arena + kXOff, K, kXRowsAlloc, rows));
  CHECK(cudaMemcpyToSymbol(g_maps, maps.data(),
                           maps.size() * sizeof(CUtensorMap)));
}

template <int N, int K, int MT, int BK, int ST, int CW, int ROWS>
static void tma(const char *name, const DenseSweep &c, int rows) {
  static_assert(MT == 2, "the weight maps' boxes are 32 rows");
  using S = Spec<N, K>;
  constexpr int smem = nf::tma_linear_smem<MT, BK, ST, CW, ROWS>();
  auto kernel = tmaWide<S, MT, BK, ST, CW, ROWS>;
  if (smem > 227 * 1024) {
    std::printf("%-8s rows %2d MT%d BK%d ST%d CW%d R%d: %d bytes of smem, "
                "skipped\n",
                name, rows, MT, BK, ST, CW, ROWS, smem);
    return;
  }
  CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, kernel));
  c.setRows(rows);
  const int items = (N + 16 * MT - 1) / (16 * MT) * ((rows + ROWS - 1) / ROWS);
  const int grid = std::min(items, c.sms);
  const int xmap = ROWS == 16 ? kXMap16 : ROWS == 32 ? kXMap32 : kXMap64;
  char label[96];
  std::snprintf(label, sizeof label, "tma MT%d BK%d ST%d CW%d R%d r%d g%d", MT,
                BK, ST, CW, ROWS, fa.numRegs, grid);
  c.time(name, label, N, K, rows, kCopies, [&](int copy) {
    launchPdl(kernel, grid, 32 * (CW + 1), smem,
              static_cast<const nf_step_args *>(c.dArgs + copy), copy, xmap);
  });
}

template <int N, int K>
static void sweep(const char *name, const DenseSweep &c) {
  setMaps(c, N, K);
  for (int rows : {32, 64, 16, 8}) {
    if (rows > 16) {
      skinny<N, K, 2, 2, 4, 32>(name, c, rows, 4);
      skinny<N, K, 2, 2, 8, 16>(name, c, rows, 2);
    } else {
      skinny<N, K, 1, 4, 8, 16>(name, c, rows, 3);
      skinny<N, K, 2, 2, 8, 16>(name, c, rows, 2);
    }
    if (rows <= 32) {
      tma<N, K, 2, 256, 6, 8, 32>(name, c, rows); // the plan's, to 32 rows
      tma<N, K, 2, 256, 6, 4, 32>(name, c, rows);
      tma<N, K, 2, 256, 4, 16, 32>(name, c, rows);
    }
    if (rows <= 16) {
      tma<N, K, 2, 256, 8, 8, 16>(name, c, rows);
      tma<N, K, 2, 256, 8, 16, 16>(name, c, rows);
      tma<N, K, 2, 256, 8, 4, 16>(name, c, rows);
      tma<N, K, 2, 128, 12, 8, 16>(name, c, rows);
    }
    if (rows > 32) {
      tma<N, K, 2, 256, 4, 4, 64>(name, c, rows);
      tma<N, K, 2, 256, 3, 8, 64>(name, c, rows); // the plan's, above 32
      tma<N, K, 2, 128, 6, 8, 64>(name, c, rows);
    }
  }
}

int main() {
  // The largest: in_proj.
  const DenseSweep c(size_t(kCopies) * 10304 * 2688, 64ull * 10304,
                     kXRowsAlloc * 4096);
  const char *only = std::getenv("NF_SWEEP_SHAPE");
  auto want = [&](const char *s) { return !only || std::string(only) == s; };
  c.setWeights(2688ull * 4096);
  if (want("out_proj"))
    sweep<2688, 4096>("out_proj", c);
  c.setWeights(10304ull * 2688);
  if (want("in_proj"))
    sweep<10304, 2688>("in_proj", c);
  c.setWeights(4608ull * 2688);
  if (want("qkv"))
    sweep<4608, 2688>("qkv", c);
  return 0;
}
