#!/usr/bin/env python3
"""Recovery under load (issue 31, docs/BENCHMARKS.md): a local cluster of 3
OSDs (size 2) with a 2 GiB image filled, osd.0 marked out and its PGs moved
to the others; then 4 KiB random writes at half the cluster's measured
capacity (open loop, `duplex bench --rate`) while `duplex mark in 0`
backfills osd.0's share back (osd.0 kept its copies while out: the
backfill compares them and sends the chunks the load changed, which after
15 s of it are most of them). Prints the client's p50/p99 in the
steady seconds before and during the backfill, and the backfill's time,
for each --osd-set variant given (default: the defaults, and recovery
given 4x the bytes a second). Uses a release build; stops and wipes its
clusters at the end, also on failure.

    cargo build --release -p duplex-cli -p duplex-osd -p duplex-mon && bench/recovery_load.py
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from duplexbench import procs  # noqa: E402
# The release `duplex` and its helpers, and the OSD logs' "backfill complete ... bytes=N".
from rereplicate import DUPLEX, backfill_sent, duplex, status  # noqa: E402


def cluster_processes(directory):
    """{pid: name} of the cluster's daemons (`osd.0`, `mon.1`: their
    config file's name) and of a running `duplex bench` (`bench`)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                argv = f.read().split("\0")
        except OSError:
            continue
        configs = [a for a in argv if a.startswith(directory) and a.endswith(".toml")]
        if configs:
            found[int(pid)] = os.path.basename(configs[0])[: -len(".toml")]
        elif len(argv) > 1 and argv[0] == DUPLEX and argv[1] == "bench":
            found[int(pid)] = "bench"
    return found


def cpu_sample(pids):
    """CPU seconds per (process, thread class) of `pids` ({pid: name})."""
    return {(name, thread): seconds for pid, name in pids.items()
            for thread, seconds in procs.thread_cpu(pid).items()}


def cores(before, after, seconds):
    """Cores used per (process, thread class) between two samples."""
    return {key: (after.get(key, 0.0) - before.get(key, 0.0)) / max(seconds, 1e-9) for key in after}


def wait_clean(timeout_s=900):
    """Waits until every PG is active+clean; returns when (time.time())."""
    start = time.time()
    while time.time() - start < timeout_s:
        if all(state == "active+clean" for state in status()["pgs"]):
            return time.time()
        time.sleep(0.25)
    sys.exit(f"PGs not clean after {timeout_s} s")


def percentile(pairs, q):
    """The q-quantile of merged [µs, count] pairs."""
    pairs = sorted(pairs)
    total = sum(count for _, count in pairs)
    if total == 0:
        return 0
    seen = 0
    for value, count in pairs:
        seen += count
        if seen >= q * total:
            return value
    return pairs[-1][0]


def window(intervals, start_ms, end_ms):
    """Latency pairs and ops of the seconds wholly inside [start, end]."""
    pairs, ops, seconds = [], 0, 0
    for line in intervals:
        if start_ms + 1000 <= line["unix_ms"] <= end_ms:
            pairs.extend(line["latencies"])
            ops += line["ops"]
            seconds += 1
    return pairs, ops, seconds


def one_run(args, variant):
    directory = args.dir
    os.environ["DUPLEX_CONF"] = os.path.join(directory, "client.toml")
    up = ["dev", "up", "--dir", directory, "--osds", "3", "--osd-size", "4G"]
    for setting in variant:
        up += ["--osd-set", setting]
    duplex(*up, capture=True)
    try:
        duplex("image", "create", "disk", "--size", f"{args.image_mib}M", capture=True)
        duplex("bench", "--image", "disk", "--pattern", "seqwrite", "--bs", "4M", "--qd", "8",
               "--seconds", str(args.fill_seconds), "--json", capture=True)
        capacity = json.loads(duplex("bench", "--image", "disk", "--qd", "32", "--seconds",
                                     str(args.capacity_seconds), "--json", capture=True))["iops"]
        duplex("mark", "out", "0", capture=True)
        time.sleep(2)
        wait_clean()
        rate = int(capacity * args.load)
        bench = subprocess.Popen([DUPLEX, "bench", "--image", "disk", "--qd", "256", "--rate", str(rate),
                                  "--seconds", str(args.max_seconds), "--json", "--intervals"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        intervals = []

        def read_intervals():
            for line in bench.stderr:
                if line.startswith("{"):
                    intervals.append(json.loads(line))

        reader = threading.Thread(target=read_intervals, daemon=True)
        reader.start()
        steady_start = time.time()
        time.sleep(2)
        pids = cluster_processes(directory)
        cpu_steady = (time.time(), cpu_sample(pids))
        time.sleep(max(args.steady_seconds - 2, 1))
        sent_before = backfill_sent(directory)
        marked = time.time()
        cpu_marked = cpu_sample(pids)
        duplex("mark", "in", "0", capture=True)
        time.sleep(2)
        clean = wait_clean()
        cpu_clean = cpu_sample(pids)
        sent = backfill_sent(directory) - sent_before
        time.sleep(args.after_seconds)
        bench.terminate()
        bench.wait(timeout=30)
        reader.join(timeout=10)
        if args.save:
            with open(args.save, "a") as out:
                out.write(json.dumps({"variant": variant, "steady_start": steady_start, "marked": marked,
                                      "clean": clean, "seconds": [{k: v for k, v in i.items() if k != "latencies"}
                                                                  for i in intervals]}) + "\n")
        steady, steady_ops, steady_s = window(intervals, steady_start * 1000 + 2000, marked * 1000)
        during, during_ops, during_s = window(intervals, marked * 1000, clean * 1000)
        errors = intervals[-1]["errors"] if intervals else -1
        return {
            "variant": " ".join(variant) or "defaults",
            "capacity": capacity,
            "rate": rate,
            "steady": (percentile(steady, 0.5), percentile(steady, 0.99), steady_ops / max(steady_s, 1)),
            "during": (percentile(during, 0.5), percentile(during, 0.99), during_ops / max(during_s, 1)),
            "recovery_s": clean - marked,
            "sent_gib": sent / 2**30,
            "errors": errors,
            "cpu": (cores(cpu_steady[1], cpu_marked, marked - cpu_steady[0]), cores(cpu_marked, cpu_clean, clean - marked)),
        }
    finally:
        duplex("dev", "down", "--dir", directory, "--wipe", capture=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/duplex-recovery-load")
    parser.add_argument("--image-mib", type=int, default=2048)
    parser.add_argument("--capacity-seconds", type=int, default=10)
    parser.add_argument("--fill-seconds", type=int, default=12)
    parser.add_argument("--load", type=float, default=0.5, help="the open-loop rate, as a share of capacity")
    parser.add_argument("--steady-seconds", type=int, default=15)
    parser.add_argument("--after-seconds", type=int, default=3)
    parser.add_argument("--max-seconds", type=int, default=1200)
    parser.add_argument("--save", help="append each run's per-second figures to this file (JSON lines)")
    parser.add_argument("--variant", action="append", default=None,
                        help="space-separated KEY=VALUE --osd-set settings of one run (repeatable)")
    parser.add_argument("--cpu", action="store_true",
                        help="also print the cores each daemon's thread classes used, steady and during the backfill")
    parser.add_argument("--smoke", action="store_true",
                        help="CI: a 64 MiB image, seconds-long phases, the defaults only (checks the script works)")
    args = parser.parse_args()
    if args.smoke:
        args.image_mib, args.fill_seconds, args.capacity_seconds = 64, 1, 1
        args.steady_seconds, args.after_seconds, args.variant = 5, 0, [""]
    variants = [v.split() for v in args.variant] if args.variant else [[], ["recovery-bytes-per-sec=536870912"]]
    print(f"{'variant':<40} {'capacity':>8} {'rate':>6} {'steady p50/p99 µs':>18} {'during p50/p99 µs':>18} "
          f"{'during IOPS':>11} {'p99 x':>6} {'recovery s':>10}")
    for variant in variants:
        r = one_run(args, variant)
        ratio = r["during"][1] / max(r["steady"][1], 1)
        print(f"{r['variant']:<40} {r['capacity']:>8.0f} {r['rate']:>6} "
              f"{r['steady'][0]:>8}/{r['steady'][1]:<9} {r['during'][0]:>8}/{r['during'][1]:<9} "
              f"{r['during'][2]:>11.0f} {ratio:>6.2f} {r['recovery_s']:>10.1f}  sent {r['sent_gib']:.2f} GiB"
              f"  errors {r['errors']}", flush=True)
        if args.cpu:
            steady, during = r["cpu"]
            print("  cores used, steady -> during the backfill, per process and thread class:")
            for key in sorted(set(steady) | set(during)):
                if steady.get(key, 0) >= 0.01 or during.get(key, 0) >= 0.01:
                    print(f"    {key[0]:<8} {key[1]:<16} {steady.get(key, 0):5.2f} -> {during.get(key, 0):5.2f}")
            print(f"    {'total':<25} {sum(steady.values()):5.2f} -> {sum(during.values()):5.2f}", flush=True)


if __name__ == "__main__":
    main()
