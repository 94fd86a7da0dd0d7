//! What an operation does, independent of which thread runs it: a priority
//! thread inline (`threading = prioritized`) or a pool worker
//! (`threading = pool`). The result is an [`Outcome`]: the network I/O the
//! connection's owning thread still has to do.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Instant;

use bytes::Bytes;
use duplex_map::OsdId;
use duplex_oplog::{EntryRef, LogError, OpKind as LogOp, RequestId};
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status, MAX_OBJECT_NAME};

use crate::cluster::{ActingCache, MapView};
use crate::config::WritePath;
use crate::messages::{ClientOp, ClientSlot, Job, Outcome, ReadJob, SyncDone};
use crate::metrics::{record, Histograms, Stage};
use crate::pg::requests::RequestState;
use crate::pg::{pg_key, pg_number, pool_of, Ack, OfferError, Pg, ReplyTo, SharedPg};
use crate::shared::Shared;

fn reply(op: &ClientOp, status: Status, epoch: u64, message: impl std::fmt::Display) -> Outcome {
    Outcome::Reply {
        token: op.token,
        slot: op.slot,
        reply: OpReply::error(status, epoch, message),
        arrived: op.arrived,
        kind: op.request.kind,
    }
}

/// Runs a client operation as far as this OSD can without network I/O.
pub fn client_op(shared: &Shared, cache: &mut ActingCache, histograms: &Histograms, op: ClientOp) -> Outcome {
    let view = cache.view(&shared.map).clone();
    let epoch = view.epoch();
    if !shared.serving.load(Ordering::Acquire) {
        return reply(&op, Status::Retry, epoch, "the OSD is starting (replaying its logs)");
    }
    if !shared.lease.holds() {
        // Cut off from the monitors (or marked down): another OSD may be
        // primary by now, so even a read could return stale data.
        shared.metrics.lease_refusals.add(1);
        return reply(&op, Status::Retry, epoch, "this OSD holds no lease from the monitors");
    }
    let request = &op.request;
    if request.map_epoch > epoch {
        return reply(&op, Status::Retry, epoch, format!("this OSD's map (epoch {epoch}) is older than the client's"));
    }
    let Some(pool) = view.pool(request.pool) else {
        return reply(&op, Status::Invalid, epoch, format!("no pool {}", request.pool));
    };
    if request.pg >= pool.pg_num {
        return reply(&op, Status::WrongOsd, epoch, format!("pool {} has {} PGs", request.pool, pool.pg_num));
    }
    let Some(key) = pg_key(request.pool, request.pg) else {
        return reply(&op, Status::Invalid, epoch, "pool id too large for this OSD");
    };
    let min_size = pool.min_size as usize;
    let Some(acting) = cache.acting(&shared.map, request.pool, request.pg) else {
        return reply(&op, Status::Invalid, epoch, format!("no pool {}", request.pool));
    };
    if acting.first() != Some(&shared.config.id) {
        return reply(&op, Status::WrongOsd, epoch, format!("OSD {} is not the primary of this PG", shared.config.id));
    }
    // A listing's object field is a cursor, not one of the PG's objects.
    if request.kind != OpKind::List && duplex_placement::pg_of(&request.object, pool.pg_num) != request.pg {
        return reply(&op, Status::Invalid, epoch, "the object does not belong to this PG");
    }
    if let Some(log_op) = log_op_of(request.kind) {
        let (offset, data) = log_fields(request);
        if let Err(why) = check_limits(log_op, offset, data) {
            return reply(&op, Status::Invalid, epoch, why);
        }
    }
    let elapsed = op.arrived.elapsed().as_micros() as u64;
    record(histograms, Stage::Queue, elapsed);
    let pg = match shared.pgs.get_or_open(key) {
        Ok(pg) => pg,
        Err(err) => return reply(&op, Status::Io, epoch, err),
    };
    let interval = Interval { acting: &acting, view: &view };
    match request.kind {
        kind if !kind.is_mutation() => read(shared, &pg, &interval, key, op, epoch),
        _ if acting.len() < min_size => reply(
            &op,
            Status::Retry,
            epoch,
            format!("only {} of the PG's replicas are up; writes need {min_size}", acting.len()),
        ),
        _ => mutate(shared, histograms, &pg, &interval, key, op, epoch),
    }
}

/// The PG's interval in the current map: its acting set, and the map that
/// says which of its members restarted since the PG went active.
struct Interval<'a> {
    acting: &'a [OsdId],
    view: &'a MapView,
}

impl Interval<'_> {
    /// Whether the PG went active (peered) for this interval; until then its
    /// operations are answered `Retry` (they never see a half-recovered PG).
    fn served_by(&self, pg: &Pg) -> bool {
        pg.serves(self.acting, |osd| self.view.map.osds.get(&osd).map_or(u64::MAX, |o| o.state_epoch))
    }
}

/// Locks the PG if it serves this interval (`None`: it is peering, answer
/// [`peering_reply`]). Under this one lock a write's append cannot slip
/// past a fence.
fn lock_served<'a>(pg: &'a SharedPg, interval: &Interval<'_>) -> Option<MutexGuard<'a, Pg>> {
    let guard = pg.lock().expect("PG lock");
    interval.served_by(&guard).then_some(guard)
}

fn peering_reply(shared: &Shared, op: &ClientOp, epoch: u64) -> Outcome {
    shared.metrics.peering_retries.add(1);
    reply(op, Status::Retry, epoch, "the PG is peering (its replicas are being brought up to date)")
}

/// The bytes a mutation changes, for [`crate::pg::Uncommitted`]: a write
/// its range; anything else (size, existence, attributes) the whole object.
fn changed_range(op: LogOp, offset: u64, data: &[u8]) -> (u64, u64) {
    match op {
        LogOp::Write => (offset, offset.saturating_add(data.len() as u64)),
        _ => (0, u64::MAX),
    }
}

fn uncommitted_reply(shared: &Shared, op: &ClientOp, epoch: u64) -> Outcome {
    shared.metrics.uncommitted_retries.add(1);
    reply(op, Status::Retry, epoch, "a write to this object is not yet on every replica")
}

/// The log op a mutation becomes (`None`: not a mutation).
fn log_op_of(kind: OpKind) -> Option<LogOp> {
    Some(match kind {
        OpKind::Write => LogOp::Write,
        OpKind::Truncate => LogOp::Truncate,
        OpKind::Delete => LogOp::Delete,
        OpKind::SetAttr => LogOp::SetAttr,
        OpKind::RemoveAttr => LogOp::RemoveAttr,
        OpKind::CreatePreallocated => LogOp::CreatePreallocated,
        OpKind::Read | OpKind::Stat | OpKind::GetAttr | OpKind::ListAttrs | OpKind::List => return None,
    })
}

/// A mutation's log entry `offset` and `data` (the table in the oplog's entry docs).
fn log_fields(request: &OpRequest) -> (u64, &[u8]) {
    match request.kind {
        OpKind::Write | OpKind::SetAttr => (request.offset, &request.data),
        OpKind::Truncate | OpKind::CreatePreallocated => (request.offset, &[]),
        OpKind::RemoveAttr => (0, &request.data),
        _ => (0, &[]),
    }
}

fn read(shared: &Shared, pg: &SharedPg, interval: &Interval<'_>, key: u32, op: ClientOp, epoch: u64) -> Outcome {
    let metrics = &shared.metrics;
    let request = &op.request;
    if request.kind != OpKind::Read {
        return metadata_read(shared, pg, interval, key, op, epoch);
    }
    let mut flush_first = false;
    {
        let Some(pg) = lock_served(pg, interval) else { return peering_reply(shared, &op, epoch) };
        let end = request.offset.saturating_add(request.length as u64);
        if pg.uncommitted.touches(&request.object, request.offset, end) {
            return uncommitted_reply(shared, &op, epoch);
        }
        if pg.index.contains(&request.object) {
            if let Some(data) = pg.index.read(&pg.log, &request.object, request.offset, request.length as u64) {
                drop(pg);
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
    let data = request.kind == OpKind::Read;
    shared.send_job(
        key,
        Job::Read(ReadJob {
            kind: request.kind,
            pg: key,
            object: request.object.clone(),
            // An attribute's name, or a listing's prefix.
            arg: if data { Bytes::new() } else { request.data.clone() },
            offset: if data { request.offset } else { 0 },
            len: if data { request.length } else { 0 },
            flush_first,
            reply: ClientSlot { thread: op.thread, token: op.token, slot: op.slot },
            map_epoch: epoch,
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
    let flush_first = {
        let Some(pg) = lock_served(pg, interval) else { return peering_reply(shared, &op, epoch) };
        if request.kind == OpKind::List {
            // A listing names objects, and a write in flight never removes
            // one: it may show a new name early, as a concurrent create would.
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

fn mutate(
    shared: &Shared,
    histograms: &Histograms,
    pg: &SharedPg,
    interval: &Interval<'_>,
    key: u32,
    op: ClientOp,
    epoch: u64,
) -> Outcome {
    let metrics = &shared.metrics;
    let request = &op.request;
    let log_op = log_op_of(request.kind).expect("only mutations come here");
    let (offset, data) = log_fields(request);
    let request_id = RequestId { client: request.client, tid: op.txid };
    let started = Instant::now();
    let write = shared.txid();
    let Some(mut guard) = lock_served(pg, interval) else { return peering_reply(shared, &op, epoch) };
    match guard.requests.get(request_id) {
        Some(RequestState::Committed) => {
            drop(guard);
            metrics.duplicate_requests.add(1);
            return Outcome::Reply {
                token: op.token,
                slot: op.slot,
                reply: OpReply { status: Status::Ok, map_epoch: epoch, data: Bytes::new() },
                arrived: op.arrived,
                kind: request.kind,
            };
        }
        Some(RequestState::InFlight) => {
            drop(guard);
            metrics.duplicate_requests.add(1);
            return reply(&op, Status::Retry, epoch, "this request is already in progress");
        }
        Some(RequestState::Failed) | None => {}
    }
    let (start, end) = changed_range(log_op, offset, data);
    if guard.backfill_lock.as_ref().is_some_and(|(locked, s, e)| *locked == request.object && *s < end && start < *e) {
        drop(guard);
        metrics.backfill_retries.add(1);
        return reply(&op, Status::Retry, epoch, "the object is being copied to a new replica");
    }
    // The members and the backfill targets of the interval it serves.
    let replicas = guard.active.as_ref().map(|a| a.replicas()).unwrap_or_default();
    debug_assert!(
        guard.active.as_ref().is_some_and(|a| a.members == interval.acting),
        "lock_served checked the interval"
    );
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
    };
    let (encoded, local) = match shared.config.write_path {
        WritePath::Oplog => {
            let entry = entry_at(guard.log.next_seq());
            let encoded = entry.encode();
            // Encoded once: the log and every replica's frame take these bytes.
            crate::metrics::copies::count(crate::metrics::copies::Site::Encode, data.len());
            let state = if replicas.is_empty() { RequestState::Committed } else { RequestState::InFlight };
            match guard.append_encoded(&entry, &encoded, state) {
                Ok(()) => {}
                Err(LogError::Full) => {
                    guard.waiters = true;
                    drop(guard);
                    metrics.backpressure_waits.add(1);
                    shared.send_job(key, Job::Flush(key));
                    return Outcome::Full(op);
                }
                Err(LogError::TooLarge(len)) => {
                    return reply(
                        &op,
                        Status::Invalid,
                        epoch,
                        format!("a {len}-byte entry does not fit this OSD's PG log; split the write"),
                    )
                }
                Err(err) => return reply(&op, Status::Io, epoch, err),
            }
            if !replicas.is_empty() {
                guard.uncommitted.begin(write, request.object.clone(), start, end);
            }
            let depth = guard.log.len();
            let was_dirty = std::mem::replace(&mut guard.dirty, true);
            drop(guard);
            notify_flusher(shared, key, depth, was_dirty);
            (encoded, None)
        }
        WritePath::Ideal => {
            // Nothing is logged, tracked or stored: only the network and
            // the threads remain (the limit `bench/run` compares against).
            drop(guard);
            let encoded = if replicas.is_empty() { Vec::new() } else { entry_at(0).encode() };
            crate::metrics::copies::count(crate::metrics::copies::Site::Encode, data.len());
            (encoded, None)
        }
        WritePath::Sync => {
            guard.sync_seq += 1;
            let seq = guard.sync_seq;
            guard.requests.set(request_id, RequestState::InFlight, seq);
            guard.uncommitted.begin(write, request.object.clone(), start, end);
            drop(guard);
            let entry = entry_at(seq).to_owned();
            // Encoded only to send: with no replicas, nothing reads it.
            let encoded = if replicas.is_empty() { Vec::new() } else { entry.encode() };
            (encoded, Some(entry))
        }
    };
    record(histograms, Stage::LogAppend, started.elapsed().as_micros() as u64);
    match request.kind {
        OpKind::Write => {
            metrics.writes.add(1);
            metrics.write_bytes.add(data.len() as u64);
        }
        OpKind::Truncate => metrics.truncates.add(1),
        OpKind::Delete => metrics.deletes.add(1),
        _ => metrics.metadata_ops.add(1),
    }
    if replicas.is_empty() && local.is_none() {
        return Outcome::Reply {
            token: op.token,
            slot: op.slot,
            reply: OpReply { status: Status::Ok, map_epoch: epoch, data: Bytes::new() },
            arrived: op.arrived,
            kind: request.kind,
        };
    }
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
    }
}

/// A replicated write's end at its primary, once every replica answered
/// (or the wait timed out): notes the request's fate in the PG's table,
/// deactivates the PG when a member of its current interval missed the
/// entry, and returns the client's reply.
pub fn finish_write(shared: &Shared, pg: u32, write: u64, request: RequestId, map_epoch: u64, failed: bool) -> OpReply {
    if shared.config.write_path == WritePath::Ideal {
        // Nothing was tracked, so there is nothing to end.
        let status = if failed { Status::Retry } else { Status::Ok };
        return OpReply { status, map_epoch, data: Bytes::new() };
    }
    // Every replicated write takes the PG lock once more here, to leave
    // the uncommitted set: the price of reads that never see it early.
    if let Some(pg_lock) = shared.pgs.get(pg) {
        let mut guard = pg_lock.lock().expect("PG lock");
        guard.uncommitted.end(write);
        if !request.is_none() {
            guard.requests.finish(request, !failed);
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
        OpReply { status: Status::Ok, map_epoch, data: Bytes::new() }
    }
}

/// Whether peering has moved `pg` past the interval a write was sent in
/// (`map_epoch`): its members were fenced, so they will not all
/// acknowledge it any more. Its primary fails it at once (the client
/// resends, under the same request id) instead of holding it, and every
/// resend of it, until the replication timeout.
pub fn write_outlived(shared: &Shared, pg: u32, map_epoch: u64) -> bool {
    shared.pgs.get(pg).is_some_and(|pg| pg.lock().expect("PG lock").asked_interval > map_epoch)
}

/// Wakes the PG's flusher: arm its timer on the first entry, flush at
/// once at each multiple of the threshold.
fn notify_flusher(shared: &Shared, key: u32, depth: usize, was_dirty: bool) {
    let threshold = shared.config.flush_threshold.max(1);
    if depth >= threshold && depth.is_multiple_of(threshold) {
        shared.send_job(key, Job::Flush(key));
    } else if !was_dirty {
        shared.send_job(key, Job::Dirty(key));
    }
}

/// Refuses what the store could never apply: an entry that passed here is
/// logged and acknowledged, so a flush must not fail on it later. (One
/// thing cannot be checked without the store: that a new attribute keeps
/// its object's attributes within their total; see the flusher.)
fn check_limits(op: LogOp, offset: u64, data: &[u8]) -> Result<(), String> {
    let limit = duplex_store::MAX_OBJECT_SIZE;
    let end = match op {
        LogOp::Write => offset.saturating_add(data.len() as u64),
        LogOp::Truncate | LogOp::CreatePreallocated => offset,
        LogOp::Delete => 0,
        LogOp::SetAttr | LogOp::RemoveAttr => {
            let name_len = if op == LogOp::SetAttr { offset as usize } else { data.len() };
            let value_len = data.len().saturating_sub(name_len);
            if name_len == 0 || name_len > duplex_store::MAX_ATTR_NAME_LEN || name_len > data.len() {
                return Err(format!("attribute names are 1 to {} bytes", duplex_store::MAX_ATTR_NAME_LEN));
            }
            if value_len > duplex_store::MAX_ATTR_VALUE_LEN {
                return Err(format!("attribute values are at most {} bytes", duplex_store::MAX_ATTR_VALUE_LEN));
            }
            0
        }
    };
    if end > limit {
        return Err(format!("the operation reaches byte {end}; objects end at {limit}"));
    }
    Ok(())
}

/// Replica side: logs (or, sync, applies) one replicated entry, whose
/// bytes are logged as they came. `Err`: the payload is not an entry this
/// OSD could ever apply, and the connection that sent it is dropped.
pub fn replica_op(shared: &Shared, histograms: &Histograms, payload: &Bytes, to: ReplyTo) -> Result<Outcome, String> {
    let entry = EntryRef::decode(payload).ok_or("replication payload is not a valid log entry")?;
    if entry.encoded_len() != payload.len() {
        return Err("replication payload has trailing bytes".into());
    }
    let key = entry.pg;
    if duplex_store::Key::in_group(key, entry.object).is_err() || entry.object.len() > MAX_OBJECT_NAME {
        return Err("replicated entry names an object the store cannot hold".into());
    }
    check_limits(entry.op, entry.offset, entry.data)?;
    shared.metrics.replica_entries.add(1);
    if shared.config.write_path == WritePath::Ideal {
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
                return Ok(Outcome::Acks { pg: key, acks: vec![Ack { seq: entry.seq, to }], status: Status::Retry });
            }
            shared.pgs.get_or_open(key).map_err(|e| e.to_string())?
        }
    };
    let started = Instant::now();
    let mut guard = pg.lock().expect("PG lock");
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
    if shared.config.write_path == WritePath::Sync {
        drop(guard);
        shared.send_job(key, Job::SyncApply { entry: entry.to_owned(), done: SyncDone::Replica(to) });
        return Ok(Outcome::Queued);
    }
    let before = guard.log.len();
    let (acks, status) = match guard.offer(&entry, payload, to) {
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
    record(histograms, Stage::LogAppend, started.elapsed().as_micros() as u64);
    if blocked {
        // The next entry is waiting for room: make some.
        shared.send_job(key, Job::Flush(key));
    } else if depth > before {
        notify_flusher(shared, key, depth, was_dirty);
    }
    Ok(Outcome::Acks { pg: key, acks, status })
}
