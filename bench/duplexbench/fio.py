"""Running fio: one engine section plus one workload file, combined into
the job file that is kept beside the results; parsing its JSON output."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

FIO_DIR = Path(__file__).resolve().parent.parent / "fio"
PERCENTILES = {"p50": "50.000000", "p95": "95.000000", "p99": "99.000000", "p999": "99.900000"}


def job_text(engine, workload):
    """The job file: bench/fio/engine-<engine>.fio then bench/fio/<workload>.fio."""
    parts = [(FIO_DIR / f"engine-{engine}.fio").read_text(), (FIO_DIR / f"{workload}.fio").read_text()]
    return "\n".join(parts)


def run(engine, workload, out_dir, name, env, timeout):
    """Runs one fio job; returns (parsed JSON, the CPU seconds of fio and
    every process it forked). Raises on a fio error."""
    out_dir.mkdir(parents=True, exist_ok=True)
    job = out_dir / f"{name}.fio"
    job.write_text(job_text(engine, workload))
    output = out_dir / f"{name}.json"
    with open(out_dir / f"{name}.log", "w") as log:
        child = subprocess.Popen(
            ["fio", "--output-format=json", f"--output={output}", str(job)],
            env={**os.environ, **{k: str(v) for k, v in env.items()}},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        # wait4's rusage covers fio and the job processes it reaped: the whole
        # client side of librbd (for Ceph) or of the NBD connection (Duplex).
        _, status, usage = _wait4(child.pid, timeout)
    except BaseException:
        child.kill()
        child.wait()
        raise
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"fio {name} failed ({child.returncode}); see {out_dir / (name + '.log')}")
    data = json.loads(_strip_notes(output.read_text()))
    return data, usage.ru_utime + usage.ru_stime


def _wait4(pid, timeout):
    deadline = time.monotonic() + timeout
    while True:
        pid_done, status, usage = os.wait4(pid, os.WNOHANG)
        if pid_done == pid:
            return pid_done, status, usage
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.wait4(pid, 0)
            raise TimeoutError(f"fio ran past its {timeout} s bound")
        time.sleep(0.05)


def _strip_notes(text):
    """fio may print notes before the JSON document (e.g. about rate limits)."""
    return text[text.index("{") :]


def summarize(data):
    """Per direction: I/Os, IOPS, bandwidth and completion latency (µs).
    With group_reporting, jobs[0] is the whole group."""
    job = data["jobs"][0]
    if job.get("error"):
        raise RuntimeError(f"fio reported error {job['error']}")
    out = {}
    for direction in ("read", "write"):
        d = job[direction]
        if d["total_ios"] == 0:
            continue
        clat = d["clat_ns"]
        pct = clat.get("percentile", {})
        out[direction] = {
            "ios": d["total_ios"],
            "iops": d["iops"],
            "bytes": d["io_bytes"],
            "mib_s": d["bw_bytes"] / 2**20,
            "lat_us": {
                "mean": clat["mean"] / 1000,
                **{k: pct[v] / 1000 for k, v in PERCENTILES.items() if v in pct},
            },
        }
    if not out:
        raise RuntimeError("fio did no I/O")
    return out
