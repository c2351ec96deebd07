// nf::Engine's CUDA backend (runtime/src/cuda).
//
// Without a GPU (CI): the driver loader against a missing library, a library
// that is not a driver and the toolkit's stub driver; backend selection
// (EngineOptions::backend, nf_model_params.backend): CPU plans run on the CPU
// silently, CUDA plans fall back to the CPU with one line on stderr under
// "auto" and fail under "cuda". Tests that need a device skip (GTEST_SKIP),
// or fail with NF_CUDA_REQUIRE=1 (scripts/gpu_check.sh sets it).
//
// On a GPU, and on every machine through a fake driver (fake_cuda_driver.cpp:
// host memory, bounds-checked copies, deferred streams, graph capture):
//  - CudaSmoke: synthetic plans carrying the hand-written kernels below (as
//    PTX, and as a cubin when ptxas is found): the engine's mechanics without
//    the compiler: arguments, chunking, slots and their zeroing, page tables,
//    Mamba/KV storage, the decode graph, cooperative launches, expert
//    statistics, overrides, load errors, fallback on missing binaries.
// On a GPU only:
//  - CudaFixture, CudaPlans: plans compiled with `nfc compile --target=cuda`
//    from every fixture and pydoc-moe: prefill and greedy-decode logits
//    within 1e-3 * max(1, max|ref|) of the Hugging Face references and the
//    same greedy tokens; several sequences of different lengths batched ==
//    one at a time (within 1e-5, relative); CUDA == CPU on the same plan;
//    graph == plain launches; small arena (chunked steps); expert statistics,
//    budgets and overrides.
//
// The GPU machine runs binaries built elsewhere, so paths come from the
// environment when set:
//   NF_CUDA_PLAN_DIR  plans compiled for CUDA (default: <build>/test/
//                     integration/plans/cuda)
//   NF_TEST_DATA_DIR  the source tree's test/data (fixtures: weights and
//                     references)
//   NF_EXAMPLES_DIR   the source tree's examples (pydoc-moe)
//   NF_CUDA_REQUIRE   1: no device, or a missing CUDA plan, is a failure
//   NF_FAKE_CUDA      the fake driver library (libnf_fake_cuda.so)
//   PTXAS             ptxas for the cubin smoke test (default: PATH, then
//                     /usr/local/cuda/bin/ptxas)
#include "cuda/driver.h"
#include "engine/engine.h"
#include "nf/nf.h"
#include "nf/plan_generated.h"
#include "nf/plan_version.h"
#include "nf_abi.h"
#include "sampling/philox.h"
#include "sampling/sampler.h"

#include "ReferenceUtil.h"
#include "TestUtil.h"

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <sstream>

#include <dlfcn.h>

namespace {

using namespace nf;
using namespace nf::test::ref;
namespace fs = std::filesystem;
namespace pl = nf::plan;

// ---------------------------------------------------------------------------
// Environment

std::string envOr(const char *name, const std::string &fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

bool requireGpu() { return envOr("NF_CUDA_REQUIRE", "0") == "1"; }

std::string dataDir() { return envOr("NF_TEST_DATA_DIR", NF_TEST_DATA_DIR); }
std::string examplesDir() { return envOr("NF_EXAMPLES_DIR", NF_EXAMPLES_DIR); }
std::string modelDir(const std::string &name) {
  return name == "pydoc-moe" ? examplesDir() + "/pydoc-moe"
                             : dataDir() + "/fixtures/" + name;
}
/// The fake driver (fake_cuda_driver.cpp).
std::string fakeDriver() { return envOr("NF_FAKE_CUDA", NF_FAKE_CUDA); }
std::string cudaPlan(const std::string &name) {
  return envOr("NF_CUDA_PLAN_DIR", NF_CUDA_PLAN_DIR) + "/" + name + ".nfb";
}

/// Why the CUDA backend cannot run here; empty when a device is usable.
std::string cudaUnavailable() {
  StatusOr<const cuda::Driver *> d = cuda::loadDriver();
  if (!d)
    return d.message();
  StatusOr<cuda::DeviceInfo> dev = cuda::queryDevice(**d, 0);
  if (!dev)
    return dev.message();
  return "";
}

#define NF_REQUIRE_GPU()                                                       \
  do {                                                                         \
    const std::string why_ = cudaUnavailable();                                \
    if (!why_.empty()) {                                                       \
      if (requireGpu())                                                        \
        FAIL() << "NF_CUDA_REQUIRE=1 but CUDA is unavailable: " << why_;       \
      GTEST_SKIP() << "no CUDA device: " << why_;                              \
    }                                                                          \
  } while (0)

#define NF_REQUIRE_PLAN(path)                                                  \
  do {                                                                         \
    if (!fs::exists(path)) {                                                   \
      if (requireGpu())                                                        \
        FAIL() << "missing CUDA plan " << (path)                               \
               << " (see scripts/gpu_check.sh prepare)";                       \
      GTEST_SKIP() << "no CUDA plan " << (path)                                \
                   << " (compile with nfc compile --target=cuda)";             \
    }                                                                          \
  } while (0)

std::string deviceArch() {
  StatusOr<const cuda::Driver *> d = cuda::loadDriver();
  if (!d)
    return "";
  StatusOr<cuda::DeviceInfo> dev = cuda::queryDevice(**d, 0);
  return dev ? dev->arch() : "";
}

// ---------------------------------------------------------------------------
// Engines and steps

EngineOptions options(const std::string &backend,
                      const std::string &weightsDir = "") {
  EngineOptions o;
  o.backend = backend;
  o.weightsDir = weightsDir;
  o.numThreads = 1;
  o.kvPages = 96;
  o.maxSequences = 8;
  return o;
}

std::unique_ptr<Engine> load(const std::string &plan, const EngineOptions &o) {
  StatusOr<std::unique_ptr<Engine>> e = Engine::load(plan, o);
  EXPECT_TRUE(e.ok()) << e.message();
  return e ? std::move(*e) : nullptr;
}

Status stepOne(Engine &e, int32_t seq, std::span<const int32_t> tokens,
               LogitsFor which, std::vector<float> &logits,
               StepStats *stats = nullptr, int32_t expertsPerToken = 0) {
  SequenceInput in;
  in.sequence = seq;
  in.tokens = tokens;
  in.expertsPerToken = expertsPerToken;
  return e.step({&in, 1}, which, logits, stats);
}

double maxAbsDiff(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i)
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// ---------------------------------------------------------------------------
// Synthetic plans and their kernels
//
// PTX of the kernels below (nvcc 13 -ptx -arch=compute_80, every loop with
// `#pragma unroll 1`, comments dropped, .version lowered to 7.0 so that
// drivers from CUDA 11 on JIT it):
//
//   #include "nf_abi.h"
//   #define V 32
//   #define H 8
//   // Dense plan: hidden [T, 8] at arena byte 0, logits [T, 32] at 65536;
//   // weights[0] embedding [32, 8], weights[1] lm head [32, 8], f32.
//   extern "C" __global__ void smoke_embed(const nf_step_args *a) {
//     const float *e = (const float *)a->weights[0];
//     float *hid = (float *)(a->arena + 0);
//     const int n = a->num_tokens * H;
//     for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
//          i += gridDim.x * blockDim.x)
//       hid[i] = e[a->tokens[i / H] * H + i % H];
//   }
//   extern "C" __global__ void smoke_lm_head(const nf_step_args *a) {
//     const float *w = (const float *)a->weights[1];
//     const float *hid = (const float *)(a->arena + 0);
//     float *out = (float *)(a->arena + 65536);
//     const int n = a->num_tokens * V;
//     for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
//          i += gridDim.x * blockDim.x) {
//       const int t = i / V, v = i % V;
//       float acc = 0.0f;
//       for (int h = 0; h < H; ++h)
//         acc += hid[t * H + h] * w[v * H + h];
//       out[i] = acc;
//     }
//   }
//   // Launched cooperatively first in both plans; does nothing.
//   extern "C" __global__ void smoke_nop(const nf_step_args *a) {
//     if (a->num_tokens < 0)
//       a->arena[0] = 0;
//   }
//   // State plan: one thread per sequence. storage[0] conv window
//   // [slots, 3, 3], storage[1] SSM state [slots, 1, 1, 1], storage[2..3]
//   // K/V [pages, 2, 1, 1]. Logits [T, 32] at arena byte 0, counts [T] at
//   // 32768, experts [T, 2] at 36864 (the select's results).
//   extern "C" __global__ void smoke_state(const nf_step_args *a) {
//     float *conv = (float *)a->storage[0];
//     float *ssm = (float *)a->storage[1];
//     float *kc = (float *)a->storage[2];
//     float *vc = (float *)a->storage[3];
//     float *out = (float *)(a->arena + 0);
//     int *counts = (int *)(a->arena + 32768);
//     int *experts = (int *)(a->arena + 36864);
//     for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < a->num_seqs;
//          s += gridDim.x * blockDim.x) {
//       const nf_seq_desc d = a->seqs[s];
//       float *cw = conv + d.slot * 9;
//       float run = ssm[d.slot];
//       const int *pt = a->page_tables + s * a->max_pages_per_seq;
//       for (int j = 0; j < d.count; ++j) {
//         const int t = d.begin + j, pos = d.start_pos + j, tok = a->tokens[t];
//         run += (float)tok;
//         cw[0] = cw[1];
//         cw[1] = cw[2];
//         cw[2] = (float)tok;
//         const int cell = pt[pos / 2] * 2 + pos % 2;
//         kc[cell] = (float)tok;
//         vc[cell] = (float)pos;
//         float sk = 0.0f, sv = 0.0f;
//         for (int p = 0; p <= pos; ++p) {
//           const int c = pt[p / 2] * 2 + p % 2;
//           sk += kc[c];
//           sv += vc[c];
//         }
//         float *row = out + t * V;
//         for (int v = 0; v < V; ++v)
//           row[v] = 0.0f;
//         row[0] = (float)tok;
//         row[1] = (float)pos;
//         row[2] = run;
//         row[3] = sk;
//         row[4] = sv;
//         row[5] = cw[0];
//         row[6] = cw[1];
//         row[7] = cw[2];
//         row[8] = a->budget[t];
//         row[9] = (float)a->experts_per_token;
//         row[10] = a->token_seq[t] == s ? 1.0f : 0.0f;
//         const int k = 1 + tok % 2;
//         counts[t] = k;
//         experts[t * 2] = tok % 4;
//         experts[t * 2 + 1] = k > 1 ? (tok + 1) % 4 : -1;
//       }
//       ssm[d.slot] = run;
//     }
//   }
const char kSmokePtx[] = R"PTX(
.version 7.0
.target sm_80
.address_size 64
.visible .entry smoke_embed(
	.param .u64 smoke_embed_param_0
)
{
	.reg .pred 	%p<3>;
	.reg .f32 	%f<2>;
	.reg .b32 	%r<21>;
	.reg .b64 	%rd<18>;
	ld.param.u64 	%rd4, [smoke_embed_param_0];
	cvta.to.global.u64 	%rd5, %rd4;
	add.s64 	%rd1, %rd5, 8;
	ld.global.u32 	%r7, [%rd5+64];
	shl.b32 	%r1, %r7, 3;
	mov.u32 	%r2, %ntid.x;
	mov.u32 	%r8, %ctaid.x;
	mov.u32 	%r9, %tid.x;
	mad.lo.s32 	%r20, %r8, %r2, %r9;
	setp.ge.s32 	%p1, %r20, %r1;
	@%p1 bra 	$L__BB0_3;
	ld.global.u64 	%rd6, [%rd1];
	cvta.to.global.u64 	%rd7, %rd6;
	ld.global.u64 	%rd8, [%rd7];
	ld.global.u64 	%rd9, [%rd1+-8];
	mov.u32 	%r10, %nctaid.x;
	mul.lo.s32 	%r4, %r10, %r2;
	cvta.to.global.u64 	%rd2, %rd9;
	cvta.to.global.u64 	%rd3, %rd8;
$L__BB0_2:
	.pragma "nounroll";
	ld.global.u64 	%rd10, [%rd1+16];
	cvta.to.global.u64 	%rd11, %rd10;
	shr.s32 	%r11, %r20, 31;
	shr.u32 	%r12, %r11, 29;
	add.s32 	%r13, %r20, %r12;
	shr.s32 	%r14, %r13, 3;
	mul.wide.s32 	%rd12, %r14, 4;
	add.s64 	%rd13, %rd11, %rd12;
	ld.global.u32 	%r15, [%rd13];
	shl.b32 	%r16, %r15, 3;
	and.b32  	%r17, %r13, -8;
	sub.s32 	%r18, %r20, %r17;
	add.s32 	%r19, %r16, %r18;
	mul.wide.s32 	%rd14, %r19, 4;
	add.s64 	%rd15, %rd3, %rd14;
	ld.global.f32 	%f1, [%rd15];
	mul.wide.s32 	%rd16, %r20, 4;
	add.s64 	%rd17, %rd2, %rd16;
	st.global.f32 	[%rd17], %f1;
	add.s32 	%r20, %r20, %r4;
	setp.lt.s32 	%p2, %r20, %r1;
	@%p2 bra 	$L__BB0_2;
$L__BB0_3:
	ret;
}
.visible .entry smoke_lm_head(
	.param .u64 smoke_lm_head_param_0
)
{
	.reg .pred 	%p<4>;
	.reg .f32 	%f<7>;
	.reg .b32 	%r<24>;
	.reg .b64 	%rd<22>;
	ld.param.u64 	%rd10, [smoke_lm_head_param_0];
	cvta.to.global.u64 	%rd11, %rd10;
	add.s64 	%rd1, %rd11, 8;
	ld.global.u64 	%rd12, [%rd11];
	cvta.to.global.u64 	%rd2, %rd12;
	ld.global.u32 	%r9, [%rd11+64];
	shl.b32 	%r1, %r9, 5;
	mov.u32 	%r2, %ntid.x;
	mov.u32 	%r10, %ctaid.x;
	mov.u32 	%r11, %tid.x;
	mad.lo.s32 	%r22, %r10, %r2, %r11;
	setp.ge.s32 	%p1, %r22, %r1;
	@%p1 bra 	$L__BB1_5;
	ld.global.u64 	%rd13, [%rd1];
	cvta.to.global.u64 	%rd14, %rd13;
	ld.global.u64 	%rd15, [%rd14+8];
	mov.u32 	%r12, %nctaid.x;
	mul.lo.s32 	%r4, %r12, %r2;
	cvta.to.global.u64 	%rd3, %rd15;
$L__BB1_2:
	.pragma "nounroll";
	shr.s32 	%r14, %r22, 31;
	shr.u32 	%r15, %r14, 27;
	add.s32 	%r16, %r22, %r15;
	shr.s32 	%r17, %r16, 5;
	shl.b32 	%r18, %r17, 3;
	and.b32  	%r19, %r16, 536870880;
	sub.s32 	%r20, %r22, %r19;
	shl.b32 	%r21, %r20, 3;
	mul.wide.s32 	%rd16, %r18, 4;
	add.s64 	%rd21, %rd2, %rd16;
	mul.wide.s32 	%rd17, %r21, 4;
	add.s64 	%rd20, %rd3, %rd17;
	mov.f32 	%f6, 0f00000000;
	mov.u32 	%r23, 0;
$L__BB1_3:
	.pragma "nounroll";
	ld.global.f32 	%f4, [%rd20];
	ld.global.f32 	%f5, [%rd21];
	fma.rn.f32 	%f6, %f5, %f4, %f6;
	add.s64 	%rd21, %rd21, 4;
	add.s64 	%rd20, %rd20, 4;
	add.s32 	%r23, %r23, 1;
	setp.ne.s32 	%p2, %r23, 8;
	@%p2 bra 	$L__BB1_3;
	mul.wide.s32 	%rd18, %r22, 4;
	add.s64 	%rd19, %rd2, %rd18;
	st.global.f32 	[%rd19+65536], %f6;
	add.s32 	%r22, %r22, %r4;
	setp.lt.s32 	%p3, %r22, %r1;
	@%p3 bra 	$L__BB1_2;
$L__BB1_5:
	ret;
}
.visible .entry smoke_nop(
	.param .u64 smoke_nop_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b16 	%rs<2>;
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<6>;
	ld.param.u64 	%rd2, [smoke_nop_param_0];
	cvta.to.global.u64 	%rd3, %rd2;
	add.s64 	%rd1, %rd3, 64;
	ld.global.u32 	%r1, [%rd3+64];
	setp.gt.s32 	%p1, %r1, -1;
	@%p1 bra 	$L__BB2_2;
	ld.global.u64 	%rd4, [%rd1+-64];
	cvta.to.global.u64 	%rd5, %rd4;
	mov.u16 	%rs1, 0;
	st.global.u8 	[%rd5], %rs1;
$L__BB2_2:
	ret;
}
.visible .entry smoke_state(
	.param .u64 smoke_state_param_0
)
{
	.reg .pred 	%p<10>;
	.reg .f32 	%f<33>;
	.reg .b32 	%r<72>;
	.reg .b64 	%rd<66>;
	ld.param.u64 	%rd18, [smoke_state_param_0];
	cvta.to.global.u64 	%rd19, %rd18;
	add.s64 	%rd1, %rd19, 16;
	ld.global.u64 	%rd20, [%rd19+16];
	cvta.to.global.u64 	%rd2, %rd20;
	ld.global.u64 	%rd21, [%rd2+16];
	cvta.to.global.u64 	%rd3, %rd21;
	ld.global.u64 	%rd22, [%rd2+24];
	cvta.to.global.u64 	%rd4, %rd22;
	ld.global.u64 	%rd23, [%rd19];
	cvta.to.global.u64 	%rd5, %rd23;
	mov.u32 	%r1, %ntid.x;
	mov.u32 	%r20, %ctaid.x;
	mov.u32 	%r21, %tid.x;
	mad.lo.s32 	%r67, %r20, %r1, %r21;
	ld.global.u32 	%r22, [%rd19+68];
	setp.ge.s32 	%p1, %r67, %r22;
	@%p1 bra 	$L__BB3_13;
	ld.global.u64 	%rd24, [%rd2];
	ld.global.u64 	%rd25, [%rd2+8];
	mov.u32 	%r23, %nctaid.x;
	mul.lo.s32 	%r3, %r23, %r1;
	cvta.to.global.u64 	%rd7, %rd25;
	cvta.to.global.u64 	%rd8, %rd24;
$L__BB3_2:
	.pragma "nounroll";
	ld.global.u64 	%rd26, [%rd1+24];
	cvta.to.global.u64 	%rd27, %rd26;
	mul.wide.s32 	%rd28, %r67, 16;
	add.s64 	%rd9, %rd27, %rd28;
	ld.global.u32 	%r5, [%rd9+12];
	mul.wide.s32 	%rd29, %r5, 4;
	add.s64 	%rd10, %rd7, %rd29;
	ld.global.f32 	%f32, [%rd10];
	ld.global.u64 	%rd30, [%rd1+40];
	cvta.to.global.u64 	%rd11, %rd30;
	ld.global.u32 	%r24, [%rd1+56];
	mul.lo.s32 	%r25, %r24, %r67;
	cvt.s64.s32 	%rd12, %r25;
	ld.global.u32 	%r6, [%rd9+4];
	setp.lt.s32 	%p2, %r6, 1;
	@%p2 bra 	$L__BB3_12;
	ld.global.u32 	%r7, [%rd9];
	ld.global.u32 	%r8, [%rd9+8];
	mul.lo.s32 	%r27, %r5, 9;
	mul.wide.s32 	%rd31, %r27, 4;
	add.s64 	%rd13, %rd8, %rd31;
	mov.u32 	%r68, 0;
$L__BB3_4:
	.pragma "nounroll";
	ld.global.u64 	%rd32, [%rd1+8];
	cvta.to.global.u64 	%rd33, %rd32;
	add.s32 	%r28, %r68, %r7;
	cvt.s64.s32 	%rd14, %r28;
	mul.wide.s32 	%rd34, %r28, 4;
	add.s64 	%rd35, %rd33, %rd34;
	ld.global.u32 	%r10, [%rd35];
	cvt.rn.f32.s32 	%f3, %r10;
	add.f32 	%f32, %f32, %f3;
	ld.global.f32 	%f15, [%rd13+4];
	st.global.f32 	[%rd13], %f15;
	ld.global.f32 	%f16, [%rd13+8];
	st.global.f32 	[%rd13+4], %f16;
	st.global.f32 	[%rd13+8], %f3;
	add.s32 	%r11, %r68, %r8;
	shr.u32 	%r29, %r11, 31;
	add.s32 	%r30, %r11, %r29;
	shr.s32 	%r31, %r30, 1;
	cvt.s64.s32 	%rd36, %r31;
	add.s64 	%rd37, %rd36, %rd12;
	shl.b64 	%rd38, %rd37, 2;
	add.s64 	%rd39, %rd11, %rd38;
	ld.global.u32 	%r32, [%rd39];
	shl.b32 	%r33, %r32, 1;
	and.b32  	%r34, %r30, -2;
	sub.s32 	%r35, %r11, %r34;
	add.s32 	%r36, %r33, %r35;
	mul.wide.s32 	%rd40, %r36, 4;
	add.s64 	%rd41, %rd3, %rd40;
	cvt.rn.f32.s32 	%f5, %r11;
	add.s64 	%rd42, %rd4, %rd40;
	st.global.f32 	[%rd41], %f3;
	st.global.f32 	[%rd42], %f5;
	setp.lt.s32 	%p3, %r11, 0;
	mov.f32 	%f30, 0f00000000;
	mov.f32 	%f31, %f30;
	@%p3 bra 	$L__BB3_7;
	mov.f32 	%f31, 0f00000000;
	mov.u32 	%r69, -1;
	mov.f32 	%f30, %f31;
$L__BB3_6:
	.pragma "nounroll";
	add.s32 	%r69, %r69, 1;
	shr.u32 	%r38, %r69, 1;
	cvt.u64.u32 	%rd43, %r38;
	add.s64 	%rd44, %rd43, %rd12;
	shl.b64 	%rd45, %rd44, 2;
	add.s64 	%rd46, %rd11, %rd45;
	ld.global.u32 	%r39, [%rd46];
	and.b32  	%r40, %r69, 1;
	bfi.b32 	%r41, %r39, %r40, 1, 31;
	mul.wide.s32 	%rd47, %r41, 4;
	add.s64 	%rd48, %rd3, %rd47;
	ld.global.f32 	%f19, [%rd48];
	add.f32 	%f30, %f30, %f19;
	add.s64 	%rd49, %rd4, %rd47;
	ld.global.f32 	%f20, [%rd49];
	add.f32 	%f31, %f31, %f20;
	setp.lt.s32 	%p4, %r69, %r11;
	@%p4 bra 	$L__BB3_6;
$L__BB3_7:
	cvt.u32.u64 	%r43, %rd14;
	shl.b32 	%r44, %r43, 5;
	cvt.s64.s32 	%rd16, %r44;
	mov.u32 	%r42, 0;
	mov.u32 	%r70, %r42;
$L__BB3_8:
	.pragma "nounroll";
	cvt.s64.s32 	%rd50, %r70;
	add.s64 	%rd51, %rd50, %rd16;
	shl.b64 	%rd52, %rd51, 2;
	add.s64 	%rd53, %rd5, %rd52;
	st.global.u32 	[%rd53], %r42;
	add.s32 	%r70, %r70, 1;
	setp.ne.s32 	%p5, %r70, 32;
	@%p5 bra 	$L__BB3_8;
	shl.b64 	%rd54, %rd16, 2;
	add.s64 	%rd55, %rd5, %rd54;
	st.global.f32 	[%rd55], %f3;
	st.global.f32 	[%rd55+4], %f5;
	st.global.f32 	[%rd55+8], %f32;
	st.global.f32 	[%rd55+12], %f30;
	st.global.f32 	[%rd55+16], %f31;
	ld.global.f32 	%f21, [%rd13];
	st.global.f32 	[%rd55+20], %f21;
	ld.global.f32 	%f22, [%rd13+4];
	st.global.f32 	[%rd55+24], %f22;
	ld.global.f32 	%f23, [%rd13+8];
	st.global.f32 	[%rd55+28], %f23;
	ld.global.u64 	%rd56, [%rd1+16];
	cvta.to.global.u64 	%rd57, %rd56;
	shl.b64 	%rd58, %rd14, 2;
	add.s64 	%rd59, %rd57, %rd58;
	ld.global.f32 	%f24, [%rd59];
	st.global.f32 	[%rd55+32], %f24;
	ld.global.u32 	%r48, [%rd1+60];
	cvt.rn.f32.s32 	%f25, %r48;
	st.global.f32 	[%rd55+36], %f25;
	ld.global.u64 	%rd60, [%rd1+32];
	cvta.to.global.u64 	%rd61, %rd60;
	add.s64 	%rd62, %rd61, %rd58;
	ld.global.u32 	%r49, [%rd62];
	setp.eq.s32 	%p6, %r49, %r67;
	selp.f32 	%f26, 0f3F800000, 0f00000000, %p6;
	st.global.f32 	[%rd55+40], %f26;
	shr.u32 	%r50, %r10, 31;
	add.s32 	%r51, %r10, %r50;
	and.b32  	%r52, %r51, -2;
	sub.s32 	%r53, %r10, %r52;
	add.s32 	%r54, %r53, 1;
	add.s64 	%rd63, %rd5, %rd58;
	st.global.u32 	[%rd63+32768], %r54;
	shl.b32 	%r55, %r43, 1;
	mul.wide.s32 	%rd64, %r55, 4;
	add.s64 	%rd65, %rd5, %rd64;
	add.s64 	%rd17, %rd65, 36864;
	shr.s32 	%r56, %r10, 31;
	shr.u32 	%r57, %r56, 30;
	add.s32 	%r58, %r10, %r57;
	and.b32  	%r59, %r58, -4;
	sub.s32 	%r60, %r10, %r59;
	st.global.u32 	[%rd65+36864], %r60;
	setp.lt.s32 	%p7, %r53, 1;
	mov.u32 	%r71, -1;
	@%p7 bra 	$L__BB3_11;
	add.s32 	%r61, %r10, 1;
	shr.s32 	%r62, %r61, 31;
	shr.u32 	%r63, %r62, 30;
	add.s32 	%r64, %r61, %r63;
	and.b32  	%r65, %r64, -4;
	sub.s32 	%r71, %r61, %r65;
$L__BB3_11:
	st.global.u32 	[%rd17+4], %r71;
	add.s32 	%r68, %r68, 1;
	setp.lt.s32 	%p8, %r68, %r6;
	@%p8 bra 	$L__BB3_4;
$L__BB3_12:
	st.global.f32 	[%rd10], %f32;
	ld.global.u32 	%r66, [%rd1+52];
	add.s32 	%r67, %r67, %r3;
	setp.lt.s32 	%p9, %r67, %r66;
	@%p9 bra 	$L__BB3_2;
$L__BB3_13:
	ret;
}
)PTX";

constexpr int64_t kV = 32, kH = 8;

float embedValue(int64_t v, int64_t h) {
  return static_cast<float>((v * kH + h) % 7 - 3) * 0.5f;
}
float headValue(int64_t v, int64_t h) {
  return static_cast<float>((v * 3 + h) % 5 - 2);
}

/// The dense plan's logits row of `token` (small integers and halves: exact
/// in f32 whatever the order of the sum).
std::vector<float> denseRow(int32_t token) {
  std::vector<float> row(kV);
  for (int64_t v = 0; v < kV; ++v) {
    float acc = 0;
    for (int64_t h = 0; h < kH; ++h)
      acc += embedValue(token, h) * headValue(v, h);
    row[v] = acc;
  }
  return row;
}

/// w.safetensors: "embed" and "head", f32 [32, 8].
void writeSmokeWeights(const std::string &dir) {
  nlohmann::json header;
  const uint64_t n = kV * kH * 4;
  header["embed"] = {
      {"dtype", "F32"}, {"shape", {kV, kH}}, {"data_offsets", {0, n}}};
  header["head"] = {
      {"dtype", "F32"}, {"shape", {kV, kH}}, {"data_offsets", {n, 2 * n}}};
  std::string text = header.dump();
  while (text.size() % 8)
    text += ' ';
  std::string bytes = test::u64le(text.size()) + text;
  std::vector<float> data;
  for (int64_t v = 0; v < kV; ++v)
    for (int64_t h = 0; h < kH; ++h)
      data.push_back(embedValue(v, h));
  for (int64_t v = 0; v < kV; ++v)
    for (int64_t h = 0; h < kH; ++h)
      data.push_back(headValue(v, h));
  bytes.append(reinterpret_cast<const char *>(data.data()),
               data.size() * sizeof(float));
  test::writeFile(dir + "/w.safetensors", bytes);
}

struct SmokeSpec {
  bool state = false; // the state plan, else the dense one
  std::string target = "cuda";
  int64_t prefillTokens = 64, decodeTokens = 8;
  int64_t slots = 8;
  int64_t pages = 64; // KV pages of 2 positions (state plan)
  bool ptx = true;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> cubins;
  bool cooperativeNop = true;
  // Defects, for error tests.
  std::string ptxText = kSmokePtx;
  std::string nopFunction = "smoke_nop";
  uint32_t nopGrid = 1;
  // State plan: the select's experts/counts as kernel outputs, or internal
  // (and then possibly overwritten by a later op of the kernel).
  bool selectOutputs = true;
  bool clobberCounts = false;
  // Dense plan: the LM head as two launch variants (up to 2 tokens, 3 and
  // more) and a launch for >= 1000 tokens that fails whenever it runs.
  bool rangedLmHead = false;
};

/// Writes <dir>/<name>.nfb (and the weights) and returns its path.
std::string writeSmokePlan(const std::string &dir, const std::string &name,
                           const SmokeSpec &spec) {
  writeSmokeWeights(dir);
  flatbuffers::FlatBufferBuilder b;
  using flatbuffers::Offset;
  auto kernel = [&](const char *kname, std::vector<Offset<pl::Op>> ops,
                    std::vector<int32_t> outputs, const char *fn, uint32_t grid,
                    uint32_t block, bool coop) {
    std::vector<Offset<flatbuffers::String>> archs;
    std::vector<Offset<pl::CubinBlob>> blobs;
    for (const auto &[arch, image] : spec.cubins) {
      archs.push_back(b.CreateString(arch));
      blobs.push_back(pl::CreateCubinBlobDirect(b, &image));
    }
    std::vector<Offset<pl::Launch>> launches = {
        pl::CreateLaunchDirect(b, fn, grid, block, 0, coop)};
    if (spec.rangedLmHead && std::string(fn) == "smoke_lm_head")
      // Not programmatic: the smoke kernels do not wait (griddepcontrol).
      launches = {
          pl::CreateLaunchDirect(b, fn, grid, block, 0, false, 0, 2, false),
          pl::CreateLaunchDirect(b, fn, grid, block, 0, false, 3, 0, false),
          // smoke_state reads storage the dense plan does not have: fails.
          pl::CreateLaunchDirect(b, "smoke_state", 2, 32, 0, false, 1000, 0,
                                 false)};
    std::vector<int32_t> inputs;
    return pl::CreateKernelDirect(
        b, kname, &inputs, &outputs, &ops, &archs, &blobs,
        spec.ptx ? spec.ptxText.c_str() : nullptr, &launches, "smoke");
  };
  auto tensor = [&](pl::DType dt, int64_t cols, int64_t offset, int64_t maxT) {
    std::vector<int64_t> shape = {-1, cols};
    return pl::CreateValueDirect(b, pl::ValueKind::Tensor, dt, pl::Rows::Tokens,
                                 &shape, offset, maxT * cols * 4);
  };
  auto step = [&](const char *phase, int64_t maxT) {
    std::vector<Offset<pl::Value>> values = {
        pl::CreateValueDirect(b, pl::ValueKind::Tokens, pl::DType::I32),
        pl::CreateValueDirect(b, pl::ValueKind::Batch),
        pl::CreateValueDirect(b, pl::ValueKind::Budget, pl::DType::F32)};
    std::vector<Offset<pl::Kernel>> kernels;
    kernels.push_back(kernel("nop", {}, {}, spec.nopFunction.c_str(),
                             spec.nopGrid, 32, spec.cooperativeNop));
    int32_t logits = 0;
    int64_t arena = 0;
    if (!spec.state) {
      values.push_back(pl::CreateValueDirect(b, pl::ValueKind::Weight,
                                             pl::DType::F32, pl::Rows::None,
                                             nullptr, -1, 0, 0));
      values.push_back(pl::CreateValueDirect(b, pl::ValueKind::Weight,
                                             pl::DType::F32, pl::Rows::None,
                                             nullptr, -1, 0, 1));
      values.push_back(tensor(pl::DType::F32, kH, 0, maxT));     // 5 hidden
      values.push_back(tensor(pl::DType::F32, kV, 65536, maxT)); // 6 logits
      std::vector<int32_t> in = {0, 3}, out = {5};
      kernels.push_back(kernel("embed",
                               {pl::CreateOpDirect(b, "nf.embed", &in, &out)},
                               {5}, "smoke_embed", 4, 128, false));
      in = {5, 4};
      out = {6};
      kernels.push_back(kernel("lm_head",
                               {pl::CreateOpDirect(b, "nf.lm_head", &in, &out)},
                               {6}, "smoke_lm_head", 8, 128, false));
      logits = 6;
      arena = 65536 + maxT * kV * 4;
    } else {
      values.push_back(tensor(pl::DType::F32, kV, 0, maxT));    // 3 logits
      values.push_back(tensor(pl::DType::F32, 4, 40960, maxT)); // 4 scores
      values.push_back(tensor(pl::DType::I32, 2, 36864, maxT)); // 5 experts
      values.push_back(tensor(pl::DType::F32, 2, 45056, maxT)); // 6 weights
      values.push_back(tensor(pl::DType::I32, 1, 32768, maxT)); // 7 counts
      values.push_back(tensor(pl::DType::F32, 1, 32768, maxT)); // 8 over counts
      std::vector<int32_t> in = {4, 4, 2}, out = {5, 6, 7};
      std::vector<Offset<pl::IntAttr>> ints = {
          pl::CreateIntAttrDirect(b, "top_k", 2)};
      std::vector<Offset<pl::Op>> ops = {
          pl::CreateOpDirect(b, "nf_moe.select", &in, &out, -1, &ints)};
      if (spec.clobberCounts) {
        std::vector<int32_t> addIn = {8, 8}, addOut = {8};
        ops.push_back(pl::CreateOpDirect(b, "nf.add", &addIn, &addOut));
      }
      kernels.push_back(kernel("state", ops,
                               spec.selectOutputs
                                   ? std::vector<int32_t>{3, 5, 7}
                                   : std::vector<int32_t>{3},
                               "smoke_state", 2, 32, false));
      logits = 3;
      arena = 49152;
    }
    return pl::CreateStepDirect(b, phase, &values, &kernels, 0, 1, 2, logits,
                                maxT, arena, arena, 0);
  };
  EXPECT_LE(std::max(spec.prefillTokens, spec.decodeTokens), 256);
  auto prefill = step("prefill", spec.prefillTokens);
  auto decode = step("decode", spec.decodeTokens);
  std::vector<Offset<pl::Weight>> weights;
  for (const char *t : {"embed", "head"}) {
    std::vector<Offset<flatbuffers::String>> names = {b.CreateString(t)};
    std::vector<int64_t> shape = {kV, kH};
    weights.push_back(pl::CreateWeightDirect(b, &names, false, nullptr,
                                             pl::DType::F32, &shape));
  }
  std::vector<Offset<pl::Storage>> storage;
  if (spec.state) {
    // Mamba: 1 head of dim 1, state 1, one group: conv_dim 1 + 2 = 3.
    storage.push_back(pl::CreateStorageDirect(
        b, "mamba", pl::StorageKind::MambaState, 0, 0, 0, 0, /*head_dim=*/1,
        pl::DType::F32, spec.slots, /*conv_dim=*/3, /*conv_window=*/3,
        /*num_heads=*/1, /*state_size=*/1));
    storage.push_back(pl::CreateStorageDirect(
        b, "kv", pl::StorageKind::KVCache, 1, /*page_size=*/2, spec.pages,
        /*kv_heads=*/1, /*head_dim=*/1, pl::DType::F32));
  }
  std::vector<Offset<flatbuffers::String>> files = {
      b.CreateString("w.safetensors")};
  auto config = pl::CreateModelConfigDirect(b, "smoke", kV, kH, -1, nullptr, -1,
                                            spec.state ? "M*E" : "-",
                                            dir.c_str(), &files);
  std::vector<Offset<flatbuffers::String>> archs;
  for (const auto &c : spec.cubins)
    archs.push_back(b.CreateString(c.first));
  auto target = pl::CreateTargetDirect(b, spec.target.c_str(), &archs);
  auto plan = pl::CreatePlanDirect(b, kPlanVersionMajor, kPlanVersionMinor,
                                   "cuda_engine_test", config, &weights,
                                   &storage, prefill, decode, target, "topk");
  pl::FinishPlanBuffer(b, plan);
  const std::string path = dir + "/" + name + ".nfb";
  test::writeFile(
      path, std::string(reinterpret_cast<const char *>(b.GetBufferPointer()),
                        b.GetSize()));
  return path;
}

// ---------------------------------------------------------------------------
// Driver loading and backend selection (no GPU needed)

TEST(CudaDriver, MissingLibraryIsAnError) {
  StatusOr<const cuda::Driver *> d =
      cuda::loadDriver("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.message().find("cannot load /nonexistent/libcuda.so.1"),
            std::string::npos)
      << d.message();
  // The failure is remembered, message and all.
  StatusOr<const cuda::Driver *> again =
      cuda::loadDriver("/nonexistent/libcuda.so.1");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.message(), d.message());
}

TEST(CudaDriver, LibraryWithoutTheEntryPoints) {
  StatusOr<const cuda::Driver *> d = cuda::loadDriver("libm.so.6");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.message().find("libm.so.6: no entry point cuGetErrorName"),
            std::string::npos)
      << d.message();
}

TEST(CudaDriver, StubDriverFailsToInitialise) {
  // The toolkit's link stub exports every entry point and fails them all.
  // Its soname is libcuda.so.1: once loaded, it would answer every later
  // dlopen("libcuda.so.1") of this process, so only where there is no
  // driver to find (the real one is loaded first where there is).
  if (StatusOr<const cuda::Driver *> real = cuda::loadDriver();
      real.ok() || real.message().rfind("cannot load", 0) != 0)
    GTEST_SKIP() << "a CUDA driver is installed here";
  std::string stub;
  for (const char *p : {"/usr/local/cuda/lib64/stubs/libcuda.so",
                        "/usr/local/cuda/targets/x86_64-linux/lib/stubs/"
                        "libcuda.so"})
    if (fs::exists(p))
      stub = p;
  if (stub.empty())
    GTEST_SKIP() << "no CUDA stub driver here";
  StatusOr<const cuda::Driver *> d = cuda::loadDriver(stub);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.message().rfind("cuInit: ", 0), 0u) << d.message();
  std::cout << "[ cuda ] stub driver: " << d.message() << "\n";
}

TEST(CudaDriver, DefaultLibraryName) {
  EXPECT_EQ(cuda::driverLibrary("/x/libcuda.so"), "/x/libcuda.so");
  if (!std::getenv("NF_LIBCUDA")) {
    EXPECT_EQ(cuda::driverLibrary(), "libcuda.so.1");
  }
}

SmokeSpec cpuTarget() {
  SmokeSpec s;
  s.target = "cpu";
  s.ptx = false;
  return s;
}

TEST(CudaBackend, UnknownBackendIsAnError) {
  test::TempDir dir;
  StatusOr<std::unique_ptr<Engine>> e = Engine::load(
      writeSmokePlan(dir.path(), "cpu", cpuTarget()), options("gpu"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("unknown backend 'gpu'"), std::string::npos)
      << e.message();
}

TEST(CudaBackend, CpuPlanRunsOnTheCpuSilently) {
  test::TempDir dir;
  const std::string plan = writeSmokePlan(dir.path(), "cpu", cpuTarget());
  testing::internal::CaptureStderr();
  std::unique_ptr<Engine> e = load(plan, options("auto"));
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info().backend, "cpu");
  EXPECT_EQ(err, "");
}

TEST(CudaBackend, CpuPlanCannotBeForcedOntoCuda) {
  test::TempDir dir;
  StatusOr<std::unique_ptr<Engine>> e = Engine::load(
      writeSmokePlan(dir.path(), "cpu", cpuTarget()), options("cuda"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("has no CUDA binaries (target 'cpu'"),
            std::string::npos)
      << e.message();
}

TEST(CudaBackend, CudaPlanFallsBackToTheCpuWithOneLine) {
  test::TempDir dir;
  const std::string plan = writeSmokePlan(dir.path(), "dense", {});
  EngineOptions o = options("auto");
  o.cudaDriver = "/nonexistent/libcuda.so.1";
  testing::internal::CaptureStderr();
  std::unique_ptr<Engine> e = load(plan, o);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info().backend, "cpu");
  EXPECT_EQ(err.rfind("nf: CUDA unavailable (cannot load "
                      "/nonexistent/libcuda.so.1: ",
                      0),
            0u)
      << err;
  EXPECT_NE(err.find("): using the CPU backend\n"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;

  // The CPU runs the plan's ops (the binaries are ignored).
  StatusOr<int32_t> seq = e->addSequence();
  ASSERT_TRUE(seq.ok());
  const std::vector<int32_t> toks = {3, 17, 31};
  std::vector<float> logits;
  ASSERT_TRUE(stepOne(*e, *seq, toks, LogitsFor::AllTokens, logits).ok());
  for (size_t t = 0; t < toks.size(); ++t)
    EXPECT_EQ(maxAbsDiff(logits.data() + t * kV, denseRow(toks[t]).data(), kV),
              0.0);

  // Forced: an error naming the reason.
  o.backend = "cuda";
  StatusOr<std::unique_ptr<Engine>> forced = Engine::load(plan, o);
  ASSERT_FALSE(forced.ok());
  EXPECT_EQ(forced.message().rfind(
                "CUDA backend: cannot load /nonexistent/libcuda.so.1", 0),
            0u)
      << forced.message();
}

TEST(CudaBackend, CApiBackendParameter) {
  test::TempDir dir;
  const std::string plan = writeSmokePlan(dir.path(), "dense", {});
  nf_model_params p = nf_model_default_params();
  EXPECT_EQ(p.backend, nullptr);
  p.backend = "tpu";
  nf_model *m = nullptr;
  EXPECT_EQ(nf_model_load(plan.c_str(), &p, &m), NF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(std::string(nf_last_error()).find("unknown backend 'tpu'"),
            std::string::npos)
      << nf_last_error();
  p.backend = "cpu";
  ASSERT_EQ(nf_model_load(plan.c_str(), &p, &m), NF_OK) << nf_last_error();
  EXPECT_STREQ(nf_model_backend(m), "cpu");
  EXPECT_NE(std::string(nf_model_info(m)).find("backend: cpu\n"),
            std::string::npos);
  nf_model_free(m);
  EXPECT_STREQ(nf_model_backend(nullptr), "");
  // "cuda" through the C API, on the fake driver ($NF_LIBCUDA).
  {
    const char *saved = std::getenv("NF_LIBCUDA");
    const std::string keep = saved ? saved : "";
    setenv("NF_LIBCUDA", fakeDriver().c_str(), 1);
    p.backend = "cuda";
    const nf_status st = nf_model_load(plan.c_str(), &p, &m);
    if (saved)
      setenv("NF_LIBCUDA", keep.c_str(), 1);
    else
      unsetenv("NF_LIBCUDA");
    ASSERT_EQ(st, NF_OK) << nf_last_error();
    EXPECT_STREQ(nf_model_backend(m), "cuda");
    EXPECT_NE(std::string(nf_model_info(m)).find("backend: cuda (nf fake GPU"),
              std::string::npos)
        << nf_model_info(m);
    nf_seq_input in = {};
    const int32_t toks[] = {3, 4};
    ASSERT_EQ(nf_seq_add(m, &in.seq_id), NF_OK);
    in.tokens = toks;
    in.n_tokens = 2;
    nf_batch batch = {&in, 1, nullptr};
    std::vector<float> logits(2 * kV);
    ASSERT_EQ(nf_decode(m, &batch, logits.data(), logits.size(), 1), NF_OK)
        << nf_last_error();
    EXPECT_EQ(maxAbsDiff(logits.data() + kV, denseRow(4).data(), kV), 0.0);
    nf_model_free(m);
  }
  if (cudaUnavailable().empty()) {
    p.backend = "cuda";
    ASSERT_EQ(nf_model_load(plan.c_str(), &p, &m), NF_OK) << nf_last_error();
    EXPECT_STREQ(nf_model_backend(m), "cuda");
    std::cout << "[ cuda ] " << nf_model_info(m);
    nf_model_free(m);
  }
}

// nf_decode_sample against nf_decode then nf_sample: the same tokens, step
// after step, for a batch of samplers of different kinds (CPU backend: the
// rows path; the device's top lists are checked by CudaFixture).
TEST(CudaBackend, CApiDecodeSampleDrawsWhatDecodeThenSampleDraws) {
  test::TempDir dir;
  const std::string plan = writeSmokePlan(dir.path(), "dense", {});
  nf_model_params p = nf_model_default_params();
  p.backend = "cpu";
  nf_model *a = nullptr, *b = nullptr;
  ASSERT_EQ(nf_model_load(plan.c_str(), &p, &a), NF_OK) << nf_last_error();
  ASSERT_EQ(nf_model_load(plan.c_str(), &p, &b), NF_OK) << nf_last_error();
  nf_sampler_params sp[3] = {nf_sampler_default_params(),
                             nf_sampler_default_params(),
                             nf_sampler_default_params()};
  sp[1].temperature = 0.9f;
  sp[1].top_k = 3;
  sp[1].seed = 5;
  sp[2].temperature = 1.2f;
  sp[2].top_p = 0.8f;
  sp[2].seed = 6;
  nf_sampler *sa[3], *sb[3];
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(nf_sampler_create(&sp[i], &sa[i]), NF_OK);
    ASSERT_EQ(nf_sampler_create(&sp[i], &sb[i]), NF_OK);
  }
  nf_seq_input ia[3] = {}, ib[3] = {};
  int32_t ta[3] = {3, 5, 7}, tb[3] = {3, 5, 7};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(nf_seq_add(a, &ia[i].seq_id), NF_OK);
    ASSERT_EQ(nf_seq_add(b, &ib[i].seq_id), NF_OK);
    ia[i].tokens = &ta[i];
    ib[i].tokens = &tb[i];
    ia[i].n_tokens = ib[i].n_tokens = 1;
  }
  nf_batch ba = {ia, 3, nullptr}, bb = {ib, 3, nullptr};
  std::vector<float> logits(3 * kV);
  for (int step = 0; step < 6; ++step) {
    int32_t got[3];
    ASSERT_EQ(nf_decode_sample(a, &ba, sa, got), NF_OK) << nf_last_error();
    ASSERT_EQ(nf_decode(b, &bb, logits.data(), logits.size(), 0), NF_OK);
    for (int i = 0; i < 3; ++i) {
      const int32_t want = nf_sample(sb[i], logits.data() + i * kV, kV);
      ASSERT_GE(want, 0) << nf_last_error();
      EXPECT_EQ(got[i], want) << "step " << step << " sampler " << i;
      ta[i] = got[i];
      tb[i] = want;
    }
  }
  EXPECT_EQ(nf_decode_sample(a, &ba, nullptr, ta), NF_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < 3; ++i) {
    nf_sampler_free(sa[i]);
    nf_sampler_free(sb[i]);
  }
  nf_model_free(a);
  nf_model_free(b);
}

// ---------------------------------------------------------------------------
// Smoke plans: on the GPU ("device"), and on the fake driver of
// fake_cuda_driver.cpp ("fake": every machine), which runs the same kernels
// on the host and checks every copy, free and context switch.

class CudaSmoke : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    if (GetParam() == "device")
      NF_REQUIRE_GPU();
    else
      driver_ = fakeDriver();
  }
  void TearDown() override {
    if (GetParam() != "fake")
      return;
    // Every engine is gone: the fake driver holds no allocation.
    void *h = dlopen(driver_.c_str(), RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(h, nullptr);
    auto live =
        reinterpret_cast<int (*)()>(dlsym(h, "nfFakeCudaLiveAllocations"));
    ASSERT_NE(live, nullptr);
    EXPECT_EQ(live(), 0) << "device or pinned allocations leaked";
    dlclose(h);
  }
  EngineOptions opts(const std::string &backend) const {
    EngineOptions o = options(backend);
    o.cudaDriver = driver_;
    return o;
  }
  std::string arch() const {
    return GetParam() == "device" ? deviceArch() : "sm_90";
  }
  std::string driver_;
};

/// Runs `prompts` as one batched prefill (all logits) then `steps` batched
/// decode steps feeding token (step * 7 + i) % 32; returns every logits row
/// of every sequence in order: [sequence][row][V].
std::vector<std::vector<std::vector<float>>>
runBatched(Engine &e, const std::vector<std::vector<int32_t>> &prompts,
           int steps, bool oneAtATime = false) {
  const size_t n = prompts.size();
  std::vector<std::vector<std::vector<float>>> out(n);
  std::vector<int32_t> seqs(n);
  for (size_t i = 0; i < n; ++i) {
    StatusOr<int32_t> s = e.addSequence();
    EXPECT_TRUE(s.ok()) << s.message();
    seqs[i] = s ? *s : -1;
  }
  auto collect = [&](const std::vector<size_t> &which,
                     const std::vector<float> &logits,
                     const std::vector<size_t> &rows) {
    size_t r = 0;
    for (size_t k = 0; k < which.size(); ++k)
      for (size_t j = 0; j < rows[k]; ++j, ++r)
        out[which[k]].emplace_back(logits.begin() + r * kV,
                                   logits.begin() + (r + 1) * kV);
  };
  std::vector<std::vector<size_t>> groups;
  if (oneAtATime)
    for (size_t i = 0; i < n; ++i)
      groups.push_back({i});
  else {
    groups.emplace_back();
    for (size_t i = 0; i < n; ++i)
      groups[0].push_back(i);
  }
  for (const auto &g : groups) {
    std::vector<SequenceInput> in;
    std::vector<size_t> rows;
    for (size_t i : g) {
      SequenceInput s;
      s.sequence = seqs[i];
      s.tokens = prompts[i];
      in.push_back(s);
      rows.push_back(prompts[i].size());
    }
    std::vector<float> logits;
    Status st = e.step(in, LogitsFor::AllTokens, logits);
    EXPECT_TRUE(st.ok()) << st.message();
    if (st)
      collect(g, logits, rows);
  }
  std::vector<int32_t> toks(n);
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < n; ++i)
      toks[i] = static_cast<int32_t>((step * 7 + i) % kV);
    for (const auto &g : groups) {
      std::vector<SequenceInput> in;
      for (size_t i : g) {
        SequenceInput s;
        s.sequence = seqs[i];
        s.tokens = {&toks[i], 1};
        in.push_back(s);
      }
      std::vector<float> logits;
      Status st = e.step(in, LogitsFor::LastTokenPerSequence, logits);
      EXPECT_TRUE(st.ok()) << st.message();
      if (st)
        collect(g, logits, std::vector<size_t>(g.size(), 1));
    }
  }
  for (int32_t s : seqs)
    EXPECT_TRUE(e.removeSequence(s).ok());
  return out;
}

const std::vector<std::vector<int32_t>> kSmokePrompts = {
    {5, 9, 2, 30, 1, 7, 7, 12, 19, 3, 3, 28, 0},
    {11},
    {4, 8, 15, 16, 23, 31},
    {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 9}};

TEST_P(CudaSmoke, DenseMatchesTheCpuExactly) {
  test::TempDir dir;
  const std::string plan = writeSmokePlan(dir.path(), "dense", {});
  std::unique_ptr<Engine> gpu = load(plan, opts("cuda"));
  std::unique_ptr<Engine> cpu = load(plan, options("cpu"));
  ASSERT_TRUE(gpu && cpu);
  EXPECT_EQ(gpu->info().backend, "cuda");
  EXPECT_NE(gpu->info().device.find("0 cubin, 6 PTX JIT"), std::string::npos)
      << gpu->info().device;
  std::cout << "[ cuda ] device: " << gpu->info().device << "\n";
  auto a = runBatched(*gpu, kSmokePrompts, 5);
  auto b = runBatched(*cpu, kSmokePrompts, 5);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), kSmokePrompts[i].size() + 5);
    ASSERT_EQ(a[i].size(), b[i].size());
    for (size_t r = 0; r < a[i].size(); ++r) {
      EXPECT_EQ(maxAbsDiff(a[i][r].data(), b[i][r].data(), kV), 0.0)
          << "sequence " << i << " row " << r;
      const int32_t tok =
          r < kSmokePrompts[i].size()
              ? kSmokePrompts[i][r]
              : static_cast<int32_t>(((r - kSmokePrompts[i].size()) * 7 + i) %
                                     kV);
      EXPECT_EQ(maxAbsDiff(a[i][r].data(), denseRow(tok).data(), kV), 0.0);
    }
  }
}

// Launch token ranges: each step runs the launches whose range holds its
// token count (the launch for >= 1000 tokens, which would fail, never runs),
// and the decode program is captured as one graph per bucket.
TEST_P(CudaSmoke, LaunchTokenRangesPickVariantsPerStep) {
  test::TempDir dir;
  SmokeSpec ranged;
  ranged.rangedLmHead = true;
  const std::string plan = writeSmokePlan(dir.path(), "ranged", ranged);
  std::unique_ptr<Engine> gpu = load(plan, opts("cuda"));
  EngineOptions noGraph = opts("cuda");
  noGraph.cudaGraphs = false;
  std::unique_ptr<Engine> launches = load(plan, noGraph);
  ASSERT_TRUE(gpu && launches);
  EXPECT_NE(gpu->info().device.find("decode graphs for <= 2 | <= 8 tokens"),
            std::string::npos)
      << gpu->info().device;
  // One sequence (narrow variant, 1-token decode steps) and all four (wide).
  for (const auto &prompts :
       {std::vector<std::vector<int32_t>>{kSmokePrompts[0]}, kSmokePrompts})
    for (Engine *e : {gpu.get(), launches.get()}) {
      auto a = runBatched(*e, prompts, 3);
      ASSERT_EQ(a.size(), prompts.size());
      for (size_t i = 0; i < a.size(); ++i)
        for (size_t r = 0; r < a[i].size(); ++r) {
          const int32_t tok = r < prompts[i].size()
                                  ? prompts[i][r]
                                  : static_cast<int32_t>(
                                        ((r - prompts[i].size()) * 7 + i) % kV);
          EXPECT_EQ(maxAbsDiff(a[i][r].data(), denseRow(tok).data(), kV), 0.0)
              << "sequence " << i << " row " << r;
        }
    }
}

TEST_P(CudaSmoke, ChunkedStepsGraphsAndCubins) {
  test::TempDir dir;
  SmokeSpec small;
  small.prefillTokens = 4;
  small.decodeTokens = 2;
  const std::string plan = writeSmokePlan(dir.path(), "small", small);
  std::unique_ptr<Engine> ref =
      load(writeSmokePlan(dir.path(), "dense", {}), opts("cuda"));
  std::unique_ptr<Engine> chunked = load(plan, opts("cuda"));
  EngineOptions noGraph = opts("cuda");
  noGraph.cudaGraphs = false;
  std::unique_ptr<Engine> launches = load(plan, noGraph);
  ASSERT_TRUE(ref && chunked && launches);
  EXPECT_NE(chunked->info().device.find("decode graph"), std::string::npos);
  EXPECT_NE(launches->info().device.find("decode launches"), std::string::npos);
  auto want = runBatched(*ref, kSmokePrompts, 4);
  for (Engine *e : {chunked.get(), launches.get()}) {
    auto got = runBatched(*e, kSmokePrompts, 4);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].size(), want[i].size());
      for (size_t r = 0; r < got[i].size(); ++r)
        EXPECT_EQ(maxAbsDiff(got[i][r].data(), want[i][r].data(), kV), 0.0);
    }
  }

  // The same kernels as a cubin for this device (ptxas from the toolkit).
  std::string ptxas = envOr("PTXAS", "");
  if (ptxas.empty())
    ptxas = std::system("command -v ptxas >/dev/null 2>&1") == 0
                ? "ptxas"
                : "/usr/local/cuda/bin/ptxas";
  const std::string devArch = arch();
  const std::string ptxFile = dir.file("smoke.ptx"),
                    cubinFile = dir.file("smoke.cubin");
  test::writeFile(ptxFile, kSmokePtx);
  const std::string cmd = ptxas + " -arch=" + devArch + " " + ptxFile + " -o " +
                          cubinFile + " 2>&1";
  if (std::system(cmd.c_str()) != 0 || !fs::exists(cubinFile)) {
    std::cout << "[ cuda ] no cubin test: '" << cmd << "' failed\n";
    return;
  }
  const std::string image = test::readFile(cubinFile);
  SmokeSpec cubin;
  cubin.ptx = false;
  cubin.cubins = {{"sm_10", {1, 2, 3}},
                  {devArch, std::vector<uint8_t>(image.begin(), image.end())}};
  std::unique_ptr<Engine> fromCubin =
      load(writeSmokePlan(dir.path(), "cubin", cubin), opts("cuda"));
  ASSERT_NE(fromCubin, nullptr);
  EXPECT_NE(fromCubin->info().device.find("6 cubin, 0 PTX JIT"),
            std::string::npos)
      << fromCubin->info().device;
  auto got = runBatched(*fromCubin, kSmokePrompts, 4);
  for (size_t i = 0; i < got.size(); ++i)
    for (size_t r = 0; r < got[i].size(); ++r)
      EXPECT_EQ(maxAbsDiff(got[i][r].data(), want[i][r].data(), kV), 0.0);
}

TEST_P(CudaSmoke, NoBinaryForThisDevice) {
  test::TempDir dir;
  SmokeSpec spec;
  spec.ptx = false;
  spec.cubins = {{"sm_10", {1, 2, 3}}};
  const std::string plan = writeSmokePlan(dir.path(), "foreign", spec);
  StatusOr<std::unique_ptr<Engine>> forced = Engine::load(plan, opts("cuda"));
  ASSERT_FALSE(forced.ok());
  EXPECT_NE(forced.message().find("has no cubin for " + arch() +
                                  " (only sm_10) and no PTX"),
            std::string::npos)
      << forced.message();
  testing::internal::CaptureStderr();
  std::unique_ptr<Engine> e = load(plan, opts("auto"));
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info().backend, "cpu");
  EXPECT_EQ(err.rfind("nf: CUDA unavailable (", 0), 0u) << err;
}

TEST_P(CudaSmoke, BadModulesAndLaunchesAreLoadErrors) {
  test::TempDir dir;
  auto error = [&](const SmokeSpec &spec) {
    StatusOr<std::unique_ptr<Engine>> e =
        Engine::load(writeSmokePlan(dir.path(), "bad", spec), opts("cuda"));
    EXPECT_FALSE(e.ok());
    if (!e.ok())
      std::cout << "[ cuda ] " << e.message() << "\n";
    return e.ok() ? std::string() : e.message();
  };
  SmokeSpec spec;
  spec.nopFunction = "smoke_missing";
  std::string m = error(spec);
  EXPECT_NE(m.find("prefill kernel 0 'nop' launch 0 (smoke_missing): "
                   "cuModuleGetFunction: "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("CUDA_ERROR_NOT_FOUND"), std::string::npos) << m;
  spec = {};
  spec.ptxText = "this is not PTX";
  m = error(spec);
  EXPECT_NE(m.find("prefill kernel 0 'nop': cuModuleLoadDataEx: "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("[PTX JIT]"), std::string::npos) << m;
  spec = {};
  spec.nopGrid = 1u << 20; // more blocks than can be resident at once
  m = error(spec);
  EXPECT_NE(m.find("cooperative grid of 1048576 blocks exceeds the"),
            std::string::npos)
      << m;

  // "auto": the CPU takes the plan the device refused, saying why.
  testing::internal::CaptureStderr();
  std::unique_ptr<Engine> e =
      load(writeSmokePlan(dir.path(), "bad", spec), opts("auto"));
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info().backend, "cpu");
  EXPECT_EQ(err.rfind("nf: CUDA unavailable (", 0), 0u) << err;
  EXPECT_NE(err.find("cooperative grid"), std::string::npos) << err;
}

/// PTX of the module globals that declare tensor map `d` (nf_abi.h).
std::string tensorMapPtx(const nf_tensor_map_desc &d) {
  const auto *bytes = reinterpret_cast<const unsigned char *>(&d);
  std::string s = "\n.global .align 8 .b8 nf_tensor_map_descs[" +
                  std::to_string(sizeof d) + "] = {";
  for (size_t i = 0; i < sizeof d; ++i)
    s += (i ? ", " : "") + std::to_string(bytes[i]);
  return s + "};\n.global .align 64 .b8 nf_tensor_maps[128];\n";
}

// A module that streams by TMA declares tensor maps (nf_abi.h); the engine
// encodes them when it loads the module, each checked to lie inside its
// source first: a map past the end of its weight, or of an unknown source,
// is a load error naming the kernel.
TEST_P(CudaSmoke, TensorMapsAreEncodedAndChecked) {
  test::TempDir dir;
  nf_tensor_map_desc d{};
  d.source = NF_TENSOR_MAP_WEIGHT;
  d.index = 0; // the embedding table, 32 x 8 f32: 1024 bytes
  d.dims[0] = 64;
  d.dims[1] = 1;
  d.stride = 128;
  d.box[0] = 64;
  d.box[1] = 1;
  SmokeSpec spec;
  spec.ptxText = std::string(kSmokePtx) + tensorMapPtx(d);
  {
    std::unique_ptr<Engine> e =
        load(writeSmokePlan(dir.path(), "maps", spec), opts("cuda"));
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->info().backend, "cuda");
    auto rows = runBatched(*e, {kSmokePrompts[0]}, 1);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(
        maxAbsDiff(rows[0][0].data(), denseRow(kSmokePrompts[0][0]).data(), kV),
        0.0);
  }
  auto error = [&](const nf_tensor_map_desc &bad) {
    SmokeSpec s;
    s.ptxText = std::string(kSmokePtx) + tensorMapPtx(bad);
    StatusOr<std::unique_ptr<Engine>> e =
        Engine::load(writeSmokePlan(dir.path(), "bad", s), opts("cuda"));
    EXPECT_FALSE(e.ok());
    if (!e.ok())
      std::cout << "[ cuda ] " << e.message() << "\n";
    return e.ok() ? std::string() : e.message();
  };
  nf_tensor_map_desc past = d;
  past.dims[1] = 9; // 9 rows of 128 bytes
  std::string m = error(past);
  EXPECT_NE(m.find("prefill kernel 0 'nop': tensor map 0 does not fit its "
                   "source (1024 bytes)"),
            std::string::npos)
      << m;
  nf_tensor_map_desc unknown = d;
  unknown.source = 7;
  m = error(unknown);
  EXPECT_NE(m.find("prefill kernel 0 'nop': tensor map 0: unknown source 7"),
            std::string::npos)
      << m;
}

// Expert statistics need the select results in the arena when their kernel
// ends: outputs, or internal values nothing later in the kernel overwrites.
TEST_P(CudaSmoke, StatisticsNeedTheSelectResults) {
  test::TempDir dir;
  for (int variant = 0; variant < 2; ++variant) {
    SmokeSpec spec;
    spec.state = true;
    spec.selectOutputs = false;
    spec.clobberCounts = variant == 1;
    std::unique_ptr<Engine> e =
        load(writeSmokePlan(dir.path(), "stats", spec), opts("cuda"));
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->info().expertStats, variant == 0);
    EXPECT_EQ(e->info().device.find("no expert statistics") !=
                  std::string::npos,
              variant == 1)
        << e->info().device;
    const int32_t seq = *e->addSequence();
    const std::vector<int32_t> toks = {1, 2, 3};
    std::vector<float> logits;
    StepStats stats;
    ASSERT_TRUE(
        stepOne(*e, seq, toks, LogitsFor::AllTokens, logits, &stats).ok());
    EXPECT_EQ(stats.expertCalls[0], variant == 0 ? 2 + 1 + 2 : 0);
    ASSERT_TRUE(e->removeSequence(seq).ok());
  }
}

/// Expected row of the state kernel for a sequence with `history` tokens
/// (the last one being the current token).
std::vector<float> stateRow(const std::vector<int32_t> &history, float budget,
                            int32_t override) {
  std::vector<float> row(kV, 0.0f);
  const int64_t pos = static_cast<int64_t>(history.size()) - 1;
  double run = 0;
  for (int32_t t : history)
    run += t;
  auto at = [&](int64_t p) { return p >= 0 ? float(history[p]) : 0.0f; };
  row[0] = float(history.back());
  row[1] = float(pos);
  row[2] = float(run);
  row[3] = float(run);
  row[4] = float(pos * (pos + 1) / 2);
  row[5] = at(pos - 2);
  row[6] = at(pos - 1);
  row[7] = at(pos);
  row[8] = budget;
  row[9] = float(override);
  row[10] = 1.0f;
  return row;
}

void checkStateRows(const std::vector<std::vector<std::vector<float>>> &got,
                    const std::vector<std::vector<int32_t>> &prompts,
                    int steps) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> history;
    ASSERT_EQ(got[i].size(), prompts[i].size() + steps);
    for (size_t r = 0; r < got[i].size(); ++r) {
      history.push_back(
          r < prompts[i].size()
              ? prompts[i][r]
              : static_cast<int32_t>(((r - prompts[i].size()) * 7 + i) % kV));
      const std::vector<float> want = stateRow(history, 1.0f, 0);
      EXPECT_EQ(maxAbsDiff(got[i][r].data(), want.data(), kV), 0.0)
          << "sequence " << i << " row " << r << ": got [" << got[i][r][0]
          << " " << got[i][r][1] << " " << got[i][r][2] << " " << got[i][r][3]
          << " " << got[i][r][4] << " " << got[i][r][5] << " " << got[i][r][6]
          << " " << got[i][r][7] << "]";
    }
  }
}

TEST_P(CudaSmoke, StateSlotsPagesAndStatistics) {
  test::TempDir dir;
  SmokeSpec spec;
  spec.state = true;
  const std::string plan = writeSmokePlan(dir.path(), "state", spec);
  std::unique_ptr<Engine> e = load(plan, opts("cuda"));
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(e->info().expertStats);
  EXPECT_EQ(e->info().topK, 2);
  EXPECT_EQ(e->info().numMoeLayers, 1);
  EXPECT_EQ(e->info().numExperts, 4);
  EXPECT_EQ(e->info().maxContext, 96 * 2);
  // Twice: the second time every slot and page has been used before (a new
  // sequence's state must start from zero).
  for (int round = 0; round < 2; ++round)
    checkStateRows(runBatched(*e, kSmokePrompts, 6), kSmokePrompts, 6);
  checkStateRows(runBatched(*e, kSmokePrompts, 3, /*oneAtATime=*/true),
                 kSmokePrompts, 3);

  // Small runs: sequences split across runs continue from their state; the
  // decode graph and plain launches agree.
  SmokeSpec small = spec;
  small.prefillTokens = 3;
  small.decodeTokens = 2;
  const std::string smallPlan = writeSmokePlan(dir.path(), "small", small);
  for (bool graphs : {true, false}) {
    EngineOptions o = opts("cuda");
    o.cudaGraphs = graphs;
    std::unique_ptr<Engine> s = load(smallPlan, o);
    ASSERT_NE(s, nullptr);
    checkStateRows(runBatched(*s, kSmokePrompts, 5), kSmokePrompts, 5);
  }

  // Statistics: counts 1 + token % 2; experts token % 4 and (token + 1) % 4.
  e->resetExpertUtilization();
  StatusOr<int32_t> a = e->addSequence(), b = e->addSequence();
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int32_t> ta = {1, 2, 3, 4, 5}, tb = {7, 7};
  std::vector<SequenceInput> in(2);
  in[0].sequence = *a;
  in[0].tokens = ta;
  in[0].expertBudget = 0.5f;
  in[1].sequence = *b;
  in[1].tokens = tb;
  in[1].expertBudget = 0.5f;
  StepStats stats;
  std::vector<float> logits;
  Status st = e->step(in, LogitsFor::AllTokens, logits, &stats);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(logits.size(), size_t(7 * kV));
  EXPECT_EQ(logits[8], 0.5f); // budget
  EXPECT_EQ(stats.expertCalls, (std::vector<int64_t>{2 + 1 + 2 + 1 + 2, 4}));
  ASSERT_EQ(stats.expertCallsPerLayer.size(), 2u);
  EXPECT_EQ(stats.expertCallsPerLayer[1], std::vector<int64_t>{4});
  EXPECT_DOUBLE_EQ(stats.budgetSpent[1], 4.0 / (2.0 * 1 * 2));
  std::vector<int64_t> used(4, 0);
  for (int32_t t : {1, 2, 3, 4, 5, 7, 7}) {
    ++used[t % 4];
    if (t % 2)
      ++used[(t + 1) % 4];
  }
  EXPECT_EQ(e->expertUtilization()[0], used);

  // Decode (graph) statistics and a static top-k override for the step.
  int32_t na = 9, nb = 10;
  in[0].tokens = {&na, 1};
  in[1].tokens = {&nb, 1};
  in[0].expertsPerToken = in[1].expertsPerToken = 1;
  st = e->step(in, LogitsFor::LastTokenPerSequence, logits, &stats);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(logits[9], 1.0f); // experts_per_token
  EXPECT_EQ(logits[kV + 9], 1.0f);
  EXPECT_EQ(stats.expertCalls, (std::vector<int64_t>{2, 1}));

  // One override per step on CUDA; nothing changes on error.
  in[1].expertsPerToken = 2;
  st = e->step(in, LogitsFor::LastTokenPerSequence, logits, &stats);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("one override per step"), std::string::npos)
      << st.message();
  EXPECT_EQ(e->sequenceLength(*a), 6);
  EXPECT_EQ(e->sequenceLength(*b), 3);
  // Overrides above the model's k are rejected as on the CPU.
  in[0].expertsPerToken = in[1].expertsPerToken = 3;
  EXPECT_FALSE(e->step(in, LogitsFor::LastTokenPerSequence, logits).ok());
  EXPECT_TRUE(e->removeSequence(*a).ok());
  EXPECT_TRUE(e->removeSequence(*b).ok());

  // Capacity errors are the CPU backend's.
  std::vector<int32_t> seqs;
  for (int i = 0; i < 8; ++i) {
    StatusOr<int32_t> s = e->addSequence();
    ASSERT_TRUE(s.ok());
    seqs.push_back(*s);
  }
  StatusOr<int32_t> ninth = e->addSequence();
  ASSERT_FALSE(ninth.ok());
  EXPECT_NE(ninth.message().find("all 8 sequence slots are in use"),
            std::string::npos);
  std::vector<int32_t> tooLong(200, 1);
  st = stepOne(*e, seqs[0], tooLong, LogitsFor::LastTokenPerSequence, logits);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("exceed the context of 192"), std::string::npos)
      << st.message();
  for (int32_t s : seqs)
    EXPECT_TRUE(e->removeSequence(s).ok());
}

INSTANTIATE_TEST_SUITE_P(Drivers, CudaSmoke,
                         ::testing::Values("device", "fake"),
                         [](const auto &info) { return info.param; });

// ---------------------------------------------------------------------------
// Plans compiled for CUDA from the fixtures

constexpr double kCudaTol = 1e-3;  // * max(1, max |ref|)
constexpr double kBatchTol = 1e-5; // batched vs one at a time, relative

/// Each prompt alone: prefill, then its greedy tokens one step at a time.
struct SingleRun {
  std::vector<float> prefill;
  std::vector<std::vector<float>> decode;
};

std::vector<SingleRun> runOneAtATime(Engine &e,
                                     const std::vector<Prompt> &prompts) {
  const int64_t V = e.info().vocabSize;
  std::vector<SingleRun> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    StatusOr<int32_t> seq = e.addSequence();
    EXPECT_TRUE(seq.ok()) << seq.message();
    if (!seq)
      return {};
    Status s = stepOne(e, *seq, prompts[i].tokens, LogitsFor::AllTokens,
                       out[i].prefill);
    EXPECT_TRUE(s.ok()) << s.message();
    int32_t tok = argmax(
        out[i].prefill.data() + int64_t(prompts[i].tokens.size() - 1) * V, V);
    for (size_t st = 0; st < prompts[i].greedyTokens.size(); ++st) {
      tok = static_cast<int32_t>(prompts[i].greedyTokens[st]);
      std::vector<float> l;
      s = stepOne(e, *seq, {&tok, 1}, LogitsFor::LastTokenPerSequence, l);
      EXPECT_TRUE(s.ok()) << s.message();
      out[i].decode.push_back(std::move(l));
    }
    EXPECT_TRUE(e.removeSequence(*seq).ok());
  }
  return out;
}

class CudaFixture : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    NF_REQUIRE_GPU();
    plan_ = cudaPlan(GetParam());
    NF_REQUIRE_PLAN(plan_);
    engine_ = load(plan_, options("cuda", modelDir(GetParam())));
    ASSERT_NE(engine_, nullptr);
    ASSERT_EQ(engine_->info().backend, "cuda");
    ref_ = std::make_unique<RefFile>(modelDir(GetParam()) +
                                     "/reference.safetensors");
    prompts_ = loadPrompts(*ref_);
    ASSERT_FALSE(prompts_.empty());
    V_ = engine_->info().vocabSize;
  }

  /// One sequence per prompt with two samplers of params(i) (one draws
  /// from the lists, one from the rows), its prompt run, and its greedy
  /// token as the input of the next (decode) step.
  struct SampledSequences {
    std::vector<SequenceInput> in;
    std::vector<int32_t> seqs, next;
    std::vector<sampling::Sampler> fromTop, fromRow;
  };
  template <class Params>
  void startSampled(Params params, SampledSequences &s) {
    Engine &e = *engine_;
    const size_t n = prompts_.size();
    s.in.resize(n);
    s.next.resize(n);
    for (size_t i = 0; i < n; ++i) {
      StatusOr<int32_t> seq = e.addSequence();
      ASSERT_TRUE(seq.ok()) << seq.message();
      s.seqs.push_back(*seq);
      s.in[i].sequence = *seq;
      s.in[i].tokens = prompts_[i].tokens;
      const sampling::SamplerParams p = params(i);
      s.fromTop.push_back(*sampling::Sampler::create(p));
      s.fromRow.push_back(*sampling::Sampler::create(p));
    }
    std::vector<float> logits;
    ASSERT_TRUE(e.step(s.in, LogitsFor::LastTokenPerSequence, logits).ok());
    for (size_t i = 0; i < n; ++i) {
      s.next[i] = argmax(logits.data() + i * V_, V_);
      s.in[i].tokens = {&s.next[i], 1};
    }
  }

  std::string plan_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RefFile> ref_;
  std::vector<Prompt> prompts_;
  int64_t V_ = 0;
};

TEST_P(CudaFixture, PrefillAndGreedyMatchReference) {
  Engine &e = *engine_;
  double worstPrefill = 0, worstDecode = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const Prompt &p = prompts_[i];
    StatusOr<int32_t> seq = e.addSequence();
    ASSERT_TRUE(seq.ok()) << seq.message();
    const int64_t T = static_cast<int64_t>(p.tokens.size());
    std::vector<float> logits;
    Status s = stepOne(e, *seq, p.tokens, LogitsFor::AllTokens, logits);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(logits.size(), p.prefillLogits.size());
    ASSERT_EQ(e.sequenceLength(*seq), T);
    const double pe =
        relError(logits.data(), p.prefillLogits.data(), logits.size());
    worstPrefill = std::max(worstPrefill, pe);
    EXPECT_LE(pe, kCudaTol) << GetParam() << " p" << i << " prefill";
    int32_t tok = argmax(logits.data() + (T - 1) * V_, V_);
    double de = 0;
    for (size_t st = 0; st < p.greedyTokens.size(); ++st) {
      ASSERT_EQ(tok, p.greedyTokens[st])
          << GetParam() << " p" << i << " greedy step " << st;
      s = stepOne(e, *seq, {&tok, 1}, LogitsFor::LastTokenPerSequence, logits);
      ASSERT_TRUE(s.ok()) << s.message();
      ASSERT_EQ(logits.size(), size_t(V_));
      // pydoc-moe's reference has greedy tokens only.
      if (!p.greedyLogits.empty())
        de = std::max(
            de, relError(logits.data(), p.greedyLogits.data() + st * V_, V_));
      tok = argmax(logits.data(), V_);
    }
    worstDecode = std::max(worstDecode, de);
    EXPECT_LE(de, kCudaTol) << GetParam() << " p" << i << " greedy logits";
    ASSERT_TRUE(e.removeSequence(*seq).ok());
  }
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - t0)
                        .count();
  RecordProperty("worst_prefill", std::to_string(worstPrefill));
  RecordProperty("worst_decode", std::to_string(worstDecode));
  std::cout << "[ cuda ] " << GetParam() << ": worst rel err prefill "
            << worstPrefill << ", decode " << worstDecode << " ("
            << prompts_.size() << " prompts, " << ms << " ms; "
            << engine_->info().device << ")\n";
}

// All prompts (different lengths) in one prefill step, then decoded in
// lockstep, against one sequence at a time.
TEST_P(CudaFixture, BatchedEqualsOneAtATime) {
  Engine &e = *engine_;
  const std::vector<SingleRun> single = runOneAtATime(e, prompts_);
  ASSERT_EQ(single.size(), prompts_.size());
  const int n = static_cast<int>(prompts_.size());
  // A placeholder takes the first slot and some pages, then leaves.
  StatusOr<int32_t> dummy = e.addSequence();
  ASSERT_TRUE(dummy.ok());
  std::vector<int32_t> filler(37, 3);
  std::vector<float> logits;
  ASSERT_TRUE(
      stepOne(e, *dummy, filler, LogitsFor::LastTokenPerSequence, logits).ok());
  std::vector<int32_t> seqs(n);
  for (int i = n - 1; i >= 0; --i) {
    StatusOr<int32_t> s = e.addSequence();
    ASSERT_TRUE(s.ok()) << s.message();
    seqs[i] = *s;
  }
  ASSERT_TRUE(e.removeSequence(*dummy).ok());
  std::vector<SequenceInput> inputs(n);
  for (int i = 0; i < n; ++i) {
    inputs[i].sequence = seqs[i];
    inputs[i].tokens = prompts_[i].tokens;
  }
  Status s = e.step(inputs, LogitsFor::AllTokens, logits);
  ASSERT_TRUE(s.ok()) << s.message();
  double diff = 0, worst = 0;
  int64_t row = 0;
  for (int i = 0; i < n; ++i) {
    const float *rows = logits.data() + row * V_;
    const size_t count = prompts_[i].prefillLogits.size();
    ASSERT_EQ(single[i].prefill.size(), count);
    diff = std::max(diff, relError(rows, single[i].prefill.data(), count));
    worst = std::max(worst,
                     relError(rows, prompts_[i].prefillLogits.data(), count));
    row += static_cast<int64_t>(prompts_[i].tokens.size());
  }
  EXPECT_LE(diff, kBatchTol) << "batched prefill differs from one at a time";
  EXPECT_LE(worst, kCudaTol);
  const size_t S = prompts_[0].greedyTokens.size();
  std::vector<int32_t> next(n);
  double worstDecode = 0;
  for (size_t st = 0; st < S; ++st) {
    for (int i = 0; i < n; ++i) {
      next[i] = static_cast<int32_t>(prompts_[i].greedyTokens[st]);
      inputs[i].tokens = {&next[i], 1};
    }
    s = e.step(inputs, LogitsFor::LastTokenPerSequence, logits);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(logits.size(), size_t(n * V_));
    for (int i = 0; i < n; ++i) {
      const float *r = logits.data() + i * V_;
      diff = std::max(diff, relError(r, single[i].decode[st].data(), V_));
      if (!prompts_[i].greedyLogits.empty())
        worstDecode = std::max(
            worstDecode,
            relError(r, prompts_[i].greedyLogits.data() + st * V_, V_));
    }
  }
  EXPECT_LE(diff, kBatchTol) << "batched decode differs from one at a time";
  EXPECT_LE(worstDecode, kCudaTol);
  RecordProperty("batched_vs_single", std::to_string(diff));
  std::cout << "[ cuda ] " << GetParam()
            << " batched: max rel |batched - single| " << diff
            << (diff == 0 ? " (bit-identical)" : "")
            << ", worst rel err prefill " << worst << ", decode " << worstDecode
            << "\n";
  for (int i = 0; i < n; ++i)
    EXPECT_TRUE(e.removeSequence(seqs[i]).ok());
}

// More than 16 sequences decode through the "wide" variants of the decode
// linears (their own decode graph bucket); each sequence's logits must match
// its one-at-a-time decode on `single`, which ran the "narrow" variants, to
// rounding. Returns the largest relative difference (or -1: skipped).
double wideDecodeDifference(Engine &single, const std::string &plan,
                            const std::string &modelDir,
                            const std::vector<Prompt> &prompts) {
  constexpr int n = 24; // > 16: the wide bucket
  const int64_t V = single.info().vocabSize;
  EngineOptions o = options("cuda", modelDir);
  o.maxSequences = n;
  o.kvPages = 512;
  std::unique_ptr<Engine> wide = load(plan, o);
  EXPECT_NE(wide, nullptr);
  if (!wide)
    return -1;
  Engine &e = *wide;
  if (e.info().maxDecodeTokens < n)
    return -1;
  const std::vector<SingleRun> one = runOneAtATime(single, prompts);
  EXPECT_EQ(one.size(), prompts.size());
  if (one.size() != prompts.size())
    return -1;
  const size_t P = prompts.size();
  std::vector<int32_t> seqs(n);
  std::vector<SequenceInput> inputs(n);
  for (int i = 0; i < n; ++i) {
    StatusOr<int32_t> s = e.addSequence();
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s)
      return -1;
    seqs[i] = *s;
    inputs[i].sequence = seqs[i];
    inputs[i].tokens = prompts[i % P].tokens;
  }
  std::vector<float> logits;
  Status s = e.step(inputs, LogitsFor::LastTokenPerSequence, logits);
  EXPECT_TRUE(s.ok()) << s.message();
  size_t S = prompts[0].greedyTokens.size();
  for (const Prompt &p : prompts)
    S = std::min(S, p.greedyTokens.size());
  std::vector<int32_t> next(n);
  double diff = 0;
  for (size_t st = 0; s.ok() && st < S; ++st) {
    for (int i = 0; i < n; ++i) {
      next[i] = static_cast<int32_t>(prompts[i % P].greedyTokens[st]);
      inputs[i].tokens = {&next[i], 1};
    }
    s = e.step(inputs, LogitsFor::LastTokenPerSequence, logits);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok() || logits.size() != size_t(n * V)) {
      ADD_FAILURE() << "wide decode step " << st << " failed";
      return -1;
    }
    for (int i = 0; i < n; ++i)
      diff = std::max(diff, relError(logits.data() + i * V,
                                     one[i % P].decode[st].data(), V));
  }
  for (int i = 0; i < n; ++i)
    EXPECT_TRUE(e.removeSequence(seqs[i]).ok());
  return diff;
}

TEST_P(CudaFixture, WideDecodeBucketEqualsOneAtATime) {
  const double diff =
      wideDecodeDifference(*engine_, plan_, modelDir(GetParam()), prompts_);
  if (diff < 0 && !HasFailure())
    GTEST_SKIP() << "decode steps of fewer than 24 tokens";
  EXPECT_LE(diff, kBatchTol) << "wide decode differs from one at a time";
  std::cout << "[ cuda ] " << GetParam() << " wide decode (24 sequences): "
            << "max rel |batched - single| " << diff
            << (diff == 0 ? " (bit-identical)" : "") << "\n";
}

// The CPU backend on the same plan (it ignores the binaries) agrees.
TEST_P(CudaFixture, MatchesTheCpuBackend) {
  std::unique_ptr<Engine> cpu =
      load(plan_, options("cpu", modelDir(GetParam())));
  ASSERT_NE(cpu, nullptr);
  const std::vector<SingleRun> a = runOneAtATime(*engine_, prompts_);
  const std::vector<SingleRun> b = runOneAtATime(*cpu, prompts_);
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, relError(a[i].prefill.data(), b[i].prefill.data(),
                                     a[i].prefill.size()));
    for (size_t s = 0; s < a[i].decode.size(); ++s)
      worst = std::max(
          worst, relError(a[i].decode[s].data(), b[i].decode[s].data(), V_));
  }
  EXPECT_LE(worst, kCudaTol);
  std::cout << "[ cuda ] " << GetParam() << ": max rel |cuda - cpu| " << worst
            << "\n";
}

// Prompts longer than the chunked SSM scan's 256-token chunks (several
// chunks per sequence, walked in parallel from carried inits), two of them
// batched in one step with different lengths and chunk boundaries, then a
// few decode steps (which read the state the last chunk wrote): the CUDA
// logits must match the CPU backend's (sequential scan) per sequence.
TEST_P(CudaFixture, LongPromptsMatchTheCpuBackend) {
  std::unique_ptr<Engine> cpu =
      load(plan_, options("cpu", modelDir(GetParam())));
  ASSERT_NE(cpu, nullptr);
  std::vector<std::vector<int32_t>> prompts(2);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const size_t len = i == 0 ? 700 : 301;
    for (size_t k = 0; prompts[i].size() < len; ++k) {
      const Prompt &p = prompts_[(i + k) % prompts_.size()];
      for (int64_t t : p.tokens)
        if (prompts[i].size() < len)
          prompts[i].push_back(static_cast<int32_t>(t));
    }
  }
  double worst = 0;
  std::vector<std::vector<float>> got(2), want(2);
  std::vector<int32_t> ids[2];
  for (int which = 0; which < 2; ++which) {
    Engine &e = which == 0 ? *engine_ : *cpu;
    std::vector<SequenceInput> inputs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      StatusOr<int32_t> seq = e.addSequence();
      ASSERT_TRUE(seq.ok()) << seq.message();
      ids[which].push_back(*seq);
      inputs[i].sequence = *seq;
      inputs[i].tokens = prompts[i];
    }
    std::vector<float> &out = which == 0 ? got[0] : want[0];
    Status s = e.step(inputs, LogitsFor::AllTokens, out);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<int32_t> next(prompts.size());
    for (int st = 0; st < 3; ++st) {
      for (size_t i = 0; i < prompts.size(); ++i) {
        next[i] = prompts[i][static_cast<size_t>(st) * 7 % prompts[i].size()];
        inputs[i].tokens = {&next[i], 1};
      }
      std::vector<float> l;
      s = e.step(inputs, LogitsFor::LastTokenPerSequence, l);
      ASSERT_TRUE(s.ok()) << s.message();
      std::vector<float> &acc = which == 0 ? got[1] : want[1];
      acc.insert(acc.end(), l.begin(), l.end());
    }
    for (int32_t id : ids[which])
      EXPECT_TRUE(e.removeSequence(id).ok());
  }
  for (int k = 0; k < 2; ++k) {
    ASSERT_EQ(got[k].size(), want[k].size());
    const size_t rows = got[k].size() / static_cast<size_t>(V_);
    for (size_t r = 0; r < rows; ++r)
      worst = std::max(
          worst, relError(got[k].data() + r * V_, want[k].data() + r * V_, V_));
  }
  EXPECT_LE(worst, kCudaTol);
  std::cout << "[ cuda ] " << GetParam()
            << ": long prompts, max rel |cuda - cpu| " << worst << "\n";
}

// Decode through the captured graph == the same kernels launched one by one.
TEST_P(CudaFixture, GraphEqualsLaunches) {
  EngineOptions o = options("cuda", modelDir(GetParam()));
  o.cudaGraphs = false;
  std::unique_ptr<Engine> plain = load(plan_, o);
  ASSERT_NE(plain, nullptr);
  const std::vector<SingleRun> a = runOneAtATime(*engine_, prompts_);
  const std::vector<SingleRun> b = runOneAtATime(*plain, prompts_);
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t s = 0; s < a[i].decode.size(); ++s)
      worst = std::max(
          worst, relError(a[i].decode[s].data(), b[i].decode[s].data(), V_));
  EXPECT_LE(worst, kBatchTol);
  std::cout << "[ cuda ] " << GetParam() << ": graph vs launches " << worst
            << "\n";
}

// Decode steps asked for the top logits: each sequence's list is its row's
// largest values, ranked by value then id (the row read back after the
// step), and a greedy sampler draws the row's argmax from it.
TEST_P(CudaFixture, TopLogitsAreTheRowsLargest) {
  Engine &e = *engine_;
  ASSERT_EQ(e.info().topLogits, 64) << "plan without top-logits launches";
  std::vector<SequenceInput> in(prompts_.size());
  std::vector<int32_t> seqs;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    StatusOr<int32_t> seq = e.addSequence();
    ASSERT_TRUE(seq.ok()) << seq.message();
    seqs.push_back(*seq);
    in[i].sequence = *seq;
    in[i].tokens = prompts_[i].tokens;
  }
  std::vector<float> logits;
  TopLogits top;
  // A prefill step returns rows.
  ASSERT_TRUE(e.step(in, LogitsFor::LastTokenTop, logits, nullptr, &top).ok());
  EXPECT_EQ(top.k, 0);
  ASSERT_EQ(logits.size(), prompts_.size() * size_t(V_));
  std::vector<int32_t> next(prompts_.size());
  for (size_t i = 0; i < prompts_.size(); ++i) {
    next[i] = argmax(logits.data() + i * V_, V_);
    in[i].tokens = {&next[i], 1};
  }
  for (int stepNo = 0; stepNo < 3; ++stepNo) {
    ASSERT_TRUE(
        e.step(in, LogitsFor::LastTokenTop, logits, nullptr, &top).ok());
    ASSERT_EQ(top.k, 64);
    ASSERT_EQ(top.ids.size(), prompts_.size() * 64);
    std::vector<float> row(static_cast<size_t>(V_));
    for (size_t i = 0; i < prompts_.size(); ++i) {
      ASSERT_TRUE(e.lastTokenRow(i, row).ok());
      std::vector<int32_t> order(static_cast<size_t>(V_));
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
      });
      for (size_t j = 0; j < 64; ++j) {
        const bool listed = j < order.size();
        ASSERT_EQ(top.ids[i * 64 + j], listed ? order[j] : -1)
            << GetParam() << " sequence " << i << " rank " << j;
        if (listed)
          ASSERT_EQ(top.values[i * 64 + j], row[order[j]]);
      }
      next[i] = top.ids[i * 64];
      EXPECT_EQ(next[i], argmax(row.data(), V_));
    }
  }
  for (int32_t s : seqs)
    ASSERT_TRUE(e.removeSequence(s).ok());
}

// Decode steps whose lists are ranked by temperature samplers' noisy keys
// (one sequence greedy, by its logits): each list is the row ranked by
// float(logit / T + G) computed on the host, its values the logits, and the
// sampler draws from it what it draws from the row.
TEST_P(CudaFixture, NoisyTopListsDrawWhatTheRowDraws) {
  Engine &e = *engine_;
  ASSERT_TRUE(e.info().topLogitsNoise) << "plan before format 1.6";
  const size_t n = prompts_.size();
  SampledSequences ss;
  startSampled(
      [](size_t i) {
        sampling::SamplerParams p;
        p.temperature = i == 0 ? 0.0f : 0.5f + 0.4f * static_cast<float>(i);
        p.seed = 1000 + i;
        return p;
      },
      ss);
  if (HasFatalFailure())
    return;
  auto &[in, seqs, next, fromTop, fromRow] = ss;
  std::vector<float> logits;
  TopLogits top;
  std::vector<float> row(static_cast<size_t>(V_));
  for (int stepNo = 0; stepNo < 3; ++stepNo) {
    top.noise.clear();
    for (size_t i = 0; i < n; ++i) {
      const auto z = fromTop[i].noiseDraw();
      top.noise.push_back(z ? TopNoise{z->temperature, z->seed, z->draw, true}
                            : TopNoise{});
    }
    ASSERT_TRUE(
        e.step(in, LogitsFor::LastTokenTop, logits, nullptr, &top).ok());
    ASSERT_EQ(top.k, 64);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(e.lastTokenRow(i, row).ok());
      const TopNoise z = top.noise[i];
      std::vector<float> key(row);
      if (z.keys)
        for (size_t t = 0; t < key.size(); ++t)
          if (!std::isnan(row[t]))
            key[t] = static_cast<float>(
                static_cast<double>(row[t]) /
                    static_cast<double>(z.temperature) +
                sampling::gumbelNoise(z.seed, z.draw,
                                      static_cast<uint32_t>(t)));
      std::vector<int32_t> order;
      for (int32_t t = 0; t < V_; ++t)
        if (!std::isnan(key[static_cast<size_t>(t)]))
          order.push_back(t);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return key[a] > key[b] || (key[a] == key[b] && a < b);
      });
      for (size_t j = 0; j < 64; ++j) {
        const bool listed = j < order.size();
        ASSERT_EQ(top.ids[i * 64 + j], listed ? order[j] : -1)
            << GetParam() << " sequence " << i << " rank " << j;
        if (listed)
          ASSERT_EQ(top.values[i * 64 + j], row[order[j]]);
      }
      StatusOr<std::optional<int32_t>> t = fromTop[i].sampleTop(
          std::span<const int32_t>(top.ids.data() + i * 64, 64),
          std::span<const float>(top.values.data() + i * 64, 64), V_, z.keys);
      ASSERT_TRUE(t.ok()) << t.message();
      ASSERT_TRUE(t->has_value()) << "a list that could not decide";
      StatusOr<int32_t> want = fromRow[i].sample(row);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(**t, *want) << GetParam() << " sequence " << i;
      next[i] = **t;
    }
  }
  for (int32_t s : seqs)
    ASSERT_TRUE(e.removeSequence(s).ok());
}

// Decode steps whose lists come with the rows' totals (top-p samplers at
// several temperatures, one sequence without): each total is the host's
// sum of exp((x - max) / T) over the row read back, to 1e-12 relative, and
// a top-p sampler draws from the list what it draws from the row.
TEST_P(CudaFixture, TopListsCarryTheRowTotals) {
  Engine &e = *engine_;
  ASSERT_TRUE(e.info().topLogitsTotals) << "plan without totals";
  const size_t n = prompts_.size();
  SampledSequences ss;
  startSampled(
      [](size_t i) {
        sampling::SamplerParams p;
        p.temperature = 0.3f + 0.3f * static_cast<float>(i);
        p.topP = i == 0 ? 1.0f : 0.5f + 0.1f * static_cast<float>(i % 5);
        p.seed = 77 + i;
        return p;
      },
      ss);
  if (HasFatalFailure())
    return;
  auto &[in, seqs, next, fromTop, fromRow] = ss;
  std::vector<float> logits;
  TopLogits top;
  std::vector<float> row(static_cast<size_t>(V_));
  int fromLists = 0;
  for (int stepNo = 0; stepNo < 3; ++stepNo) {
    top.noise.clear();
    for (size_t i = 0; i < n; ++i) {
      TopNoise z;
      z.temperature = fromTop[i].params().temperature;
      z.total = fromTop[i].needsRowTotal();
      top.noise.push_back(z);
    }
    ASSERT_TRUE(
        e.step(in, LogitsFor::LastTokenTop, logits, nullptr, &top).ok());
    ASSERT_EQ(top.k, 64);
    ASSERT_EQ(top.totals.size(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(e.lastTokenRow(i, row).ok());
      if (!top.noise[i].total) {
        EXPECT_TRUE(std::isnan(top.totals[i]));
      } else {
        float m = -std::numeric_limits<float>::infinity();
        for (float v : row)
          m = v > m ? v : m;
        double want = 0.0;
        for (float v : row)
          if (v > -std::numeric_limits<float>::infinity())
            want +=
                std::exp((static_cast<double>(v) - m) *
                         (1.0 / static_cast<double>(top.noise[i].temperature)));
        EXPECT_NEAR(top.totals[i], want, 1e-12 * want)
            << GetParam() << " sequence " << i;
      }
      StatusOr<std::optional<int32_t>> t = fromTop[i].sampleTop(
          std::span<const int32_t>(top.ids.data() + i * 64, 64),
          std::span<const float>(top.values.data() + i * 64, 64), V_, false,
          top.totals[i]);
      ASSERT_TRUE(t.ok()) << t.message();
      fromLists += t->has_value() ? 1 : 0;
      const int32_t got = t->has_value() ? **t : *fromTop[i].sample(row);
      StatusOr<int32_t> want = fromRow[i].sample(row);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(got, *want) << GetParam() << " sequence " << i;
      next[i] = got;
    }
  }
  std::cout << "[ cuda ] " << GetParam() << ": top-p drawn from the lists "
            << fromLists << " of " << 3 * n << " times\n";
  for (int32_t s : seqs)
    ASSERT_TRUE(e.removeSequence(s).ok());
}

// One sampler for two entries of a batch (nf_decode_sample): the second
// entry's list was ranked for the draw the first one consumed, so it must
// draw from its row; the tokens are those of drawing one entry after the
// other from the rows (nf_decode, nf_sample).
TEST_P(CudaFixture, CApiSamplerSharedByTwoEntriesDrawsInTurn) {
  nf_model_params p = nf_model_default_params();
  p.backend = "cuda";
  const std::string dir = modelDir(GetParam());
  p.weights_dir = dir.c_str();
  nf_model *a = nullptr, *b = nullptr;
  ASSERT_EQ(nf_model_load(plan_.c_str(), &p, &a), NF_OK) << nf_last_error();
  ASSERT_EQ(nf_model_load(plan_.c_str(), &p, &b), NF_OK) << nf_last_error();
  nf_sampler_params sp = nf_sampler_default_params();
  sp.temperature = 0.9f;
  sp.seed = 21;
  nf_sampler *sa = nullptr, *sb = nullptr;
  ASSERT_EQ(nf_sampler_create(&sp, &sa), NF_OK);
  ASSERT_EQ(nf_sampler_create(&sp, &sb), NF_OK);
  nf_seq_input ia[2] = {}, ib[2] = {};
  int32_t ta[2] = {prompts_.front().tokens[0], prompts_.back().tokens[0]};
  int32_t tb[2] = {ta[0], ta[1]};
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(nf_seq_add(a, &ia[i].seq_id), NF_OK);
    ASSERT_EQ(nf_seq_add(b, &ib[i].seq_id), NF_OK);
    ia[i].tokens = &ta[i];
    ib[i].tokens = &tb[i];
    ia[i].n_tokens = ib[i].n_tokens = 1;
  }
  nf_batch ba = {ia, 2, nullptr}, bb = {ib, 2, nullptr};
  nf_sampler *const both[2] = {sa, sa};
  std::vector<float> logits(2 * static_cast<size_t>(V_));
  for (int step = 0; step < 4; ++step) {
    int32_t got[2];
    ASSERT_EQ(nf_decode_sample(a, &ba, both, got), NF_OK) << nf_last_error();
    ASSERT_EQ(nf_decode(b, &bb, logits.data(), logits.size(), 0), NF_OK)
        << nf_last_error();
    for (int i = 0; i < 2; ++i) {
      const int32_t want =
          nf_sample(sb, logits.data() + i * V_, static_cast<int32_t>(V_));
      ASSERT_GE(want, 0) << nf_last_error();
      EXPECT_EQ(got[i], want)
          << GetParam() << " step " << step << " entry " << i;
      ta[i] = got[i];
      tb[i] = want;
    }
  }
  nf_sampler_free(sa);
  nf_sampler_free(sb);
  nf_model_free(a);
  nf_model_free(b);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFixture,
                         ::testing::Values("tiny-hybrid", "tiny-hybrid-bf16",
                                           "tiny-nano", "tiny-dense",
                                           "tiny-latent", "pydoc-moe"),
                         [](const auto &info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// pydoc-moe compiled with --matmul-inputs=bf16 (pydoc-moe-bf16): decode
// steps of more than 16 tokens read the bf16 copies of their GEMM inputs
// (the wide skinny variants), shorter ones the f32 rows; both round them the
// same way. Rounding inputs to bf16 can turn a 1e-7 difference between step
// sizes (exact plans: kBatchTol) into another expert choice (0.061 relative
// on the plans of 2026-12-01, bench/results/2026-12-01b), so the bound is
// loose: it catches copies that are stale, misplaced or never written
// (logits of another token, differences of order 1), not rounding.
// pydoc-moe-bf16-sm4: the same plan with grids sized for 4 SMs
// (NF_CUDA_SM_COUNT=4), whose layers then take the variants that only
// Nano-sized layers take on 132 SMs (items of 32 rows, 4-warp blocks).
constexpr double kBf16BatchTol = 0.2;
class CudaBf16Plans : public ::testing::TestWithParam<const char *> {};
TEST_P(CudaBf16Plans, WideDecodeMatchesOneAtATime) {
  NF_REQUIRE_GPU();
  const std::string plan = cudaPlan(GetParam());
  NF_REQUIRE_PLAN(plan);
  const std::string dir = modelDir("pydoc-moe");
  std::unique_ptr<Engine> single = load(plan, options("cuda", dir));
  ASSERT_NE(single, nullptr);
  RefFile ref(dir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  ASSERT_FALSE(prompts.empty());
  const double diff = wideDecodeDifference(*single, plan, dir, prompts);
  ASSERT_GE(diff, 0) << "the plan decodes fewer than 24 sequences at once";
  EXPECT_LE(diff, kBf16BatchTol) << "wide decode differs from one at a time";
  std::cout << "[ cuda ] " << GetParam()
            << " wide decode (24 sequences): max rel "
            << "|batched - single| " << diff
            << (diff == 0 ? " (bit-identical)" : "") << "\n";
}
INSTANTIATE_TEST_SUITE_P(PydocMoe, CudaBf16Plans,
                         ::testing::Values("pydoc-moe-bf16",
                                           "pydoc-moe-bf16-sm4"),
                         [](const auto &info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// Steps split into runs of 16 tokens / 2 sequences (tiny-hybrid-small).
TEST(CudaPlans, SmallArenaMatchesLargeArena) {
  NF_REQUIRE_GPU();
  const std::string small = cudaPlan("tiny-hybrid-small"),
                    large = cudaPlan("tiny-hybrid");
  NF_REQUIRE_PLAN(small);
  NF_REQUIRE_PLAN(large);
  const std::string dir = modelDir("tiny-hybrid");
  std::unique_ptr<Engine> a = load(small, options("cuda", dir));
  std::unique_ptr<Engine> b = load(large, options("cuda", dir));
  ASSERT_TRUE(a && b);
  RefFile ref(dir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  const int64_t V = a->info().vocabSize;
  // Every prompt at once (more than 16 tokens and 2 sequences), then decode.
  std::vector<float> la, lb;
  std::vector<int32_t> sa, sb;
  std::vector<SequenceInput> ia, ib;
  for (const Prompt &p : prompts) {
    sa.push_back(*a->addSequence());
    sb.push_back(*b->addSequence());
    SequenceInput in;
    in.tokens = p.tokens;
    in.sequence = sa.back();
    ia.push_back(in);
    in.sequence = sb.back();
    ib.push_back(in);
  }
  ASSERT_TRUE(a->step(ia, LogitsFor::AllTokens, la).ok());
  ASSERT_TRUE(b->step(ib, LogitsFor::AllTokens, lb).ok());
  ASSERT_EQ(la.size(), lb.size());
  double worst = relError(la.data(), lb.data(), la.size());
  std::vector<int32_t> next(prompts.size());
  for (size_t st = 0; st < prompts[0].greedyTokens.size(); ++st) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      next[i] = static_cast<int32_t>(prompts[i].greedyTokens[st]);
      ia[i].tokens = ib[i].tokens = {&next[i], 1};
    }
    ASSERT_TRUE(a->step(ia, LogitsFor::LastTokenPerSequence, la).ok());
    ASSERT_TRUE(b->step(ib, LogitsFor::LastTokenPerSequence, lb).ok());
    worst = std::max(worst, relError(la.data(), lb.data(), la.size()));
    for (size_t i = 0; i < prompts.size(); ++i)
      ASSERT_LE(relError(la.data() + i * V,
                         prompts[i].greedyLogits.data() + st * V, V),
                kCudaTol);
  }
  EXPECT_LE(worst, kBatchTol);
  std::cout << "[ cuda ] small arena vs large: " << worst << "\n";
}

// pydoc-moe (budget policy, default budget 1.0 = static top-4): expert calls
// of a batched prefill and of decode steps, and a budget of 0.5 spent as on
// the CPU.
TEST(CudaPlans, PydocExpertCalls) {
  NF_REQUIRE_GPU();
  const std::string plan = cudaPlan("pydoc-moe");
  NF_REQUIRE_PLAN(plan);
  const std::string dir = modelDir("pydoc-moe");
  std::unique_ptr<Engine> gpu = load(plan, options("cuda", dir));
  std::unique_ptr<Engine> cpu = load(plan, options("cpu", dir));
  ASSERT_TRUE(gpu && cpu);
  if (!gpu->info().expertStats)
    GTEST_SKIP() << "expert statistics unavailable on this plan";
  RefFile ref(dir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  const int64_t layers = gpu->info().numMoeLayers, k = gpu->info().topK;
  std::vector<SequenceInput> in(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    in[i].sequence = *gpu->addSequence();
    in[i].tokens = prompts[i].tokens;
  }
  std::vector<float> logits;
  StepStats stats;
  Status s = gpu->step(in, LogitsFor::LastTokenPerSequence, logits, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<int32_t> next(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(stats.expertCalls[i],
              int64_t(prompts[i].tokens.size()) * layers * k)
        << "p" << i;
    next[i] = argmax(logits.data() + i * gpu->info().vocabSize,
                     gpu->info().vocabSize);
    in[i].tokens = {&next[i], 1};
  }
  s = gpu->step(in, LogitsFor::LastTokenPerSequence, logits, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(stats.expertCalls[i], layers * k) << "p" << i;
  for (const SequenceInput &x : in)
    ASSERT_TRUE(gpu->removeSequence(x.sequence).ok());

  // Half the budget: the same calls as the CPU's scheduler.
  for (float budget : {0.5f, 0.25f}) {
    StepStats sg, sc;
    std::vector<float> lg, lc;
    SequenceInput a;
    a.tokens = prompts[0].tokens;
    a.expertBudget = budget;
    a.sequence = *gpu->addSequence();
    ASSERT_TRUE(gpu->step({&a, 1}, LogitsFor::AllTokens, lg, &sg).ok());
    ASSERT_TRUE(gpu->removeSequence(a.sequence).ok());
    a.sequence = *cpu->addSequence();
    ASSERT_TRUE(cpu->step({&a, 1}, LogitsFor::AllTokens, lc, &sc).ok());
    ASSERT_TRUE(cpu->removeSequence(a.sequence).ok());
    EXPECT_EQ(sg.expertCalls, sc.expertCalls) << "budget " << budget;
    EXPECT_EQ(sg.expertCallsPerLayer, sc.expertCallsPerLayer);
    std::cout << "[ cuda ] pydoc-moe budget " << budget << ": "
              << sg.expertCalls[0] << " expert calls (CPU " << sc.expertCalls[0]
              << "), max rel |cuda - cpu| logits "
              << relError(lg.data(), lc.data(), lg.size()) << "\n";
  }
}

// The step budget scope and the distinct-expert cap on the device (moe_budget
// in prefill, moe_route's last block in decode): the same experts as the
// CPU backend's decision on the same plan, step after step, and logits
// within the backends' tolerance.
TEST(CudaPlans, StepWideSelectionMatchesTheCpu) {
  NF_REQUIRE_GPU();
  const std::string plan = cudaPlan("pydoc-moe");
  NF_REQUIRE_PLAN(plan);
  const std::string dir = modelDir("pydoc-moe");
  RefFile ref(dir + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  ASSERT_GE(prompts.size(), 2u);
  struct Policy {
    bool step;
    double cap;
  };
  for (const Policy policy : {Policy{true, 0.0}, Policy{false, 0.5},
                              Policy{true, 0.5}, Policy{true, 5.0}}) {
    const std::string what = std::string(policy.step ? "step" : "request") +
                             " scope, cap " + std::to_string(policy.cap);
    EngineOptions og = options("cuda", dir), oc = options("cpu", dir);
    og.budgetStepScope = oc.budgetStepScope = policy.step;
    og.distinctExpertCap = oc.distinctExpertCap = policy.cap;
    std::unique_ptr<Engine> gpu = load(plan, og);
    std::unique_ptr<Engine> cpu = load(plan, oc);
    ASSERT_TRUE(gpu && cpu) << what;
    if (!gpu->info().expertStats)
      GTEST_SKIP() << "expert statistics unavailable on this plan";
    // Sequences at different budgets: a prefill step of all prompts, then
    // decode steps of one token each, fed the CPU's greedy tokens.
    const size_t n = prompts.size();
    std::vector<SequenceInput> ig(n), ic(n);
    for (size_t i = 0; i < n; ++i) {
      ig[i].sequence = *gpu->addSequence();
      ic[i].sequence = *cpu->addSequence();
      ig[i].tokens = ic[i].tokens = prompts[i].tokens;
      ig[i].expertBudget = ic[i].expertBudget = i % 2 ? 0.5f : 0.75f;
    }
    std::vector<int32_t> next(n);
    for (int step = 0; step < 4; ++step) {
      std::vector<float> lg, lc;
      StepStats sg, sc;
      Status s = gpu->step(ig, LogitsFor::LastTokenPerSequence, lg, &sg);
      ASSERT_TRUE(s.ok()) << what << ": " << s.message();
      s = cpu->step(ic, LogitsFor::LastTokenPerSequence, lc, &sc);
      ASSERT_TRUE(s.ok()) << what << ": " << s.message();
      EXPECT_EQ(sg.expertCallsPerLayer, sc.expertCallsPerLayer)
          << what << ", step " << step;
      EXPECT_EQ(gpu->expertUtilization(), cpu->expertUtilization())
          << what << ", step " << step << ": different experts";
      EXPECT_LE(relError(lg.data(), lc.data(), lg.size()), kCudaTol)
          << what << ", step " << step;
      const int32_t V = cpu->info().vocabSize;
      for (size_t i = 0; i < n; ++i) {
        next[i] = argmax(lc.data() + i * V, V);
        ig[i].tokens = ic[i].tokens = {&next[i], 1};
      }
    }
  }
  // Plans whose selection is static top-k have no budget decision to pool.
  const std::string topk = cudaPlan("tiny-hybrid-topk");
  if (!std::filesystem::exists(topk))
    return;
  EngineOptions o = options("cuda", modelDir("tiny-hybrid"));
  o.budgetStepScope = true;
  StatusOr<std::unique_ptr<Engine>> e = Engine::load(topk, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("--expert-policy=budget"), std::string::npos)
      << e.message();
}

// MoE statistics and the static top-k override on a "topk" plan.
TEST(CudaPlans, ExpertStatisticsAndOverride) {
  NF_REQUIRE_GPU();
  const std::string plan = cudaPlan("tiny-hybrid-topk");
  NF_REQUIRE_PLAN(plan);
  const std::string dir = modelDir("tiny-hybrid");
  std::unique_ptr<Engine> gpu = load(plan, options("cuda", dir));
  std::unique_ptr<Engine> cpu = load(plan, options("cpu", dir));
  ASSERT_TRUE(gpu && cpu);
  const ModelInfo &info = gpu->info();
  ASSERT_GT(info.topK, 1);
  const int64_t layers = info.numMoeLayers;
  std::vector<int32_t> toks = {1, 5, 9, 13, 17, 21, 25, 29};
  for (int32_t k : {0, 1}) {
    std::vector<float> lg, lc;
    StepStats sg, sc;
    const int32_t g = *gpu->addSequence(), c = *cpu->addSequence();
    ASSERT_TRUE(stepOne(*gpu, g, toks, LogitsFor::AllTokens, lg, &sg, k).ok());
    ASSERT_TRUE(stepOne(*cpu, c, toks, LogitsFor::AllTokens, lc, &sc, k).ok());
    EXPECT_LE(relError(lg.data(), lc.data(), lg.size()), kCudaTol)
        << "experts per token " << k;
    const int64_t want =
        static_cast<int64_t>(toks.size()) * (k > 0 ? k : info.topK) * layers;
    EXPECT_EQ(sc.expertCalls[0], want);
    if (info.expertStats)
      EXPECT_EQ(sg.expertCalls[0], want) << "experts per token " << k;
    else
      std::cout << "[ cuda ] expert statistics unavailable on this plan "
                   "(select results stay inside kernels)\n";
    ASSERT_TRUE(gpu->removeSequence(g).ok());
    ASSERT_TRUE(cpu->removeSequence(c).ok());
  }
  // Mixed overrides in one step are rejected before anything runs.
  const int32_t a = *gpu->addSequence(), b = *gpu->addSequence();
  std::vector<SequenceInput> in(2);
  in[0].sequence = a;
  in[0].tokens = toks;
  in[0].expertsPerToken = 1;
  in[1].sequence = b;
  in[1].tokens = toks;
  std::vector<float> logits;
  Status s = gpu->step(in, LogitsFor::LastTokenPerSequence, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("one override per step"), std::string::npos);
  EXPECT_EQ(gpu->sequenceLength(a), 0);
}

} // namespace
