#!/usr/bin/env python3
"""Runs a CUDA plan (nfc compile --target=cuda) on a GPU and checks it.

    check_plan.py PLAN MODEL_DIR [REFERENCE] [--chunk N] [--budget B]
                  [--time] [--time-tokens N]

A minimal stand-in for the runtime's CUDA backend, written from the same
contract (runtime/schema/plan.fbs, kernels/nf_abi.h): it loads every
kernel's cubin, packs the weights as Plan.weights describes (stacked experts
contiguous, concat_rows concatenated, plan dtype), allocates the arena and
the state storage, and runs steps launch by launch. Checks:
  - prefill of every reference prompt in ONE step (sequences of different
    lengths), logits within 1e-4 * max(1, max |ref|) of the reference;
  - greedy decode of all prompts together (one token per sequence per step),
    logits against the reference (fixtures) or the greedy tokens (pydoc-moe);
  - chunked prefill (--chunk N tokens per sequence and step): the conv window,
    SSM state and KV cache carry over between steps;
  - the budget policy at --budget B: each select's counts against a port of
    runtime/src/backends/cpu/expert_budget.cpp run on the kernel's own
    candidates, and the dispatch layout against the counts;
    experts_per_token = 1 override;
  - --time: per-launch times (CUDA events) of a max-token prefill and a full
    decode step.
Needs numpy and cupy (both on the H200 image); the plan is read with a small
built-in flatbuffers reader, so no generated code is needed.
"""
import argparse
import heapq
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import plan_ops  # noqa: E402  (runtime/include/nf/plan_ops.def)

try:
    import cupy as cp
except ImportError:  # parsing works without a GPU (tests of this script)
    cp = None


# ---------------------------------------------------------------------------
# Flatbuffers (read-only, by field index in the order of plan.fbs)

class Table:
    def __init__(self, buf, pos):
        self.buf, self.pos = buf, pos
        vt = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vt = vt
        self.vtsize = struct.unpack_from("<H", buf, vt)[0]

    def _field(self, i):
        o = 4 + 2 * i
        if o >= self.vtsize:
            return None
        off = struct.unpack_from("<H", self.buf, self.vt + o)[0]
        return self.pos + off if off else None

    def scalar(self, i, fmt, default=0):
        p = self._field(i)
        return default if p is None else struct.unpack_from("<" + fmt, self.buf, p)[0]

    def _indirect(self, p):
        return p + struct.unpack_from("<I", self.buf, p)[0]

    def table(self, i):
        p = self._field(i)
        return None if p is None else Table(self.buf, self._indirect(p))

    def string(self, i):
        p = self._field(i)
        if p is None:
            return None
        s = self._indirect(p)
        n = struct.unpack_from("<I", self.buf, s)[0]
        return self.buf[s + 4: s + 4 + n].decode()

    def _vector(self, i):
        p = self._field(i)
        if p is None:
            return None, 0
        v = self._indirect(p)
        return v + 4, struct.unpack_from("<I", self.buf, v)[0]

    def scalars(self, i, fmt):
        start, n = self._vector(i)
        if start is None:
            return []
        size = struct.calcsize(fmt)
        return list(struct.unpack_from("<%d%s" % (n, fmt), self.buf, start)) if n else []

    def bytes(self, i):
        start, n = self._vector(i)
        return b"" if start is None else self.buf[start: start + n]

    def tables(self, i):
        start, n = self._vector(i)
        if start is None:
            return []
        return [Table(self.buf, self._indirect(start + 4 * k)) for k in range(n)]

    def strings(self, i):
        start, n = self._vector(i)
        out = []
        for k in range(n if start is not None else 0):
            s = self._indirect(start + 4 * k)
            m = struct.unpack_from("<I", self.buf, s)[0]
            out.append(self.buf[s + 4: s + 4 + m].decode())
        return out


DTYPES = {0: ("F32", 4), 1: ("BF16", 2), 2: ("F16", 2), 3: ("I32", 4), 4: ("I64", 8)}
KIND_TENSOR, KIND_WEIGHT, KIND_BATCH, KIND_DISPATCH, KIND_TOKENS, KIND_BUDGET = range(6)


def parse_plan(path):
    if path.endswith(".gz"):
        import gzip
        buf = gzip.open(path, "rb").read()
    else:
        buf = open(path, "rb").read()
    assert buf[4:8] == b"NFPL", "not a plan"
    root = Table(buf, struct.unpack_from("<I", buf, 0)[0])
    plan = {
        "version": (root.scalar(0, "I"), root.scalar(1, "I")),
        "policy": root.string(9),
        "weights": [],
        "storage": [],
    }
    cfg = root.table(3)
    plan["vocab"] = cfg.scalar(1, "q")
    plan["weight_files"] = cfg.strings(8)
    for w in root.tables(4):
        plan["weights"].append({
            "tensors": w.strings(0), "stacked": bool(w.scalar(1, "B")),
            "concat_rows": w.scalars(2, "q"), "dtype": DTYPES[w.scalar(3, "b")][0],
            "shape": w.scalars(4, "q")})
    for s in root.tables(5):
        plan["storage"].append({
            "name": s.string(0), "kind": s.scalar(1, "b"), "page_size": s.scalar(3, "q"),
            "num_pages": s.scalar(4, "q"), "kv_heads": s.scalar(5, "q"),
            "head_dim": s.scalar(6, "q"), "slots": s.scalar(8, "q"),
            "conv_dim": s.scalar(9, "q"), "conv_window": s.scalar(10, "q"),
            "num_heads": s.scalar(11, "q"), "state_size": s.scalar(12, "q")})
    target = root.table(8)
    plan["backend"] = target.string(0) if target else None
    plan["archs"] = target.strings(1) if target else []
    for phase, idx in (("prefill", 6), ("decode", 7)):
        st = root.table(idx)
        step = {"values": [], "kernels": [], "logits": st.scalar(6, "i"),
                "max_tokens": st.scalar(7, "q"), "arena_bytes": st.scalar(8, "q"),
                "scratch_bytes": st.scalar(10, "q")}
        for v in st.tables(1):
            step["values"].append({
                "kind": v.scalar(0, "b"), "dtype": DTYPES[v.scalar(1, "b")][0],
                "shape": v.scalars(3, "q"), "offset": v.scalar(4, "q", -1),
                "bytes": v.scalar(5, "q"), "weight": v.scalar(6, "i", -1),
                "num_experts": v.scalar(7, "i"), "max_per_token": v.scalar(8, "i")})
        for k in st.tables(2):
            ops = []
            for op in k.tables(3):
                ops.append({"name": op.string(0), "operands": op.scalars(1, "i"),
                            "results": op.scalars(2, "i"),
                            "ints": {a.string(0): a.scalar(1, "q") for a in op.tables(4)},
                            "floats": {a.string(0): a.scalar(1, "d") for a in op.tables(5)},
                            "strings": {a.string(0): a.string(1) for a in op.tables(6)},
                            "code": op.scalar(8, "H")})
            step["kernels"].append({
                "name": k.string(0), "ops": ops, "archs": k.strings(4),
                "cubins": [c.bytes(0) for c in k.tables(5)], "ptx": k.string(6),
                "launches": [(l.string(0), l.scalar(1, "I"), l.scalar(2, "I"),
                              l.scalar(3, "I"), bool(l.scalar(4, "B")))
                             for l in k.tables(7)],
                "source_hash": k.string(8)})
        plan[phase] = step
    return plan


# ---------------------------------------------------------------------------
# Weights

def safetensors_index(paths):
    index = {}
    for path in paths:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        for name, info in header.items():
            index[name] = (path, 8 + n, info)
    return index


def read_safetensors(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64, "F64": np.float64, "I32": np.int32}[info["dtype"]]
        out[name] = np.frombuffer(blob[8 + n + b: 8 + n + e], dtype=dt).reshape(info["shape"])
    return out


def pack_weight(w, index, maps):
    parts = []
    for name in w["tensors"]:
        path, base, info = index[name]
        if info["dtype"] != w["dtype"]:
            raise SystemExit("%s: dtype %s, plan says %s" % (name, info["dtype"], w["dtype"]))
        if path not in maps:
            maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        b, e = info["data_offsets"]
        parts.append(np.asarray(maps[path][base + b: base + e]))
    return np.concatenate(parts)


# ---------------------------------------------------------------------------
# The runner

def random_weight(w, rng):
    """Plausible random values for a weight entry (by its first tensor's name),
    as raw bytes of the plan dtype on the device."""
    name, shape = w["tensors"][0], w["shape"]
    n = int(np.prod(shape))
    if name.endswith("A_log"):
        x = cp.log(rng.uniform(1.0, 16.0, n, dtype=cp.float32))
    elif name.endswith(".D"):
        x = rng.standard_normal(n, dtype=cp.float32)
    elif name.endswith("dt_bias"):
        dt = rng.uniform(0.001, 0.1, n, dtype=cp.float32)
        x = cp.log(cp.expm1(dt))
    elif name.endswith("conv1d.bias"):
        x = 0.2 * rng.standard_normal(n, dtype=cp.float32)
    elif name.endswith("conv1d.weight"):
        x = 0.5 * rng.standard_normal(n, dtype=cp.float32)
    elif name.endswith("e_score_correction_bias"):
        x = 0.05 * rng.standard_normal(n, dtype=cp.float32)
    elif "norm" in name and len(shape) == 1:
        x = 1.0 + 0.2 * rng.standard_normal(n, dtype=cp.float32)
    elif name.endswith("embeddings.weight"):
        x = rng.standard_normal(n, dtype=cp.float32)
    else:
        x = rng.standard_normal(n, dtype=cp.float32) * (float(shape[-1]) ** -0.5)
    x = x.astype(cp.float32)
    if w["dtype"] == "F32":
        return x.view(cp.uint8)
    if w["dtype"] == "F16":
        return x.astype(cp.float16).view(cp.uint8)
    bits = x.view(cp.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    return bits.astype(cp.uint16).view(cp.uint8)


class Runner:
    def __init__(self, plan_path, model_dir, kv_pages=None):
        self.plan = parse_plan(plan_path)
        p = self.plan
        if p["backend"] != "cuda":
            raise SystemExit("%s: target %s, not cuda" % (plan_path, p["backend"]))
        self.weights = []
        if model_dir is None:
            rng = cp.random.default_rng(0)
            for w in p["weights"]:
                self.weights.append(random_weight(w, rng))
        else:
            index = safetensors_index([os.path.join(model_dir, f) for f in p["weight_files"]])
            maps = {}
            for w in p["weights"]:
                data = pack_weight(w, index, maps)
                n = int(np.prod(w["shape"])) * {"F32": 4, "BF16": 2, "F16": 2}[w["dtype"]]
                assert data.size == n, (w["tensors"][0], data.size, n)
                self.weights.append(cp.asarray(data))
        self.weight_ptrs = cp.asarray(np.array([a.data.ptr for a in self.weights], np.uint64))
        self.storage = []
        self.page_size, self.num_pages, self.slots = 1, 1, 64
        for s in p["storage"]:
            if s["kind"] == 0:  # KV cache
                if kv_pages:
                    s["num_pages"] = kv_pages
                shape = (s["num_pages"], s["page_size"], s["kv_heads"], s["head_dim"])
                self.storage += [cp.zeros(shape, cp.float32), cp.zeros(shape, cp.float32)]
                self.page_size, self.num_pages = s["page_size"], s["num_pages"]
            else:
                self.slots = s["slots"]
                self.storage += [
                    cp.zeros((s["slots"], s["conv_dim"], s["conv_window"]), cp.float32),
                    cp.zeros((s["slots"], s["num_heads"], s["head_dim"], s["state_size"]),
                             cp.float32)]
        ptrs = [a.data.ptr for a in self.storage] or [0]
        self.storage_ptrs = cp.asarray(np.array(ptrs, np.uint64))
        size = max(p[ph]["arena_bytes"] + p[ph]["scratch_bytes"] for ph in ("prefill", "decode"))
        self.arena = cp.zeros(size + 256, cp.uint8)
        self.arch_index = 0
        dev = cp.cuda.Device()
        cc = "sm_%d%d" % dev.compute_capability if isinstance(dev.compute_capability, tuple) \
            else "sm_" + dev.compute_capability
        for ph in ("prefill", "decode"):
            for k in p[ph]["kernels"]:
                mod = cp.cuda.function.Module()
                if cc in k["archs"]:
                    mod.load(k["cubins"][k["archs"].index(cc)])
                else:
                    mod.load(k["ptx"].encode())
                k["module"] = mod
                k["functions"] = [(mod.get_function(f), g, b, s) for f, g, b, s, _ in k["launches"]]
        self.max_pages_per_seq = self.num_pages
        self.free_pages = list(range(self.num_pages))
        self.seqs = {}  # id -> dict(slot, length, pages)
        self.next_id = 0

    def add_sequence(self):
        used = {s["slot"] for s in self.seqs.values()}
        slot = next(i for i in range(self.slots) if i not in used)
        for i, a in enumerate(self.storage):
            if self.plan["storage"][i // 2]["kind"] == 1:
                a[slot] = 0  # a fresh sequence starts from zero state
        sid = self.next_id
        self.next_id += 1
        self.seqs[sid] = {"slot": slot, "length": 0, "pages": []}
        return sid

    def step(self, inputs, budget=1.0, experts_per_token=0, hook=None, timer=None):
        """inputs: [(sequence id, [tokens])]. Returns logits [T, V] (numpy)."""
        decode = all(len(t) == 1 for _, t in inputs)
        st = self.plan["decode" if decode else "prefill"]
        T = sum(len(t) for _, t in inputs)
        assert T <= st["max_tokens"], (T, st["max_tokens"])
        tokens, token_seq, descs = [], [], []
        pt = np.zeros((len(inputs), self.max_pages_per_seq), np.int32)
        for i, (sid, toks) in enumerate(inputs):
            s = self.seqs[sid]
            need = -(-(s["length"] + len(toks)) // self.page_size)
            while len(s["pages"]) < need:
                s["pages"].append(self.free_pages.pop(0))
            pt[i, :len(s["pages"])] = s["pages"]
            descs.append((len(tokens), len(toks), s["length"], s["slot"]))
            token_seq += [i] * len(toks)
            tokens += list(toks)
        keep = [cp.asarray(np.array(tokens, np.int32)),
                cp.asarray(np.full(T, budget, np.float32)),
                cp.asarray(np.array(descs, np.int32).reshape(-1, 4)),
                cp.asarray(np.array(token_seq, np.int32)),
                cp.asarray(pt)]
        args = struct.pack("<8Q4i", self.arena.data.ptr, self.weight_ptrs.data.ptr,
                           self.storage_ptrs.data.ptr, *[a.data.ptr for a in keep],
                           T, len(inputs), self.max_pages_per_seq, experts_per_token)
        dargs = cp.asarray(np.frombuffer(args, np.uint8))
        for ki, k in enumerate(st["kernels"]):
            for li, (fn, grid, block, shared) in enumerate(k["functions"]):
                if timer is not None:
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                fn((grid,), (block,), (dargs,), shared_mem=shared)
                if timer is not None:
                    e1.record()
                    timer.append((k["launches"][li][0], e0, e1))
                if hook is not None:
                    hook(st, k, k["launches"][li][0], T, descs)
        cp.cuda.Device().synchronize()
        for sid, toks in inputs:
            self.seqs[sid]["length"] += len(toks)
        lv = st["values"][st["logits"]]
        V = self.plan["vocab"]
        out = self.arena[lv["offset"]: lv["offset"] + T * V * 4].view(cp.float32)
        return cp.asnumpy(out).reshape(T, V)

    def value(self, st, v, T):
        val = st["values"][v]
        cols = int(np.prod(val["shape"][1:]))
        dt = cp.int32 if val["dtype"] == "I32" else cp.float32
        a = self.arena[val["offset"]: val["offset"] + T * cols * 4].view(dt)
        return cp.asnumpy(a).reshape(T, cols)


# ---------------------------------------------------------------------------
# Budget policy (port of runtime/src/backends/cpu/expert_budget.cpp)

def allocate_budget(w, k, min_k, groups, counts):
    min_k = max(0, min(min_k, k))
    for begin, count, budget in groups:
        calls = int(round_half_away(float(budget) * k * count))
        calls = max(min_k * count, min(k * count, calls))
        remaining = calls - min_k * count
        total = []
        for i in range(count):
            t = 0.0
            for r in range(k):
                t += float(w[begin + i][r])
            total.append(t)
            counts[begin + i] = min_k

        def share(i, c):
            cov = 0.0
            for r in range(c):
                cov += float(w[begin + i][r])
            return 1.0 - cov / total[i] if total[i] > 0 else 0.0
        heap = []
        if min_k < k:
            for i in range(count):
                heapq.heappush(heap, (-share(i, min_k), min_k, i))
        while remaining > 0 and heap:
            _, c, i = heapq.heappop(heap)
            counts[begin + i] += 1
            c += 1
            remaining -= 1
            if c < k:
                heapq.heappush(heap, (-share(i, c), c, i))


def round_half_away(x):
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


# ---------------------------------------------------------------------------
# Checks

def rel_err(ours, ref):
    return float(np.max(np.abs(ours - ref)) / max(1.0, float(np.max(np.abs(ref)))))


def check_reference(runner, ref, chunk):
    prompts = sorted({k.split(".")[0] for k in ref if k.endswith(".tokens")})
    has_greedy_logits = any(k.endswith(".greedy_logits") for k in ref)
    worst = 0.0
    # 1. one prefill step with every prompt
    seqs = [runner.add_sequence() for _ in prompts]
    logits = runner.step([(s, [int(t) for t in ref[p + ".tokens"]]) for s, p in zip(seqs, prompts)])
    row = 0
    for p in prompts:
        n = len(ref[p + ".tokens"])
        err = rel_err(logits[row:row + n], ref[p + ".prefill_logits"])
        worst = max(worst, err)
        print("  prefill %s (%d tokens): rel err %.3g" % (p, n, err))
        row += n
    # 2. greedy decode of all prompts together
    steps = min(len(ref[p + ".greedy_tokens"]) for p in prompts)
    last = {p: int(np.argmax(logits[sum(len(ref[q + ".tokens"]) for q in prompts[:i + 1]) - 1]))
            for i, p in enumerate(prompts)}
    for p in prompts:
        if last[p] != int(ref[p + ".greedy_tokens"][0]):
            print("  FAIL %s: first greedy token %d, reference %d" % (p, last[p], ref[p + ".greedy_tokens"][0]))
            return False, worst
    derr = 0.0
    for s in range(steps - (0 if has_greedy_logits else 1)):
        out = runner.step([(sq, [int(ref[p + ".greedy_tokens"][s])]) for sq, p in zip(seqs, prompts)])
        for i, p in enumerate(prompts):
            if has_greedy_logits:
                derr = max(derr, rel_err(out[i], ref[p + ".greedy_logits"][s]))
            elif int(np.argmax(out[i])) != int(ref[p + ".greedy_tokens"][s + 1]):
                print("  FAIL %s: greedy token %d differs" % (p, s + 1))
                return False, worst
    worst = max(worst, derr)
    print("  decode: %d steps x %d sequences, rel err %.3g" % (steps, len(prompts), derr))
    for s in seqs:
        release(runner, s)
    # 3. chunked prefill
    seqs = [runner.add_sequence() for _ in prompts]
    toks = {p: [int(t) for t in ref[p + ".tokens"]] for p in prompts}
    got = {p: [] for p in prompts}
    pos = 0
    while any(pos < len(toks[p]) for p in prompts):
        batch = [(s, toks[p][pos:pos + chunk]) for s, p in zip(seqs, prompts) if pos < len(toks[p])]
        out = runner.step(batch)
        r = 0
        for s, t in batch:
            p = prompts[seqs.index(s)]
            got[p].append(out[r:r + len(t)])
            r += len(t)
        pos += chunk
    cerr = max(rel_err(np.concatenate(got[p]), ref[p + ".prefill_logits"]) for p in prompts)
    worst = max(worst, cerr)
    print("  chunked prefill (%d tokens a step): rel err %.3g" % (chunk, cerr))
    for s in seqs:
        release(runner, s)
    ok = worst <= 1e-4
    print("  %s: worst relative error %.3g" % ("ok" if ok else "FAIL", worst))
    return ok, worst


def release(runner, sid):
    s = runner.seqs.pop(sid)
    runner.free_pages = sorted(runner.free_pages + s["pages"])


def check_budget(runner, budget, tokens_per_seq):
    """Select counts at `budget` against the CPU algorithm on the GPU's own
    candidates, and the dispatch layout against the counts."""
    if runner.plan["policy"] != "budget":
        print("  budget: plan policy is %s, skipped" % runner.plan["policy"])
        return True
    rng = np.random.default_rng(0)
    V = runner.plan["vocab"]
    seqs = [runner.add_sequence() for _ in tokens_per_seq]
    inputs = [(s, [int(x) for x in rng.integers(0, V, n)]) for s, n in zip(seqs, tokens_per_seq)]
    state = {"bad": 0, "checked": 0}

    def hook(st, kernel, fn, T, descs):
        sel = next((op for op in kernel["ops"] if plan_ops.is_op(op, "nf_moe.select")), None)
        if sel is None:
            return
        ex, wv, cv = sel["results"]
        K = sel["ints"]["top_k"]
        if "moe_route" in fn or "moe_select" in fn:
            state["cand"] = runner.value(st, wv, T).copy()
            state["experts"] = runner.value(st, ex, T).copy()
        elif "moe_budget" in fn:
            counts = np.zeros(T, np.int64)
            allocate_budget(state["cand"], K, sel["ints"].get("min_k", K),
                            [(d[0], d[1], budget) for d in descs], counts)
            got = runner.value(st, cv, T)[:, 0]
            state["checked"] += 1
            if not np.array_equal(got, counts):
                state["bad"] += 1
                print("  FAIL %s: counts differ at %d tokens" % (fn, int(np.sum(got != counts))))
            ew = runner.value(st, wv, T)
            ee = runner.value(st, ex, T)
            for t in range(T):
                kt = counts[t]
                c = state["cand"][t].astype(np.float64)
                norm = 1.0 / (c[:kt].sum() + 1e-20) if sel["ints"]["norm_topk_prob"] else 1.0
                want = (c[:kt] * norm * sel["floats"]["routed_scaling_factor"]).astype(np.float32)
                if (np.abs(ew[t, :kt] - want).max(initial=0) > 1e-6 or np.any(ee[t, kt:] != -1)
                        or np.any(ee[t, :kt] != state["experts"][t, :kt])):
                    state["bad"] += 1
                    print("  FAIL %s: token %d weights/experts" % (fn, t))
                    break
        elif "moe_dispatch" in fn:
            disp_v = next(op for op in kernel["ops"] if plan_ops.is_op(op, "nf_moe.dispatch"))["results"][0]
            dv = st["values"][disp_v]
            E, M = dv["num_experts"], dv["max_per_token"]
            raw = cp.asnumpy(runner.arena[dv["offset"]: dv["offset"] + 4 * (E + 1 + 2 * T * M)].view(cp.int32))
            off, row_token, slot_row = raw[:E + 1], raw[E + 1:E + 1 + T * M], raw[E + 1 + T * M:]
            counts = runner.value(st, cv, T)[:, 0]
            experts = runner.value(st, ex, T)
            want_rows = []
            for e in range(E):
                for t in range(T):
                    for j in range(counts[t]):
                        if experts[t, j] == e:
                            want_rows.append((t, j))
            ok = off[0] == 0 and off[E] == len(want_rows)
            if ok:
                for r, (t, j) in enumerate(want_rows):
                    ok &= row_token[r] == t and slot_row[t * M + j] == r
            state["checked"] += 1
            if not ok:
                state["bad"] += 1
                print("  FAIL %s: dispatch layout" % fn)

    runner.step(inputs, budget=budget, hook=hook)
    for s in seqs:
        release(runner, s)
    # The static override: one expert per token.
    seqs = [runner.add_sequence() for _ in tokens_per_seq]
    inputs = [(s, [int(x) for x in rng.integers(0, V, n)]) for s, n in zip(seqs, tokens_per_seq)]

    def hook1(st, kernel, fn, T, descs):
        sel = next((op for op in kernel["ops"] if plan_ops.is_op(op, "nf_moe.select")), None)
        if sel is not None and "moe_dispatch" in fn:
            counts = runner.value(st, sel["results"][2], T)[:, 0]
            state["checked"] += 1
            if np.any(counts != 1):
                state["bad"] += 1
                print("  FAIL experts_per_token=1: counts %s" % counts[:8])
    runner.step(inputs, budget=budget, experts_per_token=1, hook=hook1)
    for s in seqs:
        release(runner, s)
    print("  budget %.2f: %d launches checked, %s" % (budget, state["checked"],
                                                     "ok" if not state["bad"] else "FAIL"))
    return state["bad"] == 0


def time_steps(runner, tokens):
    V = runner.plan["vocab"]
    rng = np.random.default_rng(1)
    n = min(tokens, runner.plan["prefill"]["max_tokens"])
    nseq = min(runner.plan["decode"]["max_tokens"], runner.slots)

    def report(label, timer):
        agg, total = {}, 0.0
        for fn, e0, e1 in timer:
            ms = cp.cuda.get_elapsed_time(e0, e1)
            kind = fn.split("_", 2)[2]
            agg[kind] = agg.get(kind, 0.0) + ms
            total += ms
        print("  %s: %.3f ms in %d launches (sum of launch times)" % (label, total, len(timer)))
        for kind, ms in sorted(agg.items(), key=lambda x: -x[1])[:10]:
            print("    %-24s %8.3f ms" % (kind, ms))

    s = runner.add_sequence()
    prompt = [int(x) for x in rng.integers(0, V, n)]
    for i in range(3):
        runner.seqs[s]["length"] = 0
        timer = []
        runner.step([(s, prompt)], timer=timer)
    report("prefill of %d tokens (1 sequence)" % n, timer)
    release(runner, s)
    seqs = [runner.add_sequence() for _ in range(nseq)]
    runner.step([(q, [int(x) for x in rng.integers(0, V, 16)]) for q in seqs])
    for i in range(3):
        timer = []
        runner.step([(q, [int(rng.integers(0, V))]) for q in seqs], timer=timer)
    report("decode step of %d sequences (context ~18)" % nseq, timer)
    for q in seqs:
        release(runner, q)


def check_consistency(runner, n, chunk):
    """Without a reference: one prefill of n tokens, the same in chunks, and
    n/2 prefilled + n/2 decoded give the same logits."""
    rng = np.random.default_rng(2)
    toks = [int(x) for x in rng.integers(0, runner.plan["vocab"], n)]
    a = runner.add_sequence()
    full = runner.step([(a, toks)])
    b = runner.add_sequence()
    parts = []
    for i in range(0, n, chunk):
        parts.append(runner.step([(b, toks[i:i + chunk])]))
    chunked = np.concatenate(parts)
    c = runner.add_sequence()
    h = n // 2
    rows = [runner.step([(c, toks[:h])])]
    for t in toks[h:]:
        rows.append(runner.step([(c, [t])]))
    mixed = np.concatenate(rows)
    for q in (a, b, c):
        release(runner, q)
    e1, e2 = rel_err(chunked, full), rel_err(mixed, full)
    agree = float(np.mean(np.argmax(chunked, 1) == np.argmax(full, 1)))
    ok = np.all(np.isfinite(full)) and e1 < 1e-3 and e2 < 1e-3
    print("  consistency (%d tokens): chunked %.3g, prefill+decode %.3g, argmax agreement %.3f: %s"
          % (n, e1, e2, agree, "ok" if ok else "FAIL"))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("model_dir", help="checkpoint directory, or 'random' for random weights")
    ap.add_argument("reference", nargs="?")
    ap.add_argument("--kv-pages", type=int, default=0, help="override the plan's KV pages")
    ap.add_argument("--consistency", type=int, default=0,
                    help="check prefill / chunked / decode agreement on N random tokens")
    ap.add_argument("--chunk", type=int, default=7)
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--time-tokens", type=int, default=2048)
    args = ap.parse_args()
    runner = Runner(args.plan, None if args.model_dir == "random" else args.model_dir,
                    args.kv_pages)
    print("%s: %d + %d kernels, %s" % (args.plan, len(runner.plan["prefill"]["kernels"]),
                                       len(runner.plan["decode"]["kernels"]), runner.plan["archs"]))
    ok = True
    if args.reference:
        ref = read_safetensors(args.reference)
        ok &= check_reference(runner, ref, args.chunk)[0]
    if args.consistency:
        ok &= check_consistency(runner, args.consistency, args.chunk)
    ok &= check_budget(runner, args.budget, [1, 9, 30, 2])
    if args.time:
        time_steps(runner, args.time_tokens)
    print("RESULT: %s" % ("ok" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
