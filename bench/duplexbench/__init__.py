"""Duplex's benchmark suite: the same fio jobs against Duplex and Ceph on
one machine, with the storage daemons' CPU time and written bytes sampled
around every run. See docs/BENCHMARKS.md."""

import sys
import time

_STARTED = time.monotonic()


def log(message):
    """Progress on stderr, stamped with the seconds since the suite began."""
    print(f"[{time.monotonic() - _STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)
