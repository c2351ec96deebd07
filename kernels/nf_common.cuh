// Device helpers shared by the kernels nfc generates (compiled ahead of time
// with NVRTC: no system headers, nothing but nf_abi.h).
//
// Conventions of every template in kernels/*.cuh:
//   - the generated __global__ function takes the step's arguments (and in
//     prefill the arena's base, nf_abi.h), passes them on as `nf::Step a`,
//     and passes the template typed pointers it computes from compile-time
//     arena offsets, weight indices and storage indices (see nf_abi.h);
//   - activations are f32 (i32 for ids and counts), weights are f32, bf16 or
//     f16 (nf::bf16 / nf::f16 hold the raw bits) and every sum accumulates in
//     f32 (f64 where the CPU reference does);
//   - work is covered with grid-stride loops over what a->num_tokens and
//     a->num_seqs say, so one fixed launch shape serves every batch size.
#ifndef NF_KERNELS_COMMON_CUH
#define NF_KERNELS_COMMON_CUH

#include "nf_abi.h"

namespace nf {

struct bf16 {
  unsigned short bits;
};
struct f16 {
  unsigned short bits;
};
/// A quantised weight's FP8 E4M3 code (OCP "fn": no infinities, NaN at
/// 0x7f / 0xff); its value is the code times its row's scale
/// (weight_row_scales).
struct fp8e4m3 {
  unsigned char bits;
};
/// Eight int4 codes of a quantised weight (nf_linear_int4.cuh): code i in
/// bits 4i..4i+3, stored as code + 8; a weight's value is its code times its
/// group's scale.
struct int4x8 {
  unsigned bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) {
  return __uint_as_float(static_cast<unsigned>(v.bits) << 16);
}
__device__ __forceinline__ float half_bits_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ float to_float(f16 v) {
  return half_bits_to_float(v.bits);
}
/// An E4M3 code as f32, exactly: its exponent and mantissa bits placed in
/// an f32 whose exponent is 120 short (subnormal codes land on f32
/// subnormals of the same bits), then scaled by 2^120.
__device__ __forceinline__ float fp8_e4m3_to_f32(unsigned code) {
  const unsigned em = code & 0x7fu;
  const float v = em == 0x7fu ? __int_as_float(0x7fc00000)
                              : __uint_as_float(em << 20) * 0x1p120f;
  return __uint_as_float(__float_as_uint(v) | ((code & 0x80u) << 24));
}
__device__ __forceinline__ float to_float(fp8e4m3 v) {
  return fp8_e4m3_to_f32(v.bits);
}

/// Element i of a weight (any dtype) as f32.
template <class T>
__device__ __forceinline__ float load(const T *p, long long i) {
  return to_float(p[i]);
}

/// Elements per 16-byte vector.
template <class T> struct Vec16 { static constexpr int N = 16 / sizeof(T); };

__device__ __forceinline__ void unpack_bf16x2(unsigned w, float *out) {
  out[0] = __uint_as_float(w << 16);
  out[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack_f16x2(unsigned w, float *out) {
  out[0] = half_bits_to_float(static_cast<unsigned short>(w & 0xffffu));
  out[1] = half_bits_to_float(static_cast<unsigned short>(w >> 16));
}

/// 16 bytes at p (16-byte aligned) as Vec16<T>::N floats.
__device__ __forceinline__ void load16(const float *p, float *out) {
  const float4 v = __ldg(reinterpret_cast<const float4 *>(p));
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}
/// Eight bf16 values (16 bytes) as floats.
__device__ __forceinline__ void unpack_bf16x8(uint4 v, float *out) {
  unpack_bf16x2(v.x, out);
  unpack_bf16x2(v.y, out + 2);
  unpack_bf16x2(v.z, out + 4);
  unpack_bf16x2(v.w, out + 6);
}
__device__ __forceinline__ void load16(const bf16 *p, float *out) {
  unpack_bf16x8(__ldg(reinterpret_cast<const uint4 *>(p)), out);
}
__device__ __forceinline__ void load16(const f16 *p, float *out) {
  const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
  unpack_f16x2(v.x, out);
  unpack_f16x2(v.y, out + 2);
  unpack_f16x2(v.z, out + 4);
  unpack_f16x2(v.w, out + 6);
}
/// Two E4M3 codes (bytes `sel` of w: 0x1404 bytes 0 and 1, 0x3424 bytes 2
/// and 3) as bf16x2 bits, the lower byte in the lower half, exactly: each
/// code's sign, exponent and mantissa bits placed in a bf16 whose exponent
/// is 120 short (subnormal codes land on bf16 subnormals of the same bits),
/// then scaled by 2^120 (fma.rn.bf16x2 keeps subnormals; -0 addend: zeros
/// keep their sign). The NaN codes 0x7f / 0xff come out as +-480, not NaN
/// (quantisers never write them). Before sm_80 (no bf16 arithmetic):
/// through fp8_e4m3_to_f32.
__device__ __forceinline__ unsigned fp8x2_to_bf16x2(unsigned w, unsigned sel) {
  const unsigned h = __byte_perm(w, 0u, sel); // each half: code << 8
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  const unsigned bits = (h & 0x80008000u) | ((h >> 4) & 0x07f007f0u);
  unsigned r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;"
      : "=r"(r)
      : "r"(bits), "r"(0x7b807b80u), "r"(0x80008000u));
  return r;
#else
  return (__float_as_uint(fp8_e4m3_to_f32((h >> 8) & 0xffu)) >> 16) |
         (__float_as_uint(fp8_e4m3_to_f32(h >> 24)) & 0xffff0000u);
#endif
}
/// Four E4M3 codes (one word, the lowest byte first) as two bf16x2 words.
__device__ __forceinline__ uint2 fp8x4_to_bf16x4(unsigned w) {
  return make_uint2(fp8x2_to_bf16x2(w, 0x1404u), fp8x2_to_bf16x2(w, 0x3424u));
}
/// Four E4M3 codes (one word, the lowest byte first) as floats, exactly.
/// From sm_89, by the hardware conversion to f16x2 (cvt.rn.f16x2.e4m3x2:
/// every code is an f16 value; NaN codes stay NaN) and f16 -> f32: two
/// conversions and four widenings, against fp8x4_to_bf16x4's eight bit
/// operations, two bf16 FMAs and four unpacks.
__device__ __forceinline__ void fp8x4_to_f32x4(unsigned w, float *out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned lo, hi;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
  unpack_f16x2(lo, out);
  unpack_f16x2(hi, out + 2);
#else
  const uint2 b = fp8x4_to_bf16x4(w);
  unpack_bf16x2(b.x, out);
  unpack_bf16x2(b.y, out + 2);
#endif
}
/// v rounded to the nearest E4M3 value, ties to even, |v| <= 448 (the CPU
/// backend's roundToE4M3, operation for operation: every step is exact).
__device__ __forceinline__ float round_to_e4m3(float v) {
  const float m = fabsf(v);
  if (!(m > 0.0f))
    return v; // zeros (and NaN) stay
  int e;
  frexpf(m, &e); // m = f * 2^e, f in [0.5, 1): unit exponent e - 1
  const int shift = max(e - 1, -6) - 3; // 3 mantissa bits, subnormals 2^-9
  return copysignf(fminf(ldexpf(rintf(ldexpf(m, -shift)), shift), 448.0f), v);
}
/// The E4M3 code of r, an E4M3 value (round_to_e4m3's; NaN: 0x7f), as the
/// CPU backend's e4m3Code gives it.
__device__ __forceinline__ unsigned e4m3_code(float r) {
  if (r != r)
    return 0x7fu;
  const unsigned sign = signbit(r) ? 0x80u : 0u;
  const float m = fabsf(r);
  if (m == 0.0f)
    return sign;
  int e;
  frexpf(m, &e);  // m = f * 2^e, f in [0.5, 1): unit exponent e - 1
  if (e - 1 < -6) // subnormal: mantissa * 2^-9
    return sign | static_cast<unsigned>(ldexpf(m, 9));
  const unsigned mant = static_cast<unsigned>(ldexpf(m, -(e - 1)) * 8.0f) - 8u;
  return sign | (static_cast<unsigned>(e - 1 + 7) << 3) | mant;
}

__device__ __forceinline__ void load16(const fp8e4m3 *p, float *out) {
  const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
  fp8x4_to_f32x4(v.x, out);
  fp8x4_to_f32x4(v.y, out + 4);
  fp8x4_to_f32x4(v.z, out + 8);
  fp8x4_to_f32x4(v.w, out + 12);
}

/// Four consecutive elements at p (aligned to 4 elements) as floats.
__device__ __forceinline__ void load4(const float *p, float *out) {
  load16(p, out);
}
__device__ __forceinline__ void load4(const bf16 *p, float *out) {
  const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
  unpack_bf16x2(v.x, out);
  unpack_bf16x2(v.y, out + 2);
}
__device__ __forceinline__ void load4(const f16 *p, float *out) {
  const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
  unpack_f16x2(v.x, out);
  unpack_f16x2(v.y, out + 2);
}
__device__ __forceinline__ void load4(const fp8e4m3 *p, float *out) {
  fp8x4_to_f32x4(__ldg(reinterpret_cast<const unsigned *>(p)), out);
}

/// Activation rows (f32, written by earlier kernels: plain loads).
__device__ __forceinline__ void load4_act(const float *p, float *out) {
  const float4 v = *reinterpret_cast<const float4 *>(p);
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

/// x rounded to the nearest bf16, ties to even (NaN: the canonical 0x7fff).
__device__ __forceinline__ unsigned short f32_to_bf16_rn(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // No cvt to bf16 before sm_80 (KV caches of bf16 on older targets).
  const unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return 0x7fffu;
  return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#else
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
#endif
}
__device__ __forceinline__ float bf16_bits_to_f32(unsigned short h) {
  return __uint_as_float(static_cast<unsigned>(h) << 16);
}

/// Activations stored as bf16 rows (unsigned short: the bits; with bf16
/// matmul inputs, rows that only GEMMs read are stored rounded, as their
/// GEMMs would round them) or f32. 4 elements at p (8- / 16-byte aligned).
__device__ __forceinline__ void load4_act(const unsigned short *p, float *out) {
  const uint2 v = *reinterpret_cast<const uint2 *>(p);
  unpack_bf16x2(v.x, out);
  unpack_bf16x2(v.y, out + 2);
}
__device__ __forceinline__ void store_act(float *p, float v) { *p = v; }
__device__ __forceinline__ void store_act(unsigned short *p, float v) {
  *p = f32_to_bf16_rn(v);
}
/// p[0] = v0, p[1] = v1 in one store (p 8- or 4-byte aligned).
__device__ __forceinline__ void store_act2(float *p, float v0, float v1) {
  *reinterpret_cast<float2 *>(p) = make_float2(v0, v1);
}
__device__ __forceinline__ void store_act2(unsigned short *p, float v0,
                                           float v1) {
  *reinterpret_cast<unsigned *>(p) =
      static_cast<unsigned>(f32_to_bf16_rn(v0)) |
      (static_cast<unsigned>(f32_to_bf16_rn(v1)) << 16);
}

/// p[0..3] = v in one store (p 16- or 8-byte aligned).
__device__ __forceinline__ void store_act4(float *p, float4 v) {
  *reinterpret_cast<float4 *>(p) = v;
}
__device__ __forceinline__ void store_act4(unsigned short *p, float4 v) {
  *reinterpret_cast<uint2 *>(p) =
      make_uint2(static_cast<unsigned>(f32_to_bf16_rn(v.x)) |
                     (static_cast<unsigned>(f32_to_bf16_rn(v.y)) << 16),
                 static_cast<unsigned>(f32_to_bf16_rn(v.z)) |
                     (static_cast<unsigned>(f32_to_bf16_rn(v.w)) << 16));
}

/// Decode rows stored as f32 with a bf16 copy (rounded as a one-term
/// skinny GEMM rounds its input): the wide skinny variants (steps of more
/// than a plan's narrow token count) read the copy, half the activation
/// bytes through L2; every other reader the f32 rows. Producers store
/// through it as through a pointer (store_act*, + offset); the copy is
/// written only in the steps whose GEMMs read it (bf16 null otherwise).
struct ShadowedRows {
  float *f32;
  unsigned short *bf16;
};
/// The rows at f32 and, in steps of more than NARROW tokens, their copy.
template <int NARROW>
__device__ __forceinline__ ShadowedRows shadowed_rows(int step_tokens,
                                                      float *f32,
                                                      unsigned short *bf16) {
  return {f32, step_tokens > NARROW ? bf16 : nullptr};
}
__device__ __forceinline__ ShadowedRows operator+(ShadowedRows p, long long i) {
  return {p.f32 + i, p.bf16 ? p.bf16 + i : nullptr};
}
__device__ __forceinline__ void store_act(ShadowedRows p, float v) {
  *p.f32 = v;
  if (p.bf16)
    store_act(p.bf16, v);
}
__device__ __forceinline__ void store_act2(ShadowedRows p, float v0, float v1) {
  store_act2(p.f32, v0, v1);
  if (p.bf16)
    store_act2(p.bf16, v0, v1);
}
__device__ __forceinline__ void store_act4(ShadowedRows p, float4 v) {
  store_act4(p.f32, v);
  if (p.bf16)
    store_act4(p.bf16, v);
}

// ---------------------------------------------------------------------------
// mbarriers in shared memory (sm_90 for try_wait): the pipelines of the
// warp-specialised GEMM (nf_wgmma.cuh) and of the TMA linears (nf_tma.cuh).
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count)
               : "memory");
}
/// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
  asm volatile("{\n.reg .b64 state;\n"
               "mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
               : "memory");
}

// ---------------------------------------------------------------------------
// Programmatic dependent launch (sm_90+): a generated function waits until
// the grids it depends on have completed and their writes are visible
// before it reads anything they wrote; it lets the next launch begin either
// when its work is done (prefill: the next launch's set-up overlaps this
// grid's tail; letting it begin earlier parks its blocks on the SMs while
// this large grid runs, measured slower) or right after its own wait
// (decode: the next launch's blocks take SM room as this grid's blocks
// retire and fetch their weights meanwhile; see skinny_linear). Repeated
// calls have no further effect. Without a programmatic launch both are
// no-ops.
__device__ __forceinline__ void wait_for_previous_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// 16 bytes of a weight stream, read once per launch: not kept in L1 (where
/// it would evict the activation rows that every K step re-reads).
__device__ __forceinline__ uint4 load_stream16(const void *p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
/// 8 bytes, likewise.
__device__ __forceinline__ uint2 load_stream8(const void *p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
               : "=r"(v.x), "=r"(v.y)
               : "l"(p));
  return v;
}

/// Asks L2 to fetch [p, p + bytes) (16-byte aligned, a multiple of 16) in
/// 64 KiB pieces spread over the blocks of a launch (or of its slice of a
/// co-launch): cp.async.bulk.prefetch on sm_90, nothing elsewhere. For
/// bytes a later launch reads, fetched while the GPU's memory would
/// otherwise idle (a chain of latency-bound launches).
__device__ __forceinline__ void prefetch_l2(int block, int blocks,
                                            const void *p, long long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr long long kPiece = 64 * 1024;
  if (threadIdx.x != 0)
    return;
  const char *base = static_cast<const char *>(p);
  for (long long off = block * kPiece; off < bytes; off += blocks * kPiece) {
    const unsigned n = static_cast<unsigned>(min(kPiece, bytes - off));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off),
                 "r"(n)
                 : "memory");
  }
#else
  (void)block, (void)blocks, (void)p, (void)bytes;
#endif
}

// ---------------------------------------------------------------------------
// Asynchronous global -> shared copies (sm_80+: cp.async, so a block stages
// its next chunk while it computes on the current one; older targets copy
// synchronously). `src` must be BYTES-aligned.
template <int BYTES>
__device__ __forceinline__ void copy_async(void *dst, const void *src) {
  static_assert(BYTES == 4 || BYTES == 16, "cp.async copies 4 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (BYTES == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(src)
                 : "memory");
#else
  if (BYTES == 16)
    *static_cast<float4 *>(dst) = *static_cast<const float4 *>(src);
  else
    *static_cast<float *>(dst) = *static_cast<const float *>(src);
#endif
}
/// 16 bytes from src, or zeros when `valid` is false (src is then not read).
/// kL1: through L1 (cp.async.ca), for data that other warps of the SM read
/// again, such as activation rows; otherwise L2 only (cp.async.cg).
template <bool kL1 = false>
__device__ __forceinline__ void copy_async16_or_zero(void *dst, const void *src,
                                                     bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (kL1)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(s),
                 "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s),
                 "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
#else
  *static_cast<float4 *>(dst) =
      valid ? *static_cast<const float4 *>(src) : make_float4(0, 0, 0, 0);
#endif
}
/// Ends the group of copies issued since the last commit.
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
/// Waits until at most PENDING committed groups are still in flight (this
/// thread's copies; a __syncthreads makes everyone's visible).
template <int PENDING> __device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
#endif
}

// ---------------------------------------------------------------------------
// Thread block clusters (sm_90): the kernel declares its cluster size
// (__cluster_dims__), so its launch needs no attribute.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/// This block's rank in its cluster, the cluster's index in the grid and
/// the grid's number of clusters (x only: the generated grids are 1-D).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_index() {
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_count() {
  unsigned r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}
/// Every thread of the cluster's blocks arrives; shared-memory writes
/// before it are visible to reads after it in every block (release /
/// acquire).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
               "barrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}
/// The 16 bytes at `p` (this block's shared memory) in block `rank`'s
/// shared memory.
__device__ __forceinline__ float4 cluster_load4(const float *p, unsigned rank) {
  unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p)), remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(local), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
#endif

/// Whether a linear's spec S has a row context (S::kRowCtx): a value
/// S::row_ctx(a, r) that S::store(a, ctx, r, n, v) uses, which a GEMM
/// epilogue computes once per row instead of once per element (a K/V
/// append's page-table lookups).
template <class S, class = void> struct HasRowCtx {
  static constexpr bool value = false;
};
template <class S> struct HasRowCtx<S, decltype(void(S::kRowCtx))> {
  static constexpr bool value = S::kRowCtx;
};

/// Whether a linear's spec S has S::store2(a, r, n, v0, v1): the outputs
/// (r, n) and (r, n + 1) for an even n, n + 1 < N, in one store (GEMM
/// epilogues whose fragments hold column pairs use it).
template <class S, class = void> struct HasStore2 {
  static constexpr bool value = false;
};
template <class S> struct HasStore2<S, decltype(void(S::kStore2))> {
  static constexpr bool value = S::kStore2;
};

/// Whether a linear's spec S has FP8 codes that a GEMM may widen to bf16 as
/// it loads them (S::kCodesOnLoad: S::codes(a, g), group g's N x K codes;
/// S::weight then names their widened copy, for kernels that read bf16).
template <class S, class = void> struct HasCodesOnLoad {
  static constexpr bool value = false;
};
template <class S> struct HasCodesOnLoad<S, decltype(void(S::kCodesOnLoad))> {
  static constexpr bool value = S::kCodesOnLoad;
};

/// Whether a linear's spec S reads rows already stored as bf16 (S::kRowsBf16:
/// S::row16 is the only row accessor, and there is no f32 S::row).
template <class S, class = void> struct HasRowsBf16 {
  static constexpr bool value = false;
};
template <class S> struct HasRowsBf16<S, decltype(void(S::kRowsBf16))> {
  static constexpr bool value = S::kRowsBf16;
};

// ---------------------------------------------------------------------------
// Step arguments

/// What every generated function hands its templates: the step's arguments
/// (device memory: they change from step to step) and, in prefill
/// functions, the arena's base (their second kernel parameter, nf_abi.h;
/// null in decode functions). A per-module __constant__ copy of the base
/// was tried too: each module's copy falls out of L2 between decode steps
/// while the weights stream through it.
///
/// A generated function may run two independent ops side by side, each on
/// its own slice of the launch's blocks (a co-launch: decode's shared
/// expert next to the routing chain, EmitSharedExpert.cpp). Templates that
/// can be co-launched index blocks through block() and grid(): the slice
/// [block0, block0 + blocks) of the grid, or all of it (blocks 0).
struct Step {
  const nf_step_args *args;
  char *arena;
  int block0 = 0, blocks = 0;
  __device__ __forceinline__ const nf_step_args *operator->() const {
    return args;
  }
  __device__ __forceinline__ int block() const {
    return static_cast<int>(blockIdx.x) - block0;
  }
  __device__ __forceinline__ int grid() const {
    return blocks ? blocks : static_cast<int>(gridDim.x);
  }
};

/// A pointer into the arena. Prefill functions take the arena's base as a
/// kernel parameter (Step::arena); decode functions, whose module defines
/// NF_ARENA_FROM_ARGS, read args->arena at each use. Measured on the H200
/// (Nano shape, bf16 inputs): the parameter makes 8K prefill 7% faster (the
/// SSM scan 1.8x: a known base lets the compiler keep its addresses) but
/// batch-1 decode 7% slower, which neither minimum-blocks launch bounds on
/// the decode linears (their registers grew 78 -> 128) nor an empty asm on
/// the base at each use recovered (bench/results/2026-11-30c/README.md).
template <class T>
__device__ __forceinline__ T *arena(Step a, long long offset) {
#ifdef NF_ARENA_FROM_ARGS
  return reinterpret_cast<T *>(a->arena + offset);
#else
  return reinterpret_cast<T *>(a.arena + offset);
#endif
}
template <class T>
__device__ __forceinline__ const T *weight(Step a, int index) {
  return static_cast<const T *>(a->weights[index]);
}
/// A quantised weight's f32 scale per output row ([E, N] for stacked
/// experts; int4: per group of each row, [E, N, K / group]): where the
/// runtime puts them, after its codes (code_bytes) at the next 256-byte
/// boundary.
__device__ __forceinline__ const float *
weight_row_scales(Step a, int index, long long code_bytes) {
  return reinterpret_cast<const float *>(weight<unsigned char>(a, index) +
                                         (code_bytes + 255) / 256 * 256);
}

/// A linear over a quantised weight (S::kRowScales, S::row_scales(a, g): the
/// f32 scale of each of group g's N output features): its products are
/// summed over the codes and each sum multiplied by its feature's scale
/// before S::store (the CPU sums products with the dequantised weights: the
/// same sum up to f32 rounding).
template <class S, class = void> struct HasRowScales {
  static constexpr bool value = false;
};
template <class S> struct HasRowScales<S, decltype(void(S::kRowScales))> {
  static constexpr bool value = S::kRowScales;
};
template <class S>
__device__ __forceinline__ float scaled_output(Step a, int g, int n, float v) {
  if constexpr (HasRowScales<S>::value)
    return v * S::row_scales(a, g)[n];
  else
    return v;
}

__device__ __forceinline__ float *storage(Step a, int index) {
  return static_cast<float *>(a->storage[index]);
}

/// Sequence of row t and the row's position in it.
struct TokenPos {
  int seq;
  nf_seq_desc desc;
  int local; // t - desc.begin
  int pos;   // desc.start_pos + local
};
/// Row r of the LM head's rows: the r-th row whose logits the runtime reads.
__device__ __forceinline__ int logit_row(Step a, int r) {
  return a->logit_rows ? a->logit_rows[r] : r;
}
__device__ __forceinline__ TokenPos token_pos(Step a, int t) {
  TokenPos p;
  p.seq = a->token_seq[t];
  p.desc = a->seqs[p.seq];
  p.local = t - p.desc.begin;
  p.pos = p.desc.start_pos + p.local;
  return p;
}

// ---------------------------------------------------------------------------
// Work distribution

__device__ __forceinline__ long long global_thread() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long grid_threads() {
  return static_cast<long long>(gridDim.x) * blockDim.x;
}
__device__ __forceinline__ long long global_warp() {
  return global_thread() >> 5;
}
__device__ __forceinline__ long long grid_warps() {
  return grid_threads() >> 5;
}
/// Warps of a co-launchable template's slice of the grid (Step::block()).
__device__ __forceinline__ long long global_warp(Step a) {
  return (static_cast<long long>(a.block()) * blockDim.x + threadIdx.x) >> 5;
}
__device__ __forceinline__ long long grid_warps(Step a) {
  return (static_cast<long long>(a.grid()) * blockDim.x) >> 5;
}
__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }

// ---------------------------------------------------------------------------
// Reductions

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ int warp_sum(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024) in a fixed
/// order (deterministic); every thread gets the result. Contains
/// __syncthreads: call from all threads.
template <class T> __device__ __forceinline__ T block_sum(T v) {
  __shared__ T s_part[32];
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads();
  if (lane_id() == 0)
    s_part[warp] = v;
  __syncthreads();
  T total = T(0);
  for (int w = 0; w < nwarps; ++w)
    total += s_part[w];
  return total;
}

/// Exclusive prefix sum over the block in thread order; `total` gets the sum.
/// Contains __syncthreads: call from all threads.
__device__ __forceinline__ int block_exclusive_scan(int v, int &total) {
  __shared__ int s_warp[32];
  const int lane = lane_id(), warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o)
      incl += u;
  }
  __syncthreads();
  if (lane == 31)
    s_warp[warp] = incl;
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < nwarps; ++w) {
    if (w < warp)
      before += s_warp[w];
    total += s_warp[w];
  }
  return before + incl - v;
}

// ---------------------------------------------------------------------------
// Elementwise functions (the same formulas as the CPU backend)

enum Activation { kActNone = 0, kActRelu2 = 1, kActSilu = 2 };

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

template <int A> __device__ __forceinline__ float activate(float x) {
  if (A == kActRelu2) {
    const float r = x > 0.0f ? x : 0.0f;
    return r * r;
  }
  if (A == kActSilu)
    return silu(x);
  return x;
}

__device__ __forceinline__ float f32_inf() {
  return __int_as_float(0x7f800000);
}
__device__ __forceinline__ double f64_inf() {
  return __longlong_as_double(0x7ff0000000000000ll);
}

} // namespace nf

#endif // NF_KERNELS_COMMON_CUH
