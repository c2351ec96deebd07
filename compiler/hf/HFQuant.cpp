// Quantised checkpoints: the declared quantisation (hf_quant_config.json,
// config.json's quantization_config) and the storage of each linear weight
// (see HFQuant.h). Every unsupported scheme or inconsistency is a one-line
// error naming the file; nlohmann::json exceptions never escape (types are
// checked before every get<>()).
#include "hf/HFQuant.h"
#include "hf/HFInternal.h"
#include "nf/file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <regex>

namespace nf::hf {

using ::nf::printable;
using ::nf::shapeString;

const char *quantSchemeName(QuantScheme s) {
  return s == QuantScheme::Fp8E4M3 ? "fp8_e4m3" : "int4";
}

const char *granularityName(QuantGranularity g) {
  switch (g) {
  case QuantGranularity::PerTensor:
    return "per_tensor";
  case QuantGranularity::PerChannel:
    return "per_channel";
  case QuantGranularity::PerGroup:
    return "per_group";
  }
  return "?";
}

const char *activationQuantName(ActivationQuant a) {
  switch (a) {
  case ActivationQuant::None:
    return "none";
  case ActivationQuant::StaticPerTensor:
    return "static_per_tensor";
  case ActivationQuant::DynamicPerToken:
    return "dynamic_per_token";
  }
  return "?";
}

namespace {

using json = nlohmann::json;

constexpr size_t kMaxPatternLength = 1000;

/// Reads fields of one JSON object; every message starts with `prefix`
/// ("<file>: quantization_config: config group 'g': ").
class Fields {
public:
  Fields(const json &obj, std::string prefix)
      : obj_(obj), prefix_(std::move(prefix)) {}

  Status error(const std::string &msg) const {
    return Status::error(prefix_ + msg);
  }
  const std::string &prefix() const { return prefix_; }

  /// The value of `key`, or null when absent or null.
  const json *get(const char *key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  /// A string field; `out` untouched when absent or null.
  Status string(const char *key, std::string &out) const {
    return scalar<std::string>(key, out, "a string",
                               [](const json &v) { return v.is_string(); });
  }

  Status integer(const char *key, std::optional<int64_t> &out) const {
    return scalar<int64_t>(key, out, "an integer", [](const json &v) {
      return v.is_number_integer() &&
             !(v.is_number_unsigned() &&
               v.get<uint64_t>() >
                   static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    });
  }

  Status boolean(const char *key, bool &out) const {
    return scalar<bool>(key, out, "true or false",
                        [](const json &v) { return v.is_boolean(); });
  }

  /// A list of strings (absent or null: empty).
  Status strings(const char *key, std::vector<std::string> &out) const {
    const json *v = get(key);
    if (!v)
      return Status::success();
    if (!v->is_array())
      return typeError(key, "a list of strings", *v);
    for (const json &e : *v) {
      if (!e.is_string())
        return typeError(key, "a list of strings", e);
      out.push_back(e.get<std::string>());
    }
    return Status::success();
  }

  static std::string brief(const json &j) {
    std::string s = printable(j.dump());
    return s.size() > 40 ? s.substr(0, 37) + "..." : s;
  }

private:
  /// "'key' must be <what> (got <value>)".
  Status typeError(const char *key, const char *what, const json &got) const {
    return error("'" + std::string(key) + "' must be " + what + " (got " +
                 brief(got) + ")");
  }

  /// A field of type `T` that `ok` accepts; `out` untouched when absent or
  /// null.
  template <typename T, typename Out, typename Ok>
  Status scalar(const char *key, Out &out, const char *what, Ok ok) const {
    const json *v = get(key);
    if (!v)
      return Status::success();
    if (!ok(*v))
      return typeError(key, what, *v);
    out = v->get<T>();
    return Status::success();
  }

  const json &obj_;
  std::string prefix_;
};

/// ModelOpt's exporter appends ".\0<sentinel>" to module names and, for
/// NemotronH, mangles the sentinel without stripping it
/// ("lm_head.\0backbone.pt_name_sentinel"): the name ends before ".\0".
std::string stripSentinel(std::string name) {
  size_t nul = name.find('\0');
  if (nul == std::string::npos)
    return name;
  name.resize(nul);
  if (!name.empty() && name.back() == '.')
    name.pop_back();
  return name;
}

/// Python fnmatch: '*' any run, '?' one character, everything else literal.
bool globMatch(const std::string &pattern, const std::string &name) {
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*')
    ++p;
  return p == pattern.size();
}

/// A compressed-tensors pattern: "re:" regexes must compile.
Status checkPattern(const Fields &f, const std::string &list,
                    const std::string &pattern) {
  if (pattern.size() > kMaxPatternLength)
    return f.error("'" + list + "' entry longer than " +
                   std::to_string(kMaxPatternLength) + " characters");
  if (pattern.rfind("re:", 0) != 0)
    return Status::success();
  try {
    std::regex re(pattern.substr(3));
  } catch (const std::regex_error &) {
    return f.error("'" + list + "' entry '" + printable(pattern) +
                   "' is not a regular expression nf can read");
  }
  return Status::success();
}

StatusOr<QuantConfig> modelOptConfig(const Fields &f, const std::string &source,
                                     const char *excludeKey) {
  QuantConfig c;
  c.producer = QuantConfig::Producer::ModelOpt;
  c.source = source;
  if (Status s = f.string("quant_algo", c.algo); !s)
    return s;
  if (c.algo.empty())
    return f.error("missing 'quant_algo'");
  if (c.algo != "FP8")
    return f.error("unsupported quant_algo '" + printable(c.algo) +
                   "' (supported: FP8)");
  // kv_cache_quant_algo only adds KV-cache scales, which nf does not apply
  // (the cache keeps the activation dtype); the weights read the same.
  std::string kv;
  if (Status s = f.string("kv_cache_quant_algo", kv); !s)
    return s;
  std::vector<std::string> exclude;
  if (Status s = f.strings(excludeKey, exclude); !s)
    return s;
  for (std::string &e : exclude)
    c.ignore.push_back(stripSentinel(std::move(e)));
  QuantGroup g;
  g.name = "quant_algo FP8";
  g.format = "modelopt";
  g.scheme = QuantScheme::Fp8E4M3;
  g.granularity = QuantGranularity::PerTensor;
  g.activations = ActivationQuant::StaticPerTensor;
  c.groups.push_back(std::move(g));
  return c;
}

/// The fields that open compressed-tensors QuantizationArgs of weights and
/// of inputs alike, in the order they are checked.
Status typeBitsStrategy(const Fields &f, std::string &type,
                        std::optional<int64_t> &bits, std::string &strategy) {
  if (Status s = f.string("type", type); !s)
    return s;
  if (Status s = f.integer("num_bits", bits); !s)
    return s;
  return f.string("strategy", strategy);
}

/// "<type> <bits>-bit" of QuantizationArgs, for messages.
std::string typeBitsName(const std::string &type,
                         const std::optional<int64_t> &bits) {
  return printable(type) + " " + (bits ? std::to_string(*bits) : "?") + "-bit";
}

/// compressed-tensors QuantizationArgs of the weights.
Status weightArgs(const Fields &f, const std::string &format, QuantGroup &g) {
  std::string type, strategy;
  std::optional<int64_t> bits, groupSize;
  bool symmetric = true, dynamic = false;
  if (Status s = typeBitsStrategy(f, type, bits, strategy); !s)
    return s;
  if (Status s = f.integer("group_size", groupSize); !s)
    return s;
  if (Status s = f.boolean("symmetric", symmetric); !s)
    return s;
  if (Status s = f.boolean("dynamic", dynamic); !s)
    return s;
  if (const json *a = f.get("actorder")) {
    // "static"/"weight" keep the stored column order; "group" needs g_idx.
    if (!(a->is_boolean() && !a->get<bool>()) &&
        !(a->is_string() && (a->get<std::string>() == "static" ||
                             a->get<std::string>() == "weight")))
      return f.error("weights: unsupported actorder " + Fields::brief(*a) +
                     " (activation reordering with g_idx)");
  }
  if (f.get("block_structure"))
    return f.error("weights: block-wise scales (block_structure) are not "
                   "supported");
  if (dynamic)
    return f.error("weights: dynamic weight scales are not supported");
  if (!symmetric)
    return f.error("weights: asymmetric quantisation (symmetric: false, "
                   "zero points) is not supported");
  const std::string what = "weights: " + typeBitsName(type, bits) +
                           ", strategy '" + printable(strategy) + "'";
  if (type == "float" && bits == 8 &&
      (strategy == "tensor" || strategy == "channel")) {
    g.scheme = QuantScheme::Fp8E4M3;
    g.granularity = strategy == "tensor" ? QuantGranularity::PerTensor
                                         : QuantGranularity::PerChannel;
    if (format != "float-quantized")
      return f.error(what + " need format float-quantized, got '" +
                     printable(format) + "'");
    return Status::success();
  }
  if (type == "int" && bits == 4 &&
      (strategy == "group" || strategy == "channel")) {
    g.scheme = QuantScheme::Int4;
    g.granularity = strategy == "group" ? QuantGranularity::PerGroup
                                        : QuantGranularity::PerChannel;
    if (strategy == "group") {
      if (!groupSize || *groupSize <= 0)
        return f.error(what + " need a positive group_size");
      g.groupSize = *groupSize;
    }
    if (format != "pack-quantized")
      return f.error(what + " need format pack-quantized, got '" +
                     printable(format) + "'");
    return Status::success();
  }
  return f.error("unsupported " + what +
                 " (supported: float 8-bit tensor or channel; int 4-bit "
                 "group or channel)");
}

/// compressed-tensors QuantizationArgs of the inputs (null: none).
Status inputArgs(const Fields &f, QuantGroup &g) {
  std::string type, strategy;
  std::optional<int64_t> bits;
  bool symmetric = true;
  if (Status s = typeBitsStrategy(f, type, bits, strategy); !s)
    return s;
  if (Status s = f.boolean("symmetric", symmetric); !s)
    return s;
  const json *dyn = f.get("dynamic"); // true, false or "local" (NVFP4)
  const bool dynamic = dyn && dyn->is_boolean() && dyn->get<bool>();
  const bool isStatic = !dyn || (dyn->is_boolean() && !dyn->get<bool>());
  if (type == "float" && bits == 8 && symmetric) {
    if (dynamic && strategy == "token") {
      g.activations = ActivationQuant::DynamicPerToken;
      return Status::success();
    }
    if (isStatic && strategy == "tensor") {
      g.activations = ActivationQuant::StaticPerTensor;
      return Status::success();
    }
  }
  return f.error("unsupported input_activations: " + typeBitsName(type, bits) +
                 ", dynamic " + (dyn ? Fields::brief(*dyn) : "false") +
                 ", strategy '" + printable(strategy) +
                 "' (supported: float 8-bit static per-tensor or dynamic "
                 "per-token)");
}

StatusOr<QuantConfig> compressedTensorsConfig(const json &qc,
                                              const std::string &source) {
  const std::string prefix = source + ": quantization_config: ";
  Fields f(qc, prefix);
  QuantConfig c;
  c.producer = QuantConfig::Producer::CompressedTensors;
  c.source = source;
  std::string status, format;
  if (Status s = f.string("quantization_status", status); !s)
    return s;
  if (!status.empty() && status != "compressed")
    return f.error("quantization_status '" + printable(status) +
                   "' is not supported (nf reads compressed checkpoints)");
  for (const char *key : {"sparsity_config", "transform_config"})
    if (const json *v = f.get(key); v && !(v->is_object() && v->empty()))
      return f.error(std::string(key) + " is not supported (got " +
                     Fields::brief(*v) + ")");
  if (Status s = f.string("format", format); !s)
    return s;
  if (Status s = f.strings("ignore", c.ignore); !s)
    return s;
  for (const std::string &p : c.ignore)
    if (Status s = checkPattern(f, "ignore", p); !s)
      return s;
  const json *groups = f.get("config_groups");
  if (!groups || !groups->is_object() || groups->empty())
    return f.error("missing 'config_groups'");
  for (const auto &[name, group] : groups->items()) {
    Fields gf(group, prefix + "config group '" + printable(name) + "': ");
    if (!group.is_object())
      return gf.error("must be an object");
    QuantGroup g;
    g.name = "config group '" + printable(name) + "'";
    g.format = format;
    if (Status s = gf.string("format", g.format); !s)
      return s;
    if (g.format.empty())
      return gf.error("no 'format' (neither here nor in quantization_config)");
    if (g.format != "float-quantized" && g.format != "pack-quantized")
      return gf.error("unsupported format '" + printable(g.format) +
                      "' (supported: float-quantized, pack-quantized)");
    if (Status s = gf.strings("targets", g.targets); !s)
      return s;
    if (g.targets.empty())
      return gf.error("no 'targets'");
    for (const std::string &p : g.targets)
      if (Status s = checkPattern(gf, "targets", p); !s)
        return s;
    const json *weights = gf.get("weights");
    if (!weights || !weights->is_object())
      return gf.error("no 'weights' (activation-only quantisation is not "
                      "supported)");
    if (Status s = weightArgs(Fields(*weights, gf.prefix()), g.format, g); !s)
      return s;
    if (const json *in = gf.get("input_activations")) {
      if (!in->is_object())
        return gf.error("'input_activations' must be an object");
      if (g.scheme == QuantScheme::Int4)
        return gf.error("int4 weights with quantised activations are not "
                        "supported (only weight-only W4A16)");
      if (Status s = inputArgs(Fields(*in, gf.prefix()), g); !s)
        return s;
    }
    if (gf.get("output_activations"))
      return gf.error("output_activations are not supported");
    c.groups.push_back(std::move(g));
  }
  return c;
}

} // namespace

namespace detail {

StatusOr<QuantConfig> parseQuantizationConfig(const json &qc,
                                              const std::string &source) {
  const std::string prefix = source + ": quantization_config: ";
  if (!qc.is_object())
    return Status::error(prefix + "must be an object (got " +
                         Fields::brief(qc) + ")");
  Fields f(qc, prefix);
  std::string method;
  if (Status s = f.string("quant_method", method); !s)
    return s;
  if (method.empty())
    return f.error("missing 'quant_method'");
  if (method == "compressed-tensors")
    return compressedTensorsConfig(qc, source);
  if (method == "modelopt") {
    // ModelOpt mirrors hf_quant_config.json's "quantization" here, flat.
    const json *nested = f.get("quantization");
    if (nested && nested->is_object())
      return modelOptConfig(Fields(*nested, prefix), source, "exclude_modules");
    return modelOptConfig(f, source,
                          f.get("ignore") ? "ignore" : "exclude_modules");
  }
  return f.error("unsupported quant_method '" + printable(method) +
                 "' (supported: compressed-tensors, modelopt)");
}

} // namespace detail

StatusOr<QuantConfig> parseHfQuantConfigText(const std::string &text,
                                             const std::string &source) {
  try {
    json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded())
      return Status::error(source + ": not valid JSON");
    if (!root.is_object())
      return Status::error(source + ": not a JSON object");
    Fields top(root, source + ": ");
    const json *q = top.get("quantization");
    if (!q || !q->is_object())
      return top.error("missing 'quantization'");
    return modelOptConfig(Fields(*q, source + ": "), source, "exclude_modules");
  } catch (const std::exception &e) {
    return Status::error(source + ": cannot parse: " + e.what());
  }
}

StatusOr<QuantConfig> parseHfQuantConfigFile(const std::string &path) {
  StatusOr<std::string> text = readWholeFile(path);
  if (!text)
    return text.status();
  return parseHfQuantConfigText(*text, path);
}

StatusOr<QuantConfig>
mergeQuantConfigs(QuantConfig descriptor,
                  const std::optional<QuantConfig> &fromConfig) {
  if (!fromConfig)
    return descriptor;
  if (fromConfig->producer != QuantConfig::Producer::ModelOpt)
    return Status::error(descriptor.source + ": ModelOpt descriptor, but " +
                         fromConfig->source +
                         " declares a compressed-tensors quantization_config");
  if (fromConfig->algo != descriptor.algo)
    return Status::error(descriptor.source + ": quant_algo '" +
                         printable(descriptor.algo) + "' differs from '" +
                         printable(fromConfig->algo) + "' in " +
                         fromConfig->source);
  return descriptor;
}

//===----------------------------------------------------------------------===//
// Matching modules against targets and ignore lists.
//===----------------------------------------------------------------------===//

namespace {

struct Pattern {
  enum Kind { Exact, Regex, Class, Glob } kind = Exact;
  std::string text;
  std::optional<std::regex> re;

  bool matches(const std::string &module) const {
    switch (kind) {
    case Exact:
      return text == module;
    case Regex:
      // Python re.match: anchored at the start only.
      return re && std::regex_search(module, *re,
                                     std::regex_constants::match_continuous);
    case Class:
      return true; // every module nf asks about is a linear projection
    case Glob:
      return globMatch(text, module);
    }
    return false;
  }
};

Pattern makePattern(const std::string &s, bool modelOpt) {
  Pattern p;
  p.text = s;
  if (modelOpt) {
    p.kind = Pattern::Glob;
  } else if (s.rfind("re:", 0) == 0) {
    p.kind = Pattern::Regex;
    try {
      p.re.emplace(s.substr(3));
    } catch (const std::regex_error &) {
      p.re.reset(); // rejected when the config was parsed
    }
  } else if (s == "Linear") {
    p.kind = Pattern::Class;
  }
  return p;
}

} // namespace

struct QuantMatcher::Patterns {
  std::vector<Pattern> ignore;
  std::vector<std::vector<Pattern>> targets; // per group
};

QuantMatcher::QuantMatcher(const QuantConfig &config)
    : config_(config), patterns_(std::make_unique<Patterns>()) {
  const bool modelOpt = config.producer == QuantConfig::Producer::ModelOpt;
  for (const std::string &s : config.ignore)
    patterns_->ignore.push_back(makePattern(s, modelOpt));
  for (const QuantGroup &g : config.groups) {
    patterns_->targets.emplace_back();
    for (const std::string &s : g.targets)
      patterns_->targets.back().push_back(makePattern(s, false));
  }
}

QuantMatcher::~QuantMatcher() = default;

bool QuantMatcher::ignored(const std::string &module) const {
  for (const Pattern &p : patterns_->ignore)
    if (p.matches(module))
      return true;
  return false;
}

const QuantGroup *QuantMatcher::groupFor(const std::string &module) const {
  if (ignored(module))
    return nullptr;
  if (config_.producer == QuantConfig::Producer::ModelOpt)
    return config_.groups.empty() ? nullptr : &config_.groups.front();
  // compressed-tensors precedence: exact name, then regex, then class.
  const QuantGroup *best = nullptr;
  int bestRank = 3;
  for (size_t i = 0; i < config_.groups.size(); ++i)
    for (const Pattern &p : patterns_->targets[i]) {
      const int rank = p.kind == Pattern::Exact   ? 0
                       : p.kind == Pattern::Regex ? 1
                                                  : 2;
      if (rank < bestRank && p.matches(module)) {
        best = &config_.groups[i];
        bestRank = rank;
      }
    }
  return best;
}

//===----------------------------------------------------------------------===//
// One linear weight.
//===----------------------------------------------------------------------===//

namespace {

TensorRef refOf(const TensorInfo &t) { return {t.name, t.dtype, t.shape}; }

Status tensorError(const TensorInfo &t, const std::string &msg) {
  return Status::error(t.file + ": tensor '" + t.name + "' " + msg);
}

/// `name`, which `codes` needs (`what`), is not in the checkpoint.
Status missingTensor(const TensorInfo &codes, const std::string &name,
                     const std::string &what) {
  return Status::error(codes.file + ": missing tensor '" + name + "' (" + what +
                       ")");
}

/// Scales are stored as F32, BF16 or F16.
Status checkScaleDType(const TensorInfo &t) {
  if (isSupportedWeightDType(t.dtype))
    return Status::success();
  return tensorError(t, "has unsupported dtype " +
                            std::string(dtypeName(t.dtype)) +
                            " (scales: F32, BF16, F16)");
}

/// Scale shapes a granularity allows for a part of `rows` x `cols`.
std::vector<std::vector<int64_t>> scaleShapes(const QuantGroup &g, int64_t rows,
                                              int64_t cols) {
  switch (g.granularity) {
  case QuantGranularity::PerTensor:
    return {{}, {1}};
  case QuantGranularity::PerChannel:
    return {{rows, 1}, {rows}};
  case QuantGranularity::PerGroup:
    return {{rows, cols / g.groupSize}};
  }
  return {};
}

std::string shapesString(const std::vector<std::vector<int64_t>> &shapes) {
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i)
    s += (i ? " or " : "") + shapeString(shapes[i]);
  return s;
}

/// The scales of a quantised linear, checked against group `g`.
StatusOr<WeightQuant> quantOf(const Checkpoint &ckpt, const QuantConfig &qc,
                              const QuantGroup &g, const TensorInfo &codes,
                              const std::string &m,
                              const std::vector<int64_t> &shape) {
  const int64_t rows = shape[0], cols = shape[1];
  const bool packed = g.scheme == QuantScheme::Int4;
  const std::string source = g.name + " of " + qc.source;
  const std::string why = " (" + source + ")";
  WeightQuant q;
  q.scheme = g.scheme;
  q.storage = packed ? DType::I32 : DType::F8E4M3;
  q.pack = packed ? 8 : 1;
  q.granularity = g.granularity;
  q.groupSize = g.groupSize;
  q.activations = g.activations;

  const std::vector<int64_t> codeShape =
      packed ? std::vector<int64_t>{rows, (cols + 7) / 8} : shape;
  if (codes.dtype != q.storage)
    return tensorError(codes, "has dtype " +
                                  std::string(dtypeName(codes.dtype)) +
                                  ", expected " + dtypeName(q.storage) + why);
  if (codes.shape != codeShape)
    return tensorError(codes, "has shape " + shapeString(codes.shape) +
                                  ", expected " + shapeString(codeShape) +
                                  (packed ? " (int4, 8 per int32, of weight " +
                                                shapeString(shape) + ")"
                                          : ""));
  if (g.granularity == QuantGranularity::PerGroup && cols % g.groupSize != 0)
    return tensorError(codes, "has " + std::to_string(cols) +
                                  " input columns, not a multiple of "
                                  "group_size " +
                                  std::to_string(g.groupSize) + why);

  const TensorInfo *scale = ckpt.find(m + ".weight_scale");
  if (!scale)
    return missingTensor(codes, m + ".weight_scale",
                         "the scales of '" + codes.name + "'");
  if (Status s = checkScaleDType(*scale); !s)
    return s;
  auto allowed = scaleShapes(g, rows, cols);
  if (std::find(allowed.begin(), allowed.end(), scale->shape) == allowed.end())
    return tensorError(*scale, "has shape " + shapeString(scale->shape) +
                                   ", expected " + shapesString(allowed) +
                                   " (" + granularityName(g.granularity) +
                                   ", " + source + ")");
  q.scales.push_back(refOf(*scale));

  if (packed) {
    const TensorInfo *ws = ckpt.find(m + ".weight_shape");
    if (!ws)
      return missingTensor(codes, m + ".weight_shape",
                           "the shape of packed '" + codes.name + "'");
    if ((ws->dtype != DType::I64 && ws->dtype != DType::I32) ||
        ws->shape != std::vector<int64_t>{2})
      return tensorError(*ws, "must be an integer tensor of shape [2], got " +
                                  std::string(dtypeName(ws->dtype)) + " " +
                                  shapeString(ws->shape));
    if (const TensorInfo *zp = ckpt.find(m + ".weight_zero_point"))
      return tensorError(*zp, "is a zero point: asymmetric int4 is not "
                              "supported");
    if (const TensorInfo *gi = ckpt.find(m + ".weight_g_idx"))
      return tensorError(*gi, "reorders columns (g_idx): activation "
                              "reordering is not supported");
  }

  const TensorInfo *input = ckpt.find(m + ".input_scale");
  if (g.activations == ActivationQuant::StaticPerTensor) {
    if (!input)
      return missingTensor(codes, m + ".input_scale",
                           "static activation scale of '" + codes.name + "', " +
                               source);
    if (Status s = checkScaleDType(*input); !s)
      return s;
    if (input->numElements() != 1 || input->shape.size() > 1)
      return tensorError(*input, "has shape " + shapeString(input->shape) +
                                     ", expected [] or [1] (static "
                                     "per-tensor activation scale)");
    q.inputScales.push_back(refOf(*input));
  } else if (input) {
    return tensorError(
        *input, "is a static activation scale, but " + source + " declares " +
                    activationQuantName(g.activations) + " activations");
  }
  return q;
}

} // namespace

StatusOr<LinearTensor> findLinear(const Checkpoint &ckpt,
                                  const QuantConfig *quant,
                                  const QuantMatcher *matcher,
                                  const std::vector<std::string> &modules,
                                  const std::vector<int64_t> &shape) {
  LinearTensor out;
  const TensorInfo *w = nullptr, *packed = nullptr;
  for (const std::string &m : modules) {
    w = ckpt.find(m + ".weight");
    packed = ckpt.find(m + ".weight_packed");
    if (w || packed) {
      out.module = m;
      break;
    }
  }
  if (!w && !packed)
    return out;
  const std::string &m = out.module;
  const TensorInfo *scale = ckpt.find(m + ".weight_scale");
  // The tensors decide, not the lists: ModelOpt's exclude_modules are
  // unreliable (see stripSentinel), so a weight is quantised iff it stores
  // codes with a weight_scale next to it; the lists are checked after.
  const bool fp8 = w && w->dtype == DType::F8E4M3;
  if (!packed && !fp8) {
    if (scale)
      return tensorError(*scale,
                         "is a weight scale, but '" + w->name + "' has dtype " +
                             dtypeName(w->dtype) +
                             " (nf reads scales of F8_E4M3 weights and of "
                             "packed int4 weight_packed only)");
    out.weight = w;
    return out;
  }
  if (w && packed)
    return tensorError(*packed, "and '" + w->name +
                                    "' both exist (a linear stores either "
                                    "values or packed codes)");
  const TensorInfo &codes = packed ? *packed : *w;
  const std::string kind = packed ? "packed int4 codes" : "F8_E4M3 codes";
  if (!quant || !matcher)
    return tensorError(codes, "holds " + kind +
                                  " but the checkpoint declares no "
                                  "quantisation (no hf_quant_config.json, no "
                                  "quantization_config in config.json)");
  if (matcher->ignored(m))
    return tensorError(codes, "holds " + kind + " but '" + printable(m) +
                                  "' is on the ignore list of " +
                                  quant->source);
  const QuantGroup *g = matcher->groupFor(m);
  if (!g)
    return tensorError(codes, "holds " + kind +
                                  " but no quantisation "
                                  "group of " +
                                  quant->source + " targets '" + printable(m) +
                                  "'");
  const QuantScheme stored = packed ? QuantScheme::Int4 : QuantScheme::Fp8E4M3;
  if (g->scheme != stored)
    return tensorError(codes, "holds " + kind + " but " + g->name + " of " +
                                  quant->source + " quantises '" +
                                  printable(m) + "' as " +
                                  quantSchemeName(g->scheme));
  auto q = quantOf(ckpt, *quant, *g, codes, m, shape);
  if (!q)
    return q.status();
  out.weight = &codes;
  out.quant = std::move(*q);
  return out;
}

bool sameQuantFormat(const WeightQuant &a, const WeightQuant &b) {
  return a.scheme == b.scheme && a.storage == b.storage && a.pack == b.pack &&
         a.granularity == b.granularity && a.groupSize == b.groupSize &&
         a.symmetric == b.symmetric && a.activations == b.activations;
}

} // namespace nf::hf
