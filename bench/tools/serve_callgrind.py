#!/usr/bin/env python3
"""The host cost of nfrun serve's scheduler, in instructions (callgrind:
repeatable, whatever else the machine runs). Starts `nfrun serve PLAN`
under `valgrind --tool=callgrind` on the CPU backend (one thread), sends N
concurrent greedy requests of T tokens, stops it with SIGTERM, and prints
the scheduler thread's instructions outside nf_decode_sample (the model's
step): what the scheduler, detokenizing and bookkeeping cost.

  python3 bench/tools/serve_callgrind.py NFRUN PLAN [--requests 32]
      [--tokens 32] [--lib DIR] [--out FILE]

--lib goes first on LD_LIBRARY_PATH (another build's libnf, for an A/B).
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("nfrun")
ap.add_argument("plan")
ap.add_argument("--requests", type=int, default=32)
ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--lib", default="")
ap.add_argument("--out", default="callgrind.serve")
a = ap.parse_args()
env = dict(os.environ)
if a.lib:
    env["LD_LIBRARY_PATH"] = a.lib + ":" + env.get("LD_LIBRARY_PATH", "")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server = subprocess.Popen(
    ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + a.out, a.nfrun,
     "serve", a.plan, "--port", str(port), "--threads", "1", "--backend",
     "cpu"], env=env, stderr=subprocess.DEVNULL)
base = "http://127.0.0.1:%d" % port
for _ in range(1200):
    try:
        urllib.request.urlopen(base + "/health", timeout=2).read()
        break
    except Exception:
        time.sleep(0.5)


def one(i):
    body = json.dumps(dict(prompt=[5 + i, 6, 7], max_tokens=a.tokens,
                           temperature=0)).encode()
    urllib.request.urlopen(urllib.request.Request(
        base + "/v1/completions", data=body), timeout=3600).read()


threads = [threading.Thread(target=one, args=(i,))
           for i in range(a.requests)]
for t in threads:
    t.start()
for t in threads:
    t.join()
server.send_signal(signal.SIGTERM)
server.wait(timeout=600)
report = subprocess.run(["callgrind_annotate", "--inclusive=yes", a.out],
                        capture_output=True, text=True).stdout


def cost(pattern):
    for line in report.splitlines():
        if re.search(pattern, line):
            return int(line.split()[0].replace(",", ""))
    return 0


loop = cost(r"Scheduler::loop\(\)")
decode = cost(r"\?\?\?:nf_decode_sample ")
print("scheduler thread %d, nf_decode_sample %d, outside it %d instructions"
      % (loop, decode, loop - decode))
