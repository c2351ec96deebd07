// One Mamba2 layer of the Nano shape's head (P = 64, N = 128; nh = 1,
// G = 1), written by hand for the pass tests. H = 16, V = 32.
nf.model @mamba_wide attributes {vocab_size = 32 : i64, hidden_size = 16 : i64,
                                 eos_token_ids = array<i64: 2>} {
^bb0(%tokens: tensor<?xi32>):
  %emb = nf.weight ["emb"] : tensor<32x16xf32>
  %n0 = nf.weight ["n0"] : tensor<16xf32>
  %nf = nf.weight ["norm_f"] : tensor<16xf32>
  %h0 = nf.embed %tokens, %emb : (tensor<?xi32>, tensor<32x16xf32>) -> tensor<?x16xf32>
  %x0 = nf.rms_norm %h0, %n0 {epsilon = 1.0e-5 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
  // in_proj: z (64), x (64), B and C (128 each), dt (1).
  %in = nf.weight ["in_proj"] : tensor<385x16xf32>
  %cw = nf.weight ["conv_w"] : tensor<320x1x4xf32>
  %cb = nf.weight ["conv_b"] : tensor<320xf32>
  %dtb = nf.weight ["dt_bias"] : tensor<1xf32>
  %alog = nf.weight ["A_log"] : tensor<1xf32>
  %d = nf.weight ["D"] : tensor<1xf32>
  %gn = nf.weight ["gnorm"] : tensor<64xf32>
  %out = nf.weight ["out_proj"] : tensor<16x64xf32>
  %m = nf.mamba2 %x0, %in, %cw, %dtb, %alog, %d, %gn, %out, %cb {num_heads = 1 : i64, head_dim = 64 : i64, state_size = 128 : i64, n_groups = 1 : i64, conv_kernel = 4 : i64, chunk_size = 128 : i64, epsilon = 1.0e-5 : f64, time_step_min = 0.0 : f64, time_step_max = 0x7FF0000000000000 : f64} : (tensor<?x16xf32>, tensor<385x16xf32>, tensor<320x1x4xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<64xf32>, tensor<16x64xf32>, tensor<320xf32>) -> tensor<?x16xf32>
  %h1 = nf.add %h0, %m : tensor<?x16xf32>
  %xf = nf.rms_norm %h1, %nf {epsilon = 1.0e-5 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
  %head = nf.weight ["lm_head"] : tensor<32x16xf32>
  %logits = nf.lm_head %xf, %head : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
  nf.output %logits : tensor<?x32xf32>
}
