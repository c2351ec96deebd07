// Binding quantised plan weights (Weight.quant, plan format 1.11): each
// part's codes and scales are read from the checkpoint, checked, and
// dequantised into f32 at load, so every CPU op reads them as it reads f32
// weights; the linear's input quantisation is kept beside them. The scheme
// semantics are the IR's #nf.quant (dialects/nf/IR/NfAttrs.td).
#include "engine/plan_loader.h"

#include <cmath>
#include <map>
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

/// Part p's scale tensor, checked against its granularity: each row has
/// `perRow` scales (0: one for the whole part), each covering `group`
/// columns.
struct PartScales {
  WeightView view;
  int64_t perRow = 0, group = 0;
  float at(int64_t r, int64_t c) const {
    return loadF32(view, perRow == 0 ? 0 : r * perRow + c / group);
  }
};
StatusOr<PartScales> partScales(const WeightFinder &finder,
                                const pl::WeightQuant &q, const Part &p,
                                int64_t C) {
  const int64_t R = p.rows;
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
  return PartScales{scale, perRow, group};
}

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
  StatusOr<PartScales> scales = partScales(finder, q, p, C);
  if (!scales)
    return scales.status();
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
      out[r * C + c] = code * scales->at(r, c);
    }
  return Status::success();
}

/// QuantForm::Codes: part p's codes appended to `out`, FP8 ([R, C]) with
/// the scale of each of its rows, or int4 ([R, C / 8] words) with the scale
/// of each group of each row.
Status bindPartCodes(const WeightFinder &finder, const pl::WeightQuant &q,
                     const Part &p, int64_t C, BoundWeight &out) {
  const bool int4 = q.scheme() == pl::QuantScheme::Int4;
  auto codes = int4 ? finder.get(p.codes, nf::DType::I32, {p.rows, C / 8})
                    : finder.get(p.codes, nf::DType::F8E4M3, {p.rows, C});
  if (!codes)
    return codes.status();
  StatusOr<PartScales> scales = partScales(finder, q, p, C);
  if (!scales)
    return scales.status();
  out.codeParts.push_back(*codes);
  const int64_t step = int4 ? q.group_size() : C;
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < C; c += step)
      out.rowScales.push_back(scales->at(r, c));
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

/// The parts of quantised weight `w` (code, scale and input-scale tensor
/// names, rows of each), checked against its shape and quant table; `shape`
/// receives the weight's logical shape.
StatusOr<std::vector<Part>> quantParts(const pl::Weight &w,
                                       const std::string &ctx,
                                       std::vector<int64_t> &shape) {
  const pl::WeightQuant &q = *w.quant();
  const auto &names = *w.tensors();
  const size_t n = names.size();
  shape.clear();
  if (w.shape())
    shape.assign(w.shape()->begin(), w.shape()->end());
  if (shape.size() != (w.stacked() ? 3u : 2u))
    return Status::error(ctx + ": quantised weight of shape " +
                         shapeString(shape) + " (expected a matrix, or " +
                         "stacked experts' matrices)");
  for (int64_t d : shape)
    if (d <= 0)
      return Status::error(ctx + " has shape " + shapeString(shape));
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

  return parts;
}

} // namespace

Status bindQuantisedWeight(const WeightFinder &finder, const pl::Weight &w,
                           const std::string &ctx, BoundWeight &out,
                           std::vector<std::unique_ptr<uint8_t[]>> &packed,
                           QuantForm form) {
  const pl::WeightQuant &q = *w.quant();
  std::vector<int64_t> shape;
  StatusOr<std::vector<Part>> partsOr = quantParts(w, ctx, shape);
  if (!partsOr)
    return partsOr.status();
  const std::vector<Part> &parts = *partsOr;
  const bool isStatic = q.activations() == pl::ActivationQuant::StaticPerTensor;
  if (form == QuantForm::Codes) {
    // The CUDA kernels' form (the compiler refuses the others for CUDA).
    const bool int4 = q.scheme() == pl::QuantScheme::Int4;
    const bool fits = int4
                          ? q.granularity() == pl::QuantGranularity::PerGroup &&
                                q.pack() == 8 && q.group_size() % 8 == 0 &&
                                shape.back() % 8 == 0 &&
                                q.activations() == pl::ActivationQuant::None
                          : q.granularity() != pl::QuantGranularity::PerGroup;
    if (!fits)
      return Status::error(
          ctx + ": " + pl::EnumNameQuantScheme(q.scheme()) + " " +
          pl::EnumNameQuantGranularity(q.granularity()) +
          " weights have no CUDA kernels (FP8 weights with per-tensor or "
          "per-channel scales do, and weight-only int4 in groups of a "
          "multiple of 8 columns)");
    for (const Part &p : parts) {
      if (Status s = bindPartCodes(finder, q, p, shape.back(), out); !s)
        return s;
      if (isStatic) {
        StatusOr<float> s = inputScale(finder, p.inputScale);
        if (!s)
          return s.status();
        out.input.scales.push_back(*s);
      }
    }
    out.input.kind = q.activations();
    out.shape = shape;
    out.quantised = true;
    return Status::success();
  }
  const int64_t C = shape.back();
  if (w.concat_rows() && w.concat_rows()->size() > 0)
    for (const Part &p : parts)
      out.input.partRows.push_back(p.rows);

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

Status addRandomQuantTensors(const PlanFile &pf, uint64_t seed,
                             WeightStore &store,
                             std::vector<std::unique_ptr<uint8_t[]>> &packed) {
  struct Planned {
    std::vector<Part> parts;
    const pl::WeightQuant *q;
    int64_t C;
  };
  std::vector<Planned> planned;
  // Sizes of the shared blocks: the largest part's codes and scales.
  size_t fp8Bytes = 0, int4Words = 0, scales = 1;
  const auto &weights = *pf.plan->weights();
  for (fb::uoffset_t wi = 0; wi < weights.size(); ++wi) {
    const pl::Weight &w = *weights.Get(wi);
    if (!w.quant())
      continue;
    std::vector<int64_t> shape;
    StatusOr<std::vector<Part>> parts =
        quantParts(w, pf.path + ": weight " + std::to_string(wi), shape);
    if (!parts)
      return parts.status();
    const pl::WeightQuant &q = *w.quant();
    const int64_t C = shape.back();
    for (const Part &p : *parts) {
      if (q.scheme() == pl::QuantScheme::Int4)
        int4Words = std::max(int4Words, size_t(p.rows * ((C + 7) / 8)));
      else
        fp8Bytes = std::max(fp8Bytes, size_t(p.rows * C));
      const int64_t perRow =
          q.granularity() == pl::QuantGranularity::PerChannel ? 1
          : q.granularity() == pl::QuantGranularity::PerGroup &&
                  q.group_size() > 0
              ? C / q.group_size()
              : 0;
      scales = std::max(scales, size_t(perRow ? p.rows * perRow : 1));
    }
    planned.push_back({std::move(*parts), &q, C});
  }
  WeightRandom next(seed, 0xD1B54A32D192ED03ull);
  auto block = [&](size_t bytes) {
    packed.push_back(std::make_unique<uint8_t[]>(bytes + 64 * 8));
    return packed.back().get();
  };
  // Dequantised weights uniform in about [-a, a], a = 1 / sqrt(C) as for
  // syntheticWeights' unquantised matrices: fp8 codes of uniform values at
  // scale a / 448, int4 codes uniform in [-8, 7] at scale a / 8. Room for
  // window offsets.
  const size_t fp8Room = fp8Bytes / 8 + 64, int4Room = int4Words / 8 + 16;
  uint8_t *fp8 = block(fp8Bytes + fp8Room);
  for (size_t i = 0; i < fp8Bytes + fp8Room; ++i) {
    fp8[i] = e4m3Code(next.centred() * 2.0f * 448.0f);
  }
  uint8_t *int4 = block(4 * (int4Words + int4Room));
  for (size_t i = 0; i < 4 * (int4Words + int4Room); ++i)
    int4[i] = static_cast<uint8_t>(next() >> 56);
  auto constant = [&](float v, size_t n) {
    uint8_t *b = block(4 * n);
    for (size_t i = 0; i < n; ++i)
      std::memcpy(b + 4 * i, &v, 4);
    return b;
  };
  // The scales of each column count (one block each).
  std::map<std::pair<bool, int64_t>, const uint8_t *> scaleBlocks;
  auto scaleOf = [&](bool isInt4, int64_t C) {
    const uint8_t *&b = scaleBlocks[{isInt4, C}];
    if (!b) {
      const float a = fanInAmplitude(C);
      b = constant(a / (isInt4 ? 8.0f : 448.0f), scales);
    }
    return b;
  };
  // Static input scales: activations up to +-8 representable.
  const uint8_t *inputScale = constant(8.0f / 448.0f, 1);
  for (const Planned &w : planned) {
    const bool isInt4 = w.q->scheme() == pl::QuantScheme::Int4;
    const int64_t words = isInt4 ? (w.C + 7) / 8 : w.C;
    for (const Part &p : w.parts) {
      const size_t room = isInt4 ? int4Room : fp8Room;
      const size_t offset = (next() % room) & ~size_t(15);
      store.addView(p.codes, isInt4 ? nf::DType::I32 : nf::DType::F8E4M3,
                    {p.rows, words}, isInt4 ? int4 + 4 * offset : fp8 + offset);
      std::vector<int64_t> scaleShape{1};
      if (w.q->granularity() == pl::QuantGranularity::PerChannel)
        scaleShape = {p.rows};
      else if (w.q->granularity() == pl::QuantGranularity::PerGroup)
        scaleShape = {p.rows, w.q->group_size() > 0 ? w.C / w.q->group_size()
                                                    : int64_t(0)};
      store.addView(p.scale, nf::DType::F32, scaleShape, scaleOf(isInt4, w.C));
      if (!p.inputScale.empty())
        store.addView(p.inputScale, nf::DType::F32, {1}, inputScale);
    }
  }
  return Status::success();
}

} // namespace nf::engine
