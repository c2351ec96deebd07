#!/usr/bin/env python3
"""Draws docs/expert-budget-pareto.png: Nano-shape decode tok/s on the GPU
against pydoc-moe's decode-protocol perplexity at the same setting (budget,
scope, distinct-expert cap), from a CSV of `setting,batch,tok_s,ppl` rows
(bench/results/2026-12-05b/pareto.csv, the table in docs/expert-budget.md).

    python3 scripts/expert_budget_pareto.py [CSV] [PNG]
Needs matplotlib.
"""
import csv
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src = sys.argv[1] if len(sys.argv) > 1 else "bench/results/2026-12-05b/pareto.csv"
dst = sys.argv[2] if len(sys.argv) > 2 else "docs/expert-budget-pareto.png"
rows = list(csv.DictReader(open(src)))
groups = {"request scope": [], "step scope": [], "distinct-expert cap": []}
for r in rows:
    key = ("distinct-expert cap" if r["setting"].startswith("cap")
           else "step scope" if r["setting"].endswith("step")
           else "request scope")
    groups[key].append(r)
    if r["setting"] == "budget 1":  # every curve starts at static top-k
        for g in ("step scope", "distinct-expert cap"):
            groups[g].append(r)
fig, ax = plt.subplots(figsize=(6.4, 4.2))
for (name, pts), marker in zip(groups.items(), "osd"):
    pts.sort(key=lambda r: float(r["tok_s"]))
    ax.plot([float(r["tok_s"]) for r in pts], [float(r["ppl"]) for r in pts],
            marker=marker, label=name)
    for r in pts:
        if r["setting"] != "budget 1" or name == "request scope":
            ax.annotate(r["setting"].replace(" request", "").replace(" step", ""),
                        (float(r["tok_s"]), float(r["ppl"])), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
ax.set_xlabel("Nano-shape decode tok/s, batch %s (H100)" % rows[0]["batch"])
ax.set_ylabel("pydoc-moe decode-protocol perplexity")
ax.set_yscale("log")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(dst, dpi=110)
print("wrote", dst)
