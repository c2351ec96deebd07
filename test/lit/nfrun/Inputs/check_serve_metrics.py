"""Checks `nfrun serve --api-key` and GET /metrics with the clients people
use: the official `openai` Python client (completions, chat, streaming,
errors, authentication) and prometheus_client's text parser.

Usage: check_serve_metrics.py NFRUN PLAN CHAT_TEMPLATE

Prints "ok: ..." on success; exits non-zero with a message otherwise.
"""
import sys
import urllib.request

import openai

import serve_client

nfrun, plan, template = sys.argv[1:4]
servers = []


def fail(msg):
    for s in servers:
        s.kill()
    sys.exit("check_serve_metrics: " + msg)


server, base = serve_client.start(
    nfrun, plan, ["--api-key", "sekret", "--chat-template", template], fail,
    servers)
client = openai.OpenAI(base_url=base + "/v1", api_key="sekret",
                       max_retries=0)

# Authentication: a wrong key and no key get 401; /health stays open.
try:
    openai.OpenAI(base_url=base + "/v1", api_key="wrong",
                  max_retries=0).completions.create(
        model="m", prompt="def f():", max_tokens=2)
    fail("a wrong key was accepted")
except openai.AuthenticationError as e:
    if e.status_code != 401:
        fail("a wrong key: HTTP %d" % e.status_code)
if serve_client.request(base, "/v1/models")[0] != 401:
    fail("/v1/models without a key was answered")
if serve_client.request(base, "/health")[0] != 200:
    fail("/health needs a key")

# Completions, chat, streaming and errors through the client.
models = client.models.list().data
if len(models) != 1:
    fail("models: %s" % models)
c = client.completions.create(model=models[0].id, prompt="def f():",
                              max_tokens=5, temperature=0)
if c.usage.completion_tokens != 5 or c.choices[0].finish_reason != "length":
    fail("completion: %s" % c)
streamed = "".join(
    ch.choices[0].text for ch in client.completions.create(
        model=models[0].id, prompt="def f():", max_tokens=5, temperature=0,
        stream=True))
if streamed != c.choices[0].text:
    fail("streamed %r, not %r" % (streamed, c.choices[0].text))
chat = client.chat.completions.create(
    model=models[0].id, messages=[{"role": "user", "content": "hello"}],
    max_tokens=3, temperature=0)
if chat.choices[0].message.role != "assistant" or \
        chat.usage.completion_tokens != 3:
    fail("chat: %s" % chat)
try:
    client.completions.create(model=models[0].id, prompt="x", top_p=0)
    fail("top_p 0 was accepted")
except openai.BadRequestError as e:
    if "top_p" not in str(e):
        fail("top_p 0: %s" % e)

# /metrics parses and counts what happened.
with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
    if not r.headers.get("Content-Type", "").startswith("text/plain"):
        fail("metrics content type %s" % r.headers.get("Content-Type"))
    text = r.read().decode()
samples = serve_client.metric_samples(text)


def value(name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


want = {
    ("vllm:request_success_total", (("finished_reason", "length"),)): 3,
    ("vllm:generation_tokens_total", ()): 13,
    ("vllm:time_to_first_token_seconds_count", ()): 3,
    ("vllm:e2e_request_latency_seconds_count", ()): 3,
    ("vllm:inter_token_latency_seconds_count", ()): 10,
    ("vllm:num_requests_running", ()): 0,
    ("nf:http_errors_total", (("status", "401"),)): 2,
    ("nf:http_errors_total", (("status", "400"),)): 1,
}
for (name, labels), expected in want.items():
    got = value(name, **dict(labels))
    if got != expected:
        fail("%s%s = %s, expected %s" % (name, dict(labels), got, expected))
for name in ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:prompt_tokens_total", "vllm:num_preemptions_total"):
    if value(name) is None:
        fail("no %s" % name)
serve_client.stop(server, fail)
print("ok: openai client (auth, completions, stream, chat, errors), "
      "/metrics (%d samples)" % len(samples))
