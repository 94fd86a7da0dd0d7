//! The `duplex-osd` command line: flags, defaults, and start-up.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::{ConnectionPolicy, OplogMode, OsdConfig, Threading, WritePath};
use anyhow::{bail, Context, Result};
use clap::Parser;
use duplex_store::{DeviceConfig, DeviceFaults, DirectIo, MkfsOptions, StoreConfig};

#[derive(Parser, Debug)]
#[command(name = "duplex-osd", version, about = "One OSD of a Duplex cluster: a data device behind an operation log")]
pub struct OsdArgs {
    /// This OSD's id (unique in the cluster).
    #[arg(long)]
    id: u32,
    /// The object store: a block device or a file; given twice, a mirrored
    /// pair (see --data-mirror; docs/STORE.md, "Mirrored devices").
    #[arg(long, required = true, num_args = 1)]
    data: Vec<PathBuf>,
    /// How a mirrored pair is used: read-flush-split (commits flush the
    /// first device only; reads go to the second, which never waits behind
    /// a flush) or plain (both flushed; reads from either).
    #[arg(long, value_parser = parse_mirror_mode, default_value = "read-flush-split")]
    data_mirror: duplex_store::mirror::MirrorMode,
    /// Which device of the pair takes the flushes (0 or 1, in --data's
    /// order); the roles swap at start if they differ. Default: as they were.
    #[arg(long)]
    mirror_flush_device: Option<u8>,
    /// The mirror's dirty regions, in KiB, when it is made (a power of two ≥ 4).
    #[arg(long, default_value_t = duplex_store::mirror::DEFAULT_REGION_BYTES >> 10)]
    mirror_region_kib: u64,
    /// How often both devices of the mirror are flushed so that clean
    /// regions' bits clear (a resync after a crash copies the rest).
    #[arg(long, default_value_t = duplex_store::mirror::DEFAULT_CLEAN_INTERVAL.as_millis() as u64)]
    mirror_clean_ms: u64,
    /// At start, after the resync, compare the mirror's two devices whole
    /// and repair any block that differs from the flush device's (slow:
    /// reads both; for a pair in doubt after a crash, and for tests).
    #[arg(long)]
    mirror_check_at_start: bool,
    /// Keep the mirror's roles as configured, even when the flush device
    /// turns slow (by default they swap: docs/STORE.md, "Roles").
    #[arg(long)]
    mirror_fixed_roles: bool,
    /// Format --data first if it does not exist, as a file of this many bytes.
    #[arg(long)]
    mkfs_size: Option<u64>,
    /// Partitions (and flusher threads) when formatting.
    #[arg(long, default_value_t = 2)]
    mkfs_partitions: u32,
    /// When formatting: data bytes per onode slot (each object's metadata
    /// takes at least one). The default suits 4 MiB image objects; a pool
    /// of many small objects (a dedup tier's chunks) wants fewer bytes per
    /// slot, or its OSDs fill by slots with data to spare.
    #[arg(long, default_value_t = MkfsOptions::default().bytes_per_onode)]
    mkfs_bytes_per_onode: u64,
    /// Use buffered I/O where the file system refuses O_DIRECT (tmpfs), instead of failing.
    #[arg(long)]
    allow_buffered_io: bool,
    /// Where operation logs live: shm (tmpfs; survives a crash, not a power loss),
    /// pmem (persistent memory; survives both), file (a disk, O_DSYNC; survives both).
    #[arg(long, value_enum, default_value_t = OplogMode::Shm)]
    oplog_mode: OplogMode,
    /// Directory of the per-PG logs (default for shm: /dev/shm/duplex-osd-ID).
    #[arg(long)]
    oplog_dir: Option<PathBuf>,
    /// Bytes of operation log per PG.
    #[arg(long, default_value_t = 4 << 20)]
    oplog_pg_bytes: u64,
    /// A monitor: ID=IP:PORT (repeat for each).
    #[arg(long = "mon", required = true)]
    monitors: Vec<String>,
    /// The cluster fsid: 32 hex digits.
    #[arg(long)]
    fsid: String,
    /// File holding the shared cluster secret.
    #[arg(long)]
    secret_file: PathBuf,
    /// Where clients and peers connect.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The address other hosts use, when it differs from --listen.
    #[arg(long)]
    public_addr: Option<SocketAddr>,
    /// Host name for placement (replicas go to different hosts).
    #[arg(long)]
    host: Option<String>,
    /// Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// The admin socket, for operator commands on this host (`duplex
    /// daemon SOCKET …`: a mirror's status, replacing a failed device);
    /// default: admin.sock in the --oplog-dir; "none": no socket.
    #[arg(long)]
    admin_socket: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    priority_threads: usize,
    /// Cores to pin priority threads to (comma-separated); default: no pinning.
    #[arg(long, value_delimiter = ',')]
    priority_cores: Vec<usize>,
    /// Log entries in a PG that start a flush at once.
    #[arg(long, default_value_t = 16)]
    flush_threshold: usize,
    /// The longest an entry waits in the log before a flush starts (µs).
    #[arg(long, default_value_t = 1000)]
    flush_timeout_us: u64,
    /// oplog: acknowledge once logged on every replica; sync: once applied and flushed.
    #[arg(long, value_enum, default_value_t = WritePath::Oplog)]
    write_path: WritePath,
    /// prioritized: the connection's thread runs each op; pool: a worker
    /// pool does; lalca: pinned threads, and an eventual PG's ops run on
    /// the thread that owns the PG at the time (forwarded there).
    #[arg(long, value_enum, default_value_t = Threading::Prioritized)]
    threading: Threading,
    /// Worker threads with --threading pool.
    #[arg(long, default_value_t = 2)]
    pool_threads: usize,
    /// Which priority threads serve each connection: pinned (one each),
    /// lcam (busy connections gain threads while they do not contend for
    /// its lock), naive (every thread serves every connection).
    #[arg(long, value_enum, default_value_t = ConnectionPolicy::Pinned)]
    connection_policy: ConnectionPolicy,
    /// With --connection-policy lcam: how often connections are placed
    /// anew (ms); a connection whose threads waited for its lock more
    /// than 10% of it loses one.
    #[arg(long, default_value_t = crate::io::lcam::DEFAULT_INTERVAL.as_millis() as u64)]
    lcam_interval_ms: u64,
    /// Deep-scrub each PG this OSD is primary of this often (seconds; 0:
    /// never). A scrub reports bad copies; `duplex pg repair` fixes them.
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    scrub_interval_s: u64,
    /// The backfill class's limit at each store partition: bytes per
    /// second a background backfill reads or writes there (0: no limit).
    #[arg(long, default_value_t = crate::config::DEFAULT_RECOVERY_BYTES_PER_SEC)]
    recovery_bytes_per_sec: u64,
    /// The snapshot trim class's limit at each store partition: clones
    /// deleted per second (0: no limit).
    #[arg(long, default_value_t = crate::config::DEFAULT_TRIMS_PER_SEC)]
    trims_per_sec: u32,
    /// A deduplicated pool's object is deduplicated (its cold chunks moved
    /// to the chunk pool) once it has not been written for this many
    /// seconds.
    #[arg(long, default_value_t = 30)]
    dedup_cold_s: u64,
    /// Testing and failure rehearsals only: put the data device behind a
    /// simulated volatile write cache (unflushed writes die with the
    /// process) and arm the faults this file names when it appears, one
    /// word per line: flush-eio, write-eio, power-cut (docs/RELIABILITY.md).
    #[arg(long, value_name = "TRIGGER_FILE")]
    inject_device_faults: Option<PathBuf>,
    /// As --inject-device-faults, for the second device of a mirrored pair
    /// (the first flag then covers the first device only).
    #[arg(long, value_name = "TRIGGER_FILE")]
    inject_second_device_faults: Option<PathBuf>,
    /// Benchmarks and tests only: model a disk without power-loss
    /// protection, whose every flush takes this many more microseconds and
    /// holds up the reads and writes queued behind it on that device
    /// (docs/BENCHMARKS.md says which figures use it).
    #[arg(long, value_name = "MICROSECONDS")]
    model_flush_us: Option<u64>,
}

/// Runs an OSD as its flags say; returns only on a start-up error.
pub fn run(args: OsdArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file must not fill with escape codes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut monitors = Vec::new();
    for mon in &args.monitors {
        let (id, addr) = mon.split_once('=').with_context(|| format!("--mon {mon}: expected ID=IP:PORT"))?;
        monitors.push((id.parse().context("--mon: bad id")?, addr.parse().context("--mon: bad address")?));
    }
    let secret = std::fs::read(&args.secret_file).with_context(|| format!("reading {}", args.secret_file.display()))?;
    if secret.len() < 16 {
        bail!("the cluster secret must be at least 16 bytes");
    }
    if args.oplog_pg_bytes < duplex_oplog::MIN_REGION_BYTES {
        // Checked here: the log asserts it when a PG first opens, on a priority thread.
        bail!("--oplog-pg-bytes must be at least {} (got {})", duplex_oplog::MIN_REGION_BYTES, args.oplog_pg_bytes);
    }
    if args.oplog_pg_bytes < 1 << 20 {
        tracing::warn!(
            bytes = args.oplog_pg_bytes,
            "--oplog-pg-bytes below 1 MiB: image writes (pieces of up to 256 KiB; a log takes entries up to half its size) may be refused"
        );
    }
    let oplog_dir = match (&args.oplog_dir, args.oplog_mode) {
        (Some(dir), _) => dir.clone(),
        (None, OplogMode::Shm) => PathBuf::from(format!("/dev/shm/duplex-osd-{}", args.id)),
        (None, mode) => bail!("--oplog-dir is required with --oplog-mode {mode:?}"),
    };
    if args.data.len() > 2 {
        bail!("--data names the store's device, or a mirrored pair: at most two (got {})", args.data.len());
    }
    let data = args.data[0].clone();
    let mut config = OsdConfig::new(args.id, data.clone(), oplog_dir, monitors);
    config.oplog_mode = args.oplog_mode;
    config.oplog_pg_bytes = args.oplog_pg_bytes;
    config.fsid = duplex_proto::parse_fsid(&args.fsid).context("--fsid must be 32 hex digits")?;
    config.secret = secret;
    config.listen = args.listen;
    config.public_addr = args.public_addr;
    config.host = args.host.unwrap_or_else(|| format!("host-{}", args.id));
    config.admin = args.admin;
    config.admin_socket = match args.admin_socket {
        Some(path) if path.as_os_str() == "none" => None,
        Some(path) => Some(path),
        None => Some(config.oplog_dir.join("admin.sock")),
    };
    config.priority_threads = args.priority_threads;
    config.priority_cores = args.priority_cores;
    config.flush_threshold = args.flush_threshold;
    config.flush_timeout = Duration::from_micros(args.flush_timeout_us);
    config.write_path = args.write_path;
    config.threading = args.threading;
    config.pool_threads = args.pool_threads;
    if args.lcam_interval_ms == 0 {
        bail!("--lcam-interval-ms must be at least 1");
    }
    if args.connection_policy != ConnectionPolicy::Pinned && args.threading == Threading::Pool {
        bail!("--connection-policy lcam or naive needs --threading prioritized: the pool's messengers are its own");
    }
    if args.connection_policy != ConnectionPolicy::Pinned && args.threading == Threading::Lalca {
        bail!(
            "--threading lalca needs --connection-policy pinned: a PG's operations move between threads by their \
             PG's owner, not by their connection"
        );
    }
    config.connection_policy = args.connection_policy;
    config.lcam_interval = Duration::from_millis(args.lcam_interval_ms);
    config.scrub_interval = Duration::from_secs(args.scrub_interval_s);
    config.recovery_bytes_per_sec = args.recovery_bytes_per_sec;
    config.trims_per_sec = args.trims_per_sec;
    config.device_specs().context("--recovery-bytes-per-sec or --trims-per-sec")?;
    config.dedup_cold_after = Duration::from_secs(args.dedup_cold_s);

    let faults = watch_faults(args.inject_device_faults.as_ref())?;
    let mirror = match args.data.get(1) {
        Some(second) => {
            let mut mirror = duplex_store::mirror::MirrorConfig::new(second.clone(), args.data_mirror);
            mirror.region_bytes = args.mirror_region_kib << 10;
            mirror.clean_interval = Duration::from_millis(args.mirror_clean_ms);
            mirror.flush_slot = args.mirror_flush_device;
            mirror.check_at_mount = args.mirror_check_at_start;
            mirror.auto_swap = !args.mirror_fixed_roles;
            if mirror.flush_slot.is_some_and(|slot| slot > 1) {
                bail!("--mirror-flush-device is 0 or 1 (the device's place in --data)");
            }
            mirror.faults = [faults.clone(), watch_faults(args.inject_second_device_faults.as_ref())?];
            Some(mirror)
        }
        None if args.inject_second_device_faults.is_some() => {
            bail!("--inject-second-device-faults needs a second --data device")
        }
        None => None,
    };
    if let Some(us) = args.model_flush_us {
        tracing::warn!(flush_us = us, "the data device is modelled: every flush stalls it (benchmarks only)");
    }
    let store_config = StoreConfig {
        device: DeviceConfig {
            direct_io: if args.allow_buffered_io { DirectIo::Fallback } else { DirectIo::Require },
            // A mirror's devices have their own (`mirror.faults`).
            faults: if mirror.is_some() { None } else { faults },
            flush_stall: args.model_flush_us.map(Duration::from_micros),
            mirror,
            ..DeviceConfig::default()
        },
        ..StoreConfig::default()
    };
    if let Some(size) = args.mkfs_size {
        if !data.exists() {
            let options = MkfsOptions {
                partitions: args.mkfs_partitions,
                size_bytes: Some(size),
                bytes_per_onode: args.mkfs_bytes_per_onode,
                ..MkfsOptions::default()
            };
            duplex_store::mkfs(&data, &options, &store_config)
                .with_context(|| format!("formatting {}", data.display()))?;
            tracing::info!(path = %data.display(), size, mirrored = args.data.len() == 2, "formatted a new store");
        }
    }
    let running = crate::daemon::start(config, store_config)?;
    // One line on stdout that harnesses wait for.
    println!(
        "duplex-osd {} serving on {} admin {} replayed {}",
        args.id,
        running.addr,
        running.admin.map_or("-".into(), |a| a.to_string()),
        running.replayed
    );
    running.follow_forever();
    Ok(())
}

fn parse_mirror_mode(word: &str) -> Result<duplex_store::mirror::MirrorMode, String> {
    duplex_store::mirror::MirrorMode::parse(word).ok_or_else(|| format!("{word}: plain or read-flush-split"))
}

/// A device's simulated cache, armed by `trigger` (--inject-device-faults).
fn watch_faults(trigger: Option<&PathBuf>) -> Result<Option<std::sync::Arc<DeviceFaults>>> {
    let Some(trigger) = trigger else { return Ok(None) };
    let faults = DeviceFaults::new();
    faults.watch(trigger.clone()).context("starting the device-fault watcher")?;
    tracing::warn!(
        trigger = %trigger.display(),
        "device fault injection is on: the data device has a simulated volatile write cache"
    );
    Ok(Some(faults))
}
