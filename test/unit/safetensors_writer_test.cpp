// nf/safetensors.h writeSafetensors (what nfc compile --weights writes) and
// the E4M3 codes of weights.h, read back through the runtime's own readers.
#include "nf/safetensors.h"
#include "weights.h"

#include "TestUtil.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

using namespace nf;
using namespace nf::test;
using ::testing::HasSubstr;

namespace {

std::string bytesOf(const void *p, size_t n) {
  return std::string(static_cast<const char *>(p), n);
}

} // namespace

TEST(SafetensorsWriter, RoundTripsThroughTheReaders) {
  TempDir dir;
  const float f[6] = {1.5f, -2.0f, 0.25f, 3.0f, -0.0f, 7.0f};
  const uint8_t codes[4] = {0x00, 0x38, 0xb8, 0x7e};
  const int32_t words[2] = {0x12345678, -1};
  const std::string path = dir.file("w.safetensors");
  ASSERT_TRUE(writeSafetensors(
      path,
      {{"a.f32", DType::F32, {2, 3}, bytesOf(f, sizeof f)},
       {"b.fp8", DType::F8E4M3, {2, 2}, bytesOf(codes, sizeof codes)},
       {"c.words", DType::I32, {1, 2}, bytesOf(words, sizeof words)}},
      {{"format", "pt"}}));
  StatusOr<SafetensorsFile> header = readSafetensorsHeader(path);
  ASSERT_TRUE(header) << header.message();
  EXPECT_EQ(header->tensors.size(), 3u);
  EXPECT_EQ(header->metadata.at("format"), "pt");
  EXPECT_EQ(header->dataOffset % 8, 0u);
  StatusOr<WeightStore> store = WeightStore::openFile(path);
  ASSERT_TRUE(store) << store.message();
  auto a = store->find("a.f32");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(a->data, f, sizeof f), 0);
  auto b = store->find("b.fp8");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->dtype, DType::F8E4M3);
  EXPECT_EQ(std::memcmp(b->data, codes, sizeof codes), 0);
  auto c = store->find("c.words");
  ASSERT_TRUE(c);
  EXPECT_EQ(std::memcmp(c->data, words, sizeof words), 0);
}

TEST(SafetensorsWriter, FailureLeavesTheOldFileAndNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  writeFile(path, "previous contents");
  const float f[2] = {1.0f, 2.0f};
  // The bytes do not fit the shape.
  Status s = writeSafetensors(path, {{"x", DType::F32, {3}, bytesOf(f, 8)}});
  ASSERT_FALSE(s);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'x' has 8 bytes for F32 [3]"));
  // The producer fails half way.
  s = writeSafetensors(
      path, {{"x", DType::F32, {2}, {}}, {"y", DType::F32, {2}, {}}},
      [&](size_t i, std::string &bytes) {
        if (i == 1)
          return Status::error("source: tensor 'y' is unreadable");
        bytes = bytesOf(f, sizeof f);
        return Status::success();
      });
  ASSERT_FALSE(s);
  EXPECT_EQ(s.message(), "source: tensor 'y' is unreadable");
  // A name used twice.
  s = writeSafetensors(path, {{"x", DType::F32, {2}, bytesOf(f, 8)},
                              {"x", DType::F32, {2}, bytesOf(f, 8)}});
  ASSERT_FALSE(s);
  EXPECT_THAT(s.message(), HasSubstr("tensor name 'x' is used twice"));
  EXPECT_EQ(readFile(path), "previous contents");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SafetensorsWriter, UnwritableDirectoryIsOneError) {
  Status s = writeSafetensors("/nonexistent-dir/w.safetensors",
                              {{"x", DType::F32, {0}, {}}});
  ASSERT_FALSE(s);
  EXPECT_THAT(s.message(),
              HasSubstr("/nonexistent-dir/w.safetensors: cannot create"));
}

TEST(E4M3Codes, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f)
      continue; // NaN
    EXPECT_EQ(e4m3Code(e4m3ToF32(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(E4M3Codes, RoundsToNearestEvenAndSaturates) {
  // 168 lies halfway between 160 (mantissa 010) and 176 (011): even wins.
  EXPECT_EQ(e4m3ToF32(e4m3Code(168.0f)), 160.0f);
  EXPECT_EQ(e4m3ToF32(e4m3Code(168.01f)), 176.0f);
  EXPECT_EQ(e4m3ToF32(e4m3Code(-168.0f)), -160.0f);
  // Subnormals: spacing 2^-9; half of the smallest rounds to zero.
  EXPECT_EQ(e4m3ToF32(e4m3Code(std::ldexp(1.0f, -10))), 0.0f);
  EXPECT_EQ(e4m3ToF32(e4m3Code(std::ldexp(3.0f, -10))), std::ldexp(2.0f, -9));
  EXPECT_EQ(e4m3Code(1000.0f), 0x7e); // 448
  EXPECT_EQ(e4m3Code(-1000.0f), 0xfe);
  EXPECT_EQ(e4m3Code(std::nanf("")), 0x7f);
}
