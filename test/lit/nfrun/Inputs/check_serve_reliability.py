"""Checks that a client cannot take `nfrun serve` down (standard library only).

Usage: check_serve_reliability.py NFRUN PLAN

Each check starts its own server (on a free port) and reproduces one way a
client used to break it:
  - slots: requests refused after parsing (top_p 0) must not leak sequence
    slots: after more of them than there are slots, a valid request is
    answered and /health counts no live sequence;
  - pages: requests that together need more KV pages than the cache has,
    each within the context, all complete with the text `nfrun generate`
    gives (one waits, or is preempted and recomputed), and the cache is
    whole again afterwards;
  - chunks: a short request sent while a long prompt is being fed finishes
    before it (the prompt is fed in chunks between decode steps);
  - gone: non-streamed requests whose clients disconnect stop running;
  - limits: a body over --max-body-bytes gets 413, a client that sends its
    headers too slowly is cut off after --read-timeout while others are
    served, a full queue gets 429;
  - stop: SIGTERM while a long prompt is fed ends the server within its
    grace period, and the waiting client gets an answer.
Prints "ok: ..." on success; exits non-zero with a message otherwise.
"""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import serve_client

nfrun, plan = sys.argv[1:3]
servers = []


def fail(msg):
    for s in servers:
        s.kill()
    sys.exit("check_serve_reliability: " + msg)


def start(options):
    return serve_client.start(nfrun, plan, options, fail, servers)


def health(base):
    status, body = serve_client.request(base, "/health")
    if status != 200:
        fail("/health: HTTP %d %s" % (status, body))
    return json.loads(body)


def wait_idle(base, what, seconds=20):
    """/health once no request runs and no sequence is alive, after freeing
    the prefix cache's snapshots (which hold sequences and pages)."""
    h = None
    for _ in range(int(seconds * 10)):
        h = health(base)
        if h["running"] == 0 and h["queued"] == 0 and \
                h["prefix_cache_snapshots"] > 0:
            status, body = serve_client.request(base, "/reset_prefix_cache",
                                                {})
            if status != 200:
                fail("/reset_prefix_cache: HTTP %d %s" % (status, body))
        if h["running"] == 0 and h["queued"] == 0 and h["sequences"] == 0 \
                and h["prefix_cache_snapshots"] == 0:
            return h
        time.sleep(0.1)
    fail("%s: still busy after %d s: %s" % (what, seconds, h))


def tokens(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, 4096) for _ in range(n)]


def generate(prompt, max_tokens):
    """`nfrun generate`'s text for token ids (greedy)."""
    out = subprocess.run(
        [nfrun, "generate", plan, "--prompt-tokens",
         ",".join(map(str, prompt)), "--max-tokens", str(max_tokens)],
        capture_output=True, text=True)
    if out.returncode != 0:
        fail("generate: " + out.stderr)
    return out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout


def complete(base, body, results=None, key=None):
    status, text = serve_client.request(base, "/v1/completions", body)
    if results is not None:
        results[key] = (status, text, time.monotonic())
    return status, text


def in_threads(calls):
    threads = [threading.Thread(target=c) for c in calls]
    for t in threads:
        t.start()
        time.sleep(0.05)
    return threads


def check_slots():
    # Slots: 70 refused requests on a server of 2 slots.
    server, base = start(["--max-batch", "2"])
    for i in range(70):
        status, body = complete(base, dict(prompt="a", top_p=0))
        if status != 400 or "top_p" not in body:
            fail("top_p 0: HTTP %d %s" % (status, body))
    status, body = complete(base, dict(prompt="a", max_tokens=2, temperature=0))
    if status != 200:
        fail("after 70 refused requests: HTTP %d %s" % (status, body))
    h = wait_idle(base, "slots")
    serve_client.stop(server, fail)


def check_pages():
    # Pages: 16 pages of 16 tokens (256 tokens). A stream of 20 + 100 tokens
    # and two prompts of 60 tokens growing to 210 each: together far more than
    # the cache holds, each within it.
    server, base = start(["--kv-pages", "16"])
    jobs = {"stream": (tokens(20, 1), 100), "a": (tokens(60, 2), 150),
            "b": (tokens(60, 3), 150)}
    results = {}

    def run_job(name):
        prompt, n = jobs[name]
        body = dict(prompt=prompt, max_tokens=n, temperature=0)
        if name == "stream":
            events, done = serve_client.stream(
                base, "/v1/completions", dict(body, stream=True), fail)
            text = "".join(e["choices"][0].get("text", "") for e in events
                           if "choices" in e)
            errors = [e for e in events if "error" in e]
            results[name] = (200 if done and not errors else 500, text)
        else:
            status, text = complete(base, body)
            results[name] = (status, json.loads(text)["choices"][0]["text"]
                             if status == 200 else text)

    for t in in_threads([lambda n=n: run_job(n) for n in jobs]):
        t.join()
    for name, (prompt, n) in jobs.items():
        status, text = results[name]
        if status != 200:
            fail("pages: request %s: HTTP %d %s" % (name, status, text))
        if text != generate(prompt, n):
            fail("pages: request %s differs from nfrun generate" % name)
    h = wait_idle(base, "pages")
    if h["kv_pages_free"] != h["kv_pages"] or h["kv_pages"] != 16:
        fail("pages: not all pages free afterwards: %s" % h)
    if h["preemptions"] < 1:
        fail("pages: no request was preempted (the check needs one): %s" % h)
    serve_client.stop(server, fail)
    return h


def check_chunks():
    # Chunks: a 6,000-token prompt fed 64 tokens a step (94 steps); a short
    # request sent once the prompt is being fed ends first.
    server, base = start(["--max-num-batched-tokens", "64"])
    results = {}
    long_call = threading.Thread(target=lambda: complete(
        base, dict(prompt=tokens(6000, 4), max_tokens=1), results, "long"))
    long_call.start()
    for _ in range(200):
        if health(base)["running"] == 1 or "long" in results:
            break
        time.sleep(0.02)
    complete(base, dict(prompt="def f():", max_tokens=2, temperature=0), results,
             "short")
    long_call.join()
    if results["short"][0] != 200 or results["long"][0] != 200:
        fail("chunks: %s" % results)
    if results["short"][2] >= results["long"][2]:
        fail("chunks: the short request waited for the long prompt")
    serve_client.stop(server, fail)


def check_gone():
    # Gone: three non-streamed requests of 20,000 tokens whose clients
    # disconnect after 0.3 s.
    server, base = start([])
    port = int(base.rsplit(":", 1)[1])
    clients = []
    for i in range(3):
        body = json.dumps(dict(prompt="def f():", max_tokens=20000,
                               temperature=1, seed=i)).encode()
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
        clients.append(s)
    for _ in range(100):
        if health(base)["running"] == 3:
            break
        time.sleep(0.1)
    else:
        fail("gone: the requests did not start")
    for s in clients:
        s.close()
    wait_idle(base, "gone", 10)
    serve_client.stop(server, fail)


def check_limits():
    # Limits.
    server, base = start(["--max-body-bytes", "4096", "--read-timeout", "1",
                          "--max-batch", "1", "--max-queue", "1"])
    port = int(base.rsplit(":", 1)[1])
    status, body = complete(base, dict(prompt="x" * 5000))
    if status != 413 or "--max-body-bytes" not in body:
        fail("limits: a 5,000-byte body: HTTP %d %s" % (status, body))
    # A chunked body (no Content-Length, which httplib's limit reads) of
    # 200,000 bytes is cut off too: never parsed (its top_p would be
    # refused).
    chunked = socket.create_connection(("127.0.0.1", port))
    chunked.settimeout(10)
    answer = b""
    body = b'{"top_p": 0, "prompt": "' + b"x" * 200000 + b'"}'
    try:
        chunked.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(body), 4000):
            piece = body[i:i + 4000]
            chunked.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
        chunked.sendall(b"0\r\n\r\n")
        chunked.settimeout(2)
        while len(answer) < 65536:
            got = chunked.recv(4096)
            if not got:
                break
            answer += got
    except OSError:
        pass
    chunked.close()
    if b"top_p" in answer:
        fail("limits: a 200,000-byte chunked body was read: %r" % answer[:200])
    # A client sending its headers a byte every 0.2 s is cut off.
    slow = socket.create_connection(("127.0.0.1", port))
    slow.settimeout(10)
    began = time.monotonic()
    cut = False
    for c in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" * 4:
        try:
            slow.sendall(bytes([c]))
            time.sleep(0.2)
        except OSError:
            cut = True
            break
        if time.monotonic() - began > 8:
            break
    if not cut:
        try:
            cut = slow.recv(1024) == b""
        except OSError:
            cut = True
    if not cut or time.monotonic() - began > 6:
        fail("limits: a slow client was not cut off after --read-timeout 1")
    slow.close()
    # One slot, one queue place: of four requests at once, one is refused.
    results = {}
    for t in in_threads([lambda i=i: complete(
            base, dict(prompt="def f():", max_tokens=1000, temperature=0),
            results, i) for i in range(4)]):
        t.join()
    codes = sorted(r[0] for r in results.values())
    if 429 not in codes or any(c not in (200, 429) for c in codes):
        fail("limits: a full queue: HTTP %s" % codes)
    serve_client.stop(server, fail)


def check_stop():
    # Stop: SIGTERM while a 3,000-token prompt is fed 64 tokens a step; a
    # grace period of 1 s.
    server, base = start(["--max-num-batched-tokens", "64",
                          "--shutdown-grace", "1"])
    results = {}
    waiting = threading.Thread(target=lambda: complete(
        base, dict(prompt=tokens(3000, 5), max_tokens=20000), results, "long"))
    waiting.start()

    def streamed():
        events, done = serve_client.stream(base, "/v1/completions", dict(
            prompt="def f():", max_tokens=100000, stream=True), fail)
        results["stream"] = (events, done)

    streaming = threading.Thread(target=streamed)
    streaming.start()
    time.sleep(0.5)
    began = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        rc = server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        fail("stop: the server still runs 15 s after SIGTERM")
    waiting.join(timeout=5)
    streaming.join(timeout=5)
    if rc != 0 or "long" not in results or results["long"][0] != 503:
        fail("stop: exit status %d, client answer %s" % (rc, results.get("long")))
    # A stream running through the grace period ends with an error event
    # and [DONE], not cut off.
    events, done = results.get("stream", ([], False))
    if not done or not any("error" in e for e in events):
        fail("stop: the stream ended without its last events (%d events, "
             "[DONE] %s)" % (len(events), done))


# NF_CHECKS=pages,stop runs some of the checks (each one alone fails against
# a server with the defect it reproduces).
only = os.environ.get("NF_CHECKS")
h = {"preemptions": 0}
for name in ["slots", "pages", "chunks", "gone", "limits", "stop"]:
    if not only or name in only.split(","):
        h = globals()["check_" + name]() or h

print("ok: %s" % ", ".join(
    "pages (%d preemptions)" % h["preemptions"] if n == "pages" else n
    for n in ["slots", "pages", "chunks", "gone", "limits", "stop"]
    if not only or n in only.split(",")))
