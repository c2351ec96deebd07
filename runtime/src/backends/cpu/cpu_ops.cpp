// The CPU backend's op execution (CpuEngine::execOp): the switch over a
// decoded op, with the dense/row ops (embed, norms, add, linear, split,
// activation, shared expert), the Mamba (causal conv, SSM scan) and
// attention (KV append / attend) kernel calls, and nf.lm_head (opLmHead).
// The MoE ops are in cpu_ops_moe.cpp.
#include "backends/cpu/cpu_engine_impl.h"

#include "backends/cpu/kernels.h"

#include <cstring>
#include <utility>

namespace nf::engine::cpu_detail {

void CpuEngine::execOp(Program &p, const OpInfo &o) {
  const int64_t T = run_.T;
  auto cols = [&](int32_t v) { return p.values[v].cols; };
  switch (o.code) {
  case OpCode::Embed: {
    const ValueInfo &tv = p.values[o.in[0]];
    std::span<const int32_t> toks =
        tv.kind == pl::ValueKind::Tokens
            ? std::span<const int32_t>(run_.tokens)
            : std::span<const int32_t>(i32(p, o.in[0]), static_cast<size_t>(T));
    cpu::embedding(weight(p, o.in[1]).view, toks, f32(p, o.out[0]));
    return;
  }
  case OpCode::RmsNorm:
    cpu::rmsNorm(f32(p, o.in[0]), T, cols(o.in[0]), weight(p, o.in[1]).view,
                 o.eps, f32(p, o.out[0]));
    return;
  case OpCode::Add: {
    const int64_t n = T * cols(o.out[0]);
    float *out = f32(p, o.out[0]);
    const float *a = f32(p, o.in[0]), *b = f32(p, o.in[1]);
    if (out == b)
      std::swap(a, b); // a + b == b + a exactly
    if (out != a)
      std::memcpy(out, a, static_cast<size_t>(n) * sizeof(float));
    cpu::addInPlace(out, b, n);
    return;
  }
  case OpCode::Linear:
  case OpCode::LatentProj:
    linearOf(f32(p, o.in[0]), T, cols(o.in[0]), weight(p, o.in[1]),
             f32(p, o.out[0]), cols(o.out[0]));
    return;
  case OpCode::LmHead:
    opLmHead(p, o);
    return;
  case OpCode::Split: {
    const float *x = f32(p, o.in[0]);
    const int64_t ld = cols(o.in[0]);
    int64_t c0 = 0;
    for (size_t i = 0; i < o.out.size(); ++i) {
      float *y = f32(p, o.out[i]);
      const int64_t w = o.sizes[i];
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(y + t * w, x + t * ld + c0,
                    static_cast<size_t>(w) * sizeof(float));
      c0 += w;
    }
    return;
  }
  case OpCode::Activation: {
    const int64_t n = T * cols(o.out[0]);
    float *out = f32(p, o.out[0]);
    const float *in = f32(p, o.in[0]);
    if (out != in)
      std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    activate(o.act, out, n);
    return;
  }
  case OpCode::GatedRmsNorm: {
    const int64_t I = cols(o.in[0]);
    cpu::gatedRmsNorm(f32(p, o.in[0]), I, f32(p, o.in[1]), I, T, I, o.groups,
                      weight(p, o.in[2]).view, o.eps, f32(p, o.out[0]));
    return;
  }
  case OpCode::CausalConv: {
    const MambaShape &s = storage_[o.storage].mamba;
    std::vector<float *> conv;
    for (const SeqSpan &sp : run_.spans)
      conv.push_back(caches_.state().conv(o.ordinal, sp.slot));
    const int64_t CD = s.convDim();
    cpu::causalConvSilu(f32(p, o.in[1]), CD, run_.spans, conv, s,
                        weight(p, o.in[2]).view,
                        o.hasBias ? weight(p, o.in[3]).view : WeightView{},
                        f32(p, o.out[0]), CD);
    return;
  }
  case OpCode::SsmScan:
  case OpCode::SsmUpdate: {
    const MambaShape &s = storage_[o.storage].mamba;
    const int64_t nh = s.numHeads;
    float *dt = scratchF(0, static_cast<size_t>(T * nh));
    cpu::mambaDt(f32(p, o.in[2]), nh, T, nh, weight(p, o.in[3]).view, o.dtMin,
                 o.dtMax, dt);
    std::vector<float *> ssm;
    for (const SeqSpan &sp : run_.spans)
      ssm.push_back(caches_.state().ssm(o.ordinal, sp.slot));
    cpu::ssmScan(f32(p, o.in[1]), s.convDim(), dt, run_.spans, ssm, s,
                 weight(p, o.in[4]).view, weight(p, o.in[5]).view,
                 f32(p, o.out[0]), s.inner());
    return;
  }
  case OpCode::KvAppend: {
    const int64_t row = cols(o.in[1]);
    cpu::kvAppend(f32(p, o.in[1]), row, f32(p, o.in[2]), row, run_.spans,
                  run_.pageTables, caches_.kv().layer(o.ordinal));
    return;
  }
  case OpCode::KvAttend: {
    const int64_t qd = cols(o.in[1]);
    cpu::pagedAttention(f32(p, o.in[1]), qd, o.numHeads, run_.spans,
                        run_.pageTables, caches_.kv().layer(o.ordinal),
                        f32(p, o.out[0]), qd, o.scale);
    return;
  }
  case OpCode::Router:
    opRouter(p, o);
    return;
  case OpCode::Select:
    opSelect(p, o);
    return;
  case OpCode::Dispatch:
    opDispatch(p, o);
    return;
  case OpCode::ExpertUp:
    opExperts(p, o, true);
    return;
  case OpCode::ExpertDown:
    opExperts(p, o, false);
    return;
  case OpCode::Combine:
    opCombine(p, o);
    return;
  case OpCode::SharedExpert: {
    const BoundWeight &up = weight(p, o.in[1]), &down = weight(p, o.in[2]);
    if (o.act == Act::Relu2 && !up.quantised && !down.quantised) {
      cpu::mlpRelu2(f32(p, o.in[0]), T, up.view, down.view, f32(p, o.out[0]));
      return;
    }
    const int64_t I = up.view.rows();
    float *hidden = scratchF(0, static_cast<size_t>(T * I));
    linearOf(f32(p, o.in[0]), T, up.view.cols(), up, hidden, I);
    activate(o.act, hidden, T * I);
    linearOf(hidden, T, I, down, f32(p, o.out[0]), down.view.rows());
    return;
  }
  case OpCode::Unknown: // the plan check rejects it (cpu_engine_check.cpp)
    return;
  }
}

void CpuEngine::linearOf(const float *x, int64_t T, int64_t ldx,
                         const BoundWeight &w, float *y, int64_t ldy) {
  using pl::ActivationQuant;
  if (w.input.kind == ActivationQuant::None) {
    cpu::linear(x, T, ldx, w.view, y, ldy);
    return;
  }
  const int64_t K = w.view.cols();
  float *xq = scratchF(3, static_cast<size_t>(T * K));
  if (w.input.kind == ActivationQuant::DynamicPerToken) {
    cpu::fakeQuantE4M3(x, T, K, ldx, 0.0f, xq);
    cpu::linear(xq, T, K, w.view, y, ldy);
    return;
  }
  // Static per tensor: each part (fused QKV's q, k, v) its own input scale.
  const std::vector<int64_t> rows = w.input.partRows.empty()
                                        ? std::vector<int64_t>{w.view.rows()}
                                        : w.input.partRows;
  int64_t row0 = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    cpu::fakeQuantE4M3(x, T, K, ldx, w.input.scales[i], xq);
    cpu::linear(xq, T, K, w.view.slice(row0, rows[i]), y + row0, ldy);
    row0 += rows[i];
  }
}

void CpuEngine::opLmHead(const Program &p, const OpInfo &o) {
  const WeightView &W = weight(p, o.in[1]).view;
  const int64_t H = p.values[o.in[0]].cols, V = W.rows();
  const float *x = f32(p, o.in[0]);
  if (o.out[0] != p.logits) {
    cpu::linear(x, run_.T, H, W, f32(p, o.out[0]), V);
    return;
  }
  // The step's logits: only the rows the caller asked for, straight into
  // the caller's buffer when its rows are consecutive.
  const std::vector<int64_t> &need = run_.needRows, &outRows = run_.outRows;
  const int64_t n = static_cast<int64_t>(need.size());
  run_.logitsDone = true;
  if (n == 0)
    return;
  bool identity = n == run_.T, consecutive = true;
  for (int64_t i = 0; i < n; ++i) {
    identity &= need[i] == i;
    consecutive &= outRows[i] == outRows[0] + i;
  }
  const float *xs = x;
  if (!identity) {
    float *g = scratchF(0, static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(g + i * H, x + need[i] * H,
                  static_cast<size_t>(H) * sizeof(float));
    xs = g;
  }
  if (consecutive) {
    cpu::linear(xs, n, H, W, run_.logitsOut + outRows[0] * V, V);
    return;
  }
  float *y = scratchF(1, static_cast<size_t>(n * V));
  cpu::linear(xs, n, H, W, y, V);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(run_.logitsOut + outRows[i] * V, y + i * V,
                static_cast<size_t>(V) * sizeof(float));
}

} // namespace nf::engine::cpu_detail
