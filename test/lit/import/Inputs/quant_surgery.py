#!/usr/bin/env python3
"""Derive a modified quantised checkpoint from a good one, for import tests.

    quant_surgery.py SRC DST CASE

copies SRC (config.json, hf_quant_config.json when present, model.safetensors)
to DST with one change, named by CASE. Every case breaks one thing the
importer must refuse with a one-line error. Only the Python standard library
is used (and checkpoint_surgery's safetensors reader and writer).
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_surgery import read_st, write_st  # noqa: E402


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def main():
    src, dst, case = sys.argv[1:4]
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    for f in ("config.json", "hf_quant_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    tensors, meta = read_st(os.path.join(src, "model.safetensors"))
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg.get("quantization_config")
    hfq_path = os.path.join(dst, "hf_quant_config.json")
    hfq = None
    if os.path.exists(hfq_path):
        with open(hfq_path) as f:
            hfq = json.load(f)
    group = None
    if qc and "config_groups" in qc:
        group = qc["config_groups"]["group_0"]
    in_proj = "backbone.layers.0.mixer.in_proj"

    # config.json / hf_quant_config.json: unsupported or inconsistent schemes.
    if case == "quant-method":
        qc["quant_method"] = "awq"
    elif case == "no-quant-method":
        del qc["quant_method"]
    elif case == "ct-format":
        qc["format"] = "nvfp4-pack-quantized"
        group["format"] = "nvfp4-pack-quantized"
    elif case == "ct-int8-weights":
        group["weights"].update(type="int", num_bits=8)
    elif case == "ct-block-weights":
        group["weights"].update(strategy="block", block_structure=[128, 128])
    elif case == "ct-asymmetric":
        group["weights"]["symmetric"] = False
    elif case == "ct-actorder-group":
        group["weights"]["actorder"] = "group"
    elif case == "ct-dynamic-tensor-inputs":
        group["input_activations"]["strategy"] = "tensor"
    elif case == "ct-output-activations":
        group["output_activations"] = dict(group["input_activations"])
    elif case == "ct-sparsity":
        qc["sparsity_config"] = {"format": "sparse-24-bitmask"}
    elif case == "ct-status":
        qc["quantization_status"] = "frozen"
    elif case == "ct-bad-regex":
        qc["ignore"].append("re:(unclosed")
    elif case == "ct-int4-with-inputs":
        group["input_activations"] = {"type": "float", "num_bits": 8,
                                      "dynamic": True, "strategy": "token"}
    elif case == "modelopt-algo":
        hfq["quantization"]["quant_algo"] = "NVFP4"
    elif case == "modelopt-disagree":
        # config.json says compressed-tensors, hf_quant_config.json ModelOpt.
        qc = {"quant_method": "compressed-tensors",
              "config_groups": {"group_0": {
                  "targets": ["Linear"], "format": "float-quantized",
                  "weights": {"type": "float", "num_bits": 8, "strategy": "tensor"}}}}
    elif case == "modelopt-not-json":
        hfq = None
        with open(hfq_path, "w") as f:
            f.write('{"quantization": ')
    # Tensors that contradict the declared quantisation.
    elif case == "no-quant-config":
        del cfg["quantization_config"]
        qc = None
    elif case == "ct-ignored":
        qc["ignore"].append("re:.*in_proj$")
    elif case == "modelopt-excluded":
        hfq["quantization"]["exclude_modules"].append("backbone.layers.*.mixer.in_proj")
    elif case == "wrong-scheme":
        group["weights"].update(type="int", num_bits=4, strategy="group", group_size=8)
        group["format"] = "pack-quantized"
        qc["format"] = "pack-quantized"
        group["input_activations"] = None
    elif case == "missing-scale":
        del tensors[in_proj + ".weight_scale"]
    elif case == "missing-input-scale":
        del tensors[in_proj + ".input_scale"]
    elif case == "stray-input-scale":
        tensors[in_proj + ".input_scale"] = ("F32", [], b"\x00\x00\x80\x3f")
    elif case == "wrong-scale-shape":
        # Same number of elements, another shape.
        dtype, shape, raw = tensors[in_proj + ".weight_scale"]
        n = numel(shape)
        tensors[in_proj + ".weight_scale"] = (dtype, [2, n // 2] if n > 1 else [1, 1], raw)
    # Tensors the importer accepts (it reads headers only) but nfrun, which
    # reads the values, must refuse when binding the plan's weights.
    elif case == "bind-scale-shape":
        dtype, shape, raw = tensors[in_proj + ".weight_scale"]
        tensors[in_proj + ".weight_scale"] = (dtype, [2], raw + raw)
    elif case == "bind-zero-input-scale":
        tensors[in_proj + ".input_scale"] = ("F32", [], bytes(4))
    elif case == "zero-point":
        dtype, shape, raw = tensors[in_proj + ".weight_scale"]
        tensors[in_proj + ".weight_zero_point"] = ("I32", [shape[0], 1], bytes(4 * shape[0]))
    elif case == "fp8-router":
        name = "backbone.layers.1.mixer.gate.weight"
        dtype, shape, raw = tensors[name]
        tensors[name] = ("F8_E4M3", shape, raw[: numel(shape)])
        tensors["backbone.layers.1.mixer.gate.weight_scale"] = ("F32", [], b"\x00\x00\x80\x3f")
    elif case == "mixed-experts":
        # Expert 3 of layer 1 unquantised (F32 values) among fp8 experts.
        base = "backbone.layers.1.mixer.experts.3.up_proj"
        dtype, shape, raw = tensors[base + ".weight"]
        tensors[base + ".weight"] = ("F32", shape, bytes(4 * numel(shape)))
        del tensors[base + ".weight_scale"]
        tensors.pop(base + ".input_scale", None)
    elif case == "stacked-experts":
        # One [E, ...] tensor per projection: quantised experts must come one
        # tensor per expert.
        codes = "weight_packed" if in_proj + ".weight_packed" in tensors else "weight"
        for proj in ("up_proj", "down_proj"):
            base = "backbone.layers.1.mixer.experts."
            parts = [tensors.pop(base + "%d.%s.%s" % (j, proj, codes)) for j in range(8)]
            tensors[base + proj] = (parts[0][0], [8] + parts[0][1],
                                    b"".join(p[2] for p in parts))
    else:
        sys.exit("unknown case " + case)

    if qc is not None:
        cfg["quantization_config"] = qc
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if hfq is not None:
        with open(hfq_path, "w") as f:
            json.dump(hfq, f, indent=2)
    write_st(os.path.join(dst, "model.safetensors"), tensors, meta)


if __name__ == "__main__":
    main()
