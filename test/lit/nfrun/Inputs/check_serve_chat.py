"""Checks `nfrun serve`'s /v1/chat/completions over HTTP (standard library
and Python's jinja2; the `openai` client too when it is installed).

Usage: check_serve_chat.py NFRUN PLAN TEMPLATE_DIR [BROKEN_WEIGHTS_DIR]

Starts `nfrun serve PLAN --chat-template TEMPLATE_DIR/mistral.jinja` and
checks that
  - a greedy chat completion equals a greedy /v1/completions of the prompt
    that Python's jinja2 renders from the same messages (the template with
    add_generation_prompt, bos_token and eos_token as nf takes them from
    the model's tokenizer: <s> and </s>): same text, finish reason and
    prompt tokens (the template writes the BOS; nothing is added again);
  - content given as text parts equals the same text as one string;
  - max_completion_tokens bounds the completion;
  - a streamed chat completion opens with the assistant role, its content
    deltas concatenate to the non-streamed text, and it ends with an empty
    delta carrying the finish reason, then [DONE];
  - bad requests get HTTP 400 with an OpenAI error object, among them the
    template's own raise_exception message (roles that do not alternate);
and that a server without a chat template answers HTTP 400 saying so.
With BROKEN_WEIGHTS_DIR (the model's weights and tokenizer beside a
chat_template.jinja that does not parse), also that a server started with
--weights there comes up, says once on stderr why its chat endpoint is
unavailable, serves /v1/completions, and answers chat requests with HTTP 400
giving the template's error.
Prints "ok: ..." on success; exits non-zero with a message otherwise.
"""
import json
import os
import sys

import serve_client
from serve_client import request

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit("check_serve_chat: Python's jinja2 is needed (Debian: "
             "python3-jinja2)")

nfrun, plan, template_dir = sys.argv[1:4]
broken_dir = sys.argv[4] if len(sys.argv) > 4 else None
template_path = os.path.join(template_dir, "mistral.jinja")
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
    sys.exit("check_serve_chat: " + msg)


def start(options):
    return serve_client.start(nfrun, plan, options, fail, servers)


def post(base, path, body):
    status, text = request(base, path, body)
    if status != 200:
        fail("%s: HTTP %d: %s" % (path, status, text))
    return json.loads(text)


def stop(server):
    serve_client.stop(server, fail)


# The prompt as transformers renders it.
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[jinja2.ext.loopcontrols])


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


env.globals["raise_exception"] = raise_exception
with open(template_path, encoding="utf-8") as f:
    template = env.from_string(f.read())


def rendered(messages):
    return template.render(messages=messages, tools=None, documents=None,
                           add_generation_prompt=True, bos_token="<s>",
                           eos_token="</s>")


server, base = start(["--chat-template", template_path])

# 1. Chat == completion of the jinja2-rendered prompt.
conversations = [
    [{"role": "user", "content": "Write a function that sorts a list."}],
    [{"role": "system", "content": "You write Python."},
     {"role": "user", "content": "def fibonacci(n):"}],
    [{"role": "user", "content": "import os"},
     {"role": "assistant", "content": "import sys"},
     {"role": "user", "content": "Now read a file. \u00e9\u00e8 \U0001F600"}],
]
for messages in conversations:
    chat = post(base, "/v1/chat/completions", dict(
        messages=messages, max_tokens=16, temperature=0))
    plain = post(base, "/v1/completions", dict(
        prompt=rendered(messages), max_tokens=16, temperature=0))
    c, p = chat["choices"][0], plain["choices"][0]
    if chat["object"] != "chat.completion" or c["message"]["role"] != \
            "assistant" or not chat["id"].startswith("chatcmpl-"):
        fail("unexpected chat response %s" % chat)
    if c["message"]["content"] != p["text"] or \
            c["finish_reason"] != p["finish_reason"] or \
            counts(chat["usage"]) != counts(plain["usage"]):
        fail("chat %s differs from the completion of jinja2's prompt %r: %s"
             % (chat, rendered(messages), plain))
    # /tokenize renders the messages as the chat endpoint does.
    tok = post(base, "/tokenize", dict(messages=messages))
    if tok["count"] != chat["usage"]["prompt_tokens"]:
        fail("tokenize %s: %d tokens, the chat's prompt %d" % (
            messages, tok["count"], chat["usage"]["prompt_tokens"]))
reference = post(base, "/v1/chat/completions", dict(
    messages=conversations[0], max_tokens=16, temperature=0))
text = reference["choices"][0]["message"]["content"]

# 2. Text parts are concatenated.
parts = post(base, "/v1/chat/completions", dict(messages=[{
    "role": "user", "content": [
        {"type": "text", "text": "Write a function that "},
        {"type": "text", "text": "sorts a list."}]}], max_tokens=16,
    temperature=0))
if parts["choices"][0]["message"]["content"] != text:
    fail("text parts %s != %r" % (parts, text))

# 3. max_completion_tokens.
short = post(base, "/v1/chat/completions", dict(
    messages=conversations[0], max_completion_tokens=3, temperature=0))
if short["usage"]["completion_tokens"] > 3 or \
        not text.startswith(short["choices"][0]["message"]["content"]):
    fail("max_completion_tokens 3: %s" % short)

# 4. Streaming.
events, done = serve_client.stream(base, "/v1/chat/completions", dict(
    messages=conversations[0], max_tokens=16, temperature=0, stream=True),
    fail)
chunks = []
for chunk in events:
    if chunk.get("object") != "chat.completion.chunk":
        fail("stream chunk %s" % chunk)
    chunks.append(chunk["choices"][0])
if not done or len(chunks) < 2:
    fail("stream without [DONE] or chunks: %s" % chunks)
first, last, middle = chunks[0], chunks[-1], chunks[1:-1]
if first["delta"].get("role") != "assistant" or first["delta"].get(
        "content", "") != "" or first["finish_reason"] is not None:
    fail("first stream chunk %s" % first)
if last["delta"] != {} or last["finish_reason"] != \
        reference["choices"][0]["finish_reason"]:
    fail("last stream chunk %s" % last)
streamed = "".join(c["delta"]["content"] for c in middle)
if streamed != text or any(c["finish_reason"] is not None for c in middle):
    fail("stream %r != %r" % ([c["delta"] for c in middle], text))

# 5. Bad requests.
alternate = "conversation roles must alternate user/assistant"
for raw, words in [
        (b"{\"messages\":", "not valid JSON"),
        (b"{\"max_tokens\": 3}", "'messages' is required"),
        (b"{\"messages\": []}", "non-empty array"),
        (b"{\"messages\": \"hi\"}", "non-empty array"),
        (b"{\"messages\": [\"hi\"]}", "messages[0] must be an object"),
        (b"{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}",
         "'role' must be a string"),
        (b"{\"messages\": [{\"role\": \"user\"}]}", "'content' must be"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
         "'content' must be"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
         b"\"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}",
         "only text parts are supported"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
         b"{\"role\": \"user\", \"content\": \"b\"}]}", alternate),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
         b"\"max_tokens\": 0}", "max_tokens"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
         b"\"max_completion_tokens\": -1}", "max_completion_tokens"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
         b"\"n\": 0}", "'n'"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
         b"\"stream\": \"yes\"}", "'stream'"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
         b"\"tools\": [{\"type\": \"function\"}]}", "tools[0] must be"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
         b"\"response_format\": {\"type\": \"yaml\"}}",
         "'response_format' type \"yaml\" is not"),
        # Not implemented yet: refused, never ignored.
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
         b"\"echo\": true}",
         "'echo' is not supported yet"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
         b"\"skip_special_tokens\": \"no\"}",
         "'skip_special_tokens' must be true or false"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
         b"\"chat_template_kwargs\": \"no\"}",
         "'chat_template_kwargs' must be an object"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
         b"\"prompt\": \"x\"}", 'unknown field "prompt"'),
        # A NUL would cut the C strings of the chat API short.
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
         b"{\"role\": \"assistant\", \"content\": \"b\\u0000c\"}]}",
         "messages[1]: content must not contain NUL characters"),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
         b"\"text\", \"text\": \"x\\u0000\"}]}]}",
         "messages[0]: content must not contain NUL characters"),
        (b"{\"messages\": [{\"role\": \"us\\u0000er\", \"content\": "
         b"\"a\"}]}", "messages[0]: role must not contain NUL characters")]:
    status, body = request(base, "/v1/chat/completions", raw=raw)
    try:
        err = json.loads(body).get("error", {})
    except ValueError:
        err = {}
    if status != 400 or words not in err.get("message", "") or \
            err.get("type") != "invalid_request_error":
        fail("%s: HTTP %d %s" % (raw, status, body))

# 6. The openai client, when installed (never needed).
clients = 0
try:
    import openai
except ImportError:
    openai = None
if openai is not None:
    client = openai.OpenAI(base_url=base + "/v1", api_key="none")
    out = client.chat.completions.create(model="pydoc", temperature=0,
                                         max_tokens=16,
                                         messages=conversations[0])
    if out.choices[0].message.content != text:
        fail("openai client: %r != %r" % (out.choices[0].message.content, text))
    pieces = [c.choices[0].delta.content or "" for c in
              client.chat.completions.create(model="pydoc", temperature=0,
                                             max_tokens=16, stream=True,
                                             messages=conversations[0])
              if c.choices]
    if "".join(pieces) != text:
        fail("openai client stream: %r != %r" % (pieces, text))
    clients = 1
stop(server)

# 7. No chat template: a clear 400.
server, base = start([])
status, body = request(base, "/v1/chat/completions", dict(
    messages=conversations[0], max_tokens=4))
message = json.loads(body).get("error", {}).get("message", "")
if status != 400 or "no chat template" not in message or \
        "--chat-template" not in message:
    fail("without a template: HTTP %d %s" % (status, body))
stop(server)

# 8. A broken template next to the tokenizer: no chat, but the server runs.
broken = ""
if broken_dir is not None:
    server, base = start(["--weights", broken_dir])
    post(base, "/v1/completions", dict(prompt="def f():", max_tokens=4,
                                       temperature=0))
    status, body = request(base, "/v1/chat/completions", dict(
        messages=conversations[0], max_tokens=4))
    message = json.loads(body).get("error", {}).get("message", "")
    reason = os.path.join(broken_dir, "chat_template.jinja") + \
        ": chat template line 3: unexpected '}'"
    # Why is in the server's log; the client is not told the server's
    # file paths.
    if status != 400 or "cannot be used" not in message or \
            broken_dir in message or "--chat-template" not in message:
        fail("broken template: HTTP %d %s" % (status, body))
    stop(server)
    warnings = [line for line in server.stderr.read().splitlines()
                if "warning" in line]
    if warnings != ["nfrun: warning: " + reason +
                    "; /v1/chat/completions is unavailable"]:
        fail("broken template: stderr warnings %s" % warnings)
    broken = ", broken template"

print("ok: chat == completion of the jinja2 prompt (%d conversations), "
      "parts, stream, errors, no template%s%s" % (
          len(conversations), broken, ", openai client" if clients else ""))
