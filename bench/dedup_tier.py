#!/usr/bin/env python3
"""The deduplication tier's figures (issue 27, the dissertation's chapter
4), recorded in docs/BENCHMARKS.md. A local cluster of 3 OSDs (size 2
pools), its engine set to pass objects at once (`--dedup-cold-s 0`).

--ratio (table 4.1's actual row, figure 4.10): the VM-like images of
bench/dedup_dataset.py (made from this machine's /usr) copied over NBD
into images whose data pool is deduplicated, one pool pair per chunk size
(16, 32, 64 KiB, lz4) and one more at 32 KiB without compression; once
the engine has settled, `duplex dedup status` per pool: the bytes held
(base objects' blocks plus chunk objects, one copy; chunk maps and
references are omap metadata inside the onodes and are counted from
their records' sizes), against a plain replicated pool's. With
--chunking content the tiers cut chunks by content (the chunk size their
average), and the data set's report has the content-defined ideal too.

--perf (figures 4.7/4.8): fio over NBD, 4 KiB random writes and reads,
128 KiB sequential writes and reads, on an image in a plain pool and on
one in a deduplicated pool once its data is deduplicated and evicted.

--rate (figure 4.11): a foreground sequential writer (128 KiB, QD 4) on a
deduplicated pool whose engine has a backlog (an image written while the
pool's engine was paused), its MiB/s each second, with the engine paused
(no dedup), rate-controlled (`dedup_mode=auto`, the default watermarks),
and unlimited (`dedup_mode=run`), in that order on one cluster: the
backlog is the same for the first two, and what auto left for the third.

--rereplicate (table 4.2): the data set's images written into a plain
pool, or into a deduplicated one (and deduplicated), on 4 OSDs; then one
OSD is marked out, and the time until every PG is active+clean again.

    cargo build --release -p duplex-cli && bench/dedup_tier.py --ratio [--images 4 --size-mib 128] [--chunking content]
    bench/dedup_tier.py --perf [--seconds 15 --size-mib 256]
    bench/dedup_tier.py --rate [--seconds 30 --size-mib 512 --watermarks 50,200]
    bench/dedup_tier.py --rereplicate [--images 4 --size-mib 128]

Prints the figures as JSON. Stops and wipes its cluster at the end, also
on failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import erasure  # noqa: E402  (the fio runs and their figures)
import snapshots  # noqa: E402  (the cluster helpers)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
# An image's data object name: a 16-hex-digit id, a dot, 16 hex digits.
REFERENCE_NAME = 33


def up(cluster, directory, osd_size, osds=3):
    say(cluster.duplex("dev", "up", "--dir", directory, "--osds", str(osds), "--replicas", "2", "--min-size", "1",
                       "--pg-num", "32", "--osd-size", osd_size, "--osd-set", "dedup_cold_s=0", capture=True))


def say(text):
    print(text, file=sys.stderr, end="" if text.endswith("\n") else "\n")


def tier_pair(cluster, name, chunk_kib, compression, chunking="fixed"):
    say(cluster.duplex("pool", "create", f"{name}-chunks", "--compression", compression, "--pg-num", "32",
                       capture=True))
    say(cluster.duplex("pool", "create", name, "--dedup-tier", f"{name}-chunks", "--chunk-size", f"{chunk_kib}K",
                       "--chunking", chunking, "--pg-num", "32", capture=True))


def status(cluster, pool):
    return json.loads(cluster.duplex("dedup", "status", pool, "--json", capture=True))[0]


def settle(cluster, pools, timeout_s=1800):
    """Waits until no pool's chunk count or held bytes moved for 5 s."""
    started, last, still = time.time(), None, 0
    while still < 5:
        if time.time() - started > timeout_s:
            sys.exit(f"the tier did not settle within {timeout_s} s: {last}")
        time.sleep(1)
        now = [(s["chunks"], s["base_bytes"]) for s in (status(cluster, p) for p in pools)]
        still = still + 1 if now == last else 0
        last = now
    return time.time() - started


def metadata_bytes(cluster, pool):
    """The chunk maps' and the references' omap bytes (keys and values),
    from their records' sizes: an entry is a 9-byte key and a 46-byte
    value; a reference a 20-byte header and its object's name (an image's
    data object: its id, a dot, 16 hex digits; REFERENCE_NAME bytes)."""
    report = json.loads(cluster.duplex("dedup", "scrub", pool, "--json", capture=True))
    return report["entries"] * (9 + 46) + report["references"] * (20 + REFERENCE_NAME), report


def ratio(args):
    directory = args.dir
    cluster = snapshots.Cluster(directory)
    data = tempfile.mkdtemp(prefix="dedup-dataset-")
    cdc = ["--cdc"] if args.chunking == "content" else []
    made = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "dedup_dataset.py"), "--images",
                           str(args.images), "--size-mib", str(args.size_mib), "--out", data, *cdc],
                          check=True, capture_output=True, text=True).stdout
    say(made)
    images = sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".raw"))
    logical = sum(os.path.getsize(p) for p in images)
    pairs = [("d16", 16, "lz4"), ("d32", 32, "lz4"), ("d64", 64, "lz4"), ("d32raw", 32, "none")]
    results = {"images": len(images), "image_mib": args.size_mib, "logical_bytes": logical, "ideal": made,
               "chunking": args.chunking}
    try:
        up(cluster, directory, args.osd_size)
        for name, kib, compression in pairs:
            tier_pair(cluster, name, kib, compression, args.chunking)
        copied = time.time()
        for name, _, _ in pairs + [("rbd", None, None)]:
            for i, path in enumerate(images):
                image = f"{name}-vm{i}"
                extra = [] if name == "rbd" else ["--data-pool", name]
                cluster.duplex("image", "create", image, "--size", f"{args.size_mib}M", *extra)
                uri, server = cluster.serve(image)
                subprocess.run(["nbdcopy", path, uri], check=True)
                cluster.stop(server)
        results["copy_seconds"] = round(time.time() - copied, 1)
        results["settle_seconds"] = round(settle(cluster, [p for p, _, _ in pairs]), 1)
        df = json.loads(cluster.duplex("df", "--json", capture=True))
        plain = next(p for p in df["pools"] if p["name"] == "rbd")
        results["plain"] = {"stored_bytes": plain["stored_bytes"], "used_bytes": plain["used_bytes"]}
        for name, kib, compression in pairs:
            s = status(cluster, name)
            meta, scrub = metadata_bytes(cluster, name)
            held = s["base_bytes"] + s["chunk_stored_bytes"]
            raw = s["base_bytes"] + s["chunk_raw_bytes"]
            results[name] = {
                "chunk_kib": kib,
                "compression": compression,
                "status": s,
                "metadata_bytes": meta,
                "dedup_ratio_with_metadata": round(s["logical_bytes"] / max(raw + meta, 1), 3),
                "saved_without_compression_pct": round(100 * (1 - (raw + meta) / max(s["logical_bytes"], 1)), 1),
                "saved_with_compression_pct": round(100 * (1 - (held + meta) / max(s["logical_bytes"], 1)), 1),
                "scrub": {k: scrub[k] for k in ("chunks", "references", "entries", "leaks_removed")},
            }
            say(f"{name}: {results[name]}")
        # Every image reads back as it was written.
        for name, _, _ in pairs:
            for i, path in enumerate(images):
                uri, server = cluster.serve(f"{name}-vm{i}")
                out = subprocess.run(["nbdcopy", uri, "-"], check=True, capture_output=True).stdout
                cluster.stop(server)
                if out != open(path, "rb").read():
                    sys.exit(f"{name}-vm{i} reads back other bytes")
        results["read_back"] = "byte-equal"
    finally:
        cluster.down()
    return results


def perf(args):
    directory = args.dir
    cluster = snapshots.Cluster(directory)
    size = args.size_mib * MIB
    results = {}
    try:
        up(cluster, directory, args.osd_size)
        tier_pair(cluster, "vms", 32, "lz4")
        state = json.load(open(os.path.join(directory, "state.json")))
        pids = [p["pid"] for p in state["processes"] if p["name"].startswith("osd.")]
        # "dedup": every chunk evicted and the engine passing objects as
        # soon as they are written (--dedup-cold-s 0): each write to an
        # evicted chunk waits for its promotion, and a pass evicts it again
        # 2 s later: the worst case. "dedup_hot_kept": the same data, but
        # the engine paused once it is evicted, so that a chunk written
        # stays cached (what the hotness rule does for a hot object).
        for image, extra in [("plain", []), ("dedup", ["--data-pool", "vms"]),
                             ("dedup_hot_kept", ["--data-pool", "vms"])]:
            cluster.duplex("image", "create", image, "--size", str(size), *extra)
            uri, server = cluster.serve(image)
            # Half the image one pattern repeated (duplicates), half random.
            snapshots.fill(uri, size)
            if image != "plain":
                say(cluster.duplex("pool", "set", "vms", "dedup_mode=auto", capture=True))
                say(f"dedup engine settled after {settle(cluster, ['vms']):.0f} s: {status(cluster, 'vms')}")
            if image == "dedup_hot_kept":
                say(cluster.duplex("pool", "set", "vms", "dedup_mode=pause", capture=True))
            say(f"duplex {image}:")

            def run_fio(name, fio_args, uri=uri):
                extra = ["--readonly"] if "read" in name else []
                command = ["fio", f"--name={name}", "--ioengine=nbd", f"--uri={uri}", *fio_args, *extra]
                return snapshots.fio_json(subprocess.run(command, check=True, capture_output=True, text=True).stdout)

            results[image] = erasure.measure(run_fio, pids, args.seconds, size, ("copies", 2))
            if image != "plain":
                results[image]["status_after"] = status(cluster, "vms")
            cluster.stop(server)
    finally:
        cluster.down()
    return results


def dataset(args):
    """The data set's images (bench/dedup_dataset.py): their paths, and the script's report."""
    data = tempfile.mkdtemp(prefix="dedup-dataset-")
    made = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "dedup_dataset.py"), "--images",
                           str(args.images), "--size-mib", str(args.size_mib), "--out", data],
                          check=True, capture_output=True, text=True).stdout
    return sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".raw")), made


def bandwidth_series(prefix):
    """fio's per-second write bandwidth log (`--write_bw_log`), in MiB/s."""
    series = []
    for line in open(f"{prefix}_bw.1.log"):
        fields = [f.strip() for f in line.split(",")]
        series.append(round(int(fields[1]) / 1024, 1))
    return series


def rate(args):
    directory = args.dir
    cluster = snapshots.Cluster(directory)
    size = args.size_mib * MIB
    results = {"seconds": args.seconds, "backlog_mib": args.size_mib}
    logs = tempfile.mkdtemp(prefix="dedup-rate-")
    try:
        up(cluster, directory, args.osd_size)
        tier_pair(cluster, "vms", 32, "lz4")
        say(cluster.duplex("pool", "set", "vms", "dedup_mode=pause", capture=True))
        if args.watermarks:
            low, high = args.watermarks.split(",")
            say(cluster.duplex("pool", "set", "vms", f"dedup_low_watermark={low}", capture=True))
            say(cluster.duplex("pool", "set", "vms", f"dedup_high_watermark={high}", capture=True))
            results["watermarks"] = [int(low), int(high)]
        # The backlog: an image written with the engine paused (half one
        # pattern repeated, half random), dirty and waiting.
        cluster.duplex("image", "create", "backlog", "--size", str(size), "--data-pool", "vms")
        uri, server = cluster.serve("backlog")
        snapshots.fill(uri, size)
        cluster.stop(server)
        cluster.duplex("image", "create", "writer", "--size", str(size), "--data-pool", "vms")
        uri, server = cluster.serve("writer")
        for mode in ("pause", "auto", "run"):
            say(cluster.duplex("pool", "set", "vms", f"dedup_mode={mode}", capture=True))
            before = status(cluster, "vms")
            prefix = os.path.join(logs, mode)
            subprocess.run(["fio", "--name=writer", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=128k",
                            "--iodepth=4", f"--size={size}", "--time_based", f"--runtime={args.seconds}",
                            f"--write_bw_log={prefix}", "--log_avg_msec=1000"],
                           check=True, capture_output=True, text=True)
            after = status(cluster, "vms")
            series = bandwidth_series(prefix)
            results[mode] = {
                "mib_per_s": series,
                "mean_mib_per_s": round(sum(series) / max(len(series), 1), 1),
                "chunks_before": before["chunks"],
                "chunks_after": after["chunks"],
                "held_mib_before": round(before["base_bytes"] / MIB, 1),
                "held_mib_after": round(after["base_bytes"] / MIB, 1),
            }
            say(f"{mode}: {results[mode]}")
        cluster.stop(server)
    finally:
        cluster.down()
    return results


def rereplicate(args):
    images, made = dataset(args)
    results = {"images": len(images), "image_mib": args.size_mib, "ideal": made}
    for case in ("plain", "dedup"):
        directory = os.path.join(args.dir, case)
        cluster = snapshots.Cluster(directory)
        try:
            up(cluster, directory, args.osd_size, osds=4)
            extra = []
            if case == "dedup":
                tier_pair(cluster, "vms", 32, "lz4")
                extra = ["--data-pool", "vms"]
            for i, path in enumerate(images):
                # (The data set's last image can be a few blocks past its size.)
                mib = -(-os.path.getsize(path) // MIB)
                cluster.duplex("image", "create", f"vm{i}", "--size", f"{mib}M", *extra)
                uri, server = cluster.serve(f"vm{i}")
                subprocess.run(["nbdcopy", path, uri], check=True)
                cluster.stop(server)
            if case == "dedup":
                results["dedup_settle_seconds"] = round(settle(cluster, ["vms"]), 1)
            time.sleep(3)
            df = json.loads(cluster.duplex("df", "--json", capture=True))
            stored = sum(p["stored_bytes"] for p in df["pools"])
            say(cluster.duplex("mark", "out", "3", capture=True))
            out_at = time.monotonic()
            while True:
                state = json.loads(cluster.duplex("status", "--json", capture=True))
                moving = {s: n for s, n in state["pgs"].items() if s != "active+clean"}
                if not moving and time.monotonic() - out_at > 2:
                    break
                if time.monotonic() - out_at > 1800:
                    raise RuntimeError(f"the PGs did not settle: {moving}")
                time.sleep(0.5)
            results[case] = {"stored_mib": round(stored / MIB, 1),
                             "active_clean_again_s": round(time.monotonic() - out_at, 1)}
            say(f"{case}: {results[case]}")
        finally:
            cluster.down()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--ratio", action="store_true")
    mode.add_argument("--perf", action="store_true")
    mode.add_argument("--rate", action="store_true")
    mode.add_argument("--rereplicate", action="store_true")
    parser.add_argument("--dir", default="/tmp/duplex-dedup-bench")
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--osd-size", default="8G")
    parser.add_argument("--watermarks", help="--rate: the pool's LOW,HIGH foreground operations a second")
    parser.add_argument("--chunking", default="fixed", choices=["fixed", "content"], help="--ratio: the tiers' chunking")
    args = parser.parse_args()
    run = ratio if args.ratio else perf if args.perf else rate if args.rate else rereplicate
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
