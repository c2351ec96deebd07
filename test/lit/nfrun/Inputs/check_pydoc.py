#!/usr/bin/env python3
"""nfrun generate against pydoc-moe's reference: for each of its prompts the
prefill logits within 1e-4 * max(1, max |ref|) and the 32 greedy tokens."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from check_generate import max_rel_error, read_safetensors  # noqa: E402


def main():
    nfrun, plan, reference = sys.argv[1:4]
    ref = read_safetensors(reference)
    prompts = sorted({k.split(".")[0] for k in ref if k.endswith(".tokens")})
    with tempfile.TemporaryDirectory() as tmp:
        for p in prompts:
            tokens = ref[p + ".tokens"][1]
            want = list(ref[p + ".greedy_tokens"][1])
            dump = os.path.join(tmp, p + ".safetensors")
            subprocess.run([nfrun, "generate", plan, "--threads", "1", "--ignore-eos",
                            "--prompt-tokens", ",".join(map(str, tokens)),
                            "--max-tokens", str(len(want)), "--dump-logits", dump],
                           check=True, stdout=subprocess.DEVNULL)
            ours = read_safetensors(dump)
            if list(ours["tokens"][1]) != want:
                sys.exit("%s: greedy tokens differ" % p)
            err = max_rel_error(ours["prefill_logits"][1], ref[p + ".prefill_logits"][1])
            if err > 1e-4:
                sys.exit("%s: prefill logits error %.3g" % (p, err))
    print("ok: %d prompts" % len(prompts))


if __name__ == "__main__":
    main()
