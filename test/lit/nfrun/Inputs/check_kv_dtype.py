#!/usr/bin/env python3
"""A plan whose KV cache stores bf16 or fp8, against a fixture's Hugging Face
float64 references (computed with an f32-exact cache).

    check_kv_dtype.py NFRUN PLAN REFERENCE NAME DTYPE

Greedy `nfrun generate` of every prompt for as many steps as the reference
has. bf16 must keep every greedy token; fp8 may change some: each change is
reported with the reference's margin there (its top-1 minus top-2 logit).
The logits must differ from the reference by more than f32 rounding (the
cache does round); with bf16 they must stay within 5e-2 of max(1, max |ref|)
(fp8's error is reported: on these tiny random models, with 4 to 8 values
per scale, it reaches a few tenths). Prints one line.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_generate import generate, max_rel_error, read_safetensors  # noqa: E402

LIMIT = {"bf16": 5e-2, "fp8": float("inf")}


def main():
    nfrun, plan, reference, name, dtype = sys.argv[1:6]
    ref = read_safetensors(reference)
    prompts = sorted({k.split(".")[0] for k in ref if k.endswith(".tokens")})
    worst, changes = 0.0, []
    with tempfile.TemporaryDirectory() as tmp:
        for p in prompts:
            tokens = ref[p + ".tokens"][1]
            want = list(ref[p + ".greedy_tokens"][1])
            dump = os.path.join(tmp, p + ".safetensors")
            ours, _ = generate(nfrun, plan, tokens, len(want), dump,
                               "--threads", "1")
            got = list(ours["tokens"][1])
            rows = [ref[p + ".prefill_logits"][1]]
            # Steps compared up to the first changed token (after it the
            # contexts differ).
            steps = next((i for i, (a, b) in enumerate(zip(got, want))
                          if a != b), len(want))
            if steps < len(want):
                vocab = ref[p + ".prefill_logits"][0][-1]
                row = (ref[p + ".prefill_logits"][1][-vocab:] if steps == 0
                       else ref[p + ".greedy_logits"][1][(steps - 1) * vocab:
                                                         steps * vocab])
                top = sorted(row, reverse=True)
                changes.append("%s step %d (margin %.3g)" %
                               (p, steps, top[0] - top[1]))
            err = max_rel_error(ours["prefill_logits"][1],
                                ref[p + ".prefill_logits"][1])
            vocab = ref[p + ".prefill_logits"][0][-1]
            n = max(0, steps - 1) * vocab
            if n:
                err = max(err, max_rel_error(ours["step_logits"][1][:n],
                                             ref[p + ".greedy_logits"][1][:n]))
            worst = max(worst, err)
    if dtype == "bf16" and changes:
        sys.exit("%s bf16: greedy tokens changed: %s" % (name, ", ".join(changes)))
    if worst <= 1e-6:
        sys.exit("%s %s: logits equal the f32 reference (%.2g): the cache "
                 "does not round" % (name, dtype, worst))
    if worst > LIMIT[dtype]:
        sys.exit("%s %s: logit error %.3g exceeds %g" % (name, dtype, worst,
                                                         LIMIT[dtype]))
    print("ok: %s %s, %d prompts, worst relative error %.2g, %s" % (
        name, dtype, len(prompts), worst,
        "greedy tokens unchanged" if not changes
        else "changed: " + ", ".join(changes)))


if __name__ == "__main__":
    main()
