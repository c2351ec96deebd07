// hf/HFConfig.h: checkpoint binding (tensor names, shapes and dtypes per
// block kind), checked against the fixtures, the demo model and hand-made
// safetensors headers.
#include "hf/HFConfig.h"

#include "TestUtil.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

using namespace nf;
using namespace nf::hf;
using namespace nf::test;
using ::testing::HasSubstr;

namespace {

const char *kAllFixtures[] = {"tiny-nano", "tiny-hybrid", "tiny-dense",
                              "tiny-latent", "tiny-hybrid-bf16"};

} // namespace
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
