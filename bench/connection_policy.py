#!/usr/bin/env python3
"""The connection policies through the whole cluster (issue 29; the
Async-LCAM paper's Fig. 10/11), recorded in docs/BENCHMARKS.md.

A 3-OSD cluster (2 copies, 2 priority threads per OSD) serving one image
over NBD; fio random reads, random writes and an 80/20 read/write mix at
4 KiB to 1 MiB, under each `connection_policy` (`pinned`, `lcam`, `naive`;
`--lcam-interval-ms 1000` so that the placement settles within a run's
warm-up). Each figure is also given as a fraction of `pinned`'s.

    cargo build --release -p duplex-cli && bench/connection_policy.py [--seconds 5]

--smoke: pinned and lcam, 4 KiB writes, 1 s: CI runs it so that the script
does not rot. Prints the figures as JSON (and a table on stderr). Stops and
wipes its clusters, also on failure.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snapshots  # noqa: E402  (the cluster helpers)

BLOCKS = ["4k", "16k", "64k", "256k", "1m"]
WORKLOADS = {"randread": ["--rw=randread"], "randwrite": ["--rw=randwrite"],
             "mix80/20": ["--rw=randrw", "--rwmixread=80"]}


def run_fio(uri, workload, block, seconds, warmup):
    out = snapshots.fio_json(
        snapshots.subprocess.run(
            ["fio", "--output-format=json", "--name=p", "--ioengine=nbd", f"--uri={uri}", f"--bs={block}",
             *WORKLOADS[workload], "--iodepth=16", "--numjobs=2", "--group_reporting=1", "--direct=1",
             "--size=256M", "--time_based=1", f"--ramp_time={warmup}", f"--runtime={seconds}"],
            check=True, capture_output=True, text=True).stdout)
    job = out["jobs"][0]
    iops = job["read"]["iops"] + job["write"]["iops"]
    mib_s = (job["read"]["bw_bytes"] + job["write"]["bw_bytes"]) / (1 << 20)
    return iops, mib_s


def one(policy, args, base):
    directory = tempfile.mkdtemp(prefix=f"connpolicy-{policy}-", dir=base)
    up = ["dev", "up", "--dir", directory, "--osds", "3", "--replicas", "2", "--osd-size", "1G", "--pg-num", "32",
          "--osd-set", f"connection_policy={policy}", "--osd-set", "priority_threads=2",
          "--osd-set", "lcam_interval_ms=1000"]
    figures = {}
    with snapshots.served_image(directory, up) as uri:
        for workload in args.workloads:
            for block in args.blocks:
                iops, mib_s = run_fio(uri, workload, block, args.seconds, args.warmup)
                figures[f"{workload}/{block}"] = {"iops": round(iops), "mib_s": round(mib_s, 1)}
                print(f"{policy:6} {workload:9} {block:>4} {iops:9.0f} IOPS {mib_s:8.1f} MiB/s",
                      file=sys.stderr, flush=True)
    return figures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--policies", default="pinned,lcam,naive")
    parser.add_argument("--dir", default=None, help="where the clusters live (default: a temp dir on /tmp)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    args.workloads, args.blocks = list(WORKLOADS), BLOCKS
    if args.smoke:
        args.seconds, args.warmup, args.policies = 1, 0, "pinned,lcam"
        args.workloads, args.blocks = ["randwrite"], ["4k"]
    base = args.dir or tempfile.mkdtemp(prefix="connpolicy-")
    results = {policy: one(policy, args, base) for policy in args.policies.split(",")}
    pinned = results.get("pinned", {})
    for policy, figures in results.items():
        for point, figure in figures.items():
            if pinned.get(point, {}).get("iops"):
                figure["vs_pinned"] = round(figure["iops"] / pinned[point]["iops"], 3)
    print(json.dumps({"seconds": args.seconds, "warmup": args.warmup, "results": results}, indent=2))


if __name__ == "__main__":
    main()
