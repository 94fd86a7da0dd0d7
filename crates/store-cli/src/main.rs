//! `duplex-store`: make, check, inspect and benchmark a Duplex object store.

mod bench;
mod counting_alloc;
mod fio;
mod memory;
mod result;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use duplex_store::units;
use duplex_store::{DeviceConfig, DirectIo, IoBackend, MkfsOptions, StoreConfig};

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

#[derive(Parser)]
#[command(name = "duplex-store", version, about = "Make, check, inspect and benchmark a Duplex object store")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    Auto,
    Uring,
    Pread,
}

#[derive(clap::Args, Clone)]
struct DeviceArgs {
    /// I/O engine: io_uring where the kernel allows it (auto), or forced.
    #[arg(long, value_enum, default_value = "auto")]
    io: BackendArg,
    /// Use buffered I/O when the file system refuses O_DIRECT, instead of failing.
    #[arg(long)]
    allow_buffered: bool,
}

impl DeviceArgs {
    fn config(&self) -> StoreConfig {
        let backend = match self.io {
            BackendArg::Auto => IoBackend::Auto,
            BackendArg::Uring => IoBackend::Uring,
            BackendArg::Pread => IoBackend::Pread,
        };
        let direct_io = if self.allow_buffered { DirectIo::Fallback } else { DirectIo::Require };
        StoreConfig { device: DeviceConfig { backend, direct_io, ..DeviceConfig::default() }, ..StoreConfig::default() }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Format a block device or file (created or resized with --size). Destroys its contents.
    Mkfs {
        path: PathBuf,
        /// Create or resize a regular file to this size first (e.g. 8G).
        #[arg(long, value_parser = units::parse_size)]
        size: Option<u64>,
        /// Partitions: one non-priority thread each.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// Journal per partition (default: 1/128 of the partition, 1 MiB to 64 MiB).
        #[arg(long, value_parser = units::parse_size)]
        journal: Option<u64>,
        /// Data bytes per onode slot; smaller allows more objects.
        #[arg(long, value_parser = units::parse_size, default_value = "64K")]
        bytes_per_onode: u64,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// Check every invariant; print a JSON report. Exit 0 clean, 1 problems found, 2 could not run.
    Fsck {
        path: PathBuf,
        /// Skip reading every data block to check its crc32c.
        #[arg(long)]
        no_data: bool,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// Print the superblock and per-partition usage as JSON.
    Info {
        path: PathBuf,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// Random 4 KiB overwrite and read benchmark on pre-allocated 4 MiB objects.
    Bench(bench::BenchArgs),
    /// Memory of the index and of the whole process with many objects.
    MemoryReport(memory::MemoryArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file must not fill with escape codes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("duplex-store: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Mkfs { path, size, partitions, journal, bytes_per_onode, device } => {
            let options = MkfsOptions { partitions, journal_bytes: journal, bytes_per_onode, size_bytes: size };
            let superblock = duplex_store::mkfs(&path, &options, &device.config())
                .with_context(|| format!("making a store on {}", path.display()))?;
            let data: u64 = superblock.data.data_blocks;
            let slots: u64 = superblock.partitions.iter().map(|p| p.slot_count()).sum();
            println!(
                "made a store on {}: {} partitions, {} of data blocks, room for {} objects, {}-byte journal sectors",
                path.display(),
                superblock.partitions.len(),
                units::format_size(data * 4096),
                slots,
                superblock.sector_size
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Fsck { path, no_data, device } => {
            let report = duplex_store::fsck(&path, &device.config(), !no_data);
            println!("{}", serde_json::to_string_pretty(&report)?);
            let issues: usize = report.issues.len() + report.partitions.iter().map(|p| p.issues.len()).sum::<usize>();
            if report.clean {
                eprintln!("fsck: {} is clean", path.display());
                Ok(ExitCode::SUCCESS)
            } else if report.issues.iter().any(|i| i.kind == "mount") {
                eprintln!("fsck: could not mount {}: {}", path.display(), report.issues[0].detail);
                Ok(ExitCode::from(2))
            } else {
                eprintln!("fsck: {} has {issues} problem(s)", path.display());
                Ok(ExitCode::from(1))
            }
        }
        Command::Info { path, device } => {
            let config = StoreConfig { read_only: true, ..device.config() };
            let store =
                duplex_store::Store::open(&path, &config).with_context(|| format!("opening {}", path.display()))?;
            let sb = store.superblock();
            let partitions: Vec<_> = store
                .partitions()
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "partition": p.index(),
                        "objects": p.object_count(),
                        "chunks_owned": p.owned_chunks().0,
                        "blocks_owned": p.owned_chunks().1,
                        "blocks_used": p.used_blocks(),
                    })
                })
                .collect();
            let info = serde_json::json!({
                "path": path.display().to_string(),
                "format_version": sb.version,
                "fsid": sb.fsid.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                "device_bytes": sb.device_blocks * 4096,
                "sector_size": sb.sector_size,
                "direct_io": store.device().is_direct(),
                "data_blocks": sb.data.data_blocks,
                "chunk_blocks": sb.data.chunk_blocks,
                "chunks": sb.data.chunks,
                "free_chunks": store.partitions().first().map_or(0, |p| p.free_chunks()),
                "free_blocks": sb.data.data_blocks - store.partitions().iter().map(|p| p.used_blocks()).sum::<u64>(),
                "partitions": partitions,
            });
            println!("{}", serde_json::to_string_pretty(&info)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => bench::run(args).map(|()| ExitCode::SUCCESS),
        Command::MemoryReport(args) => memory::run(args).map(|()| ExitCode::SUCCESS),
    }
}
