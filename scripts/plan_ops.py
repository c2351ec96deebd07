"""The plan's op codes and attribute keys, read from runtime/include/nf/plan_ops.def
(the list the plan writer and the engines share).

    import plan_ops
    plan_ops.CODES["nf_moe.select"]  -> 15
    plan_ops.NAMES[15]               -> "nf_moe.select"
    plan_ops.ATTRS                   -> ["activation", "direction", ...]
    plan_ops.op_code(op)             -> an op dict's code: its stored one, or
                                        (plans before 1.10) its name's
"""
import os
import re

DEF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime",
                   "include", "nf", "plan_ops.def")

with open(DEF) as f:
    _text = f.read()

CODES = {name: int(code) for _, code, name in
         re.findall(r'^NF_PLAN_OP\((\w+), (\d+), "([\w.]+)"\)', _text, re.M)}
NAMES = {code: name for name, code in CODES.items()}
ATTRS = re.findall(r'^NF_PLAN_ATTR\(\w+, "(\w+)"\)', _text, re.M)


def op_code(op):
    """The code of an op dict with "name" and optionally "code" (0: absent)."""
    return op.get("code") or CODES.get(op["name"], 0)


def is_op(op, name):
    return op_code(op) == CODES[name]
