// A decode step's shared expert of 64 x 64 FP8 weights whose GEMMs quantise
// their inputs (static scales), for nf-cuda-kernel-scratch.
module {
  func.func @decode(%x: tensor<?x64xf32>) -> tensor<?x64xf32> attributes {nf.phase = "decode"} {
    %u = nf.weight ["up"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["up_s"], scale_types = [tensor<f32>], activations = static_per_tensor, input_scales = ["up_in"], input_scale_types = [tensor<f32>]> : tensor<64x64xf8E4M3FN>
    %d = nf.weight ["down"] quant <scheme = fp8_e4m3, storage = f8E4M3FN, granularity = per_tensor, symmetric = true, scales = ["down_s"], scale_types = [tensor<f32>], activations = static_per_tensor, input_scales = ["down_in"], input_scale_types = [tensor<f32>]> : tensor<64x64xf8E4M3FN>
    %r = nf.kernel "shared"(%x, %u, %d : tensor<?x64xf32>, tensor<64x64xf8E4M3FN>, tensor<64x64xf8E4M3FN>) -> tensor<?x64xf32> {
    ^bb0(%a: tensor<?x64xf32>, %b: tensor<64x64xf8E4M3FN>, %c: tensor<64x64xf8E4M3FN>):
      %s = nf_moe.shared_expert %a, %b, %c : (tensor<?x64xf32>, tensor<64x64xf8E4M3FN>, tensor<64x64xf8E4M3FN>) -> tensor<?x64xf32>
      nf.yield %s : tensor<?x64xf32>
    }
    return %r : tensor<?x64xf32>
  }
}
