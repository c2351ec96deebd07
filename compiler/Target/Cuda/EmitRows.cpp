//===- EmitRows.cpp - row-wise ops -> CUDA --------------------------------===//
//
// KernelEmitter's row-wise ops (kernels/nf_rows.cuh): embeddings, RMSNorm,
// adds (with a following RMSNorm fused), column splits and activations.
//
//===----------------------------------------------------------------------===//

#include "Target/Cuda/KernelEmitter.h"

namespace nf::codegen::detail {

StatusOr<size_t> KernelEmitter::embed(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 2 || out.size() != 1 || !isAct(out[0]))
    return fail(i, "expects (tokens, table) -> f32 rows");
  std::string ids;
  if (V(in[0]).kind == pl::ValueKind::Tokens)
    ids = "a->tokens";
  else if (isTensor(in[0], pl::DType::I32) && V(in[0]).cols == 1)
    ids = arenaPtr(in[0], "int32_t");
  else
    return fail(i, "token ids must be the step's tokens or an i32 column");
  auto shape = weightShape(in[1]);
  auto wt = weightType(in[1]);
  if (!wt || shape.size() != 2 || shape[1] != V(out[0]).cols)
    return fail(i, "table must be a [vocab, hidden] weight");
  const int64_t H = shape[1];
  includes.insert("nf_rows.cuh");
  addLaunch(fnName(i, "embed"), elementGrid(maxTokens * H), 256,
            "  nf::embed<" + *wt + ", " + num(H) + ">(a, " + ids + ", " +
                weightPtr(in[1]) + ", " + arenaPtr(out[0]) + ");\n",
            "nf.embed");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::rmsNorm(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 2 || out.size() != 1 || !isAct(in[0]) || !isAct(out[0]))
    return fail(i, "expects (input, weight) -> result, f32 rows");
  const int64_t H = V(in[0]).cols;
  auto wt = weightType(in[1]);
  auto eps = floatAttr(op, attr::Epsilon);
  if (!wt || weightNumel(in[1]) != H || V(out[0]).cols != H || !eps)
    return fail(i, "weight, result or epsilon does not match " +
                       std::to_string(H) + " features");
  includes.insert("nf_rows.cuh");
  addLaunch(fnName(i, "rms_norm"), blockGrid(maxTokens), kRowThreads,
            "  nf::rms_norm<" + *wt + ", " + num(H) + ">(a, " +
                arenaPtr(in[0]) + ", " + weightPtr(in[1]) + ", " +
                doubleLit(*eps) + ", " + outPtr(out[0]) + ");\n",
            "nf.rms_norm");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::add(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 2 || out.size() != 1 || !isAct(in[0]) || !isAct(in[1]) ||
      !isAct(out[0]) || V(in[0]).cols != V(in[1]).cols ||
      V(out[0]).cols != V(in[0]).cols)
    return fail(i, "expects two f32 row tensors of one shape");
  const int64_t H = V(out[0]).cols;
  includes.insert("nf_rows.cuh");
  // add + rms_norm of the sum: one row kernel (nf-cuda-epilogues).
  auto epilogue = epilogueOf(i);
  if (!epilogue)
    return epilogue.status();
  if (*epilogue == std::vector<std::string>{"nf.rms_norm"}) {
    const PlanOp &norm = *ops[i + 1];
    auto nin = operands(norm), nout = results(norm);
    auto wt = nin.size() == 2 ? weightType(nin[1]) : std::nullopt;
    auto eps = floatAttr(norm, attr::Epsilon);
    if (nin.size() == 2 && nin[0] == out[0] && nout.size() == 1 &&
        isAct(nout[0]) && V(nout[0]).cols == H && wt &&
        weightNumel(nin[1]) == H && eps) {
      addLaunch(fnName(i, "add_rms_norm"), blockGrid(maxTokens), kRowThreads,
                "  nf::add_rms_norm<" + *wt + ", " + num(H) + ">(a, " +
                    arenaPtr(in[0]) + ", " + arenaPtr(in[1]) + ", " +
                    arenaPtr(out[0]) + ", " + weightPtr(nin[1]) + ", " +
                    doubleLit(*eps) + ", " + outPtr(nout[0]) + ");\n",
                "nf.add + nf.rms_norm");
      return size_t(2);
    }
    return notInEpilogue(i + 1);
  }
  if (!epilogue->empty())
    return fail(i, "nf.epilogue: no CUDA epilogue of nf.add computes " +
                       epilogue->front());
  addLaunch(fnName(i, "add"), elementGrid(maxTokens * H), 256,
            "  nf::add<" + num(H) + ">(a, " + arenaPtr(in[0]) + ", " +
                arenaPtr(in[1]) + ", " + arenaPtr(out[0]) + ");\n",
            "nf.add");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::split(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  auto sizes = listAttr(op, attr::Sizes);
  if (in.size() != 1 || !isAct(in[0]) || !sizes || sizes->size() != out.size())
    return fail(i, "expects one f32 input and one result per size");
  const int64_t ld = V(in[0]).cols;
  std::string body;
  int64_t c0 = 0;
  for (size_t r = 0; r < out.size(); ++r) {
    if (!isAct(out[r]) || V(out[r]).cols != (*sizes)[r])
      return fail(i, "result " + std::to_string(r) + " does not match size " +
                         std::to_string((*sizes)[r]));
    body += "  nf::copy_columns<" + num(ld) + ", " + num(c0) + ", " +
            num((*sizes)[r]) + ">(a, " + arenaPtr(in[0]) + ", " +
            arenaPtr(out[r]) + ");\n";
    c0 += (*sizes)[r];
  }
  if (c0 != ld)
    return fail(i, "sizes do not sum to the input's columns");
  includes.insert("nf_rows.cuh");
  addLaunch(fnName(i, "split"), elementGrid(maxTokens * ld), 256, body,
            "nf.split");
  return size_t(1);
}

StatusOr<size_t> KernelEmitter::activation(size_t i) {
  const PlanOp &op = *ops[i];
  auto in = operands(op), out = results(op);
  if (in.size() != 1 || out.size() != 1 || !isAct(in[0]) || !isAct(out[0]) ||
      V(in[0]).cols != V(out[0]).cols)
    return fail(i, "expects one f32 row tensor and a result of its shape");
  auto act = activationKind(i, attr::Kind, true);
  if (!act)
    return act.status();
  includes.insert("nf_rows.cuh");
  const int64_t n = V(out[0]).cols;
  addLaunch(fnName(i, "activation"), elementGrid(maxTokens * n), 256,
            "  nf::activation<" + num(n) + ", " + *act + ">(a, " +
                arenaPtr(in[0]) + ", " + outPtr(out[0]) + ");\n",
            "nf.activation");
  return size_t(1);
}

} // namespace nf::codegen::detail
