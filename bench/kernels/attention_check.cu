// Prefill attention on tensor cores (nf_attention.cuh kv_attend_mma) against
// the f32 warp-per-(token, head) form (kv_attend_warp) at the
// Nemotron-3-Nano shape (32 query heads, 2 kv heads, head_dim 128, pages of
// 16 positions in a shuffled order), then its time for one 8192-token
// prompt. The KV16 form (one term; the step's K/V rows first rounded to
// bf16 by kv_rows_to_bf16, then streamed with cp.async) is checked on the
// same sequences and on sequences with a cached prefix (positions before
// the step read from the f32 cache), and timed with its conversion.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels \
//     bench/kernels/attention_check.cu -o attention_check && ./attention_check
//
// Decode (one token per sequence, flash decoding): the tensor-core split
// kernel (kv_attend_split_mma with 1 and 3 bf16 terms) and the f32
// grouped-query one (kv_attend_split_gqa; kv_attend_split under 4 tokens),
// each with kv_attend_combine, against the same reference, then timed at
// batch 1 and 32 with a 1K context.
//
// Exit status 1 when an output passes its bound relative to
// max(1, max |reference|) (3 terms and f32: 1e-4, 1 term: 2e-2).
#include "cuda_check.h"
#include "nf_attention.cuh"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace {
constexpr int NQ = 32, NKV = 2, HD = 128, PS = 16, WARPS = 8;
constexpr int ROW = NKV * HD, MAXT = 8192;
constexpr float SCALE = 0.08838834764831845f; // 1 / sqrt(128)

__global__ void __launch_bounds__(256)
    reference(const nf_step_args *args, const float *q, const float *k,
              const float *v, float *out) {
  nf::kv_attend_warp<NQ, NKV, HD, PS, 8>(nf::Step{args, nullptr}, q, k, v,
                                         SCALE, out);
}
template <int TERMS, int BP, int W = WARPS>
__global__ void __launch_bounds__(32 * W)
    mma(const nf_step_args *args, const float *q, const float *k,
        const float *v, float *out) {
  nf::kv_attend_mma<NQ, NKV, HD, PS, W, TERMS, BP>(nf::Step{args, nullptr}, q,
                                                   k, v, SCALE, out);
}

template <int BP, int W = WARPS>
__global__ void __launch_bounds__(32 * W)
    mma16(const nf_step_args *args, const float *q, const float *k,
          const float *v, float *out, const unsigned short *k16,
          const unsigned short *v16) {
  nf::kv_attend_mma<NQ, NKV, HD, PS, W, 1, BP, true>(
      nf::Step{args, nullptr}, q, k, v, SCALE, out, k16, v16);
}
__global__ void __launch_bounds__(256)
    to_bf16(const nf_step_args *args, const float *k, const float *v,
            unsigned short *k16, unsigned short *v16) {
  nf::kv_rows_to_bf16<ROW, PS>(nf::Step{args, nullptr}, k, v, k16, v16);
}

// Decode: 132 SMs as in the generated plans (warps targets of the H200).
constexpr int NSPLIT = 64, SIMT_TARGET = 132 * 64, MMA_TARGET = 132 * 16;
__global__ void __launch_bounds__(256)
    split_warp(const nf_step_args *args, const float *q, const float *k,
               const float *v, float *part) {
  nf::kv_attend_split<NQ, NKV, HD, PS, 8, NSPLIT, SIMT_TARGET, 4>(
      nf::Step{args, nullptr}, q, k, v, SCALE, part);
}
__global__ void __launch_bounds__(128)
    split_gqa(const nf_step_args *args, const float *q, const float *k,
              const float *v, float *part) {
  nf::kv_attend_split_gqa<NQ, NKV, HD, PS, 4, NSPLIT, SIMT_TARGET, 4>(
      nf::Step{args, nullptr}, q, k, v, SCALE, part);
}
__global__ void __launch_bounds__(256)
    combine_simt(const nf_step_args *args, const float *part, float *out) {
  nf::kv_attend_combine<NQ, NKV, HD, NSPLIT, SIMT_TARGET, 4>(
      nf::Step{args, nullptr}, part, out);
}
template <int TERMS>
__global__ void __launch_bounds__(128)
    split_mma(const nf_step_args *args, const float *q, const float *k,
              const float *v, float *part) {
  nf::kv_attend_split_mma<NQ, NKV, HD, PS, 4, NSPLIT, MMA_TARGET, TERMS>(
      nf::Step{args, nullptr}, q, k, v, SCALE, part);
}
__global__ void __launch_bounds__(256)
    combine_mma(const nf_step_args *args, const float *part, float *out) {
  nf::kv_attend_combine<NQ, NKV, HD, NSPLIT, MMA_TARGET, 0>(
      nf::Step{args, nullptr}, part, out);
}

/// A prefill step of sequences with the given lengths, from the given start
/// positions (0 by default; positions before the start are a cached
/// prefix), with pages dealt out in a shuffled order.
struct Step {
  nf_step_args host{};
  nf_step_args *dev = nullptr;
  int tokens = 0;
  Step(const std::vector<int> &lengths, std::mt19937 &rng,
       std::vector<int> starts = {}) {
    starts.resize(lengths.size(), 0);
    std::vector<nf_seq_desc> seqs;
    std::vector<int32_t> tokenSeq;
    int maxPages = 0;
    for (size_t s = 0; s < lengths.size(); ++s)
      maxPages = std::max(maxPages, (starts[s] + lengths[s] + PS - 1) / PS);
    std::vector<int32_t> pages(lengths.size() * maxPages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    for (size_t s = 0; s < lengths.size(); ++s) {
      seqs.push_back({tokens, lengths[s], starts[s], static_cast<int32_t>(s)});
      tokenSeq.insert(tokenSeq.end(), lengths[s], static_cast<int32_t>(s));
      tokens += lengths[s];
    }
    host.seqs = upload(seqs);
    host.token_seq = upload(tokenSeq);
    host.page_tables = upload(pages);
    host.num_tokens = tokens;
    host.num_seqs = static_cast<int32_t>(seqs.size());
    host.max_pages_per_seq = maxPages;
    CHECK(cudaMalloc(&dev, sizeof host));
    CHECK(cudaMemcpy(dev, &host, sizeof host, cudaMemcpyHostToDevice));
  }
};

template <int TERMS, int BP, int W = WARPS>
void run(const Step &st, const float *q, const float *k, const float *v,
         float *out) {
  constexpr int smem = nf::kv_attend_mma_smem<HD, W, TERMS, BP>();
  static bool once = [] {
    CHECK(cudaFuncSetAttribute(
        mma<TERMS, BP, W>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)once;
  const int tiles = (st.tokens * (NQ / NKV) + 16 * W - 1) / (16 * W);
  mma<TERMS, BP, W><<<std::min(tiles * NKV, 132 * 4 * (8 / W)), 32 * W, smem>>>(
      st.dev, q, k, v, out);
}

unsigned short *g_k16 = nullptr, *g_v16 = nullptr;

template <int BP, int W = WARPS>
void run16(const Step &st, const float *q, const float *k, const float *v,
           float *out) {
  constexpr int smem = nf::kv_attend_mma_smem<HD, W, 1, BP, true>();
  static bool once = [] {
    CHECK(cudaFuncSetAttribute(
        mma16<BP, W>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)once;
  to_bf16<<<std::max(1, std::min(st.tokens * ROW / 4 / 256, 132 * 8)), 256>>>(
      st.dev, k, v, g_k16, g_v16);
  const int tiles = (st.tokens * (NQ / NKV) + 16 * W - 1) / (16 * W);
  mma16<BP, W><<<std::min(tiles * NKV, 132 * 4 * (8 / W)), 32 * W, smem>>>(
      st.dev, q, k, v, out, g_k16, g_v16);
}

std::vector<float> fetch(const float *p, size_t n) {
  std::vector<float> h(n);
  CHECK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}
} // namespace

int main() {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Pages for the prefill steps and for 32 decode contexts of up to 1.1K.
  const size_t cacheRows = static_cast<size_t>(MAXT + 64 * PS) * 5;
  std::vector<float> q(static_cast<size_t>(MAXT) * NQ * HD),
      kc(cacheRows * ROW), vc(cacheRows * ROW);
  for (float &x : q)
    x = nd(rng);
  for (float &x : kc)
    x = nd(rng);
  for (float &x : vc)
    x = nd(rng);
  float *dq = upload(q), *dk = upload(kc), *dv = upload(vc), *out = nullptr;
  out = device_alloc<float>(q.size());
  g_k16 = device_alloc<unsigned short>(static_cast<size_t>(MAXT) * ROW);
  g_v16 = device_alloc<unsigned short>(static_cast<size_t>(MAXT) * ROW);
  bool ok = true;
  Step mixed({300, 1, 47, 1000, 129}, rng);
  Step prefixed({300, 1, 47, 129}, rng, {100, 7, 0, 64});
  const Step *cur = nullptr;
  size_t n = 0;
  std::vector<float> ref;
  double mx = 1.0;
  auto against = [&](const Step &st) {
    cur = &st;
    n = static_cast<size_t>(st.tokens) * NQ * HD;
    reference<<<132 * 8, 256>>>(st.dev, dq, dk, dv, out);
    CHECK(cudaDeviceSynchronize());
    ref = fetch(out, n);
    mx = 1.0;
    for (float r : ref)
      mx = std::max(mx, static_cast<double>(std::fabs(r)));
  };
  against(mixed);
  auto check = [&](const char *name, double bound, auto &&fn) {
    CHECK(cudaMemset(out, 0, n * sizeof(float)));
    fn(*cur);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = fetch(out, n);
    double err = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
      err = std::isnan(e) ? INFINITY : std::max(err, e);
    }
    err /= mx;
    const bool pass = err <= bound;
    ok = ok && pass;
    std::printf("%s %s: %.3g (bound %.0e)\n", pass ? "PASS" : "FAIL", name, err,
                bound);
  };
  check("3 terms, 32 positions", 1e-4,
        [&](const Step &s) { run<3, 32>(s, dq, dk, dv, out); });
  check("1 term, 32 positions", 2e-2,
        [&](const Step &s) { run<1, 32>(s, dq, dk, dv, out); });
  check("1 term, 64 positions", 2e-2,
        [&](const Step &s) { run<1, 64>(s, dq, dk, dv, out); });
  check("1 term, 64 positions, 4 warps", 2e-2,
        [&](const Step &s) { run<1, 64, 4>(s, dq, dk, dv, out); });
  check("KV16, 64 positions", 2e-2,
        [&](const Step &s) { run16<64>(s, dq, dk, dv, out); });
  check("KV16, 128 positions", 2e-2,
        [&](const Step &s) { run16<128>(s, dq, dk, dv, out); });
  against(prefixed);
  check("cached prefix: 3 terms, 32 positions", 1e-4,
        [&](const Step &s) { run<3, 32>(s, dq, dk, dv, out); });
  check("cached prefix: KV16, 64 positions", 2e-2,
        [&](const Step &s) { run16<64>(s, dq, dk, dv, out); });
  check("cached prefix: KV16, 128 positions", 2e-2,
        [&](const Step &s) { run16<128>(s, dq, dk, dv, out); });

  // Decode steps: one token per sequence at the end of its context.
  float *part =
      device_alloc<float>(static_cast<size_t>(64) * NQ * NSPLIT * (HD + 2));
  auto decodeSimt = [&](const Step &s) {
    if (s.tokens < 4)
      split_warp<<<std::min(132 * 8, (s.tokens * NQ * NSPLIT + 7) / 8), 256>>>(
          s.dev, dq, dk, dv, part);
    else
      split_gqa<<<std::min(132 * 8, (s.tokens * NKV * NSPLIT + 3) / 4), 128>>>(
          s.dev, dq, dk, dv, part);
    combine_simt<<<std::min(132 * 8, s.tokens * NQ), 256>>>(s.dev, part, out);
  };
  constexpr int mmaSmem = nf::kv_attend_split_mma_smem<HD, 4>();
  CHECK(cudaFuncSetAttribute(
      split_mma<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, mmaSmem));
  CHECK(cudaFuncSetAttribute(
      split_mma<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, mmaSmem));
  auto decodeMma = [&](const Step &s, auto kernel) {
    kernel<<<std::min(132, (s.tokens * NKV * NSPLIT + 3) / 4), 128, mmaSmem>>>(
        s.dev, dq, dk, dv, part);
    combine_mma<<<std::min(132 * 8, s.tokens * NQ), 256>>>(s.dev, part, out);
  };
  auto decodeMma1 = [&](const Step &s) { decodeMma(s, split_mma<1>); };
  auto decodeMma3 = [&](const Step &s) { decodeMma(s, split_mma<3>); };
  std::uniform_int_distribution<int> ctx(1, 1100);
  std::vector<int> ones32(32, 1), starts32(32);
  for (int &x : starts32)
    x = ctx(rng) - 1;
  starts32[0] = 0; // a context of one position
  starts32[1] = 1023;
  Step decode1({1}, rng, {1024}), decode32(ones32, rng, starts32);
  for (const Step *st : {&decode1, &decode32}) {
    against(*st);
    check(st == &decode1 ? "decode batch 1, f32 split"
                         : "decode batch 32, "
                           "f32 split",
          1e-4, decodeSimt);
    check(st == &decode1 ? "decode batch 1, mma split (1 term)"
                         : "decode batch 32, mma split (1 term)",
          2e-2, decodeMma1);
    check(st == &decode1 ? "decode batch 1, mma split (3 terms)"
                         : "decode batch 32, mma split (3 terms)",
          1e-4, decodeMma3);
  }
  std::vector<int> starts32k(32, 1023);
  Step decode32k(ones32, rng, starts32k);
  for (const Step *st : {&decode1, &decode32k}) {
    const char *b = st == &decode1 ? "batch 1" : "batch 32";
    std::printf("decode %s, context 1025: f32 split + combine %.1f us, "
                "mma split + combine %.1f us (1 term), %.1f us (3 terms)\n",
                b, 1e3 * time_ms([&] { decodeSimt(*st); }, 50),
                1e3 * time_ms([&] { decodeMma1(*st); }, 50),
                1e3 * time_ms([&] { decodeMma3(*st); }, 50));
  }

  Step longPrompt({MAXT}, rng);
  auto time = [](auto &&fn) { return time_ms(fn, 5); };
  const double flops = 4.0 * MAXT * (MAXT + 1) / 2 * NQ * HD;
  auto report = [&](const char *name, float ms) {
    std::printf("8192 tokens, %s: %.3f ms, %.0f TFLOP/s\n", name, ms,
                flops / ms * 1e-9);
  };
  report("3 terms, 32 positions",
         time([&] { run<3, 32>(longPrompt, dq, dk, dv, out); }));
  report("1 term, 32 positions",
         time([&] { run<1, 32>(longPrompt, dq, dk, dv, out); }));
  report("1 term, 64 positions",
         time([&] { run<1, 64>(longPrompt, dq, dk, dv, out); }));
  report("1 term, 64 positions, 4 warps",
         time([&] { run<1, 64, 4>(longPrompt, dq, dk, dv, out); }));
  report("1 term, 32 positions, 4 warps",
         time([&] { run<1, 32, 4>(longPrompt, dq, dk, dv, out); }));
  report("KV16 (with its conversion), 32 positions",
         time([&] { run16<32>(longPrompt, dq, dk, dv, out); }));
  report("KV16 (with its conversion), 64 positions",
         time([&] { run16<64>(longPrompt, dq, dk, dv, out); }));
  report("KV16 (with its conversion), 128 positions",
         time([&] { run16<128>(longPrompt, dq, dk, dv, out); }));
  report("KV16 (with its conversion), 64 positions, 4 warps",
         time([&] { run16<64, 4>(longPrompt, dq, dk, dv, out); }));
  return ok ? 0 : 1;
}
