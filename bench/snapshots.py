#!/usr/bin/env python3
"""Snapshot and clone figures (issue 25), recorded in docs/BENCHMARKS.md.

A local cluster like bench/run's (2 OSDs, size 2, min_size 1, 32 PGs),
fio's nbd engine on `duplex nbd serve` (2 jobs x queue depth 16, 4 KiB):

1. a 1 GiB image written whole, then passes of random 4 KiB writes over
   it (fio's random map: every block once each): the baseline is their
   mean (--passes of them: the first pass after the fill runs about 5%
   faster than the ones after it, on either side of a snapshot);
2. `snap create`, then the same pass: the first pass clones every
   object and copies every block once; then --passes more, in which every
   block was written since the snapshot (the "second pass" figure is
   their mean);
3. random 4 KiB reads of the image, of the snapshot (`IMAGE@SNAP`) and of
   a clone of it that was never written (reads through to its parent);
4. `snap create` of a 1 TiB thin image with data (16,384 random 64 KiB
   writes, 1 GiB over 16,384 of its objects), while served and not;
5. a 10 GiB image written whole, `snap create`, 1% of its 4 KiB blocks
   rewritten at random, `snap create`, `export-diff` between the two:
   the bytes it moves against the image's.

    cargo build --release -p duplex-cli && bench/snapshots.py [--dir /tmp/snapbench] [--big-gib 10] [--passes 3] [--ceph]

With --ceph, Ceph's two write figures too, on the suite's Ceph cluster
(bench/duplexbench/ceph.py: 2 BlueStore OSDs, size 2; fio's rbd engine):
the same passes around `rbd snap create`.

--writes-only runs step 1 and 2 alone (A/B of the write path, with
--binary); --snap-latency alone times `snap create` of a served image, idle
and under a random-write load.

Stops and wipes its cluster at the end, also on failure.
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DUPLEX = os.path.join(ROOT, "target", "release", "duplex")
GIB = 1 << 30


class Cluster:
    def __init__(self, directory):
        self.dir = directory
        self.env = dict(os.environ, DUPLEX_CONF=os.path.join(directory, "client.toml"))
        self.servers = []
        self.started = 0

    def duplex(self, *args, capture=False):
        result = subprocess.run([DUPLEX, *args], check=True, capture_output=capture, text=True, env=self.env)
        return result.stdout

    def serve(self, spec):
        self.started += 1
        socket = os.path.join(self.dir, f"nbd-{self.started}.sock")
        log = open(os.path.join(self.dir, f"nbd-{self.started}.log"), "w")
        child = subprocess.Popen([DUPLEX, "nbd", "serve", "--image", spec, "--socket", socket],
                                 stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.servers.append(child)
        for _ in range(300):
            if os.path.exists(socket):
                return f"nbd+unix:///{spec}?socket={socket}", child
            if child.poll() is not None:
                sys.exit(f"nbd serve {spec} exited; see {log.name}")
            time.sleep(0.1)
        sys.exit(f"nbd serve {spec} did not listen")

    def stop(self, child):
        child.terminate()  # ends its watch first (SIGTERM)
        child.wait(timeout=30)
        self.servers.remove(child)

    def down(self):
        for child in list(self.servers):
            child.kill()
            child.wait()
        subprocess.run([DUPLEX, "dev", "down", "--wipe", "--dir", self.dir], env=self.env, capture_output=True)


@contextlib.contextmanager
def served_image(directory, up, size_mib=256):
    """A `dev up` cluster under `directory` (`up`: its flags), an image of
    `size_mib` MiB written whole and served over NBD: yields its URI; the
    cluster is stopped and wiped afterwards, also on failure."""
    cluster = Cluster(directory)
    try:
        cluster.duplex(*up, capture=True)
        cluster.duplex("image", "create", "bench", "--size", f"{size_mib}M", capture=True)
        uri, _ = cluster.serve("bench")
        fio(uri, "write", size=size_mib << 20, extra=["--bs=1M"])
        yield uri
    finally:
        cluster.down()


def fio(uri, rw, size=None, runtime=None, name="job", extra=()):
    """One fio run (2 jobs x QD 16, 4 KiB, nbd engine); returns (IOPS, seconds)."""
    args = ["fio", "--output-format=json", f"--name={name}", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}",
            "--bs=4k", "--iodepth=16", "--numjobs=2", "--group_reporting=1", "--direct=1", *extra]
    if "read" in rw:
        args.append("--readonly")  # a snapshot's export is read-only
    if size is not None:
        # Each job covers half the image once: every block written once.
        args += [f"--size={size // 2}", "--offset_increment=" + str(size // 2)]
    if runtime is not None:
        args += ["--time_based=1", f"--runtime={runtime}"]
    out = fio_json(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    job = out["jobs"][0]
    side = job["write"] if "write" in rw else job["read"]
    return side["iops"], job["job_runtime"] / 1000.0


def fio_json(stdout):
    """fio's JSON report (fio may print notes before it)."""
    return json.loads(stdout[stdout.index("{"):])


def fio_rbd(env, rw, size, name, bs="4k", iodepth=16, numjobs=2):
    """The same passes on a Ceph image through librbd."""
    args = ["fio", "--output-format=json", f"--name={name}", "--ioengine=rbd", "--clientname=admin",
            f"--pool={env['POOL']}", f"--rbdname={env['IMAGE']}", f"--rw={rw}", f"--bs={bs}",
            f"--iodepth={iodepth}", f"--numjobs={numjobs}", "--group_reporting=1", "--direct=1",
            f"--size={size // numjobs}", f"--offset_increment={size // numjobs}"]
    run_env = dict(os.environ, CEPH_CONF=str(env["CEPH_CONF"]))
    out = fio_json(subprocess.run(args, check=True, capture_output=True, text=True, env=run_env).stdout)
    job = out["jobs"][0]
    return (job["write"] if "write" in rw else job["read"])["iops"]


def ensure_ceph():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from duplexbench.ceph import missing_packages

    missing = missing_packages()
    if missing:
        if os.geteuid() != 0:
            sys.exit(f"need {' '.join(missing)}: run as root, or apt-get install -y {' '.join(missing)}")
        # apt's chatter goes to stderr: stdout is the figures' JSON.
        subprocess.run(["apt-get", "update", "-qq"], check=True, stdout=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-qq", *sorted(set(missing))], check=True, stdout=sys.stderr,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def pass_figures(prefix, baseline, second):
    """Each pass's IOPS and the two means (`first_pass_write_iops` is set by the caller)."""
    return {
        f"{prefix}baseline_passes": baseline,
        f"{prefix}baseline_write_iops": sum(baseline) / len(baseline),
        f"{prefix}second_passes": second,
        f"{prefix}second_pass_write_iops": sum(second) / len(second),
    }


def ceph_figures(work_dir, passes):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from duplexbench.ceph import CephCluster

    ceph = CephCluster(work_dir, osds=2, osd_size_gib=8, image_size_gib=1, pg_num=32)
    figures = {}
    try:
        ceph.up()
        env = ceph.fio_env()
        fio_rbd(env, "write", GIB, "fill", bs="1m", iodepth=8, numjobs=1)
        baseline = [fio_rbd(env, "randwrite", GIB, f"baseline{n}") for n in range(passes)]
        ceph.run("rbd", "snap", "create", f"{env['POOL']}/{env['IMAGE']}@s1")
        figures["ceph_first_pass_write_iops"] = fio_rbd(env, "randwrite", GIB, "first")
        second = [fio_rbd(env, "randwrite", GIB, f"second{n}") for n in range(passes)]
        figures.update(pass_figures("ceph_", baseline, second))
        figures["ceph_version"] = ceph.version()
    finally:
        ceph.down()
    base = figures["ceph_baseline_write_iops"]
    figures["ceph_first_pass_ratio"] = figures["ceph_first_pass_write_iops"] / base
    figures["ceph_second_pass_ratio"] = figures["ceph_second_pass_write_iops"] / base
    return figures


def fill(uri, size):
    subprocess.run(["fio", f"--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1m",
                    "--iodepth=8", f"--size={size}", "--direct=1"], check=True, capture_output=True)


def snap_latency(cluster, directory):
    """`snap create` of a served image, idle and while 2 jobs x QD 16 write it
    at random: the time the CLI reports (the operation) and the wall time
    (with the process's start and its connection to the monitors)."""
    import re
    import threading

    cluster.duplex("dev", "up", "--dir", directory, "--osds", "2", "--replicas", "2", "--min-size", "1",
                   "--pg-num", "32", "--osd-size", "8G")
    cluster.duplex("image", "create", "perf", "--size", "1G")
    uri, _server = cluster.serve("perf")
    fill(uri, GIB)

    def take(name):
        started = time.time()
        out = cluster.duplex("snap", "create", f"perf@{name}", capture=True)
        value, unit = re.search(r" in ([0-9.]+)(µs|ms|s);", out).groups()
        reported = float(value) * {"µs": 0.001, "ms": 1.0, "s": 1000.0}[unit]
        return reported, round((time.time() - started) * 1000, 1)

    idle = [take(f"idle{n}") for n in range(5)]
    load = {}
    writer = threading.Thread(target=lambda: load.update(iops=fio(uri, "randwrite", runtime=12, name="load",
                                                                  extra=["--size=1G"])[0]))
    writer.start()
    time.sleep(2)
    loaded = []
    for n in range(5):
        loaded.append(take(f"load{n}"))
        time.sleep(1)
    writer.join()
    return {"idle_ms_reported_wall": idle, "under_load_ms_reported_wall": loaded, "load_iops": load["iops"]}


def main():
    global DUPLEX
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp/duplex-snapbench")
    parser.add_argument("--big-gib", type=int, default=10)
    parser.add_argument("--read-seconds", type=int, default=15)
    parser.add_argument("--ceph", action="store_true", help="Ceph's two write figures too (installs Ceph)")
    parser.add_argument("--ceph-only", action="store_true", help="Ceph's figures alone")
    parser.add_argument("--passes", type=int, default=3, help="write passes averaged on each side of the snapshot")
    parser.add_argument("--snap-latency", action="store_true",
                        help="alone: snap create of a served 1 GiB image, 5 times while fio writes it at random")
    parser.add_argument("--writes-only", action="store_true",
                        help="the write passes alone (for A/B runs of the write path)")
    parser.add_argument("--binary", default=DUPLEX, help="the duplex binary to run (A/B: one per build)")
    args = parser.parse_args()
    if args.ceph or args.ceph_only:
        ensure_ceph()
    if args.ceph_only:
        print(json.dumps(ceph_figures(args.dir + "-ceph", args.passes), indent=2))
        return
    DUPLEX = args.binary
    if os.path.exists(args.dir):
        shutil.rmtree(args.dir)
    cluster = Cluster(args.dir)
    results = {}
    if args.snap_latency:
        try:
            print(json.dumps(snap_latency(cluster, args.dir), indent=2))
        finally:
            cluster.down()
        return
    try:
        # The suite's shape (bench/run): 2 OSDs of 8 GiB.
        cluster.duplex("dev", "up", "--dir", args.dir, "--osds", "2", "--replicas", "2", "--min-size", "1",
                       "--pg-num", "32", "--osd-size", "8G")
        cluster.duplex("image", "create", "perf", "--size", "1G")
        uri, server = cluster.serve("perf")
        fill(uri, GIB)
        baseline = [fio(uri, "randwrite", size=GIB, name=f"baseline{n}")[0] for n in range(args.passes)]
        started = time.time()
        cluster.duplex("snap", "create", "perf@s1")
        results["snap_create_served_s"] = time.time() - started
        results["first_pass_write_iops"], _ = fio(uri, "randwrite", size=GIB, name="first")
        second = [fio(uri, "randwrite", size=GIB, name=f"second{n}")[0] for n in range(args.passes)]
        results.update(pass_figures("", baseline, second))
        if args.writes_only:
            base = results["baseline_write_iops"]
            results["first_pass_ratio"] = results["first_pass_write_iops"] / base
            results["second_pass_ratio"] = results["second_pass_write_iops"] / base
            print(json.dumps(results, indent=2))
            return
        results["head_read_iops"], _ = fio(uri, "randread", runtime=args.read_seconds, name="head",
                                           extra=["--size=1G"])
        cluster.stop(server)
        uri, server = cluster.serve("perf@s1")
        results["snapshot_read_iops"], _ = fio(uri, "randread", runtime=args.read_seconds, name="snap",
                                               extra=["--size=1G"])
        cluster.stop(server)
        # A 1 TiB thin image with data: snap create, served and not.
        cluster.duplex("image", "create", "huge", "--size", "1T")
        huge_uri, huge_server = cluster.serve("huge")
        subprocess.run(["fio", "--name=spread", "--ioengine=nbd", f"--uri={huge_uri}", "--rw=randwrite", "--bs=64k",
                        "--iodepth=16", "--size=1T", "--number_ios=16384", "--norandommap", "--direct=1"],
                       check=True, capture_output=True)
        started = time.time()
        cluster.duplex("snap", "create", "huge@served")
        results["snap_create_1tib_served_s"] = time.time() - started
        cluster.stop(huge_server)
        started = time.time()
        cluster.duplex("snap", "create", "huge@idle")
        results["snap_create_1tib_idle_s"] = time.time() - started
        cluster.duplex("snap", "protect", "perf@s1")
        cluster.duplex("image", "clone", "perf@s1", "child")
        uri, server = cluster.serve("child")
        results["clone_read_iops"], _ = fio(uri, "randread", runtime=args.read_seconds, name="clone",
                                            extra=["--size=1G"])
        cluster.stop(server)
    finally:
        cluster.down()
    # The big image needs bigger OSDs: a cluster of its own.
    if os.path.exists(args.dir):
        shutil.rmtree(args.dir)
    cluster = Cluster(args.dir)
    try:
        cluster.duplex("dev", "up", "--dir", args.dir, "--osds", "2", "--replicas", "2", "--min-size", "1",
                       "--pg-num", "32", "--osd-size", f"{args.big_gib * 2 + 4}G")
        big = args.big_gib * GIB
        cluster.duplex("image", "create", "big", "--size", f"{args.big_gib}G")
        uri, server = cluster.serve("big")
        fill(uri, big)
        cluster.duplex("snap", "create", "big@mon")
        blocks = big // 4096 // 100
        subprocess.run(["fio", "--name=change", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite", "--bs=4k",
                        "--iodepth=16", f"--size={big}", f"--number_ios={blocks}", "--direct=1"],
                       check=True, capture_output=True)
        cluster.duplex("snap", "create", "big@tue")
        cluster.stop(server)
        diff_path = os.path.join(args.dir, "tue.diff")
        started = time.time()
        cluster.duplex("image", "export-diff", "big@tue", "--from-snap", "mon", diff_path)
        results["export_diff_s"] = time.time() - started
        results["export_diff_bytes"] = os.path.getsize(diff_path)
        results["changed_bytes"] = blocks * 4096
        results["big_image_bytes"] = big
    finally:
        cluster.down()
    base = results["baseline_write_iops"]
    results["first_pass_ratio"] = results["first_pass_write_iops"] / base
    results["second_pass_ratio"] = results["second_pass_write_iops"] / base
    results["snapshot_read_ratio"] = results["snapshot_read_iops"] / results["head_read_iops"]
    results["clone_read_ratio"] = results["clone_read_iops"] / results["head_read_iops"]
    results["export_diff_share"] = results["export_diff_bytes"] / results["big_image_bytes"]
    if args.ceph:
        results.update(ceph_figures(args.dir + "-ceph", args.passes))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
