//===- NfDialect.td - the nf model dialect -----------------*- tablegen -*-===//
//
// `nf` describes a Nemotron-H / Nemotron 3 decoder at the level of its model
// card: embedding, per-layer RMSNorm + one mixer + residual add, final norm,
// LM head. Weights are typed references into external safetensors files.
//
//===----------------------------------------------------------------------===//

#ifndef NF_DIALECT_TD
#define NF_DIALECT_TD

include "mlir/IR/OpBase.td"

def Nf_Dialect : Dialect {
  let name = "nf";
  let cppNamespace = "::mlir::nf";
  let summary = "Model-level description of hybrid Mamba2/attention/MoE decoders";
  let description = [{
    The `nf` dialect is what `nfc import` produces from a Hugging Face
    checkpoint. One `nf.model` holds the whole forward pass of a decoder as a
    function of the token ids of one sequence. Mixer ops (`nf.mamba2`,
    `nf.attention`, `nf.mlp`, `nf.moe`) carry their hyperparameters as
    attributes and take their weights as operands produced by `nf.weight`,
    which names tensors in the checkpoint instead of embedding their data.
    Recurrent state and KV caches are implicit here; the `nf_kv` lowering
    makes them explicit.
  }];
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    /// Adds the attributes of NfAttrs.td (in NfAttrs.cpp, where their
    /// storage classes are complete).
    void registerAttributes();
  }];
}

class Nf_Op<string mnemonic, list<Trait> traits = []>
    : Op<Nf_Dialect, mnemonic, traits>;

#endif // NF_DIALECT_TD
