#!/usr/bin/env python3
"""A checkpoint directory with the exact shape of Nemotron-3-Nano-30B-A3B.

    make_nano_shape.py OUT_DIR [--layers N] [--set KEY=VALUE ...] [--fp8 | --int4]

Writes OUT_DIR/config.json (the published Nano-30B-A3B configuration, see
docs of the reference: hidden 2688, 52 layers MEMEM*E..., 128 experts top-6,
Mamba 64 heads x 64, attention 32/2 heads x 128) and OUT_DIR/model.safetensors
with a complete header (every tensor, bf16, Hub names and shapes) over a
*sparse* data section: the file reports ~63 GB but occupies no disk, so
`nfc import` and `nfc compile` (which read headers only) work anywhere. The
benchmark fills the weights with seeded random values on the GPU instead of
reading them (nfrun bench --random-weights). `--layers N` keeps the first N
layers of the pattern (for quick checks); `--set KEY=VALUE` replaces one
integer of the configuration (e.g. hidden_size=64: the routing of 128
experts top-6 at a size a test can run on the CPU). `--fp8`: every linear
projection (not the routers, not the LM head) stored as FP8 E4M3 codes with
an f32 scale per output channel and unquantised activations, in the
compressed-tensors format that llm-compressor writes ("float-quantized",
`quantization_config` in config.json), the rest bf16. `--int4`: the same
projections as int4 codes packed 8 per int32 with an f32 scale per 64 input
columns, as llm-compressor's W4A16 writes them ("pack-quantized";
`weight_packed`, `weight_scale`, `weight_shape`): groups of 64, not the
usual 128, because the routed experts' down projection has 1,856 input
columns.
"""
import json
import os
import struct
import sys

PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"

CONFIG = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 2688,
    "hybrid_override_pattern": PATTERN,
    "num_hidden_layers": len(PATTERN),
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "mamba_num_heads": 64,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "chunk_size": 128,
    "use_conv_bias": True,
    "use_bias": False,
    "mamba_hidden_act": "silu",
    "layer_norm_epsilon": 1e-5,
    "intermediate_size": 1856,
    "mlp_hidden_act": "relu2",
    "n_routed_experts": 128,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}


def tensors(cfg):
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, P, N, G, K = (cfg["mamba_num_heads"], cfg["mamba_head_dim"],
                      cfg["ssm_state_size"], cfg["n_groups"], cfg["conv_kernel"])
    I = nh * P
    CD = I + 2 * G * N
    DIN = I + CD + nh
    nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, Ie, Is = (cfg["n_routed_experts"], cfg["moe_intermediate_size"],
                 cfg["moe_shared_expert_intermediate_size"])
    yield "backbone.embeddings.weight", [V, H]
    for i, kind in enumerate(cfg["hybrid_override_pattern"]):
        p = "backbone.layers.%d." % i
        yield p + "norm.weight", [H]
        m = p + "mixer."
        if kind == "M":
            yield m + "in_proj.weight", [DIN, H]
            yield m + "conv1d.weight", [CD, 1, K]
            yield m + "conv1d.bias", [CD]
            yield m + "dt_bias", [nh]
            yield m + "A_log", [nh]
            yield m + "D", [nh]
            yield m + "norm.weight", [I]
            yield m + "out_proj.weight", [H, I]
        elif kind == "*":
            yield m + "q_proj.weight", [nq * hd, H]
            yield m + "k_proj.weight", [nkv * hd, H]
            yield m + "v_proj.weight", [nkv * hd, H]
            yield m + "o_proj.weight", [H, nq * hd]
        elif kind == "-":
            yield m + "up_proj.weight", [cfg["intermediate_size"], H]
            yield m + "down_proj.weight", [H, cfg["intermediate_size"]]
        elif kind == "E":
            yield m + "gate.weight", [E, H]
            yield m + "gate.e_score_correction_bias", [E]
            for j in range(E):
                yield m + "experts.%d.up_proj.weight" % j, [Ie, H]
                yield m + "experts.%d.down_proj.weight" % j, [H, Ie]
            yield m + "shared_experts.up_proj.weight", [Is, H]
            yield m + "shared_experts.down_proj.weight", [H, Is]
    yield "backbone.norm_f.weight", [H]
    yield "lm_head.weight", [V, H]


# compressed-tensors FP8, weights per channel, activations unquantised.
FP8_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                    "symmetric": True, "dynamic": False, "group_size": None},
        "input_activations": None,
        "output_activations": None,
    }},
    "ignore": ["lm_head"],
}


# compressed-tensors W4A16: int4 weights in groups, activations unquantised.
INT4_GROUP = 64
INT4_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                    "symmetric": True, "dynamic": False,
                    "group_size": INT4_GROUP},
        "input_activations": None,
        "output_activations": None,
    }},
    "ignore": ["lm_head"],
}


def quantised(name):
    """Whether --fp8 stores tensor `name` as codes: linear projections."""
    return name.endswith("proj.weight")


def main():
    out = sys.argv[1]
    cfg = dict(CONFIG)
    fp8 = "--fp8" in sys.argv
    int4 = "--int4" in sys.argv
    if fp8 and int4:
        sys.exit("make_nano_shape: --fp8 or --int4, not both")
    if "--layers" in sys.argv:
        n = int(sys.argv[sys.argv.index("--layers") + 1])
        cfg["hybrid_override_pattern"] = PATTERN[:n]
        cfg["num_hidden_layers"] = n
    args = sys.argv[2:]
    for i, a in enumerate(args):
        if a == "--set":
            key, value = args[i + 1].split("=", 1)
            if key not in cfg:
                sys.exit("make_nano_shape: unknown configuration key " + key)
            cfg[key] = int(value)
    os.makedirs(out, exist_ok=True)
    if fp8 or int4:
        q = json.loads(json.dumps(FP8_CONFIG if fp8 else INT4_CONFIG))
        q["ignore"] += ["backbone.layers.%d.mixer.gate" % i
                        for i, k in enumerate(cfg["hybrid_override_pattern"]) if k == "E"]
        cfg["quantization_config"] = q
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    header, offset, params = {}, 0, 0

    def add(name, dtype, size, shape):
        nonlocal offset
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n * size]}
        offset += n * size
        return n

    for name, shape in tensors(cfg):
        if fp8 and quantised(name):
            params += add(name, "F8_E4M3", 1, shape)
            add(name + "_scale", "F32", 4, [shape[0], 1])
            continue
        if int4 and quantised(name):
            params += 8 * add(name + "_packed", "I32", 4, [shape[0], shape[1] // 8])
            add(name + "_scale", "F32", 4, [shape[0], shape[1] // INT4_GROUP])
            add(name + "_shape", "I64", 8, [2])
            continue
        # The correction bias is kept in f32, as in the published checkpoint.
        dtype, size = ("F32", 4) if name.endswith("e_score_correction_bias") else ("BF16", 2)
        params += add(name, dtype, size, shape)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = os.path.join(out, "model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.truncate(8 + len(text) + offset)  # sparse: no data blocks
    print("%s: %d tensors, %d parameters, %.1f GB of (sparse) %s data"
          % (path, len(header), params, offset / 1e9, "fp8 + bf16" if fp8 else "int4 + bf16" if int4 else "bf16"))


if __name__ == "__main__":
    main()
