"""A Duplex cluster of the same shape as the Ceph one, through the `duplex`
command: `dev up` (1 monitor, N OSDs, one store file each, `shm` operation
logs), an image, and `duplex nbd serve` on a unix socket for fio."""

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import log


class DuplexCluster:
    name = "duplex"
    engine = "nbd"

    def __init__(self, binary, work_dir, osds=2, osd_size="8G", image_size="4G", pg_num=32, oplog_pg_bytes="4M"):
        self.binary = str(binary)
        self.dir = Path(work_dir) / "duplex"
        self.osds = osds
        self.osd_size = osd_size
        self.image_size = image_size
        self.pg_num = pg_num
        self.oplog_pg_bytes = oplog_pg_bytes
        self.image = "bench"
        self.socket = Path(work_dir) / "duplex-nbd.sock"
        self.gateway = None
        self.settings = {}

    def duplex(self, *args, timeout=120, capture=False):
        result = subprocess.run(
            [self.binary, "--conf", str(self.dir / "client.toml"), *args],
            capture_output=True, text=True, timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"duplex {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result.stdout

    def _settings_args(self, settings):
        return [a for k, v in settings.items() for a in ("--osd-set", f"{k}={v}")]

    # ------------------------------------------------------------ lifecycle
    def up(self, settings=None):
        """A new cluster; `settings` are OSD flags (e.g. mkfs_partitions=4)."""
        self.settings = dict(settings or {})
        started = time.monotonic()
        self.duplex("dev", "up", "--dir", str(self.dir), "--osds", str(self.osds), "--replicas", "2",
                    "--min-size", "1", "--pg-num", str(self.pg_num), "--osd-size", self.osd_size,
                    "--oplog-pg-bytes", self.oplog_pg_bytes, *self._settings_args(self.settings), timeout=180)
        self.duplex("image", "create", self.image, "--size", self.image_size)
        self._serve()
        seconds = time.monotonic() - started
        log(f"duplex: cluster ready in {seconds:.1f} s ({self.settings or 'defaults'})")
        return seconds

    def reconfigure(self, settings):
        """Restarts the OSDs with `settings` (data and image kept)."""
        self._stop_gateway()
        self.settings.update(settings)
        self.duplex("dev", "restart", "--dir", str(self.dir), *self._settings_args(settings), timeout=180)
        self._serve()
        log(f"duplex: OSDs restarted with {settings}")

    def down(self):
        self._stop_gateway()
        if (self.dir / "state.json").exists():
            self.duplex("dev", "down", "--dir", str(self.dir), "--wipe", timeout=120)

    def _serve(self):
        if self.socket.exists():
            self.socket.unlink()
        with open(self.dir / "nbd.log", "a") as out:
            self.gateway = subprocess.Popen(
                [self.binary, "--conf", str(self.dir / "client.toml"), "nbd", "serve", "--image", self.image,
                 "--socket", str(self.socket)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while True:
            if self.gateway.poll() is not None:
                raise RuntimeError(f"duplex nbd serve exited; see {self.dir / 'nbd.log'}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("duplex nbd serve did not listen within 30 s")
                time.sleep(0.1)

    def _stop_gateway(self):
        if self.gateway and self.gateway.poll() is None:
            self.gateway.send_signal(signal.SIGTERM)
            try:
                self.gateway.wait(10)
            except subprocess.TimeoutExpired:
                self.gateway.kill()
                self.gateway.wait()
        self.gateway = None
        if self.socket.exists():
            self.socket.unlink()

    # ------------------------------------------------------------ processes
    def _state(self):
        return json.loads((self.dir / "state.json").read_text())

    def server_pids(self):
        return [p["pid"] for p in self._state()["processes"] if p["name"].startswith("osd.")]

    def other_pids(self):
        return [p["pid"] for p in self._state()["processes"] if p["name"].startswith("mon.")]

    def gateway_pids(self):
        return [self.gateway.pid] if self.gateway else []

    def data_path(self):
        return self.dir

    # ------------------------------------------------------------ workloads
    def fio_env(self):
        return {"NBD_URI": f"nbd+unix:///{self.image}?socket={self.socket}"}

    def native_bench(self, pattern, seconds, expected_iops, out_dir, name):
        """`duplex bench` on the image: 4 KiB I/O at 32 in flight, for `seconds`."""
        args = ["bench", "--image", self.image, "--pattern", pattern, "--bs", "4k", "--qd", "32",
                "--seconds", str(seconds), "--json"]
        out = self.duplex(*args, timeout=seconds * 10 + 60)
        (out_dir / f"{name}.log").write_text(f"duplex {' '.join(args)}\n{out}")
        result = json.loads(out)
        if result["errors"]:
            raise RuntimeError(f"duplex bench saw {result['errors']} errors: {result['first_error']}")
        return {"ios": result["ops"], "iops": result["iops"], "command": "duplex " + " ".join(args)}

    def version(self):
        return subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout.strip()
