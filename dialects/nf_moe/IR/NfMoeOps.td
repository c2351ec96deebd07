//===- NfMoeOps.td - mixture-of-experts execution ----------*- tablegen -*-===//
//
// `nf_moe` spells out how an MoE layer runs: router scores, a run-time expert
// selection that takes the step's expert budget as an operand, dispatch of
// (token, expert) assignments grouped by expert, grouped expert FFN halves,
// weighted combine, shared expert and latent projections.
//
//===----------------------------------------------------------------------===//

#ifndef NF_MOE_OPS_TD
#define NF_MOE_OPS_TD

include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/OpBase.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def NfMoe_Dialect : Dialect {
  let name = "nf_moe";
  let cppNamespace = "::mlir::nf_moe";
  let summary = "Mixture-of-experts execution";
  let useDefaultTypePrinterParser = 1;
}

def NfMoe_DispatchType : TypeDef<NfMoe_Dialect, "Dispatch"> {
  let mnemonic = "dispatch";
  let summary = "(token, expert) assignments grouped by expert";
  let description = [{
    The permutation of a step's assignments that groups them by expert, with
    per-expert offsets: what a grouped GEMM iterates over. At most
    tokens * maxPerToken assignments.
  }];
  let parameters = (ins "int64_t":$numExperts, "int64_t":$maxPerToken);
  let assemblyFormat = "`<` struct(params) `>`";
}

class NfMoe_Op<string mnemonic, list<Trait> traits = []>
    : Op<NfMoe_Dialect, mnemonic, traits>;

def NfMoe_RouterOp : NfMoe_Op<"router", [Pure]> {
  let summary = "Router scores: s = sigmoid(x W^T) and selection scores s + bias";
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$weight,
                       AnyRankedTensor:$correction_bias);
  let results = (outs AnyRankedTensor:$scores, AnyRankedTensor:$selection_scores);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NfMoe_SelectOp : NfMoe_Op<"select", [Pure]> {
  let summary = "Chooses each token's experts and their weights at run time";
  let description = [{
    `budget` (per token, fraction of the routed-expert FLOPs of static
    top-k; 1.0 = the model's k) is a run-time operand. Policy `topk` ignores
    it and always takes the model's `top_k`; the budget scheduler is a
    different policy on the same op. Outputs per token: up to `top_k` expert
    ids and weights (renormalised if `norm_topk_prob`, times
    `routed_scaling_factor`) and the number actually used (>= `min_k`).
  }];
  let arguments = (ins AnyRankedTensor:$scores, AnyRankedTensor:$selection_scores,
                       AnyRankedTensor:$budget, I64Attr:$top_k, I64Attr:$min_k,
                       I64Attr:$n_group, I64Attr:$topk_group,
                       BoolAttr:$norm_topk_prob, F64Attr:$routed_scaling_factor,
                       StrAttr:$policy);
  let results = (outs AnyRankedTensor:$experts, AnyRankedTensor:$weights,
                      AnyRankedTensor:$counts);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NfMoe_DispatchOp : NfMoe_Op<"dispatch", [Pure]> {
  let summary = "Groups the step's (token, expert) assignments by expert";
  let arguments = (ins AnyRankedTensor:$experts, AnyRankedTensor:$counts);
  let results = (outs NfMoe_DispatchType:$dispatch);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def NfMoe_ExpertUpOp : NfMoe_Op<"expert_up", [Pure]> {
  let summary = "Grouped GEMM: per assignment, act(W_up[e] x[token])";
  let arguments = (ins AnyRankedTensor:$input, NfMoe_DispatchType:$dispatch,
                       AnyRankedTensor:$weight,
                       DefaultValuedAttr<StrAttr, "\"relu2\"">:$activation);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NfMoe_ExpertDownOp : NfMoe_Op<"expert_down", [Pure]> {
  let summary = "Grouped GEMM: per assignment, W_down[e] h";
  let arguments = (ins AnyRankedTensor:$input, NfMoe_DispatchType:$dispatch,
                       AnyRankedTensor:$weight);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NfMoe_CombineOp : NfMoe_Op<"combine", [Pure]> {
  let summary = "Weighted sum of each token's assignment outputs (f32)";
  let arguments = (ins AnyRankedTensor:$input, NfMoe_DispatchType:$dispatch,
                       AnyRankedTensor:$weights);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def NfMoe_SharedExpertOp : NfMoe_Op<"shared_expert", [Pure]> {
  let summary = "The always-on expert: W_down act(W_up x)";
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$up,
                       AnyRankedTensor:$down,
                       DefaultValuedAttr<StrAttr, "\"relu2\"">:$activation);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NfMoe_LatentProjOp : NfMoe_Op<"latent_proj", [Pure]> {
  let summary = "Nemotron 3 Super latent projection: into (down) or out of (up) the expert space";
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$weight,
                       StrAttr:$direction);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

#endif // NF_MOE_OPS_TD
