// Weight-streaming bandwidth of the routed experts' decode GEMVs at batch 32
// (skinny_linear's wide variant, kernels/nf_linear.cuh: bf16 inputs read
// from the rows' bf16 copy, activations staged in shared memory) over its
// tuning parameters, on Nemotron-3-Nano-30B-A3B's expert shapes with the
// routing the bench's seeded random weights give (about 23 experts of 8
// rows a layer). A benchmark, not a test: microseconds and GB/s of weight
// bytes a launch next to the device-to-device copy bandwidth of the same
// run, and each variant's largest difference from the shipped variant.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels -I bench/kernels \
//     bench/kernels/wide_expert_sweep.cu -o wide_expert_sweep
#define NF_ARENA_FROM_ARGS 1
#include "nf_linear.cuh"

#include "dense_sweep.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

constexpr int kIters = 200;

template <int N, int K>
using ExpertSpec = Spec<N, K, nf::DispatchGroups<128, 0>>;

template <class S, int MT, int STAGES, int KW>
__global__ void __launch_bounds__(32 * KW) wide(const nf_step_args *args) {
  nf::skinny_linear<S, MT, STAGES, KW, 1, true, true>(nf::Step{args, nullptr});
}

struct Ctx {
  int sms = 0;
  float copy = 0;
  nf_step_args *dArgs = nullptr; // one per step: its own arena (dispatch)
  std::vector<char *> arenas;
  int active = 23, rows = 8;
};

template <int N, int K, int MT, int STAGES, int KW>
static void variant(const Ctx &c, const char *name, int perSm,
                    std::vector<float> *ref) {
  using S = ExpertSpec<N, K>;
  auto kernel = wide<S, MT, STAGES, KW>;
  const int smem = nf::skinny_smem<S, MT, KW, true, true>();
  CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int maxPerSm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&maxPerSm, kernel,
                                                      32 * KW, smem));
  if (perSm > maxPerSm)
    return;
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, kernel));
  const int grid = c.sms * perSm;
  for (char *arena : c.arenas) // no variant passes on another's outputs
    CHECK(cudaMemset(arena + kYOff, 0xff, 512ull * 2688 * 4));
  for (int it = 0; it < 3; ++it)
    kernel<<<grid, 32 * KW, smem>>>(c.dArgs + it % 16);
  int it = 0;
  const float us =
      1e3f *
      time_ms([&] { kernel<<<grid, 32 * KW, smem>>>(c.dArgs + it++ % 16); },
              kIters, false);
  CHECK(cudaGetLastError());
  const double bytes = double(c.active) * N * K * 2;
  const float gbs = bytes / (us * 1e-6) / 1e9;
  // Output of the last step's arena.
  const int last = (kIters - 1) % 16;
  std::vector<float> y(size_t(c.active) * c.rows * N);
  CHECK(cudaMemcpy(y.data(), c.arenas[last] + kYOff, y.size() * 4,
                   cudaMemcpyDeviceToHost));
  double diff = 0, mx = 0;
  if (ref->empty())
    *ref = y;
  for (size_t i = 0; i < y.size(); ++i) {
    diff = std::max(diff, double(std::fabs(y[i] - (*ref)[i])));
    mx = std::max(mx, double(std::fabs((*ref)[i])));
  }
  std::printf("%-9s MT%d ST%d KW%d r%3d %d/%d grid %4d: %7.2f us %6.0f GB/s "
              "%4.0f%% of copy  diff %.1e\n",
              name, MT, STAGES, KW, fa.numRegs, perSm, maxPerSm, grid, us, gbs,
              100.0f * gbs / c.copy, diff / std::max(mx, 1e-30));
}

template <int N, int K> static void shape(Ctx &c, const char *name) {
  // Step it: experts (g * 7 + it * 13) % 128 < active get `rows` rows each.
  std::vector<nf_step_args> args(16);
  for (int it = 0; it < 16; ++it) {
    std::vector<int32_t> off(129);
    int rows = 0;
    for (int g = 0; g < 128; ++g) {
      off[g] = rows;
      rows += ((g * 7 + it * 13) % 128) < c.active ? c.rows : 0;
    }
    off[128] = rows;
    CHECK(cudaMemcpy(c.arenas[it], off.data(), off.size() * 4,
                     cudaMemcpyHostToDevice));
  }
  std::vector<float> ref;
  for (int perSm : {1, 2, 3, 4}) {
    variant<N, K, 2, 2, 8>(c, name, perSm, &ref); // shipped
    variant<N, K, 1, 4, 8>(c, name, perSm, &ref);
    variant<N, K, 1, 2, 8>(c, name, perSm, &ref);
    variant<N, K, 2, 2, 4>(c, name, perSm, &ref);
    variant<N, K, 1, 4, 4>(c, name, perSm, &ref);
    variant<N, K, 2, 4, 4>(c, name, perSm, &ref);
    variant<N, K, 2, 2, 16>(c, name, perSm, &ref);
  }
}

int main() {
  Ctx c;
  CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
  c.copy = copy_bandwidth_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write), %d SMs\n",
              c.copy, c.sms);
  const size_t wElems = 128ull * 1856 * 2688;
  unsigned short *w = device_alloc<unsigned short>(wElems);
  fillBf16<<<4096, 256>>>(w, wElems, 1u);
  const void **dW = device_alloc<const void *>(1);
  const void *wp = w;
  CHECK(cudaMemcpy(dW, &wp, sizeof wp, cudaMemcpyHostToDevice));
  std::vector<nf_step_args> args(16);
  for (int it = 0; it < 16; ++it) {
    char *arena = device_alloc<char>(kYOff + 512ull * 2688 * 4);
    fillBf16<<<256, 256>>>(reinterpret_cast<unsigned short *>(arena + kXOff),
                           512 * 2688, 7u);
    c.arenas.push_back(arena);
    args[it] = nf_step_args{};
    args[it].arena = arena;
    args[it].weights = dW;
    args[it].num_tokens = 32;
    args[it].num_seqs = 32;
  }
  c.dArgs = device_alloc<nf_step_args>(16);
  CHECK(cudaMemcpy(c.dArgs, args.data(), sizeof(nf_step_args) * 16,
                   cudaMemcpyHostToDevice));
  shape<1856, 2688>(c, "up32");
  shape<2688, 1856>(c, "down32");
  c.active = 30;
  c.rows = 13;
  shape<1856, 2688>(c, "up64");
  return 0;
}
