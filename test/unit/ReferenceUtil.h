// Reference data of the fixtures (test/data/fixtures/*/reference.safetensors,
// examples/pydoc-moe/reference.safetensors; keys in manifest.json) and the
// comparisons the CPU tests make against them. Shared by the unit tests of
// the reference executor and the plan integration tests.
#pragma once

#include "nf/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace nf::test::ref {

// ---------------------------------------------------------------------------
// Reference tensors: header via readSafetensorsHeader, bytes read directly.

class RefFile {
public:
  explicit RefFile(const std::string &path) : path_(path) {
    StatusOr<SafetensorsFile> h = readSafetensorsHeader(path);
    if (!h) {
      ADD_FAILURE() << h.message();
      return;
    }
    header_ = std::move(*h);
  }
  bool has(const std::string &name) const {
    return header_.tensors.count(name) != 0;
  }
  std::vector<int64_t> shape(const std::string &name) const {
    return header_.tensors.at(name).shape;
  }
  std::vector<float> f32(const std::string &name) const {
    return read<float>(name, DType::F32);
  }
  std::vector<int64_t> i64(const std::string &name) const {
    return read<int64_t>(name, DType::I64);
  }

private:
  template <typename T>
  std::vector<T> read(const std::string &name, DType want) const {
    auto it = header_.tensors.find(name);
    if (it == header_.tensors.end()) {
      ADD_FAILURE() << path_ << ": no tensor " << name;
      return {};
    }
    const TensorInfo &t = it->second;
    EXPECT_EQ(t.dtype, want) << name;
    std::vector<T> out(static_cast<size_t>(t.numElements()));
    std::ifstream in(path_, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(t.dataBegin));
    in.read(reinterpret_cast<char *>(out.data()),
            static_cast<std::streamsize>(t.dataEnd - t.dataBegin));
    EXPECT_TRUE(in.good()) << path_ << ": reading " << name;
    return out;
  }
  std::string path_;
  SafetensorsFile header_;
};

// ---------------------------------------------------------------------------
// Comparison helpers

/// max|ours - ref| / max(1, max|ref|).
inline double relError(const float *ours, const float *ref, size_t n) {
  double maxDiff = 0, maxRef = 1;
  for (size_t i = 0; i < n; ++i) {
    maxDiff = std::max(maxDiff, std::fabs(double(ours[i]) - double(ref[i])));
    maxRef = std::max(maxRef, std::fabs(double(ref[i])));
  }
  return maxDiff / maxRef;
}

inline int32_t argmax(const float *row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

constexpr double kTol = 1e-4;

struct Prompt {
  std::vector<int32_t> tokens;
  std::vector<float> prefillLogits; // [T, V]
  std::vector<int64_t> greedyTokens;
  std::vector<float> greedyLogits; // [S, V], may be empty
};

inline std::vector<Prompt> loadPrompts(const RefFile &ref) {
  std::vector<Prompt> out;
  for (int i = 0;; ++i) {
    const std::string p = "p" + std::to_string(i) + ".";
    if (!ref.has(p + "tokens"))
      break;
    Prompt pr;
    for (int64_t t : ref.i64(p + "tokens"))
      pr.tokens.push_back(static_cast<int32_t>(t));
    pr.prefillLogits = ref.f32(p + "prefill_logits");
    pr.greedyTokens = ref.i64(p + "greedy_tokens");
    if (ref.has(p + "greedy_logits"))
      pr.greedyLogits = ref.f32(p + "greedy_logits");
    out.push_back(std::move(pr));
  }
  return out;
}

} // namespace nf::test::ref
