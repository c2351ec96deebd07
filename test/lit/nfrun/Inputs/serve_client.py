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


class _Fields:
    """A JSON object with its fields as attributes (and `model_extra`, the
    whole object), as the openai client's response models give them."""

    def __init__(self, value):
        self.model_extra = value
        for k, v in value.items():
            setattr(self, k, _wrap(v))

    def items(self):  # a mapping's fields, as the client's dicts
        return self.model_extra.items()

    def __len__(self):
        return len(self.model_extra)


def _wrap(v):
    if isinstance(v, dict):
        return _Fields(v)
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    return v


class _Endpoint:
    def __init__(self, base, path):
        self.base, self.path = base, path

    def create(self, extra_body=None, **body):
        body.update(extra_body or {})
        status, text = request(self.base, self.path, body)
        if status != 200:
            raise RuntimeError("HTTP %d: %s" % (status, text))
        return _Fields(json.loads(text))


def openai_client(base):
    """The official openai client for `base`; where NF_NO_OPENAI=1 (a GPU
    machine without it and without network), a stand-in for the calls
    the checks make (completions and chat completions create, not
    streamed), over the standard library."""
    import os
    if os.environ.get("NF_NO_OPENAI") == "1":
        client = _Fields({})
        client.completions = _Endpoint(base, "/v1/completions")
        client.chat = _Fields({})
        client.chat.completions = _Endpoint(base, "/v1/chat/completions")
        return client
    import openai
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
