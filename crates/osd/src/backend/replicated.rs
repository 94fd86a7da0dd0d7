//! The replicated backend (Ceph's ReplicatedBackend): every member holds
//! the whole object. The primary logs a mutation and sends the same entry
//! to each replica; reads are served by the primary, from its log (R1) or
//! its store (R2, R3); recovery copies whole objects (the peering machine,
//! `crate::peering::machine`). What is done with an entry, log it, apply it
//! or drop it, is the write path's ([`crate::backend::write_path`]).

use std::time::{Duration, Instant};

use bytes::Bytes;
use duplex_oplog::{EntryRef, RequestId};
use duplex_proto::osd::{OpKind, OpReply, Status, MAX_OBJECT_NAME, MAX_SNAP_OBJECT_NAME};

use crate::backend::common::{
    changed_range, check_limits, lock_served, log_fields, log_op_of, ok_reply, peering_reply, reply, uncommitted_reply,
    Interval,
};
use crate::backend::write_path::{Mutation, Offered, Refusal, WritePath};
use crate::backend::{PgBackend, Primary, WriteEnd};
use crate::messages::{ClientOp, ClientSlot, ElidedEntry, Job, Outcome, ReadJob};
use crate::metrics::{record, Histograms, Stage};
use crate::peering::schedule::{start_peering, PeeringBackend, Wanted};
use crate::peering::{Action, Peering};
use crate::pg::requests::RequestState;
use crate::pg::{pg_number, pool_of, Ack, ReplyTo, SharedPg};
use crate::shared::Shared;

/// The replicated backend over write path `P`.
pub struct Replicated<P>(pub(crate) P);

impl<P: WritePath> PgBackend for Replicated<P> {
    fn read(&self, at: &Primary<'_>, mut op: ClientOp) -> Outcome {
        match op.request.kind {
            OpKind::TierRead => return crate::tier::tier_read(at, op),
            OpKind::Diff => op.request.data = crate::tier::diff_arg(at.tier.is_some()),
            _ => {}
        }
        read(at.shared, at.pg, &at.interval, at.key, op, at.epoch)
    }

    fn mutate(&self, at: &Primary<'_>, op: ClientOp) -> Outcome {
        mutate(&self.0, at, op, None)
    }

    fn finish_write(&self, shared: &Shared, end: &WriteEnd) -> OpReply {
        let WriteEnd { pg, write, request, map_epoch, failed, answered } = *end;
        if !self.0.tracks_writes() {
            // Nothing was tracked, so there is nothing to end.
            let status = if failed { Status::Retry } else { Status::Ok };
            return OpReply { status, map_epoch, data: Bytes::new() };
        }
        // Every replicated write takes the PG lock once more here, to leave
        // the uncommitted set: the price of reads that never see it early.
        if let Some(pg_lock) = shared.pgs.get(pg) {
            let mut guard = pg_lock.lock().expect("PG lock");
            if answered {
                // Committed when it was logged: its client has the answer.
                guard.lag.end(write);
            } else {
                guard.uncommitted.end(write);
                if !request.is_none() {
                    guard.requests.finish(request, !failed);
                }
            }
            if !failed && guard.lag.watched() {
                // An eventual PG's replicas all answered now (a strong PG
                // reads no clock here).
                guard.lag.replicated(shared.now());
            }
            // Only a write of the interval the PG is active in says a member
            // of it missed an entry; a late failure from before does not.
            let current = guard.active.as_ref().is_some_and(|a| map_epoch >= a.interval);
            if failed && current && guard.active.take().is_some() {
                // A member missed an entry of this interval (it restarted,
                // lost the connection, or fell behind): its log now has a
                // gap only peering can fill. Writes wait until it has.
                tracing::warn!(pg, "a replicated write failed; the PG peers again");
            }
        }
        if failed {
            OpReply::error(Status::Retry, map_epoch, "a replica did not acknowledge; resend")
        } else {
            OpReply::ok(map_epoch)
        }
    }

    fn replica_op(
        &self,
        shared: &Shared,
        histograms: &Histograms,
        payload: &Bytes,
        to: ReplyTo,
    ) -> Result<Outcome, String> {
        let entry = EntryRef::decode(payload).ok_or("replication payload is not a valid log entry")?;
        if entry.encoded_len() != payload.len() {
            return Err("replication payload has trailing bytes".into());
        }
        let key = entry.pg;
        if duplex_store::Key::in_group(key, entry.object).is_err() || entry.object.len() > MAX_OBJECT_NAME {
            return Err("replicated entry names an object the store cannot hold".into());
        }
        if entry.snap != 0 && entry.object.len() > MAX_SNAP_OBJECT_NAME {
            return Err("replicated entry under a snapshot names an object too long to have clones".into());
        }
        check_limits(entry.op, entry.offset, entry.data)?;
        shared.metrics.replica_entries.add(1);
        if self.0.acknowledge_on_receipt() {
            // Received is all the ideal path asks of a replica.
            return Ok(Outcome::Acks { pg: key, acks: vec![Ack { seq: entry.seq, to }], status: Status::Ok });
        }
        let pg = match shared.pgs.get(key) {
            Some(pg) => pg,
            None => {
                // A new log only for a PG the map has: a peer must not make this
                // OSD create logs (files, memory) for any key it names.
                let view = shared.map.load();
                if view.pool(pool_of(key)).is_none_or(|pool| pg_number(key) >= pool.pg_num) {
                    // Perhaps this OSD's map is behind the primary's: refuse this
                    // entry (the primary fails the write, the client resends).
                    tracing::warn!(pg = key, epoch = view.epoch(), "refusing an entry for a PG this map lacks");
                    return Ok(Outcome::Acks {
                        pg: key,
                        acks: vec![Ack { seq: entry.seq, to }],
                        status: Status::Retry,
                    });
                }
                shared.pgs.get_or_open(key).map_err(|e| e.to_string())?
            }
        };
        let started = Instant::now();
        let guard = pg.lock().expect("PG lock");
        if !guard.accepts(entry.epoch) {
            // Peering has not activated this PG here for the sender's interval:
            // the entry is from a replaced primary, or comes before activation.
            let active = guard.active.as_ref().map(|a| a.interval);
            drop(guard);
            tracing::debug!(
                pg = key,
                seq = entry.seq,
                epoch = entry.epoch,
                ?active,
                "refusing an entry of another interval"
            );
            return Ok(Outcome::Acks { pg: key, acks: vec![Ack { seq: entry.seq, to }], status: Status::Retry });
        }
        let me = shared.config.id;
        if entry.op == duplex_oplog::OpKind::Elided && !guard.active.as_ref().is_some_and(|a| a.takes_elided(me)) {
            // Only a backfill target may take a write without its data (the
            // walk copies it there): a member would lose the write.
            drop(guard);
            tracing::error!(
                pg = key,
                seq = entry.seq,
                "refusing a write without its data: this OSD is no backfill target"
            );
            return Ok(Outcome::Acks { pg: key, acks: vec![Ack { seq: entry.seq, to }], status: Status::Invalid });
        }
        let outcome = self.0.take_replica(shared, guard, &Offered { entry: &entry, payload, to });
        record(histograms, Stage::LogAppend, started.elapsed().as_micros() as u64);
        Ok(outcome)
    }
}

impl<P: WritePath> PeeringBackend for Replicated<P> {
    fn start_peering(&self, key: u32, interval: u64, want: Wanted, scrub: Option<bool>) -> (Peering, Vec<Action>) {
        start_peering(key, interval, want, scrub)
    }
}

fn read(shared: &Shared, pg: &SharedPg, interval: &Interval<'_>, key: u32, op: ClientOp, epoch: u64) -> Outcome {
    let metrics = &shared.metrics;
    let request = &op.request;
    if !request.kind.is_data_read() {
        return metadata_read(shared, pg, interval, key, op, epoch);
    }
    let mut flush_first = false;
    {
        let Some(pg) = lock_served(pg, interval) else { return peering_reply(shared, &op, epoch) };
        let end = request.offset.saturating_add(request.length as u64);
        if pg.uncommitted.touches(&request.object, request.offset, end) {
            return uncommitted_reply(shared, &op, epoch);
        }
        // The log holds heads' changes: a snapshot's object is a clone the
        // flush makes, or the head as the store holds it.
        if pg.index.contains(&request.object) {
            let from_log = if request.snap == 0 {
                pg.index.read(&pg.log, &request.object, request.offset, request.length as u64)
            } else {
                None
            };
            if let Some(data) = from_log {
                drop(pg);
                debug_assert_eq!(data.len(), request.length as usize, "a read from the log returned another length");
                metrics.reads_r1.add(1);
                metrics.reads.add(1);
                metrics.read_bytes.add(data.len() as u64);
                return Outcome::Reply {
                    token: op.token,
                    slot: op.slot,
                    reply: OpReply { status: Status::Ok, map_epoch: epoch, data: Bytes::from(data) },
                    arrived: op.arrived,
                    kind: OpKind::Read,
                };
            }
            flush_first = true;
        }
    }
    if flush_first {
        metrics.reads_r3.add(1);
    } else {
        metrics.reads_r2.add(1);
    }
    metrics.reads.add(1);
    queue_read(shared, key, &op, epoch, flush_first)
}

/// Hands a read (data or metadata) to the PG's flusher, which answers it.
fn queue_read(shared: &Shared, key: u32, op: &ClientOp, epoch: u64, flush_first: bool) -> Outcome {
    let request = &op.request;
    debug_assert!(!request.kind.is_mutation(), "a mutation queued as a read");
    let data = request.kind.is_data_read();
    shared.send_job(
        key,
        Job::Read(ReadJob {
            kind: request.kind,
            pg: key,
            object: request.object.clone(),
            // An attribute's name, or a listing's prefix.
            arg: if data { Bytes::new() } else { request.data.clone() },
            // A diff's starting snapshot, and an omap listing's limit,
            // travel in its offset.
            offset: if data || matches!(request.kind, OpKind::Diff | OpKind::OmapList) { request.offset } else { 0 },
            len: if data { request.length } else { 0 },
            flush_first,
            reply: ClientSlot { thread: op.thread, token: op.token, slot: op.slot },
            map_epoch: epoch,
            snap: request.snap,
        }),
    );
    Outcome::Queued
}

/// Stats, attributes and listings come from the store, after a flush when
/// the log holds entries they depend on (the object's, or for a listing
/// any of the PG's).
fn metadata_read(
    shared: &Shared,
    pg: &SharedPg,
    interval: &Interval<'_>,
    key: u32,
    op: ClientOp,
    epoch: u64,
) -> Outcome {
    let request = &op.request;
    debug_assert!(!request.kind.is_data_read(), "a data read is no metadata read");
    let flush_first = {
        let Some(pg) = lock_served(pg, interval) else { return peering_reply(shared, &op, epoch) };
        if request.kind == OpKind::List {
            // A listing names objects, and a write in flight never removes
            // one: it may show a new name early, as a concurrent create would.
            !pg.index.is_empty()
        } else if matches!(request.kind, OpKind::ListSnaps | OpKind::Diff) {
            // Clones are made, and trimmed, under names of their own.
            !pg.index.is_empty()
        } else if pg.uncommitted.touches(&request.object, 0, u64::MAX) {
            return uncommitted_reply(shared, &op, epoch);
        } else {
            pg.index.contains(&request.object)
        }
    };
    shared.metrics.metadata_ops.add(1);
    queue_read(shared, key, &op, epoch, flush_first)
}

/// A mutation at the primary, on `path`. `max_lag`: an eventual pool's,
/// whose writes are acknowledged once logged here while the PG's
/// replication lag is under it (`crate::backend::eventual`).
pub(crate) fn mutate(path: &dyn WritePath, at: &Primary<'_>, op: ClientOp, max_lag: Option<Duration>) -> Outcome {
    let Primary { shared, histograms, pg, ref interval, key, epoch, .. } = *at;
    let metrics = &shared.metrics;
    let request = &op.request;
    let log_op = log_op_of(request.kind).expect("only mutations come here");
    debug_assert_eq!(
        interval.acting.first(),
        Some(&shared.config.id),
        "a mutation admitted at another OSD than the primary"
    );
    let (offset, data) = log_fields(request);
    let request_id = RequestId { client: request.client, tid: op.txid };
    let started = Instant::now();
    let write = shared.txid();
    let Some(mut guard) = lock_served(pg, interval) else { return peering_reply(shared, &op, epoch) };
    match guard.requests.get(request_id) {
        Some(RequestState::Committed) => {
            drop(guard);
            metrics.duplicate_requests.add(1);
            return ok_reply(&op, epoch);
        }
        Some(RequestState::InFlight) => {
            drop(guard);
            metrics.duplicate_requests.add(1);
            return reply(&op, Status::Retry, epoch, "this request is already in progress");
        }
        Some(RequestState::Failed) | None => {}
    }
    let tier = match at.tier {
        None => None,
        Some(_) => match crate::tier::admit(&mut guard, request, op.arrived) {
            Ok(admitted) => Some(admitted),
            Err((status, why)) => {
                let load = crate::tier::load_wanted(&mut guard, op.arrived);
                drop(guard);
                if let Some(load) = load {
                    shared.send_job(load.pg, Job::TierLoad(load));
                }
                if status == Status::Retry {
                    // A chunk to promote (or an index loading).
                    shared.wake_tier();
                }
                return reply(&op, status, epoch, why);
            }
        },
    };
    debug_assert!(
        tier.is_none() || crate::tier::current(&mut guard).is_some(),
        "a deduplicated PG's mutation admitted without its index"
    );
    let (start, end) = changed_range(log_op, offset, data);
    if guard.backfill_lock.as_ref().is_some_and(|(locked, s, e)| *locked == request.object && *s < end && start < *e) {
        drop(guard);
        metrics.backfill_retries.add(1);
        return reply(&op, Status::Retry, epoch, "the object is being copied to a new replica");
    }
    // A backfill's walk joins its targets to the PG's writes (pg/elide.rs):
    // meanwhile the writes wait, so that none is missed between the seq
    // the targets are activated at and the first they are sent.
    if guard.elide.as_mut().is_some_and(|elide| elide.holds(shared.now())) {
        drop(guard);
        metrics.backfill_retries.add(1);
        return reply(&op, Status::Retry, epoch, "a backfill target is joining the PG");
    }
    // The members and the backfill targets of the interval it serves, but
    // the targets whose walk has not begun (they take no write yet).
    let replicas = guard.replicas();
    debug_assert!(
        guard.active.as_ref().is_some_and(|a| a.members == interval.acting),
        "lock_served checked the interval"
    );
    debug_assert!(!replicas.contains(&shared.config.id), "the primary replicates to itself: {replicas:?}");
    // A write ahead of the backfill's walk goes to its targets without
    // its data, which the walk copies when it gets there (pg/elide.rs).
    let elided_to = guard
        .elide
        .as_mut()
        .filter(|_| path.may_elide())
        .and_then(|elide| elide.elides(&request.object).then(|| elide.joined().to_vec()));
    let early = match max_lag {
        // The ideal of an eventual pool answers what it received: no log,
        // no lag to keep.
        Some(_) if !path.tracks_writes() => Some(shared.now()),
        Some(max_lag) if !replicas.is_empty() => {
            let now = shared.now();
            (!guard.moving && guard.lag.may_acknowledge_early(now, max_lag)).then_some(now)
        }
        _ => None,
    };
    // The write as a log entry at `seq` (the oplog and ideal paths send it as it is).
    let entry_at = |seq: u64| EntryRef {
        pg: key,
        epoch: epoch as u32,
        version: seq,
        seq,
        op: log_op,
        object: &request.object,
        offset,
        data,
        request: request_id,
        snap: request.snap,
    };
    let mutation = Mutation {
        key,
        write,
        request: request_id,
        object: &request.object,
        range: (start, end),
        replicated: !replicas.is_empty(),
        early,
        entry_at: &entry_at,
        tier,
    };
    let (encoded, local) = match path.take(shared, guard, &mutation) {
        Ok(taken) => taken,
        Err(Refusal::Full) => return Outcome::Full(op),
        Err(Refusal::Reply(status, why)) => return reply(&op, status, epoch, why),
    };
    record(histograms, Stage::LogAppend, started.elapsed().as_micros() as u64);
    debug_assert!(replicas.is_empty() || !encoded.is_empty(), "an entry for the replicas was not encoded");
    if max_lag.is_some() && !replicas.is_empty() {
        // Counted once taken: a write parked for log room asks again.
        let counter = if early.is_some() { &metrics.eventual_early_acks } else { &metrics.eventual_lag_waits };
        counter.add(1);
    }
    match request.kind {
        OpKind::Write => {
            metrics.writes.add(1);
            metrics.write_bytes.add(data.len() as u64);
        }
        OpKind::Truncate => metrics.truncates.add(1),
        OpKind::Zero => metrics.zeroes.add(1),
        OpKind::Delete => metrics.deletes.add(1),
        _ => metrics.metadata_ops.add(1),
    }
    if replicas.is_empty() && local.is_none() {
        return ok_reply(&op, epoch);
    }
    let elided = elided_to.map(|to| {
        debug_assert!(to.iter().all(|target| replicas.contains(target)), "elided to {to:?}, not among {replicas:?}");
        let seq = duplex_oplog::entry::peek_seq(&encoded).expect("an encoded entry has a header");
        metrics.backfill_elided_writes.add(1);
        Box::new(ElidedEntry { entry: Bytes::from(entry_at(seq).elided().encode()), to })
    });
    Outcome::Replicate {
        write,
        token: op.token,
        slot: op.slot,
        entry: Bytes::from(encoded),
        replicas,
        local,
        arrived: op.arrived,
        map_epoch: epoch,
        pg: key,
        request: request_id,
        answered: max_lag.filter(|_| early.is_some()),
        elided,
    }
}
