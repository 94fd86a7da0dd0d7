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
their records' sizes), against a plain replicated pool's.

--perf (figures 4.7/4.8): fio over NBD, 4 KiB random writes and reads,
128 KiB sequential writes and reads, on an image in a plain pool and on
one in a deduplicated pool once its data is deduplicated and evicted.

    cargo build --release -p duplex-cli && bench/dedup_tier.py --ratio [--images 4 --size-mib 128]
    bench/dedup_tier.py --perf [--seconds 15 --size-mib 256]

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


def up(cluster, directory, osd_size):
    say(cluster.duplex("dev", "up", "--dir", directory, "--osds", "3", "--replicas", "2", "--min-size", "1",
                       "--pg-num", "32", "--osd-size", osd_size, "--osd-set", "dedup_cold_s=0", capture=True))


def say(text):
    print(text, file=sys.stderr, end="" if text.endswith("\n") else "\n")


def tier_pair(cluster, name, chunk_kib, compression):
    say(cluster.duplex("pool", "create", f"{name}-chunks", "--compression", compression, "--pg-num", "32",
                       capture=True))
    say(cluster.duplex("pool", "create", name, "--dedup-tier", f"{name}-chunks", "--chunk-size", f"{chunk_kib}K",
                       "--pg-num", "32", capture=True))


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
    made = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "dedup_dataset.py"), "--images",
                           str(args.images), "--size-mib", str(args.size_mib), "--out", data],
                          check=True, capture_output=True, text=True).stdout
    say(made)
    images = sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".raw"))
    logical = sum(os.path.getsize(p) for p in images)
    pairs = [("d16", 16, "lz4"), ("d32", 32, "lz4"), ("d64", 64, "lz4"), ("d32raw", 32, "none")]
    results = {"images": len(images), "image_mib": args.size_mib, "logical_bytes": logical, "ideal": made}
    try:
        up(cluster, directory, args.osd_size)
        for name, kib, compression in pairs:
            tier_pair(cluster, name, kib, compression)
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
        for image, extra in [("plain", []), ("dedup", ["--data-pool", "vms"])]:
            cluster.duplex("image", "create", image, "--size", str(size), *extra)
            uri, server = cluster.serve(image)
            # Half the image one pattern repeated (duplicates), half random.
            snapshots.fill(uri, size)
            if image == "dedup":
                say(f"dedup engine settled after {settle(cluster, ['vms']):.0f} s: {status(cluster, 'vms')}")
            say(f"duplex {image}:")

            def run_fio(name, fio_args, uri=uri):
                extra = ["--readonly"] if "read" in name else []
                command = ["fio", f"--name={name}", "--ioengine=nbd", f"--uri={uri}", *fio_args, *extra]
                return snapshots.fio_json(subprocess.run(command, check=True, capture_output=True, text=True).stdout)

            results[image] = erasure.measure(run_fio, pids, args.seconds, size, ("copies", 2))
            if image == "dedup":
                results[image]["status_after"] = status(cluster, "vms")
            cluster.stop(server)
    finally:
        cluster.down()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--ratio", action="store_true")
    mode.add_argument("--perf", action="store_true")
    parser.add_argument("--dir", default="/tmp/duplex-dedup-bench")
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--osd-size", default="8G")
    args = parser.parse_args()
    print(json.dumps(ratio(args) if args.ratio else perf(args), indent=2))


if __name__ == "__main__":
    main()
