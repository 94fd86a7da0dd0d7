"""A throwaway Ceph cluster on loopback, the same shape as the Duplex one:
1 monitor, 1 manager, N BlueStore OSDs on zero-filled files, pool `rbd`
(size 2, min_size 1), one image. Daemons run in the foreground in their own
sessions; we record their pids and stop exactly those.

The tuning follows the known-good Ceph 16.2 baseline for these 2-core
machines: Debian's libtcmalloc preloaded (Debian builds Ceph without it,
upstream links it), zero-filled block files, debug logging off in the data
path, auth off and msgr in crc mode, rbd_cache off, image feature
`layering` only (no exclusive-lock ping-pong between fio's jobs)."""

import glob
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

from . import log

MARKER = ".duplexbench-ceph"
# The commands the suite runs, and the Debian package of each.
BINARIES = {"ceph-mon": "ceph-mon", "ceph-osd": "ceph-osd", "ceph-mgr": "ceph-mgr", "ceph": "ceph-common",
            "rbd": "ceph-common", "monmaptool": "ceph-base"}


def missing_packages():
    """The Debian packages to install before a Ceph cluster can start."""
    missing = {package for binary, package in BINARIES.items() if shutil.which(binary) is None}
    try:
        tcmalloc()
    except RuntimeError:
        missing.add("libgoogle-perftools4")
    return sorted(missing)


def tcmalloc():
    for pattern in ["/usr/lib/*/libtcmalloc.so.4", "/usr/lib/*/libtcmalloc_minimal.so.4"]:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    raise RuntimeError("libtcmalloc not found (apt-get install libgoogle-perftools4)")


class CephCluster:
    name = "ceph"
    engine = "rbd"

    def __init__(self, work_dir, osds=2, osd_size_gib=8, image_size_gib=4, pg_num=32, mon_port=43300, ports=(43400, 43499),
                 extra_conf=None):
        self.dir = Path(work_dir) / "ceph"
        # Extra `[global]` settings (name -> value), e.g. the OSDs' op queue.
        self.extra_conf = dict(extra_conf or {})
        self.osds = osds
        self.osd_size_gib = osd_size_gib
        self.image_size_gib = image_size_gib
        self.pg_num = pg_num
        self.mon_port = mon_port
        self.ports = ports
        self.conf = self.dir / "ceph.conf"
        self.pool, self.image = "rbd", "bench"
        self.procs = []  # (name, binary, pid)

    # ------------------------------------------------------------ commands
    def env(self):
        return {**os.environ, "CEPH_CONF": str(self.conf)}

    def ceph(self, *args, timeout=60):
        return subprocess.run(
            ["ceph", "--connect-timeout", "20", *args],
            env=self.env(), capture_output=True, text=True, timeout=timeout, check=True,
        ).stdout

    def run(self, *args, timeout=120):
        with open(self.dir / "log" / "commands.out", "a") as log:
            subprocess.run(args, env=self.env(), check=True, timeout=timeout, stdout=subprocess.DEVNULL, stderr=log)

    # ------------------------------------------------------------ daemons
    def _start(self, name, binary, *args):
        preload = tcmalloc()
        env = {**self.env(), "LD_PRELOAD": preload, "TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES": "134217728"}
        with open(self.dir / "log" / f"{name}.out", "a") as out:
            child = subprocess.Popen([binary, "-f", *args], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, binary, child.pid))
        (self.dir / "pids.json").write_text(json.dumps(self.procs))
        time.sleep(0.5)
        if _comm(child.pid) != binary:
            raise RuntimeError(f"{name} did not start; see {self.dir / 'log'}")
        log(f"ceph: started {name} (pid {child.pid})")

    def pids(self, kind):
        return [pid for name, _, pid in self.procs if name.startswith(kind + ".")]

    def server_pids(self):
        return self.pids("osd")

    def other_pids(self):
        return self.pids("mon") + self.pids("mgr")

    def gateway_pids(self):
        return []  # librbd runs inside fio

    def data_path(self):
        return self.dir

    # ------------------------------------------------------------ lifecycle
    def up(self):
        missing = missing_packages()
        if missing:
            raise RuntimeError(f"Ceph is not installed: apt-get install -y {' '.join(missing)}")
        if self.dir.exists():
            raise RuntimeError(f"{self.dir} exists: a previous run did not clean up (bench/run --stop)")
        started = time.monotonic()
        for sub in ["run", "log", "crash"]:
            (self.dir / sub).mkdir(parents=True)
        (self.dir / MARKER).touch()
        fsid = str(uuid.uuid4())
        self.conf.write_text(self._conf(fsid))
        (self.dir / "keyring").touch()
        self.run("monmaptool", "--create", "--fsid", fsid, "--addv", "a", f"[v2:127.0.0.1:{self.mon_port}]",
                 str(self.dir / "monmap"))
        self.run("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(self.dir / "monmap"), "-c", str(self.conf))
        self._start("mon.a", "ceph-mon", "-i", "a", "-c", str(self.conf))
        _wait(60, "the Ceph monitor", lambda: self.ceph("mon", "stat"))
        (self.dir / "mgr.x").mkdir()
        self._start("mgr.x", "ceph-mgr", "-i", "x", "-c", str(self.conf))
        for i in range(self.osds):
            osd_uuid = str(uuid.uuid4())
            got = self.ceph("osd", "new", osd_uuid).strip()
            if got != str(i):
                raise RuntimeError(f"expected osd id {i}, got {got!r}")
            (self.dir / f"osd.{i}").mkdir()
            block = self.dir / f"osd.{i}.block"
            log(f"ceph: zero-filling {block} ({self.osd_size_gib} GiB)")
            self.run("dd", "if=/dev/zero", f"of={block}", "bs=4M", f"count={self.osd_size_gib * 256}",
                     "oflag=direct", "status=none", timeout=600)
            self.run("ceph-osd", "-i", str(i), "-c", str(self.conf), "--mkfs", "--osd-uuid", osd_uuid,
                     "--osd-objectstore", "bluestore")
            self._start(f"osd.{i}", "ceph-osd", "-i", str(i), "-c", str(self.conf))
        _wait(120, "the Ceph OSDs up and in", self._osds_up)
        self.ceph("osd", "pool", "create", self.pool, str(self.pg_num), str(self.pg_num), "replicated")
        self.ceph("osd", "pool", "set", self.pool, "size", "2")
        self.ceph("osd", "pool", "set", self.pool, "min_size", "1")
        self.run("rbd", "pool", "init", self.pool)
        _wait(180, "all Ceph PGs active+clean", self._pgs_clean)
        self.run("rbd", "create", "--size", f"{int(self.image_size_gib * 1024)}M", "--image-feature", "layering",
                 f"{self.pool}/{self.image}")
        seconds = time.monotonic() - started
        log(f"ceph: cluster ready in {seconds:.1f} s")
        return seconds

    def _osds_up(self):
        stat = json.loads(self.ceph("osd", "stat", "-f", "json"))
        return stat["num_up_osds"] == self.osds and stat["num_in_osds"] == self.osds

    def _pgs_clean(self):
        stat = json.loads(self.ceph("pg", "stat", "-f", "json"))
        summary = stat.get("pg_summary", stat)
        clean = sum(s["num"] for s in summary["num_pg_by_state"] if s["name"] == "active+clean")
        return summary["num_pgs"] > 0 and clean == summary["num_pgs"]

    def down(self):
        """Stops exactly the daemons we started, then removes the directory."""
        pids_file = self.dir / "pids.json"
        if pids_file.exists():
            self.procs = [tuple(p) for p in json.loads(pids_file.read_text())]
        _stop(self.procs)
        self.procs = []
        if self.dir.exists():
            if not (self.dir / MARKER).exists():
                raise RuntimeError(f"{self.dir} lacks {MARKER}: not ours, not removing it")
            shutil.rmtree(self.dir)
            log(f"ceph: removed {self.dir}")

    # ------------------------------------------------------------ workloads
    def fio_env(self):
        return {"CEPH_CONF": self.conf, "POOL": self.pool, "IMAGE": self.image}

    def native_bench(self, pattern, seconds, expected_iops, out_dir, name):
        """`rbd bench` with 4 KiB I/O at 32 in flight. It stops after a byte
        count, not a time, so the count comes from the IOPS fio measured."""
        io_type = {"randwrite": "write", "randread": "read"}[pattern]
        total = max(int(expected_iops * seconds), 2000) * 4096
        args = ["rbd", "bench", "--io-type", io_type, "--io-size", "4K", "--io-threads", "32",
                "--io-pattern", "rand", "--io-total", str(total), f"{self.pool}/{self.image}"]
        child = subprocess.Popen(args, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = child.communicate(timeout=seconds * 10 + 60)
        (out_dir / f"{name}.log").write_text(" ".join(args) + "\n" + out)
        if child.returncode != 0:
            raise RuntimeError(f"rbd bench failed; see {out_dir / (name + '.log')}")
        # "elapsed: 10   ops: 16384   ops/sec: 1578.26   bytes/sec: 6.2 MiB/s"
        for line in out.splitlines():
            if line.startswith("elapsed:"):
                fields = line.split()
                return {"ios": int(fields[3]), "iops": float(fields[5]), "command": " ".join(args)}
        raise RuntimeError(f"no summary line in rbd bench output; see {out_dir / (name + '.log')}")

    def version(self):
        return subprocess.run(["ceph", "--version"], capture_output=True, text=True).stdout.strip()

    def _conf(self, fsid):
        d = self.dir
        lo, hi = self.ports
        extra = "\n".join(f"{key} = {value}" for key, value in self.extra_conf.items())
        debug = "\n".join(f"debug_{s} = 0/0" for s in [
            "ms", "osd", "bluestore", "bluefs", "bdev", "rocksdb", "objecter", "rados", "rbd", "objectcacher",
            "monc", "auth", "finisher", "journaler", "filestore", "paxos", "mgrc"])
        return f"""[global]
fsid = {fsid}
mon_host = v2:127.0.0.1:{self.mon_port}
mon_initial_members = a
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
public_network = 127.0.0.0/8
ms_bind_msgr1 = false
ms_bind_msgr2 = true
ms_bind_port_min = {lo}
ms_bind_port_max = {hi}
ms_bind_ipv6 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_cluster_mode = crc
ms_service_mode = crc
ms_client_mode = crc
ms_mon_cluster_mode = crc
ms_mon_service_mode = crc
ms_mon_client_mode = crc
run_dir = {d}/run
admin_socket = {d}/run/$cluster-$name.asok
pid_file = {d}/run/$name.pid
log_file = {d}/log/$cluster-$name.log
mon_cluster_log_file = {d}/log/$cluster.log
crash_dir = {d}/crash
keyring = {d}/keyring
mon_data = {d}/mon.$id
osd_data = {d}/osd.$id
mgr_data = {d}/mgr.$id
osd_pool_default_size = 2
osd_pool_default_min_size = 1
osd_pool_default_pg_num = {self.pg_num}
osd_pool_default_pgp_num = {self.pg_num}
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_delete = true
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_max_pg_per_osd = 1000
mon_data_avail_warn = 5
{debug}
debug_mon = 1/5
debug_mgr = 1/5
{extra}

[osd]
osd_objectstore = bluestore
bluestore_block_path = {d}/osd.$id.block
bluestore_block_create = true
bluestore_block_size = {self.osd_size_gib << 30}
bluestore_fsck_on_mkfs = false
osd_memory_target = 1610612736
osd_crush_update_on_start = true

[client]
rbd_cache = false
"""


def _comm(pid):
    """The command name of a live process (None once it is gone or a zombie,
    which is reaped here if it is our child)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    if stat[stat.rindex(")") + 2] in "ZX":
        return None
    return stat[stat.index("(") + 1 : stat.rindex(")")]


def _stop(procs):
    """SIGTERM each (name, binary, pid) still running that binary; SIGKILL
    whatever is left after 15 s."""
    alive = lambda: [(n, b, p) for n, b, p in procs if _comm(p) == b]
    for name, _, pid in alive():
        log(f"stopping {name} (pid {pid})")
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    for name, _, pid in alive():
        log(f"killing {name} (pid {pid})")
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)


def _wait(seconds, what, ready):
    deadline = time.monotonic() + seconds
    while True:
        try:
            if ready() is not False:
                return
        except (subprocess.SubprocessError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(1)
