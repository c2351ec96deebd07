#!/usr/bin/env python3
"""Hugging Face transformers on the same GPU and the same model shape: the
peer nf's CUDA backend is compared with (docs/performance.md).

    python3 bench/hf_baseline.py CHECKPOINT_DIR [--out results.json]

CHECKPOINT_DIR holds a config.json (bench/make_nano_shape.py writes the
Nemotron-3-Nano-30B-A3B one); weights are random bf16, created on the GPU
(the same shapes as the real checkpoint; values do not change the speed of
a dense model, and the router's choices stay spread over experts).
Measures, with CUDA events after warm-up:
  - the device-to-device copy bandwidth and the bf16 matmul rate (ceilings),
  - prefill tokens/s for 1K and 8K prompts (batch 1),
  - decode tokens/s at batch 1, 8, 32, 64 with a 1K context.
"""
import argparse
import json
import time

import torch


def timed(fn, warmup=2, reps=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return times[len(times) // 2]


def ceilings():
    n = 2 * 1024**3  # 2 GiB each way
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), warmup=3, reps=10)
    copy_bw = 2 * n / t  # bytes read + written
    m = 8192
    a = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    t = timed(lambda: a @ b, warmup=3, reps=10)
    return {"copy_bytes_per_s": copy_bw, "bf16_matmul_flops": 2 * m**3 / t}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--out", default="hf_baseline.json")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--prompts", default="1024,8192")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--ceilings-only", action="store_true")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, NemotronHConfig

    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    results["ceilings"] = ceilings()
    print("ceilings:", results["ceilings"], flush=True)
    if args.ceilings_only:
        json.dump(results, open(args.out, "w"), indent=2)
        return

    cfg = NemotronHConfig(**json.load(open(args.checkpoint + "/config.json")))
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    results["init_s"] = time.time() - t0
    print("model ready in %.1f s" % results["init_s"], flush=True)
    V = cfg.vocab_size

    prefill = {}
    for L in [int(x) for x in args.prompts.split(",") if x]:
        ids = torch.randint(3, V, (1, L), device="cuda")
        with torch.no_grad():
            t = timed(lambda: model(ids, use_cache=False, logits_to_keep=1), warmup=1, reps=3)
        prefill[L] = L / t
        print("prefill %d: %.1f tok/s" % (L, L / t), flush=True)
    results["prefill_tok_s"] = prefill

    decode = {}
    for B in [int(x) for x in args.batches.split(",") if x]:
        ids = torch.randint(3, V, (B, args.context), device="cuda")
        with torch.no_grad():
            # Fill the 1K context in pieces: HF's PyTorch chunk scan
            # materialises [batch, chunks, chunk, chunk, heads] tensors that do
            # not fit for 32 x 1024 tokens at once.
            piece = args.context if B <= 8 else 128
            out = model(ids[:, :piece], use_cache=True, logits_to_keep=1)
            for i in range(piece, args.context, piece):
                out = model(ids[:, i:i + piece], past_key_values=out.past_key_values,
                            use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            token = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            steps = args.steps
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # one warm-up step, then the timed ones
            out = model(token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            a.record()
            for _ in range(steps):
                out = model(token, past_key_values=out.past_key_values, use_cache=True)
                token = out.logits[:, -1:].argmax(-1)
            b.record()
            torch.cuda.synchronize()
            t = a.elapsed_time(b) / 1e3 / steps
        decode[B] = B / t
        print("decode batch %d: %.1f tok/s (%.1f ms/step)" % (B, B / t, t * 1e3), flush=True)
        del cache, out
        torch.cuda.empty_cache()
    results["decode_tok_s"] = decode
    json.dump(results, open(args.out, "w"), indent=2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
