// Verifier diagnostics: each case is reported at the offending op.
// RUN: nf-opt %s -split-input-file -verify-diagnostics

nf.model @bad_vocab attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %h = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %head = nf.weight ["lm_head"] : tensor<31x16xf32>
  %logits = nf.lm_head %h, %head : (tensor<?x16xf32>, tensor<31x16xf32>) -> tensor<?x31xf32>
  // expected-error @below {{logits must be [tokens, 32], got 'tensor<?x31xf32>'}}
  nf.output %logits : tensor<?x31xf32>
}

// -----

// expected-error @below {{token ids must be a 1-D integer tensor, got 'tensor<?xf32>'}}
nf.model @bad_tokens attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xf32>):
  %l = nf.weight ["x"] : tensor<32x16xf32>
  %z = nf.weight ["z"] : tensor<32x16xf32>
  nf.output %z : tensor<32x16xf32>
}

// -----

nf.model @unknown_dtype attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  // expected-error @below {{weight 'emb' has unsupported element type 'i8' (expected f32, bf16 or f16)}}
  %emb = nf.weight ["emb"] : tensor<32x16xi8>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @stack_count attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  // expected-error @below {{stacked weight 'e0' lists 2 tensors but its type 'tensor<3x8x16xf32>' stacks 3}}
  %e = nf.weight stacked ["e0", "e1"] : tensor<3x8x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @unstacked_many attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  // expected-error @below {{an unstacked weight names exactly one tensor, got 2}}
  %e = nf.weight ["e0", "e1"] : tensor<2x8x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @mamba_in_proj attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %x = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %in = nf.weight ["in_proj"] : tensor<50x16xf32>
  %cw = nf.weight ["conv_w"] : tensor<32x1x4xf32>
  %v4 = nf.weight ["v4"] : tensor<4xf32>
  %gn = nf.weight ["gnorm"] : tensor<16xf32>
  %out = nf.weight ["out_proj"] : tensor<16x16xf32>
  // expected-error @below {{in_proj weight has shape [50, 16], expected [52, 16]}}
  %m = nf.mamba2 %x, %in, %cw, %v4, %v4, %v4, %gn, %out {num_heads = 4 : i64, head_dim = 4 : i64, state_size = 4 : i64, n_groups = 2 : i64, conv_kernel = 4 : i64, chunk_size = 8 : i64, epsilon = 1.0e-5 : f64, time_step_min = 0.0 : f64, time_step_max = 0x7FF0000000000000 : f64} : (tensor<?x16xf32>, tensor<50x16xf32>, tensor<32x1x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @mamba_groups attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %x = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %in = nf.weight ["in_proj"] : tensor<64x16xf32>
  %cw = nf.weight ["conv_w"] : tensor<40x1x4xf32>
  %v4 = nf.weight ["v4"] : tensor<4xf32>
  %gn = nf.weight ["gnorm"] : tensor<16xf32>
  %out = nf.weight ["out_proj"] : tensor<16x16xf32>
  // expected-error @below {{n_groups (3) must divide num_heads (4)}}
  %m = nf.mamba2 %x, %in, %cw, %v4, %v4, %v4, %gn, %out {num_heads = 4 : i64, head_dim = 4 : i64, state_size = 4 : i64, n_groups = 3 : i64, conv_kernel = 4 : i64, chunk_size = 8 : i64, epsilon = 1.0e-5 : f64, time_step_min = 0.0 : f64, time_step_max = 0x7FF0000000000000 : f64} : (tensor<?x16xf32>, tensor<64x16xf32>, tensor<40x1x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @attention_heads attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %x = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %q = nf.weight ["q"] : tensor<16x16xf32>
  %k = nf.weight ["k"] : tensor<12x16xf32>
  %o = nf.weight ["o"] : tensor<16x16xf32>
  // expected-error @below {{num_kv_heads (3) must divide num_heads (4)}}
  %a = nf.attention %x, %q, %k, %k, %o {num_heads = 4 : i64, num_kv_heads = 3 : i64, head_dim = 4 : i64} : (tensor<?x16xf32>, tensor<16x16xf32>, tensor<12x16xf32>, tensor<12x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @attention_shape attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %x = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %q = nf.weight ["q"] : tensor<16x16xf32>
  %k = nf.weight ["k"] : tensor<8x16xf32>
  %v = nf.weight ["v"] : tensor<16x16xf32>
  // expected-error @below {{v_proj weight has shape [16, 16], expected [8, 16]}}
  %a = nf.attention %x, %q, %k, %v, %q {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 4 : i64} : (tensor<?x16xf32>, tensor<16x16xf32>, tensor<8x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @moe_topk attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %x = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %r = nf.weight ["gate"] : tensor<4x16xf32>
  %rb = nf.weight ["bias"] : tensor<4xf32>
  %eu = nf.weight stacked ["up"] : tensor<4x8x16xf32>
  %ed = nf.weight stacked ["down"] : tensor<4x16x8xf32>
  %su = nf.weight ["su"] : tensor<12x16xf32>
  %sd = nf.weight ["sd"] : tensor<16x12xf32>
  // expected-error @below {{top_k (5) exceeds the number of experts (4)}}
  %m = nf.moe %x, %r, %rb, %eu, %ed, %su, %sd {num_experts = 4 : i64, top_k = 5 : i64, n_group = 1 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 1.0 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<4xf32>, tensor<4x8x16xf32>, tensor<4x16x8xf32>, tensor<12x16xf32>, tensor<16x12xf32>) -> tensor<?x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @moe_groups attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %x = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %r = nf.weight ["gate"] : tensor<4x16xf32>
  %rb = nf.weight ["bias"] : tensor<4xf32>
  %eu = nf.weight stacked ["up"] : tensor<4x8x16xf32>
  %ed = nf.weight stacked ["down"] : tensor<4x16x8xf32>
  %su = nf.weight ["su"] : tensor<12x16xf32>
  %sd = nf.weight ["sd"] : tensor<16x12xf32>
  // expected-error @below {{n_group (3) must divide num_experts (4)}}
  %m = nf.moe %x, %r, %rb, %eu, %ed, %su, %sd {num_experts = 4 : i64, top_k = 2 : i64, n_group = 3 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 1.0 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<4xf32>, tensor<4x8x16xf32>, tensor<4x16x8xf32>, tensor<12x16xf32>, tensor<16x12xf32>) -> tensor<?x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @moe_expert_shape attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %x = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %r = nf.weight ["gate"] : tensor<4x16xf32>
  %rb = nf.weight ["bias"] : tensor<4xf32>
  %eu = nf.weight stacked ["up"] : tensor<4x8x16xf32>
  %ed = nf.weight stacked ["down"] : tensor<4x16x7xf32>
  %su = nf.weight ["su"] : tensor<12x16xf32>
  %sd = nf.weight ["sd"] : tensor<16x12xf32>
  // expected-error @below {{experts_down weight has shape [4, 16, 7], expected [4, 16, 8]}}
  %m = nf.moe %x, %r, %rb, %eu, %ed, %su, %sd {num_experts = 4 : i64, top_k = 2 : i64, n_group = 1 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 1.0 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<4xf32>, tensor<4x8x16xf32>, tensor<4x16x7xf32>, tensor<12x16xf32>, tensor<16x12xf32>) -> tensor<?x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @norm_shape attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %x = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %w = nf.weight ["norm"] : tensor<15xf32>
  // expected-error @below {{norm weight has shape [15], expected [16]}}
  %n = nf.rms_norm %x, %w {epsilon = 1.0e-5 : f64} : (tensor<?x16xf32>, tensor<15xf32>) -> tensor<?x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}

// -----

nf.model @mlp_shape attributes {vocab_size = 32 : i64, hidden_size = 16 : i64} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %x = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %up = nf.weight ["up"] : tensor<24x16xf32>
  %down = nf.weight ["down"] : tensor<16x20xf32>
  // expected-error @below {{down_proj weight has shape [16, 20], expected [16, 24]}}
  %m = nf.mlp %x, %up, %down : (tensor<?x16xf32>, tensor<24x16xf32>, tensor<16x20xf32>) -> tensor<?x16xf32>
  %hw = nf.weight ["lm_head"] : tensor<32x16xf32>
  %h0 = nf.embed %tokens, %hw : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %l = nf.lm_head %h0, %hw : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %l : tensor<?x32xf32>
}
