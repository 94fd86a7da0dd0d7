#!/usr/bin/env python3
"""Read/flush separation figures (issue 28; the thesis's figures 4.3/4.4),
recorded in docs/BENCHMARKS.md.

One OSD (or --osds 2, replicas 2) on this machine, its store on the
device model of a disk without power-loss protection (`duplex-osd
--model-flush-us`: every flush takes that much longer and holds up every
request queued behind it on its device: the VM's virtio disk does not
show that by itself), in three layouts:

- single: one store file;
- plain: a mirrored pair, both flushed by every commit, reads from either;
- split: a mirrored pair, read-flush-split: commits flush the first,
  reads go to the second;

each with the operation log on a file written with O_DSYNC (`file`, on
this machine's disk) and on memory standing in for an NVDIMM (`pmem` on
/dev/shm). Per layout and log: a 256 MiB image written whole, then 4 KiB
random I/O at read:write 10:0, 7:3, 5:5, 3:7 and 0:10 (fio's nbd engine,
2 jobs x queue depth 16, --seconds each): IOPS and the reads' p99.

    cargo build --release -p duplex-cli && bench/mirror.py [--seconds 10] [--flush-us 2000] [--osds 1]

--smoke: one layout (split), one log (pmem), one mix (7:3), 1 s: CI runs
it so that the script does not rot.

Prints the figures as JSON (and a table). Stops and wipes its clusters,
also on failure.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snapshots  # noqa: E402  (the cluster helpers)

MIXES = [100, 70, 50, 30, 0]  # percent reads


def run_mix(uri, read_pct, seconds):
    args = ["--rw=randrw", f"--rwmixread={read_pct}", "--time_based=1", f"--runtime={seconds}"]
    out = snapshots.fio_json(
        snapshots.subprocess.run(
            ["fio", "--output-format=json", "--name=mix", "--ioengine=nbd", f"--uri={uri}", "--bs=4k",
             "--iodepth=16", "--numjobs=2", "--group_reporting=1", "--direct=1", "--size=256M", *args],
            check=True, capture_output=True, text=True).stdout)
    job = out["jobs"][0]
    iops = job["read"]["iops"] + job["write"]["iops"]
    p99 = job["read"]["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1000.0 if read_pct else None
    return iops, p99


def one(layout, log, args, base):
    directory = tempfile.mkdtemp(prefix=f"mirrorbench-{layout}-{log}-", dir=base)
    up = ["dev", "up", "--dir", directory, "--osds", str(args.osds), "--replicas", str(args.osds),
          "--osd-size", "1G", "--pg-num", "16", "--osd-set", f"model_flush_us={args.flush_us}"]
    if layout != "single":
        up += ["--mirror", "plain" if layout == "plain" else "read-flush-split"]
    if log == "file":
        logs = os.path.join(directory, "oplogs-{id}")
        up += ["--osd-set", "oplog_mode=file", "--osd-set", f"oplog_dir={logs}"]
    else:
        up += ["--osd-set", "oplog_mode=pmem"]
    with snapshots.served_image(directory, up) as uri:
        figures = {}
        for mix in args.mixes:
            iops, p99 = run_mix(uri, mix, args.seconds)
            figures[f"{mix}:{100 - mix}"] = {"iops": round(iops), "read_p99_us": p99 and round(p99)}
            print(f"{layout:6} {log:4} {mix:3}:{100 - mix:<3} {iops:9.0f} IOPS  read p99 {p99 or 0:9.0f} us",
                  file=sys.stderr, flush=True)
        return figures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--flush-us", type=int, default=2000)
    parser.add_argument("--osds", type=int, default=1)
    parser.add_argument("--layouts", default="single,plain,split")
    parser.add_argument("--logs", default="file,pmem")
    parser.add_argument("--dir", default=None, help="where the clusters live (default: a temp dir on /tmp)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    args.mixes = MIXES
    if args.smoke:
        args.seconds, args.layouts, args.logs, args.mixes = 1, "split", "pmem", [70]
    base = args.dir or tempfile.mkdtemp(prefix="mirrorbench-")
    results = {}
    for log in args.logs.split(","):
        for layout in args.layouts.split(","):
            results[f"{layout}/{log}"] = one(layout, log, args, base)
    print(json.dumps({"flush_us": args.flush_us, "osds": args.osds, "seconds": args.seconds, "results": results},
                     indent=2))


if __name__ == "__main__":
    main()
