// Helpers shared by the unit tests: temporary directories and a tiny
// safetensors writer. The writer and the raw header reader here are written
// from the file format itself, independently of nf's parser, so that tests
// compare nf against them rather than against nf's own output.
#pragma once

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace nf::test {

using json = nlohmann::json;
namespace fs = std::filesystem;

inline std::string testDataDir() { return NF_TEST_DATA_DIR; }
inline std::string fixtureDir(const std::string &name) {
  return testDataDir() + "/fixtures/" + name;
}
inline std::string examplesDir() { return NF_EXAMPLES_DIR; }

/// A fresh directory under $TMPDIR, removed with its contents at scope end.
class TempDir {
public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "nf-unit-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      ADD_FAILURE() << "mkdtemp failed";
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;

  const std::string &path() const { return path_; }
  std::string file(const std::string &name) const {
    return (fs::path(path_) / name).string();
  }

private:
  std::string path_;
};

inline void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

/// A safetensors file from raw header text and `dataBytes` bytes of data.
inline std::string rawSafetensors(const std::string &headerText,
                                  size_t dataBytes) {
  return u64le(headerText.size()) + headerText + std::string(dataBytes, '\x5a');
}

/// Element sizes from the safetensors format description.
inline uint64_t elementBytes(const std::string &dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64")
    return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32")
    return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16")
    return 2;
  return 1;
}

struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

inline uint64_t specBytes(const TensorSpec &t) {
  uint64_t n = elementBytes(t.dtype);
  for (int64_t d : t.shape)
    n *= static_cast<uint64_t>(d);
  return n;
}

/// A well-formed safetensors file holding `tensors` back to back in the given
/// order (data bytes are a filler pattern).
inline std::string buildSafetensors(const std::vector<TensorSpec> &tensors,
                                    json metadata = json{{"format", "pt"}}) {
  json header = json::object();
  if (!metadata.is_null())
    header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec &t : tensors) {
    uint64_t n = specBytes(t);
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  return rawSafetensors(header.dump(), offset);
}

/// The header of a safetensors file, parsed directly with nlohmann::json.
inline json rawHeader(const std::string &path) {
  std::string bytes = readFile(path);
  if (bytes.size() < 8)
    return json();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return json::parse(bytes.substr(8, n));
}

inline uint64_t rawHeaderLength(const std::string &path) {
  std::string bytes = readFile(path).substr(0, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return n;
}

/// The tensors of a safetensors file in data order (for rewriting them).
inline std::vector<TensorSpec> rawTensorSpecs(const std::string &path) {
  json h = rawHeader(path);
  std::vector<std::pair<uint64_t, TensorSpec>> byOffset;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__")
      continue;
    byOffset.push_back({(*it)["data_offsets"][0].get<uint64_t>(),
                        {it.key(), (*it)["dtype"].get<std::string>(),
                         (*it)["shape"].get<std::vector<int64_t>>()}});
  }
  std::sort(byOffset.begin(), byOffset.end(),
            [](const auto &a, const auto &b) { return a.first < b.first; });
  std::vector<TensorSpec> out;
  for (auto &p : byOffset)
    out.push_back(std::move(p.second));
  return out;
}

inline TensorSpec *findSpec(std::vector<TensorSpec> &specs,
                            const std::string &name) {
  for (TensorSpec &s : specs)
    if (s.name == name)
      return &s;
  return nullptr;
}

inline void eraseSpec(std::vector<TensorSpec> &specs, const std::string &name) {
  std::erase_if(specs, [&](const TensorSpec &s) { return s.name == name; });
}

} // namespace nf::test
