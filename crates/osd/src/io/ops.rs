//! What an operation does, independent of which thread runs it: a priority
//! thread inline (`threading = prioritized`) or a pool worker
//! (`threading = pool`). The result is an [`Outcome`]: the network I/O the
//! connection's owning thread still has to do.
//!
//! Here is the admission every operation passes (the OSD serves, holds a
//! lease, is the PG's primary in a map at least as new as the client's,
//! the operation is within limits); what the operation then does is its
//! pool's backend's ([`crate::backend`]).

use std::sync::atomic::Ordering;

use bytes::Bytes;
use duplex_oplog::OpKind as LogOp;
use duplex_proto::osd::{OpKind, OpReply, Status};

use crate::backend::common::{check_limits, log_fields, log_op_of, reply, Interval};
use crate::backend::{self, Primary, WriteEnd};
use crate::cluster::ActingCache;
use crate::messages::{ClientOp, Outcome};
use crate::metrics::{record, Histograms, Stage};
use crate::pg::{pg_key, ReplyTo};
use crate::shared::Shared;

/// Runs a client operation as far as this OSD can without network I/O.
pub fn client_op(shared: &Shared, cache: &mut ActingCache, histograms: &Histograms, op: ClientOp) -> Outcome {
    run(shared, cache, histograms, op, false)
}

/// Runs again an erasure-coded operation whose object it waited for, and
/// which holds it now (`crate::pg::object_queue`). Returns the outcome,
/// and the operations waiting for the object that hold it now if this one
/// ended here without starting (it hands the object on).
pub fn resume(
    shared: &Shared,
    cache: &mut ActingCache,
    histograms: &Histograms,
    op: ClientOp,
) -> (Outcome, Vec<ClientOp>) {
    let key = pg_key(op.request.pool, op.request.pg);
    let object = op.request.object.clone();
    let outcome = run(shared, cache, histograms, op, true);
    // An erasure-coded task under way holds the object until it ends.
    let started = matches!(&outcome, Outcome::Erasure(_));
    let next = match key {
        Some(key) if !started => backend::erasure::release(shared, key, &object),
        _ => Vec::new(),
    };
    (outcome, next)
}

fn run(shared: &Shared, cache: &mut ActingCache, histograms: &Histograms, op: ClientOp, resumed: bool) -> Outcome {
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
    let me = shared.config.id;
    if request.kind == OpKind::ShardRead {
        // A member's own shard, for its primary: any member serves it.
        if !pool.is_erasure() || !acting.contains(&me) {
            return reply(&op, Status::WrongOsd, epoch, format!("OSD {me} holds no shard of this PG"));
        }
    } else if duplex_map::primary_of(&acting) != Some(me) {
        return reply(&op, Status::WrongOsd, epoch, format!("OSD {me} is not the primary of this PG"));
    }
    // A listing's object field is a cursor, and a trim's a name prefix,
    // not one of the PG's objects.
    let names_an_object = !matches!(request.kind, OpKind::List | OpKind::TrimSnaps);
    if names_an_object && duplex_placement::pg_of(&request.object, pool.pg_num) != request.pg {
        return reply(&op, Status::Invalid, epoch, "the object does not belong to this PG");
    }
    if let Some(why) = crate::tier::pool_refuses(pool, request) {
        return reply(&op, Status::Invalid, epoch, why);
    }
    if request.kind == OpKind::TrimSnaps {
        return queue_trim(shared, &op, key, epoch);
    }
    if request.kind == OpKind::Watch {
        // Answered later, by a mutation of the object or its time running
        // out (the caller sends an answer now without a reply slot).
        if shared.watchers.add(op.thread, op.token, op.txid, request, op.arrived) {
            return Outcome::Queued;
        }
        return answered(&op, crate::watchers::answer(false, epoch));
    }
    let mut op = op;
    if op.request.kind == OpKind::TrimClone {
        // The clone is an object of its own (crate::snaps): what is logged,
        // replicated and recovered is the delete of its name.
        // (Decode bounded the name so that its clone's fits a store key.)
        op.request.object = Bytes::from(crate::snaps::clone_name(&op.request.object, op.request.offset));
        op.request.kind = OpKind::Delete;
        op.request.offset = 0;
    }
    let request = &op.request;
    if let Some(log_op) = log_op_of(request.kind) {
        let (offset, data) = log_fields(request);
        if let Err(why) = check_limits(log_op, offset, data) {
            return reply(&op, Status::Invalid, epoch, why);
        }
        // A write that adds data to a PG one of whose members is full is
        // refused at once; what frees space (deletes, truncates, removing
        // attributes or omap entries, discards) always goes on.
        if matches!(
            log_op,
            LogOp::Write
                | LogOp::SetAttr
                | LogOp::CreatePreallocated
                | LogOp::CopyUp
                | LogOp::OmapSet
                | LogOp::ChunkPut
        ) {
            let here = shared.config.id;
            let full = view.full_osds.iter().find(|osd| acting.contains(osd)).copied().or_else(|| {
                // Full here before the map says so (the monitor is a round trip away).
                shared.metrics.locally_full.load(std::sync::atomic::Ordering::Relaxed).then_some(here)
            });
            if let Some(full) = full {
                shared.metrics.full_refusals.add(1);
                return reply(&op, Status::NoSpace, epoch, format!("osd.{full} is full"));
            }
        }
    }
    let elapsed = op.arrived.elapsed().as_micros() as u64;
    record(histograms, Stage::Queue, elapsed);
    let pg = match shared.pgs.get_or_open(key) {
        Ok(pg) => pg,
        Err(err) => return reply(&op, Status::Io, epoch, err),
    };
    let backend = backend::for_pool(shared.config.write_path, pool);
    // An erasure-coded PG's set has holes where a shard's OSD is down.
    let up_members = acting.iter().filter(|osd| **osd != duplex_map::NO_OSD).count();
    let interval = Interval { acting: &acting, view: &view };
    let at = Primary {
        shared,
        histograms,
        pg: &pg,
        interval,
        key,
        epoch,
        resumed,
        tier: pool.dedup,
        eventual: pool.eventual,
    };
    let (token, slot) = (op.token, op.slot);
    let outcome = match request.kind {
        kind if !kind.is_mutation() => backend.read(&at, op),
        _ if up_members < min_size => reply(
            &op,
            Status::Retry,
            epoch,
            format!("only {up_members} of the PG's replicas are up; writes need {min_size}"),
        ),
        _ => {
            // The watches it wakes are taken before the request moves on (one
            // atomic load while nobody watches), answered once it is accepted.
            let woken = shared.watchers.woken_by(&op.request);
            let outcome = backend.mutate(&at, op);
            shared.watchers.settle(woken, matches!(outcome, Outcome::Replicate { .. }), epoch);
            outcome
        }
    };
    debug_assert!(
        match &outcome {
            Outcome::Reply { token: t, slot: s, .. } | Outcome::Replicate { token: t, slot: s, .. } =>
                (*t, *s) == (token, slot),
            Outcome::Full(back) => (back.token, back.slot) == (token, slot),
            Outcome::Erasure(task) => (task.op.token, task.op.slot) == (token, slot),
            Outcome::Queued => true,
            Outcome::Acks { .. } => false,
        },
        "a client operation's outcome answers another request, or is a replica's"
    );
    outcome
}

/// Hands a `TrimSnaps` to the snapshot trimmer (crate::trimmer).
fn queue_trim(shared: &Shared, op: &ClientOp, key: u32, epoch: u64) -> Outcome {
    let Some(trims) = shared.snap_trims.get() else {
        return reply(op, Status::Invalid, epoch, "this OSD trims no snapshots");
    };
    let live = op.request.data.chunks_exact(8).map(|id| u64::from_le_bytes(id.try_into().expect("8 bytes"))).collect();
    let job = crate::trimmer::TrimJob { pg: key, prefix: op.request.object.clone(), live };
    if trims.try_send(job).is_err() {
        return reply(op, Status::Retry, epoch, "the snapshot trimmer's queue is full");
    }
    answered(op, OpReply { status: Status::Ok, map_epoch: epoch, data: Bytes::new() })
}

/// `op` answered now with `reply`.
fn answered(op: &ClientOp, reply: OpReply) -> Outcome {
    Outcome::Reply { token: op.token, slot: op.slot, reply, arrived: op.arrived, kind: op.request.kind }
}

/// A replicated write's end at its primary, once every replica answered
/// (or the wait timed out): its PG's backend settles it and returns the
/// client's reply (which an `answered` write's client had already).
pub fn finish_write(shared: &Shared, end: &WriteEnd) -> OpReply {
    let backend = backend::for_replicated(shared.config.write_path);
    backend.finish_write(shared, end)
}

/// Replica side: one replicated entry, taken by its PG's backend. `Err`:
/// the payload is not an entry this OSD could ever apply, and the
/// connection that sent it is dropped.
pub fn replica_op(shared: &Shared, histograms: &Histograms, payload: &Bytes, to: ReplyTo) -> Result<Outcome, String> {
    duplex_oplog::entry::peek_pg(payload).ok_or("replication payload is not a valid log entry")?;
    let backend = backend::for_replicated(shared.config.write_path);
    backend.replica_op(shared, histograms, payload, to)
}

/// Whether peering has moved `pg` past the interval a write was sent in
/// (`map_epoch`): its members were fenced, so they will not all
/// acknowledge it any more. Its primary fails it at once (the client
/// resends, under the same request id) instead of holding it, and every
/// resend of it, until the replication timeout.
pub fn write_outlived(shared: &Shared, pg: u32, map_epoch: u64) -> bool {
    shared.pgs.get(pg).is_some_and(|pg| pg.lock().expect("PG lock").asked_interval > map_epoch)
}
