//! The write-path ablation (`write_path = oplog | sync | ideal`, DESIGN.md
//! §6) as one seam: what a replicated backend does with a mutation at the
//! primary and with an entry at a replica, and whether a write's end has
//! anything to settle. The operation log is the product; `sync` (apply to
//! the store before acknowledging) is the baseline it is measured against;
//! `ideal` (acknowledge what was received, store nothing) is the limit.

use std::sync::MutexGuard;

use bytes::Bytes;
use duplex_oplog::{Entry, EntryRef, LogError, RequestId};
use duplex_proto::osd::Status;

use crate::backend::common::notify_flusher;
use crate::messages::{Job, Outcome, SyncDone};
use crate::metrics::copies::{self, Site};
use crate::pg::requests::RequestState;
use crate::pg::{Ack, OfferError, Pg, ReplyTo};
use crate::shared::Shared;

/// A mutation the primary takes into its PG.
pub(crate) struct Mutation<'a> {
    pub key: u32,
    /// The write's id among the PG's uncommitted writes.
    pub write: u64,
    pub request: RequestId,
    pub object: &'a Bytes,
    /// The bytes it changes (`crate::pg::Uncommitted`).
    pub range: (u64, u64),
    /// It goes to replicas (else this OSD is the PG's only member).
    pub replicated: bool,
    /// `Some(now)`: its client is answered once it is logged here, before
    /// its replicas (an eventual pool's, `crate::backend::eventual`): it is
    /// committed and readable at once, and counts in the PG's replication
    /// lag from `now`.
    pub early: Option<std::time::Instant>,
    /// The write as a log entry at a seq.
    pub entry_at: &'a dyn Fn(u64) -> EntryRef<'a>,
    /// A deduplicated PG's tier state change, made with the append.
    pub tier: Option<crate::tier::Admitted>,
}

/// A replicated entry a replica's PG accepts: decoded, its bytes as they
/// came (the log takes them as they are), and where its ack goes.
pub(crate) struct Offered<'a> {
    pub entry: &'a EntryRef<'a>,
    pub payload: &'a Bytes,
    pub to: ReplyTo,
}

/// Why a mutation was not taken.
pub(crate) enum Refusal {
    /// The PG's log is full: hold the operation until a flush makes room.
    Full,
    /// End the operation with this answer.
    Reply(Status, String),
}

/// What the primary sends and waits for: the encoded entry for the
/// replicas, and on the sync path the local apply to wait for too.
pub(crate) type Taken = (Vec<u8>, Option<Entry>);

pub(crate) trait WritePath: Send + Sync {
    /// Primary: takes `mutation` into the PG (`guard` is released here).
    fn take(&self, shared: &Shared, guard: MutexGuard<'_, Pg>, mutation: &Mutation<'_>) -> Result<Taken, Refusal>;

    /// Whether a write's end has a request and an uncommitted range to
    /// settle in its PG (`false`: nothing was tracked).
    fn tracks_writes(&self) -> bool {
        true
    }

    /// Whether backfill targets may be sent writes ahead of their walk
    /// without the data (`crate::pg::elide`): only where replicas log
    /// entries (a sync replica applies what it gets at once).
    fn may_elide(&self) -> bool {
        false
    }

    /// Replica: the answer before the entry is even looked at in a PG, if
    /// this path gives one.
    fn acknowledge_on_receipt(&self) -> bool {
        false
    }

    /// Replica: takes an entry its PG accepts (`guard` is released here).
    fn take_replica(&self, shared: &Shared, guard: MutexGuard<'_, Pg>, offered: &Offered<'_>) -> Outcome;
}

/// `write_path = oplog`: the entry goes to the PG's operation log (and its
/// index cache); the flusher applies it to the store later.
pub(crate) struct Logged;

/// `write_path = sync`: no log; the store applies the entry before it is
/// acknowledged, at the primary and at each replica.
pub(crate) struct SyncApply;

/// `write_path = ideal`: acknowledged once every replica received it;
/// nothing is logged, tracked or stored. A benchmark's limit only.
pub(crate) struct Ideal;

impl WritePath for Logged {
    fn may_elide(&self) -> bool {
        true
    }

    fn take(&self, shared: &Shared, mut guard: MutexGuard<'_, Pg>, m: &Mutation<'_>) -> Result<Taken, Refusal> {
        debug_assert!(
            matches!(guard.requests.get(m.request), None | Some(RequestState::Failed)),
            "a request in flight or committed is taken again"
        );
        let entry = (m.entry_at)(guard.log.next_seq());
        debug_assert_eq!(entry.pg, m.key, "a mutation's entry for another PG");
        let encoded = entry.encode();
        // Encoded once: the log and every replica's frame take these bytes.
        copies::count(Site::Encode, entry.data.len());
        debug_assert!(m.early.is_none() || m.replicated, "an unreplicated write acknowledged early");
        let state = if m.replicated && m.early.is_none() { RequestState::InFlight } else { RequestState::Committed };
        let before = guard.log.len();
        match guard.append_encoded(&entry, &encoded, state) {
            Ok(()) => {}
            Err(LogError::Full) => {
                debug_assert!(!guard.log.is_empty(), "an empty log is never full");
                guard.waiters = true;
                drop(guard);
                shared.metrics.backpressure_waits.add(1);
                shared.send_job(m.key, Job::Flush(m.key));
                return Err(Refusal::Full);
            }
            Err(LogError::TooLarge(len)) => {
                let why = format!("a {len}-byte entry does not fit this OSD's PG log; split the write");
                return Err(Refusal::Reply(Status::Invalid, why));
            }
            Err(err) => return Err(Refusal::Reply(Status::Io, err.to_string())),
        }
        debug_assert_eq!(guard.log.len(), before + 1, "one entry appended");
        debug_assert_eq!(guard.last_seq(), entry.seq, "the entry is the log's newest");
        if let Some(admitted) = &m.tier {
            crate::tier::commit(&mut guard, admitted);
        }
        if let Some(at) = m.early {
            guard.lag.begin(m.write, at, m.object.clone(), m.range);
        } else if m.replicated {
            guard.uncommitted.begin(m.write, m.object.clone(), m.range.0, m.range.1);
        }
        let depth = guard.log.len();
        let was_dirty = std::mem::replace(&mut guard.dirty, true);
        drop(guard);
        notify_flusher(shared, m.key, depth, was_dirty);
        Ok((encoded, None))
    }

    fn take_replica(&self, shared: &Shared, mut guard: MutexGuard<'_, Pg>, offered: &Offered<'_>) -> Outcome {
        let Offered { entry, payload, to } = *offered;
        let key = entry.pg;
        let before = guard.log.len();
        let (acks, status) = match guard.offer(entry, payload, to) {
            Ok(acks) => (acks, Status::Ok),
            Err(err @ OfferError::TooFarAhead { .. }) => {
                tracing::warn!(pg = key, %err, "refusing a replicated entry");
                (vec![Ack { seq: entry.seq, to }], Status::Retry)
            }
            Err(err @ OfferError::Diverged { .. }) => {
                shared.metrics.diverged_entries.add(1);
                tracing::error!(pg = key, %err, "refusing a replicated entry");
                (vec![Ack { seq: entry.seq, to }], Status::Retry)
            }
            Err(OfferError::Log(err)) => {
                tracing::error!(pg = key, %err, "replica log append failed");
                (vec![Ack { seq: entry.seq, to }], Status::Io)
            }
        };
        debug_assert!(guard.log.len() >= before, "offering an entry never shrinks the log");
        debug_assert!(
            status != Status::Ok || acks.iter().all(|ack| ack.seq <= guard.last_seq()),
            "an entry acknowledged before it was logged"
        );
        if let Some((next, first)) = guard.take_stalled_gap(crate::pg::STALLED_GAP) {
            shared.metrics.stalled_replica_pgs.add(1);
            tracing::error!(
                pg = key,
                waiting_for = next,
                first_held = first,
                "replica PG has waited over 5 s for entries it missed; writes to this PG fail until its \
                 primary peers it again"
            );
        }
        let depth = guard.log.len();
        let blocked = guard.waiting_for_room();
        let was_dirty = if depth > before { std::mem::replace(&mut guard.dirty, true) } else { true };
        drop(guard);
        if blocked {
            // The next entry is waiting for room: make some.
            shared.send_job(key, Job::Flush(key));
        } else if depth > before {
            notify_flusher(shared, key, depth, was_dirty);
        }
        Outcome::Acks { pg: key, acks, status }
    }
}

impl WritePath for SyncApply {
    fn take(&self, _shared: &Shared, mut guard: MutexGuard<'_, Pg>, m: &Mutation<'_>) -> Result<Taken, Refusal> {
        debug_assert!(
            matches!(guard.requests.get(m.request), None | Some(RequestState::Failed)),
            "a request in flight or committed is taken again"
        );
        debug_assert!(m.early.is_none(), "only the log acknowledges a write early");
        guard.sync_seq += 1;
        let seq = guard.sync_seq;
        debug_assert!(seq > guard.last_seq(), "the sync path reused seq {seq} of the log");
        guard.requests.set(m.request, RequestState::InFlight, seq);
        guard.uncommitted.begin(m.write, m.object.clone(), m.range.0, m.range.1);
        if let Some(admitted) = &m.tier {
            crate::tier::commit(&mut guard, admitted);
        }
        drop(guard);
        let entry = (m.entry_at)(seq).to_owned();
        debug_assert_eq!(entry.seq, seq);
        // Encoded only to send: with no replicas, nothing reads it.
        let encoded = if m.replicated { entry.encode() } else { Vec::new() };
        Ok((encoded, Some(entry)))
    }

    fn take_replica(&self, shared: &Shared, guard: MutexGuard<'_, Pg>, offered: &Offered<'_>) -> Outcome {
        drop(guard);
        let Offered { entry, to, .. } = *offered;
        if entry.op == duplex_oplog::OpKind::Elided {
            // A backfill target's (its primary logs entries): nothing to apply.
            return Outcome::Acks { pg: entry.pg, acks: vec![Ack { seq: entry.seq, to }], status: Status::Ok };
        }
        shared.send_job(entry.pg, Job::SyncApply { entry: entry.to_owned(), done: SyncDone::Replica(to) });
        Outcome::Queued
    }
}

impl WritePath for Ideal {
    fn take(&self, _shared: &Shared, mut guard: MutexGuard<'_, Pg>, m: &Mutation<'_>) -> Result<Taken, Refusal> {
        // Nothing is logged, tracked or stored: only the network and the
        // threads remain (the limit `bench/run` compares against).
        // An eventual pool's write here is answered on receipt (`early`): the ideal.
        if let Some(admitted) = &m.tier {
            crate::tier::commit(&mut guard, admitted);
        }
        drop(guard);
        let entry = (m.entry_at)(0);
        copies::count(Site::Encode, entry.data.len());
        let encoded = if m.replicated { entry.encode() } else { Vec::new() };
        Ok((encoded, None))
    }

    fn tracks_writes(&self) -> bool {
        false
    }

    fn acknowledge_on_receipt(&self) -> bool {
        true
    }

    fn take_replica(&self, _shared: &Shared, guard: MutexGuard<'_, Pg>, offered: &Offered<'_>) -> Outcome {
        drop(guard);
        let Offered { entry, to, .. } = *offered;
        Outcome::Acks { pg: entry.pg, acks: vec![Ack { seq: entry.seq, to }], status: Status::Ok }
    }
}
