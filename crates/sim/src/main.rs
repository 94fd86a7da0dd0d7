//! `duplex-sim`: runs seeds of the deterministic simulator. A failing seed
//! is replayed exactly with `duplex-sim --seed N`.

use anyhow::Result;
use clap::Parser;
use duplex_sim::{run, FaultKind, SimConfig};

#[derive(Parser)]
#[command(version, about = "Duplex's deterministic cluster simulator")]
struct Cli {
    /// The first seed to run.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How many seeds, from --seed on.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Virtual seconds of load (faults are injected during it).
    #[arg(long, default_value_t = 30)]
    load_seconds: u64,
    /// Log what the simulated daemons log (RUST_LOG filter, e.g. "info").
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
}

fn parse_fault(name: &str) -> Result<FaultKind, String> {
    FaultKind::parse(name).ok_or_else(|| {
        let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown fault '{name}' (one of: {})", names.join(", "))
    })
}

/// The flags (after `--load-seconds`) that replay a run of `config`.
fn replay_flags(cli: &Cli, config: &SimConfig) -> String {
    let mut flags = String::new();
    if !cli.faults.is_empty() {
        let names: Vec<&str> = cli.faults.iter().map(|k| k.name()).collect();
        flags += &format!(" --faults {}", names.join(","));
    }
    if cli.pool_size.is_some() || cli.min_size.is_some() {
        flags += &format!(" --pool-size {} --min-size {}", config.pool_size, config.min_size);
    }
    if cli.concurrent_faults != 1 {
        flags += &format!(" --concurrent-faults {}", cli.concurrent_faults);
    }
    flags
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(filter) = &cli.log {
        tracing_subscriber::fmt().with_env_filter(filter.as_str()).with_writer(std::io::stderr).init();
    }
    let mut failed = Vec::new();
    for seed in cli.seed..cli.seed + cli.seeds {
        let mut config = SimConfig::new(seed);
        config.load_us = cli.load_seconds * 1_000_000;
        if !cli.faults.is_empty() {
            config.faults = cli.faults.clone();
        }
        config.concurrent_faults = cli.concurrent_faults;
        config.pool_size = cli.pool_size.unwrap_or(config.pool_size);
        config.min_size = cli.min_size.unwrap_or(config.min_size);
        let started = std::time::Instant::now();
        match run(&config) {
            Ok(report) => println!(
                "seed {seed}: ok in {:.1}s real, {:.1}s virtual: {} writes acknowledged, {} unknown, {} reads; \
                 {} faults ({} power cuts in a commit, {} damaged copies found), {} marked down, {} peerings, {} objects recovered; \
                 {} PGs backfilled ({} objects), {} pins dropped, {} handed over, {} filled in the background, {} active-set records; {} messages ({} lost); digest {:016x}",
                started.elapsed().as_secs_f64(),
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
                report.pins_cleared,
                report.hand_overs,
                report.background_fills,
                report.sets_recorded,
                report.messages,
                report.messages_lost,
                report.digest,
            ),
            Err(failure) => {
                println!(
                    "seed {seed}: FAILED: {failure}\n  reproduce: duplex-sim --seed {seed} --load-seconds {}{}",
                    cli.load_seconds,
                    replay_flags(&cli, &config)
                );
                failed.push(seed);
            }
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("{} of {} seeds failed: {failed:?}", failed.len(), cli.seeds);
    }
    Ok(())
}
