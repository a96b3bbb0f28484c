#!/usr/bin/env python3
"""Plot bench_moe's results: one panel per layer (two columns, in the CSV's order), forward
time (ms, log) against tokens T (log, the counts that layer ran), with safecuda's fused
layer, the torch expert loop, torch._grouped_mm and the floor.

    plot_moe.py bench_moe.csv bench_moe.png

The CSV is bench_moe's: config,T,ours_ms,floor_ms,pct_floor,experts_min,experts_max,
weight_gbs,tflops,bound,loop_ms,grouped_ms,baseline_ms,vs_baseline,precision,vs_bf16
("nan" where a value is missing; an older file without the columns after pct_floor but
loop_ms and grouped_ms is drawn too). The floor is the mean of the timed forwards' floors
(the experts each input's routing used); the % beside each point is the median of floor /
time. With --baseline the earlier run's times are drawn as a dotted line. bench_moe --fp8
rows (config NAME-fp8, precision fp8) are drawn on NAME's panel: safecuda's fp8 layer, its
fp8 floor and torch's fp8 _scaled_grouped_mm layer (the fp8 expert loop stays in the CSV);
a NAME-fp8 without a NAME row gets its own panel. Exits non-zero, saying why, when
matplotlib is missing or the CSV holds no rows.
"""
import csv
import math
import sys

SHAPES = {
    "mixtral": "E=8 k=2 H=4096 I=14336",
    "qwen3moe": "E=128 k=8 H=2048 I=768",
    "olmoe": "E=64 k=8 H=2048 I=1024",
    "dsv3": "E=256 k=8 H=7168 I=2048",
    "deepseek_v3": "E=256 k=8 H=7168 I=2048, groups 4/8, shared 2048",
    "kimi_k2": "E=384 k=8 H=7168 I=2048, shared 2048",
    "qwen3_next": "E=512 k=10 H=2048 I=512, gated shared 512",
    "gpt_oss_120b": "E=128 k=4 H=2880 I=2880, clamped SwiGLU, biases",
}

SERIES = (  # column, label, style
    ("ours_ms", "safecuda sc_moe_forward", dict(color="C0", marker="o", lw=2)),
    ("loop_ms", "torch expert loop", dict(color="C3", marker="s", lw=1.2)),
    ("grouped_ms", "torch _grouped_mm", dict(color="C2", marker="^", lw=1.2)),
    ("floor_ms", "floor max(bytes/memory rate, FLOPs/matmul)", dict(color="k", ls="--", lw=1)),
    ("baseline_ms", "baseline (an earlier run)", dict(color="C0", ls=":", marker=".", lw=1)),
)
FP8_SUFFIX = "-fp8"
FP8_SERIES = (  # an fp8 twin's rows on its layer's panel
    ("ours_ms", "safecuda fp8 (e4m3, 128x128 block scales)", dict(color="C1", marker="D", lw=2)),
    ("grouped_ms", "torch fp8 _scaled_grouped_mm (rowwise scales)",
     dict(color="C2", marker="v", ls="-.", lw=1)),
    ("floor_ms", "fp8 floor (e4m3 bytes, e4m3 matmul)", dict(color="0.45", ls="--", lw=1)),
    ("baseline_ms", "fp8 baseline (an earlier run)", dict(color="C1", ls=":", marker=".", lw=1)),
)


def num(text):
    try:
        v = float(text)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) and v > 0 else math.nan


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, NullFormatter
    except Exception as exc:  # noqa: BLE001 - any import failure: no plot
        print(f"matplotlib unavailable: {exc}", file=sys.stderr)
        return 3

    data = {}  # config -> list of rows, in file order
    with open(src, newline="") as f:
        for row in csv.DictReader(f):
            data.setdefault(row["config"], []).append(row)
    if not data:
        print(f"{src}: no rows", file=sys.stderr)
        return 4

    twins = {n: n[:-len(FP8_SUFFIX)] for n in data
             if n.endswith(FP8_SUFFIX) and n[:-len(FP8_SUFFIX)] in data}
    names = [n for n in data if n not in twins]
    ncols = 1 if len(names) == 1 else 2
    nrows = (len(names) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.6 * nrows), squeeze=False)
    twin_of = {base: twin for twin, base in twins.items()}
    for i, name in enumerate(names):
        ax = axes[i // ncols][i % ncols]
        ts = set()
        panel = [(name, SERIES, "C0", 6)]
        if name in twin_of:
            panel.append((twin_of[name], FP8_SERIES, "C1", -10))
        for config, series, color, dy in panel:
            rows = sorted(data[config], key=lambda r: int(r["T"]))
            t_rows = [int(r["T"]) for r in rows]
            ts.update(t_rows)
            for col, label, style in series:
                vs = [num(r.get(col)) for r in rows]  # nan breaks the line: a gap shows
                if any(not math.isnan(v) for v in vs):
                    ax.plot(t_rows, vs, label=label, **style)
            for t, r in zip(t_rows, rows):  # % of floor next to each of our points
                ours, pct = num(r["ours_ms"]), num(r["pct_floor"])
                if not math.isnan(ours) and not math.isnan(pct):
                    ax.annotate(f"{pct:.0f}%", (t, ours), textcoords="offset points",
                                xytext=(4, dy), fontsize=7, color=color)
        ts = sorted(ts)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens T")
        ax.set_ylabel("forward time (ms)")
        ax.set_title(f"{name} ({SHAPES[name]})" if name in SHAPES else name, fontsize=10)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        if ts:
            ax.set_xticks(ts)
            ax.set_xticklabels([str(t) for t in ts], fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
    for j in range(len(names), nrows * ncols):
        axes[j // ncols][j % ncols].axis("off")
    title = "bf16 and fp8" if twins else "bf16"
    fig.suptitle(f"MoE layer forward, {title} (% = floor / safecuda time, the experts used)",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))  # room for the title
    fig.savefig(dst, dpi=120)
    print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
