//! `duplex-sim`: runs seeds of the deterministic simulator, in parallel
//! across cores, and sums them up. A failing seed is replayed exactly with
//! the reproduce line it prints (`duplex-sim --seed N ...`).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use clap::Parser;
use duplex_sim::{run, FaultKind, RunReport, SimConfig, SimFailure};

#[derive(Parser)]
#[command(version, about = "Duplex's deterministic cluster simulator")]
struct Cli {
    /// The first seed to run.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How many seeds, from --seed on.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Seeds run at once, one thread each (default: one per core). Each
    /// seed is still one deterministic thread: the results do not depend
    /// on it.
    #[arg(long)]
    jobs: Option<usize>,
    /// Print a line for every seed that passes too (the default when
    /// running at most 20 seeds); otherwise progress every 5%.
    #[arg(long)]
    verbose: bool,
    /// Virtual seconds of load (faults are injected during it).
    #[arg(long, default_value_t = 30)]
    load_seconds: u64,
    /// Log what the simulated daemons log (RUST_LOG filter, e.g. "info").
    /// Lines of seeds run at once interleave: use it with --jobs 1.
    #[arg(long)]
    log: Option<String>,
    /// Only these faults, comma-separated (crash, power-loss,
    /// power-loss-in-commit, isolate, cut-from-monitor, cut-peer; and
    /// mark-out, which the default set leaves out: an operator's out and
    /// in, so PGs move and are backfilled under load).
    #[arg(long, value_delimiter = ',', value_parser = parse_fault)]
    faults: Vec<FaultKind>,
    /// At most this many OSDs under a fault at once.
    #[arg(long, default_value_t = 1)]
    concurrent_faults: usize,
    /// Replicas per PG (default: the simulator's, 3).
    #[arg(long)]
    pool_size: Option<u8>,
    /// Replicas below which a PG takes no writes (default: the simulator's, 2).
    #[arg(long)]
    min_size: Option<u8>,
    /// The OSDs report their usage and the monitor's balancer moves PGs
    /// (upmap) under the faults; the old OSDs remove their stray copies.
    #[arg(long)]
    balancer: bool,
    /// Snapshots are taken under the load; writes carry the newest, and
    /// reads of them are checked as of the instant each was taken.
    #[arg(long)]
    snapshots: bool,
    /// An erasure-coded pool, `k+m` (4 KiB stripe unit), instead of a
    /// replicated one: degraded I/O, shard rebuilds and rollbacks under
    /// the faults. Its min_size is --min-size (default 2), at least k.
    #[arg(long, value_parser = parse_code, conflicts_with_all = ["snapshots", "pool_size"])]
    ec: Option<(u8, u8)>,
    /// Client blocks live in omap entries (a key per block in its
    /// object) instead of object data: omap sets and gets under the faults.
    #[arg(long, conflicts_with = "ec")]
    omap: bool,
    /// The pool is deduplicated (a tier of 16 KiB chunks in a chunk
    /// pool, lz4-compressed): each OSD runs the deduplication engine on
    /// its PGs under the faults, and reads follow evicted chunks. With
    /// --snapshots, reads at a snapshot follow them too.
    #[arg(long, conflicts_with_all = ["ec", "omap"])]
    dedup: bool,
    /// How a deduplicated pool's chunks are cut: fixed, or content
    /// (on 4 KiB blocks chosen by the data: 8 to 24 KiB chunks here).
    #[arg(long, default_value = "fixed", value_parser = duplex_map::Chunking::parse, requires = "dedup")]
    chunking: duplex_map::Chunking,
    /// The pool is eventually consistent, with this max_lag in ms (200
    /// if none is given): writes are acknowledged from their primary's
    /// log, and the checker's eventual mode allows a failure to lose the
    /// writes acknowledged within max_lag of it, nothing else.
    #[arg(long, num_args = 0..=1, default_missing_value = "200", conflicts_with_all = ["ec", "dedup"])]
    eventual: Option<u32>,
    /// OSDs in the cluster, one host each [default: 4, or k+m of --ec if
    /// more].
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=64))]
    osds: Option<u32>,
    /// The OSDs' backfill limit, bytes a second (0: none, else at least
    /// 1 MiB/s): at the least, a backfill's locks wait in the flushers'
    /// device queues (docs/OSD.md), and the primary's peering with them.
    #[arg(long)]
    recovery_bytes_per_sec: Option<u64>,
}

fn parse_code(code: &str) -> Result<(u8, u8), String> {
    let (k, m) = code.split_once('+').ok_or_else(|| format!("'{code}' is no k+m code"))?;
    let parse = |n: &str| n.trim().parse::<u8>().map_err(|e| format!("'{code}': {e}"));
    Ok((parse(k)?, parse(m)?))
}

fn parse_fault(name: &str) -> Result<FaultKind, String> {
    FaultKind::parse(name).ok_or_else(|| {
        let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown fault '{name}' (one of: {})", names.join(", "))
    })
}

impl Cli {
    fn config(&self, seed: u64) -> SimConfig {
        let mut config = SimConfig::new(seed);
        config.load_us = self.load_seconds * 1_000_000;
        if !self.faults.is_empty() {
            config.faults = self.faults.clone();
        }
        config.concurrent_faults = self.concurrent_faults;
        config.pool_size = self.pool_size.unwrap_or(config.pool_size);
        config.min_size = self.min_size.unwrap_or(config.min_size);
        config.balancer = self.balancer;
        config.snapshots = self.snapshots;
        config.erasure = self.ec;
        config.omap = self.omap;
        config.dedup = self.dedup;
        config.chunking = self.chunking;
        config.eventual = self.eventual;
        config.recovery_bytes_per_sec = self.recovery_bytes_per_sec;
        let shards = self.ec.map_or(0, |(k, m)| u32::from(k) + u32::from(m));
        config.osds = self.osds.unwrap_or(config.osds.max(shards));
        config
    }

    /// The command line that replays `seed` alone.
    fn reproduce(&self, seed: u64) -> String {
        let config = self.config(seed);
        let mut line = format!("duplex-sim --seed {seed} --load-seconds {}", self.load_seconds);
        if !self.faults.is_empty() {
            let names: Vec<&str> = self.faults.iter().map(|k| k.name()).collect();
            line += &format!(" --faults {}", names.join(","));
        }
        if self.pool_size.is_some() || self.min_size.is_some() {
            line += &format!(" --pool-size {} --min-size {}", config.pool_size, config.min_size);
        }
        if self.concurrent_faults != 1 {
            line += &format!(" --concurrent-faults {}", self.concurrent_faults);
        }
        if self.balancer {
            line += " --balancer";
        }
        if self.snapshots {
            line += " --snapshots";
        }
        if let Some((k, m)) = self.ec {
            line += &format!(" --ec {k}+{m}");
        }
        if self.omap {
            line += " --omap";
        }
        if self.dedup {
            line += " --dedup";
        }
        if let Some(rate) = self.recovery_bytes_per_sec {
            line += &format!(" --recovery-bytes-per-sec {rate}");
        }
        if let Some(max_lag_ms) = self.eventual {
            line += &format!(" --eventual {max_lag_ms}");
        }
        if self.chunking != duplex_map::Chunking::Fixed {
            line += &format!(" --chunking {}", self.chunking);
        }
        if let Some(osds) = self.osds {
            line += &format!(" --osds {osds}");
        }
        line
    }
}

/// How one seed ended.
enum Outcome {
    Passed(Box<RunReport>),
    Failed(SimFailure),
    /// The product's code (or the simulator's) panicked: a broken invariant.
    Panicked(String),
}

impl Outcome {
    /// The failure's kind, for the summary.
    fn kind(&self) -> Option<String> {
        match self {
            Outcome::Passed(_) => None,
            Outcome::Failed(SimFailure::Violations { kind, .. }) => Some(format!("violations ({kind})")),
            Outcome::Failed(SimFailure::Stuck { .. }) => Some("did not settle".into()),
            Outcome::Failed(SimFailure::Broken { .. }) => Some("broken run".into()),
            Outcome::Panicked(_) => Some("panicked".into()),
        }
    }
}

fn run_seed(config: &SimConfig) -> Outcome {
    match std::panic::catch_unwind(|| run(config)) {
        Ok(Ok(report)) => Outcome::Passed(Box::new(report)),
        Ok(Err(failure)) => Outcome::Failed(failure),
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into());
            Outcome::Panicked(message)
        }
    }
}

/// What the deduplication engines did (runs with `--dedup`).
fn dedup_line(report: &RunReport) -> String {
    let Some(d) = report.dedup else { return String::new() };
    format!(
        ", dedup: {} passes, {} chunks put, {} KiB evicted, {} promotions, {} steps stopped short",
        d.passes,
        d.chunks_put,
        d.bytes_evicted >> 10,
        d.promotions,
        d.stopped
    )
}

/// What an eventual run's failures lost (runs with `--eventual`).
fn eventual_line(report: &RunReport) -> String {
    if report.rollbacks == 0 {
        return String::new();
    }
    format!(", {} writes lost to failures (loss window {:.1} ms)", report.rollbacks, report.loss_window_us as f64 / 1e3)
}

fn ok_line(seed: u64, real_s: f64, report: &RunReport) -> String {
    format!(
        "seed {seed}: ok in {real_s:.1}s real, {:.1}s virtual: {} writes acknowledged, {} unknown, {} reads; \
         {} faults ({} power cuts in a commit, {} damaged copies found), {} marked down, {} peerings, {} objects recovered; \
         {} PGs backfilled ({} objects, {} writes elided), {} background requests ({} local waits), {} pins dropped, {} handed over, {} filled in the background, {} active-set records, {} balancer moves, {} snapshots ({} reads of them){}{}; {} messages ({} lost); digest {:016x}",
        report.virtual_us as f64 / 1e6,
        report.acknowledged_writes,
        report.unknown_writes,
        report.reads,
        report.faults.len(),
        report.power_cuts_in_commit,
        report.damaged_objects,
        report.marked_down,
        report.peerings,
        report.recovered_objects,
        report.backfilled_pgs,
        report.backfill_objects,
        report.elided_writes,
        report.background_requests,
        report.local_waits,
        report.pins_cleared,
        report.hand_overs,
        report.background_fills,
        report.sets_recorded,
        report.balancer_moves,
        report.snapshots,
        report.snapshot_reads,
        dedup_line(report),
        eventual_line(report),
        report.messages,
        report.messages_lost,
        report.digest,
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let (Some((k, m)), Some(osds)) = (cli.ec, cli.osds) {
        if u32::from(k) + u32::from(m) > osds {
            eprintln!("--ec {k}+{m} places {} shards on distinct hosts: it needs at least that many --osds", k + m);
            return ExitCode::FAILURE;
        }
    }
    if let Some(filter) = &cli.log {
        tracing_subscriber::fmt().with_env_filter(filter.as_str()).with_writer(std::io::stderr).init();
    }
    let jobs = cli
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, cli.seeds.max(1) as usize);
    let verbose = cli.verbose || cli.seeds <= 20;
    let started = Instant::now();
    let next = AtomicU64::new(cli.seed);
    let end = cli.seed.saturating_add(cli.seeds);
    let (done, results) = mpsc::channel::<(u64, f64, Outcome)>();
    let mut passed = 0u64;
    let mut failures: BTreeMap<u64, (String, String)> = BTreeMap::new();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let (cli, next, done) = (&cli, &next, done.clone());
            scope.spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    break;
                }
                let began = Instant::now();
                let outcome = run_seed(&cli.config(seed));
                if done.send((seed, began.elapsed().as_secs_f64(), outcome)).is_err() {
                    break;
                }
            });
        }
        drop(done);
        let step = (cli.seeds / 20).max(1);
        for (finished, (seed, real_s, outcome)) in results.into_iter().enumerate() {
            let kind = outcome.kind();
            match outcome {
                Outcome::Passed(report) => {
                    passed += 1;
                    if verbose {
                        println!("{}", ok_line(seed, real_s, &report));
                    }
                }
                Outcome::Failed(failure) => {
                    println!("seed {seed}: FAILED: {failure}\n  reproduce: {}", cli.reproduce(seed));
                    failures.insert(seed, (kind.unwrap_or_default(), failure.to_string()));
                }
                Outcome::Panicked(message) => {
                    println!("seed {seed}: PANICKED: {message}\n  reproduce: {}", cli.reproduce(seed));
                    failures.insert(seed, (kind.unwrap_or_default(), message));
                }
            }
            let finished = finished as u64 + 1;
            if !verbose && (finished.is_multiple_of(step) || finished == cli.seeds) {
                println!(
                    "progress: {finished}/{} seeds, {} failed, {:.0}s",
                    cli.seeds,
                    failures.len(),
                    started.elapsed().as_secs_f64()
                );
            }
        }
    });
    let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
    for (kind, _) in failures.values() {
        *by_kind.entry(kind.as_str()).or_default() += 1;
    }
    println!(
        "summary: {} seeds from {} ({} jobs, {:.0}s): {passed} passed, {} failed",
        cli.seeds,
        cli.seed,
        jobs,
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    for (kind, count) in &by_kind {
        println!("  {count} {kind}");
    }
    for seed in failures.keys() {
        println!("  failing: {}", cli.reproduce(*seed));
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
