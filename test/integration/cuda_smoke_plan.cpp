// The synthetic plans of cuda_smoke_plan.h.
#include "cuda_smoke_plan.h"

#include "nf/plan_generated.h"
#include "nf/plan_version.h"

#include "TestUtil.h"

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace nf::test::gpu {

namespace pl = nf::plan;

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

namespace {

float embedValue(int64_t v, int64_t h) {
  return static_cast<float>((v * kH + h) % 7 - 3) * 0.5f;
}
float headValue(int64_t v, int64_t h) {
  return static_cast<float>((v * 3 + h) % 5 - 2);
}

/// w.safetensors: "embed" and "head", f32 [32, 8]; with `quantised`, the
/// codes and scales of "q4" and "q8" (SmokeSpec::quantisedWeights).
void writeSmokeWeights(const std::string &dir, bool quantised) {
  nlohmann::json header;
  const uint64_t n = kV * kH * 4;
  header["embed"] = {
      {"dtype", "F32"}, {"shape", {kV, kH}}, {"data_offsets", {0, n}}};
  header["head"] = {
      {"dtype", "F32"}, {"shape", {kV, kH}}, {"data_offsets", {n, 2 * n}}};
  // q4.weight [4, 16] i32 words (4 x 128 codes), q4.weight_scale [4, 4]
  // f32 (groups of 32), q8.weight [4, 128] e4m3 codes, q8.weight_scale
  // [4, 1] f32.
  const uint64_t q = 2 * n;
  if (quantised) {
    header["q4.weight"] = {
        {"dtype", "I32"}, {"shape", {4, 16}}, {"data_offsets", {q, q + 256}}};
    header["q4.weight_scale"] = {{"dtype", "F32"},
                                 {"shape", {4, 4}},
                                 {"data_offsets", {q + 256, q + 320}}};
    header["q8.weight"] = {{"dtype", "F8_E4M3"},
                           {"shape", {4, 128}},
                           {"data_offsets", {q + 320, q + 832}}};
    header["q8.weight_scale"] = {{"dtype", "F32"},
                                 {"shape", {4, 1}},
                                 {"data_offsets", {q + 832, q + 848}}};
  }
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
  if (quantised) {
    std::vector<uint32_t> words(64);
    std::vector<float> scales(16);
    for (size_t i = 0; i < words.size(); ++i)
      words[i] = 0x01234567u * static_cast<uint32_t>(i + 1);
    for (size_t i = 0; i < scales.size(); ++i)
      scales[i] = 0.25f * static_cast<float>(i + 1);
    bytes.append(reinterpret_cast<const char *>(words.data()),
                 4 * words.size());
    bytes.append(reinterpret_cast<const char *>(scales.data()),
                 4 * scales.size());
    for (int i = 0; i < 512; ++i)
      bytes.push_back(static_cast<char>(0x30 + i % 16)); // finite E4M3 codes
    const float rowScales[4] = {0.5f, 1.0f, 2.0f, 4.0f};
    bytes.append(reinterpret_cast<const char *>(rowScales), sizeof rowScales);
  }
  test::writeFile(dir + "/w.safetensors", bytes);
}

} // namespace

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

/// Writes <dir>/<name>.nfb (and the weights) and returns its path.
std::string writeSmokePlan(const std::string &dir, const std::string &name,
                           const SmokeSpec &spec) {
  writeSmokeWeights(dir, spec.quantisedWeights);
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
  if (spec.quantisedWeights) {
    std::vector<int64_t> shape = {4, 128};
    for (const bool int4 : {true, false}) {
      const std::string t = int4 ? "q4.weight" : "q8.weight";
      std::vector<Offset<flatbuffers::String>> names = {b.CreateString(t)},
                                               scales = {b.CreateString(
                                                   t + "_scale")};
      auto q = pl::CreateWeightQuantDirect(
          b, int4 ? pl::QuantScheme::Int4 : pl::QuantScheme::Fp8E4M3,
          int4 ? 8 : 1,
          int4 ? pl::QuantGranularity::PerGroup
               : pl::QuantGranularity::PerChannel,
          int4 ? 32 : 0, &scales);
      weights.push_back(pl::CreateWeightDirect(
          b, &names, false, nullptr, int4 ? pl::DType::I32 : pl::DType::F8E4M3,
          &shape, q));
    }
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

} // namespace nf::test::gpu
