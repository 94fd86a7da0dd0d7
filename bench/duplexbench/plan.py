"""What the suite runs: the workloads, the sweeps, and their sizes in the
full and the smoke mode."""

from dataclasses import dataclass, field

# Workloads run on both systems, interleaved (bench/fio/<name>.fio).
COMPARED = ["randwrite-4k", "randread-4k", "randwrite-4k-qd1", "seqwrite-128k", "seqread-128k", "mix-80-20"]

# Write workloads also run with `write_path=ideal` in every round (the
# OSDs acknowledge once each replica received a write, storing nothing):
# the limit each write figure is reported against (issue 22).
IDEAL = ["randwrite-4k", "randwrite-4k-qd1", "seqwrite-128k"]

# Duplex's ablation (paper Table II): every write path x threading pair,
# and the ideal path.
ABLATION = [
    {"write_path": "oplog", "threading": "prioritized"},
    {"write_path": "oplog", "threading": "pool"},
    {"write_path": "sync", "threading": "prioritized"},
    {"write_path": "sync", "threading": "pool"},
    {"write_path": "ideal", "threading": "prioritized"},
]


@dataclass
class Plan:
    smoke: bool
    rounds: int
    runtime: int  # seconds per fio run
    settle: float  # seconds of quiet before each run
    osds: int = 2
    osd_size_gib: int = 8
    image_size_gib: float = 4
    pg_num: int = 32
    # The mix's fixed total rate (IOPS over both jobs): below what either
    # system sustains on this machine, so both are compared at equal load.
    mix_rate_iops: int = 1000
    native_seconds: int = 10
    flush_thresholds: list = field(default_factory=lambda: [1, 4, 16, 64])
    partitions: list = field(default_factory=lambda: [1, 2, 4])
    ablation: list = field(default_factory=lambda: list(ABLATION))
    ideal: list = field(default_factory=lambda: list(IDEAL))
    with_ceph: bool = True

    @staticmethod
    def full(rounds=3, runtime=15):
        return Plan(smoke=False, rounds=rounds, runtime=runtime, settle=3.0)

    @staticmethod
    def smoke_plan():
        # Seconds per run, tiny image, no Ceph: proves the suite works, not speed.
        return Plan(
            smoke=True, rounds=1, runtime=2, settle=0.2, osd_size_gib=1, image_size_gib=0.25, pg_num=8,
            mix_rate_iops=200, native_seconds=1, flush_thresholds=[1, 16], partitions=[1, 2],
            with_ceph=False,
        )
