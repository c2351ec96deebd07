// nf/safetensors.h: header parsing, validation messages, checkpoint dirs.
#include "nf/safetensors.h"

#include "TestUtil.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace nf;
using namespace nf::test;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace {

// A one-tensor header as text, for the malformed-header cases.
std::string oneTensorHeader(const std::string &dtype, const std::string &shape,
                            const std::string &offsets) {
  return R"({"x": {"dtype": ")" + dtype + R"(", "shape": )" + shape +
         R"(, "data_offsets": )" + offsets + "}}";
}

// Writes `bytes` to dir/name and returns the header read back.
StatusOr<SafetensorsFile> roundTrip(const TempDir &dir,
                                    const std::string &bytes,
                                    const std::string &name = "t.safetensors") {
  writeFile(dir.file(name), bytes);
  return readSafetensorsHeader(dir.file(name));
}

} // namespace

//===----------------------------------------------------------------------===//
// DType helpers
//===----------------------------------------------------------------------===//

TEST(DType, ParsesEverySafetensorsSpelling) {
  struct Row {
    const char *name;
    DType t;
    size_t size;
    bool supported;
  };
  const Row rows[] = {{"F64", DType::F64, 8, false},
                      {"F32", DType::F32, 4, true},
                      {"F16", DType::F16, 2, true},
                      {"BF16", DType::BF16, 2, true},
                      {"I64", DType::I64, 8, false},
                      {"I32", DType::I32, 4, false},
                      {"I16", DType::I16, 2, false},
                      {"I8", DType::I8, 1, false},
                      {"U8", DType::U8, 1, false},
                      {"BOOL", DType::Bool, 1, false},
                      {"F8_E4M3", DType::F8E4M3, 1, false},
                      {"F8_E5M2", DType::F8E5M2, 1, false}};
  for (const Row &r : rows) {
    SCOPED_TRACE(r.name);
    std::optional<DType> t = parseDType(r.name);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(*t, r.t);
    EXPECT_STREQ(dtypeName(r.t), r.name);
    EXPECT_EQ(dtypeSize(r.t), r.size);
    EXPECT_EQ(isSupportedWeightDType(r.t), r.supported);
  }
}

TEST(DType, RejectsUnknownSpellings) {
  EXPECT_FALSE(parseDType("Q7"));
  EXPECT_FALSE(parseDType("f32")); // safetensors spellings are upper case
  EXPECT_FALSE(parseDType(""));
  EXPECT_FALSE(parseDType("float32"));
}

//===----------------------------------------------------------------------===//
// Real files
//===----------------------------------------------------------------------===//

// Every tensor of the fixture as nf reads it must match the header decoded
// directly from the bytes.
static void expectMatchesRawHeader(const std::string &path) {
  SCOPED_TRACE(path);
  StatusOr<SafetensorsFile> f = readSafetensorsHeader(path);
  ASSERT_TRUE(f.ok()) << f.message();
  json raw = rawHeader(path);
  uint64_t dataOffset = 8 + rawHeaderLength(path);
  EXPECT_EQ(f->path, path);
  EXPECT_EQ(f->fileSize, fs::file_size(path));
  EXPECT_EQ(f->dataOffset, dataOffset);
  EXPECT_EQ(f->tensors.size(), raw.size() - (raw.contains("__metadata__")));
  for (auto it = raw.begin(); it != raw.end(); ++it) {
    if (it.key() == "__metadata__") {
      for (auto m = it->begin(); m != it->end(); ++m)
        EXPECT_EQ(f->metadata.at(m.key()), m->get<std::string>());
      continue;
    }
    auto t = f->tensors.find(it.key());
    ASSERT_NE(t, f->tensors.end()) << it.key();
    EXPECT_EQ(t->second.name, it.key());
    EXPECT_STREQ(dtypeName(t->second.dtype),
                 (*it)["dtype"].get<std::string>().c_str());
    EXPECT_EQ(t->second.shape, (*it)["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t->second.dataBegin,
              dataOffset + (*it)["data_offsets"][0].get<uint64_t>());
    EXPECT_EQ(t->second.dataEnd,
              dataOffset + (*it)["data_offsets"][1].get<uint64_t>());
    EXPECT_EQ(t->second.file, path);
  }
}

TEST(SafetensorsHeader, ReadsEveryFixture) {
  for (const char *name : {"tiny-nano", "tiny-hybrid", "tiny-dense",
                           "tiny-latent", "tiny-hybrid-bf16"}) {
    expectMatchesRawHeader(fixtureDir(name) + "/model.safetensors");
    expectMatchesRawHeader(fixtureDir(name) + "/reference.safetensors");
  }
  expectMatchesRawHeader(examplesDir() + "/pydoc-moe/model.safetensors");
}

TEST(SafetensorsHeader, PydocMoeKnownTensor) {
  // Values from docs (Mamba in_proj rows = 2*I + 2*G*N + nh with I = 8*32,
  // G = 2, N = 32, nh = 8) and the bf16 model card.
  StatusOr<SafetensorsFile> f =
      readSafetensorsHeader(examplesDir() + "/pydoc-moe/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.message();
  const TensorInfo &t = f->tensors.at("backbone.layers.0.mixer.in_proj.weight");
  EXPECT_EQ(t.dtype, DType::BF16);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{648, 256}));
  EXPECT_EQ(t.numElements(), 648 * 256);
  EXPECT_EQ(t.dataEnd - t.dataBegin, 648u * 256u * 2u);
  EXPECT_EQ(f->metadata.at("format"), "pt");
}

//===----------------------------------------------------------------------===//
// Hand-made files
//===----------------------------------------------------------------------===//

TEST(SafetensorsHeader, SmallFileOffsetsAndScalars) {
  TempDir dir;
  std::string bytes = buildSafetensors({{"a", "F32", {2, 3}},
                                        {"s", "BF16", {}},
                                        {"empty", "F16", {0, 4}},
                                        {"b", "I8", {5}}});
  StatusOr<SafetensorsFile> f = roundTrip(dir, bytes);
  ASSERT_TRUE(f.ok()) << f.message();
  uint64_t d = f->dataOffset;
  EXPECT_EQ(f->fileSize, bytes.size());
  EXPECT_EQ(f->tensors.at("a").dataBegin, d + 0);
  EXPECT_EQ(f->tensors.at("a").dataEnd, d + 24);
  EXPECT_EQ(f->tensors.at("a").numElements(), 6);
  EXPECT_EQ(f->tensors.at("s").shape.size(), 0u);
  EXPECT_EQ(f->tensors.at("s").numElements(), 1);
  EXPECT_EQ(f->tensors.at("s").dataEnd - f->tensors.at("s").dataBegin, 2u);
  EXPECT_EQ(f->tensors.at("empty").numElements(), 0);
  EXPECT_EQ(f->tensors.at("b").dtype, DType::I8);
  EXPECT_EQ(f->tensors.at("b").dataEnd, d + 24 + 2 + 0 + 5);
}

TEST(SafetensorsHeader, NoMetadataAndSpacePadding) {
  TempDir dir;
  // The format allows trailing spaces to align the data section.
  std::string header = oneTensorHeader("F32", "[2]", "[0, 8]") + "        ";
  StatusOr<SafetensorsFile> f = roundTrip(dir, rawSafetensors(header, 8));
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_TRUE(f->metadata.empty());
  EXPECT_EQ(f->dataOffset, 8 + header.size());
}

TEST(SafetensorsHeader, MissingFile) {
  TempDir dir;
  std::string path = dir.file("nope.safetensors");
  StatusOr<SafetensorsFile> f = readSafetensorsHeader(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.message(), path + ": cannot open: No such file or directory");
}

TEST(SafetensorsHeader, DirectoryIsNotAFile) {
  TempDir dir;
  StatusOr<SafetensorsFile> f = readSafetensorsHeader(dir.path());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.message(), dir.path() + ": cannot open: Is a directory");
}

TEST(SafetensorsHeader, TruncatedFile) {
  TempDir dir;
  for (size_t n : {0, 1, 7}) {
    StatusOr<SafetensorsFile> f = roundTrip(dir, std::string(n, '\x01'));
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.message(),
              dir.file("t.safetensors") +
                  ": truncated file (shorter than the 8-byte header length)");
  }
}

TEST(SafetensorsHeader, HeaderLengthBeyondFile) {
  TempDir dir;
  std::string bytes = u64le(12345) + "{}" + std::string(10, ' ');
  StatusOr<SafetensorsFile> f = roundTrip(dir, bytes);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.message(), dir.file("t.safetensors") +
                             ": header length 12345 exceeds file size 20");
  // A length that would overflow 8 + N must not wrap around.
  f = roundTrip(dir, u64le(~0ull) + "{}");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.message(), HasSubstr("header length 18446744073709551615 "
                                     "exceeds file size 10"));
}

TEST(SafetensorsHeader, HeaderLengthCapped) {
  TempDir dir;
  std::string path = dir.file("big.safetensors");
  writeFile(path, u64le(150'000'000) + "{");
  fs::resize_file(path, 200'000'000); // sparse: costs no disk
  StatusOr<SafetensorsFile> f = readSafetensorsHeader(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.message(), path + ": header length 150000000 exceeds the limit "
                                "of 100000000 bytes");
}

TEST(SafetensorsHeader, BadJson) {
  TempDir dir;
  for (std::string header : {std::string("{\"x\": "), std::string("not json"),
                             std::string(""), std::string("{\"a\":1}}")}) {
    SCOPED_TRACE(header);
    StatusOr<SafetensorsFile> f = roundTrip(dir, rawSafetensors(header, 4));
    ASSERT_FALSE(f.ok());
    EXPECT_THAT(f.message(), StartsWith(dir.file("t.safetensors") +
                                        ": header is not valid JSON"));
  }
}

TEST(SafetensorsHeader, HeaderNotAnObject) {
  TempDir dir;
  StatusOr<SafetensorsFile> f = roundTrip(dir, rawSafetensors("[1, 2]", 0));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.message(),
            dir.file("t.safetensors") + ": header is not a JSON object");
}

TEST(SafetensorsHeader, UnknownDType) {
  TempDir dir;
  StatusOr<SafetensorsFile> f =
      roundTrip(dir, rawSafetensors(oneTensorHeader("Q7", "[2]", "[0, 8]"), 8));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.message(),
            dir.file("t.safetensors") + ": tensor 'x' has unknown dtype 'Q7'");
}

TEST(SafetensorsHeader, OffsetsDoNotMatchShape) {
  TempDir dir;
  StatusOr<SafetensorsFile> f = roundTrip(
      dir, rawSafetensors(oneTensorHeader("F32", "[2, 2]", "[0, 12]"), 16));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.message(),
            dir.file("t.safetensors") +
                ": tensor 'x' data range [0, 12) does not match shape [2, 2] "
                "x 4 bytes");
}

TEST(SafetensorsHeader, DataBeyondFile) {
  TempDir dir;
  StatusOr<SafetensorsFile> f = roundTrip(
      dir, rawSafetensors(oneTensorHeader("F32", "[4]", "[8, 24]"), 20));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.message(),
              StartsWith(dir.file("t.safetensors") +
                         ": tensor 'x' data range ends beyond the file"));
}

TEST(SafetensorsHeader, OverlappingTensors) {
  TempDir dir;
  std::string header =
      R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
          "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})";
  StatusOr<SafetensorsFile> f = roundTrip(dir, rawSafetensors(header, 24));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.message(), dir.file("t.safetensors") +
                             ": tensors 'a' and 'b' have overlapping data "
                             "ranges [0, 16) and [8, 24)");
}

TEST(SafetensorsHeader, MalformedEntries) {
  TempDir dir;
  std::string p = dir.file("t.safetensors");
  struct Case {
    std::string header;
    std::string message;
  };
  const Case cases[] = {
      {oneTensorHeader("F32", "[4]", "[16, 0]"),
       "tensor 'x' data_offsets [16, 0] end before they begin"},
      {oneTensorHeader("F32", "[-4]", "[0, 16]"),
       "tensor 'x' has an invalid shape [-4] (expected non-negative "
       "integers)"},
      {oneTensorHeader("F32", "[2.5]", "[0, 16]"),
       "tensor 'x' has an invalid shape [2.5] (expected non-negative "
       "integers)"},
      {oneTensorHeader("F32", "\"4\"", "[0, 16]"),
       "tensor 'x' has no 'shape' array"},
      {oneTensorHeader("F32", "[4]", "[0]"),
       "tensor 'x' has invalid 'data_offsets' (expected [begin, end] "
       "non-negative integers)"},
      {oneTensorHeader("F32", "[4]", "[0, -16]"),
       "tensor 'x' has invalid 'data_offsets' (expected [begin, end] "
       "non-negative integers)"},
      {R"({"x": {"shape": [4], "data_offsets": [0, 16]}})",
       "tensor 'x' has no 'dtype' string"},
      {R"({"x": [1, 2]})", "tensor 'x' is not a JSON object"},
      {R"({"__metadata__": {"format": 1}})",
       "'__metadata__' value for 'format' is not a string"},
      {R"({"__metadata__": "pt"})", "'__metadata__' is not a JSON object"},
      {oneTensorHeader("F32", "[4294967296, 4294967296]", "[0, 16]"),
       "tensor 'x' shape [4294967296,4294967296] is too large"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.header);
    StatusOr<SafetensorsFile> f = roundTrip(dir, rawSafetensors(c.header, 16));
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.message(), p + ": " + c.message);
  }
}

//===----------------------------------------------------------------------===//
// Checkpoint directories
//===----------------------------------------------------------------------===//

TEST(Checkpoint, SingleFile) {
  std::string dir = fixtureDir("tiny-dense");
  StatusOr<Checkpoint> c = openCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.message();
  std::string file = (fs::path(dir) / "model.safetensors").string();
  EXPECT_EQ(c->dir, dir);
  EXPECT_EQ(c->files, std::vector<std::string>{file});
  json raw = rawHeader(file);
  EXPECT_EQ(c->tensors.size(), raw.size() - 1); // minus __metadata__
  const TensorInfo *t = c->find("backbone.layers.1.mixer.up_proj.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{160, 64})); // intermediate_size
  EXPECT_EQ(t->file, file);
  EXPECT_EQ(c->find("backbone.layers.1.mixer.nothing"), nullptr);
}

TEST(Checkpoint, EmptyDirectory) {
  TempDir dir;
  StatusOr<Checkpoint> c = openCheckpoint(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.message(),
            dir.path() +
                ": no model.safetensors or model.safetensors.index.json");
}

TEST(Checkpoint, MissingDirectory) {
  TempDir dir;
  std::string missing = dir.file("gone");
  StatusOr<Checkpoint> c = openCheckpoint(missing);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.message(), missing + ": cannot open: No such file or directory");
}

TEST(Checkpoint, BadSingleFileReportsTheFile) {
  TempDir dir;
  writeFile(dir.file("model.safetensors"), "abc");
  StatusOr<Checkpoint> c = openCheckpoint(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.message(),
            dir.file("model.safetensors") +
                ": truncated file (shorter than the 8-byte header length)");
}

namespace {

// Two shards plus an index; `extraIndexEntries` are added to weight_map.
void writeShardedCheckpoint(const TempDir &dir, json extraIndexEntries = {}) {
  writeFile(dir.file("model-00001-of-00002.safetensors"),
            buildSafetensors({{"a", "F32", {2, 2}}, {"b", "BF16", {3}}}));
  writeFile(dir.file("model-00002-of-00002.safetensors"),
            buildSafetensors({{"c", "F16", {4}}}));
  json index = {{"metadata", {{"total_size", 16 + 6 + 8}}},
                {"weight_map",
                 {{"a", "model-00001-of-00002.safetensors"},
                  {"c", "model-00002-of-00002.safetensors"},
                  {"b", "model-00001-of-00002.safetensors"}}}};
  for (auto it = extraIndexEntries.begin(); it != extraIndexEntries.end(); ++it)
    index["weight_map"][it.key()] = *it;
  writeFile(dir.file("model.safetensors.index.json"), index.dump(2));
}

} // namespace

TEST(Checkpoint, ShardedWithIndex) {
  TempDir dir;
  writeShardedCheckpoint(dir);
  // The index wins over a stray single file.
  writeFile(dir.file("model.safetensors"), "garbage");
  StatusOr<Checkpoint> c = openCheckpoint(dir.path());
  ASSERT_TRUE(c.ok()) << c.message();
  std::string s1 = dir.file("model-00001-of-00002.safetensors");
  std::string s2 = dir.file("model-00002-of-00002.safetensors");
  EXPECT_EQ(c->files, (std::vector<std::string>{s1, s2}));
  ASSERT_EQ(c->tensors.size(), 3u);
  EXPECT_EQ(c->find("a")->file, s1);
  EXPECT_EQ(c->find("b")->file, s1);
  EXPECT_EQ(c->find("b")->dtype, DType::BF16);
  EXPECT_EQ(c->find("c")->file, s2);
  EXPECT_EQ(c->find("c")->shape, std::vector<int64_t>{4});
}

TEST(Checkpoint, IndexNamesMissingTensor) {
  TempDir dir;
  writeShardedCheckpoint(dir, {{"d", "model-00002-of-00002.safetensors"}});
  StatusOr<Checkpoint> c = openCheckpoint(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.message(), dir.file("model.safetensors.index.json") +
                             ": tensor 'd' is listed in weight_map but "
                             "missing from shard '" +
                             dir.file("model-00002-of-00002.safetensors") +
                             "'");
}

TEST(Checkpoint, IndexNamesMissingShard) {
  TempDir dir;
  writeShardedCheckpoint(dir, {{"e", "model-00003-of-00002.safetensors"}});
  StatusOr<Checkpoint> c = openCheckpoint(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.message(), dir.file("model-00003-of-00002.safetensors") +
                             ": cannot open: No such file or directory");
}

TEST(Checkpoint, IndexNamesFileOutsideTheDirectory) {
  TempDir outer;
  fs::create_directory(outer.file("ckpt"));
  std::string dir = outer.file("ckpt");
  // A valid shard outside the checkpoint directory: following the index to it
  // would read any file the user can read.
  writeFile(outer.file("outside.safetensors"),
            buildSafetensors({{"a", "F32", {2}}}));
  std::string index = dir + "/model.safetensors.index.json";
  for (const std::string &shard : std::vector<std::string>{
           "../outside.safetensors", outer.file("outside.safetensors"),
           "sub/../../outside.safetensors"}) {
    SCOPED_TRACE(shard);
    writeFile(index, json{{"weight_map", {{"a", shard}}}}.dump());
    StatusOr<Checkpoint> c = openCheckpoint(dir);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.message(), index + ": shard '" + shard +
                               "' is not a file name inside the checkpoint "
                               "directory");
  }
  // Subdirectories of the checkpoint are inside it.
  fs::create_directory(dir + "/sub");
  writeFile(dir + "/sub/s.safetensors", buildSafetensors({{"a", "F32", {2}}}));
  writeFile(index, R"({"weight_map": {"a": "sub/s.safetensors"}})");
  StatusOr<Checkpoint> c = openCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->find("a")->file, dir + "/sub/s.safetensors");
}

TEST(Checkpoint, MalformedIndex) {
  TempDir dir;
  std::string index = dir.file("model.safetensors.index.json");
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"{", "not valid JSON (error at byte 2)"},
      {"[]", "not a JSON object"},
      {R"({"metadata": {}})", "missing 'weight_map' object"},
      {R"({"weight_map": {}})", "'weight_map' is empty"},
      {R"({"weight_map": {"a": 3}})",
       "weight_map entry for tensor 'a' is not a file name"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.text);
    writeFile(index, c.text);
    StatusOr<Checkpoint> ck = openCheckpoint(dir.path());
    ASSERT_FALSE(ck.ok());
    EXPECT_EQ(ck.message(), index + ": " + c.message);
  }
}

TEST(Checkpoint, TensorInTwoShards) {
  TempDir dir;
  writeFile(dir.file("s1.safetensors"), buildSafetensors({{"a", "F32", {2}}}));
  writeFile(dir.file("s2.safetensors"), buildSafetensors({{"a", "F32", {2}}}));
  writeFile(
      dir.file("model.safetensors.index.json"),
      R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  StatusOr<Checkpoint> c = openCheckpoint(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.message(), dir.file("s2.safetensors") +
                             ": tensor 'a' also appears in '" +
                             dir.file("s1.safetensors") + "'");
}

//===----------------------------------------------------------------------===//
// Robustness
//===----------------------------------------------------------------------===//

TEST(SafetensorsHeader, ControlCharactersAreEscaped) {
  TempDir dir;
  StatusOr<SafetensorsFile> f = roundTrip(
      dir, rawSafetensors(R"({"a\nb": {"dtype": "Q\t7", "shape": [1], )"
                          R"("data_offsets": [0, 4]}})",
                          4));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.message(), dir.file("t.safetensors") +
                             ": tensor 'a\\x0ab' has unknown dtype 'Q\\x097'");
}

TEST(SafetensorsHeader, DeeplyNestedHeader) {
  TempDir dir;
  std::string header(200000, '[');
  StatusOr<SafetensorsFile> f = roundTrip(dir, rawSafetensors(header, 0));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.message(), HasSubstr("header is not valid JSON"));
}

TEST(SafetensorsHeader, RandomCorruptionNeverEscapes) {
  // Deterministic byte flips and truncations of a valid file: every outcome
  // is either a consistent header or a one-line message naming the file.
  TempDir dir;
  const std::string good = buildSafetensors(
      {{"w", "F32", {3, 4}}, {"b", "BF16", {4}}, {"n", "I64", {2}}});
  const std::string path = dir.file("t.safetensors");
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = good;
    int flips = 1 + next() % 4;
    for (int k = 0; k < flips; ++k)
      bytes[next() % bytes.size()] = static_cast<char>(next() & 0xff);
    if (next() % 5 == 0)
      bytes.resize(next() % bytes.size());
    writeFile(path, bytes);
    StatusOr<SafetensorsFile> f = readSafetensorsHeader(path);
    if (!f.ok()) {
      EXPECT_THAT(f.message(), StartsWith(path + ": "));
      EXPECT_EQ(f.message().find('\n'), std::string::npos) << f.message();
      continue;
    }
    for (const auto &[name, t] : f->tensors) {
      EXPECT_GE(t.dataBegin, f->dataOffset);
      EXPECT_LE(t.dataBegin, t.dataEnd);
      EXPECT_LE(t.dataEnd, f->fileSize);
      EXPECT_EQ(t.dataEnd - t.dataBegin,
                static_cast<uint64_t>(t.numElements()) * dtypeSize(t.dtype));
    }
  }
}
