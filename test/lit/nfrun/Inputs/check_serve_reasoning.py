"""nfrun serve with Nemotron 3 Nano's chat template: chat_template_kwargs
and the nemotron_v3 reasoning parser, on the demo model.

Usage: check_serve_reasoning.py NFRUN PLAN TEMPLATE

The demo model does not write <think> markup, so what is checked is the
split of whatever it writes, against the same split computed here from
/v1/completions of the prompt that Python's jinja2 renders (as transformers'
apply_chat_template, with the request's template variables):
  1. thinking on (the template's default): the prompt opens a think block,
     so the text up to </think> is reasoning_content (all of it when the
     block never closes, content null);
  2. chat_template_kwargs {"enable_thinking": false}: the prompt closes the
     block, the text is content, reasoning_content null;
  3. streaming gives the same parts as deltas;
  4. --default-chat-template-kwargs sets the default a request overrides;
  5. bad kwargs get 400, a bad default stops the server (one line, exit 1);
  6. responses carry nf's reasoning_trace: queue, prefill and generation
     latencies (the streamed one in its last chunk);
  7. /tokenize renders chat messages with the same template variables;
  8. tools reach the template as transformers passes them (tool_choice
     "none": not at all), and so do assistant tool calls (their arguments
     as objects) and tool results in the history; what the template cannot
     get (a tool_choice naming no tool, malformed tools or calls) gets 400
     (tool_choice "required" and named: check_serve_structured.py). The
     parsing of tool calls is unit-tested (test/unit/tool_parser_test.cpp):
     the demo model does not write them.
Prints "ok: ..." or the first difference (exit status 1).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_client  # noqa: E402
from serve_client import request  # noqa: E402

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit("check_serve_reasoning: Python's jinja2 is needed")

nfrun, plan, template_path = sys.argv[1:4]
servers = []



def counts(usage):
    """A usage's token counts. The rest may differ between two requests of
    one prompt: the second takes its prompt from the prefix cache
    (cached_tokens) and runs fewer tokens through the experts."""
    return {k: usage[k] for k in ("prompt_tokens", "completion_tokens",
                                  "total_tokens")}

def fail(msg):
    for s in servers:
        s.kill()
    sys.exit("check_serve_reasoning: " + msg)


def post(base, path, body):
    status, text = request(base, path, body)
    if status != 200:
        fail("%s: HTTP %d: %s" % (path, status, text))
    return json.loads(text)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False,
                                                   **kw)
with open(template_path, encoding="utf-8") as f:
    template = env.from_string(f.read())


def rendered(messages, tools=None, **kwargs):
    return template.render(messages=messages, tools=tools, documents=None,
                           add_generation_prompt=True, **kwargs)


def split(prompt, text):
    """(reasoning or None, content or None) as the nemotron_v3 parser
    splits the text generated after `prompt`."""
    opened = prompt.rfind("<think>") > prompt.rfind("</think>")
    if not opened:
        stripped = text.lstrip(" \n\r\t")
        if not stripped.startswith("<think>"):
            return None, text
        text, opened = stripped[len("<think>"):], True
    ends = [i for i in (text.find("</think>"), text.find("<tool_call>"))
            if i >= 0]
    if not ends:
        return text, None
    end = min(ends)
    reasoning, rest = text[:end], text[end:]
    if rest.startswith("</think>"):
        rest = rest[len("</think>"):].lstrip(" \n\r\t")
    return reasoning, rest if rest else None


messages = [{"role": "user", "content": "Write a function that sorts a list."}]


def check_trace(trace, what):
    steps = [t.get("step") for t in trace or []]
    if steps != ["queue", "prefill", "generation"] or \
            any(t["latency_ms"] < 0 for t in trace) or \
            trace[1]["latency_ms"] <= 0:
        fail("%s: reasoning_trace %s" % (what, trace))


def check(base, body, template_kwargs, what):
    prompt = rendered(messages, **template_kwargs)
    chat = post(base, "/v1/chat/completions", body)
    plain = post(base, "/v1/completions", dict(prompt=prompt, max_tokens=12,
                                                temperature=0))
    want = split(prompt, plain["choices"][0]["text"])
    msg = chat["choices"][0]["message"]
    got = (msg.get("reasoning_content"), msg.get("content"))
    if got != want or counts(chat["usage"]) != counts(plain["usage"]):
        fail("%s: %s, want %s (text %r)" % (what, chat, want,
                                           plain["choices"][0]["text"]))
    check_trace(chat.get("reasoning_trace"), what)
    # /tokenize renders the messages as the chat endpoint does.
    tok = dict(messages=messages)
    if "chat_template_kwargs" in body:
        tok["chat_template_kwargs"] = body["chat_template_kwargs"]
    count = post(base, "/tokenize", tok)["count"]
    if count != chat["usage"]["prompt_tokens"]:
        fail("%s: /tokenize counts %d tokens, the chat's prompt %d" % (
            what, count, chat["usage"]["prompt_tokens"]))
    return want


server, base = serve_client.start(
    nfrun, plan, ["--chat-template", template_path,
                  "--reasoning-parser", "nemotron_v3"], fail, servers)
body = dict(messages=messages, max_tokens=12, temperature=0)
on = check(base, body, {}, "thinking on")
if on[0] is None:
    fail("thinking on gave no reasoning_content")
off = check(base, dict(body, chat_template_kwargs={"enable_thinking": False}),
            {"enable_thinking": False}, "thinking off")
if off[0] is not None:
    fail("thinking off gave reasoning_content %r" % (off[0],))

# 3. Streaming: the deltas add up to the same parts.
events, done = serve_client.stream(base, "/v1/chat/completions",
                                   dict(body, stream=True), fail)
parts = {"reasoning_content": "", "content": ""}
for e in events:
    for key in parts:
        parts[key] += e["choices"][0]["delta"].get(key, "") or ""
if not done or (parts["reasoning_content"] or None, parts["content"] or
                None) != on:
    fail("stream %s, want %s" % (parts, on))
if events[-1]["choices"][0]["finish_reason"] is None:
    fail("the stream's last event has no finish_reason: %s" % events[-1])
check_trace(events[-1].get("reasoning_trace"), "stream")

# 5. Bad kwargs.
for kwargs, want in (([1], "'chat_template_kwargs' must be an object"),
                     ({"messages": []}, 'is not a template variable a request may set')):
    status, text = request(base, "/v1/chat/completions",
                           dict(body, chat_template_kwargs=kwargs))
    if status != 400 or want not in text:
        fail("chat_template_kwargs %s: HTTP %d %s" % (kwargs, status, text))
serve_client.stop(server, fail)

# 4. The server's default, overridden by a request.
server, base = serve_client.start(
    nfrun, plan, ["--chat-template", template_path,
                  "--reasoning-parser", "nemotron_v3",
                  "--default-chat-template-kwargs",
                  '{"enable_thinking": false}'], fail, servers)
if check(base, body, {"enable_thinking": False}, "default off") != off:
    fail("the server's default did not turn thinking off")
if check(base, dict(body, chat_template_kwargs={"enable_thinking": True}),
         {"enable_thinking": True}, "request on") != on:
    fail("a request's kwargs did not override the server's default")
serve_client.stop(server, fail)

# 8. Tools.
server, base = serve_client.start(
    nfrun, plan, ["--chat-template", template_path,
                  "--reasoning-parser", "nemotron_v3"], fail, servers)
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "days": {"type": "integer"}}, "required": ["city"]}}}]
history = messages + [
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function", "function": {
            "name": "get_weather",
            "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
# jinja2 gets what transformers gets: arguments as objects.
history_j = json.loads(json.dumps(history))
history_j[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris",
                                                          "days": 2}
for what, msgs, msgs_j, extra, tools_j in (
        ("tools", messages, messages, dict(tools=tools), tools),
        ("tool_choice none", messages, messages,
         dict(tools=tools, tool_choice="none"), None),
        ("tool history", history, history_j, dict(tools=tools), tools)):
    prompt = rendered(msgs_j, tools_j)
    chat = post(base, "/v1/chat/completions",
                dict(body, messages=msgs, **extra))
    plain = post(base, "/v1/completions", dict(prompt=prompt, max_tokens=12,
                                                temperature=0))
    msg = chat["choices"][0]["message"]
    want = split(prompt, plain["choices"][0]["text"])
    if counts(chat["usage"]) != counts(plain["usage"]) or \
            (msg.get("reasoning_content"), msg.get("content")) != want or \
            "tool_calls" in msg:
        fail("%s: %s, want %s of %r" % (what, chat, want, prompt))
for extra, want in ((dict(tools=tools, tool_choice={
                         "type": "function", "function": {"name": "f"}}),
                     "which is not in 'tools'"),
                    (dict(tools=[{"type": "function"}]), "tools[0] must be"),
                    (dict(tool_choice="auto"), "'tool_choice' needs 'tools'"),
                    (dict(messages=[{"role": "assistant", "content": None,
                                     "tool_calls": [{"type": "function",
                                                     "function": {
                                                         "name": "f",
                                                         "arguments": "{x"}}]}]),
                     "must be a JSON object text")):
    status, text = request(base, "/v1/chat/completions", dict(body, **extra))
    if status != 400 or want not in text:
        fail("%s: HTTP %d %s (want %r)" % (extra, status, text, want))
serve_client.stop(server, fail)

bad = subprocess.run([nfrun, "serve", plan, "--chat-template", template_path,
                      "--default-chat-template-kwargs", "[1]"],
                     capture_output=True, text=True, timeout=60)
if bad.returncode != 1 or bad.stderr.count("\n") != 1 or \
        "--default-chat-template-kwargs" not in bad.stderr:
    fail("a bad default: exit %d, %r" % (bad.returncode, bad.stderr))
print("ok: thinking on/off split as nemotron_v3 (reasoning %r), stream, "
      "server default and override, errors, reasoning_trace, tools" %
      (on[0][:20],))
