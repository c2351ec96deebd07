// A tiny model with one layer of each kind (M, *, -, E with latent
// projections), written by hand for the pass tests. H = 16, V = 32.
nf.model @hybrid attributes {vocab_size = 32 : i64, hidden_size = 16 : i64,
                             eos_token_ids = array<i64: 2>} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %n0 = nf.weight ["n0"] : tensor<16xf32>
  %n1 = nf.weight ["n1"] : tensor<16xf32>
  %n2 = nf.weight ["n2"] : tensor<16xf32>
  %n3 = nf.weight ["n3"] : tensor<16xf32>
  %nf = nf.weight ["norm_f"] : tensor<16xf32>
  %h0 = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>

  // Layer 0: Mamba2, nh = 4, P = 4 (I = 16), G = 2, N = 4, K = 4.
  %x0 = nf.rms_norm %h0, %n0 {epsilon = 1.0e-5 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
  %in = nf.weight ["in_proj"] : tensor<52x16xf32>
  %cw = nf.weight ["conv_w"] : tensor<32x1x4xf32>
  %cb = nf.weight ["conv_b"] : tensor<32xf32>
  %dtb = nf.weight ["dt_bias"] : tensor<4xf32>
  %alog = nf.weight ["A_log"] : tensor<4xf32>
  %d = nf.weight ["D"] : tensor<4xf32>
  %gn = nf.weight ["gnorm"] : tensor<16xf32>
  %out = nf.weight ["out_proj"] : tensor<16x16xf32>
  %m = nf.mamba2 %x0, %in, %cw, %dtb, %alog, %d, %gn, %out, %cb {num_heads = 4 : i64, head_dim = 4 : i64, state_size = 4 : i64, n_groups = 2 : i64, conv_kernel = 4 : i64, chunk_size = 8 : i64, epsilon = 1.0e-5 : f64, time_step_min = 0.0 : f64, time_step_max = 0x7FF0000000000000 : f64} : (tensor<?x16xf32>, tensor<52x16xf32>, tensor<32x1x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<16xf32>, tensor<16x16xf32>, tensor<32xf32>) -> tensor<?x16xf32>
  %h1 = nf.add %h0, %m : tensor<?x16xf32>

  // Layer 1: attention, nq = 4, nkv = 2, hd = 4.
  %x1 = nf.rms_norm %h1, %n1 {epsilon = 1.0e-5 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
  %q = nf.weight ["q"] : tensor<16x16xf32>
  %k = nf.weight ["k"] : tensor<8x16xf32>
  %v = nf.weight ["v"] : tensor<8x16xf32>
  %o = nf.weight ["o"] : tensor<16x16xf32>
  %a = nf.attention %x1, %q, %k, %v, %o {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 4 : i64} : (tensor<?x16xf32>, tensor<16x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
  %h2 = nf.add %h1, %a : tensor<?x16xf32>

  // Layer 2: dense MLP.
  %x2 = nf.rms_norm %h2, %n2 {epsilon = 1.0e-5 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
  %up = nf.weight ["up"] : tensor<24x16xf32>
  %down = nf.weight ["down"] : tensor<16x24xf32>
  %mlp = nf.mlp %x2, %up, %down : (tensor<?x16xf32>, tensor<24x16xf32>, tensor<16x24xf32>) -> tensor<?x16xf32>
  %h3 = nf.add %h2, %mlp : tensor<?x16xf32>

  // Layer 3: MoE, E = 4, k = 2, Ie = 8, Is = 12, latent L = 8.
  %x3 = nf.rms_norm %h3, %n3 {epsilon = 1.0e-5 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
  %r = nf.weight ["gate"] : tensor<4x16xf32>
  %rb = nf.weight ["bias"] : tensor<4xf32>
  %eu = nf.weight stacked ["e0.up", "e1.up", "e2.up", "e3.up"] : tensor<4x8x8xf32>
  %ed = nf.weight stacked ["experts.down_proj"] : tensor<4x8x8xf32>
  %su = nf.weight ["su"] : tensor<12x16xf32>
  %sd = nf.weight ["sd"] : tensor<16x12xf32>
  %l1 = nf.weight ["fc1"] : tensor<8x16xf32>
  %l2 = nf.weight ["fc2"] : tensor<16x8xf32>
  %moe = nf.moe %x3, %r, %rb, %eu, %ed, %su, %sd, %l1, %l2 {num_experts = 4 : i64, top_k = 2 : i64, n_group = 2 : i64, topk_group = 1 : i64, norm_topk_prob = true, routed_scaling_factor = 2.5 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<4xf32>, tensor<4x8x8xf32>, tensor<4x8x8xf32>, tensor<12x16xf32>, tensor<16x12xf32>, tensor<8x16xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
  %h4 = nf.add %h3, %moe : tensor<?x16xf32>

  %xf = nf.rms_norm %h4, %nf {epsilon = 1.0e-5 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
  %head = nf.weight ["lm_head"] : tensor<32x16xf32>
  %logits = nf.lm_head %xf, %head : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %logits : tensor<?x32xf32>
}
