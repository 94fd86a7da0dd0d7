//! The per-write work budget (issue 22): a fixed workload on a local
//! cluster (2 OSD processes, replication 2, a thin image served by
//! `duplex nbd serve`, driven by fio's nbd engine) and the work it cost,
//! counted by the daemons and the kernel, per client write and per client
//! read. Timings are too noisy to gate CI on a 2-core machine; work is not.
//!
//! Every budget below is a number with the reason it is that number. A
//! change that raises a counter past its budget fails here: raise the
//! budget in the same commit, and say why there.
//!
//! The workload: 64 MiB written sequentially first (objects created, not
//! counted), then 16,384 random 4 KiB writes at queue depth 32, 2,048 at
//! queue depth 1, and 8,192 random 4 KiB reads at queue depth 32, each a
//! fixed count (fio's `io_size`), each phase counted alone.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{osds, require_tool, run_ok, scrape, DevCluster, Osd};

const BLOCK: u64 = 4096;
const REPLICAS: f64 = 2.0;
const AREA: &str = "64M";

/// Device bytes over client bytes × replicas. A write costs its 4 KiB
/// block and its share of the store's journal record, a 512-byte sector
/// at least (the block's crc and, per PG flushed, the slot of its request
/// id: tens of bytes); at QD32 a record carries many writes, at QD1 a few
/// (the 1 ms flush window). Measured 1.012-1.014 at QD32, 1.026-1.035 at
/// QD1. 5% is the bar; before the fix the id record's 4 KiB block
/// per PG flush made it 1.33 at QD32 and 1.91 at QD1. The phases are too
/// short for a checkpoint (it writes dirty metadata pages and the
/// deferred blocks back): bench/run's WAF, over longer runs, counts it.
const MAX_WAF: f64 = 1.05;

/// What one client write may cost at a queue depth, both OSDs together.
struct WriteBudget {
    depth: &'static str,
    writes: u64,
    /// Store device write requests (io_uring entries or `pwrite`s): the
    /// data block on each replica, plus journal records and checkpoints.
    /// Blocks adjacent on the device go as one vectored request and count
    /// once (session 40); random 4 KiB writes rarely have a neighbour.
    device_writes: f64,
    /// Times a store waited for the device (submission, then fdatasync).
    submissions: f64,
    fdatasyncs: f64,
    wakeups: f64,
    allocations: f64,
}

// The figures in the comments are this test's own runs (release build,
// 2 vCPUs, seven runs at 4b01347), which print every counter. Each budget
// leaves room for that spread: a budget that fails on noise is worse than
// none. Counters that scale with batching at QD32 (submissions, wake-ups,
// allocations) swing the most from run to run; those at QD1 hardly do.

/// At QD32 a store batch carries many writes: per client write both OSDs
/// make 2 data-block requests plus a share of records (measured
/// 2.05-2.12), one submission and one fdatasync per batch (0.06-0.12
/// each; 0.56 with the id record's blocks written in place again), and
/// their threads sleep about once or less (0.56-1.72: one wake-up serves
/// several I/Os, fewer on a slow run). Allocations: the primary's and the
/// replica's frames, log index entry, pending op, reply, flush batch
/// (30-36).
const QD32: WriteBudget = WriteBudget {
    depth: "QD32",
    writes: 16_384,
    device_writes: 2.4,
    submissions: 0.25,
    fdatasyncs: 0.25,
    wakeups: 2.5,
    allocations: 45.0,
};

/// At QD1 a flush carries a write or two: a record each (2.45-2.57
/// requests), one submission and one fdatasync per batch (0.37-0.57 each;
/// the record and its data went in two submissions before, which made it
/// 0.94). A write crosses the gateway's NBD and client threads, the
/// primary's event loop, the replica's, the primary again and both
/// flushers (6.0-7.2; 7.65 since issue 28 hands each commit's device flush
/// to a sync thread so that reads go on meanwhile: two more wake-ups per
/// flush, at 0.56 flushes per write). Fewer writes share a flush's
/// allocations (58-64; 66.5 with the sync thread's messages; 60.5-64 since
/// session 30, which stopped counting the metrics endpoint's own
/// allocations: the scrapes while a phase settles were counted as work).
const QD1: WriteBudget = WriteBudget {
    depth: "QD1",
    writes: 2_048,
    device_writes: 3.0,
    submissions: 0.75,
    fdatasyncs: 0.75,
    wakeups: 9.0,
    allocations: 75.0,
};

/// A read crosses the gateway and the primary's event loop; at QD32 a
/// wake-up serves one or more (measured 0.88-1.06; 1.33 once in an
/// earlier session). Allocations: both
/// OSDs, the replica serves none (10.8-11.3; session 20, c7bf63b:
/// 11.35-12.40 over eight runs at 0.85-1.18 wake-ups per read). Like the
/// writes' at QD32 they grow on a slow run, whose wake-ups serve fewer
/// reads each: one CI run in a fresh worktree measured 14.68 at 1.93
/// wake-ups per read (inside that budget), over the 14 this budget was.
/// 16 leaves room for a run as slow as the wake-up budget allows and
/// still fails on a third more work per read.
const MAX_WAKEUPS_PER_READ_QD32: f64 = 2.0;
const MAX_ALLOCATIONS_PER_READ: f64 = 16.0;

/// Copies of a write's 4 KiB payload made in OSD memory, both OSDs: on
/// each, into the log's ring (`log_append`), the flush's store op
/// (`flush`) and the store's block buffer (`store`); on the primary, the
/// payload encoded into its entry (`encode`). 7 in all (measured 7.03:
/// `store` counts a little journal padding). The socket's bytes land in
/// the frame buffer straight from the kernel (no `receive` copy since
/// issue 22's second step: it was 2.06 of the 9.09 before), and the
/// primary's frame to its replica goes out from the encoded entry.
const MAX_PAYLOAD_COPIES_PER_WRITE: f64 = 7.2;

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "the budgets are a release build's: scripts/test-all runs this test with --release"
)]
fn the_work_per_write_and_per_read_stays_within_budget() {
    require_tool("fio");
    let cluster = DevCluster::with_args(&["--osds", "2", "--pg-num", "32"]);
    run_ok(cluster.cli().args(["image", "create", "budget", "--size", AREA]));
    let socket_dir = tempfile::tempdir().expect("temp dir");
    let socket = socket_dir.path().join("nbd.sock");
    let gateway = cluster.serve("budget", Some(&socket));
    let osds = osds(cluster.path());
    assert_eq!(osds.len(), 2, "two OSD processes");
    let mut pids: Vec<u32> = osds.iter().map(|osd| osd.pid).collect();
    pids.push(gateway.pid());

    fio(&gateway.uri, "prefill", "write", "1M", 4, AREA);
    settle(&osds);

    let qd32_run = || measure(&osds, &pids, || fio(&gateway.uri, "randwrite-qd32", "randwrite", "4k", 32, AREA));
    let mut qd32 = qd32_run().per_write(&QD32);
    if qd32.iter().any(|line| !line.within) {
        // A slow run (the first after a long build, with the disk writing
        // back gigabytes) batches less, and its wake-ups and submissions per
        // write rise: once 2.88 and 3.08 wake-ups against 0.69-1.14 on the
        // runs around them. Noise only ever makes a run slower, while more
        // work in the code shows on every run: a second run decides.
        let text: Vec<&str> = qd32.iter().map(|line| line.text.as_str()).collect();
        eprintln!(
            "QD32 over budget once, measuring again:
{}",
            text.join("\n")
        );
        qd32 = qd32_run().per_write(&QD32);
    }
    let qd1 = measure(&osds, &pids, || fio(&gateway.uri, "randwrite-qd1", "randwrite", "4k", 1, "8M"));
    let reads = measure(&osds, &pids, || fio(&gateway.uri, "randread-qd32", "randread", "4k", 32, "32M"));

    let report = [qd32, qd1.per_write(&QD1), reads.per_read(8_192)];
    let text: Vec<String> = report.iter().flatten().map(|line| line.text.clone()).collect();
    eprintln!("work budget:\n{}", text.join("\n"));
    let over: Vec<&String> = report.iter().flatten().filter(|line| !line.within).map(|line| &line.text).collect();
    assert!(over.is_empty(), "over budget:\n{over:#?}\n(all: {text:#?})");
}

fn fio(uri: &str, name: &str, rw: &str, bs: &str, iodepth: u32, io_size: &str) {
    let output = run_ok(
        Command::new("fio")
            .arg(format!("--name={name}"))
            .args(["--ioengine=nbd", "--direct=1", "--randrepeat=1", "--norandommap=1"])
            .arg(format!("--uri={uri}"))
            .arg(format!("--rw={rw}"))
            .arg(format!("--bs={bs}"))
            .arg(format!("--iodepth={iodepth}"))
            .arg(format!("--size={AREA}"))
            .arg(format!("--io_size={io_size}")),
    );
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(report.contains("err= 0"), "fio reported errors:\n{report}");
}

/// Counters of the daemons at one moment.
#[derive(Clone, Default)]
struct Sample {
    /// Summed over the OSDs, by metric and label.
    metrics: HashMap<String, f64>,
    wakeups: u64,
}

fn sample(osds: &[Osd], pids: &[u32]) -> Sample {
    let mut metrics = HashMap::new();
    for osd in osds {
        for (name, value) in scrape(osd.admin) {
            *metrics.entry(name).or_insert(0.0) += value;
        }
    }
    Sample { metrics, wakeups: pids.iter().map(|pid| voluntary_switches(*pid)).sum() }
}

/// Waits until the flushers have applied everything (their store counters
/// stop moving): a phase's counters then hold all of its work.
fn settle(osds: &[Osd]) {
    let started = Instant::now();
    let mut last = None;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now: Vec<f64> = osds
            .iter()
            .map(|osd| {
                let metrics = scrape(osd.admin);
                metrics.get("duplex_osd_flushed_entries_total").copied().unwrap_or(0.0)
                    + metrics.get("duplex_osd_device_bytes_written_total").copied().unwrap_or(0.0)
            })
            .collect();
        if last.as_ref() == Some(&now) || started.elapsed() > Duration::from_secs(20) {
            return;
        }
        last = Some(now);
    }
}

struct Delta {
    before: Sample,
    after: Sample,
}

fn measure(osds: &[Osd], pids: &[u32], workload: impl FnOnce()) -> Delta {
    let before = sample(osds, pids);
    workload();
    settle(osds);
    Delta { before, after: sample(osds, pids) }
}

struct Line {
    text: String,
    within: bool,
}

fn line(what: &str, value: f64, budget: f64) -> Line {
    Line { text: format!("{what}: {value:.3} (budget {budget})"), within: value <= budget }
}

impl Delta {
    fn metric(&self, name: &str) -> f64 {
        let get = |sample: &Sample| sample.metrics.get(name).copied().unwrap_or(0.0);
        get(&self.after) - get(&self.before)
    }

    fn wakeups(&self) -> f64 {
        (self.after.wakeups - self.before.wakeups) as f64
    }

    fn per_write(&self, budget: &WriteBudget) -> Vec<Line> {
        let depth = budget.depth;
        let served = self.metric("duplex_osd_ops_total{op=\"write\"}");
        let n = budget.writes as f64;
        assert!(served >= n, "{depth}: the primaries served {served} writes, fio made {n}");
        let copies: Vec<(&str, f64)> = ["encode", "log_append", "send", "flush", "store"]
            .into_iter()
            .map(|site| {
                (
                    site,
                    self.metric(&format!("duplex_osd_payload_bytes_copied_total{{site=\"{site}\"}}"))
                        / (n * BLOCK as f64),
                )
            })
            .collect();
        let store = |kind: &str| self.metric(&format!("duplex_osd_store_requests_total{{kind=\"{kind}\"}}")) / n;
        vec![
            line(
                &format!("{depth} write amplification"),
                self.metric("duplex_osd_device_bytes_written_total") / (n * BLOCK as f64 * REPLICAS),
                MAX_WAF,
            ),
            line(&format!("{depth} store device write requests per write"), store("write"), budget.device_writes),
            line(&format!("{depth} store submissions per write"), store("submission"), budget.submissions),
            line(&format!("{depth} fdatasyncs per write"), store("flush"), budget.fdatasyncs),
            line(&format!("{depth} wake-ups per write"), self.wakeups() / n, budget.wakeups),
            line(
                &format!("{depth} OSD allocations per write"),
                self.metric("duplex_process_allocations_total") / n,
                budget.allocations,
            ),
            line(
                &format!("{depth} payload copies per write {copies:.2?}"),
                copies.iter().map(|(_, copies)| copies).sum(),
                MAX_PAYLOAD_COPIES_PER_WRITE,
            ),
        ]
    }

    fn per_read(&self, reads: u64) -> Vec<Line> {
        let n = reads as f64;
        let served = self.metric("duplex_osd_ops_total{op=\"read\"}");
        assert!(served >= n, "the primaries served {served} reads, fio made {reads}");
        vec![
            line("QD32 wake-ups per read", self.wakeups() / n, MAX_WAKEUPS_PER_READ_QD32),
            line(
                "QD32 OSD allocations per read",
                self.metric("duplex_process_allocations_total") / n,
                MAX_ALLOCATIONS_PER_READ,
            ),
        ]
    }
}

/// The counters of an OSD's `/metrics` page, by name with labels.
/// Voluntary context switches of every live thread of `pid`.
fn voluntary_switches(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process runs");
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|value| value.trim().parse::<u64>().ok())
        })
        .sum()
}
