//! The bottom half: one non-priority thread per store partition
//! (DESIGN.md §6). It owns the partition and is the only thread that does
//! store I/O. It sleeps until a PG reaches the flush threshold, a read
//! needs the store, or the oldest unflushed entry has waited the flush
//! timeout; then it applies the logged entries of its dirty PGs to the
//! store in batches (one device flush each), trims the logs and index
//! caches, and posts completions to the priority threads.

pub mod device;
pub mod held;
pub mod member;
pub mod strays;
pub mod syncer;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use duplex_oplog::Entry;
use duplex_proto::osd::{
    encode_attrs, encode_names, CloneInfo, ObjectStat, OpKind, OpReply, PgUsage, SnapDiff, SnapList, Status,
    UsageReply, LIST_LIMIT, MAX_CLONES_LISTED, RESERVED_NAME_BYTE,
};
use duplex_proto::peering::{PeerOp, PeerRequest};
use duplex_store::{Batch, Key, Op, Partition, ReadRequest, StoreError};

use crate::messages::{
    ClientSlot, Completion, Job, Mailbox, PeerReplyTo, ReadJob, ScrubAsk, ScrubRequests, SyncDone, UsageTo,
    FLUSHER_QUEUE,
};
use crate::metrics::{record, Metrics, Stage};
use crate::pg::replay::{entry_needs_apply, store_ops};
use crate::pg::{Ack, PgTable};
use crate::snaps::{Batches, Planner};

/// Entries per store batch; a flush of more takes several batches.
pub const FLUSH_BATCH: usize = 128;
/// After a flush the store refused (not a device error), the next attempt
/// (not a hot loop).
const FLUSH_RETRY: Duration = Duration::from_secs(1);
/// The exit status of an OSD whose data device failed (sysexits' EX_IOERR).
pub const DEVICE_FAILED_EXIT: i32 = 74;

pub struct Flusher {
    /// This OSD's id (peering tells a backfill target by it).
    pub id: u32,
    pub partition: Partition,
    pub jobs: Receiver<Job>,
    pub pgs: Arc<PgTable>,
    pub mailboxes: Vec<Mailbox>,
    pub metrics: Arc<Metrics>,
    pub timeout: Duration,
    /// Where a read that finds a damaged block asks for its PG's repair.
    pub scrub_requests: ScrubRequests,
    /// When each PG's repair was last asked for (a copy no member holds
    /// intact must not loop: reads then fail with `Io`).
    pub repairs_asked: HashMap<u32, Instant>,
    /// Heads written under snapshots, as the last flush left them
    /// (crate::snaps::HeadCache); dropped by any other store change.
    pub snap_heads: crate::snaps::HeadCache,
    /// Where the commits' device flushes go, so that reads go on meanwhile
    /// (None: they block this thread, as the simulator wants).
    pub syncer: Option<syncer::Syncer>,
    /// The background classes' shares of this flusher ([`device`]).
    pub device: device::DeviceSpecs,
    /// Bytes its scrubs' digest pages read, since the start: a page pays
    /// for what the pages before it read.
    pub scrub_read_bytes: u64,
}

/// Background work, queued by class in [`Pending`]'s device queue.
pub enum Background {
    /// A backfill's lock or a scrub's page, of a PG active here, and when
    /// it was taken.
    Peer(PeerRequest, PeerReplyTo, Instant),
    /// A batch of the snapshot trimmer's, answered after a flush.
    TrimScan(crate::messages::TrimScan),
    /// A removal batch of stray copies ([`strays`]).
    Strays,
}

/// A PG asked for repair this recently is not asked again.
const REPAIR_BACKOFF: Duration = Duration::from_secs(10);

/// A partition walks its index for `df` at most once in this long.
pub const USAGE_REUSE: Duration = Duration::from_secs(1);

/// The work a flusher has taken and not yet done, and its gauges' last
/// readings. [`Flusher::run`] keeps one; a simulator drives
/// [`Flusher::take`] and [`Flusher::step`] with its own clock instead.
pub struct Pending {
    reads: Vec<ReadJob>,
    /// Reads the store answers only after the flush (`Flusher::read_now`).
    after_flush: Vec<ReadJob>,
    /// Peering requests of PGs not active here, activations, and a
    /// backfill's join ([`Flusher::is_urgent`]): their PG serves no client
    /// (or holds its writes) until they are done, so they go ahead of
    /// client work (issue 31).
    urgent: Vec<(PeerRequest, PeerReplyTo)>,
    /// The other peering requests of active PGs (a backfill's steps under
    /// its lock, listings): after client work, in the step that took them.
    prompt: Vec<(PeerRequest, PeerReplyTo)>,
    /// The background (a backfill's locks, a scrub's pages, trim scans,
    /// stray removal), by class: after client work, one request a step.
    device: device::DeviceQueue<Background>,
    /// Bytes the backfills pulled here since the last lock was queued: the
    /// next lock's cost.
    backfill_owed: u64,
    /// `Flusher::scrub_read_bytes` when a scrub page was last queued.
    scrub_charged: u64,
    syncs: Vec<(Entry, SyncDone)>,
    dirty: BTreeSet<u32>,
    deadline: Option<Instant>,
    flush_now: bool,
    /// The store's counters when the metrics last took them.
    counted: duplex_store::PartitionStats,
    used: u64,
    /// The last walk of the partition for a `df` (`OsdUsage`), and when.
    usage: Option<(Instant, Vec<PgUsage>)>,
    /// Stray copies being removed ([`strays`]).
    strays: Option<strays::StrayWork>,
    /// Whether the device queue holds the request for their next batch.
    stray_batch_queued: bool,
    tier_loads: Vec<crate::messages::TierLoad>,
    /// This flusher's share of `Metrics::background_queued`, as last published.
    queued_published: [u64; 4],
}

impl Pending {
    /// When the flusher next has work without another job (None: not
    /// before one comes): a flush, or background work.
    pub fn deadline(&self) -> Option<Instant> {
        match (self.deadline, self.device.next_at()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn flush_due(&self, now: Instant) -> bool {
        self.flush_now || self.deadline.is_some_and(|d| now >= d)
    }

    /// Every dirty PG has a flush coming: now, or at the deadline.
    fn dirty_is_due(&self) -> bool {
        self.dirty.is_empty() || self.flush_now || self.deadline.is_some()
    }

    /// Whether `step` has work to do at once.
    pub fn is_ready(&self, now: Instant) -> bool {
        self.flush_due(now)
            || !self.syncs.is_empty()
            || !self.reads.is_empty()
            || !self.after_flush.is_empty()
            || !self.urgent.is_empty()
            || !self.prompt.is_empty()
            || self.device.next_at().is_some_and(|at| at <= now)
    }

    /// Background requests queued, of `class`.
    pub fn background_queued(&self, class: device::DeviceClass) -> usize {
        self.device.queued(class)
    }
}

impl Flusher {
    /// Starts the partition's gauges; the work list for `take` and `step`.
    pub fn start(&self) -> Pending {
        assert!(!self.mailboxes.is_empty(), "a flusher with no priority thread to answer");
        let counted = self.partition.stats();
        // The partitions share the store's data space: one of them counts it.
        if self.partition.index() == 0 {
            let total = self.partition.data_blocks() * duplex_store::BLOCK_SIZE as u64;
            self.metrics.store_capacity_bytes.fetch_add(total, std::sync::atomic::Ordering::Relaxed);
        }
        let used = self.partition.used_blocks() * duplex_store::BLOCK_SIZE as u64;
        self.metrics.store_used_bytes.fetch_add(used, std::sync::atomic::Ordering::Relaxed);
        self.publish_use();
        Pending {
            reads: Vec::new(),
            after_flush: Vec::new(),
            urgent: Vec::new(),
            prompt: Vec::new(),
            device: device::DeviceQueue::new(&self.device),
            backfill_owed: 0,
            scrub_charged: self.scrub_read_bytes,
            syncs: Vec::new(),
            dirty: BTreeSet::new(),
            deadline: None,
            flush_now: false,
            counted,
            used,
            usage: None,
            strays: None,
            stray_batch_queued: false,
            queued_published: [0; 4],
            tier_loads: Vec::new(),
        }
    }

    /// What each PG holds in this partition, for an operator's `df`. The
    /// per-PG figures come from a walk of the partition's index
    /// (O(objects), on the thread that flushes): askers within
    /// [`USAGE_REUSE`] of the last walk get its figures, so a client that
    /// asks in a loop cannot keep the flusher walking. The store's totals
    /// are always current.
    pub fn usage(&self, pending: &mut Pending, now: Instant) -> UsageReply {
        let recent = pending.usage.as_ref().filter(|(at, _)| now.saturating_duration_since(*at) < USAGE_REUSE);
        let pgs = match recent {
            Some((_, pgs)) => pgs.clone(),
            None => {
                let pgs: Vec<PgUsage> = self
                    .partition
                    .usage_by_group()
                    .into_iter()
                    .map(|g| PgUsage {
                        pg: g.group,
                        objects: g.objects,
                        logical_bytes: g.logical_bytes,
                        allocated_bytes: g.allocated_bytes,
                    })
                    .collect();
                self.metrics.usage_walks.add(1);
                pending.usage = Some((now, pgs.clone()));
                pgs
            }
        };
        let block = duplex_store::BLOCK_SIZE as u64;
        let reply = UsageReply {
            partition: self.partition.index(),
            partitions: self.partition.partition_count(),
            capacity_bytes: self.partition.data_blocks() * block,
            used_bytes: self.partition.used_blocks() * block,
            pgs,
            onode_slots: self.partition.onode_slots(),
            used_onode_slots: self.partition.used_onode_slots(),
        };
        debug_assert!(reply.partition < reply.partitions, "partition {} of {}", reply.partition, reply.partitions);
        reply
    }

    /// How near this partition is to refusing a flush, per mille, for the
    /// OSD's fullness: the store's data blocks it can no longer get (used
    /// by any partition, or free in another's chunks) over all of them;
    /// 1000 while a flush is refused for want of space.
    fn publish_use(&self) {
        let data_blocks = self.partition.data_blocks().max(1);
        let index = self.partition.index() as usize;
        let out_of_space = self.metrics.partition_out_of_space[index].load(std::sync::atomic::Ordering::Relaxed);
        let used_permille = if out_of_space {
            1000
        } else {
            (data_blocks - self.partition.free_blocks().min(data_blocks)) * 1000 / data_blocks
        };
        debug_assert!(index < self.metrics.partition_used_permille.len(), "partition {index} past MAX_PARTITIONS");
        self.metrics.partition_used_permille[index].store(used_permille, std::sync::atomic::Ordering::Relaxed);
        let slots = self.partition.onode_slots();
        self.metrics.partition_onode_slots[index].store(slots, std::sync::atomic::Ordering::Relaxed);
        let used = self.partition.used_onode_slots();
        self.metrics.partition_used_onode_slots[index].store(used, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs until every job sender is gone; returns the partition to close.
    pub fn run(mut self) -> Partition {
        let histograms = self.metrics.histograms();
        let mut pending = self.start();
        loop {
            let kept = self.syncer.as_mut().map(|syncer| std::mem::take(&mut syncer.kept)).unwrap_or_default();
            if !kept.is_empty() {
                let now = Instant::now();
                for job in kept {
                    self.take(job, &mut pending, now);
                }
                self.step(&mut pending, &histograms, now);
                continue;
            }
            let first = match pending.deadline() {
                None => match self.jobs.recv() {
                    Ok(job) => Some(job),
                    Err(_) => return self.partition,
                },
                Some(deadline) => match self.jobs.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(job) => Some(job),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return self.partition,
                },
            };
            let now = Instant::now();
            // At most a queue's worth at a time: the work in hand stays
            // bounded, and what waits stays in the bounded queue, where it
            // holds back its producers.
            for job in first.into_iter().chain(self.jobs.try_iter().take(FLUSHER_QUEUE)) {
                self.take(job, &mut pending, now);
            }
            self.step(&mut pending, &histograms, now);
        }
    }

    /// One pass over the work taken, as of `now`: the peering requests of
    /// inactive PGs, then reads, the flush if one is due, sync applies,
    /// and one background request if its class may go ([`device`]).
    pub fn step(&mut self, pending: &mut Pending, histograms: &crate::metrics::Histograms, now: Instant) {
        // An inactive PG's clients all wait on its peering, which waits on
        // these, one round trip at a time: each would otherwise wait behind
        // this step's reads and flush (milliseconds under load), and a
        // peering takes several. A query fences its PG here first; a read
        // of that PG in this step, admitted while it was active, then reads
        // the store after the query applied the log, as a read taken in the
        // next step would.
        for (request, to) in std::mem::take(&mut pending.urgent) {
            self.answer_peer(request, to);
        }
        let client_reads = pending.reads.len();
        // Reads first: most need no flush (the log's entries for their
        // object lay on the store's bytes), and none of those waits behind
        // one, which on a disk without power-loss protection takes
        // milliseconds (issue 28).
        if !pending.reads.is_empty() {
            for read in self.read_now(std::mem::take(&mut pending.reads)) {
                pending.dirty.insert(read.pg);
                pending.flush_now = true;
                pending.after_flush.push(read);
            }
        }
        if pending.flush_due(now) {
            self.flush_dirty(pending, histograms, now);
        }
        if !pending.syncs.is_empty() {
            let started = Instant::now();
            self.apply_syncs(std::mem::take(&mut pending.syncs));
            record(histograms, Stage::Flush, started.elapsed().as_micros() as u64);
        }
        if !pending.after_flush.is_empty() {
            let reads = std::mem::take(&mut pending.after_flush);
            let held = reads
                .iter()
                .map(|r| if r.flush_first && r.snap == 0 { self.held_entries(r.pg, &r.object) } else { vec![] })
                .collect();
            self.read(reads, held);
        }
        for load in std::mem::take(&mut pending.tier_loads) {
            match self.tier_index(load.pg) {
                Ok(loaded) => {
                    if let Some(pg) = self.pgs.get(load.pg) {
                        crate::tier::install(&pg, load.interval, loaded, now);
                    }
                }
                // Asked again by the next write or engine turn after a while.
                Err(err) => tracing::warn!(pg = load.pg, %err, "loading a deduplicated PG's index failed"),
            }
        }
        // After the client work: the steps of active PGs' backfills under
        // their locks (each flushes its PG itself where it must).
        for (request, to) in std::mem::take(&mut pending.prompt) {
            self.answer_peer(request, to);
        }
        // Then the background: one request, if its class may go. What this
        // step did for clients (its store writes, which only this thread
        // makes, in 4 KiB units, and its reads) is their share.
        if pending.device.next_at().is_some() {
            let stats = self.partition.stats();
            let ops = stats.ops.saturating_sub(pending.counted.ops);
            let written = stats.user_bytes_written.saturating_sub(pending.counted.user_bytes_written);
            let client_cost = (ops.max(written.div_ceil(4096)) + client_reads as u64) as f64;
            if let Some((class, work, cost)) = pending.device.next(now, client_cost) {
                debug_assert!(cost >= 1.0, "{class:?} served at cost {cost}");
                self.metrics.background_served[class as usize].add(1);
                self.metrics.background_cost[class as usize].add(cost as u64);
                self.serve_background(work, pending, histograms, now);
            }
        }
        let now = self.partition.stats();
        let (was, metrics) = (&pending.counted, &self.metrics);
        metrics.device_bytes_written.add(now.io.bytes_written.saturating_sub(was.io.bytes_written));
        metrics.store_writes.add(now.io.writes.saturating_sub(was.io.writes));
        metrics.store_reads.add(now.io.reads.saturating_sub(was.io.reads));
        metrics.store_flushes.add(now.io.flushes.saturating_sub(was.io.flushes));
        metrics.store_submissions.add(now.io.submissions.saturating_sub(was.io.submissions));
        metrics.store_payload_bytes.add(now.user_bytes_written.saturating_sub(was.user_bytes_written));
        metrics.store_journal_bytes.add(now.journal_bytes_written.saturating_sub(was.journal_bytes_written));
        metrics.store_deferred_bytes.add(now.deferred_bytes_written.saturating_sub(was.deferred_bytes_written));
        pending.counted = now;
        // This partition's share of the OSD's used bytes, as a delta.
        let now_used = self.partition.used_blocks() * duplex_store::BLOCK_SIZE as u64;
        let gauge = &self.metrics.store_used_bytes;
        gauge.fetch_add(now_used.wrapping_sub(pending.used), std::sync::atomic::Ordering::Relaxed);
        pending.used = now_used;
        self.publish_use();
        if !pending.device.is_empty() || pending.queued_published != [0; 4] {
            for class in device::DeviceClass::ALL {
                let (queued, was) =
                    (pending.device.queued(class) as u64, &mut pending.queued_published[class as usize]);
                let gauge = &self.metrics.background_queued[class as usize];
                gauge.fetch_add(queued.wrapping_sub(*was), std::sync::atomic::Ordering::Relaxed);
                *was = queued;
            }
        }
        debug_assert!(pending.dirty_is_due(), "a dirty PG with no flush due: its entries would wait for ever");
    }

    /// Applies the dirty PGs' entries to the store (the flush `step` makes
    /// when one is due).
    fn flush_dirty(&mut self, pending: &mut Pending, histograms: &crate::metrics::Histograms, now: Instant) {
        let started = Instant::now();
        let flushed = self.flush_each(std::mem::take(&mut pending.dirty));
        record(histograms, Stage::Flush, started.elapsed().as_micros() as u64);
        pending.deadline = None;
        pending.flush_now = false;
        let refilled = match flushed {
            Ok(refilled) => refilled,
            Err(failed) => {
                // The entries stay in their logs: try these PGs again later.
                pending.dirty.extend(failed);
                pending.deadline = Some(now + FLUSH_RETRY);
                Vec::new()
            }
        };
        // Replica entries that waited for room went into the logs this
        // flush trimmed: they need a flush of their own, at once if
        // more are still waiting (their primary waits for the acks).
        // (A deadline, not `flush_now`: the loop blocks for jobs unless one is set.)
        for (pg, more_waiting) in refilled {
            pending.dirty.insert(pg);
            let due = if more_waiting { now } else { now + self.timeout };
            pending.deadline = Some(pending.deadline.map_or(due, |d| d.min(due)));
        }
    }

    /// Carries out one background request the device queue chose.
    fn serve_background(
        &mut self,
        work: Background,
        pending: &mut Pending,
        histograms: &crate::metrics::Histograms,
        now: Instant,
    ) {
        match work {
            Background::Peer(request, to, taken) => {
                let waited = now.saturating_duration_since(taken);
                if waited > device::STALE_AFTER {
                    // Its requester may have given up and gone on.
                    tracing::warn!(pg = request.pg, ?waited, op = ?request.op, "a background request waited too long");
                    let why = format!("waited {waited:?} for its turn on the device");
                    self.send_peer_reply(duplex_proto::peering::PeerReply::Refused(why), to);
                } else {
                    // (A lock flushes its PG itself where it must.)
                    self.answer_peer(request, to);
                }
            }
            Background::TrimScan(scan) => {
                // After a flush: a clone that an entry in the log makes is seen.
                pending.dirty.insert(scan.pg);
                self.flush_dirty(pending, histograms, now);
                let dead = self
                    .dead_clones(scan.pg, &scan.prefix, &scan.live, scan.after.as_ref(), scan.limit)
                    .map_err(|err| err.to_string());
                debug_assert!(
                    dead.as_ref().map_or(true, |dead| scan.limit == 0 || dead.len() <= scan.limit),
                    "a scan past its limit"
                );
                let _ = scan.reply.send(dead);
            }
            Background::Strays => self.remove_strays(pending, now),
        }
    }

    /// Takes one job into `pending`, as of `now`.
    pub fn take(&self, job: Job, pending: &mut Pending, now: Instant) {
        match job {
            Job::Dirty(pg) => {
                pending.dirty.insert(pg);
                pending.deadline.get_or_insert(now + self.timeout);
            }
            Job::Flush(pg) => {
                pending.dirty.insert(pg);
                pending.flush_now = true;
            }
            // A read that needs the flush asks for it when `step` finds so.
            Job::Read(read) => pending.reads.push(read),
            Job::SyncApply { entry, done } => pending.syncs.push((entry, done)),
            Job::Peer { request, reply } if self.is_urgent(&request) => {
                self.metrics.urgent_peer_requests.add(1);
                pending.urgent.push((request, reply));
            }
            Job::Peer { request, reply } => match device::peer_class(&request.op) {
                None => {
                    if let PeerOp::Pull { len, .. } = &request.op {
                        pending.backfill_owed += u64::from(*len);
                    }
                    pending.prompt.push((request, reply));
                }
                // Peers are one request out each (a primary's peering
                // thread waits on its answer): more than this is a
                // misbehaving peer, refused rather than kept.
                Some(_) if pending.device.len() >= device::QUEUE_MAX => {
                    let why = format!("{} background requests wait here already", device::QUEUE_MAX);
                    self.send_peer_reply(duplex_proto::peering::PeerReply::Refused(why), reply);
                }
                Some(class) => {
                    self.let_go_before_waiting(&request);
                    let bytes = match class {
                        device::DeviceClass::Scrub => self
                            .scrub_read_bytes
                            .saturating_sub(std::mem::replace(&mut pending.scrub_charged, self.scrub_read_bytes)),
                        _ => std::mem::take(&mut pending.backfill_owed),
                    };
                    pending.device.push(class, Background::Peer(request, reply, now), duplex_qos::cost(bytes), now);
                }
            },
            Job::Strays(view) => self.take_strays(view, pending, now),
            Job::TrimScan(scan) => {
                // It pays for the deletes the scan before it led to.
                let cost = scan.deletes_before.max(1) as f64;
                pending.device.push(device::DeviceClass::Trim, Background::TrimScan(scan), cost, now);
            }
            Job::TierLoad(load) => {
                // After a flush: the store holds every entry's effect.
                pending.dirty.insert(load.pg);
                pending.flush_now = true;
                pending.tier_loads.push(load);
            }
            Job::Usage(to) => {
                let reply = self.usage(pending, now);
                match to {
                    UsageTo::Local(sender) => {
                        let _ = sender.send(reply);
                    }
                    UsageTo::Remote(to) => self.send_frame(&to, reply.to_frame(to.txid)),
                }
            }
        }
        debug_assert!(pending.dirty_is_due(), "a dirty PG with no flush due: its entries would wait for ever");
    }

    /// A walk asks for its next lock only once it is done with the one it
    /// holds (whose chunk it left equal, or whose object it left, on
    /// every target): that one is let go now, not after the new one's
    /// wait in the device queue, so that no lock is held through it. A
    /// walk asking for the range it holds again (the last answer was
    /// Busy) keeps it: new writes to it wait meanwhile, as they should.
    fn let_go_before_waiting(&self, request: &PeerRequest) {
        let PeerOp::BackfillLock { object: Some(object), start, end } = &request.op else { return };
        let Some(pg) = self.pgs.get(request.pg) else { return };
        let mut guard = pg.lock().expect("PG lock");
        let same =
            guard.backfill_lock.as_ref().is_some_and(|(held, s, e)| held[..] == object[..] && s == start && e == end);
        if !same && guard.active.as_ref().is_some_and(|a| a.interval == request.interval) {
            guard.backfill_lock = None;
        }
    }

    /// Whether a peering request goes ahead of client work: a query (it
    /// starts a peering), an activation, a backfill's join (it holds its
    /// PG's client writes: pg/elide.rs), or any request of a PG that is
    /// not active here (peering, or a recovery inside it: below min_size a
    /// PG is never active). A backfill's other requests, and a scrub's,
    /// come to active PGs.
    fn is_urgent(&self, request: &PeerRequest) -> bool {
        // A join holds its PG's client writes; an activation (peering's,
        // or a join's) is what a PG or a join waits on.
        matches!(
            request.op,
            PeerOp::Query | PeerOp::Activate { .. } | PeerOp::BackfillJoin { .. } | PeerOp::BackfillJoined
        ) || self.pgs.get(request.pg).is_none_or(|pg| pg.lock().expect("PG lock").active.is_none())
    }

    fn answer_peer(&mut self, request: PeerRequest, to: PeerReplyTo) {
        let reply = self.peer_request(request);
        self.send_peer_reply(reply, to);
    }

    fn send_peer_reply(&self, reply: duplex_proto::peering::PeerReply, to: PeerReplyTo) {
        match to {
            PeerReplyTo::Local(sender) => {
                let _ = sender.send(reply);
            }
            PeerReplyTo::Remote(to) => self.send_frame(&to, reply.to_frame(to.txid)),
        }
    }

    /// Sends `frame` on the connection a remote request came on, through
    /// the priority thread that owns it.
    fn send_frame(&self, to: &crate::pg::ReplyTo, frame: duplex_proto::Frame) {
        debug_assert!(to.thread < self.mailboxes.len(), "an answer for thread {}", to.thread);
        self.mailboxes[to.thread].post_and_wake(Completion::Send { token: to.token, frame });
    }

    /// Applies the live entries of `dirty` PGs, then trims them.
    /// Returns the PGs whose logs took waiting replica entries after the
    /// trim, and whether more still wait; or, when the store failed, the
    /// PGs to flush again (nothing was trimmed).
    pub(crate) fn flush(&mut self, dirty: BTreeSet<u32>) -> Result<Vec<(u32, bool)>, Vec<u32>> {
        let flushed = self.flush_passes(dirty);
        self.note_space(matches!(flushed, Err(Refused { no_space: true, .. })));
        flushed.map_err(|refused| refused.pgs)
    }

    /// [`Flusher::flush`] of every PG in `dirty`; one whose entries the
    /// store has no room for holds back only itself. A flush is applied in
    /// batches that mix PGs, so when it is refused for want of space each
    /// PG is flushed again alone: those whose entries need no new room
    /// (deletes, discards, overwrites in place) go through and free room,
    /// instead of waiting behind another PG's new data for ever (issue 24).
    pub(crate) fn flush_each(&mut self, dirty: BTreeSet<u32>) -> Result<Vec<(u32, bool)>, Vec<u32>> {
        let flushed = match self.flush_passes(dirty) {
            Err(Refused { pgs, no_space: true }) if pgs.len() > 1 => {
                let (mut refilled, mut stuck, mut no_space) = (Vec::new(), Vec::new(), false);
                for pg in pgs {
                    match self.flush_passes(BTreeSet::from([pg])) {
                        Ok(more) => refilled.extend(more),
                        Err(refused) => {
                            no_space |= refused.no_space;
                            stuck.extend(refused.pgs);
                        }
                    }
                }
                if stuck.is_empty() {
                    Ok(refilled)
                } else {
                    tracing::error!(
                        partition = self.partition.index(),
                        pgs = ?stuck,
                        flushed = refilled.len(),
                        "these PGs' log entries do not fit in the store; the partition's other PGs flushed"
                    );
                    // Their refilled logs are dirty and flush with the stuck ones' retry.
                    stuck.extend(refilled.iter().map(|(pg, _)| *pg));
                    Err(Refused { pgs: stuck, no_space })
                }
            }
            other => other,
        };
        self.note_space(matches!(flushed, Err(Refused { no_space: true, .. })));
        flushed.map_err(|refused| refused.pgs)
    }

    /// The store refused a flush (`no_space`: for want of room), or took
    /// one again: the partition's fullness follows, loudly when it changes.
    fn note_space(&self, no_space: bool) {
        let index = self.partition.index() as usize;
        if self.metrics.partition_out_of_space[index].swap(no_space, std::sync::atomic::Ordering::Relaxed) != no_space {
            if no_space {
                tracing::error!(
                    partition = index,
                    "the store is out of space: this OSD reports itself full until a flush goes through"
                );
            } else {
                tracing::warn!(partition = index, "the store took a flush again: no longer out of space");
            }
            self.publish_use();
        }
    }

    fn flush_passes(&mut self, mut dirty: BTreeSet<u32>) -> Result<Vec<(u32, bool)>, Refused> {
        // A pass stops a PG's entries where one needs the store to have
        // applied the ones before (Planner::needs_apply): it goes on with
        // those PGs at once, so that a flush leaves no live entry (reads
        // after a flush, and peering, count on it).
        let mut refilled: Vec<(u32, bool)> = Vec::new();
        loop {
            let (more, cut) = match self.flush_pass(dirty) {
                Ok(pass) => pass,
                Err(mut refused) => {
                    // Earlier passes' refilled logs need their flush too.
                    refused.pgs.extend(refilled.iter().map(|(pg, _)| *pg));
                    refused.pgs.sort_unstable();
                    refused.pgs.dedup();
                    return Err(refused);
                }
            };
            refilled.extend(more);
            if cut.is_empty() {
                return Ok(refilled);
            }
            dirty = cut;
        }
    }

    /// One pass of [`Flusher::flush`]; also returns the PGs it stopped
    /// short of their log's end.
    fn flush_pass(&mut self, dirty: BTreeSet<u32>) -> Result<FlushPass, Refused> {
        // Per PG: the last seq taken; the entries themselves become store ops.
        let mut taken = Vec::new();
        let mut cut = BTreeSet::new();
        let mut ops = Vec::new();
        // Taken: a flush that fails leaves it empty.
        let mut planner = Planner::with_cache(std::mem::take(&mut self.snap_heads));
        for key in dirty {
            let Some(pg) = self.pgs.get(key) else { continue };
            let mut guard = pg.lock().expect("PG lock");
            guard.dirty = false;
            let before = ops.len();
            // The log holds the entries after the store's newest.
            let (first, mut last) = (guard.flushed_through() + 1, 0);
            // An erasure-coded tail not every shard holds waits (Pg::apply_limit).
            let limit = guard.apply_limit;
            let mut fence = false;
            for entry in guard.log.entries() {
                let seq = last.max(first - 1) + 1;
                if seq > limit {
                    break;
                }
                let entry = match entry {
                    Ok(entry) => entry,
                    Err(err) => {
                        // Flush what precedes it; it and what follows stay, so
                        // the PG stops here loudly instead of losing the write.
                        tracing::error!(pg = key, %err, "a live log entry is damaged; the PG cannot flush past it");
                        break;
                    }
                };
                debug_assert_eq!(entry.seq, seq, "a log's live entries have consecutive seqs");
                crate::metrics::copies::count(crate::metrics::copies::Site::Flush, entry.data.len());
                // The primary and replica paths checked every entry before
                // logging it: only a bug makes one the store cannot take.
                if entry_needs_apply(&planner, &entry, &ops) {
                    // It depends on a conditional delete of this pass: the
                    // next pass takes it, once the store applied that.
                    cut.insert(key);
                    break;
                }
                let snap = entry.snap;
                let planned = match store_ops(entry) {
                    Ok(planned) => planned.into_iter().try_for_each(|(op, if_absent)| {
                        planner.push(&mut self.partition, op, snap, if_absent, &mut ops)
                    }),
                    Err(err) => Err(StoreError::InvalidArgument(err.to_string())),
                }
                .map_err(|err| err.to_string());
                match planned {
                    Ok(()) => last = seq,
                    Err(err) => {
                        // It and what follows stay, and the PG is fenced: it
                        // stops serving here, and its peering fails (the
                        // query finds the log not flushed), so `duplex
                        // status` shows it inactive, instead of the flusher
                        // dying and wedging every PG of its partition.
                        tracing::error!(pg = key, seq, %err, "a live log entry cannot be applied; the PG stops serving until an operator acts (mark this OSD out)");
                        self.metrics.unflushable_entries.add(1);
                        fence = true;
                        break;
                    }
                }
            }
            if fence {
                guard.active = None;
            }
            debug_assert!(last <= guard.last_seq(), "flushed through {last}, past the log's end");
            if last >= first {
                // The ids outlive the trim (stored_requests.rs); the log is
                // trimmed only after every batch of this flush is durable.
                ops.extend(guard.record_flushed_ids(self.partition.index(), first..=last));
            }
            drop(guard);
            debug_assert_eq!(
                ops.len() > before,
                last >= first,
                "store operations without entries taken, or the reverse"
            );
            if ops.len() > before {
                taken.push((pg, last));
            }
        }
        let cloned = planner.cloned;
        let mut heads = Some(planner.into_cache());
        for batch in Batches::new(ops.into_iter(), FLUSH_BATCH, cloned) {
            debug_assert!(!batch.is_empty() && batch.len() <= FLUSH_BATCH, "a flush batch of {} ops", batch.len());
            let applied = match self.apply_planned(&batch) {
                Ok(_) => {
                    self.metrics.flushed_entries.add(batch.len() as u64);
                    Ok(())
                }
                Err(StoreError::InvalidArgument(_)) => {
                    heads = None; // some ops dropped: what was planned is not what the store holds
                    self.apply_one_by_one(batch.ops)
                }
                Err(err) => Err(err),
            };
            let no_space = matches!(applied, Err(StoreError::NoSpace { .. }));
            if let Err(err) = applied {
                // Nothing is trimmed: the entries stay in the log and are
                // retried on the next flush (and replayed on restart).
                if no_space {
                    self.metrics.flush_no_space.add(1);
                }
                tracing::error!(partition = self.partition.index(), %err, "flush failed; entries stay in the log");
                let pgs = taken
                    .iter()
                    .map(|(pg, _)| {
                        let mut guard = pg.lock().expect("PG lock");
                        guard.dirty = true;
                        guard.key
                    })
                    .collect();
                return Err(Refused { pgs, no_space });
            }
            self.metrics.flushes.add(1);
        }
        self.snap_heads = heads.unwrap_or_default();
        // Deleted objects' blocks are freed by the next record: commit it
        // now, not with the next write, which a full cluster refuses until
        // it sees the space free (a removed image kept its OSD full).
        while self.partition.reclaims_owed() {
            if let Err(err) = self.partition.commit_reclaims() {
                tracing::error!(partition = self.partition.index(), %err, "freeing deleted objects' blocks failed");
                break;
            }
        }
        let mut wake = vec![false; self.mailboxes.len()];
        let mut broadcast = false;
        let mut refilled = Vec::new();
        for (pg, last) in taken {
            let mut guard = pg.lock().expect("PG lock");
            match guard.trim(last) {
                // Only the flusher trims, and it holds what it took: the log now starts after it.
                Ok(()) => debug_assert_eq!(guard.flushed_through(), last, "a flush trimmed other than what it applied"),
                Err(err) => {
                    tracing::error!(pg = guard.key, %err, "trimming the log failed");
                    // Another pass would take the same entries and stop at
                    // the same place, for ever: leave it to the next flush.
                    cut.remove(&guard.key);
                }
            }
            if std::mem::take(&mut guard.waiters) {
                broadcast = true;
            }
            if guard.has_early() {
                match guard.drain_early() {
                    Ok(acks) => {
                        if !acks.is_empty() {
                            guard.dirty = true;
                            refilled.push((guard.key, guard.has_early()));
                        }
                        for ack in acks {
                            debug_assert!(ack.to.thread < self.mailboxes.len(), "an ack for thread {}", ack.to.thread);
                            self.mailboxes[ack.to.thread].post(Completion::ack(ack, guard.key, Status::Ok));
                            wake[ack.to.thread] = true;
                        }
                    }
                    Err(err) => tracing::error!(pg = guard.key, %err, "logging early replica entries failed"),
                }
            }
        }
        for (thread, mailbox) in self.mailboxes.iter().enumerate() {
            if broadcast {
                mailbox.post(Completion::Flushed);
            }
            if broadcast || wake[thread] {
                mailbox.wake();
            }
        }
        Ok((refilled, cut))
    }

    /// Every store write of the OSD goes through here. A device write or
    /// flush error stops the OSD: what reached the disk is unknown, and a
    /// later flush that succeeds would not bring back what the failed one
    /// dropped (Linux forgets dirty pages whose writeback failed). Retrying
    /// and trusting the store would acknowledge writes it may not hold, so
    /// the process exits before anything else is acknowledged on its
    /// account. Its peers then serve its PGs; started again on a mended
    /// device, it replays its operation log (the failed entries are still
    /// in it) and peering brings it up to date. Only errors the store
    /// refused without touching the device come back.
    pub(crate) fn apply(&mut self, batch: &Batch) -> Result<(), StoreError> {
        // A change not planned from the heads: what they knew may be stale.
        self.snap_heads.clear();
        // Peering's and recovery's changes (and a refused batch's ops one
        // by one): no read is answered in the middle of them.
        self.apply_answering(batch, false)
    }

    /// [`Flusher::apply`] for a batch the snapshot planner made (the
    /// flush and sync paths), which keeps the planner's heads; reads are
    /// answered while its device flush runs.
    fn apply_planned(&mut self, batch: &Batch) -> Result<(), StoreError> {
        self.apply_answering(batch, true)
    }

    fn apply_answering(&mut self, batch: &Batch, answer_reads: bool) -> Result<(), StoreError> {
        let applied =
            if answer_reads && self.syncer.is_some() { self.apply_reading(batch) } else { self.partition.apply(batch) };
        match applied {
            Ok(_) => Ok(()),
            Err(err @ (StoreError::Io { .. } | StoreError::PartitionFailed(_))) => {
                tracing::error!(
                    partition = self.partition.index(),
                    %err,
                    "the data device failed; this OSD stops so that its PGs fail over to their replicas \
                     (check the device; on restart the OSD replays its log and catches up from its peers)"
                );
                std::process::exit(DEVICE_FAILED_EXIT)
            }
            Err(err) => Err(err),
        }
    }

    /// Applies `batch`, and while the syncer flushes the device answers
    /// the reads that come and can be answered now; keeps other jobs.
    fn apply_reading(&mut self, batch: &Batch) -> Result<duplex_store::CommitInfo, StoreError> {
        let unsynced = self.partition.apply_unsynced(batch)?;
        let syncer = self.syncer.as_mut().expect("a syncer");
        syncer.ask();
        let done = syncer.done.clone();
        let mut kept = std::mem::take(&mut syncer.kept);
        let mut jobs_open = true;
        let flushed = loop {
            // Up to a queue's worth kept: past that the producers wait, as
            // they would for a flusher that took nothing.
            if !jobs_open || kept.len() >= FLUSHER_QUEUE {
                break done.recv();
            }
            let job = crossbeam_channel::select! {
                recv(done) -> result => break result,
                recv(self.jobs) -> job => job,
            };
            let Ok(job) = job else {
                jobs_open = false;
                continue;
            };
            let mut reads = Vec::new();
            for job in std::iter::once(job).chain(self.jobs.try_iter().take(FLUSHER_QUEUE)) {
                match job {
                    Job::Read(read) => reads.push(read),
                    other => kept.push(other),
                }
            }
            kept.extend(self.read_now(reads).into_iter().map(Job::Read));
        };
        debug_assert!(kept.len() <= 3 * FLUSHER_QUEUE, "{} jobs kept through one flush", kept.len());
        self.syncer.as_mut().expect("a syncer").kept = kept;
        let flushed = flushed.unwrap_or_else(|_| Err(std::io::Error::other("the sync thread ended")));
        self.partition.synced(unsynced, flushed)
    }

    /// A batch the store refused as invalid: one op the OSD could not check
    /// before logging it (an attribute that overflows its object's budget)
    /// must not wedge the PG forever. Applies the ops one at a time and
    /// drops those the store refuses, loudly.
    fn apply_one_by_one(&mut self, ops: Vec<Op>) -> Result<(), StoreError> {
        debug_assert!(!ops.is_empty() && ops.len() <= FLUSH_BATCH, "one flush batch is split, not {} ops", ops.len());
        for op in ops {
            let mut single = Batch::new();
            single.push(op);
            match self.apply(&single) {
                Ok(_) => self.metrics.flushed_entries.add(1),
                Err(StoreError::InvalidArgument(why)) => {
                    tracing::error!(partition = self.partition.index(), op = ?single.ops[0].key(), %why, "dropping a logged operation the store refuses");
                    self.metrics.dropped_entries.add(1);
                }
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    fn apply_syncs(&mut self, syncs: Vec<(Entry, SyncDone)>) {
        let mut wake = vec![false; self.mailboxes.len()];
        let mut syncs = syncs.into_iter().peekable();
        while syncs.peek().is_some() {
            let mut ops = Vec::new();
            let mut planner = Planner::with_cache(std::mem::take(&mut self.snap_heads));
            let mut dones = Vec::new();
            let mut refused = Vec::new();
            let mut count = 0;
            while count < FLUSH_BATCH {
                let Some((entry, _)) = syncs.peek() else { break };
                // After a conditional delete of this run: apply it first.
                if entry_needs_apply(&planner, entry, &ops) {
                    break;
                }
                let (entry, done) = syncs.next().expect("peeked");
                count += 1;
                let (pg, seq, snap) = (entry.pg, entry.seq, entry.snap);
                // Checked before it was queued, as a logged entry would be:
                // only a bug makes one the store cannot take.
                let planned = match store_ops(entry) {
                    Ok(planned) => planned.into_iter().try_for_each(|(op, if_absent)| {
                        planner.push(&mut self.partition, op, snap, if_absent, &mut ops)
                    }),
                    Err(err) => Err(StoreError::InvalidArgument(err.to_string())),
                }
                .map_err(|err| err.to_string());
                match planned {
                    Ok(()) => dones.push((pg, seq, done)),
                    Err(err) => {
                        tracing::error!(pg, seq, %err, "a sync write the store cannot take; failing it");
                        self.metrics.unflushable_entries.add(1);
                        refused.push((pg, seq, done));
                    }
                }
            }
            debug_assert!(dones.len() <= ops.len(), "a sync write applied without a store operation");
            debug_assert!(dones.len() + refused.len() <= FLUSH_BATCH, "a sync batch larger than a flush batch");
            self.complete_syncs(refused, Status::Invalid, &mut wake);
            if ops.is_empty() {
                continue;
            }
            // A write that clones takes two batches when its batch had
            // touched the head already; its completion waits for both.
            let mut status = Status::Ok;
            let cloned = planner.cloned;
            let heads = planner.into_cache();
            for batch in Batches::new(ops.into_iter(), FLUSH_BATCH, cloned) {
                if let Err(err) = self.apply_planned(&batch) {
                    tracing::error!(partition = self.partition.index(), %err, "sync write failed");
                    status = Status::Io;
                    break;
                }
                self.metrics.flushes.add(1);
                self.metrics.flushed_entries.add(batch.len() as u64);
            }
            if status == Status::Ok {
                self.snap_heads = heads;
            }
            self.complete_syncs(dones, status, &mut wake);
        }
        for (thread, mailbox) in self.mailboxes.iter().enumerate() {
            if wake[thread] {
                mailbox.wake();
            }
        }
    }

    /// Tells each sync write's waiter how its apply went.
    fn complete_syncs(&self, dones: Vec<(u32, u64, SyncDone)>, status: Status, wake: &mut [bool]) {
        for (pg, seq, done) in dones {
            let thread = match done {
                SyncDone::Primary { thread, .. } => thread,
                SyncDone::Replica(to) => to.thread,
            };
            debug_assert!(thread < self.mailboxes.len(), "a sync write's completion for thread {thread}");
            match done {
                SyncDone::Primary { thread, txid } => {
                    // A failed local apply fails the op: it is answered Retry.
                    self.mailboxes[thread].post(Completion::LocalApplied { txid, ok: status == Status::Ok });
                    wake[thread] = true;
                }
                SyncDone::Replica(to) => {
                    self.mailboxes[to.thread].post(Completion::ack(Ack { seq, to }, pg, status));
                    wake[to.thread] = true;
                }
            }
        }
    }

    /// Answers the reads the store and the log can answer now, without a
    /// flush; returns the others. A head's data read takes the log's
    /// entries for its object on top of the store's bytes (`overlay_held`:
    /// the store may hold some of them already, which changes nothing, as
    /// each sets its bytes whatever they were). A read at a snapshot, or
    /// of a stat, attribute or listing, waits for the flush its job asked
    /// for (`flush_first`), as does a head's read while its object's
    /// entries include one the overlay cannot lay (a tier's).
    fn read_now(&mut self, reads: Vec<ReadJob>) -> Vec<ReadJob> {
        let (mut now, mut overlays, mut later) = (Vec::new(), Vec::new(), Vec::new());
        for read in reads {
            if read.kind.is_data_read() && read.snap == 0 {
                let logged = self.logged_entries(read.pg, &read.object);
                if logged.iter().all(|entry| overlays_bytes(entry.op)) {
                    now.push(read);
                    overlays.push(logged);
                    continue;
                }
            } else if !read.flush_first {
                now.push(read);
                overlays.push(Vec::new());
                continue;
            }
            later.push(read);
        }
        if !now.is_empty() {
            self.read(now, overlays);
        }
        later
    }

    /// Answers `reads`; a data read's bytes get its `overlays` entries laid on top.
    fn read(&mut self, reads: Vec<ReadJob>, overlays: Vec<Vec<Entry>>) {
        debug_assert!(reads.iter().all(|r| !r.kind.is_mutation()), "a mutation queued as a read");
        debug_assert_eq!(reads.len(), overlays.len(), "an overlay per read");
        debug_assert!(
            reads.iter().zip(&overlays).all(|(r, o)| o.is_empty() || (r.kind.is_data_read() && r.snap == 0)),
            "only a head's data read takes the log's entries"
        );
        type WithOverlay = (ReadJob, Vec<Entry>);
        let (data, other): (Vec<WithOverlay>, Vec<WithOverlay>) =
            reads.into_iter().zip(overlays).partition(|(r, _)| r.kind.is_data_read());
        let (data, overlays): (Vec<ReadJob>, Vec<Vec<Entry>>) = data.into_iter().unzip();
        // A read at a snapshot reads a clone, the head, or nothing (`None`).
        let keys: Vec<Result<Option<Key>, StoreError>> =
            data.iter().map(|r| self.key_at(r.pg, &r.object, r.snap)).collect();
        let requests: Vec<ReadRequest<'_>> = data
            .iter()
            .zip(&keys)
            .filter_map(|(r, key)| match key {
                Ok(Some(key)) => Some(ReadRequest { key: key.as_bytes(), offset: r.offset, len: r.len as u64 }),
                _ => None,
            })
            .collect();
        let mut results = self.partition.read_many(&requests).into_iter();
        let mut wake = vec![false; self.mailboxes.len()];
        for ((read, key), held) in data.iter().zip(&keys).zip(overlays) {
            let epoch = read.map_epoch;
            let reply = match key {
                Err(err @ StoreError::InvalidArgument(_)) => OpReply::error(Status::Invalid, epoch, err),
                Err(err) => OpReply::error(Status::Io, epoch, err),
                Ok(None) => OpReply::error(Status::NotFound, epoch, "no such object at that snapshot"),
                Ok(Some(stored_key)) => match results.next() {
                    Some(Err(err @ StoreError::ChecksumMismatch { .. })) if read.kind == OpKind::ShardRead => {
                        // A shard of an erasure-coded object: the primary
                        // decodes around it and asks for the PG's repair.
                        self.metrics.damaged_objects.add(1);
                        tracing::error!(pg = read.pg, %err, "a shard read found a damaged block");
                        OpReply::error(Status::Io, epoch, err)
                    }
                    Some(Err(err @ StoreError::ChecksumMismatch { .. })) => self.damaged(read.pg, epoch, &err),
                    Some(result) if !held.is_empty() => {
                        let mut result = overlay_held(result, read.offset, u64::from(read.len), &held);
                        if read.kind == OpKind::Read {
                            // A client's read ends at the object's end, as the store's does
                            // (a shard read returns the whole range: the primary decodes it).
                            let stored = self.partition.stat(stored_key.as_bytes()).ok().map(|info| info.size);
                            let size = held::size_after(stored, &held).unwrap_or(0);
                            if let Ok(bytes) = result.as_mut() {
                                bytes.truncate(size.saturating_sub(read.offset) as usize);
                            }
                        }
                        reply_of(epoch, result.map(Bytes::from))
                    }
                    Some(result) => reply_of(epoch, result.map(Bytes::from)),
                    None => OpReply::error(Status::Io, epoch, "store returned too few results"),
                },
            };
            self.post_reply(read.reply, reply, &mut wake);
        }
        debug_assert!(results.next().is_none(), "the store answered more reads than it was asked");
        for (read, _) in other {
            let result = self.metadata(&read);
            self.post_reply(read.reply, reply_of(read.map_epoch, result), &mut wake);
        }
        for (thread, mailbox) in self.mailboxes.iter().enumerate() {
            if wake[thread] {
                mailbox.wake();
            }
        }
    }

    /// The entries of `object` PG `pg`'s log still holds, in seq order:
    /// none once a flush applied them all (a replicated PG's, read after
    /// the flush it asked for). An erasure-coded PG's log holds back the
    /// entries past its apply limit, and the limit may have risen since
    /// this flush (an entry came in with a newer watermark): every entry
    /// left in the log is one the store lacks, so all of them count.
    fn held_entries(&self, pg: u32, object: &[u8]) -> Vec<Entry> {
        let holds_back = self.pgs.get(pg).is_some_and(|pg| pg.lock().expect("PG lock").holds_back);
        if holds_back {
            self.logged_entries(pg, object)
        } else {
            Vec::new()
        }
    }

    /// The entries of `object` PG `pg`'s log holds, in seq order.
    fn logged_entries(&self, pg: u32, object: &[u8]) -> Vec<Entry> {
        let Some(pg) = self.pgs.get(pg) else { return Vec::new() };
        let guard = pg.lock().expect("PG lock");
        // The index names this object's entries: no walk of the whole log.
        let held: Vec<Entry> = guard.index.log_offsets(object).filter_map(|at| guard.log.read(at)).collect();
        debug_assert!(held.windows(2).all(|w| w[0].seq < w[1].seq), "an object's entries out of order");
        debug_assert!(held.iter().all(|e| e.object == object), "the index named another object's entry");
        held
    }

    /// A read found a block of this OSD's copy damaged: the PG stops
    /// serving and its primary (this OSD) repairs it from a replica, while
    /// the client is told to retry; unless a repair was just tried.
    fn damaged(&mut self, pg: u32, epoch: u64, err: &StoreError) -> OpReply {
        self.metrics.damaged_objects.add(1);
        let now = Instant::now();
        if self.repairs_asked.get(&pg).is_some_and(|at| now.duration_since(*at) < REPAIR_BACKOFF) {
            tracing::error!(pg, %err, "a damaged block again soon after a repair: no member has a good copy?");
            return OpReply::error(Status::Io, epoch, err);
        }
        self.repairs_asked.insert(pg, now);
        tracing::error!(pg, %err, "a read found a damaged block; repairing the PG from its replicas");
        if let Some(shared) = self.pgs.get(pg) {
            shared.lock().expect("PG lock").active = None;
        }
        self.scrub_requests.lock().expect("scrub requests lock").push(ScrubAsk { pg, repair: true, reply: None });
        OpReply::error(Status::Retry, epoch, "a damaged block is being repaired from a replica; retry")
    }

    fn post_reply(&self, to: ClientSlot, reply: OpReply, wake: &mut [bool]) {
        debug_assert!(to.thread < self.mailboxes.len(), "a reply for priority thread {}", to.thread);
        self.mailboxes[to.thread].post(Completion::Reply { token: to.token, slot: to.slot, reply });
        wake[to.thread] = true;
    }

    /// A stat, an attribute read, or a listing, from the store.
    fn metadata(&mut self, read: &ReadJob) -> Result<Bytes, StoreError> {
        debug_assert!(!read.kind.is_data_read(), "a data read is no metadata read");
        match read.kind {
            OpKind::List => return Ok(self.list(read)),
            OpKind::ListSnaps => return self.list_snaps(read.pg, &read.object).map(|list| list.encode()),
            OpKind::Diff => return self.diff(read).map(|diff| diff.encode()),
            _ => {}
        }
        let Some(key) = self.key_at(read.pg, &read.object, read.snap)? else { return Err(StoreError::NotFound) };
        let key = key.as_bytes();
        Ok(match read.kind {
            OpKind::Stat => {
                let info = self.partition.stat(key)?;
                ObjectStat { size: info.size, allocated_bytes: info.allocated_bytes, preallocated: info.preallocated }
                    .encode()
            }
            OpKind::GetAttr => Bytes::from(self.partition.get_attr(key, &read.arg)?),
            OpKind::ListAttrs => {
                let mut attrs = self.partition.list_attrs(key)?;
                // The OSD's own (snapshot bookkeeping) are not the client's.
                attrs.retain(|(name, _)| name.first() != Some(&RESERVED_NAME_BYTE));
                encode_attrs(&attrs)
            }
            OpKind::OmapGet => {
                let keys = duplex_proto::omap::decode_keys(&read.arg)
                    .map_err(|e| StoreError::InvalidArgument(format!("an omap read: {e}")))?;
                // One read of the omap, however many keys are asked (both sorted).
                let omap = self.partition.omap_range(key, &[], None, usize::MAX)?;
                let found: Vec<(Vec<u8>, Vec<u8>)> =
                    omap.into_iter().filter(|(k, _)| keys.binary_search(k).is_ok()).collect();
                Bytes::from(duplex_proto::omap::encode_entries(&found))
            }
            OpKind::TierRead => return self.tier_read(read, key),
            OpKind::OmapList => {
                let range = duplex_proto::omap::decode_range(&read.arg)
                    .map_err(|e| StoreError::InvalidArgument(format!("an omap listing: {e}")))?;
                let limit = read.offset.min(duplex_proto::osd::MAX_OMAP_LIST) as usize;
                let entries = self.partition.omap_range(key, &range.start, range.end.as_deref(), limit)?;
                Bytes::from(duplex_proto::omap::encode_entries(&entries))
            }
            kind => return Err(StoreError::InvalidArgument(format!("{kind:?} is not a store read"))),
        })
    }

    /// A deduplicated object's bytes with the chunk map entries of the
    /// chunks they overlap, read at one moment (`crate::tier`).
    fn tier_read(&mut self, read: &ReadJob, key: &[u8]) -> Result<Bytes, StoreError> {
        let (guard, max_chunk_len) = crate::tier::read_arg_of(&read.arg)
            .ok_or_else(|| StoreError::InvalidArgument("a tier read's guard".into()))?;
        let max_chunk_len = u64::from(max_chunk_len.max(1));
        let size = match self.partition.stat(key) {
            Ok(info) => info.size,
            Err(StoreError::NotFound) => {
                let absent =
                    duplex_proto::tier::TierReadReply { guard, exists: false, size: 0, entries: vec![], data: vec![] };
                return Ok(Bytes::from(absent.encode()));
            }
            Err(err) => return Err(err),
        };
        let data = self.partition.read(key, read.offset, u64::from(read.len))?;
        // (The entries are of the chunks the read overlaps, and maybe one before.)
        let first = read.offset.saturating_sub(max_chunk_len - 1);
        let end = read.offset.saturating_add(u64::from(read.len));
        let (start, _) = duplex_dedup::chunkmap::entries_from(first);
        let stop = duplex_dedup::chunkmap::entry_key(end);
        let entries = self.partition.omap_range(key, &start, Some(&stop), usize::MAX)?;
        let reply = duplex_proto::tier::TierReadReply { guard, exists: true, size, entries, data };
        Ok(Bytes::from(reply.encode()))
    }

    /// A deduplicated PG's objects and evicted chunks, as its store holds
    /// them (after the flush its job asked for).
    fn tier_index(&mut self, pg: u32) -> Result<crate::messages::TierLoaded, StoreError> {
        const PAGE: usize = 1024;
        let mut loaded = crate::messages::TierLoaded::default();
        let mut start = pg.to_be_bytes().to_vec();
        let end = pg.checked_add(1).map(u32::to_be_bytes);
        let (first, last) = duplex_dedup::chunkmap::entries_from(0);
        loop {
            let keys = self.partition.list(&start, end.as_ref().map(|e| &e[..]), PAGE);
            for key in &keys {
                let name = Bytes::copy_from_slice(&key.as_bytes()[4..]);
                if crate::snaps::is_clone_name(&name) {
                    continue;
                }
                for (entry_key, value) in self.partition.omap_range(key.as_bytes(), &first, Some(&last), usize::MAX)? {
                    let (Some(offset), Some(entry)) =
                        (duplex_dedup::chunkmap::entry_offset(&entry_key), duplex_dedup::ChunkEntry::decode(&value))
                    else {
                        tracing::warn!(pg, object = %String::from_utf8_lossy(&name), "a malformed chunk map entry");
                        continue;
                    };
                    if !entry.cached {
                        loaded.evicted.entry(name.clone()).or_default().insert(offset, entry.len);
                    }
                }
                if loaded.evicted.contains_key(&name) {
                    let seq = crate::snaps::snapseq_of(&mut self.partition, key.as_bytes())?;
                    if seq > 0 {
                        loaded.snapseqs.insert(name.clone(), seq);
                    }
                }
                loaded.objects.push(name);
            }
            let Some(last_key) = keys.last() else { break };
            if keys.len() < PAGE {
                break;
            }
            start = last_key.as_bytes().to_vec();
            start.push(0);
        }
        Ok(loaded)
    }

    /// The key holding `object` as snapshot `snap` saw it (0: the head);
    /// `None`: it did not exist then.
    fn key_at(&mut self, pg: u32, object: &[u8], snap: u64) -> Result<Option<Key>, StoreError> {
        if snap == 0 {
            return Key::in_group(pg, object).map(Some);
        }
        crate::snaps::resolve(&mut self.partition, pg, object, snap)
    }

    /// The head's and the clones' snapshot state.
    fn list_snaps(&mut self, pg: u32, object: &[u8]) -> Result<SnapList, StoreError> {
        let (start, end) = crate::snaps::clone_range(pg, object);
        let keys = self.partition.list(&start, Some(&end), MAX_CLONES_LISTED);
        let mut clones = Vec::with_capacity(keys.len());
        for key in keys {
            let Some((_, seq)) = crate::snaps::split_clone_name(&key.as_bytes()[4..]) else { continue };
            let from = crate::snaps::snapseq_of(&mut self.partition, key.as_bytes())?;
            let size = self.partition.stat(key.as_bytes())?.size;
            clones.push(CloneInfo { seq, from, size });
        }
        let head = Key::in_group(pg, object)?;
        let (head_exists, head_seq, head_size) = match self.partition.stat(head.as_bytes()) {
            Ok(info) => (true, crate::snaps::snapseq_of(&mut self.partition, head.as_bytes())?, info.size),
            Err(StoreError::NotFound) => (false, 0, 0),
            Err(err) => return Err(err),
        };
        Ok(SnapList { head_exists, head_seq, head_size, clones })
    }

    /// The clones of `pg`'s objects named `prefix...` that no snapshot in
    /// `live` reads: a clone `name@seq` whose head was last changed under
    /// `from` holds what the snapshots in `(from, seq]` saw (crate::snaps).
    /// `limit` at most, the first in name order after the clone `after`.
    fn dead_clones(
        &mut self,
        pg: u32,
        prefix: &[u8],
        live: &[u64],
        after: Option<&crate::messages::DeadClone>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, u64)>, StoreError> {
        const PAGE: usize = 1024;
        let start: Vec<u8> = pg.to_be_bytes().iter().chain(prefix).copied().collect();
        // The first key past every one that starts with `start`.
        let end = start.iter().rposition(|b| *b != u8::MAX).map(|at| {
            let mut end = start[..=at].to_vec();
            end[at] += 1;
            end
        });
        let mut cursor = match after {
            Some((head, seq)) => {
                let mut cursor: Vec<u8> =
                    pg.to_be_bytes().iter().copied().chain(crate::snaps::clone_name(head, *seq)).collect();
                cursor.push(0); // the smallest name after it
                cursor.max(start.clone())
            }
            None => start.clone(),
        };
        let mut dead = Vec::new();
        loop {
            let keys = self.partition.list(&cursor, end.as_deref(), PAGE);
            let full_page = keys.len() == PAGE;
            for key in &keys {
                let bytes = key.as_bytes();
                debug_assert!(bytes.starts_with(&start), "a key past the listing's end");
                let Some((head, seq)) = crate::snaps::split_clone_name(&bytes[4..]) else { continue };
                let from = crate::snaps::snapseq_of(&mut self.partition, bytes)?;
                if !live.iter().any(|&snap| from < snap && snap <= seq) {
                    dead.push((head.to_vec(), seq));
                    if dead.len() == limit {
                        return Ok(dead);
                    }
                }
            }
            match keys.last() {
                Some(last) if full_page => {
                    cursor = last.as_bytes().to_vec();
                    cursor.push(0); // the smallest name after it
                }
                _ => return Ok(dead),
            }
        }
    }

    /// Where the object differs between snapshot `read.offset` (0: absent)
    /// and `read.snap` (0: the head), from the block maps.
    fn diff(&mut self, read: &ReadJob) -> Result<SnapDiff, StoreError> {
        let from = if read.offset == 0 { None } else { self.key_at(read.pg, &read.object, read.offset)? };
        let to = self.key_at(read.pg, &read.object, read.snap)?;
        let size = match &to {
            Some(key) => match self.partition.stat(key.as_bytes()) {
                Ok(info) => Some(info.size),
                Err(StoreError::NotFound) => None,
                Err(err) => return Err(err),
            },
            None => None,
        };
        let bytes = |key: &Option<Key>| key.as_ref().map_or(&[][..], |k| k.as_bytes()).to_vec();
        let (from, to) = (bytes(&from), bytes(&to));
        let mut ranges = if from == to { Vec::new() } else { self.partition.diff(&from, &to) };
        if from != to && crate::tier::diff_counts_evicted(&read.arg) {
            // An evicted chunk is a hole in the store that does not read
            // as zeros: the block maps alone would call it unchanged.
            for key in [&from, &to].into_iter().filter(|key| !key.is_empty()) {
                ranges.extend(self.evicted_ranges(key)?);
            }
            ranges = crate::tier::merge_ranges(ranges);
        }
        Ok(SnapDiff { exists: size.is_some(), size: size.unwrap_or(0), ranges })
    }

    /// The (offset, length) of `key`'s evicted chunks, from its chunk map.
    fn evicted_ranges(&mut self, key: &[u8]) -> Result<Vec<(u64, u64)>, StoreError> {
        let (first, last) = duplex_dedup::chunkmap::entries_from(0);
        let entries = match self.partition.omap_range(key, &first, Some(&last), usize::MAX) {
            Ok(entries) => entries,
            Err(StoreError::NotFound) => return Ok(Vec::new()),
            Err(err) => return Err(err),
        };
        // (A malformed entry fails the diff: skipped, it would hide a change.)
        let map = duplex_dedup::chunkmap::decode_map(&entries)
            .ok_or_else(|| StoreError::Corrupt("a malformed chunk map entry".into()))?;
        let ranges: Vec<(u64, u64)> =
            map.into_iter().filter(|(_, entry)| !entry.cached).map(|(offset, e)| (offset, u64::from(e.len))).collect();
        debug_assert!(ranges.windows(2).all(|w| w[0].0.saturating_add(w[0].1) <= w[1].0), "evicted chunks overlap");
        Ok(ranges)
    }

    /// Names of the PG's objects after the cursor, with the prefix, in order.
    fn list(&self, read: &ReadJob) -> Bytes {
        let group = read.pg.to_be_bytes();
        let mut start = group.to_vec();
        if read.object.is_empty() {
            start.extend_from_slice(&read.arg);
        } else {
            // Strictly after the cursor: the least key greater than it.
            start.extend_from_slice(&read.object);
            start.push(0);
            if read.object[..] < read.arg[..] {
                start = [&group[..], &read.arg[..]].concat();
            }
        }
        let end = read.pg.checked_add(1).map(u32::to_be_bytes);
        // Snapshot clones are the OSD's, not names a client made: skipped,
        // so a page may take more than one look at the store.
        let mut names: Vec<Vec<u8>> = Vec::new();
        loop {
            let keys = self.partition.list(&start, end.as_ref().map(|e| &e[..]), LIST_LIMIT + 1);
            debug_assert!(keys.iter().all(|k| k.as_bytes().starts_with(&group)), "a listing strayed out of its PG");
            let exhausted = keys.len() <= LIST_LIMIT;
            let mut past_prefix = false;
            for key in &keys {
                let name = &key.as_bytes()[4..];
                if !name.starts_with(&read.arg) {
                    past_prefix = true;
                    break;
                }
                if !crate::snaps::is_clone_name(name) {
                    names.push(name.to_vec());
                }
            }
            let Some(last) = keys.last() else { break };
            if exhausted || past_prefix || names.len() > LIST_LIMIT {
                break;
            }
            start = last.as_bytes().to_vec();
            start.push(0);
        }
        let more = names.len() > LIST_LIMIT;
        names.truncate(LIST_LIMIT);
        debug_assert!(names.windows(2).all(|w| w[0] < w[1]), "a listing's names out of order");
        encode_names(&names, more)
    }
}

/// A read of bytes `[offset, offset + len)` of an object from the store,
/// with the entries of it the log still holds back applied on top, in
/// order (`held`: an erasure-coded shard's tail, see `Pg::apply_limit`).
/// The result is the whole range (zeros past the object's end), or
/// `NotFound` if the entries leave the object absent.
pub(crate) fn overlay_held(
    base: Result<Vec<u8>, StoreError>,
    offset: u64,
    len: u64,
    held: &[Entry],
) -> Result<Vec<u8>, StoreError> {
    let (mut exists, mut bytes) = match base {
        Ok(bytes) => (true, bytes),
        Err(StoreError::NotFound) => (false, Vec::new()),
        Err(err) => return Err(err),
    };
    bytes.resize(len as usize, 0);
    let end = offset.saturating_add(len);
    // The part of `[from, to)` inside the read, as buffer indexes.
    let within = |from: u64, to: u64| {
        let (from, to) = (from.max(offset), to.min(end));
        (from < to).then(|| ((from - offset) as usize, (to - offset) as usize))
    };
    for entry in held {
        match entry.op {
            // A copy-up writes only into an absent object, as the store applies it.
            duplex_oplog::OpKind::CopyUp if exists => {}
            duplex_oplog::OpKind::Write | duplex_oplog::OpKind::CopyUp => {
                exists = true;
                let to = entry.offset.saturating_add(entry.data.len() as u64);
                if let Some((a, b)) = within(entry.offset, to) {
                    let at = (offset + a as u64 - entry.offset) as usize;
                    bytes[a..b].copy_from_slice(&entry.data[at..at + (b - a)]);
                }
            }
            duplex_oplog::OpKind::Zero => {
                let zero_len = duplex_oplog::zero_length(&entry.data).unwrap_or(0);
                if let Some((a, b)) = within(entry.offset, entry.offset.saturating_add(zero_len)) {
                    bytes[a..b].fill(0);
                }
            }
            duplex_oplog::OpKind::Truncate => {
                exists = true;
                if let Some((a, b)) = within(entry.offset, u64::MAX) {
                    bytes[a..b].fill(0);
                }
            }
            duplex_oplog::OpKind::Delete => {
                exists = false;
                bytes.fill(0);
            }
            // The store makes an absent object to hold an attribute or an omap entry.
            duplex_oplog::OpKind::CreatePreallocated
            | duplex_oplog::OpKind::SetAttr
            | duplex_oplog::OpKind::OmapSet => exists = true,
            duplex_oplog::OpKind::RemoveAttr
            | duplex_oplog::OpKind::OmapRemove
            | duplex_oplog::OpKind::OmapRemoveRange => {}
            // Erasure-coded pools refuse chunk operations: only the chunk
            // pool's replicated PGs take them, whose reads flush first.
            duplex_oplog::OpKind::ChunkPut | duplex_oplog::OpKind::ChunkUnref | duplex_oplog::OpKind::TierUpdate => {
                return Err(StoreError::InvalidArgument("a tier operation held in an erasure-coded log".into()))
            }
            // Only a replicated PG's backfill target logs one.
            duplex_oplog::OpKind::Elided => {
                return Err(StoreError::InvalidArgument("an elided write held in an erasure-coded log".into()))
            }
        }
    }
    if exists {
        Ok(bytes)
    } else {
        Err(StoreError::NotFound)
    }
}

/// Whether [`overlay_held`] lays an entry of this kind on the store's
/// bytes as applying it would leave them: every kind but the tier's.
fn overlays_bytes(op: duplex_oplog::OpKind) -> bool {
    !matches!(
        op,
        duplex_oplog::OpKind::ChunkPut
            | duplex_oplog::OpKind::ChunkUnref
            | duplex_oplog::OpKind::TierUpdate
            | duplex_oplog::OpKind::Elided
    )
}

fn reply_of(epoch: u64, result: Result<Bytes, StoreError>) -> OpReply {
    match result {
        Ok(data) => OpReply { status: Status::Ok, map_epoch: epoch, data },
        Err(StoreError::NotFound) => OpReply::error(Status::NotFound, epoch, "no such object"),
        Err(StoreError::AttrNotFound) => OpReply::error(Status::NotFound, epoch, "no such attribute"),
        Err(err @ StoreError::InvalidArgument(_)) => OpReply::error(Status::Invalid, epoch, err),
        Err(err) => OpReply::error(Status::Io, epoch, err),
    }
}

/// What one flush pass did: the PGs whose logs took waiting replica
/// entries after its trim (and whether more still wait), and the PGs it
/// stopped short of their log's end.
type FlushPass = (Vec<(u32, bool)>, BTreeSet<u32>);

/// A flush the store refused: the PGs to flush again (nothing of theirs
/// was trimmed), and whether for want of room.
struct Refused {
    pgs: Vec<u32>,
    no_space: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, op: duplex_oplog::OpKind, offset: u64, data: Vec<u8>) -> Entry {
        Entry {
            pg: 1,
            epoch: 1,
            version: 0,
            seq,
            op,
            object: b"o".to_vec(),
            offset,
            data,
            request: Default::default(),
            snap: 0,
        }
    }

    /// `held::meta_after`: the entries an erasure-coded shard holds back
    /// change an object's size and existence as the store would apply them.
    #[test]
    fn held_entries_change_an_objects_size_and_existence_as_the_store_would() {
        use duplex_oplog::OpKind::{CopyUp, Delete, RemoveAttr, SetAttr, Truncate, Write, Zero};
        use duplex_proto::peering::ObjectMeta;
        let stored = Some(ObjectMeta {
            size: 8192,
            preallocated: false,
            attrs: vec![(b"a".to_vec(), b"1".to_vec())],
            omap: Vec::new(),
        });
        let size = |store: &Option<ObjectMeta>, held: &[Entry]| held::meta_after(store.clone(), held).map(|m| m.size);
        assert_eq!(held::meta_after(stored.clone(), &[]), stored, "nothing held: the store's");
        // A write of no bytes (a shard a write left alone) creates it.
        assert_eq!(size(&None, &[entry(1, Write, 0, Vec::new())]), Some(0));
        assert_eq!(size(&stored, &[entry(1, Write, 8192, vec![7; 4096])]), Some(12288));
        assert_eq!(size(&stored, &[entry(1, Write, 0, vec![7; 4096])]), Some(8192));
        assert_eq!(size(&stored, &[entry(1, Zero, 0, vec![0; 8])]), Some(8192));
        assert_eq!(size(&None, &[entry(1, Zero, 0, vec![0; 8])]), None, "a zero creates nothing");
        assert_eq!(size(&stored, &[entry(1, Truncate, 4096, Vec::new())]), Some(4096));
        assert_eq!(size(&stored, &[entry(1, Delete, 0, Vec::new())]), None);
        let again =
            held::meta_after(stored.clone(), &[entry(1, Delete, 0, Vec::new()), entry(2, Write, 0, vec![1; 10])]);
        assert_eq!(
            again,
            Some(ObjectMeta { size: 10, preallocated: false, attrs: Vec::new(), omap: Vec::new() }),
            "attributes go too"
        );
        assert_eq!(
            size(&stored, &[entry(1, CopyUp, 0, vec![1; 65536])]),
            Some(8192),
            "a copy-up of an object is dropped"
        );
        assert_eq!(size(&None, &[entry(1, CopyUp, 0, vec![1; 100])]), Some(100));
        use duplex_oplog::OpKind::CreatePreallocated;
        assert_eq!(size(&stored, &[entry(1, CreatePreallocated, 1 << 20, Vec::new())]), Some(8192), "it exists");
        let preallocated = held::meta_after(None, &[entry(1, CreatePreallocated, 1 << 20, Vec::new())]);
        assert_eq!(preallocated.map(|m| (m.size, m.preallocated)), Some((1 << 20, true)));
        assert_eq!(size(&None, &[entry(1, SetAttr, 1, b"b2".to_vec())]), Some(0), "an attribute creates it");
        let attrs =
            held::meta_after(stored, &[entry(1, SetAttr, 1, b"b2".to_vec()), entry(2, RemoveAttr, 0, b"a".to_vec())]);
        assert_eq!(attrs.map(|m| m.attrs), Some(vec![(b"b".to_vec(), b"2".to_vec())]));
    }

    /// `held::size_after` (a client read's end) agrees with `meta_after`'s
    /// sizes on every sequence of the kinds both know.
    #[test]
    fn a_reads_end_follows_the_entries_as_the_stores_size_would() {
        use duplex_oplog::OpKind::{CopyUp, CreatePreallocated, Delete, RemoveAttr, SetAttr, Truncate, Write, Zero};
        use duplex_proto::peering::ObjectMeta;
        let kinds = [Write, CopyUp, Truncate, CreatePreallocated, Delete, Zero, SetAttr, RemoveAttr];
        let pick = |n: u64| {
            let op = kinds[(n % kinds.len() as u64) as usize];
            let (offset, data) = match op {
                Write | CopyUp => (n % 7 * 1000, vec![1; (n % 5 * 700) as usize]),
                Zero => (n % 3 * 100, 50u64.to_le_bytes().to_vec()),
                SetAttr => (1, b"ab".to_vec()),
                RemoveAttr => (0, b"a".to_vec()),
                _ => (n % 11 * 512, Vec::new()),
            };
            entry(n + 1, op, offset, data)
        };
        for seed in 0..2000u64 {
            let stored = (seed % 3 != 0).then(|| ObjectMeta {
                size: seed % 9 * 333,
                preallocated: false,
                attrs: Vec::new(),
                omap: Vec::new(),
            });
            let entries: Vec<Entry> = (0..seed % 6).map(|i| pick(seed.wrapping_mul(31).wrapping_add(i * 17))).collect();
            let mut entries = entries;
            for (seq, e) in entries.iter_mut().enumerate() {
                e.seq = seq as u64 + 1;
            }
            let expected = held::meta_after(stored.clone(), &entries).map(|m| m.size);
            assert_eq!(held::size_after(stored.map(|m| m.size), &entries), expected, "{entries:?}");
        }
    }

    #[test]
    fn held_entries_land_on_the_stores_bytes_in_order() {
        use duplex_oplog::OpKind::{Delete, Truncate, Write, Zero};
        let stored = || Ok(vec![1u8; 6]);
        let ok = |result: Result<Vec<u8>, StoreError>| result.ok();
        // The store's 6 bytes of the read at 2 (bytes 2..8); a write across
        // the read's start, a zero inside, a write past the stored end.
        let held = [
            entry(1, Write, 0, vec![2; 4]),
            entry(2, Zero, 3, 2u64.to_le_bytes().to_vec()),
            entry(3, Write, 7, vec![3; 5]),
        ];
        assert_eq!(ok(overlay_held(stored(), 2, 8, &held)), Some(vec![2, 0, 0, 1, 1, 3, 3, 3]));
        // A truncation zeroes what follows it; a delete leaves nothing, a later write makes it again.
        assert_eq!(ok(overlay_held(stored(), 0, 6, &[entry(1, Truncate, 2, vec![])])), Some(vec![1, 1, 0, 0, 0, 0]));
        assert!(matches!(overlay_held(stored(), 0, 4, &[entry(1, Delete, 0, vec![])]), Err(StoreError::NotFound)));
        let remade = [entry(1, Delete, 0, vec![]), entry(2, Write, 1, vec![9])];
        assert_eq!(ok(overlay_held(stored(), 0, 3, &remade)), Some(vec![0, 9, 0]));
        // An object only the log holds.
        assert_eq!(ok(overlay_held(Err(StoreError::NotFound), 0, 2, &[entry(1, Write, 1, vec![5])])), Some(vec![0, 5]));
    }
}
