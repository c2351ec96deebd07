// Reading safetensors headers: single files and sharded checkpoints.
//
// Only headers are parsed here (names, dtypes, shapes, byte ranges); weight
// data is mapped later by the runtime. Every malformed input yields a Status
// naming the file and the problem; nothing here aborts on bad bytes.
#pragma once

#include "nf/status.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace nf {

/// Element types that may appear in a safetensors header.
enum class DType {
  F64,
  F32,
  F16,
  BF16,
  I64,
  I32,
  I16,
  I8,
  U8,
  Bool,
  F8E4M3,
  F8E5M2
};

/// "F32" -> DType::F32 ... ; nullopt for a string safetensors does not define.
std::optional<DType> parseDType(const std::string &s);
/// A shape as "[a, b, c]", for messages.
std::string shapeString(const std::vector<int64_t> &shape);
/// Canonical safetensors spelling ("BF16").
const char *dtypeName(DType t);
/// Bytes per element.
size_t dtypeSize(DType t);
/// True for the dtypes nf computes with: f32, bf16, f16.
bool isSupportedWeightDType(DType t);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  /// Absolute byte range of the data in the file (header already skipped).
  uint64_t dataBegin = 0;
  uint64_t dataEnd = 0;
  /// Path of the file that holds it.
  std::string file;

  int64_t numElements() const;
};

/// The header of one .safetensors file.
struct SafetensorsFile {
  std::string path;
  uint64_t fileSize = 0;
  uint64_t dataOffset = 0; // 8 + header length
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

/// Parse and validate the header of `path`: length prefix within the file,
/// well-formed JSON, known dtypes, offsets in order inside the data section and
/// consistent with shape × dtype size.
StatusOr<SafetensorsFile> readSafetensorsHeader(const std::string &path);

/// All tensors of a checkpoint directory: `model.safetensors`, or the shards
/// listed in `model.safetensors.index.json` (every listed tensor must exist in
/// the shard the index names). Shard names must stay inside `dir`
/// (nf/file.h, pathInside).
struct Checkpoint {
  std::string dir;
  std::vector<std::string> files; // absolute-or-as-given paths, in order
  std::map<std::string, TensorInfo> tensors;

  const TensorInfo *find(const std::string &name) const;
};

StatusOr<Checkpoint> openCheckpoint(const std::string &dir);

/// A tensor to write: `bytes` holds numElements(shape) x dtypeSize(dtype)
/// bytes, row-major.
struct TensorData {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::string_view bytes;
};

/// Writes `tensors` (in this order) as one .safetensors file at `path`. The
/// file is written under a temporary name and renamed into place, so a
/// failure never leaves a partial file at `path`. Errors name the file.
Status
writeSafetensors(const std::string &path,
                 const std::vector<TensorData> &tensors,
                 const std::map<std::string, std::string> &metadata = {});

/// The same, for tensors too large to hold at once: `tensors` gives names,
/// dtypes and shapes (their `bytes` unused), and `fill(i, bytes)` produces
/// tensor i's bytes when the writer reaches it; an error it returns stops
/// the write.
using TensorFill = std::function<Status(size_t index, std::string &bytes)>;
Status
writeSafetensors(const std::string &path,
                 const std::vector<TensorData> &tensors, const TensorFill &fill,
                 const std::map<std::string, std::string> &metadata = {});

} // namespace nf
