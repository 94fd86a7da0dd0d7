#!/usr/bin/env python3
"""Time to re-replicate: a local cluster of 3 OSDs (size 2), a 2 GiB image
filled by sequential writes, then `duplex mark out 0` and `duplex mark in 0`,
each timed until every PG is active+clean again (docs/RELIABILITY.md,
"Time to re-replicate"). Uses a release build of `duplex`; stops and wipes
its cluster at the end, also on failure.

    cargo build --release -p duplex-cli && bench/rereplicate.py [--dir /tmp/rerep]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# $DUPLEX_BIN: another build to compare (a copy of target/release/duplex).
DUPLEX = os.environ.get("DUPLEX_BIN") or os.path.join(ROOT, "target", "release", "duplex")


def duplex(*args, capture=False):
    result = subprocess.run([DUPLEX, *args], check=True, capture_output=capture, text=True)
    return result.stdout


def status():
    return json.loads(duplex("status", "--json", capture=True))


def backfill_sent(directory):
    """Bytes the OSDs' finished backfills sent, from their logs ("backfill
    complete ... bytes=N")."""
    total = 0
    for name in os.listdir(directory):
        if name.startswith("osd.") and name.endswith(".log"):
            with open(os.path.join(directory, name), errors="replace") as log:
                for line in log:
                    if "backfill complete" in line:
                        total += sum(int(f[6:]) for f in line.split() if f.startswith("bytes=") and f[6:].isdigit())
    return total


def settle_after(command, timeout_s=600):
    """Runs `duplex mark COMMAND 0`; returns (seconds until every PG is
    active+clean after some were seen backfilling, used bytes before, after)."""
    before = status()
    start = time.time()
    duplex("mark", command, "0")
    seen = False
    while time.time() - start < timeout_s:
        pgs = status()["pgs"]
        if any("backfilling" in state for state in pgs):
            seen = True
        elif seen and all(state == "active+clean" for state in pgs):
            return time.time() - start, before["used_bytes"], status()["used_bytes"]
        time.sleep(0.25)
    sys.exit(f"mark {command}: PGs not clean after {timeout_s} s (backfilling seen: {seen})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/duplex-rereplicate")
    parser.add_argument("--image-gib", type=int, default=2)
    parser.add_argument("--fill-seconds", type=int, default=12)
    args = parser.parse_args()
    os.environ["DUPLEX_CONF"] = os.path.join(args.dir, "client.toml")
    duplex("dev", "up", "--dir", args.dir, "--osds", "3", "--osd-size", "4G")
    try:
        duplex("image", "create", "disk", "--size", f"{args.image_gib}G")
        duplex("bench", "--image", "disk", "--pattern", "seqwrite", "--bs", "4M", "--qd", "8",
               "--seconds", str(args.fill_seconds))
        for command in ("out", "in"):
            sent_before = backfill_sent(args.dir)
            seconds, used_before, used_after = settle_after(command)
            sent = backfill_sent(args.dir) - sent_before
            print(f"mark {command} osd.0: every PG active+clean after {seconds:.1f} s; "
                  f"used {used_before / 2**30:.2f} -> {used_after / 2**30:.2f} GiB; "
                  f"backfill sent {sent / 2**30:.2f} GiB ({sent / 2**20 / seconds:.0f} MiB/s)")
    finally:
        duplex("dev", "down", "--dir", args.dir, "--wipe")


if __name__ == "__main__":
    main()
