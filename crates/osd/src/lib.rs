//! # duplex-osd: the decoupled write path
//!
//! An OSD serves the PGs the map gives it (DESIGN.md §4–6):
//!
//! - **Top half** ([`priority`]): priority threads, each an event loop over
//!   the connections it owns. A write is appended to its PG's operation log
//!   and index cache ([`pg`]), sent to the replicas on the thread's own peer
//!   connections, and acknowledged once every replica has logged it. No disk
//!   I/O happens on the way. Reads are served from the log when it covers
//!   them (R1), else handed to the bottom half (R2, or R3 after a flush).
//! - **Bottom half** ([`flusher`]): one non-priority thread per store
//!   partition applies logged entries to the store in batches (one device
//!   flush each) and trims the logs.
//! - [`ops`] is what an operation does, whichever thread runs it, so the
//!   ablation switches ([`config::WritePath`], [`config::Threading`]) change
//!   who does the work, not what is done.
//! - On start, [`replay`] applies every live log entry to the store before
//!   the OSD serves ([`daemon`]).
//! - [`peering`] brings a PG's members to one history whenever its
//!   interval changes, before the PG serves I/O: a sans-I/O machine, run by
//!   the [`peering_driver`] thread of the PG's primary; [`member`] is what
//!   each member's flusher does when asked.

pub mod alloc_count;
pub mod backfill;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod conn;
pub mod copies;
pub mod daemon;
pub mod flusher;
pub mod mailbox;
pub mod member;
pub mod metrics;
pub mod ops;
pub mod peering;
pub mod peering_driver;
pub mod pg;
pub mod priority;
pub mod replay;
pub mod requests;
pub mod stored_interval;
pub mod stored_requests;

/// A small store in a temporary directory, for unit tests of what the OSD
/// keeps in its store.
#[cfg(test)]
pub(crate) struct TestStore {
    _dir: tempfile::TempDir,
    pub path: std::path::PathBuf,
    pub config: duplex_store::StoreConfig,
}

#[cfg(test)]
impl TestStore {
    /// A 64 MiB store of `partitions` partitions (plain reads, no O_DIRECT).
    pub fn new(partitions: u32) -> TestStore {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let config = duplex_store::StoreConfig {
            device: duplex_store::DeviceConfig {
                backend: duplex_store::IoBackend::Pread,
                direct_io: duplex_store::DirectIo::Fallback,
                ..duplex_store::DeviceConfig::default()
            },
            ..duplex_store::StoreConfig::default()
        };
        let options = duplex_store::MkfsOptions {
            partitions,
            journal_bytes: Some(1 << 20),
            bytes_per_onode: 16 << 10,
            size_bytes: Some(64 << 20),
        };
        duplex_store::mkfs(&path, &options, &config).unwrap();
        TestStore { _dir: dir, path, config }
    }

    pub fn open(&self) -> duplex_store::Store {
        duplex_store::Store::open(&self.path, &self.config).unwrap()
    }
}
