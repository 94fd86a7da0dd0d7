"""bench/run: Duplex and Ceph side by side on this machine.

    bench/run                 # the full suite (installs Ceph and fio if missing; ~25 min)
    bench/run --smoke         # seconds-long runs, Duplex only (CI)
    bench/run --publish       # also write the report into docs/BENCHMARKS.md and docs/bench/
    bench/run --stop          # clean up after an interrupted run
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import log, plots, report
from .ceph import CephCluster, missing_packages
from .duplex import DuplexCluster
from .plan import COMPARED, Plan
from .runner import Runner

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS_BEGIN = "<!-- bench-suite:begin (written by bench/run --publish) -->"
DOCS_END = "<!-- bench-suite:end -->"


def parse_args():
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny runs of every phase, no Ceph: checks the suite works")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each compared workload")
    p.add_argument("--runtime", type=int, default=15, help="seconds per fio run")
    p.add_argument("--no-ceph", action="store_true", help="Duplex only")
    p.add_argument("--no-sweeps", action="store_true", help="skip the Duplex-only ablation and sweeps")
    p.add_argument("--work-dir", default="/tmp/duplexbench",
                   help="where both clusters keep their files (one disk for both)")
    p.add_argument("--out", help="results directory (default bench/results/<time>, or target/bench-smoke)")
    p.add_argument("--profile", choices=["release", "debug"], help="the duplex build (default: release; debug for --smoke)")
    p.add_argument("--publish", action="store_true", help="write the report into docs/BENCHMARKS.md and docs/bench/")
    p.add_argument("--stop", action="store_true", help="stop the clusters of an interrupted run and exit")
    return p.parse_args()


def ensure_tools(with_ceph):
    """fio (with its rbd and nbd engines), Ceph's daemons and matplotlib."""
    missing = [] if shutil.which("fio") else ["fio"]
    if with_ceph:
        missing += missing_packages()
    if missing:
        if os.geteuid() != 0:
            sys.exit(f"need {' '.join(missing)}: run as root, or apt-get install -y {' '.join(missing)}")
        log(f"installing {' '.join(missing)}")
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *sorted(set(missing))], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        log("installing matplotlib")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--root-user-action=ignore", "matplotlib"],
                       check=True)


def build(profile):
    args = ["cargo", "build", "-q", "-p", "duplex-cli", "--bin", "duplex"]
    if profile == "release":
        args.append("--release")
    log(f"building duplex ({profile})")
    subprocess.run(args, cwd=ROOT, check=True)
    return ROOT / "target" / profile / "duplex"


def environment(args, plan, systems):
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    mem_kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    fio_version = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    env = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": f"{os.cpu_count()} vCPUs ({cpu}), {mem_kib / 2**20:.0f} GiB RAM, Linux {platform.release()}",
        "command": "bench/run " + " ".join(sys.argv[1:]),
        "commit": commit or "?",
        "fio_version": fio_version,
        "plan": f"{plan.rounds} rounds × {plan.runtime} s per run, {plan.osds} OSDs × {plan.osd_size_gib} GiB, "
                f"image {plan.image_size_gib} GiB, {plan.pg_num} PGs, replication 2",
    }
    for system in systems:
        env[f"{system.name}_version"] = system.version()
    return env


def thread_breakdown(records):
    """µs per I/O by server thread class, for the median randwrite-4k round."""
    out = {}
    for system in ("ceph", "duplex"):
        rs = [r for r in records if r["phase"] == "compare" and r["workload"] == "randwrite-4k" and r["system"] == system]
        if not rs:
            continue
        rs.sort(key=lambda r: r["iops"])
        mid = rs[len(rs) // 2]
        out[system] = {k: v * 1e6 / mid["ios"] for k, v in mid["server_threads_cpu_s"].items()}
    return out


def run_suite(args, plan, out_dir):
    profile = args.profile or ("debug" if plan.smoke else "release")
    binary = build(profile)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    size = f"{int(plan.image_size_gib * 1024)}M"
    duplex = DuplexCluster(binary, work, osds=plan.osds, osd_size=f"{plan.osd_size_gib}G", image_size=size,
                           pg_num=plan.pg_num)
    ceph = CephCluster(work, osds=plan.osds, osd_size_gib=plan.osd_size_gib, image_size_gib=plan.image_size_gib,
                       pg_num=plan.pg_num) if plan.with_ceph else None
    systems = [s for s in (ceph, duplex) if s]
    runner = Runner(plan, out_dir)
    started = time.monotonic()
    setup = {}
    try:
        for system in systems:
            setup[system.name] = system.up()
        env = environment(args, plan, systems)
        for system in systems:
            runner.fio(system, "prefill", "prefill")
        for round_ in range(plan.rounds):
            # Alternate who goes first, so neither always runs on a warmer machine.
            order = systems if round_ % 2 == 0 else systems[::-1]
            for workload in COMPARED:
                for system in order:
                    runner.fio(system, workload, "compare", round_)
            for system in order:
                fio_iops = [r["iops"] for r in runner.records if r["system"] == system.name
                            and r["workload"] == "randwrite-4k" and r["phase"] == "compare"]
                runner.native(system, "randwrite", round_, statistics.median(fio_iops))
            if plan.ideal:
                # The limit, in the same round and with Ceph up (idle), as the compared runs.
                duplex.reconfigure({"write_path": "ideal"})
                for workload in plan.ideal:
                    runner.fio(duplex, workload, "ideal", round_)
                duplex.reconfigure({"write_path": "oplog"})
        if ceph:
            ceph.down()  # the sweeps are Duplex-only: give them the whole machine
        if not args.no_sweeps:
            for settings in plan.ablation:
                duplex.reconfigure(settings)
                runner.fio(duplex, "randwrite-4k", "ablation", settings=settings)
            duplex.reconfigure({"write_path": "oplog", "threading": "prioritized"})
            for threshold in plan.flush_thresholds:
                duplex.reconfigure({"flush_threshold": threshold})
                runner.fio(duplex, "mix-80-20", "flush", settings={"flush_threshold": threshold})
            for partitions in plan.partitions:
                duplex.down()
                duplex.up({"mkfs_partitions": partitions})
                runner.fio(duplex, "prefill", "partitions-prefill", settings={"mkfs_partitions": partitions})
                runner.fio(duplex, "randwrite-4k", "partitions", settings={"mkfs_partitions": partitions})
    finally:
        duplex.down()
        if ceph:
            ceph.down()
    env["wall_minutes"] = (time.monotonic() - started) / 60
    env["setup_seconds"] = setup
    summary = report.summarize(runner.records)
    return {
        "env": env,
        "plan": plan.__dict__,
        "workloads": COMPARED,
        "records": runner.records,
        "summary": summary,
        "threads": thread_breakdown(runner.records),
    }


def check_smoke(result):
    """The smoke run's bar: every phase ran and measured something."""
    phases = {r["phase"] for r in result["records"]}
    for phase in ["prefill", "compare", "native", "ideal", "ablation", "flush", "partitions"]:
        assert phase in phases, f"smoke: no {phase} runs"
    for r in result["records"]:
        assert r["ios"] > 0, f"smoke: {r['phase']} {r['workload']} did no I/O"
        assert r["server_cpu_us_per_io"] > 0, f"smoke: {r['phase']} {r['workload']}: no server CPU sampled"
        ideal = r["phase"] == "ideal" or r["settings"].get("write_path") == "ideal"
        if "write" in r["io"] and r["phase"] != "native" and not ideal:
            assert r["written_bytes"]["server"] > 0 or r["workload"] == "mix-80-20", \
                f"smoke: {r['phase']} {r['workload']}: the OSDs wrote nothing to storage"
    assert result["plots"], "smoke: no plots"


def publish(result, out_dir, text):
    docs = ROOT / "docs"
    (docs / "bench").mkdir(exist_ok=True)
    for name in result["plots"]:
        shutil.copy(out_dir / name, docs / "bench" / name)
    slim = {k: v for k, v in result.items() if k != "records"}
    (docs / "bench" / "results.json").write_text(json.dumps(slim, indent=1))
    path = docs / "BENCHMARKS.md"
    content = path.read_text()
    if DOCS_BEGIN not in content:
        raise SystemExit(f"{path} has no '{DOCS_BEGIN}' marker")
    head, rest = content.split(DOCS_BEGIN, 1)
    _, tail = rest.split(DOCS_END, 1)
    path.write_text(f"{head}{DOCS_BEGIN}\n{text}\n{DOCS_END}{tail}")
    log(f"published into {path} and {docs / 'bench'}")


def main():
    args = parse_args()
    if args.stop:
        work = Path(args.work_dir)
        CephCluster(work).down()
        state = work / "duplex" / "state.json"
        if state.exists():
            DuplexCluster(ROOT / "target" / "release" / "duplex", work).down()
        return
    plan = Plan.smoke_plan() if args.smoke else Plan.full(rounds=args.rounds, runtime=args.runtime)
    if args.no_ceph:
        plan.with_ceph = False
    default_out = ROOT / "target" / "bench-smoke" if args.smoke else \
        ROOT / "bench" / "results" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out) if args.out else default_out
    if out_dir.exists() and args.smoke:
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # A Ctrl-C or kill ends the run through the finally blocks, which stop the clusters.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ensure_tools(plan.with_ceph)
    result = run_suite(args, plan, out_dir)
    result["plots"] = plots.draw(result, out_dir)
    text = report.markdown(result)
    (out_dir / "results.json").write_text(json.dumps(result, indent=1))
    (out_dir / "report.md").write_text(text + "\n")
    print(text)
    log(f"results in {out_dir}")
    if args.smoke:
        check_smoke(result)
        log("smoke run passed")
    if args.publish:
        publish(result, out_dir, text)


if __name__ == "__main__":
    main()
