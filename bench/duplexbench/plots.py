"""The paper's figures, drawn from this run's medians (PNG, matplotlib)."""

from pathlib import Path

from .report import find, sweep

COLORS = {"ceph": "#c0504d", "duplex": "#4f81bd"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax, labels, series, ylabel, title):
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        bars = ax.bar(xs, [v or 0 for v in values], width, label=name, color=COLORS.get(name))
        for bar, v in zip(bars, values):
            if v:
                ax.annotate(f"{v:,.0f}" if v >= 10 else f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()


def draw(result, out_dir):
    """Writes the PNGs into out_dir; returns their file names."""
    plt = _plt()
    s = result["summary"]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    systems = [x for x in ("ceph", "duplex") if any(r["system"] == x and r["phase"] == "compare" for r in s)]

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        made.append(name)

    def get(workload, system, key, phase="compare", settings=""):
        row = find(s, phase, workload, system, settings)
        return row[key] if row else None

    # Fig. 7: small random I/O, IOPS and server CPU per I/O.
    workloads = ["randwrite-4k", "randread-4k"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    _bars(a, workloads, {x: [get(w, x, "iops") for w in workloads] for x in systems}, "IOPS", "4 KiB random, 2 jobs × QD16")
    _bars(b, workloads, {x: [get(w, x, "server_cpu_us_per_io") for w in workloads] for x in systems},
          "server CPU µs per I/O", "CPU per I/O (lower is better)")
    save(fig, "fig7-small-random.png")

    # Latency at queue depth 1.
    fig, ax = plt.subplots(figsize=(6, 4))
    keys = ["lat_p50", "lat_p99", "lat_p999"]
    _bars(ax, ["p50", "p99", "p99.9"], {x: [get("randwrite-4k-qd1", x, k) for k in keys] for x in systems},
          "µs", "4 KiB random write, QD1: latency")
    ax.set_yscale("log")
    save(fig, "latency-qd1.png")

    # Fig. 8: host-side write amplification.
    fig, ax = plt.subplots(figsize=(6, 4))
    _bars(ax, ["daemons' writes", "whole disk"],
          {x: [get("randwrite-4k", x, "waf_daemons"), get("randwrite-4k", x, "waf_device")] for x in systems},
          "bytes written ÷ (user bytes × 2)", "Fig. 8: write amplification, 4 KiB random write")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    save(fig, "fig8-waf.png")

    # Fig. 9: 128 KiB sequential.
    fig, ax = plt.subplots(figsize=(6, 4))
    seq = ["seqwrite-128k", "seqread-128k"]
    _bars(ax, seq, {x: [get(w, x, "mib_s") for w in seq] for x in systems}, "MiB/s", "Fig. 9: 128 KiB sequential")
    save(fig, "fig9-sequential.png")

    # Table II: ablation.
    abl = [r for r in s if r["phase"] == "ablation"]
    if abl:
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = [r["settings"].replace("threading=", "").replace("write_path=", "").replace(",", "\n") for r in abl]
        _bars(ax, labels, {"duplex": [r["iops"] for r in abl]}, "IOPS", "Table II: write path × threading, 4 KiB randwrite")
        save(fig, "table2-ablation.png")

    # Fig. 11: partitions.
    pa = sweep(s, "partitions")
    if pa:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["x"] for r in pa]
        ax.plot(xs, [r["iops"] for r in pa], marker="o", color=COLORS["duplex"], label="duplex")
        ax.set_xticks(xs)
        ax.set_xlabel("store partitions (= flusher threads) per OSD")
        ax.set_ylabel("IOPS")
        ax.set_ylim(bottom=0)
        ax.set_title("Fig. 11: partition scaling, 4 KiB random write")
        ax.legend()
        save(fig, "fig11-partitions.png")

    # Fig. 12: tail latency against the flush threshold, Ceph as a reference.
    fl = sweep(s, "flush")
    if fl:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = [r["x"] for r in fl]
        for key, style in [("lat_p95_write", "-o"), ("lat_p99_write", "-s"), ("lat_p95_read", "--o"), ("lat_p99_read", "--s")]:
            ax.plot(xs, [r[key] for r in fl], style, label="duplex " + key[4:].replace("_", " "))
        ceph = find(s, "compare", "mix-80-20", "ceph")
        if ceph:
            ax.axhline(ceph["lat_p99_write"], color=COLORS["ceph"], linestyle=":", label="ceph write p99")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_yscale("log")
        ax.set_xlabel("flush threshold (log entries per PG)")
        ax.set_ylabel("µs")
        ax.set_title(f"Fig. 12: 80/20 write/read mix at {result['plan']['mix_rate_iops']:,} IOPS")
        ax.legend(fontsize=7)
        save(fig, "fig12-flush-threshold.png")
    return made
