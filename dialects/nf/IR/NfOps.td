//===- NfOps.td - nf dialect operations --------------------*- tablegen -*-===//
//
// Activations are ranked tensors [tokens, features] with a dynamic token
// dimension; weights are static-shaped tensors of f32, bf16 or f16 produced by
// `nf.weight` (quantised matrices: fp8 E4M3 or int4 codes, see
// `#nf.quant`). Every op verifies the shapes of its weights against its
// hyperparameters and reports the first inconsistency at the op.
//
//===----------------------------------------------------------------------===//

#ifndef NF_OPS_TD
#define NF_OPS_TD

include "NfDialect.td"
include "NfAttrs.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===----------------------------------------------------------------------===//
// Structure
//===----------------------------------------------------------------------===//

def Nf_ModelOp : Nf_Op<"model", [IsolatedFromAbove, Symbol, SingleBlock]> {
  let summary = "A decoder model: token ids in, logits out";
  let description = [{
    The body has one block whose only argument is the token ids of a sequence
    (`tensor<?xi32>`) and which ends in `nf.output` with the logits
    (`tensor<?x{vocab_size}xf32>`). `weight_files` lists the safetensors files
    the weights come from, relative to `checkpoint`.

    ```mlir
    nf.model @tiny attributes {vocab_size = 512 : i64, hidden_size = 64 : i64, ...} {
    ^bb0(%tokens: tensor<?xi32>):
      %emb = nf.weight ["backbone.embeddings.weight"] : tensor<512x64xf32>
      ...
      nf.output %logits : tensor<?x512xf32>
    }
    ```
  }];
  let arguments = (ins
    SymbolNameAttr:$sym_name,
    I64Attr:$vocab_size,
    I64Attr:$hidden_size,
    DefaultValuedAttr<I64Attr, "-1">:$bos_token_id,
    DefaultValuedAttr<DenseI64ArrayAttr, "{}">:$eos_token_ids,
    DefaultValuedAttr<I64Attr, "-1">:$pad_token_id,
    DefaultValuedAttr<StrAttr, "\"\"">:$checkpoint,
    DefaultValuedAttr<StrArrayAttr, "{}">:$weight_files
  );
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::Value getTokens() { return getBody().front().getArgument(0); }
  }];
}

def Nf_OutputOp : Nf_Op<"output", [Terminator, HasParent<"ModelOp">, Pure]> {
  let summary = "Returns the logits of the model";
  let arguments = (ins AnyRankedTensor:$logits);
  let assemblyFormat = "$logits attr-dict `:` type($logits)";
}

def Nf_WeightOp : Nf_Op<"weight", [Pure]> {
  let summary = "A typed reference to checkpoint tensors";
  let description = [{
    Names the checkpoint tensor(s) that hold a weight; the IR never holds
    weight data. The result type gives the dtype and the logical shape. A
    `stacked` weight (routed experts) either lists one tensor per expert, in
    expert order, stacked along a new leading dimension, or one tensor that
    already has the stacked shape.

    ```mlir
    %w = nf.weight ["backbone.layers.0.mixer.in_proj.weight"] : tensor<648x256xbf16>
    %up = nf.weight stacked ["...experts.0.up_proj.weight", "...experts.1.up_proj.weight"]
        : tensor<2x128x256xbf16>
    ```

    Layout decisions of the compiler are recorded here too: `concat_rows`
    says that the listed tensors are concatenated along dimension 0, with
    these row counts (fused QKV projections); the runtime packs them at load
    time.

    **Quantised weights.** With `quant` (a `#nf.quant`), the tensors hold
    quantised codes and the attribute names the scale tensors that turn them
    into values. The result type keeps the weight's logical shape [out, in]
    (stacked: [experts, out, in]); its element type is then the type of one
    code, not of a value: `f8E4M3FN` for fp8_e4m3, `i4` for int4 (stored
    packed, 8 codes per `i32` word, as `quant` says). The value of an
    element is its code times its scale, as `#nf.quant` defines; consumers
    compute in f32 as for any weight. Only linear projections may be
    quantised, and a quantised weight is a matrix (or a stack of matrices
    with one tensor per expert). Each part (tensor) of a stacked or
    concatenated weight keeps its own scales.

    ```mlir
    %w = nf.weight ["l0.in_proj.weight"] quant <scheme = fp8_e4m3,
        storage = f8E4M3FN, granularity = per_channel, symmetric = true,
        scales = ["l0.in_proj.weight_scale"], scale_types = [tensor<126x1xf32>],
        activations = dynamic_per_token> : tensor<126x48xf8E4M3FN>
    ```
  }];
  let arguments = (ins StrArrayAttr:$tensors, UnitAttr:$stacked,
                       OptionalAttr<DenseI64ArrayAttr>:$concat_rows,
                       OptionalAttr<Nf_QuantAttr>:$quant);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = [{
    (`stacked` $stacked^)? $tensors (`quant` $quant^)? attr-dict `:`
    type($result)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The checkpoint tensors the weight is made of: one per expert of a
    /// stacked weight that lists them, one per concatenated part, else 1.
    size_t getNumParts() { return getTensors().size(); }
  }];
}

//===----------------------------------------------------------------------===//
// Blocks
//===----------------------------------------------------------------------===//

def Nf_EmbedOp : Nf_Op<"embed", [Pure]> {
  let summary = "Token embedding lookup";
  let arguments = (ins AnyRankedTensor:$tokens, AnyRankedTensor:$table);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Nf_RMSNormOp : Nf_Op<"rms_norm", [Pure]> {
  let summary = "RMSNorm: w * x * rsqrt(mean(x^2) + eps), normalised in f32";
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$weight,
                       F64Attr:$epsilon);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Nf_AddOp : Nf_Op<"add", [Pure, SameOperandsAndResultType]> {
  let summary = "Residual add";
  let arguments = (ins AnyRankedTensor:$lhs, AnyRankedTensor:$rhs);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Nf_Mamba2Op : Nf_Op<"mamba2", [Pure]> {
  let summary = "Mamba2 mixer: in_proj, causal conv, selective scan, gated norm, out_proj";
  let description = [{
    Operands: input [T, H]; in_proj [2I + 2GN + nh, H]; conv_weight [I + 2GN, 1, K];
    dt_bias, A_log, D [nh]; norm_weight [I]; out_proj [H, I]; and, when the
    model uses a conv bias, conv_bias [I + 2GN] last. I = num_heads * head_dim,
    G = n_groups, N = state_size. `dt` is clamped to
    [time_step_min, time_step_max] (no clamp: 0 and +inf).
  }];
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$in_proj,
      AnyRankedTensor:$conv_weight, AnyRankedTensor:$dt_bias,
      AnyRankedTensor:$a_log, AnyRankedTensor:$d,
      AnyRankedTensor:$norm_weight, AnyRankedTensor:$out_proj,
      Optional<AnyRankedTensor>:$conv_bias,
      I64Attr:$num_heads, I64Attr:$head_dim, I64Attr:$state_size,
      I64Attr:$n_groups, I64Attr:$conv_kernel, I64Attr:$chunk_size,
      F64Attr:$epsilon, F64Attr:$time_step_min, F64Attr:$time_step_max);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Nf_AttentionOp : Nf_Op<"attention", [Pure]> {
  let summary = "Causal grouped-query self-attention";
  let description = [{
    Operands: input [T, H]; q_proj [nq * hd, H]; k_proj, v_proj [nkv * hd, H];
    o_proj [H, nq * hd]. Query head h reads KV head h / (nq / nkv). Nemotron-H
    uses no positional encoding; `rope_theta`, when present, asks for rotary
    embeddings. `scale` defaults to 1/sqrt(hd).
  }];
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$q_proj,
      AnyRankedTensor:$k_proj, AnyRankedTensor:$v_proj, AnyRankedTensor:$o_proj,
      I64Attr:$num_heads, I64Attr:$num_kv_heads, I64Attr:$head_dim,
      OptionalAttr<F64Attr>:$rope_theta, OptionalAttr<F64Attr>:$scale);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Nf_MLPOp : Nf_Op<"mlp", [Pure]> {
  let summary = "Dense MLP: down(act(up(x))), act = relu^2";
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$up_proj,
      AnyRankedTensor:$down_proj,
      DefaultValuedAttr<StrAttr, "\"relu2\"">:$activation);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Nf_MoEOp : Nf_Op<"moe", [Pure]> {
  let summary = "Mixture of experts: sigmoid router, group-limited top-k, routed + shared experts";
  let description = [{
    Operands: input [T, H]; router [E, H]; correction_bias [E] (selection
    only); experts_up [E, Ie, He]; experts_down [E, He, Ie]; shared_up [Is, H];
    shared_down [H, Is]; and for latent MoE (Nemotron 3 Super) latent_down
    [L, H] and latent_up [H, L] last, with He = L (He = H otherwise).

    Selection: sigmoid(x W_r^T) + correction_bias, restricted to the best
    `topk_group` of `n_group` expert groups, top `top_k`. The selected sigmoid
    scores are renormalised when `norm_topk_prob` and scaled by
    `routed_scaling_factor`.
  }];
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$router,
      AnyRankedTensor:$correction_bias, AnyRankedTensor:$experts_up,
      AnyRankedTensor:$experts_down, AnyRankedTensor:$shared_up,
      AnyRankedTensor:$shared_down, Variadic<AnyRankedTensor>:$latent,
      I64Attr:$num_experts, I64Attr:$top_k, I64Attr:$n_group,
      I64Attr:$topk_group, BoolAttr:$norm_topk_prob,
      F64Attr:$routed_scaling_factor,
      DefaultValuedAttr<StrAttr, "\"relu2\"">:$activation);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    bool hasLatent() { return getLatent().size() == 2; }
  }];
}

def Nf_LMHeadOp : Nf_Op<"lm_head", [Pure]> {
  let summary = "Logits: x W^T in f32";
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$weight);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Compute ops: what the mixers lower to, besides nf_moe and nf_kv
//===----------------------------------------------------------------------===//

def Nf_LinearOp : Nf_Op<"linear", [Pure]> {
  let summary = "y = x W^T for W [out, in] of any weight dtype, f32 accumulation";
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$weight);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Nf_SplitOp : Nf_Op<"split", [Pure]> {
  let summary = "Splits the feature dimension into consecutive slices";
  let arguments = (ins AnyRankedTensor:$input, DenseI64ArrayAttr:$sizes);
  let results = (outs Variadic<AnyRankedTensor>:$results);
  let assemblyFormat = "$input $sizes attr-dict `:` type($input) `->` type($results)";
  let hasVerifier = 1;
}

def Nf_ActivationOp : Nf_Op<"activation", [Pure, SameOperandsAndResultType]> {
  let summary = "Elementwise activation: relu2 (relu(x)^2) or silu";
  let arguments = (ins AnyRankedTensor:$input, StrAttr:$kind);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Nf_GatedRMSNormOp : Nf_Op<"gated_rms_norm", [Pure]> {
  let summary = "Mamba2 output norm: RMSNorm over groups of y * silu(z), times w";
  let arguments = (ins AnyRankedTensor:$input, AnyRankedTensor:$gate,
                       AnyRankedTensor:$weight, I64Attr:$groups,
                       F64Attr:$epsilon);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Kernels: fusion regions
//===----------------------------------------------------------------------===//

def Nf_KernelOp : Nf_Op<"kernel", [IsolatedFromAbove,
    SingleBlockImplicitTerminator<"YieldOp">]> {
  let summary = "A fused kernel: the ops of its region run as one GPU kernel";
  let description = [{
    Made by `nf-fuse-kernels`. The region lists what the kernel computes, op
    by op, over the kernel's operands (block arguments) and yields its
    results. The CPU backend executes the region op by op; the CUDA code
    generator emits one kernel for it. `name` says which fused pattern it is
    (e.g. `add_rms_norm`, `mamba_decode`). Set by `nf-plan-memory`:
    `arena_offsets` gives each result's byte offset in the step's arena,
    `scratch_offsets` that of each value the region computes but does not
    yield (its ops' results in order, the yielded ones skipped).
  }];
  let arguments = (ins Variadic<AnyType>:$inputs, StrAttr:$name,
                       OptionalAttr<DenseI64ArrayAttr>:$arena_offsets,
                       OptionalAttr<DenseI64ArrayAttr>:$scratch_offsets);
  let results = (outs Variadic<AnyType>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $name (`(` $inputs^ `:` type($inputs) `)`)? attr-dict-with-keyword
    (`->` type($results)^)? $body
  }];
  let extraClassDeclaration = [{
    /// The values the region's ops compute and the yield does not return,
    /// in op order: what `scratch_offsets` places.
    ::llvm::SmallVector<::mlir::Value> internalValues();
  }];
  let hasVerifier = 1;
}

def Nf_YieldOp : Nf_Op<"yield", [Pure, Terminator,
                                 HasParent<"KernelOp">]> {
  let summary = "Results of a kernel region";
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
  let builders = [OpBuilder<(ins), [{ build($_builder, $_state, {}); }]>];
}

#endif // NF_OPS_TD
