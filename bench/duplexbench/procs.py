"""What the kernel knows about the processes under test: CPU time (per
process and per thread class), bytes written to storage, the machine's busy
time and the disk's written sectors. Sampled before and after each run."""

import os
import re
import time
from dataclasses import dataclass, field

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(path):
    """The fields of a /proc/.../stat file after 'pid (comm)', and comm."""
    with open(path) as f:
        text = f.read()
    close = text.rindex(")")
    comm = text[text.index("(") + 1 : close]
    return comm, text[close + 2 :].split()


def cpu_seconds(pid):
    """utime + stime of a process (all its threads)."""
    _, fields = _stat_fields(f"/proc/{pid}/stat")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_class(comm):
    """A thread's class: its name without the trailing number
    ('msgr-worker-1' -> 'msgr-worker', 'flusher-3' -> 'flusher')."""
    return re.sub(r"[-_:.]?\d+$", "", comm) or comm


def thread_cpu(pid):
    """CPU seconds per thread class of one process."""
    classes = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return classes
    for tid in tids:
        try:
            comm, fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between listdir and open
        seconds = (int(fields[11]) + int(fields[12])) / CLK_TCK
        name = thread_class(comm)
        classes[name] = classes.get(name, 0.0) + seconds
    return classes


def write_bytes(pid):
    """Bytes this process caused to be sent to storage (/proc/PID/io).
    Writes to tmpfs (the shm operation log) are not among them."""
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "write_bytes":
                return int(value)
    raise RuntimeError(f"/proc/{pid}/io has no write_bytes")


def machine_busy_seconds():
    """Busy time of all CPUs (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        parts = f.readline().split()
    assert parts[0] == "cpu"
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in parts[1:9])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def device_of(path):
    """The /sys/dev/block entry of the device holding `path`, or None."""
    dev = os.stat(path).st_dev
    entry = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    return entry if os.path.exists(f"{entry}/stat") else None


def device_written_bytes(entry):
    with open(f"{entry}/stat") as f:
        return int(f.read().split()[6]) * 512  # sectors written, always 512-byte units


@dataclass
class Sample:
    wall: float
    cpu: dict  # group -> seconds
    threads: dict  # thread class -> seconds (server group only)
    written: dict  # group -> bytes
    machine_busy: float
    device: int


@dataclass
class Sampler:
    """Samples named groups of pids; `server` is the storage daemons."""

    groups: dict
    device: str = None
    start: Sample = field(default=None, init=False)

    def _take(self):
        cpu, written, threads = {}, {}, {}
        for group, pids in self.groups.items():
            cpu[group] = sum(cpu_seconds(p) for p in pids)
            written[group] = sum(write_bytes(p) for p in pids)
            if group == "server":
                for pid in pids:
                    for name, seconds in thread_cpu(pid).items():
                        threads[name] = threads.get(name, 0.0) + seconds
        return Sample(
            wall=time.monotonic(),
            cpu=cpu,
            threads=threads,
            written=written,
            machine_busy=machine_busy_seconds(),
            device=device_written_bytes(self.device) if self.device else 0,
        )

    def begin(self):
        self.start = self._take()

    def end(self):
        """The deltas since begin()."""
        a, b = self.start, self._take()
        return {
            "wall_s": b.wall - a.wall,
            "cpu_s": {g: b.cpu[g] - a.cpu[g] for g in b.cpu},
            "server_threads_cpu_s": {
                t: round(b.threads[t] - a.threads.get(t, 0.0), 3)
                for t in b.threads
                if b.threads[t] - a.threads.get(t, 0.0) > 0
            },
            "written_bytes": {g: b.written[g] - a.written[g] for g in b.written},
            "machine_busy_s": b.machine_busy - a.machine_busy,
            "device_written_bytes": b.device - a.device,
        }
