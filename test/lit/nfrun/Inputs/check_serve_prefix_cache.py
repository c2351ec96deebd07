"""Prefix caching in `nfrun serve`, through the official openai client.

Usage: check_serve_prefix_cache.py NFRUN PLAN

Prints "ok: ..." with the counts it saw; exits non-zero with a message
otherwise.
"""
import json
import sys
import time
import urllib.request

import openai

import serve_client

nfrun, plan = sys.argv[1:3]
servers = []


def fail(msg):
    for s in servers:
        s.kill()
    sys.exit("check_serve_prefix_cache: " + msg)


def unexpected(kind, value, tb):
    fail("%s: %s" % (kind.__name__, value))


sys.excepthook = unexpected

PROMPT = ("def mean(values):\n    \"\"\"Return the arithmetic mean of a "
          "non-empty list of numbers, as a float; raise ValueError when the "
          "list is empty.\"\"\"\n")


def complete(client, **extra):
    out = client.completions.create(model="m", prompt=PROMPT, max_tokens=6,
                                     temperature=0, **extra)
    return out.choices[0].text, out.usage


def health(base):
    return json.loads(serve_client.request(base, "/health")[1])


server, base = serve_client.start(nfrun, plan, [], fail, servers)
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)

text, usage = complete(client)
if usage.prompt_tokens_details.cached_tokens != 0:
    fail("first request: cached %s" % usage)
n = usage.prompt_tokens
again, usage2 = complete(client)
cached = usage2.prompt_tokens_details.cached_tokens
if again != text or cached != n - 1:
    fail("repeat: %r cached %d, want %r cached %d" % (again, cached, text,
                                                       n - 1))
# A salted request sees its salt's snapshots only.
if complete(client, extra_body=dict(cache_salt="a"))[1] \
        .prompt_tokens_details.cached_tokens != 0:
    fail("the salted request hit the unsalted cache")
salted, usage4 = complete(client, extra_body=dict(cache_salt="a"))
if salted != text or usage4.prompt_tokens_details.cached_tokens != n - 1:
    fail("salt 'a' again: %r %s" % (salted, usage4))
for bad in ("", 5):
    status, body = serve_client.request(base, "/v1/completions", dict(
        prompt=PROMPT, max_tokens=2, cache_salt=bad))
    if status != 400 or "'cache_salt' must be a non-empty string" not in body:
        fail("cache_salt %r: HTTP %d %s" % (bad, status, body))

with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
    samples = serve_client.metric_samples(r.read().decode())
queries = samples.get(("vllm:prefix_cache_queries_total", ()))
hits = samples.get(("vllm:prefix_cache_hits_total", ()))
if queries != 4 * n or hits != 2 * (n - 1):
    fail("metrics: queries %s hits %s, want %d and %d" % (
        queries, hits, 4 * n, 2 * (n - 1)))
if health(base)["prefix_cache_snapshots"] < 1:
    fail("/health counts no snapshot: %s" % health(base))
# The snapshots hold memory of their own (their state, at the least).
if samples.get(("nf:prefix_cache_snapshot_bytes", ()), 0) <= 0 or \
        health(base)["prefix_cache_bytes"] <= 0:
    fail("no snapshot memory reported: %s %s" % (
        samples.get(("nf:prefix_cache_snapshot_bytes", ())), health(base)))
if ("nf:prefix_cache_evictions_total", ()) not in samples:
    fail("metrics: no nf:prefix_cache_evictions_total")
status, body = serve_client.request(base, "/reset_prefix_cache", {})
if status != 200:
    fail("/reset_prefix_cache: HTTP %d %s" % (status, body))
for _ in range(100):
    h = health(base)
    if h["prefix_cache_snapshots"] == 0 and h["kv_pages_free"] == h["kv_pages"] \
            and h["prefix_cache_bytes"] == 0:
        break
    time.sleep(0.05)
else:
    fail("after /reset_prefix_cache: %s" % h)
if complete(client)[1].prompt_tokens_details.cached_tokens != 0:
    fail("a request after the reset hit the cache")

# n choices of a new prompt: one request per choice, choice i seeded with
# seed + i, and the prompt computed once (the other choices fork the
# snapshot before its last token: the cache's hits grow by n - 1 times
# that).
before = serve_client.metric_samples(urllib.request.urlopen(
    base + "/metrics", timeout=30).read().decode())
QUEUE = "class Queue:\n    \"\"\"A first-in first-out queue of items."
multi = client.completions.create(model="m", prompt=QUEUE, max_tokens=5,
                                  temperature=1, seed=7, n=3,
                                  extra_body=dict(ignore_eos=True))
if [c.index for c in multi.choices] != [0, 1, 2]:
    fail("n=3: choices %s" % multi.choices)
m = multi.usage.prompt_tokens
if multi.usage.completion_tokens != 15 or multi.usage.total_tokens != m + 15:
    fail("n=3: usage %s" % multi.usage)
for i, c in enumerate(multi.choices):
    one = client.completions.create(model="m", prompt=QUEUE, max_tokens=5,
                                    temperature=1, seed=7 + i,
                                    extra_body=dict(ignore_eos=True))
    if one.choices[0].text != c.text:
        fail("n=3: choice %d %r, the request seeded %d alone %r" % (
            i, c.text, 7 + i, one.choices[0].text))
after = serve_client.metric_samples(urllib.request.urlopen(
    base + "/metrics", timeout=30).read().decode())
key = ("vllm:prefix_cache_hits_total", ())
if after[key] - before[key] < 2 * (m - 1):
    fail("n=3: the cache's hits grew by %d, want at least %d" % (
        after[key] - before[key], 2 * (m - 1)))
# Streamed: the chunks of each index join to that choice's text, each
# index ends with its finish_reason, the usage counts them all.
texts, finishes, usage = {}, {}, None
for chunk in client.completions.create(
        model="m", prompt=QUEUE, max_tokens=5, temperature=1, seed=7, n=3,
        stream=True, stream_options={"include_usage": True},
        extra_body=dict(ignore_eos=True)):
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        texts[c.index] = texts.get(c.index, "") + c.text
        if c.finish_reason is not None:
            finishes[c.index] = c.finish_reason
if texts != {i: c.text for i, c in enumerate(multi.choices)} or \
        finishes != {0: "length", 1: "length", 2: "length"}:
    fail("streamed n=3: %s %s, whole %s" % (texts, finishes, [
        c.text for c in multi.choices]))
if usage is None or usage.completion_tokens != 15 or usage.prompt_tokens != m:
    fail("streamed n=3: usage %s" % usage)
for extra, want in ((dict(n=17), "'n' must be at most 16"),
                    (dict(n=0), "'n' must be in")):
    status, body = serve_client.request(base, "/v1/completions", dict(
        prompt=QUEUE, max_tokens=2, **extra))
    if status != 400 or want not in body:
        fail("%s: HTTP %d %s" % (extra, status, body))
serve_client.stop(server, fail)

server, base = serve_client.start(nfrun, plan, ["--no-enable-prefix-caching"],
                                  fail, servers)
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
complete(client)
off, usage = complete(client)
if off != text or usage.prompt_tokens_details.cached_tokens != 0:
    fail("caching off: %r %s" % (off, usage))
if health(base)["prefix_cache_snapshots"] != 0:
    fail("caching off: snapshots %s" % health(base))
serve_client.stop(server, fail)
print("ok: repeats hit (cached %d of %d prompt tokens), salts separate, "
      "metrics %d of %d, reset, n=3 prefilled once and streamed, off" % (
          cached, n, hits, queries))
