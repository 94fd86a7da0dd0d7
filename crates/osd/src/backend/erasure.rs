//! The erasure-coded backend (Ceph's ECBackend): each member of a PG holds
//! one shard of every object, by its position in the acting set: data
//! shards `0..k`, then coding shards `k..k+m` (`duplex_ec` says which
//! bytes are where).
//!
//! **A mutation is one transaction over every shard.** At the primary it
//! takes its object ([`crate::pg::object_queue`]: one mutation of an
//! object at a time), reads what its parity needs from the shards that
//! hold it (`ShardRead`; nothing for whole stripes), and then logs one
//! entry on every shard at one seq: new data, new parity, or a write of
//! no bytes for a shard it leaves alone, so every shard's log holds every
//! seq. The client hears back once every shard logged its
//! entry; until then, reads of the object wait (`Retry`), as a replicated
//! write's do. The entries are ordinary log entries of the shard objects:
//! replicas take, flush and replay them as any other.
//!
//! **Reads** take the object as mutations do (so a read never meets half
//! of a write), then gather the data shards' bytes of the range from the
//! members that hold them and put them in object order.
//!
//! **Degraded** (a shard's OSD down, its position a hole, the PG above
//! its min_size): a read that needs the missing data shard reads its
//! stripes from `k` present shards and decodes them; a write whose
//! read-modify-write would read it rewrites its stripes whole, decoded
//! the same way (`duplex_ec::degraded`). The missing shard's entries are
//! dropped; recovery rebuilds its objects when it returns
//! (`crate::peering::machine::erasure`).
//!
//! Not yet (issue 26): snapshots and attributes on erasure-coded objects,
//! shards moved to new OSDs in the background. An object's size is its
//! shards' rounded up to whole stripes.

use std::sync::MutexGuard;

use bytes::Bytes;
use duplex_ec::{Codec, Layout, Profile, ReadPlan, ShardRange, WritePlan};
use duplex_map::{ErasureCode, OsdId, Pool, NO_OSD};
use duplex_oplog::{EntryRef, LogError, OpKind as LogOp, RequestId};
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};

use crate::backend::common::{lock_served, ok_reply, peering_reply, reply, uncommitted_reply};
use crate::backend::{PgBackend, Primary, WriteEnd, REPLICATED_OPLOG};
use crate::messages::{ClientOp, EcChange, EcPiece, EcTask, EcThen, EcWrite, Outcome};
use crate::metrics::Histograms;
use crate::peering::schedule::{PeeringBackend, Wanted};
use crate::peering::{Action, Peering};
use crate::pg::object_queue::{Access, Entered};
use crate::pg::requests::RequestState;
use crate::pg::{Pg, ReplyTo};
use crate::shared::Shared;

/// The erasure-coded backend (always over the operation log: the
/// write-path ablation is the replicated backend's).
pub struct Erasure;

/// The codec profile of an erasure-coded pool (the map validated it).
pub fn profile_of(code: &ErasureCode) -> Option<Profile> {
    Profile::new(u32::from(code.k), u32::from(code.m), u64::from(code.stripe_unit)).ok()
}

impl PgBackend for Erasure {
    fn read(&self, at: &Primary<'_>, op: ClientOp) -> Outcome {
        match op.request.kind {
            OpKind::ShardRead => shard_read(at, op),
            OpKind::Read => client_read(at, op),
            // Every shard holds every object's name: the primary's list them all.
            OpKind::List => REPLICATED_OPLOG.read(at, op),
            kind => unsupported(&op, kind, at.epoch),
        }
    }

    fn mutate(&self, at: &Primary<'_>, op: ClientOp) -> Outcome {
        mutate(at, op)
    }

    fn finish_write(&self, _shared: &Shared, end: &WriteEnd) -> OpReply {
        // Erasure-coded writes end in `finish`, never in the replicated table.
        debug_assert!(false, "an erasure-coded write reached the replicated write's end");
        OpReply::error(Status::Retry, end.map_epoch, "an erasure-coded write ended in the wrong table")
    }

    fn replica_op(
        &self,
        shared: &Shared,
        histograms: &Histograms,
        payload: &Bytes,
        to: ReplyTo,
    ) -> Result<Outcome, String> {
        // A shard's entry is a log entry of its shard object like any other.
        REPLICATED_OPLOG.replica_op(shared, histograms, payload, to)
    }
}

impl PeeringBackend for Erasure {
    fn start_peering(&self, key: u32, interval: u64, want: Wanted, scrub: Option<bool>) -> (Peering, Vec<Action>) {
        let Some(profile) = want.erasure.as_ref().and_then(profile_of) else {
            return Peering::refused(key, interval, want.acting, format!("PG {key:#x}: no erasure code in the map"));
        };
        // Served with shards missing (degraded) down to min_size, never
        // below k (min_size is at least k in a valid map).
        let present = want.acting.iter().filter(|osd| **osd != NO_OSD).count();
        let needed = want.min_size.max(profile.k());
        if present < needed {
            // The machine's members start with its primary.
            let up: Vec<OsdId> = want.acting.iter().copied().filter(|osd| *osd != NO_OSD).collect();
            return Peering::refused(
                key,
                interval,
                up,
                format!(
                    "PG {key:#x} is erasure-coded ({profile}) and {present} of its {} shards are up, below its pool's min_size {needed}: it waits for its OSDs",
                    profile.shards()
                ),
            );
        }
        Peering::start_erasure(key, interval, want.acting, want.active_set, profile, scrub)
    }
}

fn unsupported(op: &ClientOp, kind: OpKind, epoch: u64) -> Outcome {
    reply(op, Status::Invalid, epoch, format!("{kind:?} is not supported on an erasure-coded pool (yet)"))
}

/// The pool's code, and the PG's members by shard position.
fn code_of(at: &Primary<'_>) -> Option<Profile> {
    let pool: &Pool = at.interval.view.pool(crate::pg::pool_of(at.key))?;
    profile_of(pool.erasure.as_ref()?)
}

/// Member side: this OSD's shard bytes, as a read of the shard object
/// (from the log, or the store), in the order the connection brought it.
/// A damaged block is answered `Io` (the primary decodes around it).
fn shard_read(at: &Primary<'_>, op: ClientOp) -> Outcome {
    REPLICATED_OPLOG.read(at, op)
}

/// Primary: a client read, as shard reads of the data shards it covers.
fn client_read(at: &Primary<'_>, op: ClientOp) -> Outcome {
    let Some(profile) = code_of(at) else { return unsupported(&op, op.request.kind, at.epoch) };
    if op.request.snap != 0 {
        return unsupported(&op, OpKind::Read, at.epoch);
    }
    if let Err(why) = check_decodable(&profile, at.interval.acting) {
        return reply(&op, Status::Retry, at.epoch, why);
    }
    if let Err(why) = check_range(op.request.offset, u64::from(op.request.length)) {
        return reply(&op, Status::Invalid, at.epoch, why);
    }
    {
        let Some(pg) = lock_served(at.pg, &at.interval) else { return peering_reply(at.shared, &op, at.epoch) };
        if pg.uncommitted.touches(&op.request.object, 0, u64::MAX) {
            return uncommitted_reply(at.shared, &op, at.epoch);
        }
    }
    // A read takes its object too: a write admitted after it could
    // otherwise reach one shard before the read does and another after,
    // and the read would return half of a write that may yet be rolled
    // back. One operation of an object at a time closes that.
    let op = if at.resumed {
        op
    } else {
        let object = op.request.object.clone();
        match at.shared.ec_objects.lock().expect("object queue lock").enter(at.key, &object, op, Access::Shared) {
            Entered::Run(op) => op,
            Entered::Queued => return Outcome::Queued,
            Entered::Full(op) => {
                return reply(&op, Status::Retry, at.epoch, "too many operations wait for this object; resend later")
            }
        }
    };
    let (offset, len) = (op.request.offset, u64::from(op.request.length));
    let pieces = Layout::new(&profile).pieces(offset, len);
    if pieces.iter().any(|piece| at.interval.acting[piece.shard] == NO_OSD) {
        return degraded_read(at, op, profile);
    }
    // One shard read per data shard: its pieces are contiguous in it.
    let mut ranges: Vec<Option<(u64, u64)>> = vec![None; profile.k()];
    for piece in &pieces {
        let range = &mut ranges[piece.shard];
        let end = piece.shard_offset + piece.len;
        *range =
            Some(range.map_or((piece.shard_offset, end), |(from, to)| (from.min(piece.shard_offset), to.max(end))));
    }
    let mut reads = Vec::new();
    let mut read_of = vec![usize::MAX; profile.k()];
    for (shard, range) in ranges.iter().enumerate() {
        if let Some((from, to)) = range {
            read_of[shard] = reads.len();
            reads.push((at.interval.acting[shard], shard_read_request(&op.request, at.epoch, *from, to - from)));
        }
    }
    let ec_pieces = pieces
        .iter()
        .map(|piece| {
            let (from, _) = ranges[piece.shard].expect("a piece's shard is read");
            EcPiece { read: read_of[piece.shard], at: (piece.shard_offset - from) as usize, len: piece.len as usize }
        })
        .collect();
    at.shared.metrics.reads.add(1);
    Outcome::Erasure(Box::new(EcTask {
        id: at.shared.txid(),
        op,
        pg: at.key,
        map_epoch: at.epoch,
        seq: 0,
        reads,
        then: EcThen::Read { pieces: ec_pieces },
        profile,
        shards: at.interval.acting.to_vec(),
    }))
}

/// A PG serves only while `k` of its shards are there (peering checks
/// min_size, which is at least `k`; this guards the decoding).
fn check_decodable(profile: &Profile, acting: &[OsdId]) -> Result<(), String> {
    let present = acting.iter().filter(|osd| **osd != NO_OSD).count();
    if acting.len() != profile.shards() || present < profile.k() {
        return Err(format!(
            "{present} of the PG's {} shards are up; {} are needed; resend later",
            profile.shards(),
            profile.k()
        ));
    }
    Ok(())
}

/// Object bytes `[offset, offset + len)` lie within the largest object
/// (the stripe arithmetic rounds past the end of the range).
fn check_range(offset: u64, len: u64) -> Result<(), String> {
    match offset.checked_add(len) {
        Some(end) if end <= duplex_store::MAX_OBJECT_SIZE => Ok(()),
        _ => Err(format!("bytes {offset}+{len} reach past the largest object")),
    }
}

/// Which shard positions have an OSD in `acting` (a down one leaves a hole).
fn present_shards(acting: &[OsdId]) -> Vec<bool> {
    acting.iter().map(|osd| *osd != NO_OSD).collect()
}

/// A client read that needs a missing data shard: the stripes under it
/// from `k` present shards, decoded (`duplex_ec::degraded`).
fn degraded_read(at: &Primary<'_>, op: ClientOp, profile: Profile) -> Outcome {
    let (offset, len) = (op.request.offset, u64::from(op.request.length));
    // (A PG with fewer than k shards is not served: `check_decodable`.)
    let plan =
        ReadPlan::new(profile, offset, len, &present_shards(at.interval.acting)).expect("a served PG has k shards");
    let reads = shard_reads(at.interval.acting, &op.request, at.epoch, &plan.reads);
    at.shared.metrics.reads.add(1);
    at.shared.metrics.degraded_reads.add(1);
    Outcome::Erasure(Box::new(EcTask {
        id: at.shared.txid(),
        op,
        pg: at.key,
        map_epoch: at.epoch,
        seq: 0,
        reads,
        then: EcThen::DegradedRead { plan, offset, len },
        profile,
        shards: at.interval.acting.to_vec(),
    }))
}

/// Which shard reads' answers name a damaged shard: `Io` (a block failed
/// its checksum), or the object absent where another of its shards holds
/// it. An object exists on all its shards or on none, so that absence is a
/// lost shard object, and reading it as zeros would return wrong bytes (a
/// read) or compute parity from them (a write).
pub fn damaged_answers(answers: &[OpReply]) -> Vec<bool> {
    let held_somewhere = answers.iter().any(|a| a.status == Status::Ok);
    answers.iter().map(|a| a.status == Status::Io || (held_somewhere && a.status == Status::NotFound)).collect()
}

/// A degraded read's reply from its shard reads' answers.
pub fn assemble_degraded(plan: &ReadPlan, offset: u64, len: u64, answers: &[OpReply], epoch: u64) -> OpReply {
    if !answers.is_empty() && answers.iter().all(|a| a.status == Status::NotFound) {
        return OpReply::error(Status::NotFound, epoch, "no such object");
    }
    let read: Vec<Vec<u8>> =
        answers.iter().map(|a| if a.status == Status::Ok { a.data.to_vec() } else { Vec::new() }).collect();
    match plan.range(&mut Codec::new(*plan.profile()), &read, offset, len) {
        Ok(data) => OpReply { status: Status::Ok, map_epoch: epoch, data: Bytes::from(data) },
        Err(err) => OpReply::error(Status::Io, epoch, format!("decoding a degraded read failed: {err}")),
    }
}

/// A client read some of whose shard reads found damaged blocks (`Io`
/// from the members in `damaged`): the same read, decoded from the other
/// shards (it keeps its object). `Err`: fewer than `k` shards are left.
pub fn decode_around(shared: &Shared, mut task: Box<EcTask>, damaged: &[OsdId]) -> Result<Box<EcTask>, Box<EcTask>> {
    let (offset, len) = (task.op.request.offset, u64::from(task.op.request.length));
    let present: Vec<bool> = task.shards.iter().map(|osd| *osd != NO_OSD && !damaged.contains(osd)).collect();
    let Ok(plan) = ReadPlan::new(task.profile, offset, len, &present) else { return Err(task) };
    task.reads = shard_reads(&task.shards, &task.op.request, task.map_epoch, &plan.reads);
    task.then = EcThen::DegradedRead { plan, offset, len };
    // New shard reads: answers to the old ones must not count.
    task.id = shared.txid();
    shared.metrics.degraded_reads.add(1);
    Ok(task)
}

/// A `ShardRead` of each range, to the member at its shard's position.
fn shard_reads(shards: &[OsdId], request: &OpRequest, epoch: u64, ranges: &[ShardRange]) -> Vec<(OsdId, OpRequest)> {
    ranges
        .iter()
        .map(|range| {
            debug_assert_ne!(shards[range.shard], NO_OSD, "a shard read planned from a missing shard");
            (shards[range.shard], shard_read_request(request, epoch, range.offset, range.len))
        })
        .collect()
}

fn shard_read_request(request: &OpRequest, epoch: u64, offset: u64, len: u64) -> OpRequest {
    debug_assert!(len <= u64::from(u32::MAX));
    OpRequest {
        kind: OpKind::ShardRead,
        pool: request.pool,
        pg: request.pg,
        map_epoch: epoch,
        object: request.object.clone(),
        offset,
        length: len as u32,
        data: Bytes::new(),
        client: 0,
        snap: 0,
    }
}

/// A client read's reply from its shard reads' answers.
pub fn assemble(pieces: &[EcPiece], answers: &[OpReply], epoch: u64) -> OpReply {
    if !answers.is_empty() && answers.iter().all(|a| a.status == Status::NotFound) {
        return OpReply::error(Status::NotFound, epoch, "no such object");
    }
    let len = pieces.iter().map(|p| p.len).sum();
    let mut data = Vec::with_capacity(len);
    for piece in pieces {
        let answer = &answers[piece.read];
        // Past a shard's end (or an absent shard object): zeros.
        let have = if answer.status == Status::Ok { &answer.data[..] } else { &[][..] };
        let from = piece.at.min(have.len());
        let to = (piece.at + piece.len).min(have.len());
        data.extend_from_slice(&have[from..to]);
        data.resize(data.len() + piece.len - (to - from), 0);
    }
    debug_assert_eq!(data.len(), len);
    OpReply { status: Status::Ok, map_epoch: epoch, data: Bytes::from(data) }
}

/// What each shard logs for `request`, or why it cannot be done here.
fn change_of(profile: &Profile, request: &OpRequest, present: &[bool]) -> Result<EcChange, String> {
    let layout = Layout::new(profile);
    let width = profile.stripe_width();
    let unit = u64::from(profile.stripe_unit());
    Ok(match request.kind {
        OpKind::Write => {
            check_range(request.offset, request.data.len() as u64)?;
            EcChange::Data {
                plan: WritePlan::degraded(*profile, request.offset, request.data.len() as u64, present)
                    .map_err(|e| e.to_string())?,
                offset: request.offset,
                data: request.data.clone(),
            }
        }
        OpKind::Zero => {
            let len = duplex_oplog::zero_length(&request.data).ok_or("a zero carries its length in 8 bytes")?;
            check_range(request.offset, len)?;
            if request.offset.is_multiple_of(width) && len.is_multiple_of(width) {
                // Whole stripes: zeros code to zeros, so every shard zeroes
                // the same shard range (holes stay holes).
                let shard_len = len / width * unit;
                EcChange::Same {
                    op: LogOp::Zero,
                    offset: request.offset / width * unit,
                    data: shard_len.to_le_bytes().to_vec(),
                }
            } else {
                if len > duplex_store::MAX_OBJECT_SIZE {
                    return Err(format!("a zero of {len} bytes reaches past any object"));
                }
                EcChange::Data {
                    plan: WritePlan::degraded(*profile, request.offset, len, present).map_err(|e| e.to_string())?,
                    offset: request.offset,
                    data: Bytes::from(vec![0; len as usize]),
                }
            }
        }
        OpKind::Delete => EcChange::Same { op: LogOp::Delete, offset: 0, data: Vec::new() },
        OpKind::Truncate if request.offset.is_multiple_of(width) => {
            EcChange::Same { op: LogOp::Truncate, offset: layout.shard_size(request.offset), data: Vec::new() }
        }
        OpKind::Truncate => {
            return Err(format!(
                "an erasure-coded object is truncated at whole stripes ({width} bytes) only, not at {}",
                request.offset
            ))
        }
        OpKind::CreatePreallocated => EcChange::Same {
            op: LogOp::CreatePreallocated,
            offset: layout.shard_size(request.offset),
            data: Vec::new(),
        },
        kind => return Err(format!("{kind:?} is not supported on an erasure-coded pool (yet)")),
    })
}

/// Primary: a mutation. It takes its object (or waits for it), and reads
/// what its parity needs.
fn mutate(at: &Primary<'_>, op: ClientOp) -> Outcome {
    let Primary { shared, pg, ref interval, key, epoch, .. } = *at;
    let Some(profile) = code_of(at) else { return unsupported(&op, op.request.kind, epoch) };
    if op.request.snap != 0 {
        return unsupported(&op, op.request.kind, epoch);
    }
    if let Err(why) = check_decodable(&profile, interval.acting) {
        return reply(&op, Status::Retry, epoch, why);
    }
    let present = present_shards(interval.acting);
    let change = match change_of(&profile, &op.request, &present) {
        Ok(change) => change,
        Err(why) => return reply(&op, Status::Invalid, epoch, why),
    };
    let request = RequestId { client: op.request.client, tid: op.txid };
    {
        let Some(guard) = lock_served(pg, interval) else { return peering_reply(shared, &op, epoch) };
        match guard.requests.get(request) {
            Some(RequestState::Committed) => {
                drop(guard);
                shared.metrics.duplicate_requests.add(1);
                // (A resumed one hands its object on in `crate::io::ops::resume`.)
                return ok_reply(&op, epoch);
            }
            Some(RequestState::InFlight) => {
                drop(guard);
                shared.metrics.duplicate_requests.add(1);
                return reply(&op, Status::Retry, epoch, "this request is already in progress");
            }
            Some(RequestState::Failed) | None => {}
        }
    }
    let object = op.request.object.clone();
    let op = if at.resumed {
        op
    } else {
        let entered = shared.ec_objects.lock().expect("object queue lock").enter(key, &object, op, Access::Exclusive);
        match entered {
            Entered::Run(op) => op,
            Entered::Queued => return Outcome::Queued,
            Entered::Full(op) => {
                return reply(&op, Status::Retry, epoch, "too many writes wait for this object; resend later")
            }
        }
    };
    let shards = interval.acting.to_vec();
    debug_assert_eq!(shards.len(), profile.shards(), "a served erasure-coded PG's set is positional");
    if matches!(&change, EcChange::Data { plan, .. } if plan.is_degraded()) {
        shared.metrics.degraded_writes.add(1);
    }
    let reads = match &change {
        EcChange::Data { plan, .. } => shard_reads(&shards, &op.request, epoch, &plan.reads),
        EcChange::Same { .. } => Vec::new(),
    };
    Outcome::Erasure(Box::new(EcTask {
        id: shared.txid(),
        op,
        pg: key,
        map_epoch: epoch,
        seq: 0,
        reads,
        then: EcThen::Write(Box::new(EcWrite { request, change })),
        profile,
        shards,
    }))
}

/// The entries of a mutation whose reads are in: this OSD's shard's is
/// logged here; the others' are returned, encoded, for their OSDs. `Err`:
/// the mutation ends with this answer (nothing was logged).
pub fn commit(
    shared: &Shared,
    task: &mut EcTask,
    answers: &[OpReply],
) -> Result<Vec<(OsdId, Bytes)>, (Status, String)> {
    let EcThen::Write(write) = &task.then else { unreachable!("only mutations are committed") };
    let retry = |why: &str| Err((Status::Retry, why.to_string()));
    if answers.iter().any(|a| a.status == Status::Io) {
        // (Its event loop asks for the PG's repair.)
        return retry("a shard's old bytes are damaged; the PG is being repaired; resend");
    }
    if answers.iter().any(|a| !matches!(a.status, Status::Ok | Status::NotFound)) {
        return retry("a shard could not be read");
    }
    let object = &task.op.request.object;
    // Each shard's entry: the op, its offset and its data. A shard the
    // write leaves alone logs a write of no bytes: every shard's log holds
    // every seq, and every shard holds the object once it exists (an
    // absent object is absent on all of them).
    let mut per_shard: Vec<(LogOp, u64, Vec<u8>)> = vec![(LogOp::Write, 0, Vec::new()); task.profile.shards()];
    match &write.change {
        EcChange::Data { plan, data, .. } => {
            let read: Vec<Vec<u8>> =
                answers.iter().map(|a| if a.status == Status::Ok { a.data.to_vec() } else { Vec::new() }).collect();
            let mut codec = Codec::new(task.profile);
            let writes = plan.shard_writes(&mut codec, data, &read).map_err(|e| (Status::Io, e.to_string()))?;
            for shard_write in writes {
                per_shard[shard_write.shard] = (LogOp::Write, shard_write.offset, shard_write.data);
            }
        }
        EcChange::Same { op, offset, data } => {
            for entry in per_shard.iter_mut() {
                *entry = (*op, *offset, data.clone());
            }
        }
    }
    let me = shared.config.id;
    let Some(own) = task.shards.iter().position(|osd| *osd == me) else {
        return retry("this OSD is no longer a member of the PG");
    };
    let Some(pg) = shared.pgs.get(task.pg) else { return retry("the PG is gone") };
    let mut guard = pg.lock().expect("PG lock");
    // Still the interval it was admitted in (a fence since would refuse
    // its entries at the members anyway).
    if guard.active.as_ref().is_none_or(|a| a.members != task.shards) || guard.asked_interval > task.map_epoch {
        return retry("the PG is peering (its members are being brought up to date)");
    }
    let seq = guard.log.next_seq();
    // Every shard has logged every entry through here: what each member
    // may apply (an entry's version, see `Pg::apply_limit`).
    let watermark = guard.ec_watermark();
    debug_assert!(watermark < seq, "the watermark passes an entry not yet logged");
    let entry_of = |shard: usize| {
        let (op, offset, data) = &per_shard[shard];
        EntryRef {
            pg: task.pg,
            epoch: task.map_epoch as u32,
            version: watermark,
            seq,
            op: *op,
            object,
            offset: *offset,
            data,
            request: write.request,
            snap: 0,
        }
    };
    for (shard, (op, offset, data)) in per_shard.iter().enumerate() {
        if let Err(why) = crate::backend::common::check_limits(*op, *offset, data) {
            tracing::error!(pg = task.pg, shard, %why, "an erasure-coded entry past the store's limits");
            return Err((Status::Invalid, why));
        }
    }
    let own_entry = entry_of(own);
    let encoded = own_entry.encode();
    match guard.append_encoded(&own_entry, &encoded, RequestState::InFlight) {
        Ok(()) => {}
        Err(LogError::Full) => {
            guard.waiters = true;
            drop(guard);
            shared.metrics.backpressure_waits.add(1);
            shared.send_job(task.pg, crate::messages::Job::Flush(task.pg));
            return retry("this OSD's log for the PG is full; resend");
        }
        Err(LogError::TooLarge(len)) => {
            return Err((
                Status::Invalid,
                format!("a {len}-byte entry does not fit this OSD's PG log; split the write"),
            ))
        }
        Err(err) => return Err((Status::Io, err.to_string())),
    }
    guard.uncommitted.begin(task.id, object.clone(), 0, u64::MAX);
    guard.ec_pending.insert(seq);
    let sends: Vec<(OsdId, Bytes)> = task
        .shards
        .iter()
        .enumerate()
        // A missing shard's entry is dropped: it is rebuilt when it returns.
        .filter(|(shard, osd)| *shard != own && **osd != NO_OSD)
        .map(|(shard, osd)| (*osd, Bytes::from(entry_of(shard).encode())))
        .collect();
    let depth = guard.log.len();
    let was_dirty = std::mem::replace(&mut guard.dirty, true);
    drop(guard);
    task.seq = seq;
    crate::backend::common::notify_flusher(shared, task.pg, depth, was_dirty);
    let metrics = &shared.metrics;
    match task.op.request.kind {
        OpKind::Write => {
            metrics.writes.add(1);
            metrics.write_bytes.add(task.op.request.data.len() as u64);
        }
        OpKind::Zero => metrics.zeroes.add(1),
        OpKind::Delete => metrics.deletes.add(1),
        OpKind::Truncate => metrics.truncates.add(1),
        _ => metrics.metadata_ops.add(1),
    }
    Ok(sends)
}

/// A mutation's end: every shard answered (`failed`: one refused, was lost
/// or timed out; `logged`: its entries went out). Settles it in its PG and
/// returns the client's reply, and the next operation waiting for its
/// object (which now holds it).
pub fn finish(shared: &Shared, task: &EcTask, logged: bool, failed: bool) -> (OpReply, Vec<ClientOp>) {
    let EcThen::Write(write) = &task.then else { unreachable!("only mutations finish here") };
    if logged {
        if let Some(pg) = shared.pgs.get(task.pg) {
            let mut guard: MutexGuard<'_, Pg> = pg.lock().expect("PG lock");
            guard.uncommitted.end(task.id);
            guard.requests.finish(write.request, !failed);
            let current = guard.active.as_ref().is_some_and(|a| task.map_epoch >= a.interval);
            if !failed && current {
                // On every shard now: the primary may apply it, and what
                // precedes it (a failed one holds the watermark back until
                // peering settles it). Not once a fence cleared the pending
                // set: the watermark would read as the log's end, and the
                // limit let through entries peering may still roll back.
                guard.ec_pending.remove(&task.seq);
                let watermark = guard.ec_watermark();
                guard.apply_limit = guard.apply_limit.max(watermark);
            }
            if failed && current && guard.active.take().is_some() {
                tracing::warn!(pg = task.pg, "an erasure-coded write failed on a shard; the PG peers again");
            }
        }
    }
    let next = release(shared, task.pg, &task.op.request.object);
    let reply = if failed || !logged {
        OpReply::error(Status::Retry, task.map_epoch, "a shard did not log the write; resend")
    } else {
        OpReply { status: Status::Ok, map_epoch: task.map_epoch, data: Bytes::new() }
    };
    (reply, next)
}

/// An operation holding `object` ended: those waiting that hold it now.
pub fn release(shared: &Shared, pg: u32, object: &Bytes) -> Vec<ClientOp> {
    shared.ec_objects.lock().expect("object queue lock").leave(pg, object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        Profile::new(2, 1, 4096).unwrap()
    }

    fn request(kind: OpKind, offset: u64, data: Vec<u8>) -> OpRequest {
        OpRequest {
            kind,
            pool: 1,
            pg: 0,
            map_epoch: 1,
            object: Bytes::from_static(b"o"),
            offset,
            length: data.len() as u32,
            data: Bytes::from(data),
            client: 1,
            snap: 0,
        }
    }

    #[test]
    fn whole_stripes_are_the_same_op_on_every_shard_and_the_rest_a_read_modify_write() {
        let zero = |offset: u64, len: u64| {
            change_of(&profile(), &request(OpKind::Zero, offset, len.to_le_bytes().to_vec()), &[true; 3])
        };
        match zero(8192, 16384).unwrap() {
            EcChange::Same { op: LogOp::Zero, offset, data } => {
                assert_eq!((offset, duplex_oplog::zero_length(&data)), (4096, Some(8192)));
            }
            _ => panic!("a whole-stripe zero is the same zero on every shard"),
        }
        match zero(4096, 4096).unwrap() {
            EcChange::Data { plan, data, .. } => {
                assert!(!plan.whole_stripes());
                assert_eq!(data.len(), 4096);
                assert!(data.iter().all(|b| *b == 0));
            }
            _ => panic!("a part of a stripe is written with zeros"),
        }
        assert!(matches!(
            change_of(&profile(), &request(OpKind::Truncate, 8192 * 3, vec![]), &[true; 3]).unwrap(),
            EcChange::Same { op: LogOp::Truncate, offset: 12288, .. }
        ));
        let torn = change_of(&profile(), &request(OpKind::Truncate, 4096, vec![]), &[true; 3]).err().unwrap();
        assert!(torn.contains("whole stripes"), "{torn}");
        assert!(change_of(&profile(), &request(OpKind::SetAttr, 1, vec![1, 2]), &[true; 3]).is_err());
    }

    #[test]
    fn a_read_is_put_together_in_object_order_with_zeros_past_a_shards_end() {
        let pieces = [EcPiece { read: 1, at: 0, len: 3 }, EcPiece { read: 0, at: 2, len: 4 }];
        let answers = [
            OpReply { status: Status::Ok, map_epoch: 1, data: Bytes::from_static(b"abcd") },
            OpReply { status: Status::Ok, map_epoch: 1, data: Bytes::from_static(b"xyz") },
        ];
        let reply = assemble(&pieces, &answers, 1);
        assert_eq!(&reply.data[..], b"xyzcd\0\0");
        let absent = [OpReply::error(Status::NotFound, 1, "no"), OpReply::error(Status::NotFound, 1, "no")];
        assert_eq!(assemble(&pieces, &absent, 1).status, Status::NotFound);
        let one_absent = [answers[0].clone(), OpReply::error(Status::NotFound, 1, "no")];
        assert_eq!(&assemble(&pieces, &one_absent, 1).data[..], b"\0\0\0cd\0\0");
        // Which the settle never assembles: that absence is a damaged shard.
        assert_eq!(damaged_answers(&one_absent), [false, true]);
        assert_eq!(damaged_answers(&absent), [false, false], "absent everywhere: no such object");
        assert_eq!(damaged_answers(&answers), [false, false]);
        let io = [answers[0].clone(), OpReply::error(Status::Io, 1, "checksum")];
        assert_eq!(damaged_answers(&io), [false, true]);
    }
}
