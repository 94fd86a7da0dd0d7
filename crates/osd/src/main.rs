//! `duplex-osd`: one OSD of a Duplex cluster.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    duplex_osd::cli::run(duplex_osd::cli::OsdArgs::parse())
}
