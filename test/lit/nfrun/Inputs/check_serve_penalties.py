"""Penalties and limits in `nfrun serve` (presence_penalty,
frequency_penalty, repetition_penalty, logit_bias, min_tokens), checked
against this file's own implementation of vLLM's rules on the model's
logits, through the official openai client.

Usage: check_serve_penalties.py NFRUN PLAN

For each setting the server generates greedily from a fixed prompt; then
`nfrun generate --dump-logits` computes the logits of the prompt and the
generated tokens (teacher forcing), and every generated token must be the
argmax of its row after the penalties as vLLM applies them (min_tokens,
logit_bias, repetition, frequency, presence), unless the two best
penalized logits lie within 1e-4. A penalty that is not applied, or
applied to the wrong tokens, picks other tokens. Also: logit_bias of 100
forces its token; min_tokens keeps a stop token out of the first tokens;
bad values get 400 naming the field.
Prints "ok: ..." and exits 0; otherwise exits with a message.
"""
import os
import sys
import tempfile

import serve_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_generate import generate  # noqa: E402

nfrun, plan = sys.argv[1:3]
servers = []


def fail(msg):
    for s in servers:
        s.kill()
    sys.exit("check_serve_penalties: " + msg)


def unexpected(kind, value, tb):
    fail("%s: %s" % (kind.__name__, value))


sys.excepthook = unexpected

PROMPT = [1, 17, 230, 45, 45, 301, 17, 88, 230, 5]
STEPS = 12


def penalized(row, prompt, out, s):
    """vLLM's rules on a copy of `row` before the draw of token len(out)."""
    row = list(row)
    if len(out) < s.get("min_tokens", 0):
        for t in s.get("stop_token_ids", []):
            row[t] = float("-inf")
    for t, b in s.get("logit_bias", {}).items():
        row[int(t)] += b
    rep = s.get("repetition_penalty", 1.0)
    if rep != 1.0:
        for t in set(prompt) | set(out):
            row[t] = row[t] / rep if row[t] > 0 else row[t] * rep
    for t in set(out):
        row[t] -= s.get("frequency_penalty", 0.0) * out.count(t)
        row[t] -= s.get("presence_penalty", 0.0)
    return row


def raw_rows(tokens):
    """The model's logits after each of `tokens` (nfrun generate)."""
    with tempfile.TemporaryDirectory() as tmp:
        dump, _ = generate(nfrun, plan, tokens, 1,
                           os.path.join(tmp, "d.safetensors"))
    (n, V), flat = dump["prefill_logits"]
    return [flat[i * V:(i + 1) * V] for i in range(n)]


server, base = serve_client.start(nfrun, plan, [], fail, servers)
client = serve_client.openai_client(base)


def complete(settings, **extra):
    out = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=STEPS, temperature=0,
        extra_body=dict(settings, return_token_ids=True, ignore_eos=True),
        **extra)
    return out.choices[0].model_extra["token_ids"]


plain = complete({})
settings = [
    {"presence_penalty": 1.5},
    {"frequency_penalty": 0.9},
    {"presence_penalty": -0.5, "frequency_penalty": 0.7},
    {"repetition_penalty": 1.8},
    {"repetition_penalty": 0.6},
    {"logit_bias": {str(plain[0]): -100, str(plain[1]): 3.5}},
    {"min_tokens": 6, "stop_token_ids": [plain[0], plain[2]]},
]
checked = changed = 0
for s in settings:
    out = complete(s)
    if len(out) != STEPS and "min_tokens" not in s:
        fail("%s: %d tokens" % (s, len(out)))
    changed += out != plain
    rows = raw_rows(PROMPT + out[:-1])
    for i, token in enumerate(out):
        row = penalized(rows[len(PROMPT) - 1 + i], PROMPT, out[:i], s)
        best = sorted(range(len(row)), key=lambda t: -row[t])
        if token != best[0] and row[best[0]] - row[token] > 1e-4:
            fail("%s: token %d is %d, vLLM's rule picks %d (%.5f vs %.5f)" % (
                s, i, token, best[0], row[token], row[best[0]]))
        checked += 1
if changed < len(settings) - 1:
    fail("only %d of %d settings changed the greedy tokens %s" % (
        changed, len(settings), plain))
forced = complete({"logit_bias": {"7": 100}})
if forced != [7] * STEPS:
    fail("logit_bias 100 on token 7 gave %s" % forced)
early = complete({"min_tokens": 5, "stop_token_ids": [plain[0]]})
if plain[0] in early[:5]:
    fail("min_tokens 5: stop token %d among the first tokens %s" % (
        plain[0], early))

for raw, words in ((b'{"prompt": [1], "presence_penalty": 3}', "'presence_penalty'"),
                   (b'{"prompt": [1], "repetition_penalty": 0}', "'repetition_penalty'"),
                   (b'{"prompt": [1], "logit_bias": {"x": 1}}', "'logit_bias'"),
                   (b'{"prompt": [1], "logit_bias": {"3": 101}}', "'logit_bias'"),
                   (b'{"prompt": [1], "min_tokens": 1.5}', "'min_tokens'"),
                   (b'{"prompt": [1], "max_tokens": 2, "min_tokens": 3}', "'min_tokens'")):
    status, text = serve_client.request(base, "/v1/completions", raw=raw)
    if status != 400 or words not in text:
        fail("%s: HTTP %d %s" % (raw, status, text))
serve_client.stop(server, fail)
print("ok: %d tokens under %d settings follow vLLM's rules, logit_bias "
      "forces, min_tokens holds" % (checked, len(settings)))
