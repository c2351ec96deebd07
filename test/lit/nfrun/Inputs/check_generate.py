#!/usr/bin/env python3
"""nfrun generate against the Hugging Face references of a fixture.

    check_generate.py NFRUN PLAN REFERENCE [--prompts 0,1] [--batch-check]

For every prompt p{i} in REFERENCE (float64 HF outputs saved as f32/i64
safetensors): runs `NFRUN generate PLAN --prompt-tokens ... --dump-logits`
greedily for as many steps as the reference has, then checks
max |ours - ref| <= 1e-4 * max(1, max |ref|) for the prefill logits and the
step logits, and identical greedy tokens. Standard library only.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n :]
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        fmt = {"F32": "f", "I64": "q", "F64": "d", "I32": "i"}[info["dtype"]]
        count = (e - b) // struct.calcsize(fmt)
        out[name] = (info["shape"], struct.unpack("<%d%s" % (count, fmt), data[b:e]))
    return out


def max_rel_error(ours, ref):
    scale = max(1.0, max(abs(x) for x in ref))
    return max(abs(a - b) for a, b in zip(ours, ref)) / scale


def generate(nfrun, plan, tokens, steps, dump, *options):
    """Greedy `nfrun generate` of `steps` tokens after the prompt `tokens`,
    logits dumped to `dump`; returns (the dump, nfrun's stderr). Exits with
    nfrun's error when it fails."""
    cmd = [nfrun, "generate", plan, *options, "--ignore-eos",
           "--prompt-tokens", ",".join(str(t) for t in tokens),
           "--max-tokens", str(steps), "--dump-logits", dump]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s: nfrun failed (%d): %s" % (plan, r.returncode,
                                                 r.stderr[-400:]))
    return read_safetensors(dump), r.stderr


def main():
    nfrun, plan, reference = sys.argv[1:4]
    ref = read_safetensors(reference)
    prompts = sorted({k.split(".")[0] for k in ref if k.endswith(".tokens")})
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for p in prompts:
            tokens = ref[p + ".tokens"][1]
            steps = len(ref[p + ".greedy_tokens"][1])
            dump = os.path.join(tmp, p + ".safetensors")
            ours, _ = generate(nfrun, plan, tokens, steps, dump,
                               "--threads", "1")
            if list(ours["tokens"][1]) != list(ref[p + ".greedy_tokens"][1]):
                sys.exit("%s: greedy tokens differ: %s vs %s" % (
                    p, ours["tokens"][1], ref[p + ".greedy_tokens"][1]))
            for mine, theirs in (("prefill_logits", ".prefill_logits"),
                                 ("step_logits", ".greedy_logits")):
                if ours[mine][0] != ref[p + theirs][0]:
                    sys.exit("%s: %s has shape %s, reference %s" % (
                        p, mine, ours[mine][0], ref[p + theirs][0]))
                err = max_rel_error(ours[mine][1], ref[p + theirs][1])
                worst = max(worst, err)
                if err > 1e-4:
                    sys.exit("%s: %s error %.3g exceeds 1e-4" % (p, mine, err))
    print("ok: %d prompts, worst relative error %.2g" % (len(prompts), worst))


if __name__ == "__main__":
    main()
