// RUN: nf-opt %s -split-input-file -verify-diagnostics

func.func @no_cache(%b: !nf_kv.batch, %k: tensor<?x8xf32>) {
  // expected-error @below {{'missing' does not name a KV cache}}
  nf_kv.append @missing, %b, %k, %k : tensor<?x8xf32>, tensor<?x8xf32>
  return
}

// -----

nf_kv.kv_cache @kv layer 1 : !nf_kv.kv_cache<pageSize = 16, numPages = 8, kvHeads = 2, headDim = 4, elementType = f32>
func.func @width(%b: !nf_kv.batch, %k: tensor<?x6xf32>) {
  // expected-error @below {{key has 6 features, expected 8}}
  nf_kv.append @kv, %b, %k, %k : tensor<?x6xf32>, tensor<?x6xf32>
  return
}

// -----

nf_kv.kv_cache @kv layer 1 : !nf_kv.kv_cache<pageSize = 16, numPages = 8, kvHeads = 2, headDim = 4, elementType = f32>
func.func @heads(%b: !nf_kv.batch, %q: tensor<?x12xf32>) -> tensor<?x12xf32> {
  // expected-error @below {{the cache's 2 KV heads must divide num_heads (3)}}
  %o = nf_kv.attend @kv, %b, %q {mode = "decode", num_heads = 3 : i64, scale = 0.5 : f64} : tensor<?x12xf32> -> tensor<?x12xf32>
  return %o : tensor<?x12xf32>
}

// -----

nf_kv.kv_cache @kv layer 1 : !nf_kv.kv_cache<pageSize = 16, numPages = 8, kvHeads = 2, headDim = 4, elementType = f32>
func.func @mode(%b: !nf_kv.batch, %q: tensor<?x16xf32>) -> tensor<?x16xf32> {
  // expected-error @below {{mode must be 'prefill' or 'decode', got 'both'}}
  %o = nf_kv.attend @kv, %b, %q {mode = "both", num_heads = 4 : i64, scale = 0.5 : f64} : tensor<?x16xf32> -> tensor<?x16xf32>
  return %o : tensor<?x16xf32>
}

// -----

nf_kv.kv_cache @kv layer 1 : !nf_kv.kv_cache<pageSize = 16, numPages = 8, kvHeads = 2, headDim = 4, elementType = f32>
func.func @wrong_storage(%b: !nf_kv.batch, %xbc: tensor<?x32xf32>, %w: tensor<32x1x4xf32>) -> tensor<?x32xf32> {
  // expected-error @below {{'kv' does not name a Mamba state}}
  %c = nf_kv.causal_conv @kv, %b, %xbc, %w {mode = "decode"} : (!nf_kv.batch, tensor<?x32xf32>, tensor<32x1x4xf32>) -> tensor<?x32xf32>
  return %c : tensor<?x32xf32>
}

// -----

nf_kv.mamba_state @ssm layer 0 : !nf_kv.mamba_state<slots = 4, convDim = 32, convWindow = 3, numHeads = 4, headDim = 4, stateSize = 4>
func.func @conv_window(%b: !nf_kv.batch, %xbc: tensor<?x32xf32>, %w: tensor<32x1x5xf32>) -> tensor<?x32xf32> {
  // expected-error @below {{conv weight has shape [32, 1, 5], expected [32, 1, 4]}}
  %c = nf_kv.causal_conv @ssm, %b, %xbc, %w {mode = "decode"} : (!nf_kv.batch, tensor<?x32xf32>, tensor<32x1x5xf32>) -> tensor<?x32xf32>
  return %c : tensor<?x32xf32>
}

// -----

nf_kv.mamba_state @ssm layer 0 : !nf_kv.mamba_state<slots = 4, convDim = 32, convWindow = 3, numHeads = 4, headDim = 4, stateSize = 4>
func.func @groups(%b: !nf_kv.batch, %xbc: tensor<?x32xf32>, %dt: tensor<?x4xf32>, %v: tensor<4xf32>) -> tensor<?x16xf32> {
  // expected-error @below {{n_groups (3) must divide num_heads (4)}}
  %y = nf_kv.ssm_update @ssm, %b, %xbc, %dt, %v, %v, %v {n_groups = 3 : i64, time_step_min = 0.0 : f64, time_step_max = 1.0 : f64} : (!nf_kv.batch, tensor<?x32xf32>, tensor<?x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// -----

nf_kv.mamba_state @ssm layer 0 : !nf_kv.mamba_state<slots = 4, convDim = 32, convWindow = 3, numHeads = 4, headDim = 4, stateSize = 4>
func.func @limits(%b: !nf_kv.batch, %xbc: tensor<?x32xf32>, %dt: tensor<?x4xf32>, %v: tensor<4xf32>) -> tensor<?x16xf32> {
  // expected-error @below {{time step limits must satisfy 0 <= min <= max}}
  %y = nf_kv.ssm_scan @ssm, %b, %xbc, %dt, %v, %v, %v {chunk_size = 8 : i64, n_groups = 2 : i64, time_step_min = 1.0 : f64, time_step_max = 0.5 : f64} : (!nf_kv.batch, tensor<?x32xf32>, tensor<?x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}

// -----

// expected-error @below {{hot_window needs an f8E4M3FN cache, got 'bf16'}}
nf_kv.kv_cache @kv layer 1 {hot_window = 64 : i64} : !nf_kv.kv_cache<pageSize = 16, numPages = 8, kvHeads = 2, headDim = 4, elementType = bf16>

// -----

// expected-error @below {{hot_window must be positive, got 0}}
nf_kv.kv_cache @kv layer 1 {hot_window = 0 : i64} : !nf_kv.kv_cache<pageSize = 16, numPages = 8, kvHeads = 2, headDim = 4, elementType = f8E4M3FN>
