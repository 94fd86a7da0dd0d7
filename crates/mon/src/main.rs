//! `duplex-mon`: one monitor of a Duplex cluster.

use clap::Parser;
use duplex_mon::cli::{run, MonArgs};

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file must not fill with escape codes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    run(MonArgs::parse())
}
