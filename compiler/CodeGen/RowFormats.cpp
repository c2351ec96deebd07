//===- RowFormats.cpp - bf16 rows and copies ------------------------------===//
//
// A step's row formats (RowFormats), read before any kernel is emitted from
// the decisions of nf-cuda-row-formats (compiler/Transforms), with the
// arena offsets of the bf16 copies.
//
//===----------------------------------------------------------------------===//

#include "CodeGen/KernelEmitter.h"

namespace nf::codegen::detail {

/// The values stored as bf16 rows (prefill) or with bf16 copies beside their
/// f32 rows (decode) are chosen by nf-cuda-row-formats, which marks their
/// producers with `nf.row_format` ("bf16" / "f32+bf16"); the emitters of
/// those producers and of their readers consult the result. A value's copy
/// sits at `valuesEnd + offset / 2`: values live at the same time have
/// disjoint offsets, so their copies (half the bytes) are disjoint too.
StatusOr<RowFormats> rowFormatsOf(const PlanStep &step,
                                  const std::vector<ValueInfo> &values) {
  RowFormats out;
  const int64_t valuesEnd = alignTo(step.arenaBytes + step.scratchBytes);
  int64_t end = valuesEnd;
  for (const PlanKernel &k : step.kernels)
    for (const PlanOp &op : k.ops) {
      std::optional<std::string> format = stringAttr(op, "nf.row_format");
      if (!format)
        continue;
      const int v = op.results.size() == 1 ? op.results[0] : -1;
      const bool rows = v >= 0 && v < static_cast<int>(values.size()) &&
                        values[v].kind == pl::ValueKind::Tensor &&
                        values[v].dtype == pl::DType::F32 &&
                        values[v].rows != pl::Rows::None;
      if (*format == "bf16" && rows) {
        out.bf16.insert(v);
      } else if (*format == "f32+bf16" && rows && values[v].offset >= 0 &&
                 values[v].offset % 32 == 0) {
        const int64_t at = valuesEnd + values[v].offset / 2;
        out.shadow[v] = at;
        end = std::max(end, at + (values[v].bytes + 1) / 2);
      } else {
        return Status::error("cuda: " + step.phase + " kernel '" + k.name +
                             "': " + opName(op) + " has nf.row_format '" +
                             *format +
                             "', which its result cannot be stored as");
      }
    }
  if (!out.shadow.empty())
    out.shadowEnd = alignTo(end);
  return out;
}

} // namespace nf::codegen::detail
