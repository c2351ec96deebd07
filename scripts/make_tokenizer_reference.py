#!/usr/bin/env python3
"""Reference ids for nf's tokenizer tests (test/unit/tokenizer_test.cpp).

Encodes examples/pydoc-moe/eval.txt and a list of tricky strings with the
Hugging Face `tokenizers` library and writes

  test/data/tokenizer/pydoc-moe-reference.json
  test/data/tokenizer/variants/*.tokenizer.json   (small tokenizers trained
      here to exercise features the demo model does not use: Split regexes,
      templates, added-token options, byte fallback, unk, subword prefixes)
  test/data/tokenizer/variants-reference.json
  test/data/tokenizer/PROVENANCE.md

CI does not need `tokenizers`: the tests read these committed files.

  pip install tokenizers
  python3 scripts/make_tokenizer_reference.py

With --print-unicode-table it instead prints the general-category table that
runtime/src/text/unicode_table.cpp embeds. It must be Unicode 16.0, the
version of the Oniguruma (6.9.10) inside `tokenizers` 0.23, whose \\p{L} etc.
the table reproduces: `pip install unicodedata2==16.0.0` (Python's own
unicodedata is older).
"""

import argparse
import hashlib
import json
import os
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "test", "data", "tokenizer")
MODEL_TOKENIZER = "examples/pydoc-moe/tokenizer.json"
EVAL_TEXT = "examples/pydoc-moe/eval.txt"

TRICKY = [
    "",
    " ",
    "\n",
    "Hello, world!",
    "don't",
    "I'm here, you're there, we've done it, they'll see, he'd go.",
    "DON'T SHOUT'S 'LL",
    "'s 's's '' ''s x's",
    "  multiple   spaces  between    words  ",
    "trailing spaces   ",
    "   leading spaces",
    "\ttabs\tand\nnewlines\n\n\nblank lines\r\nwindows\r\n",
    "tab\t\tdouble\t \t mixed \n \n",
    "12345 678.9 1,000,000 3.14159 0x1F 2024-01-01",
    "mixed123abc456def",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m \u00fcber \u0141\u00f3d\u017a",
    "combining e\u0301 and a\u0300\u0300 marks",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587 \ud55c\uad6d\uc5b4",
    "emoji \U0001F600\U0001F44D\U0001F3FD family "
    "\U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F642\U0001F642\U0001F642",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0440\u0443\u0441\u0441"
    "\u043a\u0438\u0439 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1"
    "\u05e8\u05d9\u05ea \u0939\u093f\u0928\u094d\u0926\u0940",
    "\u0663\u0664\u0665 arabic digits, \u2167 roman, \u00b2\u00b3 superscripts",
    "\u01c5ungla \u02b0modifier \u2160\u2161",
    # Recent Unicode: Egyptian Ext-A and Garay letters (16.0), Nag Mundari
    # (15.0), digits numeric only for Rust's Unicode 17 (Digits), unassigned.
    "new\U00013460\U00010D50x \U0001E4D0 7\U00011DE0\U00016FF6 \U000E0080z",
    "math \U0001D465 + \U0001D466 \u2261 \u2211 \u00a9 \u2122 \u20ac5",
    "no\u00a0break\u00a0\u00a0space \u2028line\u2029para \u3000ideographic",
    "zero\u200bwidth \ufeffbom \x1c\x1d\x1f ctrl \x00 nul",
    "def f(x):\n    return x**2  # comment\n",
    "if (a && b || !c) { x[i] += y->z; } // done",
    'print("<s>" + \'</s>\')  # quotes',
    "<s>",
    "text with <s> inside and </s> at the end",
    "<pad><s></s>",
    "<s<s>>",
    "x [sep] y  [sep]\n z word word_ \u200dword \u0300word words sword",
    "case folding: it'\u017f 'S '\u212a \u212aelvin",
    "a" * 300,
    " " * 40 + "x",
    "\n" * 5 + "y",
    "The quick brown fox jumps over the lazy dog. " * 3,
]


def print_unicode_table():
    try:
        import unicodedata2 as ucd
    except ImportError:
        ucd = unicodedata
    if ucd.unidata_version != "16.0.0":
        sys.exit("need Unicode 16.0.0 data (pip install unicodedata2==16.0.0), "
                 "have %s" % ucd.unidata_version)
    cats = ("Lu Ll Lt Lm Lo Mn Mc Me Nd Nl No Pc Pd Ps Pe Pi Pf Po Sm Sc Sk So "
            "Zs Zl Zp Cc Cf Cs Co Cn").split()
    idx = {c: i for i, c in enumerate(cats)}
    n = 0x110000
    gc = [idx[ucd.category(chr(cp))] for cp in range(n)]
    lu, ll = idx["Lu"], idx["Ll"]
    runs = []
    cp = 0
    while cp < n:
        c = gc[cp]
        if c in (lu, ll):  # runs alternating Lu/Ll one by one: codes 30/31
            j = cp
            while j + 1 < n and gc[j + 1] in (lu, ll) and gc[j + 1] != gc[j]:
                j += 1
            if j - cp + 1 >= 4:
                runs.append((cp, 30 if c == lu else 31))
                cp = j + 1
                continue
        j = cp
        while j + 1 < n and gc[j + 1] == c:
            j += 1
        runs.append((cp, c))
        cp = j + 1
    print("// Unicode %s, %d runs" % (ucd.unidata_version, len(runs)))
    vals = ["0x%x" % ((s << 5) | c) for s, c in runs]
    for i in range(0, len(vals), 8):
        print("    " + ", ".join(vals[i:i + 8]) + ",")


def encode_case(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    with_special = tok.encode(text, add_special_tokens=True).ids
    return {
        "text": text,
        "ids": ids,
        "ids_with_special": with_special,
        "decoded": tok.decode(ids, skip_special_tokens=True),
        "decoded_keep_special": tok.decode(with_special,
                                           skip_special_tokens=False),
    }


def train_variants(eval_text):
    """Small tokenizers covering features pydoc-moe's tokenizer does not use."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,
                            pre_tokenizers, processors, trainers)

    corpus = [eval_text[i:i + 2000] for i in range(0, 120000, 2000)]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    variants = {}

    # Llama-3 style: Split regex (case-insensitive contractions, \p{N}{1,3},
    # lookahead) + ByteLevel without regex; BOS template; added tokens.
    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
              r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(llama3), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=700, initial_alphabet=alphabet, show_progress=False,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"]))
    bos = t.token_to_id("<|begin_of_text|>")
    t.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>",
                                                        bos)])
    t.add_tokens([AddedToken("[sep]", lstrip=True, rstrip=True,
                             normalized=False),
                  AddedToken("word", single_word=True, normalized=False)])
    variants["split-llama3"] = json.loads(t.to_str())

    # Tekken / Nemotron style: case-class regex with \p{Lu}\p{Ll}..\p{M},
    # single digits; merges stored as legacy "a b" strings; Sequence
    # post-processor adding <s> ... </s>.
    tekken = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*"
              r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
              r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
              r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(tekken), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=alphabet, show_progress=False,
        special_tokens=["<unk>", "<s>", "</s>"]))
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<s> $A </s>",
            special_tokens=[("<s>", t.token_to_id("<s>")),
                            ("</s>", t.token_to_id("</s>"))])])
    j = json.loads(t.to_str())
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                            for m in j["model"]["merges"]]
    variants["split-tekken"] = j

    # GPT-2 ByteLevel with add_prefix_space, Digits first, end-of-word suffix,
    # ignore_merges, RobertaProcessing.
    t = Tokenizer(models.BPE(end_of_word_suffix="</w>", ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=700, initial_alphabet=alphabet, show_progress=False,
        end_of_word_suffix="</w>", special_tokens=["<s>", "<pad>", "</s>"]))
    t.post_processor = processors.RobertaProcessing(
        ("</s>", t.token_to_id("</s>")), ("<s>", t.token_to_id("<s>")))
    variants["bytelevel-prefix-suffix"] = json.loads(t.to_str())

    # No byte-level mapping: Split on a literal space (merged with next),
    # continuing_subword_prefix, a restricted alphabet so that unknown
    # characters go to byte_fallback tokens where present, else fused <unk>;
    # null decoder (tokens joined by spaces).
    t = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True,
                             byte_fallback=True,
                             continuing_subword_prefix="##"))
    t.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_next")
    t.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=500, limit_alphabet=70, show_progress=False,
        continuing_subword_prefix="##", special_tokens=["<unk>"]))
    j = json.loads(t.to_str())
    vocab = j["model"]["vocab"]
    for b in "\u00e9".encode("utf-8") + b"#\t":
        name = "<0x%02X>" % b
        if name not in vocab:
            vocab[name] = len(vocab)
    variants["bytefallback-unk"] = j

    out = {}
    for name, j in variants.items():
        tok = Tokenizer.from_str(json.dumps(j))  # what the tests will read
        out[name] = (j, tok)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--print-unicode-table", action="store_true")
    args = ap.parse_args()
    if args.print_unicode_table:
        print_unicode_table()
        return

    import tokenizers
    from tokenizers import Tokenizer

    with open(os.path.join(ROOT, EVAL_TEXT), "rb") as f:
        eval_bytes = f.read()
    eval_text = eval_bytes.decode("utf-8")
    os.makedirs(os.path.join(OUT_DIR, "variants"), exist_ok=True)

    tok = Tokenizer.from_file(os.path.join(ROOT, MODEL_TOKENIZER))
    eval_ids = tok.encode(eval_text, add_special_tokens=False).ids
    assert tok.decode(eval_ids) == eval_text
    ref = {
        "tokenizers_version": tokenizers.__version__,
        "tokenizer": MODEL_TOKENIZER,
        "eval_file": EVAL_TEXT,
        "eval_sha256": hashlib.sha256(eval_bytes).hexdigest(),
        "eval_ids": eval_ids,
        "strings": [encode_case(tok, s) for s in TRICKY],
    }
    path = os.path.join(OUT_DIR, "pydoc-moe-reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print("wrote %s (%d eval ids)" % (path, len(eval_ids)))

    # Variants: every tricky string plus a slice of eval.txt.
    texts = TRICKY + [eval_text[200000:204000]]
    vref = {"tokenizers_version": tokenizers.__version__, "variants": []}
    for name, (j, vtok) in train_variants(eval_text).items():
        rel = "variants/%s.tokenizer.json" % name
        with open(os.path.join(OUT_DIR, rel), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, indent=1)
            f.write("\n")
        vref["variants"].append({
            "name": name,
            "tokenizer": rel,
            "strings": [encode_case(vtok, s) for s in texts],
        })
        print("wrote %s" % rel)
    path = os.path.join(OUT_DIR, "variants-reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(vref, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print("wrote %s" % path)

    with open(os.path.join(OUT_DIR, "PROVENANCE.md"), "w") as f:
        f.write(PROVENANCE.format(version=tokenizers.__version__,
                                  python=sys.version.split()[0]))


PROVENANCE = """\
# Tokenizer reference data

Produced by the Hugging Face `tokenizers` library, version {version}
(Python {python}), with `scripts/make_tokenizer_reference.py`:

    pip install tokenizers=={version}
    python3 scripts/make_tokenizer_reference.py

- `pydoc-moe-reference.json`: the ids `tokenizers` gives for the whole of
  `examples/pydoc-moe/eval.txt` (`eval_ids`, with the file's SHA-256) and for
  a list of tricky strings (unicode, emoji, CJK, accents, whitespace runs,
  digits, contractions, code, the special token texts), encoded with
  `examples/pydoc-moe/tokenizer.json`, with and without special tokens,
  and their decodings.
- `variants/*.tokenizer.json`: small BPE tokenizers trained by the script on
  the first 120 KB of eval.txt to cover features the demo tokenizer does not
  use (Split regexes in the Llama-3 and Tekken styles, template / Roberta /
  Sequence post-processors, added tokens with lstrip / rstrip / single_word,
  Digits, end_of_word_suffix, ignore_merges, legacy "a b" merges,
  continuing_subword_prefix, byte_fallback, fused unk, null decoder).
- `variants-reference.json`: their ids and decodings for the same strings
  plus a 4000-character slice of eval.txt.

Training is not bit-for-bit reproducible across runs (ties in the BPE
trainer), so a rerun may rewrite the variant tokenizers; their reference ids
are always computed from the files as written. The tests
(`test/unit/tokenizer_test.cpp`) only read these files; they do not need
`tokenizers`.
"""


if __name__ == "__main__":
    main()
