"""Checks the regions nf-plan-memory places after the kernel results.

Reads the IR printed after the pass (stdin) and, for each step, checks what
Passes.td promises: kernel-internal values start at nf.arena_bytes and stay
below arena + nf.scratch_bytes; each bf16 copy (nf.copy_offset) sits after
them, at the copies' base + half its value's offset, below
nf.reserved_bytes; the expert statistics region (when present) after every
copy and below nf.reserved_bytes; each kernel's scratch regions
(nf.kernel_scratch, nf.kernel_scratch_offsets on its ops) aligned, in order
and disjoint, after the arena, nf.reserved_bytes and the kernel's own
internal values, and below nf.kernel_scratch_end; the regions used after
the step (nf.after_step_scratch) after all of them and below the end.
Prints one line per step.
"""
import re
import sys

ALIGN = 256


def align(v):
    return (v + ALIGN - 1) // ALIGN * ALIGN


def ints(s):
    return [int(x) for x in re.findall(r"-?\d+", s)]


def main():
    text = sys.stdin.read()
    steps = re.split(r"(?=func\.func @)", text)[1:]
    failures = 0
    for step in steps:
        name = re.match(r"func\.func @(\w+)", step).group(1)
        attr = {k: int(v) for k, v in re.findall(r"(nf\.\w+) = (\d+) : i64", step)}
        arena, scratch = attr["nf.arena_bytes"], attr["nf.scratch_bytes"]
        reserved = attr["nf.reserved_bytes"]
        internal = []
        for m in re.finditer(r"(?<![\w.])scratch_offsets = array<i64(?::([^>]*))?>", step):
            internal += ints(m.group(1) or "")
        copies = [int(x) for x in re.findall(r"nf\.copy_offset = (\d+)", step)]
        base = align(arena + scratch)
        errors = []
        if any(o < arena or o >= arena + scratch for o in internal):
            errors.append("an internal value outside [arena, arena + scratch)")
        for c in copies:
            if c < base or c >= reserved or c % 32:
                errors.append(f"copy at {c} outside [{base}, {reserved})")
            # a copy at base + o / 2 names a value offset o inside the step
            if 2 * (c - base) >= arena + scratch:
                errors.append(f"copy at {c} names no value")
        stats = attr.get("nf.expert_stats_offset")
        if stats is not None:
            if stats < max(copies, default=base) or stats >= reserved:
                errors.append(f"expert statistics at {stats} overlap or pass the end")
        elif copies and reserved < max(copies):
            errors.append("reserved bytes end before the copies")
        regions, after = 0, 0
        end = attr.get("nf.kernel_scratch_end", 0)
        last = max(arena + scratch, reserved)
        if end < max(arena + scratch, reserved):
            errors.append(f"kernel scratch end {end} before the regions")
        for kernel in re.split(r"(?=nf\.kernel \")", step)[1:]:
            own = re.search(r"(?<![\w.])scratch_offsets = array<i64(?::([^>]*))?>", kernel)
            top = max(arena, reserved, *(ints(own.group(1) or "") if own else []))
            for m in re.finditer(r"nf\.kernel_scratch = array<i64: ([^>]*)>, "
                                 r"nf\.kernel_scratch_offsets = array<i64: ([^>]*)>",
                                 kernel):
                for n, o in zip(ints(m.group(1)), ints(m.group(2))):
                    regions += 1
                    if o % ALIGN or o < top or o + n > end:
                        errors.append(f"kernel scratch at {o} ({n} bytes) "
                                      f"overlaps or passes the end")
                    top = max(top, o + n)
                    last = max(last, top)
        for m in re.finditer(r"nf\.after_step_scratch = array<i64: ([^>]*)>, "
                             r"nf\.after_step_scratch_offsets = array<i64: ([^>]*)>",
                             step):
            for n, o in zip(ints(m.group(1)), ints(m.group(2))):
                after += 1
                if o % ALIGN or o < last or o + n > end:
                    errors.append(f"after-step region at {o} ({n} bytes) "
                                  f"overlaps or passes the end")
                last = o + n
        print(f"{name}: {len(internal)} internal, {len(copies)} copies, "
              f"{regions} kernel scratch, {after} after the step, "
              f"stats {'yes' if stats is not None else 'no'}, "
              f"{'ok' if not errors else 'FAIL ' + '; '.join(errors)}")
        failures += bool(errors)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
