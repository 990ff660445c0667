#!/usr/bin/env python3
"""Plots the drain benchmark of `cargo xtask bench`: time and instructions per completion
against poll batch size, one line per implementation.

    python3 benches/plot.py target/bench/bench-poll.csv target/bench/bench-poll.png

The CSV (written by xtask) has the columns batch,impl,ns,ir (ir may be empty).
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "c": "C: rdma-core 44 rxe provider (ibv_poll_cq)",
    "rust": "Rust: uverbs Cq::poll",
    "dropin": "C program on the Rust drop-in provider",
}
STYLE = {"c": ("tab:red", "s"), "rust": ("tab:blue", "o"), "dropin": ("tab:gray", "^")}


def main(src, dst):
    data = {}
    with open(src, newline="") as f:
        for row in csv.DictReader(f):
            d = data.setdefault(row["impl"], {"batch": [], "ns": [], "ir": []})
            d["batch"].append(int(row["batch"]))
            d["ns"].append(float(row["ns"]))
            d["ir"].append(float(row["ir"]) if row["ir"] else None)
    fig, (ax_t, ax_i) = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl in ("c", "dropin", "rust"):
        if impl not in data:
            continue
        d = data[impl]
        color, marker = STYLE[impl]
        ax_t.plot(d["batch"], d["ns"], marker=marker, color=color, label=LABELS[impl])
        pts = [(b, i) for b, i in zip(d["batch"], d["ir"]) if i is not None]
        if pts:
            ax_i.plot(*zip(*pts), marker=marker, color=color, label=LABELS[impl])
        if impl == "c":
            # The target: half of C's cost.
            half = dict(color=color, linestyle=":", linewidth=1, label="target: 0.5 × C")
            ax_t.plot(d["batch"], [x / 2 for x in d["ns"]], **half)
            if pts:
                ax_i.plot([b for b, _ in pts], [i / 2 for _, i in pts], **half)
    for ax, title, ylabel in (
        (ax_t, "Time (QEMU TCG guest, median)", "ns per completion"),
        (ax_i, "Instructions (callgrind)", "instructions per completion"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({b for d in data.values() for b in d["batch"]}))
        ax.tick_params(axis="x", labelsize=8, labelrotation=45)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("completions asked for per poll call (batch size)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.suptitle("Draining a CQ holding 4096 ready completions (rxe)")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
