//! How an OSD is set up: everything `duplex-osd`'s flags say, with the
//! defaults an operator gets when they say nothing.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Where PG operation logs live and what they survive (docs/OSD.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OplogMode {
    /// Files on a DRAM-backed tmpfs, mapped: survive a process crash, not a power loss.
    Shm,
    /// Files on persistent memory (DAX), mapped and flushed per append: survive both.
    #[value(alias = "dax")]
    Pmem,
    /// Files on a disk written with O_DSYNC: survive both, at a disk write per append.
    File,
}

/// When a write is acknowledged (the ablation switch of DESIGN.md §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WritePath {
    /// Once it is in every replica's operation log; the store is updated later.
    Oplog,
    /// Once every replica has applied it to its store and flushed, as a conventional OSD does.
    Sync,
    /// Benchmark only: once every replica has *received* it, storing nothing
    /// anywhere (no log, no store, no request ids). The limit a write path
    /// could reach on this network and these threads: the paper's "Ideal"
    /// (RTC-v3, Fig. 1). Data written this way is lost; reads return what
    /// was there before.
    Ideal,
}

/// Who runs an operation (the other ablation switch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Threading {
    /// The connection's own priority thread runs it to the end.
    Prioritized,
    /// The messenger thread queues it to a worker pool (sharded by PG, as
    /// Ceph's classic OSD does); replies go back through the messenger.
    Pool,
    /// As `prioritized`, with the threads pinned to cores, and an eventual
    /// pool's PG run by the one thread that owns it at the time, others
    /// forwarding its operations there (LALCA, `crate::io::lalca`).
    Lalca,
}

/// Which priority threads serve each connection (issue 29; docs/OSD.md,
/// "Connections and threads").
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ConnectionPolicy {
    /// One thread per connection, for its life (given out in turn).
    Pinned,
    /// Lock-contention-aware (the Async-LCAM paper): a busy connection
    /// gains threads each interval while they do not fight over its lock,
    /// and loses the one added last when they do.
    Lcam,
    /// Every thread serves every connection: the naive baseline the
    /// paper measures against.
    Naive,
}

#[derive(Clone, Debug)]
pub struct OsdConfig {
    pub id: u32,
    /// The object store's file or block device (made by `duplex-store mkfs`, or by `--mkfs`).
    pub data: PathBuf,
    pub oplog_mode: OplogMode,
    /// Directory of the per-PG log files.
    pub oplog_dir: PathBuf,
    /// Bytes of log per PG.
    pub oplog_pg_bytes: u64,
    pub monitors: Vec<(u64, SocketAddr)>,
    pub fsid: [u8; 16],
    pub secret: Vec<u8>,
    /// Where clients and peers connect.
    pub listen: SocketAddr,
    /// The address published in the map (defaults to `listen`'s).
    pub public_addr: Option<SocketAddr>,
    pub host: String,
    pub weight: u32,
    /// Prometheus metrics (`GET /metrics`), if set.
    pub admin: Option<SocketAddr>,
    /// The admin socket (`crate::admin_socket`): a Unix socket on this
    /// host for operator commands; None: none.
    pub admin_socket: Option<PathBuf>,
    pub priority_threads: usize,
    /// Cores to pin priority threads to, one each; empty: no pinning.
    pub priority_cores: Vec<usize>,
    /// Worker threads in `threading = pool` mode.
    pub pool_threads: usize,
    /// Log entries in a PG that wake its flusher at once.
    pub flush_threshold: usize,
    /// The longest an entry waits in the log before a flush starts.
    pub flush_timeout: Duration,
    pub write_path: WritePath,
    pub threading: Threading,
    pub connection_policy: ConnectionPolicy,
    /// `lcam`: how often connections are placed anew (the threshold is
    /// 10% of it).
    pub lcam_interval: Duration,
    pub heartbeat_interval: Duration,
    /// How often each PG this OSD is primary of is deep-scrubbed (its
    /// copies compared, reported, not repaired); zero: never.
    pub scrub_interval: Duration,
    /// The backfill class's limit at each flusher (flusher::device): bytes
    /// a second a backfill's requests read or write there, at the primary
    /// and at its targets (0: no limit). Client I/O goes on meanwhile; a
    /// higher rate moves data sooner and takes more of the disks and the
    /// network from it.
    pub recovery_bytes_per_sec: u64,
    /// The trim class's limit at each flusher: snapshot clones the
    /// trimmer deletes a second (0: no limit).
    pub trims_per_sec: u32,
    /// The deduplication tier's hotness rule: an object of a deduplicated
    /// pool is passed (its chunks moved to the chunk pool, evicted) once
    /// it has not been written for this long (docs/DEDUP.md).
    pub dedup_cold_after: Duration,
}

/// 128 MiB/s: a fraction of one NVMe drive's bandwidth, and a new OSD
/// still fills at about 450 GB an hour.
pub const DEFAULT_RECOVERY_BYTES_PER_SEC: u64 = 128 << 20;

/// 500 clone deletes a second: each is a replicated write, and a snapshot
/// of a large image leaves many.
pub const DEFAULT_TRIMS_PER_SEC: u32 = 500;

impl OsdConfig {
    /// The background classes' shares of each flusher, from the knobs.
    pub fn device_specs(&self) -> Result<crate::flusher::device::DeviceSpecs, crate::flusher::device::DeviceSpecError> {
        crate::flusher::device::DeviceSpecs::new(self.recovery_bytes_per_sec, self.trims_per_sec)
    }

    /// A configuration with the defaults, for the given identity and places.
    pub fn new(id: u32, data: PathBuf, oplog_dir: PathBuf, monitors: Vec<(u64, SocketAddr)>) -> OsdConfig {
        OsdConfig {
            id,
            data,
            oplog_mode: OplogMode::Shm,
            oplog_dir,
            oplog_pg_bytes: 2 << 20,
            monitors,
            fsid: [0; 16],
            secret: Vec::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            public_addr: None,
            host: "localhost".into(),
            weight: 1 << 16,
            admin: None,
            admin_socket: None,
            priority_threads: 1,
            priority_cores: Vec::new(),
            pool_threads: 2,
            flush_threshold: 16,
            flush_timeout: Duration::from_millis(1),
            write_path: WritePath::Oplog,
            threading: Threading::Prioritized,
            connection_policy: ConnectionPolicy::Pinned,
            lcam_interval: crate::io::lcam::DEFAULT_INTERVAL,
            heartbeat_interval: Duration::from_secs(1),
            scrub_interval: Duration::from_secs(7 * 24 * 3600),
            recovery_bytes_per_sec: DEFAULT_RECOVERY_BYTES_PER_SEC,
            trims_per_sec: DEFAULT_TRIMS_PER_SEC,
            dedup_cold_after: Duration::from_secs(30),
        }
    }
}
