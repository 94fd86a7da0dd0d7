#!/usr/bin/env python3
"""Noisy neighbour (issue 31, docs/BENCHMARKS.md): on a local cluster of 3
OSDs (size 2), image B runs 4 KiB random writes at queue depth 1, alone and
beside image A at queue depth 64 (unlimited), with the OSDs' QoS scheduler
off (no QoS setting in the map) and on (B with a reservation, and with a
reservation and a weight), and with A limited. Prints B's IOPS and latency and A's IOPS per
phase. Uses a release build of `duplex`; stops and wipes its cluster at the
end, also on failure.

    cargo build --release -p duplex-cli -p duplex-osd -p duplex-mon && bench/qos_noisy.py
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DUPLEX = os.path.join(ROOT, "target", "release", "duplex")


def duplex(*args, capture=False):
    result = subprocess.run([DUPLEX, *args], check=True, capture_output=capture, text=True)
    return result.stdout


def bench_cmd(image, qd, seconds):
    return [DUPLEX, "bench", "--image", image, "--pattern", "randwrite", "--bs", "4k", "--qd", str(qd),
            "--seconds", str(seconds), "--json"]


def run_phase(seconds, noisy):
    """B at QD1 for `seconds`, with A at QD64 around it when `noisy`."""
    a = None
    if noisy:
        # A starts first and runs past B's end, so B never runs alone.
        a = subprocess.Popen(bench_cmd("a", 64, seconds + 4), stdout=subprocess.PIPE, text=True)
        subprocess.run(["sleep", "2"], check=True)
    try:
        b = json.loads(subprocess.run(bench_cmd("b", 1, seconds), check=True, capture_output=True,
                                      text=True).stdout)
    finally:
        a_result = None
        if a is not None:
            out, _ = a.communicate(timeout=seconds + 60)
            if a.returncode != 0:
                sys.exit(f"A's bench failed ({a.returncode})")
            a_result = json.loads(out)
    return b, a_result


CLEAR = [("a", "qos_iops=0"), ("b", "qos_reservation_iops=0"), ("b", "qos_weight=1"), ("c", "qos_weight=1")]


def apply(settings):
    """Clears every setting, then applies `settings` ((image, key=value)):
    with none, the map has no QoS setting and the OSDs' scheduler is off."""
    for image, setting in CLEAR + settings:
        duplex("image", "set", image, setting, capture=True)
    # The OSDs follow the map within a second.
    subprocess.run(["sleep", "1.5"], check=True)


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/duplex-qos-noisy")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="each condition this often, interleaved")
    parser.add_argument("--reservation", type=int, default=2000, help="B's qos_reservation_iops")
    parser.add_argument("--a-limit", type=int, default=10000, help="A's qos_iops in the limited condition")
    parser.add_argument("--osd-set", action="append", default=[], help="KEY=VALUE for every OSD")
    parser.add_argument("--smoke", action="store_true",
                        help="CI: one round of 1 s, three conditions (checks the script works, not the figure)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.seconds = 1, 1
    os.environ["DUPLEX_CONF"] = os.path.join(args.dir, "client.toml")
    up = ["dev", "up", "--dir", args.dir, "--osds", "3", "--osd-size", "4G"]
    for setting in args.osd_set:
        up += ["--osd-set", setting]
    duplex(*up)
    try:
        for image in ("a", "b", "c"):
            duplex("image", "create", image, "--size", "1G")
        r = args.reservation
        conditions = [
            ("B alone, scheduler off", False, []),
            ("B beside A, scheduler off", True, []),
            # A setting on an idle image turns the OSDs' scheduler on;
            # A and B are then equals (weight 1, no reservation).
            ("B beside A, scheduler on, A and B equal", True, [("c", "qos_weight=2")]),
            (f"B beside A, B reserved {r} IOPS", True, [("b", f"qos_reservation_iops={r}")]),
            (f"B beside A, B reserved {r} IOPS, weight 10", True,
             [("b", f"qos_reservation_iops={r}"), ("b", "qos_weight=10")]),
            # What does hold B's latency on a machine whose CPUs A fills: a
            # limit on A (kept by A's gateway).
            (f"B beside A, A limited to {args.a_limit} IOPS", True, [("a", f"qos_iops={args.a_limit}")]),
            (f"B alone, B reserved {r} IOPS, weight 10", False,
             [("b", f"qos_reservation_iops={r}"), ("b", "qos_weight=10")]),
        ]
        if args.smoke:
            conditions = [conditions[0], conditions[3], conditions[5]]
        results = {name: [] for name, _, _ in conditions}
        for round_ in range(args.rounds):
            for name, noisy, settings in conditions:
                apply(settings)
                b, a = run_phase(args.seconds, noisy)
                results[name].append((b, a))
                lat = b["latency_us"]
                print(f"round {round_ + 1}: {name}: B {b['iops']:.0f} IOPS p50 {lat['p50']} p99 {lat['p99']} "
                      f"p99.9 {lat['p999']} µs; A {a['iops']:.0f} IOPS" if a else
                      f"round {round_ + 1}: {name}: B {b['iops']:.0f} IOPS p50 {lat['p50']} p99 {lat['p99']} "
                      f"p99.9 {lat['p999']} µs", flush=True)
        print(f"\nmedians over {args.rounds} rounds of {args.seconds} s")
        print(f"{'condition':<46} {'B IOPS':>7} {'B p50 µs':>9} {'B p99 µs':>9} {'B p99.9':>8} {'A IOPS':>7}")
        for name, _, _ in conditions:
            runs = results[name]
            b_of = lambda key: median([b["latency_us"][key] for b, _ in runs])
            a_iops = f"{median([a['iops'] for _, a in runs]):.0f}" if runs[0][1] else "-"
            print(f"{name:<46} {median([b['iops'] for b, _ in runs]):>7.0f} {b_of('p50'):>9} {b_of('p99'):>9} "
                  f"{b_of('p999'):>8} {a_iops:>7}")
    finally:
        duplex("dev", "down", "--dir", args.dir, "--wipe")


if __name__ == "__main__":
    main()
