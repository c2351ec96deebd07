// nf::Engine::load on broken plans (truncated, wrong identifier, corrupted
// bytes, unsupported versions, missing tables) and broken weights (missing
// file, wrong shapes and dtypes, missing tensors): clean one-line errors
// naming the file. Part of nf-plan-tests (CPU backend), on the tiny-hybrid
// plan compiled by this build's nfc.
#include "engine/engine.h"
#include "nf/plan_generated.h"
#include "nf/plan_version.h"

#include "TestUtil.h"
#include "engine_test_util.h"

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace nf;
using namespace nf::test::integration;
namespace fs = std::filesystem;

std::string planPath(const std::string &name) {
  return std::string(NF_PLAN_DIR) + "/" + name + ".nfb";
}

// ---------------------------------------------------------------------------
// Load errors: broken plans

class PlanLoadErrors : public ::testing::Test {
protected:
  void SetUp() override { bytes_ = test::readFile(planPath("tiny-hybrid")); }

  /// Loads `bytes` written to a temporary plan; expects an error naming the
  /// file and containing `what`.
  void expectError(const std::string &bytes, const std::string &what) {
    const std::string path = dir_.file("broken.nfb");
    test::writeFile(path, bytes);
    StatusOr<std::unique_ptr<Engine>> e = Engine::load(path, testOptions());
    ASSERT_FALSE(e.ok()) << what;
    EXPECT_EQ(e.message().rfind(path + ": ", 0), 0u) << e.message();
    EXPECT_NE(e.message().find(what), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find('\n'), std::string::npos);
  }

  /// Byte offset of a field of the root Plan table (0: not stored).
  size_t fieldOffset(flatbuffers::voffset_t field, bool required = true) const {
    const uint8_t *buf = reinterpret_cast<const uint8_t *>(bytes_.data());
    auto *t =
        reinterpret_cast<const flatbuffers::Table *>(nf::plan::GetPlan(buf));
    const uint8_t *at = t->GetAddressOf(field);
    if (required)
      EXPECT_NE(at, nullptr);
    return at ? static_cast<size_t>(at - buf) : 0;
  }

  void patchU32(std::string &bytes, size_t at, uint32_t v) {
    std::memcpy(bytes.data() + at, &v, 4);
  }

  std::string bytes_;
  test::TempDir dir_;
};

TEST_F(PlanLoadErrors, MissingFile) {
  StatusOr<std::unique_ptr<Engine>> e =
      Engine::load(dir_.file("none.nfb"), testOptions());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find(dir_.file("none.nfb")), std::string::npos);
}

TEST_F(PlanLoadErrors, Truncated) {
  ASSERT_GT(bytes_.size(), 1000u);
  expectError(bytes_.substr(0, 6), "too small");
  expectError(bytes_.substr(0, bytes_.size() / 2), "truncated");
  expectError(bytes_.substr(0, bytes_.size() - 16), "truncated");
}

TEST_F(PlanLoadErrors, WrongIdentifier) {
  std::string b = bytes_;
  std::memcpy(b.data() + 4, "NFPX", 4);
  expectError(b, "not an nf plan (file identifier 'NFPX', expected 'NFPL')");
}

TEST_F(PlanLoadErrors, CorruptedBytesFailVerification) {
  // An offset to a sub-table pointing far outside the file.
  std::string b = bytes_;
  patchU32(b, fieldOffset(nf::plan::Plan::VT_DECODE), 0x7ffffff0u);
  expectError(b, "flatbuffers verification failed");
  // The root table's vtable pointer.
  b = bytes_;
  const uint32_t root = flatbuffers::ReadScalar<uint32_t>(b.data());
  patchU32(b, root, 0x7ffffff0u);
  expectError(b, "corrupted");
  // A kernel op's operand vector length.
  b = bytes_;
  patchU32(b, fieldOffset(nf::plan::Plan::VT_WEIGHTS), 0xfffffff0u);
  expectError(b, "verification failed");
}

TEST_F(PlanLoadErrors, UnsupportedVersion) {
  std::string b = bytes_;
  const size_t major = fieldOffset(nf::plan::Plan::VT_VERSION_MAJOR);
  ASSERT_EQ(flatbuffers::ReadScalar<uint32_t>(b.data() + major),
            kPlanVersionMajor);
  patchU32(b, major, kPlanVersionMajor + 1);
  const std::string path = dir_.file("broken.nfb");
  expectError(b, "plan format version " +
                     std::to_string(kPlanVersionMajor + 1) + "." +
                     std::to_string(kPlanVersionMinor) +
                     " is not supported by this runtime (reads " +
                     std::to_string(kPlanVersionMajor) + ".x)");
  StatusOr<std::unique_ptr<Engine>> e = Engine::load(path, testOptions());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.message(), path + ": plan format version 2." +
                             std::to_string(kPlanVersionMinor) +
                             " is not supported by this runtime (reads 1.x)");

  // A newer minor version (fields this runtime does not know) is refused.
  b = bytes_;
  const size_t minor =
      fieldOffset(nf::plan::Plan::VT_VERSION_MINOR, /*required=*/false);
  if (minor != 0) { // minor 0 may be omitted (default value)
    patchU32(b, minor, kPlanVersionMinor + 1);
    expectError(b, "is not supported by this runtime");
  }
}

TEST_F(PlanLoadErrors, NewerMinorVersionAndMissingSteps) {
  // Minimal plans built with the flatbuffers API: the version is checked
  // before anything else, then the tables every backend needs.
  auto build = [](uint32_t major, uint32_t minor) {
    flatbuffers::FlatBufferBuilder b;
    nf::plan::FinishPlanBuffer(b, nf::plan::CreatePlan(b, major, minor));
    return std::string(reinterpret_cast<const char *>(b.GetBufferPointer()),
                       b.GetSize());
  };
  expectError(build(kPlanVersionMajor, kPlanVersionMinor + 1),
              "plan format version " + std::to_string(kPlanVersionMajor) + "." +
                  std::to_string(kPlanVersionMinor + 1) +
                  " is not supported by this runtime");
  expectError(build(kPlanVersionMajor + 1, 0), "(reads 1.x)");
  expectError(build(kPlanVersionMajor, kPlanVersionMinor), "no model config");
}

// ---------------------------------------------------------------------------
// Load errors: broken weights

class WeightLoadErrors : public ::testing::Test {
protected:
  void SetUp() override {
    specs_ = test::rawTensorSpecs(test::fixtureDir("tiny-hybrid") +
                                  "/model.safetensors");
    ASSERT_FALSE(specs_.empty());
  }

  StatusOr<std::unique_ptr<Engine>> loadWith(const std::string &dir) {
    EngineOptions o = testOptions();
    o.weightsDir = dir;
    return Engine::load(planPath("tiny-hybrid"), o);
  }

  /// Writes the fixture's tensors (filler data) with `edit` applied and
  /// expects exactly `message` (with <file> for the weights file).
  void
  expectError(const std::function<void(std::vector<test::TensorSpec> &)> &edit,
              const std::string &message) {
    test::TempDir dir;
    std::vector<test::TensorSpec> specs = specs_;
    edit(specs);
    const std::string file = dir.file("model.safetensors");
    test::writeFile(file, test::buildSafetensors(specs));
    StatusOr<std::unique_ptr<Engine>> e = loadWith(dir.path());
    ASSERT_FALSE(e.ok()) << message;
    std::string want = message;
    if (want.rfind("<file>", 0) == 0)
      want = file + want.substr(6);
    EXPECT_EQ(e.message(), want);
  }

  std::vector<test::TensorSpec> specs_;
};

TEST_F(WeightLoadErrors, MissingFile) {
  test::TempDir dir;
  StatusOr<std::unique_ptr<Engine>> e = loadWith(dir.path());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.message(),
            dir.path() + ": missing weights file model.safetensors");
}

TEST_F(WeightLoadErrors, CopyOfTheCheckpointLoads) {
  test::TempDir dir;
  fs::copy_file(test::fixtureDir("tiny-hybrid") + "/model.safetensors",
                dir.file("model.safetensors"));
  StatusOr<std::unique_ptr<Engine>> e = loadWith(dir.path());
  ASSERT_TRUE(e.ok()) << e.message();
  EXPECT_EQ((*e)->info().weightsDir, dir.path());
}

TEST_F(WeightLoadErrors, WrongShape) {
  const std::string t = "backbone.layers.0.mixer.out_proj.weight";
  expectError(
      [&](auto &specs) {
        test::findSpec(specs, t)->shape = {63, 128};
      },
      "<file>: tensor '" + t + "' has shape [63, 128], expected [64, 128]");
}

TEST_F(WeightLoadErrors, WrongDtype) {
  const std::string t = "backbone.layers.3.mixer.dt_bias";
  expectError([&](auto &specs) { test::findSpec(specs, t)->dtype = "BF16"; },
              "<file>: tensor '" + t + "' has dtype BF16, expected F32");
}

TEST_F(WeightLoadErrors, MissingTensor) {
  expectError([&](auto &specs) { test::eraseSpec(specs, "lm_head.weight"); },
              "<file>: no tensor 'lm_head.weight'");
}

TEST_F(WeightLoadErrors, WrongExpertShape) {
  const std::string t = "backbone.layers.5.mixer.experts.3.up_proj.weight";
  expectError(
      [&](auto &specs) {
        test::findSpec(specs, t)->shape = {31, 64};
      },
      "<file>: tensor '" + t + "' has shape [31, 64], expected [32, 64]");
}

TEST_F(WeightLoadErrors, WrongConcatenatedRows) {
  const std::string t = "backbone.layers.7.mixer.k_proj.weight";
  expectError(
      [&](auto &specs) {
        test::findSpec(specs, t)->shape = {33, 64};
      },
      "<file>: tensor '" + t + "' has shape [33, 64], expected [32, 64]");
}

} // namespace
