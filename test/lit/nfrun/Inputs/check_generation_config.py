"""generation_config.json's sampling defaults apply to requests that omit
them: a copy of the model whose generation_config.json says temperature 0
answers an unseeded request without `temperature` as greedy decoding does,
while an explicit temperature still wins.

    check_generation_config.py NFRUN PLAN MODEL_DIR WORK_DIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_client  # noqa: E402

nfrun, plan, model, work = sys.argv[1:5]
servers = []


def fail(msg):
    for s in servers:
        s.kill()
    sys.exit("check_generation_config: " + msg)


os.makedirs(work, exist_ok=True)
for f in os.listdir(model):
    if f != "generation_config.json" and not os.path.exists(os.path.join(work, f)):
        os.symlink(os.path.abspath(os.path.join(model, f)), os.path.join(work, f))
config = json.load(open(os.path.join(model, "generation_config.json")))
config.update(temperature=0.0, top_p=0.9)
json.dump(config, open(os.path.join(work, "generation_config.json"), "w"))

server, base = serve_client.start(nfrun, plan, ["--weights", work], fail, servers)
prompt = "The Python tutorial"


def complete(**kw):
    status, body = serve_client.request(base, "/v1/completions",
                                        dict(prompt=prompt, max_tokens=12, **kw))
    if status != 200:
        fail("HTTP %d %s" % (status, body))
    return json.loads(body)["choices"][0]["text"]


greedy = complete(temperature=0)
defaults = [complete(seed=s) for s in (1, 2, 3)]
if any(d != greedy for d in defaults):
    fail("requests without temperature %r differ from greedy %r" % (defaults, greedy))
sampled = {complete(temperature=1.5, seed=s) for s in range(6)}
if len(sampled) < 2:
    fail("an explicit temperature 1.5 was overridden: %r" % sampled)
serve_client.stop(server, fail)
print("ok: omitted fields take generation_config.json's, given ones win")
