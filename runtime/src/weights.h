// Memory-mapped safetensors weights and typed views of them.
//
// A WeightStore maps every file of a checkpoint read-only and hands out
// WeightViews (pointer + dtype + shape) by tensor name. Kernels read the
// views directly and convert bf16/f16 to f32 on the fly, so weights are never
// copied or converted up front. Internal to the runtime.
#pragma once

#include "nf/safetensors.h"
#include "nf/status.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace nf {

/// A row-major tensor in memory that somebody else owns (a mapping, or a
/// test's buffer). Views stay valid while their owner lives.
struct WeightView {
  const void *data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;

  bool valid() const { return data != nullptr; }
  int64_t numElements() const;
  /// shape[0] (1 for a scalar).
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  /// Product of shape[1:]: the row length of a matrix view.
  int64_t cols() const;
  /// Bytes per element of `dtype`.
  size_t elementSize() const { return dtypeSize(dtype); }
  /// View of rows [begin, begin + count) of the leading dimension (e.g. one
  /// expert of a stacked [E, N, K] tensor: slice(e, 1) then drop the dim).
  WeightView slice(int64_t begin, int64_t count) const;
  /// Sub-tensor `index` of the leading dimension, with that dimension dropped.
  WeightView at(int64_t index) const;
};

/// Splits a stacked [E, ...] expert tensor into E per-expert views.
std::vector<WeightView> splitExperts(const WeightView &stacked);

/// bf16 -> f32 is exact: bf16 is the upper half of an f32.
inline float bf16ToF32(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// `v` rounded to the nearest bf16 value, ties to even, as an f32 (NaN
/// stays NaN).
inline float roundToBf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return v;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Exact IEEE binary16 -> binary32 (normals, subnormals, zeros, inf, NaN).
inline float f16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal: renormalise. value = mant * 2^-24.
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      bits = sign | (static_cast<uint32_t>(112 - e) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13); // inf / NaN (payload kept)
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// OCP float8 E4M3 ("FN": no infinities, max 448, S.1111.111 is NaN) ->
/// f32, exactly.
inline float e4m3ToF32(uint8_t v) {
  const int exp = (v >> 3) & 0xf, mant = v & 0x7;
  float mag;
  if (exp == 0xf && mant == 0x7)
    mag = std::numeric_limits<float>::quiet_NaN();
  else if (exp == 0)
    mag = std::ldexp(static_cast<float>(mant), -9); // subnormal: mant * 2^-9
  else
    mag = std::ldexp(static_cast<float>(8 + mant), exp - 10);
  return (v & 0x80) ? -mag : mag;
}

/// `v` rounded to the nearest E4M3 value, ties to even, for |v| <= 448 (the
/// callers clamp first); the value, not the code.
inline float roundToE4M3(float v) {
  const float a = std::fabs(v);
  if (!(a > 0.0f))
    return v; // zeros (and NaN) stay
  int e;
  std::frexp(a, &e); // a = m * 2^e, m in [0.5, 1): unit exponent e - 1
  // 3 mantissa bits; below 2^-6 the subnormal spacing 2^-9.
  const float step = std::ldexp(1.0f, std::max(e - 1, -6) - 3);
  // a / step is exact (a power of two); nearbyint rounds ties to even.
  return std::copysign(std::min(std::nearbyint(a / step) * step, 448.0f), v);
}

/// The E4M3 code of `v` clamped to +-448 and rounded to the nearest E4M3
/// value, ties to even (the inverse of e4m3ToF32 on its values; NaN gives
/// the NaN code).
inline uint8_t e4m3Code(float v) {
  if (std::isnan(v))
    return 0x7f;
  const float r = roundToE4M3(std::clamp(v, -448.0f, 448.0f));
  const uint8_t sign = std::signbit(r) ? 0x80 : 0;
  const float a = std::fabs(r);
  if (a == 0.0f)
    return sign;
  int e;
  std::frexp(a, &e); // a = m * 2^e, m in [0.5, 1): unit exponent e - 1
  if (e - 1 < -6)    // subnormal: mant * 2^-9
    return sign | static_cast<uint8_t>(std::ldexp(a, 9));
  const int mant = static_cast<int>(std::ldexp(a, -(e - 1)) * 8.0f) - 8;
  return sign | static_cast<uint8_t>((e - 1 + 7) << 3) |
         static_cast<uint8_t>(mant);
}

/// Element `i` of an f32/bf16/f16 view as f32 (0 for other dtypes).
inline float loadF32(const WeightView &w, int64_t i) {
  switch (w.dtype) {
  case DType::F32: {
    float f;
    std::memcpy(&f, static_cast<const char *>(w.data) + 4 * i, 4);
    return f;
  }
  case DType::BF16: {
    uint16_t v;
    std::memcpy(&v, static_cast<const char *>(w.data) + 2 * i, 2);
    return bf16ToF32(v);
  }
  case DType::F16: {
    uint16_t v;
    std::memcpy(&v, static_cast<const char *>(w.data) + 2 * i, 2);
    return f16ToF32(v);
  }
  default:
    return 0.0f;
  }
}

/// Elements [begin, begin + n) of an f32/bf16/f16 view, converted into `out`.
void convertToF32(const WeightView &w, int64_t begin, int64_t n, float *out);

/// A read-only mapping of one whole file. Move-only; unmaps on destruction.
class MappedFile {
public:
  static StatusOr<MappedFile> open(const std::string &path);
  MappedFile() = default;
  MappedFile(MappedFile &&other) noexcept;
  MappedFile &operator=(MappedFile &&other) noexcept;
  MappedFile(const MappedFile &) = delete;
  MappedFile &operator=(const MappedFile &) = delete;
  ~MappedFile();

  const uint8_t *data() const { return static_cast<const uint8_t *>(addr_); }
  size_t size() const { return size_; }
  const std::string &path() const { return path_; }

private:
  void reset() noexcept;
  std::string path_;
  void *addr_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

/// All tensors of one safetensors file or checkpoint directory, mapped.
class WeightStore {
public:
  /// One `.safetensors` file.
  static StatusOr<WeightStore> openFile(const std::string &path);
  /// A checkpoint directory (`model.safetensors` or an indexed shard set).
  static StatusOr<WeightStore> openCheckpoint(const std::string &dir);

  /// Tensors the caller holds in memory (synthetic weights); `where`
  /// names them in errors. Add them with addView.
  static WeightStore inMemory(const std::string &where);
  /// Adds tensor `name` whose `dtype` and `shape` bytes `data` holds (kept
  /// alive by the caller, aligned for the dtype).
  void addView(const std::string &name, DType dtype,
               const std::vector<int64_t> &shape, const uint8_t *data);

  WeightStore() = default;
  WeightStore(WeightStore &&) noexcept = default;
  WeightStore &operator=(WeightStore &&) noexcept = default;

  /// The tensor `name`; an error names the files searched.
  StatusOr<WeightView> find(const std::string &name) const;
  bool contains(const std::string &name) const {
    return tensors_.count(name) != 0;
  }
  const std::map<std::string, TensorInfo> &tensors() const { return tensors_; }

private:
  Status addFile(const std::string &path,
                 const std::map<std::string, TensorInfo> &tensors);

  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, const uint8_t *> data_;
  // Tensors whose offset is not a multiple of their element size are copied
  // here so kernels may read them as aligned arrays.
  std::vector<std::unique_ptr<uint8_t[]>> alignedCopies_;
  std::string where_;
};

} // namespace nf
