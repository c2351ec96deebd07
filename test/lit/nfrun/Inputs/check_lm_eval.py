"""lm-evaluation-harness against `nfrun serve`: its `local-completions`
model with `tokenizer_backend=remote` (nf's /tokenize, /detokenize and
/tokenizer_info) runs a loglikelihood task from a local data file (no
downloads), and every document's loglikelihood must equal the sum of the
continuation tokens' log-softmax under the model's logits from
`nfrun generate --dump-logits` (teacher forcing), within 1e-4.

Usage: check_lm_eval.py NFRUN PLAN
Prints "ok: ..." and exits 0; otherwise exits with a message.
"""
import glob
import json
import math
import os
import subprocess
import sys
import tempfile

import serve_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_generate import generate  # noqa: E402

nfrun, plan = sys.argv[1:3]
servers = []


def fail(msg):
    for s in servers:
        s.kill()
    sys.exit("check_lm_eval: " + msg)


DOCS = [
    ("def add(a, b):\n    \"\"\"Return the", " sum of a and b.\"\"\""),
    ("import os\n\n", "def list_files(path):"),
    ("class Stack:\n    \"\"\"A last-in first-out", " stack of items.\"\"\""),
    ("def parse(text):\n    \"\"\"Parse a comma separated line of",
     " numbers and return them as a list of integers."),
]

server, base = serve_client.start(nfrun, plan, [], fail, servers)
tmp = tempfile.mkdtemp()
with open(os.path.join(tmp, "docs.jsonl"), "w") as f:
    for c, t in DOCS:
        f.write(json.dumps({"context": c, "continuation": t}) + "\n")
with open(os.path.join(tmp, "nf_loglik.yaml"), "w") as f:
    f.write("""task: nf_loglik
dataset_path: json
dataset_kwargs:
  data_files:
    test: %s
test_split: test
output_type: loglikelihood
doc_to_text: "{{context}}"
doc_to_target: "{{continuation}}"
target_delimiter: ""
metric_list:
  - metric: acc
""" % os.path.join(tmp, "docs.jsonl"))
env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
           HF_HOME=os.path.join(tmp, "hf"))
r = subprocess.run(
    [sys.executable, "-m", "lm_eval", "--model", "local-completions",
     "--model_args", "base_url=%s/v1/completions,tokenizer_backend=remote,"
     "num_concurrent=1,max_retries=1,model=m" % base,
     "--tasks", "nf_loglik", "--include_path", tmp, "--log_samples",
     "--output_path", os.path.join(tmp, "out")],
    capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
if r.returncode != 0:
    fail("lm_eval failed (%d): %s" % (r.returncode, r.stderr[-1500:]))
samples = glob.glob(os.path.join(tmp, "out", "*", "samples_nf_loglik_*.jsonl"))
if len(samples) != 1:
    fail("samples: %s" % samples)
got = {}
for line in open(samples[0]):
    s = json.loads(line)
    got[s["doc_id"]] = float(s["resps"][0][0][0])
if sorted(got) != list(range(len(DOCS))):
    fail("documents %s" % sorted(got))


def tokenize(text):
    status, body = serve_client.request(
        base, "/tokenize", {"prompt": text, "add_special_tokens": False})
    if status != 200:
        fail("/tokenize: HTTP %d %s" % (status, body))
    return json.loads(body)["tokens"]


worst = 0.0
for i, (context, continuation) in enumerate(DOCS):
    # lm-eval's split: the context's trailing whitespace moves to the
    # continuation, the whole text is encoded and cut at the context's
    # length.
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = (context[:-spaces],
                                 context[-spaces:] + continuation)
    whole = tokenize(context + continuation)
    n = len(tokenize(context))
    dump, _ = generate(nfrun, plan, whole, 1,
                       os.path.join(tmp, "d%d.safetensors" % i))
    (rows, V), flat = dump["prefill_logits"]
    want = 0.0
    for t in range(n, len(whole)):
        row = flat[(t - 1) * V:t * V]
        m = max(row)
        want += row[whole[t]] - m - math.log(sum(math.exp(x - m)
                                                   for x in row))
    worst = max(worst, abs(got[i] - want))
    if abs(got[i] - want) > 1e-4:
        fail("document %d: lm-eval %.6f, the model's logits %.6f" % (
            i, got[i], want))
serve_client.stop(server, fail)
print("ok: %d lm-eval loglikelihoods match the model's logits (worst %.1e)"
      % (len(DOCS), worst))
