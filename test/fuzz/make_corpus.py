#!/usr/bin/env python3
"""Writes the seed corpora of test/fuzz/corpus/ from test/data and examples/.

Deterministic: rerunning it rewrites the same files. The plan seeds need a
built nfc (--nfc); without it they are left as they are. Crash inputs added
as regressions (corpus/<target>/crash-*) are never touched.

    python3 test/fuzz/make_corpus.py [--nfc build/bin/nfc]
"""
import argparse
import json
import os
import struct
import subprocess
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.path.join(ROOT, "test", "fuzz", "corpus")
DATA = os.path.join(ROOT, "test", "data")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path, mode="r"):
    with open(os.path.join(ROOT, path), mode) as f:
        return f.read()


# --- safetensors -----------------------------------------------------------

def safetensors(tensors, metadata=None, align=True):
    """tensors: [(name, dtype, shape, bytes)] in data order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if align:
        text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def archive(files):
    return b"%%FILE%%\n".join(name.encode() + b"\n" + body
                             for name, body in files)


def safetensors_seeds():
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    single = safetensors([("a.weight", "F32", [2, 2], f32),
                          ("b.bias", "BF16", [3], b"\x80\x3f" * 3),
                          ("c", "F16", [1], b"\x00\x3c"),
                          ("empty", "F32", [0, 4], b"")],
                         metadata={"format": "pt"})
    write("safetensors", "single", archive([("model.safetensors", single)]))
    # Odd offsets: the runtime copies such tensors to aligned memory.
    odd = safetensors([("x", "U8", [3], b"abc"), ("y", "F32", [2],
                                                   struct.pack("<2f", 5, 6))],
                      align=False)
    write("safetensors", "unaligned", archive([("model.safetensors", odd)]))
    shard1 = safetensors([("model.embed", "F32", [2], struct.pack("<2f", 1, 2))])
    shard2 = safetensors([("model.head", "BF16", [2, 1], b"\x00\x40" * 2),
                          ("model.norm", "F64", [1], struct.pack("<d", 1))])
    index = json.dumps({"metadata": {"total_size": 20}, "weight_map": {
        "model.embed": "model-00001-of-00002.safetensors",
        "model.head": "model-00002-of-00002.safetensors",
        "model.norm": "model-00002-of-00002.safetensors"}}, indent=1)
    write("safetensors", "sharded", archive([
        ("model.safetensors.index.json", index.encode()),
        ("model-00001-of-00002.safetensors", shard1),
        ("model-00002-of-00002.safetensors", shard2)]))


# --- config.json -------------------------------------------------------------

def config_seeds():
    for fx in sorted(os.listdir(os.path.join(DATA, "fixtures"))):
        p = os.path.join(DATA, "fixtures", fx, "config.json")
        if os.path.exists(p):
            write("hf_config", fx, read(p))
    write("hf_config", "pydoc-moe", read("examples/pydoc-moe/config.json"))


# --- tokenizers --------------------------------------------------------------

def shrink(tok, alphabet, max_merges=40):
    """The tokenizer with its vocabulary cut to `alphabet`'s symbols, the
    first merges they allow and the special/unk tokens: a few KB."""
    model = tok["model"]
    vocab = model["vocab"]
    keep = {t for t in vocab if len(t) == 1 and t in alphabet}
    keep |= {t for t in vocab if t.startswith("<") and t.endswith(">")
             and len(t) < 12}
    for prefix in (model.get("continuing_subword_prefix") or "",):
        if prefix:
            keep |= {prefix + c for c in alphabet if prefix + c in vocab}
    merges = []
    for m in model["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in keep and b in keep:
            suffix = model.get("continuing_subword_prefix") or ""
            res = a + (b[len(suffix):] if suffix and b.startswith(suffix)
                       else b)
            if res in vocab:
                keep.add(res)
                merges.append(m)
        if len(merges) >= max_merges:
            break
    out = dict(tok)
    out["model"] = dict(model, vocab={t: i for t, i in vocab.items()
                                      if t in keep}, merges=merges)
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def tokenizer_seeds():
    texts = [s["text"] for s in
             json.loads(read("test/data/tokenizer/pydoc-moe-reference.json"))
             ["strings"]]
    alphabet = set("ĠĊabcdefghilmnorstuwy ,.0123456789'") | {"<", ">"}
    for name in sorted(os.listdir(os.path.join(DATA, "tokenizer", "variants"))):
        tok = json.loads(read(os.path.join("test/data/tokenizer/variants",
                                           name)))
        stem = name.split(".")[0]
        write("tokenizer", stem,
              shrink(tok, alphabet) + "\0" + "The 123 tests, don't fail.")
    # tokenizer_encode: option byte (tokenizer % 5, 0x10 add special,
    # 0x20 skip special) + text.
    picks = [t for t in texts if t][:24]
    for i, text in enumerate(picks):
        opt = (i % 5) | (0x10 if i % 3 == 1 else 0) | (0x20 if i % 4 == 2 else 0)
        write("tokenizer_encode", "s%02d" % i, bytes([opt]) + text.encode())
    write("tokenizer_encode", "invalid-utf8", b"\x00ab\xff\xc3(\xe2\x82 <s>x")


# --- chat templates ----------------------------------------------------------

def chat_seeds():
    convs = json.loads(read("test/data/chat_templates/conversations.json"))
    for i, name in enumerate(sorted(
            n for n in os.listdir(os.path.join(DATA, "chat_templates"))
            if n.endswith(".jinja"))):
        tmpl = read(os.path.join("test/data/chat_templates", name))
        conv = convs[i % len(convs)]["messages"]
        parts = [tmpl, ""]
        for m in conv:
            content = m["content"]
            if not isinstance(content, str):
                content = json.dumps(content)
            parts += [m["role"], content]
        parts.append("")  # add_generation_prompt
        write("chat_template", name.split(".")[0], "\0".join(parts))
    snippets = json.loads(read("test/data/chat_templates/snippets.json"))
    for i, s in enumerate(snippets):
        ctx = json.dumps(s["context"], ensure_ascii=False) \
            if "context" in s else ""
        write("chat_template", "snippet%03d" % i, s["template"] + "\0" + ctx)


# --- serve requests ----------------------------------------------------------

def serve_request_seeds():
    # One option byte (bit 0: chat) and the JSON body of a request.
    completions = [
        dict(prompt="def f():", max_tokens=8, temperature=0),
        dict(prompt=[1, 412, 95], max_tokens=4, temperature=0.7, top_p=0.9,
             top_k=40, min_p=0.05, seed=3, stop=["\n\n", "def"],
             stream=True, return_token_ids=True, n=1),
        dict(prompt="x", stop="y", top_p=0, max_tokens=0),
        dict(prompt=[4095, -1], temperature=-1, seed=1e16),
        # nf's traffic fields and vLLM's extensions.
        dict(prompt="def g():", max_new_tokens_soft=3, priority=-2,
             expert_budget=0.5, ignore_eos=True, stream=True,
             stream_options={"include_usage": True}),
        dict(prompt="x", priority=18446744073709551615, expert_budget=0,
             stream_options={"include_usage": 1}),
    ]
    chats = [
        dict(messages=[{"role": "system", "content": "be brief"},
                       {"role": "user", "content": "hello"}],
             max_completion_tokens=5, temperature=0),
        dict(messages=[{"role": "user",
                        "content": [{"type": "text", "text": "a"},
                                    {"type": "text", "text": "b"}]}],
             stream=True, stop=None),
        dict(messages=[{"role": "user", "content": [{"type": "image_url"}]},
                       {"role": "assistant", "tool_calls": [{"id": 1}]}],
             tools=[{"type": "function"}]),
    ]
    for i, body in enumerate(completions):
        write("serve_request", "completion%d" % i,
              b"\x00" + json.dumps(body).encode())
    for i, body in enumerate(chats):
        write("serve_request", "chat%d" % i,
              b"\x01" + json.dumps(body).encode())


# --- plans -------------------------------------------------------------------

def plan_seeds(nfc):
    for fx in ("tiny-dense", "tiny-hybrid"):
        with tempfile.TemporaryDirectory() as tmp:
            mlir = os.path.join(tmp, "m.mlir")
            plan = os.path.join(tmp, "p.nfb")
            src = os.path.join(DATA, "fixtures", fx)
            subprocess.run([nfc, "import", src, "-o", mlir], check=True)
            # A small arena and cache keep the seeds fast to run.
            subprocess.run([nfc, "compile", mlir, "-o", plan,
                            "--max-tokens", "8", "--max-sequences", "2"],
                           check=True)
            write("plan", fx, read(plan, "rb"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nfc", help="nfc to compile the plan seeds with")
    args = ap.parse_args()
    safetensors_seeds()
    config_seeds()
    tokenizer_seeds()
    chat_seeds()
    serve_request_seeds()
    if args.nfc:
        plan_seeds(args.nfc)


if __name__ == "__main__":
    main()
