#!/usr/bin/env python3
"""Perplexity vs routed-expert FLOPs: the budget policy against static top-k.

Compiles the demo model with the budget expert policy, then runs
`nfrun eval-ppl` (the model card's protocol: 128 windows of 513 tokens) once
per expert budget and once per static top-k, one run at a time. Prints a
markdown table (also written to --table) and draws perplexity against the
routed-expert FLOPs actually spent (fraction of static top-k, as eval-ppl
reports it), log y-axis, to --plot. matplotlib is needed only for the plot
(--no-plot skips it).

    scripts/expert_budget_curve.py                      # defaults below
    scripts/expert_budget_curve.py --windows 8 --no-plot # quick check
    scripts/expert_budget_curve.py --load r.json         # redraw, no runs
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

BUDGETS = [0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]
TOP_KS = [1, 2, 3, 4]

PPL_RE = re.compile(r"^perplexity: ([0-9.eE+-]+|nan|inf)$", re.M)
FLOPS_RE = re.compile(r"^routed-expert FLOPs: ([0-9.]+) of static top-(\d+)", re.M)
TIME_RE = re.compile(r"^time: ([0-9.]+) s", re.M)


def wait_for(path, seconds=120):
    """The binaries may be rebuilt concurrently: wait until `path` exists."""
    deadline = time.time() + seconds
    while not os.access(path, os.X_OK):
        if time.time() > deadline:
            sys.exit(f"{path}: not found (waited {seconds} s)")
        time.sleep(2)


def run(cmd):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    wait_for(cmd[0])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n"
                 f"{p.stdout}{p.stderr}")
    return p.stdout


def eval_ppl(args, plan, extra):
    cmd = [args.nfrun, "eval-ppl", plan, "--text", args.text] + extra
    if args.windows:
        cmd += ["--windows", str(args.windows)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = run(cmd)
    ppl, flops = PPL_RE.search(out), FLOPS_RE.search(out)
    if not ppl or not flops:
        sys.exit(f"unexpected eval-ppl output:\n{out}")
    t = TIME_RE.search(out)
    r = {"perplexity": float(ppl.group(1)), "flops": float(flops.group(1)),
         "k": int(flops.group(2)), "seconds": float(t.group(1)) if t else None}
    print(f"  perplexity {r['perplexity']:.4f}, FLOPs {r['flops']:.4f}",
          file=sys.stderr, flush=True)
    return r


def measure(args):
    os.makedirs(args.work, exist_ok=True)
    mlir = os.path.join(args.work, "m.mlir")
    plan = os.path.join(args.work, "m.nfb")
    run([args.nfc, "import", args.model, "-o", mlir])
    run([args.nfc, "compile", mlir, "--expert-policy=budget", "-o", plan])
    res = {"budget": {}, "topk": {}}
    for b in args.budgets:
        res["budget"][repr(b)] = eval_ppl(args, plan, ["--expert-budget", repr(b)])
    for k in args.top_ks:
        res["topk"][str(k)] = eval_ppl(args, plan, ["--top-k", str(k)])
    res["windows"] = args.windows or 128
    return res


def card_ppl(model):
    try:
        with open(os.path.join(model, "card.json")) as f:
            return {int(k): v for k, v in json.load(f)["eval_ppl_by_topk"].items()}
    except (OSError, KeyError, ValueError):
        return {}


def static_at(res, flops, tol=1e-3):
    """The static top-k run that spent the same FLOPs, if there is one."""
    for k, r in res["topk"].items():
        if abs(r["flops"] - flops) <= tol:
            return int(k), r
    return None, None


def table(res, card):
    lines = [
        "| budget | routed-expert FLOPs | perplexity (budget) "
        "| static top-k at equal FLOPs | perplexity (static) | budget vs static |",
        "| ---: | ---: | ---: | :---: | ---: | ---: |",
    ]
    for b, r in sorted(res["budget"].items(), key=lambda kv: float(kv[0])):
        k, s = static_at(res, r["flops"])
        if s is None:
            cols = "—", "—", "—"
        else:
            d = 100.0 * (r["perplexity"] / s["perplexity"] - 1.0)
            cols = f"k={k}", f"{s['perplexity']:.2f}", f"{d:+.1f}%"
        lines.append(f"| {float(b):g} | {r['flops']:.4f} | {r['perplexity']:.2f} "
                     f"| {cols[0]} | {cols[1]} | {cols[2]} |")
    lines += [
        "",
        "| static top-k | routed-expert FLOPs | perplexity | model card |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for k, r in sorted(res["topk"].items(), key=lambda kv: int(kv[0])):
        c = card.get(int(k))
        lines.append(f"| {k} | {r['flops']:.4f} | {r['perplexity']:.2f} "
                     f"| {'—' if c is None else f'{c:.2f}'} |")
    return "\n".join(lines) + "\n"


def plot(res, path, windows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    bud = sorted(res["budget"].values(), key=lambda r: r["flops"])
    top = sorted(res["topk"].items(), key=lambda kv: kv[1]["flops"])
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot([r["flops"] for _, r in top], [r["perplexity"] for _, r in top],
            "s--", color="tab:gray", label="static top-k (k = 1, 2, 3, 4; lines join the points)")
    for k, r in top:
        ax.annotate(f"k={k}", (r["flops"], r["perplexity"]),
                    textcoords="offset points", xytext=(6, 6), color="tab:gray")
    ax.plot([r["flops"] for r in bud], [r["perplexity"] for r in bud], "o-",
            color="tab:blue", label="expert budget (B = 0.25 … 1.0)")
    ax.set_yscale("log")
    ys = [r["perplexity"] for r in bud] + [r["perplexity"] for _, r in top]
    ticks = [t for t in (60, 70, 80, 90, 100, 120, 150, 200, 250, 300)
             if min(ys) * 0.9 <= t <= max(ys) * 1.1]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(min(ys) * 0.93, max(ys) * 1.15)
    xs = sorted({round(r["flops"], 4) for r in bud} |
                {round(r["flops"], 4) for _, r in top})
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.set_xlabel("routed-expert FLOPs (fraction of static top-4)")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title(f"pydoc-moe: perplexity vs expert compute ({windows} windows)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nfc", default="build/bin/nfc")
    ap.add_argument("--nfrun", default="build/bin/nfrun")
    ap.add_argument("--model", default="examples/pydoc-moe")
    ap.add_argument("--text", default="examples/pydoc-moe/eval.txt")
    ap.add_argument("--work", default="/tmp/eb", help="where the plan is written")
    ap.add_argument("--budgets", type=float, nargs="+", default=BUDGETS)
    ap.add_argument("--top-ks", type=int, nargs="+", default=TOP_KS)
    ap.add_argument("--windows", type=int, default=0,
                    help="only the first N windows (quick checks; 0: all 128)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--table", help="also write the markdown table here")
    ap.add_argument("--plot", default="docs/expert-budget.png")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--load", help="read results written by --json instead of running")
    args = ap.parse_args()

    if args.load:
        with open(args.load) as f:
            res = json.load(f)
    else:
        res = measure(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    md = table(res, card_ppl(args.model))
    sys.stdout.write(md)
    if args.table:
        with open(args.table, "w") as f:
            f.write(md)
    if not args.no_plot:
        plot(res, args.plot, res.get("windows", 128))


if __name__ == "__main__":
    main()
