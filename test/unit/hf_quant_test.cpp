// hf/HFQuant.h: the quantisation a checkpoint declares (hf_quant_config.json,
// config.json's quantization_config) and its binding to the scale tensors,
// checked against the quantised fixtures and their READMEs.
#include "hf/HFConfig.h"

#include "TestUtil.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

using namespace nf;
using namespace nf::hf;
using namespace nf::test;
using ::testing::HasSubstr;

namespace {

const char *kQuantFixtures[] = {"tiny-nano-fp8-modelopt",
                                "tiny-nano-fp8-dynamic", "tiny-nano-w4a16"};

json fixtureConfig(const std::string &name) {
  return json::parse(readFile(fixtureDir(name) + "/config.json"));
}

/// A compressed-tensors quantization_config with one FP8 group.
json fp8Group() {
  return {{"format", "float-quantized"},
          {"targets", {"Linear"}},
          {"weights",
           {{"type", "float"},
            {"num_bits", 8},
            {"strategy", "channel"},
            {"symmetric", true},
            {"dynamic", false}}},
          {"input_activations",
           {{"type", "float"},
            {"num_bits", 8},
            {"strategy", "token"},
            {"dynamic", true}}}};
}

StatusOr<ModelConfig> withQuantConfig(const json &qc) {
  json cfg = fixtureConfig("tiny-nano");
  cfg["quantization_config"] = qc;
  return parseConfigText(cfg.dump(), "cfg.json");
}

std::string quantError(const json &qc) {
  StatusOr<ModelConfig> c = withQuantConfig(qc);
  EXPECT_FALSE(c.ok()) << "parsed unexpectedly: " << qc.dump();
  return c.ok() ? std::string() : c.message();
}

struct Bound {
  ModelConfig config;
  ModelBinding binding;
};

Bound bindFixture(const std::string &name) {
  StatusOr<ModelConfig> c = parseCheckpointConfig(fixtureDir(name));
  EXPECT_TRUE(c.ok()) << c.message();
  StatusOr<Checkpoint> k = openCheckpoint(fixtureDir(name));
  EXPECT_TRUE(k.ok()) << k.message();
  if (!c.ok() || !k.ok())
    return {};
  StatusOr<ModelBinding> b = bindCheckpoint(*c, *k);
  EXPECT_TRUE(b.ok()) << b.message();
  return {*c, b.ok() ? *b : ModelBinding{}};
}

std::vector<const WeightBinding *> allWeights(const ModelBinding &b) {
  std::vector<const WeightBinding *> out = {&b.embedding, &b.finalNorm,
                                            &b.lmHead};
  for (const LayerBinding &l : b.layers) {
    out.push_back(&l.norm);
    for (const WeightBinding &w : l.mixer)
      out.push_back(&w);
  }
  return out;
}

} // namespace

//===----------------------------------------------------------------------===//
// Declared quantisation
//===----------------------------------------------------------------------===//

TEST(QuantConfig, ModelOptDescriptorWinsAndLosesTheSentinel) {
  const std::string dir = fixtureDir("tiny-nano-fp8-modelopt");
  StatusOr<ModelConfig> c = parseCheckpointConfig(dir);
  ASSERT_TRUE(c.ok()) << c.message();
  ASSERT_TRUE(c->quantization);
  const QuantConfig &q = *c->quantization;
  EXPECT_EQ(q.producer, QuantConfig::Producer::ModelOpt);
  EXPECT_EQ(q.source, dir + "/hf_quant_config.json");
  EXPECT_EQ(q.algo, "FP8");
  ASSERT_EQ(q.groups.size(), 1u);
  EXPECT_EQ(q.groups[0].scheme, QuantScheme::Fp8E4M3);
  EXPECT_EQ(q.groups[0].granularity, QuantGranularity::PerTensor);
  EXPECT_EQ(q.groups[0].activations, ActivationQuant::StaticPerTensor);
  // The README's intended list, without ".\0backbone.pt_name_sentinel".
  ASSERT_EQ(q.ignore.size(), 13u);
  EXPECT_EQ(q.ignore[0], "lm_head");
  EXPECT_EQ(q.ignore[1], "backbone.embeddings");
  EXPECT_EQ(q.ignore[2], "backbone.layers.0.mixer.conv1d");
  EXPECT_EQ(q.ignore[3], "backbone.layers.1.mixer.gate");
  for (const std::string &e : q.ignore)
    EXPECT_EQ(e.find('\0'), std::string::npos) << e;

  // config.json alone says the same (its quantization_config mirrors it).
  StatusOr<ModelConfig> alone = parseConfigFile(dir + "/config.json");
  ASSERT_TRUE(alone.ok()) << alone.message();
  ASSERT_TRUE(alone->quantization);
  EXPECT_EQ(alone->quantization->algo, "FP8");
  EXPECT_EQ(alone->quantization->ignore, q.ignore);
}

TEST(QuantConfig, CompressedTensorsFixtures) {
  StatusOr<ModelConfig> d =
      parseCheckpointConfig(fixtureDir("tiny-nano-fp8-dynamic"));
  ASSERT_TRUE(d.ok()) << d.message();
  ASSERT_TRUE(d->quantization);
  EXPECT_EQ(d->quantization->producer,
            QuantConfig::Producer::CompressedTensors);
  ASSERT_EQ(d->quantization->groups.size(), 1u);
  const QuantGroup &g = d->quantization->groups[0];
  EXPECT_EQ(g.name, "config group 'group_0'");
  EXPECT_EQ(g.format, "float-quantized");
  EXPECT_EQ(g.targets, std::vector<std::string>{"Linear"});
  EXPECT_EQ(g.scheme, QuantScheme::Fp8E4M3);
  EXPECT_EQ(g.granularity, QuantGranularity::PerChannel);
  EXPECT_EQ(g.activations, ActivationQuant::DynamicPerToken);
  EXPECT_EQ(d->quantization->ignore.size(), 7u);

  StatusOr<ModelConfig> w =
      parseCheckpointConfig(fixtureDir("tiny-nano-w4a16"));
  ASSERT_TRUE(w.ok()) << w.message();
  ASSERT_TRUE(w->quantization);
  const QuantGroup &i4 = w->quantization->groups.at(0);
  EXPECT_EQ(i4.format, "pack-quantized");
  EXPECT_EQ(i4.scheme, QuantScheme::Int4);
  EXPECT_EQ(i4.granularity, QuantGranularity::PerGroup);
  EXPECT_EQ(i4.groupSize, 8);
  EXPECT_EQ(i4.activations, ActivationQuant::None);
}

TEST(QuantConfig, UnquantisedFixturesDeclareNothing) {
  StatusOr<ModelConfig> c = parseCheckpointConfig(fixtureDir("tiny-nano"));
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_FALSE(c->quantization);
}

TEST(QuantConfig, StaticPerTensorCompressedTensors) {
  json g = fp8Group();
  g["weights"]["strategy"] = "tensor";
  g["input_activations"]["strategy"] = "tensor";
  g["input_activations"]["dynamic"] = false;
  StatusOr<ModelConfig> c =
      withQuantConfig({{"quant_method", "compressed-tensors"},
                       {"format", "float-quantized"},
                       {"config_groups", {{"group_0", g}}}});
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->quantization->groups[0].granularity,
            QuantGranularity::PerTensor);
  EXPECT_EQ(c->quantization->groups[0].activations,
            ActivationQuant::StaticPerTensor);
}

TEST(QuantConfig, UnsupportedSchemesNameTheScheme) {
  EXPECT_EQ(quantError({{"quant_method", "awq"}, {"bits", 4}}),
            "cfg.json: quantization_config: unsupported quant_method 'awq' "
            "(supported: compressed-tensors, modelopt)");
  EXPECT_EQ(quantError({{"quant_method", "fp8"}}),
            "cfg.json: quantization_config: unsupported quant_method 'fp8' "
            "(supported: compressed-tensors, modelopt)");
  EXPECT_EQ(quantError({{"bits", 4}}),
            "cfg.json: quantization_config: missing 'quant_method'");
  EXPECT_EQ(quantError({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}),
            "cfg.json: quantization_config: unsupported quant_algo 'NVFP4' "
            "(supported: FP8)");
  EXPECT_EQ(quantError(json::array()),
            "cfg.json: quantization_config: must be an object (got [])");

  json g = fp8Group();
  g["weights"]["strategy"] = "tensor_group";
  EXPECT_EQ(quantError({{"quant_method", "compressed-tensors"},
                        {"config_groups", {{"g", g}}}}),
            "cfg.json: quantization_config: config group 'g': unsupported "
            "weights: float 8-bit, strategy 'tensor_group' (supported: float "
            "8-bit tensor or channel; int 4-bit group or channel)");
  g = fp8Group();
  g["format"] = "pack-quantized";
  EXPECT_EQ(quantError({{"quant_method", "compressed-tensors"},
                        {"config_groups", {{"g", g}}}}),
            "cfg.json: quantization_config: config group 'g': weights: float "
            "8-bit, strategy 'channel' need format float-quantized, got "
            "'pack-quantized'");
  g = fp8Group();
  g["input_activations"]["dynamic"] = "local";
  EXPECT_THAT(quantError({{"quant_method", "compressed-tensors"},
                          {"config_groups", {{"g", g}}}}),
              HasSubstr("unsupported input_activations: float 8-bit, "
                        "dynamic \"local\""));
  g = fp8Group();
  g["weights"]["type"] = "int";
  g["weights"]["num_bits"] = 4;
  g["weights"]["strategy"] = "group";
  g["format"] = "pack-quantized";
  EXPECT_THAT(quantError({{"quant_method", "compressed-tensors"},
                          {"config_groups", {{"g", g}}}}),
              HasSubstr("need a positive group_size"));
  EXPECT_EQ(quantError({{"quant_method", "compressed-tensors"},
                        {"transform_config", {{"config_groups", {}}}},
                        {"config_groups", {{"g", fp8Group()}}}}),
            "cfg.json: quantization_config: transform_config is not "
            "supported (got {\"config_groups\":null})");
  EXPECT_EQ(quantError({{"quant_method", "compressed-tensors"}}),
            "cfg.json: quantization_config: missing 'config_groups'");
}

TEST(QuantConfig, WrongJsonTypesAreErrors) {
  json groups = {{"g", fp8Group()}};
  const std::vector<json> bad = {
      {{"quant_method", 3}},
      {{"quant_method", "compressed-tensors"}, {"config_groups", 5}},
      {{"quant_method", "compressed-tensors"},
       {"config_groups", groups},
       {"ignore", {1, 2}}},
      {{"quant_method", "compressed-tensors"},
       {"config_groups", {{"g", {{"targets", "Linear"}}}}}},
      {{"quant_method", "compressed-tensors"},
       {"config_groups",
        {{"g",
          {{"format", "float-quantized"},
           {"targets", {"Linear"}},
           {"weights", "fp8"}}}}}},
      {{"quant_method", "compressed-tensors"},
       {"config_groups",
        {{"g",
          {{"format", "float-quantized"},
           {"targets", {"Linear"}},
           {"weights", {{"num_bits", 8.5}}}}}}}},
      {{"quant_method", "modelopt"},
       {"quant_algo", "FP8"},
       {"ignore", "lm_head"}},
  };
  for (const json &qc : bad) {
    SCOPED_TRACE(qc.dump());
    EXPECT_THAT(quantError(qc), HasSubstr("cfg.json: quantization_config: "));
  }
}

TEST(QuantConfig, HfQuantConfigErrors) {
  auto err = [](const std::string &text) {
    StatusOr<QuantConfig> q = parseHfQuantConfigText(text, "hq.json");
    EXPECT_FALSE(q.ok());
    return q.ok() ? std::string() : q.message();
  };
  EXPECT_EQ(err("{\"quantization\": "), "hq.json: not valid JSON");
  EXPECT_EQ(err("[]"), "hq.json: not a JSON object");
  EXPECT_EQ(err("{}"), "hq.json: missing 'quantization'");
  EXPECT_EQ(err("{\"quantization\": {}}"), "hq.json: missing 'quant_algo'");
  EXPECT_EQ(err("{\"quantization\": {\"quant_algo\": \"W4A8_AWQ\"}}"),
            "hq.json: unsupported quant_algo 'W4A8_AWQ' (supported: FP8)");
  EXPECT_EQ(err("{\"quantization\": {\"quant_algo\": \"FP8\", "
                "\"exclude_modules\": [\"a\\u0001\", 7]}}"),
            "hq.json: 'exclude_modules' must be a list of strings (got 7)");
  // Control characters in names stay on one line.
  EXPECT_EQ(err("{\"quantization\": {\"quant_algo\": \"FP8\\n\"}}"),
            "hq.json: unsupported quant_algo 'FP8\\x0a' (supported: FP8)");

  // Random bytes never escape as exceptions.
  std::mt19937 rng(38);
  const std::string good =
      readFile(fixtureDir("tiny-nano-fp8-modelopt") + "/hf_quant_config.json");
  for (int i = 0; i < 300; ++i) {
    std::string text = good;
    for (int k = 0; k < 4; ++k)
      text[rng() % text.size()] = static_cast<char>(rng() % 256);
    (void)parseHfQuantConfigText(text, "hq.json");
  }
}

TEST(QuantConfig, DescriptorAndConfigMustAgree) {
  StatusOr<QuantConfig> d = parseHfQuantConfigText(
      "{\"quantization\": {\"quant_algo\": \"FP8\"}}", "hq.json");
  ASSERT_TRUE(d.ok()) << d.message();
  StatusOr<ModelConfig> ct =
      withQuantConfig({{"quant_method", "compressed-tensors"},
                       {"config_groups", {{"g", fp8Group()}}}});
  ASSERT_TRUE(ct.ok()) << ct.message();
  StatusOr<QuantConfig> merged = mergeQuantConfigs(*d, ct->quantization);
  ASSERT_FALSE(merged.ok());
  EXPECT_EQ(merged.message(), "hq.json: ModelOpt descriptor, but cfg.json "
                              "declares a compressed-tensors "
                              "quantization_config");
  merged = mergeQuantConfigs(*d, std::nullopt);
  ASSERT_TRUE(merged.ok()) << merged.message();
  EXPECT_EQ(merged->source, "hq.json");
}

//===----------------------------------------------------------------------===//
// Matching modules
//===----------------------------------------------------------------------===//

TEST(QuantMatcher, CompressedTensorsPrecedence) {
  json fp8 = fp8Group();
  json int4 = {{"format", "pack-quantized"},
               {"targets", {"re:.*experts\\.[0-9]+\\.up_proj$"}},
               {"weights",
                {{"type", "int"},
                 {"num_bits", 4},
                 {"strategy", "group"},
                 {"group_size", 8}}}};
  json exact = fp8Group();
  exact["targets"] = {"backbone.layers.1.mixer.experts.3.up_proj"};
  StatusOr<ModelConfig> c =
      withQuantConfig({{"quant_method", "compressed-tensors"},
                       {"config_groups",
                        {{"a_fp8", fp8}, {"b_int4", int4}, {"c_exact", exact}}},
                       {"ignore", {"lm_head", "re:.*mixer\\.gate$"}}});
  ASSERT_TRUE(c.ok()) << c.message();
  QuantMatcher m(*c->quantization);
  auto group = [&](const std::string &module) {
    const QuantGroup *g = m.groupFor(module);
    return g ? g->name : std::string("none");
  };
  EXPECT_EQ(group("backbone.layers.0.mixer.in_proj"),
            "config group 'a_fp8'"); // class "Linear"
  EXPECT_EQ(group("backbone.layers.1.mixer.experts.0.up_proj"),
            "config group 'b_int4'"); // regex beats class
  EXPECT_EQ(group("backbone.layers.1.mixer.experts.3.up_proj"),
            "config group 'c_exact'"); // exact name beats regex
  EXPECT_EQ(group("backbone.layers.1.mixer.experts.0.up_proj.x"),
            "config group 'a_fp8'"); // the regex ends in $
  EXPECT_EQ(group("lm_head"), "none");
  EXPECT_EQ(group("backbone.layers.1.mixer.gate"), "none");
  // re: matches from the start of the name (Python re.match), not inside.
  EXPECT_TRUE(m.ignored("backbone.layers.12.mixer.gate"));
  EXPECT_FALSE(m.ignored("x.lm_head"));
}

TEST(QuantMatcher, ModelOptGlobs) {
  StatusOr<QuantConfig> q = parseHfQuantConfigText(
      R"({"quantization": {"quant_algo": "FP8", "exclude_modules":
          ["lm_head", "*.conv1d", "backbone.layers.?.mixer.gate",
           "backbone.embeddings.\u0000backbone.pt_name_sentinel"]}})",
      "hq.json");
  ASSERT_TRUE(q.ok()) << q.message();
  QuantMatcher m(*q);
  EXPECT_TRUE(m.ignored("lm_head"));
  EXPECT_TRUE(m.ignored("backbone.layers.0.mixer.conv1d"));
  EXPECT_TRUE(m.ignored("backbone.layers.3.mixer.gate"));
  EXPECT_FALSE(m.ignored("backbone.layers.12.mixer.gate")); // '?' is one char
  EXPECT_TRUE(m.ignored("backbone.embeddings"));
  EXPECT_FALSE(m.ignored("backbone.layers.0.mixer.in_proj"));
  ASSERT_NE(m.groupFor("backbone.layers.0.mixer.in_proj"), nullptr);
  EXPECT_EQ(m.groupFor("lm_head"), nullptr);
}

//===----------------------------------------------------------------------===//
// Binding the quantised fixtures (tensor layouts from their READMEs)
//===----------------------------------------------------------------------===//

TEST(BindQuant, ModelOptFp8) {
  Bound b = bindFixture("tiny-nano-fp8-modelopt");
  const LayerBinding &mamba = b.binding.layers.at(0);
  const WeightBinding *in = mamba.find("in_proj");
  ASSERT_TRUE(in && in->quant);
  EXPECT_EQ(in->tensors,
            std::vector<std::string>{"backbone.layers.0.mixer.in_proj.weight"});
  EXPECT_EQ(in->dtype, DType::F8E4M3);
  EXPECT_EQ(in->shape, (std::vector<int64_t>{126, 48}));
  EXPECT_EQ(in->quant->scheme, QuantScheme::Fp8E4M3);
  EXPECT_EQ(in->quant->granularity, QuantGranularity::PerTensor);
  EXPECT_EQ(in->quant->activations, ActivationQuant::StaticPerTensor);
  ASSERT_EQ(in->quant->scales.size(), 1u);
  EXPECT_EQ(in->quant->scales[0].name,
            "backbone.layers.0.mixer.in_proj.weight_scale");
  EXPECT_EQ(in->quant->scales[0].shape, std::vector<int64_t>{});
  ASSERT_EQ(in->quant->inputScales.size(), 1u);
  EXPECT_EQ(in->quant->inputScales[0].name,
            "backbone.layers.0.mixer.in_proj.input_scale");
  EXPECT_FALSE(mamba.find("conv_weight")->quant);

  const LayerBinding &moe = b.binding.layers.at(1);
  EXPECT_FALSE(moe.find("gate")->quant);
  const WeightBinding *up = moe.find("experts_up");
  ASSERT_TRUE(up && up->quant);
  EXPECT_TRUE(up->stacked);
  ASSERT_EQ(up->tensors.size(), 8u);
  ASSERT_EQ(up->quant->scales.size(), 8u);
  ASSERT_EQ(up->quant->inputScales.size(), 8u);
  for (int j = 0; j < 8; ++j) {
    const std::string base =
        "backbone.layers.1.mixer.experts." + std::to_string(j) + ".up_proj.";
    EXPECT_EQ(up->tensors[j], base + "weight");
    EXPECT_EQ(up->quant->scales[j].name, base + "weight_scale");
    EXPECT_EQ(up->quant->inputScales[j].name, base + "input_scale");
  }
  EXPECT_FALSE(b.binding.embedding.quant);
  EXPECT_FALSE(b.binding.lmHead.quant);
  EXPECT_EQ(b.binding.lmHead.tensors,
            std::vector<std::string>{"lm_head.weight"});
}

TEST(BindQuant, CompressedTensorsFp8Dynamic) {
  Bound b = bindFixture("tiny-nano-fp8-dynamic");
  const WeightBinding *k = b.binding.layers.at(5).find("k_proj");
  ASSERT_TRUE(k && k->quant);
  EXPECT_EQ(k->quant->granularity, QuantGranularity::PerChannel);
  EXPECT_EQ(k->quant->activations, ActivationQuant::DynamicPerToken);
  EXPECT_EQ(k->quant->scales.at(0).shape, (std::vector<int64_t>{8, 1}));
  EXPECT_EQ(k->quant->scales.at(0).dtype, DType::F32);
  EXPECT_TRUE(k->quant->inputScales.empty());
  const WeightBinding *down = b.binding.layers.at(12).find("experts_down");
  ASSERT_TRUE(down && down->quant);
  EXPECT_EQ(down->quant->scales.size(), 8u);
  EXPECT_EQ(down->quant->scales.at(7).shape, (std::vector<int64_t>{48, 1}));
}

TEST(BindQuant, CompressedTensorsW4A16) {
  Bound b = bindFixture("tiny-nano-w4a16");
  const WeightBinding *sd = b.binding.layers.at(1).find("shared_down");
  ASSERT_TRUE(sd && sd->quant);
  EXPECT_EQ(sd->tensors, std::vector<std::string>{
                             "backbone.layers.1.mixer.shared_experts.down_"
                             "proj.weight_packed"});
  EXPECT_EQ(sd->dtype, DType::I32);
  EXPECT_EQ(sd->shape, (std::vector<int64_t>{48, 40})); // logical
  EXPECT_EQ(sd->quant->scheme, QuantScheme::Int4);
  EXPECT_EQ(sd->quant->storage, DType::I32);
  EXPECT_EQ(sd->quant->pack, 8);
  EXPECT_EQ(sd->quant->granularity, QuantGranularity::PerGroup);
  EXPECT_EQ(sd->quant->groupSize, 8);
  EXPECT_TRUE(sd->quant->symmetric);
  EXPECT_EQ(sd->quant->scales.at(0).shape, (std::vector<int64_t>{48, 5}));
  EXPECT_EQ(sd->quant->activations, ActivationQuant::None);
}

TEST(BindQuant, EveryQuantisedMatrixOfTheReadmes) {
  // 126 matrices: 10 Mamba + 8 attention + 12 shared-expert + 96 routed.
  for (const char *name : kQuantFixtures) {
    SCOPED_TRACE(name);
    Bound b = bindFixture(name);
    int matrices = 0, weights = 0;
    for (const WeightBinding *w : allWeights(b.binding)) {
      ++weights;
      if (w->quant) {
        EXPECT_EQ(w->quant->scales.size(), w->tensors.size()) << w->role;
        matrices += static_cast<int>(w->tensors.size());
      }
    }
    EXPECT_EQ(matrices, 126);
    EXPECT_GT(weights, matrices / 8);
  }
}

TEST(BindQuant, UndeclaredCodesAreRefused) {
  // The FP8_DYNAMIC tensors with tiny-nano's config (no quantization_config).
  StatusOr<ModelConfig> c =
      parseConfigFile(fixtureDir("tiny-nano") + "/config.json");
  StatusOr<Checkpoint> k = openCheckpoint(fixtureDir("tiny-nano-fp8-dynamic"));
  ASSERT_TRUE(c.ok() && k.ok());
  StatusOr<ModelBinding> b = bindCheckpoint(*c, *k);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.message(),
            fixtureDir("tiny-nano-fp8-dynamic") +
                "/model.safetensors: tensor "
                "'backbone.layers.0.mixer.in_proj.weight' holds F8_E4M3 codes "
                "but the checkpoint declares no quantisation (no "
                "hf_quant_config.json, no quantization_config in "
                "config.json)");
}

TEST(BindQuant, ScaleNextToFloatWeight) {
  TempDir dir;
  std::vector<TensorSpec> specs =
      rawTensorSpecs(fixtureDir("tiny-nano") + "/model.safetensors");
  specs.push_back({"backbone.layers.0.mixer.in_proj.weight_scale", "F32", {}});
  writeFile(dir.file("model.safetensors"), buildSafetensors(specs));
  writeFile(dir.file("config.json"),
            readFile(fixtureDir("tiny-nano") + "/config.json"));
  StatusOr<ModelConfig> c = parseCheckpointConfig(dir.path());
  StatusOr<Checkpoint> k = openCheckpoint(dir.path());
  ASSERT_TRUE(c.ok() && k.ok());
  StatusOr<ModelBinding> b = bindCheckpoint(*c, *k);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.message(),
            dir.file("model.safetensors") +
                ": tensor 'backbone.layers.0.mixer.in_proj.weight_scale' is a "
                "weight scale, but 'backbone.layers.0.mixer.in_proj.weight' "
                "has dtype F32 (nf reads scales of F8_E4M3 weights and of "
                "packed int4 weight_packed only)");
}
