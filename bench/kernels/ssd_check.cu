// The prefill SSM scan on tensor cores (nf_mamba.cuh ssd_chunk) against the
// token-by-token recurrence (ssm_scan without chunks, the reference form),
// at the Nemotron-3-Nano shape (64 heads x 64 channels, state 128, 8
// groups), then both chunked forms timed on one long prompt.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels bench/kernels/ssd_check.cu \
//     -o ssd_check && ./ssd_check
//
// Prints, per bf16-term count, the largest error of y and of the final
// states relative to max(1, max |reference|), and the milliseconds per
// 8192-token scan of the walk and of ssd_chunk. Exit status 1 when an error
// passes its bound (3 terms: 1e-4, 1 term: 3e-2).
#include "cuda_check.h"
#include "nf_mamba.cuh"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace {
constexpr int NH = 64, P = 64, N = 128, G = 8, I = NH * P, CD = I + 2 * G * N;
constexpr int L = 256, MAXT = 8192, CMAX = MAXT / L, SLOTS = 8;
constexpr int PT = 16, NS = 8;
constexpr int TC = 45056 / (((2 * N + PT + 1) * 3 + 2 + PT * NS) * 4);
constexpr float DT_MIN = 0.0f, DT_MAX = 1e30f;
constexpr long long STATE = static_cast<long long>(NH) * P * N;

__global__ void __launch_bounds__(PT *NS)
    walk_plain(const nf_step_args *args, const float *xbc, const float *dt,
               const float *bias, const float *alog, const float *d,
               float *state, float *y) {
  nf::ssm_scan<float, float, float, NH, P, N, G, PT, NS, TC>(
      nf::Step{args, nullptr}, xbc, dt, bias, alog, d, DT_MIN, DT_MAX, state,
      y);
}
__global__ void __launch_bounds__(256)
    walk_states(const nf_step_args *args, const float *xbc, const float *dt,
                const float *bias, const float *alog, float *local,
                float *decay) {
  nf::ssm_chunk_states<float, float, NH, P, N, G, L, CMAX>(
      nf::Step{args, nullptr}, xbc, dt, bias, alog, DT_MIN, DT_MAX, local,
      decay);
}
__global__ void __launch_bounds__(256)
    carry(const nf_step_args *args, const float *state, float *local,
          const float *decay) {
  nf::ssm_chunk_carry<NH, P, N, L>(nf::Step{args, nullptr}, state, local,
                                   decay);
}
__global__ void __launch_bounds__(PT *NS)
    walk_chunks(const nf_step_args *args, const float *xbc, const float *dt,
                const float *bias, const float *alog, const float *d,
                float *state, float *y, const float *local) {
  nf::ssm_scan<float, float, float, NH, P, N, G, PT, NS, TC, L, CMAX>(
      nf::Step{args, nullptr}, xbc, dt, bias, alog, d, DT_MIN, DT_MAX, state, y,
      local);
}
template <int TERMS, bool kStates, int Q, int MINB>
__global__ void __launch_bounds__(32 * (P / 16), MINB)
    ssd(const nf_step_args *args, const float *xbc, const float *dt,
        const float *bias, const float *alog, const float *d, float *state,
        float *y, float *local, float *decay) {
  nf::ssd_chunk<float, float, float, NH, P, N, G, L, CMAX, Q, TERMS, kStates>(
      nf::Step{args, nullptr}, xbc, dt, bias, alog, d, DT_MIN, DT_MAX, state, y,
      local, decay);
}

// The scan addressed as a generated plan addresses it: every buffer an
// offset of the step arena (those of the Nano plan), weights and state
// through the step's tables.
constexpr long long kXbcAt = 201326592ll, kDtAt = 624951296ll, kYAt = 0,
                    kLocalAt = 4383047680ll, kDecayAt = 4586471424ll;
template <bool kStates, long long kY = kYAt>
__global__ void __launch_bounds__(128)
    ssd_arena(const nf_step_args *__restrict__ args, char *__restrict__ base) {
  const nf::Step a{args, base};
  nf::ssd_chunk<float, float, float, NH, P, N, G, L, CMAX, 64, 1, kStates>(
      a, nf::arena<float>(a, kXbcAt), nf::arena<float>(a, kDtAt),
      nf::weight<float>(a, 0), nf::weight<float>(a, 1), nf::weight<float>(a, 2),
      DT_MIN, DT_MAX, nf::storage(a, 0), nf::arena<float>(a, kY),
      nf::arena<float>(a, kLocalAt), nf::arena<float>(a, kDecayAt));
}

struct Step {
  nf_step_args host{};
  nf_step_args *dev = nullptr;
  nf_seq_desc *seqs = nullptr;
  explicit Step(const std::vector<int> &lengths) {
    std::vector<nf_seq_desc> s;
    int begin = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      s.push_back({begin, lengths[i], 0, static_cast<int32_t>(i)});
      begin += lengths[i];
    }
    seqs = upload(s);
    host.seqs = seqs;
    host.num_seqs = static_cast<int32_t>(s.size());
    host.num_tokens = begin;
    CHECK(cudaMalloc(&dev, sizeof(nf_step_args)));
    CHECK(cudaMemcpy(dev, &host, sizeof host, cudaMemcpyHostToDevice));
  }
};

struct Buffers {
  float *xbc, *dt, *bias, *alog, *d, *state0, *state, *y, *local, *decay;
};

void run_walk(const Step &st, const Buffers &b, bool chunked) {
  const int sm = 132;
  if (!chunked) {
    walk_plain<<<sm * 8, PT * NS>>>(st.dev, b.xbc, b.dt, b.bias, b.alog, b.d,
                                    b.state, b.y);
    return;
  }
  walk_states<<<sm * 8, 256>>>(st.dev, b.xbc, b.dt, b.bias, b.alog, b.local,
                               b.decay);
  carry<<<(STATE + 255) / 256, 256>>>(st.dev, b.state, b.local, b.decay);
  walk_chunks<<<sm * 8, PT * NS>>>(st.dev, b.xbc, b.dt, b.bias, b.alog, b.d,
                                   b.state, b.y, b.local);
}

/// The three launches of the tensor-core scan; part: 1 states only, 3 scan
/// only, 0 all.
template <int TERMS, int Q = 64, int MINB = 1>
void run_ssd(const Step &st, const Buffers &b, int part = 0) {
  constexpr int s1 = nf::ssd_chunk_smem<P, N, Q, TERMS, true>();
  constexpr int s3 = nf::ssd_chunk_smem<P, N, Q, TERMS, false>();
  static bool once = [] {
    CHECK(cudaFuncSetAttribute(ssd<TERMS, true, Q, MINB>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               s1));
    CHECK(cudaFuncSetAttribute(ssd<TERMS, false, Q, MINB>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               s3));
    return true;
  }();
  (void)once;
  const int grid = std::min(CMAX * NH, 132 * 8);
  if (part != 3)
    ssd<TERMS, true, Q, MINB>
        <<<grid, 32 * (P / 16), s1>>>(st.dev, b.xbc, b.dt, b.bias, b.alog, b.d,
                                      b.state, b.y, b.local, b.decay);
  if (part == 0)
    carry<<<(STATE + 255) / 256, 256>>>(st.dev, b.state, b.local, b.decay);
  if (part != 1)
    ssd<TERMS, false, Q, MINB>
        <<<grid, 32 * (P / 16), s3>>>(st.dev, b.xbc, b.dt, b.bias, b.alog, b.d,
                                      b.state, b.y, b.local, b.decay);
}

std::vector<float> fetch(const float *p, size_t n) {
  std::vector<float> v(n);
  CHECK(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

/// Largest |got - ref| / max(1, max |ref|); worst: its index.
double rel_err(const std::vector<float> &got, const std::vector<float> &ref,
               size_t *worst = nullptr) {
  double mx = 1.0, err = 0.0;
  for (float r : ref)
    mx = std::max(mx, static_cast<double>(std::fabs(r)));
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(e <= err)) { // NaN counts
      err = std::isnan(e) ? INFINITY : e;
      if (worst)
        *worst = i;
    }
  }
  return err / mx;
}
} // namespace

int main(int argc, char **argv) {
  // "scan-once[-steep]": one chunked scan of 8192 tokens, one term (for a
  // profiler).
  const bool once = argc > 1 && std::string(argv[1]).rfind("scan-once", 0) == 0;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> xbc(static_cast<size_t>(MAXT) * CD),
      dt(static_cast<size_t>(MAXT) * NH), bias(NH), alog(NH), d(NH),
      state0(SLOTS * STATE);
  for (size_t i = 0; i < xbc.size(); ++i)
    xbc[i] = (i % CD < I ? 1.0f : 0.3f) * nd(rng);
  // "scan-once-steep": large steps (dt around 8, strong decays), for timing
  // against data where most decay factors underflow.
  const bool steep = argc > 1 && std::string(argv[1]) == "scan-once-steep";
  for (float &v : dt)
    v = steep ? 3.0f * nd(rng) + 8.0f : 0.8f * nd(rng) - 2.0f;
  for (int h = 0; h < NH; ++h) {
    bias[h] = 0.5f * nd(rng);
    alog[h] = std::log(1.0f + 15.0f * h / NH);
    d[h] = nd(rng);
  }
  for (float &v : state0)
    v = 0.5f * nd(rng);
  Buffers b{};
  b.xbc = upload(xbc);
  b.dt = upload(dt);
  b.bias = upload(bias);
  b.alog = upload(alog);
  b.d = upload(d);
  b.state0 = upload(state0);
  CHECK(cudaMalloc(&b.state, state0.size() * sizeof(float)));
  CHECK(cudaMalloc(&b.y, static_cast<size_t>(MAXT) * I * sizeof(float)));
  const size_t localSlots = MAXT / L + SLOTS + 1;
  CHECK(cudaMalloc(&b.local, localSlots * STATE * sizeof(float)));
  CHECK(cudaMalloc(&b.decay, localSlots * NH * sizeof(float)));
  auto reset = [&] {
    CHECK(cudaMemcpy(b.state, b.state0, state0.size() * sizeof(float),
                     cudaMemcpyDeviceToDevice));
    CHECK(cudaMemset(b.y, 0, static_cast<size_t>(MAXT) * I * sizeof(float)));
  };

  if (once) {
    reset();
    Step st({MAXT});
    run_ssd<1>(st, b);
    CHECK(cudaDeviceSynchronize());
    // Each variant timed once, as a profiler would see it.
    auto once_ms = [](auto &&fn) { return time_ms(fn, 1, false); };
    std::printf("%s: scan %.3f ms\n", argv[1],
                once_ms([&] { run_ssd<1>(st, b, 3); }));
    // The same scan on buffers at the plan's arena offsets.
    const size_t localSlots = MAXT / L + SLOTS + 1;
    char *arena = nullptr;
    CHECK(cudaMalloc(&arena, kDecayAt + localSlots * NH * 4));
    CHECK(cudaMemcpy(arena + kXbcAt, b.xbc, xbc.size() * 4,
                     cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(arena + kDtAt, b.dt, dt.size() * 4,
                     cudaMemcpyDeviceToDevice));
    const void *weights[3] = {b.bias, b.alog, b.d};
    void *storage[1] = {b.state};
    const void **dw = nullptr;
    void **ds = nullptr;
    CHECK(cudaMalloc(&dw, sizeof weights));
    CHECK(cudaMalloc(&ds, sizeof storage));
    CHECK(cudaMemcpy(dw, weights, sizeof weights, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(ds, storage, sizeof storage, cudaMemcpyHostToDevice));
    nf_step_args host = st.host;
    host.arena = arena;
    host.weights = dw;
    host.storage = ds;
    nf_step_args *args = nullptr;
    CHECK(cudaMalloc(&args, sizeof host));
    CHECK(cudaMemcpy(args, &host, sizeof host, cudaMemcpyHostToDevice));
    constexpr int s1 = nf::ssd_chunk_smem<P, N, 64, 1, true>();
    constexpr int s3 = nf::ssd_chunk_smem<P, N, 64, 1, false>();
    CHECK(cudaFuncSetAttribute(
        ssd_arena<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, s1));
    CHECK(cudaFuncSetAttribute(
        ssd_arena<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, s3));
    const int grid = std::min(CMAX * NH, 132 * 8);
    ssd_arena<true><<<grid, 128, s1>>>(args, arena);
    carry<<<(STATE + 255) / 256, 256>>>(
        args, b.state, reinterpret_cast<float *>(arena + kLocalAt),
        reinterpret_cast<float *>(arena + kDecayAt));
    ssd_arena<false><<<grid, 128, s3>>>(args, arena);
    CHECK(cudaDeviceSynchronize());
    std::printf(
        "%s, plan's arena offsets: scan %.3f ms\n", argv[1],
        once_ms([&] { ssd_arena<false><<<grid, 128, s3>>>(args, arena); }));
    // Which matters: where the buffers lie, or arena-relative addressing?
    constexpr long long kYFar = 3ll << 30;
    CHECK(cudaFuncSetAttribute(ssd_arena<false, kYFar>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               s3));
    std::printf("%s, arena, y at 3 GiB: scan %.3f ms\n", argv[1], once_ms([&] {
                  ssd_arena<false, kYFar><<<grid, 128, s3>>>(args, arena);
                }));
    Buffers at = b;
    at.xbc = reinterpret_cast<float *>(arena + kXbcAt);
    at.dt = reinterpret_cast<float *>(arena + kDtAt);
    at.y = reinterpret_cast<float *>(arena + kYAt);
    at.local = reinterpret_cast<float *>(arena + kLocalAt);
    at.decay = reinterpret_cast<float *>(arena + kDecayAt);
    std::printf("%s, kernel arguments into the arena: scan %.3f ms\n", argv[1],
                once_ms([&] { run_ssd<1>(st, at, 3); }));
    return 0;
  }
  bool ok = true;
  // Mixed lengths: partial sub-chunks and chunks, one token, several chunks.
  const std::vector<std::vector<int>> batches = {
      {700, 301, 1, 37, 1024, 64, 255, 257}, {MAXT}};
  for (const auto &lengths : batches) {
    Step st(lengths);
    const size_t T = st.host.num_tokens;
    reset();
    run_walk(st, b, false);
    CHECK(cudaDeviceSynchronize());
    const auto yRef = fetch(b.y, T * I), sRef = fetch(b.state, SLOTS * STATE);
    {
      reset();
      run_walk(st, b, true);
      CHECK(cudaDeviceSynchronize());
      const double ey = rel_err(fetch(b.y, T * I), yRef);
      const double es = rel_err(fetch(b.state, SLOTS * STATE), sRef);
      const bool pass = ey <= 1e-5 && es <= 1e-5;
      ok = ok && pass;
      std::printf("%s %zu sequences, %zu tokens, chunked walk: y %.3g, state "
                  "%.3g (bound 1e-05)\n",
                  pass ? "PASS" : "FAIL", lengths.size(), T, ey, es);
    }
    for (int terms : {3, 1, 32}) { // 32: 1 term, sub-chunks of 32
      reset();
      if (terms == 3)
        run_ssd<3>(st, b);
      else if (terms == 1)
        run_ssd<1>(st, b);
      else
        run_ssd<1, 32>(st, b);
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      size_t worst = 0;
      const auto yGot = fetch(b.y, T * I);
      const double ey = rel_err(yGot, yRef, &worst);
      const double es = rel_err(fetch(b.state, SLOTS * STATE), sRef);
      const double bound = terms == 3 ? 1e-4 : 3e-2;
      terms = terms == 32 ? 1 : terms;
      const bool pass = ey <= bound && es <= bound;
      ok = ok && pass;
      if (!pass) {
        const int row = static_cast<int>(worst / I), ch = worst % I;
        int seq = 0, begin = 0;
        while (row >= begin + lengths[seq])
          begin += lengths[seq++];
        std::printf("  worst y: sequence %d position %d, head %d channel %d: "
                    "%g, reference %g\n",
                    seq, row - begin, ch / P, ch % P, yGot[worst], yRef[worst]);
      }
      std::printf("%s %zu sequences, %zu tokens, %d term%s: y %.3g, state "
                  "%.3g (bound %.0e)\n",
                  pass ? "PASS" : "FAIL", lengths.size(), T, terms,
                  terms == 1 ? "" : "s", ey, es, bound);
    }
  }
  // Time one 8192-token prompt.
  Step st({MAXT});
  auto time = [](auto &&fn) { return time_ms(fn); };
  std::printf("8192 tokens: walk (chunked) %.3f ms, ssd 3 terms %.3f ms, "
              "ssd 1 term %.3f ms\n",
              time([&] { run_walk(st, b, true); }),
              time([&] { run_ssd<3>(st, b); }),
              time([&] { run_ssd<1>(st, b); }));
  // One term: states and scan launches alone, by sub-chunk size and
  // blocks per SM asked of the register allocation.
  auto variant = [&](const char *name, auto &&fn) {
    std::printf("  ssd 1 term %s: states %.3f ms, scan %.3f ms\n", name,
                time([&] { fn(1); }), time([&] { fn(3); }));
  };
  variant("Q64 MINB1", [&](int part) { run_ssd<1, 64, 1>(st, b, part); });
  variant("Q64 MINB3", [&](int part) { run_ssd<1, 64, 3>(st, b, part); });
  variant("Q32 MINB1", [&](int part) { run_ssd<1, 32, 1>(st, b, part); });
  variant("Q32 MINB3", [&](int part) { run_ssd<1, 32, 3>(st, b, part); });
  variant("Q32 MINB4", [&](int part) { run_ssd<1, 32, 4>(st, b, part); });
  std::printf("  carry %.3f ms\n", time([&] {
                carry<<<(STATE + 255) / 256, 256>>>(st.dev, b.state, b.local,
                                                    b.decay);
              }));
  return ok ? 0 : 1;
}
