#!/usr/bin/env python3
"""Draws docs/architecture.svg, the layers of nf at a glance: the compiler's
passes, the plan, and the runtime's rooms (standard library only).

    python3 scripts/architecture_diagram.py [OUT.svg]

The boxes below are the source of the picture; edit them here and rerun.
"""
import html
import os
import sys

# (column, row, width in columns, title, lines, colour)
BOXES = [
    # Compiler: nfc (links MLIR)
    (0, 0, 1, "compiler/hf", ["config.json, safetensors headers", "-> ModelConfig, bound weights"], "#dbe9f6"),
    (0, 1, 1, "compiler/import", ["-> nf dialect: nf.model", "nf.weight, nf.mamba2, nf.moe, ..."], "#dbe9f6"),
    (0, 2, 1, "compiler/Transforms", ["OutlineSteps, LowerMixers, LowerMoE,",
                                      "PackWeights, FuseKernels; CUDA kernel",
                                      "choices (Cuda*.cpp); PlanMemory: all bytes"], "#dbe9f6"),
    (0, 3, 1, "compiler/Target/Cuda", ["CUDA C++ per op family (Emit*.cpp)", "over the PlanModel, kernels/*.cuh",
                                       "NVRTC -> cubins + PTX, kernel cache"], "#dbe9f6"),
    (0, 4, 1, "compiler/Plan", ["PlanModel: the module as numbered values", "PlanWriter -> plan.nfb, written once",
                                "(flatbuffer, runtime/schema/plan.fbs)"], "#dbe9f6"),
    # The plan
    (1, 4, 1, "plan.nfb", ["steps: prefill, decode", "values, kernels, launches, memory plan",
                           "weights by name (stay in safetensors)"], "#fbe5c8"),
    # Runtime: libnf (no MLIR)
    (2, 0, 1, "runtime/src/capi", ["C API nf.h, C++ nf.hpp", "models, sequences, batches"], "#dff0d8"),
    (2, 1, 1, "runtime/src/serving", ["scheduler: chunked prefill, admission,", "preemption, priorities, budgets",
                                      "text_stream"], "#dff0d8"),
    (2, 2, 1, "runtime/src/engine", ["backend interface, plan loading,", "sequences, backend selection"], "#dff0d8"),
    (2, 3, 1, "runtime/src/backends", ["cpu/: the exact reference",
                                       "cuda/: driver, modules, graphs, steps"], "#dff0d8"),
    (2, 4, 1, "text, chat, sampling", ["text/: tokenizer.json tokenizer", "chat/: Jinja chat templates",
                                       "sampling/: samplers"], "#dff0d8"),
    # Tools
    (3, 0, 1, "tools/nfc", ["nfc import | compile:", "the compiler column"], "#eeeeee"),
    (3, 1, 1, "tools/nfrun", ["generate, serve (OpenAI HTTP),", "eval-ppl, bench, inspect"], "#eeeeee"),
]
ARROWS = [  # (from box title, to box title)
    ("compiler/hf", "compiler/import"), ("compiler/import", "compiler/Transforms"),
    ("compiler/Transforms", "compiler/Target/Cuda"), ("compiler/Target/Cuda", "compiler/Plan"),
    ("compiler/Plan", "plan.nfb"), ("plan.nfb", "runtime/src/engine"),
    ("runtime/src/capi", "runtime/src/serving"), ("runtime/src/serving", "runtime/src/engine"),
    ("runtime/src/engine", "runtime/src/backends"), ("tools/nfrun", "runtime/src/capi"),
]
HEADINGS = [(0, "nfc: the compiler (MLIR)"), (1, "the plan"), (2, "libnf: the runtime (no MLIR)"), (3, "tools")]
COL_W, COL_GAP, ROW_H, ROW_GAP, TOP, LEFT = 300, 60, 92, 26, 60, 20
LINE_H = 16


def box_rect(col, row, span):
    x = LEFT + col * (COL_W + COL_GAP)
    y = TOP + row * (ROW_H + ROW_GAP)
    return x, y, COL_W * span + COL_GAP * (span - 1), ROW_H


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "docs", "architecture.svg")
    rects = {}
    parts = []
    width = LEFT * 2 + 4 * COL_W + 3 * COL_GAP
    height = TOP + 5 * (ROW_H + ROW_GAP) + 10
    parts.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                 f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif">')
    parts.append('<defs><marker id="a" markerWidth="10" markerHeight="8" refX="9" refY="4" '
                 'orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#555"/></marker></defs>')
    parts.append(f'<rect width="{width}" height="{height}" fill="white"/>')
    for col, text in HEADINGS:
        x = LEFT + col * (COL_W + COL_GAP) + COL_W / 2
        parts.append(f'<text x="{x}" y="{TOP - 24}" text-anchor="middle" font-size="16" '
                     f'font-weight="bold">{html.escape(text)}</text>')
    for col, row, span, title, lines, colour in BOXES:
        x, y, w, h = box_rect(col, row, span)
        rects[title] = (x, y, w, h)
        parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="{colour}" '
                     'stroke="#555"/>')
        parts.append(f'<text x="{x + 10}" y="{y + 20}" font-size="14" font-weight="bold" '
                     f'font-family="monospace">{html.escape(title)}</text>')
        for i, line in enumerate(lines):
            parts.append(f'<text x="{x + 10}" y="{y + 40 + i * LINE_H}" font-size="12">'
                         f'{html.escape(line)}</text>')
    for a, b in ARROWS:
        ax, ay, aw, ah = rects[a]
        bx, by, bw, bh = rects[b]
        if abs(ax - bx) < 1:  # same column: top to bottom
            x1, y1, x2, y2 = ax + aw / 2, ay + ah, bx + bw / 2, by
            if by < ay:
                y1, y2 = ay, by + bh
        else:  # across columns: side to side
            x1 = ax + aw if bx > ax else ax
            x2 = bx if bx > ax else bx + bw
            y1, y2 = ay + ah / 2, by + bh / 2
        parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#555" '
                     'stroke-width="1.5" marker-end="url(#a)"/>')
    parts.append('</svg>')
    with open(out, "w") as f:
        f.write("\n".join(parts) + "\n")
    print(out)


if __name__ == "__main__":
    main()
