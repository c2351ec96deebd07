// Quantised weights bound as their codes (QuantForm::Codes, what the CUDA
// backend uploads: nf::weight_row_scales reads the scales after the codes)
// against the same plan bound dequantised (the CPU backend's f32 values):
// every element's code times its row's (int4: its row's group's) scale is
// the dequantised value,
// bit for bit, and both forms quantise a linear's input alike (kind and
// every part's static input scale), on tiny-nano with every projection
// quantised at compile time (tiny-nano-fp8: per-channel scales, concatenated
// and stacked weights), on the ModelOpt checkpoint (per-tensor scales,
// static activation scales) and on llm-compressor's FP8_DYNAMIC
// (per-channel scales, per-token activation scales), and int4 codes with
// group scales: tiny-nano quantised at compile time (tiny-nano-int4) and
// llm-compressor's W4A16. Part of nf-plan-tests.
#include "engine/plan_loader.h"
#include "weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace {

using namespace nf;
using namespace nf::engine;
namespace pl = nf::plan;

std::string planPath(const std::string &name) {
  return std::string(NF_PLAN_DIR) + "/" + name + ".nfb";
}

/// Binds plan `name` both ways and compares every quantised weight; returns
/// how many there were, stacked and concatenated.
struct Counts {
  int quantised = 0, stacked = 0, concatenated = 0;
};
Counts compareForms(const std::string &name, pl::ActivationQuant inputs) {
  Counts n;
  auto plan = openPlan(planPath(name));
  EXPECT_TRUE(plan) << plan.message();
  if (!plan)
    return n;
  auto codes = bindWeights(**plan, "", QuantForm::Codes);
  EXPECT_TRUE(codes) << name << ": " << codes.message();
  auto values = bindWeights(**plan, "", QuantForm::Dequantised);
  EXPECT_TRUE(values) << name << ": " << values.message();
  if (!codes || !values)
    return n;
  EXPECT_EQ((*codes)->weights.size(), (*values)->weights.size());
  for (size_t i = 0; i < (*codes)->weights.size(); ++i) {
    const BoundWeight &c = (*codes)->weights[i], &v = (*values)->weights[i];
    const std::string what = name + " weight " + std::to_string(i);
    EXPECT_EQ(c.quantised, v.quantised) << what;
    if (!c.quantised)
      continue;
    ++n.quantised;
    n.stacked += c.shape.size() == 3;
    n.concatenated += c.shape.size() == 2 && c.codeParts.size() > 1;
    EXPECT_EQ(c.input.kind, inputs) << what;
    EXPECT_EQ(v.input.kind, inputs) << what;
    EXPECT_EQ(c.input.scales, v.input.scales) << what;
    if (inputs == pl::ActivationQuant::StaticPerTensor)
      EXPECT_FALSE(c.input.scales.empty()) << what;
    EXPECT_FALSE(c.view.valid()) << what;
    const int64_t cols = c.shape.back();
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < c.shape.size(); ++d)
      rows *= c.shape[d];
    // FP8: a scale a row; int4: one a group of each row.
    const bool int4 =
        !c.codeParts.empty() && c.codeParts[0].dtype == DType::I32;
    const int64_t perRow =
        int4 ? static_cast<int64_t>(c.rowScales.size()) / rows : 1;
    const int64_t group = cols / perRow;
    EXPECT_EQ(static_cast<int64_t>(c.rowScales.size()), rows * perRow) << what;
    EXPECT_EQ(group * perRow, cols) << what;
    // The dequantised values, row-major over the logical weight.
    EXPECT_TRUE(v.view.valid()) << what;
    if (!v.view.valid() || v.view.dtype != DType::F32 ||
        static_cast<int64_t>(c.rowScales.size()) != rows * perRow)
      continue;
    const auto *f = static_cast<const float *>(v.view.data);
    int64_t row = 0;
    for (const WeightView &part : c.codeParts) {
      EXPECT_EQ(part.dtype, int4 ? DType::I32 : DType::F8E4M3) << what;
      const int64_t width = int4 ? cols / 8 : cols;
      if (part.shape.size() != 2 || part.shape[1] != width || row >= rows) {
        ADD_FAILURE() << what << ": a part of the wrong shape";
        break;
      }
      const auto *b = static_cast<const uint8_t *>(part.data);
      for (int64_t r = 0; r < part.shape[0] && row < rows; ++r, ++row)
        for (int64_t k = 0; k < cols; ++k) {
          const float want = f[row * cols + k];
          float got;
          if (int4) {
            uint32_t word;
            std::memcpy(&word, b + 4 * (r * width + k / 8), 4);
            const int code = static_cast<int>((word >> 4 * (k % 8)) & 15) - 8;
            got = static_cast<float>(code) *
                  c.rowScales[row * perRow + k / group];
          } else {
            got = e4m3ToF32(b[r * cols + k]) * c.rowScales[row];
          }
          if (std::memcmp(&got, &want, 4) != 0) {
            ADD_FAILURE() << what << " row " << row << " column " << k << ": "
                          << got << " != " << want;
            return n;
          }
        }
    }
    EXPECT_EQ(row, rows) << what;
  }
  return n;
}

TEST(QuantCodes, CodesTimesRowScalesAreTheDequantisedWeights) {
  // Every projection: 6 Mamba in/out, 1 attention's fused QKV and o, 6 MoE
  // layers' stacked up/down experts and shared experts (tiny-nano).
  const Counts n = compareForms("tiny-nano-fp8", pl::ActivationQuant::None);
  EXPECT_GT(n.quantised, 0);
  EXPECT_GT(n.stacked, 0);
  EXPECT_GT(n.concatenated, 0);
}

TEST(QuantCodes, CheckpointsKeepTheirActivationQuantisation) {
  const Counts modelopt = compareForms("tiny-nano-fp8-modelopt",
                                       pl::ActivationQuant::StaticPerTensor);
  EXPECT_GT(modelopt.stacked, 0);
  EXPECT_GT(modelopt.concatenated, 0);
  const Counts dynamic = compareForms("tiny-nano-fp8-dynamic",
                                      pl::ActivationQuant::DynamicPerToken);
  EXPECT_GT(dynamic.quantised, 0);
}

TEST(QuantCodes, Int4CodesTimesGroupScalesAreTheDequantisedWeights) {
  // Compile-time int4 (groups of up to 128 columns) and llm-compressor's
  // W4A16 (groups of 8): the codes eight a word, the scales of each row's
  // groups.
  const Counts compiled =
      compareForms("tiny-nano-int4", pl::ActivationQuant::None);
  EXPECT_GT(compiled.stacked, 0);
  EXPECT_GT(compiled.concatenated, 0);
  const Counts w4a16 =
      compareForms("tiny-nano-w4a16", pl::ActivationQuant::None);
  EXPECT_GT(w4a16.stacked, 0);
}

} // namespace
