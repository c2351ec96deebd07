// Nemotron-H config.json parsing and checkpoint binding (see HFConfig.h and
// docs/nemotron-h-reference.md §1 and §6).
//
// Defaults are applied only where HF NemotronHConfig applies them AND a wrong
// guess could not silently change the model's shapes; every field that sizes a
// weight of a block kind present in the model is required. nlohmann::json
// exceptions never escape: type checks happen before every get<>().
#include "hf/HFConfig.h"
#include "hf/HFInternal.h"
#include "nf/file.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <sstream>

namespace nf::hf {

namespace {

using json = nlohmann::json;
using ::nf::printable;

// A JSON value for a message: short enough to stay on one line.
std::string brief(const json &j) {
  std::string s = j.dump();
  if (s.size() > 40)
    s = s.substr(0, 37) + "...";
  return s;
}

std::string fmtDouble(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

//===----------------------------------------------------------------------===//
// Python's json module writes inf/nan as bare Infinity/-Infinity/NaN, which
// is not JSON; older HF versions saved time_step_limit that way. Rewrite those
// tokens (outside strings) to the {"__float__": ...} form HF 5 uses.
//===----------------------------------------------------------------------===//

std::string rewritePythonNonFinite(const std::string &text) {
  std::string out;
  out.reserve(text.size());
  bool inString = false;
  for (size_t i = 0; i < text.size();) {
    char c = text[i];
    if (inString) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[i + 1];
        i += 2;
        continue;
      }
      if (c == '"')
        inString = false;
      ++i;
      continue;
    }
    if (c == '"') {
      inString = true;
      out += c;
      ++i;
      continue;
    }
    bool replaced = false;
    for (const char *tok : {"-Infinity", "Infinity", "NaN"}) {
      size_t n = std::strlen(tok);
      if (text.compare(i, n, tok) == 0 &&
          (i + n == text.size() || !std::isalnum((unsigned char)text[i + n]))) {
        out += std::string("{\"__float__\": \"") + tok + "\"}";
        i += n;
        replaced = true;
        break;
      }
    }
    if (!replaced) {
      out += c;
      ++i;
    }
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Typed field access with aliases. The first error is kept; later reads are
// no-ops so that parsing code can read straight through and check once.
//===----------------------------------------------------------------------===//

class FieldReader {
public:
  FieldReader(const json &root, const std::string &source)
      : root_(root), source_(source) {}

  bool failed() const { return failed_; }
  const std::string &error() const { return error_; }

  void fail(const std::string &msg) {
    if (!failed_) {
      failed_ = true;
      error_ = source_ + ": " + msg;
    }
  }

  /// The value under `key` or one of its aliases (null counts as absent).
  /// When several spellings are present they must agree. `name` receives the
  /// spelling found, for messages.
  const json *find(const char *key, std::initializer_list<const char *> aliases,
                   std::string *name = nullptr) {
    const json *found = nullptr;
    std::string foundName;
    auto consider = [&](const char *k) {
      auto it = root_.find(k);
      if (it == root_.end() || it->is_null())
        return;
      if (!found) {
        found = &*it;
        foundName = k;
      } else if (*found != *it) {
        fail("conflicting config fields '" + foundName + "' (" + brief(*found) +
             ") and '" + k + "' (" + brief(*it) + ")");
      }
    };
    consider(key);
    for (const char *a : aliases)
      consider(a);
    if (name)
      *name = found ? foundName : std::string(key);
    return failed_ ? nullptr : found;
  }

  std::optional<int64_t>
  getInt(const char *key, std::initializer_list<const char *> aliases = {}) {
    std::string name;
    const json *v = find(key, aliases, &name);
    if (!v)
      return std::nullopt;
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
      return v->get<int64_t>();
    }
    fail("config field '" + name + "' must be an integer (got " + brief(*v) +
         ")");
    return std::nullopt;
  }

  int64_t intOr(const char *key, std::initializer_list<const char *> aliases,
                int64_t dflt) {
    return getInt(key, aliases).value_or(dflt);
  }

  /// Numbers, or {"__float__": "Infinity"|"-Infinity"|"NaN"} as HF 5 writes.
  std::optional<double> asDouble(const json &v, const std::string &name) {
    if (v.is_number())
      return v.get<double>();
    if (v.is_object() && v.size() == 1 && v.contains("__float__") &&
        v["__float__"].is_string()) {
      const std::string &s = v["__float__"].get_ref<const std::string &>();
      if (s == "Infinity" || s == "inf")
        return std::numeric_limits<double>::infinity();
      if (s == "-Infinity" || s == "-inf")
        return -std::numeric_limits<double>::infinity();
      if (s == "NaN" || s == "nan")
        return std::numeric_limits<double>::quiet_NaN();
    }
    fail("config field '" + name + "' must be a number (got " + brief(v) + ")");
    return std::nullopt;
  }

  std::optional<double>
  getDouble(const char *key, std::initializer_list<const char *> aliases = {}) {
    std::string name;
    const json *v = find(key, aliases, &name);
    if (!v)
      return std::nullopt;
    return asDouble(*v, name);
  }

  double doubleOr(const char *key, std::initializer_list<const char *> aliases,
                  double dflt) {
    return getDouble(key, aliases).value_or(dflt);
  }

  bool boolOr(const char *key, std::initializer_list<const char *> aliases,
              bool dflt) {
    std::string name;
    const json *v = find(key, aliases, &name);
    if (!v)
      return dflt;
    if (v->is_boolean())
      return v->get<bool>();
    fail("config field '" + name + "' must be true or false (got " + brief(*v) +
         ")");
    return dflt;
  }

  std::optional<std::string> getString(const char *key) {
    const json *v = find(key, {});
    if (!v)
      return std::nullopt;
    if (v->is_string())
      return v->get<std::string>();
    fail(std::string("config field '") + key + "' must be a string (got " +
         brief(*v) + ")");
    return std::nullopt;
  }

  /// bos/pad: an integer or null (-> -1); absent -> HF's default.
  int64_t tokenId(const char *key, int64_t hfDefault) {
    auto it = root_.find(key);
    if (it == root_.end())
      return hfDefault;
    if (it->is_null())
      return -1;
    return getInt(key).value_or(-1);
  }

private:
  const json &root_;
  const std::string &source_;
  bool failed_ = false;
  std::string error_;
};

std::optional<BlockKind> kindFromTypeName(const std::string &s) {
  // transformers-5 names, plus the legacy names HF still remaps.
  if (s == "linear_attention" || s == "mamba")
    return BlockKind::Mamba;
  if (s == "full_attention" || s == "attention")
    return BlockKind::Attention;
  if (s == "mlp")
    return BlockKind::Mlp;
  if (s == "moe")
    return BlockKind::Moe;
  return std::nullopt;
}

std::optional<BlockKind> kindFromLetter(char c) {
  switch (c) {
  case 'M':
    return BlockKind::Mamba;
  case '*':
    return BlockKind::Attention;
  case '-':
    return BlockKind::Mlp;
  case 'E':
    return BlockKind::Moe;
  default:
    return std::nullopt;
  }
}

void parseLayers(const json &root, FieldReader &r, ModelConfig &c) {
  // HF: an explicit layers_block_type wins over hybrid_override_pattern.
  auto lbt = root.find("layers_block_type");
  auto hop = root.find("hybrid_override_pattern");
  if (lbt != root.end() && !lbt->is_null()) {
    if (!lbt->is_array())
      return r.fail("config field 'layers_block_type' must be a list of "
                    "strings (got " +
                    brief(*lbt) + ")");
    for (size_t i = 0; i < lbt->size(); ++i) {
      const json &e = (*lbt)[i];
      if (!e.is_string())
        return r.fail("layers_block_type[" + std::to_string(i) +
                      "] is not a string (got " + brief(e) + ")");
      std::optional<BlockKind> k = kindFromTypeName(e.get<std::string>());
      if (!k)
        return r.fail("unknown layer type '" + printable(e.get<std::string>()) +
                      "' at layer " + std::to_string(i));
      c.layers.push_back(*k);
    }
  } else if (hop != root.end() && !hop->is_null()) {
    if (!hop->is_string())
      return r.fail("config field 'hybrid_override_pattern' must be a string "
                    "(got " +
                    brief(*hop) + ")");
    const std::string &p = hop->get_ref<const std::string &>();
    for (size_t i = 0; i < p.size(); ++i) {
      std::optional<BlockKind> k = kindFromLetter(p[i]);
      if (!k)
        return r.fail("unknown layer type '" + printable(std::string(1, p[i])) +
                      "' at layer " + std::to_string(i) +
                      " of hybrid_override_pattern (expected M, *, - or E)");
      c.layers.push_back(*k);
    }
  } else {
    return r.fail("missing config field 'layers_block_type' (or "
                  "'hybrid_override_pattern')");
  }
  if (c.layers.empty())
    r.fail("the layer pattern is empty");
}

// Validation helpers; each records the first failure in `r`.
void requireField(FieldReader &r, const std::optional<int64_t> &v,
                  const char *key, const char *kind) {
  if (!v && !r.failed())
    r.fail(std::string("missing config field '") + key + "' (needed by the " +
           kind + " layers)");
}

void requirePositive(FieldReader &r, int64_t v, const char *key) {
  if (v <= 0 && !r.failed())
    r.fail(std::string("config field '") + key + "' must be positive (got " +
           std::to_string(v) + ")");
}

void parseEos(const json &root, FieldReader &r, ModelConfig &c) {
  auto it = root.find("eos_token_id");
  if (it == root.end()) { // HF default
    c.eosTokenId = 2;
    c.eosTokenIds = {2};
    return;
  }
  if (it->is_null())
    return;
  auto one = [&](const json &v) -> std::optional<int64_t> {
    if (v.is_number_integer() &&
        !(v.is_number_unsigned() &&
          v.get<uint64_t>() >
              static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
      return v.get<int64_t>();
    r.fail("config field 'eos_token_id' must be an integer or a list of "
           "integers (got " +
           brief(*it) + ")");
    return std::nullopt;
  };
  if (it->is_array()) {
    for (const json &v : *it) {
      std::optional<int64_t> id = one(v);
      if (!id)
        return;
      c.eosTokenIds.push_back(*id);
    }
  } else if (std::optional<int64_t> id = one(*it)) {
    c.eosTokenIds.push_back(*id);
  }
  if (!c.eosTokenIds.empty())
    c.eosTokenId = c.eosTokenIds.front();
}

void parseTimeStepLimit(FieldReader &r, ModelConfig &c) {
  c.timeStepLimitMin = 0.0;
  c.timeStepLimitMax = std::numeric_limits<double>::infinity();
  std::string name;
  const json *v = r.find("time_step_limit", {"mamba_dt_limit"}, &name);
  if (!v)
    return;
  if (!v->is_array() || v->size() != 2)
    return r.fail("config field '" + name +
                  "' must be a list [min, max] (got " + brief(*v) + ")");
  std::optional<double> lo = r.asDouble((*v)[0], name);
  std::optional<double> hi = r.asDouble((*v)[1], name);
  if (!lo || !hi)
    return;
  if (std::isnan(*lo) || std::isnan(*hi) || *lo < 0 || *lo > *hi)
    return r.fail("config field '" + name + "' [" + fmtDouble(*lo) + ", " +
                  fmtDouble(*hi) + "] is not an interval 0 <= min <= max");
  c.timeStepLimitMin = *lo;
  c.timeStepLimitMax = *hi;
}

StatusOr<ModelConfig> parseConfigJson(const json &root,
                                      const std::string &source) {
  if (!root.is_object())
    return Status::error(source + ": config is not a JSON object");
  FieldReader r(root, source);
  ModelConfig c;
  c.sourcePath = source;

  parseLayers(root, r, c);
  bool hasM = c.hasKind(BlockKind::Mamba),
       hasA = c.hasKind(BlockKind::Attention), hasD = c.hasKind(BlockKind::Mlp),
       hasE = c.hasKind(BlockKind::Moe);

  // Model-wide fields.
  std::optional<int64_t> vocab = r.getInt("vocab_size");
  std::optional<int64_t> hidden = r.getInt("hidden_size");
  if (!vocab && !r.failed())
    r.fail("missing config field 'vocab_size'");
  if (!hidden && !r.failed())
    r.fail("missing config field 'hidden_size'");
  c.vocabSize = vocab.value_or(0);
  c.hiddenSize = hidden.value_or(0);
  c.layerNormEpsilon =
      r.doubleOr("layer_norm_epsilon", {"rms_norm_eps", "norm_eps"}, 1e-5);
  c.tieWordEmbeddings = r.boolOr("tie_word_embeddings", {}, false);
  c.bosTokenId = r.tokenId("bos_token_id", 1);
  c.padTokenId = r.tokenId("pad_token_id", 0);
  parseEos(root, r, c);
  c.ropeTheta = r.getDouble("rope_theta");
  // Informative only; transformers >= 4.56 writes "dtype", older "torch_dtype".
  if (root.contains("dtype") && !root["dtype"].is_null())
    c.weightDtype = r.getString("dtype").value_or("");
  else
    c.weightDtype = r.getString("torch_dtype").value_or("");

  // Attention. head_dim: HF default 128; NVIDIA's remote-code configs spell it
  // attention_head_dim.
  std::optional<int64_t> nq = r.getInt("num_attention_heads");
  std::optional<int64_t> nkv;
  if (root.contains("num_key_value_heads") &&
      root["num_key_value_heads"].is_null())
    nkv = nq; // HF: null means multi-head attention
  else
    nkv = r.getInt("num_key_value_heads");
  c.headDim = r.intOr("head_dim", {"attention_head_dim"}, 128);

  // Mamba2.
  std::optional<int64_t> nh = r.getInt("mamba_num_heads", {"mamba_n_heads"});
  std::optional<int64_t> hp = r.getInt("mamba_head_dim", {"mamba_d_head"});
  std::optional<int64_t> ns = r.getInt("ssm_state_size", {"mamba_d_state"});
  std::optional<int64_t> ng = r.getInt("n_groups", {"mamba_n_groups"});
  std::optional<int64_t> ck = r.getInt("conv_kernel", {"mamba_d_conv"});
  c.chunkSize = r.intOr("chunk_size", {"mamba_chunk_size"}, 128);
  c.useConvBias = r.boolOr("use_conv_bias", {"mamba_conv_bias"}, true);
  c.useBias = r.boolOr("use_bias", {}, false);
  parseTimeStepLimit(r, c);
  std::string mambaAct = r.getString("mamba_hidden_act").value_or("silu");

  // Dense MLP and MoE.
  std::optional<int64_t> inter = r.getInt("intermediate_size");
  std::optional<int64_t> ne = r.getInt("n_routed_experts");
  std::optional<int64_t> topk = r.getInt("num_experts_per_tok");
  std::optional<int64_t> moeInter = r.getInt("moe_intermediate_size");
  std::optional<int64_t> sharedInter =
      r.getInt("moe_shared_expert_intermediate_size");
  c.nGroup = r.intOr("n_group", {}, 1);
  c.topkGroup = r.intOr("topk_group", {}, 1);
  c.normTopkProb = r.boolOr("norm_topk_prob", {}, true);
  c.routedScalingFactor = r.doubleOr("routed_scaling_factor", {}, 1.0);
  c.moeLatentSize = r.getInt("moe_latent_size");
  c.activation = r.getString("mlp_hidden_act").value_or("relu2");
  bool mlpBias = r.boolOr("mlp_bias", {}, false);

  if (r.failed())
    return Status::error(r.error());

  c.numAttentionHeads = nq.value_or(0);
  c.numKeyValueHeads = nkv.value_or(0);
  c.mambaNumHeads = nh.value_or(0);
  c.mambaHeadDim = hp.value_or(0);
  c.ssmStateSize = ns.value_or(0);
  c.nGroups = ng.value_or(0);
  c.convKernel = ck.value_or(0);
  c.intermediateSize = inter.value_or(0);
  c.nRoutedExperts = ne.value_or(0);
  c.numExpertsPerTok = topk.value_or(0);
  c.moeIntermediateSize = moeInter.value_or(0);
  c.moeSharedExpertIntermediateSize = sharedInter.value_or(0);

  // Required fields and positive sizes, for the block kinds present.
  requirePositive(r, c.vocabSize, "vocab_size");
  requirePositive(r, c.hiddenSize, "hidden_size");
  if (!r.failed() &&
      !(c.layerNormEpsilon > 0 && std::isfinite(c.layerNormEpsilon)))
    r.fail("config field 'layer_norm_epsilon' must be positive (got " +
           fmtDouble(c.layerNormEpsilon) + ")");
  if (hasM) {
    requireField(r, nh, "mamba_num_heads", "mamba");
    requireField(r, hp, "mamba_head_dim", "mamba");
    requireField(r, ns, "ssm_state_size", "mamba");
    requireField(r, ng, "n_groups", "mamba");
    requireField(r, ck, "conv_kernel", "mamba");
    requirePositive(r, c.mambaNumHeads, "mamba_num_heads");
    requirePositive(r, c.mambaHeadDim, "mamba_head_dim");
    requirePositive(r, c.ssmStateSize, "ssm_state_size");
    requirePositive(r, c.nGroups, "n_groups");
    requirePositive(r, c.convKernel, "conv_kernel");
    requirePositive(r, c.chunkSize, "chunk_size");
    if (!r.failed() && c.mambaNumHeads % c.nGroups != 0)
      r.fail("mamba_num_heads (" + std::to_string(c.mambaNumHeads) +
             ") is not a multiple of n_groups (" + std::to_string(c.nGroups) +
             ")");
    if (!r.failed() && mambaAct != "silu")
      r.fail("unsupported mamba_hidden_act '" + printable(mambaAct) +
             "' (only silu is supported)");
    // Not a shape question: nf has no Mamba projection biases, and silently
    // dropping them would compute a different model.
    if (!r.failed() && c.useBias)
      r.fail("use_bias=true (Mamba in_proj/out_proj biases) is not supported");
  }
  if (hasA) {
    requireField(r, nq, "num_attention_heads", "attention");
    requireField(r, nkv, "num_key_value_heads", "attention");
    requirePositive(r, c.numAttentionHeads, "num_attention_heads");
    requirePositive(r, c.numKeyValueHeads, "num_key_value_heads");
    requirePositive(r, c.headDim, "head_dim");
    if (!r.failed() && c.numAttentionHeads % c.numKeyValueHeads != 0)
      r.fail("num_attention_heads (" + std::to_string(c.numAttentionHeads) +
             ") is not a multiple of num_key_value_heads (" +
             std::to_string(c.numKeyValueHeads) + ")");
  }
  if (hasD) {
    requireField(r, inter, "intermediate_size", "mlp");
    requirePositive(r, c.intermediateSize, "intermediate_size");
  }
  if (hasE) {
    requireField(r, ne, "n_routed_experts", "moe");
    requireField(r, topk, "num_experts_per_tok", "moe");
    requireField(r, moeInter, "moe_intermediate_size", "moe");
    requireField(r, sharedInter, "moe_shared_expert_intermediate_size", "moe");
    requirePositive(r, c.nRoutedExperts, "n_routed_experts");
    requirePositive(r, c.numExpertsPerTok, "num_experts_per_tok");
    requirePositive(r, c.moeIntermediateSize, "moe_intermediate_size");
    requirePositive(r, c.moeSharedExpertIntermediateSize,
                    "moe_shared_expert_intermediate_size");
    requirePositive(r, c.nGroup, "n_group");
    requirePositive(r, c.topkGroup, "topk_group");
    if (c.moeLatentSize)
      requirePositive(r, *c.moeLatentSize, "moe_latent_size");
    if (!r.failed() && c.numExpertsPerTok > c.nRoutedExperts)
      r.fail("num_experts_per_tok (" + std::to_string(c.numExpertsPerTok) +
             ") exceeds n_routed_experts (" + std::to_string(c.nRoutedExperts) +
             ")");
    if (!r.failed() && c.nRoutedExperts % c.nGroup != 0)
      r.fail("n_routed_experts (" + std::to_string(c.nRoutedExperts) +
             ") is not a multiple of n_group (" + std::to_string(c.nGroup) +
             ")");
    if (!r.failed() && c.topkGroup > c.nGroup)
      r.fail("topk_group (" + std::to_string(c.topkGroup) +
             ") exceeds n_group (" + std::to_string(c.nGroup) + ")");
    // Group-limited routing only offers experts of the topk_group best groups.
    if (!r.failed() &&
        c.numExpertsPerTok > c.topkGroup * (c.nRoutedExperts / c.nGroup))
      r.fail("num_experts_per_tok (" + std::to_string(c.numExpertsPerTok) +
             ") exceeds the " +
             std::to_string(c.topkGroup * (c.nRoutedExperts / c.nGroup)) +
             " experts of the topk_group (" + std::to_string(c.topkGroup) +
             ") selected groups");
    if (!r.failed() &&
        !(c.routedScalingFactor > 0 && std::isfinite(c.routedScalingFactor)))
      r.fail("config field 'routed_scaling_factor' must be positive (got " +
             fmtDouble(c.routedScalingFactor) + ")");
  }
  if (hasD || hasE) {
    if (!r.failed() && c.activation != "relu2")
      r.fail("unsupported mlp_hidden_act '" + printable(c.activation) +
             "' (only relu2 is supported)");
    if (!r.failed() && mlpBias)
      r.fail("mlp_bias=true (MLP/expert projection biases) is not supported");
  }
  if (r.failed())
    return Status::error(r.error());
  if (auto q = root.find("quantization_config");
      q != root.end() && !q->is_null()) {
    StatusOr<QuantConfig> quant = detail::parseQuantizationConfig(*q, source);
    if (!quant)
      return quant.status();
    c.quantization = std::move(*quant);
  }
  return c;
}

} // namespace

char blockKindLetter(BlockKind k) {
  switch (k) {
  case BlockKind::Mamba:
    return 'M';
  case BlockKind::Attention:
    return '*';
  case BlockKind::Mlp:
    return '-';
  case BlockKind::Moe:
    return 'E';
  }
  return '?';
}

const char *blockKindName(BlockKind k) {
  switch (k) {
  case BlockKind::Mamba:
    return "mamba";
  case BlockKind::Attention:
    return "attention";
  case BlockKind::Mlp:
    return "mlp";
  case BlockKind::Moe:
    return "moe";
  }
  return "?";
}

bool ModelConfig::hasKind(BlockKind k) const {
  for (BlockKind l : layers)
    if (l == k)
      return true;
  return false;
}

StatusOr<ModelConfig> parseConfigText(const std::string &text,
                                      const std::string &source) {
  try {
    json root;
    try {
      root = json::parse(text);
    } catch (const json::parse_error &e) {
      // Retry with Python's bare Infinity/NaN rewritten; report the original
      // position if that does not help either.
      std::string rewritten = rewritePythonNonFinite(text);
      bool ok = false;
      if (rewritten != text) {
        root = json::parse(rewritten, nullptr, /*allow_exceptions=*/false);
        ok = !root.is_discarded();
      }
      if (!ok)
        return Status::error(source + ": not valid JSON (error at byte " +
                             std::to_string(e.byte) + ")");
    }
    return parseConfigJson(root, source);
  } catch (const std::exception &e) {
    return Status::error(source + ": cannot parse config: " + e.what());
  }
}

StatusOr<ModelConfig> parseConfigFile(const std::string &path) {
  try {
    StatusOr<std::string> text = readWholeFile(path);
    if (!text)
      return text.status();
    return parseConfigText(*text, path);
  } catch (const std::exception &e) {
    return Status::error(path + ": cannot read config: " + e.what());
  }
}

StatusOr<ModelConfig> parseCheckpointConfig(const std::string &dir) {
  const std::filesystem::path root(dir);
  StatusOr<ModelConfig> config =
      parseConfigFile((root / "config.json").string());
  if (!config)
    return config;
  // Anything at that path is read (and a FIFO or directory refused there).
  const std::string descriptor = (root / "hf_quant_config.json").string();
  std::error_code ec;
  if (std::filesystem::symlink_status(descriptor, ec).type() ==
      std::filesystem::file_type::not_found)
    return config;
  StatusOr<QuantConfig> quant = parseHfQuantConfigFile(descriptor);
  if (!quant)
    return quant.status();
  StatusOr<QuantConfig> merged =
      mergeQuantConfigs(std::move(*quant), config->quantization);
  if (!merged)
    return merged.status();
  config->quantization = std::move(*merged);
  return config;
}

} // namespace nf::hf
