"""Logprobs in `nfrun serve` against a fixture's Hugging Face reference
logits, through the official openai client.

Usage: check_serve_logprobs.py NFRUN PLAN REFERENCE CHAT_PLAN TEMPLATE
           [--weights DIR] [--chat-weights DIR] [-- SERVE OPTIONS...]

SERVE OPTIONS go to every server (`--backend cuda` on a GPU machine); the
weights options to PLAN's and CHAT_PLAN's (plans compiled elsewhere).

REFERENCE: the fixture's reference.safetensors (per prompt pN: `tokens`,
`prefill_logits` [tokens, vocab], `greedy_tokens`, `greedy_logits`
[steps, vocab]: the row after feeding greedy token s, which draws token
s + 1, and `greedy_margins`). The server runs
with 7-token steps, so prompts are fed in chunks and share steps.

Checks, every logprob within 1e-4 of the reference's log-softmax:
- echo + logprobs=5, max_tokens 1 (what lm-evaluation-harness's
  local-completions sends for loglikelihood): the prompt's tokens (the
  first: null) and the generated token, each position's top 5 and its own
  token among its top_logprobs; usage says no prompt token came from the
  prefix cache (the prompt was sent before, so a snapshot exists);
- echo and the 12 greedy tokens' logprobs, all prompts at once (steps mixing prompt
  rows and decode rows; without prefix caching, so that last chunks are
  longer than a token), while a request without logprobs runs beside them
  and answers as it does alone;
- streamed: the chunks' logprobs joined equal the whole answer's;
- chat (CHAT_PLAN, with a tokenizer, and TEMPLATE): logprobs true with
  top_logprobs 3: one entry per completion token, its bytes the UTF-8 of
  its token, greedy tokens first in their lists;
- bad values get 400 naming the field.
Prints "ok: ..." and exits 0; otherwise exits with a message.
"""
import argparse
import json
import math
import os
import sys
import threading

import serve_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_generate import read_safetensors  # noqa: E402

argv = sys.argv[1:]
split = argv.index("--") if "--" in argv else len(argv)
ap = argparse.ArgumentParser()
for name in ("nfrun", "plan", "reference", "chat_plan", "template"):
    ap.add_argument(name)
ap.add_argument("--weights")
ap.add_argument("--chat-weights")
args = ap.parse_args(argv[:split])
nfrun, plan, reference, chat_plan, template = (
    args.nfrun, args.plan, args.reference, args.chat_plan, args.template)
options = argv[split + 1:]
chat_options = list(options)
if args.weights:
    options += ["--weights", args.weights]
if args.chat_weights:
    chat_options += ["--weights", args.chat_weights]
servers = []


def fail(msg):
    for s in servers:
        s.kill()
    sys.exit("check_serve_logprobs: " + msg)


def unexpected(kind, value, tb):
    fail("%s: %s" % (kind.__name__, value))


sys.excepthook = unexpected

ref = read_safetensors(reference)
prompts = sorted({k.split(".")[0] for k in ref if k.endswith(".tokens")})


def rows(key):
    shape, flat = ref[key]
    V = shape[1]
    return [flat[i * V:(i + 1) * V] for i in range(shape[0])]


def log_softmax(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


def token_id(s):
    if not s.startswith("token_id:"):
        fail("token string %r: expected token_id:N (no tokenizer)" % s)
    return int(s[len("token_id:"):])


def close(ours, theirs, what):
    if ours is None or abs(ours - theirs) > 1e-4 * max(1.0, abs(theirs)):
        fail("%s: logprob %s, reference %.6f" % (what, ours, theirs))


def check_position(lp, i, row, token, what, k=5):
    """Position i of a completions logprobs object (k alternatives) against
    `row`."""
    want = log_softmax(row)
    if token_id(lp.tokens[i]) != token:
        fail("%s: token %s, expected %d" % (what, lp.tokens[i], token))
    close(lp.token_logprobs[i], want[token], what)
    top = {token_id(k): v for k, v in lp.top_logprobs[i].items()}
    if token not in top:
        fail("%s: its own token is not among its top_logprobs" % what)
    best = sorted(range(len(want)), key=lambda t: -want[t])[:k]
    listed = sorted(top.values(), reverse=True)
    for k, t in enumerate(best):
        close(listed[k], want[t], "%s: alternative %d" % (what, k))
    for t, v in top.items():
        close(v, want[t], "%s: alternative %d" % (what, t))


server, base = serve_client.start(
    nfrun, plan, ["--max-num-batched-tokens", "7", "--max-batch", "8"] + options,
    fail, servers)
client = serve_client.openai_client(base)

# Echo: every prompt token's logprob, the generated token's too.
checked = 0
for p in prompts:
    tokens = ref[p + ".tokens"][1]
    client.completions.create(model="m", prompt=tokens, max_tokens=1,
                              temperature=0)  # leaves snapshots
    out = client.completions.create(model="m", prompt=tokens, max_tokens=1,
                                    temperature=0, logprobs=5, echo=True)
    c = out.choices[0]
    lp = c.logprobs
    if len(lp.tokens) != len(tokens) + 1:
        fail("%s: %d logprob positions for %d prompt tokens + 1" % (
            p, len(lp.tokens), len(tokens)))
    if token_id(lp.tokens[0]) != tokens[0] or lp.token_logprobs[0] is not None \
            or lp.top_logprobs[0] is not None:
        fail("%s: the first prompt token has a logprob" % p)
    details = out.usage.prompt_tokens_details
    if details is not None and details.cached_tokens:
        fail("%s: %d prompt tokens from the prefix cache with echo" % (
            p, details.cached_tokens))
    prefill = rows(p + ".prefill_logits")
    for t in range(1, len(tokens)):
        check_position(lp, t, prefill[t - 1], tokens[t],
                       "%s prompt token %d" % (p, t))
    check_position(lp, len(tokens), prefill[-1],
                   ref[p + ".greedy_tokens"][1][0], "%s generated" % p)
    if lp.text_offset[0] != 0 or sorted(lp.text_offset) != lp.text_offset:
        fail("%s: text offsets %s" % (p, lp.text_offset))
    checked += len(tokens)

# Greedy continuations with logprobs, all at once, beside a plain request,
# without prefix caching (whose snapshot points would feed each prompt's
# last token alone).
serve_client.stop(server, fail)
server, base = serve_client.start(
    nfrun, plan, ["--max-num-batched-tokens", "7", "--max-batch", "8",
                  "--no-enable-prefix-caching"] + options, fail, servers)
client = serve_client.openai_client(base)
results = {}


def run(p, **extra):
    results[(p, "logprobs" in extra)] = client.completions.create(
        model="m", prompt=ref[p + ".tokens"][1], max_tokens=12,
        temperature=0, **extra)


alone = client.completions.create(model="m", prompt=ref["p2.tokens"][1],
                                  max_tokens=12, temperature=0,
                                  extra_body={"return_token_ids": True})
threads = [threading.Thread(target=run, args=(p,), kwargs={
    "logprobs": 2, "echo": True}) for p in prompts]
threads.append(threading.Thread(target=run, args=("p2",), kwargs={
    "extra_body": {"return_token_ids": True}}))
for t in threads:
    t.start()
for t in threads:
    t.join()
decoded = 0
for p in prompts:
    lp = results[(p, True)].choices[0].logprobs
    tokens = ref[p + ".tokens"][1]
    prefill = rows(p + ".prefill_logits")
    for t in range(1, len(tokens)):
        check_position(lp, t, prefill[t - 1], tokens[t],
                       "%s prompt token %d, batched" % (p, t), k=2)
    for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        setattr(lp, k, getattr(lp, k)[len(tokens):])  # the generated
    greedy = ref[p + ".greedy_tokens"][1]
    steps = [rows(p + ".prefill_logits")[-1]] + rows(p + ".greedy_logits")
    margins = ref[p + ".greedy_margins"][1]
    n = len(greedy)
    for i in range(n):
        if margins[i] < 1e-3:  # a near tie: the reference may go either way
            n = i
            break
    if len(lp.tokens) != 12:
        fail("%s: %d logprob positions for 12 tokens" % (p, len(lp.tokens)))
    for i in range(n):
        want = log_softmax(steps[i])
        if token_id(lp.tokens[i]) != greedy[i]:
            fail("%s step %d: token %s, reference %d" % (
                p, i, lp.tokens[i], greedy[i]))
        close(lp.token_logprobs[i], want[greedy[i]], "%s step %d" % (p, i))
        if len(lp.top_logprobs[i]) != 2:
            fail("%s step %d: %d alternatives, expected 2" % (
                p, i, len(lp.top_logprobs[i])))
        decoded += 1
plain = results[("p2", False)].choices[0]
if plain.logprobs is not None:
    fail("a request without logprobs got %s" % plain.logprobs)
if plain.model_extra.get("token_ids") != alone.choices[0].model_extra.get(
        "token_ids"):
    fail("a request beside logprob requests answered %s, alone %s" % (
        plain.model_extra.get("token_ids"),
        alone.choices[0].model_extra.get("token_ids")))

# Streamed: the chunks' logprobs joined are the whole answer's.
body = {"prompt": ref["p3.tokens"][1], "max_tokens": 6, "temperature": 0,
        "logprobs": 3, "echo": True}
whole = json.loads(serve_client.request(base, "/v1/completions", body)[1])
events, done = serve_client.stream(base, "/v1/completions",
                                   dict(body, stream=True), fail)
joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
          "text_offset": []}
for e in events:
    lp = e["choices"][0]["logprobs"] if e.get("choices") else None
    for k in joined:
        joined[k] += lp[k] if lp else []
if not done or joined != whole["choices"][0]["logprobs"]:
    fail("streamed logprobs %s, whole %s" % (
        json.dumps(joined)[:300], json.dumps(whole["choices"][0]["logprobs"])[:300]))

# Bad values.
for raw, words in ((b'{"prompt": [1, 2], "logprobs": 21}', "'logprobs'"),
                   (b'{"prompt": [1, 2], "logprobs": true}', "'logprobs'"),
                   (b'{"prompt": [1, 2], "echo": 1}', "'echo'")):
    status, text = serve_client.request(base, "/v1/completions", raw=raw)
    if status != 400 or words not in text:
        fail("%s: HTTP %d %s" % (raw, status, text))
serve_client.stop(server, fail)

# Chat.
server, base = serve_client.start(nfrun, chat_plan,
                                  ["--chat-template", template] + chat_options,
                                  fail, servers)
client = serve_client.openai_client(base)
out = client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "Sort a list"}],
    max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
content = out.choices[0].logprobs.content
if len(content) != out.usage.completion_tokens:
    fail("chat: %d logprob entries for %d tokens" % (
        len(content), out.usage.completion_tokens))
for e in content:
    if bytes(e.bytes) != e.token.encode("utf-8") or len(e.top_logprobs) != 3:
        fail("chat entry %s" % e)
    if e.top_logprobs[0].token != e.token or \
            abs(e.top_logprobs[0].logprob - e.logprob) > 1e-6 or \
            e.logprob > 0:
        fail("chat: greedy token %r (%f) is not first in %s" % (
            e.token, e.logprob, e.top_logprobs))
    if [t.logprob for t in e.top_logprobs] != sorted(
            (t.logprob for t in e.top_logprobs), reverse=True):
        fail("chat: alternatives out of order: %s" % e.top_logprobs)
for raw, words in ((b'{"messages": [{"role": "user", "content": "a"}], '
                    b'"top_logprobs": 2}', "'top_logprobs' needs"),
                   (b'{"messages": [{"role": "user", "content": "a"}], '
                    b'"logprobs": 3}', "'logprobs'")):
    status, text = serve_client.request(base, "/v1/chat/completions", raw=raw)
    if status != 400 or words not in text:
        fail("%s: HTTP %d %s" % (raw, status, text))
serve_client.stop(server, fail)
print("ok: %d prompt and %d generated logprobs match the reference, "
      "streamed = whole, chat %d entries" % (checked, decoded, len(content)))
