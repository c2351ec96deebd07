// The paged KV cache (nf_kv.append): what it stores and where.
//
// Storage (runtime-allocated): K and V each [num_pages, PS, NKV, HD] of the
// plan's KV type (`--kv-cache-dtype`): f32, bf16, or E4M3 codes with an f32
// scale per (position, kv head) row (kv_e4m3: a page's codes, then its
// scales); logical page j of sequence s is physical page
// a->page_tables[s * a->max_pages_per_seq + j]. Kernels take the cache's
// pointer type (KVP: float *, bf16 *, kv_e4m3) and read it through kv_get /
// kv_get2 / kv_get4 at the offsets kv_position_offset gives (values,
// whatever their bytes).
#ifndef NF_KERNELS_KV_CACHE_CUH
#define NF_KERNELS_KV_CACHE_CUH

#include "nf_common.cuh"

namespace nf {

/// A KV cache's storage (nf::storage, f32 words) as its element type.
template <class KV> __device__ __forceinline__ KV *kv_cache(float *storage) {
  return reinterpret_cast<KV *>(storage);
}

/// An fp8 KV cache as a pointer to value `at`: page p holds the E4M3 codes of
/// its PS positions' rows (PS * ROW bytes, values in the order of an f32
/// cache's page), then the f32 scale of each (position, kv head) row of HD
/// values (PS * ROW / HD floats; the row's value is code * scale, the scale
/// its max |x| / 448, as the CPU backend's fp8 cache).
template <int ROW, int PS, int HD> struct kv_e4m3 {
  static constexpr long long kCodes = static_cast<long long>(PS) * ROW;
  static constexpr long long kPage = kCodes + 4LL * PS * (ROW / HD);
  static_assert(ROW % HD == 0 && HD % 4 == 0 && kPage % 16 == 0,
                "rows of whole heads, pages of 16-byte multiples");
  unsigned char *base;
  long long at;
  __device__ __forceinline__ kv_e4m3 operator+(long long i) const {
    return {base, at + i};
  }
  /// Value e's page, and its place among the page's codes.
  __device__ __forceinline__ unsigned char *page(long long e) const {
    return base + e / kCodes * kPage;
  }
  __device__ __forceinline__ float *scale(long long e) const {
    return reinterpret_cast<float *>(page(e) + kCodes) + e % kCodes / HD;
  }
  __device__ __forceinline__ unsigned char *code(long long e) const {
    return page(e) + e % kCodes;
  }
};
template <int ROW, int PS, int HD>
__device__ __forceinline__ kv_e4m3<ROW, PS, HD> kv_cache_e4m3(float *storage) {
  return {reinterpret_cast<unsigned char *>(storage), 0};
}

/// A tiered KV cache (--kv-hot-window) as a pointer to value `at`: storage
/// units of an fp8 page's bytes (kv_e4m3's kPage); a page-table entry is
/// unit * 2 + hot. A hot page holds the bf16 values of its PS positions in
/// its unit and the next (2 * PS * ROW bytes), a cold one kv_e4m3's page of
/// codes and row scales in its unit. Steps write hot pages only.
template <int ROW, int PS, int HD> struct kv_tiered {
  static constexpr long long kCodes = kv_e4m3<ROW, PS, HD>::kCodes;
  static constexpr long long kUnit = kv_e4m3<ROW, PS, HD>::kPage;
  unsigned char *base;
  long long at;
  __device__ __forceinline__ kv_tiered operator+(long long i) const {
    return {base, at + i};
  }
  __device__ __forceinline__ bool hot(long long e) const {
    return (e / kCodes) & 1;
  }
  __device__ __forceinline__ unsigned char *unit(long long e) const {
    return base + (e / kCodes >> 1) * kUnit;
  }
  __device__ __forceinline__ bf16 *value(long long e) const {
    return reinterpret_cast<bf16 *>(unit(e)) + e % kCodes;
  }
  __device__ __forceinline__ unsigned char *code(long long e) const {
    return unit(e) + e % kCodes;
  }
  __device__ __forceinline__ float *scale(long long e) const {
    return reinterpret_cast<float *>(unit(e) + kCodes) + e % kCodes / HD;
  }
};
template <int ROW, int PS, int HD>
__device__ __forceinline__ kv_tiered<ROW, PS, HD>
kv_cache_tiered(float *storage) {
  return {reinterpret_cast<unsigned char *>(storage), 0};
}

/// How a kernel stages a cache's rows: Tile, the type of its values in
/// shared memory; kBytes, whether those are the cache's own bytes (copied
/// as they are, cp.async) or widened from it (fp8).
template <class KVP> struct KvTraits;
template <> struct KvTraits<float *> {
  using Tile = float;
  static constexpr bool kBytes = true;
};
template <> struct KvTraits<const float *> : KvTraits<float *> {};
template <> struct KvTraits<bf16 *> {
  using Tile = bf16;
  static constexpr bool kBytes = true;
};
template <> struct KvTraits<const bf16 *> : KvTraits<bf16 *> {};
template <int ROW, int PS, int HD> struct KvTraits<kv_e4m3<ROW, PS, HD>> {
  using Tile = float;
  static constexpr bool kBytes = false;
};
template <int ROW, int PS, int HD>
struct KvTraits<kv_tiered<ROW, PS, HD>> : KvTraits<kv_e4m3<ROW, PS, HD>> {};
/// Stores v as the cache holds it: f32, or bf16 rounded to nearest even
/// (what the CPU backend's KvStorage::BF16 keeps).
__device__ __forceinline__ void kv_put(float *c, long long i, float v) {
  c[i] = v;
}
__device__ __forceinline__ void kv_put(bf16 *c, long long i, float v) {
  c[i].bits = f32_to_bf16_rn(v);
}
__device__ __forceinline__ void kv_put(float *p, float v) { *p = v; }
__device__ __forceinline__ void kv_put(bf16 *p, float v) {
  p->bits = f32_to_bf16_rn(v);
}
/// Element i of a cache as f32 (bf16 widens exactly).
__device__ __forceinline__ float kv_get(const float *c, long long i) {
  return c[i];
}
__device__ __forceinline__ float kv_get(const bf16 *c, long long i) {
  return to_float(c[i]);
}
/// Elements i, i + 1 (i even): one 8- or 4-byte load.
__device__ __forceinline__ float2 kv_get2(const float *c, long long i) {
  return *reinterpret_cast<const float2 *>(c + i);
}
__device__ __forceinline__ float2 kv_get2(const bf16 *c, long long i) {
  float f[2];
  unpack_bf16x2(*reinterpret_cast<const unsigned *>(c + i), f);
  return make_float2(f[0], f[1]);
}
template <int ROW, int PS, int HD>
__device__ __forceinline__ float kv_get(const kv_e4m3<ROW, PS, HD> &c,
                                        long long i) {
  const long long e = c.at + i;
  return fp8_e4m3_to_f32(*c.code(e)) * *c.scale(e);
}
template <int ROW, int PS, int HD>
__device__ __forceinline__ float2 kv_get2(const kv_e4m3<ROW, PS, HD> &c,
                                          long long i) {
  const long long e = c.at + i;
  const unsigned w = *reinterpret_cast<const unsigned short *>(c.code(e));
  const float s = *c.scale(e);
  float f[4];
  fp8x4_to_f32x4(w, f);
  return make_float2(f[0] * s, f[1] * s);
}
/// Elements i .. i + 3 (i a multiple of 4): one 16- or 8-byte load (fp8:
/// 4 bytes and the row's scale).
template <int ROW, int PS, int HD>
__device__ __forceinline__ float4 kv_get4(const kv_e4m3<ROW, PS, HD> &c,
                                          long long i) {
  const long long e = c.at + i;
  const unsigned w = *reinterpret_cast<const unsigned *>(c.code(e));
  const float s = *c.scale(e);
  float f[4];
  fp8x4_to_f32x4(w, f);
  return make_float4(f[0] * s, f[1] * s, f[2] * s, f[3] * s);
}
__device__ __forceinline__ float4 kv_get4(const float *c, long long i) {
  return *reinterpret_cast<const float4 *>(c + i);
}
__device__ __forceinline__ float4 kv_get4(const bf16 *c, long long i) {
  const uint2 u = *reinterpret_cast<const uint2 *>(c + i);
  float f[4];
  unpack_bf16x2(u.x, f);
  unpack_bf16x2(u.y, f + 2);
  return make_float4(f[0], f[1], f[2], f[3]);
}

template <int ROW, int PS, int HD>
__device__ __forceinline__ float kv_get(const kv_tiered<ROW, PS, HD> &c,
                                        long long i) {
  const long long e = c.at + i;
  if (c.hot(e))
    return to_float(*c.value(e));
  return fp8_e4m3_to_f32(*c.code(e)) * *c.scale(e);
}
template <int ROW, int PS, int HD>
__device__ __forceinline__ float2 kv_get2(const kv_tiered<ROW, PS, HD> &c,
                                          long long i) {
  const long long e = c.at + i;
  float f[4];
  if (c.hot(e)) {
    unpack_bf16x2(*reinterpret_cast<const unsigned *>(c.value(e)), f);
    return make_float2(f[0], f[1]);
  }
  const float s = *c.scale(e);
  fp8x4_to_f32x4(*reinterpret_cast<const unsigned short *>(c.code(e)), f);
  return make_float2(f[0] * s, f[1] * s);
}
template <int ROW, int PS, int HD>
__device__ __forceinline__ float4 kv_get4(const kv_tiered<ROW, PS, HD> &c,
                                          long long i) {
  const long long e = c.at + i;
  float f[4];
  if (c.hot(e)) {
    const uint2 u = *reinterpret_cast<const uint2 *>(c.value(e));
    unpack_bf16x2(u.x, f);
    unpack_bf16x2(u.y, f + 2);
    return make_float4(f[0], f[1], f[2], f[3]);
  }
  const float s = *c.scale(e);
  fp8x4_to_f32x4(*reinterpret_cast<const unsigned *>(c.code(e)), f);
  return make_float4(f[0] * s, f[1] * s, f[2] * s, f[3] * s);
}

/// Element offset of position p's cache row, pt the sequence's page table.
template <int ROW, int PS>
__device__ __forceinline__ long long kv_position_offset(const int32_t *pt,
                                                        int p) {
  return (static_cast<long long>(pt[p / PS]) * PS + p % PS) * ROW;
}

/// Element offset of row t's cache row (position start_pos + local).
template <int ROW, int PS>
__device__ __forceinline__ long long kv_row_offset(Step a, int t) {
  const TokenPos tp = token_pos(a, t);
  return kv_position_offset<ROW, PS>(
      a->page_tables + static_cast<long long>(tp.seq) * a->max_pages_per_seq,
      tp.pos);
}

/// Writes the step's K/V rows ([T, ROW] each) at their positions.
template <int ROW, int PS, class KV>
__device__ void kv_append(Step a, const float *k, const float *v, KV *kcache,
                          KV *vcache) {
  const long long n = static_cast<long long>(a->num_tokens) * ROW;
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    const int t = static_cast<int>(i / ROW), c = static_cast<int>(i % ROW);
    const long long off = kv_row_offset<ROW, PS>(a, t) + c;
    kv_put(kcache, off, k[i]);
    kv_put(vcache, off, v[i]);
  }
}

/// kv_append into fp8 caches: a warp per (token, kv head, K or V) row of HD
/// values; its scale is the row's max |x| / 448 (1 for a row of zeros or a
/// non-finite max), each code x / scale clamped to +-448 and rounded to the
/// nearest E4M3 value, ties to even: the CPU backend's fp8 cache, operation
/// for operation.
template <int ROW, int PS, int HD>
__device__ void kv_append_e4m3(Step a, const float *k, const float *v,
                               kv_e4m3<ROW, PS, HD> kcache,
                               kv_e4m3<ROW, PS, HD> vcache) {
  constexpr int NKV = ROW / HD;
  const int lane = lane_id();
  const long long rows = static_cast<long long>(a->num_tokens) * NKV * 2;
  for (long long r = global_warp(); r < rows; r += grid_warps()) {
    const bool isV = r & 1;
    const int t = static_cast<int>(r / (2 * NKV));
    const int h = static_cast<int>(r / 2 % NKV);
    const float *x = (isV ? v : k) + static_cast<long long>(t) * ROW + h * HD;
    const kv_e4m3<ROW, PS, HD> &c = isV ? vcache : kcache;
    const long long e = kv_row_offset<ROW, PS>(a, t) + h * HD;
    float amax = 0.0f;
    for (int d = lane; d < HD; d += 32)
      amax = fmaxf(amax, fabsf(x[d])); // NaN ignored, as std::max keeps amax
    amax = warp_max(amax);
    const float scale =
        amax > 0.0f && isfinite(amax) ? __fdiv_rn(amax, 448.0f) : 1.0f;
    unsigned char *codes = c.code(e);
    for (int d = lane; d < HD; d += 32) {
      float q = __fdiv_rn(x[d], scale);
      q = q < -448.0f ? -448.0f : q > 448.0f ? 448.0f : q; // NaN stays
      codes[d] = static_cast<unsigned char>(e4m3_code(round_to_e4m3(q)));
    }
    if (lane == 0)
      *c.scale(e) = scale;
  }
}

/// kv_append into a tiered cache. First the step's moves (the host's
/// Caches::compress, nf_step_args.kv_moves): each turns a hot page, bf16 in
/// units from and from + 1, into a cold one in unit `to` (from itself, or a
/// free unit), a block per (move, K or V): the page is staged in shared
/// memory before any code is written, since the codes may overwrite it; a
/// warp per (position, kv head) row quantises as kv_append_e4m3 does. Then
/// the step's rows, bf16, into their (hot) pages. The moves and the rows
/// touch different units, so neither waits for the other.
template <int ROW, int PS, int HD>
__device__ void kv_append_tiered(Step a, const float *k, const float *v,
                                 kv_tiered<ROW, PS, HD> kcache,
                                 kv_tiered<ROW, PS, HD> vcache) {
  using Cache = kv_tiered<ROW, PS, HD>;
  constexpr long long kCodes = Cache::kCodes;
  constexpr int kRows = PS * (ROW / HD);
  __shared__ unsigned short page[kCodes];
  const int lane = lane_id(), warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int item = blockIdx.x; item < 2 * a->num_kv_moves; item += gridDim.x) {
    const Cache &c = item & 1 ? vcache : kcache;
    const long long from = a->kv_moves[item & ~1];
    const long long to = a->kv_moves[(item & ~1) + 1];
    const unsigned short *src =
        reinterpret_cast<const unsigned short *>(c.base + from * Cache::kUnit);
    for (long long i = threadIdx.x; i < kCodes; i += blockDim.x)
      page[i] = src[i];
    __syncthreads();
    unsigned char *codes = c.base + to * Cache::kUnit;
    float *scales = reinterpret_cast<float *>(codes + kCodes);
    for (int r = warp; r < kRows; r += warps) {
      const unsigned short *x = page + static_cast<long long>(r) * HD;
      float amax = 0.0f;
      for (int d = lane; d < HD; d += 32)
        amax = fmaxf(amax, fabsf(bf16_bits_to_f32(x[d])));
      amax = warp_max(amax);
      const float scale =
          amax > 0.0f && isfinite(amax) ? __fdiv_rn(amax, 448.0f) : 1.0f;
      for (int d = lane; d < HD; d += 32) {
        float q = __fdiv_rn(bf16_bits_to_f32(x[d]), scale);
        q = q < -448.0f ? -448.0f : q > 448.0f ? 448.0f : q; // NaN stays
        codes[static_cast<long long>(r) * HD + d] =
            static_cast<unsigned char>(e4m3_code(round_to_e4m3(q)));
      }
      if (lane == 0)
        scales[r] = scale;
    }
    __syncthreads();
  }
  const long long n = static_cast<long long>(a->num_tokens) * ROW;
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    const int t = static_cast<int>(i / ROW), c = static_cast<int>(i % ROW);
    const long long e = kv_row_offset<ROW, PS>(a, t) + c;
    kcache.value(e)->bits = f32_to_bf16_rn(k[i]);
    vcache.value(e)->bits = f32_to_bf16_rn(v[i]);
  }
}

} // namespace nf

#endif // NF_KERNELS_KV_CACHE_CUH
