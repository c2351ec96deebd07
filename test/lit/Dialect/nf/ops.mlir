// Round-trips through the custom and the generic assembly formats.
// RUN: nf-opt %s | FileCheck %s
// RUN: nf-opt %s | nf-opt | FileCheck %s
// RUN: nf-opt %s --mlir-print-op-generic | nf-opt | FileCheck %s

// CHECK-LABEL: nf.model @tiny
// CHECK-SAME: hidden_size = 16
// CHECK-SAME: vocab_size = 32
nf.model @tiny attributes {vocab_size = 32 : i64, hidden_size = 16 : i64,
                           bos_token_id = 1 : i64, eos_token_ids = array<i64: 2>,
                           checkpoint = "/ckpt", weight_files = ["model.safetensors"]} {
^bb0(%tokens: tensor<?xi32>):
  // CHECK: nf.weight ["emb"] : tensor<32x16xbf16>
  %emb = nf.weight ["emb"] : tensor<32x16xbf16>
  %norm = nf.weight ["norm"] : tensor<16xf32>
  // CHECK: nf.embed
  %h0 = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xbf16>) -> tensor<?x16xf32>
  // CHECK: nf.rms_norm {{.*}} {epsilon = 1.000000e-05 : f64}
  %x0 = nf.rms_norm %h0, %norm {epsilon = 1.0e-5 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>

  // Mamba2: nh = 4, P = 4 (I = 16), G = 2, N = 4, K = 4: CD = 32, DIN = 52.
  %in = nf.weight ["in_proj"] : tensor<52x16xf32>
  %cw = nf.weight ["conv_w"] : tensor<32x1x4xf32>
  %cb = nf.weight ["conv_b"] : tensor<32xf32>
  %dtb = nf.weight ["dt_bias"] : tensor<4xf32>
  %alog = nf.weight ["A_log"] : tensor<4xf32>
  %d = nf.weight ["D"] : tensor<4xf32>
  %gn = nf.weight ["gnorm"] : tensor<16xf32>
  %out = nf.weight ["out_proj"] : tensor<16x16xf32>
  // CHECK: nf.mamba2 {{.*}} {chunk_size = 8 : i64, conv_kernel = 4 : i64
  %m = nf.mamba2 %x0, %in, %cw, %dtb, %alog, %d, %gn, %out, %cb {num_heads = 4 : i64, head_dim = 4 : i64, state_size = 4 : i64, n_groups = 2 : i64, conv_kernel = 4 : i64, chunk_size = 8 : i64, epsilon = 1.0e-5 : f64, time_step_min = 0.0 : f64, time_step_max = 0x7FF0000000000000 : f64} : (tensor<?x16xf32>, tensor<52x16xf32>, tensor<32x1x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<16xf32>, tensor<16x16xf32>, tensor<32xf32>) -> tensor<?x16xf32>
  // CHECK: nf.add
  %h1 = nf.add %h0, %m : tensor<?x16xf32>

  // Attention: nq = 4, nkv = 2, hd = 4.
  %q = nf.weight ["q"] : tensor<16x16xf32>
  %k = nf.weight ["k"] : tensor<8x16xf32>
  %v = nf.weight ["v"] : tensor<8x16xf32>
  %o = nf.weight ["o"] : tensor<16x16xf32>
  // CHECK: nf.attention {{.*}} {head_dim = 4 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64}
  %a = nf.attention %h1, %q, %k, %v, %o {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 4 : i64} : (tensor<?x16xf32>, tensor<16x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
  // CHECK: nf.attention {{.*}}rope_theta = 1.000000e+04
  %ar = nf.attention %h1, %q, %k, %v, %o {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 4 : i64, rope_theta = 10000.0 : f64} : (tensor<?x16xf32>, tensor<16x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>

  // Dense MLP.
  %up = nf.weight ["up"] : tensor<24x16xf32>
  %down = nf.weight ["down"] : tensor<16x24xf32>
  // CHECK: nf.mlp
  %mlp = nf.mlp %a, %up, %down : (tensor<?x16xf32>, tensor<24x16xf32>, tensor<16x24xf32>) -> tensor<?x16xf32>

  // MoE: E = 4, k = 2, Ie = 8, Is = 12, with latent projections (L = 8).
  %r = nf.weight ["gate"] : tensor<4x16xf32>
  %rb = nf.weight ["bias"] : tensor<4xf32>
  // CHECK: nf.weight stacked ["e0.up", "e1.up", "e2.up", "e3.up"] : tensor<4x8x8xf32>
  %eu = nf.weight stacked ["e0.up", "e1.up", "e2.up", "e3.up"] : tensor<4x8x8xf32>
  // CHECK: nf.weight stacked ["experts.down_proj"] : tensor<4x8x8xf32>
  %ed = nf.weight stacked ["experts.down_proj"] : tensor<4x8x8xf32>
  %su = nf.weight ["su"] : tensor<12x16xf32>
  %sd = nf.weight ["sd"] : tensor<16x12xf32>
  %l1 = nf.weight ["fc1"] : tensor<8x16xf32>
  %l2 = nf.weight ["fc2"] : tensor<16x8xf32>
  // CHECK: nf.moe {{.*}}norm_topk_prob = true
  %moe = nf.moe %mlp, %r, %rb, %eu, %ed, %su, %sd, %l1, %l2 {num_experts = 4 : i64, top_k = 2 : i64, n_group = 2 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 2.5 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<4xf32>, tensor<4x8x8xf32>, tensor<4x8x8xf32>, tensor<12x16xf32>, tensor<16x12xf32>, tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>

  %head = nf.weight ["lm_head"] : tensor<32x16xbf16>
  // CHECK: nf.lm_head
  %logits = nf.lm_head %moe, %head : (tensor<?x16xf32>, tensor<32x16xbf16>) -> tensor<?x32xf32>
  // CHECK: nf.output {{.*}} : tensor<?x32xf32>
  nf.output %logits : tensor<?x32xf32>
}
