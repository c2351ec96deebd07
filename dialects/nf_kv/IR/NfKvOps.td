//===- NfKvOps.td - KV cache and recurrent state ------------*- tablegen -*-===//
//
// `nf_kv` makes the per-sequence state of a decoder explicit: the paged
// attention KV cache and the Mamba2 recurrent state slots. Storage is declared
// once per layer as a symbol; step functions read and update it for a batch of
// sequences described at run time by a `!nf_kv.batch` value (which token
// belongs to which sequence, positions, state slots and page tables), so one
// compiled step serves continuous batching.
//
//===----------------------------------------------------------------------===//

#ifndef NF_KV_OPS_TD
#define NF_KV_OPS_TD

include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/OpBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def NfKv_Dialect : Dialect {
  let name = "nf_kv";
  let cppNamespace = "::mlir::nf_kv";
  let summary = "Paged KV cache and Mamba2 recurrent-state slots";
  let useDefaultTypePrinterParser = 1;
}

class NfKv_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<NfKv_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

def NfKv_BatchType : NfKv_Type<"Batch", "batch"> {
  let summary = "Run-time description of the sequences in one step";
  let description = [{
    Per token: its sequence and absolute position. Per sequence: its range of
    tokens in the step, its recurrent-state slot, its KV page table and its
    expert budget. Supplied by the runtime for every step.
  }];
}

def NfKv_KVCacheType : NfKv_Type<"KVCache", "kv_cache"> {
  let summary = "Paged K/V storage of one attention layer";
  let parameters = (ins "int64_t":$pageSize, "int64_t":$numPages,
                        "int64_t":$kvHeads, "int64_t":$headDim,
                        "Type":$elementType);
  let assemblyFormat = "`<` struct(params) `>`";
}

def NfKv_MambaStateType : NfKv_Type<"MambaState", "mamba_state"> {
  let summary = "Recurrent state slots of one Mamba2 layer";
  let description = [{
    Per slot: the last `convWindow` (= K - 1) conv inputs of `convDim`
    channels, and the SSM state [numHeads, headDim, stateSize] in f32.
  }];
  let parameters = (ins "int64_t":$slots, "int64_t":$convDim,
                        "int64_t":$convWindow, "int64_t":$numHeads,
                        "int64_t":$headDim, "int64_t":$stateSize);
  let assemblyFormat = "`<` struct(params) `>`";
}

class NfKv_Op<string mnemonic, list<Trait> traits = []>
    : Op<NfKv_Dialect, mnemonic, traits>;

//===----------------------------------------------------------------------===//
// Storage declarations
//===----------------------------------------------------------------------===//

def NfKv_KVCacheOp : NfKv_Op<"kv_cache", [Symbol]> {
  let summary = "Declares the KV cache of one attention layer";
  let description = [{
    `hot_window` (fp8 caches only) makes the cache tiered: the pages that
    hold any of a sequence's last `hot_window` positions keep bf16 values,
    and the runtime compresses each older page to fp8 between steps.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttrOf<NfKv_KVCacheType>:$type,
                       I64Attr:$layer, OptionalAttr<I64Attr>:$hot_window);
  let assemblyFormat = "$sym_name `layer` $layer attr-dict `:` $type";
  let hasVerifier = 1;
}

def NfKv_MambaStateOp : NfKv_Op<"mamba_state", [Symbol]> {
  let summary = "Declares the recurrent state of one Mamba2 layer";
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<NfKv_MambaStateType>:$type, I64Attr:$layer);
  let assemblyFormat = "$sym_name `layer` $layer attr-dict `:` $type";
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

def NfKv_AppendOp : NfKv_Op<"append",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Writes the K/V of the step's tokens at their positions";
  let arguments = (ins FlatSymbolRefAttr:$cache, NfKv_BatchType:$batch,
                       AnyRankedTensor:$key, AnyRankedTensor:$value);
  let assemblyFormat = "$cache `,` $batch `,` $key `,` $value attr-dict `:` type($key) `,` type($value)";
}

def NfKv_AttendOp : NfKv_Op<"attend",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Causal attention of the step's queries over the cache";
  let description = [{
    `prefill`: each sequence attends over its pages up to each query's
    position; `decode`: one query per sequence. GQA: query head h reads KV
    head h / (num_heads / kvHeads). Must follow the `nf_kv.append` of the
    same tokens.
  }];
  let arguments = (ins FlatSymbolRefAttr:$cache, NfKv_BatchType:$batch,
                       AnyRankedTensor:$query, I64Attr:$num_heads,
                       F64Attr:$scale, StrAttr:$mode);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$cache `,` $batch `,` $query attr-dict `:` type($query) `->` type($result)";
}

//===----------------------------------------------------------------------===//
// Mamba2
//===----------------------------------------------------------------------===//

def NfKv_CausalConvOp : NfKv_Op<"causal_conv",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Depthwise causal conv + SiLU over [conv window | new tokens]; updates the window";
  let arguments = (ins FlatSymbolRefAttr:$state, NfKv_BatchType:$batch,
                       AnyRankedTensor:$input, AnyRankedTensor:$weight,
                       Optional<AnyRankedTensor>:$bias, StrAttr:$mode);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$state `,` operands attr-dict `:` functional-type(operands, results)";
}

class NfKv_SSMOp<string mnemonic, string summaryText, dag extraArgs = (ins)>
    : NfKv_Op<mnemonic, [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = summaryText;
  let arguments = !con((ins FlatSymbolRefAttr:$state, NfKv_BatchType:$batch,
                       AnyRankedTensor:$xbc, AnyRankedTensor:$dt,
                       AnyRankedTensor:$dt_bias, AnyRankedTensor:$a_log,
                       AnyRankedTensor:$d, I64Attr:$n_groups,
                       F64Attr:$time_step_min, F64Attr:$time_step_max), extraArgs);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$state `,` $batch `,` $xbc `,` $dt `,` $dt_bias `,` $a_log `,` $d attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NfKv_SSMUpdateOp : NfKv_SSMOp<"ssm_update",
    "Decode: one selective-state update per sequence, y = C.S + D x"> {}


def NfKv_SSMScanOp : NfKv_SSMOp<"ssm_scan",
    "Prefill: chunked SSD scan from each sequence's state; writes the final state",
    (ins I64Attr:$chunk_size)> {}

#endif // NF_KV_OPS_TD
