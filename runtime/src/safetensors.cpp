// Safetensors header parsing and checkpoint directories (see nf/safetensors.h).
//
// Every input byte is untrusted: sizes are checked before allocating, integer
// arithmetic is overflow-checked, and nlohmann::json exceptions are caught so
// that callers only ever see a Status.
#include "nf/safetensors.h"
#include "nf/file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

namespace nf {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// A header larger than this is certainly corrupt (real checkpoints with tens of
// thousands of tensors stay below a few MB); refusing it avoids a huge
// allocation driven by 8 untrusted bytes.
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

Status fail(const std::string &path, const std::string &what) {
  return Status::error(path + ": " + what);
}

// Reads a non-negative JSON integer (JSON parsers store those as unsigned).
bool getUnsigned(const json &j, uint64_t &out) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// Parses one tensor entry of the header; `dataSize` is the size of the data
// section, used to bound the byte range.
Status parseTensorEntry(const std::string &path, const std::string &name,
                        const json &entry, uint64_t dataOffset,
                        uint64_t dataSize, TensorInfo &info) {
  std::string where = "tensor '" + printable(name) + "'";
  if (!entry.is_object())
    return fail(path, where + " is not a JSON object");

  auto dt = entry.find("dtype");
  if (dt == entry.end() || !dt->is_string())
    return fail(path, where + " has no 'dtype' string");
  std::optional<DType> dtype = parseDType(dt->get<std::string>());
  if (!dtype)
    return fail(path, where + " has unknown dtype '" +
                          printable(dt->get<std::string>()) + "'");

  auto sh = entry.find("shape");
  if (sh == entry.end() || !sh->is_array())
    return fail(path, where + " has no 'shape' array");
  std::vector<int64_t> shape;
  // numElements * element size must fit in 64 bits; check as we go.
  uint64_t bytes = dtypeSize(*dtype);
  for (const json &d : *sh) {
    uint64_t v;
    if (!getUnsigned(d, v) ||
        v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return fail(path, where + " has an invalid shape " + sh->dump() +
                            " (expected non-negative integers)");
    shape.push_back(static_cast<int64_t>(v));
    if (v != 0 && bytes > std::numeric_limits<uint64_t>::max() / v)
      return fail(path, where + " shape " + sh->dump() + " is too large");
    bytes *= v;
  }

  auto off = entry.find("data_offsets");
  uint64_t begin = 0, end = 0;
  if (off == entry.end() || !off->is_array() || off->size() != 2 ||
      !getUnsigned((*off)[0], begin) || !getUnsigned((*off)[1], end))
    return fail(path, where + " has invalid 'data_offsets' (expected [begin, "
                              "end] non-negative integers)");
  if (end < begin)
    return fail(path, where + " data_offsets [" + std::to_string(begin) + ", " +
                          std::to_string(end) + "] end before they begin");
  if (end - begin != bytes)
    return fail(path, where + " data range [" + std::to_string(begin) + ", " +
                          std::to_string(end) + ") does not match shape " +
                          shapeString(shape) + " x " +
                          std::to_string(dtypeSize(*dtype)) + " bytes");
  if (end > dataSize)
    return fail(path, where + " data range ends beyond the file (ends at " +
                          std::to_string(end) + ", data section has " +
                          std::to_string(dataSize) + " bytes)");

  info.name = name;
  info.dtype = *dtype;
  info.shape = std::move(shape);
  info.dataBegin = dataOffset + begin;
  info.dataEnd = dataOffset + end;
  info.file = path;
  return Status::success();
}

StatusOr<SafetensorsFile> readHeaderImpl(const std::string &path) {
  StatusOr<InputFile> file = InputFile::open(path);
  if (!file)
    return file.status();
  SafetensorsFile out;
  out.path = path;
  out.fileSize = file->size();
  if (out.fileSize < 8)
    return fail(path, "truncated file (shorter than the 8-byte header length)");

  unsigned char lenBytes[8];
  if (Status s = file->read(lenBytes, 8); !s)
    return s;
  // Little-endian regardless of the host.
  uint64_t headerLen = 0;
  for (int i = 7; i >= 0; --i)
    headerLen = (headerLen << 8) | lenBytes[i];
  if (headerLen > out.fileSize - 8)
    return fail(path, "header length " + std::to_string(headerLen) +
                          " exceeds file size " + std::to_string(out.fileSize));
  if (headerLen > kMaxHeaderBytes)
    return fail(path, "header length " + std::to_string(headerLen) +
                          " exceeds the limit of " +
                          std::to_string(kMaxHeaderBytes) + " bytes");
  out.dataOffset = 8 + headerLen;
  uint64_t dataSize = out.fileSize - out.dataOffset;

  std::string text(headerLen, '\0');
  if (Status s = file->read(text.data(), text.size()); !s)
    return s;

  json header;
  try {
    header = json::parse(text);
  } catch (const json::parse_error &e) {
    return fail(path, "header is not valid JSON (error at byte " +
                          std::to_string(e.byte) + ")");
  }
  if (!header.is_object())
    return fail(path, "header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string &name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object())
        return fail(path, "'__metadata__' is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return fail(path, "'__metadata__' value for '" + printable(m.key()) +
                                "' is not a string");
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TensorInfo info;
    if (Status s =
            parseTensorEntry(path, name, *it, out.dataOffset, dataSize, info);
        !s)
      return s;
    out.tensors.emplace(name, std::move(info));
  }

  // Non-empty byte ranges must not overlap: two tensors sharing bytes means a
  // corrupt or hostile header. Gaps are harmless and tolerated.
  std::vector<const TensorInfo *> byStart;
  for (const auto &[name, t] : out.tensors)
    if (t.dataEnd > t.dataBegin)
      byStart.push_back(&t);
  std::sort(byStart.begin(), byStart.end(),
            [](const TensorInfo *a, const TensorInfo *b) {
              return a->dataBegin < b->dataBegin;
            });
  for (size_t i = 1; i < byStart.size(); ++i) {
    const TensorInfo *a = byStart[i - 1], *b = byStart[i];
    if (b->dataBegin < a->dataEnd)
      return fail(path,
                  "tensors '" + printable(a->name) + "' and '" +
                      printable(b->name) + "' have overlapping data ranges [" +
                      std::to_string(a->dataBegin - out.dataOffset) + ", " +
                      std::to_string(a->dataEnd - out.dataOffset) + ") and [" +
                      std::to_string(b->dataBegin - out.dataOffset) + ", " +
                      std::to_string(b->dataEnd - out.dataOffset) + ")");
  }
  return out;
}

Status addTensors(Checkpoint &ckpt, SafetensorsFile &file) {
  for (auto &[name, info] : file.tensors) {
    auto [it, inserted] = ckpt.tensors.emplace(name, info);
    if (!inserted)
      return fail(file.path, "tensor '" + printable(name) +
                                 "' also appears in '" + it->second.file + "'");
  }
  ckpt.files.push_back(file.path);
  return Status::success();
}

StatusOr<Checkpoint> openShardedCheckpoint(const std::string &dir,
                                           const std::string &indexPath) {
  StatusOr<std::string> text = readWholeFile(indexPath);
  if (!text)
    return text.status();
  json index;
  try {
    index = json::parse(*text);
  } catch (const json::parse_error &e) {
    return fail(indexPath, "not valid JSON (error at byte " +
                               std::to_string(e.byte) + ")");
  }
  if (!index.is_object())
    return fail(indexPath, "not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object())
    return fail(indexPath, "missing 'weight_map' object");
  if (wm->empty())
    return fail(indexPath, "'weight_map' is empty");

  // Distinct shard names, sorted so that model-00001-of-0000N comes first.
  // Each is checked to stay inside `dir` before any shard is opened.
  std::map<std::string, std::string> shardPaths;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    // A control character in a shard name would reach the one-line errors
    // that quote the shard's path.
    if (!it->is_string() || it->get<std::string>().empty() ||
        printable(it->get<std::string>()) != it->get<std::string>())
      return fail(indexPath, "weight_map entry for tensor '" +
                                 printable(it.key()) + "' is not a file name");
    const std::string &shard = it->get_ref<const std::string &>();
    if (shardPaths.count(shard))
      continue;
    StatusOr<std::string> path = pathInside(dir, shard, indexPath, "shard");
    if (!path)
      return path.status();
    shardPaths.emplace(shard, std::move(*path));
  }

  Checkpoint ckpt;
  ckpt.dir = dir;
  std::map<std::string, SafetensorsFile> shards;
  for (const auto &[shard, shardPath] : shardPaths) {
    StatusOr<SafetensorsFile> f = readHeaderImpl(shardPath);
    if (!f)
      return f.status();
    if (Status s = addTensors(ckpt, *f); !s)
      return s;
    shards.emplace(shard, std::move(*f));
  }
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    const SafetensorsFile &f = shards.at(it->get<std::string>());
    if (!f.tensors.count(it.key()))
      return fail(indexPath, "tensor '" + printable(it.key()) +
                                 "' is listed in weight_map but missing from "
                                 "shard '" +
                                 f.path + "'");
  }
  return ckpt;
}

} // namespace

std::optional<DType> parseDType(const std::string &s) {
  static const std::pair<const char *, DType> kNames[] = {
      {"F64", DType::F64},        {"F32", DType::F32},
      {"F16", DType::F16},        {"BF16", DType::BF16},
      {"I64", DType::I64},        {"I32", DType::I32},
      {"I16", DType::I16},        {"I8", DType::I8},
      {"U8", DType::U8},          {"BOOL", DType::Bool},
      {"F8_E4M3", DType::F8E4M3}, {"F8_E5M2", DType::F8E5M2}};
  for (const auto &[name, t] : kNames)
    if (s == name)
      return t;
  return std::nullopt;
}

const char *dtypeName(DType t) {
  switch (t) {
  case DType::F64:
    return "F64";
  case DType::F32:
    return "F32";
  case DType::F16:
    return "F16";
  case DType::BF16:
    return "BF16";
  case DType::I64:
    return "I64";
  case DType::I32:
    return "I32";
  case DType::I16:
    return "I16";
  case DType::I8:
    return "I8";
  case DType::U8:
    return "U8";
  case DType::Bool:
    return "BOOL";
  case DType::F8E4M3:
    return "F8_E4M3";
  case DType::F8E5M2:
    return "F8_E5M2";
  }
  return "?";
}

size_t dtypeSize(DType t) {
  switch (t) {
  case DType::F64:
  case DType::I64:
    return 8;
  case DType::F32:
  case DType::I32:
    return 4;
  case DType::F16:
  case DType::BF16:
  case DType::I16:
    return 2;
  case DType::I8:
  case DType::U8:
  case DType::Bool:
  case DType::F8E4M3:
  case DType::F8E5M2:
    return 1;
  }
  return 1;
}

bool isSupportedWeightDType(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

int64_t TensorInfo::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

StatusOr<SafetensorsFile> readSafetensorsHeader(const std::string &path) {
  // Belt and braces: the parser catches json errors itself, but nothing may
  // escape the public API (e.g. std::bad_alloc on a pathological header).
  try {
    return readHeaderImpl(path);
  } catch (const std::exception &e) {
    return fail(path, std::string("cannot read header: ") + e.what());
  }
}

const TensorInfo *Checkpoint::find(const std::string &name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

StatusOr<Checkpoint> openCheckpoint(const std::string &dir) {
  try {
    std::error_code ec;
    std::string indexPath =
        (fs::path(dir) / "model.safetensors.index.json").string();
    std::string singlePath = (fs::path(dir) / "model.safetensors").string();
    if (fs::exists(indexPath, ec))
      return openShardedCheckpoint(dir, indexPath);
    if (fs::exists(singlePath, ec)) {
      StatusOr<SafetensorsFile> f = readHeaderImpl(singlePath);
      if (!f)
        return f.status();
      Checkpoint ckpt;
      ckpt.dir = dir;
      if (Status s = addTensors(ckpt, *f); !s)
        return s;
      return ckpt;
    }
    if (!fs::exists(dir, ec))
      return fail(dir, "cannot open: No such file or directory");
    return fail(dir, "no model.safetensors or model.safetensors.index.json");
  } catch (const std::exception &e) {
    return fail(dir, std::string("cannot open checkpoint: ") + e.what());
  }
}

Status writeSafetensors(const std::string &path,
                        const std::vector<TensorData> &tensors,
                        const std::map<std::string, std::string> &metadata) {
  return writeSafetensors(
      path, tensors,
      [&](size_t i, std::string &bytes) {
        bytes.assign(tensors[i].bytes);
        return Status::success();
      },
      metadata);
}

Status writeSafetensors(const std::string &path,
                        const std::vector<TensorData> &tensors,
                        const TensorFill &fill,
                        const std::map<std::string, std::string> &metadata) {
  json header = json::object();
  if (!metadata.empty())
    header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const TensorData &t : tensors) {
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        return fail(path, "tensor '" + t.name + "' has shape " +
                              shapeString(t.shape));
      elements *= static_cast<uint64_t>(d);
    }
    const uint64_t bytes = elements * dtypeSize(t.dtype);
    if (t.name == "__metadata__" || header.contains(t.name))
      return fail(path, "tensor name '" + t.name + "' is used twice");
    header[t.name] = {{"dtype", dtypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    sizes.push_back(bytes);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' '); // data 8-byte aligned
  unsigned char size[8];
  for (int i = 0; i < 8; ++i)
    size[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp";
  std::unique_ptr<std::FILE, int (*)(std::FILE *)> f(
      std::fopen(tmp.c_str(), "wb"), &std::fclose);
  if (!f)
    return fail(path, std::string("cannot create: ") + std::strerror(errno));
  std::error_code ec;
  auto abandon = [&](const Status &why) {
    f.reset();
    fs::remove(tmp, ec);
    return why;
  };
  if (std::fwrite(size, 1, 8, f.get()) != 8 ||
      std::fwrite(text.data(), 1, text.size(), f.get()) != text.size())
    return abandon(
        fail(path, std::string("cannot write: ") + std::strerror(errno)));
  std::string bytes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    bytes.clear();
    if (Status s = fill(i, bytes); !s)
      return abandon(s);
    if (bytes.size() != sizes[i])
      return abandon(fail(path, "tensor '" + tensors[i].name + "' has " +
                                    std::to_string(bytes.size()) +
                                    " bytes for " +
                                    dtypeName(tensors[i].dtype) + " " +
                                    shapeString(tensors[i].shape)));
    if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
      return abandon(
          fail(path, std::string("cannot write: ") + std::strerror(errno)));
  }
  if (std::fclose(f.release()) != 0) {
    fs::remove(tmp, ec);
    return fail(path, std::string("cannot write: ") + std::strerror(errno));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return fail(path, "cannot rename into place: " + ec.message());
  }
  return Status::success();
}

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

} // namespace nf
