"""Unit tests of the suite's arithmetic: parsing, per-I/O figures, medians,
targets and the report. Run: python3 -m unittest discover -s bench/tests"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from duplexbench import fio, procs, report  # noqa: E402
from duplexbench.runner import derive  # noqa: E402


def fio_json(read_ios=0, write_ios=0, iops=1000.0, p99_ns=900_000):
    def direction(ios):
        return {
            "total_ios": ios,
            "iops": iops if ios else 0.0,
            "io_bytes": ios * 4096,
            "bw_bytes": iops * 4096 if ios else 0,
            "clat_ns": {"mean": 500_000.0, "percentile": {"50.000000": 400_000, "95.000000": 800_000,
                                                          "99.000000": p99_ns, "99.900000": 2_000_000}},
        }
    return {"jobs": [{"error": 0, "read": direction(read_ios), "write": direction(write_ios)}]}


def record(system, workload, iops, server_cpu_s, written, phase="compare", lat_mean_us=500.0):
    r = {
        "phase": phase, "system": system, "workload": workload, "round": 0, "settings": {},
        "io": {"write": {"ios": int(iops * 10), "iops": iops, "bytes": int(iops * 10) * 4096,
                         "mib_s": iops * 4096 / 2**20, "lat_us": {"mean": lat_mean_us, "p50": 400.0, "p99": 900.0}}},
        "client_tool_cpu_s": 1.0,
        "cpu_s": {"server": server_cpu_s, "gateway": 0.5, "other": 0.0},
        "written_bytes": {"server": written, "gateway": 0, "other": 0},
        "machine_busy_s": 15.0,
        "device_written_bytes": written,
        "server_threads_cpu_s": {},
    }
    derive(r)
    return r


class Parsing(unittest.TestCase):
    def test_thread_classes_drop_the_number(self):
        self.assertEqual(procs.thread_class("msgr-worker-1"), "msgr-worker")
        self.assertEqual(procs.thread_class("osd-flush-12"), "osd-flush")
        self.assertEqual(procs.thread_class("rocksdb:low0"), "rocksdb:low")
        self.assertEqual(procs.thread_class("tp_osd_tp"), "tp_osd_tp")
        self.assertEqual(procs.thread_class("7"), "7")

    def test_fio_summary_keeps_directions_and_microseconds(self):
        s = fio.summarize(fio_json(read_ios=100, write_ios=400))
        self.assertEqual(set(s), {"read", "write"})
        self.assertEqual(s["write"]["ios"], 400)
        self.assertAlmostEqual(s["write"]["lat_us"]["p99"], 900.0)
        self.assertAlmostEqual(s["read"]["lat_us"]["p95"], 800.0)

    def test_fio_without_io_or_with_an_error_is_refused(self):
        with self.assertRaises(RuntimeError):
            fio.summarize(fio_json())
        bad = fio_json(write_ios=10)
        bad["jobs"][0]["error"] = 5
        with self.assertRaises(RuntimeError):
            fio.summarize(bad)

    def test_notes_before_the_json_are_skipped(self):
        self.assertEqual(fio._strip_notes('note: rate\n{"a": 1}'), '{"a": 1}')

    def test_this_machine_is_readable(self):
        pid = os.getpid()
        self.assertGreaterEqual(procs.cpu_seconds(pid), 0.0)
        self.assertGreater(procs.machine_busy_seconds(), 0.0)
        self.assertIn("python", "".join(procs.thread_cpu(pid)) + "python")


class Figures(unittest.TestCase):
    def test_per_io_cpu_and_write_amplification(self):
        r = record("duplex", "randwrite-4k", 2000.0, server_cpu_s=2.0, written=2 * 20000 * 4096 * 3)
        self.assertEqual(r["ios"], 20000)
        self.assertAlmostEqual(r["server_cpu_us_per_io"], 100.0)
        self.assertAlmostEqual(r["client_cpu_us_per_io"], 75.0)  # fio 1.0 s + gateway 0.5 s
        self.assertAlmostEqual(r["waf_daemons"], 3.0)  # written / (user x 2 replicas)

    def test_medians_and_ranges(self):
        rs = [record("ceph", "randwrite-4k", iops, 1.0, 1) for iops in (1000.0, 3000.0, 1500.0)]
        row = report.summarize(rs)[0]
        self.assertEqual(row["iops"], 1500.0)
        self.assertEqual((row["iops_min"], row["iops_max"]), (1000.0, 3000.0))

    def test_targets_are_judged_as_ratios(self):
        rs = [
            record("ceph", "randwrite-4k", 1000.0, server_cpu_s=10.0, written=1),
            record("duplex", "randwrite-4k", 21000.0, server_cpu_s=8.0, written=21000 * 10 * 4096 * 2),
            record("ceph", "randwrite-4k-qd1", 300.0, 1.0, 1, lat_mean_us=3000.0),
            record("duplex", "randwrite-4k-qd1", 3000.0, 1.0, 3000 * 10 * 4096 * 2 * 11 // 10, lat_mean_us=250.0),
        ]
        t = {row["target"]: row for row in report.targets(report.summarize(rs))}
        self.assertTrue(t["4 KiB random write IOPS"]["met"])  # 21x against a bar of 20x
        self.assertTrue(t["4 KiB random write: server CPU µs per write"]["met"])  # 38.1 vs 1000 µs: 1/26
        self.assertTrue(t["4 KiB random write at QD1: mean latency"]["met"])  # 250/3000 = 0.083
        self.assertFalse(t["4 KiB random write at QD1: mean latency, µs"]["met"])  # 250 > 120 µs
        self.assertTrue(t["WAF during randwrite-4k"]["met"])  # exactly 1.0
        self.assertFalse(t["WAF during randwrite-4k-qd1"]["met"])  # 1.1 > 1.05

    def test_each_write_is_reported_against_the_ideal_path(self):
        rs = [record("duplex", "randwrite-4k", 20000.0, 1.0, 1),
              record("duplex", "randwrite-4k", 40000.0, 1.0, 1, phase="ideal")]
        rows = report.against_ideal(report.summarize(rs))
        self.assertEqual(len(rows), 1)
        self.assertEqual((rows[0]["duplex"]["iops"], rows[0]["ideal"]["iops"]), (20000.0, 40000.0))

    def test_the_report_renders(self):
        rs = [record("ceph", "randwrite-4k", 1000.0, 10.0, 1), record("duplex", "randwrite-4k", 9000.0, 1.0, 1)]
        result = {
            "env": {"date": "d", "machine": "m", "command": "bench/run", "duplex_version": "duplex", "commit": "c",
                    "fio_version": "fio", "plan": "p", "wall_minutes": 1.0},
            "plan": {"mix_rate_iops": 1000}, "workloads": ["randwrite-4k"], "records": rs,
            "summary": report.summarize(rs), "threads": {"duplex": {"osd-prio": 3.0}}, "plots": [],
        }
        text = report.markdown(result)
        self.assertIn("| randwrite-4k | **ratio** | 9.00× |", text)
        self.assertIn("`osd-prio` 3.0", text)


class RecoveryLoadCpu(unittest.TestCase):
    def test_cores_are_the_cpu_seconds_between_two_samples_over_their_time(self):
        import recovery_load
        before = {("osd.0", "osd-prio"): 1.0}
        after = {("osd.0", "osd-prio"): 3.0, ("osd.1", "osd-flush"): 0.5}
        self.assertEqual(recovery_load.cores(before, after, 2.0),
                         {("osd.0", "osd-prio"): 1.0, ("osd.1", "osd-flush"): 0.25})


if __name__ == "__main__":
    unittest.main()


class CephSettings(unittest.TestCase):
    def test_extra_settings_land_in_the_global_section(self):
        import tempfile

        from duplexbench.ceph import CephCluster

        with tempfile.TemporaryDirectory() as work:
            ceph = CephCluster(work, extra_conf={"osd_op_queue": "mclock_scheduler", "mgr_stats_period": 1})
            text = ceph._conf("fsid")
        sections = text.split("\n[")
        self.assertIn("osd_op_queue = mclock_scheduler", sections[0])
        self.assertIn("mgr_stats_period = 1", sections[0])
        self.assertNotIn("osd_op_queue", CephCluster(work)._conf("fsid"))


class QosCeph(unittest.TestCase):
    def test_percentiles_and_fio_logs(self):
        import tempfile

        sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
        import qos_ceph

        self.assertEqual(qos_ceph.percentile(list(range(1, 101)), 0.99), 100)
        self.assertEqual(qos_ceph.percentile(list(range(1, 101)), 0.5), 51)
        self.assertEqual(qos_ceph.percentile([], 0.99), 0)
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write("1795870462196, 34985, 1, 4096, 0\n1795870462197, 4510, 1, 4096, 0\n")
        try:
            self.assertEqual(qos_ceph.read_log(f.name), [(1795870462196, 34985), (1795870462197, 4510)])
        finally:
            os.unlink(f.name)

