#!/usr/bin/env python3
"""A tiered KV cache (--kv-cache-dtype=fp8 --kv-hot-window=W) against the
same model with a bf16 cache, on one prompt of a fixture's references.

    check_kv_tiers.py NFRUN TIERED BF16 REFERENCE PROMPT STEPS WIDE

The prompt is prefilled in one step, so its logits see bf16 rows in both
plans and must be equal. A decode step reads the pages that left the hot
window as fp8: with WIDE=1 (a window longer than the whole generation) no
page leaves and every step's logits must equal the bf16 plan's; with WIDE=0
the steps must differ (pages were compressed) by at most 5e-2 of
max(1, max |bf16 logit|). Prints one line.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_generate import generate, max_rel_error, read_safetensors  # noqa: E402


def main():
    nfrun, tiered, bf16, reference, prompt, steps, wide = sys.argv[1:8]
    ref = read_safetensors(reference)
    tokens = ref[prompt + ".tokens"][1]
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for plan in (tiered, bf16):
            dump = os.path.join(tmp, os.path.basename(plan) + ".safetensors")
            out, _ = generate(nfrun, plan, tokens, int(steps), dump,
                              "--threads", "1")
            runs.append(out)
    t, b = runs
    if t["prefill_logits"][1] != b["prefill_logits"][1]:
        sys.exit("prefill logits differ from the bf16 cache's")
    steps_t, steps_b = t["step_logits"][1], b["step_logits"][1]
    if wide == "1":
        if steps_t != steps_b:
            sys.exit("step logits differ though no page left the window")
        print("ok: %d steps equal the bf16 cache's" % int(steps))
        return
    # Compared up to the first step whose token differs (after it the
    # contexts differ).
    vocab = len(b["prefill_logits"][1]) // b["prefill_logits"][0][0]
    toks_t, toks_b = list(t["tokens"][1]), list(b["tokens"][1])
    n = next((i for i, (x, y) in enumerate(zip(toks_t, toks_b)) if x != y),
             len(toks_b) - 1)
    n = min(n, len(steps_b) // vocab)
    err = max_rel_error(steps_t[:n * vocab], steps_b[:n * vocab])
    if err == 0.0:
        sys.exit("step logits equal the bf16 cache's: no page was compressed")
    if err > 5e-2:
        sys.exit("step logits differ from the bf16 cache's by %.3g" % err)
    print("ok: steps differ from the bf16 cache's by at most %.3g" % err)


if __name__ == "__main__":
    main()
