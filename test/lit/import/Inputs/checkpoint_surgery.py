#!/usr/bin/env python3
"""Derive a modified checkpoint from a good one, for import tests.

    checkpoint_surgery.py SRC DST CASE

copies SRC (config.json + model.safetensors) to DST with one change, named by
CASE. Positive cases rewrite the checkpoint into another valid layout (sharded,
stacked experts, Hub-spelling config); negative cases break one thing. Only
the Python standard library is used, so CI needs nothing extra.
"""
import json
import os
import shutil
import struct
import sys


def read_st(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    data = blob[8 + n :]
    tensors = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        tensors[name] = (info["dtype"], list(info["shape"]), data[b:e])
    return tensors, meta


def write_st(path, tensors, meta=None):
    header, chunks, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def load_config(dst):
    with open(os.path.join(dst, "config.json")) as f:
        return json.load(f)


def save_config(dst, cfg):
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def first(tensors, suffix):
    return sorted(n for n in tensors if n.endswith(suffix))[0]


def main():
    src, dst, case = sys.argv[1:4]
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "config.json"), dst)
    st_path = os.path.join(dst, "model.safetensors")
    tensors, meta = read_st(os.path.join(src, "model.safetensors"))
    cfg = load_config(dst)

    if case == "missing-config-field":
        del cfg["hidden_size"]
        save_config(dst, cfg)
    elif case == "unknown-layer-type":
        cfg["layers_block_type"][1] = "convolution"
        save_config(dst, cfg)
    elif case == "bad-config-json":
        with open(os.path.join(dst, "config.json"), "w") as f:
            f.write('{"hidden_size": 64,')
    elif case == "no-config":
        os.remove(os.path.join(dst, "config.json"))
    elif case == "no-weights":
        tensors = None
    elif case == "missing-tensor":
        del tensors[first(tensors, "mixer.in_proj.weight")]
    elif case == "wrong-shape":
        name = first(tensors, "mixer.out_proj.weight")
        dtype, shape, raw = tensors[name]
        row = len(raw) // shape[0]
        tensors[name] = (dtype, [shape[0] - 1] + shape[1:], raw[: row * (shape[0] - 1)])
    elif case == "unsupported-dtype":
        name = first(tensors, "norm_f.weight")
        dtype, shape, raw = tensors[name]
        n = 1
        for d in shape:
            n *= d
        tensors[name] = ("I8", shape, bytes(n))
    elif case == "truncated-header":
        write_st(st_path, tensors, meta)
        with open(st_path, "r+b") as f:
            f.truncate(100)
        tensors = None
    elif case == "corrupt-header":
        write_st(st_path, tensors, meta)
        with open(st_path, "r+b") as f:
            f.seek(8)
            f.write(b"\x00garbage{{{")
        tensors = None
    elif case == "header-too-long":
        write_st(st_path, tensors, meta)
        with open(st_path, "r+b") as f:
            f.write(struct.pack("<Q", 1 << 40))
        tensors = None
    elif case == "sharded":
        names = sorted(tensors)
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half],
                  "model-00002-of-00002.safetensors": names[half:]}
        weight_map = {}
        for shard, part in shards.items():
            write_st(os.path.join(dst, shard), {n: tensors[n] for n in part}, meta)
            weight_map.update({n: shard for n in part})
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
        tensors = None
    elif case == "sharded-missing-shard":
        names = sorted(tensors)
        write_st(os.path.join(dst, "model-00001-of-00002.safetensors"), tensors, meta)
        weight_map = {n: "model-00001-of-00002.safetensors" for n in names}
        weight_map[names[-1]] = "model-00002-of-00002.safetensors"
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
        tensors = None
    elif case == "stacked-experts":
        # HF in-memory layout: model.* prefix, experts stacked per layer.
        out, experts = {}, {}
        for name, t in tensors.items():
            new = "model." + name[len("backbone."):] if name.startswith("backbone.") else name
            parts = new.split(".")
            if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
                i = parts.index("experts")
                key = ".".join(parts[: i + 1] + [parts[i + 2]])  # ...experts.up_proj
                experts.setdefault(key, {})[int(parts[i + 1])] = t
            else:
                out[new] = t
        for key, per in experts.items():
            dtype, shape, _ = per[0]
            out[key] = (dtype, [len(per)] + shape, b"".join(per[j][2] for j in range(len(per))))
        tensors = out
    elif case == "hub-config":
        # The spelling of configs on the Hub: a pattern string and legacy aliases.
        letters = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
        kinds = cfg.pop("layers_block_type")
        cfg["hybrid_override_pattern"] = "".join(letters[k] for k in kinds)
        cfg["num_hidden_layers"] = len(kinds)
        cfg["mamba_n_groups"] = cfg.pop("n_groups")
        cfg["mamba_d_conv"] = cfg.pop("conv_kernel")
        cfg["attention_head_dim"] = cfg.pop("head_dim")
        cfg["rms_norm_eps"] = cfg.pop("layer_norm_epsilon")
        cfg.pop("time_step_limit", None)
        save_config(dst, cfg)
    else:
        sys.exit("unknown case " + case)

    if tensors is not None:
        write_st(st_path, tensors, meta)


if __name__ == "__main__":
    main()
