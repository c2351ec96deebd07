//===- RowFormats.cpp - bf16 rows and copies ------------------------------===//
//
// A step's row formats (RowFormats), decided before any kernel is emitted:
// which prefill activations are stored as bf16 rows and which decode rows
// get bf16 copies beside them. The emitters of their producers and readers
// consult the result.
//
//===----------------------------------------------------------------------===//

#include "CodeGen/KernelEmitter.h"

namespace nf::codegen::detail {

namespace {

/// Value v is a weight stored as bf16.
bool isBf16Weight(const pl::Plan &plan, const std::vector<ValueInfo> &values,
                  int v) {
  if (v < 0 || v >= static_cast<int>(values.size()) ||
      values[v].kind != pl::ValueKind::Weight || !plan.weights() ||
      values[v].weight < 0 ||
      values[v].weight >= static_cast<int>(plan.weights()->size()))
    return false;
  return plan.weights()
             ->Get(static_cast<unsigned>(values[v].weight))
             ->dtype() == pl::DType::BF16;
}

} // namespace

/// With bf16 matmul inputs, the prefill activations that only tensor-core
/// GEMMs read are stored as bf16 rows by the ops that produce them (norms,
/// GEMM epilogues, activations), rounded as the GEMMs would round them: the
/// GEMMs stream them as they are, without a launch that rounds them first,
/// and half the bytes are written and read. A value qualifies when it is an
/// f32 row tensor that is not the logits, every reader takes it as the
/// input of a GEMM on the bf16 plane path (emitLinear) or of the router's
/// logits GEMM (route()), and its producer can write bf16 rows. The
/// emitters of those producers and readers consult the set. (Decode steps
/// keep f32 rows, and bf16 copies beside them for steps of many tokens,
/// decodeShadows: the narrow skinny variants reading bf16 rows gave
/// identical logits but slowed batch 1-8 by 2-3% on the H200,
/// bench/results/2026-11-30f.)
std::set<int> bf16RowValues(const pl::Plan &plan, const pl::Step &step,
                            const std::vector<ValueInfo> &values,
                            const std::string &phase,
                            const CudaCodegenOptions &opts) {
  std::set<int> out;
  if (phase == "decode" || !bf16RowsAllowed(opts))
    return out;
  auto valid = [&](int v) {
    return v >= 0 && v < static_cast<int>(values.size());
  };
  auto bf16Weight = [&](int v) { return isBf16Weight(plan, values, v); };
  // Per value: readers all GEMM inputs so far / read at all / producer ok.
  std::vector<char> gemmOnly(values.size(), 1), read(values.size(), 0),
      producible(values.size(), 0);
  for (const pl::Kernel *k : *step.kernels()) {
    if (!k->ops())
      continue;
    const unsigned n = k->ops()->size();
    for (unsigned i = 0; i < n; ++i) {
      const pl::Op &op = *k->ops()->Get(i);
      const OpCode code = opCode(op);
      auto in = operands(op);
      int gemmInput = -1; // the operand read as a GEMM's bf16 input
      // The plane path's K (its bf16 weights are checked per op below).
      if (!in.empty() && valid(in[0]) &&
          onBf16Planes(phase, true, values[in[0]].cols)) {
        if ((code == OpCode::Linear || code == OpCode::LmHead ||
             code == OpCode::LatentProj) &&
            in.size() == 2 && bf16Weight(in[1]))
          gemmInput = in[0];
        else if ((code == OpCode::ExpertUp || code == OpCode::ExpertDown) &&
                 in.size() == 3 && bf16Weight(in[2]))
          gemmInput = in[0];
        else if (code == OpCode::SharedExpert && in.size() == 3 &&
                 bf16Weight(in[1]))
          gemmInput = in[0];
        else if (code == OpCode::Router && in.size() == 3 &&
                 bf16Weight(in[1]) && i + 1 < n) {
          // Only when route() fuses the select (the router alone reads f32).
          const pl::Op &next = *k->ops()->Get(i + 1);
          auto rout = results(op), nin = operands(next);
          if (opCode(next) == OpCode::Select && rout.size() == 2 &&
              nin.size() == 3 && nin[0] == rout[0] && nin[1] == rout[1])
            gemmInput = in[0];
        }
      }
      for (size_t o = 0; o < in.size(); ++o) {
        if (!valid(in[o]))
          continue;
        read[in[o]] = 1;
        if (!(o == 0 && in[o] == gemmInput))
          gemmOnly[in[o]] = 0;
      }
      const bool canWriteBf16 =
          code == OpCode::RmsNorm || code == OpCode::GatedRmsNorm ||
          code == OpCode::Activation || code == OpCode::ExpertUp ||
          code == OpCode::Linear;
      for (int r : results(op))
        if (valid(r))
          producible[r] = canWriteBf16;
    }
  }
  for (size_t v = 0; v < values.size(); ++v) {
    const ValueInfo &vi = values[v];
    if (static_cast<int>(v) != step.logits() && read[v] && gemmOnly[v] &&
        producible[v] && vi.kind == pl::ValueKind::Tensor &&
        vi.dtype == pl::DType::F32 &&
        (vi.rows == pl::Rows::Tokens || vi.rows == pl::Rows::Assignments))
      out.insert(static_cast<int>(v));
  }
  return out;
}

/// With bf16 matmul inputs, decode rows that a skinny GEMM reads get a bf16
/// copy written beside them by their producer (norms, attention, the expert up
/// projection's epilogue), rounded as the GEMM would round them: the wide
/// skinny variants (steps of more than kNarrowTokens tokens) stream the
/// copy, the narrow ones and every other reader the f32 rows, so results
/// do not depend on the step's size. A value's copy sits at
/// `valuesEnd + offset / 2`: values live at the same time have disjoint
/// offsets, so their copies (half the bytes) are disjoint too. Returns the
/// copies and the end of their region.
void decodeShadows(const pl::Plan &plan, const pl::Step &step,
                   const std::vector<ValueInfo> &values,
                   const std::string &phase, const CudaCodegenOptions &opts,
                   RowFormats &out) {
  if (!decodeCopiesOn(phase, opts, step.max_tokens()))
    return;
  auto valid = [&](int v) {
    return v >= 0 && v < static_cast<int>(values.size());
  };
  auto bf16Weight = [&](int v) { return isBf16Weight(plan, values, v); };
  // Per value: read as a skinny GEMM's input / producer writes copies.
  std::vector<char> gemmRead(values.size(), 0), producible(values.size(), 0);
  for (const pl::Kernel *k : *step.kernels()) {
    if (!k->ops())
      continue;
    for (const pl::Op *op : *k->ops()) {
      const OpCode code = opCode(*op);
      auto in = operands(*op);
      int weight = -1;
      if ((code == OpCode::Linear || code == OpCode::LmHead ||
           code == OpCode::LatentProj) &&
          in.size() == 2)
        weight = in[1];
      else if ((code == OpCode::ExpertUp || code == OpCode::ExpertDown) &&
               in.size() == 3)
        weight = in[2];
      else if (code == OpCode::SharedExpert && in.size() == 3)
        weight = in[1];
      if (weight >= 0 && valid(in[0]) && bf16Weight(weight) &&
          values[in[0]].cols % 32 == 0)
        gemmRead[in[0]] = 1;
      // Emitters that store these results through outPtr / storeAct.
      const bool writesCopy =
          code == OpCode::RmsNorm || code == OpCode::GatedRmsNorm ||
          code == OpCode::Activation || code == OpCode::ExpertUp ||
          code == OpCode::KvAttend;
      for (int r : results(*op))
        if (valid(r))
          producible[r] = writesCopy;
    }
  }
  const int64_t valuesEnd = alignTo(step.arena_bytes() + step.scratch_bytes());
  int64_t end = valuesEnd;
  for (size_t v = 0; v < values.size(); ++v) {
    const ValueInfo &vi = values[v];
    if (static_cast<int>(v) == step.logits() || !gemmRead[v] ||
        !producible[v] || vi.kind != pl::ValueKind::Tensor ||
        vi.dtype != pl::DType::F32 || vi.offset < 0 || vi.offset % 32 != 0 ||
        (vi.rows != pl::Rows::Tokens && vi.rows != pl::Rows::Assignments))
      continue;
    const int64_t at = valuesEnd + vi.offset / 2;
    out.shadow[static_cast<int>(v)] = at;
    end = std::max(end, at + (vi.bytes + 1) / 2);
  }
  if (!out.shadow.empty())
    out.shadowEnd = alignTo(end);
}

} // namespace nf::codegen::detail
