"""Structured output in `nfrun serve` through the official openai client:
response_format (json_object, json_schema), vLLM's structured_outputs and
guided_* fields, on pydoc-moe (a model that writes Python docstrings, not
JSON, when left alone).

Usage: check_serve_structured.py NFRUN PLAN CHAT_TEMPLATE

The references are the constraints themselves, checked here without the
grammar engine: a JSON parser and a validator of the schema's rules
(enum, integer range, boolean, required, no other properties), Python's
re.fullmatch, membership in the choices. Sampled requests (temperature 1,
several seeds) must all satisfy them where they end. With Nemotron 3's
template and --reasoning-parser nemotron_v3 the reasoning runs free (the
same as without a constraint) and the constraint applies after it; with
thinking off, from the first token. Bad fields get 400 naming them.
Prints "ok: ..." and exits 0; otherwise exits with a message.
"""
import json
import re
import sys

import serve_client

nfrun, plan, template = sys.argv[1:4]
servers = []


def fail(msg):
    for s in servers:
        s.kill()
    sys.exit("check_serve_structured: " + msg)


def unexpected(kind, value, tb):
    fail("%s: %s" % (kind.__name__, value))


sys.excepthook = unexpected

SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["function", "class", "module"]},
        "arguments": {"type": "integer", "minimum": 0, "maximum": 9},
        "public": {"type": "boolean"},
    },
    "required": ["kind", "arguments", "public"],
    "additionalProperties": False,
}


def satisfies(doc):
    """SCHEMA's rules, checked by hand."""
    return (isinstance(doc, dict) and set(doc) == set(SCHEMA["required"])
            and doc["kind"] in SCHEMA["properties"]["kind"]["enum"]
            and isinstance(doc["arguments"], int)
            and not isinstance(doc["arguments"], bool)
            and 0 <= doc["arguments"] <= 9
            and isinstance(doc["public"], bool))


server, base = serve_client.start(
    nfrun, plan, ["--chat-template", template,
                  "--reasoning-parser", "nemotron_v3"], fail, servers)
client = serve_client.openai_client(base)
PROMPT = "def add(a, b):\n    \"\"\"Return the sum"
MESSAGES = [{"role": "user", "content": "Describe add(a, b) as JSON."}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
checked = 0

# 1. json_schema, completions and chat, sampled: every answer that ends
#    satisfies the schema.
ended = 0
for seed in range(1, 7):
    c = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=80, temperature=1.0, seed=seed,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {
            "name": "thing", "schema": SCHEMA}},
            "structured_outputs": {"disable_any_whitespace": True}})
    ch = c.choices[0]
    m = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=80, temperature=1.0,
        seed=seed, response_format={"type": "json_schema", "json_schema": {
            "name": "thing", "schema": SCHEMA, "strict": True}},
        extra_body=dict(NO_THINKING, structured_outputs={
            "disable_any_whitespace": True}))
    for text, reason, what in ((ch.text, ch.finish_reason, "completion"),
                               (m.choices[0].message.content,
                                m.choices[0].finish_reason, "chat")):
        if reason != "stop":
            if not text.startswith("{"):
                fail("%s seed %d: %r does not start a JSON object" % (
                    what, seed, text))
            continue
        ended += 1
        checked += 1
        if not satisfies(json.loads(text)):
            fail("%s seed %d: %r does not satisfy the schema" % (
                what, seed, text))
if ended < 6:
    fail("only %d of 12 schema answers ended within 80 tokens" % ended)

# 2. guided_choice, guided_regex, structured_outputs.regex / choice,
#    json_object.
CHOICES = ["def", "class", "import os"]
for seed in range(1, 5):
    for body, ok in (
            ({"guided_choice": CHOICES}, lambda t: t in CHOICES),
            ({"structured_outputs": {"choice": CHOICES}},
             lambda t: t in CHOICES),
            ({"guided_regex": r"v[0-9]\.[0-9]{1,2}"},
             lambda t: re.fullmatch(r"v[0-9]\.[0-9]{1,2}", t)),
            ({"structured_outputs": {"regex": r"[a-z_]{2,8}\(\)"}},
             lambda t: re.fullmatch(r"[a-z_]{2,8}\(\)", t))):
        c = client.completions.create(model="m", prompt=PROMPT, max_tokens=24,
                                      temperature=1.0, seed=seed,
                                      extra_body=body)
        ch = c.choices[0]
        if ch.finish_reason != "stop" or not ok(ch.text):
            fail("%s seed %d: %r (%s)" % (body, seed, ch.text,
                                          ch.finish_reason))
        checked += 1
for seed in range(1, 4):
    m = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=48, temperature=1.0,
        seed=seed, response_format={"type": "json_object"},
        extra_body=NO_THINKING)
    text, reason = m.choices[0].message.content, m.choices[0].finish_reason
    if reason == "stop":
        if not isinstance(json.loads(text), dict):
            fail("json_object: %r is not an object" % text)
        checked += 1
    elif not text.startswith("{"):
        fail("json_object: %r does not start an object" % text)

# 3. Streamed: the deltas add up to the whole answer (greedy).
body = dict(model="m", messages=MESSAGES, max_tokens=40, temperature=0,
            guided_choice=CHOICES, **NO_THINKING)
whole = serve_client.request(base, "/v1/chat/completions", body)
if whole[0] != 200:
    fail("chat guided_choice: HTTP %d %s" % whole)
want = json.loads(whole[1])["choices"][0]["message"]["content"]
events, done = serve_client.stream(base, "/v1/chat/completions",
                                   dict(body, stream=True), fail)
got = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
if not done or got != want or want not in CHOICES:
    fail("streamed %r, whole %r" % (got, want))

# 4. Thinking on: the reasoning runs free (as without a constraint), and
#    the constraint waits for the block's end.
body = dict(model="m", messages=MESSAGES, max_tokens=24, temperature=0)
free = json.loads(serve_client.request(base, "/v1/chat/completions",
                                       body)[1])["choices"][0]
held = json.loads(serve_client.request(
    base, "/v1/chat/completions", dict(body, guided_choice=CHOICES))[1])
held = held["choices"][0]
if held["message"] != free["message"] or not free["message"].get(
        "reasoning_content"):
    fail("thinking on: constrained %s, free %s" % (held["message"],
                                                    free["message"]))

# 5. tool_choice "required" and a named function: the calls come as JSON
#    the grammar forces (vLLM's way) and satisfy the tools' schemas.
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "now",
                                      "description": "The time."}}]


def valid_call(call):
    args = json.loads(call["function"]["arguments"])
    if call["type"] != "function" or not call["id"]:
        return False
    if call["function"]["name"] == "now":
        return args == {}
    return (call["function"]["name"] == "get_weather"
            and set(args) == {"city", "days"}
            and isinstance(args["city"], str) and len(args["city"]) <= 12
            and isinstance(args["days"], int) and 1 <= args["days"] <= 7)


calls = 0
for seed in range(1, 5):
    for choice, reason in (({"type": "function",
                             "function": {"name": "get_weather"}}, "stop"),
                           ("required", "tool_calls")):
        extra = dict(structured_outputs={"disable_any_whitespace": True},
                     **NO_THINKING)
        body = dict(model="m", messages=MESSAGES, max_tokens=64,
                    temperature=1.0, seed=seed, tools=TOOLS,
                    tool_choice=choice)
        resp = client.chat.completions.create(extra_body=extra, **body)
        resp = (resp.model_dump() if hasattr(resp, "model_dump")
                else resp.model_extra)
        body.update(extra)
        ch = resp["choices"][0]
        if ch["finish_reason"] == "length":
            continue
        got = ch["message"].get("tool_calls") or []
        if (ch["finish_reason"] != reason or not got
                or ch["message"]["content"] is not None
                or not all(valid_call(c) for c in got)
                or (choice != "required"
                    and [c["function"]["name"] for c in got] != [
                        "get_weather"])):
            fail("tool_choice %s seed %d: %s" % (choice, seed, ch))
        calls += len(got)
        checked += 1
        if seed == 1:  # streamed: the same calls in one delta at the end
            events, done = serve_client.stream(
                base, "/v1/chat/completions", dict(body, stream=True), fail)
            deltas = [c for e in events
                      for c in e["choices"][0]["delta"].get("tool_calls", [])]
            strip = [dict(c["function"]) for c in deltas]
            if (not done or strip != [dict(c["function"]) for c in got]
                    or events[-1]["choices"][0]["finish_reason"] != reason):
                fail("streamed tool_choice %s: %s" % (choice, events))
if calls < 3:
    fail("only %d forced tool calls ended within 64 tokens" % calls)

# 6. Refusals name the field.
for extra, says in (
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "no-such-type"}}}},
         "invalid JSON schema"),
        ({"response_format": {"type": "json_schema"}}, "json_schema"),
        ({"response_format": {"type": "yaml"}}, "'response_format' type"),
        ({"guided_regex": "(unclosed"}, "invalid regex"),
        ({"guided_grammar": "root ::= nothing"}, "invalid grammar"),
        ({"guided_choice": []}, "'guided_choice'"),
        ({"guided_json": SCHEMA, "guided_regex": "a"},
         "only one structured-output constraint"),
        ({"structured_outputs": {"whitespace_pattern": " "}},
         "'structured_outputs.whitespace_pattern' is not supported"),
        ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend")):
    status, text = serve_client.request(
        base, "/v1/completions", dict(model="m", prompt=PROMPT, max_tokens=4,
                                      **extra))
    if status != 400 or says not in text or "\n" in json.loads(text)[
            "error"]["message"]:
        fail("%s: HTTP %d %s" % (extra, status, text))
for extra, says in (
        ({"tools": TOOLS, "tool_choice": {"type": "function",
                                          "function": {"name": "nope"}}},
         "which is not in 'tools'"),
        ({"tool_choice": "required"}, "needs 'tools'"),
        ({"tools": TOOLS, "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "only one"),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}},
         "'tool_choice' must be")):
    status, text = serve_client.request(
        base, "/v1/chat/completions", dict(model="m", messages=MESSAGES,
                                           max_tokens=4, **extra))
    if status != 400 or says not in text:
        fail("%s: HTTP %d %s" % (extra, status, text))
serve_client.stop(server, fail)
print("ok: %d constrained answers satisfy their constraints (%d forced tool "
      "calls); reasoning free" % (checked, calls))
