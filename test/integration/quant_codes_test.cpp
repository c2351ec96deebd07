// Quantised weights bound as their codes (QuantForm::Codes, what the CUDA
// backend uploads: nf::weight_row_scales reads the scales after the codes)
// against the same plan bound dequantised (the CPU backend's f32 values):
// every element's code times its row's scale is the dequantised value,
// bit for bit, on tiny-nano with every projection quantised at compile time
// (tiny-nano-fp8: per-channel scales, concatenated and stacked weights), and
// on the ModelOpt checkpoint (per-tensor scales; its static activation
// quantisation has no CUDA kernels, so the codes form refuses it). Part of
// nf-plan-tests.
#include "engine/plan_loader.h"
#include "weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace {

using namespace nf;
using namespace nf::engine;

std::string planPath(const std::string &name) {
  return std::string(NF_PLAN_DIR) + "/" + name + ".nfb";
}

TEST(QuantCodes, CodesTimesRowScalesAreTheDequantisedWeights) {
  auto plan = openPlan(planPath("tiny-nano-fp8"));
  ASSERT_TRUE(plan) << plan.message();
  auto codes = bindWeights(**plan, "", QuantForm::Codes);
  ASSERT_TRUE(codes) << codes.message();
  auto values = bindWeights(**plan, "", QuantForm::Dequantised);
  ASSERT_TRUE(values) << values.message();
  ASSERT_EQ((*codes)->weights.size(), (*values)->weights.size());
  int quantised = 0, stacked = 0, concatenated = 0;
  for (size_t i = 0; i < (*codes)->weights.size(); ++i) {
    const BoundWeight &c = (*codes)->weights[i], &v = (*values)->weights[i];
    ASSERT_EQ(c.quantised, v.quantised) << "weight " << i;
    if (!c.quantised)
      continue;
    ++quantised;
    stacked += c.shape.size() == 3;
    concatenated += c.shape.size() == 2 && c.codeParts.size() > 1;
    EXPECT_FALSE(c.view.valid()) << "weight " << i;
    const int64_t cols = c.shape.back();
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < c.shape.size(); ++d)
      rows *= c.shape[d];
    ASSERT_EQ(static_cast<int64_t>(c.rowScales.size()), rows) << "weight " << i;
    // The dequantised values, row-major over the logical weight.
    ASSERT_TRUE(v.view.valid());
    ASSERT_EQ(v.view.dtype, DType::F32);
    const auto *f = static_cast<const float *>(v.view.data);
    int64_t row = 0;
    for (const WeightView &part : c.codeParts) {
      ASSERT_EQ(part.dtype, DType::F8E4M3);
      ASSERT_EQ(part.shape.size(), 2u);
      ASSERT_EQ(part.shape[1], cols);
      const auto *b = static_cast<const uint8_t *>(part.data);
      for (int64_t r = 0; r < part.shape[0]; ++r, ++row)
        for (int64_t k = 0; k < cols; ++k) {
          const float want = f[row * cols + k];
          const float got = e4m3ToF32(b[r * cols + k]) * c.rowScales[row];
          ASSERT_EQ(std::memcmp(&got, &want, 4), 0)
              << "weight " << i << " row " << row << " column " << k;
        }
    }
    EXPECT_EQ(row, rows) << "weight " << i;
  }
  // Every projection: 6 Mamba in/out, 1 attention's fused QKV and o, 6 MoE
  // layers' stacked up/down experts and shared experts (tiny-nano).
  EXPECT_GT(quantised, 0);
  EXPECT_GT(stacked, 0);
  EXPECT_GT(concatenated, 0);
}

TEST(QuantCodes, StaticActivationsHaveNoCodesForm) {
  auto plan = openPlan(planPath("tiny-nano-fp8-modelopt"));
  ASSERT_TRUE(plan) << plan.message();
  auto values = bindWeights(**plan, "", QuantForm::Dequantised);
  ASSERT_TRUE(values) << values.message();
  auto codes = bindWeights(**plan, "", QuantForm::Codes);
  ASSERT_FALSE(codes);
  EXPECT_NE(codes.message().find("StaticPerTensor activations have no CUDA "
                                 "kernels"),
            std::string::npos)
      << codes.message();
}

} // namespace
