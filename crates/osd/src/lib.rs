//! # duplex-osd: the decoupled write path
//!
//! An OSD serves the PGs the map gives it (DESIGN.md §4–6). Its folders
//! are its concerns:
//!
//! - **[`io`]: the top half.** Priority threads, each an event loop over
//!   the connections it owns. A write is appended to its PG's operation log
//!   and index cache ([`pg`]), sent to the replicas on the thread's own
//!   peer connections, and acknowledged once every replica has logged it.
//!   No disk I/O happens on the way. Reads are served from the log when it
//!   covers them (R1), else handed to the bottom half (R2, or R3 after a
//!   flush). [`io::ops`] is what an operation does, whichever thread runs
//!   it, so the ablation switches ([`config::WritePath`],
//!   [`config::Threading`]) change who does the work, not what is done.
//! - **[`flusher`]: the bottom half.** One non-priority thread per store
//!   partition applies logged entries to the store in batches (one device
//!   flush each) and trims the logs; it also answers peering requests for
//!   its PGs ([`flusher::member`]).
//! - **[`pg`]:** a PG's log, index cache, request-id table and interval
//!   records, and the replay of the logs at start ([`pg::replay`]).
//! - **[`peering`]:** brings a PG's members to one history whenever its
//!   interval changes, before the PG serves I/O: sans-I/O machines
//!   (peering, recovery, scrub, backfill) run by the peering thread of the
//!   PG's primary ([`peering::driver`]).
//! - [`tier`]: a deduplicated pool's chunk index at its primaries, and the
//!   agent that moves its objects' chunks to their chunk pool.
//! - [`messages`]: every message between those threads; [`shared`]: the
//!   state they share; [`cluster`]: the map, the lease and the monitors;
//!   [`metrics`]; [`daemon`]: starts it all.

pub mod admin_socket;
pub mod backend;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod flusher;
pub mod io;
pub mod messages;
pub mod metrics;
pub mod peering;
pub mod pg;
pub mod shared;
pub mod snaps;
pub mod suspects;
pub mod tier;
pub mod trimmer;
pub mod watchers;

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

/// An OSD's boot as a test map records it: on its own host, weight 1.
#[cfg(test)]
pub(crate) fn test_boot(id: u32) -> duplex_map::Command {
    duplex_map::Command::OsdBoot {
        id,
        addr: format!("127.0.0.1:{}", 7000 + id),
        host: format!("h{id}"),
        weight: 1 << 16,
    }
}

/// A map of `osds` OSDs, up and each on its own host, and pool 1 "rbd" of
/// 2 copies over `pg_num` PGs (none with 0), for unit tests.
#[cfg(test)]
pub(crate) fn test_map(osds: u32, pg_num: u32) -> duplex_map::ClusterMap {
    let mut map = duplex_map::ClusterMap::new([0; 16]);
    for id in 0..osds {
        map.run(&test_boot(id)).unwrap();
    }
    if pg_num > 0 {
        map.run(&duplex_map::Command::PoolCreate { name: "rbd".into(), size: 2, min_size: 1, pg_num }).unwrap();
    }
    map
}
