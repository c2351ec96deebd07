// Hopper (sm_90a) GEMM tiles on warpgroup MMA (wgmma): prefill linears with
// bf16 weights, after the activation rows were split into TERMS bf16 planes
// (split_rows_bf16). Same contract as pipelined_mma_tile (nf_linear_gemm.cuh):
// 128 x 128 outputs of group g, rows [row0, row0 + rows), features
// [n0, n0 + 128), 256 threads, dynamic shared memory wgmma_gemm_smem<TERMS>().
//
// Each of the two warpgroups owns 64 output rows; per 64-deep K slice it
// issues four m64n128k16 wgmma (x TERMS planes) reading both operands from
// shared memory. The slices stream in with cp.async into the 128-byte
// swizzled layout wgmma expects (row r's 16-byte chunk c at chunk c ^ (r % 8)
// of a 128-byte row; tiles 1024-byte aligned), kWgStages slices in flight.
// One wgmma group stays in flight across the barrier: the slice loaded in
// iteration kt overwrites the stage of slice kt - 2, which every warpgroup
// has finished (wgmma.wait_group 1 in iteration kt - 1).
//
// Exact inputs (TERMS 3) sum each slice in its own accumulator and add it
// with f32 adds, as pipelined_mma_tile does (tensor-core accumulation
// truncates); bf16 inputs accumulate the whole K on the tensor cores.
//
// Only compiled where wgmma exists (NF_HAS_WGMMA: cubins for sm_90a); the
// PTX for other targets keeps pipelined_mma_tile.
#ifndef NF_KERNELS_WGMMA_CUH
#define NF_KERNELS_WGMMA_CUH

#include "nf_common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NF_HAS_WGMMA 1
#endif

namespace nf {

constexpr int kWgTile = 128, kWgK = 64;
template <int TERMS> __host__ __device__ constexpr int wgmma_stages() {
  return TERMS == 1 ? 5 : 3;
}
/// Bytes of one stage: TERMS A planes and the weight tile, 128 x 64 bf16 each.
template <int TERMS> __host__ __device__ constexpr int wgmma_stage_bytes() {
  return (TERMS + 1) * kWgTile * kWgK * 2;
}
/// Dynamic shared memory of wgmma_tile, in bytes (1 KiB for alignment).
template <int TERMS> __host__ __device__ constexpr int wgmma_gemm_smem() {
  return wgmma_stages<TERMS>() * wgmma_stage_bytes<TERMS>() + 1024;
}

/// Threads of a wgmma_ws_gemm block with CW consumer warpgroups: a producer
/// warpgroup and the consumers.
template <int CW = 2> __host__ __device__ constexpr int wgmma_ws_threads() {
  return 128 * (CW + 1);
}
constexpr int kWsThreads = wgmma_ws_threads<2>();
/// Bytes of one stage: the 64 CW x 64 input tile and the TN x 64 weight tile.
template <int TN, int CW = 2>
__host__ __device__ constexpr int wgmma_ws_stage_bytes() {
  return (64 * CW + TN) * kWgK * 2;
}
template <int TN, int CW = 2>
__host__ __device__ constexpr int wgmma_ws_stages() {
  return (210 * 1024) / wgmma_ws_stage_bytes<TN, CW>();
}
/// Dynamic shared memory of wgmma_ws_gemm (1 KiB for alignment).
template <int TN, int CW = 2>
__host__ __device__ constexpr int wgmma_ws_smem() {
  return wgmma_ws_stages<TN, CW>() * wgmma_ws_stage_bytes<TN, CW>() + 1024;
}

#ifdef NF_HAS_WGMMA

/// Shared-memory matrix descriptor of a K-major tile in the 128-byte
/// swizzle: 8-row core groups 1024 bytes apart.
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned addr) {
  return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) |
         (1ull << 16) |                                       // leading offset
         (static_cast<unsigned long long>(1024 >> 4) << 32) | // stride offset
         (1ull << 62); // 128-byte swizzle
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/// Makes this thread's generic-proxy shared-memory writes (cp.async)
/// visible to the async proxy wgmma reads through.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The accumulator of the wgmma shapes below, 32 registers at a time: their
// names in the instruction ("%0, %1, ...") and their operands ("+f"(d[i])).
#define NF_WGMMA_REGS_0_31                                                     \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "                              \
  "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "                    \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define NF_WGMMA_REGS_32_63                                                    \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "                    \
  "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, "                    \
  "%54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define NF_WGMMA_REGS_64_95                                                    \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, "                    \
  "%75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, "                    \
  "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define NF_WGMMA_REGS_96_127                                                   \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, "             \
  "%107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, "         \
  "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define NF_WGMMA_D8(i)                                                         \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),  \
      "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define NF_WGMMA_D32(i)                                                        \
  NF_WGMMA_D8(i), NF_WGMMA_D8(i + 8), NF_WGMMA_D8(i + 16), NF_WGMMA_D8(i + 24)

/// d (+)= A[64 x 16] . B[128 x 16]^T, both K-major in shared memory; the
/// accumulator layout is mma.sync's C fragment for warp w of the warpgroup
/// on rows 16w..16w+15, repeated over 16 n-tiles of 8: d[4j + c] is row
/// 16w + lane / 4 + 8 (c / 2), column 8j + 2 (lane % 4) + c % 2.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64],
                                                 unsigned long long da,
                                                 unsigned long long db,
                                                 int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
               "{" NF_WGMMA_REGS_0_31 ", " NF_WGMMA_REGS_32_63
               "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
               : NF_WGMMA_D32(0), NF_WGMMA_D32(32)
               : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_m64n192k16(float (&d)[96],
                                                 unsigned long long da,
                                                 unsigned long long db,
                                                 int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
               "{" NF_WGMMA_REGS_0_31 ", " NF_WGMMA_REGS_32_63
               ", " NF_WGMMA_REGS_64_95 "}, %96, %97, p, 1, 1, 0, 0;\n}\n"
               : NF_WGMMA_D32(0), NF_WGMMA_D32(32), NF_WGMMA_D32(64)
               : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128],
                                                 unsigned long long da,
                                                 unsigned long long db,
                                                 int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{" NF_WGMMA_REGS_0_31 ", " NF_WGMMA_REGS_32_63 ", " NF_WGMMA_REGS_64_95
      ", " NF_WGMMA_REGS_96_127 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : NF_WGMMA_D32(0), NF_WGMMA_D32(32), NF_WGMMA_D32(64), NF_WGMMA_D32(96)
      : "l"(da), "l"(db), "r"(accumulate));
}

#undef NF_WGMMA_D32
#undef NF_WGMMA_D8
#undef NF_WGMMA_REGS_96_127
#undef NF_WGMMA_REGS_64_95
#undef NF_WGMMA_REGS_32_63
#undef NF_WGMMA_REGS_0_31

/// wgmma m64 x TN x k16 (TN 128, 192 or 256): d holds TN / 2 values per
/// thread in the layout of wgmma_m64n128k16, over TN / 8 n-tiles.
template <int TN>
__device__ __forceinline__ void
wgmma_m64k16(float (&d)[TN / 2], unsigned long long da, unsigned long long db,
             int accumulate) {
  if constexpr (TN == 128)
    wgmma_m64n128k16(d, da, db, accumulate);
  else if constexpr (TN == 192)
    wgmma_m64n192k16(d, da, db, accumulate);
  else
    wgmma_m64n256k16(d, da, db, accumulate);
}

/// One arrival on the barrier once this thread's cp.async copies so far
/// have landed (counted in the barrier's expected arrivals: noinc).
__device__ __forceinline__ void mbarrier_arrive_copies(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar)
               : "memory");
}

// Warp-specialised persistent GEMM (bf16 inputs, one plane): a block of
// kWsThreads = 384 threads, warpgroup 0 loads and warpgroups 1 and 2
// multiply. Tiles are 128 rows x TN features; each consumer warpgroup owns
// 64 rows and issues m64 x TN x k16 wgmma reading both operands from shared
// memory. The producer streams 64-deep K slices with cp.async into
// wgmma_ws_stages<TN>() stages (the 128-byte swizzle of wgmma_tile) and
// signals each stage's "full" barrier when its copies land
// (cp.async.mbarrier.arrive); each consumer warp releases a stage on its
// "empty" barrier once the wgmma reading it completed. The pipeline runs
// across tiles: the producer loads the next tile while the consumers store
// the last one. (wgmma_tile instead makes all 256 threads load and multiply,
// with a block barrier per slice: 445-476 TFLOP/s on the Nano shapes.)
// FP8 weights (HasCodesOnLoad): the producer loads the codes into registers
// before it waits for the stage, widens them to bf16 (exact) and stores
// them in the same swizzled layout, then fences them to the async proxy
// and arrives on the "full" barrier itself, beside its copies' arrival; no
// launch widens the codes into scratch first. The widening, not the loads'
// latency, sets the producer's pace: at 8,000 rows of the Nano shared
// expert 507 us against bf16 weights' 357 (H100), the same with two or
// three stages of codes in flight in registers (bench/kernels/
// ws_gemm_check.cu, bench/results/2026-12-07e).
/// Runs tiles blockIdx.x, blockIdx.x + gridDim.x, ... < tiles; tile_of(t,
/// g, row0, rows, n0) names tile t's group, first row, row count (<= 64 CW)
/// and first feature. Call from all wgmma_ws_threads<CW>() threads.
template <class S, int TN, int CW = 2, class TileOf>
__device__ __forceinline__ void wgmma_ws_gemm(Step a, int tiles, TileOf tile_of,
                                              unsigned char *smem_raw) {
  static_assert(S::K % 8 == 0, "16-byte rows");
  static_assert(TN == 128 || TN == 192 || TN == 256, "wgmma n");
  static_assert(CW == 2 || CW == 3, "two or three consumer warpgroups");
  constexpr int TM = 64 * CW, AJ = TM / 16, BJ = TN / 16;
  constexpr int ST = wgmma_ws_stages<TN, CW>();
  constexpr int STAGE = wgmma_ws_stage_bytes<TN, CW>();
  constexpr int A_BYTES = TM * kWgK * 2;
  constexpr int KT = (S::K + kWgK - 1) / kWgK;
  constexpr bool kCodes = HasCodesOnLoad<S>::value;
  // Three consumers of 256-wide tiles would need more than 65536 / 512
  // registers (ptxas does not compile them under that bound even with
  // setmaxnreg moving registers from the producer).
  static_assert(CW == 2 || TN <= 192, "registers");
  static_assert(ST >= 2, "double buffering at least");
  __shared__ __align__(8) unsigned long long ws_bars[2 * ST];
  unsigned char *smem = reinterpret_cast<unsigned char *>(
      (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
  const unsigned sbase = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const unsigned full0 =
      static_cast<unsigned>(__cvta_generic_to_shared(ws_bars));
  const unsigned empty0 = full0 + 8 * ST;
  const int tid = threadIdx.x, wg = tid >> 7;
  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      // Each producer thread's copies (and, widening codes, its stores).
      mbarrier_init(full0 + 8 * s, kCodes ? 256 : 128);
      mbarrier_init(empty0 + 8 * s, 4 * CW); // each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (wg == 0) {
    // Producer: thread p copies 16-byte chunk p % 8 of rows p / 8 + 16 j,
    // stored at chunk (p % 8) ^ (row % 8) (row % 8 does not depend on j).
    const int p = tid, r0 = p >> 3, ch = p & 7;
    const unsigned soff = r0 * 128 + ((ch ^ (r0 & 7)) << 4);
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int g, row0, rows, n0;
      tile_of(t, g, row0, rows, n0);
      const bf16 *wbase = S::weight(a, g);
      const unsigned short *arow[AJ];
#pragma unroll
      for (int j = 0; j < AJ; ++j)
        arow[j] = r0 + 16 * j < rows ? S::row16(a, row0 + r0 + 16 * j) + ch * 8
                                     : nullptr;
      const long long boff = static_cast<long long>(n0 + r0) * S::K + ch * 8;
      const bf16 *brow = wbase + boff;
      const int bvalid = S::N - n0 - r0; // rows r0 + 16 j < N - n0
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const int stage = it % ST;
        const int k0 = kt * kWgK;
        const bool kin = k0 + ch * 8 < S::K;
        uint2 codes[kCodes ? BJ : 1]; // 8 codes of each of the BJ rows
        if constexpr (kCodes) {
          const fp8e4m3 *crow = S::codes(a, g) + boff + k0;
#pragma unroll
          for (int j = 0; j < BJ; ++j)
            codes[j] = 16 * j < bvalid && kin
                           ? __ldg(reinterpret_cast<const uint2 *>(
                                 crow + static_cast<long long>(16 * j) * S::K))
                           : make_uint2(0u, 0u);
        }
        mbarrier_wait(empty0 + 8 * stage, ((it / ST) & 1) ^ 1);
        unsigned char *st = smem + stage * STAGE;
#pragma unroll
        for (int j = 0; j < AJ; ++j)
          copy_async16_or_zero(st + soff + j * 2048,
                               arow[j] ? static_cast<const void *>(arow[j] + k0)
                                       : wbase, // not read
                               arow[j] && kin);
        if constexpr (kCodes) {
#pragma unroll
          for (int j = 0; j < BJ; ++j) {
            const uint2 lo = fp8x4_to_bf16x4(codes[j].x),
                        hi = fp8x4_to_bf16x4(codes[j].y);
            *reinterpret_cast<uint4 *>(st + A_BYTES + soff + j * 2048) =
                make_uint4(lo.x, lo.y, hi.x, hi.y);
          }
          fence_proxy_async_shared(); // the consumers' wgmma read them
          mbarrier_arrive(full0 + 8 * stage);
        } else {
#pragma unroll
          for (int j = 0; j < BJ; ++j) {
            const bool valid = 16 * j < bvalid && kin;
            copy_async16_or_zero(
                st + A_BYTES + soff + j * 2048,
                valid ? static_cast<const void *>(
                            brow + static_cast<long long>(16 * j) * S::K + k0)
                      : wbase, // not read
                valid);
          }
        }
        mbarrier_arrive_copies(full0 + 8 * stage);
      }
    }
    return;
  }
  // Consumers: warpgroup cw multiplies rows 64 cw .. 64 cw + 63 of a tile.
  // Every consumer warp releases a stage itself (lane 0): a warpgroup that
  // skips the wgmma (no rows) does not keep its warps in step, and one
  // arrival per warpgroup would let the producer refill a stage, and move
  // its "full" barrier two phases on, while a lagging warp still waits for
  // the earlier phase (a deadlock).
  const int cw = wg - 1, lane = lane_id(), warp = (tid >> 5) & 3;
  const bool signals = lane == 0;
  int it = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    int g, row0, rows, n0;
    tile_of(t, g, row0, rows, n0);
    float acc[TN / 2];
#pragma unroll
    for (int i = 0; i < TN / 2; ++i)
      acc[i] = 0.0f;
    // A warpgroup whose 64 rows are all past the tile's rows (the last tile
    // of an expert's rows) only passes the stages on: the other one then has
    // the tensor cores to itself.
    const bool active = cw * 64 < rows;
    for (int kt = 0; kt < KT; ++kt, ++it) {
      const int stage = it % ST;
#ifdef NF_WS_SKEW_TEST
      // bench/kernels/ws_gemm_check.cu: the warps of a warpgroup without
      // rows out of step.
      if (!active && warp != 0)
        __nanosleep(20000);
#endif
      mbarrier_wait(full0 + 8 * stage, (it / ST) & 1);
      // The producer's cp.async wrote the stage through the generic proxy;
      // wgmma reads it through the async proxy (PTX memory model).
      fence_proxy_async_shared();
      if (active) {
        const unsigned sa = sbase + stage * STAGE + cw * 8192;
        const unsigned sb = sbase + stage * STAGE + A_BYTES;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kWgK / 16; ++kk)
          wgmma_m64k16<TN>(acc, wgmma_desc(sa + kk * 32),
                           wgmma_desc(sb + kk * 32), 1);
        wgmma_commit();
        wgmma_wait<1>(); // the previous slice's wgmma are done with its stage
      }
      if (kt > 0 && signals)
        mbarrier_arrive(empty0 + 8 * ((it + ST - 1) % ST));
    }
    wgmma_wait<0>();
    if (signals)
      mbarrier_arrive(empty0 + 8 * ((it + ST - 1) % ST));
    // Row by row: d[4 j + 2 h + e] is row gid + 8 h, column 8 j + 2 tig + e.
    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = cw * 64 + warp * 16 + gid + 8 * h;
      if (r >= rows)
        continue;
      if constexpr (HasRowCtx<S>::value) {
        const long long ctx = S::row_ctx(a, row0 + r);
#pragma unroll
        for (int j = 0; j < TN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int n = n0 + j * 8 + 2 * tig + e;
            if (n < S::N)
              S::store(a, ctx, row0 + r, n,
                       scaled_output<S>(a, g, n, acc[4 * j + 2 * h + e]));
          }
      } else if constexpr (HasStore2<S>::value) {
        // Column pairs (n is even: n0 is a multiple of TN) in one store.
#pragma unroll
        for (int j = 0; j < TN / 8; ++j) {
          const int n = n0 + j * 8 + 2 * tig;
          if (n + 1 < S::N)
            S::store2(a, row0 + r, n,
                      scaled_output<S>(a, g, n, acc[4 * j + 2 * h]),
                      scaled_output<S>(a, g, n + 1, acc[4 * j + 2 * h + 1]));
          else if (n < S::N)
            S::store(a, row0 + r, n,
                     scaled_output<S>(a, g, n, acc[4 * j + 2 * h]));
        }
      } else {
#pragma unroll
        for (int j = 0; j < TN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int n = n0 + j * 8 + 2 * tig + e;
            if (n < S::N)
              S::store(a, row0 + r, n,
                       scaled_output<S>(a, g, n, acc[4 * j + 2 * h + e]));
          }
      }
    }
  }
}

template <class S, int TERMS>
__device__ __forceinline__ void wgmma_tile(Step a, int g, int row0, int rows,
                                           int n0, unsigned char *smem_raw) {
  static_assert(S::K % 8 == 0, "16-byte rows");
  constexpr int ST = wgmma_stages<TERMS>();
  constexpr int PLANE_BYTES = kWgTile * kWgK * 2;
  constexpr int STAGE = wgmma_stage_bytes<TERMS>();
  constexpr int KT = (S::K + kWgK - 1) / kWgK;
  static_assert(ST >= 3, "one slice in the tensor cores, one landing");
  unsigned char *smem = reinterpret_cast<unsigned char *>(
      (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
  const unsigned sbase = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
  const int wg = warp >> 2; // warpgroup: output rows 64 wg ..
  // Loader: chunk c = tid + 256 j (j < 4) is row c / 8, 16-byte chunk c % 8
  // of a 128 x 64 tile, stored at chunk (c % 8) ^ (row % 8).
  const bf16 *wbase = S::weight(a, g);
  const unsigned short *arow[4];
  const bf16 *brow[4];
  unsigned soff[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int c = tid + 256 * j, r = c >> 3, ch = c & 7;
    arow[j] = r < rows ? S::row16(a, row0 + r) + ch * 8 : nullptr;
    brow[j] = n0 + r < S::N
                  ? wbase + static_cast<long long>(n0 + r) * S::K + ch * 8
                  : nullptr;
    soff[j] = r * 128 + ((ch ^ (r & 7)) << 4);
  }
  auto load_stage = [&](int stage, int k0) {
    unsigned char *st = smem + stage * STAGE;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int ch = (tid + 256 * j) & 7;
      const bool kin = k0 + ch * 8 < S::K;
#pragma unroll
      for (int p = 0; p < TERMS; ++p)
        copy_async16_or_zero(
            st + p * PLANE_BYTES + soff[j],
            arow[j] ? static_cast<const void *>(arow[j] + p * S::PLANE + k0)
                    : wbase, // not read
            arow[j] && kin);
      copy_async16_or_zero(st + TERMS * PLANE_BYTES + soff[j],
                           brow[j] ? static_cast<const void *>(brow[j] + k0)
                                   : wbase, // not read
                           brow[j] && kin);
    }
  };
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i)
    acc[i] = 0.0f;
  float part[TERMS > 1 ? 64 : 1];
  __syncthreads(); // the previous tile is done with the stages
#pragma unroll
  for (int st = 0; st < ST - 2; ++st) {
    if (st < KT)
      load_stage(st, st * kWgK);
    copy_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    copy_async_wait<ST - 3>(); // slice kt has landed (this thread's part)
    fence_proxy_async_shared();
    __syncthreads(); // everyone's part; slice kt - 2 is consumed
    if (kt + ST - 2 < KT)
      load_stage((kt + ST - 2) % ST, (kt + ST - 2) * kWgK);
    copy_async_commit();
    const unsigned st = sbase + (kt % ST) * STAGE;
    const unsigned bdesc_addr = st + TERMS * PLANE_BYTES;
    wgmma_fence();
    if constexpr (TERMS == 1) {
#pragma unroll
      for (int kk = 0; kk < kWgK / 16; ++kk)
        wgmma_m64n128k16(acc, wgmma_desc(st + wg * 8192 + kk * 32),
                         wgmma_desc(bdesc_addr + kk * 32), 1);
      wgmma_commit();
      wgmma_wait<1>();
    } else {
#pragma unroll
      for (int kk = 0; kk < kWgK / 16; ++kk)
#pragma unroll
        for (int p = TERMS - 1; p >= 0; --p) // small terms first
          wgmma_m64n128k16(
              part, wgmma_desc(st + p * PLANE_BYTES + wg * 8192 + kk * 32),
              wgmma_desc(bdesc_addr + kk * 32), kk > 0 || p < TERMS - 1);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i)
        acc[i] += part[i];
    }
  }
  wgmma_wait<0>();
  copy_async_wait<0>(); // only empty groups remain; none may outlive the tile
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = wg * 64 + (warp & 3) * 16 + gid + (c >> 1) * 8;
      const int n = n0 + j * 8 + 2 * tig + (c & 1);
      if (r < rows && n < S::N)
        S::store(a, row0 + r, n, scaled_output<S>(a, g, n, acc[4 * j + c]));
    }
}

#endif // NF_HAS_WGMMA

} // namespace nf

#endif // NF_KERNELS_WGMMA_CUH
