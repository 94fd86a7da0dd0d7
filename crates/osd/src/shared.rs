//! What every thread of the OSD shares: its configuration, the PG table
//! (logs and index caches), the map, the metrics, the flushers' queues and
//! the monitors' lease.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_channel::Sender;
use duplex_map::OsdId;

use crate::cluster::{Lease, MapCell};
use crate::config::OsdConfig;
use crate::messages::{Job, ScrubRequests};
use crate::metrics::Metrics;
use crate::pg::PgTable;

/// State every thread of the OSD shares.
pub struct Shared {
    pub config: OsdConfig,
    pub pgs: Arc<PgTable>,
    pub map: Arc<MapCell>,
    pub metrics: Arc<Metrics>,
    /// One job queue per store partition (its flusher).
    pub flushers: Vec<Sender<Job>>,
    /// Set once the logs are replayed: until then, requests are answered Retry.
    pub serving: AtomicBool,
    /// Accepted connections open, over all priority threads.
    pub connections: AtomicUsize,
    /// Scrubs asked for (by an operator, or by a read that found a damaged
    /// block), for the peering thread to run.
    pub scrub_requests: ScrubRequests,
    /// Clients are served only under a lease from the monitors.
    pub lease: Arc<Lease>,
    /// The simulator's clock, set before each operation it runs (`None`:
    /// the wall clock). What reads it: an eventual PG's replication lag.
    pub virtual_now: Option<std::time::Instant>,
    /// Where a broken peer connection names its peer, for the suspects
    /// thread to probe (`suspects::watch_suspects`; unset: nobody probes).
    pub suspects: OnceLock<crossbeam_channel::Sender<OsdId>>,
    /// Clients' long polls on objects (`OpKind::Watch`).
    pub watchers: crate::watchers::Watchers,
    /// The snapshot trimmer's queue (`crate::trimmer`; unset: nobody trims,
    /// as in the simulator).
    pub snap_trims: OnceLock<crossbeam_channel::Sender<crate::trimmer::TrimJob>>,
    /// Erasure-coded objects with a mutation under way, and the client
    /// operations waiting for each (`crate::pg::object_queue`).
    pub ec_objects: std::sync::Mutex<crate::pg::object_queue::ObjectQueue<crate::messages::ClientOp>>,
    /// Wakes the deduplication agent (`crate::tier::agent`; unset: there
    /// is none, as in the simulator): a deduplicated PG's index is wanted,
    /// or a chunk waits to be promoted.
    pub tier_wake: OnceLock<crossbeam_channel::Sender<()>>,
    /// Which priority threads serve each connection, and what they carried.
    pub messenger: Arc<crate::io::messenger::Messenger>,
    /// `threading = lalca`: which priority thread owns each eventual PG now.
    pub owners: Option<crate::io::lalca::Owners>,
    /// Client QoS: the limiters of images with limits, shared by the
    /// priority threads (`crate::io::qos`).
    pub qos_limits: crate::io::qos::OsdLimits,
    /// Each priority thread's QoS classes, as it last published them (every
    /// `PENDING_CHECK` while scheduling is on): `duplex daemon SOCKET qos`.
    pub qos_views: Arc<crate::io::qos::QosViews>,
    next_txid: AtomicU64,
}

impl Shared {
    /// Now, on the clock the operations run on (the simulator's, in a simulation).
    pub fn now(&self) -> std::time::Instant {
        self.virtual_now.unwrap_or_else(std::time::Instant::now)
    }

    pub fn new(
        config: OsdConfig,
        pgs: Arc<PgTable>,
        map: Arc<MapCell>,
        metrics: Arc<Metrics>,
        flushers: Vec<Sender<Job>>,
        scrub_requests: ScrubRequests,
    ) -> Shared {
        Shared {
            messenger: Arc::new(crate::io::messenger::Messenger::new(
                config.connection_policy,
                config.priority_threads.max(1),
                config.lcam_interval,
            )),
            owners: (config.threading == crate::config::Threading::Lalca).then(Default::default),
            config,
            pgs,
            map,
            metrics,
            flushers,
            serving: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            scrub_requests,
            lease: Arc::new(Lease::default()),
            virtual_now: None,
            suspects: OnceLock::new(),
            watchers: Default::default(),
            snap_trims: OnceLock::new(),
            ec_objects: Default::default(),
            tier_wake: OnceLock::new(),
            qos_limits: Default::default(),
            qos_views: Default::default(),
            next_txid: AtomicU64::new(1),
        }
    }

    /// A transaction id unique in this process (replication and local sync applies).
    pub fn txid(&self) -> u64 {
        self.next_txid.fetch_add(1, Ordering::Relaxed)
    }

    /// The flusher of the store partition holding `pg`'s objects: the
    /// store's rule (`Store::partition_of`: key group modulo partitions).
    pub fn flusher_of(&self, pg: u32) -> &Sender<Job> {
        &self.flushers[self.partition_of(pg)]
    }

    /// The store partition (and flusher) that holds PG `pg`'s objects.
    pub fn partition_of(&self, pg: u32) -> usize {
        pg as usize % self.flushers.len()
    }

    /// A connection to peer `osd` broke: have its address probed (it may
    /// be gone). Never blocks: a full queue already has suspects to probe.
    pub fn suspect(&self, osd: OsdId) {
        if let Some(suspects) = self.suspects.get() {
            let _ = suspects.try_send(osd);
        }
    }

    /// Wakes the deduplication agent, if there is one. Never blocks.
    pub fn wake_tier(&self) {
        if let Some(wake) = self.tier_wake.get() {
            let _ = wake.try_send(());
        }
    }

    /// Queues `job` for `pg`'s flusher, waiting while its queue is full
    /// (the back-pressure; no PG lock may be held here: the flusher takes
    /// them). A flusher ends only at shutdown; a job then has no one left
    /// to do it.
    pub(crate) fn send_job(&self, pg: u32, job: Job) {
        let queue = self.flusher_of(pg);
        if let Err(crossbeam_channel::TrySendError::Full(job)) = queue.try_send(job) {
            self.metrics.flusher_queue_full.add(1);
            let _ = queue.send(job);
        }
    }
}
