"""The codes and scales `nfc compile --weights` wrote, against the same
matrices quantised by llm-compressor (the fixtures' READMEs say how).

    check_quantized_weights.py fp8 OURS TOOL
    check_quantized_weights.py int4 OURS TOOL SOURCE

fp8: every F8_E4M3 `X.weight` of TOOL (tiny-nano-fp8-dynamic: per-channel
scales amax/448, codes cast round-to-nearest-even, data-free) must equal
our `X.weight.nfc_fp8` byte for byte, and its `X.weight_scale` our
`X.weight.nfc_fp8_scale`.
int4: TOOL (tiny-nano-w4a16) was made by GPTQ, whose codes are not
round-to-nearest, but whose scales are the observer's group amax/7.5: every
`X.weight_scale` must equal our `X.weight.nfc_int4_scale` byte for byte, and
our codes must be round-to-nearest of SOURCE's `X.weight` with those scales,
computed here independently (float32 arithmetic, ties to even, clamped to
[-8, 7], packed 8 per int32 low nibble first, stored offset by 8).
Prints "ok: <scheme>: N matrices ...".
"""
import json
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def f32(x):
    """x rounded to float32 (correctly rounded: one binary op in double
    then to float32 is the float32 result)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


scheme, ours_path, tool_path = sys.argv[1:4]
ours, tool = tensors(ours_path), tensors(tool_path)
count = 0
if scheme == "fp8":
    for name, (dtype, shape, data) in sorted(tool.items()):
        if dtype != "F8_E4M3":
            continue
        mine = ours.get(name + ".nfc_fp8")
        if mine is None or mine[2] != data or mine[1] != shape:
            sys.exit("%s: codes differ from the tool's" % name)
        scale = ours.get(name + ".nfc_fp8_scale")
        theirs = tool[name + "_scale"]
        if scale is None or scale[2] != theirs[2] or scale[1] != theirs[1]:
            sys.exit("%s: scales differ from the tool's" % name)
        count += 1
    print("ok: fp8: %d matrices, codes and scales equal to llm-compressor's" % count)
else:
    source = tensors(sys.argv[4])
    gptq_differ = total = 0
    for name, (dtype, shape, data) in sorted(tool.items()):
        if not name.endswith(".weight_packed"):
            continue
        base = name[:-len("_packed")]
        theirs_scale = tool[base + "_scale"]
        scale = ours.get(base + ".nfc_int4_scale")
        if scale is None or scale[2] != theirs_scale[2] or scale[1] != theirs_scale[1]:
            sys.exit("%s: scales differ from the tool's" % base)
        rows, groups = scale[1]
        scales = struct.unpack("<%df" % (rows * groups), scale[2])
        sdtype, sshape, sdata = source[base]
        assert sdtype == "F32"
        cols = sshape[1]
        w = struct.unpack("<%df" % (rows * cols), sdata)
        group = cols // groups
        words = (cols + 7) // 8
        expect = []
        for r in range(rows):
            for wd in range(words):
                word = 0
                for j in range(8):
                    c = 8 * wd + j
                    if c >= cols:
                        break
                    q = round(f32(w[r * cols + c] / scales[r * groups + c // group]))
                    q = max(-8, min(7, q))
                    word |= (q + 8) << (4 * j)
                expect.append(word)
        mine = ours.get(base + ".nfc_int4")
        packed = struct.pack("<%dI" % len(expect), *expect)
        if mine is None or mine[0] != "I32" or mine[2] != packed:
            sys.exit("%s: codes are not round-to-nearest" % base)
        gptq = struct.unpack("<%dI" % len(expect), data)
        for a, b in zip(expect, gptq):
            for j in range(8):
                total += 1
                gptq_differ += ((a >> 4 * j) & 15) != ((b >> 4 * j) & 15)
        count += 1
    print("ok: int4: %d matrices, scales equal to llm-compressor's, codes "
          "round-to-nearest (%.1f%% differ from its GPTQ codes)" % (
              count, 100.0 * gptq_differ / total))
