//! `duplex-osd`: one OSD of a Duplex cluster.

use clap::Parser;

#[global_allocator]
static ALLOCATOR: duplex_osd::metrics::alloc_count::CountingAllocator =
    duplex_osd::metrics::alloc_count::CountingAllocator;

fn main() -> anyhow::Result<()> {
    duplex_osd::cli::run(duplex_osd::cli::OsdArgs::parse())
}
