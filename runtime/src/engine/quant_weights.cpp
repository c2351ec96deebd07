// Binding quantised plan weights (Weight.quant, plan format 1.11): each
// part's codes and scales are read from the checkpoint, checked, and
// dequantised into f32 at load, so every CPU op reads them as it reads f32
// weights; the linear's input quantisation is kept beside them. The scheme
// semantics are the IR's #nf.quant (dialects/nf/IR/NfAttrs.td).
#include "engine/plan_loader.h"

#include <cmath>
#include <new>

namespace nf::engine {

namespace pl = nf::plan;
namespace fb = flatbuffers;

namespace {

bool isFloat(nf::DType t) {
  return t == nf::DType::F32 || t == nf::DType::BF16 || t == nf::DType::F16;
}

/// One part of a quantised weight: a code tensor and its scales.
struct Part {
  std::string codes, scale, inputScale;
  int64_t rows = 0;
};

/// Dequantises part `p` ([R, C] codes) into `out` (R * C floats).
Status dequantisePart(const WeightFinder &finder, const pl::WeightQuant &q,
                      const Part &p, int64_t C, const std::string &ctx,
                      float *out) {
  const int64_t R = p.rows;
  const bool int4 = q.scheme() == pl::QuantScheme::Int4;
  const int64_t pack = int4 ? q.pack() : 1;
  if (int4 && pack != 8)
    return Status::error(ctx + ": int4 codes packed " + std::to_string(pack) +
                         " per word (expected 8)");
  const int64_t words = (C + pack - 1) / pack;
  auto codes = finder.get(p.codes, int4 ? nf::DType::I32 : nf::DType::F8E4M3,
                          {R, words});
  if (!codes)
    return codes.status();
  auto scaleFound = finder.find(p.scale);
  if (!scaleFound)
    return scaleFound.status();
  const auto &[scale, file] = *scaleFound;
  if (!isFloat(scale.dtype))
    return Status::error(file + ": scale '" + p.scale + "' has dtype " +
                         dtypeName(scale.dtype) + ", expected f32/bf16/f16");
  // What one scale covers, and the shapes that say so.
  int64_t perRow = 0, group = C; // scales per row, columns per scale
  const std::vector<int64_t> &ss = scale.shape;
  bool ok = false;
  switch (q.granularity()) {
  case pl::QuantGranularity::PerTensor:
    ok = scale.numElements() == 1 && ss.size() <= 1;
    break;
  case pl::QuantGranularity::PerChannel:
    perRow = 1;
    ok = (ss.size() == 1 && ss[0] == R) ||
         (ss.size() == 2 && ss[0] == R && ss[1] == 1);
    break;
  case pl::QuantGranularity::PerGroup:
    group = q.group_size();
    ok = group > 0 && C % group == 0 && ss.size() == 2 && ss[0] == R &&
         ss[1] == C / group;
    perRow = ok ? C / group : 0;
    break;
  }
  if (!ok)
    return Status::error(file + ": scale '" + p.scale + "' has shape " +
                         shapeString(ss) + ", which does not fit codes " +
                         shapeString({R, C}) + " " +
                         pl::EnumNameQuantGranularity(q.granularity()) +
                         (q.granularity() == pl::QuantGranularity::PerGroup
                              ? " of " + std::to_string(group)
                              : std::string()));
  const auto *bytes = static_cast<const uint8_t *>(codes->data);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      float code;
      if (int4) {
        uint32_t word;
        std::memcpy(&word, bytes + 4 * (r * words + c / 8), 4);
        code = static_cast<float>(
            static_cast<int>((word >> 4 * (c % 8)) & 0xFu) - 8);
      } else {
        code = e4m3ToF32(bytes[r * C + c]);
      }
      const float s = loadF32(scale, perRow == 0 ? 0 : r * perRow + c / group);
      out[r * C + c] = code * s;
    }
  return Status::success();
}

/// The scalar input scale `name` of a static activation quantisation.
StatusOr<float> inputScale(const WeightFinder &finder,
                           const std::string &name) {
  auto found = finder.find(name);
  if (!found)
    return found.status();
  const auto &[view, file] = *found;
  if (!isFloat(view.dtype) || view.numElements() != 1)
    return Status::error(file + ": input scale '" + name + "' is " +
                         dtypeName(view.dtype) + " " + shapeString(view.shape) +
                         ", expected one float");
  const float s = loadF32(view, 0);
  if (!(s > 0.0f) || !std::isfinite(s))
    return Status::error(file + ": input scale '" + name + "' is " +
                         std::to_string(s) + ", expected a positive number");
  return s;
}

} // namespace

Status bindQuantisedWeight(const WeightFinder &finder, const pl::Weight &w,
                           const std::string &ctx, BoundWeight &out,
                           std::vector<std::unique_ptr<uint8_t[]>> &packed) {
  const pl::WeightQuant &q = *w.quant();
  const auto &names = *w.tensors();
  const size_t n = names.size();
  std::vector<int64_t> shape;
  if (w.shape())
    shape.assign(w.shape()->begin(), w.shape()->end());
  if (shape.size() != (w.stacked() ? 3u : 2u))
    return Status::error(ctx + ": quantised weight of shape " +
                         shapeString(shape) + " (expected a matrix, or " +
                         "stacked experts' matrices)");
  for (int64_t d : shape)
    if (d <= 0)
      return Status::error(ctx + " has shape " + shapeString(shape));
  const int64_t C = shape.back();
  const bool expectedDtype = q.scheme() == pl::QuantScheme::Int4
                                 ? w.dtype() == pl::DType::I32
                                 : w.dtype() == pl::DType::F8E4M3;
  if (!expectedDtype)
    return Status::error(ctx + ": " + pl::EnumNameQuantScheme(q.scheme()) +
                         " codes stored as " + pl::EnumNameDType(w.dtype()));

  // The parts, in the order of the weight's tensors.
  std::vector<int64_t> rows;
  if (w.concat_rows())
    rows.assign(w.concat_rows()->begin(), w.concat_rows()->end());
  std::vector<Part> parts(n);
  if (w.stacked()) {
    if (static_cast<int64_t>(n) != shape[0])
      return Status::error(ctx + ": " + std::to_string(n) + " tensors for " +
                           std::to_string(shape[0]) +
                           " quantised experts (one tensor per expert)");
    for (Part &p : parts)
      p.rows = shape[1];
  } else if (!rows.empty()) {
    int64_t total = 0;
    for (int64_t r : rows)
      total += r;
    if (rows.size() != n || total != shape[0])
      return Status::error(ctx + ": concat_rows do not fit shape " +
                           shapeString(shape));
    for (size_t i = 0; i < n; ++i)
      parts[i].rows = rows[i];
    out.input.partRows = rows;
  } else {
    if (n != 1)
      return Status::error(ctx + ": " + std::to_string(n) +
                           " tensors but neither stacked nor concatenated");
    parts[0].rows = shape[0];
  }
  const bool isStatic = q.activations() == pl::ActivationQuant::StaticPerTensor;
  if (!q.scales() || q.scales()->size() != n)
    return Status::error(ctx + ": " +
                         std::to_string(q.scales() ? q.scales()->size() : 0) +
                         " scale tensors for " + std::to_string(n) + " parts");
  if (isStatic && (!q.input_scales() || q.input_scales()->size() != n))
    return Status::error(ctx + ": static activation quantisation needs one "
                               "input scale per part");
  for (size_t i = 0; i < n; ++i) {
    parts[i].codes = names.Get(static_cast<fb::uoffset_t>(i))->str();
    parts[i].scale = q.scales()->Get(static_cast<fb::uoffset_t>(i))->str();
    if (isStatic)
      parts[i].inputScale =
          q.input_scales()->Get(static_cast<fb::uoffset_t>(i))->str();
  }

  size_t elements = 1;
  for (int64_t d : shape)
    elements *= static_cast<size_t>(d);
  std::unique_ptr<uint8_t[]> buf(new (std::nothrow)
                                     uint8_t[elements * sizeof(float)]);
  if (!buf)
    return Status::error(ctx + ": out of memory dequantising " +
                         std::to_string(elements * sizeof(float)) + " bytes");
  float *values = reinterpret_cast<float *>(buf.get());
  int64_t at = 0;
  for (const Part &p : parts) {
    if (Status s = dequantisePart(finder, q, p, C, ctx, values + at * C); !s)
      return s;
    at += p.rows;
    if (isStatic) {
      StatusOr<float> s = inputScale(finder, p.inputScale);
      if (!s)
        return s.status();
      out.input.scales.push_back(*s);
    }
  }
  out.shape = shape;
  out.view.data = values;
  out.view.dtype = nf::DType::F32;
  out.view.shape = shape;
  if (w.stacked())
    out.experts = splitExperts(out.view);
  out.input.kind = q.activations();
  out.quantised = true;
  packed.push_back(std::move(buf));
  return Status::success();
}

} // namespace nf::engine
