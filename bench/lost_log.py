#!/usr/bin/env python3
"""Client I/O while an OSD that lost its operation log comes back: a local
cluster of 3 OSDs (size 2, min_size 1), a 2 GiB image filled by sequential
writes, then 4 KiB random writes for 40 s during which osd.1 loses power
(kill -9, its `shm` log deleted; with --keep-log a crash that keeps the
log, so it is only behind by history) and is started again at once. Every PG
osd.1 holds then needs a whole backfill (docs/RELIABILITY.md, "Peering and
recovery"). Prints the random writes' figures (the longest latency is the
longest a write waited) and what the OSDs' logs say about recovery. Uses a
release build of `duplex`; stops and wipes its cluster at the end, also on
failure.

    cargo build --release -p duplex-cli && bench/lost_log.py [--dir /tmp/lost-log]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DUPLEX = os.environ.get("DUPLEX_BIN", os.path.join(ROOT, "target", "release", "duplex"))


def duplex(*args, capture=False):
    result = subprocess.run([DUPLEX, *args], check=True, capture_output=capture, text=True)
    return result.stdout


def log_lines(directory, needle):
    lines = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("osd.") and name.endswith(".log"):
            with open(os.path.join(directory, name), errors="replace") as log:
                lines += [line for line in log if needle in line]
    return lines


def field(line, name):
    for part in line.split():
        if part.startswith(name + "="):
            return part[len(name) + 1:]
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/duplex-lost-log")
    parser.add_argument("--image-gib", type=int, default=2)
    parser.add_argument("--fill-seconds", type=int, default=12)
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("--cut-after", type=float, default=8.0)
    parser.add_argument("--keep-log", action="store_true",
                        help="a crash, not a power cut: the log survives, and osd.1 is behind by history")
    args = parser.parse_args()
    os.environ["DUPLEX_CONF"] = os.path.join(args.dir, "client.toml")
    duplex("dev", "up", "--dir", args.dir, "--osds", "3", "--osd-size", "4G")
    bench = None
    try:
        duplex("image", "create", "disk", "--size", f"{args.image_gib}G")
        duplex("bench", "--image", "disk", "--pattern", "seqwrite", "--bs", "4M", "--qd", "8",
               "--seconds", str(args.fill_seconds))
        bench = subprocess.Popen([DUPLEX, "bench", "--image", "disk", "--pattern", "randwrite", "--qd", "16",
                                  "--seconds", str(args.seconds), "--json"], stdout=subprocess.PIPE, text=True)
        time.sleep(args.cut_after)
        with open(os.path.join(args.dir, "state.json")) as f:
            state = json.load(f)
        pid = next(p["pid"] for p in state["processes"] if p["name"] == "osd.1")
        os.kill(pid, signal.SIGKILL)  # a process `dev up` started for us
        for log_dir in state["oplog_dirs"]:
            if not args.keep_log and log_dir.startswith("/dev/shm/duplex-") and log_dir.endswith("-osd.1"):
                shutil.rmtree(log_dir, ignore_errors=True)
        duplex("dev", "restart", "--dir", args.dir, "--osd", "1")
        out, _ = bench.communicate(timeout=args.seconds + 120)
        bench = None
        result = json.loads(out)
        latency = result["latency_us"]
        fault = "crash (log kept)" if args.keep_log else "power cut"
        print(f"randwrite 4k qd16 for {result['seconds']:.0f} s, osd.1's {fault} after {args.cut_after:.0f} s: "
              f"{result['iops']:.0f} IOPS, p99 {latency['p99'] / 1000:.1f} ms, p99.9 {latency['p999'] / 1000:.1f} ms, "
              f"longest write {latency['max'] / 1e6:.2f} s, {result['errors']} errors")
        inside = log_lines(args.dir, "PG recovered and active")
        behind = log_lines(args.dir, "filled in the background")
        by_history = log_lines(args.dir, "behind by history is filled")
        handed = log_lines(args.dir, "handing the PG to a whole member")
        filled = log_lines(args.dir, "backfill complete")
        print(f"recovered inside peering: {len(inside)} PGs, "
              f"{sum(int(field(l, 'bytes') or 0) for l in inside) / 2**20:.0f} MiB copied; "
              f"filled in the background: {len(behind)} PGs ({len(by_history)} behind by history); handed over: {len(handed)} PGs; backfills complete: {len(filled)}, "
              f"{sum(int(field(l, 'bytes') or 0) for l in filled) / 2**20:.0f} MiB sent")
    finally:
        if bench is not None:
            bench.kill()
            bench.wait()
        duplex("dev", "down", "--dir", args.dir, "--wipe")


if __name__ == "__main__":
    sys.exit(main())
