"""Soak and abuse test of `nfrun serve` (standard library only).

  serve_soak.py NFRUN PLAN [--seconds S] [--clients N] [--reference generate]
      [-- SERVE OPTIONS...]

Starts the server, computes each check prompt's greedy answer alone, then for
S seconds runs N client threads that each pick at random:
  valid       a greedy completion of a check prompt (streamed or not; some
              prompts are long, so they are fed in chunks beside the others),
              which must equal its answer alone;
  sampled     a seeded temperature-1 completion: HTTP 200, a finish reason,
              at most max_tokens tokens;
  invalid     malformed JSON, top_p 0, a token id outside the vocabulary, a
              missing prompt: HTTP 400 with an error object;
  oversized   a body over --max-body-bytes: HTTP 413;
  slow        headers sent a byte at a time: cut off after --read-timeout;
  disconnect  a long completion whose client closes the socket after up to
              0.5 s, streamed or not.
Meanwhile the server's resident memory is sampled. At the end it checks that
no request runs, no sequence is alive and every KV page is free; that RSS
grew less than max(64 MiB, 10%) after the first fifth of the run; and that
SIGTERM during a long request ends the server within its grace period with
exit status 0. With --reference generate, the answers alone are first
checked against `nfrun generate` (whose outputs are checked against the
Hugging Face references elsewhere).

Prints one "ok: ..." line with the counts, or exits non-zero with a message.
Prompts are token ids (models without a tokenizer work: answers are compared
by token id, return_token_ids).
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_client  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("nfrun")
ap.add_argument("plan")
ap.add_argument("--seconds", type=float, default=20)
ap.add_argument("--clients", type=int, default=8)
ap.add_argument("--max-tokens", type=int, default=16)
ap.add_argument("--long-prompt", type=int, default=600,
                help="tokens of the longest check prompt")
ap.add_argument("--reference", choices=["solo", "generate"], default="solo")
ap.add_argument("--grace", type=float, default=2)
argv = sys.argv[1:]
split = argv.index("--") if "--" in argv else len(argv)
args = ap.parse_args(argv[:split])
serve_options = argv[split + 1:]  # after "--": options of nfrun serve
servers = []
lock = threading.Lock()
counts = {}
errors = []


def fail(msg):
    for s in servers:
        s.kill()
    sys.exit("serve_soak: " + msg)


def count(kind):
    with lock:
        counts[kind] = counts.get(kind, 0) + 1


def error(msg):
    with lock:
        errors.append(msg)


body_limit = 1 << 20
read_timeout = 2.0
options = ["--max-body-bytes", str(body_limit), "--read-timeout",
           str(read_timeout), "--shutdown-grace", str(args.grace),
           "--max-queue", str(4 * args.clients + 16)] + serve_options
server, base = serve_client.start(args.nfrun, args.plan, options, fail,
                                  servers)
port = int(base.rsplit(":", 1)[1])
health0 = json.loads(serve_client.request(base, "/health")[1])


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def post(body, timeout=600):
    """(status, parsed JSON or text)."""
    status, text = serve_client.request(base, "/v1/completions", body)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


# The check prompts and their answers alone.
rng = random.Random(7)
vocab_hi = 4000
lengths = [3, 17, 64, 200, args.long_prompt]
prompts = [[rng.randrange(3, vocab_hi) for _ in range(n)] for n in lengths]
expected = []
for p in prompts:
    status, out = post(dict(prompt=p, max_tokens=args.max_tokens,
                            temperature=0, return_token_ids=True))
    if status != 200:
        fail("a check prompt alone: HTTP %d %s" % (status, out))
    expected.append(out["choices"][0]["token_ids"])
    if args.reference == "generate":
        # The server's --weights and --backend apply to generate too.
        same = []
        for i, o in enumerate(serve_options[:-1]):
            if o in ("--weights", "--backend"):
                same += [o, serve_options[i + 1]]
        gen = subprocess.run(
            [args.nfrun, "generate", args.plan, "--prompt-tokens",
             ",".join(map(str, p)), "--max-tokens", str(args.max_tokens)] +
            same, capture_output=True, text=True)
        text = gen.stdout[:-1] if gen.stdout.endswith("\n") else gen.stdout
        if gen.returncode != 0 or text != out["choices"][0]["text"]:
            fail("a check prompt alone differs from nfrun generate")


def valid(r):
    i = r.randrange(len(prompts))
    body = dict(prompt=prompts[i], max_tokens=args.max_tokens, temperature=0,
                return_token_ids=True)
    status, out = post(body)
    if status != 200:
        return error("valid: HTTP %d %s" % (status, out))
    if out["choices"][0]["token_ids"] != expected[i]:
        return error("valid: prompt %d (%d tokens) under load differs from "
                     "its answer alone" % (i, len(prompts[i])))
    count("valid")


def sampled(r):
    n = r.randrange(1, 2 * args.max_tokens)
    status, out = post(dict(prompt=prompts[r.randrange(len(prompts))],
                            max_tokens=n, temperature=1,
                            seed=r.randrange(1 << 30), return_token_ids=True))
    if status != 200:
        return error("sampled: HTTP %d %s" % (status, out))
    c = out["choices"][0]
    if c["finish_reason"] not in ("stop", "length") or \
            not 1 <= len(c["token_ids"]) <= n or \
            out["usage"]["completion_tokens"] != len(c["token_ids"]):
        return error("sampled: malformed answer %s" % out)
    count("sampled")


def invalid(r):
    kind = r.randrange(4)
    if kind == 0:
        status, text = serve_client.request(base, "/v1/completions",
                                            raw=b'{"prompt": [1, 2')
    else:
        body = [dict(prompt=[5, 6], top_p=0),
                dict(prompt=[5, 1 << 30]),
                dict(max_tokens=3)][kind - 1]
        status, text = serve_client.request(base, "/v1/completions", body)
    if status != 400 or "error" not in text:
        return error("invalid %d: HTTP %d %s" % (kind, status, text))
    count("invalid")


def oversized(r):
    status, text = serve_client.request(
        base, "/v1/completions",
        raw=b'{"prompt": "' + b"x" * (body_limit + 10) + b'"}')
    if status != 413:
        return error("oversized: HTTP %d %s" % (status, text))
    count("oversized")


def slow(r):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(read_timeout + 10)
    began = time.monotonic()
    try:
        for c in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" * 8:
            s.sendall(bytes([c]))
            time.sleep(0.25)
            if time.monotonic() - began > read_timeout + 5:
                return error("slow: not cut off after %.0f s" %
                             (time.monotonic() - began))
        return error("slow: the whole header was read")
    except OSError:
        count("slow")
    finally:
        s.close()


def disconnect(r):
    body = json.dumps(dict(prompt=prompts[r.randrange(len(prompts))],
                           max_tokens=100000, temperature=1,
                           stream=r.random() < 0.5)).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    time.sleep(r.uniform(0.05, 0.5))
    s.close()
    count("disconnect")


actions = [(valid, 40), (sampled, 20), (invalid, 15), (oversized, 5),
           (slow, 3), (disconnect, 10)]
end = time.monotonic() + args.seconds


def client(seed):
    r = random.Random(seed)
    total = sum(w for _, w in actions)
    while time.monotonic() < end:
        x = r.uniform(0, total)
        for f, w in actions:
            if x < w:
                f(r)
                break
            x -= w


rss = []


def monitor():
    while time.monotonic() < end:
        rss.append((time.monotonic(), rss_kib(server.pid)))
        time.sleep(0.5)


threads = [threading.Thread(target=client, args=(i,))
           for i in range(args.clients)] + [threading.Thread(target=monitor)]
began = time.monotonic()
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    fail("%d errors, the first: %s" % (len(errors), errors[0]))

# Idle again: nothing running, every sequence and page back once the
# prefix cache's snapshots are freed.
h = None
for _ in range(300):
    h = json.loads(serve_client.request(base, "/health")[1])
    if h["running"] == 0 and h["queued"] == 0 and \
            h["prefix_cache_snapshots"] > 0:
        serve_client.request(base, "/reset_prefix_cache", {})
    if h["running"] == 0 and h["queued"] == 0 and h["sequences"] == 0 and \
            h["kv_pages_free"] == h["kv_pages"]:
        break
    time.sleep(0.1)
else:
    fail("not idle after the run: %s" % h)
warm = [k for t, k in rss if t >= began + args.seconds / 5]
if warm and warm[-1] - warm[0] > max(64 << 10, warm[0] // 10):
    fail("RSS grew from %d to %d KiB" % (warm[0], warm[-1]))

# SIGTERM during a long request: exit 0 within the grace period (+ 5 s for
# the step under way and the exit itself).
answer = {}
hold = threading.Thread(target=lambda: answer.update(r=post(dict(
    prompt=prompts[0], max_tokens=100000, temperature=1))))
hold.start()
time.sleep(0.5)
t0 = time.monotonic()
server.send_signal(signal.SIGTERM)
try:
    rc = server.wait(timeout=args.grace + 5)
except subprocess.TimeoutExpired:
    fail("still running %.0f s after SIGTERM" % (args.grace + 5))
stopped = time.monotonic() - t0
hold.join(timeout=10)
if rc != 0 or answer.get("r", (0,))[0] != 503:
    fail("SIGTERM: exit status %d, the running request got %s" %
         (rc, answer.get("r")))
print("ok: %d clients, %.0f s, %s; RSS %d -> %d MiB; idle after; SIGTERM "
      "exit in %.1f s (%d preemptions, %d steps)" % (
          args.clients, args.seconds,
          ", ".join("%s %d" % kv for kv in sorted(counts.items())),
          (warm[0] if warm else 0) >> 10, (warm[-1] if warm else 0) >> 10,
          stopped, h["preemptions"], h["steps"]))
