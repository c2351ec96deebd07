#!/usr/bin/env python3
"""Two plans of one model, greedy generation on the CUDA backend: prints the
largest logit differences (prefill and every step) and any token mismatch.
For code changes that must not change results (or only by rounding).

  python3 scripts/compare_plan_logits.py NFRUN OLD.nfb NEW.nfb MODEL_DIR

Run from the repository root; MODEL_DIR has reference.safetensors (its
prompts are used), e.g. examples/pydoc-moe. Needs a GPU.
"""
import os, sys, tempfile
sys.path.insert(0, "test/lit/nfrun/Inputs")
from check_generate import generate, read_safetensors
nfrun, old, new, model = sys.argv[1:5]
ref = read_safetensors(os.path.join(model, "reference.safetensors"))
prompts = sorted({k.split(".")[0] for k in ref if k.endswith(".tokens")})
worst = 0.0
with tempfile.TemporaryDirectory() as tmp:
    for p in prompts:
        tokens = ref[p + ".tokens"][1]
        outs = []
        for tag, plan in (("old", old), ("new", new)):
            dump = os.path.join(tmp, p + tag + ".safetensors")
            out, log = generate(nfrun, plan, tokens, 48, dump, "--backend",
                                "cuda", "--weights", model)
            if "backend: cuda" not in log:
                sys.exit("%s %s: did not run on the CUDA backend" % (p, tag))
            outs.append(out)
        a, b = outs
        if list(a["tokens"][1]) != list(b["tokens"][1]):
            print("%s: tokens differ: %s vs %s" % (p, a["tokens"][1], b["tokens"][1]))
        for k in ("prefill_logits", "step_logits"):
            x, y = a[k][1], b[k][1]
            m = max(abs(v) for v in x)
            d = max(abs(u - v) for u, v in zip(x, y))
            worst = max(worst, d / max(m, 1.0))
            print("%s %s: max |diff| %.3g (max |logit| %.3g)" % (p, k, d, m))
print("worst relative diff %.3g" % worst)
