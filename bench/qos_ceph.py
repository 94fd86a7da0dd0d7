#!/usr/bin/env python3
"""Ceph's side of issue 31's figures (docs/BENCHMARKS.md), on a throwaway
Ceph 16.2 cluster on loopback (bench/duplexbench/ceph.py: tcmalloc, BlueStore
on zero-filled files, rbd_cache off), measured with fio's rbd engine:

- `limits`: librbd's image QoS (`rbd_qos_iops_limit`, Ceph's equivalent of
  `duplex image set qos_iops=`) under 4 KiB random writes at QD32: the IOPS
  achieved over the run, and the busiest second against the limit and its
  burst allowance (`rbd_qos_iops_burst_seconds`).
- `recovery`: recovery under load, as bench/recovery_load.py measures
  Duplex: 3 OSDs (size 2), a 2 GiB image filled, osd.0 marked out and its
  PGs moved to the others; then 4 KiB random writes at half the measured
  capacity (fio's `rate_iops`, 256 in flight) while `ceph osd in 0`
  backfills osd.0's share back. Client p50/p99 from every I/O's latency,
  steady before and during the backfill, and the backfill's time, for each
  OSD op queue: `wpq` (Pacific's default, with its recovery sleeps) and
  `mclock_scheduler` with the `high_client_ops` (its default) and
  `high_recovery_ops` profiles.

Needs root and Ceph's packages (it installs them with apt-get when missing).
Stops exactly the daemons it started and removes its directory, also on
failure.

    bench/qos_ceph.py                 # both parts (~15 min)
    bench/qos_ceph.py --part limits
    bench/qos_ceph.py --part recovery --queue wpq
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from duplexbench import log  # noqa: E402
from duplexbench.ceph import CephCluster, missing_packages  # noqa: E402

QUEUES = {
    "wpq": {"osd_op_queue": "wpq"},
    "mclock high_client_ops": {"osd_op_queue": "mclock_scheduler", "osd_mclock_profile": "high_client_ops"},
    "mclock high_recovery_ops": {"osd_op_queue": "mclock_scheduler", "osd_mclock_profile": "high_recovery_ops"},
}


def ensure_ceph():
    missing = missing_packages()
    if missing:
        log(f"installing {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", *missing], check=True, env=env, stdout=subprocess.DEVNULL)
    if shutil.which("fio") is None:
        subprocess.run(["apt-get", "install", "-y", "fio"], check=True, stdout=subprocess.DEVNULL)


def fio_command(ceph, name, *args):
    """fio's rbd engine against the cluster's image, JSON out."""
    return ["fio", f"--name={name}", "--ioengine=rbd", "--clientname=admin", f"--pool={ceph.pool}",
            f"--rbdname={ceph.image}", "--direct=1", "--output-format=json", *args]


def fio(ceph, name, *args, out_dir, timeout=600):
    """Runs fio_command; its JSON result."""
    out = subprocess.run(fio_command(ceph, name, *args), check=True, capture_output=True, text=True, env=ceph.env(),
                         cwd=out_dir,
                         timeout=timeout).stdout
    return json.loads(out[out.index("{"):])


def percentile(values, q):
    if not values:
        return 0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def read_log(path):
    """fio's per-I/O log: (unix ms, value) pairs."""
    rows = []
    with open(path) as f:
        for line in f:
            fields = line.split(",")
            if len(fields) >= 2:
                rows.append((int(fields[0]), int(fields[1])))
    return rows


def limits(args, out_dir):
    ceph = CephCluster(out_dir, osds=2, osd_size_gib=4, image_size_gib=1)
    rows = []
    try:
        ceph.up()
        fio(ceph, "fill", "--rw=write", "--bs=1m", "--iodepth=8", "--size=1g", out_dir=out_dir)
        # Unlimited first (0), then each limit with a burst of 1 s, as Duplex's figure has.
        for limit, burst_s in [(0, 0)] + [(rate, 1) for rate in args.limits]:
            image = f"{ceph.pool}/{ceph.image}"
            ceph.run("rbd", "config", "image", "set", image, "rbd_qos_iops_limit", str(limit))
            ceph.run("rbd", "config", "image", "set", image, "rbd_qos_iops_burst_seconds", str(max(burst_s, 1)))
            prefix = f"iops-{limit}"
            result = fio(ceph, prefix, "--rw=randwrite", "--bs=4k", "--iodepth=32", "--time_based",
                         f"--runtime={args.seconds}", "--size=1g", f"--write_iops_log={prefix}", "--log_avg_msec=1000",
                         out_dir=out_dir)
            job = result["jobs"][0]["write"]
            seconds = [v for _, v in read_log(os.path.join(out_dir, f"{prefix}_iops.1.log"))]
            rows.append({"limit": limit, "burst_s": burst_s, "iops": job["iops"], "ios": job["total_ios"],
                         "busiest_second": max(seconds) if seconds else 0,
                         "p50_us": job["clat_ns"]["percentile"]["50.000000"] / 1000})
            r = rows[-1]
            print(f"limit {limit or 'none':>6} burst {burst_s} s: {r['iops']:8.0f} IOPS over {args.seconds} s "
                  f"({r['ios']} I/Os), busiest second {r['busiest_second']}, p50 {r['p50_us']:.0f} µs", flush=True)
        rows.append({"version": ceph.version()})
    finally:
        ceph.down()
    return rows


def wait_clean(ceph, timeout_s=1800):
    """After a change that moves PGs: waits until the PG map shows it (the
    manager's map lags the OSDs' by up to its stats period), then until every
    PG is active+clean again; returns when (time.time()). Polls once a second:
    each `ceph` call costs CPU the load shares."""
    start = time.time()
    while ceph._pgs_clean():
        if time.time() - start > 60:
            raise RuntimeError("no PG left active+clean within 60 s of the change")
        time.sleep(1)
    while time.time() - start < timeout_s:
        if ceph._pgs_clean():
            return time.time()
        time.sleep(1)
    raise RuntimeError(f"Ceph's PGs not clean after {timeout_s} s")


def recovery(args, out_dir, queue):
    # The manager's PG map every second, not 5: the backfill's end is seen sooner.
    conf = {**QUEUES[queue], "mgr_stats_period": 1}
    ceph = CephCluster(out_dir, osds=3, osd_size_gib=4, image_size_gib=args.image_gib, extra_conf=conf)
    try:
        ceph.up()
        size = f"{args.image_gib}g"
        fio(ceph, "fill", "--rw=write", "--bs=4m", "--iodepth=8", f"--size={size}", out_dir=out_dir)
        capacity = fio(ceph, "capacity", "--rw=randwrite", "--bs=4k", "--iodepth=32", "--time_based",
                       f"--runtime={args.capacity_seconds}", f"--size={size}", out_dir=out_dir)["jobs"][0]["write"]["iops"]
        ceph.ceph("osd", "out", "0")
        wait_clean(ceph)
        rate = int(capacity * args.load)
        prefix = "load"
        command = fio_command(ceph, prefix, "--rw=randwrite", "--bs=4k", "--iodepth=256", f"--rate_iops={rate}",
                              "--time_based", f"--runtime={args.max_seconds}", f"--size={size}",
                              f"--write_lat_log={prefix}", "--log_avg_msec=0", "--log_unix_epoch=1")
        load = subprocess.Popen(command, env=ceph.env(), cwd=out_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        output = {}
        reader = threading.Thread(target=lambda: output.update(out=load.communicate()), daemon=True)
        reader.start()
        steady_start = time.time()
        time.sleep(args.steady_seconds)
        marked = time.time()
        ceph.ceph("osd", "in", "0")
        clean = wait_clean(ceph)
        time.sleep(args.after_seconds)
        load.send_signal(2)  # fio ends its jobs and writes its logs on SIGINT
        reader.join(timeout=120)
        if load.returncode is None:
            load.kill()
            raise RuntimeError("fio did not stop")
        lat = read_log(os.path.join(out_dir, f"{prefix}_lat.1.log"))
        first = lat[0][0] if lat else 0
        steady = [v / 1000 for t, v in lat if max(steady_start * 1000 + 2000, first + 2000) <= t <= marked * 1000]
        during = [v / 1000 for t, v in lat if marked * 1000 <= t <= clean * 1000]
        steady_s = (marked - max(steady_start + 2, first / 1000 + 2))
        return {
            "queue": queue,
            "capacity": capacity,
            "rate": rate,
            "steady": (percentile(steady, 0.5), percentile(steady, 0.99), len(steady) / max(steady_s, 1)),
            "during": (percentile(during, 0.5), percentile(during, 0.99), len(during) / max(clean - marked, 1)),
            "recovery_s": clean - marked,
            "version": ceph.version(),
        }
    finally:
        ceph.down()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/duplex-qos-ceph")
    parser.add_argument("--part", choices=["limits", "recovery", "both"], default="both")
    parser.add_argument("--seconds", type=int, default=10, help="each limit's run")
    parser.add_argument("--limits", type=int, nargs="*", default=[500, 1000, 2000])
    parser.add_argument("--queue", action="append", choices=sorted(QUEUES), default=None)
    parser.add_argument("--image-gib", type=int, default=2)
    parser.add_argument("--capacity-seconds", type=int, default=10)
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--steady-seconds", type=int, default=15)
    parser.add_argument("--after-seconds", type=int, default=3)
    parser.add_argument("--max-seconds", type=int, default=1800)
    args = parser.parse_args()
    ensure_ceph()
    os.makedirs(args.dir, exist_ok=True)
    if args.part in ("limits", "both"):
        limits(args, args.dir)
    if args.part in ("recovery", "both"):
        print(f"{'op queue':<26} {'capacity':>8} {'rate':>6} {'steady p50/p99 µs':>18} {'during p50/p99 µs':>18} "
              f"{'during IOPS':>11} {'p99 x':>6} {'recovery s':>10}", flush=True)
        for queue in args.queue or list(QUEUES):
            r = recovery(args, args.dir, queue)
            ratio = r["during"][1] / max(r["steady"][1], 1)
            print(f"{r['queue']:<26} {r['capacity']:>8.0f} {r['rate']:>6} "
                  f"{r['steady'][0]:>8.0f}/{r['steady'][1]:<9.0f} {r['during'][0]:>8.0f}/{r['during'][1]:<9.0f} "
                  f"{r['during'][2]:>11.0f} {ratio:>6.2f} {r['recovery_s']:>10.1f}", flush=True)
        print(r["version"])


if __name__ == "__main__":
    main()
