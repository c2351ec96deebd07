"""Checks or edits the op codes of a plan dumped to JSON by flatc.

    plan_op_codes.py PLAN.json check
        every op's stored code is its name's in runtime/include/nf/plan_ops.def;
        prints "ops N codes ok"
    plan_op_codes.py PLAN.json OUT.json CASE
        CASE: other   (the first op gets the code of a different op)
              unknown (the first op gets a code not in plan_ops.def)
              none    (every code 0 and format 1.8: a plan from before codes)
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "..", "..", "scripts"))
import plan_ops  # noqa: E402

# flatc writes non-finite floats bare (inf, -inf, nan); JSON has no such words.
plan = json.loads(re.sub(r"(?<=: )(-?)inf\b", r"\1Infinity",
                         re.sub(r"(?<=: )nan\b", "NaN", open(sys.argv[1]).read())))
ops = [op for phase in ("prefill", "decode")
       for kernel in plan[phase]["kernels"] for op in kernel.get("ops", [])]

if sys.argv[2] == "check":
    bad = [(op["name"], op.get("code", 0)) for op in ops
           if op.get("code", 0) != plan_ops.CODES[op["name"]]]
    print("ops %d codes %s" % (len(ops), "ok" if not bad else "wrong: %r" % bad[:3]))
    sys.exit(0)

out, case = sys.argv[2], sys.argv[3]
first = ops[0]
if case == "other":
    first["code"] = next(c for n, c in plan_ops.CODES.items() if n != first["name"])
elif case == "unknown":
    first["code"] = max(plan_ops.NAMES) + 100
elif case == "none":
    for op in ops:
        op["code"] = 0
    plan["version_minor"] = 8
else:
    sys.exit("unknown case " + case)
text = json.dumps(plan)
open(out, "w").write(re.sub(r"(?<=: )(-?)Infinity\b", r"\1inf", text).replace(": NaN", ": nan"))
