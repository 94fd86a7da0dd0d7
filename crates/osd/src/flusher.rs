//! The bottom half: one non-priority thread per store partition
//! (DESIGN.md §6). It owns the partition and is the only thread that does
//! store I/O. It sleeps until a PG reaches the flush threshold, a read
//! needs the store, or the oldest unflushed entry has waited the flush
//! timeout; then it applies the logged entries of its dirty PGs to the
//! store in batches (one device flush each), trims the logs and index
//! caches, and posts completions to the priority threads.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use duplex_oplog::Entry;
use duplex_proto::osd::{OpReply, RepReply, Status};
use duplex_store::{Batch, Key, Partition, ReadRequest, StoreError};

use crate::mailbox::{Completion, Mailbox};
use crate::metrics::{record, Metrics, Stage};
use crate::pg::{Ack, PgTable, ReplyTo};
use crate::replay::store_op;

/// Entries per store batch; a flush of more takes several batches.
pub const FLUSH_BATCH: usize = 128;

/// Where a client reply goes.
#[derive(Clone, Copy, Debug)]
pub struct ClientSlot {
    pub thread: usize,
    pub token: usize,
    pub slot: u64,
}

pub struct ReadJob {
    pub pg: u32,
    pub object: Bytes,
    pub offset: u64,
    pub len: u32,
    pub flush_first: bool,
    pub reply: ClientSlot,
    pub map_epoch: u64,
}

pub enum Job {
    /// A PG's log went from empty to not: flush it within the timeout.
    Dirty(u32),
    /// A PG's log reached the threshold, or is full: flush now.
    Flush(u32),
    /// Read from the store: R2, or R3 when `flush_first`.
    Read(ReadJob),
    /// The sync write path: apply, make durable, then complete.
    SyncApply { entry: Entry, done: SyncDone },
}

#[derive(Clone, Copy, Debug)]
pub enum SyncDone {
    /// The primary's own copy: tell its thread.
    Primary { thread: usize, txid: u64 },
    /// A replica's copy: acknowledge to the primary.
    Replica(ReplyTo),
}

pub struct Flusher {
    pub partition: Partition,
    pub jobs: Receiver<Job>,
    pub pgs: Arc<PgTable>,
    pub mailboxes: Vec<Mailbox>,
    pub metrics: Arc<Metrics>,
    pub timeout: Duration,
}

struct Pending {
    reads: Vec<ReadJob>,
    syncs: Vec<(Entry, SyncDone)>,
    dirty: BTreeSet<u32>,
    deadline: Option<Instant>,
    flush_now: bool,
}

impl Flusher {
    /// Runs until every job sender is gone; returns the partition to close.
    pub fn run(mut self) -> Partition {
        let histograms = self.metrics.histograms();
        let mut pending =
            Pending { reads: Vec::new(), syncs: Vec::new(), dirty: BTreeSet::new(), deadline: None, flush_now: false };
        let mut written = device_bytes(&self.partition);
        loop {
            let first = match pending.deadline {
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
            for job in first.into_iter().chain(self.jobs.try_iter()) {
                self.take(job, &mut pending);
            }
            let due = pending.deadline.is_some_and(|d| Instant::now() >= d);
            if pending.flush_now || due {
                let started = Instant::now();
                self.flush(std::mem::take(&mut pending.dirty));
                record(&histograms, Stage::Flush, started.elapsed().as_micros() as u64);
                pending.deadline = None;
                pending.flush_now = false;
            }
            if !pending.syncs.is_empty() {
                let started = Instant::now();
                self.apply_syncs(std::mem::take(&mut pending.syncs));
                record(&histograms, Stage::Flush, started.elapsed().as_micros() as u64);
            }
            if !pending.reads.is_empty() {
                self.read(std::mem::take(&mut pending.reads));
            }
            let now = device_bytes(&self.partition);
            self.metrics.device_bytes_written.add(now.saturating_sub(written));
            written = now;
        }
    }

    fn take(&self, job: Job, pending: &mut Pending) {
        match job {
            Job::Dirty(pg) => {
                pending.dirty.insert(pg);
                pending.deadline.get_or_insert_with(|| Instant::now() + self.timeout);
            }
            Job::Flush(pg) => {
                pending.dirty.insert(pg);
                pending.flush_now = true;
            }
            Job::Read(read) => {
                if read.flush_first {
                    pending.dirty.insert(read.pg);
                    pending.flush_now = true;
                }
                pending.reads.push(read);
            }
            Job::SyncApply { entry, done } => pending.syncs.push((entry, done)),
        }
    }

    /// Applies the live entries of `dirty` PGs, then trims them.
    fn flush(&mut self, dirty: BTreeSet<u32>) {
        // Per PG: the last seq taken; the entries themselves become store ops.
        let mut taken = Vec::new();
        let mut ops = Vec::new();
        for key in dirty {
            let Some(pg) = self.pgs.get(key) else { continue };
            let mut guard = pg.lock().expect("PG lock");
            guard.dirty = false;
            let before = ops.len();
            let mut last = 0;
            for entry in guard.log.entries() {
                last = entry.seq;
                // The primary and replica paths checked every entry before logging it.
                ops.push(store_op(entry).expect("a logged entry is a valid store operation"));
            }
            drop(guard);
            if ops.len() > before {
                taken.push((pg, last));
            }
        }
        let mut ops = ops.into_iter().peekable();
        while ops.peek().is_some() {
            let mut batch = Batch::new();
            for op in ops.by_ref().take(FLUSH_BATCH) {
                batch.push(op);
            }
            if let Err(err) = self.partition.apply(&batch) {
                // Nothing is trimmed: the entries stay in the log and are
                // retried on the next flush (and replayed on restart).
                tracing::error!(partition = self.partition.index(), %err, "flush failed; entries stay in the log");
                return;
            }
            self.metrics.flushes.add(1);
            self.metrics.flushed_entries.add(batch.len() as u64);
        }
        let mut wake = vec![false; self.mailboxes.len()];
        let mut broadcast = false;
        for (pg, last) in taken {
            let mut guard = pg.lock().expect("PG lock");
            if let Err(err) = guard.trim(last) {
                tracing::error!(pg = guard.key, %err, "trimming the log failed");
            }
            if std::mem::take(&mut guard.waiters) {
                broadcast = true;
            }
            if guard.has_early() {
                match guard.drain_early() {
                    Ok(acks) => {
                        for Ack { seq, to } in acks {
                            let frame = RepReply { status: Status::Ok, pg: guard.key, seq }.to_frame(to.txid);
                            self.mailboxes[to.thread].post(Completion::Send { token: to.token, frame });
                            wake[to.thread] = true;
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
    }

    fn apply_syncs(&mut self, syncs: Vec<(Entry, SyncDone)>) {
        let mut wake = vec![false; self.mailboxes.len()];
        let mut syncs = syncs.into_iter().peekable();
        while syncs.peek().is_some() {
            let mut batch = Batch::new();
            let mut dones = Vec::new();
            for (entry, done) in syncs.by_ref().take(FLUSH_BATCH) {
                dones.push((entry.pg, entry.seq, done));
                // Checked before it was queued, as a logged entry would be.
                batch.push(store_op(entry).expect("a checked entry is a valid store operation"));
            }
            let status = match self.partition.apply(&batch) {
                Ok(_) => Status::Ok,
                Err(err) => {
                    tracing::error!(partition = self.partition.index(), %err, "sync write failed");
                    Status::Io
                }
            };
            self.metrics.flushes.add(1);
            self.metrics.flushed_entries.add(batch.len() as u64);
            for (pg, seq, done) in dones {
                match done {
                    SyncDone::Primary { thread, txid } => {
                        // A failed local apply fails the op: it is answered Retry.
                        self.mailboxes[thread].post(Completion::LocalApplied { txid, ok: status == Status::Ok });
                        wake[thread] = true;
                    }
                    SyncDone::Replica(to) => {
                        let frame = RepReply { status, pg, seq }.to_frame(to.txid);
                        self.mailboxes[to.thread].post(Completion::Send { token: to.token, frame });
                        wake[to.thread] = true;
                    }
                }
            }
        }
        for (thread, mailbox) in self.mailboxes.iter().enumerate() {
            if wake[thread] {
                mailbox.wake();
            }
        }
    }

    fn read(&mut self, reads: Vec<ReadJob>) {
        let keys: Vec<Result<Key, StoreError>> = reads.iter().map(|r| Key::in_group(r.pg, &r.object)).collect();
        let requests: Vec<ReadRequest<'_>> = reads
            .iter()
            .zip(&keys)
            .filter_map(|(r, key)| {
                key.as_ref().ok().map(|key| ReadRequest { key: key.as_bytes(), offset: r.offset, len: r.len as u64 })
            })
            .collect();
        let mut results = self.partition.read_many(&requests).into_iter();
        let mut wake = vec![false; self.mailboxes.len()];
        for (read, key) in reads.iter().zip(&keys) {
            let epoch = read.map_epoch;
            let reply = match key {
                Err(err) => OpReply::error(Status::Invalid, epoch, err),
                Ok(_) => match results.next() {
                    Some(Ok(data)) => OpReply { status: Status::Ok, map_epoch: epoch, data: Bytes::from(data) },
                    Some(Err(StoreError::NotFound)) => OpReply::error(Status::NotFound, epoch, "no such object"),
                    Some(Err(err)) => OpReply::error(Status::Io, epoch, err),
                    None => OpReply::error(Status::Io, epoch, "store returned too few results"),
                },
            };
            let to = read.reply;
            self.mailboxes[to.thread].post(Completion::Reply { token: to.token, slot: to.slot, reply });
            wake[to.thread] = true;
        }
        for (thread, mailbox) in self.mailboxes.iter().enumerate() {
            if wake[thread] {
                mailbox.wake();
            }
        }
    }
}

fn device_bytes(partition: &Partition) -> u64 {
    let stats = partition.stats();
    stats.data_blocks_written * duplex_store::BLOCK_SIZE as u64
        + stats.journal_bytes_written
        + stats.metadata_bytes_written
}
