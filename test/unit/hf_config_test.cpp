// hf/HFConfig.h: config.json parsing and checkpoint binding, checked against
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
// Binding
//===----------------------------------------------------------------------===//

namespace {

// Roles per block kind, in the documented order (HFConfig.h / brief).
std::vector<std::string> expectedRoles(const ModelConfig &c, BlockKind k) {
  switch (k) {
  case BlockKind::Mamba:
    if (c.useConvBias)
      return {"in_proj", "conv_weight", "conv_bias", "dt_bias",
              "A_log",   "D",           "norm",      "out_proj"};
    return {"in_proj", "conv_weight", "dt_bias", "A_log",
            "D",       "norm",        "out_proj"};
  case BlockKind::Attention:
    return {"q_proj", "k_proj", "v_proj", "o_proj"};
  case BlockKind::Mlp:
    return {"up_proj", "down_proj"};
  case BlockKind::Moe:
    if (c.moeLatentSize)
      return {"gate",      "correction_bias", "experts_up",  "experts_down",
              "shared_up", "shared_down",     "latent_down", "latent_up"};
    return {"gate",         "correction_bias", "experts_up",
            "experts_down", "shared_up",       "shared_down"};
  }
  return {};
}

// Hub tensor-name suffix per role (docs §6).
std::string hubSuffix(const std::string &role) {
  static const std::map<std::string, std::string> m = {
      {"in_proj", "mixer.in_proj.weight"},
      {"conv_weight", "mixer.conv1d.weight"},
      {"conv_bias", "mixer.conv1d.bias"},
      {"dt_bias", "mixer.dt_bias"},
      {"A_log", "mixer.A_log"},
      {"D", "mixer.D"},
      {"norm", "mixer.norm.weight"},
      {"out_proj", "mixer.out_proj.weight"},
      {"q_proj", "mixer.q_proj.weight"},
      {"k_proj", "mixer.k_proj.weight"},
      {"v_proj", "mixer.v_proj.weight"},
      {"o_proj", "mixer.o_proj.weight"},
      {"up_proj", "mixer.up_proj.weight"},
      {"down_proj", "mixer.down_proj.weight"},
      {"gate", "mixer.gate.weight"},
      {"correction_bias", "mixer.gate.e_score_correction_bias"},
      {"shared_up", "mixer.shared_experts.up_proj.weight"},
      {"shared_down", "mixer.shared_experts.down_proj.weight"},
      {"latent_down", "mixer.fc1_latent_proj.weight"},
      {"latent_up", "mixer.fc2_latent_proj.weight"},
  };
  return m.at(role);
}

// Checks a binding of a Hub-layout checkpoint against its raw header.
void expectBindingMatchesHeader(const ModelConfig &c, const ModelBinding &b,
                                const std::string &file) {
  json h = rawHeader(file);
  auto shapeOf = [&](const std::string &n) {
    return h.at(n)["shape"].get<std::vector<int64_t>>();
  };
  auto dtypeOf = [&](const std::string &n) {
    return h.at(n)["dtype"].get<std::string>();
  };
  EXPECT_EQ(b.files, std::vector<std::string>{file});
  EXPECT_EQ(b.embedding.role, "embedding");
  EXPECT_EQ(b.embedding.tensors,
            std::vector<std::string>{"backbone.embeddings.weight"});
  EXPECT_EQ(b.embedding.shape, shapeOf("backbone.embeddings.weight"));
  EXPECT_EQ(b.embedding.file, file);
  EXPECT_EQ(b.finalNorm.role, "final_norm");
  EXPECT_EQ(b.finalNorm.tensors,
            std::vector<std::string>{"backbone.norm_f.weight"});
  EXPECT_EQ(b.lmHead.role, "lm_head");
  EXPECT_EQ(b.lmHead.tensors, std::vector<std::string>{"lm_head.weight"});
  EXPECT_EQ(b.lmHead.shape, shapeOf("lm_head.weight"));
  ASSERT_EQ(b.layers.size(), c.layers.size());
  for (size_t i = 0; i < b.layers.size(); ++i) {
    const LayerBinding &lb = b.layers[i];
    SCOPED_TRACE("layer " + std::to_string(i));
    std::string base = "backbone.layers." + std::to_string(i) + ".";
    EXPECT_EQ(lb.index, static_cast<int64_t>(i));
    EXPECT_EQ(lb.kind, c.layers[i]);
    EXPECT_EQ(lb.norm.tensors, std::vector<std::string>{base + "norm.weight"});
    EXPECT_EQ(lb.norm.shape, shapeOf(base + "norm.weight"));
    std::vector<std::string> roles;
    for (const WeightBinding &w : lb.mixer)
      roles.push_back(w.role);
    EXPECT_EQ(roles, expectedRoles(c, lb.kind));
    for (const WeightBinding &w : lb.mixer) {
      SCOPED_TRACE(w.role);
      EXPECT_EQ(lb.find(w.role), &w);
      EXPECT_EQ(w.file, file);
      if (w.role == "experts_up" || w.role == "experts_down") {
        std::string proj = w.role == "experts_up" ? "up_proj" : "down_proj";
        ASSERT_TRUE(w.stacked);
        ASSERT_EQ(w.tensors.size(), static_cast<size_t>(c.nRoutedExperts));
        for (int64_t e = 0; e < c.nRoutedExperts; ++e)
          EXPECT_EQ(w.tensors[e], base + "mixer.experts." + std::to_string(e) +
                                      "." + proj + ".weight");
        std::vector<int64_t> stacked = {c.nRoutedExperts};
        for (int64_t d : shapeOf(w.tensors[0]))
          stacked.push_back(d);
        EXPECT_EQ(w.shape, stacked);
        EXPECT_STREQ(dtypeName(w.dtype), dtypeOf(w.tensors[0]).c_str());
      } else {
        std::string name = base + hubSuffix(w.role);
        EXPECT_FALSE(w.stacked);
        EXPECT_EQ(w.tensors, std::vector<std::string>{name});
        EXPECT_EQ(w.shape, shapeOf(name));
        EXPECT_STREQ(dtypeName(w.dtype), dtypeOf(name).c_str());
      }
    }
  }
  EXPECT_EQ(b.layers[0].find("no_such_role"), nullptr);
}

// config.json + checkpoint of a fixture, both parsed.
struct Loaded {
  ModelConfig config;
  Checkpoint ckpt;
};

Loaded load(const std::string &dir) {
  StatusOr<ModelConfig> c = parseConfigFile(dir + "/config.json");
  StatusOr<Checkpoint> k = openCheckpoint(dir);
  EXPECT_TRUE(c.ok()) << c.message();
  EXPECT_TRUE(k.ok()) << k.message();
  return {c.ok() ? *c : ModelConfig{}, k.ok() ? *k : Checkpoint{}};
}

// A copy of fixture `name` (config + rewritten weights) in `dir`; `edit`
// changes the tensor list before it is written.
template <typename Edit>
Loaded rewrittenFixture(const TempDir &dir, const std::string &name,
                        Edit edit) {
  std::vector<TensorSpec> specs =
      rawTensorSpecs(fixtureDir(name) + "/model.safetensors");
  edit(specs);
  writeFile(dir.file("model.safetensors"), buildSafetensors(specs));
  writeFile(dir.file("config.json"),
            readFile(fixtureDir(name) + "/config.json"));
  return load(dir.path());
}

void expectBindError(const Loaded &l, const std::string &message) {
  StatusOr<ModelBinding> b = bindCheckpoint(l.config, l.ckpt);
  ASSERT_FALSE(b.ok()) << "bound unexpectedly";
  EXPECT_EQ(b.message(), message);
}

} // namespace

TEST(Bind, EveryFixtureAndPydocMoe) {
  std::vector<std::string> dirs;
  for (const char *n : kAllFixtures)
    dirs.push_back(fixtureDir(n));
  dirs.push_back(examplesDir() + "/pydoc-moe");
  for (const std::string &dir : dirs) {
    SCOPED_TRACE(dir);
    Loaded l = load(dir);
    StatusOr<ModelBinding> b = bindCheckpoint(l.config, l.ckpt);
    ASSERT_TRUE(b.ok()) << b.message();
    expectBindingMatchesHeader(l.config, *b,
                               (fs::path(dir) / "model.safetensors").string());
  }
}

TEST(Bind, Bf16Dtypes) {
  Loaded l = load(examplesDir() + "/pydoc-moe");
  StatusOr<ModelBinding> b = bindCheckpoint(l.config, l.ckpt);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(b->embedding.dtype, DType::BF16);
  EXPECT_EQ(b->layers[1].find("experts_up")->dtype, DType::BF16);
  EXPECT_EQ(b->layers[1].find("experts_up")->shape,
            (std::vector<int64_t>{16, 128, 256}));
  EXPECT_EQ(b->layers[1].find("experts_down")->shape,
            (std::vector<int64_t>{16, 256, 128}));
}

TEST(Bind, LatentProjections) {
  Loaded l = load(fixtureDir("tiny-latent"));
  StatusOr<ModelBinding> b = bindCheckpoint(l.config, l.ckpt);
  ASSERT_TRUE(b.ok()) << b.message();
  const LayerBinding &moe = b->layers[2];
  ASSERT_EQ(moe.kind, BlockKind::Moe);
  // Shapes from the fixture header: experts run in the 32-wide latent space.
  EXPECT_EQ(moe.find("experts_up")->shape, (std::vector<int64_t>{12, 24, 32}));
  EXPECT_EQ(moe.find("latent_down")->tensors,
            std::vector<std::string>{
                "backbone.layers.2.mixer.fc1_latent_proj.weight"});
  EXPECT_EQ(moe.find("latent_down")->shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(moe.find("latent_up")->shape, (std::vector<int64_t>{64, 32}));
}

TEST(Bind, TiedFixtureKeepsItsLmHead) {
  // tiny-nano is tied but ships its own lm_head.weight, and its HF reference
  // logits were computed with that tensor.
  Loaded l = load(fixtureDir("tiny-nano"));
  ASSERT_TRUE(l.config.tieWordEmbeddings);
  StatusOr<ModelBinding> b = bindCheckpoint(l.config, l.ckpt);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(b->lmHead.tensors, std::vector<std::string>{"lm_head.weight"});
}

TEST(Bind, TiedEmbeddingsWithoutLmHead) {
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-nano", [](auto &specs) {
    eraseSpec(specs, "lm_head.weight");
  });
  StatusOr<ModelBinding> b = bindCheckpoint(l.config, l.ckpt);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(b->lmHead.role, "lm_head");
  EXPECT_EQ(b->lmHead.tensors,
            std::vector<std::string>{"backbone.embeddings.weight"});
  EXPECT_EQ(b->lmHead.shape, (std::vector<int64_t>{384, 48}));
}

TEST(Bind, UntiedWithoutLmHead) {
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-hybrid", [](auto &specs) {
    eraseSpec(specs, "lm_head.weight");
  });
  expectBindError(l, dir.file("model.safetensors") +
                         ": missing tensor 'lm_head.weight' (lm_head; "
                         "tie_word_embeddings is false)");
}

TEST(Bind, StackedExpertsWithModelPrefix) {
  // HF's in-memory layout: model.* names, experts stacked into one tensor
  // (with or without a .weight suffix), embedding.weight spelling.
  for (bool weightSuffix : {false, true}) {
    SCOPED_TRACE(weightSuffix);
    TempDir dir;
    Loaded hub = load(fixtureDir("tiny-hybrid"));
    const int64_t E = hub.config.nRoutedExperts;
    Loaded l = rewrittenFixture(dir, "tiny-hybrid", [&](auto &specs) {
      std::vector<TensorSpec> out;
      for (TensorSpec s : specs) {
        if (s.name == "backbone.embeddings.weight")
          s.name = "backbone.embedding.weight";
        if (s.name.rfind("backbone.", 0) == 0)
          s.name = "model." + s.name.substr(9);
        size_t at = s.name.find(".mixer.experts.");
        if (at != std::string::npos) {
          std::string rest = s.name.substr(at + 15); // "{j}.up_proj.weight"
          if (rest.rfind("0.", 0) != 0)
            continue; // only expert 0 becomes the stacked tensor
          std::string proj = rest.substr(2, rest.find('.', 2) - 2);
          s.name = s.name.substr(0, at) + ".mixer.experts." + proj +
                   (weightSuffix ? ".weight" : "");
          s.shape.insert(s.shape.begin(), E);
        }
        out.push_back(s);
      }
      specs = out;
    });
    StatusOr<ModelBinding> b = bindCheckpoint(l.config, l.ckpt);
    ASSERT_TRUE(b.ok()) << b.message();
    EXPECT_EQ(b->embedding.tensors,
              std::vector<std::string>{"model.embedding.weight"});
    EXPECT_EQ(b->finalNorm.tensors,
              std::vector<std::string>{"model.norm_f.weight"});
    const WeightBinding *up = b->layers[1].find("experts_up");
    ASSERT_NE(up, nullptr);
    EXPECT_TRUE(up->stacked);
    EXPECT_EQ(up->tensors,
              std::vector<std::string>{
                  std::string("model.layers.1.mixer.experts.up_proj") +
                  (weightSuffix ? ".weight" : "")});
    EXPECT_EQ(up->shape, (std::vector<int64_t>{16, 32, 64}));
    const WeightBinding *down = b->layers[1].find("experts_down");
    EXPECT_EQ(down->shape, (std::vector<int64_t>{16, 64, 32}));
    EXPECT_EQ(b->layers[0].find("in_proj")->tensors,
              std::vector<std::string>{"model.layers.0.mixer.in_proj.weight"});
  }
}

TEST(Bind, StackedExpertsWrongShape) {
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-hybrid", [](auto &specs) {
    std::erase_if(specs, [](const TensorSpec &s) {
      return s.name.rfind("backbone.layers.1.mixer.experts.", 0) == 0;
    });
    specs.push_back(
        {"backbone.layers.1.mixer.experts.up_proj", "F32", {15, 32, 64}});
  });
  expectBindError(l, dir.file("model.safetensors") +
                         ": tensor 'backbone.layers.1.mixer.experts.up_proj' "
                         "has shape [15, 32, 64], expected [16, 32, 64]");
}

TEST(Bind, MissingTensor) {
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-hybrid", [](auto &specs) {
    eraseSpec(specs, "backbone.layers.3.mixer.in_proj.weight");
  });
  expectBindError(l, dir.file("model.safetensors") +
                         ": missing tensor "
                         "'backbone.layers.3.mixer.in_proj.weight' (layer 3, "
                         "mamba)");
}

TEST(Bind, MissingTopLevelTensors) {
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-dense", [](auto &specs) {
    eraseSpec(specs, "backbone.embeddings.weight");
  });
  expectBindError(l, dir.file("model.safetensors") +
                         ": missing tensor 'backbone.embeddings.weight' "
                         "(embedding)");
  TempDir dir2;
  l = rewrittenFixture(dir2, "tiny-dense", [](auto &specs) {
    eraseSpec(specs, "backbone.norm_f.weight");
  });
  expectBindError(l, dir2.file("model.safetensors") +
                         ": missing tensor 'backbone.norm_f.weight' (final "
                         "norm)");
}

TEST(Bind, MissingExperts) {
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-hybrid", [](auto &specs) {
    eraseSpec(specs, "backbone.layers.5.mixer.experts.7.down_proj.weight");
  });
  expectBindError(l, dir.file("model.safetensors") +
                         ": missing tensor "
                         "'backbone.layers.5.mixer.experts.7.down_proj.weight' "
                         "(layer 5, moe, expert 7)");

  TempDir dir2;
  l = rewrittenFixture(dir2, "tiny-hybrid", [](auto &specs) {
    std::erase_if(specs, [](const TensorSpec &s) {
      return s.name.rfind("backbone.layers.8.mixer.experts.", 0) == 0;
    });
  });
  expectBindError(l, dir2.file("model.safetensors") +
                         ": missing tensor "
                         "'backbone.layers.8.mixer.experts.0.up_proj.weight' "
                         "(layer 8, moe; no stacked "
                         "'backbone.layers.8.mixer.experts.up_proj' either)");
}

TEST(Bind, MoreExpertsThanConfigured) {
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-hybrid", [](auto &specs) {
    specs.push_back(
        {"backbone.layers.1.mixer.experts.16.up_proj.weight", "F32", {32, 64}});
  });
  expectBindError(l, dir.file("model.safetensors") +
                         ": tensor "
                         "'backbone.layers.1.mixer.experts.16.up_proj.weight' "
                         "exists but n_routed_experts is 16");
}

TEST(Bind, MisShapedTensor) {
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-hybrid", [](auto &specs) {
    findSpec(specs, "backbone.layers.2.mixer.k_proj.weight")->shape = {64, 64};
  });
  // nkv*hd = 2*16 rows (docs §6).
  expectBindError(l, dir.file("model.safetensors") +
                         ": tensor 'backbone.layers.2.mixer.k_proj.weight' has "
                         "shape [64, 64], expected [32, 64]");

  TempDir dir2;
  l = rewrittenFixture(dir2, "tiny-hybrid", [](auto &specs) {
    findSpec(specs, "backbone.layers.0.mixer.conv1d.weight")->shape = {192, 4};
  });
  expectBindError(l, dir2.file("model.safetensors") +
                         ": tensor 'backbone.layers.0.mixer.conv1d.weight' has "
                         "shape [192, 4], expected [192, 1, 4]");
}

TEST(Bind, UnsupportedDtype) {
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-hybrid", [](auto &specs) {
    findSpec(specs, "backbone.layers.4.mixer.up_proj.weight")->dtype = "I8";
  });
  expectBindError(l, dir.file("model.safetensors") +
                         ": tensor 'backbone.layers.4.mixer.up_proj.weight' "
                         "has unsupported dtype I8 (supported: F32, BF16, "
                         "F16)");
}

TEST(Bind, MixedExpertDtypes) {
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-hybrid", [](auto &specs) {
    findSpec(specs, "backbone.layers.1.mixer.experts.3.up_proj.weight")->dtype =
        "BF16";
  });
  expectBindError(l, dir.file("model.safetensors") +
                         ": tensor "
                         "'backbone.layers.1.mixer.experts.3.up_proj.weight' "
                         "has dtype BF16 but "
                         "'backbone.layers.1.mixer.experts.0.up_proj.weight' "
                         "has F32 (the experts of layer 1 must share one "
                         "dtype)");
}

TEST(Bind, PerTensorDtypesMayDiffer) {
  // HF keeps the router correction bias in f32 inside a bf16 model.
  TempDir dir;
  Loaded l = rewrittenFixture(dir, "tiny-hybrid-bf16", [](auto &specs) {
    findSpec(specs, "backbone.layers.1.mixer.gate.e_score_correction_bias")
        ->dtype = "F32";
    findSpec(specs, "backbone.layers.0.mixer.A_log")->dtype = "F16";
  });
  StatusOr<ModelBinding> b = bindCheckpoint(l.config, l.ckpt);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(b->layers[1].find("correction_bias")->dtype, DType::F32);
  EXPECT_EQ(b->layers[1].find("gate")->dtype, DType::BF16);
  EXPECT_EQ(b->layers[0].find("A_log")->dtype, DType::F16);
  EXPECT_EQ(b->layers[0].find("D")->dtype, DType::BF16);
}

TEST(Bind, NoConvBias) {
  Loaded l = load(fixtureDir("tiny-dense"));
  l.config.useConvBias = false;
  StatusOr<ModelBinding> b = bindCheckpoint(l.config, l.ckpt);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(b->layers[0].find("conv_bias"), nullptr);
  EXPECT_EQ(b->layers[0].mixer.size(), 7u);
}

TEST(Bind, ShardedCheckpoint) {
  // tiny-hybrid split in two shards by an index, as large Hub models are.
  TempDir dir;
  std::vector<TensorSpec> specs =
      rawTensorSpecs(fixtureDir("tiny-hybrid") + "/model.safetensors");
  std::vector<TensorSpec> first(specs.begin(),
                                specs.begin() + specs.size() / 2);
  std::vector<TensorSpec> second(specs.begin() + specs.size() / 2, specs.end());
  writeFile(dir.file("model-00001-of-00002.safetensors"),
            buildSafetensors(first));
  writeFile(dir.file("model-00002-of-00002.safetensors"),
            buildSafetensors(second));
  json index = {{"weight_map", json::object()}};
  for (const TensorSpec &s : first)
    index["weight_map"][s.name] = "model-00001-of-00002.safetensors";
  for (const TensorSpec &s : second)
    index["weight_map"][s.name] = "model-00002-of-00002.safetensors";
  writeFile(dir.file("model.safetensors.index.json"), index.dump());
  writeFile(dir.file("config.json"),
            readFile(fixtureDir("tiny-hybrid") + "/config.json"));

  Loaded l = load(dir.path());
  StatusOr<ModelBinding> b = bindCheckpoint(l.config, l.ckpt);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(b->files, (std::vector<std::string>{
                          dir.file("model-00001-of-00002.safetensors"),
                          dir.file("model-00002-of-00002.safetensors")}));
  EXPECT_EQ(b->layers.size(), 9u);
  // Each weight records the shard that holds it.
  for (const LayerBinding &lb : b->layers)
    for (const WeightBinding &w : lb.mixer)
      EXPECT_EQ(w.file, l.ckpt.find(w.tensors[0])->file);

  // A tensor missing from every shard is reported against the directory.
  Checkpoint partial = l.ckpt;
  partial.tensors.erase("backbone.layers.7.mixer.o_proj.weight");
  StatusOr<ModelBinding> bad = bindCheckpoint(l.config, partial);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.message(), dir.path() +
                               ": missing tensor "
                               "'backbone.layers.7.mixer.o_proj.weight' (layer "
                               "7, attention)");
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
