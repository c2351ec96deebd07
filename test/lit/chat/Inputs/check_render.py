"""Compares nf's chat template renderer with Python's jinja2, configured as
transformers' apply_chat_template configures it.

Usage: check_render.py NF_CHAT_RENDER TEMPLATE_DIR

The reference environment is transformers' (utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension and the {% generation %} tag, its tojson filter
(json.dumps with ensure_ascii=False), raise_exception and strftime_now, and
the variables it passes (messages, tools and documents None unless given,
add_generation_prompt, bos_token, eos_token).

Cases:
  - every TEMPLATE_DIR/*.jinja with every conversation of conversations.json,
    with and without the generation prompt;
  - the small templates of snippets.json (each a feature or an error);
  - generated templates mixing text and whitespace with tags under every
    whitespace control ({%- -%} {%+ +%} {{- -}} {#- -#}), trim_blocks and
    lstrip_blocks (seeded, so every run checks the same ones).
A case passes when both give the same text byte for byte, or both fail; a
template's raise_exception message must appear in nf's error. Prints "ok: ..."
or the differences (exit status 1).
"""
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit("check_render: Python's jinja2 is needed (Debian: python3-jinja2)")

renderer, template_dir = sys.argv[1:3]


def transformers_environment():
    class AssistantTracker(jinja2.ext.Extension):
        # transformers' {% generation %} block: renders its body as is.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"],
                                           drop_needle=True)
            call = self.call_method("_generation_support")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _generation_support(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None,
               sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


env = transformers_environment()


def reference(template, context):
    try:
        return {"output": env.from_string(template).render(**context)}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": "syntax: %s" % e}
    except Exception as e:  # what the template raised, or Python's error
        raised = type(e) is jinja2.exceptions.TemplateError
        return {"error": str(e), "raised": raised}


cases = []  # (label, template, context)

# 1. Templates x conversations.
with open(os.path.join(template_dir, "conversations.json")) as f:
    conversations = json.load(f)
templates = sorted(glob.glob(os.path.join(template_dir, "*.jinja")))
if not templates or not conversations:
    sys.exit("check_render: no templates or conversations in " + template_dir)
for path in templates:
    with open(path, encoding="utf-8") as f:
        source = f.read()
    for conv in conversations:
        for agp in (True, False):
            context = {k: v for k, v in conv.items() if k != "name"}
            context.setdefault("tools", None)
            context.setdefault("documents", None)
            context.update(add_generation_prompt=agp, bos_token="<s>",
                           eos_token="</s>")
            cases.append(("%s x %s (add_generation_prompt=%s)" % (
                os.path.basename(path), conv["name"], agp), source, context))
n_templates = len(cases)

# 2. Snippets.
with open(os.path.join(template_dir, "snippets.json")) as f:
    for i, s in enumerate(json.load(f)):
        cases.append(("snippet %d" % i, s["template"], s.get("context", {})))
n_snippets = len(cases) - n_templates

# 3. Whitespace control, generated.
rng = random.Random(20251204)
texts = ["", " ", "  ", "\t", "\n", " \n", "\n ", "\n\n", "  \n  ", "x",
         "a b", " x \n", "\n  y", "\t\n\t", "\u00a0", "\r\n", "z\r"]


def tag(kind, body):
    left = rng.choice(["", "-", "+"])
    right = rng.choice(["", "-"] if kind == "{" else ["", "-", "+"])
    close = {"{": "}}", "%": "%}", "#": "#}"}[kind]
    return "{" + kind + left + " " + body + " " + right + close


def block(depth):
    parts = []
    for _ in range(rng.randint(1, 4)):
        parts.append(rng.choice(texts))
        r = rng.random()
        if r < 0.25:
            parts.append(tag("{", rng.choice(["'v'", "n", "' w '", "1"])))
        elif r < 0.4:
            parts.append(tag("#", rng.choice(["c", "a\ncomment"])))
        elif r < 0.5:
            parts.append(tag("%", "set n = n + 1"))
        elif r < 0.75 and depth < 3:
            parts.append(tag("%", rng.choice(["if true", "if n > 1", "if false"])))
            parts.append(block(depth + 1))
            if rng.random() < 0.3:
                parts.append(tag("%", "else"))
                parts.append(block(depth + 1))
            parts.append(tag("%", "endif"))
        elif depth < 3:
            parts.append(tag("%", "for i in range(2)"))
            parts.append(block(depth + 1))
            parts.append(tag("%", "endfor"))
    parts.append(rng.choice(texts))
    return "".join(parts)


for i in range(1500):
    cases.append(("whitespace %d" % i, block(0), {"n": 1}))
n_whitespace = len(cases) - n_templates - n_snippets

with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False,
                                 encoding="utf-8") as f:
    json.dump([{"name": label, "template": t, "context": c}
               for label, t, c in cases], f, ensure_ascii=False)
    cases_file = f.name
try:
    run = subprocess.run([renderer, cases_file], capture_output=True)
finally:
    os.unlink(cases_file)
if run.returncode != 0:
    sys.exit("check_render: %s failed: %s" % (renderer, run.stderr.decode()))
got = json.loads(run.stdout.decode("utf-8"))
if len(got) != len(cases):
    sys.exit("check_render: %d results for %d cases" % (len(got), len(cases)))

failures = []
outputs = errors = raised = 0
for (label, template, context), mine in zip(cases, got):
    want = reference(template, context)
    if "output" in want:
        outputs += 1
        ok = mine.get("output") == want["output"]
    else:
        errors += 1
        raised += want.get("raised", False)
        ok = "error" in mine and (not want.get("raised") or
                                  want["error"] in mine["error"])
    if not ok:
        failures.append("%s\n  template: %r\n  jinja2: %r\n  nf:     %r" % (
            label, template[:400], want, mine))

if failures:
    print("\n".join(failures[:20]))
    sys.exit("check_render: %d of %d cases differ" % (len(failures), len(cases)))
# The comparison must cover both outcomes.
if outputs < len(cases) // 2 or raised < 5:
    sys.exit("check_render: only %d outputs and %d raise_exception errors: "
             "the cases check too little" % (outputs, raised))
print("ok: %d template renders, %d snippets, %d whitespace cases equal "
      "(%d outputs, %d errors, %d raised by the template)" % (
          n_templates, n_snippets, n_whitespace, outputs, errors, raised))
