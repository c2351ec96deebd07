//===- QuantizedWeights.cpp - codes of compile-time quantisation ----------===//
//
// The second half of nfc compile --weights: nf-quantize-weights chose the
// weights and named their codes; this reads each source tensor from the
// checkpoint and writes codes and scales beside the plan, one part at a
// time (a Nano-size checkpoint does not fit in memory twice).
//
//===----------------------------------------------------------------------===//

#include "Plan/QuantizedWeights.h"

#include "Transforms/Passes.h"
#include "nf/IR/NfOps.h"

#include "weights.h"

#include "mlir/IR/Builders.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

using namespace mlir;
namespace nfir = ::mlir::nf;

namespace nf::compiler {
namespace {

/// One part of a marked weight: a source matrix and its codes.
struct Part {
  nfir::WeightOp op;
  std::string source; // checkpoint tensor
  int64_t slice = -1; // >= 0: expert `slice` of a stacked source tensor
  std::string codes, scale;
  int64_t rows = 0, cols = 0, group = 0; // group: int4 columns per scale
  bool int4 = false;
};

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// f32 scale with which `amax` maps to `top` (1 for an all-zero row/group,
/// whose codes are then zero).
float scaleFor(float amax, float top) {
  const float s = amax / top;
  return s > 0.0f ? s : 1.0f;
}

/// Codes and scales of `w` ([rows, cols] as f32 values).
Status quantizePart(const Part &p, const WeightView &w, std::string &codes,
                    std::string &scales) {
  const int64_t R = p.rows, C = p.cols;
  std::vector<float> row(static_cast<size_t>(C));
  if (p.int4) {
    const int64_t words = (C + 7) / 8, groups = C / p.group;
    codes.assign(static_cast<size_t>(R * words * 4), '\0');
    scales.assign(static_cast<size_t>(R * groups * 4), '\0');
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < C; ++c)
        row[c] = loadF32(w, r * C + c);
      for (int64_t g = 0; g < groups; ++g) {
        float amax = 0.0f;
        for (int64_t c = g * p.group; c < (g + 1) * p.group; ++c)
          amax = std::max(amax, std::fabs(row[c]));
        if (!std::isfinite(amax))
          return Status::error("tensor '" + p.source +
                               "' holds a non-finite value in row " +
                               std::to_string(r));
        const float s = scaleFor(amax, 7.5f);
        std::memcpy(&scales[(r * groups + g) * 4], &s, 4);
        for (int64_t c = g * p.group; c < (g + 1) * p.group; ++c) {
          const float q = std::clamp(std::nearbyint(row[c] / s), -8.0f, 7.0f);
          const uint32_t nibble = static_cast<uint32_t>(q + 8.0f);
          uint32_t word;
          std::memcpy(&word, &codes[(r * words + c / 8) * 4], 4);
          word |= nibble << (4 * (c % 8));
          std::memcpy(&codes[(r * words + c / 8) * 4], &word, 4);
        }
      }
    }
    return Status::success();
  }
  codes.assign(static_cast<size_t>(R * C), '\0');
  scales.assign(static_cast<size_t>(R * 4), '\0');
  for (int64_t r = 0; r < R; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      row[c] = loadF32(w, r * C + c);
      amax = std::max(amax, std::fabs(row[c]));
    }
    if (!std::isfinite(amax))
      return Status::error("tensor '" + p.source +
                           "' holds a non-finite value in row " +
                           std::to_string(r));
    const float s = scaleFor(amax, 448.0f);
    std::memcpy(&scales[r * 4], &s, 4);
    for (int64_t c = 0; c < C; ++c)
      codes[r * C + c] = static_cast<char>(e4m3Code(row[c] / s));
  }
  return Status::success();
}

/// The marked weights' parts, each once (prefill and decode share weights).
std::vector<Part> partsOf(ModuleOp module) {
  std::vector<Part> parts;
  std::map<std::string, bool> seen;
  module.walk([&](nfir::WeightOp w) {
    auto from = w->getAttrOfType<ArrayAttr>(kQuantizeFromAttr);
    auto quant = w.getQuant();
    if (!from || !quant)
      return;
    auto shape = w.getResult().getType().getShape();
    for (auto [i, name] : llvm::enumerate(w.getTensors())) {
      Part p;
      p.op = w;
      p.codes = cast<StringAttr>(name).str();
      if (seen[p.codes])
        continue;
      seen[p.codes] = true;
      p.source = cast<StringAttr>(from[from.size() == 1 ? 0 : i]).str();
      if (w.getStacked() && from.size() == 1)
        p.slice = static_cast<int64_t>(i);
      p.scale = cast<StringAttr>(quant->getScales()[i]).str();
      auto concat = w.getConcatRows(); // packed q/k/v: rows per part
      p.rows = concat ? (*concat)[i] : shape[shape.size() - 2];
      p.cols = shape.back();
      p.int4 = quant->getScheme() == nfir::QuantScheme::Int4;
      p.group = quant->getGroupSize();
      parts.push_back(std::move(p));
    }
  });
  return parts;
}

} // namespace

Status writeQuantizedWeights(ModuleOp module, const std::string &path) {
  std::vector<Part> parts = partsOf(module);
  if (parts.empty())
    return Status::success();
  auto info = module->getAttrOfType<DictionaryAttr>("nf.model");
  auto checkpoint = info ? info.getAs<StringAttr>("checkpoint") : StringAttr();
  if (!checkpoint || checkpoint.getValue().empty())
    return Status::error("--weights: the model names no checkpoint "
                         "directory to read the weights from (import it "
                         "with nfc import)");
  StatusOr<WeightStore> store =
      WeightStore::openCheckpoint(checkpoint.getValue().str());
  if (!store)
    return store.status();

  std::vector<TensorData> tensors;
  for (const Part &p : parts) {
    tensors.push_back({p.codes,
                       p.int4 ? DType::I32 : DType::F8E4M3,
                       {p.rows, p.int4 ? (p.cols + 7) / 8 : p.cols},
                       {}});
    tensors.push_back(
        {p.scale, DType::F32, {p.rows, p.int4 ? p.cols / p.group : 1}, {}});
  }
  std::string scales; // part i's, computed with its codes
  Status written = writeSafetensors(
      path, tensors,
      [&](size_t i, std::string &bytes) -> Status {
        const Part &p = parts[i / 2];
        if (i % 2 == 1) {
          bytes.swap(scales);
          return Status::success();
        }
        StatusOr<WeightView> found = store->find(p.source);
        if (!found)
          return found.status();
        WeightView w = *found;
        const std::string where =
            checkpoint.getValue().str() + ": tensor '" + p.source + "'";
        if (!isSupportedWeightDType(w.dtype))
          return Status::error(where + " has dtype " + dtypeName(w.dtype) +
                               ", expected f32, bf16 or f16");
        if (p.slice >= 0) {
          if (w.shape.size() != 3 || p.slice >= w.shape[0])
            return Status::error(where + " has shape " + shapeString(w.shape) +
                                 ", not a stack of experts");
          w = w.at(p.slice);
        }
        if (w.shape != std::vector<int64_t>{p.rows, p.cols})
          return Status::error(where + " has shape " + shapeString(w.shape) +
                               ", expected " + shapeString({p.rows, p.cols}));
        if (Status s = quantizePart(p, w, bytes, scales); !s)
          return Status::error(checkpoint.getValue().str() + ": " +
                               s.message());
        return Status::success();
      },
      {{"format", "pt"}, {"producer", "nfc compile --weights"}});
  if (!written)
    return written;

  // The plan lists the file by name; it lies in the plan's directory.
  Builder b(module.getContext());
  NamedAttrList attrs(info);
  attrs.set(
      "plan_weight_files",
      b.getStrArrayAttr({std::filesystem::path(path).filename().string()}));
  module->setAttr("nf.model", attrs.getDictionary(module.getContext()));
  module.walk([](nfir::WeightOp w) { w->removeAttr(kQuantizeFromAttr); });
  return Status::success();
}

} // namespace nf::compiler
