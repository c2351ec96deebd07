// hf/HFConfig.h: config.json parsing, checked against
// the fixtures' own JSON, their manifest and the spec's shape formulas.
#include "hf/HFConfig.h"

#include "TestUtil.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

using namespace nf;
using namespace nf::hf;
using namespace nf::test;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace {

json loadJson(const std::string &path) { return json::parse(readFile(path)); }

const char *kAllFixtures[] = {"tiny-nano", "tiny-hybrid", "tiny-dense",
                              "tiny-latent", "tiny-hybrid-bf16"};

std::string patternOf(const ModelConfig &c) {
  std::string s;
  for (BlockKind k : c.layers)
    s += blockKindLetter(k);
  return s;
}

StatusOr<ModelConfig> parseJson(const json &j,
                                const std::string &source = "cfg.json") {
  return parseConfigText(j.dump(), source);
}

// Every field, so that two spellings can be compared exhaustively.
void expectSameConfig(const ModelConfig &a, const ModelConfig &b) {
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.vocabSize, b.vocabSize);
  EXPECT_EQ(a.hiddenSize, b.hiddenSize);
  EXPECT_EQ(a.layerNormEpsilon, b.layerNormEpsilon);
  EXPECT_EQ(a.tieWordEmbeddings, b.tieWordEmbeddings);
  EXPECT_EQ(a.bosTokenId, b.bosTokenId);
  EXPECT_EQ(a.eosTokenId, b.eosTokenId);
  EXPECT_EQ(a.padTokenId, b.padTokenId);
  EXPECT_EQ(a.eosTokenIds, b.eosTokenIds);
  EXPECT_EQ(a.numAttentionHeads, b.numAttentionHeads);
  EXPECT_EQ(a.numKeyValueHeads, b.numKeyValueHeads);
  EXPECT_EQ(a.headDim, b.headDim);
  EXPECT_EQ(a.ropeTheta, b.ropeTheta);
  EXPECT_EQ(a.mambaNumHeads, b.mambaNumHeads);
  EXPECT_EQ(a.mambaHeadDim, b.mambaHeadDim);
  EXPECT_EQ(a.ssmStateSize, b.ssmStateSize);
  EXPECT_EQ(a.nGroups, b.nGroups);
  EXPECT_EQ(a.convKernel, b.convKernel);
  EXPECT_EQ(a.chunkSize, b.chunkSize);
  EXPECT_EQ(a.useConvBias, b.useConvBias);
  EXPECT_EQ(a.useBias, b.useBias);
  EXPECT_EQ(a.timeStepLimitMin, b.timeStepLimitMin);
  EXPECT_EQ(a.timeStepLimitMax, b.timeStepLimitMax);
  EXPECT_EQ(a.intermediateSize, b.intermediateSize);
  EXPECT_EQ(a.nRoutedExperts, b.nRoutedExperts);
  EXPECT_EQ(a.numExpertsPerTok, b.numExpertsPerTok);
  EXPECT_EQ(a.moeIntermediateSize, b.moeIntermediateSize);
  EXPECT_EQ(a.moeSharedExpertIntermediateSize,
            b.moeSharedExpertIntermediateSize);
  EXPECT_EQ(a.nGroup, b.nGroup);
  EXPECT_EQ(a.topkGroup, b.topkGroup);
  EXPECT_EQ(a.normTopkProb, b.normTopkProb);
  EXPECT_EQ(a.routedScalingFactor, b.routedScalingFactor);
  EXPECT_EQ(a.moeLatentSize, b.moeLatentSize);
  EXPECT_EQ(a.activation, b.activation);
  EXPECT_EQ(a.weightDtype, b.weightDtype);
}

// The config as nf parsed it against the transformers-5 JSON it came from.
void expectMatchesJson(const ModelConfig &c, const json &j) {
  EXPECT_EQ(c.layers.size(), j["layers_block_type"].size());
  EXPECT_EQ(c.vocabSize, j["vocab_size"].get<int64_t>());
  EXPECT_EQ(c.hiddenSize, j["hidden_size"].get<int64_t>());
  EXPECT_EQ(c.layerNormEpsilon, j["layer_norm_epsilon"].get<double>());
  EXPECT_EQ(c.tieWordEmbeddings, j["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(c.bosTokenId, j["bos_token_id"].get<int64_t>());
  EXPECT_EQ(c.eosTokenId, j["eos_token_id"].get<int64_t>());
  EXPECT_EQ(c.eosTokenIds,
            std::vector<int64_t>{j["eos_token_id"].get<int64_t>()});
  EXPECT_EQ(c.padTokenId, j["pad_token_id"].get<int64_t>());
  EXPECT_EQ(c.numAttentionHeads, j["num_attention_heads"].get<int64_t>());
  EXPECT_EQ(c.numKeyValueHeads, j["num_key_value_heads"].get<int64_t>());
  EXPECT_EQ(c.headDim, j["head_dim"].get<int64_t>());
  EXPECT_EQ(c.mambaNumHeads, j["mamba_num_heads"].get<int64_t>());
  EXPECT_EQ(c.mambaHeadDim, j["mamba_head_dim"].get<int64_t>());
  EXPECT_EQ(c.ssmStateSize, j["ssm_state_size"].get<int64_t>());
  EXPECT_EQ(c.nGroups, j["n_groups"].get<int64_t>());
  EXPECT_EQ(c.convKernel, j["conv_kernel"].get<int64_t>());
  EXPECT_EQ(c.chunkSize, j["chunk_size"].get<int64_t>());
  EXPECT_EQ(c.useConvBias, j["use_conv_bias"].get<bool>());
  EXPECT_EQ(c.useBias, j["use_bias"].get<bool>());
  EXPECT_EQ(c.timeStepLimitMin, j["time_step_limit"][0].get<double>());
  EXPECT_TRUE(std::isinf(c.timeStepLimitMax) && c.timeStepLimitMax > 0);
  EXPECT_EQ(c.intermediateSize, j["intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.nRoutedExperts, j["n_routed_experts"].get<int64_t>());
  EXPECT_EQ(c.numExpertsPerTok, j["num_experts_per_tok"].get<int64_t>());
  EXPECT_EQ(c.moeIntermediateSize, j["moe_intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.moeSharedExpertIntermediateSize,
            j["moe_shared_expert_intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.nGroup, j["n_group"].get<int64_t>());
  EXPECT_EQ(c.topkGroup, j["topk_group"].get<int64_t>());
  EXPECT_EQ(c.normTopkProb, j["norm_topk_prob"].get<bool>());
  EXPECT_EQ(c.routedScalingFactor, j["routed_scaling_factor"].get<double>());
  if (j["moe_latent_size"].is_null())
    EXPECT_FALSE(c.moeLatentSize.has_value());
  else
    EXPECT_EQ(c.moeLatentSize, j["moe_latent_size"].get<int64_t>());
  EXPECT_EQ(c.activation, j["mlp_hidden_act"].get<std::string>());
  EXPECT_EQ(c.weightDtype, j["dtype"].get<std::string>());
}

// The tiny-hybrid config (transformers-5 spelling), for mutation.
json hybridConfig() {
  return loadJson(fixtureDir("tiny-hybrid") + "/config.json");
}

// parse(j) must fail with exactly "cfg.json: <message>".
void expectConfigError(const json &j, const std::string &message) {
  StatusOr<ModelConfig> c = parseJson(j);
  ASSERT_FALSE(c.ok()) << "parsed unexpectedly";
  EXPECT_EQ(c.message(), "cfg.json: " + message);
}

} // namespace

//===----------------------------------------------------------------------===//
// Block kinds
//===----------------------------------------------------------------------===//

TEST(BlockKind, LettersAndNames) {
  EXPECT_EQ(blockKindLetter(BlockKind::Mamba), 'M');
  EXPECT_EQ(blockKindLetter(BlockKind::Attention), '*');
  EXPECT_EQ(blockKindLetter(BlockKind::Mlp), '-');
  EXPECT_EQ(blockKindLetter(BlockKind::Moe), 'E');
  EXPECT_STREQ(blockKindName(BlockKind::Mamba), "mamba");
  EXPECT_STREQ(blockKindName(BlockKind::Attention), "attention");
  EXPECT_STREQ(blockKindName(BlockKind::Mlp), "mlp");
  EXPECT_STREQ(blockKindName(BlockKind::Moe), "moe");
}

//===----------------------------------------------------------------------===//
// Real configs
//===----------------------------------------------------------------------===//

TEST(HFConfig, FixturesMatchTheirJsonAndManifest) {
  json manifest = loadJson(testDataDir() + "/fixtures/manifest.json");
  ASSERT_EQ(manifest["models"].size(), 5u);
  for (const json &m : manifest["models"]) {
    std::string name = m["name"].get<std::string>();
    SCOPED_TRACE(name);
    std::string path = fixtureDir(name) + "/config.json";
    StatusOr<ModelConfig> c = parseConfigFile(path);
    ASSERT_TRUE(c.ok()) << c.message();
    EXPECT_EQ(c->sourcePath, path);
    EXPECT_EQ(patternOf(*c), m["pattern"].get<std::string>());
    expectMatchesJson(*c, loadJson(path));
  }
}

TEST(HFConfig, PydocMoe) {
  std::string path = examplesDir() + "/pydoc-moe/config.json";
  StatusOr<ModelConfig> c = parseConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(patternOf(*c), "MEMEM*EM-EM*E"); // PROVENANCE.md
  expectMatchesJson(*c, loadJson(path));
  EXPECT_EQ(c->weightDtype, "bfloat16");
  EXPECT_EQ(c->nRoutedExperts, 16);
  EXPECT_EQ(c->numExpertsPerTok, 4);
  EXPECT_TRUE(c->hasKind(BlockKind::Mlp));
}

TEST(HFConfig, DerivedSizesMatchCheckpointShapes) {
  // §1: I = nh*P, CD = I + 2*G*N, DIN = I + CD + nh; the truth is the shapes
  // HF saved in each fixture.
  for (const char *name : kAllFixtures) {
    SCOPED_TRACE(name);
    StatusOr<ModelConfig> c =
        parseConfigFile(fixtureDir(name) + "/config.json");
    ASSERT_TRUE(c.ok()) << c.message();
    json h = rawHeader(fixtureDir(name) + "/model.safetensors");
    const json &inProj = h["backbone.layers.0.mixer.in_proj.weight"]["shape"];
    const json &conv = h["backbone.layers.0.mixer.conv1d.weight"]["shape"];
    const json &norm = h["backbone.layers.0.mixer.norm.weight"]["shape"];
    EXPECT_EQ(c->inProjDim(), inProj[0].get<int64_t>());
    EXPECT_EQ(c->convDim(), conv[0].get<int64_t>());
    EXPECT_EQ(c->mambaInner(), norm[0].get<int64_t>());
  }
  StatusOr<ModelConfig> hybrid =
      parseConfigFile(fixtureDir("tiny-hybrid") + "/config.json");
  ASSERT_TRUE(hybrid.ok());
  EXPECT_EQ(hybrid->inProjDim(), 328); // 2*128 + 2*2*16 + 8
  EXPECT_EQ(hybrid->expertInputDim(), 64);
}

TEST(HFConfig, LatentSize) {
  StatusOr<ModelConfig> c =
      parseConfigFile(fixtureDir("tiny-latent") + "/config.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->moeLatentSize, 32);
  EXPECT_EQ(c->expertInputDim(), 32);
  EXPECT_EQ(patternOf(*c), "M*EME");
}

TEST(HFConfig, PublishedHubConfigs) {
  // Hub config.json files as published (abridged to the fields nf reads;
  // sources in docs/nemotron-h-reference.md §0). Expected sizes from the
  // weight table of §6.
  const char *nano = R"({
    "architectures": ["NemotronHForCausalLM"], "bos_token_id": 1,
    "chunk_size": 128, "conv_kernel": 4, "eos_token_id": 2, "expand": 2,
    "head_dim": 128, "hidden_size": 2688,
    "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "intermediate_size": 1856, "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 64, "mamba_hidden_act": "silu", "mamba_num_heads": 64,
    "mamba_proj_bias": false, "mlp_bias": false, "mlp_hidden_act": "relu2",
    "moe_intermediate_size": 1856, "moe_shared_expert_intermediate_size": 3712,
    "n_group": 1, "n_groups": 8, "n_routed_experts": 128,
    "n_shared_experts": 1, "norm_eps": 1e-05, "norm_topk_prob": true,
    "num_attention_heads": 32, "num_experts_per_tok": 6,
    "num_hidden_layers": 52, "num_key_value_heads": 2, "pad_token_id": 0,
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "sliding_window": null,
    "ssm_state_size": 128, "tie_word_embeddings": false, "topk_group": 1,
    "torch_dtype": "bfloat16", "use_bias": false, "use_conv_bias": true,
    "vocab_size": 131072})";
  StatusOr<ModelConfig> c = parseConfigText(nano, "nano.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->layers.size(), 52u);
  EXPECT_EQ(std::count(c->layers.begin(), c->layers.end(), BlockKind::Mamba),
            23);
  EXPECT_EQ(std::count(c->layers.begin(), c->layers.end(), BlockKind::Moe), 23);
  EXPECT_EQ(
      std::count(c->layers.begin(), c->layers.end(), BlockKind::Attention), 6);
  EXPECT_EQ(c->inProjDim(), 10304);
  EXPECT_EQ(c->convDim(), 6144);
  EXPECT_EQ(c->mambaInner(), 4096);
  EXPECT_EQ(c->ropeTheta, 10000.0);
  EXPECT_EQ(c->weightDtype, "bfloat16");
  EXPECT_TRUE(std::isinf(c->timeStepLimitMax));

  const char *h8b = R"({
    "attention_head_dim": 128, "bos_token_id": 1, "chunk_size": 128,
    "conv_kernel": 4, "eos_token_id": 2, "expand": 2, "hidden_act": "relu2",
    "hidden_size": 4096,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "intermediate_size": 21504, "layer_norm_epsilon": 1e-05,
    "mamba_head_dim": 64, "mamba_hidden_act": "silu", "mamba_num_heads": 128,
    "mamba_proj_bias": false, "mlp_bias": false, "mlp_hidden_act": "relu2",
    "n_groups": 8, "num_attention_heads": 32, "num_hidden_layers": 52,
    "num_key_value_heads": 8, "pad_token_id": 0, "rms_norm_eps": 1e-05,
    "ssm_state_size": 128, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_bias": false, "use_conv_bias": true,
    "vocab_size": 131072, "n_routed_experts": null})";
  c = parseConfigText(h8b, "8b.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(std::count(c->layers.begin(), c->layers.end(), BlockKind::Mamba),
            24);
  EXPECT_EQ(std::count(c->layers.begin(), c->layers.end(), BlockKind::Mlp), 24);
  EXPECT_EQ(
      std::count(c->layers.begin(), c->layers.end(), BlockKind::Attention), 4);
  EXPECT_EQ(c->inProjDim(), 18560);
  EXPECT_EQ(c->convDim(), 10240);
  EXPECT_EQ(c->headDim, 128);
  EXPECT_EQ(c->numKeyValueHeads, 8);
  EXPECT_EQ(c->nRoutedExperts, 0);
}

//===----------------------------------------------------------------------===//
// Spellings
//===----------------------------------------------------------------------===//

TEST(HFConfig, HubSpellingEqualsTransformers5Spelling) {
  json t5 = hybridConfig();
  // The same model as NVIDIA's Hub configs spell it.
  json hub = t5;
  for (const char *k :
       {"layers_block_type", "n_groups", "conv_kernel", "chunk_size",
        "head_dim", "layer_norm_epsilon", "ssm_state_size", "mamba_num_heads",
        "mamba_head_dim", "use_conv_bias", "time_step_limit", "dtype"})
    hub.erase(k);
  hub["hybrid_override_pattern"] = "ME*M-EM*E";
  hub["num_hidden_layers"] = 9;
  hub["mamba_n_groups"] = 2;
  hub["mamba_d_conv"] = 4;
  hub["mamba_chunk_size"] = 16;
  hub["attention_head_dim"] = 16;
  hub["rms_norm_eps"] = 1e-5;
  hub["mamba_d_state"] = 16;
  hub["mamba_n_heads"] = 8;
  hub["mamba_d_head"] = 16;
  hub["mamba_conv_bias"] = true;
  hub["torch_dtype"] = "float32";

  StatusOr<ModelConfig> a = parseJson(t5, "t5.json");
  StatusOr<ModelConfig> b = parseJson(hub, "hub.json");
  ASSERT_TRUE(a.ok()) << a.message();
  ASSERT_TRUE(b.ok()) << b.message();
  expectSameConfig(*a, *b);
  EXPECT_EQ(a->sourcePath, "t5.json");
  EXPECT_EQ(b->sourcePath, "hub.json");
}

TEST(HFConfig, LayersBlockTypeWinsOverPattern) {
  // HF ignores hybrid_override_pattern when layers_block_type is present.
  json j = hybridConfig();
  j["hybrid_override_pattern"] = "MMMMMMMMM";
  StatusOr<ModelConfig> c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(patternOf(*c), "ME*M-EM*E");
}

TEST(HFConfig, LegacyLayerTypeNames) {
  json j = hybridConfig();
  j["layers_block_type"] = {"mamba", "moe",   "attention", "mamba", "mlp",
                            "moe",   "mamba", "attention", "moe"};
  StatusOr<ModelConfig> c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(patternOf(*c), "ME*M-EM*E");
}

TEST(HFConfig, AgreeingAliasesAreAccepted) {
  // Hub configs of Nemotron-H-8B carry both layer_norm_epsilon and
  // rms_norm_eps.
  json j = hybridConfig();
  j["rms_norm_eps"] = 1e-5;
  j["norm_eps"] = 1e-5;
  j["mamba_n_groups"] = 2;
  StatusOr<ModelConfig> c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->nGroups, 2);
}

TEST(HFConfig, ConflictingAliases) {
  json j = hybridConfig();
  j["mamba_n_groups"] = 4;
  expectConfigError(j, "conflicting config fields 'n_groups' (2) and "
                       "'mamba_n_groups' (4)");
}

TEST(HFConfig, TimeStepLimitForms) {
  json j = hybridConfig();
  j.erase("time_step_limit");
  StatusOr<ModelConfig> c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->timeStepLimitMin, 0.0);
  EXPECT_TRUE(std::isinf(c->timeStepLimitMax) && c->timeStepLimitMax > 0);

  j["time_step_limit"] = {0.001, 0.5};
  c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->timeStepLimitMin, 0.001);
  EXPECT_EQ(c->timeStepLimitMax, 0.5);

  j["time_step_limit"] = nullptr;
  c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_TRUE(std::isinf(c->timeStepLimitMax));

  j["time_step_limit"] = {0.5, 0.1};
  expectConfigError(j, "config field 'time_step_limit' [0.5, 0.1] is not an "
                       "interval 0 <= min <= max");
  j["time_step_limit"] = "inf";
  expectConfigError(j, "config field 'time_step_limit' must be a list [min, "
                       "max] (got \"inf\")");
}

TEST(HFConfig, PythonStyleInfinity) {
  // Python's json writes float("inf") as a bare Infinity token.
  json j = hybridConfig();
  j["time_step_limit"] = {0.0, 12345.0};
  j["dtype"] = "Infinity NaN";
  std::string text = j.dump(2);
  size_t at = text.find("12345.0");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 7, "Infinity");
  StatusOr<ModelConfig> c = parseConfigText(text, "py.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_TRUE(std::isinf(c->timeStepLimitMax) && c->timeStepLimitMax > 0);
  // The rewrite leaves strings alone, even ones that spell the tokens.
  EXPECT_EQ(c->weightDtype, "Infinity NaN");
}

TEST(HFConfig, EosTokenForms) {
  json j = hybridConfig();
  j["eos_token_id"] = {2, 11};
  StatusOr<ModelConfig> c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->eosTokenId, 2);
  EXPECT_EQ(c->eosTokenIds, (std::vector<int64_t>{2, 11}));

  j["eos_token_id"] = nullptr;
  c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->eosTokenId, -1);
  EXPECT_TRUE(c->eosTokenIds.empty());

  j["eos_token_id"] = {2, "x"};
  expectConfigError(j, "config field 'eos_token_id' must be an integer or a "
                       "list of integers (got [2,\"x\"])");
}

TEST(HFConfig, HfDefaultsWhenAbsent) {
  json j = hybridConfig();
  for (const char *k :
       {"head_dim", "chunk_size", "layer_norm_epsilon", "use_conv_bias",
        "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor",
        "moe_latent_size", "mlp_hidden_act", "tie_word_embeddings",
        "bos_token_id", "eos_token_id", "pad_token_id"})
    j.erase(k);
  // n_group=1 changes the routing groups; keep the rest consistent.
  StatusOr<ModelConfig> c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  // HF NemotronHConfig defaults (docs §1).
  EXPECT_EQ(c->headDim, 128);
  EXPECT_EQ(c->chunkSize, 128);
  EXPECT_EQ(c->layerNormEpsilon, 1e-5);
  EXPECT_TRUE(c->useConvBias);
  EXPECT_EQ(c->nGroup, 1);
  EXPECT_EQ(c->topkGroup, 1);
  EXPECT_TRUE(c->normTopkProb);
  EXPECT_EQ(c->routedScalingFactor, 1.0);
  EXPECT_FALSE(c->moeLatentSize.has_value());
  EXPECT_EQ(c->activation, "relu2");
  EXPECT_FALSE(c->tieWordEmbeddings);
  EXPECT_EQ(c->bosTokenId, 1);
  EXPECT_EQ(c->eosTokenId, 2);
  EXPECT_EQ(c->eosTokenIds, std::vector<int64_t>{2});
  EXPECT_EQ(c->padTokenId, 0);
}

TEST(HFConfig, AttentionHeadDimAlias) {
  json j = hybridConfig();
  j.erase("head_dim");
  j["attention_head_dim"] = 16;
  StatusOr<ModelConfig> c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->headDim, 16);
}

TEST(HFConfig, NullKeyValueHeadsMeansMultiHead) {
  json j = hybridConfig();
  j["num_key_value_heads"] = nullptr;
  StatusOr<ModelConfig> c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(c->numKeyValueHeads, 4);
}

//===----------------------------------------------------------------------===//
// Config errors
//===----------------------------------------------------------------------===//

TEST(HFConfigErrors, MissingModelFields) {
  for (const char *k : {"vocab_size", "hidden_size"}) {
    json j = hybridConfig();
    j.erase(k);
    expectConfigError(j, std::string("missing config field '") + k + "'");
  }
  json j = hybridConfig();
  j.erase("layers_block_type");
  expectConfigError(j, "missing config field 'layers_block_type' (or "
                       "'hybrid_override_pattern')");
}

TEST(HFConfigErrors, MissingFieldsPerBlockKind) {
  struct Case {
    const char *field;
    const char *kind;
  };
  const Case cases[] = {
      {"mamba_num_heads", "mamba"},
      {"mamba_head_dim", "mamba"},
      {"ssm_state_size", "mamba"},
      {"n_groups", "mamba"},
      {"conv_kernel", "mamba"},
      {"num_attention_heads", "attention"},
      {"num_key_value_heads", "attention"},
      {"intermediate_size", "mlp"},
      {"n_routed_experts", "moe"},
      {"num_experts_per_tok", "moe"},
      {"moe_intermediate_size", "moe"},
      {"moe_shared_expert_intermediate_size", "moe"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.field);
    json j = hybridConfig();
    j.erase(c.field);
    expectConfigError(j, std::string("missing config field '") + c.field +
                             "' (needed by the " + c.kind + " layers)");
  }
}

TEST(HFConfigErrors, FieldsOfAbsentKindsAreOptional) {
  // A Mamba + attention model needs neither MLP nor MoE sizes.
  json j = hybridConfig();
  j["layers_block_type"] = {"mamba", "attention"};
  for (const char *k :
       {"intermediate_size", "n_routed_experts", "num_experts_per_tok",
        "moe_intermediate_size", "moe_shared_expert_intermediate_size"})
    j.erase(k);
  j["mlp_hidden_act"] = "silu"; // unused without - and E layers
  StatusOr<ModelConfig> c = parseJson(j);
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ(patternOf(*c), "M*");
  EXPECT_EQ(c->nRoutedExperts, 0);
}

TEST(HFConfigErrors, UnknownLayerType) {
  json j = hybridConfig();
  j["layers_block_type"][3] = "foo";
  expectConfigError(j, "unknown layer type 'foo' at layer 3");

  j = hybridConfig();
  j.erase("layers_block_type");
  j["hybrid_override_pattern"] = "ME*X";
  expectConfigError(j, "unknown layer type 'X' at layer 3 of "
                       "hybrid_override_pattern (expected M, *, - or E)");

  j["hybrid_override_pattern"] = "";
  expectConfigError(j, "the layer pattern is empty");
}

TEST(HFConfigErrors, InconsistentHeads) {
  json j = hybridConfig();
  j["num_key_value_heads"] = 3;
  expectConfigError(j, "num_attention_heads (4) is not a multiple of "
                       "num_key_value_heads (3)");
  j = hybridConfig();
  j["n_groups"] = 3;
  expectConfigError(j, "mamba_num_heads (8) is not a multiple of n_groups (3)");
}

TEST(HFConfigErrors, RoutingConsistency) {
  json j = hybridConfig();
  j["num_experts_per_tok"] = 17;
  expectConfigError(j,
                    "num_experts_per_tok (17) exceeds n_routed_experts (16)");
  j = hybridConfig();
  j["n_group"] = 3;
  j["topk_group"] = 1;
  expectConfigError(j,
                    "n_routed_experts (16) is not a multiple of n_group (3)");
  j = hybridConfig();
  j["topk_group"] = 5;
  expectConfigError(j, "topk_group (5) exceeds n_group (4)");
  j = hybridConfig(); // 4 groups of 4 experts, 1 group kept: at most 4
  j["topk_group"] = 1;
  j["num_experts_per_tok"] = 5;
  expectConfigError(j, "num_experts_per_tok (5) exceeds the 4 experts of the "
                       "topk_group (1) selected groups");
}

TEST(HFConfigErrors, NonPositiveSizes) {
  for (const char *k : {"hidden_size", "vocab_size", "mamba_num_heads",
                        "conv_kernel", "head_dim", "n_routed_experts",
                        "moe_intermediate_size", "intermediate_size"}) {
    SCOPED_TRACE(k);
    json j = hybridConfig();
    j[k] = 0;
    expectConfigError(j, std::string("config field '") + k +
                             "' must be positive (got 0)");
  }
  json j = hybridConfig();
  j["layer_norm_epsilon"] = -1.0;
  expectConfigError(
      j, "config field 'layer_norm_epsilon' must be positive (got -1)");
  j = hybridConfig();
  j["moe_latent_size"] = -4;
  expectConfigError(j,
                    "config field 'moe_latent_size' must be positive (got -4)");
}

TEST(HFConfigErrors, WrongJsonTypes) {
  struct Case {
    const char *field;
    json value;
    std::string message;
  };
  const Case cases[] = {
      {"hidden_size", "64",
       "config field 'hidden_size' must be an integer (got \"64\")"},
      {"hidden_size", 64.5,
       "config field 'hidden_size' must be an integer (got 64.5)"},
      {"hidden_size", true,
       "config field 'hidden_size' must be an integer (got true)"},
      {"tie_word_embeddings", "yes",
       "config field 'tie_word_embeddings' must be true or false (got "
       "\"yes\")"},
      {"layer_norm_epsilon", json::array(),
       "config field 'layer_norm_epsilon' must be a number (got [])"},
      {"layers_block_type", "ME*",
       "config field 'layers_block_type' must be a list of strings (got "
       "\"ME*\")"},
      {"mlp_hidden_act", 2,
       "config field 'mlp_hidden_act' must be a string (got 2)"},
      {"moe_latent_size", "32",
       "config field 'moe_latent_size' must be an integer (got \"32\")"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.field);
    json j = hybridConfig();
    j[c.field] = c.value;
    expectConfigError(j, c.message);
  }
  json j = hybridConfig();
  j["layers_block_type"][2] = 7;
  expectConfigError(j, "layers_block_type[2] is not a string (got 7)");
}

TEST(HFConfigErrors, UnsupportedFeatures) {
  json j = hybridConfig();
  j["mlp_hidden_act"] = "silu";
  expectConfigError(j, "unsupported mlp_hidden_act 'silu' (only relu2 is "
                       "supported)");
  j = hybridConfig();
  j["mamba_hidden_act"] = "gelu";
  expectConfigError(j, "unsupported mamba_hidden_act 'gelu' (only silu is "
                       "supported)");
  j = hybridConfig();
  j["use_bias"] = true;
  expectConfigError(j, "use_bias=true (Mamba in_proj/out_proj biases) is not "
                       "supported");
  j = hybridConfig();
  j["mlp_bias"] = true;
  expectConfigError(j, "mlp_bias=true (MLP/expert projection biases) is not "
                       "supported");
}

TEST(HFConfigErrors, NotJson) {
  StatusOr<ModelConfig> c = parseConfigText("{\"vocab_size\": ", "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.message(), StartsWith("cfg.json: not valid JSON (error at "
                                      "byte "));
  c = parseConfigText("[1]", "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.message(), "cfg.json: config is not a JSON object");
}

TEST(HFConfigErrors, MissingFile) {
  TempDir dir;
  std::string path = dir.file("config.json");
  StatusOr<ModelConfig> c = parseConfigFile(path);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.message(), path + ": cannot open: No such file or directory");
  c = parseConfigFile(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.message(), dir.path() + ": cannot open: Is a directory");
}

//===----------------------------------------------------------------------===//
// Robustness
//===----------------------------------------------------------------------===//

TEST(HFConfigErrors, RandomCorruptionNeverEscapes) {
  // Deterministic byte flips of a real config: parse either succeeds or
  // reports one line naming the source; nothing throws.
  const std::string good = readFile(fixtureDir("tiny-hybrid") + "/config.json");
  uint64_t state = 0x2545f4914f6cdd1dull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int failures = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text = good;
    int flips = 1 + next() % 3;
    for (int k = 0; k < flips; ++k)
      text[next() % text.size()] = static_cast<char>(next() & 0xff);
    StatusOr<ModelConfig> c = parseConfigText(text, "fuzz.json");
    if (c.ok())
      continue;
    ++failures;
    EXPECT_THAT(c.message(), StartsWith("fuzz.json: "));
    EXPECT_EQ(c.message().find('\n'), std::string::npos) << c.message();
  }
  EXPECT_GT(failures, 0);
}

TEST(HFConfigErrors, ControlCharactersAreEscaped) {
  json j = hybridConfig();
  j["layers_block_type"][0] = "foo\nbar";
  expectConfigError(j, "unknown layer type 'foo\\x0abar' at layer 0");
}
