#!/usr/bin/env python3
"""Serving throughput: `nfrun serve` under concurrent OpenAI completion
requests, next to `nfrun bench --sample` of the same plan and batch in the
same run (the decode steps alone), so that the ratio shows what the HTTP
server, its scheduler and the tokenizer cost. A benchmark, not a test.

  python3 bench/serve_bench.py NFRUN PLAN --weights DIR [--backend cuda]
      [--concurrency 1,8,32] [--max-tokens 128] [--temperature 1] [--top-p 1]

Each level sends 2 x concurrency requests from as many client threads
(plain urllib, non-streaming; distinct prompts and seeds; by default
temperature 1 alone, the API's default sampling) and reports completion tokens per second of
wall time, and the mean request latency. Requests end at max_tokens or at
the model's end-of-text token, so generated lengths vary; the figure counts
what was generated.
"""
import argparse
import concurrent.futures as cf
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base, body, timeout=600):
    req = urllib.request.Request(base + "/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out = json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        sys.exit("HTTP %d: %s" % (e.code, e.read().decode()))
    return out["usage"]["completion_tokens"], time.perf_counter() - t0


PROMPTS = ["def parse_args(argv):", "class Stack:", "import os\n\ndef walk(",
           "The Python tutorial", "def fib(n):", "for line in open(",
           "try:\n    import json", "def main():\n    "]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("nfrun")
    ap.add_argument("plan")
    ap.add_argument("--weights", required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]

    port = free_port()
    base = "http://127.0.0.1:%d" % port
    server = subprocess.Popen(
        [a.nfrun, "serve", a.plan, "--weights", a.weights, "--backend",
         a.backend, "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1).read()
                break
            except Exception:
                if server.poll() is not None:
                    sys.exit("serve exited: " + server.stderr.read())
                time.sleep(0.2)
        post(base, dict(prompt=PROMPTS[0], max_tokens=8))  # warm-up
        rows = []
        for c in levels:
            n = 2 * c
            bodies = [dict(prompt=PROMPTS[i % len(PROMPTS)],
                           max_tokens=a.max_tokens,
                           temperature=a.temperature, top_p=a.top_p,
                           seed=i)
                      for i in range(n)]
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(c) as pool:
                res = list(pool.map(lambda b: post(base, b), bodies))
            wall = time.perf_counter() - t0
            toks = sum(r[0] for r in res)
            rows.append((c, n, toks, toks / wall,
                         sum(r[1] for r in res) / n))
    finally:
        server.terminate()
        server.wait(timeout=30)

    print("| concurrency | requests | tokens | serve tok/s | mean latency s "
          "| bench --sample tok/s | serve / bench |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for c, n, toks, rate, lat in rows:
        b = subprocess.run(
            [a.nfrun, "bench", a.plan, "--weights", a.weights, "--backend",
             a.backend, "--batch", str(c), "--context", "64", "--prefill", "",
             "--steps", "32", "--sample", "--temperature",
             str(a.temperature), "--top-p", str(a.top_p)],
            capture_output=True, text=True)
        m = re.search(r"\| decode batch %d [^|]*\| ([0-9.]+) \|" % c, b.stdout)
        bench = float(m.group(1)) if m else float("nan")
        print("| %d | %d | %d | %.1f | %.3f | %.1f | %.2f |" %
              (c, n, toks, rate, lat, bench, rate / bench))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
