// RUN: nf-opt %S/Inputs/hybrid.mlir --nf-outline-steps | FileCheck %s
// RUN: nf-opt %s --nf-outline-steps -split-input-file -verify-diagnostics

// The model becomes two step functions over a batch; its attributes move to
// the module.
// CHECK: module attributes {nf.model = {{{.*}}eos_token_ids = array<i64: 2>, hidden_size = 16 : i64, {{.*}}sym_name = "hybrid", vocab_size = 32 : i64{{.*}}}}
// CHECK-NOT: nf.model @
// CHECK: func.func @prefill(%[[T:.*]]: tensor<?xi32> {nf.arg = "tokens"}, %{{.*}}: !nf_kv.batch {nf.arg = "batch"}, %{{.*}}: tensor<?xf32> {nf.arg = "expert_budget"}) -> tensor<?x32xf32> attributes {nf.phase = "prefill"}
// CHECK: nf.embed %[[T]]
// CHECK: nf.mamba2
// CHECK: %[[L:.*]] = nf.lm_head
// CHECK: return %[[L]] : tensor<?x32xf32>
// CHECK: func.func @decode({{.*}}) -> tensor<?x32xf32> attributes {nf.phase = "decode"}
// CHECK: nf.mamba2

// -----

nf.model @a attributes {vocab_size = 4 : i64, hidden_size = 2 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %w = nf.weight ["w"] : tensor<4x2xf32>
  %h = nf.embed %tokens, %w : (tensor<?xi32>, tensor<4x2xf32>) -> tensor<?x2xf32>
  %l = nf.lm_head %h, %w : (tensor<?x2xf32>, tensor<4x2xf32>) -> tensor<?x4xf32>
  nf.output %l : tensor<?x4xf32>
}
// expected-error @below {{a module holds one model; found 2}}
nf.model @b attributes {vocab_size = 4 : i64, hidden_size = 2 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %w = nf.weight ["w"] : tensor<4x2xf32>
  %h = nf.embed %tokens, %w : (tensor<?xi32>, tensor<4x2xf32>) -> tensor<?x2xf32>
  %l = nf.lm_head %h, %w : (tensor<?x2xf32>, tensor<4x2xf32>) -> tensor<?x4xf32>
  nf.output %l : tensor<?x4xf32>
}
