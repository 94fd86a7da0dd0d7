#!/usr/bin/env python3
"""Erasure-coded pool figures (issue 26), recorded in docs/BENCHMARKS.md.

Three OSDs on this machine, on each side:

- Duplex: `duplex dev up --osds 3` (one host each), a replicated pool of
  size 2 and an erasure-coded pool 2+1 (4 KiB stripe unit), an image in
  each (`--data-pool` for the second: its header stays replicated),
  served by `duplex nbd serve`, driven by fio's nbd engine;
- Ceph (--ceph): the suite's BlueStore cluster (bench/duplexbench/ceph.py)
  with 3 OSDs, a replicated pool of size 2 and an erasure-coded pool 2+1
  (`crush-failure-domain=osd`, `allow_ec_overwrites true`, 4 KiB stripe
  unit), an image in each (`rbd create --data-pool`), fio's rbd engine.

Per image: filled whole (1 MiB writes), then 4 KiB random writes and
reads (2 jobs x queue depth 16) and 128 KiB sequential writes and reads
(1 job x queue depth 8), --seconds each; the OSD processes' CPU seconds
(utime + stime from /proc) over each run, per operation; and the raw
bytes the OSDs hold per byte of image written (`duplex df`; Ceph: `ceph
df`'s raw used).

    cargo build --release -p duplex-cli && bench/erasure.py [--seconds 15] [--ceph]

With --rebuild instead: four OSDs, an image of --size-gib in a replicated
pool (size 2) and one in an erasure-coded pool (2+1, min_size 2), both
filled; then osd.3 is killed and marked out, and the script times how long
each pool takes to hold all its data whole again on the three others: the
replicated PGs until the map pins none (their backfill ends; they serve
throughout), the erasure-coded ones until a full read of the image, begun
at once, ends (a PG rebuilds its moved shards inside peering, and its I/O
waits meanwhile), less that read's own time beforehand.

    bench/erasure.py --rebuild [--size-gib 0.5]

Prints the figures as JSON. Stops and wipes its clusters at the end, also
on failure.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snapshots  # noqa: E402  (the same cluster helpers and fio runs)
from duplexbench import procs  # noqa: E402

GIB = 1 << 30

RUNS = [
    # name, fio rw, block size, jobs, queue depth
    ("randwrite_4k", "randwrite", "4k", 2, 16),
    ("randread_4k", "randread", "4k", 2, 16),
    ("seqwrite_128k", "write", "128k", 1, 8),
    ("seqread_128k", "read", "128k", 1, 8),
]


def cpu(pids):
    return sum(procs.cpu_seconds(pid) for pid in pids)


def fio_args(rw, bs, jobs, depth, seconds, size):
    return ["--output-format=json", f"--rw={rw}", f"--bs={bs}", f"--iodepth={depth}", f"--numjobs={jobs}",
            "--group_reporting=1", "--direct=1", "--time_based=1", f"--runtime={seconds}",
            f"--size={size // jobs}", f"--offset_increment={size // jobs}"]


def written(pids):
    return sum(procs.write_bytes(pid) for pid in pids)


def shard_bytes(layout, bs, user):
    """The bytes of shards (or copies) that `user` bytes of `bs`-sized
    writes change: what a store with no amplification writes. A replica
    is a whole copy; an erasure-coded write of at most one stripe unit
    changes that unit and the m parity units, a whole-stripe write every
    shard's unit of it."""
    if layout[0] == "copies":
        return user * layout[1]
    k, m, unit = layout[1:]
    return user * (1 + m) if bs <= unit else user * (k + m) / k


def measure(run_fio, pids, seconds, size, layout=None):
    """Each run: operations per second, MiB/s, OSD CPU µs per operation,
    and for writes the OSDs' bytes sent to storage per byte written and per
    byte of shards changed (`waf_per_shard`; `layout`: ("copies", n) or
    ("ec", k, m, stripe unit)). The operation log's writes go to tmpfs and
    are not counted (procs.write_bytes)."""
    figures = {}
    for name, rw, bs, jobs, depth in RUNS:
        before, written_before = cpu(pids), written(pids)
        out = run_fio(name, fio_args(rw, bs, jobs, depth, seconds, size))
        used, stored = cpu(pids) - before, written(pids) - written_before
        job = out["jobs"][0]
        side = job["write"] if "write" in rw else job["read"]
        ops = side["total_ios"] if "total_ios" in side else side["iops"] * job["job_runtime"] / 1000.0
        figures[name] = {
            "iops": round(side["iops"]),
            "mib_s": round(side["bw_bytes"] / (1 << 20), 1),
            "osd_cpu_us_per_op": round(used / max(ops, 1) * 1e6, 1),
            "p99_us": round(side["clat_ns"]["percentile"].get("99.000000", 0) / 1000),
        }
        user = side.get("io_bytes", 0)
        if "write" in rw and user and layout:
            block = int(bs.rstrip("k")) << 10
            figures[name]["stored_bytes_per_byte"] = round(stored / user, 3)
            figures[name]["waf_per_shard"] = round(stored / shard_bytes(layout, block, user), 3)
        print(f"  {name}: {figures[name]}", file=sys.stderr)
    return figures


def duplex_side(directory, seconds, size):
    cluster = snapshots.Cluster(directory)
    results = {}
    try:
        # Their reports go to stderr: stdout is the figures' JSON.
        say = lambda *args: print(cluster.duplex(*args, capture=True), file=sys.stderr, end="")  # noqa: E731
        say("dev", "up", "--dir", directory, "--osds", "3", "--replicas", "2", "--min-size", "1",
            "--pg-num", "32", "--osd-size", "6G")
        say("pool", "create", "cold", "--ec", "2+1", "--pg-num", "32")
        state = json.load(open(os.path.join(directory, "state.json")))
        pids = [p["pid"] for p in state["processes"] if p["name"].startswith("osd.")]
        for image, options in [("rep2", []), ("ec21", ["--data-pool", "cold"])]:
            raw_before = json.loads(cluster.duplex("df", "--json", capture=True))["raw"]["used_bytes"]
            say("image", "create", image, "--size", str(size), *options)
            uri, server = cluster.serve(image)
            snapshots.fill(uri, size)
            # The stores hold it once flushed.
            time.sleep(3)
            raw_after = json.loads(cluster.duplex("df", "--json", capture=True))["raw"]["used_bytes"]
            print(f"duplex {image}:", file=sys.stderr)

            def run_fio(name, args, uri=uri):
                extra = ["--readonly"] if "read" in name else []
                command = ["fio", f"--name={name}", "--ioengine=nbd", f"--uri={uri}", *args, *extra]
                return snapshots.fio_json(subprocess.run(command, check=True, capture_output=True, text=True).stdout)

            layout = ("copies", 2) if image == "rep2" else ("ec", 2, 1, 4096)
            results[image] = measure(run_fio, pids, seconds, size, layout)
            results[image]["raw_bytes_per_byte_written"] = round((raw_after - raw_before) / size, 3)
            cluster.stop(server)
    finally:
        cluster.down()
    return results


def ceph_side(work_dir, seconds, size):
    from duplexbench.ceph import CephCluster

    ceph = CephCluster(work_dir, osds=3, osd_size_gib=4, image_size_gib=size / GIB, pg_num=32)
    results = {}
    try:
        ceph.up()
        ceph.ceph("osd", "erasure-code-profile", "set", "ec21", "k=2", "m=1", "crush-failure-domain=osd",
                  "stripe_unit=4K")
        ceph.ceph("osd", "pool", "create", "ecpool", "32", "32", "erasure", "ec21")
        ceph.ceph("osd", "pool", "set", "ecpool", "allow_ec_overwrites", "true")
        ceph.run("rbd", "pool", "init", "ecpool")
        ceph.run("rbd", "create", "--size", f"{size >> 20}M", "--data-pool", "ecpool", "--image-feature", "layering",
                 "rbd/ec21")
        snapshots_wait = time.monotonic() + 180
        while not ceph._pgs_clean():
            if time.monotonic() > snapshots_wait:
                raise RuntimeError("Ceph's EC PGs did not go active+clean")
            time.sleep(1)
        pids = ceph.server_pids()
        env = {"CEPH_CONF": str(ceph.conf)}
        for image in ["bench", "ec21"]:
            raw_before = json.loads(ceph.ceph("df", "-f", "json"))["stats"]["total_used_raw_bytes"]
            fill = ["fio", "--name=fill", "--ioengine=rbd", "--clientname=admin", "--pool=rbd", f"--rbdname={image}",
                    "--rw=write", "--bs=1m", "--iodepth=8", f"--size={size}", "--direct=1"]
            subprocess.run(fill, check=True, capture_output=True, env={**os.environ, **env})
            time.sleep(3)
            raw_after = json.loads(ceph.ceph("df", "-f", "json"))["stats"]["total_used_raw_bytes"]
            name = "rep2" if image == "bench" else "ec21"
            print(f"ceph {name}:", file=sys.stderr)

            def run_fio(job, args, image=image):
                command = ["fio", f"--name={job}", "--ioengine=rbd", "--clientname=admin", "--pool=rbd",
                           f"--rbdname={image}", *args]
                out = subprocess.run(command, check=True, capture_output=True, text=True, env={**os.environ, **env})
                return snapshots.fio_json(out.stdout)

            layout = ("copies", 2) if name == "rep2" else ("ec", 2, 1, 4096)
            results[name] = measure(run_fio, pids, seconds, size, layout)
            results[name]["raw_bytes_per_byte_written"] = round((raw_after - raw_before) / size, 3)
        results["version"] = ceph.version()
    finally:
        ceph.down()
    return results


def rebuild_side(directory, size):
    """Time to hold every byte whole again after an OSD is lost and marked out."""
    cluster = snapshots.Cluster(directory)
    try:
        say = lambda *args: print(cluster.duplex(*args, capture=True), file=sys.stderr, end="")  # noqa: E731
        say("dev", "up", "--dir", directory, "--osds", "4", "--replicas", "2", "--min-size", "1",
            "--pg-num", "32", "--osd-size", "4G")
        say("pool", "create", "cold", "--ec", "2+1", "--min-size", "2", "--pg-num", "32")
        uris = {}
        for image, options in [("rep2", []), ("ec21", ["--data-pool", "cold"])]:
            say("image", "create", image, "--size", str(size), *options)
            uri, _server = cluster.serve(image)
            snapshots.fill(uri, size)
            uris[image] = uri
        time.sleep(3)

        def read_all(uri):
            started = time.monotonic()
            subprocess.run(["fio", "--name=probe", "--ioengine=nbd", f"--uri={uri}", "--rw=read", "--bs=1m",
                            "--iodepth=8", f"--size={size}", "--direct=1", "--readonly"],
                           check=True, capture_output=True)
            return time.monotonic() - started

        plain_read = read_all(uris["ec21"])
        state = json.load(open(os.path.join(directory, "state.json")))
        victim = next(p for p in state["processes"] if p["name"] == "osd.3")
        os.kill(victim["pid"], 9)
        lost_at = time.monotonic()
        say("mark", "out", "3")
        ec_read = read_all(uris["ec21"])
        ec_done = time.monotonic() - lost_at
        while True:
            status = json.loads(cluster.duplex("status", "--json", capture=True))
            moving = {state: n for state, n in status["pgs"].items() if state != "active+clean"}
            if not moving:
                break
            if time.monotonic() - lost_at > 1800:
                raise RuntimeError(f"the PGs did not settle: {moving}")
            time.sleep(0.5)
        rep_done = time.monotonic() - lost_at
        # What the EC primaries' logs say of their rebuilds since the loss.
        rebuilt_pgs, rebuilt_objects, longest_ms = 0, 0, 0
        for name in os.listdir(directory):
            if not (name.startswith("osd.") and name.endswith(".log")):
                continue
            for line in open(os.path.join(directory, name), errors="replace"):
                if "PG recovered and active" not in line or "pg=" not in line:
                    continue
                fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
                if int(fields.get("pg", "0")) >> 20 != 2:  # the EC pool's PGs
                    continue
                rebuilt_pgs += 1
                rebuilt_objects += int(fields.get("objects", "0"))
                longest_ms = max(longest_ms, int(fields.get("took_ms", "0")))
        figures = {
            "ec21_pg_rebuilds": rebuilt_pgs,
            "ec21_objects_rebuilt": rebuilt_objects,
            "ec21_longest_pg_rebuild_ms": longest_ms,
            "image_bytes": size,
            "rep2_whole_again_s": round(rep_done, 1),
            "ec21_whole_again_s": round(max(ec_done - plain_read, 0.0), 1),
            "ec21_read_after_loss_s": round(ec_read, 1),
            "ec21_plain_read_s": round(plain_read, 1),
        }
        print(f"  rebuild: {figures}", file=sys.stderr)
        return figures
    finally:
        cluster.down()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp/duplex-ecbench")
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--ceph", action="store_true", help="Ceph's figures too (installs Ceph)")
    parser.add_argument("--ceph-only", action="store_true")
    parser.add_argument("--rebuild", action="store_true", help="time rebuilding a lost OSD's data instead")
    args = parser.parse_args()
    size = int(args.size_gib * GIB)
    if args.rebuild:
        print(json.dumps({"duplex_rebuild": rebuild_side(args.dir, size)}, indent=2))
        return
    results = {}
    if args.ceph or args.ceph_only:
        snapshots.ensure_ceph()
    if not args.ceph_only:
        results["duplex"] = duplex_side(args.dir, args.seconds, size)
    if args.ceph or args.ceph_only:
        results["ceph"] = ceph_side(args.dir + "-ceph", args.seconds, size)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
