#include "engine/plan_loader.h"

#include <map>

#include "nf/file.h"
#include "nf/plan_ops.h"
#include "nf/plan_version.h"

#include <flatbuffers/flatbuffers.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <new>

namespace nf::engine {

namespace fb = flatbuffers;
namespace pl = nf::plan;

std::string shapeString(const std::vector<int64_t> &s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

nf::DType toDType(pl::DType t) {
  switch (t) {
  case pl::DType::F32:
    return nf::DType::F32;
  case pl::DType::BF16:
    return nf::DType::BF16;
  case pl::DType::F16:
    return nf::DType::F16;
  case pl::DType::I32:
    return nf::DType::I32;
  case pl::DType::I64:
    return nf::DType::I64;
  case pl::DType::F8E4M3:
    return nf::DType::F8E4M3;
  }
  return nf::DType::F32;
}

// ---------------------------------------------------------------------------
// The plan file

namespace {

// flatbuffers 2.0's verifier checks the alignment of a vector's length but
// not of its elements: a [long] starting 4 bytes off an 8-byte boundary
// passes verification, and reading it is undefined behaviour. The vectors of
// 8-byte scalars of the schema are checked here; nfc writes them aligned.
bool aligned(const fb::Vector<int64_t> *v, const uint8_t *buf) {
  return !v || (reinterpret_cast<const uint8_t *>(v->data()) - buf) %
                       alignof(int64_t) ==
                   0;
}

std::string misalignedVector(const pl::Plan &p, const uint8_t *buf) {
  if (!aligned(p.config()->eos_token_ids(), buf))
    return "config.eos_token_ids";
  for (fb::uoffset_t i = 0; i < p.weights()->size(); ++i) {
    const pl::Weight *w = p.weights()->Get(i);
    if (!aligned(w->shape(), buf) || !aligned(w->concat_rows(), buf))
      return "weight " + std::to_string(i);
  }
  for (const pl::Step *step : {p.prefill(), p.decode()}) {
    const std::string phase = step == p.prefill() ? "prefill" : "decode";
    if (step->values())
      for (fb::uoffset_t i = 0; i < step->values()->size(); ++i)
        if (!aligned(step->values()->Get(i)->shape(), buf))
          return phase + " value " + std::to_string(i);
    if (step->kernels())
      for (const pl::Kernel *k : *step->kernels())
        if (k->ops())
          for (const pl::Op *op : *k->ops())
            if (op->int_lists())
              for (const pl::IntListAttr *a : *op->int_lists())
                if (!aligned(a->values(), buf))
                  return phase + " op attribute";
  }
  return "";
}

// Names in a plan (tensors, files, ops, kernels, storages, attributes)
// end up in error messages, which must stay one line: a control character
// in one is refused at load. The PTX text, never quoted, may have any.
bool printable(const fb::String *s) {
  if (s)
    for (char c : s->string_view())
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        return false;
  return true;
}

bool printable(const fb::Vector<fb::Offset<fb::String>> *v) {
  if (v)
    for (const fb::String *s : *v)
      if (!printable(s))
        return false;
  return true;
}

/// Where a stored op code (format 1.10) disagrees with its op's name, as
/// "decode kernel 3 op 1: unknown op code 77", or "" if none does.
std::string inconsistentOpCode(const pl::Plan &p) {
  for (const pl::Step *step : {p.prefill(), p.decode()}) {
    if (!step->kernels())
      continue;
    const std::string phase = step == p.prefill() ? "prefill" : "decode";
    for (fb::uoffset_t k = 0; k < step->kernels()->size(); ++k) {
      const pl::Kernel *kernel = step->kernels()->Get(k);
      if (!kernel->ops())
        continue;
      for (fb::uoffset_t j = 0; j < kernel->ops()->size(); ++j) {
        const pl::Op *op = kernel->ops()->Get(j);
        if (std::optional<std::string_view> why = pl::opCodeMismatch(*op))
          return phase + " kernel " + std::to_string(k) + " op " +
                 std::to_string(j) + ": " + std::string(*why) + " " +
                 std::to_string(op->code());
      }
    }
  }
  return "";
}

std::string unprintableString(const pl::Plan &p) {
  const pl::ModelConfig &c = *p.config();
  if (!printable(p.generator()) || !printable(p.expert_policy()) ||
      !printable(c.name()) || !printable(c.layer_kinds()) ||
      !printable(c.checkpoint()) || !printable(c.weight_files()) ||
      !printable(c.plan_weight_files()))
    return "the model config";
  if (p.target() &&
      (!printable(p.target()->backend()) || !printable(p.target()->archs())))
    return "the target";
  for (fb::uoffset_t i = 0; i < p.weights()->size(); ++i)
    if (!printable(p.weights()->Get(i)->tensors()))
      return "weight " + std::to_string(i);
  if (p.storage())
    for (fb::uoffset_t i = 0; i < p.storage()->size(); ++i)
      if (!printable(p.storage()->Get(i)->name()))
        return "storage " + std::to_string(i);
  for (const pl::Step *step : {p.prefill(), p.decode()}) {
    const std::string phase = step == p.prefill() ? "prefill" : "decode";
    if (!printable(step->phase()))
      return phase + " step";
    if (!step->kernels())
      continue;
    for (fb::uoffset_t k = 0; k < step->kernels()->size(); ++k) {
      const pl::Kernel *kernel = step->kernels()->Get(k);
      const std::string where = phase + " kernel " + std::to_string(k);
      if (!printable(kernel->name()) || !printable(kernel->cubin_archs()) ||
          !printable(kernel->source_hash()))
        return where;
      if (kernel->launches())
        for (const pl::Launch *l : *kernel->launches())
          if (!printable(l->function()))
            return where;
      if (!kernel->ops())
        continue;
      for (const pl::Op *op : *kernel->ops()) {
        bool ok = printable(op->name());
        if (op->ints())
          for (const pl::IntAttr *a : *op->ints())
            ok = ok && printable(a->name());
        if (op->floats())
          for (const pl::FloatAttr *a : *op->floats())
            ok = ok && printable(a->name());
        if (op->strings())
          for (const pl::StringAttr *a : *op->strings())
            ok = ok && printable(a->name()) && printable(a->value());
        if (op->int_lists())
          for (const pl::IntListAttr *a : *op->int_lists())
            ok = ok && printable(a->name());
        if (!ok)
          return where + " op";
      }
    }
    if (step->top_logits() && step->top_logits()->launches())
      for (const pl::Launch *l : *step->top_logits()->launches())
        if (!printable(l->function()))
          return phase + " top logits";
  }
  return "";
}

} // namespace

StatusOr<std::unique_ptr<PlanFile>> openPlan(const std::string &path) {
  StatusOr<MappedFile> mf = MappedFile::open(path);
  if (!mf)
    return mf.status(); // "<path>: cannot open: ..." / "file is empty"
  auto pf = std::make_unique<PlanFile>();
  pf->path = path;
  pf->file = std::move(*mf);
  const uint8_t *buf = pf->file.data();
  const size_t size = pf->file.size();

  // Root offset (4 bytes) + file identifier (4 bytes).
  constexpr size_t kHeader = sizeof(fb::uoffset_t) + fb::kFileIdentifierLength;
  if (size < kHeader)
    return Status::error(path + ": " + std::to_string(size) +
                         " bytes is too small to be an nf plan");
  if (!pl::PlanBufferHasIdentifier(buf)) {
    std::string id(reinterpret_cast<const char *>(buf) + sizeof(fb::uoffset_t),
                   fb::kFileIdentifierLength);
    for (char &c : id)
      if (c < 0x20 || c > 0x7e)
        c = '?';
    return Status::error(path + ": not an nf plan (file identifier '" + id +
                         "', expected '" + kPlanFileIdentifier + "')");
  }
  const fb::uoffset_t root = fb::ReadScalar<fb::uoffset_t>(buf);
  if (root < kHeader || static_cast<size_t>(root) + 4 > size)
    return Status::error(path + ": truncated plan (root table at byte " +
                         std::to_string(root) + " of " + std::to_string(size) +
                         ")");

  // The version fields first, verified on their own: a plan of another major
  // version may not match this schema anywhere else.
  {
    fb::Verifier v(buf, size);
    const fb::Table *t = fb::GetRoot<fb::Table>(buf);
    if (!t->VerifyTableStart(v) ||
        !t->VerifyField<uint32_t>(v, pl::Plan::VT_VERSION_MAJOR, 4) ||
        !t->VerifyField<uint32_t>(v, pl::Plan::VT_VERSION_MINOR, 4))
      return Status::error(path + ": truncated or corrupted plan (bad root "
                                  "table)");
    const uint32_t major = t->GetField<uint32_t>(pl::Plan::VT_VERSION_MAJOR, 0);
    const uint32_t minor = t->GetField<uint32_t>(pl::Plan::VT_VERSION_MINOR, 0);
    const std::string version =
        std::to_string(major) + "." + std::to_string(minor);
    if (major != kPlanVersionMajor)
      return Status::error(path + ": plan format version " + version +
                           " is not supported by this runtime (reads " +
                           std::to_string(kPlanVersionMajor) + ".x)");
    if (minor > kPlanVersionMinor)
      return Status::error(path + ": plan format version " + version +
                           " is not supported by this runtime (reads " +
                           std::to_string(kPlanVersionMajor) + ".x up to " +
                           std::to_string(kPlanVersionMajor) + "." +
                           std::to_string(kPlanVersionMinor) + ")");
  }

  {
    // Plans hold many small tables; raise the verifier's table limit well
    // above the default (1M) so large models verify.
    fb::Verifier v(buf, size, /*max_depth=*/64, /*max_tables=*/1u << 30);
    if (!pl::VerifyPlanBuffer(v))
      return Status::error(path + ": corrupted or truncated plan (flatbuffers "
                                  "verification failed)");
  }
  pf->plan = pl::GetPlan(buf);
  const pl::Plan *p = pf->plan;
  if (!p->config())
    return Status::error(path + ": plan has no model config");
  if (!p->prefill() || !p->decode())
    return Status::error(path + ": plan needs both a prefill and a decode "
                                "step");
  if (!p->weights())
    return Status::error(path + ": plan has no weights table");
  if (std::string where = misalignedVector(*p, buf); !where.empty())
    return Status::error(path + ": corrupted plan (misaligned [long] in " +
                         where + ")");
  if (std::string where = unprintableString(*p); !where.empty())
    return Status::error(path +
                         ": corrupted plan (a control character in a "
                         "name of " +
                         where + ")");
  if (std::string where = inconsistentOpCode(*p); !where.empty())
    return Status::error(path + ": corrupted plan (" + where + ")");
  return pf;
}

// ---------------------------------------------------------------------------
// Weights

namespace {

std::vector<int64_t> toVector(const fb::Vector<int64_t> *v) {
  std::vector<int64_t> out;
  if (v)
    out.assign(v->begin(), v->end());
  return out;
}

} // namespace

StatusOr<std::pair<WeightView, std::string>>
WeightFinder::find(const std::string &name) const {
  for (size_t i = 0; i < bw_.stores.size(); ++i)
    if (bw_.stores[i].contains(name)) {
      StatusOr<WeightView> v = bw_.stores[i].find(name);
      if (!v)
        return v.status();
      return std::make_pair(std::move(*v), bw_.files[i]);
    }
  if (bw_.files.size() == 1)
    return Status::error(bw_.files[0] + ": no tensor '" + name + "'");
  std::string list;
  for (const std::string &f : bw_.files)
    list += (list.empty() ? "" : ", ") +
            std::filesystem::path(f).filename().string();
  return Status::error(bw_.dir + ": no tensor '" + name + "' in " + list);
}

StatusOr<WeightView>
WeightFinder::get(const std::string &name, nf::DType dtype,
                  const std::vector<int64_t> &shape) const {
  auto found = find(name);
  if (!found)
    return found.status();
  const auto &[view, file] = *found;
  if (view.dtype != dtype)
    return Status::error(file + ": tensor '" + name + "' has dtype " +
                         dtypeName(view.dtype) + ", expected " +
                         dtypeName(dtype));
  if (view.shape != shape)
    return Status::error(file + ": tensor '" + name + "' has shape " +
                         shapeString(view.shape) + ", expected " +
                         shapeString(shape));
  return view;
}

float syntheticAmplitude(const pl::Weight &w) {
  const auto *shape = w.shape();
  const size_t rank = shape ? shape->size() : 0;
  std::string name;
  if (w.tensors() && w.tensors()->size() > 0)
    name = w.tensors()->Get(0)->str();
  auto endsWith = [&](std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) ==
               0;
  };
  if (endsWith("embeddings.weight") || endsWith("embed_tokens.weight"))
    return 1.0f;
  if (rank >= 2 && shape->Get(static_cast<fb::uoffset_t>(rank - 1)) > 0)
    return fanInAmplitude(shape->Get(static_cast<fb::uoffset_t>(rank - 1)));
  return 0.05f;
}

float fanInAmplitude(int64_t K) {
  return 1.0f / std::sqrt(static_cast<float>(K));
}

StatusOr<std::unique_ptr<BoundWeights>>
syntheticWeights(const PlanFile &pf, uint64_t seed, QuantForm form) {
  const pl::Plan &plan = *pf.plan;
  auto bw = std::make_unique<BoundWeights>();
  bw->dir = "<synthetic weights, seed " + std::to_string(seed) + ">";
  // Quantised weights: random codes and scales in an in-memory store,
  // bound (dequantised) as a checkpoint's are.
  bool quantised = false;
  for (const pl::Weight *w : *plan.weights())
    quantised = quantised || w->quant();
  if (quantised) {
    WeightStore codes = WeightStore::inMemory(bw->dir);
    if (Status s = addRandomQuantTensors(pf, seed, codes, bw->packed); !s)
      return s;
    bw->stores.push_back(std::move(codes));
    bw->files.push_back(bw->dir);
  }
  // The largest weight of each dtype and amplitude sizes that pair's random
  // block.
  using BlockKey = std::pair<nf::DType, float>;
  auto keyOf = [](const pl::Weight *w) {
    return BlockKey{toDType(w->dtype()), syntheticAmplitude(*w)};
  };
  std::map<BlockKey, size_t> largest;
  for (const pl::Weight *w : *plan.weights()) {
    if (w->quant())
      continue;
    size_t n = 1;
    for (int64_t d : *w->shape())
      n *= static_cast<size_t>(d);
    size_t &l = largest[keyOf(w)];
    l = std::max(l, n);
  }
  std::map<BlockKey, const uint8_t *> blocks;
  std::map<BlockKey, size_t> blockElements;
  WeightRandom next(seed, 0x9E3779B97F4A7C15ull);
  for (auto [key, elements] : largest) {
    const auto [dtype, amplitude] = key;
    // Room for per-weight offsets: 1/8 more than the largest weight.
    const size_t n = elements + elements / 8 + 64;
    const size_t es = dtypeSize(dtype);
    auto block = std::make_unique<uint8_t[]>(n * es);
    for (size_t i = 0; i < n; ++i) {
      const float v = next.centred() * 2.0f * amplitude;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      if (dtype == nf::DType::F32) {
        std::memcpy(block.get() + 4 * i, &v, 4);
      } else if (dtype == nf::DType::BF16) {
        const uint16_t h = static_cast<uint16_t>(bits >> 16);
        std::memcpy(block.get() + 2 * i, &h, 2);
      } else { // F16: |v| <= 1, normal range or zero; round toward zero
        const uint32_t sign = (bits >> 16) & 0x8000u;
        const int32_t exp =
            static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + 15;
        const uint16_t h = exp <= 0
                               ? static_cast<uint16_t>(sign)
                               : static_cast<uint16_t>(sign | (exp << 10) |
                                                       ((bits >> 13) & 0x3FF));
        std::memcpy(block.get() + 2 * i, &h, 2);
      }
    }
    blocks[key] = block.get();
    blockElements[key] = n;
    bw->packed.push_back(std::move(block));
  }
  // Routing as a trained, load-balanced router routes: no expert favoured
  // for every token. The score-correction bias (DeepSeek-V3 style) of
  // random weights would outweigh the router's small random logits and send
  // every token to the same few experts; a zero bias leaves the choice to
  // each token's own logits.
  auto isRouterBias = [](const pl::Weight *w) {
    const std::string suffix = "e_score_correction_bias";
    if (!w->tensors() || w->tensors()->size() != 1)
      return false;
    const std::string name = w->tensors()->Get(0)->str();
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) ==
               0;
  };
  for (size_t i = 0; i < plan.weights()->size(); ++i) {
    const pl::Weight *w = plan.weights()->Get(static_cast<fb::uoffset_t>(i));
    if (w->quant()) {
      BoundWeight b;
      const std::string ctx = pf.path + ": weight " + std::to_string(i);
      if (Status s = bindQuantisedWeight(WeightFinder(*bw), *w, ctx, b,
                                         bw->packed, form);
          !s)
        return s;
      bw->weights.push_back(std::move(b));
      continue;
    }
    const nf::DType dtype = toDType(w->dtype());
    const BlockKey key = keyOf(w);
    BoundWeight b;
    b.shape.assign(w->shape()->begin(), w->shape()->end());
    size_t n = 1;
    for (int64_t d : b.shape)
      n *= static_cast<size_t>(d);
    const size_t room = blockElements[key] - n;
    const size_t offset = room ? (next() % room) & ~size_t(63) : 0;
    b.view.data = blocks[key] + offset * dtypeSize(dtype);
    if (isRouterBias(w)) {
      auto zero = std::make_unique<uint8_t[]>(n * dtypeSize(dtype));
      std::memset(zero.get(), 0, n * dtypeSize(dtype));
      b.view.data = zero.get();
      bw->packed.push_back(std::move(zero));
    }
    b.view.dtype = dtype;
    b.view.shape = b.shape;
    if (w->stacked()) // the CPU backend reads stacked weights per expert
      b.experts = splitExperts(b.view);
    bw->weights.push_back(std::move(b));
  }
  return bw;
}

StatusOr<std::unique_ptr<BoundWeights>>
bindWeights(const PlanFile &pf, const std::string &weightsDir, QuantForm form) {
  const pl::Plan &plan = *pf.plan;
  const pl::ModelConfig &cfg = *plan.config();
  auto bw = std::make_unique<BoundWeights>();
  bw->dir = weightsDir;
  if (bw->dir.empty()) {
    if (!cfg.checkpoint() || cfg.checkpoint()->size() == 0)
      return Status::error(pf.path + ": the plan names no checkpoint "
                                     "directory; give the weights directory");
    bw->dir = cfg.checkpoint()->str();
  }
  if (!cfg.weight_files() || cfg.weight_files()->size() == 0)
    return Status::error(pf.path + ": the plan lists no weight files");
  namespace fs = std::filesystem;
  try {
    // The checkpoint's files, then those nfc wrote beside the plan
    // (compile-time quantisation), each inside its directory.
    auto open = [&](const std::string &dir, const fb::String *f) -> Status {
      const std::string rel = f->str();
      StatusOr<std::string> inside =
          pathInside(dir, rel, pf.path, "weight file");
      if (!inside)
        return inside.status();
      const std::string &full = *inside;
      std::error_code ec;
      if (!fs::is_regular_file(full, ec))
        return Status::error(dir + ": missing weights file " + rel);
      StatusOr<WeightStore> ws = WeightStore::openFile(full);
      if (!ws)
        return ws.status();
      bw->stores.push_back(std::move(*ws));
      bw->files.push_back(full);
      return Status::success();
    };
    for (const fb::String *f : *cfg.weight_files())
      if (Status s = open(bw->dir, f); !s)
        return s;
    if (cfg.plan_weight_files()) {
      std::string planDir = fs::path(pf.path).parent_path().string();
      if (planDir.empty())
        planDir = ".";
      for (const fb::String *f : *cfg.plan_weight_files())
        if (Status s = open(planDir, f); !s)
          return s;
    }

    WeightFinder finder(*bw);
    const auto &weights = *plan.weights();
    for (fb::uoffset_t wi = 0; wi < weights.size(); ++wi) {
      const pl::Weight &w = *weights.Get(wi);
      const std::string ctx = pf.path + ": weight " + std::to_string(wi);
      if (!w.tensors() || w.tensors()->size() == 0)
        return Status::error(ctx + " names no tensors");
      if (w.quant()) {
        BoundWeight b;
        if (Status s = bindQuantisedWeight(finder, w, ctx, b, bw->packed, form);
            !s)
          return s;
        bw->weights.push_back(std::move(b));
        continue;
      }
      const pl::DType pdt = w.dtype();
      if (pdt != pl::DType::F32 && pdt != pl::DType::BF16 &&
          pdt != pl::DType::F16)
        return Status::error(ctx + " has unsupported dtype " +
                             pl::EnumNameDType(pdt));
      const nf::DType dt = toDType(pdt);
      const std::vector<int64_t> shape = toVector(w.shape());
      for (int64_t d : shape)
        if (d <= 0)
          return Status::error(ctx + " has shape " + shapeString(shape));
      const std::vector<int64_t> rows = toVector(w.concat_rows());
      const auto &names = *w.tensors();
      const size_t n = names.size();
      BoundWeight b;
      b.shape = shape;

      if (w.stacked()) {
        if (shape.empty())
          return Status::error(ctx + ": stacked weight without dimensions");
        if (n == 1) {
          auto v = finder.get(names.Get(0)->str(), dt, shape);
          if (!v)
            return v.status();
          b.view = *v;
          for (int64_t e = 0; e < shape[0]; ++e)
            b.experts.push_back(b.view.at(e));
        } else {
          if (static_cast<int64_t>(n) != shape[0])
            return Status::error(ctx + ": " + std::to_string(n) +
                                 " tensors stacked into shape " +
                                 shapeString(shape));
          const std::vector<int64_t> each(shape.begin() + 1, shape.end());
          for (size_t i = 0; i < n; ++i) {
            auto v = finder.get(names.Get(i)->str(), dt, each);
            if (!v)
              return v.status();
            b.experts.push_back(*v);
          }
        }
      } else if (!rows.empty()) {
        if (rows.size() != n)
          return Status::error(ctx + ": " + std::to_string(rows.size()) +
                               " concat_rows for " + std::to_string(n) +
                               " tensors");
        int64_t total = 0;
        for (int64_t r : rows)
          total += r;
        if (shape.empty() || total != shape[0])
          return Status::error(ctx + ": concat_rows sum to " +
                               std::to_string(total) + ", shape is " +
                               shapeString(shape));
        std::vector<WeightView> parts;
        size_t bytes = 0;
        for (size_t i = 0; i < n; ++i) {
          std::vector<int64_t> s = shape;
          s[0] = rows[i];
          auto v = finder.get(names.Get(i)->str(), dt, s);
          if (!v)
            return v.status();
          bytes += static_cast<size_t>(v->numElements()) * v->elementSize();
          parts.push_back(*v);
        }
        std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[bytes]);
        if (!buf)
          return Status::error(ctx + ": out of memory packing " +
                               std::to_string(bytes) + " bytes");
        size_t at = 0;
        for (const WeightView &v : parts) {
          const size_t nb =
              static_cast<size_t>(v.numElements()) * v.elementSize();
          std::memcpy(buf.get() + at, v.data, nb);
          at += nb;
        }
        b.view.data = buf.get();
        b.view.dtype = dt;
        b.view.shape = shape;
        bw->packed.push_back(std::move(buf));
      } else {
        if (n != 1)
          return Status::error(ctx + ": " + std::to_string(n) +
                               " tensors but neither stacked nor "
                               "concatenated");
        auto v = finder.get(names.Get(0)->str(), dt, shape);
        if (!v)
          return v.status();
        b.view = *v;
      }
      bw->weights.push_back(std::move(b));
    }
  } catch (const std::bad_alloc &) {
    return Status::error(bw->dir + ": out of memory binding weights");
  } catch (const std::exception &e) {
    return Status::error(bw->dir + ": " + e.what());
  }
  return bw;
}

} // namespace nf::engine
