// nfrun inspect: a readable summary of a plan (.nfb), read directly with the
// flatbuffers schema (runtime/schema/plan.fbs) after verification.
#include "commands.h"

#include "nf/file.h"

#include "nf/plan_attrs.h"
#include "nf/plan_ops.h"
#include "nf/plan_version.h"

#include <flatbuffers/flatbuffers.h>

#include <array>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace nfrun {
namespace {

namespace pl = nf::plan;

std::string str(const flatbuffers::String *s) {
  return s ? s->str() : std::string();
}

/// "34.0 MiB", "512 B".
std::string bytes(int64_t b) {
  char buf[64];
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%" PRId64 " B", b);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, unit[u]);
  return buf;
}

int64_t dtypeSize(pl::DType t) {
  switch (t) {
  case pl::DType::F32:
  case pl::DType::I32:
    return 4;
  case pl::DType::BF16:
  case pl::DType::F16:
    return 2;
  case pl::DType::I64:
    return 8;
  case pl::DType::F8E4M3:
    return 1;
  }
  return 0;
}

std::string dtypeName(pl::DType t) {
  const char *name = pl::EnumNameDType(t);
  std::string s = name && *name ? name : "?";
  for (char &c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string list(const flatbuffers::Vector<int64_t> *v) {
  std::string s = "[";
  if (v)
    for (flatbuffers::uoffset_t i = 0; i < v->size(); ++i)
      s += (i ? ", " : "") + std::to_string(v->Get(i));
  return s + "]";
}

int64_t product(const flatbuffers::Vector<int64_t> *v) {
  int64_t n = 1;
  if (v)
    for (int64_t d : *v)
      n *= d;
  return n;
}

struct StepSummary {
  size_t kernels = 0, ops = 0, values = 0;
  std::map<std::string, int> kernelCounts;
  int64_t topK = 0, numExperts = 0;
  std::string policy;
  // CUDA launches: all, programmatic, and the step sizes where the set that
  // runs changes (the runtime captures one decode graph per bucket).
  size_t launches = 0, programmatic = 0;
  std::set<int64_t> bounds;
};

StepSummary summarize(const pl::Step *step) {
  StepSummary s;
  if (!step)
    return s;
  if (step->values()) {
    s.values = step->values()->size();
    for (const pl::Value *v : *step->values())
      if (v && v->kind() == pl::ValueKind::Dispatch)
        s.numExperts = std::max<int64_t>(s.numExperts, v->num_experts());
  }
  if (step->kernels())
    for (const pl::Kernel *k : *step->kernels()) {
      if (!k)
        continue;
      ++s.kernels;
      ++s.kernelCounts[str(k->name())];
      if (k->launches())
        for (const pl::Launch *l : *k->launches()) {
          if (!l)
            continue;
          ++s.launches;
          s.programmatic += l->programmatic() ? 1 : 0;
          if (l->max_tokens() > 0 && l->max_tokens() < step->max_tokens())
            s.bounds.insert(l->max_tokens());
          if (l->min_tokens() > 1 && l->min_tokens() - 1 < step->max_tokens())
            s.bounds.insert(l->min_tokens() - 1);
        }
      if (!k->ops())
        continue;
      s.ops += k->ops()->size();
      for (const pl::Op *op : *k->ops()) {
        if (!op || pl::opCode(*op) != pl::OpCode::Select)
          continue;
        if (std::optional<int64_t> k = pl::intAttr(*op, pl::attr::TopK))
          s.topK = *k;
        if (std::optional<std::string> p =
                pl::stringAttr(*op, pl::attr::Policy))
          s.policy = *p;
      }
    }
  return s;
}

void printStep(const char *label, const pl::Step *step, const StepSummary &s) {
  if (!step) {
    std::printf("  %-8s absent\n", label);
    return;
  }
  const int64_t arena = step->arena_bytes(), noReuse = step->no_reuse_bytes();
  std::printf("  %-8s %" PRId64 " tokens/step, %zu kernels (%zu ops), %zu "
              "values\n",
              label, step->max_tokens(), s.kernels, s.ops, s.values);
  std::printf("           arena %s (%" PRId64 " B), %.1f%% of %s without "
              "reuse; scratch %s (%" PRId64 " B)\n",
              bytes(arena).c_str(), arena,
              noReuse > 0 ? 100.0 * static_cast<double>(arena) / noReuse : 0.0,
              bytes(noReuse).c_str(), bytes(step->scratch_bytes()).c_str(),
              step->scratch_bytes());
  if (s.launches == 0)
    return;
  std::string buckets;
  for (int64_t b : s.bounds)
    buckets += "<= " + std::to_string(b) + " | ";
  buckets += "<= " + std::to_string(step->max_tokens()) + " tokens";
  std::printf("           cuda: %zu launches (%zu programmatic); launch sets "
              "by step size: %s\n",
              s.launches, s.programmatic, buckets.c_str());
  if (const pl::TopLogits *t = step->top_logits(); t && t->launches())
    std::printf("           cuda: top %d logits of each row on request (%u "
                "launches in kernel %d's module)%s\n",
                t->k(), t->launches()->size(), t->kernel(),
                t->noise_offset() >= 0
                    ? "; or by a temperature sampler's Gumbel-max keys"
                    : "");
}

/// Every CUDA launch of a step in execution order: kernel, function, shape
/// and the step sizes it runs for (nfrun inspect --launches).
void printLaunches(const char *label, const pl::Step *step) {
  if (!step || !step->kernels())
    return;
  std::vector<std::array<std::string, 6>> rows;
  for (const pl::Kernel *k : *step->kernels()) {
    if (!k || !k->launches())
      continue;
    for (const pl::Launch *l : *k->launches()) {
      if (!l)
        continue;
      std::string tokens = "all";
      if (l->min_tokens() > 1 && l->max_tokens() > 0)
        tokens = std::to_string(l->min_tokens()) + ".." +
                 std::to_string(l->max_tokens());
      else if (l->min_tokens() > 1)
        tokens = ">= " + std::to_string(l->min_tokens());
      else if (l->max_tokens() > 0)
        tokens = "<= " + std::to_string(l->max_tokens());
      std::string flags = l->programmatic() ? "pdl" : "";
      if (l->cooperative())
        flags += flags.empty() ? "cooperative" : ",cooperative";
      rows.push_back(
          {str(k->name()), str(l->function()),
           std::to_string(l->grid()) + " x " + std::to_string(l->block()),
           std::to_string(l->shared_bytes()), tokens, flags});
    }
  }
  if (rows.empty())
    return;
  std::array<std::string, 6> head = {"kernel", "function", "grid x block",
                                     "shared", "tokens",   ""};
  std::array<size_t, 6> width{};
  for (size_t c = 0; c < 6; ++c) {
    width[c] = head[c].size();
    for (const auto &r : rows)
      width[c] = std::max(width[c], r[c].size());
  }
  std::printf("launches (%s, in order):\n", label);
  auto line = [&](const std::array<std::string, 6> &r) {
    std::string out = " ";
    for (size_t c = 0; c < 6; ++c)
      out +=
          " " + r[c] + std::string(c + 1 < 6 ? width[c] - r[c].size() : 0, ' ');
    while (!out.empty() && out.back() == ' ')
      out.pop_back();
    std::printf("%s\n", out.c_str());
  };
  line(head);
  for (const auto &r : rows)
    line(r);
}

} // namespace

int runInspect(const std::string &path, bool launches) {
  std::vector<uint8_t> buf;
  {
    // A regular file (a FIFO or /dev/zero is refused), at most 4 GiB.
    nf::StatusOr<std::string> data = nf::readWholeFile(path, uint64_t{4} << 30);
    if (!data)
      return fail(data.message());
    buf.assign(data->begin(), data->end());
  }
  const size_t header =
      sizeof(flatbuffers::uoffset_t) + flatbuffers::kFileIdentifierLength;
  if (buf.size() < header)
    return fail(path + ": " + std::to_string(buf.size()) +
                " bytes is too small to be an nf plan");
  if (!pl::PlanBufferHasIdentifier(buf.data()))
    return fail(path + ": not an nf plan (file identifier is not '" +
                nf::kPlanFileIdentifier + "')");
  flatbuffers::Verifier verifier(buf.data(), buf.size());
  if (!pl::VerifyPlanBuffer(verifier))
    return fail(path + ": corrupted plan (flatbuffers verifier failed)");
  const pl::Plan *plan = pl::GetPlan(buf.data());
  if (plan->version_major() != nf::kPlanVersionMajor ||
      plan->version_minor() > nf::kPlanVersionMinor)
    return fail(path + ": plan format " +
                std::to_string(plan->version_major()) + "." +
                std::to_string(plan->version_minor()) +
                " is not supported by this nfrun (reads " +
                std::to_string(nf::kPlanVersionMajor) + ".0 to " +
                std::to_string(nf::kPlanVersionMajor) + "." +
                std::to_string(nf::kPlanVersionMinor) + ")");

  std::printf("plan: %s (%zu bytes)\n", path.c_str(), buf.size());
  std::printf("format: %u.%u, written by %s\n", plan->version_major(),
              plan->version_minor(), str(plan->generator()).c_str());
  std::string archs;
  if (plan->target() && plan->target()->archs())
    for (const flatbuffers::String *a : *plan->target()->archs())
      archs += (archs.empty() ? "" : ", ") + str(a);
  std::printf("target: %s%s\n",
              plan->target() ? str(plan->target()->backend()).c_str() : "?",
              archs.empty() ? "" : (" [" + archs + "]").c_str());

  const pl::ModelConfig *cfg = plan->config();
  std::string pattern = cfg ? str(cfg->layer_kinds()) : "";
  if (cfg) {
    std::printf("model: %s\n", str(cfg->name()).c_str());
    std::printf("  vocab %" PRId64 ", hidden %" PRId64 ", bos %" PRId64
                ", eos %s, pad %" PRId64 "\n",
                cfg->vocab_size(), cfg->hidden_size(), cfg->bos_token_id(),
                list(cfg->eos_token_ids()).c_str(), cfg->pad_token_id());
    std::map<char, int> kinds;
    for (char c : pattern)
      ++kinds[c];
    std::printf("  layers (%zu): %s  (%d Mamba2, %d attention, %d MLP, %d "
                "MoE)\n",
                pattern.size(), pattern.c_str(), kinds['M'], kinds['*'],
                kinds['-'], kinds['E']);
  } else {
    std::printf("model: (no config)\n");
  }

  StepSummary prefill = summarize(plan->prefill());
  StepSummary decode = summarize(plan->decode());
  const StepSummary &moe = prefill.topK ? prefill : decode;
  if (moe.topK || moe.numExperts)
    std::printf("  MoE: %" PRId64 " routed experts, top-%" PRId64
                "; expert policy %s, default budget %g\n",
                moe.numExperts, moe.topK, str(plan->expert_policy()).c_str(),
                plan->default_expert_budget());

  std::printf("steps:\n");
  printStep("prefill", plan->prefill(), prefill);
  printStep("decode", plan->decode(), decode);

  std::map<std::string, std::pair<int, int>> kernels;
  for (const auto &[name, n] : prefill.kernelCounts)
    kernels[name].first = n;
  for (const auto &[name, n] : decode.kernelCounts)
    kernels[name].second = n;
  size_t width = 6;
  for (const auto &[name, n] : kernels)
    width = std::max(width, name.size());
  std::printf("kernels:%*s prefill decode\n", static_cast<int>(width) - 6, "");
  for (const auto &[name, n] : kernels)
    std::printf("  %-*s %7d %6d\n", static_cast<int>(width), name.c_str(),
                n.first, n.second);

  std::printf("storage:\n");
  int kvLayers = 0, mambaLayers = 0;
  int64_t kvBytes = 0, mambaBytes = 0;
  int64_t kvPerToken = 0, statePerSequence = 0; // every layer's
  std::string kvLine, mambaLine, kvList, mambaList;
  if (plan->storage())
    for (const pl::Storage *s : *plan->storage()) {
      if (!s)
        continue;
      if (s->kind() == pl::StorageKind::KVCache) {
        ++kvLayers;
        kvList += (kvList.empty() ? "" : " ") + std::to_string(s->layer());
        // K and V of a token; fp8 rows carry an f32 scale per kv head.
        const int64_t perToken = 2 * s->kv_heads() *
                                 (s->head_dim() * dtypeSize(s->dtype()) +
                                  (s->dtype() == pl::DType::F8E4M3 ? 4 : 0));
        int64_t b = s->num_pages() * s->page_size() * perToken;
        kvBytes += b;
        kvPerToken += perToken;
        char line[256];
        std::snprintf(line, sizeof line,
                      "%" PRId64 " pages x %" PRId64 " tokens, %" PRId64
                      " KV heads x %" PRId64 ", %s: %s per token, %s per layer",
                      s->num_pages(), s->page_size(), s->kv_heads(),
                      s->head_dim(), dtypeName(s->dtype()).c_str(),
                      bytes(perToken).c_str(), bytes(b).c_str());
        kvLine = line;
        if (s->hot_window() > 0)
          kvLine += "; tiered: the pages holding a sequence's last " +
                    std::to_string(s->hot_window()) +
                    " positions store bf16, in two pages' room each";
      } else {
        ++mambaLayers;
        mambaList +=
            (mambaList.empty() ? "" : " ") + std::to_string(s->layer());
        int64_t perSlot = (s->conv_dim() * s->conv_window() +
                           s->num_heads() * s->head_dim() * s->state_size()) *
                          4;
        mambaBytes += perSlot * s->slots();
        statePerSequence += perSlot;
        char line[256];
        std::snprintf(line, sizeof line,
                      "%" PRId64 " slots, conv [%" PRId64 " x %" PRId64
                      "] + ssm [%" PRId64 " x %" PRId64 " x %" PRId64
                      "] f32: %s per slot and layer",
                      s->slots(), s->conv_dim(), s->conv_window(),
                      s->num_heads(), s->head_dim(), s->state_size(),
                      bytes(perSlot).c_str());
        mambaLine = line;
      }
    }
  if (kvLayers)
    std::printf("  KV cache: %d layers (%s), %s; total %s\n", kvLayers,
                kvList.c_str(), kvLine.c_str(), bytes(kvBytes).c_str());
  if (mambaLayers)
    std::printf("  Mamba state: %d layers (%s), %s; total %s\n", mambaLayers,
                mambaList.c_str(), mambaLine.c_str(),
                bytes(mambaBytes).c_str());
  if (!kvLayers && !mambaLayers)
    std::printf("  none\n");
  else
    std::printf("  per sequence: %" PRId64 " B of recurrent state, %" PRId64
                " B of KV cache a token of context\n",
                statePerSequence, kvPerToken);

  size_t numWeights = 0, numTensors = 0, packed = 0, stacked = 0;
  int64_t weightBytes = 0, elements = 0;
  std::map<std::string, int64_t> byDtype;
  if (plan->weights())
    for (const pl::Weight *w : *plan->weights()) {
      if (!w)
        continue;
      ++numWeights;
      numTensors += w->tensors() ? w->tensors()->size() : 0;
      packed += w->concat_rows() && w->concat_rows()->size() > 0;
      stacked += w->stacked();
      int64_t n = product(w->shape());
      elements += n;
      // Quantised weights' shapes count codes: fp8 one byte each, int4 8
      // to an i32 word along each row; and their f32 scales as the CUDA
      // backend stores them, one a row (fp8) or a row's group (int4).
      int64_t b = n * dtypeSize(w->dtype());
      std::string kind = dtypeName(w->dtype());
      if (w->quant() && w->shape() && w->shape()->size() > 0) {
        const pl::WeightQuant &q = *w->quant();
        const bool int4 = q.scheme() == pl::QuantScheme::Int4;
        const int64_t cols = w->shape()->Get(w->shape()->size() - 1);
        const int64_t rows = cols > 0 ? n / cols : 0;
        b = int4 && cols > 0 ? rows * ((cols + 7) / 8) * 4 : n;
        kind = int4 ? "int4" : "f8e4m3";
        const int64_t scales =
            int4 && q.group_size() > 0 ? rows * (cols / q.group_size()) : rows;
        weightBytes += 4 * scales;
        byDtype["scales"] += 4 * scales;
      }
      weightBytes += b;
      byDtype[kind] += b;
    }
  std::string dtypes;
  for (const auto &[name, b] : byDtype)
    dtypes += (dtypes.empty() ? "" : ", ") + name + " " + bytes(b);
  std::printf("weights: %zu (%zu stacked experts, %zu packed) from %zu "
              "checkpoint tensors: %" PRId64 " parameters, %s (%" PRId64
              " B; %s)\n",
              numWeights, stacked, packed, numTensors, elements,
              bytes(weightBytes).c_str(), weightBytes, dtypes.c_str());
  if (cfg) {
    std::string files;
    if (cfg->weight_files())
      for (const flatbuffers::String *f : *cfg->weight_files())
        files += (files.empty() ? "" : ", ") + str(f);
    std::printf("  files: %s in %s\n", files.c_str(),
                str(cfg->checkpoint()).c_str());
    if (cfg->plan_weight_files()) {
      files.clear();
      for (const flatbuffers::String *f : *cfg->plan_weight_files())
        files += (files.empty() ? "" : ", ") + str(f);
      std::printf("  beside the plan: %s\n", files.c_str());
    }
  }
  if (launches) {
    printLaunches("prefill", plan->prefill());
    printLaunches("decode", plan->decode());
  }
  return 0;
}

} // namespace nfrun
