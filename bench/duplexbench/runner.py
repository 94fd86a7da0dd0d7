"""Runs one measured job against one system: samples the kernel's counters
around fio (or the native tool) and derives the per-I/O figures."""

import resource
import time

from . import fio, log
from .procs import Sampler, device_of

REPLICAS = 2


class Runner:
    def __init__(self, plan, out_dir):
        self.plan = plan
        self.out_dir = out_dir
        self.records = []

    def _sampler(self, system):
        return Sampler(
            groups={"server": system.server_pids(), "gateway": system.gateway_pids(), "other": system.other_pids()},
            device=device_of(system.data_path()),
        )

    def fio(self, system, workload, phase, round_=0, settings=None, runtime=None):
        runtime = runtime or self.plan.runtime
        name = f"{phase}-{workload}-{system.name}-r{round_}"
        if settings:
            name += "-" + "-".join(f"{v}" for v in settings.values())
        per_job_rate = self.plan.mix_rate_iops // 2  # the mix job file runs 2 jobs
        env = {
            **system.fio_env(),
            "RUNTIME": runtime,
            "RATE_READ_IOPS": per_job_rate // 5,
            "RATE_WRITE_IOPS": per_job_rate - per_job_rate // 5,
        }
        time.sleep(self.plan.settle)
        sampler = self._sampler(system)
        sampler.begin()
        data, fio_cpu = fio.run(system.engine, workload, self.out_dir / "raw", name, env, timeout=runtime * 20 + 600)
        counters = sampler.end()
        record = {
            "phase": phase,
            "system": system.name,
            "workload": workload,
            "round": round_,
            "settings": dict(settings or {}),
            "io": fio.summarize(data),
            "client_tool_cpu_s": fio_cpu,
            **counters,
        }
        derive(record)
        self.records.append(record)
        log(f"{name}: {describe(record)}")
        return record

    def native(self, system, pattern, round_, expected_iops):
        name = f"native-{pattern}-{system.name}-r{round_}"
        time.sleep(self.plan.settle)
        sampler = self._sampler(system)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        sampler.begin()
        (self.out_dir / "raw").mkdir(parents=True, exist_ok=True)
        result = system.native_bench(pattern, self.plan.native_seconds, expected_iops, self.out_dir / "raw", name)
        counters = sampler.end()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        tool_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        direction = "write" if "write" in pattern else "read"
        record = {
            "phase": "native",
            "system": system.name,
            "workload": pattern,
            "round": round_,
            "settings": {},
            "command": result["command"],
            "io": {direction: {"ios": result["ios"], "iops": result["iops"], "bytes": result["ios"] * 4096}},
            "client_tool_cpu_s": tool_cpu,
            **counters,
        }
        derive(record)
        self.records.append(record)
        log(f"{name}: {describe(record)}")
        return record


def derive(record):
    """Per-I/O CPU and write amplification from the raw counters."""
    ios = sum(d["ios"] for d in record["io"].values())
    record["ios"] = ios
    record["iops"] = sum(d["iops"] for d in record["io"].values())
    cpu = record["cpu_s"]
    record["server_cpu_us_per_io"] = cpu["server"] * 1e6 / ios
    # The client side: fio with librbd (Ceph), or fio plus the NBD gateway
    # process that holds Duplex's client library (Duplex).
    record["client_cpu_us_per_io"] = (record["client_tool_cpu_s"] + cpu["gateway"]) * 1e6 / ios
    record["machine_cpu_us_per_io"] = record["machine_busy_s"] * 1e6 / ios
    user = record["io"].get("write", {}).get("bytes", 0)
    if user:
        record["waf_daemons"] = record["written_bytes"]["server"] / (user * REPLICAS)
        record["waf_device"] = record["device_written_bytes"] / (user * REPLICAS)


def describe(record):
    parts = [f"{record['iops']:,.0f} IOPS"]
    for direction, d in record["io"].items():
        lat = d.get("lat_us")
        if lat:
            parts.append(f"{direction} p50 {lat.get('p50', 0):,.0f} µs p99 {lat.get('p99', 0):,.0f} µs")
    parts.append(f"server {record['server_cpu_us_per_io']:,.1f} µs/IO")
    if "waf_daemons" in record:
        parts.append(f"WAF {record['waf_daemons']:.2f}")
    return ", ".join(parts)
