"""Medians over rounds, Duplex/Ceph ratios, the targets, and the markdown
report (docs/BENCHMARKS.md takes it verbatim with --publish)."""

import statistics

# Issue 22's bars, as Duplex ÷ Ceph in the same session.
TARGETS = [
    ("4 KiB random write IOPS", "randwrite-4k", "iops", ">=", 20.0),
    ("4 KiB random write: server CPU µs per write", "randwrite-4k", "server_cpu_us_per_io", "<=", 1 / 20),
    ("4 KiB random write at QD1: mean latency", "randwrite-4k-qd1", "lat_mean", "<=", 1 / 10),
    ("4 KiB random read IOPS", "randread-4k", "iops", ">=", 5.0),
    ("128 KiB sequential write IOPS", "seqwrite-128k", "iops", ">=", 2.0),
]
# Absolute bars on Duplex alone: (label, workload, key, bar).
ABSOLUTE = [("4 KiB random write at QD1: mean latency, µs", "randwrite-4k-qd1", "lat_mean", 120.0)]
WAF_TARGET = 1.05
# Every write workload's WAF is held to WAF_TARGET ("at every queue depth").
WAF_WORKLOADS = ["randwrite-4k", "randwrite-4k-qd1", "seqwrite-128k", "mix-80-20"]


def metric(record, key):
    """A record's figure: IOPS, CPU, WAF, or a latency (lat_<pct>[_read])."""
    if key.startswith("lat_"):
        parts = key.split("_")
        pct = parts[1]
        direction = parts[2] if len(parts) > 2 else next(iter(record["io"]))
        return record["io"].get(direction, {}).get("lat_us", {}).get(pct)
    if key == "mib_s":
        return sum(d.get("mib_s", 0) for d in record["io"].values())
    return record.get(key)


def settings_key(settings):
    return ",".join(f"{k}={v}" for k, v in sorted(settings.items()))


def group(records, phase):
    groups = {}
    for r in records:
        if r["phase"] == phase:
            groups.setdefault((r["workload"], r["system"], settings_key(r["settings"])), []).append(r)
    return groups


def median(records, key):
    values = [v for v in (metric(r, key) for r in records) if v is not None]
    return statistics.median(values) if values else None


def summarize(records):
    """Medians per (phase, workload, system, settings)."""
    keys = ["iops", "mib_s", "lat_mean", "lat_p50", "lat_p95", "lat_p99", "lat_p999", "lat_p95_read",
            "lat_p99_read", "lat_p95_write", "lat_p99_write", "server_cpu_us_per_io", "client_cpu_us_per_io",
            "machine_cpu_us_per_io", "waf_daemons", "waf_device"]
    out = []
    for phase in sorted({r["phase"] for r in records}):
        for (workload, system, skey), rs in sorted(group(records, phase).items()):
            row = {"phase": phase, "workload": workload, "system": system, "settings": skey, "runs": len(rs)}
            for k in keys:
                row[k] = median(rs, k)
            iops = [r["iops"] for r in rs]
            row["iops_min"], row["iops_max"] = min(iops), max(iops)
            out.append(row)
    return out


def sweep(summary, phase):
    """A one-setting sweep's rows, with the setting's value as `x`, in order."""
    rows = [dict(r, x=int(r["settings"].split("=", 1)[1])) for r in summary if r["phase"] == phase]
    return sorted(rows, key=lambda r: r["x"])


def find(summary, phase, workload, system, settings=""):
    for row in summary:
        if (row["phase"], row["workload"], row["system"], row["settings"]) == (phase, workload, system, settings):
            return row
    return None


def targets(summary):
    rows = []
    for label, workload, key, op, bar in TARGETS:
        d, c = find(summary, "compare", workload, "duplex"), find(summary, "compare", workload, "ceph")
        if not (d and c and d[key] and c[key]):
            continue
        ratio = d[key] / c[key]
        met = ratio >= bar if op == ">=" else ratio <= bar
        rows.append({"target": label, "duplex": d[key], "ceph": c[key], "ratio": ratio, "bar": f"{op} {bar:g}",
                     "met": met})
    for label, workload, key, bar in ABSOLUTE:
        d, c = find(summary, "compare", workload, "duplex"), find(summary, "compare", workload, "ceph")
        if d and d[key] is not None:
            rows.append({"target": label, "duplex": d[key], "ceph": c[key] if c else None, "ratio": None,
                         "bar": f"<= {bar:g}", "met": d[key] <= bar})
    for workload in WAF_WORKLOADS:
        d, c = find(summary, "compare", workload, "duplex"), find(summary, "compare", workload, "ceph")
        if d and d["waf_daemons"] is not None:
            rows.append({"target": f"WAF during {workload}", "duplex": d["waf_daemons"],
                         "ceph": c["waf_daemons"] if c else None, "ratio": None, "bar": f"<= {WAF_TARGET}",
                         "met": d["waf_daemons"] <= WAF_TARGET})
    return rows


def against_ideal(summary):
    """Each write workload's figures beside the same round's ideal path."""
    rows = []
    for r in summary:
        if r["phase"] != "ideal":
            continue
        d = find(summary, "compare", r["workload"], "duplex")
        if d:
            rows.append({"workload": r["workload"], "duplex": d, "ideal": r})
    return rows


# ---------------------------------------------------------------- markdown
def n(value, digits=0):
    if value is None:
        return "–"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def ratio(d, c, digits=2):
    if d is None or c in (None, 0):
        return "–"
    return f"{d / c:.{digits}f}×"


def table(add, title, header, rows):
    """A titled markdown table; nothing when there are no rows."""
    if not rows:
        return
    add(f"### {title}")
    add("")
    add("| " + " | ".join(header) + " |")
    add("|" + " --- |" * len(header))
    for row in rows:
        add("| " + " | ".join(row) + " |")
    add("")


# The comparison table's figures: (column, summary key, digits, digits of the ratio).
COMPARED_COLUMNS = [
    ("MiB/s", "mib_s", 1, 2),
    ("p50 µs", "lat_p50", 0, 3),
    ("p99 µs", "lat_p99", 0, 3),
    ("p99.9 µs", "lat_p999", 0, 3),
    ("server CPU µs/IO", "server_cpu_us_per_io", 1, 3),
    ("client CPU µs/IO", "client_cpu_us_per_io", 1, 3),
    ("machine CPU µs/IO", "machine_cpu_us_per_io", 1, 3),
    ("WAF (daemons)", "waf_daemons", 2, None),
    ("WAF (disk)", "waf_device", 2, None),
]


def iops_cell(r):
    return f"{n(r['iops'])} ({n(r['iops_min'])}–{n(r['iops_max'])})"


def markdown(result):
    s = result["summary"]
    env = result["env"]
    lines = []
    add = lines.append
    add(f"Run of {env['date']} on {env['machine']}.")
    add("")
    add("```sh")
    add(env["command"])
    add("```")
    add("")
    add(f"Versions: {env['duplex_version']} (commit {env['commit']}); {env.get('ceph_version', 'no Ceph')}; "
        f"{env['fio_version']}. Suite: {env['plan']}. Wall time {env['wall_minutes']:.1f} min.")
    add("")
    add("Every figure is the median of the rounds (IOPS range in brackets). Latency is fio's completion")
    add("latency. CPU is server CPU (the OSD processes) per I/O, from /proc; client CPU is fio with librbd")
    add("(Ceph) or fio plus the `duplex nbd serve` gateway (Duplex). WAF is the bytes the OSD processes")
    add("sent to storage (/proc/PID/io) over the bytes the client wrote × 2 replicas; Duplex's `shm`")
    add("operation log is the NVM stand-in and is not storage. Ratios are Duplex ÷ Ceph.")
    add("")
    rows = []
    for t in targets(s):
        digits = 2 if t["duplex"] < 100 else 0
        shown = "–" if t["ratio"] is None else f"{t['ratio']:.3f}"
        rows.append([t["target"], n(t["duplex"], digits), n(t["ceph"], digits), shown, t["bar"],
                     "yes" if t["met"] else "**no**"])
    table(add, "Targets (issue 22)", ["target", "Duplex", "Ceph", "Duplex ÷ Ceph", "bar", "met"], rows)

    rows = []
    for x in against_ideal(s):
        d, i = x["duplex"], x["ideal"]
        rows.append([x["workload"], n(d["iops"]), n(i["iops"]), ratio(d["iops"], i["iops"]),
                     n(d["lat_mean"]), n(i["lat_mean"]), n(d["server_cpu_us_per_io"], 1),
                     n(i["server_cpu_us_per_io"], 1), n(d["client_cpu_us_per_io"], 1),
                     n(i["client_cpu_us_per_io"], 1)])
    table(add, "Against the limit: `write_path=ideal` (acknowledged once every replica received it, nothing stored)",
          ["workload", "Duplex IOPS", "ideal IOPS", "Duplex ÷ ideal", "Duplex mean µs", "ideal mean µs",
           "Duplex server CPU µs/IO", "ideal server CPU µs/IO", "Duplex client CPU µs/IO",
           "ideal client CPU µs/IO"], rows)

    rows = []
    for w in result["workloads"]:
        found = {x: find(s, "compare", w, x) for x in ("ceph", "duplex")}
        for x, r in found.items():
            if r:
                rows.append([w, x, iops_cell(r)] + [n(r[key], digits) for _, key, digits, _ in COMPARED_COLUMNS])
        d, c = found["duplex"], found["ceph"]
        if d and c:
            rows.append([w, "**ratio**", ratio(d["iops"], c["iops"])]
                        + ["" if rd is None else ratio(d[key], c[key], rd) for _, key, _, rd in COMPARED_COLUMNS])
    table(add, "Duplex and Ceph, interleaved", ["workload", "system", "IOPS"] + [c[0] for c in COMPARED_COLUMNS], rows)
    if find(s, "compare", "mix-80-20", "duplex"):
        add(f"The mix runs at a fixed {result['plan']['mix_rate_iops']:,} IOPS in all, 80% writes.")
        add("")

    rows = [["rbd bench" if r["system"] == "ceph" else "duplex bench", r["workload"], iops_cell(r),
             n(r["server_cpu_us_per_io"], 1), n(r["client_cpu_us_per_io"], 1)]
            for r in s if r["phase"] == "native"]
    table(add, "Native tools: `rbd bench` and `duplex bench` (4 KiB, 32 in flight)",
          ["tool", "pattern", "IOPS", "server CPU µs/IO", "client CPU µs/IO"], rows)

    threads = result.get("threads")
    if threads:
        add("### Where the server CPU goes (4 KiB random write, µs per I/O by thread class, median round)")
        add("")
        for x, classes in threads.items():
            top = sorted(classes.items(), key=lambda kv: -kv[1])[:8]
            add(f"- {x}: " + ", ".join(f"`{k}` {v:.1f}" for k, v in top))
        add("")

    rows = [[r["settings"], n(r["iops"]), n(r["lat_p50"]), n(r["lat_p99"]), n(r["server_cpu_us_per_io"], 1)]
            for r in s if r["phase"] == "ablation"]
    table(add, "Ablation (paper Table II): 4 KiB random write, Duplex only",
          ["write path, threading", "IOPS", "p50 µs", "p99 µs", "server CPU µs/IO"], rows)

    rows = [[str(r["x"]), n(r["iops"]), n(r["lat_p95_write"]), n(r["lat_p99_write"]), n(r["lat_p95_read"]),
             n(r["lat_p99_read"]), n(r["server_cpu_us_per_io"], 1)] for r in sweep(s, "flush")]
    table(add, f"Flush threshold (paper Fig. 12): 80/20 write/read mix at {result['plan']['mix_rate_iops']:,} IOPS, Duplex",
          ["flush threshold", "IOPS", "write p95 µs", "write p99 µs", "read p95 µs", "read p99 µs",
           "server CPU µs/IO"], rows)

    rows = [[str(r["x"]), n(r["iops"]), n(r["lat_p99"]), n(r["server_cpu_us_per_io"], 1)]
            for r in sweep(s, "partitions")]
    table(add, "Store partitions and flusher threads (paper Fig. 11): 4 KiB random write, Duplex",
          ["partitions (= flusher threads)", "IOPS", "p99 µs", "server CPU µs/IO"], rows)
    if result.get("plots"):
        add("Plots: " + ", ".join(f"[{p}](bench/{p})" for p in result["plots"]) + ".")
        add("")
    return "\n".join(lines)
