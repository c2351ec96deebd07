// The CPU backend's load-time op checks (CpuEngine::checkOp): the operand
// kinds, shapes and attributes of every op, checked once against the plan's
// values, weights and storage, and the parsed attributes stored in OpInfo.
#include "backends/cpu/cpu_engine_impl.h"

#include "engine/plan_common.h"

#include "backends/cpu/kernels.h"

#include <optional>
#include <string>
#include <vector>

namespace nf::engine::cpu_detail {

/// Operand kinds, shapes and attributes of one op.
Status CpuEngine::checkOp(const Program &prog, OpInfo &o, const pl::Op &op) {
  auto fail = [&](const std::string &m) {
    return Status::error(o.where + ": " + m);
  };
  auto arity = [&](size_t minIn, size_t maxIn, size_t nOut) {
    return o.in.size() >= minIn && o.in.size() <= maxIn && o.out.size() == nOut;
  };
  auto V = [&](int32_t v) -> const ValueInfo & { return prog.values[v]; };
  auto isRows = [&](int32_t v, pl::Rows rows, pl::DType dt) {
    return V(v).kind == pl::ValueKind::Tensor && V(v).rows == rows &&
           V(v).dtype == dt;
  };
  auto isAct = [&](int32_t v) {
    return isRows(v, pl::Rows::Tokens, pl::DType::F32);
  };
  auto W = [&](int32_t v) -> const BoundWeight * {
    return V(v).kind == pl::ValueKind::Weight ? &weights_->weights[V(v).weight]
                                              : nullptr;
  };
  auto numel = [](const BoundWeight *w) {
    int64_t n = 1;
    for (int64_t d : w->shape)
      n *= d;
    return n;
  };
  auto matrix = [&](int32_t v) -> const BoundWeight * {
    const BoundWeight *w = W(v);
    return w && w->view.valid() && w->shape.size() == 2 ? w : nullptr;
  };
  auto vector = [&](int32_t v, int64_t n) {
    const BoundWeight *w = W(v);
    return w && w->view.valid() && numel(w) == n;
  };
  auto stacked = [&](int32_t v) -> const BoundWeight * {
    const BoundWeight *w = W(v);
    return w && w->shape.size() == 3 &&
                   static_cast<int64_t>(w->experts.size()) == w->shape[0]
               ? w
               : nullptr;
  };
  auto needF = [&](std::string_view n, double &out) -> Status {
    std::optional<double> v = floatAttr(op, n);
    if (!v)
      return fail("missing attribute '" + std::string(n) + "'");
    out = *v;
    return Status::success();
  };
  auto needI = [&](std::string_view n, int64_t &out) -> Status {
    std::optional<int64_t> v = intAttr(op, n);
    if (!v)
      return fail("missing attribute '" + std::string(n) + "'");
    out = *v;
    return Status::success();
  };
  auto activation = [&](std::string_view key, bool required) -> Status {
    std::optional<std::string> k = stringAttr(op, key);
    if (!k && !required) {
      o.act = Act::Relu2; // the dialect's default
      return Status::success();
    }
    if (!k)
      return fail("missing attribute '" + std::string(key) + "'");
    if (*k == "relu2")
      o.act = Act::Relu2;
    else if (*k == "silu")
      o.act = Act::Silu;
    else
      return fail("unsupported activation '" + *k + "'");
    return Status::success();
  };
  auto mambaStorage = [&]() -> const StorageInfo * {
    return o.storage >= 0 &&
                   storage_[o.storage].kind == pl::StorageKind::MambaState
               ? &storage_[o.storage]
               : nullptr;
  };
  auto kvStorage = [&]() -> const StorageInfo * {
    return o.storage >= 0 &&
                   storage_[o.storage].kind == pl::StorageKind::KVCache
               ? &storage_[o.storage]
               : nullptr;
  };
  auto isBatch = [&](int32_t v) { return V(v).kind == pl::ValueKind::Batch; };
  auto dims = [&](int32_t v) { return shapeString(V(v).shape); };

  switch (o.code) {
  case OpCode::Embed: {
    if (!arity(2, 2, 1))
      return fail("expects (tokens, table) -> 1 result");
    const ValueInfo &t = V(o.in[0]);
    const bool tokens =
        t.kind == pl::ValueKind::Tokens ||
        (isRows(o.in[0], pl::Rows::Tokens, pl::DType::I32) && t.cols == 1);
    const BoundWeight *w = matrix(o.in[1]);
    if (!tokens || !w)
      return fail("expects token ids and a [vocab, hidden] table");
    if (w->shape[0] < info_.vocabSize)
      return fail("table has " + std::to_string(w->shape[0]) +
                  " rows for a vocabulary of " +
                  std::to_string(info_.vocabSize));
    if (!isAct(o.out[0]) || V(o.out[0]).cols != w->shape[1])
      return fail("result " + dims(o.out[0]) + " does not match the table " +
                  shapeString(w->shape));
    return Status::success();
  }
  case OpCode::RmsNorm: {
    if (!arity(2, 2, 1) || !isAct(o.in[0]) || !isAct(o.out[0]))
      return fail("expects (input, weight) -> result, f32 rows");
    const int64_t H = V(o.in[0]).cols;
    if (!vector(o.in[1], H) || V(o.out[0]).cols != H)
      return fail("weight or result does not have " + std::to_string(H) +
                  " features");
    return needF(attr::Epsilon, o.eps);
  }
  case OpCode::Add:
    if (!arity(2, 2, 1) || !isAct(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.out[0]))
      return fail("expects two f32 row tensors");
    if (V(o.in[0]).cols != V(o.in[1]).cols ||
        V(o.out[0]).cols != V(o.in[0]).cols)
      return fail("operands " + dims(o.in[0]) + " and " + dims(o.in[1]) +
                  " differ");
    return Status::success();
  case OpCode::Linear:
  case OpCode::LmHead:
  case OpCode::LatentProj: {
    if (!arity(2, 2, 1) || !isAct(o.in[0]) || !isAct(o.out[0]))
      return fail("expects (input, weight) -> result, f32 rows");
    const BoundWeight *w = matrix(o.in[1]);
    if (!w || w->shape[1] != V(o.in[0]).cols || w->shape[0] != V(o.out[0]).cols)
      return fail("input " + dims(o.in[0]) + ", weight " +
                  (W(o.in[1]) ? shapeString(W(o.in[1])->shape)
                              : std::string("(not a weight)")) +
                  " and result " + dims(o.out[0]) + " do not match");
    if (o.code == OpCode::LatentProj && !stringAttr(op, attr::Direction))
      return fail("missing attribute 'direction'");
    return Status::success();
  }
  case OpCode::Split: {
    std::optional<std::vector<int64_t>> sizes = listAttr(op, attr::Sizes);
    if (!sizes)
      return fail("missing attribute 'sizes'");
    o.sizes = *sizes;
    if (o.in.size() != 1 || o.out.size() != o.sizes.size() || !isAct(o.in[0]))
      return fail("expects one input and one result per size");
    int64_t sum = 0;
    for (size_t i = 0; i < o.sizes.size(); ++i) {
      if (!isAct(o.out[i]) || V(o.out[i]).cols != o.sizes[i])
        return fail("result " + std::to_string(i) + " " + dims(o.out[i]) +
                    " does not have " + std::to_string(o.sizes[i]) +
                    " columns");
      sum += o.sizes[i];
    }
    if (sum != V(o.in[0]).cols)
      return fail("sizes sum to " + std::to_string(sum) + ", input is " +
                  dims(o.in[0]));
    return Status::success();
  }
  case OpCode::Activation:
    if (!arity(1, 1, 1) || !isAct(o.in[0]) || !isAct(o.out[0]) ||
        V(o.in[0]).cols != V(o.out[0]).cols)
      return fail("expects one f32 row tensor and a result of its shape");
    return activation(attr::Kind, true);
  case OpCode::GatedRmsNorm: {
    if (!arity(3, 3, 1) || !isAct(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.out[0]))
      return fail("expects (y, z, weight) -> result, f32 rows");
    const int64_t I = V(o.in[0]).cols;
    if (V(o.in[1]).cols != I || V(o.out[0]).cols != I || !vector(o.in[2], I))
      return fail("y, z, weight and result must all have " + std::to_string(I) +
                  " features");
    if (Status s = needI(attr::Groups, o.groups); !s)
      return s;
    if (o.groups <= 0 || I % o.groups != 0)
      return fail(std::to_string(I) + " features in " +
                  std::to_string(o.groups) + " groups");
    return needF(attr::Epsilon, o.eps);
  }
  case OpCode::CausalConv: {
    const StorageInfo *st = mambaStorage();
    if (!st)
      return fail("needs a MambaState storage");
    if (!arity(3, 4, 1) || !isBatch(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.out[0]))
      return fail("expects (batch, input, weight[, bias]) -> result");
    const MambaShape &s = st->mamba;
    const int64_t CD = s.convDim();
    const BoundWeight *w = W(o.in[2]);
    const bool wOk = w && w->view.valid() &&
                     (w->shape == std::vector<int64_t>{CD, 1, s.convKernel} ||
                      w->shape == std::vector<int64_t>{CD, s.convKernel});
    if (V(o.in[1]).cols != CD || V(o.out[0]).cols != CD || !wOk)
      return fail("input " + dims(o.in[1]) + " / weight " +
                  (w ? shapeString(w->shape) : std::string("?")) +
                  " do not match the state (conv_dim " + std::to_string(CD) +
                  ", window " + std::to_string(s.convKernel - 1) + ")");
    o.hasBias = o.in.size() == 4;
    if (o.hasBias && !vector(o.in[3], CD))
      return fail("bias must have " + std::to_string(CD) + " elements");
    std::optional<std::string> mode = stringAttr(op, attr::Mode);
    if (mode && *mode != "prefill" && *mode != "decode")
      return fail("unknown mode '" + *mode + "'");
    return Status::success();
  }
  case OpCode::SsmScan:
  case OpCode::SsmUpdate: {
    const StorageInfo *st = mambaStorage();
    if (!st)
      return fail("needs a MambaState storage");
    if (!arity(6, 6, 1) || !isBatch(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.in[2]) || !isAct(o.out[0]))
      return fail("expects (batch, xbc, dt, dt_bias, A_log, D) -> y");
    const MambaShape &s = st->mamba;
    const int64_t nh = s.numHeads;
    if (V(o.in[1]).cols != s.convDim() || V(o.in[2]).cols != nh ||
        V(o.out[0]).cols != s.inner() || !vector(o.in[3], nh) ||
        !vector(o.in[4], nh) || !vector(o.in[5], nh))
      return fail("operands do not match the state (heads " +
                  std::to_string(nh) + ", head_dim " +
                  std::to_string(s.headDim) + ", state " +
                  std::to_string(s.stateSize) + ")");
    int64_t g = 0;
    if (Status e = needI(attr::NGroups, g); !e)
      return e;
    if (g != s.nGroups)
      return fail("n_groups " + std::to_string(g) + " but the state implies " +
                  std::to_string(s.nGroups));
    double lo = 0, hi = 0;
    if (Status e = needF(attr::TimeStepMin, lo); !e)
      return e;
    if (Status e = needF(attr::TimeStepMax, hi); !e)
      return e;
    if (!(lo <= hi))
      return fail("time_step_min > time_step_max");
    o.dtMin = static_cast<float>(lo);
    o.dtMax = static_cast<float>(hi);
    return Status::success();
  }
  case OpCode::KvAppend: {
    const StorageInfo *st = kvStorage();
    if (!st)
      return fail("needs a KVCache storage");
    if (!arity(3, 3, 0) || !isBatch(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.in[2]))
      return fail("expects (batch, key, value)");
    const int64_t row = st->kv.numKvHeads * st->kv.headDim;
    if (V(o.in[1]).cols != row || V(o.in[2]).cols != row)
      return fail("key " + dims(o.in[1]) + " / value " + dims(o.in[2]) +
                  " do not have the cache's " + std::to_string(row) +
                  " features");
    return Status::success();
  }
  case OpCode::KvAttend: {
    const StorageInfo *st = kvStorage();
    if (!st)
      return fail("needs a KVCache storage");
    if (!arity(2, 2, 1) || !isBatch(o.in[0]) || !isAct(o.in[1]) ||
        !isAct(o.out[0]))
      return fail("expects (batch, query) -> result");
    if (Status e = needI(attr::NumHeads, o.numHeads); !e)
      return e;
    double scale = 0;
    if (Status e = needF(attr::Scale, scale); !e)
      return e;
    o.scale = static_cast<float>(scale);
    const int64_t hd = st->kv.headDim, nkv = st->kv.numKvHeads;
    if (o.numHeads <= 0 || o.numHeads % nkv != 0)
      return fail(std::to_string(o.numHeads) + " query heads for " +
                  std::to_string(nkv) + " kv heads");
    if (V(o.in[1]).cols != o.numHeads * hd ||
        V(o.out[0]).cols != o.numHeads * hd)
      return fail("query " + dims(o.in[1]) + " is not heads x head_dim " +
                  std::to_string(hd));
    return Status::success();
  }
  case OpCode::Router: {
    if (!arity(3, 3, 2) || !isAct(o.in[0]) || !isAct(o.out[0]) ||
        !isAct(o.out[1]))
      return fail("expects (input, weight, correction_bias) -> (scores, "
                  "selection_scores)");
    const BoundWeight *w = matrix(o.in[1]);
    if (!w || w->shape[1] != V(o.in[0]).cols)
      return fail("gate weight does not match the input " + dims(o.in[0]));
    const int64_t E = w->shape[0];
    if (!vector(o.in[2], E) || V(o.out[0]).cols != E || V(o.out[1]).cols != E)
      return fail("bias and scores must have " + std::to_string(E) +
                  " experts");
    return Status::success();
  }
  case OpCode::Select: {
    if (!arity(3, 3, 3) || !isAct(o.in[0]) || !isAct(o.in[1]))
      return fail("expects (scores, selection_scores, budget) -> (experts, "
                  "weights, counts)");
    const ValueInfo &b = V(o.in[2]);
    if (b.kind != pl::ValueKind::Budget && !(isAct(o.in[2]) && b.cols == 1))
      return fail("budget must be the step's per-token budget");
    const int64_t E = V(o.in[0]).cols;
    if (V(o.in[1]).cols != E)
      return fail("scores and selection scores differ");
    int64_t norm = 1;
    double rsf = 1.0;
    if (Status s = needI(attr::TopK, o.topK); !s)
      return s;
    if (Status s = needI(attr::NGroup, o.nGroup); !s)
      return s;
    if (Status s = needI(attr::TopkGroup, o.topkGroup); !s)
      return s;
    if (Status s = needI(attr::NormTopkProb, norm); !s)
      return s;
    if (Status s = needF(attr::RoutedScalingFactor, rsf); !s)
      return s;
    o.minK = intAttr(op, attr::MinK).value_or(o.topK);
    o.normTopkProb = norm != 0;
    o.routedScalingFactor = static_cast<float>(rsf);
    std::optional<std::string> policy = stringAttr(op, attr::Policy);
    if (policy && *policy != "topk" && *policy != "budget")
      return fail("unknown policy '" + *policy + "'");
    o.budgetPolicy = policy && *policy == "budget";
    if (o.nGroup <= 0 || E % o.nGroup != 0 || o.topkGroup <= 0 ||
        o.topkGroup > o.nGroup)
      return fail("bad expert groups (experts " + std::to_string(E) +
                  ", n_group " + std::to_string(o.nGroup) + ", topk_group " +
                  std::to_string(o.topkGroup) + ")");
    cpu::RouterConfig rc;
    rc.numExperts = E;
    rc.nGroup = o.nGroup;
    rc.topkGroup = o.topkGroup;
    if (o.topK <= 0 || o.topK > cpu::maxExpertsPerToken(rc))
      return fail("top_k " + std::to_string(o.topK) + " exceeds the " +
                  std::to_string(cpu::maxExpertsPerToken(rc)) +
                  " selectable experts");
    if (!isRows(o.out[0], pl::Rows::Tokens, pl::DType::I32) ||
        V(o.out[0]).cols != o.topK ||
        !isRows(o.out[1], pl::Rows::Tokens, pl::DType::F32) ||
        V(o.out[1]).cols != o.topK ||
        !isRows(o.out[2], pl::Rows::Tokens, pl::DType::I32) ||
        V(o.out[2]).cols != 1)
      return fail("results must be i32 [T, top_k], f32 [T, top_k], i32 [T]");
    return Status::success();
  }
  case OpCode::Dispatch: {
    if (!arity(2, 2, 1) || !isRows(o.in[0], pl::Rows::Tokens, pl::DType::I32) ||
        !isRows(o.in[1], pl::Rows::Tokens, pl::DType::I32) ||
        V(o.in[1]).cols != 1 || V(o.out[0]).kind != pl::ValueKind::Dispatch)
      return fail("expects (experts i32 [T, k], counts i32 [T]) -> dispatch");
    if (V(o.in[0]).cols > V(o.out[0]).maxPerToken)
      return fail(std::to_string(V(o.in[0]).cols) +
                  " experts per token exceed the dispatch's " +
                  std::to_string(V(o.out[0]).maxPerToken));
    return Status::success();
  }
  case OpCode::ExpertUp:
  case OpCode::ExpertDown: {
    const bool up = o.code == OpCode::ExpertUp;
    if (!arity(3, 3, 1) || V(o.in[1]).kind != pl::ValueKind::Dispatch ||
        !isRows(o.out[0], pl::Rows::Assignments, pl::DType::F32))
      return fail("expects (input, dispatch, weight) -> assignment rows");
    const ValueInfo &d = V(o.in[1]);
    const pl::Rows inRows = up ? pl::Rows::Tokens : pl::Rows::Assignments;
    if (!isRows(o.in[0], inRows, pl::DType::F32))
      return fail(std::string("input must be f32 ") +
                  (up ? "token" : "assignment") + " rows");
    const BoundWeight *w = stacked(o.in[2]);
    if (!w || w->shape[0] != d.numExperts || w->shape[2] != V(o.in[0]).cols ||
        w->shape[1] != V(o.out[0]).cols)
      return fail("weight " +
                  (W(o.in[2]) ? shapeString(W(o.in[2])->shape)
                              : std::string("(not a weight)")) +
                  " is not [" + std::to_string(d.numExperts) + ", " +
                  std::to_string(V(o.out[0]).cols) + ", " +
                  std::to_string(V(o.in[0]).cols) + "] stacked experts");
    const int64_t need = prog.maxTokens * d.maxPerToken * V(o.out[0]).cols * 4;
    if (V(o.out[0]).bytes < need)
      return fail("result has " + std::to_string(V(o.out[0]).bytes) +
                  " bytes, needs " + std::to_string(need));
    if (!up &&
        V(o.in[0]).bytes < prog.maxTokens * d.maxPerToken * V(o.in[0]).cols * 4)
      return fail("input has too few bytes for the dispatch");
    if (up)
      return activation(attr::Activation, false);
    return Status::success();
  }
  case OpCode::Combine: {
    if (!arity(3, 3, 1) || V(o.in[1]).kind != pl::ValueKind::Dispatch ||
        !isRows(o.in[0], pl::Rows::Assignments, pl::DType::F32) ||
        !isRows(o.in[2], pl::Rows::Tokens, pl::DType::F32) || !isAct(o.out[0]))
      return fail("expects (assignment rows, dispatch, weights) -> rows");
    if (V(o.in[0]).cols != V(o.out[0]).cols ||
        V(o.in[2]).cols > V(o.in[1]).maxPerToken)
      return fail("shapes do not match");
    return Status::success();
  }
  case OpCode::SharedExpert: {
    if (!arity(3, 3, 1) || !isAct(o.in[0]) || !isAct(o.out[0]))
      return fail("expects (input, up, down) -> result");
    const BoundWeight *up = matrix(o.in[1]), *down = matrix(o.in[2]);
    const int64_t H = V(o.in[0]).cols;
    if (!up || !down || up->shape[1] != H || down->shape[1] != up->shape[0] ||
        down->shape[0] != V(o.out[0]).cols)
      return fail("weights do not match the input " + dims(o.in[0]));
    return activation(attr::Activation, false);
  }
  case OpCode::Unknown:
    break;
  }
  return fail("unhandled op");
}

} // namespace nf::engine::cpu_detail
