#!/usr/bin/env python3
"""Checks the CUDA part of a plan that flatc turned into JSON.

    check_cuda_plan.py PLAN.json ARCH[,ARCH...]

Every kernel of both steps must have one cubin (an ELF image) per
architecture in cubin_archs (= the list given, = Target.archs), PTX of the
lowest one that defines every launched function, at least one launch with a
sane shape and a function name unique in the module that starts with the
kernel's step and index (pk<i>_ / dk<i>_), and a SHA-256 source hash.
A step with nf_moe.select ops must have an expert statistics region (plan
1.8, Step.expert_stats_offset: per select, counts [max_tokens] and experts
[max_tokens, top_k] i32) inside its scratch, clear of every value the plan
places; a step without them, none.
Prints "ok: <kernels> kernels, <launches> launches". Standard library only.
"""
import json
import re
import sys


def load(path):
    text = open(path).read()
    # flatc writes non-finite doubles as bare inf / nan.
    text = re.sub(r"(:\s*)(-?)(inf|nan)\b", lambda m: '%s"%s%s"' % m.groups(), text)
    return json.loads(text)


def check_expert_stats(phase, step):
    values = step.get("values", [])
    ks = []
    for k in step.get("kernels", []):
        for op in k.get("ops", []):
            if op.get("name") == "nf_moe.select":
                experts = values[op["results"][0]]
                ks.append(experts["shape"][-1])
    off = step.get("expert_stats_offset", -1)
    if not ks:
        return [] if off == -1 else ["%s: expert_stats_offset %d without selects" % (phase, off)]
    rows, arena = step["max_tokens"], step["arena_bytes"]
    end = off + 4 * len(ks) * rows * (1 + max(ks))
    if off < arena or end > arena + step["scratch_bytes"]:
        return ["%s: expert statistics [%d, %d) outside the scratch [%d, %d)"
                % (phase, off, end, arena, arena + step["scratch_bytes"])]
    for i, v in enumerate(values):
        lo, n = v.get("offset", -1), v.get("bytes", 0)
        if v.get("kind") in ("Tensor", "Dispatch") and lo >= 0 and n > 0 and lo < end and off < lo + n:
            return ["%s: expert statistics [%d, %d) overlap value %d [%d, %d)"
                    % (phase, off, end, i, lo, lo + n)]
    return []


def main():
    plan = load(sys.argv[1])
    archs = sys.argv[2].split(",")
    fail = []
    target = plan.get("target", {})
    if target.get("backend") != "cuda" or target.get("archs") != archs:
        fail.append("target %s, expected cuda %s" % (target, archs))
    kernels = launches = 0
    for phase, prefix in (("prefill", "p"), ("decode", "d")):
        for i, k in enumerate(plan[phase]["kernels"]):
            where = "%s kernel %d '%s'" % (phase, i, k.get("name"))
            kernels += 1
            if k.get("cubin_archs") != archs:
                fail.append("%s: cubin_archs %s" % (where, k.get("cubin_archs")))
            cubins = k.get("cubins", [])
            if len(cubins) != len(archs) or any(
                    bytes(c.get("data", [])[:4]) != b"\x7fELF" for c in cubins):
                fail.append("%s: %d cubins, not ELF images for %s" % (where, len(cubins), archs))
            ptx = k.get("ptx", "")
            if ".target %s" % archs[0] not in ptx:
                fail.append("%s: no PTX for %s" % (where, archs[0]))
            names = [l["function"] for l in k.get("launches", [])]
            if not names or len(set(names)) != len(names):
                fail.append("%s: launches %s" % (where, names))
            for l in k.get("launches", []):
                launches += 1
                fn = l["function"]
                if not fn.startswith("%sk%d_op" % (prefix, i)):
                    fail.append("%s: function %s" % (where, fn))
                if ".entry %s(" % fn not in ptx:
                    fail.append("%s: %s not in the PTX" % (where, fn))
                if not (1 <= l["grid"] <= 65535 and 1 <= l["block"] <= 1024):
                    fail.append("%s: %s launch <<<%d, %d>>>" % (where, fn, l["grid"], l["block"]))
                if l.get("cooperative"):
                    fail.append("%s: %s needs a grid barrier" % (where, fn))
            if not re.fullmatch(r"[0-9a-f]{64}", k.get("source_hash", "")):
                fail.append("%s: source_hash %r" % (where, k.get("source_hash")))
    for phase in ("prefill", "decode"):
        fail += check_expert_stats(phase, plan[phase])
    if fail:
        sys.exit("\n".join(fail[:20]))
    print("ok: %d kernels, %d launches" % (kernels, launches))


if __name__ == "__main__":
    main()
