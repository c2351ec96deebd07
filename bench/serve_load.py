#!/usr/bin/env python3
"""Serving under load: streams that keep decoding while long prompts join,
and Poisson arrivals of mixed prompt lengths, against `nfrun serve`. A
benchmark, not a test (standard library only).

  python3 bench/serve_load.py NFRUN PLAN [--mode join|poisson]
      [--streams 32] [--joins 4] [--join-tokens 8192] [--rate 4]
      [--seconds 60] [--max-tokens 256] [-- SERVE OPTIONS...]

join:    --streams greedy streams of --max-tokens tokens start together;
         once they run, --joins prompts of --join-tokens tokens arrive one
         a second (max_tokens 1). Reported: the streams' time per output token
         (mean), the gaps between their events (p50 / p99 / max, over the
         run and while a join prompt is fed: a step that stalls shows
         there), the joins' time to first token, throughput.
poisson: requests arrive at --rate a second for --seconds (prompts of 16 to
         --join-tokens tokens, log-uniform; --max-tokens 16..max), streamed.
         Reported: throughput, TTFT p50 / p99, time per output token and
         the gaps between events p50 / p99.
prefix:  --streams conversations of --turns turns each run side by side.
         Turn 1 is a prefix of --join-tokens tokens that every conversation
         shares, then --suffix-tokens of its own; each later turn sends the
         previous prompt, its reply (--max-tokens, EOS ignored) and
         --suffix-tokens new ones. Reported: TTFT p50 of each turn, p99 of
         all, throughput, and the context tokens the server looked up in
         its prefix cache and took from it (/metrics: the rest were
         computed). Run it with and without --no-enable-prefix-caching.
Both: requests sent, completed and failed, HTTP 429s, and the server's
preemptions (/health). Prompts are token ids and streams ask for
return_token_ids, so models without a tokenizer (a shape with
--random-weights) are measured per token too.

Run with --max-num-batched-tokens 65536 among the serve options to see a
prompt joining whole (no chunked prefill).
"""
import argparse
import json
import math
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("nfrun")
ap.add_argument("plan")
ap.add_argument("--mode", choices=["join", "poisson", "prefix"],
                default="join")
ap.add_argument("--streams", type=int, default=32)
ap.add_argument("--joins", type=int, default=4)
ap.add_argument("--join-tokens", type=int, default=8192)
ap.add_argument("--rate", type=float, default=4)
ap.add_argument("--seconds", type=float, default=60)
ap.add_argument("--max-tokens", type=int, default=256)
ap.add_argument("--turns", type=int, default=4)
ap.add_argument("--suffix-tokens", type=int, default=64)
ap.add_argument("--vocab", type=int, default=4000,
                help="prompt token ids are drawn below this")
ap.add_argument("--label", default="")
argv = sys.argv[1:]
split = argv.index("--") if "--" in argv else len(argv)
args = ap.parse_args(argv[:split])
serve_options = argv[split + 1:]

lock = threading.Lock()
stats = {"sent": 0, "completed": 0, "failed": 0, "429": 0}
failures = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


port = free_port()
base = "http://127.0.0.1:%d" % port
server = subprocess.Popen([args.nfrun, "serve", args.plan, "--port", str(port),
                           "--max-queue", "4096"] + serve_options,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)


def health():
    with urllib.request.urlopen(base + "/health", timeout=10) as r:
        return json.loads(r.read().decode())


for _ in range(3000):
    try:
        health()
        break
    except Exception:
        if server.poll() is not None:
            sys.exit("serve exited: " + server.stderr.read())
        time.sleep(0.2)
else:
    sys.exit("the server did not come up")


def stream(prompt, max_tokens, record, ignore_eos=False):
    """Streams one completion; record gets the arrival times of its
    tokens (one per token id), the ids and the start."""
    body = dict(prompt=prompt, max_tokens=max_tokens, temperature=0,
                stream=True, return_token_ids=True, ignore_eos=ignore_eos)
    req = urllib.request.Request(base + "/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with lock:
        stats["sent"] += 1
    record["start"] = time.perf_counter()
    record["times"] = []
    try:
        with urllib.request.urlopen(req, timeout=3600) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    raise RuntimeError(ev["error"]["message"])
                now = time.perf_counter()
                ids = ev["choices"][0].get("token_ids", [])
                n = len(ids)
                record.setdefault("ids", []).extend(ids)
                if n:
                    record["times"].append(now)
                    record["tokens"] = record.get("tokens", 0) + n
        with lock:
            stats["completed"] += 1
    except urllib.error.HTTPError as e:
        with lock:
            if e.code == 429:
                stats["429"] += 1
            else:
                stats["failed"] += 1
                failures.append("HTTP %d" % e.code)
    except Exception as e:  # noqa: BLE001 (a benchmark counts failures)
        with lock:
            stats["failed"] += 1
            failures.append(str(e))


def metric(name):
    """A counter from /metrics (0 when absent)."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(p / 100 * len(xs))) - 1)]


def gaps(rec, within=None):
    t = rec.get("times", [])
    out = []
    for a, b in zip(t, t[1:]):
        if within is None or any(lo <= b and a <= hi for lo, hi in within):
            out.append(b - a)
    return out


def throughput(recs):
    """Tokens received, and each request's time per output token."""
    tokens = sum(r.get("tokens", 0) for r in recs)
    tpot = [(r["times"][-1] - r["times"][0]) / (r["tokens"] - 1)
            for r in recs if r.get("tokens", 0) > 1]
    return tokens, tpot


rng = random.Random(1)
warm = {}
stream([rng.randrange(3, args.vocab) for _ in range(8)], 4, warm)
t_begin = time.perf_counter()
label = args.label or " ".join(serve_options)

if args.mode == "join":
    recs = [dict() for _ in range(args.streams)]
    threads = [threading.Thread(target=stream, args=(
        [rng.randrange(3, args.vocab) for _ in range(32)], args.max_tokens,
        recs[i])) for i in range(args.streams)]
    for t in threads:
        t.start()
    while sum(1 for r in recs if len(r.get("times", [])) > 8) < args.streams:
        if all(not t.is_alive() for t in threads):
            break
        time.sleep(0.05)
    joins = [dict() for _ in range(args.joins)]
    jthreads = []
    for j in range(args.joins):
        jt = threading.Thread(target=stream, args=(
            [rng.randrange(3, args.vocab) for _ in range(args.join_tokens)],
            1, joins[j]))
        jt.start()
        jthreads.append(jt)
        time.sleep(1.0)
    for t in threads + jthreads:
        t.join()
    wall = time.perf_counter() - t_begin
    windows = [(j["start"], j["times"][0]) for j in joins if j.get("times")]
    all_gaps = [g for r in recs for g in gaps(r)]
    join_gaps = [g for r in recs for g in gaps(r, windows)]
    ttft = [j["times"][0] - j["start"] for j in joins if j.get("times")]
    tokens, tpot = throughput(recs)
    h = health()
    print("| %s | %d streams, %d joins of %d | %.0f tok/s | TPOT mean %.2f ms | "
          "gap p50 %.1f / p99 %.1f / max %.1f ms | during joins p50 %.1f / "
          "p99 %.1f ms | "
          "join TTFT p50 %.2f s | sent %d, completed %d, failed %d, 429 %d, "
          "preemptions %d |" % (
              label, args.streams, args.joins, args.join_tokens,
              tokens / wall, 1e3 * sum(tpot) / max(len(tpot), 1),
              1e3 * pct(all_gaps, 50), 1e3 * pct(all_gaps, 99),
              1e3 * max(all_gaps or [float("nan")]),
              1e3 * pct(join_gaps, 50), 1e3 * pct(join_gaps, 99),
              pct(ttft, 50), stats["sent"] - 1, stats["completed"] - 1,
              stats["failed"], stats["429"], h["preemptions"]))
elif args.mode == "prefix":
    shared = [rng.randrange(3, args.vocab) for _ in range(args.join_tokens)]
    by_turn = [[] for _ in range(args.turns)]
    recs = []

    def conversation(seed):
        crng = random.Random(seed)
        prompt = shared + [crng.randrange(3, args.vocab)
                           for _ in range(args.suffix_tokens)]
        for turn in range(args.turns):
            rec = {}
            stream(prompt, args.max_tokens, rec, ignore_eos=True)
            if not rec.get("times"):
                return
            with lock:
                by_turn[turn].append(rec["times"][0] - rec["start"])
                recs.append(rec)
            prompt = prompt + rec.get("ids", []) + [
                crng.randrange(3, args.vocab)
                for _ in range(args.suffix_tokens)]

    queries0 = metric("vllm:prefix_cache_queries_total")
    hits0 = metric("vllm:prefix_cache_hits_total")
    threads = [threading.Thread(target=conversation, args=(100 + i,))
               for i in range(args.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_begin
    tokens, tpot = throughput(recs)
    queries = metric("vllm:prefix_cache_queries_total") - queries0
    hits = metric("vllm:prefix_cache_hits_total") - hits0
    turns = " ".join("%.3f" % pct(t, 50) for t in by_turn)
    print("| %s | %d conversations x %d turns, shared %d + %d a turn | "
          "TTFT p50 by turn (s): %s | TTFT all p99 %.3f s | %.0f tok/s | "
          "TPOT mean %.2f ms | context tokens looked up %d, from the cache "
          "%d (%.0f%%) | sent %d, completed %d, failed %d, 429 %d |" % (
              label, args.streams, args.turns, args.join_tokens,
              args.suffix_tokens, turns,
              pct([x for t in by_turn for x in t], 99), tokens / wall,
              1e3 * sum(tpot) / max(len(tpot), 1), queries, hits,
              100 * hits / max(queries, 1), stats["sent"] - 1,
              stats["completed"] - 1, stats["failed"], stats["429"]))
else:
    recs = []
    threads = []
    t = 0.0
    while True:
        t += rng.expovariate(args.rate)
        if t > args.seconds:
            break
        n = int(math.exp(rng.uniform(math.log(16), math.log(args.join_tokens))))
        m = rng.randrange(16, args.max_tokens + 1)
        rec = {}
        recs.append(rec)
        delay = t_begin + t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=stream, args=(
            [rng.randrange(3, args.vocab) for _ in range(n)], m, rec))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    wall = time.perf_counter() - t_begin
    ttft = [r["times"][0] - r["start"] for r in recs if r.get("times")]
    itl = [g for r in recs for g in gaps(r)]
    tokens, tpot = throughput(recs)
    h = health()
    print("| %s | Poisson %.1f/s for %.0f s | %.0f tok/s | TTFT p50 %.2f / "
          "p99 %.2f s | TPOT mean %.2f ms | gap p50 %.1f / p99 %.1f ms | "
          "sent %d, completed %d, "
          "failed %d, 429 %d, preemptions %d |" % (
              label, args.rate, args.seconds, tokens / wall, pct(ttft, 50),
              pct(ttft, 99), 1e3 * sum(tpot) / max(len(tpot), 1),
              1e3 * pct(itl, 50), 1e3 * pct(itl, 99),
              stats["sent"] - 1, stats["completed"] - 1, stats["failed"],
              stats["429"], h["preemptions"]))
server.terminate()
server.wait(timeout=60)
if failures:
    print("failures: %d, the first: %s" % (len(failures), failures[0]))
