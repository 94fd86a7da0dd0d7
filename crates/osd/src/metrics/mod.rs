//! The OSD's metrics, in Prometheus text format on the admin port.
//!
//! Counters are relaxed atomics. Latency histograms are hdrhistograms, one
//! set per recording thread behind an uncontended mutex (only a scrape
//! takes it from outside), merged when scraped.

pub mod alloc_count;
pub mod copies;

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;

/// Stages whose latency is recorded (microseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// From a request's arrival to the start of its processing.
    Queue = 0,
    /// Appending to the PG log and index (primary and replica).
    LogAppend = 1,
    /// Primary: from sending replication messages to the last ack.
    Replication = 2,
    /// One store batch: apply and flush.
    Flush = 3,
    /// Primary: a write from arrival to reply.
    Write = 4,
    /// Primary: a read from arrival to reply.
    Read = 5,
}

const STAGES: [(&str, Stage); 6] = [
    ("queue", Stage::Queue),
    ("log_append", Stage::LogAppend),
    ("replication", Stage::Replication),
    ("flush", Stage::Flush),
    ("write", Stage::Write),
    ("read", Stage::Read),
];

pub type Histograms = Arc<Mutex<Vec<Histogram<u64>>>>;

fn new_histograms() -> Histograms {
    Arc::new(Mutex::new(
        (0..STAGES.len()).map(|_| Histogram::new_with_bounds(1, 60_000_000, 2).expect("static bounds")).collect(),
    ))
}

#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

#[derive(Default)]
pub struct Metrics {
    pub writes: Counter,
    pub write_bytes: Counter,
    pub reads: Counter,
    pub read_bytes: Counter,
    pub truncates: Counter,
    /// Discards and write-zeroes inside objects (`Zero`).
    pub zeroes: Counter,
    pub deletes: Counter,
    pub reads_r1: Counter,
    /// Erasure-coded reads that decoded a missing data shard.
    pub degraded_reads: Counter,
    /// Erasure-coded writes that rewrote whole stripes around a missing shard.
    pub degraded_writes: Counter,
    pub reads_r2: Counter,
    pub reads_r3: Counter,
    pub replica_entries: Counter,
    pub errors: Counter,
    pub backpressure_waits: Counter,
    /// Eventual pools' writes acknowledged once logged here, and those that
    /// waited for their replicas because their PG's replication lag had
    /// reached the pool's max_lag.
    pub eventual_early_acks: Counter,
    pub eventual_lag_waits: Counter,
    /// `threading = lalca`: eventual PGs' client operations run on the
    /// thread that received them (it owned the PG, or took it), and those
    /// forwarded to the PG's owner.
    pub lalca_owned: Counter,
    pub lalca_forwarded: Counter,
    /// Client QoS: operations that went through a priority thread's
    /// scheduler, and those the OSD's limiter held back first.
    pub qos_scheduled: Counter,
    pub qos_limited: Counter,
    /// Per primary PG of an eventual pool: its replication lag and the
    /// writes only this OSD holds (kept by the peering thread's tick).
    pub eventual_lags: std::sync::Mutex<Vec<duplex_proto::osd::PgLagStat>>,
    /// Client writes refused because a member of their PG is full.
    pub full_refusals: Counter,
    /// Dead snapshot clones the trimmer sent to be deleted.
    pub snap_trims: Counter,
    /// The deduplication agent (crate::tier::agent): passes over objects,
    /// its I/Os (the rate control's unit), chunks put, bytes evicted from
    /// base objects, chunks promoted back, passes that found their object
    /// changed (or failed) and wait for another turn.
    pub dedup_passes: Counter,
    pub dedup_ios: Counter,
    pub dedup_chunks_put: Counter,
    pub dedup_bytes_evicted: Counter,
    pub dedup_promotions: Counter,
    pub dedup_stale_passes: Counter,
    /// Jobs that found their flusher's queue full (their producer waited).
    pub flusher_queue_full: Counter,
    pub flushes: Counter,
    pub flushed_entries: Counter,
    pub device_bytes_written: Counter,
    /// The store's device requests (io_uring SQEs or syscalls), by kind.
    pub store_writes: Counter,
    pub store_reads: Counter,
    pub store_flushes: Counter,
    /// Waits for the device: io_uring submissions, or syscalls.
    pub store_submissions: Counter,
    /// Bytes the store was asked to write (each copied once into its buffers).
    pub store_payload_bytes: Counter,
    /// Of the device bytes: journal records.
    pub store_journal_bytes: Counter,
    /// Of the device bytes: deferred blocks written back by checkpoints.
    pub store_deferred_bytes: Counter,
    pub connections_refused: Counter,
    /// Logged operations the store refused at flush time (dropped).
    pub dropped_entries: Counter,
    /// Live log entries a flush could not turn into a store operation (their PG stops at them).
    pub unflushable_entries: Counter,
    /// Resent mutations answered from the request table, not applied again.
    pub duplicate_requests: Counter,
    /// Replicated entries refused: they reuse a logged seq from a newer
    /// interval (the replica's log diverged from the primary's).
    pub diverged_entries: Counter,
    /// Replica PGs found waiting more than 5 s on a sequence gap.
    pub stalled_replica_pgs: Counter,
    /// Store operations recovery applied here (pushed objects, removals).
    pub recovery_ops: Counter,
    /// Object copies found damaged here (a block failed its checksum).
    pub damaged_objects: Counter,
    /// Walks of a partition's index for `df` (`OsdUsage`; at most one per
    /// partition a second, however often it is asked).
    pub usage_walks: Counter,
    /// Stray copies removed (PGs this OSD held for no one any more), and their objects.
    pub stray_pgs_removed: Counter,
    pub stray_objects_removed: Counter,
    /// Inconsistent objects deep scrubs found, and bad copies repaired.
    pub scrub_inconsistent: Counter,
    pub scrub_repaired: Counter,
    /// Peering runs of this OSD's primary PGs: finished active, or stuck.
    pub peerings_active: Counter,
    pub peerings_stuck: Counter,
    /// Objects this OSD's primaries copied or removed to recover members.
    pub recovered_objects: Counter,
    /// Client operations answered `Retry` because their PG was peering.
    pub peering_retries: Counter,
    /// Client operations answered `Retry` because this OSD held no lease.
    pub lease_refusals: Counter,
    /// Reads answered `Retry` because a write to their object was not yet on every replica.
    pub uncommitted_retries: Counter,
    /// Writes answered `Retry` because their object was being copied to a backfill target.
    pub backfill_retries: Counter,
    /// Writes sent to backfill targets without their data, ahead of the
    /// walk that copies it (crate::pg::elide).
    pub backfill_elided_writes: Counter,
    /// Background backfill by this OSD's primaries: objects and bytes
    /// copied (bytes once per target), and PGs backfilled to the end.
    pub backfill_objects: Counter,
    pub backfill_bytes: Counter,
    pub backfilled_pgs: Counter,
    /// Peering requests a flusher took ahead of client work (their PG was
    /// not active here).
    pub urgent_peer_requests: Counter,
    /// Background requests the flushers' device schedulers served, and
    /// their cost units (4 KiB), by class (flusher::device::DeviceClass).
    pub background_served: [Counter; 4],
    pub background_cost: [Counter; 4],
    /// Background requests waiting in the flushers' device queues, by class.
    pub background_queued: [AtomicU64; 4],
    /// This OSD's primary PGs with backfill targets still to fill.
    pub backfilling_pgs: AtomicU64,
    /// This OSD's primary PGs not active right now (peering or stuck).
    pub inactive_pgs: AtomicU64,
    /// Metadata operations (stat, attributes, listings, creates).
    pub metadata_ops: Counter,
    pub log_entries: AtomicU64,
    /// The store's data capacity and bytes in use (flushers keep it current).
    pub store_capacity_bytes: AtomicU64,
    pub store_used_bytes: AtomicU64,
    /// Each store partition's use, per mille (its flusher keeps it): the
    /// fullest one decides the OSD's fullness, since one full partition
    /// stops its flushes.
    pub partition_used_permille: [AtomicU64; duplex_store::MAX_PARTITIONS as usize],
    /// A partition whose last flush met ENOSPC from the store: until a
    /// flush goes through, it counts as wholly used, so the OSD reports
    /// itself full (writes to its PGs are refused, `duplex status` says
    /// HEALTH_ERR) instead of retrying in silence.
    pub partition_out_of_space: [std::sync::atomic::AtomicBool; duplex_store::MAX_PARTITIONS as usize],
    /// Each store partition's onode slots, and those in use (its flusher
    /// keeps them), and those its PGs' logs may still need
    /// (`Pg::reserved_onode_slots`; the peering thread sums them): objects
    /// take slots as well as data blocks, and many small ones run out of
    /// slots first.
    pub partition_onode_slots: [AtomicU64; duplex_store::MAX_PARTITIONS as usize],
    pub partition_used_onode_slots: [AtomicU64; duplex_store::MAX_PARTITIONS as usize],
    pub partition_reserved_onode_slots: [AtomicU64; duplex_store::MAX_PARTITIONS as usize],
    /// Flushes that met ENOSPC from the store.
    pub flush_no_space: Counter,
    /// Bytes the PG logs hold (entries not yet in the store), and the
    /// request-id records their first flush allocates: the store keeps
    /// room for them (they count toward the OSD's fullness).
    pub log_reserved_bytes: AtomicU64,
    /// This OSD's own fullness is `full`: its primary PGs refuse writes at
    /// once, before the map says so.
    pub locally_full: std::sync::atomic::AtomicBool,
    /// The map's ratios as this OSD last judged its fullness against them
    /// (nearfull, backfillfull, full; per mille), and the state it found
    /// (0 normal, 1 near full, 2 backfill full, 3 full): kept by the
    /// peering thread's tick.
    pub full_ratios: [AtomicU64; 3],
    pub fullness_state: AtomicU64,
    /// The store's mirrored pair, when it is on one (set once at start).
    pub mirror: std::sync::OnceLock<Arc<duplex_store::mirror::Mirror>>,
    /// The priority threads' connections (set once at start).
    pub messenger: std::sync::OnceLock<Arc<crate::io::messenger::Messenger>>,
    histograms: Mutex<Vec<Histograms>>,
}

/// A mirrored store's gauges and counters (docs/STORE.md, "Mirrored devices").
fn render_mirror(out: &mut String, status: &duplex_store::mirror::MirrorStatus) {
    let failed = status.health.iter().filter(|h| **h != duplex_store::mirror::Health::InSync).count();
    let gauges = [
        (
            "duplex_osd_mirror_failed_devices",
            "Devices of the store's mirror that are out (1: degraded, replace it).",
            failed as u64,
        ),
        (
            "duplex_osd_mirror_flush_device",
            "The device (0 or 1, in --data's order) that takes the commits' flushes.",
            u64::from(status.flush_slot),
        ),
        (
            "duplex_osd_mirror_dirty_regions",
            "Regions the two devices may differ in (what a resync after a crash copies).",
            status.dirty_regions,
        ),
        (
            "duplex_osd_mirror_resynced_regions",
            "Regions the last start copied to bring the devices together.",
            status.resynced_regions,
        ),
        (
            "duplex_osd_mirror_rebuild_regions_left",
            "Regions a replaced device still has to be filled with (0: no rebuild under way).",
            status.rebuild.map_or(0, |r| r.regions - r.regions_copied),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
    }
    let _ = writeln!(
        out,
        "# HELP duplex_osd_mirror_reads_total Store reads by device.\n# TYPE duplex_osd_mirror_reads_total counter"
    );
    for (device, reads) in status.reads.iter().enumerate() {
        let _ = writeln!(out, "duplex_osd_mirror_reads_total{{device=\"{device}\"}} {reads}");
    }
    let _ = writeln!(
        out,
        "# HELP duplex_osd_mirror_flush_seconds Each device's flushes, a moving average.\n# TYPE duplex_osd_mirror_flush_seconds gauge"
    );
    for (device, micros) in status.flush_micros.iter().enumerate() {
        let _ = writeln!(out, "duplex_osd_mirror_flush_seconds{{device=\"{device}\"}} {:.6}", *micros as f64 / 1e6);
    }
    let counters = [
        (
            "duplex_osd_mirror_reads_redirected_total",
            "Reads sent to the flush device while the read device flushed.",
            status.reads_redirected,
        ),
        (
            "duplex_osd_mirror_cleans_total",
            "Flushes of both devices that let clean regions' bits clear.",
            status.cleans,
        ),
        (
            "duplex_osd_mirror_repaired_blocks_total",
            "Blocks that failed their checksum on one device, read from the other and rewritten.",
            status.repaired_blocks,
        ),
        ("duplex_osd_mirror_swaps_total", "Role swaps because the flush device turned slow.", status.swaps),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
}

impl Metrics {
    /// Devices of the store's mirror that are out (0 without a mirror).
    pub fn mirror_failed_devices(&self) -> u64 {
        self.mirror.get().map_or(0, |mirror| {
            mirror.status().health.iter().filter(|h| **h != duplex_store::mirror::Health::InSync).count() as u64
        })
    }

    /// The use of the store's fullest partition, per mille.
    pub fn fullest_partition_permille(&self) -> u64 {
        self.partition_used_permille.iter().map(|p| p.load(std::sync::atomic::Ordering::Relaxed)).max().unwrap_or(0)
    }

    /// The OSD's fullness, per mille: its fullest partition's use plus the
    /// room kept for what the PG logs hold (every logged write must find
    /// room when it is flushed), in data blocks or in onode slots,
    /// whichever is fuller.
    pub fn fullness_permille(&self) -> u64 {
        let capacity = self.store_capacity_bytes.load(std::sync::atomic::Ordering::Relaxed).max(1);
        let reserved = self.log_reserved_bytes.load(std::sync::atomic::Ordering::Relaxed);
        let reserved_permille = (u128::from(reserved) * 1000 / u128::from(capacity)).min(1000) as u64;
        let data = (self.fullest_partition_permille() + reserved_permille).min(1000);
        data.max(self.onode_fullness_permille())
    }

    /// The onode slots of the fullest partition that are in use or kept
    /// for its PGs' logs, per mille.
    pub fn onode_fullness_permille(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let partitions = self.partition_onode_slots.iter().zip(&self.partition_used_onode_slots);
        partitions
            .zip(&self.partition_reserved_onode_slots)
            .filter_map(|((slots, used), reserved)| {
                let slots = slots.load(Relaxed);
                let taken = used.load(Relaxed).saturating_add(reserved.load(Relaxed));
                (slots > 0).then(|| (u128::from(taken) * 1000 / u128::from(slots)).min(1000) as u64)
            })
            .max()
            .unwrap_or(0)
    }

    /// The eventual PGs' lags for `OsdStats`: the largest, at most as many
    /// as one reply carries.
    pub fn lags_reported(&self) -> Vec<duplex_proto::osd::PgLagStat> {
        let mut lags = self.eventual_lags.lock().expect("metrics lock").clone();
        lags.sort_unstable_by_key(|l| (std::cmp::Reverse(l.lag_us), l.pg));
        lags.truncate(duplex_proto::osd::MAX_LAGS_REPORTED);
        lags
    }

    /// A histogram set for one thread to record into.
    pub fn histograms(&self) -> Histograms {
        let set = new_histograms();
        self.histograms.lock().expect("metrics lock").push(set.clone());
        set
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, labels: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (label, value) in labels {
                let _ = writeln!(out, "{name}{label} {value}");
            }
        };
        counter(
            &mut out,
            "duplex_osd_ops_total",
            "Client operations served as primary.",
            &[
                ("{op=\"write\"}", self.writes.get()),
                ("{op=\"read\"}", self.reads.get()),
                ("{op=\"truncate\"}", self.truncates.get()),
                ("{op=\"zero\"}", self.zeroes.get()),
                ("{op=\"delete\"}", self.deletes.get()),
            ],
        );
        counter(
            &mut out,
            "duplex_osd_op_bytes_total",
            "Client bytes written and read.",
            &[("{op=\"write\"}", self.write_bytes.get()), ("{op=\"read\"}", self.read_bytes.get())],
        );
        counter(
            &mut out,
            "duplex_osd_reads_by_path_total",
            "Reads by where they were served: r1 log, r2 store, r3 flush then store.",
            &[
                ("{path=\"r1\"}", self.reads_r1.get()),
                ("{path=\"r2\"}", self.reads_r2.get()),
                ("{path=\"r3\"}", self.reads_r3.get()),
            ],
        );
        counter(
            &mut out,
            "duplex_osd_ec_degraded_total",
            "Erasure-coded operations that decoded around a missing shard.",
            &[("{op=\"read\"}", self.degraded_reads.get()), ("{op=\"write\"}", self.degraded_writes.get())],
        );
        counter(
            &mut out,
            "duplex_osd_replica_entries_total",
            "Entries logged as a replica.",
            &[("", self.replica_entries.get())],
        );
        counter(
            &mut out,
            "duplex_osd_op_errors_total",
            "Operations answered with an error.",
            &[("", self.errors.get())],
        );
        counter(
            &mut out,
            "duplex_osd_backpressure_waits_total",
            "Writes that waited for a flush because their PG's log was full.",
            &[("", self.backpressure_waits.get())],
        );
        counter(
            &mut out,
            "duplex_osd_eventual_writes_total",
            "Eventual pools' writes by when they were acknowledged: once logged at the primary, or after their replicas (their PG's replication lag had reached max_lag).",
            &[("{ack=\"logged\"}", self.eventual_early_acks.get()), ("{ack=\"replicated\"}", self.eventual_lag_waits.get())],
        );
        counter(
            &mut out,
            "duplex_osd_lalca_ops_total",
            "threading=lalca: eventual PGs' client operations by where they ran: on the thread that received them (it owned the PG), or forwarded to the PG's owner.",
            &[("{ran=\"received\"}", self.lalca_owned.get()), ("{ran=\"forwarded\"}", self.lalca_forwarded.get())],
        );
        counter(
            &mut out,
            "duplex_osd_qos_ops_total",
            "Client operations QoS took: through a priority thread's scheduler (the map has QoS settings), and those of them the OSD's limiter held first (a client beyond its image's limit).",
            &[("{by=\"scheduler\"}", self.qos_scheduled.get()), ("{by=\"limiter\"}", self.qos_limited.get())],
        );
        {
            let lags = self.eventual_lags.lock().expect("metrics lock");
            type Value = fn(&duplex_proto::osd::PgLagStat) -> f64;
            let gauges: [(&str, &str, Value); 2] = [
                (
                    "duplex_osd_pg_replication_lag_seconds",
                    "Per primary PG of an eventual pool: the age of the oldest acknowledged write a replica lacks.",
                    |lag| lag.lag_us as f64 / 1e6,
                ),
                (
                    "duplex_osd_pg_unreplicated_writes",
                    "Per primary PG of an eventual pool: acknowledged writes a replica lacks.",
                    |lag| lag.unreplicated as f64,
                ),
            ];
            for (name, help, value) in gauges {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
                for lag in lags.iter() {
                    let (pool, pg) = (crate::pg::pool_of(lag.pg), crate::pg::pg_number(lag.pg));
                    let _ = writeln!(out, "{name}{{pg=\"{pool}.{pg}\"}} {}", value(lag));
                }
            }
        }
        counter(
            &mut out,
            "duplex_osd_full_refusals_total",
            "Client writes refused (NoSpace, ENOSPC at the client) because a member of their PG is full.",
            &[("", self.full_refusals.get())],
        );
        counter(
            &mut out,
            "duplex_osd_snap_trims_total",
            "Dead snapshot clones the background trimmer sent to be deleted.",
            &[("", self.snap_trims.get())],
        );
        for (name, help, value) in [
            ("duplex_osd_dedup_passes_total", "Deduplication engine passes over objects.", &self.dedup_passes),
            (
                "duplex_osd_dedup_ios_total",
                "The deduplication engine's I/Os (the unit its rate control counts).",
                &self.dedup_ios,
            ),
            ("duplex_osd_dedup_chunks_put_total", "Chunks the engine put into chunk pools.", &self.dedup_chunks_put),
            (
                "duplex_osd_dedup_bytes_evicted_total",
                "Bytes the engine evicted from base objects (their chunks live in the chunk pool).",
                &self.dedup_bytes_evicted,
            ),
            (
                "duplex_osd_dedup_promotions_total",
                "Evicted chunks written back into their objects before a client changed them.",
                &self.dedup_promotions,
            ),
            (
                "duplex_osd_dedup_stale_passes_total",
                "Engine passes that found their object changed (or failed) and wait for another turn.",
                &self.dedup_stale_passes,
            ),
        ] {
            counter(&mut out, name, help, &[("", value.get())]);
        }
        counter(
            &mut out,
            "duplex_osd_flusher_queue_full_total",
            "Jobs that found their flusher's queue full: their producer (a priority thread) waited, and stopped reading its sockets meanwhile.",
            &[("", self.flusher_queue_full.get())],
        );
        counter(
            &mut out,
            "duplex_osd_flushes_total",
            "Store batches applied by flushers.",
            &[("", self.flushes.get())],
        );
        counter(
            &mut out,
            "duplex_osd_flushed_entries_total",
            "Log entries applied to the store (divide by flushes for the batch size).",
            &[("", self.flushed_entries.get())],
        );
        counter(
            &mut out,
            "duplex_osd_dropped_entries_total",
            "Logged operations the store refused when flushing them (an attribute over its object's budget).",
            &[("", self.dropped_entries.get())],
        );
        counter(
            &mut out,
            "duplex_osd_unflushable_entries_total",
            "Log entries a flush could not make a store operation of: their PG stops serving (a bug; mark the OSD out).",
            &[("", self.unflushable_entries.get())],
        );
        counter(
            &mut out,
            "duplex_osd_flush_no_space_total",
            "Flushes the store refused for want of space (the OSD then reports itself full until one goes through).",
            &[("", self.flush_no_space.get())],
        );
        counter(
            &mut out,
            "duplex_osd_diverged_entries_total",
            "Replicated entries refused because they reuse a logged seq from a newer interval (diverged logs).",
            &[("", self.diverged_entries.get())],
        );
        counter(
            &mut out,
            "duplex_osd_stalled_replica_pgs_total",
            "Times a replica PG waited over 5 s for entries it missed (its primary must re-peer it).",
            &[("", self.stalled_replica_pgs.get())],
        );
        counter(
            &mut out,
            "duplex_osd_recovery_ops_total",
            "Store operations recovery applied on this OSD (objects pushed to it, removals).",
            &[("", self.recovery_ops.get())],
        );
        counter(
            &mut out,
            "duplex_osd_damaged_objects_total",
            "Object copies on this OSD found damaged (a data block failed its checksum) by a read or a scrub.",
            &[("", self.damaged_objects.get())],
        );
        counter(
            &mut out,
            "duplex_osd_stray_removed_total",
            "Stray copies removed from this OSD (PGs clean on their own OSDs without it), and their objects.",
            &[
                ("{what=\"pgs\"}", self.stray_pgs_removed.get()),
                ("{what=\"objects\"}", self.stray_objects_removed.get()),
            ],
        );
        counter(
            &mut out,
            "duplex_osd_usage_walks_total",
            "Walks of a store partition's index to answer `duplex df` (at most one per partition a second).",
            &[("", self.usage_walks.get())],
        );
        counter(
            &mut out,
            "duplex_osd_scrub_objects_total",
            "Deep scrubs of this OSD's primary PGs: objects whose copies disagreed, and bad copies repaired.",
            &[
                ("{result=\"inconsistent\"}", self.scrub_inconsistent.get()),
                ("{result=\"repaired\"}", self.scrub_repaired.get()),
            ],
        );
        counter(
            &mut out,
            "duplex_osd_peerings_total",
            "Peering runs of PGs this OSD is primary of, by outcome.",
            &[("{outcome=\"active\"}", self.peerings_active.get()), ("{outcome=\"stuck\"}", self.peerings_stuck.get())],
        );
        counter(
            &mut out,
            "duplex_osd_recovered_objects_total",
            "Objects this OSD's primaries copied or removed to bring members up to date.",
            &[("", self.recovered_objects.get())],
        );
        counter(
            &mut out,
            "duplex_osd_uncommitted_read_retries_total",
            "Reads answered Retry because a write to their object was not yet on every replica.",
            &[("", self.uncommitted_retries.get())],
        );
        counter(
            &mut out,
            "duplex_osd_backfill_write_retries_total",
            "Writes answered Retry because their object was being copied to a backfill target.",
            &[("", self.backfill_retries.get())],
        );
        counter(
            &mut out,
            "duplex_osd_backfill_elided_writes_total",
            "Writes sent to backfill targets without their data, ahead of the walk that copies it.",
            &[("", self.backfill_elided_writes.get())],
        );
        counter(
            &mut out,
            "duplex_osd_backfill_objects_total",
            "Objects this OSD's primaries copied to backfill targets in the background.",
            &[("", self.backfill_objects.get())],
        );
        counter(
            &mut out,
            "duplex_osd_backfill_bytes_total",
            "Bytes this OSD's primaries copied to backfill targets in the background (once per target).",
            &[("", self.backfill_bytes.get())],
        );
        counter(
            &mut out,
            "duplex_osd_backfilled_pgs_total",
            "PGs whose backfill targets this OSD's primaries filled completely.",
            &[("", self.backfilled_pgs.get())],
        );
        counter(
            &mut out,
            "duplex_osd_urgent_peer_requests_total",
            "Peering requests of PGs not active here, which the flushers took ahead of client work.",
            &[("", self.urgent_peer_requests.get())],
        );
        let by_class = |counters: &[Counter; 4]| {
            crate::flusher::device::DeviceClass::ALL
                .iter()
                .map(|class| (format!("{{class=\"{}\"}}", class.name()), counters[*class as usize].get()))
                .collect::<Vec<_>>()
        };
        let served = by_class(&self.background_served);
        let cost = by_class(&self.background_cost);
        counter(
            &mut out,
            "duplex_osd_background_requests_total",
            "Background requests the flushers served after client work, by class (backfill, scrub, trim, strays).",
            &served.iter().map(|(label, n)| (label.as_str(), *n)).collect::<Vec<_>>(),
        );
        counter(
            &mut out,
            "duplex_osd_background_cost_total",
            "Cost units (4 KiB read or written) of the background requests the flushers served, by class.",
            &cost.iter().map(|(label, n)| (label.as_str(), *n)).collect::<Vec<_>>(),
        );
        counter(
            &mut out,
            "duplex_osd_peering_retries_total",
            "Client operations answered Retry because their PG was peering.",
            &[("", self.peering_retries.get())],
        );
        counter(
            &mut out,
            "duplex_osd_lease_refusals_total",
            "Client operations answered Retry because this OSD held no lease from the monitors.",
            &[("", self.lease_refusals.get())],
        );
        counter(
            &mut out,
            "duplex_osd_duplicate_requests_total",
            "Resent mutations answered without applying them again.",
            &[("", self.duplicate_requests.get())],
        );
        counter(
            &mut out,
            "duplex_osd_metadata_ops_total",
            "Stats, attribute operations, listings and pre-allocated creates.",
            &[("", self.metadata_ops.get())],
        );
        counter(
            &mut out,
            "duplex_osd_device_bytes_written_total",
            "Bytes the store wrote to its device (data, journal, metadata).",
            &[("", self.device_bytes_written.get())],
        );
        counter(
            &mut out,
            "duplex_osd_store_requests_total",
            "Device requests of the store by kind (io_uring entries or syscalls), and the submissions that carried them.",
            &[
                ("{kind=\"write\"}", self.store_writes.get()),
                ("{kind=\"read\"}", self.store_reads.get()),
                ("{kind=\"flush\"}", self.store_flushes.get()),
                ("{kind=\"submission\"}", self.store_submissions.get()),
            ],
        );
        counter(
            &mut out,
            "duplex_osd_store_journal_bytes_total",
            "Of the device bytes written: the store's journal records.",
            &[("", self.store_journal_bytes.get())],
        );
        counter(
            &mut out,
            "duplex_osd_store_deferred_writeback_bytes_total",
            "Of the device bytes written: blocks changed through the journal, written back by checkpoints.",
            &[("", self.store_deferred_bytes.get())],
        );
        let mut copies: Vec<(String, u64)> = crate::metrics::copies::SITES
            .iter()
            .map(|(name, site)| (format!("{{site=\"{name}\"}}"), crate::metrics::copies::bytes(*site)))
            .collect();
        copies.push(("{site=\"store\"}".into(), self.store_payload_bytes.get()));
        let copies: Vec<(&str, u64)> = copies.iter().map(|(label, value)| (label.as_str(), *value)).collect();
        counter(
            &mut out,
            "duplex_osd_payload_bytes_copied_total",
            "Bytes of operation payload copied in memory, by where (the store's copy into its block buffers is `store`).",
            &copies,
        );
        if let Some(allocations) = crate::metrics::alloc_count::allocations() {
            counter(
                &mut out,
                "duplex_process_allocations_total",
                "Heap allocations by this process (reallocations included).",
                &[("", allocations)],
            );
        }
        counter(
            &mut out,
            "duplex_osd_connections_refused_total",
            "Connections dropped for failing the handshake or sending malformed frames.",
            &[("", self.connections_refused.get())],
        );
        let _ = writeln!(
            out,
            "# HELP duplex_osd_background_queued Background requests waiting in the flushers' device queues, by class.\n# TYPE duplex_osd_background_queued gauge"
        );
        for class in crate::flusher::device::DeviceClass::ALL {
            let queued = self.background_queued[class as usize].load(Relaxed);
            let _ = writeln!(out, "duplex_osd_background_queued{{class=\"{}\"}} {queued}", class.name());
        }
        let gauges: [(&str, &str, u64); 10] = [
            ("duplex_osd_log_entries", "Live entries in all PG logs.", self.log_entries.load(Relaxed)),
            (
                "duplex_osd_backfilling_pgs",
                "PGs this OSD is primary of with backfill targets still to fill.",
                self.backfilling_pgs.load(Relaxed),
            ),
            (
                "duplex_osd_inactive_pgs",
                "PGs this OSD is primary of that are not active (peering or stuck).",
                self.inactive_pgs.load(Relaxed),
            ),
            ("duplex_osd_store_capacity_bytes", "Data capacity of the store.", self.store_capacity_bytes.load(Relaxed)),
            ("duplex_osd_store_used_bytes", "Store data bytes in use.", self.store_used_bytes.load(Relaxed)),
            (
                "duplex_osd_log_reserved_bytes",
                "Bytes the PG logs hold and their PGs' request-id records not yet allocated, kept free in the store for their flush.",
                self.log_reserved_bytes.load(Relaxed),
            ),
            (
                "duplex_osd_fullness_permille",
                "The OSD's fullness, per mille: its fullest partition's use plus the room kept for its logs (judged against the full ratios).",
                self.fullness_permille(),
            ),
            (
                "duplex_osd_store_onode_permille",
                "The onode slots (objects' metadata) of the store's fullest partition in use or kept for its PG logs, per mille (part of the fullness).",
                self.onode_fullness_permille(),
            ),
            (
                "duplex_osd_log_reserved_onode_slots",
                "Onode slots the PG logs' entries may still need when they are flushed, kept free in the store.",
                self.partition_reserved_onode_slots.iter().map(|r| r.load(Relaxed)).sum::<u64>(),
            ),
            (
                "duplex_osd_store_fullest_partition_permille",
                "The store's data blocks its fullest partition can no longer get, per mille (the part of the fullness that is not the logs').",
                self.fullest_partition_permille(),
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP duplex_osd_fullness_state The OSD's fullness against the map's ratios: 0 normal, 1 near full, 2 backfill full (backfill into it waits), 3 full (client writes to its PGs refused).\n# TYPE duplex_osd_fullness_state gauge\nduplex_osd_fullness_state {}",
            self.fullness_state.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP duplex_osd_full_ratio_permille The map's full ratios this OSD judges its fullness against, per mille.\n# TYPE duplex_osd_full_ratio_permille gauge"
        );
        for (ratio, value) in ["nearfull", "backfillfull", "full"].iter().zip(&self.full_ratios) {
            let _ = writeln!(out, "duplex_osd_full_ratio_permille{{ratio=\"{ratio}\"}} {}", value.load(Relaxed));
        }
        // One look at /proc for every thread's CPU, used twice below.
        let threads = thread_cpu_seconds();
        if let Some(messenger) = self.messenger.get() {
            messenger.render(&mut out, &threads);
        }
        if let Some(mirror) = self.mirror.get() {
            render_mirror(&mut out, &mirror.status());
        }
        let _ = writeln!(out, "# HELP duplex_osd_cpu_seconds_total CPU time by thread class.\n# TYPE duplex_osd_cpu_seconds_total counter");
        for (class, seconds) in cpu_seconds_by_class(&threads) {
            let _ = writeln!(out, "duplex_osd_cpu_seconds_total{{class=\"{class}\"}} {seconds:.3}");
        }
        let mut merged: Vec<Histogram<u64>> =
            (0..STAGES.len()).map(|_| Histogram::new_with_bounds(1, 60_000_000, 2).expect("static bounds")).collect();
        for set in self.histograms.lock().expect("metrics lock").iter() {
            for (into, from) in merged.iter_mut().zip(set.lock().expect("histogram lock").iter()) {
                let _ = into.add(from);
            }
        }
        let _ = writeln!(
            out,
            "# HELP duplex_osd_latency_seconds Per-stage latency.\n# TYPE duplex_osd_latency_seconds summary"
        );
        for ((name, _), histogram) in STAGES.iter().zip(&merged) {
            for quantile in [0.5, 0.99, 0.999] {
                let _ = writeln!(
                    out,
                    "duplex_osd_latency_seconds{{stage=\"{name}\",quantile=\"{quantile}\"}} {:.6}",
                    histogram.value_at_quantile(quantile) as f64 / 1e6
                );
            }
            let sum: f64 =
                histogram.iter_recorded().map(|v| v.value_iterated_to() as f64 * v.count_at_value() as f64).sum();
            let _ = writeln!(out, "duplex_osd_latency_seconds_sum{{stage=\"{name}\"}} {:.6}", sum / 1e6);
            let _ = writeln!(out, "duplex_osd_latency_seconds_count{{stage=\"{name}\"}} {}", histogram.len());
        }
        out
    }
}

/// Records `micros` for `stage` in a thread's histogram set.
pub fn record(set: &Histograms, stage: Stage, micros: u64) {
    if let Ok(mut set) = set.lock() {
        let _ = set[stage as usize].record(micros.max(1));
    }
}

/// The class of a thread, from the name the daemon gave it.
pub fn thread_class(name: &str) -> &'static str {
    if name.starts_with("osd-prio") {
        "priority"
    } else if name.starts_with("osd-flush") {
        "non_priority"
    } else if name.starts_with("osd-pool") {
        "pool_worker"
    } else {
        "other"
    }
}

/// CPU seconds (user + system) by thread class. The named classes come
/// from /proc/self/task/*/stat; "other" is the process total (which keeps
/// the time of threads that have ended) less those, so it holds the main
/// and monitor threads and the kernel's io_uring workers (`iou-wrk-*`),
/// which come and go with the store's I/O.
pub fn cpu_seconds_by_class(threads: &[(String, f64)]) -> Vec<(&'static str, f64)> {
    let mut totals: Vec<(&'static str, f64)> =
        ["priority", "non_priority", "pool_worker", "other"].iter().map(|c| (*c, 0.0)).collect();
    let process =
        std::fs::read_to_string("/proc/self/stat").ok().and_then(|s| stat_seconds(&s)).map_or(0.0, |(_, s)| s);
    let mut named = 0.0;
    for (name, secs) in threads {
        let class = thread_class(name);
        if class == "other" {
            continue;
        }
        named += secs;
        if let Some(slot) = totals.iter_mut().find(|(c, _)| *c == class) {
            slot.1 += secs;
        }
    }
    if let Some(slot) = totals.iter_mut().find(|(c, _)| *c == "other") {
        slot.1 = (process - named).max(0.0);
    }
    totals
}

/// CPU seconds (user + system) of each live thread of this process, by name.
pub fn thread_cpu_seconds() -> Vec<(String, f64)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok().and_then(|s| stat_seconds(&s)))
        .collect()
}

/// A `stat` line's command name and CPU seconds.
fn stat_seconds(stat: &str) -> Option<(String, f64)> {
    // SAFETY: sysconf has no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let (name, rest) = parse_stat(stat)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After "(comm)": state is field 3; utime and stime are fields 14 and 15.
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    Some((name.to_string(), (user + system) / ticks))
}

fn parse_stat(stat: &str) -> Option<(&str, &str)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    Some((stat.get(open + 1..close)?, stat.get(close + 1..)?))
}

/// Serves `GET /metrics` (any path, in fact) until the process ends.
/// (The log gauges are kept by the peering thread's tick.)
pub fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new().name("osd-admin".into()).spawn(move || {
        alloc_count::uncounted_thread();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let mut line = String::new();
            if BufReader::new(&stream).read_line(&mut line).is_err() {
                continue;
            }
            let body = metrics.render();
            let _ = write!(
                stream,
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    })?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fullness_state_and_the_ratios_it_was_judged_by_are_exported() {
        let metrics = Metrics::default();
        for (gauge, ratio) in metrics.full_ratios.iter().zip([850, 900, 950]) {
            gauge.store(ratio, Relaxed);
        }
        metrics.fullness_state.store(2, Relaxed);
        let page = metrics.render();
        for line in [
            "duplex_osd_fullness_state 2",
            "duplex_osd_full_ratio_permille{ratio=\"nearfull\"} 850",
            "duplex_osd_full_ratio_permille{ratio=\"backfillfull\"} 900",
            "duplex_osd_full_ratio_permille{ratio=\"full\"} 950",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} missing from:\n{page}");
        }
    }
}
