"""What the `nfrun serve` checks share (standard library only): starting a
server on a free port, HTTP requests, server-sent events, and stopping it
with SIGTERM. `fail(msg)` is the calling check's: it kills its servers and
exits with the message."""
import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(base, path, body=None, raw=None):
    """(HTTP status, body text) of a GET (no body) or POST (JSON or raw)."""
    data = raw if raw is not None else (
        None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(base + path, data=data)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def start(nfrun, plan, options, fail, servers):
    """`nfrun serve PLAN --port P OPTIONS` once /health answers: (process,
    base URL); the process joins `servers` (for fail to kill)."""
    port = free_port()
    server = subprocess.Popen([nfrun, "serve", plan, "--port", str(port)] +
                              options, stderr=subprocess.PIPE, text=True)
    servers.append(server)
    base = "http://127.0.0.1:%d" % port
    for _ in range(300):
        try:
            if request(base, "/health")[0] == 200:
                return server, base
        except OSError:
            time.sleep(0.1)
    fail("the server did not come up")


def stream(base, path, body, fail):
    """The JSON events of a streamed POST and whether [DONE] ended them."""
    req = urllib.request.Request(base + path, data=json.dumps(body).encode())
    events, done = [], False
    with urllib.request.urlopen(req, timeout=120) as r:
        if not r.headers.get("Content-Type", "").startswith(
                "text/event-stream"):
            fail("stream content type %s" % r.headers.get("Content-Type"))
        for line in r.read().decode().split("\n"):
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            events.append(json.loads(line[6:]))
    return events, done


def stop(server, fail):
    """SIGTERM, then exit status 0 within 30 s."""
    server.send_signal(signal.SIGTERM)
    try:
        rc = server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        fail("the server did not stop on SIGTERM")
    if rc != 0:
        fail("exit status %d after SIGTERM: %s" % (rc, server.stderr.read()))


def metric_samples(text):
    """{(name, labels but model_name, sorted): value} of a /metrics text,
    read with prometheus_client's parser (imported here: only the metrics
    checks need it)."""
    from prometheus_client.parser import text_string_to_metric_families
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items()
                                        if k != "model_name")))
            samples[key] = s.value
    return samples
