"""Checks nf's traffic governance in `nfrun serve` through the official
openai client: X-Client-Intent, X-Request-Priority, X-Expert-Budget and the
body's priority / expert_budget, the hard limit (--max-new-tokens), the soft
limit (max_new_tokens_soft, X-Actual-New-Tokens), and what /metrics counts
of them (prometheus_client's parser). The plan runs the "budget" expert
policy, so the budget an intent sets shows in the routed-expert calls.

Usage: check_serve_traffic.py NFRUN PLAN CHAT_TEMPLATE

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
    sys.exit("check_serve_traffic: " + msg)


def unexpected(kind, value, tb):
    # An exception must not leave the server holding lit's pipe open.
    fail("%s: %s" % (kind.__name__, value))


sys.excepthook = unexpected


server, base = serve_client.start(
    nfrun, plan,
    ["--max-new-tokens", "8", "--chat-template", template,
     "--intent-budget", "interactive=1,batch=0.5,search=0.25"], fail,
    servers)
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
model = client.models.list().data[0].id


def metrics():
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        return serve_client.metric_samples(r.read().decode())


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0)


def complete(headers=None, **body):
    extra = {k: body.pop(k) for k in list(body)
             if k in ("priority", "expert_budget", "max_new_tokens_soft",
                      "ignore_eos", "stream_options")}
    return client.completions.with_raw_response.create(
        model=model, prompt=body.pop("prompt", "def parse(text):"),
        temperature=0, extra_headers=headers or {}, extra_body=extra, **body)


def refused(what, fragment, headers=None, **body):
    try:
        complete(headers, **body)
    except openai.BadRequestError as e:
        if fragment not in str(e):
            fail("%s: %s" % (what, e))
        return
    fail("%s was accepted" % what)


# Bad traffic fields get 400s that name them.
refused("an unknown intent", "X-Client-Intent",
        {"X-Client-Intent": "urgent"}, max_tokens=2)
refused("an unknown priority", "X-Request-Priority",
        {"X-Client-Intent": "batch", "X-Request-Priority": "top"},
        max_tokens=2)
refused("a budget header of 2", "X-Expert-Budget",
        {"X-Expert-Budget": "2"}, max_tokens=2)
refused("a body budget of 0", "expert_budget", expert_budget=0, max_tokens=2)
refused("a fractional priority", "priority", priority=1.5, max_tokens=2)
# The hard limit: more is refused; no limit of its own gets the limit.
refused("max_tokens above --max-new-tokens", "limit of 8", max_tokens=9)
chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "hello"}],
    temperature=0, extra_body={"ignore_eos": True})
if chat.usage.completion_tokens != 8 or chat.choices[0].finish_reason != \
        "length":
    fail("chat without max_tokens under --max-new-tokens 8: %s" % chat.usage)

# Completions' default (16) is cut to the limit, not refused.
c = complete(ignore_eos=True).parse()
if c.usage.completion_tokens != 8:
    fail("a completion without max_tokens: %s" % c.usage)

# The soft limit: granted here in full (the cache is free), said in the
# header and the usage.
raw = complete(max_new_tokens_soft=3, ignore_eos=True)
c = raw.parse()
if raw.headers.get("X-Actual-New-Tokens") != "3" or \
        c.usage.completion_tokens != 3:
    fail("soft limit 3: header %s, usage %s" %
         (raw.headers.get("X-Actual-New-Tokens"), c.usage))

# Streamed, the usage comes in a last chunk (stream_options.include_usage).
chunks = list(client.completions.create(
    model=model, prompt="def parse(text):", temperature=0, stream=True,
    stream_options={"include_usage": True},
    extra_body={"max_new_tokens_soft": 3, "ignore_eos": True}))
if chunks[-1].choices or chunks[-1].usage is None or \
        chunks[-1].usage.completion_tokens != 3 or \
        any(ch.usage for ch in chunks[:-1]):
    fail("streamed usage with soft limit 3: %s" % chunks[-1])
refused("stream_options without stream", "stream_options",
        max_tokens=2, stream_options={"include_usage": True})

# Budgets: an intent's default (scaled by priority), and explicit ones,
# show as the share of static top-k's expert calls each request spends.
before = metrics()


def spent(headers=None, budget=None, **body):
    """The routed-expert calls of one request over static top-k's, from
    /metrics; its usage must say the same, and that it ran at `budget`."""
    a = metrics()
    usage = complete(headers, max_tokens=6, ignore_eos=True,
                     **body).parse().usage.model_dump()
    b = metrics()
    calls = value(b, "nf:routed_expert_calls_total") - \
        value(a, "nf:routed_expert_calls_total")
    full = value(b, "nf:routed_expert_calls_topk_total") - \
        value(a, "nf:routed_expert_calls_topk_total")
    if full <= 0:
        fail("no routed-expert calls counted")
    per_layer = usage.get("expert_calls")
    if not isinstance(per_layer, list) or sum(per_layer) != calls or \
            abs(usage.get("expert_budget_spent", -1) - calls / full) > 1e-9:
        fail("usage %s against /metrics: %d calls of %d" %
             (usage, calls, full))
    if budget is not None and abs(usage["expert_budget"] - budget) > 1e-6:
        fail("usage.expert_budget %s, expected %s" %
             (usage["expert_budget"], budget))
    return calls / full


interactive = spent({"X-Client-Intent": "interactive"}, 1)
search = spent({"X-Client-Intent": "search"}, 0.25)
search_high = spent({"X-Client-Intent": "search",
                     "X-Request-Priority": "high"}, 0.325)
explicit = spent({"X-Client-Intent": "search", "X-Expert-Budget": "1"}, 1)
body_wins = spent({"X-Expert-Budget": "1"}, 0.25, expert_budget=0.25)
ignored = spent({"X-Request-Priority": "low"}, 1)  # no intent: the plan's
if not (interactive > 0.95 and search < 0.4 and search < search_high <
        interactive and explicit > 0.95 and body_wins < 0.4):
    fail("budget spent: interactive %.3f, search %.3f, search+high %.3f, "
         "search+X-Expert-Budget 1 %.3f, body 0.25 over header 1 %.3f" %
         (interactive, search, search_high, explicit, body_wins))

after = metrics()
labels = dict(finished_reason="length")
for intent, priority, n in (("interactive", "none", 1), ("search", "none", 2),
                            ("search", "high", 1), ("none", "none", 2)):
    got = value(after, "nf:requests_total", intent=intent,
                priority=priority, **labels) - \
        value(before, "nf:requests_total", intent=intent, priority=priority,
              **labels)
    if got != n:
        fail("nf:requests_total{%s,%s} grew by %s, expected %d" %
             (intent, priority, got, n))
layers = sum(v for (name, _), v in after.items()
             if name == "nf:expert_layer_calls_total")
experts = sum(v for (name, _), v in after.items()
              if name == "nf:expert_tokens_total")
if not (layers > 0 and layers == experts ==
        value(after, "nf:routed_expert_calls_total")):
    fail("expert calls: per layer %s, per expert %s, total %s" %
         (layers, experts, value(after, "nf:routed_expert_calls_total")))
if value(after, "nf:request_expert_budget_spent_count") < 6:
    fail("nf:request_expert_budget_spent has too few observations")
if value(after, "nf:expert_budget_violations_total") != 0:
    fail("budget violations: %s" %
         value(after, "nf:expert_budget_violations_total"))
serve_client.stop(server, fail)
print("ok: intent, priority, budgets (interactive %.2f, search %.2f, "
      "search+high %.2f), hard and soft limits, traffic metrics" %
      (interactive, search, search_high))
