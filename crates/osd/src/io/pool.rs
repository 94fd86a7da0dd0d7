//! The pool workers of the `threading = pool` ablation: the classic
//! messenger-plus-worker-pool design that DESIGN.md §6 measures the
//! prioritized threads against.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::cluster::ActingCache;
use crate::io::ops;
use crate::messages::{Completion, Mailbox, Outcome, PoolTask};
use crate::shared::Shared;

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
