#!/usr/bin/env python3
"""Write throughput by client threads (issue 28; the thesis's figures
4.1/4.2), recorded in docs/BENCHMARKS.md.

The thesis keeps the write-ahead log on an NVDIMM so that no device flush
is on a write's critical path. Here: 4 KiB random writes by 1, 2, 4, 8
and 16 client threads (fio's nbd engine, one job per thread, queue depth 1
each), on one OSD (1 copy) and on two OSDs (2 copies), each with

- `pmem`: the operation log on memory standing in for an NVDIMM (/dev/shm),
  acknowledged once it is in every copy's log (write_path=oplog);
- `sync`: the store's own commit and flush on the critical path, as a
  conventional OSD (write_path=sync),

the store on the device model of a disk without power-loss protection
(`--model-flush-us`: every flush takes that much longer and holds up what
is queued behind it: the VM's virtio disk does not show it by itself).

    cargo build --release -p duplex-cli && bench/write_threads.py [--seconds 5] [--flush-us 2000]

--smoke: one OSD, pmem, 1 thread, 1 s: CI runs it so that the script does
not rot. Prints the figures as JSON (and a table on stderr). Stops and
wipes its clusters, also on failure.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snapshots  # noqa: E402  (the cluster helpers)

THREADS = [1, 2, 4, 8, 16]


def writes(uri, threads, seconds):
    out = snapshots.fio_json(
        snapshots.subprocess.run(
            ["fio", "--output-format=json", "--name=w", "--ioengine=nbd", f"--uri={uri}", "--bs=4k",
             "--rw=randwrite", "--iodepth=1", f"--numjobs={threads}", "--group_reporting=1", "--direct=1",
             "--size=256M", "--time_based=1", f"--runtime={seconds}"],
            check=True, capture_output=True, text=True).stdout)
    job = out["jobs"][0]["write"]
    p99 = job["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1000.0
    return job["iops"], p99


def one(osds, path, args, base):
    directory = tempfile.mkdtemp(prefix=f"writethreads-{osds}-{path}-", dir=base)
    up = ["dev", "up", "--dir", directory, "--osds", str(osds), "--replicas", str(osds), "--osd-size", "1G",
          "--pg-num", "16", "--osd-set", f"model_flush_us={args.flush_us}", "--osd-set", "oplog_mode=pmem"]
    if path == "sync":
        up += ["--osd-set", "write_path=sync"]
    with snapshots.served_image(directory, up) as uri:
        figures = {}
        for threads in args.threads:
            iops, p99 = writes(uri, threads, args.seconds)
            figures[str(threads)] = {"iops": round(iops), "mib_s": round(iops * 4 / 1024, 1), "p99_us": round(p99)}
            print(f"{osds} OSD(s) {path:4} {threads:2} threads {iops:9.0f} IOPS  p99 {p99:9.0f} us",
                  file=sys.stderr, flush=True)
        return figures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--flush-us", type=int, default=2000)
    parser.add_argument("--osds", default="1,2")
    parser.add_argument("--paths", default="pmem,sync")
    parser.add_argument("--dir", default=None, help="where the clusters live (default: a temp dir on /tmp)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    args.threads = THREADS
    if args.smoke:
        args.seconds, args.osds, args.paths, args.threads = 1, "1", "pmem", [1]
    base = args.dir or tempfile.mkdtemp(prefix="writethreads-")
    results = {}
    for osds in [int(n) for n in args.osds.split(",")]:
        for path in args.paths.split(","):
            results[f"{osds}osd/{path}"] = one(osds, path, args, base)
    print(json.dumps({"flush_us": args.flush_us, "seconds": args.seconds, "results": results}, indent=2))


if __name__ == "__main__":
    main()
