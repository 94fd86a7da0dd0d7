//! The pool workers of the `threading = pool` ablation: the classic
//! messenger-plus-worker-pool design that DESIGN.md §6 measures the
//! prioritized threads against.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};

use crate::cluster::ActingCache;
use crate::io::ops;
use crate::messages::{ClientOp, Completion, Mailbox, Outcome, PoolTask, POOL_QUEUE};
use crate::pg::{pg_key, ReplyTo};
use crate::shared::Shared;

/// The pool of `threading = pool`: where a priority thread hands its
/// operations instead of running them inline. A PG's operations always go
/// to the same worker, so they stay in order.
#[derive(Clone)]
pub struct Pool {
    workers: Vec<Sender<PoolTask>>,
}

impl Pool {
    /// Starts `threads` workers (at least one), each with a bounded queue
    /// ([`POOL_QUEUE`]); `spawn` runs a worker's loop on a thread of its own.
    pub fn start(
        threads: usize,
        mut spawn: impl FnMut(usize, Receiver<PoolTask>) -> std::io::Result<()>,
    ) -> std::io::Result<Pool> {
        let mut workers = Vec::new();
        for worker in 0..threads.max(1) {
            let (sender, tasks) = crossbeam_channel::bounded(POOL_QUEUE);
            spawn(worker, tasks)?;
            workers.push(sender);
        }
        assert!(!workers.is_empty(), "a pool without workers");
        Ok(Pool { workers })
    }

    fn worker_of(&self, pg: u32) -> &Sender<PoolTask> {
        &self.workers[pg as usize % self.workers.len()]
    }

    /// Hands a client operation to its PG's worker (waiting while that
    /// worker's queue is full: the back-pressure).
    pub fn client(&self, op: ClientOp) {
        let key = pg_key(op.request.pool, op.request.pg).unwrap_or(0);
        let _ = self.worker_of(key).send(PoolTask::Client(op));
    }

    /// Hands a replicated entry to its PG's worker.
    pub fn replica(&self, payload: Bytes, to: ReplyTo) {
        let pg = duplex_oplog::entry::peek_pg(&payload).unwrap_or(0);
        let _ = self.worker_of(pg).send(PoolTask::Replica { payload, to });
    }
}

/// A pool worker (`threading = pool`): runs operations handed over by the
/// messenger threads and posts the outcome back to the connection's thread.
/// Unlike a priority thread it may block: a write to a full log waits here.
pub fn pool_worker(shared: Arc<Shared>, tasks: Receiver<PoolTask>, mailboxes: Vec<Mailbox>) {
    let mut cache = ActingCache::new(&shared.map);
    let histograms = shared.metrics.histograms();
    for task in tasks {
        let (thread, outcome) = match task {
            PoolTask::Client(mut op) => {
                let thread = op.thread;
                let outcome = loop {
                    match ops::client_op(&shared, &mut cache, &histograms, op) {
                        Outcome::Full(back) => {
                            op = back;
                            std::thread::sleep(Duration::from_micros(50));
                        }
                        outcome => break outcome,
                    }
                };
                (thread, outcome)
            }
            PoolTask::Replica { payload, to } => match ops::replica_op(&shared, &histograms, &payload, to) {
                Ok(outcome) => (to.thread, outcome),
                Err(why) => {
                    tracing::warn!(%why, "dropping a malformed replication message");
                    continue;
                }
            },
        };
        debug_assert!(thread < mailboxes.len(), "an outcome for priority thread {thread}, of {}", mailboxes.len());
        if !matches!(outcome, Outcome::Queued) {
            mailboxes[thread].post_and_wake(Completion::Worked(Box::new(outcome)));
        }
    }
}
