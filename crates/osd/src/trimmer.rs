//! The snapshot trimmer: deletes, in the background, the clones no live
//! snapshot reads any more.
//!
//! `snap remove` rewrites the image's snapshot table, then sends each PG's
//! primary a `TrimSnaps` with the image's object-name prefix and its live
//! snapshot ids, and returns: the OSDs do not otherwise know an image's
//! snapshots (its table is the client's). Here, one thread per OSD takes
//! those jobs in turn. For each it asks the PG's flusher which clones are
//! dead (after a flush, so that a clone an entry in the log makes is seen),
//! then deletes each as a client's `TrimClone` would be, through admission
//! and the replicated write path, so that the replicas delete it too and a
//! primary that lost its PG refuses. It scans for [`TRIM_BATCH`] dead
//! clones at a time, and deletes each batch before it asks for the next:
//! the flusher's `Trim` class (crate::flusher::device) serves those scans
//! behind client work, at most `--trims-per-sec` clones' worth a second.
//!
//! A newer job for the same PG and image replaces one still waiting (its
//! live set is the newer table's). The deletes are fire-and-forget (their
//! replies go to no connection), so a job scans again after
//! [`RESCAN_AFTER`], other jobs going on meanwhile, until it finds nothing
//! dead, [`PASSES`] times at most: a delete a peering failed, or a clone a late
//! write under a removed snapshot made, is caught then. A job lost with its
//! OSD (a restart, a new primary) leaves clones that the next `snap remove`
//! or `image remove` of the image finds: every job carries the whole live
//! set, so each one trims everything dead.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::Receiver;
use duplex_proto::osd::{OpKind, OpRequest, Status};

use crate::cluster::ActingCache;
use crate::io::ops;
use crate::messages::{ClientOp, Completion, Job, Mailbox, Outcome, TrimScan};
use crate::pg::{pg_number, pool_of};
use crate::shared::Shared;

/// Jobs waiting for the trimmer at most, in its channel and again among
/// those it took (a `TrimSnaps` past it: Retry).
pub const TRIM_QUEUE: usize = 1024;
/// Dead clones one scan finds at most: the deletes issued together.
pub const TRIM_BATCH: usize = 50;
/// A job looks for dead clones again this long after its deletes.
pub const RESCAN_AFTER: Duration = Duration::from_secs(2);
/// Scans of one job at most.
pub const PASSES: usize = 3;
/// The connection token of the trimmer's deletes: none is ever this.
const NO_CONNECTION: usize = usize::MAX;

/// Trim the clones of PG `pg` (its key) of the objects named `prefix...`
/// that none of `live` reads.
pub struct TrimJob {
    pub pg: u32,
    pub prefix: Bytes,
    pub live: Vec<u64>,
}

/// A job and where it stands.
struct Work {
    job: TrimJob,
    passes: usize,
    due: Instant,
}

/// The trimmer thread: runs until its queue's senders are gone.
pub fn run(shared: Arc<Shared>, jobs: Receiver<TrimJob>, mailboxes: Vec<Mailbox>) {
    let mut trimmer = Trimmer {
        cache: ActingCache::new(&shared.map),
        histograms: shared.metrics.histograms(),
        // The deletes' request ids: a client id of its own, new at each
        // start, so that no id of an earlier run is taken for a resend.
        client: rand::random::<u64>() | 1,
        unpaid: 0,
        shared,
        mailboxes,
    };
    let mut queue: Vec<Work> = Vec::new();
    loop {
        // Wait for a job, or for the next rescan. Jobs stay in the bounded
        // channel while TRIM_QUEUE are taken (senders are then told Retry).
        let next_due = queue.iter().map(|work| work.due).min();
        let room = queue.len() < TRIM_QUEUE;
        let arrived = match next_due {
            None => jobs.recv().ok(),
            Some(due) if room => jobs.recv_timeout(due.saturating_duration_since(Instant::now())).ok(),
            Some(due) => {
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                None
            }
        };
        if next_due.is_none() && arrived.is_none() {
            return; // the OSD is shutting down
        }
        if let Some(job) = arrived {
            add(&mut queue, job);
        }
        while queue.len() < TRIM_QUEUE {
            let Ok(job) = jobs.try_recv() else { break };
            add(&mut queue, job);
        }
        debug_assert!(queue.len() <= TRIM_QUEUE, "the trimmer took {} jobs", queue.len());
        let now = Instant::now();
        let Some(at) = queue.iter().position(|work| work.due <= now) else { continue };
        let work = &mut queue[at];
        let found = trimmer.pass(&work.job);
        work.passes += 1;
        work.due = Instant::now() + RESCAN_AFTER;
        if found == 0 || work.passes == PASSES {
            queue.remove(at);
        }
    }
}

/// Queues `job`; a newer one for the same PG and image replaces the one
/// waiting (its live set is the newer table's), starting its passes again.
fn add(queue: &mut Vec<Work>, job: TrimJob) {
    let now = Instant::now();
    match queue.iter_mut().find(|work| work.job.pg == job.pg && work.job.prefix == job.prefix) {
        Some(work) => *work = Work { job, passes: 0, due: now },
        None => queue.push(Work { job, passes: 0, due: now }),
    }
}

struct Trimmer {
    shared: Arc<Shared>,
    mailboxes: Vec<Mailbox>,
    cache: ActingCache,
    histograms: crate::metrics::Histograms,
    client: u64,
    /// Deletes made since the last scan: the next one pays for them.
    unpaid: usize,
}

impl Trimmer {
    /// Scans `job`'s PG and deletes its dead clones, a batch at a time;
    /// how many it found.
    fn pass(&mut self, job: &TrimJob) -> usize {
        let mut found = 0;
        let mut after = None;
        loop {
            // The next scan pays for the deletes since the last one, of
            // whichever job.
            let deleted = std::mem::take(&mut self.unpaid);
            let dead = match scan(&self.shared, job, after.take(), deleted) {
                Ok(dead) => dead,
                Err(err) => {
                    tracing::warn!(pg = job.pg, %err, "a snapshot trim could not scan its PG");
                    return found;
                }
            };
            debug_assert!(dead.len() <= TRIM_BATCH, "a scan found {} at once", dead.len());
            if !dead.is_empty() {
                tracing::debug!(pg = job.pg, clones = dead.len(), "trimming dead snapshot clones");
            }
            found += dead.len();
            let full = dead.len() == TRIM_BATCH;
            after = dead.last().cloned();
            self.unpaid = dead.len();
            if !self.delete(job, dead) {
                return 0; // no longer this PG's primary: its new one trims
            }
            if !full {
                return found;
            }
        }
    }

    /// Deletes `dead` clones of `job`'s PG; false if this OSD is no longer
    /// its primary.
    fn delete(&mut self, job: &TrimJob, dead: Vec<crate::messages::DeadClone>) -> bool {
        for (head, seq) in dead {
            let request = OpRequest {
                kind: OpKind::TrimClone,
                pool: pool_of(job.pg),
                pg: pg_number(job.pg),
                map_epoch: 0,
                object: Bytes::from(head),
                offset: seq,
                length: 0,
                data: Bytes::new(),
                client: self.client,
                snap: 0,
            };
            let txid = self.shared.txid();
            let op = ClientOp {
                thread: 0,
                token: NO_CONNECTION,
                slot: 0,
                txid,
                request,
                arrived: Instant::now(),
                ticket: None,
                claim: None,
            };
            self.shared.metrics.snap_trims.add(1);
            match ops::client_op(&self.shared, &mut self.cache, &self.histograms, op) {
                Outcome::Queued => {}
                Outcome::Reply { reply, .. } if reply.status == Status::WrongOsd => return false,
                Outcome::Reply { reply, .. } => {
                    if reply.status != Status::Ok {
                        tracing::debug!(pg = job.pg, status = ?reply.status, "a clone delete was refused");
                    }
                }
                // The PG's log is full: the rescan tries it again.
                Outcome::Full(_) => {}
                // Replication goes out through a priority thread, as a pool worker's.
                outcome => self.mailboxes[0].post_and_wake(Completion::Worked(Box::new(outcome))),
            }
        }
        true
    }
}

/// The next [`TRIM_BATCH`] dead clones of `job`'s PG after `after`, from
/// its flusher, as its `Trim` class allows: the scan pays for the
/// `deleted` clones the one before it led to.
fn scan(
    shared: &Shared,
    job: &TrimJob,
    after: Option<crate::messages::DeadClone>,
    deleted: usize,
) -> Result<Vec<crate::messages::DeadClone>, String> {
    let (reply, answer) = crossbeam_channel::bounded(1);
    let scan = TrimScan {
        pg: job.pg,
        prefix: job.prefix.clone(),
        live: job.live.clone(),
        after,
        limit: TRIM_BATCH,
        deletes_before: deleted,
        reply,
    };
    shared.send_job(job.pg, Job::TrimScan(scan));
    answer.recv().map_err(|_| "the flusher ended".to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(pg: u32, prefix: &'static [u8], live: &[u64]) -> TrimJob {
        TrimJob { pg, prefix: Bytes::from_static(prefix), live: live.to_vec() }
    }

    #[test]
    fn a_newer_job_for_the_same_pg_and_image_replaces_the_waiting_one() {
        let mut queue = Vec::new();
        add(&mut queue, job(1, b"img-a.", &[3, 5]));
        add(&mut queue, job(1, b"img-b.", &[2]));
        add(&mut queue, job(2, b"img-a.", &[3, 5]));
        queue[0].passes = 2;
        add(&mut queue, job(1, b"img-a.", &[5]));
        assert_eq!(queue.len(), 3, "one job per PG and image");
        assert_eq!(
            (queue[0].job.live.as_slice(), queue[0].passes),
            (&[5u64][..], 0),
            "the newer live set, passes anew"
        );
        assert_eq!(queue[1].job.prefix, Bytes::from_static(b"img-b."));
    }
}
