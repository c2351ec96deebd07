"""Checks `nfrun serve` over HTTP (standard library only).

Usage: check_serve.py NFRUN PLAN [SERVE OPTIONS...]

Starts the server on a free port, then checks that
  - a greedy completion equals `nfrun generate` on the same prompt (generate
    is itself checked against the Hugging Face references);
  - eight concurrent requests (batched together by the server) return the
    same texts as the same requests one at a time;
  - a streamed completion concatenates to the non-streamed text and ends
    with a finish reason and [DONE];
  - stop strings cut the text; token-id prompts work;
  - bad requests get HTTP 400/404 with an OpenAI-style error object;
  - SIGTERM stops the server with exit status 0.
Prints "ok: ..." on success; exits non-zero with a message otherwise.
"""
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

nfrun, plan = sys.argv[1:3]
serve_options = sys.argv[3:]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


port = free_port()
base = "http://127.0.0.1:%d" % port
server = subprocess.Popen([nfrun, "serve", plan, "--port", str(port)] +
                          serve_options, stderr=subprocess.PIPE, text=True)


def fail(msg):
    server.kill()
    sys.exit("check_serve: " + msg)


def request(path, body=None, raw=None):
    data = raw if raw is not None else (
        None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(base + path, data=data)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


for _ in range(300):
    try:
        if request("/health")[0] == 200:
            break
    except OSError:
        time.sleep(0.1)
else:
    fail("the server did not come up")


def complete(prompt, max_tokens=16, **kw):
    status, text = request("/v1/completions", dict(
        prompt=prompt, max_tokens=max_tokens, temperature=0, **kw))
    if status != 200:
        fail("HTTP %d: %s" % (status, text))
    return json.loads(text)


# 1. Same as nfrun generate.
prompt = "The Python tutorial"
out = complete(prompt)
choice = out["choices"][0]
gen = subprocess.run([nfrun, "generate", plan, "--prompt", prompt,
                      "--max-tokens", "16"], capture_output=True, text=True)
expected = gen.stdout if gen.stdout.endswith("\n") and choice["text"].endswith(
    "\n") else gen.stdout[:-1]
if choice["text"] != expected:
    fail("completion %r differs from nfrun generate %r" % (choice["text"],
                                                          gen.stdout))
if out["object"] != "text_completion" or out["usage"]["prompt_tokens"] != 4:
    fail("unexpected response %s" % out)

# 2. Concurrent requests batched by the server == one at a time.
prompts = ["def fibonacci(n):", "import os\n", "class Stack:", "The list",
           "for i in range(", "# Read a file", "Dictionaries are", "x = ["]
alone = [complete(p, max_tokens=12)["choices"][0]["text"] for p in prompts]
together = [None] * len(prompts)


def run(i):
    together[i] = complete(prompts[i], max_tokens=12)["choices"][0]["text"]


threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
for t in threads:
    t.start()
for t in threads:
    t.join()
if together != alone:
    fail("concurrent %r != one at a time %r" % (together, alone))

# 3. Streaming.
req = urllib.request.Request(base + "/v1/completions", data=json.dumps(dict(
    prompt=prompt, max_tokens=16, temperature=0, stream=True)).encode())
pieces, finish, done = [], None, False
with urllib.request.urlopen(req, timeout=120) as r:
    if not r.headers.get("Content-Type", "").startswith("text/event-stream"):
        fail("stream content type %s" % r.headers.get("Content-Type"))
    for line in r.read().decode().split("\n"):
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        c = json.loads(line[6:])["choices"][0]
        pieces.append(c["text"])
        finish = c["finish_reason"] or finish
if "".join(pieces) != choice["text"] or finish != choice["finish_reason"] \
        or not done:
    fail("stream %r (%s, done %s) != %r" % (pieces, finish, done,
                                            choice["text"]))

# 4. Stop strings and token prompts.
text = choice["text"]
cut = text[len(text) // 2:][:3]
if cut.strip():
    s = complete(prompt, stop=[cut])["choices"][0]
    if s["text"] != text[:text.find(cut)] or s["finish_reason"] != "stop":
        fail("stop %r: %r" % (cut, s))
ids = complete([1, 2, 3], max_tokens=4)
if ids["usage"]["prompt_tokens"] != 3:
    fail("token prompt usage %s" % ids["usage"])

# 5. Bad requests.
for path, raw, code, words in [
        ("/v1/completions", b"{\"prompt\":", 400, "not valid JSON"),
        ("/v1/completions", b"{\"max_tokens\": 3}", 400, "'prompt' is required"),
        ("/v1/completions", b"{\"prompt\": \"x\", \"max_tokens\": 0}", 400,
         "max_tokens"),
        ("/v1/completions", b"{\"prompt\": [1, -5]}", 400, "token id -5"),
        ("/v1/completions", b"{\"prompt\": \"x\", \"n\": 2}", 400, "'n'"),
        ("/v1/completions", b"{\"prompt\": \"x\", \"stream\": \"yes\"}", 400,
         "'stream'"),
        ("/v1/nothing", b"{}", 404, "unknown endpoint")]:
    status, body = request(path, raw=raw)
    err = json.loads(body).get("error", {})
    if status != code or words not in err.get("message", ""):
        fail("%s %s: HTTP %d %s" % (path, raw, status, body))

models = json.loads(request("/v1/models")[1])
if models["data"][0]["object"] != "model":
    fail("models %s" % models)

server.send_signal(signal.SIGTERM)
try:
    rc = server.wait(timeout=30)
except subprocess.TimeoutExpired:
    fail("the server did not stop on SIGTERM")
if rc != 0:
    fail("exit status %d after SIGTERM: %s" % (rc, server.stderr.read()))
print("ok: generate-equal, %d concurrent == sequential, stream, stop, errors"
      % len(prompts))
