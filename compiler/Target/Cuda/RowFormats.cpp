//===- RowFormats.cpp - bf16 rows and copies ------------------------------===//
//
// A step's row formats (RowFormats), read before any kernel is emitted from
// the decisions of nf-cuda-row-formats and nf-plan-memory
// (compiler/Transforms): which rows are bf16, where the bf16 copies are.
//
//===----------------------------------------------------------------------===//

#include "Target/Cuda/KernelEmitter.h"

namespace nf::codegen::detail {

/// The values stored as bf16 rows (prefill) or with bf16 copies beside their
/// f32 rows (decode) are chosen by nf-cuda-row-formats, which marks their
/// producers with `nf.row_format` ("bf16" / "f32+bf16"); nf-plan-memory
/// places the copies (`nf.copy_offset`). The emitters of those producers and
/// of their readers consult the result.
StatusOr<RowFormats> rowFormatsOf(const PlanStep &step,
                                  const std::vector<ValueInfo> &values) {
  RowFormats out;
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
      const std::optional<int64_t> copy = intAttr(op, "nf.copy_offset");
      if (*format == "bf16" && rows) {
        out.bf16.insert(v);
      } else if (*format == "f32+bf16" && rows && copy && *copy % 32 == 0) {
        out.shadow[v] = *copy;
      } else {
        return Status::error("cuda: " + step.phase + " kernel '" + k.name +
                             "': " + opName(op) + " has nf.row_format '" +
                             *format +
                             "', which its result cannot be stored as");
      }
    }
  return out;
}

} // namespace nf::codegen::detail
