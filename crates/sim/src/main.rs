//! `duplex-sim`: runs seeds of the deterministic simulator. A failing seed
//! is replayed exactly with `duplex-sim --seed N`.

use anyhow::Result;
use clap::Parser;
use duplex_sim::{run, SimConfig};

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
        let started = std::time::Instant::now();
        match run(&config) {
            Ok(report) => println!(
                "seed {seed}: ok in {:.1}s real, {:.1}s virtual: {} writes acknowledged, {} unknown, {} reads; \
                 {} faults, {} marked down, {} peerings, {} objects recovered; {} messages ({} lost); digest {:016x}",
                started.elapsed().as_secs_f64(),
                report.virtual_us as f64 / 1e6,
                report.acknowledged_writes,
                report.unknown_writes,
                report.reads,
                report.faults.len(),
                report.marked_down,
                report.peerings,
                report.recovered_objects,
                report.messages,
                report.messages_lost,
                report.digest,
            ),
            Err(failure) => {
                println!(
                    "seed {seed}: FAILED: {failure}\n  reproduce: duplex-sim --seed {seed} --load-seconds {}",
                    cli.load_seconds
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
